"""Membership: who is in the cohort and who is alive, as a pure state machine.

No I/O and no clock of its own: every event carries ``now`` (seconds on the
peer's monotonic clock) and the node's async shell carries out what it returns.

Liveness comes only from direct evidence: any message received from a peer
(heartbeats are sent every ``heartbeat_interval_s``) refreshes it. A peer
silent for ``suspect_after_s`` is *suspect* (still waited for), silent for
``dead_after_s`` is *dead* (no longer waited for, skipped by the aggregator
rotation).

Only a peer speaks for itself. Its address, incarnation, liveness and departure
are taken only from messages it sent over its own (authenticated) connection.
Gossip from other members can only *suggest* a peer we do not know yet: it
starts alive with a fresh timestamp, is greeted, and must then be heard
directly; gossip never changes a known member's address, incarnation or
status, and never marks anyone left (a peer reported left that we never met is
remembered in ``reported_left``, for the join count only). A peer confirmed by
its own word keeps its address for that incarnation: a different address at
the same incarnation is a conflict the node refuses (:meth:`address_conflict`).

Two ways to watch the others (``mode``, from ``timing.membership``):

- ``full``: every member sends a heartbeat to every other each interval, and a
  member silent for ``suspect_after_s`` / ``dead_after_s`` is suspect / dead.
  O(N) messages per peer per interval: fine for tens of peers.
- ``swim`` (SWIM's failure detector, Das, Gupta and Motivala 2002, adapted so
  that a death is still only ever declared on the peer's own evidence): each
  interval a peer probes one member (a randomized round-robin over the view)
  and, every ceil(N / 16) intervals, the members it currently depends on (the
  round's aggregator candidates), and expects a heartbeat back; a member that
  owes an answer is probed again after 1, 2, 4, ... intervals (and all of it
  ceil(patience) times less often while answers are slow). Silence counts
  only from a probe nobody answered:
  a member that owes an answer for ``suspect_after_s`` is suspect, for
  ``dead_after_s`` dead, both stretched by :meth:`Membership.patience` while
  the answers to this peer's probes come slowly (a loaded machine). A
  suspicion or death is news, piggybacked on the next heartbeats for
  ``O(log N)`` hops (infection-style dissemination); a peer that hears it and
  has no fresher word of its own *suspects* the member and probes it itself:
  the member is dead to it only after ``dead_after_s`` of its own unanswered
  probes (the reporter's silence is not credited); one answer clears it. A third party can make a peer look, never decide. O(1) messages
  per peer per interval, whatever N.

Incarnations order a peer's lives: a message from a higher incarnation means
the peer restarted (it is alive again and its round may have gone back); a
message from a lower one is from a dead process and is ignored.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
import zlib
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from hfl.protocol.codec import Limits
from hfl.protocol.messages import MemberRecord

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"

#: swim: the most a peer stretches its suspicion and death timeouts when the answers to
#: its probes come slowly (Lifeguard's local health multiplier also stops at 8 + 1).
PATIENCE_MAX = 8.0
#: Places gossip may give one member we have not heard from (one a reporter): enough
#: for every honest reporter of a cohort's first gossip, and a bound on what reporters
#: who are not members (an open cohort) can make us greet.
MAX_LEADS = 16
#: Members a view takes from gossip at most: with ourselves, what a welcome can carry
#: (the codec's ``max_members``). Without an allow-list, gossip of 4,096 made-up ids a
#: message grew a view without end, and once past this a welcome no longer encoded:
#: newcomers' hellos went unanswered (a fuzzer's find).
MAX_VIEW = Limits().max_members - 1
#: swim: answer times kept for the estimate, and how many it needs before it counts.
ANSWER_WINDOW, ANSWER_MIN = 64, 8


@dataclass(slots=True)  # (a thousand peers in one process hold a million of them)
class Member:
    peer_id: str
    address: str
    incarnation: int
    status: str = ALIVE
    last_heard: float = 0.0  # when we last heard from it (read it with Membership.heard_at)
    heard_pause: float = 0.0  # Membership's pauses so far when last_heard was taken
    round: int = 0  # last round the peer told us it was in
    epoch: int = 0  # the aggregator epoch it said it was at in that round
    epoch_heard: float = 0.0  # when it said so (a stale epoch must not move anyone)
    # When a message of its own that names its round (a heartbeat, a welcome, its
    # knowledge) last said it is in ``round``: gossip or an ack says it lives, not where.
    round_heard: float = 0.0
    greeted: bool = False  # have we sent it our hello?
    confirmed: bool = False  # heard from the peer itself (not only suggested by gossip)
    # when we first heard from this life of it (None: not yet): a member gone within
    # dead_after_s of it died at its join (Membership._sole_witness)
    confirmed_at: float | None = None
    # ``address`` is the peer's own word (its hello or welcome), not a third party's: a
    # member can be confirmed by a message that names no address (a heartbeat, or a
    # probe another member asked it to relay), and its address is then still gossip's.
    placed: bool = False
    remembered: bool = False  # in our own checkpoint: heard from itself in an earlier life of ours
    # Where gossip says this peer, silent to us, is when that is not its ``address``:
    # reporter -> place (a restart elsewhere; or the first gossip we took was wrong).
    # Places to greet it, never its address: only its own answer moves it (see merge).
    leads: dict[str, str] | None = None
    # swim: when a probe to it went out that it has not answered yet (None: it owes
    # nothing); its silence counts from then.
    expect_since: float | None = None
    # swim: our own unanswered probes to it: when the first went out (the answer time
    # we measure starts there), how many, and when the last did (re-probes back off).
    asked_at: float | None = None
    asked_pause: float = 0.0  # Membership's pauses so far when asked_at was taken
    probes: int = 0
    probed_at: float = 0.0
    #: the record we last sent of it (Membership.records: reused while it still says the
    #: same; a welcome carries a thousand of them)
    wire: MemberRecord | None = field(default=None, repr=False, compare=False)

    @property
    def vouched(self) -> bool:
        """Known by evidence of our own (its own word, now or before our restart), not
        only because another member said so: what the quorum counts."""
        return self.confirmed or self.remembered


@dataclass(frozen=True)
class Change:
    """A status transition, for logs and metrics."""

    peer_id: str
    old: str
    new: str
    reason: str
    #: how long the member had been silent to us, for a change its silence made
    silent_s: float | None = None


@dataclass
class Membership:
    self_id: str
    self_address: str
    incarnation: int
    suspect_after_s: float
    dead_after_s: float
    members: dict[str, Member] = field(default_factory=dict)
    #: Peers we never met that a member reported as left (a late joiner counts them
    #: as having been in the cohort; nothing else trusts this third-party word).
    reported_left: set[str] = field(default_factory=set)
    #: Peers we never heard from ourselves that members reported as cohort members no
    #: longer alive (suspect, dead or left in the reporter's view, which only holds
    #: such a record for a member it knew by its own evidence: :meth:`records`):
    #: peer -> the members that reported it. With ``reports_needed`` reporters it joins
    #: the rotation order (a late joiner must elect as the members that saw it die).
    reported: dict[str, set[str]] = field(default_factory=dict)
    reports_needed: int = 1  # the node sets f + 1: f malicious members cannot add an id
    #: ``timing.join: lazy`` (with swim): a member that ``reports_needed`` members vouch
    #: for (alive records they send with ``vouched``: each heard from it itself) counts
    #: for the join and the rotation order as if we had greeted it, and a member is
    #: greeted only when we first probe it (its hello is the probe). The join costs
    #: O(N) messages instead of every member greeting every other (N^2).
    lazy: bool = False
    mode: str = "full"  # "full" or "swim" (module docstring)
    rng: random.Random = field(default_factory=random.Random)
    #: members given a new lead since the node last looked (:meth:`take_fresh_leads`:
    #: its next tick greets them there; after that, once per ``dead_after_s``)
    fresh_leads: set[str] = field(default_factory=set)
    #: suggestions of new members not taken because the view holds MAX_VIEW already
    view_full: int = 0
    #: swim: news of failures and departures to piggyback: peer id -> [record, sends left]
    rumors: dict[str, list] = field(default_factory=dict)
    _probe_order: list[str] = field(default_factory=list)
    # Caches for what the round engine asks on every wake-up (O(1) instead of O(N) per
    # message, which a thousand peers in one process need): the rotation order, keyed
    # by a version bumped on each change that can move it, and the highest live round.
    _version: int = 0
    _ids: list[str] = field(default_factory=list)  # every member ever added, in order
    _owing: set[str] = field(default_factory=set)  # swim: members with expect_since set
    #: the rotation order (sorted ids) and its set, kept as members enter it
    #: (:meth:`_vouched_for`; rebuilt when ``reports_needed`` changes), and how many times
    #: it grew (a cache key)
    _order: list[str] = field(default_factory=list)
    _order_ids: set[str] = field(default_factory=set)
    _order_needed: int = -1
    _order_changes: int = 0
    _digest: tuple = (-1, 0)  # (_order_changes then, the order's digest): order_digest
    _sorted_ids: tuple = (-1, [])  # (members then, their ids sorted): records
    #: lazy: the members we heard from ourselves, in the order we first did (what a
    #: member asking for our view gets, from where its last ask ended: vouched_since)
    _vouch_log: list[str] = field(default_factory=list)
    _max_round: int | None = None
    _vouched_round: tuple[int, int] | None = None  # (vouchers, live_round(vouchers))
    _at: tuple = (-1, {})  # (members indexed, address -> peer ids): _members_at
    #: The join's counts (:meth:`join_counts`), kept up to date as members are added and
    #: change status or greeting (:meth:`_set`: a member's ``status`` and ``greeted`` are
    #: written nowhere else, :meth:`set_status` for tests): the join asks on every message,
    #: and a thousand peers greeting each other must not cost a scan of the view each
    #: (the protocol-level simulator's 1,000-peer cohort spent most of its time there).
    #: Members alive and greeted (ids, in the order they came to be), members that
    #: left, members greeted or left.
    _greeted_alive: dict[str, None] = field(default_factory=dict)
    _left_n: int = 0
    _arrived_n: int = 0
    _live_n: int = 0  # members alive or suspect (:meth:`live_count`), kept the same way
    _confirmed_n: int = 0  # members heard from themselves (:meth:`confirmed_count`)
    #: bumped by every change the join's counts read (:meth:`join_counts` caches on it)
    _join_changes: int = 0
    _join_cache: tuple = (-1, None)
    _remembered: list[str] = field(default_factory=list)  # members added from our checkpoint
    _live_cache: tuple = (None, ())  # (_join_changes, members then; live ids): live_ids
    #: how long this peer stood still in all (:meth:`paused`): silence since a member was
    #: last heard and the wait for its answers leave out the pauses since they began
    _paused_s: float = 0.0
    #: swim: how long the latest answers to our probes took (seconds), for patience()
    answer_times: deque = field(default_factory=lambda: deque(maxlen=ANSWER_WINDOW))
    _answers: int = 0  # answer times ever taken: the key of the cached percentile
    _typical: tuple = (-1, 0.0)
    #: swim: Lifeguard's local health score, 0 .. PATIENCE_MAX - 1: up by one for each
    #: member our own probes found dead, each answer that came after ``suspect_after_s``
    #: (the configured wait was too hasty) and each of our own intervals that ran a
    #: whole interval late (:meth:`ran_late`), down by one for each answer within half
    #: of it (so one real death is forgotten within a few answers).
    health: int = 0
    #: Crash hints (issue 36): how long a member whose link to us dropped may stay
    #: silent, probes included, before it is dead (0: hints are ignored). The node
    #: sets it to two heartbeat intervals; stretched by :meth:`patience` like the rest.
    hint_dead_s: float = 0.0
    #: peer -> when our link to it dropped, while nothing has come from it since
    _hinted: dict[str, float] = field(default_factory=dict)
    #: member -> when a hint last had it probed: a link that drops again and again (a
    #: member that rebinds its socket, a forwarder) probes it once per hint_dead_s
    _hint_probed: dict[str, float] = field(default_factory=dict)
    #: member known by our own evidence -> the other members that reported it gone (a
    #: record of it not alive, which a member sends only of one it knew itself:
    #: :meth:`records`), for :meth:`_sole_witness`
    witnesses: dict[str, set[str]] = field(default_factory=dict)
    #: members known by our own evidence, gone (dead or left) since the time given,
    #: that too few members witnessed for any other to have them in its order: looked
    #: at each tick (:meth:`_sole_witness`)
    _gone_at: dict[str, float] = field(default_factory=dict)
    #: such members, left out of the rotation order (still reported: records)
    _unwitnessed: set[str] = field(default_factory=set)

    def _touch(self, rounds: bool = True) -> None:
        """A member joined, left, changed status or was vouched for: drop the caches
        (``rounds``: the highest live round's too; members gossip adds are at round 0)."""
        self._version += 1
        self._vouched_round = None  # (a member at round 0 joining changes the k-th highest)
        if rounds:
            self._max_round = None

    def _vouched_for(self, peer_id: str) -> None:
        """``peer_id`` entered the rotation order (heard from itself, or reported enough);
        no member's round or status changed."""
        self._enter_order((peer_id,))
        self._touch(rounds=False)

    def _enter_order(self, peer_ids: Sequence[str]) -> None:
        if self._order_needed != self.reports_needed:
            self._order_needed = -1  # built for another reports_needed: rebuilt when asked
            self._order_changes += 1
            return
        ids = self._order_ids
        fresh = [p for p in dict.fromkeys(peer_ids) if p not in ids]
        if not fresh:
            return
        ids.update(fresh)
        if len(fresh) == 1:
            bisect.insort(self._order, fresh[0])
        else:
            self._order += fresh
            self._order.sort()
        self._order_changes += 1

    # ------------------------------------------------------------------ events

    @property
    def remembers(self) -> bool:
        """Whether the view holds members of our checkpoint (:meth:`remember`)."""
        return bool(self._remembered)

    def remember(self, members: list[tuple[str, str]], now: float) -> None:
        """The members of our checkpoint (id, address), heard from by an earlier life of
        ours: in the view, *remembered* (incarnation -1 until heard from: any life of
        theirs supersedes it), so they are *vouched* (the rotation order, the quorum) and
        greeted, but not counted by the join (:meth:`join_counts`) before a handshake."""
        for peer_id, address in members:
            self.heard_from(peer_id, -1, now, address=address)

    def heard_from(
        self, peer_id: str, incarnation: int, now: float, address: str | None = None,
        round: int | None = None, epoch: int | None = None, answer: bool = True,
    ) -> Change | None:
        """Direct evidence that ``peer_id`` is alive. Returns a change, if any.

        ``answer``: the message can be the answer to our probe (a heartbeat that is not
        itself a probe); only an answer ends the wait that :meth:`patience` measures
        (a probe of the member's own, crossing ours, says it lives, not how long our
        probes take).

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
            self._add(Member(peer_id, address, incarnation, ALIVE, now, confirmed=incarnation >= 0,
                             placed=incarnation >= 0, remembered=incarnation < 0,
                             confirmed_at=now if incarnation >= 0 else None))
            if incarnation < 0:
                self._remembered.append(peer_id)
            if round is not None:
                self.members[peer_id].round = round
                self.members[peer_id].epoch = epoch or 0
                self.members[peer_id].epoch_heard = now
                self.members[peer_id].round_heard = now
                self._round_rose(round)
            self._vouch_log.append(peer_id)
            self._vouched_for(peer_id)
            return Change(peer_id, "unknown", ALIVE, "joined")
        may_move = self.address_conflict(peer_id, incarnation, address) is None
        if not m.confirmed and incarnation >= 0 and incarnation != m.incarnation:
            # Known only from gossip or our checkpoint: the peer's own word on its
            # incarnation wins over a third party's (who may have inflated it).
            m.incarnation = min(m.incarnation, incarnation) if m.incarnation >= 0 else -1
        if incarnation < m.incarnation:
            return None
        if incarnation == m.incarnation and m.status == LEFT:
            return None
        change = None
        was_vouched = m.vouched
        same_life = incarnation == m.incarnation
        if incarnation > m.incarnation:
            reason = (f"restarted (incarnation {incarnation})" if m.incarnation >= 0
                      else "heard from (known from our checkpoint)")
            change = Change(peer_id, m.status, ALIVE, reason)
            m.incarnation = incarnation
            self._set(m, greeted=False)
            m.round = 0
        elif m.status != ALIVE:
            change = Change(peer_id, m.status, ALIVE, "heard from again")
        if address and may_move:
            self._moved(m, address)
            m.leads, m.placed = None, True
        self._set(m, status=ALIVE)
        m.last_heard, m.heard_pause = now, self._paused_s
        if m.asked_at is not None and answer and same_life:  # how long our probe waited
            took = now - self._asked_at(m)
            self.answer_times.append(took)
            self._answers += 1
            # An answer after suspect_after_s: with the configured timeouts we would have
            # been too hasty (one up); one within half of it is in time (one down).
            if took >= self.suspect_after_s:
                self._health_up()
            elif took < self.suspect_after_s / 2:
                self.health = max(self.health - 1, 0)
        m.expect_since = None
        if answer or not same_life:
            m.asked_at, m.probes = None, 0
        self._owing.discard(peer_id)
        self._hinted.pop(peer_id, None)  # a message is the answer to any crash hint
        self._confirmed_n += not m.confirmed
        m.confirmed = True
        if m.confirmed_at is None or not same_life:  # (this life's first word)
            m.confirmed_at = now
        if round is not None:  # within one life a peer's round only goes forward
            if round > m.round:
                m.round, m.epoch = round, 0
                self._round_rose(round)
            if round == m.round:
                m.round_heard = now
                if epoch is not None:
                    m.epoch, m.epoch_heard = epoch, now
        if not was_vouched:
            self._vouch_log.append(peer_id)
            self._enter_order((peer_id,))
        if change is not None or not was_vouched:
            # (a status or a life changed: a restart's round went back to 0)
            self._touch(rounds=change is not None)
        return change

    def _members_at(self, address: str) -> list[Member]:
        """The members whose address is ``address`` (an index, rebuilt when members were
        added: a check per message must not scan a thousand members)."""
        if self._at[0] != len(self.members):  # (members added other than by _add)
            at: dict[str, list[str]] = {}
            for m in self.members.values():
                at.setdefault(m.address, []).append(m.peer_id)
            self._at = (len(self.members), at)
        return [self.members[p] for p in self._at[1].get(address, ()) if p in self.members]

    def _add(self, m: Member) -> None:
        """A new member in the view (and in the address index and the join's counts)."""
        fresh = self._at[0] == len(self.members)
        self._count(m, +1)
        self._confirmed_n += m.confirmed
        m.heard_pause = self._paused_s
        self.members[m.peer_id] = m
        self._ids.append(m.peer_id)
        if fresh:
            self._at[1].setdefault(m.address, []).append(m.peer_id)
            self._at = (len(self.members), self._at[1])

    def _set(self, m: Member, status: str | None = None, greeted: bool | None = None) -> None:
        """``m``'s status or greeting changes: every such change goes through here, so
        the join's counts follow (:meth:`join_counts`)."""
        if (status is None or status == m.status) and (greeted is None or greeted == m.greeted):
            return
        self._count(m, -1)
        if status is not None and (status in (ALIVE, SUSPECT)) != (m.status in (ALIVE, SUSPECT)):
            # Our pauses move the silence of live members only (:meth:`paused`): a member
            # that stops being live keeps its clock where it is, one live again restarts it.
            if status in (ALIVE, SUSPECT):
                m.heard_pause = self._paused_s
            else:
                m.last_heard, m.heard_pause = self.heard_at(m), self._paused_s
        if status is not None:
            m.status = status
            if status in (DEAD, LEFT) and m.confirmed:
                self._gone_at.setdefault(m.peer_id, -1.0)  # (its time: the next tick's)
            elif status == ALIVE:
                self._gone_at.pop(m.peer_id, None)
                if m.peer_id in self._unwitnessed:  # it speaks for itself again
                    self._unwitnessed.discard(m.peer_id)
                    self._enter_order((m.peer_id,))
        if greeted is not None:
            m.greeted = greeted
        self._count(m, +1)

    def readmit(self, peer_id: str) -> bool:
        """A member ended by the allow-list (:meth:`left`) is on it again: held dead,
        not left, so that its next message at the same incarnation brings it back (a
        goodbye's end is for good), and greeted anew. Returns whether it changed."""
        m = self.members.get(peer_id)
        if m is None or m.status != LEFT:
            return False
        self._set(m, status=DEAD, greeted=False)
        self._touch()
        return True

    def set_status(self, peer_id: str, status: str) -> None:
        """Force a member's status, as a test or a tool sets up a view (the protocol
        itself changes it only on evidence: heard_from, tick, hear_news, left)."""
        self._set(self.members[peer_id], status=status)

    def set_greeted(self, peer_id: str, greeted: bool = True) -> None:
        """Force whether our handshake with a member completed (tests, tools)."""
        self._set(self.members[peer_id], greeted=greeted)

    def _count(self, m: Member, sign: int) -> None:
        """``m`` (as it is now) in the counts (``sign`` +1), or out of them (-1)."""
        peer_id, status, greeted = m.peer_id, m.status, m.greeted
        self._join_changes += 1
        if status in (ALIVE, SUSPECT):
            self._live_n += sign
        if status == ALIVE and greeted:
            if sign > 0:
                self._greeted_alive[peer_id] = None
            else:
                self._greeted_alive.pop(peer_id, None)
        # Gone, for the join: it said goodbye, or we heard from it ourselves and it died
        # since (a member reported dead by others counts the same way: join_counts). A
        # member that died while the cohort formed had the peers that met it wait
        # join_timeout_s for it, while those that never met it counted it gone and
        # started: the two halves ran their rounds apart, each below the quorum
        # (hfl.sim.protocol, one of 5 peers lost at t=0.5 s).
        gone = self._gone(m)
        if gone:
            self._left_n += sign
        if greeted or gone:
            self._arrived_n += sign

    @staticmethod
    def _gone(m: Member) -> bool:
        """Counted gone by :meth:`_count` (left, or dead after we heard from it)."""
        return m.status == LEFT or (m.status == DEAD and m.confirmed)

    def join_counts(self) -> tuple[Collection[str], int, int]:
        """(members greeted and alive, members gone, members arrived), for the join.

        *Greeted*: we completed a handshake with it. *Gone*: it said goodbye (to us, or
        to a member that told us of a peer we never met: a fast solo peer can finish
        before a slow one greets it), or ``reports_needed`` members report it no
        longer alive (:attr:`reported`: it joins the rotation order), or we heard from
        it ourselves and it is dead now; either way it was in the cohort and there is
        nothing to wait for (it joins late if it comes back). *Arrived*: greeted
        (whatever its status now) or gone, a count that only grows. O(1) but for the
        peers only reported (few: each is one no member of ours ever greeted).
        With :attr:`lazy` the join needs no handshake: *gone* counts every member of the
        rotation order (heard from by us, or vouched for by ``reports_needed`` members)
        that is not greeted and alive, and *arrived* all of them, a count that only
        grows. A member only remembered from our checkpoint and heard from by nobody
        since is not counted (a resumed peer waits for its bootstrap peers, as in
        ``greet``).
        The first is a live view of the view's set: read it, do not keep it."""
        if self.lazy:
            key = (self._join_changes, self._order_changes, self._version, len(self.members),
                   self.reports_needed, self._confirmed_n)
            if self._join_cache[0] != key:
                self._order_current()  # (its ids include ourselves)
                ids, members = self._order_ids, self.members
                unheard = sum(1 for p in self._remembered if p in ids
                              and (m := members.get(p)) is not None and not m.confirmed)
                known = len(ids) - 1 - unheard
                # (one reported left by enough members is in the order already; one a
                # suggestion added since is still counted: arrived only grows)
                unknown_left = sum(1 for p in self.reported_left if p not in ids)
                greeted = sum(1 for p in self._greeted_alive if p in ids)
                self._join_cache = (key, (known - greeted + unknown_left, known + unknown_left))
            return (self._greeted_alive.keys(), *self._join_cache[1])
        if not self.reported_left and not self.reported:
            return self._greeted_alive.keys(), self._left_n, self._arrived_n
        unknown_left = [p for p in self.reported_left if p not in self.members]
        departed = self._left_n + len(unknown_left)
        departed += sum(1 for p, by in self.reported.items() if len(by) >= self.reports_needed
                        and p not in self._greeted_alive and p not in self.reported_left
                        and (p not in self.members or not self._gone(self.members[p])))
        return self._greeted_alive.keys(), departed, self._arrived_n + len(unknown_left)

    def _moved(self, m: Member, address: str) -> None:
        """``m`` is at ``address`` from now on (its own word)."""
        at = self._at[1]
        if m.address in at and m.peer_id in at[m.address]:
            at[m.address].remove(m.peer_id)
        at.setdefault(address, []).append(m.peer_id)
        m.address = address

    def address_conflict(self, peer_id: str, incarnation: int, address: str | None) -> str | None:
        """Why ``peer_id`` may not claim ``address`` at ``incarnation`` (None: it may).

        A peer's address is fixed for one life: once the peer itself told us where
        it is, only a new incarnation may move it. (A second connection that says
        it is the same process somewhere else is an impostor or a stale copy.)
        """
        if address:
            for other in self._members_at(address):
                if (other.peer_id != peer_id and other.address == address and other.placed
                        and other.status in (ALIVE, SUSPECT)):
                    # Another live member's own address (issue 35): taken, the claim cost
                    # that member its link (a goodbye from the claimer closed it).
                    return (f"{peer_id} incarnation {incarnation} claims address {address!r}, "
                            f"which is {other.peer_id}'s (alive)")
        m = self.members.get(peer_id)
        if m is None or not address or address == m.address or not m.placed:
            return None
        if incarnation > m.incarnation:
            return None
        return (f"{peer_id} incarnation {incarnation} claims address {address!r}, "
                f"but that incarnation is at {m.address!r}")

    def is_current(self, peer_id: str, incarnation: int) -> bool:
        """True if a message with this incarnation is not from a stale process
        (an incarnation only suggested by gossip proves nothing either way)."""
        m = self.members.get(peer_id)
        return m is not None and (incarnation >= m.incarnation or not m.confirmed)

    def reached(self, peer_ids: Iterable[str], round: int) -> None:
        """Each of ``peer_ids`` is known to have been in ``round``: it contributed to a
        result of that round (the result's aggregator says so). Moves its round forward
        only, like a heartbeat would; never its liveness (the word is not its own). One
        call per result: its contributors are the cohort, so every peer walks N of them
        each round (a million calls a round for 1,000 peers in one process)."""
        members, live_ahead = self.members, False
        for peer_id in peer_ids:
            m = members.get(peer_id)
            if m is not None and round > m.round:
                m.round, m.epoch = round, 0
                live_ahead = live_ahead or m.status in (ALIVE, SUSPECT)
        if live_ahead:
            self._round_rose(round)

    def left(self, peer_id: str, incarnation: int) -> Change | None:
        m = self.members.get(peer_id)
        if m is None or incarnation < m.incarnation:
            return None
        old, m.incarnation = m.status, incarnation
        self._set(m, status=LEFT)
        if old == LEFT:
            return None
        m.expect_since = m.asked_at = None
        m.probes = 0
        self._owing.discard(peer_id)
        self._touch()
        self._spread(m)
        return Change(peer_id, old, LEFT, "left")

    def merge(self, records: list[MemberRecord], now: float, reporter: str | None = None
              ) -> list[str]:
        """Take suggestions from a member's gossiped view. Returns the ids new to us.

        Only peers we do not know are learned (alive, fresh timestamp, to be
        greeted and then heard directly). A known member's address, incarnation
        and status are never taken from a third party, and neither is a departure;
        for a member silent to us that gossip places elsewhere at a later
        incarnation, or for a member we never heard from that gossip places elsewhere
        than the first record we took, that place is kept as a lead (one a reporter):
        we greet it there too, so that the first member to name a peer cannot keep us
        from it by naming a wrong address.
        A member ``reporter`` knows as no longer alive, and we never heard from,
        is counted as one of its reports (:attr:`reported`).
        """
        new, entered = [], []  # (entered: reported enough to join the rotation order)
        members, me, lazy = self.members, self.self_id, self.lazy  # (a view of 1,000: per record)
        for r in records:
            peer_id = r.peer_id
            known = members.get(peer_id)
            if known is not None:  # (most records of a big view: kept lean)
                if (reporter is not None and not (known.confirmed or known.remembered)
                        and (r.status != ALIVE or (lazy and r.vouched))
                        and self._report(peer_id, reporter)):
                    entered.append(peer_id)
                elif (reporter is not None and known.vouched
                      and (r.status != ALIVE or (lazy and r.vouched))):
                    self._witness(peer_id, reporter)
                if r.status == ALIVE and r.address != known.address and (
                        not known.placed or (known.status in (SUSPECT, DEAD)
                                                and r.incarnation > known.incarnation)):
                    # Silent to us (a resubmitted job's peers all moved; or the first
                    # member to name it lied about where it is): greet it there too.
                    self._lead(known, r.address, reporter)
                continue
            if peer_id == me:
                continue
            if (reporter is not None and (r.status != ALIVE or (lazy and r.vouched))
                    and self._report(peer_id, reporter)):
                entered.append(peer_id)
            if r.status == LEFT:
                self.reported_left.add(r.peer_id)
                self._join_changes += 1
                continue
            if len(members) >= MAX_VIEW:
                self.view_full += 1
                continue
            self._add(Member(r.peer_id, r.address, r.incarnation, ALIVE, now))
            new.append(r.peer_id)
        if entered:
            self._enter_order(entered)  # (one sort for a welcome's thousand, not an insert each)
        if new or entered:
            self._touch(rounds=False)  # (suggestions are at round 0: the highest stands)
        return new

    def _lead(self, m: Member, address: str, reporter: str | None) -> None:
        """``reporter`` places ``m`` at ``address``: kept as its lead (its latest, one a
        reporter, from at most :data:`MAX_LEADS` reporters, or f + 2: one honest reporter
        beside f liars). A reporter's first lead for ``m`` is greeted at the next tick; a
        changed one waits for the next regreet, so that a member that names a new place
        in every message gets no hello a tick sent where it likes."""
        leads, key = m.leads, reporter or ""
        if leads is None:
            leads = m.leads = {}
        elif key not in leads and len(leads) >= max(MAX_LEADS, self.reports_needed + 1):
            return
        if key not in leads:
            self.fresh_leads.add(m.peer_id)
        leads[key] = address

    def take_fresh_leads(self, limit: int | None = None) -> list[Member]:
        """The members given a reporter's first lead since they were last taken, in id
        order; at most ``limit`` of them (the rest stay for the next call)."""
        if not self.fresh_leads:
            return []
        fresh = sorted(self.fresh_leads)
        if limit is not None and len(fresh) > limit:
            fresh = fresh[:limit]
            self.fresh_leads.difference_update(fresh)
        else:
            self.fresh_leads = set()
        return [self.members[p] for p in fresh if p in self.members]

    def lead_places(self, m: Member) -> list[str]:
        """Where to greet ``m`` besides its address: its leads, while it is silent to us
        (never heard from, or suspect or dead). In the order they came, each once."""
        if not m.leads or (m.placed and m.status not in (SUSPECT, DEAD)):
            return []
        return [a for a in dict.fromkeys(m.leads.values()) if a != m.address]

    def _report(self, peer_id: str, reporter: str) -> bool:
        """``reporter`` knows ``peer_id`` by its own evidence (its record said so: not
        alive, or with lazy ``vouched``), and we do not: ``reports_needed`` such
        reporters put it in the rotation order (:attr:`reported`). Returns whether this
        report did (the caller enters it)."""
        reporters = self.reported.get(peer_id)  # (no empty set built per call: a
        if reporters is None:                    # 1,000-peer join makes two million)
            reporters = self.reported[peer_id] = {reporter}
        elif reporter in reporters:
            return False
        else:
            reporters.add(reporter)
        self._join_changes += 1
        return len(reporters) == self.reports_needed

    def hint(self, peer_id: str, now: float) -> bool:
        """Our link to ``peer_id`` dropped (the transport saw its connection end, as
        when its process dies): from now on, ``hint_dead_s`` of silence (probes sent
        at once included) makes it dead, instead of ``dead_after_s``. A hint is our own
        observation, never a member's word, and never a death by itself: a member that
        lives answers a probe, or keeps talking over its own connection to us, and the
        hint is gone. Returns True when the node should probe it now."""
        m = self.members.get(peer_id)
        if self.hint_dead_s <= 0 or m is None or not m.confirmed or m.status not in (ALIVE, SUSPECT):
            return False
        last = self._hint_probed.get(peer_id)
        if last is not None and now - last < self.hint_dead_s:
            # Probed for a hint lately (a member's churn multiplied probes 4x): no new
            # hint either, whose deadline no probe would answer (a review: a member that
            # answered the first, then dropped its link again, died unprobed); an
            # unanswered hint under way stands.
            return False
        self._hinted.setdefault(peer_id, now)
        if len(self._hint_probed) > 2 * len(self.members):  # (members removed since)
            self._hint_probed = {p: t for p, t in self._hint_probed.items() if p in self.members}
        self._hint_probed[peer_id] = now
        return True

    def link_back(self, peer_id: str) -> None:
        """Our link to ``peer_id`` is up again: the hint is withdrawn (its silence goes
        by ``dead_after_s`` again)."""
        self._hinted.pop(peer_id, None)

    def paused(self, seconds: float) -> None:
        """This peer itself stood still for ``seconds`` (SIGSTOP, a swapped-out VM, a
        stalled event loop): nobody's silence over that time is evidence against
        them, since we were not listening. Called before the next :meth:`tick`, so
        a paused peer reads its inbox before it declares anyone dead.

        O(members that owe an answer): the time since each member was last heard
        from, and since our first unanswered probe to it (our pause is not its
        slowness either), leave out the pauses since (:meth:`heard_at`,
        :meth:`_asked_at`). A thousand peers in one process each stand still every
        few seconds, and each walked its whole view: 4 % of that process's CPU."""
        self._paused_s += seconds
        for p in self._owing:
            m = self.members[p]
            if m.status in (ALIVE, SUSPECT) and m.expect_since is not None:
                m.expect_since += seconds
        for peer in self._hinted:
            self._hinted[peer] += seconds

    def heard_at(self, m: Member) -> float:
        """When we last heard from ``m``, moved on by the time we stood still since."""
        return m.last_heard + (self._paused_s - m.heard_pause)

    def _asked_at(self, m: Member) -> float:
        """When our first unanswered probe to ``m`` went, moved on the same way."""
        return m.asked_at + (self._paused_s - m.asked_pause)

    def _health_up(self) -> None:
        self.health = min(self.health + 1, int(PATIENCE_MAX) - 1)

    def ran_late(self) -> None:
        """This peer's own interval came a whole interval late or more (its loop, its
        machine, is overloaded): its answers and its reading of others' answers are
        slow too, so it is slower to blame (Lifeguard: local health, one up)."""
        if self.mode == "swim":
            self._health_up()

    def tick(self, now: float) -> list[Change]:
        """Advance failure detection to time ``now``. In ``full`` mode silence counts
        from the last message; in ``swim`` mode only from an unanswered probe, against
        the timeouts stretched by :meth:`patience`."""
        changes = []
        patience = self.patience()
        suspect_s, dead_s = self.suspect_after_s * patience, self.dead_after_s * patience
        stretched = f", patience x{patience:.1f}" if patience > 1 else ""
        # swim: only members that owe an answer can change (sorted: the same order in
        # every run, whatever the hash seed): an answer to our probes, or (one that
        # never answered our hello, timing.join greet: not probed) to our hellos, which
        # go to it every tick while it owes one (:meth:`greeting`)
        watched = ([self.members[p] for p in sorted(self._owing)] if self.mode == "swim"
                   else self.members.values())
        for m in watched:
            if m.status in (DEAD, LEFT):
                continue
            hellos_only = False
            if self.mode == "swim":
                silent = now - m.expect_since
                what = "no answer to probes"
                if not (m.greeted or self.lazy):
                    # (our hellos, greeted every tick from suspect_after_s on; never made
                    # suspect by them, since suspect its sends would not wait: it may be
                    # alive and serving with its welcome lost; a cohort of 64 forming over
                    # a lossy network had a liveness violation so)
                    what, hellos_only = "no answer to our hellos", True
            else:
                silent = now - self.heard_at(m)
                what = "silent"
            if silent >= dead_s:
                changes.append(Change(m.peer_id, m.status, DEAD,
                                      f"{what} for {silent:.1f}s{stretched}", silent))
                self._set(m, status=DEAD)
                m.expect_since = None  # nothing more owed: greeted again, not probed
                m.probes = 0
                self._owing.discard(m.peer_id)
                if self.mode == "swim" and m.asked_at is not None:
                    # A probe of ours failed (Lifeguard: one up). asked_at stays: if this
                    # life answers after all, that late answer is measured too (we were
                    # too hasty); if it never does, answers in time bring health down.
                    self._health_up()
            elif silent >= suspect_s and m.status == ALIVE and not hellos_only:
                # (not a member that owes only an answer to our hellos: it may be alive
                # and serving, its welcome lost; suspect, its sends would not wait)
                changes.append(Change(m.peer_id, m.status, SUSPECT,
                                      f"{what} for {silent:.1f}s{stretched}", silent))
                self._set(m, status=SUSPECT)
            else:
                continue
            if self.mode == "swim":
                self._spread(m)
        for peer, since in sorted(self._hinted.items()):
            m = self.members.get(peer)
            if m is None or m.status not in (ALIVE, SUSPECT):
                del self._hinted[peer]
                continue
            silent = now - since
            # (nothing was heard since the hint: a message withdraws it, heard_from)
            if silent < self.hint_dead_s * patience:
                continue
            del self._hinted[peer]
            changes.append(Change(peer, m.status, DEAD, f"its link dropped {silent:.1f}s ago and "
                                  f"nothing came since, probes included{stretched}", silent))
            self._set(m, status=DEAD)
            m.expect_since = None
            m.probes = 0
            self._owing.discard(peer)
            if self.mode == "swim":
                self._spread(m)
        if self._gone_at and self._sole_witness(now):
            self._touch(rounds=False)
        if changes:
            self._touch()
        return changes

    def _sole_witness(self, now: float) -> bool:
        """Leave out of the rotation order a member that died at its join for us: heard
        from first less than ``dead_after_s`` before it went silent (dead or left), gone
        for ``dead_after_s`` (a witness's own detection and its gossip come within it),
        and witnessed by fewer than ``reports_needed`` members, ourselves included
        (:attr:`witnesses`): no member that did not hear from it itself can have it in
        its order (it needs that many reports), and the order must be the same
        everywhere. A joiner that greeted its bootstrap peer only and died had it in that
        peer's order for good and in no other's: its quorum and elections differed from
        the others' for the rest of the run (an attack review, real processes: 14 of 40
        rounds without a result there; hfl.sim.protocol with one bootstrap: learned in
        10 of 40 rounds). Not a member that lived longer for us (it greeted every member
        it knew, and each heard it itself: one lost to us alone on a one-way loss left
        our order alone, a review); not where one report is enough (f = 0: every member
        took ours); not while no member is live (their silence says nothing then). We
        still report it (:meth:`records`): the witnesses that missed each other's
        reports find each other again (when we stopped, two witnesses cut apart for a
        while left it out for good, and the others kept it: a review).
        Returns whether the order changed."""
        changed = False
        for p, since in list(self._gone_at.items()):
            m = self.members.get(p)
            if m is None or m.status not in (DEAD, LEFT) or p in self._unwitnessed:
                del self._gone_at[p]
                continue
            if since < 0:
                self._gone_at[p] = since = now
            if (self.reports_needed <= 1
                    or 1 + len(self.witnesses.get(p, ())) >= self.reports_needed
                    or self.heard_at(m) - m.confirmed_at >= self.dead_after_s):
                # witnessed enough (in every order, as in ours); or it lived past its join
                # for us: it had greeted every member it knew, and each heard it itself (a
                # member we lost alone, p4 silent to us on a one-way loss while alive to
                # the rest, left our order alone: a review)
                del self._gone_at[p]
                continue
            if now - since < self.dead_after_s or self._live_n == 0:
                # (cut off from every member, we hear no witness at all: nothing to conclude;
                # a peer cut off alone left its whole cohort out of its order)
                continue
            del self._gone_at[p]
            self._unwitnessed.add(p)
            self._order_needed = -1  # (rebuilt without it when next asked)
            self._order_changes += 1
            changed = True
        return changed

    def _witness(self, peer_id: str, reporter: str) -> None:
        """``reporter`` reports ``peer_id``, a member we know by our own evidence, gone
        (:meth:`_sole_witness`): with enough such witnesses it is back in the order."""
        if reporter == self.self_id:
            return
        by = self.witnesses.setdefault(peer_id, set())
        if reporter in by:
            return
        by.add(reporter)
        if peer_id in self._unwitnessed and 1 + len(by) >= self.reports_needed:
            self._unwitnessed.discard(peer_id)
            self._enter_order((peer_id,))
            self._touch(rounds=False)

    def patience(self) -> float:
        """swim: how many times ``suspect_after_s`` and ``dead_after_s`` this peer waits
        now, and how many intervals apart it probes: 1 to ``PATIENCE_MAX``. Lifeguard's
        local health (Dadgar et al. 2018): the larger of 1 + :attr:`health` (probes
        that failed, answers that came after ``suspect_after_s`` and intervals of our
        own that ran late, less answers within half of it) and three times the 75th
        percentile of the latest answer times over ``suspect_after_s``. On a machine so
        loaded that answers take seconds (two hundred peers on two cores) silence of a few seconds is no evidence, and every peer waits longer before it
        blames anyone, and probes less; a dead member still never answers, so it is
        still found, later. Each answer in time takes one off the health (so one real
        failure does not slow the detection of the next), and the percentile falls
        once most of the last 64 answers are in time again. Always
        1 in ``full`` mode (no probes, nothing measured)."""
        if self.mode != "swim":
            return 1.0
        if len(self.answer_times) >= ANSWER_MIN and self._typical[0] != self._answers:
            times = sorted(self.answer_times)
            self._typical = (self._answers, times[(3 * (len(times) - 1)) // 4])
        measured = 3 * self._typical[1] / self.suspect_after_s
        return min(PATIENCE_MAX, max(1.0 + self.health, measured))

    # ------------------------------------------------------------------ swim

    def expect(self, peer_id: str, now: float) -> None:
        """A probe went to ``peer_id``: it owes an answer from ``now`` (unless it
        already owed one)."""
        m = self.members.get(peer_id)
        if m is not None and m.status not in (DEAD, LEFT):
            if m.expect_since is None:
                m.expect_since = now
                self._owing.add(peer_id)
                if (m.asked_at is not None
                        and now - self._asked_at(m) >= self.dead_after_s * self.patience()):
                    # It spoke since, just never answered (a lost answer, a life back
                    # from a death we declared): a stale wait, not an answer time.
                    m.asked_at, m.probes = None, 0
            if m.asked_at is None:
                m.asked_at, m.asked_pause = now, self._paused_s
            m.probes += 1
            m.probed_at = now

    def probe_due(self, peer_id: str, now: float, interval: float) -> bool:
        """Whether to probe ``peer_id`` now: at once if it owes us nothing from our
        own probes, else after 1, 2, 4, ... intervals since the last probe. A member
        that is slow to answer (a loaded machine) is not sent one probe more each
        interval, which it would then also have to answer; it still gets several
        chances before ``dead_after_s``."""
        m = self.members.get(peer_id)
        if m is None or m.probes == 0:
            return True
        return now - m.probed_at >= interval * 2 ** (m.probes - 1) - 1e-9

    def greeting(self, peer_id: str, now: float) -> None:
        """swim, timing.join greet: our hello went to ``peer_id``, which never answered
        one (not greeted back, so never probed): it owes an answer from the first such
        hello (:meth:`tick`; any message from it pays), and is greeted again every tick
        from ``suspect_after_s`` on (:meth:`owing_hellos`). Before, one that died before it answered
        was never suspected: waited for in every round for the rest of the run, and
        kept in the rotation order of the peers that had heard it (a SWIM review: 17
        peers, a joiner lost 50 ms after its hello; a member that dropped its welcomes
        and went silent cost 11 s a round). Every tick, not backing off as probes do:
        a hello and its welcome both cross a lossy link (a review of a first version
        that watched such members by silence: 41 live members declared dead where 24
        were, 64 peers, buggified). Not while this peer joins (PeerCore.tick_greetings:
        a cohort of 200 forming so over a lossy network ran late)."""
        m = self.members.get(peer_id)
        if (self.mode != "swim" or self.lazy or m is None or m.greeted
                or m.status not in (ALIVE, SUSPECT) or m.expect_since is not None):
            return
        m.expect_since = now
        self._owing.add(peer_id)

    def owing_hellos(self, now: float) -> list[Member]:
        """The members that never answered our hello and owe an answer to it
        (:meth:`greeting`), or to news of them (:meth:`hear_news`), for
        ``suspect_after_s`` or more: greeted again every tick (before that, one hello
        is out: a thousand joiners must not greet each other every tick)."""
        if self.mode != "swim" or self.lazy:
            return []
        after = self.suspect_after_s * self.patience()
        return [m for m in (self.members[p] for p in sorted(self._owing))
                if not m.greeted and m.status in (ALIVE, SUSPECT)
                and now - m.expect_since >= after]

    def probeable(self, peer_id: str) -> bool:
        """A member to probe: alive or suspect, and it knows us (answered our hello);
        with :attr:`lazy`, one that does not yet too (the probe is then our hello)."""
        m = self.members.get(peer_id)
        return m is not None and m.status in (ALIVE, SUSPECT) and (m.greeted or self.lazy)

    def next_probe(self) -> str | None:
        """The member to probe this interval: SWIM's randomized round-robin (each
        probeable member once per pass over a fresh shuffle), so every member is
        probed within two passes and, cohort-wide, about once per interval. O(1) per
        call, O(N) once per pass."""
        for _ in range(2):
            while self._probe_order:
                p = self._probe_order.pop()
                if self.probeable(p):
                    return p
            self._probe_order = [p for p in self._ids if self.probeable(p)]
            self.rng.shuffle(self._probe_order)
        return None

    def random_members(self, k: int, rng: random.Random, ok=None) -> list[str]:
        """Up to ``k`` distinct random members for which ``ok(member)`` holds (all, if no
        ``ok``), in O(k) for a big view (a draw, not a scan)."""
        out: list[str] = []
        for p in rng.sample(self._ids, min(len(self._ids), 3 * k + 3)):
            if len(out) == k:
                break
            if ok is None or ok(self.members[p]):
                out.append(p)
        return out

    def hear_news(self, records: list[MemberRecord], sender: str, now: float) -> list[Change]:
        """Failure news piggybacked by ``sender`` (records with status suspect, dead or
        left). A member we heard from ourselves within ``suspect_after_s`` (times our
        patience) is not
        touched (we know better); otherwise it becomes *suspect* and owes us an answer
        from now: we probe it at once (then backing off), and it is dead to us only
        after ``dead_after_s`` of our own unanswered probes (times our current
        patience), as if we had suspected it ourselves from the start. News is passed on. Departures of peers we never met
        are remembered for the join count, as from gossip."""
        changes, entered = [], []
        patience = self.patience()
        for r in records:
            if r.peer_id == self.self_id or r.status == ALIVE:
                continue
            m = self.members.get(r.peer_id)
            if m is None:
                if r.status == LEFT:
                    self.reported_left.add(r.peer_id)
                    self._join_changes += 1
                continue
            if r.vouched and r.status in (DEAD, LEFT) and m.vouched:
                self._witness(r.peer_id, sender)
            if (r.vouched and r.status in (DEAD, LEFT) and not (m.confirmed or m.remembered)
                    and self._report(r.peer_id, sender)):
                # A member its sender met and holds gone: f + 1 such reports put it in our
                # rotation order, as gossip's records do (merge). With swim and greet, the
                # peers that heard a joiner that died at once had it in their order and
                # the others never did: their elections differed for good (a SWIM review,
                # 17 peers: 4 violations).
                entered.append(r.peer_id)
            if (m.status != ALIVE or (m.confirmed and r.incarnation < m.incarnation)
                    or now - self.heard_at(m) < self.suspect_after_s * patience):
                continue
            self._set(m, status=SUSPECT)
            # No credit for the reporter's silence: on a loaded machine one peer's two
            # seconds unanswered, credited to everyone it told, had the whole cohort
            # declare a live aggregator dead two seconds later.
            m.expect_since = now if m.expect_since is None else m.expect_since
            self._owing.add(m.peer_id)
            changes.append(Change(m.peer_id, ALIVE, SUSPECT, f"{sender} reports it {r.status}"))
            self._spread(m)
        if entered:
            self._enter_order(entered)
        if changes or entered:
            self._touch()
        return changes

    def _spread(self, m: Member) -> None:
        """Queue news of ``m``'s status for ~3 log2(N) piggybacked sends."""
        sends = 3 * math.ceil(math.log2(len(self.members) + 2))
        # (vouched: this peer heard from it itself, so news of its death is a report of
        # a member it met: f + 1 of them put it in a rotation order that lacks it, as a
        # gossiped record does, :meth:`hear_news`)
        record = MemberRecord(peer_id=m.peer_id, address=m.address,
                              incarnation=max(m.incarnation, 0), status=m.status,
                              vouched=int(m.confirmed and m.status in (DEAD, LEFT)))
        self.rumors[m.peer_id] = [record, sends]

    def news(self, limit: int) -> list[MemberRecord]:
        """Up to ``limit`` pieces of news for one message, the least spread first; each
        send counts against its budget, and news of a member since heard from alive is
        dropped (the member answers for itself)."""
        for p in [p for p in self.rumors if self.members[p].status == ALIVE]:
            del self.rumors[p]
        picked = sorted(self.rumors, key=lambda p: -self.rumors[p][1])[:limit]
        out = []
        for p in picked:
            entry = self.rumors[p]
            out.append(entry[0])
            entry[1] -= 1
            if entry[1] <= 0:
                del self.rumors[p]
        return out

    # ------------------------------------------------------------------ queries

    def is_live(self, peer_id: str) -> bool:
        if peer_id == self.self_id:
            return True
        m = self.members.get(peer_id)
        return m is not None and m.status in (ALIVE, SUSPECT)

    def is_dead(self, peer_id: str) -> bool:
        """Dead by this peer's own evidence (not left: a goodbye closes its link anyway)."""
        m = self.members.get(peer_id)
        return m is not None and m.status == DEAD

    def live_peers(self) -> list[str]:
        """Other members we still wait for (alive or suspect), sorted."""
        return list(self.live_ids())

    def live_ids(self) -> tuple[str, ...]:
        """:meth:`live_peers` as a tuple, rebuilt only when a member was added or changed
        status (every change of status goes through :meth:`_set`, which bumps
        ``_join_changes``): an aggregator asks on every contribution it receives."""
        key = (self._join_changes, len(self.members))
        if self._live_cache[0] != key:
            self._live_cache = (key, tuple(sorted(
                p for p, m in self.members.items() if m.status in (ALIVE, SUSPECT))))
        return self._live_cache[1]

    def live_view(self) -> list[str]:
        """Live members including ourselves, sorted."""
        return sorted([self.self_id, *self.live_peers()])

    def live_count(self) -> int:
        """``len(live_view())`` in O(1): every round's record says it."""
        return 1 + self._live_n

    def any_greeted_alive(self) -> bool:
        """Whether a member that answered our hello is alive, in O(1) (every tick asks)."""
        return bool(self._greeted_alive)

    def confirmed_count(self) -> int:
        """Members heard from themselves in this life, whatever their status now, in
        O(1) (every round's record says it: ``met_peers``)."""
        return self._confirmed_n

    def rotation_order(self) -> list[str]:
        """Ourselves and every member known by our own evidence: the aggregator
        rotation, and the base of the quorum.

        Dead members and members that said goodbye stay in the order alike (and are
        skipped when elected: neither is live), so that peers with different views of
        who is alive, who left and who has come back still agree on the order: a
        goodbye that reaches one peer before its election and another after it, or a
        member that leaves and rejoins, never splits a round's election (a rolling
        restart with SIGTERM cost a round timeout per peer while a departure shrank
        the order). A peer only suggested by gossip enters it once it speaks for
        itself: ids that never run, gossiped to some peers, can neither split the
        cohort's elections nor raise the quorum out of reach. One exception: a
        member that ``reports_needed`` members report as no longer alive (each knew
        it by its own evidence: :meth:`records`) is in the order although we never
        heard from it. A peer that joins after a member died or left must elect as
        the members that saw it (found by the protocol-level simulator, hfl.sim:
        two members lost, then a late joiner; the joiner's order lacked the dead
        member, its elections never matched the others', and no round had a result
        again).
        """
        self._order_current()
        return list(self._order)

    def _order_current(self) -> None:
        """Rebuild the rotation order (and its set) if it was built for another
        ``reports_needed``; else it is kept as members enter it (:meth:`_enter_order`)."""
        if self._order_needed != self.reports_needed:
            self._order_ids = {
                self.self_id, *(p for p, m in self.members.items() if m.vouched),
                *(p for p, by in self.reported.items() if len(by) >= self.reports_needed)
            } - self._unwitnessed
            self._order = sorted(self._order_ids)
            self._order_needed = self.reports_needed
            self._order_changes += 1

    def order_digest(self) -> int:
        """CRC-32 of the rotation order's ids, plus 1 (0 on the wire means none): a lazy
        peer's heartbeats carry it (``view``), and two peers whose digests differ ask each
        other for their views. Kept until the order changes (every heartbeat says it)."""
        self._order_current()
        if self._digest[0] != self._order_changes:
            self._digest = (self._order_changes, zlib.crc32("\n".join(self._order).encode()) + 1)
        return self._digest[1]

    def order_version(self) -> int:
        """A number that changes whenever :meth:`rotation_order` does (in O(1))."""
        self._order_current()
        return self._order_changes

    def candidate_at(self, i: int) -> str:
        """:func:`rotation_candidate` of turn ``i`` at epoch 0, without copying the
        order (in O(1))."""
        self._order_current()
        return rotation_candidate(self._order, i, 0)

    def order_size(self) -> int:
        """len(:meth:`rotation_order`) without copying it (every quorum asks)."""
        self._order_current()
        return len(self._order)

    def in_order(self, peer_id: str) -> bool:
        """Whether ``peer_id`` is in :meth:`rotation_order` (in O(1))."""
        self._order_current()
        return peer_id in self._order_ids

    def order_ids(self) -> Collection[str]:
        """The ids of :meth:`rotation_order`, as a set to test against (a scan of the
        view asks for each member): read it, do not keep it."""
        self._order_current()
        return self._order_ids

    def gossip_targets(self) -> list[str]:
        """Who to heartbeat and gossip to: every member that has not left."""
        return sorted(p for p, m in self.members.items() if m.status != LEFT)

    def address_of(self, peer_id: str) -> str | None:
        m = self.members.get(peer_id)
        return m.address if m else None

    def records(self, sample: int | None = None, rng: random.Random | None = None,
                ) -> list[MemberRecord]:
        """Our view as member records, ourselves first; with ``sample``, ourselves and
        at most ``sample - 1`` members drawn with ``rng`` (a bounded gossip)."""
        own = self._own_record()
        if sample is not None and len(self.members) > sample - 1:
            members = sorted((self.members[p] for p in self.random_members(
                max(sample - 1, 0), rng or self.rng)), key=lambda m: m.peer_id)
        else:
            if self._sorted_ids[0] != len(self.members):  # (members are never removed)
                self._sorted_ids = (len(self.members), sorted(self.members))
            members = [self.members[p] for p in self._sorted_ids[1]]
        # A member restored from a checkpoint has incarnation -1 until heard from;
        # the wire only carries incarnations >= 0. A suggestion that never answered us
        # is passed on only while alive: a record of a member no longer alive says it
        # was in the cohort (merge counts it towards the rotation order), which only
        # our own evidence can say.
        # With lazy, each record says whether we know the member by our own evidence.
        lazy = self.lazy
        return [own] + [_wire(m, int(lazy and m.vouched)) for m in members
                        if m.vouched or m.status == ALIVE]

    def vouched_since(self, start: int) -> tuple[list[MemberRecord], int]:
        """Lazy join: ourselves and the members we heard from ourselves after the first
        ``start`` of them (in the order we first did), each with ``vouched`` 1, and how
        many there are now (the asker's next ``start``). A ``start`` beyond them (we
        restarted since), or below 0, gets them all."""
        start = start if 0 <= start <= len(self._vouch_log) else 0  # (a hostile one: all)
        records = [_wire(self.members[p], 1) for p in self._vouch_log[start:]]
        return [self._own_record(), *records], len(self._vouch_log)

    def _own_record(self) -> MemberRecord:
        return MemberRecord(peer_id=self.self_id, address=self.self_address,
                            incarnation=self.incarnation)

    def welcomed(self, peer_id: str) -> None:
        """``peer_id`` answered our hello (a welcome): it knows us."""
        m = self.members.get(peer_id)
        if m is not None and not m.greeted:
            self._set(m, greeted=True)

    def _round_rose(self, round: int) -> None:
        """A member's round went up to ``round`` (the caches follow)."""
        if self._max_round is not None:
            self._max_round = max(self._max_round, round)
        self._vouched_round = None

    def live_round(self, vouchers: int = 1) -> int:
        """The highest round that ``vouchers`` live members say they reached, each of its
        own word (the ``vouchers``-th highest of their rounds; the lowest when fewer are
        live; 0 with none). With f members that may lie about their round, f + 1
        vouchers include an honest one: a member's claim of a later round alone moves
        nobody (before, one member whose heartbeats said "the last round" made every
        honest peer catch up to it and skip the whole run, silently)."""
        if vouchers <= 1:
            return self.max_live_round()
        if self._vouched_round is None or self._vouched_round[0] != vouchers:
            top = heapq.nlargest(vouchers, (m.round for m in self.members.values()
                                            if m.status in (ALIVE, SUSPECT)))
            self._vouched_round = (vouchers, top[-1] if top else 0)
        return self._vouched_round[1]

    def max_live_round(self) -> int:
        if self._max_round is None:
            self._max_round = max((m.round for m in self.members.values()
                                   if m.status in (ALIVE, SUSPECT)), default=0)
        return self._max_round


def _wire(m: Member, vouched: int) -> MemberRecord:
    """``m`` as a member record (the wire carries incarnations >= 0): the one sent last
    time while it still says the same (a welcome carries a thousand of them)."""
    w, incarnation = m.wire, max(m.incarnation, 0)
    if (w is None or w.status != m.status or w.address != m.address
            or w.incarnation != incarnation or w.vouched != vouched):
        w = m.wire = MemberRecord(peer_id=m.peer_id, address=m.address, incarnation=incarnation,
                                  status=m.status, vouched=vouched)
    return w


def elect(order: list[str], is_live, round: int, epoch: int) -> tuple[str, int] | None:
    """The aggregator for ``round``: the first live member at or after epoch ``epoch``.

    Rotation: candidate for (round, e) is ``order[(round + e) % len(order)]``, where
    ``round`` is the exchange's turn (``PeerCore.turn``: the round itself unless
    ``cohort.communicate_every`` makes some rounds local).
    Starting from ``epoch``, dead candidates are skipped by bumping the epoch,
    so every peer with the same order and liveness view elects the same peer,
    and a peer that failed over to epoch e+1 never goes back to e. Returns
    (aggregator, epoch), or None once every member has been tried.
    """
    for e in range(epoch, epoch + len(order)):
        candidate = rotation_candidate(order, round, e)
        if is_live(candidate):
            return candidate, e
    return None


def rotation_candidate(order: Sequence[str], turn: int, epoch: int) -> str:
    """The rotation's candidate for epoch ``epoch`` of the exchange whose turn is
    ``turn``: ``order[(turn + epoch) % len(order)]`` (:func:`elect`)."""
    return order[(turn + epoch) % len(order)]
