"""Round bookkeeping without I/O: which knowledge and results a peer holds.

The staleness rule (PROTOCOL.md, "Rounds"): knowledge tagged with round r is
kept while the peer is in a round <= r and at most ``lookahead`` rounds behind
r (plus the one highest round further ahead, for a peer that lags behind the
cohort); knowledge for a round the peer has already finished is dropped as late.
Results are kept per (round, epoch), one per epoch (the first stands), so a
result for a high epoch can never push out the one the peer is waiting for.
Which of them a peer may *use* is the election rule, decided by the node
(``PeerCore.usable_result``): the result of the epoch it is at, or of a later
epoch whose earlier candidates it has itself seen fail; a result for an epoch
the peer has already failed over from is stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hfl.protocol.messages import AggregateResult, Knowledge


def same_knowledge(a: Knowledge, b: Knowledge) -> bool:
    """``b`` repeats ``a`` exactly: same round, epoch, kind, meta and tensors
    (names, dtypes, shapes and values)."""
    if (a.round, a.epoch, a.kind, a.incarnation) != (b.round, b.epoch, b.kind, b.incarnation):
        return False
    if a.meta != b.meta or a.tensors.keys() != b.tensors.keys():
        return False
    return all(a.tensors[k].dtype == b.tensors[k].dtype
               and np.array_equal(a.tensors[k], b.tensors[k]) for k in a.tensors)


@dataclass
class RoundBuffer:
    lookahead: int = 2
    round: int = 1
    knowledge: dict[int, dict[str, Knowledge]] = field(default_factory=dict)
    results: dict[int, dict[int, AggregateResult]] = field(default_factory=dict)  # round -> epoch ->

    def far_round(self) -> int | None:
        """The one round beyond the lookahead window whose knowledge is kept (None: none):
        knowledge for a round further ahead replaces it, for a nearer one is refused."""
        return max((r for r in self.knowledge if r > self.round + self.lookahead), default=None)

    def offer_knowledge(self, msg: Knowledge) -> str | None:
        """Store ``msg``; returns None if kept, else the reason it was dropped.

        Beyond the lookahead window only the highest round seen is kept (one
        round, so memory stays bounded): a peer that lags behind the cohort
        will catch up to exactly that round, and the knowledge its peers sent
        it there (as that round's aggregator, say) must still be here."""
        if msg.round < self.round:
            return f"late knowledge for round {msg.round} (now in round {self.round})"
        if msg.round > self.round + self.lookahead:
            if (kept := self.far_round()) is not None and msg.round < kept:
                return (f"knowledge for round {msg.round} is too far ahead of round {self.round} "
                        f"(round {kept} is kept)")
            for r in [r for r in self.knowledge if r > self.round + self.lookahead]:
                if r != msg.round:
                    del self.knowledge[r]
        slot = self.knowledge.setdefault(msg.round, {})
        held = slot.get(msg.sender)
        if held is not None:
            if same_knowledge(held, msg):
                # A retransmission (a sender re-sends to an aggregator that was behind):
                # nothing new and nothing wrong, so not a drop.
                return None
            return (f"conflicting knowledge from {msg.sender} for round {msg.round}: it differs "
                    "from the copy already held, which stands")
        slot[msg.sender] = msg
        return None

    def offer_result(self, msg: AggregateResult) -> str | None:
        if msg.round < self.round:
            return f"late result for round {msg.round} (now in round {self.round})"
        if msg.round > self.round + self.lookahead:
            return f"result for round {msg.round} is too far ahead of round {self.round}"
        if msg.epoch < 0:
            return f"result for round {msg.round} at epoch {msg.epoch}"
        held = self.results.setdefault(msg.round, {})
        if msg.epoch in held:
            return f"duplicate result for round {msg.round} epoch {msg.epoch}"
        held[msg.epoch] = msg
        return None

    def received(self, round: int) -> dict[str, Knowledge]:
        return self.knowledge.get(round, {})

    def has_all(self, round: int, peers: list[str]) -> bool:
        got = self.knowledge.get(round, {})
        return all(p in got for p in peers)

    def result(self, round: int, epoch: int) -> AggregateResult | None:
        """The result for exactly (``round``, ``epoch``), if one arrived."""
        return self.results.get(round, {}).get(epoch)

    def results_for(self, round: int, min_epoch: int = 0) -> list[AggregateResult]:
        """Results held for ``round`` at epochs >= ``min_epoch``, lowest epoch first."""
        held = self.results.get(round, {})
        return [held[e] for e in sorted(held) if e >= min_epoch]

    def advance(self, new_round: int) -> None:
        """Enter ``new_round``: forget everything about earlier rounds."""
        self.round = new_round
        self.knowledge = {r: k for r, k in self.knowledge.items() if r >= new_round}
        self.results = {r: m for r, m in self.results.items() if r >= new_round}


# Per-round quantities a metrics line adds up over the rounds it covers.
SUMMED_FIELDS = ("round_time_s", "compute_s", "compute_cpu_s", "cpu_s", "bytes_sent", "bytes_received",
                 "membership_sent")


def fold_rounds(rows: list[dict], averaged: set[str]) -> dict:
    """One metrics line for the rounds since the previous evaluation (``node.evaluate_every``).

    ``rows`` are the records of the rounds run, oldest first; the last is the
    evaluated round, whose values the line keeps. On top of it: ``span`` (how
    many rounds the line covers), ``time`` (when the first began), the sums of
    :data:`SUMMED_FIELDS`, the largest ``live_peers``, ``isolated_rounds`` (how
    many learned from no other peer; ``exchanges``, how many exchanged, where
    ``cohort.communicate_every`` made some a local step) and, for each key in ``averaged`` (what
    training and absorbing reported), its mean over the rounds that reported it.
    """
    if not rows:
        raise ValueError("fold_rounds needs at least the evaluated round")
    line = dict(rows[-1])
    line["span"] = len(rows)
    line["time"] = rows[0]["time"]
    for key in SUMMED_FIELDS:
        if key in line:
            line[key] = sum(r.get(key, 0) for r in rows)
    if "live_peers" in line:
        line["live_peers"] = max(int(r.get("live_peers", 1)) for r in rows)
    exchanged = [r for r in rows if "learned_from" in r]  # not cohort.communicate_every's local steps
    if exchanged:
        line.setdefault("learned_from", exchanged[-1]["learned_from"])
        line["isolated_rounds"] = sum(1 for r in exchanged if r["learned_from"] == 0)
        if len(exchanged) < len(rows):
            line["exchanges"] = len(exchanged)  # of the rounds it covers, those that exchanged
    for key in averaged:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if values:
            line[key] = sum(values) / len(values)
    return line
