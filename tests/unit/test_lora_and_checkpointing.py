"""Memory knobs: gradient checkpointing keeps R3 replay exact; LoRA (peft) trains adapters only,
leaves routers alone, replays routes exactly, hands the engine merged weights, and checkpoints
merged weights with the adapter beside them."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from minirl.batching import collate
from minirl.config import ConfigError, LoRAConfig, load_config
from minirl.models.io import save_checkpoint
from minirl.models.lora import ADAPTER_DIR, adapters_disabled, add_lora, has_lora, merged_state_dict
from minirl.models.tokenizer import build_char_tokenizer
from minirl.moe import RoutingReplay
from minirl.rollout.native import NativeEngine
from minirl.runtime import build_trainer, prepare_for_training
from minirl.trainer import Trainer
from minirl.types import SamplingParams
from tests.conftest import make_tiny_moe
from tests.unit.test_trainer_precision import batch_of, objective

PAD, EOS = 0, 1
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def rolled_routes(batch, replay: RoutingReplay) -> torch.Tensor:
    """Forced routes that differ from the natural ones: expert e -> e + 1 (mod E), -1 at padding."""
    g = torch.Generator().manual_seed(3)
    B, S = batch.input_ids.shape
    routes = torch.stack([torch.randperm(replay.num_experts, generator=g)[: replay.top_k]
                          for _ in range(B * S * replay.num_layers)]).view(B, S, replay.num_layers, replay.top_k)
    routes[~batch.attention_mask] = -1
    return routes.to(torch.int16)


def test_gradient_checkpointing_replays_the_same_routes_in_the_recomputation():
    model = make_tiny_moe(0)
    twin = copy.deepcopy(model)
    plain = Trainer(model, lr=1e-3, replay=RoutingReplay(model), micro_batch_sequences=4)
    cfg = load_config(None, ["optim.gradient_checkpointing=true", "optim.lr=1e-3", "optim.micro_batch_sequences=4"])
    replay = RoutingReplay(twin)
    checkpointed = build_trainer(cfg, twin, replay)
    assert twin.model.gradient_checkpointing
    batch = batch_of(6)
    batch = batch.with_routes(rolled_routes(batch, replay))
    before = list(replay.replayed_rows)
    a = plain.update(batch, objective, replay_routes=True)
    b = checkpointed.update(batch, objective, replay_routes=True)
    assert [now - was for now, was in zip(replay.replayed_rows, before)] == replay.validate(batch.routes)  # once each
    assert a.loss == b.loss and a.grad_norm == pytest.approx(b.grad_norm, rel=1e-6)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p, q, atol=1e-7, rtol=0), name
    # the recomputation really ran under replay: natural routing would have given other gradients
    natural = copy.deepcopy(make_tiny_moe(0))
    Trainer(natural, lr=1e-3, micro_batch_sequences=4).update(batch, objective)
    assert not torch.allclose(natural.model.layers[0].mlp.gate.weight, model.model.layers[0].mlp.gate.weight)


def lora_model(seed: int = 0, targets: list[str] = ATTENTION):
    model = make_tiny_moe(seed)
    add_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=targets)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # B = 0 at init makes the adapter a no-op: give it a value to test merging
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def test_lora_trains_adapters_only_and_leaves_routers_alone():
    model = lora_model()
    assert has_lora(model)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert not any("mlp.gate" in name for name in trainable)  # routers not adapted
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    Trainer(model, lr=1e-2).update(batch_of(), objective)
    assert all(torch.equal(p, frozen[name]) for name, p in model.named_parameters() if name in frozen)
    cfg = load_config(None, ["model.lora={rank: 4, target_modules: [q_proj, gate]}"])
    with pytest.raises(ConfigError, match=r"model.lora.target_modules: target 'gate' is an MoE router"):
        prepare_for_training(cfg, make_tiny_moe(0))
    with pytest.raises(ConfigError, match=r"model.lora.target_modules: .*not found"):
        prepare_for_training(load_config(None, ["model.lora={target_modules: [nothing_here]}"]), make_tiny_moe(0))
    assert load_config(None, ["model.lora={rank: 4}", "cluster.trainer_ranks=2", "rollout.prompts_per_step=2"])  # ranks too


def test_all_linear_is_pefts_every_linear_but_the_head_and_never_a_router():
    model = make_tiny_moe(0)
    add_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=["all-linear"])
    adapted = {name.split(".lora_")[0] for name, p in model.named_parameters() if p.requires_grad}
    assert adapted == {f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "k_proj", "v_proj", "o_proj")}


@pytest.mark.parametrize("targets", [ATTENTION, LoRAConfig().target_modules], ids=["attention", "default"])
def test_merged_weights_are_the_adapted_forward_and_the_engine_samples_from_them(targets):
    """The default targets' gate/up/down names make peft (>= 0.17) adapt the fused expert tensors too, through nested
    parameter wrappers: merged under the base key names all the same (a KeyError at the engine's sync before)."""
    model = lora_model(targets=targets).eval()
    merged = merged_state_dict(model)
    plain = make_tiny_moe(0)
    assert set(merged) == set(plain.state_dict())
    experts = "model.layers.0.mlp.experts.gate_up_proj"
    assert torch.equal(merged[experts], plain.state_dict()[experts]) == (targets == ATTENTION)
    q = "model.layers.0.self_attn.q_proj"
    layer = model.get_submodule(q)
    expected = layer.base_layer.weight + (8.0 / 4) * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    assert torch.allclose(merged[f"{q}.weight"], expected, atol=1e-7)
    engine = NativeEngine(plain, eos_token_id=EOS, pad_token_id=PAD)
    trainer = Trainer(model, lr=0.0)
    engine.load_weights(trainer.state_dict())
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 48, (6,), generator=g).tolist() for _ in range(4)]
    completions = engine.generate_ids(prompts, 2, SamplingParams(max_new_tokens=10, seed=0))
    batch = collate(completions, torch.zeros(len(completions)), pad_token_id=PAD)
    logp = trainer.score(batch, entropy=False).logp
    gap = float((batch.logp_rollout - logp)[batch.mask].abs().max())
    assert gap < 1e-5, gap  # merged W + sBA vs the adapter's xW + s(xA)B: float rounding only
    engine.load_weights(plain.state_dict())  # the base weights sample from another law
    other = collate(engine.generate_ids(prompts, 2, SamplingParams(max_new_tokens=10, seed=0)), torch.zeros(8), pad_token_id=PAD)
    assert not torch.equal(other.logp_rollout, batch.logp_rollout)


def test_r3_replay_stays_exact_with_adapters():
    model = lora_model()
    replay = RoutingReplay(model)
    trainer = Trainer(model, lr=0.0, replay=replay)
    batch = batch_of()
    recorded = trainer.score(batch, record_routes=True)
    batch = batch.with_routes(recorded.routes)
    replayed = trainer.score(batch, replay_routes=True, record_routes=True)
    assert torch.equal(replayed.logp, recorded.logp) and torch.equal(replayed.routes, recorded.routes)
    batch = batch.with_routes(rolled_routes(batch, replay))
    before = list(replay.replayed_rows)
    result = Trainer(model, lr=1e-3, replay=replay).update(batch, objective, replay_routes=True)
    assert result.fault is None
    assert [now - was for now, was in zip(replay.replayed_rows, before)] == replay.validate(batch.routes)


def test_adapters_disabled_is_the_base_model():
    model, base = lora_model(), make_tiny_moe(0)
    ids = batch_of().input_ids
    with torch.no_grad():
        with adapters_disabled(model):
            off = model(input_ids=ids).logits
        on = model(input_ids=ids).logits
        assert torch.equal(off, base(input_ids=ids).logits)
        assert not torch.allclose(on, off)


def test_lora_checkpoint_is_merged_hf_weights_with_the_adapter_beside(tmp_path):
    model = lora_model().eval()
    save_checkpoint(model, build_char_tokenizer(), tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / ADAPTER_DIR / "adapter_config.json").is_file()
    assert (tmp_path / "ckpt" / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()
    assert not has_lora(loaded)
    ids = batch_of().input_ids
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
    assert has_lora(model)  # saving left the adapter in place


def test_an_adapter_names_its_base_and_an_adapter_or_step_directory_as_the_model_says_what_to_give(tmp_path):
    """adapter_config.json names the directory the base came from (AutoPeftModel finds it); an adapter directory or a
    resumable checkpoint's step directory given as the model is one line saying which directory to give."""
    import json

    from minirl.models.io import ModelLoadError, load_model_and_tokenizer

    make_tiny_moe(0).save_pretrained(tmp_path / "base")
    build_char_tokenizer().save_pretrained(tmp_path / "base")
    model, tokenizer = load_model_and_tokenizer(str(tmp_path / "base"))
    add_lora(model, rank=2, alpha=4.0, dropout=0.0, target_modules=ATTENTION)
    save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    adapter = json.loads((tmp_path / "ckpt" / ADAPTER_DIR / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tmp_path / "base")
    with pytest.raises(ModelLoadError, match=r"it is a LoRA adapter \(adapter_config.json\): give its base model "
                                             rf"\({tmp_path / 'base'}\) or the merged model beside it"):
        load_model_and_tokenizer(str(tmp_path / "ckpt" / ADAPTER_DIR))
    (tmp_path / "step_000002").mkdir()
    (tmp_path / "ckpt").rename(tmp_path / "step_000002" / "model")
    with pytest.raises(ModelLoadError, match=r"a minirl checkpoint keeps its model in .*step_000002/model: give that"):
        load_model_and_tokenizer(str(tmp_path / "step_000002"))


def test_a_checkpoints_adapter_loads_back_into_a_rebuilt_base(tmp_path):
    from minirl.models.lora import load_adapter_weights

    model = lora_model(0)
    save_checkpoint(model, build_char_tokenizer(), tmp_path / "ckpt")
    rebuilt = make_tiny_moe(0)  # the run's base, rebuilt from its source; the adapter starts at B = 0
    add_lora(rebuilt, rank=4, alpha=8.0, dropout=0.0, target_modules=ATTENTION)
    load_adapter_weights(rebuilt, tmp_path / "ckpt")
    for (name, p), q in zip(model.named_parameters(), rebuilt.parameters()):
        assert torch.equal(p, q), name


EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def expert_lora_model(seed: int = 0):
    """LoRA on the routed experts alone (``target_modules: []``, ``target_parameters``: the fused expert tensors)."""
    model = make_tiny_moe(seed)
    add_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=[], target_parameters=EXPERTS)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def test_target_parameters_adapt_the_routed_experts_alone_and_merge_into_them():
    """``model.lora.target_parameters`` (peft's, TRL's ``LoraConfig(target_parameters=...)``): one adapter per expert
    on the fused tensors, nothing else trains; the merged weights are the adapted forward; R3 replays exactly; the
    adapter survives a checkpoint; a router or an unknown name is one line."""
    model = expert_lora_model().eval()
    trainable = {name.split(".lora_")[0] for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"model.layers.{i}.mlp.experts{inner}" for i in range(2) for inner in ("", ".base_layer")}
    merged, plain = merged_state_dict(model), make_tiny_moe(0)
    assert set(merged) == set(plain.state_dict())
    changed = {key for key in merged if not torch.equal(merged[key], plain.state_dict()[key])}
    assert changed == {f"model.layers.{i}.mlp.experts.{p}" for i in range(2) for p in ("gate_up_proj", "down_proj")}
    plain.load_state_dict(merged)
    ids = batch_of().input_ids
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=1e-5)
    replay = RoutingReplay(model)
    trainer = Trainer(model, lr=1e-3, replay=replay)
    batch = batch_of()
    recorded = trainer.score(batch, record_routes=True)
    replayed = trainer.score(batch.with_routes(recorded.routes), replay_routes=True, record_routes=True)
    assert torch.equal(replayed.logp, recorded.logp) and torch.equal(replayed.routes, recorded.routes)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    assert trainer.update(batch, objective).fault is None
    assert all(torch.equal(p, frozen[name]) for name, p in model.named_parameters() if name in frozen)
    with pytest.raises(ConfigError, match=r"^model\.lora\.target_parameters: target 'mlp\.gate\.weight' is an MoE router"):
        prepare_for_training(load_config(None, ["model.lora={target_parameters: [mlp.gate.weight]}"]), make_tiny_moe(0))
    with pytest.raises(ConfigError, match=r"^model\.lora\.target_parameters: \['experts\.nope'\]: no parameter"):
        prepare_for_training(load_config(None, ["model.lora={target_parameters: [experts.nope]}"]), make_tiny_moe(0))
    with pytest.raises(ConfigError, match=r"^model\.lora\.target_modules: no target"):
        prepare_for_training(load_config(None, ["model.lora={target_modules: []}"]), make_tiny_moe(0))


def test_an_expert_adapter_loads_back_into_a_rebuilt_base(tmp_path):
    from minirl.models.lora import load_adapter_weights

    model = expert_lora_model(0)
    save_checkpoint(model, build_char_tokenizer(), tmp_path / "ckpt")
    rebuilt = make_tiny_moe(0)
    add_lora(rebuilt, rank=4, alpha=8.0, dropout=0.0, target_modules=[], target_parameters=EXPERTS)
    load_adapter_weights(rebuilt, tmp_path / "ckpt")
    for (name, p), q in zip(model.named_parameters(), rebuilt.parameters()):
        assert torch.equal(p, q), name
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()
    ids = batch_of().input_ids
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits, rtol=0, atol=1e-5)


def test_a_run_with_expert_adapters_trains_the_experts_and_the_engine_samples_them(tmp_path):
    """Two MiniRL steps (R3, the KL penalty to the base model: adapters off) with LoRA on the routed experts alone:
    only the experts' merged weights move, and an fp32 engine synced with the merged weights samples the trainer's
    own law (its log-probs within float rounding of pi_old)."""
    from tests.distributed.common import run_steps

    lora = "model.lora={rank: 4, alpha: 8, target_modules: [], target_parameters: [mlp.experts.gate_up_proj, mlp.experts.down_proj]}"
    metrics, weights = run_steps(tmp_path, lora, "rollout.precision=fp32", "moe.routing_replay=R3", "algo.kl_coef=0.1",
                                 "optim.lr=1e-2", steps=2)
    base = run_steps(tmp_path / "base", "rollout.precision=fp32", steps=0)[1]
    moved = {name for name in base if not torch.equal(base[name], weights[name])}
    assert moved and all(".mlp.experts." in name for name in moved)
    assert metrics[-1]["mismatch/abs_dlogp_max"] < 1e-4 and metrics[-1]["faults/skipped_updates"] == 0


def test_offloaded_fsdp_shards_compute_on_their_meshs_device():
    """optim.cpu_offload keeps FSDP2 shards in CPU memory while their mesh computes on the GPU: the trainer must move
    its micro-batches to the mesh's device, not to the shards' (``compute_device``). A plain or unoffloaded
    parameter computes where it is. (A stand-in mesh on ``meta``: this machine has no second device.)"""
    from types import SimpleNamespace

    from minirl.trainer import compute_device

    class Holds(torch.nn.Module):
        def __init__(self, param):
            super().__init__()
            self.param = param

        def parameters(self, recurse=True):
            yield self.param

    plain = torch.nn.Linear(2, 2)
    assert compute_device(plain) == torch.device("cpu")
    stored_here = SimpleNamespace(device=torch.device("cpu"), device_mesh=SimpleNamespace(device_type="cpu"))
    assert compute_device(Holds(stored_here)) == torch.device("cpu")
    offloaded = SimpleNamespace(device=torch.device("cpu"), device_mesh=SimpleNamespace(device_type="meta"))
    assert compute_device(Holds(offloaded)) == torch.device("meta")
