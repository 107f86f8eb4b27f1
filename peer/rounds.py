"""Round bookkeeping without I/O: which knowledge and results a peer holds.

The staleness rule (PROTOCOL.md, "Rounds"): knowledge tagged with round r is
kept while the peer is in a round <= r and at most ``lookahead`` rounds behind
r; knowledge for a round the peer has already finished is dropped as late. An
aggregator's result for (r, e) is used only in round r and only if e is at
least the epoch the peer has failed over to: a result from an aggregator the
peer already gave up on is rejected as stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hfl.protocol.messages import AggregateResult, Knowledge


@dataclass
class RoundBuffer:
    lookahead: int = 2
    round: int = 1
    knowledge: dict[int, dict[str, Knowledge]] = field(default_factory=dict)
    results: dict[int, AggregateResult] = field(default_factory=dict)

    def offer_knowledge(self, msg: Knowledge) -> str | None:
        """Store ``msg``; returns None if kept, else the reason it was dropped."""
        if msg.round < self.round:
            return f"late knowledge for round {msg.round} (now in round {self.round})"
        if msg.round > self.round + self.lookahead:
            return f"knowledge for round {msg.round} is too far ahead of round {self.round}"
        slot = self.knowledge.setdefault(msg.round, {})
        if msg.sender in slot:
            return f"duplicate knowledge from {msg.sender} for round {msg.round}"
        slot[msg.sender] = msg
        return None

    def offer_result(self, msg: AggregateResult) -> str | None:
        if msg.round < self.round:
            return f"late result for round {msg.round} (now in round {self.round})"
        if msg.round > self.round + self.lookahead:
            return f"result for round {msg.round} is too far ahead of round {self.round}"
        held = self.results.get(msg.round)
        if held is not None and held.epoch >= msg.epoch:
            return f"result for round {msg.round} epoch {msg.epoch} superseded by epoch {held.epoch}"
        self.results[msg.round] = msg
        return None

    def received(self, round: int) -> dict[str, Knowledge]:
        return self.knowledge.get(round, {})

    def has_all(self, round: int, peers: list[str]) -> bool:
        got = self.knowledge.get(round, {})
        return all(p in got for p in peers)

    def result(self, round: int, min_epoch: int) -> AggregateResult | None:
        """The result for ``round`` if its epoch is not stale, else None."""
        res = self.results.get(round)
        if res is None or res.epoch < min_epoch:
            return None
        return res

    def advance(self, new_round: int) -> None:
        """Enter ``new_round``: forget everything about earlier rounds."""
        self.round = new_round
        self.knowledge = {r: k for r, k in self.knowledge.items() if r >= new_round}
        self.results = {r: m for r, m in self.results.items() if r >= new_round}
