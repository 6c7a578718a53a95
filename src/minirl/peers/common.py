"""What both translations share: the ``Translation`` (minirl keys with their origins, and what did not carry
over) and its YAML, the peer's settings over its defaults (``Peer``), the objective's all-or-nothing rule, and
the small readers both use."""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from minirl.config import Config, ConfigError
from minirl.hub import download_command, is_hub_id

NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
MEGATRON_MODULES = {"linear_qkv": ["q_proj", "k_proj", "v_proj"], "linear_proj": ["o_proj"],
                    "linear_fc1": ["gate_proj", "up_proj"], "linear_fc2": ["down_proj"]}
"""Megatron's fused projections and the transformers modules they hold (verl's and slime's LoRA targets)."""
SECTIONS = ("run", "model", "task", "rollout", "optim", "algo", "moe", "eval", "log", "cold_start", "checkpoint", "cluster", "critic")


@dataclass
class Translation:
    """minirl dotted keys with the peer setting each came from, and what did not carry over."""

    source: str
    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    objective: str = ""
    differs: list[str] = field(default_factory=list)
    not_translated: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    source_name: str = "the command line"
    """What was translated (files and settings), for the header."""

    def set(self, key: str, value: Any, origin: str) -> None:
        self.values[key] = value
        self.origin[key] = origin

    def config(self) -> Config:
        """The translated config, validated; a value minirl rejects is one line naming the peer key."""
        nested: dict[str, Any] = {}
        for key, value in self.values.items():
            *parents, leaf = key.split(".")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        try:
            return Config.model_validate(nested)
        except ValidationError as err:  # name the first bad key and the peer setting it came from
            first = err.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            leaf = where.split(".")[-1]
            source = next((self.origin[k] for k in self.values if k.split(".")[0] == where.split(".")[0]
                           and k.split(".")[-1] == leaf), "")
            message = first["msg"].removeprefix("Value error, ")
            if not where:  # a rule across keys: the peer settings of the keys it names
                named = [f"{key} from {self.origin[key]}" for key in self.values
                         if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message) and self.origin.get(key)]
                came = f" ({'; '.join(named)})" if named else ""
                raise ConfigError(f"the translated {self.source} settings are not a valid minirl config: {message}"
                                  f"{came}") from None
            raise ConfigError(f"{self.source} setting {source or where}: minirl's {where} rejects it: {message}") from None

    def render(self, source_name: str) -> str:
        """YAML with the header (objective, differences, keys not translated) and each key's origin."""
        self.config()
        lines = [f"# minirl config translated from the {self.source} settings of {source_name}",
                 f"# by `minirl config from-{self.source.lower()}`. Check it with `minirl config show FILE`.",
                 f"# Objective: {self.objective}"]
        for title, items in (("Differs from your run", self.differs),
                             ("Not translated (no minirl equivalent)", self.not_translated)):
            if items:
                lines.append(f"# {title}:")
                lines += [f"#   - {item}" for item in items]
        if self.ignored:
            lines.append(f"# Ignored (no effect on what is trained here): {', '.join(sorted(self.ignored))}")
        tree: dict[str, Any] = {}
        for key in sorted(self.values, key=lambda k: SECTIONS.index(k.split(".")[0])):
            *parents, leaf = key.split(".")
            node = tree
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = key
        lines += _emit(tree, self.values, self.origin, 0)
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        return (f"{len(self.values)} minirl keys from your {self.source} settings; "
                f"{len(self.differs)} differ, {len(self.not_translated)} not translated (listed in the file's header)")


@dataclass
class Objective:
    """What a peer's loss settings become: algo.* values with their origins, or the reasons they cannot."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    differs: list[str] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any, origin: str) -> None:
        self.values[f"algo.{key}"] = (value, origin)


def _emit(tree: dict[str, Any], values: dict[str, Any], origin: dict[str, str], depth: int) -> list[str]:
    lines = []
    for name, node in tree.items():
        if isinstance(node, dict):
            lines += [f"{'  ' * depth}{name}:", *_emit(node, values, origin, depth + 1)]
        else:
            lines.append(f"{'  ' * depth}{name}: {_scalar(values[node])}  # {origin[node]}")
    return lines


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


class Peer:
    """The peer's settings: what the user gave, over the peer's defaults; records every key read."""

    def __init__(self, given: dict[str, Any], defaults: dict[str, Any]) -> None:
        self.given, self.defaults = given, defaults
        self.read: set[str] = set()

    def __call__(self, key: str) -> Any:
        self.read.add(key)
        value = self.given.get(key, self.defaults.get(key))
        if isinstance(value, CommandOutput):
            raise ConfigError(f"{value.where}: {key} takes the output of {value.command}, a command the translation "
                              f"does not run; give {self.override_hint(key)} after the script")
        if isinstance(value, Unresolved):
            raise ConfigError(f"{value.where}: {key} uses a variable the script does not set ({value.text}); "
                              f"set it in the environment or give {self.override_hint(key)} after the script")
        default = self.defaults.get(key)
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        if (numeric or default is None) and isinstance(value, str) and NUMBER.fullmatch(value.strip()):
            value = parse_value(value.strip())  # YAML reads `1e-6` as text; TRL's and Hydra's parsers take it
        if numeric and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"setting {key}={value!r}: expected a number")
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        """A mapping setting, given whole (``key={...}``) or by its leaves (a YAML file's or Hydra's
        ``+key.name=value``, flattened to ``key.name``), the leaves nested again by their dots."""
        value = self(key)
        out: dict[str, Any] = dict(value) if isinstance(value, dict) else {}
        for full in self.given:
            if full.startswith(key + "."):
                *parents, leaf = full[len(key) + 1 :].split(".")
                node = out
                for part in parents:
                    node = node.setdefault(part, {})
                node[leaf] = self(full)
        return out

    def json_mapping(self, key: str, what: str = "") -> dict[str, Any]:
        """``mapping(key)``, or TRL's JSON text of one (``dict | str`` fields); anything else is one line."""
        value = self(key)
        if not isinstance(value, str):
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{key}={value!r}: not a mapping{what}")
            return self.mapping(key)
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{key}={value!r}: not a JSON object{what}") from None
        if not isinstance(parsed, dict):
            raise ConfigError(f"{key}={value!r}: not a mapping{what}")
        return parsed

    def override_hint(self, key: str) -> str:
        """How the user sets ``key`` on the command line after the file."""
        return f"{key}=..."

    def set_by_user(self, key: str) -> bool:
        self.read.add(key)
        return key in self.given

    def show(self, *keys: str) -> str:
        return ", ".join(f"{key}={self(key)!r}" if isinstance(self(key), str) else f"{key}={self(key)}" for key in keys)

    def unread(self) -> list[str]:
        return [key for key in self.given if key not in self.read]


LABEL_ROWS_READ = 1000
"""How many rows of a local data file a translation reads to find the label column (slime's ``--label-key``, OpenRLHF's
``--label_key``)."""


def check_label_column(flag: str, key: str, path: str, peer: str) -> None:
    """slime and OpenRLHF read ``row[label key]`` (a KeyError when the column is nowhere in the file); minirl would pass
    the reward functions no label, so a column none of the file's first rows has is one line now."""
    file = Path(os.path.expanduser(path))
    if not file.is_file() or file.suffix not in (".jsonl", ".parquet"):
        return
    columns: set[str] = set()
    read = "no row of"
    try:
        if file.suffix == ".parquet":
            import pyarrow.parquet as pq

            columns = set(pq.read_schema(file).names)
        else:
            with open(file, encoding="utf-8") as rows:
                for n, line in enumerate(rows):
                    if n == LABEL_ROWS_READ:
                        read = f"none of the first {LABEL_ROWS_READ} rows of"
                        break
                    row = json.loads(line) if line.strip() else {}
                    columns |= set(row) if isinstance(row, dict) else set()
    except (OSError, ValueError, ImportError):  # an unreadable file is the loader's to report, with its line
        return
    if columns and key not in columns:
        near = difflib.get_close_matches(key, sorted(columns), n=1)
        hint = f"; did you mean {flag} {near[0]}?" if near else ""
        raise ConfigError(f"{flag} {key}: {read} {path} has a column {key!r} (its columns: "
                          f"{', '.join(sorted(columns))}); {peer} stops there with a KeyError{hint}")


def gpu_ranks(out: Translation, ranks: int, origin: str, peer_name: str, how: str) -> None:
    """The peer's actor GPUs as minirl's FSDP2 trainer ranks on Ray, one per GPU (``how``: how the peer shards over
    them), and ``cluster.device: cuda``: what from-slime and from-openrlhf write."""
    if ranks > 1:
        out.set("cluster.trainer_ranks", ranks, f"{origin}: one FSDP2 rank per GPU")
        out.set("cluster.backend", "ray", f"{peer_name} runs its actors on Ray")
        out.set("cluster.gpus_per_trainer_rank", 1.0, "one GPU per trainer rank")
        out.set("cluster.gpus_per_engine", 1.0, "one GPU per rollout engine")
        out.differs.append(f"{peer_name} shards the model over its {ranks} GPUs {how}; minirl shards it over FSDP2 ranks "
                           "and runs its engines as separate Ray actors: size cluster.* for your machine "
                           "(docs/distributed.md)")
    out.set("cluster.device", "cuda", f"{peer_name} trains on GPUs")


def note_local_path(out: Translation, key: str, value: str, what: str, target: str | None = None) -> None:
    if Path(os.path.expanduser(value)).exists():
        return
    target = target or ("model.path" if what == "model" else "task.path")
    if not is_hub_id(value):
        how = f"set {target} to where it is on this machine"
    elif what in ("model", "reward model"):
        how = f"{download_command(value)}, then set {target} to DIR"
    else:
        how = f"{download_command(value, 'dataset')}, then set {target} to DIR"
    out.differs.append(f"{key}={value!r} is not on this machine: minirl reads the {what} from disk only ({how})")


def report_to(value: Any, out: Translation, key: str) -> None:
    names = [value] if isinstance(value, str) else list(value or [])
    everything = "all" in names
    for name in ("tensorboard", "wandb"):
        if everything or name in names:
            out.set(f"log.{name}", True, f"{key}={value!r}")
    rest = [name for name in names if name not in ("tensorboard", "wandb", "all", "none", "console")]
    if rest:
        out.not_translated.append(f"{key}: {', '.join(rest)} (minirl logs to TensorBoard, wandb and metrics.jsonl)")


def apply_objective(out: Translation, keep: bool, obj: Objective) -> None:
    """Carry the peer's loss over when minirl has it; else (or when asked) leave minirl's MiniRL."""
    if keep or obj.blockers:
        why = ("as asked (--keep-objective)" if keep else
               f"your {out.source} loss has no exact minirl equivalent ({'; '.join(obj.blockers)})")
        out.objective = f"minirl's MiniRL (paper Eq. 7), {why}; no algo.* key is set"
        out.not_translated += [f"{item}: the run trains with MiniRL instead" for item in obj.blockers if not keep]
        return
    for key, (value, origin) in obj.values.items():
        out.set(key, value, origin)
    out.differs += obj.differs
    extra = f", aggregation={out.values['algo.aggregation']}" if "algo.aggregation" in out.values else ""
    out.objective = (f"your {out.source} loss as minirl's algo.name={out.values['algo.name']}{extra}"
                     + (" (its differences are listed below)" if obj.differs else ", the same gradient"))


def unset(value: Any) -> bool:
    """A value that turns nothing on: off, empty, Hydra's mandatory ``???`` or an interpolation of another key."""
    return (value is None or value is False or value == 0 or value in ("", "???") or value == [] or value == {}
            or (isinstance(value, str) and value.startswith("${")))


def leftovers(peer: Peer, out: Translation, ignored: re.Pattern[str], prefix: str = "") -> None:
    """Keys the translation did not read: known to the peer's table (their effect rides on another key, e.g. a
    KL coefficient with the KL off) or unset -> nothing; noise -> ignored; the rest -> not translated.
    ``prefix`` names the file they came from when there are two (``"SFT "``)."""
    for key in peer.unread():
        if key in peer.defaults or unset(peer.given[key]):
            continue
        if ignored.match(key):
            out.ignored.append(prefix + key)
        else:
            value = peer.given[key]
            shown = value.text if isinstance(value, Unresolved) else repr(value)
            close = difflib.get_close_matches(key, list(peer.defaults), n=1, cutoff=0.85)  # a typo of a peer's key
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            out.not_translated.append(f"{prefix}{key}={shown}: not a setting minirl knows how to carry over{hint}")


def count_rows(path: str | list[str] | None, split: str = "train", config: str | None = None) -> int | None:
    """Rows of a local data file or of a dataset directory's ``split`` (what verl's and TRL's loaders count; a list:
    all of theirs), or None when one is not here or unreadable."""
    if isinstance(path, list):
        counts = [count_rows(one, split, config) for one in path]
        return None if not counts or None in counts else sum(c for c in counts if c is not None)
    if not path or not Path(os.path.expanduser(path)).exists():
        return None
    from minirl.tasks.data import iter_rows
    from minirl.tasks.jsonl import TaskDataError

    try:
        return sum(1 for _ in iter_rows(Path(os.path.expanduser(path)), split=split, config=config))
    except TaskDataError:
        return None


def parse_value(text: str) -> Any:
    """A Hydra / CLI value: numbers (``1e-6`` too), booleans, null, lists; else the string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def flatten(data: Any, prefix: str = "", skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A nested mapping as ``a.b.c`` keys (a list or scalar is a leaf); ``skip``: keys dropped at any depth (Hydra's
    ``defaults`` / ``hydra`` / ``_target_`` in a verl YAML)."""
    if not isinstance(data, dict):
        return {prefix[:-1]: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key not in skip:
            flat.update(flatten(value, f"{prefix}{key}.", skip))
    return flat


def read_yaml(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    return data


@dataclass(frozen=True)
class Unresolved:
    """A script's override naming a variable set nowhere: an error only if the translation reads it."""

    text: str
    where: str


@dataclass(frozen=True)
class CommandOutput(Unresolved):
    """A script's word taking a command's output (``$(nproc)``, backticks, a variable set from one), which the
    translation does not run: an error only if the translation reads it."""

    command: str = ""
    """The command and where the script runs it (``$(nproc) (run.sh:3)``)."""


def template_kwargs(peer: Peer, out: Translation, key: str) -> None:
    """A peer's chat-template variables (a mapping, or TRL's JSON text of one) as ``task.chat_template_kwargs``."""
    value = peer.json_mapping(key, " of chat-template variables")
    if value:
        out.set("task.chat_template_kwargs", value, f"{key}={value}")
