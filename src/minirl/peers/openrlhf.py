"""OpenRLHF: the ``--flag value`` arguments of a launch script's ``python3 -m openrlhf.cli.train_ppo_ray`` command (its
bash arrays and variables expanded, ``ray job submit ... --`` before it; ``slime.script_flags`` reads it) or flags given
directly, read against OpenRLHF's defaults (``openrlhf/cli/train_ppo_ray.py``: OpenRLHF/OpenRLHF at 021d1b0 and
f5b3f08, the 0.8 / 0.9 underscore flags ``--eps_clip``, ``--prompt_data``, ``--remote_rm_url``; and the newest
release's dotted groups ``--actor.eps_clip``, ``--data.prompt_dataset``, ``--reward.remote_url``, read as the
underscore flag they renamed, with that release's defaults).

OpenRLHF's loss (``openrlhf/models/loss.py`` ``PolicyLoss``, ``trainer/ray/ppo_actor.py``): PPO's clip on
pi_theta/pi_old (or GSPO's sequence ratio, ``--policy_loss_type gspo``), the dual clip, and with
``--enable_vllm_is_correction`` each token's loss times clamp(pi_old/mu_old, low, high) (``tis``) or that weight
zeroed outside [low, high] (``icepop``); the token mean of each micro-batch (GSPO: each sample's mean); the KL to the
reference as a loss (``--use_kl_loss``) or in the reward at every token (``compute_reward``), and advantages
(``trainer/ppo_utils/experience_maker.py``): the group baseline (rloo, reinforce_baseline, dr_grpo: the mean,
group_norm: mean and std + 1e-9), each token's return (the reward at the last token less the KL after it), whitened
over the rollout's tokens for reinforce and reinforce_baseline.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from minirl.config import ConfigError
from minirl.peers.common import (
    Objective,
    Peer,
    Translation,
    apply_objective,
    check_label_column,
    count_rows,
    gpu_ranks,
    leftovers,
    note_local_path,
)
from minirl.peers.slime import parse_flags, script_flags

OPENRLHF_DEFAULTS: dict[str, Any] = {
    # models and data
    "pretrain": None, "critic_pretrain": None, "reward_pretrain": None, "remote_rm_url": None, "agent_func_path": None,
    "prompt_data": None, "prompt_data_probs": None, "prompt_split": "train", "input_key": "input", "label_key": None,
    "input_template": None, "apply_chat_template": False, "max_samples": 100_000_000, "eval_dataset": None,
    "eval_split": "train", "eval_temperature": 0.6, "eval_n_samples_per_prompt": 4, "eval_steps": -1,
    # batches, lengths, sampling
    "rollout_batch_size": 1024, "n_samples_per_prompt": 1, "train_batch_size": 128, "micro_train_batch_size": 4,
    "micro_rollout_batch_size": 8, "max_epochs": 1, "num_episodes": 1, "prompt_max_len": 1024, "generate_max_len": 1024,
    "max_len": None, "temperature": 1.0, "top_p": 1.0, "use_dynamic_batch": False, "train_max_tokens_per_gpu": 16192,
    "packing_samples": False,
    # optimizer (DeepSpeed's FusedAdam: AdamW) and schedule
    "actor_learning_rate": 1e-6, "critic_learning_rate": 9e-6, "lr_warmup_ratio": 0.03, "lr_scheduler": "cosine_with_min_lr",
    "min_lr_ratio": 0.1, "max_norm": 1.0, "l2": 0.0, "adam_betas": [0.9, 0.95], "adam_eps": 1e-8, "actor_optim": "adam",
    "bf16": False, "param_dtype": None, "gradient_checkpointing": False, "adam_offload": False, "zero_stage": 2,
    # the objective
    "advantage_estimator": "gae", "policy_loss_type": "ppo", "eps_clip": 0.2, "eps_clip_low_high": None, "dual_clip": None,
    "value_clip": 0.5, "gamma": 1.0, "lambd": 1.0, "init_kl_coef": 0.01, "kl_estimator": "k1", "use_kl_loss": False,
    "kl_target": None, "kl_horizon": 10000, "no_advantage_std_norm": False, "normalize_reward": False,
    "reward_clip_range": [-10, 10], "entropy_loss_coef": None, "aux_loss_coef": 0.0, "ptx_coef": 0.05,
    "enable_vllm_is_correction": False, "vllm_is_truncated_threshold": None, "vllm_is_correction_type": None,
    "overlong_buffer_len": None, "overlong_penalty_factor": 1.0, "stop_properly_penalty_coef": None,
    "dynamic_filtering": False, "dynamic_filtering_reward_range": [0, 1], "freezing_actor_steps": -1,
    # LoRA
    "lora_rank": 0, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear", "load_in_4bit": False,
    # runs, checkpoints, logs
    "seed": 42, "save_path": "./ckpt", "ckpt_path": "./ckpt/checkpoints_ppo_ray", "save_steps": -1, "max_ckpt_num": 3,
    "load_checkpoint": False, "use_wandb": None, "wandb_project": "openrlhf_train_ppo", "use_tensorboard": None,
    "async_train": False, "async_queue_size": 1, "partial_rollout_enable": False, "pretrain_data": None,
    # the cluster
    "actor_num_nodes": 1, "actor_num_gpus_per_node": 8, "vllm_num_engines": None, "colocate_all_models": False,
}

NEWEST_DEFAULTS = {"micro_train_batch_size": 1, "micro_rollout_batch_size": 1, "generate_max_len": None,
                   "prompt_max_len": None, "max_len": 2048, "param_dtype": "bf16", "max_ckpt_mem": float("inf")}
"""Where the release with dotted flags changed a default (``--rollout.max_new_tokens`` unset: up to ``--data.max_len``)."""

DOTTED = {
    "actor.model_name_or_path": "pretrain", "critic.model_name_or_path": "critic_pretrain",
    "reward.model_name_or_path": "reward_pretrain", "reward.remote_url": "remote_rm_url",
    "train.agent_func_path": "agent_func_path", "data.prompt_dataset": "prompt_data", "data.prompt_probs": "prompt_data_probs",
    "data.prompt_split": "prompt_split", "data.input_key": "input_key", "data.label_key": "label_key",
    "data.input_template": "input_template", "data.apply_chat_template": "apply_chat_template",
    "data.max_samples": "max_samples", "data.max_len": "max_len", "eval.dataset": "eval_dataset", "eval.split": "eval_split",
    "eval.temperature": "eval_temperature", "eval.n_samples_per_prompt": "eval_n_samples_per_prompt", "eval.steps": "eval_steps",
    "rollout.batch_size": "rollout_batch_size", "rollout.n_samples_per_prompt": "n_samples_per_prompt",
    "rollout.max_new_tokens": "generate_max_len", "rollout.temperature": "temperature", "rollout.top_p": "top_p",
    "rollout.micro_batch_size": "micro_rollout_batch_size", "train.batch_size": "train_batch_size",
    "train.micro_batch_size": "micro_train_batch_size", "train.max_epochs": "max_epochs", "train.num_episodes": "num_episodes",
    "train.seed": "seed", "train.async_enable": "async_train", "train.async_queue_size": "async_queue_size",
    "train.partial_rollout_enable": "partial_rollout_enable", "train.dynamic_batch_enable": "use_dynamic_batch",
    "train.max_tokens_per_gpu": "train_max_tokens_per_gpu", "train.colocate_all": "colocate_all_models",
    "actor.eps_clip": "eps_clip", "actor.eps_clip_low_high": "eps_clip_low_high", "actor.dual_clip": "dual_clip",
    "actor.policy_loss_type": "policy_loss_type", "actor.entropy_coef": "entropy_loss_coef",
    "actor.aux_loss_coef": "aux_loss_coef", "actor.adam.lr": "actor_learning_rate", "actor.adam.betas": "adam_betas",
    "actor.adam.eps": "adam_eps", "actor.adam.weight_decay": "l2", "actor.lr_scheduler": "lr_scheduler",
    "actor.lr_warmup_ratio": "lr_warmup_ratio", "actor.min_lr_ratio": "min_lr_ratio", "actor.max_norm": "max_norm",
    "actor.optim": "actor_optim", "actor.gradient_checkpointing_enable": "gradient_checkpointing",
    "actor.num_nodes": "actor_num_nodes", "actor.num_gpus_per_node": "actor_num_gpus_per_node",
    "critic.adam.lr": "critic_learning_rate", "critic.value_clip": "value_clip", "critic.freezing_steps": "freezing_actor_steps",
    "algo.advantage.estimator": "advantage_estimator", "algo.advantage.gamma": "gamma", "algo.advantage.lambd": "lambd",
    "algo.advantage.no_std_norm": "no_advantage_std_norm",
    "algo.advantage.is_correction_enable": "enable_vllm_is_correction",
    "algo.advantage.is_correction_threshold": "vllm_is_truncated_threshold",
    "algo.advantage.is_correction_type": "vllm_is_correction_type", "algo.kl.use_loss": "use_kl_loss",
    "algo.kl.estimator": "kl_estimator", "algo.kl.init_coef": "init_kl_coef", "algo.kl.target": "kl_target",
    "algo.kl.horizon": "kl_horizon", "algo.dynamic_filtering_enable": "dynamic_filtering",
    "algo.dynamic_filtering_range": "dynamic_filtering_reward_range", "reward.clip_range": "reward_clip_range",
    "reward.normalize_enable": "normalize_reward", "reward.overlong_buffer_len": "overlong_buffer_len",
    "reward.overlong_penalty_factor": "overlong_penalty_factor",
    "reward.stop_properly_penalty_coef": "stop_properly_penalty_coef", "ckpt.output_dir": "save_path",
    "ckpt.path": "ckpt_path", "ckpt.save_steps": "save_steps", "ckpt.max_num": "max_ckpt_num",
    "ckpt.load_enable": "load_checkpoint", "ds.zero_stage": "zero_stage", "ds.param_dtype": "param_dtype",
    "ds.adam_offload": "adam_offload", "ds.packing_samples": "packing_samples", "ds.lora.rank": "lora_rank",
    "ds.lora.alpha": "lora_alpha", "ds.lora.dropout": "lora_dropout", "ds.lora.target_modules": "target_modules",
    "ds.load_in_4bit": "load_in_4bit", "logger.wandb.key": "use_wandb", "logger.wandb.project": "wandb_project",
    "logger.tensorboard_dir": "use_tensorboard", "vllm.num_engines": "vllm_num_engines",
}
"""The newest release's dotted flags and the underscore flag each renamed (``openrlhf/utils/config.py`` groups them)."""

OPENRLHF_IGNORED = re.compile(
    r"^(vllm_(?!is_|enable_is)[a-z_]*|vllm\.[a-z_.]*|enable_prefix_caching|enforce_eager|colocate_.*|train\.colocate_.*|(ref|reward|critic)_num_.*|"
    r"(ref|reward|critic)\.num_.*|zpg|flash_attn|attn_implementation|use_liger_kernel|ring_.*|ds_tensor_parallel_size|"
    r"deepspeed_enable_sleep|fsdp2_.*|dist_backend|ds\..*|logging_steps|logger\..*|wandb_(org|group|run_name)|local_rank|"
    r"overlap_comm|grad_accum_dtype|disable_fast_tokenizer|data\.disable_fast_tokenizer|data\.dataloader_num_workers|"
    r"micro_rollout_batch_size|rollout_max_tokens_per_gpu|rollout\.max_tokens_per_gpu|save_hf_ckpt|disable_ds_ckpt|"
    r"max_ckpt_mem|ckpt\.(save_hf|disable_ds|max_mem|best_metric_key)|use_ds_universal_ckpt|perf|use_ms|"
    r"actor_init_on_gpu|gradient_checkpointing_use_reentrant|actor\.gradient_checkpointing_reentrant|deepcompile|"
    r"ref_reward_offload|(ref|reward)\.offload|value_head_prefix|save_value_network|critic\.save_value_network|"
    r"full_determinism|train\.full_determinism_enable|enable_ema|ema_beta|train\.(enable_ema|ema_beta)|"
    r"rollout_tasks_per_gpu|param_dtype|bf16)$")
"""Flags with no effect on what is trained here: vLLM's engines, DeepSpeed's sharding and kernels, the GPUs of the
reference and reward models, logging cadence, the EMA copy and checkpoint formats."""

_TEXT_FLAGS = frozenset({
    "pretrain", "critic_pretrain", "reward_pretrain", "remote_rm_url", "agent_func_path", "prompt_data",
    "prompt_data_probs", "prompt_split", "input_key", "label_key", "input_template", "eval_dataset", "eval_split",
    "advantage_estimator", "policy_loss_type", "kl_estimator", "vllm_is_correction_type", "lr_scheduler", "save_path",
    "ckpt_path", "use_wandb", "wandb_project", "use_tensorboard", "param_dtype", "target_modules", "actor_optim",
    "pretrain_data"})
OPENRLHF_TEXT = _TEXT_FLAGS | {dotted for dotted, flag in DOTTED.items() if flag in _TEXT_FLAGS}
"""Flags OpenRLHF's argparse takes as text: their values stay as written (``--input_key 1`` is the column "1")."""

LAUNCH = re.compile(r"(^|[/.])train_ppo(_ray)?(\.py)?$")
"""OpenRLHF's launch word: ``openrlhf.cli.train_ppo_ray`` after ``python3 -m`` (or the script's path)."""

SCHEDULES = {"cosine_with_min_lr": ("cosine", None), "cosine": ("cosine", 0.0), "linear": ("linear", 0.0),
             "constant": ("constant", None), "constant_with_warmup": ("constant", None)}
"""transformers' ``get_scheduler`` names OpenRLHF passes ``--lr_scheduler`` to, as minirl's schedule and where it ends
(None: ``--min_lr_ratio``, OpenRLHF's min_lr = 0.1 x lr)."""

KL_KINDS = ("k1", "k2", "k3")
CHOICES = {"advantage_estimator": ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo"),
           "policy_loss_type": ("ppo", "gspo"), "vllm_is_correction_type": ("tis", "icepop", "seq-mask-tis")}
"""OpenRLHF's argparse ``choices`` of these flags: another value stops its run (here, one line)."""


class OpenRLHFPeer(Peer):
    """OpenRLHF's settings under the underscore names, shown as the user spelled them (``--actor.eps_clip 0.2``)."""

    def __init__(self, given: dict[str, Any], defaults: dict[str, Any], spelling: dict[str, str]) -> None:
        super().__init__(given, defaults)
        self.spelling = spelling

    def __call__(self, key: str) -> Any:
        value = super().__call__(key)
        return self.given.get(key, self.defaults.get(key)) if key in OPENRLHF_TEXT else value

    def flag(self, key: str) -> str:
        return "--" + self.spelling.get(key, key)

    def show(self, *keys: str) -> str:
        shown = []
        for key in keys:
            try:
                value = self(key)
            except ConfigError:  # a value the reader refuses: shown as given
                value = self.given.get(key)
            words = " ".join(map(str, value)) if isinstance(value, list) else value
            shown.append(self.flag(key) if value is True else f"{self.flag(key)} unset" if value in (False, None)
                         else f"{self.flag(key)} {words}")
        return ", ".join(shown)

    def override_hint(self, key: str) -> str:
        return f"{self.flag(key)} ..."

    def number(self, key: str, cast: type[int] | type[float]) -> Any:
        """The value of ``--key`` as ``cast``; anything else is one line naming the flag as the user spelled it."""
        try:
            value = self(key)
        except ConfigError:  # the base reader's own line: said again in OpenRLHF's words
            value = self.given.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (cast is int and float(value) != int(value)):
            raise ConfigError(f"OpenRLHF setting {self.show(key)}: expected {'an integer' if cast is int else 'a number'}")
        return cast(value)

    def pair(self, key: str) -> list[float]:
        value = self(key)
        if not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, (int, float)) for v in value):
            raise ConfigError(f"OpenRLHF setting {self.show(key)}: expected two numbers")
        return [float(v) for v in value]


def read_openrlhf(paths: list[str], words: list[str]) -> dict[str, Any]:
    """OpenRLHF flags from launch scripts (the ``train_ppo_ray`` command's) and a command line's ``--flag value``
    words, the later winning."""
    given: dict[str, Any] = {}
    for path in paths:
        given.update(script_flags(Path(path), LAUNCH, OPENRLHF_TEXT,
                                  "no `python3 -m openrlhf.cli.train_ppo_ray --flag value ...` command found "
                                  "(OpenRLHF's launch line)"))
    given.update(parse_flags(words, OPENRLHF_TEXT))
    return given


def from_openrlhf(given: dict[str, Any], keep_objective: bool = False) -> Translation:
    """Translate OpenRLHF ``train_ppo_ray`` flags (names without ``--``, underscore or dotted)."""
    given = dict(given)
    sourced, conditional = given.pop("$sourced", []), given.pop("$conditional", [])
    given.pop("$script", None)
    dotted = any("." in key for key in given)
    flags: dict[str, Any] = {}
    spelling: dict[str, str] = {}
    for key, value in given.items():
        name = DOTTED.get(key, key)
        flags[name], spelling[name] = value, key
    defaults = OPENRLHF_DEFAULTS | (NEWEST_DEFAULTS if dotted else {})
    peer, out = OpenRLHFPeer(flags, defaults, spelling), Translation("OpenRLHF")
    for key, allowed in CHOICES.items():
        if peer(key) is not None and str(peer(key)) not in allowed:
            raise ConfigError(f"OpenRLHF setting {peer.show(key)}: OpenRLHF's choices are {', '.join(allowed)}")
    out.differs += conditional
    if sourced:
        out.ignored.append(f"{', '.join(sourced)} (arrays the script expands but does not set)")
    _model_and_data(peer, out)
    _rewards(peer, out)
    n = _batch(peer, out)
    _optimizer(peer, out, n)
    _runs(peer, out)
    apply_objective(out, keep_objective, _objective(peer))
    if out.values.get("algo.adv_baseline") == "critic":
        _critic(peer, out)
    _cluster(peer, out)
    leftovers(peer, out, OPENRLHF_IGNORED, prefix="--")
    return out


def _model_and_data(peer: OpenRLHFPeer, out: Translation) -> None:
    if not peer("pretrain"):
        raise ConfigError(f"OpenRLHF setting {peer.flag('pretrain')} is missing (the policy's HF model name or path)")
    out.set("model.path", str(peer("pretrain")), peer.show("pretrain"))
    note_local_path(out, peer.flag("pretrain"), str(peer("pretrain")), "model")
    data = peer("prompt_data")
    if data:
        paths = str(data).split(",")
        out.set("task.kind", "jsonl", f"{peer.flag('prompt_data')} given")
        out.set("task.path", paths[0] if len(paths) == 1 else paths, peer.show("prompt_data"))
        for path in paths:
            note_local_path(out, peer.flag("prompt_data"), path, "data")
        if peer("prompt_data_probs"):
            out.not_translated.append(f"{peer.show('prompt_data_probs')}: minirl reads the datasets' rows together, not "
                                      "sampled by these weights")
        if peer("prompt_split") != "train":
            out.set("task.train_split", str(peer("prompt_split")), peer.show("prompt_split"))
        out.differs.append(f"{peer.flag('prompt_data')}: OpenRLHF trains on every row; minirl holds out "
                           "task.eval_fraction (10%) for its evaluations unless task.eval_path is given")
    out.set("task.prompt_column", str(peer("input_key")), peer.show("input_key"))
    if peer("label_key"):
        out.set("task.answer_column", str(peer("label_key")), peer.show("label_key"))
        for path in str(data).split(",") if data else []:
            check_label_column(peer.flag("label_key"), str(peer("label_key")), path, "OpenRLHF")
    if peer("apply_chat_template"):  # a text prompt as one user message, then the tokenizer's template
        out.set("task.chat_prompts", True, peer.show("apply_chat_template"))
        if peer("input_template"):
            out.ignored.append(f"{peer.flag('input_template')} (OpenRLHF skips it under {peer.flag('apply_chat_template')})")
    else:
        out.set("task.chat_template", "plain", peer.show("apply_chat_template") + " (prompts as plain text)")
        if peer("input_template"):
            out.not_translated.append(f"{peer.show('input_template')}: minirl gives the model the prompt column as it "
                                      "is; write the template into the data's prompts")
    if peer.set_by_user("max_samples"):
        out.not_translated.append(f"{peer.show('max_samples')}: minirl reads every row (cut the data file to keep fewer)")
    if peer("prompt_max_len"):
        out.set("task.max_prompt_tokens", peer.number("prompt_max_len", int), peer.show("prompt_max_len"))
        out.set("task.prompt_truncation", "left", peer.show("prompt_max_len") + " (OpenRLHF's tokenizer keeps the last "
                "tokens of a longer prompt)")
    if peer("eval_dataset"):
        out.set("task.eval_path", str(peer("eval_dataset")), peer.show("eval_dataset"))
        note_local_path(out, peer.flag("eval_dataset"), str(peer("eval_dataset")), "eval data", "task.eval_path")
        if peer("eval_split") != "train":
            out.set("task.eval_split", str(peer("eval_split")), peer.show("eval_split"))
        out.set("eval.temperature", peer.number("eval_temperature", float), peer.show("eval_temperature"))
        out.set("eval.samples_per_prompt", peer.number("eval_n_samples_per_prompt", int),
                peer.show("eval_n_samples_per_prompt"))
    steps = peer.number("eval_steps", int)
    out.set("eval.every_steps", max(steps, 0) if peer("eval_dataset") else 0, peer.show("eval_steps"))


def _rewards(peer: OpenRLHFPeer, out: Translation) -> None:
    """``--remote_rm_url reward_func.py`` (called as OpenRLHF calls it), an HTTP reward server (not translated) or
    ``--reward_pretrain`` (a reward model)."""
    url, model = peer("remote_rm_url"), peer("reward_pretrain")
    if peer("agent_func_path"):
        out.not_translated.append(f"{peer.show('agent_func_path')}: an OpenRLHF agent (its AgentExecutor's multi-turn "
                                  "rollout and reward); write its reward as a reward function (task.reward_functions)")
        return
    if url:
        first = str(url).split(",")[0]
        kwargs: dict[str, Any] = {"tokenizer": str(peer("pretrain")), "apply_chat_template": bool(peer("apply_chat_template"))}
        if peer("label_key"):  # labels as stored (a number, a list or an object stays one)
            kwargs["label_key"] = str(peer("label_key"))
        if first.endswith(".py"):
            entry: dict[str, Any] = {"function": f"{first}:reward_func", "convention": "openrlhf"}
            if kwargs:
                entry["kwargs"] = kwargs
            out.set("task.reward_functions", [entry], peer.show("remote_rm_url"))
            out.set("task.reward_timeout_s", None, peer.show("remote_rm_url") + " (OpenRLHF sets no time limit)")
            out.differs.append(f"{peer.show('remote_rm_url')}: reward_func(queries, prompts, labels) gets all of a step's "
                               "samples in one call (OpenRLHF 0.9 calls it per sample, older releases per "
                               "--micro_rollout_batch_size); its 'scores' are not read: minirl's dynamic filtering "
                               "reads the rewards; a call that raises stops the run (OpenRLHF 0.9 logs it and goes on: "
                               "task.reward_on_error: fallback)")
            if not Path(first).is_file():
                out.differs.append(f"{peer.flag('remote_rm_url')} {first}: not on this machine; run the translation where "
                                   "the script runs, or fix task.reward_functions' path")
        elif "," not in str(url):  # a reward server: minirl posts what OpenRLHF posts
            entry = {"function": "minirl.tasks.openrlhf_rewards:remote_rm", "convention": "openrlhf",
                     "kwargs": {"url": first, **kwargs}}
            out.set("task.reward_functions", [entry], peer.show("remote_rm_url") + " (POST {query, prompts, labels}, "
                    "its 'rewards'; 5 tries of 180 s)")
            out.set("task.reward_timeout_s", None, peer.show("remote_rm_url") + " (OpenRLHF sets no time limit)")
            out.differs.append(f"{peer.show('remote_rm_url')}: minirl posts all of a step's samples in one request "
                               "(OpenRLHF, each micro-batch's or sample's)")
        else:
            out.not_translated.append(f"{peer.show('remote_rm_url')}: several reward servers (OpenRLHF combines their "
                                      "rewards); give each as a task.reward_functions entry of "
                                      "minirl.tasks.openrlhf_rewards:remote_rm")
    elif model:
        paths = str(model).split(",")
        out.set("task.reward_functions", [{"model": path} for path in paths], peer.show("reward_pretrain"))
        for path in paths:
            note_local_path(out, peer.flag("reward_pretrain"), path, "reward model", "task.reward_functions")
        out.differs.append(f"{peer.show('reward_pretrain')}: minirl scores the response with the model's chat template "
                           "as TRL does; OpenRLHF scores the prompt and response text it generated")
    else:
        out.not_translated.append(f"{peer.flag('remote_rm_url')} / {peer.flag('reward_pretrain')} unset: no reward; "
                                  "set task.reward_functions")


def _batch(peer: OpenRLHFPeer, out: Translation) -> int:
    """Prompts and samples per rollout, N = samples / ``--train_batch_size`` optimizer steps, epochs, lengths."""
    prompts, group = peer.number("rollout_batch_size", int), peer.number("n_samples_per_prompt", int)
    batch = peer.number("train_batch_size", int)
    samples = prompts * group
    out.set("rollout.prompts_per_step", prompts, peer.show("rollout_batch_size"))
    estimator = str(peer("advantage_estimator"))
    if group < 2 and estimator in ("rloo", "reinforce_baseline", "group_norm"):
        raise ConfigError(f"OpenRLHF refuses {peer.show('advantage_estimator', 'n_samples_per_prompt')}: "
                          f"{estimator} requires n_samples_per_prompt > 1")
    if group < 2 and estimator not in ("gae", "reinforce"):  # a critic's GAE and REINFORCE need no group
        raise ConfigError(f"OpenRLHF setting {peer.show('advantage_estimator', 'n_samples_per_prompt')}: minirl's form "
                          f"of {estimator} is a group baseline, which needs 2 or more samples a prompt")
    out.set("rollout.samples_per_prompt", group, peer.show("n_samples_per_prompt"))
    if batch <= 0 or samples % batch:
        raise ConfigError(f"OpenRLHF settings {peer.show('rollout_batch_size', 'n_samples_per_prompt', 'train_batch_size')}: "
                          f"the train batch must divide the rollout's {samples} samples")
    n = samples // batch
    out.set("optim.minibatches_per_step", n, f"{samples} samples / {peer.show('train_batch_size')}")
    out.set("optim.epochs_per_step", peer.number("max_epochs", int), peer.show("max_epochs"))
    if peer("use_dynamic_batch"):
        out.set("optim.micro_batch_max_tokens", peer.number("train_max_tokens_per_gpu", int),
                peer.show("use_dynamic_batch", "train_max_tokens_per_gpu"))
    elif peer.set_by_user("micro_train_batch_size"):
        out.set("optim.micro_batch_sequences", peer.number("micro_train_batch_size", int), peer.show("micro_train_batch_size"))
    if peer("packing_samples"):
        out.set("optim.padding_free", True, peer.show("packing_samples"))
    if peer("generate_max_len") is not None:
        out.set("rollout.max_new_tokens", peer.number("generate_max_len", int), peer.show("generate_max_len"))
    else:
        out.not_translated.append(f"{peer.flag('generate_max_len')} unset (OpenRLHF generates up to {peer.show('max_len')} "
                                  "less the prompt); set rollout.max_new_tokens")
    out.set("rollout.temperature", peer.number("temperature", float), peer.show("temperature"))
    out.set("rollout.top_p", peer.number("top_p", float), peer.show("top_p"))
    if peer("dynamic_filtering"):
        low, high = peer.pair("dynamic_filtering_reward_range")
        if (low, high) == (0.0, 1.0):
            out.set("rollout.filter_groups", True, peer.show("dynamic_filtering", "dynamic_filtering_reward_range"))
            out.differs.append(f"{peer.flag('dynamic_filtering')}: OpenRLHF keeps a group whose mean score lies strictly "
                               "inside (0, 1), for 0/1 scores a group whose rewards differ, as minirl keeps; minirl stops "
                               "after rollout.filter_groups_max_rounds rounds of sampling")
        else:
            out.not_translated.append(f"{peer.show('dynamic_filtering_reward_range')}: minirl's rollout.filter_groups "
                                      "keeps groups whose rewards differ (the range 0 1 on 0/1 scores) only")
    if peer("async_train"):
        out.set("rollout.async_steps", 1, peer.show("async_train") + ": the next rollout beside this step's training")
        if peer.number("async_queue_size", int) != 1:
            out.not_translated.append(f"{peer.show('async_queue_size')}: minirl's rollout.async_steps keeps each batch "
                                      "exactly 1 step stale")
    if peer("partial_rollout_enable"):
        out.not_translated.append(f"{peer.show('partial_rollout_enable')}: OpenRLHF's in-flight weight updates; minirl's "
                                  "rollout.partial_rollout continues unfinished responses in the next step instead")
    return n


def _optimizer(peer: OpenRLHFPeer, out: Translation, n: int) -> None:
    """DeepSpeed's AdamW (``--l2`` its weight decay) and transformers' schedule over the run's optimizer steps."""
    if peer("actor_optim") != "adam":
        out.not_translated.append(f"{peer.show('actor_optim')}: minirl trains with AdamW")
    lr = peer.number("actor_learning_rate", float)
    out.set("optim.lr", lr, peer.show("actor_learning_rate"))
    out.set("optim.weight_decay", peer.number("l2", float), peer.show("l2"))
    beta1, beta2 = peer.pair("adam_betas")
    out.set("optim.adam_beta1", beta1, peer.show("adam_betas"))
    out.set("optim.adam_beta2", beta2, peer.show("adam_betas"))
    out.set("optim.adam_eps", peer.number("adam_eps", float), peer.show("adam_eps"))
    out.set("optim.grad_clip_norm", peer.number("max_norm", float), peer.show("max_norm"))
    steps = _global_steps(peer, out)
    name = str(peer("lr_scheduler"))
    if name in SCHEDULES:
        style, end = SCHEDULES[name]
        out.set("optim.lr_schedule", style, peer.show("lr_scheduler"))
        if style != "constant":
            out.set("optim.min_lr_ratio", peer.number("min_lr_ratio", float) if end is None else end,
                    peer.show("lr_scheduler") + (" (min_lr = 0.1 x lr)" if end is None else ""))
    else:
        out.not_translated.append(f"{peer.show('lr_scheduler')}: minirl's optim.lr_schedule is constant, linear or cosine")
    ratio = peer.number("lr_warmup_ratio", float)
    if ratio and name != "constant":
        if steps is not None:
            updates = steps * n * peer.number("max_epochs", int)
            warmup = math.ceil(ratio * updates)  # OpenRLHF's ceil(max_steps * lr_warmup_ratio)
            out.set("optim.warmup_updates", warmup, f"ceil({peer.show('lr_warmup_ratio')} x {updates} updates)")
            if warmup:
                out.differs.append("the warm-up: transformers' starts at 0 (update k at k/W of the rate), minirl's "
                                   "at 1/W")
        else:
            out.not_translated.append(f"{peer.show('lr_warmup_ratio')}: the run's length is not known here (set "
                                      "optim.warmup_updates)")
    dtype = peer("param_dtype")
    if dtype == "fp16":
        out.set("optim.precision", "fp16", peer.show("param_dtype"))
    else:
        out.set("optim.precision", "bf16", peer.show("param_dtype" if dtype else "bf16"))
        if not dtype and not peer("bf16"):
            out.differs.append(f"{peer.flag('bf16')} unset: OpenRLHF 0.9 trains in bf16 by default (as translated), "
                               "older releases in fp32 without --bf16 (set optim.precision: fp32 for those)")
    if peer("gradient_checkpointing"):
        out.set("optim.gradient_checkpointing", True, peer.show("gradient_checkpointing"))
    if peer("adam_offload"):
        out.set("optim.cpu_offload", True, peer.show("adam_offload"))
        out.differs.append(f"{peer.flag('adam_offload')}: DeepSpeed keeps the optimizer's state on the CPU; minirl's "
                           "optim.cpu_offload keeps the parameters and gradients there too")
    _lora(peer, out)


def _global_steps(peer: OpenRLHFPeer, out: Translation) -> int | None:
    """``--num_episodes`` passes over the prompts (at most ``--max_samples``), ``--rollout_batch_size`` a step."""
    rows = count_rows(out.values.get("task.path"), str(peer("prompt_split")))
    if rows is None:
        out.not_translated.append(f"{peer.show('num_episodes')}: the data is not on this machine to count its rows; set "
                                  "optim.global_steps (rollouts to train)")
        return None
    rows = min(rows, peer.number("max_samples", int))
    steps = peer.number("num_episodes", int) * (rows // peer.number("rollout_batch_size", int))
    out.set("optim.global_steps", steps, f"{peer.show('num_episodes')} x ({rows} rows // "
            f"{peer.show('rollout_batch_size')})")
    if not steps:
        out.differs.append(f"{rows} rows make no full batch of {peer.show('rollout_batch_size')}: OpenRLHF (drop_last) "
                           "and this config train 0 steps; set optim.global_steps or a smaller --rollout_batch_size")
    return steps


def _lora(peer: OpenRLHFPeer, out: Translation) -> None:
    if not peer.number("lora_rank", int):
        return
    out.set("model.lora.rank", peer.number("lora_rank", int), peer.show("lora_rank"))
    out.set("model.lora.alpha", peer.number("lora_alpha", float), peer.show("lora_alpha"))
    out.set("model.lora.dropout", peer.number("lora_dropout", float), peer.show("lora_dropout"))
    modules = peer("target_modules")
    out.set("model.lora.target_modules", [str(m) for m in (modules if isinstance(modules, list) else [modules])],
            peer.show("target_modules"))
    if peer("load_in_4bit"):
        out.not_translated.append(f"{peer.show('load_in_4bit')}: minirl keeps the base weights in the trainer's precision")


def _runs(peer: OpenRLHFPeer, out: Translation) -> None:
    out.set("run.seed", peer.number("seed", int), peer.show("seed"))
    path = Path(str(peer("save_path")).rstrip("/"))
    out.set("run.output_dir", str(path.parent), peer.show("save_path"))
    out.set("run.name", path.name, peer.show("save_path"))
    save = peer.number("save_steps", int)
    out.set("checkpoint.every_steps", max(save, 0), peer.show("save_steps") + " (-1: at the end only)")
    out.set("checkpoint.keep_last", peer.number("max_ckpt_num", int), peer.show("max_ckpt_num"))
    if peer.set_by_user("ckpt_path"):
        out.differs.append(f"{peer.show('ckpt_path')}: minirl keeps its resumable checkpoints in the run directory "
                           "(RUN_DIR/checkpoints/step_N), the final model in RUN_DIR/checkpoint")
    out.set("run.resume", "auto" if peer("load_checkpoint") else "never", peer.show("load_checkpoint"))
    if peer("load_checkpoint"):
        out.differs.append(f"{peer.flag('load_checkpoint')}: minirl resumes from its own checkpoints in the run "
                           f"directory, not DeepSpeed's under {peer.flag('ckpt_path')}")
    else:  # OpenRLHF trains again, saving over an earlier run there
        out.set("run.overwrite", True, peer.show("save_path") + " (OpenRLHF trains again over an earlier run there "
                f"without {peer.flag('load_checkpoint')}; minirl replaces its checkpoints and metrics)")
    if peer("use_wandb"):
        out.set("log.wandb", True, f"{peer.flag('use_wandb')} given")
        out.set("log.wandb_project", str(peer("wandb_project")), peer.show("wandb_project"))
    if peer("use_tensorboard"):
        out.set("log.tensorboard", True, peer.show("use_tensorboard") + " (minirl writes RUN_DIR/tensorboard)")
    if peer("pretrain_data"):
        out.not_translated.append(f"{peer.show('pretrain_data')}: PPO-ptx's language-modelling loss (minirl has none)")
    for key in ("normalize_reward", "overlong_buffer_len", "stop_properly_penalty_coef"):
        if peer(key):
            out.not_translated.append(f"{peer.show(key)}: OpenRLHF's reward shaping (minirl has no such step)")
    peer("overlong_penalty_factor")


def _critic(peer: OpenRLHFPeer, out: Translation) -> None:
    """The critic of ``--advantage_estimator gae`` (its own AdamW with the actor's ``--l2``, ``--max_norm`` and warm-up,
    ``--value_clip``; ``--freezing_actor_steps``: the actor trains from the step after) as minirl's critic section."""
    out.set("critic.lr", peer.number("critic_learning_rate", float), peer.show("critic_learning_rate"))
    out.set("critic.weight_decay", peer.number("l2", float), peer.show("l2") + " (the critic's too)")
    out.set("critic.grad_clip_norm", peer.number("max_norm", float), peer.show("max_norm") + " (the critic's too)")
    out.set("critic.clip_value_range", peer.number("value_clip", float), peer.show("value_clip"))
    out.set("critic.lr_warmup_updates", int(out.values.get("optim.warmup_updates", 0)), peer.show("lr_warmup_ratio") +
            " (the critic's scheduler warms up as the actor's)")
    frozen = peer.number("freezing_actor_steps", int)
    out.set("critic.warmup_steps", frozen + 1 if frozen > 0 else 0, peer.show("freezing_actor_steps") +
            " (OpenRLHF trains the actor once the step is past it)")
    if peer("critic_pretrain"):
        out.set("critic.model_path", str(peer("critic_pretrain")), peer.show("critic_pretrain"))
        note_local_path(out, peer.flag("critic_pretrain"), str(peer("critic_pretrain")), "critic model", "critic.model_path")
    if str(peer("lr_scheduler")) != "constant":
        out.differs.append(f"{peer.show('lr_scheduler')}: OpenRLHF's critic follows it too; minirl's critic keeps "
                           "critic.lr after its warm-up")


def _cluster(peer: OpenRLHFPeer, out: Translation) -> None:
    """The actor's GPUs as FSDP2 trainer ranks, one per GPU (OpenRLHF's DeepSpeed shards over them)."""
    ranks = peer.number("actor_num_nodes", int) * peer.number("actor_num_gpus_per_node", int)
    if peer("zero_stage") and peer.set_by_user("zero_stage") and ranks <= 1:
        out.ignored.append(f"{peer.flag('zero_stage')} (one GPU: nothing to shard)")
    gpu_ranks(out, ranks, peer.show("actor_num_nodes", "actor_num_gpus_per_node"), "OpenRLHF",
              "(its actors', with DeepSpeed) next to vLLM")


# ------------------------------------------------------------------ the objective


def _objective(peer: OpenRLHFPeer) -> Objective:
    """OpenRLHF's loss and advantages as algo.* values, or why not."""
    obj = Objective()
    estimator = str(peer("advantage_estimator"))
    kl_loss = bool(peer("use_kl_loss"))
    coef = peer.number("init_kl_coef", float)
    kl_reward = coef > 0 and not kl_loss
    _advantages(peer, obj, estimator, kl_reward)
    gspo = peer("policy_loss_type") == "gspo"
    if gspo:
        obj.set("name", "gspo", peer.show("policy_loss_type"))
    elif peer("policy_loss_type") == "ppo":
        obj.set("name", "minirl", peer.show("policy_loss_type") + ": PPO's clip, a token mean")
        obj.set("clip", True, "PPO's min(r A, clip(r) A): a token mask")
        obj.set("aggregation", "token_mean", "OpenRLHF's token-level loss (masked_mean over the tokens)")
    else:
        obj.blockers.append(peer.show("policy_loss_type"))
    low_high = peer("eps_clip_low_high")
    low, high = peer.pair("eps_clip_low_high") if low_high is not None else [peer.number("eps_clip", float)] * 2
    origin = peer.show("eps_clip_low_high" if low_high is not None else "eps_clip")
    obj.set("eps_low", low, origin)
    obj.set("eps_high", high, origin)
    if peer("dual_clip") is not None:
        if gspo:
            obj.blockers.append(peer.show("dual_clip", "policy_loss_type"))
        else:
            obj.set("dual_clip", peer.number("dual_clip", float), peer.show("dual_clip"))
    _correction(peer, obj, gspo)
    if kl_loss and coef:
        kind = str(peer("kl_estimator"))
        obj.set("kl_coef", coef, peer.show("use_kl_loss", "init_kl_coef"))
        obj.set("kl_loss_type", kind, peer.show("kl_estimator"))
        if kind != "k3":
            obj.differs.append(f"{peer.show('kl_estimator')}: OpenRLHF clamps each token's estimate to [-10, 10], "
                               "minirl its k3 only (the same inside it)")
    if peer("kl_target") is not None and kl_loss:  # minirl's KL loss keeps its coefficient
        obj.blockers.append(peer.show("kl_target", "use_kl_loss") + " (OpenRLHF's adaptive coefficient of the KL loss)")
    elif peer("kl_target") is not None and kl_reward and "algo.kl_in_reward_coef" in obj.values:
        obj.set("kl_in_reward_target", peer.number("kl_target", float), peer.show("kl_target") + " (the adaptive "
                "controller of Ziegler et al., after each rollout)")
        obj.set("kl_in_reward_horizon", peer.number("kl_horizon", int), peer.show("kl_horizon"))
    entropy = peer("entropy_loss_coef")
    if entropy:
        obj.set("entropy_coef", peer.number("entropy_loss_coef", float), peer.show("entropy_loss_coef"))
    if peer("aux_loss_coef"):
        obj.set("router_aux_loss_coef", peer.number("aux_loss_coef", float), peer.show("aux_loss_coef"))
    if not gspo:
        micro = peer.number("micro_train_batch_size", int) * peer.number("actor_num_nodes", int) * \
            peer.number("actor_num_gpus_per_node", int)
        if micro < peer.number("train_batch_size", int):
            obj.differs.append(f"{peer.show('micro_train_batch_size')}: OpenRLHF's token mean is each micro-batch's "
                               "(averaged over the micro-batches and GPUs of an update), minirl's the update's: the same "
                               "when every micro-batch holds as many response tokens")
    return obj


def _advantages(peer: OpenRLHFPeer, obj: Objective, estimator: str, kl_reward: bool) -> None:
    """``compute_advantages_and_returns``: the group baseline, each token's return with the KL in the reward at each
    token, whitened over the rollout's tokens for reinforce and reinforce_baseline."""
    baselines = {"reinforce": "none", "reinforce_baseline": "group_mean", "dr_grpo": "group_mean",
                 "group_norm": "group_mean", "rloo": "leave_one_out"}
    if estimator not in (*baselines, "gae"):
        obj.blockers.append(f"{peer.show('advantage_estimator')} (an estimator minirl does not know)")
        return
    origin = peer.show("advantage_estimator")
    if estimator == "gae":
        obj.set("adv_baseline", "critic", origin + ": PPO's generalized advantage estimation over a learned critic's "
                "values (the critic section)")
        obj.set("adv_lambda", peer.number("lambd", float), peer.show("lambd"))
    else:
        obj.set("adv_baseline", baselines[estimator], origin)
    obj.set("adv_std_normalize", estimator == "group_norm", origin)
    whiten = estimator in ("gae", "reinforce", "reinforce_baseline")
    obj.set("adv_whiten", whiten, origin + (" (whitened over the rollout's tokens)" if whiten else ""))
    if estimator == "group_norm":
        obj.set("adv_std_eps", 1e-9, origin + ": OpenRLHF divides by the group's std + 1e-9 (unbiased)")
    if whiten:
        if peer("no_advantage_std_norm"):
            obj.blockers.append(peer.show("no_advantage_std_norm") + " (centred over the tokens, not scaled)")
        obj.differs.append(f"{origin}: the whitening's variance divides by the tokens N in OpenRLHF, by N - 1 in minirl "
                           "(advantages smaller by sqrt((N - 1) / N))")
    gamma = peer.number("gamma", float)
    if estimator == "gae":  # each token's reward: the KL in the reward there, the response's reward at its last token
        obj.set("adv_gamma", gamma, peer.show("gamma"))
    if kl_reward or (estimator == "reinforce" and gamma != 1.0):
        if estimator not in ("reinforce", "gae"):  # the KL in each token's return after a group baseline: no minirl form
            obj.blockers.append(f"{peer.show('init_kl_coef', 'use_kl_loss')} with {estimator} (the KL in each token's "
                                "return after the group baseline; give --use_kl_loss or --init_kl_coef 0)")
            return
        if estimator == "reinforce":
            obj.set("adv_token_returns", True, origin + ": each token's return")
            obj.set("adv_gamma", gamma, peer.show("gamma"))
        if kl_reward:
            obj.set("kl_in_reward_coef", peer.number("init_kl_coef", float), peer.show("init_kl_coef", "use_kl_loss"))
            obj.set("kl_in_reward_type", str(peer("kl_estimator")), peer.show("kl_estimator"))
    if estimator in ("gae", "reinforce"):  # compute_reward clamps each response's reward before the KL is added
        low, high = peer.pair("reward_clip_range")
        obj.set("reward_clip_range", [low, high], peer.show("reward_clip_range") + " (OpenRLHF's compute_reward)")
    elif peer.set_by_user("reward_clip_range"):
        obj.differs.append(f"{peer.show('reward_clip_range')}: OpenRLHF clamps the reward after its baseline; minirl "
                           "does not clamp (the same while the shaped rewards stay inside it)")


def _correction(peer: OpenRLHFPeer, obj: Objective, gspo: bool) -> None:
    """``--enable_vllm_is_correction``: clamp(pi_old/mu_old, low, high) on each token's loss (tis), the weight zeroed
    outside (icepop); GSPO's ratio against the engine's log-probs instead. One threshold (OpenRLHF 0.8): the cap."""
    if not peer("enable_vllm_is_correction"):
        obj.set("is_correction", False, peer.show("enable_vllm_is_correction"))
        return
    kind = peer("vllm_is_correction_type")
    threshold = peer("vllm_is_truncated_threshold")
    if gspo:
        obj.set("is_correction", False, peer.show("enable_vllm_is_correction", "policy_loss_type"))
        obj.set("logp_old_source", "rollout", peer.show("enable_vllm_is_correction") + ": GSPO's ratio against the "
                "engine's log-probs (pi_old := mu_old)")
        return
    if kind not in (None, "tis", "icepop"):
        obj.blockers.append(peer.show("vllm_is_correction_type"))
        return
    if threshold is None:
        low, high = (0.5, 5.0) if kind is not None or "." in peer.spelling.get("enable_vllm_is_correction", "") else (0.0, 2.0)
        obj.differs.append(f"{peer.flag('vllm_is_truncated_threshold')} unset: OpenRLHF's default depends on its release "
                           f"(2 before --vllm_is_correction_type existed, 0.5 5.0 since); {low:g} {high:g} is taken here")
    elif isinstance(threshold, list):
        low, high = peer.pair("vllm_is_truncated_threshold")
    else:
        low, high = 0.0, peer.number("vllm_is_truncated_threshold", float)
    origin = peer.show("enable_vllm_is_correction", "vllm_is_correction_type")
    obj.set("is_correction", True, origin)
    obj.set("tis_placement", "train_infer", "w = pi_old/mu_old on PPO's loss: OpenRLHF's weight")
    obj.set("tis_mode", "mask" if kind == "icepop" else "truncate", origin)
    obj.set("tis_floor", low, peer.show("vllm_is_truncated_threshold") + f" (low {low:g})")
    obj.set("tis_cap", high, peer.show("vllm_is_truncated_threshold") + f" (high {high:g})")
    obj.set("tis_level", "token", origin)
