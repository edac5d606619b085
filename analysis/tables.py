"""Paper tables: a paired sweep's table, and Table 2 (our CPU rows beside the authors' GPU rows), as Markdown
and LaTeX (booktabs).

    table = sweep_table("results/validation_paired/smollm2_pld_int8_fp32/humaneval/sweep")
    print(to_markdown(table)); print(to_latex(table))
    table2 = table2_humaneval([SWEEP_DIR, ...])      # the authors' logs: analysis.import_official.DEFAULT_DIR

A sweep's rows come in a reader's order (`analysis.names.configuration_key`: greedy, SD by lookahead, PipeSpec by
lookahead and max lead), each with: tok/s, the geometric mean over prompts of each prompt's mean log tok/s, and
its 95% interval with the prompts resampled; the speedup against greedy paired on the same prompt and
repetition and its 95% interval with the prompts resampled (both from `analysis.paired`: `paired.json`'s
`sampling_interval` and the same `bootstrap_sampling`); the target's mean acceptance length (bonus included,
tokens appended per verification); identical to greedy (n/n, from summary.json); and the quality the run
recorded (pass@1 with passed/scored, or ROUGE-L), "no reference" where the dataset has nothing to score
against, or the command that records it. The caption names the command, the machine (env.json) and the sample
size. Pure Python and numpy, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from analysis.names import (
    HIERARCHY_STAGES,
    SHORT_STRATEGY_NAMES,
    configuration_key,
    configuration_name,
    dataset_name,
    hierarchy_name,
)
from analysis.paired import bootstrap_sampling, sweep_samples
from analysis.rundir import ResultsError, read_config, read_env, read_records, read_summary
from pipespec.stats import StageStats

ROOT = Path(__file__).resolve().parents[1]  # the repository: TABLE2_SWEEPS are read there when not found here
PAIRED = "paired.json"
REFERENCE = "greedy"
PAIRED_COMMAND = "python -m analysis.paired {sweep} --json > {sweep}/paired.json"
SCORE_COMMAND = "python -m experiments.score {run}"
NO_REFERENCE = "no reference"
AUTHORS_HARDWARE = "4x A100-40GB (NVLink), LLaMA-3.1-70B in NF4 over 2 GPUs"
# the committed paired HumanEval sweeps whose rows Table 2 shows beside the authors'
TABLE2_SWEEPS = tuple(f"results/validation_paired/{h}/humaneval/sweep"
                      for h in ("smollm2_int8_fp32", "smollm2_pld_int8_fp32", "smollm2_suffix_fp32"))  # fmt: skip


@dataclass(frozen=True)
class Table:
    """A table ready to print: a caption, column names, and sections of rows of text cells (a section's title,
    if any, is a row of its own)."""

    caption: str
    columns: tuple[str, ...]
    sections: tuple[tuple[str | None, tuple[tuple[str, ...], ...]], ...]
    align: str  # LaTeX column types, one per column (l / r)
    label: str  # LaTeX \label


# ---- numbers of a sweep ----------------------------------------------------------------------------------


def read_paired(sweep_dir: Path) -> dict[str, dict]:
    """paired.json of a sweep by configuration; a `ResultsError` naming the command that makes it."""
    import json

    path = sweep_dir / PAIRED
    if not path.is_file():
        raise ResultsError(f"{sweep_dir}: no {PAIRED}; make it with: {PAIRED_COMMAND.format(sweep=sweep_dir)}")
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        return {e["configuration"]: e for e in entries}
    except (ValueError, TypeError, KeyError):
        raise ResultsError(f"{path}: not a paired sweep's table; make it again with: "
                           f"{PAIRED_COMMAND.format(sweep=sweep_dir)}") from None  # fmt: skip


def tokens_per_s(sweep_dir: Path, seed: int = 0) -> dict[str, tuple[float, tuple[float, float]]]:
    """Per configuration: tok/s (geometric mean over prompts of each prompt's mean log tok/s over repetitions)
    and its 95% interval with the prompts resampled (`analysis.paired.bootstrap_sampling`)."""
    by_config: dict[str, dict[str, list[float]]] = {}
    for sample in sweep_samples(sweep_dir):
        if sample.tokens > 0 and sample.seconds > 0:
            by_config.setdefault(sample.configuration, {}).setdefault(sample.prompt, []).append(
                math.log(sample.tokens_per_s))
    out = {}
    for name, by_prompt in by_config.items():
        per_prompt = [by_prompt[p] for p in sorted(by_prompt)]
        center = math.exp(float(np.mean([np.mean(v) for v in per_prompt])))
        out[name] = (center, bootstrap_sampling(per_prompt, np.random.default_rng(seed)))
    return out


def quality_cell(run_dir: Path, config: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    """pass@1 "0.250 (6/24)", ROUGE-L "0.312", "no reference", or the command that records the quality."""
    scores = [r["quality"] for r in records if isinstance(r.get("quality"), Mapping)]
    passed = [float(q["passed"]) for q in scores if "passed" in q]
    if passed:
        return f"{sum(passed) / len(passed):.3f} ({round(sum(passed))}/{len(passed)})"
    rouge = [float(q["rougeL"]) for q in scores if "rougeL" in q]
    if rouge:
        return f"{sum(rouge) / len(rouge):.3f}"
    dataset = config.get("dataset") or {}
    if dataset.get("metric") is None or dataset.get("stand_in"):
        return NO_REFERENCE
    return "not recorded: " + SCORE_COMMAND.format(run=run_dir)


def quality_column(config: Mapping[str, Any]) -> str:
    metric = (config.get("dataset") or {}).get("metric")
    return {"pass@1": "pass@1", "rouge": "ROUGE-L"}.get(metric, "quality")


def sweep_rows(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The sweep's configurations in a reader's order, each with its numbers (`sweep_table`'s rows)."""
    sweep_dir = Path(sweep_dir)
    paired = read_paired(sweep_dir)
    rates = tokens_per_s(sweep_dir)
    rows = []
    for name in sorted(paired, key=configuration_key):
        run_dir = sweep_dir / name
        summary, config = read_summary(run_dir), read_config(run_dir)
        records, _ = read_records(run_dir)
        target = StageStats.from_dict(summary["stages"][-1]) if summary["stages"] else None
        entry = paired[name]
        rows.append({
            "configuration": name, "strategy": summary["strategy"], "models": summary["models"],
            "tokens_per_s": rates[name][0], "tokens_per_s_interval": rates[name][1],
            "speedup": entry["speedup"], "speedup_interval": tuple(entry["sampling_interval"]),
            "mean_acceptance_length": target.mean_acceptance_length if target else None,
            "identical_to_greedy": "reference" if name == REFERENCE else summary.get("identical_to_greedy"),
            "quality": quality_cell(run_dir, config, records),
            "prompts": entry["prompts"], "repetitions": entry["repetitions"],
        })  # fmt: skip
    return rows


def same_quality_note(rows: Sequence[Mapping[str, Any]], column: str) -> str:
    """ "pass@1 is the same in every row. " where every row recorded the same score (as it must be where every
    output is greedy's); "" otherwise."""
    cells = {r["quality"] for r in rows}
    if len(cells) != 1 or not next(iter(cells))[:1].isdigit():
        return ""
    return f"{column} is the same in every row. "


def machine(env: Mapping[str, Any]) -> str:
    """ "AMD EPYC (family 25, model 17, AVX512), 2 cores, torch 2.13.0+cpu" from a run's env.json."""
    info = env.get("cpu_info") or {}
    details = [f"family {info['family']}" if info.get("family") else None,
               f"model {info['model']}" if info.get("model") else None, info.get("torch_capability")]  # fmt: skip
    name = env.get("cpu") or info.get("name") or "unknown CPU"
    text = name + (f" ({', '.join(d for d in details if d)})" if any(details) else "")
    if env.get("gpus"):
        text = ", ".join(str(g.get("name", g)) if isinstance(g, Mapping) else str(g) for g in env["gpus"])
    if env.get("cpu_count"):
        text += f", {env['cpu_count']} cores"
    return text + (f", torch {env['torch']}" if env.get("torch") else "")


def sample_size(rows: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> str:
    reference = next(r for r in rows if r["configuration"] == REFERENCE) if any(
        r["configuration"] == REFERENCE for r in rows) else rows[0]
    return (f"{reference['prompts']} prompts x {reference['repetitions']} repetitions x "
            f"{config['max_new_tokens']} new tokens at most")  # fmt: skip


# ---- cells ------------------------------------------------------------------------------------------------


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def with_interval(value: float, interval: Sequence[float] | None, digits: int = 2) -> str:
    if interval is None:
        return _number(value, digits)
    return f"{value:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def sweep_table(sweep_dir: str | Path, command: str | None = None) -> Table:
    """The paper table of a paired sweep (one row per configuration); `command` the one the caption names."""
    sweep_dir = Path(sweep_dir)
    rows = sweep_rows(sweep_dir)
    greedy_dir = sweep_dir / (REFERENCE if (sweep_dir / REFERENCE).is_dir() else rows[0]["configuration"])
    config, env = read_config(greedy_dir), read_env(greedy_dir)
    models = config["models"]["name"]
    body = tuple(
        (configuration_name(r["configuration"]),
         with_interval(r["tokens_per_s"], r["tokens_per_s_interval"], 1),
         with_interval(r["speedup"], r["speedup_interval"]) if r["configuration"] != REFERENCE else "1.00",
         _number(r["mean_acceptance_length"]), str(r["identical_to_greedy"] or "-"), r["quality"])
        for r in rows)  # fmt: skip
    caption = (
        f"{hierarchy_name(models)} on {dataset_name(config['dataset']['name'])}: a paired, interleaved sweep, "
        f"{sample_size(rows, config)}, on {machine(env)}. tok/s: geometric mean over prompts; speedup: against "
        "greedy on the same prompt and repetition (geometric mean); 95% intervals with the prompts resampled "
        "(paired bootstrap); mean acceptance length: the target's tokens per verification, bonus included. "
        f"{same_quality_note(rows, quality_column(config))}"
        f"Command: {command or f'python -m experiments.collect {sweep_dir}'}."
    )
    columns = ("configuration", "tok/s [95% CI]", "speedup vs greedy [95% CI]", "mean acceptance length",
               "identical to greedy", quality_column(config))  # fmt: skip
    label = f"tab:{models}_{config['dataset']['name']}".replace("_", "-")
    return Table(caption, columns, ((None, body),), "lrrrrl", label)


# ---- Table 2: the authors' GPU rows and ours ----------------------------------------------------------------


def official_rows(directory: str | Path | None = None) -> list[dict[str, Any]]:
    """The authors' Table 2 rows for HumanEval, read from their logs: every log of the largest target
    (LLaMA-3.1-70B), AR / SD / PipeSpec, tok/s = 1000 / pooled ms per token, speedup against their AR log."""
    from analysis.import_official import DEFAULT_DIR, STRATEGY_NAMES, largest_target_logs, load_dir, summarize_logs

    logs = largest_target_logs(load_dir(directory or DEFAULT_DIR))
    by_file = {log.path.name: log for log in logs}
    rows = []
    for summary in summarize_logs(logs):
        log = by_file[summary.file]
        strategy = STRATEGY_NAMES[summary.strategy]
        rows.append({
            "method": SHORT_STRATEGY_NAMES[strategy], "models": hierarchy_name(log.model_paths),
            "configuration": "-" if strategy == "greedy" else f"lookahead {summary.lookahead} (as logged)",
            "ms_per_token": summary.ms_per_token, "tokens_per_s": 1000.0 / summary.ms_per_token,
            "tokens_per_s_interval": None, "speedup": summary.speedup, "speedup_interval": None,
            "mean_acceptance_length": summary.accepted_per_verify[-1] if summary.accepted_per_verify else None,
            "identical_to_greedy": "-", "quality": "-", "samples": summary.samples, "file": summary.file,
        })  # fmt: skip
    return rows


def our_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Of a sweep's rows (`sweep_rows`), greedy's and the fastest SD and PipeSpec configurations' (point
    estimates), in Table 2's shape."""
    chosen = [r for r in rows if r["configuration"] == REFERENCE]
    for strategy in ("sd", "pipespec"):
        candidates = [r for r in rows if r["strategy"] == strategy]
        if candidates:
            chosen.append(max(candidates, key=lambda r: r["speedup"]))
    return [{**r, "method": SHORT_STRATEGY_NAMES.get(r["strategy"], r["strategy"]),
             "models": hierarchy_name(HIERARCHY_STAGES.get(r["models"], (r["models"],))[-1:])
             if r["strategy"] == REFERENCE else hierarchy_name(r["models"]),
             "configuration": "-" if r["configuration"] == REFERENCE else configuration_name(r["configuration"]),
             "ms_per_token": 1000.0 / r["tokens_per_s"],
             "speedup_interval": None if r["configuration"] == REFERENCE else r["speedup_interval"]}
            for r in chosen]  # fmt: skip


def table2_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    return (row["method"], row["models"], row["configuration"], _number(row["ms_per_token"]),
            with_interval(row["tokens_per_s"], row["tokens_per_s_interval"], 1),
            with_interval(row["speedup"], row["speedup_interval"]), _number(row["mean_acceptance_length"]),
            str(row["identical_to_greedy"] or "-"), row["quality"])  # fmt: skip


def table2_humaneval(sweeps: Sequence[str | Path] = TABLE2_SWEEPS, official_dir: str | Path | None = None,
                     command: str = "python -m experiments.collect --table2") -> Table:  # fmt: skip
    """Table 2 for HumanEval: the authors' LLaMA-3.1-70B rows from their logs, then ours per sweep (a relative
    path not found here is read in the repository, and shown as given)."""
    official = official_rows(official_dir)
    sections = [(f"PipeSpec authors: {AUTHORS_HARDWARE}; greedy decoding, "
                 f"{'/'.join(sorted({str(r['samples']) for r in official}))} HumanEval samples per log",
                 tuple(table2_cells(r) for r in official))]  # fmt: skip
    for shown in sweeps:
        sweep = Path(shown) if Path(shown).is_dir() or Path(shown).is_absolute() else ROOT / shown
        rows = sweep_rows(sweep)
        greedy_dir = sweep / REFERENCE
        config, env = read_config(greedy_dir), read_env(greedy_dir)
        title = f"ours: SmolLM2-135M-Instruct on {machine(env)}; {sample_size(rows, config)} ({shown})"
        sections.append((title, tuple(table2_cells(r) for r in our_rows(rows))))
    caption = (
        "HumanEval, Table 2 of the paper beside ours. Authors' rows: every LLaMA-3.1-70B log they published "
        "(results/official/humaneval; the 1B -> 70B rows are in their logs, not in the paper's printed table; "
        "pooled ms per token, speedup against their AR run of the same target, "
        "mean acceptance length of the target's verifications as logged, bonus included; their PipeSpec logs "
        "say lookahead 0, the decoder ran at its then-default 5). Our rows: paired sweeps on one CPU "
        "machine, greedy and the fastest SD and PipeSpec configuration of each sweep (point estimate); tok/s "
        "geometric mean over prompts, speedup paired against greedy, 95% intervals with the prompts resampled. "
        f"Speedups compare within a section only. Command: {command}."
    )
    columns = ("method", "models", "configuration", "ms/token", "tok/s [95% CI]", "speedup [95% CI]",
               "mean acceptance length", "identical to greedy", "pass@1")  # fmt: skip
    return Table(caption, columns, tuple(sections), "lllrrrrrl", "tab:table2-humaneval")


# ---- output ------------------------------------------------------------------------------------------------

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}  # fmt: skip


def latex_escape(text: str) -> str:
    """`text` as LaTeX prints it literally (the ten special characters escaped), arrows as arrows."""
    escaped = "".join(_LATEX_SPECIAL.get(c, c) for c in str(text))
    return escaped.replace(" -> ", r" $\rightarrow$ ").replace("<", r"\textless{}").replace(">", r"\textgreater{}")


def _markdown_cell(text: str) -> str:
    return str(text).replace("|", r"\|").replace("\n", " ")


def to_markdown(table: Table) -> str:
    """The caption line, then a GitHub Markdown table; a section title is a bold row of its own."""
    lines = [f"Table: {table.caption}", "", "| " + " | ".join(map(_markdown_cell, table.columns)) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in table.align) + "|"]  # fmt: skip
    for title, rows in table.sections:
        if title:
            lines.append(f"| **{_markdown_cell(title)}** |" + " |" * (len(table.columns) - 1))
        lines += ["| " + " | ".join(map(_markdown_cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_latex(table: Table) -> str:
    """A booktabs table (\\toprule, \\midrule, \\bottomrule; needs \\usepackage{booktabs}), every text escaped;
    a section title spans the row."""
    lines = [r"\begin{table}[t]", r"\centering", r"\small", f"\\caption{{{latex_escape(table.caption)}}}",
             f"\\label{{{table.label}}}", f"\\begin{{tabular}}{{{table.align}}}", r"\toprule",
             " & ".join(latex_escape(c) for c in table.columns) + r" \\", r"\midrule"]  # fmt: skip
    for index, (title, rows) in enumerate(table.sections):
        if index:
            lines.append(r"\midrule")
        if title:
            lines.append(f"\\multicolumn{{{len(table.columns)}}}{{l}}{{\\emph{{{latex_escape(title)}}}}} \\\\")
        lines += [" & ".join(latex_escape(c) for c in row) + r" \\" for row in rows]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"
