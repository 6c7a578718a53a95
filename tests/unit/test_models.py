"""Character tokenizer, model presets, checkpoint save/load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.models import (
    PRESETS,
    ModelLoadError,
    build_char_tokenizer,
    build_model,
    count_parameters,
    ensure_pad_token,
    is_moe,
    list_presets,
    load_model_and_tokenizer,
    save_checkpoint,
    special_token_ids,
)

ROUND_TRIP_TEXTS = [
    "rev cbdae\n",
    "  two  spaces, trailing space \n\n\nnewlines ",
    "add 123+456\n= 579",
    "#### 42\n\\boxed{1/2} ~`!@#$%^&*()_-+={}[]|\\:;\"'<>,.?/",
    "\ttab\t",
    "",
]

TINY_PRESETS = ["qwen3-moe-tiny", "qwen2-moe-tiny", "olmoe-tiny", "mixtral-tiny", "gpt-oss-tiny", "qwen3.5-moe-tiny"]


# --- tokenizer ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_char_tokenizer_round_trips_exactly(text: str) -> None:
    tokenizer = build_char_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per character
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
    assert tokenizer(text)["input_ids"] == ids  # no special tokens added by default


def test_char_tokenizer_vocabulary_and_special_ids() -> None:
    tokenizer = build_char_tokenizer()
    assert len(tokenizer) == 4 + 95 + 2
    assert special_token_ids(tokenizer) == (0, 3)
    assert (tokenizer.pad_token, tokenizer.unk_token, tokenizer.bos_token, tokenizer.eos_token) == (
        "<pad>",
        "<unk>",
        "<bos>",
        "<eos>",
    )
    ids = tokenizer.encode("ab", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "ab"
    assert tokenizer.decode(ids) == "ab<eos>"
    assert tokenizer.encode("é", add_special_tokens=False) == [tokenizer.unk_token_id]
    # Identical on every call: ids are a fixed function of the vocabulary.
    assert build_char_tokenizer().get_vocab() == tokenizer.get_vocab()


def test_char_tokenizer_save_and_auto_load_behave_identically(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert special_token_ids(loaded) == special_token_ids(tokenizer)
    assert loaded.bos_token_id == tokenizer.bos_token_id
    for text in ROUND_TRIP_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids
        assert loaded(text)["input_ids"] == ids
        assert loaded.decode(ids) == text
    batch = loaded(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0][2:] == [loaded.pad_token_id] * 2  # right-padded with <pad>


def test_ensure_pad_token_uses_eos() -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.pad_token = None
    assert tokenizer.pad_token_id is None
    with pytest.raises(ValueError, match="no pad token"):
        special_token_ids(tokenizer)
    ensure_pad_token(tokenizer)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 3


# --- presets -----------------------------------------------------------------------------------


def test_preset_registry() -> None:
    assert list_presets() == list(PRESETS)
    for name in ["qwen3-moe-2m", "qwen3-moe-20m", "qwen3-dense-2m", *TINY_PRESETS]:
        assert name in PRESETS
    with pytest.raises(KeyError, match="qwen3-moe-2m"):
        build_model("no-such-preset", vocab_size=101, pad_id=0, eos_id=3, seed=0)


@pytest.mark.parametrize(
    "preset, expected_parameters",
    [("qwen3-moe-2m", 2e6), ("qwen3-dense-2m", 2e6), ("qwen3-moe-20m", 20e6)],
)
def test_named_presets_have_the_parameter_count_of_their_name(preset: str, expected_parameters: float) -> None:
    tokenizer = build_char_tokenizer()
    model = build_model(preset, len(tokenizer), *special_token_ids(tokenizer), seed=0)
    parameters = count_parameters(model)
    assert 0.7 * expected_parameters <= parameters <= 1.3 * expected_parameters, parameters
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config.max_position_embeddings == 512
    assert is_moe(model) == ("moe" in preset)
    if is_moe(model):
        assert model.config._experts_implementation == "grouped_mm"
        assert model.config.num_experts_per_tok == 2


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_tiny_presets_run_forward_and_generate(preset: str) -> None:
    tokenizer = build_char_tokenizer()
    model = build_model(preset, len(tokenizer), *special_token_ids(tokenizer), seed=0, bos_id=tokenizer.bos_token_id)
    assert (model.config.pad_token_id, model.config.eos_token_id, model.config.bos_token_id) == (0, 3, 2)
    assert model.config._experts_implementation == "grouped_mm"
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.num_experts_per_tok == 2 and is_moe(model)
    input_ids = torch.tensor([tokenizer.encode("rev abc\n"), tokenizer.encode("add 1+2\n")])
    logits = model(input_ids).logits
    assert logits.shape == (2, 8, len(tokenizer))
    assert torch.isfinite(logits).all()
    generated = model.generate(input_ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert generated.shape == (2, 11)


def test_build_model_is_deterministic_in_the_seed_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = build_model("qwen3-moe-tiny", 101, 0, 3, seed=7)
    assert torch.equal(torch.rand(1), expected_next)
    second = build_model("qwen3-moe-tiny", 101, 0, 3, seed=7)
    other = build_model("qwen3-moe-tiny", 101, 0, 3, seed=8)
    first_state, second_state, other_state = first.state_dict(), second.state_dict(), other.state_dict()
    assert all(torch.equal(first_state[key], second_state[key]) for key in first_state)
    assert not torch.equal(first_state["model.embed_tokens.weight"], other_state["model.embed_tokens.weight"])


# --- load / save -------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["qwen3-moe-tiny", "qwen3-dense-2m"])
def test_save_then_load_gives_identical_logits(tmp_path: Path, preset: str) -> None:
    model, tokenizer = load_model_and_tokenizer(preset, seed=5)
    with torch.no_grad():  # a non-trivial, non-initial state
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    input_ids = torch.tensor([tokenizer.encode("rev hello\n= olleh")])
    expected = model(input_ids).logits

    loaded, loaded_tokenizer = load_model_and_tokenizer(str(tmp_path / "ckpt"))
    assert torch.equal(loaded(input_ids).logits, expected)
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert is_moe(loaded) == is_moe(model)
    if is_moe(loaded):
        assert loaded.config._experts_implementation == "grouped_mm"

    # Plain Hugging Face loading, no minirl in between.
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", local_files_only=True)
    assert torch.equal(plain(input_ids).logits, expected)
    plain_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "ckpt", local_files_only=True)
    assert plain_tokenizer.decode(plain_tokenizer.encode("a b\nc")) == "a b\nc"


def test_load_preset_with_dtype_and_seed() -> None:
    model, tokenizer = load_model_and_tokenizer("qwen3-moe-tiny", seed=1, dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tokenizer.pad_token_id == 0
    same, _ = load_model_and_tokenizer("qwen3-moe-tiny", seed=1, dtype=torch.bfloat16)
    assert torch.equal(model.model.embed_tokens.weight, same.model.embed_tokens.weight)


def test_loading_a_user_model_without_pad_token_gets_eos_as_pad(tmp_path: Path) -> None:
    model, tokenizer = load_model_and_tokenizer("qwen3-moe-tiny")
    model.config.pad_token_id = None
    tokenizer.pad_token = None
    save_checkpoint(model, tokenizer, tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()).get("pad_token") is None
    _, loaded_tokenizer = load_model_and_tokenizer(str(tmp_path))
    assert loaded_tokenizer.pad_token_id == loaded_tokenizer.eos_token_id == 3


def test_load_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelLoadError, match="nowhere") as error:
        load_model_and_tokenizer(str(missing))
    assert "\n" not in str(error.value) and "preset" in str(error.value) and "hf download" not in str(error.value)
    with pytest.raises(ModelLoadError, match=r"does not download: `hf download Qwen/Qwen3-30B-A3B --local-dir DIR`"):
        load_model_and_tokenizer("Qwen/Qwen3-30B-A3B")  # a Hub id, as TRL and verl users write model paths

    with pytest.raises(ModelLoadError, match=r"no config\.json") as error:
        load_model_and_tokenizer(str(tmp_path))
    assert str(tmp_path) in str(error.value) and "\n" not in str(error.value)

    a_file = tmp_path / "weights.bin"
    a_file.write_text("x")
    with pytest.raises(ModelLoadError, match=r"weights\.bin"):
        load_model_and_tokenizer(str(a_file))

    # A config but no weights: the transformers error, on one line, naming the directory.
    broken = tmp_path / "broken"
    broken.mkdir()
    model, _ = load_model_and_tokenizer("qwen3-moe-tiny")
    model.config.save_pretrained(broken)
    with pytest.raises(ModelLoadError, match="broken") as error:
        load_model_and_tokenizer(str(broken))
    assert "\n" not in str(error.value)
