"""The one t(n) sweep: seconds of a forward pass feeding n tokens after a context on a warm KV cache.

`interleaved_step_times` times several runners (or one runner under several conditions, switched by
`before(key)`) in alternating sweeps over the same step sizes, so that a slow spell of the machine
falls on all of them and on every n rather than on one. Machine profiles (`experiments.profiler`),
the kernel choice (`pipespec.kernels`) and the tools that compare kernels all measure t(n) with it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping, Sequence


def interleaved_step_times(runners: dict, context: Sequence[int] | Mapping[Any, Sequence[int]], max_fed: int,
                           repeats: int, before: Callable[[Any], None] | None = None, times: dict | None = None,
                           sizes: Sequence[int] | None = None,
                           clock: Callable[[], float] = time.perf_counter) -> dict:  # fmt: skip
    """The seconds of each timed sweep over the step sizes (n = 1..max_fed, or `sizes`) per runner, added to
    `times` ({key: per-size lists}, new when None) and returned. The runners' sweeps alternate (in turn,
    then in reverse order) so that drift of the machine falls on all of them; one untimed sweep each comes
    first. `before(key)` runs before each sweep of that key (e.g. the same runner under two conditions).
    `context`: the tokens every step follows, or one context per key (e.g. one runner at two context
    lengths: a runner whose cache holds another key's context reads its own first, untimed).
    `clock`: wall-clock seconds by default; `time.thread_time` counts this thread's CPU time only."""
    sizes = list(range(1, max_fed + 1)) if sizes is None else [int(n) for n in sizes]
    contexts = {key: list(context[key] if isinstance(context, Mapping) else context) for key in runners}
    times = {key: [[] for _ in sizes] for key in runners} if times is None else times
    holding: dict[int, Any] = {}  # per runner (by id), the key whose context its cache holds
    for key, runner in runners.items():
        _read(runner, contexts[key])  # the prompt in the cache, its last token fed again below
        holding[id(runner)] = key
    for sweep in range(repeats + 1):  # the first is a warm-up
        for key in list(runners) if sweep % 2 == 0 else list(reversed(runners)):
            runner, tokens = runners[key], contexts[key]
            if contexts[holding[id(runner)]] != tokens:
                _read(runner, tokens)
            holding[id(runner)] = key
            if before is not None:
                before(key)
            filler = [int(tokens[-1])] * max(sizes)
            for position, n in enumerate(sizes):
                runner.truncate(len(tokens) - 1)
                started = clock()
                runner.forward(tokens, filler[: n - 1])
                if sweep:
                    times[key][position].append(clock() - started)
    return times


def _read(runner, context: list[int]) -> None:
    runner.start()
    runner.forward(context, [])


def medians(per_n: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.median(t) for t in per_n]
