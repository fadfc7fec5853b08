"""Supervised warm start of the testbed model, selected by sampled pass rate and cached on disk."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from ...errors import GrpoReplayError
from ...app.models import sha256_file
from .testbed_config import TestbedConfig
from .model import build_model, n_params, sampled_pass_rate
from .task import TestbedTask
from .tokenizer import build_tokenizer

INFO_FILE = "info.json"
WEIGHTS_SHA = "weights_sha256"  # in info.json: the checksum of model.safetensors, checked on every load
_SELECTION_SEED_OFFSET = 7919  # selection set != the default held-out set of the trainer


def sft_batch(task: TestbedTask, problems, rng: np.random.Generator):
    """Right-padded ``(input_ids, attention_mask, labels)``; loss only on completion + EOS."""
    tok = task.tokenizer
    vocab = tok.get_vocab()
    seqs, n_prompt = [], []
    for p in problems:
        prompt_ids = [tok.bos_token_id] + [vocab[c] for c in p.prompt]
        comp_ids = [vocab[c] for c in task.sft_example(p, rng)] + [tok.eos_token_id]
        seqs.append(prompt_ids + comp_ids)
        n_prompt.append(len(prompt_ids))
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    labels = torch.full((len(seqs), T), -100, dtype=torch.long)
    for i, (s, n) in enumerate(zip(seqs, n_prompt)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        labels[i, n: len(s)] = torch.tensor(s[n:])
    return ids, mask, labels


def _window_distance(rate: float, cfg: TestbedConfig) -> float:
    if rate < cfg.target_pass_low:
        return cfg.target_pass_low - rate
    if rate > cfg.target_pass_high:
        return rate - cfg.target_pass_high
    return 0.0


def selection_problems(task: TestbedTask, cfg: TestbedConfig):
    return task.heldout(cfg.warmstart_eval_problems, seed=cfg.seed + _SELECTION_SEED_OFFSET)


def pass_rate_by_difficulty(details: dict) -> dict[int, float]:
    out: dict[int, list[float]] = {}
    for d, rs in zip(details["difficulty"], details["rewards"]):
        out.setdefault(int(d), []).extend(rs)
    return {d: float(np.mean(v)) for d, v in sorted(out.items())}


def _fmt(by_d: dict) -> str:
    return "[" + " ".join(f"d{d}:{r:.2f}" for d, r in by_d.items()) + "]"


def train_warm_start(cfg: TestbedConfig, progress: bool = True):
    """Run the supervised loop (no caching). Returns ``(model, tokenizer, info)``."""
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    tokenizer = build_tokenizer()
    task = TestbedTask(cfg, tokenizer)
    model = build_model(cfg, tokenizer)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warmstart_lr, betas=(0.9, 0.98),
                            weight_decay=cfg.warmstart_weight_decay)
    warmup = max(1, min(50, cfg.warmstart_max_steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    sel = selection_problems(task, cfg)

    history: list[dict] = []
    best = None  # (distance, step, rate, state_dict)
    step, loss_ema = 0, None
    reason = "max_steps"
    while step < cfg.warmstart_max_steps:
        probs = task.sample_problems(rng, cfg.warmstart_batch)
        ids, mask, labels = sft_batch(task, probs, rng)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        if step % cfg.warmstart_eval_every == 0 or step == cfg.warmstart_max_steps:
            if step < cfg.warmstart_min_steps and step != cfg.warmstart_max_steps:
                continue
            rate, det = sampled_pass_rate(model, task, sel, seed=cfg.seed + step, return_details=True)
            by_d = pass_rate_by_difficulty(det)
            model.train()
            dist = _window_distance(rate, cfg)
            elapsed = time.perf_counter() - t0
            history.append({"step": step, "pass_rate": rate, "loss": loss_ema, "seconds": elapsed,
                            "by_difficulty": by_d})
            if progress:
                print(f"[testbed warm start] step {step:5d} loss {loss_ema:.3f} "
                      f"pass@1 {rate:.3f} {_fmt(by_d)} ({elapsed:.1f}s)", file=sys.stderr, flush=True)
            if best is None or dist < best[0]:
                best = (dist, step, rate, {k: v.detach().clone() for k, v in model.state_dict().items()})
            if dist == 0.0:
                reason = "in_window"
                break
            if rate > cfg.target_pass_high:
                reason = "overshoot"  # curve already past the window: keep the closest
                break
            if cfg.warmstart_max_seconds is not None and elapsed > cfg.warmstart_max_seconds:
                reason = "max_seconds"
                break
    if best is None:  # no evaluation happened (max_steps < min_steps): evaluate the end state
        rate = sampled_pass_rate(model, task, sel, seed=cfg.seed + step)
        best = (_window_distance(rate, cfg), step, rate, model.state_dict())
    _, best_step, best_rate, state = best
    model.load_state_dict(state)
    model.eval()
    _, details = sampled_pass_rate(model, task, sel, seed=cfg.seed + best_step, return_details=True)
    info = {
        "pass_rate": best_rate,
        "pass_rate_by_difficulty": pass_rate_by_difficulty(details),
        "step": best_step,
        "steps_run": step,
        "stop_reason": reason,
        "seconds": time.perf_counter() - t0,
        "seed": cfg.seed,
        "n_params": n_params(model),
        "n_selection_problems": len(sel),
        "history": history,
        "config": cfg.to_dict(),
        "cache_key": cfg.cache_key(),
    }
    return model, tokenizer, info


class CorruptCacheError(GrpoReplayError, RuntimeError):
    """A cached warm start that cannot be read, or whose weights differ from the ones it recorded."""


def load_cached(path: str | os.PathLike):
    """Load ``(model, tokenizer, info)`` saved by :func:`warm_start`; CorruptCacheError if it cannot be read or its
    weights are not the ones it recorded (caches made before the checksum was recorded are taken as they are)."""
    path = Path(path)
    try:
        info = json.loads((path / INFO_FILE).read_text())
        if not isinstance(info, dict):
            raise ValueError(f"{INFO_FILE} holds a {type(info).__name__}, not an object")
        want = info.get(WEIGHTS_SHA)
        if want is not None and sha256_file(path / "model.safetensors") != want:
            raise ValueError("model.safetensors differs from the checksum info.json recorded for it")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - safetensors, JSON, tokenizers and OS errors all mean "unreadable"
        raise CorruptCacheError(f"{path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    model.eval()
    return model, tokenizer, info


def is_complete(path: Path) -> bool:
    return (path / INFO_FILE).is_file() and (path / "model.safetensors").is_file()


def warm_start(cfg: TestbedConfig | None = None, progress: bool = True, force: bool = False):
    """Warm-started ``(model, tokenizer, info)``; loaded from the cache when present.

    The cache directory is ``cfg.cache_path()`` (``<root>/<hash of the config>``); it holds the
    ``save_pretrained`` model (safetensors) and tokenizer plus ``info.json``.  ``info`` gets
    ``from_cache`` and ``cache_path`` keys.  ``force=True`` retrains and overwrites.
    """
    cfg = cfg or TestbedConfig()
    path = cfg.cache_path()
    if not force and is_complete(path):
        try:
            model, tokenizer, info = load_cached(path)
        except CorruptCacheError as e:
            # The warm start is a deterministic function of its config: recomputing it gives the same model, so a
            # damaged cache (a full disk, an interrupted copy, an edit) costs time, not a failed run.
            warnings.warn(f"cached testbed warm start is unreadable ({e}); recomputing it", stacklevel=2)
            force = True
        else:
            info.update(from_cache=True, cache_path=str(path))
            if progress:
                print(f"[testbed warm start] loaded {path} (pass@1 {info['pass_rate']:.3f})",
                      file=sys.stderr, flush=True)
            return model, tokenizer, info
    model, tokenizer, info = train_warm_start(cfg, progress=progress)
    if info["stop_reason"] == "max_seconds":
        # Where the cap cut the loop depends on the machine's speed and load: caching it would make every later
        # run (and every report) start from a machine-dependent checkpoint.
        warnings.warn(
            f"testbed warm start stopped by warmstart_max_seconds={cfg.warmstart_max_seconds} at step "
            f"{info['steps_run']} (pass rate {info['pass_rate']:.3f}); it is used for this run but not cached",
            stacklevel=2,
        )
        info.update(from_cache=False, cache_path=None)
        return model, tokenizer, info
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        info[WEIGHTS_SHA] = sha256_file(tmp / "model.safetensors")
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=1))
        if is_complete(path) and not force:
            # Another process (a parallel test worker, a second run) finished the same deterministic warm
            # start first: keep its copy, which others may be reading, and drop ours.
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_complete(path):  # a concurrent writer may have won the race
            raise
    info.update(from_cache=False, cache_path=str(path))
    if progress:
        print(f"[testbed warm start] step {info['step']} pass@1 {info['pass_rate']:.3f} "
              f"in {info['seconds']:.1f}s -> {path}", file=sys.stderr, flush=True)
    return model, tokenizer, info


__all__ = ["warm_start", "train_warm_start", "load_cached", "sft_batch", "selection_problems",
           "pass_rate_by_difficulty"]
