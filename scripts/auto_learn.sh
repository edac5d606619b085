#!/usr/bin/env bash
# auto that learns, on a profile measured on the OTHER dataset, against paired sweeps of the same prompts,
# into results/validation_paired/HIERARCHY/DATASET/learn/from_OTHER/ (below the depth at which analysis.figures looks
# for runs in results/: a run whose configuration changes per call is in no figure):
#  1. the profiles of both datasets (scripts/validation_paired.sh's, made here when missing);
#  2. per dataset, python -m experiments.run strategy=auto strategy.learn=true with the other dataset's
#     profile, on the sweep's prompts (the 8 after the first 20);
#  3. the dataset's paired sweep (scripts/validation_paired.sh), with every configuration the learning run
#     ran added to the sweep's list, so each one's paired speedup is measured beside the best fixed one,
#     interleaved with them (a finished sweep is left as it is, and a configuration it lacks shows as "not in
#     the sweep" in learning.md; an unfinished one refuses to resume with a longer list: remove it and run
#     this again; a configuration the run ran on some of the stages is swept on the same
#     stages, `stages` in its entry); where the run's first stage proposed token trees of T nodes (auto chose
#     them: the size is the stage's own, fixed when it started), a sweep whose first stage proposes the same
#     trees, sweep_TT, every configuration of it with trees;
#  4. python -m analysis.learn RUN SWEEP: per call, the configuration and its paired speedup / the best's.
# To measure runs and sweeps again, move them aside to OLD/DATASET/... and set ALSO_HOLD=OLD: each new sweep
# then also holds the configurations OLD/DATASET/<the same sweep name> held (the earlier runs' choices).
# Every step resumes. Usage: HIERARCHY=smollm2_suffix_fp32 bash scripts/auto_learn.sh (quiet machine: about
# 50 minutes for SmolLM2 suffix -> fp32 on the 2-core development machine)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
H=${HIERARCHY:-smollm2_suffix_fp32}
OUT=${OUT:-results/validation_paired}
export TOKENS=${TOKENS:-96}  # new tokens per prompt: the learning runs, the profiles' continuations, the sweeps
other() { [ "$1" = humaneval ] && echo news_lee_cnndm || echo humaneval; }
for d in humaneval news_lee_cnndm; do
  [ -f "$OUT/$H/$d/profile/profile.json" ] || "$PY" -m experiments.profile models="$H" dataset="$d" \
      dataset.n_samples=10 profile.continuation="$TOKENS" hydra.run.dir="$OUT/$H/$d/profile"
done
for d in humaneval news_lee_cnndm; do
  o=$(other "$d")
  run="$OUT/$H/$d/learn/from_$o"
  ids=$("$PY" - "$d" <<'PY'
import sys
from experiments.compose import load
from experiments.data import load_dataset
samples = load_dataset({**load("dataset", sys.argv[1]), "n_samples": 28}).samples[20:28]
print("[" + ",".join(f'"{s.sample_id}"' for s in samples) + "]")
PY
)
  [ -f "$run/summary.json" ] || "$PY" -m experiments.run models="$H" dataset="$d" "dataset.ids=$ids" \
      dataset.n_samples=null max_new_tokens="$TOKENS" strategy=auto strategy.learn=true \
      strategy.profile="$OUT/$H/$o/profile/profile.json" run.progress=false hydra.run.dir="$run"
  # the token trees the run's first stage proposed (0: chains); conf/sweep.yaml's configurations, then each one
  # an earlier sweep of the same prompts holds or the learning run ran that is not among them (by name), so a
  # sweep an earlier learning run extended resumes with its whole list
  read -r trees all < <("$PY" - "$run" <<'PY'
import json, os, sys
from pathlib import Path
from analysis.learn import sweep_configuration
from analysis.paired import configuration_name
from analysis.rundir import read_config, read_summary
from experiments.compose import compose
trees = read_summary(Path(sys.argv[1]))["auto"]["chosen"].get("tree_nodes", 0)
count = len(read_config(Path(sys.argv[1]))["models"]["stages"])
entries = [dict(c) for c in compose("sweep")["configurations"]]
names = {configuration_name(c) for c in entries}
sweep = Path(sys.argv[1]).parent.parent / ("sweep" if not trees else f"sweep_T{trees}")
old = os.environ.get("ALSO_HOLD")  # OLD: the same sweep measured before, moved to OLD/DATASET/
sweeps = [sweep] + ([Path(old) / sweep.parent.name / sweep.name] if old else [])
held = [read_config(p.parent)["strategy"] for d in sweeps for p in sorted(d.glob("*/config.yaml"))
        if p.parent.name != "greedy" and not p.parent.name.startswith(".")]
held = [{"strategy": s["name"], **{k: s[k] for k in ("lookahead", "max_lead", "stages") if k in s}} for s in held]
ran = [sweep_configuration(json.loads(line)["auto"]["ran"], count)
       for line in (Path(sys.argv[1]) / "samples.jsonl").read_text().splitlines()]
for entry in held + ran:
    if entry["strategy"] != "greedy" and configuration_name(entry) not in names:
        names.add(configuration_name(entry))
        entries.append(entry)
print(trees, "[" + ",".join("{" + ", ".join(f"{k}: {v}" for k, v in e.items()) + "}" for e in entries) + "]")
PY
)
  name=sweep overrides=""
  echo "[auto_learn] $d: the sweep's configurations $all" >&2
  if [ "$trees" -gt 0 ]; then name="sweep_T$trees" overrides="+models.stages.0.tree_nodes=$trees"; fi
  HIERARCHIES="$H" DATASETS="$d" SWEEP_CONFIGURATIONS="configurations=$all" SWEEP_NAME="$name" \
      SWEEP_OVERRIDES="$overrides" bash scripts/validation_paired.sh
  "$PY" -m analysis.learn "$run" "$OUT/$H/$d/$name" | tee "$run/learning.md"
done
