"""One sampling step: the law sampled from (temperature, top-p) and the log-prob reported for it."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.rollout.sampling import sample_next, validate_sampling

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def test_top_p_keeps_the_smallest_prefix_reaching_p_and_renormalises():
    logits = PROBS.log()[None].expand(4, 4)
    tokens = torch.arange(4)
    # top_p 0.7: mass before tokens = 0, .5, .8, .95 -> keep {0, 1}, renormalised over 0.8
    _, logp = sample_next(logits, 1.0, 0.7, None, forced_tokens=tokens)
    assert logp[:2].tolist() == pytest.approx([math.log(0.5 / 0.8), math.log(0.3 / 0.8)], abs=1e-6)
    assert torch.isinf(logp[2:]).all() and (logp[2:] < 0).all()
    # top_p 0.8 exactly: token 2's mass-before is 0.8, not below 0.8 -> dropped as well
    _, logp = sample_next(logits, 1.0, 0.81, None, forced_tokens=tokens)
    assert logp[:3].tolist() == pytest.approx([math.log(p / 0.95) for p in (0.5, 0.3, 0.15)], abs=1e-6)
    # a tiny top_p still keeps the most likely token, with probability 1
    _, logp = sample_next(logits, 1.0, 1e-6, None, forced_tokens=tokens)
    assert logp[0].item() == pytest.approx(0.0, abs=1e-6)


def test_temperature_then_top_p():
    logits = PROBS.log()[None].expand(4, 4)
    tempered = (PROBS.log() / 0.5).softmax(-1)  # sharper: [.7, .25, .06, .007]
    _, logp = sample_next(logits, 0.5, 1.0, None, forced_tokens=torch.arange(4))
    torch.testing.assert_close(logp, tempered.log(), rtol=0, atol=1e-6)
    _, logp = sample_next(logits, 0.5, 0.9, None, forced_tokens=torch.arange(4))  # keeps {0, 1}
    kept = tempered[:2] / tempered[:2].sum()
    torch.testing.assert_close(logp[:2], kept.log(), rtol=0, atol=1e-6)


def test_draws_follow_the_truncated_law_and_report_its_logp():
    generator = torch.Generator().manual_seed(0)
    rows = 40_000
    logits = PROBS.log()[None].expand(rows, 4)
    tokens, logp = sample_next(logits, 1.0, 0.9, generator)  # nucleus {0, 1, 2}, mass 0.95
    law = torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95
    frequencies = torch.bincount(tokens, minlength=4).float() / rows
    torch.testing.assert_close(frequencies, law, rtol=0, atol=0.01)  # ~4 standard errors
    torch.testing.assert_close(logp, law[tokens].log(), rtol=0, atol=1e-6)


def test_same_generator_state_same_draws():
    logits = torch.randn(8, 50)
    a = sample_next(logits, 0.8, 0.95, torch.Generator().manual_seed(3))[0]
    b = sample_next(logits, 0.8, 0.95, torch.Generator().manual_seed(3))[0]
    c = sample_next(logits, 0.8, 0.95, torch.Generator().manual_seed(4))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_half_precision_logits_are_scored_in_fp32():
    logits = torch.randn(3, 10).to(torch.bfloat16)
    tokens, logp = sample_next(logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, logits.float().log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1))


def test_min_p_and_top_k_truncate_the_law_and_renormalise():
    logits = PROBS.log()[None].expand(4, 4)
    tokens = torch.arange(4)
    # top_k 2: {0, 1}, over 0.8
    _, logp = sample_next(logits, 1.0, 1.0, None, forced_tokens=tokens, top_k=2)
    assert logp[:2].tolist() == pytest.approx([math.log(0.5 / 0.8), math.log(0.3 / 0.8)], abs=1e-6)
    assert torch.isinf(logp[2:]).all()
    # min_p 0.25: below 0.25 x 0.5 = 0.125 goes (token 3, p 0.05); over 0.95
    _, logp = sample_next(logits, 1.0, 1.0, None, forced_tokens=tokens, min_p=0.25)
    assert logp[:3].tolist() == pytest.approx([math.log(p / 0.95) for p in (0.5, 0.3, 0.15)], abs=1e-6)
    assert torch.isinf(logp[3])
    # min_p is relative to the *tempered* law: at temperature 0.5, p ∝ p^2 (0.25, 0.09, 0.0225, 0.0025) / 0.365
    _, logp = sample_next(logits, 0.5, 1.0, None, forced_tokens=tokens, min_p=0.25)  # threshold 0.0625 of the top
    assert logp[:2].tolist() == pytest.approx([math.log(0.25 / 0.34), math.log(0.09 / 0.34)], abs=1e-6)
    assert torch.isinf(logp[2:]).all()
    # a tie at the k-th value is kept (a threshold on the logit, as vLLM's)
    ties = torch.tensor([0.4, 0.3, 0.15, 0.15]).log()[None].expand(4, 4)
    _, logp = sample_next(ties, 1.0, 1.0, None, forced_tokens=tokens, top_k=3)
    assert torch.isfinite(logp).all()


def test_top_p_is_taken_after_top_k_over_what_is_left():
    """vLLM's order: top-k, then top-p over the renormalised rest. Here the order matters."""
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()[None].expand(4, 4)
    # after top_k 3: 0.444, 0.333, 0.222; top_p 0.75 drops token 2 (mass before it 0.777);
    # top-p first would keep it (mass before it 0.7)
    _, logp = sample_next(logits, 1.0, 0.75, None, forced_tokens=torch.arange(4), top_k=3)
    assert logp[:2].tolist() == pytest.approx([math.log(0.4 / 0.7), math.log(0.3 / 0.7)], abs=1e-6)
    assert torch.isinf(logp[2:]).all()
    draws = torch.stack([sample_next(logits, 1.0, 0.75, torch.Generator().manual_seed(s), top_k=3)[0]
                         for s in range(50)])
    assert set(draws.flatten().tolist()) == {0, 1}  # only what the law keeps is ever drawn


def test_temperature_zero_is_greedy_with_a_point_mass_logp():
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0], [3.0, 0.0, 1.0, 2.9]])
    tokens, logp = sample_next(logits, 0.0, 0.5, torch.Generator().manual_seed(0))
    assert tokens.tolist() == [1, 0] and logp.tolist() == [0.0, 0.0]  # a tie goes to the lowest id
    _, forced = sample_next(logits, 0.0, 1.0, None, forced_tokens=torch.tensor([1, 3]))
    assert forced[0].item() == 0.0 and forced[1].item() == float("-inf")
    validate_sampling(0.0, 1.0)  # allowed: evaluation is where the config lets it in


@pytest.mark.parametrize("temperature,top_p,top_k,min_p", [(-1.0, 1.0, 0, 0.0), (1.0, 0.0, 0, 0.0), (1.0, 1.5, 0, 0.0),
                                                         (1.0, 1.0, -1, 0.0), (1.0, 1.0, 0, 1.0), (1.0, 1.0, 0, -0.1)])
def test_invalid_sampling_params(temperature, top_p, top_k, min_p):
    with pytest.raises(ValueError):
        validate_sampling(temperature, top_p, top_k, min_p)
