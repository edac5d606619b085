#!/usr/bin/env bash
# The prepared GPU check (not part of CI): tiny models built on the spot, greedy / sd / pipespec
# on the GPU in float32 and float16, every output identical or a classified near-tie against the
# device's own greedy output; prints tokens/s, the 8-token / 1-token step time and NVML figures.
# Needs no hub and no package registry: it uses the python (torch, transformers) already on the
# machine (PYTHON=... to choose another), and this checkout on PYTHONPATH. At most 5 minutes.
#   bash scripts/gpu_check.sh                    # cuda
#   bash scripts/gpu_check.sh --device cpu       # the same path on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout --kill-after=10 300 "${PYTHON:-python3}" -m experiments.gpu_check "$@"
