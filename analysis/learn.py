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
- **Costs.** Each model stage's measured step seconds against the profile's t(n) for the same steps give the
  stage's speed on this run (`analysis.paired.speed_factor`'s ratio, pooled over the calls): its t(n) is scaled
  by it, so stages whose speed differs from the profile's (contention, another kernel) are ranked as they run.
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
from typing import Any, Mapping, Sequence

import numpy as np

from analysis.predict import INTERVAL_Z, predict_profile, sweep
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
    position, pooled and per call; per profile stage, measured step seconds and the profile's t(n) for the
    same steps."""

    offered: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    accepted: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    measured_s: dict[int, float] = field(default_factory=dict)
    profile_s: dict[int, float] = field(default_factory=dict)
    calls: int = 0
    per_call: list[dict[tuple[int, int], Counts]] = field(default_factory=list)

    def add(self, profile: Profile, stage_indices: Sequence[int], traces: Sequence[Any]) -> None:
        """One call's traces (`pipespec.trace.StageTrace`, or their dicts), the stages that ran in order;
        `stage_indices`: their positions in the profile's hierarchy."""
        steps = [t["steps"] if isinstance(t, Mapping) else t.steps for t in traces]
        call = {}
        for position, (stage, columns) in enumerate(zip(stage_indices, steps)):
            if position > 0:
                call[(stage_indices[position - 1], stage)] = verification_counts(columns)
            if not profile.stages[stage].model_free:
                self._add_costs(stage, columns, profile.stages[stage].step_s_alone)
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
        the stages' speeds as measured."""
        observed = Observed(measured_s=dict(self.measured_s), profile_s=dict(self.profile_s))
        for index in calls:
            observed._add_call(self.per_call[index])
        return observed

    def _add_costs(self, stage: int, columns: Mapping[str, Sequence], step_s: Sequence[float]) -> None:
        from analysis.paired import profile_seconds

        rows = range(1, len(columns["fed"]))  # the first step reads the prompt
        self.measured_s[stage] = self.measured_s.get(stage, 0.0) + sum(
            columns["t_end"][i] - columns["t_start"][i] for i in rows)  # fmt: skip
        predicted = profile_seconds(columns, step_s, rows)
        self.profile_s[stage] = self.profile_s.get(stage, 0.0) + predicted

    def speed(self, stage: int) -> float | None:
        """The stage's measured step seconds over the profile's for the same steps (None: none measured)."""
        predicted = self.profile_s.get(stage, 0.0)
        return self.measured_s[stage] / predicted if predicted > 0 else None


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


def learned_stage(stage: StageProfile, speed: float | None) -> StageProfile:
    if speed is None or stage.model_free:
        return stage
    return replace(stage, step_s_alone=tuple(t * speed for t in stage.step_s_alone),
                   step_s_loaded=tuple(t * speed for t in stage.step_s_loaded))  # fmt: skip


def learned_profile(profile: Profile, observed: Observed) -> Profile:
    """The profile with a run's observations folded in (its acceptance counts added, its stages' speeds)."""
    pairs = tuple(learned_pair(pair, observed.offered.get((i, i + 1), ()), observed.accepted.get((i, i + 1), ()))
                  for i, pair in enumerate(profile.pairs))  # fmt: skip
    skips = tuple((d, v, learned_pair(pair, observed.offered.get((d, v), ()), observed.accepted.get((d, v), ())))
                  for d, v, pair in profile.skip_pairs)  # fmt: skip
    stages = tuple(learned_stage(s, observed.speed(i)) for i, s in enumerate(profile.stages))
    return replace(profile, pairs=pairs, skip_pairs=skips, stages=stages)


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
        trees = tuple(replace(t, runs=pick(t.runs), nodes=pick(t.nodes)) for t in pair.tree_runs)
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
