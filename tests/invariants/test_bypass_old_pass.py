"""``algo.logp_old_source: rollout`` (verl's bypass mode): the updates take ``logp_old = logp_rollout`` and no
old-log-prob pass runs; the monitor's pi_old is the first update's forward at theta_old, on its mini-batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minirl.config import ConfigError, load_config
from minirl.monitor.mismatch import mismatch_metrics
from tests.distributed.common import run_steps

ENGINE = ("moe.routing_metrics=true", "rollout.precision=fp8_e4m3")  # a real training–inference gap
MONITOR = ("train/entropy", "mismatch/", "routing/train_infer_")


def counting(calls: dict[str, list], name: str, substitute: bool = False):
    """An ``on_setup`` that counts ``trainer.score`` calls (keeping each batch and result) and, with ``substitute``,
    hands every update ``logp_old = logp_rollout`` itself."""
    def on_setup(run):
        score, update = run.trainer.score, run.trainer.update

        def counted(batch, **kwargs):
            result = score(batch, **kwargs)
            calls[name].append((batch, result))
            return result

        def substituted(minibatch, objective, **kwargs):
            return update(minibatch.with_logp_old(minibatch.logp_rollout), objective, **kwargs)

        run.trainer.score = counted
        if substitute:
            run.trainer.update = substituted
    return on_setup


@pytest.mark.parametrize("replay", ["none", "R3"])
def test_the_updates_train_on_mu_as_pi_old_without_a_pass(tmp_path, replay):
    settings = (*ENGINE, f"moe.routing_replay={replay}", "optim.minibatches_per_step=2")
    calls: dict[str, list] = {"bypass": [], "by_hand": []}
    bypass = run_steps(tmp_path / "a", *settings, "algo.logp_old_source=rollout", on_setup=counting(calls, "bypass"))
    by_hand = run_steps(tmp_path / "b", *settings, on_setup=counting(calls, "by_hand", substitute=True))
    assert len(calls["bypass"]) == 0 and len(calls["by_hand"]) == len(by_hand[0])  # no pi_old pass of its own
    for name, tensor in by_hand[1].items():
        assert torch.equal(bypass[1][name], tensor), name
    for a, b in zip(bypass[0], by_hand[0]):
        policy = {k: v for k, v in b.items() if k.startswith(("policy/", "optim/", "train/reward"))}
        assert {k: a[k] for k in policy} == policy
        assert a["time/old_logprobs_s"] < 0.01
    # the monitor's pi_old: the first update's forward at theta_old on the first mini-batch (step 1: same weights)
    batch, old = calls["by_hand"][0]
    half = slice(0, batch.size // 2)
    expected = mismatch_metrics(batch.logp_rollout[half], old.logp[half], batch.mask[half])
    assert expected["kl_k3"] > 0
    for key, value in expected.items():  # the update's micro-batches vs one score pass: float rounding apart
        assert bypass[0][0][f"mismatch/{key}"] == pytest.approx(float(value), rel=0, abs=1e-7), key


def test_at_one_update_the_monitor_is_the_fused_pass(tmp_path):
    """N = 1: the first mini-batch is the batch, so the monitor sees what the fused pi_old pass sees."""
    settings = (*ENGINE, "moe.routing_replay=R3", "optim.minibatches_per_step=1")
    bypass = run_steps(tmp_path / "a", *settings, "algo.logp_old_source=rollout", steps=1)
    fused = run_steps(tmp_path / "b", *settings, steps=1)
    monitored = {k: v for k, v in fused[0][0].items() if k.startswith(MONITOR)}
    assert len(monitored) >= 6 and monitored["mismatch/kl_k3"] > 0
    assert {k: bypass[0][0][k] for k in monitored} == monitored
    # the clip mask's ratio is pi_theta/mu_old, not pi_theta/pi_old (1 in a fused on-policy update)
    assert fused[0][0]["policy/ratio_old_mean"] == 1.0 != bypass[0][0]["policy/ratio_old_mean"]


def test_a_skipped_first_update_is_scored_on_the_unchanged_weights(tmp_path):
    def skip_first(run):
        update, seen = run.trainer.update, []

        def patched(minibatch, objective, **kwargs):
            seen.append(minibatch)
            if len(seen) == 1:  # a non-finite input: the trainer skips the update (no scores from its forward)
                minibatch = dataclasses.replace(minibatch, advantages=torch.full_like(minibatch.advantages, float("nan")))
            return update(minibatch, objective, **kwargs)
        run.trainer.update = patched

    settings = (*ENGINE, "moe.routing_replay=R3", "optim.minibatches_per_step=2", "algo.logp_old_source=rollout")
    skipped = run_steps(tmp_path / "a", *settings, steps=1, on_setup=skip_first)[0][0]
    normal = run_steps(tmp_path / "b", *settings, steps=1)[0][0]
    assert skipped["faults/skipped_updates"] == 1 and normal["faults/skipped_updates"] == 0
    monitored = {k: v for k, v in normal.items() if k.startswith(MONITOR)}
    assert {k: skipped[k] for k in monitored} == pytest.approx(monitored, rel=0, abs=1e-7)


def test_the_rejection_bounds_each_updates_pi_theta(tmp_path):
    """With logp_old = mu_old, algo.reject acts in each update's loss on pi_theta/mu_old (verl's bypass mode): bounds
    that leave no token train nothing at all (Adam moves no weight on a zero gradient); looser ones some."""
    initial: dict[str, torch.Tensor] = {}

    def remember(run):
        initial.update({k: v.detach().clone() for k, v in run.trainer.state_dict().items()})

    settings = (*ENGINE, "moe.routing_replay=R3", "optim.minibatches_per_step=2", "algo.logp_old_source=rollout",
                "algo.reject=token_k1", "optim.weight_decay=0.0")
    metrics, weights = run_steps(tmp_path / "none", *settings, "algo.reject_low=0.9999999", "algo.reject_high=1.0000001",
                                 steps=1, on_setup=remember)
    assert metrics[0]["policy/rejected_token_frac"] == 1.0 and not any(k.startswith("mismatch/rejected") for k in metrics[0])
    assert all(torch.equal(initial[k], v) for k, v in weights.items())
    some = run_steps(tmp_path / "some", *settings, "algo.reject_low=0.97", "algo.reject_high=1.03", steps=1)[0][0]
    assert 0 < some["policy/rejected_token_frac"] < 1


def test_what_bypassing_the_pass_cannot_do_is_one_line():
    with pytest.raises(ConfigError, match="R2 records the trainer's routes in the old-log-prob pass"):
        load_config(None, ["algo.logp_old_source=rollout", "moe.routing_replay=R2"])
    with pytest.raises(ConfigError, match="logp_old_source"):
        load_config(None, ["algo.logp_old_source=engine"])
