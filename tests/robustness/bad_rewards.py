"""Reward functions for the robustness tests: one per way a user's verifier goes wrong.

Named by spec (``tests.robustness.bad_rewards:<name>``) so the reward worker imports them.
"""

from __future__ import annotations

import os
import time


def good(prompt: str, completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer else 0.0


def raises(prompt: str, completion: str, answer: str) -> float:
    raise ValueError("no answer found")


def returns_nan(prompt: str, completion: str, answer: str) -> float:
    return float("nan")


def returns_inf(prompt: str, completion: str, answer: str) -> float:
    return float("-inf")


def returns_str(prompt: str, completion: str, answer: str) -> str:
    return "1.0"


def hangs(prompt: str, completion: str, answer: str) -> float:
    while True:  # a pure-Python infinite loop: no signal or GIL release will stop it
        pass


def hangs_on_loop(prompt: str, completion: str, answer: str) -> float:
    """Hangs only when the completion is 'loop'; scores the others like ``good``."""
    if completion == "loop":
        while True:
            pass
    return good(prompt, completion, answer)


def sleeps(prompt: str, completion: str, answer: str) -> float:
    time.sleep(60)
    return 1.0


def exits(prompt: str, completion: str, answer: str) -> float:
    raise SystemExit(3)


def crashes_on_crash(prompt: str, completion: str, answer: str) -> float:
    """Kills its own process (as a segfault would) when the completion is 'crash'."""
    if completion == "crash":
        os._exit(7)
    return good(prompt, completion, answer)


def flaky(prompt: str, completion: str, answer: str) -> float:
    """Raises on the completion 'boom', NaN on 'nan', else scores like ``good``."""
    if completion == "boom":
        raise RuntimeError("boom")
    if completion == "nan":
        return float("nan")
    return good(prompt, completion, answer)


def worker_pid(prompt: str, completion: str, answer: str) -> float:
    """The process that ran the call (to check where rewards are computed)."""
    return float(os.getpid())


NOT_CALLABLE = 42


async def sleeps_async(prompt: str, completion: str, answer: str) -> float:
    """An async reward that never returns in time (awaited in the worker, killed at the timeout)."""
    import asyncio

    await asyncio.sleep(60)
    return 1.0


def hangs_batched(prompts: list, completions: list, **kwargs: object) -> list[float]:
    """A batched (TRL-style) reward whose one call hangs."""
    while True:
        pass


def raises_batched(prompts: list, completions: list, **kwargs: object) -> list[float]:
    raise ValueError("batched verifier broke")


def huge_when_asked(prompt: str, completion: str, answer: str) -> float:
    """1e300 (finite in float64, inf in float32) once ``MINIRL_TEST_HUGE_REWARD`` is set; else a dense score."""
    import os

    if os.environ.get("MINIRL_TEST_HUGE_REWARD"):
        return 1e300
    return sum(a == b for a, b in zip(completion, answer)) / max(len(answer), 1)


def where_raised(name: str) -> str:
    """`` (at tests/robustness/bad_rewards.py:LINE, in NAME)``: the line of ``NAME``'s ``raise``, as a reward
    function's error names it (computed, so editing this file moves no test)."""
    import inspect

    lines, first = inspect.getsourcelines(globals()[name])
    offset = next(index for index, line in enumerate(lines) if "raise " in line)
    return f" (at tests/robustness/bad_rewards.py:{first + offset}, in {name})"
