"""What a method shares: named arrays plus small metadata (numpy only, no torch).

Its own module so that what only moves knowledge around (the protocol core, the
round procedures, the protocol-level simulator) imports no deep-learning stack.
:mod:`hfl.algorithms.base` re-exports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Payload:
    """Knowledge produced by an algorithm: named arrays plus small metadata."""

    kind: str
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(int(t.nbytes) for t in self.tensors.values())
