"""Where one training forward + backward of the demo model spends its CPU time (``torch.profiler``).

Builds the demo config's model (``qwen3-moe-2m``, no cold start), times a forward + backward of the
summed token log-probs on a batch of ``--rows`` x ``--width`` random token ids (the update's work
for one 64-row micro-batch), a no-grad forward (the old-log-prob pass), and prints the profiler's
top operators by self CPU time.

    python benchmarks/profile_update.py [--rows 64] [--width 44] [--threads 1] [--top 25]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minirl.algo import token_logprobs
from minirl.config import load_config
from minirl.runtime import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=44)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--config", default="configs/demo.yaml")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, ["cold_start.enabled=false"])
    built = build_model(cfg)
    model = built[0] if isinstance(built, tuple) else built
    ids = torch.randint(3, 60, (args.rows, args.width), generator=torch.Generator().manual_seed(0))

    def train_pass() -> None:
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        token_logprobs(logits, ids[:, 1:]).sum().backward()

    def timed(fn) -> float:
        fn()  # warm-up
        started = time.perf_counter()
        for _ in range(args.repeats):
            fn()
        return (time.perf_counter() - started) / args.repeats * 1000

    print(f"{type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{args.rows} x {args.width} tokens, {args.threads} thread(s)")
    print(f"forward + backward {timed(train_pass):8.1f} ms")
    with torch.no_grad():
        print(f"forward (no grad)  {timed(lambda: model(input_ids=ids, use_cache=False)):8.1f} ms")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            train_pass()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
