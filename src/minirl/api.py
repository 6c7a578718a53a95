"""``minirl.train``: ``minirl train`` from Python, handed what a TRL user hands ``GRPOTrainer``::

    import minirl

    def correct(completions, solution, **kwargs):          # TRL's reward signature
        return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]

    summary = minirl.train("configs/demo.yaml", "optim.global_steps=50",   # a config (or None) and overrides
                           model="path/to/hf_model",                        # model.path
                           train_dataset=dataset,                           # datasets.Dataset, rows or a file
                           peft_config=LoraConfig(r=16, lora_alpha=32),     # model.lora (optional)
                           reward_funcs=[correct, "rewards:fmt"], reward_weights=[1.0, 0.2])
    summary.eval_before, summary.eval_after, summary.run_dir

TRL's ``args=GRPOConfig(...)`` (or ``RLOOConfig``) may stand in for the config (translated as ``minirl config from-trl`` does, the
settings it changed read against TRL's defaults, what differs printed). Everything else is the config, and the
run is the CLI's: the same cold start, checkpoints, resume
(``resume=True``) and run directory, whose ``config.yaml`` repeats it. In-memory datasets are saved once
(``save_to_disk``) under ``RUN.output_dir/_datasets/<fingerprint>`` and named in the config; reward
functions by ``module:function``. A function defined in the script itself (``__main__``), a lambda, a closure or
a callable object (``minirl.api:_IN_PROCESS.<name>``) cannot be imported by a reward worker process, so such runs call
their rewards in this process (``task.reward_timeout_s: null``, said in one line); put them in a module to keep the
timeout (and a config that names them for another process).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from minirl.config import Config, ConfigError, apply_override, format_error, load_config

DatasetLike = Any  # datasets.Dataset | datasets.DatasetDict | list[dict] | str | Path


def _short_for_user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` raising a user's mistake (a bad key, file, model directory or data row: ``minirl.cli.user_errors``) with
    the traceback cut to the caller's line, as the CLI's one line: the message says what to mend, minirl's frames
    would not. A reward function or environment that raised keeps its whole traceback (the user's own code)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from minirl.cli import user_errors
        from minirl.rollout.environments import EnvironmentFailure
        from minirl.tasks.rewards import RewardFunctionError

        try:
            return fn(*args, **kwargs)
        except user_errors() as exc:
            if isinstance(exc, (RewardFunctionError, EnvironmentFailure)):
                raise
            raise exc.with_traceback(None) from None

    return wrapper


@_short_for_user_errors
def train(config: str | Path | Config | None = None, *overrides: str, model: str | Path | None = None,
          train_dataset: DatasetLike = None, eval_dataset: DatasetLike = None,
          reward_funcs: Sequence[Callable[..., Any] | str] | None = None, reward_weights: Sequence[float] | None = None,
          peft_config: Any = None, args: Any = None, start_from: str | Path | None = None, resume: bool = False,
          tools: Sequence[Callable[..., Any] | str] | None = None,
          environment_factory: Callable[[], Any] | str | dict[str, Callable[[], Any] | str] | None = None,
          **unsupported: Any) -> Any:
    """Train as ``minirl train CONFIG OVERRIDES`` would, with TRL's arguments; returns the ``RunSummary``
    (held-out accuracy before and after RL, steps, seconds, run directory). ``args``: a TRL ``GRPOConfig`` in place
    of ``config``, translated as ``minirl config from-trl`` translates its file (what differs printed). ``tools``:
    TRL's, functions the model may call while it answers (``task.tools``, ``minirl.rollout.tools``);
    ``environment_factory``: TRL's, a class (or a dict of them) whose instances the rollouts act in
    (``task.environment``, ``minirl.rollout.environments``). Raises
    ``ConfigError`` for a user's mistake (one line) and ``minirl.loop.NumericalFaultStop`` after too many
    numerical faults. As ``GRPOTrainer``, a single reward function may be given bare, and ``args.reward_weights``
    weigh ``reward_funcs``."""
    if unsupported:
        name = sorted(unsupported)[0]
        raise ConfigError(f"minirl.train: {name} is not taken ({UNSUPPORTED.get(name, 'not a GRPOTrainer argument minirl reads')})")
    if callable(reward_funcs) or isinstance(reward_funcs, str):  # GRPOTrainer takes one bare
        reward_funcs = [reward_funcs]
    model = _model_path(model)
    if config is None and args is None and not overrides:  # GRPOTrainer(model, reward_funcs, train_dataset) as copied
        print(f"minirl.train: no config and no args: {_defaults_said()}", file=sys.stderr)
    if args is not None:
        if config is not None:
            raise ConfigError("minirl.train: give a minirl config or TRL's args (a GRPOConfig), not both")
        if reward_funcs is not None and reward_weights is None and getattr(args, "reward_weights", None) is not None:
            reward_weights = list(args.reward_weights)  # GRPOTrainer reads them from its args
        config = _from_trl_args(args, rewards_given=reward_funcs is not None, train_rows=_rows(train_dataset))
    cfg = _configure(config, list(overrides), model, train_dataset, eval_dataset, reward_funcs, reward_weights, peft_config,
                     tools, environment_factory)
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from minirl.loop import hold_run_dir
    from minirl.preflight import preflight

    hf_logging.set_verbosity_error()  # as the CLI: our progress line is the only one
    hf_logging.disable_progress_bar()
    preflight(cfg)
    with hold_run_dir(cfg.run_dir):
        return run_training(cfg, Console(stderr=True), start_from=None if start_from is None else str(start_from),
                            resume=resume)


def _defaults_said() -> str:
    """minirl's defaults where TRL's GRPOTrainer without args takes GRPOConfig()'s, in one line."""
    d = Config()
    return (f"minirl's defaults (optim.lr {d.optim.lr:g}, rollout.max_new_tokens {d.rollout.max_new_tokens}, "
            f"optim.global_steps {d.optim.global_steps}, {d.rollout.prompts_per_step} prompts x "
            f"{d.rollout.samples_per_prompt} samples: `minirl config defaults`), not GRPOConfig()'s (learning_rate 1e-6, "
            "max_completion_length 512, 3 epochs): give args=GRPOConfig(...) for TRL's")


def run_training(cfg: Config, console: Any, *, start_from: str | None = None, resume: bool = False,
                 dump_rollouts: str | None = None, rollouts_from: str | None = None) -> Any:
    """The body of ``minirl train`` (the caller holds the run directory): resume point or fresh-start check,
    the cold start, then RL. Returns the ``RunSummary``."""
    from minirl.checkpoint import checkpoints_dir, restart_in_place, resume_point
    from minirl.loop import check_fresh_start, check_sources
    from minirl.loop import train as rl_train
    from minirl.sft import cached_sft, run_sft

    resume_from = None
    if resume or cfg.run.resume == "auto":
        found = resume_point(cfg.run_dir, log=lambda line: print(line, file=sys.stderr))
        if found is None:  # resume means continue: with nothing to continue from, the run starts again in place
            lost = restart_in_place(cfg.run_dir)
            removed = f" (removed the metrics of steps 1-{lost}, logged after it)" if lost else ""
            print(f"minirl: resume: no valid checkpoint in {checkpoints_dir(cfg.run_dir)}; starting from step 0{removed}",
                  file=sys.stderr)
        else:
            resume_from = found
            done = int(found.name.removeprefix("step_"))
            if done >= cfg.optim.global_steps:  # e.g. a peer's run name with a date in it, translated to a fixed one
                print(f"minirl: resume: {cfg.run_dir} already finished its {done} steps ({found.name}); nothing is left "
                      "to train (give another run.name, or run.resume=never to train it again)", file=sys.stderr)
    check_sources(cfg, dump_rollouts=dump_rollouts, rollouts_from=rollouts_from)  # before the cold start's minutes
    if resume_from is None:
        check_fresh_start(cfg, start_from)  # before any work: never silently start over an earlier run
    if cfg.cold_start.enabled and not start_from and resume_from is None:
        what = (f"your data {cfg.cold_start.data}" if cfg.cold_start.data
                else f"'{cfg.cold_start.style}' teacher traces of task '{cfg.task.kind}'")
        console.print(f"[bold]cold start[/]: SFT on {what}")
        if cfg.cold_start.cache_dir:
            start_from = str(cached_sft(cfg, Path(cfg.cold_start.cache_dir), log=console.print))
        else:
            start_from = str(run_sft(cfg, cfg.run_dir / "sft", log=console.print))
    summary = rl_train(cfg, start_from=start_from, resume_from=resume_from, dump_rollouts=dump_rollouts,
                       rollouts_from=rollouts_from, run_dir_held=True)
    console.print(
        f"[bold green]done[/] {summary.steps} steps in {summary.seconds:.0f}s  |  held-out accuracy (reward >= "
        f"{cfg.eval.accuracy_threshold:g}) before RL {summary.eval_before:.3f} -> after RL {summary.eval_after:.3f}  |  "
        f"run dir {summary.run_dir}", soft_wrap=True,  # one line, whatever the terminal's width (a log greps it)
    )
    return summary


def _configure(config: str | Path | Config | None, overrides: list[str], model: str | Path | None,
               train_dataset: DatasetLike, eval_dataset: DatasetLike,
               reward_funcs: Sequence[Callable[..., Any] | str] | None, reward_weights: Sequence[float] | None,
               peft_config: Any = None, tools: Sequence[Callable[..., Any] | str] | None = None,
               environment_factory: Any = None) -> Config:
    """The config with TRL's arguments folded in as overrides (validated once, at the end)."""
    if isinstance(config, Config):
        data: dict[str, Any] = config.model_dump(mode="json")
    else:
        data = load_config(config, overrides).model_dump(mode="json")  # a typo in the overrides is named here
        overrides = []
    for override in overrides:
        apply_override(data, override)
    if model is not None:
        data["model"]["path"] = str(model)
    if peft_config is not None:  # TRL's peft_config=LoraConfig(r, lora_alpha, lora_dropout, target_modules)
        data["model"]["lora"] = _lora(peft_config)
    datasets_dir = Path(data["run"]["output_dir"]) / "_datasets"
    if train_dataset is None and environment_factory is not None and not data["task"].get("path"):
        if isinstance(environment_factory, dict):
            raise ConfigError("environment_factory: a dict of environments needs a train_dataset whose rows name theirs "
                              "in an 'environment' column")
        train_dataset = [{"prompt": [{"role": "user", "content": ""}]}] * ENVIRONMENT_ROWS  # reset() gives each prompt
        print(f"minirl.train: no train_dataset: the environment owns the data (TRL's rule), each prompt its reset()'s "
              f"text ({ENVIRONMENT_ROWS} empty rows; optim.global_steps sets the length, as TRL's max_steps)",
              file=sys.stderr)
    if type(train_dataset).__name__ == "IterableDataset":  # TRL takes one with max_steps: the rows a run reads
        train_dataset = _first_rows(train_dataset, data)
    for name, value, key in (("train_dataset", train_dataset, "path"), ("eval_dataset", eval_dataset, "eval_path")):
        if value is not None:
            data["task"]["kind"] = "jsonl"
            data["task"][key] = _dataset_path(value, datasets_dir, name)
    if tools is not None:  # run in this process, beside the engine: a function of the script itself is fine
        data["task"]["tools"] = [tool if isinstance(tool, str) else _function_spec(tool, f"tools[{index}]")
                                 for index, tool in enumerate(tools)]
    if environment_factory is not None:  # TRL's: a factory, or {name: factory} picked by the rows' environment column
        def named(factory: Any, where: str) -> str:
            return factory if isinstance(factory, str) else _function_spec(factory, where)

        data["task"]["environment"] = (
            {str(key): named(value, f"environment_factory[{key!r}]") for key, value in environment_factory.items()}
            if isinstance(environment_factory, dict) else named(environment_factory, "environment_factory"))
    if reward_funcs is not None:
        weights = list(reward_weights) if reward_weights is not None else [1.0] * len(reward_funcs)
        if len(weights) != len(reward_funcs):
            raise ConfigError(f"reward_weights: {len(weights)} weights for {len(reward_funcs)} reward_funcs")
        entries = [_reward_entry(fn, index) for index, fn in enumerate(reward_funcs)]
        data["task"]["reward_functions"] = [entry | {"weight": float(w)} for entry, w in zip(entries, weights)]
        data["task"]["reward_function"] = None
        if any((entry.get("function") or "").startswith(IN_PROCESS_PREFIXES) for entry in entries) and \
                data["task"]["reward_timeout_s"] is not None:
            data["task"]["reward_timeout_s"] = None
            print("minirl: reward functions defined in the script (or lambdas, closures, callable objects) run in this "
                  "process, without task.reward_timeout_s (a worker process cannot import them; a module's can be)",
                  file=sys.stderr)
    try:
        return Config.model_validate(data)
    except ValidationError as err:  # the arguments' values, through the same one-line messages as a file's
        raise ConfigError(format_error(err, "minirl.train")) from None


UNSUPPORTED = {
    "processing_class": "minirl reads the tokenizer from the model's directory (model.path, or model.tokenizer)",
    "rollout_func": "TRL's rollout_func drives its own vLLM server; minirl samples with its engine (task.tools and "
                    "task.environment for multi-turn rollouts)",
    "callbacks": "minirl logs to metrics.jsonl, TensorBoard or wandb (log.*)",
    "optimizers": "minirl trains with AdamW (optim.*)",
    "reward_processing_classes": "a reward model's tokenizer is read from its directory",
}
"""``GRPOTrainer`` arguments ``minirl.train`` does not take, and what minirl does instead."""


def _model_path(model: Any) -> Any:
    """``model`` as a path: a loaded model object is refused in one line naming the path it came from (minirl loads
    its own copy, and an object changed in memory would not be what it loads)."""
    if model is None or isinstance(model, (str, Path)):
        return model
    source = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    where = f"; this one was loaded from {source!r}" if source else ""
    raise ConfigError(f"minirl.train: model: give the model's path (a local directory; minirl loads it itself){where}")


def _rows(dataset: DatasetLike) -> int | None:
    """The training rows of an in-memory dataset or a list (for TRL's ``num_train_epochs``), else None."""
    if dataset is None or isinstance(dataset, (str, Path)):
        return None
    if hasattr(dataset, "keys") and "train" in dataset:  # a DatasetDict
        dataset = dataset["train"]
    try:
        return len(dataset)
    except TypeError:
        return None


def _from_trl_args(args: Any, rewards_given: bool = False, train_rows: int | None = None) -> Config:
    """A ``GRPOConfig`` (any dataclass with ``to_dict``) as a minirl config: the settings that differ from a fresh
    ``type(args)()`` are the user's, read against TRL's defaults (``minirl.peers.trl.from_trl``). ``rewards_given``:
    ``reward_funcs`` came beside it (its ``reward_weights`` are theirs); ``train_rows``: the rows of the
    ``train_dataset`` beside it (for ``num_train_epochs``)."""
    from minirl.peers import from_trl

    if not (dataclasses.is_dataclass(args) and hasattr(args, "to_dict")):
        raise ConfigError(f"args: expected TRL's GRPOConfig or RLOOConfig, got {type(args).__name__}")
    settings = args.to_dict()
    declared = {}  # the dataclass's own defaults (a fresh GRPOConfig() may refuse to build on a CPU: bf16)
    for spec in dataclasses.fields(args):
        if spec.default is not dataclasses.MISSING:
            declared[spec.name] = spec.default
        elif spec.default_factory is not dataclasses.MISSING:
            declared[spec.name] = spec.default_factory()
    given = {key: value for key, value in settings.items() if key not in declared or declared[key] != value}
    if rewards_given:
        given.pop("reward_weights", None)
    translation = from_trl(given, trainer="rloo" if type(args).__name__ == "RLOOConfig" else "grpo",
                           train_rows=train_rows, script=False)
    for line in [f"objective: {translation.objective}", *translation.differs, *translation.not_translated]:
        print(f"minirl: TRL args: {line}", file=sys.stderr)
    return translation.config()


PEFT_NOT_CARRIED: dict[str, Any] = {"use_rslora": False, "use_dora": False, "modules_to_save": None, "bias": "none",
                                     "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}
"""peft ``LoraConfig`` fields (and their defaults) that ``model.lora`` has no key for: one set otherwise is refused."""


def _lora(peft_config: Any) -> dict[str, Any]:
    """``model.lora`` from a peft ``LoraConfig`` (its rank, alpha, dropout, target modules and parameters)."""
    if not all(hasattr(peft_config, name) for name in ("r", "lora_alpha", "target_modules")):
        raise ConfigError(f"peft_config: expected a peft LoraConfig, got {type(peft_config).__name__}")
    changed = [f"{name}={value!r}" for name, default in PEFT_NOT_CARRIED.items()
               if (value := getattr(peft_config, name, default)) not in (default, None, [], {})]
    if changed:
        raise ConfigError(f"peft_config: {', '.join(changed)} is not carried over (minirl's LoRA takes r, lora_alpha, "
                          "lora_dropout, target_modules and target_parameters)")
    if float(getattr(peft_config, "lora_dropout", 0.0) or 0.0) > 0:
        print("minirl: peft_config: lora_dropout is off during RL, as every dropout (r = pi_theta / pi_old is then 1 "
              "at theta_old; TRL's disable_dropout=True)", file=sys.stderr)
    targets = peft_config.target_modules
    lora: dict[str, Any] = {"rank": int(peft_config.r), "alpha": float(peft_config.lora_alpha),
                            "dropout": float(getattr(peft_config, "lora_dropout", 0.0) or 0.0)}
    if targets:
        lora["target_modules"] = [targets] if isinstance(targets, str) else sorted(targets)
    parameters = getattr(peft_config, "target_parameters", None)  # peft >= 0.17: an MoE's fused experts
    if parameters:
        lora["target_parameters"] = list(parameters)
        if not targets:
            lora["target_modules"] = []
    return lora


def _reward_entry(fn: Callable[..., Any] | str, index: int) -> dict[str, Any]:
    """``task.reward_functions`` entry of a reward function: its ``module:function`` (one defined in ``__main__``
    keeps that module: in-process) and fixed ``kwargs`` — a ``functools.partial``'s, or the arguments of one of
    TRL's reward factories (``trl.rewards.get_soft_overlong_punishment(...)``: minirl's rewrite, bound alike)."""
    if isinstance(fn, (str, Path)) and Path(fn).expanduser().is_dir():  # TRL: a string naming a reward model
        return {"model": str(fn)}
    if isinstance(fn, str):
        return {"function": fn}
    path = getattr(getattr(fn, "config", None), "name_or_path", None)
    if path and hasattr(fn, "save_pretrained"):  # a loaded reward model: scored from where it was loaded
        if not Path(path).is_dir():
            raise ConfigError(f"reward_funcs[{index}]: a model loaded from {path!r}, not a local directory; give the "
                              "directory it was saved to")
        return {"model": str(path)}
    from minirl.tasks.trl_rewards import FACTORIES

    kwargs: dict[str, Any] = {}
    if isinstance(fn, functools.partial):
        if fn.args:
            raise ConfigError(f"reward_funcs[{index}]: a functools.partial with positional arguments {fn.args!r}; "
                              "bind them by keyword (they travel as the entry's kwargs)")
        kwargs = dict(fn.keywords)
        fn = fn.func
    factory = FACTORIES.get(type(fn).__name__)
    if factory is not None and type(fn).__module__.startswith("trl."):
        function, names = factory
        fn, kwargs = function, {name: getattr(fn, name) for name in names}
    return {"function": _function_spec(fn, f"reward_funcs[{index}]")} | ({"kwargs": kwargs} if kwargs else {})


def _function_spec(fn: Callable[..., Any], where: str) -> str:
    """``module:function`` naming ``fn`` in the run's config (``__main__:name`` for one of the script itself)."""
    from minirl.tasks.rewards import reward_spec

    spec = reward_spec(fn)
    if spec is not None:
        return spec
    qualname = getattr(fn, "__qualname__", "")
    if getattr(fn, "__module__", None) == "__main__" and qualname and "<" not in qualname:
        return f"__main__:{qualname}"
    # a lambda, a closure or a callable object (TRL takes them): named for this process only, once however often given
    key = next((name for name, known in vars(_IN_PROCESS).items() if known is fn), None)
    if key is None:
        key = f"{re.sub(r'[^0-9A-Za-z_]', '_', getattr(fn, '__name__', None) or type(fn).__name__)}_{len(vars(_IN_PROCESS))}"
        setattr(_IN_PROCESS, key, fn)
    return f"minirl.api:_IN_PROCESS.{key}"


ENVIRONMENT_ROWS = 256
"""Rows of an environment that owns its data (``environment_factory`` without ``train_dataset``): empty prompts that
each rollout's ``reset()`` fills."""

_IN_PROCESS = types.SimpleNamespace()
"""Reward functions ``minirl.train`` was handed that no module names (a lambda, a closure, a callable object), by the
name the run's config gives them (``minirl.api:_IN_PROCESS.<name>_<n>``): found in this process only, as a
script's own functions are."""
IN_PROCESS_PREFIXES = ("__main__:", "minirl.api:_IN_PROCESS.")


def _first_rows(stream: Any, data: dict[str, Any]) -> list[dict[str, Any]]:
    """An ``IterableDataset``'s first rows, as many as the run draws (``optim.global_steps`` x
    ``rollout.prompts_per_step``, and the held-out share ``task.eval_fraction`` without ``eval_dataset``), said in one
    line: minirl saves its data and reads it from disk."""
    import itertools

    steps, per_step = int(data["optim"]["global_steps"]), int(data["rollout"]["prompts_per_step"])
    held = 0.0 if data["task"].get("eval_path") else float(data["task"].get("eval_fraction") or 0.0)
    wanted = math.ceil(steps * per_step / (1.0 - held)) + 1
    rows = [dict(row) for row in itertools.islice(stream, wanted)]
    print(f"minirl.train: train_dataset is an IterableDataset: its first {len(rows)} rows are saved and read (the "
          f"{steps} steps x {per_step} prompts the run draws, and the held-out share), as TRL reads a stream for "
          "max_steps", file=sys.stderr)
    return rows


def _named_eval_sets(sets: dict[str, Any]) -> Any:
    """TRL's ``eval_dataset={name: dataset, ...}`` as one dataset whose rows carry their set's name as
    ``data_source``: minirl logs ``eval/<name>/accuracy`` and ``reward_mean`` for each (TRL: ``eval_<name>_*``)."""
    import datasets

    parts = []
    for source, part in sets.items():
        rows = part if isinstance(part, datasets.Dataset) else datasets.Dataset.from_list(list(part))
        if "data_source" in rows.column_names:
            rows = rows.remove_columns("data_source")
        parts.append(rows.add_column("data_source", [str(source)] * len(rows)))
    try:
        return datasets.concatenate_datasets(parts)
    except ValueError as error:
        raise ConfigError(f"eval_dataset: its sets ({', '.join(map(str, sets))}) cannot be read as one: "
                          f"{' '.join(str(error).split())[:200]}") from None


def _dataset_path(value: DatasetLike, root: Path, name: str) -> str:
    """A file or directory as it is; a ``datasets`` object or a list of rows saved once under ``root``."""
    if isinstance(value, (str, Path)):
        return str(value)
    import datasets

    if isinstance(value, datasets.DatasetDict):
        if "train" not in value and len(value) != 1:
            raise ConfigError(f"{name}: a DatasetDict without a 'train' split (splits: {', '.join(value)})")
        value = value["train"] if "train" in value else next(iter(value.values()))
    elif isinstance(value, dict) and name == "eval_dataset":  # TRL's {name: dataset}: each its data_source
        value = _named_eval_sets(value)
    if isinstance(value, (list, tuple)):
        if not all(isinstance(row, dict) for row in value):
            raise ConfigError(f"{name}: expected a datasets.Dataset, a list of row dicts or a file path")
        fingerprint = hashlib.sha256(json.dumps(list(value), sort_keys=True, default=str).encode()).hexdigest()[:16]
        value = datasets.Dataset.from_list(list(value))
    elif isinstance(value, datasets.Dataset):
        fingerprint = value._fingerprint
    else:
        raise ConfigError(f"{name}: expected a datasets.Dataset, a list of row dicts or a file path, "
                          f"got {type(value).__name__}")
    target = root / fingerprint
    if not (target / "dataset_info.json").is_file():
        shown = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # our progress line is the only one
        try:
            value.save_to_disk(str(target))
        finally:
            if shown:
                datasets.enable_progress_bars()
    return str(target)
