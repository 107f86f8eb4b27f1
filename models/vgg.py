"""VGG-11 (Simonyan & Zisserman, 2015, configuration A) for small images.

The conv layers of torchvision's ``vgg11_bn(weights=None)`` (or ``vgg11`` with
``batch_norm=False``), the first taking ``C`` input channels. A 2x2 max-pool is
kept only while the map stays at least 2x2 after it (see
:func:`hfl.models.base.pool_keeps_map`): 8 px inputs keep 2 of the 5 pools,
16 px keep 3, 32 px keep 4, and every conv sees a map of 2x2 or more. The
4096-wide classifier is replaced by global average pool -> ``Linear(512, E)``
-> ReLU, as in the usual CIFAR VGGs.

Convs and the embedding layer get the zoo's He-normal fan-in init (see
:func:`hfl.models.base.he_init_`) rather than torchvision's fan-out one, under
which the body's output of plain VGG-11 is about 20x smaller on 8 px 1-channel
images (13x on 32 px RGB) and SGD sits on a loss plateau; BatchNorm starts at
identity.

BatchNorm (``vgg11_bn``) is the default because plain VGG-11, eight conv
layers without skip connections, trains far more slowly from scratch (ten
digits, SGD at lr 0.02: 15 steps take the loss from 2.31 to 2.20 without
BatchNorm, 5 steps take it to 0.47 with it), and the other deep models of the
zoo have BatchNorm too; ``batch_norm=False`` gives plain VGG-11, e.g. for
methods that cannot share or localise BatchNorm statistics. torchvision is
imported only when the model is built.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ._checks import flag, image_shape
from .base import HflModel, he_init_, pool_keeps_map
from .registry import register_model


@register_model("vgg11")
def build_vgg11(
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int,
    *,
    batch_norm: bool = True,
) -> HflModel:
    """VGG-11 body for ``(C, H, W)`` inputs plus a linear head."""
    in_ch, height, width = image_shape("vgg11", input_shape)
    batch_norm = flag("vgg11", "batch_norm", batch_norm)
    from torchvision.models import vgg11, vgg11_bn

    # Built on the meta device: the 123M-parameter classifier dropped below would
    # otherwise take about 0.5 GB and a second to allocate and initialise.
    with torch.device("meta"):
        net = (vgg11_bn if batch_norm else vgg11)(weights=None)
    convs = net.features.to_empty(device="cpu")  # uninitialised until the end
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    n_conv = n_pool = 0
    for layer in convs:
        if isinstance(layer, nn.Conv2d):
            n_conv += 1
            if n_conv == 1:
                layer = nn.Conv2d(in_ch, layer.out_channels, kernel_size=3, padding=1)
            layers[f"conv{n_conv}"] = layer
        elif isinstance(layer, nn.BatchNorm2d):
            layers[f"bn{n_conv}"] = layer
        elif isinstance(layer, nn.ReLU):
            layers[f"relu{n_conv}"] = layer
        elif isinstance(layer, nn.MaxPool2d):
            if pool_keeps_map(height, width):
                n_pool += 1
                layers[f"pool{n_pool}"] = layer
                height, width = height // 2, width // 2
        else:
            raise TypeError(f"unexpected layer in torchvision's VGG-11: {layer!r}")
    features = nn.Sequential(
        OrderedDict(
            **layers,  # (B, 512, h, w) with h, w >= 2 (for inputs of 2 px and more)
            avgpool=nn.AdaptiveAvgPool2d(1),  # (B, 512, 1, 1)
            flatten=nn.Flatten(start_dim=1),  # (B, 512)
            fc=nn.Linear(512, embedding_dim),
            fc_relu=nn.ReLU(),  # (B, E)
        )
    )
    he_init_(features)
    for m in features.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_parameters()  # weight 1, bias 0, running mean 0 and var 1
    return HflModel(features, embedding_dim, num_classes, arch="vgg11", input_shape=input_shape)
