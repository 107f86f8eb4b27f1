"""Membership: who is in the cohort and who is alive, as a pure state machine.

No I/O and no clock of its own: every event carries ``now`` (seconds on the
peer's monotonic clock) and the node's async shell carries out what it returns.

Liveness comes only from direct evidence: any message received from a peer
(heartbeats are sent every ``heartbeat_interval_s``) refreshes it. A peer
silent for ``suspect_after_s`` is *suspect* (still waited for), silent for
``dead_after_s`` is *dead* (no longer waited for, skipped by the aggregator
rotation). Gossip only spreads addresses and incarnations: a peer learned by
gossip starts alive with a fresh timestamp and must then be heard directly.

Incarnations order a peer's lives: a message from a higher incarnation means
the peer restarted (it is alive again and its round may have gone back); a
message from a lower one is from a dead process and is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hfl.protocol.messages import MemberRecord

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"


@dataclass
class Member:
    peer_id: str
    address: str
    incarnation: int
    status: str = ALIVE
    last_heard: float = 0.0
    round: int = 0  # last round the peer told us it was in
    greeted: bool = False  # have we sent it our hello?


@dataclass(frozen=True)
class Change:
    """A status transition, for logs and metrics."""

    peer_id: str
    old: str
    new: str
    reason: str


@dataclass
class Membership:
    self_id: str
    self_address: str
    incarnation: int
    suspect_after_s: float
    dead_after_s: float
    members: dict[str, Member] = field(default_factory=dict)

    # ------------------------------------------------------------------ events

    def heard_from(
        self, peer_id: str, incarnation: int, now: float, address: str | None = None,
        round: int | None = None,
    ) -> Change | None:
        """Direct evidence that ``peer_id`` is alive. Returns a change, if any.

        Returns None and changes nothing when the message comes from an older
        incarnation than we know (a zombie; callers drop such messages), or from
        the incarnation that already said goodbye (a late or reordered message
        must not bring a peer that left back to life).
        """
        if peer_id == self.self_id:
            return None
        m = self.members.get(peer_id)
        if m is None:
            if address is None:
                return None  # unknown and no address: cannot add it
            self.members[peer_id] = Member(peer_id, address, incarnation, ALIVE, now)
            if round is not None:
                self.members[peer_id].round = round
            return Change(peer_id, "unknown", ALIVE, "joined")
        if incarnation < m.incarnation:
            return None
        if incarnation == m.incarnation and m.status == LEFT:
            return None
        change = None
        if incarnation > m.incarnation:
            reason = (f"restarted (incarnation {incarnation})" if m.incarnation >= 0
                      else "heard from (known from our checkpoint)")
            change = Change(peer_id, m.status, ALIVE, reason)
            m.incarnation = incarnation
            m.greeted = False
            m.round = 0
        elif m.status != ALIVE:
            change = Change(peer_id, m.status, ALIVE, "heard from again")
        m.status = ALIVE
        m.last_heard = now
        if address:
            m.address = address
        if round is not None:
            m.round = round
        return change

    def is_current(self, peer_id: str, incarnation: int) -> bool:
        """True if a message with this incarnation is not from a stale process."""
        m = self.members.get(peer_id)
        return m is not None and incarnation >= m.incarnation

    def left(self, peer_id: str, incarnation: int) -> Change | None:
        m = self.members.get(peer_id)
        if m is None or incarnation < m.incarnation:
            return None
        old, m.status, m.incarnation = m.status, LEFT, incarnation
        return None if old == LEFT else Change(peer_id, old, LEFT, "left")

    def merge(self, records: list[MemberRecord], now: float) -> list[str]:
        """Merge a gossiped view. Returns ids of members that are new to us.

        Only addresses and incarnations are taken from gossip, plus ``left``
        (a peer that said goodbye stays gone at that incarnation).
        """
        new = []
        for r in records:
            if r.peer_id == self.self_id:
                continue
            m = self.members.get(r.peer_id)
            if m is None:
                if r.status == LEFT:
                    continue
                self.members[r.peer_id] = Member(r.peer_id, r.address, r.incarnation, ALIVE, now)
                new.append(r.peer_id)
            elif r.incarnation > m.incarnation:
                # A newer life of this peer exists: take its address, await direct word.
                m.incarnation, m.address, m.greeted = r.incarnation, r.address, False
                m.round = 0
                if r.status == LEFT:
                    m.status = LEFT
                else:
                    m.status, m.last_heard = ALIVE, now
                    new.append(r.peer_id)
            elif r.incarnation == m.incarnation and r.status == LEFT:
                m.status = LEFT
        return new

    def tick(self, now: float) -> list[Change]:
        """Advance failure detection to time ``now``."""
        changes = []
        for m in self.members.values():
            if m.status in (DEAD, LEFT):
                continue
            silent = now - m.last_heard
            if silent >= self.dead_after_s:
                changes.append(Change(m.peer_id, m.status, DEAD, f"silent for {silent:.1f}s"))
                m.status = DEAD
            elif silent >= self.suspect_after_s and m.status == ALIVE:
                changes.append(Change(m.peer_id, m.status, SUSPECT, f"silent for {silent:.1f}s"))
                m.status = SUSPECT
        return changes

    # ------------------------------------------------------------------ queries

    def is_live(self, peer_id: str) -> bool:
        if peer_id == self.self_id:
            return True
        m = self.members.get(peer_id)
        return m is not None and m.status in (ALIVE, SUSPECT)

    def live_peers(self) -> list[str]:
        """Other members we still wait for (alive or suspect), sorted."""
        return sorted(p for p, m in self.members.items() if m.status in (ALIVE, SUSPECT))

    def live_view(self) -> list[str]:
        """Live members including ourselves, sorted."""
        return sorted([self.self_id, *self.live_peers()])

    def rotation_order(self) -> list[str]:
        """Everyone who has not left, ourselves included: the aggregator rotation.

        Dead members stay in the order (and are skipped when elected), so that
        peers with slightly different liveness views still agree on the order.
        """
        return sorted([self.self_id, *(p for p, m in self.members.items() if m.status != LEFT)])

    def gossip_targets(self) -> list[str]:
        """Who to heartbeat and gossip to: every member that has not left."""
        return sorted(p for p, m in self.members.items() if m.status != LEFT)

    def address_of(self, peer_id: str) -> str | None:
        m = self.members.get(peer_id)
        return m.address if m else None

    def records(self) -> list[MemberRecord]:
        own = MemberRecord(
            peer_id=self.self_id, address=self.self_address, incarnation=self.incarnation
        )
        # A member restored from a checkpoint has incarnation -1 until heard from;
        # the wire only carries incarnations >= 0.
        return [own] + [
            MemberRecord(peer_id=m.peer_id, address=m.address, incarnation=max(m.incarnation, 0),
                         status=m.status)
            for m in sorted(self.members.values(), key=lambda m: m.peer_id)
        ]

    def max_live_round(self) -> int:
        rounds = [m.round for m in self.members.values() if m.status in (ALIVE, SUSPECT)]
        return max(rounds, default=0)


def elect(order: list[str], is_live, round: int, epoch: int) -> tuple[str, int] | None:
    """The aggregator for ``round``: the first live member at or after epoch ``epoch``.

    Rotation: candidate for (round, e) is ``order[(round + e) % len(order)]``.
    Starting from ``epoch``, dead candidates are skipped by bumping the epoch,
    so every peer with the same order and liveness view elects the same peer,
    and a peer that failed over to epoch e+1 never goes back to e. Returns
    (aggregator, epoch), or None once every member has been tried.
    """
    n = len(order)
    for e in range(epoch, epoch + n):
        candidate = order[(round + e) % n]
        if is_live(candidate):
            return candidate, e
    return None
