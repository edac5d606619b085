"""Reading the configuration tree (`conf/`, installed as the package `pipespec_conf`) through Hydra.

Entry points use `@hydra.main(config_path=CONFIG_PATH, ...)`; everything else composes with
`compose` (a whole primary config with overrides) or `load` (one group option, its own
`defaults` followed as Hydra follows them). Inside a running Hydra app both use the app's
Hydra; elsewhere they initialise one for the call. Found through the installed package, so a
wheel and an editable install read the same tree.
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from typing import Any, Iterator, Sequence

from pipespec.errors import ConfigError

# Hydra and OmegaConf are imported where the tree is read: importing this module (as `experiments.hierarchies`
# and `experiments.auto` do, and through them a run's checks) imports neither.

CONF_MODULE = "pipespec_conf"
CONFIG_PATH = f"pkg://{CONF_MODULE}"
VERSION_BASE = "1.3"


def conf_dir() -> Path:
    """The directory of the installed tree (for messages and tests)."""
    spec = importlib.util.find_spec(CONF_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the configuration package {CONF_MODULE} is not installed: pip install -e .")
    return Path(list(spec.submodule_search_locations)[0])


@contextlib.contextmanager
def _hydra() -> Iterator[None]:
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside a Hydra app: its search path holds this tree
        yield
        return
    with initialize_config_module(config_module=CONF_MODULE, version_base=VERSION_BASE):
        yield


def options(group: str) -> list[str]:
    """The selectable options of a group (files starting with `_` are shared bases, not options)."""
    from hydra.core.global_hydra import GlobalHydra

    with _hydra():
        found = GlobalHydra.instance().config_loader().get_group_options(group)
    return sorted(name for name in found if not name.startswith("_"))


def compose(config_name: str | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """A composed config as plain containers (interpolations resolved)."""
    from hydra import compose as hydra_compose
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    try:
        with _hydra():
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    except HydraException as error:
        raise ConfigError(f"cannot compose {config_name or 'the config'} {' '.join(overrides)}: "
                          f"{str(error).splitlines()[0]}") from None  # fmt: skip
    return OmegaConf.to_container(cfg, resolve=True)


def load(group: str, name: str) -> dict[str, Any]:
    """One option of a group as a plain dict, composed by Hydra (its same-group `defaults` included)."""
    available = options(group)
    if name not in available:
        raise ConfigError(f"unknown {group} {name!r}; available: {available}")
    return compose(None, [f"+{group}={name}"])[group]
