"""``fedprox``: FedProx (Li et al., "Federated Optimization in Heterogeneous
Networks", MLSys 2020), eq. 2: each peer minimises its local loss plus the
proximal term ``mu / 2 * ||w - w^t||^2`` on the shared part, where ``w^t`` is
the last global model: the aggregate it absorbed last (the common
initialisation before the first). With ``cohort.communicate_every: k`` the k
rounds between two exchanges are all local steps toward the same ``w^t``, as
the paper's E local epochs are; a round whose result did not come keeps the
``w^t`` it had. Aggregation is FedAvg's weighted mean on the elected aggregator.

``part: model`` (default) shares and regularises the whole model, as in the
paper (identical architectures); ``part: head`` shares only the E x C head, so
FedProx runs on a cohort of heterogeneous models as a variant of CHFL's AVG.
``aggregation: layerwise`` (or ``same_arch``) averages models of different
depths as FedAvg does (``hfl.algorithms.layerwise``). The robust rules of
FedAvg apply (``robust``, ``clip_update_norm``, ..., docs/robust.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from hfl.algorithms.fedavg import AGGREGATION_HELP, FedAvg
from hfl.algorithms.registry import register
from hfl.algorithms.robust import WEIGHT_SHARE_HELP, UpdateRobustOptions


@dataclass(frozen=True)
class FedProxConfig(UpdateRobustOptions):
    weighted: bool = True
    max_weight_share: float | Literal["equal"] | None = field(default="equal", metadata={
        "gt": 0, "max": 1, "help": WEIGHT_SHARE_HELP})  # as FedAvg: counts untrusted by default
    mu: float = field(default=0.01, metadata={"min": 0, "help": "weight of the proximal term"})
    part: Literal["model", "head"] = field(
        default="model", metadata={"help": "what is shared, averaged and kept close: model or head"}
    )
    aggregation: Literal["model", "layerwise", "same_arch"] = field(
        default="model", metadata={"help": AGGREGATION_HELP}
    )


def proximal_term(params: list[torch.Tensor], anchor: list[torch.Tensor]) -> torch.Tensor:
    """sum_i ||params_i - anchor_i||^2 (anchor fixed)."""
    return sum(((p - a.detach()) ** 2).sum() for p, a in zip(params, anchor, strict=True))


@register
class FedProx(FedAvg):
    name = "fedprox"
    Config = FedProxConfig

    def __init__(self, ctx, cfg=None):
        super().__init__(ctx, cfg)
        self._anchor: list[torch.Tensor] | None = None

    def shared(self) -> nn.Module:
        return self.model.head if self.cfg.part == "head" else self.model

    def _snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.shared().parameters()]

    def local_update(self, round: int) -> dict[str, float]:
        if self._anchor is None:
            self._anchor = self._snapshot()  # w^0: the common initialisation
        return super().local_update(round)

    def absorb(self, round: int, received: dict) -> dict[str, float]:
        out = super().absorb(round, received)
        if out.get("absorbed"):
            self._anchor = self._snapshot()  # w^t: the global model just taken
        return out

    def loss(self, x: torch.Tensor, y: torch.Tensor, round: int) -> torch.Tensor:
        loss = super().loss(x, y, round)
        if self.cfg.mu == 0 or self._anchor is None:
            return loss
        return loss + self.cfg.mu / 2 * proximal_term(list(self.shared().parameters()), self._anchor)
