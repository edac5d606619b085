"""Model card of the default CPU hierarchies, measured on this machine.

    python -m experiments.model_card --samples 20 --max-new-tokens 128 --write conf/models/README.md

For every named SmolLM2 hierarchy and each dataset (HumanEval, the news_lee stand-in
with the CNN/DM prompt, chat template applied), it runs greedy, sd and pipespec on
the same prompts and records per pair the acceptance rate and the mean accepted per
verification (from the sd traces: a fixed window, so the figures describe the pair,
not the pipeline's timing), the identical-to-greedy count of both strategies, and
tokens/s. It also times each model stage's forward over n = 1..16 new tokens onto a
200-token cache (median of repeats), and the CPU an idle stage uses while the target
decodes alone (greedy), which should be ~0: idle stages block, they do not spin.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import psutil
from tqdm import tqdm

from experiments.compose import load as load_conf
from experiments.data import prompts_for
from experiments.hierarchies import load_hierarchy
from experiments.hub import default_offline
from pipespec.stats import StageStats, pool

# torch, pipespec.api and pipespec.exported (torch), and experiments.profiler (numpy), are imported where a
# model runs: `--help` imports none of them.

HIERARCHIES = ("smollm2_int8_fp32", "smollm2_pld_int8_fp32", "smollm2_pld_fp32")
DATASETS = ("humaneval", "news_lee_cnndm")


def step_costs_ms(spec, context_tokens: int = 200, max_n: int = 16, repeats: int = 5) -> list[float]:
    """Median ms of one forward feeding n = 1..max_n new tokens onto a `context_tokens` cache of random
    tokens, in `repeats` sweeps over n (`experiments.profiler.interleaved_step_costs`)."""
    import torch

    from experiments.profiler import interleaved_step_costs
    from pipespec.exported import stage_runner

    torch.set_num_threads(spec.threads)
    runner = stage_runner(spec)[0]
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(100, 40000, (context_tokens + 1,), generator=generator).tolist()  # the cache + 1 fed
    return [1000 * t for t in interleaved_step_costs({spec.label: runner}, context, max_n, repeats)[spec.label]]


def idle_cpu_fraction(pipe, prompt_ids: list[int], max_new_tokens: int) -> float:
    """CPU seconds / wall seconds of the non-target stages while greedy decodes on the target."""
    idle = [psutil.Process(pid) for pid in pipe.pids[:-1]]
    before = [sum(p.cpu_times()[:2]) for p in idle]
    result = pipe.generate(prompt_ids, max_new_tokens, strategy="greedy")
    used = max(sum(p.cpu_times()[:2]) - b for p, b in zip(idle, before))
    return used / result.time_s


def measure_hierarchy(name: str, samples: int, max_new_tokens: int, sd_lookahead: int, progress) -> dict:
    from pipespec.api import Pipeline

    specs = load_hierarchy(name)
    rows = {}
    with Pipeline(specs) as pipe:
        for dataset in DATASETS:
            prompts = prompts_for(load_conf("dataset", dataset), pipe.tokenizer, "chat", pipe.context_length,
                                  max_new_tokens, count=samples).ids()  # fmt: skip
            runs = {"greedy": [], "sd": [], "pipespec": []}
            for ids in progress(prompts, desc=f"{name} {dataset}"):
                for strategy, lookahead in (("greedy", 0), ("sd", sd_lookahead), ("pipespec", 0)):
                    runs[strategy].append(pipe.generate(ids, max_new_tokens, strategy=strategy, lookahead=lookahead))
            rows[dataset] = summarize_runs(runs, len(specs))
        rows["idle_cpu"] = idle_cpu_fraction(pipe, prompts[0], max_new_tokens)
        names = pipe.names
    rows["stages"] = names
    return rows


def summarize_runs(runs: dict, n_stages: int) -> dict:
    greedy = [r.tokens for r in runs["greedy"]]
    out = {"n": len(greedy), "pairs": []}
    for stage in range(1, n_stages):
        stats = pool(StageStats.from_trace(r.stage_traces[stage], len(r.tokens)) for r in runs["sd"])
        out["pairs"].append(
            {"draft_acceptance_rate": stats.draft_acceptance_rate, "mean_acceptance_length": stats.mean_acceptance_length}
        )
    for strategy, results in runs.items():
        tokens = sum(len(r.tokens) for r in results)
        out[strategy] = {
            "tokens_per_s": tokens / sum(r.time_s for r in results),
            "identical": sum(r.tokens == g for r, g in zip(results, greedy)),
        }
    return out


def format_card(cards: dict, costs: dict, args) -> str:
    lines = [
        "# Model card: the default CPU hierarchies",
        "",
        "Regenerate: `.venv/bin/python -m experiments.model_card "
        f"--samples {args.samples} --max-new-tokens {args.max_new_tokens} --write conf/models/README.md` "
        "(2-core machine, one torch thread per stage; timings are noisy, compare within one run).",
        "",
        f"Acceptance per pair from `sd` traces (window {args.sd_lookahead}); tokens/s pooled over the prompts; "
        "identical = outputs equal to greedy fp32. news_lee is an offline stand-in for CNN/DM "
        "(real news, no reference summaries), run with the CNN/DM chat prompt.",
        "",
        "| hierarchy | dataset | pair | draft acceptance rate | mean acceptance length | greedy tok/s | sd tok/s | pipespec tok/s "
        "| identical sd | identical pipespec |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, card in cards.items():
        stages = card["stages"]
        for dataset in DATASETS:
            row = card[dataset]
            for i, pair in enumerate(row["pairs"]):
                acc = f"{pair['draft_acceptance_rate']:.2f}" if pair["draft_acceptance_rate"] is not None else "-"
                mean = f"{pair['mean_acceptance_length']:.2f}" if pair["mean_acceptance_length"] is not None else "-"
                speed = (
                    f"{row['greedy']['tokens_per_s']:.1f} | {row['sd']['tokens_per_s']:.1f} | "
                    f"{row['pipespec']['tokens_per_s']:.1f} | {row['sd']['identical']}/{row['n']} | "
                    f"{row['pipespec']['identical']}/{row['n']}"
                    if i == 0
                    else " | | | |"
                )
                lines.append(f"| {name} | {dataset} | {stages[i]} -> {stages[i + 1]} | {acc} | {mean} | {speed} |")
    lines += ["", "Idle stages (CPU seconds per wall second while the target decodes alone):", ""]
    for name, card in cards.items():
        lines.append(f"- {name}: {card['idle_cpu']:.3f}")
    lines += [
        "",
        "Step cost t(n), ms: one forward over n new tokens onto a 200-token cache (median of 5).",
        "",
        "| stage | " + " | ".join(f"n={n}" for n in range(1, 17)) + " |",
        "|---|" + "---|" * 16,
    ]
    for label, values in costs.items():
        lines.append(f"| {label} | " + " | ".join(f"{v:.0f}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    default_offline()  # offline unless the user set HF_HUB_OFFLINE & co. or the run names a hub id
    parser = argparse.ArgumentParser(description="measure and print the model card of the default hierarchies")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--sd-lookahead", type=int, default=4)
    parser.add_argument("--hierarchies", default=",".join(HIERARCHIES))
    parser.add_argument("--write", help="also write the Markdown card to this file (atomically)")
    args = parser.parse_args(argv)

    def progress(items, desc):
        return tqdm(items, desc=desc, file=sys.stderr)

    costs = {}
    for spec in load_hierarchy("smollm2_int8_fp32"):
        costs[spec.label] = step_costs_ms(spec)
    cards = {
        name: measure_hierarchy(name, args.samples, args.max_new_tokens, args.sd_lookahead, progress)
        for name in args.hierarchies.split(",")
    }
    card = format_card(cards, costs, args)
    print(card)
    if args.write:
        path = Path(args.write)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(card)
        os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
