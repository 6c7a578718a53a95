"""Where one RL global step of ``compare_trl.py``'s minirl side spends its CPU time: GEMMs, attention, the rest.

Builds the model and the config ``benchmarks/compare_trl.py`` gives minirl (a preset after a short SFT cold start,
8 prompts x 8 samples x 32 new tokens, N = 1, forced lengths unless ``--natural``; extra ``key=value`` overrides as
there), runs ``--warmup`` global steps, times ``--steps`` more, then profiles one (``torch.profiler``). Each operator
is charged to the phase it ran in (``rollout``: the engine's sampling; ``update``: ``Trainer.update``; ``other``:
rewards, batching, the weight sync) and to a kind:

    gemm       matrix products (``aten::mm`` / ``addmm`` / ``bmm``; the experts' grouped GEMM runs one ``mm`` per
               expert on a CPU, so they count here)
    attention  SDPA's kernels, forward and backward
    other ops  every other aten operator (norms, RoPE, SwiGLU, gathers, the loss, AdamW, sampling)
    host       the phase's profiled wall time less its operators' self time: Python, dispatch, autograd bookkeeping

Shares are of the time charged: the rollout's and the update's profiled wall time, plus the operators that ran
outside both (their Python is not counted; it is rewards and batching, a few milliseconds). The profiler adds a few
microseconds per operator; the seconds column scales the shares to the unprofiled median step. What issue 20's item 5 asks (the step at 2x TRL's) can be read against it:
a step bound by its GEMMs would take the ``gemm`` row.

    python benchmarks/profile_step.py [--preset qwen3-moe-2m] [--natural] [--warmup 2] [--steps 5] [key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
import compare_trl

GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
ATTENTION = "scaled_dot_product"  # SDPA's CPU kernels: flash / math, forward and backward
PHASES = ("rollout", "update", "other")
KINDS = ("gemm", "attention", "other ops", "host")
# the settings of the published comparison with TRL (BENCHMARKS.md "Shared prompts")
DEFAULTS = ["rollout.precision=fp32", "moe.routing_metrics=false", "optim.adamw_impl=fused", "optim.shared_prompt=true"]


def kind_of(name: str) -> str:
    if name in GEMMS:
        return "gemm"
    return "attention" if ATTENTION in name else "other ops"


def charge(events) -> dict[str, dict[str, float]]:
    """Seconds per phase and kind from the profiler's events (phases are the ``phase:*`` ranges)."""
    table: dict[str, dict[str, float]] = {phase: defaultdict(float) for phase in PHASES}
    for event in events:
        if event.name.startswith("phase:"):
            phase = event.name.split(":", 1)[1]
            table[phase]["wall"] += event.cpu_time_total / 1e6
            continue
        if not event.name.startswith("aten::"):
            continue
        parent, phase = event.cpu_parent, "other"
        while parent is not None:
            if parent.name.startswith("phase:"):
                phase = parent.name.split(":", 1)[1]
                break
            parent = parent.cpu_parent
        table[phase][kind_of(event.name)] += event.self_cpu_time_total / 1e6
    return table


@contextmanager
def phases(run):
    """Wrap the engine's sampling and the trainer's update in ``phase:*`` profiler ranges."""
    engine, trainer = run.engine, run.trainer
    generate, update = engine.generate_ids, trainer.update
    own = [(obj, name, vars(obj)[name]) for obj, name in ((engine, "generate_ids"), (trainer, "update")) if name in vars(obj)]

    def generate_in_phase(*args, **kwargs):
        with record_function("phase:rollout"):
            return generate(*args, **kwargs)

    def update_in_phase(*args, **kwargs):
        with record_function("phase:update"):
            return update(*args, **kwargs)

    engine.generate_ids, trainer.update = generate_in_phase, update_in_phase
    try:
        yield
    finally:
        del engine.generate_ids, trainer.update  # the wrappers; the methods show again
        for obj, name, value in own:  # an attribute the instance had of its own comes back too
            setattr(obj, name, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-moe-2m")
    parser.add_argument("--natural", action="store_true", help="completions stop at EOS (default: forced to 32 tokens)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the minirl config (after the defaults)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from minirl.loop import global_step, setup

    compare = compare_trl.parse_args(["--sizes", args.preset, "--threads", str(args.threads)])
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir = compare_trl.prepare_model(args.preset, args.sft_steps, args.threads, tmp)
        compare.warmup, compare.steps = args.warmup, args.steps + 1
        cfg = compare_trl.minirl_config(model_dir, compare, tmp, [*DEFAULTS, *args.overrides])
        run = setup(cfg)
        if not args.natural:  # as compare_trl: an EOS id outside the vocabulary, every row runs to the limit
            run.engine.eos_ids = torch.tensor([10**9])
        try:
            times = []
            for step in range(1, args.warmup + args.steps + 1):
                metrics = global_step(run, step)
                if step > args.warmup:
                    times.append(metrics["time/step_s"])
            with phases(run), profile(activities=[ProfilerActivity.CPU]) as prof:
                global_step(run, args.warmup + args.steps + 1)
        finally:
            run.close()
    table = charge(prof.events())
    for phase in PHASES:
        ops = sum(table[phase][kind] for kind in KINDS[:3])
        table[phase]["host"] = max(table[phase]["wall"] - ops, 0.0) if phase != "other" else 0.0
    total = sum(table[phase][kind] for phase in PHASES for kind in KINDS)
    step_s = statistics.median(times)
    lengths = "natural lengths" if args.natural else "forced to 32 tokens"
    print(f"{args.preset}, one global step (8 prompts x 8 samples, {lengths}), {args.threads} thread(s), "
          f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); "
          f"unprofiled median step {step_s:.3f} s over {args.steps} steps")
    print(f"{'kind':<10} " + " ".join(f"{phase:>16}" for phase in PHASES) + f" {'step':>16}")
    for kind in KINDS:
        cells = [table[phase][kind] for phase in PHASES]
        print(f"{kind:<10} " + " ".join(f"{c / total:>7.1%} {c / total * step_s:>6.3f} s" for c in cells)
              + f" {sum(cells) / total:>7.1%} {sum(cells) / total * step_s:>6.3f} s")
    column = [sum(table[phase][kind] for kind in KINDS) for phase in PHASES]
    print(f"{'total':<10} " + " ".join(f"{c / total:>7.1%} {c / total * step_s:>6.3f} s" for c in column)
          + f" {1:>7.1%} {step_s:>6.3f} s")


if __name__ == "__main__":
    main()
