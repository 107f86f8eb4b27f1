"""Tabular data across peers: choosing a peer's columns and standardising its features.

The "completely heterogeneous" setting of CHFL (Liu et al.) gives each peer
its own rows *and* its own (possibly overlapping) subset of a table's columns.
:func:`feature_split` decides which source columns a peer keeps, from a seed
the cohort shares, so peers agree without talking; :func:`select_columns`
cuts a dataset down to them (the one-hot features of a categorical column move
together). :func:`fit_standardizer` computes mean and standard deviation of the
numeric features on one peer's training rows, and the returned
:class:`Standardizer` applies that same transform to each of its splits.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .dataset import ArrayDataset

FEATURE_SPLITS = ("slices", "random")


def select_columns(ds: ArrayDataset, columns: Sequence[str]) -> ArrayDataset:
    """The features of ``ds`` whose source column is in ``columns``, in ``ds``'s order.

    Every feature of a named column is kept (all indicators of a one-hot encoded
    column). ``ds`` needs a schema; an unknown or repeated name, or an empty
    list, is a ValueError listing the available columns.
    """
    if ds.schema is None:
        raise ValueError(
            f"select_columns: dataset {ds.name!r} has no column schema (input shape "
            f"{ds.input_shape}); only tabular data with named columns can be cut by column"
        )
    available = ds.schema.source_columns
    if isinstance(columns, str) or not isinstance(columns, Sequence):
        raise ValueError(f"select_columns: columns must be a list of column names, got {columns!r}")
    wanted = list(columns)
    listing = f"available columns: {', '.join(available)}"
    if not wanted:
        raise ValueError(f"select_columns: no column named; {listing}")
    unknown = [c for c in wanted if c not in available]
    if unknown:
        raise ValueError(
            f"select_columns: unknown column(s) {', '.join(map(repr, unknown))} in dataset "
            f"{ds.name!r}; {listing}"
        )
    repeated = sorted({c for c in wanted if wanted.count(c) > 1})
    if repeated:
        raise ValueError(f"select_columns: column(s) named more than once: {', '.join(repeated)}")
    keep = set(wanted)
    idx = np.flatnonzero([c in keep for c in ds.schema.columns])  # (F_kept,)
    return ArrayDataset(
        x=ds.x[:, idx],
        y=ds.y,
        num_classes=ds.num_classes,
        name=ds.name,
        schema=ds.schema.select(idx),
        classes=ds.classes,
    )


def feature_split(
    columns: Sequence[str],
    num_parts: int,
    index: int,
    fraction: float,
    mode: str,
    seed: int,
) -> list[str]:
    """The source columns peer ``index`` of ``num_parts`` keeps, in the order given.

    Each peer keeps ``k = max(1, ceil(fraction * F))`` of the ``F`` columns (the
    ceiling, so that ``fraction >= 1 / num_parts`` is enough for the slices to
    cover every column):

    * ``"slices"``: the columns are permuted by a generator seeded with ``seed``
      (the same permutation for every peer), and peer ``i`` takes ``k``
      consecutive columns of it starting at ``floor(i * F / num_parts)``,
      wrapping around. With ``k <= F / num_parts`` (e.g. ``fraction = 1 /
      num_parts`` and ``F`` a multiple of ``num_parts``) the slices are
      disjoint; larger ``fraction`` makes neighbours overlap; with
      ``fraction * num_parts >= 1`` every column is kept by some peer.
    * ``"random"``: peer ``i`` draws its ``k`` columns without replacement with a
      generator seeded by ``(seed, i)``: independent subsets that may overlap
      anywhere and need not cover every column.

    The result depends only on the arguments.
    """
    cols = list(columns)
    if isinstance(columns, str) or not cols:
        raise ValueError(
            f"feature_split: columns must be a non-empty list of names, got {columns!r}"
        )
    if len(set(cols)) != len(cols):
        dup = sorted({c for c in cols if cols.count(c) > 1})
        raise ValueError(f"feature_split: duplicate column name(s) {', '.join(map(str, dup))}")
    if isinstance(num_parts, bool) or not isinstance(num_parts, numbers.Integral) or num_parts < 1:
        raise ValueError(f"feature_split: num_parts must be an int >= 1, got {num_parts!r}")
    if (
        isinstance(index, bool)
        or not isinstance(index, numbers.Integral)
        or not 0 <= index < num_parts
    ):
        raise ValueError(
            f"feature_split: index must be an int in [0, {num_parts - 1}], got {index!r}"
        )
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, numbers.Real)
        or not math.isfinite(fraction)
        or not 0.0 < fraction <= 1.0
    ):
        raise ValueError(f"feature_split: fraction must be a number in (0, 1], got {fraction!r}")
    if mode not in FEATURE_SPLITS:
        raise ValueError(
            f"feature_split: mode must be one of {', '.join(FEATURE_SPLITS)}, got {mode!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"feature_split: seed must be an int >= 0, got {seed!r}")
    n_cols = len(cols)
    k = max(1, math.ceil(float(fraction) * n_cols - 1e-9))
    if mode == "slices":
        perm = np.random.default_rng(int(seed)).permutation(n_cols)  # (F,)
        start = (int(index) * n_cols) // int(num_parts)
        chosen = perm[(start + np.arange(k)) % n_cols]  # (k,)
    else:
        rng = np.random.default_rng([int(seed), int(index)])
        chosen = rng.choice(n_cols, size=k, replace=False)
    return [cols[j] for j in np.sort(chosen)]


@dataclass(frozen=True, eq=False)
class Standardizer:
    """``x -> (x - mean) / std`` per feature; ``mean = 0, std = 1`` where left alone."""

    mean: np.ndarray  # (F,) float64
    std: np.ndarray  # (F,) float64, > 0

    def transform(self, ds: ArrayDataset) -> ArrayDataset:
        """The same dataset with standardised features (schema, labels and name kept)."""
        if ds.x.ndim != 2 or ds.x.shape[1] != len(self.mean):
            raise ValueError(
                f"Standardizer: fitted on {len(self.mean)} features, dataset {ds.name!r} has "
                f"input shape {ds.input_shape}"
            )
        x = (ds.x.astype(np.float64) - self.mean) / self.std  # (N, F)
        return ArrayDataset(
            x=x.astype(np.float32),
            y=ds.y,
            num_classes=ds.num_classes,
            name=ds.name,
            schema=ds.schema,
            classes=ds.classes,
        )

    __call__ = transform


def numeric_mask(ds: ArrayDataset) -> np.ndarray:
    """Which features of 2-D ``ds`` are numeric: from its schema, else all of them."""
    if ds.x.ndim != 2:
        raise ValueError(
            f"dataset {ds.name!r} is not tabular: input shape {ds.input_shape}, expected (F,)"
        )
    if ds.schema is None:
        return np.ones(ds.x.shape[1], dtype=bool)
    return np.asarray(ds.schema.numeric, dtype=bool)


def fit_standardizer(ds: ArrayDataset) -> Standardizer:
    """Mean and population standard deviation (``ddof=0``) of ``ds``'s numeric features.

    One-hot features (``numeric`` False in the schema) get mean 0 and std 1, i.e.
    are left as they are; a numeric feature that is constant on ``ds`` gets std 1
    (it is only centred). Fit it on the training rows only, then apply it to
    every split.
    """
    mask = numeric_mask(ds)  # (F,)
    if len(ds) == 0:
        raise ValueError(f"fit_standardizer: dataset {ds.name!r} has no rows to fit on")
    x = ds.x.astype(np.float64)  # (N, F)
    mean = np.where(mask, x.mean(axis=0), 0.0)
    constant = np.ptp(x, axis=0) == 0  # exact test: a rounding-noise std would blow up
    std = np.where(mask & ~constant, x.std(axis=0), 1.0)
    return Standardizer(mean=mean, std=std)
