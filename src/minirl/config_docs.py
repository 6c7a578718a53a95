"""The config, documented: every key with its value and one-line doc (``minirl config``), and
"did you mean" for unknown keys.

    minirl config defaults                 # every key, its default and its doc
    minirl config show my.yaml optim.lr=3e-4   # the resolved config of a file plus overrides

The docs are the fields' descriptions (``Field(description=...)`` or the docstring under a
field: ``Section`` sets pydantic's ``use_attribute_docstrings``); the first sentence is shown.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from pydantic import BaseModel


def one_line(text: str | None) -> str:
    """The first sentence (or line) of a field's doc, on one line."""
    if not text:
        return ""
    flat = " ".join(text.split())
    end = flat.find(". ")
    return flat if end == -1 else flat[: end + 1]


def describe(model: BaseModel, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(dotted key, value as YAML-ish text, one-line doc)`` for every leaf of ``model``."""
    rows: list[tuple[str, str, str]] = []
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            rows += describe(value, key + ".")
        else:
            shown = json.dumps(value.model_dump(mode="json") if isinstance(value, BaseModel) else _jsonable(value))
            rows.append((key, shown, one_line(info.description)))
    return rows


def _jsonable(value: Any) -> Any:
    if isinstance(value, list):
        return [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
    return value


def render(model: BaseModel) -> str:
    """``describe`` as aligned lines: ``key = value  # doc``."""
    rows = describe(model)
    column = min(max(len(f"{k} = {v}") for k, v, _ in rows) + 2, 44)
    lines = []
    for key, value, doc in rows:
        text = f"{key} = {value}"
        if doc:
            text += " " * max(column - len(text), 2) + "# " + doc.replace("``", "`")
        lines.append(text)
    return "\n".join(lines)


def did_you_mean(model_type: type[BaseModel] | None, key: str) -> str:
    """`` (did you mean 'x'?)`` when ``key`` is close to a field of ``model_type``, else ``""``."""
    if model_type is None:
        return ""
    close = difflib.get_close_matches(key, list(model_type.model_fields), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def section_type(root: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    """The model class at dotted ``path`` below ``root`` (``None`` when it is not a section)."""
    current: Any = root
    for part in path:
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return None
        annotation = fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if current is None:
            return None
    return current
