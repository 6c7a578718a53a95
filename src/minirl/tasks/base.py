"""The ``Task`` protocol: prompts with ground truth, and a verifier."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from minirl.types import Prompt


@runtime_checkable
class Task(Protocol):
    """A source of prompts with a verifiable reward.

    ``train_prompts()`` and ``eval_prompts()`` are fixed lists made once (from a seed for the
    synthetic tasks, from a file for JSONL); the loop owns the sampling order.
    ``reward(prompt, completion)`` returns a finite float (1.0 correct, 0.0 wrong for the
    built-in verifiers).
    """

    name: str

    def train_prompts(self) -> list[Prompt]: ...

    def eval_prompts(self) -> list[Prompt]: ...

    def reward(self, prompt: Prompt, completion: str) -> float: ...


@runtime_checkable
class TeacherTask(Task, Protocol):
    """A synthetic task that can also write worked solutions, for the cold-start SFT."""

    styles: tuple[str, ...]

    def teacher_solution(self, prompt: Prompt, style: str) -> str:
        """A correct completion (reasoning then answer) in ``style``; ends without the EOS token."""
        ...
