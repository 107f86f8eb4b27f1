"""Splitting a dataset's indices among peers and into train/test.

Every function takes an explicit ``seed`` (an int or a ``np.random.Generator``)
and never touches numpy's global RNG. Index arrays are int64 and sorted.

``dirichlet_partition`` is the per-class Dirichlet label-skew split of
Hsu, Qi & Brown (2019), "Measuring the effects of non-identical data
distribution for federated visual classification", as implemented in the
FedMA code (Wang et al., ICLR 2020, ``partition_data``, "hetero-dir").
"""

from __future__ import annotations

import numbers

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

    rng = as_generator(seed)
    class_indices = [np.flatnonzero(y == k) for k in np.unique(y)]
    smallest = -1
    for _ in range(max_draws):
        parts = _dirichlet_draw(class_indices, n, num_parts, alpha, rng, balance)
        smallest = min(len(p) for p in parts)
        if smallest >= min_size:
            return [np.sort(p).astype(np.int64) for p in parts]
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
