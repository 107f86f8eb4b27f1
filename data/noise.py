"""Label noise on a private training split: the transition matrices of MDH-FL.

"Exploiting Model and Data Heterogeneity in FL", section 4.1: a label-transition
matrix M with M[i, j] = flip(y~ = j | y = i), of two kinds (as in Co-teaching,
Han et al. 2018, whose ``noisify`` the authors' code uses):

* ``pair``: a label of class i stays with probability 1 - rate and becomes
  class (i + 1) mod C with probability rate;
* ``symmetric``: a label stays with probability 1 - rate and becomes each of
  the C - 1 other classes with probability rate / (C - 1).

Each label is drawn from its row of M independently (seeded), so the realised
noise rate (the share of labels that changed) scatters around ``rate``, and
each peer, with its own seed, gets its own noise pattern. Only training splits
are meant to be noisy: test, validation and public data stay clean.
"""

from __future__ import annotations

import numbers

import numpy as np

from .dataset import ArrayDataset
from .partition import Seed, as_generator

NOISE_TYPES = ("pair", "symmetric")


def transition_matrix(kind: str, rate: float, num_classes: int) -> np.ndarray:
    """M (C, C), rows summing to 1: M[i, j] = P(noisy label j | true label i)."""
    if kind not in NOISE_TYPES:
        raise ValueError(f"label noise type: got {kind!r}; allowed: {', '.join(NOISE_TYPES)}")
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 <= rate < 1.0:
        raise ValueError(f"label noise rate: got {rate!r}; allowed: a number in [0, 1)")
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 2:
        raise ValueError(f"label noise needs num_classes >= 2, got {num_classes!r}")
    c, r = int(num_classes), float(rate)
    m = np.eye(c) * (1.0 - r)
    if kind == "pair":
        m[np.arange(c), (np.arange(c) + 1) % c] += r
    else:
        m += (1.0 - np.eye(c)) * (r / (c - 1))
    return m


def noisy_labels(y: np.ndarray, kind: str, rate: float, num_classes: int,
                 seed: Seed) -> np.ndarray:
    """A copy of ``y`` with each label redrawn from its row of the transition matrix."""
    m = transition_matrix(kind, rate, num_classes)
    y = np.asarray(y, dtype=np.int64)
    rng = as_generator(seed)
    u = rng.random(len(y))  # one uniform per label: inverse-CDF draw from row y_i
    cdf = np.cumsum(m, axis=1)  # (C, C)
    cdf[:, -1] = 1.0
    out = (u[:, None] >= cdf[y]).sum(axis=1).astype(np.int64)
    return np.minimum(out, num_classes - 1)


def add_label_noise(ds: ArrayDataset, kind: str, rate: float,
                    seed: Seed) -> tuple[ArrayDataset, float]:
    """``ds`` with noisy labels, and the realised noise rate (share of labels changed)."""
    y = noisy_labels(ds.y, kind, rate, ds.num_classes, seed)
    realised = float((y != ds.y).mean()) if len(y) else 0.0
    return ArrayDataset(ds.x, y, ds.num_classes, name=ds.name, schema=ds.schema,
                        classes=ds.classes), realised
