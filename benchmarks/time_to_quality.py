"""Time to quality: wall seconds of RL training until a held-out accuracy threshold, minirl vs TRL.

Both sides start from ONE SFT checkpoint and are judged by ONE evaluation:

1. **SFT checkpoint.** ``minirl.sft.run_sft`` on the config (default ``configs/demo.yaml``:
   qwen3-moe-2m, 400 SFT steps on ``direct`` teacher traces of reverse-12-letters, exactly the
   demo's cold start), saved as a Hugging Face directory (``WORK/sft``; ``--sft-dir`` reuses one).
2. **minirl.** ``minirl.loop.train`` of the same config from that checkpoint (``start_from``, as
   ``minirl train --start-from``), cold start off, ``optim.global_steps=--steps``,
   ``eval.every_steps=--eval-every``. Its ``metrics.jsonl`` gives the curve: the x of step s is the
   sum of ``time/step_s`` over steps 1..s (rollout, rewards, log-prob pass, update, weight sync;
   evaluation, checkpoint writing and the one-off setup are not counted), the y is ``eval/accuracy``.
3. **TRL.** ``GRPOTrainer`` (TRL 1.16.0, ``use_vllm=False``) in ``benchmarks/.venv-trl``
   (``compare_trl.ensure_venv``) as a subprocess, from the same checkpoint, on the same training
   prompts (``minirl.tasks``), with the same reward rule (exact match of the text after the last
   ``####``; ``TRL_REWARD`` below, checked against ``minirl.tasks`` by the unit tests). Settings:
   TRL's GRPO defaults except ``loss_type="dr_grpo"`` (as in ``compare_trl.py``), ``beta=0``,
   ``learning_rate`` = the config's ``optim.lr``, ``num_generations`` = G,
   ``per_device_train_batch_size`` = P x G (P prompts per optimizer step),
   ``max_completion_length`` = T, ``max_steps=--steps``, ``seed`` = ``run.seed``; plus, for the
   machine rather than the algorithm: ``use_cpu=True``, ``bf16=False`` (fp32 like minirl's
   trainer; TRL's bf16 default targets GPUs), ``gradient_checkpointing=False`` (recomputation
   only saves memory, which these models do not need), no saving, no reports. Every
   ``--eval-every`` optimizer steps (and at the last) a callback saves the weights
   (``torch.save`` of the state dict); the x of a snapshot is the wall time since the first
   optimizer step began minus the time spent saving snapshots.
4. **Evaluation.** The snapshots are evaluated afterwards in this interpreter by
   ``minirl.loop.evaluate``, the function ``minirl train`` calls: the config's held-out prompts
   (``eval.num_prompts``), ``eval.samples_per_prompt`` samples each at ``eval.temperature`` /
   ``eval.top_p``, the task's own reward from ``minirl.tasks``, an engine of the config's
   ``rollout.precision`` (``minirl.runtime.build_engine``) loaded with the snapshot's weights, and
   the same sampling seed per step as minirl's evaluation at that step. Evaluating outside the TRL
   process (rather than importing minirl there) keeps the evaluation code, interpreter and library
   versions identical for both sides, keeps minirl's dependencies out of the TRL venv and keeps
   evaluation time off TRL's clock; step 0 (the SFT checkpoint) must score the same on both sides.

Printed: both curves, and for ``--threshold`` (an absolute held-out accuracy, default 0.9) the
first x at which each side reaches it (``never`` if it does not within ``--steps``). ``--out``
writes a JSON, ``--plot`` one PNG with both curves (accuracy vs seconds) and the threshold. The
sides run one after the other on ``--threads`` threads; on a busy machine wall times move.

    python benchmarks/time_to_quality.py [--steps 100] [--eval-every 10] [--threshold 0.9] [--threads 1]
        [--config configs/demo.yaml] [--sft-dir DIR] [--work-dir DIR] [--out ttq.json] [--plot ttq.png]
        [--quick] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling benchmark scripts
from compare_trl import CONFIG, ensure_venv  # noqa: E402  (the TRL venv, created once)

SYNTHETIC_KINDS = ("reverse", "add", "sort")
# --quick: the tiny model on a short task, a few steps of everything (a smoke test of the plumbing)
QUICK = [
    "model.preset=qwen3-moe-tiny", "task.difficulty=3", "task.num_train_prompts=64", "task.num_eval_prompts=8",
    "eval.num_prompts=8", "eval.samples_per_prompt=2", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
    "rollout.max_new_tokens=8", "optim.micro_batch_sequences=4", "optim.warmup_updates=0", "cold_start.steps=10",
    "cold_start.examples=64", "cold_start.warmup_steps=2", "cold_start.batch_sequences=8",
]

# The reward TRL trains on: the synthetic tasks' rule (minirl.tasks.synthetic: 1 if the text after the
# last "####", whitespace-stripped, equals the answer). Kept as source for the TRL venv, which has no minirl.
TRL_REWARD = '''
def exact_answer_reward(prompts, completions, answer, **kwargs):
    rewards = []
    for completion, expected in zip(completions, answer):
        got = completion.rsplit("####", 1)[1].strip() if "####" in completion else None
        rewards.append(1.0 if got == expected else 0.0)
    return rewards
'''

TRL_SCRIPT = r'''
import json, sys, time
spec = json.loads(open(sys.argv[1]).read())
import torch
torch.set_num_threads(spec["threads"])
from transformers.utils import logging as hf_logging
hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

torch.manual_seed(spec["seed"])
tokenizer = AutoTokenizer.from_pretrained(spec["model"], local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(spec["model"], local_files_only=True, dtype=torch.float32)
dataset = Dataset.from_list(spec["data"])
''' + TRL_REWARD + r'''

class Snapshots(TrainerCallback):
    """Every `every` optimizer steps and at the last: the weights to disk, with the training seconds so far."""
    def __init__(self, every, out_dir):
        self.every, self.out_dir = every, out_dir
        self.start, self.saving, self.points, self.logs = None, 0.0, [], []
    def on_step_begin(self, args, state, control, **kw):
        if self.start is None:
            self.start = time.perf_counter()
    def on_step_end(self, args, state, control, model=None, **kw):
        step = state.global_step
        if step % self.every and step != args.max_steps:
            return
        now = time.perf_counter()
        seconds = now - self.start - self.saving
        path = f"{self.out_dir}/step{step}.pt"
        torch.save(model.state_dict(), path)
        self.points.append({"step": step, "seconds": seconds, "path": path})
        self.saving += time.perf_counter() - now
    def on_log(self, args, state, control, logs=None, **kw):
        if logs:
            self.logs.append({"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})

P, G, T = spec["prompts"], spec["samples"], spec["new_tokens"]
config = GRPOConfig(
    output_dir=spec["output_dir"], use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
    report_to="none", save_strategy="no", disable_tqdm=True, seed=spec["seed"], max_steps=spec["steps"],
    learning_rate=spec["lr"], per_device_train_batch_size=P * G, num_generations=G, max_completion_length=T,
    beta=0.0, loss_type="dr_grpo",
)
snapshots = Snapshots(spec["eval_every"], spec["snapshot_dir"])
trainer = GRPOTrainer(model=model, reward_funcs=exact_answer_reward, args=config, train_dataset=dataset,
                      processing_class=tokenizer, callbacks=[snapshots])
started = time.perf_counter()
trainer.train()
settings = {k: getattr(config, k) for k in ("loss_type", "beta", "scale_rewards", "epsilon", "epsilon_high",
            "temperature", "top_p", "top_k", "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay",
            "max_grad_norm", "num_iterations", "mask_truncated_completions", "gradient_accumulation_steps")}
print("TTQ_RESULT " + json.dumps({"points": snapshots.points, "logs": snapshots.logs, "wall_s": time.perf_counter() - started,
                                  "settings": {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                                               for k, v in settings.items()}}))
'''


# ----------------------------------------------------------------------------- pure parts


def minirl_curve(rows: list[dict]) -> list[dict]:
    """(step, seconds, accuracy) at each evaluated step of a ``metrics.jsonl``; seconds = the summed
    ``time/step_s`` of steps 1..step (0 at step 0, the evaluation before any update)."""
    curve, seconds = [], 0.0
    for row in sorted(rows, key=lambda r: r["step"]):
        if row["step"] > 0:
            seconds += row.get("time/step_s") or 0.0
        if row.get("eval/accuracy") is not None:
            curve.append({"step": row["step"], "seconds": seconds, "accuracy": row["eval/accuracy"]})
    return curve


def time_to_threshold(curve: list[dict], threshold: float) -> dict | None:
    """The first point of ``curve`` (in step order) whose accuracy reaches ``threshold``; None if none does."""
    for point in sorted(curve, key=lambda p: p["step"]):
        if point["accuracy"] >= threshold:
            return point
    return None


def describe(point: dict | None) -> str:
    return "never" if point is None else f"{point['seconds']:.1f} s (step {point['step']}, accuracy {point['accuracy']:.3f})"


# ----------------------------------------------------------------------------- the three runs


def load_cfg(args: argparse.Namespace, work: Path, name: str, extra: list[str]):
    from minirl.config import load_config

    return load_config(args.config, [
        f"run.threads={args.threads}", f"run.output_dir={work}", f"run.name={name}", "run.overwrite=true",
        "log.console=false", *args.overrides, *extra,
    ])


def build_sft(args: argparse.Namespace, work: Path) -> Path:
    """The shared SFT checkpoint: the config's cold start, as ``minirl sft`` runs it."""
    from minirl.sft import run_sft

    if args.sft_dir and (args.sft_dir / "config.json").is_file():
        print(f"[sft] reusing {args.sft_dir}", flush=True)
        return args.sft_dir
    output = args.sft_dir or work / "sft"
    started = time.perf_counter()
    run_sft(load_cfg(args, work, "sft", []), output=output, log=lambda line: print(f"[sft] {line}", flush=True))
    print(f"[sft] saved {output} in {time.perf_counter() - started:.0f}s", flush=True)
    return output


def rl_cfg(args: argparse.Namespace, work: Path, name: str):
    """The RL config both sides share (minirl runs it; TRL takes P, G, T, lr, seed and the data from it)."""
    return load_cfg(args, work, name, [
        "cold_start.enabled=false", f"optim.global_steps={args.steps}", f"eval.every_steps={args.eval_every}",
        "checkpoint.every_steps=0",
    ])


def run_minirl(args: argparse.Namespace, work: Path, sft_dir: Path) -> list[dict]:
    from minirl.loop import train
    from minirl.metrics import read_metrics

    cfg = rl_cfg(args, work, "minirl")
    started = time.perf_counter()
    train(cfg, start_from=str(sft_dir))
    print(f"[minirl] {args.steps} steps in {time.perf_counter() - started:.0f}s wall (evaluations included)", flush=True)
    return minirl_curve(read_metrics(cfg.run_dir))


def trl_env(threads: int) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    return env


def run_trl(args: argparse.Namespace, work: Path, sft_dir: Path) -> dict:
    """GRPOTrainer in the TRL venv; returns its snapshots (step, seconds, path), logs and settings."""
    from minirl.tasks import build_task_from_config

    python = ensure_venv()
    cfg = rl_cfg(args, work, "trl")
    r = cfg.rollout
    data = [{"prompt": p.text, "answer": p.answer} for p in build_task_from_config(cfg.task).train_prompts()]
    snapshot_dir = work / "trl_snapshots"
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    spec = {"model": str(sft_dir), "data": data, "threads": args.threads, "seed": cfg.run.seed, "prompts": r.prompts_per_step,
            "samples": r.samples_per_prompt, "new_tokens": r.max_new_tokens, "lr": cfg.optim.lr, "steps": args.steps,
            "eval_every": args.eval_every, "snapshot_dir": str(snapshot_dir), "output_dir": str(work / "trl_out")}
    (work / "trl_spec.json").write_text(json.dumps(spec))
    (work / "trl_side.py").write_text(TRL_SCRIPT)
    started = time.perf_counter()
    proc = subprocess.run([str(python), str(work / "trl_side.py"), str(work / "trl_spec.json")], check=False,
                          capture_output=True, text=True, env=trl_env(args.threads), cwd=work)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("TTQ_RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"TRL side failed (exit {proc.returncode})")
    print(f"[trl] {args.steps} steps in {time.perf_counter() - started:.0f}s wall (process start and snapshots included)",
          flush=True)
    return json.loads(lines[-1][len("TTQ_RESULT "):])


def evaluate_snapshots(args: argparse.Namespace, work: Path, sft_dir: Path, points: list[dict]) -> list[dict]:
    """minirl's held-out evaluation of the SFT checkpoint (step 0) and of each TRL snapshot."""
    import torch

    from minirl.loop import evaluate
    from minirl.runtime import build_engine, build_model, build_rewards, build_task, set_threads

    cfg = rl_cfg(args, work, "trl")
    set_threads(cfg.run.threads)
    model, tokenizer = build_model(cfg, path=str(sft_dir))
    task = build_task(cfg, model, tokenizer)
    engine = build_engine(cfg, model, tokenizer)
    curve = []
    with build_rewards(cfg, task) as rewards:
        curve.append({"step": 0, "seconds": 0.0, "accuracy": evaluate(engine, rewards, task, cfg, step=0)["eval/accuracy"]})
        for point in points:
            engine.load_weights(torch.load(point["path"], weights_only=True))
            accuracy = evaluate(engine, rewards, task, cfg, step=point["step"])["eval/accuracy"]
            curve.append({"step": point["step"], "seconds": point["seconds"], "accuracy": accuracy})
    return curve


# ----------------------------------------------------------------------------- report


def print_curves(curves: dict[str, list[dict]], threshold: float, reached: dict[str, dict | None]) -> None:
    for side, curve in curves.items():
        print(f"\n{side}: step, training seconds, held-out accuracy")
        for p in curve:
            print(f"  {p['step']:>5} {p['seconds']:>9.1f} s {p['accuracy']:>7.3f}")
    print(f"\ntime to held-out accuracy >= {threshold}:")
    for side, point in reached.items():
        print(f"  {side:<7} {describe(point)}")
    a, b = reached.get("minirl"), reached.get("TRL")
    if a and b and a["seconds"] > 0:
        print(f"  TRL / minirl: {b['seconds'] / a['seconds']:.2f}x")


def plot_curves(curves: dict[str, list[dict]], threshold: float, reached: dict[str, dict | None], title: str,
                path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for side, curve in curves.items():
        (line,) = ax.plot([p["seconds"] for p in curve], [p["accuracy"] for p in curve], "o-", label=side)
        if reached[side] is not None:
            ax.axvline(reached[side]["seconds"], color=line.get_color(), linestyle=":", alpha=0.7)
    ax.axhline(threshold, color="grey", linestyle="--", label=f"threshold {threshold}")
    ax.set(xlabel="training wall seconds (evaluation excluded)", ylabel="held-out accuracy (mean@n)", title=title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per side")
    parser.add_argument("--eval-every", type=int, default=10, help="held-out evaluation every k optimizer steps")
    parser.add_argument("--threshold", type=float, default=0.9, help="absolute held-out accuracy to reach")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--sft-dir", type=Path, default=None, help="the SFT checkpoint: reused if it exists, else written there")
    parser.add_argument("--work-dir", type=Path, default=None, help="run directories and snapshots (default: temporary)")
    parser.add_argument("--out", type=Path, default=None, help="write both curves and the result to this JSON file")
    parser.add_argument("--plot", type=Path, default=None, help="draw accuracy vs seconds, both sides, to this PNG")
    parser.add_argument("--quick", action="store_true", help="tiny model and task, 3 steps, evaluation every step (smoke test)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config (both sides)")
    args = parser.parse_args(argv)
    if args.quick:
        args.overrides = [*QUICK, *args.overrides]
        args.steps, args.eval_every = 3, 1
    if args.steps < 1 or args.eval_every < 1:
        parser.error("--steps and --eval-every must be >= 1")
    if not 0 <= args.threshold <= 1:
        parser.error("--threshold: an accuracy in [0, 1]")
    return args


def check_task(args: argparse.Namespace) -> None:
    """The TRL side's reward is the synthetic tasks' exact-match rule: refuse other tasks in one line."""
    from minirl.config import load_config

    task = load_config(args.config, args.overrides).task
    if task.kind not in SYNTHETIC_KINDS or task.reward_function:
        raise SystemExit(f"time_to_quality: the TRL side scores the synthetic tasks ({', '.join(SYNTHETIC_KINDS)}) "
                         f"only; got task.kind={task.kind} reward_function={task.reward_function}")


def main() -> None:
    args = parse_args()
    check_task(args)
    import torch

    from minirl.cli import _quiet_libraries

    torch.set_num_threads(args.threads)
    _quiet_libraries()
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__), *sys.argv[1:]])
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work_dir or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        sft_dir = build_sft(args, work)
        minirl = run_minirl(args, work, sft_dir)
        trl = run_trl(args, work, sft_dir)
        curves = {"minirl": minirl, "TRL": evaluate_snapshots(args, work, sft_dir, trl["points"])}
    if curves["minirl"] and curves["minirl"][0]["accuracy"] != curves["TRL"][0]["accuracy"]:
        print(f"warning: step 0 differs (minirl {curves['minirl'][0]['accuracy']:.3f}, "
              f"TRL {curves['TRL'][0]['accuracy']:.3f}): the evaluations are not the same", file=sys.stderr)
    reached = {side: time_to_threshold(curve, args.threshold) for side, curve in curves.items()}
    print_curves(curves, args.threshold, reached)
    print(f"\nTRL settings: {json.dumps(trl['settings'])}\ncommand: {command}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": command, "threshold": args.threshold, "steps": args.steps,
                                        "eval_every": args.eval_every, "threads": args.threads, "curves": curves,
                                        "reached": reached, "trl_settings": trl["settings"], "trl_logs": trl["logs"]},
                                       indent=1))
        print(f"wrote {args.out}")
    if args.plot:
        title = f"time to held-out accuracy {args.threshold}, {args.steps} steps, {args.threads} thread(s)"
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot_curves(curves, args.threshold, reached, title, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
