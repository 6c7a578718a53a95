"""A probe, not part of the package: the trainer's forward (and, through autograd, its backward) for
Qwen3 / Qwen3-MoE without the transformers module stack, used by ``bench_update_bound.py`` to measure
what that stack costs in an update (issue 20, item 5). It measured 1.00x (BENCHMARKS.md, "The update
against its matmul bound"), so the trainer keeps the transformers forward.

For the trainer's call (right-padded rows, no attention mask, no cache) this runs the transformers
forward op for op, in the same order and on the model's own parameters: the RMSNorm casts, separate
q/k/v projections, q/k norms before the transpose, ``rotate_half`` RoPE from one cos/sin table per
call, SDPA called as ``sdpa_attention_forward`` calls it without a mask (``is_causal``, GQA in the
kernel), the router as a module call and the experts through transformers' own
``grouped_mm_experts_forward``. What it leaves out is the generic machinery around those ops: the
per-layer module dispatch, the attention-interface lookup, the mask and cache plumbing, the output
dataclasses, the kwargs checks. The logits, and the gradient of every parameter, are therefore
*bitwise* those of ``model(input_ids=..., use_cache=False)`` (``tests/unit/test_benchmark_scripts.py``
checks the log-probs, the loss and every gradient; the benchmark checks the log-probs each run).
Routing replay is not wired in (the probe runs without it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minirl.rollout.fast_decode import _rms_norm, _rotate_half, unsupported_reason


def lean_unsupported_reason(model: nn.Module, precision: str = "fp32", replay: Any | None = None) -> str | None:
    """Why ``LeanForward`` cannot stand in, bit for bit, for ``model``'s training forward (None: it can)."""
    reason = unsupported_reason(model)  # family, attention, RoPE, activation, module classes (LoRA: peft layers)
    if reason is not None:
        return reason
    if precision != "fp32":
        return f"trainer precision {precision!r} (autocast; the lean forward covers fp32)"
    layers: Any = getattr(model, "model", model).layers  # a transformers ModuleList (unsupported_reason checked)
    if any(getattr(layer, "gradient_checkpointing", False) for layer in layers):
        return "gradient checkpointing"
    if any(p.dtype != torch.float32 for p in model.parameters()):
        return "weights other than float32"
    if any(type(p.data) is not torch.Tensor for p in model.parameters()):  # FSDP2 shards parameters as DTensors
        return "distributed (sharded) parameters"
    if replay is not None and not hasattr(replay, "enter_forward"):
        return f"routing replay by {type(replay).__name__} (needs a RoutingReplay)"
    own = 1 if replay is not None else 0  # RoutingReplay's pre-hook on the model
    if len(model._forward_hooks) or len(model._forward_pre_hooks) != own:
        return "forward hooks on the model other than routing replay's"
    return None


class LeanForward:
    """``model(input_ids=ids, use_cache=False).logits`` for a Qwen3 / Qwen3-MoE model (checked by
    ``lean_unsupported_reason``), without the module stack. Reads the parameters at every call, so
    optimizer steps and weight loads are seen; ``replay`` the model's ``RoutingReplay`` (or None)."""

    def __init__(self, model: nn.Module, replay: Any | None = None) -> None:
        reason = lean_unsupported_reason(model, replay=replay)
        if reason is not None:
            raise ValueError(f"LeanForward does not support this model: {reason}")
        config: Any = model.config
        self.model: Any = model  # a transformers Qwen3 / Qwen3-MoE causal LM (checked above)
        self.replay = replay
        self.num_heads: int = config.num_attention_heads
        self.num_kv_heads: int = config.num_key_value_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.eps: float = config.rms_norm_eps
        self._tables: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (length, cos, sin)

    def _rope(self, length: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, 1, length, D] at positions 0..length-1, as ``Qwen3RotaryEmbedding`` computes them
        (an outer product; its K = 1 matmul is the same products). Cached while the weights' buffer is."""
        if self._tables is None or self._tables[0] < length or self._tables[1].dtype != dtype:
            inv_freq = self.model.model.rotary_emb.inv_freq
            freqs = torch.arange(max(length, 64), device=device).float()[:, None] * inv_freq.float()[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            self._tables = (emb.shape[0], emb.cos().to(dtype), emb.sin().to(dtype))
        _, cos, sin = self._tables
        return cos[None, None, :length], sin[None, None, :length]

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, S, V] of right-padded (or unpadded) rows ``input_ids`` [B, S]: causal attention,
        positions 0..S-1, no mask (``Trainer._logits``'s call)."""
        if self.replay is not None:
            self.replay.enter_forward(input_ids)  # the model pre-hook's part: layout, one forward per block
        base = self.model.model
        length = input_ids.shape[1]
        hidden = base.embed_tokens(input_ids)  # [b, s, hidden]
        cos, sin = self._rope(length, hidden.dtype, hidden.device)
        for layer in base.layers:
            residual = hidden
            x = _rms_norm(hidden, layer.input_layernorm.weight, self.eps)
            hidden = residual + self._attention(x, layer.self_attn, cos, sin)
            residual = hidden
            x = _rms_norm(hidden, layer.post_attention_layernorm.weight, self.eps)
            hidden = residual + self._mlp(x, layer.mlp)
        hidden = _rms_norm(hidden, base.norm.weight, self.eps)
        return self.model.lm_head(hidden)

    def _attention(self, x: torch.Tensor, attn: Any, cos: torch.Tensor | None = None,
                   sin: torch.Tensor | None = None) -> torch.Tensor:
        """``Qwen3MoeAttention.forward`` with ``sdpa_attention_forward`` and no mask; x [b, s, hidden]."""
        rows, length = x.shape[:2]
        if cos is None or sin is None:
            cos, sin = self._rope(length, x.dtype, x.device)
        shape = (rows, length, -1, self.head_dim)
        q = _rms_norm(attn.q_proj(x).view(shape), attn.q_norm.weight, self.eps).transpose(1, 2)
        k = _rms_norm(attn.k_proj(x).view(shape), attn.k_norm.weight, self.eps).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        gqa = {"enable_gqa": True} if self.num_heads != self.num_kv_heads else {}
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=self.scaling,
                                             is_causal=length > 1, **gqa)
        out = out.reshape(rows, -1, length, self.head_dim).transpose(1, 2).contiguous()
        return attn.o_proj(out.reshape(rows, length, -1).contiguous())

    def _mlp(self, x: torch.Tensor, mlp: Any) -> torch.Tensor:
        """``Qwen3MoeSparseMoeBlock.forward`` (router as a module call: replay's hooks run) or ``Qwen3MLP``."""
        experts = getattr(mlp, "experts", None)
        if experts is None:
            return mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        from transformers.integrations.moe import grouped_mm_experts_forward

        rows, length, hidden_dim = x.shape
        flat = x.view(-1, hidden_dim)
        _, weights, selected = mlp.gate(flat)
        out = grouped_mm_experts_forward(experts, flat, selected, weights)
        return out.reshape(rows, length, hidden_dim)
