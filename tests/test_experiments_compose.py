"""Every experiment in conf/experiment composes, job by job as its sweep runs them, into a checked run
config whose plan (placement and memory per device) prints without loading a weight."""

import itertools

import pytest
import yaml

from experiments.compose import compose, conf_dir, options
from experiments.run_config import RunConfig
from experiments.plan import format_plan, plan_stages

EXPERIMENTS = options("experiment")
PAPER = [name for name in EXPERIMENTS if "llama" in name]


def sweep_jobs(name: str) -> list[list[str]]:
    """The override lists of an experiment's jobs: the product of its sweeper params (Hydra's basic sweeper)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    data = yaml.safe_load((conf_dir() / "experiment" / f"{name}.yaml").read_text())
    params = ((data.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    parsed = OverridesParser.create().parse_overrides([f"{key}={value}" for key, value in params.items()])
    axes = [[f"{o.key_or_group}={v}" for v in (o.sweep_string_iterator() if o.is_sweep_override() else [o.value()])]
            for o in parsed]  # fmt: skip
    return [list(job) for job in itertools.product(*axes)]


@pytest.fixture(scope="module")
def planned() -> dict[str, list[RunConfig]]:
    return {name: [RunConfig.from_config(compose("config", [f"experiment={name}", *job, "run.plan=true"]))
                   for job in sweep_jobs(name)] for name in EXPERIMENTS}  # fmt: skip


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_job_of_every_experiment_composes_and_plans(name, planned):
    runs = planned[name]
    assert runs, f"{name} has no jobs"
    for run in runs:
        text = format_plan(plan_stages(list(run.stages)))
        assert "per device" in text and "?" not in text.split("per device")[1], (name, run.hierarchy)


def test_fig4_sweeps_sd_and_pipespec_over_lookahead_with_one_ar_run(planned):
    points = [(run.call.strategy, run.call.lookahead) for run in planned["fig4_lookahead_llama3"]]
    assert points.count(("greedy", 0)) == 1 and len(points) == len(set(points)) == 42
    assert sorted(la for s, la in points if s == "sd") == list(range(1, 21))
    assert sorted(la for s, la in points if s == "pipespec") == list(range(0, 21))
    assert {run.hierarchy for run in planned["fig4_lookahead_llama3"]} == {"llama3_1b_8b"}


def test_table2_runs_ar_sd_and_pipespec_of_each_hierarchy_with_room_to_load(planned):
    for name in (n for n in PAPER if n.startswith("table2")):
        runs = planned[name]
        for hierarchy in {run.hierarchy for run in runs}:
            assert sorted((r.call.strategy, r.call.lookahead) for r in runs if r.hierarchy == hierarchy) == [
                ("greedy", 0), ("pipespec", 0), ("sd", 8)]
        for run in runs:
            big = max(run.stages, key=lambda s: s.params_b or 0)
            assert run.options.start_timeout_s >= (1800 if big.params_b > 50 else 900), (name, run.hierarchy)
            assert run.budget == 512  # the paper's limit


@pytest.mark.parametrize("name", PAPER)
def test_each_paper_experiment_says_what_it_reproduces_and_how_long_it_takes(name):
    text = (conf_dir() / "experiment" / f"{name}.yaml").read_text()
    comment = " ".join(line for line in text.splitlines() if line.startswith("#"))
    assert "of the paper" in comment and "Time on 4 A100s" in comment and "bf16" in comment


def test_an_experiment_runs_in_bf16(planned):
    job = sweep_jobs("table2_humaneval_llama3")[-1]
    run = RunConfig.from_config(compose("config", ["experiment=table2_humaneval_llama3", *job, "run.plan=true",
                                                   "precision=bf16"]))  # fmt: skip
    assert {s.dtype for s in run.stages} == {"bfloat16"} and run.hierarchy.endswith("_bf16")
