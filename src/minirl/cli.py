"""The ``minirl`` command line: ``train``, ``sft``, ``eval``.

Each takes a config file (YAML or TOML) and dotted ``key=value`` overrides, e.g.::

    minirl train configs/demo.yaml optim.lr=3e-4 moe.routing_replay=R2

A user's mistake (config typo, missing file, malformed data row, bad reward function) is printed
as one line naming the key, file or function, with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minirl.config import Config, ConfigError, load_config

EXIT_USER_ERROR = 2
EXIT_NUMERICAL_FAULT = 3


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'the user's input is wrong' (reported in one line)."""
    errors: list[type[BaseException]] = [ConfigError]
    for module, name in (
        ("minirl.models.io", "ModelLoadError"),
        ("minirl.tasks.jsonl", "TaskDataError"),
        ("minirl.tasks.rewards", "RewardSpecError"),
        ("minirl.tasks.rewards", "RewardFunctionError"),
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

    from minirl.checkpoint import checkpoints_dir, find_latest
    from minirl.loop import NumericalFaultStop, check_fresh_start, train
    from minirl.sft import run_sft

    console = Console(stderr=True)
    start_from = args.start_from
    resume_from = None
    if args.resume or cfg.run.resume == "auto":
        found = find_latest(cfg.run_dir)
        if found is None:
            print(f"minirl: resume: no valid checkpoint in {checkpoints_dir(cfg.run_dir)}; starting fresh", file=sys.stderr)
        else:
            resume_from = found[0]
    if resume_from is None:
        check_fresh_start(cfg)  # before any work: never silently start over an earlier run
    if cfg.cold_start.enabled and not start_from and resume_from is None:
        console.print(f"[bold]cold start[/]: SFT on '{cfg.cold_start.style}' teacher traces of task '{cfg.task.kind}'")
        start_from = str(run_sft(cfg, cfg.run_dir / "sft", log=console.print))
    try:
        summary = train(cfg, start_from=start_from, resume_from=resume_from)
    except NumericalFaultStop as exc:
        print(f"minirl: stopped: {exc}", file=sys.stderr)
        return EXIT_NUMERICAL_FAULT
    console.print(
        f"[bold green]done[/] {summary.steps} steps in {summary.seconds:.0f}s  |  held-out accuracy "
        f"before RL {summary.eval_before:.3f} -> after RL {summary.eval_after:.3f}  |  run dir {summary.run_dir}"
    )
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    cfg = _config(args)
    from minirl.sft import run_sft

    path = run_sft(cfg, Path(args.output) if args.output else None)
    print(f"saved SFT checkpoint to {path}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from minirl.loop import evaluate
    from minirl.runtime import build_engine, build_model, build_rewards, build_task, set_threads

    cfg = _config(args)
    set_threads(cfg.run.threads)
    model, tokenizer = build_model(cfg, path=args.checkpoint)
    task = build_task(cfg, model, tokenizer)
    with build_rewards(cfg, task) as rewards:
        result = evaluate(build_engine(cfg, model, tokenizer), rewards, task, cfg, step=0)
    print(json.dumps({"checkpoint": args.checkpoint, **result}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minirl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest valid checkpoint in RUN_DIR/checkpoints (fresh start if none)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", help="cold start: supervised fine-tuning on teacher traces")
    common(p)
    p.add_argument("--output", default=None, help="checkpoint directory (default: cold_start.output or RUN_DIR/sft)")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("eval", help="held-out mean@n accuracy of a checkpoint")
    p.add_argument("checkpoint", help="HF checkpoint directory (or a model preset name)")
    common(p, config_required=False)
    p.set_defaults(func=cmd_eval)
    return parser


def _quiet_libraries() -> None:
    """Our own progress line is the only one: silence transformers' bars and info logs."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may also follow an option (argparse stops a positional list at a flag)
    unknown = [item for item in extra if item.startswith("-") or "=" not in item]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = [*args.overrides, *extra]
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"minirl: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise
        print(f"minirl: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
