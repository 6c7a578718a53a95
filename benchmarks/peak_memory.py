"""Peak resident memory (RSS) and wall time of whole ``minirl`` jobs, each run as a child process.

A job is a ``minirl`` command line (``python -m minirl.cli ...``, the same entry point as the
``.venv/bin/minirl`` script that ``make demo`` calls), run from the repository root with this
interpreter, one job at a time. Per job:

``peak RSS``       the kernel's high-water mark of the job's process, from ``os.wait4`` (its
                   ``ru_maxrss``: the largest of the process and its waited-for descendants)
``tree peak``      the largest sum of ``VmRSS`` over the process and all its descendants, polled
                   from ``/proc`` every ``--interval`` seconds (a job that spawns workers shows
                   here; a short spike between two polls does not)
``wall``           seconds from start to exit (setup, SFT, RL and evaluations together)

Default jobs (``--jobs demo 20m``):

``demo``  ``minirl train configs/demo.yaml``: exactly ``make demo`` (qwen3-moe-2m, 400 SFT steps,
          100 MiniRL steps, evaluation every 25 steps, checkpoints), except that the run directory is
          under a temporary ``run.output_dir`` (``--output-dir``) instead of ``runs/``.
``20m``   the same config with ``model.preset=qwen3-moe-20m`` (~20 M parameters), shortened:
          ``cold_start.steps=50 cold_start.warmup_steps=5 optim.global_steps=20`` (so evaluation runs at
          steps 0 and 20 and one checkpoint is written at step 20); same batch (8 prompts x 8
          samples x up to 24 new tokens), evaluation (128 prompts x 4 samples) and fp8 engine.

``--job NAME='ARGS'`` adds a job (``ARGS``: what follows ``minirl``, e.g.
``--job grpo='train configs/grpo.yaml optim.global_steps=5'``). Memory hardly depends on CPU load, so a
busy machine changes the wall times only.

    python benchmarks/peak_memory.py [--jobs demo 20m] [--job NAME='ARGS' ...] [--interval 0.5]
        [--output-dir DIR] [--out peak_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = ["train", "configs/demo.yaml"]
DEFAULT_JOBS = {
    "demo": DEMO,
    "20m": [*DEMO, "model.preset=qwen3-moe-20m", "cold_start.steps=50", "cold_start.warmup_steps=5", "optim.global_steps=20"],
}


@dataclass
class JobResult:
    name: str
    command: str
    exit_code: int
    wall_s: float
    peak_rss_mib: float  # kernel high-water mark (ru_maxrss of os.wait4)
    tree_peak_rss_mib: float  # largest polled sum of VmRSS over the process tree
    processes: int  # most processes seen in the tree at one poll


def status_kib(pid: int, field: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``); None once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return found


def process_tree(pid: int) -> list[int]:
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += children(current)
    return tree


class TreeSampler(threading.Thread):
    """Polls the summed VmRSS of a process tree until ``stop()``; keeps the peak and the largest tree."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_kib, self.processes = 0, 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            tree = process_tree(self.pid)
            total = sum(status_kib(p, "VmRSS") or 0 for p in tree)
            self.peak_kib = max(self.peak_kib, total)
            self.processes = max(self.processes, len(tree))
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()


def job_command(args: list[str], output_dir: Path, name: str) -> list[str]:
    """``python -m minirl.cli ARGS`` with the run directory moved under ``output_dir``."""
    return [sys.executable, "-m", "minirl.cli", *args, f"run.output_dir={output_dir / name}"]


def run_job(name: str, command: list[str], interval: float, log_path: Path) -> JobResult:
    """Start ``command``, poll its tree, reap it with ``os.wait4`` for the kernel's peak RSS."""
    started = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        sampler = TreeSampler(proc.pid, interval)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen.wait
        sampler.stop()
    wall = time.perf_counter() - started
    return JobResult(name, shlex.join(command), proc.returncode, wall, usage.ru_maxrss / 1024,
                     sampler.peak_kib / 1024, sampler.processes)


def parse_job(text: str) -> tuple[str, list[str]]:
    """``NAME=ARGS`` -> (NAME, shlex-split ARGS)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest.strip():
        raise argparse.ArgumentTypeError(f"--job: expected NAME='minirl arguments', got {text!r}")
    return name, shlex.split(rest)


def print_table(results: list[JobResult]) -> None:
    print(f"\n{'job':<8} {'exit':>4} {'wall':>9} {'peak RSS':>12} {'tree peak':>12} {'procs':>5}")
    for r in results:
        print(f"{r.name:<8} {r.exit_code:>4} {r.wall_s:>8.0f}s {r.peak_rss_mib:>8.1f} MiB {r.tree_peak_rss_mib:>8.1f} MiB "
              f"{r.processes:>5}")
    for r in results:
        print(f"  {r.name}: {r.command}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="*", choices=sorted(DEFAULT_JOBS), default=list(DEFAULT_JOBS),
                        help="built-in jobs to run (default: demo 20m)")
    parser.add_argument("--job", action="append", type=parse_job, default=[], metavar="NAME=ARGS",
                        help="an extra job: the arguments after 'minirl' (repeatable)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between /proc polls")
    parser.add_argument("--output-dir", type=Path, default=None, help="run directories (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    args.job_list = [(name, DEFAULT_JOBS[name]) for name in args.jobs] + args.job
    if not args.job_list:
        parser.error("no job to run")
    return args


def main() -> None:
    args = parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        output_dir = (args.output_dir or Path(tmp)).resolve()
        output_dir.mkdir(parents=True, exist_ok=True)
        for name, job_args in args.job_list:
            command = job_command(job_args, output_dir, name)
            log_path = output_dir / f"{name}.log"
            print(f"[{name}] {shlex.join(command)}", flush=True)
            result = run_job(name, command, args.interval, log_path)
            print(f"[{name}] exit {result.exit_code}, {result.wall_s:.0f}s, peak RSS {result.peak_rss_mib:.1f} MiB",
                  flush=True)
            if result.exit_code != 0:
                sys.stderr.write(log_path.read_text()[-4000:])
            results.append(result)
    print_table(results)
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in results], indent=1))
        print(f"wrote {args.out}")
    sys.exit(1 if any(r.exit_code != 0 for r in results) else 0)


if __name__ == "__main__":
    main()
