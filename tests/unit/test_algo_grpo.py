"""Closed-form tests of ``grpo_loss`` ([P] = arXiv:2512.01374, Appendix A) against hand arithmetic.

Fixture (float64), same probabilities as test_algo_minirl.py:

            pi_theta (P)        pi_old (Q)        mu_old (Mu)          A    mask
    row 0   0.5  0.8  0.54      0.5 0.5 0.45      0.25 0.4  0.1       +2    T T T
    row 1   0.3  0.45 0.1       0.5 0.5 0.9       0.6  0.9  0.01      -1    T T F

    r = P/Q    row 0: 1    1.6   1.2      row 1: 0.6  0.9
    Q/Mu       row 0: 2    1.25  4.5      row 1: 5/6  5/9

Token surrogate min(r A, clip(r, 0.8, 1.27) A):
    row 0 (A = 2):  t0 min(2, 2) = 2 ; t1 min(3.2, 2.54) = 2.54 (clipped) ; t2 min(2.4, 2.4) = 2.4
    row 1 (A = -1): t0 min(-0.6, -0.8) = -0.8 (clipped) ; t1 min(-0.9, -0.9) = -0.9
d surrogate / d logp = r A when unclipped (d r / d logp = r), 0 when clipped.
"""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import LossInputs, grpo_loss

F64 = torch.float64


def _fixture() -> dict[str, torch.Tensor]:
    p = torch.tensor([[0.5, 0.8, 0.54], [0.3, 0.45, 0.1]], dtype=F64)
    q = torch.tensor([[0.5, 0.5, 0.45], [0.5, 0.5, 0.9]], dtype=F64)
    mu = torch.tensor([[0.25, 0.4, 0.1], [0.6, 0.9, 0.01]], dtype=F64)
    return {
        "logp": p.log().requires_grad_(True),
        "logp_old": q.log(),
        "logp_rollout": mu.log(),
        "advantages": torch.tensor([2.0, -1.0], dtype=F64),
        "mask": torch.tensor([[True, True, True], [True, True, False]]),
        "group_ids": torch.tensor([0, 0]),
    }


def _run(**knobs: object) -> tuple[float, torch.Tensor, dict[str, float]]:
    x = _fixture()
    loss, m = grpo_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"], x["group_ids"]), **knobs)
    loss.backward()
    return loss.item(), x["logp"].grad, m


def _close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=F64), atol=1e-9, rtol=0)


def test_grpo_default() -> None:
    # row 0: (2 + 2.54 + 2.4) / 3 ; row 1: (-0.8 - 0.9) / 2 ; mean over B = 2 responses
    loss, grad, m = _run()
    assert loss == pytest.approx(-(6.94 / 3 - 1.7 / 2) / 2, abs=1e-9)
    # -(1/2)(1/|y_i|) r A: row 0 -(1/6)[2, 0, 2.4] ; row 1 -(1/4)[0, -0.9]
    _close(grad, [[-1 / 3, 0.0, -0.4], [0.0, 0.225, 0.0]])
    assert m["clip_frac"] == pytest.approx(2 / 5, abs=1e-12)
    assert m["clip_frac_pos"] == pytest.approx(1 / 3, abs=1e-12)
    assert m["clip_frac_neg"] == pytest.approx(1 / 2, abs=1e-12)
    assert m["ratio_old_mean"] == pytest.approx(5.3 / 5, abs=1e-9)
    assert m["is_weight_mean"] == m["is_weight_max"] == 1.0 and m["is_truncated_frac"] == 0.0
    assert m["loss"] == pytest.approx(loss, abs=1e-12)


def test_grpo_with_train_infer_correction() -> None:
    # c = min(Q/Mu, 5): row 0 [2, 1.25, 4.5], row 1 [5/6, 5/9]
    # row 0: 2*2 + 1.25*2.54 + 4.5*2.4 = 17.975 ; row 1: (5/6)(-0.8) + (5/9)(-0.9) = -7/6
    loss, grad, m = _run(is_correction=True)
    assert loss == pytest.approx(-(17.975 / 3 - 7 / 12) / 2, abs=1e-9)
    # row 0: -(1/6)[2*2, 0, 4.5*2.4] ; row 1: -(1/4)[0, (5/9)(0.9)(-1)]
    _close(grad, [[-2 / 3, 0.0, -1.8], [0.0, 0.125, 0.0]])
    assert m["is_weight_mean"] == pytest.approx((2 + 1.25 + 4.5 + 5 / 6 + 5 / 9) / 5, abs=1e-9)
    assert m["is_weight_max"] == pytest.approx(4.5, abs=1e-9)
    assert m["is_truncated_frac"] == 0.0


def test_grpo_correction_cap_binds() -> None:
    # cap 1.5: c row 0 [1.5, 1.25, 1.5]; row 1 unchanged; truncated: row 0 t0, t2 -> 2/5
    loss, grad, m = _run(is_correction=True, tis_cap=1.5)
    row0 = 1.5 * 2 + 1.25 * 2.54 + 1.5 * 2.4
    assert loss == pytest.approx(-(row0 / 3 - 7 / 12) / 2, abs=1e-9)
    _close(grad, [[-0.5, 0.0, -0.6], [0.0, 0.125, 0.0]])
    assert m["is_truncated_frac"] == pytest.approx(0.4, abs=1e-12)


def test_grpo_normalizer() -> None:
    loss, grad, _ = _run(normalizer=4.0)
    assert loss == pytest.approx(-(6.94 / 3 - 1.7 / 2) / 4, abs=1e-9)
    _close(grad, [[-1 / 6, 0.0, -0.2], [0.0, 0.1125, 0.0]])


def _single(ratio_log: float, adv: float, eps_low: float, eps_high: float) -> tuple[float, float]:
    logp = torch.tensor([[ratio_log]], dtype=F64, requires_grad=True)
    z = torch.zeros(1, 1, dtype=F64)
    loss, m = grpo_loss(LossInputs(logp, z, z, torch.tensor([adv], dtype=F64), torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.long)), eps_low=eps_low, eps_high=eps_high)
    loss.backward()
    # the clip metric must agree with the gradient: clipped <=> zero gradient (when A != 0)
    assert m["clip_frac"] == (1.0 if logp.grad.item() == 0.0 else 0.0)
    return loss.item(), logp.grad.item()


def test_grpo_boundary_keeps_gradient_and_past_it_drops_it() -> None:
    # r = 2 exactly, A = 1: on the boundary (eps_high = 1) the gradient is r A = 2 -> d loss = -2
    loss, g = _single(math.log(2.0), 1.0, 0.2, 1.0)
    assert loss == pytest.approx(-2.0, abs=1e-12) and g == pytest.approx(-2.0, abs=1e-12)
    loss, g = _single(math.log(2.0), 1.0, 0.2, 0.99)
    assert loss == pytest.approx(-1.99, abs=1e-12) and g == 0.0
    # r = 0.5, A = -1: boundary eps_low = 0.5 keeps gradient r A = -0.5 -> d loss = +0.5
    loss, g = _single(-math.log(2.0), -1.0, 0.5, 0.27)
    assert loss == pytest.approx(0.5, abs=1e-12) and g == pytest.approx(0.5, abs=1e-12)
    loss, g = _single(-math.log(2.0), -1.0, 0.49, 0.27)
    assert loss == pytest.approx(0.51, abs=1e-12) and g == 0.0


def test_grpo_wrong_side_of_the_clip_is_not_clipped() -> None:
    # A > 0 with r = 0.5: min(0.5, 0.8) = 0.5, gradient r A = 0.5 ; A < 0 with r = 2: min(-2, -1.27) = -2
    loss, g = _single(-math.log(2.0), 1.0, 0.2, 0.27)
    assert loss == pytest.approx(-0.5, abs=1e-12) and g == pytest.approx(-0.5, abs=1e-12)
    loss, g = _single(math.log(2.0), -1.0, 0.2, 0.27)
    assert loss == pytest.approx(2.0, abs=1e-12) and g == pytest.approx(2.0, abs=1e-12)


def test_grpo_bad_knobs() -> None:
    x = _fixture()
    args = (x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"], x["group_ids"])
    for knobs, name in (({"eps_low": -1.0}, "eps_low"), ({"tis_cap": 0.0}, "tis_cap"), ({"normalizer": -2.0}, "normalizer")):
        with pytest.raises(ValueError, match=name):
            grpo_loss(LossInputs(*args), **knobs)


def test_grpo_with_a_masked_train_infer_factor() -> None:
    # c = Q/Mu inside [0, 3], else 0: row 0 [2, 1.25, 0 (4.5)], row 1 [5/6, 5/9]
    # row 0: (2*2 + 1.25*2.54 + 0) / 3 ; row 1: (5/6*(-0.8) + 5/9*(-0.9)) / 2 = -7/12
    loss, grad, m = _run(is_correction=True, tis_mode="mask", tis_cap=3.0)
    assert loss == pytest.approx(-(7.175 / 3 - 7 / 12) / 2, abs=1e-9)
    # -(1/2)(1/|y_i|) c r A on unclipped tokens: row 0 t0 -(1/6)*2*2 ; row 1 t1 -(1/4)*(5/9)*0.9*(-1)
    _close(grad, [[-2 / 3, 0.0, 0.0], [0.0, 0.125, 0.0]])
    assert m["is_masked_frac"] == pytest.approx(0.2, abs=1e-12)


def test_grpo_with_a_sequence_level_train_infer_factor() -> None:
    # c per response: row 0 min(2 * 1.25 * 4.5 = 11.25, 5) = 5 ; row 1 5/6 * 5/9 = 25/54
    loss, grad, m = _run(is_correction=True, tis_level="sequence")
    assert loss == pytest.approx(-(5 * 6.94 / 3 - (25 / 54) * 1.7 / 2) / 2, abs=1e-9)
    _close(grad, [[-5 / 3, 0.0, -2.0], [0.0, (25 / 54) * 0.9 / 4, 0.0]])
    assert m["is_truncated_frac"] == pytest.approx(0.6, abs=1e-12)


def test_grpo_with_opsm_drops_the_drifted_negative_response() -> None:
    # no IS correction: mu is pi_old; row 1 (A = -1) mean log(Q/P) = (ln(0.5/0.3) + ln(0.5/0.45)) / 2 ~ 0.308 > 0.3
    loss, grad, m = _run(opsm_threshold=0.3)
    assert loss == pytest.approx(-(6.94 / 3) / 2, abs=1e-9)
    _close(grad, [[-1 / 3, 0.0, -0.4], [0.0, 0.0, 0.0]])
    assert m["opsm_masked_frac"] == 0.5


def test_grpo_dual_clip_holds_a_negative_tokens_loss_at_c() -> None:
    # advantages [-2, -1]; A max(r, clip r): row 0 [-2, -3.2 -> -3 (r 1.6 > c = 1.5: constant), -2.4], row 1 [-0.8, -0.9]
    x = _fixture()
    x["advantages"] = torch.tensor([-2.0, -1.0], dtype=F64)
    loss, m = grpo_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"], x["group_ids"]),
                        dual_clip=1.5)
    loss.backward()
    assert loss.item() == pytest.approx(-(-7.4 / 3 - 1.7 / 2) / 2, abs=1e-9)
    _close(x["logp"].grad, [[1 / 3, 0.0, 0.4], [0.0, 0.225, 0.0]])  # -(1/2)(1/|y|) r A where not clipped
    assert m["clip_frac"] == pytest.approx(2 / 5, abs=1e-12)
