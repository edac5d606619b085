"""The options of one `generate` call, validated once.

A `Pipeline` holds one `CallOptions`, its defaults, checked when the pipeline is made; each call
merges its own options over them (`CallOptions.merged`: an option left None keeps the default)
and `CallOptions.plan` turns the result into what the stages run: one `Role` per stage, the
sampling and the acceptance rule. Every bad value is a `ConfigError` naming the option, raised
before any message reaches a stage.
"""

from __future__ import annotations

import numbers
import secrets
from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

from pipespec.errors import ConfigError
from pipespec.protocol import Role
from pipespec.schedule import DEFAULT_MAX_LEAD, check_cascade, check_options, roles
from pipespec.specs import MODEL_FREE_KINDS
from pipespec.verify import Acceptance, Sampling, check_acceptance, check_sampling


@dataclass(frozen=True)
class CallPlan:
    """What one call runs: a role per stage (smallest first), its sampling (a concrete seed) and acceptance."""

    roles: list[Role]
    sampling: Sampling
    acceptance: Acceptance


@dataclass(frozen=True)
class CallOptions:
    """Strategy, schedule, sampling and acceptance of a call (`pipespec.schedule`, `pipespec.verify`)."""

    strategy: str = "pipespec"
    lookahead: int = 0
    max_lead: int = DEFAULT_MAX_LEAD
    draft_confidence: float = 0.0
    size_verification: bool = False
    cascade: bool = False  # the pipeline's default applies to pipespec calls only
    value_stop: float = 0.0
    timeout_s: float | None = None  # the whole call, its wait for a turn included (None: no limit)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None  # None: a fresh seed per call, recorded in the result
    acceptance: str = "exact"
    synthetic_rates: float | Sequence[float] | None = None
    forget_outputs: bool = False  # a suffix stage first drops the earlier outputs it indexed
    stages: Sequence[int] | None = None  # the stages this call runs (positions, the target last); None: all
    faults: Any = None  # tests only: a `pipespec.faults.FaultPlan` the named stage acts on

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def merged(self, **overrides) -> "CallOptions":
        """These defaults with a call's options on top (None keeps the default); unknown names refused."""
        unknown = sorted(set(overrides) - set(self.names()))
        if unknown:
            raise ConfigError(f"unknown generate option(s) {unknown}; expected some of {self.names()}")
        given = {k: v for k, v in overrides.items() if v is not None}
        if "cascade" not in given and self.cascade and given.get("strategy", self.strategy) != "pipespec":
            given["cascade"] = False  # a pipeline's cascade default is for its pipespec calls
        return replace(self, **given)

    def plan(self, stage_kinds: Sequence[str], stage_labels: Sequence[str] | None = None,
             stage_trees: Sequence[int] | None = None) -> CallPlan:  # fmt: skip
        """Check every option against the stages (their kinds, smallest first; `stage_trees`: each stage's
        `tree_nodes`, None: all 0) and return what they run."""
        chosen = self.chosen_stages(stage_kinds, stage_labels)
        kinds = [stage_kinds[i] for i in chosen]
        labels = [(stage_labels or stage_kinds)[i] for i in chosen]
        trees = None if stage_trees is None else [stage_trees[i] for i in chosen]
        plan = self._plan(kinds, labels, trees)
        return replace(plan, roles=spread_roles(plan.roles, chosen, len(stage_kinds)))

    def chosen_stages(self, stage_kinds: Sequence[str], stage_labels: Sequence[str] | None = None) -> list[int]:
        """The stage positions this call runs: `stages` checked (increasing positions ending with the target,
        a model-free stage only first), or all; greedy runs the target alone whatever `stages` says."""
        last = len(stage_kinds) - 1
        if self.strategy == "greedy" or self.stages is None:
            return list(range(last + 1))
        stages = list(self.stages) if isinstance(self.stages, (list, tuple, range)) else None
        if not stages or any(isinstance(i, bool) or not isinstance(i, int) for i in stages) or stages != sorted(
                set(stages)) or stages[0] < 0 or stages[-1] != last:  # fmt: skip
            raise ConfigError(f"stages must be increasing stage positions in 0..{last} ending with the target ({last}), "
                              f"got {self.stages!r}")  # fmt: skip
        if any(stage_kinds[i] in MODEL_FREE_KINDS for i in stages[1:]):
            names = stage_labels or stage_kinds
            free = next(names[i] for i in stages[1:] if stage_kinds[i] in MODEL_FREE_KINDS)
            raise ConfigError(f"stages {stages}: the model-free stage {free} can only be the first (it cannot verify)")
        if len(stages) < len(stage_kinds) and self.acceptance == "synthetic":
            raise ConfigError("acceptance='synthetic' runs every stage: its rates are per pair of the whole hierarchy "
                              f"(stages {stages} leave some out)")  # fmt: skip
        return stages

    def _plan(self, stage_kinds: Sequence[str], stage_labels: Sequence[str] | None,
              stage_trees: Sequence[int] | None) -> CallPlan:  # fmt: skip
        n = len(stage_kinds)
        check_timeout("timeout_s", self.timeout_s, optional=True)
        if not isinstance(self.forget_outputs, bool):
            raise ConfigError(f"forget_outputs must be true or false, got {self.forget_outputs!r}")
        check_options(self.strategy, n, self.lookahead, self.max_lead, self.draft_confidence, self.value_stop)
        check_cascade(self.strategy, n, self.cascade)
        if self.cascade and stage_kinds[0] not in MODEL_FREE_KINDS:
            first = stage_labels[0] if stage_labels else stage_kinds[0]
            raise ConfigError(f"cascade needs a model-free first stage ({' or '.join(MODEL_FREE_KINDS)}), got {first}")
        stage_roles = roles(self.strategy, n, self.lookahead, self.max_lead, self.draft_confidence,
                            self.size_verification, self.cascade, self.value_stop)  # fmt: skip
        seed = secrets.randbits(63) if self.seed is None else self.seed  # recorded: the call can be replayed
        sampling = check_sampling(self.temperature, self.top_k, self.top_p, seed)
        acceptance = check_acceptance(self.acceptance, self.synthetic_rates, n, sampling)
        self.check_trees(stage_trees, stage_kinds, stage_labels or stage_kinds)
        return CallPlan(stage_roles, sampling, acceptance)

    def check_trees(self, stage_trees: Sequence[int] | None, kinds: Sequence[str], names: Sequence[str]) -> None:
        """Token trees (`tree_nodes` > 0) are verified by the tree rule, which covers point-mass drafts only:
        refused from a model stage (its drafts follow its distribution, not a point mass), with synthetic
        acceptance (no tree rule) and with the cascade (its model stage would pass a tree on as a chain)."""
        trees = [name for name, nodes in zip(names, stage_trees or ()) if nodes]
        models = [name for name, kind, nodes in zip(names, kinds, stage_trees or ()) if nodes and kind not in
                  MODEL_FREE_KINDS]  # fmt: skip
        if models:
            raise ConfigError(f"stage option 'tree_nodes' is for model-free stages: stage {models[0]} is a model, "
                              "whose drafts are not point masses")  # fmt: skip
        if not trees or self.strategy == "greedy":
            return
        if self.acceptance == "synthetic":
            raise ConfigError(f"stage option 'tree_nodes' (stage {trees[0]}) cannot run with acceptance='synthetic': "
                              "synthetic acceptance has no rule for token trees (set tree_nodes 0)")  # fmt: skip
        if self.cascade:
            raise ConfigError(f"stage option 'tree_nodes' (stage {trees[0]}) cannot run with cascade: the cascade "
                              "passes proposals on as chains (set tree_nodes 0 or cascade false)")  # fmt: skip


def spread_roles(chosen_roles: Sequence[Role], stages: Sequence[int], n_stages: int) -> list[Role]:
    """The roles of the `stages` a call runs (in order), placed at their positions among all `n_stages`: the
    others idle, and each chosen stage names its neighbours among the chosen ones."""
    if len(stages) == n_stages:
        return list(chosen_roles)
    out = [Role()] * n_stages
    for j, (stage, role) in enumerate(zip(stages, chosen_roles)):
        out[stage] = replace(role, upstream=stages[j - 1] if role.has_upstream else None,
                             downstream=None if role.is_target else stages[j + 1])  # fmt: skip
    return out


def check_timeout(name: str, value, optional: bool = False) -> None:
    """A wait's limit: a number of seconds > 0 (or None where `optional`)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        allowed = "a number of seconds > 0" + (" or None (no limit)" if optional else "")
        raise ConfigError(f"{name} must be {allowed}, got {value!r}")
