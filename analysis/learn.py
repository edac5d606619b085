"""Learning while a run goes: what a pipeline's own calls show of acceptance and step costs, folded into the
machine profile `auto` ranks configurations with, so the next call can run a better one.

    observed = Observed()
    observed.add(profile, stage_indices, stage_traces)      # after each call (its traces, smallest stage first)
    learned = learned_profile(profile, observed)            # the profile as these calls revise it
    decision = next_configuration(learned, current)         # stay, or switch (and why)

- **Acceptance.** A verifier's trace says, per verification, how many drafts it was offered and how many it
  kept: by draft position, drafts offered there (every earlier one kept) and kept. Those counts are added to
  the profile's own (its walk along the continuations, `analysis.profile.walk_counts`), and the pair's rates
  by position become the pooled ratio (the simulator then draws by position, `simulate.ByPosition`).
- **Costs.** Each model stage's measured step seconds against the profile's t(n) for the same steps give the
  stage's speed on this run (`analysis.paired.speed_factor`'s ratio, pooled over the calls): its t(n) is scaled
  by it, so stages whose speed differs from the profile's (contention, another kernel) are ranked as they run.
- **The switch.** Every configuration is predicted again (`analysis.predict.sweep`); the run switches when the
  best one is predicted faster than the current one by more than `margin` (a hysteresis: acceptance
  estimated from a few calls moves by several percent), and each decision says why.

Every configuration is lossless, so a switch never changes what a greedy run returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from analysis.profile import PairProfile, Profile, StageProfile, walk_counts

MARGIN = 0.03  # predicted gain a switch needs
MIN_OFFERED = 8  # drafts a pair must have been offered at its first position before its observations count


@dataclass
class Observed:
    """What a run's calls added: per (drafter, verifier) pair of profile stages, drafts offered and kept by
    position; per profile stage, measured step seconds and the profile's t(n) for the same steps."""

    offered: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    accepted: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    measured_s: dict[int, float] = field(default_factory=dict)
    profile_s: dict[int, float] = field(default_factory=dict)
    calls: int = 0

    def add(self, profile: Profile, stage_indices: Sequence[int], traces: Sequence[Any]) -> None:
        """One call's traces (`pipespec.trace.StageTrace`, or their dicts), the stages that ran in order;
        `stage_indices`: their positions in the profile's hierarchy."""
        self.calls += 1
        steps = [t["steps"] if isinstance(t, Mapping) else t.steps for t in traces]
        for position, (stage, columns) in enumerate(zip(stage_indices, steps)):
            if position > 0:
                self._add_verifications((stage_indices[position - 1], stage), columns)
            if not profile.stages[stage].model_free:
                self._add_costs(stage, columns, profile.stages[stage].step_s_alone)

    def _add_verifications(self, pair: tuple[int, int], columns: Mapping[str, Sequence]) -> None:
        offered, accepted = self.offered.setdefault(pair, []), self.accepted.setdefault(pair, [])
        for kind, drafts, kept in zip(columns["kind"], columns["offered"], columns["accepted"]):
            if kind != "verify" or not drafts:
                continue
            for p in range(min(drafts, kept + 1)):  # position p was offered: every earlier draft kept
                if p >= len(offered):
                    offered.append(0)
                    accepted.append(0)
                offered[p] += 1
                accepted[p] += p < kept

    def _add_costs(self, stage: int, columns: Mapping[str, Sequence], step_s: Sequence[float]) -> None:
        from analysis.paired import profile_step_cost

        rows = range(1, len(columns["fed"]))  # the first step reads the prompt
        self.measured_s[stage] = self.measured_s.get(stage, 0.0) + sum(
            columns["t_end"][i] - columns["t_start"][i] for i in rows)  # fmt: skip
        predicted = sum(profile_step_cost(step_s, int(columns["fed"][i])) for i in rows)
        self.profile_s[stage] = self.profile_s.get(stage, 0.0) + predicted

    def speed(self, stage: int) -> float | None:
        """The stage's measured step seconds over the profile's for the same steps (None: none measured)."""
        predicted = self.profile_s.get(stage, 0.0)
        return self.measured_s[stage] / predicted if predicted > 0 else None


def prior_counts(pair: PairProfile, positions: int) -> tuple[list[int], list[int]]:
    """The profile's own counts of drafts offered and kept by position: its walk along each continuation
    (`walk_counts`), or, for a profile without continuations, one draft per position at its rate."""
    if not pair.runs:
        return [1] * positions, [rate or 0.0 for rate in pair.acceptance_by_position[:positions]]
    offered, accepted = [0] * positions, [0] * positions
    for along in pair.runs:
        counts = walk_counts(along, None, positions)
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
    switch, the predictions behind it and why."""

    configuration: dict[str, Any]
    switched: bool
    predicted_tokens_per_s: float
    current_tokens_per_s: float | None
    reason: str


def configuration_of(prediction) -> dict[str, Any]:
    """A prediction's configuration (`tree_nodes` only where its first stage proposes token trees)."""
    trees = getattr(prediction, "tree_nodes", 0)
    return {"strategy": prediction.strategy, "lookahead": prediction.lookahead, "max_lead": prediction.max_lead,
            "stages": list(prediction.stage_indices), **({"tree_nodes": trees} if trees else {})}  # fmt: skip


def next_configuration(profile: Profile, current: Mapping[str, Any], tokens: int = 128, margin: float = MARGIN,
                       allowed=None) -> Decision:  # fmt: skip
    """Stay with `current` unless the best predicted configuration (among those `allowed(configuration)`
    accepts; None: all) beats it by more than `margin`."""
    from analysis.predict import sweep

    ranked, _ = sweep(profile, tokens)
    ranked = [p for p in ranked if allowed is None or allowed(configuration_of(p))]
    best = ranked[0]
    here = next((p for p in ranked if _same(configuration_of(p), current)), None)
    rate = here.predicted_tokens_per_s if here is not None else None
    if here is None or best.predicted_tokens_per_s > rate * (1 + margin):
        why = (f"predicted {best.predicted_tokens_per_s:.1f} tokens/s against "
               + (f"{rate:.1f} for the current one" if rate is not None else "the current one, no longer ranked"))
        return Decision(configuration_of(best), not _same(configuration_of(best), current), best.predicted_tokens_per_s,
                        rate, why)  # fmt: skip
    return Decision(dict(current), False, rate, rate,
                    f"the best other is within {margin:.0%} ({best.predicted_tokens_per_s:.1f} against {rate:.1f})")


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = ("strategy", "lookahead", "max_lead")
    if a["strategy"] == "greedy" or b["strategy"] == "greedy":
        return a["strategy"] == b["strategy"]
    return all(a[k] == b[k] for k in keys) and list(a["stages"]) == list(b["stages"])


# ---- a learning run against a paired sweep ------------------------------------------------------------------


def learning_table(run_dir, sweep_dir) -> list[dict[str, Any]]:
    """Per call of a learning auto run (its sample records' `auto` decisions, the warm-up excluded): the
    configuration it ran, its measured paired speedup in the sweep of the same hierarchy and prompts, and
    that over the sweep's best configuration (None where the sweep did not run it), and whether its output
    equals the sweep's greedy output of that prompt (None where the sweep has none)."""
    from analysis.paired import REFERENCE, configuration_name, paired_speedups, sweep_samples
    from analysis.rundir import ResultsError, read_records

    records, _ = read_records(run_dir)
    if not records or any("auto" not in r for r in records):
        raise ResultsError(f"{run_dir}: not a learning auto run (its records carry no `auto` decisions)")
    speedups = {s.configuration: s for s in paired_speedups(sweep_samples(sweep_dir))}
    best = max(speedups.values(), key=lambda s: s.speedup)
    greedy = {}
    for record in read_records(Path(sweep_dir) / REFERENCE)[0]:
        greedy.setdefault(record["slot"]["prompt"], record["output_ids"])
    rows = []
    for record in records:
        ran = record["auto"]["ran"]
        name = configuration_name(ran)
        measured = speedups.get(name)
        reference = greedy.get(record["sample_id"])
        rows.append({"sample": record["sample_id"], "configuration": name, "stages": ran.get("stages"),
                     "switched_next": record["auto"]["switched"], "paired_speedup": measured and measured.speedup,
                     "of_best": measured and measured.speedup / best.speedup, "best": best.configuration,
                     "identical_to_greedy": None if reference is None else record["output_ids"] == reference})  # fmt: skip
    return rows


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
          "| identical to the sweep's greedy |")
    print("|---|---|---|---|---|")
    for i, row in enumerate(rows, 1):
        speed = "not in the sweep" if row["paired_speedup"] is None else f"{row['paired_speedup']:.3f}"
        share = "-" if row["of_best"] is None else f"{row['of_best']:.3f}"
        same = {None: "-", True: "yes", False: "NO"}[row["identical_to_greedy"]]
        print(f"| {i} | {row['configuration']} | {speed} | {share} | {same} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
