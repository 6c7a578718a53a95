"""Ray placement (``cluster.backend=ray``): 2 rollout engine actors and a 2-rank FSDP2 trainer
group of actors, driven by the same loop, against the single-process run; and a dead actor
surfacing as one clear error. One Ray instance for the module (start-up costs ~3 s)."""

from __future__ import annotations

import os

import pytest

import minirl.loop as loop
from minirl.config import ConfigError, load_config

from .common import ROOT, TINY, TOL, DenseRewards, assert_same_update_metrics, max_differences, run_steps

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'minirl[ray]')")

RAY = ["cluster.backend=ray", "cluster.rollout_engines=2", "cluster.trainer_ranks=2",
       "cluster.cpus_per_engine=0.5", "cluster.cpus_per_trainer_rank=0.5"]


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()



@pytest.mark.parametrize("mode", ["R3", pytest.param("critic", marks=pytest.mark.slow),
                                  pytest.param("offload", marks=pytest.mark.slow)])
def test_ray_engines_and_trainer_ranks_match_one_process(tmp_path, mode):
    """With a critic (PPO's GAE) the trainer actors hold its shards too (``GroupCritic`` over Ray actors). With
    optim.cpu_offload one trainer actor is an FSDP2 rank alone (its own process group of one, CPUOffloadPolicy)."""
    overrides = ["moe.routing_replay=R3", "optim.minibatches_per_step=2"]
    if mode == "critic":
        overrides += ["algo.adv_baseline=critic", "critic.lr=1e-3"]
    placement = [*RAY, "cluster.trainer_ranks=1", "optim.cpu_offload=true"] if mode == "offload" else RAY
    single = run_steps(tmp_path / "single", *overrides)
    placed = run_steps(tmp_path / "ray", *overrides, *placement)
    loss_diff, weight_diff = max_differences(single, placed)
    print(f"ray E=2 W=2 vs single: max |d loss| {loss_diff:.3g}, max |d weight| {weight_diff:.3g}")
    # the critic's values, whitened into the advantages, carry float rounding on to the policy: measured 1.3e-5
    assert loss_diff < TOL and weight_diff < (5 * TOL if mode == "critic" else TOL)
    for a, b in zip(*(m for m, _ in (single, placed))):
        assert a["train/response_length"] == b["train/response_length"]  # the same completions
        assert abs(a["mismatch/kl_k1"] - b["mismatch/kl_k1"]) < TOL
        assert a["optim/grad_norm"] == pytest.approx(b["optim/grad_norm"], rel=1e-5)
        assert_same_update_metrics(a, b)  # computed over the whole mini-batch from the actors' log-probs
        if mode == "critic":
            assert b["critic/vf_loss"] == pytest.approx(a["critic/vf_loss"], rel=1e-4)


@pytest.mark.slow  # 18 s; the default suite's 15-minute budget (a dead FSDP rank is checked there)
def test_a_dead_engine_actor_is_one_clear_error(tmp_path):
    from minirl.distributed import WorkerError

    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, f"run.output_dir={tmp_path}", *RAY, "cluster.trainer_ranks=1"])
    run = loop.setup(cfg, rewards=DenseRewards())
    try:
        ray.kill(run.engine.engines[1].actor)
        with pytest.raises(WorkerError, match=r"^rollout engine 1 died during generate") as err:
            loop.global_step(run, 1)
        assert "\n" not in str(err.value)
    finally:
        run.close()


def test_actors_that_do_not_fit_the_cluster_are_refused(tmp_path):
    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, f"run.output_dir={tmp_path}", *RAY, "cluster.cpus_per_engine=8"])
    with pytest.raises(ConfigError, match=r"cluster.cpus_per_engine: 2 engines and 2 trainer ranks need 17 CPUs"):
        loop.setup(cfg)
