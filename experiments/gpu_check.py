"""The prepared GPU check: tiny models built on the spot, every strategy, identity classified.

    bash scripts/gpu_check.sh                 # cuda, float32 and float16, tiny_k2 and tiny_k3
    python -m experiments.gpu_check --device cpu --tokens 16 --prompts 2   # the same path on a CPU

Needs no hub, no package registry and no carried weights: the tiny random LLaMA
hierarchy (`experiments.tiny`) is built into a temporary directory with the torch
and transformers installed on the machine. For each hierarchy (k = 2 and 3) and
dtype it runs greedy, sd and pipespec through the real Pipeline on the device,
classifies every output against that device's greedy output (identical /
near_tie / unexplained, `analysis.rundir.classify_identity`), and prints
tokens/s, the target's step time for 8 tokens over 1 token, and the NVML
figures of the GPUs (utilisation, peak memory, power, energy per token). Exit
code 0 when nothing is unexplained, 1 otherwise, 2 for bad options.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

STRATEGIES = ("greedy", "sd", "pipespec")
TINY_DRAFT_NOISE = (0.3, 0.05)  # as experiments.hierarchies builds tiny_k2 / tiny_k3


def hierarchies(directory: str) -> dict[str, list[str]]:
    """tiny_k3 = draft 0.3, draft 0.05, target; tiny_k2 = draft 0.05, target (as conf/models/tiny_k*.yaml)."""
    from experiments.tiny import build_tiny_hierarchy

    paths = build_tiny_hierarchy(directory, TINY_DRAFT_NOISE, seed=0)
    return {"tiny_k2": paths[1:], "tiny_k3": paths}


def step_time_ratio(target: str, device: str, dtype: str, prefix: int = 32, reps: int = 20) -> dict[str, float]:
    """Median time of the target's forward pass over 8 candidates vs 1 (after a cached prefix)."""
    import torch

    from pipespec.models import CausalLMRunner, load_model

    from pipespec.specs import StageSpec

    runner = CausalLMRunner(load_model(StageSpec(model=target, device=device, dtype=dtype)))
    sequence = list(range(2, 2 + prefix))

    def timed(n: int) -> float:
        times = []
        for _ in range(reps):
            runner.start()
            runner.forward(sequence[:-1], [])  # the prefix into the cache; its last token stays pending
            runner.truncate(prefix - 1)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            started = time.perf_counter()
            runner.forward(sequence, [3] * (n - 1))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    timed(1)  # warm-up: first-call allocations and kernel selection
    one, eight = timed(1), timed(8)
    return {"step_1_ms": 1000 * one, "step_8_ms": 1000 * eight, "ratio_8_over_1": eight / one}


def run_case(paths, device, dtype, prompts, tokens, lookahead, threshold):
    """Every strategy on one pipeline; records shaped like a run's samples.jsonl, classified."""
    from pipespec import Pipeline
    from pipespec.gpu import sample_gpu_figures
    from analysis.rundir import classify_identity

    specs = [{"model": p, "device": device, "dtype": dtype} for p in paths]
    rows = {}
    with Pipeline(specs, strategy="greedy", lookahead=lookahead, start_timeout_s=240, stall_timeout_s=60) as pipe:
        pipe.generate(prompts[0], 8)  # untimed warm-up
        for strategy in STRATEGIES:
            records = []
            for i, prompt in enumerate(prompts):
                result = pipe.generate(prompt, tokens, strategy=strategy)
                records.append(
                    {
                        "sample_id": i, "output_ids": result.tokens, "new_tokens": len(result.tokens),
                        "time_s": result.time_s, "target_margins": result.margins,
                        "gpu": sample_gpu_figures([t.to_dict() for t in result.stage_traces]),
                    }
                )  # fmt: skip
            rows[strategy] = records
    out = {}
    for strategy, records in rows.items():
        identity = classify_identity(records, rows["greedy"], threshold)
        out[strategy] = {"records": records, "identity": identity}
    return out


def format_gpu(records) -> str:
    from pipespec.gpu import pool_gpu_figures

    pooled = pool_gpu_figures(records)
    if not pooled:
        return "no GPU samples"

    def fmt(value, spec):
        return format(value, spec) if value is not None else "-"

    return "; ".join(
        f"gpu{g['index']}: util {fmt(g['utilization_mean_pct'], '.0f')}%, peak {fmt(g['memory_peak_mib'], '.0f')} MiB, "
        f"{fmt(g['power_mean_w'], '.0f')} W, {fmt(g['energy_per_token_j'], '.3f')} J/token"
        for g in pooled
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--dtypes", default="float32,float16", help="comma-separated (default float32,float16)")
    parser.add_argument("--hierarchies", default="tiny_k2,tiny_k3")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--lookahead", type=int, default=4)
    args = parser.parse_args(argv)

    import torch
    import transformers

    from pipespec.errors import ConfigError, StageError
    from pipespec.gpu import gpu_facts, open_backend, GpuSampler, summarize_series
    from pipespec.specs import StageSpec
    from analysis.rundir import near_tie_threshold
    from experiments.tiny import random_prompts

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    try:
        for dtype in dtypes:
            StageSpec.from_any({"model": ".", "device": args.device, "dtype": dtype})
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    facts = gpu_facts()
    print(f"torch {torch.__version__} (CUDA {facts['cuda']}), transformers {transformers.__version__}, "
          f"driver {facts['driver']}, GPUs {facts['gpus']}, monitor {facts['gpu_monitor']}, "
          f"bitsandbytes {facts['bitsandbytes']}")  # fmt: skip
    backend = open_backend() if args.device.startswith("cuda") else None
    sampler = GpuSampler(range(backend.count()), backend).start() if backend is not None else None
    started = time.perf_counter()
    unexplained = 0
    prompts = random_prompts(args.prompts, length=16, seed=1)
    with tempfile.TemporaryDirectory(prefix="pipespec-gpu-check-") as directory:
        built = hierarchies(directory)
        for dtype in dtypes:
            threshold = near_tie_threshold(dtype)
            ratio = step_time_ratio(built["tiny_k2"][-1], args.device, dtype)
            print(f"\n{dtype} on {args.device}: target step {ratio['step_1_ms']:.2f} ms (1 token), "
                  f"{ratio['step_8_ms']:.2f} ms (8 tokens): 8-token / 1-token step time {ratio['ratio_8_over_1']:.2f}; "
                  f"near-tie threshold {threshold:g}")  # fmt: skip
            for name in [h.strip() for h in args.hierarchies.split(",")]:
                try:
                    case = run_case(built[name], args.device, dtype, prompts, args.tokens, args.lookahead, threshold)
                except (ConfigError, StageError) as error:
                    print(f"  {name}: error: {error}")
                    unexplained += 1
                    continue
                for strategy, row in case.items():
                    records, identity = row["records"], row["identity"]
                    tokens = sum(r["new_tokens"] for r in records)
                    seconds = sum(r["time_s"] for r in records)
                    unexplained += identity["unexplained"]
                    where = ", ".join(
                        f"{m['sample_id']}@{m['position']} ({m['class']}, margin {m['margin']:.3g})"
                        for m in identity["mismatches"]
                    )
                    print(
                        f"  {name:<8}{strategy:<9}{tokens / seconds:>9.1f} tok/s  identical {identity['identical']}, "
                        f"near_tie {identity['near_tie']}, unexplained {identity['unexplained']}"
                        + (f" [{where}]" if where else "")
                        + f"  | {format_gpu(records)}"
                    )
    if sampler is not None:
        t1 = time.perf_counter()
        sampler.stop()
        for series in sampler.window(started, t1):
            figures = summarize_series(series)
            print(
                f"NVML gpu{figures['index']} ({figures['name']}) over the check: {figures['samples']} samples, "
                f"mean util {figures['utilization_mean_pct']}%, peak {figures['memory_peak_mib']} MiB, "
                f"mean power {figures['power_mean_w']} W, energy {figures['energy_j']} J"
            )
    elif args.device.startswith("cuda"):
        print("NVML: neither pynvml nor nvidia-smi answered: no GPU figures")
    print(f"\n{'OK' if unexplained == 0 else 'FAILED'}: {unexplained} unexplained mismatch(es) or errors, "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    return 0 if unexplained == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
