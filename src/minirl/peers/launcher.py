"""How a TRL run was launched, beside its ``GRPOConfig``: ``accelerate launch --config_file FILE`` (its processes, its
DeepSpeed or FSDP plugin and their CPU offload), a DeepSpeed JSON (that file's ``deepspeed_config_file``, or
``TrainingArguments.deepspeed``) and ``TrainingArguments.fsdp`` / ``fsdp_config``. ``minirl config from-trl FILE
--accelerate-config FILE``.

What carries over:

* ``num_processes`` scales TRL's per-device batch (the generation batch is ``per_device_train_batch_size x
  num_processes x steps_per_generation``), and more than one process becomes that many FSDP2 trainer ranks.
* Where the trainer computes: CUDA unless ``use_cpu`` (or ``distributed_type: MULTI_CPU``).
* CPU offload (DeepSpeed ZeRO's ``offload_optimizer`` / ``offload_param``, FSDP's ``offload_params``) is
  ``optim.cpu_offload``; FSDP's activation checkpointing is ``optim.gradient_checkpointing``.
* Under fp16, DeepSpeed scales the loss with its own dynamic scaler, whose defaults are not torch's
  ``GradScaler``'s: ``initial_scale_power`` 16, ``loss_scale_window`` 1000, ``hysteresis`` 2, ``min_loss_scale``
  1 (``optim.loss_scale_*``).
* transformers refuses a DeepSpeed value that disagrees with the ``TrainingArguments`` (anything but ``"auto"``
  must match); so does this translation, in one line naming both.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from minirl.config import ConfigError
from minirl.peers.common import Peer, Translation, flatten, leftovers, read_yaml

ACCELERATE_DEFAULTS: dict[str, Any] = {
    # accelerate's config file (``accelerate config``), as ``accelerate launch --config_file`` reads it
    "distributed_type": "NO", "num_processes": 1, "num_machines": 1, "mixed_precision": "no", "use_cpu": False,
    "deepspeed_config.zero_stage": None, "deepspeed_config.offload_optimizer_device": "none",
    "deepspeed_config.offload_param_device": "none", "deepspeed_config.deepspeed_config_file": None,
    "deepspeed_config.gradient_accumulation_steps": None, "deepspeed_config.gradient_clipping": None,
    "fsdp_config.fsdp_offload_params": False, "fsdp_config.fsdp_activation_checkpointing": False,
}

ACCELERATE_IGNORED = re.compile(
    r"^(compute_environment|debug|machine_rank|main_process_(ip|port)|main_training_function|rdzv_backend|"
    r"same_network|tpu_.*|downcast_bf16|enable_cpu_affinity|gpu_ids|dynamo_config\..*|"
    r"deepspeed_config\.(deepspeed_multinode_launcher|zero3_init_flag|zero3_save_16bit_model|deepspeed_hostfile|"
    r"deepspeed_exclusion_filter|deepspeed_inclusion_filter)|"
    r"fsdp_config\.(fsdp_auto_wrap_policy|fsdp_backward_prefetch.*|fsdp_cpu_ram_efficient_loading|fsdp_forward_prefetch|"
    r"fsdp_state_dict_type|fsdp_sync_module_states|fsdp_transformer_layer_cls_to_wrap|fsdp_use_orig_params|"
    r"fsdp_reshard_after_forward|fsdp_sharding_strategy|fsdp_version|fsdp_min_num_params))$")

DEEPSPEED_DEFAULTS: dict[str, Any] = {
    # a DeepSpeed JSON config; the fp16 scaler's defaults are DeepSpeed's (``deepspeed/runtime/constants.py``)
    "fp16.enabled": "auto", "fp16.loss_scale": 0, "fp16.initial_scale_power": 16, "fp16.loss_scale_window": 1000,
    "fp16.hysteresis": 2, "fp16.min_loss_scale": 1, "fp16.consecutive_hysteresis": False, "bf16.enabled": "auto",
    "zero_optimization.stage": 0, "zero_optimization.offload_optimizer.device": "none",
    "zero_optimization.offload_param.device": "none", "optimizer.type": None, "scheduler.type": None,
}

DEEPSPEED_IGNORED = re.compile(
    r"^(steps_per_print|wall_clock_breakdown|communication_data_type|zero_allow_untested_optimizer|prescale_gradients|"
    r"gradient_predivide_factor|fp16\.auto_cast|amp\..*|flops_profiler\..*|tensorboard\..*|wandb\..*|csv_monitor\..*|"
    r"comms_logger\..*|activation_checkpointing\..*|optimizer\.params\..*|scheduler\.params\..*|"
    r"zero_optimization\.(overlap_comm|contiguous_gradients|reduce_bucket_size|reduce_scatter|allgather_partitions|"
    r"allgather_bucket_size|round_robin_gradients|sub_group_size|stage3_.*|offload_(optimizer|param)\.(pin_memory|"
    r"buffer_count|buffer_size|max_in_cpu|fast_init|ratio|nvme_path)|zero_hpz_partition_size|zero_quantized_.*|"
    r"memory_efficient_linear|ignore_unused_parameters|load_from_fp32_weights|elastic_checkpoint|cpu_offload))$")

MATCHED_BY_TRANSFORMERS = (
    # (DeepSpeed key, TrainingArguments key): transformers fills "auto" from the right and refuses a disagreement
    ("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps"), ("gradient_clipping", "max_grad_norm"),
    ("optimizer.params.lr", "learning_rate"), ("optimizer.params.eps", "adam_epsilon"),
    ("optimizer.params.weight_decay", "weight_decay"),
)


def read_accelerate(path: str) -> dict[str, Any]:
    """An ``accelerate config`` YAML (or JSON), flattened; its ``deepspeed_config_file`` is read here too, as
    ``$deepspeed`` (accelerate resolves a relative path from where it is launched: here, the current directory)."""
    data = read_yaml(path)
    if not {"distributed_type", "compute_environment", "num_processes"} & set(data):
        raise ConfigError(f"{path}: not an accelerate config (no distributed_type, compute_environment or num_processes)")
    flat = flatten(data)
    ds_file = flat.get("deepspeed_config.deepspeed_config_file")
    if ds_file:
        flat["$deepspeed"] = read_deepspeed(ds_file, f"{path}: deepspeed_config.deepspeed_config_file")
    return flat


def read_deepspeed(spec: Any, where: str) -> dict[str, Any]:
    """A DeepSpeed config: a JSON file's path, or the mapping itself (``TrainingArguments.deepspeed`` takes both)."""
    if isinstance(spec, dict):
        return flatten(spec)
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        text = spec
    else:
        try:
            text = Path(str(spec)).expanduser().read_text(encoding="utf-8")
        except OSError as err:
            hint = " (or give deepspeed=null to translate without it)" if where == "deepspeed" else ""
            raise ConfigError(f"{where}={spec!r}: {err.strerror or err}{hint}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}={spec!r}: not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}={spec!r}: not a DeepSpeed config (expected a JSON object)")
    return flatten(data)


def launch_processes(trl: dict[str, Any], accelerate: dict[str, Any] | None) -> dict[str, Any]:
    """The TRL settings with the accelerate config's ``num_processes`` in them (what ``_trl_batch`` scales by); a
    TRL file that says another count is one line naming both."""
    if accelerate is None or "num_processes" not in accelerate:
        return trl
    count = accelerate["num_processes"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"accelerate config num_processes={count!r}: expected a positive integer")
    if "num_processes" in trl and trl["num_processes"] != count:
        raise ConfigError(f"num_processes={trl['num_processes']!r} in the TRL settings, {count} in the accelerate "
                          "config: give one")
    return {**trl, "num_processes": count}


def translate_launch(trl: Peer, accelerate: dict[str, Any] | None, out: Translation) -> None:
    """The launch's part of a TRL translation (module docstring); runs after the TRL keys (it reads
    ``optim.precision``). ``accelerate``: ``read_accelerate``'s settings, or None."""
    acc = Peer(dict(accelerate or {}), ACCELERATE_DEFAULTS)
    deepspeed = acc.given.pop("$deepspeed", None)
    if trl("deepspeed"):
        if deepspeed is not None:
            raise ConfigError("deepspeed: a DeepSpeed config in the TRL settings and one in the accelerate config: "
                              "give one")
        deepspeed = read_deepspeed(trl("deepspeed"), "deepspeed")
    processes = int(trl("num_processes"))
    if accelerate is not None:
        _where(acc, out)
    offloads: list[str] = []  # where the launch says the trainer's state goes to the CPU
    kind = str(acc("distributed_type")).upper()
    if trl("fsdp"):
        offloads += _fsdp_args(trl, out)
    if kind == "DEEPSPEED" or deepspeed is not None:
        offloads += _deepspeed(acc, Peer(deepspeed or {}, DEEPSPEED_DEFAULTS), trl, out)
    elif kind == "FSDP":
        if acc("fsdp_config.fsdp_offload_params"):
            offloads.append("accelerate config " + acc.show("fsdp_config.fsdp_offload_params"))
        if acc("fsdp_config.fsdp_activation_checkpointing"):
            out.set("optim.gradient_checkpointing", True, acc.show("fsdp_config.fsdp_activation_checkpointing"))
    if offloads:
        out.set("optim.cpu_offload", True, ", ".join(offloads))
    elif kind in ("DEEPSPEED", "FSDP") or deepspeed is not None or trl("fsdp"):
        out.set("optim.cpu_offload", False, f"no CPU offload in the {kind if kind != 'NO' else 'launch'} settings")
    if accelerate is not None and processes > 1:  # the launch is known (a TRL file's num_processes scales the batch only)
        out.set("cluster.trainer_ranks", processes, f"num_processes={processes}")
        replicas = {"MULTI_GPU": "DDP keeps a whole model on each GPU", "NO": "one process"}.get(kind, "")
        out.differs.append(f"num_processes={processes}: TRL runs {processes} processes, each sampling its share of the "
                           "batch; minirl runs that many FSDP2 trainer ranks (each a 1/W shard of the model and of each "
                           f"mini-batch{'; ' + replicas if replicas else ''}) and its engines beside them: the same "
                           "updates to float rounding; size cluster.* for your machine (docs/distributed.md)")
    if accelerate is not None and str(acc("mixed_precision")) not in ("no", _ACCELERATE_PRECISION[out.values["optim.precision"]]):
        out.differs.append(f"accelerate config mixed_precision={acc('mixed_precision')!r}: the TrainingArguments' bf16 / "
                           f"fp16 decide it (transformers passes them to accelerate): optim.precision "
                           f"{out.values['optim.precision']}")
    leftovers(acc, out, ACCELERATE_IGNORED, prefix="accelerate config ")


_ACCELERATE_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def _where(acc: Peer, out: Translation) -> None:
    """The device and the machines: CUDA unless the config says CPU."""
    cpu = bool(acc("use_cpu")) or str(acc("distributed_type")).upper() == "MULTI_CPU"
    out.set("cluster.device", "cpu" if cpu else "cuda",
            acc.show("use_cpu") if acc("use_cpu") else f"accelerate config distributed_type={acc('distributed_type')!r}")
    if int(acc("num_machines")) > 1:
        out.differs.append(f"accelerate config num_machines={acc('num_machines')}: minirl places ranks on several "
                           "machines through Ray (cluster.backend: ray, cluster.ray_address)")


def _fsdp_args(trl: Peer, out: Translation) -> list[str]:
    """``TrainingArguments.fsdp`` ("full_shard auto_wrap offload", or a list) and ``fsdp_config``: offload and
    activation checkpointing. Returns the offload's origin, if it offloads."""
    options = trl("fsdp")
    words = options.split() if isinstance(options, str) else [str(word) for word in options or []]
    config = trl.json_mapping("fsdp_config", " (TrainingArguments.fsdp_config)")
    if config.get("activation_checkpointing"):
        out.set("optim.gradient_checkpointing", True, "fsdp_config.activation_checkpointing=True")
    return [trl.show("fsdp")] if "offload" in words else []


def _deepspeed(acc: Peer, ds: Peer, trl: Peer, out: Translation) -> list[str]:
    """ZeRO's offload (returned: where it is said, if it offloads to the CPU), the fp16 scaler, and the values
    transformers matches against the ``TrainingArguments``."""
    for ds_key, trl_key in MATCHED_BY_TRANSFORMERS:
        value = ds(ds_key)
        if value in (None, "auto"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"DeepSpeed {ds_key}={value!r}: expected a number or \"auto\"")
        if float(value) != float(trl(trl_key)):
            raise ConfigError(f"DeepSpeed {ds_key}={value!r} but {trl_key}={trl(trl_key)!r} in the TRL settings: "
                              "transformers refuses the mismatch (set it to \"auto\")")
    _deepspeed_batch_and_betas(ds, trl)
    for block, precision in (("fp16", "fp16"), ("bf16", "bf16")):
        given = ds(f"{block}.enabled")
        if isinstance(given, bool) and given != (out.values["optim.precision"] == precision):
            raise ConfigError(f"DeepSpeed {block}.enabled={given} but the TRL settings train in "
                              f"{out.values['optim.precision']}: transformers refuses the mismatch (set it to \"auto\")")
    if out.values["optim.precision"] == "fp16":
        _deepspeed_loss_scale(ds, out)
    for key in ("optimizer.type", "scheduler.type"):
        if ds(key) is not None and str(ds(key)).lower() not in ("adamw", "adam"):
            out.not_translated.append(f"DeepSpeed {key}={ds(key)!r}: minirl trains with AdamW on the TRL settings' "
                                      "schedule (optim.lr_schedule)")
    stage = ds("zero_optimization.stage") if ds.set_by_user("zero_optimization.stage") else acc("deepspeed_config.zero_stage")
    devices = {"optimizer": ds("zero_optimization.offload_optimizer.device"), "param": ds("zero_optimization.offload_param.device")}
    said = {what: f"DeepSpeed zero_optimization.offload_{what}.device={device!r}" for what, device in devices.items()}
    for what in devices:
        if devices[what] in (None, "none"):
            devices[what] = acc(f"deepspeed_config.offload_{what}_device")
            said[what] = "accelerate config " + acc.show(f"deepspeed_config.offload_{what}_device")
    for what, device in devices.items():
        if str(device) == "nvme":
            out.not_translated.append(f"DeepSpeed offload_{what} to nvme: minirl offloads to CPU memory only")
    if str(devices["optimizer"]) == "cpu" and str(devices["param"]) != "cpu":
        out.differs.append("DeepSpeed offloads the optimizer only: minirl's optim.cpu_offload (FSDP2's "
                           "CPUOffloadPolicy) keeps the parameters and gradients in CPU memory too")
    if stage is not None and int(stage) < 3 and int(trl("num_processes")) > 1:
        out.differs.append(f"DeepSpeed ZeRO stage {stage} keeps a whole model on each GPU; minirl's FSDP2 ranks shard "
                           "the parameters too (ZeRO-3's layout)")
    leftovers(ds, out, DEEPSPEED_IGNORED, prefix="DeepSpeed ")
    return [said[what] for what, device in devices.items() if str(device) == "cpu"]


def _deepspeed_batch_and_betas(ds: Peer, trl: Peer) -> None:
    """``train_batch_size`` (micro-batch x accumulation x processes) and ``optimizer.params.betas``, which
    transformers also fills from the ``TrainingArguments`` when "auto" and matches otherwise."""
    given = ds("train_batch_size")
    whole = int(trl("per_device_train_batch_size")) * int(trl("gradient_accumulation_steps")) * int(trl("num_processes"))
    if given not in (None, "auto") and given != whole:
        raise ConfigError(f"DeepSpeed train_batch_size={given!r} but per_device_train_batch_size x "
                          f"gradient_accumulation_steps x num_processes = {whole}: transformers refuses the mismatch "
                          "(set it to \"auto\")")
    betas, ours = ds("optimizer.params.betas"), [trl("adam_beta1"), trl("adam_beta2")]
    if betas not in (None, "auto") and (not isinstance(betas, list) or [float(b) for b in betas] != ours):
        raise ConfigError(f"DeepSpeed optimizer.params.betas={betas!r} but adam_beta1, adam_beta2 = {ours} in the TRL "
                          "settings: transformers refuses the mismatch (set it to \"auto\")")


def _deepspeed_loss_scale(ds: Peer, out: Translation) -> None:
    """DeepSpeed's dynamic loss scaler, its defaults or the config's; a static ``loss_scale`` becomes the start."""
    origin = "DeepSpeed's fp16 loss scaler"
    out.set("optim.loss_scale_initial", 2.0 ** int(ds("fp16.initial_scale_power")), f"{origin}: 2^initial_scale_power "
            f"({ds.show('fp16.initial_scale_power')})")
    out.set("optim.loss_scale_window_updates", int(ds("fp16.loss_scale_window")), f"{origin}: {ds.show('fp16.loss_scale_window')}")
    out.set("optim.loss_scale_hysteresis", int(ds("fp16.hysteresis")), f"{origin}: {ds.show('fp16.hysteresis')}")
    out.set("optim.loss_scale_min", float(ds("fp16.min_loss_scale")), f"{origin}: {ds.show('fp16.min_loss_scale')}")
    if ds("fp16.consecutive_hysteresis"):
        out.not_translated.append("DeepSpeed fp16.consecutive_hysteresis=True: minirl restores the hysteresis only "
                                  "when the scale grows (DeepSpeed's default, Megatron-LM's)")
    static = float(ds("fp16.loss_scale"))
    if static > 0:
        out.set("optim.loss_scale_initial", static, f"{origin}: {ds.show('fp16.loss_scale')} (the start)")
        out.set("optim.loss_scale_min", min(static, float(ds("fp16.min_loss_scale"))), f"{origin}: at most the start")
        out.differs.append(f"DeepSpeed {ds.show('fp16.loss_scale')}: a static scale there; minirl's is dynamic from it")
