"""The TRL backend turns activation checkpointing off by the name the installed transformers reads, without its
deprecation warning."""
import warnings

import pytest

pytest.importorskip("trl")


def test_checkpointing_is_off_without_the_deprecated_name(tmp_path):
    from grpo_replay.integrations.trl import ReplayGRPOConfig
    from grpo_replay.trainer.trl.backend import no_activation_checkpointing

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
        args = ReplayGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                                **no_activation_checkpointing())
    assert args.gradient_checkpointing is False
    assert getattr(args, "activation_checkpointing", False) is False
