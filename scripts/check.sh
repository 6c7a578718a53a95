#!/usr/bin/env bash
# Static checks: ruff (rules in pyproject.toml [tool.ruff]) over src/tests/benchmarks and mypy
# ([tool.mypy]) over src. Exits non-zero on any finding; the last line is a one-line summary.
# Usage: scripts/check.sh            (uses .venv/bin/ruff and .venv/bin/mypy when present)
set -uo pipefail
cd "$(dirname "$0")/.."
RUFF=${RUFF:-$( [ -x .venv/bin/ruff ] && echo .venv/bin/ruff || echo ruff )}
MYPY=${MYPY:-$( [ -x .venv/bin/mypy ] && echo .venv/bin/mypy || echo mypy )}

ruff_out=$("$RUFF" check --output-format concise src tests benchmarks 2>&1); ruff_rc=$?
echo "$ruff_out"
mypy_out=$("$MYPY" 2>&1); mypy_rc=$?
echo "$mypy_out"

ruff_n=$(grep -cE '^[^ ]+:[0-9]+:[0-9]+: ' <<<"$ruff_out")
mypy_n=$(grep -cE '^[^ ]+:[0-9]+: error:' <<<"$mypy_out")
if [ "$ruff_rc" -eq 0 ] && [ "$mypy_rc" -eq 0 ]; then
  echo "check: OK (ruff 0 findings, mypy 0 errors)"
  exit 0
fi
echo "check: FAILED (ruff ${ruff_n} findings, exit ${ruff_rc}; mypy ${mypy_n} errors, exit ${mypy_rc})"
exit 1
