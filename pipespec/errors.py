"""The errors a user of pipespec catches: one home, no torch.

- `ConfigError`: an option is invalid; raised before any stage process starts,
  the message names the option and what is expected.
- `StageError`: a stage failed, died or stopped responding during a call; the
  pipeline has shut its processes down. Its fields say what happened without
  parsing the message: `stage` (index, or None when no stage can be blamed),
  `kind` (one of `FAILURE_KINDS`), `waited_for` (the stage a stalled stage
  waited for, when the failure is a stall) and `detail` (a traceback, if any).
"""

from __future__ import annotations

FAILURE_KINDS = ("raised", "died", "stalled", "lost_link", "no_answer", "start")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the option and what is expected."""


class StageError(RuntimeError):
    """A stage failed, died or stalled; the message names the stage and the cause."""

    def __init__(
        self,
        message: str,
        *,
        stage: int | None = None,
        kind: str = "raised",
        waited_for: int | None = None,
        detail: str | None = None,
    ):
        super().__init__(message)
        self.stage, self.kind, self.waited_for, self.detail = stage, kind, waited_for, detail
