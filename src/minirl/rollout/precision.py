"""The rollout engine's numeric precision: the knob that creates a training–inference mismatch.

On CPU the engine and the trainer run the same kernels, so the only honest source of the paper's
training–inference discrepancy is the engine computing in lower precision (cpu-facts.md). This
module holds that transform as pure functions on a model's parameters, so a study can add
formats (e5m2, fp4 in blocks, ...) next to the ones here:

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

Scales (``fp8_scale``): ``per_tensor`` (one scale per weight tensor) or ``per_expert`` (one
scale per expert slice ``w[e]`` of a 3-D expert tensor; 2-D matrices stay per-tensor).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Precision = Literal["fp32", "bf16", "fp16", "fp8_e4m3"]
ScaleMode = Literal["per_tensor", "per_expert"]

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8_e4m3")
SCALE_MODES: tuple[str, ...] = ("per_tensor", "per_expert")
FP8_E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448.0

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

    ``compute_dtype`` only applies to weight-only formats (``fp8_e4m3``; default fp32); for the
    others the precision is the compute dtype and a conflicting ``compute_dtype`` is an error.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    if precision == "fp8_e4m3":
        return dtype_of(compute_dtype or "fp32")
    if compute_dtype is not None and dtype_of(compute_dtype) != _DTYPES[precision]:
        raise ValueError(f"compute_dtype={compute_dtype!r} conflicts with precision={precision!r}")
    return _DTYPES[precision]


def quantize_fp8_e4m3(w: torch.Tensor, scale_mode: ScaleMode = "per_tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``w`` to float8 e4m3 (round to nearest, saturating at +-448).

    Returns ``(q, scale)`` with ``q`` of dtype ``torch.float8_e4m3fn`` and ``w ~= q * scale``.
    ``scale = amax / 448`` in fp32: a scalar for ``per_tensor`` (and for any tensor that is not
    3-D), shape [E, 1, 1] for ``per_expert`` on a 3-D expert tensor [E, ., .]. An all-zero slice
    gets scale 1.
    """
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"unknown fp8 scale mode {scale_mode!r}; expected one of {SCALE_MODES}")
    w32 = w.detach().float()
    if scale_mode == "per_expert" and w32.ndim == 3:
        amax = w32.abs().amax(dim=(1, 2), keepdim=True)
    else:
        amax = w32.abs().amax()
    scale = torch.where(amax > 0, amax / FP8_E4M3_MAX, torch.ones_like(amax))
    q = (w32 / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` computed in fp32, then cast to ``dtype``."""
    return (q.float() * scale).to(dtype)


def fake_quantize_fp8_e4m3(
    w: torch.Tensor, scale_mode: ScaleMode = "per_tensor", dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``w`` rounded through float8 e4m3 and back, in ``dtype`` (default: ``w.dtype``)."""
    q, scale = quantize_fp8_e4m3(w, scale_mode)
    return dequantize(q, scale, dtype or w.dtype)


def fp8_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters ``fp8_e4m3`` quantises (see the module docstring for the rule)."""
    output_embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names: list[str] = []
    for module_name, module in model.named_modules():
        if module is output_embeddings or module_name.rsplit(".", 1)[-1] in _ROUTER_NAMES:
            continue
        prefix = f"{module_name}." if module_name else ""
        if isinstance(module, nn.Linear):
            names.append(f"{prefix}weight")
            continue
        for param_name, param in module.named_parameters(recurse=False):
            if param.ndim == 3:  # fused expert tensors [E, out, in] / [E, in, out]
                names.append(f"{prefix}{param_name}")
    return names


@torch.no_grad()
def apply_precision(
    model: nn.Module,
    precision: Precision,
    *,
    fp8_scale: ScaleMode = "per_tensor",
    compute_dtype: str | None = None,
    fp8_names: list[str] | None = None,
) -> nn.Module:
    """Put ``model`` (in place) into ``precision``; returns it.

    Casts every parameter to the compute dtype (buffers such as rotary frequencies stay as they
    are, fp32, as when Hugging Face loads a model in bf16), then, for ``fp8_e4m3``, replaces each
    parameter in ``fp8_names`` (default: ``fp8_parameter_names(model)``) by its fake-quantised
    value. Call it on fresh weights: fake quantisation is idempotent, but a lower dtype is not
    undone.
    """
    dtype = compute_dtype_of(precision, compute_dtype)
    if fp8_scale not in SCALE_MODES:
        raise ValueError(f"unknown fp8 scale mode {fp8_scale!r}; expected one of {SCALE_MODES}")
    for param in model.parameters():
        if param.dtype != dtype:
            param.data = param.data.to(dtype)
    if precision == "fp8_e4m3":
        params = dict(model.named_parameters(remove_duplicate=False))
        for name in fp8_parameter_names(model) if fp8_names is None else fp8_names:
            params[name].copy_(fake_quantize_fp8_e4m3(params[name], fp8_scale, dtype))
    return model
