#!/usr/bin/env bash
# The bench behind README "Performance": HumanEval and news_lee, 10 prompts each that no drafter setting
# was tuned on (HumanEval/20-29, lee_background-020..029; the suffix settings were tuned on the first 20 of
# each), 96 new tokens, 3 repetitions; our systems with their default kernels (oneDNN prepacked fp32
# linears), HF generate with torch's. Run it on a quiet machine: about 30 minutes per dataset.
# Usage: bash scripts/bench_heldout.sh [OUT_DIR] [extra bench overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
PY=${PY:-.venv/bin/python}
OUT=${1:-results/bench/heldout}
shift || true
SYSTEMS='systems=[hf_greedy,hf_assisted,hf_prompt_lookup,greedy,sd,pipespec_k2,pipespec_k3,auto]'
COMMON=(samples=10 max_new_tokens=96 repetitions=3 prepass_prompts=1 "$SYSTEMS" 'hierarchies=[smollm2_suffix_fp32]')
he_ids="[$(for i in $(seq 20 29); do printf 'HumanEval/%d,' "$i"; done | sed 's/,$//')]"
news_ids="[$(for i in $(seq 20 29); do printf 'lee_background-%03d,' "$i"; done | sed 's/,$//')]"
echo "[bench_heldout] $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" -m experiments.bench dataset=humaneval "dataset.ids=$he_ids" "${COMMON[@]}" \
    hydra.run.dir="$OUT/humaneval" "$@"
echo "[bench_heldout] $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" -m experiments.bench dataset=news_lee_cnndm "dataset.ids=$news_ids" "${COMMON[@]}" \
    targets.best_speculative_vs_hf_greedy=1.3 hydra.run.dir="$OUT/news_lee" "$@"
echo "[bench_heldout] $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
