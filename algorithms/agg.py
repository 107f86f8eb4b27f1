"""``agg``: the AGG baseline of FedH2L's tables. Each node trains on its private
data plus every node's labelled public seeds (exchanged by the runtime); no
knowledge is exchanged during training."""

from __future__ import annotations

import numpy as np

from hfl.algorithms.base import Algorithm
from hfl.algorithms.registry import register
from hfl.algorithms.training import train_epochs


@register
class Agg(Algorithm):
    name = "agg"
    mode = "local"
    uses_public_seeds = True

    def local_update(self, round: int) -> dict[str, float]:
        from hfl.data import ArrayDataset

        ctx = self.ctx
        parts = [ctx.train, *([ctx.public] if ctx.public is not None else []),
                 *(self.peer_seeds[o] for o in sorted(self.peer_seeds))]
        data = ArrayDataset(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]),
                            ctx.num_classes, name="private+all-public")
        loss = train_epochs(self.model, data, self.optimizer, ctx.train_cfg, ctx.device,
                            self.generator, lambda x, y: self.loss(x, y, round))
        return {"train_loss": loss}
