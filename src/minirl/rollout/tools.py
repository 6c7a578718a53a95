"""Tool calls inside a response (``task.tools``): TRL's ``GRPOTrainer(tools=[...])``, verl's multi-turn tool agent.

The model sees the tools' schemas in its prompt: the chat template writes them (``apply_chat_template(tools=...)``),
each schema read from the function's signature and Google-style docstring by transformers' ``get_json_schema``, as
TRL reads them. A response is then sampled in turns (``ToolCalling``, a wrapper of any rollout engine):

1. The engine samples the model's turn, to its end-of-turn token or the response's budget.
2. The turn's calls are read (``task.tool_parser``: ``hermes``, ``<tool_call>{"name": ..., "arguments": {...}}
   </tool_call>`` blocks, verl's default format and Qwen's; ``tokenizer``, the tokenizer's own ``parse_response``,
   TRL's way). A turn that ended at a stop token and holds calls has them run in order (``async def`` tools
   concurrently), each result as TRL writes it: ``str(fn(**arguments))``, or ``{'error': ...}`` when the tool is
   unknown or raises (verl's tools: verl's texts, ``minirl.rollout.verl_tools``). A malformed call (not JSON, no
   name) is not run and counts as a failed call.
3. The results are appended as the template renders ``tool`` messages after that turn, up to the next assistant
   header (TRL's ``_get_tool_suffix_ids``: token ids concatenated, the conversation never tokenised again, so every
   sampled token stays as sampled), and the engine continues the response from there (``Prompt.response_prefix``).

This repeats until a turn makes no call, ``task.max_tool_iterations`` rounds have run, or ``rollout.max_new_tokens``
is spent (a row whose ``agent_name`` column is verl's ``single_turn_agent`` is offered no tools and sampled as one
turn; verl runs calls under its ``tool_agent`` only): it counts the results' tokens too (TRL's
``max_completion_length``). Results that would leave no room for
one more sampled token are not appended, and the response ends there unfinished (finish ``length``).
``task.tool_result_max_chars`` cuts a long result as verl does (``cut_result``); ``task.tool_timeout_s`` bounds each
call, one that runs longer getting ``{'error': 'Tool X timed out after N s.'}`` (a sync tool's thread is left
behind: Python cannot stop it). ``task.environment`` gives each rollout its own instance whose methods are tools
(``minirl.rollout.environments``); ``task.tool_config`` runs verl's tool classes (``minirl.rollout.verl_tools``).

What the trainer sees: the response's tokens, results included, with ``Completion.sampled_mask`` False on the results,
so they train nothing (TRL's ``tool_mask``, verl's ``response_mask``); their ``logp_rollout`` is 0. Each sampled token
keeps the log-prob of the law it was drawn from. With minirl's engine each continuation feeds only the results (and
the token before them) on the kept KV cache of the response so far (``NativeEngine.keeping_prefixes``), so every
position's route is the one recorded when the engine first fed it, and R3 replays the routes behind every turn's
log-probs; an engine that cannot keep its caches prefills the whole conversation again, and R3 then replays the routes
of its last call (its prefill of the earlier turns, at the same weights), as partial rollouts do. Reward
functions get the response as chat messages (``Completion.messages``: assistant turns with their ``tool_calls``, then
``tool`` results), TRL's ``completions``; built-in verifiers and verl's ``solution_str`` read its whole text.

Each continuation call draws from a stream of its own: seed ``sampling.seed + k * TURN_SEED_STRIDE`` for round k.
Metrics (``tools/*``, TRL's names): ``call_frequency``, calls per response; ``failure_frequency``, failed calls per
call.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from minirl.config import ConfigError
from minirl.rollout.base import DecodeControl
from minirl.tasks.chat import KWARGS_ATTRIBUTE, encode_text, render_chat, row_template_args
from minirl.types import Completion, Prompt, SamplingParams

TURN_SEED_STRIDE = 1_000_033
HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: a tool's name and the keyword arguments to call it with."""

    name: str
    arguments: dict[str, Any]

    def message(self) -> dict[str, Any]:
        """As an assistant message's ``tool_calls`` entry (the OpenAI / transformers shape)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedTurn:
    """One model turn: its text without the calls, the calls, and how many calls could not be read."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    malformed: int = 0


def parse_hermes(text: str) -> ParsedTurn:
    """The Hermes tool-call format: each ``<tool_call>...</tool_call>`` block a JSON object with a string ``name`` and
    an object ``arguments`` (or a JSON string of one); a block that is not, or an opened block never closed, is
    malformed, and stays in the turn's text (as TRL keeps a turn it cannot parse)."""
    calls, malformed, blocks = [], 0, 0

    def taken(match: re.Match[str]) -> str:  # a call read: out of the text; a malformed block: kept as written
        nonlocal malformed, blocks
        blocks += 1
        call = _tool_call(_json(match.group(1)))
        if call is None:
            malformed += 1
            return match.group(0)
        calls.append(call)
        return ""

    content = HERMES_CALL.sub(taken, text)
    malformed += max(text.count("<tool_call>") - blocks, 0)
    return ParsedTurn(content.strip(), calls, malformed)


def parse_with_tokenizer(tokenizer: Any, ids: Sequence[int], prefix: Sequence[int]) -> ParsedTurn:
    """A turn read by the tokenizer's ``parse_response`` (its ``response_template``: transformers' response parsing, as
    TRL reads calls), ``prefix`` the ids before the turn (a template may open the turn in the prompt, e.g. with
    ``<think>``); a turn it cannot parse is plain text (TRL's fallback)."""
    try:
        try:
            parsed = tokenizer.parse_response(list(ids), prefix=list(prefix))
        except TypeError:  # transformers before 5.13: the legacy response_schema, no prefix
            parsed = tokenizer.parse_response(list(ids))
    except Exception:
        parsed = None
    if not isinstance(parsed, dict):
        return ParsedTurn(tokenizer.decode(list(ids), skip_special_tokens=True).strip())
    calls, malformed = [], 0
    for entry in parsed.get("tool_calls") or []:
        function = entry.get("function", entry) if isinstance(entry, dict) else None
        call = _tool_call(function)
        if call is None:
            malformed += 1
        else:
            calls.append(call)
    return ParsedTurn(str(parsed.get("content") or "").strip(), calls, malformed)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _tool_call(call: Any) -> ToolCall | None:
    """``{"name": str, "arguments": {...} or a JSON string of one}`` as a ``ToolCall``, else None."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        arguments = _json(arguments) if arguments.strip() else {}
    return ToolCall(call["name"], arguments) if isinstance(arguments, dict) else None


class Toolbox:
    """The functions of ``task.tools`` by name, their schemas, and running calls of them; ``timeout_s``: how long a
    call may run (``task.tool_timeout_s``; None: as long as it takes, as in TRL)."""

    def __init__(self, functions: Sequence[Callable[..., Any]], timeout_s: float | None = None) -> None:
        # a limit past what a thread wait takes (inf) is none
        self.timeout_s = None if timeout_s is None or timeout_s >= threading.TIMEOUT_MAX else timeout_s
        from minirl.rollout.verl_tools import FunctionTool, verl_function_tool

        self.functions: dict[str, Callable[..., Any]] = {}
        self.verl_functions: dict[str, FunctionTool] = {}  # verl's @function_tool functions, run as verl runs them
        for fn in functions:
            entry = verl_function_tool(fn)
            name = getattr(fn, "__name__", type(fn).__name__) if entry is None else entry.name
            if name in self.functions or name in self.verl_functions:
                raise ConfigError(f"task.tools: two tools are named {name!r}; the model calls a tool by its name")
            if entry is None:
                self.functions[name] = fn
            else:
                self.verl_functions[name] = FunctionTool(entry)

    @classmethod
    def load(cls, specs: Sequence[str], timeout_s: float | None = None) -> Toolbox:
        """The functions ``specs`` name (``package.module:function`` or ``path/file.py:function``)."""
        from minirl.tasks.rewards import RewardSpecError, load_reward_function

        functions = []
        for spec in specs:
            try:
                functions.append(load_reward_function(spec))
            except RewardSpecError as error:
                raise ConfigError("task.tools: " + str(error).replace("reward function ", "tool ", 1)) from None
        return cls(functions, timeout_s)

    def schemas(self) -> list[dict[str, Any]]:
        """Each tool's JSON schema, as ``apply_chat_template(tools=[fn])`` reads it (``get_json_schema``)."""
        from transformers.utils import get_json_schema

        out = []
        for name, fn in self.functions.items():
            try:
                out.append(get_json_schema(fn))
            except Exception as error:  # transformers' DocstringParsingException / TypeHintParsingException
                key, what = "task.tools", f"tool {name!r}"
                if inspect.ismethod(fn):  # an environment's method (task.environment)
                    key, what = "task.environment", f"method {type(fn.__self__).__name__}.{name}"
                raise ConfigError(f"{key}: no schema for {what}: {' '.join(str(error).split())} (give it type hints "
                                  "and a Google-style docstring with an Args section)") from None
        return out

    def run(self, calls: Sequence[ToolCall]) -> list[tuple[str, str, bool]]:
        """(name, result, failed) of each call, in order: sync tools one after another, ``async def`` ones together."""
        return run_calls([(self, call) for call in calls])

    def joined(self, functions: Sequence[Callable[..., Any]]) -> Toolbox:
        """These tools and ``functions`` (an environment's bound methods)."""
        return Toolbox([*self.functions.values(), *functions], self.timeout_s)


def run_calls(calls: Sequence[tuple[Toolbox, ToolCall]]) -> list[tuple[str, str, bool]]:
    """(name, result, failed) of each call in its toolbox, in order: sync tools one after another, ``async def`` ones
    together; a result as TRL writes it (``str(value)``, ``{'error': ...}`` for an unknown tool or an exception)."""
    results: list[Any] = [None] * len(calls)
    failed = [False] * len(calls)
    waiting: list[tuple[int, Any]] = []
    for index, (box, call) in enumerate(calls):
        fn = box.functions.get(call.name)
        try:
            if fn is None:
                raise ValueError(f"Tool {call.name} not found.")  # TRL's words
            value = _call(fn, call, box.timeout_s)
            if inspect.isawaitable(value):
                waiting.append((index, _awaited(value, call, box.timeout_s)))
            else:
                results[index] = value
        except SystemExit as error:  # e.g. a code tool running the model's exit(): the call's error, not the run's end
            results[index], failed[index] = {"error": _exited(call, error)}, True
        except Exception as error:
            results[index], failed[index] = _error_result(error), True
    if waiting:
        for (index, _), value in zip(waiting, _gather([value for _, value in waiting])):
            if isinstance(value, BaseException):
                results[index], failed[index] = _error_result(value), True
            else:
                results[index] = value
    return [(call.name, value if isinstance(value, str) else str(value), bad)
            for (_, call), value, bad in zip(calls, results, failed)]


class FailedCall(Exception):
    """A call that failed, with the result its framework writes for it (verl's ``Error executing tool ...``)."""

    def __init__(self, result: str) -> None:
        super().__init__(result)
        self.result = result


def _error_result(error: BaseException) -> Any:
    """The result of a call that raised ``error``: TRL's ``{'error': ...}``, or a ``FailedCall``'s own text."""
    return error.result if isinstance(error, FailedCall) else {"error": str(error)}


def _call(fn: Callable[..., Any], call: ToolCall, timeout_s: float | None) -> Any:
    """``fn(**call.arguments)``; with a timeout, in a thread of its own that is left behind (a Python thread cannot be
    stopped) when it runs past it: ``TimeoutError``."""
    if timeout_s is None:
        return fn(**call.arguments)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn(**call.arguments)
        except BaseException as error:  # re-raised in the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name=f"tool {call.name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"Tool {call.name} timed out after {timeout_s:g} s.")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _exited(call: ToolCall, error: SystemExit) -> str:
    return f"Tool {call.name} exited (SystemExit: {error.code})."


async def _awaited(value: Any, call: ToolCall, timeout_s: float | None) -> Any:
    """An ``async def`` tool's result, within the timeout (its ``SystemExit`` an error: on the event loop it would stop
    the loop)."""
    async def guarded() -> Any:  # awaited in this task's frame, so that no task of the loop sees the SystemExit
        try:
            return await value
        except SystemExit as error:
            raise RuntimeError(_exited(call, error)) from None

    if timeout_s is None:
        return await guarded()
    try:
        return await asyncio.wait_for(guarded(), timeout_s)
    except TimeoutError:  # asyncio's, since Python 3.11 the builtin
        raise TimeoutError(f"Tool {call.name} timed out after {timeout_s:g} s.") from None


def _gather(awaitables: list[Any]) -> list[Any]:
    """The awaitables' results (an exception as its value), run together on the process's event loop (``resolve``: the
    same loop every round, so what a tool binds to it, a semaphore or a client session, stays usable)."""
    from minirl.tasks.reward_functions import resolve

    async def together() -> list[Any]:
        return list(await asyncio.gather(*awaitables, return_exceptions=True))

    return resolve(together())


def standalone_schemas(task: Any) -> list[dict[str, Any]]:
    """The schemas of the tools every rollout has: ``task.tools``' functions, then verl's tools (``task.tool_config``'s
    classes, then ``task.tools``' ``@function_tool`` functions)."""
    toolbox = Toolbox.load(task.tools)
    verl = verl_tools_of(task, toolbox)
    return toolbox.schemas() + (verl.schemas() if verl is not None else [])


def verl_tools_of(task: Any, toolbox: Toolbox) -> Any:
    """The run's verl tools (``VerlTools``): ``task.tool_config``'s classes and ``toolbox``'s ``@function_tool``
    functions (both in verl's ``tools``: a row's ``tool_selection`` picks among all of them), or None without any."""
    from minirl.rollout.verl_tools import VerlTools, load_verl_tools

    verl = load_verl_tools(task.tool_config) if task.tool_config else None
    if not toolbox.verl_functions:
        return verl
    tools = dict(verl.tools) if verl is not None else {}
    for name, tool in toolbox.verl_functions.items():
        if name in tools:
            raise ConfigError(f"task.tool_config and task.tools both have a tool named {name!r}; the model calls a "
                              "tool by its name")  # as _distinct_tool_names says it (merged here, so said here)
        tools[name] = tool
    return VerlTools(tools)


def offered_schemas(tokenizer: Any, task: Any) -> None:
    """``task.tools``' and ``task.tool_config``'s schemas (and a single ``task.environment``'s methods) in every prompt
    ``tokenizer`` renders; with named environments each row's prompt shows its own environment's (``tool_calling``)."""
    from minirl.rollout.environments import load_environments

    schemas = standalone_schemas(task)
    if task.environment:
        environments = load_environments(task.environment)
        if not environments.named:
            schemas += environments.schemas(None)
    apply_tool_schemas(tokenizer, schemas)


def apply_tool_schemas(tokenizer: Any, schemas: list[dict[str, Any]]) -> None:
    """Every later rendering with ``tokenizer`` writes ``schemas`` into the prompt (as ``task.chat_template_kwargs``
    ride on it, ``minirl.tasks.chat.apply_chat_setting``); a data row's own ``tools`` column still wins."""
    kwargs = dict(getattr(tokenizer, KWARGS_ATTRIBUTE, None) or {})
    kwargs.setdefault("tools", schemas)
    setattr(tokenizer, KWARGS_ATTRIBUTE, kwargs)


def tool_suffix_ids(tokenizer: Any, tool_messages: list[dict[str, Any]], stop_ids: Sequence[int],
                    extra: dict[str, Any] | None = None) -> list[int]:
    """The token ids the chat template writes after a model's turn that called tools: its ``tool_messages`` and the
    next assistant header (TRL's ``_get_tool_suffix_ids``: a dummy conversation rendered without and with them, cut
    after the turn's end token, one of ``stop_ids``). ``ValueError`` when the template does not render the first as a
    prefix of the second."""
    calls = [ToolCall(tool_messages[0]["name"], {}).message()]  # the real name: some templates read it
    head: list[dict[str, Any]] = [{"role": "user", "content": "dummy"},
                                  {"role": "assistant", "content": "", "tool_calls": calls}]
    prefix = encode_text(tokenizer, render_chat(tokenizer, head, add_generation_prompt=False, extra=extra),
                         add_special_tokens=False)
    full = encode_text(tokenizer, render_chat(tokenizer, head + tool_messages, add_generation_prompt=True, extra=extra),
                       add_special_tokens=False)
    ends = [index for index, token in enumerate(prefix) if token in stop_ids]
    if ends:
        prefix = prefix[: ends[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template renders a turn with tool calls differently once tool results follow it")
    return full[len(prefix):]


def check_tool_template(tokenizer: Any, stop_ids: Sequence[int]) -> None:
    """``ConfigError`` (one line) unless the chat template writes a tool call's name and arguments and a tool's result
    (TRL's ``supports_tool_calling``) and renders results after a turn as a suffix of it (``tool_suffix_ids``)."""
    name, key, value, result = "tool_name_a8f3", "arg_key_b9d4", "arg_value_d6e7", "tool_result_c4f9"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [ToolCall(name, {key: value}).message()]},
        {"role": "tool", "name": name, "content": result}]
    try:
        text = render_chat(tokenizer, messages, add_generation_prompt=False)
        missing = [part for part in (name, key, value, result) if part not in text]
        tool_suffix_ids(tokenizer, messages[2:], stop_ids)
    except Exception as error:
        raise ConfigError(f"task.tools: the chat template cannot render tool calls: {' '.join(str(error).split())} "
                          "(give task.chat_template a template that writes tool_calls and tool messages)") from None
    if missing:
        raise ConfigError("task.tools: the chat template drops a tool call's " + ("name or arguments" if result not in
                          missing else "result") + " (give task.chat_template a template that writes tool_calls and "
                          "tool messages, as Qwen's does)")


def tool_calling(cfg: Any, engine: Any, tokenizer: Any, model: Any, prompts: Sequence[Prompt],
                 eval_prompts: Sequence[Prompt] = ()) -> ToolCalling:
    """``task.tools``' (and ``task.environment``'s, ``task.tool_config``'s) wrapper of the run's ``engine`` (the
    tools' schemas already on ``tokenizer``: ``offered_schemas``; a row's own set here, as its ``tools`` column, when
    named environments or verl's ``tool_selection`` make them differ by row); ``ConfigError`` (one line) when a
    training prompt is not a chat or the template cannot write calls and results."""
    from minirl.rollout.environments import load_environments
    from minirl.tasks.chat import stop_token_ids

    task = cfg.task
    environments = load_environments(task.environment) if task.environment else None
    toolbox = Toolbox.load(task.tools, task.tool_timeout_s)
    verl = verl_tools_of(task, toolbox)
    rows = [*prompts, *eval_prompts]
    named = environments is not None and environments.named
    single = [single_turn(prompt) for prompt in rows]
    if named or any(single) or (verl is not None and any(verl.selection(prompt) is not None for prompt in rows)):
        functions = toolbox.schemas()
        for prompt, alone in zip(rows, single, strict=True):
            own = functions + (verl.schemas(verl.selection(prompt)) if verl is not None else [])
            own += environments.schemas(environments.name_of(prompt)) if environments is not None else []
            prompt.meta = {**prompt.meta, "tools": [] if alone else own}
    _distinct_tool_names(task, toolbox, verl, environments)
    plain = sum(prompt.messages is None for prompt in prompts)
    if plain:
        raise ConfigError(f"{task.tools_key}: {plain} of {len(prompts)} training prompts are plain text; tools are offered "
                          "in a chat (a prompt column of messages, or task.chat_prompts: true)")
    stops = stop_token_ids(tokenizer, model)
    check_tool_template(tokenizer, stops)
    parses = any(getattr(tokenizer, name, None) is not None for name in ("response_template", "response_schema"))
    if task.tool_parser == "tokenizer" and not (parses and callable(getattr(tokenizer, "parse_response", None))):
        raise ConfigError("task.tool_parser=tokenizer: the tokenizer has no response_template for parse_response "
                          "(transformers' response parsing; TRL's add_response_schema sets one for known templates); "
                          "use task.tool_parser=hermes")
    return ToolCalling(engine, tokenizer, toolbox, stop_ids=stops,
                       parser=task.tool_parser, max_iterations=task.max_tool_iterations, environments=environments,
                       result_max_chars=task.tool_result_max_chars, result_keep=task.tool_result_keep,
                       max_calls_per_turn=task.max_tool_calls_per_turn, verl_tools=verl)


AGENT_LOOPS = ("tool_agent", "single_turn_agent")
"""verl's agent loops a row may name in its ``agent_name`` column: its tool agent, or one plain turn without tools."""


def single_turn(prompt: Prompt) -> bool:
    """Whether the row is sampled as one turn without tools: its ``agent_name`` is verl's ``single_turn_agent`` (verl
    runs a row's calls only under its ``tool_agent``); ``ConfigError`` for an agent loop minirl does not have."""
    name = (prompt.meta or {}).get("agent_name")
    if name is not None and name not in AGENT_LOOPS:
        raise ConfigError(f"a row's agent_name {name!r}: minirl runs verl's {' and '.join(AGENT_LOOPS)} "
                          "(task.tool_config); another agent loop is not translated")
    return name == "single_turn_agent"


def _distinct_tool_names(task: Any, toolbox: Toolbox, verl: Any, environments: Any) -> None:
    """``ConfigError`` (one line naming both keys) when two tools of one rollout share a name: ``task.tools``'
    functions, verl's tools (``task.tool_config``) and the rollout's environment's methods meet in one toolbox, and the
    model calls a tool by its name (verl refuses the same at load)."""
    owners: dict[str, str] = {}
    configured = [name for name in (verl.tools if verl is not None else {}) if name not in toolbox.verl_functions]
    sources = [("task.tools", [*toolbox.functions, *toolbox.verl_functions]), ("task.tool_config", configured)]
    for key, listed in sources:
        for name in listed:
            if owners.setdefault(name, key) != key:
                raise ConfigError(f"{owners[name]} and {key} both have a tool named {name!r}; the model calls a tool by "
                                  "its name")
    for environment, methods in (environments.methods.items() if environments is not None else ()):
        for name in methods:
            if name in owners:
                key = f"task.environment {environment}" if environment else "task.environment"
                raise ConfigError(f"{owners[name]} and {key} both have a tool named {name!r}; the model calls a tool "
                                  "by its name")


@dataclass
class _Response:
    """One response being sampled in turns (with ``task.environment``, in its own instance of its environment)."""

    prompt: Prompt
    completion: Completion
    toolbox: Toolbox
    turn_start: int = 0  # where the newest model turn begins in ``completion.completion_ids``
    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    failures: int = 0
    environment: Any = None
    environment_name: str | None = None
    agent: Any = None  # ``task.tool_config``: verl's ``AgentData`` of this rollout (``minirl.rollout.verl_tools``)
    single_turn: bool = False  # the row's agent_name is verl's single_turn_agent: one turn, its calls not run


class ToolCalling:
    """A rollout engine whose responses call ``toolbox``'s tools (module docstring). Everything else is the engine's:
    ``load_weights``, its RNG state, closing."""

    continues_in_call = False  # a response is sampled whole, turn by turn (no partial rollouts)

    def __init__(self, engine: Any, tokenizer: Any, toolbox: Toolbox, *, stop_ids: Sequence[int],
                 parser: str = "hermes", max_iterations: int | None = None, environments: Any = None,
                 result_max_chars: int | None = None, result_keep: str = "middle",
                 max_calls_per_turn: int | None = None, verl_tools: Any = None) -> None:
        self.engine, self.tokenizer, self.toolbox = engine, tokenizer, toolbox
        self.stop_ids, self.parser, self.max_iterations = set(stop_ids), parser, max_iterations
        self.result_max_chars, self.result_keep = result_max_chars, result_keep
        self.max_calls_per_turn = max_calls_per_turn  # verl's max_parallel_calls: the first ones run, the rest not
        self.environments = environments  # minirl.rollout.environments.Environments, or None
        self.verl_tools = verl_tools  # minirl.rollout.verl_tools.VerlTools, or None

    def __getattr__(self, name: str) -> Any:
        if name == "engine":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.engine, name)

    def generate(self, prompts: list[Prompt], samples_per_prompt: int, sampling: SamplingParams,
                 record_routes: bool = False) -> list[Completion]:
        """``RolloutEngine.generate``, each response continued after the results of the calls it makes; a round's
        calls, of every response, run together (``Toolbox.run``: async tools concurrently, as verl's agent loop). An
        engine that can keep its rows' KV caches (``NativeEngine.keeping_prefixes``) feeds each continuation only the
        results, not the conversation again."""
        keeping = getattr(self.engine, "keeping_prefixes", None)
        with keeping() if callable(keeping) else contextlib.nullcontext():
            return self._generate(prompts, samples_per_prompt, sampling, record_routes)

    def _generate(self, prompts: list[Prompt], samples_per_prompt: int, sampling: SamplingParams,
                  record_routes: bool) -> list[Completion]:
        responses = self._first_turns(prompts, samples_per_prompt, sampling, record_routes)
        running, rounds = list(responses), 0
        while running:
            calling = [(response, calls) for response in running if (calls := self._read_turn(response, rounds))]
            results = run_calls([(response.toolbox, call) for response, calls in calling for call in calls])
            ready, at = [], 0
            for response, calls in calling:
                suffix = self._results(response, results[at: at + len(calls)], sampling.max_new_tokens)
                at += len(calls)
                if suffix is not None:
                    ready.append((response, suffix))
            running = [response for response, _ in ready]
            if ready:
                rounds += 1
                self._continue(ready, sampling, rounds, record_routes)
        return [self._finished(response) for response in responses]

    def _first_turns(self, prompts: list[Prompt], n: int, sampling: SamplingParams, record_routes: bool) -> list[_Response]:
        """Each response's first turn; with environments, each rollout's instance reset with its row first, and the
        engine given one prompt per rollout (a reset may add to it), numbered back into groups of ``n``; with verl's
        tools, each rollout's own ``AgentData`` behind its calls."""
        envs = self.environments
        if envs is None:
            first = self.engine.generate(prompts, n, sampling, record_routes=record_routes)
            responses = [_Response(prompts[c.prompt_index], c, self.toolbox) for c in first]
        else:
            names = [envs.name_of(prompt) for prompt in prompts for _ in range(n)]
            instances = envs.take(names)
            rows = [envs.reset(instance, prompt) for instance, prompt in zip(instances, [p for p in prompts for _ in range(n)])]
            first = self.engine.generate(rows, 1, sampling, record_routes=record_routes)
            responses = [_Response(rows[index], replace(c, prompt_index=index // n, sample_index=index % n),
                                   self.toolbox.joined(envs.tools(instance, name)), environment=instance,
                                   environment_name=name)
                         for index, (c, instance, name) in enumerate(zip(first, instances, names, strict=True))]
        for response in responses:
            response.single_turn = single_turn(response.prompt)
        if self.verl_tools is not None:
            for response in responses:
                response.agent = self.verl_tools.agent_data(response.prompt, response.messages)
                chosen = self.verl_tools.selection(response.prompt)
                response.toolbox = response.toolbox.joined(self.verl_tools.functions(response.agent, chosen))
        return responses

    def _read_turn(self, response: _Response, rounds: int) -> list[ToolCall]:
        """Read the newest turn into ``response.messages``; the calls to run (a turn that ended at a stop token, with
        rounds left; its malformed calls counted as failed), or none when the response ends with this turn."""
        c = response.completion
        ids = list(c.completion_ids[response.turn_start:])
        ended = c.finish_reason == "eos" and bool(ids) and ids[-1] in self.stop_ids
        if self.parser == "tokenizer":
            turn = parse_with_tokenizer(self.tokenizer, ids, list(c.prompt_ids) + list(c.completion_ids[:response.turn_start]))
        else:
            turn = parse_hermes(self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False))
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            message["tool_calls"] = [call.message() for call in turn.calls]
        response.messages.append(message)
        if not ended or response.single_turn or (self.max_iterations is not None and rounds >= self.max_iterations):
            return []
        calls = turn.calls[: self.max_calls_per_turn] if self.max_calls_per_turn is not None else turn.calls
        response.calls += len(calls) + turn.malformed
        response.failures += turn.malformed
        return calls  # only malformed ones: nothing to run, the response ends

    def _results(self, response: _Response, results: list[tuple[str, str, bool]], max_new_tokens: int) -> list[int] | None:
        """The results' token ids to append to ``response`` (their messages added), or None when they leave no room
        for one more sampled token: the response then ends unfinished (finish ``length``; TRL rolls them back)."""
        response.failures += sum(failed for _, _, failed in results)
        tool_messages = [{"role": "tool", "name": name, "content": cut_result(content, self.result_max_chars,
                                                                                self.result_keep)}
                         for name, content, _ in results]
        extra = row_template_args(response.prompt.meta, "prompt") if response.prompt.meta else None
        suffix = tool_suffix_ids(self.tokenizer, tool_messages, sorted(self.stop_ids), extra)
        if len(response.completion.completion_ids) + len(suffix) >= max_new_tokens:
            response.completion.finish_reason = "length"
            return None
        response.messages += tool_messages
        return suffix

    def _continue(self, ready: list[tuple[_Response, list[int]]], sampling: SamplingParams, round_index: int,
                  record_routes: bool) -> None:
        """One engine call continuing each ready response after its results, within the response's budget."""
        rooms = [sampling.max_new_tokens - len(r.completion.completion_ids) - len(suffix) for r, suffix in ready]
        prompts = [replace(r.prompt, response_prefix=list(r.completion.completion_ids) + suffix) for r, suffix in ready]
        turn = replace(sampling, max_new_tokens=max(rooms), seed=sampling.seed + round_index * TURN_SEED_STRIDE)
        control = {"control": DecodeControl(rooms)} if getattr(self.engine, "continues_in_call", False) else {}
        news = self.engine.generate(prompts, 1, turn, record_routes=record_routes, **control)
        for (response, suffix), new, room in zip(ready, news, rooms, strict=True):
            before = response.completion
            response.turn_start = len(before.completion_ids) + len(suffix)
            response.completion = joined(before, suffix, cut_to(new, room))

    def _finished(self, response: _Response) -> Completion:
        c = response.completion
        text = self.tokenizer.decode(c.completion_ids, skip_special_tokens=True)
        score = None if self.environments is None else self.environments.reward(response.environment,
                                                                                 response.environment_name)
        return replace(c, text=text, messages=response.messages, tool_calls=response.calls,
                       tool_failures=response.failures, environment_reward=score, environment=response.environment,
                       environment_prompt=None if self.environments is None else response.prompt,
                       tool_extra_fields=None if response.agent is None else response.agent.tool_extra_fields())


def cut_result(text: str, max_chars: int | None, keep: str) -> str:
    """A tool's result cut to ``max_chars`` characters as verl cuts it (``task.tool_result_keep``: ``head`` keeps the
    first and marks ``...(truncated)``, ``tail`` the last after ``(truncated)...``, ``middle`` half of each around
    ``...(truncated)...``); whole when it fits or there is no limit."""
    if max_chars is None or len(text) <= max_chars:
        return text
    if keep == "head":
        return text[:max_chars] + "...(truncated)"
    if keep == "tail":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half:]


def cut_to(new: Completion, room: int) -> Completion:
    """``new`` with at most ``room`` completion tokens (an engine without per-row budgets samples to the call's
    longest one); a cut one ends unfinished (finish ``length``)."""
    if len(new.completion_ids) <= room:
        return new
    routes = None
    if new.routes is not None:
        routes = new.routes[: len(new.prompt_ids) + room].clone()
        routes[-1] = -1  # the last kept token is never fed while sampling (types.Completion)
    return replace(new, completion_ids=list(new.completion_ids[:room]), logp_rollout=new.logp_rollout[:room],
                   finish_reason="length", routes=routes)


def joined(before: Completion, suffix: list[int], new: Completion) -> Completion:
    """A response so far, the tool results appended to it (``suffix``, not sampled: ``sampled_mask`` False,
    ``logp_rollout`` 0) and the engine's continuation ``new`` (whose prompt is the original prompt, the response so
    far and the results), as one completion of the original prompt; its routes are the continuation call's."""
    so_far = list(before.completion_ids) + suffix
    if list(new.prompt_ids[len(new.prompt_ids) - len(so_far):]) != so_far:
        raise ValueError("the engine's continuation does not start with the response so far")
    sampled = before.sampled_mask if before.sampled_mask is not None else torch.ones(len(before.completion_ids), dtype=torch.bool)
    return replace(
        before,
        completion_ids=so_far + list(new.completion_ids),
        logp_rollout=torch.cat([before.logp_rollout.float(), torch.zeros(len(suffix)), new.logp_rollout.float()]),
        sampled_mask=torch.cat([sampled, torch.zeros(len(suffix), dtype=torch.bool),
                                torch.ones(len(new.completion_ids), dtype=torch.bool)]),
        finish_reason=new.finish_reason,
        routes=new.routes,
    )
