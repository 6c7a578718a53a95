"""``benchmarks/gpu_bench.py --tiny`` runs end to end on CPU: every part (engine graphs off / on vs HF generate, R3
recording, bf16 trainer MFU, one RL global step, the trace arm) writes its figures to ``--out``.
No figure is asserted (timings belong in BENCHMARKS.md); only that each part ran and is sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_bench  # noqa: E402


def test_active_parameters_of_the_issue_model_by_hand():
    config = gpu_bench.model_config(tiny=False)
    attention = 1024 * 64 * (16 + 2 * 4) + 16 * 64 * 1024  # q, k, v and o projections
    experts = 4 * 3 * 1024 * 512 + 1024 * 32  # top-4 SwiGLU experts + the router
    assert gpu_bench.active_parameters(config) == 16 * (attention + experts) + 1024 * 32000  # ~0.44 B active


@pytest.mark.slow  # ~1.5 min on 2 busy cores
def test_gpu_bench_tiny_runs_every_part_on_cpu(tmp_path):
    parts = ",".join(gpu_bench.PARTS + gpu_bench.OPTIONAL_PARTS)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_bench.py"), "--tiny", "--device", "cpu", "--out", str(tmp_path),
                           "--parts", parts], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "gpu_bench.json").read_text())
    for shape in ("4x8", "8x4"):
        row = results["engine"][shape]
        for arm in ("graphs_off", "graphs_on", "graphs_on_r3", "hf"):
            assert row[f"{arm}_tok_s"] > 0, arm
    agreement = results["engine"]["agreement"]  # on the CPU the bucketed path runs eagerly
    assert agreement["ok"] and agreement["routes_equal_frac"] == 1.0 and agreement["rows"] == 8
    assert results["trainer"]["tokens_per_update"] == 128 and 0 < results["trainer"]["mfu"] < 1
    free = results["trainer"]["padding_free"]
    assert free["padding_free_update_s"] > 0 and free["max_logp_gap"] <= 1e-2 and 0.5 < free["real_frac"] < 0.8
    shared = results["trainer"]["shared_prompt"]
    assert shared["shared_prompt_tokens"] == shared["padding_free_tokens"] - 2 * 16  # 2 groups of 2 rows: 16-token prompts
    assert shared["shared_prompt_update_s"] > 0 and shared["max_logp_gap"] <= 1e-2
    head = results["trainer"]["chunked_head"]
    assert head["chunked_update_s"] > 0 and head["max_logp_gap"] <= 1e-2 and head["whole_peak_gib"] is None  # no CUDA
    assert "padding-free update" in done.stdout and "shared prompts (G = 2" in done.stdout
    assert results["lean"]["max_logp_gap"] == 0.0 and results["lean"]["lean_s"] > 0  # bitwise on the CPU
    assert results["rl_step"]["global_step_s"] > 0 and results["rl_step"]["rows"] == 8
    assert results["trace"]["wall_s"] > 0
    assert "trace arm" in done.stdout and "one RL global step" in done.stdout
    offload = results["offload"]  # the same step on one FSDP rank with CPUOffloadPolicy
    assert offload["global_step_s"] > 0 and offload["rank"]["offload"] == ["CPUOffloadPolicy"]
    assert "the RL step with optim.cpu_offload" in done.stdout
