#!/usr/bin/env bash
# Creates .venv and installs minirl with its test extras. Idempotent: re-runs only when
# pyproject.toml or this script changed. torch is pinned to the CPU wheel here (not in the package
# metadata), so a GPU user can `pip install minirl` over their own CUDA torch instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_PIN=${MINIRL_TORCH:-torch==2.13.0}
stamp=.venv/.minirl-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
echo "setting up .venv ($TORCH_PIN, minirl and its test extras); log in .venv/setup.log" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
log=.venv/setup.log
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@" >>"$log" 2>&1 || { cat "$log" >&2; exit 1; }; }
pip install --upgrade pip
pip install "$TORCH_PIN"
# transformers pinned for the test environment (the package allows >=5.20,<6): 5.25.0 (2026-12-03)
# breaks HF's own NemotronH hybrid cache (DummyLayer.get_seq_length), and results are compared across machines
# datasets (JSON / Parquet / saved-directory task data) pinned next to it: 5.2.0; peft (model.lora, the LoRA tests): 0.21.2
# the static checks `make test` runs first (scripts/check.sh) pinned too, since a new ruff or mypy release adds
# findings: ruff 0.17.6, mypy 2.4.1, and pydantic 2.14.4, whose mypy plugin ([tool.mypy] plugins) types the configs
pip install -e ".[test,tensorboard]" "transformers==5.24.0" "datasets==5.2.0" "peft==0.21.2" \
  "ruff==0.17.6" "mypy==2.4.1" "pydantic==2.14.4"
.venv/bin/python -c "import torch, transformers, minirl"
echo "$want" > "$stamp"
