"""Per-step monitoring: the training–inference mismatch (``mismatch/*``).

These are monitoring quantities, not loss terms: [P] (arXiv:2512.01374) has no KL penalty and no
entropy bonus in Eq. (7); §5.4 only *plots* the training–inference KL and the entropy.

How they differ from what they are usually confused with:

* ``kl_k1`` is the paper's "training–inference KL", D_KL[mu_old || pi_old], estimated on the
  **sampled** tokens (y_t ~ mu_old) as mean(log mu_old - log pi_old). It is not a KL to a
  reference model and not the policy-update KL(pi_old || pi_theta). Per token it can be negative;
  only its expectation is >= 0. ``kl_k3`` is Schulman's k3 estimator of the same KL(mu || pi),
  exp(d) - 1 - d with d = log pi_old - log mu_old: unbiased and >= 0 per token.
* The per-step ``train/entropy`` is ``minirl.algo.token_entropy``: the **full-vocabulary**
  entropy -sum_w pi(w) log pi(w) at each rollout prefix, not the sampled-token estimate.

Metric names (python floats, token means over mask=True; an empty mask gives 0.0):
    kl_k1           mean(logp_rollout - logp_old)
    kl_k3           mean(exp(logp_old - logp_rollout) - 1 - (logp_old - logp_rollout))
    abs_dlogp_mean  mean |logp_rollout - logp_old|
    abs_dlogp_max   max  |logp_rollout - logp_old|
NaN inputs are not raised on here: they propagate into the metric, where they are visible.
"""

from __future__ import annotations

import torch

from minirl.algo._common import masked_max, masked_mean, to_floats


def mismatch_metrics(
    logp_rollout: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Training–inference mismatch statistics over trained tokens ([P] §5.4, KL plot).

    kl_k1 = mean_t (logp_rollout - logp_old): sampled-token estimator of D_KL[mu_old || pi_old]
    ([P] §5.4); kl_k3 = mean_t (rho - 1 - log rho), rho = pi_old / mu_old (Schulman's k3 for
    KL(mu || pi)); abs_dlogp_mean / abs_dlogp_max of |logp_rollout - logp_old|.

    Args:
        logp_rollout: float [B, T], log mu_old.
        logp_old: float [B, T], log pi_old.
        mask: bool [B, T], True = counted.
    """
    if logp_rollout.shape != logp_old.shape or mask.shape != logp_old.shape:
        raise ValueError(
            f"logp_rollout {tuple(logp_rollout.shape)}, logp_old {tuple(logp_old.shape)} and "
            f"mask {tuple(mask.shape)} must have the same shape"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    dtype = torch.promote_types(logp_old.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logp_old.device)
    d = torch.where(mask, logp_old.detach().to(dtype) - logp_rollout.detach().to(dtype), zero)
    return to_floats(
        {
            "kl_k1": masked_mean(-d, mask),
            "kl_k3": masked_mean(torch.expm1(d) - d, mask),
            "abs_dlogp_mean": masked_mean(d.abs(), mask),
            "abs_dlogp_max": masked_max(d.abs(), mask),
        }
    )
