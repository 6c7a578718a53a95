"""Environments the model acts in (``task.environment``): TRL's ``GRPOTrainer(environment_factory=...)``.

An environment is a class (or any factory) whose instances hold the state of one rollout::

    class Counter:
        def reset(self, **row):              # before each rollout, with the data row's fields (prompt, answer, ...)
            self.total = 0
            return "Count to 3."             # None, or text appended to the prompt's last message (the reward
                                             # functions' prompts too, as TRL's)
        def add(self, n: int) -> int:        # every public method is a tool (type hints and a docstring, as tools)
            \"\"\"Add n to the total.

            Args:
                n: what to add.
            \"\"\"
            self.total += n
            return self.total
        def get_reward(self) -> float:       # optional: the environment scores its rollout
            return float(self.total == 3)

Each rollout (each of a step's P x G responses) gets an instance of its own, reset with its row; instances are
kept and reset again in later steps, more made only when a step needs more at once (TRL's pool). The response is
sampled in turns as with ``task.tools`` (``minirl.rollout.tools``), its calls going to its instance's methods (and to
``task.tools``' functions, offered beside them). Once it ends, ``get_reward()`` (awaited if ``async``) is its reward
from the environment: a reward function named after the class, weight 1, beside ``task.reward_functions``
(``reward/<Class>/mean``; it reaches the reward functions as the ``environment_reward`` column too). Like any reward
function it replaces the task's built-in check (``task.reward``): without ``task.reward_functions`` the environment's
score is the whole reward. A call whose result leaves no room in the response's budget has still run (the response
ends unfinished without it), so ``get_reward`` sees what it did, as in TRL.

``task.environment: {name: "module:Class", ...}`` (TRL's dict of factories): each data row names its environment
in an ``environment`` column, and its prompt shows that environment's tools only.

A reward function that names an ``environments`` parameter gets the rollouts' instances, as TRL passes them
(``def reward(environments, **kwargs): return [env.score for env in environments]``); it runs in the trainer's process,
where the instances live, while the others run in workers (the instances are not sent there, nor saved in a dump).
``reset``'s text is in the prompt the engine and the trainer see; reward functions get the row's prompt as written.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from minirl.config import ConfigError
from minirl.types import Prompt

SPECIAL_METHODS = ("reset", "get_reward")


class EnvironmentFailure(ValueError):
    """An environment's ``reset`` or ``get_reward`` raised or returned what it may not; one line naming it."""


class Environments:
    """The factories of ``task.environment`` by name (None: the single one), their tools, and a pool of instances."""

    def __init__(self, factories: dict[str | None, Callable[[], Any]]) -> None:
        self.factories = factories
        self.pool: dict[str | None, list[Any]] = {}
        self.methods: dict[str | None, list[str]] = {}
        self.rewarded: dict[str | None, str] = {}  # environments with get_reward: their class name
        for name, factory in factories.items():
            instance = _made(factory, name)  # a probe, kept as the pool's first instance
            members = [member for member, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)]
            if "reset" not in members:
                raise ConfigError(f"task.environment: {_shown(name, instance)} has no reset method (each rollout "
                                  "resets its instance, TRL's environment_factory contract)")
            self.methods[name] = [m for m in members if m not in SPECIAL_METHODS and not m.startswith("_")]
            if "get_reward" in members:
                self.rewarded[name] = type(instance).__name__
            self.pool[name] = [instance]

    @property
    def named(self) -> bool:
        """Several environments, chosen by each row's ``environment`` column."""
        return None not in self.factories

    def tools(self, instance: Any, name: str | None) -> list[Callable[..., Any]]:
        """``instance``'s tools: its public methods, bound."""
        return [getattr(instance, method) for method in self.methods[name]]

    def schemas(self, name: str | None) -> list[dict[str, Any]]:
        from minirl.rollout.tools import Toolbox

        return Toolbox(self.tools(self.pool[name][0], name)).schemas()

    def name_of(self, prompt: Prompt) -> str | None:
        """The environment a prompt's rollouts run in."""
        if not self.named:
            return None
        name = (prompt.meta or {}).get("environment")
        if name not in self.factories:
            raise ConfigError(f"task.environment: a row's environment {name!r} is none of {sorted(map(str, self.factories))} "
                              "(each row names its environment in an 'environment' column)")
        return str(name)

    def take(self, names: Sequence[str | None]) -> list[Any]:
        """One instance per rollout, from the pool (more made when these need more at once)."""
        out, used = [], dict.fromkeys(self.factories, 0)
        for name in names:
            pool = self.pool[name]
            if used[name] == len(pool):
                pool.append(_made(self.factories[name], name))
            out.append(pool[used[name]])
            used[name] += 1
        return out

    def reset(self, instance: Any, prompt: Prompt) -> Prompt:
        """``instance.reset(**row)`` (the row's prompt, answer and columns); its text, if any, appended to the prompt's
        last message (TRL's rule)."""
        row = {key: value for key, value in (prompt.meta or {}).items() if key not in ("source", "tools")}
        if self.named:
            row.pop("environment", None)
        row |= {"prompt": prompt.messages if prompt.messages is not None else prompt.text, "answer": prompt.answer}
        try:
            observation = _resolved(instance.reset(**row))
        except Exception as error:
            raise EnvironmentFailure(f"task.environment: {type(instance).__name__}.reset raised {type(error).__name__}: "
                                     f"{' '.join(str(error).split())}") from error
        if observation is None:
            return prompt
        if not isinstance(observation, str):
            raise EnvironmentFailure(f"task.environment: {type(instance).__name__}.reset returned a "
                                     f"{type(observation).__name__}; expected text to append to the prompt, or None")
        if prompt.messages is None:
            return replace(prompt, text=prompt.text + observation)
        last = prompt.messages[-1]
        return replace(prompt, messages=[*prompt.messages[:-1], {**last, "content": str(last.get("content") or "") + observation}])

    def reward(self, instance: Any, name: str | None) -> float | None:
        """The rollout's reward from its environment (``get_reward()``), or None when it defines none."""
        if name not in self.rewarded:
            return None
        try:
            value = float(_resolved(instance.get_reward()))
        except Exception as error:
            raise EnvironmentFailure(f"task.environment: {type(instance).__name__}.get_reward raised or returned no "
                                     f"number: {type(error).__name__}: {' '.join(str(error).split())}") from error
        if value != value or value in (float("inf"), float("-inf")):
            raise EnvironmentFailure(f"task.environment: {type(instance).__name__}.get_reward returned {value}")
        return value


def _made(factory: Callable[[], Any], name: str | None) -> Any:
    """A new instance from ``factory``; one that raises is one line naming it."""
    try:
        return factory()
    except Exception as error:
        which = getattr(factory, "__qualname__", type(factory).__name__) + ("" if name is None else f" ({name!r})")
        raise EnvironmentFailure(f"task.environment: making {which} raised {type(error).__name__}: "
                                 f"{' '.join(str(error).split())}") from error


def _resolved(value: Any) -> Any:
    from minirl.tasks.reward_functions import resolve

    return resolve(value)


def _shown(name: str | None, instance: Any) -> str:
    return type(instance).__name__ if name is None else f"{name!r} ({type(instance).__name__})"


@lru_cache(maxsize=8)
def _probed(factories: tuple[tuple[str | None, Callable[[], Any]], ...]) -> Environments:
    return Environments(dict(factories))


def load_environments(setting: str | dict[str, str]) -> Environments:
    """``task.environment`` (``module:Class``, or ``{name: module:Class}``), loaded, and probed once per process for
    the same classes (a class defined again, in a notebook, is a new one: probed anew)."""
    from minirl.tasks.rewards import RewardSpecError, load_reward_function

    spec = ((None, setting),) if isinstance(setting, str) else tuple(sorted(setting.items()))
    factories = []
    for name, target in spec:
        try:
            factories.append((name, load_reward_function(target)))  # any callable: a factory
        except RewardSpecError as error:
            raise ConfigError("task.environment: " + str(error).replace("reward function ", "factory ", 1)) from None
    return _probed(tuple(factories))
