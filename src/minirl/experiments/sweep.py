"""The resumable sweep: every arm x seed of an experiment directory as a ``minirl train`` subprocess.

``minirl sweep EXPERIMENT_DIR --seeds S`` runs each arm x seed (one thread each) in
``RUNS_DIR/<arm>/seed<s>`` with ``run.resume=auto``: an interrupted sweep continues each run from its newest
checkpoint (a run killed before its first checkpoint starts over, so a stop loses at most the runs in
flight), and a finished run (its ``metrics.jsonl`` has a row at the last step) is skipped. Ctrl-C or
SIGTERM stops the runs in flight (SIGTERM, then SIGKILL for any still alive ``STOP_GRACE_S`` later).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from minirl.config import Config, ConfigError, read_config_file
from minirl.experiments.arms import (
    TABLE,
    find_arms,
    global_steps,
    load_arm,
    read_run_config,
    schema_key,
    to_schema,
)
from minirl.experiments.runs import metric_rows

#: ``--quick``: a few steps of the tiny model, so a whole grid finishes in minutes (CI).
QUICK = [
    "model.preset=qwen3-moe-tiny", "task.difficulty=3", "task.num_train_prompts=64", "task.num_eval_prompts=8",
    "rollout.samples_per_prompt=4", "rollout.max_new_tokens=12", "optim.global_steps=3",
    "optim.micro_batch_sequences=8", "eval.num_prompts=4", "eval.samples_per_prompt=2", "eval.every_steps=2",
    "checkpoint.every_steps=2", "cold_start.steps=5", "cold_start.examples=32", "cold_start.batch_sequences=8",
]
QUICK_WIDTH = 64  # every weight input dimension of qwen3-moe-tiny: an fp4 arm's larger blocks shrink to it


def train_config(path: Path, name: str, runs_root: Path) -> Path:
    """The file ``minirl train`` reads for arm ``path``: the arm file itself, or, while the installed schema
    still spells a renamed key the old way (before the ``optim.global_steps`` rename lands), a copy under
    ``RUNS_DIR/_arms`` with those keys spelled as the schema spells them."""
    data = read_config_file(path)
    if to_schema(data) == data:
        return path
    copy = runs_root / "_arms" / f"{name}.yaml"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(yaml.safe_dump(to_schema(data), sort_keys=False), encoding="utf-8")
    return copy


def _last_step(run_dir: Path) -> int:
    rows = metric_rows(run_dir)
    return int(rows[-1]["step"]) if rows else 0


def find_latest_step(run_dir: Path) -> int:
    from minirl.checkpoint import find_latest

    found = find_latest(run_dir)
    return int(found[1]["step"]) if found else 0


def is_finished(run_dir: Path, steps: int) -> bool:
    """The run logged its last step (whose row carries the final evaluation). Checkpoints are not
    needed: a committed result (``config.yaml`` + ``metrics.jsonl``) counts as finished, so a sweep
    pointed at ``results/`` continues only what is missing."""
    return _last_step(run_dir) >= steps


#: config keys that do not change what a finished run measured
NOT_RESULT_KEYS = ("run.", "log.", "checkpoint.", "cluster.", "cold_start.cache_dir", "cold_start.output",
                   "optim.steps", "optim.global_steps", "task.reward_workers", "task.reward_timeout_s")


def stale_keys(run_dir: Path, cfg: Config) -> list[str]:
    """Keys in which the finished run's ``config.yaml`` differs from ``cfg`` (its arm now)."""
    from minirl.checkpoint import config_differences

    path = run_dir / "config.yaml"
    if not path.is_file():
        return []
    try:
        saved = read_run_config(path).model_dump(mode="json")  # a run made before a key rename still reads
    except ConfigError as exc:
        return [f"unreadable config.yaml: {exc}"]
    return config_differences(saved, cfg.model_dump(mode="json"), ignore=NOT_RESULT_KEYS, label="run")


def sweep(exp_dir: Path, seeds: list[int], *, runs_root: Path = Path("runs/sweeps"), quick: bool = False,
          jobs: int = 1, patterns: list[str] | None = None, device: str | None = None, log=print) -> int:
    """Run every arm x seed; returns the number of failed runs. ``device``: ``cluster.device`` for every
    run (a runtime choice, not part of an arm: a study's GPU runs form their own comparison)."""
    from minirl.checkpoint import find_latest

    arms = find_arms(exp_dir, patterns)
    if not arms:
        raise ConfigError(f"{exp_dir}: no arm configs{' match ' + ','.join(patterns) if patterns else ''}")
    if (exp_dir / TABLE).is_file():  # the runs carry their study's table: `minirl report RUNS_DIR` reads it
        runs_root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(exp_dir / TABLE, runs_root / TABLE)
    todo = []
    for seed in seeds:  # seed-major: a sweep stopped part-way has every arm at its first seeds
        for name, path in arms:
            run_dir = runs_root / name / f"seed{seed}"
            overrides = [*(QUICK if quick else []), f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
                         f"run.seed={seed}", "run.resume=auto", "run.threads=1", "log.console=false",
                         f"cold_start.cache_dir={runs_root / '_sft_cache'}",  # one SFT per distinct cold start
                         *([f"cluster.device={device}"] if device else [])]
            if quick:  # keep the arm's N with fewer prompts: 2 prompts per mini-batch
                full = load_arm(path)
                overrides.append(f"rollout.prompts_per_step={2 * full.optim.minibatches_per_step}")
                if full.diagnostics.every_steps:  # the stress study's diagnostics, within the few quick steps
                    overrides.append("diagnostics.every_steps=1")
                if full.rollout.precision == "fp4_e2m1" and full.rollout.fp4_block_size > QUICK_WIDTH:
                    overrides.append(f"rollout.fp4_block_size={QUICK_WIDTH}")  # blocks must divide the tiny model's width
            cfg = load_arm(path, overrides)  # validates before anything runs
            steps = global_steps(cfg)
            if is_finished(run_dir, steps):
                stale = stale_keys(run_dir, cfg)
                log(f"skip {name} seed{seed}: finished ({steps} steps)" + (
                    f", but under another config ({', '.join(stale)}): delete {run_dir} to run it again" if stale else ""))
                continue
            if find_latest(run_dir) is None:  # nothing to resume (killed before its first checkpoint): start over
                overrides.append("run.overwrite=true")
            todo.append((name, seed, train_config(path, name, runs_root),
                         [f"{schema_key(k)}={v}" for k, _, v in (o.partition("=") for o in overrides)], run_dir, steps))
    log(f"sweep: {len(todo)} run(s) to do, {jobs} at a time")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    running: list[tuple[subprocess.Popen, tuple, float, Any]] = []
    done_times: list[float] = []
    started = time.monotonic()
    queue = list(todo)
    # a scheduler's SIGTERM (or a session ending) must stop the runs too, not orphan them: raise, as Ctrl-C does
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if on_main_thread else None
    try:
        failed = _drive(queue, running, jobs, env, done_times, started, log)
    finally:  # interrupted: stop our own runs (each resumes from its last checkpoint next time)
        stop_runs(running, log)
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)
    log(f"sweep: finished in {time.monotonic() - started:.0f}s, {failed} failed")
    return failed


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


#: seconds a run has, after the sweep's SIGTERM, to stop (write its metrics, stop its workers) before SIGKILL
STOP_GRACE_S = 30.0


def stop_runs(running: list, log, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every run still going, then SIGKILL each that has not exited ``grace_s`` later (a run
    killed part-way resumes from its last complete checkpoint: an unfinished one stays a ``.tmp-*``).
    The sweep always ends: a second SIGTERM or Ctrl-C meanwhile kills the rest at once instead of
    leaving them orphaned."""
    asked = time.monotonic()
    deadline = [asked + grace_s]

    def hurry(signum: int, frame: Any) -> None:
        deadline[0] = time.monotonic()

    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = {n: signal.signal(n, hurry) for n in (signal.SIGTERM, signal.SIGINT)} if on_main_thread else {}
    try:
        for proc, *_ in running:
            if proc.poll() is None:
                proc.terminate()
        for proc, (name, seed, *_), _, out, _ in running:
            while proc.poll() is None and time.monotonic() < deadline[0]:
                time.sleep(0.05)
            if proc.poll() is None:
                waited = time.monotonic() - asked
                proc.send_signal(signal.SIGUSR1)  # `minirl train` writes where it is stuck to its sweep.log
                time.sleep(0.5)
                proc.kill()
                proc.wait()
                log(f"kill  {name} seed{seed}: not stopped {waited:.0f}s after SIGTERM (its stacks are at the end of "
                    "its sweep.log; it resumes from its last complete checkpoint)")
            out.close()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _drive(queue: list, running: list, jobs: int, env: dict, done_times: list, started: float, log) -> int:
    failed = 0
    last_print = 0.0
    while queue or running:
        while queue and len(running) < jobs:
            item = queue.pop(0)
            name, seed, path, overrides, run_dir, steps = item
            run_dir.mkdir(parents=True, exist_ok=True)
            out = open(run_dir / "sweep.log", "a", encoding="utf-8")  # closed when the run ends
            proc = subprocess.Popen([sys.executable, "-m", "minirl.cli", "train", str(path), *overrides],
                                    stdout=out, stderr=subprocess.STDOUT, env=env)
            log(f"start {name} seed{seed} ({steps} steps) -> {run_dir}")
            running.append((proc, item, time.monotonic(), out, find_latest_step(run_dir)))  # resumes from here
        time.sleep(0.5)
        for entry in list(running):
            proc, (name, seed, _, _, run_dir, steps), t0, out, _ = entry
            if proc.poll() is None:
                continue
            out.close()
            running.remove(entry)
            done_times.append(time.monotonic() - t0)
            if proc.returncode == 0:
                log(f"done  {name} seed{seed} in {done_times[-1]:.0f}s")
            else:
                failed += 1
                log(f"FAIL  {name} seed{seed}: exit {proc.returncode}, see {run_dir / 'sweep.log'}")
        now = time.monotonic()
        if running and now - last_print >= 10:
            last_print = now
            etas, elapsed = [], []
            for _, (name, seed, _, _, run_dir, steps), t0, _, step0 in running:
                step = _last_step(run_dir)
                eta = (now - t0) / (step - step0) * (steps - step) if step > step0 else None
                etas.append(eta)
                elapsed.append(now - t0)
                log(f"  {name} seed{seed}: step {step}/{steps}" + (f", ETA {eta:.0f}s" if eta is not None else ""))
            eta = sweep_eta(etas, elapsed, done_times, len(queue), jobs)
            if eta is not None:
                log(f"  sweep ETA ~{eta:.0f}s ({len(queue)} queued, elapsed {now - started:.0f}s)")
    return failed


def sweep_eta(etas: list[float | None], elapsed: list[float], done_times: list[float], queued: int,
              jobs: int) -> float | None:
    """Seconds until a sweep ends: each running run's own ETA (``etas``; None before its first step),
    then the ``queued`` runs, each taking the mean time of the finished runs (before any has finished:
    the running runs' projected totals, elapsed + ETA), each started on the ``jobs`` slot that frees
    first. None while nothing tells a run's length."""
    totals = [t + e for t, e in zip(elapsed, etas) if e is not None]
    per_run = statistics.mean(done_times) if done_times else statistics.mean(totals) if totals else None
    if per_run is None:
        return None
    slots = [eta if eta is not None else max(per_run - t, 0.0) for eta, t in zip(etas, elapsed)]
    slots += [0.0] * max(jobs - len(slots), 0)
    for _ in range(queued):
        slots.sort()
        slots[0] += per_run
    return max(slots)


