"""PROTOCOL.md rules that had no test, each checked on a bare core.

An audit of PROTOCOL.md against the tests found rules no test asserted, and rules
asserted only through a whole Node. Each test here builds a PeerCore in one line
(tests/test_core_handle.py's ``bare``), or steps a round procedure by hand on a
hand-moved clock (tests/test_procedures.py's ``Stepper``), hands it messages and
reads the instructions it returns (hfl.peer.instructions) or its state. Each starts
with the rule it checks, quoted from PROTOCOL.md (section named). No sockets, no
event loop (but for the one rule that lives in peer/outbox.py), no real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter

import numpy as np

from hfl.peer.config import TimingConfig
from hfl.peer.core import SHARED_ABSENT, payload_digest
from hfl.peer.instructions import (
    Aggregate,
    Broadcast,
    Dropped,
    MemberChanged,
    Reply,
    Say,
    Send,
    Wait,
)
from hfl.peer.membership import Membership
from hfl.peer.outbox import Outbox
from hfl.peer.status import class_names_term
from hfl.protocol import (
    DEFAULT_MAX_MESSAGE_MIB,
    Ack,
    AggregateResult,
    Gossip,
    Heartbeat,
    Knowledge,
    Limits,
    MemberRecord,
    Welcome,
)
from tests.test_core_handle import TERMS, bare, hello
from tests.test_procedures import HB, Stepper, contribution, enter, peer, weights

AUTHENTICATED = frozenset({"p0", "p1", "p2", "p9"})  # an allow-list: p9 is a member's key


def drops(out) -> list[str]:
    return [i.code for i in out if isinstance(i, Dropped)]


def welcome_of(out) -> Welcome:
    (reply,) = [i for i in out if isinstance(i, Reply)]
    assert isinstance(reply.msg, Welcome), out
    return reply.msg


def result(sender: str, r: int, epoch: int, contributors=("p0", "p1", "p2"), kind="weights",
           value: float = 1.0) -> AggregateResult:
    tensors = {} if kind == "none" else {"w": np.full(3, value, np.float32)}
    return AggregateResult(sender=sender, incarnation=0, round=r, epoch=epoch, kind=kind,
                           contributors=list(contributors), tensors=tensors)


# ---------------------------------------------------------------------------- hello


def test_a_shared_term_left_out_means_its_default_and_a_refusal_names_that_default():
    # PROTOCOL.md, hello: "A key that is absent means its default (`communicate_every` 1,
    # `overlap` and `aggregate_everywhere` 0, `max_message_mib` 256:
    # `hfl.peer.core.SHARED_ABSENT`): a refusal names that value, and a peer that sends
    # the default explicitly agrees with one that leaves it out."
    defaults = {"communicate_every": 1, "overlap": 0, "aggregate_everywhere": 0,
                "max_message_mib": 256}
    assert DEFAULT_MAX_MESSAGE_MIB == 256
    assert {k: SHARED_ABSENT[k] for k in defaults} == defaults
    for key, default in defaults.items():
        explicit = {"num_parameters": 100, key: default}
        # theirs explicit, ours absent; ours explicit, theirs absent: agreed both ways
        core = bare()
        out = core.handle("p9", hello(shared=explicit), 1.0)
        assert not drops(out) and welcome_of(out).sender == "p0", key
        core = bare()
        core.hello_terms = {**TERMS, "shared": explicit}
        out = core.handle("p9", hello(), 1.0)
        assert not drops(out) and welcome_of(out).sender == "p0", key
        # another value than the default, against ours left out: the refusal names the
        # default as our value (over an authenticated link, the reply too)
        other = default + 1
        core = bare(allowed_peers=AUTHENTICATED)
        out = core.handle("p9", hello(shared={"num_parameters": 100, key: other}), 1.0)
        assert drops(out) == ["cohort_mismatch"], key
        assert f"{key} differs: theirs {other}, ours {default}" in out[0].reason
        assert out[1].msg.reason == f"{key} differs: p0 has {default}"
        # and the other way round: theirs left out is their default
        core = bare(allowed_peers=AUTHENTICATED)
        core.hello_terms = {**TERMS, "shared": {"num_parameters": 100, key: other}}
        out = core.handle("p9", hello(), 1.0)
        assert drops(out) == ["cohort_mismatch"]
        assert f"{key} differs: theirs {default}, ours {other}" in out[0].reason
        assert "p9" not in core.membership.members


def test_an_introduced_hello_gets_a_welcome_without_members_and_is_not_greeted_back():
    # PROTOCOL.md, hello `introduced`: "1: the sender already holds the receiver in its
    # view ... The receiver's `welcome` then carries no member list, and the receiver
    # counts the sender as knowing it (it needs not greet it back)".
    core = bare()
    core.timing = TimingConfig()
    out = core.handle("p9", dataclasses.replace(hello("p9"), introduced=1), 1.0)
    welcome = welcome_of(out)
    assert welcome.members == [] and welcome.view_upto == 0
    assert core.membership.members["p9"].greeted  # it knows us: heartbeats may go to it
    # A hello that is not introduced: the view, and the sender is greeted back.
    out = core.handle("p8", hello("p8"), 1.0)
    assert {r.peer_id for r in welcome_of(out).members} >= {"p0", "p1", "p2", "p8", "p9"}
    assert not core.membership.members["p8"].greeted
    hellos = {i.peer_id for i in core.tick_greetings(1, now=1.5)
              if isinstance(i, Send) and i.msg.TYPE == "hello"}
    assert "p8" in hellos and "p9" not in hellos


def test_capabilities_in_a_hello_are_never_a_reason_to_refuse_it():
    # PROTOCOL.md, hello `capabilities`: "Informational: receivers do not refuse on it".
    for capabilities in (["broadcast", "protocol:99", "a-thing-from-the-future"], [],
                         ["local"] * 50):
        core = bare()
        assert core.capabilities == ["aggregator"]
        out = core.handle("p9", dataclasses.replace(hello("p9"), capabilities=capabilities), 1.0)
        assert not drops(out), capabilities
        assert [i.change.new for i in out if isinstance(i, MemberChanged)] == ["alive"]
        assert welcome_of(out).sender == "p0" and core.membership.is_live("p9")


def test_peers_that_name_their_classes_differently_refuse_each_other():
    # PROTOCOL.md, hello `shared`: "`class_names`: crc32 of the JSON list of names in
    # label order added ... peers that number the same classes differently would average
    # one class into another (`hfl.peer.status.class_names_term`)".
    assert class_names_term(None) == {}  # numeric labels: no term
    ours, reordered = class_names_term(("cat", "dog")), class_names_term(("dog", "cat"))
    assert set(ours) == {"class_names"} and ours != reordered
    assert class_names_term(("cat", "dog")) == ours  # the same list: the same term
    core = bare()
    core.hello_terms = {**TERMS, "shared": {"num_parameters": 100, **ours}}
    out = core.handle("p9", hello(shared={"num_parameters": 100, **reordered}), 1.0)
    assert drops(out) == ["cohort_mismatch"] and out[1].msg.reason == "class_names differs"
    out = core.handle("p8", hello("p8", shared={"num_parameters": 100, **ours}), 1.0)
    assert not drops(out) and welcome_of(out).sender == "p0"


# ---------------------------------------------------------------------------- admission


def test_a_message_from_an_older_incarnation_is_dropped_as_stale_incarnation():
    # PROTOCOL.md, Validation: "`stale_incarnation`: a message from an older incarnation
    # than the receiver knows | no, logged".
    core = bare()
    core.handle("p1", Heartbeat(sender="p1", incarnation=2, round=1), 1.0)  # restarted twice
    assert core.membership.members["p1"].incarnation == 2
    for msg in (Heartbeat(sender="p1", incarnation=1, round=1),
                Knowledge(sender="p1", incarnation=0, round=1, kind="weights"),
                hello("p1")):  # (incarnation 0)
        out = core.handle("p1", msg, 2.0)
        assert [type(i) for i in out] == [Dropped] and drops(out) == ["stale_incarnation"], msg
    assert core.buffer.received(1) == {} and core.membership.members["p1"].incarnation == 2


def test_messages_and_gossip_from_a_peer_that_is_no_member_are_dropped_as_not_member():
    # PROTOCOL.md, Validation: "`not_member`: a message other than `hello` / `welcome`
    # from a peer that never said hello, or (CURVE) a `sender` not on the allow-list";
    # Membership: "gossip from a sender that is not a member is dropped (`not_member`)".
    core = bare()
    gossip = Gossip(sender="p9", incarnation=0,
                    members=[MemberRecord(peer_id="p5", address="mem://p5", incarnation=0)])
    for msg in (Heartbeat(sender="p9", incarnation=0, round=1), gossip,
                Knowledge(sender="p9", incarnation=0, round=1, kind="weights")):
        out = core.handle("p9", msg, 1.0)
        assert [type(i) for i in out] == [Dropped] and drops(out) == ["not_member"], msg
    assert "p5" not in core.membership.members and "p9" not in core.membership.members
    assert core.buffer.received(1) == {}
    # (the same gossip from a member teaches p5)
    core.handle("p1", dataclasses.replace(gossip, sender="p1"), 1.0)
    assert "p5" in core.membership.members
    # With CURVE, a sender off the allow-list is no member, whatever it sends, a hello too.
    core = bare(allowed_peers=frozenset({"p0", "p1", "p2"}))
    assert drops(core.handle("p9", hello("p9"), 1.0)) == ["not_member"]
    assert "p9" not in core.membership.members
    # (and a message whose connection is another peer's: identity_mismatch)
    out = bare().handle("p2", Heartbeat(sender="p1", incarnation=0, round=1), 1.0)
    assert drops(out) == ["identity_mismatch"]


def test_with_an_allow_list_gossip_records_of_ids_not_on_it_are_ignored():
    # PROTOCOL.md, Membership: "With CURVE, records for ids not on the allow-list are
    # ignored."
    allowed = frozenset({"p0", "p1", "p2", "p5", "p7"})

    def record(p: str, status: str = "alive") -> MemberRecord:
        return MemberRecord(peer_id=p, address=f"mem://{p}", incarnation=0, status=status)

    core = bare(allowed_peers=allowed)
    core.handle("p1", Gossip(sender="p1", incarnation=0, members=[record("p5"), record("p6")]), 1.0)
    core.handle("p2", Welcome(sender="p2", incarnation=0, address="mem://p2", round=1,
                              members=[record("p7"), record("p8")]), 1.0)
    assert {"p5", "p7"} <= set(core.membership.members)
    assert not {"p6", "p8"} & set(core.membership.members)
    # departures in a heartbeat's news: only of ids on the list
    core.handle("p1", Heartbeat(sender="p1", incarnation=0, round=1,
                                members=[record("p3", "left"), record("p4", "left")]), 1.0)
    assert not {"p3", "p4"} & core.membership.reported_left
    core = bare(allowed_peers=allowed | {"p3"})
    core.handle("p1", Heartbeat(sender="p1", incarnation=0, round=1,
                                members=[record("p3", "left"), record("p4", "left")]), 1.0)
    assert core.membership.reported_left & {"p3", "p4"} == {"p3"}
    # Without an allow-list (security none) the same gossip teaches both.
    core = bare()
    core.handle("p1", Gossip(sender="p1", incarnation=0, members=[record("p5"), record("p6")]), 1.0)
    assert {"p5", "p6"} <= set(core.membership.members)


# ---------------------------------------------------------------------------- probes


def test_a_probe_is_answered_to_its_relay_if_known_else_to_its_sender_in_either_mode():
    # PROTOCOL.md, heartbeat `probe`: "1: a probe; the receiver answers with a heartbeat
    # (`probe` 0), to `relay` if set, else to the sender. Every peer answers probes,
    # whatever its own `timing.membership`"; `relay`: "the answer goes to that member
    # directly, over the receiver's own link, and only if the receiver knows it".
    for swim in (False, True):
        core = bare(swim=swim)

        def answers(core=core, **probe):
            out = core.handle("p1", Heartbeat(sender="p1", incarnation=0, round=1, **probe), 1.0)
            return [(i.address, i.peer_id, i.msg.TYPE, i.msg.probe, i.msg.sender)
                    for i in out if isinstance(i, Reply)]

        assert answers(probe=1) == [("mem://p1", "p1", "heartbeat", 0, "p0")]
        assert answers(probe=1, relay="p2") == [("mem://p2", "p2", "heartbeat", 0, "p0")]
        assert answers(probe=1, relay="p9") == []  # a relay we do not know: no answer
        assert answers() == []  # not a probe


# ---------------------------------------------------------------------------- knowledge


def test_knowledge_of_kind_none_is_the_senders_answer_for_the_round_and_nothing_to_learn():
    # PROTOCOL.md, knowledge `kind`: "`none` (no tensors, no meta) means "I sit this round
    # out" and counts as the sender's answer for the round".
    core, procs, clock = peer(mode="broadcast")
    info: dict = {}
    s = Stepper(procs.exchange(1, weights(1.0), info))
    wait = s.until(Wait)
    assert sorted(core.awaited(1)) == ["p1", "p2"]
    out = core.handle("p1", Knowledge(sender="p1", incarnation=0, round=1, kind="none"), 0.1)
    assert not drops(out)
    assert core.awaited(1) == ["p2"]  # p1 answered
    assert not wait.done()
    contribution(core, "p2", 1, 3.0)
    assert wait.done()  # nobody is awaited: the round does not wait for p1's timeout
    s.answer(True)
    s.until()
    assert s.done and sorted(s.value) == ["p2"]  # nothing of p1's to learn from
    assert info == {"received_from": 2, "timed_out": False, "learned_from": 1}


# ---------------------------------------------------------------------------- aggregate


def member_of(aggregator: str = "p1", second: str | None = None):
    """p0 as a member of a round whose epoch-0 candidate is ``aggregator`` (and epoch
    1's ``second``), its aggregate_round stepped to its first wait."""
    core, procs, clock = peer()
    order = core.membership.rotation_order()
    r = next(r for r in range(1, 10) if core.candidate(order, r, 0) == aggregator
             and (second is None or core.candidate(order, r, 1) == second))
    enter(core, r)
    info: dict = {}
    s = Stepper(procs.aggregate_round(r, weights(1.0), info))
    wait = s.until(Wait)
    assert s.sent() == [((aggregator,), "knowledge")]
    return core, s, info, clock, r, wait


def test_an_abstention_ends_the_round_for_its_receiver_with_no_result_and_no_ack():
    # PROTOCOL.md, aggregate: "`kind` `none` with no contributors and no tensors is an
    # *abstention*: the aggregator publishes no result for (round, epoch), and a receiver
    # leaves the round without one."
    core, s, info, clock, r, wait = member_of("p1")
    out = core.handle("p1", result("p1", r, 0, contributors=(), kind="none"), 0.1)
    assert not drops(out)  # (no quorum of contributors needed)
    assert wait.done()
    mark = len(s.seen)
    s.answer(True)
    s.until()
    assert s.done and s.value == {}
    assert info["abstained"] and info["aggregator"] is None
    assert not [m for m in s.sent(mark) if m[1] in ("ack", "knowledge")]  # no ack, no fail-over
    assert core.accepted.get(r) is None and core.epoch == 0
    assert not [i for i in s.seen[mark:] if isinstance(i, Wait)]  # no wait for a commit


def test_an_abstention_carrying_tensors_or_contributors_is_dropped_as_rejected_result():
    # PROTOCOL.md, Validation: "`rejected_result`: an abstention (`aggregate` of kind
    # `none`) that carries tensors or contributors | no, logged".
    core = bare(round=1)  # order p0, p1, p2: p1 is the candidate of (1, 0)
    bad = [dataclasses.replace(result("p1", 1, 0, contributors=(), kind="none"),
                               tensors={"w": np.ones(3, np.float32)}),
           result("p1", 1, 0, contributors=("p1",), kind="none"),
           result("p1", 1, 0, kind="none")]  # (the quorum's contributors)
    for msg in bad:
        out = core.handle("p1", msg, 1.0)
        assert [type(i) for i in out][-1] is Dropped and drops(out) == ["rejected_result"]
        assert core.buffer.result(1, 0) is None
    clean = result("p1", 1, 0, contributors=(), kind="none")
    assert not drops(core.handle("p1", clean, 1.0))
    assert core.buffer.result(1, 0) is clean


def test_any_aggregate_is_dropped_as_wrong_aggregator_where_every_peer_aggregates():
    # PROTOCOL.md, Commit: "With `aggregate_at: every_peer` no `aggregate` message is
    # sent; one received is dropped (`wrong_aggregator`)."
    core = bare(round=1)
    core.everywhere = True
    for msg in (result("p1", 1, 0), result("p1", 1, 0, contributors=(), kind="none"),
                result("p2", 1, 1)):
        out = core.handle("p1" if msg.sender == "p1" else "p2", msg, 1.0)
        assert drops(out) == ["wrong_aggregator"] and "every peer aggregates" in out[-1].reason
    assert core.buffer.results == {}
    core.everywhere = False  # the same result from the same candidate, elected: held
    assert not drops(core.handle("p1", result("p1", 1, 0), 1.0))
    assert core.buffer.result(1, 0) is not None


def test_an_aggregate_with_fewer_contributors_than_the_quorum_is_dropped_as_below_quorum():
    # PROTOCOL.md, Rounds (Quorum): "a receiver drops a result below it (`below_quorum`)";
    # Validation: "`below_quorum`: an `aggregate` with fewer `contributors` than the
    # receiver's quorum".
    core = bare(members=("p1", "p2", "p3"), round=1)  # 4 members: a quorum of 3
    assert core.quorum() == 3
    out = core.handle("p1", result("p1", 1, 0, contributors=("p0", "p1")), 1.0)
    assert drops(out) == ["below_quorum"] and "the quorum is 3" in out[-1].reason
    assert core.buffer.result(1, 0) is None
    out = core.handle("p1", result("p1", 1, 0, contributors=("p0", "p1", "p2")), 1.0)
    assert not drops(out) and core.buffer.result(1, 0) is not None


# ---------------------------------------------------------------------------- election


def test_an_aggregator_counts_only_contributions_sent_to_its_epoch_or_a_later_one():
    # PROTOCOL.md, Election and fail-over: "An aggregator of epoch e aggregates the
    # round's contributions it holds that were sent for epoch e or a later one (each is a
    # promise, see *Commit*; one sent to an earlier epoch that elected the same peer is
    # not counted)."
    core, procs, clock = peer()
    order = core.membership.rotation_order()
    r = next(r for r in range(1, 10) if core.candidate(order, r, 1) == "p0")
    enter(core, r)
    core.epoch = 1
    contribution(core, "p1", r, 2.0, epoch=0)  # to epoch 0's aggregator
    contribution(core, "p2", r, 3.0, epoch=1)
    assert sorted(core.promises(r)) == ["p2"]
    s = Stepper(procs.serve(r, weights(1.0), {}))
    wait = s.until(Wait)
    s.answer(wait.done())
    agg = s.until(Aggregate)
    assert isinstance(agg, Aggregate) and sorted(agg.contributions) == ["p0", "p2"]
    np.testing.assert_array_equal(agg.contributions["p2"].tensors["w"], np.full(3, 3.0))
    # An earlier epoch that elected this same peer (epoch 0 and epoch n = 3 both elect
    # p0 in this round): its contributions are not promises for epoch 3.
    core = bare(round=3)
    order = core.membership.rotation_order()
    assert core.candidate(order, 3, 0) == core.candidate(order, 3, 3) == "p0"
    core.epoch = 3
    for p, epoch in (("p1", 0), ("p2", 3)):
        core.handle(p, Knowledge(sender=p, incarnation=0, round=3, kind="weights", epoch=epoch),
                    1.0)
    assert sorted(core.buffer.received(3)) == ["p1", "p2"] and sorted(core.promises(3)) == ["p2"]


def test_a_later_epochs_result_is_not_used_while_an_earlier_epoch_elects_this_peer():
    # PROTOCOL.md, Accepted results: "e > e0 and every candidate of the epochs e0 .. e-1
    # is one the peer has itself seen fail ... and none of them is the peer itself
    # (`PeerCore.epoch_unjustified`)."
    core = bare(members=("p1", "p2", "p3"), round=4)  # order p0 p1 p2 p3
    order = core.membership.rotation_order()
    assert [core.candidate(order, 4, e) for e in (0, 1)] == ["p0", "p1"]
    assert [core.candidate(order, 5, e) for e in (0, 1)] == ["p1", "p2"]
    # Round 4: epoch 0 elects this peer itself; p1's epoch-1 result is held, not used.
    out = core.handle("p1", result("p1", 4, 1, contributors=("p0", "p1", "p2")), 1.0)
    assert not drops(out)
    assert any(isinstance(i, Say) and "elects this peer" in i.template % i.args for i in out)
    assert core.epoch_unjustified(4, 1) == "epoch 0 elects this peer, which is alive"
    assert core.usable_result(4) is None
    # Round 5: epoch 0's candidate is another peer, dead to us: the epoch-1 result is used.
    core.round = 5
    core.handle("p2", result("p2", 5, 1, contributors=("p0", "p1", "p2")), 1.0)
    assert core.usable_result(5) is None  # p1 alive: not yet
    core.membership.set_status("p1", "dead")
    assert core.epoch_unjustified(5, 1) is None and core.usable_result(5).sender == "p2"
    # (even with every other peer dead, epoch 0 of round 4 still elects this one)
    core.membership.set_status("p2", "dead")
    assert core.epoch_unjustified(4, 1) == "epoch 0 elects this peer, which is alive"


# ---------------------------------------------------------------------------- commit


def accepted_from_p1():
    """p0 a member of round r (p1 at epoch 0, p2 at epoch 1) that accepted p1's result
    at clock 1.0: the stepper at its wait for the commit."""
    core, s, info, clock, r, wait = member_of("p1", "p2")
    core.handle("p1", result("p1", r, 0), 0.5)
    assert wait.done()
    clock.t = 1.0
    mark = len(s.seen)
    s.answer(True)
    commit_wait = s.until(Wait)
    assert s.sent(mark) == [(("p1",), "ack")]
    return core, s, info, clock, r, commit_wait


def test_a_member_that_waits_too_long_for_the_commit_fails_over_holding_the_result():
    # PROTOCOL.md, Commit, rule 3: "It stops waiting for that when the aggregator dies or
    # stays silent for `max(aggregate_grace_s, 4 heartbeats) + 4 heartbeats` (it fails
    # over to the next epoch, still holding the result it accepted)".
    core, s, info, clock, r, commit_wait = accepted_from_p1()
    digest = core.accepted[r][1]
    grace = core.timing.aggregate_grace_s
    assert commit_wait.deadline == 1.0 + max(grace, 4 * HB) + 4 * HB
    assert not commit_wait.done()  # p1 alive, no commit, the cohort in round r
    clock.t = commit_wait.deadline
    mark = len(s.seen)
    s.answer(False)
    s.until(Wait)
    assert core.epoch == 1 and info["aggregator"] == "p2"
    assert any(isinstance(i, Say) and "did not commit in time; failing over with its result "
               "accepted" in i.template % i.args for i in s.seen[mark:])
    assert s.sent(mark) == [(("p2",), "knowledge")]
    sent = next(i.msg for i in s.seen[mark:] if isinstance(i, Send))
    assert (sent.epoch, sent.accepted_epoch, sent.accepted_digest) == (1, 0, digest)
    assert core.accepted[r][1] == digest


def test_a_member_stops_waiting_for_the_commit_when_the_aggregator_dies():
    # PROTOCOL.md, Commit, rule 3 (as above): "when the aggregator dies ... (it fails
    # over to the next epoch, still holding the result it accepted)".
    core, s, info, clock, r, commit_wait = accepted_from_p1()
    digest = core.accepted[r][1]
    core.membership.set_status("p1", "dead")
    assert commit_wait.done()
    clock.t = 2.0  # long before the deadline
    mark = len(s.seen)
    s.answer(True)
    s.until(Wait)
    assert core.epoch == 1 and s.sent(mark) == [(("p2",), "knowledge")]
    sent = next(i.msg for i in s.seen[mark:] if isinstance(i, Send))
    assert (sent.accepted_epoch, sent.accepted_digest) == (0, digest)


def test_a_member_waiting_for_a_commit_leaves_the_round_once_the_cohort_is_past_it():
    # PROTOCOL.md, Commit, rule 3: "or the cohort moves past the round (it leaves the
    # round with no result)".
    core, s, info, clock, r, commit_wait = accepted_from_p1()
    core.handle("p1", Heartbeat(sender="p1", incarnation=0, round=r + 1), 2.0)  # its own word
    assert commit_wait.done()
    mark = len(s.seen)
    s.answer(True)
    grace = s.until(Wait)  # a heartbeat may overtake the commit: a short grace
    assert grace.deadline == clock.t + max(2 * HB, 0.25)
    s.answer(False)
    s.until()
    assert s.done and s.value == {} and info["behind"] and info["aggregator"] is None
    assert core.epoch == 0 and not s.sent(mark)  # no fail-over
    # The result it accepted is of its own epoch: no "unjustified epoch" drop (it was
    # reported as one, naming alive candidates before it: found writing this test).
    assert not [i for i in s.seen if isinstance(i, Dropped)]


def test_a_result_sent_again_after_it_was_accepted_is_acked_again():
    # PROTOCOL.md, Commit, rule 3: "An aggregator sends its result again to the live
    # members that have not acked ...; a receiver acks a copy of what it accepted again
    # (`not_acked`, `ack_again`)."
    core = bare(round=1)  # p1: the candidate of (1, 0)
    res = result("p1", 1, 0)
    out = core.handle("p1", res, 1.0)
    assert not drops(out) and not [i for i in out if isinstance(i, Reply)]
    # held, not accepted yet: a second copy is a duplicate
    assert drops(core.handle("p1", res, 1.1)) == ["stale_result"]
    digest = core.accept(res)
    out = core.handle("p1", res, 1.2)
    assert not drops(out)
    (ack,) = [i for i in out if isinstance(i, Reply)]
    assert (ack.address, ack.peer_id) == ("mem://p1", "p1")
    assert isinstance(ack.msg, Ack) and (ack.msg.round, ack.msg.epoch, ack.msg.digest) == (
        1, 0, digest)
    assert digest == payload_digest(res)


def test_an_aggregator_abstains_when_the_reports_at_the_highest_epoch_name_different_results():
    # PROTOCOL.md, Commit, rule 5: "If any of them, or it, accepted a result, it
    # publishes the one of the highest epoch again ...; if it holds no copy, or the
    # reports at that highest epoch name different results (views of the rotation that
    # differ can elect two aggregators for one epoch), it *abstains* (a `none` result)."
    core = bare(round=1)  # order p0 p1 p2: round 1 elects p1, p2, p0 at epochs 0, 1, 2
    core.epoch = 2
    held = result("p2", 1, 1)
    assert not drops(core.handle("p2", held, 1.0))  # a copy of epoch 1's result
    digest, other = payload_digest(held), "e" * 64

    def promise(p: str, accepted_epoch: int, accepted_digest: str) -> Knowledge:
        return Knowledge(sender=p, incarnation=0, round=1, kind="weights", epoch=2,
                         accepted_epoch=accepted_epoch, accepted_digest=accepted_digest)

    decision, res, refused = core.proposal(1, {"p1": promise("p1", 1, digest),
                                               "p2": promise("p2", 1, other)})
    assert (decision, res, refused) == ("abstain", None, {})
    # The same two reports at different epochs: the highest one's, which it holds, again.
    decision, res, refused = core.proposal(1, {"p1": promise("p1", 1, digest),
                                               "p2": promise("p2", 0, other)})
    assert decision == "repeat" and res is held and refused == {}
    # Two reports of one result at the highest epoch: published again too.
    decision, res, _ = core.proposal(1, {"p1": promise("p1", 1, digest),
                                         "p2": promise("p2", 1, digest)})
    assert decision == "repeat" and res is held


def test_an_ack_of_anything_this_peer_did_not_publish_is_dropped_as_stale_ack():
    # PROTOCOL.md, ack `digest`: "an ack of anything the receiver did not publish is
    # dropped (`stale_ack`)"; Validation: "another version, another round or epoch".
    core = bare(round=2)
    d = "d" * 64
    core.expect_acks(2, 0, d)  # this peer published (2, 0, d)
    for stale in (Ack(sender="p1", incarnation=0, round=2, epoch=0, digest="e" * 64),
                  Ack(sender="p1", incarnation=0, round=2, epoch=1, digest=d),
                  Ack(sender="p1", incarnation=0, round=3, epoch=0, digest=d)):
        out = core.handle("p1", stale, 1.0)
        assert drops(out) == ["stale_ack"], stale
    assert core.acked(2, 0, d) == 1  # only its own
    out = core.handle("p1", Ack(sender="p1", incarnation=0, round=2, epoch=0, digest=d), 1.0)
    assert not drops(out) and core.acked(2, 0, d) == 2
    assert core.not_acked(2, 0, d) == ["p2"]


# ---------------------------------------------------------------------------- leaving


def test_a_swim_goodbye_goes_to_at_most_16_members_and_the_aggregator_candidates():
    # PROTOCOL.md, Membership (swim): "A goodbye (`leave`) goes to at most 16 members and
    # the cohort's aggregator candidates; the others learn it as news and find the peer
    # gone."
    ids = tuple(f"p{i:02d}" for i in range(1, 41))
    contacts = {"p05", "p17", "p29", "p38"}
    for seed in range(5):
        core = bare(members=ids, swim=True, rng=random.Random(seed))
        core.membership.set_status("p40", "dead")
        core.contacts = contacts | {"p40"}  # (a dead candidate is told nothing)
        bye = core.goodbye("finished")
        assert isinstance(bye, Broadcast) and bye.msg.TYPE == "leave"
        assert (bye.msg.reason, bye.msg.sender) == ("finished", "p0")
        targets = set(bye.peer_ids)
        assert contacts <= targets and "p40" not in targets and targets <= set(ids)
        assert core.LEAVE_FANOUT == 16 and len(targets - contacts) <= 16
        assert 16 <= len(targets) <= 16 + len(contacts)
    # Full mode, or a swim cohort of up to 16 others: every live member.
    assert set(bare(members=ids).goodbye("x").peer_ids) == set(ids)
    small = ids[:16]
    assert set(bare(members=small, swim=True).goodbye("x").peer_ids) == set(small)


# ---------------------------------------------------------------------------- sends


def test_a_broadcast_never_waits_for_a_suspected_member():
    # PROTOCOL.md, Rounds: "**Sends** to a member the peer already suspects never wait:
    # queued if the link takes them, else dropped." (peer/outbox.py, start_broadcast;
    # the one rule here outside the core: a fake transport, and one event loop to run
    # the broadcast's waiting part, which waits on nothing real.)
    class Transport:
        def __init__(self, takes_now: set[str]):
            self.takes_now, self.waited = takes_now, []

        def send_now(self, address, frames, peer_id=None):
            return True if address in self.takes_now else None  # None: it must wait

        async def send(self, address, frames, timeout_s, peer_id=None):
            self.waited.append((peer_id, timeout_s))
            return False  # nothing went (a suspected member's link that takes nothing)

    mem = Membership("p0", "mem://p0", 0, 2.0, 5.0)
    for p in ("p1", "p2", "p3", "p4"):
        mem.heard_from(p, 0, 0.0, address=f"mem://{p}", round=1)
    mem.set_status("p2", "suspect")
    mem.set_status("p4", "suspect")
    transport = Transport(takes_now={"mem://p4"})
    out = Outbox("p0", transport, Limits(), send_timeout_s=2.0, members=lambda: mem,
                 spawn=lambda aw, name: None, dropped=Counter())
    took = asyncio.run(out.start_broadcast(("p1", "p2", "p3", "p4"),
                                           Heartbeat(sender="p0", incarnation=0, round=1)))
    # the live ones wait for their link up to the send timeout; the suspected p2 not at
    # all; the suspected p4, whose link took it at once, got it
    assert transport.waited == [("p1", 2.0), ("p2", 0.0), ("p3", 2.0)]
    assert took == 1 and out.sent["heartbeat"] == 1
