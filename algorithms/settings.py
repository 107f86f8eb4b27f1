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


@dataclass(frozen=True)
class SelectionConfig:
    """Model selection: which data the peer judges its models on each round, and which
    of equally good rounds it keeps. The kept model's test metrics are reported as
    ``sel_*`` beside the final model's."""

    on: Literal["val", "val+public", "val+public+private"] = field(
        default="val",
        metadata={"help": "the peer's own splits pooled for selection (FedH2L: its validation split)"},
    )
    keep: Literal["first", "last"] = field(
        default="first", metadata={"help": "of rounds tied on the selection accuracy, keep the earliest or the latest"}
    )
