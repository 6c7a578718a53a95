"""``minirl config from-trl FILE --accelerate-config FILE``: how a TRL run was launched (accelerate's processes, its
DeepSpeed or FSDP plugin, a DeepSpeed JSON, ``TrainingArguments.fsdp``) carried over to the minirl run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from minirl.cli import main
from minirl.config import ConfigError
from minirl.peers import from_trl, read_accelerate

# open-r1's recipes/accelerate_configs/zero3.yaml, zero2.yaml and fsdp.yaml (num_processes as its launch line sets it)
ZERO3 = """\
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  deepspeed_multinode_launcher: standard
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

FSDP = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_activation_checkpointing: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_offload_params: true
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_use_orig_params: true
mixed_precision: bf16
num_machines: 1
num_processes: 4
use_cpu: false
"""

# transformers' documented ZeRO-2 template (docs: main_classes/deepspeed), with CPU optimizer offload
DS_ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2,
             "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}, "allgather_partitions": True,
                          "allgather_bucket_size": 2e8, "overlap_comm": True, "reduce_scatter": True,
                          "reduce_bucket_size": 2e8, "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}

TRL = {"per_device_train_batch_size": 4, "num_generations": 8, "gradient_accumulation_steps": 2}


def _accelerate(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    return read_accelerate(str(path))


def test_open_r1s_zero3_launch_scales_the_batch_to_its_processes_and_shards_the_trainer(tmp_path):
    alone, launched = from_trl(dict(TRL)), from_trl(dict(TRL), accelerate=_accelerate(tmp_path, ZERO3))
    assert alone.values["rollout.prompts_per_step"] == 1 and "cluster.trainer_ranks" not in alone.values
    v = launched.values
    assert v["rollout.prompts_per_step"] == 8 and "x num_processes=8" in launched.origin["rollout.prompts_per_step"]
    assert (v["cluster.trainer_ranks"], v["cluster.device"], v["optim.cpu_offload"]) == (8, "cuda", False)
    assert sum("TRL runs 8 processes" in line for line in launched.differs) == 1
    assert not any("ZeRO stage" in line or "mixed_precision" in line for line in launched.differs)
    assert not any(line.startswith("accelerate config") for line in launched.not_translated)
    assert {"accelerate config compute_environment", "accelerate config rdzv_backend"} <= set(launched.ignored)
    cfg = launched.config()
    assert (cfg.cluster.trainer_ranks, cfg.rollout.prompts_per_step) == (8, 8)


def test_fsdps_offload_and_activation_checkpointing_carry_over(tmp_path):
    out = from_trl({**TRL, "gradient_checkpointing": False}, accelerate=_accelerate(tmp_path, FSDP))
    v = out.values
    assert (v["optim.cpu_offload"], v["optim.gradient_checkpointing"], v["cluster.trainer_ranks"]) == (True, True, 4)
    args = from_trl({**TRL, "fsdp": "full_shard auto_wrap offload", "fsdp_config": {"activation_checkpointing": True},
                     "gradient_checkpointing": False})
    assert (args.values["optim.cpu_offload"], args.values["optim.gradient_checkpointing"]) == (True, True)
    assert "optim.cpu_offload" not in from_trl(dict(TRL)).values
    assert "cluster.trainer_ranks" not in from_trl({**TRL, "num_processes": 2}).values  # no launch given: the batch only


def test_a_deepspeed_json_offloads_and_scales_an_fp16_loss_as_deepspeed_does(tmp_path):
    """transformers' ZeRO-2 template with CPU optimizer offload under fp16: DeepSpeed's scaler (window 1000,
    hysteresis 2), not torch's GradScaler defaults; its "auto" values match the TrainingArguments."""
    path = tmp_path / "ds_zero2.json"
    path.write_text(json.dumps(DS_ZERO2))
    out = from_trl({**TRL, "fp16": True, "bf16": False, "num_processes": 2, "deepspeed": str(path)})
    o = out.config().optim
    assert (o.precision, o.loss_scale_initial, o.loss_scale_window_updates, o.loss_scale_hysteresis, o.loss_scale_min) == \
        ("fp16", 2.0**16, 1000, 2, 1.0)
    assert o.cpu_offload is True
    assert any("offloads the optimizer only" in line for line in out.differs)
    assert any("ZeRO stage 2 keeps a whole model on each GPU" in line for line in out.differs)
    assert "DeepSpeed zero_optimization.overlap_comm" in out.ignored
    assert not any(line.startswith("DeepSpeed") for line in out.not_translated)
    static = from_trl({**TRL, "fp16": True, "bf16": False,
                       "deepspeed": {"fp16": {"enabled": True, "loss_scale": 128, "initial_scale_power": 12}}}).config().optim
    assert (static.loss_scale_initial, static.loss_scale_min) == (128.0, 1.0)
    power = from_trl({**TRL, "fp16": True, "bf16": False, "deepspeed": {"fp16": {"initial_scale_power": 12}}})
    assert power.values["optim.loss_scale_initial"] == 4096.0
    bf16 = from_trl({**TRL, "deepspeed": json.dumps(DS_ZERO2)})  # GRPOConfig's bf16: DeepSpeed's fp16 block unused
    assert "optim.loss_scale_initial" not in bf16.values and bf16.values["optim.precision"] == "bf16"


@pytest.mark.parametrize("given, message", [
    ({"deepspeed": {"gradient_clipping": 0.5}},
     r"^DeepSpeed gradient_clipping=0.5 but max_grad_norm=1.0 in the TRL settings: transformers refuses the mismatch"),
    ({"deepspeed": {"fp16": {"enabled": True}}}, r"^DeepSpeed fp16.enabled=True but the TRL settings train in bf16"),
    ({"deepspeed": {"train_micro_batch_size_per_gpu": "four"}}, r"^DeepSpeed train_micro_batch_size_per_gpu='four': "),
    ({"deepspeed": {"train_batch_size": 16}}, r"^DeepSpeed train_batch_size=16 but .* = 8: transformers refuses"),
    ({"deepspeed": {"optimizer": {"params": {"betas": [0.9, 0.95]}}}}, r"^DeepSpeed optimizer.params.betas=\[0.9, 0.95\] but"),
    ({"deepspeed": "missing.json"}, r"^deepspeed='missing.json': No such file .* \(or give deepspeed=null to translate"),
    ({"deepspeed": "{not json"}, r"^deepspeed='\{not json': not valid JSON"),
    ({"num_processes": 2, "$accelerate": "num_processes: 8\n"}, r"^num_processes=2 in the TRL settings, 8 in the accelerate"),
    ({"$accelerate": "num_processes: two\n"}, r"^accelerate config num_processes='two': expected a positive integer"),
    ({"$accelerate": "learning_rate: 1.0\n"}, r"accelerate.yaml: not an accelerate config"),
])
def test_what_does_not_launch_is_one_line(tmp_path, given, message):
    given = {**TRL, **given}
    text = given.pop("$accelerate", None)
    with pytest.raises(ConfigError, match=message):
        from_trl(given, accelerate=_accelerate(tmp_path, text) if text else None)


def test_an_accelerate_key_minirl_does_not_know_is_named_and_a_deepspeed_file_it_names_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}))
    text = ZERO3.replace("zero_stage: 3\n", "zero_stage: 3\n  deepspeed_config_file: ds.json\n") + "megatron_lm_config: {}\n"
    out = from_trl(dict(TRL), accelerate=_accelerate(tmp_path, text.replace("num_machines: 1", "num_machines: 2")))
    assert "DeepSpeed offload_param to nvme: minirl offloads to CPU memory only" in out.not_translated
    assert any(line.startswith("accelerate config num_machines=2: ") for line in out.differs)
    cpu = from_trl(dict(TRL), accelerate=_accelerate(tmp_path, "distributed_type: MULTI_CPU\nnum_processes: 2\nfoo: 1\n"))
    assert cpu.values["cluster.device"] == "cpu" and "accelerate config foo=1: not a setting minirl knows how to carry over" \
        in cpu.not_translated
    fp16 = from_trl(dict(TRL), accelerate=_accelerate(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\n"
                                                                "mixed_precision: fp16\n"))
    assert any("mixed_precision='fp16': the TrainingArguments' bf16 / fp16 decide it" in line for line in fp16.differs)
    assert any("DDP keeps a whole model on each GPU" in line for line in fp16.differs)


def test_the_cli_reads_the_launch_beside_the_trl_file(tmp_path, monkeypatch, capsys):
    """``accelerate launch --config_file zero3.yaml grpo.py --config grpo.yaml``, typed as ``minirl config from-trl
    --config grpo.yaml --accelerate-config zero3.yaml``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(TRL))
    (tmp_path / "zero3.yaml").write_text(ZERO3)
    assert main(["config", "from-trl", "--config", "grpo.yaml", "--accelerate-config", "zero3.yaml", "-o", "m.yaml"]) == 0
    cfg = yaml.safe_load((tmp_path / "m.yaml").read_text())
    assert (cfg["cluster"]["trainer_ranks"], cfg["cluster"]["device"], cfg["rollout"]["prompts_per_step"]) == (8, "cuda", 8)
    assert main(["config", "from-trl", "grpo.yaml", "--accelerate-config=grpo.yaml"]) == 2
    assert "grpo.yaml: not an accelerate config" in capsys.readouterr().err
