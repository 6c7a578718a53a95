"""verl's tools (``task.tool_config``, ``minirl.rollout.verl_tools``): a verl tool config's ``BaseTool`` classes made as
verl makes them, each call run as verl 0.9's tool agent runs it (create with the row's ``tools_kwargs``, execute with
``agent_data``, release), and the step rewards reaching a verl ``compute_score`` in ``extra_info``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from minirl.config import ConfigError, load_config
from minirl.rollout.tools import Toolbox, ToolCalling, offered_schemas
from minirl.rollout.verl_tools import load_verl_tools
from minirl.sources import _completion_state
from minirl.tasks.chat import encode_prompt
from minirl.tasks.reward_functions import sample_of, verl_keywords
from minirl.types import Completion, Prompt, SamplingParams
from tests.unit.test_tool_calling import CHAT, EXAMPLES, TurnEngine, _end, tokenizer  # noqa: F401 (a fixture)

GSM8K_LIKE = textwrap.dedent('''
    import uuid
    from pydantic import BaseModel

    class ToolResponse(BaseModel):  # verl's ToolResponse, its text and images
        text: str | None = None
        image: list | None = None

    LOG = []

    class AnswerTool:
        """verl's Gsm8kTool, in short: the row's ground truth at create, the answer checked at execute."""

        def __init__(self, config, tool_schema):
            self.config, self.tool_schema, self.name = config, tool_schema, tool_schema.function.name
            self.states = {}

        async def create(self, instance_id=None, **kwargs):
            instance_id = instance_id or uuid.uuid4().hex
            self.states[instance_id] = kwargs["create_kwargs"]["ground_truth"]
            LOG.append(("create", instance_id, kwargs))
            return instance_id, ToolResponse()

        async def execute(self, instance_id, parameters, **kwargs):
            agent = kwargs["agent_data"]
            LOG.append(("execute", instance_id, parameters, [m["role"] for m in agent.messages],
                        (agent.assistant_turns, agent.user_turns, agent.image_data)))
            if parameters["answer"] == "boom":
                raise RuntimeError("the checker broke")
            if parameters["answer"] == "picture":
                return ToolResponse(text="see", image=[object()]), 0.5, {}
            if parameters["answer"] == "dict":
                return {"text": "a dict"}, 0.25, {}
            agent.extra_fields["checked"] = agent.extra_fields.get("checked", 0) + 1
            reward = float(parameters["answer"] == self.states[instance_id])
            return ToolResponse(text=f"Current parsed answer={parameters['answer']} reward={reward}"), reward, {}

        async def release(self, instance_id, **kwargs):
            LOG.append(("release", instance_id))
            del self.states[instance_id]

    class NoSandbox(AnswerTool):
        def __init__(self, config, tool_schema):
            raise OSError("no sandbox here")

    class OldStyle(AnswerTool):
        """An older tool: create returns the id alone, and the methods are plain functions."""

        def create(self, instance_id=None, **kwargs):
            self.states["old"] = kwargs["create_kwargs"]["ground_truth"]
            return "old"

        def execute(self, instance_id, parameters, **kwargs):
            return "seen " + parameters["answer"], 0.5, {}

        def release(self, instance_id, **kwargs):
            del self.states[instance_id]

    class Incomplete:
        def __init__(self, config, tool_schema):
            self.tool_schema = tool_schema

        async def create(self, instance_id=None, **kwargs):
            return "x"
''')

SCHEMA = {"type": "function", "function": {"name": "check_answer", "description": "Check an answer.", "parameters": {
    "type": "object", "properties": {"answer": {"type": "string", "description": "The answer."}},
    "required": ["answer"]}}}


def _config(tmp_path: Path, entries: list | None = None) -> Path:
    (tmp_path / "answer_tool.py").write_text(GSM8K_LIKE)
    path = tmp_path / "tool_config.yaml"
    listed = entries if entries is not None else [
        {"class_name": "answer_tool.AnswerTool", "config": {"type": "native"}, "tool_schema": SCHEMA}]
    path.write_text(json.dumps({"tools": listed}))  # JSON is YAML
    return path


def _call(answer: str) -> str:
    return '<tool_call>{"name": "check_answer", "arguments": {"answer": "' + answer + '"}}</tool_call>'


@pytest.fixture()
def tool_module(tmp_path: Path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "answer_tool", raising=False)
    path = _config(tmp_path)
    yield load_verl_tools(str(path)), path
    sys.modules.pop("answer_tool", None)


def test_a_call_runs_create_execute_release_with_the_rows_tools_kwargs(tokenizer, tool_module) -> None:  # noqa: F811
    tools, _ = tool_module
    assert tools.schemas() == [SCHEMA] and list(tools.tools) == ["check_answer"]
    engine = TurnEngine(tokenizer, [_call("42"), "The answer is 42."])
    calling = ToolCalling(engine, tokenizer, Toolbox([]), stop_ids=[_end(tokenizer)], verl_tools=tools)
    extra_info = {"index": 7, "tools_kwargs": {"check_answer": {"create_kwargs": {"ground_truth": "42"}}}}
    prompts = [Prompt("q", "42", meta={"extra_info": extra_info}, messages=CHAT),
               Prompt("r", "5", meta={"extra_info": {"tools_kwargs": {"check_answer": {"create_kwargs":
                                                                                       {"ground_truth": "5"}}}}},
                      messages=CHAT)]
    out = calling.generate(prompts, 2, SamplingParams(max_new_tokens=200))
    log = sys.modules["answer_tool"].LOG
    # per call, as verl's _call_tool: create (the row's create_kwargs), execute (the parsed arguments, agent_data
    # with the conversation so far), release of the same instance; four rollouts, one call each
    creates = [entry for entry in log if entry[0] == "create"]
    assert [entry[2] for entry in creates] == [{"create_kwargs": {"ground_truth": "42"}}] * 2 + [
        {"create_kwargs": {"ground_truth": "5"}}] * 2
    first = [entry for entry in log if entry[1] == creates[0][1]]
    assert [entry[0] for entry in first] == ["create", "execute", "release"]
    assert first[1][2:] == ({"answer": "42"}, ["user", "assistant"], (1, 0, []))  # verl's turn counters too
    assert tools.tools["check_answer"].states == {}  # every instance released
    # the result is the response's text, the step reward the rollout's, the tools' extra_fields beside them
    assert out[0].messages[1] == {"role": "tool", "name": "check_answer", "content": "Current parsed answer=42 reward=1.0"}
    assert [c.tool_extra_fields for c in out] == [{"checked": 1, "turn_scores": [], "tool_rewards": [1.0]}] * 2 + [
        {"checked": 1, "turn_scores": [], "tool_rewards": [0.0]}] * 2
    assert out[0].tool_calls == 1 and out[0].tool_failures == 0
    # a verl compute_score gets them in extra_info, merged into the row's own (verl's reward managers); other reward
    # functions as the tool_extra_fields column; a dump keeps them
    sample = sample_of(prompts[0], out[0].text, out[0].completion_ids, messages=out[0].messages,
                       tool_extra_fields=out[0].tool_extra_fields)
    # and verl's num_turns (its tool agent's: two model turns, one round of results, the prompt) and reward scores
    assert verl_keywords(sample)["extra_info"] == {**extra_info, "checked": 1, "turn_scores": [], "tool_rewards": [1.0],
                                                   "num_turns": 4, "rollout_reward_scores": {}}
    assert verl_keywords(sample_of(prompts[0], "plain"))["extra_info"]["num_turns"] == 2  # verl's single-turn agent
    assert sample.columns["tool_extra_fields"]["tool_rewards"] == [1.0]
    again = Completion(**json.loads(json.dumps(_completion_state(out[0]), default=lambda t: t.tolist())))
    assert again.tool_extra_fields == out[0].tool_extra_fields


def test_a_call_that_raises_is_a_failed_call_with_verls_zero_reward(tokenizer, tool_module) -> None:  # noqa: F811
    tools, _ = tool_module
    engine = TurnEngine(tokenizer, [_call("boom") + _call("picture"), "Sorry."])
    calling = ToolCalling(engine, tokenizer, Toolbox([]), stop_ids=[_end(tokenizer)], verl_tools=tools)
    row = Prompt("q", "1", meta={"extra_info": {"tools_kwargs": {"check_answer": {"create_kwargs": {"ground_truth": "1"}}}}},
                 messages=CHAT)
    c, = calling.generate([row], 1, SamplingParams(max_new_tokens=300))
    assert c.tool_calls == 2 and c.tool_failures == 2
    assert [m["content"] for m in c.messages if m["role"] == "tool"] == [
        "Error executing tool 'check_answer': the checker broke",  # verl's text
        "Tool check_answer returned an image or video; minirl trains text models only."]
    assert c.tool_extra_fields["tool_rewards"] == [0.0, 0.5]  # verl adds 0 for the call that raised
    odd = ToolCalling(TurnEngine(tokenizer, [_call("dict"), "Sorry."]), tokenizer, Toolbox([]),
                      stop_ids=[_end(tokenizer)], verl_tools=tools)
    d, = odd.generate([row], 1, SamplingParams(max_new_tokens=300))  # not a ToolResponse: a failed call, said
    assert d.messages[1]["content"] == "Tool check_answer returned a dict; a verl tool returns a ToolResponse or text."
    assert d.tool_failures == 1
    assert tools.tools["check_answer"].states == {}  # released all the same
    # a row without tools_kwargs: create gets verl's empty create_kwargs (this tool then raises: a failed call)
    c, = calling.generate([Prompt("q", "1", messages=CHAT)], 1, SamplingParams(max_new_tokens=300))
    assert c.tool_failures == 2 and "'ground_truth'" in c.messages[1]["content"]


def test_an_older_tool_with_plain_methods_and_a_bare_id_runs(tokenizer, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "answer_tool", raising=False)
    tools = load_verl_tools(str(_config(tmp_path, [{"class_name": "answer_tool.OldStyle", "tool_schema": SCHEMA}])))
    calling = ToolCalling(TurnEngine(tokenizer, [_call("7"), "7."]), tokenizer, Toolbox([]), stop_ids=[_end(tokenizer)],
                          verl_tools=tools)
    row = Prompt("q", "7", meta={"extra_info": {"tools_kwargs": {"check_answer": {"create_kwargs": {"ground_truth": "7"}}}}},
                 messages=CHAT)
    c, = calling.generate([row], 1, SamplingParams(max_new_tokens=200))
    assert c.messages[1]["content"] == "seen 7" and c.tool_extra_fields["tool_rewards"] == [0.5] and c.tool_failures == 0
    assert tools.tools["check_answer"].states == {}


def test_the_schemas_reach_every_prompt_beside_task_tools(tokenizer, tool_module, tmp_path: Path) -> None:  # noqa: F811
    _, path = tool_module
    import copy

    from minirl.tasks.chat import KWARGS_ATTRIBUTE

    tok = copy.deepcopy(tokenizer)
    setattr(tok, KWARGS_ATTRIBUTE, None)  # the fixture's schemas off: these are offered instead
    cfg = load_config(None, ["task.kind=jsonl", "task.path=x.jsonl", f"task.tool_config={path}",
                             f"task.tools=[{EXAMPLES / 'tool_calling' / 'calculator.py'}:multiply]"])
    offered_schemas(tok, cfg.task)
    text = tok.decode(encode_prompt(tok, Prompt("q", "1", messages=CHAT)))
    assert "Tools: multiply(a, b) check_answer(answer)" in text
    with pytest.raises(ConfigError, match=r"^task.tool_config: tool calls and their results are written by"):
        load_config(None, ["task.kind=jsonl", "task.path=x.jsonl", f"task.tool_config={path}",
                           "task.chat_template=plain"])


BAD = [
    ({"tools": []}, r"no tools list"),
    ({"tools": [{"config": {"type": "native"}}]}, r"tools\[0\]: each entry needs a class_name"),
    ({"tools": [{"class_name": "answer_tool.AnswerTool", "config": {"type": "mcp"}}]},
     r"tools\[0\]: config.type 'mcp'; minirl runs native tools"),
    ({"tools": [{"class_name": "no_such_module_x1.Tool", "config": {"type": "native"}, "tool_schema": SCHEMA}]},
     r"tools\[0\]: tool class 'no_such_module_x1:Tool': module 'no_such_module_x1' not found"),
    ({"tools": [{"class_name": "answer_tool.AnswerTool", "tool_schema": {"type": "function", "function": {}}}]},
     r"tools\[0\]: tool_schema is not an OpenAI function schema"),
    ({"tools": [{"class_name": "answer_tool.AnswerTool", "tool_schema": SCHEMA}] * 2},
     r"two tools are named 'check_answer'"),
    ({"tools": [{"class_name": "answer_tool.NoSandbox", "tool_schema": SCHEMA}]},
     r"tools\[0\]: making answer_tool.NoSandbox raised OSError: no sandbox here$"),
    ({"tools": [{"class_name": "answer_tool.ToolResponse", "config": {"type": "native"}}]},
     r"tools\[0\]: answer_tool.ToolResponse has no tool_schema \(give one in the config\)"),
    ({"tools": [{"class_name": "answer_tool.Incomplete", "tool_schema": SCHEMA}]},
     r"tools\[0\]: answer_tool.Incomplete has no execute, release method \(verl's BaseTool methods\)"),
]


@pytest.mark.parametrize("content, expected", BAD)
def test_a_broken_tool_config_is_one_line_naming_the_key_and_entry(tmp_path: Path, monkeypatch, content, expected) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "answer_tool", raising=False)
    path = _config(tmp_path, content["tools"])
    with pytest.raises(ConfigError, match=r"^task.tool_config \(.*tool_config.yaml\): " + expected) as error:
        load_verl_tools(str(path))
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"^task.tool_config: no file .*missing.yaml"):
        load_verl_tools(str(tmp_path / "missing.yaml"))
    (tmp_path / "broken.yaml").write_text("tools: [")
    with pytest.raises(ConfigError, match=r"^task.tool_config: .*broken.yaml: not valid YAML"):
        load_verl_tools(str(tmp_path / "broken.yaml"))


VERL_SUBCLASS = textwrap.dedent('''
    from uuid import uuid4

    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import ToolResponse
    from verl.utils.reward_score import gsm8k
    from verl.utils.rollout_trace import rollout_trace_op

    class DoubleTool(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(text=str(2 * int(parameters["x"]))), 0.25, {"doubled": 1}

    class GradedTool(BaseTool):
        """verl's Gsm8kTool contract: the ground truth from create_kwargs, the answer graded by verl's gsm8k scorer,
        a traced execute."""

        def __init__(self, config, tool_schema):
            super().__init__(config, tool_schema)
            self.answers = {}

        async def create(self, instance_id=None, ground_truth=None, **kwargs):
            instance_id = instance_id or str(uuid4())
            self.answers[instance_id] = ground_truth or kwargs.get("create_kwargs", {}).get("ground_truth")
            return instance_id, ToolResponse()

        @rollout_trace_op
        async def execute(self, instance_id, parameters, **kwargs):
            score = gsm8k.compute_score("#### " + str(parameters["answer"]), self.answers[instance_id],
                                        method="flexible", format_score=0.0, score=1.0)
            return ToolResponse(text=f"reward={score}"), score, {}

        async def release(self, instance_id, **kwargs):
            del self.answers[instance_id]
''')


def test_a_subclass_of_verls_own_base_tool_runs(tokenizer, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    """Where verl is installed (skipped otherwise): its ``BaseTool`` (``create`` / ``release`` inherited) gets verl's
    ``OpenAIFunctionToolSchema``, and its ``ToolResponse`` is read."""
    pytest.importorskip("verl.tools.base_tool")
    from verl.tools.schemas import OpenAIFunctionToolSchema

    (tmp_path / "double_tool.py").write_text(VERL_SUBCLASS)
    monkeypatch.syspath_prepend(str(tmp_path))
    schema = {"type": "function", "function": {"name": "double", "description": "Double x.", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "description": "A number."}}, "required": ["x"]}}}
    path = tmp_path / "verl_tools.yaml"
    path.write_text(json.dumps({"tools": [{"class_name": "double_tool.DoubleTool", "config": {"type": "native"},
                                           "tool_schema": schema}]}))
    tools = load_verl_tools(str(path))
    assert isinstance(tools.tools["double"].tool_schema, OpenAIFunctionToolSchema) and tools.schemas() == [schema]
    call = '<tool_call>{"name": "double", "arguments": {"x": 21}}</tool_call>'
    calling = ToolCalling(TurnEngine(tokenizer, [call, "42."]), tokenizer, Toolbox([]), stop_ids=[_end(tokenizer)],
                          verl_tools=tools)
    c, = calling.generate([Prompt("q", "42", messages=CHAT)], 1, SamplingParams(max_new_tokens=200))
    assert c.messages[1]["content"] == "42" and c.tool_extra_fields["tool_rewards"] == [0.25] and c.tool_failures == 0
    # a Gsm8kTool-like one: verl's scorer, its traced execute, the row's ground truth at create
    other = tmp_path / "graded_tools.yaml"
    other.write_text(json.dumps({"tools": [{"class_name": "double_tool.GradedTool", "config": {"type": "native"},
                                            "tool_schema": SCHEMA}]}))
    graded = load_verl_tools(str(other))
    calling = ToolCalling(TurnEngine(tokenizer, [_call("18"), "18."]), tokenizer, Toolbox([]),
                          stop_ids=[_end(tokenizer)], verl_tools=graded)
    extra_info = {"tools_kwargs": {"check_answer": {"create_kwargs": {"ground_truth": "18"}}}}
    c, = calling.generate([Prompt("q", "18", meta={"extra_info": extra_info}, messages=CHAT)], 1,
                          SamplingParams(max_new_tokens=200))
    assert c.messages[1]["content"] == "reward=1.0" and c.tool_extra_fields["tool_rewards"] == [1.0]
    assert graded.tools["check_answer"].answers == {}


def test_a_rows_tool_selection_offers_and_runs_those_tools_only(tokenizer, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    """verl 0.9's ``extra_info.tool_selection``: the row's prompt lists the tools it names (known ones, in its order),
    and a call of another is an unknown tool; rows without one get every tool."""
    from minirl.rollout.tools import tool_calling

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "answer_tool", raising=False)
    other = {"type": "function", "function": {"name": "other_check", "description": "Another.", "parameters": {
        "type": "object", "properties": {"answer": {"type": "string", "description": "The answer."}}, "required": ["answer"]}}}
    entry = {"class_name": "answer_tool.AnswerTool", "config": {"type": "native"}}
    path = _config(tmp_path, [entry | {"tool_schema": SCHEMA}, entry | {"tool_schema": other}])
    cfg = load_config(None, ["task.kind=jsonl", "task.path=x.jsonl", f"task.tool_config={path}"])
    kwargs = {"tools_kwargs": {name: {"create_kwargs": {"ground_truth": "1"}} for name in ("check_answer", "other_check")}}
    rows = [Prompt("q", "1", meta={"extra_info": kwargs | {"tool_selection": ["other_check", "gone"]}}, messages=CHAT),
            Prompt("r", "1", meta={"extra_info": kwargs}, messages=CHAT)]
    calling = tool_calling(cfg, TurnEngine(tokenizer, [_call("1"), "Done."]), tokenizer, None, rows)
    calling.stop_ids.add(_end(tokenizer))  # the model's generation_config would add it (there is no model here)
    assert [t["function"]["name"] for t in rows[0].meta["tools"]] == ["other_check"]
    assert [t["function"]["name"] for t in rows[1].meta["tools"]] == ["check_answer", "other_check"]
    assert "Tools: other_check(answer)<|im_end|>" in tokenizer.decode(encode_prompt(tokenizer, rows[0]))
    selected, everything = calling.generate(rows, 1, SamplingParams(max_new_tokens=300))
    assert selected.tool_failures == 1 and selected.messages[1]["content"] == "{'error': 'Tool check_answer not found.'}"
    assert everything.tool_failures == 0 and everything.tool_extra_fields["tool_rewards"] == [1.0]
    with pytest.raises(ConfigError, match=r"^task.tool_config: 1 of 1 training prompts are plain text"):
        tool_calling(cfg, TurnEngine(tokenizer, ["Done."]), tokenizer, None, [Prompt("q", "1")])


FUNCTION_TOOLS = textwrap.dedent('''
    from verl.tools.function_tool import function_tool

    @function_tool
    def lookup(city: str) -> dict:
        """Look a city up.

        Args:
            city: The city.
        """
        return {"city": city, "population": 3}

    @function_tool(name="grade")
    async def grade_answer(answer: str):
        """Grade an answer.

        Args:
            answer: The answer.
        """
        return f"graded {answer}", float(answer == "3"), {"graded": 1}
''')

FAKE_VERL = textwrap.dedent('''
    """A stand-in for verl 0.9.1's ``verl.tools.function_tool`` (its registry, decorator, ``FunctionTool.call`` and
    ``normalize_function_tool_return``, in short), for machines without verl."""
    import asyncio, inspect, json
    from dataclasses import dataclass
    from transformers.utils import get_json_schema
    from minirl.rollout.verl_tools import OpenAIFunctionToolSchema as Schema

    FUNCTION_TOOL_REGISTRY = {}

    @dataclass
    class FunctionTool:
        name: str
        fn: object
        tool_schema: object
        is_async: bool = False

        async def call(self, parameters):
            return await self.fn(**parameters) if self.is_async else await asyncio.to_thread(self.fn, **parameters)

    def function_tool(name=None):
        def decorator(fn, tool_name=None):
            tool_name = tool_name or fn.__name__
            raw = get_json_schema(fn)
            raw["function"]["name"] = tool_name
            FUNCTION_TOOL_REGISTRY[tool_name] = FunctionTool(tool_name, fn, Schema.model_validate(raw),
                                                             inspect.iscoroutinefunction(fn))
            return fn
        return decorator(name) if callable(name) else (lambda fn: decorator(fn, name))

    def normalize_function_tool_return(ret):
        text = lambda value: json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else str(value)
        if isinstance(ret, tuple):
            return text(ret[0]), 0.0 if len(ret) < 2 or ret[1] is None else float(ret[1]), {}
        return text(ret), 0.0, {}
''')


@pytest.mark.parametrize("verl", ["stand-in", "installed"])
def test_verls_function_tools_run_as_verl_runs_them(tokenizer, tmp_path: Path, monkeypatch, verl: str) -> None:  # noqa: F811
    """``@function_tool`` functions in ``task.tools`` (verl 0.9's ``function_tool_path``): named and described as the
    decorator says, a dict result written as JSON, a ``(response, reward, metrics)`` tuple's reward joining the rollout's
    ``tool_rewards``, beside a row's ``tool_selection``; with verl itself where it is installed."""
    from minirl.rollout.tools import tool_calling

    if verl == "installed":
        pytest.importorskip("verl.tools.function_tool")
    else:
        fake = tmp_path / "fake_verl"
        fake.mkdir()
        (fake / "function_tool.py").write_text(FAKE_VERL)
        for name in ("verl", "verl.tools"):
            monkeypatch.setitem(sys.modules, name, type(sys)(name))
        spec = __import__("importlib.util").util.spec_from_file_location("verl.tools.function_tool", fake / "function_tool.py")
        module = __import__("importlib.util").util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setitem(sys.modules, "verl.tools.function_tool", module)
    registry = sys.modules["verl.tools.function_tool"].FUNCTION_TOOL_REGISTRY
    for name in ("lookup", "grade"):
        monkeypatch.delitem(registry, name, raising=False)
    (tmp_path / "functions.py").write_text(FUNCTION_TOOLS)
    specs = f"[{tmp_path}/functions.py:lookup,{tmp_path}/functions.py:grade_answer]"
    cfg = load_config(None, ["task.kind=jsonl", "task.path=x.jsonl", f"task.tools={specs}"])
    rows = [Prompt("q", "3", meta={"extra_info": {"tool_selection": ["grade"]}}, messages=CHAT), Prompt("r", "3", messages=CHAT)]
    calls = ('<tool_call>{"name": "lookup", "arguments": {"city": "Oslo"}}</tool_call>'
             '<tool_call>{"name": "grade", "arguments": {"answer": "3"}}</tool_call>')
    calling = tool_calling(cfg, TurnEngine(tokenizer, [calls, "3."]), tokenizer, None, rows)
    calling.stop_ids.add(_end(tokenizer))
    assert [t["function"]["name"] for t in rows[1].meta["tools"]] == ["lookup", "grade"]
    assert [t["function"]["name"] for t in rows[0].meta["tools"]] == ["grade"]
    assert rows[1].meta["tools"][1]["function"]["description"] == "Grade an answer."
    selected, both = calling.generate(rows, 1, SamplingParams(max_new_tokens=300))
    assert [m["content"] for m in both.messages if m["role"] == "tool"] == ['{"city": "Oslo", "population": 3}',
                                                                          "graded 3"]
    assert both.tool_extra_fields["tool_rewards"] == [0.0, 1.0] and both.tool_failures == 0
    assert selected.tool_failures == 1 and selected.tool_extra_fields["tool_rewards"] == [1.0]


def test_selections_and_environments_offer_what_each_row_may_call(tokenizer, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    """A row whose ``tool_selection`` names no known tool is offered none (verl's empty selection), and an environment's
    methods stay in every row's prompt beside the verl tools a row selects."""
    from minirl.rollout.tools import tool_calling
    from tests.unit.test_tool_calling import COUNTER

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "answer_tool", raising=False)
    (tmp_path / "counter_env.py").write_text(COUNTER)
    path = _config(tmp_path)
    cfg = load_config(None, ["task.kind=jsonl", "task.path=x.jsonl", f"task.tool_config={path}",
                             f"task.environment={tmp_path}/counter_env.py:Counter"])
    rows = [Prompt("q", "1", meta={"extra_info": {"tool_selection": ["gone"]}}, messages=CHAT),
            Prompt("r", "1", meta={"extra_info": {"tool_selection": ["check_answer"]}}, messages=CHAT),
            Prompt("s", "1", meta={"extra_info": {}}, messages=CHAT)]
    tool_calling(cfg, TurnEngine(tokenizer, ["Done."]), tokenizer, None, rows)
    offered = [[t["function"]["name"] for t in row.meta["tools"]] for row in rows]
    assert offered == [["add"], ["check_answer", "add"], ["check_answer", "add"]]
    alone = load_config(None, ["task.kind=jsonl", "task.path=x.jsonl", f"task.tool_config={path}"])
    tool_calling(alone, TurnEngine(tokenizer, ["Done."]), tokenizer, None, rows[:1])
    assert rows[0].meta["tools"] == [] and "Tools:" not in tokenizer.decode(encode_prompt(tokenizer, rows[0]))


def test_two_tools_of_one_name_are_refused_before_the_run(tokenizer, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    """A ``task.tools`` function, a ``task.tool_config`` tool or an environment's method with the name of another: one
    line naming both keys, when the run is set up (not at the first call)."""
    from minirl.rollout.tools import tool_calling
    from tests.unit.test_tool_calling import COUNTER

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "answer_tool", raising=False)
    (tmp_path / "counter_env.py").write_text(COUNTER)
    (tmp_path / "mine.py").write_text("def check_answer(answer: str) -> str:\n    '''Check.\n\n    Args:\n"
                                      "        answer: it.\n    '''\n    return answer\n\n\ndef add(a: int) -> int:\n"
                                      "    '''Add.\n\n    Args:\n        a: it.\n    '''\n    return a\n")
    path = _config(tmp_path)
    base = ["task.kind=jsonl", "task.path=x.jsonl"]
    rows = [Prompt("q", "1", messages=CHAT)]
    for given, expected in [([f"task.tools=[{tmp_path}/mine.py:check_answer]", f"task.tool_config={path}"],
                             "task.tools and task.tool_config both have a tool named 'check_answer'"),
                            ([f"task.tools=[{tmp_path}/mine.py:add]", f"task.environment={tmp_path}/counter_env.py:Counter"],
                             "task.tools and task.environment both have a tool named 'add'")]:
        with pytest.raises(ConfigError, match=f"^{expected}; the model calls a tool by its name$"):
            tool_calling(load_config(None, base + given), TurnEngine(tokenizer, ["Done."]), tokenizer, None, rows)


SLOW_SYNC = textwrap.dedent('''
    import time

    class SlowTool:
        """An older tool whose methods are plain functions, the execute one slow."""

        def __init__(self, config, tool_schema):
            self.tool_schema, self.seconds = tool_schema, config["seconds"]

        def create(self, **kwargs):
            return "only"

        def execute(self, instance_id, parameters, **kwargs):
            time.sleep(self.seconds)
            return "late " + parameters["answer"], 1.0, {}

        def release(self, instance_id, **kwargs):
            pass
''')


def test_a_plain_tool_method_runs_in_a_thread_within_the_timeout(tokenizer, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    """An older tool's plain (not ``async``) ``execute`` runs in a thread: ``task.tool_timeout_s`` bounds it, and the
    round's calls of every response run together instead of one after another on the event loop."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "slow_tool.py").write_text(SLOW_SYNC)
    for seconds, timeout_s, expected in [(0.6, 0.15, "{'error': 'Tool check_answer timed out after 0.15 s.'}"),
                                         (0.3, 5.0, "late 1")]:
        path = tmp_path / f"slow_{seconds}.yaml"
        path.write_text(json.dumps({"tools": [{"class_name": "slow_tool.SlowTool",
                                               "config": {"type": "native", "seconds": seconds}, "tool_schema": SCHEMA}]}))
        calling = ToolCalling(TurnEngine(tokenizer, [_call("1"), "Done."]), tokenizer, Toolbox([], timeout_s=timeout_s),
                              stop_ids=[_end(tokenizer)], verl_tools=load_verl_tools(str(path)))
        started = __import__("time").perf_counter()
        out = calling.generate([Prompt("q", "1", messages=CHAT)], 4, SamplingParams(max_new_tokens=200))
        took = __import__("time").perf_counter() - started
        assert {c.messages[1]["content"] for c in out} == {expected}
        assert took < 4 * seconds - 0.2  # four responses' calls together, not one after another


def test_a_rows_agent_name_decides_whether_it_calls_tools(tokenizer, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    """verl runs a row's calls only under its ``tool_agent``: a row whose ``agent_name`` is ``single_turn_agent`` is
    offered no tools and its response is one turn (a call it writes is not run); an agent loop minirl does not have is
    one line."""
    from minirl.rollout.tools import tool_calling

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "answer_tool", raising=False)
    cfg = load_config(None, ["task.kind=jsonl", "task.path=x.jsonl", f"task.tool_config={_config(tmp_path)}"])
    kwargs = {"extra_info": {"tools_kwargs": {"check_answer": {"create_kwargs": {"ground_truth": "1"}}}}}
    rows = [Prompt("q", "1", meta=kwargs | {"agent_name": "single_turn_agent"}, messages=CHAT),
            Prompt("r", "1", meta=kwargs | {"agent_name": "tool_agent"}, messages=CHAT)]
    calling = tool_calling(cfg, TurnEngine(tokenizer, [_call("1"), "Done."]), tokenizer, None, rows)
    calling.stop_ids.add(_end(tokenizer))
    assert [[t["function"]["name"] for t in row.meta["tools"]] for row in rows] == [[], ["check_answer"]]
    alone, agent = calling.generate(rows, 1, SamplingParams(max_new_tokens=300))
    assert alone.tool_calls == 0 and [m["role"] for m in alone.messages] == ["assistant"]
    assert agent.tool_calls == 1 and agent.tool_extra_fields["tool_rewards"] == [1.0]
    other = [Prompt("q", "1", meta={"agent_name": "react_agent"}, messages=CHAT)]
    with pytest.raises(ConfigError, match=r"^a row's agent_name 'react_agent': minirl runs verl's tool_agent and "):
        tool_calling(cfg, TurnEngine(tokenizer, ["Done."]), tokenizer, None, other)


def test_tool_extra_fields_are_plain_values_a_dump_loads_again(tmp_path: Path) -> None:
    """Tools may keep anything in ``agent_data.extra_fields`` (numpy values, sets, objects): the completion keeps them
    as plain JSON values, which a rollout dump and a checkpoint (``torch.load(weights_only=True)``) read back."""
    import numpy as np
    import torch

    from minirl.rollout.verl_tools import AgentData

    agent = AgentData([], [{"role": "assistant"}, {"role": "tool"}, {"role": "tool"}, {"role": "assistant"}], {})
    assert (agent.assistant_turns, agent.user_turns) == (2, 1)  # one round of two results: one user turn (verl)
    agent.extra_fields |= {"score": np.float64(0.5), "seen": np.array([1, 2]), "tags": {"a"}, "when": Path("x"),
                           "kept": {"n": 3}}
    agent.tool_rewards += [np.float32(1.0), None]
    fields = agent.tool_extra_fields()
    assert fields == {"score": 0.5, "seen": [1, 2], "tags": ["a"], "when": "x", "kept": {"n": 3}, "turn_scores": [],
                      "tool_rewards": [1.0]}
    completion = Completion(0, 0, [1], [2], torch.zeros(1), "eos", "x", tool_extra_fields=fields)
    torch.save({"completions": [_completion_state(completion)]}, tmp_path / "dump.pt")
    again = torch.load(tmp_path / "dump.pt", weights_only=True)["completions"][0]
    assert Completion(**again).tool_extra_fields == fields


def test_rows_needing_tools_kwargs_without_them_are_counted_in_one_line() -> None:
    from minirl.rollout.verl_tools import missing_tools_kwargs

    rows = [Prompt("q", "1", meta={"extra_info": {"need_tools_kwargs": True, "tools_kwargs": {}}}),
            Prompt("r", "1", meta={"extra_info": {"need_tools_kwargs": True, "tools_kwargs": {"t": {}}}}),
            Prompt("s", "1", meta={"extra_info": {"need_tools_kwargs": False}}), Prompt("t", "1")]
    assert missing_tools_kwargs(rows) == ("1 of 4 training rows set extra_info.need_tools_kwargs but have no "
                                          "tools_kwargs: their tools are created with empty create_kwargs")
    assert missing_tools_kwargs(rows[1:]) is None


def test_the_tool_configs_environment_interpolations_resolve_as_verl_reads_them(tmp_path: Path, monkeypatch) -> None:
    """verl reads the tool config with OmegaConf: ``${oc.env:NAME}`` (with a default after a comma) is the variable's
    value; an unset one without a default is one line; another interpolation needs omegaconf (one line without it)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "answer_tool", raising=False)
    monkeypatch.setenv("CHECKER_URL", "http://checker:8080")
    monkeypatch.delenv("CHECKER_TOKEN", raising=False)
    entry = {"class_name": "answer_tool.AnswerTool", "tool_schema": SCHEMA,
             "config": {"type": "native", "url": "${oc.env:CHECKER_URL}/v1", "token": "${oc.env:CHECKER_TOKEN,none}"}}
    tools = load_verl_tools(str(_config(tmp_path, [entry])))
    assert tools.tools["check_answer"].config == {"type": "native", "url": "http://checker:8080/v1", "token": "none"}
    unset = tmp_path / "unset.yaml"
    unset.write_text(json.dumps({"tools": [entry | {"config": {"type": "native", "token": "${oc.env:CHECKER_TOKEN}"}}]}))
    with pytest.raises(ConfigError, match=r"CHECKER_TOKEN"):  # ours, or OmegaConf's words where it is installed
        load_verl_tools(str(unset))
    if importlib.util.find_spec("omegaconf") is None:
        other = tmp_path / "other.yaml"
        other.write_text(json.dumps({"tools": [entry | {"config": {"type": "native", "url": "${base.url}"}}]}))
        with pytest.raises(ConfigError, match=r"pip install omegaconf"):
            load_verl_tools(str(other))
    dated = tmp_path / "dated.yaml"  # a YAML date (not JSON) loads as before
    dated.write_text("tools:\n  - class_name: answer_tool.AnswerTool\n    config: {type: native, since: 2026-01-02}\n"
                     f"    tool_schema: {json.dumps(SCHEMA)}\n")
    assert str(load_verl_tools(str(dated)).tools["check_answer"].config["since"]) == "2026-01-02"
