"""TRL's and verl's practices end to end on the tiny MoE, each reaching the step it changes: DAPO's dynamic sampling
(``rollout.filter_groups``: with every group already spread it changes nothing, bit for bit), ``algo.mask_truncated``,
verl's rejection (``algo.reject``), RLOO's baseline (``algo.adv_baseline``), REINFORCE++'s whitening and the entropy
bonus (``algo.entropy_coef``)."""

from __future__ import annotations

import json
import math

import pytest

from minirl.cli import main
from tests.resume.test_exact_resume import TINY


def _rows(path):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/", "filter/"))}
            for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_with_every_group_spread_dynamic_sampling_is_the_plain_run(tmp_path):
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=3", f"run.output_dir={tmp_path}"]
    assert main([*base, "run.name=plain"]) == 0
    assert main([*base, "run.name=filtered", "rollout.filter_groups=true"]) == 0
    plain, filtered = _rows(tmp_path / "plain"), _rows(tmp_path / "filtered")
    assert all(row["train/uniform_reward_groups_frac"] == 0.0 for row in plain[1:])  # the shaped reward spreads
    assert plain == filtered
    rows = [json.loads(line) for line in (tmp_path / "filtered" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["filter/rounds"], r["filter/kept_groups_frac"], r["filter/topped_up_groups"]) for r in rows[1:]] == [(1.0, 1.0, 0.0)] * 3
    assert rows[1]["filter/reward_mean_generated"] == rows[1]["train/reward_mean"]


def test_mask_truncated_with_every_completion_cut_trains_nothing(tmp_path):
    """``algo.mask_truncated`` reaches the batch: with every completion cut by the 2-token limit no token trains
    (no gradient; the token statistics over trained tokens are empty, where the same run without it has them)."""
    overrides = [o for o in TINY if not o.startswith(("optim.global_steps=", "rollout.max_new_tokens="))]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=1", "rollout.max_new_tokens=2",
            "eval.max_new_tokens=2", f"run.output_dir={tmp_path}"]
    assert main([*base, "run.name=masked", "algo.mask_truncated=true"]) == 0
    assert main([*base, "run.name=plain"]) == 0
    masked, plain = (json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[1]) for name in ("masked", "plain"))
    assert masked["train/truncated_frac"] == plain["train/truncated_frac"] == 1.0
    assert masked["optim/grad_norm"] == 0.0 and masked["policy/ratio_old_mean"] == masked["train/entropy"] == 0.0
    assert plain["policy/ratio_old_mean"] == 1.0 and plain["train/entropy"] > 0.0


def test_rejection_reaches_training_and_with_open_bounds_changes_nothing(tmp_path):
    """``algo.reject`` (verl's ``rollout_rs``) end to end on the bf16 engine's mismatch: with bounds that keep
    every ratio the run is the plain run bit for bit (pi_old then comes from its own pass: the same numbers);
    with tight ones tokens are rejected and said so."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=2", f"run.output_dir={tmp_path}"]
    assert main([*base, "run.name=plain"]) == 0
    assert main([*base, "run.name=open", "algo.reject=token_k1"]) == 0
    assert main([*base, "run.name=tight", "algo.reject=token_k1", "algo.reject_low=0.9999", "algo.reject_high=1.0001"]) == 0
    skip = ("mismatch/rejected_",)
    plain, open_ = ([{k: v for k, v in r.items() if not k.startswith(skip)} for r in _rows(tmp_path / name)]
                    for name in ("plain", "open"))
    assert plain == open_
    rows = [json.loads(line) for line in (tmp_path / "open" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["mismatch/rejected_token_frac"] == 0.0 for r in rows[1:])
    rows = [json.loads(line) for line in (tmp_path / "tight" / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 < r["mismatch/rejected_seq_frac"] <= 1.0 and r["mismatch/rejected_token_frac"] > 0.0 for r in rows[1:])
    assert rows[1]["policy/is_weight_mean"] != plain[1]["policy/is_weight_mean"]  # the update saw fewer tokens
    assert rows[1]["mismatch/kl_k3"] == plain[1]["mismatch/kl_k3"]  # the monitor still sees every sampled token


def test_a_leave_one_out_baseline_scales_the_first_loss_by_g_over_g_minus_one(tmp_path):
    """``algo.adv_baseline: leave_one_out`` reaches the advantages: RLOO's A = G/(G - 1) (R - mean), so the first
    step (same rollouts, same weights) has G/(G - 1) = 4/3 times the plain run's loss."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=1", f"run.output_dir={tmp_path}"]
    assert main([*base, "run.name=plain"]) == 0
    assert main([*base, "run.name=rloo", "algo.adv_baseline=leave_one_out"]) == 0
    plain, rloo = (_rows(tmp_path / name)[1] for name in ("plain", "rloo"))
    assert plain["train/reward_mean"] == rloo["train/reward_mean"] and plain["policy/loss"] != 0.0
    assert rloo["policy/loss"] == pytest.approx(plain["policy/loss"] * 4 / 3, rel=1e-5)


def test_whitened_advantages_reach_the_loss(tmp_path):
    """``algo.adv_whiten`` (REINFORCE++-baseline) changes the first step's loss, on the same rollouts."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=1", f"run.output_dir={tmp_path}"]
    assert main([*base, "run.name=plain"]) == 0
    assert main([*base, "run.name=whiten", "algo.adv_whiten=true"]) == 0
    plain, whiten = (_rows(tmp_path / name)[1] for name in ("plain", "whiten"))
    assert plain["train/reward_mean"] == whiten["train/reward_mean"]
    assert math.isfinite(whiten["policy/loss"]) and whiten["policy/loss"] != plain["policy/loss"]


def test_the_entropy_bonus_reaches_the_loss(tmp_path):
    """``algo.entropy_coef`` (verl's ``entropy_coeff``, TRL's ``entropy_coef``): on the first step's rollouts the
    loss is the plain run's minus coef x pi_theta's token-mean entropy, which at theta_old is the monitor's
    ``train/entropy``; the bonus then moves the weights (the second step's rollouts differ)."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=2", f"run.output_dir={tmp_path}"]
    assert main([*base, "run.name=plain"]) == 0
    assert main([*base, "run.name=bonus", "algo.entropy_coef=0.05"]) == 0
    (plain, plain2), (bonus, bonus2) = (_rows(tmp_path / name)[1:3] for name in ("plain", "bonus"))
    assert plain["train/reward_mean"] == bonus["train/reward_mean"] and "policy/entropy" not in plain
    assert bonus["policy/entropy"] == pytest.approx(plain["train/entropy"], rel=1e-5)
    assert bonus["train/entropy"] == pytest.approx(bonus["policy/entropy"], rel=1e-5)  # the fused pass reuses it
    assert bonus["policy/loss"] == pytest.approx(plain["policy/loss"] - 0.05 * bonus["policy/entropy"], rel=1e-5)
    assert bonus2["policy/loss"] != plain2["policy/loss"]


def test_sapo_on_policy_has_grpos_gradient_and_twice_its_loss_at_unit_temperatures(tmp_path):
    """``configs/sapo.yaml`` (TRL's ``loss_type="sapo"``) end to end: at N = 1 the first update is on policy (r = 1),
    where the gate's gradient weight 4 s (1 - s) is exactly 1 and, with tau = 1, f(1) = sigma(0) * 4 = 2: SAPO's
    loss is twice GRPO's on the same rollouts (``configs/grpo.yaml``, which differs only in its algo section)."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    common = [*overrides, "optim.global_steps=2", f"run.output_dir={tmp_path}"]
    assert main(["train", "configs/grpo.yaml", *common, "run.name=grpo"]) == 0
    assert main(["train", "configs/sapo.yaml", *common, "run.name=sapo", "algo.tau_neg=1.0"]) == 0
    (grpo, _), (sapo, sapo2) = (_rows(tmp_path / name)[1:3] for name in ("grpo", "sapo"))
    assert grpo["train/reward_mean"] == sapo["train/reward_mean"] and grpo["policy/loss"] != 0.0
    assert sapo["policy/loss"] == pytest.approx(2 * grpo["policy/loss"], rel=1e-6)
    assert sapo["policy/gate_weight_mean"] == 1.0 and sapo["policy/clip_frac"] == 0.0
    assert 0.0 < sapo2["policy/gate_weight_mean"] <= 1.0


def test_high_entropy_tokens_reach_the_loss_beside_the_kl_penalty_and_the_entropy_bonus(tmp_path):
    """``algo.top_entropy_quantile`` (TRL's, "Beyond the 80/20 rule"): on the first step's rollouts only a fifth of
    the tokens keep their policy term (another loss on the same rollouts); with the KL penalty and the entropy bonus
    around it, each wrapper passes the forward's entropy on (at theta_old the KL is 0: the loss is the bonus's shift)."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=2", f"run.output_dir={tmp_path}"]
    assert main([*base, "run.name=plain"]) == 0
    assert main([*base, "run.name=top", "algo.top_entropy_quantile=0.2"]) == 0
    assert main([*base, "run.name=all", "algo.top_entropy_quantile=0.2", "algo.kl_coef=0.05", "algo.entropy_coef=0.01"]) == 0
    plain, top, every = (_rows(tmp_path / name)[1] for name in ("plain", "top", "all"))
    assert plain["train/reward_mean"] == top["train/reward_mean"] == every["train/reward_mean"]
    assert top["policy/loss"] != plain["policy/loss"]
    assert "policy/kl_ref" in every and every["policy/entropy"] > 0
    assert every["policy/loss"] == pytest.approx(top["policy/loss"] - 0.01 * every["policy/entropy"], rel=1e-5)


def test_adaptive_entropy_control_moves_the_coefficient_update_by_update(tmp_path):
    """``algo.entropy_target`` (Skywork-OR1, TRL's ``use_adaptive_entropy``), one update per step: no bonus in the
    first update, then the coefficient the last update left, up by the delta while the entropy (~4.6 nats for this
    untrained model) stays under a target of 10, down to the floor under a target of 1."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=3", f"run.output_dir={tmp_path}",
            "algo.entropy_coef=0.01", "algo.entropy_coef_delta=0.02"]
    assert main([*base, "run.name=under", "algo.entropy_target=10.0"]) == 0
    assert main([*base, "run.name=over", "algo.entropy_target=1.0"]) == 0
    under, over = (_rows(tmp_path / name)[1:] for name in ("under", "over"))
    assert [row["policy/entropy_coef"] for row in under] == pytest.approx([0.0, 0.03, 0.05])
    assert [row["policy/entropy_coef"] for row in over] == [0.0, 0.0, 0.0]
    assert all(1.0 < row["policy/entropy"] < 10.0 for row in under + over)


def test_remaxs_greedy_baseline_is_sampled_and_reaches_the_loss(tmp_path):
    """``algo.adv_baseline: greedy`` (verl's remax): each step also samples one greedy completion per prompt, logs
    its mean reward, and the first step's loss (same rollouts: the greedy draw takes no sampling seed) is no longer
    the group mean's."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=1", f"run.output_dir={tmp_path}"]
    assert main([*base, "run.name=plain"]) == 0
    assert main([*base, "run.name=remax", "algo.adv_baseline=greedy"]) == 0
    plain, remax = (_rows(tmp_path / name)[1] for name in ("plain", "remax"))
    assert plain["train/reward_mean"] == remax["train/reward_mean"]
    assert "train/greedy_reward_mean" in remax and "train/greedy_reward_mean" not in plain
    assert math.isfinite(remax["policy/loss"]) and remax["policy/loss"] != plain["policy/loss"]
