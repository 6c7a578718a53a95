"""``optim.logprob_chunk_tokens`` (``minirl.models.logprob_head``): the LM head and log-softmax on the completion
tokens, a chunk at a time, recomputed in the backward; the same log-probs, entropies, gradients and routes as the
whole-logits path, and one line for a model whose logits are not its head's."""

from __future__ import annotations

import copy

import pytest
import torch

from minirl.algo import token_logprobs
from minirl.algo.logprobs import token_entropy_with_grad
from minirl.config import MiniRLConfig
from minirl.models.logprob_head import LogprobHead, LogprobHeadError
from minirl.moe import RoutingReplay
from minirl.monitor.mismatch import token_entropy
from minirl.objective import make_objective, with_entropy_bonus
from minirl.trainer import OnPolicy, Trainer
from tests.conftest import make_tiny_moe, ragged_batch

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_terms_are_the_whole_logits_at_the_mask(chunk):
    model = make_tiny_moe()
    batch = ragged_batch(6)
    head = LogprobHead(model, chunk)
    with head.hidden_states():
        hidden = model(input_ids=batch.input_ids).logits[:, :-1].detach().requires_grad_(True)
    logits = model.lm_head(hidden).float()
    targets = batch.input_ids[:, 1:]
    for mode, reference in (("detached", token_entropy(logits.detach())), ("grad", token_entropy_with_grad(logits))):
        logp, entropy, _ = head.terms(hidden, targets, batch.mask, mode)
        want = token_logprobs(logits, targets) * batch.mask
        torch.testing.assert_close(logp, want, rtol=0, atol=1e-6)
        torch.testing.assert_close(entropy, reference * batch.mask, rtol=0, atol=1e-5)
        assert (logp[~batch.mask] == 0).all() and entropy.requires_grad == (mode == "grad")
    # the gradient through the recomputed chunks: of sum(logp) + sum(entropy) over the mask
    logp, entropy, _ = head.terms(hidden, targets, batch.mask, "grad")
    (ours,) = torch.autograd.grad((logp + entropy).sum(), hidden)
    whole = ((token_logprobs(logits, targets) + token_entropy_with_grad(logits)) * batch.mask).sum()
    (theirs,) = torch.autograd.grad(whole, hidden)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def _trainer(model, chunk, **kwargs) -> Trainer:
    return Trainer(model, lr=1e-2, micro_batch_sequences=3, logprob_chunk_tokens=chunk, **kwargs)


@pytest.mark.parametrize("settings", [{}, {"padding_free": True}, {"precision": "bf16"}])
def test_the_trainers_scores_and_gradients_are_the_whole_logits_ones(settings):
    model = make_tiny_moe()
    batch = ragged_batch(6)
    batch = batch.with_logp_old(batch.logp_rollout)
    chunked, whole = _trainer(copy.deepcopy(model), 4, **settings), _trainer(model, None, **settings)
    calls: list[tuple[int, ...]] = []
    chunked.model.lm_head.register_forward_hook(lambda module, args, out: calls.append(tuple(args[0].shape)))
    tol = {"rtol": 2e-2, "atol": 2e-3} if settings.get("precision") == "bf16" else {"rtol": 1e-5, "atol": 1e-6}
    a, b = chunked.score(batch), whole.score(batch)
    torch.testing.assert_close(a.logp, b.logp, **tol)
    torch.testing.assert_close(a.entropy, b.entropy, **tol)
    algo = MiniRLConfig(entropy_coef=0.1)  # the entropy bonus: its gradient through the chunks too
    objective = with_entropy_bonus(algo, batch, make_objective(algo, batch))
    torch.testing.assert_close(chunked.gradient(batch, objective), whole.gradient(batch, objective), **tol)
    # the head saw chunks of at most 4 completion tokens (forward and recomputation), never a whole micro-batch
    assert calls and all(len(shape) == 2 and shape[0] <= 4 for shape in calls)
    assert sum(shape[0] for shape in calls) >= 2 * int(batch.mask.sum())  # scores, gradient, recomputed gradient


def test_a_micro_batch_with_no_completion_token_trains_nothing_and_does_not_fail():
    """Every completion masked out (mask_truncated, a rejection): no chunk to run; the backward still goes through
    and leaves zero gradients, as the whole path's masked terms do."""
    model = make_tiny_moe()
    batch = ragged_batch(6)
    batch = batch.with_logp_old(batch.logp_rollout).with_mask(torch.zeros_like(batch.mask))
    objective = make_objective(MiniRLConfig(), batch)
    chunked = _trainer(copy.deepcopy(model), 4).gradient(batch, objective)
    assert torch.equal(chunked, torch.zeros_like(chunked))
    assert torch.equal(chunked, _trainer(model, None).gradient(batch, objective))


def test_routes_replayed_and_recorded_through_the_chunked_head():
    """R3's replay and the fused pi_old scores (N = 1) go through the same forward: routes, log-probs and the
    update's gradient are the whole-logits path's."""
    model = make_tiny_moe()
    batch = ragged_batch(6)
    recorder = copy.deepcopy(model)
    recorded = Trainer(recorder, lr=1e-2, replay=RoutingReplay(recorder)).score(batch, record_routes=True)
    batch = batch.with_routes(recorded.routes)
    results = []
    for chunk in (None, 5):
        twin = copy.deepcopy(model)
        trainer = _trainer(twin, chunk, replay=RoutingReplay(twin))
        objective = OnPolicy(make_objective(MiniRLConfig(), batch))
        update = trainer.update(batch, objective, replay_routes=True, score=True, record_routes=True, old_pass=True)
        results.append((update, [p.detach().clone() for p in twin.parameters()]))
    (plain, plain_weights), (chunked, chunked_weights) = results
    assert torch.equal(plain.scores.routes, chunked.scores.routes)
    torch.testing.assert_close(plain.scores.logp, chunked.scores.logp, rtol=1e-5, atol=1e-6)
    for a, b in zip(plain_weights, chunked_weights):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_model_whose_logits_are_not_its_heads_is_one_line():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, final_logit_softcapping=5.0)
    torch.manual_seed(0)
    with pytest.raises(LogprobHeadError, match=r"optim\.logprob_chunk_tokens: Gemma2ForCausalLM changes its logits"):
        _trainer(Gemma2ForCausalLM(cfg), 8)
    cfg.final_logit_softcapping = None  # without its soft cap the logits are the head's
    _trainer(Gemma2ForCausalLM(cfg), 8)


@pytest.mark.parametrize("settings", [("moe.routing_replay=R3", "optim.minibatches_per_step=2"),
                                      ("model.lora.rank=4", "moe.routing_replay=none")])
def test_an_rl_run_trains_as_with_the_whole_logits(tmp_path, settings):
    from tests.distributed.common import max_differences, run_steps

    whole = run_steps(tmp_path / "whole", *settings, "algo.entropy_coef=0.01")
    chunked = run_steps(tmp_path / "chunked", *settings, "algo.entropy_coef=0.01", "optim.logprob_chunk_tokens=5")
    loss, weight = max_differences(whole, chunked)
    assert loss < 1e-5 and weight < 1e-5
    for a, b in zip(whole[0], chunked[0]):
        assert a["train/entropy"] == pytest.approx(b["train/entropy"], rel=1e-5)
        assert a["mismatch/kl_k3"] == pytest.approx(b["mismatch/kl_k3"], rel=1e-3, abs=1e-7)
