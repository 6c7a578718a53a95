"""Closed-form tests of ``gspo_loss`` (GSPO, arXiv:2507.18071, Eq. (5) and Eq. (7)).

logp_old = log 0.5 everywhere; logp = logp_old + delta, so token log-ratios are the deltas and
s_i = exp(mean of row i's trained deltas). d loss / d logp_{i,t} = -s_i A_i / (|y_i| N) for the
trained tokens of unclipped responses, 0 for clipped responses (GSPO Eq. (10)).
"""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import LossInputs, gspo_loss

F64 = torch.float64


def _call(deltas: list[list[float]], adv: list[float], mask: list[list[bool]], **knobs: object) -> tuple[float, torch.Tensor, dict[str, float]]:
    logp_old = torch.full((len(deltas), len(deltas[0])), math.log(0.5), dtype=F64)
    logp = (logp_old + torch.tensor(deltas, dtype=F64)).requires_grad_(True)
    loss, m = gspo_loss(
        LossInputs(logp, logp_old, logp_old.clone(), torch.tensor(adv, dtype=F64), torch.tensor(mask), torch.zeros(len(adv), dtype=torch.long)), **knobs
    )
    loss.backward()
    return loss.item(), logp.grad, m


def test_gspo_explicit_eps() -> None:
    # row 0: A = +1, deltas [0.3, -0.1, 0.1] -> s0 = e^0.1 = 1.105 in [0.8, 1.27]: term s0
    # row 1: A = -2, deltas [-0.5, -0.3], t2 masked -> s1 = e^-0.4 = 0.670 < 0.8: term min(-1.34, -1.6) = -1.6, clipped
    # row 2: no trained token: contributes 0, still counted in N = B = 3
    loss, grad, m = _call(
        [[0.3, -0.1, 0.1], [-0.5, -0.3, 9.0], [1.0, 1.0, 1.0]],
        [1.0, -2.0, 5.0],
        [[True, True, True], [True, True, False], [False, False, False]],
        eps_low=0.2, eps_high=0.27,
    )
    s0, s1 = math.exp(0.1), math.exp(-0.4)
    assert loss == pytest.approx(-(s0 - 1.6) / 3, abs=1e-12)
    g = -s0 / (3 * 3)  # -(1/N)(1/|y_0|) s0 A_0
    torch.testing.assert_close(grad, torch.tensor([[g, g, g], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64), atol=1e-12, rtol=0)
    assert m["clip_frac"] == pytest.approx(2 / 5, abs=1e-12)  # row 1's 2 tokens out of 5
    assert m["clip_frac_pos"] == 0.0
    assert m["clip_frac_neg"] == 1.0
    assert m["seq_clip_frac"] == pytest.approx(1 / 2, abs=1e-12)  # row 2 (empty) not counted
    assert m["seq_ratio_mean"] == pytest.approx((s0 + s1) / 2, abs=1e-12)
    r = [math.exp(d) for d in (0.3, -0.1, 0.1, -0.5, -0.3)]
    assert m["ratio_old_mean"] == pytest.approx(sum(r) / 5, abs=1e-12)
    assert m["loss"] == pytest.approx(loss, abs=1e-12)


def test_gspo_default_eps_are_the_papers() -> None:
    # defaults eps_low = 3e-4, eps_high = 4e-4 (GSPO §5.1); the rows sit between 3e-4 and 4e-4 so
    # that swapping or equalising the two bounds changes the answer
    # row 0: A = +1, mean delta 3.5e-4 -> s0 = e^3.5e-4 = 1.00035 <= 1.0004: unclipped, grad -s0/(3*2)
    # row 1: A = -1, mean delta -3.5e-4 -> s1 = 0.99965 < 1 - 3e-4: clipped, term -(1 - 3e-4)
    loss, grad, m = _call([[2.5e-4, 3.5e-4, 4.5e-4], [-3e-4, -4e-4, 0.0]], [1.0, -1.0], [[True, True, True], [True, True, False]])
    s0 = math.exp(3.5e-4)
    assert loss == pytest.approx(-(s0 - (1 - 3e-4)) / 2, abs=1e-12)
    g = -s0 / 6
    torch.testing.assert_close(grad, torch.tensor([[g, g, g], [0.0, 0.0, 0.0]], dtype=F64), atol=1e-12, rtol=0)
    assert m["seq_clip_frac"] == pytest.approx(0.5, abs=1e-12)
    # mean delta of 5e-4 > 4e-4 with A > 0: clipped, no gradient
    _, grad, m = _call([[5e-4, 5e-4, 5e-4]], [1.0], [[True, True, True]])
    assert torch.equal(grad, torch.zeros(1, 3, dtype=F64)) and m["seq_clip_frac"] == 1.0


def test_gspo_unclipped_negative_advantage_and_normalizer() -> None:
    # A = -2, deltas [-0.1, 0.0] -> s = e^-0.05 in range: term -2 s ; N = 4
    loss, grad, _ = _call([[-0.1, 0.0]], [-2.0], [[True, True]], eps_low=0.2, eps_high=0.27, normalizer=4.0)
    s = math.exp(-0.05)
    assert loss == pytest.approx(2 * s / 4, abs=1e-12)
    g = 2 * s / (2 * 4)  # -(1/N)(1/|y|) s A
    torch.testing.assert_close(grad, torch.tensor([[g, g]], dtype=F64), atol=1e-12, rtol=0)


def test_gspo_ignores_logp_rollout() -> None:
    logp_old = torch.full((1, 2), math.log(0.5), dtype=F64)
    logp = logp_old + 0.01
    args = (torch.tensor([1.0], dtype=F64), torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, dtype=torch.long))
    a, _ = gspo_loss(LossInputs(logp, logp_old, logp_old, *args))
    b, _ = gspo_loss(LossInputs(logp, logp_old, logp_old - 3.0, *args))
    assert a.item() == b.item()


def test_gspo_ratio_exactly_on_the_boundary_is_not_clipped() -> None:
    # one token, delta = ln 2 -> s = 2 exactly; eps_high = 1: on the boundary, kept, grad -s A = -2
    loss, grad, m = _call([[math.log(2.0)]], [1.0], [[True]], eps_low=0.2, eps_high=1.0)
    assert loss == pytest.approx(-2.0, abs=1e-12) and grad.item() == pytest.approx(-2.0, abs=1e-12)
    assert m["seq_clip_frac"] == 0.0 and m["clip_frac"] == 0.0
    # s = 0.5 exactly, A = -1, eps_low = 0.5: kept, grad -s A = +0.5
    loss, grad, m = _call([[-math.log(2.0)]], [-1.0], [[True]], eps_low=0.5, eps_high=0.27)
    assert loss == pytest.approx(0.5, abs=1e-12) and grad.item() == pytest.approx(0.5, abs=1e-12)
    assert m["seq_clip_frac"] == 0.0
    # just past the boundary: clipped, no gradient
    _, grad, m = _call([[math.log(2.0)]], [1.0], [[True]], eps_low=0.2, eps_high=0.99)
    assert grad.item() == 0.0 and m["seq_clip_frac"] == 1.0


def test_summed_sequence_ratio_is_the_product_of_the_token_ratios() -> None:
    # sequence_ratio="sum" (TRL's RLOOTrainer): s_i = exp(sum of row i's trained deltas), no 1/|y_i|
    # row 0: A = +1, deltas [0.1, -0.05, 0.05] -> s0 = e^0.1 in [0.8, 1.27]: term s0, grad -s0 / N on each token
    # row 1: A = -2, deltas [-0.1, -0.05], t2 masked -> s1 = e^-0.15 = 0.861 >= 0.8: unclipped, term -2 s1
    #        (GSPO's mean would give e^-0.075; the sum differs)
    # row 2: A = +1, deltas [0.2, 0.1, 0.05] -> s2 = e^0.35 = 1.419 > 1.27: clipped, term 1.27, no gradient
    loss, grad, m = _call(
        [[0.1, -0.05, 0.05], [-0.1, -0.05, 9.0], [0.2, 0.1, 0.05]],
        [1.0, -2.0, 1.0],
        [[True, True, True], [True, True, False], [True, True, True]],
        eps_low=0.2, eps_high=0.27, sequence_ratio="sum",
    )
    s0, s1 = math.exp(0.1), math.exp(-0.15)
    assert loss == pytest.approx(-(s0 - 2 * s1 + 1.27) / 3, abs=1e-12)
    expected = torch.tensor([[-s0 / 3] * 3, [2 * s1 / 3, 2 * s1 / 3, 0.0], [0.0] * 3], dtype=F64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)
    assert m["seq_clip_frac"] == pytest.approx(1 / 3, abs=1e-12)
    assert m["seq_ratio_mean"] == pytest.approx((s0 + s1 + math.exp(0.35)) / 3, abs=1e-12)
    with pytest.raises(ValueError, match="sequence_ratio='median'"):
        _call([[0.0]], [1.0], [[True]], sequence_ratio="median")
