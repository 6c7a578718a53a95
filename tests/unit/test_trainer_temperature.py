"""The trainer scores at the rollout temperature (``optim.score_at_rollout_temperature``, as TRL, verl and slime
do): its log-probs and entropies are of logits / T, the law the engine samples, so with an fp32 engine the
training-inference gap is zero at any temperature; off, they are of the raw logits and the gap is the temperature's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minirl.batching import collate
from minirl.config import load_config
from minirl.reference import Reference
from minirl.rollout.native import NativeEngine
from minirl.runtime import build_trainer
from minirl.trainer import Trainer
from minirl.types import SamplingParams
from tests.conftest import make_tiny_moe
from tests.unit.test_trainer_precision import PAD, batch_of

pytestmark = pytest.mark.usefixtures("one_thread")


def test_log_probs_and_entropies_are_of_the_tempered_law():
    """By hand on a 3-token vocabulary: logits (2, 0, -1) at T = 0.5 are (4, 0, -2), so log pi(token 0) =
    4 - log(e^4 + 1 + e^-2) = -0.0205811 and the entropy, -sum p log p over (0.97963, 0.01794, 0.00243),
    is 0.1069208."""
    logits = torch.tensor([2.0, 0.0, -1.0])

    class Fixed(torch.nn.Module):  # the LM head replaced: the logits are (2, 0, -1) at every position
        def forward(self, hidden):
            return logits.expand(*hidden.shape[:-1], 3).clone()

    model = make_tiny_moe(0)
    model.lm_head = Fixed()
    batch = dataclasses.replace(batch_of(2), input_ids=torch.zeros_like(batch_of(2).input_ids))  # every target: token 0
    scored = Trainer(model, lr=0.0, logits_temperature=0.5).score(batch)
    on = scored.logp[batch.mask]
    torch.testing.assert_close(on, torch.full_like(on, -0.0205811), rtol=0, atol=1e-6)
    torch.testing.assert_close(scored.entropy[batch.mask], torch.full_like(on, 0.1069208), rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked-head"])
def test_an_fp32_engine_and_the_trainer_agree_at_a_temperature_below_one(chunked):
    """The engine's logp_rollout (fp32, T = 0.7, no truncation) and the trainer's scores of the same completions:
    equal to float rounding when the trainer divides by T (the whole logits or the chunked head), a gap of the
    temperature's size when it does not."""
    model = make_tiny_moe(3).eval()
    engine = NativeEngine(model, eos_token_id=1, pad_token_id=PAD, precision="fp32")
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13]]
    completions = engine.generate_ids(prompts, 3, SamplingParams(max_new_tokens=10, temperature=0.7, seed=1))
    batch = collate(completions, torch.zeros(len(completions)), pad_token_id=PAD)
    chunk = {"logprob_chunk_tokens": 5} if chunked else {}
    tempered = Trainer(model, lr=0.0, logits_temperature=0.7, **chunk).score(batch).logp
    raw = Trainer(model, lr=0.0, **chunk).score(batch).logp
    gap_tempered = (tempered - batch.logp_rollout)[batch.mask].abs().max()
    gap_raw = (raw - batch.logp_rollout)[batch.mask].abs().max()
    assert gap_tempered < 2e-5, gap_tempered
    assert gap_raw > 0.05, gap_raw


def test_the_run_passes_the_rollout_temperature_and_sft_does_not():
    model = make_tiny_moe(0)
    cfg = load_config(None, ["rollout.temperature=0.6"])
    assert build_trainer(cfg, model, None).logits_temperature == 0.6
    off = load_config(None, ["rollout.temperature=0.6", "optim.score_at_rollout_temperature=false"])
    assert build_trainer(off, model, None).logits_temperature == 1.0
    assert build_trainer(cfg, model, None, deterministic=False, logits_temperature=1.0).logits_temperature == 1.0
    assert Reference(build_trainer(cfg, model, None)).frozen.logits_temperature == 0.6  # the reference's KL terms too
    with pytest.raises(ValueError, match="positive"):
        Trainer(model, lr=0.0, logits_temperature=0.0)


def test_at_temperature_one_nothing_changes_bitwise():
    model = make_tiny_moe(1)
    batch = batch_of(4)
    assert torch.equal(Trainer(model, lr=0.0).score(batch).logp, Trainer(model, lr=0.0, logits_temperature=1.0).score(batch).logp)
