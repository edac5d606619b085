"""Read a machine profile (`python -m experiments.profile`, `experiments.profiler`) without torch.

    python -m analysis.profile PROFILE.json      # what it holds, and whether it fits this machine

A file that is not a profile, or a corrupt one, is a `ProfileError` (the command prints one
`error:` line and exits 2). A profile measured on another machine, hierarchy or library version
loads, and `mismatches` names what differs (a warning; `auto` refuses it).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from analysis.fit import CostFit, fit_step_cost

FORMAT = "pipespec-profile"
VERSION = 2  # acceptance sampled along the decoding walk (`experiments.profiler`); 1: at fixed strides
MODEL_FREE_KINDS = ("prompt_lookup", "suffix")
IDENTITY_KEYS = ("kind", "model", "quantize", "dtype", "threads", "kernels", "vocab_limit", "compile")  # the same stage when these match
# profiles written before the `kernels` stage option ran torch's kernels; before `vocab_limit`, whole heads (0);
# before `compile`, eager models
IDENTITY_DEFAULTS = {"kernels": lambda kind: None if kind in MODEL_FREE_KINDS else "torch",
                     "vocab_limit": lambda kind: None if kind in MODEL_FREE_KINDS else 0,
                     "compile": lambda kind: None if kind in MODEL_FREE_KINDS else False}  # fmt: skip


class ProfileError(ValueError):
    """Not a readable pipespec profile; the message says what is wrong."""


@dataclass(frozen=True)
class StageProfile:
    name: str
    kind: str
    step_s_alone: tuple[float, ...]  # t(n), n = 1.. (empty for a model-free stage)
    step_s_loaded: tuple[float, ...]  # t(n) while the other model stages run
    prefill_s_per_token: float
    identity: tuple[tuple[str, Any], ...] = ()  # what the stage is (IDENTITY_KEYS)
    # how t(n) grows with the context a step attends to (`context_slopes`): the context step_s_alone was measured
    # at, and per step size measured, the share of t(n) each further token of context adds; () in profiles
    # measured before 2026-12-06 (their t(n) holds at every context)
    context_tokens: int = 0
    context_slopes: tuple[tuple[int, float], ...] = ()
    # the share a step costs more after the stage waited than right after its own step: 0 in every profile (t(n)
    # is timed back to back); a run learns it (`analysis.learn.StepCosts`)
    wake: float = 0.0

    @property
    def model_free(self) -> bool:
        return self.kind in MODEL_FREE_KINDS

    def cost_fit(self, other_model_stages: int) -> CostFit:
        """The one t(n) fit (`analysis.fit.fit_step_cost`) over alone and loaded points: its contention
        is the slowdown per other computing stage."""
        n = list(range(1, len(self.step_s_alone) + 1))
        others = [0] * len(n) + [other_model_stages] * len(n)
        return fit_step_cost(n + n, list(self.step_s_alone) + list(self.step_s_loaded), others)


@dataclass(frozen=True)
class PairProfile:
    drafter: str
    verifier: str
    acceptance_by_position: tuple[float, ...]  # P(draft p accepted | drafts before it accepted)
    proposal_rate: float  # share of starts where the drafter proposed anything
    mean_proposal_length: float
    # per continuation, per position: how many drafts in a row the drafter got right from there
    # (`experiments.profiler_acceptance.model_runs` / `proposal_runs`); empty in profiles measured before 2026-12-02
    runs: tuple[tuple[int, ...], ...] = ()
    # the standard error of each position's rate from the prompt-to-prompt spread (`acceptance_standard_errors`);
    # None where fewer than two continuations reached the position, () without runs
    acceptance_se_by_position: tuple[float | None, ...] = ()

    # a model-free drafter's token trees, one entry per tree size measured (`experiments.profiler_acceptance.tree_runs`);
    # empty in profiles measured without them
    tree_runs: tuple["TreeRuns", ...] = ()
    # a model-free drafter's proposals: per continuation, per position, how many drafts it proposed there
    # (0: none); empty for a model drafter (it always drafts) and in profiles measured without them
    proposed: tuple[tuple[int, ...], ...] = ()
    # the continuations the runs were read along: "target" (every pair along the target's greedy continuation,
    # a middle verifier keeping the drafts its own tokens there agree with) or "verifier" (each verifier's own
    # greedy continuation: profiles measured before 2026-12-06; the same runs for a pair whose verifier is the target)
    along: str = "verifier"

    @property
    def continuations(self) -> int:
        """How many continuations (one per profile prompt) the acceptance was measured along."""
        return len(self.runs)

    def tree(self, tree_nodes: int) -> "TreeRuns | None":
        """The measurement of the drafter's trees of `tree_nodes` nodes (None: not measured)."""
        return next((t for t in self.tree_runs if t.tree_nodes == tree_nodes), None)


@dataclass(frozen=True)
class TreeRuns:
    """A model-free drafter's token trees of up to `tree_nodes` nodes along the verifier's continuations:
    per continuation, per position, how deep the branch along the continuation goes (`runs`: the drafts a
    tree verification keeps there), how many nodes the tree holds (`nodes`), how many tokens its most likely
    path holds (`paths`: what the drafter appends to its buffer) and how many of them are kept
    (`path_runs`). `paths` and `path_runs` are empty in profiles measured without them."""

    tree_nodes: int
    runs: tuple[tuple[int, ...], ...]
    nodes: tuple[tuple[int, ...], ...]
    paths: tuple[tuple[int, ...], ...] = ()
    path_runs: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class Profile:
    path: str
    hierarchy: str
    stages: tuple[StageProfile, ...]
    pairs: tuple[PairProfile, ...]
    machine: dict
    sample_ids: tuple[str, ...]
    dataset: str | None
    handoff_s: float
    duration_s: float
    skip_pairs: tuple[tuple[int, int, PairProfile], ...] = ()  # (drafter, verifier, pair) of non-adjacent stages
    prompt_tokens: tuple[int, ...] = ()  # of the profile's prompts (prediction counts reading the prompt)

    @property
    def continuation_tokens(self) -> int | None:
        """The shortest continuation acceptance was read along (None: no pair has runs). A prediction of
        longer generations reads the positions past it from the continuations' start."""
        lengths = [len(along) for pair in self.pairs for along in pair.runs]
        return min(lengths) if lengths else None

    def pair(self, drafter: int, verifier: int) -> PairProfile | None:
        """Acceptance of stage `drafter`'s drafts by stage `verifier` (any later stage); None if not measured."""
        if verifier == drafter + 1:
            return self.pairs[drafter]
        return next((p for d, v, p in self.skip_pairs if (d, v) == (drafter, verifier)), None)


def _number(value: Any, where: str, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise ProfileError(f"{where} must be a finite number >= {minimum}, got {value!r}")
    return float(value)


def _numbers(value: Any, where: str, minimum: float = 0.0) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise ProfileError(f"{where} must be a list of numbers, got {type(value).__name__}")
    return tuple(_number(v, f"{where}[{i}]", minimum) for i, v in enumerate(value))


def stage_entry(data: dict, key: str) -> Any:
    """A profile stage entry's identity field, with the value older profiles imply where it is missing."""
    if key not in data and key in IDENTITY_DEFAULTS:
        return IDENTITY_DEFAULTS[key](data.get("kind", "hf"))
    return data.get(key)


def _stage(data: Any, i: int) -> StageProfile:
    where = f"stages[{i}]"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ProfileError(f"{where} must be an object with a name")
    kind = data.get("kind", "hf")
    identity = tuple((key, stage_entry(data, key)) for key in IDENTITY_KEYS)
    if kind in MODEL_FREE_KINDS:
        return StageProfile(data["name"], kind, (), (), 0.0, identity)
    alone = _numbers(data.get("step_s_alone"), f"{where}.step_s_alone")
    loaded = _numbers(data.get("step_s_loaded"), f"{where}.step_s_loaded")
    if not alone or len(alone) != len(loaded) or min(alone) <= 0:
        raise ProfileError(f"{where}: step_s_alone and step_s_loaded need the same number (>= 1) of positive times")
    prefill = _number(data.get("prefill_s_per_token"), f"{where}.prefill_s_per_token")
    return StageProfile(data["name"], kind, alone, loaded, prefill, identity,
                        *context_slopes(data.get("context_costs"), f"{where}.context_costs"))  # fmt: skip


def context_slopes(data: Any, where: str) -> tuple[int, tuple[tuple[int, float], ...]]:
    """A stage's ``context_costs`` ({"tokens": [short, long], "sizes": [n...], "seconds": [[at short...], [at
    long...]]}: t(n) at two contexts, measured side by side, `experiments.profiler.context_step_times`) as the
    short context and, per size, the share of t(n) each token of context adds: (long / short - 1) / (long tokens
    - short tokens), a ratio of times measured in the same minutes. Absent: (0, ())."""
    if data is None:
        return 0, ()
    tokens, sizes, seconds = (data.get(k) if isinstance(data, dict) else None for k in ("tokens", "sizes", "seconds"))
    if not (isinstance(tokens, list) and len(tokens) == 2 and all(isinstance(t, int) for t in tokens)
            and 0 <= tokens[0] < tokens[1]):  # fmt: skip
        raise ProfileError(f"{where}.tokens must be two context lengths, the shorter first")
    if not (isinstance(sizes, list) and sizes and all(isinstance(n, int) and n >= 1 for n in sizes)
            and sizes == sorted(set(sizes))):  # fmt: skip
        raise ProfileError(f"{where}.sizes must be ascending step sizes >= 1")
    if not (isinstance(seconds, list) and len(seconds) == 2):
        raise ProfileError(f"{where}.seconds must hold the step times at both contexts")
    short, long = (_numbers(row, f"{where}.seconds") for row in seconds)
    if len(short) != len(sizes) or len(long) != len(sizes) or min(short + long) <= 0:
        raise ProfileError(f"{where}.seconds needs one positive time per size at each context")
    span = tokens[1] - tokens[0]
    return tokens[0], tuple((n, (b / a - 1) / span) for n, a, b in zip(sizes, short, long))


def _pair(data: Any, i: int) -> PairProfile:
    where = f"pairs[{i}]"
    if not isinstance(data, dict):
        raise ProfileError(f"{where} must be an object")
    rates = data.get("acceptance_by_position")
    if not isinstance(rates, list) or not rates:
        raise ProfileError(f"{where}.acceptance_by_position must be a non-empty list")
    # a position no draft reached has no rate (None): it is treated as a rejection there
    clean = tuple(0.0 if r is None else _number(r, f"{where}.acceptance_by_position[{p}]") for p, r in enumerate(rates))
    if max(clean) > 1:
        raise ProfileError(f"{where}.acceptance_by_position holds a rate above 1")
    runs = data.get("runs") or []
    if not isinstance(runs, list) or not all(
        isinstance(along, list) and along and all(type(r) is int and r >= 0 for r in along) for along in runs
    ):  # fmt: skip
        raise ProfileError(f"{where}.runs must be a list of non-empty lists of counts >= 0")
    proposed = data.get("proposed")
    if proposed is not None and not (isinstance(proposed, list) and len(proposed) == len(runs) and all(
        isinstance(p, list) and len(p) == len(r) and all(type(n) is int and n >= 0 for n in p)
        for p, r in zip(proposed, runs)
    )):  # fmt: skip
        raise ProfileError(f"{where}.proposed must be null or one list of proposal lengths per continuation, "
                           "as long as its runs")  # fmt: skip
    return PairProfile(
        str(data.get("drafter")), str(data.get("verifier")), clean,
        _number(data.get("proposal_rate"), f"{where}.proposal_rate"),
        _number(data.get("mean_proposal_length"), f"{where}.mean_proposal_length"),
        tuple(tuple(along) for along in runs),
        acceptance_standard_errors(runs, proposed, len(clean)) if runs else (),
        tree_runs=_tree_runs(data, where),
        proposed=tuple(tuple(along) for along in proposed or ()),
        along=_along(data.get("along", "verifier"), where),
    )  # fmt: skip


def _along(value: Any, where: str) -> str:
    if value not in ("target", "verifier"):
        raise ProfileError(f"{where}.along must be \"target\" or \"verifier\", got {value!r}")
    return value


# ---- acceptance along the decoding walk ---------------------------------------------------------------


@dataclass(frozen=True)
class WalkCounts:
    """What the decoding walk along one continuation met: per draft position, drafts offered there (every
    earlier one accepted) and accepted; the starts (where decoding drafts again), how many of them had a
    proposal, and the proposals' summed length."""

    offered: tuple[int, ...]
    accepted: tuple[int, ...]
    starts: int
    proposals: int
    proposed_tokens: int


def walk_counts(along: Sequence[int], proposed: Sequence[int] | None, draft_k: int) -> WalkCounts:
    """The decoding walk along one continuation, from its per-position runs (`along[j]`: drafts in a row the
    drafter gets right from position j; `proposed[j]`: how many it proposed there, None: always `draft_k`).
    Drafts start where decoding would draft again: after the accepted prefix and the verifier's own token
    (the correction, or the bonus token), or one token on when the drafter had nothing."""
    offered, accepted = [0] * draft_k, [0] * draft_k
    starts = proposals = tokens = start = 0
    while start < len(along) - 1:
        k = min(draft_k, len(along) - start)
        k = k if proposed is None else min(k, proposed[start])
        run = min(along[start], k)
        starts, proposals, tokens = starts + 1, proposals + (k > 0), tokens + k
        for p in range(min(k, run + 1)):
            offered[p] += 1
            accepted[p] += p < run
        start += run + 1
    return WalkCounts(tuple(offered), tuple(accepted), starts, proposals, tokens)


def acceptance_standard_errors(runs: Sequence[Sequence[int]], proposed: Sequence[Sequence[int]] | None,
                               draft_k: int) -> tuple[float | None, ...]:  # fmt: skip
    """Per draft position, the standard error of its acceptance rate (accepted / offered, pooled over the
    continuations) from the prompt-to-prompt spread: the ratio estimator's cluster (delta-method) standard
    error, one cluster per continuation, sqrt(C / (C - 1) * sum_c (a_c - r o_c)^2) / sum_c o_c over the C
    continuations that offered a draft there; None where fewer than two did."""
    walks = [walk_counts(along, None if proposed is None else proposed[c], draft_k) for c, along in enumerate(runs)]
    errors: list[float | None] = []
    for p in range(draft_k):
        cells = [(w.offered[p], w.accepted[p]) for w in walks if w.offered[p]]
        offered = sum(o for o, _ in cells)
        if len(cells) < 2:
            errors.append(None)
            continue
        rate = sum(a for _, a in cells) / offered
        spread = sum((a - rate * o) ** 2 for o, a in cells) * len(cells) / (len(cells) - 1)
        errors.append(math.sqrt(spread) / offered)
    return tuple(errors)


def _tree_runs(data: Any, where: str) -> tuple[TreeRuns, ...]:
    """A pair's optional `tree_runs`: [{"tree_nodes": N, "runs": [[...]], "nodes": [[...]], "paths": [[...]],
    "path_runs": [[...]]}, ...] (`paths` and `path_runs` optional, together)."""
    entries = data.get("tree_runs") or []
    if not isinstance(entries, list):
        raise ProfileError(f"{where}.tree_runs must be a list")
    found = []
    for i, entry in enumerate(entries):
        entry = entry if isinstance(entry, dict) else {}
        size, runs, nodes = entry.get("tree_nodes"), entry.get("runs"), entry.get("nodes")
        if not (type(size) is int and size >= 1 and _counts_below(runs, nodes)):
            raise ProfileError(f"{where}.tree_runs[{i}] needs tree_nodes >= 1 and, per continuation, runs and "
                               "nodes of the same length with 0 <= run <= nodes")  # fmt: skip
        paths, path_runs = entry.get("paths"), entry.get("path_runs")
        if (paths is not None or path_runs is not None) and not (
            _counts_below(paths, nodes) and _counts_below(path_runs, paths) and _counts_below(path_runs, runs)
        ):  # fmt: skip
            raise ProfileError(f"{where}.tree_runs[{i}] needs paths and path_runs together, per continuation "
                               "of the runs' lengths, with 0 <= path_run <= path <= nodes and path_run <= run")
        found.append(TreeRuns(size, *(tuple(map(tuple, x or ())) for x in (runs, nodes, paths, path_runs))))
    return tuple(found)


def _counts_below(low: Any, high: Any) -> bool:
    """`low` and `high` are equally long non-empty lists of non-empty equally long lists of integers, each of
    `low` >= 0 and at most its counterpart in `high`."""
    return isinstance(low, list) and isinstance(high, list) and bool(low) and len(low) == len(high) and all(
        isinstance(a, list) and isinstance(b, list) and a and len(a) == len(b)
        and all(type(x) is int and type(y) is int and 0 <= x <= y for x, y in zip(a, b))
        for a, b in zip(low, high)
    )  # fmt: skip


def parse_profile(data: Any, path: str = "<profile>") -> Profile:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"{path} is not a pipespec profile (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        stale = " (version 1 sampled acceptance at fixed strides, which over-estimates it; measure it again: " \
                "python -m experiments.profile)" if data.get("version") == 1 else ""
        raise ProfileError(f"{path} is profile version {data.get('version')!r}; this reader knows version "
                           f"{VERSION}{stale}")  # fmt: skip
    stages = data.get("stages")
    pairs = data.get("pairs")
    if not isinstance(stages, list) or len(stages) < 1 or not isinstance(pairs, list):
        raise ProfileError(f"{path}: stages and pairs must be lists")
    parsed = tuple(_stage(s, i) for i, s in enumerate(stages))
    if len(pairs) != len(parsed) - 1:
        raise ProfileError(f"{path}: {len(parsed)} stages need {len(parsed) - 1} pairs, got {len(pairs)}")
    if parsed[-1].model_free:
        raise ProfileError(f"{path}: the target (last stage) must be a model")
    hierarchy = data.get("hierarchy")
    if not isinstance(hierarchy, dict) or not isinstance(hierarchy.get("name"), str):
        raise ProfileError(f"{path}: hierarchy.name missing")
    ids = data.get("sample_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ProfileError(f"{path}: sample_ids must be a list of strings")
    prompts = data.get("prompt_tokens") or []
    if not isinstance(prompts, list) or not all(isinstance(n, int) and n >= 0 for n in prompts):
        raise ProfileError(f"{path}: prompt_tokens must be a list of token counts")
    handoff = data.get("handoff_s")
    skip_pairs = data.get("skip_pairs") or []
    if not isinstance(skip_pairs, list):
        raise ProfileError(f"{path}: skip_pairs must be a list")
    skipping = []
    for i, entry in enumerate(skip_pairs):
        d, v = (entry.get(k) if isinstance(entry, dict) else None for k in ("drafter_index", "verifier_index"))
        if not (isinstance(d, int) and isinstance(v, int) and 0 <= d < v - 1 < len(parsed) - 1):
            raise ProfileError(f"{path}: skip_pairs[{i}] needs drafter_index < verifier_index - 1 within the stages")
        skipping.append((d, v, _pair(entry, i)))
    return Profile(
        path=path, hierarchy=hierarchy["name"], stages=parsed, pairs=tuple(_pair(p, i) for i, p in enumerate(pairs)),
        machine=data.get("machine") if isinstance(data.get("machine"), dict) else {}, sample_ids=tuple(ids),
        dataset=data.get("dataset"), handoff_s=0.0 if handoff is None else _number(handoff, "handoff_s"),
        duration_s=_number(data.get("duration_s", 0.0), "duration_s"), skip_pairs=tuple(skipping),
        prompt_tokens=tuple(prompts),
    )  # fmt: skip


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if path.is_dir():
        path = path / "profile.json"
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise ProfileError(f"cannot read {path}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ProfileError(f"{path} is not valid JSON ({error})") from None
    return parse_profile(data, str(path))


# ---- does it fit here? ----------------------------------------------------------------------------


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def this_machine() -> dict:
    """The facts a profile is compared on, read without importing torch."""
    return {"cpu": _cpu_name(), "torch": _version("torch"), "transformers": _version("transformers")}


def mismatches(profile: Profile, hierarchy: str | None = None, here: dict | None = None,
               stages: Sequence[dict] | None = None) -> list[str]:  # fmt: skip
    """What differs between the profile and this machine / the hierarchy to run; [] when it fits.
    `stages`: the stages to run, as mappings with the `IDENTITY_KEYS` (compared where the profile has them)."""
    here = this_machine() if here is None else here
    found = []
    if hierarchy is not None and hierarchy != profile.hierarchy:
        found.append(f"hierarchy: profile {profile.hierarchy!r}, run {hierarchy!r}")
    if stages is not None:
        found += _stage_mismatches(profile, stages)
    cpu = (profile.machine.get("cpu") or {}).get("name")
    if here.get("cpu") and cpu and cpu != here["cpu"]:
        found.append(f"cpu: profile {cpu!r}, here {here['cpu']!r}")
    libraries = profile.machine.get("libraries") or {}
    for name in ("torch", "transformers"):
        if here.get(name) and libraries.get(name) and libraries[name] != here[name]:
            found.append(f"{name}: profile {libraries[name]}, here {here[name]}")
    return found


def _stage_mismatches(profile: Profile, stages: Sequence[dict]) -> list[str]:
    if len(stages) != len(profile.stages):
        return [f"stages: profile has {len(profile.stages)}, run has {len(stages)}"]
    found = []
    for i, (measured, run) in enumerate(zip(profile.stages, stages)):
        for key, value in measured.identity:
            if value is not None and run.get(key) is not None and run.get(key) != value:
                found.append(f"stage {i} {key}: profile {value!r}, run {run.get(key)!r}")
    return found


def format_rates(pair: PairProfile) -> str:
    """'0.81+-0.04 0.77+-0.06 ... (standard errors over 10 prompts)': each position's rate and its
    standard error where the profile has one."""
    errors = pair.acceptance_se_by_position or (None,) * len(pair.acceptance_by_position)
    rates = " ".join(f"{r:.2f}" + ("" if e is None else f"+-{e:.2f}")
                     for r, e in zip(pair.acceptance_by_position, errors))  # fmt: skip
    known = any(e is not None for e in errors)
    return rates + (f" (standard errors over {pair.continuations} prompts)" if known else "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m analysis.profile PROFILE.json", file=sys.stderr)
        return 2
    try:
        profile = load_profile(argv[0])
    except ProfileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for problem in mismatches(profile):
        print(f"warning: profile from elsewhere: {problem}", file=sys.stderr)
    print(f"{profile.path}: hierarchy {profile.hierarchy}, {len(profile.sample_ids)} prompts of {profile.dataset}, "
          f"measured in {profile.duration_s:.0f} s, handoff {1000 * profile.handoff_s:.2f} ms")  # fmt: skip
    model_stages = sum(not s.model_free for s in profile.stages)
    for stage in profile.stages:
        if stage.model_free:
            print(f"  {stage.name}: model-free")
            continue
        fit = stage.cost_fit(model_stages - 1)
        print(f"  {stage.name}: t(1) {1000 * stage.step_s_alone[0]:.2f} ms, t(n) = {1000 * fit.fixed:.2f} + "
              f"{1000 * fit.per_token:.3f} n ms, contention {fit.contention:.2f} per other stage")  # fmt: skip
        if stage.context_slopes:
            grows = ", ".join(f"t({n}) +{100 * 100 * share:.1f}%" for n, share in stage.context_slopes)
            print(f"    per 100 tokens of context beyond {stage.context_tokens}: {grows}")
    for pair in profile.pairs + tuple(p for _, _, p in profile.skip_pairs):
        print(f"  {pair.drafter} -> {pair.verifier}: acceptance by position {format_rates(pair)}; proposes "
              f"{pair.proposal_rate:.0%} of the time, {pair.mean_proposal_length:.1f} tokens")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
