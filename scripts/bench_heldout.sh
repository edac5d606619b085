#!/usr/bin/env bash
# The bench behind docs/performance.md: one invocation over HumanEval and news_lee (the bench's default
# `datasets`), SAMPLES prompts each after the first 20 in task order (`prompt_offset=20`: the suffix settings
# were tuned on the first 20 of each, `experiments.drafter_offline`), 96 new tokens, REPS repetitions; our
# systems with their default kernels (`kernels: auto`, measured per machine), HF generate with torch's.
# Systems: HF greedy, HF greedy compiled (static cache + torch.compile), assisted and prompt lookup, each at
# the faster of 1 and 2 threads; our greedy (the faster of 1 and 2 threads), sd, pipespec k=2 / k=3;
# sd and pipespec (lookahead 1, `system_options`) on the suffix drafter -> fp32 with both threads on the
# verifier (smollm2_suffix_fp32_t2), on the same with token trees of 8 nodes (smollm2_suffix_tree8_fp32_t2), on
# the suffix drafter tuned for that verifier's nearly flat step, chains and trees of 8 (smollm2_suffix_flat_fp32_t2,
# smollm2_suffix_flat_tree8_fp32_t2);
# pipespec's cascade suffix -> int8 -> fp32 (smollm2_suffix_int8_fp32); sd on the flat suffix drafter with its
# 2-thread verifier compiled (smollm2_suffix_flat_fp32_t2_compiled), sd and pipespec on its trees of 8 with the
# verifier compiled (smollm2_suffix_flat_tree8_fp32_t2_compiled; the compiled package is built at its first start
# on a machine, about 1.5 minutes, and loaded by later ones, reported apart).
# Run it on a quiet machine.
# Usage: SAMPLES=4 REPS=2 bash scripts/bench_heldout.sh [OUT_DIR (default results/bench/heldout_DATE)] [extra overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-results/bench/heldout_$(date -u +%F)}  # a dated run of its own
SAMPLES=${SAMPLES:-8}
REPS=${REPS:-3}
shift || true
SYSTEMS='systems=[hf_greedy,hf_compiled,hf_assisted,hf_prompt_lookup,greedy,sd,pipespec_k2,pipespec_k3,sd@smollm2_suffix_fp32_t2,pipespec@smollm2_suffix_fp32_t2,sd@smollm2_suffix_tree8_fp32_t2,pipespec@smollm2_suffix_tree8_fp32_t2,sd@smollm2_suffix_flat_fp32_t2,pipespec@smollm2_suffix_flat_fp32_t2,sd@smollm2_suffix_flat_tree8_fp32_t2,pipespec@smollm2_suffix_flat_tree8_fp32_t2,pipespec@smollm2_suffix_int8_fp32,sd@smollm2_suffix_flat_fp32_t2_compiled,sd@smollm2_suffix_flat_tree8_fp32_t2_compiled,pipespec@smollm2_suffix_flat_tree8_fp32_t2_compiled]'
echo "[bench_heldout] $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" -m experiments.bench samples="$SAMPLES" prompt_offset=20 max_new_tokens=96 repetitions="$REPS" prepass_prompts=1 \
    "$SYSTEMS" 'hierarchies=[]' hydra.run.dir="$OUT" "$@"
echo "[bench_heldout] $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
