"""Test-only message faults: a stage drops or delays some of its outgoing control messages.

Carried in `Job.fault` like the other injected faults (`pipespec.stage`):

    {"stage": i, "action": "drop", "message": "commit", "nth": 2}
    {"stage": i, "action": "delay", "message": "drafts", "nth": 1, "delay_s": 0.5, "count": 3}

`message` is the kind of message ("drafts", "commit", "done", "trace", "result"),
`nth` the first one (1-based, counted per request) the fault applies to and
`count` how many in a row (default 1). A dropped message is never sent (as if
the link lost it); a delayed one is sent `delay_s` seconds late by the sending
stage itself, so the link stays in order, as on a slow TCP connection.
"""

from __future__ import annotations

import time
from typing import Any

MESSAGE_ACTIONS = ("drop", "delay")


class FaultyTransport:
    """Wraps a stage's transport for one request; everything but `send` passes through."""

    def __init__(self, transport, fault: dict):
        self.transport = transport
        self.action = fault["action"]
        self.kind = fault.get("message", "commit")
        self.first = int(fault.get("nth", 1))
        self.last = self.first + int(fault.get("count", 1)) - 1
        self.delay_s = float(fault.get("delay_s", 0.5))
        self.seen = 0  # messages of `kind` sent (or dropped) so far
        self.applied = 0  # messages the fault acted on

    def send(self, peer: int, message: Any) -> None:
        if message[0] == self.kind:
            self.seen += 1
            if self.first <= self.seen <= self.last:
                self.applied += 1
                if self.action == "drop":
                    return
                time.sleep(self.delay_s)
        self.transport.send(peer, message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def for_request(transport, fault: dict | None, index: int):
    """The transport stage `index` uses for one request: wrapped when a message fault targets it."""
    if fault and fault.get("stage") == index and fault.get("action") in MESSAGE_ACTIONS:
        return FaultyTransport(transport, fault)
    return transport
