"""Named model hierarchies: the `models` group of the configuration tree (`conf/models/*.yaml`, the one place
they are defined), composed through Hydra (`experiments.compose`).

Two model aliases need no hub: `smollm2` is the directory `experiments.prepare`
builds offline from the SmolLM2 PyPI package, and `tiny:NAME` a tiny random
LLaMA from `experiments.tiny` (`tiny:target`, `tiny:draft_noise0.3`,
`tiny:draft_noise0.05`), built into the cache on first use in a second.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from experiments.compose import load, options
from experiments.hub import check_models
from experiments.prepare import prepare_smollm2
from experiments.tiny import build_tiny_hierarchy
from pipespec.cache import cache_root
from pipespec.errors import ConfigError
from pipespec.specs import check_target_options, StageSpec

# nothing is deferred here: experiments.tiny and experiments.prepare import torch and transformers only where
# they build a model, so naming a hierarchy (and its `tiny:` or `smollm2` stages once built) imports neither.

TINY_DRAFT_NOISE = (0.3, 0.05)  # the tiny drafts, in build order (their weights depend on it)


def available() -> list[str]:
    return options("models")


def tiny_model_dir(name: str) -> Path:
    """Directory of a `tiny:NAME` model, building the tiny hierarchy atomically on first use."""
    names = {"target": "target"}
    names.update({f"draft_noise{noise}": f"draft{i}_noise{noise}" for i, noise in enumerate(TINY_DRAFT_NOISE)})
    if name not in names:
        raise ConfigError(f"unknown tiny model 'tiny:{name}'; available: {sorted('tiny:' + n for n in names)}")
    root = cache_root() / "models" / "tiny"
    if not (root / "target" / "config.json").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=root.parent))
        try:
            build_tiny_hierarchy(staging, TINY_DRAFT_NOISE, seed=0)
            try:
                os.replace(staging, root)  # readers never see a half-built directory
            except OSError:  # another process built it first (the same seed: the same models)
                if not (root / "target" / "config.json").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return root / names[name]


def resolve_stage(stage: StageSpec | str | Mapping[str, Any], check_devices: bool = True) -> StageSpec:
    if isinstance(stage, Mapping):
        stage = dict(stage)
        model = str(stage.get("model") or "")
        if model == "smollm2":
            stage["model"] = str(prepare_smollm2())
        elif model.startswith("tiny:"):
            stage["model"] = str(tiny_model_dir(model.partition(":")[2]))
    return StageSpec.from_any(stage, check_devices)


def resolve_stages(stages: Sequence[StageSpec | str | Mapping[str, Any]], check_devices: bool = True) -> list[StageSpec]:
    """Stage specs from a config list; `check_devices=False` (plan mode) accepts GPUs this machine lacks."""
    if not stages:
        raise ConfigError("models.stages is empty: list the stages, smallest drafter first, target last")
    check_models(stages, plan=not check_devices)  # hub models: in the local cache offline, a token if gated
    specs = [resolve_stage(s, check_devices) for s in stages]
    check_target_options(specs)  # e.g. vocab_limit is for drafters: the last stage is the target
    return specs


def read_hierarchy(name: str) -> dict[str, Any]:
    if name not in available():
        raise ConfigError(f"unknown model hierarchy {name!r}; available: {available()}")
    data = load("models", name)
    if not isinstance(data, dict) or not data.get("stages"):
        raise ConfigError(f"models/{name}.yaml has no 'stages' list")
    return data


def load_hierarchy(name: str) -> list[StageSpec]:
    return resolve_stages(read_hierarchy(name)["stages"])
