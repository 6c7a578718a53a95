"""Partial rollouts (``rollout.partial_rollout``) against whole rollouts, side by side in one run.

Runs ``minirl.loop.train`` for a few global steps of a config (default: the demo config without its cold start and
held-out evaluations) per arm, in alternating rounds, and prints each arm's median rollout and step time (from step 2
on), ``rollout/stale_tokens_frac``, ``rollout/chunks`` and response length. Partial rollouts pay where response
lengths have a long tail; the synthetic tasks' answers all have one length, so ``--eos-chars aeiou`` makes those
characters end a response in the engine (added to its stop-token ids, as a model's ``eos_token_id`` list would be):
the untrained model's responses then end at the first vowel drawn, their lengths geometric (a long tail, cut at
``rollout.max_new_tokens``). (Not ``task.stop_strings``: the native engine cuts a response at a stop string after
its call, so a whole call decodes every row to the limit, which would flatter the chunks.) The arms:

* ``whole``: partial rollouts off (each response sampled whole in one engine call);
* ``P``: partial rollouts with no over-sampling (``partial_pool_prompts`` = ``prompts_per_step``): nothing
  carries over without a filter, so this is the cost of the checks;
* ``2P``: twice the prompts decoded at a time; the step trains the groups that end first, the rest wait;
* ``2P, async 1``: the same pool sampled beside the update (``rollout.async_steps: 1``, verl's fully asynchronous
  ``partial_rollout``): its ``rollout s`` is the batch's own, beside the update, ``wait s`` the update's wait for it.

Each partial arm twice: ``one call`` (the native engine decodes the step in one call that keeps its KV cache and
stops at a check, ``DecodeControl``) and ``chunk calls`` (the engine called once per chunk, each call prefilling the
responses so far again, as for an engine without the control: the rollout source is wrapped so the loop does not see
the native engine).

    python benchmarks/bench_partial.py [--config configs/demo.yaml] [--steps 10] [--rounds 2] [--chunk 8] [key=value ...]
    python benchmarks/bench_partial.py --eos-chars aeiou rollout.max_new_tokens=96   # a long tail
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from minirl.config import load_config
from minirl.loop import setup, train
from minirl.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from bench_step import step_config

KEYS = ("time/rollout_s", "time/rollout_wait_s", "time/step_s", "rollout/stale_tokens_frac", "rollout/chunks", "train/response_length")


def arms(prompts: int, chunk: int) -> dict[str, tuple[list[str], bool]]:
    """Each arm's overrides and whether the engine is called once per chunk."""
    on = ["rollout.partial_rollout=true", f"rollout.partial_chunk_tokens={chunk}"]
    table: dict[str, tuple[list[str], bool]] = {"whole": ([], False)}
    for name, pool in (("P", prompts), ("2P", 2 * prompts)):
        for calls, per_chunk in (("one call", False), ("chunk calls", True)):
            table[f"{name}, {calls}"] = ([*on, f"rollout.partial_pool_prompts={pool}"], per_chunk)
    table["2P, async 1"] = ([*table["2P, one call"][0], "rollout.async_steps=1"], False)
    return table


class ChunkCalls:
    """The engine's rollouts behind a source that is not ``EngineRollouts``: the loop calls it once per chunk."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def rollouts(self, *args: Any, **kwargs: Any) -> Any:
        return self.source.rollouts(*args, **kwargs)


def one_run(config: str, steps: int, overrides: list[str], eos_chars: str = "", chunk_calls: bool = False) -> dict[str, float]:
    """Each key's median over steps 2.. of one run (a key the arm does not log: 0); ``eos_chars``: characters that
    also end a response in the engine; ``chunk_calls``: the engine called once per chunk."""
    with tempfile.TemporaryDirectory() as out:
        cfg = step_config(config, steps, out, overrides)
        run = setup(cfg)
        if eos_chars:
            extra = [run.tokenizer.convert_tokens_to_ids(char) for char in eos_chars]
            run.engine.eos_ids = torch.cat([run.engine.eos_ids, torch.tensor(extra, device=run.engine.eos_ids.device)])
        if chunk_calls:
            run.rollouts = ChunkCalls(run.rollouts)
        train(cfg, run=run)
        rows = [r for r in read_metrics(cfg.run_dir) if r["step"] >= 2]
    return {key: statistics.median(r.get(key, 0.0) for r in rows) for key in KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--eos-chars", default="", help="characters that also end a response (a long tail of lengths)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    table = arms(load_config(args.config, args.overrides).rollout.prompts_per_step, args.chunk)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in table}
    for _ in range(args.rounds):
        for name, (extra, per_chunk) in table.items():
            runs[name].append(one_run(args.config, args.steps, [*args.overrides, *extra], args.eos_chars, per_chunk))
    print(f"{args.config} {' '.join(args.overrides)}{' --eos-chars ' + args.eos_chars if args.eos_chars else ''}: medians over steps 2..{args.steps}, "
          f"{args.rounds} alternating round(s), chunks of {args.chunk} tokens; torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    print(f"{'arm':<16} {'rollout s':>10} {'wait s':>7} {'step s':>8} {'stale tokens':>13} {'chunks':>7} {'response len':>13}")
    for name, results in runs.items():
        value = {key: statistics.median(r[key] for r in results) for key in KEYS}
        print(f"{name:<16} {value['time/rollout_s']:>10.3f} {value['time/rollout_wait_s']:>7.3f} {value['time/step_s']:>8.3f} "
              f"{value['rollout/stale_tokens_frac']:>13.3f} {value['rollout/chunks']:>7.1f} "
              f"{value['train/response_length']:>13.2f}")


if __name__ == "__main__":
    main()
