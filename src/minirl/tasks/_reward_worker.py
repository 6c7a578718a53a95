"""The reward worker process: imports a user reward function and scores samples sent to it.

Started by ``RewardRunner`` as ``python -c <boot> READ_FD WRITE_FD`` (a fresh interpreter: no
CUDA context, no threads or locks inherited from the trainer, no re-import of the trainer's
``__main__``). It runs in its own session, so killing its process group also stops processes a
reward function started. Messages are ``multiprocessing.connection`` frames on two pipes:

    parent -> worker   {"sys_path": [...], "functions": [{"spec": "module:function" | None,
                        "pickled": bytes | None, and the other fields of its ``RewardFn`` but ``fn`` (its
                        ``__getstate__``: batched, name, verl, kwargs, slime, key, ...)}
                        or None (scored by the trainer), ...]}
    worker -> parent   ("ready", names) | ("failed", one-line message)
    parent -> worker   [(function index, Sample or [Sample, ...]), ...]   a chunk of items; None = exit
    worker -> parent   ("ok", reward or [rewards]) | ("error" or "timeout", one-line message)   one per item, in order

An item is one sample for a per-sample function, a list of samples for a batched one (one call). A chunk of one
``async def``'s samples is awaited together, each call bounded by the run's timeout here (``("timeout", ...)``), the
answers sent when all are in.
Only the standard library and ``minirl.tasks.rewards`` / ``reward_functions`` (which import no
torch) are imported here.
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

TIMEOUT_ENV = "MINIRL_REWARD_TIMEOUT_S"
"""Set in a worker's environment to the runner's ``timeout_s``: a reward function that retries (slime's ``remote_rm``)
keeps its tries within it and says why it failed before the worker is killed; an ``async def``'s calls are bounded
by it here."""

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


def _score(entry: Any, payload: Any) -> tuple[str, Any]:
    from minirl.tasks.rewards import RewardFunctionError

    try:
        values = entry.score(payload if entry.batched else [payload])
    except KeyboardInterrupt:
        raise
    except RewardFunctionError as error:
        return "error", str(error)
    except BaseException as error:  # SystemExit from a user function is an error, not an exit
        from minirl.tasks.rewards import raised_message

        return "error", raised_message(entry.full_name, error)
    return "ok", values if entry.batched else values[0]


def main(read_fd: int, write_fd: int, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops us
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        setup = inbox.recv()
    except EOFError:
        return
    sys.path[:] = setup["sys_path"]
    from minirl.tasks.reward_functions import RewardFn
    from minirl.tasks.rewards import load_reward_function

    try:
        functions = [  # None: a function the trainer scores itself (a reward model)
            RewardFn(load_reward_function(f["spec"]) if f["spec"] else pickle.loads(f["pickled"]),
                     **{key: value for key, value in f.items() if key != "pickled"})
            if f is not None else None
            for f in setup["functions"]
        ]
    except BaseException as error:  # reported to the trainer, which raises it
        outbox.send(("failed", " ".join(str(error).split()) or type(error).__name__))
        return
    outbox.send(("ready", [entry.full_name for entry in functions if entry is not None]))
    while True:
        try:
            chunk = inbox.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        awaited = [functions[index] for index, _ in chunk if functions[index].awaited]
        if len(awaited) == len(chunk) and len({id(entry) for entry in awaited}) == 1:  # one async def's samples:
            timeout = float(os.environ.get(TIMEOUT_ENV) or 0) or None  # awaited together, each
            for answer in awaited[0].score_each([payload for _, payload in chunk], timeout):  # bounded here
                outbox.send(answer)
            continue
        for index, payload in chunk:
            outbox.send(_score(functions[index], payload))
