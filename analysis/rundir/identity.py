"""Identity classes of a mismatch with greedy. On a GPU, verifying n tokens in fp16 runs other kernels than a
one-token step: the logits differ in the last bits, and an argmax flips where the two largest logits
nearly tie, a numerical mismatch, not a bug. The target records the top-2 margin of the row that decided
each token it emits (`target_margins` of a record); a mismatch whose margin at the first diverging
position is below the near-tie threshold (in both runs, where both recorded it) is "near_tie", any other
"unexplained". docs/gpus.md.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


#
# tie. A mismatch with greedy is then numerical, not a bug. The target records the top-2

DTYPE_EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}  # machine epsilon (ulp at 1.0)
NEAR_TIE_EPS_UNITS = 4  # ulps: a few roundings' worth of disagreement between two kernels
LOGIT_SCALE = 32.0  # |top logit| of LLaMA-class models stays below ~32: the ulp there bounds the noise


def near_tie_threshold(dtype: str, eps_units: float = NEAR_TIE_EPS_UNITS, logit_scale: float = LOGIT_SCALE) -> float:
    """The top-2 margin below which a flip is numerical noise: `eps_units` ulps of a logit of size
    `logit_scale` in `dtype` (float16: 4 x 2^-10 x 32 = 0.125; bfloat16: 1.0; float32: 1.5e-5)."""
    if dtype not in DTYPE_EPS:
        raise ValueError(f"no near-tie threshold for dtype {dtype!r}; expected one of {sorted(DTYPE_EPS)}")
    return eps_units * DTYPE_EPS[dtype] * logit_scale


def run_near_tie_threshold(config: Mapping[str, Any]) -> float:
    """`run.near_tie_margin` if set, else the threshold of the target's dtype."""
    explicit = (config.get("run") or {}).get("near_tie_margin")
    if explicit is not None:
        return float(explicit)
    return near_tie_threshold(config["models"]["stages"][-1].get("dtype", "float32"))


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two outputs differ (a prefix differs at the shorter's end); None if equal."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def _margin_at(record: Mapping[str, Any], position: int) -> float | None:
    margins = record.get("target_margins")
    return float(margins[position]) if isinstance(margins, list) and position < len(margins) else None


def classify_mismatch(record: Mapping, reference: Mapping, threshold: float) -> dict[str, Any] | None:
    """None for identical outputs; else where they diverge, both margins there, and the class."""
    position = first_divergence(record["output_ids"], reference["output_ids"])
    if position is None:
        return None
    margin, reference_margin = _margin_at(record, position), _margin_at(reference, position)
    known = [m for m in (margin, reference_margin) if m is not None]
    near = margin is not None and all(m < threshold for m in known)  # old records without margins: unexplained
    tokens, ref_tokens = record["output_ids"], reference["output_ids"]
    return {
        "sample_id": record["sample_id"],
        "position": position,
        "margin": margin,
        "reference_margin": reference_margin,
        "token": tokens[position] if position < len(tokens) else None,
        "reference_token": ref_tokens[position] if position < len(ref_tokens) else None,
        "class": "near_tie" if near else "unexplained",
    }


def classify_identity(
    records: Sequence[Mapping], reference_records: Sequence[Mapping], threshold: float
) -> dict[str, Any] | None:
    """identical / near_tie / unexplained counts over the samples both runs hold, and every mismatch."""
    by_id = {r["sample_id"]: r for r in reference_records}
    common = [r for r in records if r["sample_id"] in by_id]
    if not common:
        return None
    mismatches = [m for r in common if (m := classify_mismatch(r, by_id[r["sample_id"]], threshold)) is not None]
    near = sum(m["class"] == "near_tie" for m in mismatches)
    return {
        "identical": len(common) - len(mismatches),
        "near_tie": near,
        "unexplained": len(mismatches) - near,
        "near_tie_threshold": threshold,
        "mismatches": mismatches,
    }
