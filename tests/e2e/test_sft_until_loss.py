"""Cold start to a loss target (``cold_start.until_loss``): stop early, or warn after the step budget."""

from __future__ import annotations

import json

from minirl.config import load_config
from minirl.sft import SUMMARY, run_sft, window_loss
from tests.e2e.test_cli import ROOT, TINY


def test_window_loss():
    assert window_loss([4.0, 1.0, 2.0, 3.0], 2) == 2.5
    assert window_loss([4.0, 1.0, 2.0, 3.0], 4) == 2.5
    assert window_loss([4.0], 2) is None


def _sft(tmp_path, *overrides):
    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, f"run.output_dir={tmp_path}", *overrides])
    lines: list[str] = []
    out = run_sft(cfg, tmp_path / "ckpt", log=lines.append)
    return json.loads((out / SUMMARY).read_text()), lines


def test_until_loss_stops_once_the_window_mean_is_below_it(tmp_path):
    # initial loss ~ ln(vocab) < 100: the first full window (3 steps) is below it
    summary, lines = _sft(tmp_path, "cold_start.steps=10", "cold_start.until_loss=100", "cold_start.loss_window_steps=3")
    assert summary["steps"] == 3 and summary["reached"] is True and summary["until_loss"] == 100
    assert summary["window_loss"] < 100 and any("below cold_start.until_loss=100" in line for line in lines)


def test_until_loss_not_reached_runs_every_step_and_warns(tmp_path):
    summary, lines = _sft(tmp_path, "cold_start.steps=4", "cold_start.until_loss=1e-9", "cold_start.loss_window_steps=2")
    assert summary["steps"] == 4 and summary["reached"] is False
    assert any("warning: loss still above cold_start.until_loss" in line for line in lines)


def test_without_until_loss_every_step_runs(tmp_path):
    summary, _ = _sft(tmp_path, "cold_start.steps=4")
    assert summary["steps"] == 4 and summary["reached"] is None and summary["until_loss"] is None


def test_a_stopped_sft_continues_from_its_state_bitwise(tmp_path, monkeypatch):
    """cold_start.checkpoint_every_steps (TRL's save_steps): stopped during step 5, the same command continues from the
    state kept after step 4 and ends with the weights and losses of an SFT never stopped; the state goes once done;
    another configuration's state is said and not used."""
    import pytest
    import torch
    from safetensors.torch import load_file

    import minirl.sft as sft

    common = ["cold_start.steps=6", "cold_start.checkpoint_every_steps=2"]
    whole, _ = _sft(tmp_path / "whole", *common)
    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, f"run.output_dir={tmp_path / 'cut'}", *common])
    keep = sft.SftState.keep

    def keep_then_stop(self, step, *args):  # Ctrl-C during step 5
        keep(self, step, *args)
        if step == 5:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(sft.SftState, "keep", keep_then_stop)
        with pytest.raises(KeyboardInterrupt):
            run_sft(cfg, tmp_path / "cut" / "ckpt", log=lambda line: None)
    assert torch.load(tmp_path / "cut" / "ckpt" / sft.SFT_STATE, weights_only=True)["step"] == 4
    lines: list[str] = []
    out = run_sft(cfg, tmp_path / "cut" / "ckpt", log=lines.append)
    assert any("continuing from its state after step 4" in line for line in lines)
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["steps"] == 6 and summary["final_loss"] == whole["final_loss"]
    first, second = load_file(tmp_path / "whole" / "ckpt" / "model.safetensors"), load_file(out / "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)
    assert not (out / sft.SFT_STATE).exists()
    torch.save({"key": "another", "step": 2}, out / sft.SFT_STATE)
    lines.clear()
    run_sft(cfg, out, log=lines.append)
    assert any("another configuration's state; starting from step 1" in line for line in lines)
