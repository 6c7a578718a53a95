"""Exact resume: a CLI run SIGKILLed at arbitrary moments (after k metrics rows, in the middle of a
checkpoint write) and resumed each time ends bitwise identical to an uninterrupted run: every
tensor of the final HF checkpoint, the list of logged steps (each exactly once) and every step's
``train/reward_mean``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8

TINY = [
    "model.preset=qwen3-moe-tiny", "task.kind=reverse", "task.difficulty=3", "task.num_train_prompts=64",
    "task.num_eval_prompts=8", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=12",
    f"optim.global_steps={STEPS}", "optim.micro_batch_sequences=4", "optim.lr=1e-2", "eval.num_prompts=4",
    "eval.samples_per_prompt=2", "eval.every_steps=3", "cold_start.enabled=false", "run.threads=1", "log.console=false",
    "checkpoint.every_steps=1", "checkpoint.keep_last=2", "rollout.precision=bf16",
    # a dense reward: all-zero rewards (a random model never reverses exactly) would leave the weights unchanged
    "task.reward_function=tests.resume.shaped_reward:score", "task.reward_timeout_s=null",
]
MODES = {"none": ["moe.routing_replay=none"],
         "R2": ["moe.routing_replay=R2", "optim.minibatches_per_step=2"],
         "R3": ["moe.routing_replay=R3", "optim.minibatches_per_step=2"],
         # a resume skips the SFT cold start: the checkpoint holds the RL weights
         "cold_start": ["moe.routing_replay=R3", "cold_start.enabled=true", "cold_start.steps=5", "cold_start.examples=32",
                        "cold_start.batch_sequences=8"],
         # TRL's and verl's practices: dynamic sampling's rounds move the data order and seeds, rejection,
         # whitening, the entropy bonus and token selection shape the update; a resume must land on the same numbers
         "practices": ["rollout.filter_groups=true", "rollout.filter_groups_metric=accuracy",
                       "rollout.filter_groups_max_rounds=2", "algo.reject=token_k1", "algo.reject_low=0.99",
                       "algo.reject_high=1.01", "algo.adv_whiten=true", "algo.dual_clip=1.5",
                       # adaptive entropy control's state (coefficient, last entropy) must survive the kill
                       "algo.entropy_coef=0.01", "algo.entropy_target=10.0", "algo.entropy_coef_delta=0.05",
                       "algo.top_entropy_quantile=0.5",
                       # a reference synced every 2 updates (TRL's sync_ref_model) is checkpointed with the run
                       "algo.kl_coef=0.05", "algo.ref_sync_every_updates=2", "algo.ref_sync_alpha=0.5",
                       # verl's KL in the reward with its adaptive coefficient (state that must survive the kill)
                       "algo.kl_in_reward_coef=0.05", "algo.kl_in_reward_target=0.01", "algo.kl_in_reward_horizon=8"],
         # one-step-off: a checkpoint holds the next step's batch, sampled beside the saved step's update, and the
         # weights that sampled it (rollout.async_split_mismatch's kept copy: the first resumed step splits too)
         "async": ["moe.routing_replay=R3", "optim.minibatches_per_step=2", "rollout.async_steps=1",
                   "rollout.filter_groups=true", "rollout.filter_groups_max_rounds=2",
                   "rollout.async_split_mismatch=true"],
         # three steps off: a checkpoint holds the three batches ahead, sampled beside the last three updates
         "async3": ["moe.routing_replay=R3", "optim.minibatches_per_step=2", "rollout.async_steps=3"],
         # ReMax's greedy baseline, sampled ahead beside the update: the checkpoint holds its greedy rewards too
         "remax": ["moe.routing_replay=R3", "rollout.async_steps=1", "algo.adv_baseline=greedy",
                   "algo.reward_clip_range=[0.0, 0.8]"],
         # partial rollouts (slime's): the checkpoint holds the pool of groups still decoding, with their responses
         # so far (tokens, log-probs, routes, the step that sampled each)
         "partial": ["moe.routing_replay=R3", "rollout.partial_rollout=true", "rollout.partial_pool_prompts=4",
                     "rollout.partial_chunk_tokens=3", "rollout.filter_groups=true", "rollout.filter_groups_max_rounds=2",
                     "rollout.partial_mask_stale=true",  # stop strings: the lengths vary, so responses span steps
                     "task.stop_strings=[a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t]"],
         # partial rollouts beside the update (verl's fully asynchronous partial_rollout): the checkpoint holds the
         # next step's batch and the pool as that batch's sampling left it
         "partial_async": ["moe.routing_replay=R3", "rollout.partial_rollout=true", "rollout.partial_pool_prompts=4",
                           "rollout.partial_chunk_tokens=3", "rollout.async_steps=1",
                           "task.stop_strings=[a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t]"],
         # PPO with a critic (verl's gae): the checkpoint holds the critic's weights and AdamW state; it warms up alone
         "critic": ["moe.routing_replay=R3", "optim.minibatches_per_step=2", "algo.adv_baseline=critic",
                    "algo.adv_whiten=true", "algo.adv_gamma=0.99", "algo.adv_lambda=0.95", "critic.lr=1e-3",
                    "critic.warmup_steps=2"]}


def _command(tmp_path: Path, name: str, extra: list[str], *more: str) -> list[str]:
    return [sys.executable, "-m", "minirl.cli", "train", "configs/demo.yaml", *TINY, *extra,
            f"run.output_dir={tmp_path}", f"run.name={name}", *more]


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONHASHSEED", None)  # each process hashes strings differently: results must not depend on it
    return env


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoint" / "model.safetensors")


def _tmp_dirs(run: Path) -> list[str]:
    try:
        return [p for p in os.listdir(run / "checkpoints") if ".tmp-" in p]
    except FileNotFoundError:
        return []


def _lines(run: Path) -> int:
    try:
        return (run / "metrics.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _run_killed(cmd: list[str], run: Path, kill: tuple[str, int]) -> bool:
    """Start ``cmd``; SIGKILL it once ``kill`` happens (("lines", k): metrics.jsonl holds k rows;
    ("tmp", k): a checkpoint is being written and metrics.jsonl holds k rows). False if the run finished first."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kind, k = kill
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if _lines(run) >= k and (kind == "lines" or _tmp_dirs(run)):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.002 if kind == "tmp" else 0.01)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-3000:]
    return False


def mismatch(row: dict) -> dict:
    return {k: v for k, v in row.items() if k.startswith("mismatch/")}


def _check_same(tmp_path: Path, mode: str, kills: list[tuple[str, int]]) -> None:
    extra = MODES[mode]
    ref = subprocess.run(_command(tmp_path, "ref", extra), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    run = tmp_path / "killed"
    cmd = _command(tmp_path, "killed", extra, "--resume")
    killed = []
    for kill in kills:
        killed.append(_run_killed(cmd, run, kill))
        if not killed[-1]:
            break
    for kill, done in zip(kills, killed):
        assert done, f"the run ended before the kill {kill}"
    final = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "resumed from" in final.stderr
    starts = [json.loads(line) for line in (run / "environment.jsonl").read_text().splitlines()]
    assert len(starts) >= 2 and starts[0]["from_step"] == 0 and starts[-1]["from_step"] > 0  # one line per (re)start

    want, got = _rows(tmp_path / "ref"), _rows(run)
    assert [r["step"] for r in got] == list(range(STEPS + 1)) == [r["step"] for r in want]
    assert [r.get("train/reward_mean") for r in got] == [r.get("train/reward_mean") for r in want]
    assert [r.get("eval/reward_mean") for r in got] == [r.get("eval/reward_mean") for r in want]
    assert [mismatch(r) for r in got] == [mismatch(r) for r in want]  # the monitor's metrics too, every key
    a, b = _weights(tmp_path / "ref"), _weights(run)
    assert a.keys() == b.keys()
    differing = [name for name in a if not torch.equal(a[name], b[name])]
    assert not differing, f"{len(differing)} tensors differ after resume, e.g. {differing[:3]}"
    start = load_file(run / "checkpoints" / f"step_{STEPS:06d}" / "model" / "model.safetensors")
    assert all(torch.equal(start[n], a[n]) for n in a)  # the last resumable checkpoint is the final model
    assert not _tmp_dirs(run)
    assert sorted(os.listdir(run / "checkpoints")) == [f"step_{STEPS - 1:06d}", f"step_{STEPS:06d}"]


@pytest.mark.parametrize("mode, kills", [  # R2, practices and ReMax in the slow suite (the default's 15-minute budget)
    ("none", [("lines", 3), ("tmp", 0)]),  # ("tmp", 0) after a resume: a later checkpoint
    pytest.param("R2", [("tmp", 3)], marks=pytest.mark.slow),
    ("R3", [("lines", 6)]),
    pytest.param("practices", [("lines", 4)], marks=pytest.mark.slow),
    ("async", [("lines", 3), ("tmp", 0)]),
    pytest.param("async3", [("lines", 4), ("tmp", 0)], marks=pytest.mark.slow),
    pytest.param("remax", [("lines", 3)], marks=pytest.mark.slow),
    ("critic", [("lines", 4)]),
    pytest.param("partial", [("lines", 3), ("tmp", 0)], marks=pytest.mark.slow),
    ("partial_async", [("lines", 3), ("tmp", 0)]),
])
def test_killed_and_resumed_run_is_bitwise_identical(tmp_path, mode, kills):
    _check_same(tmp_path, mode, kills)
    if mode.startswith("partial"):  # not vacuous: responses begun in one step were trained in a later one
        assert any(row.get("rollout/partial_responses_frac", 0) > 0 for row in _rows(tmp_path / "ref"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "R2", "R3", "cold_start"])
def test_kill_matrix(tmp_path, mode):
    _check_same(tmp_path, mode, [("tmp", 0), ("lines", 1), ("tmp", 0), ("lines", 4), ("tmp", 0), ("lines", 7), ("tmp", 0)])


def test_weights_change_during_the_run(tmp_path):
    """Guard against a vacuous comparison: the reward is dense, so training moves the weights."""
    proc = subprocess.run(_command(tmp_path, "w", MODES["none"], "optim.global_steps=2"), cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = load_file(tmp_path / "w" / "checkpoints" / "step_000001" / "model" / "model.safetensors")
    last = _weights(tmp_path / "w")
    assert any(not torch.equal(first[n], last[n]) for n in first)
