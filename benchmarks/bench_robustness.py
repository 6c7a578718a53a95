"""What robustness costs: the update guard (finite-weight check with undo) and checkpoint checksums.

1. Global steps. Two runs from the same config and seed (default: the demo config, its
   ``qwen3-moe-2m`` model, cold start off), advanced in turn one ``minirl.loop.global_step`` each,
   the order alternated every round so that a noisy neighbour hits both alike: "after" has the
   ``UpdateGuard`` (snapshot of weights + AdamW state before each optimizer step, one fused norm
   after it); "before" has it replaced by a no-op. The guard does not change the math, so both runs
   compute the same tokens. Step 1 (warm-up) is dropped; medians over rounds, and the median of
   the per-round ratio.
2. The guard's own pieces on the same model, least of ``--repeats``: ``snapshot()``, ``check()``.
3. Checkpoints. ``minirl.checkpoint.save`` of that run, alternating "after" (finite-weight check
   and SHA-256 of every file, as shipped) and "before" (both replaced by no-ops), ``--saves`` each;
   plus ``verify`` (what a resume adds). Wall time: a checkpoint is I/O as much as CPU.

    python benchmarks/bench_robustness.py [--config configs/demo.yaml] [--steps 15] [--saves 15] [key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from minirl import checkpoint
from minirl.config import load_config
from minirl.loop import global_step, setup
from minirl.update_guard import UpdateGuard


class NoGuard:
    """``UpdateGuard``'s interface, doing nothing: the trainer as it was before the guard."""

    def snapshot(self) -> None:
        pass

    def check(self) -> None:
        return None

    def restore(self) -> None:
        pass


def median_ratio(after: list[float], before: list[float]) -> float:
    """Median over rounds of after / before - 1 (the paired figure)."""
    return statistics.median(a / b - 1 for a, b in zip(after, before))


def step_times(args: argparse.Namespace, tmp: str) -> None:
    base = ["cold_start.enabled=false", "log.console=false", "eval.every_steps=0", f"run.output_dir={tmp}", *args.overrides]
    runs = {name: setup(load_config(args.config, [*base, f"run.name={name}"])) for name in ("before", "after")}
    runs["before"].trainer._guard = NoGuard()
    times: dict[str, list[float]] = {"before": [], "after": []}
    update: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for step in range(1, args.steps + 1):
            for name in (("before", "after") if step % 2 else ("after", "before")):
                metrics = global_step(runs[name], step)
                if step > 1:
                    times[name].append(metrics["time/step_s"])
                    update[name].append(metrics["time/update_s"])
        print(f"1. global step ({args.steps - 1} rounds, {runs['after'].cfg.global_batch_sequences} sequences, "
              f"{runs['after'].cfg.optim.minibatches_per_step} update(s) a step), median seconds")
        for label, values in (("step", times), ("update phase", update)):
            b, a = statistics.median(values["before"]), statistics.median(values["after"])
            print(f"   {label:13s} before {b:.4f}  after {a:.4f}  paired {100 * median_ratio(values['after'], values['before']):+.1f} %")
        guard = UpdateGuard(runs["after"].trainer.optimizer)
        pieces = {"snapshot": guard.snapshot, "check": guard.check}
        best = {name: min(_timed(fn) for _ in range(args.repeats)) for name, fn in pieces.items()}
        params = sum(p.numel() for p in guard.params)
        print(f"2. guard pieces ({params:,} parameters), least of {args.repeats}: "
              + ", ".join(f"{name} {1000 * seconds:.2f} ms" for name, seconds in best.items()))
        save_times(args, runs["after"], Path(tmp))
    finally:
        for run in runs.values():
            run.close()


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def save_times(args: argparse.Namespace, run, root: Path) -> None:
    shipped = (checkpoint.digests, checkpoint.check_finite)
    times: dict[str, list[float]] = {"before": [], "after": []}
    for index in range(2 * args.saves):
        name = ("before", "after")[index % 2]
        checkpoint.digests, checkpoint.check_finite = shipped if name == "after" else (lambda directory: {}, lambda model, step: None)
        start = time.perf_counter()
        path = checkpoint.save(root / name, index + 1, model=run.trainer.model, tokenizer=run.tokenizer,
                               state={"trainer": run.trainer.checkpoint_state()}, cfg=run.cfg, keep_last=1)
        times[name].append(time.perf_counter() - start)
    checkpoint.digests, checkpoint.check_finite = shipped
    verify = min(_timed(lambda: checkpoint.verify(path)) for _ in range(args.repeats))
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    b, a = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"3. checkpoint save ({size / 2**20:.1f} MiB, {args.saves} each, alternating), median seconds: before {b:.4f}  "
          f"after {a:.4f}  paired {100 * median_ratio(times['after'], times['before']):+.1f} %; verify (on resume) "
          f"{1000 * verify:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--saves", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's shard bar
    with tempfile.TemporaryDirectory() as tmp:
        step_times(args, tmp)


if __name__ == "__main__":
    main()
