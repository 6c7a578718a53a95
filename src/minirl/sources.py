"""Where a global step's rollouts and rewards come from: the seams of ``minirl.loop``.

* ``EngineRollouts``: the rollout engine samples them (the default).
* ``RolloutDump``: any source, with each step's rollouts and rewards also written to
  ``DIR/step_000001.pt`` (``minirl train --dump-rollouts DIR``).
* ``RolloutReplay``: a dump's rollouts and rewards served again, step by step, with no sampling
  and no verifier (``minirl train --rollouts-from DIR``): an invariant test or a bug report runs
  the trainer on fixed data, and a run from its own dump reproduces its training metrics.

A rollout source has ``rollouts(step, prompts, n, sampling, record_routes) -> list[Completion]`` (``EngineRollouts``
also a ``control``, partial rollouts' one engine call a step, when its engine ``continues_in_call``);
a reward source ``score(prompts, completions) -> (rewards [n], stats)`` and ``close()`` (the
task's ``RewardRunner`` is one). ``minirl.loop.train(cfg, rollouts=..., rewards=...)`` takes both. Under
``rollout.async_steps`` both are called from a thread beside the update (never two calls at once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from minirl.config import ConfigError
from minirl.rollout.base import DecodeControl
from minirl.types import Completion, Prompt, SamplingParams


class RolloutSource(Protocol):
    def rollouts(self, step: int, prompts: list[Prompt], n: int, sampling: SamplingParams, *,
                 record_routes: bool) -> list[Completion]: ...


class RewardSource(Protocol):
    def score(self, prompts: list[Prompt], completions: list[Completion]) -> tuple[torch.Tensor, dict[str, float]]: ...

    def close(self) -> None: ...


class ForwardsProgress:
    """A wrapper of a reward source passes the loop's training progress (``trainer_state``, see
    ``minirl.tasks.reward_functions.TrainerState``) on to the source it wraps, if that one takes it."""

    rewards: Any

    @property
    def trainer_state(self) -> Any:
        return getattr(self.rewards, "trainer_state", None)

    @trainer_state.setter
    def trainer_state(self, state: Any) -> None:
        if hasattr(self.rewards, "trainer_state"):
            self.rewards.trainer_state = state


class EngineRollouts:
    """The rollout engine (or ``EngineGroup``) samples each step's rollouts."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @property
    def continues_in_call(self) -> bool:
        """Whether ``rollouts`` takes a ``DecodeControl`` (``minirl.rollout.base``): the engine does."""
        return bool(getattr(self.engine, "continues_in_call", False))

    def rollouts(self, step: int, prompts: list[Prompt], n: int, sampling: SamplingParams, *,
                 record_routes: bool, control: DecodeControl | None = None) -> list[Completion]:
        """The engine's completions; ``control`` (partial rollouts' one call a step) only where it takes one."""
        if control is not None:
            return self.engine.generate(prompts, n, sampling, record_routes=record_routes, control=control)
        return self.engine.generate(prompts, n, sampling, record_routes=record_routes)


def step_file(directory: Path, step: int, round_index: int = 0) -> Path:
    """A step's dumped rollouts; dynamic sampling's later rounds (``rollout.filter_groups``) get their own file."""
    return Path(directory) / (f"step_{step:06d}.pt" if round_index == 0 else f"step_{step:06d}_round{round_index}.pt")


class _Rounds:
    """Counts the calls of one step: 0 for its first ``rollouts``, 1 for dynamic sampling's second round, ..."""

    def __init__(self) -> None:
        self.step, self.round = -1, 0

    def next(self, step: int) -> int:
        self.round = self.round + 1 if step == self.step else 0
        self.step = step
        return self.round


class RolloutDump(ForwardsProgress):
    """``source``'s rollouts and ``rewards``' scores, also written to ``directory`` step by step."""

    def __init__(self, source: RolloutSource, rewards: RewardSource, directory: str | Path) -> None:
        self.source, self.rewards, self.directory = source, rewards, Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._step, self._rounds = 0, _Rounds()
        self._prompts: list[Prompt] = []
        self._completions: list[Completion] = []

    def rollouts(self, step: int, prompts: list[Prompt], n: int, sampling: SamplingParams, *,
                 record_routes: bool) -> list[Completion]:
        self._step, self._prompts = step, prompts
        self._rounds.next(step)
        self._completions = self.source.rollouts(step, prompts, n, sampling, record_routes=record_routes)
        return self._completions

    def score(self, prompts: list[Prompt], completions: list[Completion]) -> tuple[torch.Tensor, dict[str, float]]:
        values, stats = self.rewards.score(prompts, completions)
        if completions is self._completions:  # a training step's rollouts (evaluation is not dumped)
            parts = self.last_parts
            torch.save({
                "step": self._step,
                "prompts": [p.text for p in prompts],
                "completions": [_completion_state(c) for c in completions],
                "rewards": values.detach().cpu(),
                "reward_stats": dict(stats),
                **({} if parts is None else {"reward_parts": parts.detach().cpu()}),
            }, step_file(self.directory, self._step, self._rounds.round))
        return values, stats

    @property
    def last_parts(self) -> torch.Tensor | None:
        """Each reward function's values of the last ``score`` (``RewardRunner.last_parts``)."""
        return getattr(self.rewards, "last_parts", None)

    @property
    def part_weights(self) -> torch.Tensor | None:
        return getattr(self.rewards, "part_weights", None)

    def close(self) -> None:
        self.rewards.close()


class RolloutReplay(ForwardsProgress):
    """A ``RolloutDump`` directory served again: rollouts and rewards of training steps, no sampling.

    Evaluation still samples from the engine and scores with ``rewards`` (the task's verifier)."""

    def __init__(self, directory: str | Path, rewards: RewardSource) -> None:
        self.directory, self.rewards = Path(directory), rewards
        if not self.directory.is_dir():
            raise ConfigError(f"--rollouts-from: {self.directory} is not a directory of dumped rollouts")
        self._served: tuple[list[Completion], dict[str, Any]] | None = None  # the last step's rollouts, its dump
        self.last_parts: torch.Tensor | None = None  # each reward function's values of the last ``score``
        self._rounds = _Rounds()

    def rollouts(self, step: int, prompts: list[Prompt], n: int, sampling: SamplingParams, *,
                 record_routes: bool) -> list[Completion]:
        round_index = self._rounds.next(step)
        path = step_file(self.directory, step, round_index)
        if not path.is_file():
            which = f"step {step}" + (f", round {round_index} (rollout.filter_groups differs?)" if round_index else "")
            raise ConfigError(f"--rollouts-from: {path} not found (the dump has no {which})")
        dump = torch.load(path, weights_only=True)
        if dump["prompts"] != [p.text for p in prompts]:
            raise ConfigError(f"--rollouts-from: {path} holds other prompts than this run's step {step} "
                              "(a different task, data or run.seed?)")
        completions = [Completion(**state) for state in dump["completions"]]
        if len(completions) != len(prompts) * n:
            raise ConfigError(f"--rollouts-from: {path} holds {len(completions)} rollouts, this run needs "
                              f"{len(prompts)} x {n} (rollout.samples_per_prompt differs?)")
        if record_routes and any(c.routes is None for c in completions):
            raise ConfigError(f"--rollouts-from: {path} has no routes; dump with the routing replay/metrics settings of this run")
        self._served = (completions, dump)  # held, so an evaluation's list is never mistaken for it
        return completions

    def score(self, prompts: list[Prompt], completions: list[Completion]) -> tuple[torch.Tensor, dict[str, float]]:
        if self._served is None or completions is not self._served[0]:  # evaluation: the task's verifier
            values, stats = self.rewards.score(prompts, completions)
            self.last_parts = getattr(self.rewards, "last_parts", None)
            return values, stats
        dump = self._served[1]
        self.last_parts = dump.get("reward_parts")  # None in a dump from before they were kept
        return dump["rewards"].clone(), dict(dump["reward_stats"])

    @property
    def part_weights(self) -> torch.Tensor | None:
        return getattr(self.rewards, "part_weights", None)

    def close(self) -> None:
        self.rewards.close()


def _completion_state(c: Completion) -> dict[str, Any]:
    return {"prompt_index": c.prompt_index, "sample_index": c.sample_index, "prompt_ids": list(c.prompt_ids),
            "completion_ids": list(c.completion_ids), "logp_rollout": c.logp_rollout.detach().cpu(),
            "finish_reason": c.finish_reason, "text": c.text,
            "routes": None if c.routes is None else c.routes.detach().cpu(),
            **({} if c.sampled_mask is None else {"sampled_mask": c.sampled_mask.detach().cpu()}),
            **({} if c.messages is None else {"messages": c.messages, "tool_calls": c.tool_calls,
                                              "tool_failures": c.tool_failures}),
            **({} if c.environment_reward is None else {"environment_reward": c.environment_reward}),
            **({} if c.tool_extra_fields is None else {"tool_extra_fields": c.tool_extra_fields})}
