"""SAPO (arXiv:2511.20347): hand-computed loss and gradient of the soft gate, GRPO's gradient on policy, the
temperatures by advantage sign, the training–inference factor, and the knob checks."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import LossInputs, grpo_loss, sapo_loss

F64 = torch.float64


def _inputs(logp, logp_old, adv, mask=None, logp_rollout=None):
    logp = torch.tensor(logp, dtype=F64).requires_grad_(True)
    logp_old = torch.tensor(logp_old, dtype=F64)
    mask = torch.ones(logp.shape, dtype=torch.bool) if mask is None else torch.tensor(mask)
    rollout = logp_old if logp_rollout is None else torch.tensor(logp_rollout, dtype=F64)
    return LossInputs(logp, logp_old, rollout, torch.tensor(adv, dtype=F64), mask)


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_one_row_by_hand():
    """Row 0 (A = 1, tau_pos = 1): tokens with r = e^0.2 and r = 1; row 1 (A = -0.5, tau_neg = 1.05): one token
    with r = e^-0.3 and one padding token. loss = -(1/2)(row means); gradient 4 s (1 - s) r A / (|y| N)."""
    x = _inputs([[0.2 - 1.0, -2.0], [-0.3 - 0.5, 0.0]], [[-1.0, -2.0], [-0.5, -9.0]], [1.0, -0.5],
                mask=[[True, True], [True, False]])
    loss, metrics = sapo_loss(x)
    r00, r10 = math.exp(0.2), math.exp(-0.3)
    s00, s01, s10 = sigmoid(r00 - 1), sigmoid(0.0), sigmoid(1.05 * (r10 - 1))
    row0 = (s00 * 4 + s01 * 4) * 1.0 / 2
    row1 = s10 * 4 / 1.05 * -0.5
    assert loss.item() == pytest.approx(-(row0 + row1) / 2, abs=1e-12)
    loss.backward()
    expected = torch.tensor([[-4 * s00 * (1 - s00) * r00 * 1.0 / (2 * 2), -4 * s01 * (1 - s01) * 1.0 / (2 * 2)],
                             [-4 * s10 * (1 - s10) * r10 * -0.5 / (1 * 2), 0.0]], dtype=F64)
    torch.testing.assert_close(x.logp.grad, expected, rtol=0, atol=1e-12)
    assert metrics["clip_frac"].item() == 0.0
    weights = [4 * s00 * (1 - s00), 4 * s01 * (1 - s01), 4 * s10 * (1 - s10)]
    assert metrics["gate_weight_mean"].item() == pytest.approx(sum(weights) / 3, abs=1e-12)


def test_on_policy_the_gradient_is_grpos_and_off_policy_it_is_attenuated_not_cut():
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(4, 5, generator=g, dtype=F64) - 0.1
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0], dtype=F64)
    mask = torch.rand(4, 5, generator=g) > 0.3
    mask[:, 0] = True

    def grads(loss_fn, logp, **knobs):
        logp = logp.clone().requires_grad_(True)
        loss_fn(LossInputs(logp, logp_old, logp_old, adv, mask), **knobs)[0].backward()
        return logp.grad

    torch.testing.assert_close(grads(sapo_loss, logp_old), grads(grpo_loss, logp_old), rtol=0, atol=1e-15)
    far = logp_old + torch.where(adv[:, None] > 0, 0.8, -0.8)  # r = e^±0.8: outside any PPO clip range
    hard, soft = grads(grpo_loss, far), grads(sapo_loss, far)
    assert torch.all(hard[mask] == 0)  # GRPO's clip cuts these tokens
    assert torch.all(soft[mask] != 0)  # SAPO's gate only attenuates them (4 s (1 - s) < 1)


def test_the_negative_temperature_decays_faster():
    up = sapo_loss(_inputs([[0.5]], [[0.0]], [1.0]), tau_pos=1.0)[1]["gate_weight_mean"].item()
    down = sapo_loss(_inputs([[0.5]], [[0.0]], [-1.0]), tau_neg=3.0)[1]["gate_weight_mean"].item()
    r = math.exp(0.5)
    assert up == pytest.approx(4 * sigmoid(r - 1) * (1 - sigmoid(r - 1)), abs=1e-12)
    assert down == pytest.approx(4 * sigmoid(3 * (r - 1)) * (1 - sigmoid(3 * (r - 1))), abs=1e-12) and down < up


def test_is_correction_multiplies_by_the_truncated_train_infer_factor():
    plain = sapo_loss(_inputs([[-1.0]], [[-1.0]], [1.0], logp_rollout=[[-3.0]]))[0].item()
    corrected = sapo_loss(_inputs([[-1.0]], [[-1.0]], [1.0], logp_rollout=[[-3.0]]), is_correction=True, tis_cap=5.0)
    assert plain == pytest.approx(-2.0, abs=1e-12)  # sigma(0) * 4 / 1 * 1
    assert corrected[0].item() == pytest.approx(-2.0 * 5.0, abs=1e-12)  # min(e^2, 5) = 5
    assert corrected[1]["is_truncated_frac"].item() == 1.0


@pytest.mark.parametrize("knob", ["tau_pos", "tau_neg"])
@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan, True])
def test_bad_temperatures_name_the_knob(knob, value):
    with pytest.raises(ValueError, match=f"{knob} must be a finite number > 0"):
        sapo_loss(_inputs([[0.0]], [[0.0]], [1.0]), **{knob: value})
