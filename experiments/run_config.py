"""A run's configuration, validated once: `RunConfig.from_config(config)` at the start of a run.

    run = RunConfig.from_config(config)    # the dict Hydra composes from conf/config.yaml
    run.stages, run.call, run.budget, run.options.stall_timeout_s, run.raw

Every tool that runs what `conf/config.yaml` describes (the runner, its plan mode, `strategy=auto`, the
kernel and sizing comparisons) takes the `RunConfig` and reads its fields, never the dict. Each option
is checked here and a bad one is a `ConfigError` naming it as the user types it (`run.stall_timeout_s`,
`max_new_tokens`, `models.family`); the strategy, sampling and acceptance options are the engine's
(`pipespec.options.CallOptions`, checked against the stages by `CallOptions.plan`), whose messages name
each option by its key. The dataset section is checked by its loader (`experiments.data`) when the
run loads it. `raw` is the composed dict as given: what the run directory's config.yaml holds.
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from pipespec.errors import ConfigError
from pipespec.options import CallOptions, check_timeout
from pipespec.schedule import DEFAULT_MAX_LEAD, check_flag
from pipespec.specs import StageSpec
from experiments.auto_choice import check_auto_options, chosen_specs
from experiments.data import DatasetPrompts, prompts_for
from experiments.data.quality import quality_setup
from experiments.hub import preflight
from experiments.placement import place_stages

FAMILIES = ("base", "chat")
# config section -> {key as the user types it: the `CallOptions` field it sets}
CALL_KEYS = {
    "strategy": {"name": "strategy", "lookahead": "lookahead", "max_lead": "max_lead",
                 "draft_confidence": "draft_confidence", "size_verification": "size_verification",
                 "cascade": "cascade", "value_stop": "value_stop"},
    "sampling": {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "seed": "seed"},
    "acceptance": {"mode": "acceptance", "rate": "synthetic_rates"},
}  # fmt: skip
STRATEGY_ONLY_KEYS = ("profile", "learn")  # strategy auto: the profile.json it chooses from; learn while running
# the `CallOptions` fields a `Pipeline` takes as the defaults of its calls
PIPELINE_CALL_FIELDS = ("strategy", "lookahead", "max_lead", "draft_confidence", "size_verification", "cascade",
                        "value_stop", "temperature", "top_k", "top_p", "seed", "acceptance", "synthetic_rates")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_budget(value) -> int:
    """`max_new_tokens`: the tokens each sample may generate."""
    if not _is_int(value) or value <= 0:
        raise ConfigError(f"max_new_tokens must be an integer > 0, got {value!r}")
    return value


def check_family(value) -> str:
    """`models.family`: which of the dataset's prompt templates the models take."""
    if value not in FAMILIES:
        raise ConfigError(f"models.family must be 'base' or 'chat', got {value!r}")
    return value


def section(config: Mapping[str, Any], name: str, keys=None, required: bool = False) -> dict[str, Any]:
    """The mapping `config[name]` ({} where absent, unless `required`); a `ConfigError` for another type or,
    given `keys`, for a key outside them."""
    value = config.get(name)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a mapping, got {value!r}")
    unknown = sorted(set(value) - set(keys)) if keys is not None else []
    if unknown:
        raise ConfigError(f"unknown {name} option(s) {unknown}; expected some of {sorted(keys)}")
    return dict(value)


@dataclass(frozen=True)
class RunOptions:
    """The `run` section: how a run is carried out (what it measures is the rest of the config)."""

    plan: bool = False  # print stage -> device placement and memory estimates, load nothing
    resume: bool = False  # continue an interrupted run in its directory: finished samples are kept
    reference_run: str | None = None  # greedy run directory to compare outputs and speed with
    warmup_tokens: int = 8  # one short untimed generation first (0: none)
    progress: bool = True
    stall_timeout_s: float = 30.0  # a stage silent this long ends the run with an error naming it
    start_timeout_s: float = 600.0  # loading every stage's model and connecting
    near_tie_margin: float | None = None  # top-2 logit margin of a near-tie; None: by the target's dtype
    execute_code: bool = False  # HumanEval pass@1 runs model-written code
    gpu_monitor: bool = True  # the driver's GPUs every 100 ms into gpu.csv

    def __post_init__(self) -> None:
        for name in ("plan", "resume", "progress", "execute_code", "gpu_monitor"):
            check_flag(f"run.{name}", getattr(self, name))
        check_timeout("run.stall_timeout_s", self.stall_timeout_s)
        check_timeout("run.start_timeout_s", self.start_timeout_s)
        if not _is_int(self.warmup_tokens) or self.warmup_tokens < 0:
            raise ConfigError(f"run.warmup_tokens must be an integer >= 0 (0: no warm-up), got {self.warmup_tokens!r}")
        if self.reference_run is not None and (not isinstance(self.reference_run, str) or not self.reference_run):
            raise ConfigError(f"run.reference_run must be null or a greedy run directory, got {self.reference_run!r}")
        margin = self.near_tie_margin
        if margin is not None and (not _is_number(margin) or margin < 0):
            raise ConfigError(f"run.near_tie_margin must be null (by the target's dtype) or a number >= 0, "
                              f"got {margin!r}")  # fmt: skip

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "RunOptions":
        """The `run` section of a composed config (defaults where absent)."""
        return cls(**section(config, "run", [f.name for f in fields(cls)]))


def call_options(config: Mapping[str, Any]) -> CallOptions:
    """The strategy, sampling and acceptance sections as the engine's call options (sample i of a run draws
    with `sampling.seed` + i)."""
    given = {}
    for name, keys in CALL_KEYS.items():
        extra = STRATEGY_ONLY_KEYS if name == "strategy" else ()
        values = section(config, name, [*keys, *extra], required=name == "strategy")
        given.update({keys[key]: value for key, value in values.items() if key in keys})
    if "strategy" not in given:
        raise ConfigError("strategy.name is required: greedy, sd, pipespec or auto")
    call = CallOptions(**{"seed": 0, **given})
    if not _is_int(call.seed):
        raise ConfigError(f"sampling.seed must be an integer >= 0 (sample i draws with seed + i), got {call.seed!r}")
    return call


def check_call(call: CallOptions, stages: tuple[StageSpec, ...]) -> None:
    """The engine's checks of `call` against the stages (`CallOptions.plan`). Under strategy auto, which
    chooses the strategy, lookahead, max_lead and stages itself, the options it leaves to the config are
    checked as any strategy's over the whole hierarchy."""
    if call.strategy == "auto":
        check_auto_options(call.draft_confidence, call.value_stop)
        call = replace(call, strategy="pipespec" if len(stages) > 1 else "greedy", lookahead=0,
                       max_lead=DEFAULT_MAX_LEAD)  # fmt: skip
    call.plan([s.kind for s in stages], [s.label for s in stages], [s.tree_nodes for s in stages])


def check_learn(strategy: Mapping[str, Any]) -> bool:
    """`strategy.learn` (strategy auto): revise the profile from the run's own calls and switch configuration."""
    learn = strategy.get("learn", False)
    if not isinstance(learn, bool):
        raise ConfigError(f"strategy.learn must be true or false, got {learn!r}")
    if learn and strategy.get("name") != "auto":
        raise ConfigError(f"strategy.learn is for strategy auto, got strategy {strategy.get('name')!r}")
    return learn


def check_profile(strategy: Mapping[str, Any]) -> str | None:
    """`strategy.profile` (strategy auto): a profile.json path, or None for the cached short profile."""
    profile = strategy.get("profile")
    if profile is not None and (not isinstance(profile, str) or not profile):
        raise ConfigError(f"strategy.profile must be a profile.json path or null, got {profile!r}")
    return profile


def check_quality(dataset: Mapping[str, Any], options: RunOptions) -> None:
    """`dataset.metric` and the pass@1 settings, before any stage starts: an unknown metric id is a `MetricError`
    naming it whether or not the dataset has references (`experiments.data.quality.quality_setup`)."""
    quality_setup(dataset, options.execute_code)


@dataclass(frozen=True)
class RunConfig:
    """One run of a hierarchy x strategy x dataset, validated (`from_config`)."""

    hierarchy: str  # models.name
    family: str  # models.family: which prompt template the models take
    stages: tuple[StageSpec, ...]  # resolved and checked, smallest drafter first, the target last
    call: CallOptions  # strategy, sampling and acceptance of every call (strategy "auto": see `chosen`)
    profile: str | None  # strategy auto: the profile.json it chooses from (None: the cached short one)
    learn: bool  # strategy auto: learn from the run's own calls and switch configuration (`AutoPipeline`)
    dataset: dict[str, Any]  # the dataset section, for `experiments.data`
    budget: int  # max_new_tokens
    options: RunOptions  # the run section
    raw: dict[str, Any]  # the composed config as given (config.yaml of the run directory)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "RunConfig":
        """Check every option of a composed `conf/config.yaml` (a plain mapping) and resolve the stages (the
        `tiny:` and `smollm2` aliases built; `placement` and `precision` applied and recorded in `raw`, where they
        change a stage: `experiments.placement`; under `run.plan`, GPUs this machine lacks accepted)."""
        if not isinstance(config, Mapping):
            raise ConfigError(f"a run config must be a mapping, got {type(config).__name__}")
        options = RunOptions.from_config(config)
        preflight(config, plan=options.plan)  # hub.offline resolved, hub ids checked, before anything loads
        budget = check_budget(config.get("max_new_tokens"))
        models = section(config, "models", required=True)
        family = check_family(models.get("family", "base"))
        hierarchy = models.get("name")
        if not isinstance(hierarchy, str) or not hierarchy:
            raise ConfigError(f"models.name must be the hierarchy's name, got {hierarchy!r}")
        placed_name, placed, stages = place_stages(models, config.get("placement"), config.get("precision"),
                                                   options.plan)  # fmt: skip
        stages = tuple(stages)
        call = call_options(config)
        check_call(call, stages)
        dataset = section(config, "dataset", required=True)
        if not isinstance(dataset.get("name"), str):
            raise ConfigError(f"dataset.name must be the dataset's name, got {dataset.get('name')!r}")
        check_quality(dataset, options)
        raw = copy.deepcopy(dict(config))
        if (placed_name, placed) != (hierarchy, models.get("stages")):  # config.yaml records the stages as run
            raw["models"] = {**raw["models"], "name": placed_name, "stages": copy.deepcopy(placed)}
        return cls(placed_name, family, stages, call, check_profile(config["strategy"]),
                   check_learn(config["strategy"]), dataset, budget, options, raw)  # fmt: skip

    @property
    def is_auto(self) -> bool:
        """Strategy auto: the strategy, lookahead, max_lead and stages are chosen at the start (`chosen`)."""
        return self.call.strategy == "auto"

    @property
    def target(self) -> StageSpec:
        return self.stages[-1]

    def chosen(self, choice) -> "RunConfig":
        """This run at an `experiments.auto_choice.AutoChoice`: its stages (the first with the chosen tree size),
        strategy, lookahead and max_lead."""
        call = replace(self.call, strategy=choice.strategy, lookahead=choice.lookahead, max_lead=choice.max_lead)
        stages = chosen_specs(self.stages, choice.stages, getattr(choice, "tree_nodes", 0))
        return replace(self, stages=stages, call=call)

    def pipeline_options(self) -> dict[str, Any]:
        """The `Pipeline` keyword arguments of this run: its call options as the calls' defaults, and the
        run's timeouts."""
        return {**{name: getattr(self.call, name) for name in PIPELINE_CALL_FIELDS},
                "stall_timeout_s": self.options.stall_timeout_s, "start_timeout_s": self.options.start_timeout_s}

    def recorded(self) -> dict[str, Any]:
        """The config summary.json describes: `raw` with the strategy that ran (auto's choice in its place)."""
        strategy = {**self.raw["strategy"], "name": self.call.strategy, "lookahead": self.call.lookahead,
                    "max_lead": self.call.max_lead}  # fmt: skip
        return {**self.raw, "strategy": strategy}

    def prompts(self, tokenizer, context_length: int | None) -> "DatasetPrompts":
        """The run's prompts (`experiments.data.prompts_for`): every sample of its dataset selection."""
        return prompts_for(self.dataset, tokenizer, self.family, context_length, self.budget)
