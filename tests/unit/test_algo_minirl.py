"""Closed-form tests of ``minirl_loss`` (Eq. (7) of arXiv:2512.01374) against hand arithmetic.

The fixture is two responses, three target positions, float64. Probabilities are chosen so that
every ratio is a round number:

            pi_theta (P)        pi_old (Q)        mu_old (Mu)          A    mask
    row 0   0.5  0.8  0.54      0.5 0.5 0.45      0.25 0.4  0.1       +2    T T T
    row 1   0.3  0.45 0.1       0.5 0.5 0.9       0.6  0.9  0.01      -1    T T F

    r  = P/Q   row 0: 1    1.6   1.2      row 1: 0.6  0.9   (masked)
    P/Mu       row 0: 2    2     5.4      row 1: 0.5  0.5   (masked)
    Q/Mu       row 0: 2    1.25  4.5      row 1: 5/6  5/9   (masked)

Clip mask with eps_low = 0.2, eps_high = 0.27: row 0 t1 (A > 0, r = 1.6 > 1.27) and row 1 t0
(A < 0, r = 0.6 < 0.8) have M = 0; all other trained tokens have M = 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import LossInputs, minirl_loss, to_floats

F64 = torch.float64
L = math.log


def _fixture(requires_grad: bool = True) -> dict[str, torch.Tensor]:
    p = torch.tensor([[0.5, 0.8, 0.54], [0.3, 0.45, 0.1]], dtype=F64)
    q = torch.tensor([[0.5, 0.5, 0.45], [0.5, 0.5, 0.9]], dtype=F64)
    mu = torch.tensor([[0.25, 0.4, 0.1], [0.6, 0.9, 0.01]], dtype=F64)
    return {
        "logp": p.log().requires_grad_(requires_grad),
        "logp_old": q.log(),
        "logp_rollout": mu.log(),
        "advantages": torch.tensor([2.0, -1.0], dtype=F64),
        "mask": torch.tensor([[True, True, True], [True, True, False]]),
    }


def _run(**knobs: object) -> tuple[float, torch.Tensor, dict[str, float]]:
    x = _fixture()
    loss, metrics = minirl_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"]), **knobs)
    loss.backward()
    return loss.item(), x["logp"].grad, metrics


def _close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=F64), atol=1e-9, rtol=0)


# --------------------------------------------------------------------------------------------
# each option, loss value and d loss / d logp (= -mask * M * w * A / N per token)
# --------------------------------------------------------------------------------------------


def test_default_full_placement_seq_sum() -> None:
    # w = min(P/Mu, 5): row 0 [2, 2, 5 (5.4 capped)], row 1 [0.5, 0.5]
    # sum M w A logp = 1*2*2*ln0.5 + 0 + 1*5*2*ln0.54 + 0 + 1*0.5*(-1)*ln0.45 ; N = B = 2
    loss, grad, _ = _run()
    assert loss == pytest.approx(-(4 * L(0.5) + 10 * L(0.54) - 0.5 * L(0.45)) / 2, abs=1e-9)
    # grad = -M w A / 2: row 0 [-2*2/2, 0, -5*2/2]; row 1 [0, -0.5*(-1)/2, 0 (masked)]
    _close(grad, [[-2.0, 0.0, -5.0], [0.0, 0.25, 0.0]])


def test_train_infer_placement() -> None:
    # w = min(Q/Mu, 5) * r: row 0 [2*1, 1.25*1.6, 4.5*1.2] = [2, 2, 5.4] (cap does not bind)
    #                       row 1 [5/6*0.6, 5/9*0.9] = [0.5, 0.5]
    loss, grad, m = _run(tis_placement="train_infer")
    assert loss == pytest.approx(-(4 * L(0.5) + 10.8 * L(0.54) - 0.5 * L(0.45)) / 2, abs=1e-9)
    _close(grad, [[-2.0, 0.0, -5.4], [0.0, 0.25, 0.0]])
    assert m["is_truncated_frac"] == 0.0
    assert m["is_weight_mean"] == pytest.approx((2 + 2 + 5.4 + 0.5 + 0.5) / 5, abs=1e-9)
    assert m["is_weight_max"] == pytest.approx(5.4, abs=1e-9)


def test_no_clip_keeps_every_token() -> None:
    # M = 1 everywhere; w full = [2, 2, 5], [0.5, 0.5]
    # sum = 4 ln0.5 + 4 ln0.8 + 10 ln0.54 - 0.5 ln0.3 - 0.5 ln0.45
    loss, grad, m = _run(clip=False)
    expected = -(4 * L(0.5) + 4 * L(0.8) + 10 * L(0.54) - 0.5 * L(0.3) - 0.5 * L(0.45)) / 2
    assert loss == pytest.approx(expected, abs=1e-9)
    _close(grad, [[-2.0, -2.0, -5.0], [0.25, 0.25, 0.0]])
    assert m["clip_frac"] == m["clip_frac_pos"] == m["clip_frac_neg"] == 0.0


def test_no_is_correction_uses_pi_old_in_place_of_mu() -> None:
    # w = min(P/Q, 5) = r: row 0 [1, 1.6, 1.2], row 1 [0.6, 0.9]; same clip mask as default
    # sum = 1*2 ln0.5 + 1.2*2 ln0.54 + 0.9*(-1) ln0.45
    loss, grad, m = _run(is_correction=False)
    assert loss == pytest.approx(-(2 * L(0.5) + 2.4 * L(0.54) - 0.9 * L(0.45)) / 2, abs=1e-9)
    _close(grad, [[-1.0, 0.0, -1.2], [0.0, 0.45, 0.0]])
    assert m["is_weight_mean"] == pytest.approx((1 + 1.6 + 1.2 + 0.6 + 0.9) / 5, abs=1e-9)
    # train_infer placement without correction: min(exp(0), 5) * r = r, identical
    loss2, grad2, _ = _run(is_correction=False, tis_placement="train_infer")
    assert loss2 == pytest.approx(loss, abs=1e-12)
    torch.testing.assert_close(grad2, grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize("tis_placement", ["full", "train_infer"])
def test_without_the_staleness_weight_w_is_the_bounded_train_infer_factor_alone(tis_placement: str) -> None:
    # w = min(Q/Mu, 5), whatever the placement: row 0 [2, 1.25, 4.5], row 1 [5/6, 5/9]; same clip mask as default
    # sum M w A logp = 2*2 ln0.5 + 4.5*2 ln0.54 + (5/9)*(-1) ln0.45
    loss, grad, m = _run(staleness_weight=False, tis_placement=tis_placement)
    assert loss == pytest.approx(-(4 * L(0.5) + 9 * L(0.54) - 5 / 9 * L(0.45)) / 2, abs=1e-9)
    _close(grad, [[-2.0, 0.0, -4.5], [0.0, 5 / 18, 0.0]])
    assert m["is_weight_mean"] == pytest.approx((2 + 1.25 + 4.5 + 5 / 6 + 5 / 9) / 5, abs=1e-9)
    # the cap acts on Q/Mu: at 3, row 0's 4.5 becomes 3
    loss, grad, m = _run(staleness_weight=False, tis_placement=tis_placement, tis_cap=3.0)
    _close(grad, [[-2.0, 0.0, -3.0], [0.0, 5 / 18, 0.0]])
    assert m["is_truncated_frac"] == pytest.approx(1 / 5, abs=1e-12)
    # and without the train-infer factor either: plain REINFORCE, w = 1 -> grad = -M A / 2
    loss, grad, m = _run(staleness_weight=False, is_correction=False, tis_placement=tis_placement)
    assert loss == pytest.approx(-(2 * L(0.5) + 2 * L(0.54) - L(0.45)) / 2, abs=1e-9)
    _close(grad, [[-1.0, 0.0, -1.0], [0.0, 0.5, 0.0]])
    assert m["is_weight_mean"] == m["is_weight_max"] == 1.0


def test_seq_mean_divides_each_response_by_its_length() -> None:
    # |y_0| = 3, |y_1| = 2; loss = -[(4 ln0.5 + 10 ln0.54)/3 + (-0.5 ln0.45)/2] / 2
    loss, grad, _ = _run(aggregation="seq_mean")
    assert loss == pytest.approx(-((4 * L(0.5) + 10 * L(0.54)) / 3 + (-0.5 * L(0.45)) / 2) / 2, abs=1e-9)
    # row 0: -w A / (3*2) = [-4/6, 0, -10/6]; row 1: -(0.5*(-1)) / (2*2) = 0.125
    _close(grad, [[-2 / 3, 0.0, -5 / 3], [0.0, 0.125, 0.0]])


def test_token_mean_divides_by_trained_token_count() -> None:
    # 5 trained tokens
    loss, grad, _ = _run(aggregation="token_mean")
    assert loss == pytest.approx(-(4 * L(0.5) + 10 * L(0.54) - 0.5 * L(0.45)) / 5, abs=1e-9)
    _close(grad, [[-0.8, 0.0, -2.0], [0.0, 0.1, 0.0]])


@pytest.mark.parametrize("aggregation", ["seq_sum", "token_mean"])
def test_explicit_normalizer_replaces_the_denominator(aggregation: str) -> None:
    loss, grad, _ = _run(aggregation=aggregation, normalizer=10.0)
    assert loss == pytest.approx(-(4 * L(0.5) + 10 * L(0.54) - 0.5 * L(0.45)) / 10, abs=1e-9)
    _close(grad, [[-0.4, 0.0, -1.0], [0.0, 0.05, 0.0]])


def test_seq_mean_with_normalizer() -> None:
    # [(4 ln0.5 + 10 ln0.54)/3 + (-0.5 ln0.45)/2] / 4
    loss, grad, _ = _run(aggregation="seq_mean", normalizer=4.0)
    assert loss == pytest.approx(-((4 * L(0.5) + 10 * L(0.54)) / 3 + (-0.5 * L(0.45)) / 2) / 4, abs=1e-9)
    _close(grad, [[-1 / 3, 0.0, -5 / 6], [0.0, 0.0625, 0.0]])


def test_tis_cap_binding_full() -> None:
    # cap 1.5: w = min(P/Mu, 1.5) = row 0 [1.5, 1.5, 1.5], row 1 [0.5, 0.5]; 3 of 5 truncated
    loss, grad, m = _run(tis_cap=1.5)
    assert loss == pytest.approx(-(1.5 * 2 * L(0.5) + 1.5 * 2 * L(0.54) - 0.5 * L(0.45)) / 2, abs=1e-9)
    _close(grad, [[-1.5, 0.0, -1.5], [0.0, 0.25, 0.0]])
    assert m["is_truncated_frac"] == pytest.approx(0.6, abs=1e-12)
    assert m["is_weight_max"] == pytest.approx(1.5, abs=1e-12)


def test_tis_cap_binding_train_infer() -> None:
    # cap 1.5 on Q/Mu: row 0 [min(2,1.5)=1.5, 1.25, min(4.5,1.5)=1.5] * r [1, 1.6, 1.2] = [1.5, 2, 1.8]
    #                  row 1 [5/6, 5/9] * r [0.6, 0.9] = [0.5, 0.5]; truncated: row 0 t0, t2 -> 2/5
    loss, grad, m = _run(tis_cap=1.5, tis_placement="train_infer")
    assert loss == pytest.approx(-(1.5 * 2 * L(0.5) + 1.8 * 2 * L(0.54) - 0.5 * L(0.45)) / 2, abs=1e-9)
    _close(grad, [[-1.5, 0.0, -1.8], [0.0, 0.25, 0.0]])
    assert m["is_truncated_frac"] == pytest.approx(0.4, abs=1e-12)


def test_infinite_tis_cap_disables_truncation() -> None:
    # w = P/Mu uncapped: row 0 t2 = 5.4
    loss, _grad, m = _run(tis_cap=math.inf)
    assert loss == pytest.approx(-(4 * L(0.5) + 10.8 * L(0.54) - 0.5 * L(0.45)) / 2, abs=1e-9)
    assert m["is_truncated_frac"] == 0.0


# --------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------


def test_metrics_default() -> None:
    loss, _, m = _run()
    assert set(m) == {
        "loss", "clip_frac", "clip_frac_pos", "clip_frac_neg", "is_truncated_frac",
        "is_weight_mean", "is_weight_max", "ratio_old_mean",
    }
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in m.values())  # the caller syncs once
    assert m["loss"] == pytest.approx(loss, abs=1e-12)
    assert m["clip_frac"] == pytest.approx(2 / 5, abs=1e-12)  # row 0 t1, row 1 t0
    assert m["clip_frac_pos"] == pytest.approx(1 / 3, abs=1e-12)  # 1 of row 0's 3 tokens
    assert m["clip_frac_neg"] == pytest.approx(1 / 2, abs=1e-12)  # 1 of row 1's 2 trained tokens
    assert m["is_truncated_frac"] == pytest.approx(1 / 5, abs=1e-12)  # P/Mu = 5.4 > 5
    assert m["is_weight_mean"] == pytest.approx((2 + 2 + 5 + 0.5 + 0.5) / 5, abs=1e-9)
    assert m["is_weight_max"] == pytest.approx(5.0, abs=1e-12)
    assert m["ratio_old_mean"] == pytest.approx((1 + 1.6 + 1.2 + 0.6 + 0.9) / 5, abs=1e-9)


def test_empty_mask_gives_zero_loss_and_zero_metrics() -> None:
    x = _fixture()
    loss, m = minirl_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], torch.zeros(2, 3, dtype=torch.bool)))
    loss.backward()
    assert loss.item() == 0.0
    assert all(v == 0.0 for v in m.values()), m
    assert torch.equal(x["logp"].grad, torch.zeros(2, 3, dtype=F64))


def test_zero_advantage_rows_count_in_neither_sign() -> None:
    x = _fixture()
    adv = torch.tensor([2.0, 0.0], dtype=F64)
    _, m = minirl_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], adv, x["mask"]))
    assert m["clip_frac_neg"] == 0.0  # no A < 0 token: empty selection -> 0.0
    assert m["clip_frac"] == pytest.approx(1 / 5, abs=1e-12)


# --------------------------------------------------------------------------------------------
# clip mask boundaries: strict inequalities
# --------------------------------------------------------------------------------------------


def _boundary(eps_low: float, eps_high: float) -> dict[str, float]:
    # row 0: A = +1, r = exp(ln 2) = 2 exactly; row 1: A = -1, r = exp(-ln 2) = 0.5 exactly
    logp_old = torch.zeros(2, 1, dtype=F64)
    logp = torch.tensor([[math.log(2.0)], [-math.log(2.0)]], dtype=F64)
    assert torch.exp(logp - logp_old).tolist() == [[2.0], [0.5]]  # precondition: exact ratios
    _, m = minirl_loss(
        LossInputs(logp, logp_old, logp_old, torch.tensor([1.0, -1.0], dtype=F64), torch.ones(2, 1, dtype=torch.bool)),
        eps_low=eps_low, eps_high=eps_high, tis_cap=math.inf,
    )
    return m


def test_ratio_exactly_on_the_clip_boundary_is_not_clipped() -> None:
    m = _boundary(eps_low=0.5, eps_high=1.0)  # r = 1 + eps_high and r = 1 - eps_low exactly
    assert m["clip_frac_pos"] == 0.0 and m["clip_frac_neg"] == 0.0


def test_ratio_just_past_the_boundary_is_clipped() -> None:
    m = _boundary(eps_low=0.49, eps_high=0.99)
    assert m["clip_frac_pos"] == 1.0 and m["clip_frac_neg"] == 1.0


def test_zero_eps_with_unit_ratio_is_not_clipped() -> None:
    z = torch.zeros(2, 2, dtype=F64)
    _, m = minirl_loss(LossInputs(z, z, z, torch.tensor([1.0, -1.0], dtype=F64), torch.ones(2, 2, dtype=torch.bool)), eps_low=0.0, eps_high=0.0)
    assert m["clip_frac"] == 0.0


def test_clip_ignores_the_wrong_sign() -> None:
    # A > 0 with a small ratio and A < 0 with a large ratio are never clipped
    logp = torch.tensor([[-math.log(2.0)], [math.log(2.0)]], dtype=F64)
    z = torch.zeros(2, 1, dtype=F64)
    _, m = minirl_loss(LossInputs(logp, z, z, torch.tensor([1.0, -1.0], dtype=F64), torch.ones(2, 1, dtype=torch.bool)))
    assert m["clip_frac"] == 0.0


# --------------------------------------------------------------------------------------------
# gradient flow, masking, invariants
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tis_placement", ["full", "train_infer"])
def test_gradient_flows_only_through_logp(tis_placement: str) -> None:
    x = _fixture()
    logp_old = x["logp_old"].clone().requires_grad_(True)
    logp_rollout = x["logp_rollout"].clone().requires_grad_(True)
    adv = x["advantages"].clone().requires_grad_(True)
    loss, _ = minirl_loss(LossInputs(x["logp"], logp_old, logp_rollout, adv, x["mask"]), tis_placement=tis_placement)
    loss.backward()
    assert x["logp"].grad is not None
    assert logp_old.grad is None and logp_rollout.grad is None and adv.grad is None


def test_padding_garbage_neither_leaks_nor_poisons_gradients() -> None:
    x = _fixture()
    base_loss, base_m = minirl_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"]))
    logp = x["logp"].detach().clone()
    logp[1, 2] = -math.inf
    logp.requires_grad_(True)
    logp_old = x["logp_old"].clone()
    logp_old[1, 2] = math.nan
    logp_rollout = x["logp_rollout"].clone()
    logp_rollout[1, 2] = math.inf
    loss, m = minirl_loss(LossInputs(logp, logp_old, logp_rollout, x["advantages"], x["mask"]))
    loss.backward()
    assert loss.item() == pytest.approx(base_loss.item(), abs=1e-12)
    assert to_floats(m) == pytest.approx(to_floats(base_m), abs=1e-12)
    assert torch.isfinite(logp.grad).all() and logp.grad[1, 2] == 0.0


@pytest.mark.parametrize("tis_placement", ["full", "train_infer"])
@pytest.mark.parametrize("is_correction", [True, False])
def test_on_policy_weight_is_one_and_nothing_clips(tis_placement: str, is_correction: bool) -> None:
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 4, generator=g, dtype=F64) * 3
    mask = torch.rand(3, 4, generator=g) > 0.3
    adv = torch.tensor([1.5, -0.5, 0.25], dtype=F64)
    logp = lp.clone().requires_grad_(True)
    loss, m = minirl_loss(LossInputs(logp, lp, lp, adv, mask), tis_placement=tis_placement, is_correction=is_correction)
    loss.backward()
    assert m["is_weight_mean"] == pytest.approx(1.0, abs=1e-12) and m["is_weight_max"] == pytest.approx(1.0, abs=1e-12)
    assert m["clip_frac"] == 0.0 and m["is_truncated_frac"] == 0.0
    assert m["ratio_old_mean"] == pytest.approx(1.0, abs=1e-12)
    # reduces to REINFORCE with a baseline: -sum(A * logp * mask) / B
    expected = -(adv[:, None] * lp * mask).sum() / 3
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    torch.testing.assert_close(logp.grad, -(adv[:, None] * mask) / 3, atol=1e-12, rtol=0)


def test_bfloat16_logp_is_upcast() -> None:
    x = _fixture(requires_grad=False)
    logp = x["logp"].to(torch.bfloat16).requires_grad_(True)
    loss, _ = minirl_loss(LossInputs(logp, x["logp_old"].float(), x["logp_rollout"].float(), x["advantages"].float(), x["mask"]))
    loss.backward()
    assert loss.dtype == torch.float32 and logp.grad.dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------
# fail loudly
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["logp", "logp_old", "logp_rollout"])
def test_nan_at_a_trained_token_raises(name: str) -> None:
    x = _fixture(requires_grad=False)
    x[name] = x[name].clone()
    x[name][0, 1] = math.nan
    with pytest.raises(FloatingPointError, match=name):
        minirl_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"]))


def test_nan_advantage_raises() -> None:
    x = _fixture()
    with pytest.raises(FloatingPointError, match="advantages"):
        minirl_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], torch.tensor([math.nan, 1.0], dtype=F64), x["mask"]))


@pytest.mark.parametrize(
    ("knobs", "name"),
    [
        ({"aggregation": "mean"}, "aggregation"),
        ({"tis_placement": "both"}, "tis_placement"),
        ({"eps_low": -0.1}, "eps_low"),
        ({"eps_high": -0.1}, "eps_high"),
        ({"tis_cap": 0.0}, "tis_cap"),
        ({"tis_cap": -1.0}, "tis_cap"),
        ({"normalizer": 0.0}, "normalizer"),
        ({"tis_mode": "clip"}, "tis_mode"),
        ({"tis_level": "batch"}, "tis_level"),
        ({"tis_floor": -1.0}, "tis_floor"),
        ({"tis_floor": 5.0}, "tis_floor"),
    ],
)
def test_bad_knobs_raise_value_error_naming_the_argument(knobs: dict[str, object], name: str) -> None:
    x = _fixture()
    with pytest.raises(ValueError, match=name):
        minirl_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"]), **knobs)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("logp_old", torch.zeros(2, 4, dtype=F64)),
        ("logp_rollout", torch.zeros(3, 3, dtype=F64)),
        ("advantages", torch.zeros(3, dtype=F64)),
        ("mask", torch.ones(2, 4, dtype=torch.bool)),
        ("mask", torch.ones(2, 3, dtype=torch.long)),
        ("logp", torch.zeros(2, 3, 1, dtype=F64)),
    ],
)
def test_shape_mismatch_raises_value_error_naming_the_argument(field: str, bad: torch.Tensor) -> None:
    x = _fixture(requires_grad=False)
    x[field] = bad
    with pytest.raises(ValueError, match=field):
        minirl_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"]))


def test_weight_exactly_at_the_cap_is_not_counted_truncated() -> None:
    # P/Mu = exp(ln 2 - 0) = 2 exactly, tis_cap = 2: min() changes nothing, so not "truncated"
    logp = torch.full((1, 2), math.log(2.0), dtype=F64)
    z = torch.zeros(1, 2, dtype=F64)
    assert torch.exp(logp).tolist() == [[2.0, 2.0]]
    _, m = minirl_loss(LossInputs(logp, logp, z, torch.ones(1, dtype=F64), torch.ones(1, 2, dtype=torch.bool)), tis_cap=2.0)
    assert m["is_truncated_frac"] == 0.0 and m["is_weight_max"] == 2.0
    _, m = minirl_loss(LossInputs(logp, logp, z, torch.ones(1, dtype=F64), torch.ones(1, 2, dtype=torch.bool)), tis_cap=1.999)
    assert m["is_truncated_frac"] == 1.0


# --------------------------------------------------------------------------------------------
# the IS weight masked (IcePop, TRL's *_mask) or per sequence (Eq. (2)'s weight, TRL's sequence_*)
# --------------------------------------------------------------------------------------------


def test_mask_mode_zeroes_a_weight_above_the_cap_instead_of_truncating_it() -> None:
    # full: P/Mu row 0 [2, 2, 5.4 -> 0 (> 3)], row 1 [0.5, 0.5]; M = 0 at row 0 t1 and row 1 t0
    loss, grad, m = _run(tis_mode="mask", tis_cap=3.0)
    assert loss == pytest.approx(-(4 * L(0.5) - 0.5 * L(0.45)) / 2, abs=1e-9)
    _close(grad, [[-2.0, 0.0, 0.0], [0.0, 0.25, 0.0]])
    assert m["is_masked_frac"] == pytest.approx(0.2, abs=1e-12) and "is_truncated_frac" not in m
    assert m["is_weight_mean"] == pytest.approx((2 + 2 + 0 + 0.5 + 0.5) / 5, abs=1e-9)


def test_mask_mode_floor_zeroes_a_weight_below_it() -> None:
    # [1, 3]: row 0 [2, 2, 0], row 1 [0 (0.5 < 1), 0]
    loss, grad, m = _run(tis_mode="mask", tis_cap=3.0, tis_floor=1.0)
    assert loss == pytest.approx(-(4 * L(0.5)) / 2, abs=1e-9)
    _close(grad, [[-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert m["is_masked_frac"] == pytest.approx(0.6, abs=1e-12)


def test_truncate_mode_floor_raises_a_small_weight_to_it() -> None:
    # TRL's clip_min: clamp(P/Mu, 1, 5) = row 0 [2, 2, 5], row 1 [1, 1]; bounded: row 0 t2 and row 1 t0, t1
    loss, grad, m = _run(tis_floor=1.0)
    assert loss == pytest.approx(-(4 * L(0.5) + 10 * L(0.54) - 1 * L(0.45)) / 2, abs=1e-9)
    _close(grad, [[-2.0, 0.0, -5.0], [0.0, 0.5, 0.0]])
    assert m["is_truncated_frac"] == pytest.approx(0.6, abs=1e-12)


def test_sequence_level_weight_is_the_truncated_product_of_the_responses_ratios() -> None:
    # row 0: 2 * 2 * 5.4 = 21.6 -> 5 on every token; row 1: 0.5 * 0.5 = 0.25 (its padded t2, P/Mu = 10, left out)
    loss, grad, m = _run(tis_level="sequence")
    assert loss == pytest.approx(-(5 * 2 * L(0.5) + 5 * 2 * L(0.54) - 0.25 * L(0.45)) / 2, abs=1e-9)
    _close(grad, [[-5.0, 0.0, -5.0], [0.0, 0.125, 0.0]])
    assert m["is_truncated_frac"] == pytest.approx(0.6, abs=1e-12)


def test_trl_default_sequence_mask_on_the_train_infer_factor() -> None:
    # TRL's sequence_mask, clip_max 3: Q/Mu products row 0 2 * 1.25 * 4.5 = 11.25 > 3 -> 0; row 1 5/6 * 5/9 = 25/54
    # kept; w = factor x r: row 1 t1 25/54 * 0.9 = 5/12 (t0 clipped); row 0 contributes nothing
    loss, grad, m = _run(tis_mode="mask", tis_cap=3.0, tis_level="sequence", tis_placement="train_infer")
    assert loss == pytest.approx((5 / 12) * L(0.45) / 2, abs=1e-9)
    _close(grad, [[0.0, 0.0, 0.0], [0.0, 5 / 24, 0.0]])
    assert m["is_masked_frac"] == pytest.approx(0.6, abs=1e-12)


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_a_sequence_ratio_beyond_float_range_is_bounded_without_nan(mode: str) -> None:
    # 3 tokens of log-ratio 400: exp(1200) is +inf; truncate -> the cap, mask -> 0; one of 0 (-400 each) likewise
    logp = torch.full((2, 3), -1.0, dtype=F64, requires_grad=True)
    rollout = torch.tensor([[-401.0] * 3, [399.0] * 3], dtype=F64)
    x = LossInputs(logp, logp.detach(), rollout, torch.tensor([1.0, -1.0], dtype=F64), torch.ones(2, 3, dtype=torch.bool))
    loss, _ = minirl_loss(x, tis_level="sequence", tis_mode=mode, tis_floor=0.5)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    expected = [[-2.5] * 3, [0.25] * 3] if mode == "truncate" else [[0.0] * 3, [0.0] * 3]  # -w A / 2
    _close(logp.grad, expected)


def test_opsm_drops_a_negative_response_that_drifted_from_mu() -> None:
    # row 1 (A = -1): mean log(Mu/P) = (ln(0.6/0.3) + ln(0.9/0.45)) / 2 = ln 2 ~ 0.693; row 0 has A > 0: always kept
    loss, grad, m = _run(opsm_threshold=0.5)
    assert loss == pytest.approx(-(4 * L(0.5) + 10 * L(0.54)) / 2, abs=1e-9)
    _close(grad, [[-2.0, 0.0, -5.0], [0.0, 0.0, 0.0]])
    assert m["opsm_masked_frac"] == 0.5
    _, grad, m = _run(opsm_threshold=0.7)  # ln 2 <= 0.7: kept, the default gradient
    _close(grad, [[-2.0, 0.0, -5.0], [0.0, 0.25, 0.0]])
    assert m["opsm_masked_frac"] == 0.0
    # without IS correction mu is pi_old: (ln(0.5/0.3) + ln(0.5/0.45)) / 2 ~ 0.308
    assert _run(is_correction=False, opsm_threshold=0.31)[2]["opsm_masked_frac"] == 0.0
    assert _run(is_correction=False, opsm_threshold=0.30)[2]["opsm_masked_frac"] == 0.5
    assert "opsm_masked_frac" not in _run()[2]


def test_dual_clip_masks_a_negative_token_whose_ratio_passed_c() -> None:
    # advantages [-2, -1]: row 0 r = [1, 1.6, 1.2] now with A < 0; c = 1.5 masks t1 (1.6 > 1.5); row 1 t0 still clipped
    x = _fixture()
    x["advantages"] = torch.tensor([-2.0, -1.0], dtype=F64)
    loss, m = minirl_loss(LossInputs(x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"]), dual_clip=1.5)
    loss.backward()
    # w = min(P/Mu, 5): row 0 [2, 2, 5], row 1 [0.5, 0.5]; grad = -M w A / 2
    assert loss.item() == pytest.approx(-(-4 * L(0.5) - 10 * L(0.54) - 0.5 * L(0.45)) / 2, abs=1e-9)
    _close(x["logp"].grad, [[2.0, 0.0, 5.0], [0.0, 0.25, 0.0]])
    assert m["clip_frac"] == pytest.approx(2 / 5, abs=1e-12) and m["clip_frac_neg"] == pytest.approx(2 / 5, abs=1e-12)
