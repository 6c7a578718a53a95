#!/usr/bin/env bash
# Creates .venv and installs minirl with its test extras. Idempotent: re-runs only when
# pyproject.toml changed. torch is pinned to the CPU wheel here (not in the package metadata),
# so a GPU user can `pip install minirl` over their own CUDA torch instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_PIN=${MINIRL_TORCH:-torch==2.13.0}
stamp=.venv/.minirl-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH_PIN" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,tensorboard]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import torch, transformers, minirl" 
echo "$want" > "$stamp"
