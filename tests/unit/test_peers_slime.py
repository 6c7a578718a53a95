"""slime's launch scripts as minirl configs (``minirl.peers.slime``): the script reader on slime's own example shape,
the translated settings, and each loss's gradient against slime's ``loss.py`` / ``ppo_utils.py`` written out."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import torch

from minirl.algo import LossInputs
from minirl.config import ConfigError
from minirl.peers import from_slime, read_slime
from minirl.peers.common import Unresolved
from minirl.peers.slime import parse_flags
from minirl.tasks import slime_rewards
from minirl.tasks.reward_functions import Sample, make_reward_fn
from tests.unit.test_peers import _batch, _losses

# slime's scripts/run-qwen3-4B.sh (THUDM/slime at 05a0752), the RL-relevant arrays verbatim, and its preamble
SCRIPT = """\
#!/bin/bash

# for rerun the task
pkill -9 sglang
sleep 3
ray stop --force
pkill -9 ray
pkill -9 python
sleep 3

set -ex

export PYTHONBUFFERED=16

NVLINK_COUNT=$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l)
if [ "$NVLINK_COUNT" -gt 0 ]; then
    HAS_NVLINK=1
else
    HAS_NVLINK=0
fi
echo "HAS_NVLINK: $HAS_NVLINK (detected $NVLINK_COUNT NVLink references)"

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/qwen3-4B.sh"

CKPT_ARGS=(
   --hf-checkpoint /root/Qwen3-4B
   #--hf-checkpoint /root/Qwen3-4B-FP8
   --ref-load /root/Qwen3-4B_torch_dist
   --load /root/Qwen3-4B_slime/
   --save /root/Qwen3-4B_slime/
   --save-interval 20
)

ROLLOUT_ARGS=(
   --prompt-data /root/dapo-math-17k/dapo-math-17k.jsonl
   --input-key prompt
   --label-key label
   --apply-chat-template
   --rollout-shuffle
   --rm-type deepscaler
   --num-rollout 3000
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   --rollout-max-response-len 8192
   --rollout-temperature 0.8

   --global-batch-size 256
   --balance-data
)

EVAL_ARGS=(
   --eval-interval 20
   --eval-prompt-data aime /root/aime-2024/aime-2024.jsonl
   --n-samples-per-eval-prompt 16
   --eval-max-response-len 16384
   --eval-top-p 0.7
)

PERF_ARGS=(
   --tensor-model-parallel-size 2
   --sequence-parallel
   --pipeline-model-parallel-size 1
   --context-parallel-size 1
   --expert-model-parallel-size 1
   --expert-tensor-parallel-size 1

   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1

   # --micro-batch-size 1
   --use-dynamic-batch-size
   --max-tokens-per-gpu 9216
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --use-kl-loss
   --kl-loss-coef 0.00
   --kl-loss-type low_var_kl
   --entropy-coef 0.00
   --eps-clip 0.2
   --eps-clip-high 0.28
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-6
   --lr-decay-style constant
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.98
)

WANDB_ARGS=(
   # --use-wandb
   # --wandb-project slime-dev
   # --wandb-group qwen3-4B-test
   # --wandb-key ${WANDB_KEY}
)

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 2
   --sglang-mem-fraction-static 0.7
   --sglang-cuda-graph-bs 1 2 4 8 $(seq 16 8 256)
)

MISC_ARGS=(
   # default dropout in megatron is 0.1
   --attention-dropout 0.0
   --hidden-dropout 0.0
   # should be good for model performance
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   # need to comment this when using model with MLA
   --attention-backend flash
)

# launch the master node of ray in container
export MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ray start --head --node-ip-address ${MASTER_ADDR} --num-gpus 8 --disable-usage-stats --dashboard-host=0.0.0.0 --dashboard-port=8265

# Build the runtime environment JSON with proper variable substitution
RUNTIME_ENV_JSON="{
  \\"env_vars\\": {
    \\"PYTHONPATH\\": \\"/root/Megatron-LM/\\",
    \\"CUDA_DEVICE_MAX_CONNECTIONS\\": \\"1\\",
    \\"NCCL_NVLS_ENABLE\\": \\"${HAS_NVLINK}\\"
  }
}"

ray job submit --address="http://127.0.0.1:8265" \\
   --runtime-env-json="${RUNTIME_ENV_JSON}" \\
   -- python3 train.py \\
   --actor-num-nodes 1 \\
   --actor-num-gpus-per-node 8 \\
   --colocate \\
   ${MODEL_ARGS[@]} \\
   ${CKPT_ARGS[@]} \\
   ${ROLLOUT_ARGS[@]} \\
   ${OPTIMIZER_ARGS[@]} \\
   ${GRPO_ARGS[@]} \\
   ${WANDB_ARGS[@]} \\
   ${PERF_ARGS[@]} \\
   ${EVAL_ARGS[@]} \\
   ${SGLANG_ARGS[@]} \\
   ${MISC_ARGS[@]}
"""


def test_slimes_example_script_reads_as_its_train_py_flags(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("WANDB_KEY", raising=False)
    (tmp_path / "run.sh").write_text(SCRIPT)
    flags = read_slime([str(tmp_path / "run.sh")], ["--lr", "2e-6", "--use-tis"])  # words after the script win
    assert flags["$sourced"] == ["MODEL_ARGS"]  # set in the sourced model file: listed, not an error
    assert flags["rollout-batch-size"] == 32 and flags["n-samples-per-prompt"] == 8 and flags["global-batch-size"] == 256
    assert flags["apply-chat-template"] is True and flags["colocate"] is True and flags["use-tis"] is True
    assert flags["hf-checkpoint"] == "/root/Qwen3-4B" and flags["lr"] == 2e-6  # the commented-out FP8 line is skipped
    assert flags["eval-prompt-data"] == ["aime", "/root/aime-2024/aime-2024.jsonl"]  # nargs
    assert flags["sglang-cuda-graph-bs"][:4] == [1, 2, 4, 8] and "micro-batch-size" not in flags
    assert "wandb-key" not in flags and "runtime-env-json" not in flags  # before `-- python3 train.py`: ray's


def test_words_a_script_leaves_unset_stay_unresolved_until_read(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("DATA_DIR", raising=False)
    (tmp_path / "run.sh").write_text('ARGS=(\n  --prompt-data ${DATA_DIR}/train.jsonl\n  --rollout-batch-size 4\n)\n'
                                     'python3 train_async.py "${ARGS[@]}" --save $HOME/ckpt\n')
    flags = read_slime([str(tmp_path / "run.sh")], [])
    assert isinstance(flags["prompt-data"], Unresolved) and flags["save"] == f"{Path.home()}/ckpt"
    with pytest.raises(ConfigError, match=r"run.sh:1: prompt-data uses a variable the script does not set .* give "
                                          r"--prompt-data \.\.\. after the script"):
        from_slime(flags | {"global-batch-size": 4})
    assert flags["$script"] == "train_async.py"
    flags |= {"prompt-data": "p.jsonl", "global-batch-size": 8, "n-samples-per-prompt": 2}
    assert from_slime(flags).config().rollout.async_steps == 1  # one step off
    late = from_slime({**flags, "update-weights-interval": 2})
    assert any("--update-weights-interval 2" in line for line in late.not_translated)
    (tmp_path / "none.sh").write_text("echo hello\n")
    with pytest.raises(ConfigError, match=r"no `python3 train\.py"):
        read_slime([str(tmp_path / "none.sh")], [])
    with pytest.raises(ConfigError, match="--rollout-batch-size is missing"):
        from_slime({"lr": 1e-6})


def test_slimes_fsdp_backend_and_router_flags(tmp_path: Path):
    """From slime's run-qwen3-30B-A3B-fsdp.sh and run-qwen3-30B-A3B-fp8-train-infer.sh: the FSDP backend's gradient
    checkpointing is carried over, its attention choice and slime's router are ignored, fp8 training is named."""
    out = from_slime({**BASE, "train-backend": "fsdp", "gradient-checkpointing": True,
                      "attn-implementation": "flash_attention_3", "use-slime-router": True, "fp8-format": "e4m3"})
    assert out.values["optim.gradient_checkpointing"] is True
    assert {"--train-backend", "--attn-implementation", "--use-slime-router"} <= set(out.ignored)
    assert any(line.startswith("--fp8-format") for line in out.not_translated)


def test_slimes_fp16_is_the_fp16_trainer():
    assert from_slime(BASE).values["optim.precision"] == "bf16"
    fp16 = from_slime({**BASE, "fp16": True})
    assert fp16.values["optim.precision"] == "fp16" and fp16.config().optim.precision == "fp16"
    assert not any("fp16" in line for line in fp16.not_translated)
    o = fp16.config().optim  # Megatron-LM's DynamicGradScaler defaults, not torch's
    assert (o.loss_scale_initial, o.loss_scale_window_updates, o.loss_scale_min, o.loss_scale_hysteresis) == (2.0**32, 1000, 1.0, 2)
    given = from_slime({**BASE, "fp16": True, "initial-loss-scale": "65536", "loss-scale-window": 500, "hysteresis": 1}).config()
    assert (given.optim.loss_scale_initial, given.optim.loss_scale_window_updates, given.optim.loss_scale_hysteresis) == (2.0**16, 500, 1)
    static = from_slime({**BASE, "fp16": True, "loss-scale": 0.5})
    assert (static.config().optim.loss_scale_initial, static.config().optim.loss_scale_min) == (0.5, 0.5)
    assert any(line.startswith("--loss-scale 0.5: Megatron holds this static scale") for line in static.differs)
    bf16 = from_slime({**BASE, "initial-loss-scale": 1024})
    assert "optim.loss_scale_initial" not in bf16.values and not any("loss-scale" in line for line in bf16.not_translated)
    with pytest.raises(ConfigError, match=r"slime setting --hysteresis 1.5: expected an integer"):
        from_slime({**BASE, "fp16": True, "hysteresis": 1.5})


def test_slimes_cpu_offload_flags_are_the_cpu_offload():
    """The FSDP backend's --fsdp-cpu-offload is optim.cpu_offload; Megatron's --optimizer-cpu-offload becomes it too,
    said (minirl's keeps the parameters in CPU memory as well); slime's between-phase --offload stays ignored."""
    assert from_slime(BASE).values["optim.cpu_offload"] is False
    fsdp = from_slime({**BASE, "train-backend": "fsdp", "fsdp-cpu-offload": True})
    assert fsdp.values["optim.cpu_offload"] is True and fsdp.config().optim.cpu_offload
    assert not any("offload" in line for line in fsdp.differs + fsdp.not_translated)
    megatron = from_slime({**BASE, "optimizer-cpu-offload": True, "offload": True})
    assert megatron.values["optim.cpu_offload"] is True
    assert next(line for line in megatron.differs if "offload" in line).startswith("--optimizer-cpu-offload:")
    assert "--offload" in megatron.ignored and "--optimizer-cpu-offload" not in megatron.ignored


def test_slimes_lora_presets_regexes_and_rates():
    """slime's Megatron LoRA (``--use-lora``): its default preset (dense_language) in transformers' module names, its
    own learning rate and weight decay replacing --lr and --weight-decay; Megatron regexes mapped by their projection;
    the routed-expert presets named not translated."""
    v = from_slime(BASE | {"use-lora": True, "lora-learning-rate": 1e-5, "weight-decay": 0.1}).values
    assert (v["model.lora.rank"], v["model.lora.alpha"], v["optim.lr"], v["optim.weight_decay"]) == (64, 128.0, 1e-5, 0.0)
    assert v["model.lora.target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    regex = from_slime(BASE | {"use-lora": True, "lora-target-modules": [r"(?:^|\.)self_attention\.linear_qkv$", "router"]})
    assert regex.values["model.lora.target_modules"] == ["q_proj", "k_proj", "v_proj"]
    assert any("--lora-target-modules router" in line for line in regex.not_translated)
    experts = from_slime(BASE | {"use-lora": True, "lora-target-preset": "moe_routed_experts"})  # the fused tensors
    assert (experts.values["model.lora.target_modules"], experts.values["model.lora.target_parameters"]) == (
        [], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    assert any("moe_routed_experts" in line and "one adapter per routed expert" in line for line in experts.differs)
    everything = from_slime(BASE | {"use-lora": True, "lora-target-preset": "moe_language_all"}).values
    assert everything["model.lora.target_modules"][:4] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert "shared_expert.gate_proj" in everything["model.lora.target_modules"]
    assert everything["model.lora.target_parameters"] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    shared = from_slime(BASE | {"use-lora": True, "lora-target-preset": "moe_language"}).values
    assert "shared_experts.down_proj" in shared["model.lora.target_modules"] and "model.lora.target_parameters" not in shared
    dense = from_slime(BASE | {"use-lora": True})  # dense_language: on an MoE checkpoint peft reaches the experts too
    assert any("peft also adapts the routed experts" in line for line in dense.differs)
    hybrid = from_slime(BASE | {"use-lora": True, "lora-target-preset": "hybrid_language"})
    assert "model.lora.rank" not in hybrid.values and any("hybrid_language" in line for line in hybrid.not_translated)
    assert from_slime(BASE | {"use-lora": True, "actor-num-gpus-per-node": 4}).config().cluster.trainer_ranks == 4  # ranks


def test_flags_take_no_value_one_or_several():
    assert parse_flags(["python3", "--a", "--b", "1", "--c", "x", "y", "--d=2", "--e", "-1"]) == {
        "a": True, "b": 1, "c": ["x", "y"], "d": 2, "e": -1}


def test_the_example_translates_to_its_run(tmp_path: Path):
    (tmp_path / "run.sh").write_text(SCRIPT)
    out = from_slime(read_slime([str(tmp_path / "run.sh")], []))
    v = out.values
    assert (v["rollout.prompts_per_step"], v["rollout.samples_per_prompt"], v["optim.minibatches_per_step"]) == (32, 8, 1)
    assert (v["optim.global_steps"], v["optim.lr"], v["optim.adam_beta2"], v["optim.weight_decay"]) == (3000, 1e-6, 0.98, 0.1)
    assert (v["rollout.temperature"], v["eval.top_p"], v["eval.temperature"], v["eval.max_new_tokens"]) == (0.8, 0.7, 0.8, 16384)
    assert (v["task.prompt_column"], v["task.answer_column"], v["task.chat_prompts"]) == ("prompt", "label", True)
    assert v["task.reward_functions"] == [{"function": "minirl.tasks.slime_rewards:rm_hub",
                                           "kwargs": {"rm_type": "deepscaler", "metadata_key": "metadata"}}]
    assert (v["optim.micro_batch_max_tokens"], v["optim.gradient_checkpointing"], v["optim.precision"]) == (9216, True, "bf16")
    assert (v["algo.name"], v["algo.eps_low"], v["algo.eps_high"], v["algo.is_correction"]) == ("grpo", 0.2, 0.28, False)
    assert "algo.kl_coef" not in v  # --kl-loss-coef 0.00: the KL only logged
    assert (v["run.output_dir"], v["run.name"], v["run.resume"], v["checkpoint.every_steps"]) == ("/root", "Qwen3-4B_slime", "auto", 20)
    assert (v["eval.every_steps"], v["task.eval_path"], v["cluster.trainer_ranks"]) == (20, "/root/aime-2024/aime-2024.jsonl", 8)
    assert out.objective == "your slime loss as minirl's algo.name=grpo, the same gradient"
    assert any("math-verify" in line for line in out.differs)
    assert "--sequence-parallel" in out.ignored and "--sglang-mem-fraction-static" in out.ignored
    assert [line.split(":")[0] for line in out.not_translated] == ["--ref-load /root/Qwen3-4B_torch_dist"], out.not_translated
    out.config()  # loads


def test_batch_arithmetic_and_its_errors():
    base = {"rollout-batch-size": 8, "n-samples-per-prompt": 4}
    assert from_slime(base | {"global-batch-size": 8}).values["optim.minibatches_per_step"] == 4
    assert from_slime(base | {"num-steps-per-rollout": 2}).values["optim.minibatches_per_step"] == 2
    # neither: Megatron's micro-batch x data-parallel ranks (8 GPUs / TP 2 = 4 ranks)
    assert from_slime(base | {"tensor-model-parallel-size": 2}).values["optim.minibatches_per_step"] == 8
    with pytest.raises(ConfigError, match="must divide the rollout's samples"):
        from_slime(base | {"global-batch-size": 12})
    out = from_slime(base | {"num-epoch": 2, "lr-decay-style": "cosine", "min-lr": 1e-7, "lr": 1e-6,
                             "lr-warmup-iters": 5, "partial-rollout": True, "rollout-stop": ["</answer>", "###"]})
    v = out.values
    assert (v["optim.lr_schedule"], v["optim.min_lr_ratio"], v["optim.warmup_updates"]) == ("cosine", pytest.approx(0.1), 5)
    assert v["task.stop_strings"] == ["</answer>", "###"]
    assert (v["rollout.partial_rollout"], v["rollout.partial_pool_prompts"], v["rollout.partial_mask_stale"]) == (True, 8, False)
    assert any("--num-rollout / --num-epoch" in line for line in out.not_translated)  # no data file to count here
    assert any("--rollout-shuffle unset" in line for line in from_slime(base | {"prompt-data": "p.jsonl"}).differs)


def test_slimes_partial_rollout_is_minirls_with_its_over_sampling_and_mask():
    """``--partial-rollout`` with DAPO's filter and ``--over-sampling-batch-size`` 16 (prompts drawn at a time),
    ``--mask-offpolicy-in-partial-rollout``; under ``train_async.py`` the same pool, sampled beside the update."""
    given = {"rollout-batch-size": 8, "n-samples-per-prompt": 4, "over-sampling-batch-size": 16, "partial-rollout": True,
             "mask-offpolicy-in-partial-rollout": True,
             "dynamic-sampling-filter-path": "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"}
    out = from_slime(given)
    r = out.config().rollout
    assert (r.partial_rollout, r.partial_pool_prompts, r.partial_mask_stale, r.filter_groups) == (True, 16, True, True)
    assert any(line.startswith("--partial-rollout: slime aborts the requests") for line in out.differs)
    async_run = from_slime({**given, "$script": "train_async.py"})
    r = async_run.config().rollout
    assert (r.async_steps, r.partial_rollout, r.partial_pool_prompts, r.partial_mask_stale) == (1, True, 16, True)
    assert not any("partial" in line for line in async_run.not_translated)
    assert "rollout.partial_mask_stale" not in from_slime({"rollout-batch-size": 8, "mask-offpolicy-in-partial-rollout": True}).values


def test_dynamic_sampling_r3_and_opsm():
    out = from_slime({"rollout-batch-size": 8, "n-samples-per-prompt": 4, "global-batch-size": 32,
                      "over-sampling-batch-size": 16, "use-rollout-routing-replay": True, "use-opsm": True,
                      "opsm-delta": 1e-3, "use-rollout-logprobs": True,
                      "dynamic-sampling-filter-path": "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"})
    v = out.values
    assert (v["rollout.filter_groups"], v["rollout.filter_groups_prompts_per_round"]) == (True, 16)
    assert (v["moe.routing_replay"], v["algo.opsm_threshold"], v["algo.logp_old_source"]) == ("R3", 1e-3, "rollout")
    assert not any("OPSM" in line or "use-opsm" in line for line in out.differs)  # mu_old is slime's pi_old here
    assert from_slime({"rollout-batch-size": 8, "use-routing-replay": True}).values["moe.routing_replay"] == "R2"


# ------------------------------------------------------------------ the losses' gradients, against slime's written out


def _slime_gradient(x: LossInputs, *, eps: tuple[float, float] = (0.1, 0.3), per_token: bool = False,
                    tis: tuple[float, float] | None = None, eps_c: float | None = None, kind: str = "ppo") -> torch.Tensor:
    """slime's ``policy_loss_function`` for one optimizer step (``compute_policy_loss`` / ``compute_cispo_loss`` /
    GSPO's ``compute_gspo_kl`` / REINFORCE, then the TIS weight, then ``sum_of_sample_mean`` or the token mean)."""
    logp = x.logp.detach().clone().requires_grad_(True)
    mask = x.mask.to(logp.dtype)
    adv = x.advantages[:, None].expand_as(logp)
    ppo_kl = x.logp_old - logp
    if kind == "gspo":
        ppo_kl = ((ppo_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1))[:, None].expand_as(logp)
    ratio = (-ppo_kl).exp()
    if kind == "reinforce":
        pg_losses = -adv.detach() * logp
    elif kind == "cispo":
        pg_losses = -torch.clamp(ratio, 1 - eps[0], 1 + eps[1]).detach() * adv * logp
    else:
        pg_losses = torch.maximum(-ratio * adv, -ratio.clamp(1 - eps[0], 1 + eps[1]) * adv)
        if eps_c is not None:
            pg_losses = torch.where(adv < 0, torch.min(-eps_c * adv, pg_losses), pg_losses)
    if tis is not None:  # vanilla_tis_function: clamp(exp(train - rollout), low, high), detached
        pg_losses = pg_losses * torch.exp(x.logp_old - x.logp_rollout).clamp(min=tis[0], max=tis[1])
    if per_token:
        loss = (pg_losses * mask).sum() / mask.sum()
    else:
        loss = ((pg_losses * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    (grad,) = torch.autograd.grad(loss, logp)
    return grad


BASE = {"rollout-batch-size": 2, "n-samples-per-prompt": 4, "global-batch-size": 8, "eps-clip": 0.1, "eps-clip-high": 0.3}
CASES = {
    "ppo-sample-mean-tis-dual": ({"use-tis": True, "tis-clip": 1.5, "tis-clip-low": 0.5, "eps-clip-c": 1.3},
                                 {"tis": (0.5, 1.5), "eps_c": 1.3}),
    "ppo-token-mean-tis": ({"use-tis": True, "calculate-per-token-loss": True}, {"tis": (0.0, 2.0), "per_token": True}),
    "ppo-token-mean-dual": ({"calculate-per-token-loss": True, "eps-clip-c": 1.3}, {"per_token": True, "eps_c": 1.3}),
    "reinforce-tis": ({"pg-loss-type": "reinforce", "use-tis": True}, {"tis": (0.0, 2.0), "kind": "reinforce"}),
    "reinforce-token-mean": ({"pg-loss-type": "reinforce", "calculate-per-token-loss": True},
                             {"kind": "reinforce", "per_token": True}),
    "cispo-token-mean-tis": ({"advantage-estimator": "cispo", "calculate-per-token-loss": True, "use-tis": True,
                              "eps-clip": 1.0, "eps-clip-high": 0.5}, {"kind": "cispo", "per_token": True,
                                                                       "eps": (1.0, 0.5), "tis": (0.0, 2.0)}),
    "gspo": ({"advantage-estimator": "gspo", "eps-clip": 0.05, "eps-clip-high": 0.08}, {"kind": "gspo", "eps": (0.05, 0.08)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_loss_has_slimes_gradient(case):
    given, written = CASES[case]
    out = from_slime(BASE | given)
    assert out.objective.startswith("your slime loss"), out.objective
    x = _batch()
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _slime_gradient(x, **written)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    if "tis" in written:  # the weights act on this batch
        assert not torch.allclose(theirs, _slime_gradient(x, **{**written, "tis": None}))
    low, high = written.get("eps", (0.1, 0.3))
    if written.get("kind", "ppo") != "reinforce":  # the clip's upper end acts (and its lower one, but for GSPO's rows)
        assert not torch.allclose(theirs, _slime_gradient(x, **{**written, "eps": (low, low)}))
    if written.get("kind", "ppo") in ("ppo", "cispo"):
        assert not torch.allclose(theirs, _slime_gradient(x, **{**written, "eps": (high, high)}))


@pytest.mark.parametrize("given, blocker", [
    ({"advantage-estimator": "magic"}, "an estimator minirl does not know"),
    ({"advantage-estimator": "cispo"}, "--calculate-per-token-loss unset"),
    ({"advantage-estimator": "gspo", "use-tis": True}, "GSPO's sequence loss"),
    ({"advantage-estimator": "gspo", "calculate-per-token-loss": True}, "--calculate-per-token-loss"),
    ({"advantage-estimator": "reinforce_plus_plus_baseline", "normalize-advantages": True, "kl-coef": 0.01,
      "kl-loss-type": "k4"},
     "--kl-coef 0.01, --kl-loss-type k4"),
    ({"use-kl-loss": True, "kl-loss-coef": 0.01, "kl-loss-type": "k4"}, "--kl-loss-type k4"),
    ({"custom-tis-function-path": "my.tis"}, "--custom-tis-function-path my.tis"),
])
def test_losses_minirl_lacks_train_minirl_and_say_so(given, blocker):
    out = from_slime(BASE | given)
    assert out.objective.startswith("minirl's MiniRL") and not any(key.startswith("algo.") for key in out.values)
    assert any(blocker in line for line in out.not_translated), out.not_translated


def test_slimes_unbiased_kl_is_minirls():
    """``--use-unbiased-kl``: the KL loss's estimate weighed by pi_theta/pi_old, with its gradient, as slime's
    ``compute_approx_kl(..., importance_ratio=exp(log_probs - old_log_probs))`` written out."""
    from minirl.algo.variants.reference_kl import reference_kl_loss

    out = from_slime(BASE | {"use-kl-loss": True, "kl-loss-coef": 0.01, "kl-loss-type": "k2", "use-unbiased-kl": True})
    assert (out.values["algo.kl_loss_unbiased"], out.values["algo.kl_loss_type"]) == (True, "k2")
    assert out.config().algo.kl_loss_unbiased is True
    assert any("--use-unbiased-kl with k3" in line for line in from_slime(BASE | {
        "use-kl-loss": True, "kl-loss-coef": 0.01, "kl-loss-type": "low_var_kl", "use-unbiased-kl": True}).differs)
    g = torch.Generator().manual_seed(0)
    logp_old, logp_ref = -torch.rand(3, 5, generator=g) * 2, -torch.rand(3, 5, generator=g) * 2
    mask = torch.rand(3, 5, generator=g) > 0.3
    for kind in ("k1", "k2"):
        theirs = (logp_old + 0.1 * torch.randn(3, 5, generator=g)).requires_grad_(True)
        ours = theirs.detach().clone().requires_grad_(True)
        log_ratio = theirs - logp_ref
        kl = log_ratio if kind == "k1" else log_ratio ** 2 / 2.0
        kl = torch.exp(theirs - logp_old) * kl  # slime's importance_ratio, not detached
        want = 0.01 * (kl * mask).sum() / mask.sum()
        got, _ = reference_kl_loss(ours, logp_ref, mask, kl_coef=0.01, kind=kind, normalizer=float(mask.sum()),
                                   logp_old=logp_old)
        want.backward(), got.backward()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-6, atol=1e-9)


def test_slimes_ppo_trains_minirls_critic():
    """``--advantage-estimator ppo``: GAE (``--gamma``, ``--lambd``, the KL at each token's reward with ``--kl-coef``)
    over minirl's critic, its optimizer Megatron's with ``--critic-lr``, ``--value-clip``, and the policy held back
    for ``--num-critic-only-steps`` rollouts (slime trains the actor from rollout id N on)."""
    out = from_slime(BASE | {"advantage-estimator": "ppo", "gamma": 0.99, "lambd": 0.95, "kl-coef": 0.01,
                             "kl-loss-type": "low_var_kl", "normalize-advantages": True, "critic-lr": 2e-6,
                             "value-clip": 0.3, "num-critic-only-steps": 2, "weight-decay": 0.1,
                             "calculate-per-token-loss": True, "critic-load": "/ckpt/critic", "critic-num-gpus-per-node": 2,
                             "critic-lr-warmup-iters": 4})
    v = out.values
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"], v["algo.adv_whiten"], v["algo.adv_gamma"],
            v["algo.adv_lambda"], v["algo.kl_in_reward_coef"], v["algo.kl_in_reward_type"]) == (
        "critic", False, True, 0.99, 0.95, 0.01, "k3")
    assert "algo.adv_token_returns" not in v and "algo.adv_token_kl" not in v
    assert (v["critic.lr"], v["critic.clip_value_range"], v["critic.warmup_steps"], v["critic.weight_decay"],
            v["critic.grad_clip_norm"], v["critic.lr_warmup_updates"], v["critic.loss_aggregation"]) == (
        2e-6, 0.3, 3, 0.1, 1.0, 4, "token_mean")
    assert out.objective.startswith("your slime loss")
    assert any(line.startswith("--critic-load /ckpt/critic") for line in out.not_translated), out.not_translated
    assert any("critic-num-gpus-per-node" in line for line in out.ignored)
    cfg = out.config()
    assert (cfg.algo.adv_baseline, cfg.critic.warmup_steps) == ("critic", 3)
    v = from_slime(BASE | {"advantage-estimator": "ppo", "lr": 3e-6}).values  # slime's defaults
    assert (v["critic.lr"], v["critic.clip_value_range"], v["critic.warmup_steps"], v["algo.adv_lambda"],
            v["critic.loss_aggregation"]) == (3e-6, 0.2, 0, 1.0, "seq_mean") and "algo.kl_in_reward_coef" not in v


def test_advantages_kl_loss_and_entropy():
    v = from_slime(BASE | {"disable-grpo-std-normalization": True, "use-kl-loss": True, "kl-loss-coef": 0.01,
                           "kl-loss-type": "k2", "entropy-coef": 0.001}).values
    assert (v["algo.adv_std_normalize"], v["algo.kl_coef"], v["algo.kl_loss_type"], v["algo.entropy_coef"]) == (False, 0.01, "k2", 0.001)
    v = from_slime(BASE | {"advantage-estimator": "reinforce_plus_plus_baseline", "normalize-advantages": True}).values
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"], v["algo.adv_whiten"]) == ("group_mean", False, True)
    out = from_slime(BASE | {"advantage-estimator": "reinforce_plus_plus_baseline", "normalize-advantages": True,
                             "kl-coef": 0.01, "kl-loss-type": "k2"})  # each token's own KL in its advantage
    v = out.values
    assert (v["algo.adv_baseline"], v["algo.adv_token_kl"], v["algo.kl_in_reward_coef"], v["algo.kl_in_reward_type"],
            v["algo.adv_whiten"]) == ("group_mean", True, 0.01, "k2", True) and "algo.adv_token_returns" not in v
    assert not any("kl" in line.lower() for line in out.not_translated), out.not_translated
    assert out.objective.startswith("your slime loss")
    out.config()
    v = from_slime(BASE | {"advantage-estimator": "reinforce_plus_plus", "normalize-advantages": True}).values
    assert (v["algo.adv_baseline"], v["algo.adv_whiten"]) == ("none", True) and "algo.adv_token_returns" not in v
    out = from_slime(BASE | {"advantage-estimator": "reinforce_plus_plus", "normalize-advantages": True, "kl-coef": 0.01,
                             "kl-loss-type": "low_var_kl", "gamma": 0.99})  # the KL and the discount in each return
    v = out.values
    assert (v["algo.adv_token_returns"], v["algo.adv_gamma"], v["algo.kl_in_reward_coef"], v["algo.kl_in_reward_type"]) == (
        True, 0.99, 0.01, "k3")
    assert not any("kl" in line.lower() or "gamma" in line for line in out.not_translated), out.not_translated
    assert out.objective.startswith("your slime loss")
    out.config()
    v = from_slime(BASE | {"disable-rewards-normalization": True}).values
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"]) == ("none", False)
    v = from_slime(BASE | {"custom-tis-function-path": "slime.backends.megatron_utils.loss.icepop_function",
                           "use-tis": True, "tis-clip-low": 0.5, "tis-clip": 2.0}).values
    assert (v["algo.tis_mode"], v["algo.tis_floor"], v["algo.tis_cap"]) == ("mask", 0.5, 2.0)


# ------------------------------------------------------------------ rewards


def test_a_custom_reward_is_called_as_slime_calls_it(tmp_path: Path, monkeypatch):
    """``--custom-rm-path my_rm.score``: ``async def score(args, sample)`` gets slime's args (from the translation's
    kwargs) and a Sample with prompt, response, label and metadata; with ``--group-rm`` the list of samples."""
    out = from_slime(BASE | {"custom-rm-path": "my_rm.score", "reward-key": "acc", "hf-checkpoint": "/m", "group-rm": True})
    entry = out.values["task.reward_functions"][0]
    assert entry["function"] == "my_rm:score" and entry["batched"] is True
    assert entry["kwargs"] == {"hf_checkpoint": "/m", "reward_key": "acc", "n_samples_per_prompt": 4, "input_key": "input",
                               "metadata_key": "metadata", "apply_chat_template": False}

    async def score(args, sample, **kwargs):
        assert args.reward_key == "acc" and args.rm_type is None  # unset flags are None, as in slime
        return {"acc": float(sample.response == sample.label) + sample.metadata.get("bonus", 0)}

    async def group(args, samples, **kwargs):
        return [len(s.response) for s in samples]

    samples = [Sample("q", "ab", "ab", [5, 6], {"metadata": {"bonus": 0.5}}), Sample("q", "x", "ab", [7])]
    fn = make_reward_fn(score, kwargs={"reward_key": "acc"})
    assert fn.slime and not fn.batched and fn.score(samples) == [1.5, 0.0]
    batched = make_reward_fn(group, kwargs=entry["kwargs"])
    assert batched.slime and batched.batched and batched.score(samples) == [2.0, 1.0]
    assert asyncio.iscoroutinefunction(score)


def test_a_slime_sample_is_slimes_and_a_group_rm_gets_one_group_per_call(tmp_path: Path):
    """slime's Sample: the label as stored (a dict stays one), tokens = the prompt's and the response's, index and
    group_index, TRUNCATED at the budget; --group-rm: one call per prompt's group, the values back in the samples'
    order; an async def's samples awaited together (each waits for all to have started: one at a time would hang)."""
    from minirl.tasks.jsonl import ColumnMap, TaskDataError, _row_to_prompt
    from minirl.tasks.reward_functions import sample_of
    from minirl.tasks.slime_types import Sample as SlimeSample

    row = _row_to_prompt({"prompt": "q", "label": {"ground_truth": {"target": ["1"]}}}, "f:1",
                         ColumnMap(answer="label", answer_required=False, answer_named=True))
    samples = [sample_of(row, text, [7, 8], prompt_ids=[1, 2, 3], index=n, group_index=group, truncated=n == 0)
               for n, (text, group) in enumerate([("a", 0), ("b", 1), ("c", 0), ("d", 1)])]
    seen: list = []

    async def rm(arguments, smp, **kwargs):  # any names: the entry says slime's convention
        seen.append(smp)
        started.append(1)
        await asyncio.wait_for(all_started.wait(), 5)  # every sample's call is running at once
        return float(smp.index)

    async def group_rm(args, samples, **kwargs):
        return [len(samples) * 10 + s.index for s in samples]

    started: list = []
    all_started = asyncio.Event()

    async def watch():
        while len(started) < 4:
            await asyncio.sleep(0.01)
        all_started.set()

    from minirl.tasks.reward_functions import background_loop
    asyncio.run_coroutine_threadsafe(watch(), background_loop())
    fn = make_reward_fn(rm, kwargs={"label_key": "label"}, convention="slime")
    assert fn.slime and fn.awaited and fn.score_each(samples) == [("ok", 0.0), ("ok", 1.0), ("ok", 2.0), ("ok", 3.0)]
    first = next(s for s in seen if s.index == 0)
    assert isinstance(first, SlimeSample) and first.label == {"ground_truth": {"target": ["1"]}}
    assert (first.tokens, first.response_length, first.group_index) == ([1, 2, 3, 7, 8], 2, 0)
    assert first.status is SlimeSample.Status.TRUNCATED
    assert next(s for s in seen if s.index == 3).status is SlimeSample.Status.COMPLETED
    grouped = make_reward_fn(group_rm, batched=True, convention="slime")
    assert grouped.score(samples) == [20.0, 21.0, 22.0, 23.0]  # two samples a call, back in the samples' order
    from types import SimpleNamespace

    from minirl.tasks.reward_runner import _groups  # the runner's calls: one group each

    groups = [SimpleNamespace(group_index=g) for g in (0, 0, 0, 1, 1, 2, 2, 2)]
    assert [[s.group_index for s in item] for item in _groups(groups)] == [[0, 0, 0], [1, 1], [2, 2, 2]]
    assert _groups([]) == []
    with pytest.raises(TaskDataError, match=r'^f:2: field "label" is missing'):  # slime's data[label_key]: KeyError
        _row_to_prompt({"prompt": "q"}, "f:2", ColumnMap(answer="label", answer_required=False, answer_named=True))


def test_a_custom_config_reaches_the_reward_functions_args(tmp_path: Path):
    """--custom-config-path: slime sets each key on args after the flags; its flags are translated, the rest reach the
    reward function's args (not "not translated"); a file that is not there is one line."""
    custom = tmp_path / "custom.yaml"
    custom.write_text("eps_clip_high: 0.3\nmy_threshold: 0.5\n")
    given = BASE | read_slime([], ["--custom-rm-path", "my_rm.score", "--custom-config-path", str(custom)])
    out = from_slime(given)
    entry = out.values["task.reward_functions"][0]
    assert entry["convention"] == "slime" and entry["kwargs"]["my_threshold"] == 0.5 and out.values["algo.eps_high"] == 0.3
    assert out.values["task.reward_timeout_s"] is None
    assert not any("threshold" in line or "custom-config" in line for line in out.not_translated), out.not_translated
    assert any("its keys (eps_clip_high, my_threshold) are on the reward function's args" in line for line in out.differs)
    with pytest.raises(ConfigError, match=r"^--custom-config-path .*nope.yaml: no such file"):
        read_slime([], ["--rollout-batch-size", "4", "--custom-config-path", str(tmp_path / "nope.yaml")])


def test_a_flag_typo_is_named_with_the_flag_it_looks_like():
    out = from_slime(BASE | {"rollout-batchsize": 4})
    assert "--rollout-batchsize=4: not a setting minirl knows how to carry over (did you mean --rollout-batch-size?)" \
        in out.not_translated, out.not_translated
    assert not any("did you mean" in line for line in from_slime(BASE | {"my-own-flag": 1}).not_translated)


@pytest.mark.parametrize("flags, words", [
    ({"use-rollout-logprobs": True, "use-tis": True}, "use_rollout_logprobs and use_tis cannot be set"),
    ({"kl-coef": 0.01, "kl-loss-coef": 0.01}, "only one of kl_coef and kl_loss_coef"),
    ({"advantage-estimator": "reinforce_plus_plus"}, "require --normalize-advantages"),
    ({"advantage-estimator": "reinforce_plus_plus_baseline"}, "require --normalize-advantages"),
    ({"eval-interval": 5}, "evaluation datasets must be configured"),
])
def test_what_slime_refuses_is_refused(flags, words):
    with pytest.raises(ConfigError, match=rf"^slime refuses these settings: .*{re.escape(words)}"):
        from_slime(BASE | flags)


def test_a_reward_file_importing_slimes_sample_gets_the_stand_in(tmp_path: Path, monkeypatch):
    """``from slime.utils.types import Sample`` where slime is not installed: minirl's stand-in, said once; another
    slime module is one line."""
    import sys

    from minirl.tasks.rewards import RewardSpecError, load_reward_function
    from minirl.tasks.slime_types import Sample as SlimeSample

    for name in ("slime", "slime.utils", "slime.utils.types"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    (tmp_path / "typed_rm.py").write_text("from slime.utils.types import Sample\n\n"
                                          "async def rm(args, sample):\n    return float(isinstance(sample, Sample))\n")
    (tmp_path / "hub_rm.py").write_text("from slime.rollout.rm_hub import grade\n")
    fn = make_reward_fn(load_reward_function(f"{tmp_path / 'typed_rm.py'}:rm"))
    assert fn.score([Sample("q", "a", "a")]) == [1.0] and sys.modules["slime.utils.types"].Sample is SlimeSample
    with pytest.raises(RewardSpecError, match=r"it imports slime.rollout, and slime is not installed here"):
        load_reward_function(f"{tmp_path / 'hub_rm.py'}:grade")
    for name in ("slime", "slime.utils", "slime.utils.types"):
        sys.modules.pop(name, None)


def test_built_in_rm_types():
    assert slime_rewards.dapo(None, "so the sum is 12.\nAnswer: 12", "12") == {"score": 1.0, "acc": 1.0}
    assert slime_rewards.dapo(None, "Answer: 13", 12)["score"] == -1.0  # a label stored as a number
    assert slime_rewards.math(None, "it is \\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert slime_rewards.math(None, "it is 1/2", "0.5") == 0.0  # no boxed answer
    assert slime_rewards.math(None, "\\boxed{3}", "the answer is \\boxed{3}") == 1.0  # a boxed label
    assert slime_rewards.deepscaler(None, "<think>\\boxed{2}</think> so \\boxed{3}", "3") == 1.0  # after </think>
    assert slime_rewards.deepscaler(None, "\\boxed{3}", "3") == 0.0  # no </think>
    assert slime_rewards.deepscaler(None, "###Response \\boxed{3} ###Response \\boxed{4}", "3") == 1.0  # the first part
    assert slime_rewards.f1(None, "The Eiffel Tower, Paris", "Eiffel tower") == pytest.approx(0.8)  # P 2/3, R 1
    assert slime_rewards.f1_precision_recall("No!", "no") == (1.0, 1.0, 1.0)
    assert slime_rewards.f1(None, "an answer: no", "No.") == 0.0  # "answer no" is not "no"
    assert slime_rewards.f1(None, "yes it is", "yes") == 0.0  # a yes / no / noanswer on either side must match exactly
    assert slime_rewards.f1(None, "no", "maybe no") == 0.0
    assert slime_rewards.f1(None, "yes it is", "it is") == pytest.approx(0.8)
    assert slime_rewards.f1(None, "cat", "dog") == 0.0


def test_gpqa_picks_the_letter_as_slime_does():
    gpqa = slime_rewards.gpqa
    assert gpqa(None, "<think>maybe A</think>The answer is C.", "C") == 1.0  # read after </think>
    assert gpqa(None, "The answer is B", "C") == 0.0
    assert gpqa(None, "I would go with D", "D") == 1.0  # the last standalone valid letter
    assert gpqa(None, "B is correct, not A", "B") == 1.0
    choices = {"choices": ["4", "5", "6"]}
    assert gpqa(None, "Final answer: B", "5", metadata=choices) == 1.0  # the label is the text of choice B
    assert gpqa(None, "Final answer: C", 2, metadata=choices) == 1.0  # a label index
    assert gpqa(None, "Final answer: E", "D", metadata=choices) == 0.0  # neither is among A-C, nor "d" a word of it
    assert gpqa(None, "Final answer: D", "D", metadata=choices) == 1.0  # ... but "d" is a word of this one (slime's)
    assert gpqa(None, "so it is 6", 2, metadata=choices) == 1.0  # no letter: the correct choice's text, as words
    assert gpqa(None, "so it is 16", 2, metadata=choices) == 0.0
    assert gpqa(None, "It is the mitochondria.", "Mitochondria") == 1.0
    assert gpqa(None, "The answer is B", "A", metadata={"correct_letter": "b"}) == 1.0  # the metadata's letter wins


def test_rm_hub_dispatches_as_slimes_async_rm():
    """``--rm-type`` becomes slime's dispatch, called with (args, sample): the row's metadata rm_type first, a boxed_
    prefix, dapo's dict read at --reward-key (its other numbers logged), and one line for a scorer minirl lacks."""
    out = from_slime(BASE | {"rm-type": "boxed_f1", "reward-key": "score"})
    entry = out.values["task.reward_functions"][0]
    assert entry == {"function": "minirl.tasks.slime_rewards:rm_hub", "kwargs": {"rm_type": "boxed_f1", "reward_key": "score",
                                                                             "metadata_key": "metadata"}}
    fn = make_reward_fn(slime_rewards.rm_hub, kwargs=entry["kwargs"])
    assert fn.slime and not fn.batched
    samples = [Sample("q", "Paris is it: \\boxed{Paris}", "Paris", [1]),  # boxed_f1: only the boxed answer
               Sample("q", "Paris is it: \\boxed{Rome}", "Paris", [1]),
               Sample("q", "Answer: 12", "12", [1], {"metadata": {"rm_type": "dapo"}}),  # the row's own rm_type
               Sample("q", "Answer: C", "C", [1], {"metadata": {"rm_type": "gpqa"}})]
    assert fn.score(samples) == [1.0, 0.0, 1.0, 1.0]
    assert fn.score(samples[2:3])[0].extras == {"acc": 1.0}  # dapo's acc, logged beside the score
    acc = make_reward_fn(slime_rewards.rm_hub, kwargs={"rm_type": "dapo", "reward_key": "acc"})
    assert acc.score([Sample("q", "Answer: 13", "12", [1])]) == [0.0]  # --reward-key acc: dapo's acc, not its -1
    assert set(make_reward_fn(slime_rewards.rm_hub, kwargs={"rm_type": "random"}).score(samples)) <= {0.0, 1.0}
    with pytest.raises(Exception, match=r"rm_type 'ifbench': minirl has slime's dapo, math, deepscaler, f1, gpqa, random "
                                        r"and remote_rm"):
        make_reward_fn(slime_rewards.rm_hub, kwargs={"rm_type": "ifbench"}).score(samples[:1])
    out = from_slime(BASE | {"rm-type": "ifbench"})
    assert any("--rm-type ifbench" in line and "remote_rm" in line for line in out.not_translated)
    # remote_rm: the server's URL reaches the scorer's args (tests/unit/test_slime_remote_rm.py posts to one)
    out = from_slime(BASE | {"rm-type": "remote_rm", "rm-url": "http://rm:8000/score", "reward-key": "score"})
    assert out.values["task.reward_functions"][0]["kwargs"] == {"rm_type": "remote_rm", "reward_key": "score",
                                                                "metadata_key": "metadata", "rm_url": "http://rm:8000/score",
                                                                "rm_deadline_s": 170.0}
    with pytest.raises(ConfigError, match=r"--rm-type=?.?remote_rm.? needs --rm-url"):
        from_slime(BASE | {"rm-type": "remote_rm"})


def test_an_eval_config_gives_its_datasets_and_their_law(tmp_path: Path):
    """``--eval-config``: slime's eval.datasets (a list or a mapping by name), each with eval.defaults and then the
    --eval-* / --rollout-* flags filling what it leaves unset; one law for all, or a line where they differ."""
    aime, math = tmp_path / "aime.jsonl", tmp_path / "math.jsonl"
    aime.write_text("{}\n"), math.write_text("{}\n")
    config = tmp_path / "eval.yaml"
    config.write_text(f"""eval:
  defaults: {{n_samples_per_eval_prompt: 4, temperature: 0.6, max_response_len: 256}}  # a dataset's own wins
  datasets:
    - {{name: aime, path: {aime}, rm_type: math, max_response_len: 512}}
    - {{name: math500, path: {math}, rm_type: math, max_response_len: 512, top_p: null}}
""")
    flags = BASE | {"eval-config": str(config), "eval-interval": 5, "rm-type": "math", "rollout-top-p": 0.9, "num-rollout": 10,
                    "rollout-max-response-len": 1024}
    out = from_slime(flags)
    v = out.values
    assert v["task.eval_path"] == [str(aime), str(math)] and v["eval.every_steps"] == 5
    assert (v["eval.samples_per_prompt"], v["eval.temperature"], v["eval.max_new_tokens"]) == (4, 0.6, 512)
    assert v["eval.top_p"] == 0.9  # neither dataset sets it (null is unset): the rollout's flag
    assert not out.not_translated, out.not_translated
    out.config()  # loads

    config.write_text(f"""eval:
  datasets:
    aime: {{path: {aime}, temperature: 1.0, rm_type: gpqa, metadata_overrides: {{split: test}}}}
    math500: {{path: {math}}}
""")
    out = from_slime(flags | {"eval-temperature": 0.7})
    assert out.values["task.eval_path"] == [str(aime), str(math)] and out.values["eval.temperature"] == 0.7
    assert any("temperature differs between datasets (aime 1.0, math500 0.7)" in line for line in out.not_translated)
    assert any("dataset aime: rm_type 'gpqa'" in line for line in out.not_translated)
    assert any("dataset aime: metadata_overrides" in line for line in out.not_translated)

    out = from_slime(flags | {"eval-config": str(tmp_path / "elsewhere.yaml")})
    assert "task.eval_path" not in out.values and out.values["eval.every_steps"] == 0
    assert any("not on this machine" in line for line in out.not_translated)
    config.write_text("eval:\n  datasets:\n    - {name: aime}\n")
    with pytest.raises(ConfigError, match=r"--eval-config .*eval.yaml: expected eval.datasets, .* each with a name and a path"):
        from_slime(flags)
    config.write_text(f"eval:\n  datasets:\n    - {{name: aime, path: {aime}, top_k: 2.5}}\n")
    with pytest.raises(ConfigError, match=r"top_k 2.5 is not an integer"):
        from_slime(flags)


# ------------------------------------------------------------------ reading scripts as slime and bash read them


def _script(tmp_path: Path, text: str) -> dict:
    (tmp_path / "run.sh").write_text(text)
    return read_slime([str(tmp_path / "run.sh")], [])


def test_text_flags_stay_as_written(tmp_path: Path):
    """slime's ``type=str`` flags keep their words (``--rollout-stop`` is ``nargs="+"`` of str): not re-read as YAML;
    its int / float / store_true flags stay typed."""
    flags = _script(tmp_path, 'python3 train.py --rollout-batch-size 4 --lr 1e-6 --use-tis --rollout-stop "User:" "# end" '
                              '"[END]" "yes" --input-key 1 --label-key null --wandb-project 2024-01-01\n')
    assert flags["rollout-stop"] == ["User:", "# end", "[END]", "yes"]
    assert (flags["rollout-batch-size"], flags["lr"], flags["use-tis"]) == (4, 1e-6, True)
    out = from_slime(flags | {"use-wandb": True, "global-batch-size": 4})
    v = out.values
    assert v["task.stop_strings"] == ["User:", "# end", "[END]", "yes"]
    assert (v["task.prompt_column"], v["task.answer_column"], v["log.wandb_project"]) == ("1", "null", "2024-01-01")
    assert read_slime([], ["--rollout-stop", "yes", "--rollout-batch-size", "2"])["rollout-stop"] == "yes"  # words too
    assert from_slime(BASE | {"rollout-stop": "no"}).values["task.stop_strings"] == ["no"]
    assert from_slime(BASE | {"label-key": "7"}).values["task.answer_column"] == "7"  # a column name, not a number


def test_arithmetic_in_a_slime_script(tmp_path: Path, monkeypatch):
    """``$((...))`` as bash's integer arithmetic, in a flag's word and in an assignment."""
    monkeypatch.delenv("NOWHERE", raising=False)
    flags = _script(tmp_path, "MAX_LEN=8192\nCP=2\nRESP=$((1024 * 4))\npython3 train.py --rollout-batch-size 4 \\\n"
                              "  --max-tokens-per-gpu $((MAX_LEN / CP)) --rollout-max-response-len $RESP \\\n"
                              "  --n-samples-per-prompt $(( (CP + 2) * 2 )) --global-batch-size $((NOWHERE * 2))\n")
    assert (flags["max-tokens-per-gpu"], flags["rollout-max-response-len"], flags["n-samples-per-prompt"]) == (4096, 4096, 8)
    assert isinstance(flags["global-batch-size"], Unresolved)  # a variable set nowhere: unresolved, not 0


def test_no_rm_type_scores_each_row_by_its_metadata():
    """Neither --rm-type nor --custom-rm-path: slime's async_rm takes each row's metadata rm_type; so does the
    translation (said), and a row without one stops the run with one line."""
    out = from_slime(BASE)
    entry = out.values["task.reward_functions"][0]
    assert entry == {"function": "minirl.tasks.slime_rewards:rm_hub", "kwargs": {"metadata_key": "metadata"}}
    assert any("each row's metadata.rm_type picks its scorer" in line for line in out.differs), out.differs
    fn = make_reward_fn(slime_rewards.rm_hub, kwargs=entry["kwargs"])
    assert fn.score([Sample("q", "Answer: 12", "12", [1], {"metadata": {"rm_type": "dapo"}})]) == [1.0]
    with pytest.raises(Exception, match=r"raised ValueError: the row with prompt 'What is 3 x 4\?' has no rm_type: "
                                        r"pass --rm-type \(dapo, math, deepscaler, f1, gpqa, random\) or set its "
                                        r"metadata\.rm_type$") as err:
        fn.score([Sample("What is\n3 x 4?", "Answer: 12", "12", [1])])
    assert "\n" not in str(err.value)


def test_warm_up_fraction_counts_lr_decay_iters(tmp_path: Path):
    """Megatron's warm-up is --lr-warmup-fraction x --lr-decay-iters optimizer steps (both x the global batch in
    samples), else x the run's optimizer steps; a run of unknown length says the warm-up is not translated."""
    base = BASE | {"num-rollout": 100, "global-batch-size": 4, "lr-warmup-fraction": 0.1}  # 2 steps per rollout
    assert from_slime(base | {"lr-decay-iters": 50}).values["optim.warmup_updates"] == 5
    assert from_slime(base).values["optim.warmup_updates"] == 20  # 0.1 x 100 rollouts x 2 steps
    unknown = {**base, "num-rollout": None, "num-epoch": 2, "prompt-data": str(tmp_path / "absent.jsonl")}
    out = from_slime(unknown)
    assert "optim.warmup_updates" not in out.values
    assert any(line.startswith("--lr-warmup-fraction 0.1: the run's length is not known") for line in out.not_translated)
    assert from_slime(unknown | {"lr-decay-iters": 30}).values["optim.warmup_updates"] == 3


def test_ref_load_is_where_slime_starts(tmp_path: Path):
    """slime trains from --ref-load while --load holds no checkpoint: an HF directory is model.path; a Megatron one
    (or one not here) is named not translated; beside a --load checkpoint it is only the reference (said)."""
    hf, megatron, ckpt = tmp_path / "hf", tmp_path / "torch_dist", tmp_path / "ckpt"
    for path, name in ((hf, "config.json"), (megatron, "latest_checkpointed_iteration.txt"),
                       (ckpt, "latest_checkpointed_iteration.txt")):
        path.mkdir()
        (path / name).write_text("{}")
    flags = BASE | {"hf-checkpoint": "/models/base", "load": str(tmp_path / "empty")}
    out = from_slime(flags | {"ref-load": str(hf)})
    assert out.values["model.path"] == str(hf) and any("slime's tokenizer" in line for line in out.differs)
    out = from_slime(flags | {"ref-load": str(megatron)})
    assert out.values["model.path"] == "/models/base"
    assert any(line.startswith(f"--ref-load {megatron}: slime trains from it") for line in out.not_translated)
    out = from_slime(flags | {"ref-load": str(hf), "load": str(ckpt)})
    assert out.values["model.path"] == "/models/base" and any("KL reference" in line for line in out.differs)


def test_assignments_inside_if_and_case_blocks_are_named(tmp_path: Path, monkeypatch):
    """A flag taking a variable (or array) set inside an if / case block gets one line naming it: the translation
    reads the last assignment whatever the condition. Unused ones, or ones set again after the block, get none."""
    monkeypatch.delenv("MODE", raising=False)
    flags = _script(tmp_path, """\
if [ "$MODE" = fast ]; then
  LR=1e-5
else
  LR=2e-6
fi
if [ -n "$MODE" ]; then UNUSED=1; EPS=0.1; fi
EPS=0.3
case "$MODE" in
  fast) EXTRA=(--use-tis) ;;
  *) EXTRA=(--use-kl-loss) ;;
esac
STEPS=$LR
python3 train.py --rollout-batch-size 4 --lr $STEPS --eps-clip $EPS "${EXTRA[@]}"
""")
    assert (flags["lr"], flags["eps-clip"], flags["use-kl-loss"]) == (2e-6, 0.3, True)  # the last assignments
    lines = flags["$conditional"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{tmp_path / 'run.sh'}:4: LR is set inside an if / case / loop block") and "(--lr take it)" in lines[0]
    assert lines[1].startswith(f"{tmp_path / 'run.sh'}:10: EXTRA is set inside") and "--use-kl-loss" in lines[1]
    assert lines == [line for line in from_slime(flags | {"global-batch-size": 4}).differs if "inside an if" in line]


def test_declared_arrays_and_unquoted_variables_split_as_bash(tmp_path: Path):
    """``declare -a`` / ``local`` / ``readonly`` arrays are arrays; an unquoted ``$EXTRA`` holding several flags is
    split at blanks as bash does ("$EXTRA" stays one word); a single-quoted ``'$P'`` stays as written."""
    flags = _script(tmp_path, """\
declare -a A=( --lr 1e-5 )
local B=(--eps-clip 0.3)
readonly C=( --eps-clip-high 0.4 )
EXTRA="--kl-coef 0.1 --entropy-coef 0.01"
QUOTED="--gamma 0.9"
P=/data
NAME="my run"
python3 train.py --rollout-batch-size 4 ${A[@]} "${B[@]}" ${C[@]} $EXTRA "$QUOTED" --wandb-project "$NAME" \\
  --prompt-data '$P/x.jsonl' --save \\$P/ckpt
""")
    assert (flags["lr"], flags["eps-clip"], flags["eps-clip-high"]) == (1e-5, 0.3, 0.4)
    assert (flags["kl-coef"], flags["entropy-coef"]) == (0.1, 0.01)
    assert flags["gamma 0.9"] is True and "gamma" not in flags  # one word, as bash passes it
    assert flags["wandb-project"] == "my run"
    assert (flags["prompt-data"], flags["save"]) == ("$P/x.jsonl", "$P/ckpt")


def test_prompt_data_row_slice_and_its_epoch_count(tmp_path: Path):
    """Only a trailing ``@[start:end]`` is slime's row slice (a path may hold '@'); --num-epoch counts its rows, and
    says that --rollout-max-prompt-len's filter would shorten slime's count."""
    folder = tmp_path / "u@x"
    folder.mkdir()
    data = folder / "train.jsonl"
    data.write_text("".join(f'{{"input": "q{i}"}}\n' for i in range(10)))
    base = BASE | {"rollout-batch-size": 3, "global-batch-size": 12, "num-epoch": 2}
    out = from_slime(base | {"prompt-data": f"{data}@[2:8]"})  # 6 rows: 2 rollouts an epoch
    assert out.values["task.path"] == str(data) and out.values["optim.global_steps"] == 4
    assert any(line.startswith(f"--prompt-data {data}@[2:8]: the row slice @[2:8]") for line in out.not_translated)
    assert from_slime(base | {"prompt-data": f"{data}@[-4:]"}).values["optim.global_steps"] == 2
    out = from_slime(base | {"prompt-data": str(data)})
    assert out.values["task.path"] == str(data) and out.values["optim.global_steps"] == 6
    assert not any("row slice" in line for line in out.not_translated)
    out = from_slime(base | {"prompt-data": str(data), "rollout-max-prompt-len": 512})
    assert any("slime counts the rows left after dropping longer prompts" in line for line in out.differs)


def test_eps_clip_c_where_slime_ignores_it_and_steps_against_the_batch():
    """--eps-clip-c has no effect in slime's REINFORCE and CISPO losses: ignored, not a loss minirl lacks.
    --num-steps-per-rollout disagreeing with --global-batch-size is slime's assertion: one line naming both."""
    for given in ({"pg-loss-type": "reinforce"}, {"advantage-estimator": "cispo", "calculate-per-token-loss": True}):
        out = from_slime(BASE | given | {"eps-clip-c": 3.0})
        assert out.values["algo.name"] in ("minirl", "cispo") and "algo.dual_clip" not in out.values
        assert not any("eps-clip-c" in line for line in out.not_translated + out.differs)
        assert any(line.startswith("--eps-clip-c (no dual clip") for line in out.ignored)
    assert from_slime(BASE | {"num-steps-per-rollout": 1}).values["optim.minibatches_per_step"] == 1  # 8 // 1 = 8: agree
    with pytest.raises(ConfigError, match=r"^slime settings --num-steps-per-rollout 2, --global-batch-size 8: they "
                                          r"disagree \(8 samples // 2 steps = 4; slime asserts they agree\); give one$"):
        from_slime(BASE | {"num-steps-per-rollout": 2})


def test_assignments_after_and_or_are_named_as_conditional(tmp_path: Path, monkeypatch):
    """``cond && X=1`` / ``cond || X=1`` assigns only as ``cond`` turns out: named as a block's assignments are. The
    first command of a list always runs (``X=1 || true``), an assignment succeeds (``A=1 && B=2`` runs both) and
    ``false && X=1`` never assigns, as in bash."""
    monkeypatch.delenv("MODE", raising=False)
    flags = _script(tmp_path, """\
LR=1e-6
[ -n "$MODE" ] && LR=1e-5
test -n "$MODE" && export EPS=0.1
KL=0.1 || true
A=1 && N=2
false && GAMMA=0.5
ARGS=(--use-kl-loss)
[ -z "$MODE" ] ||
  ARGS+=(--use-tis)
python3 train.py --rollout-batch-size 4 --lr $LR --eps-clip ${EPS:-0.2} --kl-coef $KL --n-samples-per-prompt $N \\
  --gamma ${GAMMA:-0.9} "${ARGS[@]}"
""")
    assert (flags["lr"], flags["eps-clip"], flags["kl-coef"], flags["n-samples-per-prompt"]) == (1e-5, 0.1, 0.1, 2)
    assert (flags["gamma"], flags["use-kl-loss"], flags["use-tis"]) == (0.9, True, True)
    lines = flags["$conditional"]
    assert [line.split(": ")[1].split(" is set")[0] for line in lines] == ["LR", "EPS", "ARGS"], lines
    assert lines[0].startswith(f"{tmp_path / 'run.sh'}:2: LR is set after a `&&` / `||` condition; the translation "
                               "reads the script's last assignment to it, whatever the condition (--lr take it)")
    assert lines[2].startswith(f"{tmp_path / 'run.sh'}:9: ARGS is set after") and "(--use-tis take it)" in lines[2]


def test_a_bare_array_name_is_its_first_element(tmp_path: Path):
    """``$ARR`` / ``${ARR}`` expand to the array's first element (bash's ``${ARR[0]}``); ``${ARR[@]}`` to all."""
    flags = _script(tmp_path, """\
ARGS=(--lr 1e-5 --use-tis)
CLIPS=(0.3 0.4)
NAMES=()
NAMES+=(run-a run-b)
python3 train.py --rollout-batch-size 4 $ARGS 2e-6 --eps-clip "${CLIPS}" --wandb-project "$NAMES-x" \
  --rollout-stop ${NAMES[@]}
""")
    assert (flags["lr"], flags["eps-clip"], flags["wandb-project"]) == (2e-6, 0.3, "run-a-x")
    assert "use-tis" not in flags and flags["rollout-stop"] == ["run-a", "run-b"]


def test_command_output_is_not_taken_as_written(tmp_path: Path, monkeypatch):
    """``$(...)`` and backticks are commands the translation does not run: a flag taking one (directly or through a
    variable) is unresolved, one line naming the flag, the command and its line once read; slime's
    ``SCRIPT_DIR="$(cd -- "$(dirname ...)" ...)"`` + ``source`` preamble leaves the rest translated."""
    monkeypatch.setenv("GPUS", "4")  # the script sets it again, from a command
    flags = _script(tmp_path, """\
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/qwen3-4B.sh"
GPUS=$(nproc)
STAMP=`date +%s`
NAME="run-$STAMP"
python3 train.py --rollout-batch-size 2 --actor-num-gpus-per-node $GPUS --wandb-project "$NAME" --save "$(pwd)/ckpt" \\
  --load ${SCRIPT_DIR}/ckpt --lr 1e-6 --prompt-data '$(literal)' --eval-prompt-data aime "run-`date`.jsonl"
""")
    assert (flags["lr"], flags["prompt-data"]) == (1e-6, "$(literal)")
    assert all(isinstance(flags[key], Unresolved) for key in ("actor-num-gpus-per-node", "wandb-project", "save", "load"))
    run = tmp_path / "run.sh"
    for key, command, line in (("actor-num-gpus-per-node", "$(nproc)", 3), ("wandb-project", "`date +%s`", 4),
                               ("save", "$(pwd)", 6), ("load", '$(cd -- "$(dirname', 1)):
        with pytest.raises(ConfigError, match=rf"^{run}:6: --{key} takes the output of {re.escape(command)}.* \({run}:{line}\), "
                                              rf"a command the translation does not run; give --{key} \.\.\. after the script$"):
            from_slime(BASE | {"use-wandb": True, key: flags[key]}).config()
    with pytest.raises(ConfigError, match=r"--eval-prompt-data takes the output of `date`"):
        from_slime(BASE | {"eval-prompt-data": flags["eval-prompt-data"]})


def test_ansi_c_quotes_read_their_escapes(tmp_path: Path):
    """``$'...'`` is bash's ANSI-C quoting: ``\\n``, ``\\t``, ``\\\\``, ``\\'`` and ``\\xHH`` are read inside it."""
    flags = _script(tmp_path, """\
SEP=$'\\t'
python3 train.py --rollout-batch-size 4 --rollout-stop $'\\n\\nUser:' $'it\\'s' $'\\x41\\\\B' "a${SEP}b" '\\n'
""")
    assert flags["rollout-stop"] == ["\n\nUser:", "it's", "A\\B", "a\tb", "\\n"]


REDIRECTIONS = ["> out.log 2>&1", "&> log", ">> log", "2>/dev/null", "< input", "1>&2", '<<< "x y"', ">|log", "&>>log",
                "2>&-", ">'a b'"]


@pytest.mark.parametrize("redirect", REDIRECTIONS)
def test_redirections_are_no_flags_words(tmp_path: Path, redirect: str):
    """A redirection and its target (``2>&1``, ``> log``, ``<<< "x"``...), in the middle of the ``train.py`` line or
    at its end (before ``| tee``), is no word of the command: the flags around it read as without it."""
    train = (f'python3 train.py --rollout-batch-size 4 {redirect} "${{ARGS[@]}}" \\\n  --eps-clip 0.3 {redirect}\n',
             f'python3 train.py --rollout-batch-size 4 "${{ARGS[@]}}" --eps-clip 0.3>x.log {redirect} 2>&1 | tee log\n',
             f'python3 train.py --rollout-batch-size 4 "${{ARGS[@]}}" --eps-clip 0.3 {redirect} |& tee log.txt\n')
    for line in train:
        flags = _script(tmp_path, f"ARGS=(--lr 1e-5) {redirect}\necho start {redirect}\nARGS+=(--use-tis)\n{line}")
        assert flags == {"rollout-batch-size": 4, "lr": 1e-5, "use-tis": True, "eps-clip": 0.3, "$script": "train.py"}


def test_default_assignments_assign_as_bash(tmp_path: Path, monkeypatch):
    """``: ${X:=v}`` / ``: "${X:=v}"`` assign v to an unset or empty X (a set one keeps its value); a ``${X:=v}`` in
    any word assigns it too."""
    for name in ("LR", "EPS", "KL", "N"):
        monkeypatch.delenv(name, raising=False)
    flags = _script(tmp_path, """\
: ${LR:=1e-5}
: "${EPS:=0.3}"
KL=
: ${KL:=0.1}
GAMMA=0.5
: ${GAMMA:=0.9}
python3 train.py --rollout-batch-size 4 --lr $LR --eps-clip $EPS --kl-coef $KL --gamma $GAMMA \\
  --n-samples-per-prompt ${N:=2} --global-batch-size $((N * 4))
""")
    assert (flags["lr"], flags["eps-clip"], flags["kl-coef"], flags["gamma"]) == (1e-5, 0.3, 0.1, 0.5)
    assert (flags["n-samples-per-prompt"], flags["global-batch-size"]) == (2, 8)


def test_assignments_in_groups_run_as_the_group_does(tmp_path: Path, monkeypatch):
    """A bare ``{ A=1; B=2; }`` group runs: its assignments are plain; after ``cond &&`` / ``cond ||`` they are
    named as conditional ones are, after ``false &&`` never made; a function's body runs where it is called."""
    monkeypatch.delenv("MODE", raising=False)
    flags = _script(tmp_path, """\
{ LR=1e-5; EPS=0.3; }
[ -n "$MODE" ] && { KL=0.1; GAMMA=0.5; }
false && { ENT=0.1; }
true && {
  N=4
} || N=8
setup() { EPS=0.9; }
python3 train.py --rollout-batch-size 4 --lr $LR --eps-clip $EPS --kl-coef $KL --gamma ${GAMMA} \\
  --entropy-coef ${ENT:-0.0} --n-samples-per-prompt $N
""")
    assert (flags["lr"], flags["eps-clip"], flags["kl-coef"], flags["gamma"]) == (1e-5, 0.9, 0.1, 0.5)
    assert (flags["entropy-coef"], flags["n-samples-per-prompt"]) == (0.0, 4)
    lines = flags["$conditional"]
    assert [line.split(": ")[1].split(" is set")[0] for line in lines] == ["EPS", "KL", "GAMMA"], lines
    assert "EPS is set inside a function" in lines[0] and "KL is set after a `&&` / `||` condition" in lines[1]


def test_assigning_an_array_name_sets_its_first_element(tmp_path: Path):
    """``ARR=x`` on an array sets its first element (bash's ``ARR[0]=x``), the others kept."""
    flags = _script(tmp_path, """\
ARGS=(--lr 1e-5 --use-tis)
ARGS=--eps-clip
STOPS=()
STOPS="a b"
python3 train.py --rollout-batch-size 4 "${ARGS[@]}" --rollout-stop "${STOPS[@]}" --wandb-project "x$ARGS"
""")
    assert (flags["eps-clip"], flags["use-tis"], flags["rollout-stop"]) == (1e-5, True, "a b")
    assert "lr" not in flags and flags["wandb-project"] == "x--eps-clip"


def test_array_elements_counts_and_lengths(tmp_path: Path):
    """``${ARR[n]}``, ``${ARR[$i]}``, ``${ARR[-1]}`` are elements, ``${#ARR[@]}`` their count, ``${#X}`` a length;
    ``"${ARR[*]}"`` is one word of them all, an unquoted ``${ARR[@]}`` splits each at its blanks."""
    flags = _script(tmp_path, """\
CLIPS=(0.1 0.2 0.3)
i=1
NAMES=("run a" b)
X=abcd
python3 train.py --rollout-batch-size ${#CLIPS[@]} --eps-clip ${CLIPS[0]} --eps-clip-high ${CLIPS[$i]} \\
  --eps-clip-c ${CLIPS[-1]} --n-samples-per-prompt ${#X} --wandb-project "${NAMES[0]}" \\
  --global-batch-size $(( ${#CLIPS[@]} * 2 )) --rollout-stop ${NAMES[i]} --wandb-group ${NAMES[@]} \
  --eval-prompt-data "${NAMES[*]}"
""")
    assert (flags["rollout-batch-size"], flags["eps-clip"], flags["eps-clip-high"], flags["eps-clip-c"]) == (3, 0.1, 0.2, 0.3)
    assert (flags["n-samples-per-prompt"], flags["wandb-project"], flags["global-batch-size"]) == (4, "run a", 6)
    assert flags["rollout-stop"] == "b" and flags["wandb-group"] == ["run", "a", "b"]
    assert flags["eval-prompt-data"] == "run a b"


def test_locale_quotes_are_double_quotes(tmp_path: Path):
    """``$"..."`` (bash's locale translation) reads as ``"..."``."""
    flags = _script(tmp_path, 'NAME=$"my run"\npython3 train.py --rollout-batch-size 4 --wandb-project $"a $NAME"\n')
    assert flags["wandb-project"] == "a my run"


def test_trims_substrings_cases_and_array_slices_as_bash(tmp_path: Path):
    """``${X%/}``, ``${X##*/}``, ``${X//-/_}``, ``${X,,}``, ``${X:0:5}``, ``${X:+alt}`` read as bash; ``"${A[@]:2}"``
    is the array's elements from the third on, each a word."""
    flags = _script(tmp_path, """\
MODEL_PATH=/root/models/Qwen3-4B/
NAME=${MODEL_PATH%/}
NAME=${NAME##*/}
ARGS=(--lr 1e-5 --use-tis --eps-clip 0.3 --rollout-stop "a b")
python3 train.py --rollout-batch-size 4 --hf-checkpoint ${MODEL_PATH%/} --wandb-project "${NAME//-/_}" \\
  --wandb-group "${NAME,,}" --input-key "${NAME:0:5}" "${ARGS[@]:2}" --save /ckpt${UNSET_SAVE:+/x}${NAME:+/$NAME}
""")
    assert (flags["hf-checkpoint"], flags["wandb-project"], flags["wandb-group"]) == ("/root/models/Qwen3-4B", "Qwen3_4B", "qwen3-4b")
    assert (flags["input-key"], flags["save"], flags["use-tis"], flags["eps-clip"]) == ("Qwen3", "/ckpt/Qwen3-4B", True, 0.3)
    assert "lr" not in flags and flags["rollout-stop"] == "a b"


def test_appends_add_to_a_variables_value(tmp_path: Path, monkeypatch):
    """``X+=y`` / ``export X+=y`` append to X's value (an unset X is empty), ``A+=(x)`` to an array."""
    monkeypatch.delenv("TAGS", raising=False)
    flags = _script(tmp_path, """\
RUN=qwen
RUN+=-grpo
export RUN+="_v${N:-2}"
TAGS+=math
ARGS=(--lr 1e-5)
ARGS+=(--use-tis)
python3 train.py --rollout-batch-size 4 --wandb-project $RUN --wandb-group $TAGS "${ARGS[@]}"
""")
    assert (flags["wandb-project"], flags["wandb-group"], flags["lr"], flags["use-tis"]) == ("qwen-grpo_v2", "math", 1e-5, True)


def test_a_required_value_the_script_lacks_is_one_line_naming_it(tmp_path: Path, monkeypatch):
    """``${CKPT:?msg}`` where CKPT is unset (or empty) stops bash's script: a flag taking it is unresolved, one line
    naming CKPT and the message once read; a set one is its value."""
    monkeypatch.delenv("CKPT", raising=False)
    flags = _script(tmp_path, 'MODEL=/m\npython3 train.py --rollout-batch-size 4 --hf-checkpoint ${MODEL:?set MODEL} \\\n'
                              '  --load "${CKPT:?set CKPT to a checkpoint}"\n')
    assert flags["hf-checkpoint"] == "/m" and isinstance(flags["load"], Unresolved)
    with pytest.raises(ConfigError, match=r"run.sh:2: load uses a variable the script does not set "
                                          r"\(\$\{CKPT:\?set CKPT to a checkpoint\}\)"):
        from_slime(BASE | {"load": flags["load"]}).config()


def test_a_required_value_taken_through_a_variable_keeps_bashs_message(tmp_path: Path, monkeypatch):
    """``CKPT_DIR=${CKPT:?msg}`` stops bash at line 1 when CKPT is unset; a flag taking ``$CKPT_DIR`` (or a variable
    made from it) is unresolved, its line naming where bash stopped and the message; ``$0`` is the script, ``$1`` empty
    (``bash run.sh``: no arguments)."""
    monkeypatch.delenv("CKPT", raising=False)
    flags = _script(tmp_path, 'CKPT_DIR=${CKPT:?set CKPT to a checkpoint}\nLOAD=$CKPT_DIR/iter\nNAME=$(basename $0)\n'
                              'python3 train.py --rollout-batch-size 4 --load $LOAD --save "${1:-/ckpt}" '
                              '--wandb-group "$0"\n')
    assert flags["save"] == "/ckpt" and flags["wandb-group"].endswith("run.sh")
    with pytest.raises(ConfigError, match=r"run.sh:4: load uses a variable the script does not set \(\$LOAD: bash stops "
                                          r"at .*run.sh:1: CKPT: set CKPT to a checkpoint\)"):
        from_slime(BASE | {"load": flags["load"]}).config()


def test_a_default_taken_from_a_command_is_its_output(tmp_path: Path, monkeypatch):
    """``: ${GPUS:=$(nproc)}`` with GPUS unset makes GPUS a command's output (not run here), not a variable set
    nowhere: a flag taking it names the command."""
    monkeypatch.delenv("GPUS", raising=False)
    flags = _script(tmp_path, ": ${GPUS:=$(nproc)}\npython3 train.py --rollout-batch-size 4 --actor-num-gpus-per-node $GPUS\n")
    with pytest.raises(ConfigError, match=r"run.sh:2: --actor-num-gpus-per-node takes the output of \$\(nproc\) "
                                          r"\(.*run.sh:1\), a command the translation does not run"):
        from_slime(BASE | {"actor-num-gpus-per-node": flags["actor-num-gpus-per-node"]}).config()


@pytest.mark.parametrize("peer", ["from-trl", "from-verl", "from-slime"])
def test_a_translations_help_is_help(peer, capsys):
    """``minirl config from-slime run.sh --help``: the help, not "--help" read as one of the peer's settings."""
    from minirl.cli import main

    with pytest.raises(SystemExit) as done:
        main(["config", peer, "run.sh", "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: minirl config")


def test_a_label_key_no_row_has_is_one_line(tmp_path: Path, monkeypatch):
    """slime reads ``row[--label-key]`` (a KeyError when no row has it); minirl would score with no label, so the
    translation says it, with the columns the file has. A column some rows have is theirs (slime's NaN elsewhere)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    Path("d.jsonl").write_text('{"text": "q1", "label": "1"}\n\n{"text": "q2", "label": "2", "answer": "2"}\n')
    assert from_slime(BASE | {"prompt-data": "d.jsonl", "label-key": "answer"}).values["task.answer_column"] == "answer"
    Path("d.jsonl").write_text('{"text": "q1", "label": "1"}\n{"text": "q2", "label": "2"}\n')
    with pytest.raises(ConfigError, match=r"^--label-key answer: no row of d.jsonl has a column 'answer' \(its columns: "
                                          r"label, text\); slime stops there with a KeyError$"):
        from_slime(BASE | {"prompt-data": "d.jsonl", "label-key": "answer"})
    with pytest.raises(ConfigError, match=r"did you mean --label-key label\?$"):
        from_slime(BASE | {"prompt-data": "d.jsonl@[0:1]", "label-key": "lable"})  # the row slice is not the file
    pq.write_table(pa.table({"prompt": ["q"], "label": ["1"]}), "d.parquet")
    with pytest.raises(ConfigError, match=r"^--label-key answer: no row of d.parquet has a column 'answer' "):
        from_slime(BASE | {"prompt-data": "d.parquet", "label-key": "answer"})
    assert from_slime(BASE | {"prompt-data": "d.parquet", "label-key": "label"}).values["task.answer_column"] == "label"
    monkeypatch.setattr("minirl.peers.common.LABEL_ROWS_READ", 1)
    Path("d.jsonl").write_text('{"text": "q1"}\n{"text": "q2", "answer": "2"}\n')
    with pytest.raises(ConfigError, match=r"^--label-key answer: none of the first 1 rows of d.jsonl has"):
        from_slime(BASE | {"prompt-data": "d.jsonl", "label-key": "answer"})
