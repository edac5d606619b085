"""Prompt construction from per-dataset, per-model-family templates.

A template config is the `prompt` mapping of a `conf/dataset/*.yaml` file:

    base:   plain-text prompt for base (non-instruct) models
    chat:   user message for chat/instruct models; the tokenizer's chat template is
            applied with add_generation_prompt=True
    system: optional system message for chat models (null = none)
    allow_truncation: whether an over-long source may be cut (false for code)

Templates contain the placeholder `{source}` exactly once; it is replaced by the
sample's source text (article or function stub) with `str.replace`, so braces in
articles or code need no escaping.

`prompts_for(dataset_config, tokenizer, family, context_length, budget)` is the one way
from a dataset config to prompt token ids: every tool builds its prompts with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .loaders import DataError, LoadedDataset, Sample, load_dataset

PLACEHOLDER = "{source}"
FAMILIES = ("base", "chat")


class PromptTooLongError(DataError):
    """The prompt does not fit the context even with the source cut down."""


def render_prompt_text(
    source: str, template_cfg: Mapping[str, Any], tokenizer: Any, family: str
) -> str:
    """Prompt text for `source`: filled-in base template, or chat-templated messages."""
    template = _template_for(template_cfg, family)
    user_text = template.replace(PLACEHOLDER, source)
    if family == "base":
        return user_text
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"model family 'chat' needs a tokenizer with a chat_template; "
            f"{type(tokenizer).__name__} has none (use family 'base')"
        )
    messages = []
    if template_cfg.get("system"):
        messages.append({"role": "system", "content": template_cfg["system"]})
    messages.append({"role": "user", "content": user_text})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(text: str, tokenizer: Any, family: str) -> list[int]:
    """Token ids of a rendered prompt.

    Base prompts get the tokenizer's special tokens (e.g. BOS); chat-templated text
    already spells them out, so they are not added a second time.
    """
    encoded = tokenizer(text, add_special_tokens=(family == "base"))
    return list(encoded["input_ids"])


def build_prompt_ids(
    sample: Sample,
    template_cfg: Mapping[str, Any],
    tokenizer: Any,
    family: str,
    context_length: int | None,
    max_new_tokens: int,
) -> tuple[list[int], bool]:
    """Prompt token ids for `sample` that leave room for `max_new_tokens`.

    Returns (ids, truncated). When the full prompt exceeds
    `context_length - max_new_tokens` (None: no limit), the source text is cut at a token boundary and
    re-rendered inside the intact template; `truncated` is then True. Raises
    `PromptTooLongError` if the template alone does not fit, or if truncation is not
    allowed by the template config.
    """
    ids = _prompt_ids(sample.source, template_cfg, tokenizer, family)
    if context_length is None:  # a model that states no context length: nothing to cut
        return ids, False
    budget = context_length - max_new_tokens
    if len(ids) <= budget:
        return ids, False

    overhead = len(_prompt_ids("", template_cfg, tokenizer, family))
    where = f"{sample.sample_id}: prompt of {len(ids)} tokens"
    limits = f"context_length={context_length} - max_new_tokens={max_new_tokens}"
    if overhead > budget:
        raise PromptTooLongError(
            f"{where}: the template alone takes {overhead} tokens > {limits}; "
            "raise the context length or lower max_new_tokens"
        )
    if not template_cfg.get("allow_truncation", True):
        raise PromptTooLongError(
            f"{where} exceeds {limits} and prompt.allow_truncation is false"
        )

    n_source_tokens, source_prefix = _source_cutter(sample.source, tokenizer)
    keep = min(budget - overhead, n_source_tokens)
    # Tokens can merge differently at the cut and inside the template: shrink until it fits.
    while keep > 0:
        ids = _prompt_ids(source_prefix(keep), template_cfg, tokenizer, family)
        if len(ids) <= budget:
            return ids, True
        keep -= max(1, len(ids) - budget)
    return _prompt_ids("", template_cfg, tokenizer, family), True


@dataclass(frozen=True)
class Prompt:
    """One sample's prompt: its position in the dataset's selection, the sample, its token ids and whether
    the source was cut to fit."""

    index: int
    sample: Sample
    ids: list[int]
    truncated: bool

    @property
    def sample_id(self) -> str:
        return self.sample.sample_id


@dataclass(frozen=True)
class DatasetPrompts:
    """The prompts of some samples of a loaded dataset (`prompts_for`)."""

    dataset: LoadedDataset
    prompts: tuple[Prompt, ...]

    @property
    def name(self) -> str:
        return self.dataset.name

    def ids(self) -> list[list[int]]:
        """The prompts' token ids, in order."""
        return [p.ids for p in self.prompts]

    def pairs(self) -> list[tuple[str, list[int]]]:
        """(sample id, token ids) per prompt: what a machine profile is measured on."""
        return [(p.sample_id, p.ids) for p in self.prompts]


def prompts_for(
    dataset_config: Mapping[str, Any],
    tokenizer: Any,
    family: str,
    context_length: int | None,
    budget: int,
    count: int | None = None,
    offset: int = 0,
) -> DatasetPrompts:
    """The prompts of a dataset as a run builds them: the dataset loaded from its config (a
    `conf/dataset/*.yaml` mapping), each chosen sample rendered with the config's `prompt` template for
    the model `family` and encoded with `tokenizer`, leaving room for `budget` new tokens in
    `context_length` (`build_prompt_ids`; None: no limit).

    Chosen samples: the config's selection (`n_samples`, `seed`, `ids`) after its first `offset`; with
    `count`, the first `count` of its whole selection (`n_samples` ignored) after `offset`, fewer where
    it ends. `Prompt.index` is the position in the selection loaded."""
    if count is not None:
        dataset_config = {**dataset_config, "n_samples": None}
    dataset = load_dataset(dataset_config)
    end = None if count is None else offset + count
    template = dataset_config.get("prompt") or {}
    prompts = []
    for index, sample in enumerate(dataset.samples[offset:end], start=offset):
        ids, truncated = build_prompt_ids(sample, template, tokenizer, family, context_length, budget)
        prompts.append(Prompt(index, sample, ids, truncated))
    return DatasetPrompts(dataset, tuple(prompts))


# ------------------------------------------------------------------------- helpers


def _prompt_ids(
    source: str, template_cfg: Mapping[str, Any], tokenizer: Any, family: str
) -> list[int]:
    text = render_prompt_text(source, template_cfg, tokenizer, family)
    return encode_prompt(text, tokenizer, family)


def _template_for(template_cfg: Mapping[str, Any], family: str) -> str:
    if family not in FAMILIES:
        raise DataError(f"unknown model family {family!r}; expected one of {FAMILIES}")
    template = template_cfg.get(family)
    if not template:
        raise DataError(f"no prompt.{family} template in the dataset config")
    if template.count(PLACEHOLDER) != 1:
        raise DataError(f"prompt.{family} must contain {PLACEHOLDER} exactly once: {template!r}")
    return template


def _source_cutter(text: str, tokenizer: Any) -> tuple[int, Callable[[int], str]]:
    """Number of tokens in `text` and a function giving the text of its first k tokens."""
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ends = [end for _, end in encoded["offset_mapping"]]
        # Cut the original string, so the kept part is byte-for-byte the article.
        return len(ends), lambda k: text[: ends[k - 1]]
    except (NotImplementedError, TypeError, ValueError, KeyError):
        # Slow tokenizers have no offsets: decode the kept tokens instead.
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return len(ids), lambda k: tokenizer.decode(ids[:k], skip_special_tokens=True)
