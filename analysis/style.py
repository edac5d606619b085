"""One figure style for every figure and report: paper sizes, fonts, a colour-blind-safe palette, 300 dpi PNG and
vector PDF, no titles, footers or paths inside the image (captions live in `paper_figures/README.md`).

    with style.paper():
        fig, ax = style.figure("one")        # one column: 3.3 in wide; "two": 7.0 in
        ax.errorbar(x, y, yerr=style.yerr(y, low, high), color=style.color("pipespec"), **style.ERRORBAR)
        style.save(fig, out / "fig4_lookahead_ours")   # -> .png (300 dpi) and .pdf, metadata without dates
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

ONE_COLUMN = 3.3  # inches
TWO_COLUMN = 7.0
MAX_WIDTH = 7.2
DPI = 300
# Okabe & Ito's colour-blind-safe palette
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
STRATEGY_COLORS = {"greedy": "#555555", "sd": "#0072B2", "chain": "#0072B2", "pipespec": "#E69F00",
                   "async-chain": "#E69F00", "auto": "#009E73"}
KIND_COLORS = {"draft": "#009E73", "verify": "#E69F00", "single": "#0072B2"}
MARKERS = "osD^vP*X"
ERRORBAR = {"capsize": 2.0, "elinewidth": 0.8, "capthick": 0.8, "markersize": 3.5, "linewidth": 1.0}
RC = {
    "figure.dpi": 100, "savefig.dpi": DPI, "font.family": "DejaVu Sans", "font.size": 8,
    "axes.titlesize": 8, "axes.labelsize": 8, "legend.fontsize": 8, "xtick.labelsize": 8,
    "ytick.labelsize": 8, "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5,
    "axes.linewidth": 0.6, "lines.linewidth": 1.0, "lines.markersize": 3.5, "legend.frameon": False,
    "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "pipespec",
    "pdf.compression": 6, "pdf.fonttype": 42, "path.simplify": True, "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02, "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
}
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}
WIDTHS = {"one": ONE_COLUMN, "two": TWO_COLUMN}


@contextlib.contextmanager
def paper() -> Iterator[None]:
    """The style, fixed so that the files do not depend on a user's matplotlibrc."""
    with plt.rc_context(RC):
        yield


def figure(width: str | float = "one", height: float | None = None, nrows: int = 1, ncols: int = 1, **kwargs):
    """A figure of a paper's column width ("one", "two" or inches, at most 7.2) and its axes."""
    inches = WIDTHS.get(width, width) if isinstance(width, str) else float(width)
    if inches > MAX_WIDTH:
        raise ValueError(f"figure width {inches} in is wider than a page's text ({MAX_WIDTH} in)")
    height = height if height is not None else inches * (0.72 if inches <= ONE_COLUMN else 0.36) * nrows
    return plt.subplots(nrows, ncols, figsize=(inches, height), **kwargs)


def color(strategy: str, index: int = 0) -> str:
    return STRATEGY_COLORS.get(strategy, PALETTE[index % len(PALETTE)])


def yerr(values: Sequence[float], low: Sequence[float | None], high: Sequence[float | None]) -> list[list[float]]:
    """Asymmetric error bars from interval bounds (a missing bound draws none)."""
    below = [v - lo if lo is not None else 0.0 for v, lo in zip(values, low)]
    above = [hi - v if hi is not None else 0.0 for v, hi in zip(values, high)]
    return [below, above]


def save(fig, stem: str | Path) -> list[Path]:
    """``stem``.png at 300 dpi and ``stem``.pdf, with no dates or versions in their metadata; closes the figure."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    fig.savefig(paths[0], dpi=DPI, metadata=PNG_METADATA)
    fig.savefig(paths[1], metadata=PDF_METADATA)
    plt.close(fig)
    return paths
