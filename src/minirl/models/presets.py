"""Named presets of tiny Hugging Face models, built from a config (no downloads), in fp32.

Each preset is a function returning a ``PretrainedConfig``; ``build_model`` turns it into a
randomly initialised ``*ForCausalLM`` with a seed. The name says the family and roughly the
parameter count (tied embeddings, the 101-token character vocabulary):

    qwen3-moe-2m     Qwen3-MoE, hidden 128, 4 layers, 8 experts top-2 (~1.8 M). The default.
    qwen3-moe-20m    Qwen3-MoE, hidden 256, 6 layers, 16 experts top-2 (~20 M).
    qwen3-dense-2m   Qwen3 dense twin of qwen3-moe-2m: same attention, one MLP as wide as all
                     eight experts together (intermediate 1024), so the same total parameters.
    qwen3-moe-tiny, qwen2-moe-tiny, olmoe-tiny, mixtral-tiny, gpt-oss-tiny, qwen3.5-moe-tiny
                     hidden 64, 2 layers, 4 experts top-2: for tests of each routing-replay family
                     (GPT-OSS: its attention sinks, a 16-token sliding window on the first layer, biased
                     experts with a clamped SwiGLU; Qwen3.5-MoE: a linear-attention (Gated DeltaNet)
                     layer, then a gated full-attention one, each with a shared expert).

MoE presets use the ``grouped_mm`` experts implementation (the transformers default where the
model supports it; ``batched_mm`` is ~50x slower on CPU). The implementation is not saved in
``config.json``: a reloaded checkpoint picks ``grouped_mm`` again by default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import (
    AutoModelForCausalLM,
    GptOssConfig,
    MixtralConfig,
    OlmoeConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2MoeConfig,
    Qwen3_5MoeTextConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)

MAX_POSITION_EMBEDDINGS = 512
EXPERTS_IMPLEMENTATION = "grouped_mm"

ConfigFactory = Callable[[int, int, int, "int | None"], PretrainedConfig]


def _common(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None) -> dict:
    """Fields every preset shares: vocabulary, special ids, context length, tied embeddings."""
    return dict(
        vocab_size=vocab_size,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=True,  # the embedding is a large share of a tiny model
        dtype="float32",
    )


def qwen3_moe_2m(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None) -> PretrainedConfig:
    return Qwen3MoeConfig(
        **_common(vocab_size, pad_id, eos_id, bos_id),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        intermediate_size=512,  # unused: every layer is sparse (decoder_sparse_step 1)
        norm_topk_prob=True,
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )


def qwen3_moe_20m(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None) -> PretrainedConfig:
    return Qwen3MoeConfig(
        **_common(vocab_size, pad_id, eos_id, bos_id),
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        num_experts=16,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        intermediate_size=1024,  # unused: every layer is sparse
        norm_topk_prob=True,
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )


def qwen3_dense_2m(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None) -> PretrainedConfig:
    return Qwen3Config(
        **_common(vocab_size, pad_id, eos_id, bos_id),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=1024,
    )


# The routing-replay test families share one tiny shape: hidden 64, 2 layers, 4 heads / 2 kv heads.
_TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def qwen3_moe_tiny(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None) -> PretrainedConfig:
    return Qwen3MoeConfig(
        **_common(vocab_size, pad_id, eos_id, bos_id),
        **_TINY_SHAPE,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        intermediate_size=128,
        norm_topk_prob=True,
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )


def qwen2_moe_tiny(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None) -> PretrainedConfig:
    return Qwen2MoeConfig(
        **_common(vocab_size, pad_id, eos_id, bos_id),
        **_TINY_SHAPE,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        intermediate_size=128,
        norm_topk_prob=True,
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )


def olmoe_tiny(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None) -> PretrainedConfig:
    return OlmoeConfig(
        **_common(vocab_size, pad_id, eos_id, bos_id),
        **_TINY_SHAPE,
        num_experts=4,
        num_experts_per_tok=2,
        intermediate_size=64,  # per expert
        norm_topk_prob=True,
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )


def mixtral_tiny(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None) -> PretrainedConfig:
    return MixtralConfig(
        **_common(vocab_size, pad_id, eos_id, bos_id),
        **_TINY_SHAPE,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        intermediate_size=64,  # per expert
        router_jitter_noise=0.0,
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )


def gpt_oss_tiny(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None) -> PretrainedConfig:
    return GptOssConfig(
        **_common(vocab_size, pad_id, eos_id, bos_id),
        **_TINY_SHAPE,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        intermediate_size=64,  # per expert
        sliding_window=16,  # layer types: sliding, full
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )


def qwen3_5_moe_tiny(vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None) -> PretrainedConfig:
    return Qwen3_5MoeTextConfig(
        **_common(vocab_size, pad_id, eos_id, bos_id),
        **_TINY_SHAPE,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        experts_implementation=EXPERTS_IMPLEMENTATION,
    )


PRESETS: dict[str, ConfigFactory] = {
    "qwen3-moe-2m": qwen3_moe_2m,
    "qwen3-moe-20m": qwen3_moe_20m,
    "qwen3-dense-2m": qwen3_dense_2m,
    "qwen3-moe-tiny": qwen3_moe_tiny,
    "qwen2-moe-tiny": qwen2_moe_tiny,
    "olmoe-tiny": olmoe_tiny,
    "mixtral-tiny": mixtral_tiny,
    "gpt-oss-tiny": gpt_oss_tiny,
    "qwen3.5-moe-tiny": qwen3_5_moe_tiny,
}


def list_presets() -> list[str]:
    """The preset names, in the order above."""
    return list(PRESETS)


def preset_config(
    preset: str, vocab_size: int, pad_id: int, eos_id: int, bos_id: int | None = None
) -> PretrainedConfig:
    """The config of ``preset``; ``KeyError`` naming the known presets when it is unknown."""
    if preset not in PRESETS:
        raise KeyError(f"unknown model preset {preset!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[preset](vocab_size, pad_id, eos_id, bos_id)


def build_model(
    preset: str, vocab_size: int, pad_id: int, eos_id: int, seed: int, bos_id: int | None = None
) -> PreTrainedModel:
    """A freshly initialised fp32 model of ``preset``; the same weights for the same seed.

    The global torch RNG is left as it was: initialisation draws from a forked generator.
    """
    config = preset_config(preset, vocab_size, pad_id, eos_id, bos_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(parameter.numel() for parameter in model.parameters())
