"""The documentation: the MkDocs site builds with no warning, the README stays a front door, and neither
mentions an issue number.

- `mkdocs build --strict` (the `docs` extra: `pip install -e ".[docs]"`) into a temporary folder: a
  broken link, a missing anchor, a page left out of the nav or a docstring mkdocstrings cannot read
  fails the build. Skipped, saying so, where mkdocs is not installed.
- README.md has at most 250 lines.
- Neither README.md nor docs/ mentions an issue number.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
ISSUE_NUMBER = re.compile(r"\b[Ii]ssue #?\d+")


def _doc_files() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def test_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip('mkdocs is not installed: pip install -e ".[docs]" (scripts/setup.sh installs it)')
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's banner about MkDocs 2.0, not a build warning
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("pipespec.api.Pipeline") > 0


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, at most {README_MAX_LINES}"
    assert "    bash scripts/run.sh" in lines and "    bash scripts/test.sh" in lines


def test_no_issue_numbers_in_readme_or_docs():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _doc_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not found, "issue numbers in user-facing docs:\n" + "\n".join(found)


# The README's headline table: each row's system in the bench run it names.
HEADLINE_RUN = "results/bench/avx2_2026-12-08"
HEADLINE_SYSTEMS = {
    "HF greedy": "hf_greedy",
    "HF greedy, compiled (static cache + torch.compile)": "hf_compiled",
    "HF assisted generation (int8 -> fp32)": "hf_assisted",
    "llama.cpp greedy (f32 GGUF of the same weights)": "llamacpp_greedy",
    "greedy (fp32), ours": "greedy",
    "PipeSpec k=2 (int8 -> fp32)": "pipespec_k2",
    "PipeSpec k=3 (lookup -> int8 -> fp32)": "pipespec_k3",
    "SD k=2 (flat suffix -> compiled fp32 on 2 threads)": "sd@smollm2_suffix_flat_fp32_t2_compiled",
    "PipeSpec k=2 (flat suffix trees of 8 -> compiled fp32 on 2 threads)":
        "pipespec@smollm2_suffix_flat_tree8_fp32_t2_compiled",
}


def test_the_readme_headline_is_the_bench_run_it_names():
    """Every figure of the README's results table is the named run's (tok/s median to 0.1; the ratio to HF
    greedy, paired per prompt and repetition, with its interval over prompts and the worst prompt, as
    `experiments.benchlib.intervals` reads them from the run's runs.json), and every system the run found
    identical to HF greedy on every prompt."""
    import json

    from experiments.benchlib.intervals import paired_ratio_fields, ratio_cell, read_runs, systems_from_runs, worst_cell

    text = (ROOT / "README.md").read_text()
    assert f"bash scripts/bench_heldout.sh {HEADLINE_RUN}" in text
    runs = {d: {s["name"]: s for s in json.loads((ROOT / HEADLINE_RUN / d / "bench.json").read_text())["systems"]}
            for d in ("humaneval", "news_lee_cnndm")}  # fmt: skip
    table = text[text.index("## Results"):].split("\n## ")[0]
    rows = [[c.strip().replace("*", "") for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| system")]  # fmt: skip
    assert [r[0] for r in rows] == list(HEADLINE_SYSTEMS)
    paired = {d: paired_ratio_fields(systems_from_runs(read_runs(ROOT / HEADLINE_RUN / d)), "hf_greedy")
              for d in runs}  # runs.json, or runs.json.gz as committed runs keep it
    for label, he_speed, he_ratio, he_worst, news_speed, news_ratio, news_worst in rows:
        for dataset, speed, ratio, worst in (("humaneval", he_speed, he_ratio, he_worst),
                                             ("news_lee_cnndm", news_speed, news_ratio, news_worst)):
            system = runs[dataset][HEADLINE_SYSTEMS[label]]
            assert speed == f"{system['tokens_per_s_median']:.1f}", (label, dataset)
            if HEADLINE_SYSTEMS[label] == "hf_greedy":
                assert (ratio, worst) == (f"{system['ratio_vs_hf_greedy']:.2f}", "-"), (label, dataset)
            else:
                fields = paired[dataset][HEADLINE_SYSTEMS[label]]
                assert (ratio, worst) == (ratio_cell(fields), worst_cell(fields)), (label, dataset)
            done, total = map(int, system["identical_to_greedy"].split("/"))
            assert done == total > 0, (label, dataset)


def test_the_readme_headline_names_systems_as_analysis_names_does():
    """Each SD and PipeSpec row of the headline table is named by `analysis.names.system_name` from the stages
    the bench run recorded, so the README and every figure and report use one name per system."""
    import json

    from analysis.names import bench_system_name, system_name

    report = json.loads((ROOT / HEADLINE_RUN / "humaneval" / "bench.json").read_text())
    systems = {s["name"]: s for s in report["systems"]}
    for label, name in HEADLINE_SYSTEMS.items():
        strategy = systems[name]["settings"].get("strategy")
        if strategy in ("sd", "pipespec"):
            assert label == system_name(strategy, systems[name]["stages"]), (label, name)
        assert label == bench_system_name(name, strategy, systems[name]["stages"]), (label, name)


def test_the_readme_says_what_news_lee_is_and_how_large_the_sample_is():
    """The results section calls news_lee a stand-in for CNN/DM with its article count and median lengths as
    the bundled files give them, and states the sample (prompts x repetitions x tokens) and the machine, as
    the run's bench.json records them."""
    import json
    import statistics

    section = (ROOT / "README.md").read_text().split("## Results")[1].split("\n## ")[0]
    flat = " ".join(section.split())
    assert "stand-in for CNN/DM" in flat and "on CPUs" in flat
    data = ROOT / "experiments" / "data" / "news_lee"
    lengths = {f: [len(line.split()) for line in (data / f).read_text(encoding="latin-1").split("\n") if line.strip()]
               for f in ("lee_background.cor", "lee.cor")}  # fmt: skip
    assert f"{sum(map(len, lengths.values()))} news articles" in flat
    for words in lengths.values():
        median = statistics.median(words)
        assert f"{median:g} words" in flat or f"{median:g} in its {len(words)}-article" in flat, median
    run = json.loads((ROOT / HEADLINE_RUN / "news_lee_cnndm" / "bench.json").read_text())
    assert (f"{run['prompts']['n']} prompts" in flat and f"{run['repetitions']} repetitions" in flat
            and f"{run['max_new_tokens']} new tokens" in flat), "the sample: prompts x repetitions x tokens"
    cpu = run["machine"]["cpu"]
    assert f"family {cpu['family']} model {cpu['model']}" in flat and run["machine"]["torch"] in flat
