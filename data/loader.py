"""Turning an ArrayDataset into a seeded torch DataLoader (torch is imported lazily)."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

from .dataset import ArrayDataset

if TYPE_CHECKING:
    from torch.utils.data import DataLoader


def make_loader(
    ds: ArrayDataset,
    batch_size: int,
    shuffle: bool,
    seed: int,
    *,
    drop_last: bool = False,
) -> DataLoader:
    """A single-process DataLoader yielding ``(x, y)`` as float32 / int64 tensors.

    The shuffle order comes from a ``torch.Generator`` seeded with ``seed``, so
    the same seed gives the same batches; the tensors share memory with ``ds``.
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an int, got {seed!r}")
    generator = torch.Generator()
    generator.manual_seed(int(seed))
    tensors = TensorDataset(torch.from_numpy(ds.x), torch.from_numpy(ds.y))
    return DataLoader(
        tensors,
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        num_workers=0,
        drop_last=drop_last,
    )
