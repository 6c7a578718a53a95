"""Leak soak: many global steps of the tiny model in one process, resident memory (RSS) printed at
the start, the middle and the end (and every ``--every`` steps). Evaluation and resumable
checkpoints run as in ``minirl train`` (every 25 / 50 steps, into a temporary run directory), so a
leak in rollout, scoring, updates, weight sync, metrics or checkpoint writing shows as RSS that
keeps growing after the first steps (allocator warm-up).

    python benchmarks/rss_soak.py [--steps 300] [--every 50] [key=value ...]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path

TINY = [
    "model.preset=qwen3-moe-tiny", "task.kind=reverse", "task.difficulty=3", "task.num_train_prompts=64",
    "task.num_eval_prompts=8", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=12",
    "optim.micro_batch_sequences=4", "eval.num_prompts=4", "eval.samples_per_prompt=2", "eval.every_steps=25",
    "cold_start.enabled=false", "run.threads=1", "log.console=false", "checkpoint.every_steps=50",
    "moe.routing_replay=R3", "optim.minibatches_per_step=2",
]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    import resource  # not Linux: the peak instead

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from minirl import checkpoint
    from minirl.cli import _quiet_libraries
    from minirl.config import load_config
    from minirl.loop import capture_state, evaluate, global_step, setup
    from minirl.metrics import MetricsLogger

    _quiet_libraries()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, [*TINY, f"optim.global_steps={args.steps}", f"run.output_dir={tmp}", "run.name=soak", *args.overrides])
        run = setup(cfg)
        logger = MetricsLogger(cfg.run_dir, total_steps=cfg.optim.global_steps, console=False)
        samples = {"start": rss_mib()}
        print(f"step {0:5d}  rss {samples['start']:8.1f} MiB  (start)", flush=True)
        eval_metrics = {}
        try:
            for step in range(1, args.steps + 1):
                metrics = global_step(run, step)
                if cfg.eval.every_steps and step % cfg.eval.every_steps == 0:
                    eval_metrics = evaluate(run.engine, run.rewards, run.task, cfg, step=step)
                    metrics.update(eval_metrics)
                logger.log(step, metrics)
                if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                    state = capture_state(run, step, logger, eval_metrics, eval_metrics)
                    checkpoint.save(cfg.run_dir, step, model=run.trainer.model, tokenizer=run.tokenizer, state=state,
                                    cfg=cfg, keep_last=cfg.checkpoint.keep_last)
                if step % args.every == 0 or step in (args.steps // 2, args.steps):
                    gc.collect()
                    label = "middle" if step == args.steps // 2 else "end" if step == args.steps else ""
                    value = rss_mib()
                    if label:
                        samples[label] = value
                    print(f"step {step:5d}  rss {value:8.1f} MiB  {f'({label})' if label else ''}", flush=True)
        finally:
            logger.close()
            run.rewards.close()
    if "middle" in samples and "end" in samples:
        print(f"start {samples['start']:.1f} MiB, middle {samples['middle']:.1f} MiB, end {samples['end']:.1f} MiB; "
              f"growth middle -> end {samples['end'] - samples['middle']:+.1f} MiB")


if __name__ == "__main__":
    main()
