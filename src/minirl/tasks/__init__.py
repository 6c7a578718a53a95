"""Tasks: prompts with a verifiable reward. ``build_task(kind, **kwargs)`` makes one by name.

    build_task("reverse", difficulty=8, num_train=2000, num_eval=200, seed=0)
    build_task("add", difficulty=3)          # also "sort"
    build_task("jsonl", path="train.jsonl", eval_path=None, eval_fraction=0.1, reward="exact",
               on_bad_row="skip", max_prompt_chars=4000)    # also .json, .parquet, a datasets dir
    build_task("reverse", reward_function="my_pkg.rewards:score")   # any kind, user verifier
    build_task("jsonl", path=..., reward_functions=[{"function": "my_rewards:fmt", "weight": 0.2}, ...])
    build_task_from_config(cfg.task)         # the same from the ``task`` config section

Rewards are computed by ``RewardRunner`` (``minirl.tasks.reward_runner``): user functions in a
worker process with a timeout, and a fallback reward on errors when the config asks for one.

The names below are imported on first use (PEP 562), so ``import minirl.tasks.rewards`` does not
import torch: the reward worker process starts in a fraction of a second.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minirl.tasks.base import Task, TeacherTask
    from minirl.tasks.jsonl import JsonlTask, TaskDataError
    from minirl.tasks.reward_runner import RewardRunner
    from minirl.tasks.rewards import CustomRewardTask, RewardFunctionError, RewardSpecError, load_reward_function
    from minirl.tasks.synthetic import ANSWER_MARKER, AddTask, ReverseTask, SortTask, SyntheticTask

_LAZY: dict[str, str] = {
    "Task": "minirl.tasks.base",
    "TeacherTask": "minirl.tasks.base",
    "JsonlTask": "minirl.tasks.jsonl",
    "TaskDataError": "minirl.tasks.jsonl",
    "RewardRunner": "minirl.tasks.reward_runner",
    "CustomRewardTask": "minirl.tasks.rewards",
    "RewardFunctionError": "minirl.tasks.rewards",
    "RewardSpecError": "minirl.tasks.rewards",
    "load_reward_function": "minirl.tasks.rewards",
    "ANSWER_MARKER": "minirl.tasks.synthetic",
    "AddTask": "minirl.tasks.synthetic",
    "ReverseTask": "minirl.tasks.synthetic",
    "SortTask": "minirl.tasks.synthetic",
    "SyntheticTask": "minirl.tasks.synthetic",
}

TASK_KINDS: tuple[str, ...] = ("reverse", "add", "sort", "jsonl")


def _tasks() -> dict[str, Callable[..., Any]]:
    from minirl.tasks.jsonl import JsonlTask
    from minirl.tasks.synthetic import AddTask, ReverseTask, SortTask

    return {"reverse": ReverseTask, "add": AddTask, "sort": SortTask, "jsonl": JsonlTask}


def __getattr__(name: str) -> Any:
    if name == "TASKS":
        value: Any = _tasks()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def build_task(
    kind: str, reward_function: str | Callable | None = None, reward_functions: list | None = None,
    reward_device: str = "cpu", trust_remote_code: bool = False, chat_template_kwargs: dict[str, Any] | None = None,
    **kwargs: Any
) -> Task:
    """The task ``kind`` built with ``kwargs``; ``reward_function`` (a ``"module:function"`` spec
    or a callable ``fn(prompt, completion, answer)``) or ``reward_functions`` (a list of
    ``RewardFn``, or of dicts ``{"function", "weight", "batched", "name", "kwargs"}`` or ``{"model", "weight",
    "name"}``: a reward model, on ``reward_device``) replace its verifier."""
    from minirl.tasks.reward_functions import make_reward_fn
    from minirl.tasks.reward_model import RewardModel
    from minirl.tasks.rewards import CustomRewardTask

    tasks = _tasks()
    if kind not in tasks:
        raise ValueError(f"unknown task kind {kind!r}; known kinds: {', '.join(tasks)}")
    task = tasks[kind](**kwargs)
    if reward_functions:
        entries = []
        for entry in reward_functions:
            if isinstance(entry, dict):
                fields = {key: value for key, value in entry.items() if value is not None}
                if "model" in fields:
                    target: Any = RewardModel(fields.pop("model"), device=reward_device, trust_remote_code=trust_remote_code,
                                              chat_template_kwargs=chat_template_kwargs)
                    fields.pop("kwargs", None)
                else:
                    target = fields.pop("function")
                entry = make_reward_fn(target, **fields)
            entries.append(entry)
        task = CustomRewardTask(task, entries)
    elif reward_function is not None:
        task = CustomRewardTask(task, reward_function)
    return task


def build_task_from_config(
    task_cfg: Any, *, max_prompt_tokens: int | None = None, count_tokens: Callable[[Any], int] | None = None,
    reward_device: str = "cpu", trust_remote_code: bool = False,
) -> Task:
    """The task described by the ``task`` config section (``minirl.config.TaskConfig``).

    ``max_prompt_tokens`` (with ``count_tokens(prompt) -> int``, the length of
    ``minirl.tasks.chat.encode_prompt``) makes longer prompts bad rows, like ``task.max_prompt_chars``.
    A reward model runs on ``reward_device`` (the run's ``cluster.device``).
    """
    t = task_cfg
    if t.kind == "jsonl":
        kwargs: dict[str, Any] = dict(
            path=t.path, eval_path=t.eval_path, eval_fraction=t.eval_fraction, reward=t.reward, seed=t.seed,
            on_bad_row=t.on_bad_row, max_prompt_chars=t.max_prompt_chars,
            max_prompt_tokens=max_prompt_tokens, count_tokens=count_tokens,
            prompt_column=t.prompt_column, answer_column=t.answer_column, plain_chat=t.chat_template == "plain",
            dataset_config=t.dataset_config, train_split=t.train_split, eval_split=t.eval_split,
            system_prompt=t.system_prompt, chat_prompts=t.chat_prompts,
            answer_required=not (t.reward_function or t.reward_functions or t.environment),  # a user's may need none
            environment_prompts=bool(t.environment),  # a row's prompt may be its environment's reset() text alone
            answer_named=t.answer_column != "answer",  # ... but a column named is every row's (a saved config repeats
            # every key, so a name is told by its value, not by being set)
        )
    else:
        kwargs = dict(difficulty=t.difficulty, num_train=t.num_train_prompts, num_eval=t.num_eval_prompts, seed=t.seed)
    functions = [entry.model_dump() for entry in t.reward_functions]
    reward_function = t.reward_function
    if getattr(t, "environment", None):  # each environment that scores its rollouts: one more reward function
        from minirl.rollout.environments import load_environments

        rewarded = load_environments(t.environment).rewarded  # environment name (None: the only one) -> class
        if rewarded and reward_function:
            functions, reward_function = [{"function": reward_function}], None
        for cls in sorted(set(rewarded.values())):  # one per class, for the rows of its environments (TRL's rule)
            names = sorted(name for name, of in rewarded.items() if of == cls and name is not None)
            functions.append({"function": "minirl.tasks.reward_functions:environment_reward", "name": cls, "weight": 1.0,
                              **({"kwargs": {"class_environments": names}} if names else {})})
    return build_task(t.kind, reward_function=reward_function, reward_functions=functions, reward_device=reward_device,
                      trust_remote_code=trust_remote_code, chat_template_kwargs=getattr(t, "chat_template_kwargs", None),
                      **kwargs)


def data_metrics(task: Any) -> dict[str, float]:
    """Data-quality counters of ``task`` to log once (``data/skipped_rows``: JSONL rows skipped)."""
    return {"data/skipped_rows": float(getattr(task, "skipped_rows", 0) or 0)}


__all__ = [
    "ANSWER_MARKER",
    "TASKS",
    "TASK_KINDS",
    "AddTask",
    "CustomRewardTask",
    "JsonlTask",
    "ReverseTask",
    "RewardFunctionError",
    "RewardRunner",
    "RewardSpecError",
    "SortTask",
    "SyntheticTask",
    "Task",
    "TaskDataError",
    "TeacherTask",
    "build_task",
    "build_task_from_config",
    "data_metrics",
    "load_reward_function",
]
