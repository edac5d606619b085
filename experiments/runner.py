"""One experiment run: a hierarchy, a strategy and a dataset, measured into a run directory.

    summary = run_experiment(config, run_dir)

`config` is a plain mapping shaped like the composed `conf/config.yaml` (models,
strategy, dataset, max_new_tokens, acceptance, run); Hydra is only the entry
point (`experiments/run.py`), so this module works without it. The run:

1. loads the dataset and refuses bad options before any process starts;
2. opens the run directory (`analysis.rundir.RunStore`): a fresh one, or with
   `run.resume` an interrupted one whose finished samples are kept and skipped;
3. starts the pipeline, takes one short untimed generation (first-call
   allocations), then generates each remaining sample, appending its record and
   trace as soon as it is done;
4. writes `summary.json` with the pooled figures and, where a greedy reference
   exists (`run.reference_run`, or a sibling run of the same multirun), the
   identical-to-greedy count and the speedup.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any, Mapping

from pipespec.errors import ConfigError
from experiments.machine import environment
from pipespec.gpu import GpuMonitor, sample_gpu_figures
from analysis.rundir import RunStore, ResultsError, refresh_reference, stage_stats, summarize_run
from pipespec.schedule import DEFAULT_MAX_LEAD
from pipespec.stats import StageStats, pool


class RunError(RuntimeError):
    """The run cannot start or go on; the message names the option or the directory."""


# ---- per sample ---------------------------------------------------------------------


def quality_of(sample, text: str, task: str, family: str, execute_code: bool) -> dict[str, Any] | None:
    """ROUGE F1 against the reference summary, or (opted in) whether the HumanEval tests pass."""
    from experiments.data import check_completion, extract_code_block, rouge_per_sample, truncate_at_stop

    if task == "summarization" and sample.reference is not None:
        return rouge_per_sample([text], [sample.reference])[0]
    if task == "code" and execute_code:
        completion = extract_code_block(text) if family == "chat" else truncate_at_stop(text)
        result = check_completion(sample, completion, allow_code_execution=True)
        return {"passed": float(result["passed"]), "result": result["result"]}
    return None


def sample_record(index: int, sample, prompt_text: str, prompt_ids, truncated: bool, result, quality) -> dict:
    return {
        "sample_id": sample.sample_id,
        "index": index,
        "prompt": prompt_text,
        "prompt_tokens": len(prompt_ids),
        "truncated": truncated,
        "output_ids": result.tokens,
        "output_text": result.text,
        "new_tokens": len(result.tokens),
        "time_s": result.time_s,
        "tokens_per_s": len(result.tokens) / result.time_s if result.time_s > 0 else None,
        "stages": result.summary(),
        "sampling": result.sampling,
        "acceptance": result.acceptance,
        "quality": quality,
        # the target's top-2 logit margin at each output token: classifies mismatches with greedy
        "target_margins": result.margins,
        # per GPU the stages ran on: this sample's utilisation, peak memory, power, energy (None on CPU)
        "gpu": sample_gpu_figures([t.to_dict() for t in result.stage_traces]),
    }


# ---- the run ----------------------------------------------------------------------------


def check_run_config(config: Mapping[str, Any]) -> None:
    """Options the engine does not check itself, named as the user types them."""
    budget = config.get("max_new_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
        raise ConfigError(f"max_new_tokens must be an integer > 0, got {budget!r}")
    family = config["models"].get("family", "base")
    if family not in ("base", "chat"):
        raise ConfigError(f"models.family must be 'base' or 'chat', got {family!r}")


def open_store(run_dir: Path, config: Mapping[str, Any], resume: bool) -> RunStore:
    """A fresh run directory, or (resume) one holding the same config; never mixes two configs."""
    from analysis.rundir import read_config

    existing = (run_dir / "samples.jsonl").exists()
    if existing and not resume:
        raise RunError(
            f"{run_dir} already holds results: pass run.resume=true to continue it, or choose a new hydra.run.dir"
        )
    if existing:
        try:
            previous = read_config(run_dir)
        except ResultsError as error:
            raise RunError(f"cannot resume: {error}") from None
        keys = ("models", "strategy", "dataset", "max_new_tokens", "acceptance")
        differing = [k for k in keys if previous.get(k) != config.get(k)]
        if differing:
            raise RunError(f"cannot resume {run_dir}: it was run with different {', '.join(differing)}")
    return RunStore(run_dir)


def run_experiment(config: Mapping[str, Any], run_dir: str | Path, progress: bool | None = None) -> dict[str, Any]:
    from tqdm import tqdm

    from pipespec.api import Pipeline
    from experiments.data import build_prompt_ids, load_dataset, render_prompt_text
    from experiments.hierarchies import resolve_stages

    run_dir = Path(run_dir)
    options = config.get("run") or {}
    progress = options.get("progress", True) if progress is None else progress
    check_run_config(config)
    specs = resolve_stages(config["models"]["stages"])
    dataset = load_dataset(config["dataset"])
    family = config["models"].get("family", "base")
    strategy = config["strategy"]
    budget = config["max_new_tokens"]
    template = config["dataset"]["prompt"]
    sampling = config.get("sampling") or {}
    acceptance = config.get("acceptance") or {}
    auto = None
    if strategy["name"] == "auto":  # the configuration the machine profile predicts fastest (experiments.auto)
        from experiments.auto import choose_for_run

        auto = choose_for_run(config, specs, dataset)
        specs = [specs[i] for i in auto.stages]
        strategy = {**strategy, "name": auto.strategy, "lookahead": auto.lookahead, "max_lead": auto.max_lead}
    # every check (vocabularies, options, prompt lengths) runs before anything is written
    pipe = Pipeline(
        specs,
        strategy=strategy["name"],
        lookahead=strategy.get("lookahead", 0),
        max_lead=strategy.get("max_lead", DEFAULT_MAX_LEAD),
        draft_confidence=strategy.get("draft_confidence", 0.0),
        size_verification=strategy.get("size_verification", False),
        cascade=strategy.get("cascade", False),
        value_stop=strategy.get("value_stop", 0.0),
        stall_timeout_s=options.get("stall_timeout_s", 30),
        start_timeout_s=options.get("start_timeout_s", 600),
        temperature=sampling.get("temperature", 0.0),
        top_k=sampling.get("top_k", 0),
        top_p=sampling.get("top_p", 1.0),
        seed=sampling.get("seed", 0),
        acceptance=acceptance.get("mode", "exact"),
        synthetic_rates=acceptance.get("rate"),
    )
    store = open_store(run_dir, config, bool(options.get("resume")))
    todo = [(i, s) for i, s in enumerate(dataset.samples) if s.sample_id not in store.finished_ids]
    prompts = {i: build_prompt_ids(s, template, pipe.tokenizer, family, pipe.context_length, budget) for i, s in todo}
    store.write_config(config)
    store.write_env(environment(specs))
    if store.records:
        print(f"resuming {run_dir}: {len(store.records)} samples done, {len(todo)} to go", file=sys.stderr)
    monitor = GpuMonitor(run_dir / "gpu.csv") if options.get("gpu_monitor", True) else contextlib.nullcontext()
    with monitor, pipe:
        if todo and options.get("warmup_tokens", 8):
            pipe.generate(prompts[todo[0][0]][0], options["warmup_tokens"])
        label = f"{config['models']['name']} {strategy['name']} {dataset.name}"
        bar = tqdm(todo, desc=label, disable=not progress, file=sys.stderr, unit="sample")
        for index, sample in bar:
            prompt_ids, truncated = prompts[index]
            result = pipe.generate(prompt_ids, budget, seed=sampling.get("seed", 0) + index)
            quality = quality_of(sample, result.text, dataset.task, family, bool(options.get("execute_code")))
            prompt_text = render_prompt_text(sample.source, template, pipe.tokenizer, family)
            store.append(
                sample_record(index, sample, prompt_text, prompt_ids, truncated, result, quality),
                {"sample_id": sample.sample_id, "index": index, "stages": [t.to_dict() for t in result.stage_traces]},
            )
            bar.set_postfix_str(_live_figures(store.records))
    summary = summarize_run({**config, "strategy": strategy}, store.records,
                            complete=len(store.records) == len(dataset.samples))  # fmt: skip
    summary["dataset_description"] = dataset.description()
    if auto is not None:
        summary["auto"] = auto.record()
    store.write_summary(summary)
    try:
        summary = refresh_reference(run_dir, options.get("reference_run"))
    except ResultsError as error:
        raise RunError(str(error)) from None
    return summary


def _live_figures(records) -> str:
    """Progress-bar figures: tokens/s and the target's mean acceptance length so far."""
    tokens = sum(r["new_tokens"] for r in records)
    seconds = sum(r["time_s"] for r in records)
    target = pool(stage_stats(r)[-1] for r in records)
    length = target.mean_acceptance_length
    return f"{tokens / seconds:.1f} tok/s" + (f", target mean acceptance length {length:.2f}" if length else "")


def format_run(summary: Mapping[str, Any]) -> str:
    """The table printed at the end of a run: overall figures, then one line per stage."""
    def fmt(value, spec=".2f"):
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    stand_in = " (STAND-IN)" if summary.get("stand_in") else ""
    if not summary.get("lossless", True):
        stand_in += " [synthetic acceptance: NOT lossless, benchmarking only]"
    lines = [
        f"{summary['strategy']} (lookahead {summary['lookahead']}) on {summary['models']}, "
        f"{summary['dataset_label']}{stand_in}: {summary['n_samples']} samples, {summary['new_tokens']} tokens",
        f"  {fmt(summary['ms_per_token'])} ms/token, {fmt(summary['tokens_per_s'])} tokens/s; "
        f"identical to greedy: {summary['identical_to_greedy'] or '-'}; "
        f"speedup vs greedy: {fmt(summary['speedup_vs_greedy'])}",
        f"  {'stage':<24}{'mean acc. len':>14}{'draft acc. rate':>16}{'verify frac':>12}{'busy':>7}",
    ]
    for stage in summary["stages"]:
        stats = StageStats.from_dict(stage)
        lines.append(
            f"  {stage['name'][:23]:<24}{fmt(stats.mean_acceptance_length):>14}{fmt(stats.draft_acceptance_rate):>16}"
            f"{fmt(stats.verify_fraction):>12}{fmt(stats.busy_fraction):>7}"
        )
    if summary.get("quality"):
        lines.append("  quality: " + ", ".join(f"{k} {v:.3f}" for k, v in summary["quality"].items()))
    return "\n".join(lines)
