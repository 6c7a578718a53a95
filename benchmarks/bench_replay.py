"""What routing replay costs: step time of R2 and R3 against no replay, and the memory of routes.

1. Global steps. One run per variant from the same config and seed (default: the demo config, its
   ``qwen3-moe-2m`` model, cold start off, N = 2 mini-batches so that R2 is not a no-op), advanced
   in turn, one ``minirl.loop.global_step`` each, the order rotated every step so that a noisy
   neighbour hits every variant alike. Step 1 (warm-up) is dropped. "paired" is the median over
   steps of (variant / baseline of the same round) - 1, the figure least moved by a busy machine.
       baseline   moe.routing_replay=none, moe.routing_metrics=false  (nothing recorded)
       metrics    none + routing metrics (engine and trainer record routes every step)
       R2, R3     routing replay, with routing metrics (the defaults)
   Without a cold start the random model earns no reward, so every update has a zero gradient
   and all variants compute on the same tokens: the differences are the routing work only.
2. The same work piece by piece on one fixed global batch, alternating (order rotated), the least
   of ``--repeats``:
   rollout with and without recording routes (every row forced to the full length), the
   old-log-prob pass plain / recording / replaying (R3, with natural-route capture), and one
   mini-batch update plain / replaying / replaying with R2's drift capture. Process CPU time
   (``time.process_time``, one intra-op thread): a neighbour's load does not count.
3. Bytes that routes take per 1,000 tokens (``minirl.moe.route_bytes_per_1k_tokens``), measured
   on the engine's output for this model and computed for Qwen3-30B-A3B (48 MoE layers, top-8,
   128 experts, so uint8 would do).

    python benchmarks/bench_replay.py [--config configs/demo.yaml] [--steps 15] [--repeats 25] [key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from minirl.batching import collate, split
from minirl.config import load_config
from minirl.loop import Run, global_step, rollout_sampling, setup
from minirl.moe import route_bytes_per_1k_tokens
from minirl.objective import make_objective
from minirl.rollout.native import NativeEngine

VARIANTS = {
    "baseline": ["moe.routing_replay=none", "moe.routing_metrics=false"],
    "metrics": ["moe.routing_replay=none", "moe.routing_metrics=true"],
    "R2": ["moe.routing_replay=R2", "moe.routing_metrics=true"],
    "R3": ["moe.routing_replay=R3", "moe.routing_metrics=true"],
}
PHASES = ("rollout", "old_logprobs", "update")


def step_times(args, tmp: str) -> dict[str, Run]:
    base = [
        "cold_start.enabled=false", "log.console=false", "eval.every_steps=0", f"run.output_dir={tmp}",
        "optim.minibatches_per_step=2", *args.overrides,
    ]
    runs = {name: setup(load_config(args.config, [*base, *extra, f"run.name={name}"])) for name, extra in VARIANTS.items()}
    cfg = runs["baseline"].cfg
    names = list(VARIANTS)
    rows: dict[str, list[dict]] = {name: [] for name in names}
    for step in range(1, args.steps + 1):
        shift = step % len(names)
        for name in names[shift:] + names[:shift]:
            start, cpu = time.perf_counter(), time.process_time()
            metrics = global_step(runs[name], step)
            metrics["wall_s"], metrics["cpu_s"] = time.perf_counter() - start, time.process_time() - cpu
            rows[name].append(metrics)
    print(f"\n1. global step of {cfg.global_batch_sequences} sequences (P={cfg.rollout.prompts_per_step} x "
          f"G={cfg.rollout.samples_per_prompt}, <= {cfg.rollout.max_new_tokens} new tokens), "
          f"N={cfg.optim.minibatches_per_step}, model {cfg.model.preset}, engine {cfg.rollout.precision}, "
          f"{torch.get_num_threads()} threads; median over steps 2..{args.steps}, order rotated each step")
    print(f"  {'':<9} {'---------- wall clock ----------':>34}  {'----------- CPU time -----------':>34}")
    print(f"  {'variant':<9} {'step ms':>10} {'vs base':>10} {'paired':>10}    {'step ms':>10} {'vs base':>10} {'paired':>10}"
          + "".join(f" {p + ' ms':>16}" for p in PHASES))
    for name in names:
        kept, base_rows = rows[name][1:], rows["baseline"][1:]
        line = f"  {name:<9}"
        for clock in ("wall_s", "cpu_s"):
            step = statistics.median(r[clock] for r in kept)
            base_step = statistics.median(r[clock] for r in base_rows)
            paired = statistics.median(r[clock] / b[clock] - 1 for r, b in zip(kept, base_rows))
            line += f" {1000 * step:10.1f} {100 * (step / base_step - 1):+9.1f}% {100 * paired:+9.1f}%   "
        line += "".join(f" {1000 * statistics.median(r[f'time/{p}_s'] for r in kept):16.1f}" for p in PHASES)
        print(line)
    print("  (phase columns: wall clock, from the step's own time/* metrics)")
    last = {name: rows[name][-1] for name in ("metrics", "R3")}
    print(f"  routing/train_infer_diff_frac at step {args.steps}: metrics {last['metrics']['routing/train_infer_diff_frac']:.4f}, "
          f"R3 {last['R3']['routing/train_infer_diff_frac']:.4f}")
    return runs


def _alternate(pieces: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Least CPU seconds of each piece over the repeats (CPU time: a busy neighbour does not bill us
    its time; the least: interference only ever adds)."""
    times: dict[str, list[float]] = {name: [] for name in pieces}
    names = list(pieces)
    for repeat in range(repeats):
        shift = repeat % len(names)  # rotate: whichever piece runs first after a switch pays for it
        for name in names[shift:] + names[:shift]:
            start = time.process_time()
            pieces[name]()
            times[name].append(time.process_time() - start)
    return {name: min(values) for name, values in times.items()}


def components(run: Run, repeats: int) -> None:
    cfg, trainer = run.cfg, run.trainer
    engine = NativeEngine(run.model, eos_token_id=run.tokenizer.eos_token_id, pad_token_id=run.tokenizer.pad_token_id,
                          precision=cfg.rollout.precision, fp8_scale=cfg.rollout.fp8_scale, tokenizer=run.tokenizer)
    engine.eos_ids = torch.tensor([10**9])  # every row runs to max_new_tokens: the same work each call
    prompts = run.prompts[: cfg.rollout.prompts_per_step]
    sampling = rollout_sampling(cfg, 1)
    G = cfg.rollout.samples_per_prompt
    completions = engine.generate(prompts, G, sampling, record_routes=True)
    batch = collate(completions, torch.zeros(len(completions)), pad_token_id=run.tokenizer.pad_token_id)
    batch = batch.with_logp_old(trainer.score(batch, entropy=False).logp)
    minibatch = split(batch, cfg.optim.minibatches_per_step)[0]
    objective = make_objective(cfg.algo, minibatch)
    rollout = _alternate({
        "plain": lambda: engine.generate(prompts, G, sampling),
        "record": lambda: engine.generate(prompts, G, sampling, record_routes=True),
    }, repeats)
    score = _alternate({
        "plain": lambda: trainer.score(batch),
        "record": lambda: trainer.score(batch, record_routes=True),
        "replay": lambda: trainer.score(batch, replay_routes=True),
        "replay+capture": lambda: trainer.score(batch, replay_routes=True, record_routes=True),
    }, repeats)
    update = _alternate({
        "plain": lambda: trainer.update(minibatch, objective),
        "replay": lambda: trainer.update(minibatch, objective, replay_routes=True),
        "replay+drift": lambda: trainer.update(minibatch, objective, replay_routes=True, natural_drift=True),
    }, repeats)
    tokens = int(batch.attention_mask.sum())
    print(f"\n2. pieces on one fixed global batch ({batch.size} rows, {tokens} fed tokens, "
          f"{cfg.rollout.max_new_tokens} new tokens per row), alternating, least CPU time of {repeats}")
    for label, table in (("rollout", rollout), ("old-log-prob pass", score), ("one mini-batch update", update)):
        base = table["plain"]
        print(f"  {label:<22}" + "  ".join(f"{name} {1000 * t:6.1f} ms ({100 * (t / base - 1):+5.1f}%)" for name, t in table.items()))
    N = cfg.optim.minibatches_per_step
    step = rollout["plain"] + score["plain"] + N * update["plain"]
    extra = {
        "metrics": rollout["record"] - rollout["plain"] + score["record"] - score["plain"],
        "R2 without metrics": score["record"] - score["plain"] + N * (update["replay"] - update["plain"]),
        "R2": rollout["record"] - rollout["plain"] + score["record"] - score["plain"]
        + N * (update["replay+drift"] - update["plain"]),
        "R3 without metrics": rollout["record"] - rollout["plain"] + score["replay"] - score["plain"]
        + N * (update["replay"] - update["plain"]),
        "R3": rollout["record"] - rollout["plain"] + score["replay+capture"] - score["plain"]
        + N * (update["replay"] - update["plain"]),
    }
    print(f"  implied cost per global step (rollout + old-log-prob pass + {N} updates = {1000 * step:.1f} ms): "
          + ", ".join(f"{name} {100 * value / step:+.1f}%" for name, value in extra.items()))


def memory(run: Run) -> None:
    replay = run.replay
    completions = run.engine.generate(run.prompts[:4], 2, rollout_sampling(run.cfg, 10_000), record_routes=True)
    tokens = sum(c.routes.shape[0] for c in completions)
    stored = sum(c.routes.numel() * c.routes.element_size() for c in completions)
    print("\n3. routes per 1,000 tokens (1000 x L x K x bytes per expert id)")
    print(f"  {'model':<34} {'L':>3} {'K':>3} {'experts':>8} {'int16':>10} {'uint8':>10}")
    rows = [
        (f"{run.cfg.model.preset} (measured, {tokens} tokens)", replay.num_layers, replay.top_k, replay.num_experts,
         1000 * stored / tokens),
        ("Qwen3-30B-A3B (computed)", 48, 8, 128, route_bytes_per_1k_tokens(48, 8, torch.int16)),
    ]
    for name, layers, top_k, experts, int16_bytes in rows:
        uint8 = route_bytes_per_1k_tokens(layers, top_k, torch.uint8) if experts <= 256 else float("nan")
        print(f"  {name:<34} {layers:>3} {top_k:>3} {experts:>8} {int16_bytes / 1000:>7.1f} kB {uint8 / 1000:>7.1f} kB")
    per_token = route_bytes_per_1k_tokens(48, 8, torch.int16) / 1000
    tokens_batch = 512 * 8192
    print(f"  e.g. Qwen3-30B-A3B, a global batch of 512 x 8k tokens: {per_token * tokens_batch / 2**30:.2f} GiB int16, "
          f"{per_token / 2 * tokens_batch / 2**30:.2f} GiB uint8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = step_times(args, tmp)
        components(runs["R3"], args.repeats)
        memory(runs["R3"])


if __name__ == "__main__":
    main()
