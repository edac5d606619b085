"""A pytest plugin: the CPU seconds the whole machine spent during each test (setup, call and teardown).

Run the suite in one process, so that what the machine spends during a test is that test's work, its
stage processes and subprocesses included, and nothing else is running:

    PYTHONPATH=scripts .venv/bin/python -m pytest -q -p no:xdist -p pytest_cpu_per_test

Each test's wall and CPU seconds go to `CPU_PER_TEST_OUT` (default `cpu_per_test.jsonl`, one JSON line a
test); the end of the run prints the modules that took the most CPU. The CPU is read from `/proc/stat`
(Linux), the busy time of every CPU together.
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SHOWN = 15  # modules in the end-of-run table
_rows: list[dict] = []


def busy_seconds() -> float:
    """The busy time of every CPU together since boot: all of /proc/stat's first line but idle and iowait."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICKS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = busy_seconds(), time.monotonic()
    yield
    row = {"id": item.nodeid, "wall_s": time.monotonic() - wall, "cpu_s": busy_seconds() - cpu}
    _rows.append(row)
    with open(os.environ.get("CPU_PER_TEST_OUT", "cpu_per_test.jsonl"), "a") as out:
        out.write(json.dumps(row) + "\n")


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for row in _rows:
        totals = modules[row["id"].split("::")[0]]
        totals[0] += row["cpu_s"]
        totals[1] += row["wall_s"]
    cpu, wall = sum(r["cpu_s"] for r in _rows), sum(r["wall_s"] for r in _rows)
    terminalreporter.section("CPU seconds per module")
    terminalreporter.write_line(f"{cpu:8.1f} CPU s {wall:8.1f} s  all {len(_rows)} tests")
    for name, (module_cpu, module_wall) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:SHOWN]:
        terminalreporter.write_line(f"{module_cpu:8.1f} CPU s {module_wall:8.1f} s  {name}")
