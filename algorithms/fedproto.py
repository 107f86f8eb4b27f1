"""``fedproto``: FedProto (Tan et al., "FedProto: Federated Prototype Learning
across Heterogeneous Clients", AAAI 2022), the baseline of FedHP's Table 1.

Every peer computes its local prototypes, the per-class mean embedding
``C_j = mean f(x)`` over its private samples of class j (eq. 5), and sends them
with its per-class counts to the round's elected aggregator, which returns the
global prototypes ``C_bar_j = sum_i n_ij C_ij / sum_i n_ij`` (eq. 6; or the
plain mean over the peers holding class j with ``weighted: false``). A peer
trains on ``CE + lam * ||f(x) - C_bar_y||^2`` (eq. 4, MSE per element as in the
reference code) once global prototypes exist. ``inference: nearest`` reports
accuracy by the nearest global prototype (the paper's inference rule); the
linear head's accuracy is kept as ``head_test_acc``.

Only the prototype dimension leaves the peer in the handshake; bodies may
differ in anything else. A contribution with the wrong shapes, non-finite
values or negative weights is left out with a logged reason; a result that
does not fit or names another round is refused.

``robust`` (``hfl.algorithms.robust``, docs/robust.md): the global prototype of
class j is a robust rule (median, trimmed_mean, krum, multi_krum,
geometric_median, or the mean with ``max_weight_share``) over the local
prototypes ``C_ij = r_ij / w_ij`` of the peers holding class j (w_ij >= 0.5),
weighted by w_ij where the rule weighs. A class the rule cannot run on (too few
holders for f) has no global prototype that round, with a logged reason.

The shared machinery (embedding, release, aggregation, absorb, checkpoint)
is reused by FedHP (``hfl.algorithms.fedhp``), which adds a projection head,
the contrastive loss, differential privacy and a secure sum.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hfl.algorithms import prototypes as P
from hfl.algorithms.base import Algorithm, Payload
from hfl.algorithms.payload import beyond_scale, top_abs
from hfl.algorithms.registry import register
from hfl.algorithms.robust import WeightedRobustOptions, combine, is_plain, rule_options
from hfl.algorithms.training import batches

log = logging.getLogger("hfl.algorithms")


@dataclass(frozen=True)
class FedProtoConfig(WeightedRobustOptions):
    lam: float = field(default=1.0, metadata={"min": 0, "help": "weight of the prototype regulariser"})
    weighted: bool = field(
        default=True, metadata={"help": "count-weighted mean of the prototypes (false: plain mean "
                                        "over the peers holding the class)"})
    inference: Literal["head", "nearest"] = field(
        default="head", metadata={"help": "test accuracy from the linear head or the nearest global prototype"})


def check_rows(tensors: dict[str, np.ndarray], k: int, d: int,
               bounds: tuple[float, float] = (0.0, math.inf)) -> str | None:
    """Why ``{"rows": (K, D), "weights": (K,)}`` float32 arrays are unusable, or None;
    ``bounds``: the range an honest release's weights lie in (:meth:`FedProto.weight_bounds`)."""
    if set(tensors) != {"rows", "weights"}:
        return f"arrays {sorted(tensors)}, expected ['rows', 'weights']"
    rows, weights = tensors["rows"], tensors["weights"]
    if rows.dtype != np.float32 or rows.shape != (k, d):
        return f"rows: {rows.dtype}{list(rows.shape)}, expected float32[{k}, {d}]"
    if weights.dtype != np.float32 or weights.shape != (k,):
        return f"weights: {weights.dtype}{list(weights.shape)}, expected float32[{k}]"
    if not (np.isfinite(rows).all() and np.isfinite(weights).all()):
        return "non-finite values"
    lo, hi = bounds
    if (weights < lo).any() or (weights > hi).any():
        bad = weights[(weights < lo) | (weights > hi)]
        return (f"weights {float(bad.min()) if (weights < lo).any() else float(bad.max()):g} "
                f"outside [{lo:g}, {hi:g}], the range of an honest release's")
    return None


@register
class FedProto(Algorithm):
    name = "fedproto"
    mode = "aggregator"
    Config = FedProtoConfig

    def __init__(self, ctx, cfg=None):
        super().__init__(ctx, cfg)
        self.protos: torch.Tensor | None = None  # (K, D) global prototypes
        self.present: torch.Tensor | None = None  # (K,) bool: classes that have one
        self.protos_round = 0  # the round whose releases they were made of
        self._own_scale: float | None = None  # largest |class mean| of its last release
        self._reg_sum, self._reg_batches = 0.0, 0

    # ------------------------------------------------------------- the model's parts

    @property
    def proto_dim(self) -> int:
        return int(self.model.embedding_dim)

    def forward_parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(embedding (B, D) that prototypes average, logits (B, C))."""
        feats = self.model.features(x)
        return feats, self.model.head(feats)

    def regulariser(self, emb: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return P.mse_loss(emb, y, self.protos, self.present)

    def loss(self, x: torch.Tensor, y: torch.Tensor, round: int) -> torch.Tensor:
        emb, logits = self.forward_parts(x)
        loss = nn.functional.cross_entropy(logits, y)
        if self.protos is None or self.cfg.lam == 0:
            return loss  # round 1: no global prototypes yet
        reg = self.regulariser(emb, y)
        self._reg_sum += float(reg.detach())
        self._reg_batches += 1
        return loss + self.cfg.lam * reg

    def local_update(self, round: int) -> dict[str, float]:
        self._reg_sum, self._reg_batches = 0.0, 0
        metrics = super().local_update(round)
        if self._reg_batches:
            metrics["proto_loss"] = self._reg_sum / self._reg_batches
        return metrics

    # ------------------------------------------------------------- prototypes

    @torch.no_grad()
    def class_sums(self, clip_norm: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(sums (K, D), counts (K,)) of this peer's private embeddings, float64."""
        self.model.eval()
        k, d = self.ctx.num_classes, self.proto_dim
        sums = torch.zeros(k, d, dtype=torch.float64, device=self.ctx.device)
        counts = torch.zeros(k, dtype=torch.float64, device=self.ctx.device)
        for x, y in batches(self.ctx.train, 512, None, shuffle=False):
            x, y = x.to(self.ctx.device), y.to(self.ctx.device)
            emb = self.forward_parts(x)[0].double()
            s, c = P.class_sums(emb, y, k, clip_norm)
            sums += s
            counts += c
        return sums, counts

    def release(self, round: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows (K, D), weights (K,)) this peer adds into the cohort's sum, or None."""
        return P.release_rows(*self.class_sums(), self.cfg.weighted)

    def share(self, round: int) -> Payload | None:
        rel = self.release(round)
        if rel is None:
            return None
        rows, weights = rel
        self.note_own_scale(rows, weights)
        return Payload(kind="prototypes", tensors={
            "rows": rows.float().cpu().numpy(), "weights": weights.float().cpu().numpy()},
            meta={"round": round})

    def note_own_scale(self, rows: torch.Tensor, weights: torch.Tensor) -> None:
        """Keep the largest |class mean| of this peer's own release: what members' class
        means and the global prototypes are bounded by (payload.beyond_scale)."""
        self._own_scale = float((rows.abs() / weights.abs().clamp(min=1.0)[:, None]).max())

    def aggregate(self, round: int, contributions: dict[str, Payload]) -> Payload | None:
        k, d = self.ctx.num_classes, self.proto_dim
        r_sum = np.zeros((k, d), dtype=np.float64)
        w_sum = np.zeros(k, dtype=np.float64)
        used, excluded = [], []
        for peer, c in sorted(contributions.items()):
            why = check_rows(c.tensors, k, d, self.weight_bounds)
            if why is None and c.meta.get("round", round) != round:
                why = f"it is of round {c.meta.get('round')!r}"
            if why is None:  # (rows of 3e38 at weight 0)
                means = np.abs(c.tensors["rows"]) / np.maximum(np.abs(c.tensors["weights"]), 1.0)[:, None]
                why = beyond_scale("class means", top_abs(means), self._own_scale)
            if why is not None:
                log.warning("%s: round %d: contribution of %s left out: %s",
                            self.ctx.peer_id, round, peer, why)
                excluded.append(peer)
                continue
            r_sum += c.tensors["rows"]
            w_sum += c.tensors["weights"]
            used.append(peer)
        if not used:
            return None
        meta = {"round": round, "protos_round": round, "contributors": used, "excluded": excluded}
        options = rule_options(self.cfg)
        # max_weight_share: equal: each holder's class mean counts once, whatever count it
        # claims (the plain sum weighed claimed counts: one member's 1e6 took every class,
        # accuracy 0.81 -> 0.16, without a word; an attack review)
        equal = getattr(self.cfg, "max_weight_share", None) == "equal"
        if is_plain(options) and not equal:
            protos, present = P.global_prototypes(torch.from_numpy(r_sum), torch.from_numpy(w_sum))
            protos, present = protos.float().numpy(), present.numpy()
        else:
            robust_protos = self.robust_prototypes(round, {p: contributions[p].tensors for p in used},
                                                   options, meta, equal)
            if robust_protos is None:
                return None
            protos, present = robust_protos
        return Payload(kind="prototypes", tensors={"protos": protos, "present": present}, meta=meta)

    def robust_prototypes(self, round: int, releases: dict[str, dict[str, np.ndarray]],
                          options: dict, meta: dict, equal: bool = False
                          ) -> tuple[np.ndarray, np.ndarray] | None:
        """(protos float32 (K, D), present bool (K,)): per class, the rule over the local
        prototypes of its holders (weighed by their counts, or ``equal``ly); None, with a
        logged reason, if no class has one."""
        k, d = self.ctx.num_classes, self.proto_dim
        protos, present = np.zeros((k, d), dtype=np.float32), np.zeros(k, dtype=bool)
        skipped = {}
        for j in range(k):
            holders = [p for p in sorted(releases) if releases[p]["weights"][j] >= 0.5]
            if not holders:
                continue
            local = {p: {"proto": releases[p]["rows"][j].astype(np.float64)
                         / float(releases[p]["weights"][j])} for p in holders}  # (D,) each
            try:
                out, _ = combine(local, {p: 1.0 if equal else float(releases[p]["weights"][j])
                                         for p in holders}, **options)
            except ValueError as exc:
                skipped[j] = str(exc)
                continue
            protos[j], present[j] = out["proto"], True
        meta["robust"] = options["rule"]
        if skipped:
            log.warning("%s: round %d: no global prototype this round for classes %s: %s",
                        self.ctx.peer_id, round, sorted(skipped), next(iter(skipped.values())))
            meta["no_prototype"] = sorted(skipped)
        if not present.any():
            log.warning("%s: round %d: no aggregate this round: %s ran on no class",
                        self.ctx.peer_id, round, options["rule"])
            return None
        return protos, present

    @property
    def weight_bounds(self) -> tuple[float, float]:
        """The range of an honest release's weights: counts (weighted), or 1 where a
        class is held (``weighted: false``: a member's claimed weight of 1e6 outweighed
        every honest class mean, an attack review)."""
        return (0.0, math.inf if self.cfg.weighted else 1.0)

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        if not received:
            return {"absorbed": 0.0}
        (sender, result), = received.items()
        why = self.check_result(round, result)
        if why is None and "protos" in result.tensors:
            why = self.take_prototypes(result)
        if why is not None:
            log.warning("%s: round %d: result from %s refused: %s", self.ctx.peer_id, round, sender, why)
            return {"absorbed": 0.0}
        return {"absorbed": 1.0, "protos_round": float(self.protos_round)}

    def check_result(self, round: int, result: Payload) -> str | None:
        if result.meta.get("round") != round:
            return f"it is the result of round {result.meta.get('round')!r}"
        return None

    def take_prototypes(self, result: Payload) -> str | None:
        """Load the result's global prototypes; why not, if they do not fit."""
        k, d = self.ctx.num_classes, self.proto_dim
        protos, present = result.tensors.get("protos"), result.tensors.get("present")
        if protos is None or present is None:
            return "no prototypes in it"
        if protos.dtype != np.float32 or protos.shape != (k, d) or not np.isfinite(protos).all():
            return f"protos: {protos.dtype}{list(protos.shape)}, expected finite float32[{k}, {d}]"
        if present.dtype != np.bool_ or present.shape != (k,):
            return f"present: {present.dtype}{list(present.shape)}, expected bool[{k}]"
        # (a member's rows of 3e38 with weight 0 made prototypes of 8e36, finite, and the
        # next step NaN: an attack review)
        why = beyond_scale("protos", top_abs(protos), self._own_scale)
        if why is not None:
            return why
        of_round = result.meta.get("protos_round")
        if isinstance(of_round, bool) or not isinstance(of_round, int):
            return f"protos_round must be an int, got {of_round!r}"
        if not present.any():
            return "no class has a prototype"
        self.protos = torch.from_numpy(np.array(protos)).to(self.ctx.device)
        self.present = torch.from_numpy(np.array(present)).to(self.ctx.device)
        self.protos_round = of_round
        return None

    # ------------------------------------------------------------- evaluation

    def evaluate(self) -> dict[str, float]:
        metrics = super().evaluate()
        if self.cfg.inference == "nearest" and self.protos is not None:
            for key, ds in [("test", self.ctx.test), *self.ctx.extra_tests.items()]:
                metrics[f"head_{key}_acc"] = metrics[f"{key}_acc"]
                metrics[f"{key}_acc"] = self.nearest_accuracy(ds)
        return metrics

    @torch.no_grad()
    def nearest_accuracy(self, ds) -> float:
        if ds is None or len(ds) == 0:
            return math.nan
        self.model.eval()
        correct = 0
        for x, y in batches(ds, 512, None, shuffle=False):
            emb = self.forward_parts(x.to(self.ctx.device))[0]
            pred = P.nearest_prototype(emb, self.protos.to(emb.dtype), self.present)
            correct += int((pred.cpu() == y).sum())
        return correct / len(ds)

    def handshake_info(self) -> dict[str, int]:
        return {"proto_dim": self.proto_dim}

    def aggregates_everywhere_by_default(self) -> bool:
        return self.why_not_everywhere() is None  # K x D prototypes: small

    # ------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.protos is not None:
            state.update(protos=self.protos.cpu(), present=self.present.cpu(),
                         protos_round=self.protos_round)
        if self._own_scale is not None:  # (a resumed peer that releases no more keeps its bound)
            state["own_scale"] = self._own_scale
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "protos" in state:
            self.protos = state["protos"].to(self.ctx.device)
            self.present = state["present"].to(self.ctx.device)
            self.protos_round = int(state["protos_round"])
        if isinstance(state.get("own_scale"), float):
            self._own_scale = state["own_scale"]
