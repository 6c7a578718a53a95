"""Per-step monitoring: the training–inference mismatch (``mismatch/*``) and the entropy.

These are monitoring quantities, not loss terms: [P] (arXiv:2512.01374) has no KL penalty and no
entropy bonus in Eq. (7); §5.4 only *plots* the training–inference KL and the entropy.

How they differ from what they are usually confused with:

* ``kl_k1`` is the paper's "training–inference KL", D_KL[mu_old || pi_old], estimated on the
  **sampled** tokens (y_t ~ mu_old) as mean(log mu_old - log pi_old). It is not a KL to a
  reference model and not the policy-update KL(pi_old || pi_theta). Per token it can be negative;
  only its expectation is >= 0. ``kl_k3`` is Schulman's k3 estimator of the same KL(mu || pi),
  exp(d) - 1 - d with d = log pi_old - log mu_old: unbiased and >= 0 per token.
* ``token_entropy`` (the per-step ``train/entropy``) is the **full-vocabulary** entropy
  -sum_w pi(w) log pi(w) at each rollout prefix, not the sampled-token estimate -log pi(y_t).

Metric names (python floats, token means over mask=True; an empty mask gives 0.0):
    kl_k1           mean(logp_rollout - logp_old)
    kl_k3           mean(exp(logp_old - logp_rollout) - 1 - (logp_old - logp_rollout))
    abs_dlogp_mean  mean |logp_rollout - logp_old|
    abs_dlogp_max   max  |logp_rollout - logp_old|
NaN inputs are not raised on here: they propagate into the metric, where they are visible.
"""

from __future__ import annotations

import torch

from minirl.tensors import masked_max, masked_mean, to_floats


def mismatch_metrics(
    logp_rollout: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Training–inference mismatch statistics over trained tokens ([P] §5.4, KL plot).

    kl_k1 = mean_t (logp_rollout - logp_old): sampled-token estimator of D_KL[mu_old || pi_old]
    ([P] §5.4); kl_k3 = mean_t (rho - 1 - log rho), rho = pi_old / mu_old (Schulman's k3 for
    KL(mu || pi)); abs_dlogp_mean / abs_dlogp_max of |logp_rollout - logp_old|.

    Args:
        logp_rollout: float [B, T], log mu_old.
        logp_old: float [B, T], log pi_old.
        mask: bool [B, T], True = counted.
    """
    if logp_rollout.shape != logp_old.shape or mask.shape != logp_old.shape:
        raise ValueError(
            f"logp_rollout {tuple(logp_rollout.shape)}, logp_old {tuple(logp_old.shape)} and "
            f"mask {tuple(mask.shape)} must have the same shape"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    dtype = torch.promote_types(logp_old.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logp_old.device)
    d = torch.where(mask, logp_old.detach().to(dtype) - logp_rollout.detach().to(dtype), zero)
    return to_floats(
        {
            "kl_k1": masked_mean(-d, mask),
            "kl_k3": masked_mean(torch.expm1(d) - d, mask),
            "abs_dlogp_mean": masked_mean(d.abs(), mask),
            "abs_dlogp_max": masked_max(d.abs(), mask),
        }
    )


DEFAULT_ENTROPY_CHUNK: int = 256


@torch.no_grad()
def token_entropy(logits: torch.Tensor, chunk_size: int = DEFAULT_ENTROPY_CHUNK) -> torch.Tensor:
    """Full-vocabulary entropy H_t = -sum_w p(w) log p(w) per position ([P] §5.4, entropy plot).

    Args:
        logits: [B, T, V] (any float dtype; computed in float32 or wider).
        chunk_size: rows of the flattened [B*T, V] processed at once. Peak extra memory is about
            two [chunk_size, V] float32 buffers, never a [B, T, V] copy.

    Returns:
        float [B, T] (float32, or float64 for float64 logits), no gradient (runs under no_grad).
        Vocabulary entries with logit -inf contribute 0.
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise ValueError(f"logits must be a 3-D tensor [B, T, V], got {getattr(logits, 'shape', type(logits))}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    b, t, v = logits.shape
    dtype = torch.promote_types(logits.dtype, torch.float32)
    flat = logits.reshape(b * t, v)
    out = torch.empty(b * t, dtype=dtype, device=logits.device)
    for start in range(0, b * t, chunk_size):
        logq = torch.log_softmax(flat[start : start + chunk_size].to(dtype), dim=-1)
        p = logq.exp()
        logq.clamp_(min=torch.finfo(dtype).min)  # -inf -> finite so that 0 * log 0 = 0, not NaN
        out[start : start + chunk_size] = -(p.mul_(logq)).sum(dim=-1)
        del logq, p
    return out.reshape(b, t)


@torch.no_grad()
def token_sum_pi_squared(logits: torch.Tensor, chunk_size: int = DEFAULT_ENTROPY_CHUNK) -> torch.Tensor:
    """sum_w p(w)^2 per position [B, T] of ``logits`` [B, T, V] (float32 or wider, no gradient), as
    exp(logsumexp(2 z) - 2 logsumexp(z)) (verl's ``calculate_sum_pi_squared_from_logits``; the optimal token
    baseline's ``minirl.algo.variants.otb``), ``chunk_size`` rows of [B*T, V] at a time."""
    b, t, v = logits.shape
    dtype = torch.promote_types(logits.dtype, torch.float32)
    flat = logits.reshape(b * t, v)
    out = torch.empty(b * t, dtype=dtype, device=logits.device)
    for start in range(0, b * t, chunk_size):
        z = flat[start : start + chunk_size].to(dtype)
        out[start : start + chunk_size] = torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * torch.logsumexp(z, dim=-1))
    return out.reshape(b, t)
