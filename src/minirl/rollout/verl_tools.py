"""verl's tools (``task.tool_config``): the ``BaseTool`` classes of verl's ``multi_turn.tool_config_path``, run here.

A verl user's tool config works unchanged::

    tools:
      - class_name: my_tools.Gsm8kTool           # module.Class (or path/file.py:Class)
        config: {type: native}                   # passed to the class as ``config``
        tool_schema:                              # OpenAI function schema; omitted: the class's get_openai_tool_schema()
          type: function
          function: {name: calc_gsm8k_reward, description: ..., parameters: {type: object, properties: ..., required: [...]}}

Each class is made once, ``cls(config=..., tool_schema=...)``, as verl's ``initialize_tools_from_config`` makes it,
its schema offered in every prompt (``model_dump(exclude_unset=True, exclude_none=True)``, what verl offers). A call
the model writes then runs as verl 0.9's tool agent runs it (``ToolAgentLoop._call_tool``)::

    instance_id, _ = await tool.create(create_kwargs=row.extra_info.tools_kwargs[name].create_kwargs)
    response, reward, metrics = await tool.execute(instance_id, arguments, agent_data=agent_data)
    await tool.release(instance_id)

and its ``response.text`` (a plain string from an older tool is taken as it is) is the result the model reads,
cut as ``task.tool_result_max_chars`` says. ``arguments`` is the call's parsed dict (verl 0.9's; a tool written for
verl's older JSON-string parameters needs updating); an older ``create`` returning the id alone, or plain (not
``async``) methods (run in a thread, within ``task.tool_timeout_s``), work too; ``calc_reward`` is not called
(neither does verl 0.9's agent loop). Each step ``reward``
joins the rollout's ``tool_rewards``; a call that raises adds 0.0, as in verl, and is a failed call
(``tools/failure_frequency``) whose result is verl's ``Error executing tool '<name>': <error>``.
Once the response ends, verl's
``tool_extra_fields`` (``agent_data.extra_fields``, ``turn_scores`` and ``tool_rewards``) reach reward functions as
verl's reward managers pass them: merged into a verl ``compute_score``'s ``extra_info``; other reward functions get
them as the ``tool_extra_fields`` column.

A row whose ``extra_info.tool_selection`` names some of the tools is offered and runs those only (verl 0.9's per-row
selection). ``agent_data`` (``AgentData``) carries what a tool may read of verl's: the conversation so far (``messages``), the
row's ``tools_kwargs``, a ``request_id``, ``extra_fields`` to keep session data in, ``metrics``, ``tool_rewards``.

verl 0.9's ``@function_tool`` functions (``multi_turn.function_tool_path``), listed in ``task.tools``, run the same way
(``FunctionTool``: the name and schema the decorator gave them, their return value read by verl's
``normalize_function_tool_return``), beside the config's classes; a row's ``tool_selection`` picks among both.

Tools subclassing verl's ``BaseTool`` need verl importable; any class with the same methods runs without it. When
verl's ``OpenAIFunctionToolSchema`` is importable (a tool imported verl), the class gets it; otherwise a pydantic model
of the same fields. Images or videos in a result are refused (text models only).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import os
import re
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from minirl.config import ConfigError
from minirl.rollout.tools import FailedCall

KEY = "task.tool_config"


class _Property(BaseModel):  # verl.tools.schemas.OpenAIFunctionPropertySchema's fields
    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None


class _Parameters(BaseModel):
    type: str
    properties: dict[str, _Property]
    required: list[str] = Field(default_factory=list)


class _Function(BaseModel):
    name: str
    description: str
    parameters: _Parameters = Field(default_factory=lambda: _Parameters(type="object", properties={}, required=[]))
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """verl's ``OpenAIFunctionToolSchema``, field for field, for tools that run without verl installed."""

    type: str
    function: _Function


@dataclass
class AgentData:
    """What verl hands ``execute`` as ``agent_data``, of one rollout (verl's ``AgentData``, its text fields)."""

    prompt_messages: list[dict[str, Any]]
    response_messages: list[dict[str, Any]]  # the response's turns and results so far (``_Response.messages``)
    tools_kwargs: dict[str, Any]
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    metrics: dict[str, Any] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)
    tool_rewards: list[float | None] = field(default_factory=list)  # None: a call whose reward was None (not kept)
    turn_scores: list[float] = field(default_factory=list)

    image_data: list[Any] = field(default_factory=list)  # verl's multimodal inputs: none here (text models)
    video_data: list[Any] = field(default_factory=list)
    audio_data: list[Any] | None = None
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far: the prompt's messages, then the response's."""
        return [*self.prompt_messages, *self.response_messages]

    @property
    def assistant_turns(self) -> int:
        """The model's turns so far (verl's counter)."""
        return sum(message.get("role") == "assistant" for message in self.response_messages)

    @property
    def user_turns(self) -> int:
        """The rounds of tool results so far (verl counts each round as one user turn)."""
        from minirl.tasks.reward_functions import verl_num_turns

        return verl_num_turns(self.response_messages) - 1 - self.assistant_turns if self.response_messages else 0

    def tool_extra_fields(self) -> dict[str, Any]:
        """What verl's reward managers merge into ``extra_info`` (``tool_extra_fields``), as plain JSON values (numpy
        and torch values as numbers and lists, anything else as its text): they are kept in rollout dumps and
        checkpoints, which load only plain values."""
        fields = {**self.extra_fields, "turn_scores": list(self.turn_scores),
                  "tool_rewards": [reward for reward in self.tool_rewards if reward is not None]}
        return json.loads(json.dumps(fields, default=_plain))


def _plain(value: Any) -> Any:
    """A JSON value for what ``json`` cannot write: an array's or tensor's list, a scalar's number, else its text."""
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


class VerlTools:
    """The tools of one verl tool config by name, their schemas, and per-rollout callables running them."""

    def __init__(self, tools: dict[str, Any]) -> None:
        self.tools = tools

    def schemas(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """Each tool's schema (of ``names``; None: all) as verl offers it (``model_dump(exclude_unset=True,
        exclude_none=True)``)."""
        return [self.tools[name].tool_schema.model_dump(exclude_unset=True, exclude_none=True)
                for name in (names if names is not None else self.tools)]

    def selection(self, prompt: Any) -> list[str] | None:
        """The tools of this row only, by name (verl 0.9's ``extra_info.tool_selection``; names of no tool dropped, as
        verl drops them), or None: all of them."""
        extra_info = (prompt.meta or {}).get("extra_info")
        chosen = extra_info.get("tool_selection") if isinstance(extra_info, dict) else None
        return [name for name in chosen if name in self.tools] if chosen else None

    def agent_data(self, prompt: Any, response_messages: list[dict[str, Any]]) -> AgentData:
        """A rollout's ``AgentData``: the row's ``extra_info.tools_kwargs`` (verl's dataset reads them there)."""
        extra_info = (prompt.meta or {}).get("extra_info")
        tools_kwargs = extra_info.get("tools_kwargs") if isinstance(extra_info, dict) else None
        return AgentData(list(prompt.messages or []), response_messages, copy.deepcopy(tools_kwargs or {}))

    def functions(self, agent: AgentData, names: list[str] | None = None) -> list[Callable[..., Any]]:
        """One async callable per tool (of ``names``; None: all), named after it, running its calls in ``agent``'s
        rollout."""
        out = []
        for name in names if names is not None else self.tools:
            call = _lifecycle(self.tools[name], name, agent)
            call.__name__ = call.__qualname__ = name
            out.append(call)
        return out


def missing_tools_kwargs(prompts: list[Any]) -> str | None:
    """One line when rows mark ``extra_info.need_tools_kwargs`` but carry no ``tools_kwargs``: their tools are created
    with empty ``create_kwargs`` (no ground truth; verl logs the same per row)."""
    def lacking(prompt: Any) -> bool:
        extra_info = (prompt.meta or {}).get("extra_info")
        return isinstance(extra_info, dict) and bool(extra_info.get("need_tools_kwargs")) \
            and not extra_info.get("tools_kwargs")

    count = sum(lacking(prompt) for prompt in prompts)
    if not count:
        return None
    return (f"{count} of {len(prompts)} training rows set extra_info.need_tools_kwargs but have no tools_kwargs: their "
            "tools are created with empty create_kwargs")


def verl_function_tool(fn: Any) -> Any:
    """verl's ``FunctionTool`` of ``fn`` when it is an ``@function_tool`` function (its file imported verl's decorator,
    which registers it), else None."""
    registry = getattr(sys.modules.get("verl.tools.function_tool"), "FUNCTION_TOOL_REGISTRY", None) or {}
    return next((entry for entry in registry.values() if getattr(entry, "fn", None) is fn), None)


class FunctionTool:
    """An ``@function_tool`` function (verl 0.9's ``multi_turn.function_tool_path``) run as verl's tool agent runs one:
    named and described as the decorator says (``name=``, ``schema=``), no state (the row's ``tools_kwargs`` are not
    passed, as in verl), its return value read by verl's ``normalize_function_tool_return``: text as it is, a dict as
    JSON, ``(response, reward, metrics)`` with the reward joining ``tool_rewards``."""

    def __init__(self, entry: Any) -> None:
        self.entry, self.name, self.tool_schema = entry, entry.name, entry.tool_schema

    async def create(self, **kwargs: Any) -> tuple[str, None]:
        return uuid.uuid4().hex, None

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
        normalize = sys.modules["verl.tools.function_tool"].normalize_function_tool_return
        return normalize(await self.entry.call(parameters))

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None


def _lifecycle(tool: Any, name: str, agent: AgentData) -> Callable[..., Any]:
    async def call(**arguments: Any) -> str:
        create_kwargs = (agent.tools_kwargs.get(name) or {}).get("create_kwargs", {})
        instance_id = None
        # a round's calls run together; verl appends their rewards in call order, so each call takes its slot first
        slot = len(agent.tool_rewards)
        agent.tool_rewards.append(0.0)  # verl's reward of a call that raises
        try:
            created = await _run(tool.create, create_kwargs=create_kwargs)
            instance_id = created[0] if isinstance(created, tuple) else created  # (id, ToolResponse); older tools: id
            response, reward, _ = await _run(tool.execute, instance_id, arguments, agent_data=agent)
        except Exception as error:  # verl's text for it (ToolAgentLoop._call_tool)
            raise FailedCall(f"Error executing tool '{name}': {error}") from error
        finally:
            if instance_id:
                await _run(tool.release, instance_id)
        agent.tool_rewards[slot] = None if reward is None else float(reward)  # verl keeps no reward of None
        return _text(response, name)

    return call


async def _run(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A tool method's result: verl's ``async def`` ones awaited; a plain one (an older tool's) in a thread, so that it
    neither holds up the round's other calls nor escapes ``task.tool_timeout_s``."""
    if inspect.iscoroutinefunction(method):
        return await method(*args, **kwargs)
    value = await asyncio.to_thread(method, *args, **kwargs)
    return await value if inspect.isawaitable(value) else value


def _text(response: Any, name: str) -> str:
    """The text of a tool's ``ToolResponse`` (or of a plain string, as verl's older tools return); a response with
    images or videos is a failed call (text models only)."""
    if response is None or isinstance(response, str):
        return response or ""
    if not hasattr(response, "text"):  # verl reads .text and stops there
        raise FailedCall(f"Tool {name} returned a {type(response).__name__}; a verl tool returns a ToolResponse or text.")
    if getattr(response, "image", None) or getattr(response, "video", None):
        raise FailedCall(f"Tool {name} returned an image or video; minirl trains text models only.")
    return str(response.text or "")


def _schema_model() -> type[BaseModel]:
    """verl's schema class when a tool imported verl, else ours (the same fields)."""
    verl_schemas = sys.modules.get("verl.tools.schemas")
    return getattr(verl_schemas, "OpenAIFunctionToolSchema", OpenAIFunctionToolSchema)


def _entry(index: int, entry: Any, path: str) -> Any:
    """One ``tools`` entry of the config made into its tool, or one line naming what is wrong."""
    from minirl.tasks.rewards import RewardSpecError, load_reward_function

    where = f"{KEY} ({path}): tools[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise ConfigError(f"{where}: each entry needs a class_name (module.Class)")
    class_name, config = entry["class_name"], entry.get("config") or {}
    kind = config.get("type", "native") if isinstance(config, dict) else None
    if kind != "native":
        raise ConfigError(f"{where}: config.type {kind!r}; minirl runs native tools (verl 0.9's only kind; MCP tools "
                          "are not supported)")
    spec = class_name if ":" in class_name else ":".join(class_name.rsplit(".", 1))
    try:
        cls: Any = load_reward_function(spec)
    except RewardSpecError as error:
        raise ConfigError(f"{where}: " + str(error).replace("reward function ", "tool class ", 1)) from None
    schema = entry.get("tool_schema")
    try:
        schema = None if schema is None else _schema_model().model_validate(schema)
        tool = cls(config=config, tool_schema=schema)
    except ValidationError as error:
        raise ConfigError(f"{where}: tool_schema is not an OpenAI function schema: "
                          f"{' '.join(str(error).split())}") from None
    except Exception as error:
        raise ConfigError(f"{where}: making {class_name} raised {type(error).__name__}: "
                          f"{' '.join(str(error).split())}") from None
    if getattr(tool, "tool_schema", None) is None:
        raise ConfigError(f"{where}: {class_name} has no tool_schema (give one in the config)")
    missing = [m for m in ("create", "execute", "release") if not callable(getattr(tool, m, None))]
    if missing:
        raise ConfigError(f"{where}: {class_name} has no {', '.join(missing)} method (verl's BaseTool methods)")
    return tool


ENV_INTERPOLATION = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")


def _interpolated(data: Any, path: str) -> Any:
    """The config's ``${...}`` interpolations resolved, as verl reads the file (OmegaConf): ``${oc.env:NAME}`` and
    ``${oc.env:NAME,default}`` here; any other through OmegaConf where it is installed, else one line."""
    if "${" not in json.dumps(data, default=str):  # a YAML date or the like: text for this test only
        return data
    try:
        from omegaconf import OmegaConf
    except ImportError:
        OmegaConf = None
    if OmegaConf is not None:
        try:
            return OmegaConf.to_container(OmegaConf.create(data), resolve=True)
        except Exception as error:
            raise ConfigError(f"{path}: an interpolation does not resolve ({' '.join(str(error).split())})") from None

    def resolved(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: resolved(item) for key, item in value.items()}
        if isinstance(value, list):
            return [resolved(item) for item in value]
        if not isinstance(value, str) or "${" not in value:
            return value

        def variable(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name not in os.environ and default is None:
                raise ConfigError(f"{path}: {match.group(0)} names the environment variable {name}, which is not set")
            return os.environ.get(name, default or "")

        out = ENV_INTERPOLATION.sub(variable, value)
        if "${" in out:
            raise ConfigError(f"{path}: {value!r}: only ${{oc.env:NAME}} interpolations resolve without omegaconf "
                              "(pip install omegaconf, which verl reads this file with)")
        return out

    return resolved(data)


@lru_cache(maxsize=8)
def _loaded(path: str, mtime: float) -> VerlTools:
    from minirl.peers.common import read_yaml

    try:
        listed = _interpolated(read_yaml(path), path).get("tools")
    except ConfigError as error:
        raise ConfigError(f"{KEY}: {error}") from None
    if not isinstance(listed, list) or not listed:
        raise ConfigError(f"{KEY} ({path}): no tools list (verl's tool config: tools: [{{class_name, config, "
                          "tool_schema}}, ...])")
    tools: dict[str, Any] = {}
    for index, entry in enumerate(listed):
        tool = _entry(index, entry, path)
        name = tool.tool_schema.function.name
        if name in tools:
            raise ConfigError(f"{KEY} ({path}): two tools are named {name!r}; the model calls a tool by its name")
        tools[name] = tool
    return VerlTools(tools)


def load_verl_tools(path: str) -> VerlTools:
    """The tools of verl's tool config at ``path``, made once per process per version of the file."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{KEY}: no file {path} (verl's multi_turn.tool_config_path YAML)")
    return _loaded(str(file), file.stat().st_mtime)
