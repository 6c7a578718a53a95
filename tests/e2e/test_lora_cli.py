"""LoRA through the CLI: a run with adapters, gradient checkpointing, a bf16 trainer and the KL
penalty resumes exactly from its checkpoint (the base is rebuilt, the adapter loaded), and its final
checkpoint (merged weights) is a plain HF model that ``--start-from`` and ``AutoModelForCausalLM`` load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.resume.test_exact_resume import TINY

ROOT = Path(__file__).resolve().parents[2]
LORA = ["model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj, o_proj]}", "optim.gradient_checkpointing=true",
        "optim.precision=bf16", "algo.kl_coef=0.1", "moe.routing_replay=R3", "optim.minibatches_per_step=2",
        "eval.every_steps=0"]


def _train(tmp_path: Path, name: str, *more: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "minirl.cli", "train", "configs/demo.yaml", *TINY, *LORA,
               f"run.output_dir={tmp_path}", f"run.name={name}", *more]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def test_lora_run_resumes_exactly_and_its_checkpoint_is_a_plain_hf_model(tmp_path):
    whole = _train(tmp_path, "whole", "optim.global_steps=3")
    assert whole.returncode == 0, whole.stderr[-2000:]
    first = _train(tmp_path, "parts", "optim.global_steps=2")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = _train(tmp_path, "parts", "optim.global_steps=3", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = load_file(tmp_path / "whole/checkpoint/model.safetensors"), load_file(tmp_path / "parts/checkpoint/model.safetensors")
    assert set(a) == set(b) and not any("lora" in key for key in a)  # merged, base key names
    assert all(torch.equal(a[key], b[key]) for key in a)  # bit for bit, across the resume
    adapter = load_file(tmp_path / "whole/checkpoint/adapter/adapter_model.safetensors")
    assert adapter and all("lora_" in key for key in adapter)
    assert any(float(t.abs().max()) > 0 for key, t in adapter.items() if "lora_B" in key)  # the adapter trained
    AutoModelForCausalLM.from_pretrained(tmp_path / "whole/checkpoint")
    plain = subprocess.run([sys.executable, "-m", "minirl.cli", "train", "configs/demo.yaml", *TINY, "optim.global_steps=1",
                            f"run.output_dir={tmp_path}", "run.name=plain", "eval.every_steps=0"] +
                           ["--start-from", str(tmp_path / "whole/checkpoint")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-2000:]
