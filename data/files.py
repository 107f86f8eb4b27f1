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


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def load_image_folder(
    root: PathLike,
    size: int | tuple[int, int] | None = None,
    grayscale: bool = False,
    *,
    name: str | None = None,
) -> ArrayDataset:
    """Load ``root/<class_name>/*.png|*.jpg|*.jpeg``, one folder per class.

    Class index = position of the folder name in the sorted folder names
    (hidden folders are skipped; other files in a class folder are ignored).
    Images are read with Pillow, converted to RGB (or grey with
    ``grayscale=True``) and, when ``size`` is given (an int for a square or
    ``(height, width)``), resized bilinearly; without ``size`` all images must
    share one size. ``x`` is float32 in ``[0, 1]`` of shape ``(N, 3 or 1, H, W)``,
    in class order then file-name order. A missing or empty root, or a class
    folder without images, raises FileNotFoundError; an image Pillow cannot
    decode raises ValueError naming the file.
    """
    from PIL import Image

    from .images import _image_size

    p = Path(root)
    layout = f"{p}/<class_name>/*.png|*.jpg|*.jpeg, one folder per class"
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such image folder (expected {layout})")
    target = None if size is None else _image_size(size)
    class_dirs = sorted(
        (d for d in p.iterdir() if d.is_dir() and not d.name.startswith(".")), key=lambda d: d.name
    )
    if not class_dirs:
        raise FileNotFoundError(f"{p}: no class folders found (expected {layout})")
    images: list[np.ndarray] = []
    labels: list[int] = []
    first: Path | None = None
    for label, folder in enumerate(class_dirs):
        files = sorted(
            (f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES),
            key=lambda f: f.name,
        )
        if not files:
            raise FileNotFoundError(
                f"{folder}: class folder {folder.name!r} holds no .png/.jpg/.jpeg image"
            )
        for f in files:
            try:
                with Image.open(f) as im:
                    im = im.convert("L" if grayscale else "RGB")
                    if target is not None:
                        im = im.resize((target[1], target[0]), Image.Resampling.BILINEAR)
                    arr = np.asarray(im, dtype=np.uint8)
            except (OSError, ValueError, Image.DecompressionBombError) as exc:
                raise ValueError(f"{f}: cannot read image ({exc})") from exc
            arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)  # (C, H, W)
            if images and arr.shape != images[0].shape:
                raise ValueError(
                    f"{f}: image is {arr.shape[2]}x{arr.shape[1]} (WxH) but {first} is "
                    f"{images[0].shape[2]}x{images[0].shape[1]}; pass size= to resize them all"
                )
            first = first or f
            images.append(arr)
            labels.append(label)
    x = np.stack(images).astype(np.float32) / 255.0  # (N, C, H, W)
    return ArrayDataset(x=x, y=np.asarray(labels), num_classes=len(class_dirs), name=name or p.name)
