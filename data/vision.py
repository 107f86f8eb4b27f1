"""Standard vision datasets read from files already on disk, in torchvision's layout.

hfl never downloads. A root that ``torchvision.datasets.<Name>(root,
download=True)`` filled on another machine works as is. The files are read
here directly (numpy, plus scipy for SVHN's .mat) rather than through the
torchvision classes: that skips torchvision's import, needs only the split
asked for, accepts MNIST's ``.gz`` files unpacked or not, and does not insist
on the official checksums.
"""

from __future__ import annotations

import bz2
import gzip
import os
import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .builtin import register_builtin
from .dataset import ArrayDataset

PathLike = str | os.PathLike


@dataclass(frozen=True)
class _Spec:
    name: str  # torchvision's class name
    layout: str  # what torchvision expects under root, for error messages


_SPECS = {
    "mnist": _Spec("MNIST", "MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]"),
    "fashionmnist": _Spec(
        "FashionMNIST", "FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]"
    ),
    "cifar10": _Spec("CIFAR10", "cifar-10-batches-py/{data_batch_1..5,test_batch}"),
    "svhn": _Spec("SVHN", "{train,test}_32x32.mat"),
    "usps": _Spec("USPS", "usps.bz2 (train), usps.t.bz2 (test)"),
}
TORCHVISION_NAMES = tuple(s.name for s in _SPECS.values())


def load_torchvision(
    name: str, root: PathLike, train: bool, download: bool = False
) -> ArrayDataset:
    """Load MNIST, FashionMNIST, CIFAR10, SVHN or USPS from files under ``root``.

    ``x`` is float32 in ``[0, 1]`` of shape ``(N, C, H, W)``: MNIST and
    FashionMNIST ``(N, 1, 28, 28)``, CIFAR10 and SVHN ``(N, 3, 32, 32)``, USPS
    ``(N, 1, 16, 16)``. Labels are 0-9 (SVHN's label 10 for the digit 0 becomes
    0, USPS's 1-10 become 0-9). ``name`` is matched ignoring case, ``-`` and
    ``_``. The name is e.g. ``"mnist:train"``.

    Files expected under ``root`` (torchvision's layout), for ``train=True`` /
    ``False``:

    - MNIST: ``MNIST/raw/train-images-idx3-ubyte``, ``train-labels-idx1-ubyte`` /
      ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each possibly ``.gz``;
      FashionMNIST likewise under ``FashionMNIST/raw``.
    - CIFAR10: ``cifar-10-batches-py/data_batch_1`` .. ``data_batch_5`` / ``test_batch``.
      These are Python pickles, the format CIFAR ships in and torchvision reads;
      reading a local file the user put there is acceptable, and the unpickler
      here only admits numpy arrays, so a crafted file cannot run code.
    - SVHN: ``train_32x32.mat`` / ``test_32x32.mat`` (read with scipy).
    - USPS: ``usps.bz2`` / ``usps.t.bz2`` (libsvm text, values in [-1, 1]).

    Missing files raise FileNotFoundError naming the dataset, the root and the
    files; ``download=True`` is refused (ValueError) — hfl never downloads.
    """
    key = str(name).lower().replace("-", "").replace("_", "")
    if key not in _SPECS:
        raise ValueError(
            f"load_torchvision: unknown dataset name {name!r}; allowed names: "
            f"{', '.join(TORCHVISION_NAMES)}"
        )
    spec = _SPECS[key]
    if not isinstance(train, bool):
        raise ValueError(f"load_torchvision: train must be True or False, got {train!r}")
    if download:
        raise ValueError(
            f"load_torchvision: download=True is not supported, hfl never downloads; put the "
            f"{spec.name} files under root ({spec.layout}), e.g. by running "
            f"torchvision.datasets.{spec.name}(root, download=True) on a machine with internet"
        )
    base = Path(root)
    split = "train" if train else "test"
    if key in ("mnist", "fashionmnist"):
        x, y = _load_mnist(base, spec, train)
    elif key == "cifar10":
        x, y = _load_cifar10(base, spec, train)
    elif key == "svhn":
        x, y = _load_svhn(base, spec, train)
    else:
        x, y = _load_usps(base, spec, train)
    return ArrayDataset(x=x, y=y, num_classes=10, name=f"{spec.name.lower()}:{split}")


def _missing(base: Path, spec: _Spec, train: bool, missing: list[str]) -> FileNotFoundError:
    split = "train" if train else "test"
    return FileNotFoundError(
        f"{spec.name} ({split} split) not found under root {str(base)!r}: missing "
        f"{', '.join(missing)}. torchvision's layout for {spec.name} is <root>/{spec.layout}. "
        f"hfl never downloads: fetch the files on a machine with internet (e.g. "
        f"torchvision.datasets.{spec.name}(root, download=True)) and copy them under the root"
    )


def _load_mnist(base: Path, spec: _Spec, train: bool) -> tuple[np.ndarray, np.ndarray]:
    raw = base / spec.name / "raw"
    prefix = "train" if train else "t10k"
    found: list[Path] = []
    missing: list[str] = []
    for stem in (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"):
        candidates = [raw / stem, raw / f"{stem}.gz"]
        hit = next((c for c in candidates if c.is_file()), None)
        if hit is None:
            missing.append(f"{spec.name}/raw/{stem}(.gz)")
        else:
            found.append(hit)
    if missing:
        raise _missing(base, spec, train, missing)
    images, labels = _read_idx(found[0], ndim=3), _read_idx(found[1], ndim=1)
    if len(images) != len(labels):
        raise ValueError(
            f"{found[0]} has {len(images)} images but {found[1]} has {len(labels)} labels"
        )
    _check_label_range(labels, found[1], 10)
    return (images.astype(np.float32) / 255.0)[:, None], labels.astype(np.int64)


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes (LeCun's MNIST format), optionally gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{path}: cannot read ({exc})") from exc
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or data[3] != ndim:
        raise ValueError(
            f"{path}: not an IDX file of unsigned bytes with {ndim} dimension(s) "
            f"(magic number must be 0x0000080{ndim}, got {data[:4].hex() or 'nothing'})"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    if len(data) - header != int(np.prod(dims)):
        raise ValueError(
            f"{path}: IDX header says shape {dims} ({int(np.prod(dims))} bytes) but the file "
            f"holds {len(data) - header} bytes of data"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings, numbers and numpy arrays — nothing else."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),  # arrays pickled with protocol 5
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # bytes pickled by Python 3 with protocol 2
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")


def _load_cifar10(base: Path, spec: _Spec, train: bool) -> tuple[np.ndarray, np.ndarray]:
    folder = base / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    missing = [f"cifar-10-batches-py/{n}" for n in names if not (folder / n).is_file()]
    if missing:
        raise _missing(base, spec, train, missing)
    xs, ys = [], []
    for n in names:
        path = folder / n
        try:
            with path.open("rb") as fh:
                entry = _NumpyOnlyUnpickler(fh, encoding="latin1").load()
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: cannot read as a CIFAR-10 python batch ({exc})") from exc
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: expected a dict with 'data' and 'labels', got {type(entry)}")
        entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
        data, labels = entry.get("data"), entry.get("labels")
        if (
            not isinstance(data, np.ndarray)
            or data.dtype != np.uint8
            or data.ndim != 2
            or (data.shape[1] != 3 * 32 * 32)
        ):
            raise ValueError(f"{path}: 'data' must be a uint8 array of shape (N, 3072)")
        y = np.asarray(labels)
        if labels is None or y.shape != (len(data),) or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{path}: 'labels' must be {len(data)} integers")
        _check_label_range(y, path, 10)
        xs.append(data.reshape(-1, 3, 32, 32))  # rows are R, G, B planes of 32x32
        ys.append(y.astype(np.int64))
    return np.concatenate(xs).astype(np.float32) / 255.0, np.concatenate(ys)


def _load_svhn(base: Path, spec: _Spec, train: bool) -> tuple[np.ndarray, np.ndarray]:
    fname = "train_32x32.mat" if train else "test_32x32.mat"
    path = base / fname
    if not path.is_file():
        raise _missing(base, spec, train, [fname])
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    try:
        mat = loadmat(path)
    except (OSError, ValueError, TypeError, NotImplementedError, MatReadError) as exc:
        raise ValueError(f"{path}: cannot read as a MATLAB file ({exc})") from exc
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{path}: expected arrays 'X' and 'y', found {sorted(mat)}")
    images, labels = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1)
    if images.ndim != 4 or images.shape[:3] != (32, 32, 3) or images.shape[3] != len(labels):
        raise ValueError(
            f"{path}: 'X' must have shape (32, 32, 3, N) matching {len(labels)} labels, "
            f"got {images.shape}"
        )
    y = labels.astype(np.int64)
    y[y == 10] = 0  # SVHN labels the digit 0 as 10
    _check_label_range(y, path, 10)
    x = np.transpose(images, (3, 2, 0, 1))  # (H, W, C, N) -> (N, C, H, W)
    return x.astype(np.float32) / 255.0, y


def _load_usps(base: Path, spec: _Spec, train: bool) -> tuple[np.ndarray, np.ndarray]:
    fname = "usps.bz2" if train else "usps.t.bz2"
    path = base / fname
    if not path.is_file():
        raise _missing(base, spec, train, [fname])
    rows: list[np.ndarray] = []
    labels: list[int] = []
    try:
        with bz2.open(path, "rt", encoding="ascii") as fh:
            for line_no, line in enumerate(fh, start=1):
                parts = line.split()
                if not parts:
                    continue
                try:
                    label = float(parts[0])
                    if label != int(label):
                        raise ValueError(f"label {parts[0]!r} is not a whole number")
                    pixels = np.zeros(256, dtype=np.float32)
                    for item in parts[1:]:
                        index, value = item.split(":")
                        if not 1 <= int(index) <= 256:
                            raise IndexError(f"index {index} outside 1-256")
                        pixels[int(index) - 1] = float(value)
                except (ValueError, IndexError, OverflowError) as exc:
                    raise ValueError(
                        f"{path}, line {line_no}: expected 'label index:value ...' with "
                        f"indices 1-256 ({exc})"
                    ) from None
                labels.append(int(label) - 1)
                rows.append(pixels)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read as bz2-compressed libsvm text ({exc})") from exc
    if not rows:
        raise ValueError(f"{path}: no samples")
    y = np.asarray(labels, dtype=np.int64)
    _check_label_range(y, path, 10, shown_offset=1)
    x = np.clip((np.stack(rows) + 1.0) / 2.0, 0.0, 1.0)  # [-1, 1] -> [0, 1]
    return x.reshape(-1, 1, 16, 16), y


def _check_label_range(y: np.ndarray, path: Path, num_classes: int, shown_offset: int = 0) -> None:
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(
            f"{path}: labels must lie in [{shown_offset}, {num_classes + shown_offset}), found "
            f"values in [{int(y.min()) + shown_offset}, {int(y.max()) + shown_offset}]"
        )


def _register(builtin_name: str, tv_name: str) -> None:
    def load(*, root: str, train: bool = True) -> ArrayDataset:
        return load_torchvision(tv_name, root, train)

    load.__doc__ = f"{tv_name} from files under ``root`` (see :func:`load_torchvision`)."
    register_builtin(builtin_name)(load)


for _builtin, _tv in (
    ("mnist", "MNIST"),
    ("fashion_mnist", "FashionMNIST"),
    ("cifar10", "CIFAR10"),
    ("svhn", "SVHN"),
    ("usps", "USPS"),
):
    _register(_builtin, _tv)
