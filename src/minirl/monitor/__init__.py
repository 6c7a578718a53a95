"""Monitoring: every quantity minirl measures but does not optimise, in one place.

The loop calls one entry point, ``step_metrics(StepRecord(...))``, at the end of each global step
(and ``approximation_diagnostics`` before the first and last update of a diagnosed step).
"""

from __future__ import annotations

from typing import Any

from minirl.monitor.step import StepRecord, mean_over, rollout_metrics, routing_step_metrics, step_metrics, update_metrics
from minirl.types import Batch


def approximation_diagnostics(trainer: Any, minibatch: Batch, objective: Any, index: int, count: int, faults: list[str],
                              *, replay_routes: bool) -> dict[str, float]:
    """``minirl.diagnostics`` before update ``index`` of ``count``: tagged ``first`` and/or ``last``.
    A NaN log-prob is appended to ``faults`` (the update itself is then skipped and counted)."""
    from minirl.diagnostics import gradient_fidelity

    tags = (["first"] if index == 0 else []) + (["last"] if index == count - 1 else [])
    try:
        metrics = gradient_fidelity(trainer, minibatch, objective, replay_routes=replay_routes, tag=tags[0], approximation=True)
    except FloatingPointError as exc:
        faults.append(f"diagnostics not computed ({exc})")
        return {}
    for tag in tags[1:]:  # N = 1: the first mini-batch is also the last
        metrics.update({key.replace(f"/{tags[0]}_", f"/{tag}_"): value for key, value in metrics.items()})
    return metrics


__all__ = ["StepRecord", "approximation_diagnostics", "mean_over", "rollout_metrics", "routing_step_metrics",
           "step_metrics", "update_metrics"]
