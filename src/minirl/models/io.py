"""Load a model and tokenizer from a preset name or a local Hugging Face directory; save one.

A checkpoint is a plain Hugging Face directory (``config.json``, ``model.safetensors``, the
tokenizer files) that ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer
.from_pretrained`` load as they are. Nothing is ever fetched from a hub (``local_files_only``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from minirl.models.presets import EXPERTS_IMPLEMENTATION, PRESETS, build_model
from minirl.models.tokenizer import build_char_tokenizer, ensure_pad_token

_EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


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
        raise ModelLoadError(
            f"model {str(path)!r} is neither a preset ({', '.join(PRESETS)}) nor an existing directory"
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {str(path)!r} has no config.json (not a Hugging Face model directory)")
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
    kwargs = dict(local_files_only=True, dtype=dtype, trust_remote_code=trust_remote_code)
    if is_moe(config):
        try:
            return AutoModelForCausalLM.from_pretrained(path, experts_implementation=EXPERTS_IMPLEMENTATION, **kwargs)
        except ValueError as error:
            if "experts implementation" not in str(error) and "experts_implementation" not in str(error):
                raise
            # An MoE architecture without the switchable experts interface: use its own code.
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` into the directory ``path`` (created)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
