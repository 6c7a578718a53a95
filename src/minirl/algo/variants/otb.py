"""verl's optimal token baseline (``adv_estimator: optimal_token_baseline``, arXiv 2602.07078; verl's
``compute_optimal_token_baseline_advantage``): a baseline per token position, the group's returns weighted by each
path's accumulated energy. G_ik: the return from response i's k-th trained token (the reward less the KL in the reward
from there on); pi_ik = pi_old(y_ik); S_ik = sum_w pi_old(w)^2 there; rho_ik = bounded pi_old/mu_old (1 without IS):

    W_ik = sum_{j <= k} (1 - 2 pi_ij + S_ij) rho_ij^2,      B_k = sum_i G_ik W_ik / (sum_i W_ik + 1e-8),      A_ik = G_ik - B_k

sums over the group's responses with a k-th trained token. A group of one keeps A = G; a group's one longest response
has B = 0 past the second longest (verl's ``handle_zero_tail``, its default). k counts trained tokens (verl's column
of the response for a response trained whole; its multi-turn variant's count when tool tokens are masked).
"""

from __future__ import annotations

import torch


def optimal_token_advantages(returns_BT: torch.Tensor, logp_old_BT: torch.Tensor, sum_pi_sq_BT: torch.Tensor,
                             mask_BT: torch.Tensor, group_ids: torch.Tensor, is_weight_BT: torch.Tensor | None = None,
                             eps: float = 1e-8) -> torch.Tensor:
    """A [B, T] of the equation above (0 off ``mask``); ``returns_BT`` G, ``group_ids`` [B] the rows' prompts."""
    mask = mask_BT.to(returns_BT.dtype)
    energy = (1 - 2 * logp_old_BT.exp() + sum_pi_sq_BT) * mask
    if is_weight_BT is not None:
        energy = energy * is_weight_BT.square()
    k = (mask_BT.long().cumsum(dim=1) - 1).clamp(min=0)  # each trained token's index in its response
    width, rows = int(mask_BT.sum(dim=1).max()), torch.arange(mask_BT.shape[0], device=mask_BT.device)[:, None]

    def compact(values: torch.Tensor) -> torch.Tensor:  # [B, K]: the k-th trained token's value at column k
        return values.new_zeros(mask_BT.shape[0], width + 1).index_put_(
            (rows.expand_as(k), torch.where(mask_BT, k, width)), values * mask, accumulate=True)[:, :width]

    g, w = compact(returns_BT), compact(energy).cumsum(dim=1)
    present = compact(mask)
    baseline = torch.zeros_like(g)
    for group in group_ids.unique():
        members = (group_ids == group).nonzero().squeeze(1)
        if len(members) < 2:
            continue
        weights = w[members] * present[members]
        baseline[members] = (g[members] * weights).sum(dim=0) / (weights.sum(dim=0) + eps)
        lengths = present[members].sum(dim=1)
        top = lengths.topk(2).values
        if top[0] > top[1]:  # handle_zero_tail: no other response reaches past the second longest
            baseline[members[lengths.argmax()], int(top[1]):] = 0.0
    advantages = g - baseline
    return advantages.gather(1, k.clamp(max=max(width - 1, 0))) * mask if width else torch.zeros_like(returns_BT)
