#!/bin/bash
# Reference runs for "the refactor changes no number" (issue 22): the demo, R2 and R3 off-policy runs
# from the demo config (diagnostics on), CISPO/GSPO/GRPO, and the n4 R2/R3 grid arms, shortened.
#   scripts/refactor_reference_runs.sh SRC OUT STEPS_KEY WARMUP_KEY
#     SRC: a source checkout (e.g. `git archive 580c561 | tar -x -C /tmp/before`), OUT: run directory root,
#     STEPS_KEY / WARMUP_KEY: optim.steps / optim.warmup_steps before the rename, optim.global_steps /
#     optim.warmup_updates after.
# Then: python scripts/compare_metrics.py BEFORE/demo AFTER/demo BEFORE/r2 AFTER/r2 ...
set -u
SRC=$1; OUT=$2; SK=$3; WK=$4
export PYTHONPATH=$SRC/src ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PY=${PY:-python}
mkdir -p "$OUT"; cd "$SRC"
C="run.output_dir=$OUT run.threads=1 run.overwrite=true"
D="$C cold_start.cache_dir=$OUT/sftcache eval.every_steps=3 checkpoint.every_steps=3 diagnostics.every_steps=2"
run() { name=$1; shift; $PY -m minirl.cli train "$@" run.name=$name > "$OUT/$name.log" 2>&1; echo "$name $?" >> "$OUT/status"; }
run demo configs/demo.yaml $C
run r2 configs/demo.yaml $D moe.routing_replay=R2 optim.minibatches_per_step=4 $SK=6
run r3 configs/demo.yaml $D moe.routing_replay=R3 optim.minibatches_per_step=4 $SK=6
for loss in cispo gspo grpo; do  # the demo config with only algo.name changed (grpo: + IS correction, R3)
  $PY - "$loss" "$OUT/demo_$loss.yaml" <<'PY'
import sys, yaml
d = yaml.safe_load(open("configs/demo.yaml")); name = sys.argv[1]
d["algo"] = {"name": name, **({"is_correction": True} if name == "grpo" else {})}
yaml.safe_dump(d, open(sys.argv[2], "w"), sort_keys=False)
PY
done
run cispo "$OUT/demo_cispo.yaml" $D optim.minibatches_per_step=2 $SK=4
run gspo "$OUT/demo_gspo.yaml" $D optim.minibatches_per_step=2 $SK=4
run grpo "$OUT/demo_grpo.yaml" $D moe.routing_replay=R3 optim.minibatches_per_step=2 $SK=4
for arm in r2 r3; do  # the grid arms (SFT cold start included), 5 global steps
  sed "s/^  \(global_\)\{0,1\}steps: 32$/  ${SK#optim.}: 5/; s/^  warmup_\(steps\|updates\): 10$/  ${WK#optim.}: 10/" \
    "$SRC/experiments/n4/minirl_$arm.yaml" > "$OUT/n4_$arm.yaml"  # the arm file's key names before or after the rename
  run n4_$arm "$OUT/n4_$arm.yaml" $C eval.every_steps=3 checkpoint.every_steps=3
done
