"""The alternating timer: systems take turns per prompt (A B C A B C ...) within every repetition,
with the resident memory of whichever system is running sampled alongside."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence


class PeakRSS:
    """Samples the RSS of the processes of the system now running; keeps the maximum per (system, pid)."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.peaks: dict[tuple[str, int], int] = {}
        self._current: tuple[str, list[tuple[str, int]]] | None = None
        self._procs: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-rss")

    def start(self) -> "PeakRSS":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)

    def set_current(self, system: str | None, processes: list[tuple[str, int]] | None = None) -> None:
        with self._lock:
            self._current = (system, list(processes or [])) if system else None
        self._sample()

    def _sample(self) -> None:
        import psutil

        with self._lock:
            current = self._current
        if current is None:
            return
        system, processes = current
        for _, pid in processes:
            try:
                proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
                rss = proc.memory_info().rss
            except (psutil.Error, OSError):
                continue
            key = (system, pid)
            if rss > self.peaks.get(key, 0):
                self.peaks[key] = rss

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def report(self, system: str, processes: list[tuple[str, int]]) -> list[dict[str, Any]]:
        return [
            {"stage": label, "pid": pid, "peak_rss_mb": round(self.peaks.get((system, pid), 0) / 2**20, 1)}
            for label, pid in processes
        ]


def lifetime_peak_rss_mb(pid: int) -> float | None:
    """VmHWM: the process's peak resident set over its whole life (Linux), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def prepass(label: str, candidates: list, run_one: Callable, prompts: list[list[int]], max_new: int) -> tuple[int, list]:
    """Time the candidates interleaved on the pre-pass prompts: at every prompt each candidate runs in turn
    (`analysis.paired.rotation`: another order at each prompt); `run_one(candidate, prompt, max_new)` starts
    every call with a suffix stage's earlier outputs forgotten, so no candidate drafts another's (identical)
    output of the prompt. Returns (index of the fastest, [tokens/s per candidate])."""
    from analysis.paired import rotation

    tokens, seconds = [0.0] * len(candidates), [0.0] * len(candidates)
    for index, prompt in enumerate(prompts):
        for i in rotation(list(range(len(candidates))), index, 0):
            result = run_one(candidates[i], prompt, max_new)
            tokens[i] += len(result.tokens)
            seconds[i] += result.time_s
    rates = [t / s if s > 0 else 0.0 for t, s in zip(tokens, seconds)]
    for candidate, rate in zip(candidates, rates):
        print(f"[bench] pre-pass {label} {candidate}: {rate:.1f} tok/s", file=sys.stderr, flush=True)
    best = max(range(len(candidates)), key=lambda i: (rates[i], -i))
    return best, rates


def alternate(systems: Sequence, prompts: list[list[int]], repetitions: int, max_new: int, rss: PeakRSS,
              progress: bool = True) -> None:  # fmt: skip
    """The timed repetitions: every prompt runs on every system in turn; results go to `system.runs`."""
    from tqdm import tqdm

    bar = tqdm(total=repetitions * len(prompts) * len(systems), desc="bench", unit="run", file=sys.stderr,
               disable=not progress)  # fmt: skip
    for rep in range(repetitions):
        for system in systems:  # no output of a prompt may be drafted back when the prompt comes again
            system.forget_next = True
        for index, prompt in enumerate(prompts):
            for system in systems:
                bar.set_postfix_str(f"rep {rep + 1} {system.name}", refresh=False)
                rss.set_current(system.name, system.processes())
                result = system.run(prompt, max_new)
                rss.set_current(None)
                system.runs.append((rep, index, result))
                bar.update(1)
    bar.close()
