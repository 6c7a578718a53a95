"""Peak memory and time of one update with the whole logits against the chunked LM head
(``optim.logprob_chunk_tokens``), side by side in one run.

A Qwen3-MoE built from a config with Qwen3's vocabulary (151,936 tokens; small otherwise, so the head's tensors
dominate as they do in a real model's update), ``--rows`` rows of ``--prompt`` prompt and ``--completion``
completion tokens. Each arm runs in its own process (peak resident memory, ``ru_maxrss``, is per process): one
forward + backward of MiniRL's loss through ``Trainer.update``, after one warm-up update; prints the peak, its
increase over the model's own footprint, and the update's seconds.

    python benchmarks/bench_logprob_head.py [--rows 4] [--prompt 256] [--completion 256] [--chunks 0 1024 256]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import torch

VOCAB = 151_936


def model_and_batch(rows: int, prompt: int, completion: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from minirl.batching import collate
    from minirl.types import Completion

    cfg = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                         intermediate_size=512, max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(0)
    comps = [Completion(i // 2, i % 2, torch.randint(2, VOCAB, (prompt,), generator=g).tolist(),
                        torch.randint(2, VOCAB, (completion,), generator=g).tolist(), -torch.rand(completion, generator=g),
                        "length") for i in range(rows)]
    return model, collate(comps, torch.randn(rows, generator=g), pad_token_id=0)


def one_arm(rows: int, prompt: int, completion: int, chunk: int) -> dict[str, float]:
    """In this process: the model, then one warm-up and one timed update; peak resident memory (MiB)."""
    from minirl.config import MiniRLConfig
    from minirl.objective import make_objective
    from minirl.trainer import OnPolicy, Trainer

    torch.set_num_threads(1)
    model, batch = model_and_batch(rows, prompt, completion)
    trainer = Trainer(model, lr=1e-5, micro_batch_sequences=rows, logprob_chunk_tokens=chunk or None, update_guard="off")
    objective = OnPolicy(make_objective(MiniRLConfig(), batch))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    trainer.update(batch, objective, old_pass=True)
    started = time.perf_counter()
    trainer.update(batch, objective, old_pass=True)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"chunk": chunk, "peak_mib": peak, "over_model_mib": peak - base, "update_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 256], help="0 = the whole logits")
    parser.add_argument("--arm", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm is not None:
        print(json.dumps(one_arm(args.rows, args.prompt, args.completion, args.arm)))
        return
    rows = []
    for chunk in args.chunks:
        command = [sys.executable, __file__, "--rows", str(args.rows), "--prompt", str(args.prompt),
                   "--completion", str(args.completion), "--arm", str(chunk)]
        out = subprocess.run(command, capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    tokens = args.rows * (args.prompt + args.completion)
    print(f"one update, {args.rows} rows x ({args.prompt} prompt + {args.completion} completion) tokens = {tokens}, "
          f"vocabulary {VOCAB}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), 1 thread, "
          f"{platform.processor() or platform.machine()}")
    print(f"{'logprob_chunk_tokens':>20} {'peak MiB':>10} {'over model MiB':>15} {'update s':>9}")
    for row in rows:
        name = str(row["chunk"]) if row["chunk"] else "null (whole)"
        print(f"{name:>20} {row['peak_mib']:>10.0f} {row['over_model_mib']:>15.0f} {row['update_s']:>9.2f}")


if __name__ == "__main__":
    main()
