"""``POLICY_LOSSES``: the uniform signature, invariants shared by every objective, and on-policy
cross-checks between objectives (when pi_theta = pi_old every ratio is 1 and the objectives
reduce to known REINFORCE forms, so their gradients must coincide)."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo import POLICY_LOSSES, LossInputs, minirl_loss, to_floats

F64 = torch.float64
NAMES = ["minirl", "grpo", "cispo", "gspo", "sapo", "vespo"]


def _random_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(4, 5, generator=g, dtype=F64) * 2 - 0.1
    mask = torch.rand(4, 5, generator=g) > 0.3
    mask[:, 0] = True  # every row has a trained token
    return {
        "logp": (logp_old + 1e-4 * torch.randn(4, 5, generator=g, dtype=F64)).requires_grad_(True),
        "logp_old": logp_old,
        "logp_rollout": logp_old + 0.2 * torch.randn(4, 5, generator=g, dtype=F64),
        "advantages": torch.tensor([1.0, -0.5, 0.25, -2.0], dtype=F64),
        "mask": mask,
        "group_ids": torch.tensor([0, 0, 1, 1]),
    }


def _args(x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (x["logp"], x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"], x["group_ids"])


def test_registry_names() -> None:
    assert sorted(POLICY_LOSSES) == sorted(NAMES)


def test_minirl_adapter_ignores_group_ids_and_forwards_knobs() -> None:
    x = _random_batch()
    a, ma = POLICY_LOSSES["minirl"](LossInputs(*_args(x)), aggregation="token_mean", tis_placement="train_infer")
    b, mb = minirl_loss(LossInputs(*_args(x)[:5]), aggregation="token_mean", tis_placement="train_infer")
    c, _ = POLICY_LOSSES["minirl"](LossInputs(*_args(x)[:5], torch.tensor([9, 8, 7, 6])), aggregation="token_mean",
                                   tis_placement="train_infer")
    assert a.item() == b.item() == c.item() and ma == mb


@pytest.mark.parametrize("name", NAMES)
def test_unknown_knob_is_a_type_error(name: str) -> None:
    with pytest.raises(TypeError):
        POLICY_LOSSES[name](*_args(_random_batch()), no_such_knob=1)


@pytest.mark.parametrize("name", NAMES)
def test_gradient_only_through_logp_and_zero_on_masked_tokens(name: str) -> None:
    x = _random_batch()
    x["logp_old"].requires_grad_(True)
    x["logp_rollout"].requires_grad_(True)
    x["advantages"].requires_grad_(True)
    knobs = {"is_correction": True} if name in ("grpo", "cispo", "sapo") else {}
    loss, metrics = POLICY_LOSSES[name](LossInputs(*_args(x)), **knobs)
    loss.backward()
    assert x["logp_old"].grad is None and x["logp_rollout"].grad is None and x["advantages"].grad is None
    assert x["logp"].grad is not None
    assert torch.all(x["logp"].grad[~x["mask"]] == 0)
    assert torch.any(x["logp"].grad[x["mask"]] != 0)
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad and math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", NAMES)
def test_padding_garbage_is_harmless(name: str) -> None:
    x = _random_batch()
    clean, clean_m = POLICY_LOSSES[name](LossInputs(*_args(x)))
    pad = ~x["mask"]
    logp = x["logp"].detach().clone()
    logp[pad] = -math.inf
    logp.requires_grad_(True)
    x2 = dict(x, logp=logp, logp_old=x["logp_old"].masked_fill(pad, math.nan), logp_rollout=x["logp_rollout"].masked_fill(pad, math.inf))
    loss, m = POLICY_LOSSES[name](LossInputs(*_args(x2)))
    loss.backward()
    assert loss.item() == pytest.approx(clean.item(), abs=1e-12)
    assert to_floats(m) == pytest.approx(to_floats(clean_m), abs=1e-12)
    assert torch.isfinite(logp.grad).all() and torch.all(logp.grad[pad] == 0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("field", ["logp", "logp_old", "logp_rollout", "advantages"])
def test_nan_raises(name: str, field: str) -> None:
    x = _random_batch()
    t = x[field].detach().clone()
    if field == "advantages":
        t[1] = math.nan
    else:
        t[0, 0] = math.nan  # column 0 is always trained
    x[field] = t
    with pytest.raises(FloatingPointError, match=field):
        POLICY_LOSSES[name](LossInputs(*_args(x)))


@pytest.mark.parametrize("name", NAMES)
def test_empty_mask_gives_zero_loss_and_finite_metrics(name: str) -> None:
    x = _random_batch()
    x["mask"] = torch.zeros(4, 5, dtype=torch.bool)
    loss, m = POLICY_LOSSES[name](LossInputs(*_args(x)))
    loss.backward()
    assert loss.item() == 0.0
    assert torch.all(x["logp"].grad == 0)
    assert all(v == 0.0 for v in m.values()), m


def _on_policy_grad(name: str, **knobs: object) -> torch.Tensor:
    x = _random_batch(seed=3)
    logp = x["logp_old"].clone().requires_grad_(True)
    inputs = LossInputs(logp, x["logp_old"], x["logp_rollout"], x["advantages"], x["mask"], x["group_ids"])
    loss, m = POLICY_LOSSES[name](inputs, **knobs)
    loss.backward()
    assert m["clip_frac"] == 0.0 and m["ratio_old_mean"] == pytest.approx(1.0, abs=1e-12)
    return logp.grad


def test_on_policy_grpo_and_gspo_equal_length_normalised_reinforce() -> None:
    # r = s = 1: GRPO and GSPO both give -(1/B)(1/|y_i|) A_i per token = MiniRL seq_mean without IS
    ref = _on_policy_grad("minirl", aggregation="seq_mean", is_correction=False)
    torch.testing.assert_close(_on_policy_grad("grpo"), ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(_on_policy_grad("gspo"), ref, atol=1e-12, rtol=0)
    # with the train-infer factor: GRPO(is_correction) = MiniRL seq_mean with w = min(pi_old/mu, 5)
    ref_is = _on_policy_grad("minirl", aggregation="seq_mean")
    torch.testing.assert_close(_on_policy_grad("grpo", is_correction=True), ref_is, atol=1e-12, rtol=0)


def test_on_policy_cispo_is_a_per_group_token_mean() -> None:
    x = _random_batch(seed=3)
    got = _on_policy_grad("cispo", is_correction=True)
    # expected: -c A_i / (T_g * number_of_groups), c = min(exp(logp_old - logp_rollout), 5)
    c = torch.exp(x["logp_old"] - x["logp_rollout"]).clamp(max=5.0)
    counts = x["mask"].sum(dim=1).to(F64)
    t_g = torch.stack([counts[:2].sum(), counts[:2].sum(), counts[2:].sum(), counts[2:].sum()])
    expected = -(c * x["advantages"][:, None] * x["mask"]) / (t_g[:, None] * 2)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
