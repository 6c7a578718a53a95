"""DAPO's dynamic sampling (``rollout.filter_groups``; verl's ``algorithm.filter_groups``): keep only groups whose
rewards differ.

Under the group-mean baseline (paper Eq. 6) a group whose G rewards are all equal has advantage 0 for every
sample, so it adds nothing to the gradient; with it in the batch the step trains on fewer informative groups
than ``rollout.prompts_per_step`` says. Dynamic sampling (DAPO, Yu et al. 2025, Sec. 3.2) drops such groups and
samples further rounds of prompts until ``prompts_per_step`` groups with a spread are kept, as verl's
``ray_trainer`` does: each round draws ``filter_groups_prompts_per_round`` prompts in the data order, generates
and scores them; the kept groups accumulate, a round's surplus is dropped. The round limit (verl's
``max_num_gen_batches``) ends the search; a batch still short is then filled with the zero-spread groups drawn
first (verl raises instead), so a run whose prompts have all become easy or hopeless keeps going and says so.

The objective is untouched: this only chooses which groups form the global batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from minirl.types import Completion, Prompt

#: reward statistics that are counts over the samples scored (summed over rounds; the others are means)
COUNT_STATS = ("reward/errors", "reward/timeouts")


@dataclass
class Group:
    """One prompt's G completions as one round drew and scored them."""

    prompt: Prompt
    completions: list[Completion]
    rewards: torch.Tensor  # float32 [G]
    columns: list[dict[str, Any]]  # per completion: what reward functions logged (TRL's log_extra)
    parts: torch.Tensor | None = None  # float32 [G, K]: each reward function's values (GDPO), when known


@dataclass
class Sampled:
    """A global step's groups, ready for the advantages: prompts [P], completions [P x G] group-major (each
    ``prompt_index`` into ``prompts``), rewards [P x G], the reward statistics and ``filter/*``."""

    prompts: list[Prompt]
    completions: list[Completion]
    rewards: torch.Tensor
    reward_stats: dict[str, float]
    columns: list[dict[str, Any]]
    generated_tokens: int
    reward_parts: torch.Tensor | None = None  # float32 [P x G, K]: each reward function's values, when known
    part_weights: torch.Tensor | None = None  # float32 [K]: their weights (GDPO's advantages), when known
    times: dict[str, float] | None = None  # rollout.async_steps: its rollout's and rewards' seconds, in their thread
    policy_lag_steps: int | None = None  # rollout.async_steps: global steps between its engine weights and pi_old
    greedy_rewards: torch.Tensor | None = None  # float32 [P]: each prompt's greedy completion's reward (ReMax's baseline)


def has_spread(rewards_PG: torch.Tensor, metric: str, accuracy_threshold: float) -> torch.Tensor:
    """bool [P]: the groups whose ``metric`` differs between samples (verl keeps ``std > 0``, the same set):
    ``reward`` compares rewards, ``accuracy`` compares correctness (reward >= ``accuracy_threshold``)."""
    values = rewards_PG if metric == "reward" else (rewards_PG >= accuracy_threshold).float()
    return (values != values[:, :1]).any(dim=1)


def split_groups(prompts: list[Prompt], completions: list[Completion], rewards: torch.Tensor,
                 columns: list[dict[str, Any]] | None, parts: torch.Tensor | None = None) -> list[Group]:
    """One round's output as groups, in prompt order (the engine returns each prompt's samples together)."""
    by_prompt: list[list[int]] = [[] for _ in prompts]
    for n, completion in enumerate(completions):
        by_prompt[completion.prompt_index].append(n)
    return [Group(prompt, [completions[n] for n in rows], rewards[rows],
                  [columns[n] if columns and n < len(columns) else {} for n in rows],
                  None if parts is None else parts[rows])
            for prompt, rows in zip(prompts, by_prompt)]


def merge_reward_stats(rounds: list[dict[str, float]], sizes: list[int] | None = None) -> dict[str, float]:
    """The reward statistics of rounds as one: counts summed, means averaged, weighted by each round's samples
    (``sizes``; None: equal-sized rounds). A key a round lacks (e.g. a reward function that applied to none of its
    samples) is averaged over the rounds that have it."""
    weights = sizes or [1] * len(rounds)
    keys = list(dict.fromkeys(key for stats in rounds for key in stats))
    out = {}
    for key in keys:
        pairs = [(stats[key], weight) for stats, weight in zip(rounds, weights, strict=True) if key in stats]
        out[key] = (sum(value for value, _ in pairs) if key in COUNT_STATS else
                    sum(value * weight for value, weight in pairs) / sum(weight for _, weight in pairs))
    return out


def sample_groups(draw: Callable[[int], list[Prompt]],
                  generate: Callable[[list[Prompt], int], list[Completion]],
                  score: Callable[[list[Prompt], list[Completion]], tuple[Any, ...]],
                  *, groups: int, prompts_per_round: int, max_rounds: int, metric: str,
                  accuracy_threshold: float) -> Sampled:
    """Rounds of ``draw(k)`` prompts -> ``generate(prompts, round)`` -> ``score(prompts, completions)`` until
    ``groups`` groups with a spread are kept or ``max_rounds`` rounds ran; then topped up with zero-spread groups.

    ``filter/rounds``, ``filter/kept_groups_frac`` (groups with a spread / groups generated),
    ``filter/topped_up_groups``, ``filter/reward_mean_generated`` (every sample generated: the reward curve
    without the filter's selection) join the merged reward statistics.
    """
    kept: list[Group] = []
    spare: list[Group] = []  # zero-spread groups, in draw order, to top up a short batch
    stats_by_round: list[dict[str, float]] = []
    rewards_generated: list[torch.Tensor] = []
    generated_tokens, rounds = 0, 0
    while len(kept) < groups and rounds < max_rounds:
        prompts = draw(prompts_per_round)
        completions = generate(prompts, rounds)
        rewards, stats, columns, *parts = score(prompts, completions)  # parts: each function's values, when given
        rounds += 1
        stats_by_round.append(stats)
        rewards_generated.append(rewards)
        generated_tokens += sum(len(c.completion_ids) for c in completions)
        for group in split_groups(prompts, completions, rewards, columns, parts[0] if parts else None):
            spread = bool(has_spread(group.rewards[None], metric, accuracy_threshold))
            (kept if spread else spare).append(group)
    drawn, spread_count = len(kept) + len(spare), len(kept)
    kept = kept[:groups]
    topped_up = groups - len(kept)
    kept += spare[:topped_up]
    completions = [replace(c, prompt_index=index) for index, group in enumerate(kept) for c in group.completions]
    filter_stats = {
        "filter/rounds": float(rounds),
        "filter/kept_groups_frac": spread_count / drawn,
        "filter/topped_up_groups": float(topped_up),
        "filter/reward_mean_generated": float(torch.cat(rewards_generated).mean()),
    }
    return Sampled(
        prompts=[group.prompt for group in kept], completions=completions,
        rewards=torch.cat([group.rewards for group in kept]),
        reward_stats={**merge_reward_stats(stats_by_round), **filter_stats},
        columns=[column for group in kept for column in group.columns], generated_tokens=generated_tokens,
        reward_parts=_joined_parts(kept),
    )


def _joined_parts(groups: list[Group]) -> torch.Tensor | None:
    parts = [group.parts for group in groups]
    return None if any(p is None for p in parts) else torch.cat([p for p in parts if p is not None])


def round_limit(max_rounds: int, train_prompts: int, prompts_per_round: int) -> int:
    """``rollout.filter_groups_max_rounds``, with 0 read as one pass over the training prompts."""
    return max_rounds or max(1, math.ceil(train_prompts / prompts_per_round))
