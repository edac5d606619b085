"""Test-only fault injection: one hook object, `FaultPlan`, that production code never constructs.

Tests and the reliability command pass one to `Pipeline.generate(..., faults=FaultPlan(...))`;
it travels in the `Job` and the named stage consults it at three points of its loop:

- `after_step` / `on_buffer`: raise, exit, SIGKILL itself or hang, after its n-th step
  (`after_steps`) or the first time its buffer holds `at_token` tokens (steps or commits);
- `wrap`: drop or delay its outgoing messages of one kind ("drafts", "commit", "done",
  "trace", "result"): `nth` is the first one (1-based, per request) the fault applies to and
  `count` how many in a row. A dropped message is never sent (as if the link lost it); a
  delayed one is sent `delay_s` late by the stage itself, so the link stays in order;
- `checks_drafts`: action "accept_drafts" makes that verifier keep every draft unchecked
  (a wrong rule, for the statistical tests to catch).

    FaultPlan(stage=1, action="kill", at_token=5)
    FaultPlan(stage=0, action="drop", message="commit", nth=2)
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

STEP_ACTIONS = ("raise", "exit", "kill", "hang")
MESSAGE_ACTIONS = ("drop", "delay")
ACTIONS = STEP_ACTIONS + MESSAGE_ACTIONS + ("accept_drafts",)


@dataclass(frozen=True)
class FaultPlan:
    stage: int
    action: str = "raise"
    after_steps: int = 1
    at_token: int | None = None
    message: str = "commit"
    nth: int = 1
    count: int = 1
    delay_s: float = 0.5

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"fault action must be one of {ACTIONS}, got {self.action!r}")

    def checks_drafts(self, index: int) -> bool:
        return not (self.stage == index and self.action == "accept_drafts")

    @property
    def lossless(self) -> bool:
        return self.action != "accept_drafts"

    def wrap(self, transport, index: int):
        """The transport stage `index` uses for one request: wrapped when a message fault targets it."""
        if self.stage == index and self.action in MESSAGE_ACTIONS:
            return _FaultyTransport(transport, self)
        return transport

    def fires(self, index: int, steps: int | None, buffer_len: int, fired: bool) -> bool:
        """Whether a step fault fires now (`steps` None: checked after messages, not after a step)."""
        if self.stage != index or self.action not in STEP_ACTIONS:
            return False
        if self.at_token is not None:  # a point of the generation: the first time the buffer reaches it
            return not fired and buffer_len >= self.at_token
        return steps == self.after_steps

    def act(self, index: int, steps: int | None, buffer_len: int) -> None:
        if self.action == "raise":
            raise RuntimeError(f"injected fault in stage {index} after {steps} steps, at {buffer_len} tokens")
        if self.action == "exit":
            os._exit(17)
        if self.action == "kill":  # as the OOM killer would
            os.kill(os.getpid(), signal.SIGKILL)
        if self.action == "hang":
            time.sleep(10_000)


class _FaultyTransport:
    """Wraps a stage's transport for one request; everything but `send` passes through."""

    def __init__(self, transport, plan: FaultPlan):
        self.transport = transport
        self.plan = plan
        self.seen = 0  # messages of the kind sent (or dropped) so far

    def send(self, peer: int, message: Any) -> None:
        plan = self.plan
        if type(message).__name__.lower() == plan.message:
            self.seen += 1
            if plan.nth <= self.seen < plan.nth + plan.count:
                if plan.action == "drop":
                    return
                time.sleep(plan.delay_s)
        self.transport.send(peer, message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)
