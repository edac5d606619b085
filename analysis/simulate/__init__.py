"""Discrete-event simulator of PipeSpec, synchronous (tiered) chain SD and autoregressive decoding (no torch).

Pure Python + numpy, deterministic under a seed; both schedules run the engine's own rules
(`pipespec.schedule`, `pipespec.buffers`). What it plays and what it leaves out: docs/analysis.md ("Fits
and models") and docs/concepts/strategies.md. Here: the simulator's inputs, each stage's step cost
(`costs`) and each pair's acceptance (`acceptance`); the simulated engine (`engine`, its token ids
`tokens`, its outcome `result`); and the three strategies (`strategies`).
"""

from analysis.simulate.costs import StageCost, TableCost, MIN_CONTEXT_SHARE, ContextCost, RecordedSteps
from analysis.simulate.acceptance import (
    Sampler, Bernoulli, Replay, ByPosition, AlongContinuations, TreeContinuations, AcceptanceSpec
)
from analysis.simulate.tokens import ROOT
from analysis.simulate.result import SimResult
from analysis.simulate.engine import UNBOUNDED, SIZING_TABLE, STEP_DONE, SimulatedStage, Simulation
from analysis.simulate.strategies import simulate_autoregressive, simulate_sync_sd, simulate_pipespec

# the engine's own rules, which the simulated stages call (tests/test_one_schedule.py checks it)
from analysis.simulate.engine import buffers, commits_after_step, next_action, roles, stage_view
