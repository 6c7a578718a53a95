"""``minirl config from-trl`` / ``from-verl``: a TRL or verl run's settings as a minirl config.

The batch arithmetic and each carried-over loss are checked against the peers' own code: TRL 1.16's
``GRPOConfig.__post_init__`` / ``GRPOTrainer._compute_loss`` and verl 0.9's ``agg_loss``, written out
below as they compute, so "the same gradient" is a measured claim.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from minirl.algo import POLICY_LOSSES, LossInputs, group_advantages
from minirl.algo.variants.rejection import rejection_keep
from minirl.config import ConfigError, load_config
from minirl.peers import Translation, add_trl_sft, from_trl, from_verl, read_verl, script_overrides
from minirl.peers.common import Unresolved
from minirl.tasks import build_task_from_config


def _trl(**given):
    return from_trl(given)


def test_trl_defaults_are_trls_not_minirls():
    out = _trl()
    v = out.values
    # TRL 1.16: 8 completions per device step, 8 per group, one optimizer step per generation
    assert (v["rollout.prompts_per_step"], v["rollout.samples_per_prompt"], v["optim.minibatches_per_step"]) == (1, 8, 1)
    assert v["optim.micro_batch_sequences"] == 8 and v["rollout.max_new_tokens"] == 512 and v["optim.lr"] == 1e-6
    assert v["optim.precision"] == "bf16" and v["optim.gradient_checkpointing"] is True and v["run.seed"] == 42
    # loss_type='dapo' (TRL's default), no vLLM: PPO's gradient with a token mean, no IS correction
    assert (v["algo.name"], v["algo.aggregation"], v["algo.is_correction"], v["algo.tis_placement"]) == \
        ("minirl", "token_mean", False, "train_infer")
    assert v["algo.adv_std_normalize"] is True and (v["algo.eps_low"], v["algo.eps_high"]) == (0.2, 0.2)
    assert v["algo.adv_std_eps"] == 1e-4 and not any("1e-4" in line for line in out.differs)  # TRL's, exactly
    assert any(line.startswith("num_train_epochs=3.0") for line in out.not_translated)
    assert v["optim.lr_schedule"] == "linear"  # transformers' default decay
    assert (v["eval.temperature"], v["eval.top_p"]) == (1.0, 1.0)


def test_trl_evaluates_with_its_sampling_temperature():
    v = _trl(temperature=0.7, top_p=0.95, top_k=20, min_p=0.05).values  # Qwen3's recommended law, say
    assert (v["rollout.temperature"], v["eval.temperature"], v["rollout.top_p"], v["eval.top_p"]) == (0.7, 0.7, 0.95, 0.95)
    assert (v["rollout.top_k"], v["eval.top_k"], v["rollout.min_p"], v["eval.min_p"]) == (20, 20, 0.05, 0.05)
    v = _trl().values
    assert (v["rollout.top_k"], v["rollout.min_p"]) == (0, 0.0)  # TRL's 0 and None: off


def test_trl_generation_kwargs_override_the_law_and_name_the_rest():
    out = _trl(temperature=0.9, repetition_penalty=1.2,
               generation_kwargs={"top_k": 20, "temperature": 0.6, "repetition_penalty": 1.05, "typical_p": 0.9})
    v = out.values
    assert (v["rollout.temperature"], v["rollout.top_k"], v["eval.temperature"], v["eval.top_k"]) == (0.6, 20, 0.6, 20)
    assert (v["rollout.repetition_penalty"], v["eval.repetition_penalty"]) == (1.05, 1.05)
    assert [line for line in out.not_translated if line.startswith("generation_kwargs")] == [
        "generation_kwargs: typical_p=0.9 (minirl samples with temperature, min-p, top-k, top-p and a repetition "
        "penalty only)"]
    v = _trl(repetition_penalty=1.1).values
    assert (v["rollout.repetition_penalty"], v["eval.repetition_penalty"]) == (1.1, 1.1)
    assert _trl().values["rollout.repetition_penalty"] == 1.0
    assert _trl(generation_kwargs='{"min_p": 0.1}').values["rollout.min_p"] == 0.1  # TRL's JSON text form
    with pytest.raises(ConfigError, match="generation_kwargs='top_k': not a JSON object"):
        _trl(generation_kwargs="top_k")


def test_verl_prompt_length_refused_dropped_or_cut():
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    refused = from_verl(base)  # verl's defaults: 512 tokens, truncation 'error' -> a longer prompt stops the run
    v = refused.values
    assert v["task.max_prompt_tokens"] == 512 and "task.on_bad_row" not in v and "task.prompt_truncation" not in v
    assert any(line.startswith("data.truncation='error': minirl stops at a longer prompt") for line in refused.differs)
    v = from_verl(base | {"data.max_prompt_length": 1024, "data.filter_overlong_prompts": True}).values
    assert (v["task.max_prompt_tokens"], v["task.on_bad_row"]) == (1024, "skip")
    for side in ("left", "right", "middle"):
        cut = from_verl(base | {"data.truncation": side, "data.max_prompt_length": 256})
        assert (cut.values["task.max_prompt_tokens"], cut.values["task.prompt_truncation"]) == (256, side)
        assert not any("truncation" in line for line in cut.differs)
        assert not any("max_prompt_length" in key for key in cut.ignored)
    with pytest.raises(ConfigError, match=r"data\.truncation='both': must be error, left, right or middle"):
        from_verl(base | {"data.truncation": "both"})


def test_trl_dataset_config_and_splits_name_the_directorys(tmp_path: Path):
    """TRL loads load_dataset(dataset_name, name=dataset_config) and evaluates on dataset_test_split when it evaluates."""
    root = tmp_path / "gsm8k"
    root.mkdir()
    out = _trl(dataset_name=str(root), dataset_config="main", dataset_train_split="train_sft", eval_strategy="steps",
               eval_steps=10)
    v = out.values
    assert (v["task.path"], v["task.dataset_config"], v["task.train_split"], v["task.eval_split"]) == (
        str(root), "main", "train_sft", "test")
    assert not any("dataset_" in line for line in out.differs + out.not_translated)
    v = _trl(dataset_name=str(root)).values  # TRL's defaults: the train split, no evaluation
    assert "task.dataset_config" not in v and "task.train_split" not in v and "task.eval_split" not in v
    file = tmp_path / "train.jsonl"
    file.write_text("")
    out = _trl(dataset_name=str(file), eval_strategy="steps", eval_steps=10)  # one file: no test split in it
    assert "task.eval_split" not in out.values
    assert any(line.startswith("dataset_test_split='test': one data file has no other split") for line in out.differs)


def test_open_r1_script_arguments_and_reward_names():
    """open-r1's grpo.py: its registry's names with its script's arguments (their defaults where unset)."""
    out = _trl(reward_funcs=["accuracy", "repetition_penalty", "soft_overlong_punishment", "accuracy_reward"],
               repetition_n_grams=4, max_completion_len=2048, dataset_prompt_column="problem")
    v = out.values
    specs = [(f["function"].split(":")[1], f.get("kwargs")) for f in v["task.reward_functions"]]
    assert specs == [("accuracy_reward", None), ("repetition_penalty_reward", {"ngram_size": 4, "max_penalty": -1.0}),
                     ("soft_overlong_punishment_reward", {"max_completion_len": 2048, "soft_punish_cache": 4096}),
                     ("accuracy_reward", None)]
    assert v["task.reward_functions"][0]["function"].startswith("minirl.tasks.open_r1_rewards")
    assert v["task.reward_functions"][3]["function"].startswith("minirl.tasks.trl_rewards")  # TRL's own name
    assert (v["task.prompt_column"], v["task.chat_prompts"]) == ("problem", True) and "task.system_prompt" not in v
    assert not any("repetition_n_grams" in line or "dataset_prompt_column" in line for line in out.not_translated)
    plain = _trl(reward_funcs=["accuracy_reward"]).values  # a TRL config: text prompts stay text
    assert "task.chat_prompts" not in plain and "task.prompt_column" not in plain
    unknown = _trl(reward_funcs=["frobnicate"])
    assert any("nor open-r1's (accuracy, format, tag_count" in line for line in unknown.not_translated)


def test_trls_moe_load_balancing_loss_is_carried_over(tmp_path: Path):
    """TRL adds an MoE model's load-balancing loss, router_aux_loss_coef (its config's when unset): minirl's
    algo.router_aux_loss_coef, read off the local model's config; named when the model is not here to read."""
    moe, dense = tmp_path / "moe", tmp_path / "dense"
    moe.mkdir()
    dense.mkdir()
    (moe / "config.json").write_text(json.dumps({"output_router_logits": False, "router_aux_loss_coef": 0.001}))
    (dense / "config.json").write_text(json.dumps({"hidden_size": 8}))
    out = _trl(model_name_or_path=str(moe))
    assert out.values["algo.router_aux_loss_coef"] == 0.001 and out.objective.startswith("your TRL loss")
    assert "algo.router_aux_loss_coef" not in _trl(model_name_or_path=str(moe), router_aux_loss_coef=0.0).values
    assert "algo.router_aux_loss_coef" not in _trl(model_name_or_path=str(dense)).values
    assert _trl(router_aux_loss_coef=0.01).values["algo.router_aux_loss_coef"] == 0.01
    away = _trl(model_name_or_path="Qwen/Qwen3-30B-A3B")
    assert any(d.startswith("router_aux_loss_coef unset: on an MoE model TRL adds") for d in away.differs)
    assert not any("router_aux" in d for d in _trl().differs)


def test_trls_fused_lm_head_and_verls_fused_kernels_are_the_chunked_head(tmp_path: Path):
    """TRL's GRPOTrainer always scores through its fused LM head; verl with use_fused_kernels: the chunked head,
    except on a model that soft-caps its logits (minirl's chunked head refuses it; named)."""
    capped = tmp_path / "gemma"
    capped.mkdir()
    (capped / "config.json").write_text(json.dumps({"text_config": {"final_logit_softcapping": 30.0}}))
    assert _trl().values["optim.logprob_chunk_tokens"] == 1024
    out = _trl(model_name_or_path=str(capped))
    assert "optim.logprob_chunk_tokens" not in out.values
    assert any(d.startswith("the model's final_logit_softcapping: TRL's fused LM head") for d in out.differs)
    fused = from_verl({"actor_rollout_ref.model.use_fused_kernels": True, "actor_rollout_ref.rollout.n": 4})  # 8 GPUs
    assert fused.values["optim.logprob_chunk_tokens"] == 1024 and fused.values["cluster.trainer_ranks"] == 8
    assert fused.config().optim.logprob_chunk_tokens == 1024  # a valid config (it was refused with several ranks)
    plain = from_verl({})
    assert "optim.logprob_chunk_tokens" not in plain.values and not any("fused" in line for line in plain.ignored)


def test_an_async_grpo_config_is_one_step_off_with_its_difference_named():
    out = _trl(max_staleness=2, weight_sync_steps=1, token_budget=4096, queue_maxsize=64)
    assert (out.values["rollout.async_steps"], out.values["optim.micro_batch_max_tokens"]) == (1, 4096)
    assert any(d.startswith("AsyncGRPOTrainer streams samples up to max_staleness=2") for d in out.differs)
    assert not any("max_staleness" in line or "queue_maxsize" in line for line in out.not_translated)
    assert "rollout.async_steps" not in _trl().values  # GRPOTrainer's config: synchronous


def test_trl_max_prompt_length_cuts_from_the_left():
    v = _trl(max_prompt_length=64).values  # TRL before 0.24: prompt_ids[:, -max_prompt_length:]
    assert (v["task.max_prompt_tokens"], v["task.prompt_truncation"]) == (64, "left")
    assert "task.prompt_truncation" not in _trl().values and "task.max_prompt_tokens" not in _trl().values


def test_settings_trl_1_16_refuses_are_translated_and_each_said():
    """max_prompt_length (gone since TRL 0.24), warmup_ratio (gone from transformers 5), use_liger_loss (gone):
    TRL 1.16's `trl grpo` refuses each; an older config still translates, with a line naming the key."""
    out = _trl(max_prompt_length=64, warmup_ratio=0.1, use_liger_loss=True, max_steps=20)
    said = [line for line in out.differs if "not a TRL 1.16 setting" in line]
    assert [line.split(":")[0] for line in said] == ["max_prompt_length=64", "warmup_ratio=0.1", "use_liger_loss=True"]
    assert (out.values["task.max_prompt_tokens"], out.values["optim.warmup_updates"]) == (64, 2)
    assert not out.not_translated and not any("not a TRL 1.16" in line for line in _trl(max_steps=20).differs)


def test_verl_top_k_minus_one_is_off():
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    v = from_verl(base).values
    assert (v["rollout.top_k"], v["eval.top_k"]) == (0, 0)
    v = from_verl(base | {"actor_rollout_ref.rollout.top_k": 20, "actor_rollout_ref.rollout.val_kwargs.top_k": 5}).values
    assert (v["rollout.top_k"], v["eval.top_k"]) == (20, 5)
    assert (v["rollout.repetition_penalty"], v["eval.repetition_penalty"]) == (1.0, 1.0)
    v = from_verl(base | {"actor_rollout_ref.rollout.repetition_penalty": 1.1}).values  # its vLLM server's, both
    assert (v["rollout.repetition_penalty"], v["eval.repetition_penalty"]) == (1.1, 1.1)


def test_verl_remove_padding_is_padding_free():
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    out = from_verl(base)
    assert out.values["optim.padding_free"] is True  # verl's default (hf_model.yaml: use_remove_padding: True)
    off = from_verl(base | {"actor_rollout_ref.model.use_remove_padding": False})
    assert off.values["optim.padding_free"] is False
    assert not any("use_remove_padding" in line for line in off.ignored + off.not_translated)


def test_verls_actor_offload_is_the_cpu_offload():
    """verl's FSDP2 offload_policy is optim.cpu_offload; its between-phase param_offload / optimizer_offload become it
    too, said; the reference's offload (minirl's reference shares the actor's) stays ignored."""
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    assert from_verl(base).values["optim.cpu_offload"] is False
    policy = from_verl(base | {"actor_rollout_ref.actor.fsdp_config.offload_policy": True})
    assert policy.values["optim.cpu_offload"] is True and policy.config().optim.cpu_offload
    assert not any("offload" in line for line in policy.differs + policy.not_translated)
    phases = from_verl(base | {"actor_rollout_ref.actor.fsdp_config.param_offload": True,
                               "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
                               "actor_rollout_ref.ref.fsdp_config.param_offload": True})
    assert phases.values["optim.cpu_offload"] is True
    said = [line for line in phases.differs if "offload" in line]
    assert len(said) == 1 and "param_offload=True" in said[0] and "between its phases" in said[0]
    assert phases.ignored == ["actor_rollout_ref.ref.fsdp_config.param_offload"]
    assert not any("actor.fsdp_config" in line for line in phases.not_translated)
    # verl reads resume_from_path only under resume_mode=resume_path: otherwise it is nothing to say
    resumed = {"trainer.resume_from_path": "/ckpt/global_step_40"}
    assert not any("resume_from_path" in line for line in from_verl(base | resumed).not_translated)
    line, = [x for x in from_verl(base | resumed | {"trainer.resume_mode": "resume_path"}).not_translated
             if "resume_from_path" in x]
    assert "--start-from" in line
    # a Megatron actor's offloads are the same (verl's Megatron GSPO / DAPO examples)
    megatron = from_verl(base | {"actor_rollout_ref.actor.megatron.param_offload": True,
                                 "actor_rollout_ref.actor.megatron.grad_offload": True})
    assert megatron.values["optim.cpu_offload"] is True and not megatron.ignored
    assert any("megatron.grad_offload=True" in line and "between its phases" in line for line in megatron.differs)


def test_fp16_training_carries_over_from_trl_and_verl():
    """TRL's fp16=True and verl's actor mixed_precision.param_dtype are optim.precision (fp16 with its dynamic loss
    scale); an unknown dtype is one line naming the key."""
    trl = _trl(fp16=True)
    assert trl.values["optim.precision"] == "fp16" and trl.config().optim.precision == "fp16"
    assert not any("fp16" in line for line in trl.not_translated)
    assert _trl().values["optim.precision"] == "bf16"
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    assert from_verl(base).values["optim.precision"] == "bf16"
    key = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
    verl16 = from_verl(base | {key: "fp16"}).config().optim
    assert (verl16.precision, verl16.loss_scale_initial, verl16.loss_scale_window_updates) == ("fp16", 2.0**16, 400)
    assert "optim.loss_scale_window_updates" not in from_verl(base).values
    assert from_verl(base | {key: "float32"}).values["optim.precision"] == "fp32"
    assert from_verl(base | {"actor_rollout_ref.actor.fsdp_config.mixed_precision": {"param_dtype": "bfloat16"}}
                     ).values["optim.precision"] == "bf16"
    with pytest.raises(ConfigError, match=r"mixed_precision\.param_dtype='int8': not a dtype verl knows"):
        from_verl(base | {key: "int8"})
    # verl's model_dtype=bfloat16 (GPT-OSS's example) stores the weights in bf16: no fp32 master copy, said
    pure = from_verl(base | {"actor_rollout_ref.actor.fsdp_config.model_dtype": "bfloat16"})
    assert any("model_dtype" in line and "no fp32 master copy" in line for line in pure.differs)
    assert "actor_rollout_ref.actor.fsdp_config.model_dtype" not in " ".join(pure.ignored)
    assert not any("model_dtype" in line for line in from_verl(base | {
        "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32"}).differs)


def test_verls_prefix_grouper_is_the_shared_prompt():
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    assert "optim.shared_prompt" not in from_verl(base).values
    grouped = from_verl(base | {"actor_rollout_ref.actor.use_prefix_grouper": True,
                                "actor_rollout_ref.model.use_remove_padding": False})  # verl needs it off
    assert grouped.values["optim.shared_prompt"] is True and grouped.config().optim.shared_prompt
    assert not any("prefix_grouper" in line for line in grouped.ignored + grouped.not_translated)


def test_verls_one_step_off_trainer_is_one_step_async_with_its_bypass(tmp_path: Path):
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.experimental.one_step_off_policy.main_ppo \\\n  algorithm.adv_estimator=grpo \\\n"
                      "  actor_rollout_ref.rollout.n=4 rollout.nnodes=1 rollout.n_gpus_per_node=2\n")
    out = from_verl(read_verl([str(script)], []))
    assert out.values["rollout.async_steps"] == 1
    assert out.values["algo.logp_old_source"] == "rollout"  # its config's bypass_mode: True
    assert not any("rollout.n" in line for line in out.not_translated)
    kept = from_verl(read_verl([str(script)], ["algorithm.rollout_correction.bypass_mode=false"]))
    assert kept.values["rollout.async_steps"] == 1 and "algo.logp_old_source" not in kept.values
    plain = from_verl({"algorithm.adv_estimator": "grpo", "-m": "verl.trainer.main_ppo"})
    assert "rollout.async_steps" not in plain.values and "algo.logp_old_source" not in plain.values


FULLY_ASYNC = """python -m verl.experimental.fully_async_policy.fully_async_main \\
    data.train_batch_size=0 data.gen_batch_size=1 actor_rollout_ref.rollout.n=16 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.hybrid_engine=False \\
    trainer.nnodes=1 trainer.n_gpus_per_node=4 rollout.nnodes=1 rollout.n_gpus_per_node=4 \\
    rollout.total_rollout_steps=$((512*400)) rollout.test_freq=20 \\
    async_training.staleness_threshold=${STALENESS:-0.5} async_training.trigger_parameter_sync_step=4 \\
    async_training.require_batches=4 async_training.partial_rollout=True
"""


def test_verls_fully_async_trainer_is_the_nearest_minirl_run(tmp_path: Path, monkeypatch):
    """verl's fully_async_policy (its 7B recipe's settings, docs/advance/fully_async.md): a global step is what its
    trainer trains between two parameter syncs (trigger_parameter_sync_step x require_batches mini-batches of
    ppo_mini_batch_size prompts), its run rollout.total_rollout_steps prompts long, validated every rollout.test_freq
    syncs; its old log-probs are the rollout's (use_rollout_log_probs: the bypass); staleness_threshold > 0 samples
    beside the update (one step off, said how it differs), 0 on the same weights (the stream off-policy pipeline);
    its partial rollouts are minirl's beside the update, over a pool of (1 + staleness_threshold) x the step's prompts
    (none at staleness 0, where verl's have no effect)."""
    script = tmp_path / "fully_async.sh"
    script.write_text(FULLY_ASYNC)
    out = from_verl(read_verl([str(script)], []))
    v = out.values
    assert (v["rollout.prompts_per_step"], v["optim.minibatches_per_step"], v["rollout.samples_per_prompt"]) == (512, 16, 16)
    assert v["optim.global_steps"] == 400 and v["eval.every_steps"] == 20
    assert v["rollout.async_steps"] == 1 and v["algo.logp_old_source"] == "rollout"
    assert any("at most 33% of a step's samples" in line for line in out.differs)
    assert any("as they finish" in line for line in out.differs)
    assert any(line.startswith("verl samples on 4 GPUs of its own beside the trainer's 4;") for line in out.differs)
    assert not any("partial_rollout" in line for line in out.not_translated)
    r = out.config().rollout
    assert (r.async_steps, r.partial_rollout, r.partial_pool_prompts) == (1, True, 768)  # 1.5 x 512
    assert any(line.startswith("async_training.partial_rollout=True: verl interrupts") for line in out.differs)
    monkeypatch.setenv("STALENESS", "0")  # its stream off-policy pipeline: every sample on the same weights
    synced = from_verl(read_verl([str(script)], ["async_training.compute_prox_log_prob=True"]))
    assert "rollout.async_steps" not in synced.values and synced.values["optim.minibatches_per_step"] == 16
    assert "algo.logp_old_source" not in synced.values  # compute_prox_log_prob: the trainer's pi_old
    assert not any("partial_rollout" in line for line in synced.not_translated)  # no effect at staleness 0
    assert "rollout.partial_rollout" not in synced.values
    defaults = from_verl({"-m": "verl.experimental.fully_async_policy.fully_async_main", "actor_rollout_ref.rollout.n": 4})
    v = defaults.values  # fully_async_ppo_trainer.yaml: trigger 4, require 1, staleness 0.1, 100 prompts in all
    assert (v["rollout.prompts_per_step"], v["optim.minibatches_per_step"], v["optim.global_steps"]) == (4 * 256, 4, 1)
    assert v["rollout.async_steps"] == 1 and v["eval.every_steps"] == 1


@pytest.mark.parametrize("given, expected", [
    # P = per_device x steps_per_generation / G; N = steps_per_generation / gradient_accumulation_steps
    ({"per_device_train_batch_size": 16, "gradient_accumulation_steps": 2, "steps_per_generation": 4}, (8, 2, 16)),
    ({"per_device_train_batch_size": 16, "generation_batch_size": 64}, (8, 4, 16)),
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4}, (2, 1, 4)),
])
def test_trl_batch_arithmetic(given, expected):
    v = _trl(**given).values
    assert (v["rollout.prompts_per_step"], v["optim.minibatches_per_step"], v["optim.micro_batch_sequences"]) == expected


def test_trl_num_processes_scales_the_batch_as_open_r1_recipes_write_it(tmp_path: Path):
    given = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 16, "num_generations": 7,
             "num_processes": 7, "loss_type": "dr_grpo", "max_completion_length": 1024}
    v = _trl(**given).values
    assert (v["rollout.prompts_per_step"], v["optim.minibatches_per_step"], v["optim.micro_batch_sequences"]) == (256, 1, 16)
    assert v["algo.normalizer"] == 16 * 16 * 7 * 1024  # DDP averages the 7 processes' losses
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"prompt": "p", "answer": "a"}\n' * 1000)
    v = _trl(**given, dataset_name=str(rows), num_train_epochs=2, warmup_ratio=0.1).values
    assert v["optim.global_steps"] == 2 * 1000 // 256 and v["optim.warmup_updates"] == round(0.1 * 7)


def test_a_hub_id_gets_the_download_hint_a_missing_path_does_not():
    differs = "\n".join(_trl(model_name_or_path="Qwen/Qwen2.5-1.5B-Instruct", dataset_name="data/train.parquet").differs)
    assert "`hf download Qwen/Qwen2.5-1.5B-Instruct --local-dir DIR`" in differs
    assert "dataset_name='data/train.parquet' is not on this machine" in differs and "repo-type" not in differs


def test_trl_num_iterations_and_verl_ppo_epochs_are_passes_over_each_rollout():
    v = _trl(steps_per_generation=4, gradient_accumulation_steps=2, num_iterations=2, max_steps=400, save_steps=100).values
    assert (v["optim.minibatches_per_step"], v["optim.epochs_per_step"], v["optim.global_steps"]) == (2, 2, 100)
    assert v["checkpoint.every_steps"] == 25  # TRL counts optimizer steps: N x E per rollout
    v = from_verl({"algorithm.adv_estimator": "grpo", "data.train_batch_size": 8, "trainer.total_training_steps": 10,
                   "actor_rollout_ref.actor.ppo_mini_batch_size": 4, "actor_rollout_ref.actor.ppo_epochs": 3,
                   "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.1}).values
    assert (v["optim.minibatches_per_step"], v["optim.epochs_per_step"], v["optim.warmup_updates"]) == (2, 3, 6)


def test_a_trl_sft_config_becomes_the_cold_start(tmp_path: Path):
    rows = tmp_path / "sft.jsonl"
    rows.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n' * 100)
    out = _trl(model_name_or_path=str(tmp_path))
    add_trl_sft(out, {"dataset_name": str(rows), "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4,
                      "num_train_epochs": 2, "warmup_ratio": 0.1, "packing": True, "packing_strategy": "wrapped",
                      "assistant_only_loss": True, "lr_scheduler_type": "constant", "model_name_or_path": "other/m"})
    v = out.values
    assert (v["cold_start.enabled"], v["cold_start.data"], v["cold_start.batch_sequences"]) == (True, str(rows), 16)
    assert (v["cold_start.steps"], v["cold_start.warmup_steps"], v["cold_start.lr"]) == (13, 1, 2e-5)  # ceil(2 x 100 / 16)
    assert v["cold_start.checkpoint_every_steps"] == 500  # TRL's save_steps: the state a stopped SFT continues from
    assert (v["cold_start.max_length"], v["cold_start.packing"], v["cold_start.loss_on"]) == (1024, True, "completion")
    assert any("SFT model_name_or_path='other/m'" in line for line in out.differs)
    assert not any("packing_strategy" in line or "SFT lr_scheduler" in line for line in out.differs)
    out.config()
    trl_default = _trl()
    add_trl_sft(trl_default, {"dataset_name": str(rows), "completion_only_loss": False, "dataset_text_field": "content",
                              "chat_template_path": "templates/chatml.jinja"})
    assert trl_default.values["cold_start.loss_on"] == "all"
    assert "optim.padding_free" not in trl_default.values  # TRL's SFT default; its GRPO has no such option
    padding_free = _trl()
    add_trl_sft(padding_free, {"dataset_name": str(rows), "padding_free": True})
    assert padding_free.values["optim.padding_free"] is True
    assert not any("padding_free" in line for line in padding_free.not_translated + padding_free.ignored)
    assert trl_default.values["task.chat_template"] == "templates/chatml.jinja"  # SFT and RL render alike
    assert any("dataset_text_field='content'" in line for line in trl_default.not_translated)


VERL_SFT = """set -x
nproc_per_node=$1
save_path=$2
torchrun --standalone --nnodes=1 --nproc_per_node=$nproc_per_node \\
     -m verl.trainer.fsdp_sft_trainer \\
    data.train_files=$DATA/train.parquet \\
    data.val_files=$DATA/test.parquet \\
    data.prompt_key=extra_info \\
    data.response_key=extra_info \\
    optim.lr=1e-4 \\
    data.prompt_dict_keys=['question'] \\
    +data.response_dict_keys=['answer'] \\
    data.micro_batch_size_per_gpu=4 \\
    data.train_batch_size=32 \\
    model.partial_pretrain=Qwen/Qwen2.5-0.5B-Instruct \\
    trainer.default_local_dir=$save_path \\
    trainer.project_name=gsm8k-sft \\
    trainer.total_epochs=2 \\
    trainer.logger=['console'] \\
    ulysses_sequence_parallel_size=2 \\
    use_remove_padding=true $@
"""


def test_a_verl_sft_run_becomes_the_cold_start(tmp_path: Path, monkeypatch):
    """verl's gsm8k SFT example (its data.prompt_key / prompt_dict_keys layout) as the cold start of a verl RL run:
    the dotted columns, verl's chat layout, the batch, rate, length, epochs over the rows (whole batches: verl drops
    the last) and its warm-up share (floored, as verl's int()); what differs and what has no form are said. The
    translated columns read the parquet's rows into verl's examples."""
    import datasets

    from minirl.peers import add_verl_sft
    from minirl.sft_data import read_sft_examples

    rows = [{"data_source": "gsm8k", "extra_info": {"question": f"{n}+1?", "answer": str(n + 1)}} for n in range(100)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    script = tmp_path / "run_sft.sh"
    script.write_text(VERL_SFT)
    monkeypatch.setenv("DATA", str(tmp_path))
    out = from_verl({"data.train_files": str(tmp_path / "train.parquet"), "actor_rollout_ref.model.path": str(tmp_path),
                     "actor_rollout_ref.rollout.n": 4})
    add_verl_sft(out, read_verl([str(script)], []))
    v = out.values
    assert (v["cold_start.enabled"], v["cold_start.data"], v["cold_start.chat_prompts"]) == (True, str(tmp_path / "train.parquet"), True)
    assert (v["cold_start.prompt_column"], v["cold_start.completion_column"]) == ("extra_info.question", "extra_info.answer")
    assert (v["cold_start.batch_sequences"], v["cold_start.lr"], v["cold_start.max_length"]) == (32, 1e-4, 1024)
    assert (v["cold_start.steps"], v["cold_start.warmup_steps"], v["optim.padding_free"]) == (6, 0, True)  # 2 x (100 // 32)
    assert "cold_start.checkpoint_every_steps" not in v  # the script saves no SFT checkpoints
    out2 = from_verl({"data.train_files": str(tmp_path / "train.parquet"), "actor_rollout_ref.rollout.n": 4})
    add_verl_sft(out2, read_verl([str(script)], ["trainer.save_freq=50"]))
    assert out2.values["cold_start.checkpoint_every_steps"] == 50
    assert any(line.startswith("SFT model.partial_pretrain='Qwen/Qwen2.5-0.5B-Instruct'") for line in out.differs)
    assert any(line.startswith("SFT data.truncation='error'") for line in out.differs)
    assert any(line.startswith("SFT optim.lr_scheduler='cosine'") for line in out.differs)
    assert not any(line.startswith("SFT ") for line in out.not_translated)  # the rest: memory, parallelism, files
    cfg = out.config()
    c = cfg.cold_start
    examples = read_sft_examples(c.data, _chat_tokenizer(), columns=(c.prompt_column, c.completion_column),
                                 chat_prompts=c.chat_prompts)
    assert len(examples) == 100 and sum(examples[0].loss_mask) == 2  # "1" and EOS: verl's response + eos_token
    explicit = from_verl({"actor_rollout_ref.rollout.n": 4})
    add_verl_sft(explicit, {"-m": "verl.trainer.fsdp_sft_trainer", "trainer.total_training_steps": 50,
                            "data.multiturn.enable": True, "data.multiturn.messages_key": "conversation",
                            "model.lora_rank": 32, "data.train_files": str(tmp_path / "train.parquet")})
    w = explicit.values
    assert (w["cold_start.steps"], w["cold_start.warmup_steps"]) == (50, 5) and "cold_start.prompt_column" not in w
    assert {line.split(":")[0] for line in explicit.not_translated} >= {"SFT data.multiturn.messages_key='conversation'",
                                                                         "SFT model.lora_rank=32"}
    with pytest.raises(ConfigError, match=r"^--sft: the script runs verl.trainer.main_ppo, not one of verl's SFT trainers"):
        add_verl_sft(explicit, {"-m": "verl.trainer.main_ppo"})


def test_verls_engine_sft_trainer_becomes_the_cold_start(tmp_path: Path):
    """verl's ``sft_trainer`` (``sft_trainer_engine.yaml``): chat rows with tools as they are, its template variables,
    its warm-up ratio of whole batches (or its warm-up steps), its constant schedule; a thinking-switch column minirl
    does not read is said."""
    from minirl.peers import add_verl_sft

    rows = tmp_path / "chats.jsonl"
    rows.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n' * 40)
    out = from_verl({"actor_rollout_ref.rollout.n": 4})
    add_verl_sft(out, {"-m": "verl.trainer.sft_trainer", "data.train_files": str(rows), "data.train_batch_size": 16,
                       "optim.lr": 2e-5, "optim.lr_warmup_steps_ratio": 0.2, "trainer.total_epochs": 3,
                       "data.apply_chat_template_kwargs.enable_thinking": False, "model.use_remove_padding": True,
                       "engine.strategy": "fsdp2", "data.use_dynamic_bsz": True})
    v = out.values
    assert (v["cold_start.data"], v["cold_start.batch_sequences"], v["cold_start.lr"]) == (str(rows), 16, 2e-5)
    assert (v["cold_start.steps"], v["cold_start.warmup_steps"]) == (6, 1)  # 3 x (40 // 16); int(0.2 x 6)
    assert v["task.chat_template_kwargs"] == {"enable_thinking": False} and v["optim.padding_free"] is True
    assert "cold_start.prompt_column" not in v and "cold_start.chat_prompts" not in v
    assert not any("lr_scheduler_type" in line for line in out.differs)  # verl's engine default: constant
    assert not any(line.startswith("SFT ") for line in out.not_translated)
    out.config()
    steps = from_verl({"actor_rollout_ref.rollout.n": 4})
    add_verl_sft(steps, {"-m": "verl.trainer.sft_trainer", "data.train_files": str(rows), "optim.lr_warmup_steps": 7,
                         "trainer.total_training_steps": 30, "data.enable_thinking_key": "think",
                         "optim.lr_scheduler_type": "cosine"})
    assert (steps.values["cold_start.steps"], steps.values["cold_start.warmup_steps"]) == (30, 7)
    assert any(line.startswith("SFT data.enable_thinking_key='think'") for line in steps.not_translated)
    assert not any("enable_thinking" in line for line in out.not_translated)  # the default column: read
    assert any(line.startswith("SFT optim.lr_scheduler_type='cosine'") for line in steps.differs)
    yaml_only = from_verl({"actor_rollout_ref.rollout.n": 4})  # a YAML: no module, the engine trainer's keys
    add_verl_sft(yaml_only, {"data.train_files": str(rows), "data.messages_key": "messages", "trainer.total_training_steps": 3})
    assert "cold_start.prompt_column" not in yaml_only.values and yaml_only.values["cold_start.steps"] == 3
    more = tmp_path / "more.jsonl"  # a list of train files: their rows one after another
    more.write_text('{"messages": [{"role": "user", "content": "p"}, {"role": "assistant", "content": "b"}]}\n' * 24)
    listed = from_verl({"actor_rollout_ref.rollout.n": 4})
    add_verl_sft(listed, {"-m": "verl.trainer.sft_trainer", "data.train_files": [str(rows), str(more)],
                          "data.train_batch_size": 16, "trainer.total_epochs": 2})
    assert listed.values["cold_start.data"] == [str(rows), str(more)] and listed.values["cold_start.steps"] == 8  # 2 x 64 // 16
    assert not any("train_files" in line for line in listed.not_translated)
    from minirl.sft_data import read_sft_examples

    examples = read_sft_examples([str(rows), str(more)], _chat_tokenizer())
    assert len(examples) == 64 and examples[0].input_ids != examples[-1].input_ids
    listed.config()


def _chat_tokenizer():
    from minirl.models import load_model_and_tokenizer

    _, tokenizer = load_model_and_tokenizer("qwen3-moe-tiny")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}={% endfor %}"
    return tokenizer


def test_a_trl_sft_dataset_directory_with_config_and_split(tmp_path: Path):
    """TRL SFT's load_dataset(dataset_name, name=dataset_config)[dataset_train_split]: the cold start reads the same
    rows, and the epochs count that split's rows."""
    import datasets

    from minirl.sft_data import read_sft_examples
    from tests.unit.test_tasks_data import _repository

    root = _repository(tmp_path)  # configs main / socratic; socratic's test split has 2 rows
    out = _trl()
    add_trl_sft(out, {"dataset_name": str(root), "dataset_config": "socratic", "dataset_train_split": "test",
                      "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "num_train_epochs": 3})
    v = out.values
    assert (v["cold_start.data"], v["cold_start.dataset_config"], v["cold_start.split"]) == (str(root), "socratic", "test")
    assert v["cold_start.steps"] == 6  # 3 epochs x 2 rows / 1
    cfg = out.config()
    rows = datasets.load_dataset(str(root), "socratic", split="test")
    assert [r["prompt"] for r in rows] == ["socratic-test 0", "socratic-test 1"]

    class Tokenizer:  # one id per character
        eos_token_id, bos_token, chat_template = 0, None, None

        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text]

    examples = read_sft_examples(root, Tokenizer(), columns=("prompt", "answer"), split=cfg.cold_start.split,
                                 config=cfg.cold_start.dataset_config)
    assert [len(e.input_ids) for e in examples] == [len("socratic-test 0") + 2] * 2  # the answer "0" / "1" and EOS


def test_trl_batch_that_splits_a_group_or_an_optimizer_step_is_one_line():
    with pytest.raises(ConfigError, match=r"per_device_train_batch_size=6, num_processes=1, num_generations=8.*whole groups"):
        _trl(per_device_train_batch_size=6)
    with pytest.raises(ConfigError, match="steps_per_generation=3, gradient_accumulation_steps=2"):
        _trl(steps_per_generation=3, gradient_accumulation_steps=2)
    v = _trl(learning_rate="1e-6", max_steps="10", warmup_ratio="1e-1").values  # YAML reads `1e-6` as text
    assert (v["optim.lr"], v["optim.global_steps"], v["optim.warmup_updates"]) == (1e-6, 10, 1)
    with pytest.raises(ConfigError, match=r"^setting per_device_train_batch_size='eight': expected a number$"):
        _trl(per_device_train_batch_size="eight")
    with pytest.raises(ConfigError, match=r"^setting data.train_batch_size=True: expected a number$"):
        from_verl({"data.train_batch_size": True})


def test_trl_steps_warmup_checkpoints_and_logging_count_global_steps():
    v = _trl(steps_per_generation=4, gradient_accumulation_steps=2, max_steps=500, warmup_ratio=0.1, save_steps=100,
             eval_strategy="steps", eval_steps=20, log_completions=True, logging_steps=5, save_total_limit=3,
             report_to=["tensorboard", "wandb"], output_dir="out/runs/q3").values
    assert v["optim.global_steps"] == 250 and v["optim.warmup_updates"] == 50
    assert (v["checkpoint.every_steps"], v["checkpoint.keep_last"], v["eval.every_steps"]) == (50, 3, 10)
    assert v["log.completions_every_steps"] == 3 and v["log.tensorboard"] and v["log.wandb"]
    assert (v["run.output_dir"], v["run.name"]) == ("out/runs", "q3")
    assert v["run.overwrite"] is True  # TRL trains again over an earlier run in output_dir; resuming is asked for
    assert "run.overwrite" not in _trl(resume_from_checkpoint=True).values
    assert "run.overwrite" not in _trl(resume_from_checkpoint="out/runs/q3/checkpoint-500").values  # meant to resume


@pytest.mark.parametrize("loss_type, level, name", [("grpo", "token", "grpo"), ("grpo", "sequence", "gspo"),
                                                    ("dr_grpo", "token", "minirl"), ("dapo", "token", "minirl")])
def test_trl_losses_minirl_has(loss_type, level, name):
    out = _trl(loss_type=loss_type, importance_sampling_level=level, epsilon=0.1, epsilon_high=0.3)
    assert out.values["algo.name"] == name and (out.values["algo.eps_low"], out.values["algo.eps_high"]) == (0.1, 0.3)
    assert out.objective.startswith("your TRL loss")


@pytest.mark.parametrize("given", [{"loss_type": "vespo", "off_policy_mask_threshold": 0.5},
                                   {"loss_type": "cispo", "importance_sampling_level": "sequence"},
                                   {"scale_rewards": "median"},
                                   {"use_vllm": True, "importance_sampling_level": "sequence", "loss_type": "grpo"}])
def test_trl_losses_minirl_lacks_leave_minirl_and_say_so(given):
    out = _trl(**given)
    assert not [key for key in out.values if key.startswith("algo.")]
    assert out.objective.startswith("minirl's MiniRL") and any("trains with MiniRL instead" in line for line in out.not_translated)
    assert not any("1e-4" in line for line in out.differs)  # the dropped loss's differences are not listed


def test_trl_sync_ref_model_is_the_reference_sync():
    v = _trl(beta=0.04, sync_ref_model=True, ref_model_sync_steps=64, ref_model_mixup_alpha=0.9).values
    assert (v["algo.kl_coef"], v["algo.ref_sync_every_updates"], v["algo.ref_sync_alpha"]) == (0.04, 64, 0.9)
    v = _trl(beta=0.04, sync_ref_model=True).values  # TRL's defaults: every 512 optimizer steps, alpha 0.6
    assert (v["algo.ref_sync_every_updates"], v["algo.ref_sync_alpha"]) == (512, 0.6)
    _trl(beta=0.04, sync_ref_model=True).config()
    with pytest.raises(ConfigError, match=r"sync_ref_model=True, beta=0.0: there is no reference model to sync"):
        _trl(sync_ref_model=True)


def test_keep_objective_translates_the_setup_only():
    out = from_trl({"loss_type": "grpo", "learning_rate": 3e-6}, keep_objective=True)
    assert out.values["optim.lr"] == 3e-6 and not [key for key in out.values if key.startswith("algo.")]
    assert "--keep-objective" in out.objective


def test_dapo_over_several_optimizer_steps_says_how_it_differs():
    assert not any("mean tokens per step" in line for line in _trl().differs)  # N = 1: the same gradient
    assert any("mean tokens per step" in line for line in _trl(steps_per_generation=2).differs)


def test_trl_vllm_token_truncate_is_minirls_train_infer_correction():
    v = _trl(use_vllm=True, vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=5.0).values
    assert (v["algo.is_correction"], v["algo.tis_cap"], v["algo.tis_placement"]) == (True, 5.0, "train_infer")
    assert (v["algo.tis_mode"], v["algo.tis_level"], v["algo.tis_floor"]) == ("truncate", "token", 0.0)
    assert v["cluster.engine_backend"] == "vllm"


def test_trl_scale_rewards_batch_and_verl_rloo_are_their_advantages():
    v = _trl(scale_rewards="batch").values
    assert (v["algo.adv_std_normalize"], v["algo.adv_std_scope"]) == (True, "batch")
    v = from_verl({"algorithm.adv_estimator": "rloo", "actor_rollout_ref.rollout.n": 4}).values
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"]) == ("leave_one_out", False)
    v = from_verl({"algorithm.adv_estimator": "reinforce_plus_plus_baseline", "actor_rollout_ref.rollout.n": 4}).values
    assert (v["algo.adv_whiten"], v["algo.adv_std_normalize"]) == (True, False) and "algo.adv_baseline" not in v
    # verl's compute_rloo_outcome_advantage, as verl writes it, on one group of 4
    scores, n = torch.tensor([1.0, 0.0, 0.0, 1.0]), 4
    verl = scores * n / (n - 1) - scores.mean() * n / (n - 1)
    ours = group_advantages(scores[None], std_normalize=False, baseline="leave_one_out")[0]
    torch.testing.assert_close(ours, verl, rtol=0, atol=1e-7)
    # TRL's group scaling on a group of nearly equal rewards, where its eps (1e-4) is what the std is not
    algo = _trl().config().algo
    rewards = torch.tensor([[1.0, 1.0002, 1.0, 1.0001]], dtype=torch.float64)
    trl = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    ours = group_advantages(rewards, std_normalize=algo.adv_std_normalize, std_eps=algo.adv_std_eps)
    torch.testing.assert_close(ours, trl, rtol=1e-12, atol=0)
    assert not torch.allclose(group_advantages(rewards, std_normalize=True), trl, rtol=1e-2)  # 1e-6: 10 % apart


def test_trl_mask_truncated_completions():
    out = _trl(mask_truncated_completions=True)
    assert out.values["algo.mask_truncated"] is True and out.objective.startswith("your TRL loss")
    assert any("cut by a stop string" in line for line in out.differs)
    assert "algo.mask_truncated" not in _trl().values


def test_trl_optim_is_the_adamw_implementation():
    assert _trl().values["optim.adamw_impl"] == "fused"  # transformers 5's default optim: adamw_torch_fused
    assert _trl(optim="adamw_torch").values["optim.adamw_impl"] == "default"
    out = _trl(optim="adamw_bnb_8bit")
    assert "optim.adamw_impl" not in out.values
    assert any(line.startswith("optim='adamw_bnb_8bit': minirl trains with torch's AdamW") for line in out.not_translated)


def test_trls_default_vllm_correction_is_a_sequence_mask():
    """TRL 1.16's default: ``sequence_mask`` with ``clip_max`` 3 and no ``clip_min``."""
    out = _trl(use_vllm=True)
    v = out.values
    assert (v["algo.tis_mode"], v["algo.tis_level"], v["algo.tis_cap"], v["algo.tis_floor"]) == ("mask", "sequence", 3.0, 0.0)
    assert out.objective.startswith("your TRL loss")
    v = _trl(use_vllm=True, vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=None,
             vllm_importance_sampling_clip_min=0.5).values
    assert (v["algo.tis_mode"], v["algo.tis_level"], v["algo.tis_cap"], v["algo.tis_floor"]) == ("mask", "token", math.inf, 0.5)


def test_trl_rewards_models_peft_and_leftovers():
    out = _trl(reward_funcs=["accuracy_reward", "my_lib.rewards.fmt"], reward_weights=[0.3, 1.0, 0.5],
               reward_model_name_or_path="some/rm", use_peft=True, lora_r=8, lora_target_modules=["q_proj"],
               top_k=20, push_to_hub=True, frobnicate=3)
    v = out.values
    # `trl grpo`'s order: the reward model first, then reward_funcs; the weights in that order
    assert v["task.reward_functions"] == [{"model": "some/rm", "weight": 0.3},
                                          {"function": "minirl.tasks.trl_rewards:accuracy_reward", "weight": 1.0},
                                          {"function": "my_lib.rewards:fmt", "weight": 0.5}]
    assert any("reward_model_name_or_path='some/rm' is not on this machine" in line and "`hf download some/rm "
               "--local-dir DIR`, then set its task.reward_functions entry's model to DIR" in line for line in out.differs)
    assert (v["model.lora.rank"], v["model.lora.alpha"], v["model.lora.target_modules"]) == (8, 32.0, ["q_proj"])
    text = "\n".join(out.not_translated)
    assert "reward_model" not in text and "frobnicate=3" in text
    assert (v["rollout.top_k"], v["eval.top_k"]) == (20, 20)  # TRL evaluates as it samples
    assert out.ignored == ["push_to_hub"]
    with pytest.raises(ConfigError, match="2 weights for 1 reward functions"):
        _trl(reward_funcs=["a.b"], reward_weights=[1, 2])
    # `trl grpo`'s registry entry, with the lengths its script binds
    v = _trl(reward_funcs=["accuracy_reward", "get_soft_overlong_punishment"]).values
    assert v["task.reward_functions"][1] == {"function": "minirl.tasks.trl_rewards:soft_overlong_punishment_reward",
                                             "weight": 1.0, "kwargs": {"max_completion_len": 1280, "soft_punish_cache": 256}}


def test_rendered_file_is_the_translation_and_names_each_origin(tmp_path: Path):
    out = _trl(per_device_train_batch_size=16, steps_per_generation=2, learning_rate=2e-6, use_peft=True,
               repetition_penalty=1.1, max_prompt_length=64)
    path = tmp_path / "m.yaml"
    path.write_text(out.render("grpo.yaml"))
    assert load_config(path) == out.config()
    text = path.read_text()
    assert "lr: 2.0e-06  # learning_rate=2e-06" in text and "max_prompt_tokens: 64  # max_prompt_length=64" in text
    assert "  lora:\n    rank: 16  # use_peft=True, lora_r=16" in text


def _losses(inputs: LossInputs, cfg, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """minirl's loss of a translated config and its gradient w.r.t. logp."""
    algo = cfg.algo
    knobs = algo.loss_knobs()
    knobs["normalizer"] = algo.minibatch_normalizer(SimpleNamespace(size=batch, mask=inputs.mask, group_ids=inputs.group_ids))
    logp = inputs.logp.detach().clone().requires_grad_(True)
    loss, _ = POLICY_LOSSES[algo.name](LossInputs(logp, inputs.logp_old, inputs.logp_rollout, inputs.advantages,
                                                  inputs.mask, inputs.group_ids, token_keep=inputs.token_keep), **knobs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad


def _trl_is_ratio(x: LossInputs, mode: str, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """TRL 1.16's ``importance_sampling_ratio`` (``_generate_and_score_completions``), written as TRL does."""
    mask = x.mask.float()
    logps_diff = (x.logp_old - x.logp_rollout) * mask
    if mode in ["sequence_mask", "sequence_truncate"]:
        logps_diff = logps_diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


def _trl_gradient(loss_type: str, x: LossInputs, eps_low: float, eps_high: float, is_ratio: torch.Tensor | None,
                  max_len: int, opsm: tuple[float, torch.Tensor] | None = None, delta: float | None = None,
                  entropy_mask: torch.Tensor | None = None) -> torch.Tensor:
    """TRL 1.16 ``GRPOTrainer._compute_loss`` for one mini-batch (token level, beta = 0), written as TRL does."""
    logp = x.logp.detach().clone().requires_grad_(True)
    mask = x.mask.float()
    coef_1 = torch.exp(logp - x.logp_old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    if delta is not None:  # two-sided GRPO (INTELLECT-2)
        coef_1 = torch.clamp(coef_1, max=delta)
    adv = x.advantages[:, None]
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    if loss_type == "cispo":  # epsilon_high caps r itself; no lower clip
        per_token_loss = -torch.clamp(torch.exp(logp - x.logp_old), max=eps_high).detach() * adv * logp
    if loss_type == "sapo":  # the soft gate (sapo_temperature_pos / _neg at TRL's defaults; float64 here, not float32)
        temperatures = torch.where(adv > 0, torch.tensor(1.0, dtype=adv.dtype), torch.tensor(1.05, dtype=adv.dtype))
        soft_coef_1 = torch.sigmoid(temperatures * (torch.exp(logp - x.logp_old) - 1)) * 4 / temperatures
        per_token_loss = -soft_coef_1 * adv
    if opsm is not None:  # GRPOTrainer.get_off_policy_mask against ``sampling`` log-probs
        kl_div = opsm[1] - logp.detach()
        avg_seq_kl = (kl_div * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        per_token_loss = per_token_loss * ((adv >= 0) | (avg_seq_kl <= opsm[0])).to(dtype=mask.dtype)
    if entropy_mask is not None:  # top_entropy_quantile < 1
        per_token_loss = per_token_loss * entropy_mask
    if is_ratio is not None:  # use_vllm with vllm_importance_sampling_correction
        per_token_loss = per_token_loss * is_ratio
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_len)
    elif loss_type == "luspo":  # each response's token sum, the mean over responses
        loss = (per_token_loss * mask).sum(-1).mean()
    else:  # dapo, cispo: tokens of the accumulation window; bnpo: tokens of the micro-batch (here the whole window)
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    (grad,) = torch.autograd.grad(loss, logp)
    return grad


def _batch(batch: int = 8, width: int = 6, seed: int = 0) -> LossInputs:
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(batch, width, generator=g, dtype=torch.float64) * 2
    logp = logp_old + 0.4 * torch.randn(batch, width, generator=g, dtype=torch.float64)  # some tokens clip
    logp_rollout = logp_old + 0.8 * torch.randn(batch, width, generator=g, dtype=torch.float64)  # some truncate
    lengths = torch.tensor([6, 3, 5, 1, 6, 4, 2, 6])[:batch]
    mask = torch.arange(width)[None, :] < lengths[:, None]
    advantages = torch.randn(batch, generator=g, dtype=torch.float64)
    return LossInputs(logp, logp_old, logp_rollout, advantages, mask, torch.arange(batch) // 4)


def _with_vllm(given: dict, x: LossInputs, vllm: tuple | None) -> tuple[dict, torch.Tensor | None]:
    """TRL settings with vLLM's IS correction in ``vllm`` = (mode, clip_min, clip_max) (None: without vLLM), and the
    ``importance_sampling_ratio`` TRL computes for ``x`` then."""
    if not vllm:
        return given, None
    mode, clip_min, clip_max = vllm
    return given | {"use_vllm": True, "vllm_importance_sampling_mode": mode, "vllm_importance_sampling_clip_min": clip_min,
                    "vllm_importance_sampling_clip_max": clip_max}, _trl_is_ratio(x, mode, clip_min, clip_max)


TRL_BATCH = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 4,
             "max_completion_length": 6}


def _trl_run(x: LossInputs, vllm: bool, **given) -> tuple[Translation, torch.Tensor | None]:
    """TRL settings over 8 rows (4 per device, 2 accumulation steps) translated, and TRL's IS ratio for ``x`` when
    vLLM's token_truncate correction (clip_max 3) is on."""
    given = TRL_BATCH | given
    if vllm:
        given |= {"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate"}
    return from_trl(given), (_trl_is_ratio(x, "token_truncate", None, 3.0) if vllm else None)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("vllm", [False, True])
def test_trl_off_policy_mask_gradient_is_trls(loss_type, vllm):
    """OPSM (``off_policy_mask_threshold``) against vLLM's log-probs with its correction on, else pi_old's."""
    x = _batch()
    out, is_ratio = _trl_run(x, vllm, loss_type=loss_type, off_policy_mask_threshold=-0.09)  # drops a response either way
    assert out.values["algo.opsm_threshold"] == -0.09
    _, ours = _losses(x, out.config(), batch=8)
    sampling = x.logp_rollout if vllm else x.logp_old
    theirs = _trl_gradient(loss_type, x, 0.2, 0.2, is_ratio, max_len=6, opsm=(-0.09, sampling))
    plain = _trl_gradient(loss_type, x, 0.2, 0.2, is_ratio, max_len=6)
    assert not torch.equal(theirs, plain)  # the mask drops some responses of this batch
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_trl_delta_is_a_dual_clip_with_trls_gradient(loss_type):
    x = _batch()
    out, _ = _trl_run(x, False, loss_type=loss_type, epsilon_high=0.28, delta=1.3)
    assert out.values["algo.dual_clip"] == 1.3
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _trl_gradient(loss_type, x, 0.2, 0.28, None, max_len=6, delta=1.3)
    assert not torch.equal(theirs, _trl_gradient(loss_type, x, 0.2, 0.28, None, max_len=6))  # delta acts here
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    assert "algo.dual_clip" not in _trl_run(x, False, loss_type=loss_type, epsilon_high=0.28, delta=1.2)[0].values


@pytest.mark.parametrize("vllm", [False, True])
def test_trl_cispo_gradient_is_trls(vllm):
    """TRL's ``loss_type="cispo"``: sg[min(r, epsilon_high)] A log pi over the batch's tokens (ScaleRL's form)."""
    x = _batch()
    out, is_ratio = _trl_run(x, vllm, loss_type="cispo", epsilon_high=1.25)
    assert out.values["algo.name"] == "cispo" and out.objective.startswith("your TRL loss")
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _trl_gradient("cispo", x, 0.2, 1.25, is_ratio, max_len=6)
    assert not torch.equal(theirs, _trl_gradient("cispo", x, 0.2, 1e9, is_ratio, max_len=6))  # the cap acts here
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    assert "algo.name" not in _trl_run(x, vllm, loss_type="cispo", epsilon_high=0.28)[0].values  # a cap below 1


VLLM_MODES = [None, ("token_truncate", None, 2.0), ("token_mask", 0.5, 2.0), ("sequence_truncate", 0.5, 2.0),
              ("sequence_mask", None, 3.0), ("token_mask", None, None)]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "sapo", "luspo"])
@pytest.mark.parametrize("vllm", VLLM_MODES)
def test_trl_loss_translations_have_trls_gradient(loss_type, vllm, tmp_path: Path):
    given = {"loss_type": loss_type, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
             "num_generations": 4, "max_completion_length": 6, "epsilon": 0.2, "epsilon_high": 0.28}
    x = _batch()
    given, is_ratio = _with_vllm(given, x, vllm)
    if vllm and (vllm[1] is not None or vllm[2] is not None):  # the bounds act on this batch: a real check
        assert not torch.equal(is_ratio, _trl_is_ratio(x, vllm[0].replace("truncate", "mask"), None, None))
    cfg = from_trl(given).config()
    _, ours = _losses(x, cfg, batch=8)
    # TRL's micro-batches of 4 rows, each loss divided by the 2 accumulation steps, sum to the whole batch's
    theirs = _trl_gradient(loss_type, x, 0.2, 0.28, is_ratio, max_len=6)
    assert ours.abs().max() > 1e-3  # the check has something to compare
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_trl_sequence_level_luspo_is_length_weighted_gspo_with_trls_gradient():
    """LUSPO as TRL recommends it (``importance_sampling_level="sequence"``): GSPO's sequence ratio and clip, each
    response's loss times its length, the mean over the step's responses; TRL's micro-batches of 4 rows over 2
    accumulation steps written as one mean over the 8 rows."""
    from minirl.objective import make_objective
    from minirl.types import Batch

    cfg = from_trl(TRL_BATCH | {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 0.2,
                                "epsilon_high": 0.28}).config()
    assert (cfg.algo.name, cfg.algo.length_weighted, cfg.algo.eps_low, cfg.algo.eps_high) == ("gspo", True, 0.2, 0.28)
    x = _batch()
    batch = Batch(input_ids=torch.zeros(8, 7, dtype=torch.long), attention_mask=torch.ones(8, 7, dtype=torch.bool),
                  mask=x.mask, logp_rollout=x.logp_rollout, advantages=x.advantages, group_ids=x.group_ids,
                  logp_old=x.logp_old)
    logp = x.logp.detach().clone().requires_grad_(True)
    (ours,) = torch.autograd.grad(make_objective(cfg.algo, batch)(logp, batch)[0], logp)
    logp = x.logp.detach().clone().requires_grad_(True)  # TRL 1.16's _compute_loss, sequence level, "luspo"
    mask = x.mask.float()
    log_importance_weights = (((logp - x.logp_old) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.28)
    per_token_loss = -torch.min(coef_1 * x.advantages[:, None], coef_2 * x.advantages[:, None])
    (theirs,) = torch.autograd.grad((per_token_loss * mask).sum(-1).mean(), logp)
    assert ours.abs().max() > 1e-3 and not torch.equal(ours, torch.autograd.grad(  # differs from plain GSPO
        make_objective(cfg.algo.model_copy(update={"length_weighted": False}), batch)(logp, batch)[0], logp)[0])
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def _trl_vespo_gradient(x: LossInputs, is_ratio: torch.Tensor | None, normalizer: float) -> torch.Tensor:
    """TRL 1.16's ``get_gamma_weights`` and its ``loss_type="vespo"`` branch (default k / lambda), written as TRL does."""
    logp = x.logp.detach().clone().requires_grad_(True)
    mask = x.mask.float()
    with torch.no_grad():
        lower_clamp = math.log(1e-8)
        seq_log_ratio = torch.sum(torch.clamp(logp - x.logp_old, -20.0, 20.0) * mask, dim=-1, keepdim=True)
        if is_ratio is not None:
            seq_log_ratio += torch.sum(torch.clamp(torch.log(is_ratio), lower_clamp, 20.0), dim=-1, keepdim=True)
        log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
        w_seq = torch.exp(log_w_seq)
        is_nonneg_adv = x.advantages[:, None] >= 0
        k_seq = torch.where(is_nonneg_adv, 2.0, 3.0)
        lambda_seq = torch.where(is_nonneg_adv, 3.0, 2.0).clamp(min=1e-4)
        phi_seq = torch.exp(lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    per_token_loss = -phi_seq * x.advantages[:, None] * logp
    (grad,) = torch.autograd.grad((per_token_loss * mask).sum() / normalizer, logp)
    return grad


@pytest.mark.parametrize("vllm", [None, ("token_truncate", None, 2.0), ("token_truncate", 0.5, 1.5), ("token_mask", 0.5, 2.0)])
def test_trl_vespo_has_trls_gradient(vllm):
    """TRL's micro-batches of 4 rows over 2 accumulation steps, each divided by num_items_in_batch (the generation's
    tokens) x 2 / 2, sum to one token sum over the 8 rows divided by their tokens: minirl's normaliser."""
    given = TRL_BATCH | {"loss_type": "vespo"}
    x = _batch()
    x = LossInputs(x.logp_old + 0.05 * (x.logp - x.logp_old), x.logp_old, x.logp_rollout, x.advantages, x.mask,
                   x.group_ids)  # ratios near 1: phi far from 0
    given, is_ratio = _with_vllm(given, x, vllm)
    cfg = from_trl(given).config()
    assert cfg.algo.name == "vespo" and cfg.algo.is_correction is bool(vllm)
    _, ours = _losses(x, cfg, batch=8)
    theirs = _trl_vespo_gradient(x, is_ratio, normalizer=float(x.mask.sum()))
    assert ours.abs().max() > 1e-3
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def _trl_gdpo_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, G: int, eps: float) -> torch.Tensor:
    """TRL 1.16's ``multi_objective_aggregation="normalize_then_sum"`` branch, written as TRL does (its eps 1e-4
    a parameter here), with its ``nanstd``."""
    def nanstd(tensor, dim=None, keepdim=False):
        mean = torch.nanmean(tensor, dim=dim, keepdim=True)
        variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
        count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
        variance = variance * count / (count - 1)
        return torch.sqrt(variance) if keepdim or dim is None else torch.sqrt(variance).squeeze(dim)

    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    grouped = rewards_per_func.view(-1, G, rewards_per_func.shape[1])
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True)
    reward_k = ((grouped - mean_k) / (std_k + eps)).view(-1, rewards_per_func.shape[1])
    rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    std_rewards = nanstd(rewards).expand_as(rewards)
    return torch.nan_to_num((rewards - torch.nanmean(rewards)) / (std_rewards + eps), nan=0.0)


def test_trl_gdpo_is_minirls_decoupled_advantage():
    from minirl.algo.variants.gdpo import decoupled_advantages

    out = _trl(multi_objective_aggregation="normalize_then_sum", scale_rewards="batch")  # scale_rewards: unused there
    assert out.values["algo.multi_objective_aggregation"] == "normalize_then_sum" and "algo.adv_std_scope" not in out.values
    assert out.objective.startswith("your TRL loss") and out.config().algo.multi_objective_aggregation == "normalize_then_sum"
    assert out.values["algo.adv_std_eps"] == 1e-4  # TRL's eps, exactly
    assert "algo.multi_objective_aggregation" not in _trl().values
    g = torch.Generator().manual_seed(0)
    parts = torch.randint(0, 3, (4 * 4, 3), generator=g).to(torch.float64)
    parts[parts[:, 2] == 2, 2] = math.nan  # the third function applies to some samples only
    parts[5] = math.nan  # one sample no function applied to
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    ours = decoupled_advantages(parts.view(4, 4, 3), weights, out.config().algo.adv_std_eps).reshape(-1)
    torch.testing.assert_close(ours, _trl_gdpo_advantages(parts, weights, 4, 1e-4), rtol=1e-12, atol=1e-12)
    assert ours[5] == 0.0


def _trl_high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """TRL 1.16's ``get_high_entropy_mask`` on one process, written as TRL does."""
    local = entropies[mask.bool()].float()
    entropy_threshold = torch.quantile(local, threshold)
    masked_entropies = entropies * mask.float()
    return (masked_entropies >= entropy_threshold) & mask.bool()


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "sapo", "dr_grpo"])
def test_trl_top_entropy_quantile_gradient_is_trls(loss_type):
    """``top_entropy_quantile=0.3`` over TRL's micro-batches of 4 rows (2 accumulation steps): each micro-batch's
    entropy mask, the loss's denominators untouched."""
    from minirl.algo.variants.entropy import high_entropy_tokens

    out = from_trl(TRL_BATCH | {"loss_type": loss_type, "top_entropy_quantile": 0.3, "epsilon_high": 0.28})
    assert out.values["algo.top_entropy_quantile"] == 0.3 and out.objective.startswith("your TRL loss")
    cfg = out.config()
    assert cfg.optim.micro_batch_sequences == 4  # the quantile's unit is TRL's per-device batch
    x = _batch()
    entropies = torch.rand(x.mask.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 3
    theirs_mask = torch.cat([_trl_high_entropy_mask(entropies[r], x.mask[r], 1 - 0.3) for r in (slice(0, 4), slice(4, 8))])
    ours_keep = torch.cat([high_entropy_tokens(entropies[r], x.mask[r], 0.3) for r in (slice(0, 4), slice(4, 8))])
    assert torch.equal(ours_keep, theirs_mask) and 0 < int(ours_keep.sum()) < int(x.mask.sum())
    kept = LossInputs(x.logp, x.logp_old, x.logp_rollout, x.advantages, x.mask, x.group_ids, token_keep=ours_keep)
    _, ours = _losses(kept, cfg, batch=8)
    theirs = _trl_gradient(loss_type, x, 0.2, 0.28, None, max_len=6, entropy_mask=theirs_mask.to(torch.float64))
    assert not torch.allclose(theirs, _trl_gradient(loss_type, x, 0.2, 0.28, None, max_len=6))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_trl_bnpo_is_the_token_mean_of_each_optimizer_step():
    """``loss_type="bnpo"``: the micro-batch's token mean; exact with one micro-batch per optimizer step."""
    given = {"loss_type": "bnpo", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
             "num_generations": 4, "max_completion_length": 6, "epsilon": 0.2, "epsilon_high": 0.28}
    out = from_trl(given)
    assert out.values["algo.aggregation"] == "token_mean" and not any("bnpo" in line for line in out.differs)
    x = _batch()
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _trl_gradient("bnpo", x, 0.2, 0.28, None, max_len=6)
    assert not torch.allclose(theirs, _trl_gradient("grpo", x, 0.2, 0.28, None, max_len=6))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    split = from_trl(given | {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2})
    assert any(line.startswith("loss_type='bnpo' with gradient_accumulation_steps > 1") for line in split.differs)


# --------------------------------------------------------------------------------------------- verl

SCRIPT = r"""#!/usr/bin/env bash
set -x
MODEL_PATH=${MODEL_PATH:-/models/Qwen3-30B-A3B}
train=$DATA_ROOT/train.parquet   # from the environment
export VLLM_USE_V1=1

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$train" \
    data.val_files="['${DATA_ROOT}/test.parquet']" \
    data.train_batch_size=256 \
    data.max_response_length=2048 \
    actor_rollout_ref.model.path=$MODEL_PATH \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum \
    actor_rollout_ref.actor.clip_ratio_high=0.27 \
    +actor_rollout_ref.actor.megatron.router_replay.mode=R3 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=8 \
    algorithm.rollout_correction.rollout_is=token \
    algorithm.rollout_correction.rollout_is_threshold=5.0 \
    trainer.logger='["console","tensorboard"]' \
    trainer.n_gpus_per_node=8 \
    trainer.total_training_steps=300 $@
"""


def test_verl_script_overrides_expand_the_scripts_variables(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DATA_ROOT", "/data/gsm8k")
    monkeypatch.delenv("MODEL_PATH", raising=False)
    (tmp_path / "run.sh").write_text(SCRIPT)
    given = script_overrides(tmp_path / "run.sh")
    assert given["data.train_files"] == "/data/gsm8k/train.parquet"
    assert given["data.val_files"] == ["/data/gsm8k/test.parquet"]
    assert given["actor_rollout_ref.model.path"] == "/models/Qwen3-30B-A3B"
    assert given["+actor_rollout_ref.actor.megatron.router_replay.mode"] == "R3"
    assert given["actor_rollout_ref.actor.optim.lr"] == 1e-6 and given["trainer.logger"] == ["console", "tensorboard"]
    assert "VLLM_USE_V1" not in given and len(given) == 20
    monkeypatch.setenv("MODEL_PATH", "/elsewhere")
    assert script_overrides(tmp_path / "run.sh")["actor_rollout_ref.model.path"] == "/elsewhere"
    monkeypatch.delenv("DATA_ROOT")
    given = script_overrides(tmp_path / "run.sh")  # unresolved values are an error only where they are used
    with pytest.raises(ConfigError, match=r"run.sh:9: data.train_files uses a variable the script does not set \(\$train\)"):
        from_verl(given)
    given["data.train_files"] = given["data.val_files"] = "/data/here.parquet"
    assert from_verl(given | {"actor_rollout_ref.actor.megatron.dist_checkpointing_path": given["data.val_files"]})


def test_verl_script_values_from_a_command_are_unresolved(tmp_path: Path, monkeypatch):
    """``$(...)`` / backticks are commands the translation does not run: an override taking one (directly or through a
    variable) is unresolved, not its text taken as written."""
    monkeypatch.delenv("NGPUS", raising=False)
    (tmp_path / "run.sh").write_text("NGPUS=$(nproc)\npython3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$NGPUS \\\n"
                                     "  trainer.default_local_dir=$(hostname)/ckpt trainer.experiment_name=`date` trainer.nnodes=1\n")
    given = script_overrides(tmp_path / "run.sh")
    assert given["trainer.nnodes"] == 1
    assert all(isinstance(given[f"trainer.{key}"], Unresolved)
               for key in ("n_gpus_per_node", "default_local_dir", "experiment_name"))
    assert given["trainer.n_gpus_per_node"].command == f"$(nproc) ({tmp_path / 'run.sh'}:1)"  # a CommandOutput
    # $(pwd) is where this runs, until the script changes directory
    (tmp_path / "run.sh").write_text("HERE=\"$(pwd)\"\npython3 -m verl.trainer.main_ppo data.train_files=$HERE/a.parquet "
                                     "data.val_files=`pwd`/b.parquet\ncd /elsewhere\n"
                                     "python3 -m verl.trainer.main_ppo trainer.default_local_dir=$(pwd)/ckpt\n")
    given = script_overrides(tmp_path / "run.sh")
    assert given["data.train_files"] == f"{os.getcwd()}/a.parquet" and given["data.val_files"] == f"{os.getcwd()}/b.parquet"
    assert isinstance(given["trainer.default_local_dir"], Unresolved)



@pytest.mark.parametrize("redirect", ["> out.log 2>&1", "&> log", ">> log", "2>/dev/null", "< input", "1>&2",
                                      '<<< "x y"', "2>&1 | tee log.txt", "|& tee log"])
def test_verl_redirections_are_no_override_words(tmp_path: Path, redirect: str):
    """A redirection and its target (written against a word too: ``name='a b'>log``) is no word of the command: the
    last override is clean, an assignment's value too."""
    for space in (" ", "") if not redirect[0].isdigit() else (" ",):  # x=a2>log: `2` is the word's, as in bash
        (tmp_path / "run.sh").write_text(f"N=2{space}{redirect.partition('|')[0]}\n"  # a pipeline's runs apart
                                         f"python3 -m verl.trainer.main_ppo data.train_batch_size=8 {redirect} \\\n"
                                         f"  trainer.nnodes=$N trainer.experiment_name='a b'{space}{redirect}\n")
        given = script_overrides(tmp_path / "run.sh")
        assert given == {"data.train_batch_size": 8, "trainer.experiment_name": "a b", "trainer.nnodes": 2}, space


def test_verl_script_variables_reassigned_from_a_command_drop_the_environments(tmp_path: Path, monkeypatch):
    """``MODEL=$(realpath x)`` replaces the environment's MODEL by a command's output (not run here): an override
    taking it is unresolved, not the environment's value."""
    monkeypatch.setenv("MODEL", "/env/model")
    monkeypatch.setenv("DATA", "/env/data")
    (tmp_path / "run.sh").write_text("MODEL=$(realpath x)\nexport DATA=`hostname`/data\n"
                                     "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=$MODEL \\\n"
                                     "  data.train_files=${DATA}/train.parquet trainer.nnodes=1\n")
    given = script_overrides(tmp_path / "run.sh")
    assert isinstance(given["actor_rollout_ref.model.path"], Unresolved) and isinstance(given["data.train_files"], Unresolved)
    assert given["trainer.nnodes"] == 1


def test_verl_scripts_read_bashs_defaults_groups_arrays_and_quotes(tmp_path: Path, monkeypatch):
    """The verl reader reads the script as the slime one does: ``: ${X:=v}``, ``{ ...; }`` groups, array elements,
    ``$"..."`` quotes."""
    monkeypatch.delenv("STEPS", raising=False)
    (tmp_path / "run.sh").write_text(': ${STEPS:=30}\n{ N=4; LR=1e-6; }\nFILES=(a.parquet b.parquet)\nNAME=$"x y"\n'
                                     "python3 -m verl.trainer.main_ppo trainer.total_training_steps=$STEPS \\\n"
                                     "  actor_rollout_ref.rollout.n=$N actor_rollout_ref.actor.optim.lr=$LR \\\n"
                                     "  data.train_files=${FILES[1]} trainer.experiment_name=\"$NAME\"\n")
    given = script_overrides(tmp_path / "run.sh")
    assert (given["trainer.total_training_steps"], given["actor_rollout_ref.rollout.n"]) == (30, 4)
    assert (given["actor_rollout_ref.actor.optim.lr"], given["data.train_files"]) == (1e-6, "b.parquet")
    assert given["trainer.experiment_name"] == "x y"

def test_verl_scripts_read_bashs_trims_appends_and_required_values(tmp_path: Path, monkeypatch):
    """The verl reader's bash: ``${X%/}`` / ``${X^^}`` / ``${X:1:4}`` / ``${A[@]:1:1}``, ``X+=y``; ``${X:?msg}``
    unset is unresolved, its line naming X and msg; ``${X:=$(cmd)}`` (X empty) takes a command's output, not the
    environment's value."""
    monkeypatch.setenv("NGPUS", "")
    monkeypatch.delenv("DATA", raising=False)
    (tmp_path / "run.sh").write_text("MODEL_PATH=/models/Qwen2.5-7B/\nNAME=qwen\nexport NAME+=-grpo\n: ${NGPUS:=$(nproc)}\n"
                                     "FILES=(a.parquet b.parquet c.parquet)\n"
                                     "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=${MODEL_PATH%/} \\\n"
                                     "  trainer.experiment_name=${NAME^^} trainer.project_name=${MODEL_PATH:8:4} \\\n"
                                     "  trainer.n_gpus_per_node=$NGPUS data.val_files=${FILES[@]:1:1} \\\n"
                                     "  data.train_files=${DATA:?set DATA to the parquet files}\n")
    given = script_overrides(tmp_path / "run.sh")
    assert (given["actor_rollout_ref.model.path"], given["trainer.experiment_name"]) == ("/models/Qwen2.5-7B", "QWEN-GRPO")
    assert (given["trainer.project_name"], given["data.val_files"]) == ("Qwen", "b.parquet")
    assert isinstance(given["trainer.n_gpus_per_node"], Unresolved)
    with pytest.raises(ConfigError, match=r"run.sh:9: data.train_files uses a variable the script does not set "
                                          r"\(\$\{DATA:\?set DATA to the parquet files\}\)"):
        from_verl(given)


def test_verl_scripts_keep_a_required_values_message_through_a_variable(tmp_path: Path, monkeypatch):
    """``DATA_DIR=${DATA:?msg}`` stops bash at its line when DATA is unset: an override taking ``$DATA_DIR`` names that
    line and the message; ``${1:-...}`` takes its default (``bash run.sh``: no arguments)."""
    monkeypatch.delenv("DATA", raising=False)
    (tmp_path / "run.sh").write_text('DATA_DIR=${DATA:?set DATA to your data directory}\nMODEL=${1:-/models/qwen}\n'
                                     "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=$MODEL \\\n"
                                     "  data.train_files=$DATA_DIR/train.parquet\n")
    given = script_overrides(tmp_path / "run.sh")
    assert given["actor_rollout_ref.model.path"] == "/models/qwen"
    with pytest.raises(ConfigError, match=r"run.sh:4: data.train_files uses a variable the script does not set "
                                          r"\(\$DATA_DIR/train.parquet: bash stops at .*run.sh:1: DATA: set DATA to your "
                                          r"data directory\)"):
        from_verl(given)


DAPO_SCRIPT = r"""#!/usr/bin/env bash
set -xeuo pipefail
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 20))
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
TRAIN_FILE=${TRAIN_FILE:-"${RAY_DATA_HOME}/data/dapo-math-17k.parquet"}
enable_overlong_buffer=True
overlong_buffer_len=$((1024 * 4))
overlong_penalty_factor=1.0
echo "TRAIN_FILE: ${TRAIN_FILE}"
RAY_ADDRESS='http://127.0.0.1:8265' ray job submit --runtime-env=env.yaml \
-- python3 -m recipe.dapo.main_dapo \
    algorithm.adv_estimator=grpo \
    data.train_files="${TRAIN_FILE}" \
    data.max_response_length=${max_response_length} \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$((max_prompt_length + max_response_length)) \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.rollout.max_num_batched_tokens=$(( 1024 * 32 )) \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.max_num_gen_batches=10 \
    reward_model.reward_manager=dapo \
    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=${enable_overlong_buffer} \
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=${overlong_buffer_len} \
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=${overlong_penalty_factor} \
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False \
    +reward_model.reward_kwargs.max_resp_len=${max_response_length} \
    trainer.total_training_steps=$((undefined_var * 2))
"""


def test_a_dapo_recipe_script_arithmetic_nested_defaults_and_what_minirl_lacks(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.delenv("RAY_DATA_HOME", raising=False)
    monkeypatch.delenv("TRAIN_FILE", raising=False)
    (tmp_path / "run.sh").write_text(DAPO_SCRIPT)
    given = script_overrides(tmp_path / "run.sh")
    assert given["data.train_files"] == "/home/u/verl/data/dapo-math-17k.parquet"  # ${A:-"${B}/x"}, nested
    assert given["data.max_response_length"] == 20480 and given["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 22528
    assert given["actor_rollout_ref.rollout.max_num_batched_tokens"] == 32768
    with pytest.raises(ConfigError, match=r"run.sh:27: trainer.total_training_steps uses a variable"):
        from_verl(given)  # $((undefined_var * 2)) cannot be evaluated
    given["trainer.total_training_steps"] = 5
    out = from_verl(given)
    assert out.values["optim.micro_batch_max_tokens"] == 22528
    text = "\n".join(out.not_translated)
    assert "reward manager" not in text and "filter_groups" not in text
    assert (out.values["rollout.filter_groups"], out.values["rollout.filter_groups_max_rounds"]) == (True, 10)
    assert out.values["rollout.filter_groups_metric"] == "reward"  # the recipe leaves verl's metric unset
    assert "rollout.filter_groups_prompts_per_round" not in out.values  # gen_batch_size unset: train_batch_size
    assert any("max_num_gen_batches=10: when the rounds run out verl stops" in line for line in out.differs)
    assert out.values["task.reward_functions"][-1] == {  # DAPO's overlong reward shaping, as the recipe sets it
        "function": OVERLONG, "weight": 1.0, "name": "overlong_reward", "kwargs": {"max_completion_len": 20480, "soft_punish_cache": 4096}}
    given |= {"algorithm.filter_groups.metric": "acc", "data.gen_batch_size": 96, "data.train_batch_size": 32, "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
              "algorithm.filter_groups.max_num_gen_batches": 0}
    out = from_verl(given)
    assert out.values["rollout.filter_groups_metric"] == "accuracy" and out.values["rollout.filter_groups_prompts_per_round"] == 96
    assert out.values["rollout.filter_groups_max_rounds"] == 0
    assert any("0 = at most one pass over the training prompts" in line for line in out.differs)


def test_verl_run_script_translation(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DATA_ROOT", "/data/gsm8k")
    (tmp_path / "run.sh").write_text(SCRIPT)
    out = from_verl(read_verl([str(tmp_path / "run.sh")], ["trainer.test_freq=5"]))
    v = out.values
    assert (v["rollout.prompts_per_step"], v["rollout.samples_per_prompt"], v["optim.minibatches_per_step"]) == (256, 8, 4)
    assert (v["optim.micro_batch_sequences"], v["rollout.max_new_tokens"], v["optim.global_steps"]) == (8, 2048, 300)
    assert (v["algo.name"], v["algo.aggregation"], v["algo.eps_low"], v["algo.eps_high"]) == ("minirl", "seq_sum", 0.2, 0.27)
    assert (v["algo.is_correction"], v["algo.tis_cap"], v["algo.tis_placement"]) == (True, 5.0, "train_infer")
    assert v["moe.routing_replay"] == "R3" and v["eval.every_steps"] == 5 and v["log.tensorboard"] is True
    assert (v["cluster.backend"], v["cluster.trainer_ranks"], v["cluster.device"]) == ("ray", 8, "cuda")
    assert "cluster.collective_timeout_s" not in v  # verl's 600 s is minirl's default
    timed = from_verl(read_verl([str(tmp_path / "run.sh")], ["actor_rollout_ref.nccl_timeout=1200"]))
    assert timed.values["cluster.collective_timeout_s"] == 1200 and timed.config().cluster.collective_timeout_s == 1200.0
    assert v["task.path"] == "/data/gsm8k/train.parquet" and v["task.eval_path"] == "/data/gsm8k/test.parquet"
    assert v["algo.dual_clip"] == 3.0 and not any("dual clip" in line for line in out.differs)  # verl's default c
    assert (v["eval.temperature"], v["eval.samples_per_prompt"]) == (0.0, 1)  # verl's default validation: greedy, n 1
    assert "actor_rollout_ref.rollout.gpu_memory_utilization" in out.ignored
    out.config()


MULTITURN_SCRIPT = """#!/usr/bin/env bash
set -xeuo pipefail
PROJECT_DIR="$(pwd)"
CONFIG_PATH="$PROJECT_DIR/config"
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-32}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-${TRAIN_BATCH_SIZE}}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-gsm8k_multiturn_$(date '+%d-%H-%M')}
DATA=(
    algorithm.adv_estimator=grpo
    data.train_files=$PROJECT_DIR/train.parquet
    data.train_batch_size=${TRAIN_BATCH_SIZE}
)
ACTOR=(
    actor_rollout_ref.actor.ppo_mini_batch_size=${PPO_MINI_BATCH_SIZE}
    actor_rollout_ref.model.path="$MODEL_SET_NOWHERE"
)
ROLLOUT=(
    actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.multi_turn.enable=true
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$PROJECT_DIR/config/tool_config.yaml"
)
TRAINER=(trainer.experiment_name="${EXPERIMENT_NAME}")
CONFIG=(
    --config-path="$CONFIG_PATH"
    --config-name=multiturn_grpo
)
python3 -m verl.trainer.main_ppo \\
    "${CONFIG[@]}" \\
    "${DATA[@]}" \\
    "${ACTOR[@]}" \\
    "${ROLLOUT[@]}" \\
    "${TRAINER[@]}" \\
    actor_rollout_ref.actor.optim.lr=1e-6 "$@"
"""


def test_verls_multiturn_example_script_arrays_hydra_config_and_pwd(tmp_path: Path, monkeypatch):
    """verl's current example scripts (``examples/sglang_multiturn``): overrides gathered in bash arrays spliced into
    the command as ``"${DATA[@]}"``, ``PROJECT_DIR="$(pwd)"``, the run's Hydra config named by ``--config-path`` /
    ``--config-name`` (read under the script's overrides), an experiment name with a date in it."""
    for name in ("TRAIN_BATCH_SIZE", "PPO_MINI_BATCH_SIZE", "EXPERIMENT_NAME", "MODEL_SET_NOWHERE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "multiturn_grpo.yaml").write_text(
        "hydra:\n  searchpath: [file://verl/trainer/config]\ndefaults: [ppo_trainer, _self_]\n"
        "data: {max_response_length: 512, train_batch_size: 256}\n"
        "actor_rollout_ref:\n  rollout:\n    multi_turn: {enable: true, max_assistant_turns: 5}\n")
    (tmp_path / "run.sh").write_text(MULTITURN_SCRIPT)
    given = read_verl([str(tmp_path / "run.sh")], ["actor_rollout_ref.model.path=/models/qwen"])
    assert given["data.train_batch_size"] == 32  # the script's array, over its config's 256
    assert given["actor_rollout_ref.actor.ppo_mini_batch_size"] == 32 and given["data.max_response_length"] == 512
    assert given["data.train_files"] == f"{tmp_path}/train.parquet"
    assert "--config-path" not in given and "--config-name" not in given
    out = from_verl(given)
    v = out.values
    assert (v["rollout.prompts_per_step"], v["rollout.max_new_tokens"], v["task.max_tool_iterations"]) == (32, 512, 4)
    assert v["task.tool_config"] == f"{tmp_path}/config/tool_config.yaml"
    assert v["run.name"] == "gsm8k" and any("takes the output of $(date '+%d-%H-%M')" in x and "verl's default 'gsm8k'"
                                            in x for x in out.differs)
    # an array's element naming a variable set nowhere is unresolved, and an error where the translation needs it
    bare = read_verl([str(tmp_path / "run.sh")], [])
    with pytest.raises(ConfigError, match=r"run.sh:16: actor_rollout_ref.model.path uses a variable the script does not "
                                          r"set \(\$MODEL_SET_NOWHERE\)"):
        from_verl(bare)
    # Hydra's other spellings: -cp DIR -cn NAME, the value as the next word
    (tmp_path / "short.sh").write_text(MULTITURN_SCRIPT.replace('--config-path="$CONFIG_PATH"', '-cp "$CONFIG_PATH"')
                                       .replace("--config-name=multiturn_grpo", "--config-name multiturn_grpo"))
    assert read_verl([str(tmp_path / "short.sh")], [])["data.max_response_length"] == 512
    # a config name that is not there is one line
    (tmp_path / "config" / "multiturn_grpo.yaml").unlink()
    with pytest.raises(ConfigError, match=r"--config-name multiturn_grpo names .*multiturn_grpo.yaml, not found here"):
        read_verl([str(tmp_path / "run.sh")], [])


BRANCHES_SCRIPT = """DEVICE=${DEVICE:-gpu}
QUANT=
case "${DEVICE}" in
    npu)
        train_batch_size=256
        ;;
    gpu|cuda)
        train_batch_size=512
        ;;
    *) train_batch_size=1 ;;
esac
EXTRA=()
if [ "${QUANT}" = fp8 ]; then
    EXTRA+=(actor_rollout_ref.rollout.temperature=0.5)
elif [[ $DEVICE == g* ]]; then
    LR=2e-6
else
    LR=9e-6
fi
[ -n "$QUANT" ] && EXTRA+=(actor_rollout_ref.rollout.top_p=0.5)
[ -z "$QUANT" ] && N=4
HOST=$(hostname)
if [ "$HOST" = node1 ]; then
    NODES=2
fi
ROLLOUT="actor_rollout_ref.rollout.n=$N actor_rollout_ref.actor.optim.lr=$LR"
python3 -m verl.trainer.main_ppo --config-path=config -cn ppo_trainer \\
    data.train_batch_size=${train_batch_size} actor_rollout_ref.actor.ppo_mini_batch_size=64 \\
    trainer.nnodes=${NODES:-1} "${EXTRA[@]}" $ROLLOUT
"""


def test_verl_script_branches_known_here_run_alone_and_the_others_are_named(tmp_path: Path, monkeypatch):
    """verl's scripts switch on the device and options with ``case`` / ``if``: a branch whose condition is known here
    runs alone (``gpu|cuda)``, ``[ "$Q" = fp8 ]``, ``[[ $D == g* ]]``, ``[ -n ... ] &&``); one that is not (a
    command's output) is read as if it ran and named; an unquoted ``$ROLLOUT`` gives its overrides; a relative
    ``--config-path`` with verl's own ``ppo_trainer`` is verl's defaults."""
    for name in ("DEVICE", "QUANT", "N", "LR", "NODES", "HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.sh").write_text(BRANCHES_SCRIPT)
    given = read_verl([str(tmp_path / "run.sh")], [])
    assert given["data.train_batch_size"] == 512  # the gpu|cuda) branch, not npu) or *)
    assert given["actor_rollout_ref.actor.optim.lr"] == 2e-6 and given["actor_rollout_ref.rollout.n"] == 4
    assert "actor_rollout_ref.rollout.temperature" not in given and "actor_rollout_ref.rollout.top_p" not in given
    assert given["trainer.nnodes"] == 2  # HOST is a command's output: the if is read as if it ran ...
    line, = given["$conditional"]
    assert line.startswith(f"{tmp_path / 'run.sh'}:24: NODES is set inside an if / case / loop block") and \
        "(trainer.nnodes take it)" in line
    out = from_verl(dict(given))
    assert line in out.differs  # ... and said in the header
    monkeypatch.setenv("DEVICE", "npu")
    assert read_verl([str(tmp_path / "run.sh")], [])["data.train_batch_size"] == 256
    monkeypatch.setenv("DEVICE", "tpu")
    assert read_verl([str(tmp_path / "run.sh")], [])["data.train_batch_size"] == 1
    monkeypatch.delenv("DEVICE")
    # Hydra reads a relative --config-path from main_ppo.py's folder: ppo_trainer there is verl's own (its defaults),
    # not a file of that name where the translation runs
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "ppo_trainer.yaml").write_text("data: {max_response_length: 77}\n")
    assert "data.max_response_length" not in read_verl([str(tmp_path / "run.sh")], [])
    # a case on one line keeps its first branch
    (tmp_path / "one.sh").write_text("M=a\ncase $M in a) B=8;; b) B=16;; esac\n"
                                     "python3 -m verl.trainer.main_ppo data.train_batch_size=$B\n")
    assert read_verl([str(tmp_path / "one.sh")], [])["data.train_batch_size"] == 8
    # a script bash cannot parse is one line (verl's run would not start either)
    (tmp_path / "broken.sh").write_text("case x in\n  a)\n    if true; then\n      N=1\n    ;;\nesac\n"
                                        "python3 -m verl.trainer.main_ppo data.train_batch_size=8\n")
    with pytest.raises(ConfigError, match=r"broken.sh: bash cannot parse it \(line 5: syntax error"):
        read_verl([str(tmp_path / "broken.sh")], [])


@pytest.mark.parametrize("script", [
    # a condition on a variable set in an undecided branch is itself undecided (bash: a.lr=1)
    'if [ -d / ]; then MODE=a; else MODE=b; fi\nif [ "$MODE" = a ]; then L=1; else L=2; fi\n',
    'if [ -d / ]; then MODE=a; else MODE=b; fi\ncase $MODE in\n  a) L=1 ;;\n  *) L=2 ;;\nesac\n',
    # bash's ;& runs the next branch too, ;;& tests the next patterns: no case branch is decided (bash: a.lr=1)
    "X=a\nL=0\ncase $X in\n  a) L=1 ;&\n  b) M=2 ;;\nesac\n",
    "X=a\nL=0\ncase $X in\n  a) L=1 ;;&\n  a*) M=2 ;;\nesac\n",
], ids=["if-on-undecided", "case-on-undecided", "fall-through", "test-next"])
def test_verl_script_branches_not_known_here_are_named_not_decided(tmp_path: Path, script: str):
    (tmp_path / "run.sh").write_text(script + "python3 -m verl.trainer.main_ppo a.lr=$L\n")
    given = read_verl([str(tmp_path / "run.sh")], [])
    assert any("L is set inside an if / case / loop block" in line for line in given["$conditional"])
    # two scripts read together: each one's lines are kept
    (tmp_path / "two.sh").write_text("if [ -d / ]; then M=1; else M=2; fi\npython3 -m verl.trainer.main_ppo a.m=$M\n")
    both = read_verl([str(tmp_path / "run.sh"), str(tmp_path / "two.sh")], [])["$conditional"]
    assert set(given["$conditional"]) < set(both) and any("M is set inside" in line for line in both)


def test_verl_greedy_validation_with_n_evaluates_once_and_says_so():
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    greedy = from_verl(base | {"actor_rollout_ref.rollout.val_kwargs.n": 4})
    assert (greedy.values["eval.temperature"], greedy.values["eval.samples_per_prompt"]) == (0.0, 1)
    assert any("val_kwargs.n=4 with greedy validation" in line for line in greedy.differs)
    sampled = from_verl(base | {"actor_rollout_ref.rollout.val_kwargs.n": 4, "actor_rollout_ref.rollout.val_kwargs.temperature": 0.6})
    assert (sampled.values["eval.temperature"], sampled.values["eval.samples_per_prompt"]) == (0.6, 4)
    assert not any("greedy" in line for line in sampled.differs)
    greedy.config(), sampled.config()


def test_verl_reward_kwargs_ride_with_the_function():
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "custom_reward_function.path": "r.py"}
    assert from_verl(base).values["task.reward_function"] == "r.py:compute_score"
    v = from_verl(base | {"custom_reward_function.name": "score", "custom_reward_function.reward_kwargs": {"k": 2}}).values
    assert v["task.reward_functions"] == [{"function": "r.py:score", "kwargs": {"k": 2}}] and "task.reward_function" not in v
    # both the legacy key and verl 0.9's: verl scores with the latter, and a line names the one not used
    both = from_verl(base | {"reward.custom_reward_function.path": "shaping.py"})
    assert both.values["task.reward_function"] == "shaping.py:compute_score"
    assert any(line.startswith("custom_reward_function.path='r.py': not used") for line in both.differs)
    assert not any("not used" in line for line in from_verl(base).differs)


OVERLONG = "minirl.tasks.trl_rewards:soft_overlong_punishment_reward"


@pytest.mark.parametrize("form", [
    # verl 0.9 (reward.reward_kwargs), the newer recipes (+reward_model.reward_kwargs), the older ones
    {"reward.reward_manager.name": "dapo", "reward.reward_kwargs.max_resp_len": 2048,
     **{f"reward.reward_kwargs.overlong_buffer_cfg.{k}": v for k, v in (("enable", True), ("len", 512), ("penalty_factor", 0.5))}},
    {"reward_model.reward_manager": "dapo", "reward_model.reward_kwargs.max_resp_len": 2048,
     **{f"reward_model.reward_kwargs.overlong_buffer_cfg.{k}": v for k, v in (("enable", True), ("len", 512), ("penalty_factor", 0.5))}},
    {"reward_model.reward_manager": "dapo", "reward_model.overlong_buffer.enable": True, "reward_model.overlong_buffer.len": 512,
     "reward_model.overlong_buffer.penalty_factor": 0.5, "reward_model.overlong_buffer.log": False},
], ids=["reward.reward_kwargs", "reward_model.reward_kwargs", "reward_model.overlong_buffer"])
def test_verl_dapo_overlong_buffer_is_the_soft_overlong_punishment_weighed_by_its_factor(form):
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "data.max_response_length": 2048,
            "custom_reward_function.path": "r.py"}
    out = from_verl(base | form)
    penalty = {"function": OVERLONG, "weight": 0.5, "name": "overlong_reward",
               "kwargs": {"max_completion_len": 2048, "soft_punish_cache": 512}}
    assert out.values["task.reward_functions"] == [{"function": "r.py:compute_score"}, penalty]
    assert "task.reward_function" not in out.values and not any("reward manager" in line for line in out.not_translated)
    assert not any("overlong" in key for key in out.ignored) and not any("overlong" in line for line in out.not_translated)
    out.config()
    # without a custom function, verl's default_compute_score (rewritten) beside the penalty
    builtin = from_verl({k: v for k, v in base.items() if k != "custom_reward_function.path"} | form)
    assert builtin.values["task.reward_functions"] == [{"function": "minirl.tasks.verl_scores:default_compute_score"},
                                                       penalty]


def test_chat_template_kwargs_from_trl_and_verl_in_every_shape(tmp_path: Path):
    assert _trl(chat_template_kwargs={"enable_thinking": False}).values["task.chat_template_kwargs"] == {"enable_thinking": False}
    assert _trl(chat_template_kwargs='{"enable_thinking": false}').values["task.chat_template_kwargs"] == {"enable_thinking": False}
    with pytest.raises(ConfigError, match="not a JSON object of chat-template variables"):
        _trl(chat_template_kwargs="enable_thinking")
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    # Hydra's +data.apply_chat_template_kwargs.enable_thinking=False, and a YAML file's nested mapping: leaves
    words = read_verl([], ["+data.apply_chat_template_kwargs.enable_thinking=False",
                           "+custom_reward_function.reward_kwargs.scale.max=2", "custom_reward_function.path=r.py"])
    out = from_verl(base | words)
    assert out.values["task.chat_template_kwargs"] == {"enable_thinking": False}
    assert out.values["task.reward_functions"] == [{"function": "r.py:compute_score", "kwargs": {"scale": {"max": 2}}}]
    assert not any("kwargs" in line for line in out.not_translated + out.ignored)
    (tmp_path / "v.yaml").write_text("data:\n  apply_chat_template_kwargs:\n    enable_thinking: false\n")
    assert from_verl(base | read_verl([str(tmp_path / "v.yaml")], [])).values["task.chat_template_kwargs"] == {
        "enable_thinking": False}
    assert "task.chat_template_kwargs" not in from_verl(base).values
    out.config()


def test_verl_reward_model_scores_alone_or_is_named_not_translated_beside_your_function(tmp_path):
    """verl 0.9's reward loop: a reward model with no custom_reward_function is a discriminative scorer (its score the
    reward) -> {model: DIR}, from the legacy keys or the reward.reward_model.* they move to; with your function, the
    function runs and queries the served model (a GenRM or a hybrid), which minirl does not serve: named."""
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}
    rm = tmp_path / "rm"
    rm.mkdir()
    for enable, path in (("reward_model.enable", "reward_model.model.path"),
                         ("reward.reward_model.enable", "reward.reward_model.model_path")):
        out = from_verl(base | {enable: True, path: str(rm)})
        assert out.values["task.reward_functions"] == [{"model": str(rm)}] and "task.reward_function" not in out.values
        assert any("token-classification head" in line for line in out.differs)
        assert not any("reward_model" in line for line in out.not_translated + out.ignored)
        for custom in ("custom_reward_function.path", "reward.custom_reward_function.path"):
            judged = from_verl(base | {enable: True, path: "/m/genrm", custom: "r.py"})
            assert judged.values["task.reward_function"] == "r.py:compute_score"
            assert "task.reward_functions" not in judged.values
            assert any(line.startswith(f"{enable}=True, {path}='/m/genrm': verl serves the reward model and your "
                                       "custom_reward_function queries it") for line in judged.not_translated)
            assert not any(key.startswith(enable) for key in judged.ignored)
    assert not any("reward model" in line for line in from_verl(base).not_translated)
    away = from_verl(base | {"reward_model.enable": True, "reward_model.model.path": "/not/here/rm"})
    assert any("reward_model.model.path='/not/here/rm' is not on this machine" in line for line in away.differs)


def test_verl_overlong_buffer_edge_cases():
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "data.max_response_length": 1024,
            "reward_model.overlong_buffer.enable": True, "reward_model.overlong_buffer.len": 256,
            "reward_model.overlong_buffer.penalty_factor": 1.0}
    assert "task.reward_functions" not in from_verl(base).values  # the naive manager never reads it, as in verl
    dapo = base | {"reward_model.reward_manager": "dapo"}
    with pytest.raises(ConfigError, match="overlong buffer needs 0 < len"):
        from_verl(dapo | {"reward_model.overlong_buffer.len": 2048})
    short = from_verl(dapo | {"reward_model.reward_kwargs.max_resp_len": 512,
                              "reward_model.reward_kwargs.overlong_buffer_cfg.enable": True,
                              "reward_model.reward_kwargs.overlong_buffer_cfg.len": 128,
                              "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0})
    assert short.values["task.reward_functions"][-1]["kwargs"] == {"max_completion_len": 512, "soft_punish_cache": 128}
    assert any("below the response limit" in line for line in short.differs)


def test_verl_lora_and_the_kl_penalty_keep_the_gpus_as_trainer_ranks():
    base = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 8,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 8, "trainer.total_training_steps": 3}
    v = from_verl(base | {"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_type": "mse"}).values
    assert (v["algo.kl_coef"], v["algo.kl_loss_type"], v["cluster.trainer_ranks"]) == (0.001, "k2", 8)  # ranks hold it
    v = from_verl(base | {"actor_rollout_ref.model.lora_rank": 32}).values
    assert (v["model.lora.rank"], v["model.lora.alpha"], v["cluster.trainer_ranks"]) == (32, 16.0, 8)
    assert v["model.lora.target_modules"] == ["all-linear"]  # verl's default, peft's keyword
    experts = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    v = from_verl(base | {"actor_rollout_ref.model.lora_rank": 8, "actor_rollout_ref.model.target_parameters": experts}).values
    assert v["model.lora.target_parameters"] == experts
    megatron = from_verl(base | {"actor_rollout_ref.model.lora.rank": 16, "actor_rollout_ref.model.lora.type": "lora",
                                 "actor_rollout_ref.model.lora.target_modules": ["linear_qkv", "linear_fc2", "router"]})
    v = megatron.values
    assert (v["model.lora.rank"], v["model.lora.alpha"]) == (16, 32.0)
    assert v["model.lora.target_modules"] == ["q_proj", "k_proj", "v_proj", "down_proj"]
    assert any("router (Megatron names" in line for line in megatron.not_translated)


@pytest.mark.parametrize("given, name, aggregation", [
    ({}, "minirl", "token_mean"),  # verl's default loss_agg_mode
    ({"actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean"}, "grpo", None),
    ({"actor_rollout_ref.actor.policy_loss.loss_mode": "gspo"}, "gspo", None),
])
def test_verl_losses_minirl_has(given, name, aggregation):
    v = from_verl({"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4} | given).values
    assert v["algo.name"] == name and v.get("algo.aggregation") == aggregation


@pytest.mark.parametrize("given", [{"algorithm.adv_estimator": "gdpo"},
                                   {"algorithm.adv_estimator": "grpo", "algorithm.use_kl_in_reward": True,
                                    "algorithm.kl_penalty": "full"},
                                   {"algorithm.adv_estimator": "grpo", "algorithm.rollout_correction.rollout_is": "batch"}])
def test_verl_losses_minirl_lacks(given):
    out = from_verl({"actor_rollout_ref.rollout.n": 4} | given)
    assert not [key for key in out.values if key.startswith("algo.")] and out.objective.startswith("minirl's MiniRL")


def test_verl_kl_in_reward_fixed_and_adaptive():
    base = {"algorithm.adv_estimator": "reinforce_plus_plus_baseline", "actor_rollout_ref.rollout.n": 4,
            "algorithm.use_kl_in_reward": True}
    v = from_verl(base).values  # verl's defaults: kl_penalty "kl", a fixed controller at 0.001
    assert (v["algo.kl_in_reward_coef"], v["algo.kl_in_reward_type"], v["algo.adv_whiten"]) == (0.001, "k1", True)
    assert "algo.kl_in_reward_target" not in v and "algo.kl_coef" not in v
    adaptive = from_verl(base | {"algorithm.kl_penalty": "low_var_kl", "algorithm.kl_ctrl.type": "adaptive",
                                 "algorithm.kl_ctrl.kl_coef": 0.02, "algorithm.kl_ctrl.target_kl": 6.0,
                                 "algorithm.kl_ctrl.horizon": 500})
    v = adaptive.values
    assert (v["algo.kl_in_reward_coef"], v["algo.kl_in_reward_type"]) == (0.02, "k3")
    assert (v["algo.kl_in_reward_target"], v["algo.kl_in_reward_horizon"]) == (6.0, 500)
    assert not any("kl_ctrl" in line for line in adaptive.ignored + adaptive.not_translated)
    adaptive.config()


def test_entropy_coefficients_of_trl_and_verl_are_the_entropy_bonus():
    out = _trl(entropy_coef=0.01)
    assert out.values["algo.entropy_coef"] == 0.01 and out.objective.startswith("your TRL loss")
    assert not any("entropy_coef" in line for line in out.differs)
    assert any("each micro-batch's token-mean entropy" in line for line in _trl(
        entropy_coef=0.01, gradient_accumulation_steps=2, per_device_train_batch_size=4).differs)
    assert "algo.entropy_coef" not in _trl().values
    verl = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "actor_rollout_ref.actor.entropy_coeff": 0.001}
    out = from_verl(verl)
    assert out.values["algo.entropy_coef"] == 0.001 and out.objective.startswith("your verl loss")
    assert not any("entropy" in line for line in out.differs)
    out = from_verl(verl | {"actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum"})
    assert out.values["algo.entropy_coef"] == 0.001
    assert any("verl aggregates the entropy like the policy loss" in line for line in out.differs)


def test_verl_token_mean_gradient_is_verls(tmp_path: Path):
    """verl's vanilla PPO loss with ``agg_loss(token-mean)``, token-level rollout IS and its dual clip
    (``clip_ratio_c``, low here so that it acts on this batch)."""
    cfg = from_verl({"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 2,
                     "actor_rollout_ref.actor.ppo_mini_batch_size": 2, "algorithm.rollout_correction.rollout_is": "token",
                     "actor_rollout_ref.actor.clip_ratio_c": 1.25}).config()
    x = _batch()
    _, ours = _losses(x, cfg, batch=8)
    theirs = _verl_gradient(x, 0.2, 0.2, 1.25, _trl_is_ratio(x, "token_truncate", None, 2.0))
    assert not torch.equal(theirs, _verl_gradient(x, 0.2, 0.2, 1e9, _trl_is_ratio(x, "token_truncate", None, 2.0)))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def _verl_gradient(x: LossInputs, clip_low: float, clip_high: float, clip_ratio_c: float,
                   is_weights: torch.Tensor | None) -> torch.Tensor:
    """verl 0.9.1's ``compute_policy_loss_vanilla`` with ``agg_loss(token-mean)``, written as verl does."""
    logp = x.logp.detach().clone().requires_grad_(True)
    mask = x.mask.to(logp.dtype)
    adv = x.advantages[:, None].expand_as(logp)
    ratio = torch.exp(torch.clamp(logp - x.logp_old, min=-20.0, max=20.0))
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.min(-adv * clip_ratio_c, clip_pg_losses1)
    pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    if is_weights is not None:
        pg_losses = pg_losses * is_weights
    loss = (pg_losses * mask).sum() / mask.sum()
    (grad,) = torch.autograd.grad(loss, logp)
    return grad


def _verl_is_weights(x: LossInputs, rollout_is: str, threshold: float | str) -> torch.Tensor:
    """verl 0.9.1's ``compute_rollout_correction_weights`` (no batch normalisation), written as verl does."""
    upper, lower = (float(threshold), None) if not isinstance(threshold, str) else map(float, threshold.split("_")[::-1])
    log_ratio, mask = x.logp_old - x.logp_rollout, x.mask.to(x.logp_old.dtype)
    if rollout_is == "token":
        raw = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        log_ratio_sum = (log_ratio * mask).sum(dim=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio_sum, min=-20.0, max=20.0)).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        return raw.clamp(max=upper)
    return torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))


def _verl_sapo_gradient(x: LossInputs, tau_pos: float, tau_neg: float, is_weights: torch.Tensor | None) -> torch.Tensor:
    """verl 0.9.1's ``compute_policy_loss_sapo`` with ``agg_loss(seq-mean-token-mean)``, written as verl does."""
    logp = x.logp.detach().clone().requires_grad_(True)
    advantages, mask = x.advantages[:, None].expand_as(logp), x.mask.to(logp.dtype)
    tau_pos_t = torch.as_tensor(tau_pos, dtype=advantages.dtype)
    tau_neg_t = torch.as_tensor(tau_neg, dtype=advantages.dtype)
    ratio = torch.exp(torch.clamp(logp - x.logp_old, min=-20.0, max=20.0))
    taus = torch.where(advantages > 0, tau_pos_t, tau_neg_t)
    pg_losses = -(torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)) * advantages
    if is_weights is not None:
        pg_losses = pg_losses * is_weights
    seq_losses = (pg_losses * mask).sum(dim=-1) / (mask.sum(dim=-1) + 1e-8)  # seq-mean-token-mean
    (grad,) = torch.autograd.grad(seq_losses.mean(), logp)
    return grad


@pytest.mark.parametrize("rollout_is", [None, "token", "sequence"])
def test_verl_sapo_gradient_is_verls(rollout_is):
    given = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 2,
             "actor_rollout_ref.actor.ppo_mini_batch_size": 2, "actor_rollout_ref.actor.policy_loss.loss_mode": "sapo",
             "actor_rollout_ref.actor.tau_neg": 1.5}
    if rollout_is:
        given |= {"algorithm.rollout_correction.rollout_is": rollout_is,
                  "algorithm.rollout_correction.rollout_is_threshold": 1.8}
    out = from_verl(given)
    assert out.objective.startswith("your verl loss") and out.values["algo.name"] == "sapo"
    assert (out.values["algo.tau_pos"], out.values["algo.tau_neg"]) == (1.0, 1.5)
    x = _batch()
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _verl_sapo_gradient(x, 1.0, 1.5, _verl_is_weights(x, rollout_is, 1.8) if rollout_is else None)
    assert not torch.allclose(theirs, _verl_sapo_gradient(x, 1.0, 1.05, None))  # the temperature and weights act
    # verl divides each response by its length + 1e-8: a relative 1e-8 / |y_i| apart from minirl's exact mean
    torch.testing.assert_close(ours, theirs, rtol=2e-8, atol=1e-12)


BYPASS = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 2,
          "actor_rollout_ref.actor.ppo_mini_batch_size": 2, "algorithm.rollout_correction.bypass_mode": True}


def _bypassed(x: LossInputs) -> LossInputs:
    """``x`` as the loop hands it to the loss under ``algo.logp_old_source: rollout``: logp_old = logp_rollout."""
    return LossInputs(x.logp, x.logp_rollout, x.logp_rollout, x.advantages, x.mask, x.group_ids)


@pytest.mark.parametrize("rollout_is", [None, "token"])  # ppo_clip computes verl's IS weights for metrics only
def test_verl_bypass_ppo_clip_gradient_is_verls(rollout_is):
    """verl's bypass mode, ``loss_type: ppo_clip`` (its default): vanilla PPO with old = rollout, no IS weight."""
    given = BYPASS | {"actor_rollout_ref.actor.clip_ratio_c": 1.5, "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo"}
    out = from_verl(given | ({"algorithm.rollout_correction.rollout_is": rollout_is} if rollout_is else {}))
    v = out.values
    assert out.objective.startswith("your verl loss") and v["algo.logp_old_source"] == "rollout"
    assert (v["algo.name"], v["algo.is_correction"], v["algo.dual_clip"]) == ("minirl", False, 1.5)  # loss_mode ignored
    x = _bypassed(_batch())
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _verl_gradient(x, 0.2, 0.2, 1.5, None)
    assert not torch.equal(theirs, _verl_gradient(_batch(), 0.2, 0.2, 1.5, None))  # old = rollout matters here
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def _verl_reinforce_gradient(x: LossInputs, rollout_is: str, threshold: float | str, agg: str) -> torch.Tensor:
    """verl 0.9.1's ``compute_policy_loss_reinforce`` under bypass, its IS weights of pi_theta / mu (detached) from
    ``compute_rollout_correction_weights``, aggregated by ``agg_loss``, written as verl does."""
    logp = x.logp.detach().clone().requires_grad_(True)
    current = LossInputs(x.logp, x.logp.detach(), x.logp_rollout, x.advantages, x.mask, x.group_ids)  # old_log_prob=log_prob
    weights = _verl_is_weights(current, rollout_is, threshold)
    pg_losses = -x.advantages[:, None] * logp * weights
    mask = x.mask.to(logp.dtype)
    if agg == "token-mean":
        loss = (pg_losses * mask).sum() / mask.sum()
    else:  # seq-mean-token-mean
        loss = ((pg_losses * mask).sum(dim=-1) / (mask.sum(dim=-1) + 1e-8)).mean()
    (grad,) = torch.autograd.grad(loss, logp)
    return grad


@pytest.mark.parametrize("rollout_is, threshold, agg", [
    ("token", 1.6, "token-mean"), ("sequence", 1.6, "seq-mean-token-mean"),  # verl's bypass_pg_is preset: sequence
    ("token", "0.6_1.6", "token-mean"),  # its bypass_pg_token_icepop preset: a mask
])
def test_verl_bypass_reinforce_gradient_is_verls(rollout_is, threshold, agg):
    given = BYPASS | {"algorithm.rollout_correction.loss_type": "reinforce", "algorithm.rollout_correction.rollout_is": rollout_is,
                      "algorithm.rollout_correction.rollout_is_threshold": threshold, "actor_rollout_ref.actor.loss_agg_mode": agg}
    out = from_verl(given)
    v = out.values
    assert out.objective.startswith("your verl loss") and v["algo.logp_old_source"] == "rollout"
    assert (v["algo.clip"], v["algo.tis_placement"], v["algo.tis_level"], v["algo.tis_cap"]) == (False, "full", rollout_is, 1.6)
    assert "algo.dual_clip" not in v
    x = _bypassed(_batch())
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _verl_reinforce_gradient(x, rollout_is, threshold, agg)
    assert not torch.allclose(theirs, _verl_reinforce_gradient(x, rollout_is, 1e9, agg))  # the bound acts
    # seq-mean-token-mean: verl divides each response by its length + 1e-8
    torch.testing.assert_close(ours, theirs, rtol=2e-8 if agg != "token-mean" else 1e-12, atol=1e-12)


@pytest.mark.parametrize("loss_type, rollout_is", [("ppo_clip", None), ("reinforce", "token")])
def test_verl_bypass_rejection_gradient_is_verls(loss_type, rollout_is):
    """verl's bypass presets with a rejection (bypass_ppo_clip_geo_rs, bypass_pg_geo_rs_token_tis): the rule bounds
    pi_theta/mu_old inside the loss, which drops the rejected tokens' terms and keeps the mini-batch's token count."""
    from minirl.objective import make_objective, with_current_rejection

    given = BYPASS | {"algorithm.rollout_correction.loss_type": loss_type, "algorithm.rollout_correction.rollout_rs": "seq_mean_k1",
                      "algorithm.rollout_correction.rollout_rs_threshold": "0.7_1.3", "actor_rollout_ref.actor.clip_ratio_c": 1e9}
    if rollout_is:
        given |= {"algorithm.rollout_correction.rollout_is": rollout_is, "algorithm.rollout_correction.rollout_is_threshold": 1.6}
    out = from_verl(given)
    assert out.objective.startswith("your verl loss") and out.values["algo.reject"] == "seq_mean_k1"
    cfg = out.config()
    x = _bypassed(_batch())
    current = LossInputs(x.logp, x.logp.detach(), x.logp_rollout, x.advantages, x.mask, x.group_ids)  # verl: pi_theta
    kept = _verl_rejection_mask(current, "seq_mean_k1", "0.7_1.3")
    assert 0 < int(kept.sum()) < int(x.mask.sum())  # the rule rejects some responses of this batch, not all
    logp = x.logp.detach().clone().requires_grad_(True)
    adv = x.advantages[:, None].expand_as(logp)
    if loss_type == "ppo_clip":
        ratio = torch.exp(torch.clamp(logp - x.logp_old, min=-20.0, max=20.0))
        pg_losses = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2))
    else:
        pg_losses = -adv * logp * _verl_is_weights(current, rollout_is, 1.6)  # of the whole response mask
    loss = (pg_losses * kept).sum() / x.mask.sum()  # token-mean over the mini-batch's tokens (batch_num_tokens)
    (theirs,) = torch.autograd.grad(loss, logp)
    micro = SimpleNamespace(size=8, logp_old=x.logp_old, logp_rollout=x.logp_rollout, advantages=x.advantages,
                            mask=x.mask, group_ids=x.group_ids)
    objective = with_current_rejection(cfg.algo, make_objective(cfg.algo, micro))
    ours_logp = x.logp.detach().clone().requires_grad_(True)
    ours_loss, metrics = objective(ours_logp, micro)
    (ours,) = torch.autograd.grad(ours_loss, ours_logp)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    assert float(metrics["rejected_token_frac"]) == pytest.approx(1 - float(kept.sum()) / float(x.mask.sum()))


def test_verl_bypass_without_an_equivalent_is_named():
    for extra in ({"algorithm.rollout_correction.rollout_rs": "token_k1", "algorithm.rollout_correction.rollout_rs_threshold": 2,
                   "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean"},
                  {"algorithm.rollout_correction.loss_type": "reinforce", "algorithm.rollout_correction.rollout_is": "geo"}):
        out = from_verl(BYPASS | extra)
        assert not [key for key in out.values if key.startswith("algo.")] and out.objective.startswith("minirl's MiniRL")
        assert "bypass_mode=True" in out.objective


def test_verl_bypass_reinforce_without_is_weights_is_plain_reinforce():
    """verl's bypass ``loss_type: reinforce`` with no ``rollout_is``: -A log pi_theta on the rollout's samples, unweighted
    (``compute_policy_loss_reinforce`` without weights): MiniRL unclipped with neither factor of its weight."""
    out = from_verl(BYPASS | {"algorithm.rollout_correction.loss_type": "reinforce"})
    v = out.values
    assert out.objective.startswith("your verl loss") and v["algo.logp_old_source"] == "rollout"
    assert (v["algo.clip"], v["algo.is_correction"], v["algo.staleness_weight"]) == (False, False, False)
    x = _bypassed(_batch())
    _, ours = _losses(x, out.config(), batch=8)
    mask = x.mask.to(x.logp.dtype)
    torch.testing.assert_close(ours, -x.advantages[:, None] * mask / mask.sum(), rtol=1e-12, atol=1e-12)


def _verl_rejection_mask(x: LossInputs, option: str, threshold: float | str) -> torch.Tensor:
    """verl 0.9.1's ``compute_rollout_rejection_mask`` for one option, written as verl does."""
    log_ratio = torch.clamp(x.logp_old - x.logp_rollout, min=-20.0, max=20.0)
    stat = {"k1": -log_ratio, "k2": 0.5 * log_ratio**2, "k3": torch.exp(log_ratio) - 1.0 - log_ratio}[option[-2:]]
    mask = x.mask.to(log_ratio.dtype)
    if option.startswith("seq_sum"):
        stat = (stat * mask).sum(dim=-1, keepdim=True)
    elif option.startswith("seq_mean"):
        stat = ((stat * mask).sum(dim=-1) / (mask.sum(dim=-1) + 1e-8)).unsqueeze(-1)  # verl_F.masked_mean
    elif option.startswith("seq_max"):
        stat = stat.masked_fill(~x.mask, float("-inf")).max(dim=-1, keepdim=True).values
    if option.endswith("k1"):
        spec = str(threshold)
        lower, upper = (map(float, spec.split("_", 1)) if "_" in spec else (1 / float(spec), float(spec)))
        keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
    else:
        keep = stat <= float(threshold)
    return x.mask & keep.expand_as(x.mask)


@pytest.mark.parametrize("option, threshold", [("token_k1", 1.5), ("seq_mean_k1", "0.8_1.6"), ("seq_sum_k1", 3.0),
                                               ("seq_mean_k3", 0.15), ("seq_max_k2", 0.5), ("token_k3", 0.2)])
def test_verl_rollout_rs_gradient_is_verls(option, threshold):
    """verl's rejection (``rollout_rs``) with token TIS: the response mask loses the rejected tokens, so
    token-mean divides by the kept ones; the IS weights are of the original mask."""
    given = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 2,
             "actor_rollout_ref.actor.ppo_mini_batch_size": 2, "algorithm.rollout_correction.rollout_is": "token",
             "algorithm.rollout_correction.rollout_rs": option, "algorithm.rollout_correction.rollout_rs_threshold": threshold,
             "actor_rollout_ref.actor.clip_ratio_c": 1e9}
    out = from_verl(given)
    assert out.objective.startswith("your verl loss") and out.values["algo.reject"] == option
    cfg = out.config()
    x = _batch()
    theirs_mask = _verl_rejection_mask(x, option, threshold)
    assert 0 < int(theirs_mask.sum()) < int(x.mask.sum())  # the rule rejects some tokens of this batch, not all
    ours_mask = rejection_keep(x.logp_old, x.logp_rollout, x.mask, rule=cfg.algo.reject, low=cfg.algo.reject_low,
                               high=cfg.algo.reject_high)
    assert torch.equal(ours_mask, theirs_mask)
    kept = LossInputs(x.logp, x.logp_old, x.logp_rollout, x.advantages, ours_mask, x.group_ids)
    _, ours = _losses(kept, cfg, batch=8)
    weights = _verl_is_weights(x, "token", 2.0)
    theirs = _trl_gradient("dapo", LossInputs(x.logp, x.logp_old, x.logp_rollout, x.advantages, theirs_mask, x.group_ids),
                           0.2, 0.2, weights, max_len=6)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rollout_is, threshold", [("token", "0.5_2.0"), ("sequence", 2.0), ("sequence", "0.5_3.0")])
def test_verl_sequence_and_icepop_rollout_is_gradient_is_verls(rollout_is, threshold):
    cfg = from_verl({"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 2,
                     "actor_rollout_ref.actor.ppo_mini_batch_size": 2, "algorithm.rollout_correction.rollout_is": rollout_is,
                     "algorithm.rollout_correction.rollout_is_threshold": threshold,
                     "actor_rollout_ref.actor.clip_ratio_c": 1e9}).config()
    assert (cfg.algo.tis_level, cfg.algo.tis_mode) == (rollout_is, "mask" if isinstance(threshold, str) else "truncate")
    x = _batch()
    _, ours = _losses(x, cfg, batch=8)
    weights = _verl_is_weights(x, rollout_is, threshold)
    assert not torch.equal(weights, _verl_is_weights(x, rollout_is, 1e30))  # the bounds act on this batch
    theirs = _trl_gradient("dapo", x, 0.2, 0.2, weights, max_len=6)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_a_whole_verl_config_dump_lists_only_what_it_turns_on(tmp_path: Path):
    """A full ``ppo_trainer.yaml``-style dump: parameters of subsystems left off, unset values and keys whose
    effect rides on another (a KL coefficient with the KL off) are not noise in the header."""
    dump = {"algorithm": {"adv_estimator": "grpo", "gamma": 1.0, "kl_ctrl": {"type": "fixed", "kl_coef": 0.001},
                          "filter_groups": {"enable": False, "metric": "reward"}},
            "actor_rollout_ref": {"rollout": {"n": 4, "name": "???", "multi_turn": {"format": "hermes"}},
                                  "actor": {"kl_loss_coef": 0.001, "use_kl_loss": False, "qat": {"group_size": 16},
                                            "rollout_n": "${oc.select:actor_rollout_ref.rollout.n,1}",
                                            "my_new_knob": 7}},
            "distillation": {"teacher_key": "teacher"}, "data": {"train_batch_size": 256, "image_key": "images"}}
    (tmp_path / "dump.yaml").write_text(yaml.safe_dump(dump))
    out = from_verl(read_verl([str(tmp_path / "dump.yaml")], []))
    assert sorted(out.not_translated) == ["actor_rollout_ref.actor.my_new_knob=7: not a setting minirl knows how to carry over",
                                          "trainer.total_epochs=30 without total_training_steps: set optim.global_steps "
                                          "(one epoch = training prompts / data.train_batch_size)"]
    assert not any("name='???'" in line for line in out.differs)


def test_verl_yaml_config_is_flattened(tmp_path: Path):
    (tmp_path / "ppo.yaml").write_text("defaults: [ppo_trainer]\nalgorithm:\n  adv_estimator: grpo\n"
                                       "actor_rollout_ref:\n  rollout:\n    n: 16\n")
    v = from_verl(read_verl([str(tmp_path / "ppo.yaml")], ["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=16"])).values
    assert (v["rollout.samples_per_prompt"], v["rollout.prompts_per_step"], v["optim.minibatches_per_step"]) == (16, 32, 2)
    assert v["algo.name"] == "minirl"


def test_verl_epochs_become_global_steps_when_the_data_is_here(tmp_path: Path):
    import datasets

    datasets.Dataset.from_list([{"prompt": "p", "answer": "a"}] * 10).to_parquet(str(tmp_path / "train.parquet"))
    given = {"algorithm.adv_estimator": "grpo", "data.train_files": str(tmp_path / "train.parquet"),
             "data.train_batch_size": 4, "actor_rollout_ref.actor.ppo_mini_batch_size": 2, "trainer.total_epochs": 3,
             "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.5}
    v = from_verl(given).values
    assert v["optim.global_steps"] == 3 * (10 // 4)  # verl's loader drops the last partial batch
    assert v["optim.warmup_updates"] == 6  # half of 6 global steps x N = 2 updates
    assert v["optim.lr_schedule"] == "constant" and any("verl's starts at 0" in line for line in from_verl(given).differs)
    cosine = from_verl(given | {"actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine",
                                "actor_rollout_ref.actor.optim.min_lr_ratio": 0.1}).values
    assert (cosine["optim.lr_schedule"], cosine["optim.min_lr_ratio"]) == ("cosine", 0.1)
    away = from_verl(given | {"data.train_files": str(tmp_path / "elsewhere.parquet")})
    assert "optim.global_steps" not in away.values and any("total_epochs=3" in line for line in away.not_translated)
    # verl's list of train files (gsm8k + MATH in its examples): their rows one after another, all counted
    datasets.Dataset.from_list([{"prompt": "q", "answer": "b"}] * 6).to_parquet(str(tmp_path / "math.parquet"))
    files = [str(tmp_path / "train.parquet"), str(tmp_path / "math.parquet")]
    both = from_verl(given | {"data.train_files": files, "data.val_files": files[:1], "actor_rollout_ref.rollout.n": 4})
    assert (both.values["task.path"], both.values["task.eval_path"]) == (files, files[0])
    assert both.values["optim.global_steps"] == 3 * (16 // 4)
    task = build_task_from_config(both.config().task)
    assert [p.text for p in task.train_prompts()] == ["p"] * 10 + ["q"] * 6
    # fewer rows than a batch: verl makes no step, said; the validation file: all of its rows are evaluated, as verl
    # validates on all of them (or its first val_max_samples)
    small = from_verl(given | {"data.train_batch_size": 64, "actor_rollout_ref.actor.ppo_mini_batch_size": 64})
    assert any("10 training rows < data.train_batch_size=64" in line for line in small.not_translated)
    assert both.values["eval.num_prompts"] == 10
    assert from_verl(given | {"data.val_files": files, "data.val_max_samples": 12}).values["eval.num_prompts"] == 12
    gone = from_verl(given | {"data.val_files": str(tmp_path / "gone.parquet")})
    assert "eval.num_prompts" not in gone.values
    assert any("verl validates on all of its rows" in line for line in gone.differs)


def test_more_prompts_a_step_than_rows_is_said_at_the_start() -> None:
    from minirl.config import load_config
    from minirl.loop import repeated_prompts

    cfg = load_config(None, ["rollout.prompts_per_step=8"])
    assert repeated_prompts(cfg, 8) is None and repeated_prompts(cfg, 0) is None
    assert repeated_prompts(cfg, 5) == ("rollout.prompts_per_step=8 is more than the 5 training prompts: each step "
                                        "holds some of them twice (verl's and TRL's loaders would make no step)")


def test_verls_outcome_estimators_are_minirls_advantages(tmp_path):
    """verl's opo, grpo_passk, gpg, reinforce_plus_plus and the vectorized grpo / rloo as algo.adv_* (their values
    against verl's code: tests/unit/test_algo_advantages.py); what minirl has no form of stays a named blocker."""
    def advantage(estimator, **given):
        return from_verl({"algorithm.adv_estimator": estimator, "actor_rollout_ref.rollout.n": 4, **given})

    v = advantage("opo").values
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"]) == ("length_weighted", False)
    v = advantage("grpo_passk").values
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"]) == ("pass_at_k", True)
    assert advantage("grpo_passk", **{"algorithm.norm_adv_by_std_in_grpo": False}).values["algo.adv_std_normalize"] is False
    v = advantage("gpg").values
    assert (v["algo.adv_nonzero_rescale"], v["algo.adv_std_normalize"]) == (True, False) and "algo.adv_baseline" not in v
    out = advantage("reinforce_plus_plus")
    assert (out.values["algo.adv_baseline"], out.values["algo.adv_whiten"], out.values["algo.adv_std_normalize"]) == (
        "none", True, False)
    assert out.objective.startswith("your verl loss") and not any("KL of that token" in line for line in out.differs)
    assert advantage("grpo_vectorized").values == advantage("grpo").values
    assert advantage("rloo_vectorized").values == advantage("rloo").values
    assert "algo.adv_token_returns" not in out.values  # gamma 1, no KL in the reward: one return per response
    # a discounted return per token, and a per-token KL in the reward: minirl's token-level returns
    out = advantage("reinforce_plus_plus", **{"algorithm.gamma": 0.99})
    assert (out.values["algo.adv_token_returns"], out.values["algo.adv_gamma"]) == (True, 0.99)
    assert not any("gamma" in line for line in out.not_translated)
    kl = {"algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "kl", "algorithm.kl_ctrl.type": "fixed",
          "algorithm.kl_ctrl.kl_coef": 0.01}
    out = advantage("reinforce_plus_plus", **kl)
    assert (out.values["algo.adv_token_returns"], out.values["algo.adv_gamma"], out.values["algo.kl_in_reward_coef"]) == (
        True, 1.0, 0.01)
    assert not any("kl" in line.lower() for line in out.not_translated + out.differs)
    out.config()  # a valid minirl config
    v = advantage("remax").values  # the reward of a greedy completion, each step
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"]) == ("greedy", False) and "algo.adv_token_returns" not in v
    out = advantage("remax", **kl)
    assert out.values["algo.adv_token_returns"] is True and "algo.adv_gamma" not in out.values  # verl's remax: no gamma
    out.config()
    # PPO (verl's default estimator): GAE over a critic, with verl's critic worker settings
    out = advantage("gae", **{"algorithm.gamma": 0.99, "algorithm.lam": 0.95, "critic.optim.lr": 2e-5,
                              "critic.cliprange_value": 0.2, "trainer.critic_warmup": 3, "critic.ppo_epochs": 2,
                              "critic.grad_clip": 0.5, "actor_rollout_ref.model.path": "/m",
                              "critic.model.path": "/m"})
    v = out.values
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"], v["algo.adv_whiten"], v["algo.adv_gamma"],
            v["algo.adv_lambda"]) == ("critic", False, True, 0.99, 0.95)
    assert (v["critic.lr"], v["critic.clip_value_range"], v["critic.warmup_steps"], v["critic.epochs_per_step"],
            v["critic.grad_clip_norm"], v["critic.weight_decay"]) == (2e-5, 0.2, 3, 2, 0.5, 0.01)
    assert "critic.model_path" not in v  # the actor's own path: the policy's starting weights
    assert out.objective.startswith("your verl loss") and not any("critic" in line for line in out.not_translated)
    cfg = out.config()
    assert (cfg.algo.adv_baseline, cfg.critic.warmup_steps) == ("critic", 3)
    # verl's PPO and REINFORCE++ as its examples run them: one response a prompt (rollout.n's default)
    for estimator in ("gae", "reinforce_plus_plus"):
        cfg = from_verl({"algorithm.adv_estimator": estimator, "actor_rollout_ref.model.path": "/m"}).config()
        assert cfg.rollout.samples_per_prompt == 1
    # verl's group estimators with one response a prompt: the group's baseline is 0 (core_algos: mean 0, std 1)
    for estimator, whiten in (("grpo", False), ("grpo_vectorized", False), ("rloo", False), ("opo", False),
                              ("reinforce_plus_plus_baseline", True)):
        cfg = from_verl({"algorithm.adv_estimator": estimator, "actor_rollout_ref.model.path": "/m"}).config()
        assert (cfg.algo.adv_baseline, cfg.algo.adv_std_normalize, cfg.algo.adv_whiten) == ("none", False, whiten)
    # the vectorized forms differ there (rloo_vectorized: 0): minirl's MiniRL needs groups, said with verl's key
    with pytest.raises(ConfigError, match=r"rollout.samples_per_prompt=1: .*\(rollout.samples_per_prompt from "
                                          r"actor_rollout_ref.rollout.n=1; algo.adv_baseline from "
                                          r"algorithm.adv_estimator='rloo_vectorized'\)$"):
        from_verl({"algorithm.adv_estimator": "rloo_vectorized", "actor_rollout_ref.model.path": "/m"}).config()
    out = advantage("gae", **{"critic.model.path": "/elsewhere/critic", "critic.ppo_mini_batch_size": 3,
                              "critic.model.lora_rank": 8, "critic.model.lora_alpha": 16})
    assert out.values["critic.model_path"] == "/elsewhere/critic"
    assert (out.values["critic.lora.rank"], out.values["critic.lora.alpha"], out.values["critic.lora.target_modules"]) == (
        8, 16.0, ["all-linear"])
    assert out.config().critic.lora.rank == 8
    v = advantage("gae", **{"critic.optim.lr_warmup_steps": 5}).values
    assert v["critic.lr_warmup_updates"] == 5
    v = advantage("gae", **{"critic.optim.lr_warmup_steps_ratio": 0.1, "trainer.total_training_steps": 20,
                            "critic.ppo_epochs": 2}).values
    assert v["critic.lr_warmup_updates"] == round(0.1 * 20 * v["optim.minibatches_per_step"] * 2)
    # verl's deprecated global micro-batch is not its mini-batch; a KL coefficient without the KL in the reward is inert
    legacy = advantage("gae", **{"actor_rollout_ref.actor.ppo_micro_batch_size": 2, "algorithm.kl_ctrl.kl_coef": 0.001})
    assert ("actor_rollout_ref.actor.ppo_micro_batch_size=2: verl's deprecated global micro-batch (over all GPUs); give "
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (minirl's optim.micro_batch_sequences)"
            ) in legacy.not_translated
    assert not any("did you mean" in line for line in legacy.not_translated)
    assert ("algorithm.kl_ctrl.kl_coef (algorithm.use_kl_in_reward is off: verl puts no KL in the reward)"
            in legacy.ignored)
    # no total_training_steps: verl gives the critic the actor's total from total_epochs x the data's batches
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"prompt": "q{i}", "answer": "a"}}\n' for i in range(40)))
    v = advantage("gae", **{"critic.optim.lr_warmup_steps_ratio": 0.5, "trainer.total_epochs": 2,
                            "data.train_files": str(data), "data.train_batch_size": 8,
                            "actor_rollout_ref.actor.ppo_mini_batch_size": 8}).values
    assert v["optim.global_steps"] == 10 and v["critic.lr_warmup_updates"] == round(0.5 * 10 * v["optim.minibatches_per_step"])
    assert any("critic.ppo_mini_batch_size=3" in line for line in out.differs)
    assert out.values["critic.loss_aggregation"] == "token_mean"
    v = advantage("gae", **{"critic.loss_agg_mode": "seq-mean-token-mean"}).values
    assert v["critic.loss_aggregation"] == "seq_mean"
    out = advantage("gae", **{"actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm"})
    assert out.values["critic.loss_aggregation"] == "seq_sum_norm" and not any("critic" in x for x in out.not_translated)
    assert any("seq-mean-token-sum-norm" in line and "critic" in line for line in out.differs)
    assert out.config().critic.loss_aggregation == "seq_sum_norm"
    out = advantage("gae", **{"critic.loss_agg_mode": "token-sum"})
    assert any("critic.loss_agg_mode='token-sum'" in line and "critic" in line for line in out.not_translated)
    for estimator in ("optimal_token_baseline", "tir_optimal_token_baseline"):  # with the IS weights in its energies
        out = advantage(estimator, **{"actor_rollout_ref.actor.calculate_sum_pi_squared": True,
                                      "algorithm.rollout_correction.rollout_is": "token"})
        assert (out.values["algo.adv_baseline"], out.values["algo.adv_std_normalize"]) == ("optimal_token", False)
        assert out.values["algo.is_correction"] is True and out.objective.startswith("your verl loss")
        assert out.config().algo.adv_baseline == "optimal_token"
    for estimator, need in (("gdpo", "algorithm.gdpo_reward_keys"),
                            ("magic", "an estimator minirl does not")):
        out = advantage(estimator)
        assert any(f"algorithm.adv_estimator={estimator!r}" in line and need in line for line in out.not_translated)
        assert not out.objective.startswith("your verl loss")


def _verl_gpg_gradient(x: LossInputs, is_weights: torch.Tensor | None) -> torch.Tensor:
    """verl 0.9.1's ``compute_policy_loss_gpg`` with ``agg_loss(token-mean)``, written as verl does."""
    logp = x.logp.detach().clone().requires_grad_(True)
    pg_losses = -logp * x.advantages[:, None]
    if is_weights is not None:
        pg_losses = pg_losses * is_weights
    mask = x.mask.to(logp.dtype)
    (grad,) = torch.autograd.grad((pg_losses * mask).sum() / mask.sum(), logp)
    return grad


@pytest.mark.parametrize("rollout_is", [None, "token"])
def test_verl_gpg_loss_gradient_is_verls(rollout_is):
    """verl's ``policy_loss.loss_mode: gpg``: -A log pi_theta, no clip, token-mean, times the bounded pi_old/mu_old with
    ``rollout_is``: MiniRL unclipped without its pi_theta/pi_old factor, the same gradient at any update."""
    given = {"algorithm.adv_estimator": "gpg", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 2,
             "actor_rollout_ref.actor.ppo_mini_batch_size": 2, "actor_rollout_ref.actor.policy_loss.loss_mode": "gpg"}
    if rollout_is:
        given |= {"algorithm.rollout_correction.rollout_is": rollout_is,
                  "algorithm.rollout_correction.rollout_is_threshold": 1.6}
    out = from_verl(given)
    v = out.values
    assert out.objective.startswith("your verl loss") and out.objective.endswith("the same gradient")
    assert (v["algo.name"], v["algo.clip"], v["algo.aggregation"], v["algo.is_correction"], v["algo.staleness_weight"]) == (
        "minirl", False, "token_mean", rollout_is is not None, False)
    x = _batch()  # pi_theta != pi_old: a later update of the same batch
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _verl_gpg_gradient(x, _verl_is_weights(x, rollout_is, 1.6) if rollout_is else None)
    if rollout_is:
        assert not torch.allclose(theirs, _verl_gpg_gradient(x, None))  # the weights act
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    assert any("loss_mode='gpg'" in line for line in from_verl(given | {
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean-x"}).not_translated)



def _trl_rloo_gradient(x: LossInputs, eps_low: float, eps_high: float) -> torch.Tensor:
    """TRL 1.16 ``RLOOTrainer._compute_loss``, written as TRL does: the response's summed log-ratio, PPO's clip on it,
    the mean over responses."""
    logp = x.logp.detach().clone().requires_grad_(True)
    mask = x.mask.to(logp.dtype)
    logps, old_logps = (logp * mask).sum(1), (x.logp_old * mask).sum(1)
    coef_1 = torch.exp(logps - old_logps)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    loss = -torch.min(coef_1 * x.advantages, coef_2 * x.advantages).mean()
    (grad,) = torch.autograd.grad(loss, logp)
    return grad


def test_trl_rloo_loss_gradient_is_trls():
    out = from_trl({"per_device_train_batch_size": 8, "num_generations": 4, "epsilon_high": 0.28}, trainer="rloo")
    v = out.values
    assert out.source == "TRL RLOO" and out.objective.startswith("your TRL RLOO loss as minirl's algo.name=gspo")
    assert (v["algo.name"], v["algo.sequence_ratio"], v["algo.eps_low"], v["algo.eps_high"]) == ("gspo", "sum", 0.2, 0.28)
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"], v["rollout.samples_per_prompt"]) == ("leave_one_out", False, 4)
    assert (v["algo.kl_in_reward_coef"], v["algo.kl_in_reward_type"]) == (0.05, "k1")  # RLOOConfig's beta, in the reward
    g = torch.Generator().manual_seed(5)
    x = _batch()
    x = LossInputs(x.logp_old + 0.15 * torch.randn(x.logp.shape, generator=g, dtype=x.logp.dtype), x.logp_old,
                   x.logp_rollout, x.advantages, x.mask, x.group_ids)  # summed ratios near 1: some clip, some not
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _trl_rloo_gradient(x, 0.2, 0.28)
    assert (theirs != 0).any() and not torch.equal(theirs, _trl_rloo_gradient(x, 1e9, 1e9))  # the clip acts
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_trl_rloo_advantages_are_trls():
    """TRL 1.16 ``RLOOTrainer._generate_and_score_completions``: the rewards clamped, less beta x the summed k1 KL of
    pi_old to the reference, leave-one-out, then whitened over the batch (``normalize_advantages``), written as TRL
    does, against minirl's step with the translated config."""
    from minirl.dynamic_sampling import Sampled
    from minirl.loop import penalized_advantages
    from minirl.types import Batch

    out = from_trl({"per_device_train_batch_size": 8, "num_generations": 4, "beta": 0.1, "normalize_advantages": True,
                    "reward_clip_range": [-1.0, 2.0]})  # RLOO-only keys: a `trl rloo` config
    assert out.source == "TRL RLOO" and out.values["algo.reward_clip_range"] == [-1.0, 2.0]
    g = torch.Generator().manual_seed(2)
    rewards = torch.randn(8, generator=g, dtype=torch.float64) * 2
    old, ref = (-torch.rand(8, 5, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.arange(5)[None, :] < torch.tensor([5, 3, 4, 1, 5, 2, 5, 4])[:, None]
    kl = ((old - ref) * mask).sum(-1)
    shaped = rewards.clamp(min=-1.0, max=2.0) - 0.1 * kl
    grouped = shaped.view(-1, 4)
    advantages = (shaped - ((grouped.sum(1, keepdim=True) - grouped) / 3).view(-1))
    std = torch.sqrt(torch.nanmean((advantages - torch.nanmean(advantages)) ** 2) * 8 / 7)
    trl = (advantages - torch.nanmean(advantages)) / (std + 1e-4)

    batch = Batch(torch.zeros(8, 6, dtype=torch.long), torch.ones(8, 6, dtype=torch.bool), mask, torch.zeros(8, 5),
                  torch.zeros(8, dtype=torch.float64), torch.arange(8) // 4, logp_old=old, logp_ref=ref)
    sampled = Sampled(prompts=[0, 1], completions=[SimpleNamespace(completion_ids=[7] * 5) for _ in range(8)],
                      rewards=rewards, reward_stats={}, columns=[], generated_tokens=40)
    ours, _ = penalized_advantages(SimpleNamespace(cfg=out.config(), kl_control={}), sampled, batch)
    torch.testing.assert_close(ours.advantages, trl, rtol=1e-12, atol=1e-12)


def test_which_trl_trainer_a_config_is():
    assert from_trl({"num_generations": 4, "per_device_train_batch_size": 8}).source == "TRL"
    assert from_trl({"num_generations": 4, "per_device_train_batch_size": 8, "normalize_advantages": False}).source == "TRL RLOO"
    with pytest.raises(ConfigError, match=r"^normalize_advantages: RLOOConfig settings in a `trl grpo` config; translate "
                                          r"it with `minirl config from-trl rloo FILE`$"):
        from_trl({"normalize_advantages": True}, trainer="grpo")
    with pytest.raises(ConfigError, match="minirl translates `trl grpo` and `trl rloo` configs"):
        from_trl({}, trainer="ppo")
    out = from_trl({"num_generations": 4, "per_device_train_batch_size": 8, "loss_type": "grpo", "scale_rewards": "batch"},
                   trainer="rloo")  # GRPO's loss options: TRL's RLOOConfig has none of them
    assert any(line.startswith("loss_type='grpo': not a setting") for line in out.not_translated)
    assert any(line.startswith("scale_rewards='batch': not a setting") for line in out.not_translated)
    assert out.values["rollout.samples_per_prompt"] == 4 and from_trl({"per_device_train_batch_size": 8},
                                                                      trainer="rloo").values["rollout.samples_per_prompt"] == 2


def _verl_gdpo(parts_BK: torch.Tensor, weights: torch.Tensor, index: list[int], lengths: torch.Tensor) -> torch.Tensor:
    """verl 0.9's ``compute_gdpo_outcome_advantage``: each key's ``compute_grpo_outcome_advantage`` (group mean and
    unbiased std, eps 1e-6), their weighted sum, ``masked_whiten`` over the response tokens; one value per row."""
    mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).to(parts_BK.dtype)
    total = torch.zeros_like(mask)
    for k in range(parts_BK.shape[1]):
        scores = parts_BK[:, k].clone()
        groups: dict[int, list[int]] = {}
        for row, gid in enumerate(index):
            groups.setdefault(gid, []).append(row)
        for rows in groups.values():
            values = parts_BK[rows, k]
            scores[rows] = (values - values.mean()) / (values.std() + 1e-6)
        total = total + weights[k] * scores[:, None] * mask
    mean = (total * mask).sum() / (mask.sum() + 1e-8)
    variance = ((total - mean) ** 2 * mask).sum() / (mask.sum() + 1e-8) * mask.sum() / (mask.sum() - 1)
    return ((total - mean) * torch.rsqrt(variance + 1e-8) * mask)[:, 0]


def test_verls_gdpo_is_keyed_reward_entries_and_a_token_whitened_sum():
    """verl's ``gdpo``: one reward entry per ``gdpo_reward_keys`` key reading your compute_score's dict, with its
    weight; each normalised within its group, the weighted sum whitened over the batch's tokens (``adv_whiten``)."""
    from minirl.algo.variants.baselines import token_whiten
    from minirl.algo.variants.gdpo import decoupled_sum

    given = {"algorithm.adv_estimator": "gdpo", "actor_rollout_ref.rollout.n": 4, "custom_reward_function.path": "r.py",
             "algorithm.gdpo_reward_keys": ["format_reward", "accuracy_reward"], "algorithm.gdpo_reward_weights": [0.3, 0.7]}
    out = from_verl(given)
    assert out.values["task.reward_functions"] == [
        {"function": "r.py:compute_score", "key": "format_reward", "weight": 0.3, "name": "format_reward"},
        {"function": "r.py:compute_score", "key": "accuracy_reward", "weight": 0.7, "name": "accuracy_reward"}]
    assert "task.reward_function" not in out.values and out.objective.startswith("your verl loss")
    assert (out.values["algo.multi_objective_aggregation"], out.values["algo.adv_whiten"]) == ("normalize_then_sum", True)
    assert any("once per key" in line for line in out.differs)
    out.config()
    unweighted = from_verl({**given, "algorithm.gdpo_reward_weights": None}).values["task.reward_functions"]
    assert [e["weight"] for e in unweighted] == [1.0, 1.0]
    no_std = from_verl({**given, "algorithm.norm_adv_by_std_in_grpo": False})
    assert any("norm_adv_by_std_in_grpo" in line for line in no_std.not_translated)
    with pytest.raises(ConfigError, match="one weight per key"):
        from_verl({**given, "algorithm.gdpo_reward_weights": [1.0]})
    # the advantages, against verl's written out
    g = torch.Generator().manual_seed(1)
    parts = torch.randint(0, 4, (12, 2), generator=g).to(torch.float64)
    weights = torch.tensor([0.3, 0.7], dtype=torch.float64)
    lengths = torch.randint(1, 9, (12,), generator=g)
    ours = token_whiten(decoupled_sum(parts.view(3, 4, 2), weights).reshape(-1), lengths)
    theirs = _verl_gdpo(parts, weights, [i // 4 for i in range(12)], lengths)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-9)


def test_trl_dataset_mixture_missing_data_and_rewards_and_the_kl_correction(tmp_path: Path):
    """``trl grpo``'s ``datasets:`` list (one entry: task.path with its config and split); a run with no dataset or no
    reward, which ``trl grpo`` refuses, is said; TRL's bias-corrected KL (its default) is minirl's unbiased KL; a
    warm-up ratio's steps round up, as transformers rounds them."""
    from minirl.peers import from_trl

    base = {"reward_funcs": ["accuracy_reward"], "num_generations": 4, "per_device_train_batch_size": 4}
    one = from_trl(base | {"datasets": [{"path": str(tmp_path), "name": "main", "split": "train[:90%]"}]})
    assert (one.values["task.path"], one.values["task.dataset_config"], one.values["task.train_split"]) == \
        (str(tmp_path), "main", "train[:90%]")
    mixture = from_trl(base | {"datasets": [{"path": "a"}, {"path": "b"}]})
    assert any("a mixture of 2 datasets" in line for line in mixture.not_translated)
    assert any("no dataset_name or datasets" in line for line in mixture.differs)
    bare = from_trl({"dataset_name": str(tmp_path)})
    assert any(line.startswith("no reward_funcs: `trl grpo` refuses to run") for line in bare.differs)
    assert not any("refuses" in line for line in from_trl(base | {"dataset_name": str(tmp_path)}).differs)
    assert not any("refuses" in line for line in from_trl({}, script=False).differs)  # a GRPOConfig from Python
    kl = from_trl(base | {"dataset_name": str(tmp_path), "beta": 0.04, "loss_type": "grpo"})
    assert kl.values["algo.kl_loss_unbiased"] is True
    assert any("beta with loss_type='grpo'" in line for line in kl.differs)
    warm = from_trl(base | {"dataset_name": str(tmp_path), "max_steps": 10, "warmup_ratio": 0.05}).values
    assert warm["optim.warmup_updates"] == 1  # ceil(0.5)
    evaluated = from_trl(base | {"dataset_name": str(tmp_path), "eval_strategy": "steps", "eval_steps": 5}).values
    assert evaluated["eval.samples_per_prompt"] == 4  # TRL: num_generations_eval, else num_generations
    assert any("TRL trains on all of them" in line for line in from_trl(base | {"dataset_name": str(tmp_path)}).differs)
    said = from_trl(base | {"dataset_name": str(tmp_path), "shuffle_dataset": False, "dtype": "bfloat16",
                            "output_dir": "out/run1"}).differs
    assert [any(line.startswith(start) for line in said) for start in ("shuffle_dataset=False", "dtype='bfloat16'",
                                                                       "output_dir='out/run1'")] == [True] * 3
    lora = from_trl(base | {"dataset_name": str(tmp_path), "use_peft": True})  # TRL's lora_dropout 0.05, kept by TRL
    assert any(line.startswith("lora_dropout=0.05: RL runs without dropout here") for line in lora.differs)
