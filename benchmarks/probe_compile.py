"""Would ``torch.compile`` speed up the trainer's forward + backward? Eager vs compiled, interleaved.

Builds the demo config's model (``qwen3-moe-2m``, no cold start), compiles it with
``torch.compile(model, dynamic=True)``, and times one forward + backward of the summed token
log-probs on 64-row batches of three widths (the update's work for one micro-batch; widths vary
as response lengths do), eager and compiled alternating. Prints the compile time (the first three
compiled steps) and the median of each.

    python benchmarks/probe_compile.py [--rounds 6] [--threads 1] [--widths 40 44 37 --timed-widths 44 38 41]

The trace arms' responses (~210-240 tokens): ``--widths 230 241 212 --timed-widths 226 209 218``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minirl.algo import token_logprobs
from minirl.config import load_config
from minirl.runtime import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--widths", type=int, nargs="+", default=[40, 44, 37], help="compile-time widths")
    parser.add_argument("--timed-widths", type=int, nargs="+", default=[44, 38, 41])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, ["cold_start.enabled=false"])
    built = build_model(cfg)
    model = built[0] if isinstance(built, tuple) else built
    generator = torch.Generator().manual_seed(0)

    def batch(width: int) -> torch.Tensor:
        return torch.randint(3, 60, (64, width), generator=generator)

    def step(module, ids: torch.Tensor) -> None:
        logits = module(input_ids=ids, use_cache=False).logits[:, :-1].float()
        token_logprobs(logits, ids[:, 1:]).sum().backward()

    compiled = torch.compile(model, dynamic=True)
    started = time.perf_counter()
    for width in args.widths:
        step(compiled, batch(width))
    print(f"compile + first 3 compiled steps: {time.perf_counter() - started:.1f} s")
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        for width in args.timed_widths:
            ids = batch(width)
            for name, module in (("eager", model), ("compiled", compiled)):
                started = time.perf_counter()
                step(module, ids)
                times[name].append(time.perf_counter() - started)
    eager, fast = (statistics.median(times[k]) * 1000 for k in ("eager", "compiled"))
    ids = batch(args.timed_widths[0])
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        gap = (model(input_ids=ids, use_cache=False).logits - compiled(input_ids=ids, use_cache=False).logits).abs().max()
    widths = f"{min(args.timed_widths)}-{max(args.timed_widths)}"
    print(f"max |eager - compiled| logit: {gap.item():.2e}")
    print(f"forward + backward, 64 rows x {widths} tokens, median: eager {eager:.1f} ms, compiled {fast:.1f} ms "
          f"({eager / fast:.2f}x)")


if __name__ == "__main__":
    main()
