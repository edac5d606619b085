"""One additive statistics type for a stage's counts and times: every report pools with it.

Pure Python (no torch), so `analysis/` uses it on result files alone.

    stats = StageStats.from_trace(trace, output_tokens)      # one stage, one generation
    pooled = sum(per_sample_stats, StageStats())              # sums of counts and times
    pooled.mean_acceptance_length, pooled.draft_acceptance_rate

Counts add; ratios are derived from the sums (never means of ratios). The
headline names are the field's:

- mean acceptance length: tokens a verifier appends per verification, the
  accepted drafts plus its own token (bonus or correction): (accepted +
  verifications) / verifications. Spec-Bench's "#Mean accepted tokens", vLLM's
  mean acceptance length. 1.0 means every verification kept nothing.
- draft acceptance rate: accepted drafts / drafts offered for verification
  (vLLM's definition). Drafts offered after the first rejection of a
  verification count as offered, so this sits below the per-token acceptance
  probability alpha of the paper (`analysis.fit` estimates alpha).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Mapping

# per-stage dictionaries written before the statistics type used other names for the same counts
_OLD_NAMES = {"busy_s": "busy_time_s", "wall_s": "wall_time_s"}


def ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


@dataclass(frozen=True)
class StageStats:
    """Counts and times of one stage over one or more generations (add them to pool)."""

    steps: int = 0
    draft_steps: int = 0
    verify_steps: int = 0
    single_steps: int = 0
    offered: int = 0  # drafts offered to this stage as a verifier
    accepted: int = 0  # of those, kept (its own bonus / correction token not counted)
    produced: int = 0  # tokens its steps appended to its buffer
    busy_s: float = 0.0  # time inside steps
    wall_s: float = 0.0  # from the start to the end of its loop
    rollbacks: int = 0
    rollback_tokens: int = 0
    output_tokens: int = 0  # tokens the generation returned (the per-100-tokens base)

    def __add__(self, other: "StageStats") -> "StageStats":
        if not isinstance(other, StageStats):
            return NotImplemented
        return StageStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    __radd__ = __add__

    # ---- derived ratios -------------------------------------------------------------
    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens appended per verification, bonus (or correction) included."""
        return ratio(self.accepted + self.verify_steps, self.verify_steps)

    @property
    def draft_acceptance_rate(self) -> float | None:
        """Accepted drafts / drafts offered."""
        return ratio(self.accepted, self.offered)

    @property
    def mean_offered_per_verify(self) -> float | None:
        return ratio(self.offered, self.verify_steps)

    @property
    def verify_fraction(self) -> float | None:
        """Share of a verifier's steps that verified drafts (the paper's rho), against one-token steps."""
        return ratio(self.verify_steps, self.verify_steps + self.single_steps)

    @property
    def busy_fraction(self) -> float | None:
        return ratio(self.busy_s, self.wall_s)

    @property
    def mean_step_ms(self) -> float | None:
        return ratio(1000 * self.busy_s, self.steps)

    @property
    def rollbacks_per_100_tokens(self) -> float | None:
        return ratio(100 * self.rollbacks, self.output_tokens)

    @property
    def rollback_tokens_per_token(self) -> float | None:
        """This stage's tokens removed by rollbacks per generated token (its wasted drafting)."""
        return ratio(self.rollback_tokens, self.output_tokens)

    DERIVED = (
        "mean_acceptance_length", "draft_acceptance_rate", "mean_offered_per_verify", "verify_fraction",
        "busy_fraction", "mean_step_ms", "rollbacks_per_100_tokens", "rollback_tokens_per_token",
    )  # fmt: skip

    # ---- in and out ---------------------------------------------------------------
    @classmethod
    def from_trace(cls, trace, output_tokens: int) -> "StageStats":
        """From a `pipespec.trace.StageTrace` (rollbacks received after its last step included)."""
        steps = trace.steps
        kinds = steps["kind"]
        verify = [i for i, k in enumerate(kinds) if k == "verify"]
        return cls(
            steps=len(kinds),
            draft_steps=kinds.count("draft"),
            verify_steps=len(verify),
            single_steps=kinds.count("single"),
            offered=sum(steps["offered"][i] for i in verify),
            accepted=sum(steps["accepted"][i] for i in verify),
            produced=sum(steps["produced"]),
            busy_s=sum(e - s for s, e in zip(steps["t_start"], steps["t_end"])),
            wall_s=trace.end_time - trace.start_time,
            rollbacks=sum(steps["rollbacks"]) + trace.pending_rollbacks,
            rollback_tokens=sum(steps["rollback_tokens"]) + trace.pending_rollback_tokens,
            output_tokens=output_tokens,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StageStats":
        """From `as_dict()` output, or a per-stage dictionary an earlier version wrote (counts missing
        there are 0)."""
        values = {}
        for f in fields(cls):
            value = data.get(f.name, data.get(_OLD_NAMES.get(f.name, f.name)))
            values[f.name] = float(value or 0.0) if f.type == "float" else int(value or 0)
        return cls(**values)

    def as_dict(self, name: str | None = None) -> dict[str, Any]:
        """Counts and derived ratios, as written into sample records and summaries."""
        out: dict[str, Any] = {} if name is None else {"name": name}
        out.update(asdict(self))
        out.update({key: getattr(self, key) for key in self.DERIVED})
        return out


def pool(items: Iterable[StageStats]) -> StageStats:
    return sum(items, StageStats())
