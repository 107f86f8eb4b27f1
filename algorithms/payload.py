"""What a method shares: named arrays plus small metadata (numpy only, no torch).

Its own module so that what only moves knowledge around (the protocol core, the
round procedures, the protocol-level simulator) imports no deep-learning stack.
:mod:`hfl.algorithms.base` re-exports it."""

from __future__ import annotations

import math
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


#: An array whose largest |value| is over this many times this peer's own (+1) is no
#: model of this cohort's: a sanity bound, not a robust rule (docs/robust.md)
SCALE_LIMIT = 1e6


def top_abs(arrays: Any) -> float:
    """The largest |value| of a float array, or of a dict of arrays' float ones (0: none)."""
    if isinstance(arrays, dict):
        return max((top_abs(a) for a in arrays.values()), default=0.0)
    if not isinstance(arrays, np.ndarray) or arrays.dtype.kind != "f" or not arrays.size:
        return 0.0
    return float(np.abs(arrays).max())


def beyond_scale(what: str, top: float, own: float | None, limit: float = SCALE_LIMIT) -> str | None:
    """Why values up to ``top`` are no model's of this cohort: over ``limit`` times this
    peer's own largest ``own`` (+1); None when they fit or ``own`` is unknown. A sanity
    bound (docs/robust.md): one member's weights of 3e38 were finite, went into an
    equal-weight mean, and every peer trained to NaN at the next step."""
    if own is None or not math.isfinite(own) or top <= limit * (own + 1.0):
        return None  # (a peer whose own model is NaN must still take a healthy result)
    return f"{what}: values up to {top:.3g}, over {limit:g} x this peer's own ({own:.3g})"


#: a logit beyond this is no model's score (its softmax saturated long before): refused
#: (float32 logits of 3e38 averaged to inf; float64 ones of 1e300 became inf as float32)
MAX_LOGIT = 1e6

#: how far a row of probabilities may be from summing to 1 (float32 softmax outputs)
ROW_SUM_TOLERANCE = 1e-3


def probabilities_problem(probs: Any, rows: int, num_classes: int) -> str | None:
    """Why ``probs`` from a member is no (rows, num_classes) array of probabilities (finite
    floats in [0, 1], each row summing to 1), or None."""
    if not isinstance(probs, np.ndarray):
        return "probs missing"
    if probs.shape != (rows, num_classes):
        return f"probs of shape {probs.shape}, expected {(rows, num_classes)}"
    if not np.issubdtype(probs.dtype, np.floating):
        return f"probs of dtype {probs.dtype}, expected floats"
    if not np.isfinite(probs).all():
        return "non-finite probabilities"
    if (probs < 0).any() or (probs > 1 + ROW_SUM_TOLERANCE).any():
        return "probabilities outside [0, 1]"
    worst = float(np.abs(probs.sum(axis=1, dtype=np.float64) - 1.0).max(initial=0.0))
    if worst > ROW_SUM_TOLERANCE:
        return f"probability rows that do not sum to 1 (off by up to {worst:.3g})"
    return None


def fraction_problem(value: Any, what: str) -> str | None:
    """Why a member's ``value`` is not a number in [0, 1] (an accuracy), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{what} {str(value)[:40]!r} is not a number"
    if not 0.0 <= value <= 1.0:  # (NaN fails this too)
        return f"{what} {value!r} outside [0, 1]"
    return None
