#!/usr/bin/env bash
# The teacher-format warm start against the shipped one, on the smoke task (coin, six rooms):
# for each seed and each value of sft.teacher_examples, the warm start (built if missing), its
# teacher-student gap on all 100 eval items (gold and sampled plays) and its greedy eval success.
# Writes docs/results/teacher/gap-s{SEED}-t{0,1}.json and eval-s{SEED}-t{0,1}.json; a file that
# exists is not measured again, so an interrupted run resumes.
set -euo pipefail
out=docs/results/teacher
mkdir -p "$out"
for seed in ${SEEDS:-42 1 2}; do
  for t in 0 1; do
    flag=$([ "$t" = 1 ] && echo true || echo false)
    sets=(--set "seed=$seed" --set "sft.teacher_examples=$flag")
    gap="$out/gap-s$seed-t$t.json"
    if [ ! -f "$gap" ]; then
      factor model teacher-gap "${sets[@]}" --plays 100 --json --out "$out/gap-s$seed-t$t.csv" \
        > "$gap.tmp" && tail -n 1 "$gap.tmp" > "$gap" && rm "$gap.tmp"
    fi
    ev="$out/eval-s$seed-t$t.json"
    if [ ! -f "$ev" ]; then
      dir=$(python -c "from factor_cli.train.config import load_config; from factor_cli.train.sft import sft_output_dir; print(sft_output_dir(load_config('smoke', ['seed=$seed', 'sft.teacher_examples=$flag'])))")
      factor eval --checkpoint "$dir" "${sets[@]}" --json > "$ev.tmp" && tail -n 1 "$ev.tmp" > "$ev" && rm "$ev.tmp"
    fi
  done
done
