"""Decoding over a static KV cache by batch-size bucket; on CUDA each bucket's step is a CUDA graph.

``NativeEngine(decode_path="static")`` (and, on CUDA, ``rollout.cuda_graphs: true``) decodes with
``BucketDecoder`` instead of the dynamic loop of ``NativeEngine._decode``:

* the running rows sit in a *bucket* of a fixed size (a power of two); rows that finish stay in it,
  computed but masked out of every output, until the rows still running fit the next smaller bucket,
  which they then move to (their cache rows are copied): the batch shrinks ``log2(B)`` times at most,
  not at every EOS;
* the KV cache of a bucket is one tensor per layer ``[bucket, kv heads, prompt width + max new
  tokens, head dim]``; a step writes its column with ``index_copy_`` at a column held in a device
  tensor, and every row attends to its key mask over the whole length (the columns it has filled):
  the step has the same shapes at every position, so it can be captured once per bucket;
* each step's routes (R3) are written into the routes buffer ``[B, P + N, L, K]`` at the step's
  column, only for running rows, with device-side indexing; MoE experts are grouped GEMMs with
  offsets on the device (``FastDecoder.grouped_mm``);
* no host synchronisation inside the decode loop: whether the running rows fit a smaller bucket is
  read from a count copied to the host without blocking (``non_blocking`` + an event on CUDA), so it
  may be seen a step late; only a bucket change (at most ``log2(B)`` per rollout) waits, and a partial rollout's
  stop (``DecodeControl``), asked every ``check_every_tokens`` steps which rows have ended.

Sampling stays eager (``minirl.rollout.sampling.Draw``; a repetition penalty's seen tokens kept by row), so ``logp_rollout`` is exactly the
law the token was drawn from. With ``per_sample`` seeding every row owns its stream and the samples
are those of the dynamic loop; with ``per_batch`` seeding one noise tensor covers the whole bucket
(finished rows included), so the draws are exact but not the dynamic loop's random numbers.

Eagerly (``graphs=False``, the CPU), a step slices the cache to the columns filled so far, exactly as
``FastDecoder.step`` does, so the logits are bitwise the dynamic path's. Captured (``graphs=True``,
CUDA only) it attends over the whole static length with the key mask: the same values up to the
summation order of the masked softmax (``full_length=True`` runs that variant eagerly, for tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from minirl.rollout.base import DecodeControl
from minirl.rollout.fast_decode import FastDecoder, StaticKVCache
from minirl.rollout.sampling import Draw


def bucket_sizes(rows: int) -> list[int]:
    """Bucket sizes from the smallest power of two >= ``rows`` down to 1."""
    size = 1 << max(rows - 1, 0).bit_length()
    sizes = []
    while size >= 1:
        sizes.append(size)
        size //= 2
    return sizes


@dataclass
class _Bucket:
    """Static buffers of one bucket: what a captured step reads and writes."""

    rows: torch.Tensor  # long [n]: original row of each slot (B = scratch, for empty slots)
    row_list: list[int]  # the same, on the host
    tokens: torch.Tensor  # long [n]: the token each slot feeds next
    positions: torch.Tensor  # long [n]: prompt length + step
    prompt_lengths: torch.Tensor  # long [n]
    key_mask: torch.Tensor  # bool [n, length]: the columns each slot attends to (filled as they are written)
    alive: torch.Tensor  # bool [n]: still running (not finished, not empty)
    cache: StaticKVCache
    logits: Any = None  # float [n, V] once the first step ran
    routes: Any = None  # int16 [n, L, K] (recording) or None
    graph: Any = None


class BucketDecoder:
    """The bucketed decode loop over a ``FastDecoder``'s weights (see the module docstring)."""

    def __init__(self, fast: Any, *, graphs: bool = False, full_length: bool | None = None) -> None:
        self.fast: FastDecoder = fast
        self.graphs = graphs
        self.full_length = graphs if full_length is None else full_length
        if graphs and not self.full_length:
            raise ValueError("a captured step attends over the full static length (full_length=True)")
        if graphs and not fast.grouped_mm and any(layer.router is not None for layer in fast.layers):
            raise ValueError("a captured step needs the device-side grouped GEMM experts (FastDecoder.grouped_mm: "
                             "bf16 experts on CUDA)")

    # ------------------------------------------------------------------ one step, static shapes

    def _step(self, bucket: _Bucket, column: torch.Tensor, end: int, record_routes: bool, padded: bool) -> None:
        """Feed ``bucket.tokens`` at ``bucket.positions``, keys written at ``column`` (long [1]);
        logits (and routes) into the bucket's buffers. ``end``: columns filled after this step
        (eager slicing; the whole static length with ``full_length``)."""
        bucket.key_mask.index_fill_(1, column, True)
        mask: torch.Tensor | None
        if self.full_length:
            mask = bucket.key_mask[:, None, None, :]
        else:  # the dynamic path's mask: none without padding, else the filled columns
            mask = bucket.key_mask[:, None, None, :end] if padded else None
        logits, routes = self.fast._forward(bucket.tokens[:, None], bucket.positions[:, None], column, mask, bucket.cache,
                                            record_routes, reserved=True, end=None if self.full_length else end)
        if bucket.logits is None:
            bucket.logits, bucket.routes = logits, None if routes is None else routes[:, 0]
        else:  # captured or replayed: into the same buffers
            bucket.logits.copy_(logits)
            if routes is not None:
                bucket.routes.copy_(routes[:, 0])

    def _run_step(self, bucket: _Bucket, column: torch.Tensor, end: int, record_routes: bool, padded: bool) -> None:
        if not self.graphs:
            self._step(bucket, column, end, record_routes, padded)
            return
        if bucket.graph is None:  # warm up on a side stream, then capture this bucket's step once
            # the warm-up writes a column too: the step is idempotent for one column (same k, v, mask); a linear-
            # attention layer's states are not (the step advances them), so they are put back after it
            states = [(kept, kept.clone()) for kept in self._recurrent_states(bucket.cache)]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._step(bucket, column, end, record_routes, padded)
                for kept, before in states:
                    kept.copy_(before)
            torch.cuda.current_stream().wait_stream(stream)
            bucket.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(bucket.graph):
                self._step(bucket, column, end, record_routes, padded)
        bucket.graph.replay()

    def _recurrent_states(self, cache: StaticKVCache) -> list[torch.Tensor]:
        """The cache tensors a step updates in place rather than at its column: linear-attention layers' conv and
        recurrent states (``FastDecoder._deltanet_step``)."""
        return [state for index, layer in enumerate(self.fast.layers) if layer.deltanet is not None
                for state in (cache.keys[index], cache.values[index])]

    # ------------------------------------------------------------------ the loop

    def decode(self, running: Any, logits: torch.Tensor, out: Any, draw: Draw, generator: Any, eos_ids: torch.Tensor,
               record_routes: bool, max_new: int, control: DecodeControl | None = None) -> None:
        """Decode ``max_new`` tokens for the prefilled ``running`` rows (``NativeEngine._Running``, its
        cache a ``StaticKVCache`` of ``width + max_new`` columns) from their first ``logits`` [B, V]
        into ``out`` (``NativeEngine._Outputs``, routes started when recorded); ``draw`` samples (a spare row for
        the scratch slot). ``control``: each row's budget (a device-side check) and a stop asked every
        ``check_every_tokens`` steps (one host sync each: which rows have ended)."""
        # Over 60 lines: the whole decode loop (sample, record, finish, shrink to a smaller bucket) in one place,
        # so the order of the steps that must not sync the host is visible.
        fast, device = self.fast, logits.device
        width, total = running.prompt_width, running.rows.numel()
        length = width + max_new
        fast.reserve_positions(length, fast.embed.dtype)
        padded = running.attention_mask is not None  # the dynamic path masks only padded prompts
        key_mask = torch.zeros(total, length, dtype=torch.bool, device=device)
        key_mask[:, :width] = True if not padded else running.attention_mask[:, :width]
        sizes = bucket_sizes(total)
        streams = None
        if isinstance(generator, list):  # per_sample: each slot its own stream; empty slots a spare one
            spare = torch.Generator(device=device)
            streams = list(generator) + [spare]
        bucket = self._bucket(sizes[0], torch.arange(total, device=device), running.prompt_lengths, key_mask,
                              running.cache, total)
        scratch = total  # the out buffers get one extra row: empty and finished slots write there
        tokens_out, logp_out = _with_scratch_row(out.tokens), _with_scratch_row(out.logp)
        num_tokens = _with_scratch_row(out.num_tokens)
        routes = None if out.routes is None else _with_scratch_row(out.routes)
        counter = _RunningCount(device)
        budgets = None if control is None else _with_scratch_row(torch.tensor(control.max_new_tokens, device=device))
        column = torch.zeros(1, dtype=torch.long, device=device)
        step_logits = _pad_rows(logits, bucket.rows.numel())
        for step in range(max_new):
            step_generator = generator
            if streams is not None:
                step_generator = [streams[row] for row in bucket.row_list]
            tokens, logp = draw(step_logits, bucket.rows, step_generator)
            slots = torch.where(bucket.alive, bucket.rows, scratch)
            tokens_out[slots, step] = tokens
            logp_out[slots, step] = logp
            finished = bucket.alive & torch.isin(tokens, eos_ids)
            if budgets is not None:  # a row's own budget reached
                finished |= bucket.alive & (budgets[bucket.rows] <= step + 1)
            num_tokens[torch.where(finished, bucket.rows, scratch)] = step + 1
            bucket.alive &= ~finished
            if step == max_new - 1:
                break
            if control is not None and control.stops_at(step, bucket.rows[bucket.alive], num_tokens, total):
                break
            count = counter.read(bucket.alive)
            if count == 0:
                break
            if count is not None and count <= bucket.rows.numel() // 2:  # move to the smallest bucket that fits
                keep = bucket.alive.nonzero().squeeze(-1)  # waits for the device: once per bucket change
                if keep.numel() == 0:
                    break
                size = min(size for size in sizes if size >= keep.numel())
                tokens = _pad_rows(tokens[keep], size)
                bucket = self._bucket(size, bucket.rows[keep], bucket.prompt_lengths[keep], bucket.key_mask[keep],
                                      StaticKVCache([k[keep] for k in bucket.cache.keys], [v[keep] for v in bucket.cache.values]),
                                      total)  # fmt: skip
            bucket.tokens.copy_(tokens)
            torch.add(bucket.prompt_lengths, step, out=bucket.positions)
            column.fill_(width + step)  # completion token `step` sits at column width + step
            self._run_step(bucket, column, width + step + 1, record_routes, padded)
            step_logits = bucket.logits
            if routes is not None:
                routes[torch.where(bucket.alive, bucket.rows, scratch), width + step] = bucket.routes
        out.tokens, out.logp, out.num_tokens = tokens_out[:total], logp_out[:total], num_tokens[:total]
        if routes is not None:
            out.routes = routes[:total]

    def _bucket(self, size: int, rows: torch.Tensor, prompt_lengths: torch.Tensor, key_mask: torch.Tensor,
                cache: StaticKVCache, total: int) -> _Bucket:
        """A bucket of ``size`` slots holding ``rows`` (the others empty: copies of the last row's
        state, written to the scratch row ``total``)."""
        device, n = rows.device, rows.numel()
        index = torch.arange(size, device=device).clamp(max=n - 1)
        row_list = rows.tolist() + [total] * (size - n)  # once per bucket, for per-sample streams
        return _Bucket(
            rows=torch.tensor(row_list, dtype=torch.long, device=device), row_list=row_list,
            tokens=torch.zeros(size, dtype=torch.long, device=device),
            positions=torch.zeros(size, dtype=torch.long, device=device),
            prompt_lengths=prompt_lengths.index_select(0, index), key_mask=key_mask.index_select(0, index),
            alive=torch.arange(size, device=device) < n,
            cache=StaticKVCache([k.index_select(0, index) for k in cache.keys], [v.index_select(0, index) for v in cache.values]),
        )


class _RunningCount:
    """How many rows still run, read without blocking the host. On CUDA the count is copied to pinned
    memory after each step and read at a later step once its event has completed (``read`` returns
    None while none has landed); on the CPU it is read at once."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host = torch.zeros((), dtype=torch.long, pin_memory=self.cuda)
        self.event = torch.cuda.Event() if self.cuda else None
        self.recorded = False

    def read(self, alive: torch.Tensor) -> int | None:
        if self.event is None:  # not on CUDA
            return int(alive.sum())
        value = int(self.host) if self.recorded and self.event.query() else None
        if value is not None or not self.recorded:  # start the next copy once the last one has landed
            self.host.copy_(alive.sum(), non_blocking=True)
            self.event.record()
            self.recorded = True
        return value


def _with_scratch_row(tensor: torch.Tensor) -> torch.Tensor:
    return torch.cat([tensor, tensor[-1:].clone()])


def _pad_rows(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """``tensor`` [n, ...] with its last row repeated up to ``size`` rows."""
    extra = size - tensor.shape[0]
    return tensor if extra == 0 else torch.cat([tensor, tensor[-1:].expand(extra, *tensor.shape[1:])])
