"""A hierarchy checked once (`pipespec.hierarchy.check_hierarchy`): the target's tokenizer, EOS ids and context
length from one check, handed to the Pipeline (which then loads no tokenizer and plans no option again); the
runner checks once per run; the stage process's command line (`python -m pipespec.worker`)."""

import json
import os
import subprocess
import sys

import pytest

from pipespec.errors import ConfigError
from pipespec.hierarchy import check_hierarchy
from pipespec.options import CallOptions
from pipespec.specs import StageSpec

TINY = {"noise": [0.05]}  # a draft and the target, their own tokenizer files each


@pytest.fixture
def counted(monkeypatch):
    """Counts of tokenizer loads and option plans from here on."""
    from transformers import AutoTokenizer

    counts = {"tokenizers": 0, "plans": 0}
    load, plan = AutoTokenizer.from_pretrained.__func__, CallOptions.plan

    def counting_load(cls, *args, **kwargs):
        counts["tokenizers"] += 1
        return load(cls, *args, **kwargs)

    def counting_plan(self, *args, **kwargs):
        counts["plans"] += 1
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(counting_load))
    monkeypatch.setattr(CallOptions, "plan", counting_plan)
    return counts


def test_one_check_gives_the_targets_tokenizer_eos_ids_and_context(tiny, counted):
    checked = check_hierarchy([StageSpec(model=m) for m in tiny])
    assert counted["tokenizers"] == 2  # the draft's and the target's, each once
    assert checked.eos_ids == (1,) and checked.context_length == 512
    assert checked.tokenizer.encode("t5 t7", add_special_tokens=False) == [5, 7]
    with pytest.raises(ConfigError, match=r"the target\) must be a model"):
        check_hierarchy([StageSpec(model=tiny[-1]), StageSpec(kind="prompt_lookup")])


def test_a_pipeline_handed_the_checks_loads_no_tokenizer_and_plans_its_defaults_once(tiny, counted):
    from pipespec.api import Pipeline

    specs = [StageSpec(model=m) for m in tiny]
    defaults = CallOptions(strategy="sd", lookahead=3)
    checked = check_hierarchy(specs).planned_with(defaults)
    counted.update(tokenizers=0, plans=0)
    pipe = Pipeline(specs, strategy="sd", lookahead=3, checked=checked)
    assert counted == {"tokenizers": 0, "plans": 0}
    assert pipe.tokenizer is checked.tokenizer and pipe.eos_ids == [1] and pipe.context_length == 512
    other = Pipeline(specs, strategy="sd", lookahead=2, checked=checked)  # other defaults: planned here
    assert counted == {"tokenizers": 0, "plans": 1} and other.defaults.lookahead == 2
    alone = Pipeline(specs, strategy="sd", lookahead=3)  # the public API checks by itself
    assert counted == {"tokenizers": 2, "plans": 2} and alone.eos_ids == [1]


def test_checks_cover_a_subset_of_their_stages_and_refuse_other_stages(tiny, tiny_models, counted):
    from pipespec.api import Pipeline

    checked = check_hierarchy([StageSpec(kind="prompt_lookup"), StageSpec(model=tiny[0]), StageSpec(model=tiny[1])])
    counted.update(tokenizers=0)
    subset = [StageSpec(kind="prompt_lookup", tree_nodes=4), StageSpec(model=tiny[1])]  # auto's kind of choice
    assert checked.covers(subset) and Pipeline(subset, checked=checked).context_length == 512
    assert counted["tokenizers"] == 0
    with pytest.raises(ConfigError, match="does not fit the target's context of 512 tokens"):
        Pipeline([StageSpec(kind="prompt_lookup", tree_nodes=600), StageSpec(model=tiny[1])], checked=checked)
    elsewhere = tiny_models([0.3], seed=1)
    with pytest.raises(ConfigError, match=r"made for other stages .* checked=check_hierarchy\(stages\)"):
        Pipeline([StageSpec(model=elsewhere[0]), StageSpec(model=tiny[1])], checked=checked)
    assert not checked.covers([StageSpec(model=elsewhere[1])])


def test_a_run_checks_its_hierarchy_and_plans_its_options_once(counted):
    from experiments import runner
    from experiments.compose import compose
    from experiments.run_config import RunConfig
    from experiments.hierarchies import tiny_model_dir

    tiny_model_dir("target")  # the tiny_k2 models built before counting
    config = compose("config", ["models=tiny_k2", "dataset=humaneval", "dataset.n_samples=2", "max_new_tokens=8",
                                "strategy=sd", "strategy.lookahead=3"])  # fmt: skip
    full = RunConfig.from_config(config)
    assert counted["plans"] == 1  # the config's check
    run, prompts, choice, checked = runner.prepare(full)
    pipe = runner.make_pipeline(full, run, choice, checked)
    assert counted == {"tokenizers": 2, "plans": 1}  # the draft's and the target's tokenizer, once each
    assert pipe.tokenizer is checked.tokenizer and len(prompts.prompts) == 2


def test_the_stage_process_command_line(tmp_path):
    """`python -m pipespec.worker` serves ranks 1..k for another launcher; rank 0 is the driver's."""
    (tmp_path / "stages.json").write_text(json.dumps(["prompt_lookup", "some/target"]))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    done = subprocess.run([sys.executable, "-m", "pipespec.worker", "--stages", str(tmp_path / "stages.json")],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "RANK=0 is the driver" in done.stderr and "pipespec.worker" in done.stderr
