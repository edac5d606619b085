"""Where a run's stages go and in which precision: the one check of `models.stages` (`RunConfig.from_config`).

    names, stages, specs = place_stages(models, placement="auto", precision="bf16", plan=False)

A run's stages come from its hierarchy file (`conf/models/NAME.yaml`), each stage's `model`, `device`,
`dtype` and `quantize` overridable by index on the command line (`models.stages.2.device=cuda:1`), then
two shorthands over all of them:

- `placement`: `auto` (each model stage its own visible GPU, in stage order; a stage the hierarchy splits
  over several GPUs, the 70B, keeps as many where enough are left; no GPU: the CPU), `auto:N` (the same
  for N GPUs, to plan for a machine this is not), one device for every model stage (`cpu`, `cuda:0`), or
  one device per stage (`[cuda:0,cuda:1,cuda:2+cuda:3]`, `+` joining the GPUs of a split stage; or the
  quoted string `"cuda:0,cuda:1,cuda:1"`). `auto` and a single device leave model-free drafters and
  `int8-dynamic` stages (CPU only) where they are; a list is taken as written.
- `precision`: `fp32`, `fp16` or `bf16` for every model stage but `int8-dynamic` ones (an nf4 stage
  computes in it). Where it changes a dtype, the run records the hierarchy as `NAME_<precision>`, so runs
  of one hierarchy at two precisions are never pooled or compared as one.

Every stage's options are then checked by the engine's `StageSpec` (one `ConfigError`, prefixed with the
stage as the user types it: `models.stages.0 (llama3.2-1b): ...`), and outside plan mode the GPUs the
stages name against the GPUs this machine has: too few is one `ConfigError` naming `placement=`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from experiments.hierarchies import resolve_stages
from pipespec.errors import ConfigError
from pipespec.specs import MODEL_FREE_KINDS, StageSpec

# torch is imported where the visible GPUs are counted (`visible_gpus`): importing this module, and placing
# stages on named devices or a given GPU count (`auto:N`) in plan mode, import no torch.

PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
              "float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}  # fmt: skip
SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
PLACEMENT_FORMS = "auto, auto:N, cpu, cuda:N, or one device per stage: [cuda:0,cuda:1,cuda:2+cuda:3]"


def _gpu_capable(stage: Mapping[str, Any]) -> bool:
    """A model stage that can run on a GPU (not a model-free drafter, not int8-dynamic, which is CPU only)."""
    return stage.get("kind", "hf") not in MODEL_FREE_KINDS and stage.get("quantize") != "int8-dynamic"


def _cuda_indices(device: Any) -> list[int]:
    """The GPU indices a device string names (`cuda` alone: 0); malformed parts are left to `StageSpec`."""
    out = []
    for part in str(device).split(","):
        kind, _, index = part.strip().partition(":")
        if kind == "cuda" and (not index or index.isdigit()):
            out.append(int(index or 0))
    return out


def visible_gpus() -> tuple[int, str]:
    """The GPUs torch can use here, and the phrase a message says about them."""
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return 0, f"no GPU (torch {torch.__version__} is a CPU-only build)"
    if not torch.cuda.is_available():
        return 0, f"no usable GPU (torch {torch.__version__} finds no GPU or driver)"
    count = torch.cuda.device_count()
    return count, f"{count} GPU(s)"


def _placement_list(placement: Any, n_stages: int, hierarchy: str) -> list[str] | None:
    """The per-stage devices of a list placement, None for the other forms."""
    if isinstance(placement, str) and "," in placement:
        placement = [p.strip() for p in placement.split(",")]
    if not isinstance(placement, (list, tuple)):
        return None
    if not all(isinstance(p, str) and p.strip() for p in placement):
        raise ConfigError(f"placement must list one device per stage ({PLACEMENT_FORMS}), got {placement!r}")
    if len(placement) != n_stages:
        raise ConfigError(f"placement lists {len(placement)} device(s) for the {n_stages} stages of {hierarchy}: "
                          f"give one per stage, e.g. placement=[{','.join(['cuda:0'] * n_stages)}] (in a sweep over "
                          "hierarchies of several depths, run one: models=NAME)")  # fmt: skip
    return [p.strip().replace("+", ",") for p in placement]


def auto_devices(stages: Sequence[Mapping[str, Any]], n_gpus: int) -> list[str]:
    """`placement=auto` on `n_gpus` GPUs: each GPU-capable stage one GPU in stage order, the GPUs left over to
    the stages the hierarchy splits over several (as many as it lists); the others keep their device."""
    capable = [i for i, s in enumerate(stages) if _gpu_capable(s)]
    devices = [str(s.get("device", "cpu")) for s in stages]
    if n_gpus == 0:
        return [("cpu" if i in capable else d) for i, d in enumerate(devices)]
    if len(capable) > n_gpus:
        example = ",".join(f"cuda:{j % n_gpus}" for j in range(len(stages)))
        raise ConfigError(f"placement=auto gives each of the {len(capable)} model stages its own GPU, but {n_gpus} "
                          f"GPU(s) are visible: share them explicitly, e.g. placement=cuda:0 (every stage on it) or "
                          f"placement=[{example}]")  # fmt: skip
    counts, spare = {}, n_gpus - len(capable)
    for i in capable:
        extra = min(max(len(_cuda_indices(devices[i])) - 1, 0), spare)
        counts[i], spare = 1 + extra, spare - extra
    start = 0
    for i in capable:
        devices[i] = ",".join(f"cuda:{g}" for g in range(start, start + counts[i]))
        start += counts[i]
    return devices


def placed_devices(stages: Sequence[Mapping[str, Any]], placement: Any, n_gpus=None, hierarchy: str = "the hierarchy"
                   ) -> list[str]:  # fmt: skip
    """Each stage's device under `placement` (None: as the stages say). `n_gpus`: a callable giving the
    visible GPU count, asked only by `auto`."""
    devices = [str(s.get("device", "cpu")) for s in stages]
    if placement is None:
        return devices
    listed = _placement_list(placement, len(stages), hierarchy)
    if listed is not None:
        return listed
    if not isinstance(placement, str) or not placement.strip():
        raise ConfigError(f"placement must be one of {PLACEMENT_FORMS}, got {placement!r}")
    placement = placement.strip()
    if placement == "auto" or placement.startswith("auto:"):
        count = placement.partition(":")[2]
        if count and not count.isdigit():
            raise ConfigError(f"placement auto:N needs a number of GPUs, got {placement!r}")
        return auto_devices(stages, int(count) if count else (n_gpus() if n_gpus else visible_gpus()[0]))
    return [placement if _gpu_capable(s) else d for s, d in zip(stages, devices)]


def apply_precision(stages: Sequence[dict], precision: Any) -> tuple[list[dict], bool]:
    """The stages with every GPU-capable model stage's dtype set to `precision`, and whether any changed."""
    if precision is None:
        return [dict(s) for s in stages], False
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be null, fp32, fp16 or bf16, got {precision!r}")
    out, changed = [], False
    for stage in stages:
        stage = dict(stage)
        if _gpu_capable(stage) and stage.get("dtype", "float32") != PRECISIONS[precision]:
            stage["dtype"], changed = PRECISIONS[precision], True
        out.append(stage)
    return out, changed


def check_gpu_count(hierarchy: str, stages: Sequence[Mapping[str, Any]], n_gpus: int, what: str) -> None:
    """One `ConfigError` naming `placement=` where the stages name GPUs this machine does not have."""
    models = [s for s in stages if s.get("kind", "hf") not in MODEL_FREE_KINDS]
    named = sorted({g for s in models for g in _cuda_indices(s.get("device"))})
    if not named or named[-1] < n_gpus:
        return
    capable = sum(_gpu_capable(s) for s in stages)
    if n_gpus == 0 and any(s.get("quantize") == "nf4" for s in models):
        hint = "run.plan=true to plan without GPUs (its nf4 stage needs CUDA: run it where there are GPUs)"
    elif n_gpus == 0:
        hint = "placement=cpu (every model stage on the CPU)"
    elif capable <= n_gpus:
        hint = "placement=auto (one GPU per stage)"
    else:
        example = ",".join(f"cuda:{j % n_gpus}" for j in range(len(stages)))
        hint = f"placement=cuda:0 (every stage on cuda:0) or placement=[{example}]"
    devices = ", ".join(str(s.get("device") or "cpu") for s in stages)
    gpus = ", ".join(f"cuda:{g}" for g in named)
    raise ConfigError(f"{hierarchy}: its stages name GPU(s) {gpus} (stages on {devices}) "
                      f"but this machine has {what}: set {hint}")  # fmt: skip


def _checked(index: int, stage: Mapping[str, Any], check: Callable[[], Any]) -> Any:
    try:
        return check()
    except ConfigError as error:
        raise ConfigError(f"models.stages.{index} ({stage.get('name') or stage.get('model') or stage.get('kind')}): "
                          f"{error}") from None  # fmt: skip


def place_stages(models: Mapping[str, Any], placement: Any = None, precision: Any = None, plan: bool = False,
                 gpus=visible_gpus) -> tuple[str, list[dict], list[StageSpec]]:
    """(hierarchy name as recorded, the stage mappings as run, their checked specs) of a `models` section under
    `placement` and `precision`; `plan`: GPUs this machine lacks are accepted. `gpus()`: (count, phrase).

    Each stage's options first (`StageSpec`, the error prefixed with the stage), then outside plan mode the
    GPUs named against the GPUs here, then `experiments.hierarchies.resolve_stages` (hub models, the local
    aliases, the devices' presence, the target's options)."""
    stages = models.get("stages")
    if not stages:
        raise ConfigError("models.stages is empty: list the stages, smallest drafter first, target last")
    if not isinstance(stages, (list, tuple)) or not all(isinstance(s, Mapping) for s in stages):
        raise ConfigError(f"models.stages must be a list of stage mappings, got {stages!r}")
    devices = placed_devices(stages, placement, lambda: gpus()[0], models.get("name"))
    stages, changed = apply_precision([{**s, "device": d} if d != str(s.get("device", "cpu")) else dict(s)
                                       for s, d in zip(stages, devices)], precision)  # fmt: skip
    name = f"{models.get('name')}_{SHORT[PRECISIONS[precision]]}" if changed else models.get("name")
    for i, stage in enumerate(stages):
        _checked(i, stage, lambda stage=stage: StageSpec.from_any(stage, check_devices=False))
    if not plan and any(_cuda_indices(s.get("device")) for s in stages if s.get("kind", "hf") not in MODEL_FREE_KINDS):
        check_gpu_count(name, stages, *gpus())
    return name, stages, resolve_stages(stages, check_devices=not plan)
