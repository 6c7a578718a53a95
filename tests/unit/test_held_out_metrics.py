"""The held-out metrics: mean@n, the unbiased pass@k (Chen et al. 2021, Eq. 1) and verl's per-data-source split."""

from __future__ import annotations

import pytest
import torch

from minirl.loop import held_out_metrics

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
LENGTHS = torch.tensor([4.0] * 6 + [10.0] * 6)


def test_mean_at_n_and_pass_at_k_by_hand():
    out = held_out_metrics(REWARDS, LENGTHS, 1.0)
    assert out["eval/accuracy"] == 0.5 and out["eval/reward_mean"] == 0.5 and out["eval/response_length"] == 7.0
    # pass@2 per prompt: 1 - C(4 - c, 2) / C(4, 2): c = 2 -> 1 - 1/6, c = 0 -> 0, c = 4 -> 1
    assert out["eval/pass@2"] == pytest.approx((5 / 6 + 0 + 1) / 3, abs=1e-12)
    assert out["eval/pass@4"] == pytest.approx(2 / 3, abs=1e-12)  # any of the four correct
    assert sorted(k for k in out if "pass@" in k) == ["eval/pass@2", "eval/pass@4"]
    assert not any(k.count("/") > 1 for k in out)  # one data source (none named): no split


def test_pass_at_k_levels_and_one_sample():
    six = held_out_metrics(torch.tensor([[1.0, 0, 0, 0, 0, 0]]), torch.ones(6), 1.0)
    assert sorted(k for k in six if "pass@" in k) == ["eval/pass@2", "eval/pass@4", "eval/pass@6"]
    assert six["eval/pass@2"] == pytest.approx(1 - 10 / 15, abs=1e-12)  # 1 - C(5, 2) / C(6, 2)
    one = held_out_metrics(torch.tensor([[1.0], [0.0]]), torch.ones(2), 1.0)
    assert one == {"eval/accuracy": 0.5, "eval/reward_mean": 0.5, "eval/response_length": 1.0}  # greedy: no pass@k


def test_two_data_sources_are_reported_apart_as_verl_does():
    out = held_out_metrics(REWARDS, LENGTHS, 1.0, ["openai/gsm8k", "math", "openai/gsm8k"])
    assert out["eval/openai/gsm8k/accuracy"] == 0.75 and out["eval/math/accuracy"] == 0.0
    assert out["eval/openai/gsm8k/reward_mean"] == 0.75 and out["eval/accuracy"] == 0.5
    assert not any("/gsm8k/" in k for k in held_out_metrics(REWARDS, LENGTHS, 1.0, ["gsm8k"] * 3))
