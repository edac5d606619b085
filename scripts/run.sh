#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job on the embedded default:
# greedy against auto (the configuration a machine profile predicts fastest; the first run on a
# machine measures and caches a short profile) on SmolLM2 (suffix drafter -> fp32: the fastest default hierarchy
# in the bench), 5 HumanEval problems,
# one Hydra multirun into outputs/multirun/, then the table comparing them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# offline unless the run names a hub dataset or model: the `hub.offline` setting (experiments.hub)
exec .venv/bin/python -m experiments.run "$@"
