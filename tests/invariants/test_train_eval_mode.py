"""The old-log-prob pass (``eval()``) and the updates (``train()``) compute the same function, so
r = pi_theta / pi_old = 1 exactly at theta = theta_old, even for a model with dropout or Mixtral's
``router_jitter_noise``: the RL trainer turns both off (``disable_stochastic_layers``)."""

from __future__ import annotations

import pytest
import torch

from minirl.batching import collate
from minirl.config import MiniRLConfig
from minirl.objective import make_objective
from minirl.trainer import Trainer
from minirl.types import Completion
from tests.unit.test_moe_replay import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

STOCHASTIC = {
    "qwen3_moe": {"attention_dropout": 0.5},
    "mixtral": {"attention_dropout": 0.5, "router_jitter_noise": 0.5},
}


def _batch(rows: int = 6):
    g = torch.Generator().manual_seed(0)
    comps = []
    for i in range(rows):
        prompt = torch.randint(3, 60, (3 + i % 3,), generator=g).tolist()
        completion = torch.randint(3, 60, (4 + i % 4,), generator=g).tolist()
        comps.append(Completion(i // 2, i % 2, prompt, completion, -torch.rand(len(completion), generator=g), "eos"))
    return collate(comps, torch.randn(rows, generator=g), pad_token_id=0)


def _first_update(model_type: str, deterministic: bool):
    torch.manual_seed(0)
    trainer = Trainer(tiny_model(model_type, **STOCHASTIC[model_type]), lr=1e-3, micro_batch_sequences=4,
                      deterministic=deterministic)
    batch = _batch()
    old = trainer.score(batch, entropy=False)  # pi_old: eval() mode
    batch = batch.with_logp_old(old.logp)
    update = trainer.update(batch, make_objective(MiniRLConfig(), batch), score=True)  # train() mode, theta = theta_old
    return old, update


@pytest.mark.parametrize("model_type", list(STOCHASTIC))
def test_ratio_is_exactly_one_at_theta_old_with_dropout_and_router_jitter(model_type):
    old, update = _first_update(model_type, deterministic=True)
    assert torch.equal(update.scores.logp, old.logp)  # the update's own forward = the pi_old pass, bit for bit
    assert update.metrics["ratio_old_mean"] == 1.0 and update.metrics["clip_frac"] == 0.0
    # the same model with its dropout / jitter left on: the two passes disagree (the check can fail)
    old, update = _first_update(model_type, deterministic=False)
    assert not torch.equal(update.scores.logp, old.logp) and update.metrics["ratio_old_mean"] != 1.0
