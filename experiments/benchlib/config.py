"""The bench's options: checks of the composed `pipespec/conf/bench.yaml`, its hierarchies and prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pipespec.conf import options
from pipespec.errors import ConfigError
from pipespec.models import KERNELS
from pipespec.schedule import check_options

HF_SYSTEMS = ("hf_greedy", "hf_assisted", "hf_prompt_lookup")
OUR_SYSTEMS = ("greedy", "sd", "pipespec_k2", "pipespec_k3", "auto")
FIXED_SYSTEMS = ("greedy", "sd", "pipespec_k2", "pipespec_k3")  # what `auto` is compared with
SYSTEMS = HF_SYSTEMS + OUR_SYSTEMS
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


def check_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the composed config (a plain dict); raise BenchConfigError with a one-line message."""
    from experiments.benchlib.hf import assisted_settings

    cfg = dict(cfg)
    for key, low in (("samples", 1), ("max_new_tokens", 1), ("repetitions", 1), ("warmup_tokens", 0),
                     ("prepass_prompts", 1)):  # fmt: skip
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
    _int(hf, "threads", 1)
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
    targets = dict(cfg.get("targets") or {})
    bad = [k for k in targets if k not in TARGET_KEYS]
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
    from pipespec.hierarchies import resolve_stages

    try:
        specs = resolve_stages(node.get("stages") or [])
    except ConfigError as error:
        raise BenchConfigError(f"{key}: {error}") from None
    if len(specs) < 2:
        raise BenchConfigError(f"{key} needs at least 2 stages (drafters, then the target)")
    return Hierarchy(key, specs, node.get("family"), str(node.get("name") or key))


def load_prompts(cfg: Mapping, tokenizer, context_length: int | None, family: str) -> list[list[int]]:
    """Prompt token ids: the first `samples` of the dataset, or random ids when `random_prompt_length` is set."""
    n, max_new = cfg["samples"], cfg["max_new_tokens"]
    if cfg.get("random_prompt_length"):
        from pipespec.tiny import random_prompts

        return random_prompts(n, length=cfg["random_prompt_length"], seed=0, vocab_size=len(tokenizer))
    from pipespec.data import build_prompt_ids, load_dataset

    data_cfg = dict(cfg["dataset"], n_samples=n)
    dataset = load_dataset(data_cfg)
    context = context_length or 1_000_000
    prompts = [build_prompt_ids(s, data_cfg["prompt"], tokenizer, family, context, max_new)[0] for s in dataset.samples]
    if len(prompts) < n:
        raise BenchConfigError(f"dataset {data_cfg['name']!r} has only {len(prompts)} samples, samples={n}")
    return prompts
