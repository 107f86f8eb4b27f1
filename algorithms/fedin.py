"""``fedin``: Federated Intermediate Layers learning (Chan, Jiang, Deng, Ngai,
"FedIN: Federated Intermediate Layers Learning for Model Heterogeneity").

Every model is extractor -> intermediate layers -> classifier (``sresnet``:
``features.extractor``, ``features.intermediate``, ``head``). With
``s_in = extractor(x)`` (eq. 5) and ``s_out = intermediate(s_in)`` (eq. 6, the
classifier's input, eq. 7), per round peer k:

1. trains locally on the private data with eq. 4,
   ``CE(f(x; w_k), y) + mu/2 ||w_k - w_k^{t-1}||^2`` (FedProx's term,
   :class:`hfl.algorithms.fedprox.FedProx`; ``w^{t-1}`` = the weights as the
   round began) and, from the second round, IN training on the batch ``S``
   received last round: ``MSE(intermediate(s_in^c), s_out^c)`` (eq. 8). The
   intermediate layers' gradient is reshaped at every step (gradient
   alleviation, sec. 4.2), ``alleviation``:
   - ``qp`` (default): ``G_local + Z`` with Z the closed form of eq. 13,
     ``Z = G_IN`` if ``b = <G_local, G_IN> >= 0`` else ``G_IN - (b/a) G_local``,
     ``a = ||G_local||^2`` — the solution of the QP of eq. 10, computed by the
     same :func:`hfl.algorithms.projection.project` FedH2L uses;
   - ``simplified``: eq. 14, ``G_IN + lambda/2 G_local`` (``lam``, 1 in the paper);
   - ``none`` (the "w/o Opt" ablation): ``G_local + G_IN``.
   Extractor and classifier take ``G_local`` as they are;
2. sends its weights plus one batch of (s_in, s_out) (``feature_batch``, 16)
   computed on private samples with the weights it ends the round with;
3. the elected aggregator averages the weights layer-wise (``aggregation``:
   ``layerwise``, InclusiveFL's; ``same_arch``: Table V's identical-architecture
   mean; ``model``: plain FedAvg; ``robust``: a robust rule instead of the mean,
   per array over its holders, docs/robust.md), adds the features to its feature store,
   samples one batch S from it (Algorithm 1, lines 3-6) and returns (w_bar, S);
4. every peer loads what fits its model from w_bar and keeps S for step 1.

The feature store is kept by *every* peer, not only the aggregator: a peer
stores its own batches, the contributions it aggregates and every S it
receives, bounded to ``store_size`` rows (oldest out first), each row keyed
by its origin (peer, round, row) so a row seen twice is stored once. Whoever
the rotation elects next samples from its own store plus the round's
contributions; an aggregator that dies takes nothing with it, and a round
without a result keeps last round's S. The store is checkpointed.

Ablations: ``in_training: false`` (w/o IN; no features leave the peer),
``mu: 0`` (w/o Prox), ``alleviation: none`` (w/o Opt). Privacy: one batch of
intermediate features of private samples leaves the peer each round.
Deviations and measurements: docs/fedin.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hfl.algorithms.base import Payload
from hfl.algorithms.fedavg import AGGREGATION_HELP
from hfl.algorithms.fedprox import FedProx
from hfl.algorithms.payload import beyond_scale, top_abs
from hfl.algorithms.projection import flat_grads, flatten, project, write_grads
from hfl.algorithms.registry import register
from hfl.algorithms.robust import UpdateRobustOptions

log = logging.getLogger("hfl.algorithms")

S_IN, S_OUT = "@s_in", "@s_out"  # payload keys of the feature batch (no state-dict name starts with @)
#: A member's feature batch whose largest |value| is over this many times this peer's own
#: (+1) is refused: the same layer of another architecture on other data is of the same
#: order; 1e19 is an attack (features_unfit)
FEATURE_SCALE_LIMIT = 1e3


@dataclass(frozen=True)
class FedINConfig(UpdateRobustOptions):
    weighted: bool = field(default=True, metadata={"help": "sample-count weighted mean of each layer"})
    mu: float = field(default=0.1, metadata={"min": 0, "help": "proximal weight of eq. 4 (paper: mu/2 = 0.05); 0 = w/o Prox"})
    aggregation: Literal["layerwise", "same_arch", "model"] = field(
        default="layerwise", metadata={"help": AGGREGATION_HELP}
    )
    feature_batch: int = field(
        default=16, metadata={"min": 1, "max": 4096, "help": "(s_in, s_out) rows a peer sends and S holds"}
    )
    store_size: int = field(
        default=512, metadata={"min": 1, "help": "rows of (s_in, s_out) each peer keeps (oldest out first)"}
    )
    in_training: bool = field(default=True, metadata={"help": "IN training on S (eq. 8); false = w/o IN"})
    alleviation: Literal["qp", "simplified", "none"] = field(
        default="qp", metadata={"help": "qp: eq. 13 closed form; simplified: eq. 14; none: w/o Opt"}
    )
    lam: float = field(default=1.0, metadata={"min": 0, "help": "lambda of eq. 14 (alleviation: simplified)"})


Origin = tuple[str, int, int]  # (peer whose private samples produced the row, round, row)


@register
class FedIN(FedProx):
    name = "fedin"
    Config = FedINConfig
    aggregate_is_pure = False  # its aggregate fills the feature store and draws from it

    def __init__(self, ctx, cfg=None):
        super().__init__(ctx, cfg)
        body = self.model.features
        if not (isinstance(getattr(body, "extractor", None), nn.Module)
                and isinstance(getattr(body, "intermediate", None), nn.Module)):
            raise ValueError(
                f"fedin needs a model split into extractor and intermediate layers; model.arch "
                f"{getattr(self.model, 'arch', '?')!r} is not (allowed: sresnet)"
            )
        self.extractor: nn.Module = body.extractor
        self.intermediate: nn.Module = body.intermediate
        self.in_params = [p for p in self.intermediate.parameters() if p.requires_grad]
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():  # this model's (s_in, s_out) shapes, without the batch dim
            x = torch.from_numpy(np.ascontiguousarray(ctx.train.x[:2])).to(ctx.device)
            s_in = self.extractor(x)
            self.s_shapes = (tuple(s_in.shape[1:]), tuple(self.intermediate(s_in).shape[1:]))
        self.model.train(was_training)
        self._feat_gen = torch.Generator().manual_seed(ctx.seed + 2)  # which samples become features
        self._sample_gen = torch.Generator().manual_seed(ctx.seed + 3)  # S drawn from the store
        self.store: dict[Origin, tuple[np.ndarray, np.ndarray]] = {}  # insertion order = age
        self.S: tuple[np.ndarray, np.ndarray] | None = None  # the batch IN training uses
        self._stats = self._zero_stats()
        # The largest |value| of this peer's own last feature batch, per tensor: what a
        # member's batch is measured against (features_unfit)
        self._own_scale: dict[str, float] = {}

    @staticmethod
    def _zero_stats() -> dict[str, float]:
        return {"in_loss": 0.0, "projected": 0.0, "cos_in_local": 0.0, "steps": 0.0}

    def shared(self) -> nn.Module:
        return self.model

    # ------------------------------------------------------------------ local + IN training

    def local_update(self, round: int) -> dict[str, float]:
        self._stats = self._zero_stats()
        metrics = super().local_update(round)
        n = self._stats.pop("steps")
        if n:
            metrics.update({k: v / n for k, v in self._stats.items()})
        return metrics

    def before_step_hook(self, round: int) -> Callable[[], None] | None:
        if not self.cfg.in_training or self.S is None:
            return None
        device = self.ctx.device
        s_in = torch.from_numpy(self.S[0]).to(device)  # (B, *s_in)
        s_out = torch.from_numpy(self.S[1]).to(device)  # (B, *s_out)
        params = self.in_params

        def alleviate() -> None:
            l_in = nn.functional.mse_loss(self.intermediate(s_in), s_out)  # eq. 8
            if not torch.isfinite(l_in):  # never a NaN step from S: the local gradient alone
                return
            g_in = flatten(g if g is not None else torch.zeros_like(p) for g, p in zip(
                torch.autograd.grad(l_in, params, allow_unused=True), params, strict=True))
            g_loc = flat_grads(params)  # grad of eq. 4 on this batch, intermediate layers only
            if self.cfg.alleviation == "qp":
                z, projected = project(g_in, g_loc)  # eq. 13
                g = g_loc + z
            elif self.cfg.alleviation == "simplified":
                g, projected = g_in + self.cfg.lam / 2 * g_loc, False  # eq. 14
            else:
                g, projected = g_loc + g_in, False
            write_grads(params, g)
            st = self._stats
            st["in_loss"] += float(l_in.detach())
            st["projected"] += float(projected)
            st["cos_in_local"] += float(nn.functional.cosine_similarity(g_in, g_loc, dim=0, eps=1e-12))
            st["steps"] += 1

        return alleviate

    # ------------------------------------------------------------------ what leaves a peer

    @torch.no_grad()
    def features_of(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(s_in, s_out) of samples ``x`` under the current weights (eval mode)."""
        self.model.eval()
        s_in = self.extractor(torch.from_numpy(np.ascontiguousarray(x)).to(self.ctx.device))
        s_out = self.intermediate(s_in)
        return s_in.cpu().numpy(), s_out.cpu().numpy()

    def share(self, round: int) -> Payload:
        payload = super().share(round)
        if not self.cfg.in_training:
            return payload
        train = self.ctx.train
        idx = torch.randperm(len(train), generator=self._feat_gen)[: self.cfg.feature_batch]
        s_in, s_out = self.features_of(train.x[idx.sort().values.numpy()])
        self._own_scale = {S_IN: top_abs(s_in), S_OUT: top_abs(s_out)}
        self._store_add([(self.ctx.peer_id, round, i) for i in range(len(s_in))], s_in, s_out)
        return Payload(kind=payload.kind, tensors={**payload.tensors, S_IN: s_in, S_OUT: s_out},
                       meta=payload.meta)

    # ------------------------------------------------------------------ the aggregator

    def aggregate(self, round: int, contributions: dict[str, Payload]) -> Payload | None:
        weights, features = {}, {}
        for peer, c in contributions.items():
            t = dict(c.tensors)
            features[peer] = (t.pop(S_IN, None), t.pop(S_OUT, None))
            weights[peer] = Payload(kind=c.kind, tensors=t, meta=c.meta)
        result = super().aggregate(round, weights)
        if result is None:
            return None
        left_out = []
        for peer in sorted(features):
            s_in, s_out = features[peer]
            if peer in result.meta.get("excluded", ()) or (s_in is None and s_out is None):
                continue
            why = self.features_unfit(s_in, s_out)
            if why is not None:  # the weights may still count; the features do not
                log.warning("%s: round %d: features of %s left out: %s", self.ctx.peer_id, round, peer, why)
                left_out.append(peer)
                continue
            self._store_add([(peer, round, i) for i in range(len(s_in))], s_in, s_out)
        meta = {**result.meta, "features_excluded": left_out}
        if not self.cfg.in_training or not self.store:
            return Payload(kind="weights", tensors=result.tensors, meta=meta)
        origins = list(self.store)
        pick = torch.randperm(len(origins), generator=self._sample_gen)[: self.cfg.feature_batch].tolist()
        chosen = [origins[i] for i in pick]
        s_in = np.stack([self.store[o][0] for o in chosen])
        s_out = np.stack([self.store[o][1] for o in chosen])
        meta["s_origin"] = [list(o) for o in chosen]
        return Payload(kind="weights+features", tensors={**result.tensors, S_IN: s_in, S_OUT: s_out},
                       meta=meta)

    def features_unfit(self, s_in: Any, s_out: Any) -> str | None:
        """Why a feature batch cannot train this model's intermediate layers, or None."""
        for name, a, shape in ((S_IN, s_in, self.s_shapes[0]), (S_OUT, s_out, self.s_shapes[1])):
            if not isinstance(a, np.ndarray) or a.dtype != np.float32:
                return f"{name}: expected a float32 array"
            if tuple(a.shape[1:]) != shape:
                return f"{name}: shape {list(a.shape)}, expected [B, {', '.join(map(str, shape))}]"
            if not np.isfinite(a).all():
                return f"{name}: non-finite values"
            # (rows of 1e19, finite float32, made the next step's in_loss and the model
            # NaN, under robust rules too: an attack review)
            why = beyond_scale(name, top_abs(a), self._own_scale.get(name),
                               FEATURE_SCALE_LIMIT)
            if why is not None:
                return why
        if not 1 <= len(s_in) <= self.cfg.feature_batch or len(s_in) != len(s_out):
            return (f"{len(s_in)} s_in rows and {len(s_out)} s_out rows; expected the same "
                    f"number, 1..{self.cfg.feature_batch}")
        return None

    def _store_add(self, origins: list[Origin], s_in: np.ndarray, s_out: np.ndarray) -> None:
        for o, a, b in zip(origins, s_in, s_out, strict=True):
            if o not in self.store:
                self.store[o] = (np.array(a), np.array(b))
        while len(self.store) > self.cfg.store_size:
            del self.store[next(iter(self.store))]

    # ------------------------------------------------------------------ every peer

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        if not received:
            return {"absorbed": 0.0}
        (sender, result), = received.items()
        t = dict(result.tensors)
        s_in, s_out = t.pop(S_IN, None), t.pop(S_OUT, None)
        metrics = super().absorb(round, {sender: Payload(kind=result.kind, tensors=t, meta=result.meta)})
        if not metrics.get("absorbed") or (s_in is None and s_out is None) or not self.cfg.in_training:
            return metrics
        why = self.features_unfit(s_in, s_out)
        if why is not None:
            log.warning("%s: round %d: S from %s refused: %s", self.ctx.peer_id, round, sender, why)
            return metrics
        self.S = (np.array(s_in), np.array(s_out))
        origin = result.meta.get("s_origin")
        if not (isinstance(origin, list) and len(origin) == len(s_in) and all(
                isinstance(o, (list, tuple)) and len(o) == 3 and isinstance(o[0], str)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in o[1:]) for o in origin)):
            origin = [(f"S@{sender}", round, i) for i in range(len(s_in))]
        self._store_add([(o[0], o[1], o[2]) for o in origin], self.S[0], self.S[1])
        metrics["s_owners"] = float(len({o[0] for o in origin}))
        return metrics

    def handshake_info(self) -> dict[str, int]:
        return {"embedding_dim": int(self.model.embedding_dim)}  # s_out's width

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        origins = list(self.store)
        return {
            **super().state_dict(),
            "feat_gen": self._feat_gen.get_state(),
            "sample_gen": self._sample_gen.get_state(),
            "store_origins": [list(o) for o in origins],
            "store_s_in": torch.from_numpy(np.stack([self.store[o][0] for o in origins])) if origins else None,
            "store_s_out": torch.from_numpy(np.stack([self.store[o][1] for o in origins])) if origins else None,
            "S": None if self.S is None else [torch.from_numpy(self.S[0]), torch.from_numpy(self.S[1])],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._feat_gen.set_state(state["feat_gen"])
        self._sample_gen.set_state(state["sample_gen"])
        self.store = {}
        if state["store_origins"]:
            s_in, s_out = state["store_s_in"].numpy(), state["store_s_out"].numpy()
            for o, a, b in zip(state["store_origins"], s_in, s_out, strict=True):
                self.store[(str(o[0]), int(o[1]), int(o[2]))] = (a.copy(), b.copy())
        self.S = None if state["S"] is None else (state["S"][0].numpy().copy(), state["S"][1].numpy().copy())
