"""``rollout.filter_groups`` end to end: when every group already has a reward spread, DAPO's dynamic sampling
changes nothing (one round, the same prompts, seeds and updates: the same metrics, bit for bit)."""

from __future__ import annotations

import json

from minirl.cli import main
from tests.resume.test_exact_resume import TINY


def _rows(path):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/", "filter/"))}
            for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_with_every_group_spread_dynamic_sampling_is_the_plain_run(tmp_path):
    overrides = [o for o in TINY if not o.startswith("optim.global_steps=")]
    base = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=3", f"run.output_dir={tmp_path}"]
    assert main([*base, "run.name=plain"]) == 0
    assert main([*base, "run.name=filtered", "rollout.filter_groups=true"]) == 0
    plain, filtered = _rows(tmp_path / "plain"), _rows(tmp_path / "filtered")
    assert all(row["train/uniform_reward_groups_frac"] == 0.0 for row in plain[1:])  # the shaped reward spreads
    assert plain == filtered
    rows = [json.loads(line) for line in (tmp_path / "filtered" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["filter/rounds"], r["filter/kept_groups_frac"], r["filter/topped_up_groups"]) for r in rows[1:]] == [(1.0, 1.0, 0.0)] * 3
    assert rows[1]["filter/reward_mean_generated"] == rows[1]["train/reward_mean"]
