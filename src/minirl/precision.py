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

``fp16`` is the same mixed precision in float16 (TRL's ``fp16=True``, slime's ``--fp16``), which keeps 3 more mantissa
bits than bf16 and so sits closer to an fp16 engine (the FP16 paper, Qi et al. 2025, "Defeating the
Training-Inference Mismatch via FP16"), but has only 5 exponent bits: small gradients underflow and large ones
overflow. So the loss is scaled before each backward and the gradients unscaled before clipping (``LossScale``: torch
AMP's ``GradScaler`` rule and defaults, or Megatron-LM's and DeepSpeed's through ``optim.loss_scale_*``); an update
whose gradient overflowed is skipped and the scale halved, which is not a numerical fault.

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

import math
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, Literal

import torch

TrainerPrecision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype the forward computes matmuls in under ``precision`` (None: the parameters' own)."""
    if precision not in PRECISIONS:
        raise ValueError(f"trainer precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return AUTOCAST_DTYPES[precision]


class LossScale:
    """fp16's dynamic loss scale: the loss is multiplied by the scale S before backward (``scaled``), the gradients by
    1/S after (``unscale``); an update whose gradient norm is not finite overflowed: it is skipped and, once
    ``hysteresis`` overflows have been seen since the scale last grew, S is halved (never below ``min_scale``); after
    ``growth_interval`` finite updates in a row S doubles (and the hysteresis count starts again). With the defaults
    (2^16, 2000, hysteresis 1) it is torch AMP ``GradScaler``'s rule; Megatron-LM's ``DynamicGradScaler`` (slime) is
    2^32, 1000, hysteresis 2, DeepSpeed's ``initial_scale_power`` 16, ``loss_scale_window`` 1000, ``hysteresis`` 2.
    Not ``GradScaler`` itself: whether a gradient overflowed is read off the *global* gradient norm the trainer clips
    with, so every FSDP rank skips and rescales alike. A non-finite gradient at ``min_scale`` is no overflow a smaller
    scale could cure: ``overflowed`` answers False, and the caller treats it as a numerical fault. Disabled
    (``precision`` other than fp16) it changes nothing: ``scaled`` returns the loss itself and ``overflowed`` is always
    False."""

    def __init__(self, precision: str, init_scale: float = 2.0**16, growth_interval: int = 2000,
                 min_scale: float = 1.0, hysteresis: int = 1) -> None:
        if not (0 < min_scale <= init_scale and growth_interval >= 1 and hysteresis >= 1):
            raise ValueError(f"loss scale: need 0 < min_scale <= init_scale, growth_interval >= 1 and hysteresis >= 1, "
                             f"got {min_scale}, {init_scale}, {growth_interval}, {hysteresis}")
        self.enabled = precision == "fp16"
        self.scale = float(init_scale) if self.enabled else 1.0
        self.growth_interval, self.min_scale, self.hysteresis = growth_interval, float(min_scale), hysteresis
        self.finite_in_a_row, self.hysteresis_left = 0, hysteresis

    @classmethod
    def of(cls, optim: Any) -> LossScale:
        """From a config's ``optim`` section: ``precision`` and its ``loss_scale_*`` keys."""
        return cls(optim.precision, init_scale=optim.loss_scale_initial, growth_interval=optim.loss_scale_window_updates,
                   min_scale=optim.loss_scale_min, hysteresis=optim.loss_scale_hysteresis)

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale(self, parameters: Any) -> None:
        """Every gradient of ``parameters`` divided by the scale (in place; an inf stays inf)."""
        if not self.enabled:
            return
        grads = [p.grad for p in parameters if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)

    def overflowed(self, grad_norm: float) -> bool:
        """After an update's gradient (its global norm): True if it overflowed (skip it), else False (step, or at
        ``min_scale`` the caller's numerical-fault path). Updates the scale by the rule in the class docstring."""
        if not self.enabled:
            return False
        if math.isfinite(grad_norm):
            self.finite_in_a_row += 1
            if self.finite_in_a_row == self.growth_interval:
                self.scale, self.finite_in_a_row, self.hysteresis_left = self.scale * 2.0, 0, self.hysteresis
            return False
        if self.scale <= self.min_scale:
            return False
        self.finite_in_a_row, self.hysteresis_left = 0, self.hysteresis_left - 1
        if self.hysteresis_left <= 0:
            self.scale = max(self.scale / 2.0, self.min_scale)
        return True

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "finite_in_a_row": self.finite_in_a_row, "hysteresis_left": self.hysteresis_left}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.enabled and state:  # a checkpoint of an fp32 / bf16 run resumed in fp16 starts from the initial scale
            self.scale, self.finite_in_a_row = float(state["scale"]), int(state["finite_in_a_row"])
            self.hysteresis_left = int(state.get("hysteresis_left", self.hysteresis))  # checkpoints before the key


def compute_context(precision: str, device: torch.device | str) -> AbstractContextManager[Any]:
    """A context for one forward (and its backward's casts): autocast to bf16 / fp16, or nothing for fp32."""
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
