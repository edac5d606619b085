# Sourced by validation_paired.sh and validation_paired_in_sample.sh: their shared settings.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-results/validation_paired}
HIERARCHIES=${HIERARCHIES:-"smollm2_suffix_fp32 smollm2_int8_fp32 smollm2_pld_int8_fp32"}
DATASETS=${DATASETS:-"humaneval news_lee_cnndm"}
SAMPLES=${SAMPLES:-8}
TOKENS=${TOKENS:-96}
