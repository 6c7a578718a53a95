"""Closed-form tests of ``cispo_loss`` ([P] = arXiv:2512.01374, Appendix A) against hand arithmetic.

Fixture (float64): rows 0 and 1 are one prompt (group id 7), row 2 another (group id 3).

            pi_theta (P)        pi_old (Q)        mu_old (Mu)          A     mask
    row 0   0.5  0.8  0.54      0.5 0.5 0.45      0.25 0.4  0.1       +2     T T T
    row 1   0.3  0.45 0.1       0.5 0.5 0.9       0.6  0.9  0.01      -1     T T F
    row 2   0.66 0.5  0.5       0.6 0.5 0.5       0.3  0.5  0.5       +0.5   T F F

    r = P/Q           row 0: 1  1.6   1.2    row 1: 0.6  0.9    row 2: 1.1
    clip(r, .8, 1.27) row 0: 1  1.27  1.2    row 1: 0.8  0.9    row 2: 1.1
    Q/Mu              row 0: 2  1.25  4.5    row 1: 5/6  5/9    row 2: 2

Group token counts: T_7 = 3 + 2 = 5, T_3 = 1; two groups.
"""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import LossInputs, cispo_loss

F64 = torch.float64
L = math.log


def _fixture() -> dict[str, torch.Tensor]:
    p = torch.tensor([[0.5, 0.8, 0.54], [0.3, 0.45, 0.1], [0.66, 0.5, 0.5]], dtype=F64)
    q = torch.tensor([[0.5, 0.5, 0.45], [0.5, 0.5, 0.9], [0.6, 0.5, 0.5]], dtype=F64)
    mu = torch.tensor([[0.25, 0.4, 0.1], [0.6, 0.9, 0.01], [0.3, 0.5, 0.5]], dtype=F64)
    return {
        "logp": p.log().requires_grad_(True),
        "logp_old": q.log(),
        "logp_rollout": mu.log(),
        "advantages": torch.tensor([2.0, -1.0, 0.5], dtype=F64),
        "mask": torch.tensor([[True, True, True], [True, True, False], [True, False, False]]),
        "group_ids": torch.tensor([7, 7, 3]),
    }


def _run(**knobs: object) -> tuple[float, torch.Tensor, dict[str, float]]:
    x = _fixture()
    loss, m = cispo_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"], x["group_ids"]), **knobs)
    loss.backward()
    return loss.item(), x["logp"].grad, m


def _close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=F64), atol=1e-9, rtol=0)


def test_cispo_default() -> None:
    g7 = 2 * (1 * L(0.5) + 1.27 * L(0.8) + 1.2 * L(0.54)) - (0.8 * L(0.3) + 0.9 * L(0.45))
    g3 = 0.5 * 1.1 * L(0.66)
    loss, grad, m = _run()
    assert loss == pytest.approx(-(g7 / 5 + g3 / 1) / 2, abs=1e-9)
    # -clip(r) A / (T_g * 2): row 0 -(1/10) 2 [1, 1.27, 1.2]; row 1 -(1/10)(-1)[0.8, 0.9]; row 2 -(1/2)(0.5)(1.1)
    # no token is masked: the clamped tokens (row 0 t1, row 1 t0) keep their gradient
    _close(grad, [[-0.2, -0.254, -0.24], [0.08, 0.09, 0.0], [-0.275, 0.0, 0.0]])
    assert m["clip_frac"] == pytest.approx(2 / 6, abs=1e-12)  # weights clamped at row 0 t1, row 1 t0
    assert m["clip_frac_pos"] == pytest.approx(1 / 4, abs=1e-12)
    assert m["clip_frac_neg"] == pytest.approx(1 / 2, abs=1e-12)
    assert m["ratio_old_mean"] == pytest.approx(6.4 / 6, abs=1e-9)
    assert m["is_weight_mean"] == 1.0 and m["is_truncated_frac"] == 0.0
    assert m["loss"] == pytest.approx(loss, abs=1e-12)


def test_cispo_with_train_infer_correction() -> None:
    # extra factor c = min(Q/Mu, 5): row 0 [2, 1.25, 4.5], row 1 [5/6, 5/9], row 2 [2]
    g7 = 2 * (2 * L(0.5) + 1.27 * 1.25 * L(0.8) + 1.2 * 4.5 * L(0.54)) - (0.8 * 5 / 6 * L(0.3) + 0.9 * 5 / 9 * L(0.45))
    g3 = 0.5 * 1.1 * 2 * L(0.66)
    loss, grad, m = _run(is_correction=True)
    assert loss == pytest.approx(-(g7 / 5 + g3) / 2, abs=1e-9)
    # row 0 -(1/10) 2 [2, 1.5875, 5.4]; row 1 -(1/10)(-1)[2/3, 0.5]; row 2 -(1/2)(0.5)(2.2)
    _close(grad, [[-0.4, -0.3175, -1.08], [1 / 15, 0.05, 0.0], [-0.55, 0.0, 0.0]])
    assert m["is_weight_max"] == pytest.approx(4.5, abs=1e-9)
    assert m["is_weight_mean"] == pytest.approx((2 + 1.25 + 4.5 + 5 / 6 + 5 / 9 + 2) / 6, abs=1e-9)


def test_cispo_correction_cap_binds() -> None:
    # cap 1.5 truncates row 0 t0 (2), row 0 t2 (4.5), row 2 t0 (2): 3 of 6
    _, _, m = _run(is_correction=True, tis_cap=1.5)
    assert m["is_truncated_frac"] == pytest.approx(0.5, abs=1e-12)
    assert m["is_weight_max"] == pytest.approx(1.5, abs=1e-12)


def test_cispo_normalizer_and_group_relabelling() -> None:
    g7 = 2 * (1 * L(0.5) + 1.27 * L(0.8) + 1.2 * L(0.54)) - (0.8 * L(0.3) + 0.9 * L(0.45))
    g3 = 0.5 * 1.1 * L(0.66)
    loss, _, _ = _run(normalizer=4.0)
    assert loss == pytest.approx(-(g7 / 5 + g3) / 4, abs=1e-9)
    x = _fixture()
    relabelled, _ = cispo_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"], torch.tensor([0, 0, 1])))
    assert relabelled.item() == pytest.approx(-(g7 / 5 + g3) / 2, abs=1e-9)


def test_cispo_one_group_is_a_token_mean() -> None:
    # all rows in one group: T = 6, one group
    x = _fixture()
    loss, _ = cispo_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"], torch.zeros(3, dtype=torch.long)))
    total = 2 * (1 * L(0.5) + 1.27 * L(0.8) + 1.2 * L(0.54)) - (0.8 * L(0.3) + 0.9 * L(0.45)) + 0.5 * 1.1 * L(0.66)
    assert loss.item() == pytest.approx(-total / 6, abs=1e-9)


def test_cispo_group_ids_are_validated() -> None:
    x = _fixture()
    args = (x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"])
    with pytest.raises(ValueError, match="group_ids"):
        cispo_loss(LossInputs(*args, torch.zeros(2, dtype=torch.long)))
    with pytest.raises(ValueError, match="group_ids"):
        cispo_loss(LossInputs(*args, torch.zeros(3)))


def test_cispo_with_a_masked_train_infer_factor() -> None:
    # c = Q/Mu inside [0, 3], else 0: row 0 [2, 1.25, 0], row 1 [5/6, 5/9], row 2 [2]
    # d loss / d logp = -clip(r) c A / (T_g N): group 7 / (5 * 2), group 3 / (1 * 2)
    loss, grad, m = _run(is_correction=True, tis_mode="mask", tis_cap=3.0)
    group7 = 4 * L(0.5) + 1.27 * 1.25 * 2 * L(0.8) - (2 / 3) * L(0.3) - 0.5 * L(0.45)
    assert loss == pytest.approx(-(group7 / 5 + 1.1 * L(0.66)) / 2, abs=1e-9)
    expected = [[-0.4, -1.27 * 1.25 * 2 / 10, 0.0], [0.8 * 5 / 6 / 10, 0.05, 0.0], [-0.55, 0.0, 0.0]]
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=F64), atol=1e-9, rtol=0)
    assert m["is_masked_frac"] == pytest.approx(1 / 6, abs=1e-12)


def test_cispo_with_opsm_drops_the_drifted_negative_response() -> None:
    # row 1 (A = -1, group 7) mean log(Q/P) ~ 0.308 > 0.3: its tokens leave; T_7 still counts them (a fixed normaliser)
    loss, grad, m = _run(opsm_threshold=0.3)
    assert loss == pytest.approx(-((2 * L(0.5) + 1.27 * 2 * L(0.8) + 1.2 * 2 * L(0.54)) / 5 + 1.1 * 0.5 * L(0.66)) / 2,
                                 abs=1e-9)
    assert grad[1].tolist() == [0.0, 0.0, 0.0] and m["opsm_masked_frac"] == pytest.approx(1 / 3, abs=1e-12)


def test_cispo_token_mean_with_no_lower_clip() -> None:
    # eps_low = 1: clip(r, 0, 1.27) = row 0 [1, 1.27, 1.2], row 1 [0.6 (not raised to 0.8), 0.9], row 2 [1.1];
    # token_mean over the 6 trained tokens: d loss / d logp = -w A / 6
    loss, grad, m = _run(eps_low=1.0, aggregation="token_mean")
    total = 2 * L(0.5) + 2.54 * L(0.8) + 2.4 * L(0.54) - 0.6 * L(0.3) - 0.9 * L(0.45) + 0.55 * L(0.66)
    assert loss == pytest.approx(-total / 6, abs=1e-9)
    expected = [[-2 / 6, -2.54 / 6, -2.4 / 6], [0.6 / 6, 0.9 / 6, 0.0], [-0.55 / 6, 0.0, 0.0]]
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=F64), atol=1e-9, rtol=0)
    assert m["clip_frac"] == pytest.approx(1 / 6, abs=1e-12)  # only row 0 t1 (1.6 > 1.27)
    with pytest.raises(ValueError, match="aggregation"):
        _run(aggregation="seq_sum")
