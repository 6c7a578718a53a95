"""``group_advantages``: mean-centred group baseline ([P] §4.1), optional std division (Appendix A)."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import group_advantages

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
    with pytest.raises(ValueError, match="leave-one-out"):
        group_advantages(torch.tensor([[3.0], [1.0]]), baseline="leave_one_out")


def test_batch_scope_divides_by_the_std_of_every_reward_of_the_step() -> None:
    # rewards 1, 0, 0, 1, 3, 1, 2, 2: mean 1.25, unbiased variance (3 x 0.0625 + 2 x 1.5625 + 3.0625 + 2 x 0.5625) / 7 = 7.5/7
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]], dtype=torch.float64)
    std = math.sqrt(7.5 / 7)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]], dtype=torch.float64) / (std + 1e-6)
    torch.testing.assert_close(group_advantages(r, std_normalize=True, std_scope="batch"), expected, atol=1e-12, rtol=0)
    assert torch.equal(group_advantages(r, std_scope="batch"), group_advantages(r))  # no std: nothing to scope
