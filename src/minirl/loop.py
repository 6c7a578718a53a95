"""The outer loop of MiniRL (paper §4, synchronous RL): ``train`` = ``setup``, then ``global_step``.

One global step:
    1. rollout: the engine (mu_old) samples ``samples_per_prompt`` responses for each of
       ``prompts_per_step`` prompts and reports ``logp_rollout`` (and its routes, for R3 and for
       the ``routing/*`` metrics of MoE models);
    2. rewards from the task's verifier (with ``rollout.filter_groups``, DAPO's dynamic sampling: rounds of
       1 and 2 until ``prompts_per_step`` groups whose rewards differ are kept, ``minirl.dynamic_sampling``);
       group-mean baseline advantages;
    3. the trainer recomputes ``logp_old`` (pi_old) over the whole global batch without gradient
       (R2 records the trainer's routes here; R3 replays the engine's routes here, so
       ``mismatch/*`` measures the mismatch with the routing actually used). With N = E = 1 (and no
       R2, no diagnostics this step) theta_old is theta and the pass is skipped: pi_old is taken,
       bitwise the same, from the single update's own forward (``Trainer.update(old_pass=True)``).
       ``algo.logp_old_source: rollout`` (verl's bypass mode) skips it: ``logp_old`` is ``logp_rollout``;
    4. N = ``minibatches_per_step`` gradient updates (routes replayed in every one under R2/R3;
       the step's ``RoutePlan`` checks that every recorded route is consumed exactly once per pass),
       repeated over the same mini-batches for E = ``epochs_per_step`` passes (verl's ``ppo_epochs``);
    5. the new weights are pushed to the engine.

The same function drives every placement (``cluster`` config, ``minirl.distributed``): with the
defaults the engine and the trainer are objects in this process; otherwise the engine is an
``EngineGroup`` (E engines, in-process or Ray actors) and the trainer a ``TrainerGroup`` (W FSDP2
ranks, spawned processes or Ray actors) with the same methods. Rollouts and rewards come through
seams (``minirl.sources``): ``train(cfg, rollouts=..., rewards=...)``, ``--dump-rollouts``,
``--rollouts-from``. Every per-step metric is assembled by ``minirl.monitor``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from minirl.algo import group_advantages
from minirl.algo._common import train_infer_factor
from minirl.algo.variants.baselines import response_whiten, token_whiten
from minirl.algo.variants.entropy import adaptive_entropy_coef
from minirl.algo.variants.gae import gae_advantages
from minirl.algo.variants.gdpo import decoupled_advantages, decoupled_sum
from minirl.algo.variants.kl_reward import adaptive_kl_coef, kl_penalized_rewards, token_kl_estimate
from minirl.algo.variants.otb import optimal_token_advantages
from minirl.algo.variants.rejection import rejection_keep
from minirl.algo.variants.scored import defined_advantages, scored_group_advantages, scored_response_whiten
from minirl.algo.variants.token_returns import masked_whiten, token_returns
from minirl.async_rollout import RolloutAhead, engine_weights
from minirl.batching import collate, split
from minirl.config import Config, ConfigError, dump_config
from minirl.distributed import build_placement, trainer_in_ranks
from minirl.dynamic_sampling import Sampled, has_spread, round_limit, sample_groups
from minirl.metrics import MetricsLogger, reset_samples, sample_rows
from minirl.moe.replay import RoutePlan
from minirl.monitor import StepRecord, approximation_diagnostics, step_metrics, tool_metrics
from minirl.objective import (
    make_objective,
    with_current_rejection,
    with_entropy_bonus,
    with_high_entropy_tokens,
    with_load_balance,
)
from minirl.partial_rollout import PartialPool, continued
from minirl.reference import with_reference_kl
from minirl.rollout.base import DecodeControl, RolloutEngine
from minirl.runtime import (
    DataOrder,
    build_model,
    build_replay,
    build_rewards,
    build_task,
    environment,
    kernel_change,
    seed_everything,
    set_threads,
)
from minirl.sources import (
    EngineRollouts,
    RewardSource,
    RolloutDump,
    RolloutReplay,
    RolloutSource,
)
from minirl.tasks import data_metrics
from minirl.tasks.base import Task
from minirl.tasks.chat import cut_at_stop_strings
from minirl.trainer import Objective, Trainer
from minirl.types import Batch, Completion, Prompt, SamplingParams
from minirl.update_guard import NumericalFaultStop, PoisonedWeights


@dataclass
class RunSummary:
    run_dir: Path
    eval_before: float
    eval_after: float
    steps: int
    seconds: float


@dataclass
class Run:
    """The pieces of a run, built once by ``setup``; ``global_step`` advances them."""

    cfg: Config
    model: torch.nn.Module
    tokenizer: Any
    task: Task
    rewards: RewardSource  # the task's RewardRunner, or what ``train(rewards=...)`` was given
    replay: Any | None  # minirl.moe.RoutingReplay (MoE models), else None
    engine: RolloutEngine  # or an EngineGroup (cluster.rollout_engines, Ray actors)
    trainer: Trainer  # or a TrainerGroup (cluster.trainer_ranks, Ray actors)
    prompts: list[Prompt]
    order: DataOrder
    faults: list[str] = field(default_factory=list)  # why updates of the last global step were skipped
    samples: list[dict] = field(default_factory=list)  # a few (prompt, completion, reward) of the last step
    entropy_control: dict[str, float] = field(default_factory=dict)  # algo.entropy_target: coefficient, last entropy
    kl_control: dict[str, float] = field(default_factory=dict)  # algo.kl_in_reward_target: the coefficient
    placement: Any = None  # minirl.distributed.Placement: the workers to stop at the end
    rollouts: RolloutSource | None = None  # None: the engine samples (``EngineRollouts``)
    fuse_old_pass: bool = True  # N = 1: pi_old from the single update's forward (False: its own pass)
    make_objective: Callable[[Any, Batch], Objective] = make_objective  # algo config, mini-batch -> objective
    reference: Any = None  # minirl.reference.Reference when algo.kl_coef > 0
    ahead: RolloutAhead | None = None  # rollout.async_steps: the next steps' rollouts, beside this step's update
    partial: PartialPool | None = None  # rollout.partial_rollout: the groups decoded across steps
    engine_weights: Any = None  # rollout.async_split_mismatch: minirl.async_rollout.EngineWeights (or the ranks')
    critic: Any = None  # algo.adv_baseline=critic: minirl.critic.Critic
    critic_targets: tuple[torch.Tensor, torch.Tensor] | None = None  # the step's (V_old, GAE returns), for its updates
    sum_pi_squared: torch.Tensor | None = None  # algo.adv_baseline=optimal_token: the step's pi_old pass's [B, T]

    def __post_init__(self) -> None:
        if self.rollouts is None:  # the documented default for a Run built by hand: the engine samples
            self.rollouts = EngineRollouts(self.engine)
        if self.ahead is None and self.cfg.rollout.async_steps:
            self.ahead = RolloutAhead()
        if self.partial is None and self.cfg.rollout.partial_rollout:
            self.partial = PartialPool(self.cfg.rollout.samples_per_prompt, self.cfg.rollout.max_new_tokens)
        if self.engine_weights is None and self.cfg.rollout.async_split_mismatch:
            self.engine_weights = engine_weights(self.trainer)

    def close(self) -> None:
        """Stop the reward workers and any trainer ranks or engine actors (after a rollout still running)."""
        try:
            if self.ahead is not None:
                self.ahead.stop()
            self.rewards.close()
        finally:
            if self.placement is not None:
                self.placement.close()


def setup(cfg: Config, *, start_from: str | None = None, rewards: RewardSource | None = None,
          rollouts: RolloutSource | None = None) -> Run:
    """Seed, build the model, task, routing replay, engine(s) and trainer of a run.

    ``cluster`` decides where the engines and the trainer run (``minirl.distributed``); ``model``
    is this process's copy: the trainer's own in the default single process, else a mirror that
    every weight sync refreshes (checkpoints are written from it). ``Run.close()`` stops workers.
    ``rewards`` / ``rollouts``: the seams of ``minirl.sources`` (default: the task's verifier, the engine).
    """
    set_threads(cfg.run.threads)
    seed_everything(cfg.run.seed)
    model, tokenizer = build_model(cfg, path=start_from)
    critic: Any = None
    ranks = trainer_in_ranks(cfg)  # the trainer's ranks hold a critic's shards
    if cfg.algo.adv_baseline == "critic" and not ranks:  # from the policy's starting weights, before LoRA
        from minirl.critic import build_critic

        critic = build_critic(cfg, model)
    if cfg.algo.router_aux_loss_coef and router_top_k(model) is None:
        raise ConfigError(f"algo.router_aux_loss_coef: {type(model).__name__} returns no router logits (not an MoE "
                          "model with output_router_logits); set it to 0")
    task = build_task(cfg, model, tokenizer)
    replay = build_replay(cfg, model)
    placement = build_placement(cfg, model, tokenizer, replay, start_from=start_from)
    try:
        prompts = task.train_prompts()
        rewards = rewards if rewards is not None else build_rewards(cfg, task)
    except BaseException:
        placement.close()
        raise
    engine = placement.engine
    if cfg.task.calls_tools:  # responses that call tools, turn by turn (minirl.rollout.tools)
        from minirl.rollout.tools import tool_calling

        try:
            engine = tool_calling(cfg, engine, tokenizer, model, prompts, task.eval_prompts())
        except BaseException:
            placement.close()
            raise
    if cfg.algo.adv_baseline == "critic" and ranks:
        critic = placement.trainer.critic()  # minirl.distributed.group.GroupCritic
    reference = None
    if cfg.algo.kl_coef or cfg.algo.kl_in_reward_coef:
        from minirl.reference import build_reference

        reference = build_reference(placement.trainer)  # the policy as the run starts (LoRA: the base model)
    return Run(cfg, model, tokenizer, task, rewards, placement.replay, engine, placement.trainer, prompts,
               DataOrder(len(prompts), seed=cfg.run.seed), placement=placement,
               rollouts=rollouts if rollouts is not None else EngineRollouts(engine), reference=reference,
               critic=critic)


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
        "rollout_ahead": run.ahead.state(run.prompts) if run.ahead is not None else {},  # after the order's draw
        **({"partial_pool": run.partial.state(run.prompts)} if run.partial is not None else {}),
        "entropy_control": dict(run.entropy_control),
        "kl_control": dict(run.kl_control),
        **({"reference": run.reference.state_dict()} if run.cfg.algo.ref_sync_every_updates else {}),
        **({"critic": run.critic.state_dict()} if run.critic is not None else {}),
        # rollout.async_split_mismatch: the weights the batch ahead was sampled with, to split its mismatch too
        **({"engine_weights": run.engine_weights.state_dict()} if run.engine_weights is not None else {}),
        "metrics_bytes": logger.size(),
        "eval_before": dict(eval_before),
        "eval_metrics": dict(eval_metrics),
    }


def restore(run: Run, checkpoint_dir: Path) -> dict[str, Any]:
    """Load a checkpoint's weights and state into ``run``; returns the saved state."""
    from minirl import checkpoint
    from minirl.models.io import check_compatible, load_model_and_tokenizer
    from minirl.models.lora import has_lora, load_adapter_weights

    meta = checkpoint.read_meta(checkpoint_dir)
    if meta is None:
        raise ConfigError(f"cannot resume from {checkpoint_dir}: not a complete checkpoint")
    checkpoint.check_config(checkpoint_dir, meta["config"], run.cfg)
    check_compatible(checkpoint_dir / checkpoint.MODEL, run.model)
    if has_lora(run.model):  # the base was rebuilt from the run's source; the adapter holds what trained
        load_adapter_weights(run.model, checkpoint_dir / checkpoint.MODEL)
    else:
        saved, _ = load_model_and_tokenizer(str(checkpoint_dir / checkpoint.MODEL), trust_remote_code=run.cfg.model.trust_remote_code)
        run.model.load_state_dict(saved.state_dict())
        del saved
    state = checkpoint.load_state(checkpoint_dir)
    run.trainer.load_checkpoint_state(state["trainer"])
    run.engine.load_weights(run.trainer.state_dict())
    if hasattr(run.engine, "set_rng_state"):
        run.engine.set_rng_state(state["engine_rng"])
    run.order.epoch, run.order.position = int(state["data_order"]["epoch"]), int(state["data_order"]["position"])
    if run.ahead is not None:  # the next step's batch, sampled beside the saved step's update
        run.ahead.load_state(state.get("rollout_ahead", {}), run.prompts)
    if run.partial is not None:  # the groups still decoding, their responses so far
        run.partial.load_state(state.get("partial_pool", {}), run.prompts)
    run.entropy_control = {key: float(value) for key, value in state.get("entropy_control", {}).items()}
    run.kl_control = {key: float(value) for key, value in state.get("kl_control", {}).items()}
    if run.reference is not None and "reference" in state:  # a synced reference (algo.ref_sync_every_updates)
        run.reference.load_state_dict(state["reference"])
    if run.critic is not None:
        if "critic" not in state:
            raise ConfigError(f"cannot resume from {checkpoint_dir}: it holds no critic (algo.adv_baseline=critic)")
        run.critic.load_state_dict(state["critic"])
    if run.engine_weights is not None:  # absent from a checkpoint of a run without the split: its first step has none
        run.engine_weights.load_state_dict(state.get("engine_weights", {}))
    checkpoint.restore_rng(state["rng"])  # last: loading above may draw from the global streams
    return state


def train(cfg: Config, *, start_from: str | None = None, resume_from: Path | None = None,
          rewards: RewardSource | None = None, rollouts: RolloutSource | None = None,
          dump_rollouts: str | Path | None = None, rollouts_from: str | Path | None = None,
          run: Run | None = None, run_dir_held: bool = False) -> RunSummary:
    """Run MiniRL as configured; returns held-out accuracy before and after RL.

    ``resume_from``: a checkpoint directory (``minirl.checkpoint.find_latest``) to continue from,
    at its step + 1, with ``metrics.jsonl`` cut back to that step. ``rewards``, ``rollouts``: the
    seams of ``minirl.sources``; ``dump_rollouts`` writes each step's rollouts and rewards to a
    directory, ``rollouts_from`` trains on such a dump instead of sampling. ``run``: a ``Run`` the
    caller built with ``setup(cfg)`` (and may have changed: a test's seam), trained and closed here.
    ``run_dir_held``: the caller already holds ``hold_run_dir(cfg.run_dir)`` (``minirl train`` takes it
    before choosing the checkpoint).
    """
    with nullcontext() if run_dir_held else hold_run_dir(cfg.run_dir):  # one process per run directory
        run = run or setup(cfg, start_from=start_from, rewards=rewards, rollouts=rollouts)
        try:
            check_sources(cfg, rollouts=rollouts, dump_rollouts=dump_rollouts, rollouts_from=rollouts_from)
            if rollouts_from is not None:
                run.rewards = run.rollouts = RolloutReplay(rollouts_from, run.rewards)
            if dump_rollouts is not None:
                assert run.rollouts is not None
                run.rewards = run.rollouts = RolloutDump(run.rollouts, run.rewards, dump_rollouts)
        except BaseException:
            run.close()
            raise
        return _train(run, resume_from=resume_from, start_from=start_from)


def check_sources(cfg: Config, *, rollouts: RolloutSource | None = None, dump_rollouts: str | Path | None = None,
                  rollouts_from: str | Path | None = None) -> None:
    """Where the rollouts come from, against what the config needs of them (one line each; ``minirl train`` asks
    before its cold start)."""
    if rollouts_from is not None and cfg.algo.adv_baseline == "greedy":
        raise ConfigError("--rollouts-from with algo.adv_baseline=greedy: a dump holds no greedy completions for "
                          "ReMax's baseline")
    if cfg.rollout.partial_rollout and (rollouts_from is not None or dump_rollouts is not None):
        raise ConfigError(f"--{'rollouts-from' if rollouts_from is not None else 'dump-rollouts'} with "
                          "rollout.partial_rollout: a dump holds whole steps' rollouts, not the chunks a partial "
                          "rollout decodes across steps")
    if cfg.rollout.partial_rollout and rollouts is not None:
        raise ConfigError("train(rollouts=...) with rollout.partial_rollout: partial rollouts continue responses in "
                          "minirl's engine (Prompt.response_prefix); give no rollout source")


def _open_run_dir(run: Run, resume_from: Path | None,
                  start_from: str | None = None) -> tuple[dict[str, Any] | None, MetricsLogger]:
    """Restore a resumed run (metrics cut back to its step) or clear an earlier one; the resolved
    config, one ``environment.jsonl`` line and the metrics logger."""
    from minirl import checkpoint

    cfg, run_dir, state = run.cfg, run.cfg.run_dir, None
    checkpoint.prune(run_dir, cfg.checkpoint.keep_last)  # stale .tmp-* of killed runs
    changed = None
    if resume_from is not None:
        changed = kernel_change(run_dir)  # read before this start's line is appended
        state = restore(run, Path(resume_from))
        if (run_dir / "metrics.jsonl").exists():
            os.truncate(run_dir / "metrics.jsonl", int(state["metrics_bytes"]))
        reset_samples(run_dir, int(state["step"]))
    else:  # a fresh start: metrics, resumable checkpoints and the final model of an earlier run in this directory go
        if check_fresh_start(cfg, start_from):  # run.overwrite: said, never silent
            print(f"minirl: run.overwrite: {run_dir} held an earlier run; starting over (its checkpoints and metrics "
                  "are replaced)", file=sys.stderr)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        reset_samples(run_dir, 0)
        checkpoint.remove_all(run_dir)
        shutil.rmtree(run_dir / "checkpoint", ignore_errors=True)  # never an earlier run's model beside this config
    dump_config(cfg, run_dir / "config.yaml")
    with open(run_dir / "environment.jsonl", "a", encoding="utf-8") as env_file:  # one line per start or resume
        env_file.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                   "from_step": 0 if state is None else int(state["step"]),
                                   "start_from": start_from, "cwd": os.getcwd(),  # the weights; its relative paths' base
                                   **environment()}) + "\n")
    logger = MetricsLogger(
        run_dir, total_steps=cfg.optim.global_steps, console=cfg.log.console, tensorboard=cfg.log.tensorboard,
        wandb=cfg.log.wandb, wandb_project=cfg.log.wandb_project, config=cfg.model_dump(mode="json"),
        plain=cfg.log.plain,
    )
    from minirl.rollout.verl_tools import missing_tools_kwargs

    tools_kwargs = missing_tools_kwargs(run.prompts) if cfg.task.tool_config else None
    for line in (changed, uncorrected_lag(cfg), repeated_prompts(cfg, len(run.prompts)), tools_kwargs):
        if line:
            logger.print(line)
    return state, logger


def repeated_prompts(cfg: Config, rows: int) -> str | None:
    """One line when a step draws more prompts than the training data has: each step then holds some twice (verl's
    and TRL's loaders, which drop a last partial batch, would make no step at all)."""
    wanted = cfg.rollout.prompts_per_step
    if 0 < rows < wanted:
        return (f"rollout.prompts_per_step={wanted} is more than the {rows} training prompts: each step holds some of "
                "them twice (verl's and TRL's loaders would make no step)")
    return None


def uncorrected_lag(cfg: Config) -> str | None:
    """One line when ``rollout.async_steps`` makes every batch k steps stale and the objective has nothing that sees
    it: no mu_old factor (``algo.is_correction``), and pi_old from the trainer (the clip and the weight see
    pi_theta/pi_old only) or from the rollout with neither a clip nor a pi_theta/pi_old weight on it."""
    a = cfg.algo
    if not cfg.rollout.async_steps or getattr(a, "is_correction", False):
        return None
    if a.logp_old_source == "rollout" and (getattr(a, "clip", True) or getattr(a, "staleness_weight", True)):
        return None
    fixes = ["algo.is_correction=true"] if hasattr(cfg.algo, "is_correction") else []
    fixes.append("algo.logp_old_source=rollout (the clip then bounds pi_theta/mu_old)")
    k = cfg.rollout.async_steps
    return (f"rollout.async_steps={k}: each batch is {k} step{'s' * (k > 1)} stale (mu_old at theta_(t-{k}), pi_old at "
            f"theta_t) and nothing in algo.name={cfg.algo.name} as configured corrects for it; set {' or '.join(fixes)}")


def _train(run: Run, *, resume_from: Path | None, start_from: str | None = None) -> RunSummary:
    from minirl import checkpoint

    started, cfg = time.perf_counter(), run.cfg
    try:
        state, logger = _open_run_dir(run, resume_from, start_from)
    except BaseException:
        run.close()
        raise
    last_good: Path | None = Path(resume_from) if resume_from is not None else None
    try:
        if state is None:
            tell_progress(run.rewards, 0, cfg, len(run.prompts))
            eval_before = eval_metrics = evaluate(run.engine, run.rewards, run.task, cfg, step=0)
            logger.log(0, {**eval_before, **data_metrics(run.task)})
        else:
            eval_before, eval_metrics = state["eval_before"], state["eval_metrics"]
            logger.print(f"resumed from {resume_from} at step {int(state['step']) + 1}")
            logger.advance(int(state["step"]))
        last, every = cfg.optim.global_steps, cfg.checkpoint.every_steps
        for step in range(1 if state is None else int(state["step"]) + 1, last + 1):
            try:
                metrics = global_step(run, step)
            except PoisonedWeights as exc:  # optim.update_guard=check: the weights are lost, stop before any save
                raise NumericalFaultStop(f"step {step}: {exc}; stopped, {last_good_phrase(last_good)}") from None
            for reason in run.faults:
                logger.print(f"step {step}: {reason}")
            if step == last or (cfg.eval.every_steps and step % cfg.eval.every_steps == 0):
                tell_progress(run.rewards, step, cfg, len(run.prompts))
                eval_metrics = evaluate(run.engine, run.rewards, run.task, cfg, step=step)
                metrics.update(eval_metrics)
            logger.log(step, metrics)
            if cfg.log.completions_every_steps and step % cfg.log.completions_every_steps == 0:
                logger.log_samples(step, run.samples)
            check_faults(run, step, last_good)
            if step == last or (every and step % every == 0):
                snapshot = capture_state(run, step, logger, eval_before, eval_metrics)
                last_good = checkpoint.save(cfg.run_dir, step, model=run.trainer.model, tokenizer=run.tokenizer,
                                            state=snapshot, cfg=cfg, keep_last=cfg.checkpoint.keep_last)
    finally:
        logger.close()
        run.close()
    from minirl.models.io import dtype_on_disk, save_checkpoint

    # the final model in the dtype it came in (a bf16 model stays bf16); resumable checkpoints keep fp32 master weights
    save_checkpoint(run.trainer.model, run.tokenizer, cfg.run_dir / "checkpoint",
                    dtype=dtype_on_disk(start_from or cfg.model.path))
    return RunSummary(run_dir=cfg.run_dir, eval_before=eval_before["eval/accuracy"], eval_after=eval_metrics["eval/accuracy"],
                      steps=cfg.optim.global_steps, seconds=time.perf_counter() - started)


def check_faults(run: Run, step: int, last_good: Path | None) -> None:
    """``NumericalFaultStop`` after ``optim.max_consecutive_faults`` skipped updates in a row."""
    limit = run.cfg.optim.max_consecutive_faults
    if run.trainer.consecutive_faults >= limit:
        raise NumericalFaultStop(
            f"step {step}: {run.trainer.consecutive_faults} updates in a row skipped for non-finite log-probs, "
            f"loss, gradients or weights (optim.max_consecutive_faults={limit}); stopped, {last_good_phrase(last_good)}"
        )


def last_good_phrase(last_good: Path | None) -> str:
    return f"last good checkpoint {last_good}" if last_good else "no checkpoint was written"


PER_TOKEN_BASELINES = ("critic", "optimal_token")
"""``algo.adv_baseline`` values that give one advantage per token, after the old-log-prob and reference passes."""


def step_advantages(cfg: Config, sampled: Sampled, part_weights: torch.Tensor | None, *,
                    clip: bool = True, whiten: bool = True) -> torch.Tensor:
    """One advantage per completion [P x G]: the group baseline of the rewards (``algo.adv_*``: the response lengths
    for OPO's), or GDPO's from each reward function's values (``algo.multi_objective_aggregation``); REINFORCE++'s
    or RLOO's whitening after it (unless not ``whiten``). ``clip``: the rewards still need ``algo.reward_clip_range``."""
    a = cfg.algo
    if a.adv_baseline in PER_TOKEN_BASELINES:  # placeholders: one per token after the passes (GAE's, OTB's)
        return torch.zeros(len(sampled.completions))
    rewards_PG = (clipped_rewards(a, sampled.rewards) if clip else sampled.rewards).view(len(sampled.prompts), -1)
    lengths = torch.tensor([len(c.completion_ids) for c in sampled.completions])
    if a.multi_objective_aggregation == "normalize_then_sum":
        if sampled.reward_parts is None or part_weights is None:
            raise ConfigError("algo.multi_objective_aggregation=normalize_then_sum needs each reward function's values; "
                              "these rollouts have only their sum (a --rollouts-from dump written before they were kept?)")
        parts = sampled.reward_parts.view(*rewards_PG.shape, -1)
        if not a.adv_whiten:  # TRL's: the weighted sum whitened over the responses
            return decoupled_advantages(parts, part_weights, a.adv_std_eps).reshape(-1)
        summed = decoupled_sum(parts, part_weights, a.adv_std_eps).reshape(-1)  # verl's: over the step's tokens
        scored = ~torch.isnan(summed)  # a response no function applied to: no advantage, not in the statistics
        return token_whiten(summed.nan_to_num(0.0), lengths * scored) * scored
    applied = None if sampled.reward_parts is None else ~torch.isnan(sampled.reward_parts).all(dim=1)
    if applied is not None and not bool(applied.all()) and a.adv_baseline in ("group_mean", "leave_one_out") \
            and not a.adv_nonzero_rescale:  # responses no reward function scored: out of the statistics, advantage 0
        advantages = scored_group_advantages(rewards_PG, applied.view(rewards_PG.shape), a.adv_std_normalize,
                                             std_scope=a.adv_std_scope, baseline=a.adv_baseline,
                                             std_eps=a.adv_std_eps).reshape(-1)
        if a.adv_whiten and whiten:  # over the responses given one (TRL 1.16's RLOO)
            kept = defined_advantages(applied.view(rewards_PG.shape), baseline=a.adv_baseline, std_scope=a.adv_std_scope,
                                      std_normalize=a.adv_std_normalize).reshape(-1)
            if a.adv_whiten_over == "responses":
                advantages = scored_response_whiten(advantages, kept)
            else:  # fewer than two tokens given an advantage: no variance, all 0 (as over the responses)
                tokens = lengths * kept
                advantages = token_whiten(advantages, tokens) * kept if int(tokens.sum()) >= 2 else advantages * 0
        return advantages
    greedy = None if sampled.greedy_rewards is None else clipped_rewards(a, sampled.greedy_rewards)  # never KL-shaped
    advantages = group_advantages(rewards_PG, std_normalize=a.adv_std_normalize, baseline=a.adv_baseline,
                                  std_scope=a.adv_std_scope, lengths_PG=lengths.view(rewards_PG.shape),
                                  nonzero_rescale=a.adv_nonzero_rescale, greedy_P=greedy,
                                  std_eps=a.adv_std_eps).reshape(-1)
    if a.adv_whiten and whiten:  # REINFORCE++(-baseline): over the step's tokens; TRL's RLOO: over its responses
        advantages = token_whiten(advantages, lengths) if a.adv_whiten_over == "tokens" else response_whiten(advantages)
    return advantages


def token_advantages(cfg: Config, sampled: Sampled, batch: Batch, token_rewards: torch.Tensor | None = None) -> Batch:
    """``algo.adv_token_returns``: the batch with one advantage per token [B, T] (0 off its mask), each token's
    discounted return (``minirl.algo.variants.token_returns``; ``token_rewards``: -beta x the KL in the reward), less
    the greedy completion's reward (ReMax) or whitened over the batch's tokens (REINFORCE++)."""
    a = cfg.algo
    returns = token_returns(clipped_rewards(a, sampled.rewards).float(), batch.mask, gamma=a.adv_gamma,
                            token_rewards_BT=token_rewards)
    if a.adv_baseline == "greedy":
        assert sampled.greedy_rewards is not None  # sampled beside the group (adv_baseline: greedy)
        greedy = clipped_rewards(a, sampled.greedy_rewards).float()[batch.group_ids]
        returns = (returns - greedy[:, None]) * batch.mask
    return dataclasses.replace(batch, advantages=masked_whiten(returns, batch.mask) if a.adv_whiten else returns)


def clipped_rewards(algo: Any, rewards: torch.Tensor) -> torch.Tensor:
    """``algo.reward_clip_range`` (TRL RLOO's ``reward_clip_range``): the rewards clamped into it, or as they are."""
    bounds = algo.reward_clip_range
    return rewards if bounds is None else rewards.clamp(min=bounds[0], max=bounds[1])


def reference_pass(run: Run, sampled: Sampled, batch: Batch) -> tuple[Batch, dict[str, float]]:
    """With a reference (``algo.kl_coef`` or ``kl_in_reward_coef`` > 0): its log-probs of the batch (natural routing)
    and, with the KL in the reward (verl's ``use_kl_in_reward``), the advantages of the penalized rewards; with
    ``algo.adv_token_returns``, the token-level advantages (after this pass: the KL in the reward may enter them)."""
    if run.reference is not None:
        batch = batch.with_logp_ref(run.reference.logprobs(batch))
        if run.cfg.algo.kl_in_reward_coef:
            return penalized_advantages(run, sampled, batch)
    a = run.cfg.algo
    per_token = a.adv_token_returns or a.adv_baseline in PER_TOKEN_BASELINES
    return (per_token_advantages(run, sampled, batch) if per_token else batch), {}


def per_token_advantages(run: Run, sampled: Sampled, batch: Batch, token_rewards: torch.Tensor | None = None) -> Batch:
    """The batch with one advantage per token: the critic's GAE (``algo.adv_baseline: critic``), the optimal token
    baseline's (``optimal_token``) or the discounted returns (``algo.adv_token_returns``); ``token_rewards``: -beta x
    the KL in the reward at each token."""
    baseline = run.cfg.algo.adv_baseline
    if baseline == "critic":
        return critic_advantages(run, sampled, batch, token_rewards)
    if baseline == "optimal_token":
        return otb_advantages(run, sampled, batch, token_rewards)
    return token_advantages(run.cfg, sampled, batch, token_rewards)


def otb_advantages(run: Run, sampled: Sampled, batch: Batch, token_rewards: torch.Tensor | None = None) -> Batch:
    """``algo.adv_baseline: optimal_token``: the batch with verl's optimal-token-baseline advantages
    (``minirl.algo.variants.otb``) of each token's return, over the pi_old pass's log-probs and sum pi_old^2; with
    ``algo.is_correction`` the energies weighted by the squared IS factor pi_old/mu_old as the loss bounds it (verl's
    ``rollout_is_weights``); whitened over tokens with ``adv_whiten``."""
    a = run.cfg.algo
    assert run.sum_pi_squared is not None and batch.logp_old is not None  # the old pass asked for it
    returns = token_returns(clipped_rewards(a, sampled.rewards).float(), batch.mask, token_rewards_BT=token_rewards)
    weight = None
    if getattr(a, "is_correction", False):  # gspo (the one loss without it) takes no per-token advantages
        bounds = {key: getattr(a, key) for key in ("tis_cap", "tis_floor", "tis_mode", "tis_level") if hasattr(a, key)}
        weight, _ = train_infer_factor(batch.logp_old, batch.logp_rollout, batch.mask, torch.float32, enabled=True,
                                       **bounds)
    advantages = optimal_token_advantages(returns, batch.logp_old, run.sum_pi_squared, batch.mask, batch.group_ids,
                                          weight)
    return dataclasses.replace(batch, advantages=masked_whiten(advantages, batch.mask) if a.adv_whiten else advantages)


def critic_advantages(run: Run, sampled: Sampled, batch: Batch, token_rewards: torch.Tensor | None = None) -> Batch:
    """``algo.adv_baseline: critic``: the batch with GAE's advantages over the critic's values (``adv_gamma``,
    ``adv_lambda``; ``minirl.algo.variants.gae``), whitened over its tokens with ``adv_whiten`` as verl does; the values
    and returns stay in ``run.critic_targets`` for the step's critic updates."""
    a = run.cfg.algo
    values = run.critic.values(batch)
    advantages, returns = gae_advantages(clipped_rewards(a, sampled.rewards).float(), values, batch.mask,
                                         gamma=a.adv_gamma, lam=a.adv_lambda, token_rewards_BT=token_rewards)
    run.critic_targets = (values, returns)
    return dataclasses.replace(batch, advantages=masked_whiten(advantages, batch.mask) if a.adv_whiten else advantages)


def critic_updates(run: Run, trained: Batch, n: int) -> dict[str, float]:
    """The critic's updates, before the policy's (verl's ``update_critic``): ``critic.epochs_per_step`` passes over the
    step's N mini-batches, each against its rows' GAE returns and the values they were formed with; ``critic/*``
    (means over the updates, the last ``lr``) and ``critic/vf_explained_var`` of the returns, as verl logs them."""
    assert run.critic_targets is not None  # critic_advantages ran in this step's reference pass
    values, returns = run.critic_targets
    size, epochs = trained.size // n, run.cfg.critic.epochs_per_step or run.cfg.optim.epochs_per_step
    results = [run.critic.update(trained.select(rows), values[rows], returns[rows])
               for _ in range(epochs) for rows in (slice(i * size, (i + 1) * size) for i in range(n))]
    metrics = {f"critic/{key}": sum(r[key] for r in results) / len(results) for key in results[0]
               if key not in ("grad_norm", "overflowed", "loss_scale")}
    stepped = [r["grad_norm"] for r in results if not r["overflowed"]]  # an fp16 overflow's norm is inf, no norm
    metrics |= {"critic/grad_norm": sum(stepped) / len(stepped)} if stepped else {}
    metrics["critic/lr"] = results[-1]["lr"]
    if run.cfg.optim.precision == "fp16":
        metrics |= {"critic/fp16_overflows": sum(r["overflowed"] for r in results), "critic/loss_scale": results[-1]["loss_scale"]}
    v, g = values[trained.mask], returns[trained.mask]
    metrics.update({"critic/values_mean": float(v.mean()), "critic/returns_mean": float(g.mean()),
                    "critic/vf_explained_var": float(1.0 - torch.var(g - v) / (torch.var(g) + 1e-5))})
    return metrics


def penalized_advantages(run: Run, sampled: Sampled, batch: Batch) -> tuple[Batch, dict[str, float]]:
    """``algo.kl_in_reward_coef``: the batch with the advantages of R - beta x each response's summed KL estimate
    (``minirl.algo.variants.kl_reward``), and ``train/reward_kl_penalty`` (verl's ``actor/reward_kl_penalty``) and
    ``train/reward_kl_coef`` (the beta used); beta adapts after the step with ``algo.kl_in_reward_target``."""
    a = run.cfg.algo
    logp_old, logp_ref = batch.logp_old, batch.logp_ref
    assert logp_old is not None and logp_ref is not None  # the old and reference passes ran
    coef = run.kl_control.setdefault("coef", float(a.kl_in_reward_coef))
    if a.adv_token_returns or a.adv_baseline in PER_TOKEN_BASELINES:  # REINFORCE++, ReMax, GAE, OTB: the KL per token
        estimate, current = token_kl_estimate(logp_old, logp_ref, batch.mask, a.kl_in_reward_type)
        batch = per_token_advantages(run, sampled, batch, token_rewards=-coef * estimate)
    elif a.adv_token_kl:  # slime's REINFORCE++-baseline: each token's own KL in its advantage, then whitened
        estimate, current = token_kl_estimate(logp_old, logp_ref, batch.mask, a.kl_in_reward_type)
        advantages = step_advantages(run.cfg, sampled, None, whiten=False)[:, None] * batch.mask - coef * estimate
        batch = dataclasses.replace(batch, advantages=masked_whiten(advantages, batch.mask) if a.adv_whiten
                                    else advantages)
    else:
        shaped, current = kl_penalized_rewards(clipped_rewards(a, sampled.rewards), logp_old, logp_ref,
                                               batch.mask, coef=coef, kind=a.kl_in_reward_type)
        batch = dataclasses.replace(batch, advantages=step_advantages(
            run.cfg, dataclasses.replace(sampled, rewards=shaped), None, clip=False))
    if a.kl_in_reward_target is not None:
        run.kl_control["coef"] = adaptive_kl_coef(coef, float(current), target=a.kl_in_reward_target,
                                                  horizon=a.kl_in_reward_horizon, n_steps=batch.size)
    return batch, {"train/reward_kl_penalty": float(current), "train/reward_kl_coef": coef}


def update_objective(run: Run, minibatch: Batch) -> Objective:
    """What one update differentiates: the configured policy loss (``run.make_objective``; on its high-entropy tokens
    with ``algo.top_entropy_quantile`` < 1), plus the KL penalty to the reference (``algo.kl_coef``) and minus the
    entropy bonus (``algo.entropy_coef``) when they are on."""
    a = run.cfg.algo
    policy = with_high_entropy_tokens(a, with_current_rejection(a, run.make_objective(a, minibatch)))
    coef = None
    if a.entropy_target is not None:  # adaptive control: the coefficient as the last update left it, gated
        control = run.entropy_control
        control.setdefault("coef", float(a.entropy_coef))
        control.setdefault("last", math.inf)  # TRL's start: no entropy seen, no bonus in the first update
        coef = control["coef"] if control["last"] <= a.entropy_target else 0.0
    objective = with_entropy_bonus(a, minibatch, with_reference_kl(a, minibatch, policy), coef)
    return with_load_balance(a, minibatch, router_top_k(run.model), objective)


def router_top_k(model: torch.nn.Module) -> int | None:
    """The experts per token of an MoE model that returns its router logits (``output_router_logits`` in its
    config, as TRL checks for its load-balancing loss), else None."""
    config: Any = model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not hasattr(config, "output_router_logits"):
        return None
    return getattr(config, "num_experts_per_tok", None) or getattr(config, "moe_topk", None)


def observe_entropy(run: Run, update: Any) -> None:
    """Adaptive entropy control (``algo.entropy_target``): the coefficient after ``update`` (not after a skipped one)."""
    a = run.cfg.algo
    if a.entropy_target is None or update.fault is not None:
        return
    entropy = float(update.metrics["entropy"])
    run.entropy_control["coef"] = adaptive_entropy_coef(run.entropy_control["coef"], entropy, target=a.entropy_target,
                                                        delta=a.entropy_coef_delta, low=a.entropy_coef_min,
                                                        high=a.entropy_coef_max)
    run.entropy_control["last"] = entropy


def sync_reference(run: Run, update: Any) -> None:
    """``algo.ref_sync_every_updates``: after every that many optimizer steps taken (skipped ones do not count, as
    TRL counts its ``global_step``), the reference moves toward the policy by ``algo.ref_sync_alpha``."""
    every = run.cfg.algo.ref_sync_every_updates
    if every and run.reference is not None and update.fault is None and run.trainer.updates_done % every == 0:
        run.reference.sync(run.cfg.algo.ref_sync_alpha)


def global_step(run: Run, step: int) -> dict[str, float]:
    """One global step, the design's data flow: rollout, rewards, pi_old, N updates, weight sync."""
    cfg, trainer, n, clock = run.cfg, run.trainer, run.cfg.optim.minibatches_per_step, _Clock()
    plan = RoutePlan(run.replay, cfg.moe.routing_replay, metrics=cfg.moe.routing_metrics)
    run.faults = []
    # 1. rollout with mu_old (the engine's routes: replayed under R3, compared for routing/*), and 2. rewards;
    #    with rollout.filter_groups, rounds of both until P groups whose rewards differ are kept
    sampled = step_rollout(run, step, plan.engine_records, clock)  # and the next step's, beside this one's update
    prompts, completions, rewards = sampled.prompts, sampled.completions, sampled.rewards
    rewards_PG = rewards.view(len(prompts), -1)
    run.samples = sample_rows(prompts, completions, rewards, cfg.log.completions_per_step, sampled.columns)
    advantages = step_advantages(cfg, sampled, sampled.part_weights)  # group baselines
    batch = plan.start(collate(completions, advantages, pad_token_id=run.tokenizer.pad_token_id, mask_truncated=cfg.algo.mask_truncated,
                               trained_from_step=step if cfg.rollout.partial_mask_stale else None))  # partial rollouts
    # 3. pi_old over the whole global batch (R3 replays, R2 records); with N = E = 1 it comes from the
    #    single update's own forward instead, unless R2 or the diagnostics need it first
    diagnose = bool(cfg.diagnostics.every_steps) and step % cfg.diagnostics.every_steps == 0
    epochs = cfg.optim.epochs_per_step
    bypass = cfg.algo.logp_old_source == "rollout"  # verl's bypass mode: pi_old := mu_old, no pass
    rejecting = cfg.algo.reject != "none" and not bypass  # needs pi_old before the update: no fused pass
    before = rejecting or bool(cfg.algo.kl_in_reward_coef) or cfg.algo.adv_baseline == "optimal_token"  # so do these
    policy_trains = run.critic is None or step >= cfg.critic.warmup_steps  # critic.warmup_steps: the critic alone
    fused = (run.fuse_old_pass and n == 1 and epochs == 1 and not diagnose and plan.old_pass_optional and not before
             and not bypass and policy_trains)
    batch, old = old_log_probs(run, plan, batch, skip=fused)
    clock.lap("old_logprobs")
    logp_lag = engine_weights_pass(run, plan, batch, sampled, clock)  # rollout.async_split_mismatch: at theta_(t-1)
    batch, kl_reward = reference_pass(run, sampled, batch)  # log pi_ref; the KL in the reward's, token-level advantages
    # algo.reject (verl's rollout_rs): tokens or responses out of the bounds train nothing; the monitor still sees them
    trained, rejection = reject_out_of_bounds(cfg.algo, batch) if rejecting else (batch, {})
    critic = critic_updates(run, trained, n) if run.critic is not None else {}  # verl: the critic first
    # 4. N gradient updates on mini-batches, routes replayed per the plan; E passes over them
    updates, diagnostics, minibatches = [], {}, split(trained, n)
    for epoch in range(epochs if policy_trains else 0):
        with plan.updates(old_pass=fused) as routing:  # each pass consumes every route once
            for index, minibatch in enumerate(minibatches, start=epoch * n):
                objective = update_objective(run, minibatch)
                if diagnose and index in (0, n * epochs - 1):  # first-order approximation, fresh vs stalest
                    with routing.uncounted():  # own forwards, own objective (the balance loss logs the update's)
                        diagnostics.update(approximation_diagnostics(trainer, minibatch, update_objective(run, minibatch),
                                           index, n * epochs, run.faults, replay_routes=routing.kwargs["replay_routes"]))
                updates.append(trainer.update(minibatch, objective, score=bypass and index == 0, **routing.kwargs))
                if bypass and index == 0:  # the monitor's pi_old: this update's forward at theta_old
                    old = bypass_monitor_scores(run, minibatch, updates[-1], routing)
                observe_entropy(run, updates[-1])
                sync_reference(run, updates[-1])
            routing.waive(any(u.fault for u in updates[epoch * n:]))  # a skipped update may stop before its routes
    run.faults += [f"skipped an update: {u.fault}" for u in updates if u.fault]
    if fused:  # pi_old as the update saw it (or scored on the unchanged weights when it was skipped)
        old = updates[0].scores
        assert old is not None  # Trainer.update(old_pass=True) always returns scores
        batch = batch.with_logp_old(old.logp)
    clock.lap("update")
    sync_weights(run, clock)  # 5. weight sync to the rollout engine
    metrics = step_metrics(StepRecord(completions, rewards_PG, sampled.reward_stats, batch, old, updates,
                                      plan.engine_routes, plan.metrics, diagnostics, clock.laps,
                                      cfg.eval.accuracy_threshold, sampled.generated_tokens,
                                      pi_old_rows=slice(0, minibatches[0].size) if bypass else None,
                                      sampled_times=sampled.times, logp_lag=logp_lag))
    return {key: float(value) for key, value in rejection.items()} | kl_reward | critic | metrics  # read once done


def step_rollout(run: Run, step: int, record_routes: bool, clock: _Clock) -> Sampled:
    """1 and 2. The step's groups and rewards, sampled now, or with ``rollout.async_steps`` (k) sampled beside an
    earlier step's update (``minirl.async_rollout``); then the rollouts of the steps up to step + k not sampled yet
    start beside this step's update, on the weights before it (a batch for step s: lag s - step)."""
    ahead = run.ahead
    sampled = ahead.take(step) if ahead is not None else None
    if sampled is None:  # in line: a synchronous run, or the first step of an asynchronous one
        sampled = sampled_with_weights(run, step, record_routes, clock, lag=None if ahead is None else 0)
    if ahead is not None:
        last = min(step + run.cfg.rollout.async_steps, run.cfg.optim.global_steps)
        ahead.start([(s, functools.partial(sampled_with_weights, run, s, record_routes, _Clock(), lag=s - step))
                     for s in range(max(step, ahead.last_step) + 1, last + 1)])
    if sampled.policy_lag_steps is not None:
        sampled.reward_stats["rollout/policy_lag_steps"] = float(sampled.policy_lag_steps)
    return sampled


def sampled_with_weights(run: Run, step: int, record_routes: bool, clock: _Clock, *, lag: int | None) -> Sampled:
    """``rollout_and_score`` with the reward functions' weights (GDPO's) and ``lag``; one sampled beside the last
    update (``lag`` 1) keeps its own timings, read off its own ``clock``."""
    sampled = rollout_and_score(run, step, record_routes, clock)
    return dataclasses.replace(sampled, part_weights=getattr(run.rewards, "part_weights", None), policy_lag_steps=lag,
                               times=dict(clock.laps) if lag else None)


def sync_weights(run: Run, clock: _Clock) -> None:
    """5. The trainer's weights to the engine, once a rollout beside the update (``rollout.async_steps``) is done."""
    if run.ahead is not None:
        run.ahead.wait()
        clock.lap("rollout_wait")
    run.engine.load_weights(run.trainer.state_dict())
    clock.lap("sync")


def old_log_probs(run: Run, plan: RoutePlan, batch: Batch, *, skip: bool) -> tuple[Batch, Any]:
    """3. pi_old over the whole global batch (R3 replays, R2 records) and its scores; none under
    ``algo.logp_old_source: rollout`` (verl's bypass mode), where ``logp_old`` is the engine's ``logp_rollout``, nor
    with ``skip`` (the single update's forward gives it)."""
    if run.cfg.algo.logp_old_source == "rollout":
        return batch.with_logp_old(batch.logp_rollout), None
    if skip:
        return batch, None
    otb = run.cfg.algo.adv_baseline == "optimal_token"  # its advantages need sum pi_old^2 too
    with plan.old_pass() as routing:
        old = run.trainer.score(batch, **routing.kwargs, sum_pi_squared=otb)
    run.sum_pi_squared = old.sum_pi_squared
    return plan.scored(batch.with_logp_old(old.logp), old), old


def engine_weights_pass(run: Run, plan: RoutePlan, batch: Batch, sampled: Sampled, clock: _Clock) -> torch.Tensor | None:
    """``rollout.async_split_mismatch``: log pi of a batch sampled a step ahead at the weights that sampled it
    (theta_(t-1); R3 replays the engine's routes, as the pi_old pass does), or None for a batch sampled in line (the
    first step) or when no weights were kept (the first step after resuming a checkpoint saved without the split).
    Either way the current weights, which the engine samples the next step's batch with, are kept for the next step."""
    weights = run.engine_weights
    if weights is None:
        return None
    if sampled.policy_lag_steps != 1 or not weights.ready:
        weights.keep()
        return None
    with plan.lag_pass() as routing:
        logp = weights.logprobs(batch, **routing.kwargs)
    clock.lap("engine_logprobs")
    return logp


def bypass_monitor_scores(run: Run, first: Batch, update: Any, routing: Any) -> Any:
    """Under ``algo.logp_old_source: rollout`` the monitor's pi_old: the first update's forward, at theta_old, on its
    mini-batch ``first``; when that update was skipped, a pass over the weights it left unchanged (its routes
    replayed as the updates replay them, not counted as theirs)."""
    if update.scores is not None:
        return update.scores
    with routing.uncounted():
        return run.trainer.score(first, replay_routes=routing.kwargs["replay_routes"],
                                 record_routes=routing.kwargs["record_routes"])


def reject_out_of_bounds(algo: Any, batch: Batch) -> tuple[Batch, dict[str, torch.Tensor]]:
    """``batch`` training only the tokens ``algo.reject`` keeps, and ``mismatch/rejected_{token,seq}_frac`` (of the
    trained tokens, and of the responses that lost any) as tensors: no host sync before the updates."""
    assert batch.logp_old is not None
    keep = rejection_keep(batch.logp_old, batch.logp_rollout, batch.mask, rule=algo.reject, low=algo.reject_low,
                          high=algo.reject_high)
    lost = batch.mask & ~keep
    stats = {"mismatch/rejected_token_frac": lost.sum() / batch.mask.sum().clamp(min=1),
             "mismatch/rejected_seq_frac": lost.any(dim=1).sum() / batch.mask.any(dim=1).sum().clamp(min=1)}
    return batch.with_mask(keep), stats


def rollout_and_score(run: Run, step: int, record_routes: bool, clock: _Clock) -> Sampled:
    """The step's P prompts, P x G completions and their rewards: one draw of ``rollout.prompts_per_step``
    prompts, or with ``rollout.filter_groups`` DAPO's dynamic sampling (``minirl.dynamic_sampling``)."""
    cfg, r = run.cfg, run.cfg.rollout
    assert run.rollouts is not None  # Run.__post_init__ sets the default
    rollouts = run.rollouts

    def draw(count: int) -> list[Prompt]:
        return [run.prompts[i] for i in run.order.next(count)]

    def generate(prompts: list[Prompt], round_index: int) -> list[Completion]:
        completions = rollouts.rollouts(step, prompts, r.samples_per_prompt, rollout_sampling(cfg, step, round_index),
                                        record_routes=record_routes)
        clock.lap("rollout")
        return completions

    def score(prompts: list[Prompt], completions: list[Completion]) -> tuple[torch.Tensor, dict[str, float], Any, Any]:
        tell_progress(run.rewards, step - 1, cfg, len(run.prompts))
        rewards, stats = score_completions(run.rewards, prompts, completions)
        clock.lap("reward")
        return rewards, stats, getattr(run.rewards, "last_columns", None), getattr(run.rewards, "last_parts", None)

    if run.partial is not None:
        return partial_groups(run, step, record_routes, clock, draw, score)
    if not r.filter_groups:
        prompts = draw(r.prompts_per_step)
        completions = generate(prompts, 0)
        # scored before ReMax's greedy rollouts: those reuse the environments' instances (task.environment) a reward
        # function reads; the columns and parts returned are this batch's
        rewards, stats, columns, parts = score(prompts, completions)
        greedy = greedy_rewards(run, step, prompts, clock) if cfg.algo.adv_baseline == "greedy" else None
        if greedy is not None:
            stats["train/greedy_reward_mean"] = float(greedy.mean())
        return Sampled(prompts, completions, rewards, stats, columns or [],
                       sum(len(c.completion_ids) for c in completions), parts, greedy_rewards=greedy)
    per_round = r.filter_groups_prompts_per_round or r.prompts_per_step
    return sample_groups(draw, generate, score, groups=r.prompts_per_step, prompts_per_round=per_round,
                         max_rounds=round_limit(r.filter_groups_max_rounds, len(run.prompts), per_round),
                         metric=r.filter_groups_metric, accuracy_threshold=cfg.eval.accuracy_threshold)


def partial_groups(run: Run, step: int, record_routes: bool, clock: _Clock, draw: Callable[[int], list[Prompt]],
                   score: Callable[..., tuple[Any, ...]]) -> Sampled:
    """``rollout.partial_rollout``: the step's groups from the pool decoded across steps (``minirl.partial_rollout``),
    one response per prompt in each engine call: the native engine decodes a step in one call that keeps its KV cache
    and stops once enough groups have ended (``DecodeControl``); other engines one chunk a call."""
    cfg, r = run.cfg, run.cfg.rollout
    assert run.partial is not None and run.rollouts is not None
    rollouts, tokenizer, stops = run.rollouts, run.tokenizer, tuple(cfg.task.stop_strings)
    in_call = bool(getattr(rollouts, "continues_in_call", False))  # EngineRollouts: whether its engine takes control

    def generate(prompts: list[Prompt], call: int, control: DecodeControl) -> list[Completion]:
        sampling = dataclasses.replace(rollout_sampling(cfg, step, call), max_new_tokens=max(control.max_new_tokens))
        # without the control: the call's longest budget, and the merge cuts each row at its own
        completions = rollouts.rollouts(step, prompts, 1, sampling, record_routes=record_routes,
                                        **({"control": control} if in_call else {}))
        clock.lap("rollout")
        return completions

    def finish(c: Completion) -> Completion:  # the whole response's text; a stop string may span two chunks
        c.text = tokenizer.decode(c.completion_ids, skip_special_tokens=True)
        return cut_at_stop_strings(c, tokenizer, stops)

    def merge(row: Completion | None, new: Completion, at: int) -> Completion:
        return continued(row, new, at, max_new_tokens=r.max_new_tokens, finish=finish)

    def spread(rewards: torch.Tensor) -> bool:
        return bool(has_spread(rewards[None], r.filter_groups_metric, cfg.eval.accuracy_threshold))

    pool = r.partial_pool_prompts or 2 * r.prompts_per_step
    sampled = run.partial.sample(step, draw=draw, generate=generate, score=score, merge=merge, groups=r.prompts_per_step,
                                 pool=pool, chunk_tokens=r.partial_chunk_tokens, in_call=in_call,
                                 filtered=spread if r.filter_groups else None,
                                 max_draws=round_limit(r.filter_groups_max_rounds, len(run.prompts), pool))
    clock.lap("rollout")  # a step that trains groups ended earlier may decode nothing
    return sampled


def greedy_rewards(run: Run, step: int, prompts: list[Prompt], clock: _Clock) -> torch.Tensor:
    """ReMax's baseline (``algo.adv_baseline: greedy``; verl's ``remax``): one greedy completion of each prompt from
    the engine, on the weights that sample the step, scored by the step's reward functions; float32 [P]."""
    sampling = dataclasses.replace(rollout_sampling(run.cfg, step), temperature=0.0)
    completions = run.engine.generate(prompts, 1, sampling)
    clock.lap("rollout")
    rewards, _ = score_completions(run.rewards, prompts, completions)
    clock.lap("reward")
    return rewards.to(torch.float32)


class _Clock:
    """Seconds between successive ``lap`` calls, by name."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        """Add the seconds since the last lap to ``name`` (a phase run several times adds up)."""
        now = time.perf_counter()
        self.laps[name], self._last = self.laps.get(name, 0.0) + now - self._last, now


# ----------------------------------------------------------------------------- helpers


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


def check_fresh_start(cfg: Config, start_from: str | None = None) -> bool:
    """Refuse to start over in a directory holding an earlier run, unless ``run.overwrite``; a run
    that ended before its first global step (no checkpoint, no metrics past step 0) is no loss. Starting over removes
    the earlier run's final ``checkpoint/``: refused when the weights to start from (``start_from``, ``model.path``)
    are in it. Returns whether there is an earlier run (``run.overwrite``) to replace."""
    from minirl import checkpoint

    run_dir = cfg.run_dir
    final = (run_dir / "checkpoint").resolve()
    for key, source in (("--start-from", start_from), ("model.path", cfg.model.path)):
        if source and (final == Path(source).resolve() or final in Path(source).resolve().parents) and final.exists():
            raise ConfigError(f"{key} {source} is this run's own checkpoint/, which starting over removes: copy it "
                              "elsewhere first, or give another run.name")
    earlier = checkpoint.logged_steps(run_dir) > 0 or checkpoint.find_latest(run_dir) is not None
    if earlier and not cfg.run.overwrite:
        raise ConfigError(
            f"run.name: {run_dir} already holds a run; continue it with --resume (minirl.train(resume=True); "
            "run.resume=auto), "
            "start over with run.overwrite=true, or choose another run.name"
        )
    return earlier


def rollout_sampling(cfg: Config, step: int, round_index: int = 0) -> SamplingParams:
    """The rollout's sampling law and seed at ``step`` (``round_index``: dynamic sampling's later rounds)."""
    r = cfg.rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          min_p=r.min_p, repetition_penalty=r.repetition_penalty,
                          seed=cfg.run.seed * 100_003 + step + round_index * 1_000_003)


def tell_progress(rewards: Any, steps_done: int, cfg: Config, train_prompts: int) -> None:
    """The training progress TRL hands reward functions as ``trainer_state`` (gradient updates done, the run's total,
    and epochs done over the ``train_prompts``), on a reward source that takes it (the task's ``RewardRunner``)."""
    if hasattr(rewards, "trainer_state"):
        from minirl.tasks.reward_functions import TrainerState

        epoch = steps_done * cfg.rollout.prompts_per_step / max(train_prompts, 1)
        rewards.trainer_state = TrainerState(steps_done * cfg.updates_per_step, cfg.optim.global_steps * cfg.updates_per_step,
                                             epoch)


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
        top_k=e.top_k, min_p=e.min_p, repetition_penalty=e.repetition_penalty, seed=cfg.run.seed * 7919 + 1_000_000 + step,
    )
    completions = engine.generate(prompts, e.samples_per_prompt, sampling)
    rewards, _ = score_completions(rewards, prompts, completions)
    lengths = torch.tensor([len(c.completion_ids) for c in completions], dtype=torch.float32)
    sources = [(p.meta or {}).get("data_source") for p in prompts]
    metrics = held_out_metrics(rewards.view(len(prompts), e.samples_per_prompt), lengths, e.accuracy_threshold, sources)
    return metrics | tool_metrics(completions, "eval/tool_")  # task.tools: eval/tool_call_frequency, ...


def held_out_metrics(rewards: torch.Tensor, lengths: torch.Tensor, threshold: float,
                     sources: list[Any] | None = None) -> dict[str, float]:
    """``eval/*`` from the held-out rewards [P prompts, n samples]: ``accuracy`` (mean@n), ``reward_mean``,
    ``response_length``; with n > 1 ``pass@k`` for k = 2, 4, ... and n, by the unbiased estimator of Chen et al.
    (2021, Eq. 1): the mean over prompts of ``1 - C(n - c, k) / C(n, k)``, c of n samples correct; and, when the
    prompts come from two or more ``data_source``s (verl's column), ``eval/<source>/accuracy`` and ``reward_mean``
    for each (verl's ``val-core/<data_source>/...``)."""
    correct = rewards >= threshold
    out = {"eval/accuracy": float(correct.float().mean()), "eval/reward_mean": float(rewards.mean()),
           "eval/response_length": float(lengths.mean())}
    n = rewards.shape[1]
    counts = correct.sum(dim=1).tolist()
    for k in sorted({2**i for i in range(1, n.bit_length()) if 2**i < n} | ({n} if n > 1 else set())):
        out[f"eval/pass@{k}"] = sum(1.0 - math.comb(n - c, k) / math.comb(n, k) for c in counts) / len(counts)
    named = [str(source) for source in (sources or []) if source is not None]
    if len(set(named)) >= 2:
        for source in sorted(set(named)):
            rows = torch.tensor([str(s) == source for s in sources or []])
            out[f"eval/{source}/accuracy"] = float(correct[rows].float().mean())
            out[f"eval/{source}/reward_mean"] = float(rewards[rows].mean())
    return out
