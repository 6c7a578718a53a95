"""The reward worker process: imports a user reward function and scores samples sent to it.

Started by ``RewardRunner`` as ``python -c <boot> READ_FD WRITE_FD`` (a fresh interpreter: no
CUDA context, no threads or locks inherited from the trainer, no re-import of the trainer's
``__main__``). It runs in its own session, so killing its process group also stops processes a
reward function started. Messages are ``multiprocessing.connection`` frames on two pipes:

    parent -> worker   {"sys_path": [...], "spec": "module:function" | None, "pickled": bytes | None}
    worker -> parent   ("ready", name) | ("failed", one-line message)
    parent -> worker   [(prompt, completion, answer), ...]    a chunk; None = exit
    worker -> parent   ("ok", reward) | ("error", one-line message)   one per sample, in order

Only the standard library and ``minirl.tasks.rewards`` (which imports no torch) are imported here.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

BOOT = (
    "import sys; sys.path.insert(0, {src!r}); "
    "from minirl.tasks._reward_worker import main; main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
)


def _exit_when_orphaned(parent_pid: int) -> None:
    """If the trainer dies (even by SIGKILL) while a reward call hangs, exit anyway."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(3)


def _score(fn: Any, name: str, sample: tuple[str, str, str]) -> tuple[str, Any]:
    from minirl.tasks.rewards import RewardFunctionError, check_reward_value, raised_message

    try:
        value = fn(*sample)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit from a user function is an error, not an exit
        return "error", raised_message(name, error)
    try:
        return "ok", check_reward_value(value, name)
    except RewardFunctionError as error:
        return "error", str(error)


def main(read_fd: int, write_fd: int, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops us
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        setup = inbox.recv()
    except EOFError:
        return
    sys.path[:] = setup["sys_path"]
    from minirl.tasks.rewards import function_name, load_reward_function

    try:
        fn = load_reward_function(setup["spec"]) if setup["spec"] else pickle.loads(setup["pickled"])
    except BaseException as error:  # noqa: BLE001 - reported to the trainer, which raises it
        outbox.send(("failed", " ".join(str(error).split()) or type(error).__name__))
        return
    name = function_name(fn)
    outbox.send(("ready", name))
    while True:
        try:
            chunk = inbox.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for sample in chunk:
            outbox.send(_score(fn, name, sample))
