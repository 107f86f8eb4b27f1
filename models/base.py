"""The one model shape every algorithm relies on: a body (``features``) and a linear head."""

from __future__ import annotations

import torch
from torch import nn


class HflModel(nn.Module):
    """``forward(x) = head(features(x))`` with ``features: x -> (B, E)`` and ``head: (B, E) -> (B, C)``.

    Algorithms reach the parts by name: CHFL shares only ``head``, FedProto and
    FedHP average ``embed(x)`` into class prototypes, FedIN reads intermediate
    feature maps of ``features``.
    """

    def __init__(
        self,
        features: nn.Module,
        embedding_dim: int,
        num_classes: int,
        *,
        arch: str = "",
        input_shape: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.features = features
        self.head = nn.Linear(embedding_dim, num_classes)
        self.embedding_dim = embedding_dim
        self.num_classes = num_classes
        self.arch = arch
        self.input_shape = tuple(input_shape)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The embedding, shape ``(B, E)``."""
        return self.features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits, shape ``(B, C)``."""
        return self.head(self.features(x))

    def extra_repr(self) -> str:
        return (
            f"arch={self.arch!r}, input_shape={self.input_shape}, "
            f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}"
        )


def he_init_(module: nn.Module) -> None:
    """He (Kaiming) normal init, fan-in, for every Conv2d/Linear in ``module``; zero biases.

    He et al. (2015), "Delving deep into rectifiers", eq. 10. PyTorch's default
    (uniform, gain for leaky-ReLU slope sqrt(5)) shrinks the signal by about 3x
    per ReLU layer, which leaves a four-layer body such as LeNet on a long
    loss plateau under SGD.
    """
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


#: The smallest feature-map side a 2x2 pool may leave behind. A 3x3 conv (padding 1) on a
#: 1x1 map reaches only its centre tap, so 8 of its 9 weights would never get a gradient.
MIN_MAP_SIDE_PX = 2


def pool_keeps_map(height: int, width: int) -> bool:
    """Whether a 2x2 stride-2 pool on a ``height x width`` map leaves at least ``MIN_MAP_SIDE_PX``.

    VGG and AlexNet skip the pools for which this is false, so that 8 px inputs
    keep a 2x2 map through their last conv layers while 32 px inputs keep most pools.
    """
    return min(height, width) // 2 >= MIN_MAP_SIDE_PX


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters (all, or only those with ``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
