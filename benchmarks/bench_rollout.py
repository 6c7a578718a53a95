"""Rollout throughput: minirl ``NativeEngine`` vs Hugging Face ``model.generate`` on the same model.

Model: a ~1.8 M-parameter Qwen3-MoE-like model built from a config (hidden 128, 4 layers,
8 experts top-2, vocab 100, init std 0.1), in fp32 and bf16. Two workloads:

``fixed``   32 prompts of 16 tokens x 64 new tokens, every row forced to the full length (HF
            ``min_new_tokens=64``; the engine gets an EOS id outside the vocabulary): raw decode
            speed, the same work for both.
``rl``      8 prompts of 8..22 tokens x 8 samples each, sampled until EOS (an lm_head bias
            makes EOS ~5 % a step, so lengths are roughly geometric, mean ~20) or 64 tokens: the
            shape of one MiniRL rollout. HF gets the 64 rows left-padded and stops when every row
            is done; the engine prefills each prompt once and drops finished rows. Throughput
            counts only the tokens kept (up to and including EOS), the same for both.

``--sweep`` instead measures the ``fixed`` workload (random 16-token prompts, every row forced to
the full length, one sample per prompt) against batch size (``--batches``, default 1..256, at
``--length`` new tokens) and against response length (``--lengths``, default 16..256, at
``--batch`` rows), in fp32 and bf16, and prints engine and HF tokens/s with their ratio per point;
``--out FILE.json`` writes the rows, ``--plot FILE.png`` draws tokens/s vs batch and vs length.

Runs alternate between the two samplers and each figure is the median of ``--repeats`` runs
(the best run is shown too: on a shared machine the median moves with the neighbours' load).
``--clock cpu`` times with this process's CPU time instead of the wall clock: with one thread
that is the figure a quiet machine would give, even while other jobs share the cores (with two
threads on a busy machine, every small op waits for a descheduled OpenMP worker, and wall-clock
figures become meaningless).

``--half-gemm native`` makes the engine use torch's bf16 matmul kernels (bitwise the transformers
forward) where ``auto`` would take fp32 GEMMs on the bf16 values (``minirl.rollout.fast_decode``).

    python benchmarks/bench_rollout.py [--threads 2] [--repeats 5] [--clock wall|cpu] [--half-gemm auto|native|fp32]
    python benchmarks/bench_rollout.py --sweep [--batches 1,4,16,64,256] [--length 64]
        [--lengths 16,64,256] [--batch 32] [--out sweep.json] [--plot sweep.png] [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from minirl.rollout.fast_decode import native_half_gemm
from minirl.rollout.native import NativeEngine
from minirl.types import SamplingParams

VOCAB, PAD, EOS = 100, 0, 1
NEW_TOKENS = 64
PROMPT_TOKENS = 16  # fixed workload and sweep
CONTEXT = 512  # the model's max_position_embeddings
DTYPES = (("fp32", torch.float32), ("bf16", torch.bfloat16))
clock = time.perf_counter  # or time.process_time (--clock cpu)


def build_model(eos_bias: float = 0.0) -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        intermediate_size=256,
        max_position_embeddings=CONTEXT,
        initializer_range=0.1,
    )
    config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM._from_config(config, dtype=torch.float32).eval()
    if eos_bias:
        head = torch.nn.Linear(config.hidden_size, VOCAB, bias=True)
        with torch.no_grad():
            head.weight.copy_(model.lm_head.weight)
            head.bias.zero_()
            head.bias[EOS] = eos_bias
        model.lm_head = head
    return model


def kept_tokens(generated: torch.Tensor) -> int:
    """Tokens up to and including the first EOS of each row (all of them if none)."""
    is_eos = generated == EOS
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, generated.shape[1])
    return int(first.sum())


def hf_run(model: Qwen3MoeForCausalLM, prompts: list[list[int]], group: int, fixed: bool,
           new_tokens: int = NEW_TOKENS) -> tuple[float, int]:
    rows = [p for p in prompts for _ in range(group)]
    width = max(len(p) for p in rows)
    input_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in rows])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    start = clock()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,  # HF's default top_k=50 would sample from another law than the engine's
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens if fixed else 0,
            pad_token_id=PAD,
            eos_token_id=None if fixed else EOS,
        )
    elapsed = clock() - start
    generated = out[:, width:]
    return elapsed, generated.numel() if fixed else kept_tokens(generated)


def engine_run(engine: NativeEngine, prompts: list[list[int]], group: int, seed: int,
               new_tokens: int = NEW_TOKENS) -> tuple[float, int]:
    start = clock()
    completions = engine.generate_ids(prompts, group, SamplingParams(max_new_tokens=new_tokens, seed=seed))
    elapsed = clock() - start
    return elapsed, sum(len(c.completion_ids) for c in completions)


def build_samplers(precision: str, dtype: torch.dtype, eos_bias: float, fixed: bool,
                   half_gemm: str = "auto") -> tuple[Qwen3MoeForCausalLM, NativeEngine]:
    """The HF model in ``dtype`` and an engine of ``precision`` over a second copy of the same weights."""
    hf_model = build_model(eos_bias).to(dtype)
    # fixed: EOS id VOCAB is never drawn, so every engine row runs the full length too
    engine = NativeEngine(build_model(eos_bias), eos_token_id=VOCAB if fixed else EOS,
                          pad_token_id=PAD, precision=precision, half_gemm=half_gemm)  # fmt: skip
    return hf_model, engine


def measure(hf_model: Qwen3MoeForCausalLM, engine: NativeEngine, prompts: list[list[int]], group: int, fixed: bool,
            repeats: int, new_tokens: int = NEW_TOKENS) -> tuple[list[float], list[float]]:
    """Tokens/s of HF ``generate`` and of the engine, one warm-up each, then ``repeats`` alternating runs."""
    hf_run(hf_model, prompts, group, fixed, new_tokens)  # warm-up
    engine_run(engine, prompts, group, seed=0, new_tokens=new_tokens)
    hf_rates, engine_rates = [], []
    for repeat in range(repeats):  # alternate, so load changes hit both alike
        elapsed, tokens = hf_run(hf_model, prompts, group, fixed, new_tokens)
        hf_rates.append(tokens / elapsed)
        elapsed, tokens = engine_run(engine, prompts, group, seed=repeat + 1, new_tokens=new_tokens)
        engine_rates.append(tokens / elapsed)
    return hf_rates, engine_rates


def resolved_half_gemm(half_gemm: str) -> str:
    """What ``half_gemm="auto"`` becomes on this machine (``NativeEngine``)."""
    if half_gemm != "auto":
        return half_gemm
    return "native (torch's bf16 kernels)" if native_half_gemm() else "fp32 GEMMs on the bf16 values (auto)"


def random_prompts(count: int, length: int, generator: torch.Generator) -> list[list[int]]:
    return [torch.randint(2, VOCAB, (length,), generator=generator).tolist() for _ in range(count)]


def run_workloads(args: argparse.Namespace) -> None:
    """The default mode: the ``fixed`` and ``rl`` workloads in fp32 and bf16, one table."""
    generator = torch.Generator().manual_seed(0)
    fixed_prompts = random_prompts(32, PROMPT_TOKENS, generator)
    rl_prompts = [torch.randint(2, VOCAB, (8 + 2 * i,), generator=generator).tolist() for i in range(8)]
    # (prompts, samples per prompt, EOS logit bias)
    workloads = {"fixed": (fixed_prompts, 1, 0.0), "rl": (rl_prompts, 8, 2.3)}
    results = []
    for workload, (prompts, group, eos_bias) in workloads.items():
        fixed = workload == "fixed"
        for precision, dtype in DTYPES:
            hf_model, engine = build_samplers(precision, dtype, eos_bias, fixed, args.half_gemm)
            hf_rates, engine_rates = measure(hf_model, engine, prompts, group, fixed, args.repeats)
            results.append((workload, precision, hf_rates, engine_rates))

    params = sum(p.numel() for p in build_model().parameters()) / 1e6
    print(f"Qwen3-MoE-like {params:.2f} M params, {args.threads} thread(s), {args.repeats} alternating runs each, "
          f"{args.clock} clock")  # fmt: skip
    print("fixed: 32 prompts x 64 new tokens (forced);  rl: 8 prompts x 8 samples, EOS ~5 %/step, cap 64;  "
          f"engine bf16 matmuls: {resolved_half_gemm(args.half_gemm)}")
    print(f"{'workload':<8} {'dtype':<5} {'HF generate tok/s':>18} {'NativeEngine tok/s':>19} "
          f"{'speed-up':>9} {'(best)':>7}")  # fmt: skip
    for workload, precision, hf_rates, engine_rates in results:
        hf, engine = statistics.median(hf_rates), statistics.median(engine_rates)
        best = max(engine_rates) / max(hf_rates)
        print(f"{workload:<8} {precision:<5} {hf:>18.0f} {engine:>19.0f} {engine / hf:>8.2f}x {best:>6.2f}x")


# ----------------------------------------------------------------------------- --sweep


def sweep_points(batches: list[int], length: int, lengths: list[int], batch: int) -> list[tuple[str, int, int]]:
    """(axis, rows, new tokens): batch sizes at a fixed length, then lengths at a fixed batch."""
    return [("batch", b, length) for b in batches] + [("length", batch, n) for n in lengths]


def sweep_row(axis: str, precision: str, rows: int, new_tokens: int,
              hf_rates: list[float], engine_rates: list[float]) -> dict:
    hf, engine = statistics.median(hf_rates), statistics.median(engine_rates)
    return {"axis": axis, "dtype": precision, "batch": rows, "new_tokens": new_tokens,
            "hf_generate_tok_s": hf, "native_engine_tok_s": engine, "ratio": engine / hf,
            "ratio_best": max(engine_rates) / max(hf_rates),
            "hf_generate_tok_s_runs": hf_rates, "native_engine_tok_s_runs": engine_rates}


def run_sweep(args: argparse.Namespace) -> list[dict]:
    """Fixed-length workload (no EOS) at each sweep point, both dtypes; prints a row as it is measured."""
    points = sweep_points(args.batches, args.length, args.lengths, args.batch)
    params = sum(p.numel() for p in build_model().parameters()) / 1e6
    print(f"Qwen3-MoE-like {params:.2f} M params, {args.threads} thread(s), {args.repeats} alternating runs each, "
          f"{args.clock} clock; fixed-length workload: {PROMPT_TOKENS}-token prompts, 1 sample each, every row "
          f"forced to the full length; engine bf16 matmuls: {resolved_half_gemm(args.half_gemm)}")
    print(f"{'axis':<6} {'dtype':<5} {'batch':>5} {'new tok':>7} {'HF generate tok/s':>18} "
          f"{'NativeEngine tok/s':>19} {'engine/HF':>10} {'(best)':>7}", flush=True)
    rows = []
    for precision, dtype in DTYPES:
        hf_model, engine = build_samplers(precision, dtype, eos_bias=0.0, fixed=True, half_gemm=args.half_gemm)
        generator = torch.Generator().manual_seed(0)
        prompts = random_prompts(max(args.batches + [args.batch]), PROMPT_TOKENS, generator)
        for axis, batch, new_tokens in points:
            hf_rates, engine_rates = measure(hf_model, engine, prompts[:batch], 1, True, args.repeats, new_tokens)
            row = sweep_row(axis, precision, batch, new_tokens, hf_rates, engine_rates)
            rows.append(row)
            print(f"{axis:<6} {precision:<5} {batch:>5} {new_tokens:>7} {row['hf_generate_tok_s']:>18.0f} "
                  f"{row['native_engine_tok_s']:>19.0f} {row['ratio']:>9.2f}x {row['ratio_best']:>6.2f}x", flush=True)
    return rows


def plot_sweep(rows: list[dict], path: Path) -> None:
    """Two panels: tokens/s vs batch size and vs response length, engine and HF per dtype (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, axis, xkey, xlabel in ((axes[0], "batch", "batch", "batch size (rows)"),
                                   (axes[1], "length", "new_tokens", "response length (new tokens)")):
        for precision, _ in DTYPES:
            points = [r for r in rows if r["axis"] == axis and r["dtype"] == precision]
            xs = [r[xkey] for r in points]
            for key, label, style in (("native_engine_tok_s", "NativeEngine", "-o"), ("hf_generate_tok_s", "HF generate", "--s")):
                ax.plot(xs, [r[key] for r in points], style, label=f"{label} {precision}")
        fixed = {r["new_tokens"] if axis == "batch" else r["batch"] for r in rows if r["axis"] == axis}
        ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="tokens/s",
               title=f"vs {xlabel.split(' (')[0]} ({'length' if axis == 'batch' else 'batch'} {', '.join(map(str, sorted(fixed)))})")
        ticks = sorted({r[xkey] for r in rows if r["axis"] == axis})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def int_list(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--half-gemm", choices=("auto", "native", "fp32"), default="auto",
                        help="the engine's bf16 matmuls: torch's kernels (native), fp32 GEMMs on the bf16 values "
                             "(fp32), or whichever this CPU runs faster (auto; NativeEngine's default)")
    sweep = parser.add_argument_group("--sweep: fixed-length tokens/s against batch size and response length")
    sweep.add_argument("--sweep", action="store_true", help="run the sweep instead of the two workloads")
    sweep.add_argument("--batches", type=int_list, default=[1, 4, 16, 64, 256], help="batch sizes (default 1,4,16,64,256)")
    sweep.add_argument("--length", type=int, default=NEW_TOKENS, help="new tokens for the batch axis (default 64)")
    sweep.add_argument("--lengths", type=int_list, default=[16, 64, 256], help="new tokens (default 16,64,256)")
    sweep.add_argument("--batch", type=int, default=32, help="rows for the length axis (default 32)")
    sweep.add_argument("--out", type=Path, default=None, help="write the sweep rows to this JSON file")
    sweep.add_argument("--plot", type=Path, default=None, help="draw the sweep to this PNG (matplotlib)")
    args = parser.parse_args(argv)
    if not args.sweep and (args.out or args.plot):
        parser.error("--out and --plot belong to --sweep")
    if args.sweep and PROMPT_TOKENS + max(args.lengths + [args.length]) > CONTEXT:
        parser.error(f"--lengths/--length: {PROMPT_TOKENS} prompt tokens + new tokens must fit the context of {CONTEXT}")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    global clock
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    if not args.sweep:
        run_workloads(args)
        return
    rows = run_sweep(args)
    if args.out:
        args.out.write_text(json.dumps({"threads": args.threads, "repeats": args.repeats, "clock": args.clock,
                                        "half_gemm": resolved_half_gemm(args.half_gemm), "rows": rows}, indent=1))
        print(f"wrote {args.out}")
    if args.plot:
        plot_sweep(rows, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
