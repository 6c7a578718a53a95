"""What the loss functions share: the training–inference IS factor and the token metrics. Pure, no host sync."""

from __future__ import annotations

import torch

from minirl.tensors import detached, masked, masked_max, masked_mean


def bounded_is_weight(log_ratio: torch.Tensor, mask: torch.Tensor, *, tis_cap: float, tis_floor: float = 0.0,
                      tis_mode: str = "truncate", tis_level: str = "token") -> tuple[torch.Tensor, torch.Tensor]:
    """The detached IS weight of a log-ratio log(p/q) [B, T] (0 at padding), and where a bound acted (bool [B, T]).

    ``tis_level``: ``token`` r_{i,t} = exp(log_ratio_{i,t}), Eq. (4)'s weight; ``sequence`` r_i = exp(sum_t
    log_ratio_{i,t}) for every token of response i, Eq. (2)'s (TRL's ``sequence_*``, verl's ``rollout_is=sequence``).
    ``tis_mode``: ``truncate`` w = min(r, tis_cap), raised to ``tis_floor`` when below (TIS, Yao et al. 2025, [P]
    §4.2); ``mask`` w = r inside [tis_floor, tis_cap], else 0 (IcePop; TRL's ``*_mask``, verl's "lower_upper").
    A sequence ratio beyond float range is +inf or 0 and bounded like any other (no NaN)."""
    if tis_level == "sequence":
        log_ratio = (log_ratio * mask).sum(dim=1, keepdim=True).expand_as(log_ratio)
    raw = torch.exp(log_ratio)
    if tis_mode == "truncate":
        if not tis_floor:
            return raw.clamp(max=tis_cap), mask & (raw > tis_cap)
        return raw.clamp(min=tis_floor, max=tis_cap), mask & ((raw > tis_cap) | (raw < tis_floor))
    inside = (raw >= tis_floor) & (raw <= tis_cap)
    return torch.where(inside, raw, torch.zeros_like(raw)), mask & ~inside


def opsm_keep(adv: torch.Tensor, lp: torch.Tensor, lp_mu: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """bool [B, 1]: DeepSeek-V3.2's off-policy sequence mask (TRL's ``off_policy_mask_threshold``): a response
    stays unless A < 0 and its mean log(mu/pi_theta) over trained tokens exceeds ``threshold``. Detached."""
    drift = ((lp_mu - lp) * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return (adv >= 0) | (drift <= threshold)


def train_infer_factor(
    lp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype, *, enabled: bool,
    tis_cap: float, tis_floor: float = 0.0, tis_mode: str = "truncate", tis_level: str = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The detached factor pi_old/mu_old of Eq. (5) bounded by ``bounded_is_weight``, and where; (1, none) when off."""
    if not enabled:
        return torch.ones_like(lp_old), torch.zeros_like(mask)
    return bounded_is_weight(lp_old - masked(logp_rollout.detach(), mask, dtype), mask, tis_cap=tis_cap,
                             tis_floor=tis_floor, tis_mode=tis_mode, tis_level=tis_level)


def token_loss_metrics(loss: torch.Tensor, clipped: torch.Tensor, truncated: torch.Tensor, weight: torch.Tensor,
                       ratio_old: torch.Tensor, advantages_BT: torch.Tensor, mask: torch.Tensor,
                       tis_mode: str = "truncate", opsm: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The metrics every token-level objective reports (see ``minirl.algo.minirl``'s docstring),
    as detached 0-dim tensors; ``truncated`` is where the IS bound acted (``is_masked_frac`` under ``tis_mode="mask"``);
    ``opsm`` (bool [B, 1]) adds ``opsm_masked_frac``, the responses with trained tokens it dropped."""
    dtype = weight.dtype
    pos, neg = mask & (advantages_BT > 0), mask & (advantages_BT < 0)
    rows = mask.any(dim=1, keepdim=True)
    return detached(
        ({} if opsm is None else {"opsm_masked_frac": masked_mean((~opsm).to(dtype), rows)}) | {
            "loss": loss,
            "clip_frac": masked_mean(clipped.to(dtype), mask),
            "clip_frac_pos": masked_mean(clipped.to(dtype), pos),
            "clip_frac_neg": masked_mean(clipped.to(dtype), neg),
            "is_masked_frac" if tis_mode == "mask" else "is_truncated_frac": masked_mean(truncated.to(dtype), mask),
            "is_weight_mean": masked_mean(weight, mask),
            "is_weight_max": masked_max(weight, mask),
            "ratio_old_mean": masked_mean(ratio_old, mask),
        }
    )
