"""Scoring completions with a task's reward: a timeout per call, and a fallback reward on errors.

    runner = RewardRunner(task, timeout_s=10.0, on_error="fallback", fallback_reward=0.0)
    rewards, stats = runner.score(prompts, completions)   # Completions, or (prompt_index, text) pairs
    # rewards: float32 [n], the weighted sum over the task's reward functions; stats:
    # reward/errors, reward/timeouts, reward/fallback_frac, reward/<name>/mean per function
    runner.close()

A user task has one or more reward functions (``minirl.tasks.reward_functions``), scored one
after the other over the batch. A per-sample function is called once per sample; a batched one
once per worker on a contiguous share of the samples, and that call is the unit of the timeout
(a batched call past ``timeout_s`` times out every sample it held). A problem replaces that
function's value for the sample by ``fallback_reward`` (the other functions still count).

Where a reward is computed:

* **A user reward function** (``task.reward_function``, i.e. a ``CustomRewardTask``) with a
  ``timeout_s`` runs in worker processes (``workers`` of them, started with the runner so their
  imports overlap the first rollout). Each is a fresh ``python`` interpreter started with
  ``subprocess`` (like multiprocessing's "spawn": no CUDA context and no threads or locks
  inherited from the trainer, and unlike it no re-import of the trainer's ``__main__``), in its
  own session, which imports the function again **from its spec** (``module:function`` or
  ``path/to/file.py:function``). A call that has not returned after ``timeout_s`` seconds (a
  pure-Python infinite loop included) gets its worker's whole process group killed; a fresh
  worker takes over the remaining samples. A worker that dies (segfault, ``os._exit``) is
  replaced the same way. This works from any thread: nothing relies on signals. An ``async def``
  per-sample function's samples go to a worker in chunks (``AWAIT_CHUNK``), awaited together there,
  each call bounded by ``timeout_s`` on the worker's event loop; a chunk's worker is killed only
  after ``timeout_s`` per sample of it (a function that blocks the loop runs them one by one).
* **A user reward function without a timeout** (``timeout_s=None``) and **the built-in
  verifiers** (synthetic exact match, JSONL exact/math_verify) run in this process, with no
  overhead: they are ours, pure and fast (math_verify has its own timeouts in the main thread).

What counts as a problem: the function raises, or returns ``None``, NaN, an infinity or a
non-number (``bool`` counts as 0/1), or (in a worker) does not return within ``timeout_s``.
With ``on_error="fail"`` the first problem raises ``RewardFunctionError``, one line naming the
function (``module:qualname``) and the problem; with ``on_error="fallback"`` the sample gets
``fallback_reward`` and is counted in the stats (``last_problems`` keeps up to three messages).
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from minirl.tasks._reward_worker import BOOT, TIMEOUT_ENV
from minirl.tasks.reward_functions import RewardFn, Sample, Scored, TrainerState, sample_of
from minirl.tasks.rewards import (
    WORKER_ENV,
    CustomRewardTask,
    RewardFunctionError,
    RewardSpecError,
    check_reward_value,
    function_name,
    raised_message,
    unscored_batch,
)

if TYPE_CHECKING:
    import torch

    from minirl.types import Prompt

OnError = Literal["fail", "fallback"]
ON_ERROR: tuple[str, ...] = ("fail", "fallback")
STARTUP_TIMEOUT_S = 120.0
"""How long a worker may take to start and import the reward module (not part of ``timeout_s``)."""

_SRC = str(Path(__file__).resolve().parents[2])  # the directory holding the ``minirl`` package


AWAIT_CHUNK = 64
"""The most samples of one ``async def`` a worker awaits together (one chunk)."""

AWAIT_GRACE_S = 1.0
"""A chunk of one ``async def``'s samples is awaited together in its worker, which bounds each call by ``timeout_s``
itself; the worker is killed only after ``timeout_s`` per sample of the chunk (a function that blocks the event loop,
``time.sleep`` or ``requests`` in an ``async def``, runs them one after another) and this much more."""


class _Worker:
    """One reward worker process and its two pipe ends; ``timeout_s`` goes to its environment (``TIMEOUT_ENV``)."""

    def __init__(self, setup: dict[str, Any], timeout_s: float | None = None) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", BOOT.format(src=_SRC), str(to_child_r), str(from_child_w), str(os.getpid())],
                pass_fds=(to_child_r, from_child_w), start_new_session=True, stdin=subprocess.DEVNULL,
                env={**os.environ, WORKER_ENV: "1", **({TIMEOUT_ENV: str(timeout_s)} if timeout_s else {})},
            )
        except BaseException:
            os.close(to_child_w)
            os.close(from_child_r)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.outbox = Connection(to_child_w, readable=False)
        self.inbox = Connection(from_child_r, writable=False)
        self.started_at = time.monotonic()
        self.ready = False
        self.in_flight: deque[int] = deque()  # sample indices sent and not yet answered, in order
        self.item_started_at = 0.0
        try:
            self.outbox.send(setup)
        except OSError:
            pass  # died at once: seen as EOF on the inbox

    def kill(self) -> None:
        """Kill the worker and everything it started (its process group); close the pipes."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.outbox.close()
        self.inbox.close()


class _Pool(list):
    """The runner's workers; ``closed`` once shut down (no replacement is started after that)."""

    closed = False


def extra_means(name: str, rewards: Sequence[Any]) -> dict[str, float]:
    """``reward/<name>/<key>``: the mean of each extra number the function's ``Scored`` rewards carried
    (verl's ``reward_extra_info``), over the samples that carried it."""
    sums: dict[str, list[float]] = {}
    for reward in rewards:
        for key, number in (reward.extras.items() if isinstance(reward, Scored) else ()):
            sums.setdefault(key, []).append(number)
    return {f"reward/{name}/{key}": sum(numbers) / len(numbers) for key, numbers in sums.items()}


def _in_process(entry: RewardFn, environments: bool = False) -> bool:
    """A reward function the trainer's process scores even when others run in workers: a reward model, or one that
    reads the rollouts' environments (TRL's ``environments=``; the instances live here): one naming it, or, when the
    rollouts have environments, one taking ``**kwargs`` (TRL passes them to every reward function)."""
    return bool(getattr(entry.fn, "in_process", False)) or entry.takes_environments or (
        environments and entry.batched and entry.takes_any_keyword)


def _kill_all(workers: _Pool, closed: bool = True) -> None:
    workers.closed = closed
    while workers:
        workers.pop().kill()


class RewardRunner:
    """Scores ``(prompt_index, completion_text)`` pairs with ``task``'s reward (module docstring).

    ``workers`` worker processes serve a user function when ``timeout_s`` is set; call
    ``close()`` (or use ``with``) to stop them; they are also stopped when the runner is
    garbage-collected and at interpreter exit. ``score`` may be called from any thread (one call
    at a time; concurrent calls wait for each other).
    """

    def __init__(
        self,
        task: Any,
        *,
        timeout_s: float | None = 10.0,
        on_error: OnError = "fail",
        fallback_reward: float = 0.0,
        workers: int = 1,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(map(repr, ON_ERROR))}, got {on_error!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        if not math.isfinite(fallback_reward):
            raise ValueError(f"fallback_reward must be finite, got {fallback_reward}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.task = task
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.fallback_reward = float(fallback_reward)
        self.num_workers = workers
        self.startup_timeout_s = startup_timeout_s
        self.functions: list[RewardFn] = list(task.functions) if isinstance(task, CustomRewardTask) else []
        self.fn = self.functions[0].fn if self.functions else None
        self.name = self.functions[0].full_name if self.functions else function_name(task.reward)
        self.in_worker = any(not _in_process(f) for f in self.functions) and timeout_s is not None
        """True when the reward runs in worker processes (a user function with a timeout; a reward model never)."""
        self.trainer_state: TrainerState | None = None
        """Training progress passed to TRL-style functions as ``trainer_state`` (the loop sets it)."""
        self.last_problems: list[str] = []
        """Up to three distinct problem messages of the last ``score`` call (fallback mode)."""
        self.last_columns: list[dict[str, Any]] = []
        """Per sample of the last ``score`` call: the columns reward functions gave it with TRL's ``log_extra``."""
        self.last_parts: Any = None
        """float32 [n, K] of the last ``score`` call: each reward function's value (NaN where it did not apply), the
        fallback where it failed; K = 1 for a task's own verifier. ``part_weights`` [K]: their weights."""
        self.part_weights: Any = None
        self._lock = threading.Lock()
        self._said_unscored = False
        self._workers = _Pool()
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)
        if self.in_worker:
            self._setup = self._worker_setup(task)
            self._start_workers()

    @classmethod
    def from_config(cls, task: Any, task_cfg: Any) -> RewardRunner:
        """The runner the ``task`` config section asks for (``reward_timeout_s``, ``reward_on_error``,
        ``reward_fallback``, ``reward_workers``)."""
        return cls(
            task, timeout_s=task_cfg.reward_timeout_s, on_error=task_cfg.reward_on_error,
            fallback_reward=task_cfg.reward_fallback, workers=getattr(task_cfg, "reward_workers", 1),
        )

    # ------------------------------------------------------------------------------------ scoring

    def score(
        self, prompts: Sequence[Prompt], completions: Sequence[tuple[int, str]] | Sequence[Any]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Rewards (float32 [n], in the order given) of ``completions``: ``(prompt_index, text)``
        pairs, or objects with ``.prompt_index`` and ``.text`` (``Completion``); and the stats
        ``reward/errors``, ``reward/timeouts`` (counts) and ``reward/fallback_frac``."""
        import torch  # here, so that importing this module stays light

        pairs = [item if isinstance(item, tuple) else (item.prompt_index, item.text) for item in completions]
        with self._lock:
            if self.functions:
                samples = [_sample(prompts, item, n, self.trainer_state) for n, item in enumerate(completions)]
                per_function = [self._score_function(k, samples) for k in range(len(self.functions))]
                results = [[column[n] for column in per_function] for n in range(len(samples))]
            else:
                results = [[self._score_here(prompts[index], text)] for index, text in pairs]
        weights = [f.weight for f in self.functions] or [1.0]
        values = [[value if kind == "ok" else self.fallback_reward for kind, value in row] for row in results]
        # no function applied: reward 0 here (TRL before 1.16); its NaN row in last_parts leaves it out of its group's
        # statistics with advantage 0 (TRL 1.16; minirl.loop.step_advantages, group-mean baselines and GDPO)
        unscored = [all(v is None for v in row) for row in values]
        if self.functions and values and all(unscored) and not self._said_unscored:  # TRL warns and goes on
            self._said_unscored = True
            print(f"minirl: warning: {unscored_batch(self.functions, len(values))} (said once; such a batch trains "
                  "nothing, and reward/unscored_frac counts them)", file=sys.stderr)
        rewards = [sum(w * v for w, v in zip(weights, row) if v is not None) for row in values]  # None: not applicable
        # each function's own rewards [n, K] (NaN: did not apply) and weights, for GDPO's advantages
        self.last_parts = torch.tensor([[math.nan if v is None else float(v) for v in row] for row in values],
                                       dtype=torch.float32).reshape(len(values), len(weights))
        self.part_weights = torch.tensor(weights, dtype=torch.float32)
        self.last_columns = [{key: value for kind, scored in row if kind == "ok" for key, value in
                              getattr(scored, "columns", {}).items()} for row in results]
        flat = [result for row in results for result in row]
        errors = sum(kind == "error" for kind, _ in flat)
        timeouts = sum(kind == "timeout" for kind, _ in flat)
        problems = [value for kind, value in flat if kind != "ok"]
        self.last_problems = list(dict.fromkeys(problems))[:3]
        stats = {
            "reward/errors": float(errors),
            "reward/timeouts": float(timeouts),
            "reward/fallback_frac": (errors + timeouts) / len(flat) if flat else 0.0,
            **({"reward/unscored_frac": sum(unscored) / len(unscored)} if self.functions and unscored else {}),
        }
        for k, entry in enumerate(self.functions):  # TRL's rewards/<name>/mean, one per function
            scored = [row[k] for row in values if row[k] is not None]  # TRL's nanmean: the samples it applied to
            if scored or not values:
                stats[f"reward/{entry.name}/mean"] = sum(scored) / len(scored) if scored else 0.0
            stats |= extra_means(entry.name, [row[k][1] for row in results if row[k][0] == "ok"])
        return torch.tensor(rewards, dtype=torch.float32), stats

    def _score_function(self, k: int, samples: list[Sample]) -> list[tuple[str, Any]]:
        """``(kind, value)`` per sample of function ``k``: in the workers, or here without a timeout."""
        entry = self.functions[k]
        here = _in_process(entry, any(sample.environment is not None for sample in samples))
        if entry.awaited and (here or not self.in_worker):  # an async def: its samples awaited together
            answers = entry.score_each(samples)
            failed = next((value for kind, value in answers if kind == "error"), None)
            if failed is not None and self.on_error == "fail":
                raise RewardFunctionError(failed)
            return answers
        if not entry.batched:
            items: list[Any] = list(samples)
        elif entry.slime:  # slime's --group-rm: one call per prompt's group, as its rollout makes them (a failure is
            items = _groups(samples)  # that group's alone)
        elif here:  # a reward model (one call, which batches its forwards itself), or environments
            items = [list(samples)] if samples else []
        else:  # one call per worker, on a contiguous share of the samples
            share = max(1, math.ceil(len(samples) / self.num_workers))
            items = [samples[i : i + share] for i in range(0, len(samples), share)]
        if self.in_worker and not here:
            answers = self._score_in_workers([(k, item) for item in items], entry.full_name)
        else:
            answers = [self._call_here(entry, item) for item in items]
        if not entry.batched:
            return answers
        out: list[tuple[str, Any]] = []
        for item, (kind, value) in zip(items, answers):
            out += [(kind, v) for v in value] if kind == "ok" else [(kind, value)] * len(item)
        return out

    def _call_here(self, entry: RewardFn, item: Any) -> tuple[str, Any]:
        try:
            values = entry.score(item if entry.batched else [item])
        except RewardFunctionError as error:
            if self.on_error == "fail":
                raise
            return "error", str(error)
        return "ok", values if entry.batched else values[0]

    def _problem(self, kind: str, message: str) -> tuple[str, Any]:
        if self.on_error == "fail":
            raise RewardFunctionError(message)
        return kind, message

    def _score_here(self, prompt: Prompt, text: str) -> tuple[str, Any]:
        """The built-in verifier (``task.reward``), in this process."""
        try:
            value = self.task.reward(prompt, text)
        except Exception as error:
            if self.on_error == "fail":
                raise RewardFunctionError(raised_message(self.name, error)) from error
            return "error", raised_message(self.name, error)
        try:
            return "ok", check_reward_value(value, self.name)
        except RewardFunctionError as error:
            return self._problem("error", str(error))

    # ------------------------------------------------------------------------------------ workers

    def _worker_setup(self, task: Any) -> dict[str, Any]:
        functions: list[dict[str, Any] | None] = []
        for entry in self.functions:
            if _in_process(entry):  # scored here; the worker keeps its place in the list
                functions.append(None)
                continue
            pickled = None
            if entry.spec is None:
                try:
                    if getattr(entry.fn, "__module__", None) == "__main__":
                        raise TypeError("defined in __main__")
                    pickled = pickle.dumps(entry.fn)
                except Exception:
                    raise RewardSpecError(
                        f"reward function {entry.full_name}: cannot be imported by a worker process (a lambda, closure or "
                        "function in __main__); define it in a module and name it 'module:function', or set "
                        "task.reward_timeout_s=null to run it in the trainer without a timeout"
                    ) from None
            fields = {key: value for key, value in entry.__getstate__().items() if key != "fn"}  # how it is called
            functions.append({**fields, "pickled": pickled})
        return {"sys_path": list(sys.path), "functions": functions}

    def _start_workers(self) -> None:
        if self._workers.closed:
            raise RewardFunctionError(f"reward function {self.name}: the reward runner is shut down")
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._setup, self.timeout_s))

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        if worker in self._workers:  # (not after a shutdown from another thread)
            self._workers.remove(worker)
        self._start_workers()

    def _score_in_workers(self, samples: list[tuple[int, Any]], name: str) -> list[tuple[str, Any]]:
        """``(kind, value)`` per item ``(function index, sample or list of samples)``, from the workers."""
        # Over 60 lines: the one scheduler of work items over worker processes (dispatch, timeout, kill and
        # replace, fallback); split, its state would travel between functions.
        results: list[tuple[str, Any] | None] = [None] * len(samples)
        self._missing = len(samples)  # results still None
        pending = deque(range(len(samples)))
        awaited = bool(samples) and self.functions[samples[0][0]].awaited  # one async def: its chunk awaited together
        chunk = max(1, math.ceil(len(samples) / (self.num_workers if awaited else 4 * self.num_workers)))
        chunk = min(chunk, AWAIT_CHUNK) if awaited else chunk
        timeout = float(self.timeout_s or 0) * chunk + AWAIT_GRACE_S if awaited else float(self.timeout_s or 0)
        try:
            while self._missing:
                self._start_workers()
                if not pending and not any(w.in_flight for w in self._workers):
                    raise RuntimeError("RewardRunner: samples lost track of (a bug in minirl)")
                for worker in list(self._workers):
                    if worker.ready and not worker.in_flight and pending:
                        take = [pending.popleft() for _ in range(min(chunk, len(pending)))]
                        worker.in_flight.extend(take)
                        worker.item_started_at = time.monotonic()
                        try:
                            worker.outbox.send([samples[i] for i in take])
                        except OSError:
                            pass  # it died: EOF on its inbox below puts the samples back
                deadlines = [
                    w.item_started_at + timeout if w.ready else w.started_at + self.startup_timeout_s
                    for w in self._workers
                    if w.in_flight or not w.ready
                ]
                next_deadline = min(deadlines, default=time.monotonic() + 0.1)
                ready = wait([w.inbox for w in self._workers], max(0.0, next_deadline - time.monotonic()))
                for worker in [w for w in self._workers if w.inbox in ready]:
                    try:
                        message = worker.inbox.recv()
                    except (EOFError, OSError):
                        self._worker_died(worker, results, pending, name)
                        continue
                    if not worker.ready:
                        if message[0] != "ready":
                            raise RewardSpecError(f"reward function {name}: the worker process cannot load it: {message[1]}")
                        worker.ready = True
                        continue
                    index = worker.in_flight.popleft()
                    worker.item_started_at = time.monotonic()
                    kind = message[0] if message[0] in ("ok", "timeout") else "error"
                    self._put(results, index, message if kind == "ok" else self._problem(kind, message[1]))
                now = time.monotonic()
                for worker in list(self._workers):
                    if not worker.ready and now > worker.started_at + self.startup_timeout_s:
                        raise RewardFunctionError(
                            f"reward function {self.name}: its worker process did not start within {self.startup_timeout_s:g} s"
                        )
                    if worker.ready and worker.in_flight and now > worker.item_started_at + timeout:
                        index = worker.in_flight.popleft()
                        pending.extendleft(reversed(worker.in_flight))
                        worker.in_flight.clear()
                        self._replace(worker)
                        self._put(results, index, self._problem(
                            "timeout",
                            f"reward function {name} did not return within {self.timeout_s:g} s "
                            "(task.reward_timeout_s); its worker process was killed",
                        ))
        finally:
            for worker in list(self._workers):
                if worker.in_flight:  # interrupted by an error: its late answers must not leak into the next call
                    self._replace(worker)
        return results  # type: ignore[return-value]

    def _worker_died(self, worker: _Worker, results: list, pending: deque, name: str) -> None:
        worker.proc.wait()
        code = worker.proc.returncode
        if not worker.ready:
            raise RewardFunctionError(f"reward function {self.name}: its worker process exited while starting (exit code {code})")
        index = worker.in_flight.popleft() if worker.in_flight else None
        pending.extendleft(reversed(worker.in_flight))
        worker.in_flight.clear()
        self._replace(worker)
        if index is not None:
            self._put(results, index, self._problem(
                "error", f"reward function {name} killed its worker process (exit code {code})"
            ))

    def _put(self, results: list, index: int, result: tuple[str, Any]) -> None:
        results[index] = result
        self._missing -= 1

    # ------------------------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the worker processes (a later ``score`` starts new ones)."""
        with self._lock:
            _kill_all(self._workers, closed=False)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sample(prompts: Sequence[Prompt], item: Any, index: int, trainer_state: TrainerState | None) -> Sample:
    """The ``Sample`` of the ``index``-th item scored: a ``(prompt_index, text)`` pair, or a ``Completion`` with what its
    rollout recorded (its turns, its environment, the prompt its ``reset()`` added to: TRL's prompt, the prompt's ids,
    whether it was cut at the budget)."""
    if isinstance(item, tuple):
        prompt_index, text = item
        return sample_of(prompts[prompt_index], text, (), trainer_state, index=index, group_index=prompt_index)
    return sample_of(getattr(item, "environment_prompt", None) or prompts[item.prompt_index], item.text,
                     item.completion_ids, trainer_state, getattr(item, "messages", None),
                     getattr(item, "environment_reward", None), getattr(item, "tool_extra_fields", None),
                     getattr(item, "environment", None), index=index, group_index=item.prompt_index,
                     prompt_ids=list(getattr(item, "prompt_ids", [])),
                     truncated=getattr(item, "finish_reason", None) == "length")


def _groups(samples: list[Any]) -> list[list[Any]]:
    """``samples`` split where ``group_index`` changes: each prompt's group (its samples are contiguous), the calls a
    slime ``--group-rm`` function gets."""
    return [list(group) for _, group in itertools.groupby(samples, key=lambda sample: sample.group_index)]
