"""Our runs per sample, for the figures' intervals over prompts: each sample's prompt and repetition, its
tokens and time, the target's tokens per verification, each pair's alpha / rho / gamma and each stage's busy
share (``analysis.fit.measure_traces`` on the sample alone), and the paired speedups of the runs that share
a greedy reference (``analysis.paired.paired_speedups``, as ``python -m analysis.paired`` prints them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from analysis import fit, names, paired
from analysis.runs import Run, greedy_reference


@dataclass
class SampleStats:
    """What one sample of a run measured."""

    prompt: str
    repetition: int
    tokens: int
    seconds: float
    verify_counts: list[int]  # the target's tokens appended per verification (its own token included)
    pairs: list[tuple[float, float, float]]  # per adjacent pair: (alpha MLE, rho, gamma), NaN where none
    busy: list[float]  # per stage: busy share of its wall time
    target_accepted: int = 0  # drafts the target accepted, over its verifications
    target_offered: int = 0  # drafts offered to it

    @property
    def draft_acceptance_rate(self) -> float:
        return self.target_accepted / self.target_offered if self.target_offered else math.nan

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.seconds / self.tokens if self.tokens else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.nan


def slot(record: dict) -> tuple[str, int]:
    """(prompt, repetition) of a sample record: its sweep slot, else its sample id ("HumanEval/20@r1")."""
    given = record.get("slot")
    if isinstance(given, dict) and "prompt" in given:
        return str(given["prompt"]), int(given.get("repetition", 0))
    prompt, _, repetition = str(record.get("sample_id", record.get("index"))).partition("@r")
    return prompt, int(repetition) if repetition.isdigit() else 0


def _sample_stats(record: dict, traces) -> SampleStats:
    measured = fit.measure_traces([(record, traces)])
    steps = traces[-1].steps
    verified = [(a, o) for k, a, o in zip(steps["kind"], steps["accepted"], steps["offered"]) if k == "verify"]
    pairs = [(p.alpha.alpha if p.alpha is not None else math.nan, p.rho, p.gamma) for p in measured.pairs]
    prompt, repetition = slot(record)
    return SampleStats(prompt, repetition, int(record.get("new_tokens") or measured.tokens),
                       float(record.get("time_s") or measured.time_s), [a + 1 for a, _ in verified], pairs,
                       [s.busy_fraction for s in measured.stages], sum(a for a, _ in verified),
                       sum(o for _, o in verified))


@dataclass
class RunStats:
    """A run's samples, measured one at a time (read once)."""

    run: Run
    samples: list[SampleStats]

    def per_prompt(self, value: Callable[[SampleStats], float]) -> list[list[float]]:
        """``value`` of each sample, grouped by prompt (prompts sorted, repetitions in order)."""
        grouped: dict[str, list[float]] = {}
        for sample in sorted(self.samples, key=lambda s: (s.prompt, s.repetition)):
            grouped.setdefault(sample.prompt, []).append(value(sample))
        return [grouped[p] for p in sorted(grouped)]

    @property
    def prompts(self) -> int:
        return len({s.prompt for s in self.samples})

    @property
    def repetitions(self) -> int:
        return max((s.repetition for s in self.samples), default=0) + 1


@dataclass
class RunData:
    """Per-sample statistics and paired speedups of a collection of runs, each computed on first use."""

    runs: Sequence[Run]
    _stats: dict = field(default_factory=dict)
    _speedups: dict = field(default_factory=dict)

    def stats(self, run: Run) -> RunStats:
        if run.path not in self._stats:
            self._stats[run.path] = RunStats(run, [_sample_stats(r, t) for r, t in run.iter_traces()])
        return self._stats[run.path]

    def reference(self, run: Run) -> Run | None:
        """The greedy run ``run`` is paired with (itself for a greedy run)."""
        return run if run.strategy == "greedy" else greedy_reference(run, self.runs)

    def speedup(self, run: Run) -> paired.PairedSpeedup | None:
        """``run``'s paired speedup over its greedy reference (prompts and repetitions matched by slot): the
        ``sampling_interval`` is the 95% interval with prompts resampled. None without a reference."""
        reference = self.reference(run)
        if reference is None:
            return None
        if reference.path not in self._speedups:
            members = [r for r in self.runs if r is reference or self.reference(r) is reference]
            samples = [paired.Sample(str(r.path), s.prompt, s.repetition, s.tokens, s.seconds)
                       for r in members for s in self.stats(r).samples]
            found = paired.paired_speedups(samples, reference=str(reference.path))
            self._speedups[reference.path] = {s.configuration: s for s in found}
        return self._speedups[reference.path].get(str(run.path))

    def speedup_columns(self, run: Run) -> dict:
        found = self.speedup(run)
        if found is None:
            return {"speedup_vs_greedy": None, "speedup_vs_greedy_low": None, "speedup_vs_greedy_high": None}
        return {"speedup_vs_greedy": found.speedup, "speedup_vs_greedy_low": found.sampling_interval[0],
                "speedup_vs_greedy_high": found.sampling_interval[1], "prompts": found.prompts,
                "repetitions": found.repetitions}

    def best(self, runs: Sequence[Run], strategy: str) -> Run | None:
        """The run of ``strategy`` with the largest paired speedup (ties: the smaller lookahead)."""
        chosen = [r for r in runs if r.strategy == strategy]
        if not chosen:
            return None
        return max(chosen, key=lambda r: ((self.speedup(r).speedup if self.speedup(r) else r.tokens_per_s),
                                          -r.lookahead, -(r.max_lead or 0)))


def configuration(run: Run) -> str:
    """A run's configuration in words: "PipeSpec, lookahead 0, max lead 8" (names.configuration_name)."""
    if run.strategy == "greedy":
        return "greedy"
    text = f"{run.strategy}_L{run.lookahead}" + (f"_M{run.max_lead}" if run.strategy == "pipespec" else "")
    return names.configuration_name(text)


def system(run: Run) -> str:
    """ "PipeSpec k=3 (lookup -> int8 -> fp32)", "greedy (fp32)"."""
    return names.system_name(run.strategy, _stages(run))


def hierarchy(run: Run) -> str:
    return names.hierarchy_name(_stages(run))


def _stages(run: Run) -> list[str]:
    return list(run.stage_names) or list(names.HIERARCHY_STAGES.get(run.hierarchy, (run.hierarchy,)))


def machine(runs: Sequence[Run]) -> str:
    """The machines of ``runs`` from their env.json: CPU, cores, torch (each distinct one once)."""
    found: list[str] = []
    for run in runs:
        env = run.env or {}
        info = env.get("cpu_info") or {}
        cpu = info.get("name") or env.get("cpu") or "unknown CPU"
        if info.get("family"):
            cpu += f" (family {info['family']}, model {info.get('model', '?')}"
            cpu += f", {info['torch_capability']})" if info.get("torch_capability") else ")"
        gpus = env.get("gpus") or []
        text = f"{cpu}, {env.get('cpu_count', '?')} cores, " + (f"{len(gpus)} GPUs" if gpus else "no GPU") + (
            f", torch {env['torch']}" if env.get("torch") else "")
        if text not in found:
            found.append(text)
    return "; ".join(found) if found else "unknown (no env.json)"
