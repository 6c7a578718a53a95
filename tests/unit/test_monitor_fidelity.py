"""minirl.monitor.fidelity: hand-computed residuals, ESS / chi^2, the Eq. (2) loss's gradient, cosine."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import LossInputs, minirl_loss
from minirl.monitor import cosine, first_order_residual, importance_weight_stats, sequence_is_loss

F64 = torch.float64


def _logs(*rows: list[float], width: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Log of right-padded ratio rows [B, width] (padding NaN: must never leak) and the mask."""
    out = torch.full((len(rows), width), math.nan, dtype=F64)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=F64).log()
        mask[i, : len(row)] = True
    return out, mask


# ----------------------------------------------------------------------------- first_order_residual


def test_residual_of_one_response_by_hand():
    # delta = (0.1, -0.2): prod (1 + delta) = 1.1 * 0.8 = 0.88, 1 + sum delta = 0.9, gap 0.02
    log_total, mask = _logs([1.1, 0.8])
    log_ti, _ = _logs([1.05, 0.9])  # pi_old / mu_old: 0.945 vs 1 + 0.05 - 0.1 = 0.95, gap 0.005
    logp_rollout = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=F64)
    logp_old = logp_rollout + log_ti
    logp = logp_rollout + log_total
    m = first_order_residual(logp, logp_old, logp_rollout, mask)
    for stat in ("mean", "p50", "p90", "max"):  # one response: every statistic is its |gap|
        assert m[f"residual/total_{stat}"] == pytest.approx(0.02, abs=1e-12)
        assert m[f"residual/train_infer_{stat}"] == pytest.approx(0.005, abs=1e-12)
        # staleness pi/pi_old = (22/21, 8/9): prod 176/189, 1 + 1/21 - 1/9 = 177/189, gap 1/189
        assert m[f"residual/staleness_{stat}"] == pytest.approx(1 / 189, abs=1e-12)
    assert len(m) == 12


def test_residual_statistics_over_responses_skip_empty_rows_and_padding():
    # |gap| per response: (1.1, 0.8) -> 0.02; one token -> 0 exactly; (1.5, 1.5) -> 2.25 - 2 = 0.25
    log_total, mask = _logs([1.1, 0.8], [1.3], [1.5, 1.5], [])
    zeros = torch.zeros_like(log_total)
    garbage = torch.where(mask, zeros, torch.full_like(zeros, math.inf))  # inf at padding: ignored
    m = first_order_residual(log_total, garbage, garbage, mask)  # pi_old = mu_old: train_infer = 0
    assert m["residual/total_mean"] == pytest.approx((0.02 + 0.0 + 0.25) / 3, abs=1e-12)
    assert m["residual/total_p50"] == pytest.approx(0.02, abs=1e-12)
    assert m["residual/total_p90"] == pytest.approx(0.02 + 0.8 * (0.25 - 0.02), abs=1e-12)  # linear
    assert m["residual/total_max"] == pytest.approx(0.25, abs=1e-12)
    assert m["residual/staleness_max"] == pytest.approx(0.25, abs=1e-12)  # pi_old = mu_old
    assert all(m[f"residual/train_infer_{s}"] == 0.0 for s in ("mean", "p50", "p90", "max"))


def test_residual_is_zero_on_policy_and_zero_without_tokens():
    logp = -torch.rand(3, 5, dtype=F64)
    m = first_order_residual(logp, logp, logp, torch.ones(3, 5, dtype=torch.bool))
    assert all(v == 0.0 for v in m.values())
    empty = first_order_residual(logp, logp + 1, logp - 1, torch.zeros(3, 5, dtype=torch.bool))
    assert all(v == 0.0 for v in empty.values()) and len(empty) == 12


def test_residual_is_accurate_for_tiny_deltas_in_float32_inputs():
    # gap = sum_{s<t} delta_s delta_t + O(delta^3): with delta = (1e-4, 1e-4) it is ~1e-8, a
    # number that "1 + small - 1" arithmetic would lose; log-space evaluation keeps it
    log_total = torch.full((1, 2), math.log1p(1e-4))
    mask = torch.ones(1, 2, dtype=torch.bool)
    m = first_order_residual(log_total.float(), torch.zeros(1, 2), torch.zeros(1, 2), mask)
    assert m["residual/total_mean"] == pytest.approx(1e-8, rel=1e-3)


def test_residual_rejects_bad_arguments():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="mask"):
        first_order_residual(x, x, x, torch.ones(2, 3))
    with pytest.raises(ValueError, match="logp_old"):
        first_order_residual(x, torch.zeros(2, 4), x, torch.ones(2, 3, dtype=torch.bool))


# ----------------------------------------------------------------------------- importance_weight_stats


def test_ess_and_chi2_of_equal_weights():
    logp_old = -torch.rand(4, 6, dtype=F64)
    mask = torch.ones(4, 6, dtype=torch.bool)
    m = importance_weight_stats(logp_old, logp_old, mask)  # w = 1
    assert m == {"is/ess_token": pytest.approx(1.0, abs=1e-12), "is/ess_seq": pytest.approx(1.0, abs=1e-12),
                 "is/chi2_token": pytest.approx(0.0, abs=1e-12), "is/chi2_seq": pytest.approx(0.0, abs=1e-12)}  # fmt: skip
    # a constant weight c != 1: ESS is scale-free (still 1), chi^2 = c^2 - 1 is not
    m = importance_weight_stats(logp_old + math.log(2.0), logp_old, mask)
    assert m["is/ess_token"] == pytest.approx(1.0, abs=1e-12)
    assert m["is/chi2_token"] == pytest.approx(3.0, abs=1e-12)


def test_ess_of_one_dominant_weight_is_one_over_n():
    # token weights (1, ~0, ~0, ~0) in four one-token responses: ESS/n = 1/4 at both levels
    log_w = torch.tensor([[0.0], [-60.0], [-60.0], [-60.0]], dtype=F64)
    mask = torch.ones(4, 1, dtype=torch.bool)
    m = importance_weight_stats(log_w, torch.zeros_like(log_w), mask)
    assert m["is/ess_token"] == pytest.approx(0.25, abs=1e-12)
    assert m["is/ess_seq"] == pytest.approx(0.25, abs=1e-12)
    # an exactly-zero weight (log w = -inf) is fine too
    log_w[1:] = -math.inf
    assert importance_weight_stats(log_w, torch.zeros_like(log_w), mask)["is/ess_token"] == pytest.approx(0.25, abs=1e-15)


def test_ess_and_chi2_by_hand_with_an_empty_row_skipped():
    # row 0: w = (2, 0.5) -> W = 1; row 1: w = (3,) -> W = 3; row 2: no tokens (skipped)
    log_w, mask = _logs([2.0, 0.5], [3.0], [])
    logp_rollout = torch.full_like(log_w, -1.0)
    m = importance_weight_stats(logp_rollout + log_w, logp_rollout, mask)
    assert m["is/ess_token"] == pytest.approx(5.5**2 / (3 * 13.25), abs=1e-12)  # (sum w)^2 / (n sum w^2)
    assert m["is/chi2_token"] == pytest.approx(13.25 / 3 - 1, abs=1e-12)  # mean w^2 - 1
    assert m["is/ess_seq"] == pytest.approx(16 / (2 * 10), abs=1e-12)
    assert m["is/chi2_seq"] == pytest.approx(10 / 2 - 1, abs=1e-12)  # verl would also count the empty row


def test_chi2_clamps_log_weights_like_verl_and_ess_does_not_overflow():
    log_w = torch.tensor([[30.0], [0.0]], dtype=F64)  # w = e^30: verl's rho is exp(clamp(30, 20))
    mask = torch.tensor([[True], [False]])
    m = importance_weight_stats(log_w, torch.zeros_like(log_w), mask)
    assert m["is/chi2_token"] == pytest.approx(math.exp(40.0) - 1, rel=1e-12)
    big = torch.tensor([[800.0], [800.0 - math.log(3.0)]], dtype=F64)  # e^800 overflows float64
    m = importance_weight_stats(big, torch.zeros_like(big), torch.ones(2, 1, dtype=torch.bool))
    assert m["is/ess_token"] == pytest.approx((1 + 1 / 3) ** 2 / (2 * (1 + 1 / 9)), abs=1e-12)


# ----------------------------------------------------------------------------- sequence_is_loss


def test_sequence_is_loss_value_and_gradient_by_hand():
    logp = torch.tensor([[-1.0, -2.0, 5.0], [-0.5, 7.0, 7.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    logp_rollout = torch.tensor([[-1.5, -1.5, 0.0], [-1.0, 0.0, 0.0]], dtype=F64)
    adv = torch.tensor([2.0, -1.0], dtype=F64)
    # W_0 = exp((-1 + 1.5) + (-2 + 1.5)) = 1, W_1 = exp(-0.5 + 1) = e^0.5
    w1 = math.exp(0.5)
    for normalizer, n in ((None, 2.0), (5.0, 5.0)):
        loss, metrics = sequence_is_loss(logp, logp_rollout, adv, mask, normalizer=normalizer)
        expected = -(1.0 * 2.0 * (-3.0) + w1 * (-1.0) * (-0.5)) / n
        assert float(loss.detach()) == pytest.approx(expected, abs=1e-12)
        (grad,) = torch.autograd.grad(loss, logp)
        by_hand = torch.tensor([[-2.0 / n, -2.0 / n, 0.0], [w1 / n, 0.0, 0.0]], dtype=F64)
        torch.testing.assert_close(grad, by_hand, rtol=0, atol=1e-12)
        assert metrics["loss"] == pytest.approx(expected, abs=1e-12)
        assert metrics["seq_weight_mean"] == pytest.approx((1 + w1) / 2, abs=1e-12)
        assert metrics["seq_weight_max"] == pytest.approx(w1, abs=1e-12)


def test_sequence_is_loss_equals_the_token_surrogate_where_the_approximation_is_exact():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(4, generator=g, dtype=F64)
    mask = torch.rand(4, 6, generator=g) < 0.7
    mask[:, 0] = True
    logp = (-torch.rand(4, 6, generator=g, dtype=F64)).requires_grad_()
    # on-policy (pi = pi_old = mu): Eq. (2) and MiniRL Eq. (7) have the same gradient
    seq, _ = sequence_is_loss(logp, logp.detach(), adv, mask)
    tok, _ = minirl_loss(LossInputs(logp, logp.detach(), logp.detach(), adv, mask))
    torch.testing.assert_close(torch.autograd.grad(seq, logp)[0], torch.autograd.grad(tok, logp)[0], rtol=0, atol=1e-15)
    # one-token responses, off-policy: prod (1 + delta) = 1 + delta, so again the same gradient
    one = torch.zeros(4, 6, dtype=torch.bool)
    one[:, 2] = True
    logp_rollout = logp.detach() + 0.3 * torch.randn(4, 6, generator=g, dtype=F64)
    seq, _ = sequence_is_loss(logp, logp_rollout, adv, one)
    tok, _ = minirl_loss(LossInputs(logp, logp.detach(), logp_rollout, adv, one), clip=False, tis_cap=math.inf)
    torch.testing.assert_close(torch.autograd.grad(seq, logp)[0], torch.autograd.grad(tok, logp)[0], rtol=1e-12, atol=1e-15)


def test_sequence_is_loss_ignores_padding_garbage_and_checks_arguments():
    logp = torch.tensor([[-1.0, math.nan]], requires_grad=True)
    mask = torch.tensor([[True, False]])
    loss, _ = sequence_is_loss(logp, torch.tensor([[-1.0, math.inf]]), torch.tensor([1.0]), mask)
    assert float(loss.detach()) == 1.0  # -(W = 1) * (A = 1) * (-1) / (B = 1)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.equal(grad, torch.tensor([[-1.0, 0.0]]))
    with pytest.raises(ValueError, match="normalizer"):
        sequence_is_loss(logp, logp.detach(), torch.tensor([1.0]), mask, normalizer=0.0)
    with pytest.raises(FloatingPointError):
        sequence_is_loss(logp, logp.detach(), torch.tensor([math.nan]), mask)


# ----------------------------------------------------------------------------- cosine


def test_cosine():
    g = torch.randn(100, generator=torch.Generator().manual_seed(0))
    assert cosine(g, g) == pytest.approx(1.0, abs=1e-12)
    assert cosine(g, -g) == pytest.approx(-1.0, abs=1e-12)
    assert cosine(g, 3.0 * g) == pytest.approx(1.0, abs=1e-12)  # scale-free
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == 0.0
    assert cosine(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0])) == pytest.approx(math.sqrt(0.5), abs=1e-12)
    assert isinstance(cosine(g, g), float)
    assert math.isnan(cosine(g, torch.zeros_like(g)))  # no direction: nan, not "orthogonal"
    assert math.isnan(cosine(g, torch.full_like(g, math.nan)))
    with pytest.raises(ValueError, match="sizes"):
        cosine(g, g[:-1])
