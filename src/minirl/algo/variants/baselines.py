"""Advantage baselines of TRL's and verl's runs that are not the paper's group mean ([P] = arXiv:2512.01374, §4.1):
RLOO's leave-one-out mean (Ahmadian et al. 2024; verl ``adv_estimator=rloo``), OPO's length-weighted mean (Hao et al.
2025, arXiv 2505.23585; verl ``opo``), none (REINFORCE++, Hu et al. 2025; verl ``reinforce_plus_plus``), Pass@k
training's lead of a group's best response (Chen et al. 2025, arXiv 2503.19595; verl ``grpo_passk``) and ReMax's
reward of a greedy completion (Li et al. 2023, arXiv 2310.10505; verl ``remax``); then the whitening of REINFORCE++
over the batch's tokens (verl ``reinforce_plus_plus(_baseline)``) or of TRL's RLOO over its responses.
``group_advantages`` (``minirl.algo.advantages``) calls them; each is off by default.
"""

from __future__ import annotations

import torch

BASELINES = ("group_mean", "leave_one_out", "length_weighted", "none", "pass_at_k", "greedy")
"""What ``group_advantages`` subtracts from each reward (``algo.adv_baseline``)."""


def less_baseline(rewards: torch.Tensor, baseline: str, lengths_PG: torch.Tensor | None,
                  greedy_P: torch.Tensor | None = None) -> torch.Tensor:
    """Rewards [P, G] less ``baseline`` (``group_advantages``' step in place of R - mean_G(R)):

      "group_mean"       R - mean_G(R)                                                         ([P] §4.1)
      "leave_one_out"    R - mean of the other G - 1 = G/(G - 1) (R - mean_G(R))                  (RLOO)
      "length_weighted"  R - sum_G(L R) / sum_G(L), L = ``lengths_PG`` (the plain mean if sum_G(L) = 0)  (OPO)
      "none"             R                                                                     (REINFORCE++)
      "pass_at_k"        R - max of the others for a group's best response, 0 for the others   (Pass@k training)
      "greedy"           R - the reward of the prompt's greedy completion, ``greedy_P`` [P]       (ReMax)
    """
    group = rewards.shape[1]
    if baseline == "none":
        return rewards.clone()
    if baseline == "pass_at_k":  # ties at the top give a lead of 0 whichever of them is "best"
        top = rewards.topk(2, dim=1).values
        lead = torch.zeros_like(rewards)
        return lead.scatter_(1, rewards.argmax(dim=1, keepdim=True), (top[:, :1] - top[:, 1:]))
    if baseline == "length_weighted":
        if lengths_PG is None or tuple(lengths_PG.shape) != tuple(rewards.shape):
            shape = None if lengths_PG is None else tuple(lengths_PG.shape)
            raise ValueError(f"a length_weighted baseline needs lengths_PG of the rewards' shape {tuple(rewards.shape)}, "
                             f"got {shape}")
        lengths = lengths_PG.to(rewards.dtype)
        total = lengths.sum(dim=1, keepdim=True)
        weighted = (lengths * rewards).sum(dim=1, keepdim=True) / total.clamp(min=1)
        return rewards - torch.where(total > 0, weighted, rewards.mean(dim=1, keepdim=True))
    if baseline == "greedy":
        if greedy_P is None or tuple(greedy_P.shape) != (rewards.shape[0],):
            raise ValueError(f"a greedy baseline needs one greedy reward per prompt ({rewards.shape[0]}), got "
                             f"{None if greedy_P is None else tuple(greedy_P.shape)}")
        return rewards - greedy_P.to(rewards.dtype)[:, None]
    if baseline not in BASELINES:
        raise ValueError(f"baseline={baseline!r}: one of {', '.join(BASELINES)}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred * (group / (group - 1)) if baseline == "leave_one_out" else centred


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


def response_whiten(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages [B] whitened over the batch's responses, each once: (A - mean) / (std + 1e-4), std unbiased (TRL's
    ``RLOOTrainer`` with ``normalize_advantages``). Needs at least two responses."""
    if advantages.numel() < 2:
        raise ValueError("response_whiten needs at least 2 responses (an unbiased std)")
    return (advantages - advantages.mean()) / (advantages.std(correction=1) + 1e-4)
