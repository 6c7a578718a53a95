"""Group-baseline advantages: one scalar per response, from the rewards of its prompt's group.

MiniRL ([P] = arXiv:2512.01374, §4.1, the advantage defined with Eq. (7)) writes

    A(x, y) = R(x, y) - E_{y' ~ mu_old(.|x)} [ R(x, y') ]

and calls it "group normalization (Shao et al., 2024)". How this differs from what it is usually
confused with: the written formula **only subtracts the mean**; GRPO (and CISPO, [P] Appendix A)
also divide by the group std. [P] never states whether MiniRL divides, so the default here is
mean-only and ``std_normalize=True`` gives the Appendix A form. The baseline is the plain group
mean including the sample itself; the std is the unbiased (G - 1) one. The other baselines (RLOO, OPO, REINFORCE++,
Pass@k) and REINFORCE++'s whitening, none in [P], are ``minirl.algo.variants.baselines``; GDPO's decoupled
normalisation for several reward functions is ``minirl.algo.variants.gdpo``.
"""

from __future__ import annotations

import torch

from minirl.algo.variants.baselines import less_baseline

STD_EPS: float = 1e-6


def group_advantages(rewards_PG: torch.Tensor, std_normalize: bool = False, *, baseline: str = "group_mean",
                     std_scope: str = "group", lengths_PG: torch.Tensor | None = None, nonzero_rescale: bool = False,
                     greedy_P: torch.Tensor | None = None, std_eps: float = STD_EPS) -> torch.Tensor:
    """Advantages [P, G] from rewards [P, G] (row = one prompt's group of G responses).

    std_normalize=False: A = R - mean_G(R)                          ([P] §4.1, with Eq. (7))
    std_normalize=True:  A = (R - mean_G(R)) / (std_G(R) + eps)     ([P] Appendix A, GRPO/CISPO; eps = ``std_eps``,
                         1e-6; std is unbiased, i.e. divides by G - 1)
    ``baseline`` other than "group_mean": in place of R - mean_G(R), ``variants.baselines.less_baseline`` (not in [P])
    std_scope="batch": the std of all P x G rewards in place of each group's
    nonzero_rescale: then x P G / (number of non-zero rewards, at least 1)      (GPG's alpha; verl ``gpg``)

    Integer/bool rewards are converted to float32; float dtypes are kept.

    Raises:
        ValueError: ``rewards_PG`` not 2-D, G < 2 with a group's std, a leave-one-out or pass_at_k baseline,
            or "length_weighted" without lengths of the rewards' shape.
        FloatingPointError: ``rewards_PG`` contains NaN.
    """
    rewards = _checked_rewards(rewards_PG)
    if rewards.shape[1] < 2 and ((std_normalize and std_scope == "group") or baseline in ("leave_one_out", "pass_at_k")):
        what = "std_normalize=True over each group" if std_normalize else f"a {baseline} baseline"
        raise ValueError(f"{what} needs G >= 2 samples per prompt")
    centred = rewards - rewards.mean(dim=1, keepdim=True) if baseline == "group_mean" else \
        less_baseline(rewards, baseline, lengths_PG, greedy_P)
    if std_normalize:
        std = rewards.std(correction=1) if std_scope == "batch" else rewards.std(dim=1, keepdim=True, correction=1)
        centred = centred / (std + std_eps)
    if nonzero_rescale:  # GPG: alpha = B / (responses with a non-zero reward)
        centred = centred * (rewards.numel() / max(int(torch.count_nonzero(rewards)), 1))
    return centred


def _checked_rewards(rewards_PG: torch.Tensor) -> torch.Tensor:
    if not isinstance(rewards_PG, torch.Tensor) or rewards_PG.ndim != 2:
        shape = tuple(rewards_PG.shape) if isinstance(rewards_PG, torch.Tensor) else type(rewards_PG).__name__
        raise ValueError(f"rewards_PG must be a 2-D tensor [P, G], got {shape}")
    rewards = rewards_PG if rewards_PG.is_floating_point() else rewards_PG.to(torch.float32)
    if bool(torch.isnan(rewards).any()):
        raise FloatingPointError("rewards_PG contains NaN")
    if rewards.shape[1] == 0:
        raise ValueError("rewards_PG has G = 0 samples per prompt")
    return rewards
