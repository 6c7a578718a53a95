"""The KL penalty in the reward (verl's ``algorithm.use_kl_in_reward``; ``algo.kl_in_reward_coef``).

Where ``reference_kl`` adds a loss term, verl's trainer subtracts beta x the per-token KL estimate of pi_old
against the reference from the token-level rewards (``apply_kl_penalty``), and its outcome estimators (GRPO,
RLOO, REINFORCE++-baseline) sum a response's token rewards, so each response's reward becomes

    R_i' = R_i - beta * sum_t mask_it k(logp_old_it, logp_ref_it)

before the group baseline. The estimate is a constant of the update (no gradient). beta stays fixed, or adapts
toward a target KL (Ziegler et al. 2019, arXiv 1909.08593, Sec. 2.2; verl's ``AdaptiveKLController``):

    e = clip(KL / target - 1, -0.2, 0.2),   beta <- beta * (1 + e * n / horizon)

with KL the step's mean over responses of each one's token-mean estimate and n the step's responses.
"""

from __future__ import annotations

import torch

from minirl.algo.variants.reference_kl import KLEstimator, kl_estimate


def kl_penalized_rewards(rewards: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, *,
                         coef: float, kind: KLEstimator = "k1") -> tuple[torch.Tensor, torch.Tensor]:
    """(R' [B], KL): the rewards less ``coef`` x each response's summed estimate, and verl's ``current_kl`` (the
    mean over responses of the masked token mean, 1e-8 in the denominator as verl's ``masked_mean``).
    ``FloatingPointError`` on a non-finite estimate at a response token."""
    estimate, current = token_kl_estimate(logp_old, logp_ref, mask, kind)
    return rewards - coef * estimate.sum(dim=1), current


def token_kl_estimate(logp_old: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor,
                      kind: KLEstimator = "k1") -> tuple[torch.Tensor, torch.Tensor]:
    """(k [B, T], KL): the per-token estimate at the response tokens (0 elsewhere; -beta k is verl's token-level
    reward, ``minirl.algo.variants.token_returns``) and verl's ``current_kl`` as above. ``FloatingPointError`` on a
    non-finite estimate at a response token."""
    estimate = torch.where(mask, kl_estimate(logp_old, logp_ref, kind), 0.0)
    if not bool(torch.isfinite(estimate).all()):
        raise FloatingPointError("non-finite KL in the reward (a NaN log-prob of pi_old or pi_ref at a response token)")
    return estimate, (estimate.sum(dim=1) / (mask.sum(dim=1) + 1e-8)).mean()


def adaptive_kl_coef(coef: float, current_kl: float, *, target: float, horizon: int, n_steps: int) -> float:
    """beta after a step whose KL was ``current_kl`` over ``n_steps`` responses (the equation above)."""
    error = min(max(current_kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * n_steps / horizon)
