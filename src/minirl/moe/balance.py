"""The load-balancing auxiliary loss of an MoE forward (Switch Transformer, Fedus et al. 2022, Eq. 4-6), as
transformers' ``load_balancing_loss_func`` computes it from a model's router logits and TRL adds it to GRPO's loss
(``router_aux_loss_coef``; minirl's ``algo.router_aux_loss_coef``, off by default as in the paper's RL)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def load_balancing_loss(router_logits: Sequence[torch.Tensor], mask: torch.Tensor, top_k: int) -> torch.Tensor:
    """``E * sum_e f_e * P_e`` over every layer's tokens where ``mask`` (bool [tokens], the rows of each layer's
    ``router_logits`` [tokens, E]): ``f_e`` the share of (token, layer) rows whose top-k takes expert ``e`` (summing
    to k), ``P_e`` the mean router probability of ``e``. Gradient through ``P`` only."""
    weight = mask.reshape(-1).to(torch.float32)
    experts = router_logits[0].shape[-1]
    counts = torch.zeros(experts, dtype=torch.float32, device=weight.device)
    probs = torch.zeros(experts, dtype=torch.float32, device=weight.device)
    for logits in router_logits:
        p = torch.softmax(logits.float(), dim=-1)
        chosen = p.topk(top_k, dim=-1).indices
        counts = counts.scatter_add(0, chosen.reshape(-1), weight.repeat_interleave(top_k))
        probs = probs + (p * weight[:, None]).sum(dim=0)
    rows = weight.sum() * len(router_logits)
    return experts * ((counts / rows) * (probs / rows)).sum()
