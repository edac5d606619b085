"""Offline comparison of the model-free drafters on recorded greedy outputs.

    python -m experiments.drafter_offline                 # record (cached) then simulate
    python -m experiments.drafter_offline --record-only   # only record the greedy outputs
    python -m experiments.drafter_offline --n 20          # 20 problems per dataset

1. Records the greedy outputs of the fp32 SmolLM2 target (chat prompts, as the
   runner builds them) on HumanEval and news_lee, `--new-tokens` each, into a
   JSON cache (`results/drafters/greedy_outputs.json`); a cached sample is not
   generated again.
2. Simulates, position by position along each greedy output, a drafter verified
   synchronously by the target: at each target pass the drafter proposes from
   prompt + output so far, the longest prefix equal to the greedy continuation
   is accepted, and the pass adds accepted + 1 tokens. Samples are processed in
   order; the suffix drafter sees an output only after its sample ends
   (`observe_output`), so its index holds the prompts and EARLIER outputs only.
3. Tunes the suffix drafter's confidence threshold on the first half of each
   dataset and reports every drafter on the second half (not tuned on).

Writes `results/drafters/offline.md` (tables) and `results/drafters/offline.json`
(raw figures). Tokens per target pass counts what a free drafter would buy; it
is not a speed: each verification costs more than a plain step on a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from experiments import compose
from experiments.data import prompts_for
from experiments.hierarchies import resolve_stage
from pipespec.drafters import PromptLookup, SuffixDrafter, common_prefix
from pipespec.models import CausalLMRunner, context_length, eos_token_ids, load_model, load_tokenizer
from pipespec.tree import DraftTree

# torch, pipespec.decoding (torch) and experiments.profiler (numpy) are imported where a model runs: the
# simulation over recorded outputs imports none of them.

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "results" / "drafters"
CACHE = OUT_DIR / "greedy_outputs.json"
DATASETS = {"humaneval": "humaneval", "news_lee": "news_lee_cnndm"}  # conf/dataset/*.yaml


# ---- 1. recording -----------------------------------------------------------------------


def load_cache(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"max_new_tokens": None, "datasets": {}}


def record(n: int, max_new_tokens: int, cache_path: Path) -> dict[str, Any]:
    """Greedy outputs of fp32 SmolLM2, cached per sample (the file is rewritten after each)."""
    import torch

    from pipespec.decoding import greedy_generate

    torch.set_num_threads(1)
    cache = load_cache(cache_path)
    if cache["max_new_tokens"] not in (None, max_new_tokens):
        raise SystemExit(f"{cache_path} holds {cache['max_new_tokens']}-token outputs; delete it to re-record")
    cache["max_new_tokens"] = max_new_tokens
    spec = resolve_stage({"model": "smollm2", "name": "smollm2-fp32"})
    cache["model"] = "smollm2 (fp32, SmolLM2-135M-Instruct)"
    tokenizer = load_tokenizer(spec.model)
    eos = eos_token_ids(spec.model)
    runner = CausalLMRunner(load_model(spec))
    window = context_length(spec.model)
    for name, file in DATASETS.items():
        found = prompts_for(compose.load("dataset", file), tokenizer, "chat", window, max_new_tokens, count=n)
        done = {s["sample_id"]: s for s in cache["datasets"].get(name, [])}
        samples = []
        for prompt in found.prompts:
            if prompt.sample_id not in done:
                started = time.perf_counter()
                output = greedy_generate(runner, prompt.ids, max_new_tokens, eos)
                seconds = time.perf_counter() - started
                done[prompt.sample_id] = {"sample_id": prompt.sample_id, "prompt_ids": prompt.ids, "output_ids": output}
                print(f"{name} {prompt.sample_id}: {len(output)} tokens, {len(output) / seconds:.1f} tok/s", flush=True)
                cache["datasets"][name] = list(done.values())
                cache_path.parent.mkdir(parents=True, exist_ok=True)
                cache_path.write_text(json.dumps(cache))
            samples.append(done[prompt.sample_id])
        chosen = {s["sample_id"] for s in samples}
        # in dataset order (the order the simulation replays), then any recorded for a larger --n
        cache["datasets"][name] = samples + [s for k, s in done.items() if k not in chosen]
    cache_path.write_text(json.dumps(cache))
    return cache


# ---- 2. verification cost t(n) ----------------------------------------------------------------


def measure_step_costs(cache: dict[str, Any], max_rows: int = 9, repeats: int = 15) -> list[float]:
    """Median CPU seconds of one fp32 target pass feeding n = 1..max_rows tokens after a real prompt (1 thread),
    in `repeats` sweeps over n (`experiments.profiler.interleaved_step_costs`).

    CPU time, not wall-clock: on a shared machine other processes preempt this one; they still share
    its memory bandwidth and caches, so the figures are an estimate of a quiet machine's, not a measure.
    """
    import torch

    from experiments.profiler import interleaved_step_costs

    torch.set_num_threads(1)  # torch then runs on this thread: its CPU time is the pass's
    runner = CausalLMRunner(load_model(resolve_stage({"model": "smollm2"})))
    prompt = cache["datasets"]["humaneval"][0]["prompt_ids"]
    return interleaved_step_costs({"target": runner}, prompt, max_rows, repeats, clock=time.thread_time)["target"]


# ---- 3. simulation --------------------------------------------------------------------------------


@dataclass
class TreeReplay:
    """A suffix drafter whose proposals are token trees of up to `nodes` nodes (`propose_tree`); otherwise
    the drafter."""

    drafter: Any
    nodes: int

    def propose(self, sequence: Sequence[int], limit: int) -> DraftTree:
        return self.drafter.propose_tree(sequence, self.nodes, max_depth=limit)

    def __getattr__(self, name: str) -> Any:  # last_match, observe_output: the drafter's
        return getattr(self.drafter, name)


def kept_tokens(proposal: list[int] | DraftTree, continuation: Sequence[int]) -> int:
    """The proposed tokens the target keeps: a chain's longest prefix equal to the greedy continuation, a
    tree's longest path from its root that the continuation follows."""
    if isinstance(proposal, DraftTree):
        return len(proposal.follow(continuation))
    return common_prefix(proposal, continuation)


def simulate(samples: Sequence[dict], drafter, counted: range, costs: Sequence[float]) -> dict[str, Any]:
    """Replay the samples in order with `drafter` verified synchronously; count the samples in `counted`.

    At each target pass the drafter proposes after prompt + output so far (at most the tokens
    left minus one); the target keeps the longest prefix (a tree: path) equal to the greedy
    continuation and adds its own token; the pass costs t(tokens proposed + 1). After each sample the
    drafter observes the finished output.
    """
    passes = proposals = proposed = accepted = tokens = 0
    cost = 0.0
    by_match: dict[int, list[int]] = {}
    micros, first_micros, wall_micros = [], [], []
    for index, sample in enumerate(samples):
        prompt, output = sample["prompt_ids"], sample["output_ids"]
        count = index in counted
        i = 0
        first = True
        while i < len(output):
            sequence = prompt + output[:i]
            started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
            proposal = drafter.propose(sequence, len(output) - i - 1)  # a chain, or a TreeReplay's tree
            elapsed = (time.thread_time_ns() - started_cpu) / 1000  # CPU time: immune to other processes
            (first_micros if first else micros).append(elapsed)
            if not first:
                wall_micros.append((time.perf_counter_ns() - started) / 1000)
            first = False
            size, kept = len(proposal), kept_tokens(proposal, output[i:])
            if count:
                passes += 1
                tokens += kept + 1
                cost += costs[min(size, len(costs) - 1)]
                if size:
                    proposals += 1
                    proposed += size
                    accepted += kept
                    row = by_match.setdefault(drafter.last_match, [0, 0])
                    row[0] += 1
                    row[1] += int(kept > 0)
            i += kept + 1
        drafter.observe_output(prompt, output)
    return {
        "target_passes": passes,
        "tokens": tokens,
        "proposal_rate": proposals / passes if passes else None,  # passes with a proposal
        "proposed_per_proposal": proposed / proposals if proposals else None,
        "accepted_per_proposal": accepted / proposals if proposals else None,
        "acceptance_rate": accepted / proposed if proposed else None,
        "tokens_per_pass": tokens / passes if passes else None,
        "estimated_speedup": (tokens * costs[0] / cost) if cost else None,
        "first_token_acceptance_by_match": {str(k): {"proposals": v[0], "first_accepted": v[1] / v[0]}
                                            for k, v in sorted(by_match.items())},  # fmt: skip
        "propose_us": micros,
        "propose_wall_us": wall_micros,
        "first_propose_us": first_micros,
    }


def drafter_factories(tuned: dict[str, Any] | None = None, shared: dict[str, Any] | None = None,
                      tree_nodes: int = 0, tree_tuned: dict[str, Any] | None = None,
                      tree_shared: dict[str, Any] | None = None) -> dict[str, Callable[[], Any]]:  # fmt: skip
    systems = {
        "prompt_lookup cap 8": lambda: PromptLookup(3, 8),
        "prompt_lookup cap 2": lambda: PromptLookup(3, 2),
        "suffix cap 8": lambda: SuffixDrafter(max_proposal=8),
    }
    if tuned is not None:
        systems["suffix tuned"] = lambda: SuffixDrafter(**tuned)
    if shared is not None:
        systems["suffix shared"] = lambda: SuffixDrafter(**shared)
    if tree_nodes and tree_tuned is not None:
        systems[f"suffix tree{tree_nodes} tuned"] = lambda: TreeReplay(SuffixDrafter(**tree_tuned), tree_nodes)
    if tree_nodes and tree_shared is not None:
        systems[f"suffix tree{tree_nodes} shared"] = lambda: TreeReplay(SuffixDrafter(**tree_shared), tree_nodes)
    return systems


SETTINGS = ("max_proposal", "min_match", "confidence")
TUNING_GRID = [
    {"max_proposal": cap, "min_match": m, "confidence": c}
    for cap in (2, 4, 8) for m in (1, 2, 3) for c in (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
]  # fmt: skip
# trees: a node is kept while its estimated probability (the product of the shares along its path) reaches
# `confidence`, so lower thresholds than a chain's; depth 8 as the chains'
TREE_GRID = [{"max_proposal": 8, "min_match": m, "confidence": c} for m in (1, 2, 3) for c in (0.05, 0.1, 0.2, 0.3, 0.5)]


def tune(samples: Sequence[dict], half: int, costs: Sequence[float], grid: Sequence[dict] = TUNING_GRID,
         tree_nodes: int = 0) -> tuple[dict, list[dict]]:  # fmt: skip
    """The suffix settings of `grid` (chains, or trees of `tree_nodes`) with the best estimated speedup on the
    first `half` samples."""
    scored = []
    for params in grid:
        drafter = TreeReplay(SuffixDrafter(**params), tree_nodes) if tree_nodes else SuffixDrafter(**params)
        result = simulate(samples[:half], drafter, range(half), costs)
        scored.append({**params, "estimated_speedup": result["estimated_speedup"],
                       "tokens_per_pass": result["tokens_per_pass"]})  # fmt: skip
    best = max(scored, key=lambda r: (r["estimated_speedup"] or 0.0))
    return {k: best[k] for k in SETTINGS}, scored


def shared_setting(tuning: dict[str, tuple[dict, list[dict]]]) -> dict[str, Any]:
    """The one setting with the best product of estimated speedups over every dataset's tuning grid."""
    product: dict[tuple, float] = {}
    for _, grid in tuning.values():
        for row in grid:
            key = tuple(row[k] for k in SETTINGS)
            product[key] = product.get(key, 1.0) * (row["estimated_speedup"] or 0.0)
    return dict(zip(SETTINGS, max(product, key=product.get)))


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def simulate_all(
    cache: dict[str, Any], n: int, remeasure: bool = False, cache_path: Path = CACHE, costs_ms: Sequence[float] = (),
    tree_nodes: int = 0,
) -> dict[str, Any]:
    """Tune on each dataset's first half, then report every drafter on its second half.

    "suffix tuned" uses each dataset's own best settings; "suffix shared" the one setting with the
    best product of estimated speedups over both first halves (what a named hierarchy would use);
    with `tree_nodes`, "suffix treeN tuned / shared" the same for token trees of that many nodes.
    """
    if costs_ms:
        costs = [c / 1000 for c in costs_ms]
    else:
        costs = cache.get("step_costs_s")
        if not costs or remeasure:
            costs = cache["step_costs_s"] = measure_step_costs(cache)
            cache_path.write_text(json.dumps(cache))
    if not 0 <= tree_nodes < len(costs):
        raise SystemExit(f"--tree-nodes {tree_nodes} needs t(n) up to n = {tree_nodes + 1}: give that many "
                         f"--costs-ms (got {len(costs)})")  # fmt: skip
    report: dict[str, Any] = {"model": cache.get("model"), "max_new_tokens": cache["max_new_tokens"],
                              "step_costs_ms": [c * 1000 for c in costs],
                              "step_costs_source": "given (--costs-ms)" if costs_ms else "measured (CPU time)",
                              "tree_nodes": tree_nodes, "datasets": {}}  # fmt: skip
    chosen = {name: samples[:n] for name, samples in cache["datasets"].items()}
    tuning = {name: tune(samples, len(samples) // 2, costs) for name, samples in chosen.items()}
    report["shared"] = shared = shared_setting(tuning)
    trees = {name: tune(samples, len(samples) // 2, costs, TREE_GRID, tree_nodes)
             for name, samples in chosen.items()} if tree_nodes else {}  # fmt: skip
    report["tree_shared"] = tree_shared = shared_setting(trees) if trees else None
    for name, samples in chosen.items():
        half = len(samples) // 2
        tuned, grid = tuning[name]
        tree_tuned = trees[name][0] if trees else None
        factories = drafter_factories(tuned, shared, tree_nodes, tree_tuned, tree_shared)
        systems = {label: replay_summary(samples, make(), range(half, len(samples)), costs)
                   for label, make in factories.items()}  # fmt: skip
        report["datasets"][name] = {
            "samples": len(samples),
            "tuned_on": [s["sample_id"] for s in samples[:half]],
            "reported_on": [s["sample_id"] for s in samples[half:]],
            "tuned": tuned,
            "tuning_grid": grid,
            "tree_tuned": tree_tuned,
            "tree_tuning_grid": trees[name][1] if trees else None,
            "systems": systems,
        }
    return report


def replay_summary(samples: Sequence[dict], drafter, counted: range, costs: Sequence[float]) -> dict[str, Any]:
    """`simulate`'s figures with its per-proposal timings summarised (medians, p99)."""
    result = simulate(samples, drafter, counted, costs)
    micros = result.pop("propose_us")
    first = result.pop("first_propose_us")
    wall = result.pop("propose_wall_us")
    result["propose_wall_us_median"] = statistics.median(wall) if wall else None
    result["propose_wall_us_p99"] = percentile(wall, 0.99)
    result["propose_us_median"] = statistics.median(micros) if micros else None
    result["propose_us_p99"] = percentile(micros, 0.99)
    result["first_propose_us_median"] = statistics.median(first) if first else None  # indexes the prompt
    result["proposals_timed"] = len(micros)
    return result


def fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _cost_source(report: dict[str, Any]) -> str:
    """Where the report's t(n) came from, in words."""
    if str(report.get("step_costs_source", "")).startswith("given"):
        return "the step costs given on the command line (`--costs-ms`)"
    return "the median CPU time of an fp32 target pass of n tokens on this machine (1 thread, after a HumanEval prompt)"


def _tree_settings(report: dict[str, Any], data: dict[str, Any]) -> str:
    """The token-tree settings chosen, in words ('' without trees)."""
    tuned, shared = data.get("tree_tuned"), report.get("tree_shared")
    if not tuned or not shared:
        return ""
    nodes = report["tree_nodes"]
    return (f"; suffix tree{nodes} tuned: min_match {tuned['min_match']}, confidence {tuned['confidence']}; "
            f"suffix tree{nodes} shared: min_match {shared['min_match']}, confidence {shared['confidence']}")


def markdown(report: dict[str, Any]) -> str:
    costs = report["step_costs_ms"]
    lines = [
        "# Model-free drafters, offline",
        "",
        f"Greedy outputs of {report['model']}, chat prompts, {report['max_new_tokens']} new tokens, replayed "
        "position by position with the drafter verified synchronously by the target (`python -m "
        "experiments.drafter_offline`). Samples run in order; the suffix index holds the current prompt + output "
        "and the outputs of EARLIER samples only. The suffix drafter's settings are tuned on the first half of "
        "each dataset; every figure below is on the second half (not tuned on), with the index holding all "
        "earlier outputs.",
        "",
        "- proposal rate: target passes that had a proposal; accepted/proposal: mean accepted tokens per "
        "non-empty proposal (a tree: nodes proposed, tokens on the path kept); tokens/pass: (accepted + 1) per "
        "target pass;",
        "- est. speedup: tokens x t(1) / sum of t(proposal + 1) over passes, with t(n) " + _cost_source(report)
        + ": " + ", ".join(f"{c:.1f}" for c in costs) + " ms for n = 1.." + str(len(costs))
        + ". An estimate for a free drafter, not a measured speed.",
        "- propose µs: CPU time (thread) per proposal, the first of each request excluded (it indexes the "
        "prompt: column 'first'); wall-clock figures, which include preemption by other processes on a "
        "shared machine, are in offline.json.",
        "",
    ]  # fmt: skip
    for name, data in report["datasets"].items():
        tuned = data["tuned"]
        lines += [
            f"## {name}: {data['samples']} samples, reported on the last {len(data['reported_on'])}",
            "",
            f"suffix tuned (on the first {len(data['tuned_on'])}): max_proposal {tuned['max_proposal']}, "
            f"min_match {tuned['min_match']}, confidence {tuned['confidence']}; suffix shared (best product over "
            f"both datasets' first halves): max_proposal {report['shared']['max_proposal']}, min_match "
            f"{report['shared']['min_match']}, confidence {report['shared']['confidence']}" + _tree_settings(report, data),
            "",
            "| drafter | proposal rate | proposed/proposal | accepted/proposal | acceptance | tokens/pass "
            "| est. speedup | propose µs median | p99 | first |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]  # fmt: skip
        for label, r in data["systems"].items():
            lines.append(
                f"| {label} | {fmt(r['proposal_rate'])} | {fmt(r['proposed_per_proposal'])} | "
                f"{fmt(r['accepted_per_proposal'])} | {fmt(r['acceptance_rate'])} | {fmt(r['tokens_per_pass'])} | "
                f"{fmt(r['estimated_speedup'])} | {fmt(r['propose_us_median'], '.0f')} | "
                f"{fmt(r['propose_us_p99'], '.0f')} | {fmt(r['first_propose_us_median'], '.0f')} |"
            )
        lines += ["", "First proposed token accepted, by match length (proposals):", "",
                  "| drafter | " + " | ".join(f"match {k}" for k in range(1, 9)) + " |",
                  "|---|" + "---|" * 8]  # fmt: skip
        for label, r in data["systems"].items():
            cells = []
            for k in range(1, 9):
                row = r["first_token_acceptance_by_match"].get(str(k))
                cells.append(f"{row['first_accepted']:.2f} ({row['proposals']})" if row else "-")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_report(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "offline.json").write_text(json.dumps(report, indent=1))
    (out / "offline.md").write_text(markdown(report))
    print(markdown(report))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="problems per dataset")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--record-only", action="store_true")
    parser.add_argument("--remeasure", action="store_true", help="measure t(n) again (the cache keeps the last)")
    parser.add_argument("--costs-ms", default="", help="t(1),t(2),... in ms (e.g. from a quiet machine) instead")
    parser.add_argument("--tree-nodes", type=int, default=0,
                        help="also tune and report the suffix drafter proposing token trees of this many nodes")
    args = parser.parse_args(argv)
    if args.tree_nodes < 0:
        parser.error(f"--tree-nodes must be >= 0, got {args.tree_nodes}")
    cache = record(args.n, args.new_tokens, args.cache)
    if args.record_only:
        return 0
    costs_ms = [float(c) for c in args.costs_ms.split(",") if c.strip()]
    report = simulate_all(cache, args.n, args.remeasure, args.cache, costs_ms, args.tree_nodes)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
