"""The paper's math as pure torch functions: tensors in, ``(loss, metrics)`` out.

MiniRL is Eq. (7) of arXiv:2512.01374. No config objects, no logging, no I/O. Every log-prob
argument follows the names of ``minirl.types``: ``logp_rollout`` (mu_old, rollout engine),
``logp_old`` (pi_old, trainer at theta_old), ``logp`` (pi_theta, with gradient).
"""

from __future__ import annotations

from minirl.algo.advantages import group_advantages
from minirl.algo.diagnostics import mismatch_metrics, token_entropy
from minirl.algo.logprobs import token_logprobs
from minirl.algo.minirl import minirl_loss

__all__ = [
    "group_advantages",
    "minirl_loss",
    "mismatch_metrics",
    "token_entropy",
    "token_logprobs",
]
