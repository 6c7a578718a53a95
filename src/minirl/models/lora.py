"""The trainer's memory knobs: gradient checkpointing and LoRA adapters (``peft``), merged weights.

* ``optim.gradient_checkpointing``: transformers' activation checkpointing of every decoder layer
  (non-reentrant ``torch.utils.checkpoint``). The layers run again during backward; routing replay
  replays the same routes in that recomputation (the trainer keeps the replay block open through
  backward, ``minirl.moe.replay``), so R2/R3 stay exact.
* ``model.lora``: LoRA adapters injected in place with ``peft.inject_adapter_in_model(LoraConfig)``
  (a TRL user's ``peft_config=LoraConfig(...)``): the model keeps its class and forward (routing
  replay's hooks stay on the routers), the base weights are frozen, only the adapters train. Routers are never adapted unless
  ``adapt_routers`` is set (a router named in ``target_modules`` or ``target_parameters`` is refused). An MoE's fused
  expert tensors (not ``nn.Linear``) are adapted through peft's ``target_parameters``, one adapter per expert.
* ``merged_state_dict``: what the rollout engine and a checkpoint receive: every adapted weight as
  ``W + (alpha / r) B A`` (peft's ``get_delta_weight``) under the base model's own key names, so
  the engine samples from the policy being trained and ``AutoModelForCausalLM`` loads the result.
  Computed out of place: the fp32 base weights are never merged and unmerged (that would round).
* ``adapters_disabled``: the base model, for the KL penalty's frozen reference (no second copy).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

BASE_LAYERS = re.compile(r"(\.base_layer)+\.")
"""peft's wrapper levels in a state-dict key (nested once per adapted parameter of one module)."""

ADAPTER_DIR = "adapter"
"""A LoRA checkpoint's adapter (``adapter_config.json`` + ``adapter_model.safetensors``), beside the merged weights."""


def enable_gradient_checkpointing(model: Any) -> None:
    """Checkpoint every decoder layer (non-reentrant), the transformers way."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def router_names(model: torch.nn.Module) -> list[str]:
    """Module names of the MoE routers of ``model`` (those routing replay drives)."""
    from minirl.moe.families import RouterSpec, lookup

    found = []
    for name, module in model.named_modules():
        spec = lookup(module)
        if spec is not None and isinstance(spec[1], RouterSpec):
            found.append(name)
    return found


class LoraTargetError(ValueError):
    """A LoRA target that is a router or names nothing; ``field``: ``target_modules`` or ``target_parameters``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def add_lora(model: torch.nn.Module, *, rank: int, alpha: float, dropout: float, target_modules: list[str],
             adapt_routers: bool = False, head: torch.nn.Module | None = None,
             target_parameters: list[str] | None = None) -> None:
    """Inject LoRA adapters (``ValueError`` with one line when a target is a router or matches nothing); ``head``: the
    output head ``all-linear`` leaves out (default the model's output embeddings; a critic's value head);
    ``target_parameters``: parameters to adapt in place (peft's, for an MoE's fused expert tensors)."""
    from peft import LoraConfig

    routers = router_names(model)
    router_params = [f"{router}.{name}" for router in routers
                     for name, _ in model.get_submodule(router).named_parameters()]
    for field, targets_, names in (("target_modules", target_modules, routers),
                                   ("target_parameters", target_parameters or [], router_params)):
        for target in targets_:
            hit = [name for name in names if name == target or name.endswith("." + target)]
            if hit and not adapt_routers:
                raise LoraTargetError(field, f"target {target!r} is an MoE router ({hit[0]}); routers are not "
                                      "adapted unless model.lora.adapt_routers=true")
    if not target_modules and not target_parameters:
        raise ValueError("no target: name modules (target_modules) or parameters (target_parameters) to adapt")
    from peft import inject_adapter_in_model

    targets = list(target_modules)
    if targets == ["all-linear"]:  # peft's keyword, resolved here: its newer releases also wrap routers and experts
        head = head if head is not None else model.get_output_embeddings()  # type: ignore[operator]
        targets = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
                   and module is not head and (adapt_routers or name not in routers)]
    missing = [t for t in target_parameters or [] if not any(
        name == t or name.endswith("." + t) for name, _ in model.named_parameters())]
    if missing:
        raise LoraTargetError("target_parameters", f"{missing}: no parameter of the model ends with it")
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets or None, bias="none",
                        target_parameters=list(target_parameters or []) or None)
    try:
        inject_adapter_in_model(config, model)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(str(exc).strip().splitlines()[0]) from None
    model._minirl_lora_config = config  # saved beside the merged weights


def has_lora(model: torch.nn.Module) -> bool:
    return getattr(model, "_minirl_lora_config", None) is not None


def _lora_layers(model: torch.nn.Module) -> Iterator[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with the active LoRA adapters merged in, under the base key names
    (``model.state_dict()`` itself, the same tensors, when the model has no adapter)."""
    state = model.state_dict()
    if not has_lora(model):
        return state
    deltas: dict[str, torch.Tensor] = {}
    names = {id(module): name for name, module in model.named_modules()}
    for name, layer in _lora_layers(model):
        if layer.disable_adapters:  # inside ``adapters_disabled``: the base weights
            continue
        # a linear layer's weight, or the parameter a ``ParamWrapper`` adapts (peft >= 0.17 wraps an MoE's fused
        # expert tensors so, one wrapper per parameter, nested: ``experts.base_layer.base_layer.gate_up_proj``)
        parameter = getattr(layer, "parameter_name", None)
        key = f"{name}.base_layer.weight" if parameter is None else f"{names[id(layer.get_base_layer())]}.{parameter}"
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                delta = layer.get_delta_weight(adapter)
                deltas[key] = deltas[key] + delta if key in deltas else delta
    merged: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        merged[BASE_LAYERS.sub(".", key)] = (value + deltas[key].to(value.dtype)) if key in deltas else value
    return merged


@contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model inside the block (LoRA adapters off), the adapted one after."""
    layers = [layer for _, layer in _lora_layers(model)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def save_lora_checkpoint(model: Any, directory: Path, merged: dict[str, torch.Tensor] | None = None) -> None:
    """Merged weights (``merged``, else ``merged_state_dict``) as a plain Hugging Face model in ``directory``, the
    adapter (peft's ``adapter_config.json`` + ``adapter_model.safetensors``) in ``directory/adapter``."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    merged = {key: value.detach().clone() for key, value in (merged or merged_state_dict(model)).items()}
    model.save_pretrained(directory, state_dict=merged, safe_serialization=True)
    adapter = {key: value.detach().contiguous() for key, value in get_peft_model_state_dict(model).items()}
    (directory / ADAPTER_DIR).mkdir(parents=True, exist_ok=True)
    config = model._minirl_lora_config
    came_from = str(getattr(model.config, "_name_or_path", None) or "")  # the directory the base was loaded from
    came_from = str(Path(came_from).resolve()) if came_from and Path(came_from).is_dir() else came_from  # anywhere:
    if not config.base_model_name_or_path and came_from:  # AutoPeftModel finds the base by it
        config.base_model_name_or_path = came_from
    config.save_pretrained(directory / ADAPTER_DIR)
    save_file(adapter, str(directory / ADAPTER_DIR / "adapter_model.safetensors"), metadata={"format": "pt"})


def load_adapter_weights(model: torch.nn.Module, directory: Path) -> None:
    """Load a checkpoint's adapter (``directory/adapter``) into ``model``'s LoRA layers (resume)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(directory / ADAPTER_DIR / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, weights)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"checkpoint adapter {directory / ADAPTER_DIR}: unexpected keys, e.g. {unexpected[:2]}")
