#!/usr/bin/env bash
# The teacher-format warm start against the shipped one, on the smoke task (coin, six rooms). For
# each seed and variant, the warm start (built if missing), its teacher-student gap on all 100 eval
# items (gold and sampled plays: `factor model teacher-gap`) and its greedy eval success:
#   t0: the shipped warm start (student prompts, 2 epochs);
#   t1: sft.teacher_examples=true (each gold step also in the teacher's format; twice the
#       examples, so twice the optimizer steps);
#   e4: the shipped warm start with sft.epochs=4, the control for t1's extra optimizer steps;
#   h: t1 plus 60 hindsight walks (sft.hindsight_walks: teacher examples of random admissible
#      plays, so the teacher learns to name any action from its feedback), set once, not tuned;
#   h4: t1 plus 240 hindsight walks (h's lever, four times as much: measured after h's gain with
#       true feedback stayed small, +0.075 nats per action on seed 42).
# Writes docs/results/teacher/{gap,eval}-s{SEED}-{VARIANT}.json (and the gap's per-action CSV); a
# file that exists is not measured again, so an interrupted run resumes.
# Usage: SEEDS="42 1 2" VARIANTS="t0 t1 e4 h" bash experiments/teacher_warm_start.sh
set -euo pipefail
out=docs/results/teacher
mkdir -p "$out"
overrides() {
  case "$1" in
    t0) echo "sft.teacher_examples=false" ;;
    t1) echo "sft.teacher_examples=true" ;;
    e4) echo "sft.teacher_examples=false sft.epochs=4" ;;
    h) echo "sft.teacher_examples=true sft.hindsight_walks=60" ;;
    h4) echo "sft.teacher_examples=true sft.hindsight_walks=240" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}
for seed in ${SEEDS:-42 1 2}; do
  for v in ${VARIANTS:-t0 t1 e4 h}; do
    read -r -a kv <<< "seed=$seed $(overrides "$v")"
    sets=(); for x in "${kv[@]}"; do sets+=(--set "$x"); done
    gap="$out/gap-s$seed-$v.json"
    if [ ! -f "$gap" ]; then
      factor model teacher-gap "${sets[@]}" --plays 100 --json --out "$out/gap-s$seed-$v.csv" \
        > "$gap.tmp" && tail -n 1 "$gap.tmp" > "$gap" && rm "$gap.tmp"
    fi
    ev="$out/eval-s$seed-$v.json"
    if [ ! -f "$ev" ]; then
      dir=$(python - "${kv[@]}" <<'PY'
import sys
from factor_cli.train.config import load_config
from factor_cli.train.sft import sft_output_dir
print(sft_output_dir(load_config("smoke", sys.argv[1:])))
PY
)
      factor eval --checkpoint "$dir" "${sets[@]}" --json > "$ev.tmp" && tail -n 1 "$ev.tmp" > "$ev" && rm "$ev.tmp"
    fi
  done
done
