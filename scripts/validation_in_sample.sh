#!/usr/bin/env bash
# The in-sample decomposition beside the held-out validation (run after scripts/validation_sweep.sh): per
# hierarchy and dataset, acceptance measured on the runs' own prompts (HumanEval/10-17, lee_background-010..017)
# with the held-out profile's step costs, prefill and handoff (`costs_from`), into
# results/validation/H/D/profile_run_prompts/, and `analysis.validate` of the runs against it into
# in_sample_acceptance.txt (reported as in-sample: a decomposition, not a prediction). Beside the held-out
# report it shows how much of the error is acceptance that differs between prompt sets and how much is
# the rest (costs, the machine's drift, the model). Acceptance only, no timing: any load will do; about
# 1.5 minutes per hierarchy and dataset on the 2-core development machine.
# shellcheck source=validation_common.sh
source "$(dirname "$0")/validation_common.sh"

for h in $HIERARCHIES; do
  for d in $DATASETS; do
    dir="$OUT/$h/$d"
    costs="$dir/profile/profile.json"
    [[ -f $costs ]] || { echo "error: $costs missing (run scripts/validation_sweep.sh first)" >&2; exit 2; }
    # shellcheck disable=SC2086
    [[ -f $dir/profile_run_prompts/profile.json ]] || "$PY" -m experiments.profile "models=$h" "dataset=$d" \
      "dataset.ids=$(ids "$d" 10 17)" "max_new_tokens=$TOKENS" $PROFILE_OPTIONS "costs_from=$costs" \
      "hydra.run.dir=$dir/profile_run_prompts"
    "$PY" -m analysis.validate "$dir/profile_run_prompts/profile.json" "$dir/runs" > "$dir/in_sample_acceptance.txt"
    echo "== $h $d (in-sample acceptance)" && cat "$dir/in_sample_acceptance.txt"
  done
done
