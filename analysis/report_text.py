"""The prose of the model-vs-measurement report (`analysis.report`): what each table holds and why each residual
is what it is. Numbers that depend on the data are computed (`headline_numbers`); the paragraphs name the
mechanism each table shows."""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from analysis import names
from analysis.report_model import SweepAnalysis
from analysis.report_tables import calibrated_counts, coverage_counts, median_largest, residual


def intro(analyses: Sequence[SweepAnalysis], command: str) -> str:
    held = sum(not a.in_sample for a in analyses)
    sweeps = ", ".join(f"{names.hierarchy_name(a.hierarchy)} on {names.dataset_name(a.dataset)}" for a in analyses)
    shapes = sorted({(a.continuations, r.record.prompts, r.record.repetitions) for a in analyses for r in a.rates})
    sizes = "; ".join(f"{c} profile prompts, {p} sweep prompts x {n} repetitions" for c, p, n in shapes)
    return (f"Made by `{command}` from {len(analyses)} paired validations ({held} held out): {sweeps}. Each is a "
            "machine profile measured on some of a dataset's prompts (`profile/profile.json`) and a paired sweep "
            "of greedy, SD and PipeSpec configurations on other prompts, with traces (`sweep/`): "
            f"{sizes}. Held out: predicted from the profile alone, set against the sweep. In sample: "
            "read off the sweep's own traces (a test of a closed form's shape, not a prediction). A residual is "
            "predicted / measured - 1; intervals are 95%.")


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{100 * value:.1f}%"


def headline_numbers(analyses: Sequence[SweepAnalysis]) -> str:
    """One paragraph of the figures to quote: rho per form, speedup and coverage pooled over every sweep."""
    pairs = [r for a in analyses for r in a.pairs]
    rates = [r for a in analyses for r in a.rates]

    def fit(values) -> str:
        med, big, within, n = median_largest(values)
        return f"median {_pct(med)}, largest {_pct(big)}, {within}/{n} within 15%"

    inside, total, ci_inside, ci_total = coverage_counts(rates)
    calibrated = calibrated_counts(analyses)
    cal_inside, cal_total = sum(c for c, _ in calibrated), sum(n for _, n in calibrated)
    alphas = [r.reading.alpha for r in pairs if math.isfinite(r.reading.alpha)]
    return (
        f"Over {len(pairs)} PipeSpec pairs x configurations: rho by the paper's Eq. 3 held out (the profile's "
        f"alpha, gamma = max lead) {fit(residual(r.held_out.get('eq3'), r.rho) for r in pairs)}; in sample (the "
        f"sweep's own alpha and mean lead) {fit(residual(r.in_sample.get('eq3'), r.rho) for r in pairs)}; "
        f"Eq. 3 with the lead distribution, acceptance by position and the drafts' supply, held out "
        f"{fit(residual(r.held_out.get('supply'), r.rho) for r in pairs)}, in sample "
        f"{fit(residual(r.in_sample.get('supply'), r.rho) for r in pairs)}; our engine-schedule model held out "
        f"{fit(residual(r.held_out.get('ours'), r.rho) for r in pairs)}. Measured alpha "
        f"{min(alphas):.2f}-{max(alphas):.2f} (median {statistics.median(alphas):.2f}). Speedup over "
        f"{len(rates)} configurations, held out: ours {fit(r.record.speedup_error for r in rates)}; the paper's "
        f"Eq. 4 / 5 {fit(r.record.paper_speedup_error for r in rates)}. {inside}/{total} measured speedups lie "
        f"inside ours' 95% prediction interval, {ci_inside}/{ci_total} inside the interval of the profile's mean "
        f"alone (which leaves out that the sweep draws its own prompts), {cal_inside}/{cal_total} inside the "
        "prediction interval widened by the model error measured on the other sweeps."
    )


HEADLINE = ("Per hierarchy and dataset, the held-out accuracy: the speedup over greedy (ours and the paper's), the "
            "share of measured speedups inside ours' 95% prediction interval, and how well the paper's Eq. 3 and "
            "its extension fit the measured verification fraction rho (median / largest absolute residual, and how many "
            "within 15%).")

COMPARED = (
    "Measured: from the sweep's traces, rho = verifications / (verifications + one-token steps) of each "
    "verifier and its tokens per step, pooled over the configuration's 24 samples, with a 95% interval from "
    "resampling the 8 prompts (all repetitions of a prompt together); the speedup is the paired geometric-mean "
    "speedup over greedy (`analysis.paired`). The paper's Eq. 3 / 4 / 5 / 6 held out take alpha as the mean of "
    "the profile's acceptance rates by position and gamma as the max lead (PipeSpec) or the lookahead (SD), as "
    "`analysis.predict` gives the paper's model; in sample alpha is the sweep's maximum-likelihood rate and "
    "gamma the mean drafts offered per verification (`analysis.fit`). Ours: the engine's schedule played by "
    "`analysis.simulate` with the profile's step costs t(n), contention and acceptance along the profile's "
    "prompts. Extended forms (`analysis.closed_forms`) keep Eq. 3's two-state chain and replace one assumption "
    "at a time: + lead (the lead at verify time as a distribution, held out from our simulation, in sample from "
    "the traces), + by position (acceptance rate per draft position, held out from the profile), + supply "
    "(whether drafts wait for the verifier; held out from the lookahead rule and the drafter's proposal rate, "
    "in sample the measured transitions). SD is left out of the rho tables: its verifier verifies at every "
    "step by construction (rho = 1)."
)

RHO_HELD_OUT = ("Held out. Each PipeSpec pair: measured rho with its interval over prompts; the paper's Eq. 3 at "
                "the profile's alpha and gamma = max lead; ours; Eq. 3 with the simulated lead distribution (+ "
                "lead), then with the profile's acceptance by position (+ by position), then with the drafts' "
                "supply (+ supply).")

RHO_IN_SAMPLE = ("In sample: alpha, the lead distribution, the rates by position and the transitions are read off "
                 "the same traces as the measured rho, so these residuals test the form of each closed form, not "
                 "a prediction.")

REMOVED = (
    "Each row adds one ingredient to the row above (ours, the simulated schedule, for comparison); the second "
    "table splits the residuals by class of pair. Where the verifier waits for drafts (a model drafter at "
    "lookahead >= 1) every target step is a verification (rho ~ 1), while Eq. 3 gives a / (1 - a^(g+1) + a) < 1: "
    "the chain's assumption that a rejection is followed by a one-token step fails, and the supply term (the "
    "verifier waits, so rho = 1) removes the residual. Where a model-free drafter proposes only on a match, most "
    "steps find no proposal and are one-token steps, so rho lies far below Eq. 3; the supply term (rho = the "
    "profile's proposal rate at lookahead >= 1, the chain thinned by it at lookahead 0) removes most of it. With "
    "a model drafter at lookahead 0 the chain has the paper's shape but its two transitions are not acceptance "
    "alone: after a full acceptance or a one-token step the drafter has often not yet drafted past the "
    "verifier's new token (it has just rolled back, or its next draft takes longer than the verifier's step with "
    "the two cores shared), so fewer steps verify than a^(w+1) and a_1 say. The measured lead there is short "
    "(one or two drafts), which raises Eq. 3's p_VV, so the lead and position terms move this class away from "
    "the measurement; no held-out closed form here carries that timing, the simulated schedule (ours) does. In "
    "sample, the chain with the measured transitions reproduces every measured rho closely: the two-state chain "
    "holds, its transition probabilities are what the paper gets wrong."
)

BY_CLASS = ("The same residuals per class of pair, held out: the median absolute residual of each form and, in brackets, "
            "its mean signed residual (negative: predicted too low).")

LEADS = (
    "The paper's Eq. 3 holds the window fixed at gamma. The drafter's lead when the verifier starts is a "
    "distribution, and the max lead is a cap that a model drafter rarely reaches: the verifier starts as soon "
    "as it is free and a draft waits, so at any lookahead a model drafter is mostly one or two drafts ahead (it "
    "restarts after every rejection); a prompt-lookup drafter offers its whole proposal at once, up to the cap. "
    "The last column is ours' simulated mean lead (held out)."
)

POSITION = (
    "Acceptance of draft p given the drafts before it were kept. The paper (and alpha's MLE) assume one i.i.d. "
    "rate; measured, the first draft of a proposal is kept less often than the later ones of an agreeing run, a "
    "prompt-lookup drafter's first draft most of all. The profile's rates (held out) have the sweep's shape; the "
    "paper's held-out alpha (the mean of the profile's rates) weighs every position alike and so lies above the "
    "sweep's MLE, which the first positions dominate."
)

TRANSITIONS = (
    "In sample. Eq. 3 is the steady state of a chain in which a verification follows a verification only if "
    "every draft and the bonus position agreed (a^(g+1)) and follows a one-token step with probability a. "
    "Measured, the next step verifies when drafts wait for the verifier: at lookahead >= 1 it waits for them, so "
    "a verification follows a rejection too (1.00); at lookahead 0 a rejection is followed by a one-token step "
    "(0.00, as the paper assumes), but after a full acceptance or a one-token step fewer steps verify than "
    "acceptance alone says, as the drafter has not always drafted past the verifier's new token; a model-free "
    "drafter verifies only when it found a proposal."
)

TOKENS = ("Held out: tokens the verifier appends per step, measured with its interval over prompts, against Eq. 4 "
          "(its rho from Eq. 3 and a window of max lead), ours, and Eq. 1 with the extended rho, the simulated "
          "lead distribution and the profile's acceptance by position.")

SPEEDUP = (
    "Held out: the paper's Eq. 4 (PipeSpec) and Eq. 5 (SD) count tokens per target step and take a step of any "
    "size to cost one time unit; Eq. 6 is Eq. 4's high-acceptance limit. Ours plays the schedule with the "
    "profile's step costs; 'ours at the sweep's step costs' is the same prediction with each stage's speed and "
    "contention fitted on the sweep's own steps (a decomposition, `analysis.validate`): the difference between "
    "the two is the machine's speed during the sweep, what is left is acceptance and schedule. The prediction "
    "interval adds the sweep's own prompt sampling and repetition noise to the interval over the profile's "
    "prompts."
)

TIMING = ("In sample: the measured speedup is, pooled, output tokens per target decode step x the cost ratio (greedy's mean "
          "step over this configuration's mean target step) x the busy ratio (the target's busy share over "
          "greedy's). The paper sets both ratios to 1: a verification of n tokens costs as much as a one-token "
          "step, and the target never waits. Measured, a PipeSpec target step costs more than greedy's (it "
          "feeds several tokens, and the drafter computes beside it on the 2 cores), while an SD target step "
          "costs about greedy's (the drafter waits while the target verifies); the target waits for drafts at "
          "lookahead >= 1 and in SD. 'paper x cost x busy' is the paper's tokens per target step with the "
          "measured timing: what the paper's count would give if it were timed.")

COVERAGE = ("Held out, per hierarchy and dataset: the share of measured speedups (greedy left out) inside three "
            "95% intervals of ours. The interval of the profile's mean alone (sd / sqrt(10) over the profile's "
            "prompts, as `analysis.validate` prints it) is the acceptance's sampling error; the prediction interval "
            "adds that the sweep draws its own 8 prompts from the same spread (sd sqrt(1/10 + 1/8)) and its "
            "repetition noise; the last adds ours' own error, the root mean square of its log residual on the "
            "other sweeps (leave one sweep out, so the width is held out too). Where a sweep's misses all lie on "
            "one side, its residual is a bias of the whole sweep, not the prompt sampling the interval holds: "
            "either the machine's speed during the sweep (then 'ours at the sweep's step costs' in the speedup "
            "table removes it) or the sweep's prompts drafting better or worse than the profile's (compare the "
            "rates by position, misfit 2) by more than the spread over the profile's 10 prompts predicts. The "
            "configurations of one sweep share its prompts and its machine, so their misses are not independent.")
