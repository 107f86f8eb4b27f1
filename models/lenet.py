"""LeNet-5 style convolutional network (LeCun et al., 1998) for small images.

conv -> ReLU -> maxpool -> conv -> ReLU -> maxpool -> fc -> ReLU -> fc(E) -> ReLU.
Images of 16 px and more use the classic 5x5 kernels (first conv padded by 2,
so 28x28 gives 16x5x5 before the fc layers); smaller images such as the 8x8
digits use 3x3 kernels padded by 1 so both pooling stages stay valid. The body
has He-normal init (see :func:`hfl.models.base.he_init_`).
"""

from __future__ import annotations

import numbers
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from ._checks import image_shape
from .base import HflModel, he_init_
from .registry import register_model

_MIN_SIDE_PX = 8


@register_model("lenet")
def build_lenet(
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int,
    *,
    channels: tuple[int, int] = (6, 16),
    fc_width: int = 120,
) -> HflModel:
    """LeNet-5 for ``(C, H, W)`` inputs with ``H, W >= 8``."""
    in_ch, height, width = image_shape("lenet", input_shape)
    if min(height, width) < _MIN_SIDE_PX:
        raise ValueError(
            f"lenet needs images of at least {_MIN_SIDE_PX}x{_MIN_SIDE_PX} px, got {height}x{width}"
        )
    if (
        not isinstance(channels, Sequence)
        or isinstance(channels, str)
        or len(channels) != 2
        or any(
            isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1 for c in channels
        )
    ):
        raise ValueError(f"lenet option channels must be two ints >= 1, got {channels!r}")
    if isinstance(fc_width, bool) or not isinstance(fc_width, numbers.Integral) or fc_width < 1:
        raise ValueError(f"lenet option fc_width must be an int >= 1, got {fc_width!r}")

    c1, c2 = int(channels[0]), int(channels[1])
    if min(height, width) >= 16:
        kernel, pad1, pad2 = 5, 2, 0
    else:
        kernel, pad1, pad2 = 3, 1, 1
    conv = OrderedDict(
        conv1=nn.Conv2d(in_ch, c1, kernel, padding=pad1),
        relu1=nn.ReLU(),
        pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(c1, c2, kernel, padding=pad2),
        relu2=nn.ReLU(),
        pool2=nn.MaxPool2d(2),  # (B, c2, h, w)
        flatten=nn.Flatten(start_dim=1),  # (B, c2 * h * w)
    )
    with torch.no_grad():
        flat = nn.Sequential(conv)(torch.zeros(1, *input_shape)).shape[1]
    features = nn.Sequential(
        OrderedDict(
            **conv,
            fc1=nn.Linear(flat, int(fc_width)),
            relu3=nn.ReLU(),
            fc2=nn.Linear(int(fc_width), embedding_dim),
            relu4=nn.ReLU(),  # (B, E)
        )
    )
    he_init_(features)
    return HflModel(features, embedding_dim, num_classes, arch="lenet", input_shape=input_shape)
