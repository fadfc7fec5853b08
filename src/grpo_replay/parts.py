"""The contract between a `ReplayBuffer` and its parts (samplers, evictions), as TorchRL's samplers share
a base class: each part saves and restores its own state; the buffer saves the random generator they draw
from and the storage they read."""
from __future__ import annotations

from typing import Any


class BufferPart:
    """A replaceable piece of a `ReplayBuffer`. Invariant: `load_state_dict(state_dict())` restores the part
    exactly. The default keeps no state (`STATELESS`): its state is `{}`, and a saved buffer whose state for
    this part is anything else is refused when loading."""

    STATELESS = True

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.STATELESS and state:
            raise ValueError(f"{type(self).__name__} keeps no state; got {state!r}")
