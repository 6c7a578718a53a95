"""Log-probabilities of target tokens from logits, differentiable and memory-light.

log pi(y_t) = logits[y_t] - logsumexp(logits): the gather of the target logit and one logsumexp
per row. This is the quantity every loss in ``minirl.algo`` calls ``logp`` / ``logp_old``. Unlike
the common ``log_softmax(logits).gather(...)``, it never builds a full [B, T, V] log-softmax
tensor in the forward pass (the backward of logsumexp still needs softmax, one [B, T, V] buffer).
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[targets] per position [B, T], differentiable w.r.t. ``logits`` [B, T, V];
    ``targets``: long [B, T] token ids. float32/float64 logits are used in place; lower precision is
    upcast to float32 first (one [B, T, V] copy, kept for backward), because a bf16 logsumexp loses
    the precision the IS ratios need. The result is float32 (float64 for float64 logits).
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise ValueError(f"logits must be a 3-D tensor [B, T, V], got {getattr(logits, 'shape', type(logits))}")
    if not isinstance(targets, torch.Tensor) or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"targets must have shape [B, T] = {tuple(logits.shape[:2])}, got {getattr(targets, 'shape', type(targets))}"
        )
    if targets.dtype != torch.long:
        raise ValueError(f"targets must be a long tensor of token ids, got dtype {targets.dtype}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    x = logits if logits.dtype == dtype else logits.to(dtype)
    target_logit = x.gather(dim=-1, index=targets.unsqueeze(-1)).squeeze(-1)
    return target_logit - torch.logsumexp(x, dim=-1)


def token_entropy_with_grad(logits: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary entropy H_t = logsumexp(z_t) - sum_w softmax(z_t)_w z_tw per position [B, T],
    differentiable w.r.t. ``logits`` [B, T, V] (for an entropy bonus; the monitor's no-grad, chunked
    ``minirl.monitor.mismatch.token_entropy`` is for metrics). Computed in float32 or wider; entries
    with logit -inf contribute 0. Builds [B, T, V] softmax buffers, as the log-prob's backward does."""
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise ValueError(f"logits must be a 3-D tensor [B, T, V], got {getattr(logits, 'shape', type(logits))}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    x = logits if logits.dtype == dtype else logits.to(dtype)
    probs = torch.softmax(x, dim=-1)
    return torch.logsumexp(x, dim=-1) - (probs * x.masked_fill(probs == 0, 0.0)).sum(-1)
