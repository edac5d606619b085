"""The per-run report of run directories (Markdown and a self-contained HTML page; no torch).

    python -m analysis.report RUN_DIRS... --out DIR [--official DIR]

(`python -m analysis.report` hands run directories here; given paired validations, or nothing, it writes
the model-vs-measurement report of `analysis.report` instead.)

For every run (a run directory, or a directory holding runs) it sets side by
side: the measured tokens/s, our wall-clock model (``analysis.evaluate``: an
in-sample decomposition, since its costs are fitted on the very run it reports;
held-out predictions come from a machine profile: ``analysis.validate``) and the paper's model (Eq. 4 / 5 over one target
step), with their errors; each figure and number is marked as a measurement, an
in-sample fit or a held-out prediction; then per run the fitted per-stage costs and per-pair estimates
(alpha, rho, gamma, tokens per step) against the paper's Eq. 1 / 3 / 4. With
``--official`` it adds both models on the authors' published logs of the largest
target. ``DIR/report.md`` links the figures in ``DIR/figures/``;
``DIR/report.html`` embeds them as base64 PNG, so it is one file.

A directory that is not a run (or a corrupt file in one) stops the report with
a one-line error naming it, and exit status 2.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from analysis import evaluate, figures
from analysis import import_official as official
from analysis.runs import ResultsError, find_runs
from pipespec.stats import ratio

TOLERANCE = 0.15  # the error our model is held to


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        lines = ["| " + " | ".join(h.replace("|", "/") for h in self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in self.rows]
        return "\n".join(lines)

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _num(value: float | None, spec: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{100 * value:+.1f}%"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None or not math.isfinite(seconds) else f"{1000 * seconds:.1f}"


# --------------------------------------------------------------------------- content


def summary_table(evaluations: Sequence[evaluate.RunEvaluation]) -> Table:
    rows = []
    for e in evaluations:
        run = e.run
        rows.append([
            run.label, str(run.depth if run.strategy != "greedy" else 1), run.dataset,
            str(e.measurement.samples), str(e.measurement.tokens),
            _num(e.measured_tokens_per_s), _num(e.ours.tokens_per_s), _pct(e.ours_error),
            _num(e.paper_tokens_per_s), _pct(e.paper_error), e.paper_t1_source,
            "exact" if run.lossless else f"{figures.SYNTHETIC_LABEL}, rate {run.synthetic_rate}",
        ])
    return Table(["run", "stages", "dataset", "samples", "tokens", "measured tok/s", "ours tok/s (in-sample)",
                  "ours error", "paper tok/s (in-sample)", "paper error", "paper t_K(1) from", "acceptance"], rows)


def stage_table(evaluation: evaluate.RunEvaluation) -> Table:
    rows = []
    predicted_busy = evaluation.ours.busy_fraction
    for i, stage in enumerate(evaluation.measurement.stages):
        cost = stage.cost
        busy = predicted_busy[i] if i < len(predicted_busy) and evaluation.run.strategy != "greedy" else None
        rows.append([
            stage.name, stage.kind, str(stage.steps),
            _ms(cost.fixed) if cost else "-", _ms(cost.per_token) if cost else "-",
            _num(cost.contention) if cost else "-", f"{cost.min_fed}-{cost.max_fed}" if cost else "-",
            _ms(stage.step_overhead_s), _ms(stage.prefill_s_per_token),
            _num(stage.busy_fraction), _num(busy),
        ])
    return Table(["stage", "kind", "steps", "a ms", "b ms/token", "contention", "fed range", "overhead ms",
                  "prefill ms/token", "busy measured", "busy (in-sample model)"], rows)


def pair_table(evaluation: evaluate.RunEvaluation) -> Table:
    rows = []
    for pair in evaluation.measurement.pairs:
        alpha = pair.alpha
        rows.append([
            f"{pair.drafter} -> {pair.verifier}",
            "-" if alpha is None else f"{alpha.alpha:.3f} +- {_num(alpha.stderr, '.3f')}",
            f"{_num(pair.alpha_first, '.3f')} / {_num(pair.alpha_next, '.3f')}",
            str(pair.verify_steps), str(pair.single_steps), _num(pair.rho), _num(pair.gamma),
            _num(pair.accepted_per_verify + 1), _num(ratio(sum(pair.accepted_counts), sum(pair.offered_counts))),
            _num(pair.tokens_per_step),
        ])
    return Table(["pair", "alpha (MLE +- se)", "alpha first / next", "verifications", "one-token steps", "rho",
                  "gamma (offered/verify)", "mean acceptance length", "draft acceptance rate", "tokens/step"], rows)


def comparison_table(evaluation: evaluate.RunEvaluation) -> Table:
    rows = [[c.quantity, c.scope, _num(c.predicted, ".3f"), _num(c.measured, ".3f"), _num(c.residual, "+.3f"),
             _pct(c.relative_error)] for c in evaluation.comparisons]
    ours = evaluation.ours
    if evaluation.run.strategy != "greedy":
        rows.append(["tokens/step (ours, simulated)", "target", _num(ours.tokens_per_target_step, ".3f"),
                     _num(evaluation.measurement.target_tokens_per_step, ".3f"),
                     _num(ours.tokens_per_target_step - evaluation.measurement.target_tokens_per_step, "+.3f"),
                     _pct(ours.tokens_per_target_step / evaluation.measurement.target_tokens_per_step - 1)])
    rows.append(["tokens/s (ours, in-sample)", "run", _num(ours.tokens_per_s, ".3f"),
                 _num(evaluation.measured_tokens_per_s, ".3f"),
                 _num(ours.tokens_per_s - evaluation.measured_tokens_per_s, "+.3f"), _pct(evaluation.ours_error)])
    return Table(["quantity", "scope", "model (in-sample)", "measured", "residual", "relative"], rows)


def official_table(rows: Sequence[evaluate.OfficialPrediction]) -> Table:
    return Table(
        ["log", "strategy", "models", "measured ms/token", "ours ms/token (in-sample)", "ours error",
         "paper ms/token (in-sample)",
         "paper error", "alpha used", "lookahead"],
        [[r.file, r.strategy, ",".join(r.models), _num(r.measured_ms), _num(r.ours_ms), _pct(r.ours_error),
          _num(r.paper_ms), _pct(r.paper_error), "/".join(f"{a:.3f}" for a in r.alphas) + f" ({r.alpha_source})",
          str(r.lookahead)] for r in rows],
    )


# what each figure shows: a measurement, an in-sample fit or a held-out prediction (none here: see analysis.validate)
FIGURE_KINDS = {
    "fig3_accepted_histogram": "measurement",
    "fig4_lookahead": "measurement",
    "fig5_timeline": "measurement",
    "rho_alpha": "measurement (rho, gamma) and in-sample fit (alpha, MLE) against Eq. 3",
    "model_measured": "in-sample decomposition against measurement (no held-out prediction)",
    "speedup_depth": "measurement",
    "synthetic_acceptance": f"measurement, {figures.SYNTHETIC_LABEL}",
}


def figure_kind(name: str) -> str:
    return next((kind for prefix, kind in FIGURE_KINDS.items() if name.startswith(prefix)), "measurement")


def status_table(evaluation: evaluate.RunEvaluation) -> Table:
    """What each number of a run is: a measurement, an in-sample fit (or decomposition) or a held-out
    prediction (the last: none in this report; `analysis.validate` predicts runs from a profile)."""
    run = evaluation.run
    acceptance = "exact (lossless)" if run.lossless else f"{figures.SYNTHETIC_LABEL}, set rate {run.synthetic_rate}"
    rows = [
        ["measured tok/s, ms/token, busy measured, steps, verifications, one-token steps, rho, gamma, "
         "mean acceptance length, draft acceptance rate, tokens/step", "measurement", f"this run's summary and traces ({acceptance})"],
        ["a, b, contention, overhead, prefill per token; alpha (MLE +- se), alpha first / next",
         "in-sample fit", "fitted on this run's own traces"],
        ["ours tok/s, busy (in-sample model), tokens/step (ours, simulated), start-up",
         "in-sample decomposition", "analysis.evaluate with the costs and acceptance fitted on this run"],
        ["paper tok/s, Eq. 1 / 3 / 4 / 5 values", "in-sample (paper model)",
         f"paper's equations with this run's alpha and gamma; t_K(1) from {evaluation.paper_t1_source}"],
        ["held-out prediction", "none", "not in this report: python -m analysis.validate PROFILE RUN_DIRS"],
    ]
    return Table(["numbers", "kind", "from"], rows)


ASSUMPTIONS = [
    "Measured: tokens/s pooled over samples (sum of tokens / sum of generation time), as summary.json.",
    "Ours (analysis.evaluate), an in-sample decomposition, not a prediction: the discrete-event simulator played with each stage's fitted step cost "
    "t(n) = a + b n plus its per-step overhead, CPU contention as processor sharing (slowdown 1 + s per other "
    "stage computing), each pair's acceptance in runs (first draft alpha_first, later ones alpha_next), the "
    "run's lookahead and max_lead, the measured handoff latency per message hop (rollback delay; 2(k-1) hops "
    "per sd round), the prefill of the stages on the critical path and the per-call dispatch time. "
    "Prompt lookup is a drafter whose proposals cost ~0 and take no core, with a proposal after each commit "
    "with its measured supply probability.",
    "Paper: tokens per target step from Eq. 4 (pipespec; alpha and gamma of the last pair, gamma = measured mean "
    "drafts offered) or Eq. 5 (sd; c = t_K(1) / t_{K-1}(1)), divided by one target step t_K(1); greedy = 1 / t_K(1). "
    "It has no verification cost, no drafter supply limit, no rollback delay and no prefill.",
    "Costs are fitted from each run's own traces (contention on the 2-core machine is folded in), so both models "
    "see the same costs; neither is given the measured time.",
]


# --------------------------------------------------------------------------- assembly


TITLE = "pipespec: model vs measurement"
LISTED = ("What is compared", "Figures not drawn")  # the sections whose paragraphs are list items
PAGE_STYLE = ("<style>body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;"
              "margin:8px 0;font-size:13px}td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"
              "td:first-child,th:first-child{text-align:left}img{max-width:100%}</style>")


def _official_rows(official_dir: Path | None) -> list[evaluate.OfficialPrediction] | None:
    """Both models on the published logs in ``official_dir`` (None without it); unreadable logs: ResultsError."""
    if official_dir is None:
        return None
    try:
        return evaluate.official_predictions(official_dir)
    except official.OfficialLogError as error:
        raise ResultsError(f"{official_dir}: {error}") from None


def _draw_figures(runs, evaluations, figure_dir: Path) -> tuple[list[tuple[str, str, bytes]], list[str]]:
    """Our figures of the runs as PNG files in ``figure_dir``: (name, caption, png) of each one drawn, and a
    note for each one not drawn."""
    images: list[tuple[str, str, bytes]] = []
    notes: list[str] = []
    builders = {**figures.ours_figures(runs, evaluations), **figures.synthetic_figures(runs)}
    for name, drawn, reason in figures.drawn_figures(builders):
        if drawn is None:
            notes.append(f"{name}: skipped ({reason})")
            continue
        data = figures.png_bytes(drawn.fig)
        (figure_dir / f"{name}.png").write_bytes(data)
        images.append((name, f"{name.replace('_', ' ')} [{figure_kind(name)}]: {drawn.caption} "
                             f"Runs: {drawn.selection}.", data))
    return images, notes


def _headline(evaluations: Sequence[evaluate.RunEvaluation]) -> str:
    """Both models' largest and mean |error| over the runs, and how many runs ours holds within TOLERANCE."""
    errors = [abs(e.ours_error) for e in evaluations]
    paper_errors = [abs(e.paper_error) for e in evaluations if e.paper_error is not None]
    within = sum(err <= TOLERANCE for err in errors)
    return (
        f"Our model: largest |error| {100 * max(errors):.1f}%, mean {100 * sum(errors) / len(errors):.1f}%, "
        f"{within}/{len(errors)} runs within {100 * TOLERANCE:.0f}%. "
        + (f"Paper model: largest |error| {100 * max(paper_errors):.1f}%, mean "
           f"{100 * sum(paper_errors) / len(paper_errors):.1f}%." if paper_errors else "Paper model: no value.")
    )


def _run_blocks(e: evaluate.RunEvaluation) -> list:
    """A run's section: where it is and its settings, then its stage, status, pair and comparison tables."""
    blocks: list = [f"Directory: {e.run.path}. Lookahead {e.run.lookahead}, max_lead {e.run.max_lead}; "
                    f"handoff latency {_ms(e.measurement.handoff_s)} ms, dispatch {_ms(e.measurement.dispatch_s)} "
                    f"ms per sample; modelled start-up {e.ours.startup_s:.2f} s of {e.ours.seconds:.2f} s.",
                    stage_table(e), status_table(e)]
    if e.measurement.pairs:
        blocks.append(pair_table(e))
    blocks.append(comparison_table(e))
    return blocks


def _sections(evaluations: Sequence[evaluate.RunEvaluation], official_rows,
              notes: list[str]) -> list[tuple[str, list]]:
    """The report's sections before its figures: (heading, blocks), a block being a paragraph or a Table."""
    sections: list[tuple[str, list]] = [("Summary", [_headline(evaluations), summary_table(evaluations)]),
                                        ("What is compared", ASSUMPTIONS)]
    sections += [(f"Run: {e.run.label}", _run_blocks(e)) for e in evaluations]
    if official_rows is not None:
        sections.append(("Published logs (largest target)", [
            "Our simulator with the logs' mean step times; sd replays the logged accepted counts, pipespec uses "
            "alphas calibrated so the simulated mean accepted per verification equals the logged one (the logs do "
            "not record how many drafts were offered). Paper: Eq. 4 / 5 over the greedy log's step time.",
            official_table(official_rows)]))
    if notes:
        sections.append(("Figures not drawn", notes))
    return sections


def _intro(runs) -> str:
    """The paragraph under the title: what made the report, from how many runs on which machine."""
    env = runs[0].env
    machine = f"{env.get('cpu', '?')}, {env.get('cpu_count', '?')} CPUs" if env else "unknown machine"
    return (f"Made by python -m analysis.report from {len(runs)} runs ({machine}). Every number below is a "
            "measurement or an in-sample fit / decomposition of the run it describes; held-out predictions "
            "(from a machine profile measured on other prompts) are made by python -m analysis.validate.")


def _markdown_text(intro: str, sections: list[tuple[str, list]], images: list[tuple[str, str, bytes]]) -> str:
    """The report as Markdown, linking each figure in ``figures/``."""
    md = [f"# {TITLE}", "", intro, ""]
    for heading, blocks in sections:
        md += [f"## {heading}", ""]
        for block in blocks:
            if isinstance(block, Table):
                md += [block.markdown(), ""]
            else:
                md += [f"- {block}" if heading in LISTED else block, ""]
    md += ["## Figures", ""]
    for name, caption, _ in images:
        md += [f"![{caption}](figures/{name}.png)", ""]
    return "\n".join(md)


def _html_page(intro: str, sections: list[tuple[str, list]], images: list[tuple[str, str, bytes]]) -> str:
    """The report as one self-contained HTML page, each figure embedded as base64 PNG."""
    page = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(TITLE)}</title>",
            f"{PAGE_STYLE}</head><body>", f"<h1>{html.escape(TITLE)}</h1><p>{html.escape(intro)}</p>"]
    for heading, blocks in sections:
        page.append(f"<h2>{html.escape(heading)}</h2>")
        page += [block.html() if isinstance(block, Table) else f"<p>{html.escape(block)}</p>" for block in blocks]
    page.append("<h2>Figures</h2>")
    for name, caption, data in images:
        encoded = base64.b64encode(data).decode("ascii")
        page.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{encoded}'>"
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    page.append("</body></html>")
    return "\n".join(page)


def build_report(run_paths: Sequence[str | Path], out: Path, official_dir: Path | None = None) -> tuple[Path, Path]:
    """Write DIR/report.md, DIR/report.html and DIR/figures/*.png; raise ResultsError on bad input."""
    runs = find_runs(run_paths)
    evaluations = evaluate.evaluate_runs(runs)
    official_rows = _official_rows(official_dir)
    out.mkdir(parents=True, exist_ok=True)
    figure_dir = out / "figures"
    figure_dir.mkdir(exist_ok=True)
    images, notes = _draw_figures(runs, evaluations, figure_dir)
    sections = _sections(evaluations, official_rows, notes)
    intro = _intro(runs)
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(_markdown_text(intro, sections, images))
    html_path.write_text(_html_page(intro, sections, images))
    return md_path, html_path
