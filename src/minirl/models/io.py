"""Load a model and tokenizer from a preset name or a local Hugging Face directory; save one.

A checkpoint is a plain Hugging Face directory (``config.json``, ``model.safetensors``, the
tokenizer files) that ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer
.from_pretrained`` load as they are. Nothing is ever fetched from a hub (``local_files_only``).

Before anything is loaded, a directory is checked, and refused with a one-line ``ModelLoadError``
saying why: no ``config.json`` (or not valid JSON), no weights, weights only as pickle files
(``pytorch_model.bin``: unpickling can run code, so minirl loads safetensors only,
``use_safetensors=True``), a truncated or corrupt safetensors file or a missing shard, no
tokenizer files, or custom model code (``auto_map``) while ``trust_remote_code`` is off (the
default; only ``model.trust_remote_code: true`` turns it on). ``check_compatible`` refuses a
checkpoint of another model (architecture, vocabulary, sizes), naming the keys that differ.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from minirl.hub import download_command, is_hub_id
from minirl.models.presets import EXPERTS_IMPLEMENTATION, PRESETS, build_model
from minirl.models.tokenizer import build_char_tokenizer, ensure_pad_token

_EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
SAFETENSORS_WEIGHTS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.ckpt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")
COMPATIBILITY_KEYS = (
    "model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size", *_EXPERT_COUNT_FIELDS,
    "num_experts_per_tok", "tie_word_embeddings",
)
"""Config keys that must match for a checkpoint's weights to fit a model."""


class ModelLoadError(Exception):
    """A model path or preset that cannot be loaded; the message is one line naming it."""


def is_moe(model_or_config: PreTrainedModel | PretrainedConfig) -> bool:
    """True when the (text) config declares routed experts."""
    config = getattr(model_or_config, "config", model_or_config)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return any(int(getattr(text_config, field, None) or 0) > 0 for field in _EXPERT_COUNT_FIELDS)


def load_model_and_tokenizer(
    path_or_preset: str,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A preset name builds a fresh model (``seed``) with the character tokenizer; anything else
    is a local Hugging Face directory. A tokenizer without a pad token gets its eos token as pad.
    """
    if path_or_preset in PRESETS:
        tokenizer = build_char_tokenizer()
        model = build_model(
            path_or_preset,
            vocab_size=len(tokenizer),
            pad_id=tokenizer.pad_token_id,
            eos_id=tokenizer.eos_token_id,
            seed=seed,
            bos_id=tokenizer.bos_token_id,
        )
        return model.to(dtype), tokenizer
    return _load_directory(Path(path_or_preset), dtype=dtype, trust_remote_code=trust_remote_code)


def _load_directory(
    path: Path, *, dtype: torch.dtype, trust_remote_code: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not path.exists():
        hint = f"; minirl does not download: {download_command(path)}, then model.path=DIR" if is_hub_id(path) else ""
        raise ModelLoadError(
            f"model {str(path)!r} is neither a preset ({', '.join(PRESETS)}) nor an existing directory{hint}"
        )
    check_model_directory(path, trust_remote_code=trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        model = _from_pretrained(path, config, dtype=dtype, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelLoadError(f"cannot load model directory {str(path)!r}: {first_line}") from error
    ensure_pad_token(tokenizer)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _from_pretrained(
    path: Path, config: PretrainedConfig, *, dtype: torch.dtype, trust_remote_code: bool
) -> PreTrainedModel:
    """``from_pretrained``, asking for ``grouped_mm`` experts where the architecture supports it."""
    kwargs = dict(local_files_only=True, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=True)
    if is_moe(config):
        try:
            return AutoModelForCausalLM.from_pretrained(path, experts_implementation=EXPERTS_IMPLEMENTATION, **kwargs)
        except ValueError as error:
            if "experts implementation" not in str(error) and "experts_implementation" not in str(error):
                raise
            # An MoE architecture without the switchable experts interface: use its own code.
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def read_config_json(path: Path) -> dict[str, Any]:
    """``path/config.json`` as a dict; ``ModelLoadError`` when missing or not a JSON object."""
    where = str(path)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {where!r} has no config.json (not a Hugging Face model directory"
                             f"{_what_it_is(path)})")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        detail = error.strerror if isinstance(error, OSError) else str(error).splitlines()[0]
        raise ModelLoadError(f"model directory {where!r}: config.json is not readable JSON ({detail})") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"model directory {where!r}: config.json is not a JSON object")
    return config


def _what_it_is(path: Path) -> str:
    """What a directory without ``config.json`` holds instead, when minirl or peft wrote it: how to name the model."""
    if (path / "adapter_config.json").is_file():
        try:
            base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
        except (OSError, ValueError):
            base = None
        merged = " or the merged model beside it (its parent)" if (path.parent / "config.json").is_file() else ""
        return (f"; it is a LoRA adapter (adapter_config.json): give its base model{f' ({base})' if base else ''}"
                f"{merged} as the model, and model.lora to train adapters")
    if (path / "model" / "config.json").is_file():
        return f"; a minirl checkpoint keeps its model in {path / 'model'}: give that"
    return ""


def check_model_directory(path: str | Path, *, trust_remote_code: bool = False) -> None:
    """Refuse, with one line saying why, a directory that is not a complete, safe checkpoint."""
    path = Path(path)
    where = str(path)
    config = read_config_json(path)
    if config.get("auto_map") and not trust_remote_code:
        raise ModelLoadError(
            f"model directory {where!r} needs its own Python code (auto_map in config.json); minirl does not run "
            "it unless model.trust_remote_code=true (only for code you trust)"
        )
    if (path / SAFETENSORS_INDEX).is_file():
        for shard in _index_shards(path):
            _check_safetensors(path, shard)
    elif (path / SAFETENSORS_WEIGHTS).is_file():
        _check_safetensors(path, SAFETENSORS_WEIGHTS)
    else:
        pickles = [name for name in PICKLE_WEIGHTS if (path / name).is_file()]
        if pickles:
            raise ModelLoadError(
                f"model directory {where!r} has weights only as a pickle file ({pickles[0]}), which can run code "
                "when loaded; minirl loads safetensors only: convert it with save_pretrained(dir, safe_serialization=True)"
            )
        raise ModelLoadError(f"model directory {where!r} has no weights ({SAFETENSORS_WEIGHTS} or {SAFETENSORS_INDEX})")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"model directory {where!r} has no tokenizer ({', '.join(TOKENIZER_FILES)})")


def _index_shards(path: Path) -> list[str]:
    where = str(path)
    try:
        index = json.loads((path / SAFETENSORS_INDEX).read_text(encoding="utf-8"))
        shards = sorted(set(index["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ModelLoadError(f"model directory {where!r}: {SAFETENSORS_INDEX} is not a valid index (no weight_map)") from None
    for shard in shards:
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise ModelLoadError(f"model directory {where!r}: {SAFETENSORS_INDEX} names a shard outside the directory ({shard!r})")
        if not (path / shard).is_file():
            raise ModelLoadError(f"model directory {where!r}: shard {shard} listed in {SAFETENSORS_INDEX} is missing")
    return shards


def _check_safetensors(path: Path, name: str) -> None:
    """The header of a safetensors file parses and its tensors fit in the file (not truncated)."""
    where, file = str(path), path / name
    size = file.stat().st_size
    with file.open("rb") as handle:
        head = handle.read(8)
        header_size = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if header_size is None or header_size > size - 8:
            raise ModelLoadError(f"model directory {where!r}: {name} is truncated or not a safetensors file ({size} bytes)")
        try:
            header = json.loads(handle.read(header_size))
            ends = [int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            raise ModelLoadError(f"model directory {where!r}: {name} is corrupt (its header is not valid safetensors JSON)") from None
    needed = 8 + header_size + max(ends, default=0)
    if needed > size:
        raise ModelLoadError(f"model directory {where!r}: {name} is truncated ({size} bytes, its header needs {needed})")


def check_compatible(checkpoint_dir: str | Path, expected_config: PretrainedConfig | dict[str, Any] | Any) -> None:
    """Refuse a checkpoint whose config differs from ``expected_config`` (a config, its dict, or a
    model) in a key that decides the weights' shapes (``COMPATIBILITY_KEYS``); the one-line
    ``ModelLoadError`` names every differing key with both values."""
    found = read_config_json(Path(checkpoint_dir))
    expected = getattr(expected_config, "config", expected_config)
    expected = expected.to_dict() if hasattr(expected, "to_dict") else dict(expected)
    differences = [
        f"{key} {found[key]!r} (expected {expected[key]!r})"
        for key in COMPATIBILITY_KEYS
        if found.get(key) is not None and expected.get(key) is not None and found[key] != expected[key]
    ]
    if differences:
        raise ModelLoadError(f"checkpoint {str(checkpoint_dir)!r} is from another model: {', '.join(differences)}")


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path,
                    dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` into the directory ``path`` (created). A model
    with LoRA adapters is written merged, its adapter beside it (``minirl.models.lora``). ``dtype``: the weights
    written in it (the dtype the model came in, ``dtype_on_disk``; the trainer's fp32 master weights rounded once),
    but the modules the model keeps in fp32 (``_keep_in_fp32_modules``); None: as they are."""
    from minirl.models.lora import has_lora, merged_state_dict, save_lora_checkpoint

    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    state = merged_state_dict(model) if has_lora(model) else model.state_dict()
    cast = dtype is not None and any(v.is_floating_point() and v.dtype != dtype for v in state.values())
    if cast:
        keep = {*(getattr(model, "_keep_in_fp32_modules", None) or ()), *(getattr(model, "_keep_in_fp32_modules_strict", None) or ())}
        state = {key: value.to(dtype) if value.is_floating_point() and not any(k in key for k in keep) else value
                 for key, value in state.items()}
    if has_lora(model):
        save_lora_checkpoint(model, directory, state)
    else:
        model.save_pretrained(directory, safe_serialization=True, **({"state_dict": state} if cast else {}))
    if cast:  # save_pretrained writes the dtype of the model's parameters (fp32): say the one written
        config_path = directory / "config.json"
        config = json.loads(config_path.read_text())
        config["dtype"] = str(dtype).removeprefix("torch.")
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(directory)
    return directory


def dtype_on_disk(path_or_preset: str | Path | None) -> torch.dtype | None:
    """The dtype a model directory's ``config.json`` gives its weights (``dtype``, or transformers 4's
    ``torch_dtype``): what the final model is written back in (``save_checkpoint``). None for a preset, a directory
    that names none (``auto``), or one that is not there."""
    config_path = Path(str(path_or_preset)) / "config.json" if path_or_preset else None
    if config_path is None or not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return None
    name = config.get("dtype") or config.get("torch_dtype")
    value = getattr(torch, str(name).removeprefix("torch."), None) if name else None
    return value if isinstance(value, torch.dtype) and value.is_floating_point else None
