"""Padding-free forwards (``optim.padding_free``, ``minirl.models.padding_free``): the real tokens of a
right-padded batch as one packed row, attention per row; the same log-probs, gradients and routes."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from minirl.batching import token_budget_rows
from minirl.config import MiniRLConfig
from minirl.models import padding_free as pf
from minirl.models.lora import enable_gradient_checkpointing
from minirl.models.presets import build_model
from minirl.moe import RoutingReplay
from minirl.objective import make_objective
from minirl.trainer import Trainer
from tests.conftest import make_tiny_moe, ragged_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def test_packing_hand_computed():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    packing = pf.Packing.of(mask)  # rows longest first: 2 (4 tokens), 0 (3), 1 (2)
    assert packing.index.tolist() == [8, 9, 10, 11, 0, 1, 2, 4, 5]
    assert packing.positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1]]
    x = torch.arange(12.0).reshape(3, 4) + 1
    packed = packing.pack(x)
    assert packed.tolist() == [[9.0, 10.0, 11.0, 12.0, 1.0, 2.0, 3.0, 5.0, 6.0]]
    assert packing.unpack(packed, fill=-1).tolist() == [[1, 2, 3, -1], [5, 6, -1, -1], [9, 10, 11, 12]]
    (block,) = packing.blocks  # short rows attend together
    assert (block.start, block.end, block.rows, block.width) == (0, 9, 3, 4)
    assert block.place.tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    heads = torch.arange(2 * 9 * 1.0).reshape(1, 2, 9, 1)  # [1, H=2, T=9, d=1]
    spread = packing.spread_heads(heads, block)  # [rows=3, H=2, width=4, d=1]
    assert spread.shape == (3, 2, 4, 1)
    assert spread[2, 1, :, 0].tolist() == [16.0, 17.0, 0.0, 0.0]  # head 1 of row 1 (third in the block): tokens 7, 8

    def own(module, q, k, v, mask, **kwargs):  # an attention returning its queries, [rows, width, H, d]
        assert mask is None and kwargs == {"scaling": 0.5}
        return q.transpose(1, 2), None

    assert packing.attend(own, None, heads, heads, heads, scaling=0.5).equal(heads.transpose(1, 2))


def test_rows_attend_in_blocks_of_similar_length():
    lengths = torch.tensor([40, 100, 90, 60])
    packing = pf.Packing.of(torch.arange(100)[None] < lengths[:, None])
    # 90 >= 0.8 x 100 joins row 1's block; 60 < 80 opens one; 40 < 0.8 x 60 another
    assert [(b.start, b.end, b.rows, b.width) for b in packing.blocks] == [(0, 190, 2, 100), (190, 250, 1, 60), (250, 290, 1, 40)]
    assert packing.blocks[0].place.tolist() == list(range(190))
    assert packing.index[:3].tolist() == [100, 101, 102] and packing.index[-1].item() == 39
    heads = torch.randn(1, 3, 290, 2)
    assert packing.attend(lambda m, q, k, v, mask: (q.transpose(1, 2), None), None, heads, heads, heads).equal(
        heads.transpose(1, 2))


def test_a_row_with_a_hole_is_refused_in_one_line():
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    with pytest.raises(ValueError, match=r"optim.padding_free: row 1's real tokens are not a prefix"):
        pf.Packing.of(mask)


def test_token_budget_counts_real_tokens_when_padding_free():
    lengths = [5, 9, 3, 4, 8, 2]
    # longest first: 9 | 8 | 5+4+3 = 12 | 2 with a budget of 12 real tokens (padded: 9 | 8 | 5,4 | 3,2)
    assert token_budget_rows(lengths, max_sequences=8, max_tokens=12, padded=False) == [[1], [4], [0, 2, 3], [5]]
    assert token_budget_rows(lengths, max_sequences=8, max_tokens=12) == [[1], [4], [0, 3], [2, 5]]


def _ragged(rows: int = 8, width: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (rows,), generator=g)
    lengths[0] = width
    return torch.randint(3, 40, (rows, width), generator=g), torch.arange(width)[None] < lengths[:, None]


def _logp_and_grads(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, packed: bool):
    model.zero_grad(set_to_none=True)
    if packed:
        logits = pf.forward(model, ids, pf.Packing.of(mask), use_cache=False)
    else:
        logits = model(input_ids=ids, use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]
    (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
    return logp.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _same_gradients(grads_a: dict[str, torch.Tensor], grads_b: dict[str, torch.Tensor]) -> None:
    """Equal to float rounding: the weight gradients sum over the tokens in another order (measured: <= 7e-7 of
    each gradient's largest entry)."""
    assert grads_a.keys() == grads_b.keys()
    for name, grad in grads_a.items():
        assert (grad - grads_b[name]).abs().max().item() <= 4e-6 * grad.abs().max().item() + 1e-8, name


@pytest.mark.parametrize("preset", ["qwen3-moe-tiny", "qwen2-moe-tiny", "olmoe-tiny", "mixtral-tiny", "qwen3-dense-2m"])
def test_padding_free_forward_matches_the_padded_forward(preset):
    """Every family the presets cover: the real tokens' log-probs (bitwise on the machines tested) and every
    gradient (weight gradients sum over fewer rows: float rounding) as in the padded forward."""
    model = build_model(preset, 48, 0, 1, seed=0)
    ids, mask = _ragged()
    logp_a, grads_a = _logp_and_grads(model, ids, mask, packed=False)
    logp_b, grads_b = _logp_and_grads(model, ids, mask, packed=True)
    assert (logp_a - logp_b).abs().max().item() <= 1e-6
    _same_gradients(grads_a, grads_b)
    assert model.config._attn_implementation == "sdpa"  # switched back after the forward


def test_long_rows_in_several_attention_blocks_match_the_padded_forward():
    model = build_model("qwen3-moe-tiny", 48, 0, 1, seed=0)
    ids, mask = _ragged(rows=10, width=90, seed=1)
    assert len(pf.Packing.of(mask).blocks) >= 3
    logp_a, grads_a = _logp_and_grads(model, ids, mask, packed=False)
    logp_b, grads_b = _logp_and_grads(model, ids, mask, packed=True)
    assert (logp_a - logp_b).abs().max().item() <= 1e-6
    _same_gradients(grads_a, grads_b)


def _batch(rows: int = 8, seed: int = 0):
    return ragged_batch(rows, seed, completion_tokens=lambda i: 1 + (i * 5) % 7)  # 1-7 tokens: varied padding


def _trainers(**kwargs):
    model_a = make_tiny_moe()
    model_b = copy.deepcopy(model_a)
    for model in (model_a, model_b) if kwargs.pop("checkpointing", False) else ():
        enable_gradient_checkpointing(model)
    return (Trainer(model_a, lr=1e-2, replay=RoutingReplay(model_a), **kwargs),
            Trainer(model_b, lr=1e-2, replay=RoutingReplay(model_b), padding_free=True, **kwargs))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_trainer_update_with_r3_replay_is_the_padded_update(checkpointing):
    """R3 as the loop runs it: routes recorded by one scoring, replayed in an update that also scores (pi_old
    from the update's forward) and captures the routers' own choices; padding-free changes float rounding only."""
    trainer_a, trainer_b = _trainers(micro_batch_sequences=3, checkpointing=checkpointing)
    same_r3_update(trainer_a, trainer_b, _batch())


def same_r3_update(trainer_a: Trainer, trainer_b: Trainer, batch, after_scoring=None):
    """R3 as the loop runs it on two trainers (``trainer_a`` the padded reference): one scoring records the routes
    (the same, -1 at padding), then an update replays them, scores and captures the routers' own choices; the two
    agree to float rounding. Returns the batch the update ran. ``after_scoring(batch)``: more checks of the scoring."""
    recorded_a, recorded_b = (t.score(batch, record_routes=True) for t in (trainer_a, trainer_b))
    if after_scoring is not None:
        after_scoring(batch)
    assert torch.equal(recorded_a.routes, recorded_b.routes)  # -1 at padding on both
    assert (recorded_b.routes[~batch.attention_mask] == -1).all()
    assert (recorded_a.logp - recorded_b.logp).abs().max().item() <= 1e-6
    assert torch.allclose(recorded_a.entropy, recorded_b.entropy, atol=1e-6)
    noise = 0.05 * torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(3)) * batch.mask
    batch = replace(batch.with_logp_old(recorded_a.logp), logp_rollout=recorded_a.logp + noise, routes=recorded_a.routes)
    objective = make_objective(MiniRLConfig(), batch)
    out_a, out_b = (t.update(batch, objective, replay_routes=True, natural_drift=True, score=True, record_routes=True)
                    for t in (trainer_a, trainer_b))
    assert abs(out_a.loss - out_b.loss) < 1e-6 and abs(out_a.grad_norm - out_b.grad_norm) < 1e-5
    assert out_a.metrics.keys() == out_b.metrics.keys()
    for key in out_a.metrics:
        assert abs(out_a.metrics[key] - out_b.metrics[key]) < 1e-6, key
    assert out_b.natural_diff_frac == out_a.natural_diff_frac == 0.0  # the replayed routes are the routers' own
    assert torch.equal(out_a.scores.routes, out_b.scores.routes)
    for (name, p), q in zip(trainer_a.model.named_parameters(), trainer_b.model.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4), name  # (AdamW would amplify float noise)
    return batch


def test_replayed_routes_reach_the_packed_tokens():
    """Replaying routes that differ from the natural ones changes the log-probs the same way packed or not
    (the packed call is fed each real token's own routes, not a shifted row's)."""
    trainer_a, trainer_b = _trainers(micro_batch_sequences=8)
    batch = _batch()
    routes = trainer_a.score(batch, record_routes=True).routes
    forced = torch.where(routes >= 0, (routes + 1) % 4, routes)  # another expert everywhere: still a valid top-2
    forced = torch.where((forced[..., :1] == forced[..., 1:]).expand_as(forced), routes, forced)
    batch = replace(batch, routes=forced)
    natural = trainer_a.score(batch).logp
    replayed_a, replayed_b = (t.score(batch, replay_routes=True).logp for t in (trainer_a, trainer_b))
    assert (replayed_a - natural).abs().max().item() > 1e-3  # the forced routes matter
    assert (replayed_a - replayed_b).abs().max().item() <= 1e-6


def test_unsupported_models_are_refused_in_one_line():
    model = make_tiny_moe()
    model.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match=r"optim.padding_free: this model's attention runs as 'eager'.*'sdpa'"):
        Trainer(model, lr=1e-2, padding_free=True)

    model = make_tiny_moe()
    trainer = Trainer(model, lr=1e-2, padding_free=True)
    attention = model.model.layers[1].self_attn
    attention.forward = lambda hidden_states, *args, **kwargs: (torch.zeros_like(hidden_states), None)  # mixes on its own
    with pytest.raises(pf.PaddingFreeError, match=r"optim.padding_free: 1 of the model's 2 layers ran their attention"):
        trainer.score(_batch())
    assert model.config._attn_implementation == "sdpa"


def test_the_cli_reports_an_unsupported_model_in_one_line():
    from minirl.cli import user_errors

    assert issubclass(pf.PaddingFreeError, user_errors())


def test_a_linear_attention_family_is_refused_at_its_first_forward():
    """Qwen3-Next: 3 of 4 layers are Gated DeltaNet (linear attention, outside the attention interface)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen3_next", vocab_size=48, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        intermediate_size=32, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8)
    model = AutoModelForCausalLM.from_config(config)
    ids, mask = _ragged(rows=3, width=10)
    with pytest.raises(pf.PaddingFreeError, match=r"1 of the model's 4 layers ran their attention .* set optim.padding_free=false"):
        pf.forward(model, ids, pf.Packing.of(mask), use_cache=False)


@pytest.mark.parametrize("kind", ["lora", "bf16"])
def test_lora_adapters_and_bf16_autocast_pack_the_same_way(kind):
    """LoRA on every linear layer (peft's injected modules see the packed row) and bf16 mixed precision: the same
    log-probs, routes and loss as the padded update, gradients to float rounding."""
    from minirl.models.lora import add_lora

    model_a = make_tiny_moe()
    if kind == "lora":
        add_lora(model_a, rank=4, alpha=8.0, dropout=0.0, target_modules=["all-linear"])
    model_b = copy.deepcopy(model_a)
    precision = "bf16" if kind == "bf16" else "fp32"
    trainers = [Trainer(m, lr=1e-2, replay=RoutingReplay(m), precision=precision, micro_batch_sequences=3, padding_free=free)
                for m, free in ((model_a, False), (model_b, True))]
    batch = _batch()
    scores = [t.score(batch, record_routes=True) for t in trainers]
    assert (scores[0].logp - scores[1].logp).abs().max().item() <= 1e-6 and torch.equal(scores[0].routes, scores[1].routes)
    batch = replace(batch.with_logp_old(scores[0].logp), logp_rollout=scores[0].logp, routes=scores[0].routes)
    objective = make_objective(MiniRLConfig(), batch)
    out_a, out_b = (t.update(batch, objective, replay_routes=True) for t in trainers)
    assert abs(out_a.loss - out_b.loss) < 1e-6
    _same_gradients({n: p.grad for n, p in model_a.named_parameters() if p.grad is not None},
                    {n: p.grad for n, p in model_b.named_parameters() if p.grad is not None})


def test_a_token_budget_counts_real_tokens_when_padding_free():
    """``micro_batch_max_tokens`` with padding-free forwards cuts micro-batches by real tokens (verl's dynamic batch
    size with ``use_remove_padding``): fewer micro-batches than the padded count would give, the same update."""
    trainer_a, _ = _trainers(micro_batch_sequences=8)
    budgeted = Trainer(copy.deepcopy(trainer_a.model), lr=1e-2, micro_batch_sequences=8, micro_batch_max_tokens=34,
                       padding_free=True)
    padded_budget = Trainer(copy.deepcopy(trainer_a.model), lr=1e-2, micro_batch_sequences=8, micro_batch_max_tokens=34)
    batch = _batch()
    micros = budgeted._micro_batches(batch)
    assert all(int(m.attention_mask.sum()) <= 34 or len(rows) == 1 for rows, m in micros)
    assert len(micros) < len(padded_budget._micro_batches(batch))
    batch = batch.with_logp_old(trainer_a.score(batch).logp)
    objective = make_objective(MiniRLConfig(), batch)
    out_a, out_b = trainer_a.update(batch, objective), budgeted.update(batch, objective)
    assert abs(out_a.loss - out_b.loss) < 1e-6
    _same_gradients({n: p.grad for n, p in trainer_a.model.named_parameters()},
                    {n: p.grad for n, p in budgeted.model.named_parameters()})


def test_a_sliding_window_layer_keeps_its_window():
    """Mixtral with a 4-token window: the padded forward's mask carries the window, so each attention block gets
    the same causal window (rows of up to 12 tokens, wider than it); without it the log-probs would move by ~0.2."""
    from transformers import AutoModelForCausalLM

    from minirl.models.presets import preset_config

    config = preset_config("mixtral-tiny", 48, 0, 1)
    config.sliding_window = 4
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    ids, mask = _ragged(rows=6, width=12)
    logp_a, grads_a = _logp_and_grads(model, ids, mask, packed=False)
    logp_b, grads_b = _logp_and_grads(model, ids, mask, packed=True)
    assert (logp_a - logp_b).abs().max().item() <= 1e-6
    _same_gradients(grads_a, grads_b)
    model.config.sliding_window = None
    assert (_logp_and_grads(model, ids, mask, packed=False)[0] - logp_a).abs().max().item() > 1e-2  # the window matters


def test_an_interrupted_forward_raises_its_own_exception():
    """A signal (or any error) inside a packed forward that records routes closes the routing block on the way out
    with no routes: the caller sees the interruption (Ctrl-C's clean stop), not a follow-on error."""
    model = make_tiny_moe()
    trainer = Trainer(model, lr=1e-2, replay=RoutingReplay(model), padding_free=True)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    model.model.layers[1].mlp.forward = interrupted
    with pytest.raises(KeyboardInterrupt):
        trainer.score(_batch(), record_routes=True)
    assert model.config._attn_implementation == "sdpa"


def _llama4(**extra):
    """A tiny Llama-4 text MoE: chunked attention in layers 0-2, a NoPE layer 3 with attention temperature tuning."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama4_text", vocab_size=48, hidden_size=32, intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def test_llama4_packs_within_its_attention_chunk_and_temperature_scale_and_is_refused_beyond():
    """Llama-4's chunked layers and NoPE temperature tuning see positions the packed row does not carry: within one
    chunk and below floor_scale the packed forward is the padded one; beyond either it would differ (measured with
    the limits off), so it is refused in one line."""
    model = _llama4(attention_chunk_size=6, floor_scale=40, attn_scale=1.0)
    assert pf.PackedForward(model).limits == (6, 39)
    ids, mask = _ragged(rows=6, width=6)
    logp_a, grads_a = _logp_and_grads(model, ids, mask, packed=False)
    logp_b, grads_b = _logp_and_grads(model, ids, mask, packed=True)
    assert (logp_a - logp_b).abs().max().item() <= 1e-6
    _same_gradients(grads_a, grads_b)

    wide, wide_mask = _ragged(rows=3, width=12)  # rows longer than a chunk
    with pytest.raises(pf.PaddingFreeError, match=r"^optim.padding_free: rows of 12 tokens exceed this model's "
                                                   r"attention_chunk_size 6 .*set optim.padding_free=false"):
        pf.forward(model, wide, pf.Packing.of(wide_mask), use_cache=False)
    many, many_mask = _ragged(rows=8, width=6, seed=2)  # rows within a chunk, 48 packed tokens: beyond floor_scale - 1
    many_mask = torch.ones_like(many_mask)
    with pytest.raises(pf.PaddingFreeError, match=r"packed tokens exceed this model's floor_scale - 1 = 39"):
        pf.forward(model, many, pf.Packing.of(many_mask), use_cache=False)

    unguarded = pf.PackedForward(model)
    unguarded.limits = (None, None)
    for batch, batch_mask in ((wide, wide_mask), (many, many_mask)):
        padded = _logp_and_grads(model, batch, batch_mask, packed=False)[0]
        packed = unguarded(batch, pf.Packing.of(batch_mask), use_cache=False)
        logp = torch.log_softmax(packed[:, :-1].float(), -1).gather(-1, batch[:, 1:, None]).squeeze(-1) * batch_mask[:, 1:]
        assert (logp.detach() - padded).abs().max().item() > 1e-4  # the limits are not vacuous (within: <= 1e-6)
