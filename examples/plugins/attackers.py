"""Malicious members for the attack benchmark (bench/attacks.py), written as plugins.

Each attacker is a user method like examples/plugins/fedmedian.py: a subclass of
FedAvg found by ``path.py:Class``, using only the algorithm hooks every method
has (``local_update``, ``local_data``, ``share``, ``aggregate``). It trains as
an honest peer would and lies in one place:

| class | lies in | what it sends |
|---|---|---|
| ``SignFlip`` | its contribution | ``w_g - u`` (its update ``u = w - w_g`` reversed; ``w_g`` = the model it started the round from) |
| ``Scale10``, ``Scale100`` | its contribution | ``w_g + 10 u``, ``w_g + 100 u`` |
| ``GaussianNoise`` | its contribution | ``w_g + N(0, 1)`` per coordinate |
| ``LabelFlip`` | its data | honest FedAvg on labels ``y -> C - 1 - y`` (data poisoning) |
| ``InflatedCount`` | its sample count | ``w_g - u`` claiming 1,000,000 samples |
| ``LyingAggregator`` | its aggregate | an honest contribution; as aggregator, the mean's update reversed ×10 |
| ``Colluder`` | its contribution | ``w_g + 100 v`` with one direction ``v`` all colluders share |

Attacks on FedAvg's weights only (the benchmark's cohort); the same idea applies
to any method's payload.
"""

from __future__ import annotations

import numpy as np

from hfl.algorithms.base import Payload, module_to_arrays
from hfl.algorithms.fedavg import FedAvg, FedAvgConfig
from hfl.algorithms.packing import pack_if_many, unpack_if_packed


class _Attacker(FedAvg):
    """FedAvg that remembers the model it started each round from (``w_g``)."""

    Config = FedAvgConfig

    def local_update(self, round: int) -> dict[str, float]:
        self.start = module_to_arrays(self.shared())
        return super().local_update(round)

    def poison(self, start: dict[str, np.ndarray], own: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return own

    def share(self, round: int) -> Payload:
        honest = super().share(round)
        own, why = unpack_if_packed(honest.tensors, honest.meta)
        if why is not None:
            raise ValueError(why)
        floats = {k: v for k, v in own.items() if np.issubdtype(v.dtype, np.floating)}
        lied = {**own, **self.poison({k: self.start[k] for k in floats}, floats)}
        tensors, meta = pack_if_many(lied, self.claimed_meta(honest.meta))
        return Payload(kind=honest.kind, tensors=tensors, meta=meta)

    def claimed_meta(self, meta: dict) -> dict:
        return dict(meta)


def _update_times(factor: float):
    def poison(self, start, own):
        return {k: (start[k] + factor * (own[k] - start[k])).astype(own[k].dtype) for k in own}
    return poison


class SignFlip(_Attacker):
    name = "attack_sign_flip"
    poison = _update_times(-1.0)


class Scale10(_Attacker):
    name = "attack_scale10"
    poison = _update_times(10.0)


class Scale100(_Attacker):
    name = "attack_scale100"
    poison = _update_times(100.0)


class GaussianNoise(_Attacker):
    name = "attack_gaussian"
    def poison(self, start, own):
        rng = np.random.default_rng(self.ctx.seed + 1)
        return {k: (start[k] + rng.normal(size=own[k].shape)).astype(own[k].dtype) for k in own}


class InflatedCount(_Attacker):
    name = "attack_inflated_count"
    poison = _update_times(-1.0)

    def claimed_meta(self, meta: dict) -> dict:
        return {**meta, "num_samples": 1_000_000}


class Colluder(_Attacker):
    name = "attack_colluder"
    """Every colluder sends the same vector (their shared secret direction), so they
    look like a tight cluster of agreeing peers."""

    def poison(self, start, own):
        out = {}
        for k in own:
            seed = int.from_bytes(k.encode()[:8].ljust(8, b"\0"), "little") % 2**32
            v = np.random.default_rng([1234, seed]).normal(size=own[k].shape)
            out[k] = (start[k] + 100.0 * 0.01 * v).astype(own[k].dtype)
        return out


class LabelFlip(FedAvg):
    name = "attack_label_flip"
    Config = FedAvgConfig

    def local_data(self):
        from hfl.data import ArrayDataset

        ds = self.ctx.train
        return ArrayDataset(ds.x, (self.ctx.num_classes - 1 - ds.y).astype(ds.y.dtype),
                            self.ctx.num_classes, name="label-flipped")


class LyingAggregator(_Attacker):
    name = "attack_lying_aggregator"
    """Contributes honestly; when it aggregates, hands out the round's mean update
    reversed ×10 and keeps the honest mean for itself (so its next contributions
    stay honest: only the aggregator's lever is measured)."""

    def aggregate(self, round: int, contributions: dict[str, Payload]) -> Payload | None:
        result = self._honest = super().aggregate(round, contributions)
        if result is None:
            return None
        mean, why = unpack_if_packed(result.tensors, result.meta)
        if why is not None:
            return result
        lied = {k: ((self.start[k] - 10.0 * (v - self.start[k])).astype(v.dtype)
                    if np.issubdtype(v.dtype, np.floating) else v) for k, v in mean.items()}
        tensors, meta = pack_if_many(lied, {k: v for k, v in result.meta.items()
                                            if k != "pack"})
        return Payload(kind=result.kind, tensors=tensors, meta=meta)

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        if set(received) == {self.ctx.peer_id} and getattr(self, "_honest", None) is not None:
            received = {self.ctx.peer_id: self._honest}  # its own lie is for the others
        return super().absorb(round, received)
