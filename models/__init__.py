"""hfl.models — the model zoo: every model is an HflModel (body ``features`` + linear ``head``).

Build one with ``build_model(arch, input_shape, num_classes, embedding_dim)``;
``model_names()`` lists the architectures. torchvision is imported only when a
ResNet is built.
"""

from . import lenet, mlp, resnet  # noqa: F401  (register the architectures)
from .base import HflModel, count_parameters
from .registry import arch_options, build_model, model_names, register_model

__all__ = [
    "HflModel",
    "arch_options",
    "build_model",
    "count_parameters",
    "model_names",
    "register_model",
]
