"""``mismatch_metrics``, ``token_entropy`` and ``token_logprobs`` against direct torch computations."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import token_logprobs
from minirl.monitor import mismatch_metrics, token_entropy

F64 = torch.float64
LN2 = math.log(2.0)


# ------------------------------------------------------------------ mismatch_metrics


def test_mismatch_metrics_hand_computed() -> None:
    # d = logp_old - logp_rollout at the 3 trained tokens: [-ln2, +ln2, 0]; the 4th is padding
    logp_rollout = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.8), 0.0]], dtype=F64)
    logp_old = torch.tensor([[math.log(0.25), math.log(0.5)], [math.log(0.8), -50.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    m = mismatch_metrics(logp_rollout, logp_old, mask)
    assert set(m) == {"kl_k1", "kl_k3", "abs_dlogp_mean", "abs_dlogp_max"}
    assert all(type(v) is float for v in m.values())
    assert m["kl_k1"] == pytest.approx(0.0, abs=1e-12)  # mean(-d) = (ln2 - ln2 + 0)/3
    # k3 per token: (0.5 - 1 + ln2) + (2 - 1 - ln2) + 0 = 0.5 -> mean 1/6
    assert m["kl_k3"] == pytest.approx(1 / 6, abs=1e-12)
    assert m["abs_dlogp_mean"] == pytest.approx(2 * LN2 / 3, abs=1e-12)
    assert m["abs_dlogp_max"] == pytest.approx(LN2, abs=1e-12)


def test_mismatch_metrics_match_direct_computation() -> None:
    g = torch.Generator().manual_seed(1)
    lr = -torch.rand(4, 5, generator=g, dtype=F64) * 4
    lo = lr + 0.3 * torch.randn(4, 5, generator=g, dtype=F64)
    mask = torch.rand(4, 5, generator=g) > 0.4
    m = mismatch_metrics(lr, lo, mask)
    d = (lo - lr)[mask]
    assert m["kl_k1"] == pytest.approx((-d).mean().item(), abs=1e-12)
    assert m["kl_k3"] == pytest.approx((d.exp() - 1 - d).mean().item(), abs=1e-12)
    assert m["abs_dlogp_mean"] == pytest.approx(d.abs().mean().item(), abs=1e-12)
    assert m["abs_dlogp_max"] == pytest.approx(d.abs().max().item(), abs=1e-12)


def test_mismatch_metrics_sign_convention() -> None:
    # rollout engine more confident than trainer -> k1 > 0
    m = mismatch_metrics(torch.tensor([[0.0]]), torch.tensor([[-1.0]]), torch.tensor([[True]]))
    assert m["kl_k1"] == pytest.approx(1.0)
    assert m["kl_k3"] == pytest.approx(math.exp(-1) - 1 + 1, abs=1e-6)


def test_mismatch_metrics_empty_mask_is_zero() -> None:
    z = torch.zeros(2, 3)
    m = mismatch_metrics(z, z + 1, torch.zeros(2, 3, dtype=torch.bool))
    assert m == {"kl_k1": 0.0, "kl_k3": 0.0, "abs_dlogp_mean": 0.0, "abs_dlogp_max": 0.0}


def test_mismatch_metrics_bad_shapes() -> None:
    with pytest.raises(ValueError, match="shape"):
        mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))


# ------------------------------------------------------------------ token_entropy


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1000])
def test_token_entropy_matches_direct(chunk_size: int) -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 11, generator=g, dtype=F64) * 3
    ref = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(token_entropy(logits, chunk_size=chunk_size), ref, atol=1e-12, rtol=0)


def test_token_entropy_closed_forms() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -math.inf, -math.inf], [5.0, -math.inf, -math.inf, -math.inf]]])
    out = token_entropy(logits)
    torch.testing.assert_close(out, torch.tensor([[math.log(4.0), LN2, 0.0]]), atol=1e-6, rtol=0)


def test_token_entropy_has_no_grad_and_upcasts_bf16() -> None:
    logits = torch.randn(2, 2, 5, requires_grad=True)
    out = token_entropy(logits)
    assert not out.requires_grad
    out16 = token_entropy(logits.detach().to(torch.bfloat16))
    assert out16.dtype == torch.float32
    torch.testing.assert_close(out16, out, atol=0.05, rtol=0)


def test_token_entropy_works_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = torch.log_softmax

    def spy(x: torch.Tensor, dim: int) -> torch.Tensor:
        seen.append(x.shape[0])
        return real(x, dim=dim)

    monkeypatch.setattr(torch, "log_softmax", spy)
    token_entropy(torch.randn(3, 5, 7), chunk_size=4)
    assert seen == [4, 4, 4, 3]  # 15 rows, never more than chunk_size at once


def test_token_entropy_bad_args() -> None:
    with pytest.raises(ValueError, match="logits"):
        token_entropy(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="chunk_size"):
        token_entropy(torch.zeros(1, 3, 4), chunk_size=0)


# ------------------------------------------------------------------ token_logprobs


def test_token_logprobs_matches_log_softmax_gather_with_gradient() -> None:
    g = torch.Generator().manual_seed(3)
    base = torch.randn(2, 4, 9, generator=g, dtype=F64) * 2
    targets = torch.randint(0, 9, (2, 4), generator=g)
    weights = torch.randn(2, 4, generator=g, dtype=F64)

    a = base.clone().requires_grad_(True)
    out = token_logprobs(a, targets)
    (out * weights).sum().backward()

    b = base.clone().requires_grad_(True)
    ref = torch.log_softmax(b, -1).gather(-1, targets[..., None]).squeeze(-1)
    (ref * weights).sum().backward()

    assert out.shape == (2, 4)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(a.grad, b.grad, atol=1e-12, rtol=0)


def test_token_logprobs_closed_form() -> None:
    # uniform over 4 -> ln(1/4); logits [ln 3, 0] -> p = 3/4, 1/4
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -math.inf, -math.inf]]], dtype=F64)
    out = token_logprobs(logits, torch.tensor([[2, 1]]))
    torch.testing.assert_close(out, torch.tensor([[math.log(0.25), math.log(0.25)]], dtype=F64), atol=1e-12, rtol=0)
    out = token_logprobs(logits, torch.tensor([[0, 0]]))
    torch.testing.assert_close(out, torch.tensor([[math.log(0.25), math.log(0.75)]], dtype=F64), atol=1e-12, rtol=0)


def test_token_logprobs_does_not_build_a_log_softmax(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("token_logprobs must not materialise a full log_softmax")

    monkeypatch.setattr(torch, "log_softmax", forbidden)
    monkeypatch.setattr(torch.Tensor, "log_softmax", forbidden)
    token_logprobs(torch.randn(1, 2, 5), torch.zeros(1, 2, dtype=torch.long))


def test_token_logprobs_bf16_is_upcast_and_differentiable() -> None:
    logits = torch.randn(2, 3, 6).to(torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, 6, (2, 3))
    out = token_logprobs(logits, targets)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
    ref = torch.log_softmax(logits.detach().float(), -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(out.detach(), ref, atol=1e-6, rtol=0)


def test_token_logprobs_bad_args() -> None:
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(torch.zeros(1, 2, 5), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(torch.zeros(1, 2, 5), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="logits"):
        token_logprobs(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long))
