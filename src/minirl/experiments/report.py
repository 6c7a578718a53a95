"""``minirl report``: a markdown table per setting, the paper's claims checked, the stress study's paired
effects and every fall of the held-out score, with its timeline classified (KL first / entropy first)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from minirl.experiments.analysis import (
    BLOWUP_FACTOR,
    ENTROPY_DROP_FRACTION,
    FALL_ENTROPY_REF_STEPS,
    KL_RISE_FACTOR,
    SMOOTH_STEPS,
    fall_onsets,
    late_mean,
    run_fall,
    run_mean,
    run_stats,
)
from minirl.experiments.arms import TABLE, load_table
from minirl.experiments.claims import claims_section, stress_section
from minirl.experiments.runs import SETTINGS, Run, Runs, load_runs, series

LEGEND = (
    "Held-out score = `eval/accuracy` (mean ± std over seeds). Steps are gradient steps (global step × N). "
    "Collapse: the held-out score falls below 50 % of its peak and stays there until the end (per seed; 'never' if "
    "it did not), with how the training entropy moved in the fall: a blow-up or a drop (≥ {b:g}× or ≤ 1/{d:g} of its "
    "level at the peak; see 'Falls'). Deepest drop: the largest fall below the running peak (best score so far), as a "
    "fraction of it, and its step, per seed (a fall of 50 % or more the run recovers from is a collapse the first "
    "definition does not count). Final KL = mean `mismatch/kl_k3` over the last 25 % of the run's steps (one step's "
    "value is too noisy). Grad cosine and residual: run means of `fidelity/last_grad_cosine` and "
    "`residual/last_total_mean` (only where `diagnostics.every_steps` > 0)."
)


def _pm(values: list[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def _entropy_word(entropy: dict[str, Any] | None) -> str:
    if entropy is None:
        return "entropy not logged"
    return {"neither": f"entropy within ×{BLOWUP_FACTOR:g}"}.get(entropy["kind"], f"entropy {entropy['kind']}")


def _drop_cell(drop: tuple[float, int] | None) -> str:
    return "—" if drop is None else f"{drop[0]:.0%} at {drop[1]}" if drop[0] > 0 else "0%"


def falls(runs: Runs, threshold: float = 0.5) -> list[tuple[str, Run, dict[str, Any]]]:
    """(arm, run, run_fall) of every run whose held-out score fell ``threshold`` or more below its running peak."""
    out = []
    for arms in runs.values():
        for arm, arm_runs in sorted(arms.items()):
            for run in arm_runs:
                fall = run_fall(run)
                if fall is not None and fall["drop"][0] >= threshold:
                    out.append((arm, run, fall))
    return out


def _fall_row(arm: str, run: Run, fall: dict[str, Any]) -> str:
    drop, peak_i, peak_step, stays, ent, ys = (fall[k] for k in ("drop", "peak_i", "peak_step", "stays", "entropy", "ys"))
    kx, ky = series(run, "mismatch/kl_k3")
    kl_fall = [(y, x) for x, y in zip(kx, ky) if peak_step < x <= drop[1]]
    kl = f"{max(kl_fall)[0]:.1e} at {max(kl_fall)[1]}" if kl_fall else "—"
    entropy = ("—" if ent is None else
               f"{ent['ref']:.3f} → max {ent['max']:.3f} ({ent['max'] / ent['ref']:.2f}×) / min "
               f"{ent['min']:.3f} ({ent['min'] / ent['ref']:.2f}×): {ent['kind']}")
    return (f"| {arm} | {run['seed']} | {ys[0]:.3f} → {ys[peak_i]:.3f} at {peak_step} → {ys[-1]:.3f} "
            f"| {_drop_cell(drop)} | {'stayed (from ' + str(stays) + ')' if stays is not None else 'recovered'} "
            f"| {entropy} | {kl} |")


def falls_section(runs: Runs, threshold: float = 0.5) -> list[str]:
    """Markdown: every run whose held-out score fell at least ``threshold`` below its running peak, with whether
    it stayed down, how its entropy moved (blow-up or drop) and its largest train-infer KL during the fall; then
    the order in which KL and entropy left their levels in each fall."""
    found = falls(runs, threshold)
    lines = [f"## Falls: runs whose held-out score fell {threshold:.0%} or more below its running peak", ""]
    if not found:
        return lines + [f"No run fell {threshold:.0%} below its running peak.", ""]
    lines += [
        "Per run: held-out score at the start → the running peak it fell from (gradient step) → the end; the "
        "deepest drop; whether it stayed below half the overall peak to the end (the tables' collapse) or came back; "
        f"the training entropy: its mean over the {FALL_ENTROPY_REF_STEPS} gradient steps up to that peak (the first ones "
        f"when the peak is the start) → the largest logged value from the peak to the low / the smallest "
        f"{SMOOTH_STEPS}-gradient-step mean there, called a blow-up at ≥ {BLOWUP_FACTOR:g}× and a drop at ≤ "
        f"{ENTROPY_DROP_FRACTION:.2f}× the first; the largest train-infer KL (k3) from the peak to the low.", "",
        "| arm | seed | held-out: start → peak → final | deepest drop | stayed down? | entropy around the fall "
        "| largest KL (k3) in the fall |",
        "|---|---|---|---|---|---|---|", *(_fall_row(*f) for f in found), ""]
    return lines + fall_order_section(found)


def fall_order_section(found: list[tuple[str, Run, dict[str, Any]]]) -> list[str]:
    """Markdown: per fall, the first logged gradient step at which the KL left its level (≥ KL_RISE_FACTOR x its
    mean up to the peak) and the entropy left its level (blow-up or drop as above), which came first, and the
    kind of entropy move; then the counts."""
    rows: list[str] = []
    counts: dict[str, int] = {}
    for arm, run, fall in found:
        order = fall_onsets(run, fall["peak_step"], fall["drop"][1])
        counts[order["order"]] = counts.get(order["order"], 0) + 1
        def step(s: int | None) -> str:
            return "—" if s is None else str(s)

        rows.append(f"| {arm} | {run['seed']} | {fall['peak_step']} → {fall['drop'][1]} | {step(order['kl_step'])} "
                    f"| {step(order['entropy_step'])} | **{order['order']}** | {order['entropy_kind']} |")
    tally = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    return ["### Which moved first: KL or entropy", "",
            f"For each fall above: the first logged gradient step after the peak at which the train-infer KL (k3) "
            f"reached ≥ {KL_RISE_FACTOR:g}× its mean over the {FALL_ENTROPY_REF_STEPS} gradient steps up to the peak, "
            f"and at which the entropy reached ≥ {BLOWUP_FACTOR:g}× (blow-up) or its {SMOOTH_STEPS}-step mean ≤ "
            f"{ENTROPY_DROP_FRACTION:.2f}× (drop) its level there; 'same step' when both first moved at one logged step "
            "(steps are logged once per global step, i.e. every N gradient steps, so 'same step' cannot order them).",
            "", "| arm | seed | peak → low (gradient steps) | KL rise at | entropy move at | first | entropy move |",
            "|---|---|---|---|---|---|---|", *rows, "", f"Counts over {len(found)} falls: {tally}.", ""]


def _setting_table(setting: str, arms: dict[str, list[Run]]) -> list[str]:
    lines = [f"## {SETTINGS.get(setting, setting)}", "",
             "| arm | seeds | gradient steps | peak held-out | final held-out | steps to collapse | deepest drop "
             "| final KL (k3, last 25 %) | grad cosine (last mb) | residual (last mb) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm, runs in sorted(arms.items()):
        peaks, finals, collapses, drops, kls, steps = [], [], [], [], [], []
        for run in runs:
            _, ys = series(run, "eval/accuracy")
            if ys:
                peaks.append(max(ys))
                finals.append(ys[-1])
                fall = run_fall(run)  # None exactly when deepest_drop is
                collapses.append("never" if fall is None or fall["stays"] is None else
                                 f"{fall['stays']} ({_entropy_word(fall['entropy'])})")
                drops.append(_drop_cell(fall["drop"] if fall else None))
            _, ky = series(run, "mismatch/kl_k3")
            if ky:
                kls.append(late_mean(ky) or 0.0)  # ky is not empty
            steps.append(int(run["rows"][-1]["step"]) * run["n"])
        cosines = [v for v in (run_mean("fidelity/last_grad_cosine")(run["rows"]) for run in runs) if v is not None]
        residuals = [v for v in (run_mean("residual/last_total_mean")(run["rows"]) for run in runs) if v is not None]
        lines.append(f"| {arm} | {len(runs)} | {max(steps)} | {_pm(peaks)} | {_pm(finals)} | {', '.join(collapses) or '—'} | "
                     f"{', '.join(drops) or '—'} | {_pm(kls, '{:.2e}')} | {_pm(cosines, '{:.4f}')} | {_pm(residuals, '{:.2e}')} |")
    dead = [arm for arm, runs in sorted(arms.items()) if runs and all(run_stats(run)["peak"] == 0 for run in runs)]
    if dead:
        lines += ["", f"**No learning signal:** {', '.join(dead)} never scored above 0 on the held-out set, so every "
                  "group's reward was (nearly) all zero and RL had nothing to learn from; check the cold start "
                  "before reading these rows."]
    return lines + [""]


def stress_conditions(runs_dir: Path) -> dict[str, str]:
    """condition -> axis, from the arm table the sweep copied into ``runs_dir`` (none: no stress section)."""
    path = runs_dir / TABLE
    return {name: cond.axis for name, cond in load_table(path).conditions.items()} if path.is_file() else {}


def report(runs_dir: Path, out: Path | None = None) -> Path:
    """Write ``RUNS_DIR/REPORT.md`` (or ``out``) from the run directories at or below ``runs_dir``."""
    lines = [f"# Report: {runs_dir}", "", LEGEND.format(b=BLOWUP_FACTOR, d=1 / ENTROPY_DROP_FRACTION), ""]
    loaded = load_runs(runs_dir)  # read every run's metrics once
    for setting, arms in loaded.items():
        lines += _setting_table(setting, arms)
    lines += claims_section(loaded)
    lines += stress_section(loaded, stress_conditions(runs_dir))
    lines += falls_section(loaded)
    out = out or (runs_dir / "REPORT.md")
    out.write_text("\n".join(lines), encoding="utf-8")
    return out
