"""NativeEngine: log-probs equal the trainer's, sampling law, stopping, seeds, weights, routes."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from minirl.rollout.base import RolloutEngine
from minirl.rollout.native import NativeEngine
from minirl.types import Completion, Prompt, SamplingParams

VOCAB, PAD, EOS = 64, 0, 1
PROMPTS = [[3, 4, 5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15]]  # unequal lengths: left padding


pytestmark = pytest.mark.usefixtures("one_thread")


def moe_model(std: float = 0.02, seed: int = 0) -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, intermediate_size=128,
        max_position_embeddings=256, initializer_range=std,
    )  # fmt: skip
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM._from_config(config, dtype=torch.float32).eval()


def dense_model(std: float = 0.02, seed: int = 0) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, max_position_embeddings=256, initializer_range=std,
    )  # fmt: skip
    torch.manual_seed(seed)
    return Qwen3ForCausalLM._from_config(config, dtype=torch.float32).eval()


def full_forward_logits(model: torch.nn.Module, completion: Completion) -> torch.Tensor:
    """The trainer's view: one unpadded fp32 forward of prompt + completion; logits [n, V] of the targets."""
    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(completion.prompt_ids) - 1
    return logits[start : start + len(completion.completion_ids)]


def gather(logp: torch.Tensor, completion: Completion) -> torch.Tensor:
    return logp.gather(-1, torch.tensor(completion.completion_ids)[:, None]).squeeze(-1)


def trainer_logp(model: torch.nn.Module, completion: Completion) -> torch.Tensor:
    return gather(full_forward_logits(model, completion).log_softmax(-1), completion)


def mean_abs_gap(model: torch.nn.Module, completions: list[Completion]) -> float:
    gaps = [(trainer_logp(model, c) - c.logp_rollout).abs() for c in completions]
    return torch.cat(gaps).mean().item()


@pytest.mark.parametrize("build", [moe_model, dense_model], ids=["moe", "dense"])
def test_fp32_logp_equals_trainer_full_forward(build):
    model = build()
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    completions = engine.generate_ids(PROMPTS, 3, SamplingParams(max_new_tokens=12, seed=0))
    assert len(completions) == 9
    for completion in completions:
        assert completion.logp_rollout.dtype == torch.float32
        assert completion.logp_rollout.shape == (len(completion.completion_ids),)
        torch.testing.assert_close(completion.logp_rollout, trainer_logp(model, completion), rtol=0, atol=1e-5)


def test_logp_is_of_the_tempered_top_p_law():
    model = moe_model(std=0.1)  # peaked enough that top-p 0.9 really truncates
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    temperature, top_p = 0.7, 0.9
    completions = engine.generate_ids(PROMPTS, 2, SamplingParams(16, temperature, top_p, seed=3))
    truncated = 0
    for completion in completions:
        probs = (full_forward_logits(model, completion) / temperature).softmax(-1)
        sorted_probs, order = probs.sort(-1, descending=True)
        kept_sorted = (sorted_probs.cumsum(-1) - sorted_probs) < top_p  # smallest prefix reaching top_p
        kept = torch.zeros_like(kept_sorted).scatter(-1, order, kept_sorted)
        truncated += int((~kept).sum())
        law = torch.where(kept, probs, 0.0)
        law = law / law.sum(-1, keepdim=True)
        expected = gather(law, completion).log()
        torch.testing.assert_close(completion.logp_rollout, expected, rtol=0, atol=1e-5)
        # and not the untruncated (or untempered) law
        assert not torch.allclose(completion.logp_rollout, gather(probs.log(), completion), atol=1e-4)
    assert truncated > 0


def test_logp_is_of_the_min_p_top_k_top_p_law():
    """All three truncations at once, in vLLM's order: min-p on the tempered law, then top-k, then top-p over the rest."""
    model = moe_model(std=0.1)
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    temperature, top_p, top_k, min_p = 0.8, 0.9, 12, 0.02
    completions = engine.generate_ids(PROMPTS, 2, SamplingParams(16, temperature, top_p, seed=5, top_k=top_k, min_p=min_p))
    dropped = {"min_p": 0, "top_k": 0}
    for completion in completions:
        probs = (full_forward_logits(model, completion) / temperature).softmax(-1)
        kept = probs >= min_p * probs.max(-1, keepdim=True).values
        dropped["min_p"] += int((~kept).sum())
        kth = torch.where(kept, probs, 0.0).topk(top_k, dim=-1).values[:, -1:]
        dropped["top_k"] += int((kept & (probs < kth)).sum())
        kept &= probs >= kth
        law = torch.where(kept, probs, 0.0)
        law = law / law.sum(-1, keepdim=True)
        sorted_law, order = law.sort(-1, descending=True)
        nucleus = torch.zeros_like(kept).scatter(-1, order, (sorted_law.cumsum(-1) - sorted_law) < top_p)
        law = torch.where(nucleus & kept, law, 0.0)
        law = law / law.sum(-1, keepdim=True)
        torch.testing.assert_close(completion.logp_rollout, gather(law, completion).log(), rtol=0, atol=1e-5)
    assert dropped["min_p"] > 0 and dropped["top_k"] > 0  # each truncation did something


@pytest.mark.parametrize("build", [moe_model, dense_model], ids=["moe", "dense"])
def test_temperature_zero_is_transformers_greedy_decoding(build):
    model = build(std=0.1)
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    first = engine.generate_ids(PROMPTS, 1, SamplingParams(max_new_tokens=10, temperature=0.0, seed=0))
    again = engine.generate_ids(PROMPTS, 1, SamplingParams(max_new_tokens=10, temperature=0.0, seed=99))
    for prompt, completion, other in zip(PROMPTS, first, again):
        assert completion.completion_ids == other.completion_ids  # no draw: the seed does not matter
        assert completion.logp_rollout.tolist() == [0.0] * len(completion.completion_ids)  # a point mass
        with torch.no_grad():
            expected = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=EOS,
                                      pad_token_id=PAD)[0, len(prompt):].tolist()
        assert completion.completion_ids == expected


def test_batched_left_padded_equals_unbatched():
    model = moe_model(std=0.1)
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    sampling = SamplingParams(max_new_tokens=12, seed=0)
    completions = engine.generate_ids(PROMPTS, 2, sampling)
    for completion in completions:
        (alone,) = engine.score_ids([completion.prompt_ids], [completion.completion_ids], sampling)
        # within 1e-6, relative to |logp| once above 1 (float32 spacing at 2..4 is 2.4e-7..4.8e-7)
        torch.testing.assert_close(completion.logp_rollout, alone, rtol=1e-6, atol=1e-6)
    # a padded batch scored at once (rows finishing at different steps) agrees too
    batch = engine.score_ids([c.prompt_ids for c in completions], [c.completion_ids for c in completions], sampling)
    for completion, scored in zip(completions, batch):
        torch.testing.assert_close(completion.logp_rollout, scored, rtol=1e-6, atol=1e-6)


def test_lower_precision_engines_differ_measurably():
    model = moe_model(std=0.1)
    sampling = SamplingParams(max_new_tokens=16, seed=0)
    gaps = {}
    for precision, scale in [("fp32", "per_tensor"), ("bf16", "per_tensor"), ("fp8_e4m3", "per_tensor"),
                             ("fp8_e4m3", "per_expert")]:  # fmt: skip
        engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, precision=precision, fp8_scale=scale)
        gaps[precision, scale] = mean_abs_gap(model, engine.generate_ids(PROMPTS, 4, sampling))
    assert gaps["fp32", "per_tensor"] < 1e-5
    assert gaps["bf16", "per_tensor"] > 1e-4
    for scale in ("per_tensor", "per_expert"):
        assert gaps["fp8_e4m3", scale] > 1e-3
        assert gaps["fp8_e4m3", scale] > 2 * gaps["bf16", "per_tensor"]  # measured ratio ~7x


@pytest.mark.parametrize(
    "precision,compute_dtype,dtype",
    [("bf16", None, torch.bfloat16), ("fp16", None, torch.float16), ("fp8_e4m3", "bf16", torch.bfloat16)],
)
def test_engine_holds_its_own_low_precision_copy(precision, compute_dtype, dtype):
    model = moe_model(std=0.1)
    hook = model.model.layers[0].mlp.gate.register_forward_hook(lambda *_: pytest.fail("trainer hook ran"))
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, precision=precision, compute_dtype=compute_dtype)
    assert engine.model is not model
    assert {p.dtype for p in engine.model.parameters()} == {dtype}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert isinstance(engine, RolloutEngine)
    completions = engine.generate_ids(PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=0))  # no trainer hooks
    hook.remove()
    assert 1e-4 < mean_abs_gap(model, completions) < 1.0


def test_seeded_sampling():
    model = moe_model(std=0.1)
    sampling = SamplingParams(max_new_tokens=10, seed=7)

    def tokens(engine: NativeEngine, params: SamplingParams) -> list[list[int]]:
        return [c.completion_ids for c in engine.generate_ids(PROMPTS, 2, params)]

    first = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    second = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    assert tokens(first, sampling) == tokens(second, sampling)  # same seed -> same samples
    other_seed = SamplingParams(max_new_tokens=10, seed=8)
    assert tokens(NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD), other_seed) != tokens(second, sampling)

    # the stream continues across calls; its state restores it exactly
    state = first.get_rng_state()
    next_call = tokens(first, sampling)
    assert next_call != tokens(NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD), sampling)
    first.set_rng_state(state)
    assert tokens(first, sampling) == next_call


def test_eos_stops_a_sequence_and_is_kept():
    bias_model = _with_eos_bias(moe_model(), bias=3.5)  # EOS ~35 % a step: rows stop at varied lengths
    engine = NativeEngine(bias_model, eos_token_id=EOS, pad_token_id=PAD)
    completions = engine.generate_ids(PROMPTS, 4, SamplingParams(max_new_tokens=8, seed=0))
    reasons = {c.finish_reason for c in completions}
    assert reasons == {"eos", "length"}
    for completion in completions:
        ids = completion.completion_ids
        if completion.finish_reason == "eos":
            assert ids[-1] == EOS and EOS not in ids[:-1] and len(ids) <= 8
        else:
            assert len(ids) == 8 and EOS not in ids
        assert len(completion.logp_rollout) == len(ids)
        torch.testing.assert_close(completion.logp_rollout, trainer_logp(bias_model, completion), rtol=0, atol=1e-5)
    lengths = {len(c.completion_ids) for c in completions}
    assert len(lengths) > 2  # rows really left the batch at different steps
    # EOS drawn as the very last allowed token still ends the completion with reason "eos"
    certain = NativeEngine(_with_eos_bias(moe_model(), bias=30.0), eos_token_id=EOS, pad_token_id=PAD)
    for completion in certain.generate_ids(PROMPTS, 2, SamplingParams(max_new_tokens=1, seed=0)):
        assert completion.completion_ids == [EOS] and completion.finish_reason == "eos"


def _with_eos_bias(model: Qwen3MoeForCausalLM, bias: float) -> Qwen3MoeForCausalLM:
    """A copy of ``model`` whose lm_head adds ``bias`` to the EOS logit (through an lm_head bias)."""
    config = model.config
    biased = type(model)._from_config(config, dtype=torch.float32).eval()
    biased.load_state_dict(model.state_dict())
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[EOS] = bias
    biased.lm_head = head
    return biased


def test_grouping_order_and_length_limit():
    model = moe_model()
    engine = NativeEngine(model, eos_token_id=[VOCAB + 5], pad_token_id=PAD)  # an EOS never sampled
    completions = engine.generate_ids(PROMPTS, 3, SamplingParams(max_new_tokens=5, seed=0))
    assert [(c.prompt_index, c.sample_index) for c in completions] == [(p, g) for p in range(3) for g in range(3)]
    for completion in completions:
        assert completion.prompt_ids == PROMPTS[completion.prompt_index]
        assert len(completion.completion_ids) == 5 and completion.finish_reason == "length"
        assert completion.routes is None


def test_load_weights_follows_the_trainer():
    trainer = moe_model(std=0.1, seed=0)
    engine = NativeEngine(trainer, eos_token_id=EOS, pad_token_id=PAD, precision="fp32")
    sampling = SamplingParams(max_new_tokens=8, seed=0)
    before = engine.generate_ids(PROMPTS, 1, sampling)
    new_weights = moe_model(std=0.1, seed=1).state_dict()
    trainer.load_state_dict(new_weights)  # a "global step" later
    assert mean_abs_gap(trainer, before) > 1e-2  # the engine's old log-probs are now stale
    engine.load_weights(trainer.state_dict())
    after = engine.generate_ids(PROMPTS, 2, sampling)
    assert mean_abs_gap(trainer, after) < 1e-5
    with pytest.raises(KeyError):
        engine.load_weights({})


def test_load_weights_reapplies_fp8_once():
    trainer = moe_model(std=0.1)
    fresh = NativeEngine(trainer, eos_token_id=EOS, pad_token_id=PAD, precision="fp8_e4m3", fp8_scale="per_expert")
    reloaded = NativeEngine(moe_model(std=0.1, seed=5), eos_token_id=EOS, pad_token_id=PAD,
                            precision="fp8_e4m3", fp8_scale="per_expert")  # fmt: skip
    reloaded.load_weights(trainer.state_dict())
    for (name, a), (_, b) in zip(fresh.model.named_parameters(), reloaded.model.named_parameters()):
        assert torch.equal(a, b), name
    experts = dict(fresh.model.named_parameters())["model.layers.0.mlp.experts.gate_up_proj"]
    assert not torch.equal(experts, dict(trainer.named_parameters())["model.layers.0.mlp.experts.gate_up_proj"])


def test_sampling_params_are_validated():
    engine = NativeEngine(dense_model(), eos_token_id=EOS, pad_token_id=PAD)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate_ids(PROMPTS, 1, SamplingParams(temperature=-0.5))
    with pytest.raises(ValueError, match="top_p"):
        engine.generate_ids(PROMPTS, 1, SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate_ids([[]], 1, SamplingParams())


def test_text_prompts_use_the_tokenizer():
    from minirl.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip
    model = Qwen3ForCausalLM._from_config(config, dtype=torch.float32).eval()
    engine = NativeEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                          tokenizer=tokenizer)  # fmt: skip
    completions = engine.generate([Prompt("abc", answer=""), Prompt("hello", answer="")], 2, SamplingParams(6))
    assert completions[0].prompt_ids == tokenizer.encode("abc", add_special_tokens=False)
    assert completions[2].prompt_ids == tokenizer.encode("hello", add_special_tokens=False)
    for completion in completions:
        assert completion.text == tokenizer.decode(completion.completion_ids, skip_special_tokens=True)
    with pytest.raises(ValueError, match="tokenizer"):
        NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD).generate([Prompt("a", "")], 1, SamplingParams())


# ------------------------------------------------------------------ routes (R3)


def _check_routes(model: torch.nn.Module, completions: list[Completion]) -> None:
    """Shapes, the -1 row of the never-fed last token, and equality with the trainer's routing."""
    moe = pytest.importorskip("minirl.moe")
    replay = moe.RoutingReplay(model)
    num_layers, top_k = model.config.num_hidden_layers, model.config.num_experts_per_tok
    for completion in completions:
        ids = completion.prompt_ids + completion.completion_ids
        routes = completion.routes
        assert routes.dtype == torch.int16 and routes.shape == (len(ids), num_layers, top_k)
        assert (routes[-1] == -1).all() and (routes[:-1] >= 0).all()
        with replay.record() as recording, torch.no_grad():
            natural_logits = model(input_ids=torch.tensor([ids])).logits
        # fp32 engine: every fed token was routed as the trainer's full forward routes it
        assert torch.equal(routes[:-1], recording.routes[0, :-1])
        # and replaying the engine's routes in the trainer changes nothing
        with replay.replay(routes[None]), torch.no_grad():
            replayed_logits = model(input_ids=torch.tensor([ids])).logits
        torch.testing.assert_close(replayed_logits, natural_logits, rtol=0, atol=0)


def test_routes_align_with_trainer_positions():
    pytest.importorskip("minirl.moe")
    model = _with_eos_bias(moe_model(std=0.1), 2.5)  # rows stop at different steps
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    completions = engine.generate_ids(PROMPTS, 3, SamplingParams(max_new_tokens=8, seed=1), record_routes=True)
    assert {c.finish_reason for c in completions} == {"eos", "length"}
    _check_routes(model, completions)


def test_low_precision_routes_differ_somewhere():
    pytest.importorskip("minirl.moe")
    model = moe_model(std=0.1)
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, precision="fp8_e4m3")
    completions = engine.generate_ids(PROMPTS, 4, SamplingParams(max_new_tokens=16, seed=0), record_routes=True)
    from minirl.moe import RoutingReplay

    replay, differing, total = RoutingReplay(model), 0, 0
    for completion in completions:
        with replay.record() as recording, torch.no_grad():
            model(input_ids=torch.tensor([completion.prompt_ids + completion.completion_ids]))
        engine_sets = completion.routes[:-1].sort(-1).values
        trainer_sets = recording.routes[0, :-1].sort(-1).values
        differing += int((engine_sets != trainer_sets).any(-1).sum())
        total += engine_sets.shape[0] * engine_sets.shape[1]
    assert 0 < differing < 0.5 * total


# ------------------------------------------------------------------ hybrid linear attention (Qwen3.5, Qwen3-Next)


def hybrid_model(std: float = 0.02, seed: int = 0) -> torch.nn.Module:
    """Qwen3.5-MoE: Gated DeltaNet layers (a conv state and a recurrent state per row, no keys) beside gated attention."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention", "linear_attention"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, initializer_range=std,
        max_position_embeddings=256,
    )
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(seed)
    return Qwen3_5MoeForCausalLM._from_config(config, dtype=torch.float32).eval()


def test_linear_attention_states_follow_the_rows():
    # G samples start from copies of their prompt's conv and recurrent states, and rows that stop take theirs along
    # (transformers 5.24's linear-attention cache layers have neither batch method: minirl.rollout.kv_cache)
    model = _with_eos_bias(hybrid_model(std=0.1), 1.5)
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    completions = engine.generate_ids(PROMPTS, 3, SamplingParams(max_new_tokens=10, seed=3), record_routes=True)
    assert len({len(c.completion_ids) for c in completions}) > 1  # rows left the batch mid-rollout
    for completion in completions:  # the decode steps' recurrent rule against the full forward's chunked one: ~2e-6
        torch.testing.assert_close(completion.logp_rollout, trainer_logp(model, completion), rtol=0, atol=1e-5)
    _check_routes(model, completions)


@pytest.mark.parametrize("family", ["qwen3_next", "jamba", "granitemoehybrid", "lfm2_moe", "kimi_linear", "bailing_hybrid",
                                    "minimax"])
def test_every_hybrid_family_samples_what_its_full_forward_scores(family):
    """Mamba, short-conv and linear-attention layers' states through G copies and leaving rows; MiniMax-Text-01 in
    the cache class of its own (``minirl.rollout.kv_cache.OWN_CACHES``)."""
    from tests.unit.test_moe_replay import tiny_model

    model = tiny_model(family).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # peaked enough that the states matter and rows stop at different steps
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.1)
    model = _with_eos_bias(model, 3.0)
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    completions = engine.generate_ids(PROMPTS, 3, SamplingParams(max_new_tokens=8, seed=1))
    assert len({len(c.completion_ids) for c in completions}) > 1
    for completion in completions:
        torch.testing.assert_close(completion.logp_rollout, trainer_logp(model, completion), rtol=0, atol=1e-5)


def test_an_own_cache_has_no_fp8_form():
    from tests.unit.test_moe_replay import tiny_model

    with pytest.raises(ValueError, match=r"rollout\.kv_cache_precision: minimax"):
        NativeEngine(tiny_model("minimax"), eos_token_id=EOS, pad_token_id=PAD, kv_cache_precision="fp8_e4m3")


def test_a_hybrid_layer_moves_its_keys_and_its_states_once():
    # a layer with both attention and linear-attention states (transformers' "hybrid" layer type): its own batch
    # methods (DynamicLayer's) move the keys only; minirl moves the states, and never twice
    from transformers import DynamicCache
    from transformers.cache_utils import LinearAttentionAndFullAttentionLayer, LinearAttentionLayer

    from minirl.rollout.kv_cache import repeat_rows, select_rows

    class Moving(LinearAttentionLayer):  # a layer that moves its own states (as a later transformers may)
        def batch_repeat_interleave(self, repeats):
            self.conv_states[0] = self.conv_states[0].repeat_interleave(repeats, dim=0)
            self.recurrent_states[0] = self.recurrent_states[0].repeat_interleave(repeats, dim=0)

        def batch_select_indices(self, indices):
            self.conv_states[0], self.recurrent_states[0] = self.conv_states[0][indices], self.recurrent_states[0][indices]

    cache = DynamicCache()
    cache.layers = [LinearAttentionAndFullAttentionLayer(), LinearAttentionLayer(), Moving()]
    rows = torch.arange(2.0)[:, None, None, None]  # row r holds r everywhere
    cache.layers[0].update(rows.expand(2, 1, 3, 4).clone(), rows.expand(2, 1, 3, 4).clone())
    for layer in cache.layers:
        layer.update_conv_state(rows[..., 0].expand(2, 5, 4).clone())
        layer.update_recurrent_state(rows.expand(2, 2, 3, 3).clone())
    repeat_rows(cache, 3)
    select_rows(cache, torch.tensor([5, 0, 3]))
    expected = torch.tensor([1.0, 0.0, 1.0])  # rows 0 0 0 1 1 1, then 5, 0, 3
    first = cache.layers[0]
    for tensor in (first.keys, first.values, *(s[0] for layer in cache.layers for s in (layer.conv_states, layer.recurrent_states))):
        assert torch.equal(tensor.flatten(1)[:, 0], expected) and (tensor.flatten(1) == expected[:, None]).all()
