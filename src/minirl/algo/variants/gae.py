"""PPO with a learned critic: generalized advantage estimation and the clipped value loss (``algo.adv_baseline: critic``;
verl's default ``algorithm.adv_estimator: gae``). The paper's MiniRL is critic-free; this is what verl's PPO runs.

GAE (Schulman et al. 2016, arXiv 1506.02438, Eq. 16) with the token rewards of an outcome reward, R_i at the
response's last token and, with the KL in the reward, -beta k_it at every token (``token_returns``' rewards):

    delta_it = r_it + gamma V_i,t+1 - V_it,      A_it = sum_{l >= 0} (gamma lambda)^l delta_i,t+l,      G_it = A_it + V_it

over trained tokens (V after a response's last token is 0), as verl's ``compute_gae_advantage_return`` loops it; the
policy trains on A whitened over the step's tokens. The critic V_phi regresses on G with PPO's clipped value loss
(verl's ``compute_value_loss``; Ziegler et al. 2019's value clipping), normaliser_i the mini-batch's trained tokens
(``token-mean``), its responses x response i's tokens (``seq-mean-token-mean``), its responses (x the budget, -norm):

    L_V = 1/2 * sum_it mask_it max((V_phi - G)^2, (clip(V_phi, V_old - c, V_old + c) - G)^2) / normaliser_i
"""

from __future__ import annotations

import torch

from minirl.algo.variants.token_returns import token_rewards


def gae_advantages(rewards_B: torch.Tensor, values_BT: torch.Tensor, mask_BT: torch.Tensor, *, gamma: float = 1.0,
                   lam: float = 1.0, token_rewards_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [B, T], G [B, T]) of the equation above, before whitening; 0 off ``mask`` (G = A + V there too, as
    verl's). ``rewards_B`` sits at each row's last trained token, ``token_rewards_BT`` at every trained token."""
    if values_BT.shape != mask_BT.shape:
        raise ValueError(f"values {tuple(values_BT.shape)} and mask {tuple(mask_BT.shape)} must have the same shape")
    rewards_BT = token_rewards(rewards_B, mask_BT, token_rewards_BT)
    mask = mask_BT.to(rewards_BT.dtype)
    values = values_BT.to(rewards_BT.dtype) * mask
    advantages = torch.zeros_like(rewards_BT)
    next_value = torch.zeros(mask.shape[0], dtype=rewards_BT.dtype, device=mask.device)
    last = torch.zeros_like(next_value)
    for t in range(mask.shape[1] - 1, -1, -1):  # an untrained position passes V and A through unchanged
        delta = rewards_BT[:, t] + gamma * next_value - values[:, t]
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        last = (delta + gamma * lam * last) * mask[:, t] + (1 - mask[:, t]) * last
        advantages[:, t] = last
    return advantages * mask, (advantages + values) * mask


def value_loss(values: torch.Tensor, values_old: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               clip_range: float, normalizer: float | torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(L_V, metrics) of the equation above: ``values`` V_phi [B, T] (with gradient), ``values_old`` and ``returns``
    constants, ``normalizer`` a number or one per row [B, 1]; ``vf_clipfrac``, the trained tokens whose clipped error is
    the larger, and ``vpred_mean``."""
    m = mask.to(values.dtype)
    clipped = values_old + (values - values_old).clamp(-clip_range, clip_range)
    unclipped_error, clipped_error = (values - returns).square(), (clipped - returns).square()
    loss = 0.5 * (torch.maximum(unclipped_error, clipped_error) * m / normalizer).sum()
    tokens = m.sum().clamp(min=1)
    return loss, {"vf_clipfrac": ((clipped_error > unclipped_error).to(m.dtype) * m).sum().detach() / tokens,
                  "vpred_mean": (values.detach() * m).sum() / tokens}
