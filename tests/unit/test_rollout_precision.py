"""Engine precision transforms: fp8 (e4m3, e5m2) and block-scaled fp4 (e2m1) fake quantisation, scale
modes, which weights are touched, and the fp8 KV-cache rounding. Values are hand-computed."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from minirl.rollout.precision import (
    FP4_E2M1_VALUES,
    FP8_E4M3_MAX,
    FP8_E5M2_MAX,
    apply_precision,
    check_fp4_block_size,
    compute_dtype_of,
    dequantize,
    dequantize_fp4,
    fake_quantize_fp4_e2m1,
    fake_quantize_fp8,
    fake_quantize_fp8_e4m3,
    fake_quantize_kv,
    fp8_parameter_names,
    quantize_fp4_e2m1,
    quantize_fp8,
    quantize_fp8_e4m3,
    quantize_fp8_e5m2,
    quantized_input_dims,
    round_to_e2m1,
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
        _q, scale = quantize_fp8_e4m3(w, mode)
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


def test_a_linear_attention_layers_conv_stays_in_the_compute_dtype():
    # Gated DeltaNet's causal conv weight [channels, 1, kernel] is 3-D but no expert tensor: fp8 / fp4 leave it as is
    from tests.unit.test_rollout_native import hybrid_model

    model = hybrid_model()
    names = set(fp8_parameter_names(model))
    deltanet = {f"model.layers.0.linear_attn.{name}.weight" for name in ("in_proj_qkv", "in_proj_z", "in_proj_b",
                                                                         "in_proj_a", "out_proj")}
    assert deltanet <= names and not any("conv1d" in name for name in names)
    conv = model.model.layers[0].linear_attn.conv1d.weight.detach().clone()
    apply_precision(model, "fp4_e2m1", fp4_block_size=16)
    assert torch.equal(model.model.layers[0].linear_attn.conv1d.weight, conv)


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_half_precisions_cast_every_parameter(precision, dtype):
    model = apply_precision(_tiny_moe(), precision)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # buffers keep fp32, as HF loads bf16


# ----------------------------------------------------------------------------- fp8 e5m2


def test_e5m2_max_is_57344():
    assert FP8_E5M2_MAX == 57344.0


def test_e5m2_per_tensor_hand_checked():
    # amax 7 -> scale 7 / 57344 = 2^-13 exactly, so w / scale = 8192 w, and e5m2 keeps 2 mantissa bits
    w = torch.tensor([[7.0, 4.5], [5.5, -0.3]])
    q, scale = quantize_fp8_e5m2(w, "per_tensor")
    assert q.dtype == torch.float8_e5m2
    assert scale.shape == () and scale.item() == 2.0**-13
    # 57344 exact; 36864 halfway between 32768 (mantissa 00) and 40960 (01): ties to even, 32768;
    # 45056 halfway between 40960 (01) and 49152 (10): 49152; -2457.6 -> -2560 (spacing 512 in [2048, 4096))
    assert q.float().tolist() == [[57344.0, 32768.0], [49152.0, -2560.0]]
    assert dequantize(q, scale).tolist() == [[7.0, 4.0], [6.0, -0.3125]]
    # e4m3 (3 mantissa bits) keeps 4.5 and 5.5 exactly where e5m2 cannot
    assert fake_quantize_fp8_e4m3(w).tolist()[0][1] == 4.5


def test_e5m2_per_expert_hand_checked():
    w = torch.zeros(2, 2, 2)
    w[0] = torch.tensor([[7.0, -4.5], [0.0, 1.0]])  # amax 7: scale 2^-13
    w[1] = torch.tensor([[0.875, 0.5625], [-0.6875, 0.0]])  # amax 0.875 = 7/8: scale 2^-16
    q, scale = quantize_fp8(w, "fp8_e5m2", "per_expert")
    assert scale.shape == (2, 1, 1) and scale.flatten().tolist() == [2.0**-13, 2.0**-16]
    assert q[0].float().tolist() == [[57344.0, -32768.0], [0.0, 8192.0]]
    # expert 1 = expert-0 values / 8 on its own scale: 0.5625 * 2^16 = 36864 -> 32768, -0.6875 * 2^16 = -45056 -> -49152
    assert q[1].float().tolist() == [[57344.0, 32768.0], [-49152.0, 0.0]]
    assert fake_quantize_fp8(w, "fp8_e5m2", "per_expert")[1].tolist() == [[0.875, 0.5], [-0.75, 0.0]]
    # one scale for both: expert 1's values sit 8x lower on the grid (same mantissa, here no change)
    assert quantize_fp8(w, "fp8_e5m2", "per_tensor")[1].item() == 2.0**-13


def test_e5m2_round_trip():
    torch.manual_seed(0)
    w = torch.randn(4, 16, 8) * torch.tensor([0.01, 0.1, 1.0, 10.0])[:, None, None]
    for mode in ("per_tensor", "per_expert"):
        q, scale = quantize_fp8_e5m2(w, mode)
        fake = fake_quantize_fp8(w, "fp8_e5m2", mode)
        torch.testing.assert_close(fake, dequantize(q, scale), rtol=0, atol=0)
        units = fake / scale
        torch.testing.assert_close(units, units.to(torch.float8_e5m2).float(), rtol=1e-6, atol=1e-9)  # units up to 57344
        # 2 mantissa bits: relative error at most 2^-3 in the normal range (2^-14 and up)
        normal = w.abs() / scale >= 2.0**-14
        assert ((fake - w).abs() <= w.abs() * 2.0**-3 + 1e-12)[normal].all()
        torch.testing.assert_close(fake_quantize_fp8(fake, "fp8_e5m2", mode), fake, rtol=0, atol=0)  # idempotent
        e4m3_error = (fake_quantize_fp8_e4m3(w, mode) - w).abs().mean()
        assert (fake - w).abs().mean() > 1.5 * e4m3_error  # one mantissa bit less: about 2x the error
    with pytest.raises(ValueError, match="fp8 format"):
        quantize_fp8(w, "fp8_e3m4")


# ----------------------------------------------------------------------------- fp4 e2m1


def test_e2m1_representable_values_are_fixed_points():
    assert FP4_E2M1_VALUES == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    grid = torch.tensor(FP4_E2M1_VALUES)
    assert round_to_e2m1(grid).tolist() == list(FP4_E2M1_VALUES)
    assert round_to_e2m1(-grid).tolist() == [-v for v in FP4_E2M1_VALUES]


def test_e2m1_rounds_to_nearest_ties_to_even_code():
    # midpoints between neighbours go to the code with mantissa bit 0 (0, 1, 2, 4 and 1.0 -> codes 0, 2, 4, 6)
    ties = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}
    x = torch.tensor(list(ties))
    assert round_to_e2m1(x).tolist() == list(ties.values())
    assert round_to_e2m1(-x).tolist() == [-v for v in ties.values()]
    # just off a midpoint: the nearest value
    near = {0.2499: 0.0, 0.2501: 0.5, 0.7499: 0.5, 1.7501: 2.0, 2.4999: 2.0, 2.5001: 3.0, 4.9999: 4.0, 5.0001: 6.0}
    assert round_to_e2m1(torch.tensor(list(near))).tolist() == list(near.values())
    # saturation beyond 6, and the sign of a value rounded to zero is kept
    assert round_to_e2m1(torch.tensor([6.5, 100.0, -7.0])).tolist() == [6.0, 6.0, -6.0]
    assert torch.signbit(round_to_e2m1(torch.tensor([-0.1]))).item()


def test_fp4_blocks_hand_checked():
    w = torch.tensor(
        [
            [3.0, -1.0, 0.5, 0.3, 0.75, -0.375, 0.28125, 0.0],  # blocks: amax 3 (scale 0.5), amax 0.75 (scale 0.125)
            [6.0, 2.5, -0.75, 0.25, 0.0, 0.0, 0.0, 0.0],  # amax 6 (scale 1, three ties), all zero (scale 1)
        ]
    )
    q, scale = quantize_fp4_e2m1(w, block_size=4)
    assert scale.tolist() == [[0.5, 0.125], [1.0, 1.0]]
    # w / scale: [6, -2, 1, 0.6 -> 0.5 | 6, -3, 2.25 -> 2, 0] and [6, 2.5 -> 2, -0.75 -> -1, 0.25 -> 0 | 0 ...]
    assert q.tolist() == [[6.0, -2.0, 1.0, 0.5, 6.0, -3.0, 2.0, 0.0], [6.0, 2.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    expected = [[3.0, -1.0, 0.5, 0.25, 0.75, -0.375, 0.25, 0.0], [6.0, 2.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    assert dequantize_fp4(q, scale, 4).tolist() == expected
    assert fake_quantize_fp4_e2m1(w, 4).tolist() == expected
    # one block of 8 per row: row 0 shares scale 0.5, so 0.28125 / 0.5 = 0.5625 -> 0.5 and -0.375 -> -0.75 -> -1 (tie)
    assert fake_quantize_fp4_e2m1(w, 8)[0].tolist() == [3.0, -1.0, 0.5, 0.25, 0.75, -0.5, 0.25, 0.0]


def test_fp4_blocks_run_along_the_input_dimension():
    torch.manual_seed(0)
    w = torch.randn(3, 64, 16)  # a transposed expert tensor [E, in, out]: blocks along dim 1
    q, scale = quantize_fp4_e2m1(w, 32, dim=-2)
    assert q.shape == w.shape and scale.shape == (3, 2, 16)
    q_t, scale_t = quantize_fp4_e2m1(w.transpose(1, 2), 32)
    assert torch.equal(q, q_t.transpose(1, 2)) and torch.equal(scale, scale_t.transpose(1, 2))
    fake = fake_quantize_fp4_e2m1(w, 32, dim=-2)
    assert set(fake.div(scale.repeat_interleave(32, dim=1)).abs().unique().tolist()) <= set(FP4_E2M1_VALUES)
    torch.testing.assert_close(fake_quantize_fp4_e2m1(fake, 32, dim=-2), fake, rtol=0, atol=1e-6)  # idempotent
    # each block's absmax is exact (it maps to 6); the rest is within half a grid step of the block scale
    assert ((fake - w).abs() <= scale.repeat_interleave(32, dim=1) + 1e-6).all()
    with pytest.raises(ValueError, match="does not divide the input dimension 64"):
        quantize_fp4_e2m1(w, 24, dim=-2)


def test_fp4_touches_the_fp8_weights_with_blocks_along_inputs():
    model = _tiny_moe()
    dims = quantized_input_dims(model)
    assert set(dims) == set(fp8_parameter_names(model)) and set(dims.values()) == {-1}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    apply_precision(model, "fp4_e2m1", fp4_block_size=8)
    for name, param in model.named_parameters():
        if name in dims:
            torch.testing.assert_close(param, fake_quantize_fp4_e2m1(before[name], 8), rtol=0, atol=0)
        else:
            assert torch.equal(param, before[name]), name
    assert compute_dtype_of("fp4_e2m1") == torch.float32 and compute_dtype_of("fp8_e5m2", "bf16") == torch.bfloat16


def test_fp4_block_size_is_checked_against_every_input_dimension():
    model = _tiny_moe()  # input dims: 32 (q/k/v/o, gate_up) and 16 (experts' down_proj)
    check_fp4_block_size(model, 16)
    with pytest.raises(ValueError, match=r"^32 does not divide the input dimension 16 of model\.layers\.0\.mlp\.experts\.down_proj .*use a divisor of 16$"):
        check_fp4_block_size(model, 32)
    with pytest.raises(ValueError, match="must be >= 1"):
        check_fp4_block_size(model, 0)
    with pytest.raises(ValueError, match="does not divide"):
        apply_precision(_tiny_moe(), "fp4_e2m1", fp4_block_size=32)


# ----------------------------------------------------------------------------- fp8 KV cache


def test_kv_quantisation_hand_checked_per_token_and_head():
    tiny = 2.0**-30  # a vector far below the first: one shared scale would flush it to zero
    x = torch.tensor([[7.0, 4.5, 5.5, -0.3], [7.0 * tiny, 4.5 * tiny, 5.5 * tiny, -0.3 * tiny]])
    # e5m2: amax 7 -> scale 2^-13 (as in the weight test above); the second vector gets its own scale 2^-43
    e5m2 = fake_quantize_kv(x, "fp8_e5m2")
    assert e5m2[0].tolist() == [7.0, 4.0, 6.0, -0.3125]
    torch.testing.assert_close(e5m2[1], e5m2[0] * tiny, rtol=0, atol=0)
    # e4m3: scale 7 / 448 = 2^-6: 448, 288, 352 exact, -19.2 -> -20 (spacing 2 in [16, 32))
    e4m3 = fake_quantize_kv(x, "fp8_e4m3")
    assert e4m3[0].tolist() == [7.0, 4.5, 5.5, -0.3125]
    torch.testing.assert_close(e4m3[1], e4m3[0] * tiny, rtol=0, atol=0)
    # the cache layout [batch, kv heads, tokens, head_dim]: one scale per (batch, head, token)
    cache_like = x.reshape(1, 2, 1, 4)
    assert torch.equal(fake_quantize_kv(cache_like, "fp8_e4m3"), e4m3.reshape(1, 2, 1, 4))
    assert fake_quantize_kv(x.to(torch.bfloat16), "fp8_e4m3").dtype == torch.bfloat16
    assert torch.equal(fake_quantize_kv(torch.zeros(2, 4), "fp8_e4m3"), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="KV cache precision"):
        fake_quantize_kv(x, "same")
