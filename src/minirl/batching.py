"""Laying completions out for the trainer, and splitting a global batch into updates.

Each row is ``prompt_ids + completion_ids``, right-padded (so position ids are plain
``arange`` and match the engine's unpadded positions). Target position t predicts token
``input_ids[:, t + 1]``; ``mask[:, t]`` is True where that target is a completion token.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from minirl.types import Batch, Completion


def collate(completions: list[Completion], advantages: torch.Tensor, pad_token_id: int, *,
            mask_truncated: bool = False, trained_from_step: int | None = None) -> Batch:
    """Build a ``Batch`` from completions (in order) and their per-response advantages [B]. ``mask_truncated``:
    a completion cut by the length limit (``finish_reason == "length"``) trains no token (``algo.mask_truncated``).
    ``trained_from_step``: a token sampled at an earlier global step (``Completion.sampled_at_steps``, partial
    rollouts) trains nothing (``rollout.partial_mask_stale``). Nor does a token a tool call inserted
    (``Completion.sampled_mask``, ``task.tools``)."""
    if len(completions) != advantages.numel():
        raise ValueError(f"{len(completions)} completions but {advantages.numel()} advantages")
    lengths = [len(c.prompt_ids) + len(c.completion_ids) for c in completions]
    rows, width = len(completions), max(lengths)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.bool)
    mask = torch.zeros((rows, width - 1), dtype=torch.bool)
    logp_rollout = torch.zeros((rows, width - 1), dtype=torch.float32)
    first_routes = completions[0].routes
    routes: torch.Tensor | None = None
    if first_routes is not None:
        _, layers, top_k = first_routes.shape
        routes = torch.full((rows, width, layers, top_k), -1, dtype=first_routes.dtype)
    for row, (c, length) in enumerate(zip(completions, lengths)):
        n_prompt = len(c.prompt_ids)
        input_ids[row, :length] = torch.tensor(c.prompt_ids + c.completion_ids, dtype=torch.long)
        attention_mask[row, :length] = True
        # targets n_prompt .. length-1 sit at target positions n_prompt-1 .. length-2
        mask[row, n_prompt - 1 : length - 1] = not (mask_truncated and c.finish_reason == "length")
        if trained_from_step is not None and c.sampled_at_steps is not None:
            mask[row, n_prompt - 1 : length - 1] &= c.sampled_at_steps >= trained_from_step
        if c.sampled_mask is not None:  # a tool's result inside the response (task.tools) trains nothing
            mask[row, n_prompt - 1 : length - 1] &= c.sampled_mask
        logp_rollout[row, n_prompt - 1 : length - 1] = c.logp_rollout.float()
        if routes is not None:  # the first completion has routes: every one must
            if c.routes is None or c.routes.shape[0] != length:
                raise ValueError(f"completion {row}: routes missing or not aligned to its {length} positions")
            routes[row, :length] = c.routes
    group_ids = torch.tensor([c.prompt_index for c in completions], dtype=torch.long)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        mask=mask,
        logp_rollout=logp_rollout,
        advantages=advantages.float().reshape(-1),
        group_ids=group_ids,
        routes=routes,
    )


def trim(batch: Batch) -> Batch:
    """Drop trailing all-padding columns (a micro-batch is only as wide as its longest row)."""
    width = int(batch.attention_mask.sum(dim=1).max())
    if width == batch.input_ids.shape[1]:
        return batch
    return Batch(
        input_ids=batch.input_ids[:, :width],
        attention_mask=batch.attention_mask[:, :width],
        mask=batch.mask[:, : width - 1],
        logp_rollout=batch.logp_rollout[:, : width - 1],
        advantages=batch.advantages if batch.advantages.ndim == 1 else batch.advantages[:, : width - 1],
        group_ids=batch.group_ids,
        routes=None if batch.routes is None else batch.routes[:, :width],
        logp_old=None if batch.logp_old is None else batch.logp_old[:, : width - 1],
        logp_ref=None if batch.logp_ref is None else batch.logp_ref[:, : width - 1],
    )


def split(batch: Batch, parts: int) -> list[Batch]:
    """``parts`` contiguous, equal slices (mini-batches keep prompt groups together when G divides)."""
    if batch.size % parts:
        raise ValueError(f"cannot split {batch.size} sequences into {parts} equal parts")
    size = batch.size // parts
    return [batch.select(slice(i * size, (i + 1) * size)) for i in range(parts)]


def micro_batches(batch: Batch, max_sequences: int, max_tokens: int | None = None, *, padded: bool = True,
                  agree_device: torch.device | str | None = None,
                  prompts: Sequence[tuple[Hashable, int] | None] | None = None) -> list[tuple[slice | torch.Tensor, Batch]]:
    """(the rows of ``batch`` each holds, the micro-batch trimmed of padding): contiguous slices of ``max_sequences``
    rows, or with ``max_tokens`` the token budget's (``token_budget_chunks``, with its ``padded``, ``agree_device`` and
    ``prompts``). The trainer's and the critic's micro-batches."""
    if max_tokens is not None:
        return list(token_budget_chunks(batch, max_sequences, max_tokens, padded=padded, agree_device=agree_device,
                                        prompts=prompts))
    rows = [slice(start, min(start + max_sequences, batch.size)) for start in range(0, batch.size, max_sequences)]
    return [(part, trim(batch.select(part))) for part in rows]


def token_budget_rows(lengths: list[int], max_sequences: int, max_tokens: int, *, padded: bool = True,
                      at_least: int = 1, prompts: Sequence[tuple[Hashable, int] | None] | None = None) -> list[list[int]]:
    """Dynamic micro-batches (verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``, slime's
    ``--use-dynamic-batch-size --max-tokens-per-gpu``): the row indices of each micro-batch.

    Rows are taken longest first (ties in row order) and cut greedily, so a micro-batch's padded
    size, rows x its longest row, stays within ``max_tokens`` and its rows within
    ``max_sequences``; a row longer than ``max_tokens`` goes alone. Similar lengths share a
    micro-batch, so the padding a single right-padded batch carries mostly disappears. Each
    micro-batch lists its rows in ascending order; together they cover every row once.
    ``padded=False`` (``optim.padding_free``: the forward runs on real tokens only) bounds the sum of
    the rows' lengths instead, as verl does with ``use_remove_padding``.
    ``at_least``: the micro-batches are cut further until there are that many (each time the one with the most rows
    halved, its longer rows first), so FSDP ranks whose shards pack differently run the same number of forwards and
    backwards (every forward is a collective: verl likewise takes the largest micro-batch count over its data-parallel
    ranks); a budget only gets more room. At most one micro-batch per row.
    ``prompts`` (``optim.shared_prompt``, with ``padded=False``): per row, None or (key, length) as
    ``minirl.models.padding_free.shared_prompts`` gives them: the rows of a prompt are taken together (prompts by their
    longest row, longest first), and a row whose prompt the micro-batch already holds costs its completion only, as the
    shared forward computes it.
    """
    order = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    if prompts is not None and not padded:
        place = {row: i for i, row in enumerate(order)}
        first: dict[Hashable, int] = {}  # each prompt at the place of its longest row
        for row in order:
            if prompts[row] is not None:
                first.setdefault(prompts[row], place[row])
        order.sort(key=lambda row: (first[prompts[row]] if prompts[row] is not None else place[row], place[row]))
    groups: list[list[int]] = []
    current: list[int] = []
    held: set[Hashable] = set()  # the prompts the current micro-batch holds
    width = total = 0
    for row in order:
        prompt = prompts[row] if prompts is not None and not padded else None
        cost = lengths[row] - (prompt[1] if prompt is not None and prompt in held else 0)
        size = (len(current) + 1) * width if padded else total + cost
        if current and (len(current) + 1 > max_sequences or size > max_tokens):
            groups.append(sorted(current))
            current, total, cost = [], 0, lengths[row]
            held.clear()
        if not current:
            width = lengths[row]  # the longest row of the micro-batch: it comes first
        current.append(row)
        total += cost
        if prompt is not None:
            held.add(prompt)
    if current:
        groups.append(sorted(current))
    while len(groups) < min(at_least, len(lengths)):
        index = max(range(len(groups)), key=lambda g: (len(groups[g]), -g))  # the most rows, the first such
        longest_first = sorted(groups[index], key=lambda row: (-lengths[row], row))
        half = (len(longest_first) + 1) // 2
        groups[index: index + 1] = [sorted(longest_first[:half]), sorted(longest_first[half:])]
    return groups


def most_across_ranks(count: int, device: torch.device | str) -> int:
    """The largest ``count`` over the ranks of the default process group (a collective: every rank calls it)."""
    import torch.distributed as dist

    value = torch.tensor([count], dtype=torch.long, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def token_budget_chunks(batch: Batch, max_sequences: int, max_tokens: int, *, padded: bool = True,
                        agree_device: torch.device | str | None = None,
                        prompts: Sequence[tuple[Hashable, int] | None] | None = None) -> list[tuple[torch.Tensor, Batch]]:
    """``token_budget_rows`` of ``batch``: (row indices into ``batch``, the trimmed micro-batch). ``agree_device``
    (an FSDP rank's device): as many micro-batches as the rank that needs the most (``most_across_ranks``).
    ``prompts``: the rows' shared prompts (``token_budget_rows``)."""
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1)]
    groups = token_budget_rows(lengths, max_sequences, max_tokens, padded=padded, prompts=prompts)
    if agree_device is not None:
        wanted = most_across_ranks(len(groups), agree_device)
        if wanted > len(groups):
            groups = token_budget_rows(lengths, max_sequences, max_tokens, padded=padded, at_least=wanted,
                                       prompts=prompts)
    out = []
    for rows in groups:
        index = torch.tensor(rows, dtype=torch.long)
        out.append((index, trim(batch.select(index))))
    return out
