"""Closed-form tests of ``rejection_keep`` (verl's ``rollout_rs``, ``minirl.algo.variants.rejection``) against hand arithmetic.

The fixture of test_algo_minirl.py: rho = pi_old / mu_old

    row 0   2     1.25   4.5      (three trained tokens)
    row 1   5/6   5/9    -        (t2 padding: its mu_old 0.01 must not count)
"""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo.variants.rejection import REJECTION_RULES, rejection_keep
from minirl.config import MiniRLConfig

F64 = torch.float64
RHO = [[2.0, 1.25, 4.5], [5 / 6, 5 / 9]]
MASK = torch.tensor([[True, True, True], [True, True, False]])


def _keep(rule: str, low: float = 0.0, high: float = math.inf) -> list[list[bool]]:
    q = torch.tensor([[0.5, 0.5, 0.45], [0.5, 0.5, 0.9]], dtype=F64)
    mu = torch.tensor([[0.25, 0.4, 0.1], [0.6, 0.9, 0.01]], dtype=F64)
    return rejection_keep(q.log(), mu.log(), MASK, rule=rule, low=low, high=high).tolist()


def k2(r: float) -> float:
    return 0.5 * math.log(r) ** 2


def k3(r: float) -> float:
    return r - 1 - math.log(r)


def test_token_k1_keeps_each_ratio_inside_the_bounds():
    assert _keep("token_k1", 0.5, 2.0) == [[True, True, False], [True, True, False]]  # 2 <= 2 kept; 5/9 >= 0.5
    assert _keep("token_k1", 0.6, 4.0) == [[True, True, False], [True, False, False]]


def test_seq_sum_k1_bounds_the_product_and_seq_mean_k1_the_geometric_mean():
    # products: row 0 11.25, row 1 25/54 ~ 0.463; geometric means: 11.25^(1/3) ~ 2.241, (25/54)^(1/2) ~ 0.680
    assert _keep("seq_sum_k1", 0.0, 11.25) == [[True] * 3, [True, True, False]]
    assert _keep("seq_sum_k1", 0.5, 20.0) == [[True] * 3, [False] * 3]
    assert _keep("seq_mean_k1", 0.0, 2.2) == [[False] * 3, [True, True, False]]
    assert _keep("seq_mean_k1", 0.69, 2.3) == [[True] * 3, [False] * 3]


def test_k2_and_k3_bound_the_divergence_per_token_by_mean_or_by_max():
    assert [k2(r) < 0.1 for r in RHO[0] + RHO[1]] == [False, True, False, True, False]
    assert _keep("token_k2", high=0.1) == [[False, True, False], [True, False, False]]
    row0_k3 = [k3(r) for r in RHO[0]]  # 0.307, 0.027, 1.996: mean 0.777, max 1.996
    row1_k3 = [k3(r) for r in RHO[1]]  # 0.016, 0.143
    assert _keep("seq_max_k3", high=0.5) == [[False] * 3, [True, True, False]]
    assert _keep("seq_mean_k3", high=sum(row0_k3) / 3 + 1e-9) == [[True] * 3, [True, True, False]]
    assert _keep("seq_mean_k3", high=sum(row0_k3) / 3 - 1e-9) == [[False] * 3, [True, True, False]]
    assert _keep("seq_sum_k3", high=sum(row1_k3) + 1e-9) == [[False] * 3, [True, True, False]]
    assert _keep("seq_sum_k2", high=sum(k2(r) for r in RHO[1]) - 1e-9) == [[False] * 3, [False] * 3]


def test_the_rules_are_the_configs_and_an_unknown_one_is_refused():
    from typing import get_args

    assert REJECTION_RULES == get_args(MiniRLConfig.model_fields["reject"].annotation)[1:]
    with pytest.raises(ValueError, match="rule must be one of"):
        _keep("seq_max_k1")
