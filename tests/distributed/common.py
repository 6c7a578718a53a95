"""A tiny MoE run driven through ``minirl.loop`` in any placement, and its comparison."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import minirl.loop as loop
from minirl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
# fp32 everywhere (a bf16/fp8 engine would turn 1e-7 weight differences into different samples),
# lr 1e-3: Adam's first steps map rounding noise in near-zero gradients to updates of ~lr
TOL = 1e-5
STEPS = 3
TINY = [
    "model.preset=qwen3-moe-tiny", "task.kind=reverse", "task.difficulty=3", "task.num_train_prompts=32",
    "task.num_eval_prompts=4", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=8",
    "optim.micro_batch_sequences=3", "optim.warmup_updates=0", "optim.lr=1e-3", "cold_start.enabled=false",
    "log.console=false", "run.threads=1", "rollout.precision=fp32",
    "cluster.sample_seeding=per_sample",
]


class DenseRewards:
    """A reward source (``minirl.sources``): a random tiny model never solves the task, so reward a
    token statistic and the advantages are non-zero."""

    def score(self, prompts, completions):
        values = torch.tensor([sum(i % 3 == 0 for i in c.completion_ids) / len(c.completion_ids) for c in completions])
        return values, {}

    def close(self) -> None:
        pass


def run_steps(tmp_path: Path, *overrides: str, steps: int = STEPS, fuse_old_pass: bool = True,
              on_setup: Callable[[loop.Run], None] | None = None) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """``steps`` global steps; returns each step's metrics and the final weights (a copy).
    ``on_setup(run)`` may change the ``Run`` first (its seams)."""
    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, f"run.output_dir={tmp_path}", *overrides])
    run = loop.setup(cfg, rewards=DenseRewards())
    run.fuse_old_pass = fuse_old_pass
    if on_setup is not None:
        on_setup(run)
    try:
        metrics = [loop.global_step(run, step) for step in range(1, steps + 1)]
        weights = {name: tensor.detach().clone() for name, tensor in run.trainer.state_dict().items()}
    finally:
        run.close()
    return metrics, weights


def max_differences(reference: tuple[list[dict], dict], other: tuple[list[dict], dict]) -> tuple[float, float]:
    """(max |loss difference| over steps, max |weight difference| over tensors)."""
    (metrics_a, weights_a), (metrics_b, weights_b) = reference, other
    assert len(metrics_a) == len(metrics_b) and set(weights_a) == set(weights_b)
    loss = max(abs(a["policy/loss"] - b["policy/loss"]) for a, b in zip(metrics_a, metrics_b))
    weight = max(float((weights_a[k] - weights_b[k]).abs().max()) for k in weights_a)
    return loss, weight


def assert_same_update_metrics(single: dict, sharded: dict) -> None:
    """The objective's metrics of the ranks' updates are the single process's, not the mean of each shard's."""
    keys = [k for k in single if k.startswith(("policy/", "routing/r2_drift")) and k != "policy/loss"]  # loss: TOL
    assert keys and set(keys) <= set(sharded)
    for key in keys:
        assert sharded[key] == pytest.approx(single[key], rel=1e-5, abs=1e-7), (key, single[key], sharded[key])
