"""One experiment run: a hierarchy, a strategy and a dataset, measured into a run directory.

    summary = run_experiment(config, run_dir)

`config` is an `experiments.run_config.RunConfig`, or the plain mapping it is made from,
shaped like the composed `conf/config.yaml` (models, strategy, dataset, max_new_tokens,
sampling, acceptance, run); Hydra is only the entry point (`experiments/run.py`), so this
module works without it. The run:

1. checks every option (`RunConfig.from_config`) and the hierarchy, once
   (`check_run_hierarchy`: the target's tokenizer, EOS ids and context length, handed to
   the pipeline), loads the dataset and builds its prompts (`experiments.data.prompts_for`),
   and under `strategy=auto` makes the choice (`experiments.auto`), all before any
   process starts;
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
import sys
from pathlib import Path
from typing import Any, Mapping

from tqdm import tqdm

import pipespec.api  # its stage server's start and stop looked up at each run (the tests replace them)
from analysis.rundir import RunStore, ResultsError, read_config, refresh_reference, stage_stats, summarize_run
from experiments.auto import AutoPipeline, choose_for_run
from experiments.data import DatasetPrompts, Prompt, render_prompt_text
from experiments.data.quality import QualitySetup, quality_setup
from experiments.data.spec_bench import history_answer, record_fields, sample_turns, turn_prompt_ids, turn_prompt_text
from experiments.machine import environment
from experiments.run_config import RunConfig
from pipespec.api import Pipeline
from pipespec.gpu import GpuMonitor, sample_gpu_figures
from pipespec.hierarchy import CheckedHierarchy, check_hierarchy
from pipespec.stats import StageStats, pool


class RunError(RuntimeError):
    """The run cannot start or go on; the message names the option or the directory."""


# ---- per sample ---------------------------------------------------------------------


TASK_METRICS = {"summarization": "rouge", "code": "pass@1"}  # quality_of's metric where none is given


def quality_of(sample, text: str, task: str, family: str, execute_code: bool, setup=None) -> dict[str, Any] | None:
    """The output's quality as `setup` (an `experiments.data.quality.QualitySetup`: the run's dataset.metric)
    scores it; without one, by task: ROUGE F1 against the reference summary, or (with `execute_code`)
    whether the HumanEval tests pass."""
    setup = setup or QualitySetup(TASK_METRICS.get(task), execute_code)
    return setup.score(sample, text, family)


def run_quality(run: RunConfig):
    """The run's scoring (`experiments.data.quality.quality_setup` of its dataset section; the metric module is
    loaded once per process)."""
    return quality_setup(run.dataset, run.options.execute_code)


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


def open_store(run_dir: Path, config: Mapping[str, Any], resume: bool) -> RunStore:
    """A fresh run directory, or (resume) one holding the same config; never mixes two configs."""
    check_run_dir(run_dir, config, resume)
    return RunStore(run_dir)


def check_hydra_run_dir(cfg: Mapping[str, Any], run_dir: str | Path) -> None:
    """`check_run_dir` of `python -m experiments.run`'s composed config, before Hydra writes its `.hydra/` files
    (`experiments.callbacks.CheckRunDirectory`)."""
    check_run_dir(Path(run_dir), cfg, bool(cfg.get("run", {}).get("resume")))


def check_run_dir(run_dir: Path, config: Mapping[str, Any], resume: bool) -> None:
    """Whether `run_dir` may take a run of `config`: one holding results only with resume, and then only with
    the same config; a `RunError` naming what differs."""
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


def check_run_hierarchy(run: RunConfig) -> CheckedHierarchy:
    """The run's hierarchy checked once (`pipespec.hierarchy.check_hierarchy`: a shared vocabulary, the
    target's tokenizer, EOS ids and context length), for its prompts and its pipeline alike. The run's call
    options, planned against these stages by `RunConfig.from_config`, are recorded as planned (not under
    strategy auto, whose chosen configuration the pipeline plans)."""
    checked = check_hierarchy(run.stages)
    return checked if run.is_auto else checked.planned_with(run.call)


def run_prompts(run: RunConfig, checked: CheckedHierarchy) -> DatasetPrompts:
    """The run's prompts, built once before anything starts, with the target's tokenizer and context length."""
    return run.prompts(checked.tokenizer, checked.context_length)


def prepare(run: RunConfig) -> tuple[RunConfig, DatasetPrompts, Any, CheckedHierarchy]:
    """(the run as it runs, its prompts, the auto choice or None, its hierarchy checked): under strategy auto,
    at the configuration the machine profile predicts fastest (`experiments.auto`)."""
    checked = check_run_hierarchy(run)
    prompts = run_prompts(run, checked)
    if not run.is_auto:
        return run, prompts, None, checked
    choice = choose_for_run(run, prompts)
    return run.chosen(choice), prompts, choice, checked


def make_pipeline(full: RunConfig, run: RunConfig, auto, checked: CheckedHierarchy | None = None):
    """The run's pipeline: at auto's choice (`run`), or, when auto learns, every stage of the hierarchy
    (`full`) with the choice as the first call's configuration (`experiments.auto.AutoPipeline`). `checked`:
    the hierarchy's checks (`check_run_hierarchy`), which the pipeline then does not repeat."""
    if auto is None or not full.learn:
        return Pipeline(list(run.stages), checked=checked, **run.pipeline_options())

    options = {k: v for k, v in run.pipeline_options().items() if k not in ("strategy", "lookahead", "max_lead")}
    return AutoPipeline(list(full.stages), choice=auto, learn=True, checked=checked, **options)


def run_sample(pipe, run: RunConfig, prompt: Prompt, task: str) -> tuple[dict, dict]:
    """Generate one sample (each turn of a multi-turn question in turn): its record (samples.jsonl) and trace."""
    if len(sample_turns(prompt.sample)) > 1:
        return run_conversation(pipe, run, prompt)
    result = pipe.generate(prompt.ids, run.budget, seed=run.call.seed + prompt.index)
    quality = quality_of(prompt.sample, result.text, task, run.family, run.options.execute_code, run_quality(run))
    text = render_prompt_text(prompt.sample.source, run.dataset["prompt"], pipe.tokenizer, run.family)
    record = sample_record(prompt.index, prompt.sample, text, prompt.ids, prompt.truncated, result, quality)
    record.update(record_fields(prompt.sample))
    trace = {"sample_id": prompt.sample_id, "index": prompt.index, "stages": [t.to_dict() for t in result.stage_traces]}
    return record, trace


def run_conversation(pipe, run: RunConfig, prompt: Prompt) -> tuple[dict, dict]:
    """A multi-turn question (`experiments.data.spec_bench`): one generation per turn, each prompt holding the
    earlier turns and the model's own answers. The record's top-level figures are the turns' totals (output ids
    and margins concatenated, stage counts pooled), with each turn's own under `turns`; the trace holds turn 0's
    stages at the top (the format's required list) and every turn's under `turns`."""
    sample, answers, results, texts = prompt.sample, [], [], []
    for turn in range(len(sample_turns(sample))):
        ids, truncated = (prompt.ids, prompt.truncated) if turn == 0 else turn_prompt_ids(
            sample, turn, answers, run.dataset["prompt"], pipe.tokenizer, run.family, pipe.context_length, run.budget)
        texts.append(turn_prompt_text(sample, turn, answers, run.dataset["prompt"], pipe.tokenizer, run.family))
        results.append((ids, truncated, pipe.generate(ids, run.budget, seed=run.call.seed + prompt.index)))
        answers.append(history_answer(results[-1][2].text))
    record = _conversation_record(prompt, texts, results)
    record.update(record_fields(sample))
    trace = {"sample_id": prompt.sample_id, "index": prompt.index,
             "stages": [t.to_dict() for t in results[0][2].stage_traces],
             "turns": [{"stages": [t.to_dict() for t in result.stage_traces]} for _, _, result in results]}  # fmt: skip
    return record, trace


def _conversation_record(prompt: Prompt, texts: list[str], results: list) -> dict:
    first_ids, first_truncated, first = results[0]
    record = sample_record(prompt.index, prompt.sample, texts[0], first_ids, first_truncated, first, None)
    outputs = [result for _, _, result in results]
    tokens = [t for result in outputs for t in result.tokens]
    seconds = sum(result.time_s for result in outputs)
    per_stage = zip(*(result.summary() for result in outputs))
    record.update({
        "output_ids": tokens, "output_text": "\n".join(result.text for result in outputs), "new_tokens": len(tokens),
        "time_s": seconds, "tokens_per_s": len(tokens) / seconds if seconds > 0 else None,
        "stages": [pool(StageStats.from_dict(s) for s in stages).as_dict(stages[0]["name"]) for stages in per_stage],
        "target_margins": [m for result in outputs for m in (result.margins or [])],
        "turns": [{"prompt": text, "prompt_tokens": len(ids), "truncated": truncated, "output_ids": result.tokens,
                   "output_text": result.text, "new_tokens": len(result.tokens), "time_s": result.time_s,
                   "stages": result.summary(), "target_margins": result.margins}
                  for text, (ids, truncated, result) in zip(texts, results)],
    })  # fmt: skip
    return record


def run_experiment(config: RunConfig | Mapping[str, Any], run_dir: str | Path,
                   progress: bool | None = None) -> dict[str, Any]:  # fmt: skip
    """Run `config` (a `RunConfig`, or the composed dict it is made from) into `run_dir`; the summary."""
    run = config if isinstance(config, RunConfig) else RunConfig.from_config(config)
    run_dir = Path(run_dir)
    progress = run.options.progress if progress is None else progress
    started_server = pipespec.api.warm_stage_server()  # the stage processes' imports run while the prompts are prepared
    try:  # every check (options, vocabularies, prompt lengths) runs before anything is written
        full, (run, prompts, auto, checked) = run, prepare(run)
        pipe = make_pipeline(full, run, auto, checked)
        store = open_store(run_dir, run.raw, run.options.resume)
    except BaseException:
        if started_server:
            pipespec.api.stop_stage_server()
        raise
    todo = [p for p in prompts.prompts if p.sample_id not in store.finished_ids]
    if not todo and started_server:  # a finished run resumed: no stage starts, so no server to keep importing
        pipespec.api.stop_stage_server()
    if todo:  # a finished run resumed measures nothing: its config and environment stay as they were
        store.write_config(run.raw)
        store.write_env(environment(list(pipe.specs)))
    if store.records:
        print(f"resuming {run_dir}: {len(store.records)} samples done, {len(todo)} to go", file=sys.stderr)
    dataset = prompts.dataset
    monitor = GpuMonitor(run_dir / "gpu.csv") if run.options.gpu_monitor else contextlib.nullcontext()
    with monitor, pipe if todo else contextlib.nullcontext():  # a finished run resumed starts no stage
        if todo and run.options.warmup_tokens:
            pipe.generate(todo[0].ids, run.options.warmup_tokens)
        label = f"{run.hierarchy} {run.call.strategy} {dataset.name}"
        bar = tqdm(todo, desc=label, disable=not progress, file=sys.stderr, unit="sample")
        for prompt in bar:
            record, trace = run_sample(pipe, run, prompt, dataset.task)
            if getattr(pipe, "learn", False):  # auto that learns: what this sample ran, and what runs next
                record["auto"] = pipe.decisions[-1]
            store.append(record, trace)
            bar.set_postfix_str(_live_figures(store.records))
    summary = summarize_run(run.recorded(), store.records, complete=len(store.records) == len(dataset.samples))
    summary["dataset_description"] = dataset.description()
    if auto is not None:
        summary["auto"] = {**auto.record(), **({"calls": pipe.decisions} if getattr(pipe, "learn", False) else {})}
    store.write_summary(summary)
    try:
        summary = refresh_reference(run_dir, run.options.reference_run)
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
