"""A Hugging Face Hub id where minirl needs a local path.

TRL and verl files name models and datasets by Hub id (``Qwen/Qwen3-8B``, ``openai/gsm8k``); minirl
never downloads (``local_files_only``), so a path that does not exist and reads as ``org/name`` gets
the ``hf download`` command that fetches it, in the one line that reports it.
"""

from __future__ import annotations

import re
from pathlib import Path

#: the suffixes of a data file: ``org/train.parquet`` is a missing file, not a Hub id
DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".arrow", ".csv")


def is_hub_id(text: str | Path) -> bool:
    """``org/name`` (two parts of word characters, ``.`` and ``-``), not relative and not a data file."""
    text = str(text)
    return (re.fullmatch(r"[\w.-]+/[\w.-]+", text) is not None and not text.startswith(".")
            and Path(text).suffix.lower() not in DATA_SUFFIXES)


def download_command(hub_id: str | Path, repo_type: str = "model") -> str:
    """The command that puts ``hub_id`` in a local directory ``DIR``."""
    kind = "" if repo_type == "model" else f" --repo-type {repo_type}"
    return f"`hf download {hub_id}{kind} --local-dir DIR`"
