"""Soak: many consecutive generations on one pipeline, checked for hangs, memory growth and identity.

    python -m experiments.soak [--generations 200] [--models tiny_k3] [--max-new-tokens 24] [--bound-mb 50]

Cycles greedy, sd and pipespec over a few prompts and lookaheads on one pipeline
(one set of stage processes for the whole soak). Every output must equal the
greedy output of the same prompt; every call has a timeout (a hang fails the
soak with the stalled stage named). Resident memory of the driver and of each
stage process is sampled after a warm-up of 10 generations and at the end; the
growth of each must stay under --bound-mb. Prints one line per 50 generations
and a final report; exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from experiments.hierarchies import load_hierarchy
from experiments.hub import default_offline
from experiments.tiny import random_prompts
from pipespec.errors import ConfigError, StageError

# psutil and pipespec.api (torch) are imported where used: importing this module stays cheap for
# `experiments.reliability` and the tests.

WARMUP = 10


def rss_mb(pids: list[int]) -> list[float]:
    import psutil

    return [psutil.Process(pid).memory_info().rss / 2**20 for pid in pids]


def soak(models: str, generations: int, max_new_tokens: int, bound_mb: float, timeout_s: float) -> dict:
    from pipespec.api import Pipeline

    prompts = random_prompts(8, length=16, seed=3)
    plan = [("greedy", 0), ("sd", 2), ("sd", 4), ("pipespec", 0), ("pipespec", 2)]
    failures: list[str] = []
    started = time.monotonic()
    with Pipeline(load_hierarchy(models), stall_timeout_s=timeout_s) as pipe:
        pids = [os.getpid()] + pipe.pids
        names = ["driver"] + pipe.names
        greedy = [pipe.generate(p, max_new_tokens, strategy="greedy", timeout_s=timeout_s).tokens for p in prompts]
        baseline = None
        for n in range(1, generations + 1):
            strategy, lookahead = plan[n % len(plan)]
            prompt = n % len(prompts)
            result = pipe.generate(prompts[prompt], max_new_tokens, strategy=strategy, lookahead=lookahead, timeout_s=timeout_s)
            if result.tokens != greedy[prompt]:
                failures.append(f"generation {n} ({strategy}, lookahead {lookahead}) differs from greedy")
            if n == WARMUP:
                baseline = rss_mb(pids)
            if n % 50 == 0:
                print(f"{n:>5} generations, {time.monotonic() - started:6.1f} s, RSS MB "
                      + ", ".join(f"{name} {mb:.0f}" for name, mb in zip(names, rss_mb(pids))), flush=True)  # fmt: skip
        final = rss_mb(pids)
    growth = [f - b for f, b in zip(final, baseline or final)]
    for name, mb in zip(names, growth):
        if mb > bound_mb:
            failures.append(f"{name} grew by {mb:.1f} MB (bound {bound_mb} MB)")
    return {
        "generations": generations,
        "seconds": time.monotonic() - started,
        "growth_mb": dict(zip(names, growth)),
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    default_offline()  # offline unless the user set HF_HUB_OFFLINE & co. or the run names a hub id
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=200)
    parser.add_argument("--models", default="tiny_k3", help="a hierarchy in conf/models/")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--bound-mb", type=float, default=50.0, help="allowed RSS growth per process")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per-call and stall timeout")
    args = parser.parse_args(argv)
    try:
        report = soak(args.models, args.generations, args.max_new_tokens, args.bound_mb, args.timeout_s)
    except (ConfigError, StageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    growth = ", ".join(f"{name} {mb:+.1f}" for name, mb in report["growth_mb"].items())
    print(f"soak: {report['generations']} generations on {args.models} in {report['seconds']:.0f} s; "
          f"RSS growth after {WARMUP} warm-up generations (MB): {growth}; bound {args.bound_mb} MB")  # fmt: skip
    for failure in report["failures"]:
        print(f"FAILED: {failure}")
    print("soak passed: no hang, outputs identical to greedy, memory within bound" if not report["failures"] else "")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
