"""Spec-Bench's answer format and speed figures, computed from pipespec run records and traces (no torch).

Spec-Bench (github.com/hemingkx/Spec-Bench) compares speculative-decoding methods on one question
file; each method writes one answer file, one JSON line per question:

    {"question_id", "category", "answer_id", "model_id",
     "choices": [{"index": 0, "turns": [answer text per turn],
                  "decoding_steps": [target forward passes per turn],
                  "new_tokens": [tokens generated per turn],
                  "wall_time": [seconds per turn],
                  "accept_lengths": [tokens kept per verification, accepted drafts + 1, all turns]}],
     "tstamp"}

`answer_line` builds one from a sample record and its trace: `accept_lengths` are the target
verifier's steps, `accepted + 1` each (a one-token step without drafts counts 1, as Spec-Bench's
baseline writes every greedy step), cut at the end so they add up to the tokens the record kept (a
bonus token after an accepted EOS is not output); `decoding_steps` counts the target's steps;
`new_tokens` and `wall_time` are the record's. A record of a multi-turn conversation carries
`"turns": [{"output_text", "new_tokens", "time_s"}, ...]` and its trace `"turns": [{"stages": [...]},
...]`, one entry per turn; any other record is one turn (its trace's "stages").

Spec-Bench's figures (evaluation/speed.py), computed on answer lines by `speed_figures`:

- speed of a question: sum(new_tokens) / sum(wall_time) over its turns;
- tokens per second: the mean of those per-question speeds;
- speedup: mean speed of the method / mean speed of the baseline (greedy) answers;
- "#Mean accepted tokens": the mean of every accept length of every answer, pooled.

pipespec's own figures pool instead (sum of tokens / sum of time: the paper's ms/token); both are
returned ("pooled" keys). Tasks are speed.py's: "mt_bench" (the 8 MT-bench categories), each of
the 5 single-turn categories, and "overall".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from analysis.rundir import ResultsError
from pipespec.stats import ratio

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SINGLE_TURN_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
TASKS = ("mt_bench", *SINGLE_TURN_CATEGORIES, "overall")  # speed.py's report order
TARGET_STEP_KINDS = ("verify", "single")  # a target's forward passes (a target never drafts)


@dataclass(frozen=True)
class Turn:
    """One turn of a sample: the answer text, what the record counted, and the target's trace dict."""

    text: str
    new_tokens: int
    time_s: float
    target: Mapping[str, Any]


# ---- records + traces -> answer lines ----------------------------------------------------------


def record_turns(record: Mapping[str, Any], trace: Mapping[str, Any], where: str) -> list[Turn]:
    """The turns of a sample record with the target stage of each (the last stage of its trace).

    `where` names the sample in errors (ResultsError, one line)."""
    if "turns" not in record:
        return [Turn(str(record["output_text"]), int(record["new_tokens"]), float(record["time_s"]),
                     _target_stage(trace.get("stages"), where))]  # fmt: skip
    turns, traced = record["turns"], trace.get("turns")
    if not isinstance(turns, list) or not isinstance(traced, list) or len(turns) != len(traced) or not turns:
        raise ResultsError(f"{where}: the record's turns and the trace's turns do not match one to one")
    try:
        return [
            Turn(str(turn["output_text"]), int(turn["new_tokens"]), float(turn["time_s"]),
                 _target_stage(traced_turn.get("stages"), f"{where} turn {number}"))
            for number, (turn, traced_turn) in enumerate(zip(turns, traced))
        ]  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ResultsError(f"{where}: a turn lacks output_text / new_tokens / time_s ({error})") from None


def _target_stage(stages: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(stages, list) or not stages or not isinstance(stages[-1], Mapping):
        raise ResultsError(f"{where}: trace without stages")
    steps = stages[-1].get("steps")
    if not isinstance(steps, Mapping) or any(not isinstance(steps.get(c), list) for c in ("kind", "accepted")):
        raise ResultsError(f"{where}: the target's trace has no steps (kind, accepted)")
    return stages[-1]


def target_accept_lengths(target: Mapping[str, Any], new_tokens: int, where: str) -> tuple[list[int], int]:
    """(accept lengths, decoding steps) of one turn from the target's stage trace dict.

    One accept length per target step: accepted drafts + 1 (its own bonus or correction token), cut
    from the end so they sum to `new_tokens`, the tokens the turn kept; a step left with nothing is
    dropped from the lengths but still counted as a decoding step (a forward pass it made)."""
    steps = target["steps"]
    lengths = [int(a) + 1 for kind, a in zip(steps["kind"], steps["accepted"]) if kind in TARGET_STEP_KINDS]
    excess = sum(lengths) - new_tokens
    if excess < 0:
        raise ResultsError(f"{where}: the target's steps made {sum(lengths)} tokens, fewer than the {new_tokens} kept")
    decoding_steps = len(lengths)
    while excess:
        cut = min(lengths[-1], excess)
        lengths[-1] -= cut
        excess -= cut
        if not lengths[-1]:
            lengths.pop()
    return lengths, decoding_steps


def answer_line(
    record: Mapping[str, Any],
    trace: Mapping[str, Any],
    *,
    question_id: Any,
    category: str,
    model_id: str,
    tstamp: float,
    where: str,
) -> dict[str, Any]:
    """One Spec-Bench answer line for a sample record and its trace (see the module docstring)."""
    turns = record_turns(record, trace, where)
    steps, accept_lengths = [], []
    for number, turn in enumerate(turns):
        lengths, decoding_steps = target_accept_lengths(turn.target, turn.new_tokens, f"{where} turn {number}")
        steps.append(decoding_steps)
        accept_lengths.extend(lengths)
    choice = {
        "index": 0,
        "turns": [turn.text.strip() for turn in turns],  # Spec-Bench keeps each answer stripped
        "decoding_steps": steps,
        "new_tokens": [turn.new_tokens for turn in turns],
        "wall_time": [turn.time_s for turn in turns],
        "accept_lengths": accept_lengths,
    }
    return {
        "question_id": question_id,
        "category": category,
        "answer_id": answer_id(model_id, question_id),
        "model_id": model_id,
        "choices": [choice],
        "tstamp": tstamp,
    }


def answer_id(model_id: str, question_id: Any) -> str:
    """A stable id of a method's answer to a question (Spec-Bench draws a random one; this is
    reproducible): 22 hex digits of SHA-1 of "model_id/question_id"."""
    return hashlib.sha1(f"{model_id}/{question_id}".encode()).hexdigest()[:22]


def sort_answers(lines: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """By question id, as Spec-Bench's reorg_answer_file leaves an answer file (numbers before text)."""
    return sorted(lines, key=lambda line: _id_key(line["question_id"]))


def _id_key(question_id: Any) -> tuple:
    return (0, question_id, "") if isinstance(question_id, int) else (1, 0, str(question_id))


# ---- Spec-Bench's figures, from answer lines ------------------------------------------------------


def task_answers(answers: Sequence[Mapping[str, Any]], task: str) -> list[Mapping[str, Any]]:
    """The answers speed.py counts for `task`: all ("overall"), the MT-bench categories ("mt_bench"),
    or those of one category."""
    if task == "overall":
        return list(answers)
    wanted = MT_BENCH_CATEGORIES if task == "mt_bench" else (task,)
    return [answer for answer in answers if answer.get("category") in wanted]


def question_speed(answer: Mapping[str, Any]) -> float | None:
    """Tokens per second of one answer: its turns' new tokens over their wall time (None: no time)."""
    choice = answer["choices"][0]
    return ratio(sum(choice["new_tokens"]), sum(choice["wall_time"]))


def mean_accepted_tokens(answers: Sequence[Mapping[str, Any]]) -> float | None:
    """Spec-Bench's "#Mean accepted tokens": the mean of all accept lengths of all answers, pooled."""
    lengths = [length for answer in answers for length in answer["choices"][0]["accept_lengths"]]
    return ratio(sum(lengths), len(lengths))


def rate_figures(answers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Tokens per second two ways: Spec-Bench's mean of per-question speeds, and pooled."""
    speeds = [question_speed(answer) for answer in answers]
    speeds = [s for s in speeds if s is not None]
    tokens = sum(sum(a["choices"][0]["new_tokens"]) for a in answers)
    seconds = sum(sum(a["choices"][0]["wall_time"]) for a in answers)
    return {"tokens_per_s": ratio(sum(speeds), len(speeds)), "tokens_per_s_pooled": ratio(tokens, seconds)}


def speed_figures(
    answers: Sequence[Mapping[str, Any]],
    baseline: Sequence[Mapping[str, Any]] | None = None,
    task: str = "overall",
) -> dict[str, Any]:
    """Spec-Bench's figures of one task (speed.py's definitions, see the module docstring) and the
    pooled ones beside them; the speedups need the baseline's answers (None without)."""
    mine = task_answers(answers, task)
    figures = {"task": task, "n": len(mine), "mean_accepted_tokens": mean_accepted_tokens(mine), **rate_figures(mine)}
    base = rate_figures(task_answers(baseline, task)) if baseline is not None else {}
    figures["baseline_tokens_per_s"] = base.get("tokens_per_s")
    figures["baseline_tokens_per_s_pooled"] = base.get("tokens_per_s_pooled")
    figures["speedup"] = _speedup(figures["tokens_per_s"], figures["baseline_tokens_per_s"])
    figures["speedup_pooled"] = _speedup(figures["tokens_per_s_pooled"], figures["baseline_tokens_per_s_pooled"])
    return figures


def _speedup(rate: float | None, baseline_rate: float | None) -> float | None:
    return ratio(rate, baseline_rate) if rate is not None and baseline_rate else None


def speed_report(
    answers: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """`speed_figures` of each of speed.py's tasks that has answers, in its order ("overall" last)."""
    return [speed_figures(answers, baseline, task) for task in TASKS if task_answers(answers, task)]


def format_speed_report(rows: Sequence[Mapping[str, Any]]) -> str:
    """A fixed-width table of `speed_report` rows."""
    def fmt(value: Any, spec: str) -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    header = (f"  {'task':<16}{'n':>5}{'mean acc.':>11}{'tok/s':>10}{'tok/s pooled':>14}"
              f"{'speedup':>9}{'speedup pooled':>16}")  # fmt: skip
    lines = [header]
    for row in rows:
        lines.append(
            f"  {row['task']:<16}{row['n']:>5}{fmt(row['mean_accepted_tokens'], '.2f'):>11}"
            f"{fmt(row['tokens_per_s'], '.1f'):>10}{fmt(row['tokens_per_s_pooled'], '.1f'):>14}"
            f"{fmt(row['speedup'], '.3f'):>9}{fmt(row['speedup_pooled'], '.3f'):>16}"
        )
    return "\n".join(lines)


# ---- naming ---------------------------------------------------------------------------------------


def model_id(config: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """A method's Spec-Bench model_id: hierarchy and strategy, e.g. "tiny_k2-greedy",
    "tiny_k2-pipespec-L2" (the lookahead of a speculative strategy), "...-temp-0.7" when sampled."""
    strategy = summary.get("strategy") or config["strategy"]["name"]  # the summary's: what `auto` chose
    name = f"{config['models']['name']}-{strategy}"
    lookahead = summary.get("lookahead", config["strategy"].get("lookahead"))
    if strategy != "greedy" and lookahead is not None:
        name += f"-L{lookahead}"
    temperature = (config.get("sampling") or {}).get("temperature") or 0
    return name + (f"-temp-{temperature}" if temperature else "")
