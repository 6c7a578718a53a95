"""An fp8 KV cache for ``NativeEngine`` (``rollout.kv_cache_precision``): a Hugging Face
``DynamicCache`` that rounds keys and values to fp8 as they are written.

Each key and value vector (one token, one KV head: ``head_dim`` values, post-RoPE and post-norm)
is rounded to ``fp8_e4m3`` or ``fp8_e5m2`` with its own dynamic fp32 scale ``amax / fp8 max``
(``minirl.rollout.precision.fake_quantize_kv``) and stored dequantised in the compute dtype. A
token's scale depends on that token's vector alone, so this is bitwise what an fp8 store with
per-token-head scales, dequantised on every read, gives attention; storing the rounded values
keeps every other cache operation (``batch_repeat_interleave``, ``batch_select_indices``, masks,
lengths) HF's own. Only ``update`` differs from ``DynamicCache``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from minirl.rollout.precision import FP8_DTYPES, KV_CACHE_PRECISIONS, fake_quantize_kv


def repeat_rows(cache: Any, repeats: int) -> None:
    """``cache.batch_repeat_interleave(repeats)`` (each row ``repeats`` times in a row), also where transformers gives a
    layer no such method: the conv and recurrent states of linear attention (Qwen3.5, Qwen3-Next; transformers 5.24)."""
    _each_layer(cache, "batch_repeat_interleave", repeats, lambda state: state.repeat_interleave(repeats, dim=0))


def select_rows(cache: Any, indices: torch.Tensor) -> None:
    """``cache.batch_select_indices(indices)`` (keep those rows), linear attention's states too."""
    _each_layer(cache, "batch_select_indices", indices, lambda state: state[indices])


def _each_layer(cache: Any, method: str, argument: Any, on_state: Any) -> None:
    if not hasattr(cache, "layers"):  # minirl's StaticKVCache: its own methods
        getattr(cache, method)(argument)
        return
    for layer in cache.layers:
        if hasattr(layer, method):
            getattr(layer, method)(argument)
            continue
        for index in range(layer.number_of_states):  # a LinearAttentionCacheLayerMixin
            if layer.is_conv_states_initialized[index]:
                layer.conv_states[index] = on_state(layer.conv_states[index])
            if layer.is_recurrent_states_initialized[index]:
                layer.recurrent_states[index] = on_state(layer.recurrent_states[index])


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
