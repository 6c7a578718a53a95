"""prime-rl: the TOML file of its ``rl`` entry point (``uv run rl @ rl.toml``: the combined ``RLConfig`` of
``[trainer]``, ``[orchestrator]``, ``[inference]`` and the shared top-level keys ``[model] name``, ``max_steps``,
``seq_len``, ``max_async_level``, ``[ckpt]``, ``[wandb]``, ``output_dir``), read against prime-rl's defaults
(``src/prime_rl/configs/{rl,orchestrator,trainer}.py``: PrimeIntellect-ai/prime-rl at 0002457 (rl.py), 0083212
(orchestrator.py), 0081765 (trainer.py)); ``key=value`` words after the file override it (dotted, as prime-rl's own
``--trainer.optim.lr`` flags).

A shared key wins over the component's (prime-rl's ``auto_setup_*`` validators copy it into both), but for ``seq_len``,
where a component's own value wins (its newer ``auto_setup_seq_len``). The environment
(``[[orchestrator.env]] id`` + ``args``; the older ``[orchestrator.environment]``) is a verifiers environment:
``task.path: verifiers:ID`` and the ``minirl.tasks.verifiers_env:rubric`` reward entry (``minirl.tasks.verifiers_env``).

prime-rl's loss (``[trainer.loss]``, ``type = "default"``: the importance ratio pi_theta / mu against the engine's
log-probs, tokens masked outside ``[1 - mask_low, 1 + mask_high]`` (``ipo_mask_*``, later ``dppo_mask_*``), and a KL term
``kl_tau``; its advantages: reward less the group mean) has no minirl equivalent, so the run trains with minirl's
MiniRL and the header names the loss keys that drops.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from minirl.config import ConfigError
from minirl.peers.common import (
    Objective,
    Peer,
    Translation,
    apply_objective,
    flatten,
    leftovers,
    note_local_path,
    parse_value,
)

PRIME_RL_DEFAULTS: dict[str, Any] = {
    "model.name": "Qwen/Qwen3-0.6B", "max_steps": None, "seq_len": None, "max_async_level": None, "output_dir": "outputs",
    "ckpt.interval": None, "ckpt.resume_step": None, "ckpt.keep_last": None, "wandb.project": "prime-rl",
    "wandb.name": None, "trainer.model.name": None, "orchestrator.model.name": None, "orchestrator.eval.env": None,
    # [orchestrator]
    "orchestrator.batch_size": 128, "orchestrator.token_batch_size": None, "orchestrator.rollouts_per_example": 1,
    "orchestrator.seq_len": 2048, "orchestrator.max_async_level": 1, "orchestrator.strict_async_level": False,
    "orchestrator.max_off_policy_steps": 8, "orchestrator.seed": 42, "orchestrator.max_steps": None,
    "orchestrator.sampling.temperature": None, "orchestrator.sampling.max_tokens": None,
    "orchestrator.sampling.repetition_penalty": 1.0, "orchestrator.sampling.min_tokens": 0,
    "orchestrator.sampling.seed": None, "orchestrator.env": None, "orchestrator.environment.id": None,
    "orchestrator.environment.args": None, "orchestrator.buffer.online_difficulty_filtering": False,
    "orchestrator.eval.interval": 100, "orchestrator.eval.rollouts_per_example": 1,
    "orchestrator.eval.num_examples": -1, "orchestrator.eval.sampling.temperature": None,
    # [trainer]
    "trainer.max_steps": None, "trainer.max_async_level": 1, "trainer.enable_router_replay": False,
    "trainer.model.seq_len": 2048, "trainer.optim.type": "adamw", "trainer.optim.lr": 1e-6,
    "trainer.optim.weight_decay": 0.01, "trainer.optim.max_norm": 1.0, "trainer.optim.betas1": 0.9,
    "trainer.optim.betas2": 0.999, "trainer.scheduler.type": "constant", "trainer.scheduler.warmup_steps": 10,
    "trainer.scheduler.decay_steps": 10, "trainer.scheduler.min_lr": 0.0, "trainer.loss.type": "default",
    "trainer.loss.ipo_mask_low": 0.2, "trainer.loss.ipo_mask_high": 0.2, "trainer.loss.dppo_mask_low": 0.2,
    "trainer.loss.dppo_mask_high": 0.2, "trainer.loss.adv_tau": 1.0, "trainer.loss.teacher_tau": 0.0,
    "trainer.loss.kl_tau": 1e-3, "trainer.model.lora.rank": None, "trainer.model.lora.alpha": 32.0,
    "trainer.model.lora.dropout": 0.0, "trainer.model.lora.target_modules": None,
}
"""prime-rl's defaults of the keys the translation reads (a flattened ``RLConfig``)."""

PRIME_RL_IGNORED = re.compile(
    r"^(inference\..*|teacher_inference\..*|deployment\..*|slurm\..*|log\..*|weight_broadcast\..*|bench|dry_run|"
    r"clean_output_dir|max_model_len|wandb\.offline|(trainer|orchestrator)\.(log|wandb|weight_broadcast|"
    r"rollout_transport|heartbeat|metrics_server|client|prime_monitor|bench|data|tokenizer)(\..*)?|"
    r"trainer\.model\.(attn|compile|ac|ac_offloading|fsdp_cpu_offload|optim_cpu_offload|reshard_after_forward|"
    r"dp_replicate|ep|tp|cp|impl|optimization_dtype|reduce_dtype|moe_use_grouped_mm|fused_lm_head_chunk_size|"
    r"debug)(\..*)?|trainer\.(memory_profiler_path|trace_path|dist_timeout_seconds|broadcast_at_step_zero|"
    r"max_concurrent_runs|ckpt\.weights)(\..*)?|orchestrator\.(max_concurrent|tasks_per_minute|max_inflight_rollouts|"
    r"oversampling_factor|num_train_workers|use_token_client|filters|output_dir|verification)(\..*)?)$")
"""Keys with no effect on what is trained here: the vLLM server, GPUs and nodes, logging, weight transport, kernels
and parallelism, the orchestrator's concurrency."""

LOSS = ("trainer.loss.type", "trainer.loss.ipo_mask_low", "trainer.loss.ipo_mask_high", "trainer.loss.dppo_mask_low",
        "trainer.loss.dppo_mask_high", "trainer.loss.adv_tau", "trainer.loss.teacher_tau", "trainer.loss.kl_tau")


class PrimeRLPeer(Peer):
    """prime-rl's settings; a shared top-level key (``max_steps``) wins over the component's (``trainer.max_steps``)."""

    def shared(self, key: str, *components: str) -> tuple[Any, str]:
        """The value of shared ``key`` and the setting it came from: the top-level one if set, else the first
        component's set, else the first default that is not None."""
        for name in (key, *components):
            if self.set_by_user(name):
                return self(name), name
        name = next((name for name in (*components, key) if self.defaults.get(name) is not None), key)
        return self(name), name

    def show(self, *keys: str) -> str:
        return ", ".join(f"{key} = {self(key)!r}" for key in keys)


def read_prime_rl(paths: list[str], words: list[str]) -> dict[str, Any]:
    """prime-rl settings from TOML files (later winning) and ``key=value`` words (``--key value`` too)."""
    given: dict[str, Any] = {}
    for path in paths:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as err:
            raise ConfigError(f"{path}: {err.strerror or err}") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: not valid TOML ({err})") from None
        given.update(flatten(data))
    pending: str | None = None
    for word in words:
        if pending is not None:
            given[pending] = parse_value(word)
            pending = None
        elif word.startswith("--") and "=" not in word:
            pending = word[2:]
        elif "=" in word:
            key, _, value = word.lstrip("-").partition("=")
            given[key] = parse_value(value)
        else:
            raise ConfigError(f"config from-prime-rl: {word!r} is neither a TOML file nor key=value")
    if pending is not None:
        raise ConfigError(f"config from-prime-rl: --{pending} has no value")
    return given


def from_prime_rl(given: dict[str, Any], keep_objective: bool = False) -> Translation:
    """Translate prime-rl ``rl`` settings (flattened dotted keys)."""
    peer = PrimeRLPeer(given, PRIME_RL_DEFAULTS)
    out = Translation("prime-rl")
    name, origin = peer.shared("model.name", "trainer.model.name", "orchestrator.model.name")
    out.set("model.path", str(name), f"{origin} = {name!r}")
    note_local_path(out, origin, str(name), "model")
    _batches(peer, out)
    _environment(peer, out)
    _optimizer(peer, out)
    _runs(peer, out)
    if peer("trainer.enable_router_replay"):
        out.set("moe.routing_replay", "R3", peer.show("trainer.enable_router_replay") + " (the engine's routes replayed)")
    obj = Objective()
    kind = peer("trainer.loss.type")
    set_loss = [key for key in LOSS if peer.set_by_user(key)] or ["trainer.loss.type"]
    obj.blockers.append(f"{peer.show(*set_loss)}: prime-rl's {kind} loss (the ratio against the engine's log-probs, "
                        "masked outside its bounds, with its KL term) is not a minirl objective")
    apply_objective(out, keep_objective, obj)
    leftovers(peer, out, PRIME_RL_IGNORED)
    return out


def _batches(peer: PrimeRLPeer, out: Translation) -> None:
    """``batch_size`` samples a step, ``rollouts_per_example`` of each prompt; the length and the lag."""
    if peer("orchestrator.token_batch_size") is not None:
        out.not_translated.append(f"{peer.show('orchestrator.token_batch_size')}: minirl batches by prompts "
                                  "(rollout.prompts_per_step)")
    batch, group = peer("orchestrator.batch_size"), peer("orchestrator.rollouts_per_example")
    if not isinstance(batch, int) or not isinstance(group, int) or group < 1 or batch % group:
        raise ConfigError(f"prime-rl setting {peer.show('orchestrator.batch_size', 'orchestrator.rollouts_per_example')}: "
                          "batch_size must be a whole number of rollouts_per_example groups")
    origin = peer.show("orchestrator.batch_size", "orchestrator.rollouts_per_example")
    out.set("rollout.prompts_per_step", batch // group, origin + " (samples a step / samples a prompt)")
    out.set("rollout.samples_per_prompt", group, peer.show("orchestrator.rollouts_per_example"))
    seq_len, seq_origin = peer.shared("orchestrator.seq_len", "seq_len")  # a component's own wins (prime-rl's rl.py)
    tokens = peer("orchestrator.sampling.max_tokens")
    if tokens is not None:
        out.set("rollout.max_new_tokens", tokens, peer.show("orchestrator.sampling.max_tokens"))
        if peer.set_by_user(seq_origin):
            out.differs.append(f"{seq_origin} = {seq_len}: prime-rl bounds prompt and response together; minirl "
                               "bounds the response by rollout.max_new_tokens (task.max_prompt_tokens the prompt)")
    else:
        out.set("rollout.max_new_tokens", seq_len, f"{seq_origin} = {seq_len} (orchestrator.sampling.max_tokens unset)")
        out.differs.append(f"orchestrator.sampling.max_tokens unset: prime-rl generates up to {seq_origin} = {seq_len} "
                           "tokens with the prompt; minirl up to rollout.max_new_tokens after it")
    temperature = peer("orchestrator.sampling.temperature")
    out.set("rollout.temperature", 1.0 if temperature is None else temperature,
            peer.show("orchestrator.sampling.temperature") + (" (prime-rl's 1.0)" if temperature is None else ""))
    if peer("orchestrator.sampling.repetition_penalty") != 1.0:
        out.set("rollout.repetition_penalty", peer("orchestrator.sampling.repetition_penalty"),
                peer.show("orchestrator.sampling.repetition_penalty"))
    lag, lag_origin = peer.shared("max_async_level", "orchestrator.max_async_level", "trainer.max_async_level", "async_level")
    out.set("rollout.async_steps", lag, f"{lag_origin} = {lag}")
    if lag and not peer("orchestrator.strict_async_level"):
        out.differs.append(f"{lag_origin} = {lag}: prime-rl samples with any policy at most {lag} steps old (the latest "
                           "it has); minirl's rollout.async_steps is a fixed lag of that many steps")
    if peer("orchestrator.buffer.online_difficulty_filtering"):
        out.set("rollout.filter_groups", True, peer.show("orchestrator.buffer.online_difficulty_filtering"))
        out.differs.append("orchestrator.buffer.online_difficulty_filtering: prime-rl drops groups of mean reward 0 or 1; "
                           "minirl drops groups of equal rewards and samples more prompts to fill the step")


def _environment(peer: PrimeRLPeer, out: Translation) -> None:
    """The verifiers environment: its dataset as ``task.path``, its rubric as the reward."""
    envs = peer("orchestrator.env")
    if envs is None and peer("orchestrator.environment.id") is not None:
        envs = [{"id": peer("orchestrator.environment.id"), "args": peer.mapping("orchestrator.environment.args")}]
        key = "orchestrator.environment"
    else:
        key = "[[orchestrator.env]]"
        envs = envs if envs is not None else [{"id": "reverse-text", "args": {}}]  # prime-rl's default
    if not isinstance(envs, list) or not envs or not all(isinstance(env, dict) and env.get("id") for env in envs):
        raise ConfigError(f"prime-rl setting orchestrator.env = {envs!r}: expected tables with an id")
    first = envs[0]
    env_id, args = str(first["id"]), dict(first.get("args") or {})
    from minirl.tasks.verifiers_env import spec_of

    origin = f"{key} id = {env_id!r}" + (f", args = {args}" if args else "")
    out.set("task.kind", "jsonl", origin + " (a verifiers environment)")
    out.set("task.path", spec_of(env_id, args), origin + ": its dataset")
    out.set("task.reward_functions", [{"function": "minirl.tasks.verifiers_env:rubric", "name": env_id,
                                       "kwargs": {"env": env_id, "env_args": args}}], origin + ": its rubric")
    for extra in envs[1:]:
        out.not_translated.append(f"{key} id = {extra.get('id')!r}: minirl trains on one environment (the first)")
    for extra in peer("orchestrator.eval.env") or []:  # minirl evaluates on the training environment's held-out rows
        eval_id = extra.get("id") if isinstance(extra, dict) else extra
        if eval_id != env_id:
            out.not_translated.append(f"orchestrator.eval.env id = {eval_id!r}: minirl evaluates on {env_id!r}'s "
                                      f"eval_dataset (or task.eval_path: verifiers:{eval_id}, scored by {env_id!r}'s "
                                      "rubric)")
    if peer.set_by_user("orchestrator.eval.interval") or peer("orchestrator.eval.rollouts_per_example") != 1:
        out.set("eval.every_steps", peer("orchestrator.eval.interval"), peer.show("orchestrator.eval.interval"))
        out.set("eval.samples_per_prompt", peer("orchestrator.eval.rollouts_per_example"),
                peer.show("orchestrator.eval.rollouts_per_example"))


def _optimizer(peer: PrimeRLPeer, out: Translation) -> None:
    kind = peer("trainer.optim.type")
    if kind != "adamw":
        out.not_translated.append(f"{peer.show('trainer.optim.type')}: minirl trains with AdamW")
    lr = peer("trainer.optim.lr")
    out.set("optim.lr", lr, peer.show("trainer.optim.lr"))
    out.set("optim.weight_decay", peer("trainer.optim.weight_decay"), peer.show("trainer.optim.weight_decay"))
    out.set("optim.grad_clip_norm", peer("trainer.optim.max_norm"), peer.show("trainer.optim.max_norm"))
    if kind == "adamw":
        out.set("optim.adam_beta1", peer("trainer.optim.betas1"), peer.show("trainer.optim.betas1"))
        out.set("optim.adam_beta2", peer("trainer.optim.betas2"), peer.show("trainer.optim.betas2"))
    schedule = peer("trainer.scheduler.type")
    if schedule not in ("constant", "linear", "cosine"):
        raise ConfigError(f"prime-rl setting {peer.show('trainer.scheduler.type')}: expected constant, linear or cosine")
    out.set("optim.lr_schedule", schedule, peer.show("trainer.scheduler.type"))
    if schedule != "constant":
        out.set("optim.warmup_updates", peer("trainer.scheduler.warmup_steps"), peer.show("trainer.scheduler.warmup_steps"))
        out.set("optim.min_lr_ratio", peer("trainer.scheduler.min_lr") / lr if lr else 0.0,
                peer.show("trainer.scheduler.min_lr") + " / lr")
    if schedule == "linear":
        out.differs.append(f"{peer.show('trainer.scheduler.decay_steps')}: prime-rl holds the lr after its warm-up and "
                           "decays it over the last decay_steps; minirl's linear decays from the warm-up's end")
    if peer("trainer.model.lora.rank") is not None:
        out.set("model.lora.rank", peer("trainer.model.lora.rank"), peer.show("trainer.model.lora.rank"))
        out.set("model.lora.alpha", peer("trainer.model.lora.alpha"), peer.show("trainer.model.lora.alpha"))
        out.set("model.lora.dropout", peer("trainer.model.lora.dropout"), peer.show("trainer.model.lora.dropout"))
        modules = peer("trainer.model.lora.target_modules") or ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"]
        out.set("model.lora.target_modules", list(modules), peer.show("trainer.model.lora.target_modules") +
                ("" if peer("trainer.model.lora.target_modules") else " (prime-rl's default list, less its MoE 'experts')"))


def _runs(peer: PrimeRLPeer, out: Translation) -> None:
    steps, origin = peer.shared("max_steps", "trainer.max_steps", "orchestrator.max_steps")
    if steps is None:
        out.differs.append("max_steps unset: prime-rl trains until stopped; minirl runs optim.global_steps (its default)")
    else:
        out.set("optim.global_steps", steps, f"{origin} = {steps}")
    out.set("run.seed", peer("orchestrator.seed"), peer.show("orchestrator.seed"))
    path = Path(str(peer("output_dir")).rstrip("/"))
    out.set("run.output_dir", str(path.parent), peer.show("output_dir"))
    out.set("run.name", path.name, peer.show("output_dir"))
    interval, origin = peer.shared("ckpt.interval", "trainer.ckpt.interval")
    if not any(key.startswith(("ckpt.", "trainer.ckpt.")) for key in peer.given):
        out.set("checkpoint.every_steps", 0, "no [ckpt] (prime-rl keeps no checkpoint; minirl the final model only)")
    else:
        out.set("checkpoint.every_steps", interval or 0,
                f"{origin} = {interval}" + (" (at the end only)" if not interval else ""))
    keep, keep_origin = peer.shared("ckpt.keep_last", "trainer.ckpt.keep_last")
    if keep is not None:
        out.set("checkpoint.keep_last", keep, f"{keep_origin} = {keep}")
    resume, resume_origin = peer.shared("ckpt.resume_step", "trainer.ckpt.resume_step")
    out.set("run.resume", "never" if resume is None else "auto", f"{resume_origin} = {resume}")
    if resume not in (None, -1):
        out.differs.append(f"{resume_origin} = {resume}: minirl resumes from the newest valid checkpoint in the run "
                           "directory, not a chosen step")
    if peer.set_by_user("wandb.project") or peer.set_by_user("wandb.name"):
        out.set("log.wandb", True, "[wandb] given")
        out.set("log.wandb_project", str(peer("wandb.project")), peer.show("wandb.project"))
        if peer("wandb.name"):
            out.differs.append(f"{peer.show('wandb.name')}: minirl names the wandb run after run.name")
