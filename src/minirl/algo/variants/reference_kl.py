"""KL penalty to a frozen reference policy, added to the policy loss (``algo.kl_coef``).

Off by default: the paper's MiniRL (arXiv 2512.01374, Eq. 7) has no KL term, and neither do its
GRPO/CISPO baselines as written there (Appendix A). It is the optional regulariser verl applies
with ``actor.use_kl_loss`` / ``kl_loss_coef`` / ``kl_loss_type`` and TRL with ``beta``.

On each sampled token y_t (drawn from the engine, mu), with r_t = log pi_ref(y_t) - log pi_theta(y_t)
(``logp_ref - logp``), the per-token estimators of KL(pi_theta || pi_ref) are Schulman's
("Approximating KL Divergence", 2020), as verl's ``kl_penalty`` names them:

    k1 = -r_t                    verl "kl"           unbiased, high variance, can be negative
    k2 = r_t^2 / 2               verl "mse"
    k3 = exp(r_t) - r_t - 1      verl "low_var_kl"   unbiased under pi_theta, >= 0, low variance

k3 is computed as verl does: r_t clamped to [-20, 20] before the exponential and k3 clamped to
[-10, 10] after, so one far-off token cannot blow the loss up. The loss is the token mean over the
mini-batch (verl's default ``loss_agg_mode="token-mean"``) times ``kl_coef``:

    loss = kl_coef * sum_{b,t} mask_bt k_bt / normalizer,   normalizer = sum of mask over the mini-batch

The gradient flows through ``logp`` only (``logp_ref`` is a constant). ``algo.kl_loss_unbiased`` (slime's
``--use-unbiased-kl``, DeepSeek-V3.2) weighs each k_bt by rho_bt = pi_theta / pi_old(y_bt), the gradient through it.
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]


def kl_estimate(logp: torch.Tensor, logp_ref: torch.Tensor, kind: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) at the sampled tokens (same shape as ``logp``)."""
    log_ratio = logp_ref.detach() - logp  # r_t = log pi_ref / pi_theta
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        log_ratio = log_ratio.clamp(-20.0, 20.0)
        return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"kl estimator must be k1, k2 or k3, got {kind!r}")


def reference_kl_loss(
    logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, *, kl_coef: float, kind: KLEstimator = "k3",
    normalizer: float, check_finite: bool = True, logp_old: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``kl_coef`` x the masked token sum of ``kl_estimate`` (x exp(logp - logp_old) given ``logp_old``) / ``normalizer``;
    metrics: ``kl_ref``, its masked token mean here (detached). ``check_finite=False``: the caller checks once."""
    if not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    estimate = kl_estimate(logp, logp_ref, kind)
    if logp_old is not None:
        estimate = torch.exp(logp - logp_old.detach()) * estimate
    estimate = torch.where(mask, estimate, 0.0)
    if check_finite and not bool(torch.isfinite(estimate).all()):
        raise FloatingPointError("non-finite reference KL (a NaN log-prob at a trained token)")
    loss = kl_coef * estimate.sum() / normalizer
    tokens = mask.sum().clamp(min=1)
    return loss, {"kl_ref": (estimate.detach().sum() / tokens)}
