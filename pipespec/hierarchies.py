"""Named model hierarchies, read from `conf/models/*.yaml` (the one place they are defined).

A stage whose `model` is `smollm2` gets the directory `pipespec.prepare` builds
offline from the SmolLM2 PyPI package (prepared on first use).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipespec.models import ConfigError, StageSpec

CONF_MODELS = Path(__file__).resolve().parent.parent / "conf" / "models"


def available() -> list[str]:
    return sorted(p.stem for p in CONF_MODELS.glob("*.yaml"))


def resolve_stage(stage: dict[str, Any]) -> StageSpec:
    stage = dict(stage)
    if stage.get("model") == "smollm2":
        from pipespec.prepare import prepare_smollm2

        stage["model"] = str(prepare_smollm2())
    return StageSpec.from_any(stage)


def load_hierarchy(name: str) -> list[StageSpec]:
    import yaml

    path = CONF_MODELS / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown model hierarchy {name!r}; available: {available()}")
    data = yaml.safe_load(path.read_text())
    stages = data.get("stages") if isinstance(data, dict) else None
    if not stages:
        raise ConfigError(f"{path} has no 'stages' list")
    return [resolve_stage(s) for s in stages]
