"""The stages' kernels side by side: t(n) of a stage's fp32 model in several variants (torch's linears,
oneDNN's prepacked linears, the stage compiled ahead of time, the model compiled by torch.compile), and
whether greedy decoding gives the same tokens with all of them (`pipespec.kernels`).

    python -m experiments.kernels models=smollm2_int8_fp32 dataset=humaneval dataset.n_samples=10 \
        max_new_tokens=128 [--max-fed 16] [--repeats 5] [--variants torch,onednn,exported,compile,compile_unpacked] \
        [--out results/kernels/humaneval]

Composes the runner's config (`conf/config.yaml`: models, dataset; any override). Every model
stage that oneDNN prepacking applies to (CPU, float32, not quantized) is loaded once per variant in this
process. Variants (`--variants`, default torch,onednn; the first is the reference of every ratio and
identity check):

- `torch`: `kernels: torch`; `onednn`: `kernels: onednn` (`pipespec.kernels.PrepackedLinear`);
- `exported`: the stage with `compile: true` (`pipespec.exported`: its step exported and compiled ahead of
  time by AOTInductor, one graph for every shape; built at its first use on a machine, else loaded from
  the cache); its load time (build or load, and one sweep) is reported as `load_s`;
- `compile`: the `onednn` model with its forward compiled by `torch.compile(dynamic=True)` (inductor). Its
  calls run with inductor's freezing on: inductor lowers `mkldnn._linear_pointwise` only for a weight that
  is a graph constant, and dynamo decides that while tracing. Shapes: 1..max_fed tokens fed on a KV cache
  (transformers' DynamicCache) of any length, so a few graphs (the cache's layout after a crop, n = 1 and
  n > 1) and then none. If it fails (an error while compiling or running, a warm-up that keeps compiling
  new graphs, graphs compiled while timed), the variant is reported failed with a one-line reason and the
  others are still measured. Inductor's FX graph cache does not keep these graphs (the prepacked weights
  are mkldnn tensors, which do not pickle), so every start compiles them again;
- `compile_unpacked`: the `torch` model compiled the same way with inductor's own weight prepacking off
  (`cpp.weight_prepack`): no mkldnn tensor in its graphs, which the graph cache keeps across processes,
  at the price of torch's few-row fp32 products.

Warm-up, per variant, before any timing: the first call (a prefill of the first prompt: compilation for
`compile`) and sweeps of n = 1..max_fed until a sweep compiles no new graph (at most WARM_UP_SWEEPS); their
seconds are reported apart from t(n). Timing: t(n) for n = 1..max_fed tokens fed after the first prompt
(warm cache, one torch thread per stage as in the pipeline), the variants' sweeps interleaved so drift of
the machine falls on all; medians over `repeats` sweeps. Exactness, per prompt: the greedy continuation of
`max_new_tokens` tokens with each variant, whether it equals the first variant's, and whether each variant,
fed its whole continuation at once as a verifier is, agrees with its own greedy choice at every position.
Writes kernels.json and kernels.md into `--out` (default: the current directory) and prints the table;
reports written before `--variants` existed (torch and onednn, `onednn_verifies_like_greedy`) still render.
A timing: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pipespec.compiled  # compile_forward looked up at each call (the tests replace it)
from experiments.compose import compose
from experiments.data import DataError
from experiments.machine import machine_facts
from pipespec.compiled import StillCompiling, compiled_graphs, graph_breaks
from pipespec.compiled import warm_up as compiled_warm_up
from pipespec.errors import ConfigError
from pipespec.models import CausalLMRunner, check_shared_vocabulary, context_length, load_model

# torch and the modules that import it (experiments.run_config, pipespec.exported, pipespec.kernels), and
# experiments.profiler and .profiler_acceptance (numpy, through analysis), are imported where a comparison
# runs: `--help` and a bad option import none of them.

# offline or online: the composed config's `hub.offline`, resolved by RunConfig.from_config (experiments.hub)

VARIANTS = ("torch", "onednn", "exported", "compile", "compile_unpacked")
COMPILED = ("compile", "compile_unpacked")  # variants whose forward torch.compile compiles
KERNELS_COMPARED = ("torch", "onednn")  # the default variants (and those of reports without "variants")
CONTAINED = ("exported", *COMPILED)  # variants whose errors are reported as the variant's failure, not raised


class VariantFailed(Exception):
    """A variant that cannot be measured (its one-line reason)."""


def parse_variants(text: str) -> tuple[str, ...]:
    """`--variants`: a comma list of distinct names of VARIANTS; a `ValueError` with the reason otherwise."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise ValueError(f"--variants: unknown {', '.join(unknown)}; allowed: {', '.join(VARIANTS)}")
    if not names:
        raise ValueError(f"--variants: name at least one of {', '.join(VARIANTS)}")
    if len(set(names)) < len(names):
        raise ValueError(f"--variants: a variant named twice in {text!r}")
    return tuple(names)


def one_line(error: BaseException) -> str:
    """An error as one line of at most 200 characters (compiler errors span many)."""
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def load_variant(spec, variant: str):
    """A runner of the stage's model as `variant` runs it: `exported` is the stage with `compile: true`
    (its package built, or loaded from the cache); `compile` the prepacked model compiled by torch.compile;
    `compile_unpacked` torch's model compiled with inductor's weight prepacking off."""
    if variant == "exported":
        from pipespec.exported import compiled_runner

        return compiled_runner(replace(spec, compile=True))[0]
    if variant == "compile":
        model = pipespec.compiled.compile_forward(load_model(replace(spec, kernels="onednn", compile=False)))
        return CausalLMRunner(model)
    if variant == "compile_unpacked":
        model = pipespec.compiled.compile_forward(load_model(replace(spec, kernels="torch", compile=False)),
                                                  weight_prepack=False)
        return CausalLMRunner(model)
    return CausalLMRunner(load_model(replace(spec, kernels=variant, compile=False)))


def warm_up(runner, context: list[int], max_fed: int, compiled: bool) -> dict:
    """`pipespec.compiled.warm_up`: a variant that keeps compiling has failed."""
    try:
        return compiled_warm_up(runner, context, max_fed, compiled=compiled)
    except StillCompiling as error:
        raise VariantFailed(str(error)) from None


def verifies_like_greedy(runner, prompt: list[int], continuation: list[int]) -> bool:
    """Fed `continuation` as candidates in one pass, the runner's argmax after each prefix is the next token."""
    runner.start()
    chosen = runner.forward(list(prompt), continuation[:-1]).argmax(-1).tolist()
    return chosen == continuation


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (one ending early counts), None if equal."""
    if a == b:
        return None
    return next(i for i, (x, y) in enumerate(zip(a + [None], b + [None])) if x != y)


def sample_entry(sample_id: str, outputs: dict, verifies: dict) -> dict:
    """One prompt's exactness: every variant's output against the first's (the first key of `outputs`)."""
    reference = outputs[next(iter(outputs))]
    per_variant = {v: {"identical": out == reference, "first_difference": first_difference(reference, out),
                       "verifies_like_greedy": verifies[v]} for v, out in outputs.items()}  # fmt: skip
    differences = [e["first_difference"] for e in per_variant.values() if e["first_difference"] is not None]
    return {"sample_id": sample_id, "identical": not differences,
            "first_difference": min(differences) if differences else None, "variants": per_variant}  # fmt: skip


def guarded(variant: str, failed: dict, action):
    """`action()`, or None with `failed[variant]` set where a contained variant raises."""
    try:
        return action()
    except Exception as error:  # noqa: BLE001 - compiler errors are of any type; they fail the variant only
        if variant not in CONTAINED and not isinstance(error, VariantFailed):
            raise
        failed[variant] = one_line(error)
        return None


def load_and_warm(spec, variants: tuple[str, ...], context: list[int], max_fed: int, failed: dict, log) -> tuple:
    """({variant: runner}, {variant: warm-up facts}) of the variants that load and warm up; `failed` gets the rest."""
    runners, warm = {}, {}
    for variant in variants:
        started = time.perf_counter()
        runner = guarded(variant, failed, lambda: load_variant(spec, variant))
        load_s = time.perf_counter() - started
        facts = runner and guarded(variant, failed, lambda: warm_up(runner, context, max_fed, variant in COMPILED))
        if facts:
            runners[variant], warm[variant] = runner, {"load_s": load_s, **facts}
            log(f"kernels: {spec.label}: {variant}: loaded in {load_s:.2f} s, first call "
                f"{facts['first_call_s']:.2f} s, warm-up sweeps "
                + ", ".join(f"{s:.2f}" for s in facts["sweeps_s"]) + " s")  # fmt: skip
        else:
            log(f"kernels: {spec.label}: {variant}: failed, {failed[variant]}")
    return runners, warm


def exactness(runners: dict, prompts: list, budget: int, failed: dict, log) -> list[dict]:
    """Per prompt, `sample_entry` of the runners' greedy outputs; a runner that fails leaves `runners`."""
    samples = []
    for sample_id, prompt in prompts:
        outputs, verifies = {}, {}
        for variant, runner in list(runners.items()):
            checked = guarded(variant, failed, lambda: _greedy_and_verify(runner, prompt, budget))
            if checked is None:
                log(f"kernels: {variant}: failed, {failed[variant]}")
                del runners[variant]
            else:
                outputs[variant], verifies[variant] = checked
        if outputs:
            samples.append(sample_entry(sample_id, outputs, verifies))
            log(f"kernels: {sample_id}: greedy identical {samples[-1]['identical']}")
    return samples


def _greedy_and_verify(runner, prompt: list[int], budget: int) -> tuple[list[int], bool]:
    from experiments.profiler_acceptance import greedy_continuation

    output = greedy_continuation(runner, prompt, budget)
    return output, verifies_like_greedy(runner, prompt, output)


def compare_stage(spec, variants: tuple[str, ...], prompts: list, max_fed: int, repeats: int, budget: int,
                  log=print) -> dict:  # fmt: skip
    """One model stage's report: t(n) per variant, warm-up facts, exactness per prompt, the variants that failed."""
    import torch

    from experiments.profiler import interleaved_step_costs

    torch.set_num_threads(spec.threads)
    context = list(prompts[0][1])
    failed = {}
    graphs_at_start, breaks_at_start = compiled_graphs(), graph_breaks()
    runners, warm = load_and_warm(spec, variants, context, max_fed, failed, log)
    if not runners:
        return {"name": spec.label, "variants": list(variants), "failed": failed}
    log(f"kernels: {spec.label}: t(n), n = 1..{max_fed}, {repeats} interleaved sweeps of {', '.join(runners)}")
    graphs = compiled_graphs()
    costs = interleaved_step_costs(runners, context, max_fed, repeats)
    timed_compiled = [v for v in COMPILED if v in runners]
    if timed_compiled and compiled_graphs() > graphs:
        for variant in timed_compiled:
            failed[variant] = f"{compiled_graphs() - graphs} graphs compiled while timed: t(n) includes compilation"
            log(f"kernels: {spec.label}: {variant}: failed, {failed[variant]}")
    samples = exactness(runners, prompts, budget, failed, log)
    stage = {"name": spec.label, "variants": list(variants), "step_s": costs, "warm_up": warm, "samples": samples}
    compiled_warm = [v for v in COMPILED if v in warm]
    for variant in compiled_warm:  # the process's graphs, with the exactness checks
        warm[variant]["graphs_in_all"] = compiled_graphs() - graphs_at_start
    if compiled_warm:
        stage["graph_breaks"] = {why: count - breaks_at_start.get(why, 0) for why, count in graph_breaks().items()
                                 if count > breaks_at_start.get(why, 0)}  # fmt: skip
    if failed:
        stage["failed"] = failed
    return stage


def compare(run, max_fed: int, repeats: int, log=print, variants: tuple[str, ...] = KERNELS_COMPARED) -> dict:
    """The report over every model stage of `run` (an `experiments.run_config.RunConfig`), on its prompts."""
    from pipespec.kernels import obstacle

    specs = list(run.stages)
    found = run.prompts(check_shared_vocabulary(specs), context_length(run.target.model))
    prompts = found.pairs()
    stages = []
    for spec in specs:
        if spec.kind != "hf":
            continue
        why_not = obstacle(spec.device, spec.dtype, spec.quantize)
        if why_not:
            stages.append({"name": spec.label, "skipped": why_not})
            log(f"kernels: {spec.label}: skipped, {why_not}")
            continue
        stages.append(compare_stage(spec, variants, prompts, max_fed, repeats, run.budget, log))
    return {"models": run.hierarchy, "dataset": found.name, "max_new_tokens": run.budget,
            "max_fed": max_fed, "repeats": repeats, "variants": list(variants), "machine": machine_facts(specs),
            "stages": stages}  # fmt: skip


# ---- the report ---------------------------------------------------------------------------------------


def sample_variants(sample: dict, variants: list[str]) -> dict:
    """A sample's {variant: {"identical", "verifies_like_greedy"}}, also from a report before `--variants`
    (torch vs onednn: "identical", "onednn_verifies_like_greedy")."""
    if "variants" in sample:
        return sample["variants"]
    return {variants[0]: {"identical": True, "verifies_like_greedy": None},
            "onednn": {"identical": sample["identical"],
                       "verifies_like_greedy": sample.get("onednn_verifies_like_greedy")}}  # fmt: skip


def tally(samples: list[dict], variants: list[str], key: str) -> str:
    """'variant k/n, ...': how many samples of each variant have `key` true (variants never checked left out)."""
    parts = []
    for variant in variants:
        values = [v[key] for s in samples if (v := sample_variants(s, variants).get(variant)) and v[key] is not None]
        if values:
            parts.append(f"{variant} {sum(values)}/{len(values)}")
    return ", ".join(parts) or "none checked"


def warm_up_line(stage: dict) -> str:
    parts = []
    for variant, facts in stage.get("warm_up", {}).items():
        text = f"{variant} {facts['first_call_s']:.2f} s / " + " + ".join(f"{s:.2f}" for s in facts["sweeps_s"]) + " s"
        if "load_s" in facts:  # reports before it existed have none
            text = f"{variant} loaded in {facts['load_s']:.2f} s, " + text[len(variant) + 1 :]
        if "graphs" in facts:
            breaks = sum(stage.get("graph_breaks", {}).values())
            text += (f" ({facts['graphs']} graphs in the warm-up, {facts.get('graphs_in_all', '?')} in all, "
                     f"{breaks} graph breaks)")
        parts.append(text)
    return "first call (prefill, compilation for compiled variants) / warm-up sweeps: " + "; ".join(parts)


def stage_markdown(stage: dict, report_variants: list[str], max_new_tokens: int) -> list[str]:
    if "skipped" in stage:
        return [f"## {stage['name']}: not compared ({stage['skipped']})", ""]
    variants = stage.get("variants", report_variants)
    lines = [f"## {stage['name']}", ""]
    lines += [f"- {variant}: failed, {why}" for variant, why in stage.get("failed", {}).items()]
    timed = [v for v in variants if v in stage.get("step_s", {})]
    if not timed:
        return lines + [""]
    reference, others = timed[0], timed[1:]
    samples = stage["samples"]
    lines += ([""] if stage.get("failed") else []) + [
        f"greedy outputs identical to {reference}'s ({max_new_tokens} tokens): "
        f"{tally(samples, others, 'identical') if others else 'no other variant'}; "
        f"verifying its whole output agrees with its greedy choice: {tally(samples, timed, 'verifies_like_greedy')}",
        ""]  # fmt: skip
    if stage.get("warm_up"):
        lines += [warm_up_line(stage), ""]
    header = ["n tokens fed"] + [f"{v} ms" for v in timed] + [f"{v} / {reference}" for v in others]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    columns = [stage["step_s"][v] for v in timed]
    for n, row in enumerate(zip(*columns), start=1):
        cells = [str(n)] + [f"{t * 1000:.1f}" for t in row] + [f"{t / row[0]:.2f}" for t in row[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def format_markdown(report: dict) -> str:
    cpu = report["machine"]["cpu"]
    variants = report.get("variants", list(KERNELS_COMPARED))
    lines = [f"# Linear kernels: {report['models']} on {report['dataset']}",
             "", f"machine: {cpu.get('name')} (family {cpu.get('family')}, model {cpu.get('model')}), "
             f"torch {report['machine']['libraries']['torch']}; medians of {report['repeats']} interleaved sweeps", ""]  # fmt: skip
    for stage in report["stages"]:
        lines += stage_markdown(stage, variants, report["max_new_tokens"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--max-fed", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", default=",".join(KERNELS_COMPARED),
                        help=f"comma list of {', '.join(VARIANTS)}; the first is the reference")  # fmt: skip
    parser.add_argument("--out", default=".")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the runner's config")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.max_fed < 1 or args.repeats < 1:
        print("error: --max-fed and --repeats must be >= 1", file=sys.stderr)
        return 2
    try:
        variants = parse_variants(args.variants)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    from experiments.run_config import RunConfig  # torch: only once the arguments are good

    try:
        run = RunConfig.from_config(compose("config", args.overrides))
        report = compare(run, args.max_fed, args.repeats, log, variants)
    except (ConfigError, DataError) as error:
        print(f"error: {(str(error).strip().splitlines() or [type(error).__name__])[0]}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(report, indent=1))
    text = format_markdown(report)
    (out / "kernels.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
