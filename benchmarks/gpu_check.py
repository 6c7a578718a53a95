"""A few MiniRL + R3 global steps on one accelerator: does the distributed-ready stack run there?

    python benchmarks/gpu_check.py                 # CUDA if present: vLLM if importable, else the native engine
    python benchmarks/gpu_check.py --device cpu    # the same path on CPU, tiny model (~1 min)
    python benchmarks/gpu_check.py --engine native --precision fp8_e4m3 --steps 8

It builds a small Qwen3-MoE from a config (``--preset``, no download), runs ``--steps`` global steps
of ``minirl.loop`` with routing replay R3 (the engine's routes replayed in the old-log-prob pass and
in every update, N = 2 mini-batches) and prints, per step and in total:

* throughput: rollout tokens/s, trainer tokens/s, seconds per step;
* the training–inference mismatch: KL(mu_old || pi_old) (k1 and k3) over the sampled tokens;
* routing agreement: the fraction of (token, MoE layer) top-k sets the engine and the trainer share.

An untrained model never solves the task, so the rewards here are a partial credit (the share of
the answer's letters the completion contains), which gives non-zero advantages; the numbers it prints are about the
machinery, not about learning. Budget on one GPU: start-up (vLLM ~1-2 min) plus seconds per step.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class PartialCredit:
    """A reward source (``minirl.sources.RewardSource``): the share of the answer's letters that the
    completion contains, so an untrained model gets dense rewards and non-zero advantages."""

    def score(self, prompts, completions):
        import torch

        values = []
        for completion in completions:
            answer = set(prompts[completion.prompt_index].answer)
            values.append(len(answer & set(completion.text)) / max(len(answer), 1))
        return torch.tensor(values, dtype=torch.float32), {}

    def close(self) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--engine", choices=["auto", "native", "vllm"], default="auto")
    parser.add_argument("--preset", default=None, help="model preset (default: qwen3-moe-20m on cuda, qwen3-moe-tiny on cpu)")
    parser.add_argument("--precision", default=None, help="rollout.precision (default: bf16)")
    parser.add_argument("--steps", type=int, default=None, help="global steps (default: 6 on cuda, 3 on cpu)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu)")
    engine = args.engine
    if engine == "auto":
        engine = "vllm" if args.device == "cuda" and importlib.util.find_spec("vllm") else "native"
    if engine == "vllm" and args.device != "cuda":
        parser.error("--engine vllm needs --device cuda")
    gpu = args.device == "cuda"
    preset = args.preset or ("qwen3-moe-20m" if gpu else "qwen3-moe-tiny")
    steps = args.steps or (6 if gpu else 3)
    batch = ["rollout.prompts_per_step=16", "rollout.samples_per_prompt=8", "optim.micro_batch_sequences=64"] if gpu else \
        ["rollout.prompts_per_step=4", "rollout.samples_per_prompt=4", "optim.micro_batch_sequences=8"]

    import minirl.loop as loop
    from minirl.config import load_config

    with tempfile.TemporaryDirectory(prefix="minirl-gpu-check-") as run_dir:
        cfg = load_config(ROOT / "configs/demo.yaml", [
            f"model.preset={preset}", "task.difficulty=6", "task.num_train_prompts=512", "task.num_eval_prompts=8",
            *batch, "rollout.max_new_tokens=16", f"rollout.precision={args.precision or 'bf16'}",
            "optim.minibatches_per_step=2", "optim.lr=1e-4", "optim.warmup_updates=0", f"optim.global_steps={steps}",
            "moe.routing_replay=R3", "moe.routing_metrics=true", "cold_start.enabled=false", "log.console=false",
            f"cluster.device={args.device}", f"cluster.engine_backend={engine}", "cluster.sample_seeding=per_sample",
            f"run.output_dir={run_dir}", "run.threads=0" if gpu else "run.threads=1",
        ])
        started = time.perf_counter()
        run = loop.setup(cfg, rewards=PartialCredit())  # this script's reward, see the module docstring
        setup_s = time.perf_counter() - started
        device_name = torch.cuda.get_device_name(0) if gpu else "cpu"
        params = sum(p.numel() for p in run.model.parameters())
        print(f"device {device_name} | engine {engine} ({cfg.rollout.precision}) | model {preset} ({params / 1e6:.1f} M params) | "
              f"R3, N=2 | set-up {setup_s:.1f} s", flush=True)
        rows = []
        try:
            for step in range(1, steps + 1):
                m = loop.global_step(run, step)
                agreement = 1.0 - m["routing/train_infer_diff_frac"]
                rows.append((m, agreement))
                print(f"step {step}: {m['time/step_s']:.2f} s | rollout {m['perf/rollout_tokens_per_s']:.0f} tok/s | "
                      f"train {m['perf/train_tokens_per_s']:.0f} tok/s | KL k1 {m['mismatch/kl_k1']:.2e} k3 {m['mismatch/kl_k3']:.2e} | "
                      f"routing agreement {agreement:.4f} | reward {m['train/reward_mean']:.3f} | loss {m['policy/loss']:+.4f}",
                      flush=True)
        finally:
            run.close()
    later = rows[1:] or rows  # the first step includes warm-up (kernels, caches)
    mean = lambda key: sum(m[key] for m, _ in later) / len(later)  # noqa: E731
    print(f"summary ({len(later)} steps after the first): {mean('time/step_s'):.2f} s/step, rollout {mean('perf/rollout_tokens_per_s'):.0f} tok/s, "
          f"train {mean('perf/train_tokens_per_s'):.0f} tok/s, KL k3 {mean('mismatch/kl_k3'):.2e}, "
          f"routing agreement {sum(a for _, a in later) / len(later):.4f}, total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
