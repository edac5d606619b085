#!/usr/bin/env bash
# The bench's llama.cpp systems (docs/benchmark.md#llamacpp): install llama-cpp-python 0.3.36 (the `llamacpp`
# extra of pyproject.toml) into .venv and write the f32 GGUF of the SmolLM2 target into the cache; prints both
# GGUFs (the f32 one and the packaged Q4_1 reference). pip builds llama.cpp from its source distribution
# (15-30 minutes on 2 cores): LLAMACPP_WHEEL=path/to/llama_cpp_python-0.3.36-*.whl installs a wheel built
# before instead. Re-running is quick: an installed 0.3.36 and a written GGUF are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
[ -x .venv/bin/python ] || bash scripts/setup.sh
installed=$(.venv/bin/python -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)
if [ "$installed" != "0.3.36" ]; then
  if [ -n "${LLAMACPP_WHEEL:-}" ]; then
    .venv/bin/python -m pip install -e ".[llamacpp]" "$LLAMACPP_WHEEL"
  else
    echo "llamacpp: building llama-cpp-python 0.3.36 from source (15-30 minutes on 2 cores)" >&2
    .venv/bin/python -m pip install -e ".[llamacpp]"
  fi
fi
.venv/bin/python -m experiments.benchlib.llamacpp
