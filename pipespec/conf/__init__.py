"""The configuration tree (Hydra config groups), shipped inside the package.

`experiments.run` composes `config.yaml` and `experiments.bench` composes
`bench.yaml` from the groups here (`models/`, `strategy/`, `dataset/`,
`experiment/`, `hydra/`). Code that needs one group file without Hydra
(`pipespec` imports without it) reads it with `load(group, name)`, which
follows a file's own `defaults:` list within its group the way Hydra does
(`defaults: [cnn_dailymail, _self_]` = that file, then this one's keys on top).

Found through this module's own path, so it works from a wheel install as well
as an editable one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipespec.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent


def options(group: str) -> list[str]:
    """The selectable options of a group (files starting with `_` are shared bases, not options)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load(group: str, name: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """One group file as a plain dict, its same-group `defaults` merged in order (`_self_` last if absent)."""
    import yaml

    path = CONF_DIR / group / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown {group} {name!r}; available: {options(group)}")
    if name in _seen:
        raise ConfigError(f"{path}: defaults loop {' -> '.join(_seen + (name,))}")
    data = yaml.safe_load(path.read_text()) or {}
    defaults = data.pop("defaults", [])
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    out: dict[str, Any] = {}
    for entry in defaults:
        if not isinstance(entry, str):
            raise ConfigError(f"{path}: only same-group names and _self_ are supported in defaults, got {entry!r}")
        out = _merge(out, data if entry == "_self_" else load(group, entry, _seen + (name,)))
    return out
