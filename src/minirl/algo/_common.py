"""What the loss functions share: the training–inference IS factor and the token metrics. Pure, no host sync."""

from __future__ import annotations

import torch

from minirl.tensors import detached, masked, masked_max, masked_mean


def train_infer_factor(
    lp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype, *, enabled: bool, tis_cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(min(pi_old/mu_old, tis_cap), where the cap bit) — the detached IS factor of Eq. (5); (1, none) when off."""
    if not enabled:
        return torch.ones_like(lp_old), torch.zeros_like(mask)
    raw = torch.exp(lp_old - masked(logp_rollout.detach(), mask, dtype))
    return raw.clamp(max=tis_cap), mask & (raw > tis_cap)


def token_loss_metrics(loss: torch.Tensor, clipped: torch.Tensor, truncated: torch.Tensor, weight: torch.Tensor,
                       ratio_old: torch.Tensor, advantages_BT: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
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
