"""The repetition penalty (``rollout.repetition_penalty``; TRL's and verl's ``repetition_penalty``): the logits
Hugging Face's processor gives, applied to every token of the row's prompt and completion so far, and a
``logp_rollout`` of the penalised law on both decode paths."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from minirl.config import load_config
from minirl.loop import evaluate, rollout_sampling
from minirl.rollout.native import NativeEngine
from minirl.rollout.sampling import penalize_repetitions, sample_next, seen_tokens
from minirl.types import SamplingParams
from tests.unit.test_graph_decode import assert_same_samples, pair
from tests.unit.test_rollout_native import EOS, PAD, PROMPTS, dense_model, full_forward_logits, gather, moe_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_penalty_by_hand():
    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0, 3.0]])
    seen = torch.tensor([[True, True, False, True, False]])
    assert penalize_repetitions(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, 0.0, 3.0]]
    # the forced token 0's law at temperature 0.5: logits / 0.5 = [2, -4, 1, 0, 6]
    _, logp = sample_next(logits, 0.5, 1.0, None, forced_tokens=torch.tensor([0]), repetition_penalty=2.0, seen=seen)
    expected = 2.0 - math.log(math.exp(2) + math.exp(-4) + math.exp(1) + 1 + math.exp(6))
    assert logp.item() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="seen tokens"):
        sample_next(logits, 1.0, 1.0, None, repetition_penalty=2.0)


def test_seen_tokens_are_each_rows_prompt():
    seen = seen_tokens([[3, 1, 3], [0, 7, 9]], group=2, vocab=8, device="cpu", spare_rows=1)
    assert seen.shape == (5, 8)
    assert [row.nonzero().squeeze(-1).tolist() for row in seen] == [[1, 3], [1, 3], [0, 7], [0, 7], []]  # 9: no logit


@pytest.mark.parametrize("penalty", [1.3, 0.7], ids=["discourage", "encourage"])
def test_equals_transformers_processor(penalty):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=generator) * 3
    input_ids = torch.randint(0, 50, (4, 12), generator=generator)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(input_ids, logits.clone())
    seen = torch.zeros(4, 50, dtype=torch.bool).scatter(1, input_ids, True)
    assert torch.equal(penalize_repetitions(logits, seen, penalty), expected)


@pytest.mark.parametrize("build", [moe_model, dense_model], ids=["moe", "dense"])
def test_logp_rollout_is_of_the_penalised_law(build):
    """Each completion token's ``logp_rollout`` is Hugging Face's processor on the trainer's logits (prompt and
    completion so far), tempered and top-p truncated: the law the engine drew it from."""
    model = build(std=0.1)
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD)
    temperature, top_p, penalty = 0.8, 0.95, 1.8
    params = SamplingParams(16, temperature, top_p, seed=3, repetition_penalty=penalty)
    completions = engine.generate_ids(PROMPTS, 3, params)
    penalised_somewhere = False
    for completion in completions:
        logits = full_forward_logits(model, completion)
        ids = completion.prompt_ids + completion.completion_ids
        processor = RepetitionPenaltyLogitsProcessor(penalty)
        rows = [processor(torch.tensor([ids[: len(completion.prompt_ids) + t]]), logits[t: t + 1].clone())
                for t in range(len(completion.completion_ids))]
        probs = (torch.cat(rows) / temperature).softmax(-1)
        sorted_probs, order = probs.sort(-1, descending=True)
        nucleus = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, (sorted_probs.cumsum(-1) - sorted_probs) < top_p)
        law = torch.where(nucleus, probs, 0.0)
        law = law / law.sum(-1, keepdim=True)
        torch.testing.assert_close(completion.logp_rollout, gather(law, completion).log(), rtol=0, atol=1e-5)
        plain = (logits / temperature).log_softmax(-1)
        penalised_somewhere |= not torch.allclose(completion.logp_rollout, gather(plain, completion), atol=1e-3)
    assert penalised_somewhere
    scored = engine.score_ids([c.prompt_ids for c in completions], [c.completion_ids for c in completions], params)
    for completion, logp in zip(completions, scored):  # the forced path remembers the forced tokens
        torch.testing.assert_close(logp, completion.logp_rollout, rtol=0, atol=1e-6)


@pytest.mark.parametrize("decode_path", ["dynamic", "static"])
def test_greedy_with_penalty_is_transformers_generate(decode_path):
    model = moe_model(std=0.1)
    engine = pair(model)[decode_path == "static"]
    params = SamplingParams(max_new_tokens=12, temperature=0.0, repetition_penalty=1.6)
    completions = engine.generate_ids(PROMPTS, 1, params)
    unpenalised = engine.generate_ids(PROMPTS, 1, SamplingParams(max_new_tokens=12, temperature=0.0))
    assert [c.completion_ids for c in completions] != [c.completion_ids for c in unpenalised]
    for prompt, completion in zip(PROMPTS, completions):
        with torch.no_grad():
            expected = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, repetition_penalty=1.6,
                                      eos_token_id=[1, 2, 3, 4, 5, 6], pad_token_id=PAD)[0, len(prompt):].tolist()
        assert completion.completion_ids == expected


def test_static_buckets_sample_what_the_dynamic_loop_samples():
    dynamic, static = pair(moe_model(std=0.3))
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=5, repetition_penalty=1.4)
    a, b = dynamic.generate_ids(PROMPTS, 8, params), static.generate_ids(PROMPTS, 8, params)
    assert_same_samples(a, b, atol=1e-5)
    plain = dynamic.generate_ids(PROMPTS, 8, SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=5))
    assert [c.completion_ids for c in plain] != [c.completion_ids for c in a]


def test_the_config_reaches_the_engine(tmp_path, monkeypatch):
    cfg = load_config(None, ["rollout.repetition_penalty=1.2", "eval.repetition_penalty=1.1"])
    assert rollout_sampling(cfg, step=3).repetition_penalty == 1.2
    seen: list[SamplingParams] = []

    class Engine:
        def generate(self, prompts, group, sampling):
            seen.append(sampling)
            return []

    class Task:
        def eval_prompts(self):
            return []

    monkeypatch.setattr("minirl.loop.score_completions", lambda *a: (torch.zeros(0), {}))
    monkeypatch.setattr("minirl.loop.held_out_metrics", lambda *a: {})
    evaluate(Engine(), None, Task(), cfg, step=0)
    assert seen[0].repetition_penalty == 1.1
    with pytest.raises(ValueError, match="repetition_penalty"):
        NativeEngine(dense_model(), eos_token_id=EOS, pad_token_id=PAD).generate_ids(
            PROMPTS, 1, SamplingParams(repetition_penalty=0.0))
