"""Predictions from a machine profile: one configuration (`predict_profile`, its speedup over greedy from the
same profile and the paper's model beside: Eq. 4 / 5 with alpha the mean of the last pair's rates by
position and gamma the lookahead (sd) or max_lead (pipespec), `paper_profile_counts` for its counts), and
the sweep (`sweep`): greedy, sd windows `SD_WINDOWS` and pipespec `LOOKAHEADS` x `MAX_LEADS` on every
subset of the stages that keeps the target, with every measured tree size where the first stage is
model-free. `draft_confidence` and `value_stop` are refused. docs/prediction.md, "Predict".
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import replace
from typing import Sequence

from analysis.fit import paper_tokens_per_s
from analysis.predict.hierarchy import Hierarchy, check_stages, subset_pairs
from analysis.predict.prediction import Prediction, predict
from analysis.profile import Profile
from pipespec.errors import ConfigError
from pipespec.schedule import DEFAULT_MAX_LEAD, check_options


SD_WINDOWS = tuple(range(1, 9))  # the sweep's sd windows
LOOKAHEADS = (0, 1, 2, 4)  # the sweep's pipespec lookaheads ...
MAX_LEADS = (4, 8, 16)  # ... times these max_leads


def paper_alpha_gamma(profile: Profile, stages: Sequence[int], strategy: str, lookahead: int,
                      max_lead: int) -> tuple[float, int]:  # fmt: skip
    """The paper model's alpha (the mean of the last pair's per-position rates) and gamma (the lookahead in
    sd, max_lead in pipespec) for a configuration on the profile's `stages`."""
    alpha = statistics.mean(subset_pairs(profile, stages)[-1].acceptance_by_position)
    return alpha, lookahead if strategy == "sd" else max(max_lead, lookahead)


def paper_profile_tokens_per_s(profile: Profile, hierarchy: Hierarchy, strategy: str, lookahead: int,
                               max_lead: int) -> float:  # fmt: skip
    """The paper's model for a profile's sd or pipespec configuration: alpha the mean of the last pair's
    per-position rates, gamma the lookahead (sd) or max_lead (pipespec), t(1) from the profile."""
    t_target = hierarchy.stages[-1].cost(1)
    alpha, gamma = paper_alpha_gamma(profile, hierarchy.stage_positions, strategy, lookahead, max_lead)
    if not gamma:
        return 1.0 / t_target
    return paper_tokens_per_s(strategy, t_target, alpha, gamma, hierarchy.stages[-2].cost(1))


def paper_profile_counts(profile: Profile, stages: Sequence[int], strategy: str, lookahead: int,
                         max_lead: int) -> dict[str, float] | None:  # fmt: skip
    """The paper model's timing-free counts of the target for an sd or pipespec configuration (alpha, gamma:
    `paper_alpha_gamma`): tokens per verification (Eq. 1's verification term), target steps per generated
    token (sd: every step a verification; pipespec: one over Eq. 4) and the verification fraction (sd 1,
    pipespec Eq. 3's rho). None for greedy or a window of 0."""
    from analysis import paper_model as pm

    if strategy == "greedy":
        return None
    alpha, gamma = paper_alpha_gamma(profile, stages, strategy, lookahead, max_lead)
    if not gamma:
        return None
    per_verify = pm.expected_tokens_per_verify(alpha, gamma)
    per_step = per_verify if strategy == "sd" else pm.pipespec_tokens_per_step(alpha, gamma)
    rho = 1.0 if strategy == "sd" else pm.steady_state_rho(alpha, gamma)
    return {"mean_acceptance_length": per_verify, "target_steps_per_token": 1 / per_step, "verify_fraction": rho}


def predict_profile(profile: Profile, strategy: str = "pipespec", lookahead: int = 0,
                    max_lead: int = DEFAULT_MAX_LEAD, tokens: int = 128, stages: Sequence[int] | None = None,
                    draft_confidence: float = 0.0, prompt_tokens: int | None = None, size_verification: bool = False,
                    value_stop: float = 0.0, tree_nodes: int = 0) -> Prediction:  # fmt: skip
    """The predicted throughput of one configuration from a profile, prompt processing included
    (`prompt_tokens` per generation; None: the profile's mean prompt length); `stages`: a subset of the
    profile's (default all); `tree_nodes` > 0: its model-free first stage proposes token trees of that
    size (`tree_acceptance`). The paper's model is given beside (for chains)."""
    if draft_confidence or value_stop:
        check_options(strategy, len(profile.stages), lookahead, max_lead, draft_confidence, value_stop)
        what = "draft_confidence" if draft_confidence else "value_stop"
        raise ConfigError(f"{what} cannot be predicted: the simulator has no model of a drafter's own confidence "
                          f"or online estimates (leave it 0)")  # fmt: skip
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(f"tokens must be an integer >= 1, got {tokens!r}")
    if prompt_tokens is None:
        prompt_tokens = round(statistics.mean(profile.prompt_tokens)) if profile.prompt_tokens else 0
    if strategy == "greedy":  # the target alone: no contention
        check_options(strategy, len(profile.stages), lookahead, max_lead)
        stages = (len(profile.stages) - 1,)
    else:
        stages = check_stages(profile, stages)
        check_options(strategy, len(stages), lookahead, max_lead)
    tree_nodes = 0 if strategy == "greedy" else tree_nodes
    hierarchy = Hierarchy.from_profile(profile, stages, tree_nodes)
    prediction = predict(hierarchy, strategy, [tokens], [prompt_tokens], lookahead, max_lead,
                         size_verification=size_verification)  # fmt: skip
    paper = prediction.tokens_per_s if strategy == "greedy" else (
        paper_profile_tokens_per_s(profile, hierarchy, strategy, lookahead, max_lead))  # fmt: skip
    prediction = with_speedup(replace(prediction, paper_predicted_tokens_per_s=paper), profile, prompt_tokens)
    return replace(prediction, tree_nodes=tree_nodes)


def with_speedup(prediction: Prediction, profile: Profile, prompt_tokens: int) -> Prediction:
    """The prediction with its speedup over greedy (the target alone, the same tokens and prompt, from the
    same profile) and that speedup's interval."""
    greedy = prediction if prediction.strategy == "greedy" else predict(
        Hierarchy.from_profile(profile, (len(profile.stages) - 1,)), "greedy", [prediction.tokens], [prompt_tokens])
    base = greedy.tokens_per_s
    interval = prediction.tokens_per_s_interval
    return replace(prediction, speedup=prediction.tokens_per_s / base,
                   speedup_interval=None if interval is None else (interval[0] / base, interval[1] / base))


def stage_subsets(profile: Profile) -> tuple[list[tuple[int, ...]], list[str]]:
    """Every subset of >= 2 stages that keeps the target and can run (a model-free stage only first),
    and a note for each left out because the profile has no acceptance for one of its pairs."""
    last = len(profile.stages) - 1
    usable, notes = [], []
    for size in range(last, 0, -1):
        for drafters in itertools.combinations(range(last), size):
            stages = drafters + (last,)
            if any(profile.stages[i].model_free for i in stages[1:]):
                continue
            if subset_pairs(profile, stages) is None:
                names = " > ".join(profile.stages[i].name for i in stages)
                notes.append(f"left out {names}: the profile has no acceptance for one of its pairs "
                             "(measure it again to get skip_pairs)")  # fmt: skip
                continue
            usable.append(stages)
    return usable, notes


def configurations(profile: Profile) -> tuple[list[dict], list[str]]:
    """The sweep: greedy, then sd windows and pipespec lookahead x max_lead on every usable subset, each
    with chains and, where the subset's first stage is model-free and the profile measured its token
    trees, with every tree size measured (`tree_nodes`)."""
    subsets, notes = stage_subsets(profile)
    found = [{"strategy": "greedy", "lookahead": 0, "max_lead": DEFAULT_MAX_LEAD, "stages": None}]
    for stages in subsets:
        for trees in [0] + tree_sizes(profile, stages):
            tree = {"tree_nodes": trees} if trees else {}
            found += [{"strategy": "sd", "lookahead": w, "max_lead": DEFAULT_MAX_LEAD, "stages": stages, **tree}
                      for w in SD_WINDOWS]  # fmt: skip
            found += [{"strategy": "pipespec", "lookahead": la, "max_lead": lead, "stages": stages, **tree}
                      for la in LOOKAHEADS for lead in MAX_LEADS if lead >= la]  # fmt: skip
    return found, notes


def tree_sizes(profile: Profile, stages: Sequence[int]) -> list[int]:
    """The token-tree sizes the profile measured for the first pair of `stages` (none: its drafter is a model,
    or the profile has no tree measurements)."""
    if not profile.stages[stages[0]].model_free:
        return []
    return sorted(t.tree_nodes for t in subset_pairs(profile, stages)[0].tree_runs)


def sweep(profile: Profile, tokens: int = 128) -> tuple[list[Prediction], list[str]]:
    """Every configuration's prediction, best predicted tokens/s first (ties: the simpler one first)."""
    options, notes = configurations(profile)
    predictions = [predict_profile(profile, tokens=tokens, **o) for o in options]
    order = sorted(range(len(predictions)), key=lambda i: (-predictions[i].predicted_tokens_per_s, i))
    return [predictions[i] for i in order], notes
