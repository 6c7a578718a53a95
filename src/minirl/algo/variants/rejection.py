"""Rejection of tokens or responses whose training–inference divergence is out of bounds (verl's ``rollout_rs``).

Per trained token, with log rho_t = log pi_old(y_t) - log mu_old(y_t) (the factor of Eq. (5)): k1 = log rho_t, k2 =
(log rho_t)^2 / 2, k3 = rho_t - 1 - log rho_t. ``rule`` = ``<scope>_<k>``: ``token`` checks each token's, ``seq_sum``
/ ``seq_mean`` / ``seq_max`` a response's sum / mean / max (a response fails or passes whole). k1 keeps
``low <= exp(statistic) <= high`` (a ratio: token rho_t, seq_sum the response's product, seq_mean its geometric
mean); k2 and k3 keep ``statistic <= high``. Not in [P]: an alternative to truncating the weight, as verl offers it.
"""

from __future__ import annotations

import math

import torch

from minirl.tensors import masked

REJECTION_RULES = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
                   "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def rejection_keep(logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor, *, rule: str,
                   low: float = 0.0, high: float = math.inf) -> torch.Tensor:
    """bool [B, T]: the trained tokens (``mask``) that pass ``rule`` (see the module docstring). Detached."""
    if rule not in REJECTION_RULES:
        raise ValueError(f"rule must be one of {REJECTION_RULES}, got {rule!r}")
    dtype = torch.float64 if logp_old.dtype == torch.float64 else torch.float32
    log_rho = masked(logp_old.detach(), mask, dtype) - masked(logp_rollout.detach(), mask, dtype)
    scope, kind = rule.rsplit("_", 1)
    value = {"k1": log_rho, "k2": 0.5 * log_rho**2, "k3": torch.expm1(log_rho) - log_rho}[kind]
    if scope == "seq_sum":
        value = value.sum(dim=1, keepdim=True)
    elif scope == "seq_mean":
        value = value.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    elif scope == "seq_max":
        value = value.masked_fill(~mask, -math.inf).amax(dim=1, keepdim=True)
    floor = math.log(low) if kind == "k1" and low > 0 else -math.inf
    upper = math.log(high) if kind == "k1" else high
    return mask & (value >= floor) & (value <= upper)
