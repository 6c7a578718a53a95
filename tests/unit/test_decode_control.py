"""``DecodeControl`` in ``NativeEngine`` (a partial rollout's step decoded in one call, ``minirl.partial_rollout``):
each row stops at its own budget, and a stop asked every few tokens ends the call with the rows still running cut
where they are; what is kept is what the uncontrolled call samples (per-row streams), on the dynamic decode loop and
on the static buckets (``graph_decode``, eager here) alike. Vowels are stop tokens, so lengths vary."""

from __future__ import annotations

import pytest
import torch

from minirl.config import load_config
from minirl.rollout.base import DecodeControl
from minirl.rollout.native import NativeEngine
from minirl.runtime import build_model
from minirl.types import Prompt, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [Prompt("cab", ""), Prompt("bcd", "")]
SAMPLING = SamplingParams(max_new_tokens=12, seed=5)


def _engine(decode_path: str = "auto") -> NativeEngine:
    model, tokenizer = build_model(load_config(None, ["model.preset=qwen3-moe-tiny"]))
    stops = [tokenizer.eos_token_id, *(tokenizer.convert_tokens_to_ids(c) for c in "aei")]
    return NativeEngine(model, eos_token_id=stops, pad_token_id=tokenizer.pad_token_id, tokenizer=tokenizer,
                        sample_seeding="per_sample", decode_path=decode_path)


def _same_prefix(got, want) -> None:
    """``got`` holds the first tokens of ``want`` with their log-probs (float rounding: a smaller decode batch)."""
    n = len(got.completion_ids)
    assert got.completion_ids == want.completion_ids[:n]
    torch.testing.assert_close(got.logp_rollout, want.logp_rollout[:n], rtol=0, atol=2e-6)


@pytest.mark.parametrize("decode_path", ["auto", "static"])
def test_each_row_stops_at_its_own_budget_with_the_tokens_the_whole_call_samples(decode_path):
    want = _engine().generate(PROMPTS, 3, SAMPLING, record_routes=True)
    budgets = [12, 2, 5, 1, 12, 7]
    got = _engine(decode_path).generate(PROMPTS, 3, SAMPLING, record_routes=True, control=DecodeControl(budgets))
    for a, b, budget in zip(got, want, budgets, strict=True):
        assert len(a.completion_ids) == min(budget, len(b.completion_ids))
        _same_prefix(a, b)
        assert a.finish_reason == (b.finish_reason if len(b.completion_ids) <= budget else "length")
        fed = len(a.prompt_ids) + len(a.completion_ids) - 1  # the last kept token is never fed
        assert torch.equal(a.routes[:fed], b.routes[:fed]) and bool((a.routes[fed:] == -1).all())
    assert {len(c.completion_ids) for c in want} != {12}  # stop tokens end some rows early


@pytest.mark.parametrize("decode_path", ["auto", "static"])
def test_a_stop_asked_every_few_tokens_ends_the_call_with_the_running_rows_cut_there(decode_path):
    want = _engine().generate(PROMPTS, 4, SAMPLING)
    asked: list[list[bool]] = []

    def stop(ended: list[bool]) -> bool:
        asked.append(ended)
        return len(asked) == 2  # after decode step 6

    got = _engine(decode_path).generate(PROMPTS, 4, SAMPLING, control=DecodeControl([12] * 8, stop, check_every_tokens=3))
    assert len(asked) == 2
    for check, ended in enumerate(asked, start=1):  # a row has ended once it holds its last token by then
        assert ended == [len(c.completion_ids) <= 3 * check and c.finish_reason == "eos" for c in want]
    assert any(asked[1]) and not all(asked[1])
    for a, b in zip(got, want, strict=True):
        assert len(a.completion_ids) == min(6, len(b.completion_ids))
        _same_prefix(a, b)
        assert a.finish_reason == ("eos" if b.finish_reason == "eos" and len(b.completion_ids) <= 6 else "length")


def test_a_control_that_does_not_fit_the_call_is_one_line():
    with pytest.raises(ValueError, match=r"^DecodeControl needs one budget >= 1 per row \(4 rows, got 3\)"):
        _engine().generate(PROMPTS, 2, SAMPLING, control=DecodeControl([3, 3, 3]))
