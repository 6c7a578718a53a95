"""Which CPU attention is fastest for the trainer's forward + backward at long responses?

Times causal attention forward + backward of ``--rows`` x heads x ``--width`` (the 2 M preset's layer:
4 query heads, 2 key/value heads, head_dim 32), alternating three implementations: SDPA (the CPU flash
kernel transformers uses), SDPA forced to its math backend, and written out (matmul, causal mask,
softmax, matmul). Prints the medians and the largest output gap.

    python benchmarks/probe_attention.py [--rows 64] [--width 220] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=220)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows, width, groups = args.rows, args.width, HEADS // KV_HEADS
    generator = torch.Generator().manual_seed(0)
    causal = torch.full((width, width), float("-inf")).triu(1)

    def inputs() -> tuple[torch.Tensor, ...]:
        shapes = ((rows, HEADS, width, HEAD_DIM), (rows, KV_HEADS, width, HEAD_DIM), (rows, KV_HEADS, width, HEAD_DIM))
        return tuple(torch.randn(*shape, generator=generator, requires_grad=True) for shape in shapes)

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=HEAD_DIM**-0.5)

    def sdpa_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(SDPBackend.MATH):
            return sdpa(q, k, v)

    def written_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        return torch.softmax(q @ k.transpose(-1, -2) * HEAD_DIM**-0.5 + causal, dim=-1) @ v

    variants = {"sdpa (flash)": sdpa, "sdpa (math backend)": sdpa_math, "matmul + softmax": written_out}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, attend in variants.items():
            q, k, v = inputs()
            started = time.perf_counter()
            attend(q, k, v).sum().backward()
            times[name].append(time.perf_counter() - started)
    q, k, v = inputs()
    with torch.no_grad():
        gap = max((attend(q, k, v) - sdpa(q, k, v)).abs().max().item() for attend in variants.values())
    flop = 4 * rows * HEADS * width * width * HEAD_DIM * 3 / 2  # QK^T and PV, x3 for the backward, causal half
    print(f"causal attention forward + backward, {rows} rows x {HEADS} heads x {width} tokens x {HEAD_DIM}, "
          f"{args.threads} thread(s), median of {args.rounds}; ~{flop / 1e9:.2f} GFLOP of products; max output gap {gap:.1e}")
    for name in variants:
        print(f"  {name:20s} {statistics.median(times[name]) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
