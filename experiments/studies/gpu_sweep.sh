#!/usr/bin/env bash
# One prepared command for the device tool (`run` with carry [".whl"], timeout_s 600): as many runs of a
# pre-registered study as fit in BUDGET_S seconds (default 540) on one GPU, several at once.
#
#   bash experiments/studies/gpu_sweep.sh STUDY [SEEDS] [JOBS]      e.g. study1_replay 6 12
#
# Needs the wheels of ../shared/gpu-recipe.md in .whl/ (BENCHMARKS.md, "GPU figures of issue 20").
# Runs go to runs/gpu/STUDY, an ignored folder the device machine keeps between calls while it is warm:
# calling this again resumes unfinished runs from their last checkpoint and skips finished ones. Every
# run's config.yaml, metrics.jsonl, environment.jsonl and sweep.log (not checkpoints) are copied to
# $OUT/STUDY/<arm>/seed<s>/; commit them under results/studies/<study>_gpu/ (PREREGISTRATION.md, "GPU
# runs": analysed separately, never pooled with the CPU runs). The cold start is the study's committed
# one (results/studies/<study>/_sft_cache), so GPU and CPU arms start from the same file.
# A CPU smoke test of this script: QUICK=1 DEVICE=cpu OUT=/tmp/o bash experiments/studies/gpu_sweep.sh study1_replay 1 2
set -uo pipefail
STUDY=${1:?study directory under experiments/studies, e.g. study1_replay}
SEEDS=${2:-6}
JOBS=${3:-12}
cd "$(dirname "$0")/../.."
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$PWD/.site" .whl/*.whl || exit 1
  export PYTHONPATH=$PWD/.site:$PWD/src
fi
export PYTHONUNBUFFERED=1
RUNS=${RUNS_ROOT:-runs/gpu}/$STUDY
OUT=${OUT:-out}
mkdir -p "$RUNS" "$OUT/$STUDY"
committed=results/studies/${STUDY%%_*}/_sft_cache
if [ -d "$committed" ] && [ ! -d "$RUNS/_sft_cache" ]; then cp -r "$committed" "$RUNS/_sft_cache"; fi
timeout "${BUDGET_S:-540}" python3 -c "import sys; from minirl.cli import main; sys.exit(main())" \
  sweep "experiments/studies/$STUDY" --seeds "$SEEDS" --jobs "$JOBS" --device "${DEVICE:-cuda}" --runs-dir "$RUNS" ${QUICK:+--quick} \
  2>&1 | tee "$OUT/$STUDY/sweep.log" | grep -v "^  "
status=${PIPESTATUS[0]}
for run in "$RUNS"/*/seed*/; do
  dest=$OUT/$STUDY/$(basename "$(dirname "$run")")/$(basename "$run")
  mkdir -p "$dest"
  for f in config.yaml metrics.jsonl environment.jsonl sweep.log; do [ -f "$run$f" ] && cp "$run$f" "$dest/"; done
done
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv > "$OUT/$STUDY/gpu.csv"
echo "gpu_sweep: exit $status (124: the time budget ran out; call again to resume)"
exit "$status"
