"""``minirl plot``: figures from run directories (PNG).

Per setting: ``<setting>.png``, the paper's four panels (held-out score, KL, reward, entropy) with each
arm's mean over seeds as a thick line and every seed as a thin line of the same colour and style (no
bands: a band turns an abrupt collapse into a gentle decline); each arm has its own colour *and* its own
line style and marker, and the legend sits outside the data. Where a run fell 50 % or more below its
running peak: ``<setting>_seeds.png``, one small panel per arm x seed (held-out score and training
reward, the fall shaded), and ``<setting>_falls.png``, one row per fall with its timeline (held-out, KL,
entropy, reward, residual, clip fraction at the same gradient steps; the KL rise and the entropy move
marked). Stress sweeps add ``stress_<axis>.png``: run-level summaries against each axis' levels.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from minirl.experiments.analysis import (
    SMOOTH_STEPS,
    fall_onsets,
    moving_mean,
    run_final,
    run_mean,
)
from minirl.experiments.arms import TABLE, load_table
from minirl.experiments.report import falls
from minirl.experiments.runs import SETTINGS, Run, Runs, load_runs, series

PANELS = (("eval/accuracy", "held-out score (mean@n)", False), ("mismatch/kl_k3", "training-inference KL (k3)", True),
          ("train/reward_mean", "training reward", False), ("train/entropy", "entropy", False))
COLD_START_PANELS = (("eval/response_length", "held-out response length (tokens)", False),)  # Fig. 5
#: a fall's timeline: (metric, title, log scale)
FALL_PANELS = (("eval/accuracy", "held-out", False), ("mismatch/kl_k3", "KL (k3)", True),
               ("train/entropy", "entropy", False), ("train/reward_mean", "training reward", False),
               ("residual/last_total_mean", "first-order residual", True), ("policy/clip_frac", "clip fraction", False))
_LINESTYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p", "d", "8")


def arm_styles(arms: list[str]) -> dict[str, dict[str, Any]]:
    """A distinct colour and a distinct (line style, marker) for each arm, stable for a given list of arms:
    tab20's dark hues first, then its light ones (20 colours before any repeats)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    order = list(range(0, 20, 2)) + list(range(1, 20, 2))
    return {arm: {"color": cmap(order[i % 20]), "linestyle": _LINESTYLES[i % 4], "marker": _MARKERS[i % len(_MARKERS)]}
            for i, arm in enumerate(sorted(arms))}


def _smoothed(run: Run, key: str) -> tuple[list[int], list[float]]:
    xs, ys = series(run, key)
    return (xs, ys) if key.startswith("eval/") else (xs, moving_mean(ys, SMOOTH_STEPS))


def _mean_over_seeds(runs: list[Run], key: str) -> tuple[list[int], list[float]]:
    by_x: dict[int, list[float]] = {}
    for run in runs:
        for x, y in zip(*_smoothed(run, key)):
            by_x.setdefault(x, []).append(y)
    xs = sorted(x for x, ys in by_x.items() if len(ys) == len(runs))  # only where every seed has a value
    return xs, [statistics.mean(by_x[x]) for x in xs]


def _setting_figure(plt: Any, setting: str, arms: dict[str, list[Run]], path: Path) -> None:
    panels = PANELS + (COLD_START_PANELS if setting == "coldstart" else ())
    styles = arm_styles(list(arms))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 3.2, 4.4), squeeze=False)
    for ax, (key, title, log_y) in zip(axes[0], panels):
        for arm, runs in sorted(arms.items()):
            style = styles[arm]
            for run in runs:
                ax.plot(*_smoothed(run, key), color=style["color"], linestyle=style["linestyle"], linewidth=0.7, alpha=0.45)
            xs, ys = _mean_over_seeds(runs, key)
            if xs:
                ax.plot(xs, ys, linewidth=2.0, markersize=4, markevery=max(1, len(xs) // 8),
                        label=f"{arm.split('/')[-1]} ({len(runs)} seeds)", **style)
        ax.set_title(title if key.startswith("eval/") else f"{title}, moving mean of {SMOOTH_STEPS} steps", fontsize=9)
        ax.set_xlabel("gradient steps")
        if log_y and ax.lines and all(min(line.get_ydata(), default=1) > 0 for line in ax.lines):
            ax.set_yscale("log")
    # the legend of the first panel with data, outside the last one (a metric a run did not log leaves its panel empty)
    handles, labels = next((found for ax in axes[0] if (found := ax.get_legend_handles_labels())[0]), ([], []))
    if handles:
        axes[0][-1].legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.suptitle(f"{SETTINGS.get(setting, setting)}: thick = mean over seeds, thin = each seed")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _seeds_figure(plt: Any, setting: str, arms: dict[str, list[Run]], found: list[tuple[str, Run, dict[str, Any]]],
                  path: Path) -> None:
    """Small multiples: a row per arm, a column per seed; held-out score (black) and training reward (grey)."""
    names = sorted(arms)
    seeds = sorted({run["seed"] for runs in arms.values() for run in runs}, key=lambda s: (len(s), s))
    fig, axes = plt.subplots(len(names), len(seeds), figsize=(2.6 * len(seeds) + 1, 1.35 * len(names) + 0.8),
                             sharex=True, sharey=True, squeeze=False)
    for i, arm in enumerate(names):
        by_seed = {run["seed"]: run for run in arms[arm]}
        for j, seed in enumerate(seeds):
            ax = axes[i][j]
            run = by_seed.get(seed)
            if run is None:
                ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes, fontsize=7)
                continue
            ax.plot(*_smoothed(run, "train/reward_mean"), color="0.6", linewidth=0.8)
            ax.plot(*series(run, "eval/accuracy"), color="black", marker=".", linewidth=1.2)
            fall = next((f for a, r, f in found if a == arm and r is run), None)
            if fall is not None:
                ax.axvspan(fall["peak_step"], fall["drop"][1], color="red", alpha=0.15)
            ax.set_ylim(-0.03, 1.03)
            if i == 0:
                ax.set_title(seed, fontsize=8)
            if j == 0:
                ax.set_ylabel(arm.split("/")[-1], fontsize=7, rotation=0, ha="right", va="center")
            ax.tick_params(labelsize=6)
    fig.suptitle(f"{setting}: held-out score (black) and training reward (grey, {SMOOTH_STEPS}-step mean)\nper arm "
                 "and seed; red: a fall of ≥ 50 % below the running peak", fontsize=9)
    fig.supxlabel("gradient steps", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _falls_figure(plt: Any, setting: str, found: list[tuple[str, Run, dict[str, Any]]], path: Path) -> None:
    """A row per fall, a column per metric, at the same gradient steps: the fall (peak to low) shaded, the KL
    rise (red dashed) and the entropy move (blue dotted) marked."""
    fig, axes = plt.subplots(len(found), len(FALL_PANELS), figsize=(2.6 * len(FALL_PANELS), 1.6 * len(found) + 0.8),
                             sharex="row", squeeze=False)
    for i, (arm, run, fall) in enumerate(found):
        onset = fall_onsets(run, fall["peak_step"], fall["drop"][1])
        for j, (key, title, log_y) in enumerate(FALL_PANELS):
            ax = axes[i][j]
            xs, ys = series(run, key)
            if xs:
                ax.plot(xs, ys, color="black", linewidth=0.9, marker="." if key.startswith("eval/") or len(xs) < 40 else None)
                if log_y and min(ys) > 0:
                    ax.set_yscale("log")
            else:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, fontsize=7)
            ax.axvspan(fall["peak_step"], fall["drop"][1], color="red", alpha=0.12)
            if onset["kl_step"] is not None:
                ax.axvline(onset["kl_step"], color="red", linestyle="--", linewidth=0.9)
            if onset["entropy_step"] is not None:
                ax.axvline(onset["entropy_step"], color="tab:blue", linestyle=":", linewidth=1.2)
            ax.tick_params(labelsize=6)
            if i == 0:
                ax.set_title(title, fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{arm.split('/')[-1]}\n{run['seed']}\n{onset['order']}", fontsize=7, rotation=0,
                              ha="right", va="center")
    fig.suptitle(f"{setting}: each fall's timeline (shaded: peak → low; red dashed: KL rise; blue dotted: entropy move;\n"
                 "the clip fraction is 0 by construction in unclipped arms)", fontsize=9)
    fig.supxlabel("gradient steps", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot(runs_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Every figure for the runs at or below ``runs_dir`` (a sweep root or one run) into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = out_dir or (runs_dir / "plots")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    loaded = load_runs(runs_dir)
    for setting, arms in loaded.items():
        path = out_dir / f"{setting}.png"
        _setting_figure(plt, setting, arms, path)
        written.append(path)
        found = falls({setting: arms})
        _seeds_figure(plt, setting, arms, found, out_dir / f"{setting}_seeds.png")  # every seed, falls or not
        written.append(out_dir / f"{setting}_seeds.png")
        if found:
            _falls_figure(plt, setting, found, out_dir / f"{setting}_falls.png")
            written.append(out_dir / f"{setting}_falls.png")
    return written + plot_stress_axes(plt, runs_dir, loaded, out_dir)


#: run-level summaries plotted against each stress axis: (title, function of one run's rows -> value, log scale)
STRESS_PANELS = (
    ("final held-out score", run_final("eval/accuracy"), False),
    ("train-infer KL (k3), run mean", run_mean("mismatch/kl_k3"), True),
    ("grad cosine, surrogate vs Eq. (2), last mini-batch", run_mean("fidelity/last_grad_cosine"), False),
    ("first-order residual, last mini-batch", run_mean("residual/last_total_mean"), True),
)


def plot_stress_axes(plt: Any, runs_dir: Path, loaded: Runs, out_dir: Path) -> list[Path]:
    """One figure per stress axis (from the arm table in ``runs_dir``): each run-level summary against the
    axis' levels, a line per arm (mean over seeds, every seed a small dot)."""
    if not (runs_dir / TABLE).is_file():
        return []
    table = load_table(runs_dir / TABLE)
    written = []
    for axis, levels in table.axes.items():
        present = [lvl for lvl in levels if lvl in loaded]
        if len(present) < 2:
            continue
        arms = sorted({arm.split("/", 1)[1] for lvl in present for arm in loaded[lvl]})
        styles = arm_styles(arms)
        fig, axes = plt.subplots(1, len(STRESS_PANELS), figsize=(4.6 * len(STRESS_PANELS) + 3.2, 4.6))
        for ax, (title, value, log_y) in zip(axes, STRESS_PANELS):
            for arm in arms:
                xs, ys = [], []
                for i, lvl in enumerate(present):
                    vals = [v for run in loaded[lvl].get(f"{lvl}/{arm}", []) if (v := value(run["rows"])) is not None]
                    if vals:
                        xs.append(i)
                        ys.append(statistics.mean(vals))
                        ax.scatter([i] * len(vals), vals, s=6, color=styles[arm]["color"], alpha=0.5)
                if ys:
                    ax.plot(xs, ys, label=arm, **styles[arm])
            ax.set_xticks(range(len(present)), [lvl for lvl in present])
            ax.set_title(title, fontsize=9)
            if log_y and ax.lines and all(min(line.get_ydata()) > 0 for line in ax.lines):
                ax.set_yscale("log")
        axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
        fig.suptitle(f"stress axis: {axis} (line: mean over seeds; dots: each seed)")
        fig.tight_layout()
        path = out_dir / f"stress_{axis.replace(' ', '_')}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
