"""Learning while a run goes: what a pipeline's own calls show of acceptance and step costs, folded into the
machine profile `auto` ranks configurations with, so the next call can run a better one.

    observed = Observed()
    observed.add(profile, stage_indices, stage_traces)      # after each call (its traces, smallest stage first)
    learned = learned_profile(profile, observed)            # the profile as these calls revise it
    decision = next_configuration(profile, observed, current)  # stay, or switch (and why)

- **Acceptance.** A verifier's trace says, per verification, how many drafts it was offered and how many it
  kept: by draft position, drafts offered there (every earlier one kept) and kept. Those counts are added to
  the profile's own (its walk along the continuations, `analysis.profile.walk_counts`), and the pair's rates
  by position become the pooled ratio (the simulator then draws by position, `simulate.ByPosition`).
- **Costs.** Each model stage's measured step seconds against the profile's t(n) for the same steps, how many
  other model stages computed during each step (`analysis.fit.overlap_with`) and whether the step came after
  a wait (it started more than `BACK_TO_BACK_S` after the stage's previous one) give the stage's costs on
  this run: seconds = speed x t(n) x (1 + contention x others + wake x waited), by least squares over the
  calls' steps, each call at a speed of its own (the machine drifts between calls), the two terms shared and
  >= 0 (`StepCosts.fitted`). Contention is fitted where calls that show both hold at least `MIN_REGIME_STEPS`
  steps that ran mostly alone and as many mostly beside another stage, wake where they hold as many after a
  wait and as many right after the stage's own step; otherwise the profile's is kept (and the speed is the
  pooled ratio, `analysis.paired.speed_factor`'s, where neither is shown). So a configuration that runs its
  stages side by side is priced with the contention this run showed, and one whose stages wait for each
  other (sd) with the cost of waking that it showed.
- **The switch.** Every configuration is predicted again on the learned profile (`analysis.predict.sweep`); the
  run switches when the best one is predicted faster than the current one beyond the 95% interval of that
  gain (`gain_interval`: a bootstrap over what the acceptance was learned from, the profile's prompts and
  the run's calls, both configurations predicted on each replicate, and the model's own held-out error on
  a gain), and each decision says why.

Every configuration is lossless, so a switch never changes what a greedy run returns.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from scipy.optimize import minimize

from analysis.fit import MIN_REGIME_STEPS, overlap_with
from analysis.paired import BACK_TO_BACK_S, profile_step_seconds
from analysis.predict import INTERVAL_Z, predict_profile, sample_cost, sweep
from analysis.profile import PairProfile, Profile, StageProfile, walk_counts

MIN_OFFERED = 8  # drafts a pair must have been offered at its first position before its observations count
REPLICATES = 20  # bootstrap replicates behind a switch's interval
# The model's own error on the gain of one configuration over another, held out: the root mean square of
# log(predicted gain / measured gain) over every pair of configurations in the committed paired validations
# (results/validation_paired/*/*/validation.json: 280 pairs in six sweeps; tests/test_learn.py recomputes it)
MODEL_GAIN_ERROR = 0.074

Counts = tuple[list[int], list[int]]  # drafts offered and kept, by draft position


@dataclass
class Observed:
    """What a run's calls added: per (drafter, verifier) pair of profile stages, drafts offered and kept by
    position, pooled and per call; per profile stage and step, its measured seconds, the profile's t(n) for
    it, how many other model stages computed meanwhile and whether it came after a wait (`StepCosts`)."""

    offered: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    accepted: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    costs: dict[int, "StepCosts"] = field(default_factory=dict)
    calls: int = 0
    per_call: list[dict[tuple[int, int], Counts]] = field(default_factory=list)

    def add(self, profile: Profile, stage_indices: Sequence[int], traces: Sequence[Any],
            prompt_tokens: int | None = None) -> None:  # fmt: skip
        """One call's traces (`pipespec.trace.StageTrace`, or their dicts), the stages that ran in order;
        `stage_indices`: their positions in the profile's hierarchy; `prompt_tokens` where known: each step
        priced at its own context where the profile measured how the cost grows with it (`sample_cost`)."""
        steps = [t["steps"] if isinstance(t, Mapping) else t.steps for t in traces]
        models = [p for p, stage in enumerate(stage_indices) if not profile.stages[stage].model_free]
        call = {}
        for position, (stage, columns) in enumerate(zip(stage_indices, steps)):
            if position > 0:
                call[(stage_indices[position - 1], stage)] = verification_counts(columns)
            if position in models:
                others = [steps[p] for p in models if p != position and steps[p]["kind"]]
                cost = sample_cost(profile.stages[stage], prompt_tokens)
                self.costs.setdefault(stage, StepCosts()).add(columns, cost, others)
        self._add_call(call)

    def _add_call(self, call: dict[tuple[int, int], Counts]) -> None:
        self.calls += 1
        self.per_call.append(call)
        for pair, (offered, accepted) in call.items():
            pooled_offered, pooled_accepted = self.offered.setdefault(pair, []), self.accepted.setdefault(pair, [])
            for p, (o, a) in enumerate(zip(offered, accepted)):
                if p >= len(pooled_offered):
                    pooled_offered.append(0)
                    pooled_accepted.append(0)
                pooled_offered[p] += o
                pooled_accepted[p] += a

    def drawn(self, calls: Sequence[int]) -> "Observed":
        """The same run with its acceptance counts from `calls` (indices into `per_call`, repeats allowed);
        the stages' costs as measured."""
        observed = Observed(costs=dict(self.costs))
        for index in calls:
            observed._add_call(self.per_call[index])
        return observed

    def speed(self, stage: int) -> float | None:
        """The stage's measured step seconds over the profile's for the same steps (None: none measured)."""
        costs = self.costs.get(stage)
        return costs.speed() if costs is not None else None

    def stage_costs(self, stage: int) -> "StageCosts":
        """The stage's costs on this run (`StepCosts.fitted`; speed None: no steps)."""
        costs = self.costs.get(stage)
        return costs.fitted() if costs is not None else StageCosts(None)


class StageCosts(NamedTuple):
    """A model stage's costs on a run against its profile: its speed (step seconds over the profile's t(n)), its
    contention (the share a step costs more per other model stage computing) and its wake (the share a step
    after a wait costs more); contention and wake None where the run does not show them."""

    speed: float | None
    contention: float | None = None
    wake: float | None = None


@dataclass
class StepCosts:
    """One model stage's decode steps on a run: measured seconds, the profile's t(n) for each, the other model
    stages computing during it (time weighted), whether it came after a wait, and which call it was of."""

    measured: list[float] = field(default_factory=list)
    profile: list[float] = field(default_factory=list)
    others: list[float] = field(default_factory=list)
    waited: list[bool] = field(default_factory=list)
    call: list[int] = field(default_factory=list)
    _fitted: StageCosts | None = field(default=None, repr=False, compare=False)  # `fitted`, until the next `add`

    def add(self, columns: Mapping[str, Sequence], cost, others: Sequence[Mapping]) -> None:
        """One call's steps of the stage (its trace columns; the first, which reads the prompt, left out), `cost`
        the profile's t(n) (`analysis.paired.profile_step_seconds`), `others` the other model stages' columns."""
        profile, overlap = profile_step_seconds(columns, cost), overlap_with(columns, others)
        call = self.call[-1] + 1 if self.call else 0
        self._fitted = None
        for i in range(1, len(columns["fed"])):
            self.measured.append(columns["t_end"][i] - columns["t_start"][i])
            self.profile.append(profile[i])
            self.others.append(overlap[i])
            self.waited.append(columns["t_start"][i] - columns["t_end"][i - 1] > BACK_TO_BACK_S)
            self.call.append(call)

    def speed(self) -> float | None:
        """Measured seconds over the profile's, pooled (None: no steps)."""
        total = sum(self.profile)
        return sum(self.measured) / total if total > 0 else None

    def fitted(self) -> StageCosts:
        """`_fit`, once per steps added (a learning run's bootstrap asks for it on every replicate)."""
        if self._fitted is None:
            self._fitted = self._fit()
        return self._fitted

    def _fit(self) -> StageCosts:
        """Speed, contention and wake from seconds = speed_call x t(n) x (1 + contention x others + wake x waited):
        each call at a speed of its own (the machine drifts between calls, so a regime one call ran in alone
        must not pass for one of its costs), the terms shared, by least squares (terms >= 0, each call's speed
        solved for given the terms, the terms by a bounded minimisation); a term only where calls that show both
        of its regimes hold `MIN_REGIME_STEPS` steps of each (mostly alone and mostly beside another stage;
        after a wait and right after its own step), else None. The speed: the calls' pooled. With neither
        term, the pooled `speed`."""
        speed = self.speed()
        t, m = np.asarray(self.profile, dtype=float), np.asarray(self.others, dtype=float)
        a, call = np.asarray(self.waited, dtype=float), np.unique(self.call, return_inverse=True)[1]
        regimes = {"contention": (t * m, m >= 0.5), "wake": (t * a, a > 0)}  # each term's column, and its regime
        terms = {name: column for name, (column, regime) in regimes.items() if _shown(regime, call)}
        if speed is None or not terms:
            return StageCosts(speed)
        y = np.asarray(self.measured, dtype=float)

        def fit(shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # each call's best speed given the terms
            cost = t + sum(share * column for share, column in zip(shares, terms.values()))  # t(n) x (1 + ...)
            return cost, (np.bincount(call, y * cost) / np.bincount(call, cost * cost))[call]

        def loss(shares: np.ndarray) -> float:
            cost, speeds = fit(shares)
            return float(np.sum((y - speeds * cost) ** 2) / np.sum(y * y))

        shares = minimize(loss, np.zeros(len(terms)), method="L-BFGS-B", bounds=[(0.0, None)] * len(terms),
                          options={"ftol": 1e-15, "gtol": 1e-10}).x  # fmt: skip
        cost, _ = fit(shares)
        fitted = {name: float(share) for name, share in zip(terms, shares)}
        return StageCosts(float(np.sum(y * cost) / np.sum(cost * cost)), fitted.get("contention"), fitted.get("wake"))


def _shown(regime: np.ndarray, call: np.ndarray) -> bool:
    """Whether the calls that show both sides of `regime` hold `MIN_REGIME_STEPS` steps of each side."""
    on, off = np.bincount(call, regime.astype(float)), np.bincount(call, (~regime).astype(float))
    mixed = (on > 0) & (off > 0)
    return min(on[mixed].sum(), off[mixed].sum()) >= MIN_REGIME_STEPS


def verification_counts(columns: Mapping[str, Sequence]) -> Counts:
    """A verifier's trace columns as drafts offered and kept by position: a verification of d drafts that
    kept k offered positions 0..min(d, k + 1) - 1 (every earlier draft kept) and kept 0..k - 1."""
    offered: list[int] = []
    accepted: list[int] = []
    for kind, drafts, kept in zip(columns["kind"], columns["offered"], columns["accepted"]):
        if kind != "verify" or not drafts:
            continue
        for p in range(min(drafts, kept + 1)):
            if p >= len(offered):
                offered.append(0)
                accepted.append(0)
            offered[p] += 1
            accepted[p] += p < kept
    return offered, accepted


def prior_counts(pair: PairProfile, positions: int) -> tuple[list[int], list[int]]:
    """The profile's own counts of drafts offered and kept by position: its walk along each continuation
    (`walk_counts`, with a model-free drafter's proposals there: where it proposed nothing, nothing was
    offered), or, for a profile without continuations, one draft per position at its rate."""
    if not pair.runs:
        return [1] * positions, [rate or 0.0 for rate in pair.acceptance_by_position[:positions]]
    offered, accepted = [0] * positions, [0] * positions
    for c, along in enumerate(pair.runs):
        counts = walk_counts(along, pair.proposed[c] if pair.proposed else None, positions)
        for p in range(positions):
            offered[p] += counts.offered[p]
            accepted[p] += counts.accepted[p]
    return offered, accepted


def learned_pair(pair: PairProfile, offered: Sequence[int], accepted: Sequence[int]) -> PairProfile:
    """The pair's acceptance by position with a run's counts added to the profile's (unchanged below
    `MIN_OFFERED` drafts at the first position); a position neither measured keeps the profile's rate."""
    if not offered or offered[0] < MIN_OFFERED:
        return pair
    positions = len(pair.acceptance_by_position)
    prior_offered, prior_accepted = prior_counts(pair, positions)
    rates = []
    for p in range(positions):
        seen = offered[p] if p < len(offered) else 0
        total = prior_offered[p] + seen
        kept = prior_accepted[p] + (accepted[p] if p < len(accepted) else 0)
        rates.append(kept / total if total else pair.acceptance_by_position[p])
    return replace(pair, acceptance_by_position=tuple(rates), runs=())


def learned_stage(stage: StageProfile, costs: StageCosts, others: int = 1) -> StageProfile:
    """The stage as a run measured it (`StageCosts`): t(n) scaled by its speed; with a contention the run showed,
    its t(n) loaded (every one of the profile's `others` model stages computing) that much slower per other
    stage, else the profile's loaded t(n) scaled alike; with a wake the run showed, that one."""
    if costs.speed is None or stage.model_free:
        return stage
    alone = tuple(t * costs.speed for t in stage.step_s_alone)
    loaded = (tuple(t * costs.speed for t in stage.step_s_loaded) if costs.contention is None
              else tuple(t * (1.0 + costs.contention * others) for t in alone))  # fmt: skip
    wake = stage.wake if costs.wake is None else costs.wake
    return replace(stage, step_s_alone=alone, step_s_loaded=loaded, wake=wake)


def learned_costs(profile: Profile, observed: Observed) -> Profile:
    """The profile with each model stage's costs as the run measured them (`learned_stage`), its acceptance kept."""
    others = sum(not s.model_free for s in profile.stages) - 1
    stages = tuple(learned_stage(s, observed.stage_costs(i), others) for i, s in enumerate(profile.stages))
    return replace(profile, stages=stages)


def learned_profile(profile: Profile, observed: Observed) -> Profile:
    """The profile with a run's observations folded in (its acceptance counts added, its stages' costs)."""
    pairs = tuple(learned_pair(pair, observed.offered.get((i, i + 1), ()), observed.accepted.get((i, i + 1), ()))
                  for i, pair in enumerate(profile.pairs))  # fmt: skip
    skips = tuple((d, v, learned_pair(pair, observed.offered.get((d, v), ()), observed.accepted.get((d, v), ())))
                  for d, v, pair in profile.skip_pairs)  # fmt: skip
    return replace(learned_costs(profile, observed), pairs=pairs, skip_pairs=skips)


@dataclass(frozen=True)
class Decision:
    """What the next call runs: a configuration (strategy, lookahead, max_lead, stages), whether that is a
    switch, the predictions behind it, the best one's predicted gain over the current one with its 95%
    interval (None: the current one is the best, or no longer ranked) and why."""

    configuration: dict[str, Any]
    switched: bool
    predicted_tokens_per_s: float
    current_tokens_per_s: float | None
    reason: str
    gain: float | None = None
    gain_interval: tuple[float, float] | None = None


def configuration_of(prediction) -> dict[str, Any]:
    """A prediction's configuration (`tree_nodes` only where its first stage proposes token trees)."""
    trees = getattr(prediction, "tree_nodes", 0)
    return {"strategy": prediction.strategy, "lookahead": prediction.lookahead, "max_lead": prediction.max_lead,
            "stages": list(prediction.stage_indices), **({"tree_nodes": trees} if trees else {})}  # fmt: skip


def next_configuration(profile: Profile, observed: Observed, current: Mapping[str, Any], tokens: int = 128,
                       allowed=None) -> Decision:  # fmt: skip
    """Stay with `current` unless the best configuration predicted on the learned profile (among those
    `allowed(configuration)` accepts; None: all) is faster beyond the 95% interval of its gain over
    `current` (`gain_interval`)."""
    ranked, _ = sweep(learned_profile(profile, observed), tokens)
    ranked = [p for p in ranked if allowed is None or allowed(configuration_of(p))]
    best = ranked[0]
    here = next((p for p in ranked if _same(configuration_of(p), current)), None)
    if here is None:
        return Decision(configuration_of(best), True, best.predicted_tokens_per_s, None,
                        f"predicted {best.predicted_tokens_per_s:.1f} tokens/s; the current one is no longer ranked")
    rate = here.predicted_tokens_per_s
    if here is best:
        return Decision(dict(current), False, rate, rate, f"predicted the fastest ({rate:.1f} tokens/s)")
    gain = best.predicted_tokens_per_s / rate
    interval = gain_interval(profile, observed, configuration_of(best), configuration_of(here), tokens, gain)
    why = (f"{best.strategy} L{best.lookahead} M{best.max_lead} on stages {list(best.stage_indices)} predicted "
           f"{best.predicted_tokens_per_s:.1f} tokens/s against {rate:.1f}: a gain of {gain:.3f} (95% interval "
           f"{interval[0]:.3f}-{interval[1]:.3f})")  # fmt: skip
    if interval[0] > 1.0:
        return Decision(configuration_of(best), True, best.predicted_tokens_per_s, rate, why, gain, interval)
    return Decision(dict(current), False, rate, rate, why + ", not beyond it", gain, interval)


def drawn_profile(profile: Profile, prompts: Sequence[int]) -> Profile:
    """The profile with every pair's continuations those of `prompts` (indices, repeats allowed): its runs,
    proposals and token trees of each drawn prompt, the same prompts for every pair."""

    def pick(rows: tuple) -> tuple:
        return tuple(rows[i % len(rows)] for i in prompts) if rows else rows

    def drawn(pair: PairProfile) -> PairProfile:
        trees = tuple(replace(t, runs=pick(t.runs), nodes=pick(t.nodes), paths=pick(t.paths),
                              path_runs=pick(t.path_runs)) for t in pair.tree_runs)  # fmt: skip
        return replace(pair, runs=pick(pair.runs), proposed=pick(pair.proposed), tree_runs=trees)

    return replace(profile, pairs=tuple(drawn(p) for p in profile.pairs),
                   skip_pairs=tuple((d, v, drawn(p)) for d, v, p in profile.skip_pairs))  # fmt: skip


def gain_interval(profile: Profile, observed: Observed, best: Mapping[str, Any], current: Mapping[str, Any],
                  tokens: int, gain: float, replicates: int = REPLICATES) -> tuple[float, float]:  # fmt: skip
    """The 95% interval of `best`'s predicted tokens/s over `current`'s (`gain` on the learned profile):
    `gain` times exp(+-1.96 sd), sd the two errors of a predicted gain combined: what the acceptance was
    learned from, a stratified bootstrap over the profile's prompts (their continuations) and the run's
    calls (their counts), each drawn with replacement, both configurations predicted on each replicate's
    learned profile (the sd of the replicates' log gains; 0 where neither has two members to draw from);
    and the model's own error on a gain, held out (`MODEL_GAIN_ERROR`). Seeded by the call count: a
    decision is reproducible."""
    half = INTERVAL_Z * math.hypot(_bootstrap_sd(profile, observed, best, current, tokens, replicates),
                                   MODEL_GAIN_ERROR)  # fmt: skip
    return gain * math.exp(-half), gain * math.exp(half)


def _bootstrap_sd(profile: Profile, observed: Observed, best: Mapping[str, Any], current: Mapping[str, Any],
                  tokens: int, replicates: int) -> float:  # fmt: skip
    """The sd of log(best / current) predicted tokens/s over bootstrap replicates of the learned profile."""
    prompts = max((len(p.runs) for p in profile.pairs), default=0)
    if prompts < 2 and len(observed.per_call) < 2:
        return 0.0
    rng = np.random.default_rng(observed.calls)

    def draw(members: int) -> Sequence[int]:
        return rng.integers(0, members, members).tolist() if members >= 2 else range(members)

    def rate(learned: Profile, c: Mapping[str, Any]) -> float:
        return predict_profile(learned, c["strategy"], c["lookahead"], c["max_lead"], tokens,
                               None if c["strategy"] == "greedy" else c["stages"],
                               tree_nodes=c.get("tree_nodes", 0)).predicted_tokens_per_s  # fmt: skip

    logs = []
    for _ in range(replicates):
        learned = learned_profile(drawn_profile(profile, draw(prompts)), observed.drawn(draw(len(observed.per_call))))
        logs.append(math.log(rate(learned, best) / rate(learned, current)))
    return statistics.stdev(logs)


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = ("strategy", "lookahead", "max_lead")
    if a["strategy"] == "greedy" or b["strategy"] == "greedy":
        return a["strategy"] == b["strategy"]
    return all(a[k] == b[k] for k in keys) and list(a["stages"]) == list(b["stages"])


# ---- a learning run against a paired sweep ------------------------------------------------------------------


def sweep_configuration(ran: Mapping[str, Any], stage_count: int) -> dict[str, Any]:
    """A learning call's configuration (its decision's `ran`) as an entry of a sweep of its hierarchy of
    `stage_count` stages (`experiments.sweep`): strategy, lookahead, max_lead, and `stages` where it ran on
    some of them. (Token trees are the first stage's own: a sweep of them sets the stage option.)"""
    from analysis.paired import partial_stages

    entry = {key: ran[key] for key in ("strategy", "lookahead", "max_lead") if key in ran}
    stages = partial_stages(ran["strategy"], ran.get("stages"), stage_count)
    return entry if stages is None else {**entry, "stages": stages}


def learning_table(run_dir, sweep_dir) -> list[dict[str, Any]]:
    """Per call of a learning auto run (its sample records' `auto` decisions, the warm-up excluded): the
    configuration it ran, its measured paired speedup in the sweep of the same hierarchy and prompts, and
    that over the sweep's best configuration (None where the sweep did not run it), and whether its output
    equals the sweep's greedy output of that prompt (None where the sweep has none). A call on some of the
    stages (auto skipping one) is measured where the sweep ran that configuration on the same stages."""
    from analysis.paired import REFERENCE, configuration_name, paired_speedups, sweep_samples
    from analysis.rundir import ResultsError, read_config, read_records

    records, _ = read_records(run_dir)
    if not records or any("auto" not in r for r in records):
        raise ResultsError(f"{run_dir}: not a learning auto run (its records carry no `auto` decisions)")
    speedups = {s.configuration: s for s in paired_speedups(sweep_samples(sweep_dir))}
    best = max(speedups.values(), key=lambda s: s.speedup)
    greedy = {}
    for record in read_records(Path(sweep_dir) / REFERENCE)[0]:
        greedy.setdefault(record["slot"]["prompt"], record["output_ids"])
    stage_count = len(read_config(Path(sweep_dir) / REFERENCE)["models"]["stages"])
    rows = []
    for record in records:
        ran = record["auto"]["ran"]
        name = configuration_name({**sweep_configuration(ran, stage_count), "tree_nodes": ran.get("tree_nodes", 0)})
        measured = speedups.get(name)
        reference = greedy.get(record["sample_id"])
        rows.append({"sample": record["sample_id"], "configuration": name, "stages": ran.get("stages"),
                     "switched_next": record["auto"]["switched"], "gain": record["auto"].get("gain"),
                     "gain_interval": record["auto"].get("gain_interval"), "paired_speedup": measured and measured.speedup,
                     "of_best": measured and measured.speedup / best.speedup, "best": best.configuration,
                     "identical_to_greedy": None if reference is None else record["output_ids"] == reference})  # fmt: skip
    return rows


def _gain_text(row: Mapping[str, Any]) -> str:
    """'1.018 (1.004-1.031)'; '-' where the call's configuration was predicted the fastest (or the run
    predates gains)."""
    if row["gain"] is None:
        return "-"
    interval = row["gain_interval"]
    return f"{row['gain']:.3f}" + ("" if interval is None else f" ({interval[0]:.3f}-{interval[1]:.3f})")


def main(argv=None) -> int:
    import argparse
    import json
    import sys

    from analysis.rundir import ResultsError

    parser = argparse.ArgumentParser(prog="python -m analysis.learn",
                                     description="a learning auto run's configurations against a paired sweep")
    parser.add_argument("run_dir")
    parser.add_argument("sweep_dir")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        rows = learning_table(args.run_dir, args.sweep_dir)
    except (ResultsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"| call | configuration ran | paired speedup in the sweep | of the sweep's best ({rows[0]['best']}) "
          "| identical to the sweep's greedy | then: the best's predicted gain (95% interval) | switched |")
    print("|---|---|---|---|---|---|---|")
    for i, row in enumerate(rows, 1):
        speed = "not in the sweep" if row["paired_speedup"] is None else f"{row['paired_speedup']:.3f}"
        share = "-" if row["of_best"] is None else f"{row['of_best']:.3f}"
        same = {None: "-", True: "yes", False: "NO"}[row["identical_to_greedy"]]
        print(f"| {i} | {row['configuration']} | {speed} | {share} | {same} | {_gain_text(row)} "
              f"| {'yes' if row['switched_next'] else 'no'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
