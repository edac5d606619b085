#!/usr/bin/env bash
# The measurement's noise floor beside the held-out validation: one machine profile (HumanEval/0-9 or
# lee_background-000..009), then the same configurations run REPEATS times round-robin on other prompts
# (HumanEval/10-17, lee_background-010..017: 8 per run, 96 new tokens), into $OUT/H/D/, and
# `python -m analysis.validate PROFILE RUNS --repeats` (repeats.txt): each run's held-out error, and per
# configuration the spread of its identical runs and the smallest largest |error| that any one prediction
# per configuration could reach on them (the floor the machine's own variation sets).
# Defaults: HIERARCHIES=smollm2_int8_fp32 DATASETS=humaneval REPEATS=4, configurations greedy, sd window 4,
# pipespec lookahead 0 max_lead 8 (CONFIGS="strategy=greedy;strategy=sd strategy.lookahead=4" to change).
# Timing: run it alone on a quiet machine. 40 minutes with the defaults on 2026-12-02 (a 2-core AMD EPYC with
# AVX2: the profile 520 s, each run 2-3.5 minutes).
# shellcheck source=validation_common.sh
HIERARCHIES=${HIERARCHIES:-smollm2_int8_fp32}
DATASETS=${DATASETS:-humaneval}
OUT=${OUT:-results/validation_repeat}
source "$(dirname "$0")/validation_common.sh"
REPEATS=${REPEATS:-4}
IFS=';' read -r -a CONFIG_LIST <<< "${CONFIGS:-strategy=greedy;strategy=sd strategy.lookahead=4;strategy=pipespec strategy.lookahead=0 strategy.max_lead=8}"

started=$(date +%s)
for h in $HIERARCHIES; do
  for d in $DATASETS; do
    dir="$OUT/$h/$d"
    profile_once "$h" "$d" "$dir"
    for ((r = 1; r <= REPEATS; r++)); do
      for config in "${CONFIG_LIST[@]}"; do
        held_out_run "$h" "$d" "$config" "$dir/runs/$(run_name "$config")/r$r"
      done
    done
    "$PY" -m analysis.validate "$dir/profile/profile.json" "$dir/runs" --repeats > "$dir/repeats.txt"
    "$PY" -m analysis.validate "$dir/profile/profile.json" "$dir/runs" --json > "$dir/validation.json"
    echo "== $h $d" && cat "$dir/repeats.txt"
  done
done
echo "repeatability: $OUT ($(( ($(date +%s) - started) / 60 )) min)"
