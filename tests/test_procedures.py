"""The round procedures (hfl.peer.procedures) driven by hand on a bare core.

No sockets, tasks or event loop: each test builds a core of three peers, steps one
procedure, answers what it asks (a wait with whether its condition came true, the
method's aggregate with a payload) and reads off the instructions what it decided:
whom it sent what, when it asked again, when it failed over, published, committed.
Each test names the PROTOCOL.md rule it checks.
"""

from __future__ import annotations

import logging

import numpy as np

from hfl.algorithms.base import Payload
from hfl.peer.config import TimingConfig
from hfl.peer.core import PeerCore
from hfl.peer.instructions import (
    Aggregate,
    Broadcast,
    Compute,
    CrashPoint,
    Dropped,
    EnterRound,
    JoinCompute,
    Note,
    Say,
    Send,
    SendTo,
    StartCompute,
    Wait,
)
from hfl.peer.membership import Membership
from hfl.peer.procedures import ALONE, JOINED, SHORT, RoundProcedures
from hfl.protocol import Ack, AggregateResult, Commit, Heartbeat, Knowledge

HB = TimingConfig().heartbeat_interval_s


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def peer(me: str = "p0", members: tuple[str, ...] = ("p1", "p2"), everywhere: bool = False,
         mode: str = "aggregator") -> tuple[PeerCore, RoundProcedures, Clock]:
    """A core of a cohort of ``me`` and ``members`` (all heard from in round 1), and
    its procedures on a hand-moved clock."""
    core = PeerCore(me, mode=mode, everywhere=everywhere, lookahead=2, cohort_size=3)
    core.membership = Membership(me, f"mem://{me}", 0, 2.0, 5.0)
    core.timing = TimingConfig()
    for p in members:
        core.membership.heard_from(p, 0, 0.0, address=f"mem://{p}", round=1)
    clock = Clock()
    return core, RoundProcedures(core, now=clock.now), clock


class Stepper:
    """Steps a procedure: :meth:`until` answers every instruction that needs no answer
    (sends, notes, log lines) with None and stops at the first of the given types."""

    def __init__(self, procedure) -> None:
        self.gen, self.seen, self.value, self.done = procedure, [], None, False
        self.ins = self._step(next, procedure)

    def _step(self, fn, *args):
        try:
            ins = fn(*args)
        except StopIteration as stop:
            self.done, self.value = True, stop.value
            return None
        self.seen.append(ins)
        return ins

    def answer(self, value=None):
        self.ins = self._step(self.gen.send, value)
        return self.ins

    def until(self, *types):
        for _ in range(1000):  # a procedure answered None forever (a Wait in a loop) fails here
            if self.done or isinstance(self.ins, types):
                return self.ins
            self.answer(None)
        raise AssertionError(f"still no {types} after 1000 instructions: {self.seen[-3:]}")

    def sent(self, since: int = 0) -> list[tuple[tuple[str, ...], str]]:
        """(to whom, message type) of each send since the ``since``-th instruction."""
        out = []
        for ins in self.seen[since:]:
            if isinstance(ins, Send):
                out.append(((ins.address,), ins.msg.TYPE))
            elif isinstance(ins, Broadcast):
                out.append((tuple(ins.peer_ids), ins.msg.TYPE))
        return out


def weights(v: float) -> Payload:
    return Payload(kind="weights", tensors={"w": np.full(3, v, dtype=np.float32)})


def enter(core: PeerCore, r: int) -> None:
    """Put the core and, by their heartbeats, its members in round r."""
    core.round = r
    for p in list(core.membership.members):
        core.membership.heard_from(p, 0, 0.0, round=r)


def contribution(core: PeerCore, sender: str, r: int, v: float, epoch: int = 0) -> None:
    msg = Knowledge(sender=sender, incarnation=0, round=r, kind="weights", epoch=epoch,
                    tensors={"w": np.full(3, v, dtype=np.float32)})
    assert core.handle(sender, msg, 0.0) is not None
    assert sender in core.buffer.received(r)


def serving(r: int = 1):
    """p0 as round r's elected aggregator (epoch 0 of the rotation names it)."""
    core, procs, clock = peer()
    order = core.membership.rotation_order()
    while core.candidate(order, r, 0) != "p0":
        r += 1
    enter(core, r)
    return core, procs, clock, r


def join_ending(members: tuple[str, ...], stop_if_alone: bool, resumed: bool = False,
                left: tuple[str, ...] = ()) -> str:
    """How RoundProcedures.join ends for a peer that heard of ``members`` (none greeted)
    and of ``left`` leaving, when the join's timeout passes with nobody new."""
    core, procs, clock = peer(members=members)
    core.cohort_size, core.round = 4, 2 if resumed else 1
    for p in left:
        core.membership.heard_from(p, 0, 0.0, address=f"mem://{p}")
        core.membership.left(p, 0)
    step = Stepper(procs.join(stop_if_alone=stop_if_alone))
    wait = step.until(Wait)
    assert not wait.done()
    clock.t = wait.deadline
    step.answer(False)  # the wait ran out
    assert step.done and not core.joining
    return step.value


def test_a_join_nobody_came_to_ends_alone_only_with_stop_if_alone_on_a_first_start():
    # PROTOCOL.md, Membership: node.stop_if_alone stops before round 1 if no member joined
    # in timing.join_timeout_s; one that came and left, or a resumed peer, starts short.
    assert join_ending((), stop_if_alone=True) == ALONE
    assert join_ending((), stop_if_alone=False) == SHORT
    assert join_ending((), stop_if_alone=True, resumed=True) == SHORT
    assert join_ending((), stop_if_alone=True, left=("p1",)) == SHORT
    assert join_ending(("p1",), stop_if_alone=True) == ALONE  # heard of, never greeted
    core, procs, clock = peer(members=("p1", "p2", "p3"))
    for p in ("p1", "p2", "p3"):
        core.membership.welcomed(p)
    core.cohort_size = 4
    step = Stepper(procs.join(stop_if_alone=True))
    assert step.until(Wait).done() and step.answer(True) is None and step.value == JOINED


def test_an_aggregator_publishes_once_the_contributions_are_in_and_commits_on_a_quorum_of_acks():
    # PROTOCOL.md, Commit: publish, collect acks, commit with a quorum, the commit to all.
    core, procs, clock, r = serving()
    info: dict = {}
    s = Stepper(procs.aggregate_round(r, weights(1.0), info))
    assert isinstance(s.ins, EnterRound) and s.ins.round == r  # recorded before anything goes out
    wait = s.until(Wait)
    assert not wait.done()  # p1 and p2 awaited
    contribution(core, "p1", r, 2.0)
    contribution(core, "p2", r, 3.0)
    assert wait.done()
    s.answer(True)
    agg = s.until(Aggregate)
    assert isinstance(agg, Aggregate) and sorted(agg.contributions) == ["p0", "p1", "p2"]
    mark = len(s.seen)
    s.answer(weights(2.0))
    acks = s.until(Wait)
    assert [i.kind for i in s.seen[mark:] if isinstance(i, Note)] == ["published"]
    assert s.sent(mark) == [(("p1", "p2"), "aggregate")]
    result = next(i.msg for i in s.seen if isinstance(i, Broadcast))
    assert result.contributors == ["p0", "p1", "p2"]
    digest = core.accepted[r][1]
    assert not acks.done()  # only its own ack so far
    core.handle("p1", Ack(sender="p1", incarnation=0, round=r, epoch=0, digest=digest), 0.0)
    assert acks.done()  # 2 of 3: a majority
    mark = len(s.seen)
    s.answer(True)
    s.until()
    assert s.done and list(s.value) == ["p0"]
    assert [i.kind for i in s.seen[mark:] if isinstance(i, Note)] == ["committed"]
    assert s.sent(mark) == [(("p1", "p2"), "commit")]
    assert (r, digest) in core.commits
    assert info["learned_from"] == 2 and info["contributors"] == 3


def test_an_aggregator_asks_for_a_missing_contribution_after_four_heartbeats_then_every_eight():
    # PROTOCOL.md, Rounds: a contribution lost on the way is asked for (a heartbeat with
    # "awaiting") instead of costing the whole round_timeout_s.
    core, procs, clock, r = serving()
    s = Stepper(procs.serve(r, weights(1.0), {}))
    first = s.until(Wait)
    assert first.deadline == 4 * HB
    contribution(core, "p1", r, 2.0)
    clock.t = first.deadline
    mark = len(s.seen)
    s.answer(False)
    second = s.until(Wait)
    assert s.sent(mark) == [(("p2",), "heartbeat")]
    assert next(i for i in s.seen[mark:] if isinstance(i, Broadcast)).msg.awaiting == r
    assert second.deadline == clock.t + 8 * HB


def test_a_minority_never_publishes():
    # PROTOCOL.md, Commit: below the quorum no result goes out (one side of a partition).
    core, procs, clock, r = serving()
    info: dict = {}
    s = Stepper(procs.serve(r, weights(1.0), info))
    wait = s.until(Wait)
    clock.t = core.timing.round_timeout_s + 1
    while not s.done:
        s.answer(False)
        s.until(Wait)
    assert s.value == {} and info["below_quorum"] and info["aggregator"] is None
    assert not [i for i in s.seen if isinstance(i, Aggregate)] and not s.sent()
    assert any(isinstance(i, Say) and "below the quorum" in i.template for i in s.seen)
    assert wait.deadline < clock.t


def test_a_result_a_quorum_did_not_ack_is_sent_again_to_the_silent_and_never_committed():
    # PROTOCOL.md, Commit: the result goes again after 1, 2, 4, 4 ... heartbeats to the
    # members that have not acked; without a quorum by the deadline, no commit.
    core, procs, clock, r = serving()
    info: dict = {}
    s = Stepper(procs.serve(r, weights(1.0), info))
    s.until(Wait)
    contribution(core, "p1", r, 2.0)
    contribution(core, "p2", r, 3.0)
    s.answer(True)
    s.until(Aggregate)
    s.answer(weights(2.0))
    waits = [s.until(Wait)]
    while not s.done:
        clock.t = waits[-1].deadline
        s.answer(False)
        if s.until(Wait) is not None:
            waits.append(s.ins)
    resent = [i for i in s.seen if isinstance(i, Broadcast) and i.msg.TYPE == "aggregate"]
    assert [tuple(i.peer_ids) for i in resent[1:]] == [("p1", "p2")] * (len(resent) - 1)
    gaps = [round(b.deadline - a.deadline, 6) for a, b in zip(waits, waits[1:], strict=False)]
    assert gaps[:2] == [2 * HB, 4 * HB]  # 1, 2, 4 heartbeats (the last wait ends at the deadline)
    assert s.value == {} and info["uncommitted"]
    assert not [i for i in s.seen if isinstance(i, Broadcast) and i.msg.TYPE == "commit"]
    assert not core.commits


def test_a_member_sends_to_the_elected_aggregator_and_fails_over_when_it_dies():
    # PROTOCOL.md, Rounds (fail-over): the next candidate of the rotation serves epoch 1.
    core, procs, clock = peer()
    order = core.membership.rotation_order()
    r = next(r for r in range(1, 10) if core.candidate(order, r, 0) == "p1"
             and core.candidate(order, r, 1) == "p2")
    enter(core, r)
    info: dict = {}
    s = Stepper(procs.aggregate_round(r, weights(1.0), info))
    wait = s.until(Wait)
    assert s.sent() == [(("p1",), "knowledge")] and info["aggregator"] == "p1"
    assert [i.phases for i in s.seen if isinstance(i, CrashPoint)] == [("wait", "serve")]
    assert not wait.done()
    core.membership.set_status("p1", "dead")
    assert wait.done()  # a dead aggregator ends the wait
    mark = len(s.seen)
    s.answer(True)
    s.until(Wait)
    assert core.epoch == 1 and info["aggregator"] == "p2" and info["epoch"] == 1
    assert s.sent(mark) == [(("p2",), "knowledge")]
    sent = next(i.msg for i in s.seen[mark:] if isinstance(i, Send))
    assert sent.epoch == 1
    assert any(isinstance(i, Say) and "failing over" in i.template for i in s.seen[mark:])


def test_a_member_elects_again_when_a_member_first_heard_during_the_round_moves_the_candidate():
    # PROTOCOL.md, Rounds (election): p0 elected p1 with the order (p0, p1, p2); p3 is
    # heard from during the wait and enters the order, where (r, 0)'s candidate is p2.
    # p0 sends to p2, at the same epoch, at once: p0 and a peer that elected with p3
    # named each other and each waited for the other twice round_timeout_s +
    # aggregate_grace_s, seeing it "serving" (hfl.sim.protocol, 4 peers, buggify, seed
    # 118: 13 s for one round).
    core, procs, clock = peer()
    r = next(r for r in range(1, 20)
             if core.candidate(["p0", "p1", "p2"], r, 0) == "p1"
             and core.candidate(["p0", "p1", "p2", "p3"], r, 0) == "p2")
    enter(core, r)
    info: dict = {}
    s = Stepper(procs.aggregate_round(r, weights(1.0), info))
    wait = s.until(Wait)
    assert s.sent() == [(("p1",), "knowledge")] and not wait.done()
    core.membership.heard_from("p3", 0, 0.5, address="mem://p3", round=r)  # (its hello)
    assert core.membership.rotation_order() == ["p0", "p1", "p2", "p3"]
    assert wait.done()
    mark = len(s.seen)
    s.answer(True)
    s.until(Wait)
    assert s.sent(mark) == [(("p2",), "knowledge")] and core.epoch == 0
    assert info["aggregator"] == "p2" and info["epoch"] == 0
    assert any(isinstance(i, Say) and "electing again" in i.template for i in s.seen[mark:])
    # A change of the order that keeps the candidate changes nothing.
    core, procs, clock = peer()
    r = next(r for r in range(1, 20)
             if core.candidate(["p0", "p1", "p2"], r, 0) == "p1"
             and core.candidate(["p0", "p1", "p2", "p3"], r, 0) == "p1")
    enter(core, r)
    s = Stepper(procs.aggregate_round(r, weights(1.0), {}))
    wait = s.until(Wait)
    core.membership.heard_from("p3", 0, 0.5, address="mem://p3", round=r)
    assert len(core.membership.rotation_order()) == 4 and not wait.done()


def test_elections_again_do_not_use_up_the_fail_over_attempts():
    # A review: the round tries len(order) + 1 epochs; re-elections counted as attempts,
    # so four members entering a 3-member order during the round, each moving the
    # candidate, left the peer with "no aggregator could be reached" and every candidate
    # alive.
    core, procs, clock = peer()
    r = 1
    enter(core, r)
    info: dict = {}
    s = Stepper(procs.aggregate_round(r, weights(1.0), info))
    s.until(Wait)
    pool = iter(f"p0{b}" for b in "jihgfedcba")  # (each sorts second: round 1's candidate)
    for _ in range(5):
        order = core.membership.rotation_order()
        now = core.candidate(order, r, 0)
        new = next(q for q in pool
                   if q != core.id and core.candidate(sorted([*order, q]), r, 0) not in (now, core.id))
        core.membership.heard_from(new, 0, 0.5, address=f"mem://{new}", round=r)
        s.answer(True)
        s.until(Wait)
        assert info["aggregator"] == core.candidate(core.membership.rotation_order(), r, 0)
    assert not s.done and core.epoch == 0
    assert not any(isinstance(i, Say) and "no aggregator" in i.template for i in s.seen)


def acked(contributors: list[str]):
    """p0 in a round whose aggregator is p1, once p1's result of ``contributors`` came and
    p0 acked it (its procedure waits for the commit): (core, stepper, info, round)."""
    core, procs, clock = peer()
    order = core.membership.rotation_order()
    r = next(r for r in range(1, 10) if core.candidate(order, r, 0) == "p1")
    enter(core, r)
    info: dict = {}
    s = Stepper(procs.aggregate_round(r, weights(1.0), info))
    wait = s.until(Wait)
    core.handle("p1", AggregateResult(sender="p1", incarnation=0, round=r, epoch=0,
                                      kind="weights", contributors=contributors,
                                      tensors={"w": np.ones(3, np.float32)}), 0.0)
    assert wait.done()
    s.answer(True)
    s.until(Wait)
    return core, s, info, r


def commit(core: PeerCore, s: Stepper, r: int) -> None:
    """p1 commits the result ``core`` accepted for round r; the procedure goes on to its end."""
    core.handle("p1", Commit(sender="p1", incarnation=0, round=r, epoch=0,
                             digest=core.accepted[r][1]), 0.0)
    assert s.ins.done()
    s.answer(True)
    s.until()


def test_a_member_acks_a_result_and_absorbs_it_only_once_committed():
    # PROTOCOL.md, Commit: accept (ack) first; the result is used once its aggregator
    # committed it.
    core, s, info, r = acked(["p0", "p1", "p2"])
    assert s.sent()[-1] == (("p1",), "ack")
    assert [i.kind for i in s.seen if isinstance(i, Note)] == ["took"]
    assert not s.ins.done()
    commit(core, s, r)
    assert list(s.value) == ["p1"] and info["contributors"] == 3 and info["learned_from"] == 2


def test_a_member_does_not_absorb_a_committed_result_below_its_quorum_of_the_moment():
    # PROTOCOL.md, Commit rule 3: p0 (3 members, quorum 2) acks p1's result of 2
    # contributors; before the commit comes, p3 and p4 are heard from (5 members,
    # quorum 3). The commit does not make p0 absorb it: before, it absorbed what an
    # aggregator that had not met the newcomers committed (hfl.sim.protocol, 6 peers,
    # lazy join, buggify, seed 52).
    core, s, info, r = acked(["p0", "p1"])
    assert s.sent()[-1] == (("p1",), "ack") and core.quorum() == 2
    for p in ("p3", "p4"):
        core.membership.heard_from(p, 0, 0.5, address=f"mem://{p}", round=r)
    assert core.quorum() == 3
    commit(core, s, r)
    assert s.done and s.value == {} and info["outgrown"] and info["aggregator"] is None
    warned = [i for i in s.seen if isinstance(i, Say) and "cohort grew" in i.template]
    assert len(warned) == 1 and "not absorbing p1's committed result" in warned[0].args[-1]
    # The same commit of a result that still makes the quorum is absorbed.
    core, s, info, r = acked(["p0", "p1", "p2"])
    for p in ("p3", "p4"):
        core.membership.heard_from(p, 0, 0.5, address=f"mem://{p}", round=r)
    commit(core, s, r)
    assert list(s.value) == ["p1"] and info["contributors"] == 3


def test_a_decentralized_round_sends_to_every_live_peer_and_takes_what_arrived_by_the_deadline():
    # PROTOCOL.md, Rounds: broadcast mode.
    core, procs, clock = peer(mode="broadcast")
    info: dict = {}
    s = Stepper(procs.exchange(1, weights(1.0), info))
    wait = s.until(Wait)
    assert s.sent() == [(("p1", "p2"), "knowledge")]
    contribution(core, "p1", 1, 2.0)
    assert not wait.done()
    # p2's is lost on the way: after 4 heartbeats p2 is asked for it again (a heartbeat
    # with "awaiting"), as an aggregator asks; then every 8, up to round_timeout_s.
    assert wait.deadline == 4 * HB
    clock.t = wait.deadline
    mark = len(s.seen)
    wait = s.answer(False)
    assert s.sent(mark) == [(("p2",), "heartbeat")]
    assert next(i for i in s.seen[mark:] if isinstance(i, Broadcast)).msg.awaiting == 1
    while (wait := s.until(Wait)) is not None:  # p2's never came
        clock.t = wait.deadline
        s.answer(False)
    assert clock.t == core.timing.round_timeout_s and sorted(s.value) == ["p1"]
    assert info == {"received_from": 1, "timed_out": True, "learned_from": 1}
    # p2 is late from now on, and the log says so (its wait is shorter next time)
    assert core.late == {"p2"}
    assert any("no knowledge from p2 in time" in (i.template % i.args)
               for i in s.seen if isinstance(i, Say))


def test_a_peer_that_ran_ahead_alone_and_meets_the_cohort_during_its_exchange_waits_for_it():
    # PROTOCOL.md, Rounds (wait for the cohort): p0 (broadcast) enters round 5 with p1
    # and p2 dead in its view (cut off: it ran ahead alone), so the round's start has
    # nobody to wait for. p1 is heard again during the exchange, in round 3: its round-5
    # knowledge is not awaited (two rounds behind), but p0 learned from no one, so it
    # waits for p1 to reach round 4 and then for its knowledge. Before, it ended the
    # round alone (hfl.sim.protocol, 3 peers, broadcast, buggify, seed 206: its last
    # rounds learned nothing after the heal).
    core, procs, clock = peer(mode="broadcast")
    core.round = 5  # (its members' heartbeats said round 1)
    for p in ("p1", "p2"):
        core.membership.set_status(p, "dead")
    info: dict = {}
    s = Stepper(procs.exchange(5, weights(1.0), info))
    wait = s.until(Wait)
    assert s.sent() == [((), "knowledge")] and wait.done()  # nobody to wait for
    core.membership.heard_from("p1", 0, 0.1, round=3)  # (its heartbeat, as the cut heals)
    assert core.membership.is_live("p1") and not core.awaits_any(5)
    s.answer(True)
    wait = s.until(Wait)
    assert not s.done and not wait.done()
    assert any(isinstance(i, Say) and "every other member is behind" in i.template
               for i in s.seen)
    core.membership.heard_from("p1", 0, 0.5, round=4)
    assert wait.done()
    s.answer(True)
    wait = s.until(Wait)
    assert not wait.done()  # now p1's round-5 knowledge is awaited
    contribution(core, "p1", 5, 2.0)
    assert wait.done()
    s.answer(True)
    s.until()
    assert sorted(s.value) == ["p1"] and info["learned_from"] == 1
    # The round's start waited already: no second wait in the exchange.
    core, procs, clock = peer(mode="broadcast")
    core.round = 5
    for p in ("p1", "p2"):
        core.membership.heard_from(p, 0, 0.0, round=3)
    r = Stepper(procs.wait_for_the_cohort(5))
    clock.t = r.until(Wait).deadline
    r.answer(False)
    assert r.done and r.value is False
    s = Stepper(procs.exchange(5, weights(1.0), {}))
    s.until(Wait)
    s.answer(True)
    s.until()
    assert s.done and s.value == {}


def test_a_decentralized_peer_sends_its_knowledge_again_to_a_receiver_still_awaiting_it():
    # PROTOCOL.md, Rounds: a peer that sent its knowledge for round r to the asker sends
    # it again (in a decentralized round, any of the round's receivers may ask).
    core, procs, clock = peer(mode="broadcast")
    s = Stepper(procs.exchange(1, weights(1.0), {}))
    s.until(Wait)
    sent = next(i.msg for i in s.seen if isinstance(i, Broadcast))
    ask = Heartbeat(sender="p2", incarnation=0, round=1, awaiting=1)
    assert [i for i in core.handle("p2", ask, 0.1) if isinstance(i, SendTo)] == [
        SendTo("p2", sent, "knowledge again")]
    core.round = 3  # two rounds on: round 1's knowledge is not sent again
    assert not [i for i in core.handle("p2", ask, 5.0) if isinstance(i, SendTo)]


def again(core, sender, r, t):
    """What ``core`` sends ``sender`` on its heartbeat asking for round ``r`` at ``t``."""
    ask = Heartbeat(sender=sender, incarnation=0, round=r, awaiting=r)
    return [i for i in core.handle(sender, ask, t) if isinstance(i, SendTo)]


def test_a_member_in_the_next_round_sends_the_knowledge_of_the_round_just_past_once():
    # PROTOCOL.md, awaiting (5 rev. 12): in a decentralized round, a member that moved on
    # to round 2 still holds its round-1 knowledge until it shares round 2's, and sends
    # it to a receiver that asks; once per asker (a member asking every 10 ms got a
    # model's upload every two heartbeats while the peer trained: a review).
    core, procs, clock = peer(mode="broadcast")
    core.last_round = 5
    s = Stepper(procs.exchange(1, weights(1.0), {}))
    s.until(Wait)
    core.round = 2
    assert len(again(core, "p2", 1, 1.0)) == 1
    assert not again(core, "p2", 1, 5.0) and not again(core, "p2", 1, 50.0)
    assert len(again(core, "p1", 1, 1.0)) == 1  # (another receiver: its own answer)
    # Shared round 2's: round 1's goes to each asker once still (PeerCore.asks_before);
    # p1 and p2 had their answer.
    s = Stepper(procs.exchange(2, weights(2.0), {}))
    s.until(Wait)
    assert not again(core, "p1", 1, 60.0)
    # Not with an elected aggregator: its member past the round holds no result to give.
    core, procs, clock = peer()
    core.last_round, core.round = 5, 1
    core.sent_knowledge = (frozenset({"p1", "p2"}), core.knowledge(1, weights(1.0)))
    core.round = 2
    assert not again(core, "p2", 1, 1.0)
    # With a cohort.fanout plan, only a receiver it scheduled (live or not when it sent).
    core, procs, clock = peer(mode="broadcast", members=("p1", "p2", "p3", "p4"))
    core.last_round = 5
    procs.fanout, procs.plan_key = 1, "c:0"
    s = Stepper(procs.exchange(1, weights(1.0), {}))
    s.until(Wait)
    (scheduled,) = core.sent_knowledge[0]
    core.round = 2
    others = sorted({"p1", "p2", "p3", "p4"} - {scheduled})
    assert len(again(core, scheduled, 1, 1.0)) == 1
    assert not any(again(core, p, 1, 1.0) for p in others)


def test_in_the_last_round_a_member_that_finished_without_its_knowledge_arriving_is_asked():
    # PROTOCOL.md, Rounds: p2 finished the last round (its heartbeat says round 2), but
    # its knowledge of round 1 was lost on the way. It is waited for no longer; it
    # lingers and answers an ask, so the peer asks once, briefly, and takes the answer.
    # It used to end its last round without p2, having learned nothing from it.
    core, procs, clock = peer(mode="broadcast")
    core.last_round = 1
    info: dict = {}
    s = Stepper(procs.exchange(1, weights(1.0), info))
    wait = s.until(Wait)
    contribution(core, "p1", 1, 2.0)
    core.handle("p2", Heartbeat(sender="p2", incarnation=0, round=2), 0.1)  # finished
    assert wait.done()  # nobody is awaited any more
    mark = len(s.seen)
    s.answer(True)
    grace = s.until(Wait)
    assert s.sent(mark) == [(("p2",), "heartbeat")]
    assert next(i for i in s.seen[mark:] if isinstance(i, Broadcast)).msg.awaiting == 1
    assert isinstance(grace, Wait) and grace.deadline == max(2 * HB, 0.25)
    assert not grace.done()
    contribution(core, "p2", 1, 3.0)  # its answer
    assert grace.done()
    s.answer(True)
    s.until()
    assert sorted(s.value) == ["p1", "p2"] and info["learned_from"] == 2
    # Before the last round, a member in the next round is asked the same way (it holds
    # round 1's knowledge until it shares round 2's: PeerCore.asks_again), and waited
    # for half a heartbeat: 2 peers, broadcast, buggify, hfl.sim.protocol seeds 367 and
    # 765 learned in 3 of 6 and 4 of 8 rounds without faults (PROTOCOL.md 5 rev. 12).

    def round_one(p2_round: int, p2_shared_next: bool = False):
        """Round 1 (of 5) of a broadcast peer, p1's knowledge in, p2's heartbeat saying
        ``p2_round``: (core, stepper, mark) once nobody is awaited any more."""
        core, procs, clock = peer(mode="broadcast")
        core.last_round = 5
        s = Stepper(procs.exchange(1, weights(1.0), {}))
        s.until(Wait)
        contribution(core, "p1", 1, 2.0)
        core.handle("p2", Heartbeat(sender="p2", incarnation=0, round=p2_round), 0.1)
        if p2_shared_next:
            contribution(core, "p2", 2, 3.0)
        mark = len(s.seen)
        s.answer(True)
        return core, s, mark

    core, s, mark = round_one(2)
    grace = s.until(Wait)
    assert s.sent(mark) == [(("p2",), "heartbeat")]
    assert grace.deadline == max(HB / 2, 0.25)
    s.answer(False)  # no answer: the round ends without it
    s.until()
    assert s.done and sorted(s.value) == ["p1"]
    # Nobody is asked who cannot hold it: a member past the next round (it skipped
    # round 1: restarted, caught up).
    core, s, mark = round_one(3)
    s.until()
    assert s.done and not s.sent(mark) and sorted(s.value) == ["p1"]
    # One whose round-2 knowledge came already is asked (5 rev. 14: it holds round 1's
    # still, PeerCore.sent_before; before, it was left out, and with every honest member
    # in the quorum the round was lost: hfl.sim.protocol, 4 peers, every peer
    # aggregating, a twin equivocating, seeds 126, 253, 657).
    core, s, mark = round_one(2, p2_shared_next=True)
    s.until(Wait)
    assert s.sent(mark) == [(("p2",), "heartbeat")]
    contribution(core, "p2", 1, 3.0)  # its answer
    s.answer(True)
    s.until()
    assert s.done and sorted(s.value) == ["p1", "p2"]


def test_a_member_that_shared_its_next_knowledge_still_sends_the_one_before_once():
    # PROTOCOL.md, awaiting (5 rev. 14): a quick member that shared round 2's knowledge
    # before a receiver noticed its round-1 knowledge was lost sends round 1's to that
    # receiver's ask (PeerCore.asks_before), once; not round 0's, not to a peer that was
    # not a receiver, not with an elected aggregator.
    core, procs, clock = peer(mode="broadcast", members=("p1", "p2", "p3"))
    core.last_round = 5
    s = Stepper(procs.exchange(1, weights(1.0), {}))
    s.until(Wait)
    first = core.sent_knowledge[1]
    core.round = 2
    s = Stepper(procs.exchange(2, weights(2.0), {}))
    s.until(Wait)
    assert core.sent_before == (frozenset({"p1", "p2", "p3"}), first)
    sent = again(core, "p3", 1, 1.0)
    assert [(i.peer_id, i.msg.round) for i in sent] == [("p3", 1)] and sent[0].msg is first
    assert not again(core, "p3", 1, 30.0)  # once
    core.membership.heard_from("p4", 0, 1.5, address="mem://p4", round=2)
    # met since: it went to every live member, so to it too (as PeerCore.asks_again)
    assert len(again(core, "p4", 1, 2.0)) == 1
    core.round = 3
    s = Stepper(procs.exchange(3, weights(3.0), {}))
    s.until(Wait)
    assert not again(core, "p1", 1, 40.0)  # two exchanges back: gone
    assert len(again(core, "p1", 2, 40.0)) == 1
    # After the last round only the latest is sent again (a lingering peer's uploads to
    # a member that alternated its asks doubled, a review).
    core.last_round, core.round = 3, 4
    assert not again(core, "p2", 2, 50.0)
    assert len(again(core, "p2", 3, 50.0)) == 1


def test_after_the_last_round_a_decentralized_peer_stays_for_members_still_in_it():
    # PROTOCOL.md, Rounds: a peer that finished the last round stays (aggregate_grace_s at
    # most) while members it sent its knowledge to are still in that round, answers their
    # asks for it, and leaves once they said goodbye. It used to close its links at once:
    # knowledge still queued for a slow member was lost with them, silently.
    core, procs, clock = peer(mode="broadcast")
    core.last_round = 1
    s = Stepper(procs.exchange(1, weights(1.0), {}))
    sent = next(i.msg for i in s.seen if isinstance(i, Broadcast))
    contribution(core, "p1", 1, 2.0)
    contribution(core, "p2", 1, 3.0)
    s.until(Wait)
    s.answer(True)
    s.until()
    core.round = 2  # the round loop's end: round 1 was the last
    assert core.still_in_last_round(1) == ["p1", "p2"]
    fin = Stepper(procs.finish(1))
    linger = fin.until(Wait)
    assert linger.deadline == core.timing.aggregate_grace_s and not linger.done()
    ask = Heartbeat(sender="p2", incarnation=0, round=1, awaiting=1)
    assert [i for i in core.handle("p2", ask, 0.1) if isinstance(i, SendTo)] == [
        SendTo("p2", sent, "knowledge again")]
    core.handle("p1", Heartbeat(sender="p1", incarnation=0, round=2), 0.2)  # finished too
    assert core.still_in_last_round(1) == ["p2"]
    core.membership.left("p2", 0)
    assert linger.done()
    fin.answer(True)
    fin.until()
    # Its heartbeat went to them at once (they ask at once, not four heartbeats into a
    # wait that a short aggregate_grace_s outlasted: 2 peers, buggify, broadcast seed
    # 615, every peer aggregating seed 642), then its goodbye.
    assert fin.done and [(i.peer_ids, i.msg.TYPE) for i in fin.seen if isinstance(i, Broadcast)
                         ] == [(("p1", "p2"), "heartbeat"), (("p1",), "leave")]  # (p2 left)
    assert fin.seen[0].msg.round == 2  # (past the last round: finished)
    # Members still there when aggregate_grace_s runs out: it leaves, and says so.
    core, procs, clock = peer(mode="broadcast")
    core.last_round, core.round = 1, 2
    core.sent_knowledge = (frozenset({"p1", "p2"}), sent)
    fin = Stepper(procs.finish(1))
    fin.until(Wait)
    fin.answer(False)
    fin.until()
    warned = [i for i in fin.seen if isinstance(i, Say) and i.level == logging.WARNING]
    assert len(warned) == 1 and "p1, p2" in warned[0].template % warned[0].args
    assert [i.msg.TYPE for i in fin.seen if isinstance(i, Broadcast)] == ["heartbeat", "leave"]
    # A member met after the knowledge went out to every live member may ask for it
    # (PeerCore.asks_again): the peer stays for it too (a late joiner cut off until the
    # others finished learned nothing after the heal: hfl.sim.protocol, broadcast,
    # buggify seed 134). Not where a cohort.fanout plan named the receivers.
    for to_every_member, staying in ((True, ["p1", "p2", "p3"]), (False, ["p1", "p2"])):
        core, procs, clock = peer(mode="broadcast")
        core.last_round, core.round = 1, 2
        core.sent_knowledge = (frozenset({"p1", "p2"}), sent)
        core.sent_to_every_member = to_every_member
        core.membership.heard_from("p3", 0, 0.5, address="mem://p3", round=1)  # met since
        assert core.still_in_last_round(1) == staying
    # An elected aggregator's member does not stay: the aggregator's result shows its
    # knowledge arrived (the aggregator itself stays for lacking_last_result).
    core, procs, clock = peer()
    core.sent_knowledge = (frozenset({"p1"}), sent)
    assert core.still_in_last_round(1) == []


def test_every_peer_aggregating_uses_a_result_only_if_it_covers_the_quorum():
    # PROTOCOL.md, Rounds (every peer aggregating): no result below the quorum.
    core, procs, clock = peer(everywhere=True)
    info: dict = {}
    s = Stepper(procs.round(1, weights(1.0), info))
    s.until(Wait)
    clock.t = core.timing.round_timeout_s
    s.answer(False)  # nobody's knowledge came
    agg = s.until(Aggregate)
    assert list(agg.contributions) == ["p0"]
    s.answer(weights(1.0))
    s.until()
    assert s.value == {} and info["below_quorum"]


def test_results_of_epochs_this_peer_never_reached_are_dropped_loudly():
    # PROTOCOL.md, Rounds (fail-over): a result of a later epoch is used only when this
    # peer saw the candidates before it fail.
    core, procs, clock = peer()
    order = core.membership.rotation_order()
    r = next(r for r in range(1, 10) if core.candidate(order, r, 0) == "p1"
             and core.candidate(order, r, 1) == "p2")
    late = AggregateResult(sender="p2", incarnation=0, round=r, epoch=1, kind="weights",
                           contributors=["p0", "p1", "p2"], tensors={"w": np.ones(3, np.float32)})
    enter(core, r)
    core.handle("p2", late, 0.0)
    s = Stepper(procs.discard_unused_results(r))
    s.until()
    assert [(i.code, "epoch 1 from p2" in i.reason) for i in s.seen if isinstance(i, Dropped)] == [
        ("unjustified_epoch", True)]


def calls(seen) -> list[str]:
    """The method's calls among the instructions, in order ("start local_update 2", ...)."""
    out = []
    for ins in seen:
        if isinstance(ins, Compute):
            out.append(" ".join([ins.call, *map(str, ins.args[:1])]))
        elif isinstance(ins, StartCompute):
            out.append(" ".join(["start", ins.call, *map(str, ins.args[:1])]))
        elif isinstance(ins, JoinCompute):
            out.append("join")
    return out


def run_rounds(procs: RoundProcedures, core: PeerCore, last: int, evaluate_every: int,
               absorb_raises: tuple[int, ...] = ()) -> list:
    """Rounds 1..last of a broadcast peer whose members' knowledge is always in (the
    method's absorb raising in the rounds ``absorb_raises``)."""
    seen = []
    for r in range(1, last + 1):
        enter(core, r)
        s = Stepper(procs.one_round(r, last, evaluate_every))
        while not s.done:
            ins = s.ins
            if isinstance(ins, Broadcast) and ins.msg.TYPE == "knowledge":
                for p in ("p1", "p2"):
                    contribution(core, p, r, 2.0)
            if isinstance(ins, Compute) and ins.call == "share":
                s.answer(weights(1.0))
            elif isinstance(ins, Compute) and ins.call == "absorb" and r in absorb_raises:
                s.ins = s._step(s.gen.throw, OverflowError("cannot fit 'int' into an index"))
            elif isinstance(ins, Compute | JoinCompute):
                s.answer({"loss": 1.0})
            elif isinstance(ins, Wait):
                s.answer(ins.done())
            else:
                s.answer(None)
        seen += s.seen
    return seen


def test_overlap_starts_the_next_local_step_once_the_knowledge_is_out_and_absorbs_after_it():
    # cohort.overlap (docs/runtime.md, Overlapped local steps): round r's share goes
    # out, round r+1's local step starts, the exchange waits, the step is joined, then
    # round r's absorb. Never in the last round, nor in a round that evaluates.
    core, procs, _ = peer(mode="broadcast")
    procs.overlap = True
    seen = run_rounds(procs, core, last=5, evaluate_every=3)
    assert calls(seen) == [
        "local_update 1", "share 1", "start local_update 2", "join", "absorb 1",
        "share 2", "start local_update 3", "join", "absorb 2",
        "share 3", "absorb 3", "evaluate",  # round 3 evaluates: nothing of round 4 in it
        "local_update 4", "share 4", "start local_update 5", "join", "absorb 4",
        "share 5", "absorb 5", "evaluate"]  # the last round: nothing ahead
    # The knowledge is out before the step starts: it is this round's model that teaches.
    kinds = [type(i).__name__ for i in seen if isinstance(i, Broadcast | StartCompute)]
    assert kinds[:2] == ["Broadcast", "StartCompute"]
    # Without the option: the paper's order (Algorithm 1), each round's absorb before
    # the next round's local step.
    core, procs, _ = peer(mode="broadcast")
    assert calls(run_rounds(procs, core, last=3, evaluate_every=3)) == [
        "local_update 1", "share 1", "absorb 1", "local_update 2", "share 2", "absorb 2",
        "local_update 3", "share 3", "absorb 3", "evaluate"]


def at_the_aggregate(*members: str, retry: bool = True) -> Stepper:
    """p0 serving a round with ``members``' contributions in (2.0, 3.0, ...): the stepper
    at its first Aggregate."""
    core, procs, clock, r = serving()
    procs.retry_aggregate = retry
    s = Stepper(procs.aggregate_round(r, weights(1.0), {}))
    s.until(Wait)
    for i, p in enumerate(members):
        contribution(core, p, r, 2.0 + i)
    s.answer(True)
    s.until(Aggregate)
    return s


def aggregate_raising_with_p1(error: Exception, retry: bool = True) -> tuple[Stepper, int]:
    """:func:`at_the_aggregate` with p1 in, that aggregate raising ``error``: the stepper
    at the instruction after, and where that began."""
    s = at_the_aggregate("p1", retry=retry)
    mark = len(s.seen)
    s.ins = s._step(s.gen.throw, error)
    return s, mark


def test_a_method_that_raises_on_the_members_payloads_is_a_drop_and_the_peer_goes_on():
    # PROTOCOL.md, Validation (method_error): a payload that passed the codec and the
    # method's checks but makes its absorb or aggregate raise (a member's packed layout
    # whose shape overflows, say) is a logged drop; the round goes on without that call,
    # the local model kept, and the next rounds run as before. It stopped the peer.
    core, procs, _ = peer(mode="broadcast")
    seen = run_rounds(procs, core, last=3, evaluate_every=1, absorb_raises=(2,))
    assert calls(seen) == ["local_update 1", "share 1", "absorb 1", "evaluate",
                           "local_update 2", "share 2", "absorb 2", "evaluate",
                           "local_update 3", "share 3", "absorb 3", "evaluate"]
    drops = [i for i in seen if isinstance(i, Dropped)]
    assert [d.code for d in drops] == ["method_error"]
    assert "round 2: absorbing" in drops[0].reason and "OverflowError" in drops[0].reason
    # An aggregator whose aggregate raised publishes nothing (its members fail over).
    s = at_the_aggregate("p1", "p2")
    mark = len(s.seen)
    s.ins = s._step(s.gen.throw, ValueError("cannot reshape array of size 3 into shape (2,2)"))
    s.until()
    assert s.done and s.value == {}
    assert [i.code for i in s.seen[mark:] if isinstance(i, Dropped)] == ["method_error"]
    assert not [m for m in s.sent(mark) if m[1] in ("aggregate", "commit")]


def test_an_aggregate_that_raises_leaves_out_the_member_whose_payload_makes_it_raise():
    # One member's payload that made the aggregate raise cost every member the round.
    # Each member's contribution is tried beside the aggregator's own: the one whose
    # pair raises is left out by name, and the others are aggregated and published.
    s = at_the_aggregate("p1", "p2")
    assert sorted(s.ins.contributions) == ["p0", "p1", "p2"]
    mark = len(s.seen)
    boom = ValueError("cannot reshape array of size 3 into shape (2,2)")
    tried = []
    s.ins = s._step(s.gen.throw, boom)
    while isinstance(s.ins, Aggregate) and len(s.ins.contributions) == 2:  # the pairs
        tried.append(sorted(s.ins.contributions))
        s.ins = (s._step(s.gen.throw, boom) if "p2" in s.ins.contributions
                 else s.answer(weights(1.5)))
    assert tried == [["p0", "p1"], ["p0", "p2"]]
    again = s.until(Aggregate)
    assert isinstance(again, Aggregate) and sorted(again.contributions) == ["p0", "p1"]
    s.answer(weights(1.5))
    drops = [i for i in s.seen[mark:] if isinstance(i, Dropped)]
    assert [d.code for d in drops] == ["method_error"]
    assert "p2's payload raised ValueError" in drops[0].reason and "p1" not in drops[0].reason
    s.until(Wait)  # published: the result names p2 among the excluded
    published = [i.msg for i in s.seen[mark:] if isinstance(i, Broadcast)
                 and i.msg.TYPE == "aggregate"]
    assert published and published[0].meta["excluded"] == ["p2"]
    assert list(published[0].contributors) == ["p0", "p1"]
    # Every pair raising (this peer's own payload, or the method): the round's drop as
    # before, nobody named.
    s, mark = aggregate_raising_with_p1(boom)
    assert sorted(s.ins.contributions) == ["p0", "p1"]
    s.ins = s._step(s.gen.throw, boom)
    s.until()
    assert s.done and s.value == {}
    drops = [i for i in s.seen[mark:] if isinstance(i, Dropped)]
    assert [d.code for d in drops] == ["method_error"]
    assert "the members' payloads raised" in drops[0].reason
    # A method whose aggregate keeps state (FedIN's feature store) is not run again.
    s, mark = aggregate_raising_with_p1(boom, retry=False)
    s.until()
    assert s.done and not [i for i in s.seen[mark:] if isinstance(i, Aggregate)]
