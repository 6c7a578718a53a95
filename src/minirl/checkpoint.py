"""Resumable checkpoints of a run: ``RUN_DIR/checkpoints/step_{N:06d}/``.

Each holds the model as a Hugging Face directory (``model/``, ``save_checkpoint``), the trainer
state and every random stream (``trainer_state.pt``: optimizer, schedule, update counters; torch
CPU, numpy and Python ``random`` states; the engine's sampling streams; the data order; the step
counter; the size of ``metrics.jsonl`` after that step) and ``meta.json``, written last, whose
``complete: true`` marks a checkpoint usable and whose ``files`` holds the SHA-256 of every other
file. A resume verifies them (``resume_point``): a checkpoint whose bytes changed (flipped bits, a
truncated ``trainer_state.pt``) is moved aside to ``step_N.damaged`` and the newest older one that
verifies is used, said in one line. Weights are checked finite before anything is written.

Writes are atomic: everything goes into ``step_N.tmp-<pid>/`` (files fsynced), which is renamed to
its final name (and the parent directory fsynced), so a crash at any moment leaves the previous
checkpoint intact. ``trainer_state.pt`` holds only tensors and plain types, so it is read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minirl.config import Config, ConfigError

FORMAT_VERSION = 2  # 2: meta.json records a SHA-256 per file
READABLE_FORMATS = (1, 2)  # format 1 (no digests) is still resumed, unverified
STEP_DIR = re.compile(r"^step_(\d{6,})$")
META = "meta.json"
STATE = "trainer_state.pt"
MODEL = "model"

# config keys that may differ between a run and its resumption: they do not change what the
# training steps compute (evaluation and diagnostics use their own seeded streams)
RESUMABLE_DIFFERENCES = (
    "run.name", "run.output_dir", "run.resume", "run.overwrite", "run.threads", "optim.global_steps", "optim.max_consecutive_faults",
    "task.reward_timeout_s", "task.reward_workers", "log.", "checkpoint.", "cold_start.", "eval.", "diagnostics.",
    # where the trainer runs changes float summation order only (not which samples are drawn)
    "cluster.backend", "cluster.ray_address", "cluster.trainer_ranks", "cluster.device", "cluster.cpus_per_engine",
    "cluster.gpus_per_engine", "cluster.cpus_per_trainer_rank", "cluster.gpus_per_trainer_rank", "optim.cpu_offload",
)


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


# ----------------------------------------------------------------------------- random states


def capture_rng() -> dict[str, Any]:
    """torch CPU, numpy and Python ``random`` states as tensors and plain types."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(version), "internal": list(internal), "gauss_next": gauss_next},
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))


# ----------------------------------------------------------------------------- files


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def config_for_checkpoint(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def save(run_dir: Path, step: int, *, model: Any, tokenizer: Any, state: dict[str, Any], cfg: Config, keep_last: int) -> Path:
    """Write checkpoint ``step`` atomically, then keep only the newest ``keep_last`` complete ones."""
    from minirl.models.io import save_checkpoint

    check_finite(model, step)
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        save_checkpoint(model, tokenizer, tmp / MODEL)
        torch.save(state, tmp / STATE)
        _fsync_tree(tmp)
        meta = {"format": FORMAT_VERSION, "step": step, "config": config_for_checkpoint(cfg), "complete": True,
                "files": digests(tmp)}
        with (tmp / META).open("w", encoding="utf-8") as handle:  # the completeness marker: last
            json.dump(meta, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_dir(tmp)
    except OSError:  # a full disk, say: the partial copy goes (freeing its space); older checkpoints are intact
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():  # an unusable leftover with the same name (a complete one would have been resumed)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    prune(run_dir, keep_last)
    return final


def check_finite(model: Any, step: int) -> None:
    """``FloatingPointError`` naming the tensors when a weight is not finite: the update guard undoes
    such steps, so this is a bug in our own code, and no checkpoint may hold them."""
    poisoned = [name for name, tensor in model.state_dict().items()
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if poisoned:
        raise FloatingPointError(f"checkpoint step {step} not written: non-finite weights in {', '.join(poisoned[:3])}")


def read_meta(directory: Path) -> dict[str, Any] | None:
    """``meta.json`` of a complete checkpoint, else None."""
    try:
        meta = json.loads((directory / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("complete") is not True or meta.get("format") not in READABLE_FORMATS:
        return None
    if meta["format"] >= 2 and not isinstance(meta.get("files"), dict):
        return None
    if not (directory / STATE).is_file() or not (directory / MODEL / "config.json").is_file():
        return None
    return meta


def _step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def find_latest(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint of ``run_dir`` and its meta, or None."""
    for _, path in reversed(_step_dirs(run_dir)):
        meta = read_meta(path)
        if meta is not None:
            return path, meta
    return None


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def digests(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under ``directory`` but ``meta.json``, by relative path."""
    return {path.relative_to(directory).as_posix(): _sha256(path)
            for path in sorted(directory.rglob("*")) if path.is_file() and path.name != META}


def verify(directory: Path) -> str | None:
    """Why checkpoint ``directory`` cannot be trusted (one phrase), or None: incomplete, or a file
    missing or not matching the SHA-256 its ``meta.json`` recorded (format 1 has none to check)."""
    meta = read_meta(directory)
    if meta is None:
        return "incomplete (no valid meta.json)"
    for name, digest in sorted(meta.get("files", {}).items()):
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if _sha256(path) != digest:
            return f"{name} does not match its recorded SHA-256 ({path.stat().st_size} bytes)"
    return None


def resume_point(run_dir: Path, log: Callable[[str], None]) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` that verifies, or None. Each newer one that
    does not is renamed ``step_N.damaged`` (kept for inspection, never used again); ``log`` gets one
    line saying which were damaged, why, and what the run resumes from instead."""
    damaged: list[str] = []
    chosen: Path | None = None
    for _, path in reversed(_step_dirs(run_dir)):
        if read_meta(path) is None:
            continue  # an unfinished write: ignored, as before
        problem = verify(path)
        if problem is None:
            chosen = path
            break
        aside = path.with_name(f"{path.name}.damaged")
        suffix = 1
        while aside.exists():
            suffix += 1
            aside = path.with_name(f"{path.name}.damaged{suffix}")
        os.rename(path, aside)
        damaged.append(f"{path.name} ({problem}; moved to {aside.name})")
    if damaged:
        fallback = f"resuming from the older {chosen.name}" if chosen else "no older checkpoint verifies"
        log(f"minirl: resume: damaged checkpoint {', '.join(damaged)}; {fallback}")
    return chosen


def logged_steps(run_dir: Path) -> int:
    """The highest global step (>= 1) in ``metrics.jsonl``, 0 if none: what a restart would lose.
    A row cut short by a kill is ignored."""
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_bytes().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return 0
    highest = 0
    for line in lines:
        try:
            step = json.loads(line).get("step", 0)
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int):
            highest = max(highest, step)
    return highest


def restart_in_place(run_dir: Path) -> int:
    """``--resume`` of a run that holds no complete checkpoint: it starts again from step 0 in its
    directory, so its metrics and partial checkpoints go (a kept row would be logged twice).
    Returns the highest step whose metrics were removed (0: none)."""
    lost = logged_steps(run_dir)
    (Path(run_dir) / "metrics.jsonl").unlink(missing_ok=True)
    remove_all(run_dir)
    return lost


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints, incomplete ones older than
    the newest complete one, and stale ``.tmp-*`` directories of other processes."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return
    for path in root.iterdir():
        if ".tmp-" in path.name and not path.name.endswith(f".tmp-{os.getpid()}"):
            shutil.rmtree(path, ignore_errors=True)
    complete = [(step, path) for step, path in _step_dirs(run_dir) if read_meta(path) is not None]
    keep = {path for _, path in complete[-keep_last:]}
    newest = complete[-1][0] if complete else None
    for step, path in _step_dirs(run_dir):
        if path not in keep and (newest is None or step <= newest):
            shutil.rmtree(path, ignore_errors=True)


def remove_all(run_dir: Path) -> None:
    """Delete every checkpoint of ``run_dir`` (a fresh start of the run)."""
    shutil.rmtree(checkpoints_dir(run_dir), ignore_errors=True)


def check_config(checkpoint: Path, saved: dict[str, Any], cfg: Config) -> None:
    """Refuse (``ConfigError``, one line) to resume under a config that differs in a key that matters."""
    from minirl.config import RENAMED_OPTIM, Config

    now = config_for_checkpoint(cfg)
    if isinstance(saved.get("optim"), dict):  # a checkpoint from before a key was renamed: its values, new names
        saved = {**saved, "optim": {RENAMED_OPTIM.get(key, key): value for key, value in saved["optim"].items()}}
    # a checkpoint from before a key (or section, e.g. cluster) existed ran with its default
    defaults = Config().model_dump(mode="json")
    defaults["algo"] = type(cfg.algo)(name=cfg.algo.name).model_dump(mode="json")  # the run's objective's own knobs
    saved = with_defaults(saved, defaults)
    differences = config_differences(saved, now, ignore=RESUMABLE_DIFFERENCES, label="checkpoint")
    if differences:
        raise ConfigError(
            f"cannot resume from {checkpoint}: the config differs in {', '.join(differences)}; "
            "use the checkpoint's config or a new run.name"
        )


def with_defaults(saved: Any, defaults: Any) -> Any:
    """``saved`` with every key it lacks taken from ``defaults`` (recursively, sections included)."""
    if not isinstance(saved, dict) or not isinstance(defaults, dict):
        return saved
    return {**defaults, **{key: with_defaults(value, defaults.get(key)) for key, value in saved.items()}}


def config_differences(saved: dict[str, Any], now: dict[str, Any], *, ignore: tuple[str, ...] = (),
                       label: str = "saved") -> list[str]:
    """``key (label old, now new)`` for each dotted key whose value differs; a key in ``ignore``, or under
    an entry of it that ends with a dot, is left out."""
    differences: list[str] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=str):
                walk(a.get(key), b.get(key), f"{prefix}{key}.")
            return
        key = prefix[:-1]
        if a != b and not any(key == k or (k.endswith(".") and key.startswith(k)) for k in ignore):
            differences.append(f"{key} ({label} {a!r}, now {b!r})")

    walk(saved, now, "")
    return differences


def load_state(checkpoint: Path) -> dict[str, Any]:
    try:
        return torch.load(checkpoint / STATE, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable state is a damaged checkpoint (format 1 has no digest)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot resume from {checkpoint}: {STATE} is unreadable ({first}); "
                          f"delete {checkpoint.name} to resume from an older checkpoint") from None
