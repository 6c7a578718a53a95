"""Masked tensor helpers and the one-sync conversion of metric tensors, shared by the losses
(``minirl.algo``) and the monitors (``minirl.monitor``). Pure; no host sync except ``to_floats``
(one for all metrics).
"""

from __future__ import annotations

import math

import torch


def compute_dtype(logp: torch.Tensor) -> torch.dtype:
    """float32 at least: bf16/fp16 log-probs are upcast before exp() and sums; float64 stays."""
    return torch.promote_types(logp.dtype, torch.float32)


def masked(x: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` cast to ``dtype`` with 0 wherever ``mask`` is False.

    Done with ``torch.where`` *before* any exp()/product so that garbage (inf, NaN) at padded
    positions can neither leak into the forward value nor produce NaN gradients (0 * inf).
    Gradient flows to ``x`` only at mask=True positions.
    """
    return torch.where(mask, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))


def masked_mean(x: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``sel`` (bool, same shape); 0 for an empty selection, never NaN."""
    x = torch.where(sel, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.sum() / sel.sum().clamp(min=1).to(x.dtype)


def masked_max(x: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """Max of ``x`` over ``sel``; 0 for an empty selection."""
    if x.numel() == 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    neg_inf = torch.full((), -math.inf, dtype=x.dtype, device=x.device)
    m = torch.where(sel, x, neg_inf).max()
    return torch.where(sel.any(), m, torch.zeros_like(m))


def detached(metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every metric detached from the graph (no host sync)."""
    return {name: value.detach() for name, value in metrics.items()}


def to_floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """Detach and convert every 0-dim tensor to a python float with a single host sync."""
    names = list(metrics)
    if not names:
        return {}
    values = torch.stack([metrics[k].detach().to(torch.float64) for k in names]).tolist()
    return dict(zip(names, values))
