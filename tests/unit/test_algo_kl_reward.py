"""The KL penalty in the reward (``algo.kl_in_reward_coef``, verl's ``use_kl_in_reward``): hand-computed, against
verl's ``apply_kl_penalty`` and ``AdaptiveKLController`` written out, and in the loop."""

from __future__ import annotations

import pytest
import torch

from minirl.algo.variants.kl_reward import adaptive_kl_coef, kl_penalized_rewards

REWARDS = torch.tensor([1.0, 0.0])
LOGP_OLD = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]])
LOGP_REF = torch.tensor([[-1.5, -1.0], [-0.5, -2.0]])
MASK = torch.tensor([[True, True], [True, False]])


def test_rewards_less_the_summed_kl_by_hand():
    # k1 = logp_old - logp_ref: [0.5, -1.0] and [0.0, (1.0 masked)]; sums -0.5 and 0.0
    shaped, current = kl_penalized_rewards(REWARDS, LOGP_OLD, LOGP_REF, MASK, coef=0.1, kind="k1")
    torch.testing.assert_close(shaped, torch.tensor([1.05, 0.0]), rtol=0, atol=1e-7)
    assert float(current) == pytest.approx((-0.25 + 0.0) / 2, abs=1e-7)  # token means -0.5/2 and 0/1
    # k3 = exp(r) - r - 1 with r = logp_ref - logp_old: r = -0.5 -> 0.10653; r = 1 -> 0.71828; r = 0 -> 0
    shaped, _ = kl_penalized_rewards(REWARDS, LOGP_OLD, LOGP_REF, MASK, coef=1.0, kind="k3")
    torch.testing.assert_close(shaped, torch.tensor([1.0 - (0.1065307 + 0.7182818), 0.0]), rtol=0, atol=1e-6)


def _verl_apply_kl_penalty(scores, old, ref, mask, beta):
    """verl 0.9.1 ``apply_kl_penalty`` (``kl_penalty="kl"``) then the outcome estimators' ``token_level_rewards.sum(-1)``:
    the score sits on the last response token."""
    token_level_scores = torch.zeros_like(old)
    last = mask.sum(-1) - 1
    token_level_scores[torch.arange(len(scores)), last] = scores
    kld = (old - ref) * mask
    token_level_rewards = token_level_scores - beta * kld
    current_kl = ((kld * mask).sum(-1) / (mask.sum(-1) + 1e-8)).mean().item()
    return token_level_rewards.sum(-1), current_kl


def test_the_same_rewards_and_kl_as_verl():
    g = torch.Generator().manual_seed(0)
    old, ref = -torch.rand(6, 5, generator=g) * 3, -torch.rand(6, 5, generator=g) * 3
    mask = torch.arange(5)[None] < torch.tensor([5, 3, 1, 4, 2, 5])[:, None]
    scores = torch.rand(6, generator=g)
    want, want_kl = _verl_apply_kl_penalty(scores, old, ref, mask, beta=0.05)
    got, got_kl = kl_penalized_rewards(scores, old, ref, mask, coef=0.05, kind="k1")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert float(got_kl) == pytest.approx(want_kl, abs=1e-7)


def test_the_adaptive_coefficient_is_verls_controller():
    def verl(value, current, target, horizon, n):  # AdaptiveKLController.update
        error = min(max(current / target - 1, -0.2), 0.2)
        return value * (1 + error * n / horizon)

    for current in (0.15, 0.05, 0.11, 0.0):
        assert adaptive_kl_coef(0.1, current, target=0.1, horizon=10000, n_steps=64) == verl(0.1, current, 0.1, 10000, 64)
    assert adaptive_kl_coef(0.1, 0.15, target=0.1, horizon=10000, n_steps=64) == pytest.approx(0.1 * 1.00128, rel=1e-12)
    assert adaptive_kl_coef(0.1, 0.0, target=0.1, horizon=8, n_steps=8) == pytest.approx(0.08, rel=1e-12)


def test_a_nan_in_the_kl_fails_loudly():
    old = LOGP_OLD.clone()
    old[0, 1] = float("nan")
    with pytest.raises(FloatingPointError, match="non-finite KL in the reward"):
        kl_penalized_rewards(REWARDS, old, LOGP_REF, MASK, coef=0.1)
    old[1, 1] = float("nan")  # at padding: not a response token
    old[0, 1] = -2.0
    kl_penalized_rewards(REWARDS, old, LOGP_REF, MASK, coef=0.1)


def test_in_the_loop_the_advantages_are_the_penalized_rewards_and_beta_adapts(tmp_path):
    """verl's order: pi_old and pi_ref first, then R' and its group-mean advantages (the demo's MiniRL); with a target
    the next step's beta is the controller's."""
    import minirl.loop as loop
    from tests.distributed.common import run_steps

    seen: dict[str, list] = {"penalized": [], "advantages": []}

    def watch(run):
        penalize, update = loop.kl_penalized_rewards, run.trainer.update

        def penalized(rewards, *args, **kwargs):
            out = penalize(rewards, *args, **kwargs)
            seen["penalized"].append((rewards.clone(), out[0].clone(), kwargs["coef"]))
            return out

        def record(minibatch, *args, **kwargs):
            seen["advantages"].append(minibatch.advantages.clone())
            return update(minibatch, *args, **kwargs)

        loop.kl_penalized_rewards = penalized
        run.trainer.update = record
        watch.restore = lambda: setattr(loop, "kl_penalized_rewards", penalize)

    try:
        metrics, _ = run_steps(tmp_path, "algo.kl_in_reward_coef=0.5", "algo.kl_in_reward_target=0.01",
                               "algo.kl_in_reward_horizon=8", "optim.lr=3e-2", steps=3, on_setup=watch)
    finally:
        watch.restore()
    assert metrics[0]["train/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-7)  # pi_old = pi_ref at the start
    assert metrics[1]["train/reward_kl_penalty"] != 0.0 and "train/reward_kl_coef" in metrics[2]
    for (raw, shaped, coef), advantages, row in zip(seen["penalized"], seen["advantages"], metrics):
        assert row["train/reward_kl_coef"] == coef and row["train/reward_mean"] == pytest.approx(float(raw.mean()), abs=1e-6)
        groups = shaped.view(2, 4)
        torch.testing.assert_close(advantages, (groups - groups.mean(dim=1, keepdim=True)).reshape(-1), rtol=0, atol=1e-6)
    coefs = [row["train/reward_kl_coef"] for row in metrics]
    for before, after, row in zip(coefs, coefs[1:], metrics):  # 8 responses per step, horizon 8: +-20 % per step
        assert after == pytest.approx(adaptive_kl_coef(before, row["train/reward_kl_penalty"], target=0.01, horizon=8,
                                                       n_steps=8), rel=1e-9)
    assert coefs[1] == pytest.approx(0.5 * 0.8, rel=1e-6)  # KL 0 at step 1: the coefficient falls by 20 %
