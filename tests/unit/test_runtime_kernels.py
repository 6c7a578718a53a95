"""Resuming on other CPU kernels (AVX2 vs AVX512 round differently) is said in one line."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from minirl.runtime import kernel_change


def _env(run_dir: Path, *lines: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "environment.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_resume_on_other_kernels_is_named_and_the_same_kernels_are_not(tmp_path: Path) -> None:
    now = torch.backends.cpu.get_cpu_capability()
    other = "AVX512" if now != "AVX512" else "AVX2"
    assert kernel_change(tmp_path / "none") is None  # nothing recorded yet
    _env(tmp_path / "same", {"cpu_capability": other, "cuda": None}, {"cpu_capability": now, "cuda": None})
    assert kernel_change(tmp_path / "same") is None  # the last start is what counts
    _env(tmp_path / "moved", {"cpu_capability": now, "cuda": None}, {"cpu_capability": other, "cuda": None})
    line = kernel_change(tmp_path / "moved")
    assert line == (f"warning: {tmp_path / 'moved'} ran on {other} CPU kernels, this process uses {now}: the floats "
                    f"from here on differ from an uninterrupted run (set ATEN_CPU_CAPABILITY={other.lower()} to match)")
    _env(tmp_path / "gpu", {"cpu_capability": other, "cuda": "NVIDIA H200"})
    assert kernel_change(tmp_path / "gpu") is None  # a GPU run's floats do not come from these kernels
