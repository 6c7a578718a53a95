"""verl's optimal token baseline (``algo.adv_baseline: optimal_token``): by hand, against verl's
``compute_optimal_token_baseline_advantage`` written out, sum pi^2 through every scoring path, the config's one-line
errors, and the loop (its advantages are the function's of the old pass's pi_old and sum pi_old^2)."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from minirl.algo.variants.otb import optimal_token_advantages
from minirl.config import ConfigError, load_config
from minirl.monitor.mismatch import token_sum_pi_squared


def test_the_baseline_by_hand():
    """Group 0: response a (R 1, two tokens) and b (R 0, three tokens), after a one-token prompt; group 1 alone.
    a: w = 1 - 2 pi + S = [1 - 1 + 0.5, 1 - 0.5 + 0.25] -> W = [0.5, 1.25]; b: w = [0.5, 0.5, 1 - 2 + 1] -> W = [0.5,
    1.0, 1.0]. B_0 = (1 x 0.5) / 1.0 = 0.5, B_1 = 1.25 / 2.25; b's third token: no other response reaches it, B = 0
    (handle_zero_tail). A lone response keeps its return."""
    mask = torch.tensor([[False, True, True, False], [False, True, True, True], [False, True, False, False]])
    pi = torch.tensor([[0.3, 0.5, 0.25, 0.3], [0.3, 0.5, 0.5, 1.0], [0.3, 0.9, 0.3, 0.3]])
    squares = torch.tensor([[0.7, 0.5, 0.25, 0.7], [0.7, 0.5, 0.5, 1.0], [0.7, 0.8, 0.7, 0.7]])
    returns = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    got = optimal_token_advantages(returns, pi.log(), squares, mask, torch.tensor([0, 0, 1]))
    want = torch.tensor([[0.0, 0.5, 1 - 1.25 / 2.25, 0.0], [0.0, -0.5, -1.25 / 2.25, 0.0], [0.0, 2.0, 0.0, 0.0]])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # the IS weights rho enter squared: rho = 2 on a's first token makes its W 4 x 0.5 = 2 there (and after)
    rho = torch.ones(3, 4)
    rho[0, 1] = 2.0
    got = optimal_token_advantages(returns, pi.log(), squares, mask, torch.tensor([0, 0, 1]), rho)
    assert float(got[1, 1]) == pytest.approx(-2.0 / 2.5, abs=1e-6) and float(got[1, 2]) == pytest.approx(
        -2.75 / 3.75, abs=1e-6)


def _verl_otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights=None,
              handle_zero_tail=True, epsilon=1e-8):
    """verl's ``compute_optimal_token_baseline_advantage`` (response-aligned tensors), written out as verl does."""
    batch_size = token_level_rewards.shape[0]
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w_per_timestep = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w_per_timestep = w_per_timestep * (rollout_is_weights**2)
    w_cumulative = (w_per_timestep * response_mask).cumsum(dim=-1)
    prompt_groups = defaultdict(list)
    for i in range(batch_size):
        prompt_groups[index[i]].append(i)
    baselines = torch.zeros_like(returns)
    for _, trajectory_indices in prompt_groups.items():
        n = len(trajectory_indices)
        if n == 1:
            continue
        traj_idx = torch.tensor(trajectory_indices)
        returns_group, w_group, mask_group = returns[traj_idx], w_cumulative[traj_idx], response_mask[traj_idx]
        numerator = (returns_group * w_group * mask_group).sum(dim=0)
        denominator = (w_group * mask_group).sum(dim=0) + epsilon
        baselines[traj_idx] = (numerator / denominator).unsqueeze(0).expand(n, -1)
        if handle_zero_tail:
            response_lengths = mask_group.sum(dim=-1)
            sorted_lengths, _ = torch.sort(response_lengths)
            max_length, second_max_length = int(sorted_lengths[-1].item()), int(sorted_lengths[-2].item())
            max_length_idx = (response_lengths == max_length).nonzero(as_tuple=True)[0]
            if max_length_idx.numel() == 1 and max_length > second_max_length:
                baselines[trajectory_indices[int(max_length_idx[0])], second_max_length:] = 0.0
    return (returns - baselines) * response_mask


@pytest.mark.parametrize("is_weights", [False, True])
def test_the_advantages_are_verls(is_weights):
    """Random groups of 4 with prompts of each group's own length (minirl's [B, T] rows: prompt, then response),
    responses of 1-9 tokens, an outcome reward at the last token plus a per-token reward (the KL in the reward):
    minirl's advantages at the response tokens are verl's on the response-aligned tensors."""
    from minirl.algo.variants.token_returns import token_returns

    gen = torch.Generator().manual_seed(0)
    groups, g, width = 5, 4, 9
    lengths = torch.randint(1, width + 1, (groups * g,), generator=gen)
    lengths[0:2] = width  # one group whose two longest tie: no zero tail
    prompt = torch.randint(1, 4, (groups,), generator=gen).repeat_interleave(g)
    response_mask = torch.arange(width)[None] < lengths[:, None]
    outcome = torch.randint(0, 2, (groups * g,), generator=gen).float()
    per_token = -0.1 * torch.rand(groups * g, width, generator=gen) * response_mask
    rewards = per_token.clone()
    rewards[torch.arange(groups * g), lengths - 1] += outcome
    logp = -2 * torch.rand(groups * g, width, generator=gen)
    squares = torch.rand(groups * g, width, generator=gen) * logp.exp()
    rho = (0.5 + torch.rand(groups * g, width, generator=gen)) if is_weights else None
    want = _verl_otb(rewards, response_mask.float(), (torch.arange(groups * g) // g).tolist(), logp, squares, rho)

    total = int(prompt.max()) + width  # minirl's layout: each row's response after its group's prompt
    columns = prompt[:, None] + torch.arange(width)[None]

    def place(values):
        out = torch.full((groups * g, total), 7.0)  # off the mask: never read
        return out.scatter(1, columns, values)

    mask = place(response_mask.float()).eq(1.0) & (torch.arange(total)[None] >= prompt[:, None])
    returns = token_returns(outcome, mask, token_rewards_BT=place(per_token) * mask)
    got = optimal_token_advantages(returns, place(logp), place(squares), mask, torch.arange(groups * g) // g,
                                   None if rho is None else place(rho))
    torch.testing.assert_close(got.gather(1, columns) * response_mask, want, rtol=0, atol=1e-6)
    assert torch.equal(got * ~mask, torch.zeros_like(got))


def test_sum_pi_squared_of_logits():
    logits = torch.randn(2, 3, 11) * 3
    logits[0, 0, 4] = -torch.inf  # a banned token counts 0
    want = torch.softmax(logits.double(), dim=-1).square().sum(dim=-1).float()
    torch.testing.assert_close(token_sum_pi_squared(logits, chunk_size=2), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("path", ["whole", "chunked_head", "padding_free"])
def test_every_scoring_path_gives_sum_pi_squared(path):
    """``Trainer.score(sum_pi_squared=True)``: sum_w pi(w)^2 of the logits at the rollout temperature, at the trained
    positions (0 elsewhere), through the whole-tensor path, the chunked LM head and the padding-free forward."""
    from minirl.trainer import Trainer
    from tests.conftest import make_tiny_moe
    from tests.unit.test_trainer_precision import batch_of

    model, batch = make_tiny_moe(0), batch_of(6)
    options = {"chunked_head": {"logprob_chunk_tokens": 5}, "padding_free": {"padding_free": True}}.get(path, {})
    trainer = Trainer(model, lr=0.0, micro_batch_sequences=4, logits_temperature=0.7, **options)
    scores = trainer.score(batch, sum_pi_squared=True)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float() / 0.7
    want = torch.softmax(logits, dim=-1).square().sum(dim=-1) * batch.mask
    torch.testing.assert_close(scores.sum_pi_squared, want, rtol=1e-5, atol=1e-6)
    assert trainer.score(batch).sum_pi_squared is None  # not asked: not computed


def test_otb_config_errors_are_one_line():
    with pytest.raises(ConfigError, match=r"algo\.adv_baseline=optimal_token: .*logp_old_source: trainer"):
        load_config(None, ["algo.adv_baseline=optimal_token", "algo.logp_old_source=rollout"])
    with pytest.raises(ConfigError, match=r"algo\.adv_baseline=optimal_token: .* do not go with adv_std_normalize"):
        load_config(None, ["algo.adv_baseline=optimal_token", "algo.adv_std_normalize=true"])
    with pytest.raises(ConfigError, match=r"diagnostics\.every_steps: .*adv_baseline=optimal_token"):
        load_config(None, ["algo.adv_baseline=optimal_token", "diagnostics.every_steps=5"])


def test_in_the_loop_the_updates_train_on_the_old_pass_otb(tmp_path, monkeypatch):
    """Step 2 with an fp8 engine (IS weights other than 1) and the KL in the reward: the update's advantages are
    the function's of each token's return (its response's reward less the KL from there on), with pi_old and
    sum pi_old^2 of a fresh pass at the step's weights (the old pass ran before any update) and the IS factor
    min(pi_old/mu_old, 5)."""
    import minirl.loop as loop
    from minirl.algo._common import train_infer_factor
    from minirl.algo.variants.kl_reward import token_kl_estimate
    from minirl.algo.variants.token_returns import token_returns
    from tests.distributed.common import run_steps

    seen: dict = {}
    original = loop.otb_advantages

    def spy_advantages(run, sampled, batch, token_rewards=None):
        seen["rewards"] = sampled.rewards.float()
        return original(run, sampled, batch, token_rewards)

    def spy_update(run):
        update = run.trainer.update

        def first(minibatch, objective, **kwargs):
            seen["scores"] = run.trainer.score(minibatch, sum_pi_squared=True)  # before the step's one update: pi_old
            seen["minibatch"] = minibatch
            return update(minibatch, objective, **kwargs)
        run.trainer.update = first

    monkeypatch.setattr(loop, "otb_advantages", spy_advantages)
    metrics, _ = run_steps(tmp_path, "algo.adv_baseline=optimal_token", "rollout.precision=fp8_e4m3",
                           "moe.routing_replay=none", "optim.minibatches_per_step=1", "algo.kl_in_reward_coef=0.2",
                           steps=2, on_setup=spy_update)
    b, scores = seen["minibatch"], seen["scores"]
    torch.testing.assert_close(b.logp_old, scores.logp, rtol=0, atol=1e-6)
    kl, _ = token_kl_estimate(scores.logp, b.logp_ref, b.mask, "k1")
    returns = token_returns(seen["rewards"], b.mask, token_rewards_BT=-0.2 * kl)
    weight, _ = train_infer_factor(scores.logp, b.logp_rollout, b.mask, torch.float32, enabled=True, tis_cap=5.0)
    assert not torch.allclose(weight[b.mask], torch.ones(int(b.mask.sum())))  # the fp8 engine's gap
    want = optimal_token_advantages(returns, scores.logp, scores.sum_pi_squared, b.mask, b.group_ids, weight)
    torch.testing.assert_close(b.advantages, want, rtol=0, atol=1e-5)
    assert b.advantages.shape == b.mask.shape and metrics[-1]["faults/skipped_updates"] == 0
    assert metrics[-1]["train/reward_kl_penalty"] != 0  # step 2: the policy has moved from the reference
