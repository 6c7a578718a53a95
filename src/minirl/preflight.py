"""Check before working: everything the config alone decides, before the SFT cold start, any model
build, Ray's start-up or a vLLM import (``minirl train`` calls ``preflight`` first). Every check runs, and each
mistake found is one line of the ``ConfigError`` (the command line prints each as its own ``minirl: error:``).

* the run directory can be made and written (not under a regular file, not read-only);
* sizes: ``rollout.max_new_tokens`` (and ``eval.max_new_tokens``) fit the model's context; a
  step's KV cache and per-token records fit the memory this machine has;
* engine backend against replay and precision: vLLM has no switch for ``fp8_e5m2`` / ``fp4_e2m1``
  weights; vLLM returns routed experts (R3, ``routing/*`` of MoE models) only with Model Runner V2
  on a CUDA GPU, so without one R3 and routing metrics are refused, as is
  ``VLLM_USE_V2_MODEL_RUNNER=1`` (vLLM's own hint, which fails there in a pydantic traceback);
* devices and resources: ``cluster.device=cuda`` needs a GPU here; a Ray instance started here has
  this machine's CPUs and GPUs, so the actors' reservations are checked against them before
  ``ray.init`` (Ray's own check comes after a minute of start-up).

The model's dimensions come from its config alone (a preset's, or ``config.json`` of a local
directory, read as JSON: no remote code runs); a directory that cannot be read is left to the
loader, which names what is wrong with it.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minirl.config import Config, ConfigError

GIB = 1024**3
BYTES_PER_RECORDED_TOKEN = 48  # token id in a Python list (~36 B), its log-prob and mask in tensors
BYTES_PER_SEQUENCE = 4096  # a completion's Python objects (prompt ids, dataclass, per-row tensors): a floor, not measured
VLLM_PRECISIONS = ("fp32", "bf16", "fp16", "fp8_e4m3")  # minirl.rollout.vllm_engine.DTYPES


@dataclass(frozen=True)
class ModelDims:
    """What a run's memory depends on, from the model's config."""

    context_tokens: int | None
    layers: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    moe: bool


def model_dims(cfg: Config) -> ModelDims | None:
    """The dimensions of ``cfg.model`` from its config (no weights), or None when unreadable."""
    from minirl.models.presets import PRESETS, preset_config

    source = cfg.model.path or cfg.model.preset
    if source in PRESETS:
        config: dict[str, Any] = preset_config(source, vocab_size=256, pad_id=0, eos_id=1).to_dict()
    else:
        try:
            config = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(config, dict):
            return None
        config = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
    heads = int(config.get("num_attention_heads") or 1)
    hidden = int(config.get("hidden_size") or 0)
    experts = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    return ModelDims(
        context_tokens=config.get("max_position_embeddings"),
        layers=int(config.get("num_hidden_layers") or 0),
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or (hidden // heads if heads else 0)),
        vocab_size=int(config.get("vocab_size") or 0),
        moe=any(int(config.get(field) or 0) > 0 for field in experts),
    )


def preflight(cfg: Config) -> None:
    """Every check the config alone decides, all of them: ``ConfigError`` with one line (naming the key) per failure,
    so that a run meeting a new machine learns everything it must change at once."""
    found: list[str] = []

    def check(run: Callable[[], Any]) -> Any:
        try:
            return run()
        except ConfigError as error:
            found.append(str(error))
            return None

    check(lambda: check_run_dir(cfg.run_dir))
    dims = check(lambda: model_dims(cfg))
    if dims is not None:
        check(lambda: check_sizes(cfg, dims))
    check(lambda: check_engine_backend(cfg, dims))
    check(lambda: check_devices(cfg))
    check(lambda: check_optional_packages(cfg))
    if found:
        raise ConfigError("\n".join(found))


def check_run_dir(run_dir: Path) -> None:
    """The run directory can be created and written: not under a regular file, not read-only, not full."""
    for parent in [run_dir, *run_dir.parents]:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"run.output_dir: {parent} is a file, not a directory, so the run directory {run_dir} "
                              "cannot be made there; choose another run.output_dir")
        if parent.is_dir():
            break
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir) as probe:
            probe.write(b"minirl")
            probe.flush()
    except OSError as exc:
        raise ConfigError(f"run.output_dir: cannot write in {run_dir} ({exc.strerror or exc}); "
                          "choose a writable run.output_dir") from None


def check_sizes(cfg: Config, dims: ModelDims) -> None:
    """Token budgets against the context; a step's rollout memory against this machine's."""
    context = dims.context_tokens
    r = cfg.rollout
    if context:
        over = [f"{key}: {value} new tokens do not fit the model's context of {context} tokens "
                f"(max_position_embeddings; a prompt needs at least one): at most {context - 1}"
                for key, value in (("rollout.max_new_tokens", r.max_new_tokens), ("eval.max_new_tokens", cfg.eval.max_new_tokens))
                if value is not None and value >= context]
        if over:  # each said (the memory estimate below would only repeat them)
            raise ConfigError("\n".join(over))
    per_round = r.filter_groups_prompts_per_round if r.filter_groups else 0  # dynamic sampling's rounds
    key = "rollout.filter_groups_prompts_per_round" if per_round > r.prompts_per_step else "rollout.prompts_per_step"
    sequences = -(-max(r.prompts_per_step, per_round) * r.samples_per_prompt // cfg.cluster.rollout_engines)
    kv_bytes = {"fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1}.get(r.kv_cache_precision, 4 if r.precision == "fp32" else 2)
    per_token = dims.layers * 2 * dims.kv_heads * dims.head_dim * kv_bytes + BYTES_PER_RECORDED_TOKEN
    needed = sequences * (r.max_new_tokens * per_token + dims.vocab_size * 4 + BYTES_PER_SEQUENCE)  # + fp32 logits
    available = available_memory(cfg)
    if available is not None and needed > available:
        raise ConfigError(
            f"{key}: a step's rollout needs at least {needed / GIB:.1f} GiB ({sequences} sequences "
            f"({key} x samples_per_prompt) x {r.max_new_tokens} new tokens (rollout.max_new_tokens) x "
            f"{per_token} bytes of KV cache and records) but this machine has {available / GIB:.1f} GiB available; lower them"
        )


def available_memory(cfg: Config) -> int | None:
    """Bytes the rollout may use: free GPU memory (cluster.device=cuda), else the host's available memory."""
    if cfg.cluster.device == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def check_engine_backend(cfg: Config, dims: ModelDims | None) -> None:
    """vLLM's switches against ``rollout.*`` and ``moe.*`` (no vLLM import: it may not be installed here)."""
    if cfg.cluster.engine_backend != "vllm":
        return
    if cfg.rollout.precision not in VLLM_PRECISIONS:
        raise ConfigError(f"rollout.precision: {cfg.rollout.precision} has no vLLM switch; use "
                          f"{', '.join(VLLM_PRECISIONS)} with engine_backend=vllm, or engine_backend=native")
    gpu = torch.cuda.is_available() or (cfg.cluster.backend == "ray" and cfg.cluster.ray_address is not None)
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" and not gpu:
        raise ConfigError("VLLM_USE_V2_MODEL_RUNNER=1: vLLM's Model Runner V2 needs Triton on a CUDA GPU and there is "
                          "none here; unset it (routed experts then need engine_backend=native)")
    routes = dims is not None and dims.moe and (cfg.moe.routing_replay == "R3" or cfg.moe.routing_metrics)
    if routes and not gpu:
        raise ConfigError(
            f"moe.routing_replay={cfg.moe.routing_replay}, moe.routing_metrics={str(cfg.moe.routing_metrics).lower()}: vLLM returns "
            "routed experts only with Model Runner V2 on a CUDA GPU, which this machine lacks; set "
            "moe.routing_metrics=false (and no R3) or use cluster.engine_backend=native"
        )


def check_devices(cfg: Config) -> None:
    """A GPU where one is asked for; a Ray instance started here within this machine's CPUs and GPUs."""
    c = cfg.cluster
    if c.device == "cuda" and (c.backend == "local" or c.ray_address is None) and not torch.cuda.is_available():
        raise ConfigError("cluster.device: cuda is not available on this machine; use cpu")
    if c.backend != "ray" or c.ray_address is not None:
        return  # joining a cluster: Ray checks its resources once joined (``ray_backend.check_resources``)
    have_cpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    have_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need_cpu = c.rollout_engines * c.cpus_per_engine + c.trainer_ranks * c.cpus_per_trainer_rank
    need_gpu = c.rollout_engines * c.gpus_per_engine + c.trainer_ranks * c.gpus_per_trainer_rank
    if need_cpu > have_cpu + 1e-9 or need_gpu > have_gpu + 1e-9:
        raise ConfigError(
            f"cluster.cpus_per_engine: {c.rollout_engines} engines and {c.trainer_ranks} trainer ranks reserve "
            f"{need_cpu:g} CPUs and {need_gpu:g} GPUs but the Ray instance started here would have this machine's "
            f"{have_cpu} CPUs and {have_gpu} GPUs; lower cluster.cpus_per_*/gpus_per_* or cluster.trainer_ranks, join a "
            "cluster (cluster.ray_address), or train in one process here (cluster.backend=local cluster.trainer_ranks=1)"
        )


#: config key -> (package a set value needs, the extra that installs it)
OPTIONAL_PACKAGES = {"model.lora": ("peft", "lora")}


def check_optional_packages(cfg: Config) -> None:
    """A feature whose library is an optional extra: one line naming the key and the install command."""
    import importlib.util

    if cfg.model.lora is not None and importlib.util.find_spec("peft") is None:
        package, extra = OPTIONAL_PACKAGES["model.lora"]
        raise ConfigError(f"model.lora: LoRA needs the {package} package, which is not installed; "
                          f"pip install 'minirl[{extra}]' (or {package})")


def is_storage_error(exc: BaseException) -> bool:
    """An ``OSError`` of the machine's storage (full, read-only, no permission), not of minirl."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
