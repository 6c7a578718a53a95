"""``group_advantages``: mean-centred group baseline ([P] §4.1), optional std division (Appendix A)."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import group_advantages
from minirl.algo.variants.baselines import response_whiten, token_whiten

F64 = torch.float64


def test_mean_only_by_default() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]], dtype=F64)
    # row 0 mean 0.5, row 1 mean 0.75
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]], dtype=F64)
    torch.testing.assert_close(group_advantages(r), expected, atol=1e-12, rtol=0)


def test_std_normalize_uses_unbiased_std_plus_1e6() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]], dtype=F64)
    # row 0: sum of squared deviations 4 * 0.25 = 1, /(G-1) = 1/3, std = 1/sqrt(3)
    # row 1: 3 * 0.0625 + 0.5625 = 0.75, /3 = 0.25, std = 0.5
    s0 = 1 / math.sqrt(3) + 1e-6
    s1 = 0.5 + 1e-6
    expected = torch.tensor(
        [[0.5 / s0, -0.5 / s0, -0.5 / s0, 0.5 / s0], [0.25 / s1, 0.25 / s1, 0.25 / s1, -0.75 / s1]], dtype=F64
    )
    torch.testing.assert_close(group_advantages(r, std_normalize=True), expected, atol=1e-12, rtol=0)


def test_constant_group_gives_zero_not_nan() -> None:
    r = torch.ones(2, 3)
    assert torch.equal(group_advantages(r), torch.zeros(2, 3))
    assert torch.equal(group_advantages(r, std_normalize=True), torch.zeros(2, 3))


def test_integer_rewards_become_float32() -> None:
    a = group_advantages(torch.tensor([[1, 0]]))
    assert a.dtype == torch.float32 and a.tolist() == [[0.5, -0.5]]


def test_single_sample_groups() -> None:
    assert torch.equal(group_advantages(torch.tensor([[3.0], [1.0]])), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="std_normalize"):
        group_advantages(torch.tensor([[3.0], [1.0]]), std_normalize=True)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="rewards_PG"):
        group_advantages(torch.zeros(4))
    with pytest.raises(FloatingPointError, match="rewards_PG"):
        group_advantages(torch.tensor([[1.0, math.nan]]))


def test_leave_one_out_baseline_is_the_mean_of_the_other_rewards() -> None:
    # group [1, 0, 0, 1]: each minus the mean of the other three: 1 - 1/3, 0 - 2/3, 0 - 2/3, 1 - 1/3
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]], dtype=torch.float64)
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [3 - 5 / 3, 1 - 7 / 3, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(r, baseline="leave_one_out"), expected, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="leave_one_out baseline needs G >= 2"):
        group_advantages(torch.tensor([[3.0], [1.0]]), baseline="leave_one_out")


def test_one_sample_a_prompt_takes_the_batchs_std_not_a_groups() -> None:
    # rewards 3, 1 (G = 1), no baseline: each over the batch's std sqrt(2) (+1e-6)
    r = torch.tensor([[3.0], [1.0]], dtype=torch.float64)
    expected = torch.tensor([[3.0], [1.0]], dtype=torch.float64) / (math.sqrt(2.0) + 1e-6)
    torch.testing.assert_close(group_advantages(r, std_normalize=True, std_scope="batch", baseline="none"), expected,
                               atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="std_normalize=True over each group needs G >= 2"):
        group_advantages(r, std_normalize=True, baseline="none")


def test_batch_scope_divides_by_the_std_of_every_reward_of_the_step() -> None:
    # rewards 1, 0, 0, 1, 3, 1, 2, 2: mean 1.25, unbiased variance (3 x 0.0625 + 2 x 1.5625 + 3.0625 + 2 x 0.5625) / 7 = 7.5/7
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]], dtype=torch.float64)
    std = math.sqrt(7.5 / 7)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]], dtype=torch.float64) / (std + 1e-6)
    torch.testing.assert_close(group_advantages(r, std_normalize=True, std_scope="batch"), expected, atol=1e-12, rtol=0)
    assert torch.equal(group_advantages(r, std_scope="batch"), group_advantages(r))  # no std: nothing to scope


def test_length_weighted_baseline_by_hand() -> None:
    # OPO: rewards [1, 0, 0, 1] over 2, 4, 1 and 3 tokens: baseline (2 + 3) / 10 = 0.5 -> [0.5, -0.5, -0.5, 0.5];
    # rewards [1, 1, 0, 0] over 1, 1, 6 and 2 tokens: baseline 2 / 10 = 0.2 -> [0.8, 0.8, -0.2, -0.2];
    # a group whose responses are all empty falls back to the plain mean
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0], [2.0, 0.0, 1.0, 1.0]], dtype=F64)
    lengths = torch.tensor([[2, 4, 1, 3], [1, 1, 6, 2], [0, 0, 0, 0]])
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.8, 0.8, -0.2, -0.2], [1.0, -1.0, 0.0, 0.0]], dtype=F64)
    out = group_advantages(r, baseline="length_weighted", lengths_PG=lengths)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="lengths_PG of the rewards' shape"):
        group_advantages(r, baseline="length_weighted")
    with pytest.raises(ValueError, match="lengths_PG of the rewards' shape"):
        group_advantages(r, baseline="length_weighted", lengths_PG=lengths[:2])


def test_pass_at_k_gives_only_the_best_its_lead_over_the_second_best() -> None:
    # [0.2, 0.9, 0.5, 0.1]: only 0.9, by 0.9 - 0.5 = 0.4; a tie at the top: 0 for all
    r = torch.tensor([[0.2, 0.9, 0.5, 0.1], [1.0, 0.0, 1.0, 0.0]], dtype=F64)
    expected = torch.tensor([[0.0, 0.4, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(group_advantages(r, baseline="pass_at_k"), expected, atol=1e-12, rtol=0)
    # with the std: 0.4 / (unbiased std of the group + 1e-6); mean 0.425, squared deviations sum 0.3875
    std = math.sqrt(0.3875 / 3)
    out = group_advantages(r, std_normalize=True, baseline="pass_at_k")
    torch.testing.assert_close(out[0], torch.tensor([0.0, 0.4 / (std + 1e-6), 0.0, 0.0], dtype=F64), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="pass_at_k baseline needs G >= 2"):
        group_advantages(torch.tensor([[3.0], [1.0]]), baseline="pass_at_k")


def test_no_baseline_and_gpgs_rescaling_by_hand() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]], dtype=F64)
    assert torch.equal(group_advantages(r, baseline="none"), r)
    # GPG: 3 non-zero rewards among 8 -> alpha 8/3 times the group-centred reward
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [-0.25, -0.25, -0.25, 0.75]], dtype=F64) * (8 / 3)
    torch.testing.assert_close(group_advantages(r, nonzero_rescale=True), expected, atol=1e-12, rtol=0)
    assert torch.equal(group_advantages(torch.zeros(2, 2), nonzero_rescale=True), torch.zeros(2, 2))  # alpha 4/1
    with pytest.raises(ValueError, match="baseline='median'"):
        group_advantages(r, baseline="median")


def test_verls_opo_passk_gpg_and_reinforce_plus_plus_as_verl_writes_them() -> None:
    """verl 0.9.1's ``compute_opo_outcome_advantage``, ``compute_grpo_passk_outcome_advantage``,
    ``compute_gpg_outcome_advantage`` and ``compute_reinforce_plus_plus_outcome_advantage`` (gamma 1), their loops
    written out on 3 groups of 4 with an outcome reward on each response's last token."""
    g = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 3, (3, 4), generator=g).double() / 2
    rewards[2] = torch.tensor([0.0, 1.0, 0.5, 0.25], dtype=F64)  # a group with a strict best
    lengths = torch.randint(1, 7, (3, 4), generator=g)
    scores, n = rewards.reshape(-1), lengths.reshape(-1).double()
    opo, passk, gpg = torch.zeros(12, dtype=F64), torch.zeros(12, dtype=F64), torch.zeros(12, dtype=F64)
    alpha = 12 / max(int(torch.count_nonzero(scores)), 1)
    for k in range(3):
        rows = slice(4 * k, 4 * k + 4)
        opo[rows] = scores[rows] - (n[rows] * scores[rows]).sum() / n[rows].sum()
        top, top_idx = torch.topk(scores[rows], 2)
        passk[4 * k + int(top_idx[0])] = (top[0] - top[1]) / (torch.std(scores[rows]) + 1e-6)
        gpg[rows] = alpha * (scores[rows] - scores[rows].mean())
    ours = {"opo": group_advantages(rewards, baseline="length_weighted", lengths_PG=lengths),
            "passk": group_advantages(rewards, std_normalize=True, baseline="pass_at_k"),
            "gpg": group_advantages(rewards, nonzero_rescale=True)}
    for name, verl in (("opo", opo), ("passk", passk), ("gpg", gpg)):
        torch.testing.assert_close(ours[name].reshape(-1), verl, atol=1e-12, rtol=0, msg=name)
    # REINFORCE++ (gamma 1): each valid token's return is the response's reward; masked_whiten over the batch's tokens
    mask = (torch.arange(6)[None, :] < n[:, None]).double()
    returns = scores[:, None] * mask
    mean = (returns * mask).sum() / (mask.sum() + 1e-8)
    var = (((returns - mean) ** 2) * mask).sum() / (mask.sum() + 1e-8) * (mask.sum() / (mask.sum() - 1))
    verl = ((returns - mean) * torch.rsqrt(var + 1e-8) * mask)[:, 0]
    ours_rpp = token_whiten(group_advantages(rewards, baseline="none").reshape(-1), lengths.reshape(-1))
    torch.testing.assert_close(ours_rpp, verl, atol=1e-12, rtol=0)


def test_token_whiten_weighs_each_response_by_its_tokens() -> None:
    # advantages [1, -1, 0] over 3, 1 and 4 tokens (8): mean (3 - 1 + 0) / 8 = 0.25;
    # variance (3 x 0.5625 + 1.5625 + 4 x 0.0625) / 8 x 8/7 = 3.5/7 = 0.5
    a = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    out = token_whiten(a, torch.tensor([3, 1, 4]))
    expected = (a - 0.25) / math.sqrt(0.5 + 1e-8)
    torch.testing.assert_close(out, expected, atol=1e-7, rtol=0)  # verl's 1e-8 in the mean's denominator
    with pytest.raises(ValueError, match="at least 2 tokens"):
        token_whiten(torch.tensor([1.0]), torch.tensor([1]))


def test_token_whiten_is_verls_masked_whiten_of_the_tiled_scores() -> None:
    """verl 0.9.1's reinforce_plus_plus_baseline, as verl writes it: scores tiled over each response's tokens,
    ``masked_whiten`` (mean and unbiased variance over the mask, 1e-8 in both), read back per response."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (3, 4), generator=g).double()
    lengths = torch.randint(1, 7, (12,), generator=g)
    scores = (rewards - rewards.mean(dim=1, keepdim=True)).reshape(-1)
    mask = (torch.arange(6)[None, :] < lengths[:, None]).double()
    tiled = scores[:, None] * mask
    mean = (tiled * mask).sum() / (mask.sum() + 1e-8)
    var = (((tiled - mean) ** 2) * mask).sum() / (mask.sum() + 1e-8) * (mask.sum() / (mask.sum() - 1))
    verl = ((tiled - mean) * torch.rsqrt(var + 1e-8) * mask)[:, 0]
    ours = token_whiten(group_advantages(rewards).reshape(-1), lengths)
    torch.testing.assert_close(ours, verl, atol=1e-12, rtol=0)


def test_decoupled_advantages_by_hand():
    """GDPO: two functions over two groups of 3 (weights 1 and 2), the second not applying to group 2 (NaN).
    Group 1: z_1 = z(1, 0, 1) = (1, -2, 1) / sqrt(3), z_2 = z(0, 1, 1) = (-2, 1, 1) / sqrt(3) (unbiased stds
    1/sqrt(3)), S = z_1 + 2 z_2 = (-sqrt(3), 0, sqrt(3)); group 2: S = z_1 = (-1, -1, 2) / sqrt(3). Over the six,
    mean 0 and unbiased std sqrt(8/5): A = S / sqrt(1.6)."""
    from minirl.algo.variants.gdpo import decoupled_advantages

    nan = math.nan
    parts = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[0.0, nan], [0.0, nan], [1.0, nan]]], dtype=torch.float64)
    got = decoupled_advantages(parts, torch.tensor([1.0, 2.0]))
    root3 = math.sqrt(3)
    expected = torch.tensor([[-root3, 0.0, root3], [-1 / root3, -1 / root3, 2 / root3]], dtype=torch.float64) / math.sqrt(1.6)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)  # the 1e-6 in each std's denominator
    # a response no function applied to gets 0 and leaves the batch's mean and std alone
    parts2 = torch.cat([parts, torch.full((1, 3, 2), nan, dtype=torch.float64)])
    got2 = decoupled_advantages(parts2, torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(got2[:2], got, rtol=0, atol=1e-12)
    assert torch.equal(got2[2], torch.zeros(3, dtype=torch.float64))
    # one function: the group z-scores, whitened over the batch
    one = decoupled_advantages(parts[:, :, :1], torch.tensor([3.0]))
    z = torch.tensor([[1.0, -2.0, 1.0], [-1.0, -1.0, 2.0]], dtype=torch.float64) / root3
    torch.testing.assert_close(one, (z - z.mean()) / z.std(), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"parts_PGK must be \[P, G, K\]"):
        decoupled_advantages(parts, torch.tensor([1.0]))


def test_the_loop_hands_each_completions_length_to_its_reward() -> None:
    """``minirl.loop.step_advantages`` under OPO's baseline: completions are group-major, so completion i's length
    weighs reward i (a transposed [G, P] view would pair them wrongly); then REINFORCE++'s whitening by the same
    lengths, and GPG's rescaling."""
    from types import SimpleNamespace

    from minirl.config import load_config
    from minirl.loop import step_advantages

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    lengths = [2, 4, 1, 3, 1, 1, 6, 2]  # the by-hand groups of test_length_weighted_baseline_by_hand
    sampled = SimpleNamespace(prompts=[0, 1], rewards=rewards, reward_parts=None, greedy_rewards=None,
                              completions=[SimpleNamespace(completion_ids=[7] * n) for n in lengths])
    cfg = load_config(None, ["algo.adv_baseline=length_weighted"])
    out = step_advantages(cfg, sampled, None)
    torch.testing.assert_close(out, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.8, 0.8, -0.2, -0.2]), atol=1e-6, rtol=0)
    cfg = load_config(None, ["algo.adv_baseline=none", "algo.adv_whiten=true"])
    torch.testing.assert_close(step_advantages(cfg, sampled, None), token_whiten(rewards, torch.tensor(lengths)))
    cfg = load_config(None, ["algo.adv_nonzero_rescale=true"])
    torch.testing.assert_close(step_advantages(cfg, sampled, None),
                               group_advantages(rewards.view(2, 4)).reshape(-1) * 2)  # 8 responses, 4 non-zero


def test_response_whiten_by_hand_and_as_trl_rloo_writes_it() -> None:
    # [1, -1, 0, 2]: mean 0.5, unbiased variance (0.25 + 2.25 + 0.25 + 2.25) / 3 = 5/3
    a = torch.tensor([1.0, -1.0, 0.0, 2.0], dtype=F64)
    torch.testing.assert_close(response_whiten(a), (a - 0.5) / (math.sqrt(5 / 3) + 1e-4), atol=1e-12, rtol=0)
    # TRL 1.16 RLOOTrainer: (advantages - nanmean) / (nanstd + 1e-4), nanstd = sqrt(nanmean((x - m)^2) * n / (n - 1))
    g = torch.Generator().manual_seed(1)
    rloo = group_advantages(torch.randint(0, 2, (3, 4), generator=g).double(), baseline="leave_one_out").reshape(-1)
    nanstd = torch.sqrt(torch.nanmean((rloo - torch.nanmean(rloo)) ** 2) * 12 / 11)
    torch.testing.assert_close(response_whiten(rloo), (rloo - torch.nanmean(rloo)) / (nanstd + 1e-4), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="at least 2 responses"):
        response_whiten(torch.tensor([1.0]))


def test_the_loop_clamps_rewards_before_the_advantages_and_whitens_per_response() -> None:
    from types import SimpleNamespace

    from minirl.config import load_config
    from minirl.loop import step_advantages

    rewards = torch.tensor([3.0, -2.0, 0.5, 0.0, 1.0, 1.0, 0.0, 4.0])
    sampled = SimpleNamespace(prompts=[0, 1], rewards=rewards, reward_parts=None, greedy_rewards=None,
                              completions=[SimpleNamespace(completion_ids=[7] * 3) for _ in rewards])
    cfg = load_config(None, ["algo.reward_clip_range=[-1, 1]"])
    clamped = torch.tensor([1.0, -1.0, 0.5, 0.0, 1.0, 1.0, 0.0, 1.0])
    torch.testing.assert_close(step_advantages(cfg, sampled, None), group_advantages(clamped.view(2, 4)).reshape(-1))
    unclamped = step_advantages(cfg, sampled, None, clip=False)  # the KL-penalised rewards arrive clamped already
    torch.testing.assert_close(unclamped, group_advantages(rewards.view(2, 4)).reshape(-1))
    cfg = load_config(None, ["algo.adv_baseline=leave_one_out", "algo.adv_whiten=true", "algo.adv_whiten_over=responses"])
    expected = response_whiten(group_advantages(rewards.view(2, 4), baseline="leave_one_out").reshape(-1))
    torch.testing.assert_close(step_advantages(cfg, sampled, None), expected)


def test_with_the_kl_in_the_reward_the_clamp_comes_first() -> None:
    """TRL's RLOOTrainer clamps the rewards into ``reward_clip_range``, then subtracts beta x the summed k1 KL: a KL
    penalty can take a reward below the low bound (clamping after it would not)."""
    from types import SimpleNamespace

    from minirl.config import load_config
    from minirl.dynamic_sampling import Sampled
    from minirl.loop import penalized_advantages
    from minirl.types import Batch

    rewards = torch.tensor([3.0, 0.0, 0.0, 0.0])  # one group of 4; 3 is clamped to 1
    mask = torch.ones(4, 2, dtype=torch.bool)
    logp_old = torch.zeros(4, 2)
    logp_ref = torch.tensor([[-1.0, -1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])  # k1 = 1 + 1 on row 0
    batch = Batch(torch.zeros(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.bool), mask, torch.zeros(4, 2),
                  torch.zeros(4), torch.zeros(4, dtype=torch.long), logp_old=logp_old, logp_ref=logp_ref)
    cfg = load_config(None, ["algo.reward_clip_range=[-1, 1]", "algo.kl_in_reward_coef=0.5", "algo.kl_in_reward_type=k1"])
    completions = [SimpleNamespace(completion_ids=[7, 7]) for _ in rewards]
    sampled = Sampled(prompts=[0], completions=completions, rewards=rewards, reward_stats={}, columns=[], generated_tokens=8)
    run = SimpleNamespace(cfg=cfg, kl_control={})
    out, _ = penalized_advantages(run, sampled, batch)
    shaped = torch.tensor([1.0 - 0.5 * 2, 0.0, 0.0, 0.0])  # clamp to 1, then less 0.5 x 2
    torch.testing.assert_close(out.advantages, group_advantages(shaped.view(1, 4)).reshape(-1))


def test_remaxs_greedy_baseline_by_hand() -> None:
    # each prompt's rewards less its greedy completion's reward: [1, 0, 0, 1] - 0.5 and [1, 1, 0, 0] - 1
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=F64)
    out = group_advantages(r, baseline="greedy", greedy_P=torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(out, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, -1.0, -1.0]], dtype=F64),
                               atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"one greedy reward per prompt \(2\), got None"):
        group_advantages(r, baseline="greedy")


def test_the_greedy_rollout_is_one_temperature_0_sample_per_prompt_on_the_steps_seed() -> None:
    """``minirl.loop.greedy_rewards``: the engine samples each prompt once at temperature 0 with the step's other
    settings, and the step's reward source scores those completions."""
    from types import SimpleNamespace

    from minirl.config import load_config
    from minirl.loop import _Clock, greedy_rewards, rollout_sampling

    calls = []

    class Engine:
        def generate(self, prompts, n, sampling, record_routes=False):
            calls.append((list(prompts), n, sampling))
            return [SimpleNamespace(completion_ids=[1, 2]) for _ in prompts]

    class Rewards:
        def score(self, prompts, completions):
            return torch.tensor([0.25 * (i + 1) for i in range(len(completions))]), {}

    cfg = load_config(None, ["algo.adv_baseline=greedy", "rollout.temperature=0.9", "rollout.max_new_tokens=5"])
    run = SimpleNamespace(cfg=cfg, engine=Engine(), rewards=Rewards())
    out = greedy_rewards(run, 3, ["p", "q"], _Clock())
    assert out.tolist() == [0.25, 0.5] and out.dtype == torch.float32
    (prompts, n, sampling), = calls
    assert (prompts, n, sampling.temperature, sampling.max_new_tokens) == (["p", "q"], 1, 0.0, 5)
    assert sampling.seed == rollout_sampling(cfg, 3).seed
    with pytest.raises(Exception, match=r"rollout\.filter_groups"):
        load_config(None, ["algo.adv_baseline=greedy", "rollout.filter_groups=true"])


def test_the_steps_batch_is_scored_before_the_greedy_rollouts() -> None:
    """ReMax's greedy rollouts run after the step's batch is scored: they reuse the environments' instances
    (``task.environment``) that a reward function taking ``environments`` reads for the batch."""
    from types import SimpleNamespace

    from minirl.config import load_config
    from minirl.loop import _Clock, rollout_and_score

    events = []

    class Rollouts:
        def rollouts(self, step, prompts, n, sampling, record_routes=False):
            events.append("rollouts")
            return [SimpleNamespace(completion_ids=[1]) for _ in range(len(prompts) * n)]

    class Engine:
        def generate(self, prompts, n, sampling, record_routes=False):
            events.append("greedy rollouts")
            return [SimpleNamespace(completion_ids=[1]) for _ in prompts]

    class Rewards:
        def score(self, prompts, completions):
            events.append(f"score {len(completions)}")
            return torch.zeros(len(completions)), {}

    cfg = load_config(None, ["algo.adv_baseline=greedy", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2"])
    run = SimpleNamespace(cfg=cfg, rollouts=Rollouts(), engine=Engine(), rewards=Rewards(), partial=None,
                          prompts=["p", "q"], order=SimpleNamespace(next=lambda count: [0, 1][:count]))
    sampled = rollout_and_score(run, 1, False, _Clock())
    assert events == ["rollouts", "score 4", "greedy rollouts", "score 2"] and sampled.greedy_rewards.tolist() == [0, 0]


def test_unscored_responses_are_out_of_their_groups_statistics_by_hand() -> None:
    """TRL 1.16: a response no reward function scored is out of its group's mean and std, with advantage 0; a group
    with one scored response (std undefined) or none gives 0 to all."""
    from minirl.algo.variants.scored import scored_group_advantages

    rewards = torch.tensor([[1.0, 0.0, 5.0, 2.0], [3.0, float("nan"), 9.0, 9.0], [7.0, 7.0, 7.0, 7.0]])
    scored = torch.tensor([[True, True, False, True], [True, False, False, False], [False] * 4])
    # group 0: mean over (1, 0, 2) = 1; group 1: mean 3 (its one scored response); group 2: none scored
    expected = torch.tensor([[0.0, -1.0, 0.0, 1.0], [0.0] * 4, [0.0] * 4])
    torch.testing.assert_close(scored_group_advantages(rewards, scored), expected, rtol=0, atol=0)
    # std over (1, 0, 2), unbiased: 1; group 1's std is undefined (one response): 0 for it
    torch.testing.assert_close(scored_group_advantages(rewards, scored, std_normalize=True),
                               torch.tensor([[0.0, -1.0 / (1 + 1e-6), 0.0, 1.0 / (1 + 1e-6)], [0.0] * 4, [0.0] * 4]),
                               rtol=0, atol=1e-7)
    # batch std over every scored reward (1, 0, 2, 3): mean 1.5, unbiased variance (0.25 + 2.25 + 0.25 + 2.25) / 3
    batch_std = (5.0 / 3) ** 0.5
    torch.testing.assert_close(scored_group_advantages(rewards, scored, std_normalize=True, std_scope="batch"),
                               torch.tensor([[0.0, -1.0, 0.0, 1.0], [0.0] * 4, [0.0] * 4]) / (batch_std + 1e-6),
                               rtol=0, atol=1e-6)
    with pytest.raises(FloatingPointError):  # a NaN in a scored reward is ours: loud
        scored_group_advantages(torch.tensor([[float("nan"), 1.0]]), torch.tensor([[True, True]]))


def test_leave_one_out_over_the_scored_others_and_whitening_over_the_scored_by_hand() -> None:
    """TRL 1.16's RLOO: the baseline is the mean of the scored others (none: advantage 0); normalize_advantages
    whitens over the scored responses, (A - mean) / (std + 1e-4), the unscored kept at 0."""
    from minirl.algo.variants.scored import defined_advantages, scored_group_advantages, scored_response_whiten

    rewards = torch.tensor([[1.0, 0.0, 5.0, 2.0], [3.0, 4.0, 9.0, 9.0]])
    scored = torch.tensor([[True, True, False, True], [True, False, False, False]])
    # group 0: 1 - (0 + 2)/2 = 0, 0 - (1 + 2)/2 = -1.5, 2 - (1 + 0)/2 = 1.5; group 1: one scored, no other: 0
    expected = torch.tensor([[0.0, -1.5, 0.0, 1.5], [0.0] * 4])
    got = scored_group_advantages(rewards, scored, baseline="leave_one_out")
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # whitened over (0, -1.5, 1.5): mean 0, unbiased std 1.5; group 1's lone scored response has no defined advantage
    kept = defined_advantages(scored, baseline="leave_one_out")
    assert kept.tolist() == [[True, True, False, True], [False] * 4]
    assert defined_advantages(scored).tolist() == scored.tolist()  # group mean: a lone response's is defined (0)
    assert defined_advantages(scored, std_normalize=True).tolist() == kept.tolist()  # its group's std is not
    flat = scored_response_whiten(got.reshape(-1), kept.reshape(-1))
    torch.testing.assert_close(flat, torch.tensor([0.0, -1.5, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0]) / (1.5 + 1e-4),
                               rtol=0, atol=1e-7)
    assert scored_response_whiten(torch.tensor([2.0, 1.0]), torch.tensor([True, False])).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="group_mean or leave_one_out"):
        scored_group_advantages(rewards, scored, baseline="none")
    # every response scored: group_advantages' values, for both baselines, with and without the std
    from minirl.algo import group_advantages

    every = torch.ones_like(scored)
    for baseline in ("group_mean", "leave_one_out"):
        for std_normalize in (False, True):
            for std_scope in ("group", "batch"):
                torch.testing.assert_close(
                    scored_group_advantages(rewards, every, std_normalize, std_scope=std_scope, baseline=baseline),
                    group_advantages(rewards, std_normalize, baseline=baseline, std_scope=std_scope),
                    rtol=1e-6, atol=1e-6)


def test_in_the_loop_unscored_responses_get_no_advantage() -> None:
    """``step_advantages``: a response whose every reward function returned None (NaN in each function's values)."""
    from types import SimpleNamespace

    from minirl.config import load_config
    from minirl.loop import step_advantages

    cfg = load_config(None, ["rollout.samples_per_prompt=3"])
    nan = float("nan")
    sampled = SimpleNamespace(prompts=["p"], rewards=torch.tensor([1.0, 0.0, 0.0]), greedy_rewards=None,
                              completions=[SimpleNamespace(completion_ids=[1, 2])] * 3,
                              reward_parts=torch.tensor([[1.0, nan], [nan, 0.0], [nan, nan]]))
    torch.testing.assert_close(step_advantages(cfg, sampled, torch.tensor([1.0, 1.0])), torch.tensor([0.5, -0.5, 0.0]))
    sampled.reward_parts = torch.tensor([[1.0, nan], [nan, 0.0], [0.0, nan]])  # all scored: as before
    torch.testing.assert_close(step_advantages(cfg, sampled, torch.tensor([1.0, 1.0])),
                               torch.tensor([2 / 3, -1 / 3, -1 / 3]))
    # TRL's RLOO (leave-one-out, whitened over its responses): over the two scored, 1 - 0 = 1 and 0 - 1 = -1, whitened
    # by their std sqrt(2); the unscored one stays 0
    cfg = load_config(None, ["rollout.samples_per_prompt=3", "algo.adv_baseline=leave_one_out", "algo.adv_whiten=true",
                             "algo.adv_whiten_over=responses"])
    sampled.reward_parts = torch.tensor([[1.0, nan], [nan, 0.0], [nan, nan]])
    torch.testing.assert_close(step_advantages(cfg, sampled, torch.tensor([1.0, 1.0])),
                               torch.tensor([1.0, -1.0, 0.0]) / (2 ** 0.5 + 1e-4))
    # whitened over the tokens with no response given an advantage (one scored in the group: no other): all 0, no error
    cfg = load_config(None, ["rollout.samples_per_prompt=3", "algo.adv_baseline=leave_one_out", "algo.adv_whiten=true"])
    sampled.reward_parts = torch.tensor([[1.0, nan], [nan, nan], [nan, nan]])
    assert step_advantages(cfg, sampled, torch.tensor([1.0, 1.0])).tolist() == [0.0, 0.0, 0.0]
