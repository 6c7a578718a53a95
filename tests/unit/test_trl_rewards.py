"""minirl's rewrite of TRL's built-in rewards gives TRL's documented values (the examples of trl 1.16's docstrings)."""

from __future__ import annotations

import math

import pytest

from minirl.tasks.reward_functions import make_reward_fn
from minirl.tasks.trl_rewards import (
    accuracy_reward,
    cosine_scaled_reward,
    get_cosine_scaled_reward,
    get_repetition_penalty_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
    repetition_penalty_reward,
    soft_overlong_punishment_reward,
    think_format_reward,
)


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_accuracy_reward_as_trls_docstring():
    completions = [_chat(r"My answer is \boxed{\frac{1}{3}}"), _chat(r"My answer is \boxed{\frac{1}{2}}")]
    assert accuracy_reward(completions, [r"\frac{1}{3}", r"\frac{1}{3}"]) == [1.0, 0.0]
    assert accuracy_reward([r"so \boxed{0.5}"], [r"\frac{1}{2}"]) == [1.0]  # plain text, and equal by value
    assert accuracy_reward([_chat(r"\boxed{7}")], ["no number here"]) == [None]  # unparseable gold: skipped


def test_reasoning_accuracy_reward_as_trls_docstring():
    completions = [_chat(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}"),
                   _chat(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}"),
                   _chat(r"<think> Reasoning content with partial answers \boxed{\frac{1}{3}} but no final answer")]
    assert reasoning_accuracy_reward(completions, [r"\frac{1}{3}"] * 3, reasoning_delimiters=["</think>"]) == [1.0, 0.0, 0.0]


def test_think_format_reward_as_trls_docstring():
    completions = [[{"content": "<think>\nThis is my reasoning.\n</think>\nThis is my answer."}],
                   [{"content": "<think>\nThis is my reasoning.\nThis is my answer."}]]
    assert think_format_reward(completions) == [1.0, 0.0]
    assert think_format_reward(["<think>a</think><think>b</think>"]) == [0.0]  # one block only


def test_soft_overlong_punishment_as_trls_docstring_and_dapo_eq_13():
    assert get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)([[1] * 90]) == [-0.5]
    # 0 up to L_max - L_cache = 80, then (80 - |y|) / 20 down to -1 at 100, and -1 past it
    lengths = [0, 80, 81, 90, 100, 101, 500]
    values = soft_overlong_punishment_reward([[7] * n for n in lengths], max_completion_len=100, soft_punish_cache=20)
    assert values == [0.0, 0.0, -0.05, -0.5, -1.0, -1.0, -1.0]
    # no soft zone: -1 only past L_max
    assert soft_overlong_punishment_reward([[7] * 100, [7] * 101], max_completion_len=100, soft_punish_cache=0) == [0.0, -1.0]


def test_cosine_scaled_reward_as_trls_docstring():
    completions = [_chat(r"\boxed{\frac{1}{3}}"), _chat(r"\boxed{\frac{1}{2}}")]
    assert get_cosine_scaled_reward(max_len=100)(completions, [r"\frac{1}{3}"] * 2, [[1] * 50] * 2) == [0.75, -0.75]
    # correct: 1.0 at length 0 down to 0.5 at max_len, held there beyond it; wrong: -1.0 at 0 up to -0.5
    right, wrong = _chat(r"\boxed{2}"), _chat(r"\boxed{3}")
    values = cosine_scaled_reward([right, right, right, wrong, wrong], ["2"] * 5, [[], [1] * 25, [1] * 400, [], [1] * 100],
                                  max_len=100)
    assert values == pytest.approx([1.0, 0.5 + 0.25 * (1 + math.cos(math.pi / 4)), 0.5, -1.0, -0.5], abs=1e-12)
    assert cosine_scaled_reward([right], ["no number here"], [[1]], max_len=10) == [None]  # unparseable gold: skipped


def test_repetition_penalty_as_trls_docstring():
    assert get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)([[1, 2, 3, 4], [5, 5, 5, 5, 5]]) == [0.0, -0.75]
    # bigrams of 1 2 1 2: (1,2) (2,1) (1,2), 2 unique of 3 -> 1/3 of the penalty; shorter than n -> 0
    assert repetition_penalty_reward([[1, 2, 1, 2], [9]], ngram_size=2, max_penalty=-0.6) == pytest.approx([-0.2, 0.0])
    with pytest.raises(ValueError, match="should not be positive"):
        get_repetition_penalty_reward(max_penalty=0.5)


def test_the_factories_functions_are_batched_reward_functions_with_kwargs():
    entry = make_reward_fn("minirl.tasks.trl_rewards:soft_overlong_punishment_reward",
                           kwargs={"max_completion_len": 10, "soft_punish_cache": 4})
    assert entry.batched and entry.name == "soft_overlong_punishment_reward"  # TRL's metric name
    assert entry.keywords({"completion_ids": [[1] * 8]}) == {"completion_ids": [[1] * 8], "max_completion_len": 10,
                                                            "soft_punish_cache": 4}
    assert make_reward_fn("minirl.tasks.trl_rewards:repetition_penalty_reward").batched
