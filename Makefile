# The two commands of the README. Both set up .venv first (scripts/setup.sh, idempotent).
.PHONY: setup demo lint test test-slow

setup:
	@bash scripts/setup.sh

# ATen's SIMD kernels (AVX2 vs AVX512) round differently, enough to change the cold start; the figures
# in README/BENCHMARKS were made with AVX2, so the demo pins it (override: make demo ATEN_CPU_CAPABILITY=default).
ATEN_CPU_CAPABILITY ?= avx2
demo: setup
	ATEN_CPU_CAPABILITY=$(ATEN_CPU_CAPABILITY) .venv/bin/minirl train configs/demo.yaml

# ruff + mypy with the rules of pyproject.toml; `make test` (what CI runs) runs them before the suite
lint: setup
	bash scripts/check.sh

test: setup
	bash scripts/check.sh
	.venv/bin/python -m pytest

test-slow: setup
	.venv/bin/python -m pytest -m slow
