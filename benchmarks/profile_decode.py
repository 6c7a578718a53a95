"""How long one decode step of the demo model takes, and how much of it is matrix multiplies.

Builds the demo config's model (``qwen3-moe-2m``, no cold start), prefills ``--prompt`` random tokens
for each batch size in ``--batches``, then times single-token forwards with the KV cache and profiles
a few of them: the aten operator count per step, their self CPU time and the part of it in matmuls.
A step whose matmuls are a small share of its time is bound by per-operator dispatch, not by
arithmetic. Two paths, on the same cache contents: ``transformers`` (the model's own forward, what
HF ``generate`` runs) and ``fast`` (``minirl.rollout.fast_decode``, what ``NativeEngine`` runs for
the families of ``fast_decode.FAMILIES``; bitwise the same logits). ``--preset`` another model preset
(``olmoe-tiny``, ``mixtral-tiny``, ``qwen2-moe-tiny``, ``gpt-oss-tiny``: each family's).

    python benchmarks/profile_decode.py [--batches 1,64] [--prompt 16] [--steps 30] [--threads 1] [--preset NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from bench_rollout import int_list
from minirl.config import load_config
from minirl.rollout.fast_decode import FastDecoder, StaticKVCache
from minirl.runtime import build_model

MATMULS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::_grouped_mm", "aten::baddbmm"}


def decode_step_profile(model: torch.nn.Module, batch: int, prompt: int, steps: int, path: str = "transformers") -> dict:
    """Mean wall time of ``steps`` decode steps after a prefill, and a profile of 10 more, on ``path``."""
    ids = torch.randint(3, 60, (batch, prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        token = ids[:, -1:]
        if path == "fast":
            decoder = FastDecoder(model)
            static = StaticKVCache.from_transformers(cache, prompt + 1)
            positions = torch.full((batch,), prompt)

            def step() -> None:  # rewrites the same column: every step attends to prompt + 1 keys
                decoder.step(token[:, 0], positions, prompt, None, static)
        else:
            def step() -> None:  # the cache grows by one column a step, as in generate
                model(input_ids=token, past_key_values=cache, use_cache=True)
        for _ in range(5):  # warm-up
            step()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        step_s = (time.perf_counter() - started) / steps
        profiled = 10
        with profile() as prof:
            for _ in range(profiled):
                step()
    events = prof.key_averages()
    return {
        "path": path,
        "batch": batch,
        "step_ms": step_s * 1e3,
        "ops_per_step": sum(e.count for e in events) / profiled,
        "aten_ms": sum(e.self_cpu_time_total for e in events) / profiled / 1e3,
        "matmul_ms": sum(e.self_cpu_time_total for e in events if e.key in MATMULS) / profiled / 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int_list, default=[1, 64])
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--preset", default=None, help="model.preset in place of the config's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    preset = [f"model.preset={args.preset}"] if args.preset else []
    model, _ = build_model(load_config(args.config, ["cold_start.enabled=false", *preset]))
    model.eval()
    print(f"{model.config.model_type}: one decode step (1 new token per row, KV cache of {args.prompt}+ tokens), "
          f"{args.threads} thread(s)")
    print(f"{'path':<13} {'batch':>6} {'step ms':>8} {'aten ops':>9} {'op self ms':>11} {'matmul ms':>10} "
          f"{'matmul share':>13}")
    for batch in args.batches:
        for path in ("transformers", "fast"):
            r = decode_step_profile(model, batch, args.prompt, args.steps, path)
            print(f"{path:<13} {batch:>6} {r['step_ms']:>8.2f} {r['ops_per_step']:>9.0f} {r['aten_ms']:>11.2f} "
                  f"{r['matmul_ms']:>10.2f} {r['matmul_ms'] / r['aten_ms']:>12.0%}")


if __name__ == "__main__":
    main()
