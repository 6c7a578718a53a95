"""The worked example (examples/chat_math) end to end through the CLI, as the README walks it:
build a model directory (BPE tokenizer with a chat template), SFT on chat rows, RL with two
weighted reward functions from a module in the working directory (one batched, one reading an
extra column, math_verify on LaTeX), then reload the result with plain transformers and generate
with the chat template. The default run is the example with fewer steps; ``-m slow`` runs it whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "chat_math"


def _run(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def _example(tmp_path: Path, sft_steps: int | None, rl_steps: int | None) -> Path:
    work = tmp_path / "chat_math"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("model", "runs", "__pycache__"))
    _run(work, "build_model.py", "model")
    sft = ["-m", "minirl", "sft", "config.yaml", "--output", "runs/chat_math/sft"]
    _run(work, *sft, *([f"cold_start.steps={sft_steps}"] if sft_steps else []))
    train = ["-m", "minirl", "train", "config.yaml", "--start-from", "runs/chat_math/sft"]
    if rl_steps:
        train += [f"optim.global_steps={rl_steps}", "eval.every_steps=2", "log.completions_every_steps=2", "eval.num_prompts=8"]
    out = _run(work, *train)
    assert "done" in out and "held-out accuracy" in out
    return work


def _check(work: Path, steps: int) -> None:
    run_dir = work / "runs" / "chat_math"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(steps + 1))
    first = rows[1]
    # the SFT on chat rows taught the answer format: most first rollouts put an answer in \boxed{}
    assert first["reward/boxed_format/mean"] > 0.5
    assert 0.0 <= first["reward/correct/mean"] <= 1.0 and first["reward/errors"] == 0.0
    expected = 1.0 * first["reward/correct/mean"] + 0.2 * first["reward/boxed_format/mean"]
    assert first["train/reward_mean"] == pytest.approx(expected, abs=1e-5)  # the weighted sum
    assert "eval/reward_mean" in rows[-1] and "train/uniform_reward_groups_frac" in first
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and isinstance(samples[0]["prompt"], list) and "completion" in samples[0]
    # the result is a plain HF directory: transformers alone reloads it and chats with it
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "checkpoint")
    model = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoint")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=24, do_sample=False)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "\\boxed{" in reply, reply


def test_example_reduced(tmp_path: Path) -> None:
    work = _example(tmp_path, sft_steps=150, rl_steps=3)
    _check(work, steps=3)
    # the same run from Python, TRL's quickstart shape: a datasets.Dataset and the reward functions as objects
    out = _run(work, "train_trl_style.py", "optim.global_steps=2", "eval.every_steps=2", "eval.num_prompts=8")
    assert "held-out accuracy" in out
    run_dir = work / "runs" / "chat_math_trl_style"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[1]["reward/boxed_format/mean"] > 0.5
    import yaml

    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["task"]
    assert [f["function"] for f in saved["reward_functions"]] == ["rewards:correct", "rewards:boxed_format"]
    assert saved["reward_timeout_s"] == 10 and "_datasets" in saved["path"]  # importable: still in worker processes


@pytest.mark.slow
def test_example_as_shipped(tmp_path: Path) -> None:
    from minirl.config import load_config

    _check(_example(tmp_path, sft_steps=None, rl_steps=None), steps=load_config(EXAMPLE / "config.yaml").optim.global_steps)
