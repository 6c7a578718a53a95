"""minirl's rewrite of TRL's built-in rewards gives TRL's documented values (the examples of trl 1.16's docstrings)."""

from __future__ import annotations

from minirl.tasks.trl_rewards import accuracy_reward, reasoning_accuracy_reward, think_format_reward


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
