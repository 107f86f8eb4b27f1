"""MobileNetV3-Small (Howard et al., 2019, "Searching for MobileNetV3", table 2) for small images.

torchvision's ``mobilenet_v3_small(weights=None)`` with three changes:

* the stem conv takes ``C`` input channels and has stride 1, and the first
  bottleneck's depthwise conv has stride 1 too, so the body downsamples by 8
  instead of 32 (32 px -> 4x4, 8 px -> 1x1), like the CIFAR ResNets in this zoo;
* BatchNorm uses PyTorch's defaults (momentum 0.1) instead of the TensorFlow
  ImageNet recipe's momentum 0.01, whose running statistics would need
  hundreds of steps to settle, far more than a federated round trains locally;
* the classifier becomes global average pool -> [Dropout] -> ``Linear(576, E)`` -> ReLU.

torchvision is imported only when the model is built.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from ._checks import dropout_rate, image_shape, positive_real
from .base import HflModel
from .registry import register_model


@register_model("mobilenet_v3_small")
def build_mobilenet_v3_small(
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int,
    *,
    width_mult: float = 1.0,
    dropout: float = 0.2,
) -> HflModel:
    """MobileNetV3-Small body for ``(C, H, W)`` inputs plus a linear head.

    ``width_mult`` scales every channel count (rounded to multiples of 8, as in
    torchvision); ``dropout`` (torchvision's default 0.2) precedes the embedding layer.
    """
    arch = "mobilenet_v3_small"
    in_ch, _, _ = image_shape(arch, input_shape)
    width_mult = positive_real(arch, "width_mult", width_mult)
    dropout = dropout_rate(arch, dropout)
    from torchvision.models import mobilenet_v3_small

    net = mobilenet_v3_small(weights=None, width_mult=width_mult, norm_layer=nn.BatchNorm2d)
    stem = net.features[0]  # Conv2dNormActivation: conv, bn, hardswish
    stem[0] = nn.Conv2d(in_ch, stem[0].out_channels, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(stem[0].weight, mode="fan_out")  # as torchvision inits its convs
    first_dw = net.features[1].block[0][0]  # depthwise 3x3 of the first bottleneck
    first_dw.stride = (1, 1)
    last_conv = net.features[-1]
    tail: OrderedDict[str, nn.Module] = OrderedDict(
        avgpool=net.avgpool,  # (B, 576w, 1, 1)
        flatten=nn.Flatten(start_dim=1),  # (B, 576w)
    )
    if dropout > 0:
        tail["dropout"] = nn.Dropout(dropout)
    tail["fc"] = nn.Linear(last_conv.out_channels, embedding_dim)
    tail["fc_relu"] = nn.ReLU()  # (B, E)
    features = nn.Sequential(
        OrderedDict(
            stem=stem,  # (B, 16w, H, W)
            blocks=net.features[1:-1],  # (B, 96w, H/8, W/8)
            last_conv=last_conv,  # (B, 576w, H/8, W/8)
            **tail,
        )
    )
    return HflModel(features, embedding_dim, num_classes, arch=arch, input_shape=input_shape)
