"""``optim.epochs_per_step`` (verl's ``ppo_epochs``, TRL's ``num_iterations``) through the outer loop on a tiny MoE:
E passes over the same N mini-batches against one pi_old, every route replayed once per pass."""

from __future__ import annotations

import pytest

import minirl.loop as loop
from tests.invariants.test_replay_loop import _run, _steps


@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_each_pass_replays_every_route_once(tmp_path, mode):
    replayed, updates = {}, {}
    for epochs in (1, 2):  # one global step: the same rollout (seeded) for both
        run = _run(tmp_path / str(epochs), f"moe.routing_replay={mode}", "optim.minibatches_per_step=2",
                   f"optim.epochs_per_step={epochs}")
        before = sum(run.replay.replayed_rows)
        metrics = _steps(run, 1)  # RoutePlan raises if a pass consumed a route twice or not at all
        replayed[epochs], updates[epochs] = sum(run.replay.replayed_rows) - before, run.trainer.updates_done
        assert metrics[0]["faults/skipped_updates"] == 0
        run.close()
    assert updates == {1: 2, 2: 4}  # N = 2 updates per pass
    # R routes: R2 replays them once per pass of updates; R3 also once in the pi_old pass
    passes = {1: 1, 2: 2} if mode == "R2" else {1: 2, 2: 3}
    assert replayed[1] > 0 and replayed[1] * passes[2] == replayed[2] * passes[1]


def test_the_second_epoch_is_off_policy_against_the_same_pi_old(tmp_path):
    on = _steps(_run(tmp_path / "e1", "optim.minibatches_per_step=1", "optim.lr=0.05"), 1)[0]
    assert on["policy/ratio_old_mean"] == 1.0  # N = E = 1: pi_old is pi_theta at the update
    twice = _run(tmp_path / "e2", "optim.minibatches_per_step=1", "optim.epochs_per_step=2", "optim.lr=0.05")
    seen = []
    update = twice.trainer.update

    def record(minibatch, objective, **kwargs):
        seen.append(minibatch.logp_old)  # both passes train against the logp_old of the pi_old pass
        return update(minibatch, objective, **kwargs)

    twice.trainer.update = record
    metrics = loop.global_step(twice, 1)
    assert len(seen) == 2 and seen[0] is not None and seen[0] is seen[1]
    assert metrics["policy/ratio_old_mean"] != 1.0  # the mean over both updates: the second moved away
