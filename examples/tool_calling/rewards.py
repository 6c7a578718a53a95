"""The example's reward functions, TRL's signature. With tools a completion is its chat messages: the model's
turns (``tool_calls`` on those that call a tool) and the tools' results."""

from __future__ import annotations

import re


def correct(completions, answer, **kwargs):
    """1 when the model's last turn states the answer, else 0 (batched: TRL's first parameter ``completions``)."""
    out = []
    for messages, expected in zip(completions, answer):
        final = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        numbers = re.findall(r"-?\d+", final)
        out.append(1.0 if numbers and numbers[-1] == expected else 0.0)
    return out


def used_a_tool(completions, **kwargs):
    """0.1 for a response that got a tool's result, a small nudge towards the calculator."""
    return [0.1 if any(m["role"] == "tool" for m in messages) else 0.0 for messages in completions]


def tool_reward(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature: 1 when one of verl's tools (``tool_config.yaml``) computed the answer, its step rewards
    arriving in ``extra_info["tool_rewards"]`` as verl's reward managers pass them."""
    return max((extra_info or {}).get("tool_rewards") or [0.0])
