"""``rollout.async_steps: 1`` (verl's one-step-off policy): step t+1's rollout and rewards run in a thread beside
step t's update, on the engine's weights before it. A threaded run is bitwise a synchronous run whose engine gets
each step's weights one sync late, and the rollout really runs while the update does."""

from __future__ import annotations

import threading

import pytest
import torch

from minirl.config import ConfigError, load_config
from tests.distributed.common import run_steps

ENGINE = ("moe.routing_metrics=true", "rollout.precision=fp8_e4m3")  # a training–inference gap on top of the lag


def one_sync_late(run) -> None:
    """The synchronous loop with the engine one weight sync behind: batch t+1 is sampled on theta_{t-1}."""
    load, pending = run.engine.load_weights, []

    def late(state_dict):
        pending.append({name: tensor.clone() for name, tensor in state_dict.items()})
        if len(pending) > 1:
            load(pending.pop(0))
    run.engine.load_weights = late


def training(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/", "rollout/policy_lag"))} for row in metrics]


@pytest.mark.parametrize("settings", [
    ("moe.routing_replay=none", "optim.minibatches_per_step=1"),  # N = 1: pi_old from the update's own forward
    ("moe.routing_replay=R3", "optim.minibatches_per_step=2"),  # the stale engine's routes replayed
    ("moe.routing_replay=R2", "optim.minibatches_per_step=2", "rollout.filter_groups=true"),
])
def test_one_step_off_is_the_synchronous_loop_with_the_engine_one_sync_late(tmp_path, settings):
    threaded = run_steps(tmp_path / "async", *ENGINE, *settings, "rollout.async_steps=1", steps=4)
    late = run_steps(tmp_path / "late", *ENGINE, *settings, steps=4, on_setup=one_sync_late)
    synchronous = run_steps(tmp_path / "sync", *ENGINE, *settings, steps=4)
    assert training(threaded[0]) == training(late[0])
    for name, tensor in late[1].items():
        assert torch.equal(threaded[1][name], tensor), name
    assert [row["rollout/policy_lag_steps"] for row in threaded[0]] == [0.0, 1.0, 1.0, 1.0]
    assert "rollout/policy_lag_steps" not in synchronous[0][0]
    # the first step is the synchronous one; the second trains on a batch of the initial weights
    assert training(threaded[0])[0] == training(synchronous[0])[0]
    assert threaded[0][1]["train/reward_mean"] != synchronous[0][1]["train/reward_mean"]


def test_the_rollout_runs_beside_the_update(tmp_path):
    """Step 1's update waits until step 2's rollout has started in its own thread (30 s at most): a run that
    sampled in line would time out here."""
    started, threads = threading.Event(), []

    def on_setup(run):
        rollouts, update = run.rollouts.rollouts, run.trainer.update

        def rollout(step, *args, **kwargs):
            threads.append((step, threading.current_thread().name))
            if step == 2:
                started.set()
            return rollouts(step, *args, **kwargs)

        def waiting_update(*args, **kwargs):
            assert started.wait(30), "no rollout ran beside the update"
            return update(*args, **kwargs)
        run.rollouts.rollouts, run.trainer.update = rollout, waiting_update

    metrics, _ = run_steps(tmp_path, "rollout.async_steps=1", steps=3, on_setup=on_setup)
    assert threads[0] == (1, "MainThread")  # run_steps stops before optim.global_steps: step 4's was started too
    assert threads[1:] == [(step, f"minirl-rollout-step-{step}") for step in (2, 3, 4)]
    assert all(row["time/rollout_wait_s"] >= 0 and row["time/rollout_s"] > 0 for row in metrics)


def test_an_error_in_the_rollout_beside_the_update_stops_the_step(tmp_path):
    def on_setup(run):
        score = run.rewards.score

        def failing(prompts, completions):
            if threading.current_thread().name == "minirl-rollout-step-3":
                raise RuntimeError("the verifier broke")
            return score(prompts, completions)
        run.rewards.score = failing

    with pytest.raises(RuntimeError, match="the verifier broke"):
        run_steps(tmp_path, "rollout.async_steps=1", steps=3, on_setup=on_setup)


def test_what_it_cannot_do_is_one_line():
    with pytest.raises(ConfigError, match=r"rollout\.async_steps: must be less than or equal to 1"):
        load_config(None, ["rollout.async_steps=2"])
    with pytest.raises(ConfigError, match=r"rollout\.async_steps: the rollout beside the update cannot capture CUDA"):
        load_config(None, ["rollout.async_steps=1", "rollout.cuda_graphs=true", "cluster.device=cuda"])
    # trainer ranks in their own processes: the engine's capture overlaps no kernel of this process
    load_config(None, ["rollout.async_steps=1", "rollout.cuda_graphs=true", "cluster.device=cuda", "cluster.trainer_ranks=2"])


def test_a_lag_nothing_corrects_is_said_in_one_line():
    from minirl.loop import uncorrected_lag

    def line(*overrides):
        return uncorrected_lag(load_config(None, ["rollout.async_steps=1", *overrides]))

    assert line() is None  # MiniRL's IS weight pi_theta/mu_old sees the lag
    assert line("algo.logp_old_source=rollout", "algo.is_correction=false") is None  # the clip sees it
    # ... and the weight pi_theta/mu_old without the clip; but plain REINFORCE (neither) sees nothing
    assert line("algo.logp_old_source=rollout", "algo.is_correction=false", "algo.clip=false") is None
    assert "algo.is_correction=true" in line("algo.logp_old_source=rollout", "algo.is_correction=false", "algo.clip=false",
                                             "algo.staleness_weight=false")
    assert line("algo.staleness_weight=false") is None  # pi_old/mu_old still weighs each token
    assert line("algo.is_correction=false").endswith("set algo.is_correction=true or algo.logp_old_source=rollout "
                                                     "(the clip then bounds pi_theta/mu_old)")
    gspo = line("algo.name=gspo")  # no mu_old factor to turn on
    assert "algo.name=gspo" in gspo and "is_correction" not in gspo
    assert uncorrected_lag(load_config(None, ["algo.is_correction=false"])) is None  # synchronous: no lag
