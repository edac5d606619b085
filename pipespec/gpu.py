"""GPU facts and monitoring: NVML in-process, else `nvidia-smi`, else nothing.

    sampler = stage_sampler(spec.devices)        # None on a CPU stage or a machine without NVIDIA GPUs
    ...
    trace.gpu = sampler.window(trace.start_time, trace.end_time)

A `GpuSampler` is a daemon thread that reads utilisation (%), memory used (MiB)
and power (W) of its GPUs every `interval_s` (100 ms), through NVML in this
process (`pynvml`, from the `nvidia-ml-py` package of the `gpu` extra, imported
lazily), else by running `nvidia-smi` once per sample, else not at all. Each
sample is timestamped on `time.perf_counter()`, the clock of the stage traces,
so a stage cuts out exactly the samples of one request (`window`) and ships
them with its trace. Energy is integrated from power (trapezoids, clipped to
the window). Everything from `energy_j` down is pure Python: `analysis.rundir`
pools the per-sample figures into summary.json without torch.

GPUs are named by their NVML (physical) index: a process that sees a subset
(`CUDA_VISIBLE_DEVICES`) maps its `cuda:N` to it with `physical_index`.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

INTERVAL_S = 0.1
MAX_SAMPLES = 200_000  # per GPU: 5.5 hours at 100 ms, a few MB; older samples are dropped
SMI_TIMEOUT_S = 5.0
SMI_QUERY = "index,utilization.gpu,memory.used,power.draw"
SERIES = ("t", "util", "mem_mib", "power_w")  # one list per field in a window's series


# ---- backends: one reading of every GPU asked for ------------------------------------


class NvmlBackend:
    """NVML through pynvml, in this process (microseconds per reading)."""

    name = "nvml"

    def __init__(self):
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        self.nvml = pynvml

    def count(self) -> int:
        return self.nvml.nvmlDeviceGetCount()

    def describe(self, index: int) -> dict[str, Any]:
        handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        return {"index": index, "name": _text(self.nvml.nvmlDeviceGetName(handle))}

    def driver_version(self) -> str:
        return _text(self.nvml.nvmlSystemGetDriverVersion())

    def read(self, indices: Sequence[int]) -> dict[int, tuple[float, float, float | None]]:
        out = {}
        for index in indices:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            util = self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            try:
                power = self.nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # mW
            except self.nvml.NVMLError:
                power = None  # some boards do not report power
            out[index] = (float(util), float(memory), power)
        return out

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


class SmiBackend:
    """`nvidia-smi --query-gpu` once per reading (tens of ms each): the fallback without pynvml."""

    name = "nvidia-smi"

    def _query(self, fields: str, indices: Sequence[int] | None = None) -> list[list[str]]:
        command = ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
        if indices is not None:
            command.append("--id=" + ",".join(str(i) for i in indices))
        out = subprocess.run(command, capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True).stdout
        return [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]

    def count(self) -> int:
        return len(self._query("index"))

    def describe(self, index: int) -> dict[str, Any]:
        rows = self._query("index,name", [index])
        return {"index": index, "name": rows[0][1] if rows else None}

    def driver_version(self) -> str | None:
        rows = self._query("driver_version")
        return rows[0][0] if rows else None

    def read(self, indices: Sequence[int]) -> dict[int, tuple[float, float, float | None]]:
        return {int(row[0]): (_number(row[1]), _number(row[2]), _number(row[3])) for row in self._query(SMI_QUERY, indices)}

    def close(self) -> None:
        pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def open_backend():
    """NVML if pynvml is installed and a driver answers, else nvidia-smi if on PATH, else None."""
    try:
        return NvmlBackend()
    except Exception:  # ImportError, or NVMLError: no driver / no GPU
        pass
    if shutil.which("nvidia-smi"):
        backend = SmiBackend()
        try:
            if backend.count() > 0:
                return backend
        except (OSError, subprocess.SubprocessError):
            pass
    return None


# ---- facts for env.json ------------------------------------------------------------------


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_facts() -> dict[str, Any]:
    """GPU names, CUDA (of the torch build), driver and bitsandbytes versions; None where absent."""
    import torch

    available = torch.cuda.is_available()
    backend = open_backend()
    try:
        driver = backend.driver_version() if backend is not None else None
    except Exception:
        driver = None
    finally:
        if backend is not None:
            backend.close()
    return {
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if available else [],
        "cuda": torch.version.cuda,
        "cuda_available": available,
        "driver": driver,
        "gpu_monitor": backend.name if backend is not None else None,
        "bitsandbytes": package_version("bitsandbytes"),
        "nvidia_ml_py": package_version("nvidia-ml-py"),
    }


def physical_index(cuda_index: int, visible: str | None = None) -> int:
    """The NVML index of this process's `cuda:N` (CUDA_VISIBLE_DEVICES renumbers the GPUs a process sees)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    listed = [part.strip() for part in (visible or "").split(",") if part.strip()]
    if listed and all(part.isdigit() for part in listed) and cuda_index < len(listed):
        return int(listed[cuda_index])
    return cuda_index  # unset, or UUIDs (not mapped: NVML order is then assumed)


def cuda_indices(devices: Iterable[str]) -> list[int]:
    """The CUDA indices among stage devices ("cuda" is cuda:0; cpu and auto have none)."""
    out = []
    for device in devices:
        kind, _, index = device.partition(":")
        if kind == "cuda":
            out.append(int(index or 0))
    return sorted(set(out))


# ---- sampling ----------------------------------------------------------------------------


class GpuSampler:
    """A thread reading `indices` (NVML indices) every `interval_s` into a bounded buffer per GPU."""

    def __init__(
        self,
        indices: Sequence[int],
        backend,
        interval_s: float = INTERVAL_S,
        sink: Callable[[int, float, tuple], None] | None = None,
        max_samples: int = MAX_SAMPLES,
    ):
        self.indices, self.backend, self.interval_s, self.sink = list(indices), backend, interval_s, sink
        self.names = {}
        for index in self.indices:
            try:
                self.names[index] = backend.describe(index)["name"]
            except Exception:
                self.names[index] = None
        self.samples = {index: deque(maxlen=max_samples) for index in self.indices}
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pipespec-gpu-sampler", daemon=True)

    def start(self) -> "GpuSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.interval_s + SMI_TIMEOUT_S + 1.0)
        self.backend.close()

    def __enter__(self) -> "GpuSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def sample_once(self) -> None:
        before = time.perf_counter()
        try:
            readings = self.backend.read(self.indices)
        except Exception:
            self.errors += 1  # a missed reading; the next one may succeed
            return
        t = (before + time.perf_counter()) / 2
        with self._lock:
            for index, values in readings.items():
                if index in self.samples:
                    self.samples[index].append((t, *values))
        if self.sink is not None:
            for index, values in readings.items():
                self.sink(index, t, values)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def window(self, t0: float, t1: float) -> list[dict[str, Any]]:
        """Per GPU, the samples in [t0, t1] plus one either side (so energy covers the window), column-wise."""
        with self._lock:
            snapshot = {index: list(rows) for index, rows in self.samples.items()}
        out = []
        for index, rows in snapshot.items():
            inside = [i for i, row in enumerate(rows) if t0 <= row[0] <= t1]
            before = [i for i, row in enumerate(rows) if row[0] < t0][-1:]
            after = [i for i, row in enumerate(rows) if row[0] > t1][:1]
            chosen = [rows[i] for i in before + inside + after]
            series = {field: [row[k] for row in chosen] for k, field in enumerate(SERIES)}
            out.append({"index": index, "name": self.names.get(index), "t0": t0, "t1": t1, **series})
        return out


def stage_sampler(devices: Iterable[str], interval_s: float = INTERVAL_S) -> GpuSampler | None:
    """A started sampler of the GPUs a stage runs on; None for a CPU stage or without NVML / nvidia-smi."""
    indices = [physical_index(i) for i in cuda_indices(devices)]
    if not indices:
        return None
    backend = open_backend()
    if backend is None:
        return None
    return GpuSampler(indices, backend, interval_s).start()


class GpuMonitor:
    """The whole run on the driver's machine: every GPU, every 100 ms, into a CSV file (t on perf_counter)."""

    HEADER = "t_perf_counter,index,utilization_pct,memory_used_mib,power_w\n"

    def __init__(self, path: Path, interval_s: float = INTERVAL_S):
        self.path, self.interval_s, self.sampler, self.handle = Path(path), interval_s, None, None

    def __enter__(self) -> "GpuMonitor":
        backend = open_backend()
        if backend is None:
            return self  # no GPU: nothing to record
        try:
            count = backend.count()
        except Exception:
            count = 0
        if count == 0:
            backend.close()
            return self
        self.handle = open(self.path, "w")
        self.handle.write(self.HEADER)
        self.sampler = GpuSampler(range(count), backend, self.interval_s, sink=self._write).start()
        return self

    def _write(self, index: int, t: float, values: tuple) -> None:
        fields = ["" if v is None else f"{v:.1f}" for v in values]
        self.handle.write(f"{t:.4f},{index}," + ",".join(fields) + "\n")

    def __exit__(self, *exc) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self.handle is not None:
            self.handle.close()


# ---- figures (pure Python) ------------------------------------------------------------------


def energy_j(t: Sequence[float], power: Sequence[float | None], t0: float, t1: float) -> float | None:
    """Integral of power over [t0, t1]: linear between samples, held flat beyond the first / last one."""
    points = [(a, p) for a, p in zip(t, power) if p is not None]
    if not points or t1 <= t0:
        return None if not points else 0.0

    def at(x: float) -> float:
        if x <= points[0][0]:
            return points[0][1]
        if x >= points[-1][0]:
            return points[-1][1]
        for (xa, pa), (xb, pb) in zip(points, points[1:]):
            if xa <= x <= xb:
                return pa + (pb - pa) * (x - xa) / (xb - xa) if xb > xa else pb
        return points[-1][1]

    knots = [t0] + [a for a, _ in points if t0 < a < t1] + [t1]
    return sum((b - a) * (at(a) + at(b)) / 2 for a, b in zip(knots, knots[1:]))


def summarize_series(series: Mapping[str, Any]) -> dict[str, Any]:
    """One GPU over one window: duration, mean utilisation, peak memory, mean power, energy."""
    t0, t1 = series["t0"], series["t1"]
    inside = [i for i, t in enumerate(series["t"]) if t0 <= t <= t1] or list(range(len(series["t"])))
    util = [series["util"][i] for i in inside if series["util"][i] is not None]
    memory = [m for m in series["mem_mib"] if m is not None]
    energy = energy_j(series["t"], series["power_w"], t0, t1)
    duration = t1 - t0
    return {
        "index": series["index"],
        "name": series.get("name"),
        "duration_s": duration,
        "samples": len(inside),
        "utilization_mean_pct": sum(util) / len(util) if util else None,
        "memory_peak_mib": max(memory) if memory else None,
        "power_mean_w": energy / duration if energy is not None and duration > 0 else None,
        "energy_j": energy,
    }


def sample_gpu_figures(stage_traces: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """Per GPU, one sample's figures from its stage traces' "gpu" series (None: no GPU was sampled).

    A GPU that several stages share is counted once: from the stage that sampled it longest."""
    best: dict[int, Mapping[str, Any]] = {}
    for trace in stage_traces:
        for series in trace.get("gpu") or []:
            current = best.get(series["index"])
            if current is None or series["t1"] - series["t0"] > current["t1"] - current["t0"]:
                best[series["index"]] = series
    if not best:
        return None
    return [summarize_series(best[index]) for index in sorted(best)]


def pool_gpu_figures(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """summary.json's per-GPU figures over the samples' records ("gpu" of each); None on CPU runs.

    Utilisation is time-weighted, memory the peak, power = energy / time, and energy per
    generated token = the GPU's energy over the tokens of the samples it was sampled in."""
    pooled: dict[int, dict[str, Any]] = {}
    for record in records:
        for figures in record.get("gpu") or []:
            row = pooled.setdefault(
                figures["index"],
                {"index": figures["index"], "name": figures.get("name"), "time_s": 0.0, "util_time": 0.0,
                 "util_s": 0.0, "memory_peak_mib": None, "energy_j": 0.0, "energy_s": 0.0, "tokens": 0},
            )  # fmt: skip
            duration = figures["duration_s"]
            row["time_s"] += duration
            row["tokens"] += record.get("new_tokens", 0)
            if figures["utilization_mean_pct"] is not None:
                row["util_time"] += figures["utilization_mean_pct"] * duration
                row["util_s"] += duration
            if figures["memory_peak_mib"] is not None:
                row["memory_peak_mib"] = max(row["memory_peak_mib"] or 0.0, figures["memory_peak_mib"])
            if figures["energy_j"] is not None:
                row["energy_j"] += figures["energy_j"]
                row["energy_s"] += duration
    if not pooled:
        return None
    out = []
    for index in sorted(pooled):
        row = pooled[index]
        has_energy = row["energy_s"] > 0
        out.append(
            {
                "index": index,
                "name": row["name"],
                "time_s": row["time_s"],
                "utilization_mean_pct": row["util_time"] / row["util_s"] if row["util_s"] > 0 else None,
                "memory_peak_mib": row["memory_peak_mib"],
                "power_mean_w": row["energy_j"] / row["energy_s"] if has_energy else None,
                "energy_j": row["energy_j"] if has_energy else None,
                "energy_per_token_j": row["energy_j"] / row["tokens"] if has_energy and row["tokens"] else None,
            }
        )
    return out
