"""Splitting a dataset's indices among peers and into train/test (or FedH2L's
private/public/val/test parts, :func:`split_fractions`).

Every function takes an explicit ``seed`` (an int or a ``np.random.Generator``)
and never touches numpy's global RNG. Index arrays are int64 and sorted.

``dirichlet_partition`` is the per-class Dirichlet label-skew split of
Hsu, Qi & Brown (2019), "Measuring the effects of non-identical data
distribution for federated visual classification", as implemented in the
FedMA code (Wang et al., ICLR 2020, ``partition_data``, "hetero-dir").
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Mapping

import numpy as np

Seed = int | np.random.Generator


def as_generator(seed: Seed) -> np.random.Generator:
    """A numpy Generator from an int seed; a Generator is returned as is."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an int or a numpy Generator, got {seed!r}")
    return np.random.default_rng(int(seed))


def _labels_1d(labels: np.ndarray) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {y.shape}")
    return y


def _check_num_parts(num_parts: int, n: int) -> None:
    if isinstance(num_parts, bool) or not isinstance(num_parts, numbers.Integral) or num_parts < 1:
        raise ValueError(f"num_parts must be an int >= 1, got {num_parts!r}")
    if num_parts > n:
        raise ValueError(f"num_parts must be in [1, {n}] (the number of samples), got {num_parts}")


def iid_partition(labels: np.ndarray, num_parts: int, seed: Seed) -> list[np.ndarray]:
    """Shuffle ``range(len(labels))`` and cut it into ``num_parts`` near-equal parts.

    The parts are disjoint, cover every index, and differ in size by at most one.
    """
    n = len(_labels_1d(labels))
    _check_num_parts(num_parts, n)
    perm = as_generator(seed).permutation(n)
    return [np.sort(part).astype(np.int64) for part in np.array_split(perm, num_parts)]


#: Splits already drawn in this process, by (labels, arguments): every peer of an
#: ``hfl-launch --in-process`` cohort draws the same one (hundreds of draws with many
#: parts: 0.1 s each, a thousand peers' start-up blocked the event loop past the join
#: timeout). The oldest goes first past 8.
_DIRICHLET_SPLITS: dict[tuple, list[np.ndarray]] = {}


def dirichlet_partition(
    labels: np.ndarray,
    num_parts: int,
    alpha: float,
    seed: Seed,
    min_size: int = 10,
    *,
    balance: bool = True,
    max_draws: int = 1000,
) -> list[np.ndarray]:
    """Label-skewed split: each class is spread over the parts with Dir(alpha) proportions.

    For every class ``k``, its shuffled indices are cut among the parts in
    proportions ``p ~ Dir(alpha * 1)``. With ``balance=True`` (as in the FedMA
    code) a part that already holds at least ``N / num_parts`` samples gets no
    more of the later classes. The whole draw is repeated until every part has
    at least ``min_size`` samples; after ``max_draws`` draws a ValueError says
    what to change. Small ``alpha`` (e.g. 0.1) gives strong skew; large ``alpha``
    approaches an iid split.
    """
    y = _labels_1d(labels)
    n = len(y)
    _check_num_parts(num_parts, n)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    if isinstance(min_size, bool) or not isinstance(min_size, numbers.Integral) or min_size < 0:
        raise ValueError(f"min_size must be an int >= 0, got {min_size!r}")
    if min_size * num_parts > n:
        raise ValueError(
            f"min_size must be in [0, {n // num_parts}] for {n} samples over {num_parts} parts "
            f"(min_size * num_parts <= N), got {min_size}"
        )
    if max_draws < 1:
        raise ValueError(f"max_draws must be >= 1, got {max_draws!r}")

    key = None
    if not isinstance(seed, np.random.Generator):  # an int seed: the split is a pure function
        key = (hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest(), str(y.dtype), n,
               int(num_parts), float(alpha), int(seed), int(min_size), bool(balance), int(max_draws))
        if key in _DIRICHLET_SPLITS:
            return [p.copy() for p in _DIRICHLET_SPLITS[key]]
    rng = as_generator(seed)
    class_indices = [np.flatnonzero(y == k) for k in np.unique(y)]
    smallest = -1
    for _ in range(max_draws):
        parts = _dirichlet_draw(class_indices, n, num_parts, alpha, rng, balance)
        smallest = min(len(p) for p in parts)
        if smallest >= min_size:
            parts = [np.sort(p).astype(np.int64) for p in parts]
            if key is not None:
                if len(_DIRICHLET_SPLITS) >= 8:
                    _DIRICHLET_SPLITS.pop(next(iter(_DIRICHLET_SPLITS)))
                _DIRICHLET_SPLITS[key] = [p.copy() for p in parts]
            return parts
    raise ValueError(
        f"dirichlet_partition: no draw in {max_draws} gave every one of the {num_parts} parts "
        f"at least min_size={min_size} samples (N={n}, alpha={alpha}; the last draw's smallest "
        f"part had {smallest}); lower min_size, raise alpha or use fewer parts"
    )


def _dirichlet_draw(
    class_indices: list[np.ndarray],
    n: int,
    num_parts: int,
    alpha: float,
    rng: np.random.Generator,
    balance: bool,
) -> list[np.ndarray]:
    chunks: list[list[np.ndarray]] = [[] for _ in range(num_parts)]
    sizes = np.zeros(num_parts, dtype=np.int64)
    for idx_k in class_indices:
        idx_k = rng.permutation(idx_k)
        p = rng.dirichlet(np.full(num_parts, alpha))  # (num_parts,)
        if balance:
            masked = p * (sizes < n / num_parts)
            # With tiny alpha the mass can sit only on full parts; keep the raw draw then.
            if masked.sum() > 0:
                p = masked
        p = p / p.sum()
        cuts = (np.cumsum(p) * len(idx_k)).astype(np.int64)[:-1]
        for j, piece in enumerate(np.split(idx_k, cuts)):
            chunks[j].append(piece)
            sizes[j] += len(piece)
    return [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in chunks]


def train_test_split_indices(
    n: int,
    test_fraction: float,
    seed: Seed,
    *,
    stratify: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into sorted, disjoint ``(train_idx, test_idx)``.

    The test part has ``round(n * test_fraction)`` samples, kept within
    ``[1, n - 1]`` so both parts are non-empty. With ``stratify=labels`` each
    class contributes to the test part in proportion to its size (largest
    remainders get the rounding).
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2:
        raise ValueError(f"n must be an int >= 2 (both parts non-empty), got {n!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(
            f"test_fraction must be in the open interval (0, 1), got {test_fraction!r}"
        )
    rng = as_generator(seed)
    n_test = min(max(int(round(n * test_fraction)), 1), n - 1)

    if stratify is None:
        perm = rng.permutation(n)
        test = perm[:n_test]
    else:
        y = _labels_1d(stratify)
        if len(y) != n:
            raise ValueError(f"stratify must have n={n} labels, got {len(y)}")
        classes = np.unique(y)
        counts = np.array([np.sum(y == k) for k in classes])
        quota = counts * (n_test / n)
        take = np.floor(quota).astype(np.int64)
        remainder = n_test - int(take.sum())
        order = np.argsort(-(quota - take), kind="stable")
        take[order[:remainder]] += 1
        test = np.concatenate(
            [
                rng.permutation(np.flatnonzero(y == k))[:t]
                for k, t in zip(classes, take, strict=True)
            ]
        )
    mask = np.zeros(n, dtype=bool)
    mask[test] = True
    return np.flatnonzero(~mask).astype(np.int64), np.flatnonzero(mask).astype(np.int64)


def split_fractions(
    n: int,
    fractions: Mapping[str, float],
    seed: Seed,
    stratify: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Split ``range(n)`` into named, disjoint parts that cover it, e.g. FedH2L's
    ``{"private": 0.65, "public": 0.10, "val": 0.10, "test": 0.15}``.

    ``fractions`` must be > 0 each and sum to 1 (within 1e-6). Part sizes are
    ``n * fraction`` rounded by largest remainder (ties go to the part named
    first), so they always add up to ``n``; every part must get at least one
    sample. With ``stratify=labels`` the sizes stay the same and every class is
    spread over the parts in proportion too: a class of ``c`` samples puts
    ``floor`` or ``ceil`` of ``c * fraction`` into each part (a 2-D controlled
    rounding, solved as a small bipartite flow; were there none, the sizes
    would still hold and a class could be off by more than one). The result
    maps each name, in the order given, to a sorted int64 index array.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if not isinstance(fractions, Mapping) or not fractions:
        raise ValueError(
            f"fractions must be a non-empty mapping from part name to fraction, got {fractions!r}"
        )
    names = list(fractions)
    for key in names:
        if not isinstance(key, str) or not key:
            raise ValueError(f"fractions: part names must be non-empty strings, got {key!r}")
    f = np.array([_fraction(k, fractions[k]) for k in names])  # (P,)
    if abs(f.sum() - 1.0) > 1e-6:
        raise ValueError(
            f"fractions must sum to 1 (within 1e-6), got {f.sum():.9g} for "
            + ", ".join(f"{k}={v:g}" for k, v in zip(names, f, strict=True))
        )
    f = f / f.sum()
    sizes = _largest_remainder(n * f)  # (P,)
    if sizes.min() == 0:
        empty = ", ".join(repr(names[j]) for j in np.flatnonzero(sizes == 0))
        raise ValueError(
            f"n={n} is too small for fractions {dict(zip(names, f.round(6).tolist(), strict=True))}: "
            f"part(s) {empty} would get no sample; use more samples or larger fractions"
        )
    rng = as_generator(seed)
    if stratify is None:
        cuts = np.cumsum(sizes)[:-1]
        pieces = np.split(rng.permutation(n), cuts)
    else:
        y = _labels_1d(stratify)
        if len(y) != n:
            raise ValueError(f"stratify must have n={n} labels, got {len(y)}")
        classes = np.unique(y)
        class_idx = [np.flatnonzero(y == k) for k in classes]
        counts = np.array([len(c) for c in class_idx])
        table = _controlled_rounding(counts[:, None] * f[None, :], sizes)  # (K, P)
        per_part: list[list[np.ndarray]] = [[] for _ in names]
        for idx_k, row in zip(class_idx, table, strict=True):
            for j, piece in enumerate(np.split(rng.permutation(idx_k), np.cumsum(row)[:-1])):
                per_part[j].append(piece)
        pieces = [np.concatenate(p) for p in per_part]
    return {k: np.sort(p).astype(np.int64) for k, p in zip(names, pieces, strict=True)}


def _fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"fractions[{name!r}] must be a number in (0, 1], got {value!r}")
    v = float(value)
    if not np.isfinite(v) or not 0.0 < v <= 1.0:
        raise ValueError(f"fractions[{name!r}] must be a number in (0, 1], got {value!r}")
    return v


def _largest_remainder(quota: np.ndarray) -> np.ndarray:
    """Integers summing to ``round(quota.sum())``, each the floor or ceil of its quota."""
    total = int(round(float(quota.sum())))
    out = np.floor(quota + 1e-9).astype(np.int64)
    short = total - int(out.sum())
    order = np.argsort(-(quota - out), kind="stable")
    out[order[:short]] += 1
    return out


def _controlled_rounding(quota: np.ndarray, col_sums: np.ndarray) -> np.ndarray:
    """Round a (K, P) table of quotas whose rows sum to integers.

    Every row keeps its sum, every column gets ``col_sums`` and each cell is
    the floor or ceil of its quota. The floors are fixed first; the missing
    units (at most one per cell, only where the quota is fractional) are placed
    by augmenting paths on the bipartite graph rows x columns, starting from a
    greedy fill by largest remainder. Should no such rounding exist, the last
    units go to any column still short, so row and column sums always hold.
    """
    base = np.floor(quota + 1e-9).astype(np.int64)
    rem = quota - base
    allowed = rem > 1e-9
    row_need = np.rint(quota.sum(axis=1)).astype(np.int64) - base.sum(axis=1)
    col_need = col_sums - base.sum(axis=0)
    extra = np.zeros_like(base)
    for flat in np.argsort(-rem, axis=None, kind="stable"):
        k, j = divmod(int(flat), quota.shape[1])
        if allowed[k, j] and row_need[k] > 0 and col_need[j] > 0:
            extra[k, j] = 1
            row_need[k] -= 1
            col_need[j] -= 1
    for k in range(len(quota)):
        while row_need[k] > 0 and _augment(k, extra, allowed, col_need):
            row_need[k] -= 1
    for k in np.flatnonzero(row_need > 0):  # no controlled rounding: keep the sums anyway
        for j in np.flatnonzero(col_need > 0):
            give = min(int(row_need[k]), int(col_need[j]))
            extra[k, j] += give
            row_need[k] -= give
            col_need[j] -= give
    return base + extra


def _augment(start: int, extra: np.ndarray, allowed: np.ndarray, col_need: np.ndarray) -> bool:
    """Give row ``start`` one more unit along an augmenting path; False if there is none.

    The path goes row -> column through a free allowed cell, and column -> row
    through a cell already holding a unit (that row then moves its unit on),
    until it reaches a column still short of units.
    """
    col_parent: dict[int, int] = {}  # column -> the row that reached it through a free cell
    row_parent: dict[int, int] = {start: -1}  # row -> the column whose unit it gives up
    frontier = [start]
    while frontier:
        nxt: list[int] = []
        for k in frontier:
            for j in map(int, np.flatnonzero(allowed[k] & (extra[k] == 0))):
                if j in col_parent:
                    continue
                col_parent[j] = k
                if col_need[j] > 0:
                    col_need[j] -= 1
                    while j != -1:
                        k_from = col_parent[j]
                        extra[k_from, j] = 1
                        j = row_parent[k_from]
                        if j != -1:
                            extra[k_from, j] = 0
                    return True
                for k2 in map(int, np.flatnonzero(extra[:, j] == 1)):
                    if k2 not in row_parent:
                        row_parent[k2] = j
                        nxt.append(k2)
        frontier = nxt
    return False
