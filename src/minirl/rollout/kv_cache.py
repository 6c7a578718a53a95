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
