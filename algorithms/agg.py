"""``agg``: the AGG baseline of FedH2L's tables. Each node trains on its private
data plus every node's labelled public seeds (exchanged by the runtime); no
knowledge is exchanged during training."""

from __future__ import annotations

from hfl.algorithms.base import Algorithm
from hfl.algorithms.registry import register


@register
class Agg(Algorithm):
    name = "agg"
    mode = "local"
    uses_public_seeds = True

    def local_data(self):
        return self.private_and_public()
