"""Token-level returns (``algo.adv_token_returns``: verl's REINFORCE++ and ReMax with the KL at each token, discounted):
hand-computed, against verl's loops written out, through the losses, in the config and in the loop; and GDPO's
whitening over tokens (verl's ``gdpo``) in the step."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import LossInputs, gspo_loss, minirl_loss
from minirl.algo.variants.token_returns import masked_whiten, token_returns
from minirl.config import ConfigError, load_config
from minirl.monitor.fidelity import sequence_is_loss
from tests.distributed.common import ROOT, TOL, max_differences, run_steps

MASK = torch.tensor([[True, True, True, False], [True, True, False, False]])


def test_returns_by_hand():
    # row 0: r = [-0.1, -0.2, -0.3 + 1, 0] -> G2 = 0.7, G1 = -0.2 + 0.5 x 0.7 = 0.15, G0 = -0.1 + 0.5 x 0.15 = -0.025
    # row 1: r = [-0.4, -0.5 + 2] -> G1 = 1.5, G0 = -0.4 + 0.75 = 0.35; 9s off the mask never count
    kl = torch.tensor([[-0.1, -0.2, -0.3, 9.0], [-0.4, -0.5, 9.0, 9.0]])
    returns = token_returns(torch.tensor([1.0, 2.0]), MASK, gamma=0.5, token_rewards_BT=kl)
    torch.testing.assert_close(returns, torch.tensor([[-0.025, 0.15, 0.7, 0.0], [0.35, 1.5, 0.0, 0.0]]), rtol=0, atol=1e-7)
    # gamma 1, no token rewards: the response's reward at each of its tokens (the per-response advantage)
    torch.testing.assert_close(token_returns(torch.tensor([1.0, 2.0]), MASK),
                               torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]]), rtol=0, atol=0)
    none = token_returns(torch.tensor([3.0]), torch.zeros(1, 3, dtype=torch.bool))  # no trained token: nothing
    assert not none.any()


def test_whitening_by_hand():
    # values 1 2 3 | 4 5 over five tokens: mean 3, unbiased variance (4 + 1 + 0 + 1 + 4) / 4 = 2.5
    values = torch.tensor([[1.0, 2.0, 3.0, 7.0], [4.0, 5.0, 7.0, 7.0]])
    s = 2.5 ** 0.5
    expected = torch.tensor([[-2 / s, -1 / s, 0.0, 0.0], [1 / s, 2 / s, 0.0, 0.0]])
    torch.testing.assert_close(masked_whiten(values, MASK), expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="two trained tokens"):
        masked_whiten(values, torch.tensor([[True, False, False, False], [False] * 4]))


def _verl_reinforce_plus_plus(token_level_rewards, response_mask, gamma):
    """verl 0.9.1 ``compute_reinforce_plus_plus_outcome_advantage`` with its ``masked_whiten`` (unbiased, shift_mean)."""
    returns = torch.zeros_like(token_level_rewards)
    running_return = 0
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]
    mean = (returns * response_mask).sum() / (response_mask.sum() + 1e-8)
    centered = returns - mean
    variance = (centered**2 * response_mask).sum() / (response_mask.sum() + 1e-8)
    variance = variance * response_mask.sum() / (response_mask.sum() - 1)
    return (returns - mean) * torch.rsqrt(variance + 1e-8) * response_mask


def test_the_same_advantages_as_verls_reinforce_plus_plus():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 1, 7, 3])
    mask = torch.arange(7)[None, :] < lengths[:, None]
    scores, kl = torch.randn(4, generator=g), torch.randn(4, 7, generator=g) * mask
    token_level = -0.05 * kl
    token_level[torch.arange(4), lengths - 1] += scores  # verl's score at the last response token, less beta x kl
    ours = masked_whiten(token_returns(scores, mask, gamma=0.9, token_rewards_BT=-0.05 * kl), mask)
    torch.testing.assert_close(ours, _verl_reinforce_plus_plus(token_level, mask.float(), 0.9), rtol=0, atol=1e-6)


def _inputs(adv, logp):
    return LossInputs(logp, logp.detach(), logp.detach(), adv, MASK)


def test_the_losses_take_one_advantage_per_token():
    logp = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -1.2, 0.0, 0.0]], requires_grad=True)
    per_response = torch.tensor([0.5, -1.0])
    tiled = per_response[:, None].expand(2, 4).clone()
    a = minirl_loss(_inputs(per_response, logp), normalizer=4.0)[0]
    b = minirl_loss(_inputs(tiled, logp), normalizer=4.0)[0]
    assert torch.equal(a, b)  # the same advantage at every token: the per-response loss
    # on-policy (pi_theta = pi_old = mu): weight 1, no clipping, so d loss / d logp_t = -A_t / normalizer at a trained token
    adv = torch.tensor([[0.5, -0.25, 2.0, 9.0], [1.0, -3.0, 9.0, 9.0]])
    loss = minirl_loss(_inputs(adv, logp), normalizer=4.0)[0]
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, -adv * MASK / 4.0, rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match=r"GSPO weighs whole responses"):
        gspo_loss(_inputs(adv, logp))
    with pytest.raises(ValueError, match=r"advantages must have shape \[B\] = \(2,\) or \[B, T\] = \(2, 4\)"):
        _inputs(torch.zeros(2, 3), logp)
    with pytest.raises(ValueError, match=r"advantages must have shape \[B\] \(one per response: the sequence-level"):
        sequence_is_loss(logp, logp.detach(), adv, MASK)  # the diagnostics' reference objective


@pytest.mark.parametrize("config, overrides, message", [
    ("demo", ["algo.adv_gamma=0.9"], r"demo.yaml: algo.adv_gamma: it discounts token-level returns: set algo.adv_token"),
    ("demo", ["algo.adv_token_returns=true"], r"demo.yaml: algo.adv_token_returns: .* do not go with adv_baseline=group_mean"),
    ("demo", ["algo.adv_token_returns=true", "algo.adv_baseline=none", "algo.adv_whiten=true",
              "algo.adv_whiten_over=responses"], "do not go with adv_whiten_over=responses"),
    ("grpo", ["algo.adv_token_returns=true", "algo.adv_baseline=none"], "do not go with adv_std_normalize"),
    ("gspo", ["algo.adv_std_normalize=false", "algo.adv_token_returns=true", "algo.adv_baseline=none"],
     "do not go with name=gspo"),
    ("demo", ["algo.adv_token_returns=true", "algo.adv_baseline=none", "diagnostics.every_steps=5"],
     "diagnostics.every_steps: the first-order diagnostics compare with the sequence-level objective"),
    ("demo", ["algo.adv_token_kl=true"], r"algo.adv_token_kl: each token's advantage less kl_in_reward_coef x its KL"),
    ("gspo", ["algo.adv_token_kl=true", "algo.kl_in_reward_coef=0.1"], "does not go with name=gspo"),
    ("demo", ["algo.adv_token_kl=true", "algo.kl_in_reward_coef=0.1", "algo.adv_token_returns=true",
              "algo.adv_baseline=none"], "does not go with adv_token_returns"),
    ("demo", ["algo.adv_token_kl=true", "algo.kl_in_reward_coef=0.1", "diagnostics.every_steps=5"],
     "algo.adv_token_kl gives one per token"),
])
def test_what_token_returns_do_not_go_with_is_one_line(config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / f"configs/{config}.yaml", overrides)


REINFORCE_PP = ["algo.adv_baseline=none", "algo.adv_whiten=true", "algo.adv_std_normalize=false"]


def test_in_the_loop_gamma_1_without_the_kl_is_the_per_response_path(tmp_path):
    """REINFORCE++ without the KL and undiscounted: every token's return is its response's reward, so the token-level
    path trains as the per-response one (token-weighted whitening); with the KL at each token and gamma < 1 it does
    not, and the run still trains."""
    per_response = run_steps(tmp_path / "a", *REINFORCE_PP)
    per_token = run_steps(tmp_path / "b", *REINFORCE_PP, "algo.adv_token_returns=true")
    loss, weight = max_differences(per_response, per_token)
    assert loss < TOL and weight < TOL
    kl = ["algo.kl_in_reward_coef=0.5", "algo.adv_token_returns=true", "algo.adv_gamma=0.8"]
    metrics, _ = run_steps(tmp_path / "c", *REINFORCE_PP, *kl)
    assert metrics[-1]["train/reward_kl_penalty"] != 0 and all(m["faults/skipped_updates"] == 0 for m in metrics)
    assert abs(metrics[0]["policy/loss"] - per_token[0][0]["policy/loss"]) > 1e-4  # other advantages


def test_in_the_loop_remax_subtracts_the_greedy_reward_from_each_return(tmp_path, monkeypatch):
    import minirl.loop as loop

    seen = {}
    original = loop.token_advantages

    def spy(cfg, sampled, batch, token_rewards=None):
        out = original(cfg, sampled, batch, token_rewards)
        seen.update(sampled=sampled, batch=batch, out=out)
        return out

    monkeypatch.setattr(loop, "token_advantages", spy)
    run_steps(tmp_path, "algo.adv_baseline=greedy", "algo.adv_token_returns=true", steps=1)
    sampled, batch, out = seen["sampled"], seen["batch"], seen["out"]
    greedy = sampled.greedy_rewards[batch.group_ids]
    expected = (sampled.rewards.float()[:, None] - greedy[:, None]) * batch.mask  # gamma 1, no KL: R_i - greedy
    torch.testing.assert_close(out.advantages, expected, rtol=0, atol=1e-7)
    assert out.advantages.shape == batch.mask.shape


def _slime_reinforce_plus_plus_baseline(rewards_PG, logp_old, logp_ref, mask, kl_coef):
    """slime's ``_post_process_rewards`` (the group mean off), ``compute_approx_kl`` (k2), then
    ``get_reinforce_plus_plus_baseline_advantages`` and ``distributed_masked_whiten`` on one rank, written out."""
    rewards = (rewards_PG - rewards_PG.mean(dim=-1, keepdim=True)).reshape(-1)
    advs, masks = [], []
    for i in range(mask.shape[0]):
        kl = ((logp_old[i] - logp_ref[i]) ** 2 / 2.0)[mask[i]]
        advs.append(torch.ones_like(kl) * rewards[i] - kl_coef * kl)
        masks.append(torch.ones_like(kl))
    values, m = torch.cat(advs), torch.cat(masks)
    count = m.sum()
    mean = (values * m).sum() / count
    var = ((values ** 2) * m).sum() / count - mean ** 2
    var = var * count / (count - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def test_in_the_loop_slimes_reinforce_plus_plus_baseline_puts_each_tokens_kl_in_its_advantage(tmp_path, monkeypatch):
    """``algo.adv_token_kl`` (slime's ``reinforce_plus_plus_baseline`` with ``--kl-coef``): each token's advantage is its
    response's group-centred reward less beta x that token's KL, whitened over the step's tokens, as slime computes it."""
    import minirl.loop as loop

    seen = {}
    original = loop.penalized_advantages

    def spy(run, sampled, batch):
        out = original(run, sampled, batch)
        seen.update(sampled=sampled, batch=batch, out=out[0])
        return out

    monkeypatch.setattr(loop, "penalized_advantages", spy)
    metrics, _ = run_steps(tmp_path, "algo.adv_std_normalize=false", "algo.adv_whiten=true", "algo.kl_in_reward_coef=0.5",
                           "algo.kl_in_reward_type=k2", "algo.adv_token_kl=true", steps=2)
    sampled, batch, out = seen["sampled"], seen["batch"], seen["out"]  # step 2: pi_old has moved off the reference
    expected = _slime_reinforce_plus_plus_baseline(sampled.rewards.float().view(len(sampled.prompts), -1),
                                                  batch.logp_old, batch.logp_ref, batch.mask, 0.5)
    assert out.advantages.shape == batch.mask.shape and not out.advantages[~batch.mask].any()
    torch.testing.assert_close(out.advantages[batch.mask], expected, rtol=0, atol=2e-5)
    assert (batch.logp_old - batch.logp_ref)[batch.mask].abs().max() > 1e-3  # the KL acts
    varies = [out.advantages[i][batch.mask[i]] for i in range(batch.size)]
    assert any(float(row.max() - row.min()) > 1e-6 for row in varies)  # not one advantage per response
    assert metrics[-1]["train/reward_kl_penalty"] > 0 and all(m["faults/skipped_updates"] == 0 for m in metrics)


def test_gdpos_token_whitening_in_the_step_weighs_responses_by_their_tokens():
    """``normalize_then_sum`` + ``adv_whiten`` (verl's gdpo): the weighted sum of the group-normalised parts whitened
    over the step's tokens; a response no function applied to gets 0 and stays out of the statistics."""
    from minirl.algo.variants.baselines import token_whiten
    from minirl.algo.variants.gdpo import decoupled_sum
    from minirl.dynamic_sampling import Sampled
    from minirl.loop import step_advantages
    from minirl.types import Completion, Prompt

    lengths = [3, 1, 4, 2, 5, 2, 1, 6]
    parts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0],
                          [1.0, 0.5], [math.nan, math.nan], [0.0, 0.5], [1.0, 0.0]])
    completions = [Completion(i // 4, i % 4, [1], [2] * n, torch.zeros(n), "length") for i, n in enumerate(lengths)]
    sampled = Sampled([Prompt(text="a", answer="b")] * 2, completions, torch.zeros(8), {}, [{}] * 8, sum(lengths),
                      reward_parts=parts, part_weights=torch.tensor([1.0, 0.5]))
    cfg = load_config(ROOT / "configs/demo.yaml", ["algo.multi_objective_aggregation=normalize_then_sum",
                                                   "algo.adv_whiten=true"])
    got = step_advantages(cfg, sampled, sampled.part_weights)
    summed = decoupled_sum(parts.view(2, 4, 2), torch.tensor([1.0, 0.5])).reshape(-1)
    keep = torch.tensor([True] * 5 + [False] + [True] * 2)
    expected = torch.zeros(8)
    expected[keep] = token_whiten(summed[keep], torch.tensor(lengths)[keep])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert got[5] == 0.0
