"""The paired, interleaved sweep (experiments.sweep) on tiny models: every configuration of one hierarchy in
every prompt slot of one pipeline, identical to greedy, resumable, and bad configurations refused up front."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.rundir import read_records, read_summary

# its module-scoped fixtures are built once: every test of the module on one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_sweep")
SLOW_FIXTURES = ('swept',)  # a paired sweep: their tests are `slow` (conftest.py)


ROOT = Path(__file__).resolve().parent.parent
CONFIGS = "configurations=[{strategy: sd, lookahead: 2}, {strategy: pipespec, lookahead: 0, max_lead: 4}]"


SWEEP_ARGS = ("models=tiny_k2", "dataset=news_lee_cnndm", "samples=2", "prompt_offset=1", "repetitions=2",
              "max_new_tokens=8", "warmup_tokens=2", "progress=false")  # fmt: skip


def sweep(out, *overrides, timeout=300):
    command = [sys.executable, "-m", "experiments.sweep", *SWEEP_ARGS, f"hydra.run.dir={out}", *overrides]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    done = sweep(out, CONFIGS)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


def test_every_configuration_runs_every_slot_identical_to_greedy_with_paired_figures(swept):
    out, done = swept
    names = ["greedy", "sd_L2", "pipespec_L0_M4"]
    assert sorted(p.name for p in out.iterdir() if (p / "samples.jsonl").exists()) == sorted(names)
    slots = {}
    for name in names:
        records, dropped = read_records(out / name)
        assert dropped == 0 and len(records) == 4  # 2 prompts x 2 repetitions
        slots[name] = {(r["slot"]["prompt"], r["slot"]["repetition"]): r for r in records}
        summary = read_summary(out / name)
        assert summary["complete"] and summary["n_samples"] == 4
        if name != "greedy":
            assert summary["identical_to_greedy"] == "4/4" and summary["reference_run"].endswith("greedy")
    assert slots["greedy"].keys() == slots["sd_L2"].keys() == slots["pipespec_L0_M4"].keys()
    assert len({prompt for prompt, _ in slots["greedy"]}) == 2 and {rep for _, rep in slots["greedy"]} == {0, 1}
    paired = {row["configuration"]: row for row in json.loads((out / "paired.json").read_text())}
    assert set(paired) == set(names) and paired["greedy"]["speedup"] == pytest.approx(1.0)
    for row in paired.values():
        low, high = row["measurement_interval"]
        assert low <= row["speedup"] <= high and row["pairs"] == 4
    assert "| sd_L2 |" in done.stdout and "speedup vs greedy" in (out / "paired.md").read_text()


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_without_measuring_anything_twice(swept, tmp_path, entry_point):
    import shutil

    out, _ = swept
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    lines = (copy / "sd_L2" / "samples.jsonl").read_text().splitlines(keepends=True)
    (copy / "sd_L2" / "samples.jsonl").write_text("".join(lines[:2]) + lines[2][:25])  # killed while writing
    kept = {json.loads(line)["sample_id"]: json.loads(line)["time_s"] for line in lines[:2]}
    refused = entry_point("experiments.sweep", *SWEEP_ARGS, f"hydra.run.dir={copy}", CONFIGS, function="main")
    assert refused.returncode == 2 and "resume=true" in refused.stderr.strip().splitlines()[-1]
    started = {p.name: p.read_text() for p in (copy / ".hydra").glob("*.yaml")}
    env = json.loads((copy / "sd_L2" / "env.json").read_text())
    # resumed in this process (the `swept` fixture ran the real command): no new interpreter to import torch
    done = entry_point("experiments.sweep", *SWEEP_ARGS, f"hydra.run.dir={copy}", CONFIGS, "resume=true",
                       function="main")
    assert done.returncode == 0, done.stderr[-3000:]
    records, dropped = read_records(copy / "sd_L2")
    assert dropped == 0 and len(records) == 4
    assert all(r["time_s"] == kept[r["sample_id"]] for r in records if r["sample_id"] in kept)
    assert [len(read_records(copy / n)[0]) for n in ("greedy", "pipespec_L0_M4")] == [4, 4]
    assert read_summary(copy / "sd_L2")["identical_to_greedy"] == "4/4"
    # the record of how it started and of the machine its first samples ran on are kept beside the resume's
    assert {p.name: p.read_text() for p in (copy / ".hydra" / "started").glob("*.yaml")} == started
    assert "resume=true" in (copy / ".hydra" / "overrides.yaml").read_text()
    resumed = json.loads((copy / "sd_L2" / "env.json").read_text())
    assert {k: v for k, v in resumed.items() if k != "resumed"} == env
    assert [r["samples_before"] for r in resumed["resumed"]] == [2] and resumed["resumed"][0]["cpu"] == env["cpu"]
    moved = tmp_path / "moved"  # finished, and moved (its summaries name their greedy run by its old path)
    shutil.copytree(copy, moved)
    written = {p: p.read_bytes() for n in ("greedy", "sd_L2") for p in (moved / n).glob("*.*")
               if p.name in ("config.yaml", "summary.json", "env.json")}  # fmt: skip
    again = entry_point("experiments.sweep", *SWEEP_ARGS, f"hydra.run.dir={moved}", CONFIGS, "resume=true",
                        function="main")  # nothing measured, nothing of its record rewritten
    assert again.returncode == 0 and "| sd_L2 |" in again.stdout and {p: p.read_bytes() for p in written} == written
    assert {p.name: p.read_text() for p in (moved / ".hydra" / "started").glob("*.yaml")} == started


def test_a_started_sweep_resumes_only_as_it_started(swept, tmp_path, entry_point):
    """A configuration added on resuming would be timed after the others, not interleaved with them; one left
    out would stay half-measured; another prompt_offset would add other prompts to the sweep, another
    forget_outputs another drafter: each is one error line, nothing is measured, and the sweep's `.hydra/`
    record of how it was started is left as it was (Hydra writes it before the sweep starts: the check runs
    first, `experiments.callbacks.CheckRunDirectory`)."""
    import shutil

    out, _ = swept
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = {p: p.read_text() for p in [*copy.glob("*/samples.jsonl"), *copy.glob(".hydra/*.yaml"),
                                         *copy.glob("*/config.yaml")]}  # fmt: skip
    added = CONFIGS.replace("]", ", {strategy: sd, lookahead: 3}]")
    for overrides, message in (((added,), "added ['sd_L3']"),
                               (("configurations=[{strategy: sd, lookahead: 2}]",), "left out ['pipespec_L0_M4']"),
                               ((CONFIGS, "prompt_offset=3"), "other settings (prompt_offset 1 -> 3)"),
                               ((CONFIGS, "forget_outputs=false", "repetitions=3"),
                                "other settings (repetitions 2 -> 3; forget_outputs True -> False)")):  # fmt: skip
        done = entry_point("experiments.sweep", *SWEEP_ARGS, f"hydra.run.dir={copy}", *overrides, "resume=true",
                           function="main")  # fmt: skip
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 2 and last.startswith("error: cannot resume the sweep") and message in last, last
    refused = entry_point("experiments.sweep", *SWEEP_ARGS, f"hydra.run.dir={copy}", CONFIGS, function="main")
    assert refused.returncode == 2 and "already holds a sweep's results: resume=true" in refused.stderr
    assert not (copy / "sd_L3").exists()
    assert {p: p.read_text() for p in before} == before


@pytest.mark.parametrize("override, message", [
    ("configurations=[]", "configurations must be a non-empty list"),
    ("configurations=[{strategy: pipespec, cascade: true}]", "configurations[0] cannot run on"),
    ("configurations=[{models: tiny_k3, strategy: sd}]", "configurations[0]: unknown key(s) ['models']"),
    ("configurations=[{strategy: sd, lookahead: 2}, {strategy: sd, lookahead: 2}]", "is taken by another"),
    ("repetitions=0", "repetitions must be an integer >= 1"),
    ("configurations=[{strategy: sd, stages: [0]}]", "configurations[0] cannot run on"),  # not ending with the target
])  # fmt: skip
def test_a_bad_sweep_is_one_error_line_before_anything_starts(override, message, tmp_path, entry_point):
    done = entry_point("experiments.sweep", *SWEEP_ARGS, f"hydra.run.dir={tmp_path / 'bad'}", override, function="main")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines[-1].startswith("error: ") and message in lines[-1], done.stderr[-2000:]
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").rglob("samples.jsonl"))


def test_a_learning_runs_calls_against_the_sweep(swept, tmp_path, capsys):
    """`python -m analysis.learn RUN SWEEP`: per call of an auto run that learns, the configuration it ran, its
    paired speedup in the sweep and its share of the best, and whether its output is the sweep's greedy one."""
    from analysis.learn import learning_table, main
    from analysis.paired import paired_speedups, sweep_samples

    out, _ = swept
    greedy = {}
    for record in read_records(out / "greedy")[0]:
        greedy.setdefault(record["slot"]["prompt"], record["output_ids"])
    prompts = sorted(greedy)
    ran = [{"strategy": "sd", "lookahead": 2, "max_lead": 8}, {"strategy": "pipespec", "lookahead": 0, "max_lead": 4}]
    run = tmp_path / "learn"
    run.mkdir()
    lines = [{"sample_id": prompt, "index": i, "output_ids": greedy[prompt] if i == 0 else [1, 2, 3], "output_text": "",
              "new_tokens": 3, "time_s": 0.1, "stages": [], "auto": {"ran": ran[i], "switched": i == 0, **([{"gain": 1.05, "gain_interval": [1.01, 1.09]}, {}][i])}}
             for i, prompt in enumerate(prompts)]  # fmt: skip
    (run / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    speedups = {s.configuration: s.speedup for s in paired_speedups(sweep_samples(out))}
    best = max(speedups, key=speedups.get)
    rows = learning_table(run, out)
    assert [r["configuration"] for r in rows] == ["sd_L2", "pipespec_L0_M4"]
    assert [r["identical_to_greedy"] for r in rows] == [True, False]
    assert rows[0]["paired_speedup"] == pytest.approx(speedups["sd_L2"]) and rows[0]["best"] == best
    assert rows[1]["of_best"] == pytest.approx(speedups["pipespec_L0_M4"] / speedups[best])
    assert main([str(run), str(out)]) == 0
    table = capsys.readouterr().out
    assert "| 1 | sd_L2 |" in table and "| yes | 1.050 (1.010-1.090) | yes |" in table
    assert table.rstrip().endswith("| NO | - | no |")
    ran[0]["stages"], ran[1]["stages"] = [0, 1], [1]  # the second call skipped a stage: the sweep never ran that
    (run / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    skipped = learning_table(run, out)
    assert skipped[0]["paired_speedup"] == pytest.approx(speedups["sd_L2"]) and skipped[1]["paired_speedup"] is None
    (run / "samples.jsonl").write_text("")
    assert main([str(run), str(out)]) == 2 and "not a learning auto run" in capsys.readouterr().err


def test_a_configuration_on_some_of_the_stages_runs_on_those_alone(tmp_path):
    """`stages` in an entry: the configuration runs on those stages of the started pipeline (a k = 3 hierarchy
    without its middle stage here), named so, beside the same configuration on every stage; every stage listed
    is the configuration without the key. In this process: a pipeline start, no new interpreter."""
    from experiments.compose import compose
    from experiments.sweep import run_sweep

    configurations = ("configurations=[{strategy: pipespec, lookahead: 1, max_lead: 4}, {strategy: pipespec, lookahead: 1, "
                      "max_lead: 4, stages: [0, 2]}, {strategy: sd, lookahead: 2, stages: [0, 1, 2]}]")  # fmt: skip
    cfg = compose("sweep", ["models=tiny_k3", "dataset=news_lee_cnndm", "samples=1", "prompt_offset=1", "repetitions=1",
                            "max_new_tokens=12", "warmup_tokens=0", "progress=false", configurations])  # fmt: skip
    speedups = run_sweep(cfg, tmp_path)
    assert {s.configuration for s in speedups} == {"greedy", "pipespec_L1_M4", "pipespec_L1_M4_S0-2", "sd_L2"}
    greedy = read_records(tmp_path / "greedy")[0][0]["output_ids"]
    for name, used in (("pipespec_L1_M4", 3), ("pipespec_L1_M4_S0-2", 2), ("sd_L2", 3)):
        summary = read_summary(tmp_path / name)
        assert summary["identical_to_greedy"] == "1/1" and read_records(tmp_path / name)[0][0]["output_ids"] == greedy
        assert len(summary["stage_names"]) == used
    subset = read_summary(tmp_path / "pipespec_L1_M4_S0-2")["stage_names"]
    assert [n.split(":")[0] for n in subset] == ["0", "2"]
