"""``optim.precision``: bf16 and fp16 mixed precision (autocast forward, float32 master weights, gradients and
AdamW state; fp16 with a dynamic loss scale); fp32 unchanged; checkpoints keep the model's dtype; the config names
its key."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from safetensors import safe_open

from minirl.algo import token_logprobs
from minirl.batching import collate
from minirl.config import ConfigError, load_config
from minirl.precision import LossScale, compute_context, fsdp_policy
from minirl.runtime import build_trainer
from minirl.trainer import Trainer
from minirl.types import Completion
from tests.conftest import make_tiny_moe

PAD = 0


def batch_of(rows: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    completions = []
    for row in range(rows):
        prompt = torch.randint(2, 48, (5,), generator=g).tolist()
        completion = torch.randint(2, 48, (4 + row % 3,), generator=g).tolist()
        completions.append(Completion(prompt_index=row // 2, sample_index=row % 2, prompt_ids=prompt, completion_ids=completion,
                                      logp_rollout=torch.full((len(completion),), -1.0), finish_reason="length"))
    advantages = torch.linspace(-1, 1, rows)
    return collate(completions, advantages, pad_token_id=PAD)


def objective(logp: torch.Tensor, micro) -> tuple[torch.Tensor, dict[str, float]]:
    return -(logp * micro.advantages[:, None] * micro.mask).sum(), {}


def test_fp32_wraps_nothing_and_bf16_is_autocast():
    assert isinstance(compute_context("fp32", "cpu"), nullcontext)
    context = compute_context("bf16", "cpu")
    assert isinstance(context, torch.autocast) and context.fast_dtype == torch.bfloat16
    assert fsdp_policy("fp32") is None
    policy = fsdp_policy("bf16")
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    context = compute_context("fp16", "cpu")
    assert isinstance(context, torch.autocast) and context.fast_dtype == torch.float16
    assert fsdp_policy("fp16").param_dtype == torch.float16
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        compute_context("fp8", "cpu")


def test_bf16_score_is_the_autocast_forward_and_differs_from_fp32():
    model = make_tiny_moe(0).eval()
    batch = batch_of()
    fp32 = Trainer(model, lr=0.0).score(batch, entropy=False).logp
    bf16 = Trainer(model, lr=0.0, precision="bf16").score(batch, entropy=False).logp
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=batch.input_ids, use_cache=False).logits
    expected = token_logprobs(logits[:, :-1].float(), batch.input_ids[:, 1:]) * batch.mask
    assert torch.equal(bf16, expected)
    gap = (bf16 - fp32)[batch.mask].abs()
    assert 0 < float(gap.max()) < 0.1  # bf16 keeps ~3 significant digits: a real, small difference
    assert torch.equal(fp32, Trainer(model, lr=0.0, precision="fp32").score(batch, entropy=False).logp)


def test_bf16_update_keeps_float32_master_weights_and_optimizer_state(tmp_path):
    model = make_tiny_moe(0)
    trainer = Trainer(model, lr=1e-5, precision="bf16")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    result = trainer.update(batch_of(), objective)
    assert result.fault is None and result.grad_norm > 0
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for state in trainer.optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    moved = [name for name, p in model.named_parameters() if not torch.equal(p, before[name])]
    assert len(moved) > len(before) // 2
    # steps of ~lr are below bf16's resolution at most weights: bf16 weights would not have moved
    name = "model.layers.0.self_attn.q_proj.weight"
    after = model.get_parameter(name).detach()
    assert float((after.bfloat16() == before[name].bfloat16()).float().mean()) > 0.5

    from minirl.models.io import save_checkpoint
    from minirl.models.tokenizer import build_char_tokenizer

    save_checkpoint(model, build_char_tokenizer(), tmp_path / "ckpt")
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(key).get_dtype() for key in f.keys()} == {"F32"}  # the dtype the model came in


def test_a_bf16_model_comes_back_bf16_the_trainers_weights_rounded_once(tmp_path):
    """A model directory in bf16 (config.json "dtype"): trained in fp32 master weights, written back in bf16 (plain and
    merged LoRA alike), its config saying so; a preset or a directory naming no dtype: as trained (fp32)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from minirl.models.io import dtype_on_disk, load_model_and_tokenizer, save_checkpoint
    from minirl.models.lora import add_lora
    from minirl.models.tokenizer import build_char_tokenizer

    make_tiny_moe(0).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    build_char_tokenizer().save_pretrained(tmp_path / "bf16")
    assert dtype_on_disk(tmp_path / "bf16") == torch.bfloat16
    assert dtype_on_disk("qwen3-moe-2m") is None and dtype_on_disk(tmp_path / "nothing") is None
    model, tokenizer = load_model_and_tokenizer(str(tmp_path / "bf16"))
    assert next(model.parameters()).dtype == torch.float32
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1e-3)  # a step below bf16's resolution at some weights: rounded once, on the way out
    save_checkpoint(model, tokenizer, tmp_path / "out", dtype=dtype_on_disk(tmp_path / "bf16"))
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(key).get_dtype() for key in f.keys()} == {"BF16"}
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.bfloat16).state_dict()
    assert all(torch.equal(back[key], value.to(torch.bfloat16)) for key, value in model.state_dict().items())
    assert '"dtype": "bfloat16"' in (tmp_path / "out" / "config.json").read_text()
    assert next(model.parameters()).dtype == torch.float32  # the trainer's weights are left as they were
    add_lora(model, rank=2, alpha=4.0, dropout=0.0, target_modules=["q_proj"])
    save_checkpoint(model, tokenizer, tmp_path / "lora", dtype=torch.bfloat16)
    with safe_open(str(tmp_path / "lora" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(key).get_dtype() for key in f.keys()} == {"BF16"}


def test_config_knobs_reach_the_trainer_and_name_their_key():
    cfg = load_config(None, ["optim.precision=bf16"])
    trainer = build_trainer(cfg, make_tiny_moe(0), replay=None)
    assert trainer.precision == "bf16"
    assert load_config(None).optim.precision == "fp32" and load_config(None).optim.allow_tf32 is False
    assert build_trainer(load_config(None, ["optim.precision=fp16"]), make_tiny_moe(0), replay=None).loss_scale.enabled
    with pytest.raises(ConfigError, match=r"optim.precision: must be 'fp32', 'bf16' or 'fp16'"):
        load_config(None, ["optim.precision=fp8_e4m3"])


def test_bf16_runs_the_fused_experts_in_bf16_and_fp32_in_fp32(monkeypatch):
    """transformers' grouped_mm experts are outside autocast's op list: under bf16 their weights are
    cast by ``autocast_experts``; the float32 parameters still get float32 gradients."""
    import transformers.integrations.moe as moe

    seen: list[torch.dtype] = []
    original = moe._grouped_mm
    monkeypatch.setattr(moe, "_grouped_mm", lambda x, w, offs: seen.append(w.dtype) or original(x, w, offs))
    model = make_tiny_moe(0)
    Trainer(model, lr=0.0).score(batch_of(), entropy=False)
    assert set(seen) == {torch.float32}
    seen.clear()
    trainer = Trainer(model, lr=1e-3, precision="bf16")
    trainer.update(batch_of(), objective)
    assert set(seen) == {torch.bfloat16}
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.dtype == torch.float32 and "gate_up_proj" not in experts.__dict__  # casts dropped
    seen.clear()
    Trainer(model, lr=0.0).score(batch_of(), entropy=False)  # the hooks stay, inert outside autocast
    assert set(seen) == {torch.float32}


def test_the_loss_scale_follows_grad_scalers_rule():
    """Halved on an overflow (a non-finite gradient norm), doubled after ``growth_interval`` finite updates in a row,
    an overflow resetting the count; at a scale of 1 a non-finite gradient is no overflow (the caller's fault);
    its state survives a checkpoint; off (fp32, bf16) it is the identity."""
    scale = LossScale("fp16", init_scale=8.0, growth_interval=2)
    loss = torch.tensor(3.0)
    assert float(scale.scaled(loss)) == 24.0
    assert scale.overflowed(float("inf")) and scale.scale == 4.0
    assert not scale.overflowed(1.0) and scale.scale == 4.0
    assert scale.overflowed(float("nan")) and scale.scale == 2.0  # the count of finite updates starts again
    assert not scale.overflowed(1.0) and not scale.overflowed(2.0) and scale.scale == 4.0
    assert not scale.overflowed(1.0) and scale.state_dict() == {"scale": 4.0, "finite_in_a_row": 1, "hysteresis_left": 1}
    grad = torch.nn.Parameter(torch.zeros(2))
    grad.grad = torch.tensor([8.0, float("inf")])
    scale.unscale([grad])
    assert grad.grad.tolist() == [2.0, float("inf")]
    resumed = LossScale("fp16")
    resumed.load_state_dict(scale.state_dict())
    assert resumed.state_dict() == {"scale": 4.0, "finite_in_a_row": 1, "hysteresis_left": 1}
    resumed.load_state_dict({"scale": 2.0, "finite_in_a_row": 0})  # a checkpoint written before hysteresis
    assert resumed.state_dict() == {"scale": 2.0, "finite_in_a_row": 0, "hysteresis_left": 1}
    floor = LossScale("fp16", init_scale=1.0)
    assert not floor.overflowed(float("inf")) and floor.scale == 1.0
    off = LossScale("bf16")
    assert off.scaled(loss) is loss and not off.overflowed(float("inf")) and off.scale == 1.0
    off.load_state_dict({"scale": 4.0, "finite_in_a_row": 1})
    assert off.scale == 1.0


def test_the_loss_scale_follows_megatrons_rule_with_hysteresis_and_a_floor():
    """Megatron-LM's ``DynamicGradScaler`` (and DeepSpeed's): with hysteresis 2 the first overflow since the scale
    last grew only skips; later ones halve, never below the floor; at the floor a non-finite gradient is the caller's
    fault; a growth restores the hysteresis. Hand-stepped."""
    scale = LossScale("fp16", init_scale=16.0, growth_interval=2, min_scale=4.0, hysteresis=2)
    steps = [(float("inf"), True, 16.0), (float("inf"), True, 8.0), (float("inf"), True, 4.0),
             (float("inf"), False, 4.0), (1.0, False, 4.0), (1.0, False, 8.0), (float("nan"), True, 8.0),
             (1.0, False, 8.0), (float("inf"), True, 4.0), (1.0, False, 4.0), (1.0, False, 8.0)]
    for norm, skipped, after in steps:
        assert (scale.overflowed(norm), scale.scale) == (skipped, after), (norm, skipped, after)
    assert scale.state_dict() == {"scale": 8.0, "finite_in_a_row": 0, "hysteresis_left": 2}
    uneven = LossScale("fp16", init_scale=6.0, min_scale=4.0)
    assert uneven.overflowed(float("inf")) and uneven.scale == 4.0  # halved to 3, held at the floor
    with pytest.raises(ValueError, match="min_scale <= init_scale"):
        LossScale("fp16", init_scale=1.0, min_scale=2.0)


def test_the_loss_scale_keys_reach_the_policy_and_the_critic_and_name_their_key():
    from minirl.critic import build_critic

    keys = ["optim.precision=fp16", "optim.loss_scale_initial=4294967296", "optim.loss_scale_window_updates=1000",
            "optim.loss_scale_min=2", "optim.loss_scale_hysteresis=2"]
    cfg = load_config(None, keys)
    for scale in (build_trainer(cfg, make_tiny_moe(0), replay=None).loss_scale,
                  build_critic(load_config(None, [*keys, "algo.adv_baseline=critic"]), make_tiny_moe(0)).loss_scale):
        assert (scale.scale, scale.growth_interval, scale.min_scale, scale.hysteresis) == (2.0**32, 1000, 2.0, 2)
    with pytest.raises(ConfigError, match=r"optim: .*loss_scale_min \(8.0\) must not exceed loss_scale_initial \(4.0\)"):
        load_config(None, ["optim.loss_scale_initial=4", "optim.loss_scale_min=8"])
    with pytest.raises(ConfigError, match=r"optim.loss_scale_hysteresis: "):
        load_config(None, ["optim.loss_scale_hysteresis=0"])


def test_fp16_keeps_more_of_fp32s_log_probs_than_bf16_and_computes_in_fp16():
    """fp16's 10-bit mantissa against bf16's 7: the same autocast forward, closer to fp32 (the FP16 paper's point),
    and not fp32 itself."""
    model = make_tiny_moe(0).eval()
    batch = batch_of()
    fp32, bf16, fp16 = (Trainer(model, lr=0.0, precision=p).score(batch, entropy=False).logp for p in ("fp32", "bf16", "fp16"))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        logits = model(input_ids=batch.input_ids, use_cache=False).logits
    assert torch.equal(fp16, token_logprobs(logits[:, :-1].float(), batch.input_ids[:, 1:]) * batch.mask)
    gap16, gap_bf16 = (float((x - fp32)[batch.mask].abs().max()) for x in (fp16, bf16))
    assert 0 < gap16 < gap_bf16 / 4, (gap16, gap_bf16)


def test_an_fp16_update_that_overflows_is_skipped_and_halves_the_scale_without_a_fault():
    """At a loss scale the gradient overflows in fp16 the update is skipped (weights and AdamW state untouched) and
    the scale halved; that is no numerical fault. At a scale it fits, the unscaled gradient is the fp32 one to fp16's
    precision, and the update steps; a checkpoint keeps the scale."""
    model = make_tiny_moe(0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(model, lr=1e-3, precision="fp16")
    trainer.loss_scale.scale = 2.0**40  # 1e12 x the loss: its gradients are past fp16's 65504
    skipped = trainer.update(batch_of(), objective)
    assert skipped.overflowed and skipped.fault.startswith("fp16 gradient overflow at loss scale 1.09951e+12")
    assert skipped.loss_scale == trainer.loss_scale.scale == 2.0**39
    assert trainer.faults == trainer.consecutive_faults == 0 and trainer.updates_done == 0
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters()) and not trainer.optimizer.state
    trainer.loss_scale.scale = 1024.0
    stepped = trainer.update(batch_of(), objective)
    reference = Trainer(make_tiny_moe(0), lr=1e-3).update(batch_of(), objective)
    assert stepped.fault is None and not stepped.overflowed and stepped.loss_scale == 1024.0
    assert stepped.grad_norm == pytest.approx(reference.grad_norm, rel=1e-2) and trainer.updates_done == 1
    assert any(not torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert trainer.checkpoint_state()["loss_scale"] == {"scale": 1024.0, "finite_in_a_row": 1, "hysteresis_left": 0}
    resumed = Trainer(make_tiny_moe(0), lr=1e-3, precision="fp16")
    resumed.load_checkpoint_state(trainer.checkpoint_state())
    assert resumed.loss_scale.state_dict() == {"scale": 1024.0, "finite_in_a_row": 1, "hysteresis_left": 0}
