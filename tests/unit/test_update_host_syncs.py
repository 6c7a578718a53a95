"""An update waits for the device once: the loss math never converts a tensor to a Python value inside
the micro-batch loop (issue 20: no host synchronisation inside an update), and NaNs are still caught,
once per update, with the reason named.

On a CPU nothing really synchronises, so the census patches the tensor methods that would (``item``,
``tolist``, ``__bool__``, ``__float__``, ``__int__``, ``__index__``, ``cpu``) and counts the calls made
from the loss-side modules. (``benchmarks/gpu_bench.py`` counts the real syncs on a GPU.)
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from minirl.config import load_config
from minirl.moe import RoutingReplay
from minirl.objective import make_objective, with_entropy_bonus
from minirl.reference import with_reference_kl
from minirl.trainer import Trainer
from tests.conftest import make_tiny_moe
from tests.unit.test_trainer_precision import batch_of

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
LOSS_SIDE = ("minirl/algo/", "minirl/loss_inputs.py", "minirl/objective.py", "minirl/reference.py")
SYNCING = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu")


def census(monkeypatch, trainer: Trainer, work, sites: tuple[str, ...] = LOSS_SIDE) -> collections.Counter:
    """Calls of the syncing tensor methods made directly from the loss-side modules while ``work()`` is
    inside ``trainer``'s micro-batch loop (``Trainer._accumulate``; the checks before and after it run on
    host tensors or on the rare failure path)."""
    counts: collections.Counter = collections.Counter()
    inside = [False]
    accumulate = trainer._accumulate

    def in_loop(*args, **kwargs):
        inside[0] = True
        try:
            return accumulate(*args, **kwargs)
        finally:
            inside[0] = False

    monkeypatch.setattr(trainer, "_accumulate", in_loop)
    for name in SYNCING:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
            if inside[0] and any(part in caller for part in sites):
                counts[f"{caller.rsplit('/src/', 1)[-1]}:{sys._getframe(1).f_lineno} {_name}"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    work()
    monkeypatch.undo()
    return counts


def r3_setup(kl_coef: float = 0.0, loss: str = "minirl", entropy_coef: float = 0.0):
    knobs = [f"algo.kl_coef={kl_coef}", f"algo.entropy_coef={entropy_coef}"]
    cfg = load_config(ROOT / "configs/demo.yaml", knobs) if loss == "minirl" else \
        load_config(None, [f"algo.name={loss}", *knobs])
    model = make_tiny_moe(0)
    trainer = Trainer(model, lr=1e-3, micro_batch_sequences=2, replay=RoutingReplay(model))
    batch = batch_of(6)
    scored = trainer.score(batch, record_routes=True)
    batch = batch.with_logp_old(scored.logp).with_routes(scored.routes)
    if kl_coef:
        batch = batch.with_logp_ref(scored.logp - 0.01)
    objective = with_entropy_bonus(cfg.algo, batch, with_reference_kl(cfg.algo, batch, make_objective(cfg.algo, batch)))
    return trainer, batch, objective


@pytest.mark.parametrize(("loss", "kl_coef"), [("minirl", 0.0), ("minirl", 0.1), ("cispo", 0.0), ("grpo", 0.0), ("gspo", 0.0),
                                               ("sapo", 0.0)],
                         ids=["minirl", "minirl+kl", "cispo", "grpo", "gspo", "sapo"])
def test_the_loss_side_never_waits_for_the_device_inside_an_update(monkeypatch, loss, kl_coef):
    trainer, batch, objective = r3_setup(kl_coef, loss)
    results = []
    counts = census(monkeypatch, trainer, lambda: results.append(trainer.update(batch, objective, replay_routes=True)))
    assert results[0].fault is None and trainer.updates_done == 1
    assert not counts, f"host conversions in the loss math inside an update: {dict(counts)}"


def test_the_entropy_bonus_never_waits_for_the_device_inside_an_update(monkeypatch):
    trainer, batch, objective = r3_setup(entropy_coef=0.01)
    results = []
    counts = census(monkeypatch, trainer, lambda: results.append(trainer.update(batch, objective, replay_routes=True)))
    assert results[0].fault is None and "entropy" in results[0].metrics
    assert not counts, f"host conversions in the loss math inside an update: {dict(counts)}"


def test_the_fused_old_pass_keeps_its_scores_on_the_device_until_the_update_ends(monkeypatch):
    """N = 1: the update is also the pi_old pass and returns the scores (log-probs, entropies, routes);
    they are written into device buffers and copied to the host once, after the loop."""
    trainer, batch, objective = r3_setup()
    results = []
    work = lambda: results.append(trainer.update(batch, objective, replay_routes=True, score=True, record_routes=True))  # noqa: E731
    counts = census(monkeypatch, trainer, work, sites=("minirl/trainer.py", *LOSS_SIDE))
    assert not counts, f"host copies or conversions inside the update's loop: {dict(counts)}"
    scores = results[0].scores
    assert scores is not None and scores.routes is not None and scores.entropy is not None
    assert scores.logp.device.type == "cpu" and torch.equal(scores.logp, scores.logp * batch.mask)


def test_the_chunked_head_sizes_its_chunks_off_the_host_mask(monkeypatch):
    """optim.logprob_chunk_tokens: where the completion tokens are, and so how many chunks run, is read off the
    micro-batch's host mask; nothing of the device is read back inside the update (fused pi_old pass included)."""
    trainer, batch, objective = r3_setup(entropy_coef=0.01)
    chunked = Trainer(trainer.model, lr=1e-3, micro_batch_sequences=2, replay=trainer.replay, logprob_chunk_tokens=3)
    results = []
    work = lambda: results.append(chunked.update(batch, objective, replay_routes=True, score=True, record_routes=True))  # noqa: E731
    counts = census(monkeypatch, chunked, work, sites=("minirl/trainer.py", "minirl/models/logprob_head.py", *LOSS_SIDE))
    assert not counts, f"host copies or conversions inside the update's loop: {dict(counts)}"
    assert results[0].fault is None and results[0].scores is not None and results[0].scores.entropy is not None


def test_the_r2_drift_metric_is_counted_on_the_device(monkeypatch):
    """R2 with routing metrics: every micro-batch compares the replayed routes with the routers' own
    choices; the counts stay tensors and reach the host with the update's other numbers."""
    trainer, batch, objective = r3_setup()
    results = []
    work = lambda: results.append(trainer.update(batch, objective, replay_routes=True, natural_drift=True))  # noqa: E731
    counts = census(monkeypatch, trainer, work, sites=("minirl/trainer.py", "minirl/monitor/routing.py", *LOSS_SIDE))
    assert not counts, f"host conversions inside the update's loop: {dict(counts)}"
    assert results[0].natural_diff_frac == 0.0  # replaying the routers' own routes at the same weights


def test_a_nan_input_skips_the_update_before_any_forward_and_names_it():
    trainer, batch, objective = r3_setup()
    advantages = batch.advantages.clone()
    advantages[2] = float("nan")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.update(dataclasses.replace(batch, advantages=advantages), objective, replay_routes=True)
    assert result.fault == "non-finite inputs (advantages contain NaN (1 of 6))"
    assert trainer.updates_done == 0 and trainer.faults == 1
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))
    logp_old = batch.logp_old.clone()
    logp_old[tuple(batch.mask.nonzero()[0].tolist())] = float("nan")
    result = trainer.update(batch.with_logp_old(logp_old), objective, replay_routes=True)
    assert result.fault == "non-finite inputs (logp_old contains NaN at 1 trained (mask=True) token(s))"


def test_an_fsdp_rank_with_a_nan_input_still_runs_its_passes_and_skips_by_the_norm():
    """On a rank of an FSDP group (``Trainer.collective``) a rank that skipped alone would leave its peers
    waiting in a collective: it runs every forward and backward with a NaN loss instead, so the global
    gradient norm is NaN on every rank and all skip together; its fault still names the input."""
    trainer, batch, objective = r3_setup()
    trainer.collective = True
    forwards = []
    trainer.model.register_forward_hook(lambda module, args, out: forwards.append(1))
    logp_rollout = batch.logp_rollout.clone()
    logp_rollout[tuple(batch.mask.nonzero()[-1].tolist())] = float("nan")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.update(dataclasses.replace(batch, logp_rollout=logp_rollout), objective, replay_routes=True)
    assert result.fault == "non-finite inputs (logp_rollout contains NaN at 1 trained (mask=True) token(s))"
    assert len(forwards) == 3  # every micro-batch (6 rows, 2 per micro-batch) ran, with its backward
    assert trainer.updates_done == 0 and all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))


def test_a_nan_log_prob_from_the_model_skips_the_update_and_names_it():
    trainer, batch, objective = r3_setup()
    with torch.no_grad():
        trainer.model.lm_head.weight[5] = float("nan")  # every position's logits NaN: every logp NaN
    result = trainer.update(batch, objective, replay_routes=True)
    trained = int(batch.mask.sum())
    assert result.fault == f"non-finite log-probs (logp contains NaN at {trained} trained (mask=True) token(s))"
    assert trainer.updates_done == 0 and all(p.grad is None for p in trainer.model.parameters())
