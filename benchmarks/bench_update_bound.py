"""How far the trainer's update is from its matrix-multiply bound, and what the transformers module stack costs in it.

Builds a preset model (no cold start), and for one micro-batch of ``--rows`` x ``--width`` random token ids
(the update's work: forward + backward of the summed token log-probs):

1. times forward + backward with the transformers forward and with the lean forward
   (``benchmarks/lean_forward.py``, the same ops without the module stack), alternating, and reports the medians (and checks both give bitwise the same
   log-probs and gradients);
2. lists every matrix multiply of that forward + backward (``torch.profiler`` with shapes: ``aten::mm``,
   ``addmm``, ``bmm``; the experts' grouped GEMM runs one ``mm`` per expert on a CPU, so they count), times
   each distinct shape alone (median of ``--gemm-repeats`` calls, inputs in cache as in the step), and sums:
   the *matmul bound*, the time the step would take if it did nothing but those GEMMs at the rate they run
   alone. Attention's two products (inside SDPA's kernel) are added as two batched matmuls per layer
   and pass, forward and backward (full S x S: the causal half is not subtracted, which flatters the bound);
3. the profiler's top operators by self CPU time (``--top``).

``--precision bf16`` runs both forwards as the trainer does under ``optim.precision=bf16`` (autocast to bf16,
the fused experts cast by ``minirl.precision.autocast_experts``) and times the GEMMs of the bound in bf16.

    python benchmarks/bench_update_bound.py [--preset qwen3-moe-2m] [--rows 64] [--width 44] [--threads 1]
        [--precision fp32|bf16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from minirl.algo import token_logprobs
from minirl.config import load_config
from minirl.precision import PRECISIONS, autocast_dtype, autocast_experts, compute_context
from minirl.runtime import build_model

sys.path.insert(0, str(Path(__file__).parent))
from lean_forward import LeanForward  # benchmarks/lean_forward.py, a probe

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm")


def gemm_flops(name: str, shapes: list) -> int:
    if name == "aten::addmm":
        shapes = shapes[1:]
    (a, b) = shapes[:2]
    if name == "aten::bmm":
        return 2 * a[0] * a[1] * a[2] * b[2]
    return 2 * a[0] * a[1] * b[1]


def time_gemm(name: str, shapes: list, repeats: int, dtype: torch.dtype = torch.float32) -> float:
    """Seconds for one GEMM of these shapes, run alone (median)."""
    if name == "aten::addmm":
        shapes = shapes[1:]
    a, b = torch.randn(*shapes[0], dtype=dtype), torch.randn(*shapes[1], dtype=dtype)
    fn = torch.bmm if name == "aten::bmm" else torch.mm
    out = fn(a, b)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn(a, b, out=out)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    # Over 60 lines: one report, three measurements in the order they are printed.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-moe-2m")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=44)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gemm-repeats", type=int, default=30)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    args = parser.parse_args()
    dtype = autocast_dtype(args.precision) or torch.float32
    torch.set_num_threads(args.threads)
    cfg = load_config("configs/demo.yaml", ["cold_start.enabled=false", f"model.preset={args.preset}"])
    built = build_model(cfg)
    model = built[0] if isinstance(built, tuple) else built
    model.train()
    autocast_experts(model)
    lean = LeanForward(model)
    ids = torch.randint(3, 60, (args.rows, args.width), generator=torch.Generator().manual_seed(0))
    forwards: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "transformers": lambda x: model(input_ids=x, use_cache=False).logits, "lean": lean}

    def train_pass(forward: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        with compute_context(args.precision, "cpu"):
            logits = forward(ids)
        logp = token_logprobs(logits[:, :-1].float(), ids[:, 1:])
        logp.sum().backward()
        return logp.detach()

    same = torch.equal(train_pass(forwards["transformers"]), train_pass(forwards["lean"]))
    times: dict[str, list[float]] = {name: [] for name in forwards}
    for _ in range(args.rounds):
        for name, forward in forwards.items():
            started = time.perf_counter()
            train_pass(forward)
            times[name].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in times.items()}

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        train_pass(forwards["lean"])
    shapes: Counter[tuple[str, str]] = Counter()
    for event in prof.events():
        if event.name in GEMMS and all(dim > 0 for shape in event.input_shapes[:3] for dim in shape):
            shapes[(event.name, repr(event.input_shapes[:3]))] += 1
    flops = bound = 0.0
    for (name, text), count in shapes.items():
        dims = eval(text)  # the profiler's list of shapes, as printed
        flops += count * gemm_flops(name, dims)
        bound += count * time_gemm(name, dims, args.gemm_repeats, dtype)
    config = model.config
    heads, dim, layers = config.num_attention_heads, config.head_dim, config.num_hidden_layers
    attention = [[args.rows * heads, args.width, dim], [args.rows * heads, dim, args.width]]
    per_product = gemm_flops("aten::bmm", attention)
    attention_time = time_gemm("aten::bmm", attention, args.gemm_repeats, dtype)
    flops += 6 * layers * per_product  # QK^T and PV, forward + 2 in backward each
    bound += 6 * layers * attention_time

    params = sum(p.numel() for p in model.parameters())
    print(f"{args.preset} ({params:,} parameters), forward + backward of {args.rows} x {args.width} tokens, {args.precision}, "
          f"{args.threads} thread(s), median of {args.rounds} alternating rounds")
    for name, value in median.items():
        print(f"  {name:<13} {value * 1000:8.1f} ms  ({median['transformers'] / value:.2f}x)"
              f"  {value / bound:.2f}x its matmul bound")
    print(f"  bitwise the same log-probs: {same}")
    print(f"  matmul bound  {bound * 1000:8.1f} ms: {flops / 1e9:.2f} GFLOP in {sum(shapes.values())} GEMMs of "
          f"{len(shapes)} shapes (+ attention), {flops / bound / 1e9:.1f} GFLOP/s when each runs alone")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
