"""The engine's mismatch knobs beyond fp8-e4m3: fp8-e5m2 and block-scaled fp4 weights, an fp8 KV
cache, and the order of the training–inference mismatch they create (fp32 < e4m3 < e5m2 < fp4)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from minirl.batching import collate
from minirl.config import ConfigError, load_config
from minirl.monitor import mismatch_metrics
from minirl.rollout.kv_cache import FP8DynamicCache
from minirl.rollout.native import NativeEngine
from minirl.rollout.precision import fake_quantize_fp4_e2m1, fake_quantize_fp8, fake_quantize_kv
from minirl.runtime import build_engine
from minirl.trainer import Trainer
from minirl.types import SamplingParams
from tests.conftest import make_tiny_moe

PAD, EOS = 0, 1
PROMPTS = [[3, 4, 5, 6, 7, 8], [10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]]  # equal lengths: no mask


def engine(model: torch.nn.Module, **kwargs) -> NativeEngine:
    return NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, **kwargs)


@torch.inference_mode()
def prefill_logits(eng: NativeEngine, cache) -> torch.Tensor:
    ids = torch.tensor(PROMPTS)
    positions = torch.arange(ids.shape[1])[None].expand_as(ids)
    logits, _ = eng._forward(ids, None, positions, cache, record_routes=False)
    return logits


def test_kv_cache_same_is_bitwise_todays_engine():
    model = make_tiny_moe(0)
    default, same = engine(model), engine(model, kv_cache_precision="same")
    assert type(same._new_cache()) is DynamicCache
    sampling = SamplingParams(max_new_tokens=12, seed=0)
    for a, b in zip(default.generate_ids(PROMPTS, 3, sampling), same.generate_ids(PROMPTS, 3, sampling)):
        assert a.completion_ids == b.completion_ids and torch.equal(a.logp_rollout, b.logp_rollout)
    assert torch.equal(prefill_logits(same, same._new_cache()), prefill_logits(default, DynamicCache(config=model.config)))


def test_fp8_kv_cache_rounds_what_it_stores_and_moves_logits_a_little():
    model = make_tiny_moe(0)
    exact = engine(model)
    reference = prefill_logits(exact, exact._new_cache())
    gaps = {}
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        eng = engine(model, kv_cache_precision=fmt)
        cache = eng._new_cache()
        assert isinstance(cache, FP8DynamicCache) and cache.fmt == fmt
        logits = prefill_logits(eng, cache)
        gaps[fmt] = (logits - reference).abs().mean().item()
        assert (logits - reference).abs().max().item() < 3e-2  # measured 5.7e-3 (e4m3), 1.0e-2 (e5m2)
        # what is stored is on the fp8 grid of each (token, head) vector: rounding it again changes nothing
        keys, values = cache.layers[0].keys, cache.layers[0].values
        assert keys.shape == (3, 2, 6, 8)  # [batch, kv heads, tokens, head_dim]
        assert torch.equal(fake_quantize_kv(keys, fmt), keys) and torch.equal(fake_quantize_kv(values, fmt), values)
    # measured mean |dlogit|: e4m3 1.2e-3, e5m2 2.3e-3 (logits of std 0.11 here): small, nonzero, e5m2 coarser
    assert 0 < gaps["fp8_e4m3"] < gaps["fp8_e5m2"] < 5e-3, gaps
    assert gaps["fp8_e5m2"] > 1.5 * gaps["fp8_e4m3"], gaps


def test_fp8_kv_cache_engine_reports_the_logp_of_what_it_sampled():
    model = make_tiny_moe(0)
    sampling = SamplingParams(max_new_tokens=10, seed=0)
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        eng, exact = engine(model, kv_cache_precision=fmt), engine(model)
        completions = eng.generate_ids(PROMPTS, 2, sampling)
        prompts, ids = [c.prompt_ids for c in completions], [c.completion_ids for c in completions]
        for completion, scored, scored_exact in zip(completions, eng.score_ids(prompts, ids, sampling),
                                                    exact.score_ids(prompts, ids, sampling)):  # fmt: skip
            torch.testing.assert_close(completion.logp_rollout, scored, rtol=1e-6, atol=1e-6)
            assert not torch.equal(completion.logp_rollout, scored_exact)


def test_low_precision_engines_quantise_their_weights_once_per_load():
    trainer = make_tiny_moe(0)
    name = "model.layers.0.mlp.experts.down_proj"
    for kwargs, expected in [
        (dict(precision="fp8_e5m2", fp8_scale="per_expert"), lambda w: fake_quantize_fp8(w, "fp8_e5m2", "per_expert")),
        (dict(precision="fp4_e2m1", fp4_block_size=16), lambda w: fake_quantize_fp4_e2m1(w, 16)),
    ]:
        eng = engine(trainer, **kwargs)
        weight = dict(eng.model.named_parameters())[name]
        assert torch.equal(weight, expected(dict(trainer.named_parameters())[name].detach()))
        with torch.no_grad():
            new = {k: v * 1.5 for k, v in trainer.state_dict().items()}
        eng.load_weights(new)
        assert torch.equal(weight, expected(new[name]))  # from the incoming tensor, not re-rounded
        router = dict(eng.model.named_parameters())["model.layers.0.mlp.gate.weight"]
        assert torch.equal(router, new["model.layers.0.mlp.gate.weight"])  # routers stay exact


def test_fp4_block_size_errors():
    model = make_tiny_moe(0)  # every quantised weight has input dimension 32
    with pytest.raises(ValueError, match="does not divide"):
        engine(model, precision="fp4_e2m1", fp4_block_size=24)
    with pytest.raises(ValueError, match="kv_cache_precision"):
        engine(model, kv_cache_precision="int8")

    class Tok:
        eos_token_id, pad_token_id = EOS, PAD

    cfg = load_config(None, ["rollout.precision=fp4_e2m1", "rollout.fp4_block_size=24"])
    with pytest.raises(ConfigError) as err:
        build_engine(cfg, model, Tok())
    message = str(err.value)
    assert message.startswith("rollout.fp4_block_size: 24 does not divide the input dimension 32 of ") and "\n" not in message
    assert "use a divisor of 32" in message
    # the same block size is fine when the engine is not fp4
    build_engine(load_config(None, ["rollout.precision=fp8_e5m2", "rollout.fp4_block_size=24"]), model, Tok())
    for override, expected in [
        ("rollout.fp4_block_size=0", "rollout.fp4_block_size: must be greater than 0"),
        ("rollout.kv_cache_precision=fp4", "rollout.kv_cache_precision: must be 'same', 'fp8_e4m3' or 'fp8_e5m2'"),
        ("rollout.precision=fp6", "rollout.precision: must be"),
    ]:
        with pytest.raises(ConfigError, match=expected):
            load_config(None, [override])


def test_train_infer_kl_grows_fp32_e4m3_e5m2_fp4():
    """On one batch (same prompts, same sampling seed), the loop's ``mismatch/kl_k3`` between each
    engine's logp_rollout and the fp32 trainer's log-probs orders as the formats' precision."""
    model = make_tiny_moe(0).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 48, (6,), generator=g).tolist() for _ in range(8)]
    trainer = Trainer(model, lr=0.0, micro_batch_sequences=64)
    kl = {}
    for precision in ("fp32", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"):
        completions = engine(model, precision=precision).generate_ids(prompts, 4, SamplingParams(max_new_tokens=16, seed=0))
        batch = collate(completions, torch.zeros(len(completions)), pad_token_id=PAD)
        kl[precision] = mismatch_metrics(batch.logp_rollout, trainer.score(batch, entropy=False).logp, batch.mask)["kl_k3"]
    # measured: fp32 6e-15, e4m3 3.1e-6, e5m2 1.2e-5, fp4 3.5e-5 (each step ~3-4x)
    assert kl["fp32"] < 1e-12
    assert 1.5 * kl["fp8_e4m3"] < kl["fp8_e5m2"] and 1.5 * kl["fp8_e5m2"] < kl["fp4_e2m1"], kl
    assert kl["fp8_e4m3"] > 1e-7, kl
