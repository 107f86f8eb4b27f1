"""Checkpoints: written atomically every round, loaded without unpickling code.

``torch.load(weights_only=True)`` only rebuilds tensors and plain containers, so
a tampered checkpoint file cannot run code when a peer resumes from it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CHECKPOINT_NAME = "checkpoint.pt"
INCARNATION_NAME = "incarnation"


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    import torch

    path = Path(run_dir) / CHECKPOINT_NAME
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-write leaves the previous checkpoint
    return path


def load_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    import torch

    path = Path(run_dir) / CHECKPOINT_NAME
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def next_incarnation(run_dir: str | Path) -> int:
    """Bump and persist the incarnation number: one per process start."""
    path = Path(run_dir) / INCARNATION_NAME
    try:
        previous = int(path.read_text().strip())
    except (OSError, ValueError):
        previous = -1
    incarnation = previous + 1
    path.write_text(f"{incarnation}\n")
    return incarnation
