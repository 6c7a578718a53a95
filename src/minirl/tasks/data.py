"""Data rows from where users keep them: JSONL, JSON, Parquet, or a saved ``datasets`` directory.

``iter_rows(path)`` yields ``(where, row)`` pairs, ``where`` naming the file and line (JSONL:
``data/train.jsonl:7``) or row (others: ``data/train.parquet:row 7``, 1-based), ``row`` a dict
of the row's columns or a ``TaskDataError`` for a line that is not a JSON object.

* ``.jsonl`` (and any other suffix) is read here, line by line, so that every bad line gets its
  own one-line error with its line number (blank lines hold no row; a UTF-8 BOM is accepted);
* ``.json`` and ``.parquet`` are read with the ``datasets`` library (``load_dataset("json" |
  "parquet", data_files=...)``; a JSON file may hold JSON lines or one array of objects);
* a directory written by ``save_to_disk`` is read with ``load_from_disk``; a ``DatasetDict`` gives the ``split``
  asked for (``train`` by default, or its only one);
* any other directory is a dataset repository as ``hf download --repo-type dataset`` leaves it (data files, and the
  README's ``configs`` when it has several), read as TRL reads ``dataset_name``: ``load_dataset(directory,
  config, split=split)`` (``task.dataset_config``, ``task.train_split`` / ``task.eval_split``), offline.

A file that cannot be read at all is one ``TaskDataError`` naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minirl.hub import download_command, is_hub_id
from minirl.tasks.jsonl import TaskDataError

DATASETS_SUFFIXES = {".json": "json", ".parquet": "parquet"}


def iter_rows(path: Path | str, *, split: str = "train", config: str | None = None) -> Iterator[tuple[str, Any]]:
    """``(where, row dict or TaskDataError)`` for every row of ``path`` (module docstring); ``split`` and ``config``
    choose among a dataset directory's; ``verifiers:ENV_ID`` names a verifiers environment's rows
    (``minirl.tasks.verifiers_env``)."""
    from minirl.tasks import verifiers_env

    if verifiers_env.is_spec(path):
        if config is not None:
            raise TaskDataError(f"{path}: a verifiers environment has no dataset configs (got {config!r})")
        try:
            yield from verifiers_env.iter_env_rows(str(path), split)
        except verifiers_env.VerifiersError as error:
            raise TaskDataError(str(error)) from None
        return
    path = Path(path)
    if not path.exists():
        hint = (f"; minirl does not download: {download_command(path, 'dataset')}, then point to the directory"
                if is_hub_id(path) else "")
        raise TaskDataError(f"{path}: no such file{hint}")
    if path.is_dir():
        saved = any((path / marker).is_file() for marker in ("state.json", "dataset_dict.json"))
        dataset = _load_from_disk(path, split, config) if saved else _load_repository(path, split, config)
        yield from _dataset_rows(path if split == "train" else Path(f"{path}[{split}]"), dataset)
        return
    if not path.is_file():
        raise TaskDataError(f"{path}: not a file (expected a JSONL, JSON or Parquet file, or a datasets directory)")
    if (split, config) != ("train", None):
        raise TaskDataError(f"{path}: a file holds one split; a split ({split!r}) or a config ({config!r}) names one of "
                            "a dataset directory's")
    builder = DATASETS_SUFFIXES.get(path.suffix.lower())
    if builder is not None:
        yield from _dataset_rows(path, _load_file(path, builder))
        return
    yield from _jsonl_rows(path)


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TaskDataError(f"{path}: cannot read ({error.strerror or type(error).__name__})") from None
    for line_number, raw_line in enumerate(data.split(b"\n"), start=1):
        where = f"{path}:{line_number}"
        try:
            line = raw_line.decode("utf-8-sig" if line_number == 1 else "utf-8")  # tolerate a BOM
        except UnicodeDecodeError as error:
            yield where, TaskDataError(f"{where}: not valid UTF-8 (byte {error.start} of the line)")
            continue
        if not line.strip():
            continue
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as error:
            yield where, TaskDataError(f"{where}: not valid JSON ({error.msg} at column {error.colno})")


def _quiet_datasets() -> Any:
    """The ``datasets`` library without its progress bars and log lines."""
    import datasets

    datasets.disable_progress_bars()
    # its loaders log a file they cannot read before raising; minirl says it in its own one line
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    return datasets


def _load_file(path: Path, builder: str) -> Any:
    datasets = _quiet_datasets()
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as error:  # a corrupt or ill-shaped file: name it, and the library's reason
        raise TaskDataError(f"{path}: cannot read as {builder.upper()} ({_reason(error)})") from None


def _load_from_disk(path: Path, split: str, config: str | None) -> Any:
    if config is not None:
        raise TaskDataError(f"{path}: a save_to_disk directory has no configs (got {config!r}); its splits are its own")
    datasets = _quiet_datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:
        raise TaskDataError(
            f"{path}: cannot read the datasets directory ({_reason(error)})"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split in loaded:
            return loaded[split]
        if len(loaded) == 1 and split == "train":
            return next(iter(loaded.values()))
        raise TaskDataError(f"{path}: a DatasetDict without a {split!r} split (splits: {', '.join(loaded)})")
    if split != "train":
        raise TaskDataError(f"{path}: one saved Dataset, without splits (asked for {split!r})")
    return loaded


def _load_repository(path: Path, split: str, config: str | None) -> Any:
    """A directory of data files (a downloaded dataset repository): ``load_dataset`` as TRL calls it."""
    datasets = _quiet_datasets()
    try:
        return datasets.load_dataset(str(path), config, split=split)
    except Exception as error:
        raise TaskDataError(
            f"{path}: a directory, but neither a save_to_disk directory nor a dataset repository load_dataset reads "
            f"with config {config!r}, split {split!r} ({_reason(error)})"
        ) from None


def _dataset_rows(path: Path, dataset: Any) -> Iterator[tuple[str, Any]]:
    for index, row in enumerate(dataset, start=1):
        yield f"{path}:row {index}", dict(row)


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__
