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


def syncs_late(k: int):
    """The synchronous loop with the engine ``k`` weight syncs behind: batch t is sampled on theta_{max(0, t-1-k)}."""
    def on_setup(run) -> None:
        load, pending = run.engine.load_weights, []

        def late(state_dict):
            pending.append({name: tensor.clone() for name, tensor in state_dict.items()})
            if len(pending) > k:
                load(pending.pop(0))
        run.engine.load_weights = late
    return on_setup


one_sync_late = syncs_late(1)


def training(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/", "rollout/policy_lag"))} for row in metrics]


@pytest.mark.parametrize("settings", [
    ("moe.routing_replay=none", "optim.minibatches_per_step=1"),  # N = 1: pi_old from the update's own forward
    ("moe.routing_replay=R3", "optim.minibatches_per_step=2"),  # the stale engine's routes replayed
    ("moe.routing_replay=R2", "optim.minibatches_per_step=2", "rollout.filter_groups=true"),
    # partial rollouts beside the update (verl's fully asynchronous partial_rollout): the pool is sampled step by
    # step in the thread, its unfinished responses continued on the next (late) weights
    ("moe.routing_replay=R3", "optim.minibatches_per_step=2", "rollout.partial_rollout=true",
     "rollout.partial_chunk_tokens=2", "rollout.max_new_tokens=16", "task.stop_strings=[a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p]"),
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
    if "rollout.partial_rollout=true" in settings:  # not vacuous: responses begun for one batch trained in a later one
        assert max(row["rollout/partial_responses_frac"] for row in threaded[0]) > 0


@pytest.mark.parametrize("k, settings", [
    (2, ("moe.routing_replay=R3", "optim.minibatches_per_step=2")),
    pytest.param(3, ("moe.routing_replay=R2", "optim.minibatches_per_step=2", "rollout.filter_groups=true"),
                 marks=pytest.mark.slow),
])
def test_k_steps_off_is_the_synchronous_loop_with_the_engine_k_syncs_late(tmp_path, k, settings):
    """``rollout.async_steps: k``: the first step starts steps 2..k+1 beside its update on the initial weights (lags
    1..k), each later step the one k ahead: bitwise the synchronous loop whose engine is k weight syncs behind."""
    steps = k + 3
    threaded = run_steps(tmp_path / "async", *ENGINE, *settings, f"rollout.async_steps={k}", steps=steps)
    late = run_steps(tmp_path / "late", *ENGINE, *settings, steps=steps, on_setup=syncs_late(k))
    assert training(threaded[0]) == training(late[0])
    for name, tensor in late[1].items():
        assert torch.equal(threaded[1][name], tensor), name
    assert [row["rollout/policy_lag_steps"] for row in threaded[0]] == [0.0, *range(1, k + 1), *[float(k)] * 2]


def test_the_batches_ahead_survive_a_checkpoint_an_old_one_still_loads_and_a_stop_waits_for_one_rollout():
    """``RolloutAhead.state`` keeps every finished batch ahead by step; a one-step-off run's checkpoint (one batch, its
    fields at the top level, as written before ``async_steps`` could be more) loads as that one batch."""
    from minirl.async_rollout import RolloutAhead
    from minirl.dynamic_sampling import Sampled
    from minirl.types import Completion, Prompt

    prompts = [Prompt(text=f"p{i}", answer=str(i)) for i in range(3)]

    def batch(i, lag):
        completion = Completion(prompt_index=0, sample_index=0, prompt_ids=[1, 2], completion_ids=[3 + i],
                                logp_rollout=torch.tensor([-0.5 * i]), finish_reason="length")
        return Sampled(prompts=[prompts[i]], completions=[completion], rewards=torch.tensor([float(i)]),
                       reward_stats={"train/reward_mean": float(i)}, columns=[{}], generated_tokens=1,
                       policy_lag_steps=lag)

    ahead = RolloutAhead()
    ahead.start([(2, lambda: batch(1, 1)), (3, lambda: batch(2, 2))])
    state = ahead.state(prompts)
    assert [b["step"] for b in state["batches"]] == [2, 3]
    restored = RolloutAhead()
    restored.load_state(state, prompts)
    assert restored.last_step == 3
    two, three = restored.take(2), restored.take(3)
    assert (two.prompts, two.completions[0].completion_ids, two.policy_lag_steps) == ([prompts[1]], [4], 1)
    assert (three.prompts, float(three.rewards[0]), three.policy_lag_steps) == ([prompts[2]], 2.0, 2)
    old = RolloutAhead()
    old.load_state(state["batches"][0], prompts)  # the one-step-off layout
    assert old.take(2).prompts == [prompts[1]] and old.take(3) is None
    empty = RolloutAhead()
    empty.load_state({}, prompts)
    assert empty.take(1) is None and empty.last_step == 0
    # a run that stops (Ctrl-C) waits for the rollout running, not for the ones queued behind it
    began, release, ran = threading.Event(), threading.Event(), []

    def slow(i):
        def sample():
            ran.append(i)
            began.set()
            assert release.wait(10)
            return batch(i, i)
        return sample

    ahead.start([(4, slow(1)), (5, slow(2)), (6, slow(0))])
    assert began.wait(10)
    threading.Timer(0.2, release.set).start()
    ahead.stop()
    assert ran == [1] and ahead.last_step == 0


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
    with pytest.raises(ConfigError, match=r"rollout\.async_steps: must be less than or equal to 64"):
        load_config(None, ["rollout.async_steps=65"])
    with pytest.raises(ConfigError, match=r"rollout\.async_split_mismatch: keeps one copy of the weights, those of a "
                                          r"batch one step ahead; with rollout\.async_steps=2 a batch was sampled 2 steps"):
        load_config(None, ["rollout.async_steps=2", "rollout.async_split_mismatch=true"])
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


SPLIT = ("mismatch/engine_", "mismatch/lag_", "time/engine_logprobs")


@pytest.mark.parametrize("settings", [
    ("moe.routing_replay=R3", "optim.minibatches_per_step=2"),  # the pass replays the stale engine's routes
    ("moe.routing_replay=none", "optim.minibatches_per_step=1"),  # pi_old from the update's own forward
])
def test_the_split_mismatch_is_the_engine_gap_plus_the_lag(tmp_path, settings):
    """``rollout.async_split_mismatch``: with an fp32 engine (no gap of its own) the engine part is float noise and
    the lag carries the mismatch; k1 adds up exactly; the extra pass changes nothing the run trains (bitwise)."""
    common = ("rollout.precision=fp32", "rollout.async_steps=1", *settings)
    split = run_steps(tmp_path / "split", *common, "rollout.async_split_mismatch=true", steps=4)
    plain = run_steps(tmp_path / "plain", *common, steps=4)
    assert [{k: v for k, v in row.items() if not k.startswith(SPLIT)} for row in training(split[0])] == training(plain[0])
    for name, tensor in plain[1].items():
        assert torch.equal(split[1][name], tensor), name
    assert not any(k.startswith(SPLIT) for k in split[0][0])  # the first batch is sampled in line: no lag
    for row in split[0][1:]:
        assert row["mismatch/engine_kl_k1"] + row["mismatch/lag_kl_k1"] == pytest.approx(row["mismatch/kl_k1"], abs=1e-7)
        assert row["mismatch/engine_abs_dlogp_max"] < 5e-6, row  # the same weights on both sides: float rounding
        assert row["mismatch/lag_abs_dlogp_mean"] > 1e3 * row["mismatch/engine_abs_dlogp_mean"], row  # a step's updates
        assert row["mismatch/lag_kl_k3"] == pytest.approx(row["mismatch/kl_k3"], rel=0.05)
        assert row["time/engine_logprobs_s"] > 0


def test_the_engine_weights_score_the_kept_weights_and_put_the_current_ones_back():
    """``EngineWeights``: ``logprobs`` is a score of a copy of the model at the kept weights (bitwise), after which
    the trainer holds its current weights (bitwise) and keeps them; with LoRA only the adapters are kept."""
    import copy

    from minirl.async_rollout import EngineWeights
    from minirl.trainer import Trainer
    from tests.conftest import make_tiny_moe
    from tests.unit.test_lora_and_checkpointing import lora_model
    from tests.unit.test_trainer_precision import batch_of

    model, batch = make_tiny_moe(0), batch_of(6)
    trainer = Trainer(model, lr=0.0, micro_batch_sequences=4)
    weights = EngineWeights(trainer)
    assert not weights.ready
    weights.keep()
    sampled_with = copy.deepcopy(model)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    current = {name: p.detach().clone() for name, p in model.named_parameters()}
    logp = weights.logprobs(batch)
    assert torch.equal(logp, Trainer(sampled_with, lr=0.0, micro_batch_sequences=4).score(batch, entropy=False).logp)
    assert not torch.equal(logp, trainer.score(batch, entropy=False).logp)
    for name, param in model.named_parameters():
        assert torch.equal(param, current[name]), name
    assert all(torch.equal(k, p) for k, p in zip(weights.kept, model.parameters(), strict=True))  # the current, kept

    # a checkpoint's copy: the kept weights by name, not the model's (they swap back after the copy)
    weights.keep()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01)
    state, later = weights.state_dict(), {name: p.detach().clone() for name, p in model.named_parameters()}
    assert all(torch.equal(state[name], current[name]) for name in current) and state.keys() == current.keys()
    resumed = EngineWeights(trainer)
    resumed.load_state_dict(state)
    assert resumed.ready and all(torch.equal(p, later[name]) for name, p in model.named_parameters())
    assert torch.equal(resumed.logprobs(batch), weights.logprobs(batch))
    assert EngineWeights(trainer).state_dict() == {}

    model = lora_model()
    weights = EngineWeights(Trainer(model, lr=0.0))
    weights.keep()
    assert len(weights.kept) == sum(p.requires_grad for p in model.parameters()) < len(list(model.parameters()))


def test_the_split_needs_the_lag_in_one_line():
    with pytest.raises(ConfigError, match=r"^rollout\.async_split_mismatch: .* needs rollout\.async_steps=1"):
        load_config(None, ["rollout.async_split_mismatch=true"])
