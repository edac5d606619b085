#!/usr/bin/env bash
# The in-sample decomposition beside each paired validation (run after scripts/validation_paired.sh): per
# hierarchy and dataset, acceptance measured on the sweep's own prompts (read from validation.json) with the
# held-out profile's step costs, prefill and handoff (`costs_from`; acceptance only, no timing: any load
# will do, 50-90 s each for SmolLM2 on a 2-core CPU) into profile_sweep_prompts/, and the sweep validated
# against it into in_sample_acceptance.txt (labelled in-sample: a decomposition, not a prediction). Beside
# validation.txt it shows how much of the error is the profile's prompts being other prompts, and how much
# the rest (costs, the schedule).
# Usage: HIERARCHIES="smollm2_int8_fp32" DATASETS="humaneval" bash scripts/validation_paired_in_sample.sh
# shellcheck source=validation_paired_common.sh
source "$(dirname "$0")/validation_paired_common.sh"
for h in $HIERARCHIES; do
  for d in $DATASETS; do
    dir="$OUT/$h/$d"
    [ -f "$dir/validation.json" ] || { echo "error: $dir/validation.json missing (run scripts/validation_paired.sh first)" >&2; exit 2; }
    prompts=$("$PY" -c 'import json, sys; print(",".join(json.load(open(sys.argv[1]))["prompts"]))' "$dir/validation.json")
    count=$(echo "$prompts" | tr ',' '\n' | wc -l)
    [ -f "$dir/profile_sweep_prompts/profile.json" ] || "$PY" -m experiments.profile models="$h" dataset="$d" \
        "dataset.ids=[$prompts]" dataset.n_samples="$count" profile.continuation="$TOKENS" \
        costs_from="$dir/profile/profile.json" hydra.run.dir="$dir/profile_sweep_prompts"
    "$PY" -m analysis.validate "$dir/profile_sweep_prompts/profile.json" "$dir/sweep" > "$dir/in_sample_acceptance.txt"
    echo "== $h $d (in-sample acceptance)" && grep -A8 "^targets" "$dir/in_sample_acceptance.txt"
  done
done
