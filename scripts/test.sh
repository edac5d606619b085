#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, on two pytest-xdist workers
# (PYTEST_WORKERS=N to change; 0 runs in this process). Tests are spread one by one (--dist loadgroup:
# the tiny-model pipelines leave a core idle much of the time), except those of one xdist_group, which
# share a worker (the published logs' predictions, computed once there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
unset PYTHONDONTWRITEBYTECODE  # a module first imported by a test (or its stage processes) is compiled once
exec .venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadgroup "$@"
