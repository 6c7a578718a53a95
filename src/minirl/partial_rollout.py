"""``rollout.partial_rollout``: responses that outlive a weight sync (slime's ``--partial-rollout``, verl's fully
asynchronous trainer's ``partial_rollout``, Kimi k1.5's partial rollouts).

Each global step decodes the pool's groups and checks every ``rollout.partial_chunk_tokens`` new tokens per response
how many groups have all G responses ended (a stop token or string, or ``max_new_tokens``); once ``prompts_per_step``
(P) have, decoding stops: the step trains on the P that ended first (in draw order within a check, so groups carried
from earlier steps first). The native engine decodes the step in one call that keeps its KV cache from check to check
and stops at the check (``minirl.rollout.base.DecodeControl``; its CUDA-graph buckets too, and several native engines
in this process, ``EngineGroup``); an engine without that control (vLLM, engines on Ray) is called once per chunk, each call prefilling prompt and response so far again
(vLLM from its prefix cache: the step's earlier chunks ran on the same weights).
Both check at the same points and, given the same tokens, train the same groups (the samples differ: a chunk call
draws from a stream of its own). Groups that ended by the same check beyond the P are dropped, as slime drops them ("we have not stored all the unused samples back to the data buffer"); the
groups still running wait in the pool for the next step. There their unfinished responses continue where they
stopped, on the new weights: the engine prefills prompt and response so far and samples on
(``Prompt.response_prefix``), as an aborted SGLang or vLLM request resumed with its partial output does. Each step starts from a batch of ``rollout.partial_pool_prompts``
groups, the carried ones first and new prompts to fill it, and whenever a filter leaves the groups running and kept
short of P, another batch of new prompts is drawn (slime's rule: its data source hands out the aborted groups before
new prompts, ``--over-sampling-batch-size`` at a time, whenever those in flight and those kept fall short of the
batch), so over-sampling (a batch larger than P) is what leaves responses unfinished at the end of a step. With ``rollout.filter_groups`` a group is scored when it ends and only one
whose rewards differ is kept (DAPO's dynamic sampling, as slime runs it with partial rollouts); at most
``filter_groups_max_rounds`` batches are drawn in a step, after which a short batch is filled with the zero-spread
groups, as ``minirl.dynamic_sampling`` does.

So a response can hold tokens of several policy versions. Each token keeps the log-prob of the law that sampled it
(``logp_rollout``), so mu_old is per token, and the IS weight pi_theta / mu_old and the clip mask see an older
token's staleness as the paper's off-policy setting (Section 3: a response produced by an older model version).
R3 replays the routes of the engine's last forward over the whole response (its prefill of the older tokens at the
newer weights, as a resumed request's routed experts are). ``rollout.partial_mask_stale`` (slime's
``--mask-offpolicy-in-partial-rollout``) trains only the tokens the current step's weights sampled.

Metrics (``rollout/*``): ``partial_pool_groups`` (groups waiting after the step), ``partial_dropped_groups`` (ended
beyond the batch), ``stale_tokens_frac`` (trained tokens that an earlier step's weights sampled),
``partial_responses_frac`` (trained responses holding tokens of more than one step), ``max_token_lag_steps``,
``chunks`` (engine calls this step).

With ``rollout.async_steps`` (verl's fully asynchronous trainer with ``partial_rollout``, slime's ``train_async.py``)
the pool is sampled in the rollout thread, batch after batch, beside the update (``minirl.async_rollout``): each
batch's tokens are those of the weights that batch was sampled with, a carried response's older tokens one batch
(one weight version) older still; the run is bitwise the one that samples in line with the engine's weights late.

A checkpoint keeps the pool (``state`` / ``load_state``), so a resumed run goes on bitwise.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from minirl.dynamic_sampling import Group, Sampled, merge_reward_stats, split_groups
from minirl.rollout.base import DecodeControl
from minirl.types import Completion, Prompt

Generate = Callable[[list[Prompt], int, DecodeControl], list[Completion]]  # (prompts, call index, control) -> one each
Score = Callable[[list[Prompt], list[Completion]], tuple[Any, ...]]  # (rewards, stats, columns, parts)


@dataclass(eq=False)  # compared by identity
class Pending:
    """One prompt's group in the pool: its G responses so far (None: not started), and once it has ended and been
    scored (``filter_groups``: when it ended; else when it is trained) its ``Group``."""

    prompt: Prompt
    rows: list[Completion | None]
    scored: Group | None = None

    def ended(self, max_new_tokens: int) -> bool:
        return all(row is not None and row_ended(row, max_new_tokens) for row in self.rows)


@dataclass
class _Tally:
    """What one step's sampling counted: engine calls, tokens decoded, batches drawn, score calls (statistics, size), and
    under ``filter_groups`` the groups ended this step with a spread, without one (``spare``), and their rewards."""

    chunks: int = 0
    generated: int = 0
    draws: int = 0
    dropped: int = 0
    topped_up: int = 0
    spread: int = 0
    calls: list[tuple[dict[str, float], int]] = field(default_factory=list)
    spare: list[Pending] = field(default_factory=list)
    rewards: list[torch.Tensor] = field(default_factory=list)


def _length(row: Completion | None) -> int:
    return 0 if row is None else len(row.completion_ids)


def row_ended(row: Completion, max_new_tokens: int) -> bool:
    """A response has ended: at a stop (token or string) or at ``max_new_tokens``."""
    return row.finish_reason == "eos" or len(row.completion_ids) >= max_new_tokens


@dataclass
class PartialPool:
    """The groups decoded across steps (module docstring): ``running``, those still decoding, in draw order."""

    samples_per_prompt: int
    max_new_tokens: int
    running: list[Pending] = field(default_factory=list)

    def sample(self, step: int, *, draw: Callable[[int], list[Prompt]], generate: Generate, score: Score,
               merge: Callable[[Completion | None, Completion, int], Completion], groups: int, pool: int,
               chunk_tokens: int, filtered: Callable[[torch.Tensor], bool] | None, max_draws: int,
               in_call: bool = False) -> Sampled:
        """The step's ``groups`` groups (``Sampled``, as ``minirl.dynamic_sampling.sample_groups`` returns them).
        ``generate(prompts, call, control)``: one response (its next tokens) per prompt, each row within its budget
        (``DecodeControl``); ``merge(row, new, step)``: a response so far and its next tokens as one completion
        (``continued``); ``filtered(rewards)``: whether a scored group counts (None: no ``filter_groups``, every
        ended group counts); ``max_draws``: batches of ``pool`` new prompts drawn in this step at most.

        ``in_call``: the engine takes the control's stop, so a call decodes each row to the end of its response and
        is asked every ``chunk_tokens`` tokens whether enough groups have ended (one call a step keeping its KV
        cache, unless a filter drops groups); otherwise each call decodes one chunk. Both check at the same points
        and, given the same tokens, train the same groups."""
        # Over 60 lines: the step's decode-and-check loop, its top-ups and the batch it returns, in one readable place.
        tally = _Tally()
        if len(self.running) < pool and max_draws > 0:  # the batch: the groups carried over first, new ones to fill it
            self._add(draw(pool - len(self.running)))
            tally.draws += 1
        ended: list[Pending] = []  # this step's, kept, in the order they ended
        while len(ended) < groups:
            while len(self.running) + len(ended) < groups and tally.draws < max_draws:  # a filter dropped some
                self._add(draw(pool))
                tally.draws += 1
            active = [(group, i) for group in self.running for i, row in enumerate(group.rows)
                      if row is None or not row_ended(row, self.max_new_tokens)]
            if not active:  # the filter dropped what ended, and the draws are spent
                break
            rows = [group.rows[i] for group, i in active]
            left = [self.max_new_tokens - _length(row) for row in rows]
            prompts = [replace(group.prompt, response_prefix=None if row is None else list(row.completion_ids))
                       for (group, _), row in zip(active, rows)]
            when: dict[int, int] = {}  # id(group) -> the check (in_call) at which all its rows had ended
            control = (DecodeControl(left, _enough([group for group, _ in active], groups - len(ended), when), chunk_tokens)
                       if in_call else DecodeControl([min(chunk_tokens, n) for n in left]))
            news = generate(prompts, tally.chunks, control)
            tally.chunks += 1
            for (group, i), new in zip(active, news, strict=True):
                tally.generated += len(new.completion_ids)
                group.rows[i] = merge(group.rows[i], new, step)
            now = sorted((group for group in self.running if group.ended(self.max_new_tokens)),  # by end, then draw
                         key=lambda group: when.get(id(group), math.inf))
            self.running = [group for group in self.running if not group.ended(self.max_new_tokens)]
            if filtered is not None and now:
                tally.calls.append(self._score(now, score))
                tally.rewards += [group.scored.rewards for group in now if group.scored is not None]
                tally.spare += [group for group in now if group.scored is not None and not filtered(group.scored.rewards)]
                now = [group for group in now if group not in tally.spare]
                tally.spread += len(now)
            ended += now
        trained, tally.dropped = ended[:groups], len(ended[groups:])  # slime drops what ended beyond the batch
        if filtered is not None and len(trained) < groups:  # a short batch: the zero-spread groups ended first
            tally.topped_up = min(groups - len(trained), len(tally.spare))
            trained += tally.spare[: tally.topped_up]
        unscored = [group for group in trained if group.scored is None]
        if unscored:
            tally.calls.append(self._score(unscored, score))
        return self._sampled(step, trained, tally, filtered is not None)

    @staticmethod
    def _score(ended: list[Pending], score: Score) -> tuple[dict[str, float], int]:
        """Score ``ended`` groups in one call; each keeps its ``Group``. Returns the call's statistics and size."""
        prompts = [group.prompt for group in ended]
        completions = [replace(row, prompt_index=index, sample_index=sample) for index, group in enumerate(ended)
                       for sample, row in enumerate(group.rows) if row is not None]
        rewards, stats, columns, *parts = score(prompts, completions)
        for group, scored in zip(ended, split_groups(prompts, completions, rewards, columns, parts[0] if parts else None),
                                 strict=True):
            group.scored = scored
        return stats, len(completions)

    def _sampled(self, step: int, trained: list[Pending], tally: _Tally, filtering: bool) -> Sampled:
        kept = [group.scored for group in trained if group.scored is not None]
        completions = [replace(c, prompt_index=index, sample_index=sample) for index, group in enumerate(kept)
                       for sample, c in enumerate(group.completions)]
        stats = merge_reward_stats([s for s, _ in tally.calls], sizes=[n for _, n in tally.calls])
        stats.update(staleness(completions, step))
        stats.update({"rollout/partial_pool_groups": float(len(self.running)), "rollout/chunks": float(tally.chunks),
                      "rollout/partial_dropped_groups": float(tally.dropped)})
        if filtering:
            stats.update({"filter/rounds": float(tally.draws), "filter/topped_up_groups": float(tally.topped_up)})
        if filtering and tally.rewards:  # groups ended and scored in this step
            stats.update({"filter/kept_groups_frac": tally.spread / (tally.spread + len(tally.spare)),
                          "filter/reward_mean_generated": float(torch.cat(tally.rewards).mean())})
        parts = [group.parts for group in kept]
        return Sampled(
            prompts=[group.prompt for group in kept], completions=completions,
            rewards=torch.cat([group.rewards for group in kept]), reward_stats=stats,
            columns=[column for group in kept for column in group.columns], generated_tokens=tally.generated,
            reward_parts=None if any(p is None for p in parts) else torch.cat([p for p in parts if p is not None]))

    def _add(self, prompts: list[Prompt]) -> None:
        """New groups, not started, at the end of the running ones."""
        self.running += [Pending(prompt, [None] * self.samples_per_prompt) for prompt in prompts]

    # ------------------------------------------------------------------ checkpoint

    def state(self, prompts: list[Prompt]) -> dict[str, Any]:
        """The running groups in plain types and tensors (a checkpoint's ``weights_only`` state; between steps no group
        has ended or been scored); prompts as positions in ``prompts`` (the run's training prompts)."""
        position = {id(prompt): n for n, prompt in enumerate(prompts)}
        return {"running": [{"prompt": position[id(group.prompt)],
                             "rows": [None if row is None else dataclasses.asdict(row) for row in group.rows]}
                            for group in self.running]}

    def load_state(self, state: dict[str, Any], prompts: list[Prompt]) -> None:
        self.running = [Pending(prompts[plain["prompt"]], [None if row is None else Completion(**row) for row in plain["rows"]])
                        for plain in state.get("running", [])]


def _enough(owners: list[Pending], needed: int, when: dict[int, int]) -> Callable[[list[bool]], bool]:
    """A ``DecodeControl.stop`` over rows of groups ``owners`` (one per row): whether ``needed`` groups have ended (all
    their rows of the call ended); records in ``when`` the check at which each ended, so that the groups of a call are
    ordered as chunks would have found them."""
    checks = itertools.count()

    def stop(ended: list[bool]) -> bool:
        check = next(checks)
        running = {id(group) for group, done in zip(owners, ended, strict=True) if not done}
        for group in owners:
            if id(group) not in running:
                when.setdefault(id(group), check)
        return len(when) >= needed

    return stop


def continued(row: Completion | None, new: Completion, step: int, *, max_new_tokens: int,
              finish: Callable[[Completion], Completion]) -> Completion:
    """A response so far (None: not started) and the engine's next chunk of it, as one completion of the original
    prompt: the chunk's tokens (cut at ``max_new_tokens`` in all) appended with their log-probs, each marked as
    sampled at ``step``; the routes of the chunk's call, which cover the whole response; ``finish`` (the text and
    the stop strings, which may span the two) applied to the result."""
    before = [] if row is None else list(row.completion_ids)
    keep = min(len(new.completion_ids), max_new_tokens - len(before))
    prompt = new.prompt_ids[: len(new.prompt_ids) - len(before)]
    ids = before + list(new.completion_ids[:keep])
    logp = new.logp_rollout[:keep] if row is None else torch.cat([row.logp_rollout, new.logp_rollout[:keep]])
    steps = torch.full((keep,), step, dtype=torch.int32)
    if row is not None:
        steps = torch.cat([_steps(row, step), steps])
    routes = None
    if new.routes is not None:
        routes = new.routes[: len(prompt) + len(ids)].clone()
        if keep < len(new.completion_ids):
            routes[-1] = -1  # the last kept token is never fed while sampling (types.Completion)
    ended = new.finish_reason if keep == len(new.completion_ids) else "length"
    merged = Completion(prompt_index=new.prompt_index, sample_index=new.sample_index, prompt_ids=list(prompt),
                        completion_ids=ids, logp_rollout=logp, finish_reason=ended, text="", routes=routes,
                        sampled_at_steps=steps)
    return finish(merged)


def _steps(row: Completion, step: int) -> torch.Tensor:
    if row.sampled_at_steps is not None:
        return row.sampled_at_steps
    return torch.full((len(row.completion_ids),), step, dtype=torch.int32)


def staleness(completions: list[Completion], step: int) -> dict[str, float]:
    """How many trained tokens and responses an earlier step's weights sampled (module docstring's metrics)."""
    lags = [step - c.sampled_at_steps for c in completions if c.sampled_at_steps is not None and len(c.completion_ids)]
    tokens = sum(len(c.completion_ids) for c in completions)
    if not lags:
        return {"rollout/stale_tokens_frac": 0.0, "rollout/partial_responses_frac": 0.0, "rollout/max_token_lag_steps": 0.0}
    return {"rollout/stale_tokens_frac": float(sum(int((lag > 0).sum()) for lag in lags)) / max(tokens, 1),
            "rollout/partial_responses_frac": sum(int(lag.max() != lag.min()) for lag in lags) / len(completions),
            "rollout/max_token_lag_steps": float(max(int(lag.max()) for lag in lags))}

