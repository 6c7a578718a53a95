"""Stop strings inside the decode loop (``minirl.rollout.stop_strings``): a response that has written one leaves the
batch at once; it keeps exactly the tokens the cut after the call keeps."""

from __future__ import annotations

import pytest
import torch

from minirl.config import load_config
from minirl.rollout.native import NativeEngine
from minirl.runtime import build_model
from minirl.types import Prompt, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")
STOPS = ("a", "e", "i", "o", "u", "xy")


def _engine(stops=STOPS) -> tuple[NativeEngine, list[int]]:
    model, tokenizer = build_model(load_config(None, ["model.preset=qwen3-moe-tiny"]))
    engine = NativeEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                          tokenizer=tokenizer, stop_strings=stops, sample_seeding="per_sample")
    steps: list[int] = []
    step = engine._step

    def counted(tokens, *args, **kwargs):
        steps.append(tokens.shape[0])  # rows decoded in this step
        return step(tokens, *args, **kwargs)

    engine._step = counted  # type: ignore[method-assign]
    return engine, steps


def test_a_row_that_writes_a_stop_string_stops_decoding_and_keeps_the_same_tokens():
    """Per-row sampling streams: the completions (tokens, finish reasons, routes; log-probs to float rounding, the
    batch of the rows still running being smaller, as when a row draws a stop token) are those of the engine that
    cut them only after the call, and the rows decoded are fewer."""
    prompts = [Prompt("cab", ""), Prompt("bcd", "")]
    sampling = SamplingParams(max_new_tokens=40, seed=3)
    engine, steps = _engine()
    got = engine.generate(prompts, 8, sampling, record_routes=True)
    late, late_steps = _engine()
    late._stops = lambda vocab: None  # type: ignore[method-assign]  # stop strings cut after the call only
    want = late.generate(prompts, 8, sampling, record_routes=True)
    assert [c.completion_ids for c in got] == [c.completion_ids for c in want]
    for a, b in zip(got, want):
        torch.testing.assert_close(a.logp_rollout, b.logp_rollout, rtol=0, atol=2e-6)
        assert torch.equal(a.routes, b.routes) and a.finish_reason == b.finish_reason
    # each row decoded until its stop (its last token never fed), where the other engine ran most rows to the limit
    assert sum(steps) == sum(len(c.completion_ids) - 1 for c in got) < sum(late_steps) / 2
    lengths = [len(c.completion_ids) for c in got]
    assert len(set(lengths)) > 3


def test_a_stop_string_over_two_tokens_ends_the_row_at_its_last_token():
    """"xy": the row whose response has just written "y" after "x" stops; "yx" does not, nor "x" alone."""
    engine, _ = _engine(("xy",))
    x, y = (engine.tokenizer.convert_tokens_to_ids(c) for c in "xy")
    check = engine._stops(engine.model.config.vocab_size)
    tokens = torch.tensor([[x, y, 5], [y, x, 5]])
    assert check.hit(tokens, torch.tensor([0, 1]), 1, tokens[:, 1]).tolist() == [True, False]
    assert check.hit(tokens, torch.tensor([0, 1]), 0, tokens[:, 0]).tolist() == [False, False]
    assert check.hit(tokens, torch.tensor([1]), 1, tokens[1:, 1]).tolist() == [False]  # rows: the running ones
