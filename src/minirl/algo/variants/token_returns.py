"""Token-level returns: REINFORCE++ (arXiv 2501.03262) and ReMax (arXiv 2310.10505) as verl computes them, with a
per-token reward (verl's ``compute_reinforce_plus_plus_outcome_advantage`` / ``compute_remax_outcome_advantage``).

The paper's estimators give every token of a response one advantage. verl's REINFORCE++ and ReMax take each token's
*return* instead: the outcome reward R_i sits at the response's last token, the KL penalty in the reward
(``use_kl_in_reward``, ``minirl.algo.variants.kl_reward``) at every token, and a token's return sums the rewards from
it to the end, discounted by gamma:

    r_it = -beta k_it + [t = last_i] R_i,        G_it = sum_{s >= t} gamma^(s - t) r_is        (over trained tokens)

REINFORCE++ whitens G over the batch's tokens (``masked_whiten``); ReMax subtracts the greedy reward from each G.
With gamma = 1 and no per-token reward G_it = R_i: ``adv_baseline: none`` + ``adv_whiten`` (or ``greedy``).
"""

from __future__ import annotations

import torch


def token_rewards(rewards_B: torch.Tensor, mask_BT: torch.Tensor, token_rewards_BT: torch.Tensor | None = None) -> torch.Tensor:
    """r [B, T] (0 off ``mask``): ``rewards_B`` at each row's last trained token (a row with none gets nothing),
    plus ``token_rewards_BT`` (e.g. -beta x the KL estimate) at every trained token."""
    if rewards_B.ndim != 1 or mask_BT.ndim != 2 or rewards_B.shape[0] != mask_BT.shape[0]:
        raise ValueError(f"rewards [B] and mask [B, T] of the same B, got {tuple(rewards_B.shape)} and {tuple(mask_BT.shape)}")
    dtype = rewards_B.dtype if rewards_B.is_floating_point() else torch.float32
    positions = torch.arange(mask_BT.shape[1], device=mask_BT.device)
    last = torch.where(mask_BT, positions, -1).amax(dim=1)  # -1: no trained token
    rewards_BT = torch.zeros(mask_BT.shape, dtype=dtype, device=mask_BT.device)
    has = last >= 0
    rewards_BT[has, last[has]] = rewards_B.to(dtype)[has]
    if token_rewards_BT is not None:
        rewards_BT = rewards_BT + token_rewards_BT.to(dtype)
    return rewards_BT * mask_BT.to(dtype)


def token_returns(rewards_B: torch.Tensor, mask_BT: torch.Tensor, *, gamma: float = 1.0,
                  token_rewards_BT: torch.Tensor | None = None) -> torch.Tensor:
    """G [B, T] (0 off ``mask``): each trained token's discounted return of ``token_rewards``' r, the equation
    above. The running return restarts at every untrained position, as verl's loop does after a response's end."""
    rewards_BT = token_rewards(rewards_B, mask_BT, token_rewards_BT)
    mask = mask_BT.to(rewards_BT.dtype)
    returns = torch.zeros_like(rewards_BT)
    running = torch.zeros(mask_BT.shape[0], dtype=rewards_BT.dtype, device=mask_BT.device)
    for t in range(mask_BT.shape[1] - 1, -1, -1):
        running = (rewards_BT[:, t] + gamma * running) * mask[:, t]
        returns[:, t] = running
    return returns


def masked_whiten(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """(v - m) / sqrt(s^2 + 1e-8) at the trained tokens, 0 elsewhere: m and s^2 the mean and unbiased variance over
    the batch's trained tokens, 1e-8 in the mean's denominator (verl's ``masked_whiten``). Needs two tokens."""
    mask = mask_BT.to(values_BT.dtype)
    tokens = mask.sum()
    if tokens < 2:
        raise ValueError("whitening over tokens needs at least two trained tokens")
    mean = (values_BT * mask).sum() / (tokens + 1e-8)
    variance = ((values_BT - mean).square() * mask).sum() / (tokens + 1e-8) * (tokens / (tokens - 1))
    return (values_BT - mean) * torch.rsqrt(variance + 1e-8) * mask
