"""``Spawned`` workers: a fresh interpreter (``spawn``, CUDA trainer ranks) or a fork of a server that imported torch,
transformers and the trainer once (``forkserver``, CPU trainer ranks: ``minirl.distributed.placement``)."""

from __future__ import annotations

import os
import sys

import pytest

from minirl.distributed.group import Spawned, WorkerError, gather


class Probe:
    """What the child had imported before it built its worker, and who its parent is."""

    def __init__(self, fail: bool = False) -> None:
        if fail:
            raise ValueError("no probe today")
        self.preloaded = "minirl.runtime" in sys.modules  # neither the pickled call nor this module imports it

    def facts(self) -> tuple[int, bool]:
        return os.getppid(), self.preloaded


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_worker_starts_by_its_method_and_answers(start_method):
    worker = Spawned("probe", Probe, start_method=start_method)
    try:
        gather([(worker, "__init__")], "start-up")
        parent, preloaded = gather([(worker, worker.submit("facts"))], "facts")[0]
    finally:
        worker.close()
    # a spawned child is this process's own and imports only what it needs; a forkserver's child was forked from a
    # server (its parent) that had imported the trainer's modules already
    assert (parent == os.getpid(), preloaded) == ((True, False) if start_method == "spawn" else (False, True))
    assert worker.process.exitcode == 0


def test_a_forkserver_worker_failing_to_start_is_one_error_naming_it():
    worker = Spawned("probe 1", Probe, True, start_method="forkserver")
    try:
        with pytest.raises(WorkerError, match=r"probe 1 .*ValueError: no probe today"):
            gather([(worker, "__init__")], "start-up")
    finally:
        worker.close()
