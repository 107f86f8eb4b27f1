"""Validation of input shapes and architecture options, with errors that name the arch and option."""

from __future__ import annotations

import numbers


def image_shape(arch: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(C, H, W)`` from ``input_shape``, or a ValueError naming ``arch``."""
    if len(input_shape) != 3:
        raise ValueError(f"{arch} needs image input_shape (C, H, W), got {input_shape}")
    channels, height, width = input_shape
    return channels, height, width


def dropout_rate(arch: str, value: object) -> float:
    """A dropout probability in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"{arch} option dropout must be a number in [0, 1), got {value!r}")
    return float(value)


def positive_real(arch: str, name: str, value: object) -> float:
    """A finite number > 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0.0 < value < float("inf")
    ):
        raise ValueError(f"{arch} option {name} must be a number > 0, got {value!r}")
    return float(value)


def flag(arch: str, name: str, value: object) -> bool:
    """A bool (not a truthy string or int, which YAML typos produce)."""
    if not isinstance(value, bool):
        raise ValueError(f"{arch} option {name} must be true or false, got {value!r}")
    return value
