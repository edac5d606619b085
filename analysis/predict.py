"""Predict a configuration's throughput from a machine profile, before running it.

    python -m analysis.predict PROFILE [strategy=pipespec] [lookahead=0] [max_lead=8] [tokens=128] [--json]

The simulator (`analysis.simulate`, the engine's own schedule) plays the hierarchy with the profile's
costs: t(n) from the one step-cost fit (`analysis.fit.fit_step_cost`) over the profile's alone and
loaded points, whose contention slows a stage per other computing stage; acceptance by draft position
(`simulate.ByPosition`); a model-free drafter's proposal rate as its supply; the handoff latency per
commit hop. The paper's model (Eq. 4 / Eq. 5, `analysis.fit.paper_tokens_per_s`) is printed beside,
with alpha the mean of the last pair's per-position rates and gamma the lookahead (sd) or max_lead.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Sequence

from analysis import simulate as sim
from analysis.fit import LOOKUP_COST_S, paper_tokens_per_s
from analysis.profile import Profile, ProfileError, load_profile, mismatches
from pipespec.errors import ConfigError
from pipespec.schedule import DEFAULT_MAX_LEAD, check_options

SEEDS = 4  # simulated repetitions: the sampling noise of acceptance averages out


@dataclass(frozen=True)
class Prediction:
    strategy: str
    lookahead: int
    max_lead: int
    stages: tuple[str, ...]
    tokens: int
    predicted_tokens_per_s: float
    ms_per_token: float
    mean_acceptance_length: float | None  # target: tokens per verification, bonus included
    verify_fraction: float | None  # target: verifications / steps
    target_busy: float
    paper_predicted_tokens_per_s: float


def _inputs(profile: Profile):
    model_stages = sum(not s.model_free for s in profile.stages)
    costs, contention, supply = [], [], []
    for i, stage in enumerate(profile.stages):
        if stage.model_free:
            costs.append(sim.StageCost(LOOKUP_COST_S))
            contention.append(None)  # takes no core
            supply.append(profile.pairs[i].proposal_rate)
            continue
        fit = stage.cost_fit(model_stages - 1)
        costs.append(fit.stage_cost())
        contention.append(fit.contention)
        supply.append(None)
    acceptances = [sim.ByPosition(p.acceptance_by_position) for p in profile.pairs]
    return costs, contention, supply, acceptances


def predict(profile: Profile, strategy: str = "pipespec", lookahead: int = 0, max_lead: int = DEFAULT_MAX_LEAD,
            tokens: int = 128) -> Prediction:  # fmt: skip
    check_options(strategy, len(profile.stages), lookahead, max_lead)
    costs, contention, supply, acceptances = _inputs(profile)
    names = tuple(s.name for s in profile.stages)
    t_target = costs[-1](1)
    if strategy == "greedy":
        rate = 1.0 / t_target
        return Prediction(strategy, lookahead, max_lead, names[-1:], tokens, rate, 1000 / rate, None, 0.0, 1.0, rate)
    runs = []
    for seed in range(SEEDS):
        if strategy == "sd":
            result = sim.simulate_sync_sd(costs, acceptances, lookahead, tokens, seed=seed, supply=supply,
                                          end_at_budget=True)  # fmt: skip
            hops = 2 * (len(costs) - 1) * result.target_steps  # drafts down the chain, the commit back up
            runs.append((result, result.total_time + hops * profile.handoff_s))
        else:
            result = sim.simulate_pipespec(
                costs, acceptances, tokens, lookahead=lookahead, max_lead=max(max_lead, lookahead), seed=seed,
                rollback_delay=profile.handoff_s, contention=contention, supply=supply, end_at_budget=True,
            )  # fmt: skip
            runs.append((result, result.total_time))
    seconds = statistics.mean(t for _, t in runs)
    rate = tokens / seconds
    alpha = statistics.mean(profile.pairs[-1].acceptance_by_position)
    gamma = lookahead if strategy == "sd" else max(max_lead, lookahead)
    paper = paper_tokens_per_s(strategy, t_target, alpha, gamma, costs[-2](1))
    return Prediction(
        strategy, lookahead, max_lead, names, tokens, rate, 1000 / rate,
        _finite_mean([r.accepted_per_verify[-1] for r, _ in runs]),  # None: the target never verified
        statistics.mean(r.verify_fraction[-1] for r, _ in runs),
        statistics.mean(r.busy_fraction[-1] for r, _ in runs), paper,
    )  # fmt: skip


def _finite_mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if v == v]  # nan where a run had no verification
    return statistics.mean(finite) if finite else None


OPTIONS = {"strategy": str, "lookahead": int, "max_lead": int, "tokens": int}


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    if not argv:
        print("usage: python -m analysis.predict PROFILE [strategy=...] [lookahead=N] [max_lead=N] [--json]",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        profile = load_profile(argv[0])
        prediction = predict(profile, **parse_options(argv[1:]))
    except (ProfileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for problem in mismatches(profile):
        print(f"warning: profile from elsewhere: {problem}", file=sys.stderr)
    print(json.dumps(asdict(prediction)) if as_json else format_prediction(prediction))
    return 0


if __name__ == "__main__":
    sys.exit(main())
