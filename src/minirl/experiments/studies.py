"""The pre-registered studies' analysis (``experiments/studies/PREREGISTRATION.md``), fixed before any run.

Each study is a list of planned comparisons "a − b > 0 in a per-run statistic". Every comparison is a
paired t-test over the seeds both arms ran (seed s of a against seed s of b), with a 95 % t interval; the
p-values of one study are Holm-adjusted together. Decision rule: *supports* when the Holm-adjusted p is
below 0.05 and a − b > 0, *contradicts* when it is below 0.05 and a − b < 0, *cannot tell* otherwise
(*not run* when an arm lacks two matched seeds). ``python -m minirl.experiments verdicts RUNS_DIR STUDY``
prints the table, and only once every registered run (each arm × seeds 0..S-1, at the registered horizon)
has finished: before that it names the missing runs and exits 1, and ``--interim`` prints the numbers
with *interim* in place of every verdict (looking early must not become optional stopping).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from minirl.experiments.analysis import (
    Comparison,
    deepest_drop,
    holm,
    late_mean,
    paired,
)
from minirl.experiments.claims import Check, Verdict
from minirl.experiments.runs import Run, series

ALPHA = 0.05


@dataclass(frozen=True)
class Planned:
    """One planned comparison: the claim is ``a − b > 0`` in ``statistic`` (see ``run_statistic``)."""

    name: str
    a: str
    b: str
    statistic: str
    primary: bool


def run_statistic(run: Run, name: str) -> float | None:
    """``final``: mean held-out accuracy of the run's last two evaluations (one evaluation is noisier);
    ``deepest_drop``: the largest fall below the running peak, as a fraction of it (0 if none);
    ``late_entropy``: mean training entropy over the last 25 % of logged steps."""
    if name == "final":
        _, ys = series(run, "eval/accuracy")
        return statistics.mean(ys[-2:]) if ys else None
    if name == "deepest_drop":
        drop = deepest_drop(*series(run, "eval/accuracy"))
        return drop[0] if drop is not None else None
    if name == "late_entropy":
        return late_mean(series(run, "train/entropy")[1])
    raise ValueError(f"unknown statistic {name!r}")


STUDIES: dict[str, list[Planned]] = {
    "study1_replay": [
        Planned("N = 2: R2 beats R3", "n2_r2", "n2_r3", "final", primary=True),
        Planned("N = 8: R3 beats R2", "n8_r3", "n8_r2", "final", primary=True),
        Planned("N = 2: R2 beats no replay", "n2_r2", "n2_none", "final", primary=False),
        Planned("N = 2: R3 beats no replay", "n2_r3", "n2_none", "final", primary=False),
        Planned("N = 8: R2 beats no replay", "n8_r2", "n8_none", "final", primary=False),
        Planned("N = 8: R3 beats no replay", "n8_r3", "n8_none", "final", primary=False),
    ],
    "study2_is": [
        Planned("IS correction ends higher", "onpolicy_is", "onpolicy_no_is", "final", primary=True),
        Planned("without IS the run falls further", "onpolicy_no_is", "onpolicy_is", "deepest_drop", primary=True),
        Planned("without IS the entropy drops", "onpolicy_is", "onpolicy_no_is", "late_entropy", primary=False),
    ],
}


@dataclass(frozen=True)
class Registration:
    """What a study registered besides its comparisons: seeds 0..seeds-1 of every arm, each run to
    ``gradient_steps`` (the arm table's ``gradient_steps``; a test keeps the two equal)."""

    arms: tuple[str, ...]
    seeds: int
    gradient_steps: int


REGISTERED = {
    "study1_replay": Registration(("n2_none", "n2_r2", "n2_r3", "n8_none", "n8_r2", "n8_r3"), seeds=6, gradient_steps=256),
    "study2_is": Registration(("onpolicy_is", "onpolicy_no_is"), seeds=6, gradient_steps=256),
}


def missing_runs(arms: dict[str, list[Run]], study: str) -> tuple[int, list[str]]:
    """(finished registered runs, one phrase per registered run not finished: ``n8_r2 seed 3 (at 96 of 256
    gradient steps)`` or ``n8_r2 seed 4 (not started)``). Finished: it logged its last gradient step."""
    plan = REGISTERED[study]
    done, missing = 0, []
    for arm in plan.arms:
        reached = {run["seed"]: max((int(row["step"]) * run["n"] for row in run["rows"] if "step" in row), default=0)
                   for run in arms.get(arm, [])}
        for seed in range(plan.seeds):
            steps = reached.get(f"seed{seed}")
            if steps is not None and steps >= plan.gradient_steps:
                done += 1
            else:
                where = "not started" if steps is None else f"at {steps} of {plan.gradient_steps} gradient steps"
                missing.append(f"{arm} seed {seed} ({where})")
    return done, missing


#: a study's registered mismatch condition: (arm, least whole-run mean train-infer KL (k3) over its runs)
KL_FLOOR = {"study2_is": ("onpolicy_no_is", 1e-2)}


def kl_condition(arms: dict[str, list[Run]], study: str) -> str | None:
    """One line: whether the study's registered mismatch condition held in its runs (None: it has none)."""
    if study not in KL_FLOOR:
        return None
    arm, floor = KL_FLOOR[study]
    means = [statistics.mean(ys) for run in arms.get(arm, []) if (ys := series(run, "mismatch/kl_k3")[1])]
    if not means:
        return f"Registered mismatch condition (mean KL of {arm} ≥ {floor:g}): not measured, no runs."
    level = statistics.mean(means)
    return (f"Registered mismatch condition: whole-run mean train-infer KL (k3) of {arm} = {level:.2e} over "
            f"{len(means)} runs, {'met' if level >= floor else 'NOT met'} (≥ {floor:g}).")


def _per_seed(runs: list[Run], statistic: str) -> dict[str, float]:
    return {run["seed"]: v for run in runs if (v := run_statistic(run, statistic)) is not None}


def study_verdicts(arms: dict[str, list[Run]], planned: list[Planned]) -> list[tuple[Planned, Comparison | None, Check]]:
    """Each planned comparison with its paired test and its verdict under the Holm-adjusted decision rule."""
    tests = [paired(_per_seed(arms.get(p.a, []), p.statistic), _per_seed(arms.get(p.b, []), p.statistic)) for p in planned]
    ran = [i for i, t in enumerate(tests) if t is not None]
    adjusted = dict(zip(ran, holm([tests[i].p for i in ran])))  # type: ignore[union-attr]
    out: list[tuple[Planned, Comparison | None, Check]] = []
    for i, (plan, test) in enumerate(zip(planned, tests)):
        if test is None:
            out.append((plan, None, Check(Verdict.NOT_RUN, "paired t, Holm", (0, 0), f"{plan.a} or {plan.b}: < 2 matched seeds")))
            continue
        p_holm = adjusted[i]
        verdict = Verdict.CANNOT_TELL if p_holm >= ALPHA else Verdict.SUPPORTS if test.diff > 0 else Verdict.CONTRADICTS
        numbers = f"{plan.statistic} {plan.a} − {plan.b} = {test.describe('{:+.3f}')}; Holm p = {p_holm:.3f}"
        out.append((plan, test, Check(verdict, f"paired t over seeds, Holm over {len(ran)}", (test.n, test.n), numbers)))
    return out


class StudyIncomplete(Exception):
    """A study's verdicts were asked for before every registered run finished (the message says which)."""


def study_section(arms: dict[str, list[Run]], study: str, *, interim: bool = False) -> list[str]:
    """Markdown: the study's planned comparisons and their verdicts. Before every registered run has
    finished it raises ``StudyIncomplete``; ``interim=True`` prints the numbers with *interim* as verdict."""
    done, missing = missing_runs(arms, study)
    total = done + len(missing)
    if missing and not interim:
        raise StudyIncomplete(
            f"{study}: {done} of {total} registered runs finished; the pre-registered verdicts are taken on all of "
            f"them (missing: {', '.join(missing[:3])}{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}); "
            "--interim shows the numbers so far, marked interim")
    rows = [f"| {'**primary** ' if plan.primary else ''}{plan.name} | {plan.a} − {plan.b} ({plan.statistic}) | "
            f"**{'interim' if missing and check.verdict is not Verdict.NOT_RUN else check.label()}** | {check.test} | {check.numbers} |"
            for plan, _, check in study_verdicts(arms, STUDIES[study])]
    condition = kl_condition(arms, study)
    warning = ([f"**Interim: {done} of {total} registered runs finished. These numbers are not the study's verdicts; "
                "the decision rule is applied only when every registered run exists.**", ""] if missing else [])
    return [f"## {study}: pre-registered comparisons", "", *warning,
            "Each: paired t-test over matched seeds, 95 % t interval, p Holm-adjusted over the study's comparisons; "
            f"supports / contradicts when the adjusted p < {ALPHA} (by the sign of a − b), else cannot tell.", "",
            "| comparison | a − b (statistic) | verdict | test | numbers |", "|---|---|---|---|---|", *rows, "",
            *([condition, ""] if condition else [])]


def describe_plan(study: str) -> list[dict[str, Any]]:
    """The plan as data (for the pre-registration's table and its test)."""
    return [{"name": p.name, "a": p.a, "b": p.b, "statistic": p.statistic, "primary": p.primary} for p in STUDIES[study]]
