"""Settings shared by every algorithm. Torch-free, so config loading stays instant."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class TrainConfig:
    local_epochs: int = field(default=1, metadata={"min": 1, "help": "epochs over the private data per round"})
    batch_size: int = field(default=32, metadata={"min": 1})
    lr: float = field(default=0.05, metadata={"gt": 0})
    optimizer: Literal["sgd", "adam", "amsgrad"] = "sgd"
    momentum: float = field(default=0.9, metadata={"min": 0, "lt": 1})
    weight_decay: float = field(default=0.0, metadata={"min": 0})
    max_batches: int | None = field(
        default=None, metadata={"min": 1, "help": "cap on batches per round (None: whole epochs)"}
    )
