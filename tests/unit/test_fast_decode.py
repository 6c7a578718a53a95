"""The engine's fast decode path is bitwise the transformers forward, and falls back where it is not."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache, OlmoeConfig, OlmoeForCausalLM

from minirl.rollout.fast_decode import FastDecoder, StaticKVCache, _grouped_matmul, _groups, unsupported_reason
from minirl.rollout.native import NativeEngine
from minirl.types import SamplingParams
from tests.unit.test_rollout_native import EOS, PAD, PROMPTS, VOCAB, dense_model, moe_model


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def engines(model, **kwargs) -> tuple[NativeEngine, NativeEngine]:
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
@pytest.mark.parametrize("build", [moe_model, dense_model], ids=["moe", "dense"])
def test_engine_samples_bitwise_what_the_transformers_forward_samples(build, precision, kv_cache):
    # std 0.3: a peaked model, so some rows draw EOS early and leave the batch mid-rollout
    model = build(std=0.3)
    kwargs = {"precision": precision, "kv_cache_precision": kv_cache}
    if precision == "fp4_e2m1":
        kwargs["fp4_block_size"] = 16
    fast, slow = engines(model, **kwargs)
    routes = build is moe_model
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
    config = OlmoeConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=32, num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    )  # fmt: skip
    olmoe = OlmoeForCausalLM._from_config(config, dtype=torch.float32).eval()
    assert "olmoe" in unsupported_reason(olmoe)
    engine = NativeEngine(olmoe, eos_token_id=EOS, pad_token_id=PAD)
    assert engine._fast is None
    assert len(engine.generate_ids(PROMPTS, 1, SamplingParams(max_new_tokens=4, seed=0))) == 3

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
