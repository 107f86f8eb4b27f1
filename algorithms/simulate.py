"""An in-process cohort with no network at all: the same hooks, in the same order
as the peer runtime calls them, with the aggregator chosen by the same rotation
(``sorted(ids)[round % n]``, everyone alive) or, with ``aggregate_at`` resolving to
every_peer (the runtime's rule, :func:`hfl.algorithms.base.aggregates_everywhere`),
every peer aggregating all payloads itself. For testing how an algorithm learns
and for comparisons with many seeds; fault tolerance is the runtime's business
and is tested there.

Every receiver gets its own copy of each payload's arrays, as it would after
decoding a message, so one peer's ``absorb`` cannot change what another sees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hfl.algorithms.base import Algorithm, Payload, aggregates_everywhere


def _copy(payload: Payload) -> Payload:
    return Payload(kind=payload.kind, tensors={k: np.array(v) for k, v in payload.tensors.items()},
                   meta=dict(payload.meta))


def simulate(
    algorithms: Sequence[Algorithm],
    rounds: int,
    on_round: Callable[[int, dict[str, dict[str, Any]]], None] | None = None,
    aggregate_at: str = "auto",
) -> dict[str, list[dict[str, Any]]]:
    """Run ``rounds`` rounds; returns each peer's per-round metrics (with ``round``,
    ``aggregator`` and ``bytes_shared`` added) by peer id."""
    by_id = {a.ctx.peer_id: a for a in algorithms}
    if len(by_id) != len(algorithms):
        raise ValueError("peer ids must be unique")
    modes = {a.mode for a in algorithms}
    if len(modes) != 1:
        raise ValueError(f"one algorithm mode per cohort, got {sorted(modes)}")
    mode = modes.pop()
    ids = sorted(by_id)
    everywhere = {aggregates_everywhere(aggregate_at, a, len(algorithms)) for a in algorithms}
    if len(everywhere) != 1:
        raise ValueError("peers disagree on aggregate_at (every_peer for some, aggregator for others)")
    everywhere = everywhere.pop()
    history: dict[str, list[dict[str, Any]]] = {pid: [] for pid in ids}
    # Methods that learn on peers' public samples hold every member's seed set before
    # round 1, as the runtime's join waits for them (Node._join: seeds_ready): without
    # them FedMD's peers could digest no consensus but on their own batch (3 of 4 peers
    # trained exactly as SOLO in bench/compare_mdhfl.py until this was added).
    for pid in ids:
        if by_id[pid].uses_public_seeds:
            for owner in ids:
                public = by_id[owner].ctx.public
                if owner != pid and public is not None and len(public):
                    by_id[pid].add_peer_seeds(owner, np.array(public.x), np.array(public.y))
    for r in range(1, rounds + 1):
        metrics = {pid: dict(by_id[pid].local_update(r)) for pid in ids}
        payloads = {pid: p for pid in ids if (p := by_id[pid].share(r)) is not None}
        for pid in ids:
            metrics[pid].update(round=r, bytes_shared=payloads[pid].nbytes if pid in payloads else 0)
        if mode == "broadcast":
            for pid in ids:
                received = {q: _copy(p) for q, p in payloads.items() if q != pid}
                if received:
                    metrics[pid].update(by_id[pid].absorb(r, received))
        elif mode == "aggregator" and payloads and everywhere:
            for pid in ids:
                result = by_id[pid].aggregate(r, {q: _copy(p) for q, p in payloads.items()})
                metrics[pid]["aggregator"] = pid
                if result is not None:
                    metrics[pid].update(by_id[pid].absorb(r, {pid: result}))
        elif mode == "aggregator" and payloads:
            aggregator = ids[r % len(ids)]  # hfl.peer.membership.elect at epoch 0
            result = by_id[aggregator].aggregate(r, {q: _copy(p) for q, p in payloads.items()})
            for pid in ids:
                metrics[pid]["aggregator"] = aggregator
                if result is not None:
                    metrics[pid].update(by_id[pid].absorb(r, {aggregator: _copy(result)}))
        for pid in ids:
            metrics[pid].update(by_id[pid].evaluate())
            history[pid].append(metrics[pid])
        if on_round is not None:
            on_round(r, metrics)
    return history
