"""The one trace format, written by every stage of every strategy and read by analysis.

Pure Python (no torch), so `analysis/` can read traces from result files alone.

A stage trace is a table of steps, one row per forward pass (or prompt-lookup
proposal), stored column-wise:
- `t_start`, `t_end`: seconds (a clock shared by the processes of one machine)
- `kind`: "draft" (a drafter appended tokens of its own), "verify" (a verifier
  checked `offered` > 0 drafts) or "single" (a verifier with no drafts took a
  one-token step)
- `fed`: tokens fed to the model in that pass (0 for prompt lookup)
- `offered`, `accepted`: drafts offered to / accepted by this verifier (the
  verifier's own correction or bonus token is not counted in `accepted`)
- `produced`: tokens this step appended to the stage's buffer
- `rollbacks`, `rollback_tokens`: rollbacks received since the previous step
  and how many of this stage's tokens they removed

A stage on a GPU also carries `gpu`: per GPU it runs on, the NVML samples
(time on the same clock, utilisation, memory, power) of the request
(`pipespec.gpu.GpuSampler.window`); absent on CPU stages and in older traces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipespec.stats import StageStats

STEP_KINDS = ("draft", "verify", "single")
COLUMNS = ("t_start", "t_end", "kind", "fed", "offered", "accepted", "produced", "rollbacks", "rollback_tokens")


@dataclass
class StageTrace:
    stage: int
    name: str
    start_time: float = 0.0
    end_time: float = 0.0
    steps: dict[str, list] = field(default_factory=lambda: {c: [] for c in COLUMNS})
    pending_rollbacks: int = 0
    pending_rollback_tokens: int = 0
    gpu: list[dict] | None = None  # per GPU of the stage, its samples in this request (`pipespec.gpu`)

    def note_rollback(self, tokens_removed: int) -> None:
        self.pending_rollbacks += 1
        self.pending_rollback_tokens += tokens_removed

    def record(self, t_start: float, t_end: float, kind: str, fed: int, offered: int, accepted: int, produced: int):
        row = (t_start, t_end, kind, fed, offered, accepted, produced, self.pending_rollbacks, self.pending_rollback_tokens)
        for column, value in zip(COLUMNS, row):
            self.steps[column].append(value)
        self.pending_rollbacks = 0
        self.pending_rollback_tokens = 0

    @property
    def n_steps(self) -> int:
        return len(self.steps["kind"])

    def to_dict(self) -> dict[str, Any]:
        # rollbacks received after the last step still count
        return {
            "stage": self.stage,
            "name": self.name,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "steps": self.steps,
            "trailing_rollbacks": self.pending_rollbacks,
            "trailing_rollback_tokens": self.pending_rollback_tokens,
            **({"gpu": self.gpu} if self.gpu is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StageTrace":
        missing = [c for c in COLUMNS if c not in data.get("steps", {})]
        if missing:
            raise ValueError(f"not a pipespec stage trace: missing step columns {missing}")
        trace = cls(stage=data["stage"], name=data["name"], start_time=data["start_time"], end_time=data["end_time"])
        trace.steps = {c: list(data["steps"][c]) for c in COLUMNS}
        trace.pending_rollbacks = data.get("trailing_rollbacks", 0)
        trace.pending_rollback_tokens = data.get("trailing_rollback_tokens", 0)
        trace.gpu = data.get("gpu")  # absent in traces of CPU stages and of older runs
        return trace


def summarize_stage(trace: StageTrace, output_tokens: int) -> dict[str, Any]:
    """Per-stage counts and ratios of one generation (`pipespec.stats.StageStats`; None where a ratio
    does not apply to the stage)."""
    return StageStats.from_trace(trace, output_tokens).as_dict(trace.name)


def summarize(stage_traces: list[StageTrace], output_tokens: int) -> list[dict[str, Any]]:
    return [summarize_stage(t, output_tokens) for t in stage_traces]


def format_summary(summaries: list[dict[str, Any]]) -> str:
    """A small fixed-width table of the per-stage summary: steps, verification fraction, mean
    acceptance length (bonus included), draft acceptance rate, busy fraction, rollbacks per 100 tokens."""
    header = f"{'stage':<28}{'steps':>7}{'verify':>8}{'acc.len':>9}{'accept':>8}{'busy':>7}{'rb/100t':>9}"
    lines = [header]
    for s in summaries:
        def fmt(value, spec):
            width = spec.split(".")[0].lstrip(">")
            return format(value, spec) if value is not None else format("-", f">{width}")

        lines.append(
            f"{s['name'][:27]:<28}{s['steps']:>7}{fmt(s['verify_fraction'], '>8.2f')}"
            f"{fmt(s['mean_acceptance_length'], '>9.2f')}{fmt(s['draft_acceptance_rate'], '>8.2f')}"
            f"{fmt(s['busy_fraction'], '>7.2f')}{fmt(s['rollbacks_per_100_tokens'], '>9.1f')}"
        )
    return "\n".join(lines)
