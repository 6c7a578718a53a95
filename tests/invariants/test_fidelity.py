"""Gradient fidelity on a tiny MoE: exact on-policy, measurably worse under an FP8 engine and staleness.

The paper's claim ([P] §2.3): the token-level surrogate's gradient is the sequence-level gradient
of Eq. (2) to first order, while pi_theta stays close to mu_old. With an fp32 NativeEngine the
rollout policy is the trainer's (logp_rollout = logp_old = logp to ~1e-6), so the residual is 0
and the two gradients coincide; an fp8 engine (a real training–inference mismatch) and
mini-batch staleness both break that, and the diagnostics must show it.
"""

from __future__ import annotations

import copy

import pytest
import torch

from minirl.batching import collate, split
from minirl.config import MiniRLConfig
from minirl.monitor import approximation_metrics, gradient_fidelity
from minirl.objective import make_objective
from minirl.rollout.native import NativeEngine
from minirl.trainer import Trainer
from minirl.types import Batch, SamplingParams
from tests.conftest import make_tiny_moe

PAD, EOS = 0, 1
PROMPTS = [[3, 4, 5, 6, 7], [10, 11, 12], [20, 21, 22, 23], [30, 31]]
G = 4


pytestmark = pytest.mark.usefixtures("one_thread")


def big_moe(scale: float = 5.0) -> torch.nn.Module:
    """The tiny MoE with weight matrices x ``scale`` (std ~0.1): peaked logits, so fp8 rounding matters."""
    model = make_tiny_moe()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.mul_(scale)
    return model


def rollout_batch(model: torch.nn.Module, trainer: Trainer, precision: str) -> Batch:
    """Engine completions (16 tokens at most, ~15 on average) -> Batch with logp_old from ``score``."""
    engine = NativeEngine(model, eos_token_id=EOS, pad_token_id=PAD, precision=precision)
    completions = engine.generate_ids(PROMPTS, G, SamplingParams(max_new_tokens=16, seed=0))
    assert sum(len(c.completion_ids) for c in completions) / len(completions) >= 10
    advantages = torch.randn(len(completions), generator=torch.Generator().manual_seed(0))
    batch = collate(completions, advantages, pad_token_id=PAD)
    batch = batch.with_logp_old(trainer.score(batch, entropy=False).logp)
    return batch


def diagnostics(trainer: Trainer, batch: Batch) -> dict[str, float]:
    return gradient_fidelity(trainer, batch, make_objective(MiniRLConfig(), batch), approximation=True)


def test_fp32_on_policy_is_exact_and_fp8_mismatch_breaks_the_approximation():
    results = {}
    for precision in ("fp32", "fp8_e4m3"):
        model = big_moe()
        trainer = Trainer(model, lr=1e-3, micro_batch_sequences=8)
        batch = rollout_batch(model, trainer, precision)
        results[precision] = diagnostics(trainer, batch)
        if precision == "fp32":  # on-policy: pi_theta = pi_old = mu_old up to float noise
            gap = ((batch.logp_old - batch.logp_rollout).abs() * batch.mask).max()
            assert gap < 1e-5
    fp32, fp8 = results["fp32"], results["fp8_e4m3"]
    assert fp32["residual/total_max"] < 1e-4
    assert fp32["fidelity/grad_cosine"] > 0.999
    assert fp32["fidelity/grad_rel_err"] < 1e-4
    assert abs(fp32["is/ess_seq"] - 1) < 1e-4 and abs(fp32["is/chi2_seq"]) < 1e-4
    # the fp8 engine: measured residual mean ~9e-3 (max ~4e-2), cosine ~0.993, rel. error ~0.14
    assert fp8["residual/total_mean"] > 1e-3 > 100 * fp32["residual/total_mean"]
    assert fp8["residual/train_infer_max"] == pytest.approx(fp8["residual/total_max"], rel=1e-4)  # no staleness yet
    assert fp8["residual/staleness_max"] < 1e-4
    assert fp8["fidelity/grad_cosine"] < 0.999 < fp32["fidelity/grad_cosine"]
    assert fp8["fidelity/grad_rel_err"] > 0.05
    assert fp8["is/ess_seq"] < 0.995 and fp8["is/chi2_token"] > 1e-4


def test_staleness_shows_up_before_the_last_mini_batch():
    # N = 2 mini-batches of one fp32 (exact) rollout: before the first update staleness is 0;
    # one update later the second mini-batch is off-policy and both diagnostics see it
    model = big_moe()
    trainer = Trainer(model, lr=3e-3, micro_batch_sequences=8)
    first, last = split(rollout_batch(model, trainer, "fp32"), 2)
    before = diagnostics(trainer, first)
    trainer.update(first, make_objective(MiniRLConfig(), first))
    after = diagnostics(trainer, last)
    assert before["residual/staleness_max"] < 1e-4 and before["fidelity/grad_cosine"] > 0.999
    # measured: staleness residual mean ~0.1 (max ~0.3), cosine ~0.95, rel. error ~0.3
    assert after["residual/staleness_mean"] > 1e-2
    assert after["residual/train_infer_max"] < 1e-4  # fp32 engine: staleness is all there is
    assert after["fidelity/grad_cosine"] < 0.99


def test_gradient_is_updates_gradient_and_leaves_the_trainer_untouched():
    model = big_moe()
    trainer = Trainer(model, lr=1e-2, micro_batch_sequences=3, grad_clip_norm=1e9)  # no clipping
    batch = rollout_batch(model, trainer, "fp32")
    objective = make_objective(MiniRLConfig(), batch)
    trainer.update(batch, objective)  # an optimizer with state, .grad set, updates_done = 1
    model.eval()
    weights = copy.deepcopy(model.state_dict())
    optimizer = copy.deepcopy(trainer.optimizer.state_dict())
    rng = torch.get_rng_state()

    flat = trainer.gradient(batch, objective)

    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert str(trainer.optimizer.state_dict()) == str(optimizer) and trainer.updates_done == 1
    assert all(p.grad is None for p in model.parameters())
    assert not model.training and torch.equal(torch.get_rng_state(), rng)
    # the same vector update() accumulates into .grad (micro-batches of 3 rows over 16)
    twin = copy.deepcopy(model)
    twin_trainer = Trainer(twin, lr=0.0, micro_batch_sequences=3, grad_clip_norm=1e9)
    twin_trainer.update(batch, objective)
    expected = torch.cat([p.grad.reshape(-1) for p in twin.parameters()])
    assert flat.shape == expected.shape and flat.dtype == torch.float32
    torch.testing.assert_close(flat, expected, rtol=0, atol=0)


def test_fidelity_is_micro_batch_invariant_and_its_logp_is_the_trainers():
    model = big_moe()
    small = Trainer(model, lr=1e-3, micro_batch_sequences=5)  # 16 rows: micro-batches 5, 5, 5, 1
    batch = rollout_batch(model, small, "fp8_e4m3")
    whole = Trainer(model, lr=1e-3, micro_batch_sequences=16)
    a, b = diagnostics(small, batch), diagnostics(whole, batch)
    for key in ("fidelity/grad_cosine", "fidelity/grad_norm_surrogate", "fidelity/grad_norm_seq"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-9), key
    # approximation=True reuses the sequence pass's log-probs: the same as a separate score pass
    separate = approximation_metrics(small.score(batch, entropy=False).logp, batch)
    for key, value in separate.items():
        assert a[key] == pytest.approx(value, rel=1e-3, abs=1e-6), key
    tagged = gradient_fidelity(small, batch, make_objective(MiniRLConfig(), batch), tag="last")
    assert set(tagged) == {"fidelity/last_grad_cosine", "fidelity/last_grad_norm_surrogate",
                           "fidelity/last_grad_norm_seq", "fidelity/last_grad_rel_err"}  # fmt: skip
    assert set(approximation_metrics(batch.logp_old, batch, tag="first")) >= {
        "residual/first_total_mean", "residual/first_staleness_p90", "is/first_ess_seq", "is/first_chi2_token"
    }  # fmt: skip
