"""Building the pieces of a run from a config: model, tokenizer, task, engine, trainer, replay."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minirl.config import Config, ConfigError
from minirl.rollout.base import RolloutEngine
from minirl.tasks.base import Task
from minirl.trainer import Trainer


def environment() -> dict[str, Any]:
    """What decides a run's floats besides its config: library versions, the CPU or GPU, the source
    commit. Written to ``RUN_DIR/environment.jsonl`` at each start or resume and to the SFT summary,
    so results from two machines can be told apart (the same config can take another float path)."""
    import platform
    import subprocess
    from importlib import metadata

    from minirl.rollout.fast_decode import native_half_gemm

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "minirl": version("minirl"), "minirl_commit": commit, "python": platform.python_version(),
        "torch": torch.__version__, "transformers": version("transformers"), "numpy": np.__version__,
        "platform": platform.platform(), "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # ATen's SIMD kernels (AVX2, AVX512): their floats differ
        # a bf16/fp16 engine runs its matmuls as fp32 GEMMs where this is False (minirl.rollout.fast_decode)
        "cpu_native_half_gemm": native_half_gemm("cpu"),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


def build_model(cfg: Config, path: str | None = None) -> tuple[torch.nn.Module, Any]:
    """The trainer's fp32 model and its tokenizer (a preset, or a local HF directory)."""
    from minirl.models.io import load_model_and_tokenizer
    from minirl.tasks.chat import ChatTemplateError, apply_chat_setting, apply_prompt_truncation

    source = path or cfg.model.path or cfg.model.preset
    model, tokenizer = load_model_and_tokenizer(source, seed=cfg.run.seed, trust_remote_code=cfg.model.trust_remote_code)
    try:
        apply_chat_setting(tokenizer, cfg.task.chat_template, cfg.task.chat_template_kwargs)  # a template file: saved
    except ChatTemplateError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.task.prompt_truncation != "none":
        apply_prompt_truncation(tokenizer, prompt_token_limit(cfg, model), cfg.task.prompt_truncation)
    if cfg.task.calls_tools:  # their schemas in every prompt (minirl.rollout.tools)
        from minirl.rollout.tools import offered_schemas

        offered_schemas(tokenizer, cfg.task)
    return model, tokenizer


def prompt_token_limit(cfg: Config, model: torch.nn.Module | None) -> int | None:
    """The most tokens a prompt may have: ``task.max_prompt_tokens``, and the model's context less
    ``rollout.max_new_tokens``."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    limits = [n for n in (context and context - cfg.rollout.max_new_tokens, cfg.task.max_prompt_tokens) if n]
    return min(limits) if limits else None


def build_task(cfg: Config, model: torch.nn.Module | None = None, tokenizer: Any = None, log=print) -> Task:
    """The configured task; with a model and tokenizer, prompts too long for its context are bad rows, or cut
    (``task.prompt_truncation``, said in one line)."""
    from minirl.tasks import build_task_from_config
    from minirl.tasks.chat import ChatTemplateError, encode_prompt

    limit = prompt_token_limit(cfg, model)
    device, trust = cfg.cluster.device, cfg.model.trust_remote_code  # a reward model's
    cutting = cfg.task.prompt_truncation != "none"
    try:
        if limit and tokenizer is not None and not cutting:
            return build_task_from_config(
                cfg.task,
                max_prompt_tokens=limit,
                count_tokens=lambda prompt: len(encode_prompt(tokenizer, prompt)),
                reward_device=device, trust_remote_code=trust,
            )
        task = build_task_from_config(cfg.task, reward_device=device, trust_remote_code=trust)
        if cutting and limit and tokenizer is not None:
            prompts = task.train_prompts() + task.eval_prompts()
            cut = sum(len(encode_prompt(tokenizer, prompt, cut=False)) > limit for prompt in prompts)
            if cut:
                log(f"task: {cut} of {len(prompts)} prompts are longer than {limit} tokens; each is cut from the "
                    f"{cfg.task.prompt_truncation} (task.prompt_truncation)")
        return task
    except ChatTemplateError as exc:  # a chat row and a tokenizer without a template
        raise ConfigError(f"task.chat_template: {exc}") from None


def build_rewards(cfg: Config, task: Task) -> Any:
    """The task's verifier behind a ``RewardRunner`` (timeouts and fallback for user functions)."""
    from minirl.tasks.reward_runner import RewardRunner

    return RewardRunner.from_config(task, cfg.task)


def build_replay(cfg: Config, model: torch.nn.Module) -> Any | None:
    """A ``RoutingReplay`` when the run replays routes (and for routing diagnostics on MoE models)."""
    from minirl.models.io import is_moe

    if not is_moe(model):
        if cfg.moe.routing_replay != "none":
            name = cfg.model.path or cfg.model.preset
            raise ConfigError(f"moe.routing_replay: {cfg.moe.routing_replay} needs an MoE model; '{name}' is dense (set moe.routing_replay=none)")
        return None
    from minirl.moe import RoutingReplay, UnsupportedModelError

    try:
        return RoutingReplay(model)
    except UnsupportedModelError as exc:
        if cfg.moe.routing_replay != "none":
            raise ConfigError(f"moe.routing_replay: {exc}") from None
        return None


def build_engine(cfg: Config, model: torch.nn.Module, tokenizer: Any, *, device: str = "cpu") -> RolloutEngine:
    from minirl.rollout.native import NativeEngine
    from minirl.rollout.precision import check_fp4_block_size

    if cfg.rollout.precision == "fp4_e2m1":
        try:
            check_fp4_block_size(model, cfg.rollout.fp4_block_size)
        except ValueError as exc:
            raise ConfigError(f"rollout.fp4_block_size: {exc}") from None
    from minirl.tasks.chat import stop_token_ids

    compute_dtype = None
    if cfg.rollout.cuda_graphs and device == "cuda":
        from minirl.rollout.fast_decode import unsupported_reason
        from minirl.rollout.precision import WEIGHT_ONLY

        reason = unsupported_reason(model)
        if reason is not None:
            raise ConfigError(f"rollout.cuda_graphs: the CUDA-graph decode does not support this model ({reason}); set false")
        if cfg.rollout.precision in WEIGHT_ONLY:  # fp8/fp4 weights, bf16 activations: the grouped GEMM's dtype
            compute_dtype = "bf16"
    return NativeEngine(
        model,
        eos_token_id=stop_token_ids(tokenizer, model),  # the tokenizer's EOS and generation_config's
        stop_strings=tuple(cfg.task.stop_strings),
        pad_token_id=tokenizer.pad_token_id,
        precision=cfg.rollout.precision,
        fp8_scale=cfg.rollout.fp8_scale,
        fp4_block_size=cfg.rollout.fp4_block_size,
        kv_cache_precision=cfg.rollout.kv_cache_precision,
        tokenizer=tokenizer,
        device=device,
        sample_seeding=cfg.cluster.sample_seeding,
        cuda_graphs=cfg.rollout.cuda_graphs,
        compute_dtype=compute_dtype,
    )


def prepare_for_training(cfg: Config, model: torch.nn.Module) -> None:
    """LoRA adapters and gradient checkpointing on the trainer's model (``minirl.models.lora``),
    after the engine and the routing replay were built from the plain model."""
    from minirl.models.lora import enable_gradient_checkpointing

    add_configured_lora(cfg, model)
    if cfg.optim.gradient_checkpointing:
        enable_gradient_checkpointing(model)


def add_configured_lora(cfg: Config, model: torch.nn.Module) -> None:
    """``model.lora``'s adapters on ``model`` (once; none without ``model.lora``): the trainer's model, and on FSDP2
    ranks also before sharding and on the controller's mirror of the weights."""
    from minirl.models.lora import add_lora, has_lora

    lora = cfg.model.lora
    if lora is not None and not has_lora(model):
        try:
            add_lora(model, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules,
                     adapt_routers=lora.adapt_routers, target_parameters=lora.target_parameters)
        except ValueError as exc:  # peft's "not found" is of the modules
            raise ConfigError(f"model.lora.{getattr(exc, 'field', 'target_modules')}: {exc}") from None


def build_trainer(cfg: Config, model: torch.nn.Module, replay: Any | None, *, deterministic: bool = True,
                  logits_temperature: float | None = None, collective: bool = False) -> Trainer:
    """The trainer of ``cfg.optim``; ``deterministic``: dropout and router jitter off (RL; see
    ``minirl.trainer.disable_stochastic_layers``). LoRA and gradient checkpointing are applied to
    ``model`` first (``prepare_for_training``). ``logits_temperature``: what the trainer's logits are divided by
    (None: ``rollout.temperature`` under ``optim.score_at_rollout_temperature``, else 1; SFT passes 1).
    ``collective``: an FSDP group's rank (``Trainer``'s ``collective``)."""
    from minirl.precision import LossScale, set_tf32

    o = cfg.optim
    if o.allow_tf32:
        set_tf32(True)
    prepare_for_training(cfg, model)
    return Trainer(
        model,
        lr=o.lr,
        weight_decay=o.weight_decay,
        betas=(o.adam_beta1, o.adam_beta2),
        eps=o.adam_eps,
        grad_clip_norm=o.grad_clip_norm,
        warmup_updates=o.warmup_updates,
        lr_schedule=o.lr_schedule,
        total_updates=o.global_steps * cfg.updates_per_step,
        min_lr_ratio=o.min_lr_ratio,
        micro_batch_sequences=o.micro_batch_sequences,
        micro_batch_max_tokens=o.micro_batch_max_tokens,
        replay=replay,
        deterministic=deterministic,
        precision=o.precision,
        loss_scale=LossScale.of(o),
        update_guard=o.update_guard,
        adamw_impl=o.adamw_impl,
        padding_free=o.padding_free,
        shared_prompt=o.shared_prompt,
        logprob_chunk_tokens=o.logprob_chunk_tokens,
        logits_temperature=logits_temperature if logits_temperature is not None else
        cfg.rollout.temperature if o.score_at_rollout_temperature else 1.0,
        collective=collective,
    )



def kernel_change(run_dir: Path) -> str | None:
    """One line when this process would continue ``run_dir`` on other CPU kernels than its last start
    or resume (``cpu_capability`` in ``environment.jsonl``: ATen's AVX2 and AVX512 kernels round
    differently, so the resumed run is no longer bitwise the uninterrupted one), else None."""
    path = run_dir / "environment.jsonl"
    if not path.is_file():
        return None
    last: dict[str, Any] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            last = json.loads(line) or last
        except json.JSONDecodeError:
            continue
    before, now = last.get("cpu_capability"), torch.backends.cpu.get_cpu_capability()
    if before is None or before == now or last.get("cuda") or torch.cuda.is_available():
        return None
    return (f"warning: {run_dir} ran on {before} CPU kernels, this process uses {now}: the floats from here on differ "
            f"from an uninterrupted run (set ATEN_CPU_CAPABILITY={str(before).lower()} to match)")

@dataclass
class DataOrder:
    """Which training prompts each global step uses: a seeded permutation, epoch after epoch."""

    num_prompts: int
    seed: int
    epoch: int = 0
    position: int = 0

    def _permutation(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_prompts, generator=generator).tolist()

    def next(self, count: int) -> list[int]:
        chosen: list[int] = []
        order = self._permutation()
        while len(chosen) < count:
            if self.position >= self.num_prompts:
                self.epoch, self.position = self.epoch + 1, 0
                order = self._permutation()
            take = min(count - len(chosen), self.num_prompts - self.position)
            chosen += order[self.position : self.position + take]
            self.position += take
        return chosen
