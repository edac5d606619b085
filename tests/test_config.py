"""`experiments.run_config.RunConfig`: a run's config checked once, every bad option one `ConfigError` naming it,
a good config kept as given, and the runner's command line turning a bad option into one error line."""

import copy
import re
from types import SimpleNamespace

import pytest

from experiments.compose import compose
from experiments.run_config import RunConfig, RunOptions
from pipespec.errors import ConfigError


@pytest.fixture(scope="module")
def composed():
    return compose("config", ["models=tiny_k2", "dataset=news_lee_cnndm", "dataset.n_samples=2", "max_new_tokens=8"])


def edited(config: dict, path: str, value) -> dict:
    """`config` with the option at the dotted `path` set to `value` (a copy)."""
    config = copy.deepcopy(config)
    *parents, key = path.split(".")
    node = config
    for parent in parents:
        node = node.setdefault(parent, {})
    node[key] = value
    return config


BAD_OPTIONS = [  # (option as the user types it, a bad value, what the message must hold)
    ("max_new_tokens", 0, "max_new_tokens must be an integer > 0, got 0"),
    ("max_new_tokens", 2.5, "max_new_tokens must be an integer > 0"),
    ("models.family", "robot", "models.family must be 'base' or 'chat', got 'robot'"),
    ("models.name", "", "models.name"),
    ("models.stages", [], "models.stages is empty"),
    ("models.stages", [{"model": "tiny:target", "dtype": "float8"}], "stage option 'dtype'"),
    ("strategy.name", "fastest", "strategy must be one of"),
    ("strategy.lookahead", -1, "lookahead must be an integer >= 0, got -1"),
    ("strategy.max_lead", 0, "max_lead must be an integer >= 1, got 0"),
    ("strategy.draft_confidence", 1.5, "draft_confidence must be a number"),
    ("strategy.size_verification", "yes", "size_verification must be true or false"),
    ("strategy.cascade", "yes", "cascade must be true or false"),
    ("strategy.value_stop", -1, "value_stop must be a number"),
    ("strategy.colour", "red", "unknown strategy option(s) ['colour']"),
    ("sampling.temperature", -1.0, "temperature must be a number >= 0"),
    ("sampling.top_k", -1, "top_k must be an integer >= 0"),
    ("sampling.top_p", 0.0, "top_p must be a number with 0 < top_p <= 1"),
    ("sampling.seed", None, "sampling.seed must be an integer >= 0"),
    ("sampling.seed", -1, "seed must be an integer >= 0"),
    ("sampling.colour", 1, "unknown sampling option(s) ['colour']"),
    ("acceptance.mode", "lenient", "acceptance must be one of"),
    ("acceptance.rate", 2.0, "synthetic_rates must be a number in [0, 1]"),
    ("run.plan", "yes", "run.plan must be true or false, got 'yes'"),
    ("run.resume", 1, "run.resume must be true or false, got 1"),
    ("run.progress", None, "run.progress must be true or false, got None"),
    ("run.execute_code", "no", "run.execute_code must be true or false"),
    ("run.gpu_monitor", 0, "run.gpu_monitor must be true or false"),
    ("run.reference_run", 3, "run.reference_run must be null or a greedy run directory, got 3"),
    ("run.warmup_tokens", -1, "run.warmup_tokens must be an integer >= 0"),
    ("run.stall_timeout_s", -3, "run.stall_timeout_s must be a number of seconds > 0, got -3"),
    ("run.start_timeout_s", 0, "run.start_timeout_s must be a number of seconds > 0, got 0"),
    ("run.near_tie_margin", -0.5, "run.near_tie_margin must be null (by the target's dtype) or a number >= 0"),
    ("run.colour", 1, "unknown run option(s) ['colour']"),
    ("dataset", "humaneval", "dataset must be a mapping"),
    ("dataset.name", None, "dataset.name"),
]


@pytest.mark.parametrize("path, value, message", BAD_OPTIONS, ids=[f"{p}={v!r}" for p, v, _ in BAD_OPTIONS])
def test_every_bad_option_is_one_config_error_naming_it(composed, path, value, message):
    with pytest.raises(ConfigError) as raised:
        RunConfig.from_config(edited(composed, path, value))
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("path, value, message", [
    ("strategy.draft_confidence", 0.5, "strategy auto cannot honour draft_confidence=0.5"),
    ("strategy.value_stop", 1.0, "strategy auto cannot honour value_stop=1.0"),
    ("strategy.profile", 3, "strategy.profile must be a profile.json path or null, got 3"),
    ("sampling.top_p", 2.0, "top_p must be a number"),  # what auto leaves to the config is checked as ever
])  # fmt: skip
def test_the_options_of_strategy_auto_are_checked_too(composed, path, value, message):
    auto = edited(composed, "strategy", {**composed["strategy"], "name": "auto", "profile": None})
    assert RunConfig.from_config(auto).is_auto
    with pytest.raises(ConfigError, match=re.escape(message)):
        RunConfig.from_config(edited(auto, path, value))


def test_a_good_config_round_trips(composed):
    run = RunConfig.from_config(composed)
    assert run.raw == composed and run.raw is not composed
    assert RunConfig.from_config(run.raw) == run
    assert (run.hierarchy, run.family, run.budget, run.dataset["name"]) == ("tiny_k2", "base", 8, "news_lee_cnndm")
    assert [s.name for s in run.stages] == ["tiny-draft", "tiny-target"] and run.target is run.stages[-1]
    assert (run.call.strategy, run.call.lookahead, run.call.seed, run.profile) == ("pipespec", 0, 0, None)
    assert run.options == RunOptions()  # conf/config.yaml's run section is the dataclass's defaults
    options = run.pipeline_options()
    assert options["strategy"] == "pipespec" and options["stall_timeout_s"] == 30 and options["start_timeout_s"] == 600
    composed_copy = copy.deepcopy(composed)
    composed_copy["run"]["resume"] = True  # a caller's later edit is not the run's
    assert RunConfig.from_config(composed_copy).options.resume and not run.options.resume
    assert run.recorded() == composed  # summary.json describes the config as given


def test_auto_runs_its_choice_and_records_it_in_place_of_auto(composed):
    auto = RunConfig.from_config(edited(composed, "strategy", {**composed["strategy"], "name": "auto",
                                                                 "profile": None}))  # fmt: skip
    choice = SimpleNamespace(strategy="sd", lookahead=3, max_lead=8, stages=(1,))
    chosen = auto.chosen(choice)
    assert chosen.stages == auto.stages[1:] and (chosen.call.strategy, chosen.call.lookahead) == ("sd", 3)
    assert chosen.raw == auto.raw and chosen.raw["strategy"]["name"] == "auto"  # config.yaml: as given
    assert chosen.recorded()["strategy"]["name"] == "sd" and chosen.recorded()["strategy"]["lookahead"] == 3


def test_plan_mode_accepts_gpus_this_machine_lacks(composed):
    gpu = [{"model": "tiny:draft_noise0.05", "device": "cuda:99"}, {"model": "tiny:target", "device": "cuda:99"}]
    with pytest.raises(ConfigError, match="cuda:99"):
        RunConfig.from_config(edited(composed, "models.stages", gpu))
    planned = RunConfig.from_config(edited(edited(composed, "models.stages", gpu), "run.plan", True))
    assert [s.device for s in planned.stages] == ["cuda:99", "cuda:99"]


@pytest.mark.parametrize("override, message", [
    ("run.stall_timeout_s=-3", "error: run.stall_timeout_s must be a number of seconds > 0, got -3"),
    ("sampling.seed=null", "error: sampling.seed must be an integer >= 0"),
])  # fmt: skip
def test_the_runner_cli_turns_a_bad_option_into_one_error_line(override, message, tmp_path, entry_point):
    run_dir = tmp_path / "bad"
    result = entry_point("experiments.run", "models=tiny_k2", "dataset=news_lee_cnndm", "dataset.n_samples=1",
                         "max_new_tokens=4", override, "run.progress=false", f"hydra.run.dir={run_dir}")  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(message), result.stderr[-2000:]
    assert not (run_dir / "samples.jsonl").exists() and not (run_dir / "summary.json").exists()
    assert not (run_dir / "config.yaml").exists()
