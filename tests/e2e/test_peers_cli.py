"""A TRL user's `trl grpo --config` file and a verl user's run script, translated by the CLI, then trained."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
import yaml

WORDS = ["abc", "bca", "cab", "acb", "bac", "cba", "aab", "bba"]
# what a run of the tiny preset needs beyond the user's file (no download here; its tokenizer has no chat template)
TINY_RUN = ["model.preset=qwen3-moe-tiny", "task.chat_template=chat.jinja", "task.eval_fraction=0.25", "eval.num_prompts=2",
            "eval.samples_per_prompt=2", "cold_start.enabled=false", "run.threads=1", "cluster.device=cpu"]

TRL_FILE = """\
# trl grpo --config grpo.yaml
dataset_name: {data}
reward_funcs: [my_rewards.reverse_match]
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
steps_per_generation: 2
num_generations: 4
max_completion_length: 8
max_steps: 4
learning_rate: 1.0e-4
loss_type: dr_grpo
scale_rewards: none
bf16: false
gradient_checkpointing: false
output_dir: {runs}/trl-run
logging_steps: 1
"""

REWARD = '''\
def reverse_match(prompts, completions, solution, **kwargs):  # TRL's convention: chat completions, columns by name
    return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]
'''


def _minirl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    (cwd / "chat.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    return subprocess.run([sys.executable, "-m", "minirl.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_trl_config_file_translates_and_trains(tmp_path: Path):
    rows = [{"prompt": [{"role": "user", "content": w}], "solution": w[::-1]} for w in WORDS]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "my_rewards.py").write_text(REWARD)
    (tmp_path / "grpo.yaml").write_text(TRL_FILE.format(data=tmp_path / "train.jsonl", runs=tmp_path))
    proc = _minirl("config", "from-trl", "grpo.yaml", "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "wrote minirl.yaml" in proc.stderr and "minirl train minirl.yaml" in proc.stderr
    text = (tmp_path / "minirl.yaml").read_text()
    assert "normalizer: 32.0  # dr_grpo divides by 4 completions per optimizer step x max_completion_length" in text
    cfg = yaml.safe_load(text)
    assert (cfg["rollout"]["prompts_per_step"], cfg["optim"]["minibatches_per_step"], cfg["optim"]["global_steps"]) == (2, 2, 2)

    train = _minirl("train", "minirl.yaml", *TINY_RUN, cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "trl-run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/reverse_match/mean" in m]
    assert [m["step"] for m in steps] == [1, 2] and all("policy/loss" in m for m in steps)
    run_config = yaml.safe_load((tmp_path / "trl-run" / "config.yaml").read_text())
    assert run_config["algo"]["normalizer"] == 32.0 and run_config["task"]["reward_functions"][0]["function"] == "my_rewards:reverse_match"


SCRIPT = """\
#!/usr/bin/env bash
set -x
DATA={data}
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$DATA \\
    data.train_batch_size=2 \\
    data.max_response_length=8 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=1 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.actor.optim.lr=1e-4 \\
    actor_rollout_ref.rollout.n=4 \\
    actor_rollout_ref.actor.megatron.router_replay.mode=R2 \\
    custom_reward_function.path={reward} \\
    trainer.n_gpus_per_node=1 \\
    trainer.total_training_steps=2 \\
    trainer.default_local_dir={runs}/verl-run \\
    trainer.logger=['console'] $@
"""

VERL_REWARD = '''\
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == ground_truth)
'''


def _verl_run_files(tmp_path: Path, reward: str) -> None:
    """A verl parquet of the words (data_source, chat prompt, ground truth, extra_info), ``reward`` as reward.py and
    SCRIPT as run.sh, in ``tmp_path``."""
    rows = [{"data_source": "letters", "prompt": [{"role": "user", "content": w}],
             "reward_model": {"style": "rule", "ground_truth": w[::-1]}, "extra_info": {"index": i}}
            for i, w in enumerate(WORDS)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    (tmp_path / "reward.py").write_text(reward)
    (tmp_path / "run.sh").write_text(SCRIPT.format(data=tmp_path / "train.parquet", reward=tmp_path / "reward.py", runs=tmp_path))

def test_verl_run_script_translates_and_trains(tmp_path: Path):
    _verl_run_files(tmp_path, VERL_REWARD)
    dapo = ["reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.max_resp_len=8",  # DAPO's overlong shaping
            *(f"+reward_model.reward_kwargs.overlong_buffer_cfg.{k}" for k in ("enable=True", "len=4", "penalty_factor=0.5"))]
    proc = _minirl("config", "from-verl", "run.sh", *dapo, "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((tmp_path / "minirl.yaml").read_text())
    assert cfg["moe"]["routing_replay"] == "R2" and cfg["optim"]["minibatches_per_step"] == 2
    first, overlong = cfg["task"]["reward_functions"]
    assert cfg["algo"]["aggregation"] == "token_mean" and first["function"].endswith("reward.py:compute_score")
    assert overlong["name"] == "overlong_reward" and overlong["weight"] == 0.5

    assert (cfg["eval"]["temperature"], cfg["eval"]["samples_per_prompt"]) == (0.0, 1)  # verl validates greedily

    tiny = [word for word in TINY_RUN if not word.startswith("eval.samples_per_prompt")]
    train = _minirl("train", "minirl.yaml", *tiny, "optim.precision=fp32", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "verl-run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("reward/compute_score/mean" in m for m in metrics) == 2
    penalties = [m["reward/overlong_reward/mean"] for m in metrics if "reward/overlong_reward/mean" in m]
    assert len(penalties) == 2 and all(-1.0 <= p <= 0.0 for p in penalties)
    assert sum("eval/accuracy" in m for m in metrics) >= 2  # before and after, greedy


@pytest.mark.slow  # the default suite's 15-minute budget; its translation: test_peers.py
def test_verls_reinforce_plus_plus_with_the_kl_in_each_return_translates_and_trains(tmp_path: Path):
    """verl's REINFORCE++ with ``gamma`` < 1 and ``use_kl_in_reward``: minirl's token-level returns (one advantage per
    token, the KL of that token and those after it, discounted), trained from the CLI with its reference pass."""
    _verl_run_files(tmp_path, VERL_REWARD)
    proc = _minirl("config", "from-verl", "run.sh", "algorithm.adv_estimator=reinforce_plus_plus", "algorithm.gamma=0.9",
                   "algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.kl_coef=0.05", "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    algo = yaml.safe_load((tmp_path / "minirl.yaml").read_text())["algo"]
    assert (algo["adv_token_returns"], algo["adv_gamma"], algo["kl_in_reward_coef"], algo["adv_whiten"]) == (True, 0.9, 0.05, True)
    tiny = [word for word in TINY_RUN if not word.startswith("eval.samples_per_prompt")]
    train = _minirl("train", "minirl.yaml", *tiny, "optim.precision=fp32", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "verl-run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "train/reward_kl_penalty" in m]
    assert len(steps) == 2 and all(m["train/reward_kl_coef"] == 0.05 for m in steps)


def test_verls_ppo_with_a_critic_and_the_kl_in_the_reward_translates_and_trains(tmp_path: Path):
    """verl's PPO (``adv_estimator=gae``, its default, with ``use_kl_in_reward``): GAE over minirl's critic with the
    KL at each token's reward, the critic's settings from verl's ``critic.*``; trained from the CLI."""
    _verl_run_files(tmp_path, VERL_REWARD)
    proc = _minirl("config", "from-verl", "run.sh", "algorithm.adv_estimator=gae", "algorithm.lam=0.95",
                   "algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.kl_coef=0.05", "critic.optim.lr=1e-4",
                   "critic.cliprange_value=0.2", "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((tmp_path / "minirl.yaml").read_text())
    assert (cfg["algo"]["adv_baseline"], cfg["algo"]["adv_lambda"], cfg["algo"]["kl_in_reward_coef"]) == ("critic", 0.95, 0.05)
    assert (cfg["critic"]["lr"], cfg["critic"]["clip_value_range"]) == (1e-4, 0.2)
    tiny = [word for word in TINY_RUN if not word.startswith("eval.samples_per_prompt")]
    train = _minirl("train", "minirl.yaml", *tiny, "optim.precision=fp32", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "verl-run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "critic/vf_loss" in m]
    assert len(steps) == 2 and all("train/reward_kl_penalty" in m and "policy/loss" in m for m in steps)


GDPO_REWARD = '''\
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    exact = float(solution_str.strip() == ground_truth)
    shared = sum(a == b for a, b in zip(solution_str.strip(), ground_truth)) / max(len(ground_truth), 1)
    return {"score": exact, "exact_reward": exact, "prefix_reward": shared}
'''


@pytest.mark.slow  # the default suite's 15-minute budget; its translation and keyed rewards: test_peers.py
def test_verls_gdpo_translates_to_keyed_rewards_and_trains(tmp_path: Path):
    """verl's ``gdpo`` with ``gdpo_reward_keys``: one reward entry per key of compute_score's dict, GDPO's advantages
    with the token whitening; trained from the CLI (reward/<key>/mean logged for each)."""
    _verl_run_files(tmp_path, GDPO_REWARD)
    proc = _minirl("config", "from-verl", "run.sh", "algorithm.adv_estimator=gdpo",
                   "+algorithm.gdpo_reward_keys=[exact_reward,prefix_reward]", "+algorithm.gdpo_reward_weights=[1.0,0.5]",
                   "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((tmp_path / "minirl.yaml").read_text())
    assert [(e["key"], e["weight"]) for e in cfg["task"]["reward_functions"]] == [("exact_reward", 1.0), ("prefix_reward", 0.5)]
    assert (cfg["algo"]["multi_objective_aggregation"], cfg["algo"]["adv_whiten"]) == ("normalize_then_sum", True)
    tiny = [word for word in TINY_RUN if not word.startswith("eval.samples_per_prompt")]
    train = _minirl("train", "minirl.yaml", *tiny, "optim.precision=fp32", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "verl-run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/prefix_reward/mean" in m]
    assert len(steps) == 2 and all("reward/exact_reward/mean" in m for m in steps)


RLOO_FILE = """\
# trl rloo --config rloo.yaml
dataset_name: {data}
reward_funcs: [my_rewards.reverse_match]
per_device_train_batch_size: 8
num_generations: 4
max_completion_length: 8
max_steps: 2
learning_rate: 1.0e-4
beta: 0.02
normalize_advantages: true
reward_clip_range: [0.0, 0.5]
bf16: false
gradient_checkpointing: false
output_dir: {runs}/rloo-run
"""


def test_a_trl_rloo_config_translates_and_trains(tmp_path: Path):
    """`trl rloo --config rloo.yaml` typed as `minirl config from-trl rloo --config rloo.yaml`: TRL RLOOTrainer's loss
    (the response's own clipped ratio), its leave-one-out advantage whitened over responses, the clamped reward and
    the KL in the reward; trained from the CLI (the reference pass runs: its KL metric is logged)."""
    rows = [{"prompt": [{"role": "user", "content": w}], "solution": w[::-1]} for w in WORDS]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "my_rewards.py").write_text(REWARD)
    (tmp_path / "rloo.yaml").write_text(RLOO_FILE.format(data=tmp_path / "train.jsonl", runs=tmp_path))
    proc = _minirl("config", "from-trl", "rloo", "--config", "rloo.yaml", "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "minirl.yaml").read_text()
    assert "by `minirl config from-trl rloo`" in text and "your TRL RLOO loss as minirl's algo.name=gspo, the same" in text
    algo = yaml.safe_load(text)["algo"]
    assert (algo["sequence_ratio"], algo["adv_baseline"], algo["adv_whiten_over"]) == ("sum", "leave_one_out", "responses")
    assert (algo["reward_clip_range"], algo["kl_in_reward_coef"]) == ([0.0, 0.5], 0.02)

    train = _minirl("train", "minirl.yaml", *TINY_RUN, cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "rloo-run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "policy/loss" in m]
    assert len(steps) == 2 and all(m["train/reward_kl_coef"] == 0.02 and "policy/seq_clip_frac" in m for m in steps)


def test_a_trl_command_line_is_taken_as_trl_users_type_it(tmp_path: Path):
    from minirl.cli import trl_command_line

    words = ["--config", "grpo.yaml", "--learning_rate", "5e-6", "--use_vllm", "--num_generations=4", "-o", "out.yaml",
             "--keep-objective", "--vllm_mode", "colocate"]
    assert trl_command_line(words) == ["grpo.yaml", "learning_rate=5e-6", "use_vllm=true", "num_generations=4", "-o",
                                       "out.yaml", "--keep-objective", "vllm_mode=colocate"]
    # `trl rloo --config rloo.yaml --reward_clip_range -1 1`: the trainer word stays, two values make a list
    assert trl_command_line(["rloo", "--config", "rloo.yaml", "--reward_clip_range", "-1", "1", "-o", "x.yaml"]) == [
        "rloo", "rloo.yaml", "reward_clip_range=[-1, 1]", "-o", "x.yaml"]
    (tmp_path / "grpo.yaml").write_text("max_steps: 10\n")
    (tmp_path / "sft.yaml").write_text("max_steps: 30\nlearning_rate: 1e-5\n")
    proc = _minirl("config", "from-trl", "--config", "grpo.yaml", "--learning_rate", "5e-6", "--num_generations", "4",
                   "--sft", "sft.yaml", "-o", "out.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((tmp_path / "out.yaml").read_text())
    assert cfg["optim"]["lr"] == 5e-6 and cfg["rollout"]["samples_per_prompt"] == 4 and cfg["optim"]["global_steps"] == 10
    assert cfg["cold_start"]["enabled"] and (cfg["cold_start"]["steps"], cfg["cold_start"]["lr"]) == (30, 1e-5)


def test_a_broken_peer_file_is_one_line(tmp_path: Path):
    (tmp_path / "grpo.yaml").write_text("per_device_train_batch_size: 6\n")
    proc = _minirl("config", "from-trl", "grpo.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "per_device_train_batch_size=6, num_processes=1, num_generations=8" in proc.stderr
    proc = _minirl("config", "from-verl", cwd=tmp_path)
    assert proc.returncode == 2 and "config from-verl: give a verl run script" in proc.stderr
    proc = _minirl("config", "from-verl", "missing.sh", cwd=tmp_path)
    assert proc.returncode == 2 and "missing.sh" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_verl_one_step_off_bypass_data_list_and_prompt_cut_translate_and_train(tmp_path: Path):
    """verl's one-step-off trainer with its bypass mode (R3, no old-log-prob pass, the next batch sampled beside the
    update), a list of train files, a left prompt cut and a repetition penalty: translated, and trained from the CLI."""
    rows = [{"data_source": "letters", "prompt": [{"role": "user", "content": w * 5}],
             "reward_model": {"style": "rule", "ground_truth": w[::-1]}} for w in WORDS]
    half = len(rows) // 2
    datasets.Dataset.from_list(rows[:half]).to_parquet(str(tmp_path / "a.parquet"))
    datasets.Dataset.from_list(rows[half:]).to_parquet(str(tmp_path / "b.parquet"))
    (tmp_path / "reward.py").write_text(VERL_REWARD)
    script = SCRIPT.format(data="x", reward=tmp_path / "reward.py", runs=tmp_path)
    (tmp_path / "run.sh").write_text(script.replace("verl.trainer.main_ppo", "verl.experimental.one_step_off_policy.main_ppo"))
    files = f"data.train_files=[{tmp_path / 'a.parquet'},{tmp_path / 'b.parquet'}]"
    extra = [files, "actor_rollout_ref.actor.megatron.router_replay.mode=R3",  # its config turns the bypass on
             "data.max_prompt_length=12", "data.truncation=left", "+actor_rollout_ref.rollout.repetition_penalty=1.2"]
    proc = _minirl("config", "from-verl", "run.sh", *extra, "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((tmp_path / "minirl.yaml").read_text())
    assert cfg["task"]["path"] == [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert (cfg["task"]["max_prompt_tokens"], cfg["task"]["prompt_truncation"]) == (12, "left")
    assert (cfg["algo"]["logp_old_source"], cfg["moe"]["routing_replay"]) == ("rollout", "R3")
    assert (cfg["rollout"]["repetition_penalty"], cfg["rollout"]["async_steps"]) == (1.2, 1)

    tiny = [word for word in TINY_RUN if not word.startswith("eval.samples_per_prompt")]
    train = _minirl("train", "minirl.yaml", *tiny, "optim.precision=fp32", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    assert "prompts are longer than 12 tokens; each is cut from the left" in train.stdout + train.stderr
    metrics = [json.loads(line) for line in (tmp_path / "verl-run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "policy/loss" in m]
    assert len(steps) == 2 and all(m["time/old_logprobs_s"] < 0.05 and m["mismatch/kl_k3"] >= 0 for m in steps)
    assert [m["rollout/policy_lag_steps"] for m in steps] == [0.0, 1.0]


OPEN_R1_FILE = """\
# an open-r1 recipe (recipes/*/grpo/config_demo.yaml's keys)
dataset_name: {data}
dataset_config: default
dataset_prompt_column: problem
system_prompt: "Reverse the word."
reward_funcs: [accuracy, format, tag_count, cosine]
reward_weights: [1.0, 0.5, 0.5, 1.0]
cosine_max_len: 64
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
num_generations: 4
max_completion_length: 8
max_steps: 2
learning_rate: 1.0e-4
bf16: false
gradient_checkpointing: false
output_dir: {runs}/open-r1-run
logging_steps: 1
"""


@pytest.mark.slow  # the default suite's 15-minute budget; its translation: test_peers.py
def test_an_open_r1_recipe_translates_and_trains(tmp_path: Path):
    """open-r1's script arguments: a dataset repository directory, its prompt column as a user message after the
    system prompt, its registry's rewards (rewritten) with their arguments."""
    data = tmp_path / "math"
    (data / "data").mkdir(parents=True)
    rows = [{"problem": w, "solution": f"${i}$"} for i, w in enumerate(WORDS)]
    datasets.Dataset.from_list(rows).to_parquet(str(data / "data" / "train-00000-of-00001.parquet"))
    (tmp_path / "grpo.yaml").write_text(OPEN_R1_FILE.format(data=data, runs=tmp_path))
    proc = _minirl("config", "from-trl", "grpo.yaml", "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((tmp_path / "minirl.yaml").read_text())
    task = cfg["task"]
    assert (task["prompt_column"], task["system_prompt"], task["chat_prompts"]) == ("problem", "Reverse the word.", True)
    assert [f["function"].split(":")[1] for f in task["reward_functions"]] == [
        "accuracy_reward", "format_reward", "tag_count_reward", "cosine_scaled_reward"]
    assert task["reward_functions"][3]["kwargs"] == {"min_value_wrong": 0.0, "max_value_wrong": -0.5, "min_value_correct": 0.5,
                                                     "max_value_correct": 1.0, "max_len": 64}

    train = _minirl("train", "minirl.yaml", *TINY_RUN, "--dump-rollouts", "dump", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "open-r1-run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("reward/cosine_scaled_reward/mean" in m for m in metrics) == 2
    dumped = torch.load(tmp_path / "dump" / "step_000001.pt", weights_only=True)
    assert all(text.startswith("Reverse the word.\n") and text.split("\n")[1] in WORDS for text in dumped["prompts"])
    rendered = "Reverse the word.\n" + dumped["prompts"][0].split("\n")[1] + "\n"  # chat.jinja: each message's content
    assert len(dumped["completions"][0]["prompt_ids"]) == len(rendered)  # one id a character: both messages rendered


@pytest.mark.slow  # the default suite's 15-minute budget; verl_scores is unit-tested
def test_a_verl_run_without_a_reward_function_scores_with_verls_default(tmp_path: Path):
    """No custom_reward_function: verl's default_compute_score by data_source (gsm8k's and DAPO's here), rewritten."""
    rows = [{"data_source": source, "prompt": [{"role": "user", "content": w}],
             "reward_model": {"style": "rule", "ground_truth": "7"}}
            for w, source in zip(WORDS, ["openai/gsm8k", "math_dapo"] * 4)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    script = SCRIPT.format(data=tmp_path / "train.parquet", reward="x", runs=tmp_path)
    script = "\n".join(line for line in script.splitlines() if "custom_reward_function" not in line)
    (tmp_path / "run.sh").write_text(script.replace("router_replay.mode=R2", "router_replay.mode=R3"))
    proc = _minirl("config", "from-verl", "run.sh", "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load((tmp_path / "minirl.yaml").read_text())
    assert cfg["task"]["reward_function"] == "minirl.tasks.verl_scores:default_compute_score"
    tiny = [word for word in TINY_RUN if not word.startswith("eval.samples_per_prompt")]
    train = _minirl("train", "minirl.yaml", *tiny, "optim.precision=fp32", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "verl-run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "policy/loss" in m]
    # gsm8k's scorer gives 0 to a response without "#### 7", DAPO's -1: a tiny random model's rewards lie in [-1, 0]
    assert len(steps) == 2 and all(-1.0 <= m["train/reward_mean"] <= 0.0 for m in steps)
    assert any(m["train/reward_mean"] < 0 for m in steps) and any("reward/default_compute_score/acc" in m for m in steps)


@pytest.mark.slow  # the default suite's 15-minute budget; their translations: test_peers.py
def test_verls_gpg_and_reinforce_plus_plus_scripts_translate_and_train(tmp_path: Path):
    """verl's GPG recipe (``adv_estimator=gpg`` with ``loss_mode=gpg``, one update per batch) and REINFORCE++
    (``adv_estimator=reinforce_plus_plus``): each translated with its loss and trained from the CLI."""
    rows = [{"data_source": "letters", "prompt": [{"role": "user", "content": w}],
             "reward_model": {"style": "rule", "ground_truth": w[::-1]}} for w in WORDS]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    (tmp_path / "reward.py").write_text(VERL_REWARD)
    script = SCRIPT.format(data=tmp_path / "train.parquet", reward=tmp_path / "reward.py", runs=tmp_path)
    (tmp_path / "run.sh").write_text(script.replace("ppo_mini_batch_size=1", "ppo_mini_batch_size=2"))
    tiny = [word for word in TINY_RUN if not word.startswith("eval.samples_per_prompt")]
    for name, extra in (("gpg", ["algorithm.adv_estimator=gpg", "actor_rollout_ref.actor.policy_loss.loss_mode=gpg"]),
                        ("rpp", ["algorithm.adv_estimator=reinforce_plus_plus"])):
        proc = _minirl("config", "from-verl", "run.sh", *extra, f"trainer.default_local_dir={tmp_path}/{name}",
                       "-o", f"{name}.yaml", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "# Objective: your verl loss as minirl's algo.name=minirl" in (tmp_path / f"{name}.yaml").read_text()
        algo = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())["algo"]
        if name == "gpg":
            assert (algo["adv_nonzero_rescale"], algo["clip"], algo["staleness_weight"]) == (True, False, False)
        else:
            assert (algo["adv_baseline"], algo["adv_whiten"], algo["clip"]) == ("none", True, True)
        train = _minirl("train", f"{name}.yaml", *tiny, "optim.precision=fp32", cwd=tmp_path)
        assert train.returncode == 0, train.stderr[-3000:]
        metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in metrics if "policy/loss" in m]
        assert len(steps) == 2 and all(m["policy/loss"] == m["policy/loss"] for m in steps)  # finite, not NaN
        if name == "gpg":
            assert all(m["policy/clip_frac"] == 0.0 for m in steps)


SLIME_SCRIPT = """\
#!/bin/bash
set -ex
source "${{SCRIPT_DIR}}/models/qwen3-30B-A3B.sh"
DATA={data}
ROLLOUT_ARGS=(
   --prompt-data $DATA
   --input-key prompt
   --label-key label
   --apply-chat-template
   --custom-rm-path my_rm.score
   --reward-key score
   --num-rollout 2
   --rollout-batch-size 2
   --n-samples-per-prompt 4
   --rollout-max-response-len 8
   --rollout-temperature 0.9
   --global-batch-size 4
)
GRPO_ARGS=(
   --advantage-estimator grpo
   --eps-clip 0.2
   --eps-clip-high 0.28
   --use-tis
   # --use-opsm
)
ray job submit --address="http://127.0.0.1:8265" -- python3 train.py \\
   --actor-num-nodes 1 --actor-num-gpus-per-node 1 --colocate \\
   ${{MODEL_ARGS[@]}} ${{ROLLOUT_ARGS[@]}} ${{GRPO_ARGS[@]}} \\
   --save {runs}/slime-run --save-interval 1
"""

SLIME_REWARD = '''\
async def score(args, sample, **kwargs):  # slime's --custom-rm-path convention
    assert args.reward_key == "score" and args.n_samples_per_prompt == 4
    return {"score": float(sample.response.strip() == sample.label), "length": len(sample.response)}
'''


def test_a_slime_launch_script_translates_and_trains(tmp_path: Path):
    """slime's shape: bash arrays expanded into `ray job submit ... -- python3 train.py`, a sourced model file, an
    async (args, sample) reward with --reward-key, TIS; then `minirl train` on the tiny preset."""
    rows = [{"prompt": [{"role": "user", "content": w}], "label": w[::-1]} for w in WORDS]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "my_rm.py").write_text(SLIME_REWARD)
    (tmp_path / "run.sh").write_text(SLIME_SCRIPT.format(data=tmp_path / "train.jsonl", runs=tmp_path))
    proc = _minirl("config", "from-slime", "run.sh", "--lr", "1e-4", "-o", "minirl.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "minirl.yaml").read_text()
    assert "lr: 0.0001  # --lr 0.0001" in text and "MODEL_ARGS" in text
    cfg = yaml.safe_load(text)
    assert (cfg["optim"]["minibatches_per_step"], cfg["algo"]["name"], cfg["algo"]["tis_cap"]) == (2, "grpo", 2.0)

    train = _minirl("train", "minirl.yaml", *TINY_RUN, "optim.precision=fp32", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "slime-run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/score/mean" in m]
    assert [m["step"] for m in steps] == [1, 2] and all("policy/loss" in m for m in steps)
    assert (tmp_path / "slime-run" / "checkpoint").is_dir()
