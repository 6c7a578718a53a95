"""The outer loop of MiniRL (paper §4, synchronous RL): ``train`` = ``setup``, then ``global_step``.

One global step:
    1. rollout: the engine (mu_old) samples ``samples_per_prompt`` responses for each of
       ``prompts_per_step`` prompts and reports ``logp_rollout`` (and its routes, for R3 and for
       the ``routing/*`` metrics of MoE models);
    2. rewards from the task's verifier; group-mean baseline advantages;
    3. the trainer recomputes ``logp_old`` (pi_old) over the whole global batch without gradient
       (R2 records the trainer's routes here; R3 replays the engine's routes here, so
       ``mismatch/*`` measures the mismatch with the routing actually used). With N = 1 (and no
       R2, no diagnostics this step) theta_old is theta and the pass is skipped: pi_old is taken,
       bitwise the same, from the single update's own forward (``objective.OnPolicy``);
    4. N = ``minibatches_per_step`` gradient updates (routes replayed in every one under R2/R3;
       every recorded route must be consumed exactly once per phase, else ``RuntimeError``);
    5. the new weights are pushed to the engine.

The same function drives every placement (``cluster`` config, ``minirl.distributed``): with the
defaults the engine and the trainer are objects in this process; otherwise the engine is an
``EngineGroup`` (E engines, in-process or Ray actors) and the trainer a ``TrainerGroup`` (W FSDP2
ranks, spawned processes or Ray actors) with the same methods.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from minirl.algo import group_advantages, mismatch_metrics
from minirl.batching import collate, split
from minirl.config import Config, ConfigError, dump_config
from minirl.diagnostics import gradient_fidelity
from minirl.distributed import build_placement
from minirl.metrics import MetricsLogger
from minirl.objective import OnPolicy, make_objective
from minirl.rollout.base import RolloutEngine
from minirl.runtime import (
    DataOrder,
    build_model,
    build_replay,
    build_rewards,
    build_task,
    environment,
    seed_everything,
    set_threads,
)
from minirl.tasks import data_metrics
from minirl.tasks.base import Task
from minirl.trainer import Trainer
from minirl.types import Batch, Completion, Prompt, SamplingParams


@dataclass
class RunSummary:
    run_dir: Path
    eval_before: float
    eval_after: float
    steps: int
    seconds: float


class NumericalFaultStop(RuntimeError):
    """``optim.max_consecutive_faults`` updates in a row were skipped (non-finite values); ``str()``
    is one line naming the step and the last good checkpoint."""


@dataclass
class Run:
    """The pieces of a run, built once by ``setup``; ``global_step`` advances them."""

    cfg: Config
    model: torch.nn.Module
    tokenizer: Any
    task: Task
    rewards: Any  # minirl.tasks.reward_runner.RewardRunner
    replay: Any | None  # minirl.moe.RoutingReplay (MoE models), else None
    engine: RolloutEngine  # or an EngineGroup (cluster.rollout_engines, Ray actors)
    trainer: Trainer  # or a TrainerGroup (cluster.trainer_ranks, Ray actors)
    prompts: list[Prompt]
    order: DataOrder
    faults: list[str] = field(default_factory=list)  # why updates of the last global step were skipped
    placement: Any = None  # minirl.distributed.Placement: the workers to stop at the end

    def close(self) -> None:
        """Stop the reward workers and any trainer ranks or engine actors."""
        try:
            self.rewards.close()
        finally:
            if self.placement is not None:
                self.placement.close()


def setup(cfg: Config, *, start_from: str | None = None) -> Run:
    """Seed, build the model, task, routing replay, engine(s) and trainer of a run.

    ``cluster`` decides where the engines and the trainer run (``minirl.distributed``); ``model``
    is this process's copy: the trainer's own in the default single process, else a mirror that
    every weight sync refreshes (checkpoints are written from it). ``Run.close()`` stops workers.
    """
    set_threads(cfg.run.threads)
    seed_everything(cfg.run.seed)
    model, tokenizer = build_model(cfg, path=start_from)
    task = build_task(cfg, model, tokenizer)
    replay = build_replay(cfg, model)
    placement = build_placement(cfg, model, tokenizer, replay, start_from=start_from)
    try:
        prompts = task.train_prompts()
        rewards = build_rewards(cfg, task)
    except BaseException:
        placement.close()
        raise
    return Run(cfg, model, tokenizer, task, rewards, placement.replay, placement.engine, placement.trainer, prompts,
               DataOrder(len(prompts), seed=cfg.run.seed), placement=placement)


def capture_state(run: Run, step: int, logger: MetricsLogger, eval_before: dict, eval_metrics: dict) -> dict[str, Any]:
    """Everything besides the weights that step ``step + 1`` depends on (``trainer_state.pt``)."""
    from minirl import checkpoint

    logger.sync()
    return {
        "step": step,
        "trainer": run.trainer.checkpoint_state(),
        "rng": checkpoint.capture_rng(),
        "engine_rng": run.engine.get_rng_state() if hasattr(run.engine, "get_rng_state") else {},
        "data_order": {"epoch": run.order.epoch, "position": run.order.position},
        "metrics_bytes": logger.size(),
        "eval_before": dict(eval_before),
        "eval_metrics": dict(eval_metrics),
    }


def restore(run: Run, checkpoint_dir: Path) -> dict[str, Any]:
    """Load a checkpoint's weights and state into ``run``; returns the saved state."""
    from minirl import checkpoint
    from minirl.models.io import check_compatible, load_model_and_tokenizer

    meta = checkpoint.read_meta(checkpoint_dir)
    if meta is None:
        raise ConfigError(f"cannot resume from {checkpoint_dir}: not a complete checkpoint")
    checkpoint.check_config(checkpoint_dir, meta["config"], run.cfg)
    check_compatible(checkpoint_dir / checkpoint.MODEL, run.model)
    saved, _ = load_model_and_tokenizer(str(checkpoint_dir / checkpoint.MODEL), trust_remote_code=run.cfg.model.trust_remote_code)
    run.model.load_state_dict(saved.state_dict())
    del saved
    state = checkpoint.load_state(checkpoint_dir)
    run.trainer.load_checkpoint_state(state["trainer"])
    run.engine.load_weights(run.trainer.state_dict())
    if hasattr(run.engine, "set_rng_state"):
        run.engine.set_rng_state(state["engine_rng"])
    run.order.epoch, run.order.position = int(state["data_order"]["epoch"]), int(state["data_order"]["position"])
    checkpoint.restore_rng(state["rng"])  # last: loading above may draw from the global streams
    return state


def train(cfg: Config, *, start_from: str | None = None, resume_from: Path | None = None,
          log: Any = None) -> RunSummary:
    """Run MiniRL as configured; returns held-out accuracy before and after RL.

    ``resume_from``: a checkpoint directory (``minirl.checkpoint.find_latest``) to continue from,
    at its step + 1, with ``metrics.jsonl`` cut back to that step.
    """
    with hold_run_dir(cfg.run_dir):  # one process per run directory: a second one would corrupt it
        return _train(cfg, start_from=start_from, resume_from=resume_from, log=log)


def _train(cfg: Config, *, start_from: str | None, resume_from: Path | None, log: Any) -> RunSummary:
    from minirl import checkpoint

    started = time.perf_counter()
    run = setup(cfg, start_from=start_from)
    run_dir = cfg.run_dir
    checkpoint.prune(run_dir, cfg.checkpoint.keep_last)  # stale .tmp-* of killed runs
    first = 1
    state: dict[str, Any] | None = None
    try:
        if resume_from is not None:
            state = restore(run, Path(resume_from))
            first = int(state["step"]) + 1
            metrics_path = run_dir / "metrics.jsonl"
            if metrics_path.exists():
                os.truncate(metrics_path, int(state["metrics_bytes"]))
        else:  # a fresh start: metrics and resumable checkpoints of an earlier run in this directory go
            check_fresh_start(cfg)
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
            checkpoint.remove_all(run_dir)
        dump_config(cfg, run_dir / "config.yaml")
        with open(run_dir / "environment.jsonl", "a", encoding="utf-8") as env_file:  # one line per start or resume
            env_file.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from_step": first - 1,
                                       **environment()}) + "\n")
        logger = MetricsLogger(
            run_dir, total_steps=cfg.optim.steps, console=cfg.log.console, tensorboard=cfg.log.tensorboard,
            wandb=cfg.log.wandb, wandb_project=cfg.log.wandb_project, config=cfg.model_dump(mode="json"),
        )
    except BaseException:
        run.close()
        raise

    last_good: Path | None = Path(resume_from) if resume_from is not None else None
    try:
        if state is None:
            eval_before = evaluate(run.engine, run.rewards, run.task, cfg, step=0)
            logger.log(0, {**eval_before, **data_metrics(run.task)})
            eval_metrics = eval_before
        else:
            eval_before, eval_metrics = state["eval_before"], state["eval_metrics"]
            logger.print(f"resumed from {resume_from} at step {first}")
            logger.advance(first - 1)
        every = cfg.checkpoint.every_steps
        for step in range(first, cfg.optim.steps + 1):
            metrics = global_step(run, step)
            for reason in run.faults:
                logger.print(f"step {step}: {reason}")
            if step == cfg.optim.steps or (cfg.eval.every_steps and step % cfg.eval.every_steps == 0):
                eval_metrics = evaluate(run.engine, run.rewards, run.task, cfg, step=step)
                metrics.update(eval_metrics)
            logger.log(step, metrics)
            if run.trainer.consecutive_faults >= cfg.optim.max_consecutive_faults:
                where = f"last good checkpoint {last_good}" if last_good else "no checkpoint was written"
                raise NumericalFaultStop(
                    f"step {step}: {run.trainer.consecutive_faults} updates in a row skipped for non-finite log-probs, "
                    f"loss or gradients (optim.max_consecutive_faults={cfg.optim.max_consecutive_faults}); stopped, {where}"
                )
            if step == cfg.optim.steps or (every and step % every == 0):
                snapshot = capture_state(run, step, logger, eval_before, eval_metrics)
                last_good = checkpoint.save(run_dir, step, model=run.trainer.model, tokenizer=run.tokenizer,
                                            state=snapshot, cfg=cfg, keep_last=cfg.checkpoint.keep_last)
    finally:
        logger.close()
        run.close()
    from minirl.models.io import save_checkpoint

    save_checkpoint(run.trainer.model, run.tokenizer, run_dir / "checkpoint")
    return RunSummary(
        run_dir=run_dir,
        eval_before=eval_before["eval/accuracy"],
        eval_after=eval_metrics["eval/accuracy"],
        steps=cfg.optim.steps,
        seconds=time.perf_counter() - started,
    )


def global_step(run: Run, step: int) -> dict[str, float]:
    """One global step (rollout, rewards, pi_old, N updates, weight sync); returns its metrics."""
    cfg, engine, trainer, replay = run.cfg, run.engine, run.trainer, run.replay
    mode = cfg.moe.routing_replay
    routing_metrics = replay is not None and cfg.moe.routing_metrics  # MoE models only
    t0 = time.perf_counter()
    # 1. rollout with mu_old (the engine's routes: replayed under R3, compared for the metrics)
    run.faults = []
    step_prompts = [run.prompts[i] for i in run.order.next(cfg.rollout.prompts_per_step)]
    completions = engine.generate(
        step_prompts, cfg.rollout.samples_per_prompt, rollout_sampling(cfg, step),
        record_routes=(mode == "R3" or routing_metrics),
    )
    t1 = time.perf_counter()
    # 2. rewards and group-baseline advantages
    rewards, reward_stats = score_completions(run.rewards, step_prompts, completions)
    rewards_PG = rewards.view(len(step_prompts), -1)
    advantages_PG = group_advantages(rewards_PG, std_normalize=cfg.algo.adv_std_normalize)
    batch = collate(completions, advantages_PG.reshape(-1), pad_token_id=run.tokenizer.pad_token_id)
    engine_routes = batch.routes
    # shape, layer count and expert range against the model (ValueError naming the MoE layer);
    # the number of forced (token, layer) rows per MoE layer, each to be replayed exactly once
    expected = None if engine_routes is None or replay is None else replay.validate(engine_routes)
    if mode != "R3":
        batch.routes = None
    # 3. pi_old over the whole global batch (R3 replays the engine's routes, R2 records). With one
    #    update per step (N = 1) theta_old is theta: pi_old comes from the update's own forward
    #    (``OnPolicy``) and this pass is skipped, unless the diagnostics need pi_old first (R2 at
    #    N = 1 records its routes here, so it keeps the pass).
    diagnose = bool(cfg.diagnostics.every_steps) and step % cfg.diagnostics.every_steps == 0
    fused = fuses_old_pass(cfg, diagnose)
    if not fused:
        before = None if replay is None else list(replay.replayed_rows)
        old = trainer.score(batch, replay_routes=(mode == "R3"), record_routes=(mode == "R2" or routing_metrics))
        batch.logp_old = old.logp  # under R3, with the engine's routing: mismatch/* compares like with like
        if mode == "R3":
            check_all_replayed(replay, before, expected, "old-log-prob pass")
        if mode == "R2":
            batch.routes = old.routes
            expected = replay.validate(batch.routes)
    t2 = time.perf_counter()
    # 4. N gradient updates on mini-batches, routes replayed under R2/R3
    before = None if replay is None else list(replay.replayed_rows)
    minibatches = split(batch, cfg.optim.minibatches_per_step)
    fused_scores = {"score": True, "record_routes": routing_metrics} if fused else {}
    updates, diagnostics = [], {}
    for index, minibatch in enumerate(minibatches):
        objective = make_objective(cfg.algo, minibatch)
        if fused:
            objective = OnPolicy(objective)
        if diagnose and index in (0, len(minibatches) - 1):  # first-order approximation, fresh vs stalest
            pre = None if replay is None else list(replay.replayed_rows)
            try:
                diagnostics.update(approximation_diagnostics(trainer, minibatch, objective, mode, index, len(minibatches)))
            except FloatingPointError as exc:  # a NaN log-prob: the update below is skipped and counted
                run.faults.append(f"diagnostics not computed ({exc})")
            if pre is not None:  # the diagnostics' own replayed forwards are not the updates' consumption
                before = [b + now - p for b, p, now in zip(before, pre, replay.replayed_rows)]
        updates.append(trainer.update(minibatch, objective, replay_routes=(mode != "none"),
                                      natural_drift=(mode == "R2" and routing_metrics), **fused_scores))
    skipped = [u for u in updates if u.get("skipped")]
    run.faults += [f"skipped an update: {u['reason']}" for u in skipped]
    updates = [u for u in updates if not u.get("skipped")]
    if mode != "none" and not skipped:  # a skipped update may stop before consuming its routes
        check_all_replayed(replay, before, expected, "updates")
    if fused:  # pi_old as the update saw it; a skipped update left the weights alone: score them
        old = updates[0].pop("scores") if updates else trainer.score(batch, replay_routes=(mode == "R3"), record_routes=routing_metrics)
        batch.logp_old = old.logp
    t3 = time.perf_counter()
    # 5. weight sync to the rollout engine
    engine.load_weights(trainer.state_dict())
    t4 = time.perf_counter()

    metrics = rollout_metrics(completions, rewards_PG)
    metrics.update(reward_stats)
    metrics["train/entropy"] = masked_mean(old.entropy, batch.mask)
    metrics.update({f"mismatch/{k}": float(v) for k, v in mismatch_metrics(batch.logp_rollout, batch.logp_old, batch.mask).items()})
    drift = [u.pop("routing_natural_diff_frac") for u in updates if "routing_natural_diff_frac" in u]
    if updates:
        metrics.update(update_metrics(updates))
    metrics["faults/skipped_updates"] = float(len(skipped))
    if routing_metrics:
        metrics.update(routing_step_metrics(engine_routes, old.routes, batch.attention_mask, drift))
    metrics.update(diagnostics)
    metrics.update({
        "time/rollout_s": t1 - t0, "time/old_logprobs_s": t2 - t1, "time/update_s": t3 - t2,
        "time/sync_s": t4 - t3, "time/step_s": t4 - t0,
        "perf/rollout_tokens_per_s": sum(len(c.completion_ids) for c in completions) / max(t1 - t0, 1e-9),
        "perf/train_tokens_per_s": int(batch.attention_mask.sum()) / max(t3 - t2, 1e-9),
    })
    return metrics


# ----------------------------------------------------------------------------- helpers


def fuses_old_pass(cfg: Config, diagnose: bool) -> bool:
    """Whether this step takes pi_old from its single update's forward instead of its own pass."""
    return cfg.optim.minibatches_per_step == 1 and not diagnose and cfg.moe.routing_replay != "R2"


@contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``run_dir`` (``run_dir/.lock``, released when the process ends).

    Two processes training into one directory (two sweeps with overlapping arms, a resume started
    while the run still goes) would interleave their metrics and overwrite each other's checkpoints;
    the second one stops at once with one line naming the directory and the holder's pid instead.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a+", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise ConfigError(f"run.name: {run_dir} is in use by another minirl process (pid {holder}); "
                              "wait for it to end or choose another run.name") from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def check_fresh_start(cfg: Config) -> None:
    """Refuse to start over in a directory holding an earlier run, unless ``run.overwrite``."""
    from minirl import checkpoint

    run_dir = cfg.run_dir
    earlier = (run_dir / "metrics.jsonl").exists() or checkpoint.find_latest(run_dir) is not None
    if earlier and not cfg.run.overwrite:
        raise ConfigError(
            f"run.name: {run_dir} already holds a run; continue it with --resume (run.resume=auto), "
            "start over with run.overwrite=true, or choose another run.name"
        )


def approximation_diagnostics(trainer: Trainer, minibatch: Batch, objective: Any, mode: str, index: int, count: int) -> dict[str, float]:
    """``minirl.diagnostics`` before update ``index`` of ``count``: tagged ``first`` and/or ``last``."""
    tags = (["first"] if index == 0 else []) + (["last"] if index == count - 1 else [])
    metrics = gradient_fidelity(trainer, minibatch, objective, replay_routes=(mode != "none"), tag=tags[0], approximation=True)
    for tag in tags[1:]:  # N = 1: the first mini-batch is also the last
        metrics.update({key.replace(f"/{tags[0]}_", f"/{tag}_"): value for key, value in metrics.items()})
    return metrics


def rollout_sampling(cfg: Config, step: int) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, seed=cfg.run.seed * 100_003 + step)


def score_completions(rewards: Any, prompts: list[Prompt], completions: list[Completion]) -> tuple[torch.Tensor, dict[str, float]]:
    """Rewards [n] from the task's verifier (a ``RewardRunner``), and its error/timeout counts."""
    values, stats = rewards.score(prompts, completions)
    if not torch.isfinite(values).all():
        raise FloatingPointError("a reward is not finite after the reward runner's checks")
    return values, stats


def evaluate(engine: RolloutEngine, rewards: Any, task: Task, cfg: Config, *, step: int) -> dict[str, float]:
    """Held-out mean@n accuracy: reward averaged over n samples for each evaluation prompt."""
    e = cfg.eval
    prompts = task.eval_prompts()[: e.num_prompts]
    sampling = SamplingParams(
        max_new_tokens=e.max_new_tokens or cfg.rollout.max_new_tokens, temperature=e.temperature, top_p=e.top_p,
        seed=cfg.run.seed * 7919 + 1_000_000 + step,
    )
    completions = engine.generate(prompts, e.samples_per_prompt, sampling)
    rewards, _ = score_completions(rewards, prompts, completions)
    lengths = torch.tensor([len(c.completion_ids) for c in completions], dtype=torch.float32)
    return {"eval/accuracy": float((rewards >= 1.0).float().mean()), "eval/reward_mean": float(rewards.mean()),
            "eval/response_length": float(lengths.mean())}


def masked_mean(values: torch.Tensor | None, mask: torch.Tensor) -> float:
    if values is None:
        return float("nan")
    return float((values * mask).sum() / mask.sum().clamp(min=1))


def rollout_metrics(completions: list[Completion], rewards_PG: torch.Tensor) -> dict[str, float]:
    lengths = torch.tensor([len(c.completion_ids) for c in completions], dtype=torch.float32)
    truncated = sum(c.finish_reason == "length" for c in completions)
    solved = (rewards_PG == rewards_PG[:, :1]).all(dim=1).float().mean()
    return {
        "train/reward_mean": float(rewards_PG.mean()),
        "train/accuracy": float((rewards_PG >= 1.0).float().mean()),
        "train/response_length": float(lengths.mean()),
        "train/response_length_max": float(lengths.max()),
        "train/truncated_frac": truncated / len(completions),
        "train/solved_groups_frac": float(solved),
    }


def update_metrics(updates: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in updates[0]:
        values = [u[key] for u in updates]
        if key == "lr":
            out["optim/lr"] = values[-1]
        elif key == "grad_norm":
            out["optim/grad_norm"] = sum(values) / len(values)
            out["optim/grad_norm_max"] = max(values)
        else:
            out[f"policy/{key}"] = sum(values) / len(values)
    return out


def routing_step_metrics(
    engine_routes: torch.Tensor | None, trainer_routes: torch.Tensor | None, fed: torch.Tensor, drift: list[float]
) -> dict[str, float]:
    """``routing/*``: engine vs trainer top-k sets over the fed positions, and R2's per-update drift."""
    from minirl.moe import routing_agreement

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


def check_all_replayed(replay: Any, before: list[int], expected: list[int], phase: str) -> None:
    """Every forced route row of the global batch was replayed exactly once in ``phase``."""
    replayed = list(replay.replayed_rows)  # one read (a trainer group sums its ranks' counters)
    for layer, (start, want) in enumerate(zip(before, expected)):
        got = replayed[layer] - start
        if got != want:
            raise RuntimeError(
                f"routing replay ({phase}): MoE layer {layer} ({replay.layer_names[layer]}) replayed {got} of the "
                f"{want} recorded (token, layer) routes of the global batch; each must be consumed exactly once"
            )
