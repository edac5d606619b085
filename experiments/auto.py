"""`auto`: the configuration a machine profile predicts fastest, greedy included.

    with AutoPipeline(stages, profile="profile.json") as pipe:   # or no profile: the cached short one
        print(pipe.auto.reason)
        result = pipe.generate("def fib(n):", 64)

    choice = choose(specs, profile_path, hierarchy="smollm2_int8_fp32")   # the choice alone

The runner's `strategy=auto` and the bench's `auto` system make the same choice.

The ranking is `analysis.predict.sweep` (greedy, sd windows, pipespec lookahead x max_lead, on every
subset of the stages that keeps the target; with a model-free first stage whose token trees the profile
measured, every tree size too: the choice then sets that stage's `tree_nodes`).

Without a profile, a short one (`experiments.profiler.SHORT_OPTIONS`, about a minute for SmolLM2) is
measured once on the first prompts of the run's dataset (the API: the prompts given, else the first
HumanEval problems) and cached per machine, hierarchy and prompts under
`pipespec.cache.cache_root() / "profiles"`: acceptance differs between datasets, so a news run never
takes the profile of a code run.
A profile measured on another machine, hierarchy or library version is a `ConfigError` naming what
differs. When nothing is predicted to beat greedy, the choice is greedy, and the reason says so.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from pipespec.api import Pipeline, encode_prompt
from pipespec.errors import ConfigError
from pipespec.hierarchy import check_hierarchy
from experiments.machine import stage_identity
from pipespec.specs import StageSpec
from analysis.predict import sweep
from analysis.profile import ProfileError, VERSION, load_profile, mismatches, this_machine
from analysis.rundir import atomic_write_json
from experiments.auto_choice import AutoChoice, check_auto_options, chosen_specs  # their home; re-exported here
from experiments.compose import load
from experiments.data import prompts_for
from experiments.profiler import (SHORT_OPTIONS, SHORT_PROMPTS, SHORT_PROMPTS_WITH_COSTS, measure_profile,
                                  short_profile_prompts)
from pipespec.cache import cache_root

# analysis.learn (scipy) is imported where a learning AutoPipeline uses it: importing this module (the runner,
# the bench) and choosing a configuration stay without scipy.

RUNNERS_UP = 4  # candidates recorded beside the choice
PREDICT_TOKENS = 128  # the generation length the ranking simulates


def _candidate(prediction) -> dict[str, Any]:
    trees = {"tree_nodes": prediction.tree_nodes} if prediction.tree_nodes else {}
    return {"strategy": prediction.strategy, "lookahead": prediction.lookahead, "max_lead": prediction.max_lead,
            "stages": list(prediction.stage_indices), **trees,
            "predicted_tokens_per_s": prediction.predicted_tokens_per_s}


def choose_from_profile(profile_path: str | Path, specs: Sequence[StageSpec],
                        hierarchy: str | None = None) -> AutoChoice:  # fmt: skip
    """The best predicted configuration for `specs` from the profile at `profile_path`."""
    try:
        profile = load_profile(profile_path)
    except ProfileError as error:
        raise ConfigError(f"strategy auto: {error}") from None
    found = mismatches(profile, hierarchy=hierarchy, stages=[stage_identity(s) for s in specs])
    if found:
        raise ConfigError(f"strategy auto: the profile {profile.path} does not fit this run: {'; '.join(found)} "
                          "(measure one here: python -m experiments.profile, or pass no profile)")  # fmt: skip
    ranked, notes = sweep(profile, PREDICT_TOKENS)
    best = ranked[0]
    greedy = next(p for p in ranked if p.strategy == "greedy")
    if best.strategy == "greedy":
        second = ranked[1] if len(ranked) > 1 else None
        reason = ("no configuration is predicted to beat greedy" + (
            f" (the best other, {second.strategy} lookahead {second.lookahead} max_lead {second.max_lead} on "
            f"{' > '.join(second.stages)}, {second.predicted_tokens_per_s:.1f} tokens/s against greedy "
            f"{greedy.predicted_tokens_per_s:.1f})" if second else ""))  # fmt: skip
    else:
        reason = (f"predicted {best.predicted_tokens_per_s:.1f} tokens/s, "
                  f"{best.predicted_tokens_per_s / greedy.predicted_tokens_per_s:.2f}x greedy's "
                  f"{greedy.predicted_tokens_per_s:.1f}")  # fmt: skip
    if notes:
        reason += "; " + "; ".join(notes)
    return AutoChoice(best.strategy, best.lookahead, best.max_lead, tuple(best.stage_indices),
                      best.predicted_tokens_per_s, tuple(_candidate(p) for p in ranked[1 : 1 + RUNNERS_UP]),
                      reason, str(profile.path), best.tree_nodes)  # fmt: skip


# ---- the cached short profile ------------------------------------------------------------------------


def _profile_key(specs: Sequence[StageSpec], prompts: Sequence[tuple[str, list[int]]]) -> str:
    facts = {"machine": this_machine(), "stages": [stage_identity(s) for s in specs], "version": VERSION,
             "options": asdict(SHORT_OPTIONS), "prompts": [list(ids) for _, ids in prompts]}  # fmt: skip
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def cached_profile_path(specs: Sequence[StageSpec], hierarchy: str, dataset: str,
                        prompts: Sequence[tuple[str, list[int]]]) -> Path:  # fmt: skip
    """Where the short profile of this hierarchy on this machine (CPU, library versions, stages), measured on
    these prompts of `dataset` with `SHORT_OPTIONS`, is cached."""
    return cache_root() / "profiles" / f"{_safe(hierarchy)}-{_safe(dataset)}-{_profile_key(specs, prompts)}.json"


def default_prompts(tokenizer, context_length: int | None, count: int) -> tuple[str, list[tuple[str, list[int]]]]:
    """The first `count` HumanEval problems as base-model prompts (when the caller has none)."""
    found = prompts_for(load("dataset", "humaneval"), tokenizer, "base", context_length, PREDICT_TOKENS, count=count)
    return found.name, found.pairs()


def ensure_profile(specs: Sequence[StageSpec], hierarchy: str, prompts: Callable[[], tuple[str, list]],
                   log=print) -> Path:  # fmt: skip
    """The cached short profile of `specs` on the first prompts of `prompts()` -> (dataset name,
    [(sample id, prompt ids)]), measured (and cached) first if there is none: on `SHORT_PROMPTS` of them, or
    `SHORT_PROMPTS_WITH_COSTS` where the stages' step costs are in the cost cache (`short_profile_prompts`)."""
    dataset, found = prompts()
    for count in (SHORT_PROMPTS_WITH_COSTS, SHORT_PROMPTS):  # one measured before, on either count
        path = cached_profile_path(specs, hierarchy, dataset, found[:count])
        if path.exists():
            return path
    chosen = found[: short_profile_prompts(specs)]
    path = cached_profile_path(specs, hierarchy, dataset, chosen)
    log(f"auto: no profile of {hierarchy} on {dataset} on this machine: measuring a short one (cached in {path})")
    profile = measure_profile(specs, hierarchy, chosen, SHORT_OPTIONS, dataset=dataset, log=log, cost_cache=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, profile)
    return path


def choose(specs: Sequence[StageSpec], profile_path: str | Path | None, hierarchy: str | None,
           prompts: Callable[[], tuple[str, list]], log=print) -> AutoChoice:  # fmt: skip
    """The auto choice from `profile_path`, or from the cached (else freshly measured) short profile."""
    if profile_path is None:
        name = hierarchy or "+".join(s.label for s in specs)
        profile_path = ensure_profile(specs, name, prompts, log)
        hierarchy = name
    return choose_from_profile(profile_path, specs, hierarchy)


def choose_for_run(run, prompts) -> AutoChoice:
    """The runner's `strategy=auto`: the choice for `run` (an `experiments.run_config.RunConfig`: its stages,
    hierarchy and `strategy.profile`, a profile path or None for the cached short one), measuring a
    missing short profile on the run's own first prompts (`prompts`, the run's
    `experiments.data.DatasetPrompts`)."""
    return choose(list(run.stages), run.profile, run.hierarchy, lambda: (prompts.name, prompts.pairs()))


def choose_for_pipeline(specs: Sequence[StageSpec], profile_path: str | Path | None,
                        draft_confidence: float = 0.0, value_stop: float = 0.0,
                        profile_prompts: Sequence | None = None, checked=None) -> AutoChoice:  # fmt: skip
    """`AutoPipeline(stages, profile=PATH)`'s choice; without a profile, the cached short profile of these
    stages on `profile_prompts` (strings or token ids; None: the first HumanEval problems), measured first
    if there is none. `checked`: the stages' checks made already (`pipespec.hierarchy.check_hierarchy`),
    whose tokenizer encodes the prompts; None: checked here when a profile is measured."""
    check_auto_options(draft_confidence, value_stop)
    if profile_prompts is not None and profile_path is not None:
        raise ConfigError("give strategy auto a profile or profile_prompts to measure one on, not both")

    def prompts():
        hierarchy = checked or check_hierarchy(specs)
        tokenizer = hierarchy.tokenizer
        if profile_prompts is None:
            return default_prompts(tokenizer, hierarchy.context_length, SHORT_PROMPTS_WITH_COSTS)
        return "given prompts", [(f"prompt-{i}", _prompt_ids(p, tokenizer)) for i, p in enumerate(profile_prompts)]

    return choose(specs, profile_path, None, prompts)


def _prompt_ids(prompt, tokenizer) -> list[int]:
    ids = encode_prompt(tokenizer, prompt)
    if not ids:
        raise ConfigError(f"profile_prompts must hold non-empty prompts, got {prompt!r:.60}")
    return ids


CHOSEN_OPTIONS = ("strategy", "lookahead", "max_lead")  # what auto chooses: not the caller's to set


class AutoPipeline(Pipeline):
    """A `Pipeline` at the configuration the machine profile predicts fastest for `stages` (`choose`):
    its strategy, lookahead, max_lead and the stages it runs (a subset that keeps the target). `profile`:
    a profile.json path; None measures (once, then cached per machine) a short profile on
    `profile_prompts` (strings or token ids; None: the first HumanEval problems). `auto` holds the
    choice and why; every other option is a `Pipeline` option.

    `learn=True`: every stage of the hierarchy is started, and after each call its traces revise the
    profile (`analysis.learn`: acceptance by position, each stage's speed, contention and cost of a wait)
    and the next call runs the configuration then predicted fastest, when its predicted gain over the
    current one is beyond that gain's 95% interval (`analysis.learn.next_configuration`)
    (another strategy, lookahead, max_lead or subset of the stages: `generate(..., stages=)`). Every decision
    is in `decisions` (one per call: what ran, what runs next, whether that is a switch, and why). A
    caller's own strategy options on a call are refused: the configuration is auto's."""

    def __init__(self, stages: Sequence, *, profile: str | Path | None = None,
                 profile_prompts: Sequence | None = None, learn: bool = False, choice: AutoChoice | None = None,
                 **options):  # fmt: skip
        chosen = sorted(set(options) & set(CHOSEN_OPTIONS))
        if chosen:
            raise ConfigError(f"AutoPipeline chooses {', '.join(CHOSEN_OPTIONS)} itself: drop {chosen}")
        if not isinstance(learn, bool):
            raise ConfigError(f"learn must be true or false, got {learn!r}")
        specs = [StageSpec.from_any(s) for s in stages]
        if choice is None:  # `choice`: one made already (the runner's), from a profile of these stages
            if profile is None and options.get("checked") is None:  # a short profile's prompts need the tokenizer:
                options["checked"] = check_hierarchy(specs)  # checked once, for them and for the pipeline
            choice = choose_for_pipeline(specs, profile, options.get("draft_confidence", 0.0),
                                         options.get("value_stop", 0.0), profile_prompts,
                                         options.get("checked"))  # fmt: skip
        started = chosen_specs(specs, range(len(specs)), choice.tree_nodes) if learn else choice.specs(specs)
        super().__init__(list(started), choice.strategy, choice.lookahead, choice.max_lead, **options)
        self.auto, self.learn = choice, learn
        self.decisions: list[dict[str, Any]] = []
        if learn:
            from analysis.learn import Observed

            self.profile = load_profile(choice.profile)
            self.observed = Observed()
            self.configuration = dict(choice.record()["chosen"])  # with `tree_nodes` where it chose token trees

    def generate(self, prompt, max_new_tokens: int = 128, **options):
        if not self.learn:
            return super().generate(prompt, max_new_tokens, **options)
        chosen = sorted(set(options) & {*CHOSEN_OPTIONS, "stages"})
        if chosen:
            raise ConfigError(f"a learning AutoPipeline runs its own configuration: drop {chosen}")
        ran = dict(self.configuration)
        result = super().generate(prompt, max_new_tokens, **self._call_options(ran), **options)
        self.decisions.append(self._learn_from(result, ran))
        return result

    @staticmethod
    def _call_options(configuration: dict[str, Any]) -> dict[str, Any]:
        stages = None if configuration["strategy"] == "greedy" else configuration["stages"]
        return {"strategy": configuration["strategy"], "lookahead": configuration["lookahead"],
                "max_lead": configuration["max_lead"], "stages": stages}  # fmt: skip

    def _learn_from(self, result, ran: dict[str, Any]) -> dict[str, Any]:
        """Fold the call's traces into the profile and decide the next configuration (`analysis.learn`)."""
        from analysis.learn import next_configuration

        self.observed.add(self.profile, result.stages, result.stage_traces)
        trees = self.auto.tree_nodes  # the first stage's, fixed when it started: a configuration with it uses it

        def runnable(c: dict[str, Any]) -> bool:
            with_first = c["strategy"] != "greedy" and c["stages"][0] == 0
            return c.get("tree_nodes", 0) == (trees if with_first else 0)

        decision = next_configuration(self.profile, self.observed, ran, PREDICT_TOKENS, allowed=runnable)
        self.configuration = decision.configuration
        return {"call": len(self.decisions) + 1, "ran": ran, "tokens_per_s": len(result.tokens) / result.time_s,
                "next": decision.configuration, "switched": decision.switched, "reason": decision.reason,
                "predicted_tokens_per_s": decision.predicted_tokens_per_s, "gain": decision.gain,
                "gain_interval": decision.gain_interval and list(decision.gain_interval)}  # fmt: skip
