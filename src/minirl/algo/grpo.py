"""GRPO as written in Appendix A of [P] (Zheng et al., arXiv:2512.01374), for comparison only.

    J_GRPO(theta) = E[ (1/G) sum_i (1/|y_i|) sum_t min( r_{i,t} A_i, clip(r_{i,t}, 1 - eps_low, 1 + eps_high) A_i ) ]
    r_{i,t} = pi_theta(y_{i,t}) / pi_old(y_{i,t})          (carries gradient)

How this differs from MiniRL (Eq. (7)) and from what it is usually confused with:

* The ratio r **carries gradient** (PPO surrogate); the token gradient is r * A * grad log pi_theta
  while unclipped and 0 once clipped. MiniRL instead multiplies a detached weight by log pi_theta.
* The ratio is to **pi_old** (trainer), not mu_old (rollout engine): as written, GRPO ignores the
  training–inference discrepancy ([P] App. A, difference 1). ``is_correction=True`` (not part of
  GRPO as written) multiplies each token by the detached factor min(pi_old / mu_old, tis_cap) of Yao et al.
  (2025), or its masked / sequence form (``tis_mode``, ``tis_level``: ``minirl.algo._common.bounded_is_weight``).
* **1/|y_i| length normalisation** per response, then the mean over responses ([P] App. A,
  difference 2). With several prompts in a batch the mean runs over all B responses, which equals
  the mean of per-group means when groups have equal size G. No KL-to-reference term (the
  original GRPO has one; [P] App. A omits it).
* Advantages come from the caller; Appendix A's GRPO divides by the group std
  (``group_advantages(..., std_normalize=True)``).
* Default clip range eps_low = 0.2, eps_high = 0.27, the values [P] uses for MiniRL and the GSPO
  paper (arXiv:2507.18071 §5.1) uses for its GRPO baseline; the original GRPO used 0.2 both sides.

Metrics: those of ``minirl_loss``; clip_frac* count tokens whose clipped branch is active (zero
gradient), is_* describe the training–inference factor (exactly 1 when ``is_correction=False``).
"""

from __future__ import annotations

import torch

from minirl.algo._common import opsm_keep, token_loss_metrics, train_infer_factor
from minirl.loss_inputs import LossInputs, check_knobs
from minirl.tensors import compute_dtype, masked


def grpo_loss(
    x: LossInputs,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.27,
    is_correction: bool = False,
    tis_cap: float = 5.0,
    tis_floor: float = 0.0, tis_mode: str = "truncate", tis_level: str = "token", opsm_threshold: float | None = None,
    dual_clip: float | None = None, normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO loss, the negative of J_GRPO in [P] (arXiv:2512.01374) Appendix A.

    loss = -(1/N) sum_i (1/|y_i|) sum_t c_{i,t} * min(r A_i, clip(r, 1 - eps_low, 1 + eps_high) A_i)

    r = exp(logp - logp_old) with gradient; c = min(exp(logp_old - logp_rollout), tis_cap)
    detached when ``is_correction`` else 1; |y_i| = trained tokens of row i (a row with none
    contributes 0); N = ``normalizer`` or B. d loss / d logp_{i,t} = -c r A_i / (|y_i| N) on
    unclipped tokens, 0 on clipped ones. ``group_ids`` is accepted for the uniform signature and
    ignored.
    """
    check_knobs(eps_low=eps_low, eps_high=eps_high, tis_cap=tis_cap, normalizer=normalizer, tis_floor=tis_floor,
                tis_mode=tis_mode, tis_level=tis_level)
    x.raise_on_nan()
    logp, logp_old, logp_rollout, mask = x.logp, x.logp_old, x.logp_rollout, x.mask

    dtype = compute_dtype(logp)
    logp_m = masked(logp, mask, dtype)
    lp_old = masked(logp_old.detach(), mask, dtype)
    adv = x.advantages_BT(dtype)

    ratio = torch.exp(logp_m - lp_old)  # r with gradient; exactly 1 at padding
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    if dual_clip is not None:  # dual clip (verl clip_ratio_c, TRL delta): A < 0 and r > c costs -c A, no gradient
        surrogate = torch.where((adv < 0) & (ratio.detach() > dual_clip), dual_clip * adv, surrogate)
    factor, truncated = train_infer_factor(lp_old, logp_rollout, mask, dtype, enabled=is_correction, tis_cap=tis_cap,
                                           tis_floor=tis_floor, tis_mode=tis_mode, tis_level=tis_level)

    zero = torch.zeros((), dtype=dtype, device=logp.device)
    opsm = None if opsm_threshold is None else opsm_keep(  # mu as MiniRL's: pi_old without IS correction
        adv, logp_m.detach(), masked(logp_rollout.detach(), mask, dtype) if is_correction else lp_old, mask, opsm_threshold)
    per_token = torch.where(x.terms & (True if opsm is None else opsm), factor * surrogate, zero)
    lengths = mask.sum(dim=1).clamp(min=1).to(dtype)
    denom = logp.shape[0] if normalizer is None else normalizer
    loss = -(per_token.sum(dim=1) / lengths).sum() / denom

    r = ratio.detach()
    pos = mask & (adv > 0)
    neg = mask & (adv < 0)
    clipped = (pos & (r > 1 + eps_high)) | (neg & ((r < 1 - eps_low) | (r > (dual_clip or torch.inf))))
    metrics = token_loss_metrics(loss, clipped, truncated, factor, r, adv, mask, tis_mode, opsm)
    return loss, metrics
