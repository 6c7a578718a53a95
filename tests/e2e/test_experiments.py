"""The paper's experiments in miniature: generated arm configs, a resumable quick sweep, plot, report."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minirl.config import ConfigError
from minirl.experiments import (
    ARMS,
    EXPERIMENTS,
    deepest_drop,
    find_arms,
    generate,
    load_arm,
    steps_to_collapse,
)

ROOT = Path(__file__).resolve().parents[2]


def _minirl(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minirl.cli", *args], check=False, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_generate_reproduces_the_committed_arm_files():
    assert generate(EXPERIMENTS, check=True) == []
    assert {name for name, _ in find_arms(EXPERIMENTS)} == set(ARMS)


def test_every_arm_keeps_the_mini_batch_and_pins_its_knobs():
    for name, path in find_arms(EXPERIMENTS):
        cfg = load_arm(path)
        n = cfg.optim.minibatches_per_step
        assert cfg.minibatch_sequences == 64, name  # 8 prompts x 8 samples per gradient update, every arm
        assert cfg.rollout.prompts_per_step == 8 * n, name
        assert (cfg.rollout.precision, cfg.rollout.fp8_scale) == ("fp8_e4m3", "per_tensor")
        # every arm makes the same gradient steps and evaluates at the same gradient steps
        steps = 256 if name.startswith("coldstart/") else 128  # the cold starts meet (or not) over a longer horizon
        assert (cfg.optim.steps * n, cfg.eval.every_steps * n, cfg.checkpoint.every_steps * n) == (steps, 16, 16), name
        assert cfg.cold_start.seed == 0 and cfg.cold_start.enabled, name  # one cold start shared by the RL seeds
        assert name.split("/")[0] in ("onpolicy", "coldstart") or n == int(name.split("/")[0][1:]), name
        # the cold-start arms fit every teacher style to the same SFT loss; the others keep the base's 400 steps
        fit = (2000, 0.02, 20) if name.startswith("coldstart/") else (400, None, 20)
        assert (cfg.cold_start.steps, cfg.cold_start.until_loss, cfg.cold_start.loss_window_steps) == fit, name
    assert load_arm(EXPERIMENTS / "onpolicy/minirl_r3_no_is.yaml").algo.is_correction is False
    assert load_arm(EXPERIMENTS / "onpolicy/minirl_lennorm.yaml").algo.aggregation == "seq_mean"
    assert load_arm(EXPERIMENTS / "n4/minirl_r2_noclip.yaml").algo.clip is False
    verbose = load_arm(EXPERIMENTS / "coldstart/verbose.yaml")
    assert verbose.cold_start.style == "verbose" and verbose.rollout.max_new_tokens == 96
    assert [name for name, _ in find_arms(EXPERIMENTS)][:2] == ["onpolicy/minirl", "onpolicy/minirl_lennorm"]


def test_stress_study_moves_one_axis_per_condition():
    from minirl.experiments import STRESS_ARMS, STRESS_AXES, STRESS_CONDITIONS

    stress = find_arms(EXPERIMENTS / "stress")
    assert len(stress) == len(STRESS_CONDITIONS) * len(STRESS_ARMS) == 7 * 14
    assert [name for name, _ in stress][:3] == ["base/onpolicy_minirl", "base/onpolicy_minirl_no_is", "base/n4_minirl"]
    assert {lvl for levels in STRESS_AXES.values() for lvl in levels} == set(STRESS_CONDITIONS)
    base = load_arm(EXPERIMENTS / "base.yaml")
    for name, path in stress:
        cfg = load_arm(path)
        n = cfg.optim.minibatches_per_step
        assert cfg.minibatch_sequences == 64 and cfg.optim.steps * n == 128 and cfg.diagnostics.every_steps * n == 16, name
        cond, arm = name.split("/")
        moved = {"lr3x": cfg.optim.lr == 9e-4, "lr2x": cfg.optim.lr == 6e-4, "fp4": cfg.rollout.precision == "fp4_e2m1",
                 "e5m2": cfg.rollout.precision == "fp8_e5m2",
                 "long": (cfg.cold_start.style, cfg.rollout.max_new_tokens) == ("stepwise", 72),
                 "trace": (cfg.cold_start.style, cfg.rollout.max_new_tokens) == ("trace", 240)}
        assert [k for k, v in moved.items() if v] == ([] if cond == "base" else [cond]), name
        assert cfg.algo.clip is not arm.endswith("_noclip") and cfg.algo.is_correction is not arm.endswith("_no_is"), name
        assert cfg.moe.routing_replay == ("R2" if "_r2" in arm else "R3" if "_r3" in arm else "none"), name
        fit = (2000, 0.02) if cond in ("long", "trace") else (base.cold_start.steps, None)  # SFT to the same loss
        assert (cfg.task.difficulty, cfg.cold_start.steps, cfg.cold_start.until_loss) == (base.task.difficulty, *fit)
    assert not any(name.startswith("stress/") for name, _ in find_arms(EXPERIMENTS))  # its own sweep


def test_horizon_study_is_the_cold_start_arms_over_twice_the_steps():
    from minirl.experiments import HORIZON_GRADIENT_STEPS

    horizon = find_arms(EXPERIMENTS / "horizon")
    assert [name for name, _ in horizon] == ["coldstart/direct", "coldstart/stepwise", "coldstart/verbose"]
    for name, path in horizon:
        long, grid = load_arm(path).model_dump(), load_arm(EXPERIMENTS / f"{name}.yaml").model_dump()
        n = grid["optim"]["minibatches_per_step"]
        assert (long["optim"].pop("steps") * n, grid["optim"].pop("steps") * n) == (HORIZON_GRADIENT_STEPS, 256) == (512, 256)
        assert long["run"].pop("name") == "horizon-" + grid["run"].pop("name")
        assert long == grid, name  # every other knob, the SFT fit included, as in the grid's arm
    assert not any(name.startswith("horizon/") for name, _ in find_arms(EXPERIMENTS))  # its own sweep


def test_quick_stress_sweep_plots_diagnostics_against_an_axis(tmp_path):
    runs = tmp_path / "stress"
    proc = _minirl("sweep", "experiments/stress", "--quick", "--seeds", "1", "--jobs", "2", "--runs-dir", str(runs),
                   "--arms", "base/n4_minirl_r2,lr3x/n4_minirl_r2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (runs / "lr3x/n4_minirl_r2/seed0/metrics.jsonl").read_text().splitlines()]
    assert any("fidelity/last_grad_cosine" in r for r in rows)
    plot = _minirl("plot", str(runs))
    assert plot.returncode == 0, plot.stderr[-2000:]
    assert (runs / "plots" / "stress_step_size.png").stat().st_size > 1000
    assert not (runs / "plots" / "stress_mismatch.png").exists()  # one level only: nothing to plot against
    report = _minirl("report", str(runs))
    assert report.returncode == 0, report.stderr[-2000:]
    line = next(x for x in (runs / "REPORT.md").read_text().splitlines() if x.startswith("| lr3x/n4_minirl_r2 |"))
    assert line.count("|") == 11 and line.split("|")[-2].strip() != "—"  # the residual column is filled (no reward: no cosine)


def test_sigterm_stops_the_sweep_and_its_runs(tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "minirl.cli", "sweep", "experiments", "--quick", "--seeds", "1",
                             "--runs-dir", str(runs), "--arms", "onpolicy/minirl"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # wait until the run has started
        if line.startswith("start "):
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _processes_mentioning(str(runs)):
        time.sleep(0.2)
    assert not _processes_mentioning(str(runs)), "the sweep's run outlived it"


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended meanwhile
            continue
    return pids


def test_base_counts_in_gradient_steps_that_every_n_divides(tmp_path):
    (tmp_path / "base.yaml").write_text((EXPERIMENTS / "base.yaml").read_text().replace("  steps: 128\n", "  steps: 130\n"))
    with pytest.raises(ConfigError, match="optim.steps=130 is counted in gradient steps and must be divisible by N=4"):
        generate(tmp_path)


def test_moving_and_late_means():
    from minirl.experiments import late_mean, moving_mean

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


def test_quick_sweep_resumes_then_plot_and_report(tmp_path):
    runs = tmp_path / "sweeps"
    args = ("sweep", "experiments", "--quick", "--seeds", "1", "--jobs", "2", "--runs-dir", str(runs),
            "--arms", "onpolicy/minirl,n2/minirl_r2_noclip")
    killed = runs / "onpolicy/minirl/seed0"  # a run killed before its first checkpoint: started over
    killed.mkdir(parents=True)
    (killed / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')
    proc = _minirl(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "start onpolicy/minirl seed0" in proc.stdout and "0 failed" in proc.stdout
    for arm, n in (("onpolicy/minirl", 1), ("n2/minirl_r2_noclip", 2)):
        rows = [json.loads(line) for line in (runs / arm / "seed0" / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1, 2, 3]
    again = _minirl(*args)
    assert again.returncode == 0 and "0 run(s) to do" in again.stdout, again.stdout
    assert "skip onpolicy/minirl seed0: finished" in again.stdout
    committed = runs / "onpolicy/minirl/seed0"  # as committed to results/: config and metrics only
    for path in committed.iterdir():
        if path.name not in ("config.yaml", "metrics.jsonl"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    kept = _minirl("sweep", "experiments", "--quick", "--seeds", "1", "--runs-dir", str(runs), "--arms", "onpolicy/minirl")
    assert kept.returncode == 0 and "0 run(s) to do" in kept.stdout, kept.stdout
    assert "another config" not in kept.stdout
    # a finished run whose arm has changed since is still skipped (never deleted), with a line saying so
    saved = committed / "config.yaml"
    saved.write_text(saved.read_text().replace("eps_high: 0.27", "eps_high: 0.3"))
    stale = _minirl("sweep", "experiments", "--quick", "--seeds", "1", "--runs-dir", str(runs), "--arms", "onpolicy/minirl")
    assert stale.returncode == 0 and "0 run(s) to do" in stale.stdout, stale.stdout
    assert f"another config (algo.eps_high (run 0.3, now 0.27)): delete {committed} to run it again" in stale.stdout

    plot = _minirl("plot", str(runs))
    assert plot.returncode == 0, plot.stderr[-2000:]
    assert (runs / "plots" / "onpolicy.png").stat().st_size > 1000 and (runs / "plots" / "n2.png").is_file()
    report = _minirl("report", str(runs))
    assert report.returncode == 0, report.stderr[-2000:]
    text = (runs / "REPORT.md").read_text()
    assert "## on-policy (N = 1)" in text and "| onpolicy/minirl | 1 | 3 |" in text and "| n2/minirl_r2_noclip | 1 | 6 |" in text


@pytest.mark.parametrize("args, expected", [
    (("report", "no/such/dir"), "runs directory not found"),
    (("sweep", "experiments", "--arms", "nothing*"), "no arm configs match"),
    (("sweep", "experiments", "--seeds", "x"), "--seeds"),
])
def test_user_errors_are_one_line(args, expected):
    proc = _minirl(*args)
    assert proc.returncode == 2 and expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _fake_runs(curves: dict[str, list[list[float]]]) -> dict:
    """setting -> arm -> runs with held-out curves (one list per seed), as load_runs returns them."""
    out: dict = {}
    for arm, seeds in curves.items():
        runs = [{"seed": f"seed{i}", "n": 1, "rows": [{"step": 10 * j, "eval/accuracy": y} for j, y in enumerate(ys)]}
                for i, ys in enumerate(seeds)]
        out.setdefault(arm.split("/")[0], {})[arm] = runs
    return out


def test_claim_verdicts_weigh_differences_against_seed_noise():
    from minirl.experiments import _collapses, _comparable, _flat, _greater

    arms = _flat(_fake_runs({
        "onpolicy/minirl": [[0.5, 0.9], [0.5, 0.91], [0.5, 0.89]],
        "onpolicy/minirl_no_is": [[0.5, 0.8, 0.1], [0.5, 0.7, 0.2], [0.5, 0.9, 0.3]],  # collapses in every seed
        "onpolicy/minirl_r3": [[0.5, 0.92], [0.5, 0.70], [0.5, 0.95]],  # noisy
        "onpolicy/minirl_lennorm": [[0.5, 0.88]],  # one seed
    }))
    verdict, numbers = _greater(arms, "onpolicy/minirl", "onpolicy/minirl_no_is", "final")
    # finals 0.90 vs 0.20: diff 0.70, SE = sqrt(0.0001/3 + 0.01/3) = 0.0580
    assert verdict == "supports" and "+0.700 (SE 0.058, seeds 3/3)" in numbers
    assert _greater(arms, "onpolicy/minirl_no_is", "onpolicy/minirl", "final")[0] == "contradicts"
    assert _greater(arms, "onpolicy/minirl", "onpolicy/minirl_r3", "final")[0] == "cannot tell"  # +0.043, SE 0.079
    assert _greater(arms, "onpolicy/minirl", "onpolicy/minirl_lennorm", "final")[0] == "cannot tell (1 seed)"
    assert _greater(arms, "onpolicy/minirl", "n2/minirl_r2", "final")[0] == "not run"
    assert _comparable(arms, "onpolicy/minirl", "onpolicy/minirl", "peak")[0] == "supports"
    assert _comparable(arms, "onpolicy/minirl", "onpolicy/minirl_no_is", "final")[0] == "contradicts"
    verdict, numbers = _collapses(arms, "onpolicy/minirl_no_is", "onpolicy/minirl")
    assert verdict == "supports" and "collapsed in 3/3 seeds" in numbers and "in 0/3" in numbers
    assert _collapses(arms, "onpolicy/minirl", "onpolicy/minirl_no_is")[0] == "contradicts"


def test_claims_of_a_partial_sweep_keep_the_checks_that_ran_and_name_the_rest():
    from minirl.experiments import claims_section

    lines = claims_section(_fake_runs({"onpolicy/minirl": [[0.5, 0.9]] * 3, "onpolicy/minirl_r3": [[0.5, 0.8]] * 3}))
    rows = [line for line in lines if line.startswith("| §") or line.startswith("|  |")]
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
    from minirl.experiments import _flat, paired_effect, stress_section

    runs = _fake_runs({
        "base/n4_minirl": [[0.5, 0.9]], "base/n4_minirl_noclip": [[0.5, 0.8]],
        "base/n8_minirl": [[0.5, 0.7]], "base/n8_minirl_noclip": [[0.5, 0.7]],
        "base/onpolicy_minirl": [[0.5, 0.9], [0.5, 0.8]], "base/onpolicy_minirl_no_is": [[0.5, 0.6]],
    })
    arms = _flat(runs)
    pairs = [("base/n4_minirl", "base/n4_minirl_noclip"), ("base/n8_minirl", "base/n8_minirl_noclip"),
             ("base/n4_minirl_r2", "base/n4_minirl_r2_noclip")]  # the last pair did not run: left out
    mean, se, n = paired_effect(arms, pairs)
    assert (round(mean, 12), round(se, 12), n) == (0.05, 0.05, 2)  # diffs 0.1 and 0.0
    mean, se, n = paired_effect(arms, [("base/onpolicy_minirl", "base/onpolicy_minirl_no_is")])
    assert round(mean, 12) == 0.25 and n == 1 and math.isnan(se)  # seed mean 0.85 - 0.6
    table = "\n".join(stress_section(runs))
    assert "| base | all | — | —/— | +0.050 ± 0.050 (n=2) | — | — | +0.250 (1 pair) | 0/7 |" in table
    # one pair of arms with matched seeds: the seeds are the units (diffs 0.3, 0.1, 0.2)
    seeded = _flat(_fake_runs({"lr3x/onpolicy_minirl": [[0.5, 0.9], [0.5, 0.8], [0.5, 0.7]],
                               "lr3x/onpolicy_minirl_no_is": [[0.5, 0.6], [0.5, 0.7], [0.5, 0.5]]}))
    mean, se, n = paired_effect(seeded, [("lr3x/onpolicy_minirl", "lr3x/onpolicy_minirl_no_is")])
    assert (round(mean, 12), round(se, 12), n) == (0.2, round(0.1 / math.sqrt(3), 12), 3)
    assert stress_section(_fake_runs({"n2/minirl_r2": [[0.5, 0.9]]})) == []


def test_report_flags_arms_without_learning_signal(tmp_path):
    from minirl.experiments import report

    for arm, ys in (("n2/minirl_r2", [0.0, 0.0]), ("n2/minirl_r3", [0.5, 0.8])):
        run = tmp_path / arm / "seed0"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": 8 * i, "eval/accuracy": y}) + "\n"
                                                    for i, y in enumerate(ys)))
        shutil.copy(EXPERIMENTS / f"{arm}.yaml", run / "config.yaml")
    text = report(tmp_path).read_text()
    assert "**No learning signal:** n2/minirl_r2 never scored above 0" in text and "n2/minirl_r3 never" not in text


def test_falls_table_classifies_the_entropy_of_each_fall_by_hand(tmp_path):
    from minirl.experiments import fall_entropy, falls_section, report

    # N = 2: a row per global step = every 2 gradient steps (entropy at gradient steps 2, 4, ..., 14; held-out
    # at 0, 8, 16, 24). Held-out peaks at gradient step 8 (0.8), falls to 0.2 at 16, 0.1 at 24.
    rows = [{"step": s, "train/entropy": e, "mismatch/kl_k3": k}
            for s, e, k in [(1, 0.10, 1e-4), (2, 0.10, 1e-4), (3, 0.10, 1e-4), (4, 0.12, 2e-4),
                            (5, 0.30, 5e-3), (6, 0.20, 1e-3), (7, 0.11, 9e-2)]]
    rows += [{"step": s, "eval/accuracy": y} for s, y in [(0, 0.5), (4, 0.8), (8, 0.2), (12, 0.1)]]
    run = {"seed": "seed0", "n": 2, "rows": sorted(rows, key=lambda r: r["step"])}
    ent = fall_entropy(run, peak_step=8, drop_step=16)
    # ref: entropy at gradient steps 2, 4, 6, 8 (within 16 up to the peak) = (0.1 + 0.1 + 0.1 + 0.12) / 4 = 0.105;
    # the fall (8, 16] holds steps 10, 12, 14: values 0.30, 0.20, 0.11; trailing means over 8 // 2 = 4 rows:
    # 0.155, 0.18, 0.1825 -> min 0.155; 0.30 >= 1.5 x 0.105: blow-up
    assert ent["ref"] == pytest.approx(0.105) and ent["max"] == pytest.approx(0.30)
    assert ent["min"] == pytest.approx(0.155) and ent["kind"] == "blow-up"
    # entropy 0.05 from gradient step 10: trailing means 0.0925, 0.08, 0.0675; a drop at <= 0.105 / 1.5 = 0.07
    sinking = {**run, "rows": [{**r, "train/entropy": 0.05} if r["step"] >= 5 and "train/entropy" in r else r
                               for r in run["rows"]]}
    low = fall_entropy(sinking, peak_step=8, drop_step=16)
    assert low["min"] == pytest.approx(0.0675) and low["max"] == pytest.approx(0.05) and low["kind"] == "drop"
    assert fall_entropy(sinking, peak_step=8, drop_step=14)["kind"] == "drop"  # the low's own step counts
    assert fall_entropy(sinking, peak_step=8, drop_step=12)["kind"] == "neither"  # min 0.08 > 0.07
    # a peak at gradient step 12: the reference is steps (-4, 12] = 2 ... 12, mean 0.92 / 6
    assert fall_entropy(run, peak_step=12, drop_step=14)["ref"] == pytest.approx(0.92 / 6)
    table = "\n".join(falls_section({"n2": {"n2/minirl_noclip": [run]}}))
    # deepest drop (0.8 - 0.1) / 0.8 = 88 % at 24; below 0.4 from 16 to the end; the fall (8, 24] has the same
    # entropy steps as above and the KL 5e-3, 1e-3, 9e-2 at 10, 12, 14
    assert ("| n2/minirl_noclip | seed0 | 0.500 → 0.800 at 8 → 0.100 | 88% at 24 | stayed (from 16) | "
            "0.105 → max 0.300 (2.86×) / min 0.155 (1.48×): blow-up | 9.0e-02 at 14 |") in table, table
    # the report's collapse cell says the same
    run_dir = tmp_path / "n2" / "minirl_noclip" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run["rows"]))
    shutil.copy(EXPERIMENTS / "n2/minirl_noclip.yaml", run_dir / "config.yaml")
    assert "| 16 (entropy blow-up) |" in report(tmp_path).read_text()
    calm = _fake_runs({"n2/minirl_r2": [[0.5, 0.9, 0.85]]})
    assert "No run fell 50% below its running peak." in "\n".join(falls_section(calm))
