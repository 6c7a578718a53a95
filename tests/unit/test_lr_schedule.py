"""``optim.lr_schedule``: warm-up, then constant, linear or cosine to ``min_lr_ratio`` x lr (``lr_factor``)."""

from __future__ import annotations

import math

import pytest
import torch

from minirl.config import load_config
from minirl.runtime import build_trainer
from minirl.trainer import lr_factor


def test_hand_computed_factors():
    # warm-up over 4 updates: (k + 1) / 4
    assert [lr_factor(k, 4) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    # 4 warm-up updates of 14: progress p = (k - 4) / 10 after them
    assert [lr_factor(k, 4, 14, "linear") for k in (4, 9, 14, 20)] == [1.0, 0.5, 0.0, 0.0]
    assert lr_factor(9, 4, 14, "linear", min_ratio=0.1) == pytest.approx(0.55, abs=1e-15)
    assert lr_factor(9, 4, 14, "cosine") == pytest.approx(0.5, abs=1e-15)
    assert lr_factor(6, 4, 14, "cosine") == pytest.approx(0.5 * (1 + math.cos(0.2 * math.pi)), abs=1e-15)  # 0.9045
    assert lr_factor(14, 4, 14, "cosine", min_ratio=0.2) == pytest.approx(0.2, abs=1e-15)
    assert lr_factor(10**6, 0, 14, "constant") == 1.0


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_after_the_warm_up_it_is_transformers_schedule(kind):
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    make = get_linear_schedule_with_warmup if kind == "linear" else get_cosine_schedule_with_warmup
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    theirs = make(optimizer, num_warmup_steps=5, num_training_steps=40).lr_lambdas[0]
    for update in range(5, 41):  # (past the last update transformers' cosine rises again; ours stays at its end)
        assert lr_factor(update, 5, 40, kind) == pytest.approx(theirs(update), abs=1e-12), update


def test_transformers_cosine_with_min_lr_is_minirls_cosine_with_its_ratio():
    """What ``minirl config from-trl`` makes of ``lr_scheduler_type="cosine_with_min_lr"`` (open-r1's): after the
    warm-up (transformers' k / W, minirl's (k + 1) / W: the usual differs line) the same cosine down to ``min_lr_rate``."""
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    from minirl.peers import from_trl

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    theirs = get_cosine_with_min_lr_schedule_with_warmup(optimizer, num_warmup_steps=5, num_training_steps=40,
                                                         min_lr_rate=0.1).lr_lambdas[0]
    for update in range(5, 41):
        assert lr_factor(update, 5, 40, "cosine", min_ratio=0.1) == pytest.approx(theirs(update), abs=1e-12), update
    assert theirs(40) == pytest.approx(0.1, abs=1e-12)
    out = from_trl({"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
                    "max_steps": 40, "warmup_steps": 5})
    assert (out.values["optim.lr_schedule"], out.values["optim.min_lr_ratio"]) == ("cosine", 0.1)
    assert any(line.startswith("the warm-up: transformers' starts at 0") for line in out.differs)
    by_value = from_trl({"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": '{"min_lr": 2e-7}',
                         "learning_rate": 1e-6})
    assert by_value.values["optim.min_lr_ratio"] == pytest.approx(0.2, abs=1e-15)
    missing = from_trl({"lr_scheduler_type": "cosine_with_min_lr"})
    assert "optim.min_lr_ratio" not in missing.values
    assert any(line.startswith("lr_scheduler_kwargs=None: minirl's cosine takes") for line in missing.not_translated)


NO_OPTIMIZER_STEP = pytest.mark.filterwarnings("ignore:Detected call of")  # the schedule alone


@NO_OPTIMIZER_STEP
def test_the_configured_trainer_decays_over_global_steps_times_n(tiny_moe):
    cfg = load_config(None, ["optim.lr=0.01", "optim.global_steps=5", "optim.minibatches_per_step=2", "optim.warmup_updates=2",
                             "optim.lr_schedule=linear", "optim.min_lr_ratio=0.1"])
    trainer = build_trainer(cfg, tiny_moe, replay=None)
    rates = []
    for _ in range(10):  # what Trainer.update steps after each update
        rates.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.scheduler.step()
    expected = [0.005, 0.01] + [0.01 * (0.1 + 0.9 * (1 - k / 8)) for k in range(8)]
    assert rates == pytest.approx(expected, abs=1e-15)
    # a resumed trainer continues the schedule where the checkpoint left it
    state = trainer.checkpoint_state()
    fresh = build_trainer(cfg, tiny_moe, replay=None)
    fresh.load_checkpoint_state(state)
    assert fresh.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.1 + 0.01 * 0.9 * (1 - 8 / 8), abs=1e-15)


@NO_OPTIMIZER_STEP
def test_the_default_is_the_papers_constant_rate(tiny_moe):
    trainer = build_trainer(load_config(None, ["optim.lr=0.01", "optim.global_steps=3"]), tiny_moe, replay=None)
    for _ in range(5):
        trainer.scheduler.step()
    assert trainer.optimizer.param_groups[0]["lr"] == 0.01
