"""Tool calls inside a response (``task.tools``, ``minirl.rollout.tools``): reading calls, running them, the template's
results appended as token ids, the response continued, and what the trainer and the reward functions then see."""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from minirl.batching import collate
from minirl.config import ConfigError, load_config
from minirl.rollout.base import DecodeControl
from minirl.rollout.tools import (
    TURN_SEED_STRIDE,
    Toolbox,
    ToolCall,
    ToolCalling,
    apply_tool_schemas,
    check_tool_template,
    parse_hermes,
    tool_suffix_ids,
)
from minirl.tasks.chat import encode_prompt
from minirl.tasks.reward_functions import sample_of, shaped_completion
from minirl.types import Completion, Prompt, SamplingParams

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer():
    """The tool-calling example's tokenizer (its template writes Hermes calls), with the calculator's schemas."""
    builder = _module(EXAMPLES / "tool_calling" / "build_model.py", "tool_calling_build_model")
    tok = builder.build_tokenizer(EXAMPLES / "tool_calling" / "data")
    apply_tool_schemas(tok, Toolbox.load([f"{EXAMPLES / 'tool_calling' / 'calculator.py'}:multiply"]).schemas())
    return tok


def _end(tok) -> int:
    return tok.convert_tokens_to_ids("<|im_end|>")


def multiply(a: int, b: int) -> int:
    """Multiply.

    Args:
        a: first.
        b: second.
    """
    return a * b


async def slow_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


def fails(x: int) -> int:
    raise RuntimeError("no luck")


# ----------------------------------------------------------------------------- reading and running calls


def test_hermes_calls_are_read_and_malformed_ones_counted() -> None:
    turn = parse_hermes('Let me compute. <tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
                        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>')
    assert turn.content == "Let me compute."
    assert turn.calls == [ToolCall("multiply", {"a": 3, "b": 4}), ToolCall("add", {"a": 1, "b": 2})]
    assert turn.malformed == 0
    bad = parse_hermes('<tool_call>{"name": "multiply", "arguments": {"a": 3</tool_call><tool_call>[1]</tool_call>'
                       '<tool_call>{"arguments": {}}</tool_call> then <tool_call>{"name": "x"')
    assert bad.calls == [] and bad.malformed == 4  # not JSON, not an object, no name, never closed
    # a block that is no call stays in the turn's text (the reward functions see what the model wrote)
    mixed = parse_hermes('<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call> and '
                         '<tool_call>{"name": oops}</tool_call>')
    assert mixed.calls == [ToolCall("multiply", {"a": 3, "b": 4})] and mixed.malformed == 1
    assert mixed.content == 'and <tool_call>{"name": oops}</tool_call>'
    assert parse_hermes("The answer is 12.").calls == [] and parse_hermes("The answer is 12.").malformed == 0


QWEN3_RESPONSE = {  # TRL 1.16's qwen3_template (trl.chat_template_utils), a transformers response_template
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def test_the_tokenizers_own_parser_reads_calls_as_trl_does(tokenizer) -> None:
    from minirl.rollout.tools import parse_with_tokenizer

    prompt = encode_prompt(tokenizer, Prompt("q", "", messages=CHAT))
    ids = tokenizer.encode(CALL, add_special_tokens=False) + [_end(tokenizer)]
    reader = copy.deepcopy(tokenizer)
    reader.response_template = QWEN3_RESPONSE
    turn = parse_with_tokenizer(reader, ids, prompt)
    assert turn.calls == [ToolCall("multiply", {"a": 3, "b": 4})] and turn.content == "" and turn.malformed == 0
    plain = parse_with_tokenizer(reader, tokenizer.encode("The answer is 12.", add_special_tokens=False), prompt)
    assert (plain.content, plain.calls) == ("The answer is 12.", [])
    assert parse_with_tokenizer(tokenizer, ids, prompt).calls == []  # no response_template: plain text (TRL's fallback)
    _, calling = _calling(reader, [CALL, "The answer is 12."], parser="tokenizer")
    c, = calling.generate([Prompt("q", "12", messages=CHAT)], 1, SamplingParams(max_new_tokens=200))
    assert c.tool_calls == 1 and c.messages[1] == {"role": "tool", "name": "multiply", "content": "12"}


def test_toolbox_runs_calls_in_order_as_trl_writes_results() -> None:
    box = Toolbox([multiply, slow_add, fails])
    results = box.run([ToolCall("slow_add", {"a": 1, "b": 2}), ToolCall("multiply", {"a": 3, "b": 4}),
                       ToolCall("nope", {}), ToolCall("fails", {"x": 1}), ToolCall("multiply", {"c": 1})])
    assert [(name, failed) for name, _, failed in results] == [
        ("slow_add", False), ("multiply", False), ("nope", True), ("fails", True), ("multiply", True)]
    assert [content for _, content, _ in results[:4]] == ["3", "12", "{'error': 'Tool nope not found.'}",
                                                            "{'error': 'no luck'}"]
    assert "unexpected keyword argument 'c'" in results[4][1]
    with pytest.raises(ConfigError, match="two tools are named 'multiply'"):
        Toolbox([multiply, multiply])


def test_tools_without_a_schema_or_module_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no schema for tool 'fails'") as error:
        Toolbox([fails]).schemas()
    assert "\n" not in str(error.value)

    class Counter:
        def add(self, n: int) -> int:
            return n

    with pytest.raises(ConfigError, match=r"^task\.environment: no schema for method Counter\.add: "):
        Toolbox([Counter().add]).schemas()
    with pytest.raises(ConfigError, match=r"task\.tools: tool 'no_such_module:f': module 'no_such_module' not found"):
        Toolbox.load(["no_such_module:f"])


def test_schemas_reach_the_prompt_and_a_row_tools_column_wins(tokenizer) -> None:
    text = tokenizer.decode(encode_prompt(tokenizer, Prompt("q", "", messages=[{"role": "user", "content": "q"}])))
    assert "Tools: multiply(a, b)" in text
    row_tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"properties": {"key": {}}}}}]
    own = Prompt("q", "", meta={"tools": row_tools}, messages=[{"role": "user", "content": "q"}])
    assert "Tools: lookup(key)" in tokenizer.decode(encode_prompt(tokenizer, own))


def test_results_are_the_templates_suffix_after_the_turn(tokenizer) -> None:
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "12"}], [_end(tokenizer)])
    # the template writes a newline after each end of turn, as Qwen's does; the model's turn ends at <|im_end|>, so
    # the results start with that newline (the turn's rendering is cut after its end token, TRL's rule)
    assert tokenizer.decode(suffix) == "\n<|im_start|>user\n<tool_response>12</tool_response><|im_end|>\n<|im_start|>assistant\n"
    check_tool_template(tokenizer, [_end(tokenizer)])
    chat_math = _module(EXAMPLES / "chat_math" / "build_model.py", "chat_math_build_model")
    plain = chat_math.build_tokenizer(chat_math.corpus(EXAMPLES / "chat_math" / "data"))
    with pytest.raises(ConfigError, match="the chat template drops a tool call's name or arguments") as error:
        check_tool_template(plain, [_end(plain)])
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------- a response in turns


class TurnEngine:
    """Answers each prompt by its script of turns: which turn is next, the response so far tells (its length). Turn
    k's token t has logp -(10 k + t) / 100; routes are the call's index on every position (-1 on the last). Records
    the calls."""

    def __init__(self, tok, turns: list[str], *, in_call: bool = False) -> None:
        end = _end(tok)
        self.tok, self.turns = tok, [tok.encode(text, add_special_tokens=False) + [end] for text in turns]
        self.continues_in_call, self.calls = in_call, []

    def generate(self, prompts, n, sampling, record_routes=False, control=None):
        self.calls.append((len(prompts), n, sampling, control))
        out = []
        for index, prompt in enumerate(prompts):
            done = list(prompt.response_prefix or [])
            k = self._turn(done)
            for sample in range(n):
                ids = self.turns[k][: sampling.max_new_tokens]
                full = encode_prompt(self.tok, prompt) + done
                routes = torch.full((len(full) + len(ids), 1, 1), len(self.calls), dtype=torch.int16)
                routes[-1] = -1
                out.append(Completion(index, sample, full, list(ids), torch.tensor([-(10 * k + t) / 100 for t in range(len(ids))]),
                                      "eos" if len(ids) == len(self.turns[k]) else "length", "",
                                      routes if record_routes else None))
        return out

    def _turn(self, done: list[int]) -> int:
        """How many scripted turns the response so far holds (each ends at <|im_end|>)."""
        return done.count(_end(self.tok)) // 2 if done else 0  # a turn's end, then the result's own end


CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
CHAT = [{"role": "user", "content": "What is 3 * 4?"}]


def _calling(tok, turns, **kwargs) -> tuple[TurnEngine, ToolCalling]:
    engine = TurnEngine(tok, turns, in_call=kwargs.pop("in_call", False))
    return engine, ToolCalling(engine, tok, Toolbox([multiply]), stop_ids=[_end(tok), tok.eos_token_id], **kwargs)


def test_a_call_is_run_its_result_appended_and_the_response_continued(tokenizer) -> None:
    engine, calling = _calling(tokenizer, [CALL, "The answer is 12."])
    prompt = Prompt("What is 3 * 4?", "12", messages=CHAT)
    out = calling.generate([prompt], 2, SamplingParams(max_new_tokens=64, seed=5), record_routes=True)
    assert len(out) == 2 and [c.sample_index for c in out] == [0, 1]
    first, suffix, second = (engine.turns[0], tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "12"}],
                             [_end(tokenizer)]), engine.turns[1])
    c = out[0]
    assert c.completion_ids == first + suffix + second and c.prompt_ids == encode_prompt(tokenizer, prompt)
    expected_logp = [-t / 100 for t in range(len(first))] + [0.0] * len(suffix) + [-(10 + t) / 100 for t in range(len(second))]
    assert c.logp_rollout.tolist() == pytest.approx(expected_logp, abs=1e-7)
    assert c.sampled_mask.tolist() == [True] * len(first) + [False] * len(suffix) + [True] * len(second)
    assert c.finish_reason == "eos" and c.tool_calls == 1 and c.tool_failures == 0
    assert c.messages == [{"role": "assistant", "content": "", "tool_calls": [ToolCall("multiply", {"a": 3, "b": 4}).message()]},
                          {"role": "tool", "name": "multiply", "content": "12"},
                          {"role": "assistant", "content": "The answer is 12."}]
    assert "<tool_response>12</tool_response>" in c.text and c.text.endswith("The answer is 12.")
    assert c.routes.shape[0] == len(c.prompt_ids) + len(c.completion_ids) and int(c.routes[0]) == 2  # the last call's
    # the continuation: both rows in one call, one sample each, a stream of its own, the response's budget left
    (rows, n, sampling, control), = engine.calls[1:]
    assert (rows, n, control) == (2, 1, None)
    assert sampling.seed == 5 + TURN_SEED_STRIDE and sampling.max_new_tokens == 64 - len(first) - len(suffix)
    # the trainer: the results train nothing and have no mu; every sampled token trains
    batch = collate(out, torch.ones(2), pad_token_id=tokenizer.pad_token_id)
    n_prompt = len(c.prompt_ids)
    trained = batch.mask[0, n_prompt - 1: n_prompt - 1 + len(c.completion_ids)]
    assert trained.tolist() == c.sampled_mask.tolist() and int(batch.mask[0].sum()) == len(first) + len(second)
    # the reward functions: TRL's completions for a chat prompt, the turns and the result
    assert shaped_completion(sample_of(prompt, c.text, c.completion_ids, messages=c.messages)) == c.messages


def test_budgets_rounds_and_unfinished_turns(tokenizer) -> None:
    prompt = Prompt("What is 3 * 4?", "12", messages=CHAT)
    # the engine takes per-row budgets: the continuation gets them
    engine, calling = _calling(tokenizer, [CALL, "The answer is 12."], in_call=True)
    calling.generate([prompt], 1, SamplingParams(max_new_tokens=64))
    control = engine.calls[1][3]
    assert isinstance(control, DecodeControl) and control.stop is None and control.max_new_tokens == [engine.calls[1][2].max_new_tokens]
    # results that leave no room for one more token are not appended: the response ends unfinished
    first = len(engine.turns[0])
    suffix = len(tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "12"}], [_end(tokenizer)]))
    engine, calling = _calling(tokenizer, [CALL, "The answer is 12."])
    c, = calling.generate([prompt], 1, SamplingParams(max_new_tokens=first + suffix))
    assert len(engine.calls) == 1 and c.finish_reason == "length" and c.completion_ids == engine.turns[0]
    assert c.tool_calls == 1 and [m["role"] for m in c.messages] == ["assistant"]  # the call, no result
    # one token of room: the continuation is cut there
    engine, calling = _calling(tokenizer, [CALL, "The answer is 12."])
    c, = calling.generate([prompt], 1, SamplingParams(max_new_tokens=first + suffix + 1))
    assert len(c.completion_ids) == first + suffix + 1 and c.finish_reason == "length" and c.sampled_mask[-1]
    # max_tool_iterations: a call beyond the last round is not run
    engine, calling = _calling(tokenizer, [CALL, CALL, "The answer is 12."], max_iterations=1)
    c, = calling.generate([prompt], 1, SamplingParams(max_new_tokens=200))
    assert len(engine.calls) == 2 and c.tool_calls == 1 and [m["role"] for m in c.messages] == ["assistant", "tool", "assistant"]
    assert "tool_calls" in c.messages[-1]  # what the model wrote, not run
    # a turn cut by the budget is not run, even if a whole call is in it
    engine, calling = _calling(tokenizer, [CALL, "The answer is 12."])
    c, = calling.generate([prompt], 1, SamplingParams(max_new_tokens=first - 1))
    assert len(engine.calls) == 1 and c.tool_calls == 0 and c.finish_reason == "length"


def test_failed_and_malformed_calls_count(tokenizer) -> None:
    prompt = Prompt("q", "", messages=CHAT)
    engine, calling = _calling(tokenizer, ['<tool_call>{"name": "divide", "arguments": {}}</tool_call>', "Sorry."])
    c, = calling.generate([prompt], 1, SamplingParams(max_new_tokens=200))
    assert (c.tool_calls, c.tool_failures) == (1, 1) and c.messages[1]["content"] == "{'error': 'Tool divide not found.'}"
    engine, calling = _calling(tokenizer, ['<tool_call>{"name": "multiply", "arguments": {"a": 3</tool_call>'])
    c, = calling.generate([prompt], 1, SamplingParams(max_new_tokens=200))
    assert (c.tool_calls, c.tool_failures, len(engine.calls)) == (1, 1, 1)  # nothing to run: the response ends
    two = '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>' * 2
    engine, calling = _calling(tokenizer, [two, "Done."], max_calls_per_turn=1)  # verl's max_parallel_calls
    c, = calling.generate([prompt], 1, SamplingParams(max_new_tokens=200))
    assert c.tool_calls == 1 and [m["role"] for m in c.messages] == ["assistant", "tool", "assistant"]
    assert len(c.messages[0]["tool_calls"]) == 2  # what the model wrote; the first ran


def test_metrics_and_dumps_carry_the_calls(tokenizer) -> None:
    from minirl.monitor.step import rollout_metrics
    from minirl.sources import _completion_state

    _, calling = _calling(tokenizer, [CALL, "The answer is 12."])
    out = calling.generate([Prompt("q", "12", messages=CHAT)], 2, SamplingParams(max_new_tokens=200))
    out[1] = replace(out[1], tool_calls=2, tool_failures=1)
    metrics = rollout_metrics(out, torch.ones(1, 2))
    assert metrics["tools/call_frequency"] == 1.5 and metrics["tools/failure_frequency"] == pytest.approx(1 / 3)
    again = Completion(**json.loads(json.dumps(_completion_state(out[0]), default=lambda t: t.tolist())))
    assert again.messages == out[0].messages and again.tool_calls == 1


@pytest.mark.parametrize("override, expected", [
    (["task.tools=[calculator:multiply]", "rollout.partial_rollout=true"], "set rollout.partial_rollout=false"),
    (["task.tools=[calculator:multiply]", "task.chat_template=plain"], "task.chat_template=plain has none"),
    (["task.environment={}"], "an empty mapping names no environment"),
])
def test_config_refuses_what_tools_cannot_do(override: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(None, override)


def test_trl_and_verl_tool_settings_carry_over(tmp_path: Path) -> None:
    from minirl.peers import from_trl, from_verl

    assert from_trl({"max_tool_calling_iterations": 3}).values["task.max_tool_iterations"] == 3
    assert "task.max_tool_iterations" not in from_trl({}).values
    tools = tmp_path / "tool_config.yaml"
    tools.write_text("tools:\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n    config: {type: native}\n"
                     "    tool_schema: {type: function, function: {name: calc_gsm8k_reward, parameters: {}}}\n")
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    out = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.enable": True,
                            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 5,
                            "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(tools)})
    assert out.values["task.max_tool_iterations"] == 4  # five assistant turns, four rounds of calls between them
    assert out.values["task.max_tool_calls_per_turn"] == 1  # verl's max_parallel_calls default: the first call runs
    fewer = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.enable": True,
                              "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 5,
                              "actor_rollout_ref.rollout.multi_turn.max_user_turns": 2,
                              "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": 3}).values
    assert (fewer["task.max_tool_iterations"], fewer["task.max_tool_calls_per_turn"]) == (2, 3)
    # verl's tool classes run here (minirl.rollout.verl_tools); its @function_tool files are listed by hand
    assert out.values["task.tool_config"] == str(tools) and not any("multi_turn" in x for x in out.not_translated)
    elsewhere = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.enable": True,
                                  "actor_rollout_ref.rollout.multi_turn.tool_config_path": "/cluster/tools.yaml",
                                  "actor_rollout_ref.rollout.multi_turn.function_tool_path": "my_tools.py"})
    assert elsewhere.values["task.tool_config"] == "/cluster/tools.yaml"
    assert any("tool_config_path" in x and "not found here" in x for x in elsewhere.differs)
    line, = [line for line in elsewhere.not_translated if "function_tool_path" in line]
    assert "cannot read its functions here" in line and "task.tools" in line
    # verl 0.9's @function_tool file: its functions become task.tools (a renamed one too: the loader reads verl's
    # registry); where verl is not installed, a line says how to install it
    functions = tmp_path / "function_tools.py"
    functions.write_text("from verl.tools.function_tool import function_tool\n\n@function_tool\ndef get_weather(city: str)"
                         " -> dict:\n    return {}\n\n@function_tool('calc')\nasync def calculator(e: str) -> str:\n"
                         "    return e\n\ndef helper():\n    pass\n")
    read = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.enable": True,
                             "actor_rollout_ref.rollout.multi_turn.function_tool_path": str(functions)})
    assert read.values["task.tools"] == [f"{functions}:get_weather", f"{functions}:calculator"]
    assert not any("function_tool" in x for x in read.not_translated)
    assert any("imports verl's @function_tool" in x for x in read.differs) == (importlib.util.find_spec("verl") is None)
    bare = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.enable": True})
    assert any("multi_turn.enable" in x and "no tools" in x for x in bare.not_translated)
    # verl 0.9 runs a row's calls only under its tool_agent: the default agent loop says which rows that is
    assert any("default_agent_loop" in x and "agent_name column is tool_agent" in x for x in out.differs)
    agent = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.enable": True,
                              "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(tools),
                              "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent"})
    assert not any("agent_loop" in x or "agent_name" in x for x in agent.differs + agent.not_translated + agent.ignored)
    react = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.enable": True,
                              "actor_rollout_ref.rollout.agent.default_agent_loop": "react_agent"})
    assert any("default_agent_loop" in x for x in react.not_translated)
    # tools given with multi_turn off, and verl's interactions: said, not dropped or "ignored"
    off = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.tool_config_path": str(tools),
                            "actor_rollout_ref.rollout.multi_turn.interaction_config_path": "interaction.yaml"})
    assert "task.tool_config" not in off.values
    assert any("tool_config_path" in x and "multi_turn off" in x for x in off.not_translated)
    assert any("interaction_config_path" in x and "not translated" in x for x in off.not_translated)
    plain = from_verl(base)
    assert "task.max_tool_iterations" not in plain.values and not any("multi_turn" in x for x in plain.not_translated)


def test_a_rounds_calls_of_every_response_run_together(tokenizer) -> None:
    """An ``async def`` tool's calls from all the responses of a round are awaited together (verl's agent loop runs
    its rollouts concurrently): every call is in flight before the first returns."""
    flight = {"now": 0, "most": 0}

    async def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        flight["now"] += 1
        flight["most"] = max(flight["most"], flight["now"])
        await asyncio.sleep(0)
        flight["now"] -= 1
        return key.upper()

    engine = TurnEngine(tokenizer, ['<tool_call>{"name": "lookup", "arguments": {"key": "ab"}}</tool_call>', "AB."])
    calling = ToolCalling(engine, tokenizer, Toolbox([lookup]), stop_ids=[_end(tokenizer)])
    out = calling.generate([Prompt("q", "", messages=CHAT), Prompt("r", "", messages=CHAT)], 3, SamplingParams(max_new_tokens=200))
    assert flight["most"] == 6 and all(c.messages[1]["content"] == "AB" for c in out)
    assert len(engine.calls) == 2 and engine.calls[1][:2] == (6, 1)  # one continuation call for all six


COUNTER = '''
class Counter:
    """Each rollout counts in its own instance; the reward: reaching the row's target."""

    made = 0

    def __init__(self):
        Counter.made += 1
        self.total, self.target, self.rows = 0, None, []

    def reset(self, **row):
        self.rows.append(row)
        self.total, self.target = 0, int(row["answer"])
        return f" (count to {self.target})"

    def add(self, a: int, b: int) -> int:
        """Add to the count.

        Args:
            a: what to add.
            b: ignored.
        """
        self.total += a
        return self.total

    def get_reward(self) -> float:
        return float(self.total == self.target)


class Quiet:
    def reset(self, **row):
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply.

        Args:
            a: first.
            b: second.
        """
        return a * b
'''


def test_environments_reset_per_rollout_own_the_tools_and_score(tokenizer, tmp_path: Path) -> None:
    from minirl.rollout.environments import load_environments

    module = tmp_path / "counter_env.py"
    module.write_text(COUNTER)
    envs = load_environments(f"{module}:Counter")
    assert envs.methods[None] == ["add"] and envs.rewarded == {None: "Counter"}
    add = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    engine = TurnEngine(tokenizer, [add, "Done."])
    calling = ToolCalling(engine, tokenizer, Toolbox([]), stop_ids=[_end(tokenizer)], environments=envs)
    prompts = [Prompt("q", "3", meta={"level": 1}, messages=CHAT), Prompt("r", "5", messages=CHAT)]
    out = calling.generate(prompts, 2, SamplingParams(max_new_tokens=200))
    assert [(c.prompt_index, c.sample_index) for c in out] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # the reset's text is in the prompt the engine saw; each rollout reset with its row, one instance each
    assert tokenizer.decode(out[0].prompt_ids).endswith("What is 3 * 4? (count to 3)<|im_end|>\n<|im_start|>assistant\n")
    assert "(count to 5)" in tokenizer.decode(out[2].prompt_ids)
    assert engine.calls[0][:2] == (4, 1) and len(envs.pool[None]) == 4
    first = envs.pool[None][0]
    assert first.rows[-1] == {"level": 1, "prompt": CHAT, "answer": "3"}
    # each call went to its rollout's own instance: 3 reaches the first prompt's target, not the second's
    assert [c.environment_reward for c in out] == [1.0, 1.0, 0.0, 0.0] and out[0].messages[1]["content"] == "3"
    # the pool is reset, not rebuilt, in the next step
    made = type(first).made
    calling.generate(prompts, 2, SamplingParams(max_new_tokens=200))
    assert type(first).made == made and len(envs.pool[None]) == 4
    # the reward: a function named after the class, beside the others (minirl.tasks.build_task_from_config)
    from minirl.tasks import RewardRunner, build_task_from_config

    cfg = load_config(None, ["task.kind=jsonl", f"task.path={EXAMPLES / 'tool_calling' / 'data' / 'train.jsonl'}",
                             f"task.environment={module}:Counter", "task.reward_timeout_s=null"])
    runner = RewardRunner.from_config(build_task_from_config(cfg.task), cfg.task)
    rewards, _ = runner.score(prompts, out)
    assert rewards.tolist() == [1.0, 1.0, 0.0, 0.0] and [f.name for f in runner.functions] == ["Counter"]


ENVIRONMENT_REWARDS = '''
import os


def counted(environments, **kwargs):
    """TRL's reward function over the rollouts' instances (GRPOTrainer passes environments=)."""
    return [float(env.total) for env in environments]


def where(completions, environments, **kwargs):
    """The process it runs in: the trainer's, where the instances are."""
    return [float(os.getpid())] * len(completions)


def from_kwargs(completions, **kwargs):
    """TRL's other way to read them: every reward function gets environments=, a **kwargs one too."""
    return [float(env.total) for env in kwargs["environments"]]


def saw_reset(prompts, completions):
    """TRL shows the reward functions the prompt with the reset()'s text (scored in a worker: no environments)."""
    return [float(p[-1]["content"].endswith("(count to 3)")) for p in prompts]
'''


def test_reward_functions_taking_environments_get_the_rollouts_instances(tokenizer, tmp_path: Path) -> None:
    """TRL passes ``environments=`` (the batch's instances) to every reward function; one that names the parameter is
    scored in the trainer's process, beside the workers that score the others; a dump or an async checkpoint does not
    keep the instance."""
    import os

    from minirl.rollout.environments import load_environments
    from minirl.sources import _completion_state
    from minirl.tasks import RewardRunner, build_task_from_config

    (tmp_path / "counter_env2.py").write_text(COUNTER)
    (tmp_path / "env_rewards.py").write_text(ENVIRONMENT_REWARDS)
    envs = load_environments(f"{tmp_path / 'counter_env2.py'}:Counter")
    add = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    calling = ToolCalling(TurnEngine(tokenizer, [add, "Done."]), tokenizer, Toolbox([]), stop_ids=[_end(tokenizer)],
                          environments=envs)
    prompts = [Prompt("q", "3", messages=CHAT), Prompt("r", "5", messages=CHAT)]
    out = calling.generate(prompts, 2, SamplingParams(max_new_tokens=200))
    assert all(c.environment is not None for c in out) and len({id(c.environment) for c in out}) == 4
    functions = json.dumps([{"function": f"{tmp_path / 'env_rewards.py'}:counted"},
                            {"function": f"{tmp_path / 'env_rewards.py'}:where", "weight": 0.0},
                            {"function": f"{tmp_path / 'env_rewards.py'}:from_kwargs", "weight": 0.0},
                            {"function": f"{tmp_path / 'env_rewards.py'}:saw_reset", "weight": 0.0},
                            {"function": f"{EXAMPLES / 'tool_calling' / 'rewards.py'}:used_a_tool", "weight": 0.0}])
    cfg = load_config(None, ["task.kind=jsonl", f"task.path={EXAMPLES / 'tool_calling' / 'data' / 'train.jsonl'}",
                             f"task.reward_functions={functions}", "task.reward_timeout_s=10"])
    with RewardRunner.from_config(build_task_from_config(cfg.task), cfg.task) as runner:
        assert runner.in_worker  # used_a_tool runs in a worker; the two taking environments here
        rewards, stats = runner.score(prompts, out)
    assert rewards.tolist() == [3.0] * 4 and stats["reward/where/mean"] == float(os.getpid())
    assert stats["reward/from_kwargs/mean"] == 3.0
    assert stats["reward/saw_reset/mean"] == 0.5  # the first prompt's two rollouts: "(count to 3)"; the second's: 5
    assert stats["reward/used_a_tool/mean"] == pytest.approx(0.1)
    assert "environment" not in _completion_state(out[0])
    from minirl.async_rollout import _plain
    from minirl.dynamic_sampling import Sampled

    kept = _plain(1, Sampled(prompts=prompts, completions=out, rewards=rewards, reward_stats={}, columns=[],
                             generated_tokens=0),
                  {id(p): n for n, p in enumerate(prompts)})
    assert all(c["environment"] is None and c["environment_prompt"] is None for c in kept["completions"])


def test_named_environments_pick_by_row_and_show_their_own_tools(tokenizer, tmp_path: Path) -> None:
    from minirl.rollout.environments import load_environments

    module = tmp_path / "two_envs.py"
    module.write_text(COUNTER)
    setting = {"count": f"{module}:Counter", "calc": f"{module}:Quiet"}
    envs = load_environments(setting)
    assert envs.named and envs.rewarded == {"count": "Counter"}
    cfg = load_config(None, ["task.kind=jsonl", "task.path=x.jsonl", f"task.environment={json.dumps(setting)}"])
    rows = [Prompt("q", "3", meta={"environment": "count"}, messages=CHAT),
            Prompt("r", "5", meta={"environment": "calc"}, messages=CHAT)]
    from minirl.rollout.tools import tool_calling

    calling = tool_calling(cfg, TurnEngine(tokenizer, ["Done."]), tokenizer, None, rows)
    assert [t["function"]["name"] for t in rows[0].meta["tools"]] == ["add"]
    assert [t["function"]["name"] for t in rows[1].meta["tools"]] == ["multiply"]
    assert "Tools: multiply(a, b)" in tokenizer.decode(encode_prompt(tokenizer, rows[1]))
    out = calling.generate(rows, 1, SamplingParams(max_new_tokens=50))
    assert [c.environment_reward for c in out] == [0.0, None]  # Quiet has no get_reward
    broken = tmp_path / "broken_env.py"
    broken.write_text("class Broken:\n    def __init__(self):\n        raise OSError('no sandbox')\n")
    from minirl.rollout.environments import EnvironmentFailure

    with pytest.raises(EnvironmentFailure, match=r"making Broken raised OSError: no sandbox$"):
        load_environments(f"{broken}:Broken")
    with pytest.raises(ConfigError, match="a row's environment 'chess' is none of"):
        tool_calling(cfg, TurnEngine(tokenizer, ["Done."]), tokenizer, None,
                     [Prompt("q", "3", meta={"environment": "chess"}, messages=CHAT)])
    from minirl.tasks.reward_functions import environment_reward

    assert environment_reward("p", "c", "a", environment_reward=1.0, environment="calc",
                              class_environments=["count"]) is None
    assert environment_reward("p", "c", "a", environment_reward=1.0, environment="count",
                              class_environments=["count"]) == 1.0


def test_minirl_train_takes_trls_tools_and_environment_factory(tmp_path: Path) -> None:
    from minirl.api import _configure

    calculator = _module(EXAMPLES / "tool_calling" / "calculator.py", "calculator_for_api")
    import sys

    sys.modules["calculator_for_api"] = calculator  # importable by name, as a user's module is
    cfg = _configure(None, ["task.kind=jsonl", "task.path=x.jsonl"], None, None, None, None, None,
                     tools=[calculator.add, "calculator:multiply"], environment_factory=calculator.multiply)
    assert cfg.task.tools == ["calculator_for_api:add", "calculator:multiply"]
    assert cfg.task.environment == "calculator_for_api:multiply"
    cfg = _configure(None, ["task.kind=jsonl", "task.path=x.jsonl"], None, None, None, None, None,
                     environment_factory={"calc": calculator.add, "other": "env.py:Other"})
    assert cfg.task.environment == {"calc": "calculator_for_api:add", "other": "env.py:Other"}
    factory = lambda: None  # noqa: E731  (TRL takes any factory: named for this process)
    cfg = _configure(None, ["task.kind=jsonl", "task.path=x.jsonl"], None, None, None, None, None,
                     environment_factory=factory)
    assert cfg.task.environment.startswith("minirl.api:_IN_PROCESS._lambda__")
    # no train_dataset: the environment owns the data (TRL's rule): empty prompts, each filled by its reset()
    import datasets

    from minirl.api import ENVIRONMENT_ROWS
    from minirl.tasks.jsonl import ColumnMap, _row_to_prompt

    cfg = _configure(None, [f"run.output_dir={tmp_path}"], None, None, None, None, None,
                     environment_factory=calculator.multiply)
    rows = datasets.load_from_disk(cfg.task.path)
    assert len(rows) == ENVIRONMENT_ROWS and rows[0]["prompt"] == [{"role": "user", "content": ""}]
    prompt = _row_to_prompt({"environment": "calc"}, "f:1", ColumnMap(answer_required=False, environment_prompts=True))
    assert prompt.messages == [{"role": "user", "content": ""}]  # a row without a prompt: its environment's reset()
    with pytest.raises(ConfigError, match=r"^environment_factory: a dict of environments needs a train_dataset"):
        _configure(None, [f"run.output_dir={tmp_path}"], None, None, None, None, None,
                   environment_factory={"calc": calculator.add})


def test_a_call_past_the_timeout_is_an_error_result_and_the_model_goes_on() -> None:
    import threading
    import time

    release = threading.Event()

    def stuck(a: int) -> int:
        """Never answers in time.

        Args:
            a: anything.
        """
        release.wait(5)
        return a

    async def slow(a: int) -> int:
        """Answers too late.

        Args:
            a: anything.
        """
        await asyncio.sleep(5)
        return a

    box = Toolbox([stuck, slow, multiply], timeout_s=0.2)
    started = time.perf_counter()
    results = box.run([ToolCall("stuck", {"a": 1}), ToolCall("slow", {"a": 2}), ToolCall("multiply", {"a": 3, "b": 4})])
    release.set()
    assert time.perf_counter() - started < 2.0  # both abandoned at 0.2 s, not waited for
    assert results == [("stuck", "{'error': 'Tool stuck timed out after 0.2 s.'}", True),
                       ("slow", "{'error': 'Tool slow timed out after 0.2 s.'}", True), ("multiply", "12", False)]
    assert Toolbox([fails], timeout_s=1.0).run([ToolCall("fails", {"x": 1})])[0][1:] == ("{'error': 'no luck'}", True)
    assert box.joined([slow_add]).timeout_s == 0.2  # an environment's methods keep the run's timeout
    # no limit past what a thread wait takes (inf): the calls run as without one
    assert Toolbox([multiply, slow_add], timeout_s=float("inf")).run(
        [ToolCall("multiply", {"a": 3, "b": 4}), ToolCall("slow_add", {"a": 1, "b": 2})]) == [
        ("multiply", "12", False), ("slow_add", "3", False)]


def test_a_tool_that_exits_is_an_error_result_not_the_end_of_the_run() -> None:
    import sys

    def leave(code: int) -> int:
        """Runs the model's exit().

        Args:
            code: exit status.
        """
        sys.exit(code)

    async def leave_later(code: int) -> int:
        """The same, awaited.

        Args:
            code: exit status.
        """
        sys.exit(code)

    for timeout_s in (None, 1.0):
        results = Toolbox([leave, leave_later, multiply], timeout_s=timeout_s).run(
            [ToolCall("leave", {"code": 3}), ToolCall("leave_later", {"code": 4}), ToolCall("multiply", {"a": 2, "b": 2})])
        assert results == [("leave", "{'error': 'Tool leave exited (SystemExit: 3).'}", True),
                           ("leave_later", "{'error': 'Tool leave_later exited (SystemExit: 4).'}", True),
                           ("multiply", "4", False)]


LIMIT = asyncio.Semaphore(2)  # bound to the first event loop that uses it


async def limited_add(a: int, b: int) -> int:
    """Adds under a module-level semaphore (as a rate-limited API client would).

    Args:
        a: first.
        b: second.
    """
    async with LIMIT:
        await asyncio.sleep(0)
        return a + b


def test_async_tools_and_rewards_share_one_event_loop_across_rounds() -> None:
    from minirl.tasks.reward_functions import resolve

    box = Toolbox([limited_add])
    for round_ in range(3):  # a new loop per round made the second round fail ("bound to a different event loop")
        results = box.run([ToolCall("limited_add", {"a": round_, "b": 1}) for _ in range(4)])
        assert results == [("limited_add", str(round_ + 1), False)] * 4
    assert resolve(limited_add(2, 3)) == 5  # an async reward function, awaited on the same loop


def test_long_results_are_cut_as_verl_cuts_them(tokenizer) -> None:
    from minirl.peers import from_verl
    from minirl.rollout.tools import cut_result

    text = "abcdefghij"
    assert cut_result(text, None, "middle") == text and cut_result(text, 10, "head") == text
    assert cut_result(text, 4, "head") == "abcd...(truncated)"
    assert cut_result(text, 4, "tail") == "(truncated)...ghij"
    assert cut_result(text, 4, "middle") == "ab...(truncated)...ij"

    def long(a: int) -> str:
        """A long result.

        Args:
            a: its length.
        """
        return "x" * a

    engine = TurnEngine(tokenizer, ['<tool_call>{"name": "long", "arguments": {"a": 50}}</tool_call>', "Done."])
    calling = ToolCalling(engine, tokenizer, Toolbox([long]), stop_ids=[_end(tokenizer)], result_max_chars=6,
                          result_keep="head")
    c, = calling.generate([Prompt("q", "", messages=CHAT)], 1, SamplingParams(max_new_tokens=300))
    assert c.messages[1]["content"] == "xxxxxx...(truncated)" and "xxxxxx...(truncated)</tool_response>" in c.text
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.rollout.multi_turn.enable": True}
    v = from_verl(base).values  # verl cuts every response at 256 characters unless told otherwise
    assert (v["task.tool_result_max_chars"], v["task.tool_result_keep"]) == (256, "middle")
    v = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.max_tool_response_length": 1000,
                          "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": "left"}).values
    # verl 0.9's side is the one cut (tool_agent_loop.py: left -> "(truncated)..." + text[-n:]); before 0.9 it was
    # the side kept, which a line says
    assert (v["task.tool_result_max_chars"], v["task.tool_result_keep"]) == (1000, "tail")
    assert any("verl before 0.9 kept that side" in line and "task.tool_result_keep=head" in line for line in from_verl(
        base | {"actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": "left"}).differs)
    v = from_verl(base | {"actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": "right"}).values
    assert v["task.tool_result_keep"] == "head"


def test_slimes_tool_key_is_the_tools_column() -> None:
    from minirl.peers import from_slime

    base = {"hf-checkpoint": "m", "prompt-data": "d.jsonl", "rollout-batch-size": 2, "n-samples-per-prompt": 2,
            "global-batch-size": 4}
    assert not any("tool-key" in line for line in from_slime(base | {"tool-key": "tools"}).not_translated)
    line, = [line for line in from_slime(base | {"tool-key": "functions"}).not_translated if "tool-key" in line]
    assert "rename the column" in line


def test_the_event_loop_outlives_an_exit_and_is_one_per_process() -> None:
    from minirl.tasks.reward_functions import background_loop, resolve

    async def leave() -> None:
        raise SystemExit(2)

    loop = background_loop()
    with pytest.raises(SystemExit):  # an async reward function's SystemExit reaches its caller, as a sync one's would
        resolve(leave())
    assert background_loop() is loop and loop.is_running()  # and the loop goes on


def test_a_class_defined_again_is_a_new_environment(monkeypatch) -> None:
    # minirl.train twice in one process (a notebook), the class redefined in between: the second run uses the new one
    import sys
    import types

    from minirl.rollout.environments import load_environments

    module = types.ModuleType("notebook_env")
    monkeypatch.setitem(sys.modules, "notebook_env", module)

    class Scored:
        def reset(self, **row) -> None:
            return None

        def get_reward(self) -> float:
            return 0.25

    module.Scored = Scored
    first = load_environments("notebook_env:Scored")
    assert load_environments("notebook_env:Scored") is first  # probed once for the same class

    class Scored:  # defined again
        def reset(self, **row) -> None:
            return None

        def get_reward(self) -> float:
            return 0.75

    module.Scored = Scored
    again = load_environments("notebook_env:Scored")
    assert again is not first and again.factories[None] is Scored
