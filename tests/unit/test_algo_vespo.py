"""VESPO (``minirl.algo.variants.vespo``, arXiv 2602.10693): hand-computed kernel weights and gradient, REINFORCE
on policy, the training–inference factor inside the sequence ratio. (TRL's gradient: ``tests/unit/test_peers.py``.)"""

from __future__ import annotations

import pytest
import torch

from minirl.algo import LossInputs, vespo_loss

LOGP_OLD = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]], dtype=torch.float64)
DELTA = torch.tensor([[0.1, 0.05], [-0.2, 0.7]], dtype=torch.float64)  # logp - logp_old; row 1's second is padding
MASK = torch.tensor([[True, True], [True, False]])
ADV = torch.tensor([1.0, -0.5], dtype=torch.float64)


def _inputs(delta=DELTA, logp_rollout=None):
    logp = (LOGP_OLD + delta).clone().requires_grad_(True)
    rollout = LOGP_OLD.clone() if logp_rollout is None else logp_rollout
    return logp, LossInputs(logp, LOGP_OLD, rollout, ADV, MASK, torch.tensor([0, 0]))


def test_kernel_weights_and_gradient_by_hand():
    # row 0 (A >= 0: k 2, lambda 3): log w = 0.15, phi = exp(3 + 2 x 0.15 - 3 e^0.15) = 0.83068657
    # row 1 (A < 0: k 3, lambda 2): log w = -0.2 (padding left out), phi = exp(2 - 3 x 0.2 - 2 e^-0.2) = 0.78862725
    logp, x = _inputs()
    loss, metrics = vespo_loss(x)
    (grad,) = torch.autograd.grad(loss, logp)  # -phi_i A_i / N, N = 3 trained tokens
    torch.testing.assert_close(grad, torch.tensor([[-0.27689552310377274] * 2, [0.13143787461517917, 0.0]],
                                                  dtype=torch.float64), rtol=0, atol=1e-15)
    phi = torch.tensor([0.8306865693113182, 0.7886272476910751], dtype=torch.float64)
    expected = -(phi[0] * 1.0 * (LOGP_OLD[0] + DELTA[0]).sum() + phi[1] * -0.5 * (LOGP_OLD[1, 0] + DELTA[1, 0])) / 3
    assert float(loss.detach()) == pytest.approx(float(expected), abs=1e-15)
    assert float(metrics["phi_mean"]) == pytest.approx(float((2 * phi[0] + phi[1]) / 3), abs=1e-15)  # token-weighted


def test_on_policy_the_gradient_is_reinforces():
    logp, x = _inputs(delta=torch.zeros_like(DELTA))
    loss, metrics = vespo_loss(x, normalizer=4.0)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, -(ADV[:, None] * MASK) / 4.0, rtol=0, atol=1e-15)
    assert float(metrics["phi_mean"]) == 1.0


def test_the_training_inference_factor_enters_the_sequence_ratio():
    """With ``is_correction`` each token's bounded pi_old/mu_old multiplies w (not the loss): row 0's factors
    e^0.3 and e^-0.1 move its log w from 0.15 to 0.35; a factor masked to 0 sends w to 1e-8 and phi to ~0."""
    rollout = LOGP_OLD - torch.tensor([[0.3, -0.1], [0.0, 0.0]], dtype=torch.float64)
    logp, x = _inputs(logp_rollout=rollout)
    (grad,) = torch.autograd.grad(vespo_loss(x, is_correction=True)[0], logp)
    phi0 = torch.exp(torch.tensor(3 + 2 * 0.35, dtype=torch.float64) - 3 * torch.exp(torch.tensor(0.35, dtype=torch.float64)))
    torch.testing.assert_close(grad[0], -phi0.expand(2) / 3, rtol=0, atol=1e-14)
    logp, x = _inputs(logp_rollout=rollout)
    (grad,) = torch.autograd.grad(vespo_loss(x, is_correction=True, tis_mode="mask", tis_cap=1.2)[0], logp)
    assert grad[0].abs().max() < 1e-12 and grad[1, 0] != 0  # e^0.3 > 1.2 is masked: row 0 weighs ~0


def test_bad_knobs_are_named():
    _, x = _inputs()
    with pytest.raises(ValueError, match=r"lambda_neg must be a finite number >= 0\.0001"):
        vespo_loss(x, lambda_neg=0.0)
