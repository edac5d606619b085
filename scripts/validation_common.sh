# Sourced by validation_sweep.sh and validation_in_sample.sh: their shared settings and helper.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# the committed results were measured before oneDNN prepacking (pipespec.kernels): keep their kernels
export PIPESPEC_KERNELS=${PIPESPEC_KERNELS:-torch}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-results/validation}
HIERARCHIES=${HIERARCHIES:-"smollm2_int8_fp32 smollm2_pld_int8_fp32 smollm2_pld_fp32"}
DATASETS=${DATASETS:-"humaneval news_lee_cnndm"}

ids() {  # ids DATASET FIRST LAST -> a Hydra list of sample ids
  local dataset=$1 first=$2 last=$3 out="" i
  for ((i = first; i <= last; i++)); do
    if [[ $dataset == humaneval ]]; then out+="HumanEval/$i,"; else out+=$(printf 'lee_background-%03d,' "$i"); fi
  done
  echo "[${out%,}]"
}
