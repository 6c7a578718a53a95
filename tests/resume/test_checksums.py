"""Checksums: every checkpoint records the SHA-256 of each file it holds; a resume verifies them and
falls back to the newest older checkpoint that verifies, in one line, ending bitwise where the
uninterrupted run ends."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from minirl import checkpoint
from minirl.cli import main
from tests.resume.test_exact_resume import TINY


def _args(tmp_path, name: str, steps: int) -> list[str]:
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    return ["train", "configs/demo.yaml", *overrides, f"optim.global_steps={steps}", "run.overwrite=false",
            f"run.output_dir={tmp_path}", f"run.name={name}"]


def _flip_bytes(step_dir):
    weights = step_dir / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100:-90] = bytes(b ^ 0xFF for b in data[-100:-90])  # inside a tensor: same size, loads fine
    weights.write_bytes(bytes(data))
    return f"model/model.safetensors does not match its recorded SHA-256 ({len(data)} bytes)"


def _truncate_state(step_dir):
    state = step_dir / checkpoint.STATE
    state.write_bytes(state.read_bytes()[:1000])
    return "trainer_state.pt does not match its recorded SHA-256 (1000 bytes)"


def _empty_state(step_dir):
    (step_dir / checkpoint.STATE).write_bytes(b"")
    return "trainer_state.pt does not match its recorded SHA-256 (0 bytes)"


def _missing_tokenizer(step_dir):
    (step_dir / "model" / "tokenizer.json").unlink()
    return "model/tokenizer.json is missing"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref")
    assert main(_args(root, "ref", 4)) == 0
    return root / "ref"


@pytest.mark.parametrize("damage", [_flip_bytes, _truncate_state, _empty_state, _missing_tokenizer])
def test_a_damaged_checkpoint_falls_back_to_the_older_one(tmp_path, capsys, reference, damage):
    assert main(_args(tmp_path, "d", 3)) == 0
    run = tmp_path / "d"
    meta = json.loads((run / "checkpoints" / "step_000003" / checkpoint.META).read_text())
    assert meta["format"] == 2 and set(meta["files"]) >= {checkpoint.STATE, "model/model.safetensors", "model/config.json"}
    reason = damage(run / "checkpoints" / "step_000003")
    capsys.readouterr()
    assert main([*_args(tmp_path, "d", 4), "--resume"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("minirl:")]
    assert lines == [f"minirl: resume: damaged checkpoint step_000003 ({reason}; moved to step_000003.damaged); "
                     "resuming from the older step_000002"], err
    assert "Traceback" not in err and "resumed from" in err and "step_000002" in err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # each step once
    want = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("train/reward_mean") for r in rows] == [r.get("train/reward_mean") for r in want]
    a, b = load_file(reference / "checkpoint" / "model.safetensors"), load_file(run / "checkpoint" / "model.safetensors")
    assert all(torch.equal(a[n], b[n]) for n in a)  # step 3 redone from step 2: bitwise the uninterrupted run
    assert sorted(os.listdir(run / "checkpoints")) == ["step_000003", "step_000003.damaged", "step_000004"]
    assert all(checkpoint.verify(run / "checkpoints" / s) is None for s in ("step_000003", "step_000004"))


def test_no_checkpoint_verifies_starts_again_from_step_0(tmp_path, capsys):
    assert main([*_args(tmp_path, "e", 2), "checkpoint.keep_last=1"]) == 0
    run = tmp_path / "e"
    _empty_state(run / "checkpoints" / "step_000002")
    capsys.readouterr()
    assert main([*_args(tmp_path, "e", 2), "--resume"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("minirl:")]
    assert len(lines) == 2 and "no older checkpoint verifies" in lines[0] and "starting from step 0" in lines[1]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


def test_a_format_1_checkpoint_without_digests_still_resumes(tmp_path):
    assert main(_args(tmp_path, "o", 2)) == 0
    step = tmp_path / "o" / "checkpoints" / "step_000002"
    meta = json.loads((step / checkpoint.META).read_text())
    meta["format"] = 1
    del meta["files"]
    (step / checkpoint.META).write_text(json.dumps(meta))
    assert checkpoint.verify(step) is None
    assert checkpoint.resume_point(tmp_path / "o", log=print) == step
    (step / checkpoint.STATE).write_bytes(b"")  # unverifiable, and unreadable: one line, not a traceback
    with pytest.raises(checkpoint.ConfigError, match=r"trainer_state.pt is unreadable"):
        checkpoint.load_state(step)
