"""verl: ``main_ppo``'s Hydra settings, from a run script's ``key=value`` overrides (its shell variables,
defaults and ``$((...))`` arithmetic expanded), a YAML config or ``key=value`` words, read against verl 0.9's
``ppo_trainer.yaml`` defaults."""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from minirl.config import ConfigError, MiniRLConfig
from minirl.peers.common import (
    MEGATRON_MODULES,
    CommandOutput,
    Objective,
    Peer,
    Translation,
    Unresolved,
    apply_objective,
    count_rows,
    flatten,
    leftovers,
    note_local_path,
    parse_value,
    read_yaml,
    report_to,
    template_kwargs,
    unset,
)
from minirl.peers.shell import (
    ARRAY,
    CLOSE,
    COMMAND,
    LITERAL,
    NAME_VALUE,
    OPEN,
    UNCOMMAND,
    UNLITERAL,
    arguments,
    assigned,
    case_matches,
    command_behind,
    condition,
    default_assignments,
    depends_on,
    fields,
    statements,
    unquoted,
    why_unresolved,
)

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
M = "actor_rollout_ref.model."
VERL_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024, "data.max_response_length": 512, "data.prompt_key": "prompt",
    "data.train_files": None, "data.val_files": None, "data.seed": None, "data.val_max_samples": -1,
    R + "multi_turn.enable": False, R + "multi_turn.max_assistant_turns": None, R + "multi_turn.tool_config_path": None,
    R + "multi_turn.format": "hermes", R + "multi_turn.max_tool_response_length": 256,
    R + "multi_turn.tool_response_truncate_side": "middle", R + "multi_turn.max_parallel_calls": 1,
    R + "multi_turn.max_user_turns": None, R + "multi_turn.function_tool_path": None,
    R + "multi_turn.interaction_config_path": None, R + "agent.default_agent_loop": "single_turn_agent",
    "data.max_prompt_length": 512, "data.truncation": "error", "data.filter_overlong_prompts": False,
    R + "n": 1, R + "temperature": 1.0, R + "top_p": 1.0, R + "top_k": -1, R + "repetition_penalty": 1.0, R + "name": None,
    R + "val_kwargs.n": 1, R + "val_kwargs.temperature": 0, R + "val_kwargs.top_p": 1.0, R + "val_kwargs.top_k": -1,
    R + "enable_rollout_routing_replay": False,
    A + "ppo_mini_batch_size": 256, A + "ppo_micro_batch_size_per_gpu": None, A + "use_dynamic_bsz": False,
    A + "ppo_max_token_len_per_gpu": 16384, A + "ppo_epochs": 1, A + "clip_ratio": 0.2,
    A + "clip_ratio_low": None, A + "clip_ratio_high": None, A + "clip_ratio_c": 3.0,
    A + "loss_agg_mode": "token-mean", A + "loss_scale_factor": None, A + "policy_loss.loss_mode": "vanilla",
    A + "tau_pos": 1.0, A + "tau_neg": 1.05, A + "use_prefix_grouper": False,
    A + "entropy_coeff": 0, A + "use_kl_loss": False, A + "kl_loss_coef": 0.001, A + "kl_loss_type": "low_var_kl",
    A + "optim.lr": 1e-6, A + "optim.weight_decay": 0.01, A + "optim.betas": [0.9, 0.999],
    A + "optim.clip_grad": 1.0, A + "grad_clip": None, A + "optim.lr_warmup_steps": -1,
    A + "optim.lr_warmup_steps_ratio": 0.0, A + "optim.lr_scheduler_type": "constant", A + "optim.warmup_style": None,
    A + "optim.min_lr_ratio": 0.0, A + "optim.num_cycles": 0.5, A + "optim.optimizer": "AdamW",
    A + "fsdp_config.param_offload": False, A + "fsdp_config.optimizer_offload": False,
    A + "fsdp_config.offload_policy": False,
    M + "path": None, M + "trust_remote_code": False, M + "enable_gradient_checkpointing": True, M + "use_fused_kernels": False,
    M + "use_remove_padding": True,
    M + "lora_rank": 0, M + "lora_alpha": 16, M + "target_modules": "all-linear", M + "target_parameters": None,
    M + "lora.rank": 0, M + "lora.alpha": 32, M + "lora.dropout": 0.0,
    M + "lora.target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
    "algorithm.adv_estimator": "gae", "algorithm.gamma": 1.0, "algorithm.lam": 1.0, "algorithm.norm_adv_by_std_in_grpo": True,
    "critic.optim.lr": 1e-5, "critic.optim.weight_decay": 0.01, "critic.grad_clip": 1.0, "critic.cliprange_value": 0.5,
    "critic.ppo_epochs": None, "critic.ppo_mini_batch_size": None, "critic.loss_agg_mode": None, "critic.model.path": None,
    "critic.optim.lr_warmup_steps_ratio": 0.0, "critic.optim.lr_warmup_steps": -1, "trainer.critic_warmup": 0,
    "critic.model.lora_rank": 0, "critic.model.lora_alpha": 16, "critic.model.target_modules": "all-linear",
    "algorithm.gdpo_reward_keys": None, "algorithm.gdpo_reward_weights": None,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl", "algorithm.kl_ctrl.type": "fixed", "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.horizon": 10000, "algorithm.kl_ctrl.target_kl": 0.1,
    "algorithm.rollout_correction.rollout_is": None, "algorithm.rollout_correction.rollout_is_threshold": "2.0",  # a number or "lower_upper"
    "algorithm.rollout_correction.rollout_rs": None, "algorithm.rollout_correction.bypass_mode": False,
    "algorithm.rollout_correction.loss_type": "ppo_clip",
    "algorithm.rollout_correction.rollout_rs_threshold": None,
    "trainer.total_epochs": 30, "trainer.total_training_steps": None, "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k", "trainer.default_local_dir": None, "trainer.logger": ["console", "wandb"],
    "trainer.save_freq": -1, "trainer.max_actor_ckpt_to_keep": None, "trainer.test_freq": -1,
    "trainer.resume_mode": "auto", "trainer.resume_from_path": None, "trainer.n_gpus_per_node": 8, "trainer.nnodes": 1, "trainer.device": "cuda",
    "trainer.log_val_generations": 0, "algorithm.filter_groups.enable": False, R + "quantization": None,
    "algorithm.filter_groups.metric": None, "algorithm.filter_groups.max_num_gen_batches": 0, "data.gen_batch_size": None,
    "reward_model.reward_manager": None, "reward.reward_manager.name": "naive",
    R + "quantization.weight_dtype": None, "custom_reward_function.path": None, "custom_reward_function.name": "compute_score",
    "reward.custom_reward_function.path": None, "reward.custom_reward_function.name": "compute_score",
    "custom_reward_function.reward_kwargs": None, "reward.custom_reward_function.reward_kwargs": None,
}

VERL_IGNORED = re.compile(
    r"^(.*\.(fsdp_config|megatron|profiler|checkpoint|nsys|ulysses_sequence_parallel_size|use_remove_padding|"
    r"use_fused_kernels|use_torch_compile|use_liger|use_shm|dataloader_num_workers|log_prob_.*|"
    r"gpu_memory_utilization|tensor_model_parallel_size|data_parallel_size|expert_parallel_size|enforce_eager|"
    r"free_cache_engine|max_num_batched_tokens|max_num_seqs|enable_chunked_prefill|enable_prefix_caching|mode|"
    r"load_format|disable_log_stats|calculate_log_probs|dtype|entropy_from_logits_with_chunking|"
    r"entropy_checkpointing|calculate_sum_pi_squared|sum_pi_squared_checkpointing|strategy|shuffle)(\..*)?|"
    r"data\.(filter_overlong_prompts_workers|return_raw_chat|shuffle|tokenizer|"
    r"val_batch_size|reward_fn_key)|trainer\.(val_before_train|critic_warmup|balance_batch|"
    r"ray_wait_register_center_timeout|use_legacy_worker_impl)|"
    r"actor_rollout_ref\.(ref\..*|hybrid_engine)|critic\..*|ray_kwargs\..*|ray_init\..*|"
    r"actor_rollout_ref\.actor\.(optim\.total_training_steps|data_loader_seed)|"
    r"actor_rollout_ref\.rollout\.(log_prob_micro_batch_size_per_gpu|prompt_length|response_length|seed)|"
    r"reward_model\.enable|rollout\.(nnodes|n_gpus_per_node)|async_training\..*|"
    # the parameters of subsystems minirl has not (each one's switch is read, and is an untranslated line when on)
    r"(distillation|transfer_queue|global_profiler|skip|reward\.reward_model|reward\.sandbox_fusion|trainer\.v1)\..*|"
    r"reward\.(num_workers|reward_manager\..*)|trainer\.use_v1|algorithm\.(gamma|lam|kl_penalty|kl_ctrl\..*|"
    r"pf_ppo\..*|filter_groups\.(?!enable$).*)|"
    r"actor_rollout_ref\.actor\.(qat\..*|policy_loss\.(clip_cov|kl_cov|ppo_kl|dro).*|optim\.optimizer_impl|"
    r"optim\.zero_indexed_step|entropy_from_logits_chunk_size)|"
    r"actor_rollout_ref\.rollout\.(multi_turn\.(?!(enable|max_assistant_turns|tool_config_path|format|"
    r"max_tool_response_length|tool_response_truncate_side|max_parallel_calls|max_user_turns|function_tool_path|"
    r"interaction_config_path)$)|agent\.(?!default_agent_loop$)|(checkpoint_engine|prometheus|disaggregation)\.).*|"
    r"actor_rollout_ref\.rollout\.(pipeline_model_parallel_size|logprobs_mode|scheduling_policy|do_sample|"
    r"skip_tokenizer_init)|"
    r"actor_rollout_ref\.model\.(mtp|tiled_mlp|fused_kernel_options)\..*|"
    r"actor_rollout_ref\.model\.lora\.(type|merge|dropout_position|lora_A_init_method|lora_B_init_method|freeze_.*|"
    r"dtype|a2a_experimental)|"
    r"data\.(train_max_samples|image_patch_size|image_key|video_key|audio_key|return_multi_modal_inputs))$")


T = "async_training."
FULLY_ASYNC_DEFAULTS = {T + "staleness_threshold": 0.1, T + "trigger_parameter_sync_step": 4, T + "require_batches": 1,
                        T + "partial_rollout": True, T + "use_rollout_log_probs": True, T + "compute_prox_log_prob": False,
                        "rollout.nnodes": 1, "rollout.n_gpus_per_node": 8, "rollout.total_rollout_steps": 100,
                        "rollout.test_freq": 1, "data.gen_batch_size": 1}
"""What verl's fully asynchronous trainer's config (``fully_async_ppo_trainer.yaml``) sets over ``ppo_trainer.yaml``."""


def _fully_async(peer: Peer) -> bool:
    return T + "trigger_parameter_sync_step" in peer.defaults


ONE_STEP_OFF_DEFAULTS = {"algorithm.rollout_correction.bypass_mode": True, "rollout.nnodes": 1,
                         "rollout.n_gpus_per_node": 8}
"""What verl's one-step-off trainer's config (``one_step_off_ppo_trainer.yaml``) sets over ``ppo_trainer.yaml``."""


VERL_DTYPES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "16": "fp16", "fp32": "fp32", "float32": "fp32",
               "float": "fp32", "32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}  # verl's PrecisionType names


def _verl_precision(peer: Peer, out: Translation) -> None:
    """The actor's FSDP ``mixed_precision.param_dtype`` (bf16 unless set; fp32 master weights either way); under fp16
    the actor's ``ShardedGradScaler`` grows its scale every 400 clean updates (torch's other defaults). A half
    ``fsdp_config.model_dtype`` keeps verl's weights and AdamW state themselves in it (no fp32 master copy), which
    minirl has not: said."""
    stored = peer(A + "fsdp_config.model_dtype")
    if stored is not None and VERL_DTYPES.get(str(stored).lower()) in ("bf16", "fp16"):
        out.differs.append(f"{peer.show(A + 'fsdp_config.model_dtype')}: verl keeps the actor's weights and AdamW "
                           "state in that dtype, with no fp32 master copy; minirl computes in optim.precision and keeps "
                           "fp32 master weights, so its updates are finer than verl's there")
    key = A + "fsdp_config.mixed_precision"
    given = peer.mapping(key).get("param_dtype")
    if given is None:
        out.set("optim.precision", "bf16", "verl's FSDP actor computes in bf16 (fp32 master weights)")
        return
    ours = VERL_DTYPES.get(str(given).lower())
    if ours is None:
        raise ConfigError(f"verl setting {key}.param_dtype={given!r}: not a dtype verl knows (bf16, fp16 or fp32)")
    out.set("optim.precision", ours, f"{key}.param_dtype={given!r}" + (" (dynamic loss scaling)" if ours == "fp16" else ""))
    if ours == "fp16":
        out.set("optim.loss_scale_window_updates", 400, "verl's fp16 actor: ShardedGradScaler(growth_interval=400)")


def _verl_offload(peer: Peer, out: Translation) -> None:
    """The actor's CPU offload. ``offload_policy`` is FSDP2's ``CPUOffloadPolicy``, as minirl's ``optim.cpu_offload``;
    ``param_offload`` / ``optimizer_offload`` move the parameters / AdamW state to the CPU between verl's phases
    (to free the GPU for its rollout), which minirl has not: they become the same offload, which keeps them there.
    A Megatron actor's ``param_offload`` / ``grad_offload`` / ``optimizer_offload`` are read the same way."""
    keys = [A + "fsdp_config." + name for name in ("offload_policy", "param_offload", "optimizer_offload")]
    keys += [A + "megatron." + name for name in ("param_offload", "grad_offload", "optimizer_offload")]
    given = [key for key in keys if peer(key)]
    out.set("optim.cpu_offload", bool(given), ", ".join(peer.show(key) for key in given) if given else
            f"{peer.show(keys[0])}: the actor's parameters and AdamW state on the GPU")
    if set(given) - {keys[0]}:
        out.differs.append(f"{', '.join(peer.show(key) for key in given if key != keys[0])}: verl moves them to the CPU "
                           "between its phases and back for each; minirl's optim.cpu_offload keeps parameters, gradients "
                           "and AdamW state in CPU memory throughout (FSDP2's CPUOffloadPolicy): never more GPU memory than "
                           "verl's, slower updates (the copies, and AdamW's step on the CPU)")


def from_verl(given: dict[str, Any], keep_objective: bool = False) -> Translation:
    """Translate verl ``main_ppo`` settings (flat dotted Hydra keys; ``-m``: the module a script runs)."""
    given = {key.lstrip("+~"): value for key, value in given.items()}
    module = str(given.pop("-m", "verl.trainer.main_ppo"))
    conditional = given.pop("$conditional", [])
    fully_async = "fully_async_policy" in module or any(key.startswith(T) for key in given)
    one_step_off = not fully_async and ("one_step_off_policy" in module
                                        or bool({"rollout.nnodes", "rollout.n_gpus_per_node"} & set(given)))
    defaults = {**VERL_DEFAULTS, **(ONE_STEP_OFF_DEFAULTS if one_step_off else {}), **(FULLY_ASYNC_DEFAULTS if fully_async else {})}
    peer, out = Peer(given, defaults), Translation("verl")
    out.differs += conditional
    if fully_async:  # the actor's old log-probs are the rollout's (use_rollout_log_probs): its bypass, unless the
        # trainer computes them (compute_prox_log_prob: AReaL's decoupled PPO, with the rollout correction on top)
        defaults[BYPASS] = bool(peer(T + "use_rollout_log_probs")) and not peer(T + "compute_prox_log_prob")
    _verl_async(peer, out, module, one_step_off)
    _verl_model_and_data(peer, out)
    n = _verl_batch(peer, out)
    _verl_optimizer(peer, out)
    _verl_runs(peer, out)
    apply_objective(out, keep_objective, _verl_objective(peer, n))
    if str(peer("algorithm.adv_estimator")) == "gae" and not keep_objective:
        _verl_critic(peer, out)
    _verl_cluster(peer, out)
    for old in (f"{role}.{kind}_micro_batch_size" for role, kind in (("actor_rollout_ref.actor", "ppo"),
                ("actor_rollout_ref.rollout", "log_prob"), ("actor_rollout_ref.ref", "log_prob"), ("critic", "ppo"))):
        if old in given:  # verl's deprecated global micro-batch (split over the GPUs), not its mini-batch
            peer.read.add(old)
            where = " (minirl's optim.micro_batch_sequences)" if old.startswith(A) else ""
            out.not_translated.append(f"{old}={given[old]!r}: verl's deprecated global micro-batch (over all GPUs); "
                                      f"give {old}_per_gpu{where}")
    if not peer("algorithm.use_kl_in_reward"):  # set, but verl applies no KL in the reward without it
        kl_ctrl = sorted(key for key in given if key.startswith("algorithm.kl_ctrl.") or key == "algorithm.kl_penalty")
        out.ignored += [f"{key} (algorithm.use_kl_in_reward is off: verl puts no KL in the reward)" for key in kl_ctrl]
    leftovers(peer, out, VERL_IGNORED)
    return out


def _verl_async(peer: Peer, out: Translation, module: str, one_step_off: bool) -> None:
    """verl's one-step-off trainer (``verl.experimental.one_step_off_policy.main_ppo``: the next step's batch sampled
    beside the update on the engine's own GPUs, ``rollout.nnodes`` x ``rollout.n_gpus_per_node``; its config turns
    the bypass on) is ``rollout.async_steps: 1``. Its fully asynchronous trainer (``fully_async_policy``) is the
    nearest minirl run: a global step is what it trains between two parameter syncs (``_verl_batch``), sampled on the
    weights before them (``rollout.async_steps: 1``) when ``staleness_threshold`` > 0, on the same weights when it is
    0 (its "stream off-policy pipeline"); its streaming is named, not carried over. Its ``partial_rollout`` (in effect
    only when ``staleness_threshold`` > 0) is ``rollout.partial_rollout`` beside the update, over a pool of (1 +
    ``staleness_threshold``) x the step's prompts: the groups verl's rollouter may run ahead of a sync."""
    if one_step_off:
        origin = module if "one_step_off_policy" in module else peer.show("rollout.nnodes", "rollout.n_gpus_per_node")
        out.set("rollout.async_steps", 1, f"{origin}: the next step's batch sampled beside the update")
    if not _fully_async(peer):
        return
    staleness = float(peer(T + "staleness_threshold"))
    out.differs.append(f"{module}: verl's trainer takes samples as they finish (shorter responses first) into its "
                       "mini-batches; minirl samples a step's whole batch, then trains on it in prompt order")
    if staleness > 0:
        out.set("rollout.async_steps", 1, f"{peer.show(T + 'staleness_threshold')}: sampled beside the update")
        out.differs.append(f"{peer.show(T + 'staleness_threshold')}: verl samples up to {staleness:g} x a step's samples "
                           f"beyond it before a sync, so at most {staleness / (1 + staleness):.0%} of a step's samples "
                           "come from the weights before the last sync; with minirl's rollout.async_steps: 1 all do")
        if peer(T + "partial_rollout"):
            _verl_partial(peer, out, staleness)


def _verl_partial(peer: Peer, out: Translation, staleness: float) -> None:
    """verl's fully asynchronous ``partial_rollout`` (``_verl_async``)."""
    syncs, batches = int(peer(T + "trigger_parameter_sync_step")), int(peer(T + "require_batches"))
    prompts = syncs * batches * int(peer(A + "ppo_mini_batch_size"))  # the step's prompts (``_verl_batch``)
    pool = math.ceil((1 + staleness) * prompts - 1e-9)
    out.set("rollout.partial_rollout", True, peer.show(T + "partial_rollout") + " (with staleness_threshold > 0)")
    out.set("rollout.partial_pool_prompts", pool, f"(1 + staleness_threshold) x the step's {prompts} prompts: the groups "
            "decoding when a sync comes")
    out.differs.append(f"{peer.show(T + 'partial_rollout')}: verl interrupts the requests running at a parameter sync "
                       f"and continues them after it; minirl decodes a pool of {pool} groups beside the update, trains "
                       f"the {prompts} that end first (others ended by the same check of rollout.partial_chunk_tokens "
                       "dropped, as in slime) and continues the rest on the next step's weights")


def _one_file(value: Any) -> Any:
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _verl_model_and_data(peer: Peer, out: Translation) -> None:
    if peer(M + "path"):
        out.set("model.path", peer(M + "path"), peer.show(M + "path"))
        note_local_path(out, M + "path", peer(M + "path"), "model")
    if peer.set_by_user(M + "trust_remote_code"):
        out.set("model.trust_remote_code", bool(peer(M + "trust_remote_code")), peer.show(M + "trust_remote_code"))
    if peer(M + "use_fused_kernels"):  # log-probs and entropy from the hidden states, never the whole logits
        out.set("optim.logprob_chunk_tokens", 1024, peer.show(M + "use_fused_kernels"))
    if peer(M + "lora_rank"):  # the FSDP backend's keys
        out.set("model.lora.rank", int(peer(M + "lora_rank")), peer.show(M + "lora_rank"))
        out.set("model.lora.alpha", float(peer(M + "lora_alpha")), peer.show(M + "lora_alpha"))
        modules = peer(M + "target_modules")
        out.set("model.lora.target_modules", [modules] if isinstance(modules, str) else list(modules),
                peer.show(M + "target_modules"))
        parameters = peer(M + "target_parameters")  # peft's, for an MoE's fused expert tensors
        if parameters:
            out.set("model.lora.target_parameters", [parameters] if isinstance(parameters, str) else list(parameters),
                    peer.show(M + "target_parameters"))
    elif peer(M + "lora.rank"):  # the Megatron backend's: its module names in transformers' words
        out.set("model.lora.rank", int(peer(M + "lora.rank")), peer.show(M + "lora.rank"))
        out.set("model.lora.alpha", float(peer(M + "lora.alpha")), peer.show(M + "lora.alpha"))
        out.set("model.lora.dropout", float(peer(M + "lora.dropout")), peer.show(M + "lora.dropout"))
        megatron = peer(M + "lora.target_modules")
        megatron = [megatron] if isinstance(megatron, str) else list(megatron)
        unknown = [name for name in megatron if name not in MEGATRON_MODULES]
        if unknown:
            out.not_translated.append(f"{M}lora.target_modules: {', '.join(unknown)} (Megatron names minirl cannot map)")
        hf = [name for module in megatron for name in MEGATRON_MODULES.get(module, [])]
        if hf:
            out.set("model.lora.target_modules", hf, peer.show(M + "lora.target_modules"))
    if peer("data.train_files"):
        out.set("task.kind", "jsonl", "data.train_files given")
    for theirs, ours in (("data.train_files", "task.path"), ("data.val_files", "task.eval_path")):
        value = _one_file(peer(theirs))  # several files: their rows one after another, as verl's RLHFDataset
        if value:
            out.set(ours, [str(v) for v in value] if isinstance(value, list) else value, peer.show(theirs))
            for one in value if isinstance(value, list) else [value]:
                note_local_path(out, theirs, str(one), "data", ours)
    if peer("data.val_files"):
        _verl_validation_rows(peer, out)
    if peer.set_by_user("data.prompt_key"):
        out.set("task.prompt_column", peer("data.prompt_key"), peer.show("data.prompt_key"))
    template_kwargs(peer, out, "data.apply_chat_template_kwargs")
    _verl_prompt_length(peer, out)
    _verl_rewards(peer, out)


def _verl_validation_rows(peer: Peer, out: Translation) -> None:
    """verl validates on every row of ``val_files`` (or its first ``val_max_samples``): ``eval.num_prompts`` is that
    count where the files are here, else a line says to set it."""
    rows, most = count_rows(out.values.get("task.eval_path")), peer("data.val_max_samples")
    limit = int(most) if isinstance(most, int) and most > 0 else None
    if rows is not None:
        count = max(1, min(rows, limit) if limit is not None else rows)
        out.set("eval.num_prompts", count, f"{peer.show('data.val_files')} ({rows} rows: verl validates on all"
                + (f", up to data.val_max_samples={limit})" if limit is not None else ")"))
    elif limit is not None:
        out.set("eval.num_prompts", limit, peer.show("data.val_max_samples"))
    else:
        out.differs.append(f"{peer.show('data.val_files')}: verl validates on all of its rows; minirl on "
                           "eval.num_prompts of them (64 by default): set it to the file's row count")


def _verl_prompt_length(peer: Peer, out: Translation) -> None:
    """verl drops (``filter_overlong_prompts``), refuses (``truncation: error``, its default) or cuts (``left`` /
    ``right`` / ``middle``) a prompt over ``max_prompt_length`` tokens; so does minirl (``task.max_prompt_tokens``,
    ``task.on_bad_row``, ``task.prompt_truncation``)."""
    length, truncation = peer("data.max_prompt_length"), peer("data.truncation")
    if peer("data.filter_overlong_prompts"):
        out.set("task.max_prompt_tokens", int(length), peer.show("data.max_prompt_length", "data.filter_overlong_prompts"))
        out.set("task.on_bad_row", "skip", peer.show("data.filter_overlong_prompts"))
        return
    out.set("task.max_prompt_tokens", int(length), peer.show("data.max_prompt_length", "data.truncation"))
    if truncation == "error":
        out.differs.append(f"{peer.show('data.truncation')}: minirl stops at a longer prompt, as verl's loader did; "
                           "verl 0.9's agent loop cuts it from the left instead (task.prompt_truncation: left)")
    elif truncation in ("left", "right", "middle"):
        out.set("task.prompt_truncation", truncation, peer.show("data.truncation"))
    else:
        raise ConfigError(f"verl setting {peer.show('data.truncation')}: must be error, left, right or middle")


def _verl_rewards(peer: Peer, out: Translation) -> None:
    legacy, current = peer("custom_reward_function.path"), peer("reward.custom_reward_function.path")
    if legacy and current and (legacy, peer("custom_reward_function.name")) != (
            current, peer("reward.custom_reward_function.name")):
        out.differs.append(f"{peer.show('custom_reward_function.path')}: not used; verl 0.9 scores with "
                           f"{peer.show('reward.custom_reward_function.path')}, and so does minirl")
    for prefix in ("", "reward."):
        if peer(prefix + "custom_reward_function.path"):
            spec = f"{peer(prefix + 'custom_reward_function.path')}:{peer(prefix + 'custom_reward_function.name')}"
            kwargs = peer.mapping(prefix + "custom_reward_function.reward_kwargs")
            if kwargs:  # verl passes them to every call: one entry of task.reward_functions carries them
                out.set("task.reward_functions", [{"function": spec, "kwargs": kwargs}],
                        f"{peer.show(prefix + 'custom_reward_function.path')}, "
                        f"{prefix}custom_reward_function.reward_kwargs={kwargs}")
            else:
                out.set("task.reward_function", spec, peer.show(prefix + "custom_reward_function.path"))
    manager = peer("reward_model.reward_manager") or peer("reward.reward_manager.name")
    if manager not in ("naive", "batch", "dapo"):
        out.not_translated.append(f"verl's {manager!r} reward manager (its own shaping): minirl calls your "
                                  "compute_score per sample or batched, as naive / batch")
    if not ({"task.reward_function", "task.reward_functions"} & set(out.values)):  # verl's default, by data_source
        out.set("task.reward_function", "minirl.tasks.verl_scores:default_compute_score",
                "no custom_reward_function: verl's default_compute_score (gsm8k, MATH, DAPO sources)")
    if str(peer("algorithm.adv_estimator")).removesuffix("_vectorized") == "gdpo":
        _verl_gdpo_rewards(peer, out, manager)
    elif manager == "dapo":
        _dapo_overlong_buffer(peer, out)
    for enable, path_key in (("reward_model.enable", "reward_model.model.path"),  # the legacy keys, which verl 0.9
                             ("reward.reward_model.enable", "reward.reward_model.model_path")):  # moves to these
        if peer(enable) is not True:
            continue
        custom = peer("custom_reward_function.path") or peer("reward.custom_reward_function.path")
        if peer(path_key) and not custom:
            _verl_reward_model(peer, out, enable, path_key)
        else:  # the reward loop calls your function, handing it the served model's router (a GenRM, or a hybrid)
            out.not_translated.append(f"{peer.show(enable, path_key)}: verl serves the reward model and your "
                                      "custom_reward_function queries it (reward_router_address); minirl serves none: "
                                      "load the judge in your function, or score with a sequence classifier as a "
                                      "task.reward_functions entry {model: DIR} (TRL's way)")
        break


def _verl_reward_model(peer: Peer, out: Translation, enable: str, path_key: str) -> None:
    """verl's discriminative reward model with no ``custom_reward_function`` (``reward_model.enable`` and
    ``reward_model.model.path``, or verl 0.9's ``reward.reward_model.*`` they move to): its score of each response is
    the reward (the reward loop's ``compute_score_disrm``), as a ``task.reward_functions`` entry ``{model: DIR}``,
    TRL's way of scoring with a sequence classifier."""
    path = str(peer(path_key))
    out.values.pop("task.reward_function", None)
    out.set("task.reward_functions", [{"model": path}], peer.show(enable, path_key) +
            " (no custom_reward_function: verl's reward loop scores each response with the model)")
    note_local_path(out, path_key, path, "reward model", target="task.reward_functions[0].model")
    out.differs.append(f"{peer.show(path_key)}: verl reads its token-classification head at the "
                       "response's last token, minirl a sequence classifier's score there (the same head and value "
                       "for a *ForSequenceClassification checkpoint); minirl renders the chat with the reward model's "
                       "own chat template, as verl does with reward_model.model.input_tokenizer set")


def _dapo_overlong_buffer(peer: Peer, out: Translation) -> None:
    """DAPO's reward manager adds ``min(-(|y| - (L_max - L_buf)) / L_buf * factor, 0)`` to the score when its overlong
    buffer is on: TRL's soft overlong punishment with weight ``factor`` (the same up to ``L_max``). Its settings sit
    under ``reward.reward_kwargs`` (verl 0.9), ``reward_model.reward_kwargs`` or, in older recipes,
    ``reward_model.overlong_buffer`` with ``L_max`` = ``data.max_response_length``."""
    for cfg, limit in (("reward.reward_kwargs.overlong_buffer_cfg", "reward.reward_kwargs.max_resp_len"),
                       ("reward_model.reward_kwargs.overlong_buffer_cfg", "reward_model.reward_kwargs.max_resp_len"),
                       ("reward_model.overlong_buffer", "data.max_response_length")):
        if not peer(cfg + ".enable"):
            continue
        length, factor, max_len = peer(cfg + ".len"), peer(cfg + ".penalty_factor"), peer(limit)
        peer(cfg + ".log")  # verl's extra metric; minirl logs reward/overlong_reward/mean anyway
        if not (length and max_len) or length > max_len:
            raise ConfigError(f"verl settings {peer.show(cfg + '.len', limit)}: DAPO's overlong buffer needs 0 < len "
                              "<= the longest response")
        entry = {"function": "minirl.tasks.trl_rewards:soft_overlong_punishment_reward", "weight": float(factor),
                 "name": "overlong_reward", "kwargs": {"max_completion_len": int(max_len), "soft_punish_cache": int(length)}}
        if "task.reward_functions" in out.values:
            functions = list(out.values["task.reward_functions"])
        elif "task.reward_function" in out.values:
            functions = [{"function": out.values.pop("task.reward_function")}]
            out.origin["task.reward_functions"] = out.origin.pop("task.reward_function")
        else:  # verl's default scorer, weighed beside the penalty
            functions = [{"function": "minirl.tasks.verl_scores:default_compute_score"}]
        origin = out.origin.get("task.reward_functions")
        out.set("task.reward_functions", functions + [entry],
                "; ".join(filter(None, [origin, peer.show(cfg + ".enable", cfg + ".len", cfg + ".penalty_factor", limit)])))
        if max_len < peer("data.max_response_length"):  # minirl's rollout.max_new_tokens
            out.differs.append(f"{peer.show(limit)} below the response limit: past it verl's penalty keeps falling "
                               f"linearly, minirl's stays at -{factor}")
        return


def _verl_batch(peer: Peer, out: Translation) -> int:
    prompts, minibatch = peer("data.train_batch_size"), peer(A + "ppo_mini_batch_size")
    if _fully_async(peer):  # data.train_batch_size has no effect there: a step is what it trains between two syncs
        syncs, batches = int(peer(T + "trigger_parameter_sync_step")), int(peer(T + "require_batches"))
        n, prompts = syncs * batches, syncs * batches * minibatch
        out.set("rollout.prompts_per_step", prompts, f"trigger_parameter_sync_step x require_batches x "
                f"ppo_mini_batch_size = {syncs} x {batches} x {minibatch} (the prompts between two parameter syncs)")
        out.set("optim.minibatches_per_step", n, f"trigger_parameter_sync_step x require_batches = {syncs} x {batches}")
    elif prompts % minibatch:
        raise ConfigError(f"verl settings {peer.show('data.train_batch_size', A + 'ppo_mini_batch_size')}: the mini-batch "
                          "size must divide the batch")
    else:
        n = prompts // minibatch
        out.set("rollout.prompts_per_step", prompts, peer.show("data.train_batch_size"))
        out.set("optim.minibatches_per_step", n, f"train_batch_size / ppo_mini_batch_size = {prompts} / {minibatch}")
    out.set("rollout.samples_per_prompt", peer(R + "n"), peer.show(R + "n"))
    if peer(A + "ppo_micro_batch_size_per_gpu"):
        out.set("optim.micro_batch_sequences", peer(A + "ppo_micro_batch_size_per_gpu"), peer.show(A + "ppo_micro_batch_size_per_gpu"))
    if peer(A + "use_dynamic_bsz"):
        out.set("optim.micro_batch_max_tokens", peer(A + "ppo_max_token_len_per_gpu"),
                peer.show(A + "use_dynamic_bsz", A + "ppo_max_token_len_per_gpu"))
    out.set("optim.epochs_per_step", int(peer(A + "ppo_epochs")), peer.show(A + "ppo_epochs"))
    out.set("rollout.max_new_tokens", peer("data.max_response_length"), peer.show("data.max_response_length"))
    out.set("rollout.temperature", float(peer(R + "temperature")), peer.show(R + "temperature"))
    out.set("rollout.top_p", float(peer(R + "top_p")), peer.show(R + "top_p"))
    out.set("rollout.top_k", max(0, int(peer(R + "top_k") or 0)), peer.show(R + "top_k"))  # verl's -1 is off
    penalty = float(peer(R + "repetition_penalty"))  # verl's vLLM server applies it to validation too
    out.set("rollout.repetition_penalty", penalty, peer.show(R + "repetition_penalty"))
    out.set("eval.repetition_penalty", penalty, peer.show(R + "repetition_penalty") + " (validation samples with it too)")
    if peer("algorithm.filter_groups.enable"):
        _verl_filter_groups(peer, out, prompts)
    if peer(R + "multi_turn.enable"):
        _verl_multi_turn(peer, out)
    else:
        tools = [key for key in ("tool_config_path", "function_tool_path") if not unset(peer(R + "multi_turn." + key))]
        if tools:
            out.not_translated.append(f"{peer.show(R + 'multi_turn.enable', *(R + 'multi_turn.' + k for k in tools))}: "
                                      "tools given with multi_turn off; none translated (turn it on for task.tool_config)")
    if not unset(peer(R + "multi_turn.interaction_config_path")):
        out.not_translated.append(f"{peer.show(R + 'multi_turn.interaction_config_path')}: verl's interactions (a "
                                  "simulated user's turns) are not translated")
    quantization = peer(R + "quantization.weight_dtype") or peer(R + "quantization")
    if quantization and not isinstance(quantization, dict):
        out.not_translated.append(f"rollout quantization {quantization!r}: minirl's native engine has its own "
                                  "(rollout.precision: fp8_e4m3 | fp8_e5m2 | fp4_e2m1, per-tensor or per-expert scales)")
    name = peer(R + "name")
    if name == "vllm":
        out.set("cluster.engine_backend", "vllm", peer.show(R + "name"))
    elif not unset(name):
        out.differs.append(f"{peer.show(R + 'name')}: minirl samples with its native engine (or vLLM)")
    return n


def _verl_multi_turn(peer: Peer, out: Translation) -> None:
    """verl's multi-turn tool agent (``rollout.multi_turn``): its rounds and call format carry over to ``task.tools``'
    (``minirl.rollout.tools``), its ``BaseTool`` classes (``tool_config_path``) to ``task.tool_config``
    (``minirl.rollout.verl_tools``), its ``@function_tool`` functions (``function_tool_path``) to ``task.tools``."""
    turns, replies = peer(R + "multi_turn.max_assistant_turns"), peer(R + "multi_turn.max_user_turns")
    bounds = [int(turns) - 1] if not unset(turns) and int(turns) >= 2 else []  # n assistant turns: n - 1 rounds
    bounds += [int(replies)] if not unset(replies) and int(replies) >= 1 else []  # each round a tool (user) turn
    if bounds:
        out.set("task.max_tool_iterations", min(bounds), peer.show(R + "multi_turn.max_assistant_turns",
                                                                  R + "multi_turn.max_user_turns") + " (rounds between)")
    parallel = peer(R + "multi_turn.max_parallel_calls")
    if not unset(parallel):  # verl runs the first ones of a turn, 1 by default
        out.set("task.max_tool_calls_per_turn", int(parallel), peer.show(R + "multi_turn.max_parallel_calls"))
    limit, side = peer(R + "multi_turn.max_tool_response_length"), peer(R + "multi_turn.tool_response_truncate_side")
    if not unset(limit):  # verl cuts every tool response, 256 characters by default
        shown = peer.show(R + "multi_turn.max_tool_response_length", R + "multi_turn.tool_response_truncate_side")
        out.set("task.tool_result_max_chars", int(limit), shown)
        # verl 0.9's side is the one cut: left keeps the tail, right the head (ToolAgentLoop._call_tool)
        out.set("task.tool_result_keep", {"left": "tail", "right": "head"}.get(str(side), "middle"), shown)
        if str(side) in ("left", "right"):
            out.differs.append(f"{peer.show(R + 'multi_turn.tool_response_truncate_side')}: read as verl 0.9 reads it "
                               "(the side cut); verl before 0.9 kept that side instead: with an older verl, set "
                               f"task.tool_result_keep={'head' if side == 'left' else 'tail'}")
    fmt = peer(R + "multi_turn.format")
    if fmt not in (None, "hermes"):
        out.not_translated.append(f"{peer.show(R + 'multi_turn.format')}: minirl reads Hermes <tool_call> blocks or the "
                                  "tokenizer's parse_response (task.tool_parser)")
    path = peer(R + "multi_turn.tool_config_path")
    if not unset(path):
        out.set("task.tool_config", str(path), peer.show(R + "multi_turn.tool_config_path"))
        if not Path(str(path)).is_file():
            out.differs.append(f"{peer.show(R + 'multi_turn.tool_config_path')}: not found here; give task.tool_config "
                               "the file's path where minirl runs")
    functions = peer(R + "multi_turn.function_tool_path")
    if not unset(functions):
        _verl_function_tools(peer, out, str(functions))
    if unset(path) and unset(functions):
        out.not_translated.append(f"{peer.show(R + 'multi_turn.enable')}: no tools (tool_config_path, "
                                  "function_tool_path); give task.tools or task.tool_config")
    loop = peer(R + "agent.default_agent_loop")
    if loop == "single_turn_agent":  # verl's default: a row runs its calls only when its agent_name is tool_agent
        out.differs.append(f"{peer.show(R + 'agent.default_agent_loop')}: verl runs tools only on rows whose "
                           "agent_name column is tool_agent; minirl offers them to every row but those whose "
                           "agent_name is single_turn_agent")
    elif loop != "tool_agent":
        out.not_translated.append(f"{peer.show(R + 'agent.default_agent_loop')}: minirl runs verl's tool_agent and "
                                  "single_turn_agent only")


def _verl_function_tools(peer: Peer, out: Translation, path: str) -> None:
    """verl 0.9's ``function_tool_path``: its ``@function_tool`` functions (read from the file's source, not run) as
    ``task.tools``, where they run as verl runs them (``minirl.rollout.verl_tools.FunctionTool``: the decorator's name
    and schema, its results read by verl's rules); the file imports verl's decorator, so verl must be installed here."""
    shown = peer.show(R + "multi_turn.function_tool_path")
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError) as error:
        out.not_translated.append(f"{shown}: cannot read its functions here ({type(error).__name__}); list its "
                                  "@function_tool functions in task.tools as path.py:function")
        return
    names = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and any(getattr(target, "id", getattr(target, "attr", None)) == "function_tool"
                     for target in (d.func if isinstance(d, ast.Call) else d for d in node.decorator_list))]
    if not names:
        out.not_translated.append(f"{shown}: no @function_tool functions found in {path}")
        return
    out.set("task.tools", [f"{path}:{name}" for name in names], shown)
    if importlib.util.find_spec("verl") is None:
        from minirl.tasks.rewards import PEER_INSTALL

        out.differs.append(f"{shown}: the file imports verl's @function_tool; {PEER_INSTALL['verl']}")


def _run_name(peer: Peer, out: Translation, key: str) -> Any:
    """A run's project or experiment name; one taking a command's output (a date, a git hash: not run here) is
    verl's default instead, said in a line."""
    try:
        return peer(key)
    except ConfigError as error:
        if not isinstance(peer.given.get(key), CommandOutput):
            raise
        out.differs.append(f"{error}; the run's directory takes verl's default {peer.defaults[key]!r} instead, so "
                           "each launch of this config resumes the same run (give run.name per launch for a new one)")
        return peer.defaults[key]


def _verl_filter_groups(peer: Peer, out: Translation, prompts: int) -> None:
    """DAPO's dynamic sampling: verl's ``algorithm.filter_groups`` and ``data.gen_batch_size``."""
    F = "algorithm.filter_groups."
    out.set("rollout.filter_groups", True, peer.show(F + "enable"))
    metric = peer(F + "metric")
    ours = "accuracy" if metric == "acc" else "reward"  # score / seq_reward / seq_final_reward: one outcome reward
    out.set("rollout.filter_groups_metric", ours, peer.show(F + "metric")
            + (" (correct = reward >= eval.accuracy_threshold)" if ours == "accuracy" else ""))
    if metric not in (None, "acc", "score", "seq_reward", "seq_final_reward"):
        out.differs.append(f"{peer.show(F + 'metric')}: minirl filters on the reward (or accuracy), not on a "
                           "reward function's extra value")
    rounds = int(peer(F + "max_num_gen_batches") or 0)
    out.set("rollout.filter_groups_max_rounds", rounds, peer.show(F + "max_num_gen_batches"))
    out.differs.append(f"{peer.show(F + 'max_num_gen_batches')}: when the rounds run out verl stops with an error; "
                       "minirl fills the batch with zero-spread groups (filter/topped_up_groups)"
                       + ("; 0 = at most one pass over the training prompts instead of no limit" if not rounds else ""))
    generation = peer("data.gen_batch_size")
    if generation and int(generation) != prompts:
        out.set("rollout.filter_groups_prompts_per_round", int(generation), peer.show("data.gen_batch_size"))


def _verl_cluster(peer: Peer, out: Translation) -> None:
    ranks = peer("trainer.n_gpus_per_node") * peer("trainer.nnodes")
    out.set("cluster.device", "cpu" if peer("trainer.device") == "cpu" else "cuda", peer.show("trainer.device"))
    if ranks > 1:  # FSDP2 ranks, one per GPU (LoRA and the KL penalty's reference included)
        out.set("cluster.trainer_ranks", ranks, peer.show("trainer.n_gpus_per_node", "trainer.nnodes"))
        out.set("cluster.backend", "ray", "verl runs its workers on Ray")
        out.set("cluster.gpus_per_trainer_rank", 1.0, "one GPU per trainer rank")
        out.set("cluster.gpus_per_engine", 1.0, "one GPU per rollout engine")
        if "actor_rollout_ref.nccl_timeout" in peer.given:  # its collectives' timeout (verl: 600 s, minirl's too)
            out.set("cluster.collective_timeout_s", peer("actor_rollout_ref.nccl_timeout"),
                    peer.show("actor_rollout_ref.nccl_timeout"))
        if "rollout.nnodes" in peer.defaults:  # its asynchronous trainers: the rollout on GPUs of its own
            engines = peer("rollout.nnodes") * peer("rollout.n_gpus_per_node")
            where = f"verl samples on {engines} GPUs of its own beside the trainer's {ranks}"
        else:
            where = f"verl colocates actor and rollout on the same {ranks} GPUs"
        out.differs.append(f"{where}; minirl places {ranks} trainer ranks and its engines as separate Ray actors: size "
                           "cluster.* for your machine (docs/distributed.md)")


def _verl_optimizer(peer: Peer, out: Translation) -> None:
    if peer(A + "optim.optimizer") != "AdamW":
        out.not_translated.append(f"{peer.show(A + 'optim.optimizer')}: minirl trains with AdamW")
    out.set("optim.lr", float(peer(A + "optim.lr")), peer.show(A + "optim.lr"))
    out.set("optim.weight_decay", float(peer(A + "optim.weight_decay")), peer.show(A + "optim.weight_decay"))
    betas = peer(A + "optim.betas")
    out.set("optim.adam_beta1", float(betas[0]), peer.show(A + "optim.betas"))
    out.set("optim.adam_beta2", float(betas[1]), peer.show(A + "optim.betas"))
    clip = peer(A + "grad_clip") if peer(A + "grad_clip") is not None else peer(A + "optim.clip_grad")
    out.set("optim.grad_clip_norm", float(clip), peer.show(A + "optim.clip_grad"))
    steps, epochs = peer("trainer.total_training_steps"), peer("trainer.total_epochs")
    rows = count_rows(out.values.get("task.path"))
    if _fully_async(peer):  # it stops when the rollouter has sampled rollout.total_rollout_steps prompts
        total, prompts = int(peer("rollout.total_rollout_steps")), out.values["rollout.prompts_per_step"]
        steps = max(1, total // prompts)
        out.set("optim.global_steps", steps, f"rollout.total_rollout_steps={total} // {prompts} prompts a step")
    elif steps:
        out.set("optim.global_steps", int(steps), peer.show("trainer.total_training_steps"))
    elif rows is not None and rows >= peer("data.train_batch_size"):  # verl's loader drops a last partial batch
        steps = epochs * (rows // peer("data.train_batch_size"))
        out.set("optim.global_steps", steps, f"trainer.total_epochs={epochs} x ({rows} rows // data.train_batch_size)")
    elif rows is not None:
        out.not_translated.append(f"trainer.total_epochs={epochs}: {rows} training rows < data.train_batch_size="
                                  f"{peer('data.train_batch_size')}, so verl's loader (it drops a last partial batch) "
                                  "makes no step; set optim.global_steps")
    else:
        out.not_translated.append(f"trainer.total_epochs={epochs} without total_training_steps: set "
                                  "optim.global_steps (one epoch = training prompts / data.train_batch_size)")
    warmup, ratio = peer(A + "optim.lr_warmup_steps"), peer(A + "optim.lr_warmup_steps_ratio")
    if warmup and warmup > 0:
        out.set("optim.warmup_updates", int(warmup), peer.show(A + "optim.lr_warmup_steps"))
    elif ratio:
        if steps:
            out.set("optim.warmup_updates", round(ratio * steps * out.values["optim.minibatches_per_step"]
                                                  * out.values["optim.epochs_per_step"]),
                    f"{ratio} x total updates")
        else:
            out.not_translated.append(f"{peer.show(A + 'optim.lr_warmup_steps_ratio')} without total_training_steps")
    style = peer(A + "optim.warmup_style") or peer(A + "optim.lr_scheduler_type")
    if style in ("constant", "cosine"):
        out.set("optim.lr_schedule", style, f"lr_scheduler_type={style!r}")
        if style == "cosine":
            out.set("optim.min_lr_ratio", float(peer(A + "optim.min_lr_ratio")), peer.show(A + "optim.min_lr_ratio"))
            if peer(A + "optim.num_cycles") != 0.5:
                out.differs.append(f"{peer.show(A + 'optim.num_cycles')}: minirl's cosine is half a wave (0.5)")
    else:
        out.not_translated.append(f"lr_scheduler_type={style!r}: minirl's optim.lr_schedule is constant, linear or cosine")
    if out.values.get("optim.warmup_updates"):
        out.differs.append("the warm-up: verl's starts at 0 (update k at k/W of the rate), minirl's at 1/W ((k + 1)/W)")
    out.set("optim.gradient_checkpointing", bool(peer(M + "enable_gradient_checkpointing")),
            peer.show(M + "enable_gradient_checkpointing"))
    out.set("optim.padding_free", bool(peer(M + "use_remove_padding")), peer.show(M + "use_remove_padding"))
    _verl_offload(peer, out)
    if peer(A + "use_prefix_grouper"):  # (verl's needs use_remove_padding=False; minirl's runs the padding-free forward)
        out.set("optim.shared_prompt", True, peer.show(A + "use_prefix_grouper"))
    _verl_precision(peer, out)
    for key in (A + "megatron.router_replay.mode", A + "router_replay.mode", A + "veomni.router_replay.mode"):
        if peer(key) in ("R2", "R3"):
            out.set("moe.routing_replay", peer(key), peer.show(key, R + "enable_rollout_routing_replay"))


def _verl_runs(peer: Peer, out: Translation) -> None:
    named = {key: _run_name(peer, out, key) for key in ("trainer.project_name", "trainer.experiment_name")}
    local = peer("trainer.default_local_dir") or f"checkpoints/{named['trainer.project_name']}/{named['trainer.experiment_name']}"
    local = local.replace("${trainer.project_name}", str(named["trainer.project_name"]))
    local = local.replace("${trainer.experiment_name}", str(named["trainer.experiment_name"]))
    out.set("run.output_dir", str(Path(local).parent), peer.show("trainer.default_local_dir") if peer("trainer.default_local_dir") else "trainer.project_name")
    out.set("run.name", Path(local).name, "trainer.experiment_name")
    if peer("data.seed") is not None:
        out.set("run.seed", int(peer("data.seed")), peer.show("data.seed"))
    out.set("run.resume", "auto" if peer("trainer.resume_mode") == "auto" else "never", peer.show("trainer.resume_mode"))
    if peer("trainer.resume_from_path") and peer("trainer.resume_mode") == "resume_path":  # read by verl only then
        out.not_translated.append(f"{peer.show('trainer.resume_mode', 'trainer.resume_from_path')}: a verl checkpoint; "
                                  "minirl resumes its own run directory (run.resume), or starts from a model directory "
                                  "(minirl train --start-from DIR)")
    if peer("trainer.save_freq") and peer("trainer.save_freq") > 0:
        out.set("checkpoint.every_steps", int(peer("trainer.save_freq")), peer.show("trainer.save_freq"))
    else:
        out.set("checkpoint.every_steps", 0, peer.show("trainer.save_freq"))
    if peer("trainer.max_actor_ckpt_to_keep"):
        out.set("checkpoint.keep_last", int(peer("trainer.max_actor_ckpt_to_keep")), peer.show("trainer.max_actor_ckpt_to_keep"))
    key = "rollout.test_freq" if _fully_async(peer) else "trainer.test_freq"  # the former counts parameter syncs
    frequency = peer(key)
    out.set("eval.every_steps", int(frequency) if frequency and frequency > 0 else 0, peer.show(key))
    temperature, n = float(peer(R + "val_kwargs.temperature") or 0), int(peer(R + "val_kwargs.n"))
    out.set("eval.temperature", temperature, peer.show(R + "val_kwargs.temperature") + (" (greedy)" if temperature == 0 else ""))
    if temperature == 0 and n != 1:
        out.set("eval.samples_per_prompt", 1, peer.show(R + "val_kwargs.n"))
        out.differs.append(f"{peer.show(R + 'val_kwargs.n')} with greedy validation: minirl evaluates each prompt once "
                           "(its n greedy samples would be identical)")
    else:
        out.set("eval.samples_per_prompt", n, peer.show(R + "val_kwargs.n"))
    out.set("eval.top_p", float(peer(R + "val_kwargs.top_p")), peer.show(R + "val_kwargs.top_p"))
    out.set("eval.top_k", max(0, int(peer(R + "val_kwargs.top_k") or 0)), peer.show(R + "val_kwargs.top_k"))
    if peer("trainer.log_val_generations"):
        out.set("log.completions_per_step", int(peer("trainer.log_val_generations")), peer.show("trainer.log_val_generations"))
    report_to(peer("trainer.logger"), out, "trainer.logger")


def _verl_objective(peer: Peer, n: int) -> Objective:
    """verl's actor loss (``core_algos``: vanilla PPO, GSPO or SAPO, ``agg_loss``; or its bypass mode's) as algo.*
    values, or why not."""
    obj = Objective()
    _verl_advantage(peer, obj)
    if peer("algorithm.use_kl_in_reward"):
        _verl_kl_in_reward(peer, obj)
    if peer(A + "entropy_coeff"):
        obj.set("entropy_coef", float(peer(A + "entropy_coeff")), peer.show(A + "entropy_coeff"))
        if peer(A + "loss_agg_mode") != "token-mean":
            obj.differs.append(f"{peer.show(A + 'entropy_coeff')}: verl aggregates the entropy like the policy loss "
                               f"({peer.show(A + 'loss_agg_mode')}), minirl's bonus is its token mean")
    if peer(BYPASS):
        _verl_bypass(peer, obj, n)
    else:
        _verl_loss(peer, obj, n, peer(A + "policy_loss.loss_mode"), peer("algorithm.rollout_correction.rollout_is"))
        if peer("algorithm.rollout_correction.rollout_rs") is not None:
            _verl_rejection(peer, obj)
    if peer(A + "use_kl_loss"):
        kind = VERL_KL_KINDS.get(peer(A + "kl_loss_type"))
        if kind is None:
            obj.blockers.append(peer.show(A + "kl_loss_type"))
        else:
            obj.set("kl_coef", float(peer(A + "kl_loss_coef")), peer.show(A + "use_kl_loss", A + "kl_loss_coef"))
            obj.set("kl_loss_type", kind, peer.show(A + "kl_loss_type"))
    return obj


BYPASS = "algorithm.rollout_correction.bypass_mode"


def _verl_loss(peer: Peer, obj: Objective, n: int, mode: str, rollout_is: str | None) -> None:
    """The policy loss of ``policy_loss.loss_mode`` ``mode`` with ``loss_agg_mode``, its dual clip and its IS weights
    (``rollout_is``: None, token or sequence, of pi_old / mu_old)."""
    agg = peer(A + "loss_agg_mode")
    if mode == "gpg":
        _verl_gpg_loss(peer, obj, n, agg, rollout_is)
        return
    name = _verl_loss_name(peer, obj, mode, agg)
    if name is None:
        return
    if name == "minirl":  # PPO's min/clip gradient is MiniRL's clip mask with the weight pi_theta/pi_old
        obj.set("clip", True, "PPO's min(r A, clip(r) A): a token mask")
        obj.set("aggregation", "token_mean" if agg == "token-mean" else "seq_sum", peer.show(A + "loss_agg_mode"))
        _verl_normalizer(peer, obj, n, agg)
    if mode == "vanilla" and peer(A + "clip_ratio_c") and name in ("minirl", "grpo"):  # verl's dual clip, always on
        obj.set("dual_clip", float(peer(A + "clip_ratio_c")), peer.show(A + "clip_ratio_c"))
    if rollout_is not in (None, "token", "sequence") or (rollout_is and name == "gspo"):
        obj.blockers.append(peer.show("algorithm.rollout_correction.rollout_is") + (" with GSPO" if name == "gspo" else ""))
    if name != "gspo":  # verl multiplies each token by its bounded pi_old / mu_old, detached
        obj.set("is_correction", rollout_is is not None, peer.show("algorithm.rollout_correction.rollout_is"))
        if rollout_is in ("token", "sequence"):
            _verl_is_bounds(peer, obj, rollout_is)
        if name == "minirl":
            obj.set("tis_placement", "train_infer", "w = min(pi_old/mu_old, cap) x pi_theta/pi_old: verl's weight")


VERL_AGGREGATION = {"token-mean": "token_mean", "seq-mean-token-sum": "seq_sum", "seq-mean-token-mean": "seq_mean",
                    "token-sum": "seq_sum", "seq-mean-token-sum-norm": "seq_sum"}
"""verl's ``loss_agg_mode`` as MiniRL's aggregation (with ``_verl_normalizer``'s constants)."""


def _verl_gpg_loss(peer: Peer, obj: Objective, n: int, agg: str, rollout_is: str | None) -> None:
    """verl's ``policy_loss.loss_mode: gpg`` (``compute_policy_loss_gpg``, GPG arXiv 2504.02546): -A log pi_theta with
    no clip, times the bounded pi_old/mu_old under ``rollout_is``: MiniRL's Eq. (7) unclipped without its
    pi_theta/pi_old factor (``staleness_weight: false``)."""
    mode, aggregation = peer.show(A + "policy_loss.loss_mode"), VERL_AGGREGATION.get(agg)
    if aggregation is None or rollout_is not in (None, "token", "sequence"):
        obj.blockers.append(peer.show(A + "policy_loss.loss_mode", A + "loss_agg_mode",
                                      "algorithm.rollout_correction.rollout_is"))
        return
    obj.set("name", "minirl", mode + ": -A log pi_theta, MiniRL's Eq. (7) unclipped")
    obj.set("clip", False, mode + " (no clipping)")
    obj.set("aggregation", aggregation, peer.show(A + "loss_agg_mode"))
    _verl_normalizer(peer, obj, n, agg)
    obj.set("staleness_weight", False, mode + ": no pi_theta/pi_old in the weight")
    obj.set("is_correction", rollout_is is not None, peer.show("algorithm.rollout_correction.rollout_is"))
    if rollout_is is not None:
        _verl_is_bounds(peer, obj, rollout_is)


def _verl_normalizer(peer: Peer, obj: Objective, n: int, agg: str) -> None:
    """The constant denominators of verl's summing aggregations."""
    responses = peer("data.train_batch_size") // n * peer(R + "n")
    if agg == "seq-mean-token-sum-norm":
        factor = peer(A + "loss_scale_factor") or peer("data.max_response_length")
        obj.set("normalizer", float(responses * factor), f"{responses} responses per mini-batch x {factor}")
        if not peer(A + "loss_scale_factor"):
            obj.differs.append("loss_agg_mode='seq-mean-token-sum-norm' without loss_scale_factor: verl divides by "
                               "each micro-batch's padded width, minirl by data.max_response_length")
    elif agg == "token-sum":
        obj.set("normalizer", 1.0, "token-sum: no division")


def _verl_bypass(peer: Peer, obj: Objective, n: int) -> None:
    """verl's bypass mode (``apply_bypass_mode``, ``compute_policy_loss_bypass_mode``): pi_old := mu_old (no
    old-log-prob pass) and, whatever ``policy_loss.loss_mode`` says, ``loss_type: ppo_clip`` = vanilla PPO on
    pi_theta/mu_old with no IS weight, or ``reinforce`` = REINFORCE weighed by the bounded, detached pi_theta/mu_old
    (``rollout_is``, of pi_theta there). Its rejection (``rollout_rs``) is of pi_theta/mu_old inside the loss, as
    minirl's ``algo.reject`` is under this setting (not with seq-mean-token-mean, whose per-response means it changes)."""
    loss_type, rollout_is = peer("algorithm.rollout_correction.loss_type"), peer("algorithm.rollout_correction.rollout_is")
    obj.set("logp_old_source", "rollout", peer.show(BYPASS) + " (pi_old := mu_old)")
    if peer("algorithm.rollout_correction.rollout_rs") is not None:
        if peer(A + "loss_agg_mode") == "seq-mean-token-mean":  # verl's per-response mean over the kept tokens
            obj.blockers.append(peer.show(BYPASS, "algorithm.rollout_correction.rollout_rs", A + "loss_agg_mode"))
        else:  # on pi_theta/mu_old in each update's loss, the mini-batch's token count unchanged: minirl's in bypass
            _verl_rejection(peer, obj, in_loss=True)
    if loss_type == "ppo_clip":  # verl computes the IS weights for its metrics only
        _verl_loss(peer, obj, n, "vanilla", None)
        return
    agg = peer(A + "loss_agg_mode")
    aggregation = VERL_AGGREGATION.get(agg)
    if loss_type != "reinforce" or rollout_is not in (None, "token", "sequence") or aggregation is None:
        obj.blockers.append(peer.show(BYPASS, "algorithm.rollout_correction.loss_type", "algorithm.rollout_correction.rollout_is",
                                      A + "loss_agg_mode"))
        return
    origin = peer.show("algorithm.rollout_correction.loss_type")
    obj.set("name", "minirl", origin + ": REINFORCE, MiniRL's Eq. (7) unclipped")
    obj.set("clip", False, origin + " (no clipping)")
    obj.set("aggregation", aggregation, peer.show(A + "loss_agg_mode"))
    _verl_normalizer(peer, obj, n, agg)
    obj.set("is_correction", rollout_is is not None, peer.show("algorithm.rollout_correction.rollout_is"))
    if rollout_is is None:  # verl's -A log pi_theta, unweighted
        obj.set("staleness_weight", False, origin + " without rollout_is: w = 1")
        return
    obj.set("tis_placement", "full", origin + ": w = bounded pi_theta/mu_old")
    _verl_is_bounds(peer, obj, rollout_is)


VERL_KL_KINDS = {"low_var_kl": "k3", "k3": "k3", "kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2"}


def _verl_kl_in_reward(peer: Peer, obj: Objective) -> None:
    """``algorithm.use_kl_in_reward`` (``apply_kl_penalty``, fixed or adaptive ``kl_ctrl``) as algo.kl_in_reward_*."""
    kind, control = VERL_KL_KINDS.get(peer("algorithm.kl_penalty")), peer("algorithm.kl_ctrl.type")
    if kind is None or control not in ("fixed", "adaptive"):
        obj.blockers.append(peer.show("algorithm.use_kl_in_reward", "algorithm.kl_penalty", "algorithm.kl_ctrl.type"))
        return
    obj.set("kl_in_reward_coef", float(peer("algorithm.kl_ctrl.kl_coef")),
            peer.show("algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef"))
    obj.set("kl_in_reward_type", kind, peer.show("algorithm.kl_penalty"))
    if control == "adaptive":
        obj.set("kl_in_reward_target", float(peer("algorithm.kl_ctrl.target_kl")),
                peer.show("algorithm.kl_ctrl.type", "algorithm.kl_ctrl.target_kl"))
        obj.set("kl_in_reward_horizon", int(peer("algorithm.kl_ctrl.horizon")), peer.show("algorithm.kl_ctrl.horizon"))


def _verl_loss_name(peer: Peer, obj: Objective, mode: str, agg: str) -> str | None:
    """minirl's loss for verl's ``policy_loss.loss_mode`` and ``loss_agg_mode`` (GSPO and SAPO aggregate per response
    whatever the mode says), with its clip range or SAPO's temperatures; None (and a blocker) when minirl has none."""
    name = {"gspo": "gspo", "sapo": "sapo"}.get(mode) or {
        "seq-mean-token-mean": "grpo", "token-mean": "minirl", "token-sum": "minirl", "seq-mean-token-sum": "minirl",
        "seq-mean-token-sum-norm": "minirl"}.get(agg)
    if mode not in ("vanilla", "gspo", "sapo") or name is None:
        obj.blockers.append(peer.show(A + "policy_loss.loss_mode", A + "loss_agg_mode"))
        return None
    obj.set("name", name, peer.show(A + "policy_loss.loss_mode", A + "loss_agg_mode"))
    if name == "sapo":  # a soft gate instead of the clip
        obj.set("tau_pos", float(peer(A + "tau_pos")), peer.show(A + "tau_pos"))
        obj.set("tau_neg", float(peer(A + "tau_neg")), peer.show(A + "tau_neg"))
        return name
    low_key = A + ("clip_ratio_low" if peer(A + "clip_ratio_low") is not None else "clip_ratio")
    high_key = A + ("clip_ratio_high" if peer(A + "clip_ratio_high") is not None else "clip_ratio")
    obj.set("eps_low", float(peer(low_key)), peer.show(low_key))
    obj.set("eps_high", float(peer(high_key)), peer.show(high_key))
    return name


VERL_NO_ADVANTAGE = {"gdpo": "algorithm.gdpo_reward_keys and a custom_reward_function returning them"}
"""verl's estimators minirl has no form of, and what each would need."""


def _custom_reward(peer: Peer) -> str:
    """The key of verl's ``custom_reward_function.path`` the run sets (either prefix), or ''."""
    return next((key for key in ("custom_reward_function.path", "reward.custom_reward_function.path") if peer(key)), "")


def _verl_gdpo_rewards(peer: Peer, out: Translation, manager: Any) -> None:
    """verl's ``gdpo``: one ``task.reward_functions`` entry per ``algorithm.gdpo_reward_keys`` key, each reading that
    entry of your ``compute_score``'s dict (``key``) with its ``gdpo_reward_weights`` weight (1 each by default)."""
    keys, weights = peer("algorithm.gdpo_reward_keys"), peer("algorithm.gdpo_reward_weights")
    functions = out.values.get("task.reward_functions") or [{"function": out.values.get("task.reward_function")}]
    if not keys or not _custom_reward(peer) or len(functions) != 1:
        return  # verl asserts without them; the advantage translation names the blocker
    keys = [str(k) for k in (keys if isinstance(keys, list) else [keys])]
    weights = [float(w) for w in (weights if isinstance(weights, list) else [weights])] if weights else [1.0] * len(keys)
    if len(weights) != len(keys):
        raise ConfigError(f"verl settings {peer.show('algorithm.gdpo_reward_keys', 'algorithm.gdpo_reward_weights')}: "
                          "one weight per key")
    entries = [{**functions[0], "key": k, "weight": w, "name": k} for k, w in zip(keys, weights)]
    out.values.pop("task.reward_function", None)
    shown = [_custom_reward(peer), "algorithm.gdpo_reward_keys"] + (["algorithm.gdpo_reward_weights"] if peer(
        "algorithm.gdpo_reward_weights") else [])
    out.set("task.reward_functions", entries, peer.show(*shown))
    out.differs.append(f"{peer.show('algorithm.gdpo_reward_keys')}: minirl calls compute_score once per key (the same "
                       "function, each entry reading its key); train/reward_mean is their weighted sum, not 'score'")
    if manager == "dapo":
        out.not_translated.append("reward_model.reward_manager=dapo with gdpo: verl's GDPO reads only its reward keys, "
                                  "so the overlong buffer is left out")


def _verl_advantage(peer: Peer, obj: Objective) -> None:
    """verl's outcome advantage estimators (``core_algos``) as minirl's ``algo.adv_*``: grpo, rloo, opo, grpo_passk,
    gpg, remax, reinforce_plus_plus(_baseline), (tir_)optimal_token_baseline and the two vectorized forms; the others
    are blockers
    (``VERL_NO_ADVANTAGE``)."""
    key = "algorithm.adv_estimator"
    estimator = str(peer(key)).removesuffix("_vectorized")
    if peer(R + "n") == 1 and str(peer(key)) in ("grpo", "grpo_vectorized", "rloo", "opo", "reinforce_plus_plus_baseline"):
        _verl_one_response(peer, obj, estimator)  # (rloo_vectorized gives a singleton 0, not its reward)
        return
    if estimator == "gdpo" and peer("algorithm.gdpo_reward_keys") and _custom_reward(peer):
        if not peer("algorithm.norm_adv_by_std_in_grpo"):
            obj.blockers.append(peer.show(key, "algorithm.norm_adv_by_std_in_grpo") + " (minirl's GDPO divides each "
                                "reward by its group's std)")
            return
        obj.set("multi_objective_aggregation", "normalize_then_sum", peer.show(key, "algorithm.gdpo_reward_keys") +
                ": each key's reward normalised within its group, their weighted sum")
        obj.set("adv_whiten", True, peer.show(key) + ": the weighted sum whitened over the batch's tokens (masked_whiten)")
        return
    if estimator == "gae":
        obj.set("adv_baseline", "critic", peer.show(key) + ": PPO's generalized advantage estimation over a learned "
                "critic's values (the critic section)")
        obj.set("adv_std_normalize", False, peer.show(key))
        obj.set("adv_whiten", True, peer.show(key) + ": the advantages whitened over the batch's tokens")
        obj.set("adv_gamma", float(peer("algorithm.gamma")), peer.show("algorithm.gamma"))
        obj.set("adv_lambda", float(peer("algorithm.lam")), peer.show("algorithm.lam"))
        return
    if estimator in ("optimal_token_baseline", "tir_optimal_token_baseline"):  # verl asserts calculate_sum_pi_squared
        obj.set("adv_baseline", "optimal_token", peer.show(key) + ": a baseline per token position, the group's returns "
                "weighted by each path's accumulated 1 - 2 pi_old + sum pi_old^2 (handle_zero_tail, verl's default)")
        obj.set("adv_std_normalize", False, peer.show(key) + " (no group std in verl's)")
        return
    if estimator in ("grpo", "grpo_passk"):
        obj.set("adv_std_normalize", bool(peer("algorithm.norm_adv_by_std_in_grpo")),
                peer.show("algorithm.norm_adv_by_std_in_grpo"))
        if estimator == "grpo_passk":
            obj.set("adv_baseline", "pass_at_k", peer.show(key) + ": only each group's best, its lead over the second")
        return
    if estimator not in ("rloo", "reinforce_plus_plus_baseline", "reinforce_plus_plus", "opo", "gpg", "remax"):
        need = VERL_NO_ADVANTAGE.get(estimator, "an estimator minirl does not know")
        obj.blockers.append(f"{peer.show(key)} (needs {need}; minirl's: gae, grpo, rloo, opo, grpo_passk, gpg, remax, "
                            "reinforce_plus_plus, reinforce_plus_plus_baseline, optimal_token_baseline)")
        return
    obj.set("adv_std_normalize", False, peer.show(key) + " (no group std in verl's)")
    if estimator == "rloo":
        obj.set("adv_baseline", "leave_one_out", peer.show(key))
    elif estimator == "opo":
        obj.set("adv_baseline", "length_weighted", peer.show(key) + ": the group's length-weighted mean reward")
    elif estimator == "gpg":
        obj.set("adv_nonzero_rescale", True, peer.show(key) + ": the group mean, x responses / non-zero rewards")
    elif estimator == "remax":
        obj.set("adv_baseline", "greedy", peer.show(key) + ": the reward of a greedy completion of the prompt")
        if peer("algorithm.use_kl_in_reward"):  # verl's remax sums the token rewards undiscounted (no gamma)
            obj.set("adv_token_returns", True, peer.show(key, "algorithm.use_kl_in_reward") + ": each token's return, "
                    "the KL of that token and those after it, less the greedy reward")
    elif estimator == "reinforce_plus_plus_baseline":
        obj.set("adv_whiten", True, peer.show(key) + ": the group mean, then whitened over tokens")
    else:
        _verl_reinforce_plus_plus(peer, obj)


def _verl_one_response(peer: Peer, obj: Objective, estimator: str) -> None:
    """``rollout.n=1`` with a group estimator: verl's baseline of a one-response group is 0 (GRPO: mean 0, std 1), so
    the advantage is the raw reward (reinforce_plus_plus_baseline: then whitened over the tokens)."""
    origin = peer.show("algorithm.adv_estimator", R + "n") + ": verl's baseline of a one-response group is 0"
    obj.set("adv_baseline", "none", origin + " (the raw reward)")
    obj.set("adv_std_normalize", False, origin + (" (std 1)" if estimator == "grpo" else ""))
    if estimator == "reinforce_plus_plus_baseline":
        obj.set("adv_whiten", True, origin + ", then whitened over the tokens (masked_whiten)")
    if estimator == "grpo" and peer("algorithm.norm_adv_by_std_in_grpo"):
        obj.differs.append(f"{peer.show('algorithm.adv_estimator', R + 'n')}: verl divides the raw reward by 1 + 1e-6 "
                           "(its epsilon), minirl not")


def _verl_critic(peer: Peer, out: Translation) -> None:
    """verl's critic worker (``critic.*``, ``trainer.critic_warmup``) as minirl's ``critic`` section: its optimizer, value
    clip, epochs and warm-up; it trains on the actor's mini-batches with a token-mean loss."""
    out.set("critic.lr", float(peer("critic.optim.lr")), peer.show("critic.optim.lr"))
    out.set("critic.weight_decay", float(peer("critic.optim.weight_decay")), peer.show("critic.optim.weight_decay"))
    out.set("critic.grad_clip_norm", float(peer("critic.grad_clip")), peer.show("critic.grad_clip"))
    out.set("critic.clip_value_range", float(peer("critic.cliprange_value")), peer.show("critic.cliprange_value"))
    out.set("critic.warmup_steps", int(peer("trainer.critic_warmup")), peer.show("trainer.critic_warmup"))
    if peer("critic.ppo_epochs") is not None:
        out.set("critic.epochs_per_step", int(peer("critic.ppo_epochs")), peer.show("critic.ppo_epochs"))
    path, actor = peer("critic.model.path"), peer(M + "path")
    if path and path != actor:
        out.set("critic.model_path", path, peer.show("critic.model.path"))
        note_local_path(out, "critic.model.path", path, "model", target="critic.model_path")
    elif not path:
        out.differs.append("critic.model.path unset (verl's default is a placeholder path): minirl's critic starts from "
                           "the actor's weights, as verl scripts set it")
    if peer("critic.model.lora_rank"):
        out.set("critic.lora.rank", int(peer("critic.model.lora_rank")), peer.show("critic.model.lora_rank"))
        out.set("critic.lora.alpha", float(peer("critic.model.lora_alpha")), peer.show("critic.model.lora_alpha"))
        modules = peer("critic.model.target_modules")
        out.set("critic.lora.target_modules", [modules] if isinstance(modules, str) else list(modules),
                peer.show("critic.model.target_modules"))
    mini = peer("critic.ppo_mini_batch_size")
    if mini is not None and mini != peer(A + "ppo_mini_batch_size"):
        out.differs.append(f"{peer.show('critic.ppo_mini_batch_size')}: minirl's critic trains on the actor's "
                           "mini-batches")
    agg_key = "critic.loss_agg_mode" if peer("critic.loss_agg_mode") else A + "loss_agg_mode"
    aggregation = {"token-mean": "token_mean", "seq-mean-token-mean": "seq_mean", "seq-mean-token-sum": "seq_sum",
                   "seq-mean-token-sum-norm": "seq_sum_norm"}.get(str(peer(agg_key)))
    if aggregation is None:
        out.not_translated.append(f"{peer.show(agg_key)} for the critic: minirl's value loss takes token-mean, "
                                  "seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm")
    else:
        out.set("critic.loss_aggregation", aggregation, peer.show(agg_key) + " (the critic's)")
    if aggregation == "seq_sum_norm":  # verl's compute_value_loss passes agg_loss no loss_scale_factor
        out.differs.append(f"{peer.show(agg_key)} for the critic: verl divides by each micro-batch's padded response "
                           "width, minirl by rollout.max_new_tokens (data.max_response_length)")
    warmup, ratio = peer("critic.optim.lr_warmup_steps") or -1, peer("critic.optim.lr_warmup_steps_ratio")
    steps = out.values.get("optim.global_steps")  # verl gives the critic the actor's total (total_epochs' too)
    if warmup > 0:
        out.set("critic.lr_warmup_updates", int(warmup), peer.show("critic.optim.lr_warmup_steps"))
    elif ratio and steps:
        epochs = int(peer("critic.ppo_epochs") or out.values.get("optim.epochs_per_step", 1))
        out.set("critic.lr_warmup_updates", round(ratio * steps * out.values.get("optim.minibatches_per_step", 1) *
                                                  epochs), f"{ratio} x the critic's total updates")
    elif ratio:
        out.not_translated.append(f"{peer.show('critic.optim.lr_warmup_steps_ratio')} without total_training_steps")


def _verl_reinforce_plus_plus(peer: Peer, obj: Objective) -> None:
    """REINFORCE++ (no baseline): each token's discounted return, whitened over the batch's tokens. With an outcome
    reward, gamma = 1 and no KL in the reward the return is the response's reward at every token (minirl's ``none`` +
    ``adv_whiten``); otherwise minirl's token-level returns (``algo.adv_token_returns``, ``adv_gamma``)."""
    key = "algorithm.adv_estimator"
    obj.set("adv_baseline", "none", peer.show(key) + ": no baseline")
    obj.set("adv_whiten", True, peer.show(key) + ": the returns, whitened over tokens")
    gamma = float(peer("algorithm.gamma"))
    if gamma != 1.0 or peer("algorithm.use_kl_in_reward"):
        obj.set("adv_token_returns", True, peer.show(key, "algorithm.gamma", "algorithm.use_kl_in_reward") + ": each "
                "token's return, the KL of that token and those after it")
        obj.set("adv_gamma", gamma, peer.show("algorithm.gamma"))


def _verl_is_bounds(peer: Peer, obj: Objective, level: str) -> None:
    """verl's ``rollout_is`` level and ``rollout_is_threshold``: a number truncates (TIS), "lower_upper" masks
    (IcePop) — minirl's tis_level / tis_mode / tis_cap / tis_floor."""
    key = "algorithm.rollout_correction.rollout_is_threshold"
    threshold = peer(key)
    text = str(threshold).strip()
    try:
        lower, upper = (text.split("_", 1) if "_" in text else (None, text))
        bounds = (float(lower) if lower is not None else 0.0, float(upper))
    except ValueError:
        raise ConfigError(f"{key}={threshold!r}: a number (truncate) or 'lower_upper' (mask), as verl reads it") from None
    obj.set("tis_level", level, peer.show("algorithm.rollout_correction.rollout_is"))
    obj.set("tis_mode", "mask" if lower is not None else "truncate", peer.show(key))
    obj.set("tis_cap", bounds[1], peer.show(key))
    obj.set("tis_floor", bounds[0], peer.show(key))
    if level == "sequence":
        obj.differs.append(f"{peer.show('algorithm.rollout_correction.rollout_is')}: verl bounds the sequence's log-ratio "
                           "to +-20 before exp, minirl does not (the same whenever the bound is below e^20)")


def _verl_rejection(peer: Peer, obj: Objective, *, in_loss: bool = False) -> None:
    """verl's ``rollout_rs`` (one option) and ``rollout_rs_threshold`` as minirl's algo.reject / reject_low /
    reject_high. verl bounds k1 on mu/pi_old ("lower_upper", or upper alone with lower = 1/upper), minirl on
    pi_old/mu: the bounds swap and invert. ``in_loss``: bypass mode's, on pi_theta (the IS weights of the whole
    response mask, as verl's)."""
    rule_key, key = "algorithm.rollout_correction.rollout_rs", "algorithm.rollout_correction.rollout_rs_threshold"
    rule, threshold = str(peer(rule_key)).strip(), peer(key)
    if rule not in get_args(MiniRLConfig.model_fields["reject"].annotation)[1:] or threshold is None:
        obj.blockers.append(peer.show(rule_key, key))  # several options at once, or no threshold (verl refuses)
        return
    try:
        parts = [float(part) for part in str(threshold).split("_", 1)]
        if rule.endswith("k1"):
            lower, upper = parts if len(parts) == 2 else (1 / parts[0], parts[0])
            low, high = 1 / upper, 1 / lower
        elif len(parts) == 1:
            low, high = 0.0, parts[0]  # k2 / k3: an upper bound on the divergence
        else:
            raise ValueError
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"{key}={threshold!r}: verl reads a number (k1: also 'lower_upper') for {rule_key}={rule}") from None
    obj.set("reject", rule, peer.show(rule_key))
    if rule.endswith("k1"):
        obj.set("reject_low", low, f"{peer.show(key)} (verl's bounds on mu/pi_old, inverted)")
    obj.set("reject_high", high, peer.show(key))
    obj.differs.append(f"{peer.show(rule_key)}: verl clamps each token's log-ratio to +-20 before the statistic, minirl "
                       "does not (the same unless a token's ratio passes e^20)")
    if rule.startswith("token") and peer("algorithm.rollout_correction.rollout_is") == "sequence" and not in_loss:
        obj.differs.append(f"{peer.show(rule_key, 'algorithm.rollout_correction.rollout_is')}: verl's sequence weight "
                           "multiplies every token's ratio, minirl's those of the tokens the rejection kept")


def read_verl(paths: list[str], words: list[str]) -> dict[str, Any]:
    """verl settings from run scripts (``.sh``; ``-m``: the module one runs), YAML configs (flattened) and
    ``key=value`` words."""
    given: dict[str, Any] = {}
    for path in paths:
        if path.endswith((".yaml", ".yml")):
            given.update(flatten(read_yaml(path), skip=("defaults", "hydra", "_target_")))
        else:
            overrides = script_overrides(Path(path))
            given.update(_hydra_config(overrides, path))
            lines = given.get("$conditional", []) + overrides.pop("$conditional", [])  # each script's, all kept
            given.update(overrides | ({"$conditional": lines} if lines else {}))
            module = re.search(r"-m\s+((?:verl|recipe)\.[\w.]+)", Path(path).read_text(encoding="utf-8"))
            if module:  # main_ppo, or one of verl's asynchronous trainers
                given["-m"] = module.group(1)
    for word in words:
        key, _, value = word.partition("=")
        given[key] = parse_value(value)
    return given


_OVERRIDE = re.compile(r"^(\+{0,2}~?[A-Za-z_][\w-]*(?:\.[\w-]+)+)=(.*)$", re.S)
_HYDRA_FLAGS = ("--config-path", "--config-name")
VERL_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")
"""verl's own trainer configs (``verl/trainer/config``), which a script names with a relative ``--config-path``."""
_HYDRA_SHORT = {"-cp": "--config-path", "-cn": "--config-name"}


def _hydra_flags(words: list[str]) -> dict[str, str]:
    """A command's ``--config-path`` / ``--config-name`` (``-cp`` / ``-cn``; ``=value`` or the next word), as Hydra
    reads them."""
    found = {}
    for k, word in enumerate(words):
        flag, equals, value = word.partition("=")
        flag = _HYDRA_SHORT.get(flag, flag)
        if flag in _HYDRA_FLAGS and (equals or k + 1 < len(words)):
            found[flag] = value if equals else words[k + 1]
    return found


def _hydra_config(overrides: dict[str, Any], script: str) -> dict[str, Any]:
    """The settings of the config a run script names (Hydra's ``--config-path`` / ``--config-name``, as verl's
    examples do), flattened, under the script's own overrides; ``overrides`` loses the two flags."""
    folder, name = (overrides.pop(flag, None) for flag in _HYDRA_FLAGS)
    if name is None:
        return {}
    if isinstance(folder, Unresolved) or isinstance(name, Unresolved):
        raise ConfigError(f"{script}: its --config-path / --config-name are not known here; give the config YAML "
                          "after the script (minirl config from-verl run.sh config.yaml)")
    if Path(str(name)).stem in VERL_CONFIGS and not Path(str(folder or ".")).is_absolute():
        return {}  # verl's own config (Hydra reads a relative path from main_ppo.py's folder): the defaults used here
    file = Path(str(folder or ".")) / (str(name) if str(name).endswith((".yaml", ".yml")) else f"{name}.yaml")
    if not file.is_file():
        raise ConfigError(f"{script}: --config-name {name} names {file}, not found here; give the config YAML after "
                          "the script (minirl config from-verl run.sh config.yaml)")
    return flatten(read_yaml(str(file)), skip=("defaults", "hydra", "_target_"))


def script_overrides(path: Path) -> dict[str, Any]:
    """The ``key=value`` Hydra overrides of a verl run script, read as bash reads the script (``shell.statements``:
    redirections, ``&&`` / ``||``, groups and quotes), with its ``NAME=value`` variables and arrays (and the
    environment's) expanded; an override naming a variable set nowhere, or a command's output (not run here), is kept
    ``Unresolved`` (an error line once a translation needs it; a setting minirl ignores may stay unresolved). A
    ``"${ARGS[@]}"`` word of a command gives the array's overrides (verl's examples gather them in ``DATA=(...)``,
    ``ACTOR=(...)`` arrays), each as bash expanded it where the array was set; an unquoted ``$EXTRA`` holding several
    overrides gives each. ``$(pwd)`` is the directory this runs in until the script changes directory (verl's
    examples set ``PROJECT_DIR="$(pwd)"``, run from the repository). An ``if`` / ``elif`` / ``else`` or ``case``
    branch whose condition is known here (``shell.condition``: ``[ "$X" = v ]``, ``[[ $X == v* ]]``, ``-n`` / ``-z``,
    integer tests; ``shell.case_matches``) runs alone; an undecided one is read as if it ran, the last assignment
    winning, and ``$conditional`` has a line for each variable set in one that an override takes
    (``_Script.conditional``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from None
    _parses(path)
    script = _Script(path, text.splitlines(), {**os.environ, **arguments((), str(path))})  # `bash run.sh`
    moved = False  # the script changed directory: $(pwd) is not known here

    def decide(kind: str, words: list[str]) -> bool | None:  # an if / case branch, with the variables at that point
        if any(depends_on(word, script.tainted) for word in words):  # a value set in an undecided branch: unknown
            return None
        read = condition if kind == "if" else case_matches
        return read(words if moved else [_here(word) for word in words], script.variables, script.arrays)

    for number, words, how in statements(text, decide):
        moved = moved or unquoted(words[0]) in ("cd", "pushd", "popd")
        words = words if moved else [_here(word) for word in words]
        for word in words:  # ${X:=v}: bash assigns X as it expands the word
            for name, value in default_assignments(word, script.variables):
                script.assign(name, value, number, how)
        array = ARRAY.fullmatch(words[0])
        if array and words[1:2] == [OPEN]:
            items = words[2:words.index(CLOSE)] if CLOSE in words else words[2:]
            script.assign_array(array.group(1), items, bool(array.group(2)), number, how)
        elif all(NAME_VALUE.fullmatch(word) for word in words):
            for name, value in (NAME_VALUE.fullmatch(word).groups() for word in words):  # type: ignore[union-attr]
                script.assign(name, value, number, how)
        else:
            script.command(words, number, how)
    if not script.overrides:
        raise ConfigError(f"{path}: no verl key=value overrides found (expected e.g. data.train_files=...)")
    lines = script.conditional()
    return script.overrides | ({"$conditional": lines} if lines else {})


def _parses(path: Path) -> None:
    """One line when bash cannot parse the script (``bash -n``: read, nothing run), where there is a bash."""
    shell = shutil.which("bash")
    if shell is None:
        return
    try:
        checked = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return
    if checked.returncode != 0:
        said = next((line.strip() for line in checked.stderr.splitlines() if line.strip()), "a syntax error")
        raise ConfigError(f"{path}: bash cannot parse it ({said.removeprefix(f'{path}: ')}), so verl's run would not "
                          "start from it either: mend the script")


@dataclass
class _Script:
    """What reading a run script has found so far: its variables and arrays, each array's words as written (with
    their expansion there and line), the variables set from a command's output (the command and its file:line), the
    conditionally set names behind each variable (``tainted``) and where each was so set, and the overrides."""

    path: Path
    lines: list[str]
    variables: dict[str, str]
    arrays: dict[str, list[str | None]] = field(default_factory=dict)
    written: dict[str, list[_Item]] = field(default_factory=dict)
    commanded: dict[str, str] = field(default_factory=dict)
    tainted: dict[str, set[str]] = field(default_factory=dict)
    where: dict[str, tuple[int, str]] = field(default_factory=dict)
    taken: dict[str, list[str]] = field(default_factory=dict)  # conditional name -> the override keys taking it
    overrides: dict[str, Any] = field(default_factory=dict)

    def _mark(self, name: str, behind: set[str], number: int, how: str) -> None:
        self.tainted[name] = behind | ({name} if how else set())
        if how:
            self.where[name] = (number, how)

    def assign(self, name: str, value: str, number: int, how: str) -> None:
        _assign(self.variables, self.arrays, name, value, f"{self.path}:{number}")
        command = command_behind(value, self.commanded, f"{self.path}:{number}")
        if command is None:
            self.commanded.pop(name, None)
        else:
            self.commanded[name] = command
        self._mark(name, depends_on(value, self.tainted), number, how)

    def assign_array(self, name: str, items: list[str], append: bool, number: int, how: str) -> None:
        listed = [_Item(item, fields(item, self.variables, arrays=self.arrays), number, name) for item in items]
        self.written[name] = (self.written.get(name, []) if append else []) + listed
        _assign_array(self.variables, self.arrays, name, items, append)
        behind = set().union(*(depends_on(item, self.tainted) for item in items)) | (self.tainted.get(name, set()) if append else set())
        self._mark(name, behind, number, how)

    def command(self, words: list[str], number: int, how: str) -> None:
        """A command's overrides (and Hydra's ``--config-path`` / ``--config-name``): its ``key=value`` words, an
        array's elements it splices in, the overrides an unquoted ``$EXTRA`` expands to."""
        spliced = _spliced(words, number, self.written)
        expansions = [item.expanded if item.expanded is not None else fields(item.word, self.variables,
                                                                             arrays=self.arrays) for item in spliced]
        self.overrides |= _hydra_flags([part for parts in expansions for part in parts or []])
        for item, parts in zip(spliced, expansions, strict=True):
            whole = _OVERRIDE.match(unquoted(item.word)) if item.expanded is None else None
            if whole:
                self._word(item, whole.group(1), whole.group(2), parts)
                self._took(whole.group(1), item, number, how)
                continue
            for part in parts or []:  # an array's element, or what a word such as $EXTRA expands to
                known = _OVERRIDE.match(part)
                if known:
                    self.overrides[known.group(1)] = parse_value(known.group(2))
                    self._took(known.group(1), item, number, how)

    def _word(self, item: _Item, key: str, value: str, expanded: list[str] | None) -> None:
        """A ``key=value`` word of the command: its value, or why it is not known here."""
        at = item.line + next((i for i, part in enumerate(self.lines[item.line - 1:]) if f"{key}=" in part), 0)
        shown = why_unresolved(value, item.word, self.variables, self.arrays)
        command = command_behind(item.word, self.commanded, f"{self.path}:{item.line}")
        self.overrides[key] = (parse_value(expanded[0].partition("=")[2]) if expanded is not None
                               else CommandOutput(shown, f"{self.path}:{at}", command) if command
                               else Unresolved(shown, f"{self.path}:{at}"))

    def _took(self, key: str, item: _Item, number: int, how: str) -> None:
        """``key`` set by ``item`` of the command on line ``number``: from the conditionally set names behind the word
        (or the array it came from), or by a command that itself runs conditionally (``how``)."""
        behind = depends_on(item.word, self.tainted) | self.tainted.get(item.array or "", set())
        if how:
            behind.add(f"the command on line {number}")
            self.where[f"the command on line {number}"] = (number, how)
        for name in sorted(behind):
            if key not in self.taken.setdefault(name, []):
                self.taken[name].append(key)

    def conditional(self) -> list[str]:
        """A line for each variable set inside an ``if`` / ``case`` / loop block or a function, or after ``cond &&`` /
        ``cond ||``, that an override takes (the translation reads the script's last assignment to it)."""
        out = []
        for name, keys in self.taken.items():
            if keys and name in self.where:
                line, how = self.where[name]
                read = ("runs " + how + "; the translation reads its overrides" if name.startswith("the command") else
                        f"is set {how}; the translation reads the script's last assignment to it")
                out.append(f"{self.path}:{line}: {name} {read}, whatever the condition ({', '.join(keys)} take it): "
                           "check them")
        return out


@dataclass(frozen=True)
class _Item:
    """A word of a command or of an array, its expansion where an array set it (None: a command's own word, expanded
    where it is read, or an element not known here), and the line it is on."""

    word: str
    expanded: list[str] | None
    line: int
    array: str | None = None  # the array it is an element of


def _here(word: str) -> str:
    """A word with its ``$(pwd)`` / `` `pwd` `` the directory this runs in (the script's, as long as it stays)."""
    for pwd in ("$(pwd)", "`pwd`"):
        word = word.replace(f"{COMMAND}{pwd}{UNCOMMAND}", LITERAL + os.getcwd() + UNLITERAL)
    return word


_ARRAY_WORD = re.compile(r"\$\{([A-Za-z_]\w*)\[[@*]\]\}")


def _spliced(words: list[str], number: int, written: dict[str, list[_Item]]) -> list[_Item]:
    """A command's words with each ``"${ARGS[@]}"`` (or unquoted ``${ARGS[@]}``, ``${ARGS[*]}``) of an array the script
    set replaced by that array's elements."""
    out: list[_Item] = []
    for word in words:
        whole = _ARRAY_WORD.fullmatch(unquoted(word))
        out += written[whole.group(1)] if whole and whole.group(1) in written else [_Item(word, None, number)]
    return out


def _assign(variables: dict[str, str], arrays: dict[str, list[str | None]], name: str, value: str, where: str) -> None:
    """``NAME=value`` (``shell.assigned``; ``where``: its ``file:line``): a command's output (not run here) replaces the
    environment's value too; one naming a variable set nowhere leaves NAME as it was; on an array, bash sets its first
    element."""
    expanded = assigned(value, variables, arrays, where=where)
    if expanded is None:
        return
    variables[name] = expanded
    if name in arrays:
        arrays[name][:1] = [expanded]


def _assign_array(variables: dict[str, str], arrays: dict[str, list[str | None]], name: str, items: list[str],
                  append: bool) -> None:
    """``NAME=( ... )`` / ``NAME+=( ... )``: its words as bash expands them; ``$NAME`` is the first."""
    values: list[str | None] = []
    for item in items:
        words = fields(item, variables, arrays=arrays)
        values += [assigned(item, variables, arrays)] if words is None else list(words)
    arrays[name] = (arrays.get(name, []) if append else []) + values
    first = arrays[name][0] if arrays[name] else ""
    if first is None:
        variables.pop(name, None)
    else:
        variables[name] = first
