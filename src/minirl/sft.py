"""Cold start: supervised fine-tuning on teacher traces (paper §4.5 / §5.3 in miniature), or on your data.

The paper cold-starts from SFT data distilled from three different teachers; here a synthetic
task writes worked solutions in one of its ``styles`` and the model learns them by token-level
cross-entropy on the completion (including EOS). With ``cold_start.data`` the examples are the
user's rows instead, in TRL's SFT shapes (``minirl.sft_data``: prompt-completion or messages; loss
on the completion / assistant tokens by default). The result is a standard HF checkpoint that
``minirl train`` starts from (``--start-from`` or ``model.path``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from minirl.batching import collate
from minirl.config import Config, ConfigError, dump_config
from minirl.runtime import (
    build_model,
    build_task,
    build_trainer,
    environment,
    seed_everything,
    set_threads,
)
from minirl.sft_target import accuracy_target
from minirl.tasks.base import Task, TeacherTask
from minirl.tasks.chat import encode_prompt
from minirl.types import Batch, Completion


def teacher_examples(task: Task, tokenizer: Any, style: str, count: int, seed: int) -> list[Completion]:
    """``count`` (prompt, worked solution + EOS) pairs, drawn with replacement from the train split."""
    styles = getattr(task, "styles", ())
    if style not in styles:
        allowed = ", ".join(styles) or "none (this task has no teacher)"
        hint = "" if styles else "; for your own data set cold_start.data to a file of prompt/completion or messages rows"
        raise ConfigError(f"cold_start.style: {style!r} is not a style of task '{task.name}' (allowed: {allowed}){hint}")
    # It has styles, so it is a TeacherTask: cast, not isinstance, because a CustomRewardTask forwards both
    # through __getattr__, which a Protocol isinstance check does not see from Python 3.12 on.
    teacher = cast(TeacherTask, task)
    prompts = teacher.train_prompts()
    rng = random.Random(seed)
    examples = []
    for index in range(count):
        prompt = prompts[rng.randrange(len(prompts))]
        prompt_ids = encode_prompt(tokenizer, prompt)  # exactly as the engine tokenises it
        solution_ids = tokenizer.encode(teacher.teacher_solution(prompt, style), add_special_tokens=False)
        completion_ids = solution_ids + [tokenizer.eos_token_id]
        examples.append(
            Completion(index, 0, prompt_ids, completion_ids, torch.zeros(len(completion_ids)), "eos")
        )
    return examples


def sft_examples(cfg: Config, task: Task, tokenizer: Any, seed: int) -> tuple[list[Any], Callable[[list[Any]], Batch]]:
    """The SFT examples and how to batch them: the user's ``cold_start.data`` (``minirl.sft_data``:
    TRL's prompt-completion or messages rows), else the task's teacher traces in ``cold_start.style``."""
    c = cfg.cold_start
    if c.data:
        from minirl.sft_data import pack, read_sft_examples, sft_batch

        rows = read_sft_examples(c.data, tokenizer, loss_on=c.loss_on, columns=(c.prompt_column, c.completion_column),
                                 chat_prompts=c.chat_prompts, split=c.split, config=c.dataset_config)
        if c.packing:
            rows = pack(rows, c.max_length)
        return rows, lambda picked: sft_batch(picked, tokenizer.pad_token_id, c.max_length)
    examples = teacher_examples(task, tokenizer, c.style, c.examples, seed=seed)
    return examples, lambda picked: collate(picked, torch.zeros(len(picked)), pad_token_id=tokenizer.pad_token_id)


def cross_entropy_objective(minibatch: Batch):
    tokens = max(int(minibatch.mask.sum()), 1)

    def objective(logp: torch.Tensor, micro: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        loss = -(logp * micro.mask).sum() / tokens
        return loss, {}

    return objective


def run_sft(cfg: Config, output: Path | None = None, log=print) -> Path:
    """Fine-tune ``cfg.model`` on teacher traces of ``cfg.task``; returns the checkpoint directory."""
    # Over 60 lines: the SFT loop with its two stopping rules, faults, progress and summary in one readable place.
    from minirl.models.io import dtype_on_disk, save_checkpoint

    c = cfg.cold_start
    seed = cfg.run.seed if c.seed is None else c.seed
    set_threads(cfg.run.threads)
    seed_everything(seed)
    output = Path(output or c.output or cfg.run_dir / "sft")
    model, tokenizer = build_model(cfg)
    task = build_task(cfg, model, tokenizer)  # the RL task: teacher traces, and held-out accuracy (until_accuracy)
    examples, make_batch = sft_examples(cfg, task, tokenizer, seed)
    sft_cfg = cfg.model_copy(deep=True)
    sft_cfg.optim.lr, sft_cfg.optim.warmup_updates, sft_cfg.optim.weight_decay = c.lr, c.warmup_steps, 0.0
    sft_cfg.optim.lr_schedule = "constant"  # the RL schedule's horizon is RL's
    trainer = build_trainer(sft_cfg, model, replay=None, deterministic=False, logits_temperature=1.0)  # SFT keeps a model's dropout
    rng = random.Random(seed + 1)
    started, last_print = time.perf_counter(), 0.0
    losses: list[float] = []
    reached = False
    stack = contextlib.ExitStack()
    target = accuracy_target(cfg, model, tokenizer, task, stack)  # cold_start.until_accuracy: None when off
    kept = SftState(output / SFT_STATE, sft_cache_key(cfg), c.checkpoint_every_steps)
    first = kept.restore(model, trainer, rng, losses, target, log)  # 1, or the step after the state kept
    for step in range(first, c.steps + 1):
        kept.keep(step, model, trainer, rng, losses, target)  # every checkpoint_every_steps, what steps < step left
        batch = make_batch([examples[rng.randrange(len(examples))] for _ in range(c.batch_sequences)])
        update = trainer.update(batch, cross_entropy_objective(batch))
        if update.fault is not None:  # a numerical fault: skipped and counted as in RL (``Trainer._skip``)
            log(f"sft step {step}: skipped an update: {update.fault}")
            if trainer.consecutive_faults >= cfg.optim.max_consecutive_faults:
                from minirl.loop import NumericalFaultStop

                raise NumericalFaultStop(f"sft step {step}: {trainer.consecutive_faults} updates in a row skipped "
                                         f"(optim.max_consecutive_faults={cfg.optim.max_consecutive_faults}); no SFT checkpoint written")
            continue
        losses.append(update.loss)
        window = window_loss(losses, c.loss_window_steps)
        reached = c.until_loss is not None and window is not None and window < c.until_loss
        now = time.perf_counter()
        if now - last_print > 5 or step == c.steps or reached:
            shown = f"  (mean of last {c.loss_window_steps}: {window:.4f})" if window is not None else ""
            log(f"sft step {step}/{c.steps}  loss {losses[-1]:.4f}{shown}  ({now - started:.0f}s)")
            last_print = now
        if reached:
            log(f"sft: loss below cold_start.until_loss={c.until_loss} after {step} steps")
            break
        if target is not None and target.reached(step):
            log(f"sft: held-out accuracy {target.history[-1][1]:.3f} >= cold_start.until_accuracy={c.until_accuracy} "
                f"after {step} steps")
            break
    else:
        if c.until_loss is not None or target is not None:
            what = f"loss still above cold_start.until_loss={c.until_loss}" if target is None else (
                f"held-out accuracy still below cold_start.until_accuracy={c.until_accuracy}")
            log(f"sft: warning: {what} after all {c.steps} steps")
    stack.close()
    save_checkpoint(model, tokenizer, output, dtype=dtype_on_disk(cfg.model.path))  # in the dtype it came in
    kept.path.unlink(missing_ok=True)  # done: the same command trains it again from step 1
    dump_config(cfg, output / "minirl_sft_config.yaml")
    summary = {"style": c.style if not c.data else None, "data": c.data, "steps": len(losses),
               "final_loss": losses[-1] if losses else None,
               "window_loss": window_loss(losses, c.loss_window_steps), "until_loss": c.until_loss,
               "reached": reached if c.until_loss is not None else None,
               "seconds": time.perf_counter() - started, "environment": environment(),
               **(target.summary() if target is not None else {})}
    (output / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return output


SUMMARY = "minirl_sft_summary.json"


def _numpy_state() -> tuple[Any, ...]:
    """numpy's global RNG state with its key array as a tensor (``torch.load(weights_only=True)`` takes it)."""
    name, keys, position, has_gauss, gauss = cast(tuple[str, Any, int, int, float], np.random.get_state())
    return name, torch.from_numpy(keys.copy()), int(position), int(has_gauss), float(gauss)
SFT_STATE = "sft_state.pt"


@dataclass
class SftState:
    """``cold_start.checkpoint_every_steps``: the SFT's state kept in ``path`` (weights, optimizer and schedule, the
    data order's and the global RNGs, the losses and the accuracy rule's history), written atomically every
    ``every`` steps; the same configuration (``key``: ``sft_cache_key``) continues from it, bitwise."""

    path: Path
    key: str
    every: int

    def keep(self, step: int, model: Any, trainer: Any, rng: random.Random, losses: list[float], target: Any) -> None:
        """Before ``step``: keep what steps < ``step`` left, when ``step - 1`` is a multiple of ``every``."""
        if not self.every or step == 1 or (step - 1) % self.every:
            return
        state = {"key": self.key, "step": step - 1, "model": model.state_dict(), "trainer": trainer.checkpoint_state(),
                 "rng": {"data": rng.getstate(), "torch": torch.get_rng_state(), "python": random.getstate(),
                         "numpy": _numpy_state()},
                 "losses": list(losses), "history": [] if target is None else [list(h) for h in target.history]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        torch.save(state, tmp)
        os.replace(tmp, self.path)

    def restore(self, model: Any, trainer: Any, rng: random.Random, losses: list[float], target: Any,
                log: Callable[[str], Any]) -> int:
        """The step to start at: 1, or the one after the state kept in ``path`` (loaded) when it is this
        configuration's; another configuration's is said and left to be replaced."""
        if not self.path.is_file():
            return 1
        state = torch.load(self.path, weights_only=True)  # tensors and plain types only: loading it runs no code
        if state.get("key") != self.key:
            log(f"sft: {self.path} is another configuration's state; starting from step 1")
            return 1
        model.load_state_dict(state["model"])
        trainer.load_checkpoint_state(state["trainer"])
        rng.setstate(state["rng"]["data"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        name, keys, position, has_gauss, gauss = state["rng"]["numpy"]
        np.random.set_state((name, keys.numpy(), position, has_gauss, gauss))
        losses[:] = state["losses"]
        if target is not None:
            target.history[:] = [tuple(h) for h in state["history"]]
        log(f"sft: continuing from its state after step {state['step']} ({self.path})")
        return int(state["step"]) + 1


def window_loss(losses: list[float], window: int) -> float | None:
    """Mean of the last ``window`` losses; ``None`` until there are that many."""
    if len(losses) < window:
        return None
    return sum(losses[-window:]) / window


def sft_cache_key(cfg: Config) -> str:
    """Hash of everything ``run_sft`` depends on: model, task, cold-start knobs, optimizer, seed, threads."""
    parts = {
        "model": _without_new_defaults(cfg.model),
        "task": _without_new_defaults(cfg.task),
        "cold_start": cfg.cold_start.model_dump(mode="json", exclude={"enabled", "output", "cache_dir", "seed",
                                                                      "checkpoint_every_steps", *(
            ("until_loss", "loss_window_steps") if cfg.cold_start.until_loss is None else ()), *(
            ("until_accuracy", "accuracy_every_steps") if cfg.cold_start.until_accuracy is None else ()), *(
            ("data", "loss_on", "packing", "max_length") if cfg.cold_start.data is None else ()), *(
            ("dataset_config", "split") if (cfg.cold_start.dataset_config, cfg.cold_start.split) == (None, "train")
            else ()), *(
            ("prompt_column", "completion_column", "chat_prompts") if cfg.cold_start.data is None or (
                (cfg.cold_start.prompt_column, cfg.cold_start.completion_column, cfg.cold_start.chat_prompts)
                == ("prompt", "completion", False)) else ())}),  # keys of earlier caches
        **({"evaluation": {"eval": _without_new_defaults(cfg.eval, also={"every_steps"}),
                         "rollout": _evaluation_rollout(cfg)}}
           if cfg.cold_start.until_accuracy is not None else {}),  # the stopping rule evaluates like RL
        "optim": cfg.optim.model_dump(mode="json", include={"adam_beta1", "adam_beta2", "adam_eps", "grad_clip_norm",
                                                             "micro_batch_sequences", "max_consecutive_faults", *(
            ("micro_batch_max_tokens",) if cfg.optim.micro_batch_max_tokens is not None else ()), *(
            ("precision",) if cfg.optim.precision != "fp32" else ()), *(
            ("adamw_impl",) if cfg.optim.adamw_impl != "default" else ()), *(
            ("padding_free",) if cfg.optim.padding_free else ()), *(
            ("shared_prompt",) if cfg.optim.shared_prompt else ())}),  # keys of earlier caches
        "seed": cfg.run.seed if cfg.cold_start.seed is None else cfg.cold_start.seed,
        "threads": cfg.run.threads,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


NEW_KEYS_AT_DEFAULT = ("reward_functions", "prompt_column", "answer_column", "chat_template", "stop_strings",
                       "accuracy_threshold", "lora", "chat_template_kwargs", "top_k", "min_p", "max_prompt_tokens",
                       "repetition_penalty", "prompt_truncation", "dataset_config", "train_split", "eval_split",
                       "system_prompt", "chat_prompts", "tools", "max_tool_iterations", "tool_parser",
                       "environment", "tool_timeout_s", "tool_result_max_chars",
                       "tool_result_keep", "max_tool_calls_per_turn", "tool_config")
"""Keys added after SFT caches were first made: left out of the key while at their default, so earlier caches still match."""


def _without_new_defaults(section: Any, also: set[str] | None = None) -> dict[str, Any]:
    """``section`` as a dict without the keys added at their default since caches were first made (and ``also``:
    keys that do not change what SFT makes, e.g. RL's ``eval.every_steps``)."""
    default = type(section)()
    dump = section.model_dump(mode="json", exclude={key for key in NEW_KEYS_AT_DEFAULT if key in type(section).model_fields
                                                     and getattr(section, key) == getattr(default, key)} | (also or set()))
    for entry in dump.get("reward_functions", []):  # a reward function's entry from before reward models and keys
        for new, default in (("model", None), ("key", None), ("convention", "auto")):
            if entry.get(new) == default:
                entry.pop(new, None)
    return dump


#: the rollout keys the accuracy stopping rule's evaluation reads (the engine it builds and the length it samples);
#: not ``prompts_per_step`` / ``samples_per_prompt`` / ``temperature`` / ``top_p``, which only RL's rollouts use, so
#: arms that differ only in N (prompts_per_step = N mini-batches) share one cold start
EVALUATION_ROLLOUT_KEYS = ("max_new_tokens", "precision", "fp8_scale", "fp4_block_size", "kv_cache_precision")


def _evaluation_rollout(cfg: Config) -> dict[str, Any]:
    keys = EVALUATION_ROLLOUT_KEYS + (("cuda_graphs",) if cfg.rollout.cuda_graphs else ())
    return cfg.rollout.model_dump(mode="json", include=set(keys))


def cached_sft(cfg: Config, cache_dir: Path, log=print) -> Path:
    """``run_sft`` once per key under ``cache_dir`` (a file lock makes concurrent runs wait for the first)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = sft_cache_key(cfg)
    path = cache_dir / key
    with open(cache_dir / f"{key}.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / "minirl_sft_config.yaml").is_file():
            done = json.loads((path / SUMMARY).read_text()) if (path / SUMMARY).is_file() else {}
            fit = f" ({done['steps']} steps, final loss {done['final_loss']:.4f})" if done else ""
            log(f"cold start: reusing SFT checkpoint {path}{fit}")
            return path
        tmp = cache_dir / f".{key}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        run_sft(cfg, tmp, log=log)
        os.replace(tmp, path)
    return path
