"""A lean decode step for Qwen3, Qwen3-MoE, OLMoE, Mixtral, Qwen2-MoE, GLM-4-MoE, DeepSeek-V3 and V2, GLM-4-MoE-Lite,
dots.llm1, MiniMax-M2, GPT-OSS, Qwen3.5 (dense and MoE), Qwen3-Next, ERNIE-4.5-MoE, Granite-MoE and Hunyuan-MoE,
with a pre-allocated KV cache (``NativeEngine``).

On CPU, one decode step of a small model through the transformers forward is bound by per-operator
dispatch, not arithmetic: ~2,000 aten operators per step for the 4-layer demo model, most of them
mask building, cache bookkeeping, views and hook plumbing (``benchmarks/profile_decode.py``). This
module runs the same step with only the operators that compute something:

- the keys and values live in one pre-allocated tensor per layer, ``[rows, kv heads, prompt width +
  max new tokens, head dim]``; a decode step writes one column, the same for every row (prompts are
  left-padded, so completion token ``step`` sits at column ``width + step`` in every row);
- the rotary tables are computed once for every position, then gathered per row;
- q, k and v come from one matmul over the concatenated projection weights.

Everything else is the transformers forward op for op (the RMSNorm casts, ``rotate_half``, the
routing softmax in fp32, the ``grouped_mm`` experts path with its sort and per-token sum, SDPA
called the way ``sdpa_attention_forward`` calls it), so the logits and the routes are *bitwise*
those of the model's own forward: ``tests/unit/test_fast_decode.py`` checks this for every family
(``FAMILIES``), with and without padding, in fp32, bf16, fp8 and fp4, with an fp8 KV cache. The families differ
in their q/k norms (``QK_NORM``), routers (``ROUTER_KINDS``: softmax top-k, Mixtral's fp32 weights, DeepSeek-V3's
group-limited sigmoid router, DeepSeek-V2's group-limited softmax, MiniMax-M2's biased sigmoid, ...), shared experts,
partial RoPE (GLM) and DeepSeek-V3's multi-head latent
attention (``_Latent``: the cache keeps each token's latent and rotated key part, expanded every step as
transformers does). GPT-OSS runs its own eager attention (``_sink_attention``: a learned sink logit per head, and a
sliding window on every other layer, which attends to the same last ``sliding_window`` columns transformers' sliding
cache keeps), its biased router (softmax over the top-k logits) and its biased experts (transposed, interleaved
gate/up, a clamped SwiGLU), with its norms scaled in fp32. Qwen3.5's Gated DeltaNet layers (``_DeltaNet``) run
transformers' reference causal-conv update and recurrent gated delta rule on each row's conv and recurrent states (kept
in the cache's slots of the layer, updated in place), its full-attention layers gate each head's output, and its norms
are zero-centred; its prompts prefill with the transformers forward (chunked delta rule). Qwen3-Next is the same
but for its fused projections (``_unfused``). ERNIE-4.5-MoE rotates interleaved pairs in fp32 from fp32 tables
and routes by an fp32 softmax with a correction bias. Granite-MoE scales its embeddings, residual branches and
logits (``embedding_multiplier``, ``residual_multiplier``, ``logits_scaling``). Hunyuan-MoE normalises q and k once
rotated, with its NTK-alpha RoPE (a fixed base). A model this module cannot reproduce exactly (another family,
another attention or experts implementation, a RoPE other than the default or yarn, sliding windows outside GPT-OSS, a
module replaced by another class) keeps the transformers forward (``unsupported_reason``).

The prefill stays on the transformers forward (one call per rollout); its cache is copied in.

bf16 / fp16 matrix products (``half_gemm``). torch's CPU kernels for a bf16 or fp16 matmul are ~10x
slower than fp32 ones on CPUs without native bf16 instructions (AVX2, AVX-512 without BF16/AMX):
``F.linear`` of a 64-row bf16 batch by a 128 x 256 weight took ~1.2 ms here, the fp32 one ~0.1 ms.
With ``half_gemm="fp32"`` every matrix product of the decode step (q/k/v, o, router, experts,
dense MLP, lm_head) multiplies the *same* bf16/fp16 values in an fp32 GEMM (fp32 copies of the
weights, made once per ``refresh``) and rounds the result back once: each product of two bf16 (or
fp16) numbers is exact in fp32 and both kernels accumulate in fp32, so the result is that of a
half-precision GEMM with fp32 accumulation, as GPUs run them; only the summation order differs from
torch's CPU kernel, which moves ~1 in 10^4 outputs by one unit in the last place
(``tests/unit/test_fast_decode.py``). Everything between the matmuls (norms, RoPE, attention,
activations, the residual stream) stays in the half dtype. ``"native"`` (the default of this class)
keeps torch's kernels and the bitwise match with the transformers forward; ``NativeEngine`` picks
``"fp32"`` on such CPUs (``half_gemm="auto"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast, overload

import torch
import torch.nn.functional as F
from torch import nn

from minirl.rollout.precision import fake_quantize_kv

FAMILIES = ("qwen3", "qwen3_moe", "olmoe", "mixtral", "qwen2_moe", "glm4_moe", "deepseek_v3", "glm4_moe_lite", "dots1",
            "deepseek_v2", "minimax_m2", "gpt_oss", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "ernie4_5_moe",
            "granitemoe", "hunyuan_v1_moe")
# Gated DeltaNet (linear attention) layers beside gated full attention (Qwen3.5, dense and MoE, and Qwen3-Next, whose
# projections are fused per key head; ``_DeltaNet``)
HYBRID_FAMILIES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
# multi-head latent attention (GLM-4-MoE-Lite is DeepSeek-V3's code; DeepSeek-V2 rotates with complex numbers)
LATENT_FAMILIES = ("deepseek_v3", "glm4_moe_lite", "deepseek_v2")
# where a family normalises queries and keys: per head after the split (Qwen3; GLM-4-MoE with use_qk_norm), over the
# whole projection before it (OLMoE), per head after the rotary (Hunyuan), or not at all
QK_NORM = {"qwen3": "head", "qwen3_moe": "head", "olmoe": "full", "mixtral": None, "qwen2_moe": None, "glm4_moe": "head",
           "deepseek_v3": None, "glm4_moe_lite": None, "dots1": "head", "deepseek_v2": None, "minimax_m2": "full",
           "gpt_oss": None, "qwen3_5_text": "head", "qwen3_5_moe_text": "head", "qwen3_next": "head", "ernie4_5_moe": None,
           "granitemoe": None, "hunyuan_v1_moe": "after_rope"}
# how a family's RMSNorms scale: ``weight * x.to(dtype)`` (most), ``(weight * x).to(dtype)`` in fp32 (GPT-OSS's
# "fp32_scale"), or ``x * (1 + weight)`` in fp32, a zero-centred weight (Qwen3.5's "offset")
NORM_KIND = {"gpt_oss": "fp32_scale", "qwen3_5_text": "offset", "qwen3_5_moe_text": "offset", "qwen3_next": "offset"}
# the attention implementation a family's forward must use to be reproduced: SDPA, except GPT-OSS (no SDPA: its sinks)
ATTENTION = {"gpt_oss": "eager"}
ROPE_TYPES = ("default", "yarn")  # tables fixed at load (yarn's scaled frequencies and attention factor)


def qk_norm_kind(config: Any) -> str | None:
    """``QK_NORM`` of the config's family (GLM-4-MoE's only with ``use_qk_norm``)."""
    if config.model_type == "glm4_moe" and not getattr(config, "use_qk_norm", False):
        return None
    return QK_NORM[config.model_type]
HALF_GEMM = ("native", "fp32")


def native_half_gemm(device: torch.device | str = "cpu") -> bool:
    """Whether torch has fast bf16 matmul kernels here: any GPU, or a CPU with AVX512-BF16 or AMX."""
    if torch.device(device).type != "cpu":
        return True
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``FastDecoder`` cannot reproduce ``model``'s forward bit for bit (None: it can)."""
    config: Any = model.config  # a transformers PretrainedConfig (its fields are per model type)
    if config.model_type not in FAMILIES:
        return f"model type {config.model_type!r} (the fast path covers {', '.join(FAMILIES)})"
    attention = ATTENTION.get(config.model_type, "sdpa")
    if getattr(config, "_attn_implementation", None) != attention:
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r} (needs {attention!r})"
    rope = getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if config.model_type == "hunyuan_v1_moe" and rope_type == "dynamic" and rope.get("alpha"):
        rope_type = "default"  # Hunyuan's NTK-alpha: a fixed base (transformers' "ntk_alpha"), its tables read as they are
    if rope_type not in ROPE_TYPES:
        return f"RoPE type {rope.get('rope_type')!r} (needs one of {', '.join(ROPE_TYPES)})"
    window = getattr(config, "sliding_window", None) is not None
    sliding = window and (config.model_type == "mixtral" or getattr(config, "use_sliding_window", False))
    layer_kinds = set(getattr(config, "layer_types", None) or [])
    if config.model_type == "gpt_oss":  # its sliding layers are reproduced (``_window``)
        layer_kinds -= {"sliding_attention"}
    if config.model_type in HYBRID_FAMILIES:  # and Qwen3.5's linear-attention ones (``_DeltaNet``)
        layer_kinds -= {"linear_attention"}
    if sliding or layer_kinds - {"full_attention"}:
        return "sliding-window attention"
    if getattr(config, "clip_qkv", None) is not None:
        return "clipped q/k/v (clip_qkv)"
    if config.model_type in LATENT_FAMILIES and config.num_key_value_heads != config.num_attention_heads:
        return "latent attention with fewer key/value heads than query heads"
    if config.hidden_act != "silu":
        return f"activation {config.hidden_act!r} (needs 'silu')"
    return _structure_reason(model)


# The modules the fast path reimplements, by class name: any other class (a subclass, an adapter
# such as a LoRA layer) keeps the model's own forward. Linear layers may have biases.
_EXPECTED = {
    "model": ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
              "Glm4MoeForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeLiteForCausalLM", "Dots1ForCausalLM",
              "DeepseekV2ForCausalLM", "MiniMaxM2ForCausalLM", "GptOssForCausalLM", "Qwen3_5ForCausalLM",
              "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM", "Ernie4_5_MoeForCausalLM", "GraniteMoeForCausalLM",
              "HunYuanMoEV1ForCausalLM"),
    "norm": ("Qwen3RMSNorm", "Qwen3MoeRMSNorm", "OlmoeRMSNorm", "MixtralRMSNorm", "Qwen2MoeRMSNorm", "Glm4MoeRMSNorm",
             "DeepseekV3RMSNorm", "Glm4MoeLiteRMSNorm", "Dots1RMSNorm", "DeepseekV2RMSNorm", "MiniMaxM2RMSNorm",
             "GptOssRMSNorm", "Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm", "Qwen3NextRMSNorm", "Ernie4_5_MoeRMSNorm",
             "GraniteMoeRMSNorm", "HunYuanMoEV1RMSNorm"),
    "attention": ("Qwen3Attention", "Qwen3MoeAttention", "OlmoeAttention", "MixtralAttention", "Qwen2MoeAttention",
                  "Glm4MoeAttention", "Dots1Attention", "MiniMaxM2Attention", "GptOssAttention", "Qwen3_5Attention",
                  "Qwen3_5MoeAttention", "Qwen3NextAttention", "Ernie4_5_MoeAttention",
                  "GraniteMoeAttention", "HunYuanMoEV1Attention"),
    "linear_attention": ("Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet", "Qwen3NextGatedDeltaNet"),
    "gated_norm": ("Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated", "Qwen3NextRMSNormGated"),
    "latent_attention": ("DeepseekV3Attention", "Glm4MoeLiteAttention", "DeepseekV2Attention"),  # (MLA)
    "mlp": ("Qwen3MLP", "Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock", "OlmoeSparseMoeBlock", "MixtralSparseMoeBlock",
            "Qwen2MoeSparseMoeBlock", "Qwen2MoeMLP", "Glm4MoeMoE", "Glm4MoeMLP", "DeepseekV3MoE", "DeepseekV3MLP",
            "Glm4MoeLiteMoE", "Glm4MoeLiteMLP", "Dots1MoE", "Dots1MLP", "DeepseekV2Moe", "DeepseekV2MLP",
            "MiniMaxM2SparseMoeBlock", "GptOssMLP", "Qwen3_5MLP", "Qwen3_5MoeSparseMoeBlock", "Qwen3NextMLP",
            "Qwen3NextSparseMoeBlock", "Ernie4_5_MoeMLP", "Ernie4_5_MoeSparseMoeBlock",
            "GraniteMoeMoE", "HunYuanMoEV1Moe"),
    "router": (),  # ROUTER_KINDS' keys (below)
    "experts": ("Qwen3MoeExperts", "OlmoeExperts", "MixtralExperts", "Qwen2MoeExperts", "Glm4MoeExperts",
                "DeepseekV3Experts", "Glm4MoeLiteExperts", "Dots1Experts", "DeepseekV2Experts", "MiniMaxM2Experts",
                "GptOssExperts", "Qwen3_5MoeExperts", "Qwen3NextExperts", "Ernie4_5_MoeExperts",
                "GraniteMoeExperts", "HunYuanMoEV1Experts"),
    "shared": ("Qwen2MoeMLP", "Glm4MoeMLP", "DeepseekV3MLP", "Glm4MoeLiteMLP", "Dots1MLP", "DeepseekV2MLP",
               "Qwen3_5MoeMLP", "Qwen3NextMLP", "Ernie4_5_MoeMLP", "HunYuanMoEV1MLP"),  # shared
}
# each router the fast path reproduces and its rule (``_Router.kind``, run by ``ROUTES``): ``softmax`` = Qwen3-MoE's
# top-k of an fp32 softmax; ``group_sigmoid`` = DeepSeek-V3's noaux_tc (bias-corrected, group-limited sigmoid);
# ``group_softmax`` = DeepSeek-V2's greedy or group-limited softmax; ``biased_sigmoid`` = MiniMax-M2's;
# ``biased_softmax`` = ERNIE-4.5's; ``logit_top_k`` = Granite-MoE's softmax over the top-k fp32 logits;
# ``top_k_softmax`` = GPT-OSS's softmax over the top-k biased logits, in the model's dtype
ROUTER_KINDS = {
    **dict.fromkeys(("Qwen3MoeTopKRouter", "OlmoeTopKRouter", "MixtralTopKRouter", "Qwen2MoeTopKRouter",
                     "Qwen3_5MoeTopKRouter", "Qwen3NextTopKRouter", "HunYuanMoEV1Gate"), "softmax"),
    **dict.fromkeys(("Glm4MoeTopkRouter", "DeepseekV3TopkRouter", "Glm4MoeLiteTopkRouter", "Dots1TopkRouter"),
                    "group_sigmoid"),
    "DeepseekV2TopkRouter": "group_softmax", "MiniMaxM2TopKRouter": "biased_sigmoid",
    "Ernie4_5_MoeTopKRouter": "biased_softmax", "GraniteMoeTopKRouter": "logit_top_k", "GptOssTopKRouter": "top_k_softmax",
}
_EXPECTED["router"] = tuple(ROUTER_KINDS)
FP32_ROUTERS = ("group_sigmoid", "group_softmax", "biased_softmax")  # routed in fp32 whatever the model's dtype
RENORMALISING = ("MixtralTopKRouter", "Qwen3_5MoeTopKRouter", "HunYuanMoEV1Gate")  # always renormalise their top-k
DELTANET_LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
FUSED_DELTANET_LINEARS = ("in_proj_qkvz", "in_proj_ba", "out_proj")  # Qwen3-Next's
DENSE_MLP = ("gate_proj", "up_proj", "down_proj")
# experts whose layout differs from the others' ([E, 2 I, hidden], gate then up, no biases): (transposed, concatenated,
# biased) as transformers declares them; GPT-OSS's are [E, hidden, 2 I], gate and up interleaved, with biases
EXPERT_LAYOUTS = {"GptOssExperts": (True, False, True)}


def mlp_of(layer: Any) -> Any:
    """A decoder layer's MLP or MoE block (``mlp``; Granite-MoE's ``block_sparse_moe``)."""
    return layer.block_sparse_moe if hasattr(layer, "block_sparse_moe") else layer.mlp


def router_of(mlp: Any) -> Any:
    """An MoE block's router (``gate``; GPT-OSS's ``router``)."""
    return mlp.router if hasattr(mlp, "router") else mlp.gate


def router_weight(router: Any) -> torch.Tensor:
    """A router's weight [experts, hidden] (Hunyuan's in its ``wg`` linear)."""
    return router.wg.weight if hasattr(router, "wg") else router.weight


def shared_of(mlp: Any) -> Any:
    """An MoE block's shared expert(s), or None (``shared_expert``, ``shared_experts``; Hunyuan's ``shared_mlp``)."""
    for name in ("shared_expert", "shared_experts", "shared_mlp"):
        if getattr(mlp, name, None) is not None:
            return getattr(mlp, name)
    return None


def _structure_reason(hf_model: nn.Module) -> str | None:
    """Why the modules of a model of ``FAMILIES`` are not the stock ones (None: they are)."""
    model: Any = hf_model  # torch types submodule attributes as Tensor | Module; these are transformers' modules

    def unexpected(module: nn.Module, kind: str) -> str | None:
        name = type(module).__name__
        return None if name in _EXPECTED[kind] else f"a {name} where the fast path expects {' or '.join(_EXPECTED[kind])}"

    def plain_linear(module: nn.Module, name: str) -> str | None:
        return None if type(module) is nn.Linear else f"{name} is a {type(module).__name__}, not an nn.Linear"

    eps = model.config.rms_norm_eps
    checks = [unexpected(model, "model"), unexpected(model.model.norm, "norm"), plain_linear(model.lm_head, "lm_head")]
    for index, layer in enumerate(model.model.layers):
        attn, mlp = getattr(layer, "self_attn", None), mlp_of(layer)
        checks.append(unexpected(mlp, "mlp"))
        latent = model.config.model_type in LATENT_FAMILIES
        if attn is None:  # Qwen3.5's Gated DeltaNet
            checks += _deltanet_reasons(layer, index, eps, unexpected, plain_linear)
        else:
            checks.append(unexpected(attn, "latent_attention" if latent else "attention"))
        qk_norms = (_qk_norm_module(attn, "q"), _qk_norm_module(attn, "k")) if attn is not None and qk_norm_kind(model.config) else ()
        norms = (layer.input_layernorm, layer.post_attention_layernorm, *qk_norms, model.model.norm)
        checks += [unexpected(norm, "norm") for norm in norms]
        if any(getattr(norm, "variance_epsilon", eps) != eps for norm in norms):
            checks.append(f"layer {index} has a norm epsilon other than rms_norm_eps")
        if attn is None:
            names = []
        elif latent:  # its own projections and norms (whose epsilons are their own)
            names = ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
            names += ["q_proj"] if attn.q_lora_rank is None else ["q_a_proj", "q_b_proj"]
            latent_norms = [attn.kv_a_layernorm] + ([attn.q_a_layernorm] if attn.q_lora_rank is not None else [])
            checks += [unexpected(norm, "norm") for norm in latent_norms]
        else:
            names = ["q_proj", "k_proj", "v_proj", "o_proj"]
        checks += [plain_linear(getattr(attn, name), f"layer {index} {name}") for name in names]
        experts = getattr(mlp, "experts", None)
        if experts is None:
            checks += [plain_linear(getattr(mlp, name), f"layer {index} {name}") for name in DENSE_MLP]
            continue
        checks += _moe_reasons(mlp, index, unexpected, plain_linear)
    return next((reason for reason in checks if reason is not None), None)


def _moe_reasons(mlp: Any, index: int, unexpected: Any, plain_linear: Any) -> list[str | None]:
    """Why an MoE block is not a stock one the fast path reproduces (Nones where it is)."""
    router, experts = router_of(mlp), mlp.experts
    checks = [unexpected(router, "router"), unexpected(experts, "experts")]
    shared = shared_of(mlp)
    if shared is not None:  # a dense expert every token takes (Qwen2-MoE's weighed by a sigmoid gate)
        checks += [unexpected(shared, "shared")]
        checks += [plain_linear(getattr(shared, name), f"layer {index} shared_expert.{name}") for name in DENSE_MLP]
    if hasattr(mlp, "shared_expert_gate"):
        checks.append(plain_linear(mlp.shared_expert_gate, f"layer {index} shared_expert_gate"))
    group_limited = ROUTER_KINDS.get(type(router).__name__) == "group_sigmoid"
    if group_limited and router.num_experts % router.num_group:
        checks.append(f"layer {index}: {router.num_experts} experts in {router.num_group} groups")
    implementation = getattr(experts.config, "_experts_implementation", None)
    if implementation != "grouped_mm":
        checks.append(f"experts implementation {implementation!r} (needs 'grouped_mm')")
    if getattr(experts, "_is_expert_parallel", False):
        checks.append("expert parallelism")
    layout = (getattr(experts, "is_transposed", False), getattr(experts, "is_concatenated", True),
              getattr(experts, "has_bias", False))
    if layout != EXPERT_LAYOUTS.get(type(experts).__name__, (False, True, False)):
        checks.append(f"an expert weight layout (transposed, concatenated, biased) of {layout}")
    return checks


def _qk_norm_module(attn: Any, which: str) -> Any:
    """An attention's query or key norm (``q_norm`` / ``k_norm``; Hunyuan's ``query_layernorm`` / ``key_layernorm``)."""
    return getattr(attn, f"{which}_norm", None) or getattr(attn, {"q": "query_layernorm", "k": "key_layernorm"}[which])


def _deltanet_reasons(layer: Any, index: int, eps: float, unexpected: Any, plain_linear: Any) -> list[str | None]:
    """Why a linear-attention layer is not the stock Gated DeltaNet (Nones where it is)."""
    net = layer.linear_attn
    checks = [unexpected(net, "linear_attention"), unexpected(net.norm, "gated_norm")]
    names = FUSED_DELTANET_LINEARS if hasattr(net, "in_proj_qkvz") else DELTANET_LINEARS
    checks += [plain_linear(getattr(net, name), f"layer {index} {name}") for name in names]
    if type(net.conv1d) is not nn.Conv1d:
        checks.append(f"layer {index} conv1d is a {type(net.conv1d).__name__}, not an nn.Conv1d")
    if net.norm.variance_epsilon != eps or net.activation != "silu":
        checks.append(f"layer {index}: a gated norm epsilon other than rms_norm_eps, or a conv activation other than silu")
    return checks


Linear = tuple[torch.Tensor, torch.Tensor | None]  # (weight, bias)


@dataclass
class _DeltaNet:
    """``Qwen3_5GatedDeltaNet``'s weights for one decode step: the cache holds each row's conv state ([b, conv
    channels, kernel]) in the layer's ``keys`` and its recurrent state ([b, value heads, key dim, value dim], fp32) in
    its ``values``."""

    # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a: four products, as transformers runs them (slices of one product
    # are strided, and torch's CPU softplus and silu round some elements of a narrow strided slice otherwise); Qwen3-Next's
    # in_proj_qkvz and in_proj_ba (``fused``), each key head's q, k, v, z (b, a) side by side
    in_proj: tuple[torch.Tensor, ...]
    conv_weight: torch.Tensor  # [channels, 1, kernel]
    conv_bias: torch.Tensor | None
    a_log: torch.Tensor  # [value heads]
    dt_bias: torch.Tensor
    norm: torch.Tensor  # the gated RMSNorm's weight [value dim]
    key_heads: int
    value_heads: int
    key_dim: int  # per head
    value_dim: int
    fused: bool = False


@dataclass
class _Latent:
    """``DeepseekV3Attention``'s weights (multi-head latent attention): the cache holds each token's normalised latent
    (``keys``, [b, 1, L, rank]) and its rotated key part (``values``, [b, 1, L, rope]), expanded at every step as
    transformers does."""

    q: Linear | None  # q_proj, without a query LoRA
    q_a: Linear | None  # q_a_proj, q_a_layernorm (weight, epsilon), q_b_proj: with one
    q_a_norm: tuple[torch.Tensor, float] | None
    q_b: torch.Tensor | None
    kv_a: Linear  # kv_a_proj_with_mqa
    kv_a_norm: tuple[torch.Tensor, float]
    kv_b: torch.Tensor
    nope: int
    rope: int
    rank: int
    v_dim: int
    rotary: str  # how its rope dimensions pair: "interleaved" (DeepSeek-V3's), "half" (rotate_half), "complex" (V2's)


@dataclass
class _Router:
    """An MoE layer's router as the decode step runs it: its rule (``ROUTER_KINDS``) and that rule's parameters."""

    kind: str
    weight: torch.Tensor  # [experts, hidden]: the GEMM's copy, or the module's own for ``FP32_ROUTERS``
    top_k: int
    renormalise: bool = False  # softmax, group_sigmoid: the top-k weights divided by their sum
    cast_weights: bool = True  # softmax: the weights cast to the logits' dtype (Mixtral's stay fp32)
    bias: torch.Tensor | None = None  # the correction bias (group_sigmoid, biased_*), or the linear's (top_k_softmax)
    groups: int = 1  # group_*: expert groups, groups kept, the weights' scale (routed_scaling_factor)
    kept: int = 1
    scale: float = 1.0
    method: str = "greedy"  # group_softmax: DeepSeek-V2's topk_method
    norm_min: float = 0.0  # biased_softmax: the floor of the renormalising sum


@dataclass
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: torch.Tensor | None  # [q + k + v out, hidden]: the three projections, concatenated (None: latent attention)
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # None: the family normalises neither (``QK_NORM``)
    k_norm: torch.Tensor | None
    # MoE block (router + experts) or dense MLP, whichever the layer has
    router: _Router | None = None
    gate_up: torch.Tensor | None = None  # [E, 2 I, hidden]
    down: torch.Tensor | None = None  # [E, hidden, I]
    dense: tuple[Linear, ...] | None = None  # (weight, bias) of a dense MLP's gate, up, down
    deltanet: _DeltaNet | None = None  # Qwen3.5's linear attention in place of qkv (``o``: its out_proj)
    gated_attention: bool = False  # Qwen3.5's full attention: q_proj gives each head's query and an output gate
    latent: _Latent | None = None  # DeepSeek-V3's attention in place of qkv
    shared: tuple[Linear, ...] | None = None  # the shared expert(s), as ``dense``
    shared_gate: torch.Tensor | None = None  # its sigmoid gate [1, hidden] (GLM-4-MoE's shared experts have none)
    # GPT-OSS: a sliding window (columns), a sink logit per head, biased experts and their clamped SwiGLU (alpha, limit)
    window: int | None = None
    sinks: torch.Tensor | None = None
    gate_up_bias: torch.Tensor | None = None  # [E, 2 I], in the model's dtype (added after the GEMM is rounded)
    down_bias: torch.Tensor | None = None
    clamped_swiglu: tuple[float, float] | None = None


class StaticKVCache:
    """Keys and values of every layer in pre-allocated tensors ``[rows, kv heads, length, head dim]``.

    ``batch_select_indices`` (rows leaving the batch) and ``batch_repeat_interleave`` (G samples per
    prompt) have the names and meanings of the transformers cache methods, so ``NativeEngine`` treats
    both caches alike.
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.keys, self.values = keys, values

    @classmethod
    def from_transformers(cls, cache, length: int, width: int | None = None) -> StaticKVCache:
        """Copy a filled transformers cache (``layers[i].keys/values [B, H, W, D]``; values may have a D of their own,
        latent attention's) of ``width`` columns (None: its widest layer's) into ``length`` columns. A sliding layer
        keeps only its last columns: they go where they were."""
        width = max(layer.keys.shape[2] for layer in cache.layers if hasattr(layer, "keys")) if width is None else width
        keys, values = [], []
        for layer in cache.layers:
            if not hasattr(layer, "keys"):  # a linear-attention layer (Qwen3.5): its conv and recurrent states
                keys.append(layer.conv_states[0].clone())
                values.append(layer.recurrent_states[0].clone())
                continue
            rows, heads, kept, dim = layer.keys.shape
            k = layer.keys.new_zeros(rows, heads, length, dim)
            v = layer.values.new_zeros(*layer.values.shape[:2], length, layer.values.shape[3])
            k[:, :, width - kept: width] = layer.keys
            v[:, :, width - kept: width] = layer.values
            keys.append(k)
            values.append(v)
        return cls(keys, values)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.keys = [k[indices] for k in self.keys]
        self.values = [v[indices] for v in self.values]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.keys = [k.repeat_interleave(repeats, dim=0) for k in self.keys]
        self.values = [v.repeat_interleave(repeats, dim=0) for v in self.values]


class FastDecoder:
    """One decode step (one new token per row) of a model of ``FAMILIES``, bitwise its forward.

    Holds references to the model's parameters (so in-place weight loads are seen), except the
    concatenated q/k/v weights: call ``refresh`` after the weights change.
    """

    def __init__(self, model: nn.Module, kv_cache_format: str | None = None, half_gemm: str = "native",
                 grouped_mm: bool | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FastDecoder does not support this model: {reason}")
        if half_gemm not in HALF_GEMM:
            raise ValueError(f"half_gemm must be one of {HALF_GEMM} (got {half_gemm!r})")
        config: Any = model.config
        self.model: Any = model  # a transformers causal LM of FAMILIES (checked above)
        self.qk_norm = qk_norm_kind(config)
        self.complex_rope = config.model_type == "deepseek_v2"  # its rotary table is complex (freqs_cis)
        self.gpt_oss = config.model_type == "gpt_oss"  # eager attention with sinks, rotary halves
        self.ernie = config.model_type == "ernie4_5_moe"  # interleaved rotary pairs in fp32 (fp32 tables)
        # Granite-MoE's scales: of the embeddings, of each residual branch, and the logits' divisor (1: none)
        self.embedding_multiplier = float(getattr(config, "embedding_multiplier", 1.0))
        self.residual_multiplier = float(getattr(config, "residual_multiplier", 1.0))
        self.logits_scaling = float(getattr(config, "logits_scaling", 1.0))
        self.norm_kind = NORM_KIND.get(config.model_type, "plain")
        self.hybrid = config.model_type in HYBRID_FAMILIES  # linear-attention layers: decode steps only (no prefill)
        self.kv_cache_format = kv_cache_format  # None, or an fp8 format keys/values are rounded to
        # fp32 GEMMs on the half-precision values (module docstring); only for a bf16 / fp16 model
        head: torch.Tensor = cast(Any, model).lm_head.weight
        self.fp32_gemm = half_gemm == "fp32" and head.dtype in (torch.bfloat16, torch.float16)
        self.num_heads: int = config.num_attention_heads
        self.num_kv_heads: int = config.num_key_value_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        attention = next(layer.self_attn for layer in cast(Any, model).model.layers if hasattr(layer, "self_attn"))
        self.scaling = attention.scaling  # head_dim ** -0.5, or DeepSeek's (yarn)
        self.eps: float = config.rms_norm_eps
        self.num_layers: int = config.num_hidden_layers
        # MoE experts as one grouped GEMM with offsets computed on the device (no host sync): by default
        # on CUDA with bf16 experts (the dtype torch's CUDA grouped GEMM kernel takes; others fall back
        # to a host loop); elsewhere one mm per chosen expert (bitwise CPU grouped_mm, fewer ops)
        on_cuda_bf16 = head.device.type == "cuda" and head.dtype == torch.bfloat16
        self.grouped_mm = (on_cuda_bf16 and not self.fp32_gemm) if grouped_mm is None else grouped_mm
        self._rope_rows = 0
        self._rope_dtype: torch.dtype | None = None
        self._cos: torch.Tensor  # the rotary tables (``_rope_table``; DeepSeek-V2's one complex table in both)
        self._sin: torch.Tensor
        self.embed: torch.Tensor
        self.final_norm: torch.Tensor
        self.lm_head: torch.Tensor
        self.lm_head_bias: torch.Tensor | None
        self.inv_freq: torch.Tensor
        self.layers: list[_Layer]
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Re-read the weights (the q/k/v concatenation is a copy)."""
        base = self.model.model
        gemm = self._gemm_weight
        self.embed = base.embed_tokens.weight
        self.final_norm = base.norm.weight
        self.lm_head, self.lm_head_bias = gemm(self.model.lm_head.weight), gemm(self.model.lm_head.bias)
        self.inv_freq = base.rotary_emb.inv_freq
        self.rope_scale = float(getattr(base.rotary_emb, "attention_scaling", 1.0))  # yarn's; 1 for the default
        self.layers = []
        for layer in base.layers[: self.num_layers]:
            attn, mlp = getattr(layer, "self_attn", None), mlp_of(layer)
            if attn is None:  # Qwen3.5's Gated DeltaNet
                spec = self._deltanet_layer(layer)
                self._add_mlp(spec, mlp)
                self.layers.append(spec)
                continue
            latent = hasattr(attn, "kv_b_proj")  # DeepSeek-V3's multi-head latent attention
            spec = _Layer(
                gated_attention=self.hybrid,  # Qwen3.5's full attention: q_proj gives queries and output gates
                window=getattr(attn, "sliding_window", None),
                sinks=getattr(attn, "sinks", None),
                input_norm=layer.input_layernorm.weight,
                post_norm=layer.post_attention_layernorm.weight,
                qkv=None if latent else gemm(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])),
                qkv_bias=None if latent else gemm(_cat_biases(attn.q_proj, attn.k_proj, attn.v_proj)),
                o=gemm(attn.o_proj.weight),
                o_bias=gemm(attn.o_proj.bias),
                q_norm=_qk_norm_module(attn, "q").weight if self.qk_norm else None,
                k_norm=_qk_norm_module(attn, "k").weight if self.qk_norm else None,
                latent=self._latent(attn) if latent else None,
            )
            self._add_mlp(spec, mlp)
            self.layers.append(spec)
        self._rope_rows = 0  # rebuilt on demand

    def _add_mlp(self, spec: _Layer, mlp: Any) -> None:
        """A layer's MoE block (router, experts, shared expert) or dense MLP, as the decode step takes them."""
        gemm = self._gemm_weight
        if hasattr(mlp, "experts"):
            spec.router = self._router(mlp)
            experts = mlp.experts
            spec.gate_up, spec.down = gemm(experts.gate_up_proj), gemm(experts.down_proj)
            if type(experts).__name__ == "GptOssExperts":  # [E, hidden, out] weights, read as [E, out, hidden]
                spec.gate_up, spec.down = gemm(experts.gate_up_proj.mT), gemm(experts.down_proj.mT)
                spec.gate_up_bias, spec.down_bias = experts.gate_up_proj_bias, experts.down_proj_bias
                spec.clamped_swiglu = (experts.alpha, experts.limit)
            shared = shared_of(mlp)
            if shared is not None:
                spec.shared = tuple((gemm(getattr(shared, n).weight), gemm(getattr(shared, n).bias)) for n in DENSE_MLP)
            if hasattr(mlp, "shared_expert_gate"):
                spec.shared_gate = gemm(mlp.shared_expert_gate.weight)
        else:
            spec.dense = tuple((gemm(getattr(mlp, n).weight), gemm(getattr(mlp, n).bias)) for n in DENSE_MLP)

    def _router(self, mlp: Any) -> _Router:
        """An MoE block's router as ``_route`` runs it (``ROUTER_KINDS``)."""
        router = router_of(mlp)
        name = type(router).__name__
        kind = ROUTER_KINDS[name]
        weight = router.weight if kind in FP32_ROUTERS else self._gemm_weight(router_weight(router))
        spec = _Router(kind, weight, router.top_k, cast_weights=name != "MixtralTopKRouter",  # Mixtral's stay fp32
                       renormalise=name in RENORMALISING or getattr(router, "norm_topk_prob", False))
        if kind == "group_sigmoid":
            spec.bias, spec.groups, spec.kept = router.e_score_correction_bias, router.num_group, router.topk_group
            spec.scale = router.routed_scaling_factor
        elif kind == "group_softmax":
            spec.groups, spec.kept, spec.scale = router.num_group or 1, router.topk_group or 1, router.routed_scaling_factor
            spec.method = router.topk_method
        elif kind == "biased_sigmoid":  # its correction bias lives on the block
            spec.bias = mlp.e_score_correction_bias
        elif kind == "biased_softmax":
            spec.bias, spec.norm_min = router.moe_statics.e_score_correction_bias, router.norm_min
        elif kind == "top_k_softmax":
            spec.bias = self._gemm_weight(router.bias)
        return spec

    def _deltanet_layer(self, layer: Any) -> _Layer:
        """A Gated DeltaNet layer's norms and weights (its out_proj as the layer's ``o``)."""
        net, gemm = layer.linear_attn, self._gemm_weight
        fused = hasattr(net, "in_proj_qkvz")
        projections = (net.in_proj_qkvz, net.in_proj_ba) if fused else (net.in_proj_qkv, net.in_proj_z, net.in_proj_b,
                                                                          net.in_proj_a)
        return _Layer(
            input_norm=layer.input_layernorm.weight, post_norm=layer.post_attention_layernorm.weight, qkv=None,
            qkv_bias=None, o=gemm(net.out_proj.weight), o_bias=None, q_norm=None, k_norm=None,
            deltanet=_DeltaNet(
                in_proj=cast(Any, tuple(gemm(projection.weight) for projection in projections)),
                conv_weight=net.conv1d.weight, conv_bias=net.conv1d.bias, a_log=net.A_log, dt_bias=net.dt_bias,
                norm=net.norm.weight, key_heads=net.num_k_heads, value_heads=net.num_v_heads, key_dim=net.head_k_dim,
                value_dim=net.head_v_dim, fused=fused))

    def _latent(self, attn: Any) -> _Latent:
        """``DeepseekV3Attention``'s weights, as the decode step takes them."""
        gemm = self._gemm_weight

        def linear(module: Any) -> Linear:
            return gemm(module.weight), gemm(module.bias)

        lora = attn.q_lora_rank is not None
        return _Latent(
            q=None if lora else linear(attn.q_proj), q_a=linear(attn.q_a_proj) if lora else None,
            q_a_norm=(attn.q_a_layernorm.weight, attn.q_a_layernorm.variance_epsilon) if lora else None,
            q_b=gemm(attn.q_b_proj.weight) if lora else None, kv_a=linear(attn.kv_a_proj_with_mqa),
            kv_a_norm=(attn.kv_a_layernorm.weight, attn.kv_a_layernorm.variance_epsilon), kv_b=gemm(attn.kv_b_proj.weight),
            nope=attn.qk_nope_head_dim, rope=attn.qk_rope_head_dim, rank=attn.kv_lora_rank, v_dim=attn.v_head_dim,
            rotary="complex" if self.complex_rope else "interleaved" if attn.config.rope_interleave else "half")

    @overload
    def _gemm_weight(self, weight: torch.Tensor) -> torch.Tensor: ...

    @overload
    def _gemm_weight(self, weight: torch.Tensor | None) -> torch.Tensor | None: ...

    def _gemm_weight(self, weight: torch.Tensor | None) -> torch.Tensor | None:
        """The weight as the decode step's matmuls take it: itself, or its exact fp32 copy (``half_gemm``)."""
        return weight if weight is None or not self.fp32_gemm else weight.float()

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``F.linear`` in ``x``'s dtype; an fp32 GEMM on the same values, rounded once, with ``half_gemm="fp32"``."""
        if not self.fp32_gemm:
            return F.linear(x, weight, bias)
        return F.linear(x.float(), weight, bias).to(x.dtype)

    def reserve_positions(self, positions: int, dtype: torch.dtype) -> None:
        """Build the rotary tables for positions < ``positions`` now, so that steps below it read
        them without a device-to-host sync (``NativeEngine`` calls it once per rollout)."""
        if positions > self._rope_rows or self._rope_dtype != dtype:
            self._rope_table(positions, dtype)

    def _rope_table(self, needed: int, dtype: torch.dtype) -> None:
        rows = max(needed, 2 * self._rope_rows, 64)
        freqs = torch.arange(rows, device=self.inv_freq.device).float()[:, None] * self.inv_freq.float()
        if self.complex_rope:  # DeepseekV2RotaryEmbedding: polar(1, freqs) * factor, one table read as cos and sin
            self._cos = self._sin = torch.polar(torch.ones_like(freqs), freqs) * self.rope_scale
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
            table = torch.float32 if self.ernie else dtype  # ERNIE-4.5 keeps its tables in fp32
            self._cos, self._sin = (emb.cos() * self.rope_scale).to(table), (emb.sin() * self.rope_scale).to(table)
        self._rope_rows, self._rope_dtype = rows, dtype

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype, reserved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [b, 1, s, D] at ``positions`` (long [b, s]), as ``Qwen3RotaryEmbedding`` computes them.
        ``reserved``: the tables already cover ``positions`` (``reserve_positions``): no sync."""
        needed = 0 if reserved else int(positions.max()) + 1
        if needed > self._rope_rows or self._rope_dtype != dtype:
            self._rope_table(needed, dtype)
        return self._cos[positions][:, None], self._sin[positions][:, None]

    @torch.inference_mode()
    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        column: int,
        key_mask: torch.Tensor | None,
        cache: StaticKVCache,
        record_routes: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``tokens`` (long [b]) at ``positions`` (long [b]); write their keys at ``column``.

        ``key_mask``: bool [b, column + 1], the columns each row attends to (None: all of them).
        Returns (logits [b, V], routes int16 [b, L, K] or None).
        """
        mask = None if key_mask is None else key_mask[:, None, None, :]
        reserved = column < self._rope_rows  # positions <= column: covered by ``reserve_positions``
        logits, routes = self._forward(tokens[:, None], positions[:, None], column, mask, cache, record_routes, reserved)
        return logits, None if routes is None else routes[:, 0]

    @torch.inference_mode()
    def prefill(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        key_mask: torch.Tensor | None,
        max_new_tokens: int,
        record_routes: bool = False,
    ) -> tuple[torch.Tensor, StaticKVCache, torch.Tensor | None]:
        """Run left-padded prompts (long [b, w]) at ``positions`` [b, w] into a new cache of ``w + max_new_tokens`` columns.

        ``key_mask``: bool [b, w], True at real (non-pad) tokens, or None (no padding). Attention is
        causal over the real tokens (a pad query that sees none gets SDPA's zeros, not NaN). Only for ``half_gemm="fp32"``: the native path prefills with the transformers
        forward, which this reproduces only up to the summation order.
        Returns (logits of the last column [b, V], the cache, routes int16 [b, w, L, K] or None).
        """
        if self.hybrid:
            raise ValueError("FastDecoder.prefill: linear-attention layers prefill with the transformers forward")
        rows, width = tokens.shape
        shapes = [self._cache_shapes(layer, rows, width + max_new_tokens) for layer in self.layers]  # the model's dtype
        cache = StaticKVCache([self.embed.new_zeros(k) for k, _ in shapes], [self.embed.new_zeros(v) for _, v in shapes])
        column = torch.arange(width, device=tokens.device)
        mask = column[None, :] <= column[:, None]  # [query, key]: causal
        if key_mask is not None:
            mask = mask & key_mask[:, None, :]
        mask = mask.expand(rows, width, width)[:, None]
        logits, routes = self._forward(tokens, positions, 0, mask, cache, record_routes)
        return logits, cache, routes

    def _forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        column: int | torch.Tensor,
        mask: torch.Tensor | None,
        cache: StaticKVCache,
        record_routes: bool,
        reserved: bool = False,
        end: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``s`` tokens per row (long [b, s]) written at columns ``column .. column + s``; logits of the last.

        ``column`` a long tensor [1] (one token per row): written with ``index_copy_``, the same shapes
        at every position (``graph_decode`` captures it), attending to columns ``:end`` (None: all,
        under ``mask``). An int ``column`` attends to the columns up to the last one written."""
        rows, length = tokens.shape
        if not isinstance(column, torch.Tensor):
            end = column + length
        hidden = F.embedding(tokens, self.embed)  # [b, s, hidden]
        if self.embedding_multiplier != 1.0:
            hidden = hidden * self.embedding_multiplier
        cos, sin = self._rope(positions, hidden.dtype, reserved)
        routes = []
        for index, layer in enumerate(self.layers):
            residual = hidden
            x = self._norm(hidden, layer.input_norm)
            if layer.deltanet is not None:  # Qwen3.5's linear attention: this row's states, updated in place
                mixed = self._deltanet_step(x, layer.deltanet, cache.keys[index], cache.values[index])
            else:
                mixed = self._self_attention(x, layer, cache, index, (cos, sin), column, end, mask)
            mixed = self._linear(mixed, layer.o, layer.o_bias)  # [b, s, H * D] -> [b, s, hidden]
            hidden = residual + (mixed * self.residual_multiplier if self.residual_multiplier != 1.0 else mixed)
            residual = hidden
            x = self._norm(hidden, layer.post_norm)
            if layer.router is not None:
                flat = x.reshape(rows * length, -1)
                x, top_k_index = self._moe(flat, layer)
                if layer.shared_gate is not None:  # Qwen2MoeSparseMoeBlock: experts + sigmoid(gate) * shared expert
                    assert layer.shared is not None
                    x = x + F.sigmoid(self._linear(flat, layer.shared_gate)) * self._mlp(flat, layer.shared)
                elif layer.shared is not None:  # Glm4MoeMoE: experts + shared experts
                    x = x + self._mlp(flat, layer.shared)
                x = x.view(rows, length, -1)
                if record_routes:
                    routes.append(top_k_index.view(rows, length, -1))
            else:
                assert layer.dense is not None  # refresh: a layer has a router or a dense MLP
                x = self._mlp(x, layer.dense)
            hidden = residual + (x * self.residual_multiplier if self.residual_multiplier != 1.0 else x)
        hidden = self._norm(hidden[:, -1], self.final_norm)
        logits = self._linear(hidden, self.lm_head, self.lm_head_bias)
        if self.logits_scaling != 1.0:
            logits = logits / self.logits_scaling
        if not record_routes:
            return logits, None
        if not routes:
            raise ValueError("record_routes needs a MoE model (no layer of this one routes)")
        return logits, torch.stack(routes, dim=2).to(torch.int16)  # [b, s, L, K], MoE layers only, as RoutingReplay records

    def _self_attention(self, x: torch.Tensor, layer: _Layer, cache: StaticKVCache, index: int,
                        rope: tuple[torch.Tensor, torch.Tensor], column: int | torch.Tensor, end: int | None,
                        mask: torch.Tensor | None) -> torch.Tensor:
        """A layer's attention up to its o-projection: q/k/v (or latent attention), the new keys and values into the
        cache at ``column``, attention over the columns the layer sees; [b, s, H * D]."""
        rows, length = x.shape[:2]
        cos, sin = rope
        gate = None
        if layer.latent is not None:
            q, k, v = self._latent_qkv(x, layer.latent, cos, sin, rows, length)
        else:
            assert layer.qkv is not None  # refresh: a layer has q/k/v projections or latent attention
            width = self.num_heads * self.head_dim * (2 if layer.gated_attention else 1)
            kv_width = self.num_kv_heads * self.head_dim
            q, k, v = self._linear(x, layer.qkv, layer.qkv_bias).split([width, kv_width, kv_width], dim=-1)
            if layer.gated_attention:  # Qwen3.5: each head's query, then its output gate
                q, gate = torch.chunk(q.view(rows, length, -1, self.head_dim * 2), 2, dim=-1)
                gate = gate.reshape(rows, length, -1)
            q, k = self._qk_norms(q, k, layer, rows, length)
            v = v.view(rows, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
            rotate = _apply_rope_halves if self.gpt_oss else _apply_rope_fp32_pairs if self.ernie else _apply_rope
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            if self.qk_norm == "after_rope":  # Hunyuan: each head normalised once rotated
                assert layer.q_norm is not None and layer.k_norm is not None
                q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
        if self.kv_cache_format is not None:
            k, v = fake_quantize_kv(k, self.kv_cache_format), fake_quantize_kv(v, self.kv_cache_format)
        if isinstance(column, torch.Tensor):
            cache.keys[index].index_copy_(2, column, k)
            cache.values[index].index_copy_(2, column, v)
        else:
            cache.keys[index][:, :, column:end] = k
            cache.values[index][:, :, column:end] = v
        keys, values = cache.keys[index], cache.values[index]
        start, layer_mask = 0, mask
        if layer.window is not None:  # GPT-OSS's sliding layers
            start, layer_mask = _window(mask, layer.window, column, end, length)
        if end is not None:
            keys, values = keys[:, :, start:end], values[:, :, start:end]
        if layer.latent is not None:  # the cached latents expanded into every head's keys and values
            keys, values = self._latent_expand(keys, values, layer.latent)
        if layer.sinks is not None:
            attn = self._sink_attention(q, keys, values, layer_mask, layer.sinks)
        else:
            attn = self._attention(q, keys, values, layer_mask)
        return attn if gate is None else attn * torch.sigmoid(gate)

    def _deltanet_step(self, x: torch.Tensor, net: _DeltaNet, conv_state: torch.Tensor, recurrent_state: torch.Tensor
                       ) -> torch.Tensor:
        """``Qwen3_5GatedDeltaNet.forward`` for one token per row (x [b, 1, hidden]), with transformers' reference
        ``causal_conv1d_update`` and ``torch_recurrent_gated_delta_rule``: both states updated in place; the gated
        norm's output [b, 1, value heads * value dim], before out_proj."""
        rows, length = x.shape[:2]
        assert length == 1, "a Gated DeltaNet layer runs decode steps only (its prefill is the transformers forward)"
        keys, values = net.key_heads * net.key_dim, net.value_heads * net.value_dim
        if net.fused:  # Qwen3-Next: fix_query_key_value_ordering
            query, key, value, z, b, a = _unfused(self._linear(x, net.in_proj[0]), self._linear(x, net.in_proj[1]), net)
            query, key, value = (part.reshape(part.shape[0], part.shape[1], -1) for part in (query, key, value))
            mixed = torch.cat((query, key, value), dim=-1)
        else:
            mixed, z, b, a = (self._linear(x, weight) for weight in net.in_proj)
            z = z.reshape(rows, length, -1, net.value_dim)
        # causal_conv1d_update: the kernel's window is the cached columns and this one
        hidden_states = mixed.transpose(1, 2)
        full = torch.cat([conv_state, hidden_states], dim=-1).to(net.conv_weight.dtype)
        conv_state.copy_(full[:, :, -conv_state.shape[-1]:])
        convolved = F.conv1d(full, net.conv_weight, net.conv_bias, padding=0, groups=hidden_states.shape[1])
        mixed = F.silu(convolved[:, :, -length:]).to(hidden_states.dtype).transpose(1, 2)
        query, key, value = torch.split(mixed, [keys, keys, values], dim=-1)
        query = query.reshape(rows, length, -1, net.key_dim)
        key = key.reshape(rows, length, -1, net.key_dim)
        value = value.reshape(rows, length, -1, net.value_dim)
        beta = b.sigmoid()
        g = -net.a_log.float().exp() * F.softplus(a.float() + net.dt_bias)
        core, state = _gated_delta_step(query, key, value, g, beta, recurrent_state)
        recurrent_state.copy_(state)
        core = _gated_rms_norm(core.reshape(-1, net.value_dim), z.reshape(-1, net.value_dim), net.norm, self.eps)
        return core.reshape(rows, length, -1)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """An RMSNorm of the decoder (a layer's input / post-attention norm, the final one, per-head q/k norms) as the
        family scales it (``NORM_KIND``)."""
        return _rms_norm(x, weight, self.eps, self.norm_kind)

    def _cache_shapes(self, layer: _Layer, rows: int, length: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of a layer's cached keys and values (latent attention: its latent and its rotated key part)."""
        if layer.latent is not None:
            return (rows, 1, length, layer.latent.rank), (rows, 1, length, layer.latent.rope)
        shape = (rows, self.num_kv_heads, length, self.head_dim)
        return shape, shape

    def _latent_qkv(self, x: torch.Tensor, m: _Latent, cos: torch.Tensor, sin: torch.Tensor, rows: int, length: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``DeepseekV3Attention.forward`` up to its cache: the queries [b, H, s, nope + rope], and what the cache keeps
        of the new tokens: the normalised latent [b, 1, s, rank] and the rotated key part [b, 1, s, rope]."""
        if m.q is not None:
            q = self._linear(x, *m.q)
        else:
            assert m.q_a is not None and m.q_a_norm is not None and m.q_b is not None
            q = self._linear(_rms_norm(self._linear(x, *m.q_a), *m.q_a_norm), m.q_b)
        q_pass, q_rot = torch.split(q.view(rows, length, -1, m.nope + m.rope).transpose(1, 2), [m.nope, m.rope], dim=-1)
        latent, k_rot = torch.split(self._linear(x, *m.kv_a), [m.rank, m.rope], dim=-1)
        latent = _rms_norm(latent, *m.kv_a_norm).view(rows, 1, length, m.rank)
        k_rot = k_rot.view(rows, 1, length, m.rope)
        rotate = {"interleaved": _apply_rope_interleaved, "half": _apply_rope, "complex": _apply_rope_complex}[m.rotary]
        q_rot, k_rot = rotate(q_rot, cos, sin), rotate(k_rot, cos, sin)
        return torch.cat((q_pass, q_rot), dim=-1), latent, k_rot

    def _latent_expand(self, latent: torch.Tensor, k_rot: torch.Tensor, m: _Latent) -> tuple[torch.Tensor, torch.Tensor]:
        """``DeepseekV3Attention.expand_kv``: the cached latents [b, 1, L, rank] and rotated key parts as every head's
        keys [b, H, L, nope + rope] and values [b, H, L, v]."""
        rows, _, length, _ = latent.shape
        kv = self._linear(latent, m.kv_b).view(rows, length, -1, m.nope + m.v_dim).transpose(1, 2)
        k_nope, values = torch.split(kv, [m.nope, m.v_dim], dim=-1)
        k_rot = k_rot.expand(-1, k_nope.shape[1], -1, -1)
        keys = kv.new_empty(*kv.shape[:-1], m.nope + m.rope)
        keys[..., : m.nope].copy_(k_nope)
        keys[..., m.nope:].copy_(k_rot)
        return keys, values

    def _qk_norms(self, q: torch.Tensor, k: torch.Tensor, layer: _Layer, rows: int, length: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k [b, s, heads * D] as [b, heads, s, D], normalised as the family does (``QK_NORM``)."""
        if self.qk_norm == "full":  # OLMoE: one RMSNorm over the whole projection, then the heads
            assert layer.q_norm is not None and layer.k_norm is not None
            q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
        q = q.view(rows, length, self.num_heads, self.head_dim)
        k = k.view(rows, length, self.num_kv_heads, self.head_dim)
        if self.qk_norm == "head":  # Qwen3: each head normalised on its own
            assert layer.q_norm is not None and layer.k_norm is not None
            q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
        return q.transpose(1, 2), k.transpose(1, 2)

    def _mlp(self, x: torch.Tensor, weights: tuple[Linear, ...]) -> torch.Tensor:
        """A SwiGLU MLP (``Qwen3MLP``, Qwen2-MoE's shared expert): down(silu(gate(x)) * up(x))."""
        (gate, gate_bias), (up, up_bias), (down, down_bias) = weights
        return self._linear(F.silu(self._linear(x, gate, gate_bias)) * self._linear(x, up, up_bias), down, down_bias)

    def _attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """SDPA, as ``transformers.integrations.sdpa_attention`` calls it; q [b, H, s, D] -> [b, s, H * D]."""
        rows, length = q.shape[0], q.shape[2]
        groups = self.num_heads // self.num_kv_heads
        if length > 1:  # a prefill (half_gemm="fp32" only): GQA in the kernel
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=groups > 1)
            return out.transpose(1, 2).reshape(rows, length, -1)
        if groups > 1 and mask is not None:  # pack_gqa: the G query heads of a KV head become its queries
            out = F.scaled_dot_product_attention(
                q.reshape(rows, self.num_kv_heads, groups, self.head_dim), keys, values, attn_mask=mask,
                scale=self.scaling, is_causal=False,
            )
        else:
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=self.scaling, is_causal=False, enable_gqa=groups > 1
            )
        return out.reshape(rows, 1, -1)

    def _sink_attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                        sinks: torch.Tensor) -> torch.Tensor:
        """GPT-OSS's ``eager_attention_forward``: each head's softmax also over a learned sink logit, which is then
        dropped; masked keys get the dtype's lowest logit. q [b, H, s, D] -> [b, s, H * D]."""
        rows, length = q.shape[0], q.shape[2]
        groups = self.num_heads // self.num_kv_heads
        keys, values = _repeat_kv(keys, groups), _repeat_kv(values, groups)
        weights = torch.matmul(q, keys.transpose(2, 3)) * self.scaling
        if mask is not None:  # transformers adds 0 or the lowest value: the same 0 probability (no new tensor: capturable)
            weights = weights.masked_fill(~mask, torch.finfo(weights.dtype).min)
        combined = torch.cat([weights, sinks.reshape(1, -1, 1, 1).expand(rows, -1, length, -1)], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = F.softmax(combined, dim=-1, dtype=combined.dtype)
        out = torch.matmul(probs[..., :-1].to(values.dtype), values)
        return out.transpose(1, 2).reshape(rows, length, -1)

    def _moe(self, x: torch.Tensor, layer: _Layer) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's router (``_route``) + ``grouped_mm_experts_forward`` (transformers 5.24), for x [N, hidden]."""
        assert layer.router is not None and layer.gate_up is not None and layer.down is not None  # an MoE layer
        weights, top_k_index = self._route(x, layer)
        num_tokens, top_k = top_k_index.shape
        num_experts = layer.gate_up.shape[0]
        expert_ids, perm = torch.sort(top_k_index.reshape(-1))
        # the experts' dtypes, as transformers casts (the half dtype itself when their copies are fp32)
        up_dtype, down_dtype = (x.dtype, x.dtype) if self.fp32_gemm else (layer.gate_up.dtype, layer.down.dtype)
        selected = x[perm // top_k].to(up_dtype)
        sample_weights = weights.reshape(-1)[perm]
        groups: list[tuple[int, int, int]] | torch.Tensor
        if self.grouped_mm:  # one grouped GEMM per projection, offsets on the device: no host sync
            # (counts by scatter_add: a CUDA bincount reads its input's max on the host; capturable)
            counts = expert_ids.new_zeros(num_experts).scatter_add_(0, expert_ids, torch.ones_like(expert_ids))
            groups = counts.cumsum(0).to(torch.int32)
        else:
            # torch's CPU grouped_mm runs one mm per expert, empty ones included, with per-group bookkeeping;
            # the same mm over the rows of the experts that were chosen is bitwise its result, in far fewer ops
            groups = _groups(torch.bincount(expert_ids, minlength=num_experts).tolist())
        gate_up = self._grouped_matmul(selected, layer.gate_up, groups)
        if layer.gate_up_bias is not None:  # GPT-OSS: biases added to the rounded products, as transformers does
            gate_up.add_(layer.gate_up_bias[expert_ids])
        if layer.clamped_swiglu is not None:
            activated = _clamped_swiglu(gate_up, *layer.clamped_swiglu)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            activated = F.silu(gate) * up
        out = self._grouped_matmul(activated.to(down_dtype), layer.down, groups)
        if layer.down_bias is not None:
            out.add_(layer.down_bias[expert_ids])
        out = out * sample_weights.unsqueeze(-1)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.size(0), device=perm.device)
        out = out[inverse].view(num_tokens, top_k, -1).sum(dim=1)
        return out.to(x.dtype), top_k_index


    def _route(self, x: torch.Tensor, layer: _Layer) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k weights and experts of x [N, hidden], by the layer's router's rule (``ROUTES``)."""
        assert layer.router is not None
        return ROUTES[layer.router.kind](x, layer.router, self._linear)
    def _grouped_matmul(self, rows: torch.Tensor, weight: torch.Tensor,
                        groups: list[tuple[int, int, int]] | torch.Tensor) -> torch.Tensor:
        """``_grouped_matmul`` (``groups`` a list) or transformers' ``grouped_mm`` dispatcher (``groups``
        the int32 offsets on the device) in ``rows``' dtype; fp32 GEMMs rounded once with ``half_gemm="fp32"``."""
        x = rows.float() if self.fp32_gemm else rows
        out = _grouped_matmul(x, weight, groups) if isinstance(groups, list) else _device_grouped_mm(x, weight, groups)
        return out.to(rows.dtype) if self.fp32_gemm else out


def _cat_biases(*linears: nn.Linear) -> torch.Tensor | None:
    biases = [linear.bias for linear in linears]
    if all(bias is None for bias in biases):
        return None
    return torch.cat([bias if bias is not None else linear.weight.new_zeros(linear.out_features)
                      for bias, linear in zip(biases, linears)])


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kind: str = "plain") -> torch.Tensor:
    """``Qwen3RMSNorm.forward`` (OLMoE's, Mixtral's and Qwen2-MoE's are the same); ``kind`` (``NORM_KIND``):
    ``fp32_scale``, GPT-OSS's, scales before casting back; ``offset``, Qwen3.5's, scales by 1 + weight in fp32."""
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    if kind == "fp32_scale":
        return (weight * x).to(dtype)
    if kind == "offset":
        return (x * (1.0 + weight.float())).to(dtype)
    return weight * x.to(dtype)


def _gated_delta_step(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      initial_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``torch_recurrent_gated_delta_rule`` for one token (q/k l2-normalised in it), op for op: the
    output [b, 1, value heads, value dim] in the input dtype and the new recurrent state (fp32)."""
    dtype = query.dtype
    key_heads, value_heads = key.shape[2], value.shape[2]
    if key_heads != value_heads:  # each query/key head serves consecutive value heads
        query = query.repeat_interleave(value_heads // key_heads, dim=2)
        key = key.repeat_interleave(value_heads // key_heads, dim=2)
    query, key, value, beta, g = [x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                                  for x in (query, key, value, beta, g)]
    query = query * torch.rsqrt((query * query).sum(dim=-1, keepdim=True) + 1e-6)
    key = key * torch.rsqrt((key * key).sum(dim=-1, keepdim=True) + 1e-6)
    query = query / (query.shape[-1] ** 0.5)
    state = initial_state.to(value)
    out = torch.zeros_like(value)
    q_t, k_t, v_t = query[:, :, 0], key[:, :, 0], value[:, :, 0]
    state = state * g[:, :, 0].exp()[..., None, None]
    kv_mem = (state * k_t.unsqueeze(-1)).sum(dim=-2)
    delta = (v_t - kv_mem) * beta[:, :, 0].unsqueeze(-1)
    state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
    out[:, :, 0] = (state * q_t.unsqueeze(-1)).sum(dim=-2)
    return out.transpose(1, 2).contiguous().to(dtype), state


def _unfused(qkvz: torch.Tensor, ba: torch.Tensor, net: _DeltaNet) -> tuple[torch.Tensor, ...]:
    """``Qwen3NextGatedDeltaNet.fix_query_key_value_ordering``: q, k, v, z [b, s, heads, dim] and b, a [b, s, value
    heads] from the fused products, whose columns run key head by key head."""
    per_key_head = net.value_heads // net.key_heads
    qkvz = qkvz.view(*qkvz.shape[:-1], net.key_heads, 2 * net.key_dim + 2 * net.value_dim * per_key_head)
    ba = ba.view(*ba.shape[:-1], net.key_heads, 2 * per_key_head)
    query, key, value, z = torch.split(qkvz, [net.key_dim, net.key_dim, per_key_head * net.value_dim,
                                              per_key_head * net.value_dim], dim=3)
    b, a = torch.split(ba, [per_key_head, per_key_head], dim=3)
    value = value.reshape(value.size(0), value.size(1), -1, net.value_dim)
    z = z.reshape(z.size(0), z.size(1), -1, net.value_dim)
    b = b.reshape(b.size(0), b.size(1), net.value_heads)
    a = a.reshape(a.size(0), a.size(1), net.value_heads)
    return query, key, value, z, b, a


def _gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``Qwen3_5RMSNormGated.forward``: the norm, then times silu(gate) in fp32."""
    return (_rms_norm(x, weight, eps) * F.silu(gate.to(torch.float32))).to(x.dtype)


def _window(mask: torch.Tensor | None, window: int, column: int | torch.Tensor, end: int | None, length: int
            ) -> tuple[int, torch.Tensor | None]:
    """A sliding layer's first key column and mask (bool). A decode step attends to the last ``window`` columns, those
    transformers' sliding cache keeps (``end`` known); with the whole static length (``end`` None, CUDA graphs) the
    older columns are masked instead; a prefill masks keys ``window`` or more columns before their query."""
    if length == 1 and end is not None:
        start = max(0, end - window)
        return start, None if mask is None else mask[..., start:]
    assert mask is not None, "a prefill or a whole-length step passes its mask"
    columns = torch.arange(mask.shape[-1], device=mask.device)
    if length == 1:  # column: long [1] (graph_decode)
        return 0, mask & (columns > column - window)
    assert isinstance(column, int), "a prefill writes from an int column"
    queries = columns[column: column + length]
    return 0, mask & (queries[:, None] - columns[None, :] < window)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """transformers' ``repeat_kv``: [b, kv heads, L, D] -> [b, kv heads * groups, L, D]."""
    if groups == 1:
        return x
    rows, heads, length, dim = x.shape
    return x[:, :, None, :, :].expand(rows, heads, groups, length, dim).reshape(rows, heads * groups, length, dim)


def _clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """``GptOssExperts._apply_gate``: interleaved gate / up columns, clamped, ``(up + 1) * gate * sigmoid(alpha gate)``."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + 1) * glu


Route = tuple[torch.Tensor, torch.Tensor]  # the top-k weights [N, k] and experts [N, k] of N tokens


def _softmax_top_k(x: torch.Tensor, router: _Router, linear: Callable[..., torch.Tensor]) -> Route:
    """``Qwen3MoeTopKRouter.forward`` (OLMoE's, Qwen2-MoE's, Mixtral's, Qwen3.5's, Hunyuan's: the same but for
    ``cast_weights`` and ``renormalise``): the top-k of an fp32 softmax of the logits."""
    router_logits = linear(x, router.weight)
    probs = F.softmax(router_logits, dtype=torch.float, dim=-1)
    weights, top_k_index = torch.topk(probs, router.top_k, dim=-1)
    if router.renormalise:
        weights /= weights.sum(dim=-1, keepdim=True)
    if router.cast_weights:
        weights = weights.to(router_logits.dtype)
    return weights, top_k_index


def _group_limited_top_k(x: torch.Tensor, router: _Router, _: Callable[..., torch.Tensor]) -> Route:
    """``Glm4MoeTopkRouter.forward`` (DeepSeek-V3's noaux_tc) for x [N, hidden]: the top-k weights (fp32) and experts."""
    assert router.bias is not None
    router_logits = F.linear(x.type(torch.float32), router.weight.type(torch.float32))
    scores = router_logits.sigmoid()
    choice = scores + router.bias
    group_scores = choice.view(-1, router.groups, choice.shape[-1] // router.groups).topk(2, dim=-1)[0].sum(dim=-1)
    choice = choice.masked_fill(~_best_groups(group_scores, router.kept, choice.shape[-1]), float("-inf"))
    top_k_index = torch.topk(choice, k=router.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, top_k_index)
    if router.renormalise:
        denominator = weights.sum(dim=-1, keepdim=True) + 1e-20
        weights /= denominator
    return weights * router.scale, top_k_index


def _biased_sigmoid_top_k(x: torch.Tensor, router: _Router, linear: Callable[..., torch.Tensor]) -> Route:
    """``MiniMaxM2TopKRouter`` (with its block's correction bias): sigmoid scores, the bias to choose, renormalised."""
    assert router.bias is not None
    scores = F.sigmoid(linear(x, router.weight).float())
    top_k_index = torch.topk(scores + router.bias, router.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, top_k_index)
    weights /= weights.sum(dim=-1, keepdim=True)
    return weights, top_k_index


def _biased_softmax_top_k(x: torch.Tensor, router: _Router, _: Callable[..., torch.Tensor]) -> Route:
    """``Ernie4_5_MoeTopKRouter``: an fp32 softmax, top-k of it plus the correction bias, renormalised (a floor of
    ``norm_min``), the weights cast to the hidden dtype."""
    assert router.bias is not None
    probs = F.softmax(F.linear(x.float(), router.weight.float()), dim=1, dtype=torch.float)
    top_k_index = torch.topk(probs + router.bias.squeeze(), router.top_k, dim=-1)[1]
    weights = torch.gather(probs, dim=-1, index=top_k_index)
    return (weights / torch.clamp(weights.sum(dim=-1, keepdim=True), min=router.norm_min)).to(x.dtype), top_k_index


def _logit_top_k(x: torch.Tensor, router: _Router, linear: Callable[..., torch.Tensor]) -> Route:
    """``GraniteMoeTopKRouter``: the top-k of the fp32 logits, an fp32 softmax over them."""
    top_logits, top_k_index = linear(x, router.weight).float().topk(router.top_k, dim=-1)
    return torch.softmax(top_logits, dim=-1).type_as(x), top_k_index


def _top_k_softmax(x: torch.Tensor, router: _Router, linear: Callable[..., torch.Tensor]) -> Route:
    """``GptOssTopKRouter``: the softmax over the top-k biased logits, in the model's dtype."""
    top_values, top_k_index = torch.topk(linear(x, router.weight, router.bias), router.top_k, dim=-1)
    return F.softmax(top_values, dim=1, dtype=top_values.dtype), top_k_index


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary_pos_emb`` on q or k; a partial rotary table (GLM-4-MoE's ``partial_rotary_factor``) rotates the
    first dimensions of each head and passes the rest, as transformers does."""
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rotated, passed = x[..., :rotary], x[..., rotary:]
    return torch.cat([rotated * cos + _rotate_half(rotated) * sin, passed], dim=-1)


def _greedy_top_k(x: torch.Tensor, router: _Router, _: Callable[..., torch.Tensor]) -> Route:
    """``DeepseekV2TopkRouter.forward`` for x [N, hidden]: fp32 softmax scores, top-k over all experts (``greedy``)
    or over the best groups' (``group_limited_greedy``), scaled; the weights (fp32) and experts."""
    router_logits = F.linear(x.type(torch.float32), router.weight.type(torch.float32))
    scores = router_logits.softmax(dim=-1, dtype=torch.float32)
    if router.method == "group_limited_greedy":
        group_scores = scores.view(-1, router.groups, scores.shape[-1] // router.groups).max(dim=-1).values
        scores = scores.masked_fill(~_best_groups(group_scores, router.kept, scores.shape[-1]), 0.0)
    weights, top_k_index = torch.topk(scores, k=router.top_k, dim=-1, sorted=False)
    return weights * router.scale, top_k_index


ROUTES: dict[str, Callable[[torch.Tensor, _Router, Callable[..., torch.Tensor]], Route]] = {
    "softmax": _softmax_top_k, "group_sigmoid": _group_limited_top_k, "group_softmax": _greedy_top_k,
    "biased_sigmoid": _biased_sigmoid_top_k, "biased_softmax": _biased_softmax_top_k, "logit_top_k": _logit_top_k,
    "top_k_softmax": _top_k_softmax,
}
"""Each router rule (``ROUTER_KINDS``): ``(x [N, hidden], router, linear)`` -> the top-k weights and experts;
``linear`` is the decoder's GEMM (``FastDecoder._linear``), the fp32 rules run their own."""


def _best_groups(group_scores: torch.Tensor, kept: int, experts: int) -> torch.Tensor:
    """bool [N, experts]: the experts of each token's ``kept`` best groups (``group_scores`` [N, groups]), as both
    DeepSeek routers build their score mask."""
    groups = group_scores.shape[-1]
    group_idx = torch.topk(group_scores, k=kept, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    return group_mask.unsqueeze(-1).expand(-1, groups, experts // groups).reshape(-1, experts).bool()


def _apply_rope_complex(x: torch.Tensor, cis: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V2's ``apply_rotary_emb`` on q or k: pairs as complex numbers times ``freqs_cis``."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * cis).flatten(3).type_as(x)


def _apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary_pos_emb_interleave`` (DeepSeek's rotary pairs ``(x0, x1), (x2, x3), ...``) on q or k."""
    cos, sin = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _apply_rope_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-OSS's ``_apply_rotary_emb``: the two halves of each head rotated as pairs (its table is the first half of
    ours, the same values)."""
    cos, sin = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def _apply_rope_fp32_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """ERNIE-4.5's ``apply_rotary_pos_emb``: pairs ``(x0, x1), (x2, x3), ...`` rotated in fp32 (its tables are fp32),
    then cast back."""
    cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
    sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
    rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return ((x.float() * cos) + (rotated.float() * sin)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _groups(counts: list[int]) -> list[tuple[int, int, int]]:
    """(expert, first row, end row) of each expert with rows, for rows sorted by expert."""
    groups, start = [], 0
    for expert, count in enumerate(counts):
        if count:
            groups.append((expert, start, start + count))
            start += count
    return groups


def _device_grouped_mm(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``grouped_mm(rows, weight^T, offs)`` as transformers' ``grouped_mm`` experts call it (``torch.nn.functional
    .grouped_mm`` or ``torch._grouped_mm``, else its fallback), for rows sorted by expert (weight [E, out, in])."""
    from transformers.integrations.moe import _grouped_mm

    return _grouped_mm(rows, weight.transpose(-2, -1), offs=offsets)


def _grouped_matmul(rows: torch.Tensor, weight: torch.Tensor, groups: list[tuple[int, int, int]]) -> torch.Tensor:
    """``F.grouped_mm(rows, weight.transpose(-2, -1), offs)`` for rows sorted by expert (weight [E, out, in])."""
    out = rows.new_empty(rows.shape[0], weight.shape[1])
    for expert, start, end in groups:
        torch.mm(rows[start:end], weight[expert].t(), out=out[start:end])
    return out
