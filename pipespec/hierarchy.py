"""The checks a hierarchy passes before any stage process starts, made once: `check_hierarchy(stages)`.

    checked = check_hierarchy(specs)        # refuses a hierarchy the model files do not allow
    checked.tokenizer, checked.eos_ids, checked.context_length   # the target's
    Pipeline(specs, checked=checked)        # checks the model files no more

The target must be a model and every model stage must share its tokenizer (`models.check_shared_vocabulary`,
which loads each model's tokenizer), a stage's `vocab_limit` must fit its vocabulary, `compile` needs a
working compiler, and a token tree must fit the target's context. A tool that needs the target's tokenizer
before it makes its pipeline (the runner builds its prompts with it) checks once and hands the result to
`Pipeline(..., checked=...)`; a pipeline not handed one checks its stages itself. A result also
covers a pipeline of some of the stages checked (`covers`: auto's choice of a subset, or of a model-free
stage's tree size), and may record call options already planned against the stages (`planned_with`), which
the pipeline then does not plan again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

from pipespec.models import check_compilers, check_shared_vocabulary, context_length, eos_token_ids
from pipespec.specs import StageSpec, check_tree_nodes

if TYPE_CHECKING:
    from pipespec.options import CallOptions


def _model_key(spec: StageSpec) -> tuple:
    """What the model-file checks of a stage depend on."""
    return spec.kind, spec.model, spec.vocab_limit, spec.compile


def _plan_key(specs: Sequence[StageSpec]) -> list[tuple]:
    """What `CallOptions.plan` reads of the stages: kinds, labels, tree sizes."""
    return [(s.kind, s.label, s.tree_nodes) for s in specs]


@dataclass(frozen=True)
class CheckedHierarchy:
    """A hierarchy that passed `check_hierarchy`, and what the checks read from its target."""

    stages: tuple[StageSpec, ...]  # the stages checked, smallest first, the target last
    tokenizer: Any  # the target's, which every model stage shares
    eos_ids: tuple[int, ...]  # the target's end-of-sequence ids
    context_length: int | None  # the target's context in tokens (None: its config does not say)
    call: CallOptions | None = None  # call options planned against `stages` already (None: none)

    def covers(self, specs: Sequence[StageSpec]) -> bool:
        """Whether these checks hold for a pipeline of `specs`: the same target, and model stages among the
        ones checked (a model-free stage's tree size is checked against the context by the pipeline)."""
        checked = {_model_key(s) for s in self.stages if s.kind == "hf"}
        return (bool(specs) and _model_key(specs[-1]) == _model_key(self.stages[-1])
                and all(_model_key(s) in checked for s in specs if s.kind == "hf"))  # fmt: skip

    def planned_with(self, call: CallOptions) -> "CheckedHierarchy":
        """These checks, recording that `call` has been planned against `stages` (`CallOptions.plan`), as
        `experiments.run_config.RunConfig.from_config` plans a run's options."""
        return replace(self, call=call)

    def planned(self, call: CallOptions, specs: Sequence[StageSpec]) -> bool:
        """Whether `call` is the options planned against stages that plan as `specs` do."""
        return self.call is not None and self.call == call and _plan_key(self.stages) == _plan_key(specs)


def check_hierarchy(specs: Sequence[StageSpec]) -> CheckedHierarchy:
    """Check what the model files must allow, before any stage process starts (the module docstring), and
    return the target's tokenizer, EOS ids and context length; a `ConfigError` names what to change."""
    specs = tuple(specs)
    tokenizer = check_shared_vocabulary(specs)
    check_compilers(specs)
    target = specs[-1].model
    eos_ids = tuple(eos_token_ids(target))
    context = context_length(target)
    for spec in specs:
        check_tree_nodes(spec, context)
    return CheckedHierarchy(specs, tokenizer, eos_ids, context)
