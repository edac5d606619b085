"""Plain names for readers: the one mapping from config ids to the names every figure, table and report shows.

    stage_name("1:smollm2-fp32")                       -> "fp32"
    hierarchy_name(["prompt-lookup", "smollm2-int8", "smollm2-fp32"]) -> "lookup -> int8 -> fp32"
    system_name("pipespec", ["prompt-lookup", "smollm2-int8", "smollm2-fp32"])
                                                       -> "PipeSpec k=3 (lookup -> int8 -> fp32)"
    configuration_name("pipespec_L1_M16_T4_S0-2")      -> "PipeSpec, lookahead 1, max lead 16, trees of 4, stages 0 and 2"

Stage ids are the engine's stage names (`models.stages[i].name`), optionally prefixed with the stage index
(`"1:smollm2-fp32"`), or the authors' model paths (`meta-llama/Llama-3.1-8B-Instruct`). An id this module does
not know keeps its own text, so a new hierarchy is readable before it is named here.
"""

from __future__ import annotations

import re
from typing import Sequence

STRATEGY_NAMES = {
    "greedy": "greedy (target alone)",
    "sd": "SD",
    "chain": "SD",
    "pipespec": "PipeSpec",
    "async-chain": "PipeSpec",
    "auto": "auto",
}
SHORT_STRATEGY_NAMES = {"greedy": "AR", "sd": "SD", "chain": "SD", "pipespec": "PipeSpec", "async-chain": "PipeSpec"}
STRATEGY_ORDER = ("greedy", "sd", "pipespec", "auto")  # rows and legends in this order

# Stage names as the configs spell them -> what a reader sees. Matched whole, after the index prefix is dropped.
STAGE_NAMES = {
    "prompt-lookup": "lookup",
    "suffix": "suffix",
    "suffix-flat": "flat suffix",
    "suffix-tree8": "suffix trees of 8",
    "suffix-tree16": "suffix trees of 16",
    "suffix-flat-tree8": "flat suffix trees of 8",
    "smollm2-int8": "int8",
    "smollm2-int8v16k": "int8 (16k vocabulary)",
    "smollm2-fp32": "fp32",
    "smollm2-fp32-t2": "fp32 on 2 threads",
    "smollm2-fp32-compiled": "compiled fp32",
    "smollm2-fp32-t2-compiled": "compiled fp32 on 2 threads",
    "tiny-draft": "tiny draft",
    "tiny-draft-0.3": "tiny draft (noise 0.3)",
    "tiny-draft-0.05": "tiny draft (noise 0.05)",
    "tiny-target": "tiny target",
    "llama-68m": "LLaMA-68M",
    "llama2-7b": "LLaMA-2-7B",
    "llama2-13b": "LLaMA-2-13B",
    "llama3.2-1b": "LLaMA-3.2-1B",
    "llama3.1-8b": "LLaMA-3.1-8B",
    "llama3.1-70b": "LLaMA-3.1-70B",
}
# The authors' model ids (their logs name checkpoints, not stages)
_HUB_MODEL = re.compile(r"(?:.*/)?(?:Meta-)?(Llama)-(\d(?:\.\d)?)-(\d+[BM])(?:-Instruct|-hf)?$", re.IGNORECASE)
_CONFIGURATION = re.compile(
    r"^(?P<strategy>greedy|sd|pipespec|auto)"
    r"(?:_L(?P<lookahead>\d+))?(?:_M(?P<max_lead>\d+))?(?:_T(?P<tree>\d+))?(?:_S(?P<stages>[\d-]+))?$")

# Hierarchy ids of conf/models whose stages are not at hand (e.g. a summary's `models` field)
HIERARCHY_STAGES = {
    "smollm2_int8_fp32": ("smollm2-int8", "smollm2-fp32"),
    "smollm2_int8v16k_fp32": ("smollm2-int8v16k", "smollm2-fp32"),
    "smollm2_pld_fp32": ("prompt-lookup", "smollm2-fp32"),
    "smollm2_pld_int8_fp32": ("prompt-lookup", "smollm2-int8", "smollm2-fp32"),
    "smollm2_suffix_fp32": ("suffix", "smollm2-fp32"),
    "smollm2_suffix_fp32_t2": ("suffix", "smollm2-fp32-t2"),
    "smollm2_suffix_fp32_compiled": ("suffix", "smollm2-fp32-compiled"),
    "smollm2_suffix_flat_fp32_t2": ("suffix-flat", "smollm2-fp32-t2"),
    "smollm2_suffix_flat_fp32_t2_compiled": ("suffix-flat", "smollm2-fp32-t2-compiled"),
    "smollm2_suffix_flat_tree8_fp32_t2": ("suffix-flat-tree8", "smollm2-fp32-t2"),
    "smollm2_suffix_flat_tree8_fp32_t2_compiled": ("suffix-flat-tree8", "smollm2-fp32-t2-compiled"),
    "smollm2_suffix_int8_fp32": ("suffix", "smollm2-int8", "smollm2-fp32"),
    "smollm2_suffix_int8v16k_fp32": ("suffix", "smollm2-int8v16k", "smollm2-fp32"),
    "smollm2_suffix_tree8_fp32": ("suffix-tree8", "smollm2-fp32"),
    "smollm2_suffix_tree8_fp32_t2": ("suffix-tree8", "smollm2-fp32-t2"),
    "smollm2_suffix_tree16_fp32": ("suffix-tree16", "smollm2-fp32"),
    "tiny_k2": ("tiny-draft", "tiny-target"),
    "tiny_k3": ("tiny-draft-0.3", "tiny-draft-0.05", "tiny-target"),
    "llama2_68m_7b": ("llama-68m", "llama2-7b"),
    "llama2_68m_13b": ("llama-68m", "llama2-13b"),
    "llama2_68m_7b_13b": ("llama-68m", "llama2-7b", "llama2-13b"),
    "llama3_1b_8b": ("llama3.2-1b", "llama3.1-8b"),
    "llama3_8b_70b": ("llama3.1-8b", "llama3.1-70b"),
    "llama3_1b_8b_70b": ("llama3.2-1b", "llama3.1-8b", "llama3.1-70b"),
}
DATASET_NAMES = {
    "humaneval": "HumanEval",
    "news_lee_cnndm": "news_lee (CNN/DM stand-in)",
    "news_lee_xsum": "news_lee (XSum stand-in)",
    "cnn_dailymail": "CNN/DM",
    "xsum": "XSum",
    "spec_bench": "Spec-Bench",
}


def stage_name(stage: str) -> str:
    """A stage's plain name: "1:smollm2-fp32" -> "fp32", "meta-llama/Llama-3.1-8B-Instruct" -> "LLaMA-3.1-8B"."""
    head, sep, tail = stage.partition(":")
    bare = tail if sep and head.isdigit() else stage
    if bare in STAGE_NAMES:
        return STAGE_NAMES[bare]
    hub = _HUB_MODEL.match(bare)
    if hub:
        return f"LLaMA-{hub.group(2)}-{hub.group(3).upper()}"
    return bare


def hierarchy_name(stages: Sequence[str] | str) -> str:
    """ "lookup -> int8 -> fp32": the stages' plain names, smallest drafter first; a hierarchy id is looked up."""
    if isinstance(stages, str):
        if stages not in HIERARCHY_STAGES:
            return stages
        stages = HIERARCHY_STAGES[stages]
    return " -> ".join(stage_name(s) for s in stages)


def system_name(strategy: str, stages: Sequence[str] | str | None = None) -> str:
    """ "PipeSpec k=3 (lookup -> int8 -> fp32)", "SD k=2 (int8 -> fp32)", "greedy (fp32)"."""
    if isinstance(stages, str):
        stages = HIERARCHY_STAGES.get(stages, (stages,))
    if strategy in ("greedy",):
        return f"greedy ({stage_name(stages[-1])})" if stages else STRATEGY_NAMES["greedy"]
    label = STRATEGY_NAMES.get(strategy, strategy)
    if not stages:
        return label
    return f"{label} k={len(stages)} ({hierarchy_name(stages)})"


def configuration_name(configuration: str) -> str:
    """A sweep configuration id in words: "sd_L3" -> "SD, lookahead 3"; unknown ids are returned as they are."""
    match = _CONFIGURATION.match(configuration)
    if not match:
        return configuration
    parts = [STRATEGY_NAMES[match["strategy"]] if match["strategy"] != "greedy" else "greedy"]
    if match["lookahead"] is not None:
        parts.append(f"lookahead {match['lookahead']}")
    if match["max_lead"] is not None:
        parts.append(f"max lead {match['max_lead']}")
    if match["tree"] is not None:
        parts.append(f"trees of {match['tree']}")
    if match["stages"] is not None:
        indices = match["stages"].split("-")
        parts.append("stages " + " and ".join(indices) if len(indices) > 1 else f"stage {indices[0]}")
    return ", ".join(parts)


def configuration_key(configuration: str) -> tuple:
    """Sort key putting rows in a reader's order: greedy, SD by lookahead, PipeSpec by lookahead and lead."""
    match = _CONFIGURATION.match(configuration)
    if not match:
        return (len(STRATEGY_ORDER), configuration)
    numbers = tuple(int(match[g]) if match[g] is not None else -1 for g in ("lookahead", "max_lead", "tree"))
    return (STRATEGY_ORDER.index(match["strategy"]), *numbers, match["stages"] or "")


def dataset_name(dataset: str) -> str:
    """ "news_lee_cnndm" -> "news_lee (CNN/DM stand-in)": a stand-in is labelled as one wherever it appears."""
    return DATASET_NAMES.get(dataset, dataset)


# The bench's baselines and anchors (experiments.bench), by system name; SD and PipeSpec rows are named by
# `system_name` from their stages.
BENCH_SYSTEM_NAMES = {
    "hf_greedy": "HF greedy",
    "hf_compiled": "HF greedy, compiled (static cache + torch.compile)",
    "hf_assisted": "HF assisted generation (int8 -> fp32)",
    "hf_prompt_lookup": "HF prompt lookup (fp32)",
    "llamacpp_greedy": "llama.cpp greedy (f32 GGUF of the same weights)",
    "llamacpp_prompt_lookup": "llama.cpp prompt lookup (f32 GGUF)",
    "llamacpp_q4": "llama.cpp greedy (Q4_1 GGUF: other weights, a reference)",
    "greedy": "greedy (fp32), ours",
}


def bench_system_name(name: str, strategy: str | None = None, stages: Sequence[str] | None = None) -> str:
    """A bench row in words: "HF greedy", "llama.cpp greedy (f32 GGUF ...)", "SD k=2 (flat suffix -> ...)"."""
    if name in BENCH_SYSTEM_NAMES:
        return BENCH_SYSTEM_NAMES[name]
    if strategy in ("sd", "pipespec") and stages:
        return system_name(strategy, stages)
    strategy_part, at, hierarchy = name.partition("@")
    return system_name(strategy_part, hierarchy) if at and strategy_part in STRATEGY_NAMES else name
