"""TRL's built-in reward functions (``trl.rewards``, TRL 1.16), rewritten so that a TRL config naming them
(``reward_funcs: [accuracy_reward, think_format_reward]``) runs here without TRL installed. Same signatures,
same ``math_verify`` configuration, same values: ``None`` where the reference solution cannot be parsed (TRL's
"skip this sample"), 0.0 for a reasoning that never ends. A completion is TRL's chat message or plain text.

TRL's reward *factories* (``get_soft_overlong_punishment(max_completion_len, soft_punish_cache)``,
``get_cosine_scaled_reward(max_len, ...)``, ``get_repetition_penalty_reward(ngram_size, max_penalty)``) are
functions here whose factory arguments are the entry's ``kwargs``, under the names TRL logs them by; the
factories themselves exist too (for ``minirl.train(reward_funcs=[...])``) and return those functions with their
arguments bound.

    task:
      reward_functions:
        - {function: "minirl.tasks.trl_rewards:accuracy_reward"}   # reads the "solution" column, as TRL's
        - {function: "minirl.tasks.trl_rewards:think_format_reward", weight: 0.2}
        - {function: "minirl.tasks.trl_rewards:soft_overlong_punishment_reward",   # DAPO's overlong shaping
           kwargs: {max_completion_len: 1024, soft_punish_cache: 256}}
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
from collections.abc import Callable
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


def soft_overlong_punishment_reward(completion_ids: list[list[int]], *, max_completion_len: int, soft_punish_cache: int,
                                    **kwargs: Any) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13; ``trl.rewards.get_soft_overlong_punishment``): 0 up
    to ``L_max - L_cache`` tokens, then falling linearly to -1 at ``L_max``, and -1 beyond it. Shorter is never
    rewarded. ``L_cache`` 0: no soft zone (-1 only past ``L_max``)."""
    start = max_completion_len - soft_punish_cache
    rewards = []
    for ids in completion_ids:
        length = len(ids)
        if length <= start:
            rewards.append(0.0)
        elif length <= max_completion_len:
            rewards.append((start - length) / soft_punish_cache)
        else:
            rewards.append(-1.0)
    return rewards


def cosine_scaled_reward(completions: list[Any], solution: list[str], completion_ids: list[list[int]], *, max_len: int,
                         min_value_wrong: float = -1.0, max_value_wrong: float = -0.5, min_value_correct: float = 0.5,
                         max_value_correct: float = 1.0, **kwargs: Any) -> list[float | None]:
    """``accuracy_reward`` scaled by length on a cosine schedule (Yeo et al. 2025, App. C.1;
    ``trl.rewards.get_cosine_scaled_reward``): ``v_min + (v_max - v_min)(1 + cos(pi min(|y| / max_len, 1))) / 2``,
    with ``(v_min, v_max)`` = (min_value_correct, max_value_correct) when correct, so shorter earns more, and
    (max_value_wrong, min_value_wrong) when wrong, so shorter loses more. ``None`` where the solution does not parse."""
    rewards: list[float | None] = []
    for correct, ids in zip(accuracy_reward(completions, solution), completion_ids, strict=True):
        if correct is None:
            rewards.append(None)
            continue
        cosine = math.cos(min(len(ids) / max_len, 1.0) * math.pi)
        low, high = (min_value_correct, max_value_correct) if correct else (max_value_wrong, min_value_wrong)
        rewards.append(float(low + 0.5 * (high - low) * (1.0 + cosine)))
    return rewards


def repetition_penalty_reward(completion_ids: list[list[int]], *, ngram_size: int = 3, max_penalty: float = -1.0,
                              **kwargs: Any) -> list[float]:
    """The share of repeated token n-grams times ``max_penalty`` (Yeo et al. 2025, App. C.2;
    ``trl.rewards.get_repetition_penalty_reward``): 0 when no n-gram repeats, 0 for fewer than n tokens."""
    if max_penalty > 0:
        raise ValueError(f"max_penalty {max_penalty} should not be positive")
    rewards = []
    for ids in completion_ids:
        if len(ids) < ngram_size:
            rewards.append(0.0)
            continue
        ngrams = list(zip(*[ids[i:] for i in range(ngram_size)]))
        scaling = 1 - len(set(ngrams)) / len(ngrams)
        rewards.append(scaling * max_penalty if scaling else 0.0)
    return rewards


#: TRL's factory classes (``trl.rewards``), the function here that computes the same, and their arguments
FACTORIES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "_SoftOverlongPunishment": (soft_overlong_punishment_reward, ("max_completion_len", "soft_punish_cache")),
    "_CosineScaledReward": (cosine_scaled_reward, ("max_len", "min_value_wrong", "max_value_wrong", "min_value_correct",
                                                   "max_value_correct")),
    "_RepetitionPenalty": (repetition_penalty_reward, ("ngram_size", "max_penalty")),
}


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> functools.partial:
    """TRL's factory: ``soft_overlong_punishment_reward`` with its lengths bound."""
    return functools.partial(soft_overlong_punishment_reward, max_completion_len=max_completion_len,
                             soft_punish_cache=soft_punish_cache)


def get_cosine_scaled_reward(max_len: int, min_value_wrong: float = -1.0, max_value_wrong: float = -0.5,
                             min_value_correct: float = 0.5, max_value_correct: float = 1.0) -> functools.partial:
    """TRL's factory: ``cosine_scaled_reward`` with its schedule bound."""
    return functools.partial(cosine_scaled_reward, max_len=max_len, min_value_wrong=min_value_wrong,
                             max_value_wrong=max_value_wrong, min_value_correct=min_value_correct,
                             max_value_correct=max_value_correct)


def get_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> functools.partial:
    """TRL's factory: ``repetition_penalty_reward`` with its n and penalty bound."""
    if max_penalty > 0:
        raise ValueError(f"max_penalty {max_penalty} should not be positive")
    return functools.partial(repetition_penalty_reward, ngram_size=ngram_size, max_penalty=max_penalty)
