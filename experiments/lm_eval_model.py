"""lm-evaluation-harness's `pipespec` model: a named hierarchy evaluated by lm-eval.

    python -m experiments.lm_eval --model pipespec \\
        --model_args hierarchy=smollm2_int8_fp32,strategy=pipespec,lookahead=2 --tasks TASKS

`generate_until` generates through a pipespec `Pipeline` of the hierarchy: greedy, or sampled where the
request asks for it (`do_sample`, `temperature`, `top_k`, `top_p`; the target's generation config gives
top-k and top-p where the request does not), until the target's end of sequence or `max_gen_toks`, then
cuts the text at the first stop sequence (`until`). `loglikelihood` and `loglikelihood_rolling` score
with the target alone, loaded in this process by `pipespec.models.load_model`. Tokenization, truncation
and scoring are those of lm-eval's `hf` model (`HFLM`, subclassed here), so on the same target directory
both give the same scores, and greedy generations are `hf`'s: every strategy is token-identical to
greedy decoding of the target.

Importing this module registers the model (`lm_eval.api.registry.register_model`). lm-eval 0.4.13 looks
for models only among its own modules and the ones already imported, hence the command line
`python -m experiments.lm_eval` (lm_eval's own, after this import).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, fields, replace
from typing import Any, Iterator, Mapping

from tqdm import tqdm

from experiments.compose import load
from experiments.hierarchies import available, load_hierarchy
from pipespec.api import Pipeline
from pipespec.errors import ConfigError
from pipespec.models import load_model, load_tokenizer

try:
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"experiments.lm_eval_model needs lm-eval (missing {error.name}): pip install 'pipespec[lmeval]'",
        name=error.name,
    ) from error

# nothing is deferred: lm-eval's hf model (lm_eval.models.huggingface) loads torch and transformers, so
# pipespec.api, which imports torch, adds no library to importing this module.

MODEL_NAME = "pipespec"
STRATEGY_KEYS = ("lookahead", "max_lead", "draft_confidence", "size_verification", "cascade", "value_stop")
SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p")  # besides until and max_gen_toks (and its aliases)


@dataclass(frozen=True)
class PipespecArgs:
    """The `--model_args` of `--model pipespec`: the hierarchy, the strategy and lm-eval's scoring options."""

    hierarchy: str  # a models option (conf/models/NAME.yaml), e.g. tiny_k2, smollm2_int8_fp32
    strategy: str = "pipespec"  # a strategy option (conf/strategy): greedy, sd, sd8, pipespec
    lookahead: int | None = None  # None: the strategy option's value (likewise the five below)
    max_lead: int | None = None
    draft_confidence: float | None = None
    size_verification: bool | None = None
    cascade: bool | None = None
    value_stop: float | None = None
    seed: int = 0  # generate_until request i of a call samples with seed + i
    stall_timeout_s: float = 30.0
    start_timeout_s: float = 600.0
    # as lm-eval's hf model takes them: they decide tokenization, truncation and scoring batches
    max_length: int | None = None
    add_bos_token: bool | None = None
    prefix_token_id: int | None = None
    truncation: bool = False
    batch_size: int | str = 1
    max_batch_size: int | None = 64
    device: str | None = None  # lm-eval's --device is not used: the hierarchy places every stage

    @classmethod
    def from_model_args(cls, model_args: Mapping[str, Any]) -> "PipespecArgs":
        """From lm-eval's parsed `--model_args` (and its batch_size, max_batch_size, device); unknown names refused."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(model_args) - set(known))
        if unknown:
            raise ConfigError(f"unknown --model_args {unknown} for --model {MODEL_NAME}; expected some of {known}")
        if not model_args.get("hierarchy"):
            raise ConfigError(f"--model {MODEL_NAME} needs --model_args hierarchy=NAME, one of {available()}")
        return cls(**{key: value for key, value in model_args.items() if value is not None})

    def strategy_options(self) -> dict[str, Any]:
        """The strategy option's settings (conf/strategy/STRATEGY.yaml) with the ones given here on top."""
        options = load("strategy", str(self.strategy))
        given = {key: getattr(self, key) for key in STRATEGY_KEYS if getattr(self, key) is not None}
        return {"strategy": options["name"], **{key: options[key] for key in STRATEGY_KEYS}, **given}


@dataclass(frozen=True)
class GenerationCall:
    """One generate_until request, checked: prompt ids as `hf` encodes them, budget, stop sequences, sampling."""

    prompt_ids: list[int]
    max_new_tokens: int
    until: list[str]
    sampling: dict[str, Any]


@contextlib.contextmanager
def quiet(logger_name: str) -> Iterator[None]:
    """Only errors from `logger_name` meanwhile (HFLM warns at length about being handed a loaded model)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@register_model(MODEL_NAME)
class PipespecLM(HFLM):
    """lm-eval's `pipespec` model: generate_until through a pipespec Pipeline, loglikelihood through its target."""

    def __init__(self, **model_args: Any) -> None:
        self.args = PipespecArgs.from_model_args(model_args)
        # every check (hierarchy, strategy options, shared vocabulary) before any model loads
        self.pipeline = Pipeline(
            load_hierarchy(str(self.args.hierarchy)), **self.args.strategy_options(), seed=self.args.seed,
            stall_timeout_s=self.args.stall_timeout_s, start_timeout_s=self.args.start_timeout_s,
        )  # fmt: skip
        target = self.pipeline.specs[-1]
        # the scoring copy runs torch's own kernels, as hf's model does (a stage's choice may be oneDNN's)
        model = load_model(replace(target, kernels="torch"))
        with quiet(HFLM.__module__):
            super().__init__(
                pretrained=model, backend="causal", tokenizer=load_tokenizer(target.model),
                max_length=self.args.max_length, add_bos_token=self.args.add_bos_token,
                prefix_token_id=self.args.prefix_token_id, truncation=self.args.truncation,
                batch_size=self.args.batch_size, max_batch_size=self.args.max_batch_size,
            )  # fmt: skip

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Each request's continuation, generated by the pipeline and cut at its first stop sequence."""
        calls = [self.generation_call(context, gen_kwargs) for context, gen_kwargs in (r.args for r in requests)]
        outputs = []
        bar = tqdm(total=len(calls), disable=disable_tqdm or self.rank != 0, desc="generate_until (pipespec)")
        try:
            for index, (request, call) in enumerate(zip(requests, calls)):
                result = self.pipeline.generate(call.prompt_ids, call.max_new_tokens, **call.sampling,
                                                seed=self.args.seed + index)  # fmt: skip
                text = postprocess_generated_text(self.tok_decode(result.tokens), call.until, think_end_token=None)
                outputs.append(text)
                self.cache_hook.add_partial("generate_until", request.args, text)
                bar.update(1)
        finally:
            bar.close()
            self.pipeline.close()  # the stage processes live for one call (lm-eval makes one per evaluation)
        return outputs

    def generation_call(self, context: str, gen_kwargs: Mapping[str, Any]) -> GenerationCall:
        """A request's prompt ids (hf's encoding and left truncation), budget, stop sequences and sampling."""
        kwargs = dict(normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks))
        eos = None if self.eot_token_id is None else self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_new_tokens = kwargs.pop("max_gen_toks")
        sampling = self.sampling_options(kwargs)
        room = self.max_length - max_new_tokens
        if room <= 0:
            raise ConfigError(f"max_gen_toks {max_new_tokens} leaves no room for a prompt in max_length "
                              f"{self.max_length}")  # fmt: skip
        ids, _ = self.tok_batch_encode([context], left_truncate_len=room, truncation=self.truncation)
        return GenerationCall(ids[0].tolist(), max_new_tokens, until, sampling)

    def sampling_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Pipeline.generate's temperature / top_k / top_p for a request's normalized generation kwargs
        (`until` and `max_gen_toks` taken out); an option the pipeline cannot honour is refused."""
        unsupported = sorted(set(kwargs) - set(SAMPLING_KEYS))
        if unsupported:
            raise ConfigError(f"--model {MODEL_NAME} cannot apply the generation option(s) {unsupported}; it takes "
                              f"until, max_gen_toks and {', '.join(SAMPLING_KEYS)}")  # fmt: skip
        temperature = float(kwargs.get("temperature") or 0.0)
        if not kwargs.get("do_sample") or temperature == 0.0:
            return {"temperature": 0.0}
        defaults = self.model.generation_config  # what hf's generate samples with where the request is silent
        top_k = kwargs.get("top_k", defaults.top_k)
        top_p = kwargs.get("top_p", defaults.top_p)
        return {"temperature": temperature, "top_k": int(top_k or 0), "top_p": 1.0 if top_p is None else float(top_p)}

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records of the model: the target's size and dtype, the hierarchy and the strategy."""
        return {
            "model_num_parameters": self.model.num_parameters(),
            "model_dtype": str(self.model.dtype),
            "pipespec_hierarchy": self.args.hierarchy,
            "pipespec_stages": self.pipeline.stage_labels,
            "pipespec_strategy": self.pipeline.strategy,
        }
