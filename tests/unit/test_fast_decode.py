"""The engine's fast decode path is bitwise the transformers forward, and falls back where it is not."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Dots1Config,
    Dots1ForCausalLM,
    DynamicCache,
    Ernie4_5_MoeConfig,
    Ernie4_5_MoeForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    Glm4MoeLiteConfig,
    Glm4MoeLiteForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    GraniteMoeConfig,
    GraniteMoeForCausalLM,
    HunYuanMoEV1Config,
    HunYuanMoEV1ForCausalLM,
    MiniMaxM2Config,
    MiniMaxM2ForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    PhimoeConfig,
    PhimoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

from minirl.rollout.fast_decode import FastDecoder, StaticKVCache, _grouped_matmul, _groups, unsupported_reason
from minirl.rollout.native import NativeEngine
from minirl.types import SamplingParams
from tests.unit.test_rollout_native import EOS, PAD, PROMPTS, VOCAB, dense_model, moe_model

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             num_experts_per_tok=2, max_position_embeddings=256)


def _corrected(model):
    """``model`` with its routers' correction biases away from zero (DeepSeek-V3's noaux_tc), so that they are seen."""
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    return model


def _built(cls, config, seed: int):
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(seed)
    return cls._from_config(config, dtype=torch.float32).eval()


def olmoe_model(std: float = 0.02, seed: int = 0) -> OlmoeForCausalLM:
    """OLMoE: q and k normalised over the whole projection, top-k weights not renormalised."""
    return _built(OlmoeForCausalLM, OlmoeConfig(**SMALL, intermediate_size=64, num_experts=4, initializer_range=std), seed)


def mixtral_model(std: float = 0.02, seed: int = 1) -> MixtralForCausalLM:
    """Mixtral: no q/k norm; the router renormalises its top-k and keeps the weights in fp32 (seed 1: some rows
    draw EOS early at std 0.3)."""
    return _built(MixtralForCausalLM, MixtralConfig(**SMALL, intermediate_size=64, num_local_experts=4,
                                                    initializer_range=std), seed)


def qwen2_moe_model(std: float = 0.02, seed: int = 0) -> Qwen2MoeForCausalLM:
    """Qwen2-MoE: q/k/v biases, a shared expert under a sigmoid gate, a dense first layer (mlp_only_layers)."""
    config = Qwen2MoeConfig(**SMALL, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                            num_experts=4, mlp_only_layers=[0], norm_topk_prob=True, initializer_range=std)
    model = _built(Qwen2MoeForCausalLM, config, seed)
    with torch.no_grad():  # biases away from zero, so that they are seen
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, std)
    return model


def glm4_moe_model(std: float = 0.02, seed: int = 2) -> Glm4MoeForCausalLM:
    """GLM-4-MoE: partial RoPE (half of each head), per-head q/k norm, attention biases, a dense first layer, a
    shared expert, and DeepSeek-V3's router: sigmoid scores, a correction bias, top-k within the best group of two
    (seed 2: some rows draw EOS early at std 0.3; at seed 1 the bf16 fp32-GEMM test sees one of 199 tokens move by
    0.16 nats, a near-tied route flipped by a one-ulp GEMM difference, the discrete effect that test's bound excludes)."""
    config = Glm4MoeConfig(**{**SMALL, "num_hidden_layers": 3}, intermediate_size=96, moe_intermediate_size=32,
                           n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
                           use_qk_norm=True, attention_bias=True, routed_scaling_factor=2.5, initializer_range=std,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    model = _built(Glm4MoeForCausalLM, config, seed)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, std)
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    return model


def deepseek_v3_model(std: float = 0.02, seed: int = 2, *, q_lora: bool = True, yarn: bool = True,
                      interleave: bool = True) -> DeepseekV3ForCausalLM:
    """DeepSeek-V3: multi-head latent attention (a query LoRA, a key/value latent expanded every step, values of
    their own width, interleaved rotary pairs, yarn's scaled frequencies and softmax scale), a dense first layer, shared
    experts and the group-limited sigmoid router (seed 2: some rows draw EOS early at std 0.3)."""
    rope = ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
             "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 32.0, "beta_slow": 1.0} if yarn
            else {"rope_type": "default", "rope_theta": 10000.0})
    config = DeepseekV3Config(**{**SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4}, intermediate_size=96,
                              moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1,
                              first_k_dense_replace=1, q_lora_rank=32 if q_lora else None, kv_lora_rank=16,
                              qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, rope_interleave=interleave,
                              routed_scaling_factor=2.5, initializer_range=std, rope_parameters=rope)
    model = _built(DeepseekV3ForCausalLM, config, seed)
    return _corrected(model)


def glm4_moe_lite_model(std: float = 0.02, seed: int = 2) -> Glm4MoeLiteForCausalLM:
    """GLM-4-MoE-Lite: DeepSeek-V3's code under GLM's names, its dense layers by mlp_layer_types."""
    config = Glm4MoeLiteConfig(**{**SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4}, intermediate_size=96,
                               moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1,
                               q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                               mlp_layer_types=["dense", "sparse", "sparse"], routed_scaling_factor=1.8,
                               initializer_range=std)
    model = _built(Glm4MoeLiteForCausalLM, config, seed)
    return _corrected(model)


def dots1_model(std: float = 0.02, seed: int = 2) -> Dots1ForCausalLM:
    """dots.llm1: Qwen3-MoE's attention (per-head q/k norm) and DeepSeek-V3's MoE (group-limited sigmoid router,
    shared experts, a dense first layer)."""
    config = Dots1Config(**{**SMALL, "num_hidden_layers": 3}, head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                         n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
                         routed_scaling_factor=1.5, initializer_range=std)
    model = _built(Dots1ForCausalLM, config, seed)
    return _corrected(model)


def deepseek_v2_model(std: float = 0.02, seed: int = 3, *, method: str = "group_limited_greedy") -> DeepseekV2ForCausalLM:
    """DeepSeek-V2: latent attention rotated with complex numbers (yarn's scaled table), its fp32 softmax router
    (top-k within the best groups, or greedy), shared experts, a dense first layer (seed 3: some rows draw EOS early
    at std 0.3)."""
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
            "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 32.0, "beta_slow": 1.0}
    config = DeepseekV2Config(**{**SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4}, intermediate_size=96,
                              moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1,
                              topk_method=method, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                              qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, routed_scaling_factor=1.5,
                              initializer_range=std, rope_parameters=rope)
    return _built(DeepseekV2ForCausalLM, config, seed)


def minimax_m2_model(std: float = 0.02, seed: int = 7) -> MiniMaxM2ForCausalLM:
    """MiniMax-M2: q/k normalised over the whole projection (as OLMoE), partial RoPE, and a sigmoid router choosing
    with a correction bias (on the block), renormalised, fp32 weights (seed 7: some rows draw EOS early at std 0.3)."""
    config = MiniMaxM2Config(**SMALL, head_dim=16, intermediate_size=32, num_local_experts=8, initializer_range=std,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    model = _built(MiniMaxM2ForCausalLM, config, seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.e_score_correction_bias.normal_(0.0, 0.1)
    return model


def gpt_oss_model(std: float = 0.02, seed: int = 1, *, window: int = 4) -> GptOssForCausalLM:
    """GPT-OSS: eager attention with a sink logit per head, a sliding window of ``window`` columns on every other layer
    (4: the prompts and their responses outgrow it), yarn RoPE on the two halves of each head, biases everywhere (the
    router's, the experts' transposed interleaved gate/up and down), a clamped SwiGLU, norms scaled in fp32 (seed 1:
    some rows draw EOS early at std 0.3)."""
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    config = GptOssConfig(**{**SMALL, "num_hidden_layers": 3}, head_dim=16, intermediate_size=32, num_local_experts=8,
                          sliding_window=window, swiglu_limit=2.0, initializer_range=std, rope_parameters=rope)
    model = _built(GptOssForCausalLM, config, seed)
    with torch.no_grad():  # biases and sinks away from zero (and past the clamp), so that they are seen
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for bias in (attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias, attn.o_proj.bias, mlp.router.bias):
                bias.normal_(0.0, std)
            attn.sinks.normal_(0.0, 1.0)
            mlp.experts.gate_up_proj_bias.normal_(0.0, 1.0)
            mlp.experts.down_proj_bias.normal_(0.0, std)
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.normal_(1.0, 0.1)  # not 1: a scale in fp32 rounds otherwise than one in bf16
        model.model.norm.weight.normal_(1.0, 0.1)
    return model


HYBRID = dict(layer_types=["linear_attention", "full_attention", "linear_attention"], linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8)


def _qwen3_5(model):
    """Qwen3.5's zero-centred norm weights and its linear layers' decay and step parameters away from their init."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("layernorm.weight", "norm.weight", "q_norm.weight", "k_norm.weight", "dt_bias")):
                parameter.normal_(0.0, 0.3)
    return model


def qwen3_5_moe_model(std: float = 0.02, seed: int = 0) -> Qwen3_5MoeForCausalLM:
    """Qwen3.5-MoE: Gated DeltaNet layers (a causal conv and a gated delta-rule recurrent state per row, a gated norm)
    beside gated full attention (each head's query with an output gate, partial RoPE, zero-centred q/k norms), every
    layer MoE with a sigmoid-gated shared expert."""
    config = Qwen3_5MoeTextConfig(**{**SMALL, "num_hidden_layers": 3}, head_dim=16, num_experts=8,
                                  moe_intermediate_size=32, shared_expert_intermediate_size=32, initializer_range=std,
                                  **HYBRID)
    return _qwen3_5(_built(Qwen3_5MoeForCausalLM, config, seed))


def qwen3_5_model(std: float = 0.02, seed: int = 0) -> Qwen3_5ForCausalLM:
    """Qwen3.5 dense: the same layers with a SwiGLU MLP."""
    small = {key: value for key, value in SMALL.items() if key != "num_experts_per_tok"}
    config = Qwen3_5TextConfig(**{**small, "num_hidden_layers": 3}, head_dim=16, intermediate_size=96,
                               initializer_range=std, **HYBRID)
    torch.manual_seed(seed)
    return _qwen3_5(Qwen3_5ForCausalLM._from_config(config, dtype=torch.float32).eval())


def qwen3_next_model(std: float = 0.02, seed: int = 1) -> Qwen3NextForCausalLM:
    """Qwen3-Next: Qwen3.5's layers with the linear attention's projections fused per key head (q, k, v, z and b, a
    side by side), a renormalising router and a dense layer (mlp_only_layers) (seed 1: some rows draw EOS early at
    std 0.3)."""
    config = Qwen3NextConfig(**{**SMALL, "num_hidden_layers": 3}, head_dim=16, num_experts=8, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, intermediate_size=96, norm_topk_prob=True,
                             mlp_only_layers=[1], initializer_range=std, **HYBRID)
    return _qwen3_5(_built(Qwen3NextForCausalLM, config, seed))


def ernie4_5_moe_model(std: float = 0.02, seed: int = 0) -> Ernie4_5_MoeForCausalLM:
    """ERNIE-4.5-MoE: q/k/v/o and MLP biases, rotary pairs interleaved and computed in fp32, a dense first layer, a
    shared expert, and its router: an fp32 softmax whose top-k is chosen with a correction bias, renormalised."""
    config = Ernie4_5_MoeConfig(**{**SMALL, "num_hidden_layers": 3}, num_experts=8, moe_intermediate_size=32,
                                intermediate_size=96, moe_num_shared_experts=1, moe_layer_start_index=1, use_bias=True,
                                initializer_range=std)
    model = _built(Ernie4_5_MoeForCausalLM, config, seed)
    with torch.no_grad():  # biases away from zero, so that they are seen
        for name, parameter in model.named_parameters():
            if name.endswith(".bias") or name.endswith("e_score_correction_bias"):
                parameter.normal_(0.0, 0.1)
    return model


def granitemoe_model(std: float = 0.02, seed: int = 1) -> GraniteMoeForCausalLM:
    """Granite-MoE: Mixtral's layers scaled: embeddings (embedding_multiplier), the attention's softmax scale
    (attention_multiplier), each residual branch (residual_multiplier), the logits (divided by logits_scaling), and a
    router taking the top-k of its fp32 logits (seed 1: some rows draw EOS early at std 0.3)."""
    config = GraniteMoeConfig(**SMALL, intermediate_size=32, num_local_experts=8, embedding_multiplier=3.0,
                              attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=1.7,
                              initializer_range=std)
    return _built(GraniteMoeForCausalLM, config, seed)


def hunyuan_moe_model(std: float = 0.02, seed: int = 0) -> HunYuanMoEV1ForCausalLM:
    """Hunyuan-MoE: q/k normalised per head after the rotary, NTK-alpha RoPE (labelled "dynamic", a fixed base), a
    renormalising router in its ``wg`` linear, a shared MLP beside the experts."""
    config = HunYuanMoEV1Config(**SMALL, head_dim=16, intermediate_size=32, num_experts=8, initializer_range=std,
                                rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0})
    model = _built(HunYuanMoEV1ForCausalLM, config, seed)
    with torch.no_grad():  # q/k norm weights away from 1, so that their place is seen
        for layer in model.model.layers:
            layer.self_attn.query_layernorm.weight.normal_(1.0, 0.3)
            layer.self_attn.key_layernorm.weight.normal_(1.0, 0.3)
    return model


FAMILY_BUILDS = [moe_model, dense_model, olmoe_model, mixtral_model, qwen2_moe_model, glm4_moe_model, deepseek_v3_model,
                 glm4_moe_lite_model, dots1_model, deepseek_v2_model, minimax_m2_model, gpt_oss_model, qwen3_5_moe_model,
                 qwen3_5_model, qwen3_next_model, ernie4_5_moe_model, granitemoe_model,
                 hunyuan_moe_model]
FAMILY_IDS = ["qwen3_moe", "qwen3", "olmoe", "mixtral", "qwen2_moe", "glm4_moe", "deepseek_v3", "glm4_moe_lite", "dots1",
              "deepseek_v2", "minimax_m2", "gpt_oss", "qwen3_5_moe", "qwen3_5", "qwen3_next",
              "ernie4_5_moe", "granitemoe", "hunyuan_v1_moe"]


DENSE = (dense_model, qwen3_5_model)  # no routes to record


def engines(model, **kwargs) -> tuple[NativeEngine, NativeEngine]:
    kwargs.setdefault("half_gemm", "native")  # torch's bf16 kernels: bitwise the transformers forward
    fast = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, **kwargs)
    slow = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, decode_path="transformers", **kwargs)
    assert fast._fast is not None and slow._fast is None
    return fast, slow


def assert_same_completions(a, b) -> None:
    assert [c.completion_ids for c in a] == [c.completion_ids for c in b]
    for x, y in zip(a, b):
        assert torch.equal(x.logp_rollout, y.logp_rollout)  # bitwise, not close
        assert x.finish_reason == y.finish_reason
        assert (x.routes is None) == (y.routes is None)
        if x.routes is not None:
            assert torch.equal(x.routes, y.routes)


@pytest.mark.parametrize(
    "precision,kv_cache", [("fp32", "same"), ("bf16", "same"), ("fp8_e4m3", "same"), ("fp4_e2m1", "fp8_e4m3")]
)
@pytest.mark.parametrize("build", FAMILY_BUILDS, ids=FAMILY_IDS)
def test_engine_samples_bitwise_what_the_transformers_forward_samples(build, precision, kv_cache):
    # std 0.3: a peaked model, so some rows draw EOS early and leave the batch mid-rollout
    model = build(std=0.3)
    kwargs = {"precision": precision, "kv_cache_precision": kv_cache}
    if precision == "fp4_e2m1":
        kwargs["fp4_block_size"] = 16
    fast, slow = engines(model, **kwargs)
    routes = build not in DENSE
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9, seed=5)
    a = fast.generate_ids(PROMPTS, 4, params, record_routes=routes)
    b = slow.generate_ids(PROMPTS, 4, params, record_routes=routes)
    assert_same_completions(a, b)
    lengths = {len(c.completion_ids) for c in a}
    assert len(lengths) > 1, "every row ran to the limit: the row-dropping path was not exercised"


def test_unpadded_prompts_and_scoring_are_bitwise_the_same():
    model = moe_model(std=0.1)
    fast, slow = engines(model)
    prompts = [[3, 4, 5], [6, 7, 8]]  # equal lengths: no mask, SDPA's GQA path
    params = SamplingParams(max_new_tokens=9, seed=1)
    assert_same_completions(fast.generate_ids(prompts, 2, params), slow.generate_ids(prompts, 2, params))
    given = [[9, 10, 11, 12], [13, 14]]
    for x, y in zip(fast.score_ids(prompts, given, params), slow.score_ids(prompts, given, params)):
        assert torch.equal(x, y)


def test_linear_biases_are_applied():
    model = dense_model(std=0.3)
    biased = type(model)._from_config(model.config.__class__(**{**model.config.to_dict(), "attention_bias": True}))
    biased.load_state_dict(model.state_dict(), strict=False)
    head = torch.nn.Linear(biased.config.hidden_size, VOCAB, bias=True)  # a head with a bias, as surgery adds
    with torch.no_grad():
        for linear in [head] + [getattr(layer.self_attn, name) for layer in biased.model.layers
                                for name in ("q_proj", "k_proj", "v_proj", "o_proj")]:
            linear.bias.normal_(0.0, 0.5)
        head.weight.copy_(biased.lm_head.weight)
    biased.lm_head = head
    fast, slow = engines(biased.eval())
    params = SamplingParams(max_new_tokens=12, seed=4)
    assert_same_completions(fast.generate_ids(PROMPTS, 3, params), slow.generate_ids(PROMPTS, 3, params))


def test_step_logits_equal_the_model_forward():
    model = moe_model(std=0.1)
    prompt = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=prompt, cache=cache, use_cache=True)
        static = StaticKVCache.from_transformers(cache, 8)
        token = torch.tensor([11, 12])
        expected = model(input_ids=token[:, None], cache=cache, use_cache=True).logits[:, -1]
    decoder = FastDecoder(model)
    logits, routes = decoder.step(token, torch.tensor([4, 4]), 4, None, static, record_routes=True)
    assert torch.equal(logits, expected)
    assert routes.shape == (2, 2, 2) and routes.dtype == torch.int16
    assert torch.equal(static.keys[0][:, :, 4], cache.layers[0].keys[:, :, 4])  # the column it wrote


def test_weights_loaded_later_are_used():
    model, other = moe_model(seed=0), moe_model(std=0.3, seed=1)
    fast, slow = engines(model)
    for engine in (fast, slow):
        engine.load_weights(other.state_dict())  # the q/k/v concatenation must follow
    params = SamplingParams(max_new_tokens=10, seed=2)
    assert_same_completions(fast.generate_ids(PROMPTS, 2, params), slow.generate_ids(PROMPTS, 2, params))


def test_grouped_matmul_is_bitwise_grouped_mm():
    generator = torch.Generator().manual_seed(0)
    for rows in (1, 3, 40):
        weight = torch.randn(6, 24, 16, generator=generator)
        x = torch.randn(rows, 16, generator=generator)
        experts = torch.randint(0, 6, (rows,), generator=generator).sort().values  # some experts get no row
        counts = torch.bincount(experts, minlength=6)
        expected = F.grouped_mm(x, weight.transpose(-2, -1), offs=torch.cumsum(counts, 0, dtype=torch.int32))
        assert torch.equal(_grouped_matmul(x, weight, _groups(counts.tolist())), expected)
    assert _groups([0, 2, 0, 1]) == [(1, 0, 2), (3, 2, 3)]


def test_other_models_keep_the_transformers_forward():
    config = PhimoeConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    )  # fmt: skip
    phimoe = PhimoeForCausalLM._from_config(config, dtype=torch.float32).eval()
    assert "phimoe" in unsupported_reason(phimoe)
    engine = NativeEngine(phimoe, eos_token_id=EOS, pad_token_id=PAD)
    assert engine._fast is None
    assert len(engine.generate_ids(PROMPTS, 1, SamplingParams(max_new_tokens=4, seed=0))) == 3
    windowed = mixtral_model()  # Mixtral has no use_sliding_window switch: a window is a window
    windowed.config.sliding_window = 32
    assert "sliding-window" in unsupported_reason(windowed)
    clipped = olmoe_model()
    clipped.config.clip_qkv = 8.0
    assert "clip_qkv" in unsupported_reason(clipped)
    shared = qwen2_moe_model()
    shared.model.layers[1].mlp.shared_expert_gate = torch.nn.Linear(64, 1, bias=True)
    assert unsupported_reason(shared) is None  # a bias on the shared gate is still a plain linear
    shared.model.layers[1].mlp.shared_expert.up_proj = torch.nn.Identity()
    assert "shared_expert.up_proj" in unsupported_reason(shared)

    eager = moe_model()
    eager.config._attn_implementation = "eager"
    assert "attention implementation" in unsupported_reason(eager)
    with pytest.raises(ValueError, match="does not support"):
        FastDecoder(eager)
    class Adapter(torch.nn.Linear):  # module surgery the fast path would silently skip (a LoRA-like layer)
        def forward(self, x):
            return super().forward(x) * 2.0

    surgery = moe_model()
    surgery.model.layers[1].self_attn.o_proj = Adapter(64, 64, bias=False)
    assert "layer 1 o_proj" in unsupported_reason(surgery)
    assert NativeEngine(surgery, eos_token_id=EOS, pad_token_id=PAD)._fast is None
    with pytest.raises(ValueError, match="decode_path"):
        NativeEngine(moe_model(), eos_token_id=EOS, pad_token_id=PAD, decode_path="fast")


# ---------------------------------------------------------------- half_gemm="fp32"


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable values of ``a``'s (half) dtype lie between a and b, elementwise (same sign)."""
    as_int = {torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return (a.view(as_int).int() - b.view(as_int).int()).abs()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_gemm_is_a_half_gemm_with_fp32_accumulation(dtype):
    # bf16 x bf16 (and fp16 x fp16) products are exact in fp32, so an fp32 GEMM on the half values,
    # rounded once, is the half GEMM with fp32 accumulation: equal to the exact (fp64) product rounded
    # to the half dtype except where fp32 rounding crosses a half rounding boundary, and at most one
    # unit in the last place from torch's own half kernel (another summation order)
    decoder = FastDecoder(moe_model().to(dtype), half_gemm="fp32")
    assert decoder.fp32_gemm and decoder.layers[0].qkv.dtype == torch.float32
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=generator).to(dtype)
    weight = torch.randn(96, 128, generator=generator).to(dtype)
    bias = torch.randn(96, generator=generator).to(dtype)
    out = decoder._linear(x, weight.float(), bias.float())
    assert out.dtype == dtype
    exact = (x.double() @ weight.double().T + bias.double()).to(dtype)
    native = F.linear(x, weight, bias)
    assert (_ulps_apart(out, exact) <= 1).all() and (out == exact).float().mean() > 0.99
    assert (_ulps_apart(out, native) <= 1).all() and (out == native).float().mean() > 0.99
    rows, counts = torch.randn(10, 128, generator=generator).to(dtype), [0, 4, 6]
    experts = torch.randn(3, 96, 128, generator=generator).to(dtype)
    grouped = decoder._grouped_matmul(rows, experts.float(), _groups(counts))
    assert grouped.dtype == dtype
    expected = torch.cat([rows[:4].double() @ experts[1].double().T, rows[4:].double() @ experts[2].double().T]).to(dtype)
    assert (_ulps_apart(grouped, expected) <= 1).all()
    # an fp32 model has nothing to emulate: the flag is off and the weights are the model's own
    fp32 = FastDecoder(moe_model(), half_gemm="fp32")
    assert not fp32.fp32_gemm and fp32.lm_head is fp32.model.lm_head.weight


@pytest.mark.parametrize("build", FAMILY_BUILDS, ids=FAMILY_IDS)
def test_prefill_matches_the_transformers_forward(build):
    # the fast prefill (used with half_gemm="fp32") on an fp32 model, so only the path is compared:
    # causal + padding mask, positions, RoPE, cache columns, routes at the real tokens
    model = build(std=0.3).eval()
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, decode_path="transformers")
    mask, ids = engine._left_pad(PROMPTS)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    decoder = FastDecoder(model)
    routed = build not in DENSE
    if decoder.hybrid:  # Qwen3.5: its linear attention prefills with the transformers forward, even under fp32 GEMMs
        with pytest.raises(ValueError, match="linear-attention layers prefill with the transformers forward"):
            decoder.prefill(ids, positions, mask, 5)
        return
    logits, cache, routes = decoder.prefill(ids, positions, mask, 5, record_routes=routed)
    expected, expected_routes = engine._forward(ids, mask, positions, engine._new_cache(), routed, logits_to_keep=1)
    hf_cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=hf_cache, use_cache=True)
    torch.testing.assert_close(logits, expected[:, -1], rtol=0, atol=2e-5)
    assert cache.keys[0].shape[2] == ids.shape[1] + 5 and not cache.keys[0][:, :, ids.shape[1]:].any()
    width = ids.shape[1]
    for layer, hf in enumerate(hf_cache.layers):  # a sliding layer (GPT-OSS) keeps its last columns only
        kept = hf.keys.shape[2]
        real = mask[:, None, width - kept:, None]
        for ours, theirs in ((cache.keys[layer], hf.keys), (cache.values[layer], hf.values)):
            torch.testing.assert_close(ours[:, :, width - kept: width] * real, theirs * real, rtol=0, atol=2e-5)
    assert any(hf.keys.shape[2] < width for hf in hf_cache.layers) == (build is gpt_oss_model)
    assert torch.isfinite(cache.keys[-1]).all()  # a pad query that sees no real key: zeros, not NaN
    if routed:
        assert routes.shape == expected_routes.shape and routes.dtype == torch.int16
        assert torch.equal(routes[mask], expected_routes[mask])
    else:
        assert routes is None


@pytest.mark.parametrize("build", FAMILY_BUILDS, ids=FAMILY_IDS)
def test_bf16_engine_with_fp32_gemm_is_close_to_torch_bf16(build):
    # the same bf16 model, torch's bf16 kernels vs fp32 GEMMs on the bf16 values: log-probs of the same
    # completions differ by far less than bf16 differs from fp32 (the mismatch the engine simulates)
    model = build(std=0.3)
    fast = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, precision="bf16", half_gemm="fp32")
    native = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, precision="bf16", half_gemm="native")
    full = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, precision="fp32")
    assert fast._fast.fp32_gemm and not native._fast.fp32_gemm
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=1.0, seed=5)
    sampled = fast.generate_ids(PROMPTS, 4, params, record_routes=build not in DENSE)
    assert len({len(c.completion_ids) for c in sampled}) > 1  # rows left the batch mid-rollout
    assert all(torch.isfinite(c.logp_rollout).all() for c in sampled)
    if build not in DENSE:
        # every token fed through the model has its experts (the last one sampled is never fed: -1)
        assert all(int(c.routes[:-1].min()) >= 0 and bool((c.routes[-1] == -1).all()) for c in sampled)
    prompts = [prompt for prompt in PROMPTS for _ in range(4)]
    completions = [c.completion_ids for c in sampled]
    a, b, c = (torch.cat(e.score_ids(prompts, completions, params)) for e in (fast, native, full))
    assert (a - b).abs().mean() < 0.1 * (b - c).abs().mean()
    assert (a - b).abs().max() < 0.1


def test_half_gemm_auto_follows_the_cpu(monkeypatch):
    import minirl.rollout.native as native_module

    for has_native, expected in ((False, "fp32"), (True, "native")):
        monkeypatch.setattr(native_module, "native_half_gemm", lambda device, has=has_native: has)
        engine = NativeEngine(moe_model(), eos_token_id=EOS, pad_token_id=PAD, precision="bf16")
        assert engine.half_gemm == expected and engine._fast.fp32_gemm is (expected == "fp32")
    fp32 = NativeEngine(moe_model(), eos_token_id=EOS, pad_token_id=PAD)  # nothing to emulate in fp32
    assert not fp32._fast.fp32_gemm
    with pytest.raises(ValueError, match="half_gemm"):
        NativeEngine(moe_model(), eos_token_id=EOS, pad_token_id=PAD, half_gemm="fast")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8_e4m3"])
@pytest.mark.parametrize("build", [moe_model, mixtral_model, deepseek_v3_model], ids=["qwen3_moe", "mixtral", "deepseek_v3"])
def test_device_grouped_mm_experts_are_bitwise_the_per_expert_path(precision, build):
    """The CUDA path of the experts (one grouped GEMM, offsets on the device, no host sync), run on
    the CPU, samples bitwise what the per-expert path samples: tokens, log-probs and routes (top-k weights in the
    model's dtype, or in fp32 as Mixtral's and DeepSeek's routers give them)."""
    model = build(std=0.3)
    loop = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, precision=precision, half_gemm="native")
    grouped = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, precision=precision, half_gemm="native")
    assert loop._fast.grouped_mm is False  # CPU default: unchanged
    grouped._fast.grouped_mm = True
    calls = []
    import minirl.rollout.fast_decode as fast_decode

    original = fast_decode._device_grouped_mm
    fast_decode._device_grouped_mm = lambda *args: calls.append(1) or original(*args)
    try:
        params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=3)
        assert_same_completions(grouped.generate_ids(PROMPTS, 3, params, record_routes=True),
                                loop.generate_ids(PROMPTS, 3, params, record_routes=True))
    finally:
        fast_decode._device_grouped_mm = original
    assert calls  # the grouped path really ran


@pytest.mark.parametrize("q_lora, yarn, interleave", [(False, False, False), (True, False, True), (False, True, False)])
def test_latent_attention_variants_are_bitwise_too(q_lora, yarn, interleave):
    """DeepSeek-V3's attention without a query LoRA, with the default RoPE, with rotate-half pairs (and the rest):
    bitwise the transformers forward in fp32 and bf16, routes and all."""
    for precision in ("fp32", "bf16"):
        fast, slow = engines(deepseek_v3_model(std=0.3, q_lora=q_lora, yarn=yarn, interleave=interleave),
                             precision=precision)
        params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=5)
        assert_same_completions(fast.generate_ids(PROMPTS, 3, params, record_routes=True),
                                slow.generate_ids(PROMPTS, 3, params, record_routes=True))
    model = deepseek_v3_model()
    model.config.num_key_value_heads = 2
    assert "fewer key/value heads" in unsupported_reason(model)
    greedy = deepseek_v2_model(std=0.3, method="greedy")  # DeepSeek-V2's other router: top-k over all experts
    fast, slow = engines(greedy)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=5)
    assert_same_completions(fast.generate_ids(PROMPTS, 3, params, record_routes=True),
                            slow.generate_ids(PROMPTS, 3, params, record_routes=True))


def test_yarn_rope_is_bitwise_for_the_other_families_too():
    """yarn's scaled frequencies and its attention factor on the cos/sin tables (Qwen3's long-context setting)."""
    model = moe_model(std=0.3)
    model.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 64}
    rebuilt = type(model)._from_config(model.config, dtype=torch.float32).eval()
    rebuilt.load_state_dict(model.state_dict())
    assert rebuilt.model.rotary_emb.attention_scaling != 1.0 and unsupported_reason(rebuilt) is None
    fast, slow = engines(rebuilt)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=5)
    assert_same_completions(fast.generate_ids(PROMPTS, 3, params, record_routes=True),
                            slow.generate_ids(PROMPTS, 3, params, record_routes=True))
    rebuilt.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
    assert "RoPE type 'dynamic'" in unsupported_reason(rebuilt)
