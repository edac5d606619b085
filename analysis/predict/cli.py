"""`python -m analysis.predict` (the usage lines: `analysis.predict`): one configuration or `--sweep` of a profile,
as text or `--json` records; an error is one `error:` line (exit 2).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Sequence

from analysis.predict.from_profile import predict_profile, sweep
from analysis.predict.prediction import Prediction
from analysis.profile import ProfileError, load_profile, mismatches
from pipespec.errors import ConfigError


def _flag(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(value)
    return value.lower() == "true"


_flag.__name__ = "true or false"
OPTIONS = {"strategy": str, "lookahead": int, "max_lead": int, "tokens": int, "draft_confidence": float,
           "size_verification": _flag, "value_stop": float, "tree_nodes": int}  # fmt: skip


def parse_options(items: Sequence[str]) -> dict:
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in OPTIONS:
            raise ConfigError(f"expected KEY=VALUE with KEY one of {list(OPTIONS)}, got {item!r}")
        try:
            options[key] = OPTIONS[key](value)
        except ValueError:
            raise ConfigError(f"{key} must be {OPTIONS[key].__name__}, got {value!r}") from None
    return options


def prediction_record(p: Prediction) -> dict:
    """A prediction as the `--json` record: the configuration and throughput first, then the details."""
    record = asdict(p)
    if not record["tree_nodes"]:  # chains: the record as before trees
        del record["tree_nodes"]
    head = ("strategy", "lookahead", "max_lead", "stages", "stage_indices", "tokens")
    return {**{key: record.pop(key) for key in head}, "predicted_tokens_per_s": p.predicted_tokens_per_s,
            "ms_per_token": p.ms_per_token, "mean_acceptance_length": record.pop("mean_acceptance_length"),
            "verify_fraction": record.pop("verify_fraction"), "target_busy": p.target_busy,
            "paper_predicted_tokens_per_s": record.pop("paper_predicted_tokens_per_s"), **record}  # fmt: skip


def _interval_text(p: Prediction) -> str:
    """' (95% 15.2-18.9 over the profile's prompts)' where the prediction has a width, else ''."""
    low, high = p.tokens_per_s_interval or (0.0, 0.0)
    return f" (95% {low:.1f}-{high:.1f} over the profile's prompts)" if high > low else ""


def format_prediction(p: Prediction) -> str:
    length = "-" if p.mean_acceptance_length is None else f"{p.mean_acceptance_length:.2f}"
    verify = "-" if p.verify_fraction is None else f"{p.verify_fraction:.2f}"
    tree = f" tree_nodes {p.tree_nodes}" if p.tree_nodes else ""
    return (f"{p.strategy} lookahead {p.lookahead} max_lead {p.max_lead}{tree} ({' > '.join(p.stages)}): "
            f"predicted {p.predicted_tokens_per_s:.1f} tokens/s{_interval_text(p)} ({p.ms_per_token:.1f} ms/token), "
            f"mean acceptance length {length}, verification fraction {verify}, target busy {p.target_busy:.0%}; "
            f"paper model {p.paper_predicted_tokens_per_s:.1f} tokens/s")  # fmt: skip


USAGE = ("usage: python -m analysis.predict PROFILE [strategy=...] [lookahead=N] [max_lead=N] [tokens=N] [--json]\n"
         "       python -m analysis.predict PROFILE --sweep [tokens=N] [--json]")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json, as_sweep = "--json" in argv, "--sweep" in argv
    argv = [a for a in argv if a not in ("--json", "--sweep")]
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        profile = load_profile(argv[0])
        options = parse_options(argv[1:])
        if as_sweep and set(options) - {"tokens"}:
            raise ConfigError(f"--sweep takes only tokens=N, got {sorted(set(options) - {'tokens'})}")
        predictions, notes = sweep(profile, **options) if as_sweep else ([predict_profile(profile, **options)], [])
    except (ProfileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for problem in mismatches(profile):
        print(f"warning: profile from elsewhere: {problem}", file=sys.stderr)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if as_json:
        records = [prediction_record(p) for p in predictions]
        print(json.dumps(records if as_sweep else records[0]))
    else:
        print("\n".join(f"{rank}. " * as_sweep + format_prediction(p) for rank, p in enumerate(predictions, 1)))
    return 0
