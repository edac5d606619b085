"""Predict a configuration's throughput from a machine profile, before running it.

    python -m analysis.predict PROFILE [strategy=pipespec] [lookahead=0] [max_lead=8] [tokens=128] [--json]
    python -m analysis.predict PROFILE --sweep [tokens=128] [--json]     # every configuration, best first

The simulator (`analysis.simulate`, the engine's own schedule) plays the hierarchy with the profile's
costs: t(n) from the one step-cost fit (`analysis.fit.fit_step_cost`) over the profile's alone and
loaded points, whose contention slows a stage per other computing stage; acceptance read off the
profile's continuations position by position (`simulate.AlongContinuations`, one simulated generation
per continuation), or drawn from its rates by draft position in profiles without them
(`simulate.ByPosition`); a model-free drafter's proposal rate as its supply; the handoff latency per
commit hop. The paper's model (Eq. 4 / Eq. 5, `analysis.fit.paper_tokens_per_s`) is printed beside,
with alpha the mean of the last pair's per-position rates and gamma the lookahead (sd) or max_lead.

`--sweep` ranks greedy, sd windows `SD_WINDOWS` and pipespec `LOOKAHEADS` x `MAX_LEADS` on every subset
of the stages that keeps the target (e.g. skipping the middle stage of a k = 3 hierarchy); a subset
whose drafter/verifier pair the profile has no acceptance for (`skip_pairs`, older profiles) is left out
with a note. `draft_confidence` is refused: the simulator has no model of a drafter's own confidence.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Sequence

from analysis import simulate as sim
from analysis.fit import LOOKUP_COST_S, paper_tokens_per_s
from analysis.profile import PairProfile, Profile, ProfileError, load_profile, mismatches
from pipespec.errors import ConfigError
from pipespec.schedule import DEFAULT_MAX_LEAD, check_options

SEEDS = 4  # simulated repetitions: the sampling noise of acceptance averages out
SD_WINDOWS = tuple(range(1, 9))  # the sweep's sd windows
LOOKAHEADS = (0, 1, 2, 4)  # the sweep's pipespec lookaheads ...
MAX_LEADS = (4, 8, 16)  # ... times these max_leads


@dataclass(frozen=True)
class Prediction:
    strategy: str
    lookahead: int
    max_lead: int
    stages: tuple[str, ...]  # the stages it runs, smallest first (greedy: the target)
    stage_indices: tuple[int, ...]  # their positions in the profile's hierarchy
    tokens: int
    predicted_tokens_per_s: float
    ms_per_token: float
    mean_acceptance_length: float | None  # target: tokens per verification, bonus included
    verify_fraction: float | None  # target: verifications / steps
    target_busy: float
    paper_predicted_tokens_per_s: float


def subset_pairs(profile: Profile, stages: Sequence[int]) -> list[PairProfile] | None:
    """The drafter/verifier pairs of the hierarchy made of `stages`; None where the profile lacks one."""
    pairs = [profile.pair(d, v) for d, v in zip(stages, stages[1:])]
    return None if any(p is None for p in pairs) else pairs


def check_stages(profile: Profile, stages: Sequence[int] | None) -> tuple[int, ...]:
    """Stage positions of a subset of the profile's hierarchy (default: all), smallest first, target last."""
    last = len(profile.stages) - 1
    if stages is None:
        return tuple(range(last + 1))
    stages = tuple(stages)
    if not stages or list(stages) != sorted(set(stages)) or stages[0] < 0 or stages[-1] != last:
        raise ConfigError(f"stages must be increasing positions in 0..{last} ending with the target ({last}), "
                          f"got {list(stages)}")  # fmt: skip
    if any(profile.stages[i].model_free for i in stages[1:]):
        raise ConfigError(f"stages {list(stages)}: a model-free stage can only be the first (it cannot verify)")
    if subset_pairs(profile, stages) is None:
        raise ConfigError(f"stages {list(stages)}: the profile has no acceptance for a pair of them (measure a "
                          "profile with skip_pairs: python -m experiments.profile)")  # fmt: skip
    return stages


def _fit(profile: Profile, stage: int):
    """The stage's t(n) fit; its loaded points were measured with every other model stage of the profile
    running, and the simulator applies the contention per stage computing at the time."""
    return profile.stages[stage].cost_fit(sum(not s.model_free for s in profile.stages) - 1)


def acceptance(pair: PairProfile):
    """The simulator's acceptance for a pair: read off the profile's continuations where it has them
    (`sim.AlongContinuations`), else drawn from its rates by position."""
    if pair.runs:
        return sim.AlongContinuations(pair.runs, pair.acceptance_by_position)
    return sim.ByPosition(pair.acceptance_by_position)


def _seeds(pairs: Sequence[PairProfile]) -> int:
    """Simulated generations: SEEDS, or one per profile continuation when there are more."""
    return max([SEEDS, *(len(p.runs) for p in pairs)])


def _inputs(profile: Profile, stages: Sequence[int]):
    pairs = subset_pairs(profile, stages)
    costs, contention, supply = [], [], []
    for position, i in enumerate(stages):
        stage = profile.stages[i]
        if stage.model_free:
            costs.append(sim.StageCost(LOOKUP_COST_S))
            contention.append(None)  # takes no core
            supply.append(pairs[position].proposal_rate)
            continue
        costs.append(sim.TableCost(stage.step_s_alone))  # measured t(n): not smooth on every CPU
        contention.append(_fit(profile, i).contention)
        supply.append(None)
    acceptances = [acceptance(p) for p in pairs]
    return costs, contention, supply, acceptances, pairs


def predict(profile: Profile, strategy: str = "pipespec", lookahead: int = 0, max_lead: int = DEFAULT_MAX_LEAD,
            tokens: int = 128, stages: Sequence[int] | None = None, draft_confidence: float = 0.0,
            prompt_tokens: int | None = None, size_verification: bool = False, value_stop: float = 0.0) -> Prediction:
    """The predicted throughput of one configuration, prompt processing included (`prompt_tokens` per
    generation; None: the profile's mean prompt length); `stages`: a subset of the profile's (default all)."""
    if draft_confidence or value_stop:
        check_options(strategy, len(profile.stages), lookahead, max_lead, draft_confidence, value_stop)
        what = "draft_confidence" if draft_confidence else "value_stop"
        raise ConfigError(f"{what} cannot be predicted: the simulator has no model of a drafter's own confidence "
                          f"or online estimates (leave it 0)")  # fmt: skip
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(f"tokens must be an integer >= 1, got {tokens!r}")
    last = len(profile.stages) - 1
    if prompt_tokens is None:
        prompt_tokens = round(statistics.mean(profile.prompt_tokens)) if profile.prompt_tokens else 0
    if strategy == "greedy":
        check_options(strategy, len(profile.stages), lookahead, max_lead)
        seconds = tokens * profile.stages[last].step_s_alone[0] + prompt_tokens * profile.stages[last].prefill_s_per_token
        rate = tokens / seconds  # the target alone: no contention
        name = (profile.stages[-1].name,)
        return Prediction(strategy, lookahead, max_lead, name, (last,), tokens, rate, 1000 / rate, None, 0.0, 1.0,
                          rate)  # fmt: skip
    stages = check_stages(profile, stages)
    check_options(strategy, len(stages), lookahead, max_lead)
    costs, contention, supply, acceptances, pairs = _inputs(profile, stages)
    names = tuple(profile.stages[i].name for i in stages)
    t_target = costs[-1](1)
    # each model stage reads the prompt in its first step: one after another in sd, side by side in pipespec
    prefill = [prompt_tokens * profile.stages[i].prefill_s_per_token for i in stages if not profile.stages[i].model_free]
    runs = []
    for seed in range(_seeds(pairs)):
        if strategy == "sd":
            result = sim.simulate_sync_sd(costs, acceptances, lookahead, tokens, seed=seed, supply=supply,
                                          end_at_budget=True, size_verification=size_verification)  # fmt: skip
            hops = 2 * (len(costs) - 1) * result.target_steps  # drafts down the chain, the commit back up
            runs.append((result, result.total_time + hops * profile.handoff_s + sum(prefill)))
        else:
            result = sim.simulate_pipespec(
                costs, acceptances, tokens, lookahead=lookahead, max_lead=max(max_lead, lookahead), seed=seed,
                rollback_delay=profile.handoff_s, contention=contention, supply=supply, end_at_budget=True,
                size_verification=size_verification,
            )  # fmt: skip
            runs.append((result, result.total_time + max(prefill)))
    seconds = statistics.mean(t for _, t in runs)
    rate = tokens / seconds
    alpha = statistics.mean(pairs[-1].acceptance_by_position)
    gamma = lookahead if strategy == "sd" else max(max_lead, lookahead)
    paper = paper_tokens_per_s(strategy, t_target, alpha, gamma, costs[-2](1)) if gamma else 1.0 / t_target
    return Prediction(
        strategy, lookahead, max_lead, names, stages, tokens, rate, 1000 / rate,
        _finite_mean([r.accepted_per_verify[-1] for r, _ in runs]),  # None: the target never verified
        statistics.mean(r.verify_fraction[-1] for r, _ in runs),
        statistics.mean(r.busy_fraction[-1] for r, _ in runs), paper,
    )  # fmt: skip


def stage_subsets(profile: Profile) -> tuple[list[tuple[int, ...]], list[str]]:
    """Every subset of >= 2 stages that keeps the target and can run (a model-free stage only first),
    and a note for each left out because the profile has no acceptance for one of its pairs."""
    last = len(profile.stages) - 1
    usable, notes = [], []
    for size in range(last, 0, -1):
        for drafters in itertools.combinations(range(last), size):
            stages = drafters + (last,)
            if any(profile.stages[i].model_free for i in stages[1:]):
                continue
            if subset_pairs(profile, stages) is None:
                names = " > ".join(profile.stages[i].name for i in stages)
                notes.append(f"left out {names}: the profile has no acceptance for one of its pairs "
                             "(measure it again to get skip_pairs)")  # fmt: skip
                continue
            usable.append(stages)
    return usable, notes


def configurations(profile: Profile) -> tuple[list[dict], list[str]]:
    """The sweep: greedy, then sd windows and pipespec lookahead x max_lead on every usable subset."""
    subsets, notes = stage_subsets(profile)
    found = [{"strategy": "greedy", "lookahead": 0, "max_lead": DEFAULT_MAX_LEAD, "stages": None}]
    for stages in subsets:
        found += [{"strategy": "sd", "lookahead": w, "max_lead": DEFAULT_MAX_LEAD, "stages": stages}
                  for w in SD_WINDOWS]  # fmt: skip
        found += [{"strategy": "pipespec", "lookahead": la, "max_lead": lead, "stages": stages}
                  for la in LOOKAHEADS for lead in MAX_LEADS if lead >= la]  # fmt: skip
    return found, notes


def sweep(profile: Profile, tokens: int = 128) -> tuple[list[Prediction], list[str]]:
    """Every configuration's prediction, best predicted tokens/s first (ties: the simpler one first)."""
    options, notes = configurations(profile)
    predictions = [predict(profile, tokens=tokens, **o) for o in options]
    order = sorted(range(len(predictions)), key=lambda i: (-predictions[i].predicted_tokens_per_s, i))
    return [predictions[i] for i in order], notes


def _finite_mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if v == v]  # nan where a run had no verification
    return statistics.mean(finite) if finite else None


def _flag(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(value)
    return value.lower() == "true"


_flag.__name__ = "true or false"
OPTIONS = {"strategy": str, "lookahead": int, "max_lead": int, "tokens": int, "draft_confidence": float,
           "size_verification": _flag, "value_stop": float}  # fmt: skip


def parse_options(items: Sequence[str]) -> dict:
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in OPTIONS:
            raise ConfigError(f"expected KEY=VALUE with KEY one of {list(OPTIONS)}, got {item!r}")
        try:
            options[key] = OPTIONS[key](value)
        except ValueError:
            raise ConfigError(f"{key} must be {OPTIONS[key].__name__}, got {value!r}") from None
    return options


def format_prediction(p: Prediction) -> str:
    length = "-" if p.mean_acceptance_length is None else f"{p.mean_acceptance_length:.2f}"
    verify = "-" if p.verify_fraction is None else f"{p.verify_fraction:.2f}"
    return (f"{p.strategy} lookahead {p.lookahead} max_lead {p.max_lead} ({' > '.join(p.stages)}): "
            f"predicted {p.predicted_tokens_per_s:.1f} tokens/s ({p.ms_per_token:.1f} ms/token), "
            f"mean acceptance length {length}, verification fraction {verify}, target busy {p.target_busy:.0%}; "
            f"paper model {p.paper_predicted_tokens_per_s:.1f} tokens/s")  # fmt: skip


USAGE = ("usage: python -m analysis.predict PROFILE [strategy=...] [lookahead=N] [max_lead=N] [tokens=N] [--json]\n"
         "       python -m analysis.predict PROFILE --sweep [tokens=N] [--json]")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json, as_sweep = "--json" in argv, "--sweep" in argv
    argv = [a for a in argv if a not in ("--json", "--sweep")]
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        profile = load_profile(argv[0])
        options = parse_options(argv[1:])
        if as_sweep and set(options) - {"tokens"}:
            raise ConfigError(f"--sweep takes only tokens=N, got {sorted(set(options) - {'tokens'})}")
        predictions, notes = sweep(profile, **options) if as_sweep else ([predict(profile, **options)], [])
    except (ProfileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for problem in mismatches(profile):
        print(f"warning: profile from elsewhere: {problem}", file=sys.stderr)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if as_json:
        records = [asdict(p) for p in predictions]
        print(json.dumps(records if as_sweep else records[0]))
    else:
        print("\n".join(f"{rank}. " * as_sweep + format_prediction(p) for rank, p in enumerate(predictions, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
