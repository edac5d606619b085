"""Both installs find the top-level `conf/` tree (the package `pipespec_conf`): every config composes.

A wheel-style install: `pip install --no-deps --no-build-isolation --target` (offline, setuptools
from .venv) of a copy of the sources, used from another working directory with only that install
on the path for pipespec / experiments / analysis / pipespec_conf (the dependencies come from .venv).
An editable install: `pip install -e` of another copy of the sources into a fresh virtual
environment that sees .venv's packages, used from another working directory.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SLOW_FIXTURES = ("install",)  # a wheel-style install into a folder: its tests are `slow` (conftest.py)

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "pipespec", "experiments", "analysis", "conf")

COMPOSE_ALL = r"""
import json, sys
from pathlib import Path
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
import analysis, experiments, pipespec, pipespec_conf
from experiments.compose import CONF_MODULE, conf_dir, options
from experiments.hierarchies import read_hierarchy

install = Path(sys.argv[1]).resolve()
for module in (pipespec, experiments, analysis, pipespec_conf):
    assert Path(module.__file__).resolve().is_relative_to(install), module.__file__
assert read_hierarchy("tiny_k2")["stages"], "a group read outside Hydra"
done = []
with initialize_config_module(config_module=CONF_MODULE, version_base="1.3"):
    jobs = [("config", [f"{group}={name}"]) for group in ("models", "strategy", "dataset") for name in options(group)]
    jobs += [("config", [f"experiment={name}"]) for name in options("experiment")]
    jobs += [("bench", [])] + [("bench", [f"models@k2={name}"]) for name in options("models")]
    for config, overrides in jobs:
        cfg = OmegaConf.to_container(compose(config, overrides=overrides), resolve=True)
        assert cfg["dataset"]["prompt"]["chat"].count("{source}") == 1, (config, overrides)
        done.append(f"{config} {' '.join(overrides)}")
print(json.dumps({"conf": str(conf_dir()), "composed": done}))
"""


def copy_sources(destination: Path) -> Path:
    destination.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, destination / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(path, destination / name)
    return destination


@pytest.fixture(scope="module")
def install(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    source = copy_sources(tmp / "source")
    target = tmp / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
         "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return target


def run_installed(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(target), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_wheel_install_ships_and_composes_every_config(install, tmp_path):
    shipped = install / "pipespec_conf"
    assert (shipped / "config.yaml").exists() and (shipped / "bench.yaml").exists()
    assert (shipped / "models" / "README.md").exists()
    for group in ("models", "strategy", "dataset", "experiment", "hydra"):
        sources = {p.name for p in (ROOT / "conf" / group).glob("*.yaml")}
        assert sources and sources == {p.name for p in (shipped / group).glob("*.yaml")}, group
    done = run_installed(install, tmp_path, "-c", COMPOSE_ALL, str(install))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(out["conf"]).resolve() == shipped.resolve()
    assert "config experiment=table2_cnndm_llama2" in out["composed"] and "bench " in out["composed"]


@pytest.mark.parametrize("entry, key", [("experiments.run", "strategy"), ("experiments.bench", "k3")])
def test_entry_points_find_their_config_from_the_install(install, tmp_path, entry, key):
    done = run_installed(install, tmp_path, "-m", entry, "--cfg", "job")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"\n{key}:" in "\n" + done.stdout


@pytest.mark.slow
def test_editable_install_composes_every_config_from_the_top_level_conf(tmp_path):
    """`pip install -e` maps the package pipespec_conf to the checkout's conf/: edits there are seen."""
    source = copy_sources(tmp_path / "source")
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    python = venv / "bin" / "python"
    site = subprocess.run([sys.executable, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    # .venv's packages (setuptools, the dependencies) seen from the new environment
    (Path(subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                         text=True, check=True).stdout.strip()) / "dotvenv.pth").write_text(site + "\n")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "-e", str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    ran = subprocess.run([str(python), "-c", COMPOSE_ALL, str(source)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert Path(out["conf"]).resolve() == (source / "conf").resolve()
    assert "config experiment=table2_cnndm_llama2" in out["composed"] and "bench " in out["composed"]
