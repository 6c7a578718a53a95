"""One-step-off asynchronous RL (``rollout.async_steps: 1``) against the synchronous loop, side by side in one run.

Runs ``minirl.loop.train`` for a few global steps of a config (default: the demo config without its cold start
and held-out evaluations) once per arm, in alternating rounds, and prints each arm's median step time (the main
thread's wall time, ``time/step_s``, from step 3 on: step 1 samples in line and warms up) with its phases. The
arms are ``rollout.async_steps`` 0 and 1, each at every ``--threads`` value (``run.threads``: torch's intra-op
threads, which the engine's thread shares with the update's).

    python benchmarks/bench_async.py [--config configs/demo.yaml] [--steps 12] [--rounds 2] [--threads 1 2] [key=value ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from minirl.loop import train
from minirl.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from bench_step import step_config

PHASES = ("step", "rollout", "rollout_wait", "old_logprobs", "update", "sync")


def one_run(config: str, steps: int, overrides: list[str]) -> dict[str, float]:
    """Median seconds of each phase over steps 3.. of one run."""
    with tempfile.TemporaryDirectory() as out:
        cfg = step_config(config, steps, out, overrides)
        train(cfg)
        rows = [r for r in read_metrics(cfg.run_dir) if r["step"] >= 3]
    return {phase: statistics.median(r.get(f"time/{phase}_s", 0.0) for r in rows) for phase in PHASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    arms = [(threads, lag) for threads in args.threads for lag in (0, 1)]
    runs: dict[tuple[int, int], list[dict[str, float]]] = {arm: [] for arm in arms}
    for _ in range(args.rounds):
        for threads, lag in arms:
            runs[threads, lag].append(one_run(args.config, args.steps, [*args.overrides, f"run.threads={threads}",
                                                                        f"rollout.async_steps={lag}"]))
    print(f"{args.config} {' '.join(args.overrides)}: median s per global step, steps 3..{args.steps}, "
          f"{args.rounds} alternating round(s); torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    print(f"{'threads':>7} {'async':>5} " + " ".join(f"{p:>12}" for p in PHASES) + "  speed-up")
    for threads, lag in arms:
        med = {p: statistics.median(r[p] for r in runs[threads, lag]) for p in PHASES}
        base = statistics.median(r["step"] for r in runs[threads, 0])
        print(f"{threads:>7} {lag:>5} " + " ".join(f"{med[p]:>12.3f}" for p in PHASES) + f"  {base / med['step']:.2f}x")


if __name__ == "__main__":
    main()
