"""Tasks: prompts with a verifiable reward. ``build_task(kind, **kwargs)`` makes one by name.

    build_task("reverse", difficulty=8, num_train=2000, num_eval=200, seed=0)
    build_task("add", difficulty=3)          # also "sort"
    build_task("jsonl", path="train.jsonl", eval_path=None, eval_fraction=0.1, reward="exact")
    build_task("reverse", reward_function="my_pkg.rewards:score")   # any kind, user verifier
"""

from __future__ import annotations

from typing import Any, Callable

from minirl.tasks.base import Task, TeacherTask
from minirl.tasks.jsonl import JsonlTask, TaskDataError
from minirl.tasks.rewards import (
    CustomRewardTask,
    RewardFunctionError,
    RewardSpecError,
    load_reward_function,
)
from minirl.tasks.synthetic import ANSWER_MARKER, AddTask, ReverseTask, SortTask, SyntheticTask

TASKS: dict[str, Callable[..., Task]] = {
    "reverse": ReverseTask,
    "add": AddTask,
    "sort": SortTask,
    "jsonl": JsonlTask,
}


def build_task(kind: str, reward_function: str | Callable | None = None, **kwargs: Any) -> Task:
    """The task ``kind`` built with ``kwargs``; ``reward_function`` (a ``"module:function"`` spec
    or a callable ``fn(prompt, completion, answer)``) replaces its verifier when given."""
    if kind not in TASKS:
        raise ValueError(f"unknown task kind {kind!r}; known kinds: {', '.join(TASKS)}")
    task = TASKS[kind](**kwargs)
    if reward_function is not None:
        task = CustomRewardTask(task, reward_function)
    return task


__all__ = [
    "ANSWER_MARKER",
    "TASKS",
    "AddTask",
    "CustomRewardTask",
    "JsonlTask",
    "ReverseTask",
    "RewardFunctionError",
    "RewardSpecError",
    "SortTask",
    "SyntheticTask",
    "Task",
    "TaskDataError",
    "TeacherTask",
    "build_task",
    "load_reward_function",
]
