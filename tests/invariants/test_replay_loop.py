"""Routing replay through the outer loop (``minirl.loop.setup`` + ``global_step``) on a tiny MoE.

R2 at N = 1 is a no-op (bitwise), R2's drift is 0 on the first mini-batch and not later, an fp32
engine routes exactly as the trainer, and every recorded route is consumed, with clear errors when
the routes do not fit the model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import minirl.loop as loop
from minirl.config import load_config
from minirl.trainer import UpdateResult
from tests.distributed.common import DenseRewards

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "model.preset=qwen3-moe-tiny", "task.kind=reverse", "task.difficulty=3", "task.num_train_prompts=32",
    "task.num_eval_prompts=4", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=8",
    "optim.micro_batch_sequences=3", "optim.warmup_updates=0", "optim.lr=1e-2", "cold_start.enabled=false",
    "log.console=false", "run.threads=1", "rollout.precision=bf16",
]


def _run(tmp_path, *overrides: str) -> loop.Run:
    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, f"run.output_dir={tmp_path}", *overrides])
    return loop.setup(cfg, rewards=DenseRewards())


class _LosesLastMinibatch:
    """A trainer (the ``Run.trainer`` seam) that silently drops the last update of every step."""

    def __init__(self, trainer, updates_per_step: int) -> None:
        self.trainer, self.every, self.calls = trainer, updates_per_step, 0

    def update(self, minibatch, objective, **kwargs):
        self.calls += 1
        return UpdateResult() if self.calls % self.every == 0 else self.trainer.update(minibatch, objective, **kwargs)

    def __getattr__(self, name):
        return getattr(self.trainer, name)


def _steps(run: loop.Run, steps: int) -> list[dict]:
    return [loop.global_step(run, step) for step in range(1, steps + 1)]


def test_r2_with_one_minibatch_is_bitwise_no_replay(tmp_path):
    runs = {mode: _run(tmp_path, f"moe.routing_replay={mode}", "optim.minibatches_per_step=1") for mode in ("none", "R2")}
    initial = {k: v.clone() for k, v in runs["none"].model.state_dict().items()}
    metrics = {mode: _steps(run, 3) for mode, run in runs.items()}
    final = {mode: run.model.state_dict() for mode, run in runs.items()}
    assert any(not torch.equal(initial[k], final["none"][k]) for k in initial)  # the updates did something
    assert all(torch.equal(final["none"][k], final["R2"][k]) for k in initial)
    assert sum(runs["R2"].replay.replayed_rows) > 0 and sum(runs["none"].replay.replayed_rows) == 0
    for a, b in zip(metrics["none"], metrics["R2"]):
        assert a["policy/loss"] == b["policy/loss"] and a["mismatch/kl_k1"] == b["mismatch/kl_k1"]
        assert b["routing/r2_drift_mb0"] == 0.0


def test_r2_drift_is_zero_on_the_first_minibatch_and_positive_after_a_large_update(tmp_path):
    # one micro-batch for the whole global batch: the old-log-prob pass and the updates see other shapes
    run = _run(tmp_path, "moe.routing_replay=R2", "optim.minibatches_per_step=2", "optim.lr=0.1",
               "optim.micro_batch_sequences=64")
    for metrics in _steps(run, 2):
        assert metrics["routing/r2_drift_mb0"] == 0.0
        assert metrics["routing/r2_drift_mb1"] > 0.05
        assert metrics["routing/r2_drift_last"] == metrics["routing/r2_drift_mb1"]
        assert "policy/routing_natural_diff_frac" not in metrics


@pytest.mark.parametrize("mode", ["R3", "none"])
def test_fp32_engine_routes_exactly_as_the_trainer(tmp_path, mode):
    run = _run(tmp_path, f"moe.routing_replay={mode}", "rollout.precision=fp32", "optim.minibatches_per_step=2")
    before = list(run.replay.replayed_rows)
    metrics = _steps(run, 2)
    layers = run.replay.num_layers
    for m in metrics:
        assert m["routing/train_infer_diff_frac"] == 0.0 and m["routing/train_infer_diff_any_layer_frac"] == 0.0
        assert all(m[f"routing/train_infer_diff_frac_layer{i}"] == 0.0 for i in range(layers))
        assert m["mismatch/abs_dlogp_max"] < 1e-4
        assert not any(key.startswith("routing/r2_") for key in m)
    replayed = sum(run.replay.replayed_rows) - sum(before)
    assert (replayed > 0) == (mode == "R3")


def test_low_precision_engine_is_seen_by_the_routing_metrics(tmp_path):
    run = _run(tmp_path, "moe.routing_replay=R3", "rollout.precision=fp8_e4m3", "rollout.fp8_scale=per_expert",
               "optim.minibatches_per_step=2")
    m = _steps(run, 1)[0]
    assert 0.0 < m["routing/train_infer_diff_frac"] <= m["routing/train_infer_diff_any_layer_frac"] < 1.0


class _Rollouts:
    """A rollout source (the ``Run.rollouts`` seam) wrapping the run's own: notes what the step asked
    for and lets a test change the rollouts."""

    def __init__(self, source, change=None) -> None:
        self.source, self.change, self.asked = source, change, []

    def rollouts(self, step, prompts, n, sampling, *, record_routes):
        self.asked.append(record_routes)
        completions = self.source.rollouts(step, prompts, n, sampling, record_routes=record_routes)
        for c in completions if self.change else ():
            c.routes = self.change(c.routes)
        return completions


def test_routing_metrics_off_records_nothing_it_does_not_need(tmp_path):
    run = _run(tmp_path, "moe.routing_replay=R2", "moe.routing_metrics=false", "optim.minibatches_per_step=2")
    run.rollouts = source = _Rollouts(run.rollouts)
    asked = source.asked
    m = _steps(run, 1)[0]
    assert asked == [False] and not any(key.startswith("routing/") for key in m)
    assert sum(run.replay.replayed_rows) > 0  # R2 still replays


def _corrupt_engine(run: loop.Run, corrupt) -> None:
    run.rollouts = _Rollouts(run.rollouts, corrupt)


@pytest.mark.parametrize("mode", ["R3", "none"])
def test_engine_routes_that_do_not_fit_the_model_name_the_layer(tmp_path, mode):
    run = _run(tmp_path, f"moe.routing_replay={mode}")
    _corrupt_engine(run, lambda r: r[:, :1])
    with pytest.raises(ValueError, match=r"MoE layer 1 \(model\.layers\.1\.mlp\.gate\) has no routes"):
        loop.global_step(run, 1)
    run = _run(tmp_path, f"moe.routing_replay={mode}")
    _corrupt_engine(run, lambda r: torch.where(r >= 0, r + 3, r))
    with pytest.raises(ValueError, match=r"must lie in \[-1, 4\).*of MoE layer \d \(model\.layers\.\d\.mlp\.gate\)"):
        loop.global_step(run, 1)


@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_a_lost_minibatch_leaves_routes_unconsumed_and_fails_the_step(tmp_path, mode):
    run = _run(tmp_path, f"moe.routing_replay={mode}", "optim.minibatches_per_step=2")
    run.trainer = _LosesLastMinibatch(run.trainer, 2)
    with pytest.raises(RuntimeError, match=r"\(updates\): MoE layer 0 \(model\.layers\.0\.mlp\.gate\) replayed \d+ of the \d+"):
        loop.global_step(run, 1)


def test_a_run_built_without_a_rollout_source_samples_from_its_engine(tmp_path):
    """``Run.rollouts=None`` is documented as "the engine samples": a Run made by hand (or replaced with
    ``rollouts=None``) must step exactly like the one ``setup`` made, not fail on ``None.rollouts``."""
    import dataclasses

    by_hand = dataclasses.replace(_run(tmp_path), rollouts=None)
    assert isinstance(by_hand.rollouts, loop.EngineRollouts) and by_hand.rollouts.engine is by_hand.engine
    assert math.isfinite(loop.global_step(by_hand, 1)["policy/loss"])
