"""The one error of the results store: `ResultsError`, raised by every reader of a run directory and of its
packed traces (`analysis.rundir.store`, `analysis.rundir.packed`), one line naming the file or directory."""


class ResultsError(ValueError):
    """A results directory is missing, corrupt, foreign or inconsistent; the message names it."""
