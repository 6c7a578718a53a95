"""Where a global step's time goes, and the engine's throughput beside HF ``generate``, in one run.

1. Runs ``minirl.loop.train`` for a few global steps of a config (default: the demo config,
   without its cold start) and prints the median time of each phase (rollout, old log-probs,
   update, weight sync) from the run's own ``metrics.jsonl``.
2. On the same model and batch (prompts_per_step x samples_per_prompt rows, max_new_tokens new
   tokens, every row forced to the full length), times the built-in engine and HF
   ``model.generate(do_sample=True)``, alternating, median of ``--repeats``.

    python benchmarks/bench_step.py [--config configs/demo.yaml] [--steps 8] [--repeats 3] [key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from minirl.config import load_config
from minirl.loop import train
from minirl.metrics import read_metrics
from minirl.runtime import build_engine, build_model
from minirl.types import SamplingParams

PHASES = ("rollout", "old_logprobs", "update", "sync", "step")


def step_config(path: str, steps: int, output_dir: str, overrides: list[str]):
    """The benchmarked run: ``path`` without its cold start and held-out evaluations, ``steps`` global steps."""
    return load_config(path, [
        "cold_start.enabled=false", f"optim.global_steps={steps}", "eval.every_steps=0", "eval.num_prompts=1",
        "eval.samples_per_prompt=1", "log.console=false", f"run.output_dir={output_dir}", "run.name=bench", *overrides,
    ])


def phase_table(cfg, steps: int) -> None:
    rows = [r for r in read_metrics(cfg.run_dir) if r["step"] >= 2]  # step 1 includes warm-up
    print(f"\nglobal step of {cfg.global_batch_sequences} sequences (P={cfg.rollout.prompts_per_step} x "
          f"G={cfg.rollout.samples_per_prompt}), N={cfg.optim.minibatches_per_step}, engine {cfg.rollout.precision}, "
          f"median over steps 2..{steps}")
    step_time = statistics.median(r["time/step_s"] for r in rows)
    for phase in PHASES:
        value = statistics.median(r[f"time/{phase}_s"] for r in rows)
        print(f"  {phase:<13} {value * 1000:8.1f} ms  {100 * value / step_time:5.1f} %")
    print(f"  rollout tokens/s {statistics.median(r['perf/rollout_tokens_per_s'] for r in rows):8.0f}   "
          f"train tokens/s {statistics.median(r['perf/train_tokens_per_s'] for r in rows):8.0f}")


def engine_vs_generate(cfg, repeats: int) -> None:
    model, tokenizer = build_model(cfg)
    model.eval()
    engine = build_engine(cfg, model, tokenizer)
    rows, new_tokens = cfg.global_batch_sequences, cfg.rollout.max_new_tokens
    prompt_ids = [[5 + (i * 7 + j) % 60 for j in range(8)] for i in range(rows)]
    # an EOS id outside the vocabulary: every row runs to max_new_tokens, as with min_new_tokens
    engine.eos_ids = torch.tensor([10**9])
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, seed=0)
    input_ids = torch.tensor(prompt_ids)
    timings: dict[str, list[float]] = {"native engine": [], "HF generate": []}
    for _ in range(repeats):
        t = time.perf_counter()
        engine.generate_ids(prompt_ids, 1, sampling)
        timings["native engine"].append(time.perf_counter() - t)
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids, do_sample=True, top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           pad_token_id=tokenizer.pad_token_id)
        timings["HF generate"].append(time.perf_counter() - t)
    tokens = rows * new_tokens
    print(f"\nrollout of {rows} x {new_tokens} new tokens ({cfg.rollout.precision} engine vs fp32 HF generate), median of {repeats}")
    base = statistics.median(timings["HF generate"])
    for name, values in timings.items():
        median = statistics.median(values)
        print(f"  {name:<14} {tokens / median:8.0f} tokens/s   ({base / median:4.2f}x HF generate)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from minirl.cli import _quiet_libraries

    _quiet_libraries()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = step_config(args.config, args.steps, tmp, args.overrides)
        start = time.perf_counter()
        train(cfg)
        print(f"{args.steps} global steps in {time.perf_counter() - start:.1f}s")
        phase_table(cfg, args.steps)
    engine_vs_generate(cfg, args.repeats)


if __name__ == "__main__":
    main()
