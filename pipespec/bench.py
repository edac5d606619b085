"""Side-by-side benchmark: greedy, sd and pipespec tokens/s on one pipeline, in one run.

    python -m pipespec.bench --models smollm2_pld_int8_fp32 --samples 5 --max-new-tokens 64

Systems alternate per prompt (greedy, sd, pipespec, greedy, ...) so drift on a
noisy machine hits all of them alike. Prints pooled tokens/s (sum of tokens /
sum of time), the ratio to greedy, whether every output equals greedy's, and
the per-stage trace summary of each speculative strategy.
"""

from __future__ import annotations

import argparse
import os
import sys
from statistics import median


def humaneval_prompts(n: int) -> list[str]:
    from pipespec.data import load_dataset

    dataset = load_dataset({"name": "humaneval", "loader": "humaneval", "n_samples": n})
    return [s.source for s in dataset.samples]


def run(models: str, samples: int, max_new_tokens: int, sd_lookahead: int, pipespec_lookahead: int, max_lead: int):
    from tqdm import tqdm

    from pipespec.api import Pipeline
    from pipespec.hierarchies import load_hierarchy

    systems = [("greedy", 0), ("sd", sd_lookahead), ("pipespec", pipespec_lookahead)]
    prompts = humaneval_prompts(samples)
    results: dict[str, list] = {name: [] for name, _ in systems}
    with Pipeline(load_hierarchy(models), max_lead=max_lead) as pipe:
        pipe.generate(prompts[0], 8, strategy="pipespec")  # warm-up: first-call allocations
        for prompt in tqdm(prompts, desc="prompts", file=sys.stderr):
            for name, lookahead in systems:
                results[name].append(pipe.generate(prompt, max_new_tokens, strategy=name, lookahead=lookahead))
        names = pipe.names
    greedy_tokens = [r.tokens for r in results["greedy"]]
    greedy_rate = sum(len(t) for t in greedy_tokens) / sum(r.time_s for r in results["greedy"])
    print(f"models: {models} ({' -> '.join(names)}), {samples} HumanEval prompts, {max_new_tokens} new tokens")
    print(f"{'strategy':<10}{'lookahead':>10}{'tokens/s':>10}{'median':>9}{'vs greedy':>11}{'identical':>11}")
    for name, lookahead in systems:
        runs = results[name]
        rate = sum(len(r.tokens) for r in runs) / sum(r.time_s for r in runs)
        per_prompt = median(len(r.tokens) / r.time_s for r in runs)
        identical = sum(r.tokens == g for r, g in zip(runs, greedy_tokens))
        print(
            f"{name:<10}{lookahead:>10}{rate:>10.1f}{per_prompt:>9.1f}{rate / greedy_rate:>10.2f}x"
            f"{identical:>8}/{len(runs)}"
        )
    for name, _ in systems[1:]:
        print(f"\n{name}: per-stage trace summary (first prompt)")
        print(results[name][0].format_summary())
    return results


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description="greedy vs sd vs pipespec, side by side")
    parser.add_argument("--models", default="smollm2_pld_int8_fp32", help="a hierarchy in conf/models/")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sd-lookahead", type=int, default=4, help="sd draft window")
    parser.add_argument("--pipespec-lookahead", type=int, default=0, help="pipespec minimum lead")
    parser.add_argument("--max-lead", type=int, default=8)
    args = parser.parse_args(argv)
    from pipespec.api import StageError
    from pipespec.models import ConfigError

    try:
        run(args.models, args.samples, args.max_new_tokens, args.sd_lookahead, args.pipespec_lookahead, args.max_lead)
    except (ConfigError, StageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
