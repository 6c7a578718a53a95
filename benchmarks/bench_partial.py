"""Partial rollouts (``rollout.partial_rollout``) against whole rollouts, side by side in one run.

Runs ``minirl.loop.train`` for a few global steps of a config (default: the demo config without its cold start and
held-out evaluations) per arm, in alternating rounds, and prints each arm's median rollout and step time (from step 2
on), ``rollout/stale_tokens_frac``, ``rollout/chunks`` and response length. Partial rollouts pay where response
lengths have a long tail; the synthetic tasks' answers all have one length, so the documented command gives the
untrained model stop strings: a response then ends at the first of them, its length geometric (a long tail, cut at
``rollout.max_new_tokens``). The arms:

* ``whole``: partial rollouts off (each response sampled whole in one engine call);
* ``chunks``: partial rollouts with no over-sampling (``partial_pool_prompts`` = ``prompts_per_step``): nothing
  carries over without a filter, so this is the cost of decoding in chunks (each prefills the responses so far);
* ``pool 2P``: twice the prompts decoded at a time; the step trains the groups that end first, the rest wait.

    python benchmarks/bench_partial.py [--config configs/demo.yaml] [--steps 10] [--rounds 2] [--chunk 8] [key=value ...]
    python benchmarks/bench_partial.py rollout.max_new_tokens=96 "task.stop_strings=[a,e,i,o,u]"   # a long tail
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

from minirl.config import load_config
from minirl.loop import train
from minirl.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from bench_step import step_config

KEYS = ("time/rollout_s", "time/step_s", "rollout/stale_tokens_frac", "rollout/chunks", "train/response_length")


def arms(prompts: int, chunk: int) -> dict[str, list[str]]:
    on = ["rollout.partial_rollout=true", f"rollout.partial_chunk_tokens={chunk}"]
    return {"whole": [], "chunks": [*on, f"rollout.partial_pool_prompts={prompts}"],
            "pool 2P": [*on, f"rollout.partial_pool_prompts={2 * prompts}"]}


def one_run(config: str, steps: int, overrides: list[str]) -> dict[str, float]:
    """Each key's median over steps 2.. of one run (a key the arm does not log: 0)."""
    with tempfile.TemporaryDirectory() as out:
        cfg = step_config(config, steps, out, overrides)
        train(cfg)
        rows = [r for r in read_metrics(cfg.run_dir) if r["step"] >= 2]
    return {key: statistics.median(r.get(key, 0.0) for r in rows) for key in KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    table = arms(load_config(args.config, args.overrides).rollout.prompts_per_step, args.chunk)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in table}
    for _ in range(args.rounds):
        for name, extra in table.items():
            runs[name].append(one_run(args.config, args.steps, [*args.overrides, *extra]))
    print(f"{args.config} {' '.join(args.overrides)}: medians over steps 2..{args.steps}, "
          f"{args.rounds} alternating round(s), chunks of {args.chunk} tokens; torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    print(f"{'arm':<8} {'rollout s':>10} {'step s':>8} {'stale tokens':>13} {'chunks':>7} {'response len':>13}")
    for name, results in runs.items():
        value = {key: statistics.median(r[key] for r in results) for key in KEYS}
        print(f"{name:<8} {value['time/rollout_s']:>10.3f} {value['time/step_s']:>8.3f} "
              f"{value['rollout/stale_tokens_frac']:>13.3f} {value['rollout/chunks']:>7.1f} "
              f"{value['train/response_length']:>13.2f}")


if __name__ == "__main__":
    main()
