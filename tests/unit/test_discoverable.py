"""A CLI a person can discover, and honest metrics: config docs, did-you-mean, --version,
python -m minirl, plain per-step lines, the 80-column progress line, accuracy threshold, groups."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from minirl.cli import main
from minirl.config import ConfigError, load_config
from minirl.metrics import (
    CONSOLE_KEYS,
    MetricsLogger,
    plain_line,
    progress_line,
    reset_samples,
    sample_rows,
)
from minirl.monitor import rollout_metrics
from minirl.types import Completion, Prompt

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_version_and_python_dash_m() -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-m", "minirl", "--version"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith("minirl ") and out.stdout.split()[1][0].isdigit()


def test_config_defaults_and_show_print_every_key_with_its_doc(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["config", "defaults"]) == 0
    lines = capsys.readouterr().out.splitlines()
    keys = {line.split(" = ")[0] for line in lines}
    assert {"optim.lr", "task.reward_functions", "eval.accuracy_threshold", "cold_start.data", "log.plain"} <= keys
    assert all("  # " in line for line in lines), [line for line in lines if "  # " not in line][:3]  # every key documented
    config = tmp_path / "c.yaml"
    config.write_text("optim:\n  lr: 0.5\n")
    assert main(["config", "show", str(config), "rollout.top_p=0.9"]) == 0
    out = capsys.readouterr().out
    assert "optim.lr = 0.5  " in out and "rollout.top_p = 0.9  " in out


@pytest.mark.parametrize("override, message", [
    ("rollout.tempreature=0.5", "rollout.tempreature: unknown key (did you mean 'temperature'?)"),
    ("optim.lrr=1", "optim.lrr: unknown key (did you mean 'lr'?)"),
    ("algo.eps_hihg=1", "algo.eps_hihg: not a knob of algo.name=minirl (did you mean 'eps_high'?)"),
    ("task.zzz=1", "task.zzz: unknown key"),
])
def test_unknown_keys_get_did_you_mean(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    assert str(error.value) == message


def test_plain_lines_when_not_a_terminal_and_the_progress_line_at_80_columns(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path / "plain", total_steps=10)  # under pytest stderr is not a terminal
    buffer = io.StringIO()
    logger.console = Console(file=buffer, width=80)
    logger.log(1, {"train/reward_mean": 0.25, "time/step_s": 1.0})
    logger.log(2, {"train/reward_mean": 0.5})
    logger.close()
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "step 1/10  eta --:--  reward 0.250  s/step 1.00"
    assert lines[1].startswith("step 2/10  eta 00:00:0") and lines[1].endswith("reward 0.500  s/step 1.00")
    assert plain_line(3, 10, ["x 1"], 3725.0) == "step 3/10  eta 01:02:05  x 1"
    # a terminal 80 columns wide: step and ETA stay visible however long the metrics
    terminal = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    logger = MetricsLogger(tmp_path / "tty", total_steps=100, plain=True)
    logger.console, logger._plain, logger._progress = terminal, False, progress_line(terminal)
    logger._task = logger._progress.add_task("", total=100)
    metrics = {key: 0.123 for key, _, _ in CONSOLE_KEYS}
    logger.log(37, metrics)
    with terminal.capture() as capture:
        terminal.print(logger._progress.get_renderable())
    line = capture.get().splitlines()[0]
    assert line.startswith("RL  37/100 eta") and "reward 0.123" in line and len(line) <= 80, line
    logger.close()


def test_accuracy_threshold_and_the_group_split() -> None:
    completions = [Completion(0, 0, [1], [2, 3], torch.zeros(2), "eos")] * 6
    rewards_PG = torch.tensor([[3.0, 3.0], [0.0, 0.0], [0.5, 2.0]])
    metrics = rollout_metrics(completions, rewards_PG, threshold=2.5)
    assert metrics["train/accuracy"] == pytest.approx(2 / 6, rel=1e-6)  # 3.0 and 3.0 reach 2.5
    assert metrics["train/uniform_reward_groups_frac"] == pytest.approx(2 / 3, rel=1e-6)  # groups 0, 1: no advantage
    assert metrics["train/all_correct_groups_frac"] == pytest.approx(1 / 3, rel=1e-6)
    assert metrics["train/all_wrong_groups_frac"] == pytest.approx(2 / 3, rel=1e-6)  # groups 1 and 2
    assert "train/solved_groups_frac" not in metrics
    assert rollout_metrics(completions, rewards_PG)["train/accuracy"] == 3 / 6  # default threshold 1: 3, 3, 2


def test_samples_are_logged_and_cut_back_on_resume(tmp_path: Path) -> None:
    prompts = [Prompt(text="q", answer="a", messages=[{"role": "user", "content": "q"}])]
    completions = [Completion(0, i, [1], [2], torch.zeros(1), "eos", text=f"c{i}") for i in range(3)]
    rows = sample_rows(prompts, completions, torch.tensor([1.0, 0.0, 0.5]), count=2)
    assert rows == [{"prompt": [{"role": "user", "content": "q"}], "completion": "c0", "reward": 1.0},
                    {"prompt": [{"role": "user", "content": "q"}], "completion": "c1", "reward": 0.0}]
    logger = MetricsLogger(tmp_path, total_steps=3, console=False)
    logger.log_samples(1, rows)
    logger.log_samples(2, rows[:1])
    logger.close()
    read = lambda: [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]  # noqa: E731
    assert [r["step"] for r in read()] == [1, 1, 2]
    reset_samples(tmp_path, 1)
    assert [r["step"] for r in read()] == [1, 1]
