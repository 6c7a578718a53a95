"""The MiniRL policy loss, Eq. (7) of Zheng et al., "Stabilizing Reinforcement Learning with LLMs:
Formulation and Practices" (arXiv:2512.01374, [P] below).

    J_MiniRL(theta) = E_{x, y ~ mu_old} [ sum_t  M_t * sg[ pi_theta(y_t) / mu_old(y_t) ] * A(x, y) * log pi_theta(y_t) ]   (7)

    r_t = pi_theta(y_t) / pi_old(y_t)              (proximal ratio, decides the clip mask only)
    M_t = 0 if A > 0 and r_t > 1 + eps_high,  0 if A < 0 and r_t < 1 - eps_low,  1 otherwise

How this differs from what it is usually confused with:

* It is **not PPO/GRPO**. There is no ``min(r A, clip(r) A)``; the ratio never carries gradient.
  The importance weight is a detached scalar and gradient flows only through ``log pi_theta``.
  Clipping *masks* a token's gradient (M_t = 0); it never clamps the ratio's value. Its gradient
  equals the gradient of decoupled PPO, (pi_old / mu_old) * grad min(r A, clip(r) A).
* The importance weight is pi_theta / **mu_old** (the rollout engine's probabilities,
  ``logp_rollout``), so it corrects the training–inference discrepancy as well as staleness,
  Eq. (5). GRPO and CISPO as written (Appendix A) use pi_old in its place.
* The clip mask uses r = pi_theta / **pi_old** (the trainer at theta_old, ``logp_old``), not
  mu_old: clipping limits policy staleness only.
* Tokens are **summed** within a response; the default aggregation divides by the number of
  responses (a constant), **not** by |y| (GRPO) nor by the group's token count (CISPO). [P] §4.3
  shows that 1/|y| breaks the first-order approximation. ``aggregation="seq_mean"`` is the paper's
  "length-norm" ablation; ``"token_mean"`` (DAPO-style) is not in [P].
* TIS (Yao et al. 2025, threshold 5, [P] §4.2) truncates the weight from above only. [P] does not
  say where: ``tis_placement="full"`` (literal reading, default) truncates pi_theta/mu_old,
  ``"train_infer"`` only pi_old/mu_old (see below); they agree on-policy. Masking (IcePop) and a sequence
  weight (TRL's and verl's corrections) are not in [P].

Metrics returned (detached 0-dim tensors; token statistics are over mask=True tokens; an empty selection
gives 0.0, never NaN):

    loss               the returned loss value
    clip_frac          fraction of trained tokens with M_t = 0
    clip_frac_pos      same, among trained tokens of responses with A > 0
    clip_frac_neg      same, among trained tokens of responses with A < 0
    is_truncated_frac  fraction of trained tokens where the TIS bound bit (the bounded quantity > tis_cap, or
                       < tis_floor); ``is_masked_frac`` instead under ``tis_mode="mask"`` (tokens whose weight is 0)
    is_weight_mean     mean of the final detached weight w over trained tokens (M_t = 0 tokens included)
    is_weight_max      max of w over trained tokens
    ratio_old_mean     mean of r = pi_theta / pi_old over trained tokens
"""

from __future__ import annotations

import torch

from minirl.algo._common import bounded_is_weight, opsm_keep, token_loss_metrics
from minirl.loss_inputs import LossInputs, check_knobs
from minirl.tensors import compute_dtype, masked


def minirl_loss(
    x: LossInputs,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.27,
    clip: bool = True,
    is_correction: bool = True,
    tis_cap: float = 5.0,
    tis_placement: str = "full",
    tis_floor: float = 0.0, tis_mode: str = "truncate", tis_level: str = "token",
    opsm_threshold: float | None = None, dual_clip: float | None = None, staleness_weight: bool = True,
    aggregation: str = "seq_sum",
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MiniRL loss, the negative of Eq. (7) of [P] (arXiv:2512.01374), with TIS ([P] §4.2).

    loss = -(1/N) * sum_{i,t} mask_{i,t} * M_{i,t} * w_{i,t} * A_i * logp_{i,t}

    with r = exp(logp - logp_old) (detached), M the clip mask of Eq. (7) (strict inequalities:
    r exactly 1 + eps_high is *not* clipped; ``clip=False`` sets M = 1, the "no clipping" runs
    of [P] §4.4), and the detached weight

        tis_placement="full":        w = min(exp(logp - logp_rollout), tis_cap)
        tis_placement="train_infer": w = min(exp(logp_old - logp_rollout), tis_cap) * exp(logp - logp_old)

    ``is_correction=False`` replaces ``logp_rollout`` by ``logp_old`` in w (drops the
    training–inference factor: the "w/o train-infer-IS" ablation of [P] §4.3; on-policy w = 1).
    ``staleness_weight=False`` drops the other factor, pi_theta/pi_old: w = the bounded pi_old/mu_old alone (1 with
    ``is_correction=False``), either placement: REINFORCE on stale samples with nothing for the updates since they
    were drawn (GPG's loss, verl's bypass REINFORCE without IS weights; not in [P], whose Eq. (5) needs the factor).
    ``tis_mode="mask"`` zeroes a ratio outside [tis_floor, tis_cap] instead of truncating it, ``tis_level=
    "sequence"`` bounds the product of a response's ratios and weighs all its tokens by it (``bounded_is_weight``).
    ``opsm_threshold``: also M = 0 on every token of a response with A < 0 whose mean log(mu/pi_theta) exceeds it
    (``opsm_keep``; mu is pi_old when ``is_correction=False``). ``dual_clip`` c: also M = 0 where A < 0 and r > c
    (the gradient of PPO's dual clip, verl's ``clip_ratio_c``, TRL's ``delta``).

    Aggregation (how the token terms become one number):
        "seq_sum"    sum over all tokens / N, N = ``normalizer`` or B (no 1/|y|; Eq. (7) default)
        "seq_mean"   sum_i (sum_t ...) / |y_i|, divided by N = ``normalizer`` or B ([P] §4.3 length-norm ablation)
        "token_mean" sum over all tokens / N, N = ``normalizer`` or the number of mask=True tokens
    ``normalizer`` lets a caller accumulating micro-batches pass the mini-batch constant. Returns the
    0-dim loss (gradient w.r.t. ``logp`` only) and the metrics of the module docstring.
    """
    # Over 60 lines with its docstring, which states Eq. (7) and every knob; the math is ~35 lines.
    check_knobs(eps_low=eps_low, eps_high=eps_high, tis_cap=tis_cap, normalizer=normalizer, tis_placement=tis_placement,
                aggregation=aggregation, tis_floor=tis_floor, tis_mode=tis_mode, tis_level=tis_level)
    x.raise_on_nan()
    logp, logp_old, logp_rollout, mask = x.logp, x.logp_old, x.logp_rollout, x.mask

    dtype = compute_dtype(logp)
    logp_m = masked(logp, mask, dtype)  # carries gradient, 0 at padding
    lp = logp_m.detach()
    lp_old = masked(logp_old.detach(), mask, dtype)
    lp_mu = masked(logp_rollout.detach(), mask, dtype) if is_correction else lp_old
    adv = x.advantages_BT(dtype)  # [B, 1] or [B, T]

    ratio_old = torch.exp(lp - lp_old)  # r, detached
    pos = mask & (adv > 0)
    neg = mask & (adv < 0)
    if clip:
        clipped = (pos & (ratio_old > 1 + eps_high)) | (neg & (ratio_old < 1 - eps_low))
    else:
        clipped = torch.zeros_like(mask)
    if dual_clip is not None:  # dual clip (Ye et al. 2020; verl clip_ratio_c, TRL delta): A < 0 and r > c
        clipped = clipped | (neg & (ratio_old > dual_clip))
    opsm = None if opsm_threshold is None else opsm_keep(adv, lp, lp_mu, mask, opsm_threshold)
    keep = x.terms & ~clipped & (True if opsm is None else opsm)

    whole = tis_placement == "full" and staleness_weight  # the bounds on pi_theta/mu_old, else on pi_old/mu_old
    log_is = lp - lp_mu if whole else lp_old - lp_mu
    is_factor, truncated = bounded_is_weight(log_is, mask, tis_cap=tis_cap, tis_floor=tis_floor, tis_mode=tis_mode,
                                             tis_level=tis_level)
    weight = is_factor if whole or not staleness_weight else is_factor * ratio_old  # "train_infer": x pi_theta/pi_old

    zero = torch.zeros((), dtype=dtype, device=logp.device)
    per_token = torch.where(keep, weight * adv * logp_m, zero)  # [B, T]
    batch = logp.shape[0]
    if aggregation == "seq_sum":
        loss = -per_token.sum() / (batch if normalizer is None else normalizer)
    elif aggregation == "seq_mean":
        lengths = mask.sum(dim=1).clamp(min=1).to(dtype)
        loss = -(per_token.sum(dim=1) / lengths).sum() / (batch if normalizer is None else normalizer)
    else:  # "token_mean"
        denom = mask.sum().clamp(min=1).to(dtype) if normalizer is None else normalizer
        loss = -per_token.sum() / denom

    metrics = token_loss_metrics(loss, clipped, truncated, weight, ratio_old, adv, mask, tis_mode, opsm)
    return loss, metrics

