"""The prepared GPU check: a real small hierarchy on the GPU it finds, every strategy, identity classified.

    bash scripts/gpu_check.sh                          # SmolLM2 draft -> target on cuda:0, fp32 / fp16 / bf16
    GPU_CHECK_MODELS=/ckpt/draft,/ckpt/target bash scripts/gpu_check.sh   # local checkpoints, smallest first
    GPU_CHECK_DRY_RUN=1 bash scripts/gpu_check.sh      # tiny random models on the CPU (also without a GPU)
    python -m experiments.gpu_check --device cpu --hierarchies tiny_k2 --tokens 16 --prompts 2

Needs no hub and no package registry. On a GPU it runs the packaged SmolLM2-135M-Instruct
(`experiments.prepare`, offline) as a draft -> target pair on `cuda:0` for each target dtype
(float32, float16, bfloat16; the draft in other numerics, DRAFT_DTYPE), or the local checkpoints
GPU_CHECK_MODELS names (one tokenizer, smallest first, every stage in the dtype), on the first
HumanEval problems with the chat template. The dry run (GPU_CHECK_DRY_RUN=1, `--dry-run`, or no GPU)
runs the tiny random LLaMA hierarchy (`experiments.tiny`, built on the spot) on the CPU instead.

For each hierarchy and dtype it runs greedy, sd and pipespec through the real Pipeline, classifies every
output against that device's greedy output (identical / near_tie / unexplained,
`analysis.rundir.classify_identity`; fp16 / bf16 near-ties by the target's top-2 logit margin), and
prints tokens/s, per stage the mean acceptance length, draft acceptance rate, mean step time, busy
fraction and its own NVML samples (utilisation, peak memory, power), the target's step time for 8
tokens over 1, and what these say: what verifying 8 drafts costs, and SD's speedup against the one
Leviathan et al.'s formula predicts from the measured acceptance and step costs. Everything goes into
one folder named after the machine (`--out`; default results/gpu_check/<gpus>_<date> on a GPU,
outputs/gpu_check/<machine>_<date> for a dry run): check.json (facts, every case, per stage) and
check.txt (what was printed). Exit code 0 when nothing is unexplained, 1 otherwise, 2 for bad options.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import re
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

from analysis.paper_model import leviathan_walltime_improvement
from analysis.rundir import classify_identity, near_tie_threshold
from experiments.compose import load
from experiments.data import prompts_for
from experiments.hub import default_offline
from experiments.prepare import prepare_smollm2
from experiments.tiny import build_tiny_hierarchy, random_prompts
from pipespec.errors import ConfigError, StageError
from pipespec.gpu import GpuSampler, gpu_facts, open_backend, pool_gpu_figures, sample_gpu_figures, summarize_series
from pipespec.hardware import cpu_info
from pipespec.models import CausalLMRunner, load_model
from pipespec.specs import StageSpec
from pipespec.stats import StageStats, pool

# torch, transformers and pipespec.api (torch) are imported where a model runs: parsing and checking the
# options imports none of them.

default_offline()  # its models are local (packaged SmolLM2, tiny models, GPU_CHECK_MODELS paths): no hub

STRATEGIES = ("greedy", "sd", "pipespec")
TINY_DRAFT_NOISE = (0.3, 0.05)  # as experiments.hierarchies builds tiny_k2 / tiny_k3
MODELS_VARIABLE = "GPU_CHECK_MODELS"  # local checkpoint directories, smallest first, comma-separated
DRY_RUN_VARIABLE = "GPU_CHECK_DRY_RUN"
DRAFT_DTYPE = {"float32": "bfloat16", "float16": "bfloat16", "bfloat16": "float16"}  # SmolLM2's draft: other numerics
ROOT = Path(__file__).resolve().parent.parent


def hierarchies(directory: str) -> dict[str, list[str]]:
    """tiny_k3 = draft 0.3, draft 0.05, target; tiny_k2 = draft 0.05, target (as conf/models/tiny_k*.yaml)."""
    paths = build_tiny_hierarchy(directory, TINY_DRAFT_NOISE, seed=0)
    return {"tiny_k2": paths[1:], "tiny_k3": paths}


def stage_specs(name: str, dtype: str, device: str, tiny: dict[str, list[str]]) -> list[dict]:
    """The stages of one case: `smollm2` (draft in DRAFT_DTYPE, target in `dtype`), `local` (GPU_CHECK_MODELS,
    all in `dtype`) or a tiny hierarchy (all in `dtype`)."""
    if name == "smollm2":
        path = str(prepare_smollm2())
        return [{"model": path, "device": device, "dtype": DRAFT_DTYPE[dtype], "name": f"smollm2-{DRAFT_DTYPE[dtype]}"},
                {"model": path, "device": device, "dtype": dtype, "name": f"smollm2-{dtype}"}]  # fmt: skip
    if name == "local":
        paths = [p.strip() for p in os.environ.get(MODELS_VARIABLE, "").split(",") if p.strip()]
        return [{"model": p, "device": device, "dtype": dtype, "name": Path(p).name} for p in paths]
    return [{"model": p, "device": device, "dtype": dtype} for p in tiny[name]]


def prompts_for_case(name: str, target: str, count: int, tokens: int) -> list[list[int]]:
    """Token ids: the first HumanEval problems in the chat template for real models, random ids for tiny ones."""
    if name.startswith("tiny"):
        return random_prompts(count, length=16, seed=1)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    family = "chat" if getattr(tokenizer, "chat_template", None) else "base"
    found = prompts_for(load("dataset", "humaneval"), tokenizer, family, None, tokens, count=count)
    return [list(p.ids) for p in found.prompts]


def step_time_ratio(target: str, device: str, dtype: str, prefix: int = 32, reps: int = 20) -> dict[str, float]:
    """The target's forward pass over 8 candidates vs 1 (after a cached prefix): the fastest of `reps` each (the
    least disturbed by anything else running)."""
    import torch

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
        return min(times)

    timed(1)  # warm-up: first-call allocations and kernel selection
    one, eight = timed(1), timed(8)
    return {"step_1_ms": 1000 * one, "step_8_ms": 1000 * eight, "ratio_8_over_1": eight / one}


def stage_rows(results, names: list[str]) -> list[dict]:
    """Per stage over the prompts of one strategy: pooled counts (`pipespec.stats`) and its own GPU samples."""
    rows = []
    for i, name in enumerate(names):
        traces = [(r, t) for r in results for t in r.stage_traces if t.stage == i]
        if not traces:
            continue
        stats = pool(StageStats.from_trace(t, len(r.tokens)) for r, t in traces)
        gpu = pool_gpu_figures([{"gpu": sample_gpu_figures([t.to_dict()]), "new_tokens": len(r.tokens)}
                                for r, t in traces])  # fmt: skip
        rows.append({**stats.as_dict(name), "gpu": gpu})
    return rows


def run_case(specs, prompts, tokens, lookahead, threshold):
    """Every strategy on one pipeline: records shaped like a run's samples.jsonl, classified, and per stage."""
    from pipespec.api import Pipeline

    names = [s.get("name") or Path(s["model"]).name for s in specs]
    rows = {}
    with Pipeline(specs, strategy="greedy", lookahead=lookahead, start_timeout_s=240, stall_timeout_s=60) as pipe:
        pipe.generate(prompts[0], 8)  # untimed warm-up
        for strategy in STRATEGIES:
            results = [pipe.generate(prompt, tokens, strategy=strategy) for prompt in prompts]
            records = [{"sample_id": i, "output_ids": r.tokens, "new_tokens": len(r.tokens), "time_s": r.time_s,
                        "target_margins": r.margins,
                        "gpu": sample_gpu_figures([t.to_dict() for t in r.stage_traces])}
                       for i, r in enumerate(results)]  # fmt: skip
            rows[strategy] = {"records": records, "stages": stage_rows(results, names)}
    for row in rows.values():
        row["identity"] = classify_identity(row["records"], rows["greedy"]["records"], threshold)
    return rows


def _fmt(value, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def format_stage(stage: dict) -> str:
    gpu = "; ".join(f"gpu{g['index']} util {_fmt(g['utilization_mean_pct'], '.0f')}%, peak "
                    f"{_fmt(g['memory_peak_mib'], '.0f')} MiB, {_fmt(g['power_mean_w'], '.0f')} W"
                    for g in stage["gpu"] or []) or "no GPU samples"  # fmt: skip
    return (f"      {stage['name'][:22]:<23}acc.len {_fmt(stage['mean_acceptance_length'], '.2f'):>5}  "
            f"accept {_fmt(stage['draft_acceptance_rate'], '.2f'):>4}  "
            f"step {_fmt(stage['mean_step_ms'], '.1f'):>6} ms  busy {_fmt(stage['busy_fraction'], '.2f')}  "
            f"| {gpu}")  # fmt: skip


def summarize_case(case: dict) -> dict:
    """tokens/s per strategy, the speedups over greedy, identity counts: the case's lines of check.json."""
    out = {}
    for strategy, row in case.items():
        tokens = sum(r["new_tokens"] for r in row["records"])
        seconds = sum(r["time_s"] for r in row["records"])
        identity = row["identity"]
        out[strategy] = {"tokens_per_s": tokens / seconds if seconds else None, "tokens": tokens,
                         "identical": identity["identical"], "near_tie": identity["near_tie"],
                         "unexplained": identity["unexplained"], "mismatches": identity["mismatches"],
                         "stages": row["stages"]}  # fmt: skip
    for strategy in out:
        base, mine = out["greedy"]["tokens_per_s"], out[strategy]["tokens_per_s"]
        out[strategy]["speedup_vs_greedy"] = mine / base if base and mine else None
    return out


def print_case(name: str, summary: dict) -> None:
    for strategy, row in summary.items():
        where = ", ".join(f"{m['sample_id']}@{m['position']} ({m['class']}, margin {m['margin']:.3g})"
                          for m in row["mismatches"])  # fmt: skip
        print(f"  {name:<8}{strategy:<9}{_fmt(row['tokens_per_s'], '>8.1f')} tok/s "
              f"({_fmt(row['speedup_vs_greedy'], '.2f')}x greedy)  identical {row['identical']}, "
              f"near_tie {row['near_tie']}, unexplained {row['unexplained']}" + (f" [{where}]" if where else ""))
        for stage in row["stages"]:
            print(format_stage(stage))


def lessons(dtype: str, device: str, ratio: dict, summary: dict, lookahead: int) -> list[str]:
    """What one dtype's figures say: the cost of verifying 8 drafts, and SD against Leviathan et al.'s formula."""
    lines = [f"{dtype} on {device}: verifying 8 tokens costs {ratio['ratio_8_over_1']:.2f}x a 1-token step "
             + ("(launch-bound: checking drafts is almost free, the regime speculation needs)"
                if ratio["ratio_8_over_1"] < 1.5 else "(compute-bound: every draft checked costs time)")]  # fmt: skip
    sd = summary.get("sd")
    if sd and len(sd["stages"]) >= 2:
        draft, target = sd["stages"][0], sd["stages"][-1]
        alpha, cost = target["draft_acceptance_rate"], None
        if draft["mean_step_ms"] and target["mean_step_ms"]:
            cost = draft["mean_step_ms"] / target["mean_step_ms"]
        if alpha is not None and cost is not None:
            predicted = leviathan_walltime_improvement(min(alpha, 0.999), lookahead, cost)
            lines.append(f"{dtype}: sd accepted {alpha:.2f} of the drafts at a draft step {cost:.2f}x the target's: "
                         f"Leviathan et al. predict {predicted:.2f}x greedy, measured "
                         f"{_fmt(sd['speedup_vs_greedy'], '.2f')}x")  # fmt: skip
    return lines


def machine_name(facts: dict, dry_run: bool) -> str:
    """A folder-safe name of the machine: its GPUs (`4x-nvidia-a100-sxm4-40gb`), or the CPU for a dry run."""
    if facts["gpus"] and not dry_run:
        count = len(facts["gpus"])
        name = ("" if count == 1 else f"{count}x-") + facts["gpus"][0]
    else:
        name = "cpu-" + str(cpu_info().get("name") or "unknown")
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")


def out_dir(given: str | None, machine: str, dry_run: bool) -> Path:
    """--out, else a new folder named after the machine and the date (never an existing one: nothing is
    overwritten)."""
    if given:
        return Path(given)
    base = ROOT / ("outputs" if dry_run else "results") / "gpu_check" / f"{machine}_{datetime.date.today():%Y-%m-%d}"
    path, n = base, 2
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def parse_args(argv: list[str] | None, gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", default=os.environ.get(DRY_RUN_VARIABLE, "") not in ("", "0"),
                        help=f"tiny random models on the CPU (also {DRY_RUN_VARIABLE}=1, and without a GPU)")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default cuda:0; the dry run: cpu)")
    parser.add_argument("--dtypes", default=None,
                        help="target dtypes (default float32,float16,bfloat16; the dry run: float32,float16)")
    parser.add_argument("--hierarchies", default=None,
                        help=f"smollm2, local ({MODELS_VARIABLE}), tiny_k2, tiny_k3 (default smollm2, or local where "
                             f"{MODELS_VARIABLE} is set; the dry run: tiny_k2)")
    parser.add_argument("--prompts", type=int, default=None, help="HumanEval problems (default 4; dry run 2)")
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per prompt (default 128; dry run 16)")
    parser.add_argument("--lookahead", type=int, default=4)
    parser.add_argument("--out", default=None, help="results folder (default: named after the machine and the date)")
    args = parser.parse_args(argv)
    args.dry_run = args.dry_run or not gpu or (args.device or "").startswith("cpu")
    dry = args.dry_run
    args.device = args.device or ("cpu" if dry else "cuda:0")
    dtypes = args.dtypes or ("float32,float16" if dry else "float32,float16,bfloat16")
    args.dtypes = [d.strip() for d in dtypes.split(",") if d.strip()]
    default = "tiny_k2" if dry else ("local" if os.environ.get(MODELS_VARIABLE) else "smollm2")
    args.hierarchies = [h.strip() for h in (args.hierarchies or default).split(",") if h.strip()]
    args.prompts = args.prompts or (2 if dry else 4)
    args.tokens = args.tokens or (16 if dry else 128)
    return args


def check_options(args) -> None:
    """One `ConfigError` for a bad device, dtype or hierarchy, before anything is built."""
    for dtype in args.dtypes:
        StageSpec.from_any({"model": ".", "device": args.device, "dtype": dtype})
    known = ("smollm2", "local", "tiny_k2", "tiny_k3")
    unknown = [h for h in args.hierarchies if h not in known]
    if unknown:
        raise ConfigError(f"unknown --hierarchies {unknown}; choose from {list(known)}")
    if "local" in args.hierarchies:
        paths = [p.strip() for p in os.environ.get(MODELS_VARIABLE, "").split(",") if p.strip()]
        if len(paths) < 2 or not all((Path(p) / "config.json").exists() for p in paths):
            raise ConfigError(f"{MODELS_VARIABLE} must list two or more local checkpoint directories (each with a "
                              f"config.json, one tokenizer), smallest first, got {paths}")  # fmt: skip


def run_dtype(args, dtype: str, tiny: dict, report: dict) -> int:
    """Every hierarchy in one target dtype; returns the unexplained mismatches and errors."""
    threshold, unexplained = near_tie_threshold(dtype), 0
    for name in args.hierarchies:
        specs = stage_specs(name, dtype, args.device, tiny)
        ratio = step_time_ratio(specs[-1]["model"], args.device, dtype)
        print(f"\n{name}, target {dtype} on {args.device}: target step {ratio['step_1_ms']:.2f} ms (1 token), "
              f"{ratio['step_8_ms']:.2f} ms (8 tokens): 8-token / 1-token step time {ratio['ratio_8_over_1']:.2f}; "
              f"near-tie threshold {threshold:g}")  # fmt: skip
        try:
            prompts = prompts_for_case(name, specs[-1]["model"], args.prompts, args.tokens)
            case = run_case(specs, prompts, args.tokens, args.lookahead, threshold)
        except (ConfigError, StageError) as error:
            print(f"  {name}: error: {error}")
            report["cases"].append({"hierarchy": name, "dtype": dtype, "error": str(error)})
            unexplained += 1
            continue
        summary = summarize_case(case)
        print_case(name, summary)
        unexplained += sum(row["unexplained"] for row in summary.values())
        said = lessons(dtype, args.device, ratio, summary, args.lookahead)
        report["lessons"] += said
        report["cases"].append({"hierarchy": name, "dtype": dtype, "stages": specs, "step_time": ratio,
                                "strategies": summary})  # fmt: skip
    return unexplained


def check(args) -> int:
    """The whole check, printing as it goes; returns the report check.json holds."""
    import torch
    import transformers

    facts = gpu_facts()
    machine = machine_name(facts, args.dry_run)
    print(f"machine {machine}: torch {torch.__version__} (CUDA {facts['cuda']}), transformers "
          f"{transformers.__version__}, driver {facts['driver']}, GPUs {facts['gpus']}, monitor "
          f"{facts['gpu_monitor']}, bitsandbytes {facts['bitsandbytes']}"
          + (" (dry run: tiny models on the CPU)" if args.dry_run else ""))  # fmt: skip
    backend = open_backend() if args.device.startswith("cuda") else None
    sampler = GpuSampler(range(backend.count()), backend).start() if backend is not None else None
    started, unexplained = time.perf_counter(), 0
    report = {"machine": machine, "facts": facts, "options": {k: v for k, v in vars(args).items()},
              "cases": [], "lessons": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pipespec-gpu-check-") as directory:
        tiny = hierarchies(directory) if any(h.startswith("tiny") for h in args.hierarchies) else {}
        for dtype in args.dtypes:
            unexplained += run_dtype(args, dtype, tiny, report)
    if sampler is not None:
        sampler.stop()
        report["nvml"] = [summarize_series(s) for s in sampler.window(started, time.perf_counter())]
        for figures in report["nvml"]:
            print(f"NVML gpu{figures['index']} ({figures['name']}) over the check: {figures['samples']} samples, "
                  f"mean util {_fmt(figures['utilization_mean_pct'], '.0f')}%, peak {figures['memory_peak_mib']} MiB, "
                  f"energy {_fmt(figures['energy_j'], '.0f')} J")  # fmt: skip
    elif args.device.startswith("cuda"):
        print("NVML: neither pynvml nor nvidia-smi answered: no GPU figures")
    if args.dry_run:
        report["lessons"].append("a dry run: the timings are this CPU's, not a GPU's; the identity classes hold "
                                 "anywhere")
    print("\nwhat this shows:\n" + "\n".join(f"  {line}" for line in report["lessons"]))
    report["unexplained"], report["seconds"] = unexplained, time.perf_counter() - started
    print(f"\n{'OK' if unexplained == 0 else 'FAILED'}: {unexplained} unexplained mismatch(es) or errors, "
          f"{report['seconds']:.0f} s")  # fmt: skip
    return report


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy (check.txt)."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.stream.flush()
        return self.copy.write(text)


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv, torch.cuda.is_available())
    try:
        check_options(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    tee = _Tee(sys.stdout)
    with redirect_stdout(tee):
        report = check(args)
        out = out_dir(args.out, report["machine"], args.dry_run)
        print(f"results: {out}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "check.txt").write_text(tee.copy.getvalue())
    return 0 if report["unexplained"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
