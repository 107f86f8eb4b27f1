"""Algorithms registered by name.

``CATALOG`` names the built-in algorithms and the module that defines each, so a
config can be checked (and ``--help`` answered) without importing torch; the
module is imported on first use and registers its class with :func:`register`.

Own methods without editing the package (docs/plugins.md), as ``cohort.algorithm``:

* an **entry point** name: a package that declares
  ``[project.entry-points."hfl.algorithms"] fedmedian = "my_pkg.fedmedian:FedMedian"``
  makes ``algorithm: fedmedian`` work once installed (listed without importing it);
* ``my_pkg.module:Class``: a class in an importable module;
* ``path/to/file.py:Class``: a class in a Python file (relative to the working
  directory), for a method that is not a package yet.

The class must subclass :class:`~hfl.algorithms.base.Algorithm` (usually a built-in
one such as FedAvg), with its own ``name``, ``mode`` and ``Config``; a name that a
built-in algorithm already uses is an error.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hfl.algorithms.base import Algorithm

ENTRY_POINT_GROUP = "hfl.algorithms"
# module.path:Class or some/file.py:Class
SPEC_PATTERN = re.compile(r"(?P<target>[\w./\\-]+\.py|[A-Za-z_]\w*(\.[A-Za-z_]\w*)*):(?P<cls>[A-Za-z_]\w*)")

CATALOG: dict[str, str] = {
    "solo": "hfl.algorithms.solo",
    "fedavg": "hfl.algorithms.fedavg",
    "fedh2l": "hfl.algorithms.fedh2l",
    "agg": "hfl.algorithms.agg",
    "fedmd": "hfl.algorithms.fedmd",
    "fedprox": "hfl.algorithms.fedprox",
    "avg": "hfl.algorithms.chfl",
    "avgkd": "hfl.algorithms.chfl",
    "chfl": "hfl.algorithms.chfl",
    "mdhfl": "hfl.algorithms.mdhfl",
    "feddf": "hfl.algorithms.feddf",
    "fedin": "hfl.algorithms.fedin",
    "fedproto": "hfl.algorithms.fedproto",
    "fedhp": "hfl.algorithms.fedhp",
}

_REGISTRY: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make an algorithm available by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(
            f"algorithm name {cls.name!r} is already registered by {_REGISTRY[cls.name].__qualname__}"
        )
    if cls.mode not in ("local", "broadcast", "aggregator"):
        raise ValueError(f"{cls.__qualname__}.mode={cls.mode!r}; allowed: local, broadcast, aggregator")
    _REGISTRY[cls.name] = cls
    return cls


def algorithm_names() -> list[str]:
    """Built-in and registered names, and installed plugins' entry-point names."""
    return sorted(set(CATALOG) | set(_REGISTRY) | set(plugin_names()))


def plugin_names() -> list[str]:
    """Names of the ``hfl.algorithms`` entry points installed (nothing is imported)."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def check_name(name: str) -> None:
    """Raise ValueError unless ``name`` can name an algorithm; torch-free (a plugin is
    only imported when the peer is built or checked)."""
    if name in CATALOG or name in _REGISTRY or SPEC_PATTERN.fullmatch(name):
        return
    if name in plugin_names():
        return
    import difflib

    close = difflib.get_close_matches(name, algorithm_names(), n=1)
    raise ValueError(
        f"got {name!r}; allowed: {', '.join(algorithm_names())}, or your own class as "
        f"my_pkg.module:Class or path/file.py:Class (docs/plugins.md)"
        + (f"; did you mean {close[0]!r}?" if close else "")
    )


_PLUGINS: dict[str, type[Algorithm]] = {}  # spec or entry-point name -> class


def get_algorithm(name: str) -> type[Algorithm]:
    if name not in _REGISTRY and name in CATALOG:
        importlib.import_module(CATALOG[name])
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _PLUGINS:
        return _PLUGINS[name]
    cls = _load_plugin(name)
    if cls is None:
        check_name(name)  # raises with the allowed names
        raise ValueError(f"unknown algorithm {name!r}; allowed: {', '.join(algorithm_names())}")
    _PLUGINS[name] = cls
    return cls


def _load_plugin(name: str) -> type[Algorithm] | None:
    from importlib.metadata import entry_points

    match = SPEC_PATTERN.fullmatch(name)
    if match:
        target, attr = match.group("target"), match.group("cls")
        module = _import_file(target) if target.endswith(".py") else _import_module(target, name)
        if not hasattr(module, attr):
            raise ValueError(f"{name!r}: {target} has no class {attr!r}")
        cls = getattr(module, attr)
    else:
        eps = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not eps:
            return None
        try:
            cls = eps[0].load()
        except Exception as exc:
            raise ValueError(f"entry point {name!r} ({eps[0].value}) failed to load: "
                             f"{type(exc).__name__}: {exc}") from exc
    _check_plugin(name, cls)
    return cls


def _import_module(module: str, spec: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"{spec!r}: cannot import module {module!r} ({exc}); is it installed "
                         "or on PYTHONPATH (the working directory counts)?") from exc
    except (Exception, SystemExit) as exc:  # (the plugin's own code failed as imported)
        raise ValueError(f"{spec!r}: importing module {module!r} failed: "
                         f"{type(exc).__name__}: {exc}") from exc


def _import_file(path: str):
    import importlib.util
    import sys
    from pathlib import Path

    file = Path(path).resolve()
    if not file.is_file():
        raise ValueError(f"{path}: no such file (a path/file.py:Class algorithm is relative to the "
                         "working directory)")
    # the file's name, and a hash of its whole path: a/b_c.py and a_b/c.py made one name,
    # and the second one's class was the first's, a review
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:16]
    mod_name = "hfl_plugin_" + re.sub(r"\W", "_", file.stem) + "_" + digest
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look the module up
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # a syntax error, or the plugin's code raised
        del sys.modules[mod_name]  #            (a sys.exit() there ended hfl-launch unsaid)
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise ValueError(f"{path}: loading the plugin failed{where}: {type(exc).__name__}: "
                         f"{exc}") from exc
    return module


def _check_plugin(spec: str, cls) -> None:
    from hfl.algorithms.base import Algorithm

    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ValueError(f"{spec!r} is {cls!r}, not a subclass of hfl.algorithms.base.Algorithm")
    if not cls.name:
        raise ValueError(f"{spec!r}: {cls.__qualname__} has no name")
    if cls.name in CATALOG:
        builtin = get_algorithm(cls.name)
        if builtin is not cls:
            raise ValueError(f"{spec!r}: {cls.__qualname__}.name {cls.name!r} is a built-in "
                             "algorithm's name; choose another")
    if cls.mode not in ("local", "broadcast", "aggregator"):
        raise ValueError(f"{cls.__qualname__}.mode={cls.mode!r}; allowed: local, broadcast, aggregator")
