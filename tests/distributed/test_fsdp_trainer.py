"""A 2-rank FSDP2 trainer group (gloo, spawned processes) against the single-process trainer.

Same seed, same config: 3 global steps of MiniRL with R3 (the engine's routes replayed in the
old-log-prob pass and in both mini-batch updates), or R2, give the same losses and final weights
within 1e-5 (fp32), though each rank sees half of every mini-batch in other micro-batches.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

import minirl.loop as loop
from minirl.config import ConfigError, load_config

from .common import ROOT, TINY, TOL, DenseRewards, assert_same_update_metrics, max_differences, run_steps

MODE = ["moe.routing_replay=R3", "optim.minibatches_per_step=2"]



@pytest.mark.parametrize("replay, n", [("R3", 2), ("R2", 2), ("R3", 1)])
def test_two_fsdp_ranks_match_one_process(tmp_path, replay, n):
    """R3 replays the engine's routes on the ranks; R2 records routes on the ranks (old-log-prob
    pass, each rank its shard), gathers them in row order and replays them in both updates.
    N = 1: pi_old comes from the update's forward on each rank, gathered in row order."""
    single, sharded = _two_ranks_match_one_process(tmp_path, f"moe.routing_replay={replay}",
                                                   f"optim.minibatches_per_step={n}")
    for a, b in zip(*(m for m, _ in (single, sharded))):
        assert abs(a["mismatch/kl_k1"] - b["mismatch/kl_k1"]) < TOL  # logp_old gathered in row order


def _two_ranks_match_one_process(tmp_path, *mode, weight_tol=TOL):
    """Runs of ``mode`` in one process and on 2 FSDP ranks: the same losses and final weights (``TOL``), global
    gradient norms and update metrics (the whole mini-batch's token means and maxima, R2's drift); returns both runs."""
    single = run_steps(tmp_path / "single", *mode)
    sharded = run_steps(tmp_path / "fsdp", *mode, "cluster.trainer_ranks=2")
    loss_diff, weight_diff = max_differences(single, sharded)
    print(f"fsdp W=2 vs single ({' '.join(mode)}): max |d loss| {loss_diff:.3g}, max |d weight| {weight_diff:.3g}")
    assert loss_diff < TOL and weight_diff < weight_tol
    for a, b in zip(*(m for m, _ in (single, sharded))):
        assert a["optim/grad_norm"] == pytest.approx(b["optim/grad_norm"], rel=1e-5)  # the global norm
        assert_same_update_metrics(a, b)
    return single, sharded


def test_ranks_must_divide_the_minibatch():
    with pytest.raises(ConfigError, match=r"cluster\.trainer_ranks: must divide the mini-batch of 4 sequences"):
        load_config(ROOT / "configs/demo.yaml", [*TINY, *MODE, "cluster.trainer_ranks=3"])


def _train(tmp_path, *overrides, resume=None):
    from minirl import checkpoint

    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, *MODE, f"run.output_dir={tmp_path}", "run.name=r",
                                                    "checkpoint.every_steps=1", "eval.every_steps=0", *overrides])
    latest = checkpoint.find_latest(cfg.run_dir) if resume else None
    loop.train(cfg, rewards=DenseRewards(), resume_from=latest[0] if latest else None)
    return cfg.run_dir


REFERENCE_SYNC = ["algo.kl_coef=0.1", "algo.ref_sync_every_updates=1", "algo.ref_sync_alpha=0.5"]


LORA = ["model.lora={rank: 4, alpha: 8.0}", "algo.kl_coef=0.1"]


SPLIT = ["rollout.async_steps=1", "cluster.sample_seeding=per_sample", "rollout.async_split_mismatch=true",
         "rollout.precision=fp8_e4m3"]


CRITIC = ["algo.adv_baseline=critic", "critic.lr=1e-3"]


@pytest.mark.parametrize("extra", [[], pytest.param(REFERENCE_SYNC, marks=pytest.mark.slow),
                                   pytest.param(LORA, marks=pytest.mark.slow), pytest.param(SPLIT, marks=pytest.mark.slow),
                                   pytest.param(CRITIC, marks=pytest.mark.slow)],
                         ids=["plain", "reference", "lora", "split", "critic"])
def test_sharded_checkpoints_resume_like_one_process(tmp_path, extra):
    """A W=2 run checkpoints the gathered model and the full optimizer state in the single-process
    format (step 2), and a W=2 resume loads them back into the shards: step 3 ends where an
    uninterrupted single-process run ends. With a synced KL reference its gathered weights are checkpointed too and
    loaded back into the ranks' shards; with LoRA the adapters' optimizer state and weights (the mirror's adapter,
    beside the merged weights) go back into the ranks; with rollout.async_split_mismatch the ranks' kept shards of the
    engine's weights are gathered, and scattered back so that the resumed step splits its mismatch as one process; a
    critic's weights and optimizer state are gathered from the ranks' shards in one process's format, and scattered back."""
    import torch

    from minirl import checkpoint

    single = _train(tmp_path / "single", "optim.global_steps=3", *extra)
    if extra is SPLIT:  # a run that goes on past step 2 (one ending there samples no batch ahead), cut back to it
        sharded = _train(tmp_path / "fsdp", "optim.global_steps=3", "cluster.trainer_ranks=2", *extra)
        shutil.rmtree(sharded / "checkpoints" / "step_000003")
    else:
        sharded = _train(tmp_path / "fsdp", "optim.global_steps=2", "cluster.trainer_ranks=2", *extra)
    want_all = checkpoint.load_state(single / "checkpoints" / "step_000002")
    got_all = checkpoint.load_state(sharded / "checkpoints" / "step_000002")
    for kept in ("reference", "engine_weights"):
        if kept in want_all:
            assert want_all[kept].keys() == got_all[kept].keys() and want_all[kept]
            assert max(float((want_all[kept][k] - got_all[kept][k]).abs().max()) for k in want_all[kept]) < TOL
    pairs = [(want_all["trainer"], got_all["trainer"])]
    if "critic" in want_all:
        want, got = want_all["critic"], got_all["critic"]
        assert want["model"].keys() == got["model"].keys()
        assert max(float((want["model"][k] - got["model"][k]).abs().max()) for k in want["model"]) < TOL
        assert got["scheduler"] == want["scheduler"]
        pairs.append((want, got))
    for want, got in pairs:
        assert set(got["optimizer"]["state"]) == set(want["optimizer"]["state"])  # parameter indices, as one process
        for index, state in want["optimizer"]["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.allclose(got["optimizer"]["state"][index][key], state[key], atol=1e-6)
    want, got = want_all["trainer"], got_all["trainer"]
    assert got["updates_done"] == want["updates_done"] == 4
    _train(tmp_path / "fsdp", "optim.global_steps=3", "cluster.trainer_ranks=2", *extra, resume=True)
    from minirl.models.io import load_model_and_tokenizer

    final_single, _ = load_model_and_tokenizer(str(single / "checkpoint"))
    final_sharded, _ = load_model_and_tokenizer(str(sharded / "checkpoint"))
    a, b = final_single.state_dict(), final_sharded.state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < TOL
    if "engine_weights" in want_all:  # the resumed step's split, from the weights the checkpoint kept
        rows = [[json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (single, sharded)]
        step3 = [next(r for r in each if r["step"] == 3) for each in rows]
        assert step3[1]["mismatch/lag_kl_k3"] == pytest.approx(step3[0]["mismatch/lag_kl_k3"], rel=1e-3)
        assert step3[1]["mismatch/engine_kl_k3"] == pytest.approx(step3[0]["mismatch/engine_kl_k3"], rel=1e-3)


OFFLOADED = {"stored": ["cpu"], "computes": ["cpu"], "offload": ["CPUOffloadPolicy"], "peak_device_gib": None}


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_cpu_offload_runs_fsdp_ranks_whose_shards_live_in_cpu_memory(tmp_path, ranks):
    """optim.cpu_offload: the trainer runs as FSDP2 ranks with ``CPUOffloadPolicy`` even at W = 1. On a CPU there is
    nothing to move, so one offloaded rank is the single process bit for bit (R3, N = 2, 3 global steps), and two
    match it as two plain ranks do; each rank reports its policy and where its shards live and where it computes."""
    layouts: list = []
    single = run_steps(tmp_path / "single", *MODE)
    offloaded = run_steps(tmp_path / "offload", *MODE, "optim.cpu_offload=true", f"cluster.trainer_ranks={ranks}",
                          on_setup=lambda run: layouts.append(run.trainer._all("memory_layout")))
    loss_diff, weight_diff = max_differences(single, offloaded)
    assert (loss_diff, weight_diff) == (0.0, 0.0) if ranks == 1 else (loss_diff < TOL and weight_diff < TOL)
    assert layouts == [[OFFLOADED] * ranks]


@pytest.mark.slow  # ~5 s; the default suite's 15 minutes (one offloaded rank's bitwise run stays there)
def test_an_offloaded_rank_checkpoints_and_resumes_like_one_process(tmp_path):
    """A W = 1 offloaded rank writes the single process's checkpoint (the full AdamW state gathered from its FSDP
    shards) and loads one back into them: step 3 of the resumed run ends where one uninterrupted process ends."""
    import torch

    from minirl import checkpoint
    from minirl.models.io import load_model_and_tokenizer

    single = _train(tmp_path / "single", "optim.global_steps=3")
    offloaded = _train(tmp_path / "offload", "optim.global_steps=2", "optim.cpu_offload=true")
    want, got = (checkpoint.load_state(run / "checkpoints" / "step_000002")["trainer"] for run in (single, offloaded))
    assert got["updates_done"] == want["updates_done"] == 4
    assert set(got["optimizer"]["state"]) == set(want["optimizer"]["state"])
    for index, state in want["optimizer"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(got["optimizer"]["state"][index][key], state[key])
    _train(tmp_path / "offload", "optim.global_steps=3", "optim.cpu_offload=true", resume=True)
    a, b = (load_model_and_tokenizer(str(run / "checkpoint"))[0].state_dict() for run in (single, offloaded))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_dead_rank_is_one_clear_error_and_stops_the_group(tmp_path):
    import os
    import signal
    import time

    from minirl.distributed import WorkerError

    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, *MODE, f"run.output_dir={tmp_path}", "cluster.trainer_ranks=2"])
    run = loop.setup(cfg, rewards=DenseRewards())
    try:
        ranks = run.trainer.ranks
        assert [rank.start_method for rank in ranks] == ["forkserver"] * 2  # CPU ranks: forks of a preloaded server
        os.kill(ranks[1].process.pid, signal.SIGKILL)
        started = time.perf_counter()
        with pytest.raises(WorkerError, match=r"^trainer rank 1 died \(exit code -9\) (before|during) \w+$"):
            loop.global_step(run, 1)  # rank 0 would wait for rank 1 in FSDP's all-gather forever
        assert time.perf_counter() - started < 30
        assert not ranks[0].process.is_alive()  # the group is stopped, not left hanging
    finally:
        run.close()


def _two_rows():
    """A hand-made shard of 2 rows x 6 tokens (a rank's share of a batch)."""
    import torch

    from minirl.types import Batch

    rows, width = 2, 6
    return Batch(input_ids=torch.randint(3, 20, (rows, width)), attention_mask=torch.ones(rows, width, dtype=torch.bool),
                 mask=torch.ones(rows, width - 1, dtype=torch.bool), logp_rollout=torch.zeros(rows, width - 1),
                 advantages=torch.zeros(rows), group_ids=torch.zeros(rows, dtype=torch.long))


def test_a_rank_failing_while_its_peer_waits_in_a_collective_is_one_clear_error(tmp_path):
    import time

    from minirl.distributed import WorkerError

    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, *MODE, f"run.output_dir={tmp_path}", "cluster.trainer_ranks=2"])
    run = loop.setup(cfg, rewards=DenseRewards())
    try:
        shard = _two_rows()
        started = time.perf_counter()
        # rank 0 enters FSDP's all-gather and waits; rank 1 raises before it gets there
        with pytest.raises(WorkerError, match=r"^trainer rank 1 failed in score: AttributeError: 'NoneType' object has no attribute"):
            run.trainer._all("score", [(shard,), (None,)])
        assert time.perf_counter() - started < 30
        assert not run.trainer.ranks[0].process.is_alive()
    finally:
        run.close()


@pytest.mark.slow  # ~15 s: a rank waits out its collective timeout
def test_a_rank_left_waiting_in_a_collective_fails_after_the_collective_timeout_in_one_line(tmp_path):
    """Rank 1 gets no rows (no forward), so rank 0 waits alone in FSDP's all-gather: after
    cluster.collective_timeout_s it fails, and the group says so in one line naming the key (not a 30-minute hang)."""
    import time

    from minirl.distributed import WorkerError

    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, *MODE, f"run.output_dir={tmp_path}", "cluster.trainer_ranks=2",
                                                    "cluster.collective_timeout_s=3"])
    run = loop.setup(cfg, rewards=DenseRewards())
    try:
        shard = _two_rows()
        started = time.perf_counter()
        with pytest.raises(WorkerError, match=r"^trainer rank 0 failed in score: .*[Tt]imed out.* \(a collective waited "
                                              r"longer than cluster\.collective_timeout_s\)$"):
            run.trainer._all("score", [(shard,), (shard.select(slice(0, 0)),)])
        assert time.perf_counter() - started < 60
    finally:
        run.close()


def test_bf16_fsdp_ranks_all_gather_bf16_and_track_one_bf16_process(tmp_path):
    """optim.precision=bf16 on 2 FSDP ranks (MixedPrecisionPolicy: bf16 all-gather, fp32 reduce) stays
    near the single bf16 process (the policy also rounds the norms' weights: not bitwise) and keeps
    float32 master weights."""
    mode = ["moe.routing_replay=R3", "optim.minibatches_per_step=2", "optim.precision=bf16"]
    single = run_steps(tmp_path / "single", *mode)
    sharded = run_steps(tmp_path / "fsdp", *mode, "cluster.trainer_ranks=2")
    loss_diff, weight_diff = max_differences(single, sharded)
    print(f"bf16 fsdp W=2 vs single: max |d loss| {loss_diff:.3g}, max |d weight| {weight_diff:.3g}")
    import torch

    assert {tensor.dtype for tensor in sharded[1].values()} == {torch.float32}
    assert loss_diff < 5e-3 and weight_diff < 2e-2  # measured 4.9e-4 and 4.6e-3
    fp32 = run_steps(tmp_path / "fp32", "moe.routing_replay=R3", "optim.minibatches_per_step=2")
    assert max_differences(single, fp32)[0] > TOL  # bf16 did compute in bf16


FP16 = [*MODE, "optim.precision=fp16"]


def test_an_fp16_run_skips_an_overflowing_update_and_goes_on_at_half_the_scale(tmp_path):
    """optim.precision=fp16 in the loop: the first update overflows at torch's initial scale 2^16 on this model, is
    skipped and logged (faults/fp16_overflows, the loss scale halved), and the run goes on: no numerical fault."""
    metrics, _ = run_steps(tmp_path, *FP16)
    assert [m["faults/fp16_overflows"] for m in metrics] == [1.0, 0.0, 0.0]
    assert [m["faults/skipped_updates"] for m in metrics] == [1.0, 0.0, 0.0]
    assert {m["optim/loss_scale"] for m in metrics} == {2.0**15}


@pytest.mark.slow  # ~12 s
def test_fp16_ranks_skip_and_rescale_together_and_track_one_fp16_process(tmp_path):
    """Every rank reads the overflow off the global gradient norm: they skip the same update and keep one scale,
    as the single fp16 process does (fp16 all-gathers and float rounding: not bitwise)."""
    single = run_steps(tmp_path / "single", *FP16)
    sharded = run_steps(tmp_path / "fsdp", *FP16, "cluster.trainer_ranks=2")
    for a, b in zip(single[0], sharded[0]):
        assert (a["faults/fp16_overflows"], a["optim/loss_scale"]) == (b["faults/fp16_overflows"], b["optim/loss_scale"])
    loss_diff, weight_diff = max_differences(single, sharded)
    assert loss_diff < 5e-3 and weight_diff < 2e-2  # measured 7.1e-5 and 2.0e-3


def test_a_nan_input_on_one_rank_skips_the_update_on_every_rank_without_a_hang(tmp_path):
    """A rank whose shard holds a NaN must not skip alone (its peer would wait in FSDP's collectives for
    good): it runs its passes with a NaN loss, the global gradient norm is NaN, every rank skips."""
    import threading

    import torch

    from minirl.objective import make_objective
    from minirl.types import Batch

    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, *MODE, f"run.output_dir={tmp_path}", "cluster.trainer_ranks=2"])
    run = loop.setup(cfg, rewards=DenseRewards())
    try:
        rows, width = 4, 6
        logp_rollout = torch.full((rows, width - 1), -1.0)
        logp_rollout[0, 2] = float("nan")  # in rank 0's half of the rows
        batch = Batch(input_ids=torch.randint(3, 20, (rows, width), generator=torch.Generator().manual_seed(0)),
                      attention_mask=torch.ones(rows, width, dtype=torch.bool), mask=torch.ones(rows, width - 1, dtype=torch.bool),
                      logp_rollout=logp_rollout, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
                      group_ids=torch.tensor([0, 0, 1, 1])).with_logp_old(torch.full((rows, width - 1), -1.0))
        out: dict = {}
        worker = threading.Thread(target=lambda: out.update(result=run.trainer.update(batch, make_objective(cfg.algo, batch))),
                                  daemon=True)
        worker.start()
        worker.join(timeout=120)
        assert not worker.is_alive(), "a rank skipped alone and its peer waits in a collective"
        assert out["result"].fault == "non-finite inputs (logp_rollout contains NaN at 1 trained (mask=True) token(s))"
        assert run.trainer.consecutive_faults == 1
    finally:
        run.close()


def test_the_entropy_bonus_on_two_ranks_matches_one_process(tmp_path):
    """``algo.entropy_coef``: each rank passes its forward's entropy to the bonus, whose normaliser is the whole
    mini-batch's tokens; N = 2 (separate pi_old pass) and N = 1 (pi_old from the update's own forward, with adaptive
    entropy control reading each update's entropy from the ranks)."""
    for n, extra in ((2, []), (1, ["algo.entropy_target=10.0"])):
        mode = ["moe.routing_replay=R3", f"optim.minibatches_per_step={n}", "algo.entropy_coef=0.05", *extra]
        single = run_steps(tmp_path / f"single{n}", *mode)
        sharded = run_steps(tmp_path / f"fsdp{n}", *mode, "cluster.trainer_ranks=2")
        loss_diff, weight_diff = max_differences(single, sharded)
        assert loss_diff < TOL and weight_diff < TOL
        assert all(a["policy/entropy"] == pytest.approx(b["policy/entropy"], rel=1e-5) for a, b in zip(single[0], sharded[0]))


def test_padding_free_ranks_match_one_padded_process(tmp_path):
    """``optim.padding_free`` on 2 FSDP ranks (each rank packs its shard's rows; R3's routes packed with them), and
    ``optim.shared_prompt`` (each rank packs each prompt of its shard once), against the padded single process:
    float rounding only."""
    single = run_steps(tmp_path / "single", *MODE)
    for flag in ("padding_free", "shared_prompt"):
        sharded = run_steps(tmp_path / flag, *MODE, f"optim.{flag}=true", "cluster.trainer_ranks=2")
        loss_diff, weight_diff = max_differences(single, sharded)
        assert loss_diff < TOL and weight_diff < TOL, flag


class _UnevenLengths:
    """A rollout source that cuts the first prompt's completions short (2-4 tokens, one of 12) and leaves the
    second's at 12: with 2 ranks, one shard packs into fewer token-budget micro-batches than the other."""

    def __init__(self, inner):
        self.inner = inner

    def rollouts(self, step, prompts, n, sampling, *, record_routes):
        out = self.inner.rollouts(step, prompts, n, sampling, record_routes=record_routes)
        keep = [2, 3, 4, 2, 3, 4, 2, 12] + [12] * (len(out) - 8)
        return [dataclasses.replace(c, completion_ids=c.completion_ids[:k], logp_rollout=c.logp_rollout[:k],
                                    routes=None if c.routes is None else c.routes[: len(c.prompt_ids) + k])
                for c, k in zip(out, keep)]


def test_dynamic_micro_batches_on_ranks_that_pack_differently_match_one_process(tmp_path):
    """optim.micro_batch_max_tokens on 2 ranks whose shards pack into 3 and 4 micro-batches: each forward and backward
    is an FSDP collective, so the rank with fewer cuts its micro-batches further (it used to hang in an all-gather),
    in the policy's passes and in the KL reference's (its frozen copy's own trainer)."""
    mode = ["moe.routing_replay=R2", "rollout.samples_per_prompt=8", "rollout.max_new_tokens=12",
            "optim.micro_batch_sequences=8", "optim.micro_batch_max_tokens=40", "algo.kl_coef=0.1"]

    def uneven(run):
        run.rollouts = _UnevenLengths(run.rollouts)

    single = run_steps(tmp_path / "single", *mode, steps=2, on_setup=uneven)
    sharded = run_steps(tmp_path / "fsdp", *mode, "cluster.trainer_ranks=2", steps=2, on_setup=uneven)
    loss_diff, weight_diff = max_differences(single, sharded)
    assert loss_diff < TOL and weight_diff < TOL


def test_one_step_off_on_two_ranks_and_two_engines_matches_one_process(tmp_path):
    """rollout.async_steps=1 with the trainer ranks and the engine workers in their own processes: the next step's
    rollout, beside the update, goes to the engine group while the update goes to the ranks; with
    rollout.async_split_mismatch each rank keeps its shards of the engine's weights and scores its rows with them."""
    mode = [*MODE, "rollout.async_steps=1", "cluster.sample_seeding=per_sample", "rollout.async_split_mismatch=true",
            "rollout.precision=fp8_e4m3"]
    single = run_steps(tmp_path / "single", *mode)
    spread = run_steps(tmp_path / "spread", *mode, "cluster.trainer_ranks=2", "cluster.rollout_engines=2")
    loss_diff, weight_diff = max_differences(single, spread)
    assert loss_diff < TOL and weight_diff < TOL
    assert [row["rollout/policy_lag_steps"] for row in spread[0]] == [0.0] + [1.0] * (len(spread[0]) - 1)
    for a, b in zip(single[0][1:], spread[0][1:]):
        keys = [k for k in a if k.startswith(("mismatch/engine_", "mismatch/lag_"))]
        assert len(keys) == 8
        for key in keys:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), (key, a[key], b[key])


@pytest.mark.parametrize("budget", [[], pytest.param(["optim.micro_batch_max_tokens=24"], marks=pytest.mark.slow),
                                    ["optim.shared_prompt=true", "optim.micro_batch_max_tokens=40"]],
                         ids=["rows", "token-budget", "shared-prompt"])
def test_ppo_with_a_critic_on_two_ranks_matches_one_process(tmp_path, budget):
    """algo.adv_baseline=critic: each rank holds its FSDP2 shards of the value model, scores its rows (the GAE's values
    joined back in row order) and trains on them with the whole mini-batch's divisor: every critic/* metric, the policy's
    update and both final models are one process's; no critic is built in the controller. With ``optim.shared_prompt``
    each rank's critic packs its rows' prompts once, as the policy does."""
    mode = [*MODE, "algo.adv_baseline=critic", "algo.adv_whiten=true", "critic.lr=1e-3", "algo.adv_lambda=0.9",
            "critic.loss_aggregation=seq_mean", *budget]
    critics = {}

    def keep(name):
        def on_setup(run):
            critics[name] = run.critic
        return on_setup

    single = run_steps(tmp_path / "single", *mode, on_setup=keep("single"))
    sharded = run_steps(tmp_path / "fsdp", *mode, "cluster.trainer_ranks=2", on_setup=keep("fsdp"))
    assert type(critics["fsdp"]).__name__ == "GroupCritic" and type(critics["single"]).__name__ == "Critic"
    loss_diff, weight_diff = max_differences(single, sharded)
    # (shared prompts: each rank shares a prompt among its own rows, so float rounding differs from one process's a
    # little more; AdamW's normalised step turns it into ~1e-5 on a rarely routed expert's weights of ~0.09)
    assert loss_diff < TOL and weight_diff < (3 * TOL if "optim.shared_prompt=true" in budget else TOL)
    keys = [k for k in single[0][0] if k.startswith("critic/")]
    assert len(keys) == 8
    for a, b in zip(single[0], sharded[0]):
        assert a["optim/grad_norm"] == pytest.approx(b["optim/grad_norm"], rel=1e-5)
        for key in keys:  # clipfrac counts a clipped loss larger by an ulp (verl's): one token of 64 may flip, under any
            edge = 1 / 64 if key == "critic/vf_clipfrac" else 1e-6  # split of the rows (seen on an AVX512 Xeon, 2026-12-07)
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=edge), (key, a[key], b[key])


def test_the_optimal_token_baseline_on_two_ranks_matches_one_process(tmp_path):
    """algo.adv_baseline=optimal_token: each rank's old pass returns sum pi_old^2 of its rows, joined back in order."""
    # (on an AVX512 Xeon, 2026-12-07: 1.45e-5 on a weight, the rounding of the ranks' split sums through AdamW's
    # normalised step, as with shared prompts below; 3.8e-6 on the losses)
    _two_ranks_match_one_process(tmp_path, *MODE, "algo.adv_baseline=optimal_token", "rollout.precision=fp8_e4m3",
                                 weight_tol=3 * TOL)


def test_the_load_balancing_loss_reaches_the_ranks(tmp_path):
    """algo.router_aux_loss_coef on 2 ranks: each rank adds the loss of its micro-batches (TRL's per-device loss);
    with the single process's micro-batches the same rows (2 of each 4-row mini-batch), the same losses, weights
    and logged balance. (The ranks' wrapper once hid the router logits from it: no balance loss at all.)"""
    mode = [*MODE, "algo.router_aux_loss_coef=0.5", "optim.micro_batch_sequences=2"]
    single = run_steps(tmp_path / "single", *mode)
    sharded = run_steps(tmp_path / "fsdp", *mode, "cluster.trainer_ranks=2")
    loss_diff, weight_diff = max_differences(single, sharded)
    assert loss_diff < TOL and weight_diff < TOL
    for a, b in zip(single[0], sharded[0]):
        assert b["policy/aux_loss"] == pytest.approx(a["policy/aux_loss"], rel=1e-6) and a["policy/aux_loss"] > 0


def _untied_model(path):
    """The tiny preset with an LM head of its own (the presets tie it to the embeddings; Qwen3-30B-A3B does not)."""
    from transformers import AutoModelForCausalLM

    from minirl.models.presets import preset_config
    from minirl.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = preset_config("qwen3-moe-tiny", len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    config.tie_word_embeddings = False
    import torch

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("replay, n, tied", [("R3", 2, True), pytest.param("R2", 1, True, marks=pytest.mark.slow),
                                              pytest.param("R3", 2, False, marks=pytest.mark.slow)])
def test_the_chunked_lm_head_on_two_fsdp_ranks_matches_one_process(tmp_path, replay, n, tied):
    """``optim.logprob_chunk_tokens`` under FSDP2: the head stays in the root's group, gathered from the root's forward
    to the end of its backward, so the chunks and their recomputation use the gathered weight (no collective added);
    2 ranks give one process's losses, weights and global gradient norm, with a tied and an untied head."""
    mode = [f"moe.routing_replay={replay}", f"optim.minibatches_per_step={n}", "optim.logprob_chunk_tokens=7"]
    if not tied:
        mode.append(f"model.path={_untied_model(tmp_path / 'untied')}")
    _two_ranks_match_one_process(tmp_path, *mode)


def test_the_kl_penalty_and_its_reference_sync_on_two_ranks_match_one_process(tmp_path):
    """``algo.kl_coef`` (the KL loss) and ``algo.kl_in_reward_coef`` on 2 FSDP ranks: each rank scores its rows with
    its shard of a frozen copy of the starting weights; with TR-DPO's sync (every update, alpha 0.5) the ranks'
    reference moves as the single process's, and its gathered state (a checkpoint's) is the same."""
    mode = ["moe.routing_replay=R3", "optim.minibatches_per_step=2", "algo.kl_coef=0.1", "algo.kl_in_reward_coef=0.05",
            "algo.ref_sync_every_updates=1", "algo.ref_sync_alpha=0.5"]
    runs = {}
    for name, extra in (("single", []), ("fsdp", ["cluster.trainer_ranks=2"])):
        cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, f"run.output_dir={tmp_path / name}", *mode, *extra])
        run = loop.setup(cfg, rewards=DenseRewards())
        try:
            metrics = [loop.global_step(run, step) for step in range(1, 4)]
            weights = {k: v.detach().clone() for k, v in run.trainer.state_dict().items()}
            reference = run.reference.state_dict()
        finally:
            run.close()
        runs[name] = (metrics, weights, reference)
    (single_m, single_w, single_ref), (fsdp_m, fsdp_w, fsdp_ref) = runs["single"], runs["fsdp"]
    loss_diff, weight_diff = max_differences((single_m, single_w), (fsdp_m, fsdp_w))
    assert loss_diff < TOL and weight_diff < TOL
    for a, b in zip(single_m, fsdp_m):
        assert_same_update_metrics(a, b)  # policy/kl_ref among them: the whole mini-batch's token mean
    assert single_m[-1]["policy/kl_ref"] > 0  # the penalty acts: the policy has moved from its reference
    assert set(single_ref) == set(fsdp_ref) and max(float((single_ref[k] - fsdp_ref[k]).abs().max()) for k in single_ref) < TOL


def test_lora_on_two_fsdp_ranks_matches_one_process(tmp_path):
    """``model.lora`` on 2 FSDP ranks: the adapters are injected before sharding (frozen base and trainable adapters in
    the same FSDP2 groups), only they train, the engine gets the merged weights gathered from the ranks, and the KL
    penalty's reference is the base model with the adapters off, on each rank's shard (R3, N = 2)."""
    mode = ["moe.routing_replay=R3", "optim.minibatches_per_step=2", "model.lora={rank: 4, alpha: 8.0}", "algo.kl_coef=0.1"]
    _, sharded = _two_ranks_match_one_process(tmp_path, *mode)
    assert not any(".lora_" in key for key in sharded[1])  # merged, under the base model's names
    assert sharded[0][-1]["policy/kl_ref"] > 0  # the adapters have moved the policy from its base


def test_the_first_order_diagnostics_on_two_ranks_match_one_process(tmp_path):
    """``diagnostics.every_steps`` on 2 FSDP ranks: the surrogate's and the sequence-level gradients come back as the
    ranks' local shards one after another (a permutation of the whole gradient), so their cosine, norms and relative
    error are the single process's; the residual and IS statistics use the log-probs gathered in row order."""
    mode = ["moe.routing_replay=R3", "optim.minibatches_per_step=2", "diagnostics.every_steps=1"]
    single, sharded = _two_ranks_match_one_process(tmp_path, *mode)
    keys = [k for k in single[0][0] if k.startswith(("fidelity/", "residual/", "is/"))]
    assert "fidelity/first_grad_cosine" in keys and "fidelity/last_grad_norm_seq" in keys
    for a, b in zip(single[0], sharded[0]):
        for key in keys:
            # rel 1e-4; abs 1e-5 for the statistics that are float noise on-policy (chi2 ~ 1e-6, rel_err ~ 1e-6)
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (key, a[key], b[key])
