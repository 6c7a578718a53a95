"""Monitoring: every quantity minirl measures but does not optimise, in one package.

    mismatch.py     training–inference mismatch: KL estimators, |d logp| (``mismatch/*``)
    routing.py      engine vs trainer routing agreement, R2 drift (``routing/*``)
    fidelity.py     the first-order approximation of [P] §2.3: residuals, ESS / chi^2, Eq. (2) loss
    diagnostics.py  gradient fidelity on a mini-batch during training (``fidelity/*``, ``residual/*``, ``is/*``)
    step.py         ``step_metrics``: every per-step metric from what the step produced

The loop calls one entry point, ``step_metrics(StepRecord(...))``, at the end of each global step
(and ``approximation_diagnostics`` before the first and last update of a diagnosed step).
"""

from __future__ import annotations

from typing import Any

from minirl.monitor.diagnostics import approximation_metrics, gradient_fidelity
from minirl.monitor.fidelity import (
    cosine,
    first_order_residual,
    importance_weight_stats,
    sequence_is_loss,
)
from minirl.monitor.mismatch import mismatch_metrics, token_entropy
from minirl.monitor.routing import routing_agreement
from minirl.monitor.step import (
    StepRecord,
    mean_over,
    rollout_metrics,
    routing_step_metrics,
    step_metrics,
    tool_metrics,
    update_metrics,
)
from minirl.types import Batch


def approximation_diagnostics(trainer: Any, minibatch: Batch, objective: Any, index: int, count: int, faults: list[str],
                              *, replay_routes: bool) -> dict[str, float]:
    """``gradient_fidelity`` before update ``index`` of ``count``: tagged ``first`` and/or ``last``.
    A NaN log-prob is appended to ``faults`` (the update itself is then skipped and counted)."""
    tags = (["first"] if index == 0 else []) + (["last"] if index == count - 1 else [])
    try:
        metrics = gradient_fidelity(trainer, minibatch, objective, replay_routes=replay_routes, tag=tags[0], approximation=True)
    except FloatingPointError as exc:
        faults.append(f"diagnostics not computed ({exc})")
        return {}
    for tag in tags[1:]:  # N = 1: the first mini-batch is also the last
        metrics.update({key.replace(f"/{tags[0]}_", f"/{tag}_"): value for key, value in metrics.items()})
    return metrics


__all__ = [
    "StepRecord", "approximation_diagnostics", "approximation_metrics", "cosine", "first_order_residual",
    "gradient_fidelity", "importance_weight_stats", "mean_over", "mismatch_metrics", "rollout_metrics",
    "routing_agreement", "routing_step_metrics", "sequence_is_loss", "step_metrics", "token_entropy", "tool_metrics",
    "update_metrics",
]
