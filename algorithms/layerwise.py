"""Aggregation over peers whose models differ in depth: layer-wise or by architecture.

FedIN (Chan et al., sec. 4.3) aggregates heterogeneous models in two ways:

- ``layerwise`` — InclusiveFL's layer-wise heterogeneous aggregation (Liu et al.,
  KDD 2022): every named array is averaged over the peers that hold an array of
  that name, shape and dtype (a ResNet-10 and a ResNet-26 share ``stage4.0``,
  only the deeper one has ``stage4.2``); the weights are the sample counts of
  exactly those holders, renormalised per layer;
- ``same_arch`` — the paper's "extreme heterogeneity" (Table V): only models
  with the identical architecture (same names, shapes and dtypes) are averaged
  together, FedAvg within each group.

Both return one dict of arrays that serves every peer: a name held with one
shape keeps its name; a name held with several shapes is keyed
``name|d0xd1x...`` per shape; ``same_arch`` keys are ``<signature>/name``.
:func:`select` picks out what a peer loads; a layer nobody else holds comes
back as the peer's own (it was averaged over one holder).
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict

import numpy as np

from hfl.algorithms.payload import beyond_scale, top_abs

GroupKey = tuple[str, tuple[int, ...], str]  # (name, shape, dtype)


def arch_signature(arrays: dict[str, np.ndarray]) -> str:
    """A fingerprint of an architecture: crc32 over sorted names, shapes and dtypes."""
    crc = 0
    for name in sorted(arrays):
        a = arrays[name]
        crc = zlib.crc32(f"{name}:{a.shape}:{a.dtype.str};".encode(), crc)
    return f"{crc:08x}"


#: What separates a name from its shape in a result key (no module's parameter name has it).
SHAPE_MARK = "|"


def unfit(arrays: dict[str, np.ndarray], own_top: float | None = None) -> str | None:
    """Why ``arrays`` cannot take part in a layer-wise mean (nothing to average, an
    array that is not numeric, non-finite values, values far beyond this peer's own
    largest ``own_top``: payload.beyond_scale, over its whole model, as its layers
    need not match), or None if they can."""
    if not arrays:
        return "no arrays"
    for name, a in arrays.items():
        if SHAPE_MARK in name:
            # (a member's array named "head.weight|10x16", the key the honest holders of
            # head.weight got once it also sent one of another shape, replaced their mean
            # on every peer, without a word: an attack review)
            return (f"{name}: {SHAPE_MARK!r} in an array name (the layer-wise result keys a "
                    "name held with several shapes name|shape)")
        if not isinstance(a, np.ndarray) or a.dtype.kind not in "fiub":
            return f"{name}: not a numeric array"
        if a.dtype.kind == "f":
            top = top_abs(a)
            if not math.isfinite(top):
                return f"{name}: non-finite values"
            why = beyond_scale(name, top, own_top)
            if why is not None:
                return why
    return None


def _shape_key(name: str, shape: tuple[int, ...]) -> str:
    return f"{name}{SHAPE_MARK}{'x'.join(map(str, shape))}"


def shares(weights: np.ndarray) -> np.ndarray:
    """Finite weights >= 0, not all 0, as shares that sum to 1: scaled by the largest
    first (two members' counts of 1e308 summed to inf, and every share was 0: an
    all-zero model, whatever cap was set)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.max()
    return w / w.sum()


def _mean(stack: list[np.ndarray], weights: np.ndarray) -> np.ndarray:
    if np.issubdtype(stack[0].dtype, np.floating):
        w = shares(weights)
        acc = np.zeros(stack[0].shape, dtype=np.float64)
        for wi, t in zip(w, stack, strict=True):
            acc += wi * t
        return acc.astype(stack[0].dtype)
    return np.asarray(np.max(np.stack(stack), axis=0))  # integer buffers (num_batches_tracked): the max


def groups(
    arrays: dict[str, dict[str, np.ndarray]], same_arch: bool = False
) -> list[tuple[str, list[str], dict[str, str]]]:
    """What a layer-wise (or ``same_arch``) aggregate combines: a list of
    ``(label, members, {result key: array name})``, members in sorted order. Layer-wise:
    one group per (name, shape, dtype), its holders, one key (the name, or
    ``name|shape`` where peers hold the name with several shapes); same_arch: one
    group per architecture, keys ``<signature>/name``."""
    peers = sorted(arrays)
    if same_arch:
        by_sig: dict[str, list[str]] = defaultdict(list)
        for p in peers:
            by_sig[arch_signature(arrays[p])].append(p)
        return [(sig, members, {f"{sig}/{name}": name for name in arrays[members[0]]})
                for sig, members in by_sig.items()]
    holders: dict[GroupKey, list[str]] = defaultdict(list)
    for p in peers:
        for name, a in arrays[p].items():
            holders[(name, tuple(a.shape), a.dtype.str)].append(p)
    variants: dict[str, int] = defaultdict(int)
    for name, _, _ in holders:
        variants[name] += 1
    out = []
    for (name, shape, dtype), members in holders.items():
        if variants[name] > 1:
            same_shape = [k for k in holders if k[0] == name and k[1] == shape]
            if len(same_shape) > 1:
                # One name, one shape, several dtypes: the one most peers hold (ties: the
                # first by name). It was the first by name: one member's float16 copies
                # of every array ('<f2' < '<f4') displaced every honest group.
                if dtype != min(same_shape, key=lambda k: (-len(holders[k]), k[2]))[2]:
                    continue
            key = _shape_key(name, shape)
        else:
            key = name
        out.append((key, members, {key: name}))
    return out


def layerwise_mean(
    arrays: dict[str, dict[str, np.ndarray]],
    weights: dict[str, float],
    same_arch: bool = False,
) -> dict[str, np.ndarray]:
    """Mean of each array over the peers that hold it (see the module docstring).

    ``arrays`` maps peer -> its named arrays, ``weights`` peer -> weight (sample
    count, or 1). Peers are visited in sorted order: the sum is reproducible.
    ``hfl.algorithms.robust.combine_layerwise`` runs a robust rule over the same groups.
    """
    if not arrays:
        raise ValueError("nothing to average")
    out = {}
    for _, members, keys in groups(arrays, same_arch):
        w = np.array([weights[p] for p in members], dtype=np.float64)
        for key, name in keys.items():
            out[key] = _mean([arrays[p][name] for p in members], w)
    return out


def select(
    result: dict[str, np.ndarray], own: dict[str, np.ndarray], same_arch: bool = False
) -> tuple[dict[str, np.ndarray], int]:
    """The arrays this peer loads from a layer-wise (or ``same_arch``) result: for each
    of its own arrays, the result's entry of the same name, shape and dtype (its own
    array where the result has none). Returns (arrays, how many came from the result)."""
    sig = arch_signature(own) if same_arch else ""
    picked, found = {}, 0
    for name, mine in own.items():
        keys = [f"{sig}/{name}"] if same_arch else [name, _shape_key(name, mine.shape)]
        got = next((result[k] for k in keys if k in result
                    and result[k].shape == mine.shape and result[k].dtype == mine.dtype), None)
        if got is None:
            picked[name] = mine
        else:
            picked[name] = got
            found += 1
    return picked, found
