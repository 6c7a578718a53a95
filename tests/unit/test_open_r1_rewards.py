"""minirl's rewrite of open-r1's GRPO rewards (``open_r1/rewards.py``) gives its values, computed by hand here."""

from __future__ import annotations

import math

import pytest

from minirl.tasks.open_r1_rewards import (
    REGISTRY,
    accuracy_reward,
    cosine_scaled_reward,
    format_reward,
    len_reward,
    reasoning_steps_reward,
    repetition_penalty_reward,
    tag_count_reward,
)
from minirl.tasks.reward_functions import make_reward_fn


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


GOOD = "<think>\nsome thought\n</think>\n<answer>\n42\n</answer>"


def test_format_and_tag_count():
    assert format_reward([_chat(GOOD), _chat(GOOD + " "), GOOD.replace("\n<answer>", "<answer>")]) == [1.0, 0.0, 0.0]
    assert tag_count_reward([_chat(GOOD), "<think>\nx\n</think>\n", "<think>\n<think>\n\n</answer>", ""]) == [
        1.0, 0.5, 0.25, 0.0]


def test_reasoning_steps_counts_markers_up_to_three():
    assert reasoning_steps_reward(["Step 1: a", "First, a. Next, b", "1. a\n2. b\n- c\n* d", "none"]) == [
        pytest.approx(1 / 3), pytest.approx(2 / 3), 1.0, 0.0]


def test_accuracy_skips_a_solution_that_does_not_parse():
    completions = [_chat(r"so \boxed{\frac{1}{2}}"), _chat(r"so \boxed{3}"), _chat(r"\boxed{1}")]
    assert accuracy_reward(completions, ["$0.5$", "$2$", "no number here"]) == [1.0, 0.0, None]


def test_len_reward_is_kimis_over_the_batch():
    right, wrong = r"\boxed{2}", r"\boxed{3}"  # 9 characters each
    completions = [right, right + "x" * 10, wrong, wrong + "x" * 5]  # lengths 9, 19, 9, 14: min 9, max 19
    rewards = len_reward(completions, ["$2$"] * 4)
    assert rewards == pytest.approx([0.5, -0.5, 0.0, 0.0])  # wrong ones: min(0, 0.5) and min(0, 0.0)
    assert len_reward([right, wrong], ["$2$"] * 2) == [0.0, 0.0]  # one length: nothing to compare


def test_cosine_scales_by_characters():
    right = r"\boxed{2}"  # 9 characters
    cos = math.cos(9 / 100 * math.pi)
    rewards = cosine_scaled_reward([right, r"\boxed{3}", right], ["$2$", "$2$", "words"], max_len=100)
    assert rewards == pytest.approx([0.5 + 0.25 * (1 + cos), -0.5 + 0.25 * (1 + cos), 1.0])  # open-r1's defaults


def test_repetition_counts_word_ngrams():
    assert repetition_penalty_reward(["a b a b a b", "A b c", "a b", ""], ngram_size=2, max_penalty=-1.0) == \
        pytest.approx([-0.6, 0.0, 0.0, 0.0])  # 5 bigrams, 2 distinct; "A b c" lower-cased, no repeat
    with pytest.raises(ValueError, match="should not be positive"):
        repetition_penalty_reward(["a"], max_penalty=0.5)


def test_every_registry_entry_is_a_batched_reward_function():
    for name, (spec, _) in REGISTRY.items():
        assert make_reward_fn(spec).batched, name
