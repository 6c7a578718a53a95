"""Prompts split across engines sample exactly what one engine samples (per-sample seeding)."""

from __future__ import annotations

import pytest
import torch

from minirl.distributed.group import EngineGroup, InProcess, chunk_bounds
from minirl.rollout.native import NativeEngine
from minirl.types import SamplingParams

from ..conftest import make_tiny_moe

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16, 17]]


def _engine(model, seeding="per_sample"):
    return NativeEngine(model, eos_token_id=1, pad_token_id=0, sample_seeding=seeding)


def _same(a, b):
    assert [(c.prompt_index, c.sample_index, c.prompt_ids, c.completion_ids) for c in a] == \
        [(c.prompt_index, c.sample_index, c.prompt_ids, c.completion_ids) for c in b]
    for x, y in zip(a, b):
        assert torch.allclose(x.logp_rollout, y.logp_rollout, atol=1e-6)
        assert torch.equal(x.routes, y.routes)


@pytest.mark.parametrize("engines", [2, 3])
def test_split_across_engines_equals_one_engine(engines):
    model = make_tiny_moe()
    sampling = SamplingParams(max_new_tokens=10, seed=7)
    one = _engine(model)
    whole = [c for c in one.generate_ids(PROMPTS, 3, sampling, record_routes=True)]
    parts = []
    for start, stop in chunk_bounds(len(PROMPTS), engines):  # what EngineGroup sends each engine
        chunk = _engine(model).generate_ids(PROMPTS[start:stop], 3, sampling, record_routes=True, prompt_offset=start)
        parts += [c.__class__(**{**c.__dict__, "prompt_index": c.prompt_index + start}) for c in chunk]
    _same(whole, parts)
    assert len({tuple(c.completion_ids) for c in whole}) > 5  # samples differ across rows


def test_engine_group_generate_matches_one_engine():
    model = make_tiny_moe()
    sampling = SamplingParams(max_new_tokens=10, seed=3)

    class Texts:  # generate() tokenises Prompt.text: a character per id
        def encode(self, text, add_special_tokens=False):
            return [int(t) for t in text.split()]

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    from minirl.types import Prompt

    prompts = [Prompt(text=" ".join(map(str, ids)), answer="") for ids in PROMPTS]
    single = NativeEngine(model, eos_token_id=1, pad_token_id=0, tokenizer=Texts(), sample_seeding="per_sample")
    group = EngineGroup([InProcess(f"engine {i}", NativeEngine(model, eos_token_id=1, pad_token_id=0, tokenizer=Texts(),
                                                               sample_seeding="per_sample")) for i in range(2)])
    _same(single.generate(prompts, 2, sampling, record_routes=True), group.generate(prompts, 2, sampling, record_routes=True))


def test_per_batch_seeding_depends_on_the_split():
    """Why per_sample exists: the batch stream draws every row's noise from one tensor."""
    model = make_tiny_moe()
    sampling = SamplingParams(max_new_tokens=10, seed=7)
    whole = _engine(model, "per_batch").generate_ids(PROMPTS, 3, sampling)
    tail = _engine(model, "per_batch").generate_ids(PROMPTS[2:], 3, sampling)
    assert [c.completion_ids for c in whole[6:]] != [c.completion_ids for c in tail]


def test_chunk_bounds_cover_in_order():
    assert chunk_bounds(5, 2) == [(0, 3), (3, 5)]
    assert chunk_bounds(2, 3) == [(0, 1), (1, 2), (2, 2)]


def test_engines_in_this_process_take_a_partial_rollouts_control_as_one_engine_does():
    """A ``DecodeControl`` (each row's budget, a stop every 2 tokens) across 2 and 3 engines, each in a thread: the
    stop is asked at the same checks with the same ended rows as one engine asks it, and the rows are cut at the same
    tokens; a stop that raises stops every engine and reaches the caller."""
    from minirl.rollout.base import DecodeControl

    model = make_tiny_moe()
    sampling = SamplingParams(max_new_tokens=10, seed=5)
    # 2..10 tokens; the last two prompts' rows 2 tokens, so that the last engine returns before the first check
    budgets = [2 + (3 * row) % 9 for row in range(6)] + [2, 2, 2, 2]

    def controlled(engine):
        asked = []

        def stop(ended):
            asked.append(ended)
            return len(asked) == 3

        done = engine.generate_ids(PROMPTS, 2, sampling, record_routes=True, control=DecodeControl(budgets, stop, 2)) \
            if isinstance(engine, NativeEngine) else _group_ids(engine, sampling, DecodeControl(budgets, stop, 2))
        return done, asked

    one, one_asked = controlled(_engine(model))
    assert len(one_asked) == 3 and any(one_asked[2]) and not all(one_asked[2])
    for engines in (2, 3):
        group = EngineGroup([InProcess(f"engine {i}", _engine(model)) for i in range(engines)])
        assert group.continues_in_call
        many, many_asked = controlled(group)
        assert many_asked == one_asked
        _same(one, many)

    def failing(ended):
        raise ValueError("the pool's stop failed")

    group = EngineGroup([InProcess(f"engine {i}", _engine(model)) for i in range(2)])
    with pytest.raises(ValueError, match="the pool's stop failed"):
        _group_ids(group, sampling, DecodeControl(budgets, failing, 2))
    assert not EngineGroup([InProcess("engine", object())]).continues_in_call
    # budgets alone (task.tools' continuations): each engine decodes each of its rows to the row's own budget
    group = EngineGroup([InProcess(f"engine {i}", _engine(model)) for i in range(2)])
    one = _engine(model).generate_ids(PROMPTS, 2, sampling, control=DecodeControl(budgets))
    many = _group_ids(group, sampling, DecodeControl(budgets))
    assert [len(c.completion_ids) for c in many] == [len(c.completion_ids) for c in one]
    assert all(len(c.completion_ids) <= budget for c, budget in zip(many, budgets))
    assert any(len(c.completion_ids) < sampling.max_new_tokens for c in many if c.finish_reason == "length")


def _group_ids(group, sampling, control):
    """``EngineGroup.generate`` on ``PROMPTS`` as token-id prompts (its engines tokenise ``Prompt.text``)."""
    from minirl.types import Prompt

    class Texts:
        def encode(self, text, add_special_tokens=False):
            return [int(t) for t in text.split()]

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    for engine in group.engines:
        engine.target.tokenizer = Texts()
    prompts = [Prompt(text=" ".join(map(str, ids)), answer="") for ids in PROMPTS]
    return group.generate(prompts, 2, sampling, record_routes=True, control=control)
