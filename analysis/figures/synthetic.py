"""The figure made for synthetic-acceptance runs (drafts accepted at a set rate: not lossless), one per hierarchy
and run set, greedy decoding; never mixed into the exact runs' figures."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

from analysis import names, style
from analysis.figures import draw
from analysis.figures.common import SYNTHETIC_LABEL, Drawn, interval_columns, mean_interval, shown
from analysis.figures.ours import run_sources
from analysis.figures.samples import RunData, machine, system
from analysis.runs import Run, describe_run_set, greedy_reference, run_set_key, select_runs


def _build(hierarchy: str, key: tuple, members: list[Run], runs: Sequence[Run]) -> Drawn:
    ar = greedy_reference(members[0], runs)
    data = RunData(members + ([ar] if ar is not None else []))
    times, rates, rows = defaultdict(list), defaultdict(list), []
    for run in members:
        stats = data.stats(run)
        ms = mean_interval(stats.per_prompt(lambda s: s.ms_per_token))
        rate = mean_interval(stats.per_prompt(lambda s: s.draft_acceptance_rate))
        times[run.strategy].append((run.synthetic_rate, *ms))
        rates[run.strategy].append((run.synthetic_rate, *rate))
        rows.append({"series": system(run), "lookahead": run.lookahead, "set_acceptance_rate": run.synthetic_rate,
                     **interval_columns("ms_per_token", ms), **interval_columns("measured_draft_acceptance_rate", rate),
                     "prompts": stats.prompts, "source": shown(run.path)})
    reference = None
    if ar is not None:
        ms = mean_interval(data.stats(ar).per_prompt(lambda s: s.ms_per_token))
        reference = (f"{system(ar)}, exact", *ms)
        rows.append({"series": system(ar), "lookahead": "", "set_acceptance_rate": "",
                     **interval_columns("ms_per_token", ms), "prompts": data.stats(ar).prompts, "source": shown(ar.path)})
    order = sorted(times, key=lambda s: s != "sd")
    lookaheads = {s: "/".join(str(v) for v in sorted({r.lookahead for r in members if r.strategy == s})) for s in order}
    stages = members[0].stage_names

    def series(values):
        return [draw.Series(f"{names.system_name(s, stages)}, lookahead {lookaheads[s]}", style.color(s), values[s],
                            "o" if s == "sd" else "s") for s in order]

    identity = draw.Series("measured = set", "#000000", [(0.0, 0.0, None, None), (1.0, 1.0, None, None)], "", ":")
    panels = [draw.Panel("", series(times), "set acceptance rate (per draft)", "time per token (ms)", reference,
                         integer_x=False),
              draw.Panel("", series(rates) + [identity], "set acceptance rate (per draft)",
                         "target's draft acceptance rate", integer_x=False, limits=((0, 1.02), (0, 1.02)))]
    fig = draw.lines(panels, row_height=2.5)
    selection = f"{SYNTHETIC_LABEL}: {names.hierarchy_name(stages)}, {describe_run_set(key)}"
    caption = (f"Drafts accepted with a set probability, whatever they are ({SYNTHETIC_LABEL}: outputs differ from "
               "greedy decoding). Left: time per token against the set rate, dashed the exact greedy run of the same "
               "target, dataset and budget; right: the target's measured accepted / offered drafts, which counts "
               "drafts offered after a rejection too and so sits below the set rate. Means over prompts with their "
               "95% interval over prompts (one repetition each).")
    return Drawn(fig, rows, run_sources(members + ([ar] if ar is not None else [])), selection, caption, {},
                 machine(members))


def synthetic_figures(runs: Sequence[Run]) -> dict[str, Callable[[], Drawn]]:
    """The figure made for synthetic-acceptance runs (one per hierarchy and run set, greedy decoding)."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in select_runs(runs, lossless=False, sampled=False):
        groups[(run.hierarchy, run_set_key(run))].append(run)
    builders: dict[str, Callable[[], Drawn]] = {}
    for index, ((hierarchy, key), members) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
        name = "synthetic_acceptance" + ("" if len(groups) == 1 else f"_{index}")
        builders[name] = lambda hierarchy=hierarchy, key=key, members=members: _build(hierarchy, key, members, runs)
    return builders
