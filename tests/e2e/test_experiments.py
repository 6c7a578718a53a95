"""The paper's experiments in miniature: generated arm configs, a resumable quick sweep, plot, report."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from minirl.config import ConfigError
from minirl.experiments.arms import (
    find_arms,
    generate,
    global_steps,
    load_arm,
    load_table,
    read_run_config,
)
from minirl.experiments.sweep import STOP_GRACE_S

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
ARMS = [arm.name for arm in load_table(EXPERIMENTS / "arms.yaml").arms]


def _minirl(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minirl.cli", *args], check=False, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_generate_reproduces_the_committed_arm_files():
    # idempotent: the committed files are exactly what the generator writes from the tables and the base
    assert generate(EXPERIMENTS, check=True) == []
    assert [name for name, _ in find_arms(EXPERIMENTS)] == ARMS and len(ARMS) == 20


def test_arm_files_state_the_horizon_explicitly_in_global_steps():
    # no key is reinterpreted: the file says optim.global_steps = gradient steps / N, with the new key names
    text = (EXPERIMENTS / "n4/minirl_r3.yaml").read_text()
    assert "# horizon: 128 gradient steps = 32 global steps x N=4" in text
    assert "\n  global_steps: 32\n" in text and "\n  warmup_updates: 10\n" in text and "\n  steps: 32\n" not in text
    assert "\n  global_steps: 128\n" in (EXPERIMENTS / "base.yaml").read_text()  # the base is an ordinary config


def test_every_arm_keeps_the_mini_batch_and_pins_its_knobs():
    for name, path in find_arms(EXPERIMENTS):
        cfg = load_arm(path)
        n = cfg.optim.minibatches_per_step
        assert cfg.minibatch_sequences == 64, name  # 8 prompts x 8 samples per gradient update, every arm
        assert cfg.rollout.prompts_per_step == 8 * n, name
        assert (cfg.rollout.precision, cfg.rollout.fp8_scale) == ("fp8_e4m3", "per_tensor")
        # every arm makes the same gradient steps and evaluates at the same gradient steps
        steps = 256 if name.startswith("coldstart/") else 128  # the cold starts meet (or not) over a longer horizon
        assert (global_steps(cfg) * n, cfg.eval.every_steps * n, cfg.checkpoint.every_steps * n) == (steps, 16, 16), name
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
    table = load_table(EXPERIMENTS / "stress/arms.yaml")
    stress = find_arms(EXPERIMENTS / "stress")
    assert len(stress) == len(table.arms) == 7 * 14
    assert [name for name, _ in stress][:3] == ["base/onpolicy_minirl", "base/onpolicy_minirl_no_is", "base/n4_minirl"]
    assert {lvl for levels in table.axes.values() for lvl in levels} == set(table.conditions)
    base = load_arm(EXPERIMENTS / "base.yaml")
    for name, path in stress:
        cfg = load_arm(path)
        n = cfg.optim.minibatches_per_step
        assert cfg.minibatch_sequences == 64 and global_steps(cfg) * n == 128 and cfg.diagnostics.every_steps * n == 16, name
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
    horizon = find_arms(EXPERIMENTS / "horizon")
    assert [name for name, _ in horizon] == ["coldstart/direct", "coldstart/stepwise", "coldstart/verbose"]
    for name, path in horizon:
        long, grid = load_arm(path).model_dump(), load_arm(EXPERIMENTS / f"{name}.yaml").model_dump()
        n = grid["optim"]["minibatches_per_step"]
        key = next(k for k in long["optim"] if k in ("steps", "global_steps"))  # the schema's spelling
        assert (long["optim"].pop(key) * n, grid["optim"].pop(key) * n) == (512, 256)
        assert long["run"].pop("name") == "horizon-" + grid["run"].pop("name")
        assert long == grid, name  # every other knob, the SFT fit included, as in the grid's arm
    assert not any(name.startswith("horizon/") for name, _ in find_arms(EXPERIMENTS))  # its own sweep


@pytest.mark.slow  # 15 s; the default suite's 15-minute budget (the quick sweep above covers sweep, plot and report)
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
    try:
        proc.wait(timeout=STOP_GRACE_S + 60)  # a run that does not stop is killed after the grace period
    except subprocess.TimeoutExpired:  # say where everything was, for the next look
        pids = [proc.pid, *_processes_mentioning(str(runs))]
        states = {pid: _proc_state(pid) for pid in pids}
        for pid in pids:  # each dumps its Python stacks to its stderr (`minirl` registers SIGUSR1 with faulthandler)
            os.kill(pid, signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        logs = {p.relative_to(runs): p.read_text()[-2000:] for p in runs.rglob("sweep.log")}
        pytest.fail(f"the sweep did not end after SIGTERM; processes {states}; sweep output "
                    f"{proc.stdout.read()[-2000:]!r}; run logs {logs}")
    assert proc.returncode != 0
    said = proc.stdout.read()
    if "kill  " in said:  # the sweep ended, but the run did not stop by itself: leave the evidence
        logs = {str(p.relative_to(runs)): p.read_text()[-3000:] for p in runs.rglob("sweep.log")}
        warnings.warn(f"a run ignored the sweep's SIGTERM and was killed: {said[-500:]!r}; run logs {logs}", stacklevel=1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _processes_mentioning(str(runs)):
        time.sleep(0.2)
    assert not _processes_mentioning(str(runs)), "the sweep's run outlived it"


def _proc_state(pid: int) -> str:
    """``State`` and the kernel wait channel of a process (where a hang sits), or 'gone'."""
    try:
        state = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("State:"))
        return f"{state.split(':', 1)[1].strip()} in {Path(f'/proc/{pid}/wchan').read_text() or '-'}"
    except (OSError, StopIteration):
        return "gone"


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended meanwhile
            continue
    return pids


def test_table_counts_in_gradient_steps_that_every_n_divides(tmp_path):
    shutil.copy(EXPERIMENTS / "base.yaml", tmp_path / "base.yaml")
    (tmp_path / "arms.yaml").write_text((EXPERIMENTS / "arms.yaml").read_text().replace("gradient_steps: 128\n", "gradient_steps: 130\n"))
    with pytest.raises(ConfigError, match=re.escape("n4/minirl_noclip: optim.global_steps = 130 gradient steps is not divisible by N=4")):
        generate(tmp_path)


@pytest.mark.slow  # the default suite's 15-minute budget; the stress sweep and the studies' sweeps stay
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
    for arm in ("onpolicy/minirl", "n2/minirl_r2_noclip"):
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


def test_report_flags_arms_without_learning_signal(tmp_path):
    from minirl.experiments.report import report

    for arm, ys in (("n2/minirl_r2", [0.0, 0.0]), ("n2/minirl_r3", [0.5, 0.8])):
        run = tmp_path / arm / "seed0"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": 8 * i, "eval/accuracy": y}) + "\n"
                                                    for i, y in enumerate(ys)))
        shutil.copy(EXPERIMENTS / f"{arm}.yaml", run / "config.yaml")
    text = report(tmp_path).read_text()
    assert "**No learning signal:** n2/minirl_r2 never scored above 0" in text and "n2/minirl_r3 never" not in text


def test_falls_table_classifies_the_entropy_of_each_fall_by_hand(tmp_path):
    from minirl.experiments.analysis import fall_entropy
    from minirl.experiments.report import falls_section, report

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
    calm = {"n2": {"n2/minirl_r2": [{"seed": "seed0", "n": 1, "rows": [{"step": 10 * j, "eval/accuracy": y}
                                                                        for j, y in enumerate([0.5, 0.9, 0.85])]}]}}
    assert "No run fell 50% below its running peak." in "\n".join(falls_section(calm))


def test_plot_and_report_take_one_run_directory_and_old_key_names(tmp_path):
    # a plain `minirl train` run (runs/s4), whose config.yaml predates the optim.global_steps rename
    run = tmp_path / "runs" / "s4"
    run.mkdir(parents=True)
    saved = (EXPERIMENTS / "n2/minirl_r2.yaml").read_text()
    (run / "config.yaml").write_text(saved.replace("  global_steps: 64\n", "  steps: 64\n")
                                     .replace("  warmup_updates: 10\n", "  warmup_steps: 10\n"))
    rows = [{"step": s, "eval/accuracy": y, "mismatch/kl_k3": 1e-4, "train/entropy": 0.1, "train/reward_mean": y}
            for s, y in [(0, 0.5), (8, 0.8), (16, 0.2), (24, 0.1)]]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot = _minirl("plot", str(run))
    assert plot.returncode == 0, plot.stderr[-2000:]
    assert {p.name for p in (run / "plots").iterdir()} == {"n2.png", "n2_seeds.png", "n2_falls.png"}
    report = _minirl("report", str(run))
    assert report.returncode == 0, report.stderr[-2000:]
    assert "| s4 | 1 | 48 | 0.800 | 0.100 |" in (run / "REPORT.md").read_text()
    # the finished run's old key names are mapped when it is read back (no error; nothing stale)
    from minirl.experiments.arms import read_run_config
    from minirl.experiments.sweep import stale_keys

    assert read_run_config(run / "config.yaml").optim.minibatches_per_step == 2
    assert stale_keys(run, load_arm(EXPERIMENTS / "n2/minirl_r2.yaml")) == []


@pytest.mark.slow  # 35 s; the default suite's 15-minute budget (every arm file is still parsed by the config tests)
def test_preregistered_studies_are_their_own_resumable_sweeps(tmp_path):
    from minirl.experiments.studies import REGISTERED, STUDIES

    for study, n_arms in (("study1_replay", 6), ("study2_is", 2)):
        arms = find_arms(EXPERIMENTS / "studies" / study)
        assert [name for name, _ in arms] == [a.name for a in load_table(EXPERIMENTS / "studies" / study / "arms.yaml").arms]
        assert list(REGISTERED[study].arms) == [name for name, _ in arms] and REGISTERED[study].gradient_steps == 256
        assert len(arms) == n_arms and {p.a for p in STUDIES[study]} | {p.b for p in STUDIES[study]} == {n for n, _ in arms}
        for name, path in arms:  # the registered design: 256 gradient steps, 256 held-out prompts, accuracy-matched start
            cfg = load_arm(path)
            n = cfg.optim.minibatches_per_step
            assert global_steps(cfg) * n == 256 and cfg.eval.num_prompts == cfg.task.num_eval_prompts == 256, name
            assert (cfg.cold_start.style, cfg.cold_start.until_accuracy, cfg.cold_start.until_loss) == ("trace", 0.8, None)
            assert cfg.rollout.max_new_tokens == 240 and cfg.algo.clip and cfg.minibatch_sequences == 64, name
    assert not any(name.startswith("studies/") for name, _ in find_arms(EXPERIMENTS))  # not in the default sweep
    runs = tmp_path / "study1"
    proc = _minirl("sweep", "experiments/studies/study1_replay", "--quick", "--seeds", "2", "--jobs", "2",
                   "--runs-dir", str(runs), "--arms", "n2_r2,n2_r3", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = _minirl("sweep", "experiments/studies/study1_replay", "--quick", "--seeds", "2", "--runs-dir", str(runs),
                    "--arms", "n2_r2,n2_r3")
    assert "0 run(s) to do" in again.stdout  # resumable: finished runs are skipped
    command = [sys.executable, "-m", "minirl.experiments", "verdicts", str(runs), "study1_replay"]
    early = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    # 4 of 36 registered runs, and --quick ones short of the registered 256 gradient steps: no verdicts, one line
    assert early.returncode == 1 and early.stdout == "" and len(early.stderr.splitlines()) == 1, early.stderr
    assert "study1_replay: 0 of 36 registered runs finished" in early.stderr and "n2_none seed 0 (not started)" in early.stderr
    verdicts = subprocess.run([*command, "--interim"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert verdicts.returncode == 0, verdicts.stderr
    assert "**Interim: 0 of 36 registered runs finished." in verdicts.stdout
    assert "| **primary** N = 2: R2 beats R3 | n2_r2 − n2_r3 (final) | **interim** |" in verdicts.stdout
    assert verdicts.stdout.count("**not run**") == 5  # only the N = 2 R2/R3 pair ran
    # Study 2's registered engine (fp4 weights in blocks of 128 + fp8 KV) runs too: --quick shrinks the blocks to
    # the tiny model's width (128 does not divide its 64: the first try of this stopped both arms at step 0)
    proc = _minirl("sweep", "experiments/studies/study2_is", "--quick", "--seeds", "1", "--runs-dir", str(tmp_path / "s2"),
                   timeout=600)
    assert proc.returncode == 0 and "0 failed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_run_config(tmp_path / "s2" / "onpolicy_no_is" / "seed0" / "config.yaml").rollout.fp4_block_size == 64


@pytest.mark.slow  # the device tool's script, smoke-tested on the CPU (as benchmarks/gpu_bench.py --tiny)
def test_the_gpu_study_command_runs_and_collects_every_run(tmp_path):
    """``experiments/studies/gpu_sweep.sh`` (the device tool's prepared command), smoke-tested on the CPU:
    every arm runs, and each run's record (not its checkpoints) lands in $OUT/<study>/<arm>/seed<s>/."""
    import os

    env = {**os.environ, "QUICK": "1", "DEVICE": "cpu", "OUT": str(tmp_path / "out"), "RUNS_ROOT": str(tmp_path / "runs"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "experiments/studies/gpu_sweep.sh", "study1_replay", "1", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out" / "study1_replay"
    arms = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert arms == ["n2_none", "n2_r2", "n2_r3", "n8_none", "n8_r2", "n8_r3"]
    for arm in arms:
        files = sorted(p.name for p in (out / arm / "seed0").iterdir())
        assert files == ["config.yaml", "environment.jsonl", "metrics.jsonl", "sweep.log"], arm
    assert (tmp_path / "runs" / "study1_replay" / "_sft_cache").is_dir()  # the committed cold start, copied
