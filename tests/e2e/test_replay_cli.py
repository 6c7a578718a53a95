"""End to end: ``minirl train`` with routing replay writes the ``routing/*`` metrics every step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TINY = [
    "model.preset=qwen3-moe-tiny", "task.kind=reverse", "task.difficulty=3", "task.num_train_prompts=16",
    "task.num_eval_prompts=2", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=8",
    "optim.global_steps=2", "optim.minibatches_per_step=2", "optim.micro_batch_sequences=4", "eval.num_prompts=1",
    "eval.samples_per_prompt=1", "eval.every_steps=0", "cold_start.enabled=false", "rollout.precision=bf16",
    "run.threads=1", "log.console=false",
]


@pytest.mark.parametrize("replay", ["R2", "R3"])
def test_routing_metrics_in_metrics_jsonl(tmp_path, replay):
    proc = subprocess.run(
        [sys.executable, "-m", "minirl.cli", "train", "configs/demo.yaml", *TINY, f"moe.routing_replay={replay}",
         f"run.output_dir={tmp_path}", "run.name=r"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert not any(key.startswith("routing/") for key in rows[0])  # the evaluation row
    expected = {"routing/train_infer_diff_frac", "routing/train_infer_diff_any_layer_frac",
                "routing/train_infer_diff_frac_layer0", "routing/train_infer_diff_frac_layer1"}
    if replay == "R2":
        expected |= {"routing/r2_drift_mb0", "routing/r2_drift_mb1", "routing/r2_drift_last"}
    for row in rows[1:]:
        routing = {key for key in row if key.startswith("routing/")}
        assert routing == expected, routing ^ expected
        assert all(0.0 <= row[key] <= 1.0 for key in routing)
        assert row["mismatch/abs_dlogp_mean"] > 0  # bf16 engine vs fp32 trainer
    if replay == "R2":
        assert all(row["routing/r2_drift_mb0"] == 0.0 for row in rows[1:])


@pytest.mark.parametrize("preset", ["gpt-oss-tiny", "qwen3.5-moe-tiny"])
def test_the_newer_families_train_with_r3_and_an_exact_engine(tmp_path, preset):
    """GPT-OSS (sinks, a sliding layer, the engine's lean step) and Qwen3.5-MoE (Gated DeltaNet beside gated attention:
    the engine carries each row's linear-attention states) through the CLI: an fp32 engine agrees with the trainer."""
    settings = [setting for setting in TINY if not setting.startswith(("model.preset=", "rollout.precision="))]
    proc = subprocess.run(
        [sys.executable, "-m", "minirl.cli", "train", "configs/demo.yaml", *settings, f"model.preset={preset}",
         "rollout.precision=fp32", "rollout.kv_cache_precision=same", "moe.routing_replay=R3",
         f"run.output_dir={tmp_path}", "run.name=r"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        assert row["mismatch/abs_dlogp_max"] < 1e-4, row["mismatch/abs_dlogp_max"]
        assert row["routing/train_infer_diff_frac"] == 0.0
