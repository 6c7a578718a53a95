"""The example's reward functions, written as a TRL user would (``task.reward_functions``).

``boxed_format`` is batched, in TRL's signature: lists in, a list of rewards out. ``correct``
is per-sample and reads the extra data column ``kind`` ("number" or "latex") to choose how to
compare: numbers as numbers, LaTeX with ``math_verify``. For a chat prompt each completion is
``[{"role": "assistant", "content": text}]``, as in TRL.
"""

from __future__ import annotations

import re

from math_verify import parse, verify

BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def _boxed(text: str) -> str | None:
    found = BOXED.findall(text)
    return found[-1].strip() if found else None


def boxed_format(completions, **kwargs) -> list[float]:
    """1 when the completion puts an answer in \\boxed{...}."""
    return [1.0 if _boxed(_text(c)) is not None else 0.0 for c in completions]


def correct(prompt, completion, answer, *, kind) -> float:
    """1 when the boxed answer equals the reference: as a number, or as LaTeX by math_verify."""
    predicted = _boxed(_text(completion))
    if predicted is None:
        return 0.0
    if kind == "number":
        try:
            return 1.0 if float(predicted) == float(answer) else 0.0
        except ValueError:
            return 0.0
    gold, guess = parse(f"${answer}$"), parse(f"${predicted}$")
    return 1.0 if gold and guess and verify(gold, guess) else 0.0
