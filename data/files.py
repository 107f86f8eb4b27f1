"""Loading a peer's own data from files (NPZ arrays, numeric CSV tables)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from .dataset import ArrayDataset

PathLike = str | os.PathLike


def _infer_num_classes(y: np.ndarray, num_classes: int | None) -> int:
    if num_classes is not None:
        return num_classes
    return int(y.max()) + 1 if len(y) else 1


def _labels_from(values: np.ndarray, where: str) -> np.ndarray:
    if np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_:
        return values.astype(np.int64)
    if np.issubdtype(values.dtype, np.floating):
        if not np.all(np.isfinite(values)) or not np.all(values == np.round(values)):
            raise ValueError(f"{where}: labels must be whole numbers >= 0")
        return values.astype(np.int64)
    raise ValueError(f"{where}: labels must be integers, got dtype {values.dtype}")


def _check_labels(y: np.ndarray, where: str) -> None:
    if len(y) and y.min() < 0:
        raise ValueError(f"{where}: labels must be >= 0, found {int(y.min())}")


def load_npz(
    path: PathLike,
    x_key: str = "x",
    y_key: str = "y",
    *,
    num_classes: int | None = None,
    name: str | None = None,
) -> ArrayDataset:
    """Load features ``x_key`` and integer labels ``y_key`` from a ``.npz`` file.

    ``num_classes`` defaults to ``max(y) + 1``; pass it when a peer's file may
    lack the highest classes. Pickled object arrays are refused.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such NPZ file")
    try:
        archive = np.load(p, allow_pickle=False)
    except ValueError as exc:  # object arrays, or not an npz at all
        raise ValueError(f"{p}: cannot read as an NPZ archive of numeric arrays ({exc})") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{p}: expected an .npz archive, found a single .npy array")
    with archive:
        found = sorted(archive.files)
        for key, what in ((x_key, "x_key"), (y_key, "y_key")):
            if key not in found:
                raise ValueError(
                    f"{p}: no array named {key!r} ({what}); arrays in the file: "
                    f"{', '.join(found) if found else '(none)'}"
                )
        try:
            x = archive[x_key]
            y_raw = archive[y_key]
        except ValueError as exc:
            raise ValueError(f"{p}: cannot read arrays without pickle ({exc})") from exc
    if y_raw.ndim != 1:
        raise ValueError(f"{p}: {y_key!r} must be a 1-D label array, got shape {y_raw.shape}")
    y = _labels_from(y_raw, f"{p}: array {y_key!r}")
    _check_labels(y, f"{p}: array {y_key!r}")
    return ArrayDataset(
        x=x, y=y, num_classes=_infer_num_classes(y, num_classes), name=name or p.stem
    )


def load_csv(
    path: PathLike,
    target: str,
    *,
    num_classes: int | None = None,
    name: str | None = None,
    delimiter: str = ",",
) -> ArrayDataset:
    """Load a numeric CSV table with a header row; column ``target`` holds the labels.

    Every other column becomes a float32 feature, in file order, giving ``x`` of
    shape ``(N, F)``. Labels must be whole numbers >= 0; ``num_classes``
    defaults to ``max(y) + 1``. A non-numeric or empty cell is an error naming
    the file, line and column.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such CSV file")
    with p.open(newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{p}: empty file, expected a header row")
        header = [h.strip() for h in header]
        if target not in header:
            raise ValueError(
                f"{p}: no column named {target!r} (target); columns: {', '.join(header)}"
            )
        if len(set(header)) != len(header):
            dup = sorted({h for h in header if header.count(h) > 1})
            raise ValueError(f"{p}: duplicate column name(s) {', '.join(dup)}")
        rows: list[list[float]] = []
        for line_no, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{p}, line {line_no}: expected {len(header)} cells, got {len(row)}"
                )
            values = []
            for col, cell in zip(header, row, strict=True):
                try:
                    values.append(float(cell))
                except ValueError:
                    raise ValueError(
                        f"{p}, line {line_no}, column {col!r}: {cell!r} is not a number "
                        f"(only numeric columns are supported)"
                    ) from None
            rows.append(values)
    if not rows:
        raise ValueError(f"{p}: no data rows after the header")
    table = np.asarray(rows, dtype=np.float64)  # (N, columns)
    t = header.index(target)
    y = _labels_from(table[:, t], f"{p}: column {target!r}")
    _check_labels(y, f"{p}: column {target!r}")
    x = np.delete(table, t, axis=1).astype(np.float32)  # (N, F)
    if x.shape[1] == 0:
        raise ValueError(f"{p}: no feature columns besides the target {target!r}")
    return ArrayDataset(
        x=x, y=y, num_classes=_infer_num_classes(y, num_classes), name=name or p.stem
    )
