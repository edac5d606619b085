#!/usr/bin/env bash
# The prepared GPU check (not part of CI), under 10 minutes on one GPU: the packaged SmolLM2-135M as a
# draft -> target pair on cuda:0 with the target in float32, float16 and bfloat16 (or the local checkpoints
# GPU_CHECK_MODELS=dir1,dir2 names, smallest first), greedy / sd / pipespec on the first HumanEval problems,
# every output identical or a classified near-tie against the device's own greedy output; prints tokens/s,
# per stage acceptance, step time and NVML figures, the 8-token / 1-token step time and what they show,
# and writes check.json + check.txt into one folder named after the machine (results/gpu_check/).
# Without a GPU, or with GPU_CHECK_DRY_RUN=1, the same path runs tiny random models on the CPU
# (outputs/gpu_check/). Needs no hub and no package registry: it uses the python (torch,
# transformers) already on the machine (PYTHON=... to choose another), and this checkout on PYTHONPATH.
#   bash scripts/gpu_check.sh                          # the GPU it finds
#   GPU_CHECK_DRY_RUN=1 bash scripts/gpu_check.sh      # tiny models on the CPU
#   bash scripts/gpu_check.sh --device cpu --hierarchies tiny_k2 --prompts 1 --tokens 8
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout --kill-after=10 570 "${PYTHON:-python3}" -m experiments.gpu_check "$@"
