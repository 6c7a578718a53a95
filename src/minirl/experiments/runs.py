"""Reading finished (or running) run directories: ``config.yaml`` and ``metrics.jsonl`` only.

A *run* here is ``{"seed", "n", "rows", "dir"}``: its seed directory's name, its mini-batches per global
step N (gradient steps = global step x N) and its metric rows. ``load_runs(path)`` takes a sweep root
(``<setting>/<arm>/seed<s>/`` below it) or one run directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

Run = dict[str, Any]
Runs = dict[str, dict[str, list[Run]]]  # setting -> arm -> runs

#: the main grid's settings (first path component of an arm), in the paper's order, with their titles
SETTINGS = {"onpolicy": "on-policy (N = 1)", "n2": "off-policy N = 2", "n4": "off-policy N = 4",
            "n8": "off-policy N = 8", "coldstart": "cold start (MiniRL + R2, N = 2)"}


def metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` (a torn last line, from a run still writing, is skipped)."""
    path = run_dir / "metrics.jsonl"
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def _updates_per_step(run_dir: Path) -> int:
    """N x E of a run (its gradient updates per global step; 1 = on-policy)."""
    try:
        raw = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        return int(raw["optim"]["minibatches_per_step"]) * int(raw["optim"].get("epochs_per_step", 1))
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return 1


def _arm_of(run_dir: Path, root: Path) -> str:
    if run_dir == root:  # one run directory: named by itself (a sweep's seed directory by its arm too)
        return f"{run_dir.parent.name}/{run_dir.name}" if run_dir.name.startswith("seed") else run_dir.name
    return run_dir.parent.relative_to(root).as_posix() if run_dir.parent != root else run_dir.name


def load_runs(runs_dir: Path) -> Runs:
    """setting -> arm -> [run] from every directory at or below ``runs_dir`` that holds metrics.

    The setting is the arm's first path component (``onpolicy``, ``n2``, ..., ``trace`` in the stress study);
    an arm without one (a single run, or runs laid out flat) is placed by its N."""
    out: Runs = {}
    for metrics in sorted(runs_dir.rglob("metrics.jsonl")):
        run_dir = metrics.parent
        rows = metric_rows(run_dir)
        if not rows:
            continue
        n = _updates_per_step(run_dir)
        arm = _arm_of(run_dir, runs_dir)
        setting = arm.split("/")[0] if "/" in arm and run_dir != runs_dir else ("onpolicy" if n == 1 else f"n{n}")
        out.setdefault(setting, {}).setdefault(arm, []).append({"seed": run_dir.name, "n": n, "rows": rows, "dir": run_dir})
    order = list(SETTINGS)
    return dict(sorted(out.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


def series(run: Run, key: str) -> tuple[list[int], list[float]]:
    """(gradient steps, finite values) of one metric of a run."""
    xs, ys = [], []
    for row in run["rows"]:
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            xs.append(int(row["step"]) * run["n"])
            ys.append(float(value))
    return xs, ys


def flat(runs: Runs) -> dict[str, list[Run]]:
    """arm -> runs, over every setting."""
    return {arm: rs for arms in runs.values() for arm, rs in arms.items()}
