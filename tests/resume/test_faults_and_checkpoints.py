"""Numerical faults skip an update (counted, k in a row stop the run, exit code 3); checkpoints are
complete, pruned and refuse a resume under a different algorithm config."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch

import minirl.loop as loop
from minirl import checkpoint
from minirl.cli import main
from minirl.config import ConfigError, load_config
from tests.resume.test_exact_resume import TINY

STEPS = 3


def _cfg(tmp_path, *more):
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    return load_config("configs/demo.yaml", [*overrides, f"optim.global_steps={STEPS}", f"run.output_dir={tmp_path}", "run.name=f", *more])


def _rows(cfg):
    return [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def captured():
    """``captured["train"](cfg)``: ``loop.train`` of a ``Run`` built here (``captured["run"]``) and
    changed by ``captured["patch"](run)`` first (the ``train(run=...)`` seam)."""
    box: dict = {"patch": None}

    def train(cfg):
        run = box["run"] = loop.setup(cfg)
        if box["patch"] is not None:
            box["patch"](run)
        return loop.train(cfg, run=run)

    box["train"] = train
    return box


def _once(limit=1):
    calls = {"n": 0}

    def due():
        calls["n"] += 1
        return calls["n"] <= limit

    return due


def test_nan_logits_once_skip_one_update(tmp_path, captured):
    cfg = _cfg(tmp_path)
    forwards = {"n": 0}

    def patch(run):
        forward = run.model.forward

        def nan_forward(*args, **kwargs):
            out = forward(*args, **kwargs)
            forwards["n"] += 1
            if run.model.training and forwards.get("done") is None:  # the first update's first micro-batch
                forwards["done"] = True
                out.logits = out.logits * float("nan")  # still the model's graph, as a real NaN would be
            return out

        run.model.forward = nan_forward

    captured["patch"] = patch
    captured["train"](cfg)
    rows = _rows(cfg)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r.get("faults/skipped_updates") for r in rows[1:]] == [1.0, 0.0, 0.0]
    assert captured["run"].trainer.updates_done == STEPS - 1 and captured["run"].trainer.faults == 1


def test_inf_loss_skips_and_is_logged(tmp_path, captured, capsys):
    cfg = _cfg(tmp_path, "optim.minibatches_per_step=2")
    due = _once()

    def make_objective(algo, minibatch):
        objective = loop.make_objective(algo, minibatch)

        def inf_objective(logp, micro):
            loss, metrics = objective(logp, micro)
            return (loss * math.inf if due() else loss), metrics

        return inf_objective

    captured["patch"] = lambda run: setattr(run, "make_objective", make_objective)
    captured["train"](cfg)
    rows = _rows(cfg)
    assert [r.get("faults/skipped_updates") for r in rows[1:]] == [1.0, 0.0, 0.0]
    assert "optim/lr" in rows[1]  # the other update of step 1 ran
    assert captured["run"].trainer.updates_done == 2 * STEPS - 1
    assert "step 1: skipped an update" in capsys.readouterr().err


def test_nan_gradient_skips(tmp_path, captured):
    cfg = _cfg(tmp_path)
    due = _once()

    skips = []

    def patch(run):
        param = next(p for p in run.model.parameters() if p.requires_grad)
        param.register_hook(lambda g: g * float("nan") if due() else g)
        update = run.trainer.update

        def checked_update(*args, **kwargs):
            before = [p.detach().clone() for p in run.model.parameters()]
            out = update(*args, **kwargs)
            if out.fault is not None:  # no optimizer step, gradients zeroed
                skips.append(out)
                assert all(p.grad is None for p in run.model.parameters())
                assert all(torch.equal(a, p) for a, p in zip(before, run.model.parameters()))
            return out

        run.trainer.update = checked_update

    captured["patch"] = patch
    captured["train"](cfg)
    rows = _rows(cfg)
    assert [r.get("faults/skipped_updates") for r in rows[1:]] == [1.0, 0.0, 0.0]
    assert all(torch.isfinite(p).all() for p in captured["run"].model.parameters())
    assert len(skips) == 1 and "gradient norm (nan)" in skips[0].fault


def test_k_faults_in_a_row_stop_with_exit_code_3(tmp_path, capsys):
    """Rollouts whose engine log-probs are NaN (a dump, edited, served by ``--rollouts-from``): every
    update is skipped, and the second skip in a row stops the run."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    dump = tmp_path / "dump"
    assert main(["train", "configs/demo.yaml", *overrides, "optim.global_steps=3", f"run.output_dir={tmp_path}",
                 "run.name=d", "--dump-rollouts", str(dump)]) == 0
    for path in dump.glob("step_*.pt"):
        state = torch.load(path, weights_only=True)
        for completion in state["completions"]:
            completion["logp_rollout"] = torch.full_like(completion["logp_rollout"], math.nan)
        torch.save(state, path)
    capsys.readouterr()
    code = main(["train", "configs/demo.yaml", *overrides, "optim.global_steps=6", "optim.max_consecutive_faults=2",
                 f"run.output_dir={tmp_path}", "run.name=k", "--rollouts-from", str(dump)])
    err = capsys.readouterr().err
    assert code == 3
    stop = [line for line in err.splitlines() if line.startswith("minirl: stopped:")]
    assert len(stop) == 1 and "step 2" in stop[0] and "step_000001" in stop[0], err
    run = tmp_path / "k"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert sorted(os.listdir(run / "checkpoints")) == ["step_000001"]  # the last good one is kept
    assert not (run / "checkpoint").exists()


def test_checkpoint_contents_pruning_and_stale_tmp(tmp_path):
    cfg = _cfg(tmp_path, "checkpoint.keep_last=2")
    stale = cfg.run_dir / "checkpoints" / "step_000009.tmp-99999999"
    stale.mkdir(parents=True)
    loop.train(cfg)
    root = cfg.run_dir / "checkpoints"
    assert sorted(os.listdir(root)) == ["step_000002", "step_000003"]
    path, meta = checkpoint.find_latest(cfg.run_dir)
    assert path.name == "step_000003" and meta["step"] == 3 and meta["complete"] is True
    state = torch.load(path / checkpoint.STATE, weights_only=True)
    assert state["step"] == 3 and state["trainer"]["updates_done"] == 3
    assert state["metrics_bytes"] == (cfg.run_dir / "metrics.jsonl").stat().st_size
    assert set(state["rng"]) == {"torch", "numpy", "python"} and state["engine_rng"]
    # a checkpoint without its completeness marker is not used
    (path / checkpoint.META).unlink()
    assert checkpoint.find_latest(cfg.run_dir)[0].name == "step_000002"


def test_resume_refuses_a_different_algorithm_config_and_says_when_there_is_none(tmp_path, capsys):
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=2", f"run.output_dir={tmp_path}", "run.name=c"]
    assert main([*base, "--resume"]) == 0
    assert "no valid checkpoint" in capsys.readouterr().err
    assert main([*base, "optim.lr=0.5", "--resume"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("minirl: error")]
    assert len(lines) == 1 and "optim.lr" in lines[0] and "0.5" in lines[0]
    assert main([*base, "optim.global_steps=3", "run.resume=auto"]) == 0  # more steps: allowed
    # a sweep starts a run over with run.overwrite=true and resumes it without: allowed
    assert main([*base, "optim.global_steps=4", "run.resume=auto", "run.overwrite=true"]) == 0
    assert main([*base, "optim.global_steps=5", "run.resume=auto", "run.overwrite=false"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]


def test_starting_over_removes_the_earlier_runs_model_and_a_start_records_its_weights(tmp_path, capsys):
    """run.overwrite=true: the earlier run's final checkpoint/ goes with its metrics, even when the new run stops before
    writing its own (a reward that raises at the first evaluation); environment.jsonl names --start-from."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=1", f"run.output_dir={tmp_path}", "run.name=o"]
    assert main(base) == 0 and (tmp_path / "o" / "checkpoint" / "model.safetensors").is_file()
    start = json.loads((tmp_path / "o" / "environment.jsonl").read_text().splitlines()[-1])
    assert start["start_from"] is None
    (tmp_path / "boom.py").write_text("def boom(prompt, completion, answer, **kwargs):\n    raise ValueError('no')\n")
    failing = [f"task.reward_function={tmp_path / 'boom.py'}:boom", "run.overwrite=true"]
    # starting over from the run's own final model would remove the weights it starts from: refused, in one line
    assert main([*base, *failing, "--start-from", str(tmp_path / "o" / "checkpoint")]) == 2
    assert "is this run's own checkpoint/, which starting over removes" in capsys.readouterr().err
    shutil.copytree(tmp_path / "o" / "checkpoint", tmp_path / "kept")
    assert main([*base, *failing, "--start-from", str(tmp_path / "kept")]) == 2
    err = capsys.readouterr().err
    assert "boom raised ValueError" in err and f"run.overwrite: {tmp_path / 'o'} held an earlier run; starting over" in err
    assert not (tmp_path / "o" / "checkpoint").exists()
    start = json.loads((tmp_path / "o" / "environment.jsonl").read_text().splitlines()[-1])
    assert start["start_from"] == str(tmp_path / "kept")


def test_config_error_type():
    with pytest.raises(ConfigError):
        checkpoint.check_config(checkpoint.Path("x"), {"optim": {"lr": 1.0}}, load_config(None))


def test_nan_in_diagnostics_is_reported_and_the_update_skipped(tmp_path, captured, capsys):
    cfg = _cfg(tmp_path, "diagnostics.every_steps=1", "optim.global_steps=2")
    def patch(run):
        forward = run.model.forward

        def nan_forward(*args, **kwargs):
            out = forward(*args, **kwargs)
            # step 1's diagnostics gradient pass and its update (every micro-batch), until that update is skipped
            if run.model.training and run.trainer.updates_done == 0 and run.trainer.faults == 0:
                out.logits = out.logits * float("nan")  # still the model's graph, as a real NaN would be
            return out

        run.model.forward = nan_forward

    captured["patch"] = patch
    captured["train"](cfg)
    rows = _rows(cfg)
    assert [r.get("faults/skipped_updates") for r in rows[1:]] == [1.0, 0.0]
    assert not any(k.startswith("fidelity/") for k in rows[1]) and "fidelity/first_grad_cosine" in rows[2]
    err = capsys.readouterr().err
    assert "step 1: diagnostics not computed" in err and "step 1: skipped an update" in err


def test_a_fresh_start_never_silently_replaces_an_earlier_run(tmp_path):
    from minirl.config import ConfigError, load_config
    from minirl.loop import check_fresh_start

    cfg = load_config(None, [f"run.output_dir={tmp_path}", "run.name=r"])
    assert check_fresh_start(cfg) is False  # an empty directory is fine
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    with pytest.raises(ConfigError, match=r"already holds a run; continue it with --resume"):
        check_fresh_start(cfg)
    assert check_fresh_start(load_config(None, [f"run.output_dir={tmp_path}", "run.name=r", "run.overwrite=true"]))
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "train/re')  # killed in step 1's row
    assert check_fresh_start(cfg) is False  # a run that ended before its first global step: nothing to lose


def test_a_run_directory_in_use_refuses_a_second_process(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    with loop.hold_run_dir(cfg.run_dir):  # this process holds it, as a running training would
        code = main(["train", "configs/demo.yaml", *[o for o in TINY if not o.startswith("optim.global_steps=")],
                     f"optim.global_steps={STEPS}", f"run.output_dir={tmp_path}", "run.name=f"])
        assert code != 0
        err = capsys.readouterr().err
        assert f"is in use by another minirl process (pid {os.getpid()})" in err and "Traceback" not in err
        assert not (cfg.run_dir / "metrics.jsonl").exists()
    loop.train(cfg)  # released: the run goes
    assert len(_rows(cfg)) == STEPS + 1


@pytest.mark.parametrize("objective", ["minirl", "grpo"])
def test_a_checkpoint_from_before_new_keys_resumes_with_their_defaults(objective: str) -> None:
    cfg = load_config(None, [f"algo.name={objective}"])
    saved = cfg.model_dump(mode="json")
    for section, key in (("task", "reward_functions"), ("task", "chat_template"), ("log", "plain"), ("eval", "accuracy_threshold")):
        del saved[section][key]  # written by a minirl that had no such key
    del saved["cluster"]
    checkpoint.check_config(checkpoint.Path("x"), saved, cfg)  # no difference: they ran with the defaults
    with pytest.raises(ConfigError, match=r"task.chat_template \(checkpoint 'auto', now 'plain'\)"):
        checkpoint.check_config(checkpoint.Path("x"), saved, load_config(None, [f"algo.name={objective}", "task.chat_template=plain"]))


def test_a_checkpoint_from_before_the_optim_renames_resumes() -> None:
    """A run checkpointed by a minirl that wrote optim.steps / optim.warmup_steps resumes under the new names
    (it failed: "differs in optim.steps (checkpoint 128, now None) ..."), and a real difference is still caught."""
    cfg = load_config(None, ["optim.global_steps=128", "optim.warmup_updates=10"])
    saved = cfg.model_dump(mode="json")
    saved["optim"]["steps"], saved["optim"]["warmup_steps"] = saved["optim"].pop("global_steps"), saved["optim"].pop("warmup_updates")
    checkpoint.check_config(checkpoint.Path("x"), saved, cfg)
    with pytest.raises(ConfigError, match=r"optim.warmup_updates \(checkpoint 10, now 0\)"):
        checkpoint.check_config(checkpoint.Path("x"), saved, load_config(None, ["optim.global_steps=128"]))
