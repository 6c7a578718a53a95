"""Each prompt once per micro-batch (``optim.shared_prompt``, ``minirl.models.padding_free``): rows with the same
prompt pack it once and read its keys and values in attention; the same log-probs, gradients and routes as the
padded forward."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from minirl.batching import collate
from minirl.config import load_config
from minirl.models import padding_free as pf
from minirl.models.lora import enable_gradient_checkpointing
from minirl.models.presets import build_model
from minirl.moe import RoutingReplay
from minirl.trainer import Trainer
from minirl.types import Completion
from tests.conftest import make_tiny_moe
from tests.unit.test_padding_free import same_r3_update

pytestmark = pytest.mark.usefixtures("one_thread")


def test_packing_hand_computed():
    """Rows 0 and 2 share a 2-token prompt; row 2 (the longest) packs it, row 0 packs its completion alone and reads
    the prompt from row 2's tokens; row 1 shares nothing. Rows that pack all their tokens come first (2, 1), then
    row 0, in a block of its own whose queries are its own two tokens only."""
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    packing = pf.Packing.of(mask, prompts=[("k", 2), ("j", 2), ("k", 2)])
    assert packing.index.tolist() == [10, 11, 12, 13, 14, 5, 6, 7, 2, 3]
    assert packing.positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 2, 3]]
    assert packing.slots.tolist() == [0, 1, 8, 9, 10, 5, 6, 7, 10, 10, 0, 1, 2, 3, 4]  # 10: padding
    x = torch.arange(15.0).reshape(3, 5) + 1
    packed = packing.pack(x)
    assert packed.tolist() == [[11.0, 12.0, 13.0, 14.0, 15.0, 6.0, 7.0, 8.0, 3.0, 4.0]]
    # row 0's prompt slots read row 2's packed prompt (the same tokens when the prompts are the same)
    assert packing.unpack(packed, fill=-1).tolist() == [[11, 12, 3, 4, -1], [6, 7, 8, -1, -1], [11, 12, 13, 14, 15]]
    full, sharing = packing.blocks
    assert (full.start, full.end, full.rows, full.width) == (0, 8, 2, 5) and full.source is None
    assert full.place.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert (sharing.start, sharing.end, sharing.rows, sharing.width) == (8, 10, 1, 4)
    assert sharing.place.tolist() == [2, 3] and sharing.source.tolist() == [0, 1, 8, 9]
    assert sharing.queries.tolist() == [8, 9] and sharing.query_place.tolist() == [0, 1]
    assert sharing.offsets.tolist() == [2]
    assert sharing.mask.tolist() == [[[[True, True, True, False], [True, True, True, True]]]]  # query a at 2 + a
    heads = torch.arange(2 * 10 * 1.0).reshape(1, 2, 10, 1) + 1  # [1, H=2, T=10, d=1]
    assert packing.spread_heads(heads, sharing)[0, 0, :, 0].tolist() == [1.0, 2.0, 9.0, 10.0]  # prompt, own tokens
    assert packing.spread_heads(heads, sharing, gather=sharing.queries)[0, 1, :, 0].tolist() == [19.0, 20.0]
    assert packing.spread_heads(heads, full)[1, 1, :, 0].tolist() == [16.0, 17.0, 18.0, 0.0, 0.0]
    masks = []

    def own(module, q, k, v, mask, **kwargs):  # an attention returning its queries, [rows, queries, H, d]
        masks.append(None if mask is None else mask.shape)
        return q.transpose(1, 2), None

    assert packing.attend(own, None, heads, heads, heads).equal(heads.transpose(1, 2))
    assert masks == [None, (1, 1, 2, 4)]
    packing.original = "flash_attention_2"  # no 4-D mask there: the sharing rows ask at every slot, unmasked
    masks.clear()
    assert packing.attend(own, None, heads, heads, heads).equal(heads.transpose(1, 2)) and masks == [None, None]
    # gradients of a shared token sum over the rows that read it
    leaf = packed.clone().requires_grad_()
    packing.unpack(leaf).sum().backward()
    assert leaf.grad.tolist() == [[2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]


def test_without_a_shared_prompt_the_packing_is_padding_free():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    shared = pf.Packing.of(mask, prompts=[("a", 2), ("b", 1)])
    plain = pf.Packing.of(mask)
    assert shared.slots is None and shared.blocks[0].source is None
    assert shared.index.equal(plain.index) and shared.positions.equal(plain.positions)
    # a prompt longer than a row, or of length 0, is not shared
    longer = pf.Packing.of(mask, prompts=[("a", 3), ("a", 3)])
    assert longer.slots is None


def test_shared_prompts_keys():
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 0], [5, 7, 7, 8], [5, 6, 7, 0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1], [0, 0, 0]], dtype=torch.bool)
    keys = pf.shared_prompts(ids, mask)
    assert [k[1] if k else None for k in keys] == [2, 2, 2, None]  # the tokens before the first target
    assert keys[0] == keys[1] and keys[0] != keys[2]
    routes = torch.zeros(4, 4, 1, 1, dtype=torch.int16)
    routes[1, 1] = 3  # row 1 replays another expert at its second prompt token
    by_routes = pf.shared_prompts(ids, mask, routes)
    assert by_routes[0] != by_routes[1]
    routes[1, 1], routes[1, 2] = 0, 3  # ... or at a completion token: the prompts still match
    assert pf.shared_prompts(ids, mask, routes)[0] == pf.shared_prompts(ids, mask, routes)[1]


def grouped_batch(prompts: int = 3, samples: int = 4, seed: int = 0, routes: bool = False):
    """``prompts`` prompts of 3-5 tokens x ``samples`` completions of 1-7 tokens each (varied padding)."""
    g = torch.Generator().manual_seed(seed)
    comps = []
    for p in range(prompts):
        prompt = torch.randint(2, 40, (3 + p % 3,), generator=g).tolist()
        for s in range(samples):
            completion = torch.randint(2, 40, (1 + (p * samples + s) * 5 % 7,), generator=g).tolist()
            comps.append(Completion(p, s, prompt, completion, -torch.rand(len(completion), generator=g), "eos"))
    return collate(comps, torch.randn(len(comps), generator=g), pad_token_id=0)


def _logp_and_grads(model, ids, mask, targets, prompts):
    model.zero_grad(set_to_none=True)
    if prompts == "padded":
        logits = model(input_ids=ids, use_cache=False).logits
    else:
        logits = pf.forward(model, ids, pf.Packing.of(mask, prompts=prompts), use_cache=False)
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1) * targets
    (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
    return logp.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("preset, masked", [("qwen3-moe-tiny", True), ("mixtral-tiny", True), ("qwen3-dense-2m", True),
                                            ("qwen3-moe-tiny", False)])
def test_shared_prompt_forward_matches_the_padded_forward(preset, masked, monkeypatch):
    """Log-probs as the padded forward's (to 1e-6) and every gradient to float rounding (the shared prompt's gradients
    are summed over its rows in another order); each prompt is computed once. ``masked``: the rows reading a shared
    prompt ask at their own tokens only (sdpa), else at every slot (what flash attention runs)."""
    if not masked:
        monkeypatch.setattr(pf, "MASKED", ())
    model = build_model(preset, 48, 0, 1, seed=0)
    batch = grouped_batch()
    prompts = pf.shared_prompts(batch.input_ids, batch.mask)
    packed = pf.Packing.of(batch.attention_mask, prompts=prompts)
    prompt_tokens = sum(3 + p % 3 for p in range(3))
    assert packed.index.numel() == batch.attention_mask.sum() - 3 * prompt_tokens  # 3 of 4 rows skip each prompt
    logp_a, grads_a = _logp_and_grads(model, batch.input_ids, batch.attention_mask, batch.mask, "padded")
    logp_b, grads_b = _logp_and_grads(model, batch.input_ids, batch.attention_mask, batch.mask, prompts)
    assert (logp_a - logp_b).abs().max().item() <= 1e-6
    assert grads_a.keys() == grads_b.keys()
    for name, grad in grads_a.items():  # measured: <= 1.2e-6 of the largest entry
        assert (grad - grads_b[name]).abs().max().item() <= 4e-6 * grad.abs().max().item() + 1e-8, name


def test_a_sliding_window_layer_keeps_its_window_in_shared_rows():
    """Mixtral with a 4-token window, prompts of 3-5 tokens and completions of up to 7: the rows reading a shared
    prompt get the window on their own queries' mask too."""
    from transformers import AutoModelForCausalLM

    from minirl.models.presets import preset_config

    config = preset_config("mixtral-tiny", 48, 0, 1)
    config.sliding_window = 4
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    batch = grouped_batch()
    prompts = pf.shared_prompts(batch.input_ids, batch.mask)
    logp_a, grads_a = _logp_and_grads(model, batch.input_ids, batch.attention_mask, batch.mask, "padded")
    logp_b, grads_b = _logp_and_grads(model, batch.input_ids, batch.attention_mask, batch.mask, prompts)
    assert (logp_a - logp_b).abs().max().item() <= 1e-6
    for name, grad in grads_a.items():
        assert (grad - grads_b[name]).abs().max().item() <= 4e-6 * grad.abs().max().item() + 1e-8, name
    model.config.sliding_window = None
    no_window = _logp_and_grads(model, batch.input_ids, batch.attention_mask, batch.mask, prompts)[0]
    assert (no_window - logp_a).abs().max().item() > 1e-2  # the window matters


def _trainers(checkpointing: bool = False, **kwargs):
    model_a = make_tiny_moe()
    model_b = copy.deepcopy(model_a)
    for model in (model_a, model_b) if checkpointing else ():
        enable_gradient_checkpointing(model)
    return (Trainer(model_a, lr=1e-2, replay=RoutingReplay(model_a), **kwargs),
            Trainer(model_b, lr=1e-2, replay=RoutingReplay(model_b), shared_prompt=True, **kwargs))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_trainer_update_with_r3_replay_is_the_padded_update(checkpointing):
    """R3 as the loop runs it (routes recorded by one scoring, replayed in an update that also scores and captures
    the routers' own choices), with micro-batches that split a group: shared prompts change float rounding only."""
    trainer_a, trainer_b = _trainers(checkpointing, micro_batch_sequences=6)
    assert trainer_b.padding_free  # shared prompts run the padding-free forward
    fed: list[int] = []  # tokens each forward of trainer_b embeds
    trainer_b.model.get_input_embeddings().register_forward_hook(lambda m, args, out: fed.append(args[0].numel()))

    def each_prompt_fed_once(batch):  # micro-batches of rows 0-5, 6-11: groups 0-1, 1-2 (the second split); prompts 3, 4, 5
        real = batch.attention_mask.sum(dim=1)
        assert fed == [int(real[:6].sum()) - 3 * 3 - 4, int(real[6:].sum()) - 4 - 3 * 5]

    batch = same_r3_update(trainer_a, trainer_b, grouped_batch(), each_prompt_fed_once)
    # every row's routes count as replayed (``RoutePlan`` checks each is consumed once): a shared copy stands for its rows
    assert trainer_b.replay.replayed_rows == trainer_a.replay.replayed_rows == trainer_a.replay.validate(batch.routes)


def test_rows_replaying_other_prompt_routes_do_not_share():
    """R3 replays each row's own routes: a row whose prompt routes differ from its group's (an engine that routed the
    same prompt differently) keeps its own prompt, so its log-probs are those of its routes."""
    trainer_a, trainer_b = _trainers(micro_batch_sequences=12)
    batch = grouped_batch()
    routes = trainer_a.score(batch, record_routes=True).routes
    forced = routes.clone()
    row1 = forced[1, :3]  # the second row of the first group: another valid top-2 at its prompt
    swapped = torch.where(row1 >= 0, (row1 + 1) % 4, row1)
    forced[1, :3] = torch.where((swapped[..., :1] == swapped[..., 1:]).expand_as(swapped), row1, swapped)
    batch = replace(batch, routes=forced)
    keys = pf.shared_prompts(batch.input_ids, batch.mask, forced)
    assert keys[0] == keys[2] == keys[3] != keys[1]
    replayed_a, replayed_b = (t.score(batch, replay_routes=True).logp for t in (trainer_a, trainer_b))
    natural = trainer_a.score(batch).logp
    assert (replayed_a[1] - natural[1]).abs().max().item() > 1e-4  # the forced prompt routes matter to row 1
    assert (replayed_a - replayed_b).abs().max().item() <= 1e-6


@pytest.mark.parametrize("micro_batch", [12, 5])
def test_two_groups_of_the_same_prompt_share_one_copy(micro_batch):
    """A dataset may hold a prompt twice (or a run split one prompt's samples into two groups): rows of both groups
    read one copy of it, under R3 too (the engine routes the same tokens the same way), and the update is the
    padded one, whether a micro-batch holds both groups or splits them."""
    g = torch.Generator().manual_seed(0)
    twice, once = torch.randint(2, 40, (4,), generator=g).tolist(), torch.randint(2, 40, (5,), generator=g).tolist()
    comps = []
    for group, prompt in enumerate((twice, twice, once)):
        for sample in range(4):
            completion = torch.randint(2, 40, (1 + (group * 4 + sample) * 5 % 7,), generator=g).tolist()
            comps.append(Completion(group, sample, prompt, completion, -torch.rand(len(completion), generator=g), "eos"))
    batch = collate(comps, torch.randn(12, generator=g), pad_token_id=0)
    trainer_a, trainer_b = _trainers(micro_batch_sequences=micro_batch)
    fed: list[int] = []  # tokens each forward of trainer_b embeds
    trainer_b.model.get_input_embeddings().register_forward_hook(lambda m, args, out: fed.append(args[0].numel()))

    def twice_fed_once(batch):
        keys = pf.shared_prompts(batch.input_ids, batch.mask, trainer_a.score(batch, record_routes=True).routes)
        assert len(set(keys[:8])) == 1 and keys[8] != keys[0]
        real = batch.attention_mask.sum(dim=1)
        # one micro-batch: the repeated prompt once for its 8 rows, the other once for its 4; micro-batches of
        # 5, 5, 2 rows: rows 0-4 and 5-7 each read one copy of the repeated prompt, rows 8-9 and 10-11 one of the other
        expected = [int(real.sum()) - 7 * 4 - 3 * 5] if micro_batch == 12 else [
            int(real[:5].sum()) - 4 * 4, int(real[5:10].sum()) - 2 * 4 - 1 * 5, int(real[10:].sum()) - 5]
        assert fed == expected

    same_r3_update(trainer_a, trainer_b, batch, twice_fed_once)


def test_chunked_head_and_kl_reference_share_prompts_too():
    """With the chunked LM head the packed forward returns hidden states (shared ones copied to their rows); the KL
    reference's frozen trainer shares prompts as the policy's does."""
    from minirl.reference import Reference

    trainer_a, trainer_b = _trainers(micro_batch_sequences=12, logprob_chunk_tokens=5)
    batch = grouped_batch()
    score_a, score_b = (t.score(batch) for t in (trainer_a, trainer_b))
    assert (score_a.logp - score_b.logp).abs().max().item() <= 1e-6
    assert Reference(trainer_b).frozen.shared_prompt


def test_a_token_budget_keeps_a_prompts_rows_together_and_counts_the_prompt_once():
    """Rows 0, 1 share a 5-token prompt, rows 2, 3 a 4-token one; a budget of 12 real tokens. Longest first alone
    (10 | 9 | 8 | 7) every row goes alone; a prompt's rows together, the second costing its completion: 10 | 8 | 9 + 3."""
    from minirl.batching import token_budget_rows

    lengths, prompts = [10, 8, 9, 7], [("a", 5), ("a", 5), ("b", 4), ("b", 4)]
    assert token_budget_rows(lengths, max_sequences=8, max_tokens=12, padded=False) == [[0], [2], [1], [3]]
    assert token_budget_rows(lengths, 8, 12, padded=False, prompts=prompts) == [[0], [1], [2, 3]]
    assert token_budget_rows(lengths, 8, 13, padded=False, prompts=prompts) == [[0, 1], [2, 3]]  # 10 + 3 | 9 + 3
    assert token_budget_rows(lengths, 8, 13, padded=True, prompts=prompts) == [[0], [2], [1], [3]]  # padded: ignored
    # rows without a prompt keep their place among the prompts' groups (by length)
    assert token_budget_rows([6, 10, 9, 8], 8, 30, padded=False, prompts=[None, ("a", 5), None, ("a", 5)]) == [[0, 1, 2, 3]]
    assert token_budget_rows([6, 10, 9, 8], 8, 13, padded=False, prompts=[None, ("a", 5), None, ("a", 5)]) == [
        [1, 3], [2], [0]]


def test_trainer_token_budgets_count_a_shared_prompt_once():
    trainer_a, trainer_b = _trainers(micro_batch_max_tokens=20)
    batch = grouped_batch()  # prompts of 3, 4, 5 tokens x 4 completions of 1-7 tokens
    plain = [rows.tolist() for rows, _ in Trainer(trainer_a.model, lr=0.0, micro_batch_max_tokens=20, padding_free=True)
             ._micro_batches(batch)]
    shared = [rows.tolist() for rows, _ in trainer_b._micro_batches(batch)]
    assert len(shared) < len(plain)
    assert sorted(row for rows in shared for row in rows) == list(range(12))
    assert (trainer_a.score(batch).logp - trainer_b.score(batch).logp).abs().max().item() <= 1e-6


@pytest.mark.parametrize("precision", ["fp32", "fp8_e4m3"])
def test_the_engines_r3_batches_share_their_prompts(precision):
    """Under R3 rows share a prompt only where its routes are the same: the engine prefills each prompt once for its G
    samples, so a collated R3 batch's groups do share (else R3 would silently lose the saving)."""
    from minirl.rollout.native import NativeEngine
    from minirl.types import SamplingParams
    from tests.unit.test_rollout_native import EOS, PAD, PROMPTS, moe_model

    engine = NativeEngine(moe_model(std=0.1), eos_token_id=EOS, pad_token_id=PAD, precision=precision)
    completions = engine.generate_ids(PROMPTS, 4, SamplingParams(max_new_tokens=6, seed=0), record_routes=True)
    batch = collate(completions, torch.zeros(len(completions)), pad_token_id=PAD)
    keys = pf.shared_prompts(batch.input_ids, batch.mask, batch.routes)
    assert [len({keys[row] for row in range(g * 4, g * 4 + 4)}) for g in range(len(PROMPTS))] == [1] * len(PROMPTS)
    assert len(set(keys)) == len(PROMPTS)


def test_a_model_that_cannot_pack_is_refused_naming_the_key():
    model = make_tiny_moe()
    model.config._attn_implementation = "eager"
    with pytest.raises(pf.PaddingFreeError, match=r"^optim.shared_prompt: this model's attention runs as 'eager'.*"
                                                   r"set optim.shared_prompt=false$"):
        Trainer(model, lr=1e-2, shared_prompt=True)
    with pytest.raises(pf.PaddingFreeError, match=r"^optim.padding_free and optim.shared_prompt: .*set optim.padding_free="
                                                   r"false and optim.shared_prompt=false$"):
        Trainer(model, lr=1e-2, padding_free=True, shared_prompt=True)


def test_the_config_key_parses_and_is_off_by_default(tmp_path):
    assert load_config("configs/demo.yaml").optim.shared_prompt is False
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  shared_prompt: true\n")
    assert load_config(path).optim.shared_prompt is True
