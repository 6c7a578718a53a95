"""How much do the experts' SwiGLU elementwise ops lose to strided inputs on a CPU?

transformers' grouped-GEMM experts split one ``gate_up`` product with ``chunk(2, dim=-1)``, so SiLU, its
backward and the gate x up product run on strided views (row stride 2 x width). This times each op on
those views and on contiguous copies of the same values, at the shape of one Study 1 micro-batch of the
2 M preset (64 rows x 220 tokens x top-2 = 28,160 expert rows of width 128), one thread, median of
``--repeats`` calls.

    python benchmarks/probe_strided_swiglu.py [--rows 28160] [--width 128] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def median_ms(op: Callable[[], object], repeats: int) -> float:
    op()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        op()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=28160)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    gate_up = torch.randn(args.rows, 2 * args.width, generator=generator)
    gate, up = gate_up.chunk(2, dim=-1)  # strided views, as the experts' forward makes them
    gate_c, up_c = gate.contiguous(), up.contiguous()
    grad = torch.randn(args.rows, args.width, generator=generator)
    ops = {
        "silu": (lambda: F.silu(gate), lambda: F.silu(gate_c)),
        "silu backward": (lambda: torch.ops.aten.silu_backward(grad, gate), lambda: torch.ops.aten.silu_backward(grad, gate_c)),
        "gate x up": (lambda: gate * up, lambda: gate_c * up_c),
    }
    print(f"{args.rows} x {args.width} float32, 1 thread, median of {args.repeats}; "
          f"a contiguous copy of one view: {median_ms(gate.contiguous, args.repeats):.1f} ms")
    for name, (strided, contiguous) in ops.items():
        slow, fast = median_ms(strided, args.repeats), median_ms(contiguous, args.repeats)
        same = torch.equal(strided(), contiguous())
        print(f"  {name:14s} strided {slow:6.1f} ms   contiguous {fast:6.1f} ms   ({slow / fast:.1f}x; bitwise equal: {same})")


if __name__ == "__main__":
    main()
