"""The paper's experiments in miniature: arm configs, a resumable sweep, plots and a report.

Arms. ``experiments/base.yaml`` is the shared, fully pinned base. Each arm is ``ARMS[name] =
(setting, overrides)``; ``python -m minirl.experiments generate`` writes ``experiments/<name>.yaml``
as a *complete* config (the base with the arm's dotted overrides applied, validated by the normal
schema, every key written out) under a header naming the base and the overrides, so every arm file
is an ordinary config (``minirl train experiments/n2/minirl_r2.yaml``). ``load_arm(path)`` loads one;
``generate(check=True)`` verifies the committed files are exactly what the generator writes.

The mini-batch is the same in every arm (8 prompts x 8 samples = 64 responses per gradient update);
off-policy arms raise the global batch: ``rollout.prompts_per_step = 8 N`` with
``optim.minibatches_per_step = N`` (the paper's gbs = N x mbs). Step counts in the base (``optim.steps``,
``eval.every_steps``, ``checkpoint.every_steps``) are gradient steps: an arm with N runs 1/N as many
global steps, so every arm makes the same number of updates on the same number of samples.

Sweep. ``minirl sweep EXPERIMENT_DIR --seeds S`` runs every arm x seed as a ``minirl train``
subprocess (one thread each) in ``runs/sweeps/<arm>/seed<s>`` with ``run.resume=auto``: an
interrupted sweep continues each run from its newest checkpoint (a run killed before its first
checkpoint starts over), and a finished run (metrics and checkpoint at the last step) is skipped.

Plot / report. ``minirl plot RUNS_DIR`` and ``minirl report RUNS_DIR`` read run directories only
(``config.yaml`` and ``metrics.jsonl``); the setting of a run is the first path component of its arm
(``onpolicy``, ``n2``, ``n4``, ``n8``, ``coldstart``). The x-axis is gradient steps (global step x N).
*Steps to collapse*: the first gradient step after the peak from which the held-out score stays
below 50 % of its peak until the end of the run ("never" in the tables if it does not).
*Deepest drop*: the largest fall of the held-out score below its running peak (the best score so
far), as a fraction of that peak, and where it happened; a drop of 50 % or more that the run then
recovers from is a collapse the "stays there" definition does not count (a *recovered dip*).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from minirl.config import Config, ConfigError, _read_file, apply_override, load_config

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
BASE = "base.yaml"
MB_PROMPTS = 8  # prompts per gradient update (x samples_per_prompt = 64 responses), fixed in every arm


def _offpolicy(n: int, *, clip: bool, replay: str) -> dict[str, Any]:
    return {"rollout.prompts_per_step": MB_PROMPTS * n, "optim.minibatches_per_step": n,
            "algo.clip": clip, "algo.is_correction": True, "algo.aggregation": "seq_sum", "moe.routing_replay": replay}


def _onpolicy(*, aggregation: str = "seq_sum", is_correction: bool = True, replay: str = "none") -> dict[str, Any]:
    return {"rollout.prompts_per_step": MB_PROMPTS, "optim.minibatches_per_step": 1, "algo.clip": True,
            "algo.is_correction": is_correction, "algo.aggregation": aggregation, "moe.routing_replay": replay}


#: arm name (= path under experiments/ without .yaml) -> (paper figure, legend, overrides)
ARMS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "onpolicy/minirl": ("Fig. 1", "MiniRL", _onpolicy()),
    "onpolicy/minirl_lennorm": ("Fig. 1", "MiniRL + length-norm", _onpolicy(aggregation="seq_mean")),
    "onpolicy/minirl_no_is": ("Fig. 1", "MiniRL w/o train-infer-IS", _onpolicy(is_correction=False)),
    "onpolicy/minirl_r3": ("Fig. 1", "MiniRL + R3", _onpolicy(replay="R3")),
    "onpolicy/minirl_r3_lennorm": ("Fig. 1", "MiniRL + R3 + length-norm", _onpolicy(aggregation="seq_mean", replay="R3")),
    "onpolicy/minirl_r3_no_is": ("Fig. 1", "MiniRL + R3 w/o train-infer-IS", _onpolicy(is_correction=False, replay="R3")),
}
for _n, _fig in ((2, "Fig. 2"), (4, "Fig. 3"), (8, "Fig. 4")):
    if _n != 8:
        ARMS[f"n{_n}/minirl_noclip"] = (_fig, "MiniRL (no clipping)", _offpolicy(_n, clip=False, replay="none"))
    ARMS[f"n{_n}/minirl_r2_noclip"] = (_fig, "MiniRL + R2 (no clipping)", _offpolicy(_n, clip=False, replay="R2"))
    ARMS[f"n{_n}/minirl_r2"] = (_fig, "MiniRL + R2", _offpolicy(_n, clip=True, replay="R2"))
    ARMS[f"n{_n}/minirl_r3"] = (_fig, "MiniRL + R3", _offpolicy(_n, clip=True, replay="R3"))
#: room for the longest teacher style (verbose: ~77 characters at difficulty 12), the same for all three styles
COLD_START_MAX_NEW_TOKENS = 96
#: Every style is fitted to the same SFT loss, not for the same number of steps: 400 steps left 'stepwise'
#: inside its loss drop (0.33 nats/token, held-out 0.000, so RL got no reward), while a probe of 800 steps
#: reached 0.0002 and held-out 0.988. 0.02 is about where 'direct' ends its 400 steps in the base (0.016).
COLD_START_FIT = {"cold_start.until_loss": 0.02, "cold_start.steps": 2000}
#: Fitted to the same loss, the styles start RL from different held-out scores (0.84 / 0.63 / 0.65); whether
#: they meet is a question of the horizon, so this comparison runs twice the grid's 128 gradient steps.
COLD_START_GRADIENT_STEPS = 256
for _style in ("direct", "stepwise", "verbose"):
    ARMS[f"coldstart/{_style}"] = ("Fig. 5", f"MiniRL + R2, N=2, cold start '{_style}'", {
        "cold_start.enabled": True, "cold_start.style": _style, **COLD_START_FIT, **_offpolicy(2, clip=True, replay="R2"),
        "rollout.max_new_tokens": COLD_START_MAX_NEW_TOKENS, "optim.steps": COLD_START_GRADIENT_STEPS})

#: The stress study (issue 8, "stress axes"): the arms the paper's theory says are sensitive, under conditions
#: that move one axis away from the base. condition -> (axis, label, overrides applied to the base first).
STRESS_CONDITIONS: dict[str, tuple[str, str, dict[str, Any]]] = {  # most extreme first: a partial sweep says most
    "base": ("all", "base: direct answers, fp8-e4m3 per tensor, lr 3e-4", {}),
    "lr3x": ("step size", "lr 9e-4 (3x)", {"optim.lr": 9e-4}),
    "fp4": ("mismatch", "fp4-e2m1 engine (block 32)", {"rollout.precision": "fp4_e2m1"}),
    "long": ("response length", "stepwise solutions (~57 tokens, 3.3x)", {"cold_start.style": "stepwise", **COLD_START_FIT,
                                                                       "rollout.max_new_tokens": 72}),
    "trace": ("response length", "trace solutions (~210 tokens, 12x)", {"cold_start.style": "trace", **COLD_START_FIT,
                                                                     "rollout.max_new_tokens": 240}),
    "lr2x": ("step size", "lr 6e-4 (2x)", {"optim.lr": 6e-4}),
    "e5m2": ("mismatch", "fp8-e5m2 engine (per tensor)", {"rollout.precision": "fp8_e5m2"}),
}
STRESS_AXES = {"response length": ["base", "long", "trace"], "mismatch": ["base", "e5m2", "fp4"],
               "step size": ["base", "lr2x", "lr3x"]}
STRESS_DIAGNOSTICS_EVERY = 16  # gradient steps, like the held-out eval
#: arm -> (legend, overrides): MiniRL vs w/o IS on-policy; clip / no clip x replay none / R2 / R3 at N = 4, 8
STRESS_ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "onpolicy_minirl": ("MiniRL, N=1", _onpolicy()),
    "onpolicy_minirl_no_is": ("MiniRL w/o train-infer-IS, N=1", _onpolicy(is_correction=False)),
}
for _n in (4, 8):
    for _replay in ("none", "R2", "R3"):
        for _clip in (True, False):
            _arm = f"n{_n}_minirl" + ("" if _replay == "none" else f"_{_replay.lower()}") + ("" if _clip else "_noclip")
            STRESS_ARMS[_arm] = (f"MiniRL{'' if _replay == 'none' else ' + ' + _replay}{'' if _clip else ' (no clipping)'}"
                                 f", N={_n}", _offpolicy(_n, clip=_clip, replay=_replay))
STRESS = "stress"  # experiments/stress/<condition>/<arm>.yaml; `minirl sweep experiments/stress`
#: The cold starts again over twice their horizon (512 gradient steps): at 256 they converge but 'verbose' still ends
#: below 'direct' beyond the seed noise and the long styles' training reward is still rising. The same arm files but
#: for ``optim.steps``, as their own sweep (`minirl sweep experiments/horizon`, 54 min at --jobs 2) so that the main
#: grid keeps to its 2 hours; experiments/horizon/coldstart/<style>.yaml, reported like the grid's cold-start setting.
HORIZON = "horizon"
HORIZON_GRADIENT_STEPS = 2 * COLD_START_GRADIENT_STEPS
#: sub-studies under experiments/ that are swept on their own, not with the main grid
OWN_SWEEPS = (STRESS, HORIZON)

SETTINGS = {"onpolicy": "on-policy (N = 1)", "n2": "off-policy N = 2", "n4": "off-policy N = 4",
            "n8": "off-policy N = 8", "coldstart": "cold start (MiniRL + R2, N = 2)"}

#: ``--quick``: a few steps of the tiny model, so a whole grid finishes in minutes (CI).
QUICK = [
    "model.preset=qwen3-moe-tiny", "task.difficulty=3", "task.num_train_prompts=64", "task.num_eval_prompts=8",
    "rollout.samples_per_prompt=4", "rollout.max_new_tokens=12", "optim.steps=3", "optim.micro_batch_sequences=8",
    "eval.num_prompts=4", "eval.samples_per_prompt=2", "eval.every_steps=2", "checkpoint.every_steps=2",
    "cold_start.steps=5", "cold_start.examples=32", "cold_start.batch_sequences=8",
]


#: counted in gradient steps in base.yaml; an arm with N mini-batches per global step runs 1/N as many global
#: steps (and evaluates/checkpoints every 1/N as many), so every arm gets the same gradient steps and samples
PER_GRADIENT_STEP = ("optim.steps", "eval.every_steps", "checkpoint.every_steps", "diagnostics.every_steps")


def _per_gradient_step(base: dict[str, Any], n: int) -> dict[str, int]:
    """The base's gradient-step counts as global steps of an arm with N = ``n`` (they must divide)."""
    out = {}
    for key in PER_GRADIENT_STEP:
        section, field = key.split(".")
        if field not in base.get(section, {}):
            continue
        value = int(base[section][field])
        if value % n:
            raise ConfigError(f"{BASE}: {key}={value} is counted in gradient steps and must be divisible by N={n}")
        out[key] = value // n
    return out


def _render(name: str, legend: str, overrides: dict[str, Any], root: Path,
            condition: dict[str, Any] | None = None) -> str:
    """The complete config of arm ``name``: the base, then ``condition`` (stress study), then the arm."""
    data = _read_file(root / BASE)
    overrides = {**(condition or {}), **overrides}
    n = int(overrides.get("optim.minibatches_per_step", 1))
    # the base's gradient-step counts, after the condition's and the arm's own (also counted in gradient steps)
    counts = {k: v for k, v in overrides.items() if k in PER_GRADIENT_STEP}
    overrides = {k: v for k, v in overrides.items() if k not in PER_GRADIENT_STEP}
    for pair in _pairs({**(condition or {}), **counts}):
        apply_override(data, pair)
    if n > 1:
        overrides = {**overrides, **_per_gradient_step(data, n)}
    pairs = _pairs(overrides)
    for pair in pairs:
        apply_override(data, pair)
    data.setdefault("run", {})["name"] = name.replace("/", "-")
    cfg = Config.model_validate(data)
    depth = "../" * name.count("/")
    header = [f"# GENERATED by `python -m minirl.experiments generate`; do not edit (edit {BASE} or the arm tables).",
              f"# arm: {name} ({legend})", f"# base: {depth}{BASE}", "# overrides:"]
    header += [f"#   {p}" for p in pairs] + [f"#   run.name={name.replace('/', '-')}"]
    return "\n".join(header) + "\n" + yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def _pairs(overrides: dict[str, Any]) -> list[str]:
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]


def all_arms() -> dict[str, tuple[str, dict[str, Any], dict[str, Any] | None]]:
    """Every generated file: name (path under experiments/) -> (legend, arm overrides, condition overrides)."""
    out: dict[str, tuple[str, dict[str, Any], dict[str, Any] | None]] = {
        name: (legend, overrides, None) for name, (_, legend, overrides) in ARMS.items()}
    for cond, (axis, label, cond_overrides) in STRESS_CONDITIONS.items():
        condition = {**cond_overrides, "diagnostics.every_steps": STRESS_DIAGNOSTICS_EVERY}
        for arm, (legend, overrides) in STRESS_ARMS.items():
            out[f"{STRESS}/{cond}/{arm}"] = (f"{legend}; {axis}: {label}", overrides, condition)
    for name, (_, legend, overrides) in ARMS.items():
        if name.startswith("coldstart/"):
            out[f"{HORIZON}/{name}"] = (f"{legend}, {HORIZON_GRADIENT_STEPS} gradient steps",
                                        {**overrides, "optim.steps": HORIZON_GRADIENT_STEPS}, None)
    return out


def generate(root: Path = EXPERIMENTS, *, check: bool = False) -> list[str]:
    """Write (or with ``check``: compare) every arm file; returns the names that differ/were written."""
    changed = []
    for name, (legend, overrides, condition) in all_arms().items():
        path = root / f"{name}.yaml"
        text = _render(name, legend, overrides, root, condition)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        changed.append(name)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return changed


def load_arm(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """An arm file is a complete config: load it with the normal schema."""
    return load_config(path, overrides)


def find_arms(exp_dir: Path, patterns: list[str] | None = None) -> list[tuple[str, Path]]:
    """(arm name, path) of every arm config under ``exp_dir`` (not the base), filtered by globs."""
    arms = []
    for path in sorted(exp_dir.rglob("*.yaml")):
        if path.name == BASE and path.parent == exp_dir:
            continue
        name = path.relative_to(exp_dir).with_suffix("").as_posix()
        if name.split("/")[0] in OWN_SWEEPS:  # e.g. the stress study is its own sweep: `minirl sweep experiments/stress`
            continue
        if patterns and not any(fnmatch.fnmatch(name, p) for p in patterns):
            continue
        arms.append((name, path))
    # the paper's order (on-policy, N = 2, 4, 8, cold start), the stress conditions most extreme first; others last
    order = list(ARMS) + [name.split("/", 1)[1] for name in all_arms() if name.startswith(f"{STRESS}/")]
    return sorted(arms, key=lambda arm: (order.index(arm[0]) if arm[0] in order else len(order), arm[0]))


# ----------------------------------------------------------------------------- sweep


def _metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def _last_step(run_dir: Path) -> int:
    rows = _metric_rows(run_dir)
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
                   "optim.steps", "task.reward_workers", "task.reward_timeout_s")


def stale_keys(run_dir: Path, cfg: Config) -> list[str]:
    """Keys in which the finished run's ``config.yaml`` differs from ``cfg`` (its arm now)."""
    from minirl.checkpoint import config_differences

    path = run_dir / "config.yaml"
    if not path.is_file():
        return []
    try:
        saved = load_config(path).model_dump(mode="json")
    except ConfigError as exc:
        return [f"unreadable config.yaml: {exc}"]
    return config_differences(saved, cfg.model_dump(mode="json"), ignore=NOT_RESULT_KEYS, label="run")


def sweep(exp_dir: Path, seeds: list[int], *, runs_root: Path = Path("runs/sweeps"), quick: bool = False,
          jobs: int = 1, patterns: list[str] | None = None, log=print) -> int:
    """Run every arm x seed; returns the number of failed runs."""
    from minirl.checkpoint import find_latest

    arms = find_arms(exp_dir, patterns)
    if not arms:
        raise ConfigError(f"{exp_dir}: no arm configs{' match ' + ','.join(patterns) if patterns else ''}")
    todo = []
    for seed in seeds:  # seed-major: a sweep stopped part-way has every arm at its first seeds
        for name, path in arms:
            run_dir = runs_root / name / f"seed{seed}"
            overrides = [*(QUICK if quick else []), f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
                         f"run.seed={seed}", "run.resume=auto", "run.threads=1", "log.console=false",
                         f"cold_start.cache_dir={runs_root / '_sft_cache'}"]  # one SFT per distinct cold start
            if quick:  # keep the arm's N with fewer prompts: 2 prompts per mini-batch
                full = load_arm(path)
                overrides.append(f"rollout.prompts_per_step={2 * full.optim.minibatches_per_step}")
                if full.diagnostics.every_steps:  # the stress study's diagnostics, within the few quick steps
                    overrides.append("diagnostics.every_steps=1")
            cfg = load_arm(path, overrides)  # validates before anything runs
            if is_finished(run_dir, cfg.optim.steps):
                stale = stale_keys(run_dir, cfg)
                log(f"skip {name} seed{seed}: finished ({cfg.optim.steps} steps)" + (
                    f", but under another config ({', '.join(stale)}): delete {run_dir} to run it again" if stale else ""))
                continue
            if find_latest(run_dir) is None:  # nothing to resume (killed before its first checkpoint): start over
                overrides.append("run.overwrite=true")
            todo.append((name, seed, path, overrides, run_dir, cfg.optim.steps))
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
        for proc, *_ in running:
            proc.terminate()
        for proc, *_ in running:
            proc.wait()
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)
    log(f"sweep: finished in {time.monotonic() - started:.0f}s, {failed} failed")
    return failed


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _drive(queue: list, running: list, jobs: int, env: dict, done_times: list, started: float, log) -> int:
    failed = 0
    last_print = 0.0
    while queue or running:
        while queue and len(running) < jobs:
            item = queue.pop(0)
            name, seed, path, overrides, run_dir, steps = item
            run_dir.mkdir(parents=True, exist_ok=True)
            out = open(run_dir / "sweep.log", "a", encoding="utf-8")  # noqa: SIM115 (closed when the run ends)
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


# ----------------------------------------------------------------------------- plot / report


def load_runs(runs_dir: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """setting -> arm -> [run], each run ``{"seed", "n", "rows"}`` from directories holding metrics."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for metrics in sorted(runs_dir.rglob("metrics.jsonl")):
        run_dir = metrics.parent
        rows = _metric_rows(run_dir)
        if not rows:
            continue
        try:
            raw = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
            n = int(raw["optim"]["minibatches_per_step"])
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
            n = 1
        arm = run_dir.parent.relative_to(runs_dir).as_posix() if run_dir.parent != runs_dir else run_dir.name
        setting = arm.split("/")[0] if "/" in arm else ("onpolicy" if n == 1 else f"n{n}")
        out.setdefault(setting, {}).setdefault(arm, []).append({"seed": run_dir.name, "n": n, "rows": rows})
    order = list(SETTINGS)
    return dict(sorted(out.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


def _series(run: dict[str, Any], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in run["rows"]:
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            xs.append(int(row["step"]) * run["n"])
            ys.append(float(value))
    return xs, ys


PANELS = (("eval/accuracy", "held-out score (mean@n)", False), ("mismatch/kl_k3", "training-inference KL (k3)", True),
          ("train/reward_mean", "training reward", False), ("train/entropy", "entropy", False))
#: per-step panels (not the held-out score, logged every few steps) are drawn as a trailing moving
#: mean over this many logged steps: a single step's k3 KL moves over four orders of magnitude
SMOOTH_STEPS = 8


def moving_mean(ys: list[float], window: int) -> list[float]:
    """Trailing mean of ``ys`` over ``window`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


def late_mean(ys: list[float], fraction: float = 0.25) -> float | None:
    """Mean of the last ``fraction`` of ``ys`` (at least one value): a run's "final" level of a noisy series."""
    if not ys:
        return None
    tail = ys[-max(1, round(len(ys) * fraction)):]
    return statistics.mean(tail)
COLD_START_PANELS = (("eval/response_length", "held-out response length (tokens)", False),)  # Fig. 5


def plot(runs_dir: Path, out_dir: Path | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = out_dir or runs_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for setting, arms in load_runs(runs_dir).items():
        panels = PANELS + (COLD_START_PANELS if setting == "coldstart" else ())
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2))
        for ax, (key, title, log_y) in zip(axes, panels):
            for arm, runs in sorted(arms.items()):
                by_x: dict[int, list[float]] = {}
                for run in runs:
                    xs_run, ys_run = _series(run, key)
                    if key != "eval/accuracy" and not key.startswith("eval/"):
                        ys_run = moving_mean(ys_run, SMOOTH_STEPS)
                    for x, y in zip(xs_run, ys_run):
                        by_x.setdefault(x, []).append(y)
                if not by_x:
                    continue
                xs = sorted(by_x)
                mean = [statistics.mean(by_x[x]) for x in xs]
                std = [statistics.pstdev(by_x[x]) for x in xs]
                line, = ax.plot(xs, mean, label=f"{arm.split('/')[-1]} ({len(runs)} seeds)")
                lo = [m - s for m, s in zip(mean, std)]
                if log_y:
                    lo = [max(v, m * 0.1) if m > 0 else v for v, m in zip(lo, mean)]
                ax.fill_between(xs, lo, [m + s for m, s in zip(mean, std)], color=line.get_color(), alpha=0.2)
            ax.set_title(title if key.startswith("eval/") else f"{title}, moving mean of {SMOOTH_STEPS} steps", fontsize=9)
            ax.set_xlabel("gradient steps")
            if log_y and ax.lines and all(min(line.get_ydata()) > 0 for line in ax.lines):
                ax.set_yscale("log")
        axes[0].legend(fontsize=7)
        fig.suptitle(SETTINGS.get(setting, setting))
        fig.tight_layout()
        path = out_dir / f"{setting}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written + plot_stress_axes(runs_dir, out_dir)


#: run-level summaries plotted against each stress axis: (title, function of one run's rows -> value or None)
def _run_mean(key: str):
    def value(rows: list[dict[str, Any]]) -> float | None:
        xs = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return statistics.mean(xs) if xs else None
    return value


def _run_final(key: str):
    def value(rows: list[dict[str, Any]]) -> float | None:
        xs = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return xs[-1] if xs else None
    return value


STRESS_PANELS = (
    ("final held-out score", _run_final("eval/accuracy"), False),
    ("train-infer KL (k3), run mean", _run_mean("mismatch/kl_k3"), True),
    ("grad cosine, surrogate vs Eq. (2), last mini-batch", _run_mean("fidelity/last_grad_cosine"), False),
    ("first-order residual, last mini-batch", _run_mean("residual/last_total_mean"), True),
)


def stress_summary(runs_dir: Path) -> dict[str, dict[str, dict[str, list[float | None]]]]:
    """condition -> arm -> panel title -> [value per seed], from the runs of a stress sweep."""
    out: dict[str, dict[str, dict[str, list[float | None]]]] = {}
    for cond, arms in load_runs(runs_dir).items():
        if cond not in STRESS_CONDITIONS:
            continue
        for arm, runs in arms.items():
            name = arm.split("/", 1)[1]
            out.setdefault(cond, {})[name] = {title: [f(run["rows"]) for run in runs] for title, f, _ in STRESS_PANELS}
    return out


def plot_stress_axes(runs_dir: Path, out_dir: Path) -> list[Path]:
    """One figure per stress axis: each run-level summary against the axis' levels, a line per arm."""
    summary = stress_summary(runs_dir)
    if not summary:
        return []
    import matplotlib.pyplot as plt

    written = []
    for axis, levels in STRESS_AXES.items():
        present = [lvl for lvl in levels if lvl in summary]
        if len(present) < 2:
            continue
        fig, axes = plt.subplots(1, len(STRESS_PANELS), figsize=(5 * len(STRESS_PANELS), 4.6))
        arms = [a for a in STRESS_ARMS if any(a in summary[lvl] for lvl in present)]
        for ax, (title, _, log_y) in zip(axes, STRESS_PANELS):
            for arm in arms:
                xs, ys = [], []
                for i, lvl in enumerate(present):
                    vals = [v for v in summary[lvl].get(arm, {}).get(title, []) if v is not None]
                    if vals:
                        xs.append(i)
                        ys.append(statistics.mean(vals))
                if ys:
                    style = "--" if arm.endswith("_noclip") or arm.endswith("_no_is") else "-"
                    ax.plot(xs, ys, style, marker="o", label=arm)
            ax.set_xticks(range(len(present)), [STRESS_CONDITIONS[lvl][1].split(":")[0] if lvl == "base" else lvl
                                                for lvl in present])
            ax.set_title(title, fontsize=9)
            if log_y and ax.lines and all(min(line.get_ydata()) > 0 for line in ax.lines):
                ax.set_yscale("log")
        axes[0].legend(fontsize=6)
        fig.suptitle(f"stress axis: {axis} (dashed: no clipping / no IS)")
        fig.tight_layout()
        path = out_dir / f"stress_{axis.replace(' ', '_')}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def steps_to_collapse(xs: list[int], ys: list[float]) -> int | None:
    """First x after the peak from which y stays below half the peak until the end (None: never)."""
    if not ys or max(ys) <= 0:
        return None
    peak_i = ys.index(max(ys))
    half = max(ys) / 2
    first = None
    for i in range(len(ys) - 1, peak_i, -1):
        if ys[i] < half:
            first = i
        else:
            break
    return xs[first] if first is not None else None


def _pm(values: list[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def deepest_drop(xs: list[int], ys: list[float]) -> tuple[float, int] | None:
    """(largest (running peak - y) / running peak, the x where it happened); None without a positive score.

    The running peak at x is the best y up to x; a run that never falls below it has (0.0, first x)."""
    best, worst, where = 0.0, 0.0, None
    for x, y in zip(xs, ys):
        best = max(best, y)
        if best > 0 and (where is None or (best - y) / best > worst):
            worst, where = (best - y) / best, x
    return (worst, where) if where is not None else None


#: a fall's entropy is compared with its mean over this many gradient steps up to the peak it fell from
FALL_ENTROPY_REF_STEPS = 16
#: "entropy blow-up": some logged step of the fall has at least this multiple of that reference entropy;
#: "entropy drop": the trailing mean over SMOOTH_STEPS gradient steps falls to at most this fraction of it
BLOWUP_FACTOR, ENTROPY_DROP_FRACTION = 1.5, 1 / 1.5


def fall_entropy(run: dict[str, Any], peak_step: int, drop_step: int) -> dict[str, Any] | None:
    """How the training entropy moved during a fall from the held-out peak at gradient step ``peak_step`` to the
    low at ``drop_step`` (entropy is logged once per global step, i.e. every N gradient steps).

    ``ref``: mean entropy over the FALL_ENTROPY_REF_STEPS gradient steps up to the peak (the first ones when the
    peak is the start); ``max``: the largest logged value in (peak, low]; ``min``: the smallest trailing mean over
    SMOOTH_STEPS gradient steps there (one low step is noise); ``kind``: "blow-up" (max >= BLOWUP_FACTOR x ref),
    "drop" (min <= ENTROPY_DROP_FRACTION x ref), both, or "neither". None without entropy logged in the fall."""
    xs, ys = _series(run, "train/entropy")
    if not xs:
        return None
    lo = max(peak_step, xs[0])  # the peak may be the start, before any training step
    before = [y for x, y in zip(xs, ys) if lo - FALL_ENTROPY_REF_STEPS < x <= lo]
    smooth = moving_mean(ys, max(1, SMOOTH_STEPS // run["n"]))
    fall = [(y, m) for x, y, m in zip(xs, ys, smooth) if peak_step < x <= drop_step]
    if not before or not fall:
        return None
    ref = statistics.mean(before)
    top, low = max(y for y, _ in fall), min(m for _, m in fall)
    kinds = [k for k, hit in (("blow-up", top >= BLOWUP_FACTOR * ref), ("drop", low <= ENTROPY_DROP_FRACTION * ref)) if hit]
    return {"ref": ref, "max": top, "min": low, "kind": " and ".join(kinds) or "neither"}


def run_fall(run: dict[str, Any]) -> dict[str, Any] | None:
    """The deepest fall of a run's held-out score below its running peak: ``drop`` (fraction, gradient step),
    the peak it fell from (``peak_i`` into the evaluations, ``peak_step``), ``stays`` (the collapse step of
    steps_to_collapse, None if it came back) and ``entropy`` (fall_entropy). None without a positive score."""
    xs, ys = _series(run, "eval/accuracy")
    drop = deepest_drop(xs, ys)
    if drop is None:
        return None
    peak_i = max((i for i, x in enumerate(xs) if x <= drop[1]), key=ys.__getitem__)
    return {"drop": drop, "peak_i": peak_i, "peak_step": xs[peak_i], "stays": steps_to_collapse(xs, ys),
            "entropy": fall_entropy(run, xs[peak_i], drop[1]), "ys": ys}


def _entropy_word(entropy: dict[str, Any] | None) -> str:
    if entropy is None:
        return "entropy not logged"
    return {"neither": f"entropy within ×{BLOWUP_FACTOR:g}"}.get(entropy["kind"], f"entropy {entropy['kind']}")


def falls_section(runs: dict[str, dict[str, list[dict[str, Any]]]], threshold: float = 0.5) -> list[str]:
    """Markdown: every run whose held-out score fell at least ``threshold`` below its running peak, with whether
    it stayed down, how its entropy moved (blow-up or drop) and its largest train-infer KL during the fall."""
    rows = []
    for setting, arms in runs.items():
        for arm, arm_runs in sorted(arms.items()):
            for run in arm_runs:
                fall = run_fall(run)
                if fall is None or fall["drop"][0] < threshold:
                    continue
                drop, peak_i, peak_step, stays, ent = (fall[k] for k in ("drop", "peak_i", "peak_step", "stays", "entropy"))
                ys = fall["ys"]
                kx, ky = _series(run, "mismatch/kl_k3")
                kl_fall = [(y, x) for x, y in zip(kx, ky) if peak_step < x <= drop[1]]
                kl = f"{max(kl_fall)[0]:.1e} at {max(kl_fall)[1]}" if kl_fall else "—"
                entropy = ("—" if ent is None else
                           f"{ent['ref']:.3f} → max {ent['max']:.3f} ({ent['max'] / ent['ref']:.2f}×) / min "
                           f"{ent['min']:.3f} ({ent['min'] / ent['ref']:.2f}×): {ent['kind']}")
                rows.append(f"| {arm} | {run['seed']} | {ys[0]:.3f} → {ys[peak_i]:.3f} at {peak_step} → {ys[-1]:.3f} "
                            f"| {_drop_cell(drop)} | {'stayed (from ' + str(stays) + ')' if stays is not None else 'recovered'} "
                            f"| {entropy} | {kl} |")
    lines = [f"## Falls: runs whose held-out score fell {threshold:.0%} or more below its running peak", ""]
    if not rows:
        return lines + [f"No run fell {threshold:.0%} below its running peak.", ""]
    return lines + [
        "Per run: held-out score at the start → the running peak it fell from (gradient step) → the end; the "
        "deepest drop; whether it stayed below half the overall peak to the end (the tables' collapse) or came back; "
        f"the training entropy: its mean over the {FALL_ENTROPY_REF_STEPS} gradient steps up to that peak (the first ones "
        f"when the peak is the start) → the largest logged value from the peak to the low / the smallest "
        f"{SMOOTH_STEPS}-gradient-step mean there, called a blow-up at ≥ {BLOWUP_FACTOR:g}× and a drop at ≤ "
        f"{ENTROPY_DROP_FRACTION:.2f}× the first; the largest train-infer KL (k3) from the peak to the low.", "",
        "| arm | seed | held-out: start → peak → final | deepest drop | stayed down? | entropy around the fall "
        "| largest KL (k3) in the fall |",
        "|---|---|---|---|---|---|---|", *rows, ""]


def _drop_cell(drop: tuple[float, int] | None) -> str:
    return "—" if drop is None else f"{drop[0]:.0%} at {drop[1]}" if drop[0] > 0 else "0%"


def report(runs_dir: Path, out: Path | None = None) -> Path:
    legend = ("Held-out score = `eval/accuracy` (mean ± std over seeds). Steps are gradient steps (global step × N). "
              "Collapse: the held-out score falls below 50 % of its peak and stays there until the end "
              "(per seed; 'never' if it did not), with how the training entropy moved in the fall: a blow-up or a drop "
              f"(≥ {BLOWUP_FACTOR:g}× or ≤ 1/{1 / ENTROPY_DROP_FRACTION:g} of its level at the peak; see 'Falls'). Deepest drop: the largest fall below the running peak (best score so far), "
              "as a fraction of it, and its step, per seed (a fall of 50 % or more the run recovers from is a collapse "
              "the first definition does not count). Final KL = mean `mismatch/kl_k3` over the last 25 % of the run's steps (one step's value is too noisy). Grad cosine and residual: run means of "
              "`fidelity/last_grad_cosine` and `residual/last_total_mean` (only where `diagnostics.every_steps` > 0).")
    lines = [f"# Report: {runs_dir}", "", legend, ""]
    loaded = load_runs(runs_dir)  # read every run's metrics once
    for setting, arms in loaded.items():
        lines += [f"## {SETTINGS.get(setting, setting)}", "",
                  "| arm | seeds | gradient steps | peak held-out | final held-out | steps to collapse | deepest drop "
                  "| final KL (k3, last 25 %) | grad cosine (last mb) | residual (last mb) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for arm, runs in sorted(arms.items()):
            peaks, finals, collapses, drops, kls, steps = [], [], [], [], [], []
            for run in runs:
                xs, ys = _series(run, "eval/accuracy")
                if ys:
                    peaks.append(max(ys))
                    finals.append(ys[-1])
                    fall = run_fall(run)  # None exactly when deepest_drop is
                    collapses.append("never" if fall is None or fall["stays"] is None else
                                     f"{fall['stays']} ({_entropy_word(fall['entropy'])})")
                    drops.append(_drop_cell(fall["drop"] if fall else None))
                _, ky = _series(run, "mismatch/kl_k3")
                if ky:
                    kls.append(late_mean(ky))
                steps.append(int(run["rows"][-1]["step"]) * run["n"])
            collapse = ", ".join(collapses) or "—"
            cosines = [v for v in (_run_mean("fidelity/last_grad_cosine")(run["rows"]) for run in runs) if v is not None]
            residuals = [v for v in (_run_mean("residual/last_total_mean")(run["rows"]) for run in runs) if v is not None]
            lines.append(f"| {arm} | {len(runs)} | {max(steps)} | {_pm(peaks)} | {_pm(finals)} | {collapse} | "
                         f"{', '.join(drops) or '—'} | "
                         f"{_pm(kls, '{:.2e}')} | {_pm(cosines, '{:.4f}')} | {_pm(residuals, '{:.2e}')} |")
        dead = [arm for arm, runs in sorted(arms.items()) if runs and all(_run_stats(run)["peak"] == 0 for run in runs)]
        if dead:
            lines += ["", f"**No learning signal:** {', '.join(dead)} never scored above 0 on the held-out set, so every "
                      "group's reward was (nearly) all zero and RL had nothing to learn from; check the cold start "
                      "before reading these rows."]
        lines.append("")
    lines += claims_section(loaded)
    lines += stress_section(loaded)
    lines += falls_section(loaded)
    out = out or runs_dir / "REPORT.md"
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m minirl.experiments")
    parser.add_argument("action", choices=["generate", "check"])
    parser.add_argument("--dir", default=str(EXPERIMENTS))
    args = parser.parse_args(argv)
    changed = generate(Path(args.dir), check=args.action == "check")
    if args.action == "check":
        print("up to date" if not changed else f"out of date: {', '.join(changed)}")
        return 1 if changed else 0
    print(f"wrote {len(changed)} arm file(s)" + (f": {', '.join(changed)}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ----------------------------------------------------------------------------- claims

#: A difference counts when it exceeds this many standard errors (seed-to-seed noise); "comparable" means the
#: difference is within the noise AND within COMPARABLE_ABS of held-out accuracy.
NOISE_SE = 2.0
COMPARABLE_ABS = 0.03


def _run_stats(run: dict[str, Any]) -> dict[str, float | bool | None]:
    xs, ys = _series(run, "eval/accuracy")
    _, kl = _series(run, "mismatch/kl_k3")
    _, ent = _series(run, "train/entropy")
    _, reward = _series(run, "train/reward_mean")
    return {"peak": max(ys) if ys else None, "final": ys[-1] if ys else None, "start": ys[0] if ys else None,
            "late_reward": late_mean(reward), "late_entropy": late_mean(ent),
            "collapsed": steps_to_collapse(xs, ys) is not None if ys else None,
            "dipped": (drop := deepest_drop(xs, ys)) is not None and drop[0] >= 0.5,
            "kl": statistics.mean(kl) if kl else None,
            "entropy_change": (statistics.mean(ent[-5:]) - statistics.mean(ent[:5])) if len(ent) >= 10 else None}


def _values(arms: dict[str, list[dict[str, Any]]], arm: str, key: str) -> list[float]:
    return [v for v in (_run_stats(run)[key] for run in arms.get(arm, [])) if v is not None]


def _diff(a: list[float], b: list[float]) -> tuple[float, float] | None:
    """(mean(a) - mean(b), standard error of that difference); None without data."""
    if not a or not b:
        return None
    var = lambda xs: statistics.variance(xs) if len(xs) > 1 else 0.0  # noqa: E731
    return statistics.mean(a) - statistics.mean(b), math.sqrt(var(a) / len(a) + var(b) / len(b))


def _greater(arms: dict, a: str, b: str, key: str = "final") -> tuple[str, str]:
    """Verdict on "a > b" in ``key``: supports / contradicts (beyond NOISE_SE standard errors) / cannot tell."""
    d = _diff(_values(arms, a, key), _values(arms, b, key))
    if d is None:
        return "not run", f"{a} or {b} has no runs"
    diff, se = d
    fmt = "{:+.2e}" if key == "kl" else "{:+.3f}"
    numbers = f"{key} {a} − {b} = {fmt.format(diff)} (SE {fmt.format(se)[1:]}, seeds {len(arms[a])}/{len(arms[b])})"
    if min(len(arms[a]), len(arms[b])) < 2:
        return "cannot tell (1 seed)", numbers
    if abs(diff) <= NOISE_SE * se:
        return "cannot tell", numbers
    return ("supports" if diff > 0 else "contradicts"), numbers


def _comparable(arms: dict, a: str, b: str, key: str) -> tuple[str, str]:
    d = _diff(_values(arms, a, key), _values(arms, b, key))
    if d is None:
        return "not run", f"{a} or {b} has no runs"
    diff, se = d
    numbers = f"{key} {a} − {b} = {diff:+.3f} (SE {se:.3f}, seeds {len(arms[a])}/{len(arms[b])})"
    if min(len(arms[a]), len(arms[b])) < 2:
        return "cannot tell (1 seed)", numbers
    if abs(diff) <= COMPARABLE_ABS and abs(diff) <= max(NOISE_SE * se, COMPARABLE_ABS):
        return "supports", numbers
    return ("contradicts" if abs(diff) > NOISE_SE * se else "cannot tell"), numbers


def _collapses(arms: dict, arm: str, reference: str) -> tuple[str, str]:
    """Verdict on "arm collapses and reference does not" (collapse per seed as in the tables)."""
    got, ref = _values(arms, arm, "collapsed"), _values(arms, reference, "collapsed")
    if not got or not ref:
        return "not run", f"{arm} or {reference} has no runs"
    ent = _values(arms, arm, "entropy_change")
    horizon = max(int(run["rows"][-1]["step"]) * run["n"] for run in arms[arm])
    numbers = (f"{arm} collapsed in {sum(got)}/{len(got)} seeds, {reference} in {sum(ref)}/{len(ref)}, "
               f"within {horizon} gradient steps"
               + (f"; entropy change over the run {statistics.mean(ent):+.3f}" if ent else ""))
    if min(len(got), len(ref)) < 2:
        return "cannot tell (1 seed)", numbers
    if sum(got) * 2 > len(got) and sum(ref) * 2 < len(ref):
        return "supports", numbers
    if sum(got) == 0:
        return "contradicts", numbers
    return "cannot tell", numbers


def _flat(runs: dict[str, dict[str, list]]) -> dict[str, list]:
    return {arm: rs for arms in runs.values() for arm, rs in arms.items()}


#: (paper source, claim, [(check, arm a, arm b, key)]); check in greater / comparable / collapses
CLAIMS: list[tuple[str, str, list[tuple[str, str, str, str]]]] = [
    ("§6.5 (1), §6.1", "On-policy, MiniRL (PG + IS correction) is the most stable and best", [
        ("greater", "onpolicy/minirl", arm, "final") for arm in (
            "onpolicy/minirl_lennorm", "onpolicy/minirl_no_is", "onpolicy/minirl_r3", "onpolicy/minirl_r3_lennorm",
            "onpolicy/minirl_r3_no_is")]),
    ("§6.1", "Without the training–inference IS correction, training collapses rapidly (with an entropy drop)", [
        ("collapses", "onpolicy/minirl_no_is", "onpolicy/minirl", ""),
        ("collapses", "onpolicy/minirl_r3_no_is", "onpolicy/minirl_r3", "")]),
    ("§6.1", "Length normalisation is suboptimal but stays stable", [
        ("greater", "onpolicy/minirl", "onpolicy/minirl_lennorm", "final"),
        ("comparable", "onpolicy/minirl_lennorm", "onpolicy/minirl_lennorm", "collapsed")]),
    ("§2.6, §6.1", "On-policy, R3 lowers the training–inference KL but gives no gain", [
        ("greater", "onpolicy/minirl", "onpolicy/minirl_r3", "kl"),
        ("greater", "onpolicy/minirl", "onpolicy/minirl_r3", "final")]),
    ("§6.5 (2), §2.6", "Off-policy, dropping clipping causes premature collapse (N = 2, 4, 8)", [
        ("collapses", "n2/minirl_noclip", "n2/minirl_r2", ""), ("collapses", "n2/minirl_r2_noclip", "n2/minirl_r2", ""),
        ("collapses", "n4/minirl_noclip", "n4/minirl_r3", ""), ("collapses", "n4/minirl_r2_noclip", "n4/minirl_r3", ""),
        ("collapses", "n8/minirl_r2_noclip", "n8/minirl_r3", "")]),
    ("§6.5 (2), §2.6", "Off-policy, routing replay helps when unclipped (R2 no-clip vs no replay no-clip)", [
        ("greater", "n2/minirl_r2_noclip", "n2/minirl_noclip", "peak"),
        ("greater", "n4/minirl_r2_noclip", "n4/minirl_noclip", "peak")]),
    ("§2.6, §6.2", "At N = 2, R2 beats R3", [("greater", "n2/minirl_r2", "n2/minirl_r3", "peak")]),
    ("§2.6, §6.2", "At N = 4 and 8, R3 beats R2 and R2 does not stay stable", [
        ("greater", "n4/minirl_r3", "n4/minirl_r2", "peak"), ("greater", "n8/minirl_r3", "n8/minirl_r2", "peak"),
        ("collapses", "n4/minirl_r2", "n4/minirl_r3", ""), ("collapses", "n8/minirl_r2", "n8/minirl_r3", "")]),
    ("§6.2 summary", "Once stable, on- and off-policy runs reach similar peaks", [
        ("comparable", "n2/minirl_r2", "onpolicy/minirl", "peak"), ("comparable", "n4/minirl_r3", "onpolicy/minirl", "peak"),
        ("comparable", "n8/minirl_r3", "onpolicy/minirl", "peak")]),
    ("§6.5 (3), §6.4", "Different cold starts reach comparable final performance", [
        ("comparable", "coldstart/stepwise", "coldstart/direct", "final"),
        ("comparable", "coldstart/verbose", "coldstart/direct", "final")]),
]


def claims_section(runs: dict[str, dict[str, list]]) -> list[str]:
    """Markdown: each of the paper's claims, each check's verdict with the numbers that decide it."""
    arms = _flat(runs)
    if not any(arm in arms for _, _, checks in CLAIMS for _, a, b, _ in checks for arm in (a, b)):
        return []
    lines = ["## The paper's claims, checked", "",
             f"Verdicts: *supports* / *contradicts* when the difference exceeds {NOISE_SE:g} standard errors of the "
             f"seed-to-seed noise (and, for *comparable*, is within {COMPARABLE_ABS} held-out accuracy); else "
             "*cannot tell*. Collapse checks need a majority of seeds collapsing and the reference arm not.", "",
             "| source | claim | check | verdict | numbers |", "|---|---|---|---|---|"]
    checks_fn = {"greater": _greater, "comparable": _comparable}
    unchecked = []  # a partial sweep (e.g. experiments/horizon) runs few arms: one line, not a row per check
    for source, claim, checks in CLAIMS:
        ran = [check for check in checks if check[1] in arms and check[2] in arms]
        missing = [f"{check[1]} vs {check[2]}" if check[1] != check[2] else check[1] for check in checks if check not in ran]
        unchecked += [f"{claim} ({source})"] if not ran else missing
        for i, (kind, a, b, key) in enumerate(ran):
            if kind == "collapses":
                verdict, numbers = _collapses(arms, a, b)
                what = f"{a} collapses, {b} does not"
            elif kind == "comparable" and a == b:  # "stays stable": no seed collapses
                got = _values(arms, a, "collapsed")
                verdict = "not run" if not got else ("supports" if not any(got) else "contradicts")
                numbers, what = (f"{a} collapsed in {sum(got)}/{len(got)} seeds" if got else f"{a} has no runs"), f"{a} stable"
            else:
                verdict, numbers = checks_fn[kind](arms, a, b, key)
                what = f"{a} {'>' if kind == 'greater' else '≈'} {b} ({key})"
                if key == "kl":  # lower KL is the claim: "a > b" in KL means b lowers it
                    what = f"{b} has lower KL than {a}"
            lines.append(f"| {source if i == 0 else ''} | {claim if i == 0 else ''} | {what} | **{verdict}** | {numbers} |")
    if unchecked:
        lines += ["", f"Not checked, an arm has no runs here: {'; '.join(unchecked)}."]
    return lines + [""]


# ----------------------------------------------------------------------------- stress study, paired effects

_REPLAYS = {"none": "", "R2": "_r2", "R3": "_r3"}
STAT_KEYS = ("peak", "final", "kl", "late_reward", "late_entropy")  # per-run statistics of ``_run_stats``


def _one_run_value(run: dict[str, Any], key: str) -> float | None:
    """One run's statistic: a ``_run_stats`` key, or a metric's mean over the run."""
    return _run_stats(run)[key] if key in STAT_KEYS else _run_mean(key)(run["rows"])


def _arm_value(arms: dict[str, list], arm: str, key: str) -> float | None:
    """Mean over an arm's seeds of one run statistic (``_one_run_value``)."""
    values = [v for run in arms.get(arm, []) if (v := _one_run_value(run, key)) is not None]
    return statistics.mean(values) if values else None


def paired_effect(arms: dict[str, list], pairs: list[tuple[str, str]], key: str = "final") -> tuple[float, float, int] | None:
    """Mean of (a − b) over the pairs of arms that both ran, its standard error, and the number of pairs.

    The stress study pairs arms that differ in one knob only (clip, replay or IS) and averages over the
    others: each arm contributes its mean over seeds, each pair one difference. When only one pair ran
    (the on-policy IS pair), its seeds are the units instead: seed s of a against seed s of b, over the
    seeds both ran (with one such seed the standard error is NaN)."""
    ran = [(a, b) for a, b in pairs if _arm_value(arms, a, key) is not None and _arm_value(arms, b, key) is not None]
    if not ran:
        return None
    if len(ran) == 1:
        a, b = ran[0]
        by_seed = [{run["seed"]: _one_run_value(run, key) for run in arms[arm]} for arm in (a, b)]
        diffs = [va - vb for seed in sorted(set(by_seed[0]) & set(by_seed[1]))
                 if (va := by_seed[0][seed]) is not None and (vb := by_seed[1][seed]) is not None]
        if len(diffs) < 2:
            diffs = [_arm_value(arms, a, key) - _arm_value(arms, b, key)]
    else:
        diffs = [_arm_value(arms, a, key) - _arm_value(arms, b, key) for a, b in ran]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return statistics.mean(diffs), se, len(diffs)


#: two-sided 95 % quantiles of Student's t by degrees of freedom (pairs − 1); few pairs need a wide margin
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def _effect_cell(effect: tuple[float, float, int] | None, fmt: str = "{:+.3f}") -> str:
    if effect is None:
        return "—"
    mean, se, n = effect
    if not math.isfinite(se):
        return f"{fmt.format(mean)} (1 pair)"
    mark = " **beyond noise**" if abs(mean) > T95.get(n - 1, 2.0) * se else ""
    return f"{fmt.format(mean)} ± {fmt.format(se)[1:]} (n={n}){mark}"


def stress_section(runs: dict[str, dict[str, list]]) -> list[str]:
    """Markdown: per stress condition, the paired effects of clipping, replay and IS on the final held-out
    score, with the first-order diagnostics; empty when ``runs`` holds no stress conditions."""
    conditions = [c for c in STRESS_CONDITIONS if c in runs]
    if not conditions:
        return []
    lines = ["## Stress study: paired effects per condition", "",
             "Each cell: mean over pairs of arms that differ in that knob only (final held-out score, a − b) ± its "
             f"standard error across the pairs; **beyond noise** when a paired t-test rejects no effect at 95 % "
             "(|mean| > t(n − 1) SE: 3.18 SE for 4 pairs, 2.57 for 6). Clip: the 6 pairs "
             "(N = 4, 8) × (replay none, R2, R3). Replay: the 4 pairs (N = 4, 8) × (clip, no clip). IS: the on-policy "
             "pair, over its matched seeds when it ran more than one (seed s against seed s). Arms with several seeds "
             "enter the pairs with their mean over seeds. The last two columns repeat the clip pairs on the training reward and the policy entropy averaged "
             "over the last 25 % of steps (logged every step, so less noisy than the final evaluation). Residual and "
             "cosine: means over the condition's arms (the unclipped arms' cosine separately, since "
             "the clipping mask itself moves the surrogate's gradient away from Eq. (2)). Collapsed runs: as in the "
             "tables (below half the peak until the end); 'recovered': runs that fell below half their running peak "
             "and came back.", "",
             "| condition | axis | residual (last mb) | grad cosine clip / no clip | clip − no clip | R2 − none | R3 − none "
             "| IS − no IS (N = 1) | collapsed runs | clip − no clip, training reward (last 25 %) "
             "| clip − no clip, entropy (last 25 %) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    offpolicy = [(n, rep) for n in (4, 8) for rep in _REPLAYS.values()]
    for cond in conditions:
        arms = runs[cond]
        name = lambda arm: f"{cond}/{arm}"  # noqa: E731
        clip_pairs = [(name(f"n{n}_minirl{rep}"), name(f"n{n}_minirl{rep}_noclip")) for n, rep in offpolicy]
        clip = paired_effect(arms, clip_pairs)
        clip_reward, clip_entropy = (paired_effect(arms, clip_pairs, key) for key in ("late_reward", "late_entropy"))
        replay = {r: paired_effect(arms, [(name(f"n{n}_minirl{_REPLAYS[r]}{c}"), name(f"n{n}_minirl{c}"))
                                          for n in (4, 8) for c in ("", "_noclip")]) for r in ("R2", "R3")}
        is_effect = paired_effect(arms, [(name("onpolicy_minirl"), name("onpolicy_minirl_no_is"))])
        residuals = [v for arm in arms if (v := _arm_value(arms, arm, "residual/last_total_mean")) is not None]
        cos = {kind: [v for arm in arms if arm.endswith("_noclip") == (kind == "noclip") and "onpolicy" not in arm
                      and (v := _arm_value(arms, arm, "fidelity/last_grad_cosine")) is not None] for kind in ("clip", "noclip")}
        stats = [_run_stats(run) for rs in arms.values() for run in rs]
        collapsed = [st["collapsed"] for st in stats]
        recovered = sum(1 for st in stats if st["dipped"] and not st["collapsed"])
        fmt_cos = "/".join(f"{statistics.mean(v):.3f}" if v else "—" for v in cos.values())
        residual = f"{statistics.mean(residuals):.2e}" if residuals else "—"
        lines.append(f"| {cond} | {STRESS_CONDITIONS[cond][0]} | {residual} | {fmt_cos} | {_effect_cell(clip)} | "
                     f"{_effect_cell(replay['R2'])} | {_effect_cell(replay['R3'])} | {_effect_cell(is_effect)} | "
                     f"{sum(1 for c in collapsed if c)}/{len(collapsed)}{f', {recovered} recovered' if recovered else ''} | "
                     f"{_effect_cell(clip_reward)} | "
                     f"{_effect_cell(clip_entropy, '{:+.4f}')} |")
    return lines + [""]
