"""Paper tables (analysis.tables, python -m experiments.collect): a paired sweep's table in a reader's order with
its intervals, Markdown and booktabs LaTeX, Table 2 read from the authors' logs, and the errors and notes a
reader gets instead of a traceback."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from analysis.import_official import DEFAULT_DIR, largest_target_logs, load_dir, pooled_ms_per_token
from analysis.names import configuration_key, configuration_name
from analysis.paired import paired_speedups, sweep_samples
from analysis.rundir import ResultsError
from analysis.tables import (
    NO_REFERENCE,
    Table,
    latex_escape,
    official_rows,
    our_rows,
    sweep_rows,
    sweep_table,
    table2_humaneval,
    to_latex,
    to_markdown,
)

ROOT = Path(__file__).resolve().parents[1]
# configuration -> its speed against greedy, and the target's (verify steps, accepted drafts) per sample
CONFIGURATIONS = {"greedy": (1.0, (0, 0)), "pipespec_L1_M4": (1.3, (5, 10)), "sd_L10": (1.1, (4, 12)),
                  "pipespec_L0_M16": (1.5, (5, 9)), "sd_L2": (1.2, (6, 6)),
                  "pipespec_L0_M8": (1.4, (5, 8))}  # fmt: skip
PROMPTS, REPETITIONS, TOKENS = ("HumanEval/0", "HumanEval/2"), 2, 16


def write_sweep(directory: Path, dataset: dict | None = None, quality=None, paired: bool = True) -> Path:
    """A crafted paired sweep: greedy at 10 tok/s on prompt 0 and 20 on prompt 1, every configuration its
    factor faster, identical outputs; `quality` (a function of the prompt) the records' quality."""
    dataset = dataset or {"name": "humaneval", "loader": "humaneval", "task": "code", "metric": "pass@1"}
    for name, (factor, (verify, accepted)) in CONFIGURATIONS.items():
        run = directory / name
        run.mkdir(parents=True)
        strategy = name.split("_")[0]
        config = {"models": {"name": "smollm2_pld_int8_fp32", "family": "chat", "stages": [{"name": "t"}]},
                  "strategy": {"name": strategy}, "dataset": dataset, "max_new_tokens": TOKENS,
                  "sweep": {"samples": len(PROMPTS), "repetitions": REPETITIONS}}  # fmt: skip
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        (run / "env.json").write_text(json.dumps({"cpu": "Test CPU", "cpu_info": {"family": "25", "model": "1"},
                                                  "cpu_count": 2, "torch": "2.0"}))  # fmt: skip
        target = {"name": "2:smollm2-fp32", "verify_steps": verify, "accepted": accepted}
        records = []
        for repetition in range(REPETITIONS):
            for p, prompt in enumerate(PROMPTS):
                rate = (10.0 if p == 0 else 20.0) * factor * (1 + 0.01 * repetition)
                records.append({"sample_id": f"{prompt}@r{repetition}", "index": len(records),
                                "output_ids": [1] * TOKENS, "output_text": "x", "new_tokens": TOKENS,
                                "time_s": TOKENS / rate, "stages": [target],
                                "quality": quality(prompt) if quality else None,
                                "slot": {"prompt": prompt, "repetition": repetition}})  # fmt: skip
        (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        n = len(records)
        summary = {"strategy": strategy, "models": "smollm2_pld_int8_fp32", "dataset": dataset["name"], "n_samples": n,
                   "new_tokens": n * TOKENS, "total_time_s": 1.0, "ms_per_token": 1.0, "tokens_per_s": 1.0,
                   "stages": [{**target, "verify_steps": verify * n, "accepted": accepted * n}],
                   "identical_to_greedy": None if name == "greedy" else f"{n}/{n}"}  # fmt: skip
        (run / "summary.json").write_text(json.dumps(summary))
    if paired:
        from dataclasses import asdict

        entries = [asdict(s) for s in paired_speedups(sweep_samples(directory))]
        (directory / "paired.json").write_text(json.dumps(entries))
    return directory


def passes(prompt: str) -> dict:
    return {"passed": 1.0 if prompt == "HumanEval/0" else 0.0, "result": "passed"}


def test_rows_come_in_a_readers_order_with_plain_names(tmp_path):
    rows = sweep_rows(write_sweep(tmp_path / "sweep", quality=passes))
    names = [r["configuration"] for r in rows]
    assert names == ["greedy", "sd_L2", "sd_L10", "pipespec_L0_M8", "pipespec_L0_M16", "pipespec_L1_M4"]
    assert names == sorted(CONFIGURATIONS, key=configuration_key)
    table = sweep_table(tmp_path / "sweep")
    first_cells = [row[0] for row in table.sections[0][1]]
    assert first_cells == [configuration_name(n) for n in names]
    assert first_cells[1] == "SD, lookahead 2" and first_cells[-1] == "PipeSpec, lookahead 1, max lead 4"


def test_every_row_has_its_intervals_and_figures(tmp_path):
    rows = {r["configuration"]: r for r in sweep_rows(write_sweep(tmp_path / "sweep", quality=passes))}
    paired = {e["configuration"]: e for e in json.loads((tmp_path / "sweep" / "paired.json").read_text())}
    for name, (factor, (verify, accepted)) in CONFIGURATIONS.items():
        row = rows[name]
        low, high = row["tokens_per_s_interval"]
        assert low <= row["tokens_per_s"] <= high
        # geometric mean over prompts of 10 and 20 tok/s (times the factor, repetitions 1.00 and 1.01)
        assert row["tokens_per_s"] == pytest.approx(factor * (200 ** 0.5) * (1.01 ** 0.5), rel=1e-6)
        assert row["speedup"] == pytest.approx(factor) and row["speedup_interval"] == tuple(
            paired[name]["sampling_interval"])
        expected = None if name == "greedy" else (accepted + verify) / verify
        assert row["mean_acceptance_length"] == (pytest.approx(expected) if expected else None)
        assert row["quality"] == "0.500 (2/4)"  # prompt 0 passes, prompt 1 does not, 2 repetitions each
    assert rows["greedy"]["identical_to_greedy"] == "reference" and rows["sd_L2"]["identical_to_greedy"] == "4/4"
    markdown = to_markdown(sweep_table(tmp_path / "sweep"))
    assert re.search(r"\| SD, lookahead 2 \| \d+\.\d \[\d+\.\d, \d+\.\d\] \| 1\.20 \[1\.\d\d, 1\.\d\d\] \| 2\.00 \| "
                     r"4/4 \| 0\.500 \(2/4\) \|", markdown)  # fmt: skip


def test_the_caption_names_command_machine_and_sample_size(tmp_path):
    table = sweep_table(write_sweep(tmp_path / "sweep"), command="python -m experiments.collect SWEEP")
    assert "Command: python -m experiments.collect SWEEP." in table.caption
    assert "Test CPU (family 25, model 1), 2 cores, torch 2.0" in table.caption
    assert "2 prompts x 2 repetitions x 16 new tokens at most" in table.caption
    assert to_markdown(table).startswith(f"Table: {table.caption}\n")


def test_latex_is_booktabs_with_every_text_escaped():
    assert latex_escape("a_b & 95% $x$ #1 {y} ~ ^ \\") == (
        r"a\_b \& 95\% \$x\$ \#1 \{y\} \textasciitilde{} \textasciicircum{} \textbackslash{}")
    assert latex_escape("lookup -> fp32") == r"lookup $\rightarrow$ fp32"
    table = Table("run_1 at 50% & more", ("a_b", "c"), (("sec_1", (("x_1", "1.0"),)), (None, (("y", "2"),))),
                  "lr", "tab:x")
    latex = to_latex(table)
    lines = latex.splitlines()
    assert lines.index(r"\toprule") < lines.index(r"\midrule") < lines.index(r"\bottomrule")
    assert latex.count(r"\midrule") == 2  # under the header, and between the sections
    assert r"\caption{run\_1 at 50\% \& more}" in latex and r"a\_b & c \\" in latex and r"x\_1 & 1.0 \\" in latex
    assert r"\multicolumn{2}{l}{\emph{sec\_1}} \\" in latex and r"\begin{tabular}{lr}" in latex
    assert "_" not in latex.replace(r"\_", "") and "%" not in latex.replace(r"\%", "")
    assert "| x\\_1 |" not in to_markdown(table) and "| **sec_1** | |" in to_markdown(table)


def test_a_run_without_quality_says_how_to_record_it_and_a_stand_in_says_no_reference(tmp_path):
    rows = sweep_rows(write_sweep(tmp_path / "he"))
    assert rows[0]["quality"] == f"not recorded: python -m experiments.score {tmp_path / 'he' / 'greedy'}"
    news = {"name": "news_lee_cnndm", "loader": "news_lee", "task": "summarization", "metric": None,
            "stand_in": True}  # fmt: skip
    assert {r["quality"] for r in sweep_rows(write_sweep(tmp_path / "news", dataset=news))} == {NO_REFERENCE}
    table = sweep_table(tmp_path / "news")
    assert table.columns[-1] == "quality" and "null" not in to_markdown(table) and "None" not in to_markdown(table)
    rouge = sweep_rows(write_sweep(tmp_path / "cnn", dataset={**news, "metric": "rouge", "stand_in": False},
                                   quality=lambda p: {"rouge1": 0.5, "rouge2": 0.2, "rougeL": 0.25}))  # fmt: skip
    assert {r["quality"] for r in rouge} == {"0.250"}


def test_a_sweep_without_paired_json_is_one_line_naming_the_command(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", paired=False)
    with pytest.raises(ResultsError, match=r"no paired.json; make it with: python -m analysis.paired .* --json >"):
        sweep_rows(sweep)
    result = subprocess.run([sys.executable, "-m", "experiments.collect", str(sweep)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"python -m analysis.paired {sweep} --json > {sweep}/paired.json" in result.stderr


def test_collect_writes_the_sweep_table_beside_it(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", quality=passes)
    result = subprocess.run([sys.executable, "-m", "experiments.collect", str(sweep)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (sweep / "table.md").read_text() == result.stdout.rstrip("\n") + "\n"
    assert (sweep / "table.tex").read_text().startswith("\\begin{table}")
    assert "| PipeSpec, lookahead 0, max lead 8 |" in result.stdout


def test_table2_reads_the_authors_rows_from_their_logs():
    rows = official_rows()
    logs = largest_target_logs(load_dir(DEFAULT_DIR))
    assert len(rows) == len(logs) == 7
    by_models = {(r["method"], r["models"]): r for r in rows}
    # the paper's Table 2 (LLaMA-3.1-70B on HumanEval), to its printed precision
    printed = {("AR", "LLaMA-3.1-70B"): (123.69, 1.00), ("SD", "LLaMA-3.1-8B -> LLaMA-3.1-70B"): (93.42, 1.32),
               ("SD", "LLaMA-3.2-1B -> LLaMA-3.1-8B -> LLaMA-3.1-70B"): (90.14, 1.37),
               ("PipeSpec", "LLaMA-3.1-8B -> LLaMA-3.1-70B"): (54.52, 2.27),
               ("PipeSpec", "LLaMA-3.2-1B -> LLaMA-3.1-8B -> LLaMA-3.1-70B"): (48.76, 2.54)}  # fmt: skip
    for key, (ms, speedup) in printed.items():
        assert round(by_models[key]["ms_per_token"], 2) == ms and round(by_models[key]["speedup"], 2) == speedup
        assert by_models[key]["tokens_per_s"] == pytest.approx(1000 / by_models[key]["ms_per_token"])
    assert [r["method"] for r in rows] == ["AR", "SD", "SD", "SD", "PipeSpec", "PipeSpec", "PipeSpec"]
    greedy = next(log for log in logs if log.strategy == "greedy")
    assert by_models[("AR", "LLaMA-3.1-70B")]["ms_per_token"] == pooled_ms_per_token(greedy)


def test_table2_puts_our_rows_beside_theirs(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", quality=passes)
    ours = our_rows(sweep_rows(sweep))
    assert [r["configuration"] for r in ours] == ["-", "SD, lookahead 2", "PipeSpec, lookahead 0, max lead 16"]
    assert [r["method"] for r in ours] == ["AR", "SD", "PipeSpec"] and ours[0]["models"] == "fp32"
    table = table2_humaneval([sweep])
    (theirs_title, theirs), (our_title, our) = table.sections
    assert "4x A100-40GB" in theirs_title and "Test CPU" in our_title and len(theirs) == 7 and len(our) == 3
    latex = to_latex(table)
    assert r"LLaMA-3.1-8B $\rightarrow$ LLaMA-3.1-70B" in latex and "48.76" in latex and r"\bottomrule" in latex


def test_the_committed_tables_are_current():
    """table.md of each committed paired sweep and Table 2 are what the code makes of the committed results."""
    for path in sorted((ROOT / "results" / "validation_paired").glob("*/*/sweep/table.md")):
        sweep = path.parent
        shown = sweep.relative_to(ROOT)
        assert path.read_text() == to_markdown(sweep_table(sweep, f"python -m experiments.collect {shown}")), shown
    table2 = ROOT / "results" / "tables" / "table2_humaneval.md"
    if table2.exists():
        assert table2.read_text() == to_markdown(table2_humaneval(command="python -m experiments.collect --table2"))
