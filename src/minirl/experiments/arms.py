"""Arm tables and the arm-config generator.

An experiment directory holds a base config and an **arm table** (``arms.yaml``): per arm its legend, its
dotted overrides and its horizon in *gradient steps*; a study under a sub-folder (``stress/``, ``horizon/``,
``studies/...``) has its own table next to the files it generates. ``generate(exp_dir)`` writes, for every
table under ``exp_dir``, ``<folder>/<arm>.yaml`` as a *complete* config (the base, then the condition's and
the arm's overrides, validated by the normal schema, every key written out) under a header naming the base,
the table and the overrides. Counts are converted explicitly: an arm with N mini-batches per global step
gets ``optim.global_steps = gradient_steps / N`` and ``eval.every_steps = 16 / N`` and so on, so every arm
makes the same number of updates on the same number of samples and no key is reinterpreted.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from minirl.config import (
    Config,
    ConfigError,
    OptimConfig,
    apply_override,
    read_config_file,
)

TABLE = "arms.yaml"
#: old name -> new name of renamed config keys. Files written here use the new names; a finished run's
#: ``config.yaml`` written before the rename is read with its old names mapped (``to_schema``).
RENAMED = {"optim.steps": "optim.global_steps", "optim.warmup_steps": "optim.warmup_updates"}


def _schema_has_new_names() -> bool:
    return "global_steps" in OptimConfig.model_fields


def schema_key(key: str) -> str:
    """The spelling the installed schema uses for a dotted key given in either spelling.

    Until the ``optim.global_steps`` rename has landed in ``minirl.config`` the schema still says
    ``optim.steps``; afterwards this maps old names to new ones (reading runs made before the rename)."""
    if _schema_has_new_names():
        return RENAMED.get(key, key)
    return {new: old for old, new in RENAMED.items()}.get(key, key)


def _renamed(data: dict[str, Any], spell) -> dict[str, Any]:
    """A copy of ``data`` with each renamed key spelled by ``spell`` (in place: the key order is kept)."""
    names: dict[str, set[str]] = {key.split(".")[0]: set() for key in [*RENAMED, *RENAMED.values()]}
    for key in [*RENAMED, *RENAMED.values()]:
        names[key.split(".")[0]].add(key.split(".")[1])
    out = dict(data)
    for section, fields in names.items():
        values = out.get(section)
        if isinstance(values, dict) and fields & set(values):
            out[section] = {(spell(f"{section}.{k}").split(".")[1] if k in fields else k): v for k, v in values.items()}
    return out


def to_schema(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a raw config mapping with renamed keys spelled as the installed schema spells them."""
    return _renamed(data, schema_key)


def to_current(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a raw config mapping with renamed keys spelled with their new names (for written files)."""
    return _renamed(data, lambda key: RENAMED.get(key, key))


def global_steps(cfg: Config) -> int:
    """The run's length in global steps, whichever spelling the schema uses."""
    return int(getattr(cfg.optim, schema_key("optim.global_steps").split(".")[1]))


def read_run_config(path: Path) -> Config:
    """A run's saved ``config.yaml`` (or an arm file), old key names mapped: a finished run stays readable."""
    return _validate(to_schema(read_config_file(path)), str(path))


def _validate(data: dict[str, Any], where: str) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as err:  # one line naming the key, like minirl.config's loader
        first = err.errors()[0]
        raise ConfigError(f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def load_arm(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """An arm file is a complete config: load it with the normal schema (renamed keys mapped)."""
    data = to_schema(read_config_file(path))
    for pair in overrides:
        key, _, value = pair.partition("=")
        apply_override(data, f"{schema_key(key)}={value}")
    return _validate(data, str(path))


# ----------------------------------------------------------------------------- the table


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    legend: str
    figure: str = ""
    gradient_steps: int | None = Field(None, ge=1)
    overrides: dict[str, Any] = {}


class _Condition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    axis: str
    label: str
    overrides: dict[str, Any] = {}


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: str
    gradient_steps: int = Field(ge=1)
    every_gradient_steps: dict[str, int] = {}
    conditions: dict[str, _Condition] = {}
    axes: dict[str, list[str]] = {}
    arms: dict[str, _Entry]


@dataclass(frozen=True)
class Arm:
    """One generated config: ``name`` is its path under the table's folder without ``.yaml``."""

    name: str
    legend: str
    overrides: dict[str, Any]
    gradient_steps: int
    every_gradient_steps: dict[str, int]
    figure: str = ""


@dataclass(frozen=True)
class Condition:
    axis: str
    label: str


@dataclass(frozen=True)
class StudyTable:
    path: Path
    base: Path
    arms: list[Arm]
    conditions: dict[str, Condition] = field(default_factory=dict)
    axes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return self.path.parent


def load_table(path: Path) -> StudyTable:
    """Read and check an arm table; with ``conditions`` every arm is made once per condition
    (``<condition>/<arm>``, the condition's overrides applied before the arm's)."""
    raw = read_config_file(path)
    try:
        table = _Table.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        raise ConfigError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    arms = []
    conditions = table.conditions or {"": _Condition(axis="", label="")}
    for cond_name, cond in conditions.items():
        for name, entry in table.arms.items():
            legend = f"{entry.legend}; {cond.axis}: {cond.label}" if cond_name else entry.legend
            arms.append(Arm(name=f"{cond_name}/{name}" if cond_name else name, legend=legend,
                            overrides={**cond.overrides, **entry.overrides},
                            gradient_steps=entry.gradient_steps or table.gradient_steps,
                            every_gradient_steps=dict(table.every_gradient_steps), figure=entry.figure))
    return StudyTable(path=path, base=(path.parent / table.base).resolve(), arms=arms,
                      conditions={k: Condition(v.axis, v.label) for k, v in table.conditions.items()},
                      axes=table.axes)


def find_tables(exp_dir: Path) -> list[StudyTable]:
    return [load_table(path) for path in sorted(Path(exp_dir).rglob(TABLE))]


# ----------------------------------------------------------------------------- generating arm files


def _pairs(overrides: dict[str, Any]) -> list[str]:
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]


def global_counts(arm: Arm, n: int, table: Path) -> dict[str, int]:
    """The arm's gradient-step counts as global steps of N = ``n`` mini-batches per step (N must divide them)."""
    counts = {"optim.global_steps": arm.gradient_steps, **arm.every_gradient_steps}
    for key, value in counts.items():
        if value % n:
            raise ConfigError(f"{table}: {arm.name}: {key} = {value} gradient steps is not divisible by N={n}")
    return {key: value // n for key, value in counts.items()}


def render(arm: Arm, table: StudyTable, prefix: str = "") -> str:
    """The complete config of ``arm``: the base, then its overrides, then its counts in global steps.
    ``prefix``: the table's folder under the experiment directory (``stress/``), part of the run name."""
    data = to_schema(read_config_file(table.base))
    for pair in _pairs(arm.overrides):
        apply_override(data, pair)
    n = int(data.get("optim", {}).get("minibatches_per_step", 1))
    counts = _pairs(global_counts(arm, n, table.path))
    for pair in counts:
        key, _, value = pair.partition("=")
        apply_override(data, f"{schema_key(key)}={value}")
    run_name = f"{prefix}{arm.name}".replace("/", "-")
    data.setdefault("run", {})["name"] = run_name
    cfg = _validate(data, f"{table.path}: {arm.name}")
    target = table.folder / f"{arm.name}.yaml"
    def rel(p: Path) -> str:
        return os.path.relpath(p, target.parent)

    header = ["# GENERATED by `python -m minirl.experiments generate`; do not edit (edit the base or the arm table).",
              f"# arm: {prefix}{arm.name} ({arm.legend})", f"# base: {rel(table.base)}", f"# table: {rel(table.path)}",
              f"# horizon: {arm.gradient_steps} gradient steps = {arm.gradient_steps // n} global steps x N={n}",
              "# overrides:"]
    header += [f"#   {p}" for p in _pairs(arm.overrides) + counts] + [f"#   run.name={run_name}"]
    body = yaml.safe_dump(to_current(cfg.model_dump(mode="json")), sort_keys=False)
    return "\n".join(header) + "\n" + body


def generate(exp_dir: Path, *, check: bool = False) -> list[str]:
    """Write (or with ``check``: compare) every arm file of every table under ``exp_dir``; returns the
    paths (relative to ``exp_dir``, without ``.yaml``) that differ or were written."""
    changed = []
    for table in find_tables(exp_dir):
        for arm in table.arms:
            path = table.folder / f"{arm.name}.yaml"
            folder = table.folder.relative_to(exp_dir).as_posix()
            text = render(arm, table, "" if folder == "." else f"{folder}/")
            if path.is_file() and path.read_text(encoding="utf-8") == text:
                continue
            changed.append(path.relative_to(exp_dir).with_suffix("").as_posix())
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    return changed


def find_arms(exp_dir: Path, patterns: list[str] | None = None) -> list[tuple[str, Path]]:
    """(arm name, path) of every arm config of ``exp_dir`` in its table's order, filtered by globs.

    Sub-folders with their own table are studies swept on their own (``minirl sweep experiments/stress``).
    A directory without a table: every ``*.yaml`` under it but ``base.yaml``, alphabetically."""
    exp_dir = Path(exp_dir)
    if (exp_dir / TABLE).is_file():
        arms = []
        for arm in load_table(exp_dir / TABLE).arms:
            path = exp_dir / f"{arm.name}.yaml"
            if not path.is_file():
                raise ConfigError(f"{path}: arm file missing; write it with `python -m minirl.experiments generate {exp_dir}`")
            arms.append((arm.name, path))
    else:
        own = {p.parent for p in exp_dir.rglob(TABLE)}
        arms = [(p.relative_to(exp_dir).with_suffix("").as_posix(), p) for p in sorted(exp_dir.rglob("*.yaml"))
                if p.name not in ("base.yaml", TABLE) and not any(d in p.parents for d in own)]
    return [(name, path) for name, path in arms if not patterns or any(fnmatch.fnmatch(name, p) for p in patterns)]
