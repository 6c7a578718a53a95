"""One update with each prompt once (``optim.shared_prompt``) beside the padding-free and the padded update, side by
side in one run.

A preset model (no cold start) and a batch of ``--prompts`` prompts x ``--samples`` samples: random prompts of
each ``--prompt-tokens`` length, random completions of ``--completion-tokens`` tokens (``--natural``: of 1 to that
many, as sampled responses are). Three trainers on copies of the same weights, one micro-batch of the whole
batch, run ``Trainer.update`` (forward + backward of MiniRL's loss, gradient clipping, AdamW) in alternating rounds;
per arm the median seconds of an update, and the tokens its forward computes (padded: rows x width; padding-free:
the real tokens; shared: each prompt once). Before timing, the three score the batch once: the script checks that
their log-probs are the same (bitwise on the machines tested) and prints the largest gap.

    python benchmarks/bench_shared_prompt.py [--preset qwen3-moe-2m] [--prompts 8] [--samples 8]
        [--prompt-tokens 12 64 256] [--completion-tokens 32] [--natural] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from minirl.batching import collate
from minirl.config import MiniRLConfig
from minirl.models.padding_free import Packing, shared_prompts
from minirl.models.presets import build_model
from minirl.objective import make_objective
from minirl.trainer import OnPolicy, Trainer
from minirl.types import Batch, Completion

ARMS = {"padded": {}, "padding_free": {"padding_free": True}, "shared_prompt": {"shared_prompt": True}}


def make_batch(prompts: int, samples: int, prompt_tokens: int, completion_tokens: int, natural: bool, vocab: int,
               seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    comps = []
    for p in range(prompts):
        prompt = torch.randint(2, vocab, (prompt_tokens,), generator=g).tolist()
        for s in range(samples):
            n = int(torch.randint(1, completion_tokens + 1, (), generator=g)) if natural else completion_tokens
            comps.append(Completion(p, s, prompt, torch.randint(2, vocab, (n,), generator=g).tolist(),
                                    -torch.rand(n, generator=g), "length"))
    return collate(comps, torch.randn(len(comps), generator=g), pad_token_id=0)


def forward_tokens(batch: Batch, arm: str) -> int:
    if arm == "padded":
        return batch.input_ids.numel()
    prompts = shared_prompts(batch.input_ids, batch.mask) if arm == "shared_prompt" else None
    return int(Packing.of(batch.attention_mask, prompts=prompts).index.numel())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="qwen3-moe-2m")
    parser.add_argument("--vocab", type=int, default=64, help="vocabulary size (the demo's character tokenizer: ~40)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[12, 64, 256])
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--natural", action="store_true", help="completion lengths drawn from 1..--completion-tokens")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(args.preset, args.vocab, 0, 1, seed=0)
    params = sum(p.numel() for p in model.parameters())
    lengths = f"1-{args.completion_tokens}" if args.natural else str(args.completion_tokens)
    print(f"{args.preset} ({params:,} parameters), {args.prompts} prompts x {args.samples} samples, completions of "
          f"{lengths} tokens; Trainer.update (one micro-batch), {args.threads} thread(s), median of {args.rounds} "
          f"alternating rounds after one warm-up; torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()})")
    print(f"{'prompt':>6}  {'arm':<14} {'tokens':>7} {'s/update':>9} {'vs padded':>9} {'vs padding-free':>15}")
    for prompt_tokens in args.prompt_tokens:
        batch = make_batch(args.prompts, args.samples, prompt_tokens, args.completion_tokens, args.natural, args.vocab)
        trainers = {arm: Trainer(copy.deepcopy(model), lr=1e-5, micro_batch_sequences=batch.size, update_guard="off",
                                 **kwargs) for arm, kwargs in ARMS.items()}
        logps = {arm: t.score(batch, entropy=False).logp for arm, t in trainers.items()}
        gap = max((logps[arm] - logps["padded"]).abs().max().item() for arm in ARMS)
        objective = OnPolicy(make_objective(MiniRLConfig(), batch))
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for round_ in range(args.rounds + 1):
            for arm, trainer in trainers.items():
                started = time.perf_counter()
                trainer.update(batch, objective, old_pass=True)
                if round_:  # the first round warms up
                    times[arm].append(time.perf_counter() - started)
        median = {arm: statistics.median(t) for arm, t in times.items()}
        for arm in ARMS:
            print(f"{prompt_tokens:>6}  {arm:<14} {forward_tokens(batch, arm):>7} {median[arm]:>9.3f} "
                  f"{median['padded'] / median[arm]:>8.2f}x {median['padding_free'] / median[arm]:>14.2f}x")
        print(f"{'':>6}  log-probs: largest gap to the padded forward's {gap:.1e}")


if __name__ == "__main__":
    main()
