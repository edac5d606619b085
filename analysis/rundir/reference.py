"""The greedy reference of a run: a run of strategy greedy with the same target model, dataset, token budget
and decoding, named by `reference_run` or found among the run's finished siblings (`pick_reference`, the
one rule); `refresh_reference` fills summary.json's identical_to_greedy, identity and speedup_vs_greedy
from it. docs/experiments.md.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from analysis.rundir.identity import classify_identity, run_near_tie_threshold
from analysis.rundir.store import (
    CONFIG, ResultsError, SUMMARY, _natural_key, atomic_write_json, is_run_dir, read_config, read_records,
    read_summary, summary_lock
)
from pipespec.specs import StageSpec
from pipespec.stats import ratio


# A stage option at its default is the same stage whether a config spells it out or not
STAGE_DEFAULTS = {f.name: f.default for f in fields(StageSpec) if f.default is not MISSING}


def target_key(config: Mapping[str, Any]) -> tuple:
    """What makes two runs' outputs comparable: the target model (options at their defaults left out), the
    dataset and the budget."""
    target = {k: v for k, v in config["models"]["stages"][-1].items()
              if k != "name" and not (k in STAGE_DEFAULTS and v == STAGE_DEFAULTS[k])}  # fmt: skip
    dataset = config["dataset"]
    return (
        json.dumps(target, sort_keys=True),
        dataset["name"],
        json.dumps(dataset.get("path")),
        config["max_new_tokens"],
        _sampling_key(config.get("sampling")),
    )


def _sampling_key(sampling: Mapping[str, Any] | None) -> str:
    """Temperature 0 (or no sampling section) is greedy whatever top-k / top-p / seed say."""
    sampling = sampling or {}
    if not sampling.get("temperature"):
        return "greedy"
    return json.dumps({k: sampling.get(k) for k in ("temperature", "top_k", "top_p")}, sort_keys=True)


def acceptance_mode(config: Mapping[str, Any]) -> str:
    return (config.get("acceptance") or {}).get("mode", "exact")


def is_greedy_reference(config: Mapping[str, Any]) -> bool:
    return config["strategy"]["name"] == "greedy" and acceptance_mode(config) == "exact"


def pick_reference(run_dir: Path, config: Mapping[str, Any], candidates: Iterable[tuple[Path, Mapping[str, Any]]]):
    """The one greedy-reference rule: among `candidates` ((directory, config) pairs), a lossless greedy run
    with this run's `target_key` (target model, dataset, budget, decoding), the one in the same folder (the
    same sweep) first, then one of the same hierarchy; None if there is none. Returns the (directory,
    config) pair chosen; a greedy run among them is its own reference."""
    run_dir = Path(run_dir)
    key, hierarchy = target_key(config), config["models"].get("name")
    matching = [(d, c) for d, c in candidates if is_greedy_reference(c) and target_key(c) == key]
    matching.sort(key=lambda pair: (Path(pair[0]).parent != run_dir.parent, pair[1]["models"].get("name") != hierarchy))
    return matching[0] if matching else None


def find_greedy_reference(run_dir: Path, config: Mapping[str, Any], reference_run: str | None) -> Path | None:
    """`reference_run` if given (checked to match), else a matching finished greedy sibling in the same
    multirun (one with its summary.json: a sibling still running is not a reference yet)."""
    run_dir = Path(run_dir)
    if reference_run:
        reference = Path(reference_run)
        ref_config = read_config(reference)
        if not is_greedy_reference(ref_config):
            raise ResultsError(f"reference_run {reference} is a {ref_config['strategy']['name']!r} run, not greedy")
        if target_key(ref_config) != target_key(config):
            raise ResultsError(
                f"reference_run {reference} is not comparable: it differs in target model, dataset or max_new_tokens"
            )
        return reference
    if is_greedy_reference(config):
        return None
    found = pick_reference(run_dir, config, _readable_configs(_finished_siblings(run_dir)))
    return found[0] if found else None


def _finished_siblings(run_dir: Path) -> list[Path]:
    """The other finished runs (holding summary.json) in the directory of `run_dir`, in natural order."""
    run_dir = Path(run_dir)
    return [d for d in sorted(run_dir.parent.iterdir(), key=_natural_key) if d != run_dir and is_run_dir(d)]


def _readable_configs(directories: Iterable[Path]) -> Iterator[tuple[Path, dict]]:
    """(directory, config) of each directory holding a readable run config; the others are skipped."""
    for directory in directories:
        if (directory / CONFIG).exists():
            try:
                yield directory, read_config(directory)
            except ResultsError:
                continue


def compare_with_reference(records: Sequence[Mapping], reference_records: Sequence[Mapping]) -> dict[str, Any]:
    """identical_to_greedy "n/m" and speedup (greedy ms/token / this ms/token) over the samples both hold."""
    by_id = {r["sample_id"]: r for r in reference_records}
    common = [r for r in records if r["sample_id"] in by_id]
    if not common:
        return {"identical_to_greedy": None, "speedup_vs_greedy": None}
    identical = sum(r["output_ids"] == by_id[r["sample_id"]]["output_ids"] for r in common)
    mine = ratio(sum(r["time_s"] for r in common), sum(r["new_tokens"] for r in common))
    theirs = ratio(
        sum(by_id[r["sample_id"]]["time_s"] for r in common), sum(by_id[r["sample_id"]]["new_tokens"] for r in common)
    )
    return {
        "identical_to_greedy": f"{identical}/{len(common)}",
        "speedup_vs_greedy": ratio(theirs, mine) if mine and theirs else None,
    }


def refresh_reference(run_dir: Path, reference_run: str | None = None) -> dict | None:
    """Fill summary.json's identical_to_greedy, identity and speedup_vs_greedy from its greedy reference.

    The reference is `reference_run`, else the run's own `run.reference_run` option, else the preferred
    finished greedy sibling (`pick_reference`), chosen anew on every call. A greedy run without an explicit
    reference refreshes instead its finished comparable siblings: a greedy run that finishes after them
    (jobs of a sweep run in any order on a cluster) still ends up as their reference. Returns the run's
    summary."""
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    explicit = reference_run or (config.get("run") or {}).get("reference_run")
    if explicit or not is_greedy_reference(config):
        return _refresh_one(run_dir, explicit)
    key = target_key(config)
    for sibling, sibling_config in _readable_configs(_finished_siblings(run_dir)):
        if not is_greedy_reference(sibling_config) and target_key(sibling_config) == key:
            try:
                refresh_reference(sibling)
            except ResultsError:
                continue  # a broken sibling is reported when it is collected, not by this run
    return read_summary(run_dir)


def _refresh_one(run_dir: Path, reference_run: str | None) -> dict:
    """refresh_reference of one run: read, compare and rewrite its summary under its summary lock."""
    with summary_lock(run_dir):
        summary, config = read_summary(run_dir), read_config(run_dir)
        reference = find_greedy_reference(run_dir, config, reference_run)
        if reference is None:
            return summary
        records, _ = read_records(run_dir)
        reference_records, _ = read_records(reference)
        summary.update(compare_with_reference(records, reference_records))
        summary["identity"] = classify_identity(records, reference_records, run_near_tie_threshold(config))
        if (config.get("sampling") or {}).get("temperature", 0):
            summary["identical_to_greedy"] = None  # sampled outputs are equal in distribution, not token by token
            summary["identity"] = None
        summary["reference_run"] = str(reference)
        atomic_write_json(run_dir / SUMMARY, summary)
        return summary
