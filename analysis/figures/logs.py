"""The figures of the authors' published HumanEval logs (``results/official/humaneval``).

A log holds 10 or 20 samples (HumanEval problems in the same order in every log): a figure that shows a
mean of samples shows it with its 95% interval over them (``common.mean_interval``), and a speedup is paired
problem by problem with the greedy log of the same target (``analysis.paired.paired_speedups``, the
problems resampled; the greedy 70B log has 10, so speedups over it use the first 10 of each log). Pooled
values (Table 2's sum of times / sum of tokens) stay in the data tables beside them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

from analysis import evaluate, fit, names, paired, style
from analysis import import_official as official
from analysis.figures import draw
from analysis.figures.common import (BINS, IN_SAMPLE, OFFICIAL_MACHINE, Drawn, bin_label, binned_shares,
                                     interval_columns, mean_interval, scaled_interval, shown)

GREEDY = "greedy"


def _strategy(log: official.OfficialLog) -> str:
    return official.STRATEGY_NAMES[log.strategy]


def _system(log: official.OfficialLog) -> str:
    """ "PipeSpec k=3 (LLaMA-3.2-1B -> LLaMA-3.1-8B -> LLaMA-3.1-70B)" (names.system_name)."""
    return names.system_name(_strategy(log), log.model_paths)


def _short(log: official.OfficialLog) -> str:
    """ "PipeSpec 1B -> 8B -> 70B": strategy and the models' sizes, for tight labels."""
    models = log.model_names[-1:] if log.strategy == "greedy" else log.model_names
    return f"{names.STRATEGY_NAMES[_strategy(log)].split(' (')[0]} {' -> '.join(models)}"


def _per_sample(log: official.OfficialLog, value: Callable[[official.SampleMetrics], float]) -> list[list[float]]:
    return [[value(s)] for s in log.samples]


def _ms(sample: official.SampleMetrics) -> float:
    return 1000.0 * sample.total_time / sample.tokens_generated if sample.tokens_generated else math.nan


@dataclass
class Logs:
    """The authors' logs the official figures draw: all of them, those of the largest target, and their folder."""

    logs: Sequence[official.OfficialLog]
    directory: Path  # the folder of the logs (its humaneval/ subfolder)
    source: list[str]  # the data line of every caption
    largest: list[official.OfficialLog]  # the logs of the largest target
    target: str  # that target's plain name ("" without logs)
    _speedups: dict = field(default_factory=dict)

    @property
    def speculative(self) -> list[official.OfficialLog]:
        """The largest target's SD and PipeSpec logs (not greedy), SD first."""
        return sorted((log for log in self.largest if log.strategy != "greedy"), key=lambda g: g.strategy != "chain")

    def greedy(self, target: str) -> official.OfficialLog | None:
        return next((g for g in self.logs if g.strategy == "greedy" and g.target == target), None)

    def speedup(self, log: official.OfficialLog) -> paired.PairedSpeedup | None:
        """``log``'s paired speedup over the greedy log of its target, problem by problem (None without one)."""
        greedy = self.greedy(log.target)
        if greedy is None:
            return None
        if greedy.path not in self._speedups:
            members = [g for g in self.logs if g.target == log.target]
            samples = [paired.Sample(g.path.name, str(s.sample_index), 0, s.tokens_generated, s.total_time)
                       for g in members for s in g.samples]
            found = paired.paired_speedups(samples, reference=greedy.path.name)
            self._speedups[greedy.path] = {s.configuration: s for s in found}
        return self._speedups[greedy.path].get(log.path.name)

    def speedup_columns(self, log: official.OfficialLog) -> dict:
        found = self.speedup(log)
        if found is None:
            return {}
        greedy = self.greedy(log.target)
        return {"speedup_vs_greedy": found.speedup, "speedup_vs_greedy_low": found.sampling_interval[0],
                "speedup_vs_greedy_high": found.sampling_interval[1], "paired_problems": found.prompts,
                "pooled_speedup_vs_greedy": official.pooled_ms_per_token(greedy) / official.pooled_ms_per_token(log)}

    def drawn(self, fig, rows: list[dict], selection: str, caption: str, **extra) -> Drawn:
        return Drawn(fig, rows, self.source, selection, caption, extra, OFFICIAL_MACHINE)


def _time_columns(log: official.OfficialLog) -> dict:
    return {**interval_columns("ms_per_token", mean_interval(_per_sample(log, _ms))),
            "pooled_ms_per_token": official.pooled_ms_per_token(log), "samples": log.num_samples}


def _histogram_bars(log: official.OfficialLog, label: str, color: str, panel: str) -> tuple[draw.Bars, list[dict]]:
    """A log's share of verifications per bin of tokens appended by its target (mean over samples, interval)."""
    pair = log.num_pairs - 1
    per_sample = [binned_shares(s.accepted_tokens[pair]) for s in log.samples if s.accepted_tokens[pair]]
    shares = [mean_interval([[shares[b]] for shares in per_sample]) for b in range(len(BINS))]
    length = mean_interval([[sum(s.accepted_tokens[pair]) / len(s.accepted_tokens[pair])]
                            for s in log.samples if s.accepted_tokens[pair]])
    rows = [{"panel": panel, "series": _system(log), "bin": bin_label(*b), **interval_columns(
        "percent_of_verifications", share), **interval_columns("mean_acceptance_length", length),
        "verifications": len(official.accepted_counts(log, pair)), "samples": len(per_sample), "source": log.path.name}
        for b, share in zip(BINS, shares)]
    bars = draw.Bars(f"{label}: mean {length[0]:.2f}", color, [s[0] for s in shares], [s[1] for s in shares],
                     [s[2] for s in shares])
    return bars, rows


def fig3(logs: Logs) -> Drawn:
    panels, rows = [], []
    for models in sorted({log.model_paths for log in logs.speculative},
                         key=lambda m: (len(m), [draw.model_size(official.short_model_name(p)) for p in m])):
        panel = names.hierarchy_name(models)
        series = []
        for log in (g for g in logs.speculative if g.model_paths == models):
            label = "SD, lookahead 8" if log.strategy == "chain" else "PipeSpec"
            bars, more = _histogram_bars(log, label, style.color(_strategy(log)), panel)
            series.append(bars)
            rows += more
        panels.append((panel, series))
    times = []
    for log in sorted(logs.largest, key=lambda g: (g.strategy != "greedy", len(g.model_paths), g.model_names,
                                                   g.strategy != "chain")):
        columns = _time_columns(log)
        times.append((_short(log), style.color(_strategy(log)), columns["ms_per_token"], columns["ms_per_token_low"],
                      columns["ms_per_token_high"]))
        rows.append({"panel": "time per token", "series": _system(log), **columns, **logs.speedup_columns(log),
                     "source": log.path.name})
    fig = draw.accepted_histogram(panels, times, "time per token (ms), mean over samples")
    caption = (f"Tokens the {logs.target} target appended per verification (accepted drafts and its own token, as "
               "logged), one panel per hierarchy: share of verifications per bin, mean over the samples with its 95% "
               "interval over them; the legend gives the mean tokens per verification. Bins 1-8 (8: the SD window), "
               "9-16, 17+. The logs omit PipeSpec's last verification of each sample. Last panel: time per token, "
               "mean over samples with its 95% interval (pooled values and paired speedups in the data table).")
    return logs.drawn(fig, rows, f"logs with the {logs.target} target", caption)


def fig4(logs: Logs) -> Drawn:
    sweep = [log for log in logs.logs if log not in logs.largest and log.strategy != "greedy"]
    chains = sorted({log.model_paths for log in sweep})
    if not chains:
        raise LookupError("no lookahead sweep among the logs")
    panels, rows = [], []
    for models in chains:
        series = defaultdict(list)
        for log in sorted((g for g in sweep if g.model_paths == models), key=lambda g: g.lookahead):
            columns = _time_columns(log)
            series[_strategy(log)].append((log.lookahead, columns["ms_per_token"], columns["ms_per_token_low"],
                                           columns["ms_per_token_high"]))
            rows.append({"panel": names.hierarchy_name(models), "series": _system(log), "lookahead": log.lookahead,
                         **columns, **logs.speedup_columns(log), "source": log.path.name})
        greedy = logs.greedy(models[-1])
        reference = None
        if greedy is not None:
            columns = _time_columns(greedy)
            reference = (f"greedy ({names.stage_name(greedy.target)})", columns["ms_per_token"],
                         columns["ms_per_token_low"], columns["ms_per_token_high"])
            rows.append({"panel": names.hierarchy_name(models), "series": _system(greedy), "lookahead": "",
                         **columns, "source": greedy.path.name})
        panels.append(draw.Panel("", [draw.Series(names.system_name(s, models), style.color(s), points,
                                                  marker="o" if s == "sd" else "s")
                                      for s, points in sorted(series.items(), key=lambda kv: kv[0] != "sd")],
                                 "lookahead (tokens)", "time per token (ms)", reference))
    fig = draw.lines(panels, columns=1, row_height=2.4, legend_columns=1)
    caption = ("Time per token against lookahead (SD: draft window; PipeSpec: minimum lead a verifier waits for), "
               "the lookahead sweep with LLaMA-3.2-1B drafting for LLaMA-3.1-8B: mean over the 10 samples of each "
               "log with its 95% interval; dashed: the greedy log of the same target, its band the interval.")
    return logs.drawn(fig, rows, "lookahead sweep logs and the greedy log of their target", caption)


def gpu_panel_data(samples: Sequence[dict], gpus: dict[int, str], tokens: int) -> dict:
    """Per active GPU: utilisation over time and means; mean power; energy per token per active GPU
    (trapezoid integral of the mean active-GPU power over the sampled span / tokens) and for all of them."""
    import numpy as np

    times = np.array([s["timestamp"] for s in samples], dtype=float)
    active = sorted(gpus)
    utilisation = np.array([[s["gpu_utilizations"][g] for g in active] for s in samples], dtype=float)
    power = np.array([[s["gpu_powers"][g] for g in active] for s in samples], dtype=float) \
        if all("gpu_powers" in s for s in samples) else None
    data = {"times": times - times[0] if len(times) else times, "active": active, "utilisation": utilisation,
            "mean_utilisation": float(utilisation.mean()), "mean_power_w": None, "energy_j_per_token": None,
            "system_energy_j_per_token": None}
    if power is not None and len(times) > 1 and tokens:
        mean_power = power.mean(axis=1)
        energy = float(np.sum((mean_power[1:] + mean_power[:-1]) / 2 * np.diff(times)))
        data.update(mean_power_w=float(power.mean()), energy_j_per_token=energy / tokens,
                    system_energy_j_per_token=energy * len(active) / tokens)
    return data


GPU_METRICS = (("mean_utilisation", "utilisation per GPU (%)"), ("mean_power_w", "power per GPU (W)"),
               ("energy_j_per_token", "energy/token per GPU (J)"))


def fig5(logs: Logs) -> Drawn:
    deepest = max((len(log.model_paths) for log in logs.largest), default=0)
    chosen = [log for log in logs.largest if log.strategy == "greedy"]
    chosen += [log for log in logs.speculative if len(log.model_paths) == deepest]
    panels, rows, bars = [], [], {key: [] for key, _ in GPU_METRICS}
    for log in chosen:
        gpus = official.active_gpus(log)
        per_sample = [gpu_panel_data(official.gpu_samples(log, i), gpus, s.tokens_generated)
                      for i, s in enumerate(log.samples) if official.gpu_samples(log, i)]
        if not per_sample:
            continue
        first = per_sample[0]
        panels.append((f"{_short(log)}, sample 0", first, gpus))
        row = {"panel": _system(log), "active_gpus": " ".join(f"{g}:{gpus[g]}" for g in first["active"]),
               "mean_utilisation_percent_per_active_gpu": first["mean_utilisation"],
               "mean_power_w_per_active_gpu": first["mean_power_w"],
               "energy_j_per_token_per_active_gpu": first["energy_j_per_token"],
               "energy_j_per_token_all_active_gpus": first["system_energy_j_per_token"]}
        for key, _ in GPU_METRICS:
            value = mean_interval([[d[key]] for d in per_sample if d[key] is not None])
            row.update(interval_columns(f"{key}_all_samples", value))
            bars[key].append((_short(log).split(" ")[0], style.color(_strategy(log)), *value))
        rows.append({**row, "samples": len(per_sample), "source": log.path.name})
    if not panels:
        raise LookupError("the logs hold no gpustats")
    fig = draw.gpu_utilisation(panels, [(label, bars[key]) for key, label in GPU_METRICS])
    caption = ("NVML samples: left, each active GPU's utilisation over sample 0 of the greedy log and of the deepest "
               "SD and PipeSpec logs (GPUs a model was placed on, model_configs[].devices; idle GPUs excluded); right, "
               "per active GPU its mean utilisation, mean power and energy per token (integral of the mean "
               "active-GPU power over the sampled span / the sample's tokens), each the mean over the log's samples "
               "with its 95% interval.")
    return logs.drawn(fig, rows, f"greedy and deepest SD / PipeSpec logs of the {logs.target} target", caption)


def rho_alpha(logs: Logs) -> Drawn:
    points, rows = [], []
    for log in logs.logs:
        if log.strategy != "async-chain":
            continue
        measured = fit.measure_official(log)
        alpha = measured.alphas[-1]
        steps = len(official.step_times(log, len(log.model_paths) - 1))
        counts = official.accepted_counts(log, log.num_pairs - 1)
        rho = min(len(counts) / steps, 1.0) if steps else math.nan  # only verifications are logged
        label = f"PipeSpec logs ({logs.target if log in logs.largest else 'lookahead sweep'})"
        if math.isfinite(alpha):
            gamma = measured.accepted_per_verify[-1]
            points.append((alpha, None, None, rho, None, None, gamma, label))
            rows.append({"series": label, "alpha_lower_bound": alpha, "rho": rho, "gamma": gamma,
                         "source": log.path.name})
    if not points:
        raise LookupError("no async logs")
    fig = draw.rho_alpha([("", points)], "alpha (per-draft acceptance, lower bound)")
    caption = ("Eq. 3, rho = a / (1 - a^(g+1) + a), one line per gamma (colour bar), and the async logs: alpha is a "
               "lower bound estimated from the pooled accepted counts (the logs do not record drafts offered), "
               "rho = 1 because only verifications are logged, gamma = mean accepted drafts per verification (a "
               "lower bound of drafts offered). No intervals: each point is one pooled estimate, not a mean of samples.")
    return logs.drawn(fig, rows, "every async-chain (PipeSpec) log", caption)


def model_measured(logs: Logs) -> Drawn:
    by_file = {log.path.name: log for log in logs.logs}
    points, rows = [], []
    for r in evaluate.official_predictions(logs.directory):
        log = by_file[r.file]
        measured = 1000 / r.measured_ms
        low, high = scaled_interval(measured, _per_sample(log, lambda s: s.tokens_generated / s.total_time))
        ours, paper_value = 1000 / r.ours_ms, None if r.paper_ms is None else 1000 / r.paper_ms
        points.append((measured, low, high, ours, paper_value, style.color(r.strategy)))
        rows.append({"run": _system(log), "measured_tokens_per_s": measured, "measured_tokens_per_s_low": low,
                     "measured_tokens_per_s_high": high, "ours_in_sample_tokens_per_s": ours,
                     "ours_error": ours / measured - 1, "paper_model_tokens_per_s": paper_value,
                     "paper_error": None if paper_value is None else paper_value / measured - 1, "source": r.file})
    colors = [(names.STRATEGY_NAMES[s], style.color(s)) for s in ("greedy", "sd", "pipespec")]
    fig = draw.model_measured(points, colors)
    caption = ("Our wall-clock model (the simulator, analysis.evaluate, with each log's own mean step times and "
               f"acceptance: an {IN_SAMPLE}, not a held-out prediction) and the paper's model (Eq. 4 / 5 over the "
               "greedy log's step time) against the measured pooled throughput of each log of the "
               f"{logs.target} target; right, each model's error. Measured intervals: 95% over the log's samples "
               "(the relative interval of their geometric mean, applied to the pooled value).")
    return logs.drawn(fig, rows, f"logs with the {logs.target} target", caption)


def speedup_depth(logs: Logs) -> Drawn:
    greedy = next((log for log in logs.largest if log.strategy == "greedy"), None)
    if greedy is None:
        raise LookupError(f"no greedy log of {logs.target}")
    rows, by_strategy = [], defaultdict(list)
    for log in logs.speculative:
        found = logs.speedup(log)
        by_strategy[_strategy(log)].append((len(log.model_paths), found.speedup, *found.sampling_interval))
        rows.append({"series": _system(log), "depth": len(log.model_paths), **logs.speedup_columns(log),
                     "source": log.path.name})
    series = draw.depth_series(by_strategy)
    reference = (f"greedy ({logs.target})", 1.0, None, None)
    fig = draw.lines([draw.Panel("", series, "models in the hierarchy", "speedup over greedy (x)", reference)],
                     columns=1, row_height=2.4, legend_columns=1)
    fig.axes[0].set_xticks([1, 2, 3])
    caption = (f"Speedup of every SD and PipeSpec log of the {logs.target} target over its greedy log "
               f"({greedy.path.name}) against the number of models: geometric mean over the problems of the paired "
               "per-problem speedup (analysis.paired), with its 95% interval (problems resampled); the two k=2 "
               "hierarchies drawn side by side. Pooled speedups (Table 2) in the data table.")
    return logs.drawn(fig, rows, f"logs with the {logs.target} target", caption)


# each official figure, by name, from the logs
OFFICIAL_FIGURES: dict[str, Callable[[Logs], Drawn]] = {
    "fig3_accepted_histogram": fig3, "fig4_lookahead": fig4, "fig5_gpu_utilisation": fig5, "rho_alpha": rho_alpha,
    "model_measured": model_measured, "speedup_depth": speedup_depth,
}


def official_figures(logs: Sequence[official.OfficialLog], directory: Path) -> dict[str, Callable[[], Drawn]]:
    """Figure builders from the logs (each a thunk, so a failing one does not stop the others)."""
    directory = official.log_dir(directory)
    largest = official.largest_target_logs(logs)
    chosen = Logs(logs, directory, [f"{shown(directory)} (the authors' published HumanEval logs, 4x A100)"],
                  largest, names.stage_name(largest[0].target) if largest else "")
    return {name: partial(build, chosen) for name, build in OFFICIAL_FIGURES.items()}
