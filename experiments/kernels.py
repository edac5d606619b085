"""The stages' linear kernels side by side: t(n) of torch's and of oneDNN's prepacked fp32 linears, and
whether greedy decoding gives the same tokens with both (`pipespec.kernels`).

    python -m experiments.kernels models=smollm2_int8_fp32 dataset=humaneval dataset.n_samples=10 \
        max_new_tokens=128 [--max-fed 16] [--repeats 5] [--out results/kernels/humaneval]

Composes the runner's config (`pipespec/conf/config.yaml`: models, dataset; any override). Every model
stage that oneDNN prepacking applies to (CPU, float32, not quantized) is loaded twice in this process, with
`kernels: torch` and `kernels: onednn`. Timing: t(n) for n = 1..max_fed tokens fed after the first prompt
(warm cache, one torch thread per stage as in the pipeline), the two kernels' sweeps interleaved so drift of
the machine falls on both; medians over `repeats` sweeps. Exactness, per prompt: the greedy continuation of
`max_new_tokens` tokens with each kernel, and whether the oneDNN model, fed the whole continuation at once as
a verifier is, agrees with its own greedy choice at every position. Writes kernels.json and kernels.md into
`--out` (default: the current directory) and prints the table. A timing: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

KERNELS_COMPARED = ("torch", "onednn")


def verifies_like_greedy(runner, prompt: list[int], continuation: list[int]) -> bool:
    """Fed `continuation` as candidates in one pass, the runner's argmax after each prefix is the next token."""
    runner.start()
    chosen = runner.forward(list(prompt), continuation[:-1]).argmax(-1).tolist()
    return chosen == continuation


def compare(config: dict, max_fed: int, repeats: int, log=print) -> dict:
    import torch

    from experiments.profile import profile_prompts
    from pipespec.hierarchies import resolve_stages
    from pipespec.kernels import obstacle
    from pipespec.models import CausalLMRunner, check_shared_vocabulary, context_length, load_model
    from pipespec.profiling import greedy_continuation, interleaved_step_costs, machine_facts

    specs = resolve_stages(config["models"]["stages"])
    tokenizer = check_shared_vocabulary(specs)
    dataset, prompts = profile_prompts(config, tokenizer, context_length(specs[-1].model))
    budget = config["max_new_tokens"]
    stages = []
    for spec in specs:
        if spec.kind != "hf":
            continue
        why_not = obstacle(spec.device, spec.dtype, spec.quantize)
        if why_not:
            stages.append({"name": spec.label, "skipped": why_not})
            log(f"kernels: {spec.label}: skipped, {why_not}")
            continue
        torch.set_num_threads(spec.threads)
        runners = {k: CausalLMRunner(load_model(replace(spec, kernels=k))) for k in KERNELS_COMPARED}
        log(f"kernels: {spec.label}: t(n), n = 1..{max_fed}, {repeats} interleaved sweeps")
        costs = interleaved_step_costs(runners, prompts[0][1], max_fed, repeats)
        samples = []
        for sample_id, prompt in prompts:
            outputs = {k: greedy_continuation(r, prompt, budget) for k, r in runners.items()}
            same = outputs["torch"] == outputs["onednn"]
            first_difference = None if same else next(
                i for i, (a, b) in enumerate(zip(outputs["torch"] + [None], outputs["onednn"] + [None])) if a != b)
            samples.append({"sample_id": sample_id, "identical": same, "first_difference": first_difference,
                            "onednn_verifies_like_greedy": verifies_like_greedy(runners["onednn"], prompt,
                                                                                outputs["onednn"])})  # fmt: skip
            log(f"kernels: {spec.label}: {sample_id}: greedy identical {same}")
        stages.append({"name": spec.label, "step_s": costs, "samples": samples})
        del runners
    return {"models": config["models"]["name"], "dataset": dataset, "max_new_tokens": budget, "max_fed": max_fed,
            "repeats": repeats, "machine": machine_facts(specs), "stages": stages}  # fmt: skip


def format_markdown(report: dict) -> str:
    cpu = report["machine"]["cpu"]
    lines = [f"# Linear kernels: {report['models']} on {report['dataset']}",
             "", f"machine: {cpu.get('name')} (family {cpu.get('family')}, model {cpu.get('model')}), "
             f"torch {report['machine']['libraries']['torch']}; medians of {report['repeats']} interleaved sweeps", ""]  # fmt: skip
    for stage in report["stages"]:
        if "skipped" in stage:
            lines += [f"## {stage['name']}: not compared ({stage['skipped']})", ""]
            continue
        samples = stage["samples"]
        identical = sum(s["identical"] for s in samples)
        verifies = sum(s["onednn_verifies_like_greedy"] for s in samples)
        lines += [f"## {stage['name']}", "",
                  f"greedy outputs identical (torch vs onednn, {report['max_new_tokens']} tokens): "
                  f"{identical}/{len(samples)}; onednn verifying its whole output agrees with its greedy choice: "
                  f"{verifies}/{len(samples)}", "",
                  "| n tokens fed | torch ms | onednn ms | onednn / torch |", "|---|---|---|---|"]  # fmt: skip
        for n, (a, b) in enumerate(zip(stage["step_s"]["torch"], stage["step_s"]["onednn"]), start=1):
            lines.append(f"| {n} | {a * 1000:.1f} | {b * 1000:.1f} | {b / a:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from pipespec.conf import CONF_DIR
    from pipespec.data import DataError
    from pipespec.errors import ConfigError

    parser = argparse.ArgumentParser(prog="python -m experiments.kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--max-fed", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=".")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the runner's config")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.max_fed < 1 or args.repeats < 1:
        print("error: --max-fed and --repeats must be >= 1", file=sys.stderr)
        return 2
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            config = OmegaConf.to_container(compose("config", overrides=args.overrides), resolve=True)
        report = compare(config, args.max_fed, args.repeats, log)
    except (ConfigError, DataError, HydraException) as error:
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
