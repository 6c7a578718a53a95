"""Metric names and sinks (console progress, ``metrics.jsonl``, TensorBoard, wandb).

One JSON object per global step is appended to ``metrics.jsonl`` in the run directory; row
``step = 0`` holds the evaluation before any RL update. The names are stable:

=============================  ===============================================================
``step``                       global step (1 = after the first rollout and its updates)
``train/reward_mean``          mean reward of the step's rollouts
``train/accuracy``             fraction of rollouts with reward >= ``eval.accuracy_threshold`` (1)
``train/response_length``      mean completion length in tokens (``..._max``: the longest)
``train/truncated_frac``       fraction of completions stopped by ``max_new_tokens``
``train/uniform_reward_groups_frac``  fraction of groups whose rewards all equal (zero
                               advantage: no gradient); split into ``all_correct_groups_frac`` and
                               ``all_wrong_groups_frac`` (every reward >= / < the accuracy threshold);
                               none of the three with one sample a prompt
``filter/*``                    ``rollout.filter_groups`` (DAPO's dynamic sampling) only: ``rounds`` of
                               generation, ``kept_groups_frac`` (groups with a reward spread / groups
                               generated), ``topped_up_groups`` (zero-spread groups filling a short
                               batch), ``reward_mean_generated`` (every sample generated; ``train/*``
                               covers the kept groups)
``reward/<name>/mean``         each user reward function's mean (``task.reward_functions``)
``tools/call_frequency``       ``task.tools`` only: tool calls per response (TRL's name), malformed ones included;
                               ``tools/failure_frequency`` the failed calls per call (malformed, unknown tool,
                               raised; 0 without calls); ``eval/tool_call_frequency`` and ``eval/tool_failure_frequency``
                               the same over the held-out responses
``train/reward_kl_penalty``    ``algo.kl_in_reward_coef`` > 0: the step's mean of each response's token-mean KL
                               estimate in the reward (verl's ``actor/reward_kl_penalty``); ``train/reward_kl_coef``
                               the coefficient it was weighed by (``train/reward_mean`` stays the verifier's)
``reward/{errors,timeouts,fallback_frac}``  user reward problems (``task.reward_on_error``)
``train/entropy``              token-mean full-vocabulary entropy of pi_old at rollout prefixes
``mismatch/kl_k1``             training–inference KL(mu_old || pi_old), sampled-token k1 estimator
``mismatch/kl_k3``             the same KL, k3 estimator (non-negative, lower variance)
``mismatch/abs_dlogp_mean``    mean |log mu_old - log pi_old| (``..._max``: the largest)
                               (``algo.logp_old_source: rollout``, verl's bypass mode: these three and
                               ``train/entropy`` over the first mini-batch, pi_old from its update's forward)
``mismatch/rejected_*``        ``algo.reject`` only: ``token_frac`` of trained tokens and ``seq_frac`` of responses
                               the rejection left out of the loss (the other mismatch/* still cover every token)
                               (``algo.logp_old_source: rollout``: ``policy/rejected_token_frac`` instead, the
                               trained tokens each update's in-loss rejection on pi_theta/mu_old left out)
``policy/*``                   the objective's metrics (clip fractions by advantage sign, IS
                               weight mean/max, truncated- or masked-IS fraction, OPSM's), mean over the N x E updates
``policy/entropy``             ``algo.entropy_coef`` > 0 or ``entropy_target``: pi_theta's token-mean entropy in the
                               updates (the bonus's); ``policy/entropy_coef`` the coefficient they applied
``policy/aux_loss``            ``algo.router_aux_loss_coef`` > 0: the MoE load-balancing loss of the updates' forwards
``policy/loss``                loss, mean over the N x E updates
``critic/*``                   ``algo.adv_baseline: critic`` (PPO's GAE), verl's names: ``vf_loss`` (the clipped value
                               loss), ``vf_clipfrac``, ``vpred_mean``, ``grad_norm`` (means over the critic's updates),
                               ``lr``; ``values_mean`` and ``returns_mean`` (V_old and the GAE returns over trained
                               tokens) and ``vf_explained_var`` = 1 - Var(G - V) / (Var(G) + 1e-5). Before
                               ``critic.warmup_steps`` no ``policy/*``: only the critic trains. ``optim.precision:
                               fp16``: ``fp16_overflows`` (its updates skipped for an overflow; ``grad_norm`` is the
                               mean over the others, absent if none stepped) and ``loss_scale`` (after the step)
``optim/grad_norm``            gradient norm before clipping (mean over updates; ``_max``)
``optim/lr``                   learning rate of the last update
``optim/loss_scale``           ``optim.precision: fp16``: the loss scale after the step's last update
``faults/fp16_overflows``      ``optim.precision: fp16``: updates skipped for a gradient overflow (the scale
                               halved; counted in ``faults/skipped_updates`` too, but not as numerical faults)
``faults/skipped_updates``     updates of the step skipped for a non-finite log-prob, loss or
                               gradient (no optimizer step; ``optim.max_consecutive_faults`` in a
                               row stop the run with exit code 3)
``time/{rollout,reward,old_logprobs,update,sync,step}_s``  wall time per phase (``old_logprobs`` ~0
                               at N = 1, where pi_old comes from the update's forward, and with
                               ``algo.logp_old_source: rollout``); with ``rollout.async_steps``, ``rollout`` and
                               ``reward`` are the batch's own, which ran beside the last step's update (``step``
                               leaves them out), and ``time/rollout_wait_s`` the update's wait for the next one
``rollout/policy_lag_steps``   ``rollout.async_steps`` only: global steps between the weights that sampled the
                               batch and pi_old (0 at the first step, then 1); ``mismatch/*`` then measure the
                               engine's gap and that lag together (mu_old at theta_{t-1}, pi_old at theta_t)
``rollout/stale_tokens_frac``  ``rollout.partial_rollout`` only: trained tokens an earlier step's weights sampled;
                               ``rollout/partial_responses_frac`` trained responses holding tokens of more than one
                               step, ``rollout/max_token_lag_steps`` the oldest token's lag, ``rollout/chunks`` engine
                               calls this step, ``rollout/partial_pool_groups`` groups left waiting in the pool,
                               ``rollout/partial_dropped_groups`` groups that ended beyond the batch (dropped)
``mismatch/{engine,lag}_*``    ``rollout.async_split_mismatch`` only, each of ``mismatch/*``'s four for the two parts
                               of a lagged batch's mismatch, through pi at the weights that sampled it (theta_{t-1}):
                               ``engine_`` mu_old against it (the training–inference discrepancy), ``lag_`` it against
                               pi_old (the staleness; estimated on the engine's samples); the k1s add up to
                               ``mismatch/kl_k1``. Absent at the first step and the first after a resume;
                               ``time/engine_logprobs_s`` the pass's seconds
``perf/rollout_tokens_per_s``  generated tokens per second of the rollout phase
``perf/train_tokens_per_s``    trained (prompt + completion) tokens per second of the update phase
``eval/accuracy``              held-out mean@n accuracy, reward >= ``eval.accuracy_threshold``; ``eval/pass@k``
                               (k = 2, 4, ..., n; unbiased estimator); ``eval/<data_source>/accuracy`` when the
                               held-out rows come from two or more sources (verl's column)
                               (``eval/reward_mean``: the mean held-out reward; ``eval/response_length``)
``routing/train_infer_*``      MoE models (``moe.routing_metrics``), over fed positions: ``diff_frac``
                               fraction of (token, MoE layer) top-k *sets* the engine chose
                               differently from the trainer's natural routing at theta_old (under
                               R3: each router's own choice, captured while the engine's routes
                               are replayed); ``diff_frac_layer{i}`` the same per MoE layer;
                               ``diff_any_layer_frac`` fraction of tokens with any layer differing
``routing/r2_drift_*``         R2 only: ``mb{i}`` fraction of (fed token, layer) sets where the
                               router's natural choice in update i differs from the replayed
                               theta_old routes (0 at i = 0, where theta = theta_old; i counts
                               the N x E updates); ``last``: the same for the last update
=============================  ===============================================================

``samples.jsonl`` (every ``log.completions_every_steps`` steps): a few of the step's rollouts,
one JSON object each, ``{"step", "prompt", "completion", "reward"}`` (also a TensorBoard text and a
wandb table). On the console: a progress line on a terminal (step, ETA first, so they stay visible
at 80 columns); one plain line per step when the output is not a terminal or ``log.plain``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Column

CONSOLE_KEYS = (
    ("train/reward_mean", "reward", "{:.3f}"),
    ("eval/accuracy", "eval", "{:.3f}"),
    ("train/entropy", "H", "{:.3f}"),
    ("mismatch/kl_k1", "KL", "{:.1e}"),
    ("policy/clip_frac", "clip", "{:.3f}"),
    ("train/response_length", "len", "{:.1f}"),
    ("time/step_s", "s/step", "{:.2f}"),
)


def _optional(module: str, name: str | None, key: str, extra: str) -> Any:
    """Import an optional sink; a missing package is the user's config problem, said in one line."""
    from minirl.config import ConfigError

    try:
        imported = __import__(module, fromlist=[name] if name else [])
        return getattr(imported, name) if name else imported
    except ImportError:
        raise ConfigError(f"{key}: true needs the '{extra}' package (pip install 'minirl[{extra}]')") from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf: a non-finite metric is written as null
    return value


class MetricsLogger:
    """Writes each step's metrics to every enabled sink; ``close()`` flushes them."""

    def __init__(
        self,
        run_dir: Path,
        *,
        total_steps: int,
        console: bool = True,
        tensorboard: bool = False,
        wandb: bool = False,
        wandb_project: str = "minirl",
        config: dict | None = None,
        plain: bool = False,
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self.console = Console(stderr=True)
        self._last: dict[str, float] = {}
        self._progress: Progress | None = None
        self._plain = console and (plain or not self.console.is_terminal)  # e.g. a SLURM log
        self._total, self._started = total_steps, time.perf_counter()
        self._first_step: int | None = None
        if console and not self._plain:
            self._progress = progress_line(self.console)
            self._task = self._progress.add_task("", total=total_steps)
            self._progress.start()
        self._tb = None
        if tensorboard:
            SummaryWriter = _optional("torch.utils.tensorboard", "SummaryWriter", "log.tensorboard", "tensorboard")

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self._wandb = None
        if wandb:
            wandb_module = _optional("wandb", None, "log.wandb", "wandb")

            self._wandb = wandb_module.init(project=wandb_project, dir=str(run_dir), config=config or {})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        self._last.update(metrics)
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        parts = [f"{label} {fmt.format(self._last[key])}" for key, label, fmt in CONSOLE_KEYS if key in self._last]
        if self._progress is not None:
            room = max(self.console.width - PROGRESS_FIXED_COLUMNS, 0)  # the metrics give way, not step or ETA
            description = "  ".join(parts)
            self._progress.update(self._task, completed=step, description=description[:room])
        elif self._plain:
            self.console.print(plain_line(step, self._total, parts, self._eta(step)), soft_wrap=True, highlight=False)

    def _eta(self, step: int) -> float | None:
        if self._first_step is None:
            self._first_step, self._started = step, time.perf_counter()
            return None
        done = step - self._first_step
        return (time.perf_counter() - self._started) / done * (self._total - step) if done > 0 else None

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """A few ``{"prompt", "completion", "reward"}`` of step ``step``: ``samples.jsonl``, TensorBoard, wandb."""
        if not samples:
            return
        with self.samples_path.open("a", encoding="utf-8") as handle:
            for sample in samples:
                handle.write(json.dumps({"step": step, **sample}, default=str) + "\n")
        if self._tb is not None:
            text = "\n\n".join(f"**reward {s['reward']:.3f}**  \n{s['prompt']!s:.500}  \n→ {s['completion']!s:.500}" for s in samples)
            self._tb.add_text("samples", text, step)
        if self._wandb is not None:
            import wandb

            table = wandb.Table(columns=["step", "prompt", "completion", "reward"],
                                data=[[step, str(s["prompt"]), s["completion"], s["reward"]] for s in samples])
            self._wandb.log({"samples": table}, step=step)

    def size(self) -> int:
        """Bytes of ``metrics.jsonl`` written so far (a checkpoint's metrics offset)."""
        self._file.flush()
        return self._file.tell()

    def sync(self) -> None:
        """Flush ``metrics.jsonl`` to disk (before a checkpoint records its size)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def advance(self, step: int) -> None:
        """A resumed run: the progress bar starts at ``step``."""
        if self._progress is not None:
            self._progress.update(self._task, completed=step)

    def print(self, *args: Any) -> None:
        self.console.print(*args, soft_wrap=True, highlight=False)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


PROGRESS_FIXED_COLUMNS = 44
"""Columns the progress line keeps for ``RL  37/100 eta 0:01:23 ━━━━━━━━━━`` (up to 6-digit steps)."""


def progress_line(console: Console) -> Progress:
    """The terminal progress line: step and ETA first, then the bar, then the metrics."""
    return Progress(
        TextColumn("[bold]RL"),
        MofNCompleteColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        BarColumn(bar_width=10),
        TextColumn("{task.description}", table_column=Column(no_wrap=True)),
        console=console,
    )


def plain_line(step: int, total: int, parts: list[str], eta_s: float | None) -> str:
    """One step as a plain line: ``step 3/100  eta 0:01:20  reward 0.250  ...``."""
    eta = "--:--" if eta_s is None else time.strftime("%H:%M:%S", time.gmtime(max(eta_s, 0)))
    return "  ".join([f"step {step}/{total}", f"eta {eta}", *parts])


def sample_rows(prompts: list[Any], completions: list[Any], rewards: Any, count: int,
                columns: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The first ``count`` completions of a step as ``{"prompt", "completion", "reward"}`` (chats as messages), with
    the ``columns`` reward functions logged for each (TRL's ``log_extra``); with ``task.tools``, also the completion's
    ``messages``: each turn with its calls, and the tools' results. With ``task.environment``, the prompt is the one
    the model saw: the row's with the text its environment's ``reset()`` added."""
    rows = []
    for index, (completion, reward) in enumerate(list(zip(completions, rewards.tolist()))[:count]):
        prompt = getattr(completion, "environment_prompt", None) or prompts[completion.prompt_index]
        shown = prompt.messages if getattr(prompt, "messages", None) is not None else prompt.text
        extra = columns[index] if columns and index < len(columns) else {}
        turns = getattr(completion, "messages", None)
        rows.append({**extra, "prompt": shown, "completion": completion.text, "reward": float(reward),
                     **({"messages": turns} if turns is not None else {})})
    return rows


def reset_samples(run_dir: Path, through_step: int) -> None:
    """Keep the ``samples.jsonl`` rows of steps <= ``through_step`` (0: a fresh start keeps none)."""
    path = Path(run_dir) / "samples.jsonl"
    if not path.exists():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip() and json.loads(line)["step"] <= through_step]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
