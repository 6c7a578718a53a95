"""OpenRLHF's launch scripts as minirl configs (``minirl.peers.openrlhf``): the script reader on OpenRLHF's example
shape, the translated settings, the loss's gradient against OpenRLHF's ``PolicyLoss`` written out, and its
``reward_func(queries, prompts, labels)`` convention."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minirl.cli import main
from minirl.config import ConfigError
from minirl.peers import from_openrlhf, read_openrlhf
from minirl.tasks.reward_functions import Sample, Scored, make_reward_fn
from minirl.tasks.rewards import RewardFunctionError
from tests.unit.reward_server import serve
from tests.unit.test_peers import _batch, _losses

# a REINFORCE++-baseline run in the shape of OpenRLHF's examples/scripts/train_reinforce_baseline_hybrid_engine.sh
SCRIPT = """\
#!/bin/bash
set -x

MODEL_PATH="{root}/Qwen3-0.6B"
DATA="{root}/math.jsonl"
SAVE_PATH="{root}/exp/qwen3"

CKPT_ARGS=(
   --pretrain ${{MODEL_PATH}}
   --save_path ${{SAVE_PATH}}
   --ckpt_path "${{SAVE_PATH}}/ckpt"
   --save_hf_ckpt
   --max_ckpt_num 2
   --save_steps 10
)

ROLLOUT_ARGS=(
   --remote_rm_url {root}/reward_func.py
   --prompt_data ${{DATA}}
   --input_key question
   --label_key answer
   --prompt_max_len 512
   --generate_max_len 2048
   --apply_chat_template
   --rollout_batch_size 4
   --n_samples_per_prompt 8
   --train_batch_size 16
   --micro_train_batch_size 2
   --max_epochs 1
   --num_episodes 3
   --temperature 0.9
   --dynamic_filtering
   --dynamic_filtering_reward_range 0.0 1.0
)

ENGINE_ARGS=(
   --actor_num_nodes 1
   --actor_num_gpus_per_node 4
   --vllm_num_engines 2
   --vllm_tensor_parallel_size 2
   --colocate_all_models
   --zero_stage 3
   --gradient_checkpointing
   --packing_samples
   --bf16
)

OPTIMIZER_ARGS=(
   --advantage_estimator reinforce_baseline
   --actor_learning_rate 5e-7
   --lr_warmup_ratio 0.1
   --init_kl_coef 1e-3
   --use_kl_loss
   --kl_estimator k2
   --eps_clip_low_high 0.2 0.28
   --enable_vllm_is_correction
   --vllm_is_correction_type tis
   --vllm_is_truncated_threshold 0.5 3.0
   --l2 0.01
)

ray job submit --address="http://127.0.0.1:8265" \\
   -- python3 -m openrlhf.cli.train_ppo_ray \\
   ${{CKPT_ARGS[@]}} \\
   ${{ROLLOUT_ARGS[@]}} \\
   ${{ENGINE_ARGS[@]}} \\
   ${{OPTIMIZER_ARGS[@]}} \\
   --use_tensorboard ${{SAVE_PATH}}/runs
"""

REWARD = """\
import torch


def reward_func(queries, prompts, labels, **kwargs):
    rewards = torch.tensor([1.0 if q.strip().endswith(label) else 0.0 for q, label in zip(queries, labels)])
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"accuracy": rewards, "batch": rewards.mean()}}
"""


def _files(tmp_path: Path) -> Path:
    (tmp_path / "reward_func.py").write_text(REWARD)
    (tmp_path / "math.jsonl").write_text("".join(f'{{"question": "{i}+{i}=", "answer": "{2 * i}"}}\n' for i in range(20)))
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT.format(root=tmp_path))
    return script


def test_the_launch_script_translates_flag_by_flag(tmp_path):
    out = from_openrlhf(read_openrlhf([str(_files(tmp_path))], []))
    v = out.values
    assert v["model.path"] == f"{tmp_path}/Qwen3-0.6B" and v["task.path"] == f"{tmp_path}/math.jsonl"
    assert (v["task.prompt_column"], v["task.answer_column"], v["task.chat_prompts"]) == ("question", "answer", True)
    assert v["task.reward_functions"] == [{"function": f"{tmp_path}/reward_func.py:reward_func", "convention": "openrlhf",
                                          "kwargs": {"tokenizer": f"{tmp_path}/Qwen3-0.6B", "apply_chat_template": True,
                                                     "label_key": "answer"}}]
    assert (v["rollout.prompts_per_step"], v["rollout.samples_per_prompt"], v["optim.minibatches_per_step"]) == (4, 8, 2)
    assert (v["rollout.max_new_tokens"], v["task.max_prompt_tokens"], v["rollout.temperature"]) == (2048, 512, 0.9)
    assert v["optim.global_steps"] == 3 * (20 // 4) and v["optim.warmup_updates"] == round(0.1 * 15 * 2)
    assert (v["optim.lr"], v["optim.weight_decay"], v["optim.adam_beta2"]) == (5e-7, 0.01, 0.95)
    assert (v["optim.lr_schedule"], v["optim.min_lr_ratio"], v["optim.precision"]) == ("cosine", 0.1, "bf16")
    assert v["optim.gradient_checkpointing"] and v["optim.padding_free"] and v["optim.micro_batch_sequences"] == 2
    assert v["rollout.filter_groups"] and v["log.tensorboard"]
    assert (v["run.output_dir"], v["run.name"], v["checkpoint.every_steps"], v["checkpoint.keep_last"]) == (
        f"{tmp_path}/exp", "qwen3", 10, 2)
    assert v["cluster.trainer_ranks"] == 4
    # the loss: PPO's clip, a token mean, TIS on pi_old/mu_old, the k2 KL loss; REINFORCE++-baseline's advantages
    assert (v["algo.name"], v["algo.aggregation"], v["algo.eps_low"], v["algo.eps_high"]) == ("minirl", "token_mean", 0.2, 0.28)
    assert (v["algo.tis_floor"], v["algo.tis_cap"], v["algo.tis_mode"], v["algo.tis_placement"]) == (0.5, 3.0, "truncate",
                                                                                                      "train_infer")
    assert (v["algo.kl_coef"], v["algo.kl_loss_type"]) == (1e-3, "k2")
    assert (v["algo.adv_baseline"], v["algo.adv_std_normalize"], v["algo.adv_whiten"]) == ("group_mean", False, True)
    assert out.objective.startswith("your OpenRLHF loss as minirl's algo.name=minirl")
    assert out.ignored == ["--save_hf_ckpt", "--vllm_tensor_parallel_size"]
    assert f"--ckpt_path {tmp_path}/exp/qwen3/ckpt: minirl keeps its resumable checkpoints in the run directory" in str(out.differs)
    assert out.values["run.overwrite"] is True  # OpenRLHF trains again over save_path without --load_checkpoint
    resumed = from_openrlhf(read_openrlhf([str(tmp_path / "run.sh")], ["--load_checkpoint"])).values
    assert resumed["run.resume"] == "auto" and "run.overwrite" not in resumed
    one = from_openrlhf(read_openrlhf([str(tmp_path / "run.sh")], ["--actor_num_gpus_per_node", "1"]))
    assert "cluster.trainer_ranks" not in one.values and "--zero_stage (one GPU: nothing to shard)" in one.ignored
    text = out.render("run.sh")
    assert text.startswith("# minirl config translated from the OpenRLHF settings of run.sh")
    assert "# by `minirl config from-openrlhf`." in text and "# Differs from your run:" in text
    assert "eps_high: 0.28  # --eps_clip_low_high 0.2 0.28" in text


def test_dotted_flags_of_the_newest_release_read_as_the_flags_they_renamed():
    out = from_openrlhf({"actor.model_name_or_path": "/m", "data.prompt_dataset": "/d.jsonl", "data.input_key": "q",
                         "rollout.batch_size": 2, "rollout.n_samples_per_prompt": 4, "train.batch_size": 8,
                         "rollout.max_new_tokens": 64, "actor.eps_clip_low_high": [0.1, 0.3], "actor.adam.lr": 2e-6,
                         "algo.advantage.estimator": "group_norm", "algo.kl.init_coef": 0.0,
                         "actor.num_gpus_per_node": 1, "vllm.num_engines": 1, "ds.zero_stage": 3})
    v = out.values
    assert (v["model.path"], v["task.prompt_column"], v["rollout.max_new_tokens"], v["optim.lr"]) == ("/m", "q", 64, 2e-6)
    assert (v["algo.eps_low"], v["algo.eps_high"], v["algo.adv_std_normalize"]) == (0.1, 0.3, True)
    assert "task.max_prompt_tokens" not in v  # the newest release bounds prompt + response (--data.max_len) instead
    assert "eps_high: 0.3  # --actor.eps_clip_low_high 0.1 0.3" in out.render("x")


def test_group_norm_divides_by_openrlhfs_std_plus_1e_9():
    out = from_openrlhf(BASE)
    assert (out.values["algo.adv_std_normalize"], out.values["algo.adv_std_eps"]) == (True, 1e-9)
    assert not any("1e-9" in line for line in out.differs)


def test_the_kl_in_the_reward_after_a_group_baseline_trains_with_minirl():
    out = from_openrlhf({"pretrain": "/m", "advantage_estimator": "group_norm", "n_samples_per_prompt": 4,
                         "rollout_batch_size": 2, "train_batch_size": 8, "actor_num_gpus_per_node": 1})
    assert out.objective.startswith("minirl's MiniRL"), out.objective
    assert not any(key.startswith("algo.") for key in out.values)
    assert any("--init_kl_coef 0.01" in item for item in out.not_translated)


def test_reinforce_carries_the_kl_in_each_tokens_return():
    out = from_openrlhf({"pretrain": "/m", "advantage_estimator": "reinforce", "rollout_batch_size": 2,
                         "n_samples_per_prompt": 2, "train_batch_size": 4, "actor_num_gpus_per_node": 1})
    v = out.values
    assert (v["algo.adv_baseline"], v["algo.adv_token_returns"], v["algo.kl_in_reward_coef"], v["algo.adv_whiten"]) == (
        "none", True, 0.01, True)


def _openrlhf_gradient(x, eps: tuple[float, float], tis: tuple[str, float, float] | None, dual: float | None = None):
    """OpenRLHF's ``PolicyLoss.forward`` (ppo) over one micro-batch holding the whole batch, written as OpenRLHF does."""
    logp = x.logp.detach().clone().requires_grad_(True)
    mask = x.mask.to(logp.dtype)
    advantages = x.advantages[:, None].expand_as(logp)
    ratio = (logp - x.logp_old).exp()
    surr1, surr2 = ratio * advantages, ratio.clamp(1 - eps[0], 1 + eps[1]) * advantages
    loss = -torch.min(surr1, surr2)
    if dual is not None:
        clip1 = torch.min(surr1, surr2)
        loss = -torch.where(advantages < 0, torch.max(clip1, dual * advantages), clip1)
    if tis is not None:
        kind, low, high = tis
        weight = (x.logp_old - x.logp_rollout).exp().detach()
        weight = weight * ((weight >= low) & (weight <= high)) if kind == "icepop" else weight.clamp(min=low, max=high)
        loss = weight * loss
    loss = (loss * mask).sum() / mask.sum()
    (grad,) = torch.autograd.grad(loss, logp)
    return grad


BASE = {"pretrain": "/m", "rollout_batch_size": 2, "n_samples_per_prompt": 4, "train_batch_size": 8,
        "micro_train_batch_size": 8, "actor_num_gpus_per_node": 1, "advantage_estimator": "group_norm",
        "use_kl_loss": True, "eps_clip_low_high": [0.1, 0.3]}
CASES = {
    "ppo": ({}, {"tis": None}),
    "tis": ({"enable_vllm_is_correction": True, "vllm_is_correction_type": "tis",
             "vllm_is_truncated_threshold": [0.5, 1.5]}, {"tis": ("tis", 0.5, 1.5)}),
    "icepop-dual": ({"enable_vllm_is_correction": True, "vllm_is_correction_type": "icepop", "dual_clip": 1.3},
                    {"tis": ("icepop", 0.5, 5.0), "dual": 1.3}),
    "tis-0.8-one-threshold": ({"enable_vllm_is_correction": True, "vllm_is_truncated_threshold": 1.5},
                              {"tis": ("tis", 0.0, 1.5)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_loss_has_openrlhfs_gradient(case):
    given, written = CASES[case]
    out = from_openrlhf(BASE | given)
    assert out.objective.startswith("your OpenRLHF loss"), out.objective
    x = _batch()
    _, ours = _losses(x, out.config(), batch=8)
    theirs = _openrlhf_gradient(x, (0.1, 0.3), **written)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(theirs, _openrlhf_gradient(x, (0.1, 0.1), **written))  # the upper clip acts


def test_a_typo_gets_did_you_mean_and_a_bad_value_one_line():
    out = from_openrlhf(BASE | {"eps_clp": 0.3})
    assert any("--eps_clp=0.3" in item and "did you mean --eps_clip?" in item for item in out.not_translated)
    with pytest.raises(ConfigError, match=r"^OpenRLHF setting --rollout_batch_size many: expected an integer$"):
        from_openrlhf(BASE | {"rollout_batch_size": "many"})
    with pytest.raises(ConfigError, match="--pretrain is missing"):
        from_openrlhf({"rollout_batch_size": 2})
    with pytest.raises(ConfigError, match="requires n_samples_per_prompt > 1"):
        from_openrlhf(BASE | {"n_samples_per_prompt": 1, "train_batch_size": 2})
    with pytest.raises(ConfigError, match=r"^OpenRLHF setting --advantage_estimator dr_grpo, --n_samples_per_prompt 1: "
                                          r"minirl's form of dr_grpo is a group baseline, which needs 2 or more"):
        from_openrlhf(BASE | {"n_samples_per_prompt": 1, "train_batch_size": 2, "advantage_estimator": "dr_grpo"})
    # a typo of an IS-correction flag is not one of vLLM's engine flags (ignored): "did you mean"
    out = from_openrlhf(BASE | {"vllm_is_truncated_treshold": [0.5, 5], "vllm_num_engines": 2, "vllm_sync_backend": "x"})
    assert out.ignored == ["--vllm_sync_backend"]
    assert any("did you mean --vllm_is_truncated_threshold?" in item for item in out.not_translated)
    assert "vllm_num_engines" not in str(out.not_translated)  # an engine flag OpenRLHF has
    for key, value in (("advantage_estimator", "grpo"), ("policy_loss_type", "foo")):  # OpenRLHF's argparse choices
        with pytest.raises(ConfigError, match=rf"^OpenRLHF setting --{key} {value}: OpenRLHF's choices are "):
            from_openrlhf(BASE | {key: value})


def test_warm_up_rounds_up_and_a_run_of_no_full_batch_is_said(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(f'{{"input": "q{i}"}}\n' for i in range(10)))
    given = BASE | {"prompt_data": str(tmp_path / "d.jsonl"), "remote_rm_url": "r.py", "lr_warmup_ratio": 0.03}
    v = from_openrlhf(given).values  # 5 steps x N = 1 x 1 epoch: ceil(0.15) = 1, as OpenRLHF's scheduler
    assert (v["optim.global_steps"], v["optim.warmup_updates"]) == (5, 1)
    out = from_openrlhf(given | {"rollout_batch_size": 16, "train_batch_size": 64})
    assert out.values["optim.global_steps"] == 0 and out.values["optim.warmup_updates"] == 0
    assert any(item.startswith("10 rows make no full batch of --rollout_batch_size 16") for item in out.differs)
    out = from_openrlhf(BASE | {"enable_vllm_is_correction": True})
    assert (out.values["algo.tis_floor"], out.values["algo.tis_cap"]) == (0.0, 2.0)
    assert any("--vllm_is_truncated_threshold unset: OpenRLHF's default depends on its release" in item
               for item in out.differs)


def test_a_script_without_the_launch_line_is_one_line(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("echo hello\n")
    with pytest.raises(ConfigError, match=r"no `python3 -m openrlhf\.cli\.train_ppo_ray"):
        read_openrlhf([str(script)], [])


def test_reward_func_is_called_as_openrlhf_calls_it(tmp_path):
    _files(tmp_path)
    fn = make_reward_fn(f"{tmp_path}/reward_func.py:reward_func")  # found by its parameters' names
    assert fn.openrlhf and fn.batched
    samples = [Sample("1+1=", " 2", "2"), Sample("2+2=", " 5", "4")]
    rewards = fn.score(samples)
    assert rewards == [1.0, 0.0]
    assert isinstance(rewards[0], Scored) and rewards[0].extras == {"accuracy": 1.0, "batch": 0.5}
    seen = {}

    def spy(q, p, lab):  # any names, with the entry's convention
        seen.update(queries=q, prompts=p, labels=lab)
        return [0.5] * len(q)

    assert make_reward_fn(spy, convention="openrlhf").score(samples) == [0.5, 0.5]
    assert seen == {"queries": ["1+1= 2", "2+2= 5"], "prompts": ["1+1=", "2+2="], "labels": ["2", "4"]}
    # --label_key: labels as stored (OpenRLHF's data[label_key]): a number stays one, an object too
    samples = [Sample("1+1=", " 2", "2", columns={"answer": 2}), Sample("q", " x", '{"a": 1}', columns={"answer": {"a": 1}}),
               Sample("2+2=", " 4", "4")]
    make_reward_fn(spy, convention="openrlhf", kwargs={"label_key": "answer"}).score(samples)
    assert seen["labels"] == [2, {"a": 1}, "4"]


def test_a_query_is_the_prompt_and_response_tokens_decoded_with_their_special_tokens(monkeypatch):
    """OpenRLHF 0.9 decodes each sample's prompt and response ids with ``skip_special_tokens=False``: the template's
    markers and the EOS that ended the response are in the query; without ids (or a tokenizer), prompt + response."""
    from minirl.tasks import reward_functions

    words = {1: "<s>", 2: "Q", 3: "A", 4: "</s>"}

    class Vocabulary:
        def decode(self, ids, skip_special_tokens):
            assert skip_special_tokens is False
            return "".join(words[i] for i in ids)

    monkeypatch.setitem(reward_functions._TOKENIZERS, "vocab", Vocabulary())
    seen = {}

    def spy(queries, prompts, labels):
        seen.update(queries=queries, prompts=prompts)
        return [0.0] * len(queries)

    samples = [Sample("Q", "A", "A", completion_ids=[3, 4], prompt_ids=[1, 2]), Sample("Q", "A", "A")]
    make_reward_fn(spy, kwargs={"tokenizer": "vocab", "apply_chat_template": False}).score(samples)
    assert seen == {"queries": ["<s>QA</s>", "QA"], "prompts": ["Q", "Q"]}


def test_apply_chat_template_renders_every_prompt_of_a_call(monkeypatch):
    """``kwargs.tokenizer`` (``--apply_chat_template``): each prompt of the call through its chat template, as
    OpenRLHF hands the engine and ``reward_func`` the rendered text (only the first was, before)."""
    from minirl.tasks import reward_functions

    class Template:
        def apply_chat_template(self, chat, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return "".join(f"<{m['role']}>{m['content']}" for m in chat) + "<assistant>"

    monkeypatch.setitem(reward_functions._TOKENIZERS, "tok", Template())
    seen = {}

    def spy(queries, prompts, labels):
        seen.update(queries=queries, prompts=prompts)
        return [0.0] * len(queries)

    samples = [Sample("1+1=", "2", "2"), Sample([{"role": "user", "content": "2+2="}], "4", "4")]
    make_reward_fn(spy, kwargs={"tokenizer": "tok"}).score(samples)
    assert seen["prompts"] == ["<user>1+1=<assistant>", "<user>2+2=<assistant>"]
    assert seen["queries"] == ["<user>1+1=<assistant>2", "<user>2+2=<assistant>4"]


def test_a_dict_without_rewards_is_one_line(tmp_path):
    def bad(queries, prompts, labels):
        return {"scores": [1.0] * len(queries)}

    with pytest.raises(RewardFunctionError, match="without 'rewards'"):
        make_reward_fn(bad).score([Sample("p", "c", "a")])


def test_the_cli_writes_a_config_minirl_config_show_accepts(tmp_path, capsys):
    script = _files(tmp_path)
    out = tmp_path / "minirl.yaml"
    assert main(["config", "from-openrlhf", str(script), "--actor_num_gpus_per_node", "2", "-o", str(out)]) == 0
    text = out.read_text()
    assert "trainer_ranks: 2  # --actor_num_nodes 1, --actor_num_gpus_per_node 2" in text
    capsys.readouterr()
    assert main(["config", "show", str(out)]) == 0
    assert "algo.eps_high = 0.28" in capsys.readouterr().out


def _openrlhf_gae(r, values, kl, mask, coef, gamma, lambd, clip=(-10.0, 10.0)):
    """OpenRLHF's gae advantages written out: ``compute_reward`` (the clamped reward at each response's last token,
    -coef x KL at every token), ``get_advantages_and_returns``, then the whitening over the rollout's tokens."""
    rewards = -coef * kl * mask
    last = mask.sum(-1).long() - 1
    rewards[torch.arange(len(r)), last] += r.clamp(*clip)
    values, rewards = values * mask, rewards * mask
    lastgaelam, reversed_ = 0.0, []
    for t in reversed(range(mask.shape[1])):
        nextvalues = values[:, t + 1] if t < mask.shape[1] - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lambd * lastgaelam
        reversed_.append(lastgaelam)
    adv = torch.stack(reversed_[::-1], dim=1)
    n = mask.sum()
    mean = (adv * mask).sum() / n
    var = ((adv - mean).pow(2) * mask).sum() / n
    return (adv - mean) * var.clamp(min=1e-8).rsqrt() * mask


def test_ppo_with_a_critic_translates_and_has_openrlhfs_advantages():
    """``--advantage_estimator gae`` (OpenRLHF's default, one sample a prompt): minirl's critic, GAE over the clamped
    reward and the KL in the reward at each token, whitened over the tokens: OpenRLHF's advantages, but for the
    whitening's N - 1 (said in the header)."""
    from minirl.algo.variants.gae import gae_advantages
    from minirl.algo.variants.token_returns import masked_whiten

    out = from_openrlhf({"pretrain": "/m", "critic_pretrain": "/c", "rollout_batch_size": 4, "train_batch_size": 4,
                         "actor_num_gpus_per_node": 1, "gamma": 0.99, "lambd": 0.95, "freezing_actor_steps": 2,
                         "critic_learning_rate": 5e-6, "value_clip": 0.2})
    v = out.values
    assert (v["rollout.samples_per_prompt"], v["algo.adv_baseline"], v["algo.adv_whiten"]) == (1, "critic", True)
    assert (v["algo.adv_gamma"], v["algo.adv_lambda"], v["algo.kl_in_reward_coef"], v["algo.kl_in_reward_type"]) == (
        0.99, 0.95, 0.01, "k1")
    assert v["algo.reward_clip_range"] == [-10.0, 10.0]
    assert (v["critic.lr"], v["critic.clip_value_range"], v["critic.model_path"], v["critic.warmup_steps"]) == (
        5e-6, 0.2, "/c", 3)
    out.config()  # a valid minirl config
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float64)
    r, values, kl = torch.tensor([12.0, -0.5, 1.0], dtype=torch.float64), torch.randn(3, 5).double(), torch.rand(3, 5).double()
    theirs = _openrlhf_gae(r, values, kl, mask, 0.01, 0.99, 0.95)
    advantages, _ = gae_advantages(r.clamp(-10, 10), values, mask.bool(), gamma=0.99, lam=0.95,
                                   token_rewards_BT=-0.01 * kl)
    ours = masked_whiten(advantages, mask.bool()) * mask
    n = mask.sum()
    torch.testing.assert_close(ours, theirs * torch.sqrt((n - 1) / n), rtol=1e-6, atol=1e-7)


def test_an_adaptive_kl_in_the_reward_is_minirls_controller():
    """``--kl_target`` with the KL in the reward (gae, reinforce): minirl's adaptive coefficient (the same controller
    of Ziegler et al.); with ``--use_kl_loss`` (minirl's loss keeps its coefficient) the run trains with MiniRL."""
    v = from_openrlhf({"pretrain": "/m", "rollout_batch_size": 4, "train_batch_size": 4, "actor_num_gpus_per_node": 1,
                       "kl_target": 0.05, "kl_horizon": 2000}).values
    assert (v["algo.kl_in_reward_coef"], v["algo.kl_in_reward_target"], v["algo.kl_in_reward_horizon"]) == (0.01, 0.05, 2000)
    out = from_openrlhf(BASE | {"kl_target": 0.05})
    assert out.objective.startswith("minirl's MiniRL") and "algo.kl_in_reward_target" not in out.values
    assert any("--kl_target 0.05, --use_kl_loss" in line for line in out.not_translated)


@pytest.fixture
def reward_server():
    """A local OpenRLHF-style reward server: 1.0 where the query ends with its label, answered as {"rewards": [...]};
    the first ``state["fail_first"]`` requests get HTTP 503."""
    state = {"posted": [], "fail_first": 0}
    httpd = serve(state, lambda payload: {"rewards": [float(q.endswith(str(label)))
                                                      for q, label in zip(payload["query"], payload["labels"])]})
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/get_reward"
    yield state
    httpd.shutdown()
    httpd.server_close()


def test_an_http_reward_server_gets_what_openrlhf_posts(reward_server):
    """``--remote_rm_url http://...``: minirl's ``openrlhf_rewards.remote_rm`` posts {query, prompts, labels} and reads
    'rewards', retrying a failed request (OpenRLHF's 5 tries, 1 s apart); a server that never answers is one line."""
    from minirl.tasks import openrlhf_rewards

    out = from_openrlhf(BASE | {"remote_rm_url": reward_server["url"], "label_key": "answer"})
    entry = out.values["task.reward_functions"][0]
    assert entry == {"function": "minirl.tasks.openrlhf_rewards:remote_rm", "convention": "openrlhf",
                     "kwargs": {"url": reward_server["url"], "tokenizer": "/m", "apply_chat_template": False,
                                "label_key": "answer"}}
    assert out.values["task.reward_timeout_s"] is None
    fn = make_reward_fn(entry["function"], convention="openrlhf", kwargs=entry["kwargs"])
    reward_server["fail_first"] = 1
    waits: list[float] = []
    samples = [Sample("1+1=", " 2", "2", columns={"answer": 2}), Sample("2+2=", " 5", "4", columns={"answer": 4})]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openrlhf_rewards.time, "sleep", waits.append)
        assert fn.score(samples) == [1.0, 0.0]
    assert waits == [1.0] and reward_server["posted"][-1] == {"query": ["1+1= 2", "2+2= 5"], "prompts": ["1+1=", "2+2="],
                                                              "labels": [2, 4]}
    with pytest.raises(RuntimeError, match=r"^remote_rm: the reward server at http://127.0.0.1:\d+/x \(--remote_rm_url\) "
                                           r"answers HTTP 503 .*, 2 tries$"):
        reward_server["fail_first"] = 10**6
        openrlhf_rewards.remote_rm(["q"], ["p"], ["l"], url=reward_server["url"].replace("get_reward", "x"), tries=2,
                                   sleep=lambda s: None)


def test_a_label_key_no_row_has_is_one_line(tmp_path):
    """OpenRLHF's ``data[label_key]``: a KeyError when no row has it; the translation says so with the file's columns."""
    (tmp_path / "d.jsonl").write_text('{"input": "q", "label": "1"}\n')
    with pytest.raises(ConfigError, match=r"^--label_key lable: no row of .*d.jsonl has a column 'lable' \(its columns: "
                                          r"input, label\); OpenRLHF stops there with a KeyError; did you mean "
                                          r"--label_key label\?$"):
        from_openrlhf(BASE | {"prompt_data": str(tmp_path / "d.jsonl"), "label_key": "lable"})
    assert from_openrlhf(BASE | {"prompt_data": str(tmp_path / "d.jsonl"), "label_key": "label"}).values[
        "task.answer_column"] == "label"
