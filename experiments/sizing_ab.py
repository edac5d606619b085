"""Verification sized by t(n) against verifying every draft: one pipeline, the same prompts, side by side.

    python -m experiments.sizing_ab models=smollm2_pld_fp32 dataset=humaneval \
        'dataset.ids=[HumanEval/10,HumanEval/11]' strategy=pipespec strategy.lookahead=2 max_new_tokens=96

Composes the runner's config (`conf/config.yaml`: models, dataset, strategy groups; any override).
One `Pipeline` serves both variants, alternating per prompt (A B, then B A, ...) so drift of the machine
falls on both; a short warm-up generation of each comes first, and the sizing verifier's history (its
t(n) and acceptance, `pipespec.schedule.VerifyHistory`) carries over between prompts as in any long-lived
pipeline. Prints one JSON line: tokens/s of each variant and their ratio, and whether every output was
identical to the other variant's. Run it on a quiet machine: it is a timing.
"""

from __future__ import annotations

import json
import sys
import time

from experiments.compose import compose
from experiments.data import DataError
from experiments.hub import default_offline
from pipespec.errors import ConfigError, StageError

# torch and the modules that import it (experiments.run_config, pipespec.api) are imported where the
# comparison runs, after default_offline() has set the hub's switches the libraries read when imported.

default_offline()  # offline unless the user set HF_HUB_OFFLINE & co. or the run names a hub id


def compare(run) -> dict:
    """Both variants of `run` (an `experiments.run_config.RunConfig`) on its prompts, alternating per prompt."""
    from pipespec.api import Pipeline

    budget = run.budget
    with Pipeline(list(run.stages), **run.pipeline_options()) as pipe:
        found = run.prompts(pipe.tokenizer, pipe.context_length)
        prompts = found.ids()
        for sized in (False, True):
            pipe.generate(prompts[0], 16, size_verification=sized)  # warm-up
        tokens, seconds, identical = {False: 0, True: 0}, {False: 0.0, True: 0.0}, 0
        for i, prompt in enumerate(prompts):
            outputs = {}
            for sized in (False, True) if i % 2 == 0 else (True, False):
                started = time.perf_counter()
                outputs[sized] = pipe.generate(prompt, budget, size_verification=sized).tokens
                seconds[sized] += time.perf_counter() - started
                tokens[sized] += len(outputs[sized])
            identical += outputs[False] == outputs[True]
    rate = {k: tokens[k] / seconds[k] for k in tokens}
    return {
        "models": run.hierarchy, "dataset": found.name, "prompts": len(prompts),
        "strategy": run.call.strategy, "lookahead": run.call.lookahead, "max_lead": run.call.max_lead,
        "max_new_tokens": budget, "all_drafts_tokens_per_s": round(rate[False], 2),
        "sized_tokens_per_s": round(rate[True], 2), "sized_vs_all_drafts": round(rate[True] / rate[False], 3),
        "identical": f"{identical}/{len(prompts)}",
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from experiments.run_config import RunConfig

    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        run = RunConfig.from_config(compose("config", overrides))
        print(json.dumps(compare(run)))
    except (ConfigError, DataError, StageError) as error:
        print(f"error: {(str(error).strip().splitlines() or [type(error).__name__])[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
