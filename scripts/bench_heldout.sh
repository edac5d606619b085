#!/usr/bin/env bash
# The bench behind docs/performance.md and the README's headline: one invocation over HumanEval and news_lee (the
# bench's default `datasets`), SAMPLES prompts each after the first 20 in task order (`prompt_offset=20`: the suffix
# settings were tuned on the first 20 of each, `experiments.drafter_offline`), 96 new tokens, REPS repetitions;
# our systems with their default kernels (`kernels: auto`, measured per machine), HF generate with torch's.
# Systems: HF greedy, HF greedy compiled (static cache + torch.compile), assisted and prompt lookup, each at the
# faster of 1 and 2 threads; llama.cpp greedy on the f32 GGUF of the same weights, its prompt lookup, and the
# packaged Q4_1 GGUF as a labelled reference (each left out, with the reason, where `bash scripts/llamacpp.sh`
# has not run); our greedy (the faster of 1 and 2 threads); PipeSpec k=2 (int8 -> fp32) and k=3 (lookup -> int8
# -> fp32); SD on the flat suffix drafter with its 2-thread verifier compiled, chains and trees of 8, and PipeSpec
# (lookahead 1, `system_options`) on the trees (the compiled package is built at its first start on a machine,
# about 1.5 minutes, and loaded by later ones, reported apart). About an hour on a 2-core machine.
# Run it on a quiet machine.
# Usage: [SAMPLES=8] [REPS=3] bash scripts/bench_heldout.sh [OUT_DIR (default results/bench/heldout_DATE)] [extra overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-results/bench/heldout_$(date -u +%F)}  # a dated run of its own
SAMPLES=${SAMPLES:-8}
REPS=${REPS:-3}
shift || true
SYSTEMS='systems=[hf_greedy,hf_compiled,hf_assisted,hf_prompt_lookup,llamacpp_greedy,llamacpp_prompt_lookup,llamacpp_q4,greedy,pipespec_k2,pipespec_k3,sd@smollm2_suffix_flat_fp32_t2_compiled,sd@smollm2_suffix_flat_tree8_fp32_t2_compiled,pipespec@smollm2_suffix_flat_tree8_fp32_t2_compiled]'
echo "[bench_heldout] $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" -m experiments.bench samples="$SAMPLES" prompt_offset=20 max_new_tokens=96 repetitions="$REPS" prepass_prompts=1 \
    "$SYSTEMS" 'hierarchies=[]' hydra.run.dir="$OUT" "$@"
echo "[bench_heldout] $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
