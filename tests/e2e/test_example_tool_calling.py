"""The tool-calling example (examples/tool_calling) end to end through the CLI, as the README walks it: a model
directory whose chat template writes tool calls, SFT on tool-calling conversations, then RL in which the model's
calls of the calculator are run and their results appended (``task.tools``), R3 replaying the engine's routes over
results and turns alike; then the same run from Python with the tools as functions (TRL's ``tools=[...]``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.test_example_chat_math import _run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tool_calling"


def test_tool_calling_example(tmp_path: Path) -> None:
    work = tmp_path / "tool_calling"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("model", "runs", "__pycache__"))
    _run(work, "build_model.py", "model")
    _run(work, "-m", "minirl", "sft", "config.yaml", "--output", "runs/tool_calling/sft", "cold_start.steps=300")
    out = _run(work, "-m", "minirl", "train", "config.yaml", "--start-from", "runs/tool_calling/sft",
               "optim.global_steps=3", "eval.every_steps=3", "eval.num_prompts=8", "log.completions_every_steps=1")
    assert "held-out accuracy" in out
    run_dir = work / "runs" / "tool_calling"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    first = rows[1]
    # the SFT taught the calling format: most responses call the calculator, and got its result back
    assert first["tools/call_frequency"] > 0.5 and 0.0 <= first["tools/failure_frequency"] <= 1.0
    assert first["reward/used_a_tool/mean"] > 0.05 and first["reward/errors"] == 0.0
    # the trainer scores every sampled token as the engine did (fp32 engine): the results in between are where
    # the template puts them, and they are not in the loss (their mu would be 0, log 1: a huge mismatch)
    assert abs(first["mismatch/kl_k1"]) < 1e-4 and first["mismatch/abs_dlogp_max"] < 1e-3
    assert first["routing/train_infer_diff_frac"] == pytest.approx(0.0, abs=0.02)  # R3's routes aligned
    assert rows[0]["eval/tool_call_frequency"] > 0.5  # evaluation calls the tools too
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert any("<tool_response>" in s["completion"] and "<tool_call>" in s["completion"] for s in samples)
    assert any(m["role"] == "tool" for s in samples for m in s["messages"])  # the trajectory, as messages
    # `minirl eval` of a checkpoint runs the tools as training's evaluation does
    evaluated = json.loads(_run(work, "-m", "minirl", "eval", "runs/tool_calling/sft", "--config", "config.yaml",
                                "eval.num_prompts=8").strip().splitlines()[-1])
    assert evaluated["eval/tool_call_frequency"] > 0.5
    # the calculator as an environment (TRL's environment_factory): one instance per rollout, its methods the tools,
    # its get_reward one more reward function named after the class
    _run(work, "-m", "minirl", "train", "config.yaml", "--start-from", "runs/tool_calling/sft", "run.name=env",
         "task.tools=[]", "task.environment=calculator_env:Calculator", "optim.global_steps=2", "eval.every_steps=0")
    rows = [json.loads(line) for line in (work / "runs" / "env" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["tools/call_frequency"] > 0.5 and 0.0 <= rows[1]["reward/Calculator/mean"] <= 1.0
    expected = rows[1]["reward/correct/mean"] + rows[1]["reward/used_a_tool/mean"] + rows[1]["reward/Calculator/mean"]
    assert rows[1]["train/reward_mean"] == pytest.approx(expected, abs=1e-5)
    # the calculator as verl's tools (verl's tool config and BaseTool methods, task.tool_config) on verl-layout rows:
    # each call created with its row's extra_info.tools_kwargs, the step rewards reaching a verl compute_score
    _run(work, "-m", "minirl", "train", "config.yaml", "--start-from", "runs/tool_calling/sft", "run.name=verl_tools",
         "task.tools=[]", "task.tool_config=tool_config.yaml", "task.path=data/train_verl.jsonl",
         "task.reward_functions=[{function: 'rewards:correct'}, {function: 'rewards:tool_reward'}]",
         "optim.global_steps=2", "eval.every_steps=0")
    rows = [json.loads(line) for line in (work / "runs" / "verl_tools" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["tools/call_frequency"] > 0.5 and rows[1]["reward/errors"] == 0.0
    assert rows[1]["reward/tool_reward/mean"] > 0.05  # some calls' results were their rows' answers (0.25 seen)
    # from Python, TRL's shape: the tools and the rewards as functions
    out = _run(work, "train_trl_style.py", "optim.global_steps=1", "eval.every_steps=0", "eval.num_prompts=4")
    assert "held-out accuracy" in out
    import yaml

    saved = yaml.safe_load((work / "runs" / "tool_calling_trl_style" / "config.yaml").read_text())["task"]
    assert saved["tools"] == ["calculator:add", "calculator:multiply"]
