"""Hugging Face `generate` baselines (the bench's HF systems): what a user would run instead of pipespec on one machine.

    hf = HFBaseline(target_spec, draft_spec, threads=1)
    r = hf.generate(prompt_ids, 128, "greedy")                       # target.generate(do_sample=False)
    r = hf.generate(prompt_ids, 128, "assisted", assisted=settings)   # assistant_model=<the int8 draft>
    r = hf.generate(prompt_ids, 128, "prompt_lookup", prompt_lookup_num_tokens=8, max_matching_ngram_size=3)
    r = hf.generate(prompt_ids, 128, "compiled", threads=2)           # static cache + torch.compile'd decoding

Everything runs in the calling process (the benchmark's driver) with
`torch.set_num_threads(threads)` (per call: the bench times 1 and 2 threads and keeps
the faster).

"compiled" is transformers' documented fast path: a static KV cache sized once for every
call (`static_cache_len`, so the compiled decoding step keeps its shapes) and generate's own
`torch.compile` of the decoding forward (`compile_config`, on the CPU too). The first call
compiles (minutes on a CPU): `compile_warmup` makes it and returns its seconds, or raises
`CompileUnavailable` with the reason when this machine cannot compile. The models are loaded by `pipespec.models.load_model` from
the same stage specs as the pipeline (so the int8 dynamic-quantized draft is the
same model in both). Outputs are cut exactly as our greedy decoding cuts them (at
`max_new_tokens`, or just after the first EOS) so they compare token by token.

Forward hooks on the target (and the assistant) count the model calls, the tokens
fed to each and the time spent inside them, so an HF run can be broken down like a
pipeline trace: target compute, draft compute, everything else (generate's own
Python: candidate bookkeeping, logits processors, stopping criteria, cache crops).
A "compiled" call runs with no hook attached: dynamo would trace the hooks' Python state
and recompile at every call, slowing the very baseline it measures. Its counts follow
from greedy decoding itself (one prefill, then one token per forward) and its time is
the generate call's, measured from outside.

Assisted-generation window settings (`num_assistant_tokens`,
`num_assistant_tokens_schedule`, `assistant_confidence_threshold`) are read by
transformers from the *assistant's* generation config; `generate` here sets them on
it before every call (so a "heuristic" schedule does not carry state from one call
to the next) and reports the settings it used.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from pipespec.decoding import final_output
from pipespec.errors import ConfigError
from pipespec.models import eos_token_ids, load_model
from pipespec.specs import StageSpec
from pipespec.stats import StageStats

MODES = ("greedy", "assisted", "prompt_lookup", "compiled")


def compiled_graphs() -> int:
    """The graphs dynamo has compiled in this process so far (its `unique_graphs` counter; 0 before any)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompileUnavailable(RuntimeError):
    """The compiled HF path cannot run on this machine (no compiler, an inductor error); the message says why."""

# transformers 5.x global defaults for assisted generation (GenerationConfig._get_default_generation_params)
HF_ASSISTED_DEFAULTS = {
    "num_assistant_tokens": 20,
    "num_assistant_tokens_schedule": "constant",
    "assistant_confidence_threshold": 0.4,
}
SCHEDULES = ("constant", "heuristic", "heuristic_transient")
# An assisted setting of its own: N drafts with the target's first N layers (transformers' early-exit candidates,
# LayerSkip's self-speculation) instead of the draft model; None = the draft model.
EARLY_EXIT = "assistant_early_exit"


@dataclass
class HFResult:
    """One HF generate call: the output (cut like greedy's) and what the model hooks saw."""

    tokens: list[int]
    time_s: float
    mode: str
    prompt_length: int
    target_fed: list[int] = field(default_factory=list)  # tokens fed per target forward (first = prefill)
    target_time_s: float = 0.0  # time inside target forwards
    draft_calls: int = 0
    draft_time_s: float = 0.0  # time inside assistant forwards
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def target_calls(self) -> int:
        return len(self.target_fed)

    def target_stats(self) -> StageStats:
        """The target's counts as a stage trace would give them (for pooling with `pipespec.stats`).

        A target call feeds the candidates plus one pending token (the first call: the
        prompt plus candidates) and yields accepted + 1 tokens, so the accepted total is
        output tokens - target calls. A call that had no candidates (prompt lookup found
        no match) is a one-token step, as in our traces. Busy = time inside target
        forwards, wall = the generate call.
        """
        offered = [(fed - self.prompt_length if i == 0 else fed - 1) for i, fed in enumerate(self.target_fed)]
        verifies = sum(1 for o in offered if o > 0)
        return StageStats(
            steps=self.target_calls,
            verify_steps=verifies,
            single_steps=self.target_calls - verifies,
            offered=sum(max(o, 0) for o in offered),
            accepted=max(len(self.tokens) - self.target_calls, 0),
            produced=len(self.tokens),
            busy_s=self.target_time_s,
            wall_s=self.time_s,
            output_tokens=len(self.tokens),
        )


class _ForwardMeter:
    """Counts the forwards of one module, the tokens fed to each, the seconds spent inside and the decoder
    layers each ran (fewer than the model's: an early-exit draft)."""

    def __init__(self, module):
        self.fed: list[int] = []
        self.layers: list[int] = []
        self.durations: list[float] = []
        self.seconds = 0.0
        self._started = None
        self._module = module
        self._handles: list = []
        self.attach()

    def attach(self) -> None:
        if not self._handles:
            self._handles = [
                self._module.register_forward_pre_hook(self._pre, with_kwargs=True),
                self._module.register_forward_hook(self._post),
            ]

    def reset(self) -> None:
        self.fed, self.layers, self.durations, self.seconds = [], [], [], 0.0

    def split(self, layers: int) -> tuple[list[int], float, int, float]:
        """(tokens fed per forward, seconds) of the forwards through all `layers`, then (calls, seconds) of
        the truncated ones: the target's and its early-exit drafts' shares of one model's forwards."""
        full = [i for i, n in enumerate(self.layers) if n >= layers]
        full_s = sum(self.durations[i] for i in full)
        return [self.fed[i] for i in full], full_s, len(self.fed) - len(full), self.seconds - full_s

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        self.fed.append(int(ids.shape[1]) if ids is not None else 0)
        self.layers.append(int(getattr(getattr(module, "config", None), "num_hidden_layers", 0) or 0))
        self._started = time.perf_counter()

    def _post(self, module, args, output):
        if self._started is not None:
            elapsed = time.perf_counter() - self._started
            self.seconds += elapsed
            self.durations.append(elapsed)
            self._started = None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@contextlib.contextmanager
def _unmetered(*meters: _ForwardMeter | None) -> Iterator[None]:
    """No hook on the models inside (a compiled call: nothing of ours for dynamo to trace)."""
    present = [m for m in meters if m is not None]
    for meter in present:
        meter.remove()
    try:
        yield
    finally:
        for meter in present:
            meter.attach()


def assisted_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Complete and check assisted-generation window settings (missing keys: transformers' defaults)."""
    merged = dict(HF_ASSISTED_DEFAULTS)
    unknown = sorted(set(settings or {}) - set(merged) - {EARLY_EXIT})
    if unknown:
        raise ConfigError(f"unknown HF assisted-generation setting(s) {unknown}; "
                          f"expected some of {sorted([*merged, EARLY_EXIT])}")  # fmt: skip
    merged.update({k: v for k, v in (settings or {}).items() if v is not None})
    layers = merged.get(EARLY_EXIT)
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ConfigError(f"{EARLY_EXIT} must be null (the draft model) or a number of layers >= 1, got {layers!r}")
    if not isinstance(merged["num_assistant_tokens"], int) or merged["num_assistant_tokens"] < 1:
        raise ConfigError(f"num_assistant_tokens must be an integer >= 1, got {merged['num_assistant_tokens']!r}")
    if merged["num_assistant_tokens_schedule"] not in SCHEDULES:
        raise ConfigError(
            f"num_assistant_tokens_schedule must be one of {list(SCHEDULES)}, "
            f"got {merged['num_assistant_tokens_schedule']!r}"
        )
    threshold = merged["assistant_confidence_threshold"]
    if not isinstance(threshold, (int, float)) or not 0 <= threshold < 1:
        raise ConfigError(f"assistant_confidence_threshold must be in [0, 1) (0 = off), got {threshold!r}")
    merged["assistant_confidence_threshold"] = float(threshold)
    return merged


class HFBaseline:
    """The target (and optionally an assistant) loaded in this process for HF `generate` runs."""

    def __init__(self, target: StageSpec, draft: StageSpec | None = None, threads: int = 1,
                 static_cache_len: int = 2048):  # fmt: skip
        import torch

        if target.kind != "hf":
            raise ConfigError("the HF baseline's target must be a model stage")
        if draft is not None and draft.kind != "hf":
            raise ConfigError("the HF assistant must be a model stage (prompt lookup is its own mode)")
        torch.set_num_threads(threads)
        self.threads = threads
        self.static_cache_len = static_cache_len
        self.target_spec, self.draft_spec = target, draft
        self.target = load_model(target)
        self.draft = load_model(draft) if draft is not None else None
        self.eos_ids = eos_token_ids(target.model)
        self._target_meter = _ForwardMeter(self.target)
        self._draft_meter = _ForwardMeter(self.draft) if self.draft is not None else None

    def close(self) -> None:
        self._target_meter.remove()
        if self._draft_meter is not None:
            self._draft_meter.remove()

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        mode: str = "greedy",
        *,
        assisted: Mapping[str, Any] | None = None,
        prompt_lookup_num_tokens: int = 10,
        max_matching_ngram_size: int = 2,
        threads: int | None = None,
    ) -> HFResult:
        import torch

        torch.set_num_threads(threads or self.threads)
        if mode not in MODES:
            raise ConfigError(f"HF mode must be one of {list(MODES)}, got {mode!r}")
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ConfigError(f"max_new_tokens must be an integer > 0, got {max_new_tokens!r}")
        kwargs: dict[str, Any] = {
            "do_sample": False,
            "num_beams": 1,
            "max_new_tokens": max_new_tokens,
            "eos_token_id": list(self.eos_ids) or None,
            "pad_token_id": self.eos_ids[0] if self.eos_ids else None,
        }
        settings: dict[str, Any] = {}
        if mode == "assisted":
            settings = assisted_settings(assisted)
            kwargs.update(self._assistant(settings))
        elif mode == "prompt_lookup":
            if prompt_lookup_num_tokens < 1 or max_matching_ngram_size < 1:
                raise ConfigError("prompt lookup needs prompt_lookup_num_tokens >= 1 and max_matching_ngram_size >= 1")
            settings = {
                "prompt_lookup_num_tokens": int(prompt_lookup_num_tokens),
                "max_matching_ngram_size": int(max_matching_ngram_size),
            }
            kwargs.update(settings)
        elif mode == "compiled":
            kwargs.update(self._compiled_kwargs(len(prompt_ids), max_new_tokens))
            settings = {"cache_implementation": "static", "max_cache_len": self.static_cache_len, "compile": "decoding"}
        settings["threads"] = threads or self.threads
        device = next(self.target.parameters()).device
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        attention_mask = torch.ones_like(input_ids)
        self._target_meter.reset()
        if self._draft_meter is not None:
            self._draft_meter.reset()
        hooks = contextlib.nullcontext() if mode != "compiled" else _unmetered(self._target_meter, self._draft_meter)
        with hooks, torch.inference_mode():
            started = time.perf_counter()
            output = self.target.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            elapsed = time.perf_counter() - started
        generated = output[0, input_ids.shape[1] :].tolist()
        tokens = final_output(generated, max_new_tokens, self.eos_ids)
        draft_meter = self._draft_meter if mode == "assisted" else None
        if mode == "compiled":  # greedy: one prefill, then one forward per further token; timed from outside
            target_fed, target_s, draft_calls, draft_s = [len(prompt_ids)] + [1] * (len(generated) - 1), elapsed, 0, 0.0
        else:
            target_fed, target_s, draft_calls, draft_s = self._target_meter.split(self.target.config.num_hidden_layers)
        if draft_meter is not None and settings.get(EARLY_EXIT) is None:
            draft_calls, draft_s = len(draft_meter.fed), draft_meter.seconds
        return HFResult(tokens=tokens, time_s=elapsed, mode=mode, prompt_length=len(prompt_ids), target_fed=target_fed,
                        target_time_s=target_s, draft_calls=draft_calls, draft_time_s=draft_s,
                        settings=settings)  # fmt: skip

    def _assistant(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """`generate`'s arguments for an assisted call: the draft model as `assistant_model`, or with
        `assistant_early_exit` N the target's own first N layers. The window settings go on that assistant's
        generation config, where transformers reads them, before every call."""
        layers = settings.get(EARLY_EXIT)
        if layers is None:
            if self.draft is None:
                raise ConfigError("HF assisted generation needs a draft model (assistant_model)")
            assistant, arguments = self.draft, {"assistant_model": self.draft}
        else:
            total = self.target.config.num_hidden_layers
            if layers >= total:
                raise ConfigError(f"{EARLY_EXIT} must be below the target's {total} layers, got {layers}")
            assistant, arguments = self.target, {EARLY_EXIT: layers}
        for key in HF_ASSISTED_DEFAULTS:
            setattr(assistant.generation_config, key, settings[key])
        return arguments

    def _compiled_kwargs(self, prompt_length: int, max_new_tokens: int) -> dict[str, Any]:
        from transformers import CompileConfig

        if prompt_length + max_new_tokens > self.static_cache_len:
            raise ConfigError(f"the compiled HF path's static cache holds {self.static_cache_len} tokens: a prompt of "
                              f"{prompt_length} + {max_new_tokens} new does not fit (raise static_cache_len)")  # fmt: skip
        config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
        config._compile_all_devices = True  # transformers compiles on CUDA-like devices only unless told
        return {"cache_implementation": "static", "max_cache_len": self.static_cache_len, "compile_config": config}

    def compile_warmup(self, prompt_ids: Sequence[int], max_new_tokens: int, threads: int | None = None) -> float:
        """Compile the decoding step (one "compiled" call) and return its seconds; `CompileUnavailable` naming
        the reason when this machine cannot compile."""
        started = time.perf_counter()
        try:
            result = self.generate(prompt_ids, max_new_tokens, "compiled", threads=threads)
        except ConfigError:
            raise
        except Exception as error:  # inductor needs a working C++ compiler; any failure of it is a reason to report
            text = " ".join(str(error).split())[:200] or type(error).__name__
            raise CompileUnavailable(f"{type(error).__name__}: {text}") from None
        if not result.tokens:
            raise CompileUnavailable("the compiled call produced no tokens")
        return time.perf_counter() - started
