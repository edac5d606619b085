#!/usr/bin/env bash
# Held-out validation of the profile-based prediction, into results/validation/:
#  1. per hierarchy and dataset, a machine profile on the first 10 prompts (HumanEval/0-9, news_lee
#     lee_background-000..009): python -m experiments.profile;
#  2. runs on other prompts (HumanEval/10-17, lee_background-010..017: 8 per run, 96 new tokens) of
#     greedy, sd windows 2/4/6 and pipespec lookahead 0/1/2/4 x max_lead 4/8;
#  3. python -m analysis.validate PROFILE RUNS per hierarchy and dataset (text + JSON report).
# Subsets: HIERARCHIES="smollm2_int8_fp32" DATASETS="humaneval" bash scripts/validation_sweep.sh
# OUT=dir (default results/validation), PROFILE_OPTIONS="profile.max_fed=16 profile.continuation=96" (profile
# overrides: continuations as long as the runs'). A profile or run already there is kept: to profile again,
# remove the profiles (rm results/validation/*/*/profile/profile.json) and run this again.
# Duration (estimated, not run): greedy SmolLM2 is ~15 tokens/s here, so a run of 8 x 96 tokens takes about
# 50 s + ~10 s start; the full sweep is 3 x 2 x 12 = 72 runs (~70 min) plus 6 profiles (~2-3 min each):
# about 85 min. In 45 min about 35 runs fit after the profiles: e.g. one dataset (DATASETS=humaneval,
# 36 runs + 3 profiles is about 45 min) or two hierarchies on both datasets is too many (48 runs).
# shellcheck source=validation_common.sh
source "$(dirname "$0")/validation_common.sh"

CONFIGS=("strategy=greedy")
for w in 2 4 6; do CONFIGS+=("strategy=sd strategy.lookahead=$w"); done
for la in 0 1 2 4; do for lead in 4 8; do
  CONFIGS+=("strategy=pipespec strategy.lookahead=$la strategy.max_lead=$lead")
done; done

mkdir -p "$OUT"
started=$(date +%s)
for h in $HIERARCHIES; do
  for d in $DATASETS; do
    dir="$OUT/$h/$d"
    profile_once "$h" "$d" "$dir"
    for config in "${CONFIGS[@]}"; do
      held_out_run "$h" "$d" "$config" "$dir/runs/$(run_name "$config")"
    done
    "$PY" -m analysis.validate "$dir/profile/profile.json" "$dir/runs" --json > "$dir/validation.json"
    "$PY" -m analysis.validate "$dir/profile/profile.json" "$dir/runs" > "$dir/validation.txt"
    echo "== $h $d" && cat "$dir/validation.txt"
  done
done
{
  for f in "$OUT"/*/*/validation.txt; do echo "== ${f#"$OUT"/}"; cat "$f"; echo; done
} > "$OUT/report.txt"
echo "validation report: $OUT/report.txt ($(( ($(date +%s) - started) / 60 )) min)"
