"""VESPO, Variational Sequence-level Soft Policy Optimization (arXiv:2602.10693; TRL's ``loss_type="vespo"``).

Not in [P]; instead of a clip, a smooth weight of each response's whole importance ratio scales its REINFORCE term:

    loss   = -(1/N) sum_{i,t} mask_it phi(w_i) A_i log pi_theta(y_it)          (phi detached)
    w_i    = exp( sum_t log(pi_theta/pi_old)_it + sum_t log c_it )           a product over tokens, not a mean
    phi(w) = e^lambda w^k e^(-lambda w)                                      a Gamma kernel, phi(1) = 1

with (k, lambda) = (k_pos, lambda_pos) where A_i >= 0, else (k_neg, lambda_neg) (TRL's defaults 2, 3 and 3, 2).
On policy w = 1 and phi = 1: the gradient is REINFORCE's. c is the bounded training-inference factor
pi_old/mu_old (``is_correction``, token level only, as TRL allows); it enters w instead of multiplying the loss.
In log space with TRL's clamps: each token log-ratio to [-20, 20], each log c and log w to [log 1e-8, 20]; a
non-finite phi is 0. N = ``normalizer`` or the trained tokens (TRL divides by ``num_items_in_batch``).

Metrics: ``token_loss_metrics``' (nothing is clipped) and ``phi_mean``, phi's mean over trained tokens (TRL's
``vespo/phi_seq_mean``).
"""

from __future__ import annotations

import math

import torch

from minirl.algo._common import token_loss_metrics, train_infer_factor
from minirl.loss_inputs import LossInputs, check_knobs
from minirl.tensors import compute_dtype, masked, masked_mean

LOG_FLOOR = math.log(1e-8)


def vespo_loss(
    x: LossInputs, *, k_pos: float = 2.0, lambda_pos: float = 3.0, k_neg: float = 3.0, lambda_neg: float = 2.0,
    is_correction: bool = False, tis_cap: float = 5.0, tis_floor: float = 0.0, tis_mode: str = "truncate",
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """VESPO loss (arXiv:2602.10693), as above. d loss / d logp_{i,t} = -phi(w_i) A_i / N on trained tokens."""
    check_knobs(tis_cap=tis_cap, normalizer=normalizer, tis_floor=tis_floor, tis_mode=tis_mode)
    for name, value, low in (("k_pos", k_pos, 0), ("k_neg", k_neg, 0), ("lambda_pos", lambda_pos, 1e-4),
                             ("lambda_neg", lambda_neg, 1e-4)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
            raise ValueError(f"{name} must be a finite number >= {low}, got {value!r}")
    x.raise_on_nan()
    logp, mask = x.logp, x.mask
    dtype = compute_dtype(logp)
    logp_m = masked(logp, mask, dtype)
    lp_old = masked(x.logp_old.detach(), mask, dtype)
    adv = x.advantages_BT(dtype)
    factor, truncated = train_infer_factor(lp_old, x.logp_rollout, mask, dtype, enabled=is_correction, tis_cap=tis_cap,
                                           tis_floor=tis_floor, tis_mode=tis_mode)
    with torch.no_grad():
        log_w = torch.where(mask, (logp_m - lp_old).clamp(-20.0, 20.0), 0.0).sum(dim=1, keepdim=True)
        if is_correction:
            log_w = log_w + torch.where(mask, factor.log().clamp(LOG_FLOOR, 20.0), 0.0).sum(dim=1, keepdim=True)
        log_w = log_w.clamp(LOG_FLOOR, 20.0)
        positive = adv >= 0
        k = torch.where(positive, torch.tensor(k_pos, dtype=dtype), torch.tensor(k_neg, dtype=dtype))
        lam = torch.where(positive, torch.tensor(lambda_pos, dtype=dtype), torch.tensor(lambda_neg, dtype=dtype))
        phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # [B, 1]
    per_token = torch.where(x.terms, phi * adv * logp_m, torch.zeros((), dtype=dtype, device=logp.device))
    loss = -per_token.sum() / (mask.sum().clamp(min=1).to(dtype) if normalizer is None else normalizer)
    ratio = torch.exp(logp_m.detach() - lp_old)
    metrics = token_loss_metrics(loss, torch.zeros_like(mask), truncated, factor, ratio, adv, mask, tis_mode)
    metrics["phi_mean"] = masked_mean(phi.expand_as(per_token), mask)
    return loss, metrics
