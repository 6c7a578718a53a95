"""Padding-free forward passes (verl's ``use_remove_padding``, TRL's ``padding_free``): ``optim.padding_free``.

A right-padded batch [B, S] runs through the model as one row of its T real tokens [1, T] with each
token's own position (``position_ids``), so the embeddings, norms, projections, MoE routers and
experts and the LM head do no work on padding. Only attention needs the rows apart: a custom
attention implementation (registered with transformers' ``AttentionInterface``, switched on for the
forward and kept on through its backward) spreads each layer's query, key and value back to padded
rows, in blocks of rows of similar length ([rows, heads, width, d] each), runs the model's own
attention function on them (causal and unmasked, the padded path's call; a sliding-window layer gets
the window the padded path's mask carries) and gathers the T real outputs again. Logits come back as
[B, S, V] (zeros at padding), so nothing downstream changes.

With shared prompts (``optim.shared_prompt``, verl's ``use_prefix_grouper``, NeMo RL's ``shared_prefix_training``)
rows whose prompts are the same tokens (and, under routing replay, the same routes) pack that prompt once: the
packed row holds it in the first such row only, every other row packs its completion alone, and when the rows
are spread apart for attention each gathers its prompt's keys and values from the one copy. Everything but
attention then runs on P + G R tokens of a group instead of G (P + R); the log-probs of the shared tokens are
copied to every row, and their gradients sum over the rows, as the padded forward's do. Under sdpa the rows that
read a prompt elsewhere attend with their own tokens' queries only (R queries over P + R keys, a causal mask
aligned to the row's last key: Prefix Grouper's split of attention), so attention too skips the prompt's G - 1
repeats; under flash attention (no 4-D mask) they ask at every slot and the prompt's answers are dropped.

On a CPU this is the padded forward's arithmetic on fewer rows: the real tokens' log-probs equal the
padded forward's (bitwise on the machines tested) and the gradients do to float rounding (the weight
gradients sum over fewer rows, in another order); ``tests/unit/test_padding_free.py``. Routing replay
sees the packed call ([1, T, L, K] routes); ``Trainer`` packs the routes it replays and spreads the
routes it records (-1 at padding).

Refused in one line: an attention implementation other than ``sdpa`` / ``flash_attention_*`` (``eager``
would need a mask), a row whose real tokens are not a prefix, and a model in which not every layer's
token mixing goes through the attention interface (a linear-attention or state-space layer would mix
the packed rows), the last checked on every forward by counting the attention calls. Llama-4's layers
see more than the attention interface gives: its chunked-attention layers attend within chunks of
``attention_chunk_size`` positions (a row no longer than that is one chunk: causal, what the packed
attention runs), and its NoPE layers scale queries by the token's index along the row they are called
with (``attn_temperature_tuning``; 1 below ``floor_scale``), which in the packed row is its index among
all packed tokens. So a forward with a row wider than the chunk, or more packed tokens than
``floor_scale`` - 1, is refused (``PackedForward.limits``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from minirl.types import to_device

ATTENTION = "minirl_padding_free"
SUPPORTED = ("sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4")


class PaddingFreeError(ValueError):
    """A model padding-free forwards cannot run (reported in one line by the CLI)."""


# Rows attend in blocks of similar length: a row joins the block of longer rows before it while it holds at least
# GROUP_RATIO of the block's longest row (or the block is at most GROUP_MIN_WIDTH long), so attention's padded work
# stays near its real work without one call per row.
GROUP_RATIO = 0.8
GROUP_MIN_WIDTH = 32
# Attention implementations that take a 4-D boolean mask: there the rows that read a shared prompt ask only at their own
# tokens (a causal mask aligned to each row's last key); elsewhere (flash attention) they ask at every slot, the prompt's
# answers dropped.
MASKED = ("sdpa",)


@dataclass(frozen=True)
class Block:
    """Rows of similar length whose attention runs as one padded [rows, heads, width, d] call: their tokens are
    ``start:end`` of the packed row, and ``place`` holds i * width + t of each (row i of the block, position t).

    A block of rows that read a shared prompt from another row (``optim.shared_prompt``) also holds ``source``: for
    every padded slot i * width + t the packed token it reads (the prompt's one copy, then the row's own tokens; T at
    padding). Under sdpa only the rows' own tokens ask (``queries``: [rows * query_width] packed tokens, T at padding;
    ``query_place``: i * query_width + a of each own token), the a-th at position ``offsets[i]`` + a, seeing the keys
    up to it (``mask`` [rows, 1, query_width, width]: the causal mask, aligned to the last key of each row)."""

    start: int
    end: int
    rows: int
    width: int
    place: torch.Tensor
    source: torch.Tensor | None = None
    queries: torch.Tensor | None = None
    query_place: torch.Tensor | None = None
    offsets: torch.Tensor | None = None
    mask: torch.Tensor | None = None


@dataclass
class Packing:
    """Where the real tokens of a right-padded [B, S] batch sit in the packed row: ``index`` holds b * S + t of
    each, rows longest first (so each attention block's tokens are contiguous), positions 0.. within a row."""

    rows: int
    width: int
    index: torch.Tensor  # [T] long, on the model's device
    positions: torch.Tensor  # [1, T] long: t of each real token
    blocks: list[Block]
    calls: int = 0  # attention calls seen (every layer must call once per forward)
    original: str = "sdpa"  # the model's own attention implementation, run on the spread rows
    slots: torch.Tensor | None = None  # shared prompts: [B * S] packed token of each slot, T at padding (else None)

    @classmethod
    def of(cls, attention_mask: torch.Tensor, device: torch.device | str = "cpu",
           prompts: Sequence[tuple[Hashable, int] | None] | None = None) -> Packing:
        """The packing of a host [B, S] mask whose real tokens are each row's prefix (``ValueError`` if not).
        ``prompts`` (shared prompts): per row, None or (key, length): rows with the same key share their first
        ``length`` tokens, packed once in the first of them in packing order (``shared_prompts``)."""
        mask = attention_mask.bool().cpu()
        rows, width = mask.shape
        lengths = mask.sum(dim=1)
        columns = torch.arange(width)
        if not torch.equal(mask, columns[None, :] < lengths[:, None]):
            bad = int((mask != (columns[None, :] < lengths[:, None])).any(dim=1).nonzero()[0, 0])
            raise ValueError(f"optim.padding_free: row {bad}'s real tokens are not a prefix of the row (right padding only)")
        sizes = lengths.tolist()
        order = sorted(range(rows), key=lambda row: (-sizes[row], row))
        skip, owner = _owners(order, sizes, prompts)
        # the rows that pack all their tokens first, then the rows that read a prompt elsewhere: blocks keep them apart
        order = [row for row in order if not skip[row]] + [row for row in order if skip[row]]
        groups: list[list[int]] = []
        for row in order:
            if groups and bool(skip[row]) == bool(skip[groups[-1][0]]) and (
                    sizes[row] >= GROUP_RATIO * sizes[groups[-1][0]] or sizes[groups[-1][0]] <= GROUP_MIN_WIDTH):
                groups[-1].append(row)
            else:
                groups.append([row])
        begin, total = [0] * rows, 0  # where each row's own tokens start in the packed row
        for row in order:
            begin[row], total = total, total + sizes[row] - skip[row]

        def sources(row: int, slots: int) -> torch.Tensor:  # the packed token of each of the row's first slots
            t = torch.arange(slots)
            return torch.where(t < skip[row], begin[owner[row]] + t,
                               torch.where(t < sizes[row], begin[row] + t - skip[row], total))

        blocks, start = [], 0
        for group in groups:
            block_width = sizes[group[0]]
            place = torch.cat([i * block_width + torch.arange(skip[row], sizes[row]) for i, row in enumerate(group)])
            block = Block(start, start + len(place), len(group), block_width, to_device(place, device))
            if skip[group[0]]:  # rows reading a shared prompt: every slot gathered; queries only for their own tokens
                source = torch.cat([sources(row, block_width) for row in group])
                block = _sharing(block, source, [skip[row] for row in group], [sizes[row] for row in group],
                                 [begin[row] for row in group], total, device)
            blocks.append(block)
            start += len(place)
        shared = any(skip)
        flat = torch.cat([row * width + torch.arange(skip[row], sizes[row]) for row in order])
        slots = torch.cat([sources(row, width) for row in range(rows)]) if shared else None
        # pinned, non-blocking copies to a GPU: building the packing never waits for the device's queue
        return cls(rows, width, to_device(flat, device), to_device((flat % width).unsqueeze(0), device), blocks,
                   slots=None if slots is None else to_device(slots, device))

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, S, ...] -> [1, T, ...]: the real tokens, rows longest first."""
        return x.reshape(self.rows * self.width, *x.shape[2:]).index_select(0, self.index.to(x.device)).unsqueeze(0)

    def unpack(self, x: torch.Tensor, fill: float = 0) -> torch.Tensor:
        """[1, T, ...] -> [B, S, ...], ``fill`` at padding (differentiable in ``x``; a shared prompt's tokens are
        copied to each of its rows, and their gradients summed)."""
        if self.slots is not None:
            padded = torch.cat([x[0], x.new_full((1, *x.shape[2:]), fill)])
            return padded.index_select(0, self.slots.to(x.device)).view(self.rows, self.width, *x.shape[2:])
        base = x.new_full((self.rows * self.width, *x.shape[2:]), fill)
        return base.index_copy(0, self.index.to(x.device), x[0]).view(self.rows, self.width, *x.shape[2:])

    def spread_heads(self, x: torch.Tensor, block: Block, tokens: torch.Tensor | None = None,
                     gather: torch.Tensor | None = None) -> torch.Tensor:
        """``block``'s part of an attention input [1, H, T, d] -> [rows, H, width, d] (zeros at padding), laid out
        as the padded forward lays it out (a transposed [rows, width, H, d]); a shared prompt is read from its one
        packed copy (``tokens``: ``x``'s [T + 1, H, d] with a zero token at the end, ``_with_zero``). ``gather``: the
        packed tokens to read (default ``block.source``; ``block.queries`` for a sharing block's queries)."""
        gather = block.source if gather is None else gather
        if gather is not None:
            spread = (self._with_zero(x) if tokens is None else tokens).index_select(0, gather)
            return spread.view(block.rows, -1, *spread.shape[1:]).transpose(1, 2)
        part = x[0, :, block.start:block.end].transpose(0, 1)  # [n, H, d]
        base = part.new_zeros((block.rows * block.width, *part.shape[1:]))
        return base.index_copy(0, block.place, part).view(block.rows, block.width, *part.shape[1:]).transpose(1, 2)

    @staticmethod
    def _with_zero(x: torch.Tensor) -> torch.Tensor:
        """An attention input [1, H, T, d] as [T + 1, H, d], a zero token last (what a padded slot reads)."""
        return torch.cat([x[0].transpose(0, 1), x.new_zeros((1, x.shape[1], x.shape[3]))])

    def attend(self, own: Any, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               **kwargs: Any) -> torch.Tensor:
        """``own`` attention block by block: [1, T, H, d]. Causal and unmasked (the padded forward's call), but for a
        sliding-window layer (``sliding_window`` given) under sdpa, whose window the padded forward's mask carries:
        there the block gets that causal window mask (flash attention applies the window itself)."""
        window = kwargs.get("sliding_window") if self.original == "sdpa" else None
        outs = []
        tokens = [self._with_zero(x) if self.slots is not None else None for x in (query, key, value)]
        for block in self.blocks:
            k, v = (self.spread_heads(x, block, own_tokens) for x, own_tokens in zip((key, value), tokens[1:]))
            if block.queries is not None and self.original in MASKED:  # a sharing block: its own tokens ask
                q = self.spread_heads(query, block, tokens[0], block.queries)
                mask, rows_out, place = block.mask, q.shape[2], block.query_place
                if window is not None and block.width > window and block.offsets is not None:
                    at = block.offsets[:, None] + torch.arange(q.shape[2], device=query.device)[None, :]
                    mask = mask & (torch.arange(block.width, device=query.device) > at[:, :, None] - window)[:, None]
            else:
                q = self.spread_heads(query, block, tokens[0])
                mask, rows_out, place = None, block.width, block.place
                if window is not None and block.width > window:  # transformers' sliding_window_overlay: q - kv < window
                    i = torch.arange(block.width, device=query.device)
                    mask = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window))[None, None]
            out, _ = own(module, q, k, v, mask, **kwargs)  # [rows, queries, H, d]
            outs.append(out.reshape(block.rows * rows_out, *out.shape[2:]).index_select(0, place))
        return torch.cat(outs).unsqueeze(0)


def _owners(order: list[int], sizes: list[int], prompts: Sequence[tuple[Hashable, int] | None] | None
            ) -> tuple[list[int], list[int]]:
    """Per row, how many leading tokens it reads from another row (its shared prompt's length, 0 for the row that
    packs it: the first of the prompt's rows in ``order``) and that row (itself when 0)."""
    skip, owner = [0] * len(sizes), list(range(len(sizes)))
    first: dict[Hashable, int] = {}
    for row in order:
        prompt = prompts[row] if prompts is not None else None
        if prompt is not None and 0 < prompt[1] <= sizes[row]:
            owner[row] = first.setdefault(prompt, row)
            skip[row] = prompt[1] if owner[row] != row else 0
    return skip, owner


def _sharing(block: Block, source: torch.Tensor, skips: list[int], sizes: list[int], begins: list[int], total: int,
             device: torch.device | str) -> Block:
    """``block`` of rows that read a shared prompt (their ``skips`` leading tokens) from another row: every slot's
    packed token (``source``), and their own tokens' queries (from ``begins``; T = ``total`` at padding) with the causal
    mask aligned to each row's last key (``Block``)."""
    own = [size - skip for size, skip in zip(sizes, skips)]
    width_q = max(own)
    a = torch.arange(width_q)
    offsets = torch.tensor(skips)
    keys = torch.arange(block.width)
    mask = (keys[None, None, :] <= offsets[:, None, None] + a[None, :, None]) & (
        keys[None, None, :] < torch.tensor(sizes)[:, None, None])
    return dataclasses.replace(
        block, source=to_device(source, device),
        queries=to_device(torch.cat([torch.where(a < n, begin + a, total) for begin, n in zip(begins, own)]), device),
        query_place=to_device(torch.cat([i * width_q + torch.arange(n) for i, n in enumerate(own)]), device),
        offsets=to_device(offsets, device), mask=to_device(mask.unsqueeze(1), device))


def shared_prompts(input_ids: torch.Tensor, mask: torch.Tensor, routes: torch.Tensor | None = None
                   ) -> list[tuple[Hashable, int] | None]:
    """``Packing.of``'s ``prompts`` for a batch (``optim.shared_prompt``): per row, its prompt (the tokens before its
    first completion target; ``mask`` [B, T] is True where ``input_ids[:, t + 1]`` is one) as (key, length), the key
    the prompt's tokens and, with ``routes`` [B, S, L, K] (the routes a forward replays), their routes too, so rows
    share a prompt only where a replay would feed them the same experts. None for a row without a completion token."""
    ids, targets = input_ids.cpu(), mask.bool().cpu()
    firsts = targets.int().argmax(dim=1).add(1).tolist()
    has = targets.any(dim=1).tolist()
    replayed = None if routes is None else routes.cpu()
    out: list[tuple[Hashable, int] | None] = []
    for row, (length, real) in enumerate(zip(firsts, has)):
        key = ids[row, :length].numpy().tobytes()
        if replayed is not None:
            key += b"|" + replayed[row, :length].numpy().tobytes()
        out.append((key, length) if real else None)
    return out


def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, *, minirl_packing: Packing | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The registered attention: the model's own implementation on the packed call's rows spread apart."""
    if minirl_packing is None:
        raise RuntimeError(f"the {ATTENTION} attention ran without its packing: this layer ({type(module).__name__}) "
                           "does not pass the model's keyword arguments on to its attention; turn optim.padding_free off")
    packing = minirl_packing
    packing.calls += 1
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kwargs.pop("position_ids", None)  # the spread rows are plain 0..S-1 again
    return packing.attend(ALL_ATTENTION_FUNCTIONS[packing.original], module, query, key, value, **kwargs), None


def _configs(model: nn.Module) -> list[Any]:
    from transformers import PretrainedConfig

    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig):
            seen.setdefault(id(config), config)
    return list(seen.values())


class PackedForward:
    """The padding-free forwards of one model; what they need of it is read once: its configs (whose attention
    implementation a packed forward switches), its own attention implementation and its layer count.
    ``PaddingFreeError`` in one line when the model cannot run them, naming ``keys`` (the settings that asked for
    them: ``optim.padding_free``, ``optim.shared_prompt``)."""

    def __init__(self, model: nn.Module, keys: Sequence[str] = ("optim.padding_free",)) -> None:
        self.model = model
        self.key = " and ".join(keys)
        self.off = "set " + " and ".join(f"{key}=false" for key in keys)
        self.configs = _configs(model)
        if not self.configs:
            raise PaddingFreeError(f"{self.key} needs a Hugging Face transformers model (no PretrainedConfig found)")
        implementation = getattr(self.configs[0], "_attn_implementation", None)
        if implementation not in SUPPORTED:
            raise PaddingFreeError(f"{self.key}: this model's attention runs as '{implementation}' (it needs a mask "
                                   f"over padding); padding-free forwards need 'sdpa' or 'flash_attention_*': {self.off}")
        self.original = str(implementation)
        self.layers = _attention_layers(self.configs, self.key)
        self.limits = _position_limits(self.configs)
        self.shared_prompt = "optim.shared_prompt" in keys  # each prompt of a micro-batch once (``prompts``)
        _register()

    def prompts(self, input_ids: torch.Tensor, mask: torch.Tensor, routes: torch.Tensor | None = None
                ) -> list[tuple[Hashable, int] | None] | None:
        """``Packing.of``'s (and a token budget's) ``prompts`` for these rows: ``shared_prompts`` (their prompts, keyed
        by ``routes`` too where a forward replays them) under ``optim.shared_prompt``, else None (each row its own)."""
        return shared_prompts(input_ids, mask, routes) if self.shared_prompt else None

    @contextmanager
    def packed_attention(self, packing: Packing) -> Iterator[None]:
        """Inside: the model's attention runs as ``ATTENTION`` (its own implementation recorded in ``packing``)."""
        packing.original = self.original
        before = [config._attn_implementation for config in self.configs]
        for config in self.configs:
            config._attn_implementation = ATTENTION
        try:
            yield
        finally:
            for config, implementation in zip(self.configs, before):
                config._attn_implementation = implementation

    def __call__(self, input_ids: torch.Tensor, packing: Packing, stack: ExitStack | None = None,
                 router_logits: list | None = None, **kwargs: Any) -> torch.Tensor:
        """The model's logits [B, S, V] for the right-padded ``input_ids`` [B, S], computed on its real tokens only
        (zeros at padding). ``kwargs`` go to the model call (e.g. ``use_cache=False``). With ``stack``, the packed
        attention stays switched on until the caller closes it: after a backward that recomputes checkpointed
        layers (gradient checkpointing). ``router_logits`` (a list): the model's, one [real tokens, E] per MoE layer.
        """
        self._within_limits(packing)
        with ExitStack() as own:
            (stack or own).enter_context(self.packed_attention(packing))
            out = self.model(input_ids=packing.pack(input_ids), position_ids=packing.positions, minirl_packing=packing,
                             **kwargs)
        if packing.calls != self.layers:
            raise PaddingFreeError(f"{self.key}: {packing.calls} of the model's {self.layers} layers ran their "
                                   f"attention through transformers' attention interface ({type(self.model).__name__}); "
                                   f"the others would mix the packed rows: {self.off}")
        if router_logits is not None:  # [real tokens, E] per MoE layer
            router_logits.extend(out.router_logits)
        return packing.unpack(out.logits)


    def _within_limits(self, packing: Packing) -> None:
        """``PaddingFreeError`` when ``packing`` exceeds the model's ``limits`` (module docstring)."""
        width, tokens = self.limits
        if width is not None and packing.width > width:
            raise PaddingFreeError(f"{self.key}: rows of {packing.width} tokens exceed this model's attention_chunk_size "
                                   f"{width} (its chunked-attention layers attend within chunks; packed attention does "
                                   f"not cut them): {self.off}, or keep sequences within {width} tokens")
        packed = int(packing.positions.shape[-1])
        if tokens is not None and packed > tokens:
            raise PaddingFreeError(f"{self.key}: {packed} packed tokens exceed this model's floor_scale - 1 = {tokens} "
                                   "(its NoPE layers' attn_temperature_tuning scales a query by its index in the row it "
                                   f"is called with): {self.off}, or lower optim.micro_batch_max_tokens to {tokens}")


def _position_limits(configs: list[Any]) -> tuple[int | None, int | None]:
    """(widest row, most packed tokens) a packed forward of a model with these configs equals the padded forward at;
    None: no limit. Llama-4's chunked attention and NoPE temperature tuning (module docstring)."""
    width = tokens = None
    for config in configs:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        if "chunked_attention" in (getattr(text, "layer_types", None) or ()) and getattr(text, "attention_chunk_size", None):
            width = min(width or text.attention_chunk_size, int(text.attention_chunk_size))
        no_rope = [not used for used in getattr(text, "no_rope_layers", None) or ()]
        if getattr(text, "attn_temperature_tuning", False) and any(no_rope) and getattr(text, "floor_scale", None):
            tokens = min(tokens or text.floor_scale, int(text.floor_scale) - 1)
    return width, tokens


def packed_forward(model: nn.Module, padding_free: bool, shared_prompt: bool) -> PackedForward | None:
    """The padding-free forward ``optim.padding_free`` / ``optim.shared_prompt`` ask of ``model`` (the trainer's, the
    critic's); None when both are off. A model that cannot run it is refused now, in one line naming the keys set."""
    keys = [f"optim.{key}" for key, on in (("padding_free", padding_free), ("shared_prompt", shared_prompt)) if on]
    return PackedForward(model, keys) if keys else None


def forward(model: nn.Module, input_ids: torch.Tensor, packing: Packing, **kwargs: Any) -> torch.Tensor:
    """One padding-free forward of ``model`` (``PackedForward(model)(input_ids, packing, **kwargs)``)."""
    return PackedForward(model)(input_ids, packing, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface

    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, attention)


def _attention_layers(configs: list[Any], key: str = "optim.padding_free") -> int:
    """Attention calls in one forward: one per decoder layer (``num_hidden_layers`` of the text config)."""
    for config in configs:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        layers = getattr(text, "num_hidden_layers", None)
        if layers:
            return int(layers)
    raise PaddingFreeError(f"{key}: the model's config has no num_hidden_layers")


__all__ = ["ATTENTION", "PackedForward", "Packing", "PaddingFreeError", "attention", "forward", "packed_forward",
           "shared_prompts"]
