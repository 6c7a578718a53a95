"""Group-baseline advantages: one scalar per response, from the rewards of its prompt's group.

MiniRL ([P] = arXiv:2512.01374, §4.1, the advantage defined with Eq. (7)) writes

    A(x, y) = R(x, y) - E_{y' ~ mu_old(.|x)} [ R(x, y') ]

and calls it "group normalization (Shao et al., 2024)". How this differs from what it is usually
confused with: the written formula **only subtracts the mean**; GRPO (and CISPO, [P] Appendix A)
also divide by the group std. [P] never states whether MiniRL divides, so the default here is
mean-only and ``std_normalize=True`` gives the Appendix A form. The baseline is the plain group
mean including the sample itself; the std is the unbiased (G - 1) one. Not in [P], for TRL's and verl's
runs: RLOO's leave-one-out baseline (Ahmadian et al. 2024; verl ``adv_estimator=rloo``), the std of the
whole batch's rewards (TRL ``scale_rewards="batch"``) and REINFORCE++-baseline's whitening over the batch's
tokens (Hu et al. 2025; verl ``adv_estimator=reinforce_plus_plus_baseline``, ``token_whiten``). For several reward
functions, GDPO's decoupled normalisation is ``minirl.algo.variants.gdpo``.
"""

from __future__ import annotations

import torch

STD_EPS: float = 1e-6


def group_advantages(rewards_PG: torch.Tensor, std_normalize: bool = False, *, baseline: str = "group_mean",
                     std_scope: str = "group") -> torch.Tensor:
    """Advantages [P, G] from rewards [P, G] (row = one prompt's group of G responses).

    std_normalize=False: A = R - mean_G(R)                          ([P] §4.1, with Eq. (7))
    std_normalize=True:  A = (R - mean_G(R)) / (std_G(R) + 1e-6)    ([P] Appendix A, GRPO/CISPO;
                         std is unbiased, i.e. divides by G - 1)
    baseline="leave_one_out": R - mean of the other G - 1 = G/(G - 1) (R - mean_G(R)) in place of R - mean_G(R)
    std_scope="batch": the std of all P x G rewards in place of each group's

    Integer/bool rewards are converted to float32; float dtypes are kept.

    Raises:
        ValueError: ``rewards_PG`` not 2-D, or G < 2 with ``std_normalize=True`` or a leave-one-out baseline.
        FloatingPointError: ``rewards_PG`` contains NaN.
    """
    if not isinstance(rewards_PG, torch.Tensor) or rewards_PG.ndim != 2:
        shape = tuple(rewards_PG.shape) if isinstance(rewards_PG, torch.Tensor) else type(rewards_PG).__name__
        raise ValueError(f"rewards_PG must be a 2-D tensor [P, G], got {shape}")
    rewards = rewards_PG if rewards_PG.is_floating_point() else rewards_PG.to(torch.float32)
    if bool(torch.isnan(rewards).any()):
        raise FloatingPointError("rewards_PG contains NaN")
    if rewards.shape[1] == 0:
        raise ValueError("rewards_PG has G = 0 samples per prompt")
    if rewards.shape[1] < 2 and (std_normalize or baseline == "leave_one_out"):
        raise ValueError("std_normalize=True and a leave-one-out baseline need G >= 2 samples per prompt")
    group = rewards.shape[1]
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if baseline == "leave_one_out":
        centred = centred * (group / (group - 1))
    if not std_normalize:
        return centred
    std = rewards.std(correction=1) if std_scope == "batch" else rewards.std(dim=1, keepdim=True, correction=1)
    return centred / (std + STD_EPS)


def token_whiten(advantages: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-response advantages [B] whitened over the batch's tokens, response i counting ``lengths[i]`` times:
    (A - m) / sqrt(v + 1e-8), m and v the token-weighted mean and unbiased variance (verl's ``masked_whiten``,
    with its 1e-8 in the mean's denominator). Needs at least two tokens."""
    n = lengths.to(advantages.dtype)
    tokens = n.sum()
    if float(tokens) < 2:
        raise ValueError("token_whiten needs at least 2 tokens in the batch (an unbiased variance)")
    mean = (n * advantages).sum() / (tokens + 1e-8)
    variance = (n * (advantages - mean) ** 2).sum() / (tokens + 1e-8) * (tokens / (tokens - 1))
    return (advantages - mean) * torch.rsqrt(variance + 1e-8)

