"""The ``minirl`` command line: ``train``, ``sft``, ``eval``, ``config``; ``sweep``, ``plot``, ``report`` (``minirl.experiments``).

Each takes a config file (YAML or TOML) and dotted ``key=value`` overrides, e.g.::

    minirl train configs/demo.yaml optim.lr=3e-4 moe.routing_replay=R2
    minirl config defaults            # every key, its default and what it does
    minirl config show my.yaml        # the resolved config of a file (plus overrides)
    minirl config from-trl grpo.yaml -o my.yaml    # a TRL (`trl grpo --config`; `from-trl rloo FILE`: `trl rloo`),
                                                   # verl (from-verl run.sh), slime (from-slime run.sh), OpenRLHF
                                                   # (from-openrlhf run.sh) or prime-rl run (from-prime-rl rl.toml)

A user's mistake (config typo, missing file, malformed data row, bad reward function) is printed
as one line naming the key, file or function, with exit code 2; so is a run directory that cannot
be written (a file in its path, read-only, a full disk: the line names the last complete
checkpoint and the command that resumes). ``train`` checks everything the config alone decides
before any work (``minirl.preflight``). Exit code 3: too many numerical faults in a row. Ctrl-C or
SIGTERM in ``train`` / ``sft``: one line naming the last complete checkpoint and the resume
command, exit code 130 / 143; a second one exits at once. ``kill -USR1 PID`` prints where every
thread of a running ``minirl`` command is (Python stacks, on stderr) and lets it go on.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from minirl.config import Config, ConfigError, load_config

EXIT_USER_ERROR = 2
EXIT_NUMERICAL_FAULT = 3


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM during ``train`` / ``sft`` (a BaseException, as KeyboardInterrupt is)."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number
        self.signal_name = signal.Signals(signal_number).name


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """The first SIGINT or SIGTERM raises ``Interrupted`` (the run unwinds: workers stopped, metrics
    flushed; an unfinished checkpoint stays a ``.tmp-*`` that the next start removes); a second
    one while it unwinds exits at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signal_number: int, frame: Any) -> None:
        os.write(2, f"minirl: {signal.Signals(signal_number).name} again: exiting now\n".encode())
        os._exit(128 + signal_number)

    def interrupt(signal_number: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, exit_now)
        signal.signal(signal.SIGTERM, exit_now)
        raise Interrupted(signal_number)

    previous = {number: signal.signal(number, interrupt) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'the user's input is wrong' (reported in one line)."""
    errors: list[type[BaseException]] = [ConfigError]
    for module, name in (
        ("minirl.models.io", "ModelLoadError"),
        ("minirl.models.padding_free", "PaddingFreeError"),
        ("minirl.models.logprob_head", "LogprobHeadError"),
        ("minirl.tasks.jsonl", "TaskDataError"),
        ("minirl.tasks.chat", "ChatTemplateError"),
        ("minirl.tasks.rewards", "RewardSpecError"),
        ("minirl.tasks.rewards", "RewardFunctionError"),
        ("minirl.rollout.environments", "EnvironmentFailure"),
    ):
        try:
            errors.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config, args.overrides)  # before any heavy import: a typo is reported at once
    _quiet_libraries()
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    cfg = _config(args)  # first: a config mistake is reported before the heavy imports
    from rich.console import Console

    from minirl.loop import hold_run_dir
    from minirl.preflight import is_storage_error, preflight

    preflight(cfg)  # everything the config alone decides, before the cold start and any model build
    with stop_on_signals(), hold_run_dir(cfg.run_dir):  # from the choice of checkpoint to the end: one process per run dir
        try:
            return _train_holding(cfg, args, Console(stderr=True))
        except Interrupted as exc:
            print(f"minirl: {exc.signal_name}: stopped; {_resume_hint(cfg, args)}", file=sys.stderr)
            return 128 + exc.signal_number
        except OSError as exc:
            if not is_storage_error(exc):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"minirl: error: cannot write {where}{exc.strerror}; {_resume_hint(cfg, args)}", file=sys.stderr)
            return EXIT_USER_ERROR


def _sft_kept(output: Path) -> str:
    """What a stopped SFT left in ``output``: its state after some step (``cold_start.checkpoint_every_steps``)."""
    from minirl.sft import SFT_STATE

    if not (output / SFT_STATE).is_file():
        return f"no SFT state was kept in {output} (cold_start.checkpoint_every_steps: 0), it starts again from step 1"
    import torch

    step = torch.load(output / SFT_STATE, weights_only=True).get("step")
    return f"the SFT's state after step {step} is in {output / SFT_STATE}, the same command continues from it"


def _resume_hint(cfg: Config, args: argparse.Namespace) -> str:
    """'the last complete checkpoint is ...; resume with: minirl train ... --resume' (one line)."""
    from minirl.checkpoint import find_latest

    found = find_latest(cfg.run_dir)
    last = f"the last complete checkpoint is {found[0]}" if found else "no checkpoint was completed (a resume starts from step 0)"
    if not found and cfg.cold_start.enabled and not cfg.cold_start.cache_dir:  # stopped in the cold start
        last += f"; the cold start: {_sft_kept(cfg.run_dir / 'sft')}"
    flags = [(flag, getattr(args, name, None)) for flag, name in
             (("--start-from", "start_from"), ("--dump-rollouts", "dump_rollouts"), ("--rollouts-from", "rollouts_from"))]
    given = [part for flag, value in flags if value for part in (flag, str(value))]  # a run without a checkpoint needs them
    command = " ".join(shlex.quote(part) for part in ["minirl", args.command, args.config, *args.overrides, *given])
    return f"{last}; resume with: {command}{'' if args.command != 'train' or args.resume else ' --resume'}"


def _train_holding(cfg: Config, args: argparse.Namespace, console: Any) -> int:
    from minirl.api import run_training
    from minirl.loop import NumericalFaultStop

    try:
        run_training(cfg, console, start_from=args.start_from, resume=args.resume, dump_rollouts=args.dump_rollouts,
                     rollouts_from=args.rollouts_from)
    except NumericalFaultStop as exc:
        print(f"minirl: stopped: {exc}", file=sys.stderr)
        return EXIT_NUMERICAL_FAULT
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    cfg = _config(args)
    from minirl.loop import NumericalFaultStop
    from minirl.preflight import check_run_dir, is_storage_error
    from minirl.sft import run_sft

    output = Path(args.output or cfg.cold_start.output or cfg.run_dir / "sft")
    check_run_dir(output.parent)
    try:
        with stop_on_signals():
            path = run_sft(cfg, output)
    except NumericalFaultStop as exc:
        print(f"minirl: stopped: {exc}", file=sys.stderr)
        return EXIT_NUMERICAL_FAULT
    except Interrupted as exc:  # the same command continues from the SFT's kept state, or starts again
        print(f"minirl: {exc.signal_name}: stopped; {_sft_kept(output)}; run the same command again", file=sys.stderr)
        return 128 + exc.signal_number
    except OSError as exc:
        if not is_storage_error(exc):
            raise
        print(f"minirl: error: cannot write {exc.filename or output}: {exc.strerror}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(f"saved SFT checkpoint to {path}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    run = Path(args.checkpoint)
    if not (run / "config.json").is_file() and (run / "checkpoint" / "config.json").is_file():  # a run directory
        args.checkpoint = str(run / "checkpoint")
        print(f"minirl eval: the run's final model {args.checkpoint}", file=sys.stderr)
    if args.config is None:  # the run's own config beside its model, else the built-in task (said either way)
        args.config = _run_config_of(Path(args.checkpoint))
        if args.config:
            print(f"minirl eval: the run's config {args.config} (--config to give another)", file=sys.stderr)
            _into_runs_directory(args)
        elif not any(item.startswith("task.") for item in args.overrides):
            print("minirl eval: no --config and no run config beside the checkpoint: the built-in task (task.kind) and "
                  "the defaults", file=sys.stderr)
    cfg = _config(args)
    from minirl.loop import evaluate
    from minirl.runtime import build_engine, build_model, build_rewards, build_task, set_threads

    set_threads(cfg.run.threads)
    model, tokenizer = build_model(cfg, path=args.checkpoint)
    task = build_task(cfg, model, tokenizer)
    engine = build_engine(cfg, model, tokenizer)
    if cfg.task.calls_tools:  # the responses call their tools here too, as in training's evaluation
        from minirl.rollout.tools import tool_calling

        engine = tool_calling(cfg, engine, tokenizer, model, task.eval_prompts())
    with build_rewards(cfg, task) as rewards:
        result = evaluate(engine, rewards, task, cfg, step=0)
    print(json.dumps({"checkpoint": args.checkpoint, "task": cfg.task.eval_path or cfg.task.path or cfg.task.kind, **result}))
    return 0


def _into_runs_directory(args: argparse.Namespace) -> None:
    """Evaluate in the working directory the run was started in (``environment.jsonl``'s ``cwd``): its config's
    relative paths (data, reward modules) mean what they meant there (said when it is not this one)."""
    log = Path(args.config).parent / "environment.jsonl"
    try:
        cwd = json.loads(log.read_text().splitlines()[-1]).get("cwd")
    except (OSError, ValueError, IndexError):
        return
    if cwd and Path(cwd).is_dir() and Path(cwd).resolve() != Path.cwd().resolve():
        args.config = str(Path(args.config).resolve())
        args.checkpoint = str(Path(args.checkpoint).resolve()) if Path(args.checkpoint).exists() else args.checkpoint
        os.chdir(cwd)
        print(f"minirl eval: in the run's working directory {cwd} (its config's relative paths)", file=sys.stderr)


def _run_config_of(checkpoint: Path) -> str | None:
    """The config of the run that wrote ``checkpoint``: ``RUN/config.yaml`` beside ``RUN/checkpoint``, above
    ``RUN/checkpoints/step_N/model``, or an SFT output's ``minirl_sft_config.yaml``; None for none."""
    for candidate in (checkpoint.parent / "config.yaml", checkpoint.parent.parent.parent / "config.yaml",
                      checkpoint / "minirl_sft_config.yaml"):
        if candidate.is_file() and (candidate.name != "config.yaml" or (candidate.parent / "metrics.jsonl").exists()):
            return str(candidate)
    return None


def cmd_config(args: argparse.Namespace) -> int:
    from minirl.config_docs import render

    words = [*args.words, *args.overrides]
    action = words.pop(0) if words and words[0] in ("show", "defaults", "from-trl", "from-verl", "from-slime",
                                                         "from-openrlhf", "from-prime-rl") else "show"
    if action.startswith("from-"):
        return _config_from_peer(action, words, args)
    args.config = words.pop(0) if words and "=" not in words[0] else None
    args.overrides = words
    if action == "defaults" and (args.config or args.overrides):
        raise ConfigError("config defaults takes no config file or overrides; use 'minirl config show FILE key=value'")
    print(render(load_config(args.config, args.overrides)))
    return 0


def _config_from_peer(action: str, words: list[str], args: argparse.Namespace) -> int:
    """``config from-trl FILE [key=value]`` / ``config from-verl [run.sh|config.yaml ...] [key=value]`` /
    ``config from-slime [run.sh|config.yaml ...] [--flag value ...]``."""
    from minirl import peers

    if action == "from-slime":  # a launch script and / or slime's own --flag words
        return _write_translation(_from_slime(words, args), args)
    if action == "from-openrlhf":  # a launch script and / or OpenRLHF's own --flag words
        return _write_translation(_from_openrlhf(words, args), args)
    if action == "from-prime-rl":  # prime-rl's rl.toml and / or its key=value (--key value) settings
        return _write_translation(_from_prime_rl(words, args), args)
    files = [word for word in words if "=" not in word]
    settings = [word for word in words if "=" in word]
    if not words:
        what = "a trl grpo config file" if action == "from-trl" else "a verl run script, a verl YAML"
        raise ConfigError(f"config {action}: give {what} and/or key=value settings to translate")
    if action == "from-trl":
        trainer = files.pop(0) if files and files[0] in ("grpo", "rloo") and not Path(files[0]).is_file() else None
        if len(files) > 1:
            raise ConfigError(f"config from-trl takes one TRL config file (trl grpo --config FILE), got {' '.join(files)}")
        launch = peers.read_accelerate(args.accelerate_config) if args.accelerate_config else None
        translation = peers.from_trl(peers.read_trl(files[0] if files else None, settings), args.keep_objective, trainer,
                                     launch)
        if args.sft:  # the cold start from a `trl sft --config` file
            peers.add_trl_sft(translation, peers.read_trl(args.sft, []))
    else:
        translation = peers.from_verl(peers.read_verl(files, settings), args.keep_objective)
        if args.sft:  # the cold start from verl's SFT run (its fsdp_sft_trainer script or YAML)
            peers.add_verl_sft(translation, peers.read_verl([args.sft], []))
    translation.source_name = " ".join(files + settings) or "the command line"
    return _write_translation(translation, args)


def _from_openrlhf(words: list[str], args: argparse.Namespace) -> Any:
    """``config from-openrlhf [run.sh ...] [--flag value ...]``."""
    from minirl import peers

    return _from_launch_script(words, args, peers.read_openrlhf, peers.from_openrlhf, "config from-openrlhf: give an "
                               "OpenRLHF launch script (its `python3 -m openrlhf.cli.train_ppo_ray ...` line) and/or "
                               "OpenRLHF's --flag value words")


def _from_launch_script(words: list[str], args: argparse.Namespace, read: Any, translate: Any, usage: str) -> Any:
    """A launch script (and / or config files) then the peer's ``--flag value`` words: its translation."""
    flags = next((i for i, word in enumerate(words) if word.startswith("--")), len(words))
    if not words:
        raise ConfigError(usage)
    translation = translate(read(words[:flags], words[flags:]), args.keep_objective)
    translation.source_name = " ".join(words[:4]) + (" ..." if len(words) > 4 else "")
    return translation


def _from_prime_rl(words: list[str], args: argparse.Namespace) -> Any:
    """``config from-prime-rl rl.toml [key=value | --key value ...]``."""
    from minirl import peers

    if not words:
        raise ConfigError("config from-prime-rl: give prime-rl's rl TOML file (uv run rl @ rl.toml) and/or its "
                          "key=value settings")
    files = [word for word in words if word.endswith(".toml") and not word.startswith("-") and "=" not in word]
    rest = [word for word in words if word not in files]
    translation = peers.from_prime_rl(peers.read_prime_rl(files, rest), args.keep_objective)
    translation.source_name = " ".join(words[:4]) + (" ..." if len(words) > 4 else "")
    return translation


def _from_slime(words: list[str], args: argparse.Namespace) -> Any:
    """``config from-slime [run.sh|config.yaml ...] [--flag value ...]``."""
    from minirl import peers

    return _from_launch_script(words, args, peers.read_slime, peers.from_slime, "config from-slime: give a slime launch "
                               "script (its `python3 train.py ...` line), a --custom-config-path YAML and/or slime's "
                               "--flag value words")


def _write_translation(translation: Any, args: argparse.Namespace) -> int:
    text = translation.render(translation.source_name)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"minirl: wrote {args.output}: {translation.summary()}; train with `minirl train {args.output}`", file=sys.stderr)
    else:
        print(text, end="")
        print(f"minirl: {translation.summary()}", file=sys.stderr)
    return 0


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("minirl")
    except metadata.PackageNotFoundError:
        from minirl import __version__

        return __version__


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: a count (``3`` = seeds 0, 1, 2) or a list of seeds (``1,2``; one seed alone: ``2,``)."""
    text = text.strip()
    try:
        if text.isdigit():
            seeds = list(range(int(text)))
        else:
            seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        hint = " (a count; for seed 0 alone write --seeds 0,)" if text == "0" else ""
        raise ConfigError(f"--seeds: a count (3 = seeds 0,1,2) or a list of distinct seeds (1,2 or 2,), "
                          f"got {text!r}{hint}")
    return seeds


def cmd_sweep(args: argparse.Namespace) -> int:
    from minirl.experiments.sweep import sweep

    if args.overrides:
        raise ConfigError(f"sweep takes no key=value overrides (got {' '.join(args.overrides)}); edit the arm configs")
    seeds = parse_seeds(args.seeds)
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {args.jobs}")
    exp_dir = Path(args.experiment_dir)
    if not exp_dir.is_dir():
        raise ConfigError(f"{exp_dir}: experiment directory not found")
    patterns = [p for p in (args.arms or "").split(",") if p] or None
    try:
        failed = sweep(exp_dir, seeds, runs_root=Path(args.runs_dir), quick=args.quick, jobs=args.jobs,
                       patterns=patterns, device=args.device, log=lambda msg: print(msg, flush=True))
    except KeyboardInterrupt:
        print("minirl: sweep interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    return 1 if failed else 0


def _runs_dir(args: argparse.Namespace) -> Path:
    if args.overrides:
        raise ConfigError(f"{args.command} takes no key=value overrides (got {' '.join(args.overrides)})")
    runs = Path(args.runs_dir)
    if not runs.is_dir():
        raise ConfigError(f"{runs}: runs directory not found")
    return runs


def cmd_plot(args: argparse.Namespace) -> int:
    from minirl.experiments.plots import plot

    runs = _runs_dir(args)
    written = plot(runs, Path(args.output) if args.output else None)
    if not written:
        raise ConfigError(f"{runs}: no run directories with metrics.jsonl")
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from minirl.experiments.report import load_runs, report

    runs = _runs_dir(args)
    if not load_runs(runs):
        raise ConfigError(f"{runs}: no run directories with metrics.jsonl")
    path = report(runs, Path(args.output) if args.output else None)
    print(path.read_text(encoding="utf-8"))
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    # Over 60 lines: one flat declaration per subcommand, in the order `minirl --help` lists them.
    parser = argparse.ArgumentParser(prog="minirl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"minirl {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, config_required: bool = True) -> None:
        if config_required:
            p.add_argument("config", help="config file (.yaml/.yml/.toml)")
        else:
            p.add_argument("--config", default=None, help="config file for task/eval settings (default: built-in defaults)")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=1e-4")

    p = sub.add_parser("train", help="RL training with MiniRL (optionally after an SFT cold start)")
    common(p)
    p.add_argument("--start-from", default=None, help="HF checkpoint directory to start from (overrides model.*)")
    p.add_argument("--dump-rollouts", default=None, metavar="DIR",
                   help="also write each step's rollouts (tokens, logp_rollout, routes) and rewards to DIR/step_NNNNNN.pt")
    p.add_argument("--rollouts-from", default=None, metavar="DIR",
                   help="train on the rollouts and rewards of a --dump-rollouts DIR instead of sampling (evaluation still samples)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest valid checkpoint in RUN_DIR/checkpoints (fresh start if none)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", help="cold start: supervised fine-tuning on your data (cold_start.data) or teacher traces")
    common(p)
    p.add_argument("--output", default=None, help="checkpoint directory (default: cold_start.output or RUN_DIR/sft)")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("eval", help="held-out mean@n accuracy of a checkpoint")
    p.add_argument("checkpoint", help="HF checkpoint directory, a run directory (its final checkpoint/) or a model "
                   "preset name; without --config, the config "
                   "of the run that wrote it (RUN/config.yaml beside RUN/checkpoint, or an SFT's), said in one line")
    common(p, config_required=False)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("config", help="print a config with every key's value and one-line doc; translate a TRL, verl, "
                         "slime, OpenRLHF or prime-rl run's settings")
    p.add_argument("words", nargs="*",
                   metavar="[show|defaults|from-trl|from-verl|from-slime|from-openrlhf|from-prime-rl] [CONFIG] [key=value ...]",
                   help="show (the default): the resolved CONFIG plus overrides; defaults: the built-in defaults; "
                        "from-trl [rloo] FILE: a `trl grpo --config` (or `trl rloo --config`) file as a minirl config; "
                        "from-verl [run.sh|config.yaml] "
                        "[key=value ...]: a verl main_ppo run's Hydra settings as a minirl config; from-slime "
                        "[run.sh|config.yaml] [--flag value ...]: a slime launch script's train.py flags; from-openrlhf "
                        "[run.sh] [--flag value ...]: an OpenRLHF launch script's train_ppo_ray flags (underscore or "
                        "dotted; its --remote_rm_url reward_func.py runs unchanged); from-prime-rl rl.toml "
                        "[key=value ...]: a prime-rl rl run's TOML (its verifiers environment as task.path "
                        "verifiers:ID and its rubric)")
    p.add_argument("-o", "--output", default=None,
                   help="from-trl / from-verl / from-slime / from-openrlhf / from-prime-rl: write the minirl config "
                        "here (default: stdout)")
    p.add_argument("--sft", default=None, metavar="FILE",
                   help="from-trl: a `trl sft --config` file; from-verl: verl's SFT run (its sft_trainer or "
                        "fsdp_sft_trainer script, or YAML); translated as the cold start (SFT before RL)")
    p.add_argument("--accelerate-config", default=None, metavar="FILE",
                   help="from-trl: the `accelerate launch --config_file` the TRL run was launched with (its processes, "
                        "DeepSpeed or FSDP plugin, CPU offload; a DeepSpeed JSON it names)")
    p.add_argument("--keep-objective", action="store_true",
                   help="from-*: translate the setup only and train with minirl's MiniRL objective")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("sweep", help="run every arm config x seed of an experiment directory (resumable)")
    p.add_argument("experiment_dir", help="directory of arm configs, e.g. experiments/")
    p.add_argument("--seeds", default="1", help="number of seeds (3 = 0,1,2) or a list (0,4; one seed: 2,)")
    p.add_argument("--quick", action="store_true", help="~3 steps of the tiny model per run (CI smoke test)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at a time, one thread each (on a GPU, several runs share the device)")
    p.add_argument("--arms", default=None, help="comma-separated globs of arm names, e.g. 'onpolicy/*,n2/minirl_r2'")
    p.add_argument("--runs-dir", default="runs/sweeps", help="run directories go to RUNS_DIR/<arm>/seed<s>")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="cluster.device for every run (the arm configs' own otherwise); the only setting a sweep overrides")
    p.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("plot", help="the paper's four panels per setting, from run directories (PNG)")
    p.add_argument("runs_dir", help="e.g. runs/sweeps")
    p.add_argument("--output", default=None, help="folder for the PNGs (default: RUNS_DIR/plots)")
    p.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("report", help="markdown table per setting: peak/final score, collapse, KL")
    p.add_argument("runs_dir", help="e.g. runs/sweeps")
    p.add_argument("--output", default=None, help="markdown file (default: RUNS_DIR/REPORT.md)")
    p.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_report)
    return parser


def _quiet_libraries() -> None:
    """Our own progress line is the only one: silence transformers' bars and info logs."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def trl_command_line(words: list[str]) -> list[str]:
    """The rest of a ``trl grpo`` command line as ``config from-trl`` words: ``--config FILE`` -> FILE,
    ``--key value`` / ``--key=value`` -> ``key=value``, ``--key a b`` -> ``key=[a, b]`` (HfArgumentParser's nargs),
    a bare ``--flag`` -> ``flag=true`` (its booleans); minirl's own ``-o`` / ``--output`` / ``--sft`` /
    ``--accelerate-config`` / ``--keep-objective`` stay as they are."""
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-o", "--output", "--sft", "--accelerate-config") and i + 1 < len(words):
            out += words[i:i + 2]
            i += 2
            continue
        if not word.startswith("--") or word == "--keep-objective" or word.startswith(("--sft=", "--accelerate-config=")):
            out.append(word)
            i += 1
            continue
        key, eq, value = word[2:].partition("=")
        if not eq:
            values = _flag_values(words, i + 1, one=key == "config")
            value = "true" if not values else values[0] if len(values) == 1 else f"[{', '.join(values)}]"
            i += len(values)
        out.append(value if key == "config" else f"{key}={value}")
        i += 1
    return out


def split_own_options(words: list[str]) -> tuple[list[str], list[str]]:
    """minirl's ``-o FILE`` / ``--output FILE`` / ``--keep-objective`` out of a ``config from-slime`` command line, and
    the rest (scripts, YAML files, slime's ``--flag value`` words) as they are."""
    own: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(words):
        if words[i] in ("-o", "--output") and i + 1 < len(words):
            own += words[i:i + 2]
            i += 2
            continue
        (own if words[i] == "--keep-objective" or words[i].startswith("--output=") else rest).append(words[i])
        i += 1
    return own, rest


def _flag_values(words: list[str], start: int, *, one: bool) -> list[str]:
    """The values of a ``--flag`` at ``words[start:]``: the words up to the next flag (``--...``, minirl's ``-o``) or
    ``key=value`` word (HfArgumentParser's nargs: ``--reward_clip_range -1 1``); ``one``: at most one."""
    values: list[str] = []
    for word in words[start:]:
        if word.startswith("--") or word == "-o" or "=" in word or (one and values):
            break
        values.append(word)
    return values


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints where every thread of this process is (Python stacks, on stderr): where a stuck
    run sits. Not where stderr is no file (a test's captured stream) or off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation: sys.stderr has no fileno
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["config"] and argv[1:2] in (["from-trl"], ["from-verl"], ["from-slime"], ["from-openrlhf"],
                                                ["from-prime-rl"]) and \
            any(word in ("-h", "--help") for word in argv[2:]):  # before the peer's words take them as settings
        argv = ["config", "--help"]
    if argv[:2] == ["config", "from-trl"]:  # `trl grpo --config FILE --learning_rate 1e-6 ...` as TRL users type it
        argv = argv[:2] + trl_command_line(argv[2:])
    slime = None
    if argv[:2] in (["config", "from-slime"], ["config", "from-openrlhf"],
                    ["config", "from-prime-rl"]):  # the peer's --flag words pass untouched
        own, slime = split_own_options(argv[2:])
        argv = argv[:2] + own
    args, extra = parser.parse_known_args(argv)
    if slime is not None:
        args.words = [argv[1], *slime]
    # key=value overrides may also follow an option (argparse stops a positional list at a flag)
    unknown = [item for item in extra if item.startswith("-") or "=" not in item]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = [*getattr(args, "overrides", []), *extra]
    _stacks_on_sigusr1()
    try:
        return args.func(args)
    except ConfigError as exc:
        for line in str(exc).splitlines() or [""]:  # one line per mistake (preflight reports all it finds)
            print(f"minirl: error: {line}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:
        distributed = sys.modules.get("minirl.distributed.group")  # loaded only when a run built workers
        if distributed is not None and isinstance(exc, distributed.WorkerError):
            print(f"minirl: error: {exc}", file=sys.stderr)  # a trainer rank or engine failed: one line
            return 1
        if not isinstance(exc, user_errors()):
            raise
        print(f"minirl: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
