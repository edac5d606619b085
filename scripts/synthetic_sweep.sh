#!/usr/bin/env bash
# Controlled acceptance: real models, real processes, real timing, but each verifier
# keeps a draft by a seeded coin with the given rate (NOT lossless: benchmarking only), so the
# models are checked across alpha = 0.1 .. 0.95 instead of at the one alpha a pair happens to have.
# Usage: bash scripts/synthetic_sweep.sh [OUT_DIR] [N_SAMPLES] [MAX_NEW_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/synthetic_sweep}
N=${2:-3}
TOKENS=${3:-64}
# the committed results were measured before oneDNN prepacking (pipespec.kernels): keep their kernels
export PIPESPEC_KERNELS=${PIPESPEC_KERNELS:-torch}
COMMON=(models=smollm2_int8_fp32 dataset=humaneval dataset.n_samples="$N" max_new_tokens="$TOKENS"
        hydra.sweep.dir="$OUT" run.progress=false)
.venv/bin/python -m experiments.run -m strategy=greedy "${COMMON[@]}"
.venv/bin/python -m experiments.run -m strategy=sd,pipespec acceptance.mode=synthetic \
    acceptance.rate=0.1,0.3,0.5,0.7,0.9,0.95 "${COMMON[@]}"
.venv/bin/python -m experiments.collect "$OUT" --csv "$OUT/table.csv" --markdown "$OUT/table.md"
