"""Input-space transforms of image datasets: recolour, resize, rotate, flatten.

They let peers of one cohort see the same task through different input spaces
(grey vs colour, 8x8 vs 16x16, images vs flat vectors). Each returns a new
ArrayDataset with the same labels; torch is imported only by the functions
that resample.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .dataset import ArrayDataset
from .partition import Seed, as_generator

RECOLOR_PER = ("sample", "class")


def _check_images(ds: ArrayDataset, what: str) -> tuple[int, int, int, int]:
    if ds.x.ndim != 4:
        raise ValueError(
            f"{what}: dataset {ds.name!r} must hold images of shape (N, C, H, W), "
            f"got x of shape {ds.x.shape}"
        )
    n, c, h, w = ds.x.shape
    return int(n), int(c), int(h), int(w)


def _image_size(size: int | tuple[int, int], what: str = "size") -> tuple[int, int]:
    """``size`` as ``(height, width)``; an int means a square."""
    pair = (size, size) if isinstance(size, numbers.Integral) else size
    try:
        h, w = pair  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ValueError(
            f"{what} must be an int >= 1 or a (height, width) pair, got {size!r}"
        ) from None
    for v in (h, w):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{what} must be an int >= 1 or a (height, width) pair, got {size!r}")
    return int(h), int(w)


def recolor(
    ds: ArrayDataset, seed: Seed, *, per: str = "sample", name: str | None = None
) -> ArrayDataset:
    """Tint grey images with random colours: ``(N, 1, H, W) -> (N, 3, H, W)``.

    A colour is drawn uniformly from the RGB cube and scaled so its largest
    component is 1; the image becomes ``x * colour`` per channel, so the
    background stays black, the strokes take the colour and values stay in
    ``[0, 1]`` for inputs in ``[0, 1]``.

    ``per="sample"`` (default) draws one colour per image: a pure input-space
    change that says nothing about the label. ``per="class"`` draws one colour
    per class, which makes colour a (spurious) label cue. Colours come from
    ``seed`` only, so the same seed tints the same way. The name becomes
    ``"<name>+rgb"`` unless ``name`` is given.
    """
    n, c, _, _ = _check_images(ds, "recolor")
    if c != 1:
        raise ValueError(
            f"recolor: dataset {ds.name!r} must have one channel (N, 1, H, W), "
            f"got input_shape {ds.input_shape}"
        )
    if per not in RECOLOR_PER:
        raise ValueError(f"recolor: per must be one of {', '.join(RECOLOR_PER)}, got {per!r}")
    rng = as_generator(seed)
    colours = rng.uniform(size=(n if per == "sample" else ds.num_classes, 3))  # (M, 3)
    colours /= colours.max(axis=1, keepdims=True)
    if per == "class":
        colours = colours[ds.y]  # (N, 3)
    x = ds.x * colours[:, :, None, None].astype(np.float32)  # (N, 3, H, W)
    return ArrayDataset(x=x, y=ds.y, num_classes=ds.num_classes, classes=ds.classes, name=name or f"{ds.name}+rgb")


def resize(
    ds: ArrayDataset, size: int | tuple[int, int], *, name: str | None = None
) -> ArrayDataset:
    """Resample images to ``size`` (an int for a square, or ``(height, width)``).

    Bilinear (``torch.nn.functional.interpolate``, ``align_corners=False``),
    antialiased when shrinking; every output pixel is a convex combination of
    input pixels, so the value range is kept. The name becomes
    ``"<name>+<H>x<W>"`` unless ``name`` is given.
    """
    _check_images(ds, "resize")
    h, w = _image_size(size)
    x = _resize_array(ds.x, h, w)
    return ArrayDataset(x=x, y=ds.y, num_classes=ds.num_classes, classes=ds.classes, name=name or f"{ds.name}+{h}x{w}")


def flatten(ds: ArrayDataset, *, name: str | None = None) -> ArrayDataset:
    """Samples as flat vectors: ``(N, ...) -> (N, F)``, C-order. Keeps the name by default."""
    x = ds.x.reshape(len(ds), -1)  # (N, F)
    return ArrayDataset(x=x, y=ds.y, num_classes=ds.num_classes, classes=ds.classes, name=name or ds.name)


def _resize_array(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """(N, C, H, W) float32 -> (N, C, h, w) by bilinear resampling."""
    if x.shape[2:] == (h, w):
        return x.copy()
    import torch
    import torch.nn.functional as F

    shrinking = h < x.shape[2] or w < x.shape[3]
    out = F.interpolate(
        torch.from_numpy(np.ascontiguousarray(x)),
        size=(h, w),
        mode="bilinear",
        align_corners=False,
        antialias=shrinking,
    )
    return out.numpy()


def _rotate_array(x: np.ndarray, angle_deg: float) -> np.ndarray:
    """Rotate square images (N, C, S, S) clockwise by ``angle_deg`` about their centre.

    Bilinear sampling with zeros outside the image (``grid_sample``,
    ``align_corners=False``, so pixel centres are symmetric about the centre
    and multiples of 90 degrees map pixels onto pixels). Deterministic on CPU.
    """
    if x.shape[2] != x.shape[3]:
        raise ValueError(f"rotation needs square images, got {x.shape[2]}x{x.shape[3]}")
    if float(angle_deg) % 360.0 == 0.0:
        return x.copy()
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(np.ascontiguousarray(x))
    a = math.radians(float(angle_deg))
    c, s = math.cos(a), math.sin(a)
    # affine_grid maps output (x right, y down) to input coordinates; with y pointing
    # down, sampling at [[c, s], [-s, c]] @ p turns the content clockwise on screen.
    theta = torch.tensor([[c, s, 0.0], [-s, c, 0.0]], dtype=t.dtype).expand(len(t), 2, 3)
    grid = F.affine_grid(theta, list(t.shape), align_corners=False)  # (N, S, S, 2)
    out = F.grid_sample(t, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.numpy()
