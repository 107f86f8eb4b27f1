"""Registry of model architectures, looked up by name in :func:`build_model`."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable

from .base import HflModel

#: ``builder(input_shape, num_classes, embedding_dim, **arch_kwargs) -> HflModel``
ModelBuilder = Callable[..., HflModel]

_MODELS: dict[str, ModelBuilder] = {}


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Decorator registering an architecture builder under ``name``; duplicates are an error."""

    def decorate(fn: ModelBuilder) -> ModelBuilder:
        if name in _MODELS:
            raise ValueError(f"model architecture {name!r} is already registered")
        _MODELS[name] = fn
        return fn

    return decorate


def model_names() -> list[str]:
    """Names accepted by :func:`build_model`, sorted."""
    return sorted(_MODELS)


def arch_options(arch: str) -> dict[str, object]:
    """The keyword options of ``arch`` and their defaults."""
    fn = _lookup(arch)
    return {
        p.name: p.default
        for p in inspect.signature(fn).parameters.values()
        if p.kind == p.KEYWORD_ONLY
    }


def _lookup(arch: str) -> ModelBuilder:
    if arch not in _MODELS:
        raise ValueError(
            f"unknown model architecture {arch!r}; allowed values: {', '.join(model_names())}"
        )
    return _MODELS[arch]


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be an int >= 1, got {value!r}")
    return int(value)


def build_model(
    arch: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    embedding_dim: int = 64,
    **arch_kwargs: object,
) -> HflModel:
    """Build architecture ``arch`` for samples of ``input_shape`` (without the batch dim).

    Weights are initialised from torch's global RNG: seed it with
    ``torch.manual_seed`` before calling for a reproducible model.
    """
    fn = _lookup(arch)
    allowed = arch_options(arch)
    # A head a method put in place of the linear one (models/heads.py), by its spec;
    # not where an architecture has an option of that name itself (a plugin's).
    head = None if "head" in allowed else arch_kwargs.pop("head", None)
    unknown = sorted(set(arch_kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"model {arch!r} got unknown option(s) {', '.join(unknown)}; "
            f"allowed options: {', '.join(allowed) if allowed else '(none)'}"
        )
    try:
        shape = tuple(_positive_int(d, "each input_shape dimension") for d in input_shape)
    except TypeError:
        raise ValueError(f"input_shape must be a tuple of ints, got {input_shape!r}") from None
    if not shape:
        raise ValueError("input_shape must have at least one dimension, got ()")
    num_classes = _positive_int(num_classes, "num_classes")
    embedding_dim = _positive_int(embedding_dim, "embedding_dim")
    model = fn(shape, num_classes, embedding_dim, **arch_kwargs)
    if head is not None:
        from .heads import build_head

        model.head = build_head(model.embedding_dim, num_classes, head)
    return model
