"""Pure statistics of runs: collapse and fall measures, per-run summaries, paired and Welch tests, Holm.

Nothing here reads files or draws: every function takes runs as ``minirl.experiments.runs`` loads them
(``{"seed", "n", "rows"}``) or plain lists of numbers, so each is unit-tested with hand-computed values.

*Steps to collapse*: the first gradient step after the peak from which the held-out score stays below 50 %
of its peak until the end of the run (None if it does not). *Deepest drop*: the largest fall of the held-out
score below its running peak (the best score so far), as a fraction of that peak, and where it happened; a
drop of 50 % or more that the run then recovers from is a collapse the "stays there" definition does not
count (a *recovered dip*).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minirl.experiments.runs import Run, series

#: per-step series (not the held-out score, logged every few steps) are smoothed by a trailing moving mean
#: over this many logged steps: a single step's k3 KL moves over four orders of magnitude
SMOOTH_STEPS = 8
#: a fall's entropy is compared with its mean over this many gradient steps up to the peak it fell from
FALL_ENTROPY_REF_STEPS = 16
#: "entropy blow-up": some logged step of the fall has at least this multiple of that reference entropy;
#: "entropy drop": the trailing mean over SMOOTH_STEPS gradient steps falls to at most this fraction of it
BLOWUP_FACTOR, ENTROPY_DROP_FRACTION = 1.5, 1 / 1.5
#: "KL rise" in a fall: a logged step at or above this multiple of the KL's mean up to the peak
KL_RISE_FACTOR = 3.0


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


def run_mean(key: str):
    def value(rows: list[dict[str, Any]]) -> float | None:
        xs = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return statistics.mean(xs) if xs else None
    return value


def run_final(key: str):
    def value(rows: list[dict[str, Any]]) -> float | None:
        xs = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return xs[-1] if xs else None
    return value




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




def deepest_drop(xs: list[int], ys: list[float]) -> tuple[float, int] | None:
    """(largest (running peak - y) / running peak, the x where it happened); None without a positive score.

    The running peak at x is the best y up to x; a run that never falls below it has (0.0, first x)."""
    best, worst, where = 0.0, 0.0, None
    for x, y in zip(xs, ys):
        best = max(best, y)
        if best > 0 and (where is None or (best - y) / best > worst):
            worst, where = (best - y) / best, x
    return (worst, where) if where is not None else None




def fall_entropy(run: dict[str, Any], peak_step: int, drop_step: int) -> dict[str, Any] | None:
    """How the training entropy moved during a fall from the held-out peak at gradient step ``peak_step`` to the
    low at ``drop_step`` (entropy is logged once per global step, i.e. every N gradient steps).

    ``ref``: mean entropy over the FALL_ENTROPY_REF_STEPS gradient steps up to the peak (the first ones when the
    peak is the start); ``max``: the largest logged value in (peak, low]; ``min``: the smallest trailing mean over
    SMOOTH_STEPS gradient steps there (one low step is noise); ``kind``: "blow-up" (max >= BLOWUP_FACTOR x ref),
    "drop" (min <= ENTROPY_DROP_FRACTION x ref), both, or "neither". None without entropy logged in the fall."""
    xs, ys = series(run, "train/entropy")
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
    xs, ys = series(run, "eval/accuracy")
    drop = deepest_drop(xs, ys)
    if drop is None:
        return None
    peak_i = max((i for i, x in enumerate(xs) if x <= drop[1]), key=ys.__getitem__)
    return {"drop": drop, "peak_i": peak_i, "peak_step": xs[peak_i], "stays": steps_to_collapse(xs, ys),
            "entropy": fall_entropy(run, xs[peak_i], drop[1]), "ys": ys}


def _reference(xs: list[int], ys: list[float], peak_step: int) -> float | None:
    """Mean of ys over the FALL_ENTROPY_REF_STEPS gradient steps up to the peak (the first logged ones when the
    peak is the start, before any training step)."""
    lo = max(peak_step, xs[0])
    before = [y for x, y in zip(xs, ys) if lo - FALL_ENTROPY_REF_STEPS < x <= lo]
    return statistics.mean(before) if before else None


def fall_onsets(run: Run, peak_step: int, drop_step: int) -> dict[str, Any]:
    """When, in a fall from the held-out peak at gradient step ``peak_step`` to the low at ``drop_step``, the KL
    and the entropy first left their levels, and which came first.

    ``kl_step``: the first logged step in (peak, low] with KL (k3) >= KL_RISE_FACTOR x its mean up to the peak;
    ``entropy_step``: the first with entropy >= BLOWUP_FACTOR x its mean up to the peak, or whose trailing mean
    over SMOOTH_STEPS gradient steps is <= ENTROPY_DROP_FRACTION x it (as ``fall_entropy``); ``order``: "KL first",
    "entropy first", "same step", "KL only", "entropy only" or "neither"; ``entropy_kind``: fall_entropy's kind."""
    def first(key: str, moved) -> int | None:
        xs, ys = series(run, key)
        ref = _reference(xs, ys, peak_step) if xs else None
        if ref is None:
            return None
        smooth = moving_mean(ys, max(1, SMOOTH_STEPS // run["n"]))
        return next((x for x, y, m in zip(xs, ys, smooth) if peak_step < x <= drop_step and moved(y, m, ref)), None)

    kl = first("mismatch/kl_k3", lambda y, m, ref: y >= KL_RISE_FACTOR * ref)
    ent = first("train/entropy", lambda y, m, ref: y >= BLOWUP_FACTOR * ref or m <= ENTROPY_DROP_FRACTION * ref)
    if kl is not None and ent is not None:
        order = "KL first" if kl < ent else "entropy first" if ent < kl else "same step"
    else:
        order = "KL only" if kl is not None else "entropy only" if ent is not None else "neither"
    entropy = fall_entropy(run, peak_step, drop_step)
    return {"kl_step": kl, "entropy_step": ent, "order": order,
            "entropy_kind": entropy["kind"] if entropy else "not logged"}


def run_stats(run: dict[str, Any]) -> dict[str, float | bool | None]:
    xs, ys = series(run, "eval/accuracy")
    _, kl = series(run, "mismatch/kl_k3")
    _, ent = series(run, "train/entropy")
    _, reward = series(run, "train/reward_mean")
    return {"peak": max(ys) if ys else None, "final": ys[-1] if ys else None, "start": ys[0] if ys else None,
            "late_reward": late_mean(reward), "late_entropy": late_mean(ent),
            "collapsed": steps_to_collapse(xs, ys) is not None if ys else None,
            "dipped": (drop := deepest_drop(xs, ys)) is not None and drop[0] >= 0.5,
            "kl": statistics.mean(kl) if kl else None,
            "entropy_change": (statistics.mean(ent[-5:]) - statistics.mean(ent[:5])) if len(ent) >= 10 else None}


def values(arms: dict[str, list[dict[str, Any]]], arm: str, key: str) -> list[float]:
    return [v for v in (run_stats(run)[key] for run in arms.get(arm, [])) if v is not None]


def mean_difference(a: list[float], b: list[float]) -> tuple[float, float] | None:
    """(mean(a) - mean(b), standard error of that difference); None without data."""
    if not a or not b:
        return None
    def var(xs: list[float]) -> float:
        return statistics.variance(xs) if len(xs) > 1 else 0.0

    return statistics.mean(a) - statistics.mean(b), math.sqrt(var(a) / len(a) + var(b) / len(b))


STAT_KEYS = ("peak", "final", "kl", "late_reward", "late_entropy")  # per-run statistics of ``run_stats``


def run_value(run: dict[str, Any], key: str) -> float | None:
    """One run's statistic: a ``run_stats`` key, or a metric's mean over the run."""
    return run_stats(run)[key] if key in STAT_KEYS else run_mean(key)(run["rows"])


def arm_value(arms: dict[str, list], arm: str, key: str) -> float | None:
    """Mean over an arm's seeds of one run statistic (``run_value``)."""
    values = [v for run in arms.get(arm, []) if (v := run_value(run, key)) is not None]
    return statistics.mean(values) if values else None


def _sub(a: float | None, b: float | None) -> float:
    assert a is not None and b is not None  # the pairs that ran
    return a - b


def paired_effect(arms: dict[str, list], pairs: list[tuple[str, str]], key: str = "final") -> tuple[float, float, int] | None:
    """Mean of (a − b) over the pairs of arms that both ran, its standard error, and the number of pairs.

    The stress study pairs arms that differ in one knob only (clip, replay or IS) and averages over the
    others: each arm contributes its mean over seeds, each pair one difference. When only one pair ran
    (the on-policy IS pair), its seeds are the units instead: seed s of a against seed s of b, over the
    seeds both ran (with one such seed the standard error is NaN)."""
    ran = [(a, b) for a, b in pairs if arm_value(arms, a, key) is not None and arm_value(arms, b, key) is not None]
    if not ran:
        return None
    if len(ran) == 1:
        a, b = ran[0]
        by_seed = [{run["seed"]: run_value(run, key) for run in arms[arm]} for arm in (a, b)]
        diffs = [va - vb for seed in sorted(set(by_seed[0]) & set(by_seed[1]))
                 if (va := by_seed[0][seed]) is not None and (vb := by_seed[1][seed]) is not None]
        if len(diffs) < 2:
            diffs = [_sub(arm_value(arms, a, key), arm_value(arms, b, key))]
    else:
        diffs = [_sub(arm_value(arms, a, key), arm_value(arms, b, key)) for a, b in ran]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return statistics.mean(diffs), se, len(diffs)


# ----------------------------------------------------------------------------- tests: Student's t, Welch, paired, Holm


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) by its continued fraction (Numerical Recipes, 2nd ed., §6.4)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point: use the symmetry
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)) / a
    c, d, f = 1.0, 1.0 - (a + b) * x / (a + 1), 0.0
    d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
    f = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
            c = 1.0 + num / c if abs(1.0 + num / c) > 1e-300 else 1e-300
            f *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * f


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom (``df`` may be fractional: Welch)."""
    return _betainc(df / 2, 0.5, df / (df + t * t))


def t_critical(df: float, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t: P(|T| <= t) = level (bisection)."""
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 1 - level else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Comparison:
    """a − b with its standard error, a t statistic on ``df`` degrees of freedom, its two-sided p and the
    95 % t interval; ``paired``: the units are seeds matched across the two arms (``n`` pairs)."""

    diff: float
    se: float
    df: float
    t: float
    p: float
    low: float
    high: float
    n: int
    paired: bool

    def describe(self, fmt: str = "{:+.3g}") -> str:
        kind = f"paired over {self.n} seeds" if self.paired else "Welch"
        return (f"{fmt.format(self.diff)} (SE {fmt.format(self.se).lstrip('+')}, 95 % CI [{fmt.format(self.low)}, "
                f"{fmt.format(self.high)}], t = {self.t:.2f}, df = {self.df:.1f}, p = {self.p:.3f}; {kind})")


def _comparison(diff: float, se: float, df: float, n: int, paired: bool) -> Comparison:
    t = diff / se if se > 0 else math.copysign(math.inf, diff) if diff else 0.0
    p = t_two_sided_p(t, df) if math.isfinite(t) else 0.0
    half = t_critical(df) * se
    return Comparison(diff, se, df, t, p, diff - half, diff + half, n, paired)


def welch(a: Sequence[float], b: Sequence[float]) -> Comparison | None:
    """Welch's unequal-variance t-test of mean(a) − mean(b); None with fewer than 2 values on a side.
    ``n`` is ``len(a) + len(b)``."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if va + vb > 0 else len(a) + len(b) - 2
    return _comparison(statistics.mean(a) - statistics.mean(b), se, df, len(a) + len(b), paired=False)


def paired(a: dict[Any, float], b: dict[Any, float]) -> Comparison | None:
    """Paired t-test of a − b over the keys (seeds) both have; None with fewer than 2 matched seeds."""
    diffs = [a[k] - b[k] for k in sorted(set(a) & set(b), key=str)]
    if len(diffs) < 2:
        return None
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return _comparison(statistics.mean(diffs), se, len(diffs) - 1, len(diffs), paired=True)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the input's order (reject at α where adjusted p <= α)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


# ----------------------------------------------------------------------------- one metric's level, two arms


def per_seed_level(runs: list[Run], key: str, fraction: float | None = None) -> dict[str, float]:
    """seed -> the run's mean of ``key`` over all its logged steps (``fraction`` None) or its last ``fraction``."""
    out = {}
    for run in runs:
        _, ys = series(run, key)
        level = (statistics.mean(ys) if ys else None) if fraction is None else late_mean(ys, fraction)
        if level is not None:
            out[run["seed"]] = level
    return out


def level_contrast(arms: dict[str, list[Run]], a: str, b: str, key: str = "mismatch/kl_k3",
                   fraction: float | None = None) -> list[str]:
    """Lines stating arm a's and b's per-seed levels of ``key``, their difference by a paired and a Welch
    test, and in how many matched seeds a is above b (the numbers behind the write-up's KL sentence)."""
    la, lb = per_seed_level(arms.get(a, []), key, fraction), per_seed_level(arms.get(b, []), key, fraction)
    what = "whole-run mean" if fraction is None else f"mean over the last {fraction:.0%} of logged steps"
    if not la or not lb:
        return [f"{key}, {what}: {a} or {b} has no runs"]
    common = sorted(set(la) & set(lb), key=str)
    above = sum(la[s] > lb[s] for s in common)
    lines = [f"{key}, {what} per run:",
             f"  {a}: mean {statistics.mean(la.values()):.3g} over {len(la)} seeds",
             f"  {b}: mean {statistics.mean(lb.values()):.3g} over {len(lb)} seeds",
             f"  {a} above {b} in {above}/{len(common)} matched seeds"]
    for name, test in (("paired", paired(la, lb)), ("Welch", welch(list(la.values()), list(lb.values())))):
        if test is not None:
            lines.append(f"  {a} − {b}, {name}: {test.describe()} = {abs(test.t):.1f} SE")
    return lines
