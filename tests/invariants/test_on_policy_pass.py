"""N = 1: pi_old taken from the update's own forward (no separate old-log-prob pass) changes nothing.

The fused step and the step with its own ``Trainer.score`` pass must give bitwise-identical
weights and identical metrics (log-probs, entropy, mismatch, routing agreement, loss), for
MiniRL and GRPO, with and without R3 and with an fp8 engine (a real train-infer mismatch).
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.common import run_steps

TIMING = ("time/", "perf/")


@pytest.mark.parametrize("overrides", [
    ("moe.routing_replay=none",),
    ("moe.routing_replay=R3",),
    ("moe.routing_replay=R3", "rollout.precision=fp8_e4m3", "algo={name: grpo, is_correction: true}"),
    ("moe.routing_replay=none", "rollout.precision=fp8_e4m3", "algo.tis_cap=1.1", "algo.aggregation=token_mean", "optim.micro_batch_sequences=8"),
])
def test_fused_old_pass_is_bitwise_the_separate_pass(tmp_path, overrides):
    settings = ("optim.minibatches_per_step=1", "moe.routing_metrics=true", *overrides)
    passes = {"fused": 0, "separate": 0}

    def counting(name):
        def on_setup(run):
            score = run.trainer.score

            def counted(*args, **kwargs):
                passes[name] += 1
                return score(*args, **kwargs)

            run.trainer.score = counted
        return on_setup

    fused = run_steps(tmp_path / "fused", *settings, on_setup=counting("fused"))
    separate = run_steps(tmp_path / "separate", *settings, fuse_old_pass=False, on_setup=counting("separate"))
    assert passes == {"fused": 0, "separate": len(separate[0])}  # the fused steps ran no pi_old pass of their own
    for a, b in zip(fused[0], separate[0]):
        kept = {k: v for k, v in b.items() if not k.startswith(TIMING)}
        assert {k: a[k] for k in kept} == kept
    for name, tensor in separate[1].items():
        assert torch.equal(fused[1][name], tensor), name
