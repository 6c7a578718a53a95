"""A tool round's continuation in minirl's engine, with the response so far kept (``NativeEngine.keeping_prefixes``,
what ``task.tools`` runs use) beside prefilling the whole conversation again (what it did before, and what an engine
without kept caches does), side by side in one run.

A preset model (no cold start), ``--prompts`` x ``--samples`` rows: prompts of ``--prompt-tokens`` random tokens, a
first turn of ``--turn-tokens`` sampled tokens, then a tool result of ``--result-tokens`` tokens appended to each and a
second turn sampled. Per arm, alternating rounds, the median seconds of the second (continuation) call; the script
checks that both arms sample the same tokens and prints the largest log-prob gap between them.

    python benchmarks/bench_tool_rounds.py [--preset qwen3-moe-20m] [--prompts 8] [--samples 8]
        [--prompt-tokens 40 200] [--turn-tokens 24] [--result-tokens 16] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from minirl.models.presets import build_model
from minirl.rollout.native import NativeEngine
from minirl.types import SamplingParams


def continuation(model: torch.nn.Module, prompts: list[list[int]], samples: int, turn: int, result: list[int],
                 keep: bool) -> tuple[float, list]:
    """Seconds of the continuation call, and its completions."""
    engine = NativeEngine(model, eos_token_id=[1], pad_token_id=0)
    with engine.keeping_prefixes() if keep else contextlib.nullcontext():
        first = engine.generate_ids(prompts, samples, SamplingParams(max_new_tokens=turn, seed=1))
        again = [c.prompt_ids + c.completion_ids + result for c in first]
        started = time.perf_counter()
        out = engine.generate_ids(again, 1, SamplingParams(max_new_tokens=turn, seed=2))
        return time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen3-moe-20m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[40, 200])
    parser.add_argument("--turn-tokens", type=int, default=24)
    parser.add_argument("--result-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(args.preset, vocab_size=512, pad_id=0, eos_id=1, seed=0).eval()
    result = list(range(100, 100 + args.result_tokens))
    print(f"{args.preset}, {args.prompts} x {args.samples} rows, first turn {args.turn_tokens} tokens, a result of "
          f"{args.result_tokens}, {args.threads} thread(s), median of {args.rounds} alternating rounds")
    for length in args.prompt_tokens:
        prompts = [[2 + (i * 7 + j) % 500 for j in range(length)] for i in range(args.prompts)]
        seconds: dict[bool, list[float]] = {False: [], True: []}
        outs = {}
        for _ in range(args.rounds):
            for keep in (False, True):
                took, outs[keep] = continuation(model, prompts, args.samples, args.turn_tokens, result, keep)
                seconds[keep].append(took)
        same = all(a.completion_ids == b.completion_ids for a, b in zip(outs[False], outs[True], strict=True))
        gap = max((a.logp_rollout - b.logp_rollout).abs().max().item() for a, b in zip(outs[False], outs[True]))
        whole, kept = statistics.median(seconds[False]), statistics.median(seconds[True])
        print(f"  prompts of {length:4d} tokens: whole prefill {whole:.3f} s, kept {kept:.3f} s ({whole / kept:.2f}x); "
              f"same tokens: {same}, largest log-prob gap {gap:.1e}")


if __name__ == "__main__":
    main()
