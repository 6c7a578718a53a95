"""CISPO as written in Appendix A of [P] (Zheng et al., arXiv:2512.01374), for comparison only.

    J_CISPO(theta) = E[ (1 / sum_{i=1}^G |y_i|) sum_i sum_t sg[ clip(r_{i,t}, 1 - eps_low, 1 + eps_high) ] A_i log pi_theta(y_{i,t}) ]
    r_{i,t} = pi_theta(y_{i,t}) / pi_old(y_{i,t})

How this differs from MiniRL (Eq. (7)) and from what it is usually confused with:

* Like MiniRL it is REINFORCE with a **detached** weight on log pi_theta, but the weight is the
  **clamped** staleness ratio pi_theta/pi_old (no mu_old: the training–inference discrepancy is
  ignored as written, [P] App. A difference 1), and **no token is ever masked**: clipping clamps
  the weight's value instead of dropping the token's gradient (difference 3; [P] argues this
  destabilises training). PPO/GRPO clipping, by contrast, zeroes the gradient.
* Normalisation is **per group**: divide by the group's total token count sum_{i in g} |y_i|
  (difference 2). The Appendix formula is for one prompt; with several groups in a batch this
  averages the per-group objectives: loss = -(1/N) sum_g (1/T_g) sum_{i in g} sum_t (...),
  N = number of distinct ``group_ids`` (or ``normalizer``). So the group token counts are
  right, every response of a group must be in the same call (micro-batches must not split
  groups).
* ``is_correction=True`` (not part of CISPO as written) multiplies each token by the detached,
  truncated factor min(pi_old / mu_old, tis_cap), or its masked / sequence form (``bounded_is_weight``).
* Default clip range 0.2 / 0.27 (the values [P] uses for MiniRL); the CISPO paper (MiniMax-M1)
  tunes only the upper bound and leaves the lower one open: eps_low >= 1 does that. ``aggregation=
  "token_mean"`` divides by the mini-batch's tokens instead (ScaleRL's and TRL's ``loss_type="cispo"``).

Metrics: those of ``minirl_loss``; clip_frac* count tokens whose weight was clamped (the gradient is kept, unlike the
other objectives), is_* describe the training–inference factor (exactly 1 when ``is_correction=False``).
"""

from __future__ import annotations

import torch

from minirl.algo._common import opsm_keep, token_loss_metrics, train_infer_factor
from minirl.loss_inputs import LossInputs, check_knobs
from minirl.tensors import compute_dtype, masked


def cispo_loss(
    x: LossInputs,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.27,
    is_correction: bool = False,
    tis_cap: float = 5.0,
    tis_floor: float = 0.0, tis_mode: str = "truncate", tis_level: str = "token", opsm_threshold: float | None = None,
    aggregation: str = "group", normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO loss, the negative of J_CISPO in [P] (arXiv:2512.01374) Appendix A, averaged over groups.

    loss = -(1/N) sum_g (1/T_g) sum_{i in g} sum_t sg[clip(r, 1 - eps_low, 1 + eps_high) * c] * A_i * logp_{i,t}

    r = exp(logp - logp_old) (detached); c = min(exp(logp_old - logp_rollout), tis_cap) when
    ``is_correction`` else 1; T_g = trained tokens of group g (a group with none contributes 0);
    N = ``normalizer`` or the number of distinct ``group_ids``; ``"token_mean"``: sum / (``normalizer`` or the
    trained tokens). d loss / d logp_{i,t} = -clip(r) c A_i / (T_{g(i)} N) on every trained token.
    """
    if aggregation not in ("group", "token_mean"):
        raise ValueError(f"aggregation must be 'group' or 'token_mean', got {aggregation!r}")
    check_knobs(eps_low=eps_low, eps_high=eps_high, tis_cap=tis_cap, normalizer=normalizer, tis_floor=tis_floor,
                tis_mode=tis_mode, tis_level=tis_level)
    group_ids = x.require_groups()  # CISPO normalises per group: ValueError without them
    x.raise_on_nan()
    logp, logp_old, logp_rollout, mask = x.logp, x.logp_old, x.logp_rollout, x.mask

    dtype = compute_dtype(logp)
    logp_m = masked(logp, mask, dtype)
    lp = logp_m.detach()
    lp_old = masked(logp_old.detach(), mask, dtype)
    adv = x.advantages_BT(dtype)

    ratio = torch.exp(lp - lp_old)  # detached
    weight = ratio.clamp(1 - eps_low, 1 + eps_high)
    factor, truncated = train_infer_factor(lp_old, logp_rollout, mask, dtype, enabled=is_correction, tis_cap=tis_cap,
                                           tis_floor=tis_floor, tis_mode=tis_mode, tis_level=tis_level)

    zero = torch.zeros((), dtype=dtype, device=logp.device)
    opsm = None if opsm_threshold is None else opsm_keep(  # mu as MiniRL's: pi_old without IS correction
        adv, lp, masked(logp_rollout.detach(), mask, dtype) if is_correction else lp_old, mask, opsm_threshold)
    per_token = torch.where(x.terms & (True if opsm is None else opsm), weight * factor * adv * logp_m, zero)
    if aggregation == "token_mean":
        loss = -per_token.sum() / (mask.sum().clamp(min=1).to(dtype) if normalizer is None else normalizer)
    else:
        same_group = (group_ids[:, None] == group_ids[None, :]).to(dtype)  # [B, B]: exact integer sums, no host sync
        row_denom = (same_group @ mask.sum(dim=1).to(dtype)).clamp(min=1)  # T_{g(i)} per row
        denom = float(torch.unique(group_ids).numel()) if normalizer is None else normalizer  # a sync only without one
        loss = -(per_token.sum(dim=1) / row_denom).sum() / denom

    clamped = mask & ((ratio < 1 - eps_low) | (ratio > 1 + eps_high))
    metrics = token_loss_metrics(loss, clamped, truncated, factor, ratio, adv, mask, tis_mode, opsm)
    return loss, metrics
