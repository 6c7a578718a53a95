"""routing_agreement (set semantics, masks, -1 rows) and route_bytes_per_1k_tokens."""

from __future__ import annotations

import pytest
import torch

from minirl.moe import route_bytes_per_1k_tokens
from minirl.monitor import routing_agreement


def test_order_within_top_k_does_not_matter():
    a = torch.tensor([[[[1, 2], [3, 4]]]])  # [B=1, T=1, L=2, K=2]
    b = torch.tensor([[[[2, 1], [4, 3]]]])
    m = routing_agreement(a, b, torch.ones(1, 1, dtype=torch.bool))
    assert m["route_diff_frac"] == 0.0
    assert m["route_diff_frac_layer0"] == 0.0 and m["route_diff_frac_layer1"] == 0.0
    assert m["route_diff_any_layer_frac"] == 0.0


def test_fractions_overall_per_layer_and_any_layer():
    # B=1, T=4, L=2, K=2
    a = torch.tensor([[[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]]]])
    b = a.clone()
    b[0, 0, 0] = torch.tensor([0, 5])  # token 0 differs in layer 0
    b[0, 1, 1] = torch.tensor([3, 6])  # token 1 differs in layer 1
    b[0, 2, 0] = torch.tensor([1, 0])  # token 2: same set
    b[0, 3, 0] = torch.tensor([7, 6])  # token 3 differs in layer 0 and 1
    b[0, 3, 1] = torch.tensor([7, 6])
    m = routing_agreement(a, b, torch.ones(1, 4, dtype=torch.bool))
    assert m["route_diff_frac"] == pytest.approx(4 / 8)
    assert m["route_diff_frac_layer0"] == pytest.approx(2 / 4)
    assert m["route_diff_frac_layer1"] == pytest.approx(2 / 4)
    assert m["route_diff_any_layer_frac"] == pytest.approx(3 / 4)
    assert m["route_counted_pairs"] == 8


def test_mask_and_minus_one_rows_are_not_counted():
    a = torch.tensor([[[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]]]])  # B=1, T=4, L=1, K=2
    b = torch.tensor([[[[0, 2]], [[-1, -1]], [[4, 6]], [[6, 7]]]])
    valid = torch.tensor([[True, True, False, True]])
    m = routing_agreement(a, b, valid)
    # token 1 is -1 on one side, token 2 masked: counted tokens 0 (differs) and 3 (agrees)
    assert m["route_counted_pairs"] == 2
    assert m["route_diff_frac"] == pytest.approx(0.5)
    assert m["route_diff_any_layer_frac"] == pytest.approx(0.5)
    # -1 on the first side too
    m = routing_agreement(b, a, valid)
    assert m["route_diff_frac"] == pytest.approx(0.5)
    # nothing counted: zeros, not NaN
    m = routing_agreement(a, b, torch.zeros(1, 4, dtype=torch.bool))
    assert m["route_diff_frac"] == 0.0 and m["route_diff_any_layer_frac"] == 0.0 and m["route_counted_pairs"] == 0


def test_int16_inputs_and_shape_errors():
    a = torch.tensor([[[[1, 2]]]], dtype=torch.int16)
    assert routing_agreement(a, a.long(), torch.ones(1, 1, dtype=torch.bool))["route_diff_frac"] == 0.0
    with pytest.raises(ValueError, match="one shape"):
        routing_agreement(a, a[..., :1], torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="valid_mask"):
        routing_agreement(a, a, torch.ones(2, 1, dtype=torch.bool))


def test_route_bytes_per_1k_tokens():
    # Qwen3-30B-A3B: 48 MoE layers, top-8
    assert route_bytes_per_1k_tokens(48, 8, torch.int16) == 1000 * 48 * 8 * 2
    assert route_bytes_per_1k_tokens(2, 2) == 8000
    assert route_bytes_per_1k_tokens(2, 2, torch.int64) == 32000


def test_route_diff_counts_are_routing_agreements_counts_without_a_host_sync():
    """The trainer's per-micro-batch drift counts: the same (differing, counted) pairs as routing_agreement,
    as tensors, from the expert count it is given (no max over the routes)."""
    from minirl.monitor.routing import route_diff_counts

    a = torch.tensor([[[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]], [[0, 1], [-1, -1]]]])  # B=1, T=4, L=2, K=2
    b = a.clone()
    b[0, 0, 0] = torch.tensor([0, 5])  # differs (layer 0)
    b[0, 1, 1] = torch.tensor([3, 6])  # differs (layer 1)
    b[0, 2, 0] = torch.tensor([1, 0])  # same set
    b[0, 3, 0] = torch.tensor([7, 6])  # differs (layer 0); layer 1 is a -1 row: not counted
    valid = torch.tensor([[True, True, True, True]])
    differing, counted = route_diff_counts(a, b, valid, num_experts=8)
    assert (int(differing), int(counted)) == (3, 7)
    m = routing_agreement(a, b, valid)
    assert m["route_diff_frac"] * m["route_counted_pairs"] == pytest.approx(3) and m["route_counted_pairs"] == 7
    differing, counted = route_diff_counts(a, b, torch.tensor([[False, True, True, True]]), num_experts=8)
    assert (int(differing), int(counted)) == (2, 5)
