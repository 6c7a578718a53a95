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
