"""Multi-layer perceptron for tabular rows or flattened images."""

from __future__ import annotations

import math
import numbers
from collections import OrderedDict
from collections.abc import Sequence

from torch import nn

from ._checks import dropout_rate
from .base import HflModel, he_init_
from .registry import register_model


@register_model("mlp")
def build_mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int,
    *,
    hidden: Sequence[int] = (128,),
    dropout: float = 0.0,
) -> HflModel:
    """Flatten -> [Linear(h) -> ReLU -> Dropout] per hidden width -> Linear(E) -> ReLU.

    The body has He-normal init (see :func:`he_init_`); the head keeps the default.
    """
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ValueError(f"mlp option hidden must be a list of ints >= 1, got {hidden!r}")
    for h in hidden:
        if isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1:
            raise ValueError(f"mlp option hidden must be a list of ints >= 1, got {list(hidden)!r}")
    dropout = dropout_rate("mlp", dropout)

    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten(start_dim=1))
    width = math.prod(input_shape)
    for i, h in enumerate(hidden, start=1):
        layers[f"fc{i}"] = nn.Linear(width, int(h))
        layers[f"relu{i}"] = nn.ReLU()
        if dropout > 0:
            layers[f"drop{i}"] = nn.Dropout(dropout)
        width = int(h)
    layers["fc_embed"] = nn.Linear(width, embedding_dim)
    layers["relu_embed"] = nn.ReLU()  # (B, E)
    features = nn.Sequential(layers)
    he_init_(features)
    return HflModel(features, embedding_dim, num_classes, arch="mlp", input_shape=input_shape)


def _int_range(value: object, what: str) -> tuple[int, int]:
    """``[lo, hi]`` (inclusive) or a single int, as a pair of ints >= 1 with lo <= hi."""
    pair = (value, value) if isinstance(value, numbers.Integral) else value
    try:
        lo, hi = pair  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ValueError(f"random_mlp option {what} must be an int or a [lo, hi] pair, got {value!r}") from None
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"random_mlp option {what} must hold ints >= 1, got {value!r}")
    if lo > hi:
        raise ValueError(f"random_mlp option {what} must be [lo, hi] with lo <= hi, got {value!r}")
    return int(lo), int(hi)


def draw_hidden(depth: object, width: object, seed: int) -> list[int]:
    """Hidden widths of a random MLP: ``depth`` layers drawn uniformly from its
    ``[lo, hi]`` range, each width log-uniformly from ``width``'s, from ``seed`` only."""
    import numpy as np

    d_lo, d_hi = _int_range(depth, "depth")
    w_lo, w_hi = _int_range(width, "width")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(d_lo, d_hi + 1))
    logs = rng.uniform(math.log(w_lo), math.log(w_hi + 1), size=n)
    return [min(w_hi, int(math.exp(v))) for v in logs]


@register_model("random_mlp")
def build_random_mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int,
    *,
    depth: Sequence[int] | int = (1, 3),
    width: Sequence[int] | int = (16, 256),
    seed: int | None = None,
    dropout: float = 0.0,
) -> HflModel:
    """An :func:`build_mlp` whose depth and hidden widths are drawn from ``seed``.

    CHFL's tabular experiments give each client "MLP models generated randomly
    with different layers and hidden unit numbers". The peer runtime fills in
    ``seed`` from the peer's identity when it is not given, so every peer of a
    cohort draws its own architecture, reproducibly; without a seed the draw
    comes from torch's global generator.
    """
    if seed is None:  # like every architecture: reproducible from torch.manual_seed
        import torch

        seed = int(torch.randint(0, 2**31 - 1, (1,)))
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"random_mlp option seed must be an int, got {seed!r}")
    hidden = draw_hidden(depth, width, int(seed))
    model = build_mlp(input_shape, num_classes, embedding_dim, hidden=hidden, dropout=dropout)
    model.arch = f"random_mlp{hidden}"
    return model
