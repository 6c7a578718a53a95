"""Routing replay on tiny transformers MoE models, one per supported family (fp32, CPU).

Per family: recorded indices are the ones the experts consumed; replaying a fresh recording is
bitwise identical (logits and every gradient); forced routes change the output and still train the
router; -1 rows route naturally. Family-independent behaviour (validation, consumption check, one
forward per block, decode steps, gradient checkpointing, unsupported models) runs on Qwen3-MoE.
"""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from minirl.moe import RoutingReplay, UnsupportedModelError, supported_families
from minirl.moe.families import ROUTERS

VOCAB = 64
COMMON = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_experts_per_tok=2,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
)
# DeepSeek-style multi-head latent attention and grouped routing (8 experts in 2 groups, 1 kept).
MLA = dict(
    n_routed_experts=8, num_local_experts=8, n_group=2, topk_group=1, first_k_dense_replace=0, num_key_value_heads=4,
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_shared_experts=1,
)
GROUPED = dict(n_routed_experts=8, n_group=2, topk_group=1, first_k_dense_replace=0, head_dim=8)
HYBRID = dict(layer_types=["linear_attention", "full_attention"])
INDEXER = dict(index_n_heads=2, index_head_dim=16, index_topk=4)

# family (model_type) -> config overrides; every router family in minirl.moe.families is here.
FAMILIES: dict[str, dict] = {
    "qwen3_moe": dict(num_experts=8, head_dim=8, norm_topk_prob=True),  # as Qwen3-30B-A3B
    "qwen2_moe": dict(num_experts=8, shared_expert_intermediate_size=16),
    "olmoe": dict(num_experts=8),
    "mixtral": dict(num_local_experts=8),
    "flex_olmo": dict(num_experts=8),
    "minimax": dict(num_local_experts=8, head_dim=8),
    "qwen3_next": dict(
        HYBRID, num_experts=8, head_dim=8, shared_expert_intermediate_size=16, linear_num_value_heads=2,
        linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    ),
    "qwen3_5_moe_text": dict(
        HYBRID, num_experts=8, head_dim=8, shared_expert_intermediate_size=16, linear_num_value_heads=2,
        linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    ),
    "mellum": dict(num_experts=8, head_dim=8),
    "hunyuan_v1_moe": dict(num_experts=8, moe_topk=2, head_dim=8),
    "jamba": dict(
        num_experts=8, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=1, expert_layer_offset=0,
        mamba_d_state=4, mamba_dt_rank=4,
    ),
    "lara_mini": dict(num_experts=8, head_dim=8),
    "ernie4_5_moe": dict(moe_num_experts=8, moe_k=2, moe_layer_start_index=0, moe_layer_interval=1),
    "deepseek_v3": MLA,
    "deepseek_v32": dict(MLA, **INDEXER),
    "deepseek_v2": dict(MLA, topk_method="group_limited_greedy"),
    "deepseek_v4": dict(num_local_experts=8, head_dim=16, mlp_layer_types=["moe", "moe"]),
    "glm4_moe": GROUPED,
    "glm4_moe_lite": MLA,
    "glm_moe_dsa": dict(MLA, **INDEXER),
    "dots1": dict(GROUPED, n_shared_experts=1),
    "exaone_moe": dict(GROUPED, num_experts=8),
    "solar_open": GROUPED,
    "mimo_v2_flash": dict(GROUPED, first_k_dense_replace=None),
    "kimi_linear": dict(
        MLA, layer_types=["linear_attention", "full_attention"], mlp_layer_types=["sparse", "sparse"],
        linear_head_dim=8, linear_num_heads=2,
    ),
    "nemotron_h": dict(
        n_routed_experts=8, n_group=2, topk_group=1, head_dim=8, layers_block_type=["moe", "attention"],
        mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8,
    ),
    "axk1": MLA,
    "axk2": MLA,
    "bailing_hybrid": dict(MLA, **HYBRID, head_dim=8, num_mtp_layers=0, mlp_layer_types=["sparse", "sparse"]),
    "hy_v4": dict(MLA, **INDEXER, mlp_layer_types=["sparse", "sparse"], hc_mult=2),
    "mistral4": dict(MLA, head_dim=16),
    "minimax_m2": dict(num_local_experts=8, head_dim=8),
    "hy_v3": dict(num_experts=8, head_dim=8),
    "laguna": dict(num_experts=8, head_dim=8),
    "kolibri1": dict(num_experts=8, head_dim=8),
    "afmoe": dict(num_experts=8, head_dim=8),
    "lfm2_moe": dict(num_experts=8, num_dense_layers=0, layer_types=["conv", "full_attention"]),
    "beam": dict(num_experts=8, n_group=2, topk_group=1, head_dim=8, mlp_layer_types=["sparse", "sparse"]),
    "flint": dict(num_experts=8, head_dim=8, mlp_only_layers=[]),
    "gpt_oss": dict(num_local_experts=8, head_dim=8),
    "granitemoe": dict(num_local_experts=8),
    "granitemoeshared": dict(num_local_experts=8, shared_intermediate_size=16),
    "granitemoe_swa": dict(num_local_experts=8),
    "granitemoehybrid": dict(
        num_local_experts=8, layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8,
    ),
    "aria_text": dict(moe_num_experts=8, moe_topk=2),
    "cohere2_moe": dict(num_experts=8, head_dim=8),
    "llama4_text": dict(num_local_experts=8, head_dim=8, intermediate_size_mlp=32),
    "gemma4_text": dict(
        enable_moe_block=True, num_experts=8, top_k_experts=2, head_dim=8, global_head_dim=8,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB, sliding_window=8,
    ),
}
# model_type whose router hands the MoE block dense [N, E] scores (no indices), every expert run on every token
DENSE_SCORES = {"llama4_text"}
# model_type whose class AutoModelForCausalLM does not map
CAUSAL_LM_CLASS = {"mistral4": "Mistral4ForCausalLM"}
FAST = ["qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "deepseek_v3", "gpt_oss"]


def tiny_model(model_type: str, seed: int = 0, **extra) -> torch.nn.Module:
    import transformers

    cfg = AutoConfig.for_model(model_type, **{**COMMON, **FAMILIES.get(model_type, {}), **extra})
    if model_type not in DENSE_SCORES:  # llama4 runs every expert on every token, with no implementation to pick
        cfg._experts_implementation = "grouped_mm"
    torch.manual_seed(seed)
    if model_type in CAUSAL_LM_CLASS:
        model = getattr(transformers, CAUSAL_LM_CLASS[model_type])(cfg)
    else:
        model = AutoModelForCausalLM.from_config(cfg)
    model = model.float()
    with torch.no_grad():
        # Many routers are zero-initialised (every logit ties); give them, and the selection-only
        # score-correction biases, random values so the routing is non-trivial.
        for p in model.parameters():
            if p.dim() >= 1 and not p.any():
                p.normal_(0.0, 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias") or name.endswith("expert_bias"):
                b.normal_(0.0, 0.05)
    return model


@functools.cache
def family(model_type: str) -> tuple[torch.nn.Module, RoutingReplay]:
    model = tiny_model(model_type)
    return model, RoutingReplay(model)


def ids(B: int = 2, T: int = 6, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (B, T), generator=g)


def forward_backward(model, x):
    model.zero_grad(set_to_none=True)
    logits = model(x).logits
    (logits.float().square().mean()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads


def dense_selection(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """The experts [N, K] dense scores [N, E] select (the nonzero ones), in expert order."""
    chosen = scores != 0
    assert bool((chosen.sum(dim=-1) == top_k).all()), "every token scores exactly top_k experts"
    return chosen.nonzero()[:, 1].reshape(-1, top_k)


def canonical(idx: torch.Tensor, model_type: str) -> torch.Tensor:
    """Indices [..., K] as a spy sees them: in expert order where the experts get dense scores (no order)."""
    return idx.long().sort(dim=-1).values if model_type in DENSE_SCORES else idx.long()


class ExpertsSpy:
    """Captures the top_k_index each MoE layer's experts module was called with (where the experts get dense scores:
    the experts the scores the MoE block received select, in expert order)."""

    def __init__(self, model, replay: RoutingReplay):
        self.calls: dict[int, list[torch.Tensor]] = {i: [] for i in range(replay.num_layers)}
        self.handles = []
        dense = model.config.model_type in DENSE_SCORES
        for layer, name in enumerate(replay.layer_names):
            if dense:  # registered after the replay's own hook: the scores the MoE block receives
                hook = self._scores(layer, replay.top_k)
                self.handles.append(model.get_submodule(name).register_forward_hook(hook))
                continue
            parent = model.get_submodule(name.rpartition(".")[0])
            self.handles.append(parent.experts.register_forward_pre_hook(self._hook(layer), with_kwargs=True))

    def _hook(self, layer):
        def hook(module, args, kwargs):
            idx = args[1] if len(args) > 1 else kwargs["top_k_index"]
            self.calls[layer].append(idx.detach().clone())

        return hook

    def _scores(self, layer, top_k):
        def hook(module, args, output):
            self.calls[layer].append(dense_selection(output[0].detach(), top_k))

        return hook

    def consumed(self) -> torch.Tensor:
        """[N, L, K] indices consumed in the single forward that ran."""
        assert all(len(v) == 1 for v in self.calls.values()), {k: len(v) for k, v in self.calls.items()}
        return torch.stack([self.calls[i][0] for i in range(len(self.calls))], dim=1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def rolled(routes: torch.Tensor, num_experts: int, shift: int = 1) -> torch.Tensor:
    return torch.remainder(routes.long() + shift, num_experts).to(routes.dtype)


pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------
# Per family


def test_every_registered_router_family_is_tested():
    assert set(supported_families()) == set(FAMILIES)
    assert len(ROUTERS) == len(FAMILIES)


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_record_matches_what_the_experts_consumed(model_type):
    model, replay = family(model_type)
    x = ids()
    with ExpertsSpy(model, replay) as spy, replay.record() as rec:
        assert rec.routes is None
        model(x)
    routes = rec.routes
    assert routes.dtype == torch.int16
    assert routes.shape == (2, 6, replay.num_layers, replay.top_k)
    assert replay.num_layers >= 1 and replay.top_k == 2 and replay.num_experts == 8
    assert replay.family == model.config.model_type
    assert torch.equal(canonical(routes.reshape(12, replay.num_layers, 2), model_type), spy.consumed().long())
    # routing is non-trivial: not every token picks the same experts
    assert len({tuple(r) for r in routes.reshape(-1, 2).tolist()}) > 1


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_replaying_a_fresh_recording_is_bitwise_identical(model_type):
    model, replay = family(model_type)
    x = ids()
    with replay.record() as rec:
        ref_logits, ref_grads = forward_backward(model, x)
    with replay.replay(rec.routes):
        logits, grads = forward_backward(model, x)
    assert torch.equal(logits, ref_logits)
    assert ref_grads.keys() == grads.keys()
    for name in ref_grads:
        assert torch.equal(grads[name], ref_grads[name]), name


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_replay_is_bitwise_identical_in_bf16(model_type):
    """bf16 exposes the dtype casts each family's router does; replay must do the same ones."""
    model = tiny_model(model_type).to(torch.bfloat16)
    replay = RoutingReplay(model)
    x = ids()
    with replay.record() as rec:
        ref_logits, ref_grads = forward_backward(model, x)
    with replay.replay(rec.routes):
        logits, grads = forward_backward(model, x)
    assert torch.equal(logits, ref_logits)
    assert all(torch.equal(grads[n], ref_grads[n]) for n in ref_grads)


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_forced_routes_change_output_and_train_the_router(model_type):
    model, replay = family(model_type)
    x = ids()
    with replay.record() as rec:
        ref_logits = model(x).logits.detach()
    forced = rolled(rec.routes, replay.num_experts)
    with ExpertsSpy(model, replay) as spy, replay.replay(forced):
        logits, grads = forward_backward(model, x)
    assert torch.equal(spy.consumed().long(), canonical(forced.reshape(12, replay.num_layers, 2), model_type))
    assert not torch.equal(logits, ref_logits)
    for name in replay.layer_names:
        router_grads = [grads.get(f"{name}.{n}") for n, p in model.get_submodule(name).named_parameters()]
        assert any(g is not None and g.abs().sum() > 0 for g in router_grads), f"no gradient reaches {name}"


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_minus_one_rows_route_naturally(model_type):
    model, replay = family(model_type)
    x = ids()
    with replay.record() as rec:
        ref_logits, ref_grads = forward_backward(model, x)
    natural = torch.full_like(rec.routes, -1)
    with replay.replay(natural):
        logits, grads = forward_backward(model, x)
    assert torch.equal(logits, ref_logits)
    assert all(torch.equal(grads[n], ref_grads[n]) for n in ref_grads)

    # mixed per token: layer 0 natural at some tokens, forced elsewhere; layer 0's input does not
    # depend on routing, so its natural choice there is the recorded one
    forced = rolled(rec.routes, replay.num_experts)
    keep = torch.tensor([[1, 0, 0, 1, 0, 1], [0, 1, 1, 0, 0, 1]], dtype=torch.bool)
    forced[:, :, 0][keep] = -1
    with ExpertsSpy(model, replay) as spy, replay.replay(forced):
        model(x)
    consumed = spy.consumed().reshape(2, 6, replay.num_layers, 2).long()
    expect = forced.long().clone()
    expect[:, :, 0][keep] = rec.routes.long()[:, :, 0][keep]
    assert torch.equal(consumed, canonical(expect, model_type))


# ------------------------------------------------------------------------------------------------
# Family independent (Qwen3-MoE unless said otherwise)


def test_hooks_are_inert_outside_blocks():
    plain = tiny_model("qwen3_moe")
    hooked = tiny_model("qwen3_moe")
    RoutingReplay(hooked)
    x = ids()
    a, ga = forward_backward(plain, x)
    b, gb = forward_backward(hooked, x)
    assert torch.equal(a, b) and all(torch.equal(ga[n], gb[n]) for n in ga)


def test_remove_and_deepcopy():
    import copy

    model = tiny_model("qwen3_moe")
    replay = RoutingReplay(model)
    twin = copy.deepcopy(model)  # carries the hooks; they must ignore it
    twin_replay = RoutingReplay(twin)
    x = ids()
    with replay.record() as rec:
        model(x)
    with twin_replay.record() as twin_rec:
        twin(x)
    assert torch.equal(rec.routes, twin_rec.routes)
    with replay.replay(rolled(rec.routes, 8)):
        twin(x)  # not the replayed model: untouched
        model(x)
    replay.remove()
    assert not model.model.layers[0].mlp.gate._forward_hooks
    with pytest.raises(RuntimeError, match="remove"):
        with replay.record():
            pass


@pytest.mark.parametrize("model_type", FAST)
def test_record_under_no_grad_and_inference_mode(model_type):
    model, replay = family(model_type)
    x = ids()
    with torch.no_grad(), replay.record() as rec1:
        model(x)
    with torch.inference_mode(), replay.record() as rec2:
        model(x)
    with replay.record() as rec3:
        model(x)
    assert torch.equal(rec1.routes, rec3.routes) and torch.equal(rec2.routes, rec3.routes)
    with torch.no_grad(), replay.replay(rec3.routes):
        model(x)


def test_validation_errors():
    model, replay = family("qwen3_moe")
    x = ids()
    with replay.record() as rec:
        model(x)
    routes = rec.routes
    L, K, E = replay.num_layers, replay.top_k, replay.num_experts

    with pytest.raises(ValueError, match=r"shape \[B, T, L=2, K=2\]"):
        replay.replay(routes[..., :1]).__enter__()
    with pytest.raises(ValueError, match=r"shape \[B, T, L=2, K=2\]"):
        replay.replay(routes[:, :, :1]).__enter__()
    with pytest.raises(ValueError, match=r"shape"):
        replay.replay(routes[0]).__enter__()
    with pytest.raises(ValueError, match="integer"):
        replay.replay(routes.float()).__enter__()
    bad = routes.clone()
    bad[1, 2, 1, 0] = E
    with pytest.raises(ValueError, match=rf"\[-1, {E}\)"):
        replay.replay(bad).__enter__()
    bad[1, 2, 1, 0] = -2
    with pytest.raises(ValueError, match=rf"\[-1, {E}\)"):
        replay.replay(bad).__enter__()
    bad = routes.clone()
    bad[1, 2, 1, 0] = -1
    with pytest.raises(ValueError, match=r"row \(b=1, t=2, layer=1\).*all -1"):
        replay.replay(bad).__enter__()
    # batch / sequence mismatch with the forward call
    with pytest.raises(ValueError, match=r"\[B=2, T=6\].*\[B=2, T=5\]"):
        with replay.replay(routes):
            model(x[:, :5])
    with pytest.raises(ValueError, match=r"\[B=1, T=6\].*\[B=2, T=6\]"):
        with replay.replay(routes[:1]):
            model(x)
    with pytest.raises(ValueError, match=r"\[B=3, T=4\].*\[B=2, T=6\]"):  # same B*T, other layout
        with replay.replay(routes.reshape(3, 4, L, K)):
            model(x)
    # nothing is left armed after the errors
    with replay.replay(routes):
        model(x)
    assert replay._block is None


def test_consumption_check_names_the_layer():
    model, replay = family("qwen3_moe")
    x = ids()
    with replay.record() as rec:
        model(x)
    with pytest.raises(ValueError, match="layer 0 consumed its routes 0 times"):
        with replay.replay(rec.routes):
            pass
    # a forward that skips a MoE layer
    last = model.model.layers[-1]
    original = last.mlp.forward
    last.mlp.forward = lambda h: h * 0.0
    try:
        with pytest.raises(ValueError, match=r"layer 1 \(model\.layers\.1\.mlp\.gate\) consumed its routes 0 times"):
            with replay.replay(rec.routes):
                model(x)
        with pytest.raises(ValueError, match=r"layer 1 .* routed 0 times"):
            with replay.record():
                model(x)
    finally:
        last.mlp.forward = original
    # a second forward in one block
    with pytest.raises(ValueError, match="exactly one forward call"):
        with replay.replay(rec.routes):
            model(x)
            model(x)
    with pytest.raises(ValueError, match="exactly one forward call"):
        with replay.record():
            model(x)
            model(x)
    with pytest.raises(ValueError, match="record: MoE layer 0 routed 0 times"):
        with replay.record():
            pass
    # calling a sub-model bypasses the layout capture
    with pytest.raises(ValueError, match="did not go through the model"):
        with replay.record():
            model.model(x)
    # blocks do not nest
    with replay.record():
        with pytest.raises(RuntimeError, match="already open"):
            with replay.replay(rec.routes):
                pass
        model(x)


def test_decode_steps_record_one_block_per_call():
    """An engine decoding with a KV cache opens one record() per model call and concatenates on T."""
    model, replay = family("qwen3_moe")
    model.eval()
    x = ids(B=3, T=8)
    prompt, steps = x[:, :5], x[:, 5:]
    parts = []
    with torch.no_grad():
        with replay.record() as rec:
            out = model(prompt, use_cache=True)
        parts.append(rec.routes)
        cache = out.past_key_values
        for t in range(steps.shape[1]):
            with replay.record() as rec:
                out = model(steps[:, t : t + 1], past_key_values=cache, use_cache=True)
            assert rec.routes.shape == (3, 1, replay.num_layers, replay.top_k)
            cache = out.past_key_values
            parts.append(rec.routes)
        with replay.record() as full:
            ref = model(x).logits
        stitched = torch.cat(parts, dim=1)
        assert torch.equal(stitched, full.routes)
        with replay.replay(stitched):
            assert torch.equal(model(x).logits, ref)
        # a T=1 decode step can be replayed too
        with replay.replay(rolled(parts[1], replay.num_experts)):
            model(x[:, :1])
    model.train()


def test_gradient_checkpointing_recompute_replays_inside_the_block():
    model = tiny_model("qwen3_moe")
    replay = RoutingReplay(model)
    x = ids()
    with replay.record() as rec:
        model(x)
    forced = rolled(rec.routes, replay.num_experts)
    with replay.replay(forced):
        ref_logits, ref_grads = forward_backward(model, x)
    model.gradient_checkpointing_enable()
    model.train()
    with replay.replay(forced):
        logits, grads = forward_backward(model, x)  # backward inside: recomputation replays
    assert torch.equal(logits, ref_logits)
    assert all(torch.equal(grads[n], ref_grads[n]) for n in ref_grads)
    with replay.replay(forced):
        loss = model(x, use_cache=False).logits.square().mean()
    with pytest.raises(RuntimeError, match="call backward\\(\\) inside the replay\\(\\) block"):
        loss.backward()
    # a natural forward clears the guard
    model(x, use_cache=False).logits.sum().backward()


def test_dense_model_is_unsupported():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8,
    )
    with pytest.raises(UnsupportedModelError, match=r"no supported MoE router.*Supported families:.*mixtral.*olmoe.*qwen2_moe.*qwen3_moe"):
        RoutingReplay(Qwen3ForCausalLM(cfg))


@pytest.mark.parametrize(
    "model_type, extra, match",
    [
        ("phimoe", dict(num_local_experts=4), "PhimoeTopKRouter.*sparsemixer"),
        ("deepseek_v4", dict(num_local_experts=4, head_dim=16, mlp_layer_types=["hash_moe", "moe"]), "hash"),
        ("jetmoe", dict(num_local_experts=4, kv_channels=8, intermediate_size=16), "JetMoeTopKGating"),
    ],
)
def test_unsupported_routers_are_named(model_type, extra, match):
    cfg = AutoConfig.for_model(model_type, **{**COMMON, **extra})
    model = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(UnsupportedModelError, match=f"{match}.*Supported families:.*olmoe"):
        RoutingReplay(model)


def test_unknown_router_class_is_refused():
    class MysteryTopKRouter(torch.nn.Module):
        top_k = 2

    model = tiny_model("qwen3_moe")
    model.model.layers[0].mlp.gate2 = MysteryTopKRouter()
    with pytest.raises(UnsupportedModelError, match=r"MysteryTopKRouter.*unknown router"):
        RoutingReplay(model)


def test_subclassed_router_is_supported():
    model = tiny_model("qwen3_moe")
    gate = model.model.layers[1].mlp.gate
    gate.__class__ = type("MyGate", (type(gate),), {})
    replay = RoutingReplay(model)
    assert replay.num_layers == 2


class GateSpy:
    """Per MoE layer: the router's input hidden states and (replayed) output tuple, and the weights
    and indices its experts module was then called with."""

    def __init__(self, model, replay: RoutingReplay):
        self.router: dict[int, tuple] = {}
        self.experts: dict[int, tuple] = {}
        self.handles = []
        for layer, name in enumerate(replay.layer_names):
            router = model.get_submodule(name)
            parent = model.get_submodule(name.rpartition(".")[0])
            # registered after the replay's own hook: sees the output the MoE block receives
            self.handles.append(router.register_forward_hook(self._router(layer), with_kwargs=True))
            if model.config.model_type not in DENSE_SCORES:
                self.handles.append(parent.experts.register_forward_pre_hook(self._experts(layer), with_kwargs=True))

    def _router(self, layer):
        def hook(module, args, kwargs, output):
            hidden = args[0] if args else kwargs["hidden_states"]
            self.router[layer] = (module, hidden.detach(), tuple(o.detach() if torch.is_tensor(o) else o for o in output))
            if type(module).__name__ == "Llama4Router":  # the block weights each expert's input by these scores
                scores = output[0].detach()
                self.experts[layer] = (dense_selection(scores, module.top_k), scores.clone())

        return hook

    def _experts(self, layer):
        def hook(module, args, kwargs):
            idx = args[1] if len(args) > 1 else kwargs["top_k_index"]
            weights = args[2] if len(args) > 2 else kwargs["top_k_weights"]
            self.experts[layer] = (idx.detach().clone(), weights.detach().clone())

        return hook

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_forced_gate_weights_are_the_family_scorer_on_the_live_router_logits(model_type):
    """Under forced routes the experts get, at the forced experts, the weights the family's own
    scoring gives from this forward's router output (so the router keeps its gradient), not the
    weights the router computed for its own choice."""
    from minirl.moe.families import lookup

    model, replay = family(model_type)
    x = ids()
    with replay.record() as rec:
        model(x)
    forced = rolled(rec.routes, replay.num_experts)
    with GateSpy(model, replay) as spy, torch.no_grad(), replay.replay(forced):
        model(x)
    for layer in range(replay.num_layers):
        router, hidden, out = spy.router[layer]
        spec = lookup(router)[1]
        idx, weights = spy.experts[layer]
        want_idx = forced[:, :, layer, :].reshape(-1, replay.top_k).long()
        assert torch.equal(idx.long(), canonical(want_idx, model_type)), (model_type, layer)
        expected = spec.score(router, hidden, out, want_idx)
        assert torch.equal(weights, expected.to(weights.dtype)), (model_type, layer)
        with torch.no_grad():  # the router's own weights for its own choice differ: the check can fail
            natural_idx = rec.routes[:, :, layer, :].reshape(-1, replay.top_k).long()
            assert not torch.equal(weights, spec.score(router, hidden, out, natural_idx).to(weights.dtype))
