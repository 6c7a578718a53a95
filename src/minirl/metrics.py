"""Metric names and sinks (console progress, ``metrics.jsonl``, TensorBoard, wandb).

One JSON object per global step is appended to ``metrics.jsonl`` in the run directory; row
``step = 0`` holds the evaluation before any RL update. The names are stable:

=============================  ===============================================================
``step``                       global step (1 = after the first rollout and its updates)
``train/reward_mean``          mean reward of the step's rollouts
``train/accuracy``             fraction of rollouts with reward >= 1 (correct, binary verifiers)
``train/response_length``      mean completion length in tokens (``..._max``: the longest)
``train/truncated_frac``       fraction of completions stopped by ``max_new_tokens``
``train/solved_groups_frac``   fraction of groups whose rewards all equal (zero advantage)
``train/entropy``              token-mean full-vocabulary entropy of pi_old at rollout prefixes
``mismatch/kl_k1``             training–inference KL(mu_old || pi_old), sampled-token k1 estimator
``mismatch/kl_k3``             the same KL, k3 estimator (non-negative, lower variance)
``mismatch/abs_dlogp_mean``    mean |log mu_old - log pi_old| (``..._max``: the largest)
``policy/*``                   the objective's metrics (clip fractions by advantage sign, IS
                               weight mean/max, truncated-IS fraction), mean over the N updates
``policy/loss``                loss, mean over the N updates
``optim/grad_norm``            gradient norm before clipping (mean over updates; ``_max``)
``optim/lr``                   learning rate of the last update
``faults/skipped_updates``     updates of the step skipped for a non-finite log-prob, loss or
                               gradient (no optimizer step; ``optim.max_consecutive_faults`` in a
                               row stop the run with exit code 3)
``time/{rollout,old_logprobs,update,sync,step}_s``  wall time per phase (``old_logprobs`` ~0 at
                               N = 1: pi_old comes from the update's forward)
``perf/rollout_tokens_per_s``  generated tokens per second of the rollout phase
``perf/train_tokens_per_s``    trained (prompt + completion) tokens per second of the update phase
``eval/accuracy``              held-out mean@n accuracy (``eval/response_length``)
``routing/train_infer_*``      MoE models (``moe.routing_metrics``), over fed positions: ``diff_frac``
                               fraction of (token, MoE layer) top-k *sets* the engine chose
                               differently from the trainer's natural routing at theta_old (under
                               R3: each router's own choice, captured while the engine's routes
                               are replayed); ``diff_frac_layer{i}`` the same per MoE layer;
                               ``diff_any_layer_frac`` fraction of tokens with any layer differing
``routing/r2_drift_*``         R2 only: ``mb{i}`` fraction of (fed token, layer) sets where the
                               router's natural choice in update i differs from the replayed
                               theta_old routes (0 at i = 0, where theta = theta_old); ``last``:
                               the same for update N-1
=============================  ===============================================================
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

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
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self.console = Console(stderr=True)
        self._last: dict[str, float] = {}
        self._progress: Progress | None = None
        if console:
            self._progress = Progress(
                TextColumn("[bold]RL"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
            )
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
        if self._progress is not None:
            parts = [
                f"{label} {fmt.format(self._last[key])}" for key, label, fmt in CONSOLE_KEYS if key in self._last
            ]
            self._progress.update(self._task, completed=step, description="  ".join(parts))

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


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
