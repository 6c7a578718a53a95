"""A verl user's files on day one: a parquet in verl's layout and a ``compute_score`` file, unchanged, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import datasets

from tests.e2e.test_cli import TINY, _minirl

REWARD = '''\
import json, os


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(os.environ["VERL_CALLS"], "a") as log:
        log.write(json.dumps([data_source, ground_truth, extra_info["index"], type(solution_str).__name__]) + "\\n")
    return {"score": float(solution_str.strip().endswith(ground_truth)), "acc": 0.0}
'''


def test_verl_parquet_and_compute_score_train_unchanged(tmp_path: Path, monkeypatch) -> None:
    rows = [{"data_source": "letters", "prompt": [{"role": "user", "content": word}], "ability": "copy",
             "reward_model": {"style": "rule", "ground_truth": word[::-1]}, "extra_info": {"split": "train", "index": i}}
            for i, word in enumerate(["abc", "bca", "cab", "acb", "bac", "cba", "aab", "bba"])]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    (tmp_path / "reward.py").write_text(REWARD)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("VERL_CALLS", str(calls))
    overrides = [o for o in TINY if not o.startswith(("task.", "optim.global_steps"))]
    proc = _minirl("train", "configs/demo.yaml", *overrides, "task.kind=jsonl", f"task.path={tmp_path / 'train.parquet'}",
                   "task.eval_fraction=0.25", "task.chat_template=plain", f"task.reward_function={tmp_path / 'reward.py'}",
                   "cold_start.enabled=false", "optim.global_steps=2", f"run.output_dir={tmp_path}", "run.name=verl")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "verl" / "metrics.jsonl").read_text().splitlines()]
    assert "reward/compute_score/mean" in metrics[1] and "eval/accuracy" in metrics[0]
    assert metrics[1]["reward/compute_score/acc"] == 0.0  # the dict's other numbers, as verl's reward_extra_info
    logged = [json.loads(line) for line in calls.read_text().splitlines()]
    answers = {row["extra_info"]["index"]: row["reward_model"]["ground_truth"] for row in rows}
    assert len(logged) >= 2 * 2 * 4  # two steps of 2 prompts x 4 samples, plus the evaluations
    assert all(source == "letters" and truth == answers[index] and kind == "str" for source, truth, index, kind in logged)
