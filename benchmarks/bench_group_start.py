"""How long W local trainer ranks take to start: fresh interpreters (``spawn``) against forks of a preloaded server
(``forkserver``, what CPU ranks use: ``minirl.distributed.placement``), side by side in one process.

Two measurements, each repeated ``--rounds`` times:

* ``setup``: ``minirl.loop.setup`` of the tiny demo run with ``cluster.trainer_ranks=W``, the whole start of a
  run: the controller's model and engine, the ranks' models, their process group and shards; its ranks forked
  (what CPU ranks do) or spawned (what they did before, and what CUDA ranks do), in alternating rounds, forkserver
  first. Its first round starts the server (its imports: what one ``minirl train`` pays), the next ones fork from it
  (what a second run in the same process pays: the tests, a notebook).
* ``workers``: W ``Spawned`` workers (``collections.Counter``, no model) until each has answered its constructor, by
  each start method in alternating order. A child imports ``minirl.distributed.group`` (torch, transformers, the
  trainer) to serve its calls: a spawned child imports them every time, a forkserver's child (the server started
  above) finds them imported.

    python benchmarks/bench_group_start.py [--ranks 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import collections
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("spawn", "forkserver")


def start_workers(method: str, ranks: int) -> float:
    """Seconds until ``ranks`` workers started by ``method`` have answered their constructors."""
    from minirl.distributed.group import Spawned, gather

    started = time.perf_counter()
    workers = [Spawned(f"worker {r}", collections.Counter, start_method=method) for r in range(ranks)]
    try:
        gather([(worker, "__init__") for worker in workers], "start-up")
        return time.perf_counter() - started
    finally:
        for worker in workers:
            worker.close()


def setup_run(ranks: int, tmp: Path, method: str) -> float:
    """Seconds of ``minirl.loop.setup`` for the tiny demo run on ``ranks`` CPU trainer ranks started by ``method``."""
    from minirl.config import load_config
    from minirl.distributed.group import Spawned
    from minirl.loop import setup

    cfg = load_config(ROOT / "configs/demo.yaml", [
        "model.preset=qwen3-moe-tiny", "cold_start.enabled=false", f"cluster.trainer_ranks={ranks}",
        "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "run.threads=1", f"run.output_dir={tmp}",
        "run.name=start", "run.overwrite=true", "log.console=false"])
    init = Spawned.__init__

    def forced(self: Spawned, *args: Any, start_method: str = "spawn", **kwargs: Any) -> None:
        init(self, *args, start_method=method, **kwargs)  # the placement's own choice overridden

    Spawned.__init__ = forced  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        run = setup(cfg)
        seconds = time.perf_counter() - started
    finally:
        Spawned.__init__ = init  # type: ignore[method-assign]
    run.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    setups: dict[str, list[float]] = {method: [] for method in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for method in METHODS[::-1]:
                setups[method].append(setup_run(args.ranks, Path(tmp), method))
    times: dict[str, list[float]] = {method: [] for method in METHODS}
    for round_ in range(args.rounds):
        for method in METHODS if round_ % 2 == 0 else METHODS[::-1]:
            times[method].append(start_workers(method, args.ranks))
    print(f"{args.ranks} workers, {args.rounds} rounds, torch {torch.__version__}, Python {platform.python_version()}, "
          f"{platform.processor() or platform.machine()}")
    first = setups["forkserver"][0]
    print(f"setup    forkserver  first {first:6.2f} s, then median {statistics.median(setups['forkserver'][1:] or [first]):6.2f} s"
          f"   (all: {', '.join(f'{v:.2f}' for v in setups['forkserver'])})")
    print(f"setup    spawn       median {statistics.median(setups['spawn']):6.2f} s   "
          f"(all: {', '.join(f'{v:.2f}' for v in setups['spawn'])})")
    for method in METHODS:
        values = times[method]
        print(f"workers  {method:<11} median {statistics.median(values):6.2f} s   (all: {', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
