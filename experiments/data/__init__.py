"""Data side of pipespec: dataset loaders, prompt construction and quality metrics.

    load_dataset(cfg)                       -> LoadedDataset of uniform Sample records
    prompts_for(cfg, tokenizer, family, context_length, budget,
                count=None, offset=0)  -> DatasetPrompts (dataset, Prompt records)
    build_prompt_ids(sample, template_cfg, tokenizer, family,
                     context_length, max_new_tokens) -> (ids, truncated)
    rouge_scores(predictions, references)   -> {"rouge1", "rouge2", "rougeL"}
    pass_at_1(problems, completions, allow_code_execution=True) -> {"pass@1", ...}

Configs are plain mappings (dicts or OmegaConf nodes) shaped like conf/dataset/*.yaml.
"""

from .loaders import (
    CONFIG_PREFIX,
    DataError,
    DatasetPathError,
    EmptyDatasetError,
    HubOfflineError,
    LoadedDataset,
    Sample,
    UnknownFieldError,
    hub_offline,
    load_dataset,
    select_samples,
)
from .prompts import (
    FAMILIES,
    PLACEHOLDER,
    DatasetPrompts,
    Prompt,
    PromptTooLongError,
    build_prompt_ids,
    encode_prompt,
    prompts_for,
    render_prompt_text,
)
from .quality import (
    HUMANEVAL_STOP_SEQUENCES,
    ROUGE_TYPES,
    CodeExecutionWarning,
    build_check_program,
    check_completion,
    extract_code_block,
    pass_at_1,
    rouge_per_sample,
    rouge_scores,
    truncate_at_stop,
)

__all__ = [
    "CONFIG_PREFIX",
    "CodeExecutionWarning",
    "DataError",
    "DatasetPathError",
    "DatasetPrompts",
    "EmptyDatasetError",
    "FAMILIES",
    "HUMANEVAL_STOP_SEQUENCES",
    "HubOfflineError",
    "LoadedDataset",
    "PLACEHOLDER",
    "Prompt",
    "PromptTooLongError",
    "ROUGE_TYPES",
    "Sample",
    "UnknownFieldError",
    "build_check_program",
    "build_prompt_ids",
    "check_completion",
    "encode_prompt",
    "extract_code_block",
    "hub_offline",
    "load_dataset",
    "pass_at_1",
    "prompts_for",
    "render_prompt_text",
    "rouge_per_sample",
    "rouge_scores",
    "select_samples",
    "truncate_at_stop",
]
