"""TRL: the settings of ``trl grpo --config FILE`` (``GRPOConfig`` + ``ModelConfig`` + the script's
``model_name_or_path`` / ``dataset_name`` / ``reward_funcs``), read against TRL 1.16's defaults
(``grpo_config.py``; transformers' ``TrainingArguments`` for the rest), and of ``trl rloo --config FILE``
(``RLOOConfig``: the same keys less GRPO's loss options, plus ``normalize_advantages`` and ``reward_clip_range``)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from minirl.config import ConfigError
from minirl.peers.common import (
    Objective,
    Peer,
    Translation,
    apply_objective,
    count_rows,
    leftovers,
    note_local_path,
    parse_value,
    read_yaml,
    report_to,
    template_kwargs,
)
from minirl.peers.launcher import launch_processes, translate_launch
from minirl.tasks.open_r1_rewards import REGISTRY as OPEN_R1_REWARDS

TRL_DEFAULTS: dict[str, Any] = {
    # GRPOConfig (TRL 1.16) and the TrainingArguments defaults it keeps or overrides
    "learning_rate": 1e-6, "num_generations": 8, "max_completion_length": 512, "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1, "generation_batch_size": None, "steps_per_generation": None,
    "num_iterations": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0,
    "beta": 0.0, "epsilon": 0.2, "epsilon_high": None, "delta": None, "importance_sampling_level": "token",
    "loss_type": "dapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, "vespo_k_pos": 2.0,
    "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0, "scale_rewards": "group", "reward_weights": None,
    "multi_objective_aggregation": "sum_then_normalize", "mask_truncated_completions": False,
    "sync_ref_model": False, "ref_model_mixup_alpha": 0.6, "ref_model_sync_steps": 512, "top_entropy_quantile": 1.0, "entropy_coef": 0.0, "use_adaptive_entropy": False,
    "entropy_coef_min": 0.0, "entropy_coef_max": 1.0, "entropy_coef_delta": 0.005, "entropy_target": 0.2,
    "off_policy_mask_threshold": None, "use_bias_correction_kl": True, "use_vllm": False, "vllm_mode": "colocate",
    "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_max": 3.0, "vllm_importance_sampling_clip_min": None,
    "vllm_importance_sampling_cap": None, "log_completions": False, "num_completions_to_print": None,
    "max_tool_calling_iterations": None, "num_generations_eval": None, "bf16": True, "fp16": False, "gradient_checkpointing": True, "logging_steps": 10,
    "activation_checkpointing": None,
    "max_steps": -1, "num_train_epochs": 3.0, "lr_scheduler_type": "linear", "lr_scheduler_kwargs": None,
    "warmup_steps": 0, "warmup_ratio": None,
    "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0,
    "optim": "adamw_torch_fused",
    "seed": 42, "output_dir": "trainer_output", "save_strategy": "steps", "save_steps": 500, "save_total_limit": None,
    "eval_strategy": "no", "eval_steps": None, "report_to": "none", "resume_from_checkpoint": None,
    "trust_remote_code": False,
    # the script's arguments and ModelConfig
    "model_name_or_path": None, "dataset_name": None, "datasets": None, "dataset_config": None,
    "dataset_train_split": "train",
    "dataset_test_split": "test", "reward_funcs": None, "reward_model_name_or_path": None,
    "router_aux_loss_coef": None,
    "num_processes": 1, "use_peft": False, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": None,
    # open-r1's GRPO script (open_r1/grpo.py, configs.py): its prompt column, system prompt and rewards' arguments
    "dataset_prompt_column": "prompt", "system_prompt": None,
    **{key: default for _, arguments in OPEN_R1_REWARDS.values() for key, (_, default) in arguments.items()},
}

TRL_IGNORED = re.compile(
    r"^(logging_.*|log_level.*|disable_tqdm|push_to_hub|hub_.*|dataloader_.*|ds3_gather_for_generation|"
    r"vllm_(server_.*|group_port|gpu_memory_utilization|tensor_parallel_size|enable_sleep_mode|max_model_length|"
    r"model_impl)|attn_implementation|dtype|torch_dtype|model_revision|remove_unused_columns|shuffle_dataset|"
    r"pad_to_multiple_of|cache_implementation|run_name|log_unique_prompts|log_multimodal|save_only_model|"
    r"overwrite_output_dir|ddp_.*|fsdp.*|deepspeed|per_device_eval_batch_size|disable_dropout|"
    r"cast_lm_head_to_fp32|do_train|do_eval|save_safetensors|use_liger_kernel|use_liger_loss|bf16_full_eval|tf32|vllm_device|"
    r"gradient_checkpointing_kwargs|activation_checkpointing_kwargs|save_on_each_node|local_rank|use_cpu|"
    r"accelerator_config|parallelism_config|queue_maxsize|max_inflight_tasks|heartbeat_stale_after_s|request_timeout|"
    r"weight_sync_timeout|vllm_server_timeout)$")

OLDER_TRL = {
    "max_prompt_length": "translated as earlier TRL read it (prompts cut to their last tokens)",
    "warmup_ratio": "translated as a fraction of max_steps (transformers 5 takes a float warmup_steps instead)",
    "use_liger_loss": "a Liger kernel for the loss: a speed choice, ignored",
}
"""Settings earlier TRL (or transformers) versions took that TRL 1.16's ``trl grpo`` refuses: translated all the same,
each with a line, so a config from an older TRL works and its user learns it would not run on TRL 1.16."""

ASYNC_GRPO_KEYS = ("max_staleness", "weight_sync_steps", "max_inflight_tasks", "queue_maxsize", "token_budget")
"""Keys only ``trl.experimental.async_grpo.AsyncGRPOConfig`` has: a config of TRL's asynchronous trainer."""

TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")


RLOO_ONLY = {"normalize_advantages": False, "reward_clip_range": None}
"""What ``RLOOConfig`` (TRL 1.16) has and ``GRPOConfig`` has not, with its defaults."""

GRPO_ONLY = ("loss_type", "scale_rewards", "importance_sampling_level", "delta", "top_entropy_quantile", "entropy_coef",
             "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target",
             "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
             "vespo_lambda_neg", "off_policy_mask_threshold", "use_bias_correction_kl", "multi_objective_aggregation",
             "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
             "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap")
"""``GRPOConfig``'s keys that ``RLOOConfig`` has not (a TRL RLOO run refuses them; here they are not translated)."""


def from_trl(given: dict[str, Any], keep_objective: bool = False, trainer: str | None = None,
             accelerate: dict[str, Any] | None = None, train_rows: int | None = None, script: bool = True) -> Translation:
    """Translate the settings of ``trl grpo --config FILE`` or ``trl rloo --config FILE`` (a flat mapping;
    ``trainer`` None: RLOO when a key only ``RLOOConfig`` has is set, else GRPO). ``accelerate``: the settings of
    the ``accelerate launch --config_file`` it ran under (``minirl.peers.launcher.read_accelerate``), or None.
    ``train_rows``: the training rows when the data is not in the settings (``minirl.train(train_dataset=...)``);
    ``script``: the settings are a whole ``trl grpo`` run's (its dataset and rewards in them), not a ``GRPOConfig``."""
    trainer = _trl_trainer(given, trainer)
    given = launch_processes(given, accelerate)
    if trainer == "rloo":  # RLOOConfig's own defaults over GRPOConfig's (beta 0.05, num_generations 2)
        defaults = {key: value for key, value in TRL_DEFAULTS.items() if key not in GRPO_ONLY}
        peer, out = Peer(given, {**defaults, "beta": 0.05, "num_generations": 2, **RLOO_ONLY}), Translation("TRL RLOO")
    else:
        peer, out = Peer(given, TRL_DEFAULTS), Translation("TRL")
    _trl_model_and_data(peer, out)
    if script:
        _trl_script_needs(peer, out)
    _trl_said(peer, out)
    n = _trl_batch(peer, out)  # optimizer steps per global step: N x num_iterations
    _trl_optimizer(peer, out, n, train_rows)
    _trl_logprob_head(peer, out)
    _trl_async(peer, out)
    _trl_runs(peer, out, n)
    translate_launch(peer, accelerate, out)
    minibatches = out.values["optim.minibatches_per_step"]
    objective = _trl_rloo_objective(peer) if trainer == "rloo" else _trl_objective(peer, n, minibatches)
    apply_objective(out, keep_objective, objective)
    leftovers(peer, out, TRL_IGNORED)
    return out


def _trl_said(peer: Peer, out: Translation) -> None:
    """Settings minirl does not carry over that change what a TRL user gets, each said: the data's order, the weights'
    dtype, where the model is written."""
    for key, how in OLDER_TRL.items():
        if key in peer.given:
            out.differs.append(f"{peer.show(key)}: not a TRL 1.16 setting (its `trl grpo` refuses it); {how}")
    if peer.given.get("shuffle_dataset") is False:
        out.differs.append("shuffle_dataset=False: minirl draws prompts in a shuffled order each epoch (run.seed)")
    dtype = peer.given.get("dtype", peer.given.get("torch_dtype"))
    if dtype not in (None, "auto", "float32"):
        out.differs.append(f"dtype={dtype!r}: minirl keeps fp32 weights and trains in optim.precision (fp32 or bf16 "
                           "compute); the checkpoint keeps the dtype the model came in")
    if peer.given.get("output_dir"):
        out.differs.append(f"{peer.show('output_dir')}: minirl writes the run there as run.output_dir/run.name: the "
                           "final model in checkpoint/ (with adapter/ under LoRA), resumable ones in checkpoints/step_N")


def _trl_script_needs(peer: Peer, out: Translation) -> None:
    """What ``trl grpo`` refuses to run without: a dataset (``dataset_name`` or ``datasets``) and a reward
    (``reward_funcs`` or ``reward_model_name_or_path``); minirl would train its built-in task, or score with the
    task's verifier, so each missing one is a line."""
    if "task.path" not in out.values:
        out.differs.append("no dataset_name or datasets: `trl grpo` refuses to run; this config trains minirl's "
                           "built-in task (task.kind) until you give task.path")
    if not peer("reward_funcs") and not peer("reward_model_name_or_path"):
        out.differs.append("no reward_funcs: `trl grpo` refuses to run (no reward source); minirl scores with the "
                           "task's verifier (task.reward_functions to give yours)")


def _trl_trainer(given: dict[str, Any], trainer: str | None) -> str:
    """``grpo`` or ``rloo``: as asked, or RLOO when a key only ``RLOOConfig`` has is set."""
    rloo_keys = sorted(set(RLOO_ONLY) & set(given))
    if trainer is None:
        return "rloo" if rloo_keys else "grpo"
    if trainer not in ("grpo", "rloo"):
        raise ConfigError(f"TRL trainer {trainer!r}: minirl translates `trl grpo` and `trl rloo` configs")
    if trainer == "grpo" and rloo_keys:
        raise ConfigError(f"{', '.join(rloo_keys)}: RLOOConfig settings in a `trl grpo` config; translate it with "
                          "`minirl config from-trl rloo FILE`")
    return trainer


def _trl_model_and_data(peer: Peer, out: Translation) -> None:
    if peer("model_name_or_path"):
        out.set("model.path", peer("model_name_or_path"), peer.show("model_name_or_path"))
        note_local_path(out, "model_name_or_path", peer("model_name_or_path"), "model")
    if peer.set_by_user("trust_remote_code"):
        out.set("model.trust_remote_code", bool(peer("trust_remote_code")), peer.show("trust_remote_code"))
    if peer("max_tool_calling_iterations") is not None:  # the tools themselves are GRPOTrainer(tools=...)'s
        out.set("task.max_tool_iterations", int(peer("max_tool_calling_iterations")),
                peer.show("max_tool_calling_iterations") + " (give the tools as task.tools, or minirl.train(tools=...))")
    if peer("use_peft"):
        out.set("model.lora.rank", peer("lora_r"), peer.show("use_peft", "lora_r"))
        out.set("model.lora.alpha", float(peer("lora_alpha")), peer.show("lora_alpha"))
        out.set("model.lora.dropout", float(peer("lora_dropout")), peer.show("lora_dropout"))
        if peer("lora_dropout") and not peer("disable_dropout"):
            out.differs.append(f"{peer.show('lora_dropout')}: RL runs without dropout here (pi_theta / pi_old is then 1 "
                               "at theta_old; TRL's disable_dropout=True); TRL keeps it unless disable_dropout")
        if peer("lora_target_modules"):
            modules = peer("lora_target_modules")
            modules = [modules] if isinstance(modules, str) else list(modules)
            out.set("model.lora.target_modules", modules, peer.show("lora_target_modules"))
        else:
            out.differs.append("lora_target_modules unset: peft picks modules per architecture; minirl adapts its "
                               "default list (model.lora.target_modules)")
    if peer("dataset_name"):
        out.set("task.kind", "jsonl", "dataset_name given")
        out.set("task.path", peer("dataset_name"), peer.show("dataset_name"))
        note_local_path(out, "dataset_name", peer("dataset_name"), "data")
    elif peer("datasets"):
        _trl_datasets(peer, out)
    _open_r1_prompts(peer, out)
    if peer("dataset_config"):  # a dataset directory's, as TRL's load_dataset(dataset_name, name=dataset_config)
        out.set("task.dataset_config", str(peer("dataset_config")), peer.show("dataset_config"))
    if peer("dataset_train_split") != "train":
        out.set("task.train_split", str(peer("dataset_train_split")), peer.show("dataset_train_split"))
    peer("dataset_test_split")
    template_kwargs(peer, out, "chat_template_kwargs")
    _trl_rewards(peer, out)


def _trl_router_aux_loss(peer: Peer, obj: Objective) -> None:
    """TRL adds an MoE model's load-balancing loss to its loss (``router_aux_loss_coef``; unset: the model config's
    coefficient when the model returns router logits): ``algo.router_aux_loss_coef``, read off the local model's
    config when unset (named as a difference when the model is not here to read)."""
    coef = peer("router_aux_loss_coef")
    if coef is not None:
        if coef:
            obj.set("router_aux_loss_coef", float(coef), peer.show("router_aux_loss_coef"))
        return
    text = _model_config(peer)
    if text is None:
        if peer("model_name_or_path"):
            obj.differs.append("router_aux_loss_coef unset: on an MoE model TRL adds its load-balancing loss with the "
                               "model config's coefficient; set algo.router_aux_loss_coef to it (the model is not here "
                               "to read)")
        return
    if "output_router_logits" in text and text.get("router_aux_loss_coef"):
        obj.set("router_aux_loss_coef", float(text["router_aux_loss_coef"]),
                "router_aux_loss_coef unset: the model config's, as TRL takes it")


def _model_config(peer: Peer) -> dict[str, Any] | None:
    """The local model's (text) ``config.json`` as a mapping, or None when the model is not here to read."""
    config = Path(os.path.expanduser(str(peer("model_name_or_path") or ""))) / "config.json"
    try:
        text = json.loads(config.read_text()) if config.is_file() else None
    except (OSError, ValueError):
        return None
    return None if not isinstance(text, dict) else text.get("text_config", text)


LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier")


def _trl_logprob_head(peer: Peer, out: Translation) -> None:
    """TRL's GRPOTrainer always scores with its fused LM head (``add_fused_lm_head``: per-token log-probs in tiles,
    never the whole logits): ``optim.logprob_chunk_tokens``, unless the local model soft-caps or scales its logits
    after the head, which minirl's chunked head refuses (named as a difference)."""
    text = _model_config(peer) or {}
    transforms = [key for key in LOGIT_TRANSFORMS if text.get(key) not in (None, 1, 1.0)]
    if transforms:
        out.differs.append(f"the model's {', '.join(transforms)}: TRL's fused LM head applies it, minirl's chunked head "
                           "does not run on such a model; the whole logits are computed (optim.logprob_chunk_tokens: null)")
        return
    out.set("optim.logprob_chunk_tokens", 1024, "TRL's GRPOTrainer and RLOOTrainer: per-token log-probs from their "
                                                 "fused LM head, never the whole logits")


def _trl_async(peer: Peer, out: Translation) -> None:
    """TRL's ``AsyncGRPOTrainer`` (its config has ``max_staleness`` and the like) samples beside the update:
    minirl's one-step-off form, ``rollout.async_steps: 1``, with the difference named (TRL streams samples up to
    ``max_staleness`` weight updates old and drops older ones; minirl's batches are all exactly one step old)."""
    if not any(key in peer.given for key in ASYNC_GRPO_KEYS):
        return
    staleness, every = peer("max_staleness") or 4, peer("weight_sync_steps") or 1  # unset: TRL's defaults
    budget = peer("token_budget")  # its token-budgeted micro-batches (<= 0: fixed rows; unset: the server's context)
    if isinstance(budget, int) and budget > 0:
        out.set("optim.micro_batch_max_tokens", budget, peer.show("token_budget"))
    out.set("rollout.async_steps", 1, "an AsyncGRPOTrainer config (max_staleness and the like): sampling beside the update")
    out.differs.append(f"AsyncGRPOTrainer streams samples up to max_staleness={staleness} weight updates old (weights "
                       f"synced every weight_sync_steps={every}) and drops older ones; minirl's one-step-off batches "
                       "are each exactly one global step old, none dropped (rollout.async_steps: k, a fixed lag of k "
                       "steps, for more)")


def _trl_datasets(peer: Peer, out: Translation) -> None:
    """``trl grpo``'s ``datasets:`` list (``DatasetMixtureConfig``: each ``path``, ``name``, ``data_dir``,
    ``data_files``, ``split``, ``columns``): one entry is ``task.path`` (its config and split with it); a mixture of
    several is named as not translated."""
    listed = peer("datasets")
    entries = listed if isinstance(listed, list) else [listed]
    if len(entries) != 1 or not isinstance(entries[0], dict) or not entries[0].get("path"):
        out.not_translated.append(f"datasets: a mixture of {len(entries)} datasets; give task.path one dataset (or a "
                                  "list of data files, read one after another)")
        return
    entry = entries[0]
    files = entry.get("data_files")
    path = files if isinstance(files, str) else str(Path(str(entry["path"])) / str(entry["data_dir"])) \
        if entry.get("data_dir") else str(entry["path"])
    out.set("task.kind", "jsonl", "datasets given")
    out.set("task.path", path, f"datasets[0].{'data_files' if isinstance(files, str) else 'path'}={path!r}")
    note_local_path(out, "datasets[0].path", path, "data")
    if entry.get("name"):
        out.set("task.dataset_config", str(entry["name"]), f"datasets[0].name={entry['name']!r}")
    if entry.get("split", "train") != "train":
        out.set("task.train_split", str(entry["split"]), f"datasets[0].split={entry['split']!r}")
    rest = sorted(set(entry) - {"path", "name", "data_dir", "data_files", "split"})
    if rest or (files is not None and not isinstance(files, str)):
        out.not_translated.append(f"datasets[0]: {', '.join(rest) or 'data_files'} (minirl reads the whole rows of "
                                  "one path)")


def _open_r1_prompts(peer: Peer, out: Translation) -> None:
    """open-r1's ``make_conversation``: the ``dataset_prompt_column`` text as a user message, after its
    ``system_prompt`` when given (set by an open-r1 recipe; its reward names are open-r1's too)."""
    column, system = peer("dataset_prompt_column"), peer("system_prompt")
    names = peer("reward_funcs") or []
    open_r1 = (peer.set_by_user("dataset_prompt_column") or system is not None
               or any(n in OPEN_R1_REWARDS and n not in TRL_REWARDS for n in ([names] if isinstance(names, str) else names)))
    if column != "prompt":
        out.set("task.prompt_column", str(column), peer.show("dataset_prompt_column"))
    if system is not None:
        out.set("task.system_prompt", str(system), peer.show("system_prompt"))
    if open_r1:
        out.set("task.chat_prompts", True, "open-r1's make_conversation: each prompt a user message")


def _trl_rewards(peer: Peer, out: Translation) -> None:
    names = peer("reward_funcs") or []
    names = [names] if isinstance(names, str) else list(names)
    model = peer("reward_model_name_or_path")
    weights = peer("reward_weights") or [1.0] * (len(names) + bool(model))
    if len(weights) != len(names) + bool(model):
        raise ConfigError(f"TRL setting reward_weights: {len(weights)} weights for {len(names) + bool(model)} reward "
                          "functions (reward_model_name_or_path first, then reward_funcs)")
    functions: list[dict[str, Any]] = []
    if model:  # `trl grpo` puts the reward model first
        functions.append({"model": str(model), "weight": float(weights[0])})
        note_local_path(out, "reward_model_name_or_path", str(model), "reward model", "its task.reward_functions entry's model")
        weights = weights[1:]
    for name, weight in zip(names, weights):
        if name in TRL_REWARDS:  # minirl's rewrite of TRL's function: the same values, no TRL needed
            functions.append({"function": f"minirl.tasks.trl_rewards:{name}", "weight": float(weight)})
        elif name == "get_soft_overlong_punishment":  # `trl grpo`'s registry binds these lengths (trl/scripts/grpo.py)
            functions.append({"function": "minirl.tasks.trl_rewards:soft_overlong_punishment_reward", "weight": float(weight),
                              "kwargs": {"max_completion_len": 1280, "soft_punish_cache": 256}})
        elif name in OPEN_R1_REWARDS:  # open-r1's registry name: its function rewritten, its script's arguments
            function, arguments = OPEN_R1_REWARDS[name]
            kwargs = {ours: peer(theirs) for theirs, (ours, _) in arguments.items()}
            functions.append({"function": function, "weight": float(weight), **({"kwargs": kwargs} if kwargs else {})})
        elif "." in name:
            module, function = name.rsplit(".", 1)
            functions.append({"function": f"{module}:{function}", "weight": float(weight)})
        else:
            out.not_translated.append(f"reward_funcs: {name!r} is none of `trl grpo`'s built-ins ({', '.join(TRL_REWARDS)}, "
                                      "get_soft_overlong_punishment) nor open-r1's (" + ", ".join(OPEN_R1_REWARDS) +
                                      "): give it as a dotted module.function")
    if functions:
        given = [key for key in ("reward_model_name_or_path", "reward_funcs", "reward_weights") if peer.set_by_user(key)]
        out.set("task.reward_functions", functions, ", ".join(given))


def _trl_law(peer: Peer, out: Translation) -> dict[str, tuple[Any, str]]:
    """The sampling law: ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``, each overridden by
    ``generation_kwargs``
    as TRL lets it override them (a mapping, or JSON text); its other keys are named as not translated (once)."""
    extra = peer.json_mapping("generation_kwargs")
    law: dict[str, tuple[Any, str]] = {}
    for key, cast in (("temperature", float), ("top_p", float), ("top_k", int), ("min_p", float), ("repetition_penalty", float)):
        value, origin = (extra[key], f"generation_kwargs.{key}={extra[key]}") if key in extra else (peer(key), peer.show(key))
        value = cast(value or 0) if key in ("top_k", "min_p") else cast(1.0 if value is None else value)
        law[key] = (max(0, value) if key == "top_k" else value, origin)
    rest = sorted(set(extra) - set(law))
    line = f"generation_kwargs: {', '.join(f'{k}={extra[k]!r}' for k in rest)} (minirl samples with temperature, min-p, top-k, top-p and a repetition penalty only)"
    if rest and line not in out.not_translated:
        out.not_translated.append(line)
    return law


def _trl_test_split(peer: Peer, out: Translation) -> None:
    """TRL evaluates on ``dataset_test_split`` of ``dataset_name``: the same split of the same dataset directory (a
    single data file has no other split: minirl holds out ``task.eval_fraction`` of it then)."""
    name = peer("dataset_name")
    if name and not Path(os.path.expanduser(str(name))).is_file():
        out.set("task.eval_split", str(peer("dataset_test_split")), peer.show("dataset_test_split"))
    else:
        out.differs.append(f"{peer.show('dataset_test_split')}: one data file has no other split; minirl holds out "
                           "task.eval_fraction of it, or reads task.eval_path")


def _trl_batch(peer: Peer, out: Translation) -> int:
    """P, G, N, E and the micro-batch from TRL's per-device counts (``GRPOConfig.__post_init__``); returns
    the optimizer steps per generation (N x E).
    ``num_processes`` (accelerate's, written into the file as open-r1's recipes do) scales the batch; without
    it the translation is for one process."""
    per_device, accumulation, group = peer("per_device_train_batch_size"), peer("gradient_accumulation_steps"), peer("num_generations")
    processes = peer("num_processes")
    steps = peer("steps_per_generation")
    if steps is None:
        steps = peer("generation_batch_size") // (per_device * processes) if peer("generation_batch_size") else accumulation
    generation = per_device * processes * steps
    if generation % group:
        raise ConfigError(f"TRL settings {peer.show('per_device_train_batch_size', 'num_processes', 'num_generations')}: "
                          f"the generation batch ({generation} completions) does not hold whole groups of {group}")
    if steps % accumulation:
        raise ConfigError(f"TRL settings steps_per_generation={steps}, gradient_accumulation_steps={accumulation}: "
                          "minirl makes whole optimizer steps per rollout (one must divide the other)")
    n = steps // accumulation
    scope = (f"x num_processes={processes}" if peer.set_by_user("num_processes")
             else "for one process (with K processes give num_processes=K)")
    out.set("rollout.prompts_per_step", generation // group,
            f"{peer.show('per_device_train_batch_size')} x {steps} steps per generation / {group}, {scope}")
    out.set("rollout.samples_per_prompt", group, peer.show("num_generations"))
    out.set("optim.minibatches_per_step", n, f"steps_per_generation / gradient_accumulation_steps = {steps} / {accumulation}")
    out.set("optim.micro_batch_sequences", per_device, peer.show("per_device_train_batch_size"))
    if peer.set_by_user("max_prompt_length") and peer("max_prompt_length"):  # TRL before 0.24 cut prompts from the left
        out.set("task.max_prompt_tokens", int(peer("max_prompt_length")), peer.show("max_prompt_length"))
        out.set("task.prompt_truncation", "left", peer.show("max_prompt_length") + " (TRL keeps the last tokens)")
    out.set("optim.epochs_per_step", int(peer("num_iterations")), peer.show("num_iterations"))
    out.set("rollout.max_new_tokens", peer("max_completion_length"), peer.show("max_completion_length"))
    for key, (value, origin) in _trl_law(peer, out).items():
        out.set(f"rollout.{key}", value, origin)
    if peer("use_vllm"):
        out.set("cluster.engine_backend", "vllm", peer.show("use_vllm"))
        if peer("vllm_mode") != "colocate":
            out.differs.append(f"{peer.show('vllm_mode')}: minirl starts its own vLLM engine (no `trl vllm-serve` server)")
    return n * int(peer("num_iterations"))  # optimizer steps per generation: what TRL's step counts divide by


def _trl_optimizer(peer: Peer, out: Translation, n: int, train_rows: int | None = None) -> None:
    out.set("optim.lr", float(peer("learning_rate")), peer.show("learning_rate"))
    for theirs, ours in (("weight_decay", "optim.weight_decay"), ("adam_beta1", "optim.adam_beta1"),
                         ("adam_beta2", "optim.adam_beta2"), ("adam_epsilon", "optim.adam_eps"),
                         ("max_grad_norm", "optim.grad_clip_norm")):
        out.set(ours, float(peer(theirs)), peer.show(theirs))
    max_steps = peer("max_steps")
    if max_steps and max_steps > 0:
        out.set("optim.global_steps", math.ceil(max_steps / n), f"{peer.show('max_steps')} optimizer steps / (N x E) = {n}")
        if max_steps % n:
            out.differs.append(f"max_steps={max_steps} is not a multiple of N x E = {n}: rounded up to whole global steps")
    elif (rows := train_rows or count_rows(out.values.get("task.path"), out.values.get("task.train_split", "train"),
                                      out.values.get("task.dataset_config"))) and rows >= out.values["rollout.prompts_per_step"]:
        steps = int(peer("num_train_epochs") * rows) // out.values["rollout.prompts_per_step"]
        out.set("optim.global_steps", steps, f"{peer.show('num_train_epochs')} x {rows} rows / prompts per step")
        max_steps = steps * n  # what warm-up ratios refer to
    else:
        out.not_translated.append(f"{peer.show('num_train_epochs')} with max_steps unset: set optim.global_steps "
                                  "(rollouts; one epoch = training prompts / rollout.prompts_per_step)")
    warmup, ratio = peer("warmup_steps"), peer("warmup_ratio")
    if ratio or (isinstance(warmup, float) and 0 < warmup < 1):
        fraction = ratio or warmup
        if max_steps and max_steps > 0:  # transformers rounds a ratio's steps up
            out.set("optim.warmup_updates", math.ceil(fraction * max_steps), f"{fraction} x max_steps, rounded up")
        else:
            out.not_translated.append(f"warm-up ratio {fraction} without max_steps: set optim.warmup_updates")
    elif warmup:
        out.set("optim.warmup_updates", int(warmup), peer.show("warmup_steps"))
    _trl_schedule(peer, out)
    impl = {"adamw_torch_fused": "fused", "adamw_torch": "default"}.get(peer("optim"))
    if impl is None:
        out.not_translated.append(f"{peer.show('optim')}: minirl trains with torch's AdamW (optim.adamw_impl; "
                                  "adamw_torch_fused and adamw_torch carry over)")
    else:
        out.set("optim.adamw_impl", impl, peer.show("optim"))
    if peer("fp16"):  # GRPOConfig's bf16 then defaults to False (transformers refuses both)
        out.set("optim.precision", "fp16", peer.show("fp16") + " (dynamic loss scaling, as its GradScaler)")
    else:
        out.set("optim.precision", "bf16" if peer("bf16") else "fp32", peer.show("bf16"))
    key = "activation_checkpointing" if peer.set_by_user("activation_checkpointing") else "gradient_checkpointing"
    out.set("optim.gradient_checkpointing", bool(peer(key)), peer.show(key))  # transformers 5's name, or the old one


def _trl_runs(peer: Peer, out: Translation, n: int) -> None:
    path = Path(str(peer("output_dir")))
    out.set("run.output_dir", str(path.parent), peer.show("output_dir"))
    out.set("run.name", path.name, peer.show("output_dir"))
    out.set("run.seed", int(peer("seed")), peer.show("seed"))
    if peer("resume_from_checkpoint") is True or peer("resume_from_checkpoint") == "True":
        out.set("run.resume", "auto", peer.show("resume_from_checkpoint"))
    elif peer("resume_from_checkpoint"):
        out.not_translated.append(f"{peer.show('resume_from_checkpoint')}: minirl resumes from the newest checkpoint "
                                  "of its run directory (run.resume: auto)")
    if not peer("resume_from_checkpoint"):  # TRL trains again in an output_dir holding an earlier run, writing over it
        out.set("run.overwrite", True, f"{peer.show('output_dir')} (TRL trains again over an earlier run there; "
                "minirl replaces its checkpoint/ and metrics)")
    if peer("save_strategy") == "steps" and peer("save_steps") >= 1:
        out.set("checkpoint.every_steps", math.ceil(peer("save_steps") / n), f"{peer.show('save_steps')} / (N x E)")
    elif peer("save_strategy") != "no":
        out.not_translated.append(f"{peer.show('save_strategy', 'save_steps')}: give checkpoint.every_steps in global steps")
    if peer("save_total_limit"):
        out.set("checkpoint.keep_last", int(peer("save_total_limit")), peer.show("save_total_limit"))
    if peer("eval_strategy") == "steps":
        every = peer("eval_steps") or peer("logging_steps")
        out.set("eval.every_steps", max(1, math.ceil(every / n)), f"eval_steps={every} / (N x E)")
    elif peer("eval_strategy") == "no":
        out.set("eval.every_steps", 0, peer.show("eval_strategy"))
        out.differs.append("eval_strategy='no': minirl still evaluates before and after training (eval.every_steps: 0), "
                           "on task.eval_path, or else on task.eval_fraction (10%) of the training rows held out: "
                           "TRL trains on all of them (give task.eval_path to keep every row for training)")
    else:
        out.not_translated.append(f"{peer.show('eval_strategy')}: give eval.every_steps in global steps")
    if peer("eval_strategy") != "no":
        _trl_test_split(peer, out)
    if peer("num_generations_eval"):
        out.set("eval.samples_per_prompt", int(peer("num_generations_eval")), peer.show("num_generations_eval"))
    elif peer("eval_strategy") != "no":  # TRL samples num_generations_eval or num_generations per eval prompt
        out.set("eval.samples_per_prompt", int(peer("num_generations")), peer.show("num_generations") +
                " (TRL evaluates with num_generations when num_generations_eval is unset)")
    for key, (value, origin) in _trl_law(peer, out).items():
        out.set(f"eval.{key}", value, origin + " (TRL evaluates as it samples)")
    if peer("log_completions"):
        every = peer("logging_steps")
        out.set("log.completions_every_steps", max(1, math.ceil(every / n)), f"log_completions, logging_steps={every} / (N x E)")
        if peer("num_completions_to_print"):
            out.set("log.completions_per_step", int(peer("num_completions_to_print")), peer.show("num_completions_to_print"))
    else:
        out.set("log.completions_every_steps", 0, peer.show("log_completions"))
    report_to(peer("report_to"), out, "report_to")


def _trl_objective(peer: Peer, n: int, minibatches: int) -> Objective:
    """TRL's loss (``GRPOTrainer._compute_loss``) as algo.* values, or the reasons it has no exact equivalent."""
    obj = Objective()
    _trl_reference(peer, obj, n)
    _trl_router_aux_loss(peer, obj)
    if peer("use_adaptive_entropy"):  # Skywork-OR1's control; entropy_coef is its starting value
        obj.set("entropy_target", float(peer("entropy_target")), peer.show("use_adaptive_entropy", "entropy_target"))
        for key in ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta"):  # the same names as TRL's
            obj.set(key, float(peer(key)), peer.show(key))
    _trl_entropy_tokens(peer, obj)
    if peer("multi_objective_aggregation") not in ("sum_then_normalize", "normalize_then_sum"):
        obj.blockers.append(peer.show("multi_objective_aggregation"))
    if peer("entropy_coef") or peer("use_adaptive_entropy"):
        obj.set("entropy_coef", float(peer("entropy_coef")), peer.show("entropy_coef"))
        if peer("gradient_accumulation_steps") > 1:
            obj.differs.append(f"{peer.show('entropy_coef')}: TRL's bonus is each micro-batch's token-mean entropy over "
                               "the accumulation steps, minirl's the mini-batch's token mean (equal when micro-batches "
                               "hold equal token counts)")
    loss, level = peer("loss_type"), peer("importance_sampling_level")
    eps_low = float(peer("epsilon"))
    eps_high = float(peer("epsilon_high") if peer("epsilon_high") is not None else eps_low)
    name = {("sequence", "grpo"): "gspo", ("sequence", "luspo"): "gspo", ("token", "grpo"): "grpo", ("token", "dr_grpo"): "minirl",
            ("token", "dapo"): "minirl", ("token", "bnpo"): "minirl", ("token", "luspo"): "minirl",
            ("token", "cispo"): "cispo", ("token", "sapo"): "sapo", ("token", "vespo"): "vespo"}.get((level, loss))
    if name is None:
        obj.blockers.append(peer.show("loss_type", "importance_sampling_level"))
        return obj
    obj.set("name", name, peer.show("loss_type", "importance_sampling_level"))
    if (level, loss) == ("sequence", "luspo"):  # LUSPO: GSPO's sequence term times the response's length
        obj.set("length_weighted", True, peer.show("loss_type", "importance_sampling_level"))
    _trl_clip_range(peer, obj, name, eps_low, eps_high, minibatches)
    if name == "minirl":  # PPO's min/clip gradient is MiniRL's clip mask with the weight pi_theta/pi_old
        _trl_ppo_aggregation(peer, obj, loss, minibatches)
    _trl_mask_truncated(peer, obj)
    _trl_scale_rewards(peer, obj)
    correction = bool(peer("use_vllm") and peer("vllm_importance_sampling_correction"))
    mode = peer("vllm_importance_sampling_mode")
    _trl_opsm(peer, obj, name, correction)
    if correction and (mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask") or name == "gspo"
                       or (name == "vespo" and not mode.startswith("token_"))):  # TRL refuses VESPO's sequence modes
        obj.blockers.append(peer.show("vllm_importance_sampling_mode") + {"gspo": " with GSPO (no IS factor in minirl's)",
                                                                          "vespo": " with VESPO (token modes only)"}.get(name, ""))
    if name != "gspo":  # TRL multiplies each token by its bounded pi_old / mu_old, detached; without vLLM by nothing
        obj.set("is_correction", correction, peer.show("use_vllm", "vllm_importance_sampling_correction"))
        if correction:
            _trl_is_bounds(peer, obj, mode, name)
        if name == "minirl":
            obj.set("tis_placement", "train_infer", "w = min(pi_old/mu_old, cap) x pi_theta/pi_old: TRL's weight")
    return obj


def _trl_rloo_objective(peer: Peer) -> Objective:
    """TRL 1.16 ``RLOOTrainer``'s loss (``_compute_loss``): PPO's clip on each response's own ratio pi_theta(y)/pi_old(y)
    (its tokens' log-ratios summed), the mean over responses, no IS weight; RLOO's leave-one-out advantage of the
    rewards clamped into ``reward_clip_range`` less beta x the summed k1 KL of pi_old to the reference, whitened over
    the batch's responses with ``normalize_advantages``."""
    obj, origin = Objective(), "RLOOTrainer's loss"
    _trl_router_aux_loss(peer, obj)
    obj.set("name", "gspo", origin + ": one clipped ratio per response, the mean over responses")
    obj.set("sequence_ratio", "sum", origin + ": the response's log-ratio is its tokens' sum")
    obj.set("eps_low", float(peer("epsilon")), peer.show("epsilon"))
    eps_key = "epsilon_high" if peer("epsilon_high") is not None else "epsilon"
    obj.set("eps_high", float(peer(eps_key)), peer.show(eps_key))
    obj.set("adv_baseline", "leave_one_out", "RLOOTrainer: the mean of the other G - 1 rewards")
    obj.set("adv_std_normalize", False, "RLOOTrainer: no group std")
    if peer("normalize_advantages"):
        obj.set("adv_whiten", True, peer.show("normalize_advantages"))
        obj.set("adv_whiten_over", "responses", peer.show("normalize_advantages") + ": (A - mean) / (std + 1e-4)")
    bounds = peer("reward_clip_range")
    if bounds is not None:
        if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
            raise ConfigError(f"{peer.show('reward_clip_range')}: TRL reads two numbers, [low, high]")
        obj.set("reward_clip_range", [float(bounds[0]), float(bounds[1])], peer.show("reward_clip_range"))
    if peer("beta"):  # RLOO's KL is in the reward: k1 of pi_old to the reference, summed over each response
        obj.set("kl_in_reward_coef", float(peer("beta")), peer.show("beta") + " (RLOOTrainer: in the reward)")
        obj.set("kl_in_reward_type", "k1", "RLOOTrainer: the first-order log ratio, summed")
    _trl_ref_sync(peer, obj)
    _trl_mask_truncated(peer, obj)
    return obj


def _trl_reference(peer: Peer, obj: Objective, n: int) -> None:
    """TRL's reference model: the KL term (``beta``) and TR-DPO's sync (``sync_ref_model``)."""
    if peer("beta"):
        obj.set("kl_coef", float(peer("beta")), peer.show("beta"))
        obj.set("kl_loss_type", "k3", "TRL's per-token KL is k3")
        if peer("use_bias_correction_kl"):  # its gradient flows through pi_theta/pi_old, even where the ratio is 1
            obj.set("kl_loss_unbiased", True, peer.show("use_bias_correction_kl"))
        if peer("loss_type") != "dapo":
            obj.differs.append(f"beta with loss_type={peer('loss_type')!r}: TRL adds the KL to each token before the "
                               "loss type's aggregation; minirl averages it over the mini-batch's tokens (dapo's way), "
                               "so its weight differs")
    _trl_ref_sync(peer, obj)


def _trl_ref_sync(peer: Peer, obj: Objective) -> None:
    """TR-DPO's soft update of the reference every ``ref_model_sync_steps`` optimizer steps (= minirl updates)."""
    if not peer("sync_ref_model"):
        return
    if not peer("beta"):
        raise ConfigError(f"{peer.show('sync_ref_model', 'beta')}: there is no reference model to sync (TRL refuses "
                          "this too); set beta > 0 or sync_ref_model=False")
    obj.set("ref_sync_every_updates", int(peer("ref_model_sync_steps")), peer.show("sync_ref_model", "ref_model_sync_steps"))
    obj.set("ref_sync_alpha", float(peer("ref_model_mixup_alpha")), peer.show("ref_model_mixup_alpha"))


def _trl_mask_truncated(peer: Peer, obj: Objective) -> None:
    if peer("mask_truncated_completions"):
        obj.set("mask_truncated", True, peer.show("mask_truncated_completions"))
        obj.differs.append("mask_truncated_completions=True: TRL masks every completion not ending in EOS (one cut by a "
                           "stop string too), minirl those cut by max_new_tokens")


def _trl_scale_rewards(peer: Peer, obj: Objective) -> None:
    """``scale_rewards``: the advantage divided by the group's std, the whole batch's, or by none; with GDPO's
    ``multi_objective_aggregation="normalize_then_sum"`` TRL normalises each reward and ignores it."""
    if peer("multi_objective_aggregation") == "normalize_then_sum":
        obj.set("multi_objective_aggregation", "normalize_then_sum", peer.show("multi_objective_aggregation"))
        obj.set("adv_std_eps", 1e-4, peer.show("multi_objective_aggregation") + ": TRL divides by each std + 1e-4")
        return
    scale = {True: "group", False: "none"}.get(peer("scale_rewards"), peer("scale_rewards"))
    if scale not in ("group", "batch", "none"):
        obj.blockers.append(peer.show("scale_rewards"))
    obj.set("adv_std_normalize", scale in ("group", "batch"), peer.show("scale_rewards"))
    if scale == "batch":
        obj.set("adv_std_scope", "batch", peer.show("scale_rewards") + ": the std of the step's rewards")
    if scale in ("group", "batch"):
        obj.set("adv_std_eps", 1e-4, peer.show("scale_rewards") + ": TRL divides by the std + 1e-4")


def _trl_schedule(peer: Peer, out: Translation) -> None:
    """``lr_scheduler_type`` (and ``lr_scheduler_kwargs`` of ``cosine_with_min_lr``, open-r1's choice) as
    ``optim.lr_schedule`` / ``optim.min_lr_ratio``, with how transformers' schedules differ from minirl's."""
    name = peer("lr_scheduler_type")
    kind = {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine",
            "cosine_with_min_lr": "cosine"}.get(name)
    if kind is None:
        out.not_translated.append(f"{peer.show('lr_scheduler_type')}: minirl's optim.lr_schedule is constant, linear "
                                  "or cosine (constant kept)")
        return
    out.set("optim.lr_schedule", kind, peer.show("lr_scheduler_type"))
    if name == "cosine_with_min_lr":
        kwargs = peer("lr_scheduler_kwargs") or {}
        kwargs = json.loads(kwargs) if isinstance(kwargs, str) else kwargs  # transformers takes a dict or its JSON
        rate = kwargs.get("min_lr_rate")
        if rate is None and kwargs.get("min_lr") is not None:
            rate = float(kwargs["min_lr"]) / float(peer("learning_rate"))
        if rate is None or set(kwargs) - {"min_lr_rate", "min_lr"}:
            out.not_translated.append(f"{peer.show('lr_scheduler_kwargs')}: minirl's cosine takes min_lr_rate or min_lr "
                                      "only (optim.min_lr_ratio)")
        if rate is not None:
            out.set("optim.min_lr_ratio", float(rate), peer.show("lr_scheduler_kwargs"))
    if out.values.get("optim.warmup_updates"):
        out.differs.append("the warm-up: transformers' starts at 0 (update k at k/W of the rate), minirl's at 1/W ((k + 1)/W)")


def _trl_entropy_tokens(peer: Peer, obj: Objective) -> None:
    """``top_entropy_quantile`` ("Beyond the 80/20 rule"): the quantile over each micro-batch, as TRL's over its
    per-device batch (``optim.micro_batch_sequences`` is that batch); how TRL's differs with several processes or an
    entropy bonus."""
    quantile = float(peer("top_entropy_quantile"))
    if quantile >= 1:
        return
    if peer("importance_sampling_level") == "sequence":
        obj.blockers.append(peer.show("top_entropy_quantile") + " with importance_sampling_level='sequence' (GSPO)")
        return
    obj.set("top_entropy_quantile", quantile, peer.show("top_entropy_quantile"))
    if peer("num_processes") > 1:
        obj.differs.append(f"{peer.show('top_entropy_quantile')}: TRL's quantile is over every process's micro-batch, "
                           "minirl's over each micro-batch")
    if peer("entropy_coef") or peer("use_adaptive_entropy"):
        obj.differs.append(f"{peer.show('top_entropy_quantile')} with an entropy bonus: TRL's bonus covers the kept "
                           "tokens only, minirl's every trained token")


def _trl_ppo_aggregation(peer: Peer, obj: Objective, loss: str, minibatches: int) -> None:
    """TRL's PPO-clipped losses as MiniRL's clip mask: ``dapo`` / ``bnpo`` a token mean, ``luspo`` MiniRL's own sum
    (responses per step the divisor), ``dr_grpo`` a constant divisor."""
    obj.set("clip", True, "PPO's min(r A, clip(r) A): a token mask")
    if loss == "bnpo":  # each micro-batch's token mean over the accumulation steps
        obj.set("aggregation", "token_mean", "loss_type='bnpo': tokens of the micro-batch")
        if peer("gradient_accumulation_steps") > 1:
            obj.differs.append("loss_type='bnpo' with gradient_accumulation_steps > 1: TRL divides each micro-batch "
                               "by its own tokens (and the steps), minirl the optimizer step by all its tokens")
    elif loss == "luspo":  # each response's token sum, the mean over the optimizer step's responses
        obj.set("aggregation", "seq_sum", "loss_type='luspo': sum over tokens, mean over responses")
    elif loss == "dapo":
        obj.set("aggregation", "token_mean", "loss_type='dapo': tokens of the mini-batch")
        _per_step_tokens(obj, "dapo", minibatches)
    else:
        obj.set("aggregation", "seq_sum", "loss_type='dr_grpo': sum over tokens")
        responses = peer("per_device_train_batch_size") * peer("gradient_accumulation_steps") * peer("num_processes")
        obj.set("normalizer", float(responses * peer("max_completion_length")),
                f"dr_grpo divides by {responses} completions per optimizer step x max_completion_length")


def _trl_clip_range(peer: Peer, obj: Objective, name: str, eps_low: float, eps_high: float, minibatches: int) -> None:
    """``epsilon``, ``epsilon_high`` and ``delta`` (TRL clamps r at delta: no gradient above it, which is a dual clip
    when delta >= 1 + epsilon_high); ``loss_type="cispo"``: min(r, epsilon_high), no lower clip, a token mean."""
    if name == "sapo":  # a soft gate instead of the clip: epsilon and delta play no part in TRL's sapo
        obj.set("tau_pos", float(peer("sapo_temperature_pos")), peer.show("sapo_temperature_pos"))
        obj.set("tau_neg", float(peer("sapo_temperature_neg")), peer.show("sapo_temperature_neg"))
        return
    if name == "vespo":  # a Gamma kernel of the sequence ratio instead of the clip; epsilon and delta play no part
        for key in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"):
            obj.set(key, float(peer(f"vespo_{key}")), peer.show(f"vespo_{key}"))
        _per_step_tokens(obj, "vespo", minibatches)
        return
    if name == "cispo":
        if eps_high < 1:
            obj.blockers.append(peer.show("epsilon_high") + " with loss_type='cispo' (a cap on r below 1)")
            return
        obj.set("eps_low", 1.0, "loss_type='cispo': no lower clip")
        obj.set("eps_high", eps_high - 1, f"loss_type='cispo': r capped at epsilon_high={eps_high}")
        obj.set("aggregation", "token_mean", "loss_type='cispo': tokens of the mini-batch")
        _per_step_tokens(obj, "cispo", minibatches)
        return
    obj.set("eps_low", eps_low, peer.show("epsilon"))
    obj.set("eps_high", eps_high, peer.show("epsilon_high") if peer("epsilon_high") is not None else "epsilon_high unset: = epsilon")
    if peer("delta") is None:
        return
    if name == "gspo" or float(peer("delta")) < 1 + eps_high:
        obj.blockers.append(peer.show("delta") + " (below 1 + epsilon_high, or with GSPO)")
    else:
        obj.set("dual_clip", float(peer("delta")), peer.show("delta") + ": r clamped there, TRL's two-sided clip")


def _trl_opsm(peer: Peer, obj: Objective, name: str, correction: bool) -> None:
    """TRL's ``off_policy_mask_threshold`` (OPSM): against vLLM's log-probs, else pi_old's."""
    threshold = peer("off_policy_mask_threshold")
    if threshold is None:
        return
    if name in ("gspo", "vespo"):
        obj.blockers.append(peer.show("off_policy_mask_threshold") + f" with {name.upper()} (minirl's {name} has no OPSM)")
        return
    obj.set("opsm_threshold", float(threshold), peer.show("off_policy_mask_threshold"))
    if peer("use_vllm") and not correction:
        obj.differs.append("off_policy_mask_threshold without vllm_importance_sampling_correction: TRL's mask compares "
                           "with vLLM's log-probs, minirl's (is_correction off) with pi_old's")


def _per_step_tokens(obj: Objective, loss: str, minibatches: int) -> None:
    """How TRL's ``num_items_in_batch`` divisor (dapo, cispo, vespo) differs from minirl's with N > 1."""
    if minibatches > 1:
        obj.differs.append(f"loss_type='{loss}' with several optimizer steps per generation: TRL divides each step "
                           "by the generation's mean tokens per step, minirl by the step's own tokens")


def _trl_is_bounds(peer: Peer, obj: Objective, mode: str, name: str = "minirl") -> None:
    """TRL's ``vllm_importance_sampling_mode`` (level x truncate / mask) and its clip bounds as minirl's tis_* keys."""
    level, kind = mode.split("_")
    if name != "vespo":  # VESPO's factor is per token (it enters the sequence ratio as a product)
        obj.set("tis_level", level, peer.show("vllm_importance_sampling_mode"))
    obj.set("tis_mode", kind, peer.show("vllm_importance_sampling_mode"))
    cap = peer("vllm_importance_sampling_cap") or peer("vllm_importance_sampling_clip_max")
    obj.set("tis_cap", float(cap) if cap is not None else math.inf, peer.show("vllm_importance_sampling_clip_max"))
    floor = peer("vllm_importance_sampling_clip_min")
    obj.set("tis_floor", float(floor or 0.0), peer.show("vllm_importance_sampling_clip_min"))


def read_trl(path: str | None, words: list[str]) -> dict[str, Any]:
    """A ``trl grpo --config`` YAML plus ``key=value`` words (TRL's names)."""
    given = read_yaml(path) if path else {}
    for word in words:
        key, _, value = word.partition("=")
        given[key.lstrip("-")] = parse_value(value)
    return given


# ------------------------------------------------------------------------------------------ TRL SFT

TRL_SFT_DEFAULTS: dict[str, Any] = {
    # SFTConfig (TRL 1.16) over the TrainingArguments it keeps, and the script's arguments
    "learning_rate": 2e-5, "max_length": 1024, "packing": False, "packing_strategy": "bfd", "padding_free": False,
    "completion_only_loss": None, "assistant_only_loss": False, "dataset_text_field": "text", "loss_type": "nll",
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_processes": 1, "max_steps": -1,
    "num_train_epochs": 3.0, "warmup_steps": 0, "warmup_ratio": None, "lr_scheduler_type": "linear", "seed": 42,
    "dataset_name": None, "dataset_config": None, "dataset_train_split": "train", "model_name_or_path": None,
    "output_dir": "trainer_output", "bf16": True, "gradient_checkpointing": True, "weight_decay": 0.0,
    "chat_template_path": None,
}


def _trl_sft_data(peer: Peer, out: Translation) -> None:
    """TRL SFT's ``load_dataset(dataset_name, name=dataset_config)[dataset_train_split]`` as ``cold_start.data``."""
    if not peer("dataset_name"):
        out.not_translated.append("SFT config without dataset_name: cold_start.data is the task's teacher traces")
        return
    out.set("cold_start.data", peer("dataset_name"), f"SFT {peer.show('dataset_name')}")
    note_local_path(out, "SFT dataset_name", peer("dataset_name"), "data", "cold_start.data")
    if peer("dataset_config"):
        out.set("cold_start.dataset_config", str(peer("dataset_config")), f"SFT {peer.show('dataset_config')}")
    if peer("dataset_train_split") != "train":
        out.set("cold_start.split", str(peer("dataset_train_split")), f"SFT {peer.show('dataset_train_split')}")


def _trl_sft_saves(peer: Peer, out: Translation, steps: Any) -> None:
    """SFT ``save_steps`` (a fraction < 1: of the run's ``steps``, as transformers reads it): the state a stopped SFT
    continues from, every so many steps (``cold_start.checkpoint_every_steps``)."""
    save = peer("save_steps")
    if peer("save_strategy") != "steps" or not save:
        return
    every = math.ceil(save * steps) if save < 1 and steps and steps > 0 else int(save) if save >= 1 else 0
    if every:
        out.set("cold_start.checkpoint_every_steps", every, f"SFT {peer.show('save_strategy', 'save_steps')} (the "
                "state a stopped SFT continues from, kept in one file)")


def add_trl_sft(out: Translation, given: dict[str, Any]) -> None:
    """The cold start of ``out`` from a ``trl sft --config`` file: SFT on its data before RL (``cold_start.*``)."""
    peer = Peer(given, TRL_DEFAULTS | TRL_SFT_DEFAULTS)  # a TrainingArguments key the RL file reads is no SFT leftover
    out.set("cold_start.enabled", True, "an SFT config given (--sft)")
    _trl_sft_data(peer, out)
    rl_model = out.values.get("model.path")
    if peer("model_name_or_path") and rl_model and peer("model_name_or_path") != rl_model:
        out.differs.append(f"SFT {peer.show('model_name_or_path')}: minirl's cold start fine-tunes model.path "
                           f"({rl_model!r}) and RL starts from the result")
    batch = peer("per_device_train_batch_size") * peer("gradient_accumulation_steps") * peer("num_processes")
    out.set("cold_start.batch_sequences", batch, "SFT per_device_train_batch_size x gradient_accumulation_steps"
            " x num_processes")
    out.set("cold_start.lr", float(peer("learning_rate")), f"SFT {peer.show('learning_rate')}")
    out.set("cold_start.max_length", int(peer("max_length")), f"SFT {peer.show('max_length')}")
    out.set("cold_start.packing", bool(peer("packing")), f"SFT {peer.show('packing')}")
    if peer("packing") and peer("packing_strategy") != "wrapped":
        out.differs.append(f"SFT {peer.show('packing_strategy')}: minirl joins whole examples in order, each "
                           "attending to the ones before it in its row (TRL's 'wrapped' without cutting)")
    if peer("padding_free"):  # the same forward without padding; minirl's switch covers the RL trainer's forwards too
        out.set("optim.padding_free", True, f"SFT {peer.show('padding_free')}")
    steps, rows = peer("max_steps"), count_rows(out.values.get("cold_start.data"), out.values.get("cold_start.split", "train"),
                                                out.values.get("cold_start.dataset_config"))
    if steps and steps > 0:
        out.set("cold_start.steps", int(steps), f"SFT {peer.show('max_steps')}")
    elif rows:
        steps = max(1, math.ceil(peer("num_train_epochs") * rows / batch))
        out.set("cold_start.steps", steps, f"SFT num_train_epochs={peer('num_train_epochs')} x {rows} rows / {batch}")
    else:
        out.not_translated.append(f"SFT {peer.show('num_train_epochs')} without max_steps: set cold_start.steps")
    warmup, ratio = peer("warmup_steps"), peer("warmup_ratio")
    if ratio or (isinstance(warmup, float) and 0 < warmup < 1):
        if steps and steps > 0:
            out.set("cold_start.warmup_steps", round((ratio or warmup) * steps), f"SFT warm-up {ratio or warmup} x steps")
        else:
            out.not_translated.append(f"SFT warm-up ratio {ratio or warmup} without steps: set cold_start.warmup_steps")
    else:
        out.set("cold_start.warmup_steps", int(warmup), f"SFT {peer.show('warmup_steps')}")
    _trl_sft_saves(peer, out, steps)
    if peer("lr_scheduler_type") not in ("constant", "constant_with_warmup"):
        out.differs.append(f"SFT {peer.show('lr_scheduler_type')}: minirl's SFT keeps its rate constant after warm-up")
    if peer("completion_only_loss") is False:
        out.set("cold_start.loss_on", "all", f"SFT {peer.show('completion_only_loss')}")
    else:
        out.set("cold_start.loss_on", "completion", f"SFT {peer.show('completion_only_loss', 'assistant_only_loss')}")
        if not peer("assistant_only_loss"):
            out.differs.append("SFT on {\"messages\"} rows: TRL trains every token unless assistant_only_loss=True; "
                               "minirl trains the assistant turns (cold_start.loss_on: all for TRL's way)")
    if peer("chat_template_path"):  # the template SFT renders with is the one RL must prompt with
        out.set("task.chat_template", str(peer("chat_template_path")), f"SFT {peer.show('chat_template_path')}")
    if peer("dataset_text_field") != "text":
        out.not_translated.append(f"SFT {peer.show('dataset_text_field')}: minirl reads a text row's \"text\" column")
    if peer("loss_type") != "nll":
        out.not_translated.append(f"SFT {peer.show('loss_type')}: minirl's SFT is the token cross-entropy (nll)")
    for key in ("seed", "output_dir", "bf16", "gradient_checkpointing", "weight_decay", "dataset_train_split",
                "dataset_config"):
        peer(key)  # the RL run's (seed, precision, run directory), or no minirl SFT knob
    leftovers(peer, out, TRL_IGNORED, prefix="SFT ")
