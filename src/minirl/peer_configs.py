"""A TRL or verl run's settings as a minirl config: ``minirl config from-trl`` / ``from-verl``.

* **TRL**: the YAML file of ``trl grpo --config FILE`` (``GRPOConfig`` + ``ModelConfig`` + the
  script's ``model_name_or_path`` / ``dataset_name`` / ``reward_funcs``), read against TRL 1.16's
  defaults (``grpo_config.py``; transformers' ``TrainingArguments`` for the rest).
* **verl**: the Hydra overrides of a run script (``python3 -m verl.trainer.main_ppo key=value ...``,
  with the script's own ``NAME=value`` variables expanded), a YAML config, or ``key=value`` words,
  read against verl 0.9's ``ppo_trainer.yaml`` defaults.

A key the peer's run did not set takes the peer's default, so the translation describes the run
the user had. Every peer key ends in one of four places, all written into the output's header:
translated (with its origin beside the minirl key), translated but **differs** (what changes, in one
line), **not translated** (no minirl equivalent; the value is named) or ignored (no effect on what is
trained here: ports, logging cadence, hub uploads, ...).

The objective is carried over only when minirl has it exactly (TRL ``loss_type`` grpo / dr_grpo /
dapo, verl ``loss_agg_mode`` on the vanilla PPO loss or GSPO, GRPO advantages, token-level truncated
IS). Otherwise — or with ``keep_objective`` — no ``algo.*`` key is written and the run trains with
minirl's MiniRL (paper Eq. 7); the header says which peer keys that drops. The mapping of each key is
the table of ``docs/coming_from_trl_verl.md``.
"""

from __future__ import annotations

import ast
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from minirl.config import Config, ConfigError

DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".arrow", ".csv")
SECTIONS = ("run", "model", "task", "rollout", "optim", "algo", "moe", "eval", "log", "checkpoint", "cluster")


@dataclass
class Translation:
    """minirl dotted keys with the peer setting each came from, and what did not carry over."""

    source: str
    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    objective: str = ""
    differs: list[str] = field(default_factory=list)
    not_translated: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any, origin: str) -> None:
        self.values[key] = value
        self.origin[key] = origin

    def config(self) -> Config:
        """The translated config, validated; a value minirl rejects is one line naming the peer key."""
        nested: dict[str, Any] = {}
        for key, value in self.values.items():
            *parents, leaf = key.split(".")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        try:
            return Config.model_validate(nested)
        except ValidationError as err:  # name the first bad key and the peer setting it came from
            first = err.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            leaf = where.split(".")[-1]
            source = next((self.origin[k] for k in self.values if k.split(".")[0] == where.split(".")[0]
                           and k.split(".")[-1] == leaf), "")
            message = first["msg"]
            if not where:
                raise ConfigError(f"the translated {self.source} settings are not a valid minirl config: {message}") from None
            raise ConfigError(f"{self.source} setting {source or where}: minirl's {where} rejects it: {message}") from None

    def render(self, source_name: str) -> str:
        """YAML with the header (objective, differences, keys not translated) and each key's origin."""
        self.config()
        lines = [f"# minirl config translated from the {self.source} settings of {source_name}",
                 f"# by `minirl config from-{self.source.lower()}`. Check it with `minirl config show FILE`.",
                 f"# Objective: {self.objective}"]
        for title, items in (("Differs from your run", self.differs),
                             ("Not translated (no minirl equivalent)", self.not_translated)):
            if items:
                lines.append(f"# {title}:")
                lines += [f"#   - {item}" for item in items]
        if self.ignored:
            lines.append(f"# Ignored (no effect on what is trained here): {', '.join(sorted(self.ignored))}")
        tree: dict[str, Any] = {}
        for key in sorted(self.values, key=lambda k: SECTIONS.index(k.split(".")[0])):
            *parents, leaf = key.split(".")
            node = tree
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = key
        lines += _emit(tree, self.values, self.origin, 0)
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        return (f"{len(self.values)} minirl keys from your {self.source} settings; "
                f"{len(self.differs)} differ, {len(self.not_translated)} not translated (listed in the file's header)")


@dataclass
class _Objective:
    """What a peer's loss settings become: algo.* values with their origins, or the reasons they cannot."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    differs: list[str] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any, origin: str) -> None:
        self.values[f"algo.{key}"] = (value, origin)


def _emit(tree: dict[str, Any], values: dict[str, Any], origin: dict[str, str], depth: int) -> list[str]:
    lines = []
    for name, node in tree.items():
        if isinstance(node, dict):
            lines += [f"{'  ' * depth}{name}:", *_emit(node, values, origin, depth + 1)]
        else:
            lines.append(f"{'  ' * depth}{name}: {_scalar(values[node])}  # {origin[node]}")
    return lines


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


class _Peer:
    """The peer's settings: what the user gave, over the peer's defaults; records every key read."""

    def __init__(self, given: dict[str, Any], defaults: dict[str, Any]) -> None:
        self.given, self.defaults = given, defaults
        self.read: set[str] = set()

    def __call__(self, key: str) -> Any:
        self.read.add(key)
        value = self.given.get(key, self.defaults.get(key))
        if isinstance(value, Unresolved):
            raise ConfigError(f"{value.where}: {key} uses a variable the script does not set ({value.text}); "
                              f"set it in the environment or give {key}=... after the script")
        default = self.defaults.get(key)
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        if numeric and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"setting {key}={value!r}: expected a number")
        return value

    def set_by_user(self, key: str) -> bool:
        self.read.add(key)
        return key in self.given

    def show(self, *keys: str) -> str:
        return ", ".join(f"{key}={self(key)!r}" if isinstance(self(key), str) else f"{key}={self(key)}" for key in keys)

    def unread(self) -> list[str]:
        return [key for key in self.given if key not in self.read]


# ---------------------------------------------------------------------------------------------- TRL

TRL_DEFAULTS: dict[str, Any] = {
    # GRPOConfig (TRL 1.16) and the TrainingArguments defaults it keeps or overrides
    "learning_rate": 1e-6, "num_generations": 8, "max_completion_length": 512, "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1, "generation_batch_size": None, "steps_per_generation": None,
    "num_iterations": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0,
    "beta": 0.0, "epsilon": 0.2, "epsilon_high": None, "delta": None, "importance_sampling_level": "token",
    "loss_type": "dapo", "scale_rewards": "group", "reward_weights": None,
    "multi_objective_aggregation": "sum_then_normalize", "mask_truncated_completions": False,
    "sync_ref_model": False, "top_entropy_quantile": 1.0, "entropy_coef": 0.0, "use_adaptive_entropy": False,
    "off_policy_mask_threshold": None, "use_bias_correction_kl": True, "use_vllm": False, "vllm_mode": "colocate",
    "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_max": 3.0, "vllm_importance_sampling_clip_min": None,
    "vllm_importance_sampling_cap": None, "log_completions": False, "num_completions_to_print": None,
    "num_generations_eval": None, "bf16": True, "fp16": False, "gradient_checkpointing": True, "logging_steps": 10,
    "activation_checkpointing": None,
    "max_steps": -1, "num_train_epochs": 3.0, "lr_scheduler_type": "linear", "warmup_steps": 0, "warmup_ratio": None,
    "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0,
    "seed": 42, "output_dir": "trainer_output", "save_strategy": "steps", "save_steps": 500, "save_total_limit": None,
    "eval_strategy": "no", "eval_steps": None, "report_to": "none", "resume_from_checkpoint": None,
    "trust_remote_code": False,
    # the script's arguments and ModelConfig
    "model_name_or_path": None, "dataset_name": None, "dataset_config": None, "dataset_train_split": "train",
    "dataset_test_split": "test", "reward_funcs": None, "reward_model_name_or_path": None,
    "num_processes": 1, "use_peft": False, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": None,
}

TRL_IGNORED = re.compile(
    r"^(logging_.*|log_level.*|disable_tqdm|push_to_hub|hub_.*|dataloader_.*|ds3_gather_for_generation|"
    r"vllm_(server_.*|group_port|gpu_memory_utilization|tensor_parallel_size|enable_sleep_mode|max_model_length|"
    r"model_impl)|attn_implementation|dtype|torch_dtype|model_revision|remove_unused_columns|shuffle_dataset|"
    r"pad_to_multiple_of|cache_implementation|run_name|log_unique_prompts|log_multimodal|save_only_model|"
    r"overwrite_output_dir|ddp_.*|fsdp.*|deepspeed|optim|per_device_eval_batch_size|disable_dropout|"
    r"cast_lm_head_to_fp32|do_train|do_eval|save_safetensors|use_liger_kernel|bf16_full_eval|tf32|vllm_device|"
    r"gradient_checkpointing_kwargs|activation_checkpointing_kwargs|save_on_each_node|local_rank|use_cpu|"
    r"accelerator_config|parallelism_config)$")

TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")


def from_trl(given: dict[str, Any], keep_objective: bool = False) -> Translation:
    """Translate the settings of ``trl grpo --config FILE`` (a flat mapping)."""
    peer, out = _Peer(given, TRL_DEFAULTS), Translation("TRL")
    _trl_model_and_data(peer, out)
    n = _trl_batch(peer, out)  # optimizer steps per global step: N x num_iterations
    _trl_optimizer(peer, out, n)
    _trl_runs(peer, out, n)
    _objective(out, keep_objective, _trl_objective(peer, n, out.values["optim.minibatches_per_step"]))
    _leftovers(peer, out, TRL_IGNORED)
    return out


def _local(out: Translation, key: str, value: str, what: str, target: str = "task.path") -> None:
    if Path(os.path.expanduser(value)).exists():
        return
    target = "model.path" if what == "model" else target
    hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", value) and Path(value).suffix.lower() not in DATA_SUFFIXES
    if not hub_id or value.startswith("."):
        how = f"set {target} to where it is on this machine"
    elif what == "model":
        how = f"`hf download {value} --local-dir DIR`, then set model.path to DIR"
    else:
        how = f"`hf download {value} --repo-type dataset --local-dir DIR`, then set task.path to its training file"
    out.differs.append(f"{key}={value!r} is not on this machine: minirl reads the {what} from disk only ({how})")


def _trl_model_and_data(peer: _Peer, out: Translation) -> None:
    if peer("model_name_or_path"):
        out.set("model.path", peer("model_name_or_path"), peer.show("model_name_or_path"))
        _local(out, "model_name_or_path", peer("model_name_or_path"), "model")
    if peer.set_by_user("trust_remote_code"):
        out.set("model.trust_remote_code", bool(peer("trust_remote_code")), peer.show("trust_remote_code"))
    if peer("use_peft"):
        out.set("model.lora.rank", peer("lora_r"), peer.show("use_peft", "lora_r"))
        out.set("model.lora.alpha", float(peer("lora_alpha")), peer.show("lora_alpha"))
        out.set("model.lora.dropout", float(peer("lora_dropout")), peer.show("lora_dropout"))
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
        _local(out, "dataset_name", peer("dataset_name"), "data")
    if peer("dataset_config"):
        out.not_translated.append(f"{peer.show('dataset_config')}: minirl reads a file or a saved directory")
    if peer("dataset_train_split") != "train":
        out.not_translated.append(f"{peer.show('dataset_train_split')}: minirl reads a DatasetDict's 'train' split")
    peer("dataset_test_split")
    _trl_rewards(peer, out)


def _trl_rewards(peer: _Peer, out: Translation) -> None:
    names = peer("reward_funcs") or []
    names = [names] if isinstance(names, str) else list(names)
    weights = peer("reward_weights") or [1.0] * len(names)
    if len(weights) != len(names):
        raise ConfigError(f"TRL setting reward_weights: {len(weights)} weights for {len(names)} reward_funcs")
    functions: list[dict[str, Any]] = []
    for name, weight in zip(names, weights):
        if name in TRL_REWARDS:
            functions.append({"function": f"trl.rewards:{name}", "weight": float(weight)})
        elif "." in name:
            module, function = name.rsplit(".", 1)
            functions.append({"function": f"{module}:{function}", "weight": float(weight)})
        else:
            out.not_translated.append(f"reward_funcs: {name!r} (a factory such as get_soft_overlong_punishment: "
                                      "give a module:function that returns the rewards)")
    if functions:
        out.set("task.reward_functions", functions, peer.show("reward_funcs") + (", reward_weights" if peer.set_by_user("reward_weights") else ""))
        if any(f["function"].startswith("trl.rewards:") for f in functions):
            out.differs.append("TRL's built-in rewards run as they are (`trl.rewards`): TRL must be installed beside minirl")
    if peer("reward_model_name_or_path"):
        out.not_translated.append(f"{peer.show('reward_model_name_or_path')}: minirl trains on verifiable rewards "
                                  "(functions), not a reward model")


def _trl_batch(peer: _Peer, out: Translation) -> int:
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
    if peer.set_by_user("max_prompt_length") and peer("max_prompt_length"):
        out.not_translated.append(f"{peer.show('max_prompt_length')}: minirl does not cut prompts (task.max_prompt_chars "
                                  "skips rows longer than a number of characters)")
    out.set("optim.epochs_per_step", int(peer("num_iterations")), peer.show("num_iterations"))
    out.set("rollout.max_new_tokens", peer("max_completion_length"), peer.show("max_completion_length"))
    out.set("rollout.temperature", float(peer("temperature")), peer.show("temperature"))
    out.set("rollout.top_p", float(peer("top_p")), peer.show("top_p"))
    for key, default in (("top_k", 0), ("min_p", None), ("repetition_penalty", 1.0)):
        if peer(key) not in (default, None, -1):
            out.not_translated.append(f"{peer.show(key)}: minirl samples with temperature and top_p only")
    if peer("use_vllm"):
        out.set("cluster.engine_backend", "vllm", peer.show("use_vllm"))
        if peer("vllm_mode") != "colocate":
            out.differs.append(f"{peer.show('vllm_mode')}: minirl starts its own vLLM engine (no `trl vllm-serve` server)")
    return n * int(peer("num_iterations"))  # optimizer steps per generation: what TRL's step counts divide by


def _trl_optimizer(peer: _Peer, out: Translation, n: int) -> None:
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
    elif (rows := _count_rows(out.values.get("task.path"))) and rows >= out.values["rollout.prompts_per_step"]:
        steps = int(peer("num_train_epochs") * rows) // out.values["rollout.prompts_per_step"]
        out.set("optim.global_steps", steps, f"{peer.show('num_train_epochs')} x {rows} rows / prompts per step")
        max_steps = steps * n  # what warm-up ratios refer to
    else:
        out.not_translated.append(f"{peer.show('num_train_epochs')} with max_steps unset: set optim.global_steps "
                                  "(rollouts; one epoch = training prompts / rollout.prompts_per_step)")
    warmup, ratio = peer("warmup_steps"), peer("warmup_ratio")
    if ratio or (isinstance(warmup, float) and 0 < warmup < 1):
        fraction = ratio or warmup
        if max_steps and max_steps > 0:
            out.set("optim.warmup_updates", round(fraction * max_steps), f"{fraction} x max_steps")
        else:
            out.not_translated.append(f"warm-up ratio {fraction} without max_steps: set optim.warmup_updates")
    elif warmup:
        out.set("optim.warmup_updates", int(warmup), peer.show("warmup_steps"))
    kind = {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear",
            "cosine": "cosine"}.get(peer("lr_scheduler_type"))
    if kind is None:
        out.not_translated.append(f"{peer.show('lr_scheduler_type')}: minirl's optim.lr_schedule is constant, linear "
                                  "or cosine (constant kept)")
    else:
        out.set("optim.lr_schedule", kind, peer.show("lr_scheduler_type"))
    if out.values.get("optim.warmup_updates"):
        out.differs.append("the warm-up: transformers' starts at 0 (update k at k/W of the rate), minirl's at 1/W ((k + 1)/W)")
    if peer("fp16"):
        out.not_translated.append("fp16=True: minirl trains in fp32 or bf16 (optim.precision)")
    out.set("optim.precision", "bf16" if peer("bf16") else "fp32", peer.show("bf16"))
    key = "activation_checkpointing" if peer.set_by_user("activation_checkpointing") else "gradient_checkpointing"
    out.set("optim.gradient_checkpointing", bool(peer(key)), peer.show(key))  # transformers 5's name, or the old one


def _trl_runs(peer: _Peer, out: Translation, n: int) -> None:
    path = Path(str(peer("output_dir")))
    out.set("run.output_dir", str(path.parent), peer.show("output_dir"))
    out.set("run.name", path.name, peer.show("output_dir"))
    out.set("run.seed", int(peer("seed")), peer.show("seed"))
    if peer("resume_from_checkpoint") is True or peer("resume_from_checkpoint") == "True":
        out.set("run.resume", "auto", peer.show("resume_from_checkpoint"))
    elif peer("resume_from_checkpoint"):
        out.not_translated.append(f"{peer.show('resume_from_checkpoint')}: minirl resumes from the newest checkpoint "
                                  "of its run directory (run.resume: auto)")
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
        out.differs.append("eval_strategy='no': minirl still evaluates before and after training (eval.every_steps: 0)")
    else:
        out.not_translated.append(f"{peer.show('eval_strategy')}: give eval.every_steps in global steps")
    if peer("eval_strategy") != "no":
        out.differs.append(f"{peer.show('dataset_test_split')}: minirl holds out task.eval_fraction of the data, "
                           "or reads task.eval_path (save the split to a file)")
    if peer("num_generations_eval"):
        out.set("eval.samples_per_prompt", int(peer("num_generations_eval")), peer.show("num_generations_eval"))
    if peer("log_completions"):
        every = peer("logging_steps")
        out.set("log.completions_every_steps", max(1, math.ceil(every / n)), f"log_completions, logging_steps={every} / (N x E)")
        if peer("num_completions_to_print"):
            out.set("log.completions_per_step", int(peer("num_completions_to_print")), peer.show("num_completions_to_print"))
    else:
        out.set("log.completions_every_steps", 0, peer.show("log_completions"))
    _report_to(peer("report_to"), out, "report_to")


def _report_to(value: Any, out: Translation, key: str) -> None:
    names = [value] if isinstance(value, str) else list(value or [])
    everything = "all" in names
    for name in ("tensorboard", "wandb"):
        if everything or name in names:
            out.set(f"log.{name}", True, f"{key}={value!r}")
    rest = [name for name in names if name not in ("tensorboard", "wandb", "all", "none", "console")]
    if rest:
        out.not_translated.append(f"{key}: {', '.join(rest)} (minirl logs to TensorBoard, wandb and metrics.jsonl)")


def _trl_objective(peer: _Peer, n: int, minibatches: int) -> _Objective:
    """TRL's loss (``GRPOTrainer._compute_loss``) as algo.* values, or the reasons it has no exact equivalent."""
    obj = _Objective()
    for key, neutral in (("delta", None), ("top_entropy_quantile", 1.0), ("entropy_coef", 0.0),
                         ("use_adaptive_entropy", False), ("off_policy_mask_threshold", None),
                         ("mask_truncated_completions", False), ("sync_ref_model", False),
                         ("multi_objective_aggregation", "sum_then_normalize")):
        if peer(key) != neutral:
            obj.blockers.append(peer.show(key))
    loss, level = peer("loss_type"), peer("importance_sampling_level")
    eps_low = float(peer("epsilon"))
    eps_high = float(peer("epsilon_high") if peer("epsilon_high") is not None else eps_low)
    name = {("sequence", "grpo"): "gspo", ("token", "grpo"): "grpo", ("token", "dr_grpo"): "minirl",
            ("token", "dapo"): "minirl"}.get((level, loss))
    if name is None:
        obj.blockers.append(peer.show("loss_type", "importance_sampling_level"))
        return obj
    obj.set("name", name, peer.show("loss_type", "importance_sampling_level"))
    obj.set("eps_low", eps_low, peer.show("epsilon"))
    obj.set("eps_high", eps_high, peer.show("epsilon_high") if peer("epsilon_high") is not None else "epsilon_high unset: = epsilon")
    if name == "minirl":  # PPO's min/clip gradient is MiniRL's clip mask with the weight pi_theta/pi_old
        obj.set("clip", True, "PPO's min(r A, clip(r) A): a token mask")
        if loss == "dapo":
            obj.set("aggregation", "token_mean", "loss_type='dapo': tokens of the mini-batch")
            if minibatches > 1:
                obj.differs.append("loss_type='dapo' with several optimizer steps per generation: TRL divides each "
                                   "step by the generation's mean tokens per step, minirl by the step's own tokens")
        else:
            obj.set("aggregation", "seq_sum", "loss_type='dr_grpo': sum over tokens")
            responses = peer("per_device_train_batch_size") * peer("gradient_accumulation_steps") * peer("num_processes")
            obj.set("normalizer", float(responses * peer("max_completion_length")),
                    f"dr_grpo divides by {responses} completions per optimizer step x max_completion_length")
    scale = {True: "group", False: "none"}.get(peer("scale_rewards"), peer("scale_rewards"))
    if scale not in ("group", "none"):
        obj.blockers.append(peer.show("scale_rewards"))
    obj.set("adv_std_normalize", scale == "group", peer.show("scale_rewards"))
    if scale == "group":
        obj.differs.append("scale_rewards='group': TRL divides by the group std + 1e-4, minirl by std + 1e-6")
    correction = bool(peer("use_vllm") and peer("vllm_importance_sampling_correction"))
    if correction and peer("vllm_importance_sampling_mode") != "token_truncate":
        obj.blockers.append(peer.show("vllm_importance_sampling_mode") + " (minirl's is token_truncate)")
    elif correction and peer("vllm_importance_sampling_clip_min") is not None:
        obj.blockers.append(peer.show("vllm_importance_sampling_clip_min"))
    if name != "gspo":  # TRL multiplies each token by min(pi_old / mu_old, cap), detached; without vLLM by nothing
        obj.set("is_correction", correction, peer.show("use_vllm", "vllm_importance_sampling_correction"))
        if correction:
            cap = peer("vllm_importance_sampling_cap") or peer("vllm_importance_sampling_clip_max")
            obj.set("tis_cap", float(cap), peer.show("vllm_importance_sampling_clip_max"))
        if name == "minirl":
            obj.set("tis_placement", "train_infer", "w = min(pi_old/mu_old, cap) x pi_theta/pi_old: TRL's weight")
    if peer("beta"):
        obj.set("kl_coef", float(peer("beta")), peer.show("beta"))
        obj.set("kl_loss_type", "k3", "TRL's per-token KL is k3")
        if peer("use_bias_correction_kl") and n > 1:
            obj.differs.append("use_bias_correction_kl=True: TRL weights its KL term by pi_theta/pi_old; minirl does "
                               "not (the same when N = 1)")
    return obj


def _objective(out: Translation, keep: bool, obj: _Objective) -> None:
    """Carry the peer's loss over when minirl has it; else (or when asked) leave minirl's MiniRL."""
    if keep or obj.blockers:
        why = ("as asked (--keep-objective)" if keep else
               f"your {out.source} loss has no exact minirl equivalent ({'; '.join(obj.blockers)})")
        out.objective = f"minirl's MiniRL (paper Eq. 7), {why}; no algo.* key is set"
        out.not_translated += [f"{item}: the run trains with MiniRL instead" for item in obj.blockers if not keep]
        return
    for key, (value, origin) in obj.values.items():
        out.set(key, value, origin)
    out.differs += obj.differs
    extra = f", aggregation={out.values['algo.aggregation']}" if "algo.aggregation" in out.values else ""
    out.objective = (f"your {out.source} loss as minirl's algo.name={out.values['algo.name']}{extra}"
                     + (" (its differences are listed below)" if obj.differs else ", the same gradient"))


def _unset(value: Any) -> bool:
    """A value that turns nothing on: off, empty, Hydra's mandatory ``???`` or an interpolation of another key."""
    return (value is None or value is False or value == 0 or value in ("", "???") or value == [] or value == {}
            or (isinstance(value, str) and value.startswith("${")))


def _leftovers(peer: _Peer, out: Translation, ignored: re.Pattern[str]) -> None:
    """Keys the translation did not read: known to the peer's table (their effect rides on another key, e.g. a
    KL coefficient with the KL off) or unset -> nothing; noise -> ignored; the rest -> not translated."""
    for key in peer.unread():
        if key in peer.defaults or _unset(peer.given[key]):
            continue
        if ignored.match(key):
            out.ignored.append(key)
        else:
            value = peer.given[key]
            shown = value.text if isinstance(value, Unresolved) else repr(value)
            out.not_translated.append(f"{key}={shown}: not a setting minirl knows how to carry over")


# --------------------------------------------------------------------------------------------- verl

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
M = "actor_rollout_ref.model."
VERL_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024, "data.max_response_length": 512, "data.prompt_key": "prompt",
    "data.train_files": None, "data.val_files": None, "data.seed": None,
    R + "n": 1, R + "temperature": 1.0, R + "top_p": 1.0, R + "top_k": -1, R + "name": None,
    R + "val_kwargs.n": 1, R + "val_kwargs.temperature": 0, R + "val_kwargs.top_p": 1.0,
    R + "enable_rollout_routing_replay": False,
    A + "ppo_mini_batch_size": 256, A + "ppo_micro_batch_size_per_gpu": None, A + "use_dynamic_bsz": False,
    A + "ppo_max_token_len_per_gpu": 16384, A + "ppo_epochs": 1, A + "clip_ratio": 0.2,
    A + "clip_ratio_low": None, A + "clip_ratio_high": None, A + "clip_ratio_c": 3.0,
    A + "loss_agg_mode": "token-mean", A + "loss_scale_factor": None, A + "policy_loss.loss_mode": "vanilla",
    A + "entropy_coeff": 0, A + "use_kl_loss": False, A + "kl_loss_coef": 0.001, A + "kl_loss_type": "low_var_kl",
    A + "optim.lr": 1e-6, A + "optim.weight_decay": 0.01, A + "optim.betas": [0.9, 0.999],
    A + "optim.clip_grad": 1.0, A + "grad_clip": None, A + "optim.lr_warmup_steps": -1,
    A + "optim.lr_warmup_steps_ratio": 0.0, A + "optim.lr_scheduler_type": "constant", A + "optim.warmup_style": None,
    A + "optim.min_lr_ratio": 0.0, A + "optim.num_cycles": 0.5, A + "optim.optimizer": "AdamW",
    M + "path": None, M + "trust_remote_code": False, M + "enable_gradient_checkpointing": True,
    M + "lora_rank": 0, M + "lora_alpha": 16, M + "target_modules": "all-linear",
    "algorithm.adv_estimator": "gae", "algorithm.norm_adv_by_std_in_grpo": True, "algorithm.use_kl_in_reward": False,
    "algorithm.rollout_correction.rollout_is": None, "algorithm.rollout_correction.rollout_is_threshold": 2.0,
    "algorithm.rollout_correction.rollout_rs": None, "algorithm.rollout_correction.bypass_mode": False,
    "trainer.total_epochs": 30, "trainer.total_training_steps": None, "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k", "trainer.default_local_dir": None, "trainer.logger": ["console", "wandb"],
    "trainer.save_freq": -1, "trainer.max_actor_ckpt_to_keep": None, "trainer.test_freq": -1,
    "trainer.resume_mode": "auto", "trainer.n_gpus_per_node": 8, "trainer.nnodes": 1, "trainer.device": "cuda",
    "trainer.log_val_generations": 0, "algorithm.filter_groups.enable": False, R + "quantization": None,
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
    r"entropy_checkpointing|strategy|shuffle)(\..*)?|"
    r"data\.(max_prompt_length|filter_overlong_prompts.*|truncation|return_raw_chat|shuffle|tokenizer|"
    r"val_batch_size|reward_fn_key)|trainer\.(val_before_train|critic_warmup|balance_batch|"
    r"ray_wait_register_center_timeout|use_legacy_worker_impl)|"
    r"actor_rollout_ref\.(ref\..*|hybrid_engine)|critic\..*|ray_kwargs\..*|ray_init\..*|"
    r"actor_rollout_ref\.actor\.(optim\.total_training_steps|data_loader_seed)|"
    r"actor_rollout_ref\.rollout\.(log_prob_micro_batch_size_per_gpu|prompt_length|response_length|seed)|"
    r"actor_rollout_ref\.model\.use_remove_padding|reward_model\.enable|"
    # the parameters of subsystems minirl has not (each one's switch is read, and is an untranslated line when on)
    r"(distillation|transfer_queue|global_profiler|skip|reward\.reward_model|reward\.sandbox_fusion|trainer\.v1)\..*|"
    r"reward\.(num_workers|reward_manager\..*)|trainer\.use_v1|algorithm\.(gamma|lam|kl_penalty|kl_ctrl\..*|"
    r"pf_ppo\..*|filter_groups\.(?!enable$).*|rollout_correction\.loss_type)|"
    r"actor_rollout_ref\.actor\.(qat\..*|tau_pos|tau_neg|policy_loss\.(clip_cov|kl_cov|ppo_kl|dro).*|optim\.optimizer_impl|"
    r"optim\.zero_indexed_step|entropy_from_logits_chunk_size)|"
    r"actor_rollout_ref\.rollout\.(multi_turn|agent|checkpoint_engine|prometheus|disaggregation)\..*|"
    r"actor_rollout_ref\.rollout\.(pipeline_model_parallel_size|logprobs_mode|scheduling_policy|do_sample|"
    r"skip_tokenizer_init|val_kwargs\.top_k)|"
    r"actor_rollout_ref\.model\.(mtp|tiled_mlp|fused_kernel_options|lora)\..*|actor_rollout_ref\.nccl_timeout|"
    r"data\.(train_max_samples|val_max_samples|image_patch_size|image_key|video_key|audio_key|return_multi_modal_inputs))$")


def from_verl(given: dict[str, Any], keep_objective: bool = False) -> Translation:
    """Translate verl ``main_ppo`` settings (flat dotted Hydra keys)."""
    given = {key.lstrip("+~"): value for key, value in given.items()}
    peer, out = _Peer(given, VERL_DEFAULTS), Translation("verl")
    _verl_model_and_data(peer, out)
    n = _verl_batch(peer, out)
    _verl_optimizer(peer, out)
    _verl_runs(peer, out)
    _objective(out, keep_objective, _verl_objective(peer, n))
    _verl_cluster(peer, out)
    _leftovers(peer, out, VERL_IGNORED)
    return out


def _one_file(value: Any) -> Any:
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _verl_model_and_data(peer: _Peer, out: Translation) -> None:
    if peer(M + "path"):
        out.set("model.path", peer(M + "path"), peer.show(M + "path"))
        _local(out, M + "path", peer(M + "path"), "model")
    if peer.set_by_user(M + "trust_remote_code"):
        out.set("model.trust_remote_code", bool(peer(M + "trust_remote_code")), peer.show(M + "trust_remote_code"))
    if peer(M + "lora_rank"):
        out.set("model.lora.rank", int(peer(M + "lora_rank")), peer.show(M + "lora_rank"))
        out.set("model.lora.alpha", float(peer(M + "lora_alpha")), peer.show(M + "lora_alpha"))
        modules = peer(M + "target_modules")
        out.set("model.lora.target_modules", [modules] if isinstance(modules, str) else list(modules),
                peer.show(M + "target_modules"))
    if peer("data.train_files"):
        out.set("task.kind", "jsonl", "data.train_files given")
    for theirs, ours in (("data.train_files", "task.path"), ("data.val_files", "task.eval_path")):
        value = _one_file(peer(theirs))
        if isinstance(value, list):
            out.not_translated.append(f"{peer.show(theirs)}: minirl reads one file per split (join them first)")
        elif value:
            out.set(ours, value, peer.show(theirs))
            _local(out, theirs, value, "data", ours)
    if peer.set_by_user("data.prompt_key"):
        out.set("task.prompt_column", peer("data.prompt_key"), peer.show("data.prompt_key"))
    for prefix in ("", "reward."):
        if peer(prefix + "custom_reward_function.path"):
            spec = f"{peer(prefix + 'custom_reward_function.path')}:{peer(prefix + 'custom_reward_function.name')}"
            kwargs = peer(prefix + "custom_reward_function.reward_kwargs") or {}
            if kwargs:  # verl passes them to every call: one entry of task.reward_functions carries them
                out.set("task.reward_functions", [{"function": spec, "kwargs": dict(kwargs)}],
                        peer.show(prefix + "custom_reward_function.path", prefix + "custom_reward_function.reward_kwargs"))
            else:
                out.set("task.reward_function", spec, peer.show(prefix + "custom_reward_function.path"))
    manager = peer("reward_model.reward_manager") or peer("reward.reward_manager.name")
    if manager not in ("naive", "batch"):
        out.not_translated.append(f"verl's {manager!r} reward manager (its own shaping, e.g. DAPO's overlong "
                                  "penalty): minirl calls your compute_score per sample or batched, as naive / batch")
    if not ({"task.reward_function", "task.reward_functions"} & set(out.values)) and "task.path" in out.values:
        out.differs.append("no custom_reward_function: verl scores with default_compute_score by data_source; minirl "
                           "uses its built-in task.reward (exact: the answer after ####, in \\boxed{} or after 'answer:')")


def _verl_batch(peer: _Peer, out: Translation) -> int:
    prompts, minibatch = peer("data.train_batch_size"), peer(A + "ppo_mini_batch_size")
    if prompts % minibatch:
        raise ConfigError(f"verl settings {peer.show('data.train_batch_size', A + 'ppo_mini_batch_size')}: the mini-batch "
                          "size must divide the batch")
    n = prompts // minibatch
    out.set("rollout.prompts_per_step", prompts, peer.show("data.train_batch_size"))
    out.set("rollout.samples_per_prompt", peer(R + "n"), peer.show(R + "n"))
    out.set("optim.minibatches_per_step", n, f"train_batch_size / ppo_mini_batch_size = {prompts} / {minibatch}")
    if peer(A + "ppo_micro_batch_size_per_gpu"):
        out.set("optim.micro_batch_sequences", peer(A + "ppo_micro_batch_size_per_gpu"), peer.show(A + "ppo_micro_batch_size_per_gpu"))
    if peer(A + "use_dynamic_bsz"):
        out.set("optim.micro_batch_max_tokens", peer(A + "ppo_max_token_len_per_gpu"),
                peer.show(A + "use_dynamic_bsz", A + "ppo_max_token_len_per_gpu"))
    out.set("optim.epochs_per_step", int(peer(A + "ppo_epochs")), peer.show(A + "ppo_epochs"))
    out.set("rollout.max_new_tokens", peer("data.max_response_length"), peer.show("data.max_response_length"))
    out.set("rollout.temperature", float(peer(R + "temperature")), peer.show(R + "temperature"))
    out.set("rollout.top_p", float(peer(R + "top_p")), peer.show(R + "top_p"))
    if peer(R + "top_k") not in (-1, 0, None):
        out.not_translated.append(f"{peer.show(R + 'top_k')}: minirl samples with temperature and top_p only")
    if peer("algorithm.filter_groups.enable"):
        out.not_translated.append("algorithm.filter_groups.enable=True: DAPO's dynamic sampling (groups whose rewards "
                                  "are all equal dropped, more sampled) has no minirl equivalent")
    quantization = peer(R + "quantization.weight_dtype") or peer(R + "quantization")
    if quantization and not isinstance(quantization, dict):
        out.not_translated.append(f"rollout quantization {quantization!r}: minirl's native engine has its own "
                                  "(rollout.precision: fp8_e4m3 | fp8_e5m2 | fp4_e2m1, per-tensor or per-expert scales)")
    name = peer(R + "name")
    if name == "vllm":
        out.set("cluster.engine_backend", "vllm", peer.show(R + "name"))
    elif not _unset(name):
        out.differs.append(f"{peer.show(R + 'name')}: minirl samples with its native engine (or vLLM)")
    return n


def _verl_cluster(peer: _Peer, out: Translation) -> None:
    ranks = peer("trainer.n_gpus_per_node") * peer("trainer.nnodes")
    out.set("cluster.device", "cpu" if peer("trainer.device") == "cpu" else "cuda", peer.show("trainer.device"))
    single = [why for key, why in (("model.lora.rank", "LoRA"), ("algo.kl_coef", "the KL penalty"))
              if out.values.get(key)]
    if ranks > 1 and single:
        out.set("cluster.trainer_ranks", 1, f"{' and '.join(single)}: one trainer process in minirl")
        out.differs.append(f"{peer.show('trainer.n_gpus_per_node', 'trainer.nnodes')}: minirl runs "
                           f"{' and '.join(single)} with a single-process trainer (one GPU); without it "
                           f"(e.g. algo.kl_coef=0) set cluster.trainer_ranks={ranks}, cluster.backend=ray")
    elif ranks > 1:
        out.set("cluster.trainer_ranks", ranks, peer.show("trainer.n_gpus_per_node", "trainer.nnodes"))
        out.set("cluster.backend", "ray", "verl runs its workers on Ray")
        out.set("cluster.gpus_per_trainer_rank", 1.0, "one GPU per trainer rank")
        out.set("cluster.gpus_per_engine", 1.0, "one GPU per rollout engine")
        out.differs.append(f"verl colocates actor and rollout on the same {ranks} GPUs; minirl places {ranks} trainer "
                           "ranks and its engines as separate Ray actors: size cluster.* for your machine "
                           "(docs/distributed.md)")


def _verl_optimizer(peer: _Peer, out: Translation) -> None:
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
    rows = _count_rows(out.values.get("task.path"))
    if steps:
        out.set("optim.global_steps", int(steps), peer.show("trainer.total_training_steps"))
    elif rows is not None and rows >= peer("data.train_batch_size"):  # verl's loader drops a last partial batch
        steps = epochs * (rows // peer("data.train_batch_size"))
        out.set("optim.global_steps", steps, f"trainer.total_epochs={epochs} x ({rows} rows // data.train_batch_size)")
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
    out.set("optim.precision", "bf16", "verl's FSDP actor computes in bf16 (fp32 master weights)")
    for key in (A + "megatron.router_replay.mode", A + "router_replay.mode", A + "veomni.router_replay.mode"):
        if peer(key) in ("R2", "R3"):
            out.set("moe.routing_replay", peer(key), peer.show(key, R + "enable_rollout_routing_replay"))


def _count_rows(path: str | None) -> int | None:
    """Rows of a local data file (what verl's loader counts), or None when it is not here or unreadable."""
    if not path or not Path(os.path.expanduser(path)).exists():
        return None
    from minirl.tasks.data import iter_rows
    from minirl.tasks.jsonl import TaskDataError

    try:
        return sum(1 for _ in iter_rows(Path(os.path.expanduser(path))))
    except TaskDataError:
        return None


def _verl_runs(peer: _Peer, out: Translation) -> None:
    local = peer("trainer.default_local_dir") or f"checkpoints/{peer('trainer.project_name')}/{peer('trainer.experiment_name')}"
    local = local.replace("${trainer.project_name}", str(peer("trainer.project_name")))
    local = local.replace("${trainer.experiment_name}", str(peer("trainer.experiment_name")))
    out.set("run.output_dir", str(Path(local).parent), peer.show("trainer.default_local_dir") if peer("trainer.default_local_dir") else "trainer.project_name")
    out.set("run.name", Path(local).name, "trainer.experiment_name")
    if peer("data.seed") is not None:
        out.set("run.seed", int(peer("data.seed")), peer.show("data.seed"))
    out.set("run.resume", "auto" if peer("trainer.resume_mode") == "auto" else "never", peer.show("trainer.resume_mode"))
    if peer("trainer.save_freq") and peer("trainer.save_freq") > 0:
        out.set("checkpoint.every_steps", int(peer("trainer.save_freq")), peer.show("trainer.save_freq"))
    else:
        out.set("checkpoint.every_steps", 0, peer.show("trainer.save_freq"))
    if peer("trainer.max_actor_ckpt_to_keep"):
        out.set("checkpoint.keep_last", int(peer("trainer.max_actor_ckpt_to_keep")), peer.show("trainer.max_actor_ckpt_to_keep"))
    frequency = peer("trainer.test_freq")
    out.set("eval.every_steps", int(frequency) if frequency and frequency > 0 else 0, peer.show("trainer.test_freq"))
    out.set("eval.samples_per_prompt", int(peer(R + "val_kwargs.n")), peer.show(R + "val_kwargs.n"))
    if peer(R + "val_kwargs.temperature"):
        out.set("eval.temperature", float(peer(R + "val_kwargs.temperature")), peer.show(R + "val_kwargs.temperature"))
    else:
        out.differs.append(f"{peer.show(R + 'val_kwargs.temperature')} (greedy): minirl evaluates by sampling "
                           "(eval.temperature 1.0, mean@n)")
    out.set("eval.top_p", float(peer(R + "val_kwargs.top_p")), peer.show(R + "val_kwargs.top_p"))
    if peer("trainer.log_val_generations"):
        out.set("log.completions_per_step", int(peer("trainer.log_val_generations")), peer.show("trainer.log_val_generations"))
    _report_to(peer("trainer.logger"), out, "trainer.logger")


def _verl_objective(peer: _Peer, n: int) -> _Objective:
    """verl's actor loss (``core_algos``: vanilla PPO or GSPO, ``agg_loss``) as algo.* values, or why not."""
    obj = _Objective()
    if peer("algorithm.adv_estimator") != "grpo":
        obj.blockers.append(peer.show("algorithm.adv_estimator") + " (minirl's advantage is GRPO's group baseline)")
    for key, neutral in ((A + "entropy_coeff", 0), ("algorithm.use_kl_in_reward", False),
                         ("algorithm.rollout_correction.rollout_rs", None),
                         ("algorithm.rollout_correction.bypass_mode", False)):
        if peer(key) != neutral:
            obj.blockers.append(peer.show(key))
    low_key = A + ("clip_ratio_low" if peer(A + "clip_ratio_low") is not None else "clip_ratio")
    high_key = A + ("clip_ratio_high" if peer(A + "clip_ratio_high") is not None else "clip_ratio")
    mode, agg = peer(A + "policy_loss.loss_mode"), peer(A + "loss_agg_mode")
    name = "gspo" if mode == "gspo" else {"seq-mean-token-mean": "grpo", "token-mean": "minirl", "token-sum": "minirl",
                                          "seq-mean-token-sum": "minirl", "seq-mean-token-sum-norm": "minirl"}.get(agg)
    if mode not in ("vanilla", "gspo") or name is None:
        obj.blockers.append(peer.show(A + "policy_loss.loss_mode", A + "loss_agg_mode"))
        return obj
    obj.set("name", name, peer.show(A + "policy_loss.loss_mode", A + "loss_agg_mode"))
    obj.set("eps_low", float(peer(low_key)), peer.show(low_key))
    obj.set("eps_high", float(peer(high_key)), peer.show(high_key))
    if name == "minirl":  # PPO's min/clip gradient is MiniRL's clip mask with the weight pi_theta/pi_old
        obj.set("clip", True, "PPO's min(r A, clip(r) A): a token mask")
        obj.set("aggregation", "token_mean" if agg == "token-mean" else "seq_sum", peer.show(A + "loss_agg_mode"))
        responses = peer("data.train_batch_size") // n * peer(R + "n")
        if agg == "seq-mean-token-sum-norm":
            factor = peer(A + "loss_scale_factor") or peer("data.max_response_length")
            obj.set("normalizer", float(responses * factor), f"{responses} responses per mini-batch x {factor}")
            if not peer(A + "loss_scale_factor"):
                obj.differs.append("loss_agg_mode='seq-mean-token-sum-norm' without loss_scale_factor: verl divides by "
                                   "each micro-batch's padded width, minirl by data.max_response_length")
        elif agg == "token-sum":
            obj.set("normalizer", 1.0, "token-sum: no division")
    if mode == "vanilla" and peer(A + "clip_ratio_c"):
        obj.differs.append(f"{peer.show(A + 'clip_ratio_c')} (dual clip): verl also drops the gradient of tokens with "
                           "A < 0 and pi_theta/pi_old above it; minirl keeps them")
    obj.set("adv_std_normalize", bool(peer("algorithm.norm_adv_by_std_in_grpo")), peer.show("algorithm.norm_adv_by_std_in_grpo"))
    rollout_is = peer("algorithm.rollout_correction.rollout_is")
    if rollout_is not in (None, "token"):
        obj.blockers.append(peer.show("algorithm.rollout_correction.rollout_is"))
    if name != "gspo":  # verl multiplies each token by min(pi_old / mu_old, threshold), detached
        obj.set("is_correction", rollout_is == "token", peer.show("algorithm.rollout_correction.rollout_is"))
        if rollout_is == "token":
            threshold = "algorithm.rollout_correction.rollout_is_threshold"
            obj.set("tis_cap", float(peer(threshold)), peer.show(threshold))
        if name == "minirl":
            obj.set("tis_placement", "train_infer", "w = min(pi_old/mu_old, cap) x pi_theta/pi_old: verl's weight")
    if peer(A + "use_kl_loss"):
        kind = {"low_var_kl": "k3", "k3": "k3", "kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2"}.get(peer(A + "kl_loss_type"))
        if kind is None:
            obj.blockers.append(peer.show(A + "kl_loss_type"))
        else:
            obj.set("kl_coef", float(peer(A + "kl_loss_coef")), peer.show(A + "use_kl_loss", A + "kl_loss_coef"))
            obj.set("kl_loss_type", kind, peer.show(A + "kl_loss_type"))
    return obj


# -------------------------------------------------------------------------------------------- input

def _value(text: str) -> Any:
    """A Hydra / CLI value: numbers (``1e-6`` too), booleans, null, lists; else the string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix[:-1]: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("defaults", "hydra", "_target_"):
            continue
        flat.update(_flatten(value, f"{prefix}{key}."))
    return flat


def read_trl(path: str | None, words: list[str]) -> dict[str, Any]:
    """A ``trl grpo --config`` YAML plus ``key=value`` words (TRL's names)."""
    given = _read_yaml(path) if path else {}
    for word in words:
        key, _, value = word.partition("=")
        given[key.lstrip("-")] = _value(value)
    return given


def read_verl(paths: list[str], words: list[str]) -> dict[str, Any]:
    """verl settings from run scripts (``.sh``), YAML configs (flattened) and ``key=value`` words."""
    given: dict[str, Any] = {}
    for path in paths:
        if path.endswith((".yaml", ".yml")):
            given.update(_flatten(_read_yaml(path)))
        else:
            given.update(script_overrides(Path(path)))
    for word in words:
        key, _, value = word.partition("=")
        given[key] = _value(value)
    return given


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    return data


@dataclass(frozen=True)
class Unresolved:
    """A script's override naming a variable set nowhere: an error only if the translation reads it."""

    text: str
    where: str


_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_OVERRIDE = re.compile(r"^(\+{0,2}~?[A-Za-z_][\w-]*(?:\.[\w-]+)+)=(.*)$", re.S)


def script_overrides(path: Path) -> dict[str, Any]:
    """The ``key=value`` Hydra overrides of a verl run script, with its ``NAME=value`` variables (and the
    environment's) expanded; an override naming a variable set nowhere is kept ``Unresolved`` (an error
    line once a translation needs it; a setting minirl ignores may stay unresolved)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from None
    variables = dict(os.environ)
    overrides: dict[str, Any] = {}
    for number, physical in _logical_lines(text):
        line = _arithmetic(" ".join(physical).strip(), variables)
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as err:
            raise ConfigError(f"{path}:{number}: cannot read the shell line ({err})") from None
        for word in words:
            assignment = _ASSIGNMENT.match(word)
            override = _OVERRIDE.match(word)
            if override:
                key, value = override.groups()
                expanded = _expand(value, variables)
                at = number + next((i for i, part in enumerate(physical) if f"{key}=" in part), 0)
                overrides[key] = Unresolved(value, f"{path}:{at}") if expanded is None else _value(expanded)
            elif assignment and words[0] in (word, "export"):
                name, value = assignment.groups()
                expanded = _expand(value, variables)
                if expanded is not None:  # else it stays unset: an override using it is the error line
                    variables[name] = expanded
    if not overrides:
        raise ConfigError(f"{path}: no verl key=value overrides found (expected e.g. data.train_files=...)")
    return overrides


_ARITHMETIC = re.compile(r"\$\(\((.*?)\)\)")


def _arithmetic(line: str, variables: dict[str, str]) -> str:
    """Bash's ``$((expr))`` over integers and the script's variables (``$((1024 * 20))``, ``$((a + b))``); one
    it cannot evaluate is left as it is (an override using it is then unresolved)."""
    def evaluate(match: re.Match[str]) -> str:
        expr = re.sub(r"\$\{?([A-Za-z_]\w*)\}?|\b([A-Za-z_]\w*)\b",
                      lambda v: variables.get(v.group(1) or v.group(2), v.group(0)), match.group(1))
        if not re.fullmatch(r"[\d\s+\-*/%()]+", expr):
            return match.group(0)
        try:
            return str(_integer(ast.parse(expr.strip().replace("/", "//"), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError):
            return match.group(0)

    return _ARITHMETIC.sub(evaluate, line)


def _integer(node: ast.AST) -> int:
    """An integer expression of + - * // % and parentheses (nothing else is evaluated)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_integer(node.operand)
    operators = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.FloorDiv: int.__floordiv__,
                 ast.Mod: int.__mod__}
    if isinstance(node, ast.BinOp) and type(node.op) in operators:
        return operators[type(node.op)](_integer(node.left), _integer(node.right))
    raise ValueError("not an integer expression")


def _logical_lines(text: str) -> list[tuple[int, list[str]]]:
    """Shell lines joined at a trailing backslash: (first line number, the physical lines)."""
    lines: list[tuple[int, list[str]]] = []
    pending: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        pending.append(raw[:-1] if raw.endswith("\\") else raw)
        if not raw.endswith("\\"):
            lines.append((start, pending))
            pending = []
    if pending:
        lines.append((start, pending))
    return lines


def _expand(value: str, variables: dict[str, str]) -> str | None:
    """``$NAME``, ``${NAME}``, ``${NAME:-default}`` / ``${NAME:=default}`` with nested braces in the default
    (``${DIR:-${HOME}/verl}``, expanded too); None when a variable is set nowhere."""
    out, i, missing = [], 0, False
    while i < len(value):
        if value[i] != "$" or value.startswith("$((", i):
            out.append(value[i])
            i += 1
            continue
        bare = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)", value[i:])
        if bare:
            name = bare.group(1)
            missing = missing or name not in variables
            out.append(variables.get(name, ""))
            i += bare.end()
            continue
        if not value.startswith("${", i):
            out.append(value[i])
            i += 1
            continue
        depth, j = 0, i + 1
        while j < len(value):  # the matching brace
            depth += {"{": 1, "}": -1}.get(value[j], 0)
            if depth == 0:
                break
            j += 1
        inner = value[i + 2:j]
        parts = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(?::?[-=](.*))?$", inner, re.S)
        if parts is None or j == len(value):
            return None
        name, default = parts.group(1), parts.group(2)
        if variables.get(name):
            out.append(variables[name])
        elif default is not None:
            expanded_default = _expand(default, variables)
            if expanded_default is None:
                return None
            out.append(expanded_default)
        else:
            missing = missing or name not in variables
        i = j + 1
    expanded = "".join(out)
    if missing or "$((" in expanded:  # a variable set nowhere, or arithmetic that could not be evaluated
        return None
    return os.path.expanduser(expanded) if expanded.startswith("~") else expanded
