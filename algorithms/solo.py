"""``solo``: local training only. The peer stays a cohort member (heartbeats,
membership, metrics) but shares nothing: the independent-learning baseline
(IND in FedH2L's tables)."""

from hfl.algorithms.base import Algorithm
from hfl.algorithms.registry import register


@register
class Solo(Algorithm):
    name = "solo"
    mode = "local"
