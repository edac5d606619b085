"""Control messages between the driver and the stage processes, over torch.distributed (gloo).

Each message is a small picklable object, sent as one gloo tensor of FRAME bytes (its
length, then as much of its bytes as fit) and, only when it is longer, a second tensor
with the rest: most control messages take one gloo operation, not two (on tiny models,
where steps take about a millisecond, that cut a pipeline's wall time by a quarter).
A gloo `irecv` reports completion only after `wait()`, so one
receiver thread per peer blocks in `recv` and puts what arrives into an inbox
queue; the owner waits on that queue with a timeout and never spins.

The process group is created from its own store (not the global default
group), so a process may drive several pipelines one after another. The store
is a TCPStore that the driver serves (`serve_store`) or that a launcher's agent
already serves (torchrun: `client_store`); each pipeline start keeps its keys
under its own prefix (`new_start` on the driver, `join_start` on a stage): each start takes the
next number from a counter in the store and keeps its keys under `pipespec/<number>/`, so a
pipeline restarted on the same store meets afresh.
"""

from __future__ import annotations

import datetime
import pickle
import queue
import threading
import time
from typing import Any, Iterable

import torch
import torch.distributed as dist

from pipespec.protocol import LinkBroken  # put in the inbox when the link to a peer breaks

START_COUNTER = "pipespec/starts"  # the store's counter of pipeline starts
IDLE_LINK_TIMEOUT = datetime.timedelta(days=365)
FRAME = 1024  # bytes of the first tensor of every message: an 8-byte length, then the payload's start
HEADER = 8


class LinkLost(ConnectionError):
    """Sending to a peer failed: it died or closed its end."""

    kind = "lost_link"  # as pipespec.errors.FAILURE_KINDS name it

    def __init__(self, text: str, peer: int):
        super().__init__(text)
        self.waited_for = peer - 1 if peer > 0 else None  # the stage at the other end (None: the driver)


def start_prefix(start: int) -> str:
    """Where the keys of pipeline start number `start` live in the store."""
    return f"pipespec/{start}/"


def serve_store(host: str, port: int, timeout_s: float) -> dist.Store:
    """Bind HOST:PORT and serve a store there (the driver, when no launcher serves one)."""
    return dist.TCPStore(
        host, port, None, True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )


def client_store(host: str, port: int, timeout_s: float) -> dist.Store:
    """Connect to the store served at HOST:PORT (by the driver, or by torchrun's agent); retries until
    `timeout_s` while nobody serves it yet."""
    return dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=timeout_s))


def new_start(base: dist.Store) -> tuple[int, dist.Store]:
    """The driver's side of a pipeline start: the next start number, and the store under its prefix."""
    start = int(base.add(START_COUNTER, 1))
    return start, dist.PrefixStore(start_prefix(start), base)


def join_start(base: dist.Store, timeout_s: float, start: int | None = None) -> dist.Store:
    """A stage's side: the store of start `start`, or of the driver's latest start (waiting up to
    `timeout_s` for the driver to make one)."""
    if start is None:
        base.wait([START_COUNTER], datetime.timedelta(seconds=timeout_s))
        start = int(base.add(START_COUNTER, 0))
    return dist.PrefixStore(start_prefix(start), base)


def peer_name(rank: int) -> str:
    """Rank 0 is the driver, rank i + 1 serves stage i (`pipespec.protocol`)."""
    return "the driver (rank 0)" if rank == 0 else f"stage {rank - 1} (rank {rank})"


class GlooTransport:
    def __init__(self, rank: int, world_size: int, store: dist.Store, peers: Iterable[int]):
        """Join the gloo group of `world_size` ranks that meet in `store` (one pipeline start's store)."""
        self.rank = rank
        self.store = store
        # gloo's timeout also ends a receive that waits longer than it, and a link can rightly stay quiet
        # for the pipeline's whole life (nothing flows from the first stage to the target): it must not
        # expire. Dead peers still fail at once (closed sockets); hangs are caught by the stall timeouts.
        self.group = dist.ProcessGroupGloo(self.store, rank, world_size, IDLE_LINK_TIMEOUT)
        self.inbox: "queue.Queue[tuple[int, Any]]" = queue.Queue()
        self.closed = False
        self.bytes_sent = 0
        self.send_time_s = 0.0
        self.threads = [
            threading.Thread(target=self._receive_from, args=(peer,), daemon=True, name=f"recv-{peer}")
            for peer in peers
        ]
        for thread in self.threads:
            thread.start()

    def send(self, peer: int, message: Any) -> None:
        started = time.perf_counter()
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        frame = bytearray(FRAME)
        frame[:HEADER] = len(payload).to_bytes(HEADER, "little")
        head = payload[: FRAME - HEADER]
        frame[HEADER : HEADER + len(head)] = head
        try:
            self.group.send([torch.frombuffer(frame, dtype=torch.uint8)], peer, 0).wait()
            if len(payload) > len(head):
                rest = torch.frombuffer(bytearray(payload[len(head) :]), dtype=torch.uint8)
                self.group.send([rest], peer, 0).wait()
        except RuntimeError as error:  # gloo's message for a dead peer is long: keep its first line
            raise LinkLost(f"lost the link to {peer_name(peer)}: {str(error).splitlines()[0][:200]}", peer) from None
        self.bytes_sent += len(payload)
        self.send_time_s += time.perf_counter() - started

    def _receive_from(self, peer: int) -> None:
        try:
            while not self.closed:
                frame = torch.empty(FRAME, dtype=torch.uint8)
                self.group.recv([frame], peer, 0).wait()
                raw = frame.numpy().tobytes()
                length = int.from_bytes(raw[:HEADER], "little")
                payload = raw[HEADER : HEADER + length]
                if length > FRAME - HEADER:
                    rest = torch.empty(length - (FRAME - HEADER), dtype=torch.uint8)
                    self.group.recv([rest], peer, 0).wait()
                    payload += rest.numpy().tobytes()
                self.inbox.put((peer, pickle.loads(payload)))
        except Exception as error:  # the peer died or the group was torn down
            if not self.closed:
                self.inbox.put((peer, LinkBroken(str(error).splitlines()[0] if str(error) else repr(error))))

    def receive(self, timeout_s: float) -> tuple[int, Any] | None:
        """The next message as (sender rank, message), or None after `timeout_s` seconds."""
        try:
            return self.inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def receive_nowait(self) -> tuple[int, Any] | None:
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            return None

    def close(self, wait_s: float = 2.0) -> None:
        """Stop receiving. Once the peers are gone their receiver threads end; wait for them, so that
        no thread is inside gloo when the interpreter exits (that aborts the process)."""
        self.closed = True
        deadline = time.monotonic() + wait_s
        for thread in self.threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        if not any(thread.is_alive() for thread in self.threads):
            self.group = None  # destroy the group while no operation is pending
