"""The bench's options: checks of the composed `conf/bench.yaml`, its hierarchies and prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from experiments.compose import options
from experiments.data import prompts_for
from experiments.hierarchies import resolve_stages
from experiments.tiny import random_prompts
from pipespec.errors import ConfigError
from pipespec.specs import KERNELS
from pipespec.schedule import check_cascade, check_options

# experiments.benchlib.hf (torch) is imported where the options are checked (`check_config`): the bench's
# command-line check (`check_group_overrides`) and the modules that read these names import no torch.

HF_SYSTEMS = ("hf_greedy", "hf_compiled", "hf_assisted", "hf_prompt_lookup")
HF_GREEDY_SYSTEMS = ("hf_greedy", "hf_compiled")  # the headline ratios are against the faster of the two
OUR_SYSTEMS = ("greedy", "sd", "pipespec_k2", "pipespec_k3", "auto")
FIXED_SYSTEMS = ("greedy", "sd", "pipespec_k2", "pipespec_k3")  # what `auto` is compared with
# llama.cpp (optional: `bash scripts/llamacpp.sh`; `benchlib.llamacpp`), left out with its reason where it cannot run
LLAMACPP_SYSTEMS = ("llamacpp_greedy", "llamacpp_q4", "llamacpp_prompt_lookup")
SYSTEMS = HF_SYSTEMS + OUR_SYSTEMS + LLAMACPP_SYSTEMS
TARGET_KEYS = (
    "greedy_vs_hf_greedy",
    "sd_vs_hf_assisted",
    "pipespec_k2_vs_hf_assisted",
    "pipespec_k2_vs_hf_greedy",
    "pipespec_k3_vs_hf_greedy",
    "pipespec_target_busy",
    "pipespec_vs_ideal",
    "auto_vs_best_fixed",
    "auto_vs_greedy",
    "best_speculative_vs_hf_greedy",  # the fastest sd / pipespec system of any hierarchy
    "best_speculative_vs_best_hf_speculative",  # ... against the faster of HF assisted and HF prompt lookup
    "best_pipespec_vs_best_sd",
)
PER_HIERARCHY_STRATEGIES = ("sd", "pipespec")  # systems "sd@NAME" / "pipespec@NAME" of `hierarchies`


def per_hierarchy(system: str) -> tuple[str, str] | None:
    """(strategy, hierarchy name) of a system "STRATEGY@NAME", else None."""
    strategy, at, name = system.partition("@")
    return (strategy, name) if at else None


def is_sd(system: str) -> bool:
    return system == "sd" or system.startswith("sd@")


def is_speculative(system: str) -> bool:
    """Our sd and pipespec systems, of any hierarchy (not greedy, not auto)."""
    return is_sd(system) or system.startswith("pipespec")
# the config groups bench.yaml composes: defaults-list key -> group
GROUPS = {"models@k2": "models", "models@k3": "models", "strategy@pipespec": "strategy",
          "strategy@sd": "strategy", "dataset": "dataset"}  # fmt: skip


class BenchConfigError(ConfigError):
    """A bench option is invalid; the message names it."""


def check_group_overrides(argv: Sequence[str]) -> None:
    """A group option on the command line that has no file: one line naming it (before Hydra composes)."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if sep and key in GROUPS and value not in options(GROUPS[key]):
            raise BenchConfigError(f"unknown {GROUPS[key]} {value!r} for {key}; available: {options(GROUPS[key])}")


def _int(cfg: Mapping, key: str, low: int, none_ok: bool = False) -> None:
    value = cfg.get(key)
    if none_ok and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BenchConfigError(f"{key} must be {'null or ' if none_ok else ''}an integer >= {low}, got {value!r}")


def _thread_counts(value: Any, key: str) -> list[int]:
    """Torch thread counts to time in the pre-pass (one: no pre-pass): an integer >= 1 or a list of them."""
    counts = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(counts, (list, tuple)) or not counts or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):  # fmt: skip
        raise BenchConfigError(f"{key} must be an integer >= 1 or a non-empty list of them, got {value!r}")
    return list(dict.fromkeys(counts))


def check_llamacpp(node: Mapping | None) -> dict[str, Any]:
    """`llamacpp`: the llama.cpp systems' thread counts (the faster in the pre-pass), context size, KV cache type
    and the HF logit margin under which a differing output counts as a near tie."""
    out = {"threads": [1, 2], "n_ctx": 2048, "kv_type": "f32", "near_tie_logit": 0.05, **(node or {})}
    unknown = sorted(set(out) - {"threads", "n_ctx", "kv_type", "near_tie_logit"})
    if unknown:
        raise BenchConfigError(f"unknown llamacpp setting(s) {unknown}; expected threads, n_ctx, kv_type, near_tie_logit")
    out["threads"] = _thread_counts(out["threads"], "llamacpp.threads")
    if isinstance(out["n_ctx"], bool) or not isinstance(out["n_ctx"], int) or out["n_ctx"] < 16:
        raise BenchConfigError(f"llamacpp.n_ctx must be an integer >= 16, got {out['n_ctx']!r}")
    if out["kv_type"] not in ("f32", "f16"):
        raise BenchConfigError(f"llamacpp.kv_type must be f32 or f16, got {out['kv_type']!r}")
    tie = out["near_tie_logit"]
    if isinstance(tie, bool) or not isinstance(tie, (int, float)) or tie < 0:
        raise BenchConfigError(f"llamacpp.near_tie_logit must be a number >= 0, got {tie!r}")
    return out


def _strategy(cfg: Mapping, key: str, lookahead: int | None = None, confidence: float | None = None) -> None:
    """Ranges of a composed strategy node, by the engine's own check."""
    node = cfg.get(key) or {}
    if node.get("name") != key:
        raise BenchConfigError(f"strategy@{key} must be a {key} strategy file, got name {node.get('name')!r}")
    look = node.get("lookahead", 0) if lookahead is None else lookahead
    conf = node.get("draft_confidence", 0.0) if confidence is None else confidence
    try:
        check_options(key, 2, look, node.get("max_lead"), conf)
    except ConfigError as error:
        raise BenchConfigError(f"{key}: {error}") from None


def sd_candidates(cfg: Mapping) -> list[tuple[int, float]]:
    """(window, draft_confidence) pairs sd's pre-pass times: sd_windows x sd_draft_confidences (null = sd's own)."""
    sd = cfg["sd"]
    windows = cfg.get("sd_windows") or [sd["lookahead"]]
    stops = cfg.get("sd_draft_confidences") or [sd.get("draft_confidence", 0.0)]
    return [(w, c) for c in stops for w in windows]


SYSTEM_OPTIONS = ("lookahead", "max_lead", "draft_confidence", "size_verification", "cascade", "value_stop")


def is_pipespec(system: str) -> bool:
    return system in ("pipespec_k2", "pipespec_k3") or system.startswith("pipespec@")


def check_system_options(cfg: Mapping, systems: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`system_options`: per pipespec system, strategy settings over `pipespec`'s (e.g. a lookahead of its own)."""
    given = cfg.get("system_options") or []
    if not isinstance(given, (list, tuple)) or not all(isinstance(e, Mapping) and "system" in e for e in given):
        raise BenchConfigError(f"system_options must be a list of {{system: NAME, SETTING: VALUE, ...}}, got {given!r}")
    out = {}
    for entry in given:
        system, settings = entry["system"], {k: v for k, v in entry.items() if k != "system"}
        if system in out:
            raise BenchConfigError(f"system_options lists {system!r} twice")
        if not isinstance(system, str) or not is_pipespec(system):
            raise BenchConfigError(f"system_options: {system!r} is not a pipespec system (pipespec_k2, pipespec_k3 "
                                   f"or pipespec@HIERARCHY)")  # fmt: skip
        if system not in systems:
            continue  # the defaults name systems a bench may leave out
        if not isinstance(settings, Mapping) or set(settings) - set(SYSTEM_OPTIONS):
            raise BenchConfigError(f"system_options.{system}: expected settings among {list(SYSTEM_OPTIONS)}, "
                                   f"got {settings!r}")  # fmt: skip
        merged = {**cfg["pipespec"], **settings}
        try:
            check_options("pipespec", 3, merged.get("lookahead", 0), merged.get("max_lead"),
                          merged.get("draft_confidence", 0.0), merged.get("value_stop", 0.0))  # fmt: skip
            check_cascade("pipespec", 3, merged.get("cascade", False))
        except ConfigError as error:
            raise BenchConfigError(f"system_options.{system}: {error}") from None
        out[system] = dict(settings)
    return out


def check_datasets(cfg: Mapping) -> list[str]:
    """`datasets`: the datasets one invocation covers (null: the composed `dataset` alone)."""
    names = cfg.get("datasets")
    if names is None or cfg.get("random_prompt_length"):
        return []
    if not isinstance(names, (list, tuple)) or not names or len(set(names)) != len(names):
        raise BenchConfigError(f"datasets must be null or a list of distinct dataset names, got {names!r}")
    unknown = [n for n in names if n not in options("dataset")]
    if unknown:
        raise BenchConfigError(f"unknown dataset(s) {unknown} in datasets; available: {options('dataset')}")
    by_dataset = cfg.get("targets_by_dataset") or {}
    if not isinstance(by_dataset, Mapping) or set(by_dataset) - set(names):
        raise BenchConfigError(f"targets_by_dataset must map some of {list(names)} to targets, got {by_dataset!r}")
    return list(names)


def check_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the composed config (a plain dict); raise BenchConfigError with a one-line message."""
    from experiments.benchlib.hf import assisted_settings

    cfg = dict(cfg)
    for key, low in (("samples", 1), ("max_new_tokens", 1), ("repetitions", 1), ("warmup_tokens", 0),
                     ("prepass_prompts", 1), ("prompt_offset", 0)):  # fmt: skip
        _int(cfg, key, low)
    _int(cfg, "random_prompt_length", 1, none_ok=True)
    systems = cfg.get("systems")
    if not isinstance(systems, (list, tuple)) or not systems:
        raise BenchConfigError(f"systems must be a non-empty list of {list(SYSTEMS)}, got {systems!r}")
    hierarchies = cfg.get("hierarchies") or []
    if not isinstance(hierarchies, (list, tuple)) or not all(isinstance(h, str) and h for h in hierarchies):
        raise BenchConfigError(f"hierarchies must be a list of hierarchy names, got {hierarchies!r}")
    systems = list(systems) + [f"{strategy}@{name}" for name in hierarchies for strategy in PER_HIERARCHY_STRATEGIES
                               if f"{strategy}@{name}" not in systems]  # fmt: skip
    unknown = [s for s in systems if s not in SYSTEMS and (per_hierarchy(s) or ("",))[0] not in PER_HIERARCHY_STRATEGIES]
    if unknown:
        raise BenchConfigError(f"unknown system(s) {unknown} in systems; expected some of {list(SYSTEMS)} or "
                               f"STRATEGY@HIERARCHY with a strategy of {list(PER_HIERARCHY_STRATEGIES)}")  # fmt: skip
    if len(set(systems)) != len(systems):
        raise BenchConfigError(f"systems lists a system twice: {list(systems)}")
    cfg["systems"] = systems
    _strategy(cfg, "pipespec")
    cfg["system_options"] = check_system_options(cfg, systems)
    if any(is_sd(s) for s in systems):
        for window, confidence in sd_candidates(cfg):
            if isinstance(window, bool) or not isinstance(window, int) or window < 1:
                raise BenchConfigError(f"sd_windows must be integers >= 1, got {window!r}")
            _strategy(cfg, "sd", window, confidence)
    if "auto" in systems:
        auto = cfg.get("auto") or {}
        if auto.get("hierarchy") not in ("k2", "k3"):
            raise BenchConfigError(f"auto.hierarchy must be k2 or k3, got {auto.get('hierarchy')!r}")
        if auto.get("profile") is not None and not isinstance(auto["profile"], str):
            raise BenchConfigError(f"auto.profile must be a profile.json path or null, got {auto['profile']!r}")
    if cfg.get("prompt_family") not in (None, "chat", "base"):
        raise BenchConfigError(f"prompt_family must be chat, base or null, got {cfg.get('prompt_family')!r}")
    hf = dict(cfg.get("hf") or {})
    hf["threads"] = _thread_counts(hf.get("threads"), "hf.threads")
    cfg["greedy_threads"] = _thread_counts(cfg.get("greedy_threads", [1]), "greedy_threads")
    hf.setdefault("static_cache_len", 2048)  # hf_compiled: the static cache every call shares
    _int(hf, "static_cache_len", 16)
    hf.setdefault("kernels", "torch")  # HF generate as users run it
    if hf["kernels"] not in KERNELS:
        raise BenchConfigError(f"hf.kernels must be one of {list(KERNELS)}, got {hf.get('kernels')!r}")
    assisted = hf.get("assisted")
    if isinstance(assisted, Mapping):
        assisted = [assisted]
    if "hf_assisted" in systems:
        if not isinstance(assisted, (list, tuple)) or not assisted:
            raise BenchConfigError("hf.assisted must be a non-empty list of assisted-generation settings")
        try:
            hf["assisted"] = [assisted_settings(a) for a in assisted]
        except ConfigError as error:
            raise BenchConfigError(f"hf.assisted: {error}") from None
    for key in ("prompt_lookup_num_tokens", "max_matching_ngram_size"):
        _int(hf, key, 1, none_ok=True)
    cfg["hf"] = hf
    cfg["llamacpp"] = check_llamacpp(cfg.get("llamacpp"))
    targets = dict(cfg.get("targets") or {})
    for node in [targets, *(cfg.get("targets_by_dataset") or {}).values()]:
        bad = [k for k in (node or {}) if k not in TARGET_KEYS]
        if bad:
            raise BenchConfigError(f"unknown target(s) {bad}; expected some of {list(TARGET_KEYS)}")
    cfg["targets"] = targets
    return cfg


@dataclass
class Hierarchy:
    key: str
    stages: list  # StageSpec, smallest first
    family: str | None
    label: str


def resolve_hierarchy(key: str, node: Mapping[str, Any]) -> Hierarchy:
    """A composed `models` node (name, family, stages) as resolved stage specs."""
    try:
        specs = resolve_stages(node.get("stages") or [])
    except ConfigError as error:
        raise BenchConfigError(f"{key}: {error}") from None
    if len(specs) < 2:
        raise BenchConfigError(f"{key} needs at least 2 stages (drafters, then the target)")
    return Hierarchy(key, specs, node.get("family"), str(node.get("name") or key))


def load_prompts(cfg: Mapping, tokenizer, context_length: int | None, family: str) -> list[list[int]]:
    """Prompt token ids: `samples` of the dataset after its first `prompt_offset`, or random ids when
    `random_prompt_length` is set."""
    n, max_new, offset = cfg["samples"], cfg["max_new_tokens"], cfg.get("prompt_offset") or 0
    if cfg.get("random_prompt_length"):
        return random_prompts(n, length=cfg["random_prompt_length"], seed=0, vocab_size=len(tokenizer))
    found = prompts_for(cfg["dataset"], tokenizer, family, context_length, max_new, count=n, offset=offset)
    if len(found.prompts) < n:
        raise BenchConfigError(f"dataset {found.name!r} has only {len(found.dataset.samples)} samples, "
                               f"prompt_offset={offset} + samples={n}")  # fmt: skip
    return found.ids()
