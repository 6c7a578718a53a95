"""The rollout engine's numeric precision: the knob that creates a training–inference mismatch.

On CPU the engine and the trainer run the same kernels, so the only honest source of the paper's
training–inference discrepancy is the engine computing in lower precision (cpu-facts.md). This
module holds that transform as pure functions on a model's parameters (and, for the KV cache, on
key/value states), so a study can sweep the mismatch from none to fp4:

``fp32``       no change (the engine equals the trainer to ~1e-7 in log-prob).
``bf16``       every parameter and all activations in bfloat16.
``fp16``       every parameter and all activations in float16.
``fp8_e4m3``   weight-only fake quantisation, as an FP8 inference engine stores weights: each
               weight matrix of a ``Linear`` layer (attention q/k/v/o, dense MLP) and each 3-D
               expert tensor is rounded to ``torch.float8_e4m3fn`` with an fp32 scale
               (``amax / 448``) and dequantised back, so compute runs in ``compute_dtype``
               (fp32 by default: the mismatch is then the weight rounding alone; ``bf16`` adds
               bf16 activations as in a real FP8 deployment).
               Kept in ``compute_dtype``, as vLLM's FP8 path keeps them: embeddings, norms,
               biases, the lm_head, and the MoE routers (``*.gate`` / ``*.router``), so routing
               only moves through the perturbed hidden states, never through a rounded router.
``fp8_e5m2``   the same weights, the same scales (``fp8_scale``), rounded to
               ``torch.float8_e5m2`` instead (2 mantissa bits, scale ``amax / 57344``): half the
               precision of e4m3 for much more range a scaled weight does not need, so a larger
               mismatch.
``fp4_e2m1``   the same weights, block-scaled as in MXFP4 / NVFP4: every ``fp4_block_size``
               (default 32) consecutive values along a weight's *input* dimension share one fp32
               scale ``block absmax / 6``; each value divided by its block's scale is rounded to
               the nearest e2m1 value {0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6}, ties to the even code
               (the one whose mantissa bit is 0: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
               2.5 -> 2, 3.5 -> 4, 5 -> 4, as IEEE round-half-to-even does), and multiplied back.
               The scale is kept in fp32 (not rounded to E8M0 as MXFP4 does, nor to e4m3 as
               NVFP4 does): the mismatch is the 4-bit element rounding alone. ``fp8_scale`` does
               not apply (block scales are finer than per-expert ones). The input dimension is
               the last one of a ``Linear`` weight [out, in] and of a fused expert tensor
               [E, out, in]; the middle one of a transposed expert tensor [E, in, out]
               (``experts.is_transposed``, GPT-OSS). The block size must divide every such
               input dimension (``check_fp4_block_size``).

All weight-only formats are simulated (quantise -> dequantise into ``compute_dtype``): torch has
no fp8/fp4 matmul on CPU, and the dequantised weight is exactly what such a kernel multiplies by.

Scales (``fp8_scale``, fp8 only): ``per_tensor`` (one scale per weight tensor) or ``per_expert``
(one scale per expert slice ``w[e]`` of a 3-D expert tensor; 2-D matrices stay per-tensor).

KV cache (``kv_cache_precision``, ``fake_quantize_kv``): ``same`` keeps keys and values in the
compute dtype; ``fp8_e4m3`` / ``fp8_e5m2`` round each cached key and value vector (one token, one
KV head: the ``head_dim`` values) to fp8 with its own dynamic fp32 scale ``amax / fp8 max``, as
vLLM's per-token-head fp8 KV cache does. The rounding happens once, when a token's key/value is
written (post-RoPE, post-norm), so what attention reads back is bitwise what an fp8 store with
per-token-head scales dequantised on read would give; the new tokens of a step attend to their
own rounded keys too, as with a kernel that reads the cache it just wrote.
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

import torch
from torch import nn

Precision = Literal["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"]
ScaleMode = Literal["per_tensor", "per_expert"]
KVCachePrecision = Literal["same", "fp8_e4m3", "fp8_e5m2"]

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
WEIGHT_ONLY: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
"""Formats that round the weights but compute in ``compute_dtype``."""
SCALE_MODES: tuple[str, ...] = ("per_tensor", "per_expert")
KV_CACHE_PRECISIONS: tuple[str, ...] = ("same", "fp8_e4m3", "fp8_e5m2")
FP8_DTYPES: dict[str, torch.dtype] = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448.0
FP8_E5M2_MAX = float(torch.finfo(torch.float8_e5m2).max)  # 57344.0
FP8_MAX: dict[str, float] = {"fp8_e4m3": FP8_E4M3_MAX, "fp8_e5m2": FP8_E5M2_MAX}
FP4_E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""The non-negative e2m1 values; the index is the 3-bit code (exponent, mantissa), so an even
index has mantissa bit 0."""
FP4_E2M1_MAX = 6.0
DEFAULT_FP4_BLOCK_SIZE = 32

_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Last component of a module name that marks a router / gate kept in high precision.
_ROUTER_NAMES = frozenset({"gate", "router", "shared_expert_gate"})


def dtype_of(name: str) -> torch.dtype:
    """``"fp32" | "bf16" | "fp16"`` -> the torch dtype."""
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype name {name!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def compute_dtype_of(precision: str, compute_dtype: str | None = None) -> torch.dtype:
    """The dtype activations and stored weights have under ``precision``.

    ``compute_dtype`` only applies to weight-only formats (``WEIGHT_ONLY``; default fp32); for the
    others the precision is the compute dtype and a conflicting ``compute_dtype`` is an error.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    if precision in WEIGHT_ONLY:
        return dtype_of(compute_dtype or "fp32")
    if compute_dtype is not None and dtype_of(compute_dtype) != _DTYPES[precision]:
        raise ValueError(f"compute_dtype={compute_dtype!r} conflicts with precision={precision!r}")
    return _DTYPES[precision]


# ----------------------------------------------------------------------------- fp8


def quantize_fp8(
    w: torch.Tensor, fmt: str = "fp8_e4m3", scale_mode: ScaleMode = "per_tensor"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``w`` to float8 ``fmt`` (``fp8_e4m3`` or ``fp8_e5m2``; round to nearest even,
    saturating at the format's max, 448 or 57344).

    Returns ``(q, scale)`` with ``q`` of the fp8 dtype and ``w ~= q * scale``.
    ``scale = amax / max`` in fp32: a scalar for ``per_tensor`` (and for any tensor that is not
    3-D), shape [E, 1, 1] for ``per_expert`` on a 3-D expert tensor [E, ., .]. An all-zero slice
    gets scale 1.
    """
    if fmt not in FP8_DTYPES:
        raise ValueError(f"unknown fp8 format {fmt!r}; expected one of {tuple(FP8_DTYPES)}")
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"unknown fp8 scale mode {scale_mode!r}; expected one of {SCALE_MODES}")
    fmax = FP8_MAX[fmt]
    w32 = w.detach().float()
    if scale_mode == "per_expert" and w32.ndim == 3:
        amax = w32.abs().amax(dim=(1, 2), keepdim=True)
    else:
        amax = w32.abs().amax()
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    q = (w32 / scale).clamp(-fmax, fmax).to(FP8_DTYPES[fmt])
    return q, scale


def quantize_fp8_e4m3(w: torch.Tensor, scale_mode: ScaleMode = "per_tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8(w, "fp8_e4m3", scale_mode)``: ``q`` of dtype ``torch.float8_e4m3fn``, scale ``amax / 448``."""
    return quantize_fp8(w, "fp8_e4m3", scale_mode)


def quantize_fp8_e5m2(w: torch.Tensor, scale_mode: ScaleMode = "per_tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8(w, "fp8_e5m2", scale_mode)``: ``q`` of dtype ``torch.float8_e5m2``, scale ``amax / 57344``."""
    return quantize_fp8(w, "fp8_e5m2", scale_mode)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` computed in fp32, then cast to ``dtype``."""
    return (q.float() * scale).to(dtype)


def fake_quantize_fp8(
    w: torch.Tensor, fmt: str = "fp8_e4m3", scale_mode: ScaleMode = "per_tensor", dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``w`` rounded through float8 ``fmt`` and back, in ``dtype`` (default: ``w.dtype``)."""
    q, scale = quantize_fp8(w, fmt, scale_mode)
    return dequantize(q, scale, dtype or w.dtype)


def fake_quantize_fp8_e4m3(
    w: torch.Tensor, scale_mode: ScaleMode = "per_tensor", dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``w`` rounded through float8 e4m3 and back, in ``dtype`` (default: ``w.dtype``)."""
    return fake_quantize_fp8(w, "fp8_e4m3", scale_mode, dtype)


# ----------------------------------------------------------------------------- fp4 (e2m1, blocks)

_E2M1_GRID = torch.tensor(FP4_E2M1_VALUES)
_E2M1_MIDPOINTS = (_E2M1_GRID[1:] + _E2M1_GRID[:-1]) / 2  # 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 (exact)


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Each value of ``x`` rounded to the nearest e2m1 value, ties to the even code, in fp32.

    Saturates at ±6 (anything beyond rounds to ±6); the sign is kept (-0.1 -> -0.0).
    """
    x32 = x.float()
    magnitude = x32.abs().contiguous()
    midpoints = _E2M1_MIDPOINTS.to(x32.device)
    # code = number of midpoints strictly below |x|: the nearest value, ties going down ...
    code = torch.bucketize(magnitude, midpoints, right=False)
    # ... then a tie (|x| exactly a midpoint) goes up where the upper neighbour's code is even
    tie = (code < len(FP4_E2M1_VALUES) - 1) & (magnitude == midpoints[code.clamp(max=len(midpoints) - 1)])
    code = torch.where(tie & (code % 2 == 1), code + 1, code)
    return torch.copysign(_E2M1_GRID.to(x32.device)[code], x32)


def _blocks_last(w: torch.Tensor, block_size: int, dim: int) -> tuple[torch.Tensor, int]:
    """``w`` in fp32 with ``dim`` moved last and split into blocks: [..., n_blocks, block_size]."""
    dim = dim % w.ndim
    size = w.shape[dim]
    if block_size < 1 or size % block_size:
        raise ValueError(f"fp4 block size {block_size} does not divide the input dimension {size} of a {tuple(w.shape)} tensor")
    moved = w.detach().float().movedim(dim, -1)
    return moved.reshape(*moved.shape[:-1], size // block_size, block_size), dim


def quantize_fp4_e2m1(
    w: torch.Tensor, block_size: int = DEFAULT_FP4_BLOCK_SIZE, dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-scaled fp4 (e2m1): ``(q, scale)`` with ``w ~= dequantize_fp4(q, scale, block_size, dim)``.

    Blocks are ``block_size`` consecutive values along ``dim`` (the input dimension). ``q`` has
    ``w``'s shape, fp32 values on the e2m1 grid; ``scale`` is fp32 with ``w``'s shape except
    ``dim``, which holds one entry per block: ``block absmax / 6`` (1 for an all-zero block).
    """
    blocks, dim = _blocks_last(w, block_size, dim)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP4_E2M1_MAX, torch.ones_like(amax))
    q = round_to_e2m1(blocks / scale)
    q = q.reshape(*q.shape[:-2], -1).movedim(-1, dim)
    return q, scale.squeeze(-1).movedim(-1, dim)


def dequantize_fp4(
    q: torch.Tensor, scale: torch.Tensor, block_size: int, dim: int = -1, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``q * scale`` (each block's scale repeated over its ``block_size`` values along ``dim``) in fp32, cast to ``dtype``."""
    return (q.float() * scale.repeat_interleave(block_size, dim=dim)).to(dtype)


def fake_quantize_fp4_e2m1(
    w: torch.Tensor, block_size: int = DEFAULT_FP4_BLOCK_SIZE, dim: int = -1, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``w`` rounded through block-scaled e2m1 and back, in ``dtype`` (default: ``w.dtype``)."""
    q, scale = quantize_fp4_e2m1(w, block_size, dim)
    return dequantize_fp4(q, scale, block_size, dim, dtype or w.dtype)


# ----------------------------------------------------------------------------- one entry point


def fake_quantize(
    w: torch.Tensor,
    precision: str,
    *,
    fp8_scale: ScaleMode = "per_tensor",
    fp4_block_size: int = DEFAULT_FP4_BLOCK_SIZE,
    input_dim: int = -1,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``w`` through the weight-only format ``precision`` (one of ``WEIGHT_ONLY``) and back."""
    if precision in FP8_DTYPES:
        return fake_quantize_fp8(w, precision, fp8_scale, dtype)
    if precision == "fp4_e2m1":
        return fake_quantize_fp4_e2m1(w, fp4_block_size, input_dim, dtype)
    raise ValueError(f"{precision!r} is not a weight-only format; expected one of {WEIGHT_ONLY}")


def fake_quantize_kv(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Keys or values [..., head_dim] through fp8 ``fmt`` with one dynamic scale per vector, in ``x.dtype``.

    Each vector (one token of one KV head) gets ``scale = amax / fp8 max`` over its ``head_dim``
    values (1 for an all-zero vector); see the module docstring.
    """
    if fmt not in FP8_DTYPES:
        raise ValueError(f"unknown KV cache precision {fmt!r}; expected one of {KV_CACHE_PRECISIONS}")
    fmax = FP8_MAX[fmt]
    x32 = x.float()
    amax = x32.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    return ((x32 / scale).clamp(-fmax, fmax).to(FP8_DTYPES[fmt]).float() * scale).to(x.dtype)


# ----------------------------------------------------------------------------- which weights


def fp8_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters the weight-only formats quantise (see the module docstring for the rule)."""
    return list(quantized_input_dims(model))


def quantized_input_dims(model: nn.Module) -> dict[str, int]:
    """``{parameter name: its input dimension}`` of every parameter the weight-only formats quantise.

    ``Linear`` weights [out, in] -> -1; 3-D expert tensors -> -1 ([E, out, in], as ``F.linear``
    takes them), or -2 on a module with ``is_transposed = True`` ([E, in, out]). Convolutions (the short causal
    conv of linear-attention and Mamba layers, whose 3-D weight is [channels, 1, kernel]) stay in the compute
    dtype, as inference engines keep them.
    """
    output_embeddings = cast(Any, model).get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    dims: dict[str, int] = {}
    for module_name, module in model.named_modules():
        if module is output_embeddings or module_name.rsplit(".", 1)[-1] in _ROUTER_NAMES:
            continue
        prefix = f"{module_name}." if module_name else ""
        if isinstance(module, nn.Linear):
            dims[f"{prefix}weight"] = -1
            continue
        if isinstance(module, nn.modules.conv._ConvNd):
            continue
        for param_name, param in module.named_parameters(recurse=False):
            if param.ndim == 3:  # fused expert tensors [E, out, in] / [E, in, out]
                dims[f"{prefix}{param_name}"] = -2 if getattr(module, "is_transposed", False) else -1
    return dims


def check_fp4_block_size(model: nn.Module, block_size: int, input_dims: dict[str, int] | None = None) -> None:
    """Raise ``ValueError`` (one line) unless ``block_size`` >= 1 divides the input dimension of
    every weight fp4 quantises."""
    if block_size < 1:
        raise ValueError(f"must be >= 1 (got {block_size})")
    params = dict(model.named_parameters(remove_duplicate=False))
    sizes = {name: params[name].shape[dim] for name, dim in (input_dims or quantized_input_dims(model)).items()}
    bad = {name: size for name, size in sizes.items() if size % block_size}
    if bad:
        name, size = next(iter(bad.items()))
        largest = math.gcd(*sizes.values())
        raise ValueError(
            f"{block_size} does not divide the input dimension {size} of {name} "
            f"(and {len(bad) - 1} more weight(s)); use a divisor of {largest}"
        )


@torch.no_grad()
def apply_precision(
    model: nn.Module,
    precision: Precision,
    *,
    fp8_scale: ScaleMode = "per_tensor",
    compute_dtype: str | None = None,
    fp8_names: list[str] | None = None,
    fp4_block_size: int = DEFAULT_FP4_BLOCK_SIZE,
) -> nn.Module:
    """Put ``model`` (in place) into ``precision``; returns it.

    Casts every parameter to the compute dtype (buffers such as rotary frequencies stay as they
    are, fp32, as when Hugging Face loads a model in bf16), then, for a weight-only format,
    replaces each parameter in ``fp8_names`` (default: ``fp8_parameter_names(model)``) by its
    fake-quantised value. Call it on fresh weights: fake quantisation is idempotent, but a lower
    dtype is not undone.
    """
    dtype = compute_dtype_of(precision, compute_dtype)
    if fp8_scale not in SCALE_MODES:
        raise ValueError(f"unknown fp8 scale mode {fp8_scale!r}; expected one of {SCALE_MODES}")
    input_dims = quantized_input_dims(model)
    if fp8_names is not None:
        input_dims = {name: input_dims.get(name, -1) for name in fp8_names}
    if precision == "fp4_e2m1":
        check_fp4_block_size(model, fp4_block_size, input_dims)
    for param in model.parameters():
        if param.dtype != dtype:
            param.data = param.data.to(dtype)
    if precision in WEIGHT_ONLY:
        params = dict(model.named_parameters(remove_duplicate=False))
        for name, dim in input_dims.items():
            params[name].copy_(
                fake_quantize(
                    params[name], precision, fp8_scale=fp8_scale, fp4_block_size=fp4_block_size, input_dim=dim, dtype=dtype
                )
            )
    return model
