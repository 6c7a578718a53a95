"""Routing agreement (``routing/*``): two route tensors compared as top-k sets per (token, layer)."""

from __future__ import annotations

import torch


def _as_sets(routes: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[B, T, L, K] expert ids -> [B, T, L, E] bool membership (-1 entries ignored)."""
    r = routes.long()
    member = torch.zeros(*r.shape[:-1], num_classes + 1, dtype=torch.bool, device=r.device)
    member.scatter_(-1, torch.where(r < 0, num_classes, r), True)
    return member[..., :num_classes]


def routing_agreement(routes_a: torch.Tensor, routes_b: torch.Tensor, valid_mask: torch.Tensor) -> dict:
    """Compare two [B, T, L, K] route tensors as top-k *sets* per (token, layer).

    Only (token, layer) pairs where ``valid_mask`` [B, T] is True and neither side has a -1 row are
    counted. Returns floats:

    - ``route_diff_frac``: fraction of counted (token, layer) sets that differ;
    - ``route_diff_frac_layer{i}``: the same, per MoE layer i;
    - ``route_diff_any_layer_frac``: fraction of tokens (with at least one counted layer) where
      any counted layer differs;
    - ``route_counted_pairs``: how many (token, layer) pairs were counted.

    Fractions are 0.0 when nothing is counted.
    """
    if routes_a.shape != routes_b.shape or routes_a.dim() != 4:
        raise ValueError(
            f"routes must both be [B, T, L, K] of one shape, got {tuple(routes_a.shape)} and {tuple(routes_b.shape)}"
        )
    if tuple(valid_mask.shape) != tuple(routes_a.shape[:2]):
        raise ValueError(f"valid_mask must be [B, T] = {tuple(routes_a.shape[:2])}, got {tuple(valid_mask.shape)}")
    a = routes_a.long()
    b = routes_b.to(device=a.device).long()
    L = a.shape[2]
    num_classes = int(max(a.max().item() if a.numel() else 0, b.max().item() if b.numel() else 0)) + 1
    differ = (_as_sets(a, num_classes) != _as_sets(b, num_classes)).any(dim=-1)  # [B, T, L]
    counted = (
        valid_mask.to(device=a.device, dtype=torch.bool)[:, :, None]
        & (a >= 0).all(dim=-1)
        & (b >= 0).all(dim=-1)
    )
    diff = differ & counted

    def frac(num: torch.Tensor, den: torch.Tensor) -> float:
        d = int(den.sum())
        return float(num.sum()) / d if d else 0.0

    out = {"route_diff_frac": frac(diff, counted), "route_counted_pairs": float(counted.sum())}
    for i in range(L):
        out[f"route_diff_frac_layer{i}"] = frac(diff[:, :, i], counted[:, :, i])
    out["route_diff_any_layer_frac"] = frac(diff.any(dim=-1), counted.any(dim=-1))
    return out


def route_diff_counts(routes_a: torch.Tensor, routes_b: torch.Tensor, valid_mask: torch.Tensor,
                      num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(differing, counted) (token, layer) pairs of ``routing_agreement`` as 0-dim long tensors, with the
    expert count given, so nothing waits for the device (the trainer sums them over micro-batches)."""
    a, b = routes_a.long(), routes_b.to(device=routes_a.device).long()
    differ = (_as_sets(a, num_experts) != _as_sets(b, num_experts)).any(dim=-1)  # [B, T, L]
    counted = valid_mask.to(device=a.device, dtype=torch.bool)[:, :, None] & (a >= 0).all(dim=-1) & (b >= 0).all(dim=-1)
    return (differ & counted).sum(), counted.sum()
