"""Fixed vs dynamic micro-batches (``optim.micro_batch_max_tokens``), padded or padding-free
(``optim.padding_free``), for one update, side by side.

One RL mini-batch of the demo config's shape (8 prompts x 8 samples = 64 rows): the task's real
prompts, responses of ``--lengths`` (``uniform``: 1 to ``max_new_tokens`` tokens drawn per row,
about the spread of natural RL lengths; ``full``: every row at ``max_new_tokens``). The same batch
is updated (MiniRL objective, lr 0 so the weights stay put) and scored (the no-grad old-log-prob
pass) with fixed 64-row micro-batches and with each token budget, the settings alternating round
by round (each round starting with the next one); prints the median time per update and per score pass, the padded and real tokens the
forwards see, and the speed-up over fixed micro-batches. ``--padding-free`` adds every setting again with
padding-free forwards (the budgets then count real tokens) and checks their log-probs against the padded ones.

    python benchmarks/bench_micro_batches.py [--budgets 512 1024 2048] [--lengths uniform] [--threads 1]
        [--padding-free] [key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minirl.batching import collate
from minirl.config import MiniRLConfig, load_config
from minirl.objective import make_objective
from minirl.runtime import build_model, build_task
from minirl.trainer import Trainer
from minirl.types import Completion


def make_batch(cfg, tokenizer, task, lengths: str, seed: int = 0):
    """64 completions: real prompts, random response tokens of the chosen lengths."""
    g = torch.Generator().manual_seed(seed)
    prompts = task.train_prompts()[: cfg.rollout.prompts_per_step]
    comps = []
    for p_index, prompt in enumerate(prompts):
        prompt_ids = tokenizer.encode(prompt.text, add_special_tokens=False)
        for s_index in range(cfg.rollout.samples_per_prompt):
            n = cfg.rollout.max_new_tokens if lengths == "full" else int(torch.randint(1, cfg.rollout.max_new_tokens + 1, (1,), generator=g))
            ids = torch.randint(3, len(tokenizer) - 1, (n,), generator=g).tolist()
            comps.append(Completion(p_index, s_index, prompt_ids, ids, -torch.rand(n, generator=g), "eos"))
    return collate(comps, torch.randn(len(comps), generator=g), pad_token_id=tokenizer.pad_token_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--budgets", nargs="+", default=["512", "1024", "2048"], help="token budgets to compare")
    parser.add_argument("--lengths", choices=["uniform", "full"], default="uniform")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--padding-free", action="store_true", help="also each setting with optim.padding_free")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    args = parser.parse_args()
    # `--budgets 512 key=value`: argparse gives the overrides to --budgets
    args.overrides = [*(b for b in args.budgets if "=" in b), *args.overrides]
    try:
        args.budgets = [int(b) for b in args.budgets if "=" not in b]
    except ValueError:
        parser.error(f"--budgets: whole numbers of tokens, got {' '.join(args.budgets)}")
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, ["cold_start.enabled=false", *args.overrides])
    model, tokenizer = build_model(cfg)
    task = build_task(cfg, model, tokenizer)
    batch = make_batch(cfg, tokenizer, task, args.lengths)
    budgets: list[int | None] = [None, *args.budgets]
    settings = [(b, free) for free in ((False, True) if args.padding_free else (False,)) for b in budgets]
    trainers = {(b, free): Trainer(model, lr=0.0, micro_batch_sequences=cfg.optim.micro_batch_sequences,
                                   micro_batch_max_tokens=b, padding_free=free) for b, free in settings}
    base = trainers[None, False]
    batch = batch.with_logp_old(base.score(batch, entropy=False).logp)
    objective = make_objective(MiniRLConfig(), batch)
    times: dict[tuple[int | None, bool], dict[str, list[float]]] = {k: {"update": [], "score": []} for k in settings}
    gap = 0.0
    for round_ in range(args.rounds + 1):  # round 0 warms up; each round starts with the next setting
        for key in settings[round_ % len(settings):] + settings[:round_ % len(settings)]:
            started = time.perf_counter()
            trainers[key].update(batch, objective)
            mid = time.perf_counter()
            scores = trainers[key].score(batch)
            if round_:
                times[key]["update"].append(mid - started)
                times[key]["score"].append(time.perf_counter() - mid)
            gap = max(gap, float((scores.logp - batch.logp_old).abs().max()))
    real = int(batch.attention_mask.sum())
    print(f"{cfg.model.preset}, {batch.size} rows, {args.lengths} response lengths (1..{cfg.rollout.max_new_tokens}), "
          f"{real} real tokens, {args.threads} thread(s); median of {args.rounds} rounds")
    print(f"{'micro-batches':<34} {'count':>5} {'fwd tokens':>10} {'update ms':>10} {'score ms':>9} {'update speed-up':>16}")
    first = statistics.median(times[None, False]["update"])
    for b, free in settings:
        micros = trainers[b, free]._micro_batches(batch)
        tokens = sum(int(m.attention_mask.sum()) if free else m.input_ids.numel() for _, m in micros)
        update = statistics.median(times[b, free]["update"])
        label = (f"fixed {cfg.optim.micro_batch_sequences} rows" if b is None else f"<= {b} tokens") + (
            ", padding-free" if free else "")
        print(f"{label:<34} {len(micros):>5} {tokens:>10} {update * 1000:>10.1f} "
              f"{statistics.median(times[b, free]['score']) * 1000:>9.1f} {first / update:>15.2f}x")
    print(f"log-probs of every setting against the padded fixed micro-batches: max |diff| {gap:.2e}")


if __name__ == "__main__":
    main()
