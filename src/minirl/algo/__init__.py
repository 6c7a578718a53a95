"""The paper's math as pure torch functions: tensors in, ``(loss, metrics)`` out.

MiniRL is Eq. (7) of arXiv:2512.01374 ([P]); GRPO and CISPO follow [P] Appendix A; GSPO follows
arXiv:2507.18071. No config objects, no logging, no I/O. Every log-prob argument follows the
names of ``minirl.types``: ``logp_rollout`` (mu_old, rollout engine), ``logp_old`` (pi_old,
trainer at theta_old), ``logp`` (pi_theta, with gradient).

``POLICY_LOSSES`` maps a loss name to a function with one uniform signature::

    loss, metrics = POLICY_LOSSES[name](logp, logp_old, logp_rollout, advantages, mask, group_ids, **knobs)

Knobs per name (keyword-only; an unknown knob is a ``TypeError``):
    "minirl"  eps_low, eps_high, clip, is_correction, tis_cap, tis_placement, aggregation, normalizer
    "grpo"    eps_low, eps_high, is_correction, tis_cap, normalizer
    "cispo"   eps_low, eps_high, is_correction, tis_cap, normalizer   (uses group_ids)
    "gspo"    eps_low, eps_high, normalizer
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minirl.algo.advantages import group_advantages
from minirl.algo.cispo import cispo_loss
from minirl.algo.diagnostics import mismatch_metrics, token_entropy
from minirl.algo.fidelity import cosine, first_order_residual, importance_weight_stats, sequence_is_loss
from minirl.algo.grpo import grpo_loss
from minirl.algo.gspo import gspo_loss
from minirl.algo.logprobs import token_logprobs
from minirl.algo.minirl import minirl_loss, minirl_policy_loss

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: dict[str, PolicyLoss] = {
    "minirl": minirl_policy_loss,
    "grpo": grpo_loss,
    "cispo": cispo_loss,
    "gspo": gspo_loss,
}

__all__ = [
    "POLICY_LOSSES",
    "PolicyLoss",
    "cispo_loss",
    "cosine",
    "first_order_residual",
    "group_advantages",
    "grpo_loss",
    "gspo_loss",
    "importance_weight_stats",
    "minirl_loss",
    "minirl_policy_loss",
    "mismatch_metrics",
    "sequence_is_loss",
    "token_entropy",
    "token_logprobs",
]
