"""Security: no code is evaluated from model outputs or data, weights load only from safetensors,
remote model code stays off unless the config turns it on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import minirl
from minirl.config import load_config
from minirl.models import io

SRC = Path(minirl.__file__).parent
FORBIDDEN_CALLS = {"eval", "exec", "compile", "execfile"}


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            yield node, name, func


def test_no_eval_or_exec_in_minirl() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node, name, func in _calls(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(func, ast.Name) and name in FORBIDDEN_CALLS:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {name}(")
    assert found == []


def test_no_unsafe_weight_or_code_loading_in_minirl() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, name, func in _calls(tree):
            keywords = {k.arg: k.value for k in node.keywords}
            where = f"{path.relative_to(SRC)}:{node.lineno}"
            if name == "load" and isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "torch":
                weights_only = keywords.get("weights_only")
                if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                    found.append(f"{where}: torch.load without weights_only=True")
            value = keywords.get("trust_remote_code")
            if isinstance(value, ast.Constant) and value.value is True:
                found.append(f"{where}: trust_remote_code=True")
    assert found == []


def test_from_pretrained_asks_for_safetensors_and_no_remote_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = io.load_model_and_tokenizer("qwen3-moe-tiny")
    directory = io.save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    seen: dict = {}
    real = io.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(io.AutoModelForCausalLM, "from_pretrained", spy)
    io.load_model_and_tokenizer(str(directory))
    assert seen["use_safetensors"] is True and seen["trust_remote_code"] is False and seen["local_files_only"] is True


def test_remote_code_is_off_unless_the_config_turns_it_on() -> None:
    assert load_config(None).model.trust_remote_code is False
    assert load_config(None, ["model.trust_remote_code=true"]).model.trust_remote_code is True
    import inspect

    assert inspect.signature(io.load_model_and_tokenizer).parameters["trust_remote_code"].default is False
