"""The training–inference mismatch of each rollout-engine precision: k3 KL per token, engine vs trainer.

One batch per sampling seed (the first ``--prompts`` training prompts of the config's task,
``--samples`` responses each) is sampled by one ``NativeEngine`` per variant below, built from the
same fp32 weights, and scored by the fp32 trainer (``Trainer.score``, the loop's old-log-prob pass).
The table gives ``minirl.algo.mismatch_metrics`` over the sampled tokens, i.e. the loop's
``mismatch/kl_k3`` (Schulman's k3 of KL(mu || pi) per token), ``kl_k1`` and mean / max
|logp_rollout - logp_trainer|, over the tokens of all ``--seeds`` batches, and the lowest and highest
per-batch k3. Every engine draws from the same seeds, so the variants mostly share their tokens.
k3 per token is heavy-tailed on a trained (peaked) model: a few tokens carry most of it, so one
batch of ~2k tokens can move by several x; use several seeds before comparing close variants.

``--trainer-precisions fp32,bf16`` repeats the table for each trainer compute (``optim.precision``):
bf16 is the paper's shape, a BF16 trainer against an FP8 engine; fp16 against the fp16 engine is the FP16
paper's (Qi et al. 2025); ``--variants`` keeps only the
engines whose name contains one of the given substrings (e.g. ``--variants fp8_e4m3,bf16``).

Variants: the engine's weight precision (``rollout.precision``, fp8 with ``rollout.fp8_scale``,
fp4 with ``rollout.fp4_block_size``) with an exact KV cache, then the fp8 KV cache
(``rollout.kv_cache_precision``) alone and on top of fp8 weights.

    python benchmarks/precision_kl.py [--config configs/demo.yaml] [--checkpoint DIR] [--prompts 16]
                                      [--samples 8] [--seeds 3] [--trainer-precisions fp32,bf16,fp16]
                                      [--variants NAME,...] [--replay-routes] [key=value ...]

Without ``--checkpoint`` the model is the config's preset at random init (``run.seed``); with it,
a saved model directory (e.g. the output of ``minirl sft``).
"""

from __future__ import annotations

import argparse
import time

import torch

from minirl.batching import collate
from minirl.config import load_config
from minirl.moe import RoutingReplay
from minirl.monitor import mismatch_metrics
from minirl.rollout.native import NativeEngine
from minirl.runtime import build_model, build_task
from minirl.trainer import Trainer
from minirl.types import SamplingParams

# name -> NativeEngine keyword arguments
VARIANTS: dict[str, dict] = {
    "fp32": dict(precision="fp32"),
    "bf16": dict(precision="bf16"),
    "fp16": dict(precision="fp16"),
    "fp8_e4m3 per_tensor": dict(precision="fp8_e4m3", fp8_scale="per_tensor"),
    "fp8_e4m3 per_expert": dict(precision="fp8_e4m3", fp8_scale="per_expert"),
    "fp8_e5m2 per_tensor": dict(precision="fp8_e5m2", fp8_scale="per_tensor"),
    "fp8_e5m2 per_expert": dict(precision="fp8_e5m2", fp8_scale="per_expert"),
    "fp4_e2m1 block 16": dict(precision="fp4_e2m1", fp4_block_size=16),
    "fp4_e2m1 block 32": dict(precision="fp4_e2m1", fp4_block_size=32),
    "fp4_e2m1 block 64": dict(precision="fp4_e2m1", fp4_block_size=64),
    "fp32 + kv fp8_e4m3": dict(precision="fp32", kv_cache_precision="fp8_e4m3"),
    "fp32 + kv fp8_e5m2": dict(precision="fp32", kv_cache_precision="fp8_e5m2"),
    "fp8_e4m3 per_expert + kv fp8_e4m3": dict(precision="fp8_e4m3", fp8_scale="per_expert", kv_cache_precision="fp8_e4m3"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--checkpoint", default=None, help="a saved model directory (default: random init)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3, help="batches, with sampling seeds 0 .. seeds-1")
    parser.add_argument("--trainer-precisions", default="fp32", help="comma-separated optim.precision values (fp32, bf16, fp16)")
    parser.add_argument("--variants", default="", help="comma-separated substrings of engine names to keep (default: all)")
    parser.add_argument("--replay-routes", action="store_true",
                        help="the trainer replays the engine's expert choices (R3) instead of routing itself")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = parser.parse_args()

    torch.set_num_threads(1)
    cfg = load_config(args.config, ["cold_start.enabled=false", *args.overrides])
    model, tokenizer = build_model(cfg, path=args.checkpoint)
    model.eval()
    prompts = build_task(cfg, model, tokenizer).train_prompts()[: args.prompts]
    samplings = [
        SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                       top_p=cfg.rollout.top_p, seed=seed)
        for seed in range(args.seeds)
    ]  # fmt: skip
    wanted = [part for part in args.variants.split(",") if part]
    variants = {name: kwargs for name, kwargs in VARIANTS.items() if not wanted or any(part in name for part in wanted)}
    source = args.checkpoint or f"{cfg.model.preset} at random init (seed {cfg.run.seed})"
    r = cfg.rollout
    print(f"model: {source}; {args.seeds} batch(es) of {len(prompts)} prompts x {args.samples} samples, max "
          f"{r.max_new_tokens} new tokens, temperature {r.temperature}, top_p {r.top_p}, sampling seeds 0..{args.seeds - 1}")
    replay = RoutingReplay(model) if args.replay_routes else None
    for precision in args.trainer_precisions.split(","):
        trainer = Trainer(model, lr=0.0, micro_batch_sequences=cfg.optim.micro_batch_sequences, precision=precision,
                          replay=replay)
        print(f"\ntrainer precision: {precision}{' (R3: the engine routes replayed)' if replay else ''}\n")
        table(trainer, model, tokenizer, prompts, samplings, variants, args.samples)


def table(trainer: Trainer, model: torch.nn.Module, tokenizer, prompts: list, samplings: list, variants: dict,
          samples: int) -> None:
    """One row per engine variant: the mismatch of its samples against ``trainer``."""
    print(f"| {'engine':<34} | {'tokens':>6} | {'k3 KL / token':>13} | {'k3 per batch':>19} | {'k1 KL / token':>13} "
          f"| {'mean abs dlogp':>14} | {'max abs dlogp':>13} | {'s':>5} |")
    print(f"|{'-' * 36}|{'-' * 7}:|{'-' * 14}:|{'-' * 20}:|{'-' * 14}:|{'-' * 15}:|{'-' * 14}:|{'-' * 6}:|")
    for name, kwargs in variants.items():
        start = time.perf_counter()
        engine = NativeEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                              tokenizer=tokenizer, **kwargs)  # fmt: skip
        rollout, old, masks, per_batch = [], [], [], []
        for sampling in samplings:
            replay = trainer.replay is not None
            completions = engine.generate(prompts, samples, sampling, record_routes=replay)
            batch = collate(completions, torch.zeros(len(completions)), pad_token_id=tokenizer.pad_token_id)
            logp_trainer = trainer.score(batch, entropy=False, replay_routes=replay).logp
            per_batch.append(mismatch_metrics(batch.logp_rollout, logp_trainer, batch.mask)["kl_k3"])
            rollout.append(batch.logp_rollout[batch.mask])
            old.append(logp_trainer[batch.mask])
            masks.append(batch.mask[batch.mask])
        m = mismatch_metrics(torch.cat(rollout), torch.cat(old), torch.cat(masks))
        seconds = time.perf_counter() - start
        spread = f"{min(per_batch):.2e} - {max(per_batch):.2e}"
        print(f"| {name:<34} | {int(sum(x.numel() for x in masks)):>6} | {m['kl_k3']:>13.3e} | {spread:>19} | "
              f"{m['kl_k1']:>13.3e} | {m['abs_dlogp_mean']:>14.3e} | {m['abs_dlogp_max']:>13.3e} | {seconds:>5.1f} |")

if __name__ == "__main__":
    main()
