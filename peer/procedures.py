"""The round procedures: what a peer does in a round that shares, as generators, no I/O.

Each procedure is a generator over the peer's :class:`~hfl.peer.core.PeerCore` that
yields instructions (:mod:`hfl.peer.instructions`) one at a time and gets each one's
answer back: a :class:`~hfl.peer.instructions.Wait` is answered with whether its
condition came true, an :class:`~hfl.peer.instructions.Aggregate` with the method's
aggregate, a send with None. The generator's return value is what the round absorbs
(``{source: payload}``; empty: nothing). Every decision of a round is made here:
whom to send to, how long to wait, when to ask again, when to fail over, what to
publish, when to commit. The shell (:class:`hfl.peer.node.Node`) only carries the
instructions out (``Node._drive``), and a test drives a procedure by hand on a bare
core and reads the instructions off it.

The procedures are PROTOCOL.md's *Rounds* and *Commit* sections:

- :meth:`RoundProcedures.exchange`: a decentralized round (broadcast mode, and every
  peer aggregating): knowledge to every live peer (or the fan-out's), then wait.
- :meth:`RoundProcedures.aggregate_round`: an elected aggregator's round, with
  fail-over; on the elected peer :meth:`RoundProcedures.serve`, on the others
  :meth:`RoundProcedures.await_commit`.
- :meth:`RoundProcedures.aggregate_everywhere`: every peer aggregates what it got.
- :meth:`RoundProcedures.sit_out`: a round an earlier life of this peer entered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Generator
from typing import Any

from hfl.algorithms.payload import Payload
from hfl.peer.core import PeerCore, payload_digest
from hfl.peer.instructions import (
    Aggregate,
    Broadcast,
    Compute,
    CrashPoint,
    Dropped,
    EnterRound,
    Instruction,
    JoinCompute,
    Note,
    RoundBegins,
    RoundDone,
    Say,
    Send,
    StartCompute,
    Wait,
)
from hfl.protocol import Ack, AggregateResult, Commit, Knowledge

WARNING, INFO, ERROR = logging.WARNING, logging.INFO, logging.ERROR

#: A procedure: yields instructions, gets their answers, returns what the round absorbs.
Procedure = Generator[Instruction, Any, dict[str, Payload]]

NO_RESULT = "no result published, keeping the local model"
#: How a join ended (:meth:`RoundProcedures.join`): enough members came; the wait ran
#: out with too few (the rounds start anyway); nobody came at all (``stop_if_alone``).
JOINED, SHORT, ALONE = "joined", "short", "alone"


def payload_of(msg: Knowledge | AggregateResult) -> Payload:
    """The method's payload a knowledge message or a result carries."""
    return Payload(kind=msg.kind, tensors=dict(msg.tensors), meta=dict(msg.meta))


class RoundProcedures:
    """One peer's round procedures over its ``core``.

    ``now`` is the shell's clock (deadlines and the times the core records are read
    from it), ``paused`` the total time the peer stood still so far (a pause moves a
    deadline on: nobody's missed deadline), ``reading_behind`` whether received
    messages wait unread (an overloaded peer). ``fanout`` and ``plan_key`` are
    ``cohort.fanout`` and the seed of its rotation (PeerCore.exchange_plan); ``overlap``
    is ``cohort.overlap`` (:meth:`one_round`)."""

    def __init__(self, core: PeerCore, *, now: Callable[[], float],
                 paused: Callable[[], float] = lambda: 0.0,
                 reading_behind: Callable[[], bool] = lambda: False,
                 fanout: int | None = None, plan_key: str = "", overlap: bool = False,
                 retry_aggregate: bool = True) -> None:
        self.core = core
        # The method's aggregate may run again on part of the contributions (it changes
        # nothing but its result): on_members_payloads then looks for the member at fault.
        self.retry_aggregate = retry_aggregate
        self.now = now
        self.paused = paused
        self.reading_behind = reading_behind
        self.fanout = fanout
        self.plan_key = plan_key
        self.overlap = overlap
        # cohort.overlap: (round, its local step's metrics) taken during the round before
        self.ahead: tuple[int, dict[str, Any]] | None = None
        # wait_for_a_quorum: a quorum was live at an exchange of this life; whether this
        # loss of it was waited out already; exchanges in a row that found it live
        self.had_quorum = False
        self.waited_for_quorum = False
        self.quorum_streak = 0
        self.waited_for_cohort = 0  # wait_for_the_cohort: the round it last waited in
        self.alone_said = False  # wait_for_the_cohort: "no member is live" said for this loss
        #: the last times (seconds) from one exchange's start to the next's, members live
        #: at both: the cohort's pace, kept by a peer alone (wait_for_the_cohort); and
        #: (when, members live) of the last exchange's start
        self.paces: list[float] = []
        self.exchanged: tuple[float, bool] | None = None

    @property
    def timing(self):
        return self.core.timing

    def say(self, level: int, template: str, *args: Any) -> Say:
        """A log line that starts with this peer's id (``template`` after ``"%s: "``)."""
        return Say(level, "%s: " + template, (self.core.id, *args))

    # ---------------------------------------------------------------- joining

    def cohort_so_far(self) -> tuple[Collection[str], int]:
        """(members greeted and alive, members gone): Membership.join_counts."""
        return self.core.membership.join_counts()[:2]

    def join(self, stop_if_alone: bool = False) -> Generator[Instruction, Any, str]:
        """Wait until the members the join needs (PeerCore.join_need, ourselves
        included) completed a handshake (and, for methods that learn on peers' public
        samples, we hold their seed sets, or refused them): :data:`JOINED` once they have.
        When none new arrived for ``timing.join_timeout_s``: :data:`ALONE` with
        ``stop_if_alone`` on a first start (not resumed: round 1) that no member at all
        joined or left (no round runs), else :data:`SHORT` (the rounds start with whoever
        came). A cohort still coming together (two hundred peers started one after
        another on a busy machine take minutes) is waited for as long as peers keep
        arriving. A resumed peer that remembers members from its checkpoint
        (Membership.remember) stops waiting as soon as everyone it remembers is known
        to be dead."""
        core = self.core
        mem, seeds = core.membership, core.seeds
        need, resumed, remembered = core.join_need(stop_if_alone), core.round > 1, mem.remembers
        if need <= 1:
            core.joining = False
            return JOINED

        def joined() -> bool:
            greeted, departed = self.cohort_so_far()
            if 1 + len(greeted) + departed >= need:  # (and their seed sets are in)
                return seeds is None or seeds.has_all(greeted, lambda p: mem.members[p].incarnation)
            # Remembering nobody (the whole cohort was stopped and said goodbye, as
            # after Ctrl-C on hfl-launch) is not "everyone is dead": wait for the
            # bootstrap peers, or a resumed cohort would split into solo peers.
            return resumed and remembered and not mem.live_peers()

        def arrived() -> int:  # greeted (whatever its status now) or departed: only grows
            return mem.join_counts()[2]

        count, since = arrived(), self.now()
        try:
            while (yield Wait(lambda c=count: joined() or arrived() > c,
                              since + self.timing.join_timeout_s)):
                if joined():
                    return JOINED
                count, since = arrived(), self.now()
            greeted, departed = self.cohort_so_far()
            return ALONE if stop_if_alone and not resumed and not greeted and not departed else SHORT
        finally:
            self.core.joining = False

    # ---------------------------------------------------------------- the run

    def rounds(self, last: int, evaluate_every: int = 1) -> Generator[Instruction, Any, None]:
        """The rounds from the core's round through ``last``, after the join: a peer that
        finds the live cohort ahead jumps to its round (PeerCore.catch_up); each round
        trains, shares and exchanges (where it communicates), absorbs what the exchange
        returned, and evaluates every ``evaluate_every`` rounds and after the last."""
        core = self.core
        yield from self.hear_the_cohort()
        while core.round <= last:
            # A new round: heartbeats say epoch 0 from here, through the waits below. They
            # said the last round's fail-over epoch during a quorum wait, and an aggregator
            # that served as the wait ended took it for this round's: "sent to another
            # aggregator", not waited for (hfl.sim.protocol, a 2|2 partition over round 2
            # healed during round 3's wait: p3 published round 3 below the quorum 0.1 s
            # after the heal, without the knowledge of p0 and p1 on its way).
            core.epoch = 0
            target = core.catch_up(last)
            if target != core.round:
                yield self.say(INFO, "catching up from round %d to the cohort's round %d",
                               core.round, target)
                core.round = target
                core.buffer.advance(target)
            if (yield from self.wait_for_a_quorum(core.round)) and core.catch_up(last) != core.round:
                continue  # (the cohort went on while we waited: catch up first)
            yield from self.wait_for_the_cohort(core.round)
            if core.communicates(core.round):  # (the cohort's pace: exchange to exchange)
                began, with_members = self.now(), core.membership.live_count() > 1
                if with_members and self.exchanged is not None and self.exchanged[1]:
                    self.paces = [*self.paces[-7:], began - self.exchanged[0]]
                self.exchanged = (began, with_members)
            yield from self.one_round(core.round, last, evaluate_every)
            core.contacts = set()
            core.round += 1
            core.buffer.advance(core.round)
            core.forget_before(core.round)

    def hear_the_cohort(self) -> Generator[Instruction, Any, None]:
        """Before the first round of this life, while a member says the cohort is ahead
        and fewer than f + 1 say so (PeerCore.cohort_round), wait up to four heartbeats
        for the others' word: a peer restarted from its checkpoint has heard from one
        member when its join ends, and ran its checkpoint's next round alone (left at
        once) before it caught up; a member that only claims to be ahead costs this
        wait once."""
        core, mem = self.core, self.core.membership
        if core.mode == "local" or mem.max_live_round() <= core.round:
            return
        yield Wait(lambda: core.cohort_round() >= mem.max_live_round(),
                   self.now() + 4 * self.timing.heartbeat_interval_s)

    def wait_for_the_cohort(self, r: int) -> Generator[Instruction, Any, bool]:
        """A peer about to exchange in round r while no other live member has reached its
        previous exchange waits for them, up to ``round_timeout_s``: it ran ahead alone
        (cut off, or faster than members that timed out on it) and would go on learning
        from no one, since nobody waits for members behind. Before catch-ups took f + 1
        members' word the cohort jumped to such a peer's round instead (hfl.sim.protocol,
        broadcast, signed, buggified seeds 106, 366, 630: a peer cut off ran ahead and
        learned nothing to the end). Any one member at its previous exchange ends the
        wait (a member's claim can only spare it, never hold it: one behind member, a
        late joiner of a cohort of three, held its aggregator a whole timeout).

        Once a round: a member behind may be heard again only during the exchange
        (:meth:`exchange` asks again when it learned from no one). True when it waited
        and a member reached the previous exchange.

        A peer with no live member at all keeps the cohort's pace, where it met members
        in this life and one of them may come back (a peer that never met one, a cohort
        of one, runs free, as does one whose members all said goodbye after the last
        round: they finished, :attr:`PeerCore.finished_by`): each exchange waits the
        median of its last times from one exchange to the next with members (:attr:`paces`,
        the local rounds of ``cohort.communicate_every`` included; ``round_timeout_s``
        before it has one) or until a member is back, so that it runs a little behind
        the cohort's pace (its own steps come on top). Cut off alone, it ran thousands of rounds
        without a result in a minute, came back thousands of rounds ahead of the cohort,
        took nothing from it again and cost it a fail-over each time it was elected (an
        attack review, peers in network namespaces, one cut off for 60 s: rounds 2,248
        to 12,160 alone, the cohort's speed 25 to 4.3 rounds a second after the heal).
        At the cohort's pace it comes back near the cohort's round, and a cohort that is
        gone for good costs it no more than the cohort's own rounds would have."""
        core = self.core
        if core.mode == "local" or not core.communicates(r) or self.waited_for_cohort == r:
            return False
        behind, mem = core.previous_exchange(r), core.membership
        runs_free = (mem.confirmed_count() == 0  # (ourselves in the order, and who finished)
                     or mem.order_size() - 1 - len(core.finished_by - {core.id}) <= 0)

        def arrived() -> bool:
            return mem.max_live_round() >= behind or (runs_free and mem.live_count() <= 1)

        if mem.live_count() > 1:
            self.alone_said = False  # (a loss after this one is said again)
        if arrived():
            return False
        self.waited_for_cohort = r
        if mem.live_count() <= 1:
            pace = (sorted(self.paces)[len(self.paces) // 2] if self.paces
                    else self.timing.round_timeout_s)
            if not self.alone_said:
                self.alone_said = True
                yield self.say(WARNING, "round %d: no member is live; keeping the cohort's pace "
                               "(an exchange per %.2fs) until members come back, rounds "
                               "without a result", r, pace)
            yield Wait(arrived, self.now() + pace)
            if mem.live_count() > 1:
                self.alone_said = False
                yield self.say(INFO, "round %d: %d member(s) live again", r, mem.live_count() - 1)
            return mem.max_live_round() >= behind
        yield self.say(INFO, "round %d: every other member is behind (at most round %d); "
                       "waiting for them (at most %.0fs)", r, mem.max_live_round(),
                       self.timing.round_timeout_s)
        yield Wait(arrived, self.now() + self.timing.round_timeout_s)
        return mem.max_live_round() >= behind

    def wait_for_a_quorum(self, r: int) -> Generator[Instruction, Any, bool]:
        """A peer about to exchange in round r while fewer members are live (itself
        included) than a result needs, where a quorum was live before in this life and
        the members that may come back would make one (all but those whose goodbye
        came after the last round: one that said goodbye mid-run is most often
        restarting, and three signed peers ran round after round without a result
        while one restarted, a review), waits up to ``round_timeout_s`` for them;
        once per loss (the quorum must be live
        at two exchanges in a row before a loss counts as new: a member back for a
        moment does not buy another wait). Returns whether it waited.

        Cut off from the cohort, a peer would otherwise run rounds alone, none with a
        result, and come back ahead of the rest, who never catch up to one member's
        word; the others, short of the quorum without it, ran theirs for nothing too
        (hfl.sim.protocol, aggregator mode, signed, buggified seed 106: with one member
        lost for good, p3 was cut off for 1.6 s, came back at round 8 while the others
        were in round 5, and rounds 5 to 7 had no result for anyone). Not where rounds
        have no quorum (broadcast: a peer learns from whoever is live, and
        :meth:`wait_for_the_cohort` keeps it from running ahead), nor for a peer that
        never had a quorum (a short join, a cohort of one: it is cut off from no one)."""
        core = self.core
        if core.mode != "aggregator" or not core.communicates(r):
            return False
        mem = core.membership

        def quorum_live() -> bool:
            return mem.live_count() >= core.quorum()

        if quorum_live():
            self.had_quorum, self.quorum_streak = True, self.quorum_streak + 1
            if self.quorum_streak >= 2:
                self.waited_for_quorum = False
            return False
        self.quorum_streak = 0
        if not self.had_quorum or self.waited_for_quorum:
            return False
        if mem.order_size() - len(core.finished_by) < core.quorum():
            return False  # (those that could come back are too few: nothing to wait for)
        self.waited_for_quorum = True
        quorum, timeout = core.quorum(), self.timing.round_timeout_s
        yield self.say(WARNING, "round %d: %d member(s) live, fewer than the quorum of %d; "
                       "waiting for members to come back (at most %gs)", r, mem.live_count(),
                       quorum, timeout)
        if (yield Wait(quorum_live, self.now() + timeout)):
            yield self.say(INFO, "round %d: %d member(s) live again: the quorum is back", r,
                           mem.live_count())
        else:
            yield self.say(WARNING, "round %d: still %d member(s) live after %gs, fewer than "
                           "the quorum of %d: going on (rounds without a result until members "
                           "come back)", r, mem.live_count(), timeout, core.quorum())
        return True

    def one_round(self, r: int, last: int, evaluate_every: int = 1
                  ) -> Generator[Instruction, Any, None]:
        """Round r: the method's local update, its share and the exchange (where the
        round communicates: ``cohort.communicate_every``), its absorb of what came back,
        its evaluation when due; the shell records the round (:class:`RoundDone`).

        With ``cohort.overlap`` (broadcast mode) the next round's local update starts
        once this round's knowledge is out and runs while the exchange waits; absorb
        follows it. Not in the last round, nor in a round that evaluates: what is
        evaluated and checkpointed is the model after this round's absorb, with no step
        of the next round in it (a restart replays nothing twice)."""
        core = self.core
        yield RoundBegins(r)
        core.round_began, core.epoch = self.now(), 0  # heartbeats say epoch 0 until a fail-over
        yield CrashPoint(r, ("train",))
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead[0] == r:
            metrics: dict[str, Any] = ahead[1]
        else:  # (a step taken for a round a catch-up skipped stays taken)
            metrics = dict((yield Compute("local_update", (r,))))
        evaluates = r % evaluate_every == 0 or r >= last
        info: dict[str, Any] = {}
        received: dict[str, Payload] = {}
        if core.communicates(r):
            payload = yield Compute("share", (r,))
            overlap = self.overlap and core.mode == "broadcast" and not evaluates
            received = yield from self.round(
                r, payload, info, StartCompute("local_update", (r + 1,)) if overlap else None)
            if overlap:  # (a cancelled round: the shell lets the step go, as any in flight)
                self.ahead = (r + 1, dict((yield JoinCompute())))
            if core.mode != "local":
                info.setdefault("learned_from", 0)  # no other peer's knowledge this round
        absorbed = (yield from self.on_members_payloads(r, Compute("absorb", (r, received)),
                                                        "absorbing")) if received else None
        if absorbed is not None:
            metrics.update(absorbed)
            if core.mode == "aggregator":
                (source, result), = received.items()
                core.note_absorbed(r, payload_digest(result), source, self.now())
                yield Note("absorbed", {"round": r, "source": source, "epoch": info.get("epoch"),
                                        "digest": core.absorbed[1],
                                        "contributors": info.get("contributors"),
                                        "quorum": core.quorum(),
                                        **({"relayed_by": info["relayed_by"]}
                                           if "relayed_by" in info else {})})
        yield Note("round", {"round": r, "learned_from": info.get("learned_from"),
                             "behind": bool(info.get("behind"))})
        evaluation = dict((yield Compute("evaluate"))) if evaluates else None
        yield RoundDone(r, metrics, evaluation, info)

    def finish(self, last: int) -> Generator[Instruction, Any, None]:
        """After the last round: its aggregator stays until its members hold the result,
        or for ``timing.aggregate_grace_s`` (a commit lost on the way can only come from
        it now); a member that may relay the result stays until the others it may relay
        to hold it (PeerCore.relaying_last_result), as long at most, and four heartbeats
        at least; in a decentralized round a peer stays while members it sent its knowledge
        to are still in the round, as long at most (PeerCore.still_in_last_round); then
        this peer says goodbye."""
        core = self.core
        if core.lacking_last_result(last) and not (yield Wait(
                lambda: not core.lacking_last_result(last),
                self.now() + self.timing.aggregate_grace_s)):
            yield self.say(WARNING, "round %d: %s still showed no sign of the last result after "
                           "timing.aggregate_grace_s=%gs; leaving", last,
                           ", ".join(core.lacking_last_result(last)), self.timing.aggregate_grace_s)
        # (a relay waits two heartbeats after the absorb: PeerCore.relay_for)
        relay_s = max(self.timing.aggregate_grace_s, 4 * self.timing.heartbeat_interval_s)
        if relayers := core.own_relayers(last):
            yield Broadcast(tuple(relayers), core.heartbeat(), 0.05)  # we hold it
        if core.relaying_last_result(last) and not (yield Wait(
                lambda: not core.relaying_last_result(last), self.now() + relay_s)):
            yield self.say(INFO, "round %d: %s showed no sign of the last result after "
                           "%gs, nor asked for it; leaving", last,
                           ", ".join(core.relaying_last_result(last)), relay_s)
        if staying := core.still_in_last_round(last):
            # Our heartbeat, at once, tells them we finished: one whose knowledge of ours
            # was lost asks for it now (finished_without), not four heartbeats into its
            # wait, after a short aggregate_grace_s had sent us away (2 peers, buggify:
            # broadcast seed 615, every peer aggregating seed 642).
            yield Broadcast(tuple(staying), core.heartbeat(), 0.05)
        if staying and not (yield Wait(
                lambda: not core.still_in_last_round(last),
                self.now() + self.timing.aggregate_grace_s)):
            yield self.say(WARNING, "round %d: %s still in the last round after "
                           "timing.aggregate_grace_s=%gs; leaving (what of ours has not reached "
                           "them is lost to their last round)", last,
                           ", ".join(core.still_in_last_round(last)), self.timing.aggregate_grace_s)
        bye = core.goodbye("finished")
        if bye is not None:
            yield bye

    # ---------------------------------------------------------------- exchanging

    def round(self, r: int, payload: Payload | None, info: dict,
              ahead: StartCompute | None = None) -> Procedure:
        """Round r's exchange, by the method's mode (a ``local`` method has none);
        ``ahead``: what a decentralized round starts once its knowledge is out."""
        core = self.core
        if core.mode == "broadcast":
            return (yield from self.exchange(r, payload, info, ahead=ahead))
        if core.mode == "aggregator" and core.everywhere:
            return (yield from self.aggregate_everywhere(r, payload, info))
        if core.mode == "aggregator":
            return (yield from self.aggregate_round(r, payload, info))
        return {}

    # ---------------------------------------------------------------- decentralized

    def exchange(self, r: int, payload: Payload | None, info: dict,
                 send: bool = True, ahead: StartCompute | None = None) -> Procedure:
        """Decentralized round: everyone's knowledge to everyone (with ``cohort.fanout``
        k: to the k peers a seeded rotation names, PeerCore.exchange_plan), until the
        deadline; ``ahead`` (cohort.overlap) starts once the knowledge is out."""
        core = self.core
        mem = core.membership
        targets, planned = mem.live_peers(), False
        receivers = targets
        if self.fanout is not None and self.fanout < len(mem.members):
            receivers, core.sources = core.exchange_plan(r, self.fanout, self.plan_key)
            targets, planned = [p for p in receivers if mem.is_live(p)], True
        if send:
            knowledge = core.knowledge(r, payload)
            # An "awaiting" from one of them asks again: with a plan, any scheduled
            # receiver (one not live in our view when it went out waits for it all the
            # same: hfl-sim, MDH-FL, fan-out 2, seed 1).
            # (asked for after we share this one)
            core.sent_before, core.sent_before_to_every = (core.sent_knowledge,
                                                           core.sent_to_every_member)
            core.sent_knowledge = (frozenset(receivers), knowledge)
            core.sent_to_every_member = not planned  # (a member met since may ask too)
            yield Broadcast(tuple(targets), knowledge)
        if ahead is not None:
            yield ahead
        yield CrashPoint(r, ("wait",))
        try:
            complete = yield from self.await_knowledge(r, self.now() + self.timing.round_timeout_s)
            if (not set(core.buffer.received(r)) - {core.id}
                    and (yield from self.wait_for_the_cohort(r))):
                # It ran ahead alone and heard the cohort again only during this round
                # (its members were dead in its view as it began): their knowledge of
                # it comes once they reach it (hfl.sim.protocol, 3 peers, broadcast,
                # buggify, seed 206: the peer cut off finished its last rounds alone).
                complete = yield from self.await_knowledge(
                    r, self.now() + self.timing.round_timeout_s)
        finally:
            core.sources = None
        got = core.buffer.received(r)
        knowledge = {p: payload_of(m) for p, m in sorted(got.items()) if m.kind != "none"}
        info.update(received_from=len(got), timed_out=not complete,
                    learned_from=len(set(knowledge) - {core.id}))
        return knowledge

    @property
    def straggler_s(self) -> float:
        """How long a member that was late before is waited for once everyone else's
        knowledge is in: ``aggregate_grace_s``, at least four heartbeats."""
        return max(self.timing.aggregate_grace_s, 4 * self.timing.heartbeat_interval_s)

    def await_knowledge(self, r: int, deadline: float) -> Generator[Instruction, Any, bool]:
        """Wait for the round-r knowledge of the members :meth:`PeerCore.awaited` names,
        until ``deadline`` (moved on by any time the peer stood still); True once none is
        awaited. A contribution lost on the way (a lossy link, a reconnect) would cost
        the whole round_timeout_s: after 4, 8, 8, ... heartbeats the members still
        awaited are asked for it (a heartbeat with ``awaiting``; one that has sent it to
        us sends it again, one still training ignores it). In a decentralized round two
        peers that each lost the other's knowledge waited for each other until the
        timeout, while a partitioned peer ran the rest of the run ahead of them alone
        (found by hfl.sim.protocol, broadcast mode, buggify seed 106)."""
        core = self.core
        hb = self.timing.heartbeat_interval_s
        ask_after, paused0 = 4 * hb, self.paused()
        # Members late before (the core's ``late``) are waited for only straggler_s once
        # every other awaited member's knowledge is in: first the others (``everyone``
        # False), then all of them until ``until``.
        everyone, until = not core.late, float("inf")
        while True:
            end = min(deadline + (self.paused() - paused0), until)
            complete = yield Wait(lambda all_=everyone: not core.awaits_any(r, late_too=all_),
                                  min(end, self.now() + ask_after))
            if complete and not everyone:
                if not core.awaits_any(r):
                    return True
                everyone, until = True, self.now() + self.straggler_s
                continue
            if complete and (r == core.last_round or not core.elected) and (
                    gone := core.finished_without(r)):
                # Members past the round without their knowledge reaching us (lost on the
                # way) are waited for no longer, but they answer one ask (after the run
                # they linger for it): a peer's last round learned nothing when its only
                # other member's knowledge was lost on a one-way link (hfl.sim.protocol,
                # every peer aggregating, 2 peers, seed 3), and in a decentralized round
                # a knowledge lost to a member already past the round was never asked for
                # (2 peers, broadcast, buggify, seeds 367 and 765: learning in 3 of 6
                # and 4 of 8 rounds without faults, under reordering and 20 % loss). A
                # finished member answers from its linger, within two heartbeats; a
                # member in the next round answers at once, if at all (one that skipped
                # the round never held it: two heartbeats for nothing cost the next
                # round, hfl-sim, MDH-FL, fan-out 2, seed 1), so the wait there is half
                # a heartbeat.
                yield Broadcast(tuple(gone), core.heartbeat(awaiting=r), 0.05)
                yield Wait(lambda: not core.finished_without(r), self.now() + max(
                    2 * hb if r == core.last_round else hb / 2, 0.25))
                return True
            if complete or self.now() >= end:
                if not complete:  # whoever still owes us its knowledge is late from now on
                    newly = sorted(set(core.awaited(r)) - core.late)
                    core.late.update(newly)
                    if newly:
                        yield self.say(INFO, "round %d: no knowledge from %s in time; waited "
                                       "for only %.1fs after the others' until it sends again",
                                       r, ", ".join(newly[:8]), self.straggler_s)
                return complete
            ask_after = 8 * hb
            if self.reading_behind():
                # Messages wait unread here (an overloaded peer, a thousand contributions
                # at once): what we would ask for may be among them, and every answer is
                # a second copy on top (hfl-launch --in-process with 1,000 peers: the
                # asks and their answers kept the aggregator from ever catching up).
                continue
            yield Broadcast(tuple(core.awaited(r)), core.heartbeat(awaiting=r), 0.05)

    def aggregate_everywhere(self, r: int, payload: Payload | None, info: dict) -> Procedure:
        """A round with no aggregator: everyone's knowledge to everyone (as in broadcast
        mode), then each peer aggregates what it got itself. Nothing is acked or
        committed: each peer's aggregate is its own, and it is not published to anyone.
        A result is used only if it covers the quorum, as an aggregator's result does."""
        core = self.core
        if core.signer is not None:
            # A signed contribution is a statement: an earlier life of this peer that
            # signed round r's must not be followed by another version (it would prove
            # this peer an equivocator). Rounds entered are recorded before signing.
            if r <= core.sit_out_through:
                yield self.say(WARNING, "round %d: an earlier life of this peer may have signed "
                               "its knowledge for this round: sitting it out (no contribution)", r)
                payload, info["sat_out"] = None, True
            else:
                yield EnterRound(r)
        contributions = yield from self.exchange(r, payload, info, send=not info.get("sat_out"))
        core.note_heard(r)  # told to the others with our next contribution
        contributions = {p: c for p, c in contributions.items() if p not in core.equivocators}
        if payload is not None and payload.kind != "none":
            contributions[core.id] = payload
        result = yield from self.on_members_payloads(
            r, Aggregate(r, dict(sorted(contributions.items()))), "aggregating")
        info.update(aggregator=core.id, epoch=0, learned_from=0)
        if result is None:
            return {}
        excluded = set(result.meta.get("excluded", ()))
        used = sorted(p for p in contributions if p not in excluded)
        info.update(contributors=len(used))
        quorum = core.quorum()
        if len(used) < quorum:
            return (yield from self.short_of_quorum(r, len(used), quorum, info,
                                                    "keeping the local model"))
        info.update(learned_from=len(set(used) - {core.id}))
        return {core.id: result}

    # ---------------------------------------------------------------- elected aggregator

    def candidates(self, r: int, epoch: int) -> set[str]:
        """The other peers the rotation names for round r's epochs 0 .. ``epoch``: whom
        this peer's round depends on (and who waits on it)."""
        core = self.core
        order = core.membership.rotation_order()
        return {core.candidate(order, r, e) for e in range(min(epoch + 1, len(order)))} - {core.id}

    def aggregate_round(self, r: int, payload: Payload | None, info: dict) -> Procedure:
        """Server-style round on the aggregator elected for (r, epoch), with fail-over."""
        core = self.core
        mem, timing = core.membership, self.timing
        core.epoch = 0
        if r <= core.sit_out_through:
            return (yield from self.sit_out(r, info))
        yield EnterRound(r)
        began_at = None
        # One attempt per epoch tried; an election again at the same epoch (the order
        # grew: core.reelected) is none (a review: four members entering a 3-member
        # order during the round used up its attempts with every candidate alive).
        attempts = len(mem.rotation_order()) + 1
        while attempts > 0:
            attempts -= 1
            elected = core.elect(r)
            if elected is None:
                break
            if elected[1] != began_at:  # reached a new epoch now
                began_at, core.epoch_began = elected[1], self.now()
            aggregator, core.epoch = elected
            version = mem.order_version()  # (the order it was elected on: core.reelected)
            info.update(aggregator=aggregator, epoch=core.epoch)
            core.contacts = self.candidates(r, core.epoch)
            if aggregator == core.id:
                return (yield from self.serve(r, payload, info))
            knowledge = core.knowledge(r, payload, core.epoch)
            core.sent_knowledge = (frozenset({aggregator}), knowledge)  # an "awaiting" asks again
            core.sent_to_every_member = False
            yield Send(aggregator, knowledge, to_member=True)
            # An aggregator still behind round r (restarted, paused, catching up) may lose
            # what it got meanwhile (or never get it: it was not listening yet): once its
            # heartbeats show it in round r, the knowledge goes once more (an exact repeat
            # of a copy the receiver holds is ignored there, not counted as a drop).
            # With swim the aggregator's round is known from its last answer, which may
            # predate this round: only fresh word that it is behind counts (else a
            # thousand members would all send twice).
            resend = core.behind(aggregator, r) and (
                not core.swim or mem.members[aggregator].round_heard >= core.round_began)
            yield CrashPoint(r, ("wait", "serve"))
            deadline = self.now() + timing.round_timeout_s + timing.aggregate_grace_s
            extended = False
            # A restart of the aggregator (a new incarnation, faster than dead_after_s)
            # lost what its earlier life got: the knowledge goes to the new life again,
            # once its heartbeats show it in round r (else a whole round_timeout_s).
            sent_life = core.incarnation_of(aggregator)
            reelect = False
            while True:
                yield Wait(lambda a=aggregator, again=resend, life=sent_life, v=version: (
                    core.stop_waiting_for(a, r, again) or core.incarnation_of(a) != life
                    or core.reelected(r, a, v)), deadline)
                if core.usable_result(r) is None and core.reelected(r, aggregator, version):
                    reelect = True
                    break
                if core.incarnation_of(aggregator) != sent_life:
                    sent_life, resend = core.incarnation_of(aggregator), True
                    yield self.say(INFO, "round %d: aggregator %s restarted; our knowledge goes "
                                   "to its new life once it is in the round", r, aggregator)
                    continue
                if (resend and not core.behind(aggregator, r)
                        and core.usable_result(r) is None and mem.is_live(aggregator)):
                    resend = False
                    yield self.say(INFO, "round %d: %s reached the round; sending it our "
                                   "knowledge again", r, aggregator)
                    yield Send(aggregator, knowledge, to_member=True)
                    continue
                if (not extended and core.usable_result(r) is None
                        and core.serving(aggregator, r)
                        and aggregator not in core.late_aggregators):
                    # Its heartbeats say it is alive and serving this very epoch: it may be
                    # waiting for our knowledge (lost), or be late. Once: send it again and
                    # wait another round_timeout_s + aggregate_grace_s before failing over
                    # (found by hfl-sim --buggify seed 3022: failing over from a live, late
                    # aggregator cost the whole cohort its round).
                    # (Once per aggregator, until a result of its own comes: one that says
                    # it serves and never delivers cost each round it was elected for
                    # 2 x (round_timeout_s + aggregate_grace_s).)
                    extended = True
                    core.late_aggregators.add(aggregator)
                    yield self.say(INFO, "round %d: aggregator %s (epoch %d) is late but "
                                   "serving; sending our knowledge again and waiting once more",
                                   r, aggregator, core.epoch)
                    yield Send(aggregator, knowledge, to_member=True)
                    deadline = self.now() + timing.round_timeout_s + timing.aggregate_grace_s
                    continue
                break
            if reelect:
                yield self.say(INFO, "round %d: the rotation order changed (%d members): epoch "
                               "%d's candidate is no longer %s; electing again", r,
                               mem.order_size(), core.epoch, aggregator)
                attempts += 1  # (the order only grows: at most one per newcomer)
                continue
            if core.usable_result(r) is None and core.moved_on(r, aggregator):
                # A heartbeat can overtake the result it follows (a delayed or retried
                # send): give the result a short grace before leaving the round.
                grace = self.moved_on_grace(r)
                yield Wait(lambda: core.usable_result(r) is not None, self.now() + grace)
            result = core.usable_result(r)
            if result is not None:
                order = mem.rotation_order()
                yield Note("took", dict(
                    round=r, epoch=result.epoch, own_epoch=core.epoch,
                    passed=[(c, "self" if c == core.id else mem.members[c].status
                             if c in mem.members else "unknown")
                            for c in (core.candidate(order, r, e)
                                      for e in range(core.epoch, result.epoch))],
                    # (a result known committed, whatever its epoch: the round's one
                    # value; one a member relayed with its certificate says who)
                    **({"committed": core.accepted[r][1], **(
                        {"relayed_by": core.relayed_by[r]} if r in core.relayed_by else {})}
                       if core.committed(r) is result else {})))
                # (never back: a committed result may be of an earlier epoch, a review)
                core.epoch = max(core.epoch, result.epoch)
                if result.kind == "none":
                    yield self.say(WARNING, "round %d: aggregator %s (epoch %d) abstained: a "
                                   "result of an earlier epoch may be committed and it holds no "
                                   "copy; leaving the round without a result", r, result.sender,
                                   result.epoch)
                    info.update(aggregator=None, abstained=True)
                    yield from self.discard_unused_results(r)
                    return {}
                # (the committed result may be another than the one this peer accepted: one
                # relayed with its certificate, PeerCore.take_relayed)
                committed = yield from self.await_commit(r, result)
                if committed is not None:
                    # (outgrown: before, it absorbed what its aggregator, not yet knowing
                    # the newcomer, committed: hfl.sim.protocol --peers 6 --swim on
                    # --join lazy --buggify, seed 52)
                    taken = yield from self.absorb_committed(
                        r, committed, info, f"not absorbing {committed.sender}'s committed result")
                    yield from self.discard_unused_results(r)
                    return taken
                if not core.moved_on(r, result.sender) or core.round_still_open(r, result.sender):
                    why = ("is dead" if not mem.is_live(result.sender)
                           else "did not commit in time")
                    yield self.say(WARNING, "round %d: aggregator %s (epoch %d) %s; failing over "
                                   "with its result accepted", r, result.sender, result.epoch, why)
                    core.epoch += 1
                    continue
            if core.moved_on(r, aggregator) and not core.round_still_open(r, aggregator):
                # Its result went out while we lagged (paused, restarted, partitioned) and
                # will not come again: follow the cohort instead of failing over alone.
                yield self.say(WARNING, "round %d: the cohort is already in round %d; leaving "
                               "round %d without its result", r, core.past_round(aggregator), r)
                info.update(aggregator=None, behind=True)
                yield from self.discard_unused_results(r)
                return {}
            yield self.say(WARNING, "round %d: aggregator %s (epoch %d) %s; failing over",
                           r, aggregator, core.epoch, core.failover_reason(aggregator, r))
            core.epoch += 1
        yield self.say(ERROR, "round %d: no aggregator could be reached; keeping the local "
                       "model", r)
        info.update(aggregator=None)
        yield from self.discard_unused_results(r)
        return {}

    def sit_out(self, r: int, info: dict) -> Procedure:
        """An earlier life of this peer entered round r and may have acked a result it no
        longer knows: no contribution, no ack (as an acceptor that crashed for good).
        It waits with the cohort, and absorbs the round's result only if its aggregator
        commits it (a committed value is the round's one); it never drags the cohort on."""
        core = self.core
        yield self.say(WARNING, "round %d: an earlier life of this peer was in this round and "
                       "may have acked a result it no longer knows: sitting the round out", r)
        core.contacts = self.candidates(r, 0)
        deadline = self.now() + self.timing.round_timeout_s + self.timing.aggregate_grace_s
        yield Wait(lambda: core.committed_result(r) is not None or core.cohort_past(r), deadline)
        info.update(aggregator=None, sat_out=True)
        result = core.committed_result(r)
        return {} if result is None else (yield from self.absorb_committed(r, result, info))

    def absorb_committed(self, r: int, result: AggregateResult, info: dict,
                         outcome: str = "not absorbing its committed result") -> Procedure:
        """Take round r's ``result``, known committed (the round's one value), unless its
        contributors are below this peer's quorum of the moment (:meth:`outgrown`, which
        says ``outcome``); the round's record names who relayed it, if a member did."""
        core = self.core
        if (yield from self.outgrown(r, len(result.contributors), info, outcome)):
            return {}
        info.update(aggregator=result.sender, epoch=result.epoch,
                    contributors=len(result.contributors),
                    learned_from=len(set(result.contributors) - {core.id}),
                    **({"relayed_by": core.relayed_by[r]} if r in core.relayed_by else {}))
        return {result.sender: payload_of(result)}

    def moved_on_grace(self, r: int) -> float:
        """How long a member whose aggregator moved past round r still waits for its result
        or commit: two heartbeats (a heartbeat can overtake the message it follows), and
        four where a member that absorbed the round may relay it (PeerCore.relay_expected:
        a relay goes two heartbeats after its absorb, on the waiting member's next
        heartbeat; with two, the member left as the relays went out, hfl.sim.protocol
        --peers 5 --byzantine p3:commit --buggify, seed 967)."""
        hb = self.timing.heartbeat_interval_s
        return max(4 * hb if self.core.relay_expected(r) else 2 * hb, 0.25)

    def await_commit(self, r: int, result: AggregateResult
                     ) -> Generator[Instruction, Any, AggregateResult | None]:
        """Accept ``result`` (ack it to its aggregator) and wait until the aggregator
        commits it (a commit, or its heartbeat saying it absorbed it), dies, or the
        cohort moves past round r. Returns the committed result (another than ``result``
        where a member relayed the one the quorum acked: PeerCore.take_relayed), or None."""
        core, aggregator, timing = self.core, result.sender, self.timing
        if core.committed(r) is result:  # relayed with its certificate: nothing to ack
            return result
        digest = core.accept(result)
        yield Send(aggregator, Ack(**core.envelope(), round=r, epoch=result.epoch, digest=digest,
                                   sig=core.sign_ack(r, result.epoch, digest)), to_member=True)
        # The aggregator decides within max(aggregate_grace_s, 4 heartbeats) of publishing
        # (see serve); then its commit, or its next heartbeat, travels.
        hb = timing.heartbeat_interval_s
        deadline = self.now() + max(timing.aggregate_grace_s, 4 * hb) + 4 * hb
        yield Wait(lambda: core.committed(r) is not None
                   or not core.membership.is_live(aggregator)
                   or core.moved_on(r, aggregator), deadline)
        if core.committed(r) is None and core.moved_on(r, aggregator):
            # A heartbeat may overtake the commit it follows: a short grace.
            grace = self.moved_on_grace(r)
            yield Wait(lambda: core.committed(r) is not None, self.now() + grace)
        return core.committed(r)

    def on_members_payloads(self, r: int, call: Compute | Aggregate, what: str) -> Procedure:
        """The method's call on what members sent (absorb, aggregate): its value, or None
        where it raised. A payload that passed the codec and the method's own checks must
        never stop this peer (a member could stop every peer it sends to): the error is
        a drop (``method_error``, logged with the exception) and the round goes on
        without that call's result, the local model kept (PROTOCOL.md, Validation).
        An aggregate that raised is tried on each member's contribution beside this
        peer's own: the members whose pair raises too are left out by name, and the
        others aggregated (one member's payload cost every member the round)."""
        try:
            return (yield call)
        except Exception as err:  # noqa: BLE001 -- a drop, named; cancellations pass
            error = err
        if isinstance(call, Aggregate) and self.retry_aggregate:
            raising = yield from self.raising_members(call)
            kept = {p: c for p, c in call.contributions.items() if p not in raising}
            if raising and any(p != self.core.id for p in kept):
                for peer, err in raising.items():
                    yield Dropped("method_error", f"round {r}: {what} {peer}'s payload raised "
                                  f"{type(err).__name__}: {err}; left out")
                try:
                    result = yield Aggregate(call.round, kept)
                except Exception as err:  # noqa: BLE001 -- as the first
                    error = err
                else:
                    if result is None:
                        return None
                    excluded = sorted({*result.meta.get("excluded", ()), *raising})
                    return Payload(kind=result.kind, tensors=result.tensors,
                                   meta={**result.meta, "excluded": excluded})
        yield Dropped("method_error", f"round {r}: {what} the members' payloads raised "
                      f"{type(error).__name__}: {error}; the round goes on without it")
        return None

    def raising_members(self, call: Aggregate) -> Generator[Instruction, Any, dict]:
        """The members whose contribution, aggregated beside this peer's own (if any),
        makes the method raise: {member: the exception}."""
        own = {p: c for p, c in call.contributions.items() if p == self.core.id}
        raising = {}
        for peer, c in call.contributions.items():
            if peer == self.core.id:
                continue
            try:
                yield Aggregate(call.round, dict(sorted({**own, peer: c}.items())))
            except Exception as err:  # noqa: BLE001 -- this member's
                raising[peer] = err
        return raising

    def outgrown(self, r: int, count: int, info: dict, outcome: str
                 ) -> Generator[Instruction, Any, bool]:
        """The view grew while round r ran (a member first heard from after its result
        went out, a late joiner): ``count`` contributors are below the quorum of the
        cohort as it is now, which a commit and an absorb need as the certificate does
        (every member checks a commit against its own quorum of the moment). Says so
        and returns True: no result for this peer in round r."""
        quorum = self.core.quorum()
        if count >= quorum:
            return False
        yield self.say(WARNING, "round %d: the cohort grew while the round ran: %d "
                       "contributor(s) are below the quorum of %d now; %s, keeping the local "
                       "model", r, count, quorum, outcome)
        info.update(aggregator=None, outgrown=True)
        return True

    def short_of_quorum(self, r: int, count: int, quorum: int, info: dict,
                        outcome: str) -> Procedure:
        """Say (and record) that round r's contributions fell short of the quorum."""
        yield self.say(WARNING, "round %d: %d contribution(s), below the quorum of %d: %s",
                       r, count, quorum, outcome)
        info.update(below_quorum=True)
        return {}

    def discard_unused_results(self, r: int) -> Generator[Instruction, Any, None]:
        """Results of round ``r`` for epochs this peer never reached are dropped, loudly:
        it never saw the failures that would have made them current."""
        for res in self.core.unused_results(r):
            yield Dropped("unjustified_epoch", f"result for round {r} epoch {res.epoch} from "
                          f"{res.sender} not used: the candidates before it were alive in this "
                          "peer's view")

    def abstain(self, r: int, info: dict) -> Procedure:
        """Publish no result for (r, this peer's epoch): an abstention (``kind`` none)."""
        core = self.core
        yield Broadcast(tuple(core.membership.live_peers()), AggregateResult(
            **core.envelope(), round=r, epoch=core.epoch, kind="none"))
        info.update(aggregator=None, abstained=True)
        yield from self.discard_unused_results(r)
        return {}

    def fetch_copy(self, r: int, promised: dict, want: tuple
                   ) -> Generator[Instruction, Any, tuple[str, AggregateResult | None]]:
        """The one value to publish again is a result this peer holds no copy of (rev.
        18): ask the members that reported it (heartbeat ``wants_copy``) and wait up to
        four heartbeats for one copy (PeerCore.take_copy); then decide again. Before, it
        abstained, and an aggregator that showed its result to one member only and never
        committed it cost every round it was elected for (an attack review: 3 of 10
        rounds with 4 peers, hfl.sim.protocol's ``hide`` twin)."""
        core = self.core
        _, epoch, digest, reporters = want
        if not reporters:
            return "abstain", None
        yield self.say(INFO, "round %d: %s accepted a result of epoch %d that this peer holds "
                       "no copy of; asking for it", r, ", ".join(reporters), epoch)
        yield Broadcast(reporters, core.heartbeat(wants_copy=f"{epoch}:{digest}"))
        yield Wait(lambda: core.copy_wanted is None,
                   self.now() + 4 * self.timing.heartbeat_interval_s)
        decision, earlier, _ = core.proposal(r, promised)
        core.copy_wanted = None  # (asked once a round: not again, whatever it decided)
        return decision, earlier

    def serve(self, r: int, payload: Payload | None, info: dict) -> Procedure:
        """This peer is the aggregator of (r, epoch): wait for the contributions,
        publish (its own aggregate, or a result accepted at an earlier epoch again, or
        an abstention: PeerCore.proposal), then commit once a quorum acked it."""
        core = self.core
        mem, timing = core.membership, self.timing
        deadline = self.now() + timing.round_timeout_s
        # A contribution lost on the way (a lossy link, a reconnect) cost the whole
        # round_timeout_s: after 4, 8, 8, ... heartbeats the members still awaited are
        # asked for it (a heartbeat with ``awaiting``; one that has sent it here sends
        # it again, one still training ignores it).
        complete = yield from self.await_knowledge(r, deadline)
        promised = core.promises(r)
        decision, earlier, refused = core.proposal(r, promised)
        for liar, why in refused.items():
            # (with signing keys: a promise not signed, or a report without its proof)
            yield Dropped("unproven_promise" if core.certifying else "lying_claim",
                          f"round {r}: left out {liar}'s contribution: {why}")
            del promised[liar]
        quorum = core.quorum()
        yield CrashPoint(r, ("serve",))
        info.update(timed_out=not complete)
        if 1 + len(promised) < quorum:
            # A minority (one side of a partition, a lone restarted peer) never publishes.
            if (done := core.committed_result(r)) is not None:
                # The others failed over past this peer's epoch (it was cut off, or
                # behind) and committed a result there: that is the round's one value.
                # Before, a peer that came back as its own epoch's candidate in the last
                # round kept its local model (hfl.sim.protocol --peers 4 --signed
                # --communicate-every 3 --buggify, seed 417).
                yield self.say(INFO, "round %d: too few contributions to aggregate, and %s's "
                               "result of epoch %d is committed: taking it", r, done.sender,
                               done.epoch)
                return (yield from self.absorb_committed(r, done, info))
            info.update(aggregator=None, contributors=1 + len(promised))
            yield from self.discard_unused_results(r)
            return (yield from self.short_of_quorum(r, 1 + len(promised), quorum, info, NO_RESULT))
        if decision == "abstain" and (want := core.copy_wanted) is not None and want[0] == r:
            decision, earlier = yield from self.fetch_copy(r, promised, want)
        if decision == "abstain":
            yield self.say(WARNING, "round %d: a contributor accepted a result of an earlier "
                           "epoch that this peer holds no copy of; abstaining at epoch %d",
                           r, core.epoch)
            return (yield from self.abstain(r, info))
        if decision == "repeat":
            yield self.say(INFO, "round %d: publishing %s's result of epoch %d again at epoch %d "
                           "(a contributor accepted it)", r, earlier.sender, earlier.epoch,
                           core.epoch)
            result = payload_of(earlier)
            used = list(earlier.contributors)
        else:
            contributions = {p: payload_of(m) for p, m in promised.items() if m.kind != "none"}
            if payload is not None:
                contributions[core.id] = payload
            result = yield from self.on_members_payloads(r, Aggregate(r, contributions),
                                                         "aggregating")
            if result is None:
                yield from self.discard_unused_results(r)
                return {}
            excluded = set(result.meta.get("excluded", ()))
            used = sorted(p for p in contributions if p not in excluded)  # only what went in
        yield from self.discard_unused_results(r)
        info.update(contributors=len(used))
        if len(used) < quorum:
            info.update(aggregator=None)
            return (yield from self.short_of_quorum(r, len(used), quorum, info, NO_RESULT))
        msg = core.signed_result(AggregateResult(
            **core.envelope(), round=r, epoch=core.epoch, kind=result.kind, contributors=used,
            meta=result.meta, tensors=result.tensors), promised)
        if core.epoch > 0 and core.certifying and (why := core.unjustified_result(msg)):
            # (each promise and proof was checked as it came: this is a bug, or a view that
            # changed meanwhile; every member would refuse it, so it is not sent)
            yield self.say(WARNING, "round %d: this peer's own result of epoch %d would be "
                           "refused: %s; abstaining", r, core.epoch, why)
            return (yield from self.abstain(r, info))
        digest = core.accept(msg)
        core.expect_acks(r, core.epoch, digest)
        yield Note("published", dict(round=r, epoch=core.epoch, contributors=len(used),
                                     quorum=quorum, digest=digest))
        yield Broadcast(tuple(mem.live_peers()), msg)
        # Acks come one round trip after the result arrives: wait aggregate_grace_s (the
        # time a result is given to travel), at least four heartbeats, and send the
        # result again to the live members that have not acked (a lost result or a lost
        # ack must not cost the whole cohort its round) after 1, 2, 4, 4, ... heartbeats:
        # acks that are only slow (a loaded machine, a big cohort) must not be answered
        # with a copy of the result per member each heartbeat, queued for each of them.
        epoch, hb = core.epoch, timing.heartbeat_interval_s
        deadline = self.now() + max(timing.aggregate_grace_s, 4 * hb)
        wait = hb
        while True:
            # (the quorum read again: a member that joined meanwhile raised it, and every
            # member checks a commit against its own quorum of the moment)
            acked = yield Wait(lambda: (core.acked(r, epoch, digest) >= core.quorum()
                                        or core.acks_out_of_reach(r, epoch, digest,
                                                                  core.quorum())),
                               min(deadline, self.now() + wait))
            if acked or self.now() >= deadline:
                break
            yield Broadcast(tuple(core.not_acked(r, epoch, digest)), msg)
            wait = min(2 * wait, 4 * hb)  # (a copy lost late still gets another)
        # (before, this aggregator committed and absorbed a result the others refused:
        # hfl.sim.protocol signed buggify seed 69)
        if (yield from self.outgrown(r, len(used), info, "not committing")):
            info.update(uncommitted=True)
            return {}
        quorum = core.quorum()
        if core.acked(r, epoch, digest) < quorum:
            yield self.say(WARNING, "round %d: %d of the %d acks a commit needs %s; not "
                           "committing, keeping the local model", r, core.acked(r, epoch, digest),
                           quorum, "arrived in time" if not acked else "before the cohort moved on")
            info.update(aggregator=None, uncommitted=True)
            return {}
        core.commits.add((r, digest))
        yield Note("committed", dict(round=r, epoch=epoch, digest=digest))
        yield CrashPoint(r, ("commit",))  # decided, and nobody told yet
        commit = Commit(**core.envelope(), round=r, epoch=epoch, digest=digest,
                        certificate=core.certificate(r, epoch, digest))
        core.committed_as_aggregator(commit, msg, self.now())
        yield Broadcast(tuple(mem.live_peers()), commit)
        info.update(learned_from=len(set(used) - {core.id}))
        return {core.id: result}
