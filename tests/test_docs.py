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
HEADLINE_RUN = "results/bench/avx512_2026-12-06b"
HEADLINE_SYSTEMS = {
    "HF greedy (fastest: 1 thread)": "hf_greedy",
    "HF assisted generation (int8 draft, best of its settings)": "hf_assisted",
    "HF prompt lookup": "hf_prompt_lookup",
    "greedy (ours, faster of 1 and 2 threads)": "greedy",
    "sd, int8 -> fp32 (best window)": "sd",
    "pipespec k=2, int8 -> fp32": "pipespec_k2",
    "pipespec k=3, prompt lookup -> int8 -> fp32": "pipespec_k3",
    "pipespec, suffix -> fp32 on 2 threads (lookahead 1)": "pipespec@smollm2_suffix_fp32_t2",
    "sd, flat suffix -> fp32 on 2 threads (best window)": "sd@smollm2_suffix_flat_fp32_t2",
    "pipespec, flat suffix token trees -> fp32 on 2 threads": "pipespec@smollm2_suffix_flat_tree8_fp32_t2",
    "sd, flat suffix -> compiled fp32 on 2 threads": "sd@smollm2_suffix_flat_fp32_t2_compiled",
    "sd, flat suffix token trees -> compiled fp32 on 2 threads": "sd@smollm2_suffix_flat_tree8_fp32_t2_compiled",
}


def test_the_readme_headline_is_the_bench_run_it_names():
    """Every figure of the README's results table is the named run's (tok/s median to 0.1, ratio to the
    fastest HF greedy to 0.01), and every system the run found identical to HF greedy on every prompt."""
    import json

    text = (ROOT / "README.md").read_text()
    assert f"bash scripts/bench_heldout.sh {HEADLINE_RUN}" in text
    runs = {d: {s["name"]: s for s in json.loads((ROOT / HEADLINE_RUN / d / "bench.json").read_text())["systems"]}
            for d in ("humaneval", "news_lee_cnndm")}  # fmt: skip
    table = text[text.index("## Results"):].split("\n## ")[0]
    rows = [[c.strip().replace("*", "") for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| system")]  # fmt: skip
    assert [r[0] for r in rows] == list(HEADLINE_SYSTEMS)
    for label, he_speed, he_ratio, news_speed, news_ratio in rows:
        for dataset, speed, ratio in (("humaneval", he_speed, he_ratio), ("news_lee_cnndm", news_speed, news_ratio)):
            system = runs[dataset][HEADLINE_SYSTEMS[label]]
            assert speed == f"{system['tokens_per_s_median']:.1f}", (label, dataset)
            assert ratio == f"{system['ratio_vs_hf_greedy']:.2f}", (label, dataset)
            done, total = map(int, system["identical_to_greedy"].split("/"))
            assert done == total > 0, (label, dataset)
