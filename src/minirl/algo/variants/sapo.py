"""SAPO, Soft Adaptive Policy Optimization (Gao et al., Qwen, arXiv:2511.20347), for comparison only.

Not in [P] (arXiv:2512.01374); the same team's answer to the same instability: instead of PPO's hard clip,
which zeroes a token's gradient once r leaves [1 - eps_low, 1 + eps_high], a smooth gate attenuates it:

    J_SAPO(theta) = E[ (1/G) sum_i (1/|y_i|) sum_t f_{i,t}(r_{i,t}) A_i ]                  SAPO Eq. (5)-(6)
    f_{i,t}(r)    = sigma(tau_{i,t} (r - 1)) * 4 / tau_{i,t},   tau = tau_pos if A_i > 0 else tau_neg
    r_{i,t}       = pi_theta(y_{i,t}) / pi_old(y_{i,t})          (carries gradient)

d f / d r = 4 sigma (1 - sigma), which is 1 at r = 1 (on policy SAPO's gradient is GRPO's) and decays smoothly
as r moves away; tau_neg > tau_pos decays the gradient of negative-advantage tokens faster (their ratios are the
unstable ones, SAPO §3). Defaults tau_pos = 1.0, tau_neg = 1.05 (SAPO's and TRL's ``sapo_temperature_pos/neg``).
Aggregation as GRPO: each response's token mean, then the mean over responses (TRL's ``loss_type="sapo"``).
``is_correction`` / ``tis_*`` / ``opsm_threshold``: the training–inference factor and OPSM as in ``grpo_loss``.

Metrics: those of ``grpo_loss`` (no token is clipped: clip_frac* are 0) and ``gate_weight_mean``, the mean over
trained tokens of 4 sigma (1 - sigma), the factor by which the gate scales each token's gradient r A grad log pi.
"""

from __future__ import annotations

import math

import torch

from minirl.algo._common import opsm_keep, token_loss_metrics, train_infer_factor
from minirl.loss_inputs import LossInputs, check_knobs
from minirl.tensors import compute_dtype, masked, masked_mean


def sapo_loss(
    x: LossInputs,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    is_correction: bool = False,
    tis_cap: float = 5.0,
    tis_floor: float = 0.0, tis_mode: str = "truncate", tis_level: str = "token", opsm_threshold: float | None = None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO loss, the negative of J_SAPO (arXiv:2511.20347):

    loss = -(1/N) sum_i (1/|y_i|) sum_t c_{i,t} * sigma(tau (r - 1)) * (4 / tau) * A_i

    r = exp(logp - logp_old) with gradient; c the detached training–inference factor (1 when
    ``is_correction`` is off); |y_i| = trained tokens of row i; N = ``normalizer`` or B.
    d loss / d logp_{i,t} = -c * 4 sigma (1 - sigma) * r * A_i / (|y_i| N).
    """
    check_knobs(tis_cap=tis_cap, normalizer=normalizer, tis_floor=tis_floor, tis_mode=tis_mode, tis_level=tis_level)
    for name, value in (("tau_pos", tau_pos), ("tau_neg", tau_neg)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    x.raise_on_nan()
    logp, logp_old, logp_rollout, mask = x.logp, x.logp_old, x.logp_rollout, x.mask

    dtype = compute_dtype(logp)
    logp_m = masked(logp, mask, dtype)
    lp_old = masked(logp_old.detach(), mask, dtype)
    adv = x.advantages_BT(dtype)

    ratio = torch.exp(logp_m - lp_old)  # r with gradient; exactly 1 at padding
    tau = torch.where(adv > 0, torch.tensor(tau_pos, dtype=dtype), torch.tensor(tau_neg, dtype=dtype))  # not float32
    gate = torch.sigmoid(tau * (ratio - 1))
    factor, truncated = train_infer_factor(lp_old, logp_rollout, mask, dtype, enabled=is_correction, tis_cap=tis_cap,
                                           tis_floor=tis_floor, tis_mode=tis_mode, tis_level=tis_level)

    zero = torch.zeros((), dtype=dtype, device=logp.device)
    opsm = None if opsm_threshold is None else opsm_keep(  # mu as GRPO's
        adv, logp_m.detach(), masked(logp_rollout.detach(), mask, dtype) if is_correction else lp_old, mask, opsm_threshold)
    per_token = torch.where(x.terms & (True if opsm is None else opsm), factor * gate * (4 / tau) * adv, zero)
    lengths = mask.sum(dim=1).clamp(min=1).to(dtype)
    denom = logp.shape[0] if normalizer is None else normalizer
    loss = -(per_token.sum(dim=1) / lengths).sum() / denom

    g = gate.detach()
    metrics = token_loss_metrics(loss, torch.zeros_like(mask), truncated, factor, ratio.detach(), adv, mask, tis_mode, opsm)
    metrics["gate_weight_mean"] = masked_mean(4 * g * (1 - g), mask).detach()
    return loss, metrics
