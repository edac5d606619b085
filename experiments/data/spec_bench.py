"""Multi-turn questions (Spec-Bench's MT-bench categories): the prompt of each turn.

A Spec-Bench sample (`loaders._load_spec_bench`) carries its user turns in `meta["turns"]`; its
`source` is the first turn, so a run that knows nothing of turns runs the first turn only. Turn
t's prompt holds the earlier turns and the model's own answers to them, as Spec-Bench's
evaluation/eval.py builds its conversations:

- chat models: one conversation through the tokenizer's chat template, the user messages the
  `prompt.chat` template filled with each turn, the assistant messages the earlier answers
  (`prompt.system` first when set), generation prompt added;
- base models: a plain transcript, each earlier turn's filled `prompt.base` template followed by
  " " + its answer + a newline, then the filled template of turn t.

A run of a conversation, per sample (`answers` starts empty):

    for turn in range(len(sample_turns(sample))):
        ids, truncated = turn_prompt_ids(sample, turn, answers, template, tokenizer, family,
                                         context_length, max_new_tokens)
        result = generate(ids)                      # one generation per turn, timed alone
        answers.append(history_answer(result.text))

Turn 0 is exactly `build_prompt_ids` / `render_prompt_text` of the sample (its first turn may be
cut to fit); a later turn that does not fit is a `PromptTooLongError` (the history is never cut).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .loaders import DataError, Sample
from .prompts import PLACEHOLDER, PromptTooLongError, _template_for, build_prompt_ids, encode_prompt, render_prompt_text


def sample_turns(sample: Sample) -> tuple[str, ...]:
    """The user turns of a sample: a Spec-Bench question's turns, else its source alone."""
    return tuple(sample.meta.get("turns") or (sample.source,))


def history_answer(text: str) -> str:
    """An answer as the conversation carries it into the next turn (Spec-Bench strips each answer)."""
    return text.strip()


def record_fields(sample: Sample) -> dict[str, Any]:
    """What a sample record keeps of a Spec-Bench question for its export: question_id and category
    ({} for samples of other datasets)."""
    return {key: sample.meta[key] for key in ("question_id", "category") if key in sample.meta}


def turn_prompt_text(
    sample: Sample, turn: int, answers: Sequence[str], template_cfg: Mapping[str, Any], tokenizer: Any, family: str
) -> str:
    """The prompt text of turn `turn` after the earlier turns and their `answers` (one per earlier turn)."""
    turns = _checked_turns(sample, turn, answers)
    if turn == 0:
        return render_prompt_text(sample.source, template_cfg, tokenizer, family)
    filled = [_template_for(template_cfg, family).replace(PLACEHOLDER, text) for text in turns[: turn + 1]]
    if family == "base":
        return "".join(f"{user} {answer}\n" for user, answer in zip(filled, answers)) + filled[turn]
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"model family 'chat' needs a tokenizer with a chat_template; {type(tokenizer).__name__} has none"
        )
    messages = [{"role": "system", "content": template_cfg["system"]}] if template_cfg.get("system") else []
    for user, answer in zip(filled, answers):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": filled[turn]})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def turn_prompt_ids(
    sample: Sample,
    turn: int,
    answers: Sequence[str],
    template_cfg: Mapping[str, Any],
    tokenizer: Any,
    family: str,
    context_length: int | None,
    max_new_tokens: int,
) -> tuple[list[int], bool]:
    """(token ids, truncated) of turn `turn`'s prompt, leaving room for `max_new_tokens`.

    Turn 0 is `build_prompt_ids` of the sample; a later turn is never cut: one longer than
    `context_length - max_new_tokens` is a `PromptTooLongError` naming the sample and the turn."""
    _checked_turns(sample, turn, answers)
    if turn == 0:
        return build_prompt_ids(sample, template_cfg, tokenizer, family, context_length, max_new_tokens)
    ids = encode_prompt(turn_prompt_text(sample, turn, answers, template_cfg, tokenizer, family), tokenizer, family)
    if context_length is not None and len(ids) > context_length - max_new_tokens:
        raise PromptTooLongError(
            f"{sample.sample_id} turn {turn}: prompt of {len(ids)} tokens with the earlier turns exceeds "
            f"context_length={context_length} - max_new_tokens={max_new_tokens}; lower max_new_tokens"
        )
    return ids, False


def _checked_turns(sample: Sample, turn: int, answers: Sequence[str]) -> tuple[str, ...]:
    turns = sample_turns(sample)
    if not 0 <= turn < len(turns):
        raise DataError(f"{sample.sample_id} has {len(turns)} turn(s); there is no turn {turn}")
    if len(answers) != turn:
        raise DataError(f"{sample.sample_id} turn {turn} needs the {turn} earlier answer(s), got {len(answers)}")
    return turns
