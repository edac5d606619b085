"""Paired, interleaved speed claims: a configuration's speedup against greedy, measured side by side.

The machine a measurement runs on drifts (identical runs minutes apart differ by a third; neighbouring
prompts 15-30 s apart by about 8%), so a speed claim here is never an absolute tokens/s compared across
runs: it is the ratio of a configuration's tokens/s to greedy's **on the same prompt, in the same
repetition**, the two run within seconds of each other (`rotation` interleaves them), pooled as a
geometric mean, with two bootstrap 95% intervals:

- *measurement*: repetitions resampled within each prompt (the prompts fixed): how much the figure moves
  when the same prompts are timed again on this machine;
- *sampling*: prompts resampled (each with its mean over repetitions): how much it moves on other prompts
  of the same dataset.

Two configurations whose intervals overlap are not told apart by the measurement (`overlapping`).
Pure Python and numpy: it reads samples (configuration, prompt, repetition, tokens, seconds), wherever
they come from (`experiments.sweep` writes them, one run directory per configuration).

    python -m analysis.paired SWEEP_DIR [--reference greedy] [--json]
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

REFERENCE = "greedy"  # the configuration every pair of a sweep is measured against
RESAMPLES = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Sample:
    """One timed generation of one configuration on one prompt in one repetition."""

    configuration: str
    prompt: str
    repetition: int
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


@dataclass(frozen=True)
class PairedSpeedup:
    """A configuration's geometric-mean paired speedup against the reference, and its 95% intervals."""

    configuration: str
    speedup: float
    measurement_interval: tuple[float, float]  # repetitions resampled within prompts
    sampling_interval: tuple[float, float]  # prompts resampled
    prompts: int
    repetitions: int
    pairs: int

    @property
    def interval(self) -> tuple[float, float]:
        """The wider of the two: what a claim about this configuration must allow for."""
        return (min(self.measurement_interval[0], self.sampling_interval[0]),
                max(self.measurement_interval[1], self.sampling_interval[1]))  # fmt: skip


def rotation(items: Sequence, prompt_index: int, repetition: int) -> list:
    """The run order of `items` at one prompt slot: rotated by one per prompt and per repetition, so every
    item runs in every position equally often and none always follows another."""
    if not items:
        return []
    shift = (prompt_index + repetition) % len(items)
    return list(items[shift:]) + list(items[:shift])


def log_ratios(samples: Iterable[Sample], reference: str) -> dict[str, dict[str, list[float]]]:
    """{configuration: {prompt: [log(tokens/s / the reference's tokens/s) per repetition]}}, over the
    (prompt, repetition) slots where both ran."""
    by_slot: dict[tuple[str, int], dict[str, Sample]] = {}
    for sample in samples:
        if sample.seconds > 0 and sample.tokens > 0:
            by_slot.setdefault((sample.prompt, sample.repetition), {})[sample.configuration] = sample
    out: dict[str, dict[str, list[float]]] = {}
    for (prompt, _), slot in sorted(by_slot.items()):
        base = slot.get(reference)
        if base is None:
            continue
        for name, sample in slot.items():
            out.setdefault(name, {}).setdefault(prompt, []).append(math.log(sample.tokens_per_s / base.tokens_per_s))
    return out


def _interval(values: np.ndarray) -> tuple[float, float]:
    low, high = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(math.exp(low)), float(math.exp(high))


def bootstrap_measurement(per_prompt: Sequence[Sequence[float]], rng: np.random.Generator,
                          resamples: int = RESAMPLES) -> tuple[float, float]:  # fmt: skip
    """The interval of the mean log ratio when each prompt's repetitions are resampled (prompts fixed)."""
    means = np.zeros(resamples)
    for values in per_prompt:
        values = np.asarray(values, dtype=float)
        picks = rng.integers(0, len(values), size=(resamples, len(values)))
        means += values[picks].mean(axis=1)
    return _interval(means / len(per_prompt))


def bootstrap_sampling(per_prompt: Sequence[Sequence[float]], rng: np.random.Generator,
                       resamples: int = RESAMPLES) -> tuple[float, float]:  # fmt: skip
    """The interval of the mean log ratio when prompts (each its mean over repetitions) are resampled."""
    prompt_means = np.asarray([np.mean(values) for values in per_prompt], dtype=float)
    picks = rng.integers(0, len(prompt_means), size=(resamples, len(prompt_means)))
    return _interval(prompt_means[picks].mean(axis=1))


def paired_speedups(samples: Iterable[Sample], reference: str = REFERENCE, seed: int = 0,
                    resamples: int = RESAMPLES) -> list[PairedSpeedup]:  # fmt: skip
    """Every configuration's paired speedup against `reference` (which itself comes out at exactly 1),
    fastest first. The prompts' means are weighted equally: a prompt with more repetitions counts once."""
    ratios = log_ratios(samples, reference)
    if reference not in ratios:
        raise ValueError(f"no sample of the reference configuration {reference!r} shares a prompt and repetition "
                         "with another configuration")  # fmt: skip
    out = []
    for name, by_prompt in ratios.items():
        per_prompt = [by_prompt[p] for p in sorted(by_prompt)]
        rng = np.random.default_rng(seed)
        center = math.exp(float(np.mean([np.mean(v) for v in per_prompt])))
        out.append(PairedSpeedup(
            name, center, bootstrap_measurement(per_prompt, rng, resamples), bootstrap_sampling(per_prompt, rng, resamples),
            prompts=len(per_prompt), repetitions=max(len(v) for v in per_prompt), pairs=sum(map(len, per_prompt)),
        ))  # fmt: skip
    return sorted(out, key=lambda s: -s.speedup)


def overlapping(a: PairedSpeedup, b: PairedSpeedup) -> bool:
    """Whether the two configurations' measurement intervals overlap: the sweep does not tell them apart."""
    (a_low, a_high), (b_low, b_high) = a.measurement_interval, b.measurement_interval
    return a_low <= b_high and b_low <= a_high


def format_table(speedups: Sequence[PairedSpeedup], reference: str = REFERENCE) -> str:
    """Markdown: speedup, both intervals, and which configurations the best is not told apart from."""
    best = speedups[0] if speedups else None
    lines = [f"| configuration | speedup vs {reference} | 95% CI, repetitions | 95% CI, prompts | prompts x reps | "
             "not told apart from the best |", "|---|---|---|---|---|---|"]  # fmt: skip
    for s in speedups:
        tie = "" if s is best else ("yes" if overlapping(s, best) else "")
        lines.append(f"| {s.configuration} | {s.speedup:.3f} | {s.measurement_interval[0]:.3f}-"
                     f"{s.measurement_interval[1]:.3f} | {s.sampling_interval[0]:.3f}-{s.sampling_interval[1]:.3f} | "
                     f"{s.prompts} x {s.repetitions} | {tie} |")  # fmt: skip
    return "\n".join(lines)


def speed_factor(steps: Mapping[str, Sequence], step_s: Sequence[float] | Callable[[int, int], float],
                 skip_first: bool = True) -> float | None:  # fmt: skip
    """How slow the machine was for one sample against a profile: the stage's measured step seconds over the
    profile's for the same steps (`profile_seconds`). The first step (the prompt's prefill) is left out;
    None without steps."""
    if not step_s:
        return None
    starts, ends = steps["t_start"], steps["t_end"]
    rows = range(1 if skip_first else 0, len(steps["fed"]))
    measured = sum(ends[i] - starts[i] for i in rows)
    predicted = profile_seconds(steps, step_s, rows)
    return measured / predicted if predicted > 0 else None


def profile_seconds(steps: Mapping[str, Sequence], cost: Sequence[float] | Callable[[int, int], float],
                    rows: Sequence[int]) -> float:  # fmt: skip
    """The profile's seconds for the `rows` of a stage's trace (`profile_step_seconds`)."""
    seconds = profile_step_seconds(steps, cost)
    return sum(seconds[i] for i in rows)


def profile_step_seconds(steps: Mapping[str, Sequence], cost: Sequence[float] | Callable[[int, int], float]
                         ) -> list[float]:  # fmt: skip
    """The profile's seconds for each step of a stage's trace: `cost` a t(n) table (n = tokens fed; beyond its
    largest n, extrapolated along its last two points), or a cost of n and the generated tokens in the
    stage's cache before the step (`analysis.simulate.ContextCost` at the sample's prompt): its tokens
    produced so far less those rollbacks removed."""
    if not callable(cost):
        return [profile_step_cost(cost, int(fed)) for fed in steps["fed"]]
    cached, generated, removed = [], 0, steps.get("rollback_tokens") or [0] * len(steps["fed"])
    for produced, rolled_back in zip(steps.get("produced") or [1] * len(steps["fed"]), removed):
        generated = max(generated - int(rolled_back), 0)
        cached.append(generated)
        generated += int(produced)
    return [cost(max(int(fed), 1), context) for fed, context in zip(steps["fed"], cached)]


def profile_step_cost(step_s: Sequence[float], n: int) -> float:
    if n <= len(step_s):
        return float(step_s[max(n, 1) - 1])
    slope = step_s[-1] - step_s[-2] if len(step_s) > 1 else 0.0
    return float(step_s[-1] + slope * (n - len(step_s)))


def overlap(a: float, b: float, start: float, end: float) -> float:
    """Seconds the interval [a, b] shares with [start, end]."""
    return max(0.0, min(end, b) - max(start, a))


FOLLOWS, AFTER_WAIT, BESIDE = "follows its own step", "after a wait", "beside another stage"
STEP_CONDITIONS = (FOLLOWS, AFTER_WAIT, BESIDE)
BACK_TO_BACK_S = 0.002  # a step that starts within this of the stage's previous one follows it


def step_conditions(steps: Mapping[str, Sequence], others: Iterable[Mapping[str, Sequence]]) -> list[str | None]:
    """What came before each step of a stage's trace, given the traces of the other stages of the sample:
    BESIDE where other stages' model steps (fed > 0) ran through more than half of it, else AFTER_WAIT where it
    started more than `BACK_TO_BACK_S` after the stage's previous step ended, else FOLLOWS. None for the first
    step (the prompt's prefill)."""
    busy = sorted((a, b) for o in others for a, b, fed in zip(o["t_start"], o["t_end"], o["fed"]) if fed)
    starts, longest = [a for a, _ in busy], max((b - a for a, b in busy), default=0.0)
    found: list[str | None] = [None]
    for i in range(1, len(steps["fed"])):
        start, end = steps["t_start"][i], steps["t_end"][i]
        near = busy[bisect.bisect_left(starts, start - longest):bisect.bisect_left(starts, end)]
        shared = sum(overlap(a, b, start, end) for a, b in near)
        if shared > 0.5 * (end - start):
            found.append(BESIDE)
        else:
            found.append(AFTER_WAIT if start - steps["t_end"][i - 1] > BACK_TO_BACK_S else FOLLOWS)
    return found


def decoding_busy(steps: Mapping[str, Sequence], target: Mapping[str, Sequence]) -> tuple[float, float]:
    """A stage's seconds computing while the target decodes, and the target's decoding time: from the end of the
    target's first step (its prompt's prefill) to the end of its last, as the simulator's clock runs; the stage's
    own first step (its prefill) left out, its other steps clipped to that span. (0, 0) for a target that took
    no decode step."""
    if len(target["t_end"]) < 2:
        return 0.0, 0.0
    start, end = target["t_end"][0], target["t_end"][-1]
    busy = sum(overlap(a, b, start, end) for a, b in zip(steps["t_start"][1:], steps["t_end"][1:]))
    return busy, end - start


def partial_stages(strategy: str, stages: Sequence[int] | None, stage_count: int) -> list[int] | None:
    """A configuration's `stages` as a sweep entry keeps them: the positions where it runs on some of the
    hierarchy's `stage_count` stages; None where it runs on all of them (or none given) or is greedy (the
    target alone, whatever it says)."""
    chosen = list(stages) if stages else list(range(stage_count))
    return chosen if strategy != "greedy" and chosen != list(range(stage_count)) else None


def configuration_name(options: Mapping[str, Any]) -> str:
    """sd_L4, pipespec_L0_M8, with _c0.4 (draft_confidence), _sized, _cascade, _v0.1 (value_stop), _T4 (the
    first stage's token trees of 4 nodes, `tree_nodes`) and _S0-2 (`stages`: some of the hierarchy's stages,
    by position) suffixes."""
    from pipespec.schedule import DEFAULT_MAX_LEAD

    strategy = options.get("strategy", "pipespec")
    if strategy == "greedy":
        return "greedy"
    name = f"{strategy}_L{options.get('lookahead', 0)}"
    if strategy == "pipespec":
        name += f"_M{options.get('max_lead', DEFAULT_MAX_LEAD)}"
    extras = [(options.get("draft_confidence"), f"_c{options.get('draft_confidence')}"),
              (options.get("size_verification"), "_sized"), (options.get("cascade"), "_cascade"),
              (options.get("value_stop"), f"_v{options.get('value_stop')}"),
              (options.get("tree_nodes"), f"_T{options.get('tree_nodes')}"),
              (options.get("stages"), "_S" + "-".join(map(str, options.get("stages") or ())))]  # fmt: skip
    return name + "".join(suffix for value, suffix in extras if value)


# ---- reading a sweep directory ---------------------------------------------------------------------------


def sweep_samples(sweep_dir: str | Path) -> list[Sample]:
    """The samples of a sweep directory: one run directory per configuration (its folder name), each record's
    `slot` naming its prompt and repetition (`experiments.sweep`)."""
    from analysis.rundir import ResultsError, read_records

    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ResultsError(f"{sweep_dir}: no such directory")
    samples = []
    for run_dir in sorted(p for p in sweep_dir.iterdir() if (p / "samples.jsonl").is_file()):
        records, _ = read_records(run_dir)
        for record in records:
            slot = record.get("slot")
            if not isinstance(slot, Mapping):
                raise ResultsError(f"{run_dir / 'samples.jsonl'}: record {record['sample_id']!r} has no slot "
                                   "(prompt, repetition): not a sweep's run")  # fmt: skip
            samples.append(Sample(run_dir.name, str(slot["prompt"]), int(slot["repetition"]), int(record["new_tokens"]),
                                  float(record["time_s"])))  # fmt: skip
    if not samples:
        raise ResultsError(f"{sweep_dir}: no sweep runs here (folders with samples.jsonl)")
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    from analysis.rundir import ResultsError

    parser = argparse.ArgumentParser(prog="python -m analysis.paired", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--reference", default="greedy")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        speedups = paired_speedups(sweep_samples(args.sweep_dir), args.reference)
    except (ResultsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps([asdict(s) for s in speedups], indent=1) if args.json else format_table(speedups, args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
