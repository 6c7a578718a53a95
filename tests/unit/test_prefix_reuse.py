"""``NativeEngine.keeping_prefixes``: a tool round's continuation feeds only the new tokens on the kept KV cache of the
response so far, and its log-probs equal a whole prefill's (fp32, within rounding); each position keeps the route the
engine recorded when it first fed it (R3 replays the routes behind every turn's log-probs)."""

from __future__ import annotations

import pytest
import torch

from minirl.rollout.native import NativeEngine
from minirl.types import SamplingParams
from tests.unit.test_rollout_native import EOS, PAD, PROMPTS, dense_model, moe_model, trainer_logp

pytestmark = pytest.mark.usefixtures("one_thread")
SUFFIX = [20, 21, 22]  # a tool result's tokens


def _fed(engine: NativeEngine) -> list[tuple[int, int]]:
    """(rows, tokens a row) of each call of the model's forward (prefills; decode steps on the transformers path)."""
    counts: list[tuple[int, int]] = []
    forward = engine.model.forward

    def counted(*args, **kwargs):
        counts.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    engine.model.forward = counted
    return counts


@pytest.mark.parametrize("decode_path", ["auto", "transformers"])
@pytest.mark.parametrize("build", [moe_model, dense_model], ids=["moe", "dense"])
def test_a_continuation_feeds_only_the_new_tokens_with_the_routes_it_first_recorded(build, decode_path) -> None:
    model = build(std=0.5)
    moe = build is moe_model
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    later = SamplingParams(max_new_tokens=5, temperature=1.0, seed=4)
    runs = {}
    for keep in (False, True):
        engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, decode_path=decode_path)
        fed = _fed(engine)
        with engine.keeping_prefixes() if keep else torch.no_grad():
            first = engine.generate_ids(PROMPTS, 2, sampling, record_routes=moe)
            # each response so far and a tool's result; and a prompt kept nowhere, fed whole beside them
            continued = [list(c.prompt_ids) + list(c.completion_ids) + SUFFIX for c in first] + [[30, 31, 32]]
            before = len(fed)
            second = engine.generate_ids(continued, 1, later, record_routes=moe)
            prefills = [rows * tokens for rows, tokens in fed[before:] if tokens > 1]  # decode steps feed one a row
            runs[keep] = (first, second, sum(prefills))
    (first, second, whole), (first_kept, second_kept, fed) = runs[False], runs[True]
    assert [c.completion_ids for c in first] == [c.completion_ids for c in first_kept]
    # the continuation's prefill: only the last sampled token and the results of each row, not the conversation
    assert fed == (len(first) + 1) * (1 + len(SUFFIX)) and whole >= 3 * fed  # one call: the rests, left-padded
    for a, b in zip(second, second_kept, strict=True):
        assert a.completion_ids == b.completion_ids and a.prompt_ids == b.prompt_ids
        torch.testing.assert_close(b.logp_rollout, a.logp_rollout, atol=2e-5, rtol=0)
        torch.testing.assert_close(b.logp_rollout, trainer_logp(model, b), atol=2e-5, rtol=0)
    if moe:  # each earlier position's route: the one recorded while the first call fed it
        for c, again in zip(first_kept, second_kept[:-1], strict=True):
            fed_before = len(c.prompt_ids) + len(c.completion_ids) - 1
            assert torch.equal(again.routes[:fed_before], c.routes[:fed_before])
            assert (again.routes[fed_before:len(again.prompt_ids) + len(again.completion_ids) - 1] >= 0).all()


def test_kept_caches_go_with_new_weights_and_outside_the_context() -> None:
    model = moe_model(std=0.5)
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    sampling = SamplingParams(max_new_tokens=4, seed=1)
    with engine.keeping_prefixes():
        first = engine.generate_ids(PROMPTS[:1], 1, sampling)
        assert engine._prefixes
        engine.load_weights(dict(model.state_dict()))
        assert engine._prefixes == []  # the old weights' caches are of no use
        engine.generate_ids([first[0].prompt_ids + first[0].completion_ids + SUFFIX], 1, sampling)
    assert engine._prefixes is None
    assert NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, kv_cache_precision="fp8_e4m3") \
        .prefix_reuse_reason() == "an fp8 KV cache"


def test_a_call_takes_the_rows_kept_before_it_so_no_more_than_one_calls_caches_are_held() -> None:
    """Each tool round is one call: it takes the rows the call before kept (used or not) and keeps its own."""
    engine = NativeEngine(moe_model(std=0.5), eos_token_id=EOS, pad_token_id=PAD)
    sampling = SamplingParams(max_new_tokens=4, seed=1)
    with engine.keeping_prefixes():
        first = engine.generate_ids(PROMPTS, 2, sampling)
        assert len(engine._prefixes) == 6
        one = first[0]
        engine.generate_ids([one.prompt_ids + one.completion_ids + SUFFIX], 1, sampling)
        assert len(engine._prefixes) == 1  # the five rows not continued are gone with the call
        assert engine._prefixes[0].ids[:len(one.prompt_ids) + len(one.completion_ids) + len(SUFFIX)] == \
            one.prompt_ids + one.completion_ids + SUFFIX


def test_caches_that_cannot_be_cut_by_rows_are_refused() -> None:
    """A sliding-window model (Mistral's window, set without use_sliding_window) keeps only its last columns: its calls
    prefill whole, as before."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128, sliding_window=12)
    model = MistralForCausalLM._from_config(config, dtype=torch.float32).eval()
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    assert engine.prefix_reuse_reason() is not None
    sampling = SamplingParams(max_new_tokens=8, seed=1)
    with engine.keeping_prefixes():
        first = engine.generate_ids([list(range(2, 20))], 1, sampling)
        assert engine._prefixes is None
        engine.generate_ids([first[0].prompt_ids + first[0].completion_ids + SUFFIX], 1, sampling)
