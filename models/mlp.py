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
