"""What strategy `auto` chooses, and the options it cannot honour: the part of `experiments.auto` a run's
configuration (`experiments.run_config`) reads without measuring or predicting anything.

    choice.record()                                   # what summary.json records under `auto`
    chosen_specs(specs, choice.stages, choice.tree_nodes)   # the chosen stages of a hierarchy
    check_auto_options(draft_confidence, value_stop)  # a ConfigError for what auto's predictions cannot model

`experiments.auto` makes the choice (`choose`, `AutoPipeline`) and re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from pipespec.errors import ConfigError
from pipespec.specs import StageSpec


@dataclass(frozen=True)
class AutoChoice:
    strategy: str
    lookahead: int
    max_lead: int
    stages: tuple[int, ...]  # positions of the stages to run in the given hierarchy (greedy: the target)
    predicted_tokens_per_s: float
    runners_up: tuple[dict, ...]
    reason: str
    profile: str
    tree_nodes: int = 0  # > 0: the first (model-free) stage proposes token trees of this size

    def record(self) -> dict[str, Any]:
        """What summary.json records under `auto` (`tree_nodes` only where it chose token trees)."""
        chosen = {"strategy": self.strategy, "lookahead": self.lookahead, "max_lead": self.max_lead,
                  "stages": list(self.stages), **({"tree_nodes": self.tree_nodes} if self.tree_nodes else {})}
        return {"chosen": chosen, "predicted_tokens_per_s": self.predicted_tokens_per_s,
                "runners_up": list(self.runners_up), "reason": self.reason, "profile": self.profile}  # fmt: skip

    def specs(self, specs: Sequence[StageSpec]) -> tuple[StageSpec, ...]:
        """The chosen stages of `specs` (the whole hierarchy), the first with the chosen `tree_nodes`."""
        return chosen_specs(specs, self.stages, self.tree_nodes)


def chosen_specs(specs: Sequence[StageSpec], stages: Sequence[int], tree_nodes: int = 0) -> tuple[StageSpec, ...]:
    """The stages at positions `stages` of `specs`, the first proposing token trees of `tree_nodes` (> 0)."""
    chosen = [specs[i] for i in stages]
    if tree_nodes:
        chosen[0] = replace(chosen[0], tree_nodes=tree_nodes)
    return tuple(chosen)


def check_auto_options(draft_confidence: float, value_stop: float = 0.0) -> None:
    """The options strategy auto leaves to the caller but cannot honour: its predictions have no model of them."""
    if draft_confidence:
        raise ConfigError(f"strategy auto cannot honour draft_confidence={draft_confidence!r}: its predictions have "
                          "no model of a drafter's own confidence (leave it 0)")  # fmt: skip
    if value_stop:
        raise ConfigError(f"strategy auto cannot honour value_stop={value_stop!r}: its predictions have no model "
                          "of a drafter stopping on its online estimates (leave it 0)")  # fmt: skip
