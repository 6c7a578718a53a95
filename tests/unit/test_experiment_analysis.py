"""Pure statistics of the experiments package, by hand-computed values: collapse and fall measures, the
claims' typed verdicts, Student's t / Welch / paired tests, Holm, and the stress study's paired effects."""

from __future__ import annotations

import math

import pytest

from minirl.experiments.analysis import (
    deepest_drop,
    fall_onsets,
    holm,
    late_mean,
    level_contrast,
    moving_mean,
    paired,
    paired_effect,
    steps_to_collapse,
    t_critical,
    t_two_sided_p,
    welch,
)
from minirl.experiments.claims import (
    Verdict,
    claims_section,
    collapses,
    comparable,
    greater,
    stress_section,
)
from minirl.experiments.runs import flat


def test_moving_and_late_means():
    assert moving_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_mean([2.0], 8) == [2.0]
    assert late_mean([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == 7.5  # the last quarter: 7, 8
    assert late_mean([4.0]) == 4.0 and late_mean([]) is None


def test_steps_to_collapse():
    assert steps_to_collapse([0, 10, 20, 30], [0.2, 0.6, 0.2, 0.1]) == 20
    assert steps_to_collapse([0, 10, 20, 30], [0.2, 0.6, 0.2, 0.5]) is None
    assert steps_to_collapse([0, 10], [0.0, 0.0]) is None


def test_deepest_drop_is_measured_from_the_running_peak():
    # running peaks 0.4, 0.4, 0.8, 0.8, 0.8: drops 0, 0.5 (0.2 at 10), 0, 0.75 (0.2 at 30), 0.25 (0.6 at 40)
    drop, where = deepest_drop([0, 10, 20, 30, 40], [0.4, 0.2, 0.8, 0.2, 0.6])
    assert where == 30 and abs(drop - 0.75) < 1e-12
    assert deepest_drop([0, 10, 20], [0.1, 0.3, 0.9]) == (0.0, 0)  # never below its best so far
    assert deepest_drop([0, 10], [0.0, 0.0]) is None
    # the recovered collapse of trace/n8_minirl_noclip seed 1 (held-out 0.453 -> 0.047, then back to 0.578)
    drop, where = deepest_drop([0, 16, 32, 48, 64], [0.453, 0.309, 0.047, 0.164, 0.578])
    assert where == 32 and abs(drop - (0.453 - 0.047) / 0.453) < 1e-12
    assert steps_to_collapse([0, 16, 32, 48, 64], [0.453, 0.309, 0.047, 0.164, 0.578]) is None


def _fake_runs(curves: dict[str, list[list[float]]]) -> dict:
    """setting -> arm -> runs with held-out curves (one list per seed), as load_runs returns them."""
    out: dict = {}
    for arm, seeds in curves.items():
        runs = [{"seed": f"seed{i}", "n": 1, "rows": [{"step": 10 * j, "eval/accuracy": y} for j, y in enumerate(ys)]}
                for i, ys in enumerate(seeds)]
        out.setdefault(arm.split("/")[0], {})[arm] = runs
    return out


def test_claim_verdicts_weigh_differences_against_seed_noise():
    arms = flat(_fake_runs({
        "onpolicy/minirl": [[0.5, 0.9], [0.5, 0.91], [0.5, 0.89]],
        "onpolicy/minirl_no_is": [[0.5, 0.8, 0.1], [0.5, 0.7, 0.2], [0.5, 0.9, 0.3]],  # collapses in every seed
        "onpolicy/minirl_r3": [[0.5, 0.92], [0.5, 0.70], [0.5, 0.95]],  # noisy
        "onpolicy/minirl_lennorm": [[0.5, 0.88]],  # one seed
    }))
    check = greater(arms, "onpolicy/minirl", "onpolicy/minirl_no_is", "final")
    # finals 0.90 vs 0.20: diff 0.70, SE = sqrt(0.0001/3 + 0.01/3) = 0.0580, t = 12.06,
    # Welch df = (0.0101/3)^2 / ((0.0001/3)^2/2 + (0.01/3)^2/2) = 2.04
    assert check.verdict is Verdict.SUPPORTS and check.seeds == (3, 3) and check.test == "Welch t"
    assert "+0.700 (SE 0.058," in check.numbers and "t = 12.06, df = 2.0" in check.numbers
    assert greater(arms, "onpolicy/minirl_no_is", "onpolicy/minirl", "final").verdict is Verdict.CONTRADICTS
    noisy = greater(arms, "onpolicy/minirl", "onpolicy/minirl_r3", "final")  # +0.043, SE 0.079
    assert noisy.verdict is Verdict.CANNOT_TELL and noisy.label() == "cannot tell"
    one = greater(arms, "onpolicy/minirl", "onpolicy/minirl_lennorm", "final")
    assert one.verdict is Verdict.CANNOT_TELL and one.label() == "cannot tell (1 seed)"
    assert greater(arms, "onpolicy/minirl", "n2/minirl_r2", "final").verdict is Verdict.NOT_RUN
    assert comparable(arms, "onpolicy/minirl", "onpolicy/minirl", "peak").verdict is Verdict.SUPPORTS
    assert comparable(arms, "onpolicy/minirl", "onpolicy/minirl_no_is", "final").verdict is Verdict.CONTRADICTS
    check = collapses(arms, "onpolicy/minirl_no_is", "onpolicy/minirl")
    assert check.verdict is Verdict.SUPPORTS and "collapsed in 3/3 seeds" in check.numbers and "in 0/3" in check.numbers
    # no seed collapsed within the horizon (10 gradient steps): not evidence against the paper
    none = collapses(arms, "onpolicy/minirl", "onpolicy/minirl_no_is")
    assert none.verdict is Verdict.NOT_REPRODUCED and none.label() == "not reproduced within 10 steps"


def test_claims_of_a_partial_sweep_keep_the_checks_that_ran_and_name_the_rest():
    lines = claims_section(_fake_runs({"onpolicy/minirl": [[0.5, 0.9]] * 3, "onpolicy/minirl_r3": [[0.5, 0.8]] * 3}))
    rows = [line for line in lines if line.startswith("| §") or line.startswith("|  |")]
    assert [" | Welch t | " in row for row in rows] == [True, False, True]  # no KL logged: not run
    assert [row.split(" | ")[2] for row in rows] == [  # the checks whose two arms both ran, in the claims' order
        "onpolicy/minirl > onpolicy/minirl_r3 (final)", "onpolicy/minirl_r3 has lower KL than onpolicy/minirl",
        "onpolicy/minirl > onpolicy/minirl_r3 (final)"]
    assert rows[0].startswith("| §6.5 (1), §6.1 | On-policy, MiniRL") and rows[1].startswith("| §2.6, §6.1 | On-policy, R3")
    unchecked = lines[-2]
    assert unchecked.startswith("Not checked, an arm has no runs here: onpolicy/minirl vs onpolicy/minirl_lennorm; ")
    assert "Different cold starts reach comparable final performance (§6.5 (3), §6.4)." in unchecked  # a whole claim
    assert "onpolicy/minirl vs onpolicy/minirl_r3;" not in unchecked and "onpolicy/minirl vs onpolicy/minirl_r3_no_is;" in unchecked
    assert unchecked.count("(§") == 8  # the claims none of whose checks ran
    lines = claims_section(_fake_runs({"coldstart/direct": [[0.5, 0.9]], "coldstart/stepwise": [[0.5, 0.9]]}))
    assert lines[-2].count("(§") == 9 and lines[-2].endswith("; coldstart/verbose vs coldstart/direct.")  # 9 of 10 claims


def test_stress_paired_effects_by_hand():
    runs = _fake_runs({
        "base/n4_minirl": [[0.5, 0.9]], "base/n4_minirl_noclip": [[0.5, 0.8]],
        "base/n8_minirl": [[0.5, 0.7]], "base/n8_minirl_noclip": [[0.5, 0.7]],
        "base/onpolicy_minirl": [[0.5, 0.9], [0.5, 0.8]], "base/onpolicy_minirl_no_is": [[0.5, 0.6]],
    })
    arms = flat(runs)
    pairs = [("base/n4_minirl", "base/n4_minirl_noclip"), ("base/n8_minirl", "base/n8_minirl_noclip"),
             ("base/n4_minirl_r2", "base/n4_minirl_r2_noclip")]  # the last pair did not run: left out
    mean, se, n = paired_effect(arms, pairs)
    assert (round(mean, 12), round(se, 12), n) == (0.05, 0.05, 2)  # diffs 0.1 and 0.0
    mean, se, n = paired_effect(arms, [("base/onpolicy_minirl", "base/onpolicy_minirl_no_is")])
    assert round(mean, 12) == 0.25 and n == 1 and math.isnan(se)  # seed mean 0.85 - 0.6
    table = "\n".join(stress_section(runs, {"base": "all", "lr3x": "step size"}))
    assert "| base | all | — | —/— | +0.050 ± 0.050 (n=2) | — | — | +0.250 (1 pair) | 0/7 |" in table
    # one pair of arms with matched seeds: the seeds are the units (diffs 0.3, 0.1, 0.2)
    seeded = flat(_fake_runs({"lr3x/onpolicy_minirl": [[0.5, 0.9], [0.5, 0.8], [0.5, 0.7]],
                               "lr3x/onpolicy_minirl_no_is": [[0.5, 0.6], [0.5, 0.7], [0.5, 0.5]]}))
    mean, se, n = paired_effect(seeded, [("lr3x/onpolicy_minirl", "lr3x/onpolicy_minirl_no_is")])
    assert (round(mean, 12), round(se, 12), n) == (0.2, round(0.1 / math.sqrt(3), 12), 3)
    assert stress_section(_fake_runs({"n2/minirl_r2": [[0.5, 0.9]]}), {"base": "all"}) == []




def test_student_t_tail_and_quantile_match_tables():
    # df = 2 has a closed form: P(|T| >= t) = 1 - t / sqrt(t^2 + 2)
    assert t_two_sided_p(2.5, 2) == pytest.approx(1 - 2.5 / math.sqrt(8.25), abs=1e-10)
    assert t_two_sided_p(1.0, 1) == pytest.approx(0.5, abs=1e-10)  # Cauchy: 1 - 2 atan(1) / pi
    assert t_two_sided_p(2.0, 3) == pytest.approx(0.139326, abs=1e-6)  # printed t tables
    assert t_critical(2) == pytest.approx(4.302653, abs=1e-5) and t_critical(9) == pytest.approx(2.262157, abs=1e-5)
    assert t_critical(5) == pytest.approx(2.570582, abs=1e-5) and t_two_sided_p(0.0, 4) == pytest.approx(1.0)


def test_welch_and_paired_tests_by_hand():
    w = welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0])
    # diff -3.5; var/n 1/3 and (5/3)/4 = 5/12; SE sqrt(0.75); df = 0.75^2 / ((1/3)^2/2 + (5/12)^2/3) = 4.959
    assert w.diff == pytest.approx(-3.5) and w.se == pytest.approx(math.sqrt(0.75))
    assert w.df == pytest.approx(0.5625 / (1 / 18 + 25 / 432)) and w.t == pytest.approx(-3.5 / math.sqrt(0.75))
    assert w.n == 7 and not w.paired and w.low < w.diff < w.high
    p = paired({0: 1.0, 1: 2.0, 2: 4.0, 9: 5.0}, {0: 0.0, 1: 1.0, 2: 1.0})  # seed 9 unmatched: left out
    # diffs 1, 1, 3: mean 5/3, SD sqrt(4/3), SE 2/3, t = 2.5 on 2 df, p = 1 - 2.5 / sqrt(8.25)
    assert (p.diff, p.se, p.t, p.df, p.n) == pytest.approx((5 / 3, 2 / 3, 2.5, 2, 3))
    assert p.p == pytest.approx(1 - 2.5 / math.sqrt(8.25)) and p.paired
    half = 4.302653 * 2 / 3
    assert (p.low, p.high) == pytest.approx((5 / 3 - half, 5 / 3 + half), abs=1e-5)
    assert welch([1.0], [2.0, 3.0]) is None and paired({0: 1.0}, {0: 2.0}) is None


def test_holm_adjusts_in_input_order():
    # sorted 0.01, 0.03, 0.04 -> x3 = 0.03, x2 = 0.06, x1 = 0.04 -> monotone 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0]) and holm([]) == []


def test_level_contrast_states_both_tests_and_the_seed_count():
    runs = {"a": [{"seed": f"seed{i}", "n": 1, "rows": [{"step": s, "mismatch/kl_k3": v} for s, v in enumerate(vals)]}
                  for i, vals in enumerate([[1.0, 3.0, 5.0, 7.0], [2.0, 2.0, 2.0, 2.0], [4.0, 4.0, 4.0, 6.0]])],
            "b": [{"seed": f"seed{i}", "n": 1, "rows": [{"step": s, "mismatch/kl_k3": v} for s, v in enumerate(vals)]}
                  for i, vals in enumerate([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 3.0], [2.0, 2.0, 2.0, 2.0]])]}
    whole = "\n".join(level_contrast(runs, "a", "b"))
    # run means a: 4, 2, 4.5; b: 1, 1.5, 2 -> diffs 3, 0.5, 2.5: mean 2, paired SE sqrt(1.75/3)
    assert "a: mean 3.5 over 3 seeds" in whole and "b: mean 1.5 over 3 seeds" in whole
    assert "a above b in 3/3 matched seeds" in whole and "paired: +2 (SE 0.764" in whole
    last = "\n".join(level_contrast(runs, "a", "b", fraction=0.25))  # last value: 7, 2, 6 vs 1, 3, 2
    assert "a above b in 2/3 matched seeds" in last and "last 25% of logged steps" in last


def test_fall_onsets_order_kl_and_entropy_by_hand():
    # N = 1; held-out peak at 4; KL 1e-4 up to the peak (ref 1e-4), 2e-4 at 5, 4e-4 at 6 (>= 3x: KL rise at 6);
    # entropy 0.1 up to the peak, 0.2 at 7 (>= 1.5x: blow-up at 7) -> KL first
    rows = [{"step": s, "mismatch/kl_k3": k, "train/entropy": e}
            for s, k, e in [(1, 1e-4, 0.1), (2, 1e-4, 0.1), (3, 1e-4, 0.1), (4, 1e-4, 0.1), (5, 2e-4, 0.1),
                            (6, 4e-4, 0.12), (7, 5e-4, 0.2), (8, 5e-4, 0.2)]]
    run = {"seed": "seed0", "n": 1, "rows": rows}
    got = fall_onsets(run, peak_step=4, drop_step=8)
    assert (got["kl_step"], got["entropy_step"], got["order"], got["entropy_kind"]) == (6, 7, "KL first", "blow-up")
    same = {**run, "rows": [{**r, "mismatch/kl_k3": 1e-3} if r["step"] >= 7 else {**r, "mismatch/kl_k3": 1e-4}
                            for r in rows]}
    assert fall_onsets(same, 4, 8)["order"] == "same step"
    assert fall_onsets(run, 4, 6)["order"] == "KL only"  # the entropy moved after the low
    calm = {**run, "rows": [{**r, "mismatch/kl_k3": 1e-4, "train/entropy": 0.1} for r in rows]}
    assert fall_onsets(calm, 4, 8)["order"] == "neither"


def test_renamed_keys_are_written_new_and_read_in_either_spelling():
    from minirl.experiments.arms import schema_key, to_current, to_schema

    old = {"optim": {"steps": 64, "lr": 3e-4, "warmup_steps": 10}, "cold_start": {"steps": 400}}
    new = to_current(old)
    # the new names in place (the key order kept), other sections' `steps` untouched
    assert list(new["optim"].items()) == [("global_steps", 64), ("lr", 3e-4), ("warmup_updates", 10)]
    assert new["cold_start"] == {"steps": 400} and old["optim"]["steps"] == 64  # a copy
    # whichever spelling the installed schema uses, both spellings reach it
    spelled = schema_key("optim.global_steps").split(".")[1]
    assert to_schema(old)["optim"][spelled] == to_schema(new)["optim"][spelled] == 64
    assert schema_key("optim.steps") == schema_key("optim.global_steps") and schema_key("eval.every_steps") == "eval.every_steps"


def _study_runs(finals: dict[str, list[list[float]]]) -> dict:
    """arm -> runs (seed i) whose held-out curves are the given lists (evaluations 16 gradient steps apart)."""
    return {arm: [{"seed": f"seed{i}", "n": 1, "rows": [{"step": 16 * j, "eval/accuracy": y, "train/entropy": 0.1 + y / 10}
                                                          for j, y in enumerate(ys)]} for i, ys in enumerate(curves)]
            for arm, curves in finals.items()}


def test_study_verdicts_pair_seeds_and_holm_adjust_on_synthetic_runs():
    from minirl.experiments.studies import STUDIES, run_statistic, study_section, study_verdicts

    # study 2: IS ends at 0.8 / 0.7 / 0.9 (last two evaluations), no IS at 0.5 / 0.45 / 0.6 after falling from 0.7
    arms = _study_runs({"onpolicy_is": [[0.5, 0.8, 0.8], [0.5, 0.7, 0.7], [0.5, 0.9, 0.9]],
                        "onpolicy_no_is": [[0.5, 0.7, 0.3], [0.5, 0.6, 0.3], [0.5, 0.7, 0.5]]})
    assert run_statistic(arms["onpolicy_no_is"][0], "final") == pytest.approx(0.5)  # (0.7 + 0.3) / 2
    assert run_statistic(arms["onpolicy_no_is"][0], "deepest_drop") == pytest.approx(0.4 / 0.7)
    got = study_verdicts(arms, STUDIES["study2_is"])
    (_plan, test, check) = got[0]
    # final diffs per seed: 0.8 - 0.5, 0.7 - 0.45, 0.9 - 0.6 = 0.3, 0.25, 0.3: mean 0.28333, SD 0.028868, SE 0.016667
    assert test.diff == pytest.approx(0.85 / 3) and test.se == pytest.approx(0.05 / math.sqrt(3) / math.sqrt(3))
    assert test.df == 2 and test.paired
    ps = [t.p for _, t, _ in got]
    adjusted = holm(ps)
    assert f"Holm p = {adjusted[0]:.3f}" in check.numbers and check.seeds == (3, 3)
    assert check.verdict is (Verdict.SUPPORTS if adjusted[0] < 0.05 else Verdict.CANNOT_TELL)
    assert check.verdict is Verdict.SUPPORTS  # t = 17.0 on 2 df: p = 0.0034, x3 = 0.010
    # an arm that did not run: not run, and the others are adjusted among themselves only
    partial = study_verdicts({"n2_r2": arms["onpolicy_is"], "n2_r3": arms["onpolicy_no_is"]}, STUDIES["study1_replay"])
    assert [c.verdict for _, _, c in partial][1:] == [Verdict.NOT_RUN] * 5
    assert partial[0][2].verdict is Verdict.SUPPORTS and "Holm over 1" in partial[0][2].test
    # reversed arms: the sign flips the verdict
    flipped = study_verdicts({"n8_r3": arms["onpolicy_no_is"], "n8_r2": arms["onpolicy_is"]}, STUDIES["study1_replay"])
    assert flipped[1][2].verdict is Verdict.CONTRADICTS
    table = "\n".join(study_section(arms, "study2_is", interim=True))
    assert "| **primary** IS correction ends higher | onpolicy_is − onpolicy_no_is (final) | **interim** |" in table
    assert "mean KL of onpolicy_no_is ≥ 0.01): not measured, no runs." in table  # the synthetic runs log no KL
    for i, run in enumerate(arms["onpolicy_no_is"]):  # whole-run means 1e-2, 2e-2, 0 -> 1e-2: met
        run["rows"] += [{"step": 1, "mismatch/kl_k3": 1e-2 * i}, {"step": 2, "mismatch/kl_k3": 1e-2 * i}]
    assert "= 1.00e-02 over 3 runs, met (≥ 0.01)." in "\n".join(study_section(arms, "study2_is", interim=True))
    arms["onpolicy_no_is"][2]["rows"][-1]["mismatch/kl_k3"] = 0.0  # 1e-2 -> (0 + 1e-2 + 1e-2) / 3
    assert "NOT met" in "\n".join(study_section(arms, "study2_is", interim=True))


def test_study_verdicts_wait_for_every_registered_run():
    """Pre-registered: 6 seeds per arm at 256 gradient steps. Before all exist the table says interim (or,
    without ``interim``, the call refuses, naming what is missing), so looking early cannot pick the verdict."""
    from minirl.experiments.studies import REGISTERED, StudyIncomplete, missing_runs, study_section

    assert REGISTERED["study2_is"].seeds == 6 and REGISTERED["study2_is"].gradient_steps == 256
    good, bad = [0.5, 0.8, 0.8], [0.5, 0.7, 0.3]  # evaluations at gradient steps 0, 128, 256 (n = 2: steps 0, 64, 128)
    arms = _study_runs({"onpolicy_is": [good] * 6, "onpolicy_no_is": [bad] * 6})
    for runs in arms.values():
        for run in runs:
            run["n"] = 2
            for j, row in enumerate(run["rows"]):
                row["step"] = 64 * j
    assert missing_runs(arms, "study2_is") == (12, [])
    table = "\n".join(study_section(arms, "study2_is"))
    assert "Interim" not in table and "| **primary** IS correction ends higher | onpolicy_is − onpolicy_no_is (final) | **supports** |" in table
    arms["onpolicy_no_is"][3]["rows"].pop()  # seed 3 stopped at gradient step 128
    del arms["onpolicy_is"][5]  # seed 5 never ran
    assert missing_runs(arms, "study2_is") == (
        10, ["onpolicy_is seed 5 (not started)", "onpolicy_no_is seed 3 (at 128 of 256 gradient steps)"])
    with pytest.raises(StudyIncomplete, match=r"study2_is: 10 of 12 registered runs finished; .*onpolicy_is seed 5"):
        study_section(arms, "study2_is")
    table = "\n".join(study_section(arms, "study2_is", interim=True))
    assert "**Interim: 10 of 12 registered runs finished." in table
    assert "| **primary** IS correction ends higher | onpolicy_is − onpolicy_no_is (final) | **interim** |" in table
    assert "supports" not in table.split("else cannot tell.")[1]


def test_holm_can_turn_a_nominal_difference_into_cannot_tell():
    from minirl.experiments.studies import Planned, study_verdicts

    # diffs 0.1, 0.2, 0.15 -> t = 0.15 / (0.05 / sqrt 3) = 5.196 on 2 df: p = 0.0351 alone (< 0.05) ...
    arms = _study_runs({"a": [[0.5, 0.6, 0.6], [0.5, 0.7, 0.7], [0.5, 0.65, 0.65]],
                        "b": [[0.5, 0.5, 0.5]] * 3})
    one = study_verdicts(arms, [Planned("x", "a", "b", "final", True)])
    assert one[0][1].p == pytest.approx(1 - 5.196152 / math.sqrt(5.196152**2 + 2), abs=1e-5)
    assert one[0][2].verdict is Verdict.SUPPORTS
    # ... but with a second comparison whose p is larger, Holm doubles the smallest: 0.070 -> cannot tell
    two = study_verdicts(arms, [Planned("x", "a", "b", "final", True), Planned("y", "b", "a", "deepest_drop", False)])
    assert two[0][2].verdict is Verdict.CANNOT_TELL


def test_every_arm_of_a_study_shares_one_cold_start():
    """The registered protocol: one SFT per study for every arm and seed. The cache key must not see what only RL
    reads (N, prompts per step, RL's evaluation interval); before, N = 2 and N = 8 arms got two cold starts."""
    from pathlib import Path

    from minirl.experiments.arms import load_arm
    from minirl.sft import sft_cache_key

    root = Path(__file__).resolve().parents[2] / "experiments" / "studies"
    for study in ("study1_replay", "study2_is"):
        arms = sorted(p for p in (root / study).glob("*.yaml") if p.name != "arms.yaml")
        keys = {sft_cache_key(load_arm(p, [f"run.seed={seed}"])) for p in arms for seed in range(6)}
        assert len(arms) >= 2 and len(keys) == 1, (study, keys)


def test_plot_draws_every_seed_even_without_a_fall(tmp_path):
    """Issue 23: the figures show every seed. A calm study (no fall) still gets its per-seed panels; the
    falls figure only when something fell."""
    import json

    from minirl.experiments.plots import plot

    for arm, seeds in (("n2_r2", 3), ("n2_r3", 2)):
        for seed in range(seeds):
            run = tmp_path / arm / f"seed{seed}"
            run.mkdir(parents=True)
            (run / "config.yaml").write_text("optim:\n  minibatches_per_step: 2\n")
            rows = [{"step": 16 * j, "eval/accuracy": y, "train/reward_mean": y} for j, y in enumerate([0.8, 0.85, 0.86])]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sorted(p.name for p in plot(tmp_path)) == ["n2.png", "n2_seeds.png"]
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"n2.png", "n2_seeds.png"}
