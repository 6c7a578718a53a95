"""TRL's built-in reward functions (``trl.rewards``, TRL 1.16), rewritten so that a TRL config naming them
(``reward_funcs: [accuracy_reward, think_format_reward]``) runs here without TRL installed. Same signatures,
same ``math_verify`` configuration, same values: ``None`` where the reference solution cannot be parsed (TRL's
"skip this sample"), 0.0 for a reasoning that never ends. A completion is TRL's chat message or plain text.

    task:
      reward_functions:
        - {function: "minirl.tasks.trl_rewards:accuracy_reward"}   # reads the "solution" column, as TRL's
        - {function: "minirl.tasks.trl_rewards:think_format_reward", weight: 0.2}
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

THINK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL | re.MULTILINE)


def _text(completion: Any) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def _timeouts() -> tuple[int | None, int | None]:
    """math_verify's timeouts use ``signal.alarm``, which only the main thread may set (as TRL does)."""
    if threading.current_thread() is threading.main_thread():
        return 10, 5
    logging.getLogger("math_verify.parser").setLevel(logging.ERROR)
    logging.getLogger("math_verify.grader").setLevel(logging.ERROR)
    return None, None


def _verified(content: str, solution: str) -> float | None:
    """TRL's check: the gold parsed as it comes, the answer as LaTeX with ``\\boxed`` first and units normalised."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    parsing_timeout, verify_timeout = _timeouts()
    gold = parse(solution, parsing_timeout=parsing_timeout)
    if len(gold) == 0:
        return None
    config = LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
                                   try_extract_without_anchor=False)
    answer = parse(content, extraction_config=[config], extraction_mode="first_match", parsing_timeout=parsing_timeout)
    return float(verify(gold, answer, timeout_seconds=verify_timeout))


def accuracy_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's answer equals the ``solution`` column mathematically (``trl.rewards.accuracy_reward``)."""
    return [_verified(_text(completion), gold) for completion, gold in zip(completions, solution, strict=True)]


def reasoning_accuracy_reward(completions: list[Any], solution: list[str], reasoning_delimiters: list[str] | None = None,
                              **kwargs: Any) -> list[float | None]:
    """``accuracy_reward`` on what follows the reasoning (after the first delimiter found, ``</think>`` by default);
    0.0 when the reasoning never ends (``trl.rewards.reasoning_accuracy_reward``)."""
    rewards: list[float | None] = []
    for completion, gold in zip(completions, solution, strict=True):
        content = _text(completion)
        delimiter = next((d for d in (reasoning_delimiters or ["</think>"]) if d in content), None)
        rewards.append(0.0 if delimiter is None else _verified(content.split(delimiter)[-1], gold))
    return rewards


def think_format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion opens with one ``<think>...</think>`` block (``trl.rewards.think_format_reward``)."""
    return [1.0 if THINK.match(_text(completion)) else 0.0 for completion in completions]
