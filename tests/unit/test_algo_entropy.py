"""The entropy bonus (``algo.entropy_coef``; ``minirl.algo.variants.entropy``): hand-computed values, its gradient
through the trainer equal to verl's / TRL's ``loss - coef * token-mean entropy`` written out, and the
config wiring (off by default: the objective is the policy loss itself)."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.algo.logprobs import token_entropy_with_grad, token_logprobs
from minirl.algo.variants.entropy import entropy_bonus_loss
from minirl.config import load_config
from minirl.monitor.mismatch import token_entropy
from minirl.objective import EntropyBonus, with_entropy_bonus
from minirl.trainer import Trainer
from tests.conftest import make_tiny_moe
from tests.unit.test_trainer_precision import batch_of


def test_entropy_of_hand_made_distributions():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0],  # uniform over 4: log 4
                            [0.0, 0.0, -math.inf, -math.inf],  # uniform over 2, two impossible entries: log 2
                            [math.log(3.0), 0.0, -math.inf, -math.inf]]])  # p = (3/4, 1/4)
    h = token_entropy_with_grad(logits)
    expected = torch.tensor([[math.log(4), math.log(2), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]])
    torch.testing.assert_close(h, expected, rtol=0, atol=1e-6)
    random = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(token_entropy_with_grad(random), token_entropy(random), rtol=0, atol=1e-6)


def test_entropy_gradient_is_the_analytic_one():
    """dH/dz_i = -p_i (log p_i + H), checked in float64 against autograd and by finite differences."""
    z = torch.randn(1, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    token_entropy_with_grad(z).sum().backward()
    p = torch.softmax(z.detach(), -1)
    h = -(p * p.log()).sum(-1, keepdim=True)
    torch.testing.assert_close(z.grad, -p * (p.log() + h), rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(token_entropy_with_grad, (z.detach().clone().requires_grad_(True),))


def test_bonus_by_hand():
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[True, False], [True, True]])
    loss, metrics = entropy_bonus_loss(entropy, mask, entropy_coef=0.1, normalizer=3.0)
    assert loss.item() == pytest.approx(-0.1 * (1 + 3 + 4) / 3, abs=1e-7)
    assert metrics["entropy"].item() == pytest.approx(8 / 3, abs=1e-6)
    loss, _ = entropy_bonus_loss(entropy, mask, entropy_coef=0.1, normalizer=6.0)  # a mini-batch of 6 tokens
    assert loss.item() == pytest.approx(-0.1 * 8 / 6, abs=1e-7)
    with pytest.raises(ValueError, match="normalizer must be > 0"):
        entropy_bonus_loss(entropy, mask, entropy_coef=0.1, normalizer=0.0)
    with pytest.raises(ValueError, match="entropy shape"):
        entropy_bonus_loss(entropy[:, :1], mask, entropy_coef=0.1, normalizer=1.0)


def _policy(logp, micro):  # a REINFORCE term, so the bonus is added to something
    return -(logp * micro.advantages[:, None] * micro.mask).sum() / micro.size, {}


@pytest.mark.parametrize("micro_rows", [6, 2])
def test_trainer_gradient_is_the_peers_loss_minus_coef_times_token_mean_entropy(micro_rows):
    """verl (``policy_loss = pg_loss - entropy_coeff * agg_loss(entropy, token-mean)``) and TRL
    (``loss - entropy_coef * (H * mask).sum() / mask.sum()``) on one mini-batch, written out on the model's
    own logits; micro-batches of 2 rows add up to the same gradient."""
    batch, coef = batch_of(), 0.05
    model = make_tiny_moe(0)
    tokens = float(batch.mask.sum())

    def peers(logp, micro):
        return -(logp * micro.advantages[:, None] * micro.mask).sum() / batch.size, {}

    bonus = EntropyBonus(peers, coef, tokens)
    ours = Trainer(model, lr=0.0, micro_batch_sequences=micro_rows).gradient(batch, bonus)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=batch.input_ids, use_cache=False).logits[:, :-1].float()
    logp = token_logprobs(logits, batch.input_ids[:, 1:])
    entropy = token_entropy_with_grad(logits)
    mask = batch.mask.to(logits.dtype)
    loss = peers(logp, batch)[0] - coef * (entropy * mask).sum() / mask.sum()
    loss.backward()
    theirs = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])
    without = Trainer(model, lr=0.0).gradient(batch, peers)
    assert float((ours - without).abs().max()) > 1e-4  # the bonus moves the gradient
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)


def test_update_reports_pi_thetas_entropy_and_off_is_the_policy_loss_itself():
    batch = batch_of()
    cfg = load_config(None, ["algo.entropy_coef=0.01"])
    objective = with_entropy_bonus(cfg.algo, batch, _policy)
    assert isinstance(objective, EntropyBonus) and objective.normalizer == float(batch.mask.sum())
    assert with_entropy_bonus(load_config(None).algo, batch, _policy) is _policy
    model = make_tiny_moe(0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, use_cache=False).logits[:, :-1].float()
    expected = float((token_entropy(logits) * batch.mask).sum() / batch.mask.sum())
    result = Trainer(model, lr=1e-4).update(batch.with_logp_old(torch.zeros(batch.mask.shape)), objective)
    assert result.fault is None
    assert result.metrics["entropy"] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="needs the forward's entropy"):
        objective(torch.zeros(batch.mask.shape), batch)


def test_high_entropy_tokens_by_hand():
    """Trained tokens' entropies 1, 2, 3, 4, 5 (the padding's 9 is ignored): the 0.6 quantile (top 40 %) of them is
    1 + 0.6 x 4 = 3.4, so the tokens of entropy 4 and 5 keep their term."""
    from minirl.algo.variants.entropy import high_entropy_tokens

    entropy = torch.tensor([[1.0, 4.0, 9.0], [2.0, 5.0, 3.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert high_entropy_tokens(entropy, mask, 0.4).tolist() == [[False, True, False], [False, True, False]]
    assert high_entropy_tokens(entropy, mask, 1.0).tolist() == mask.tolist()  # quantile 0: every trained token
    assert not high_entropy_tokens(entropy, torch.zeros_like(mask), 0.4).any()  # no trained token: none kept
    with pytest.raises(ValueError, match=r"quantile must be in \(0, 1\]"):
        high_entropy_tokens(entropy, mask, 0.0)


@pytest.mark.parametrize("name", ["minirl", "grpo", "cispo", "sapo"])
def test_token_keep_drops_terms_not_denominators(name):
    """A token outside ``token_keep`` has no gradient; the others' gradients are unchanged (the denominators still
    count it); GSPO has no per-token term and refuses."""
    from minirl.algo import POLICY_LOSSES, LossInputs

    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(4, 5, generator=g, dtype=torch.float64) - 0.1
    logp = logp_old + 0.05 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, 3:] = False
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0], dtype=torch.float64)
    keep = torch.rand(4, 5, generator=g) > 0.4

    def grad(token_keep):
        x = logp.clone().requires_grad_(True)
        POLICY_LOSSES[name](LossInputs(x, logp_old, logp_old, adv, mask, torch.tensor([0, 0, 1, 1]),
                                       token_keep=token_keep))[0].backward()
        return x.grad

    full, kept = grad(None), grad(keep)
    assert torch.all(kept[mask & ~keep] == 0) and torch.any(full[mask & ~keep] != 0)
    torch.testing.assert_close(kept[mask & keep], full[mask & keep], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="token_keep / advantages \\[B, T\\]: GSPO weighs whole responses"):
        POLICY_LOSSES["gspo"](LossInputs(logp, logp_old, logp_old, adv, mask, token_keep=keep))
    with pytest.raises(ValueError, match="token_keep must be a bool tensor"):
        LossInputs(logp, logp_old, logp_old, adv, mask, token_keep=keep.float())


def test_adaptive_entropy_coefficient_follows_trls_controller():
    """Skywork-OR1's rule as TRL 1.16's ``_compute_loss`` runs it, one optimizer step per update: the coefficient an
    update applies (0 while the last entropy was above the target, the first update included) and the one it leaves."""
    from minirl.algo.variants.entropy import adaptive_entropy_coef

    def trl(entropies, coef, target, delta, low, high):  # TRL's state machine, written as TRL does
        applied, last = [], float("inf")
        for world_entropy in entropies:
            applied.append(coef if last <= target else 0.0)
            coef = min(coef + delta, high) if world_entropy <= target else max(coef - delta, low)
            last = world_entropy
        return applied, coef

    entropies = [0.5, 0.1, 0.15, 0.3, 0.05, 0.05, 0.05, 0.25]
    knobs = {"target": 0.2, "delta": 0.01, "low": 0.0, "high": 0.025}
    coef, last, ours = 0.005, math.inf, []
    for entropy in entropies:
        ours.append(coef if last <= knobs["target"] else 0.0)
        coef, last = adaptive_entropy_coef(coef, entropy, **knobs), entropy
    expected_applied, expected_coef = trl(entropies, 0.005, **knobs)
    assert ours == expected_applied and coef == expected_coef
    # by hand: 0.5 > 0.2 lowers 0.005 to 0 (and gates the next update), 0.1 and 0.15 raise it to 0.02, 0.3 lowers it
    # to 0.01 (gating the next), the 0.05s raise it to 0.02 and the 0.025 cap, 0.25 lowers it to 0.015
    assert ours == pytest.approx([0.0, 0.0, 0.01, 0.02, 0.0, 0.02, 0.025, 0.025]) and coef == pytest.approx(0.015)
