"""Loading a peer's own data from files (NPZ arrays, CSV tables, image folders)."""

from __future__ import annotations

import csv
import math
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .dataset import ArrayDataset, TabularSchema

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
        if len(values) and float(np.abs(values).max()) >= 2.0**62:
            # (cast, 1e20 wrapped to -9223372036854775808 and was named as negative)
            raise ValueError(f"{where}: label {float(np.abs(values).max()):g} is not a class "
                             "number (labels are 0, 1, 2, ...)")
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
    scale: float | None = None,
    classes: Sequence[str] | None = None,
) -> ArrayDataset:
    """Load features ``x_key`` and integer labels ``y_key`` from a ``.npz`` file.

    ``classes`` names the labels in order (label k is ``classes[k]``; the number of
    classes is then its length): peers whose data names its classes (a CSV's text
    labels, an image folder) refuse one whose data does not, so an NPZ peer in such a
    cohort names them too.

    ``num_classes`` defaults to ``max(y) + 1``; pass it when a peer's file may
    lack the highest classes. ``scale`` divides ``x`` (as float32) by it, e.g.
    16 for raw 0-16 digit pixels or 255 for 8-bit images, so inputs lie in
    about [0, 1]. Refused, each with an error naming the file: pickled object
    arrays (unpickling can run code), a file that is not a zip of ``.npy`` arrays,
    an array larger than this machine's memory (read from its header before any
    of it is), and features that are NaN or infinite.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such NPZ file")
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: got {scale!r}; expected a finite number > 0 (x is divided by it)")
    with p.open("rb") as fh:
        magic = fh.read(6)
    if magic.startswith(b"\x93NUMPY"):
        raise ValueError(f"{p}: expected an .npz archive, found a single .npy array "
                         "(save both arrays with np.savez(path, x=x, y=y))")
    if not magic.startswith(b"PK"):
        raise ValueError(f"{p}: not an NPZ archive (a zip of .npy arrays, as np.savez writes; "
                         f"this file starts with {magic!r})")
    try:
        archive = np.load(p, allow_pickle=False)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{p}: not a readable NPZ archive, damaged or truncated ({exc})") from exc
    with archive:
        found = sorted(archive.files)
        for key, what in ((x_key, "x_key"), (y_key, "y_key")):
            if key not in found:
                raise ValueError(
                    f"{p}: no array named {key!r} ({what}); arrays in the file: "
                    f"{', '.join(found) if found else '(none)'}"
                )
        x = _npz_array(archive, x_key, p)
        y_raw = _npz_array(archive, y_key, p)
    if y_raw.ndim != 1:
        raise ValueError(f"{p}: {y_key!r} must be a 1-D label array, got shape {y_raw.shape}")
    if np.iscomplexobj(x):
        raise ValueError(f"{p}: array {x_key!r} is complex ({x.dtype}); features must be real")
    y = _labels_from(y_raw, f"{p}: array {y_key!r}")
    _check_labels(y, f"{p}: array {y_key!r}")
    if classes is not None:
        classes = _class_list(classes, "classes")
        if num_classes is not None and num_classes != len(classes):
            raise ValueError(f"{p}: num_classes {num_classes} but {len(classes)} classes named "
                             "in data.options.classes: give one of them")
        if len(y) and int(y.max()) >= len(classes):
            raise ValueError(f"{p}: array {y_key!r} holds label {int(y.max())}, but "
                             f"data.options.classes names {len(classes)} ({_shown(classes)})")
        num_classes = len(classes)
    if scale is not None:  # (float64 stays float64 until checked: 1e39 / 1e10 is fine)
        wide = np.float64 if x.dtype == np.float64 else np.float32
        with np.errstate(over="ignore"):  # (an overflow is named by the check below)
            x = np.asarray(x, dtype=wide) / wide(scale)
    _check_finite(x, f"{p}: array {x_key!r}" + ("" if scale is None else
                                                 f" divided by data.options.scale {scale}"))
    try:
        return ArrayDataset(
            x=x, y=y, num_classes=_infer_num_classes(y, num_classes), name=name or p.stem,
            classes=classes,
        )
    except ValueError as exc:  # (named after the file's stem: name the file)
        raise ValueError(f"{p}: {exc}") from None


def _npz_array(archive, key: str, p: Path) -> np.ndarray:
    """One array of an open NPZ archive, its size read from its header first: an array
    that would not fit in memory (or a zip bomb) is an error, not an allocation."""
    shape, dtype = _npz_header(archive, key, p)
    need = math.prod(shape) * dtype.itemsize
    have = _memory_bytes()
    if have is not None and need > have // 2:
        raise ValueError(f"{p}: array {key!r} of shape {shape} ({dtype}) needs "
                         f"{need / 2**30:.1f} GiB, more than half this machine's memory "
                         f"({have / 2**30:.1f} GiB)")
    try:
        arr = archive[key]
    except MemoryError as exc:
        raise ValueError(f"{p}: array {key!r} does not fit in this machine's memory "
                         f"({exc})") from None
    except (EOFError, OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{p}: cannot read array {key!r}: damaged or truncated "
                         f"({type(exc).__name__}: {exc})") from exc
    except ValueError as exc:
        if dtype.hasobject:  # (numpy refuses object arrays without pickle)
            raise ValueError(f"{p}: array {key!r} holds pickled (object) data, which hfl never "
                             "loads (unpickling can run code); save plain numeric arrays, "
                             "e.g. np.savez(path, x=x, y=y)") from None
        raise ValueError(f"{p}: cannot read array {key!r}: damaged or truncated "
                         f"({exc})") from exc
    if not isinstance(arr, np.ndarray):  # (numpy hands back the raw bytes of a non-.npy member)
        raise ValueError(f"{p}: member {key!r} is not an .npy array")
    return arr


def _npz_header(archive, key: str, p: Path) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of an NPZ member, from its .npy header alone."""
    try:
        with archive.zip.open(f"{key}.npy") as f:
            try:
                version = np.lib.format.read_magic(f)
            except ValueError as exc:
                raise ValueError(f"{p}: cannot read array {key!r}: not an .npy array "
                                 f"({exc})") from None
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise ValueError(f"{p}: array {key!r} is in .npy format {version[0]}.{version[1]}, "
                                 "which numpy does not write (1.0 to 3.0): a damaged file")
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            try:
                shape, _, dtype = read(f)
            except Exception as exc:  # (numpy's header parser raises tokenize errors too)
                raise ValueError(f"{p}: array {key!r} has a damaged header "
                                 f"({type(exc).__name__}: {exc})") from None
    except (EOFError, OSError, KeyError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{p}: cannot read array {key!r}: damaged or truncated "
                         f"({type(exc).__name__}: {exc})") from exc
    return shape, dtype


def _memory_bytes() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_finite(x: np.ndarray, where: str) -> None:
    """Features that are NaN or infinite are an error: one such value turns every
    standardised feature and every weight it reaches into NaN (silently, on the
    peer; the cohort then leaves the peer's contributions out). So are values beyond
    float32's range (3.4e38), which features are stored and trained in: they become
    infinite there (a review: a float64 file with a pixel of 1e39 passed the check
    and the run trained to NaN)."""
    if not np.issubdtype(x.dtype, np.floating):
        return
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(x) | (np.abs(x) > np.finfo(np.float32).max)
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), x.shape)
        raise ValueError(f"{where}: {int(bad.sum())} value(s) are NaN, infinite or beyond "
                         f"float32's range of ±3.4e38 (the first at index "
                         f"{tuple(int(i) for i in first)}, {x[first]!r}); fill, rescale or "
                         "drop those samples")


def load_csv(
    path: PathLike,
    target: str,
    *,
    num_classes: int | None = None,
    name: str | None = None,
    delimiter: str = ",",
    categorical: str | Sequence[str] = "auto",
    classes: Sequence[str] | None = None,
) -> ArrayDataset:
    """Load a CSV table with a header row; column ``target`` holds the labels.

    Every other column becomes features, in file order, giving ``x`` of shape
    ``(N, F)`` and a :class:`TabularSchema` naming them:

    * a **numeric** column gives one float32 feature named like the column. A
      non-numeric or empty cell in it is an error naming the file, line and column.
    * a **categorical** column ``color`` is one-hot encoded: one 0/1 feature per
      category, named ``color=<value>``, categories sorted (numerically when they
      all are numbers, else as text). An empty cell is a category of its own, the
      empty value, named ``color=`` and sorted first. The categories are taken from
      every row of the file: they are the table's schema (which one-hot columns
      exist), not statistics fitted to any split, so every peer that reads the
      same file gets the same layout.

    ``categorical="auto"`` (default) makes a column categorical when its non-empty
    cells are all non-numeric; a column mixing numbers and text is an error
    (usually a typo in a numeric column) unless named explicitly, and so is a text
    column with more than ``AUTO_MAX_CATEGORIES`` (50) distinct values (free text,
    names or ids, which would become one feature each). A list of column
    names makes exactly those columns categorical (e.g. integer-coded ones) and
    all others numeric.

    Labels: whole numbers >= 0 as they are, ``num_classes`` defaulting to
    ``max(y) + 1``; or, when every label is text, text labels mapped to ``0..K-1``
    in sorted order (``num_classes`` defaults to ``K``), the dataset's ``classes``
    naming them. A column mixing numbers and text (a typo in a numeric label
    column) and an empty label are errors. ``classes`` lists every class name of the
    cohort in label order: each peer then maps its labels alike even when its file
    lacks some classes (sorting each file's own labels would not), and a label not
    listed is an error.

    The file is read as UTF-8 (a byte-order mark is skipped); NaN, infinite or
    empty cells in a numeric column are errors naming the line and column.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such CSV file")
    if classes is not None:
        classes = _class_list(classes, "classes")
    _refuse_binary(p)
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:
            # strict: a stray quote raises at the end instead of swallowing every line
            # after it into one cell (rows silently lost, a label holding newlines)
            reader = csv.reader(fh, delimiter=delimiter, strict=True)
            try:
                header, rows, line_nos = _read_table(reader, p, target)
            except csv.Error as exc:
                raise ValueError(f"{p}, line {reader.line_num}: {exc}"
                                 + (" (an unclosed quote joins the lines after it into one cell)"
                                    if "field larger" in str(exc) or "end of data" in str(exc)
                                    else "")) from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text ({exc}); save the table as a UTF-8 CSV") from None
    forced = _categorical_option(categorical, header, target, p)
    t = header.index(target)
    if not rows:
        raise ValueError(f"{p}: no data rows after the header")
    cells = [[cell.strip() for cell in col] for col in zip(*rows, strict=True)]  # (columns, N)
    is_number = [[_is_number(c) for c in col] for col in cells]
    features = [j for j in range(len(header)) if j != t]
    if not features:
        raise ValueError(f"{p}: no feature columns besides the target {target!r}")
    if forced is None:  # auto: categorical when it has text and no number at all
        is_categorical = {j: any(cells[j]) and not any(is_number[j]) for j in features}
        for j in features:
            distinct = set(cells[j]) if is_categorical[j] else ()
            if len(distinct) > AUTO_MAX_CATEGORIES:
                shown = ", ".join(repr(v[:30]) for v in sorted(distinct)[:3])
                raise ValueError(
                    f"{p}, column {header[j]!r}: {len(distinct)} distinct text values in "
                    f"{len(rows)} rows ({shown}, ...): free text or an id, not a category? "
                    f"Auto-detection one-hot encodes at most {AUTO_MAX_CATEGORIES} values per "
                    f"column (this one would become {len(distinct)} features): remove the "
                    "column from the file, or name it in options.categorical to one-hot "
                    "encode it anyway"
                )
    else:
        is_categorical = {j: header[j] in forced for j in features}

    numeric_cols = [j for j in features if not is_categorical[j]]
    for i, line_no in enumerate(line_nos):  # report the first bad cell in file order
        for j in numeric_cols:
            if not is_number[j][i]:
                raise ValueError(
                    f"{p}, line {line_no}, column {header[j]!r}: {rows[i][j]!r} is not a "
                    + ("finite number (a missing or broken value: fill or drop the row)"
                       if _is_float(cells[j][i]) else
                       "number " + _numeric_hint(cells[j], forced is None))
                )
    blocks: list[np.ndarray] = []
    names: list[str] = []
    columns: list[str] = []
    numeric: list[bool] = []
    for j in features:
        col = header[j]
        if not is_categorical[j]:
            blocks.append(np.asarray([float(c) for c in cells[j]], dtype=np.float64)[:, None])
            names.append(col)
            columns.append(col)
            numeric.append(True)
            continue
        categories = _sorted_categories(set(cells[j]))
        code = {c: k for k, c in enumerate(categories)}
        codes = np.asarray([code[c] for c in cells[j]], dtype=np.int64)  # (N,)
        blocks.append(np.eye(len(categories), dtype=np.float64)[codes])  # (N, K_col)
        names.extend(f"{col}={c}" for c in categories)
        columns.extend([col] * len(categories))
        numeric.extend([False] * len(categories))
    x = np.concatenate(blocks, axis=1)  # (N, F)
    _check_finite(x, str(p))
    x = x.astype(np.float32)
    y, inferred, names_of_classes = _csv_labels(cells[t], line_nos, p, target, classes)
    if names_of_classes is not None and num_classes is not None and num_classes != inferred:
        raise ValueError(f"{p}: num_classes {num_classes} with text labels: name every class in "
                         "data.options.classes instead (in label order), so that every peer "
                         "numbers them alike")
    try:
        schema = TabularSchema(names=tuple(names), columns=tuple(columns), numeric=tuple(numeric))
        return ArrayDataset(
            x=x,
            y=y,
            num_classes=num_classes if num_classes is not None else inferred,
            name=name or p.stem,
            schema=schema,
            classes=names_of_classes,
        )
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None


def _refuse_binary(p: Path) -> None:
    """A compressed, UTF-16 or spreadsheet file named .csv: say what it is."""
    with p.open("rb") as fh:
        head = fh.read(4)
    what = ("gzip-compressed (decompress it first: gunzip)" if head.startswith(b"\x1f\x8b")
            else "UTF-16 text (save it as UTF-8)" if head[:2] in (b"\xff\xfe", b"\xfe\xff")
            else "a zip archive (an .xlsx spreadsheet? export it as CSV, UTF-8)"
            if head.startswith(b"PK\x03\x04") else None)
    if what:
        raise ValueError(f"{p}: not a CSV text file: {what}")


def _read_table(reader, p: Path, target: str) -> tuple[list[str], list[list[str]], list[int]]:
    """(header, non-blank rows, their line numbers) of a CSV file, checked."""
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{p}: empty file, expected a header row")
    header = [h.strip() for h in header]
    if target not in header:
        hint = next((f"; the header is one column holding {d!r}: set data.options.delimiter: "
                     f"{d!r}" for d in (";", "\t", "|") if len(header) == 1 and d in header[0]), "")
        raise ValueError(
            f"{p}: no column named {target!r} (target); columns: {', '.join(header)}{hint}"
        )
    if len(set(header)) != len(header):
        dup = sorted({h for h in header if header.count(h) > 1})
        raise ValueError(f"{p}: duplicate column name(s) {', '.join(dup)}")
    if "" in header:
        raise ValueError(
            f"{p}: column {header.index('') + 1} of the header has no name; "
            f"every column needs one"
        )
    rows: list[list[str]] = []
    line_nos: list[int] = []
    for row in reader:
        line_no = reader.line_num  # (a quoted cell may span lines)
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise ValueError(
                f"{p}, line {line_no}: expected {len(header)} cells, got {len(row)}"
            )
        rows.append(row)
        line_nos.append(line_no)
    return header, rows, line_nos


def _categorical_option(
    categorical: object, header: list[str], target: str, p: Path
) -> set[str] | None:
    """None for "auto", else the set of column names forced to be categorical."""
    if isinstance(categorical, str):
        if categorical == "auto":
            return None
        raise ValueError(
            f"{p}: categorical must be 'auto' or a list of column names, got {categorical!r}"
        )
    if not isinstance(categorical, Sequence) or not all(isinstance(c, str) for c in categorical):
        raise ValueError(
            f"{p}: categorical must be 'auto' or a list of column names, got {categorical!r}"
        )
    unknown = [c for c in categorical if c not in header]
    if unknown:
        raise ValueError(
            f"{p}: categorical names unknown column(s) {', '.join(map(repr, unknown))}; "
            f"columns: {', '.join(h for h in header if h != target)}"
        )
    if target in categorical:
        raise ValueError(
            f"{p}: categorical lists the target column {target!r}; labels are never one-hot "
            f"features (text labels are mapped to class indices on their own)"
        )
    return set(categorical)


def _is_float(cell: str) -> bool:
    """What Python's float() reads, NaN and infinity included."""
    try:
        float(cell)
    except ValueError:
        return False
    return "_" not in cell  # (float() reads 1_000; a table means something else by it)


def _is_number(cell: str) -> bool:
    """A finite number: "nan", "inf" and "1e999" are not (one of them turned a whole
    standardised column into NaN)."""
    return _is_float(cell) and math.isfinite(float(cell))


def _numeric_hint(cells: list[str], auto: bool) -> str:
    if auto:
        if any(c and _is_number(c) for c in cells):
            return (
                "(the column holds numbers too; name it in categorical to one-hot encode it, "
                "empty cells included)"
            )
        return "(empty cells are allowed only in categorical columns; name it in categorical)"
    return "(not named in categorical, so the column must be numeric)"


def _sorted_categories(values: set[str]) -> list[str]:
    """Empty value first; then numerically when every value is a number, else as text."""
    rest = [v for v in values if v]
    if all(_is_number(v) for v in rest):
        rest.sort(key=lambda v: (float(v), v))
    else:
        rest.sort()
    return [""] * ("" in values) + rest


def _csv_labels(
    cells: list[str], line_nos: list[int], p: Path, target: str,
    classes: tuple[str, ...] | None = None,
) -> tuple[np.ndarray, int, tuple[str, ...] | None]:
    """Labels of the target column, the number of classes they imply and the classes'
    names (None for numeric labels): see :func:`load_csv`."""
    where = f"column {target!r}"
    for cell, line_no in zip(cells, line_nos, strict=True):
        if not cell:
            raise ValueError(f"{p}, line {line_no}, {where}: empty label")
    if classes is not None:
        index = {c: k for k, c in enumerate(classes)}
        if not all(c in index for c in cells) and all(
                _is_number(c) and float(c).is_integer() and 0 <= float(c) < len(classes)
                for c in cells):
            # numeric labels, named by data.options.classes in label order (where every
            # label is also a name, names win)
            y = np.asarray([int(float(c)) for c in cells], dtype=np.int64)
            return y, len(classes), classes
        for cell, line_no in zip(cells, line_nos, strict=True):
            if cell not in index:
                raise ValueError(f"{p}, line {line_no}, {where}: label {cell!r} is not one of "
                                 f"data.options.classes ({_shown(classes)}), nor are the labels "
                                 f"all numbers in 0..{len(classes) - 1}")
        return np.asarray([index[c] for c in cells], dtype=np.int64), len(classes), classes
    numbers = [_is_number(c) for c in cells]
    if all(numbers):
        y = _labels_from(np.asarray([float(c) for c in cells]), f"{p}: {where}")
        _check_labels(y, f"{p}: {where}")
        return y, _infer_num_classes(y, None), None
    if any(numbers):  # a typo in a numeric column, or numbers among names: never guessed
        text = [(c, n) for c, n, num in zip(cells, line_nos, numbers, strict=True) if not num]
        num = [(c, n) for c, n, isnum in zip(cells, line_nos, numbers, strict=True) if isnum]
        (odd, line), (usual, other) = (text[0], num[0]) if len(text) <= len(num) else (num[0], text[0])
        raise ValueError(
            f"{p}, line {line}, {where}: label {odd!r} mixes with labels like {usual!r} "
            f"(line {other}): {len(num)} labels are numbers and {len(text)} are text. Fix the "
            "cell, or list every class name in data.options.classes"
        )
    found = tuple(sorted(set(cells)))
    index = {c: k for k, c in enumerate(found)}
    return np.asarray([index[c] for c in cells], dtype=np.int64), len(found), found


def _class_list(classes: object, where: str) -> tuple[str, ...]:
    """A ``classes`` option: distinct non-empty names (numbers are taken as their text)."""
    if isinstance(classes, str) or not isinstance(classes, Sequence) or not classes:
        raise ValueError(f"{where}: expected a list of class names, got {classes!r}")
    names = tuple(str(c).strip() for c in classes)
    if not all(names) or len(set(names)) != len(names):
        raise ValueError(f"{where}: class names must be distinct and non-empty, got {list(names)!r}")
    return names


def _shown(names: Sequence[str], limit: int = 8) -> str:
    return ", ".join(map(repr, names[:limit])) + (", ..." if len(names) > limit else "")


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
# categorical: auto refuses a text column with more distinct values than this (free text,
# names, ids): one feature per value would follow silently.
AUTO_MAX_CATEGORIES = 50


def load_image_folder(
    root: PathLike,
    size: int | tuple[int, int] | None = None,
    grayscale: bool = False,
    *,
    name: str | None = None,
    classes: Sequence[str] | None = None,
) -> ArrayDataset:
    """Load ``root/<class_name>/*.png|*.jpg|*.jpeg``, one folder per class.

    Class index = position of the folder name in the sorted folder names
    (hidden folders are skipped; other files in a class folder are ignored), or in
    ``classes`` when given: every class of the cohort in label order, so that a peer
    whose root lacks some class folders maps the others alike (a folder not listed
    is then an error). The dataset's ``classes`` name them.
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
    names = tuple(d.name for d in class_dirs) if classes is None else _class_list(
        classes, "classes")
    index = {c: k for k, c in enumerate(names)}
    unknown = [d.name for d in class_dirs if d.name not in index]
    if unknown:
        raise ValueError(f"{p}: class folder(s) {_shown(unknown)} not in data.options.classes "
                         f"({_shown(names)})")
    images: list[np.ndarray] = []
    labels: list[int] = []
    first: Path | None = None
    listed = []
    for folder in class_dirs:
        files = sorted(
            (f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES),
            key=lambda f: f.name,
        )
        if not files:
            raise FileNotFoundError(
                f"{folder}: class folder {folder.name!r} holds no .png/.jpg/.jpeg image"
            )
        listed.append((folder, files))
    have = _memory_bytes()
    if target is not None and have is not None:
        # The images as bytes, then x as float32 twice over (cast, divided), before any
        # is resized: a size the machine cannot hold is an error, not an allocation the
        # kernel kills the peer for (a review: size 100000 took 22 GB before the OOM killer).
        count = sum(len(f) for _, f in listed)
        need = count * (1 if grayscale else 3) * target[0] * target[1] * 9
        if need > have // 2:
            raise ValueError(f"{p}: {count} image(s) resized to "
                             f"{target[0]}x{target[1]} (data.options.size) need "
                             f"{need / 2**30:.1f} GiB, more than half this machine's memory "
                             f"({have / 2**30:.1f} GiB)")
    for folder, files in listed:
        label = index[folder.name]
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
    return ArrayDataset(x=x, y=np.asarray(labels), num_classes=len(names), name=name or p.name,
                        classes=names)
