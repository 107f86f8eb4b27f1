"""The in-memory dataset every algorithm trains on: features ``x`` and integer labels ``y``,
and, for tabular data, the schema naming each feature and the column it came from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TabularSchema:
    """What each feature of a tabular ``(N, F)`` dataset is.

    ``names[j]`` names feature ``j``; ``columns[j]`` is the source column it came
    from; ``numeric[j]`` is True for a numeric feature and False for one indicator
    of a one-hot encoded categorical column. A numeric column gives one feature
    named like the column; a categorical column ``color`` gives features
    ``color=blue``, ``color=red``, ... whose source is ``color``. All features of
    one column are of one kind. Feature names are unique.
    """

    names: tuple[str, ...]
    columns: tuple[str, ...]
    numeric: tuple[bool, ...]

    def __post_init__(self) -> None:
        names = tuple(self.names)
        columns = tuple(self.columns)
        numeric = tuple(self.numeric)
        if not (len(names) == len(columns) == len(numeric)):
            raise ValueError(
                f"TabularSchema: names, columns and numeric must have one entry per feature, "
                f"got {len(names)}, {len(columns)} and {len(numeric)}"
            )
        for what, values in (("names", names), ("columns", columns)):
            bad = [v for v in values if not isinstance(v, str) or not v]
            if bad:
                raise ValueError(f"TabularSchema: {what} must be non-empty strings, got {bad[0]!r}")
        bad_flags = [v for v in numeric if not isinstance(v, (bool, np.bool_))]
        if bad_flags:
            raise ValueError(f"TabularSchema: numeric must hold booleans, got {bad_flags[0]!r}")
        numeric = tuple(bool(v) for v in numeric)
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"TabularSchema: duplicate feature name(s) {', '.join(dup)}")
        kind: dict[str, bool] = {}
        for col, num in zip(columns, numeric, strict=True):
            if kind.setdefault(col, num) != num:
                raise ValueError(
                    f"TabularSchema: column {col!r} mixes numeric and one-hot features"
                )
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "numeric", numeric)

    @classmethod
    def all_numeric(cls, names: Sequence[str]) -> TabularSchema:
        """One numeric feature per column, named like the column."""
        names = tuple(names)
        return cls(names=names, columns=names, numeric=(True,) * len(names))

    def __len__(self) -> int:
        return len(self.names)

    @property
    def source_columns(self) -> tuple[str, ...]:
        """The distinct source columns, in the order their first feature appears."""
        return tuple(dict.fromkeys(self.columns))

    def select(self, feature_indices: Sequence[int] | np.ndarray) -> TabularSchema:
        """The schema of the features at ``feature_indices`` (in that order)."""
        idx = [int(j) for j in np.asarray(feature_indices, dtype=np.int64)]
        return TabularSchema(
            names=tuple(self.names[j] for j in idx),
            columns=tuple(self.columns[j] for j in idx),
            numeric=tuple(self.numeric[j] for j in idx),
        )


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A labelled dataset held as two numpy arrays.

    ``x`` is float32 of shape ``(N, ...)`` — ``(N, C, H, W)`` images or ``(N, F)``
    tabular rows — and ``y`` is int64 of shape ``(N,)`` with values in
    ``[0, num_classes)``. Inputs are converted to those dtypes (labels only when
    they are whole numbers) and checked on construction. ``schema`` optionally
    describes the ``F`` features of 2-D tabular data (see :class:`TabularSchema`);
    images and unnamed tables have none. ``classes`` optionally names each class
    (``classes[k]`` is label k's name: text labels of a CSV, an image folder's class
    folders); peers whose classes have names must name them alike (the hello's
    ``class_names``), or the same label would mean different classes to them.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str = "dataset"
    schema: TabularSchema | None = None
    classes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        x = np.asarray(self.x)
        y = np.asarray(self.y)
        if x.ndim < 2:
            raise ValueError(
                f"ArrayDataset {self.name!r}: x must have shape (N, ...) with at least 2 "
                f"dimensions, got shape {x.shape}"
            )
        if 0 in x.shape[1:]:
            raise ValueError(
                f"ArrayDataset {self.name!r}: samples of shape {x.shape[1:]} hold no value"
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
        if self.schema is not None:
            if not isinstance(self.schema, TabularSchema):
                raise ValueError(
                    f"ArrayDataset {self.name!r}: schema must be a TabularSchema, "
                    f"got {type(self.schema).__name__}"
                )
            if x.ndim != 2 or x.shape[1] != len(self.schema):
                raise ValueError(
                    f"ArrayDataset {self.name!r}: a schema of {len(self.schema)} features needs "
                    f"x of shape (N, {len(self.schema)}), got shape {x.shape}"
                )
        if self.classes is not None:
            classes = tuple(self.classes)
            if (len(classes) != self.num_classes or len(set(classes)) != len(classes)
                    or not all(isinstance(c, str) for c in classes)):
                raise ValueError(
                    f"ArrayDataset {self.name!r}: classes must be {self.num_classes} distinct "
                    f"names (one per class), got {list(classes)[:8]!r}"
                )
            object.__setattr__(self, "classes", classes)
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
    def feature_names(self) -> tuple[str, ...] | None:
        """One name per feature (tabular data with a schema), else None."""
        return None if self.schema is None else self.schema.names

    @property
    def feature_columns(self) -> tuple[str, ...] | None:
        """The source column of each feature (tabular data with a schema), else None."""
        return None if self.schema is None else self.schema.columns

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
            schema=self.schema,
            classes=self.classes,
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
