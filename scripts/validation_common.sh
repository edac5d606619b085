# Sourced by validation_sweep.sh, validation_in_sample.sh and validation_repeat.sh: their shared settings and
# helpers.
set -euo pipefail
cd "$(dirname "$0")/.."
# the committed results were measured before oneDNN prepacking (pipespec.kernels): keep their kernels
export PIPESPEC_KERNELS=${PIPESPEC_KERNELS:-torch}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-results/validation}
HIERARCHIES=${HIERARCHIES:-"smollm2_int8_fp32 smollm2_pld_int8_fp32 smollm2_pld_fp32"}
DATASETS=${DATASETS:-"humaneval news_lee_cnndm"}
# profile overrides: continuations as long as the runs'
PROFILE_OPTIONS=${PROFILE_OPTIONS:-"profile.max_fed=16 profile.continuation=96"}
TOKENS=96  # new tokens per prompt, in the runs and in the profiles' room for them

ids() {  # ids DATASET FIRST LAST -> a Hydra list of sample ids
  local dataset=$1 first=$2 last=$3 out="" i
  for ((i = first; i <= last; i++)); do
    if [[ $dataset == humaneval ]]; then out+="HumanEval/$i,"; else out+=$(printf 'lee_background-%03d,' "$i"); fi
  done
  echo "[${out%,}]"
}

run_name() {  # run_name "strategy=sd strategy.lookahead=4" -> sd_L4
  echo "$1" | sed 's/strategy=//; s/strategy\.lookahead=/L/; s/strategy\.max_lead=/M/; s/ /_/g'
}

profile_once() {  # profile_once HIERARCHY DATASET DIR: a profile on prompts 0-9 into DIR/profile, unless there
  local h=$1 d=$2 dir=$3
  [[ -f $dir/profile/profile.json ]] && return 0
  # shellcheck disable=SC2086
  "$PY" -m experiments.profile "models=$h" "dataset=$d" "dataset.ids=$(ids "$d" 0 9)" "max_new_tokens=$TOKENS" \
    $PROFILE_OPTIONS "hydra.run.dir=$dir/profile"
}

held_out_run() {  # held_out_run HIERARCHY DATASET "CONFIG" RUN_DIR: a run on prompts 10-17, unless done already
  local h=$1 d=$2 config=$3 run_dir=$4
  [[ -f $run_dir/summary.json ]] && return 0  # done by an earlier call: resume
  # shellcheck disable=SC2086
  "$PY" -m experiments.run "models=$h" "dataset=$d" "dataset.ids=$(ids "$d" 10 17)" "max_new_tokens=$TOKENS" \
    $config run.progress=false "hydra.run.dir=$run_dir"
}
