"""What a policy loss is given, checked once: the tensors (``LossInputs``) and the knobs
(``check_knobs``). Each check raises ``ValueError`` naming the argument; ``raise_on_nan`` raises
``FloatingPointError``. The losses themselves (``minirl.algo``) hold only the math.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

AGGREGATIONS: tuple[str, ...] = ("seq_sum", "seq_mean", "token_mean")
TIS_PLACEMENTS: tuple[str, ...] = ("full", "train_infer")
TIS_MODES: tuple[str, ...] = ("truncate", "mask")
TIS_LEVELS: tuple[str, ...] = ("token", "sequence")


@dataclass(frozen=True)
class LossInputs:
    """The tensors a policy loss reads, named by where they came from (above) and
    checked once, on construction (``ValueError`` naming the argument):

        logp          float [B, T]  log pi_theta of the sampled tokens; the only input with gradient
        logp_old      float [B, T]  log pi_old (trainer at theta_old); treated as constant
        logp_rollout  float [B, T]  log mu_old (rollout engine); treated as constant
        advantages    float [B]     one advantage per response; treated as constant (or [B, T]: one per
                      token, token-level returns, ``minirl.algo.variants.token_returns``; not for GSPO)
        mask          bool  [B, T]  True = the token is trained on
        group_ids     int   [B] or None  which prompt each row answers (CISPO normalises per group)
        token_keep    bool  [B, T] or None  of the trained tokens, those whose loss term counts (TRL's
                      ``top_entropy_quantile``); the denominators still count every trained token

    ``check_nan=False``: ``raise_on_nan`` does nothing, because the caller has checked once for a whole
    update (``minirl.trainer``: the batch's inputs on the host before it, a NaN ``logp`` as a non-finite
    loss at the update's one sync), so no loss call waits for the GPU.
    """

    logp: torch.Tensor
    logp_old: torch.Tensor
    logp_rollout: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    group_ids: torch.Tensor | None = None
    check_nan: bool = True
    token_keep: torch.Tensor | None = None

    def __post_init__(self) -> None:
        logp, adv, mask = self.logp, self.advantages, self.mask
        for name in ("logp", "logp_old", "logp_rollout"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.ndim != 2:
                raise ValueError(f"{name} must be a 2-D tensor [B, T], got {_describe(t)}")
            if not t.is_floating_point():
                raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
            if t.shape != logp.shape:
                raise ValueError(f"{name} shape {tuple(t.shape)} != logp shape {tuple(logp.shape)}")
        if not isinstance(mask, torch.Tensor) or mask.shape != logp.shape:
            raise ValueError(f"mask must have the shape of logp {tuple(logp.shape)}, got {_describe(mask)}")
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor (True = trained on), got dtype {mask.dtype}")
        if not isinstance(adv, torch.Tensor) or adv.shape not in (logp.shape[:1], logp.shape):
            raise ValueError(f"advantages must have shape [B] = {tuple(logp.shape[:1])} or [B, T] = {tuple(logp.shape)}, "
                             f"got {_describe(adv)}")
        if not adv.is_floating_point():
            raise ValueError(f"advantages must be a floating-point tensor, got dtype {adv.dtype}")
        if logp.shape[0] == 0:
            raise ValueError("logp has B = 0 rows: an empty batch has no loss")
        if self.group_ids is not None:
            self.require_groups()
        keep = self.token_keep
        if keep is not None and (not isinstance(keep, torch.Tensor) or keep.shape != logp.shape or keep.dtype != torch.bool):
            raise ValueError(f"token_keep must be a bool tensor of the shape of logp {tuple(logp.shape)}, got {_describe(keep)}")

    def advantages_BT(self, dtype: torch.dtype) -> torch.Tensor:
        """The advantages, detached, in ``dtype``, broadcastable over tokens: [B, 1] (one per response) or [B, T]."""
        adv = self.advantages.detach().to(dtype)
        return adv[:, None] if adv.ndim == 1 else adv

    @property
    def terms(self) -> torch.Tensor:
        """bool [B, T]: the tokens whose loss term counts (``mask``, narrowed by ``token_keep``)."""
        return self.mask if self.token_keep is None else self.mask & self.token_keep

    def require_groups(self) -> torch.Tensor:
        """``group_ids``, which must be an integer tensor of shape [B] (``ValueError`` otherwise)."""
        g, rows = self.group_ids, self.logp.shape[0]
        if not isinstance(g, torch.Tensor) or g.shape != (rows,):
            raise ValueError(f"group_ids must have shape [B] = ({rows},), got {_describe(g)}")
        if g.is_floating_point() or g.dtype == torch.bool:
            raise ValueError(f"group_ids must be an integer tensor, got dtype {g.dtype}")
        return g

    def raise_on_nan(self) -> None:
        """``FloatingPointError`` if a NaN reaches the math: in ``advantages``, or in a log-prob at a
        trained token (padding never enters the math: it is replaced by 0 first, so a NaN there, e.g.
        from a fully masked attention row, is harmless). One host sync on the happy path."""
        if self.check_nan:
            tokens = {"logp": self.logp, "logp_old": self.logp_old, "logp_rollout": self.logp_rollout}
            report = nan_report(self.advantages, self.mask, tokens)
            if report is not None:
                raise FloatingPointError(report)


def nan_report(advantages: torch.Tensor | None, mask: torch.Tensor, log_probs: Mapping[str, torch.Tensor | None]) -> str | None:
    """What ``LossInputs.raise_on_nan`` says, or None: a NaN in ``advantages`` or in one of ``log_probs``
    (None entries skipped) at a trained token. One host sync on the happy path."""
    named = {name: t for name, t in log_probs.items() if t is not None}
    flags = ([torch.isnan(advantages).any()] if advantages is not None else []) + [
        (torch.isnan(t) & mask).any() for t in named.values()]
    if not flags or not bool(torch.stack(flags).any()):
        return None
    if advantages is not None and bool(torch.isnan(advantages).any()):
        return f"advantages contain NaN ({int(torch.isnan(advantages).sum())} of {advantages.numel()})"
    for name, t in named.items():
        if bool((torch.isnan(t) & mask).any()):
            return f"{name} contains NaN at {int((torch.isnan(t) & mask).sum())} trained (mask=True) token(s)"
    return None


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"tensor of shape {tuple(t.shape)} and dtype {t.dtype}"
    return type(t).__name__



def check_knobs(*, eps_low: float | None = None, eps_high: float | None = None, tis_cap: float | None = None,
                normalizer: float | None = None, tis_placement: str | None = None, aggregation: str | None = None,
                tis_floor: float | None = None, tis_mode: str | None = None, tis_level: str | None = None) -> None:
    """The knob checks every loss starts with, written once (``ValueError`` naming the knob); a
    knob left at None is one the loss does not have (``normalizer=None``: the loss's default)."""
    for name, value in (("eps_low", eps_low), ("eps_high", eps_high)):
        if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if tis_cap is not None and (not isinstance(tis_cap, (int, float)) or math.isnan(tis_cap) or tis_cap <= 0):
        raise ValueError(f"tis_cap must be > 0 (math.inf disables truncation), got {tis_cap!r}")
    if normalizer is not None and (isinstance(normalizer, bool) or not isinstance(normalizer, (int, float))
                                   or not math.isfinite(normalizer) or normalizer <= 0):
        raise ValueError(f"normalizer must be None or a finite number > 0, got {normalizer!r}")
    if tis_placement is not None and tis_placement not in TIS_PLACEMENTS:
        raise ValueError(f"tis_placement must be one of {TIS_PLACEMENTS}, got {tis_placement!r}")
    if aggregation is not None and aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if tis_floor is not None and (isinstance(tis_floor, bool) or not isinstance(tis_floor, (int, float))
                                  or not 0 <= tis_floor < (tis_cap if tis_cap is not None else math.inf)):
        raise ValueError(f"tis_floor must be >= 0 and below tis_cap, got {tis_floor!r}")
    if tis_mode is not None and tis_mode not in TIS_MODES:
        raise ValueError(f"tis_mode must be one of {TIS_MODES}, got {tis_mode!r}")
    if tis_level is not None and tis_level not in TIS_LEVELS:
        raise ValueError(f"tis_level must be one of {TIS_LEVELS}, got {tis_level!r}")
