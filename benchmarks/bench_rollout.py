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

Runs alternate between the two samplers and each figure is the median of ``--repeats`` runs
(the best run is shown too: on a shared machine the median moves with the neighbours' load).
``--clock cpu`` times with this process's CPU time instead of the wall clock: with one thread
that is the figure a quiet machine would give, even while other jobs share the cores (with two
threads on a busy machine, every small op waits for a descheduled OpenMP worker, and wall-clock
figures become meaningless).

    python benchmarks/bench_rollout.py [--threads 2] [--repeats 5] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from minirl.rollout.native import NativeEngine
from minirl.types import SamplingParams

VOCAB, PAD, EOS = 100, 0, 1
NEW_TOKENS = 64
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
        max_position_embeddings=512,
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


def hf_run(model: Qwen3MoeForCausalLM, prompts: list[list[int]], group: int, fixed: bool) -> tuple[float, int]:
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
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS if fixed else 0,
            pad_token_id=PAD,
            eos_token_id=None if fixed else EOS,
        )
    elapsed = clock() - start
    generated = out[:, width:]
    return elapsed, generated.numel() if fixed else kept_tokens(generated)


def engine_run(engine: NativeEngine, prompts: list[list[int]], group: int, seed: int) -> tuple[float, int]:
    start = clock()
    completions = engine.generate_ids(prompts, group, SamplingParams(max_new_tokens=NEW_TOKENS, seed=seed))
    elapsed = clock() - start
    return elapsed, sum(len(c.completion_ids) for c in completions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    global clock
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    generator = torch.Generator().manual_seed(0)
    fixed_prompts = [torch.randint(2, VOCAB, (16,), generator=generator).tolist() for _ in range(32)]
    rl_prompts = [torch.randint(2, VOCAB, (8 + 2 * i,), generator=generator).tolist() for i in range(8)]
    # (prompts, samples per prompt, EOS logit bias)
    workloads = {"fixed": (fixed_prompts, 1, 0.0), "rl": (rl_prompts, 8, 2.3)}
    results = []
    for workload, (prompts, group, eos_bias) in workloads.items():
        fixed = workload == "fixed"
        for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            hf_model = build_model(eos_bias).to(dtype)
            # fixed: EOS id VOCAB is never drawn, so every engine row runs the full length too
            engine = NativeEngine(build_model(eos_bias), eos_token_id=VOCAB if fixed else EOS,
                                  pad_token_id=PAD, precision=precision)  # fmt: skip
            hf_run(hf_model, prompts, group, fixed)  # warm-up
            engine_run(engine, prompts, group, seed=0)
            hf_rates, engine_rates = [], []
            for repeat in range(args.repeats):  # alternate, so load changes hit both alike
                elapsed, tokens = hf_run(hf_model, prompts, group, fixed)
                hf_rates.append(tokens / elapsed)
                elapsed, tokens = engine_run(engine, prompts, group, seed=repeat + 1)
                engine_rates.append(tokens / elapsed)
            results.append((workload, precision, hf_rates, engine_rates))

    params = sum(p.numel() for p in build_model().parameters()) / 1e6
    print(f"Qwen3-MoE-like {params:.2f} M params, {args.threads} thread(s), {args.repeats} alternating runs each, "
          f"{args.clock} clock")  # fmt: skip
    print("fixed: 32 prompts x 64 new tokens (forced);  rl: 8 prompts x 8 samples, EOS ~5 %/step, cap 64")
    print(f"{'workload':<8} {'dtype':<5} {'HF generate tok/s':>18} {'NativeEngine tok/s':>19} "
          f"{'speed-up':>9} {'(best)':>7}")  # fmt: skip
    for workload, precision, hf_rates, engine_rates in results:
        hf, engine = statistics.median(hf_rates), statistics.median(engine_rates)
        best = max(engine_rates) / max(hf_rates)
        print(f"{workload:<8} {precision:<5} {hf:>18.0f} {engine:>19.0f} {engine / hf:>8.2f}x {best:>6.2f}x")


if __name__ == "__main__":
    main()
