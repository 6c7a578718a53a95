"""Engine precision transforms: fp8-e4m3 fake quantisation, scale modes, which weights are touched."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from minirl.rollout.precision import (
    FP8_E4M3_MAX,
    apply_precision,
    compute_dtype_of,
    dequantize,
    fake_quantize_fp8_e4m3,
    fp8_parameter_names,
    quantize_fp8_e4m3,
)


def test_e4m3_max_is_448():
    assert FP8_E4M3_MAX == 448.0


def test_per_tensor_scale_hand_checked():
    w = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    q, scale = quantize_fp8_e4m3(w, "per_tensor")
    assert q.dtype == torch.float8_e4m3fn
    assert scale.shape == () and scale.item() == pytest.approx(2.0 / 448.0)
    # w / scale = [[112, -448], [224, 56]]: all exactly representable in e4m3
    assert q.float().tolist() == [[112.0, -448.0], [224.0, 56.0]]
    torch.testing.assert_close(dequantize(q, scale), w, rtol=0, atol=1e-7)


def test_per_expert_scale_hand_checked():
    w = torch.zeros(2, 2, 2)
    w[0] = torch.tensor([[1.0, -0.5], [0.25, 0.0]])  # amax 1
    w[1] = torch.tensor([[4.0, 3.0], [-1.0, 0.1]])  # amax 4
    q, scale = quantize_fp8_e4m3(w, "per_expert")
    assert scale.shape == (2, 1, 1)
    assert scale.flatten().tolist() == pytest.approx([1.0 / 448.0, 4.0 / 448.0])
    assert q[0].float().tolist() == [[448.0, -224.0], [112.0, 0.0]]
    # expert 1: 3/scale = 336 lies halfway between e4m3 neighbours 320 and 352 (spacing 32 in
    # [256, 512)): ties go to the even mantissa, 320; 0.1/scale = 11.2 -> 11 (spacing 1 in [8, 16))
    assert q[1].float().tolist() == [[448.0, 320.0], [-112.0, 11.0]]
    _, tensor_scale = quantize_fp8_e4m3(w, "per_tensor")
    assert tensor_scale.item() == pytest.approx(4.0 / 448.0)  # one scale: expert 0 loses range
    # 2-D tensors fall back to one scale in per_expert mode
    assert quantize_fp8_e4m3(w[0], "per_expert")[1].shape == ()


def test_dequantised_values_are_e4m3_values():
    torch.manual_seed(0)
    w = torch.randn(4, 16, 8) * torch.tensor([0.01, 0.1, 1.0, 10.0])[:, None, None]
    for mode in ("per_tensor", "per_expert"):
        q, scale = quantize_fp8_e4m3(w, mode)
        fake = fake_quantize_fp8_e4m3(w, mode)
        units = fake / scale  # back on the e4m3 grid
        torch.testing.assert_close(units, units.to(torch.float8_e4m3fn).float(), rtol=0, atol=1e-4)
        assert units.abs().max() <= FP8_E4M3_MAX + 1e-3
        assert len(units.unique()) <= 256
        # relative error of e4m3 (3 mantissa bits) is at most 2^-4 for values in the normal range
        normal = w.abs() / scale >= 2.0**-6
        assert ((fake - w).abs() <= w.abs() * 2.0**-4 + 1e-12)[normal].all()
        # idempotent: a quantised tensor re-quantises to itself
        torch.testing.assert_close(fake_quantize_fp8_e4m3(fake, mode), fake, rtol=0, atol=0)
    zeros = torch.zeros(2, 3)
    assert torch.equal(fake_quantize_fp8_e4m3(zeros), zeros)  # amax 0: scale 1, no NaN


def test_scale_mode_is_validated():
    with pytest.raises(ValueError, match="scale mode"):
        quantize_fp8_e4m3(torch.ones(2, 2), "per_row")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="precision"):
        compute_dtype_of("int4")
    with pytest.raises(ValueError, match="conflicts"):
        compute_dtype_of("bf16", "fp32")
    assert compute_dtype_of("fp8_e4m3") == torch.float32
    assert compute_dtype_of("fp8_e4m3", "bf16") == torch.bfloat16


def _tiny_moe() -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, intermediate_size=64,
        max_position_embeddings=64, initializer_range=0.1,
    )  # fmt: skip
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM._from_config(config, dtype=torch.float32)


def test_fp8_touches_linear_and_expert_weights_only():
    model = _tiny_moe()
    names = set(fp8_parameter_names(model))
    assert names == {
        f"model.layers.{i}.{suffix}"
        for i in range(2)
        for suffix in (
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj",
        )
    }  # fmt: skip
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    apply_precision(model, "fp8_e4m3", fp8_scale="per_expert")
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32
        if name in names:
            assert not torch.equal(param, before[name]), name
            torch.testing.assert_close(param, fake_quantize_fp8_e4m3(before[name], "per_expert"), rtol=0, atol=0)
        else:  # embeddings, norms, routers, lm_head stay exact
            assert torch.equal(param, before[name]), name
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_half_precisions_cast_every_parameter(precision, dtype):
    model = apply_precision(_tiny_moe(), precision)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # buffers keep fp32, as HF loads bf16
