"""``algo.router_aux_loss_coef``: TRL's MoE load-balancing loss (Switch Transformer's, transformers'
``load_balancing_loss_func``) added to the policy loss over each micro-batch's real tokens."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from minirl.config import ConfigError, MiniRLConfig, load_config
from minirl.moe.balance import load_balancing_loss
from minirl.objective import make_objective, with_load_balance
from minirl.trainer import OnPolicy, Trainer, token_logprobs
from tests.conftest import make_tiny_moe, ragged_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def test_equals_transformers_load_balancing_loss():
    g = torch.Generator().manual_seed(0)
    logits = tuple(torch.randn(12, 6, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert load_balancing_loss(logits, mask.bool(), 2).item() == pytest.approx(
        load_balancing_loss_func(logits, 6, 2, mask).item(), rel=1e-6)
    assert load_balancing_loss(logits, torch.ones(12, dtype=torch.bool), 3).item() == pytest.approx(
        load_balancing_loss_func(logits, 6, 3, None).item(), rel=1e-6)
    even = (torch.zeros(4, 4),)  # uniform routers: E * sum_e (k/E) (1/E) = k
    assert load_balancing_loss(even, torch.ones(4, dtype=torch.bool), 2).item() == pytest.approx(2.0)


def _by_hand(model, batch, coef: float, micro_rows: int) -> torch.Tensor:
    """The policy loss plus coef x the mean over equal micro-batches of transformers' loss with their attention
    masks (TRL's sum over gradient-accumulation steps), differentiated by hand."""
    model.zero_grad()
    algo = MiniRLConfig()
    for start in range(0, batch.size, micro_rows):
        micro = batch.select(slice(start, start + micro_rows))
        out = model(input_ids=micro.input_ids, output_router_logits=True)
        logp = token_logprobs(out.logits[:, :-1].float(), micro.input_ids[:, 1:])
        policy = make_objective(algo, batch)(logp, micro.with_logp_old(logp.detach() * micro.mask))[0]
        aux = load_balancing_loss_func(out.router_logits, 4, 2, micro.attention_mask.long())
        (policy + coef * aux * micro_rows / batch.size).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("micro_rows, padding_free", [(8, False), (4, False), (4, True)])
def test_the_update_differentiates_the_policy_loss_plus_the_balance(micro_rows, padding_free):
    model = make_tiny_moe()
    batch = ragged_batch(8)
    batch = batch.with_logp_old(batch.logp_rollout)  # any pi_old: the gradient is compared, not trained
    expected = _by_hand(copy.deepcopy(model), batch, 0.5, micro_rows)
    trainer = Trainer(model, lr=1e-2, micro_batch_sequences=micro_rows, padding_free=padding_free)
    algo = MiniRLConfig(router_aux_loss_coef=0.5)
    objective = with_load_balance(algo, batch, 2, make_objective(algo, batch))
    got = trainer.gradient(batch, OnPolicy(objective))  # N = 1's wrapper passes the router logits on
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    without = trainer.gradient(batch, OnPolicy(make_objective(algo, batch)))
    assert not torch.allclose(got, without, atol=1e-6)  # the balance moves the routers


def test_a_dense_model_is_one_line(tmp_path):
    from minirl.loop import setup

    with pytest.raises(ConfigError, match=r"algo\.router_aux_loss_coef: Qwen3ForCausalLM returns no router logits"):
        setup(load_config(None, ["model.preset=qwen3-dense-2m", "algo.router_aux_loss_coef=0.01", "moe.routing_replay=none",
                                 "moe.routing_metrics=false", f"run.output_dir={tmp_path}"]))


@pytest.mark.parametrize("minibatches", [1, 2])
def test_the_logged_balance_is_the_updates_alone(tmp_path, minibatches):
    """``policy/aux_loss`` is the loss the updates added: the diagnostics' gradients at the same weights (their own
    forwards) leave it, the weights and the policy loss as they are."""
    from tests.distributed.common import run_steps

    settings = ("algo.router_aux_loss_coef=0.01", f"optim.minibatches_per_step={minibatches}")
    plain = run_steps(tmp_path / "plain", *settings, steps=2)
    diagnosed = run_steps(tmp_path / "diagnosed", *settings, "diagnostics.every_steps=1", steps=2)
    for a, b in zip(plain[0], diagnosed[0]):
        assert a["policy/aux_loss"] > 0 and "fidelity/first_grad_cosine" in b
        assert {k: b[k] for k in ("policy/aux_loss", "policy/loss")} == {k: a[k] for k in ("policy/aux_loss", "policy/loss")}
    for name, tensor in plain[1].items():
        assert torch.equal(diagnosed[1][name], tensor), name
