"""The paper's claims, each checked against the runs: a typed verdict with its test, n and numbers.

Verdicts (``Verdict``): *supports* / *contradicts* when a two-sided Welch t-test of the difference over
seeds rejects "no difference" at 5 % (for *comparable*: the difference is also within ``COMPARABLE_ABS``);
*not reproduced within N steps* when a collapse the paper reports did not happen in any seed within the
run's horizon (the paper's collapses come after hundreds to thousands of steps, so this is not evidence
against it); *cannot tell* otherwise; *not run* when an arm has no runs. No multiplicity correction is
applied across the table's checks: read each with the number of checks in mind.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from enum import Enum

from minirl.experiments.analysis import (
    arm_value,
    paired_effect,
    run_stats,
    t_critical,
    values,
    welch,
)
from minirl.experiments.runs import Run, Runs, flat

#: "comparable" also needs the difference within this much held-out accuracy
COMPARABLE_ABS = 0.03
#: a Welch p below this decides a "greater" or "comparable" check
ALPHA = 0.05


class Verdict(Enum):
    SUPPORTS = "supports"
    CONTRADICTS = "contradicts"
    NOT_REPRODUCED = "not reproduced"
    CANNOT_TELL = "cannot tell"
    NOT_RUN = "not run"


@dataclass(frozen=True)
class Check:
    """One check's outcome: the verdict, the test that decided it, the seeds per arm and the numbers."""

    verdict: Verdict
    test: str
    seeds: tuple[int, int]
    numbers: str
    horizon: int | None = None  # gradient steps, for NOT_REPRODUCED

    def label(self) -> str:
        if self.verdict is Verdict.NOT_REPRODUCED:
            return f"not reproduced within {self.horizon} steps"
        if self.verdict is Verdict.CANNOT_TELL and min(self.seeds) < 2:
            return "cannot tell (1 seed)"
        return self.verdict.value


def _not_run(a: str, b: str) -> Check:
    return Check(Verdict.NOT_RUN, "—", (0, 0), f"{a} or {b} has no runs")


def greater(arms: dict[str, list[Run]], a: str, b: str, key: str = "final") -> Check:
    """"a > b" in a run statistic (``run_stats`` key): Welch t over the seeds of each arm."""
    va, vb = values(arms, a, key), values(arms, b, key)
    if not va or not vb:
        return _not_run(a, b)
    fmt = "{:+.2e}" if key == "kl" else "{:+.3f}"
    seeds = (len(va), len(vb))
    test = welch(va, vb)
    if test is None:
        diff = statistics.mean(va) - statistics.mean(vb)
        return Check(Verdict.CANNOT_TELL, "Welch t", seeds, f"{key} {a} − {b} = {fmt.format(diff)} (seeds {seeds[0]}/{seeds[1]})")
    numbers = f"{key} {a} − {b} = {test.describe(fmt)} (seeds {seeds[0]}/{seeds[1]})"
    if test.p >= ALPHA:
        return Check(Verdict.CANNOT_TELL, "Welch t", seeds, numbers)
    return Check(Verdict.SUPPORTS if test.diff > 0 else Verdict.CONTRADICTS, "Welch t", seeds, numbers)


def comparable(arms: dict[str, list[Run]], a: str, b: str, key: str) -> Check:
    """"a ≈ b": within COMPARABLE_ABS and not different by Welch t (supports); different and farther apart
    than COMPARABLE_ABS (contradicts); else cannot tell."""
    va, vb = values(arms, a, key), values(arms, b, key)
    if not va or not vb:
        return _not_run(a, b)
    seeds = (len(va), len(vb))
    test = welch(va, vb)
    if test is None:
        diff = statistics.mean(va) - statistics.mean(vb)
        return Check(Verdict.CANNOT_TELL, "Welch t", seeds, f"{key} {a} − {b} = {diff:+.3f} (seeds {seeds[0]}/{seeds[1]})")
    numbers = f"{key} {a} − {b} = {test.describe('{:+.3f}')} (seeds {seeds[0]}/{seeds[1]})"
    if abs(test.diff) <= COMPARABLE_ABS and test.p >= ALPHA:
        return Check(Verdict.SUPPORTS, f"abs. diff. ≤ {COMPARABLE_ABS} and Welch t", seeds, numbers)
    if abs(test.diff) > COMPARABLE_ABS and test.p < ALPHA:
        return Check(Verdict.CONTRADICTS, f"abs. diff. > {COMPARABLE_ABS} and Welch t", seeds, numbers)
    return Check(Verdict.CANNOT_TELL, "Welch t", seeds, numbers)


def collapses(arms: dict[str, list[Run]], arm: str, reference: str) -> Check:
    """"arm collapses and reference does not" (collapse per seed as in the tables): supports when most seeds
    of ``arm`` collapse and most of ``reference`` do not; not reproduced within the horizon when no seed of
    ``arm`` collapses; else cannot tell."""
    got, ref = values(arms, arm, "collapsed"), values(arms, reference, "collapsed")
    if not got or not ref:
        return _not_run(arm, reference)
    ent = values(arms, arm, "entropy_change")
    horizon = max(int(run["rows"][-1]["step"]) * run["n"] for run in arms[arm])
    numbers = (f"{arm} collapsed in {sum(got)}/{len(got)} seeds, {reference} in {sum(ref)}/{len(ref)}, "
               f"within {horizon} gradient steps"
               + (f"; entropy change over the run {statistics.mean(ent):+.3f}" if ent else ""))
    seeds = (len(got), len(ref))
    if min(seeds) < 2:
        return Check(Verdict.CANNOT_TELL, "collapse count", seeds, numbers)
    if sum(got) * 2 > len(got) and sum(ref) * 2 < len(ref):
        return Check(Verdict.SUPPORTS, "collapse count (majority vs minority of seeds)", seeds, numbers)
    if sum(got) == 0:
        return Check(Verdict.NOT_REPRODUCED, "collapse count", seeds, numbers, horizon=horizon)
    return Check(Verdict.CANNOT_TELL, "collapse count", seeds, numbers)


def stable(arms: dict[str, list[Run]], arm: str) -> Check:
    got = values(arms, arm, "collapsed")
    if not got:
        return _not_run(arm, arm)
    verdict = Verdict.CONTRADICTS if any(got) else Verdict.SUPPORTS
    return Check(verdict, "no seed collapses", (len(got), len(got)), f"{arm} collapsed in {sum(got)}/{len(got)} seeds")


#: (paper source, claim, [(check, arm a, arm b, key)]); check in greater / comparable / collapses / stable
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
        ("stable", "onpolicy/minirl_lennorm", "onpolicy/minirl_lennorm", "collapsed")]),
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


def run_check(arms: dict[str, list[Run]], kind: str, a: str, b: str, key: str) -> tuple[str, Check]:
    """(what is checked, in words; its outcome)."""
    if kind == "collapses":
        return f"{a} collapses, {b} does not", collapses(arms, a, b)
    if kind == "stable":
        return f"{a} stable", stable(arms, a)
    if kind == "comparable":
        return f"{a} ≈ {b} ({key})", comparable(arms, a, b, key)
    what = f"{b} has lower KL than {a}" if key == "kl" else f"{a} > {b} ({key})"
    return what, greater(arms, a, b, key)


def claims_section(runs: Runs) -> list[str]:
    """Markdown: each of the paper's claims, each check's verdict with its test, n and numbers."""
    arms = flat(runs)
    if not any(arm in arms for _, _, checks in CLAIMS for _, a, b, _ in checks for arm in (a, b)):
        return []
    lines = ["## The paper's claims, checked", "",
             f"Verdicts: *supports* / *contradicts* when a two-sided Welch t-test over seeds rejects no difference at "
             f"{ALPHA:.0%} (for ≈, the difference must also be within {COMPARABLE_ABS} held-out accuracy); *not reproduced "
             "within N steps* when no seed of an arm the paper says collapses did so within the horizon; else *cannot "
             "tell*. Collapse checks need a majority of seeds collapsing and the reference arm not. No multiplicity "
             "correction across the rows.", "",
             "| source | claim | check | verdict | test | numbers |", "|---|---|---|---|---|---|"]
    unchecked = []  # a partial sweep (e.g. experiments/horizon) runs few arms: one line, not a row per check
    for source, claim, checks in CLAIMS:
        ran = [check for check in checks if check[1] in arms and check[2] in arms]
        missing = [f"{c[1]} vs {c[2]}" if c[1] != c[2] else c[1] for c in checks if c not in ran]
        unchecked += [f"{claim} ({source})"] if not ran else missing
        for i, (kind, a, b, key) in enumerate(ran):
            what, check = run_check(arms, kind, a, b, key)
            lines.append(f"| {source if i == 0 else ''} | {claim if i == 0 else ''} | {what} | **{check.label()}** "
                         f"| {check.test} | {check.numbers} |")
    if unchecked:
        lines += ["", f"Not checked, an arm has no runs here: {'; '.join(unchecked)}."]
    return lines + [""]


# ----------------------------------------------------------------------------- stress study, paired effects

_REPLAYS = {"none": "", "R2": "_r2", "R3": "_r3"}


def _effect_cell(effect: tuple[float, float, int] | None, fmt: str = "{:+.3f}") -> str:
    if effect is None:
        return "—"
    mean, se, n = effect
    if not math.isfinite(se):
        return f"{fmt.format(mean)} (1 pair)"
    mark = " **beyond noise**" if abs(mean) > t_critical(n - 1) * se else ""
    return f"{fmt.format(mean)} ± {fmt.format(se)[1:]} (n={n}){mark}"


def stress_section(runs: Runs, conditions: dict[str, str]) -> list[str]:
    """Markdown: per stress condition (``conditions``: name -> axis, in table order), the paired effects of
    clipping, replay and IS on the final held-out score, with the first-order diagnostics."""
    present = [c for c in conditions if c in runs]
    if not present:
        return []
    lines = ["## Stress study: paired effects per condition", "",
             "Each cell: mean over pairs of arms that differ in that knob only (final held-out score, a − b) ± its "
             "standard error **across the pairs** — the spread of the effect over settings (N, replay, clip), not "
             "seed-to-seed noise; **beyond noise** when a one-sample t-test over the pairs rejects no effect at 95 % "
             "(|mean| > t(n − 1) SE: 3.18 SE for 4 pairs, 2.57 for 6). About 42 such cells are tested (7 conditions × "
             "6 columns) with no multiplicity correction, so one or two marks are expected by chance. Clip: the 6 pairs "
             "(N = 4, 8) × (replay none, R2, R3). Replay: the 4 pairs (N = 4, 8) × (clip, no clip). IS: the on-policy "
             "pair, over its matched seeds when it ran more than one (seed s against seed s: there the SE is seed "
             "noise). Arms with several seeds enter the pairs with their mean over seeds. The last two columns repeat "
             "the clip pairs on the training reward and the policy entropy averaged over the last 25 % of steps. "
             "Residual and cosine: means over the condition's arms (the unclipped arms' cosine separately, since the "
             "clipping mask itself moves the surrogate's gradient away from Eq. (2)). Collapsed runs: as in the "
             "tables (below half the peak until the end); 'recovered': runs that fell below half their running peak "
             "and came back.", "",
             "| condition | axis | residual (last mb) | grad cosine clip / no clip | clip − no clip | R2 − none | R3 − none "
             "| IS − no IS (N = 1) | collapsed runs | clip − no clip, training reward (last 25 %) "
             "| clip − no clip, entropy (last 25 %) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    offpolicy = [(n, rep) for n in (4, 8) for rep in _REPLAYS.values()]
    for cond in present:
        arms = runs[cond]
        def name(arm: str, cond: str = cond) -> str:
            return f"{cond}/{arm}"

        clip_pairs = [(name(f"n{n}_minirl{rep}"), name(f"n{n}_minirl{rep}_noclip")) for n, rep in offpolicy]
        clip = paired_effect(arms, clip_pairs)
        clip_reward, clip_entropy = (paired_effect(arms, clip_pairs, key) for key in ("late_reward", "late_entropy"))
        replay = {r: paired_effect(arms, [(name(f"n{n}_minirl{_REPLAYS[r]}{c}"), name(f"n{n}_minirl{c}"))
                                          for n in (4, 8) for c in ("", "_noclip")]) for r in ("R2", "R3")}
        is_effect = paired_effect(arms, [(name("onpolicy_minirl"), name("onpolicy_minirl_no_is"))])
        residuals = [v for arm in arms if (v := arm_value(arms, arm, "residual/last_total_mean")) is not None]
        cos = {kind: [v for arm in arms if arm.endswith("_noclip") == (kind == "noclip") and "onpolicy" not in arm
                      and (v := arm_value(arms, arm, "fidelity/last_grad_cosine")) is not None] for kind in ("clip", "noclip")}
        stats = [run_stats(run) for rs in arms.values() for run in rs]
        collapsed = sum(1 for st in stats if st["collapsed"])
        recovered = sum(1 for st in stats if st["dipped"] and not st["collapsed"])
        fmt_cos = "/".join(f"{statistics.mean(v):.3f}" if v else "—" for v in cos.values())
        residual = f"{statistics.mean(residuals):.2e}" if residuals else "—"
        lines.append(f"| {cond} | {conditions[cond]} | {residual} | {fmt_cos} | {_effect_cell(clip)} | "
                     f"{_effect_cell(replay['R2'])} | {_effect_cell(replay['R3'])} | {_effect_cell(is_effect)} | "
                     f"{collapsed}/{len(stats)}{f', {recovered} recovered' if recovered else ''} | "
                     f"{_effect_cell(clip_reward)} | {_effect_cell(clip_entropy, '{:+.4f}')} |")
    return lines + [""]
