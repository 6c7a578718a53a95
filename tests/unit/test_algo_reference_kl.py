"""The KL penalty to a reference policy (``minirl.algo.variants.reference_kl``): hand-computed k1/k2/k3,
their gradients, verl's clamps; and in the loop, the reference is the starting policy."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo.variants.reference_kl import kl_estimate, reference_kl_loss

LOGP = [-1.0, -2.0, -0.5]
LOGP_REF = [-1.5, -1.0, -0.5]  # r = logp_ref - logp = [-0.5, 1.0, 0.0]
MASK = [True, True, False]


def test_estimators_by_hand():
    logp, ref = torch.tensor(LOGP), torch.tensor(LOGP_REF)
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([0.5, -1.0, 0.0]), rtol=0, atol=1e-7)
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([0.125, 0.5, 0.0]), rtol=0, atol=1e-7)
    k3 = [math.exp(-0.5) + 0.5 - 1, math.e - 2, 0.0]  # 0.1065307, 0.7182818, 0
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), torch.tensor(k3), rtol=0, atol=1e-7)
    # verl's clamps: r clamped to [-20, 20], k3 to [-10, 10]
    assert float(kl_estimate(torch.tensor([-40.0]), torch.tensor([-5.0]), "k3")) == 10.0
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        kl_estimate(logp, ref, "k4")  # type: ignore[arg-type]


def test_loss_is_the_coefficient_times_the_token_mean_and_its_gradient():
    logp = torch.tensor(LOGP, requires_grad=True)
    loss, metrics = reference_kl_loss(logp, torch.tensor(LOGP_REF), torch.tensor(MASK), kl_coef=0.1, kind="k3", normalizer=2.0)
    assert loss.item() == pytest.approx(0.1 * (0.10653066 + 0.71828183) / 2, abs=1e-7)  # 0.04124062
    assert float(metrics["kl_ref"]) == pytest.approx((0.10653066 + 0.71828183) / 2, abs=1e-7)
    loss.backward()
    # d k3 / d logp = 1 - exp(r): t0 1 - e^-0.5 = 0.3934693, t1 1 - e = -1.7182818; masked t2: 0
    torch.testing.assert_close(logp.grad, torch.tensor([0.05 * 0.3934693, 0.05 * -1.7182818, 0.0]), rtol=0, atol=1e-7)
    k1, _ = reference_kl_loss(torch.tensor(LOGP), torch.tensor(LOGP_REF), torch.tensor(MASK), kl_coef=1.0, kind="k1", normalizer=4.0)
    assert float(k1) == pytest.approx((0.5 - 1.0) / 4, abs=1e-7)


def test_the_unbiased_kl_weighs_each_estimate_by_the_ratio_with_its_gradient():
    """``algo.kl_loss_unbiased`` (slime's --use-unbiased-kl): rho k2 with rho = pi_theta/pi_old. logp_old = logp - 0.5 on
    token 0 (rho = e^0.5), = logp on token 1 (rho = 1): loss = (e^0.5 x 0.125 + 0.5) / 2; d(rho k2)/d logp = rho k2 -
    rho r (k2' = -r): token 0 e^0.5 (0.125 + 0.5), token 1 (0.5 - 1.0). Through the objective it needs pi_old."""
    from minirl.reference import ReferenceKL
    from tests.unit.test_trainer_precision import batch_of

    logp = torch.tensor(LOGP, requires_grad=True)
    old = torch.tensor([LOGP[0] - 0.5, LOGP[1], 0.0])
    loss, metrics = reference_kl_loss(logp, torch.tensor(LOGP_REF), torch.tensor(MASK), kl_coef=1.0, kind="k2",
                                      normalizer=2.0, logp_old=old)
    rho = math.exp(0.5)
    assert loss.item() == pytest.approx((rho * 0.125 + 0.5) / 2, abs=1e-7)
    assert float(metrics["kl_ref"]) == pytest.approx(loss.item(), abs=1e-7)  # the weighed estimate's token mean
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([rho * 0.625 / 2, -0.5 / 2, 0.0]), rtol=0, atol=1e-7)
    batch = batch_of(4)
    batch = batch.with_logp_ref(torch.zeros_like(batch.logp_rollout)).with_logp_old(batch.logp_rollout - 0.3 * batch.mask)

    def policy(lp, micro, **given):
        return lp.sum() * 0.0, {}

    logp = (batch.logp_rollout * batch.mask).requires_grad_(True)
    plain, _ = ReferenceKL(policy, 1.0, "k1", 1.0)(logp, batch)
    unbiased, _ = ReferenceKL(policy, 1.0, "k1", 1.0, unbiased=True)(logp, batch)
    assert float(unbiased) == pytest.approx(math.exp(0.3) * float(plain), rel=1e-6)
    with pytest.raises(ValueError, match="kl_loss_unbiased needs pi_old"):
        ReferenceKL(policy, 1.0, "k1", 1.0, unbiased=True)(logp, batch.with_logp_old(None))  # type: ignore[arg-type]


def test_a_nan_at_a_trained_token_fails_loudly():
    with pytest.raises(FloatingPointError, match="reference KL"):
        reference_kl_loss(torch.tensor([float("nan"), -1.0]), torch.tensor([-1.0, -1.0]), torch.tensor([True, True]),
                          kl_coef=0.1, normalizer=2.0)
    loss, _ = reference_kl_loss(torch.tensor([float("nan"), -1.0]), torch.tensor([-1.0, -1.0]), torch.tensor([False, True]),
                                kl_coef=0.1, normalizer=1.0)
    assert float(loss) == 0.0  # a masked NaN (padding) does not count


@pytest.mark.parametrize("lora", [False, True])
def test_the_reference_is_the_starting_policy_in_the_loop(tmp_path, lora):
    """At step 1 the policy is the reference (a frozen copy; with LoRA, the base with B = 0), so
    ``policy/kl_ref`` is 0; after an update it is positive, and the R3 routes were replayed exactly."""
    from tests.distributed.common import run_steps  # dense rewards: non-zero advantages, the policy moves
    extra = ["model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}"] if lora else []
    metrics, _ = run_steps(tmp_path, "algo.kl_coef=0.5", "moe.routing_replay=R3", "optim.lr=3e-2", *extra, steps=2)
    assert metrics[0]["policy/kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert metrics[1]["policy/kl_ref"] > 1e-6


def test_a_reference_sync_is_trls_soft_update():
    """pi_ref <- alpha pi_theta + (1 - alpha) pi_ref, written as TRL's ``SyncRefModelCallback._sync_target_model``."""
    from minirl.reference import Reference
    from minirl.trainer import Trainer
    from tests.conftest import make_tiny_moe

    model = make_tiny_moe()
    reference = Reference(Trainer(model, lr=1e-2))
    start = {name: p.detach().clone() for name, p in reference.frozen.model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    reference.sync(0.6)
    for (name, ref), policy in zip(reference.frozen.model.named_parameters(), model.parameters()):
        assert torch.equal(ref, start[name].clone().mul_(1.0 - 0.6).add_(policy, alpha=0.6)), name  # TRL's two ops
        torch.testing.assert_close(ref, start[name] + 0.6, rtol=0, atol=1e-6)  # by hand: 0.4 r + 0.6 (r + 1)
        torch.testing.assert_close(policy, start[name] + 1.0, rtol=0, atol=0)  # the policy is not touched


def test_the_reference_syncs_every_k_optimizer_steps_in_the_loop(tmp_path):
    """Every 3 updates with N = 2 updates per global step: after updates 3 and 6. With alpha 1 and a sync after
    every update the reference is the policy at each step's start, so ``policy/kl_ref`` stays 0 (without it,
    step 2's is positive: the test above)."""
    from tests.distributed.common import run_steps

    calls = []

    def count_syncs(run):
        sync = run.reference.sync
        run.reference.sync = lambda alpha: (calls.append((run.trainer.updates_done, alpha)), sync(alpha))

    run_steps(tmp_path / "a", "algo.kl_coef=0.5", "optim.minibatches_per_step=2", "algo.ref_sync_every_updates=3",
              "algo.ref_sync_alpha=0.25", steps=3, on_setup=count_syncs)
    assert calls == [(3, 0.25), (6, 0.25)]
    metrics, _ = run_steps(tmp_path / "b", "algo.kl_coef=0.5", "moe.routing_replay=R3", "optim.lr=3e-2",
                           "algo.ref_sync_every_updates=1", "algo.ref_sync_alpha=1.0", steps=3)
    assert all(m["policy/kl_ref"] == pytest.approx(0.0, abs=1e-6) for m in metrics)


def test_a_reference_sync_without_its_penalty_or_with_lora_is_one_config_line():
    from minirl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"algo.ref_sync_every_updates: a reference sync needs a reference \(algo.kl_coef or"):
        load_config("configs/demo.yaml", ["algo.ref_sync_every_updates=4"])
    with pytest.raises(ConfigError, match=r"algo.ref_sync_every_updates: with LoRA the reference is the base model"):
        load_config("configs/demo.yaml", ["algo.ref_sync_every_updates=4", "algo.kl_coef=0.1", "model.lora={rank: 4}"])
