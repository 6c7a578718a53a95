"""The trainer's compute precision (``optim.precision``) and the fp32 matmul switch (``optim.allow_tf32``).

``fp32`` (the default) computes in the parameters' own dtype: nothing is wrapped, so the float path
is bit for bit the one of a trainer without this module.

``bf16`` is mixed precision as torch AMP and FSDP2 do it: the parameters, their gradients and the
AdamW state stay float32 (the *master* weights; checkpoints keep the dtype the model was loaded in),
and the forward runs under ``torch.autocast(dtype=bfloat16)``, which casts weights and activations
to bf16 at each matmul (norms, softmax and the log-softmax of the log-probs stay float32; the trainer
takes ``logits.float()`` before ``token_logprobs``). The backward reuses the forward's casts, and the
gradient that reaches a parameter is float32. No loss scaling: bf16 has float32's exponent range.
FSDP2 ranks add ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (``fsdp_policy``): the
sharded float32 parameters are all-gathered as bf16 and the gradients reduce-scattered in float32.

This is the paper's setting: a BF16 trainer against an FP8 engine (arXiv 2512.01374, Section 5).
On a CPU without native bf16 matmul kernels (no AVX512-BF16 or AMX; ``environment.jsonl`` field
``cpu_native_half_gemm: false``), bf16 matmuls are emulated and bf16 training is *slower* than fp32.

MoE experts: transformers' fused experts (3-D ``gate_up_proj`` / ``down_proj`` parameters) call
``grouped_mm`` directly, which autocast does not cover, and transformers casts the activations to the
*weights'* dtype, so under autocast alone the experts, most of an MoE's FLOPs, would run in float32.
``autocast_experts`` adds a forward pre-hook to each such module that, only while autocast is on,
shadows its 3-D parameters with their autocast-dtype casts for the duration of the call (the casts
are differentiable: the float32 parameters receive float32 gradients; gradient checkpointing's
recomputation runs the hook again under the restored autocast state). Outside autocast the hook does
nothing, so the fp32 path is untouched.

``allow_tf32`` lets CUDA run float32 matmuls and convolutions on TF32 tensor cores (10-bit
mantissa inputs, fp32 accumulation): faster fp32 training on Ampere and later, inexact. It has no
effect on a CPU.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, Literal

import torch

TrainerPrecision = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16")


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype the forward computes matmuls in under ``precision`` (None: the parameters' own)."""
    if precision not in PRECISIONS:
        raise ValueError(f"trainer precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return torch.bfloat16 if precision == "bf16" else None


def compute_context(precision: str, device: torch.device | str) -> AbstractContextManager[Any]:
    """A context for one forward (and its backward's casts): autocast to bf16, or nothing for fp32."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def set_tf32(allow: bool) -> None:
    """Allow (or forbid) TF32 for float32 matmuls and cuDNN convolutions on CUDA; process-wide."""
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def fsdp_policy(precision: str) -> Any | None:
    """FSDP2's ``MixedPrecisionPolicy`` for ``precision`` (None for fp32: FSDP's default, no casts)."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def autocast_experts(model: torch.nn.Module) -> int:
    """Hook every module with 3-D (fused expert) parameters so that they run in the autocast dtype
    while autocast is on (module docstring); idempotent. Returns how many modules are hooked."""
    hooked = 0
    for module in model.modules():
        names = [name for name, param in module.named_parameters(recurse=False) if param.dim() == 3]
        if not names:
            continue
        hooked += 1
        if getattr(module, "_minirl_autocast_experts", False):
            continue
        module.__dict__["_minirl_autocast_experts"] = True
        module.register_forward_pre_hook(partial(_shadow_with_casts, names=names))
        module.register_forward_hook(partial(_drop_casts, names=names), always_call=True)
    return hooked


def _shadow_with_casts(module: torch.nn.Module, args: Any, *, names: list[str]) -> None:
    params: dict[str, Any] = module._parameters
    device = params[names[0]].device.type
    if not torch.is_autocast_enabled(device):
        return
    dtype = torch.get_autocast_dtype(device)
    for name in names:  # an instance attribute wins over ``Module.__getattr__``'s parameter lookup
        module.__dict__[name] = params[name].to(dtype)


def _drop_casts(module: torch.nn.Module, args: Any, output: Any, *, names: list[str]) -> None:
    for name in names:
        module.__dict__.pop(name, None)
