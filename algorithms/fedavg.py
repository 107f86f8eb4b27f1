"""``fedavg``: federated averaging (McMahan et al., AISTATS 2017, Algorithm 1).

Every peer trains locally, sends the state of its *shared part* to the round's
elected aggregator, which returns the sample-count-weighted mean
``w = sum_k n_k w_k / sum_k n_k``; every peer then loads it. For ``fedavg``
the shared part is the whole model (identical architectures: the handshake
checks the parameter count); subclasses share less by overriding
:meth:`FedAvg.shared` (CHFL's AVG shares only the head, ``hfl.algorithms.chfl``).

A contribution whose arrays do not match this peer's own shared part (names,
shapes, dtypes), holds a non-finite value or claims an invalid sample count is
left out of the mean with a logged reason, and so is a result that does not
fit or belongs to another round: a mis-configured or hostile peer cannot
poison the average or crash the aggregator.

``aggregation: layerwise`` averages each named array over the peers that hold
it (models of different depths, InclusiveFL-style) and ``aggregation:
same_arch`` only identical architectures (``hfl.algorithms.layerwise``); a
contribution is then checked on its own (numeric, finite), not against the
aggregator's shapes, and each peer loads the entries that fit its model.

``robust`` (``hfl.algorithms.robust``, docs/robust.md) replaces the mean by a
rule a few malicious contributions cannot steer (median, trimmed_mean, krum,
multi_krum, geometric_median), optionally after clipping each contribution's
update from the model the round started from (``clip_update_norm``) and capping
any contribution's share of the weight (``max_weight_share``); with
``aggregation: layerwise`` the rule runs per named array over its holders.
A rule that cannot run for the contributions that arrived (Krum needs n > 2f + 2)
produces no aggregate that round, with a logged reason naming the rule, n and f.
The defaults are the weighted mean, exactly as without these options.

A state of more than 32 arrays (a ResNet's) travels packed, one flat array
per dtype plus its layout (``hfl.algorithms.packing``): the wire allows 64
frames a message.
"""

from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from torch import nn

from hfl.algorithms import layerwise, robust
from hfl.algorithms.base import Algorithm, Payload, arrays_to_module, module_to_arrays
from hfl.algorithms.packing import pack_if_many, unpack_if_packed
from hfl.algorithms.payload import beyond_scale, top_abs
from hfl.algorithms.registry import register

log = logging.getLogger("hfl.algorithms")


AGGREGATION_HELP = ("model: identical models, whole-model mean; layerwise: each named array over "
                    "the peers holding it (different depths); same_arch: only identical architectures")


@dataclass(frozen=True)
class FedAvgConfig(robust.UpdateRobustOptions):
    weighted: bool = True  # weight by sample count (False: plain mean)
    # Safe by default (issue 35): a claimed count buys nothing until the cohort says it
    # trusts its members' counts (null, or a cap in (0, 1]).
    max_weight_share: float | Literal["equal"] | None = field(default="equal", metadata={
        "gt": 0, "max": 1, "help": robust.WEIGHT_SHARE_HELP})
    aggregation: Literal["model", "layerwise", "same_arch"] = field(
        default="model", metadata={"help": AGGREGATION_HELP}
    )


def weighted_mean(contributions: dict[str, Payload], weighted: bool) -> dict[str, np.ndarray]:
    """Mean of each named array over contributions; integer buffers keep the max."""
    if not contributions:
        raise ValueError("nothing to average")
    peers = sorted(contributions)  # fixed order: the sum is reproducible
    names = contributions[peers[0]].tensors.keys()
    weights = np.array(
        [float(contributions[p].meta.get("num_samples", 1)) if weighted else 1.0 for p in peers]
    )
    weights = robust.normalized_weights(weights, len(peers))
    out = {}
    for name in names:
        stack = [contributions[p].tensors[name] for p in peers]
        if np.issubdtype(stack[0].dtype, np.floating):
            acc = np.zeros(stack[0].shape, dtype=np.float64)
            for w, t in zip(weights, stack, strict=True):
                acc += w * t
            out[name] = acc.astype(stack[0].dtype)
        else:  # e.g. BatchNorm's num_batches_tracked
            out[name] = np.max(np.stack(stack), axis=0)
    return out


def mismatch(arrays: dict[str, np.ndarray], reference: dict[str, np.ndarray],
             tops: dict[str, float] | None = None) -> str | None:
    """Why ``arrays`` cannot stand in for ``reference`` (names, shapes, dtypes, finite
    values of this peer's order: payload.beyond_scale), or None if it can."""
    if set(arrays) != set(reference):
        missing, extra = sorted(set(reference) - set(arrays)), sorted(set(arrays) - set(reference))
        return f"arrays differ: missing {missing}, unexpected {extra}"
    for name, ref in reference.items():
        got = arrays[name]
        if got.shape != ref.shape or got.dtype != ref.dtype:
            return f"{name}: {got.dtype}{list(got.shape)}, expected {ref.dtype}{list(ref.shape)}"
        # (dtype.kind: np.issubdtype per tensor per contribution was 6 % of a 1,000-peer
        # cohort's CPU in one process)
        if got.dtype.kind == "f" and got.size:
            top = top_abs(got)  # (NaN and inf too, in the one pass)
            if not math.isfinite(top):
                return f"{name}: non-finite values"
            why = beyond_scale(name, top, tops[name] if tops is not None else top_abs(ref))
            if why is not None:
                return why
    return None


def state_crc(arrays: dict[str, np.ndarray]) -> int:
    """A fingerprint of a state (crc32 over names and bytes): equal states, equal crc."""
    crc = 0
    for name in sorted(arrays):
        crc = zlib.crc32(np.ascontiguousarray(arrays[name]).tobytes(), zlib.crc32(name.encode(), crc))
    return crc


@register
class FedAvg(Algorithm):
    name = "fedavg"
    mode = "aggregator"
    Config = FedAvgConfig

    def __init__(self, ctx, cfg=None):
        super().__init__(ctx, cfg)
        self._round_start: dict[str, np.ndarray] | None = None  # clip_update_norm's reference

    def shared(self) -> nn.Module:
        """The part of the model that leaves the peer and is averaged."""
        return self.model

    def local_update(self, round: int) -> dict[str, float]:
        if getattr(self.cfg, "clip_update_norm", None) is not None:
            self._round_start = module_to_arrays(self.shared())
        return super().local_update(round)

    def update_reference(self) -> dict[str, np.ndarray]:
        """What ``clip_update_norm`` measures updates from: the shared part as this
        round began (the last aggregate, for a peer that absorbed it)."""
        return self._round_start if self._round_start is not None else module_to_arrays(self.shared())

    def share(self, round: int) -> Payload:
        # The sample count leaves the peer only when the mean is weighted by it.
        tensors, meta = pack_if_many(module_to_arrays(self.shared()),
                                     {"num_samples": len(self.ctx.train)} if robust.counts_weigh(self.cfg) else {})
        return Payload(kind="weights", tensors=tensors, meta=meta)

    def aggregate(self, round: int, contributions: dict[str, Payload]) -> Payload | None:
        reference = module_to_arrays(self.shared())  # our own shapes, not a peer's
        tops = {name: top_abs(a) for name, a in reference.items()}  # (once, not per member)
        own_top = max(tops.values(), default=0.0)
        by_layer = self.aggregation() != "model"
        good, excluded = {}, []
        for peer, c in sorted(contributions.items()):
            n = c.meta.get("num_samples", 1) if robust.counts_weigh(self.cfg) else 1
            arrays, why = unpack_if_packed(c.tensors, c.meta)
            c = Payload(kind=c.kind, tensors=arrays, meta=c.meta)
            if why is None:
                why = (layerwise.unfit(c.tensors, own_top) if by_layer
                       else mismatch(c.tensors, reference, tops))
            if why is None and (isinstance(n, bool) or not isinstance(n, (int, float))
                                or not math.isfinite(n) or n <= 0):
                why = f"num_samples must be a number > 0, got {n!r}"
            if why is None:
                good[peer] = c
            else:  # a mis-configured or hostile peer must not poison the average
                log.warning("%s: round %d: contribution of %s left out: %s",
                            self.ctx.peer_id, round, peer, why)
                excluded.append(peer)
        if not good:
            return None
        options = robust.rule_options(self.cfg)
        meta = {"excluded": excluded, "round": round}
        if not robust.is_plain(options):
            tensors = self.robust_aggregate(round, good, options, meta)
            if tensors is None:
                return None
        elif by_layer:
            tensors = layerwise.layerwise_mean(
                {p: c.tensors for p, c in good.items()},
                {p: float(c.meta.get("num_samples", 1)) if robust.counts_weigh(self.cfg) else 1.0
                 for p, c in good.items()},
                same_arch=self.aggregation() == "same_arch")
        else:
            tensors = weighted_mean(good, robust.counts_weigh(self.cfg))
        tensors, meta = pack_if_many(tensors, meta)
        return Payload(kind="weights", tensors=tensors, meta=meta)

    def robust_aggregate(self, round: int, good: dict[str, Payload], options: dict,
                         meta: dict) -> dict[str, np.ndarray] | None:
        """The robust rule over the checked contributions (``meta`` gains what it did),
        or None, with a logged reason, when it cannot run for them."""
        arrays = {p: c.tensors for p, c in good.items()}
        weights = {p: float(c.meta.get("num_samples", 1)) if robust.counts_weigh(self.cfg) else 1.0
                   for p, c in good.items()}
        meta["robust"] = options["rule"]
        try:
            if self.aggregation() == "model":
                reference = self.update_reference() if options["clip_update_norm"] is not None else None
                tensors, info = robust.combine(arrays, weights, reference=reference, **options)
                meta.update(info)
                return tensors
            tensors, skipped = robust.combine_layerwise(
                arrays, weights, same_arch=self.aggregation() == "same_arch", **options)
        except ValueError as exc:
            log.warning("%s: round %d: no aggregate this round: %s", self.ctx.peer_id, round, exc)
            return None
        for label, why in skipped.items():  # each holder keeps its own
            log.warning("%s: round %d: %s not aggregated: %s", self.ctx.peer_id, round, label, why)
        if skipped:
            meta["not_aggregated"] = sorted(skipped)
        if not tensors:
            log.warning("%s: round %d: no aggregate this round: %s could run on no array",
                        self.ctx.peer_id, round, options["rule"])
            return None
        return tensors

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        """Load the round's result into :meth:`target`; a result that does not fit or
        names another round is refused with a logged reason."""
        if not received:
            return {"absorbed": 0.0}
        (sender, result), = received.items()  # the runtime hands over the one elected result
        own = module_to_arrays(self.target())
        arrays, why = unpack_if_packed(result.tensors, result.meta)
        found = len(own)
        if why is None and self.aggregation() != "model":
            arrays, found = layerwise.select(arrays, own, self.aggregation() == "same_arch")
            why = layerwise.unfit(arrays, top_abs(own)) or (None if found else "no array fits this model")
        elif why is None:
            why = mismatch(arrays, own)
        if why is None and result.meta.get("round", round) != round:
            why = f"it is the result of round {result.meta.get('round')!r}"
        if why is not None:
            log.warning("%s: round %d: result from %s refused: %s",
                        self.ctx.peer_id, round, sender, why)
            return {"absorbed": 0.0}
        arrays_to_module(self.target(), arrays)
        return {"absorbed": 1.0, "absorbed_crc": float(state_crc(arrays)),
                "absorbed_layers": found / len(own)}

    def aggregation(self) -> str:
        """model, layerwise or same_arch (subclasses whose Config has no such option: model)."""
        return getattr(self.cfg, "aggregation", "model")

    def target(self) -> nn.Module:
        """Where the round's result is loaded: the shared part itself, for averaging methods."""
        return self.shared()

    def handshake_info(self) -> dict[str, int]:
        if self.aggregation() != "model":
            return {}  # models of different sizes are the point
        if self.shared() is self.model:
            return {"num_parameters": sum(p.numel() for p in self.model.parameters())}
        return {"embedding_dim": int(self.model.embedding_dim)}  # with num_classes: the head's shape
