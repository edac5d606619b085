#!/usr/bin/env bash
# The CPU sweep behind results/cpu_sweep/ and the analysis figures:
# strategies x lookahead x depth on the default CPU hierarchies, HumanEval.
# Usage: bash scripts/cpu_sweep.sh [OUT_DIR] [N_SAMPLES] [MAX_NEW_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/cpu_sweep}
N=${2:-5}
TOKENS=${3:-64}
# the committed results were measured before oneDNN prepacking (pipespec.kernels): keep their kernels
export PIPESPEC_KERNELS=${PIPESPEC_KERNELS:-torch}
MODELS=smollm2_pld_fp32,smollm2_int8_fp32,smollm2_pld_int8_fp32
COMMON=(dataset=humaneval dataset.n_samples="$N" max_new_tokens="$TOKENS" hydra.sweep.dir="$OUT" run.progress=false)
# greedy first: the speculative runs find it as their sibling reference when they finish
.venv/bin/python -m experiments.run -m models=$MODELS strategy=greedy "${COMMON[@]}"
.venv/bin/python -m experiments.run -m models=$MODELS strategy=sd strategy.lookahead=2,4,6 "${COMMON[@]}"
.venv/bin/python -m experiments.run -m models=$MODELS strategy=pipespec strategy.lookahead=0,1,2,4 "${COMMON[@]}"
.venv/bin/python -m experiments.collect "$OUT" --csv "$OUT/table.csv" --markdown "$OUT/table.md"
