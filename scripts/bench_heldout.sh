#!/usr/bin/env bash
# The bench behind docs/performance.md: one invocation over HumanEval and news_lee (the bench's default
# `datasets`), 10 prompts each after the first 20 in task order (`prompt_offset=20`: the suffix settings were
# tuned on the first 20 of each, `experiments.drafter_offline`), 96 new tokens, 3 repetitions; our systems
# with their default kernels (oneDNN prepacked fp32 linears), HF generate with torch's. Systems: HF greedy,
# assisted and prompt lookup; our greedy, sd, pipespec k=2 / k=3 and auto; sd and pipespec (lookahead 1,
# `system_options`) on smollm2_suffix_fp32; the cascade on smollm2_suffix_int8_fp32; pipespec on k=2's
# hierarchy with the value-of-a-draft stop (`value_stop` 0.1, max_lead 16, bench.yaml's `system_options`)
# and on smollm2_int8v16k_fp32 (the int8 drafter's lm_head over the first 16384 ids). Run it on a quiet
# machine: about 40-50 minutes per dataset.
# Usage: bash scripts/bench_heldout.sh [OUT_DIR] [extra bench overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
PY=${PY:-.venv/bin/python}
OUT=${1:-results/bench/heldout_offset20_vs}
shift || true
SYSTEMS='systems=[hf_greedy,hf_assisted,hf_prompt_lookup,greedy,sd,pipespec_k2,pipespec_k3,auto,sd@smollm2_suffix_fp32,pipespec@smollm2_suffix_fp32,pipespec@smollm2_suffix_int8_fp32,pipespec@smollm2_int8_fp32,pipespec@smollm2_int8v16k_fp32]'
echo "[bench_heldout] $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" -m experiments.bench samples=10 prompt_offset=20 max_new_tokens=96 repetitions=3 prepass_prompts=1 \
    "$SYSTEMS" 'hierarchies=[]' hydra.run.dir="$OUT" "$@"
echo "[bench_heldout] $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
