"""Completely heterogeneous FL (Liu, Yang, Cai, Ding, Lu, "Completely
heterogeneous federated learning"): peers differ in feature space, model
architecture and label distribution, and agree only on the label set (C
classes, eq. 3's Assumption 1) and the embedding length E (Assumption 2).

Every model is ``head(features(x))`` with a private body ``features: x -> (B, E)``
and a head ``E x C``; only head weights ever leave a peer, and the handshake
reveals E (C travels in every hello). Three methods share the head through the
round's elected aggregator:

- ``avg`` — the parameter-decoupling baseline (the paper's AVG): the aggregator
  returns the mean head, which every peer loads into its local head;
- ``chfl`` — the paper's method (Algorithm 1): the mean head becomes a *global*
  head h_bar kept beside the local head h_k, and from the second round the
  local loss is eq. 5,
  ``CE(h_k(f(x)), y) + alpha * DKD(h_k(f(x)), h_bar(f(x)), T)``,
  with h_bar a fixed teacher within the round, DKD as in eq. 6
  (:func:`hfl.algorithms.dkd.dkd_loss`) and T from eq. 7,
  ``T = beta (1 + cos(pi t / T_max)) + 1`` with t the round and T_max the
  cohort's rounds;
- ``avgkd`` — both at once (the paper's AVGKD): load the mean head into the
  local head *and* distil from it.

Deviation: eq. 4 writes the aggregate as a sum of the heads; a sum of K heads
scales every logit by about K, so (as the paper's "average weight" wording and
its code base suggest) the aggregate here is the mean, sample-count weighted
by default (``weighted: false`` for the plain mean). ``robust`` and the other
options of ``hfl.algorithms.robust`` replace that mean by a robust rule
(docs/robust.md); ``chfl`` clips updates from the previous global head.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from hfl.algorithms.dkd import chfl_temperature, dkd_loss
from hfl.algorithms.fedavg import FedAvg, FedAvgConfig
from hfl.algorithms.registry import register
from hfl.algorithms.robust import WEIGHT_SHARE_HELP, UpdateRobustOptions


@dataclass(frozen=True)
class HeadKDConfig(UpdateRobustOptions):
    weighted: bool = field(default=True, metadata={"help": "sample-count weighted mean of the heads"})
    alpha: float = field(default=0.5, metadata={"min": 0, "help": "weight of the DKD term (eq. 5)"})
    beta: float = field(default=5.0, metadata={"min": 0, "help": "temperature schedule (eq. 7)"})
    max_epoch: int | None = field(
        default=None, metadata={"min": 1, "help": "T_max of eq. 7 (default: the cohort's rounds)"}
    )
    t_squared: bool = field(
        default=True, metadata={"help": "scale DKD by T^2 as Zhao et al.'s reference code does"}
    )
    teacher_max_age: int = field(
        default=1, metadata={"min": 1, "help": "distil only from a global head at most this many "
                                               "rounds old (1: the previous round's, else no KD)"}
    )


@dataclass(frozen=True)
class HeadAvgConfig(FedAvgConfig):
    """FedAvg's options; the heads' mean weighs claimed counts, as the CHFL paper's AVG
    baseline (``max_weight_share: equal`` to weigh every head the same)."""

    max_weight_share: float | Literal["equal"] | None = field(default=None, metadata={
        "gt": 0, "max": 1, "help": WEIGHT_SHARE_HELP})


@register
class HeadAvg(FedAvg):
    """``avg``: the mean head replaces every peer's local head each round."""

    name = "avg"
    Config = HeadAvgConfig

    def shared(self) -> nn.Module:
        return self.model.head  # (C, E) weight and (C,) bias: E x C, nothing else

    def aggregates_everywhere_by_default(self) -> bool:
        return True  # a head is small


@register
class AvgKD(HeadAvg):
    """``avgkd``: load the mean head and distil from it (eq. 5) within the round."""

    name = "avgkd"
    Config = HeadKDConfig

    def __init__(self, ctx, cfg=None):
        super().__init__(ctx, cfg)
        self.teacher: nn.Linear | None = None  # the global head h_bar, once one arrived
        self.teacher_round = 0  # the round whose aggregate it is
        self._kd_sum, self._kd_batches = 0.0, 0

    def temperature(self, round: int) -> float:
        return chfl_temperature(round, self.cfg.max_epoch or self.ctx.rounds, self.cfg.beta)

    def distils(self, round: int) -> bool:
        """KD needs a global head, and a fresh one: a peer that missed the last
        aggregate (or resumed from an old checkpoint) trains on CE alone."""
        return (self.teacher is not None and self.cfg.alpha > 0
                and round - self.teacher_round <= self.cfg.teacher_max_age)

    def loss(self, x: torch.Tensor, y: torch.Tensor, round: int) -> torch.Tensor:
        feats = self.model.features(x)  # (B, E)
        logits = self.model.head(feats)  # (B, C)
        loss = nn.functional.cross_entropy(logits, y)
        if not self.distils(round):
            return loss  # round 1: no global head yet (Algorithm 1, line 10)
        with torch.no_grad():
            teacher_logits = self.teacher(feats.detach())  # (B, C): a fixed signal
        kd = dkd_loss(logits, teacher_logits, y, self.temperature(round),
                      t_squared=self.cfg.t_squared)
        self._kd_sum += float(kd.detach())
        self._kd_batches += 1
        return loss + self.cfg.alpha * kd

    def local_update(self, round: int) -> dict[str, float]:
        self._kd_sum, self._kd_batches = 0.0, 0
        metrics = super().local_update(round)
        if self._kd_batches:
            metrics.update(dkd_loss=self._kd_sum / self._kd_batches,
                           temperature=self.temperature(round), teacher_round=self.teacher_round)
        return metrics

    def absorb(self, round: int, received) -> dict[str, float]:
        metrics = super().absorb(round, received)  # into target(): the local head here
        if metrics.get("absorbed"):
            if self.teacher is None:
                self.teacher = self._new_teacher()
            if self.target() is not self.teacher:
                self.teacher.load_state_dict(self.target().state_dict())
            self.teacher_round = round
        return metrics

    def _new_teacher(self) -> nn.Linear:
        teacher = copy.deepcopy(self.model.head)
        teacher.requires_grad_(False)
        return teacher

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.teacher is not None:
            state["teacher"] = self.teacher.state_dict()
            state["teacher_round"] = self.teacher_round
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "teacher" in state:
            self.teacher = self._new_teacher()
            self.teacher.load_state_dict(state["teacher"])
            self.teacher_round = int(state["teacher_round"])


@register
class CHFL(AvgKD):
    """``chfl``: the mean head is only a teacher; the local head stays the peer's own."""

    name = "chfl"

    def target(self) -> nn.Module:
        if self.teacher is None:
            self.teacher = self._new_teacher()
        return self.teacher

    def update_reference(self):
        """The previous global head (the local heads are the peers' own, not the aggregate)."""
        if self.teacher is None:
            return super().update_reference()
        return {k: v.detach().cpu().numpy().copy() for k, v in self.teacher.state_dict().items()}
