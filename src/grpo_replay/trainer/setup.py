"""Building the policy, tokenizer and task for a run: the embedded testbed or a real model + math data."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, InputNotFound, UsageError
from .train_config import TrainConfig


def build_policy(cfg: TrainConfig, device: torch.device) -> tuple[Any, Any, Any, dict]:
    if cfg.reward == "testbed":
        from ..tasks.testbed import TestbedTask, warm_start

        tb = cfg.testbed
        model, tokenizer, info = warm_start(tb, progress=cfg.progress)
        task = TestbedTask(tb, tokenizer)
        return model.to(device), tokenizer, task, {"warm_start": info}
    if cfg.generator == "vllm" and (cfg.model_file or (cfg.model or "").lower().endswith(".gguf")):
        # VLLMGenerator builds its engine from the model's path, which for GGUF is a folder without a checkpoint.
        raise ModelLoadError("TrainConfig.generator='vllm' cannot serve a GGUF checkpoint here; allowed with GGUF: transformers")
    model, tokenizer = load_causal_lm(cfg.model, device, model_file=cfg.model_file)
    from ..app.data import DataError
    from ..tasks.math import MathTask

    try:
        task = MathTask(tokenizer, cfg.data, heldout_data=cfg.heldout_data, n_heldout=cfg.eval_problems)
    except DataError:
        raise
    except ValueError as e:  # e.g. a hub dataset, not checked above, too small to hold eval_problems out
        raise ConfigError(f"TrainConfig.data={cfg.data!r}: {e}") from None
    return model, tokenizer, task, {"model": cfg.model, "data": cfg.data, "train_prompts": len(task.train)}


def check_data_rows(cfg: TrainConfig) -> None:
    """A local --data file without heldout_data must leave rows to train on after its last eval_problems rows are
    held out. The command checks it before the run directory is claimed or the model loads (a hub dataset is
    checked when MathTask loads it)."""
    from ..app.data import load_problems
    from ..tasks.word_sums import is_word_sums

    if cfg.heldout_data or is_word_sums(cfg.data) or not Path(cfg.data).expanduser().exists():
        return
    n = len(load_problems(cfg.data, split="train"))
    if n <= cfg.eval_problems:
        raise ConfigError(
            f"TrainConfig.eval_problems={cfg.eval_problems} is invalid with TrainConfig.data={cfg.data!r}, which has "
            f"{n} row(s): the last eval_problems rows are held out, leaving none to train on; allowed: "
            + (f"eval_problems <= {n - 1}" if n > 1 else "a data file of at least 2 rows")
            + ", or TrainConfig.heldout_data for a separate held-out set")


class ModelLoadError(UsageError):
    """TrainConfig.model cannot be loaded as a causal LM; the message says why."""


def load_causal_lm(name: str, device: torch.device, model_file: str | None = None):
    """A causal LM and its tokenizer from a local path, hub id or GGUF checkpoint (`grpo_replay.app.models`), with
    clear errors for the usual mistakes: a path that does not exist (FileNotFoundError), and a folder or id
    without a model config, holding a model that is not a causal LM, or missing its weights or tokenizer
    (ModelLoadError)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ..app.models import as_plain_model, dense_source, resolve_model

    try:
        source = resolve_model(name, model_file, field="TrainConfig.model", file_field="TrainConfig.model_file")
    except ImportError as e:
        raise ModelLoadError(str(e)) from None
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    p = Path(name)
    looks_local = p.is_absolute() or name.startswith((".", "~")) or p.exists()
    if looks_local and not p.expanduser().exists():
        raise InputNotFound(f"TrainConfig.model: {name} does not exist")
    try:
        source = dense_source(source)  # a GGUF file: its dequantized copy (made once, then cached)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"TrainConfig.model: cannot dequantize the GGUF checkpoint {source.label}: {_first_line(e)}") from None
    src, kw = source.path, source.kwargs()
    try:
        config = AutoConfig.from_pretrained(src, **kw)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"TrainConfig.model: cannot load a model config from {name!r}: {_first_line(e)}") from None
    try:
        model = as_plain_model(AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, **source.model_kwargs()))
    except ValueError:
        kind = getattr(config, "model_type", type(config).__name__)
        raise ModelLoadError(
            f"TrainConfig.model: {name!r} is a {type(config).__name__} (model_type {kind!r}), not a causal LM: "
            f"AutoModelForCausalLM cannot load it. Use a decoder-only language model."
        ) from None
    except OSError as e:
        raise ModelLoadError(f"TrainConfig.model: {name!r} has a config but its weights cannot be loaded: {_first_line(e)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, **kw)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"TrainConfig.model: {name!r} has no loadable tokenizer: {_first_line(e)}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
