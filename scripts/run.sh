#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job on the embedded default:
# greedy, sd and pipespec side by side on SmolLM2 (prompt lookup -> int8 -> fp32), HumanEval prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec .venv/bin/python -m pipespec.bench "$@"
