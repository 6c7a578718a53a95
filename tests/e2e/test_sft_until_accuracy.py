"""Cold start to a held-out accuracy target (``cold_start.until_accuracy``): evaluate every k SFT steps as RL
does, stop at the first evaluation at or above the target, or warn after the step cap."""

from __future__ import annotations

import json

import pytest

from minirl.config import ConfigError, load_config
from minirl.sft import SUMMARY, run_sft, sft_cache_key
from minirl.sft_target import AccuracyTarget
from tests.e2e.test_cli import ROOT, TINY

EASY = ["task.difficulty=2", "cold_start.warmup_steps=2", "cold_start.examples=64", "eval.num_prompts=8",
        "eval.samples_per_prompt=2"]


def test_accuracy_target_asks_every_k_steps_and_stops_at_the_first_hit():
    asked: list[int] = []
    accuracies = {3: 0.2, 6: 0.79, 9: 0.8, 12: 0.95}
    rule = AccuracyTarget(0.8, 3, lambda step: asked.append(step) or accuracies[step])
    assert [step for step in range(1, 13) if rule.reached(step)][:1] == [9]
    assert asked[:3] == [3, 6, 9] and rule.history[:3] == [(3, 0.2), (6, 0.79), (9, 0.8)]
    assert AccuracyTarget(0.5, 2, lambda step: 0.0).summary()["accuracy_reached"] is False


def _sft(tmp_path, name, *overrides):
    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, *EASY, f"run.output_dir={tmp_path}", *overrides])
    lines: list[str] = []
    out = run_sft(cfg, tmp_path / name, log=lines.append)
    return json.loads((out / SUMMARY).read_text()), lines, cfg


def test_sft_stops_at_the_held_out_accuracy_target_on_a_tiny_model(tmp_path):
    # unreachable target: every 20th step is evaluated up to the cap, with a warning
    capped, lines, cfg = _sft(tmp_path, "capped", "cold_start.steps=100", "cold_start.until_accuracy=1.0",
                              "cold_start.accuracy_every_steps=20")
    history = capped["accuracy_history"]
    assert [step for step, _ in history] == [20, 40, 60, 80, 100] and capped["steps"] == 100
    assert capped["accuracy_reached"] is False and any("accuracy still below" in line for line in lines)
    # a target the run reaches: the same (seeded) SFT stops at the first evaluation at or above it
    hit = max(acc for _, acc in history[:-1])
    assert hit > 0, history  # the tiny model learns something in 80 steps at difficulty 2
    first = next(step for step, acc in history if acc >= hit)
    stopped, lines, target_cfg = _sft(tmp_path, "stopped", "cold_start.steps=100", f"cold_start.until_accuracy={hit}",
                                      "cold_start.accuracy_every_steps=20")
    assert stopped["steps"] == first and stopped["accuracy_reached"] is True
    assert stopped["accuracy_history"] == [h for h in history if h[0] <= first]
    assert any(f"after {first} steps" in line for line in lines)
    # the rule and the evaluation it uses are part of the SFT cache key; without the rule the key is the old one
    plain = load_config(ROOT / "configs/demo.yaml", [*TINY, *EASY, "cold_start.steps=100"])
    assert len({sft_cache_key(cfg), sft_cache_key(target_cfg), sft_cache_key(plain)}) == 3
    # with the rule, the evaluation it stops on is part of the key; without it, it is not
    more_eval = ["eval.num_prompts=4", "rollout.precision=fp8_e4m3"]
    assert sft_cache_key(target_cfg.model_copy(update={})) != sft_cache_key(
        load_config(ROOT / "configs/demo.yaml", [*TINY, *EASY, f"run.output_dir={tmp_path}", "cold_start.steps=100",
                                                 f"cold_start.until_accuracy={hit}", "cold_start.accuracy_every_steps=20",
                                                 *more_eval]))
    assert sft_cache_key(plain) == sft_cache_key(
        load_config(ROOT / "configs/demo.yaml", [*TINY, *EASY, "cold_start.steps=100", *more_eval]))


def test_until_accuracy_and_until_loss_together_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="set one stopping rule, not both"):
        _sft(tmp_path, "both", "cold_start.steps=2", "cold_start.until_accuracy=0.5", "cold_start.until_loss=0.1")
