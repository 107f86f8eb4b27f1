"""Many named arrays as a few flat ones, so a deep model's state fits one message.

The wire carries one frame per array and a message holds at most
``protocol.codec.Limits.max_frames`` (64) frames, header included; a ResNet's
state has 80 (ResNet-10) to 200 (ResNet-26) arrays. :func:`pack` concatenates
the arrays of each dtype into one flat array (``@pack/<dtype>``) and lists
the layout (name, dtype, shape) in the payload's metadata; :func:`unpack`
checks the layout against the flat arrays before it slices them (views, no
copy), so a malformed or hostile layout is refused with a reason instead of
allocating or reading out of bounds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

PACK_PREFIX = "@pack/"
#: pack when a payload has more arrays than this (leaves room for a few extra frames)
PACK_OVER = 32
#: bounds on a layout's shapes (numpy's own limit is 64 dimensions)
MAX_NDIM, MAX_DIM = 32, 2**31


def pack(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[list[Any]]]:
    """(flat arrays by ``@pack/<dtype>``, layout ``[[name, dtype, "d0xd1"], ...]``)."""
    groups: dict[str, list[np.ndarray]] = {}
    layout = []
    for name, a in arrays.items():
        dt = a.dtype.str
        groups.setdefault(dt, []).append(np.ascontiguousarray(a).reshape(-1))
        layout.append([name, dt, "x".join(map(str, a.shape))])
    flat = {PACK_PREFIX + dt: np.concatenate(parts) for dt, parts in groups.items()}
    return flat, layout


def is_packed(tensors: dict[str, np.ndarray]) -> bool:
    return any(k.startswith(PACK_PREFIX) for k in tensors)


def unpack(tensors: dict[str, np.ndarray], layout: Any) -> tuple[dict[str, np.ndarray], str | None]:
    """The named arrays of a packed payload (and its other arrays unchanged), or ({}, why)."""
    if not isinstance(layout, list):
        return {}, "packed arrays without a layout"
    out = {k: v for k, v in tensors.items() if not k.startswith(PACK_PREFIX)}
    offsets = {k[len(PACK_PREFIX):]: 0 for k in tensors if k.startswith(PACK_PREFIX)}
    entries = []
    for i, entry in enumerate(layout):
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(e, str) for e in entry)):
            return {}, f"layout[{i}]: expected [name, dtype, shape]"
        name, dt, shape_txt = entry
        try:
            shape = tuple(int(d) for d in shape_txt.split("x")) if shape_txt else ()
        except ValueError:
            return {}, f"layout[{i}]: bad shape {shape_txt!r}"
        if dt not in offsets or any(d < 0 for d in shape) or name in out:
            return {}, f"layout[{i}] ({name!r}): unknown dtype, negative or duplicate entry"
        if len(shape) > MAX_NDIM or any(d > MAX_DIM for d in shape):
            # (a dimension of 10^20 overflowed numpy; 3 x 6148914691236517206 wrapped
            # around in int64 to the flat size and passed: an attack review)
            return {}, f"layout[{i}] ({name!r}): shape {shape_txt[:40]!r} out of bounds"
        n = math.prod(shape)  # Python ints: no wrap-around
        entries.append((name, dt, shape, offsets[dt], n))
        offsets[dt] += n
        out[name] = None  # reserve: a duplicate name is refused above
    for dt, used in offsets.items():
        if tensors[PACK_PREFIX + dt].ndim != 1 or tensors[PACK_PREFIX + dt].size != used:
            return {}, f"{PACK_PREFIX}{dt}: {tensors[PACK_PREFIX + dt].size} values, the layout needs {used}"
        if tensors[PACK_PREFIX + dt].dtype.str != dt:
            return {}, f"{PACK_PREFIX}{dt}: dtype {tensors[PACK_PREFIX + dt].dtype.str}"
    for name, dt, shape, start, n in entries:
        out[name] = tensors[PACK_PREFIX + dt][start : start + n].reshape(shape)
    return out, None


def pack_if_many(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, meta)`` as they go on the wire: packed when there are more than PACK_OVER."""
    if len(arrays) <= PACK_OVER:
        return arrays, meta
    flat, layout = pack(arrays)
    return flat, {**meta, "pack": layout}


def unpack_if_packed(tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> tuple[dict[str, np.ndarray], str | None]:
    if not is_packed(tensors):
        return tensors, None
    return unpack(tensors, meta.get("pack"))
