"""A 2-rank FSDP2 trainer group (gloo, spawned processes) against the single-process trainer.

Same seed, same config: 3 global steps of MiniRL with R3 (the engine's routes replayed in the
old-log-prob pass and in both mini-batch updates) give the same losses and final weights within
1e-5 (fp32), though each rank sees half of every mini-batch in other micro-batches.
"""

from __future__ import annotations

import pytest

import minirl.loop as loop
from minirl.config import ConfigError, load_config

from .common import ROOT, TINY, TOL, dense_rewards, max_differences, run_steps

MODE = ["moe.routing_replay=R3", "optim.minibatches_per_step=2"]


@pytest.fixture(autouse=True)
def _rewards(monkeypatch):
    monkeypatch.setattr(loop, "score_completions", dense_rewards)


def test_two_fsdp_ranks_match_one_process_with_r3(tmp_path):
    single = run_steps(tmp_path / "single", *MODE)
    sharded = run_steps(tmp_path / "fsdp", *MODE, "cluster.trainer_ranks=2")
    loss_diff, weight_diff = max_differences(single, sharded)
    print(f"fsdp W=2 vs single: max |d loss| {loss_diff:.3g}, max |d weight| {weight_diff:.3g}")
    assert loss_diff < TOL and weight_diff < TOL
    for a, b in zip(*(m for m, _ in (single, sharded))):
        assert abs(a["mismatch/kl_k1"] - b["mismatch/kl_k1"]) < TOL  # logp_old gathered in row order
        assert a["optim/grad_norm"] == pytest.approx(b["optim/grad_norm"], rel=1e-5)  # the global norm


def test_ranks_must_divide_the_minibatch():
    with pytest.raises(ConfigError, match="cluster.trainer_ranks: must divide the mini-batch of 4 sequences"):
        load_config(ROOT / "configs/demo.yaml", [*TINY, *MODE, "cluster.trainer_ranks=3"])
