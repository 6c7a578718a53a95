"""docs/coming_from_trl_verl.md names minirl keys beside TRL's and verl's: every one must exist in the schema."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from minirl.config import Config, load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "coming_from_trl_verl.md"
SECTIONS = tuple(Config.model_fields)


def _field(model: type[BaseModel], path: str) -> bool:
    """Whether ``a.b.c`` is a field path of ``model`` (through optional sub-sections such as ``model.lora``)."""
    head, _, rest = path.partition(".")
    if head not in model.model_fields:
        return False
    if not rest:
        return True
    annotation = model.model_fields[head].annotation
    candidates = typing.get_args(annotation) or (annotation,)
    return any(isinstance(c, type) and issubclass(c, BaseModel) and _field(c, rest) for c in candidates)


def minirl_settings(text: str) -> list[tuple[str, str | None]]:
    """The ``section.key`` paths (with the value, where ``key: value`` gives one) in backticks in the first
    column of the doc's tables."""
    settings = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or set(cells[1].strip()) <= {"-"}:
            continue
        for code in re.findall(r"`([^`]+)`", cells[1]):
            path, _, value = code.partition(":")
            if path.split(".")[0] in SECTIONS:
                settings.append((path, value.strip() or None))
    return settings


def minirl_keys(text: str) -> list[str]:
    return [path for path, _ in minirl_settings(text)]


def test_every_minirl_key_in_the_mapping_exists():
    keys = minirl_keys(DOC.read_text(encoding="utf-8"))
    assert len(keys) >= 40, keys  # the tables were read
    missing = [key for key in keys if not _field(Config, key)]
    assert not missing, f"docs/coming_from_trl_verl.md names keys the config does not have: {missing}"
    values = [(path, value) for path, value in minirl_settings(DOC.read_text(encoding="utf-8")) if value]
    assert len(values) >= 8, values
    for path, value in values:  # `algo.name: grpo`, `optim.precision: bf16`...: accepted as written
        load_config(None, [f"{path}={value}"])


def test_the_check_catches_a_wrong_key():
    assert _field(Config, "model.lora.rank") and _field(Config, "optim.minibatches_per_step")
    assert not _field(Config, "optim.minibatch_per_step") and not _field(Config, "model.lora.rnak")
    assert minirl_settings("| `algo.eps_low`, `algo.clip: false` | `epsilon` | x |\n|---|---|---|") == [
        ("algo.eps_low", None), ("algo.clip", "false")]
