"""An fp8 KV cache for ``NativeEngine`` (``rollout.kv_cache_precision``): a Hugging Face
``DynamicCache`` that rounds keys and values to fp8 as they are written.

Each key and value vector (one token, one KV head: ``head_dim`` values, post-RoPE and post-norm)
is rounded to ``fp8_e4m3`` or ``fp8_e5m2`` with its own dynamic fp32 scale ``amax / fp8 max``
(``minirl.rollout.precision.fake_quantize_kv``) and stored dequantised in the compute dtype. A
token's scale depends on that token's vector alone, so this is bitwise what an fp8 store with
per-token-head scales, dequantised on every read, gives attention; storing the rounded values
keeps every other cache operation (``batch_repeat_interleave``, ``batch_select_indices``, masks,
lengths) HF's own. Only ``update`` differs from ``DynamicCache``.

The engine's cache operations for any model (``new_cache``, ``repeat_rows``, ``select_rows``): transformers' own,
plus the states its batch methods leave behind (the conv and recurrent states of linear-attention, Mamba and
short-conv layers: Qwen3.5, Qwen3-Next, Jamba, Granite-4, LFM2, Kimi-Linear), and the cache class of its own a model
may require (``OWN_CACHES``: MiniMax-Text-01's).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from transformers import Cache, DynamicCache

from minirl.rollout.precision import FP8_DTYPES, KV_CACHE_PRECISIONS, fake_quantize_kv

# model types whose forward takes only a cache class of its own (from its modeling module): MiniMax-Text-01's lightning
# attention keeps its linear states in ``MiniMaxCache``
OWN_CACHES = {"minimax": "MiniMaxCache"}


def check_cache_precision(config: Any, kv_cache_precision: str) -> None:
    """``ValueError`` (one line) when a model of ``config`` cannot keep its cache in ``kv_cache_precision``."""
    own = OWN_CACHES.get(config.model_type)
    if own is not None and kv_cache_precision != "same":
        raise ValueError(f"rollout.kv_cache_precision: {config.model_type} models keep their own cache ({own}), "
                         "which has no fp8 form: set it to 'same'")


def new_cache(config: Any, kv_cache_precision: str = "same") -> Any:
    """An empty transformers cache for a model of ``config``: ``DynamicCache`` (with fp8 keys and values for an fp8
    ``kv_cache_precision``), or the model's own class (``OWN_CACHES``; its keys and values in the compute dtype)."""
    check_cache_precision(config, kv_cache_precision)
    own = OWN_CACHES.get(config.model_type)
    if own is not None:
        module = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
        return getattr(module, own)()
    if kv_cache_precision != "same":
        return FP8DynamicCache(kv_cache_precision, config=config)
    return DynamicCache(config=config)


def repeat_rows(cache: Any, repeats: int) -> None:
    """``cache.batch_repeat_interleave(repeats)`` (each row ``repeats`` times in a row), also where transformers gives a
    layer no such method: the conv and recurrent states of linear attention (Qwen3.5, Qwen3-Next; transformers 5.24)."""
    _each_layer(cache, "batch_repeat_interleave", repeats, lambda state: state.repeat_interleave(repeats, dim=0))


def select_rows(cache: Any, indices: torch.Tensor) -> None:
    """``cache.batch_select_indices(indices)`` (keep those rows), linear attention's states too."""
    _each_layer(cache, "batch_select_indices", indices, lambda state: state[indices])


def _each_layer(cache: Any, method: str, argument: Any, on_state: Any) -> None:
    """``cache.method(argument)`` where the cache class has its own (minirl's ``StaticKVCache``, ``MiniMaxCache``);
    else each layer's, and ``on_state`` on the linear-attention states it left as they were (a ``LinearAttentionLayer``
    has no such method; a hybrid layer's, ``DynamicLayer``'s, moves only its keys and values)."""
    if not hasattr(cache, "layers") or getattr(type(cache), method) is not getattr(Cache, method):
        getattr(cache, method)(argument)
        return
    for layer in cache.layers:
        states = [getattr(layer, name) for name in ("conv_states", "recurrent_states") if hasattr(layer, name)]
        before = [dict(by_index) for by_index in states]
        if hasattr(layer, method):
            getattr(layer, method)(argument)
        for by_index, old in zip(states, before):
            for index, state in by_index.items():
                if state is not None and state is old[index]:  # not moved by the layer's own method
                    by_index[index] = on_state(state)


class FP8DynamicCache(DynamicCache):
    """``DynamicCache`` whose keys and values are rounded to fp8 ``fmt`` (per token and KV head) when written."""

    def __init__(self, fmt: str, *args: Any, **kwargs: Any) -> None:
        if fmt not in FP8_DTYPES:
            raise ValueError(f"unknown KV cache precision {fmt!r}; expected one of {KV_CACHE_PRECISIONS[1:]}")
        super().__init__(*args, **kwargs)
        self.fmt = fmt

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key_states = fake_quantize_kv(key_states, self.fmt)
        value_states = fake_quantize_kv(value_states, self.fmt)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)
