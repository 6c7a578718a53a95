"""RL step time: minirl's ``global_step`` beside TRL's ``GRPOTrainer`` (``use_vllm=False``), on CPU.

Both sides train the same model (a preset Qwen3-MoE with the character tokenizer, optionally given
a short SFT cold start so that it stops on its own, saved once as a Hugging Face directory with
``minirl.models.io.save_checkpoint`` and loaded by both) on the same reverse-letters prompts from
``minirl.tasks``, with the same batch: ``--prompts`` prompts x ``--samples`` samples x
``--new-tokens`` new tokens per optimizer step (one update per step, N = 1), sampling at
temperature 1, and the same number of torch threads.

Two modes:
    forced    every completion runs to ``--new-tokens`` (TRL: ``generation_kwargs={"min_new_tokens": ..}``;
              minirl: the engine's EOS set to an id outside the vocabulary, as ``bench_step.py`` does)
    natural   completions stop at EOS (lengths depend on the model; the mean length is printed)

TRL is installed only for this script, in its own virtual environment ``benchmarks/.venv-trl``
(created on first use from ``benchmarks/requirements-trl.txt``; git-ignored by a ``.gitignore``
inside it). The TRL side runs there as a subprocess (an embedded script); the minirl side runs in
this interpreter; the two alternate for ``--repeats`` rounds. Per side: the median wall time of
an optimizer step over all measured steps (the first ``--warmup`` steps of each round skipped).

TRL settings (closest to MiniRL's demo): ``loss_type="dr_grpo"``, ``beta=0`` (no reference
model), ``scale_rewards="none"``, ``epsilon=0.2``, ``epsilon_high=0.27``, ``num_generations=G``,
``per_device_train_batch_size=P*G`` (so one generation round per optimizer step),
``max_completion_length=T``, ``use_cpu=True``, ``report_to="none"``, ``gradient_checkpointing=False``
(TRL 1.16's default is True; figures before 2026-12-03 were measured against TRL with it on). TRL adds the router aux loss
for MoE models (its default); minirl does not. minirl runs ``configs/demo.yaml`` (fp8 rollout
engine, routing metrics on) with cold start and eval off; extra ``key=value`` overrides apply
to the minirl side (e.g. ``rollout.precision=fp32`` for an fp32 engine like TRL's HF generate,
``moe.routing_metrics=false``). ``--bf16`` trains both sides in bf16 mixed precision (TRL ``bf16=True``,
i.e. accelerate's CPU autocast around the model, its generation included; minirl ``optim.precision=bf16``
with a bf16 engine): fast on CPUs with native bf16 matmuls (AMX, AVX512-BF16), slow without.

    python benchmarks/compare_trl.py [--sizes qwen3-moe-2m qwen3-moe-20m] [--modes forced natural]
        [--steps 5] [--warmup 2] [--repeats 2] [--threads 1] [--sft-steps 60] [--quick] [--bf16] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-trl"
REQUIREMENTS = HERE / "requirements-trl.txt"
CONFIG = HERE.parent / "configs" / "demo.yaml"

TRL_SCRIPT = r'''
import json, sys, time
spec = json.loads(open(sys.argv[1]).read())
import torch
torch.set_num_threads(spec["threads"])
from transformers.utils import logging as hf_logging
hf_logging.disable_progress_bar()
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

torch.manual_seed(spec["seed"])
tokenizer = AutoTokenizer.from_pretrained(spec["model"], local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(spec["model"], local_files_only=True, dtype=torch.float32)
dataset = Dataset.from_list(spec["data"])

def reward(prompts, completions, answer, **kwargs):
    out = []
    for completion, expected in zip(completions, answer):
        got = completion.rsplit("####", 1)[1].strip() if "####" in completion else None
        out.append(1.0 if got == expected else 0.0)
    return out

class Clock(TrainerCallback):
    def __init__(self):
        self.marks, self.lengths = [], []
    def on_step_begin(self, args, state, control, **kw):
        if not self.marks:
            self.marks.append(time.perf_counter())
    def on_step_end(self, args, state, control, **kw):
        self.marks.append(time.perf_counter())
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "completions/mean_length" in logs:
            self.lengths.append(logs["completions/mean_length"])

P, G, T = spec["prompts"], spec["samples"], spec["new_tokens"]
config = GRPOConfig(
    output_dir=spec["output_dir"], use_cpu=True, use_vllm=False, bf16=spec["bf16"], fp16=False,
    report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, log_completions=False,
    gradient_checkpointing=False,  # TRL 1.16 defaults to True: recomputing activations, which minirl does not do
    max_steps=spec["steps"], learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0,
    weight_decay=0.0, max_grad_norm=1.0, seed=spec["seed"], dataloader_num_workers=0,
    per_device_train_batch_size=P * G, gradient_accumulation_steps=1, num_generations=G,
    max_completion_length=T, temperature=1.0, top_p=1.0, top_k=0,
    beta=0.0, loss_type="dr_grpo", scale_rewards="none", epsilon=0.2, epsilon_high=0.27, num_iterations=1,
    generation_kwargs={"min_new_tokens": T} if spec["forced"] else None,
)
clock = Clock()
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                      processing_class=tokenizer, callbacks=[clock])
trainer.train()
steps = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
print("TRL_RESULT " + json.dumps({"step_s": steps, "lengths": clock.lengths}))
'''


def ensure_venv(log=print) -> Path:
    """``benchmarks/.venv-trl`` with torch, transformers and trl (created once, then reused)."""
    python = VENV / "bin" / "python"
    probe = [str(python), "-c", "import trl, torch, transformers"]
    if python.exists() and subprocess.run(probe, check=False, capture_output=True).returncode == 0:
        return python
    log(f"creating {VENV} (TRL for this benchmark only) ...")
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    (VENV / ".gitignore").write_text("*\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
    return python


def prepare_model(size: str, sft_steps: int, threads: int, root: Path) -> Path:
    """The preset (after ``sft_steps`` of SFT cold start when > 0) as a Hugging Face directory."""
    from minirl.config import load_config
    from minirl.models.io import load_model_and_tokenizer, save_checkpoint
    from minirl.sft import run_sft

    out = root / f"{size}-sft{sft_steps}"
    if sft_steps > 0:
        cfg = load_config(str(CONFIG), [
            f"model.preset={size}", f"cold_start.steps={sft_steps}", "cold_start.warmup_steps=5",
            f"run.threads={threads}", f"run.output_dir={root}", "run.name=sft", "log.console=false",
        ])
        run_sft(cfg, output=out, log=lambda line: None)
    else:
        model, tokenizer = load_model_and_tokenizer(size, seed=0)
        save_checkpoint(model, tokenizer, out)
    return out


def minirl_config(model_dir: Path, args, tmp: Path, overrides: list[str]):
    from minirl.config import load_config

    return load_config(str(CONFIG), [
        "cold_start.enabled=false", f"model.path={model_dir}", "eval.every_steps=0", "eval.num_prompts=1",
        "eval.samples_per_prompt=1", "log.console=false", f"run.output_dir={tmp}", "run.name=compare",
        f"run.threads={args.threads}", f"optim.lr={args.lr}", "optim.warmup_updates=0",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.samples_per_prompt={args.samples}",
        f"rollout.max_new_tokens={args.new_tokens}", f"optim.micro_batch_sequences={args.prompts * args.samples}",
        f"optim.global_steps={args.warmup + args.steps}", *overrides,
    ])


PHASES = ("rollout", "old_logprobs", "update", "sync")


def run_minirl(cfg, forced: bool, warmup: int, steps: int, phases: dict[str, list[float]]) -> tuple[list[float], list[float]]:
    from minirl.loop import global_step, setup

    run = setup(cfg)
    if forced:  # an EOS id outside the vocabulary: every row runs to max_new_tokens
        run.engine.eos_ids = torch.tensor([10**9])
    times, lengths = [], []
    try:
        for step in range(1, warmup + steps + 1):
            metrics = global_step(run, step)
            if step > warmup:
                times.append(metrics["time/step_s"])
                lengths.append(metrics["train/response_length"])
                for phase in PHASES:
                    phases[phase].append(metrics[f"time/{phase}_s"])
    finally:
        run.close()
    return times, lengths


def run_trl(python: Path, model_dir: Path, data: list[dict], forced: bool, args, tmp: Path) -> tuple[list[float], list[float]]:
    spec = {
        "model": str(model_dir), "data": data, "forced": forced, "threads": args.threads, "seed": 0,
        "prompts": args.prompts, "samples": args.samples, "new_tokens": args.new_tokens, "lr": args.lr,
        "steps": args.warmup + args.steps, "output_dir": str(tmp / "trl_out"), "bf16": args.bf16,
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    (tmp / "trl_side.py").write_text(TRL_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(python), str(tmp / "trl_side.py"), str(tmp / "spec.json")],
                          check=False, capture_output=True, text=True, env=env, cwd=tmp)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("TRL_RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"TRL side failed (exit {proc.returncode})")
    result = json.loads(lines[-1][len("TRL_RESULT "):])
    return result["step_s"][args.warmup:], result["lengths"][args.warmup:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["qwen3-moe-2m", "qwen3-moe-20m"])
    parser.add_argument("--modes", nargs="+", choices=["forced", "natural"], default=["forced", "natural"])
    parser.add_argument("--steps", type=int, default=5, help="measured optimizer steps per round and side")
    parser.add_argument("--warmup", type=int, default=2, help="steps skipped at the start of each round")
    parser.add_argument("--repeats", type=int, default=2, help="rounds, alternating TRL and minirl")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--sft-steps", type=int, default=60,
                        help="SFT cold-start steps before saving the shared model (0: random init, which rarely stops)")
    parser.add_argument("--quick", action="store_true", help="first size, first mode, 3 steps, 1 warm-up, 1 round")
    parser.add_argument("--bf16", action="store_true",
                        help="mixed precision on both sides: TRL bf16=True; minirl optim.precision=bf16, rollout.precision=bf16")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the minirl config")
    args = parser.parse_args(argv)
    # `--sizes a b key=value` : argparse gives the overrides to --sizes; they are overrides
    args.overrides = [*(s for s in args.sizes if "=" in s), *args.overrides]
    args.sizes = [s for s in args.sizes if "=" not in s]
    if args.bf16:  # before the user's overrides, which win
        args.overrides = ["optim.precision=bf16", "rollout.precision=bf16", *args.overrides]
    from minirl.models import PRESETS

    unknown = [s for s in args.sizes if s not in PRESETS]
    if unknown or not args.sizes:
        parser.error(f"--sizes: {', '.join(unknown) or 'none given'}; presets: {', '.join(PRESETS)}")
    if args.quick:
        args.sizes, args.modes, args.steps, args.warmup, args.repeats = args.sizes[:1], args.modes[:1], 3, 1, 1
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__), *sys.argv[1:]])
    python = ensure_venv()
    from minirl.tasks import build_task_from_config

    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for size in args.sizes:
            started = time.perf_counter()
            model_dir = prepare_model(size, args.sft_steps, args.threads, tmp)
            print(f"[{size}] model saved to {model_dir.name} in {time.perf_counter() - started:.0f}s", flush=True)
            for mode in args.modes:
                forced = mode == "forced"
                cfg = minirl_config(model_dir, args, tmp, args.overrides)
                task = build_task_from_config(cfg.task)
                count = args.prompts * (args.warmup + args.steps)
                data = [{"prompt": p.text, "answer": p.answer} for p in task.train_prompts()[:count]]
                trl_t, trl_len, mini_t, mini_len = [], [], [], []
                phases: dict[str, list[float]] = {phase: [] for phase in PHASES}
                for round_ in range(args.repeats):
                    t, n = run_trl(python, model_dir, data, forced, args, tmp)
                    trl_t += t
                    trl_len += n
                    t, n = run_minirl(cfg, forced, args.warmup, args.steps, phases)
                    mini_t += t
                    mini_len += n
                    print(f"[{size} {mode}] round {round_ + 1}: TRL {statistics.median(trl_t):.3f} s/step, "
                          f"minirl {statistics.median(mini_t):.3f} s/step", flush=True)
                def mean(xs: list[float]) -> float:
                    return statistics.fmean(xs) if xs else float("nan")

                rows.append((size, mode, statistics.median(trl_t), statistics.median(mini_t), mean(trl_len),
                             mean(mini_len), cfg.rollout.precision,
                             {phase: statistics.median(values) for phase, values in phases.items()}))

    precision = "bf16 mixed precision (TRL bf16=True, minirl optim.precision=bf16)" if args.bf16 else "fp32 trainers"
    print(f"\n{precision}; RL optimizer step, {args.prompts} prompts x {args.samples} samples x up to {args.new_tokens} new tokens, "
          f"N=1, {args.threads} thread(s); median over {args.steps} steps x {args.repeats} round(s) after {args.warmup} warm-up")
    print(f"{'model':<15} {'mode':<8} {'TRL s/step':>11} {'minirl s/step':>14} {'speed-up':>9} "
          f"{'TRL len':>8} {'minirl len':>11}  minirl engine")
    for size, mode, trl, mini, trl_len, mini_len, precision, _ in rows:
        print(f"{size:<15} {mode:<8} {trl:>11.3f} {mini:>14.3f} {trl / mini:>8.2f}x {trl_len:>8.1f} {mini_len:>11.1f}  {precision}")
    print("\nminirl phases (median s): " + "; ".join(
        f"{size} {mode}: " + ", ".join(f"{phase} {value:.3f}" for phase, value in phase_medians.items())
        for size, mode, *_, phase_medians in rows))
    print(f"\ncommand: {command}")


if __name__ == "__main__":
    main()
