"""AlexNet (Krizhevsky et al., 2012) scaled down to small images.

Five conv layers with ReLU, 64-192-384-256-256 channels as in torchvision's
AlexNet, but stride 1 with 5x5 kernels for the first two layers (instead of
11x11 stride 4 and 5x5) and 3x3 for the last three. A 2x2 max-pool follows
conv1, conv2 and conv5, each kept only while the map stays at least 2x2 after
it (see :func:`hfl.models.base.pool_keeps_map`): 8 px inputs keep two pools,
16 and 32 px all three. An adaptive average pool to 2x2 fixes the width of the
fully connected part, which mirrors AlexNet's three FC layers with the head as
the third one: Dropout -> ``Linear(1024, 1024)`` -> ReLU -> Dropout ->
``Linear(1024, E)`` -> ReLU. No local response normalisation (as torchvision).
He-normal init (see :func:`hfl.models.base.he_init_`).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from ._checks import dropout_rate, image_shape
from .base import HflModel, he_init_, pool_keeps_map
from .registry import register_model

#: (out_channels, kernel_size, pool after) for conv1..conv5
_CONVS = ((64, 5, True), (192, 5, True), (384, 3, False), (256, 3, False), (256, 3, True))
_POOLED_SIDE_PX = 2
_FC_WIDTH = 1024


@register_model("alexnet")
def build_alexnet(
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int,
    *,
    dropout: float = 0.5,
) -> HflModel:
    """AlexNet-style body for ``(C, H, W)`` inputs plus a linear head; ``dropout`` in the FC part."""
    in_ch, height, width = image_shape("alexnet", input_shape)
    dropout = dropout_rate("alexnet", dropout)

    layers: OrderedDict[str, nn.Module] = OrderedDict()
    prev, n_pool = in_ch, 0
    for i, (out_ch, kernel, pool_after) in enumerate(_CONVS, start=1):
        layers[f"conv{i}"] = nn.Conv2d(prev, out_ch, kernel, padding=kernel // 2)
        layers[f"relu{i}"] = nn.ReLU()
        if pool_after and pool_keeps_map(height, width):
            n_pool += 1
            layers[f"pool{n_pool}"] = nn.MaxPool2d(2)
            height, width = height // 2, width // 2
        prev = out_ch
    layers["avgpool"] = nn.AdaptiveAvgPool2d(_POOLED_SIDE_PX)  # (B, 256, 2, 2)
    layers["flatten"] = nn.Flatten(start_dim=1)  # (B, 1024)
    fc_in = prev * _POOLED_SIDE_PX**2
    for i, (n_in, n_out) in enumerate(((fc_in, _FC_WIDTH), (_FC_WIDTH, embedding_dim)), start=1):
        if dropout > 0:
            layers[f"drop{i}"] = nn.Dropout(dropout)
        layers[f"fc{i}"] = nn.Linear(n_in, n_out)
        layers[f"fc_relu{i}"] = nn.ReLU()  # ends (B, E)
    features = nn.Sequential(layers)
    he_init_(features)
    return HflModel(features, embedding_dim, num_classes, arch="alexnet", input_shape=input_shape)
