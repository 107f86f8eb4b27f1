"""The in-memory dataset every algorithm trains on: features ``x`` and integer labels ``y``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A labelled dataset held as two numpy arrays.

    ``x`` is float32 of shape ``(N, ...)`` — ``(N, C, H, W)`` images or ``(N, F)``
    tabular rows — and ``y`` is int64 of shape ``(N,)`` with values in
    ``[0, num_classes)``. Inputs are converted to those dtypes (labels only when
    they are whole numbers) and checked on construction.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str = "dataset"

    def __post_init__(self) -> None:
        x = np.asarray(self.x)
        y = np.asarray(self.y)
        if x.ndim < 2:
            raise ValueError(
                f"ArrayDataset {self.name!r}: x must have shape (N, ...) with at least 2 "
                f"dimensions, got shape {x.shape}"
            )
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            raise ValueError(f"ArrayDataset {self.name!r}: x must be numeric, got dtype {x.dtype}")
        if y.ndim != 1:
            raise ValueError(
                f"ArrayDataset {self.name!r}: y must have shape (N,), got shape {y.shape}"
            )
        if len(x) != len(y):
            raise ValueError(
                f"ArrayDataset {self.name!r}: x has {len(x)} rows but y has {len(y)} labels"
            )
        y = _as_int_labels(y, self.name)
        if isinstance(self.num_classes, bool) or not isinstance(
            self.num_classes, (int, np.integer)
        ):
            raise ValueError(
                f"ArrayDataset {self.name!r}: num_classes must be an int >= 1, "
                f"got {self.num_classes!r}"
            )
        if self.num_classes < 1:
            raise ValueError(
                f"ArrayDataset {self.name!r}: num_classes must be >= 1, got {self.num_classes}"
            )
        if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
            raise ValueError(
                f"ArrayDataset {self.name!r}: labels must lie in [0, {self.num_classes}), "
                f"found values in [{y.min()}, {y.max()}]"
            )
        object.__setattr__(self, "x", np.ascontiguousarray(x, dtype=np.float32))
        object.__setattr__(self, "y", np.ascontiguousarray(y, dtype=np.int64))
        object.__setattr__(self, "num_classes", int(self.num_classes))

    def __len__(self) -> int:
        return len(self.y)

    def __repr__(self) -> str:
        return (
            f"ArrayDataset(name={self.name!r}, n={len(self)}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes})"
        )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, e.g. ``(1, 8, 8)`` or ``(30,)``."""
        return tuple(int(d) for d in self.x.shape[1:])

    def subset(self, indices: np.ndarray | list[int], name: str | None = None) -> ArrayDataset:
        """The samples at ``indices`` (integer positions, any order, repeats allowed)."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
            raise ValueError(
                f"ArrayDataset {self.name!r}: subset indices must be a 1-D integer array, "
                f"got dtype {idx.dtype} and shape {idx.shape}"
            )
        idx = idx.astype(np.int64, copy=False)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise ValueError(
                f"ArrayDataset {self.name!r}: subset indices must lie in [0, {len(self)}), "
                f"found values in [{idx.min()}, {idx.max()}]"
            )
        return ArrayDataset(
            x=self.x[idx],
            y=self.y[idx],
            num_classes=self.num_classes,
            name=self.name if name is None else name,
        )

    def class_counts(self) -> np.ndarray:
        """Number of samples of each class, shape ``(num_classes,)``."""
        return np.bincount(self.y, minlength=self.num_classes)


def _as_int_labels(y: np.ndarray, name: str) -> np.ndarray:
    if np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        return y.astype(np.int64, copy=False)
    if np.issubdtype(y.dtype, np.floating):
        if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            raise ValueError(f"ArrayDataset {name!r}: labels must be whole numbers")
        return y.astype(np.int64)
    raise ValueError(f"ArrayDataset {name!r}: labels must be integers, got dtype {y.dtype}")
