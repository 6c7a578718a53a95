"""``RoutePlan``: which pass records or replays under each mode, and the exactly-once check."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from minirl.moe import RoutePlan


class FakeReplay:
    """Counts like ``RoutingReplay``: ``validate`` says how many rows per layer are forced."""

    def __init__(self) -> None:
        self.layer_names = ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
        self.replayed_rows = [0, 0]

    def validate(self, routes: torch.Tensor) -> list[int]:
        return [int((routes[:, :, layer] >= 0).all(dim=-1).sum()) for layer in range(2)]


@dataclass(frozen=True)
class FakeBatch:
    routes: torch.Tensor | None

    def with_routes(self, routes):
        return replace(self, routes=routes)


@dataclass
class FakeScores:
    routes: torch.Tensor


ROUTES = torch.zeros(2, 3, 2, 1, dtype=torch.int16)  # 6 forced rows per layer


@pytest.mark.parametrize("mode, engine, old_replay, old_record, updates_replay, keeps_engine_routes", [
    ("none", True, False, True, False, False),  # routing metrics: the engine and the pi_old pass record
    ("R2", True, False, True, True, False),
    ("R3", True, True, True, True, True),
])
def test_who_records_and_who_replays(mode, engine, old_replay, old_record, updates_replay, keeps_engine_routes):
    plan = RoutePlan(FakeReplay(), mode, metrics=True)
    assert plan.engine_records is engine and plan.old_pass_optional is (mode != "R2")
    batch = plan.start(FakeBatch(ROUTES))
    assert (batch.routes is not None) is keeps_engine_routes and plan.engine_routes is ROUTES
    assert plan.old_pass().kwargs == {"replay_routes": old_replay, "record_routes": old_record}
    assert plan.updates().kwargs["replay_routes"] is updates_replay
    assert plan.updates().kwargs["natural_drift"] is (mode == "R2")
    assert RoutePlan(FakeReplay(), "none", metrics=False).engine_records is False


def test_every_route_consumed_exactly_once_per_pass():
    replay = FakeReplay()
    plan = RoutePlan(replay, "R2", metrics=False)
    batch = plan.scored(plan.start(FakeBatch(None)), FakeScores(ROUTES))  # R2: the pi_old pass's routes
    assert batch.routes is ROUTES
    with plan.updates() as updates:
        replay.replayed_rows = [6, 6]
        with updates.uncounted():  # the diagnostics' replayed forwards
            replay.replayed_rows = [12, 12]
    error = r"\(updates\): MoE layer 1 \(model\.layers\.1\.mlp\.gate\) replayed 5 of the 6"
    with pytest.raises(RuntimeError, match=error), plan.updates():
        replay.replayed_rows = [18, 17]
    with plan.updates() as updates:  # a skipped update may stop early: no check
        updates.waive(True)
    with pytest.raises(RuntimeError, match=r"replayed 12 of the 6"), plan.updates():  # twice is as wrong as never
        replay.replayed_rows = [30, 29]


def test_r3_checks_the_old_pass_and_r2_does_not():
    replay = FakeReplay()
    plan = RoutePlan(replay, "R3", metrics=False)
    plan.start(FakeBatch(ROUTES))
    with pytest.raises(RuntimeError, match=r"\(old-log-prob pass\): MoE layer 0"), plan.old_pass():
        pass
    plan = RoutePlan(replay, "R2", metrics=False)
    with plan.old_pass():  # R2 records there: nothing to consume
        pass


def test_a_mode_without_replay_is_refused():
    with pytest.raises(ValueError, match="routing replay R3 needs an MoE model"):
        RoutePlan(None, "R3", metrics=True)
