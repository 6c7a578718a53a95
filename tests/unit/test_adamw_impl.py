"""``optim.adamw_impl``: which of torch's AdamW implementations steps the weights. The same update to float
rounding; ``default`` is exactly today's optimizer; a resume keeps the configured implementation."""

from __future__ import annotations

import pytest
import torch

from minirl.config import ConfigError, load_config
from minirl.runtime import build_trainer
from minirl.trainer import ADAMW_IMPLS, Trainer, adamw_flags
from tests.conftest import make_tiny_moe
from tests.unit.test_trainer_precision import batch_of, objective


def trained(impl: str, updates: int = 3) -> tuple[Trainer, dict[str, torch.Tensor]]:
    model = make_tiny_moe(0)
    trainer = Trainer(model, lr=1e-3, weight_decay=0.1, adamw_impl=impl)
    for seed in range(updates):
        assert trainer.update(batch_of(seed=seed), objective).fault is None
    return trainer, {name: p.detach().clone() for name, p in model.named_parameters()}


def test_each_impl_sets_torchs_flags():
    assert adamw_flags("default") == {"foreach": None, "fused": None}
    assert adamw_flags("for_loop") == {"foreach": False, "fused": None}
    assert adamw_flags("foreach") == {"foreach": True, "fused": None}
    assert adamw_flags("fused") == {"foreach": None, "fused": True}
    for impl in ADAMW_IMPLS:
        group = Trainer(make_tiny_moe(0), lr=1e-3, adamw_impl=impl).optimizer.param_groups[0]
        assert (group["foreach"], group["fused"]) == tuple(adamw_flags(impl).values())
    with pytest.raises(ValueError, match="default, for_loop, foreach, fused"):
        adamw_flags("apex")


def test_default_is_exactly_the_unconfigured_optimizer():
    _, default = trained("default")
    model = make_tiny_moe(0)
    trainer = Trainer(model, lr=1e-3, weight_decay=0.1)
    for seed in range(3):
        trainer.update(batch_of(seed=seed), objective)
    assert all(torch.equal(p, default[name]) for name, p in model.named_parameters())


@pytest.mark.parametrize("impl", ["for_loop", "foreach", "fused"])
def test_every_impl_makes_the_same_update_to_rounding(impl):
    _, reference = trained("default")  # a CPU's default is the for-loop
    _, weights = trained(impl)
    moved = max(float((reference[name] - make_tiny_moe(0).get_parameter(name).detach()).abs().max()) for name in reference)
    gap = max(float((weights[name] - reference[name]).abs().max()) for name in reference)
    assert moved > 1e-3  # the weights did move by about 3 x lr
    assert gap < 1e-6
    if impl == "for_loop":
        assert gap == 0.0


def test_a_resumed_optimizer_keeps_its_configured_impl():
    saved, _ = trained("for_loop", updates=2)
    state = saved.checkpoint_state()
    assert state["optimizer"]["param_groups"][0]["foreach"] is False
    fused = Trainer(saved.model, lr=1e-3, weight_decay=0.1, adamw_impl="fused")
    fused.load_checkpoint_state(state)  # load_state_dict would bring back the saved foreach=False
    group = fused.optimizer.param_groups[0]
    assert (group["foreach"], group["fused"]) == (None, True)
    assert group["lr"] == 1e-3 and group["weight_decay"] == 0.1


def test_the_config_key_reaches_the_trainer_and_names_itself():
    assert load_config(None).optim.adamw_impl == "default"
    cfg = load_config(None, ["optim.adamw_impl=fused"])
    trainer = build_trainer(cfg, make_tiny_moe(0), replay=None)
    assert trainer.adamw_impl == "fused" and trainer.optimizer.param_groups[0]["fused"] is True
    with pytest.raises(ConfigError, match=r"optim.adamw_impl: must be"):
        load_config(None, ["optim.adamw_impl=apex"])
