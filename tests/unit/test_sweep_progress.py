"""The sweep's remaining-time estimate (``minirl.experiments.sweep.sweep_eta``), by hand-computed cases."""

from __future__ import annotations

from minirl.experiments.sweep import sweep_eta


def test_running_runs_alone_end_with_the_slowest():
    # the last two runs of a sweep, nothing queued: the sweep ends when the slower one does,
    # however long the finished runs took (the old estimate said one mean run time, forever)
    assert sweep_eta([100.0, 300.0], [50.0, 40.0], [1868.0], queued=0, jobs=2) == 300.0


def test_queued_runs_take_the_first_free_slot():
    # slots free at 100 and 300; three queued runs of 200 s (the finished runs' mean):
    # 100 -> 300, then 300 -> 500, then 300 -> 500: the sweep ends at 500
    assert sweep_eta([100.0, 300.0], [0.0, 0.0], [150.0, 250.0], queued=3, jobs=2) == 500.0
    # one job: everything in a row, 100 + 3 x 200
    assert sweep_eta([100.0], [0.0], [200.0], queued=3, jobs=1) == 700.0
    # a free second slot takes the first queued run at once: max(50, 200, 50 + 200)
    assert sweep_eta([50.0], [10.0], [200.0], queued=2, jobs=2) == 250.0


def test_before_any_run_finishes_the_running_runs_project_the_length():
    # a run 60 s in with 240 s to go is a 300 s run; the one without a step yet has ~300 - 20 = 280 s
    # left; the queued run starts when the first slot frees, at 240: 240 + 300
    assert sweep_eta([240.0, None], [60.0, 20.0], [], queued=1, jobs=2) == 540.0
    assert sweep_eta([None, None], [5.0, 5.0], [], queued=4, jobs=2) is None  # nothing tells a run's length yet


def test_a_device_sweep_runs_every_arm_on_that_device_and_as_many_at_once_as_asked(tmp_path, monkeypatch):
    """``minirl sweep --device cuda --jobs 3``: each run gets ``cluster.device=cuda`` (the only override a
    sweep adds to an arm) and up to three run at once. The runs are stand-ins that exit at once."""
    import subprocess
    from pathlib import Path

    from minirl.experiments import sweep as sweep_module

    launched, peak = [], [0]

    class Done:
        returncode = 0

        def __init__(self, command, **kwargs):
            launched.append(command)
            peak[0] = max(peak[0], len(launched) - finished[0])

        def poll(self):
            finished[0] += 1
            return 0

    finished = [0]
    monkeypatch.setattr(subprocess, "Popen", Done)
    monkeypatch.setattr(sweep_module.time, "sleep", lambda s: None)
    root = Path(__file__).resolve().parents[2]
    failed = sweep_module.sweep(root / "experiments/studies/study1_replay", [0, 1], runs_root=tmp_path, jobs=3,
                                device="cuda", log=lambda msg: None)
    assert failed == 0 and len(launched) == 12  # 6 arms x 2 seeds
    assert all("cluster.device=cuda" in command for command in launched)
    assert peak[0] == 3
    launched.clear()
    sweep_module.sweep(root / "experiments/studies/study1_replay", [0], runs_root=tmp_path / "cpu", log=lambda msg: None)
    assert launched and not any(arg.startswith("cluster.device=") for command in launched for arg in command)


def test_stopping_a_sweep_kills_a_run_that_ignores_sigterm_after_the_grace_period(tmp_path):
    """The sweep always ends: a run still alive ``grace_s`` after its SIGTERM is killed (and said so);
    a run that stops at once is not."""
    import subprocess
    import sys
    import time

    from minirl.experiments.sweep import stop_runs

    outs = [open(tmp_path / f"{k}.log", "w") for k in range(2)]
    stubborn = subprocess.Popen([sys.executable, "-c", "import faulthandler, signal, time; faulthandler.register("
                                 "signal.SIGUSR1); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, stderr=outs[0])
    polite = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE)
    for proc in (stubborn, polite):
        assert proc.stdout.readline() == b"ready\n"  # its signal dispositions are set
    running = [(stubborn, ("a/x", 0, None, [], tmp_path, 3), 0.0, outs[0], 0),
               (polite, ("a/y", 1, None, [], tmp_path, 3), 0.0, outs[1], 0)]
    said: list[str] = []
    started = time.monotonic()
    stop_runs(running, said.append, grace_s=1.0)
    assert 1.0 <= time.monotonic() - started < 10
    assert stubborn.returncode == -9 and polite.returncode == -15
    assert len(said) == 1 and said[0].startswith("kill  a/x seed0: not stopped 1s after SIGTERM (its stacks")
    assert all(out.closed for out in outs)
    assert "in <module>" in (tmp_path / "0.log").read_text()  # where it was stuck, dumped before the kill
