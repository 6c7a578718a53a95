"""TRL 1.16's advantages when some responses were scored by no reward function (every one returned None): such a
response is out of its group's mean and std, and its advantage is 0 (``GRPOTrainer._generate_and_score_completions``);
``RLOOTrainer``'s leave-one-out mean is over the scored others, its whitening over the scored responses.
Not the paper's math ([P] §4.1 has every response scored): the baselines of ``minirl.algo.group_advantages`` over the
scored responses only."""

from __future__ import annotations

import torch

from minirl.algo.advantages import STD_EPS, _checked_rewards
from minirl.algo.variants.baselines import response_whiten


def scored_group_advantages(rewards_PG: torch.Tensor, scored_PG: torch.Tensor, std_normalize: bool = False, *,
                            std_scope: str = "group", baseline: str = "group_mean", std_eps: float = STD_EPS) -> torch.Tensor:
    """``group_advantages`` (its group-mean or leave-one-out baseline) over each group's scored responses only.

    A_i = R_i - mean_{j scored}(R_j);  "leave_one_out": A_i = R_i - mean_{j scored, j != i}(R_j)
    = n/(n - 1) (R_i - mean_{j scored}(R_j)), n the group's scored count (TRL's RLOO; 0 when n = 1: no other);
    std_normalize: / (std_{j scored}(R_j) + std_eps), unbiased (n - 1), over the group or (std_scope "batch") every
    scored reward; A_i = 0 for an unscored i, and for every response of a group whose std is undefined (one scored
    response) or that has none scored.

    ``scored_PG``: bool [P, G]. The unscored rewards' values are ignored (NaN allowed there, nowhere else).
    """
    if scored_PG.shape != rewards_PG.shape or scored_PG.dtype != torch.bool:
        raise ValueError(f"scored_PG must be a bool tensor of the rewards' shape {tuple(rewards_PG.shape)}")
    rewards = _checked_rewards(torch.where(scored_PG, rewards_PG, torch.zeros((), dtype=rewards_PG.dtype)))
    counts = scored_PG.sum(dim=1, keepdim=True)
    mean = rewards.sum(dim=1, keepdim=True) / counts.clamp(min=1)
    deviation = torch.where(scored_PG, rewards - mean, torch.zeros_like(rewards))  # the std's, before RLOO's factor
    if baseline == "leave_one_out":
        centred = deviation * (counts / (counts - 1).clamp(min=1)) * (counts > 1)
    elif baseline == "group_mean":
        centred = deviation
    else:
        raise ValueError(f"baseline={baseline!r}: over the scored responses, group_mean or leave_one_out")
    if std_normalize:
        if std_scope == "batch":
            values = rewards[scored_PG]
            std = values.std(correction=1) if values.numel() > 1 else torch.tensor(float("nan"))
        else:
            std = (deviation.square().sum(dim=1, keepdim=True) / (counts - 1).clamp(min=1)).sqrt()
            std = torch.where(counts > 1, std, torch.full_like(std, float("nan")))
        centred = torch.nan_to_num(centred / (std + std_eps), nan=0.0) * scored_PG
    return centred


def defined_advantages(scored_PG: torch.Tensor, *, baseline: str = "group_mean", std_normalize: bool = False,
                       std_scope: str = "group") -> torch.Tensor:
    """bool [P, G]: the responses ``scored_group_advantages`` gives an advantage that TRL defines (not NaN there):
    scored, and in a group with another scored response when the leave-one-out mean or the group's std needs one."""
    alone = scored_PG.sum(dim=1, keepdim=True) < 2
    needs_another = baseline == "leave_one_out" or (std_normalize and std_scope == "group")
    return scored_PG & ~alone if needs_another else scored_PG


def scored_response_whiten(advantages: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """Advantages [B] whitened over the ``scored`` responses only (``defined_advantages``): ``response_whiten`` of
    them, and 0 for the others (TRL's ``RLOOTrainer`` with ``normalize_advantages``, its nan-aware mean and std).
    Fewer than two: all 0 (TRL's std of one value is NaN, zeroed)."""
    out = torch.zeros_like(advantages)
    if int(scored.sum()) >= 2:
        out[scored] = response_whiten(advantages[scored])
    return out
