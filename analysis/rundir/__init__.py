"""The results store: one directory per run, written atomically, resumable, readable without torch.

A run directory holds config.yaml (the resolved configuration), env.json (library versions, machine),
samples.jsonl (one record per finished sample, appended and fsynced, `RECORD_KEYS`), traces/NNNNN.json.gz
(the stage traces of sample NNNNN; a finished sweep's packed into one archive per sweep, `packed`, by
`python -m analysis.rundir.archive`) and summary.json (pooled figures, `summarize_run`); docs/experiments.md
says what each holds. Here: writing and reading it (`store`: `RunStore`, `read_summary`, `read_config`,
`read_env`, `read_records`, `read_trace`, `find_run_dirs`, each raising a one-line `ResultsError` for
anything missing, corrupt or foreign), its summary (`summary`), its greedy reference (`reference`) and the
identity classes of a mismatch with it (`identity`). `analysis.runs` builds its `Run` objects on these.
"""

from analysis.rundir.store import (
    SAMPLES, SUMMARY, CONFIG, ENV, TRACES, SUMMARY_LOCK, RECORD_KEYS, CONFIG_KEYS, SUMMARY_KEYS, MAX_SEARCH_DEPTH,
    ResultsError, atomic_write_bytes, atomic_write_text, atomic_write_json, summary_lock, read_records, trace_path,
    has_trace, RunStore, read_trace, read_config, read_summary, read_env, is_run_dir, find_run_dirs
)
from analysis.rundir.packed import ARCHIVE, has_packed_traces
from analysis.rundir.summary import stage_stats, pool_stages, summarize_run, pool_quality
from analysis.rundir.reference import (
    target_key, acceptance_mode, is_greedy_reference, pick_reference, find_greedy_reference,
    compare_with_reference, refresh_reference
)
from analysis.rundir.identity import (
    DTYPE_EPS, NEAR_TIE_EPS_UNITS, LOGIT_SCALE, near_tie_threshold, run_near_tie_threshold, first_divergence,
    classify_mismatch, classify_identity
)
