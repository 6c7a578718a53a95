"""Tiny model presets, the character tokenizer, and loading/saving Hugging Face checkpoints."""

from minirl.models.io import ModelLoadError, is_moe, load_model_and_tokenizer, save_checkpoint
from minirl.models.presets import PRESETS, build_model, count_parameters, list_presets, preset_config
from minirl.models.tokenizer import build_char_tokenizer, ensure_pad_token, special_token_ids

__all__ = [
    "PRESETS",
    "ModelLoadError",
    "build_char_tokenizer",
    "build_model",
    "count_parameters",
    "ensure_pad_token",
    "is_moe",
    "list_presets",
    "load_model_and_tokenizer",
    "preset_config",
    "save_checkpoint",
    "special_token_ids",
]
