"""``fedavg``: federated averaging (McMahan et al., AISTATS 2017, Algorithm 1).

Every peer trains locally, sends its full model state to the round's elected
aggregator, which returns the sample-count-weighted mean
``w = sum_k n_k w_k / sum_k n_k``; every peer then loads it. Needs identical
architectures (the handshake checks the parameter count).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hfl.algorithms.base import Algorithm, Payload, arrays_to_module, module_to_arrays
from hfl.algorithms.registry import register


@dataclass(frozen=True)
class FedAvgConfig:
    weighted: bool = True  # weight by sample count (False: plain mean)


def weighted_mean(contributions: dict[str, Payload], weighted: bool) -> dict[str, np.ndarray]:
    """Mean of each named array over contributions; integer buffers keep the max."""
    if not contributions:
        raise ValueError("nothing to average")
    peers = sorted(contributions)  # fixed order: the sum is reproducible
    names = contributions[peers[0]].tensors.keys()
    weights = np.array(
        [float(contributions[p].meta.get("num_samples", 1)) if weighted else 1.0 for p in peers]
    )
    weights = weights / weights.sum()
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


@register
class FedAvg(Algorithm):
    name = "fedavg"
    mode = "aggregator"
    Config = FedAvgConfig

    def share(self, round: int) -> Payload:
        return Payload(
            kind="weights",
            tensors=module_to_arrays(self.model),
            meta={"num_samples": len(self.ctx.train)},
        )

    def aggregate(self, round: int, contributions: dict[str, Payload]) -> Payload:
        shapes = {p: {k: v.shape for k, v in c.tensors.items()} for p, c in contributions.items()}
        reference = next(iter(shapes.values()))
        bad = sorted(p for p, s in shapes.items() if s != reference)
        if bad:  # a mis-configured peer must not poison the average
            contributions = {p: c for p, c in contributions.items() if p not in bad}
        return Payload(
            kind="weights",
            tensors=weighted_mean(contributions, self.cfg.weighted),
            meta={"excluded": bad},
        )

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        for result in received.values():
            arrays_to_module(self.model, result.tensors)
        return {}

    def handshake_info(self) -> dict[str, int]:
        return {"num_parameters": sum(p.numel() for p in self.model.parameters())}
