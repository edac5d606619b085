#!/usr/bin/env bash
# Held-out validation on paired sweeps, into results/validation_paired/HIERARCHY/DATASET/:
#  1. a machine profile of the hierarchy on the dataset's first 10 prompts (python -m experiments.profile),
#     acceptance read along continuations as long as the sweep's generations;
#  2. a paired, interleaved sweep (python -m experiments.sweep): greedy and the 10 configurations of
#     conf/sweep.yaml on the 8 prompts after the first 20 (prompts the profile never saw), 3 repetitions,
#     TOKENS (96) new tokens, each sample's speed factor against the profile;
#  3. python -m analysis.validate PROFILE SWEEP (validation.txt, validation.json).
# Every step resumes: a profile or finished sweep samples are kept. Run it on a quiet machine (about 30
# minutes per hierarchy and dataset for SmolLM2 on a 2-core CPU).
# Usage: HIERARCHIES="smollm2_suffix_fp32" DATASETS="humaneval news_lee_cnndm" bash scripts/validation_paired.sh
# (SWEEP_CONFIGURATIONS='configurations=[...]' replaces conf/sweep.yaml's list; SWEEP_NAME=sweep_T4 with
# SWEEP_OVERRIDES=+models.stages.0.tree_nodes=4 makes another sweep beside it, validated into validation_T4.txt)
# shellcheck source=validation_paired_common.sh
source "$(dirname "$0")/validation_paired_common.sh"
REPETITIONS=${REPETITIONS:-3}
SWEEP_NAME=${SWEEP_NAME:-sweep}
load() { echo "[validation_paired] $(date -u +%FT%TZ) $1 load: $(cut -d' ' -f1-3 /proc/loadavg)"; }
for h in $HIERARCHIES; do
  for d in $DATASETS; do
    dir="$OUT/$h/$d"
    mkdir -p "$dir"
    load "$h $d"
    [ -f "$dir/profile/profile.json" ] || "$PY" -m experiments.profile models="$h" dataset="$d" \
        dataset.n_samples=10 profile.continuation="$TOKENS" hydra.run.dir="$dir/profile"
    sweep="$dir/$SWEEP_NAME" validation="$dir/validation${SWEEP_NAME#sweep}"
    resume=false
    [ -d "$sweep/greedy" ] && resume=true
    # a finished sweep (its paired table written) is left as it is: resuming it would measure nothing
    [ -f "$sweep/paired.json" ] || "$PY" -m experiments.sweep models="$h" dataset="$d" samples="$SAMPLES" \
        prompt_offset=20 repetitions="$REPETITIONS" max_new_tokens="$TOKENS" profile="$dir/profile/profile.json" \
        resume="$resume" progress=false hydra.run.dir="$sweep" ${SWEEP_CONFIGURATIONS:+"$SWEEP_CONFIGURATIONS"} \
        ${SWEEP_OVERRIDES:-}
    "$PY" -m analysis.validate "$dir/profile/profile.json" "$sweep" > "$validation.txt"
    "$PY" -m analysis.validate "$dir/profile/profile.json" "$sweep" --json > "$validation.json"
    load "$h $d done"
  done
done
