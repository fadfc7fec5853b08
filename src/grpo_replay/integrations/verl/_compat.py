"""Import guard: a clear message when verl (the optional `verl` extra) is absent."""
from __future__ import annotations

SUPPORTED = ">=0.9,<0.10"
INSTALL_HINT = (
    "grpo_replay.integrations.verl needs verl 0.9.x in its own environment (verl pins transformers<5.11 and "
    "tensordict<=0.10, which conflicts with the main environment): run `bash scripts/setup_verl.sh` and use "
    "`.venv-verl/bin/python`, or `pip install 'verl[verl-core]==0.9.1'` and this package (`pip install -e .`: the core's dependencies only)."
)

try:
    import verl as _verl
    from verl import DataProto
except ImportError as e:  # pragma: no cover - exercised only without verl
    raise ImportError(f"{INSTALL_HINT} ({e})") from e

VERL_VERSION = getattr(_verl, "__version__", "unknown")


def check_version() -> None:
    from packaging.version import Version

    v = Version(VERL_VERSION)
    if not (Version("0.9") <= v < Version("0.10")):
        import warnings

        msg = f"grpo-replay's verl integration is tested with verl {SUPPORTED}; found {VERL_VERSION}"
        warnings.warn(msg, stacklevel=2)


check_version()

__all__ = ["DataProto", "INSTALL_HINT", "VERL_VERSION"]
