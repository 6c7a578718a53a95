"""What the loss functions share: ``LossInputs`` (their one validated input), the knob checks,
masking and metric reduction.

Every helper is pure and avoids host syncs except where noted (``raise_on_nan`` and ``to_floats``
each sync once). Losses return their metrics as detached 0-dim tensors; whoever reports them
converts them with ``to_floats`` (one sync for all of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossInputs:
    """The tensors a policy loss reads, named by where they came from (``minirl.types``) and
    checked once, on construction (``ValueError`` naming the argument):

        logp          float [B, T]  log pi_theta of the sampled tokens; the only input with gradient
        logp_old      float [B, T]  log pi_old (trainer at theta_old); treated as constant
        logp_rollout  float [B, T]  log mu_old (rollout engine); treated as constant
        advantages    float [B]     one advantage per response; treated as constant
        mask          bool  [B, T]  True = the token is trained on
        group_ids     int   [B] or None  which prompt each row answers (CISPO normalises per group)
    """

    logp: torch.Tensor
    logp_old: torch.Tensor
    logp_rollout: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    group_ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_token_inputs(self.logp, self.logp_old, self.logp_rollout, self.advantages, self.mask)
        if self.group_ids is not None:
            check_group_ids(self.group_ids, self.logp.shape[0])

    def raise_on_nan(self) -> None:
        """``FloatingPointError`` if a NaN reaches the math (one host sync; see ``raise_on_nan``)."""
        raise_on_nan(self.mask, self.advantages, logp=self.logp, logp_old=self.logp_old, logp_rollout=self.logp_rollout)


def check_knobs(*, eps_low: float | None = None, eps_high: float | None = None, tis_cap: float | None = None,
                normalizer: float | None = None, tis_placement: str | None = None, aggregation: str | None = None) -> None:
    """The knob checks every loss starts with, written once (``ValueError`` naming the knob);
    a knob left at None is one the loss does not have."""
    if eps_low is not None or eps_high is not None:
        check_eps(eps_low, eps_high)  # type: ignore[arg-type]
    if tis_cap is not None:
        check_tis_cap(tis_cap)
    check_normalizer(normalizer)
    if tis_placement is not None and tis_placement not in TIS_PLACEMENTS:
        raise ValueError(f"tis_placement must be one of {TIS_PLACEMENTS}, got {tis_placement!r}")
    if aggregation is not None and aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")

AGGREGATIONS: tuple[str, ...] = ("seq_sum", "seq_mean", "token_mean")
TIS_PLACEMENTS: tuple[str, ...] = ("full", "train_infer")


def check_eps(eps_low: float, eps_high: float) -> None:
    """Raise ``ValueError`` unless both clipping half-widths are finite and non-negative."""
    for name, value in (("eps_low", eps_low), ("eps_high", eps_high)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def check_tis_cap(tis_cap: float) -> None:
    """Raise ``ValueError`` unless ``tis_cap`` is > 0 (``math.inf`` allowed: no truncation)."""
    if not isinstance(tis_cap, (int, float)) or math.isnan(tis_cap) or tis_cap <= 0:
        raise ValueError(f"tis_cap must be > 0 (math.inf disables truncation), got {tis_cap!r}")


def check_normalizer(normalizer: float | None) -> None:
    """Raise ``ValueError`` unless ``normalizer`` is ``None`` or a finite number > 0."""
    if normalizer is None:
        return
    if (
        isinstance(normalizer, bool)
        or not isinstance(normalizer, (int, float))
        or not math.isfinite(normalizer)
        or normalizer <= 0
    ):
        raise ValueError(f"normalizer must be None or a finite number > 0, got {normalizer!r}")


def check_token_inputs(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_rollout: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> None:
    """Shape and dtype checks common to every policy loss; ``ValueError`` naming the argument."""
    for name, t in (("logp", logp), ("logp_old", logp_old), ("logp_rollout", logp_rollout)):
        if not isinstance(t, torch.Tensor) or t.ndim != 2:
            raise ValueError(f"{name} must be a 2-D tensor [B, T], got {_describe(t)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if logp_old.shape != logp.shape:
        raise ValueError(f"logp_old shape {tuple(logp_old.shape)} != logp shape {tuple(logp.shape)}")
    if logp_rollout.shape != logp.shape:
        raise ValueError(
            f"logp_rollout shape {tuple(logp_rollout.shape)} != logp shape {tuple(logp.shape)}"
        )
    if not isinstance(mask, torch.Tensor) or mask.shape != logp.shape:
        raise ValueError(f"mask must have the shape of logp {tuple(logp.shape)}, got {_describe(mask)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = trained on), got dtype {mask.dtype}")
    if not isinstance(advantages, torch.Tensor) or advantages.shape != logp.shape[:1]:
        raise ValueError(
            f"advantages must have shape [B] = {tuple(logp.shape[:1])}, got {_describe(advantages)}"
        )
    if not advantages.is_floating_point():
        raise ValueError(f"advantages must be a floating-point tensor, got dtype {advantages.dtype}")
    if logp.shape[0] == 0:
        raise ValueError("logp has B = 0 rows: an empty batch has no loss")


def check_group_ids(group_ids: torch.Tensor, batch_size: int) -> None:
    """``group_ids`` must be an integer tensor of shape [B]."""
    if not isinstance(group_ids, torch.Tensor) or group_ids.shape != (batch_size,):
        raise ValueError(f"group_ids must have shape [B] = ({batch_size},), got {_describe(group_ids)}")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")


def raise_on_nan(mask: torch.Tensor, advantages: torch.Tensor, **token_tensors: torch.Tensor) -> None:
    """Raise ``FloatingPointError`` if a NaN reaches the math.

    Checked: every entry of ``advantages`` and, for each [B, T] tensor, the positions where
    ``mask`` is True (padded positions never enter the math: they are replaced by 0 first, so a
    NaN there, e.g. from a fully masked attention row, is harmless). One host sync on the happy
    path.
    """
    flags = [torch.isnan(advantages).any()]
    flags += [(torch.isnan(t) & mask).any() for t in token_tensors.values()]
    if not bool(torch.stack(flags).any()):
        return
    if bool(flags[0]):
        raise FloatingPointError(f"advantages contain NaN ({int(torch.isnan(advantages).sum())} of {advantages.numel()})")
    for (name, t), flag in zip(token_tensors.items(), flags[1:]):
        if bool(flag):
            n = int((torch.isnan(t) & mask).sum())
            raise FloatingPointError(f"{name} contains NaN at {n} trained (mask=True) token(s)")


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


def train_infer_factor(
    lp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype, *, enabled: bool, tis_cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(min(pi_old/mu_old, tis_cap), where the cap bit) — the detached IS factor of Eq. (5); (1, none) when off."""
    if not enabled:
        return torch.ones_like(lp_old), torch.zeros_like(mask)
    raw = torch.exp(lp_old - masked(logp_rollout.detach(), mask, dtype))
    return raw.clamp(max=tis_cap), mask & (raw > tis_cap)


def token_loss_metrics(
    loss: torch.Tensor,
    clipped: torch.Tensor,
    truncated: torch.Tensor,
    weight: torch.Tensor,
    ratio_old: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The metrics every token-level objective reports (see ``minirl.algo.minirl``'s docstring),
    as detached 0-dim tensors."""
    dtype = weight.dtype
    pos, neg = mask & (advantages_BT > 0), mask & (advantages_BT < 0)
    return detached(
        {
            "loss": loss,
            "clip_frac": masked_mean(clipped.to(dtype), mask),
            "clip_frac_pos": masked_mean(clipped.to(dtype), pos),
            "clip_frac_neg": masked_mean(clipped.to(dtype), neg),
            "is_truncated_frac": masked_mean(truncated.to(dtype), mask),
            "is_weight_mean": masked_mean(weight, mask),
            "is_weight_max": masked_max(weight, mask),
            "ratio_old_mean": masked_mean(ratio_old, mask),
        }
    )


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


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"tensor of shape {tuple(t.shape)} and dtype {t.dtype}"
    return type(t).__name__
