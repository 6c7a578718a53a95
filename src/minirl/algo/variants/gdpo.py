"""GDPO's advantages for several reward functions (Group reward-Decoupled Normalization Policy Optimization,
arXiv 2601.05242; TRL ``multi_objective_aggregation="normalize_then_sum"``; ``algo.multi_objective_aggregation``).

Not in [P] (arXiv:2512.01374), whose reward is one verifier's: with several, a summed reward lets the function with
the widest spread set every group's ranking; normalising each within its group first keeps every function's signal.
"""

from __future__ import annotations

import torch

from minirl.algo.advantages import STD_EPS


def decoupled_advantages(parts_PGK: torch.Tensor, weights: torch.Tensor, std_eps: float = STD_EPS) -> torch.Tensor:
    """GDPO's advantages [P, G] (arXiv 2601.05242, TRL ``multi_objective_aggregation="normalize_then_sum"``) from
    each reward function's rewards [P, G, K] (NaN where function k did not apply) and their weights [K]:

        z_k = (R_k - mean_G(R_k)) / (std_G(R_k) + eps)      each function over its group (NaN ignored)
        S   = sum_k w_k z_k                                   (a response no function applied to: no S)
        A   = (S - mean(S)) / (std(S) + eps)                  over the whole batch; 0 for a response without S

    eps = ``std_eps`` (1e-6; TRL's 1e-4).

    Stds unbiased, as ``group_advantages``. A summed reward would let the function with the widest spread set
    every group's ranking; normalising each first keeps every function's signal."""
    summed = decoupled_sum(parts_PGK, weights, std_eps)
    return ((summed - summed.nanmean()) / (_nanstd(summed) + std_eps)).nan_to_num(0.0)


def decoupled_sum(parts_PGK: torch.Tensor, weights: torch.Tensor, std_eps: float = STD_EPS) -> torch.Tensor:
    """S [P, G] of ``decoupled_advantages`` before its whitening (NaN: no function applied; verl's: over tokens)."""
    if parts_PGK.ndim != 3 or weights.shape != parts_PGK.shape[2:]:
        raise ValueError(f"parts_PGK must be [P, G, K] and weights [K], got {tuple(parts_PGK.shape)} and {tuple(weights.shape)}")
    parts = parts_PGK.to(torch.promote_types(parts_PGK.dtype, torch.float32))
    z = (parts - parts.nanmean(dim=1, keepdim=True)) / (_nanstd(parts, dim=1) + std_eps)
    summed = (z * weights.to(parts.dtype)).nansum(dim=2)
    return summed.masked_fill(torch.isnan(parts).all(dim=2), torch.nan)


def _nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The unbiased std ignoring NaN (NaN with fewer than two values), keeping ``dim``."""
    dims = dim if dim is not None else tuple(range(x.ndim))
    mean = x.nanmean(dim=dims, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dims, keepdim=True)
    variance = ((x - mean) ** 2).nanmean(dim=dims, keepdim=True) * count / (count - 1)
    return variance.sqrt()
