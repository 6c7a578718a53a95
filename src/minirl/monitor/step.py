"""The metrics of one global step, assembled from what the step produced (``StepRecord``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from minirl.monitor.mismatch import mismatch_metrics
from minirl.monitor.routing import routing_agreement
from minirl.tensors import masked_mean
from minirl.types import Batch, Completion

if TYPE_CHECKING:  # the trainer imports minirl.monitor.routing: no import cycle at run time
    from minirl.trainer import ScoreResult, UpdateResult


@dataclass
class StepRecord:
    """What a global step hands to the monitor: its rollouts, its batch (with ``logp_old``), the
    pi_old pass's scores, the updates' results and the step's timings (seconds)."""

    completions: list[Completion]
    rewards_PG: torch.Tensor  # [P, G]
    reward_stats: dict[str, float]
    batch: Batch
    old: ScoreResult
    updates: list[UpdateResult]
    engine_routes: torch.Tensor | None  # [B, S, L, K] as sampled, when the engine recorded them
    routing: bool  # moe.routing_metrics on an MoE model
    diagnostics: dict[str, float] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)  # rollout, reward, old_logprobs, update, sync
    accuracy_threshold: float = 1.0  # eval.accuracy_threshold: a reward this high counts as correct
    rollout_tokens: int | None = None  # tokens the engine generated (None: those of ``completions``)
    pi_old_rows: slice | None = None  # the rows ``old`` scored (algo.logp_old_source=rollout: the first mini-batch)
    sampled_times: dict[str, float] | None = None  # rollout, reward: where they ran beside the last step's update
    logp_lag: torch.Tensor | None = None  # rollout.async_split_mismatch: log pi at the weights that sampled the batch


def step_metrics(record: StepRecord) -> dict[str, float]:
    """Every per-step metric (``train/*``, ``mismatch/*``, ``policy/*``, ``optim/*``, ``faults/*``,
    ``routing/*``, the diagnostics, ``time/*``, ``perf/*``), as python floats."""
    batch, done = record.batch, [u for u in record.updates if u.fault is None]
    metrics = rollout_metrics(record.completions, record.rewards_PG, record.accuracy_threshold)
    metrics.update(record.reward_stats)
    seen, engine_routes = batch, record.engine_routes  # where the monitor has pi_old
    if record.pi_old_rows is not None:  # logp_old is mu_old there: pi_old is the first update's forward
        seen = batch.select(record.pi_old_rows).with_logp_old(record.old.logp)
        engine_routes = None if engine_routes is None else engine_routes[record.pi_old_rows]
    metrics["train/entropy"] = mean_over(record.old.entropy, seen.mask)
    assert seen.logp_old is not None
    metrics.update({f"mismatch/{k}": float(v) for k, v in mismatch_metrics(seen.logp_rollout, seen.logp_old, seen.mask).items()})
    if record.logp_lag is not None:  # mu_old -> pi at the engine's weights theta_(t-1) -> pi_old at theta_t
        lag = record.logp_lag if record.pi_old_rows is None else record.logp_lag[record.pi_old_rows]
        for name, (a, b) in {"engine": (seen.logp_rollout, lag), "lag": (lag, seen.logp_old)}.items():
            metrics.update({f"mismatch/{name}_{k}": float(v) for k, v in mismatch_metrics(a, b, seen.mask).items()})
    if done:
        metrics.update(update_metrics(done))
    metrics["faults/skipped_updates"] = float(len(record.updates) - len(done))
    scales = [u.loss_scale for u in record.updates if u.loss_scale is not None]
    if scales:  # optim.precision=fp16
        metrics["optim/loss_scale"] = scales[-1]
        metrics["faults/fp16_overflows"] = float(sum(u.overflowed for u in record.updates))
    if record.routing:
        drift = [u.natural_diff_frac for u in done if u.natural_diff_frac is not None]
        metrics.update(routing_step_metrics(engine_routes, record.old.routes, seen.attention_mask, drift))
    metrics.update(record.diagnostics)
    t = record.times  # this step's own, in line; its batch's rollout and rewards may have run beside the last step
    sampled = record.sampled_times if record.sampled_times is not None else t
    generated = record.rollout_tokens if record.rollout_tokens is not None else sum(len(c.completion_ids) for c in record.completions)
    metrics.update({
        "time/rollout_s": sampled["rollout"], "time/reward_s": sampled.get("reward", 0.0),
        "time/old_logprobs_s": t["old_logprobs"], "time/update_s": t["update"], "time/sync_s": t["sync"],
        "time/step_s": sum(t.values()),  # the step's wall time, without what ran beside the last one
        "perf/rollout_tokens_per_s": generated / max(sampled["rollout"], 1e-9),
        "perf/train_tokens_per_s": int(batch.attention_mask.sum()) / max(t["old_logprobs"] + t["update"], 1e-9),
    })
    if "engine_logprobs" in t:  # rollout.async_split_mismatch: the pass at the weights that sampled the batch
        metrics["time/engine_logprobs_s"] = t["engine_logprobs"]
    if "rollout_wait" in t:  # rollout.async_steps: the update's wait for the next step's rollout, before the sync
        metrics["time/rollout_wait_s"] = t["rollout_wait"]
    return metrics


def mean_over(values: torch.Tensor | None, mask: torch.Tensor) -> float:
    """``algo``'s masked mean of ``values`` over ``mask``, as a python float (NaN without values)."""
    return float("nan") if values is None else float(masked_mean(values, mask))


def tool_metrics(completions: list[Completion], prefix: str) -> dict[str, float]:
    """TRL's ``call_frequency`` (tool calls per response) and ``failure_frequency`` (failed calls per call) under
    ``prefix``, for responses sampled with ``task.tools`` / ``task.environment`` (``minirl.rollout.tools``); none
    without."""
    if not any(c.messages is not None for c in completions):
        return {}
    calls = sum(c.tool_calls for c in completions)
    return {f"{prefix}call_frequency": calls / len(completions),
            f"{prefix}failure_frequency": sum(c.tool_failures for c in completions) / max(calls, 1)}


def rollout_metrics(completions: list[Completion], rewards_PG: torch.Tensor, threshold: float = 1.0) -> dict[str, float]:
    """``train/*`` of a step; correct = reward >= ``threshold`` (``eval.accuracy_threshold``). The group fractions
    only with groups (one sample a prompt: every "group" would be uniform)."""
    lengths = torch.tensor([len(c.completion_ids) for c in completions], dtype=torch.float32)
    truncated = sum(c.finish_reason == "length" for c in completions)
    correct_PG = rewards_PG >= threshold
    groups = {} if rewards_PG.shape[1] < 2 else {
        "train/uniform_reward_groups_frac": float((rewards_PG == rewards_PG[:, :1]).all(dim=1).float().mean()),
        "train/all_correct_groups_frac": float(correct_PG.all(dim=1).float().mean()),
        "train/all_wrong_groups_frac": float((~correct_PG).all(dim=1).float().mean()),
    }
    return tool_metrics(completions, "tools/") | {
        "train/reward_mean": float(rewards_PG.mean()),
        "train/accuracy": float(correct_PG.float().mean()),
        "train/response_length": float(lengths.mean()),
        "train/response_length_max": float(lengths.max()),
        "train/truncated_frac": truncated / len(completions),
    } | groups


def update_metrics(updates: list[UpdateResult]) -> dict[str, Any]:
    """``optim/*`` and ``policy/*`` over the step's (not skipped) updates: means, the last lr, the max norm."""
    n = len(updates)
    out: dict[str, Any] = {}
    for key in updates[0].metrics:
        out[f"policy/{key}"] = sum(u.metrics[key] for u in updates) / n
    out["policy/loss"] = sum(u.loss for u in updates) / n
    out["optim/grad_norm"] = sum(u.grad_norm for u in updates) / n
    out["optim/grad_norm_max"] = max(u.grad_norm for u in updates)
    out["optim/lr"] = updates[-1].lr
    return out


def routing_step_metrics(
    engine_routes: torch.Tensor | None, trainer_routes: torch.Tensor | None, fed: torch.Tensor, drift: list[float]
) -> dict[str, float]:
    """``routing/*``: engine vs trainer top-k sets over the fed positions, and R2's per-update drift."""
    out: dict[str, float] = {}
    if engine_routes is not None and trainer_routes is not None:
        agreement = routing_agreement(engine_routes, trainer_routes, fed)
        for key, value in agreement.items():
            if key.startswith("route_diff_"):
                out["routing/train_infer_diff_" + key[len("route_diff_"):]] = value
    for i, value in enumerate(drift):
        out[f"routing/r2_drift_mb{i}"] = value
    if drift:
        out["routing/r2_drift_last"] = drift[-1]
    return out
