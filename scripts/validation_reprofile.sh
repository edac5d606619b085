#!/usr/bin/env bash
# Re-measure the acceptance of the committed validation profiles (profile version 2: acceptance along the
# decoding walk), keeping the step costs, prefill and handoff they measured on the day of the runs
# (`costs_from`: acceptance is deterministic, costs drift with the machine), then validate again:
#  1. per hierarchy and dataset, results/validation/H/D/profile/profile.json from its profile_v1.json, on the
#     same prompts 0-9 (held out from the runs);
#  2. profile_run_prompts/: the same on the runs' own prompts 10-17. A decomposition, not a prediction:
#     `analysis.validate` reports those runs as in-sample. It shows how much of the error is acceptance
#     that differs between prompt sets, and how much is the costs;
#  3. bash scripts/validation_sweep.sh (every run and profile exists: it only validates and reports).
# About 9 minutes per step on the 2-core development machine (acceptance only: no timing, any load).
# shellcheck source=validation_common.sh
source "$(dirname "$0")/validation_common.sh"

for h in $HIERARCHIES; do
  for d in $DATASETS; do
    dir="$OUT/$h/$d"
    costs="$dir/profile/profile_v1.json"
    [[ -f $costs ]] || { echo "error: $costs missing (the version 1 profile whose costs are reused)" >&2; exit 2; }
    "$PY" -m experiments.profile "models=$h" "dataset=$d" "dataset.ids=$(ids "$d" 0 9)" max_new_tokens=96 \
      profile.max_fed=16 "costs_from=$costs" "hydra.run.dir=$dir/profile"
    "$PY" -m experiments.profile "models=$h" "dataset=$d" "dataset.ids=$(ids "$d" 10 17)" max_new_tokens=96 \
      profile.max_fed=16 "costs_from=$costs" "hydra.run.dir=$dir/profile_run_prompts"
    "$PY" -m analysis.validate "$dir/profile_run_prompts/profile.json" "$dir/runs" > "$dir/in_sample_acceptance.txt"
  done
done
OUT=$OUT HIERARCHIES=$HIERARCHIES DATASETS=$DATASETS bash scripts/validation_sweep.sh
