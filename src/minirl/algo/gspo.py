"""GSPO, Group Sequence Policy Optimization (Zheng et al., arXiv:2507.18071), for comparison only.

Not in [P] (arXiv:2512.01374) Appendix A; [P] cites GSPO only for sequence-level clipping
(footnote 3) and as the origin of Routing Replay (R2). Formulas are from the GSPO paper:

    J_GSPO(theta) = E[ (1/G) sum_i min( s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i ) ]      GSPO Eq. (5)
    s_i(theta)    = exp( (1/|y_i|) sum_t log( pi_theta(y_{i,t}) / pi_old(y_{i,t}) ) )              GSPO Eq. (7)

How this differs from GRPO and MiniRL:

* One **sequence-level** ratio per response: the geometric mean of the token ratios, with
  gradient. Clipping keeps or drops a **whole response**; every token of a kept response gets
  the same weight s_i A_i / |y_i| (GSPO Eq. (10)), unlike GRPO's per-token r_{i,t}.
* The clip range is two orders of magnitude tighter than token-level clipping: defaults
  eps_low = 3e-4, eps_high = 4e-4 (GSPO §5.1, "left and right clipping ranges in Equation (5)").
* Ratios are to pi_old only: no training–inference (mu_old) correction, no TIS.
* 1/|y_i| enters through s_i (length-normalised log-ratio), which [P] argues against for
  token-level objectives; the response mean is over all B rows (= (1/G) sum_i per group).
  Rows with no trained token contribute 0. Advantages come from the caller (GSPO Eq. (6) uses
  the std-normalised group advantage).

Metrics (detached 0-dim tensors; 0.0 on empty selections):
    loss; clip_frac / clip_frac_pos / clip_frac_neg: fraction of trained tokens lying in clipped
    responses (token-weighted, as the "fraction of clipped tokens" of GSPO §5.2), overall and
    among A > 0 / A < 0 tokens; seq_clip_frac: fraction of responses (with >= 1 trained token)
    that are clipped; seq_ratio_mean: mean s_i over those responses; ratio_old_mean: mean
    token-level r = pi_theta / pi_old over trained tokens.
"""

from __future__ import annotations

import torch

from minirl.loss_inputs import LossInputs, check_knobs
from minirl.tensors import compute_dtype, detached, masked, masked_mean

GSPO_EPS_LOW: float = 3e-4
GSPO_EPS_HIGH: float = 4e-4


def gspo_loss(
    x: LossInputs,
    *,
    eps_low: float = GSPO_EPS_LOW,
    eps_high: float = GSPO_EPS_HIGH,
    normalizer: float | None = None,
    length_weighted: bool = False,
    sequence_ratio: str = "mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO loss, the negative of GSPO Eq. (5) with the sequence ratio of GSPO Eq. (7) (arXiv:2507.18071).

    loss = -(1/N) sum_{i: |y_i| > 0} min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)
    s_i  = exp( sum_t mask (logp - logp_old) / |y_i| )   (gradient through logp)

    N = ``normalizer`` or B. d loss / d logp_{i,t} = -s_i A_i / (|y_i| N) for trained tokens of unclipped responses
    (GSPO Eq. (10)), 0 for clipped ones. ``logp_rollout`` (checked) and ``group_ids`` are not used.
    ``length_weighted``: LUSPO (arXiv:2602.05261), each response's term times |y_i|. ``sequence_ratio="sum"``: s_i =
    pi_theta(y_i)/pi_old(y_i), the product of the token ratios (no 1/|y_i|: TRL's ``RLOOTrainer``; not GSPO's).
    """
    if sequence_ratio not in ("mean", "sum"):
        raise ValueError(f"sequence_ratio={sequence_ratio!r}: 'mean' (GSPO's) or 'sum'")
    check_knobs(eps_low=eps_low, eps_high=eps_high, normalizer=normalizer)
    if x.token_keep is not None or x.advantages.ndim != 1:  # token_keep, or token-level returns' advantages [B, T]
        raise ValueError("token_keep / advantages [B, T]: GSPO weighs whole responses; it has no per-token terms")
    x.raise_on_nan()
    logp, logp_old, advantages, mask = x.logp, x.logp_old, x.advantages, x.mask

    dtype = compute_dtype(logp)
    logp_m = masked(logp, mask, dtype)
    lp_old = masked(logp_old.detach(), mask, dtype)
    adv = advantages.detach().to(dtype)  # [B]

    counts = mask.sum(dim=1)
    has_tokens = counts > 0
    log_seq_ratio = (logp_m - lp_old).sum(dim=1) / (counts.clamp(min=1).to(dtype) if sequence_ratio == "mean" else 1)
    seq_ratio = torch.exp(log_seq_ratio)  # s_i with gradient; 1 for rows without tokens
    surrogate = torch.minimum(seq_ratio * adv, seq_ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    surrogate = surrogate * counts.to(dtype) if length_weighted else surrogate  # LUSPO's length weight
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    denom = logp.shape[0] if normalizer is None else normalizer
    loss = -torch.where(has_tokens, surrogate, zero).sum() / denom

    s = seq_ratio.detach()
    seq_pos = has_tokens & (adv > 0)
    seq_neg = has_tokens & (adv < 0)
    seq_clipped = (seq_pos & (s > 1 + eps_high)) | (seq_neg & (s < 1 - eps_low))
    tok_clipped = (mask & seq_clipped[:, None]).to(dtype)
    metrics = detached(
        {
            "loss": loss,
            "clip_frac": masked_mean(tok_clipped, mask),
            "clip_frac_pos": masked_mean(tok_clipped, mask & seq_pos[:, None]),
            "clip_frac_neg": masked_mean(tok_clipped, mask & seq_neg[:, None]),
            "seq_clip_frac": masked_mean(seq_clipped.to(dtype), has_tokens),
            "seq_ratio_mean": masked_mean(s, has_tokens),
            "ratio_old_mean": masked_mean(torch.exp(logp_m.detach() - lp_old), mask),
        }
    )
    return loss, metrics
