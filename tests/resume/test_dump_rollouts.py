"""``--dump-rollouts DIR`` / ``--rollouts-from DIR``: a run trained on its own dump (no sampling, no
verifier) reproduces its metrics bit for bit, routes included (R3 replays the dumped engine routes)."""

from __future__ import annotations

import json

import pytest
import torch

from minirl.cli import main
from tests.resume.test_exact_resume import TINY

IGNORED = ("time/", "perf/")


def _rows(path):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(IGNORED)}
            for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["R3", "none"])
def test_a_run_from_its_own_dump_reproduces_its_metrics(tmp_path, mode):
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=3", "optim.minibatches_per_step=2",
            f"moe.routing_replay={mode}", f"run.output_dir={tmp_path}"]
    dump = tmp_path / "dump"
    assert main([*base, "run.name=a", "--dump-rollouts", str(dump)]) == 0
    files = sorted(p.name for p in dump.iterdir())
    assert files == ["step_000001.pt", "step_000002.pt", "step_000003.pt"]
    state = torch.load(dump / files[0], weights_only=True)
    assert set(state) == {"step", "prompts", "completions", "rewards", "reward_stats", "reward_parts"}
    assert state["reward_parts"].shape == (len(state["completions"]), 1)  # one reward function: its values
    assert state["completions"][0]["routes"] is not None  # R3 and the routing/* metrics record the engine's routes
    assert main([*base, "run.name=b", "--rollouts-from", str(dump)]) == 0
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert len(a) == 4 and a == b


def test_dynamic_sampling_dumps_and_replays_every_round(tmp_path):
    """``rollout.filter_groups``: each round of a step is its own file, and a replay reads them in order. With
    correctness as the metric the untrained model's groups are all wrong: every step runs both rounds and is
    topped up, and the data order moves by two rounds of prompts."""
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=2", "rollout.filter_groups=true",
            "rollout.filter_groups_metric=accuracy", "rollout.filter_groups_max_rounds=2", f"run.output_dir={tmp_path}"]
    dump = tmp_path / "dump"
    assert main([*base, "run.name=a", "--dump-rollouts", str(dump)]) == 0
    assert sorted(p.name for p in dump.iterdir()) == ["step_000001.pt", "step_000001_round1.pt", "step_000002.pt",
                                                       "step_000002_round1.pt"]
    first, second = (torch.load(dump / name, weights_only=True) for name in ("step_000001.pt", "step_000001_round1.pt"))
    assert len(set(first["prompts"]) | set(second["prompts"])) == 4  # two rounds, two new prompts each
    assert main([*base, "run.name=b", "--rollouts-from", str(dump)]) == 0
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert len(a) == 3 and a == b
    assert [(r["filter/rounds"], r["filter/topped_up_groups"], r["train/all_wrong_groups_frac"]) for r in a[1:]] \
        == [(2.0, 2.0, 1.0)] * 2


def test_rollouts_from_a_missing_step_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    code = main(["train", "configs/demo.yaml", *overrides, "optim.global_steps=1", f"run.output_dir={tmp_path}",
                 "run.name=c", "--rollouts-from", str(tmp_path / "empty")])
    err = capsys.readouterr().err
    assert code == 2 and "step_000001.pt not found (the dump has no step 1)" in err and "Traceback" not in err


GDPO = ['task.reward_functions=[{function: "tests.resume.shaped_reward:score"}, '
        '{function: "tests.unit.trl_style_rewards:length_reward", weight: 0.5}]']


def test_gdpo_trains_from_each_reward_function_and_replays_from_its_dump(tmp_path, capsys):
    """``algo.multi_objective_aggregation: normalize_then_sum`` with two reward functions: the same rewards as
    their sum, another first loss; each function's values are dumped, so a replay reproduces the run; a dump
    without them (written before they were kept) is one line."""
    overrides = [o for o in TINY if not o.startswith(("optim.global_steps=", "task.reward_function="))]
    base = ["train", "configs/demo.yaml", *overrides, *GDPO, "optim.global_steps=2", f"run.output_dir={tmp_path}"]
    gdpo = [*base, "algo.multi_objective_aggregation=normalize_then_sum"]
    dump = tmp_path / "dump"
    assert main([*base, "run.name=sum"]) == 0
    assert main([*gdpo, "run.name=a", "--dump-rollouts", str(dump)]) == 0
    summed, a = _rows(tmp_path / "sum"), _rows(tmp_path / "a")
    assert summed[1]["train/reward_mean"] == a[1]["train/reward_mean"] and a[1]["reward/length_reward/mean"] > 0
    assert a[1]["policy/loss"] != summed[1]["policy/loss"]
    state = torch.load(dump / "step_000001.pt", weights_only=True)
    assert state["reward_parts"].shape == (len(state["completions"]), 2)
    assert main([*gdpo, "run.name=b", "--rollouts-from", str(dump)]) == 0
    assert _rows(tmp_path / "b") == a
    del state["reward_parts"]
    torch.save(state, dump / "step_000001.pt")
    capsys.readouterr()
    assert main([*gdpo, "run.name=c", "--rollouts-from", str(dump)]) == 2
    err = capsys.readouterr().err
    assert "algo.multi_objective_aggregation=normalize_then_sum needs each reward function's values" in err
    assert "Traceback" not in err
