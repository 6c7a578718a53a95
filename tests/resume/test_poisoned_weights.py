"""A checkpoint is good only if it is: an optimizer step that leaves non-finite or exploding
weights is undone bit for bit and counted as a fault (``minirl.update_guard``); k in a row stop the
run (exit code 3) naming a last good checkpoint whose weights are finite."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from minirl import checkpoint, loop
from minirl.cli import main
from minirl.update_guard import MAX_NORM_GROWTH, UpdateGuard
from tests.resume.test_exact_resume import TINY


def _adam_after_one_step(lr: float) -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-2)
    layer(torch.randn(5, 4)).square().sum().backward()
    optimizer.step()  # optimizer state exists: the restore must bring it back too
    optimizer.param_groups[0]["lr"] = lr
    layer(torch.randn(5, 4)).square().sum().backward()
    return layer, optimizer


def _state(layer: torch.nn.Linear, optimizer: torch.optim.AdamW) -> list[torch.Tensor]:
    return [p.detach().clone() for p in layer.parameters()] + [
        v.clone() for p in layer.parameters() for v in optimizer.state[p].values()]


@pytest.mark.parametrize("lr, reason", [(math.inf, "non-finite weights after the optimizer step (norm "),
                                        (1e3, "exploding update (weight norm ")])
def test_guard_undoes_a_poisoning_step_bit_for_bit(lr: float, reason: str) -> None:
    layer, optimizer = _adam_after_one_step(lr)
    guard = UpdateGuard(optimizer)
    before = _state(layer, optimizer)
    guard.snapshot()
    optimizer.step()
    problem = guard.check()
    assert problem is not None and problem.startswith(reason), problem
    guard.restore()
    after = _state(layer, optimizer)
    assert len(after) == len(before) == 2 + 2 * 3 and all(torch.equal(a, b) for a, b in zip(before, after))


def test_guard_passes_a_normal_step_and_forgets_state_it_did_not_have() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-2)
    layer(torch.randn(5, 4)).sum().backward()
    guard = UpdateGuard(optimizer)
    guard.snapshot()
    optimizer.step()
    assert guard.check() is None  # lr 1e-2 moves each weight by ~1e-2: far below 10x the norm
    guard.restore()  # the first step created the moments: undone, none are left
    assert not any(optimizer.state[p] for p in layer.parameters())
    assert MAX_NORM_GROWTH == 10.0


def _poison_from(step_from: int, lr: float, monkeypatch: pytest.MonkeyPatch) -> dict:
    seen: dict = {"skips": []}
    original = loop.global_step

    def global_step(run, step):
        if step >= step_from:
            run.trainer.optimizer.param_groups[0]["lr"] = lr  # what optim.lr=.inf / 1e30 did before validation
        metrics = original(run, step)
        seen["skips"] += run.faults
        seen["run"] = run
        if step == step_from - 1:  # the last good weights
            seen["good"] = {name: p.detach().clone() for name, p in run.trainer.model.named_parameters()}
        return metrics

    monkeypatch.setattr(loop, "global_step", global_step)
    return seen


def _stopped_run(tmp_path, capsys, name: str, *extra: str) -> tuple[list[str], str]:
    """An 8-step tiny run that must stop with exit code 3 and one ``minirl:`` line, no traceback."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    code = main(["train", "configs/demo.yaml", *overrides, "optim.global_steps=8", *extra,
                 f"run.output_dir={tmp_path}", f"run.name={name}"])
    err = capsys.readouterr().err
    assert code == 3, err
    stop = [line for line in err.splitlines() if line.startswith("minirl:")]
    assert len(stop) == 1 and "Traceback" not in err, err
    return stop, err


@pytest.mark.parametrize("lr, reason", [(math.inf, "non-finite weights"), (1e3, "exploding update")])
def test_poisoning_steps_are_skipped_and_stop_with_a_good_checkpoint(tmp_path, monkeypatch, capsys, lr, reason):
    seen = _poison_from(4, lr, monkeypatch)
    stop, err = _stopped_run(tmp_path, capsys, "p", "optim.max_consecutive_faults=3")
    assert stop[0].startswith("minirl: stopped: step 6: 3 updates in a row skipped") and "step_000005" in stop[0], err
    assert len(seen["skips"]) == 3 and all(reason in s for s in seen["skips"]), seen["skips"]
    run = tmp_path / "p"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(7))  # each step once
    assert [r["faults/skipped_updates"] for r in rows[1:]] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    # steps 4 and 5 skipped their update: their checkpoints hold step 3's weights, finite, bit for bit
    assert sorted(os.listdir(run / "checkpoints")) == ["step_000004", "step_000005"]
    assert checkpoint.find_latest(run)[0].name == "step_000005"
    good = seen["good"]
    for name in ("step_000004", "step_000005"):
        saved = load_file(run / "checkpoints" / name / "model" / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in saved.values())
        assert all(torch.equal(saved[n], good[n]) for n in saved if n in good)
    live = dict(seen["run"].trainer.model.named_parameters())
    assert all(torch.equal(live[n].detach(), good[n]) for n in good)  # every poisoned step undone


def test_a_checkpoint_with_non_finite_weights_is_never_written(tmp_path):
    from minirl.config import load_config
    from minirl.models.io import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("qwen3-moe-tiny", seed=0)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(FloatingPointError, match="checkpoint step 1 not written: non-finite weights in "):
        checkpoint.save(tmp_path, 1, model=model, tokenizer=tokenizer, state={}, cfg=load_config(None), keep_last=2)
    assert not (tmp_path / "checkpoints").exists()


def test_check_mode_keeps_no_copy_and_off_checks_nothing():
    layer = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=math.inf)
    layer(torch.randn(5, 4)).sum().backward()
    check, off = UpdateGuard(optimizer, "check"), UpdateGuard(optimizer, "off")
    check.snapshot()
    off.snapshot()
    assert check._weights is None and not check.can_undo  # no copy: the memory a large model lacks
    optimizer.step()
    assert "non-finite weights" in check.check()
    assert off.check() is None
    with pytest.raises(ValueError, match="update guard mode"):
        UpdateGuard(optimizer, "sometimes")


def test_check_mode_stops_at_the_first_poisoned_step_before_any_checkpoint_holds_it(tmp_path, monkeypatch, capsys):
    _poison_from(4, math.inf, monkeypatch)
    stop, err = _stopped_run(tmp_path, capsys, "c", "optim.update_guard=check")
    assert stop[0].startswith("minirl: stopped: step 4: non-finite weights after the optimizer step"), err
    assert "optim.update_guard=check keeps no copy" in stop[0] and stop[0].endswith("step_000003"), err
    run = tmp_path / "c"
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
    assert checkpoint.find_latest(run)[0].name == "step_000003"
    saved = load_file(run / "checkpoints" / "step_000003" / "model" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())
