"""Resume means continue: a run killed before its first checkpoint resumes (plain ``--resume``)
by starting again from step 0 in place, its stale metrics removed, and ends bitwise identical to
an uninterrupted run; a run that failed before its first global step is rerun without
``run.overwrite``."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

import minirl.loop as loop
from minirl.cli import main
from tests.resume.test_exact_resume import ROOT, STEPS, TINY, _command, _env, _rows, _run_killed, _weights


def test_killed_before_the_first_checkpoint_resumes_from_step_0_bitwise(tmp_path):
    extra = ["moe.routing_replay=none", "checkpoint.every_steps=0", "run.overwrite=false"]  # the only checkpoint is the last step's
    ref = subprocess.run(_command(tmp_path, "ref", extra), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    run = tmp_path / "killed"
    cmd = _command(tmp_path, "killed", extra, "--resume")
    assert _run_killed(cmd, run, ("lines", 4)), "the run ended before the kill"
    assert not list(run.glob("checkpoints/step_*[0-9]"))
    assert len(_rows(run)) >= 4  # steps 0..3 logged, no checkpoint: what --resume used to refuse
    final = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    lines = [line for line in final.stderr.splitlines() if line.startswith("minirl:")]
    assert len(lines) == 1 and "no valid checkpoint" in lines[0] and "starting from step 0" in lines[0], final.stderr
    assert "removed the metrics of steps 1-" in lines[0] and "Traceback" not in final.stderr
    want, got = _rows(tmp_path / "ref"), _rows(run)
    assert [r["step"] for r in got] == list(range(STEPS + 1))  # each step once
    assert [r.get("train/reward_mean") for r in got] == [r.get("train/reward_mean") for r in want]
    a, b = _weights(tmp_path / "ref"), _weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def _base(tmp_path) -> list[str]:
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    return ["train", "configs/demo.yaml", *overrides, "optim.global_steps=2", "run.overwrite=false", f"run.output_dir={tmp_path}", "run.name=z"]


def test_a_run_that_failed_before_its_first_step_reruns_without_overwrite(tmp_path, monkeypatch, capsys):
    def broken(run, step):
        raise RuntimeError("the machine went away")

    with monkeypatch.context() as patch:
        patch.setattr(loop, "global_step", broken)
        with pytest.raises(RuntimeError, match="went away"):
            main(_base(tmp_path))
    assert [r["step"] for r in map(json.loads, (tmp_path / "z" / "metrics.jsonl").read_text().splitlines())] == [0]
    assert main(_base(tmp_path)) == 0  # no run.overwrite: nothing of the failed run was worth keeping
    rows = [json.loads(line) for line in (tmp_path / "z" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    # a run that got past step 1 is still protected
    assert main(_base(tmp_path)) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_resuming_a_finished_run_says_nothing_is_left(tmp_path, capsys):
    """A run resumed at its last step (a peer's dated run name translated to a fixed one, launched again): one line says
    it already finished and how to train again."""
    base = [arg for arg in _base(tmp_path) if arg != "run.overwrite=false"] + ["run.resume=auto", "checkpoint.every_steps=1"]
    assert main(base) == 0
    capsys.readouterr()
    assert main(base) == 0
    err = capsys.readouterr().err
    assert f"minirl: resume: {tmp_path / 'z'} already finished its 2 steps (step_000002); nothing is left to train" in err
