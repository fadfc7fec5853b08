"""A pytest plugin (`-p offline_plugin`) that lets TRL's own GRPO tests run offline, and through our drop-in.

It redirects the hub names TRL's tests load (the tiny Qwen2 model, the `trl-internal-testing/zen` prompts) to a tiny
model and datasets built locally with the same schema, and, when TRL_OWN_SWAP=1, replaces `trl.GRPOTrainer` and
`trl.GRPOConfig` by `ReplayGRPOTrainer` and a `ReplayGRPOConfig` whose replay is on (paper preset, no warm-up), before
TRL's test module imports them.
"""
from __future__ import annotations

import inspect
import json
import os
import tempfile
from pathlib import Path

TINY_MODEL = "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"
TINY_REWARD_MODEL = "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"
ZEN = "trl-internal-testing/zen"
PROMPTS = [f"The sky is {c} and the sea is" for c in ("blue", "grey", "red", "green", "dark", "bright")] * 3


def _zen(name: str | None, split: str | None, streaming: bool = False):
    """`load_dataset(ZEN, name, split=...)`: 6 train and 3 test prompts (the hub set has more; fewer keeps the tests short), standard (str) or conversational."""
    from datasets import Dataset, DatasetDict

    def rows(texts):
        if name == "conversational_prompt_only":
            return {"prompt": [[{"role": "user", "content": t}] for t in texts]}
        if name == "standard_prompt_only":
            return {"prompt": list(texts)}
        raise ValueError(f"offline zen has no config {name!r}")

    dd = DatasetDict(train=Dataset.from_dict(rows(PROMPTS[:6])), test=Dataset.from_dict(rows(PROMPTS[-3:])))
    if streaming:
        dd = {k: v.to_iterable_dataset() for k, v in dd.items()}
        if split is None:
            from datasets import IterableDatasetDict

            return IterableDatasetDict(dd)
    return dd[split] if split else dd


def _save_reward_model(model_dir: Path, reward_dir: Path) -> None:
    """A one-label Qwen2 sequence classifier with the tiny model's shape and tokenizer (the hub's tiny reward model)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForSequenceClassification

    config = AutoConfig.from_pretrained(model_dir)
    config.num_labels = 1
    torch.manual_seed(1)
    Qwen2ForSequenceClassification(config).save_pretrained(reward_dir)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(reward_dir)


def _redirect_from_pretrained(cls, local: dict[str, str]) -> None:
    raw = inspect.getattr_static(cls, "from_pretrained")
    if isinstance(raw, classmethod):
        orig = raw.__func__

        def patched(klass, name, *a, **kw):
            return orig(klass, local.get(str(name), name), *a, **kw)

        cls.from_pretrained = classmethod(patched)
    elif isinstance(raw, staticmethod):
        orig_s = raw.__func__
        cls.from_pretrained = staticmethod(lambda name, *a, **kw: orig_s(local.get(str(name), name), *a, **kw))


def _with_defaults(name: str, config_cls, defaults: dict):
    """`config_cls` with `defaults` for the keywords a test leaves out, kept here under `name` so that the trainer's
    checkpoint (which pickles its arguments) can find the class again."""

    class Config(config_cls):
        def __init__(self, *args, **kwargs):
            for k, v in defaults.items():
                kwargs.setdefault(k, v)
            super().__init__(*args, **kwargs)

    Config.__name__ = Config.__qualname__ = name
    globals()[name] = Config
    return Config


REPLAY_ROWS: dict[str, int] = {}  # test id -> replayed rows its trainers put in the loss


def _count_replay_rows(trainer_cls) -> None:
    """Count, per TRL test, the replayed rows its trainers trained on (written to replay_rows.json at the end), so the
    comparison can check that replay really ran."""
    train = trainer_cls.train

    def counted_train(self, *args, **kwargs):
        try:
            return train(self, *args, **kwargs)
        finally:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
            REPLAY_ROWS[test] = REPLAY_ROWS.get(test, 0) + sum(r["replay_rows"] for r in self.replay_history)

    trainer_cls.train = counted_train


def pytest_unconfigure(config):
    if os.environ.get("TRL_OWN_SWAP") == "1" and os.environ.get("TRL_OWN_ASSETS"):
        (Path(os.environ["TRL_OWN_ASSETS"]) / "replay_rows.json").write_text(json.dumps(REPLAY_ROWS, indent=1))


def _patch_trl(swap: bool) -> None:
    """On a machine without a GPU, TRL's configs default to bf16 and fail to build: the tests then run on the CPU in
    float32, stock and ours alike. With `swap`, TRL's trainer and config become ours, with replay on from the first
    step (paper preset, no warm-up) so replayed rows enter the loss in TRL's short tests."""
    import torch
    import trl

    cpu = {} if torch.cuda.is_available() else {"use_cpu": True, "bf16": False}
    if swap:
        from grpo_replay.integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer

        replay = {"replay_preset": "paper", "replay_warmup_steps": 0}
        _count_replay_rows(ReplayGRPOTrainer)
        trl.GRPOTrainer, trl.GRPOConfig = ReplayGRPOTrainer, _with_defaults("ReplayPaperGRPOConfig", ReplayGRPOConfig, {**cpu, **replay})
    else:
        trl.GRPOConfig = _with_defaults("CPUGRPOConfig", trl.GRPOConfig, cpu)


def _tolerate_missing_probes() -> None:
    """TRL's test helpers import `is_X_available` probes by name; one the installed TRL lacks (the test file may come
    from another TRL revision) reads as "not available", so the tests that need X skip instead of failing to import."""
    import trl.import_utils as iu

    def __getattr__(name: str):
        if name.startswith("is_") and name.endswith("_available"):
            return lambda *a, **k: False
        raise AttributeError(f"module {iu.__name__!r} has no attribute {name!r}")

    if not hasattr(iu, "__getattr__"):
        iu.__getattr__ = __getattr__


def pytest_configure(config):
    import datasets
    import transformers
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    from tests.helpers import build_tiny_model

    root = Path(os.environ.get("TRL_OWN_ASSETS") or tempfile.mkdtemp(prefix="trl_own_"))
    model_dir = root / "tiny-qwen2"
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir)
    reward_dir = root / "tiny-qwen2-reward"
    if not (reward_dir / "config.json").exists():
        _save_reward_model(model_dir, reward_dir)
    local = {TINY_MODEL: str(model_dir), TINY_REWARD_MODEL: str(reward_dir)}
    for cls in (transformers.PreTrainedModel, _BaseAutoModelClass, transformers.AutoConfig,
                transformers.PretrainedConfig, transformers.AutoTokenizer, transformers.AutoProcessor,
                transformers.PreTrainedTokenizerBase):
        _redirect_from_pretrained(cls, local)

    orig_load = datasets.load_dataset

    def load_dataset(path, name=None, *args, split=None, streaming=False, **kw):
        if path == ZEN:
            return _zen(name, split, streaming)
        return orig_load(path, name, *args, split=split, streaming=streaming, **kw)

    datasets.load_dataset = load_dataset
    _tolerate_missing_probes()
    _patch_trl(swap=os.environ.get("TRL_OWN_SWAP") == "1")
