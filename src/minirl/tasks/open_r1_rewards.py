"""open-r1's GRPO reward functions (``open_r1/rewards.py``, the registry its ``grpo.py`` picks from by name:
``reward_funcs: [accuracy, format, tag_count]``, its recipes' default), rewritten so that an open-r1 recipe runs
here without open-r1 installed. Same arguments, same values: text lengths in characters and n-grams of words (not
TRL's token ids), ``None`` where the reference solution does not parse (open-r1's "skip this sample").
``minirl config from-trl`` maps the registry names to these, with the recipe's ``cosine_*``, ``repetition_*``,
``max_completion_len`` and ``soft_punish_cache`` as the entries' kwargs (open-r1's defaults where unset).

    task:
      system_prompt: "You are a helpful AI Assistant ..."   # open-r1's system_prompt
      prompt_column: problem                                 # its dataset_prompt_column
      reward_functions:
        - {function: "minirl.tasks.open_r1_rewards:accuracy_reward"}   # reads the "solution" column
        - {function: "minirl.tasks.open_r1_rewards:format_reward"}
        - {function: "minirl.tasks.open_r1_rewards:tag_count_reward"}
"""

from __future__ import annotations

import math
import re
from typing import Any

from minirl.tasks.trl_rewards import _text, _timeouts

FORMAT = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)
STEPS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


def _answer(content: str, boxed: str | bool) -> list[Any]:
    """open-r1's parse of a completion: LaTeX only, ``\\boxed`` first, no malformed operators, first match."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse

    normalization = NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True, equations=True,
                                        boxed=boxed, units=True)
    config = LatexExtractionConfig(normalization_config=normalization, boxed_match_priority=0,
                                   try_extract_without_anchor=False)
    return parse(content, extraction_config=[config], extraction_mode="first_match", parsing_timeout=_timeouts()[0])


def _correct(content: str, solution: str) -> bool | None:
    """The correctness ``len_reward`` and the cosine reward use: None where the solution does not parse as LaTeX."""
    from math_verify import LatexExtractionConfig, parse, verify

    gold = parse(solution, extraction_mode="first_match", extraction_config=[LatexExtractionConfig()],
                 parsing_timeout=_timeouts()[0])
    if len(gold) == 0:
        return None
    return bool(verify(_answer(content, True), gold, timeout_seconds=_timeouts()[1]))


def accuracy_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's answer equals the ``solution`` column mathematically (``math_verify``), 0.0 when not;
    ``None`` where the solution does not parse or the check fails."""
    from math_verify import parse, verify

    rewards: list[float | None] = []
    for completion, sol in zip(completions, solution, strict=True):
        gold = parse(sol, extraction_mode="first_match", parsing_timeout=_timeouts()[0])
        if len(gold) == 0:
            rewards.append(None)
            continue
        try:
            rewards.append(float(verify(gold, _answer(_text(completion), "all"), timeout_seconds=_timeouts()[1])))
        except Exception:  # open-r1 skips a sample whose check raises
            rewards.append(None)
    return rewards


def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly ``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>``, else 0.0."""
    return [1.0 if FORMAT.match(_text(c)) else 0.0 for c in completions]


def tag_count_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """0.25 for each of ``<think>\\n``, ``\\n</think>\\n``, ``\\n<answer>\\n``, ``\\n</answer>`` found exactly once."""
    tags = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return [sum(0.25 for tag in tags if _text(c).count(tag) == 1) for c in completions]


def reasoning_steps_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """min(1, k / 3) for k step markers ("Step 1:", "1." at a line start, bullets, "First,", ..., "Finally,")."""
    return [min(1.0, len(STEPS.findall(_text(c))) / 3) for c in completions]


def len_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
    """Kimi 1.5's length reward (arXiv 2501.12599) over the batch's completions, lengths in characters: lambda =
    0.5 - (len - min) / (max - min), the reward lambda when correct, min(0, lambda) when not (an unparseable
    solution counts as correct); all 0.0 when every length is the same."""
    contents = [_text(c) for c in completions]
    correct = [_correct(content, sol) is not False for content, sol in zip(contents, solution, strict=True)]
    lengths = [len(content) for content in contents]
    shortest, longest = min(lengths), max(lengths)
    if shortest == longest:
        return [0.0] * len(contents)
    rewards = []
    for length, right in zip(lengths, correct):
        value = 0.5 - (length - shortest) / (longest - shortest)
        rewards.append(float(value if right else min(0.0, value)))
    return rewards


def cosine_scaled_reward(completions: list[Any], solution: list[str], *, min_value_wrong: float = 0.0,
                         max_value_wrong: float = -0.5, min_value_correct: float = 0.5, max_value_correct: float = 1.0,
                         max_len: int = 1000, **kwargs: Any) -> list[float]:
    """The cosine length schedule (Yeo et al. 2025, App. C.1) on characters: ``v_min + (v_max - v_min)(1 +
    cos(pi len / max_len)) / 2`` with (min_value_correct, max_value_correct) when correct and (max_value_wrong,
    min_value_wrong) when wrong; 1.0 where the solution does not parse. Defaults: open-r1's script arguments."""
    rewards = []
    for completion, sol in zip(completions, solution, strict=True):
        content = _text(completion)
        correct = _correct(content, sol)
        if correct is None:
            rewards.append(1.0)
            continue
        cosine = math.cos(len(content) / max_len * math.pi)
        low, high = (min_value_correct, max_value_correct) if correct else (max_value_wrong, min_value_wrong)
        rewards.append(float(low + 0.5 * (high - low) * (1.0 + cosine)))
    return rewards


def repetition_penalty_reward(completions: list[Any], *, ngram_size: int = 3, max_penalty: float = -1.0,
                              **kwargs: Any) -> list[float]:
    """The share of repeated word n-grams (lower-cased) times ``max_penalty`` (Yeo et al. 2025, App. C.2); 0.0 for an
    empty completion or one of fewer than n words."""
    if max_penalty > 0:
        raise ValueError(f"max_penalty {max_penalty} should not be positive")
    rewards = []
    for completion in completions:
        words = _text(completion).lower().split()
        if len(words) < ngram_size:
            rewards.append(0.0)
            continue
        ngrams = list(zip(*[words[i:] for i in range(ngram_size)]))
        rewards.append((1 - len(set(ngrams)) / len(ngrams)) * max_penalty)
    return rewards


#: open-r1's registry names (``get_reward_funcs``) -> (function here, its script arguments -> our kwargs, defaults)
REGISTRY: dict[str, tuple[str, dict[str, tuple[str, Any]]]] = {
    "accuracy": ("minirl.tasks.open_r1_rewards:accuracy_reward", {}),
    "format": ("minirl.tasks.open_r1_rewards:format_reward", {}),
    "tag_count": ("minirl.tasks.open_r1_rewards:tag_count_reward", {}),
    "reasoning_steps": ("minirl.tasks.open_r1_rewards:reasoning_steps_reward", {}),
    "length": ("minirl.tasks.open_r1_rewards:len_reward", {}),
    "cosine": ("minirl.tasks.open_r1_rewards:cosine_scaled_reward", {
        "cosine_min_value_wrong": ("min_value_wrong", 0.0), "cosine_max_value_wrong": ("max_value_wrong", -0.5),
        "cosine_min_value_correct": ("min_value_correct", 0.5), "cosine_max_value_correct": ("max_value_correct", 1.0),
        "cosine_max_len": ("max_len", 1000)}),
    "repetition_penalty": ("minirl.tasks.open_r1_rewards:repetition_penalty_reward", {
        "repetition_n_grams": ("ngram_size", 3), "repetition_max_penalty": ("max_penalty", -1.0)}),
    "soft_overlong_punishment": ("minirl.tasks.trl_rewards:soft_overlong_punishment_reward", {
        "max_completion_len": ("max_completion_len", 16384), "soft_punish_cache": ("soft_punish_cache", 4096)}),
}
