"""DAPO's dynamic sampling (``rollout.filter_groups``, ``minirl.dynamic_sampling``): which groups are kept, in
which order, how a short batch is topped up, and what ``filter/*`` says — on hand-made rounds."""

from __future__ import annotations

import pytest
import torch

from minirl.dynamic_sampling import has_spread, merge_reward_stats, round_limit, sample_groups
from minirl.types import Completion, Prompt

G = 3
#: the rewards each prompt's G samples get, by prompt number; p0 all right, p2 all wrong, the others differ
REWARDS = {0: [1.0, 1.0, 1.0], 1: [0.0, 1.0, 0.0], 2: [0.0, 0.0, 0.0], 3: [1.0, 0.5, 1.0], 4: [0.0, 0.0, 1.0],
           5: [1.0, 0.0, 0.0], 6: [1.0, 1.0, 1.0], 7: [0.0, 0.0, 0.0]}


def _fakes():
    """``draw`` / ``generate`` / ``score`` over prompts p0, p1, ... in order; what each was called with."""
    calls = {"draw": [], "rounds": []}
    drawn = iter(range(100))

    def draw(count):
        calls["draw"].append(count)
        return [Prompt(text=f"p{next(drawn)}", answer="") for _ in range(count)]

    def generate(prompts, round_index):
        calls["rounds"].append(round_index)
        return [Completion(prompt_index=i, sample_index=g, prompt_ids=[1], completion_ids=[2] * (g + 1),
                           logp_rollout=torch.zeros(g + 1), finish_reason="stop", text=f"{p.text}/{g}")
                for i, p in enumerate(prompts) for g in range(G)]

    def score(prompts, completions):
        rewards = torch.tensor([REWARDS[int(c.text[1:].split("/")[0])][c.sample_index] for c in completions])
        stats = {"reward/errors": 1.0, "reward/fallback_frac": 0.5 * len(calls["rounds"])}
        return rewards, stats, [{"seen": c.text} for c in completions]

    return draw, generate, score, calls


def test_a_group_is_kept_when_its_metric_differs_between_samples():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.5], [1.0, 1.2, 1.0], [0.3, 0.3, 0.9]])
    assert has_spread(rewards, "reward", 1.0).tolist() == [False, True, False, True, True]
    # correctness = reward >= 1.0: 1.0 and 1.2 are both right, 0.3 and 0.9 both wrong
    assert has_spread(rewards, "accuracy", 1.0).tolist() == [False, True, False, False, False]
    assert has_spread(rewards, "accuracy", 0.5).tolist() == [False, True, False, False, True]


def test_rounds_run_until_enough_groups_with_a_spread_are_kept_and_the_surplus_is_dropped():
    draw, generate, score, calls = _fakes()
    out = sample_groups(draw, generate, score, groups=3, prompts_per_round=2, max_rounds=10, metric="reward",
                        accuracy_threshold=1.0)
    # round 0: p0 (flat), p1 (kept); round 1: p2 (flat), p3 (kept); round 2: p4, p5 kept -> p5 is surplus
    assert calls == {"draw": [2, 2, 2], "rounds": [0, 1, 2]}
    assert [p.text for p in out.prompts] == ["p1", "p3", "p4"]
    assert [(c.prompt_index, c.sample_index, c.text) for c in out.completions] == [
        (k, g, f"{p}/{g}") for k, p in enumerate(["p1", "p3", "p4"]) for g in range(G)]  # group-major, re-indexed
    assert out.rewards.tolist() == REWARDS[1] + REWARDS[3] + REWARDS[4]
    assert [c["seen"] for c in out.columns] == [c.text for c in out.completions]  # columns follow their samples
    assert out.generated_tokens == 6 * (1 + 2 + 3)  # every sample of the 6 groups generated, surplus included
    mean_all = sum(sum(REWARDS[p]) for p in range(6)) / 18
    assert out.reward_stats == {
        "reward/errors": 3.0, "reward/fallback_frac": pytest.approx((0.5 + 1.0 + 1.5) / 3),  # counts add, means average
        "filter/rounds": 3.0, "filter/kept_groups_frac": pytest.approx(4 / 6), "filter/topped_up_groups": 0.0,
        "filter/reward_mean_generated": pytest.approx(mean_all, abs=1e-6)}


def test_a_batch_still_short_after_the_last_round_is_topped_up_with_the_flat_groups_drawn_first():
    draw, generate, score, calls = _fakes()
    out = sample_groups(draw, generate, score, groups=3, prompts_per_round=2, max_rounds=2, metric="reward",
                        accuracy_threshold=1.0)
    assert calls["rounds"] == [0, 1]
    assert [p.text for p in out.prompts] == ["p1", "p3", "p0"]  # p0 before p2: drawn first
    assert out.reward_stats["filter/topped_up_groups"] == 1.0 and out.reward_stats["filter/kept_groups_frac"] == 0.5
    assert [c.prompt_index for c in out.completions] == [0] * G + [1] * G + [2] * G


def test_accuracy_keeps_only_groups_whose_correctness_differs():
    draw, generate, score, _ = _fakes()
    out = sample_groups(draw, generate, score, groups=2, prompts_per_round=4, max_rounds=10, metric="accuracy",
                        accuracy_threshold=1.0)
    # p3's rewards 1.0 / 0.5 / 1.0 differ, and so does its correctness; round 0 keeps p1 and p3
    assert [p.text for p in out.prompts] == ["p1", "p3"] and out.reward_stats["filter/rounds"] == 1.0
    out = sample_groups(*_fakes()[:3], groups=2, prompts_per_round=4, max_rounds=10, metric="accuracy",
                        accuracy_threshold=0.5)  # now 0.5 counts as correct: p3 is all right, flat
    assert [p.text for p in out.prompts] == ["p1", "p4"] and out.reward_stats["filter/rounds"] == 2.0


def test_reward_stats_of_rounds_merge_counts_by_sum_and_means_by_mean():
    merged = merge_reward_stats([{"reward/errors": 1.0, "reward/timeouts": 0.0, "reward/f/mean": 0.5},
                                 {"reward/errors": 2.0, "reward/timeouts": 1.0, "reward/f/mean": 1.0, "reward/g/mean": 0.2}])
    assert merged == {"reward/errors": 3.0, "reward/timeouts": 1.0, "reward/f/mean": 0.75, "reward/g/mean": 0.2}


def test_no_round_limit_means_one_pass_over_the_training_prompts():
    assert round_limit(0, 100, 8) == 13 and round_limit(0, 5, 8) == 1 and round_limit(4, 100, 8) == 4


def test_each_reward_functions_values_follow_their_kept_groups():
    """For GDPO (``algo.multi_objective_aggregation``) a score may also give each function's values [n, K]: the
    kept groups' rows, in the batch's order; a round without them leaves the batch without them."""
    draw, generate, score, _ = _fakes()

    def with_parts(prompts, completions):
        rewards, stats, columns = score(prompts, completions)
        return rewards, stats, columns, torch.stack([rewards, 10 + rewards], dim=1)

    out = sample_groups(draw, generate, with_parts, groups=3, prompts_per_round=2, max_rounds=10, metric="reward",
                        accuracy_threshold=1.0)
    expected = torch.tensor(REWARDS[1] + REWARDS[3] + REWARDS[4])
    assert torch.equal(out.reward_parts, torch.stack([expected, 10 + expected], dim=1))
    plain = sample_groups(*_fakes()[:3], groups=3, prompts_per_round=2, max_rounds=10, metric="reward",
                          accuracy_threshold=1.0)
    assert plain.reward_parts is None
