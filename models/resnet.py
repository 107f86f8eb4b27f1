"""ResNet-18 and ResNet-34 (He et al., 2016) adapted to small images, as in the CIFAR variants.

torchvision's ``resnet18``/``resnet34(weights=None)`` with a 3x3 stride-1 stem
conv taking ``C`` input channels and no stem max-pool, so the body downsamples
by 8 (32 px -> 4x4, 8 px -> 1x1); it ends at the global average pool followed by
``Linear(512, E) -> ReLU``. torchvision is imported only here, when such a model
is built.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from ._checks import image_shape
from .base import HflModel
from .registry import register_model


@register_model("resnet18")
def build_resnet18(
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int,
) -> HflModel:
    """ResNet-18 body for ``(C, H, W)`` inputs (8 px and up) plus a linear head."""
    return _small_input_resnet("resnet18", input_shape, num_classes, embedding_dim)


@register_model("resnet34")
def build_resnet34(
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int,
) -> HflModel:
    """ResNet-34 body for ``(C, H, W)`` inputs (8 px and up) plus a linear head."""
    return _small_input_resnet("resnet34", input_shape, num_classes, embedding_dim)


def _small_input_resnet(
    arch: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int,
) -> HflModel:
    """torchvision's ``arch`` (a BasicBlock ResNet) with the small-input stem described above."""
    in_ch, _, _ = image_shape(arch, input_shape)
    from torchvision import models

    net = getattr(models, arch)(weights=None, num_classes=num_classes)
    net.conv1 = nn.Conv2d(in_ch, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    features = nn.Sequential(
        OrderedDict(
            conv1=net.conv1,
            bn1=net.bn1,
            relu=net.relu,
            layer1=net.layer1,  # (B, 64, H, W)
            layer2=net.layer2,  # (B, 128, H/2, W/2)
            layer3=net.layer3,  # (B, 256, H/4, W/4)
            layer4=net.layer4,  # (B, 512, H/8, W/8)
            avgpool=net.avgpool,  # (B, 512, 1, 1)
            flatten=nn.Flatten(start_dim=1),  # (B, 512)
            fc=nn.Linear(net.fc.in_features, embedding_dim),
            fc_relu=nn.ReLU(),  # (B, E)
        )
    )
    return HflModel(features, embedding_dim, num_classes, arch=arch, input_shape=input_shape)
