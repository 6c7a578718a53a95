"""RL step time against the batch shape: samples per prompt G, prompts per step P, response length T.

Each point runs minirl's own loop (``minirl.loop.setup`` + ``global_step``, through
``compare_trl.run_minirl``) on the demo config (``configs/demo.yaml``: the ~1.8 M Qwen3-MoE at
random init, cold start and evaluation off, fp8-e4m3 engine unless overridden) with one knob
changed: G = ``rollout.samples_per_prompt``, P = ``rollout.prompts_per_step`` or
T = ``rollout.max_new_tokens``; the other two stay at the config's values (demo: P = 8, G = 8,
T = 24). Every completion is forced to the full T (the engine's EOS set to an id outside the
vocabulary, as ``bench_step.py``'s engine comparison does), so a step trains exactly P x G x T
new tokens. Per point: the median wall time of a global step over ``--steps`` steps after
``--warmup`` warm-up steps, and the median of each phase (rollout with the engine's
``logp_rollout``, the trainer's ``logp_old`` pass, the update with its fresh log-probs, the
weight sync), from the step's own ``time/*_s`` metrics.

Per axis, ``step_s = a + b * x`` is fitted by least squares; the script prints the slope b, the
intercept a and the largest relative deviation |measured - fitted| / measured of a point from the
line, and flags the axis when that exceeds ``--tolerance`` (15 %). For a flagged point it names
the phase whose own line misses it by the most seconds (the phase that bends the curve). Expected
causes: a fixed per-step cost (a > 0) does not bend a line but makes the cost per sequence fall
with P and G; small batches leave the matmuls under-used, so the first points of P and G sit
above the line (sub-linear growth); along T each new token attends to all earlier ones and the
trainer's passes run over prompt + T positions, so the T axis can bend upwards.

    python benchmarks/bench_scaling.py [--G 2,4,8,16] [--P 2,4,8,16] [--T 8,16,32,64] [--steps 5]
        [--warmup 1] [--threads 1] [--config configs/demo.yaml] [--out scaling.json] [--plot scaling.png]
        [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from bench_rollout import int_list
from compare_trl import PHASES, run_minirl

# axis name -> the config key it sets
AXES = {"G": "rollout.samples_per_prompt", "P": "rollout.prompts_per_step", "T": "rollout.max_new_tokens"}
AXIS_LABELS = {"G": "samples per prompt G", "P": "prompts per step P", "T": "max new tokens T"}
DEFAULT_VALUES = {"G": [2, 4, 8, 16], "P": [2, 4, 8, 16], "T": [8, 16, 32, 64]}
TOLERANCE = 0.15


@dataclass
class LinearFit:
    """``y = intercept + slope * x`` by least squares, and each point's relative deviation from it."""

    intercept: float
    slope: float
    deviations: list[float]  # (measured - fitted) / measured, per point

    @property
    def max_deviation(self) -> float:
        return max((abs(d) for d in self.deviations), default=0.0)

    def predict(self, x: float) -> float:
        return self.intercept + self.slope * x


def linear_fit(xs: list[float], ys: list[float]) -> LinearFit:
    """Ordinary least squares line through (xs, ys); needs two distinct xs."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError("linear_fit: needs as many ys as xs and at least two distinct xs")
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx
    intercept = mean_y - slope * mean_x
    deviations = [(y - (intercept + slope * x)) / y if y else float("inf") for x, y in zip(xs, ys)]
    return LinearFit(intercept, slope, deviations)


def flagged_points(fit: LinearFit, tolerance: float = TOLERANCE) -> list[int]:
    """Indices of the points further than ``tolerance`` (relative) from the fitted line."""
    return [i for i, d in enumerate(fit.deviations) if abs(d) > tolerance]


def bending_phase(xs: list[float], phase_values: dict[str, list[float]], index: int) -> tuple[str, float]:
    """The phase whose own fitted line misses point ``index`` by the most seconds (signed residual)."""
    residuals = {}
    for phase, ys in phase_values.items():
        fit = linear_fit(xs, ys)
        residuals[phase] = ys[index] - fit.predict(xs[index])
    phase = max(residuals, key=lambda p: abs(residuals[p]))
    return phase, residuals[phase]


def scaling_config(config: str, key: str, value: int, steps: int, threads: int, tmp: str, overrides: list[str]):
    """The config of one point: ``config`` as ``bench_step.py`` runs it (no cold start, no evaluation)."""
    from minirl.config import load_config

    return load_config(config, [
        "cold_start.enabled=false", "eval.every_steps=0", "eval.num_prompts=1", "eval.samples_per_prompt=1",
        "log.console=false", "checkpoint.every_steps=0", f"run.output_dir={tmp}", "run.name=scaling",
        f"run.threads={threads}", f"optim.global_steps={steps}", *overrides, f"{key}={value}",
    ])


def measure_point(cfg, warmup: int, steps: int) -> dict:
    """Median step and phase times of ``steps`` forced-length global steps after ``warmup``."""
    phases: dict[str, list[float]] = {phase: [] for phase in PHASES}
    times, _ = run_minirl(cfg, forced=True, warmup=warmup, steps=steps, phases=phases)
    r = cfg.rollout
    return {"P": r.prompts_per_step, "G": r.samples_per_prompt, "T": r.max_new_tokens,
            "step_s": statistics.median(times), "step_s_runs": times,
            "phases_s": {phase: statistics.median(values) for phase, values in phases.items()}}


def shape_of(point: dict) -> tuple[int, int, int]:
    return point["P"], point["G"], point["T"]


def run_axes(args: argparse.Namespace) -> dict[str, list[dict]]:
    """Every axis value, one point at a time (a shape shared by two axes is measured once)."""
    measured: dict[tuple[int, int, int], dict] = {}
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for axis, values in args.axes.items():
            results[axis] = []
            for value in values:
                cfg = scaling_config(args.config, AXES[axis], value, args.warmup + args.steps, args.threads, tmp,
                                     args.overrides)
                r = cfg.rollout
                shape = (r.prompts_per_step, r.samples_per_prompt, r.max_new_tokens)
                if shape not in measured:
                    started = time.perf_counter()
                    measured[shape] = measure_point(cfg, args.warmup, args.steps)
                    print(f"  {axis}={value:<4} P={shape[0]:<3} G={shape[1]:<3} T={shape[2]:<3} "
                          f"step {measured[shape]['step_s']:.3f} s  ({time.perf_counter() - started:.0f}s)", flush=True)
                results[axis].append({"axis": axis, "value": value, **measured[shape]})
    return results


def axis_summary(axis: str, points: list[dict], tolerance: float) -> dict:
    """The fit of one axis, its flagged points and, for each, the phase that bends the curve."""
    xs = [float(p["value"]) for p in points]
    fit = linear_fit(xs, [p["step_s"] for p in points])
    phase_values = {phase: [p["phases_s"][phase] for p in points] for phase in PHASES}
    flags = []
    for index in flagged_points(fit, tolerance):
        phase, residual = bending_phase(xs, phase_values, index)
        flags.append({"value": points[index]["value"], "deviation": fit.deviations[index], "phase": phase,
                      "phase_residual_s": residual})
    return {"axis": axis, "intercept_s": fit.intercept, "slope_s": fit.slope, "deviations": fit.deviations,
            "max_deviation": fit.max_deviation, "linear": not flags, "flagged": flags,
            "phase_slopes_s": {phase: linear_fit(xs, ys).slope for phase, ys in phase_values.items()}}


def print_axis(points: list[dict], summary: dict, tolerance: float) -> None:
    axis = summary["axis"]
    print(f"\n{AXIS_LABELS[axis]} (others: " + ", ".join(f"{k}={points[0][k]}" for k in ("P", "G", "T") if k != axis) + ")")
    print(f"  {axis:>4} {'step ms':>9} " + " ".join(f"{phase + ' ms':>{len(phase) + 3}}" for phase in PHASES) + f" {'fit ms':>9} {'dev':>7}")
    for point, deviation in zip(points, summary["deviations"]):
        fitted = summary["intercept_s"] + summary["slope_s"] * point["value"]
        print(f"  {point['value']:>4} {point['step_s'] * 1000:>9.1f} "
              + " ".join(f"{point['phases_s'][phase] * 1000:>{len(phase) + 3}.1f}" for phase in PHASES)
              + f" {fitted * 1000:>9.1f} {100 * deviation:>+6.1f}%")
    print(f"  fit: step_s = {summary['intercept_s'] * 1000:.1f} ms + {summary['slope_s'] * 1000:.2f} ms x {axis}; "
          f"largest deviation {100 * summary['max_deviation']:.1f} % -> "
          + ("linear" if summary["linear"] else f"NOT LINEAR (over {100 * tolerance:.0f} %)"))
    print("  slope per phase: " + ", ".join(f"{phase} {value * 1000:.2f} ms" for phase, value in summary["phase_slopes_s"].items()))
    for flag in summary["flagged"]:
        print(f"  ! {axis}={flag['value']}: {100 * flag['deviation']:+.1f} % off the line; the phase furthest from its own "
              f"line is {flag['phase']} ({flag['phase_residual_s'] * 1000:+.1f} ms)")


def plot_axes(results: dict[str, list[dict]], summaries: dict[str, dict], path: Path) -> None:
    """One panel per axis: step and phase times (points), the fitted line of the step time (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.6 * len(results), 4), squeeze=False)
    for ax, (axis, points) in zip(axes[0], results.items()):
        xs = [p["value"] for p in points]
        ax.plot(xs, [p["step_s"] for p in points], "o-", color="black", label="step")
        for phase in PHASES:
            ax.plot(xs, [p["phases_s"][phase] for p in points], ".-", alpha=0.8, label=phase)
        s = summaries[axis]
        ax.plot(xs, [s["intercept_s"] + s["slope_s"] * x for x in xs], "--", color="grey",
                label=f"fit (max dev {100 * s['max_deviation']:.0f} %)")
        ax.set(xlabel=AXIS_LABELS[axis], ylabel="seconds per global step", title=f"step time vs {axis}")
        ax.set_xticks(xs)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for axis, values in DEFAULT_VALUES.items():
        parser.add_argument(f"--{axis}", type=int_list, default=values,
                            help=f"{AXIS_LABELS[axis]} values (default {','.join(map(str, values))}; empty: skip the axis)")
    parser.add_argument("--steps", type=int, default=5, help="measured global steps per point")
    parser.add_argument("--warmup", type=int, default=1, help="global steps skipped at the start of each point")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="flag deviations from linear above this")
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--out", type=Path, default=None, help="write points and fits to this JSON file")
    parser.add_argument("--plot", type=Path, default=None, help="draw one panel per axis to this PNG")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config (e.g. rollout.precision=fp32)")
    args = parser.parse_args(argv)
    args.axes = {axis: getattr(args, axis) for axis in AXES if getattr(args, axis)}
    for axis, values in args.axes.items():
        if len(set(values)) < 2:
            parser.error(f"--{axis}: a line needs at least two distinct values")
    if not args.axes:
        parser.error("every axis is empty")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from minirl.cli import _quiet_libraries

    _quiet_libraries()
    print(f"global step time vs G, P, T: {args.config} {' '.join(args.overrides)}, completions forced to T, "
          f"{args.threads} thread(s), median of {args.steps} steps after {args.warmup} warm-up", flush=True)
    results = run_axes(args)
    summaries = {axis: axis_summary(axis, points, args.tolerance) for axis, points in results.items()}
    for axis, points in results.items():
        print_axis(points, summaries[axis], args.tolerance)
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "threads": args.threads, "steps": args.steps,
                                        "warmup": args.warmup, "points": results, "fits": summaries}, indent=1))
        print(f"wrote {args.out}")
    if args.plot:
        plot_axes(results, summaries, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
