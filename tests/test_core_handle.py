"""PeerCore.handle on a bare core: a received message in, the shell's instructions out.

No sockets, tasks or clock: each test builds a core in one line, hands it a message
and reads what it decided (hfl.peer.instructions), as PROTOCOL.md states the rule.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
from pathlib import Path

from hfl.peer.core import PeerCore
from hfl.peer.instructions import (
    WAKE,
    Dropped,
    Forget,
    MemberChanged,
    Refused,
    Reply,
    Say,
    SendTo,
)
from hfl.peer.membership import Membership
from hfl.protocol import Ack, Commit, Error, Heartbeat, Hello, Knowledge, Leave, Welcome

TERMS = {"cohort": "c", "algorithm": "fedavg", "num_classes": 10, "rounds": 5,
         "shared": {"num_parameters": 100}}


def bare(me: str = "p0", members: tuple[str, ...] = ("p1", "p2"), round: int = 1, **kw) -> PeerCore:
    """A core of a cohort whose ``members`` it has heard from (at t=0, in ``round``)."""
    core = PeerCore(me, mode="aggregator", everywhere=False, lookahead=2, start_round=round, **kw)
    core.membership = Membership(me, f"mem://{me}", 0, 2.0, 5.0)
    core.hello_terms = TERMS
    for p in members:
        core.membership.heard_from(p, 0, 0.0, address=f"mem://{p}", round=round)
    return core


def hello(sender: str = "p9", **kw) -> Hello:
    terms = {**TERMS, **kw}
    return Hello(sender=sender, incarnation=0, address=f"mem://{sender}", cohort=terms["cohort"],
                 algorithm=terms["algorithm"], num_classes=terms["num_classes"],
                 rounds=terms["rounds"], shared=terms["shared"])


def test_the_core_imports_no_io():
    # The rules must be testable (and simulated) without an event loop, sockets or a clock.
    for name in ("core.py", "instructions.py", "membership.py", "rounds.py", "procedures.py"):
        tree = ast.parse((Path(__file__).resolve().parent.parent / "peer" / name).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & {"asyncio", "zmq", "socket", "time", "os", "threading"}, name


def test_a_hello_from_another_peer_with_our_id_is_refused_naming_the_id():
    # Two processes started with one node.id: each took the other's hello and welcome for
    # its own, and both ended saying nobody answered at the bootstrap address (a review).
    core = bare()
    twin = dataclasses.replace(hello("p0"), address="mem://elsewhere")
    out = core.handle("p0", twin, 1.0)
    dropped = [i for i in out if isinstance(i, Dropped)]
    assert [d.code for d in dropped] == ["address_conflict"]
    assert "id p0" in dropped[0].reason and "node.id of its own" in dropped[0].reason
    (reply,) = [i for i in out if isinstance(i, Reply)]
    assert reply.address == "mem://elsewhere" and "node.id of its own" in reply.msg.reason
    assert "p0" not in core.membership.members
    # Our own hello, come back through a bootstrap list that names us: nothing.
    assert core.handle("p0", dataclasses.replace(hello("p0"), address="mem://p0"), 1.0) == []


def test_a_hello_that_disagrees_is_refused_naming_the_field_and_only_then_our_value():
    # PROTOCOL.md, hello: the reason names the field; only over an authenticated link does
    # it give the receiver's own value.
    core = bare()
    out = core.handle("p9", hello(shared={"num_parameters": 100, "communicate_every": 2}), 1.0)
    assert [type(i) for i in out] == [Dropped, Reply]
    assert out[0].code == "cohort_mismatch" and "communicate_every differs" in out[0].reason
    reply = out[1].msg
    assert isinstance(reply, Error) and reply.reason == "communicate_every differs"
    assert (out[1].address, out[1].peer_id) == ("mem://p9", "p9")
    assert "p9" not in core.membership.members  # not admitted
    authenticated = bare(allowed_peers=frozenset({"p0", "p1", "p2", "p9"}))
    out = authenticated.handle("p9", hello(rounds=7), 1.0)
    assert out[1].msg.reason == "rounds differs: p0 has 5"
    # A model of another size: the log says what usually makes it (another input shape);
    # the reply still names only the field.
    out = core.handle("p9", hello(shared={"num_parameters": 99}), 1.0)
    assert "num_parameters differs: theirs 99, ours 100 (one model for the whole cohort" in \
        out[0].reason and "input shape" in out[0].reason
    assert out[1].msg.reason == "num_parameters differs"


def test_peers_of_two_runs_of_one_cohort_refuse_each_other_and_sign_differently():
    # An attack review: statements signed [cohort name, round, epoch, digest], valid in
    # every run of the cohort with the same keys, so a member replayed an honest
    # member's earlier-run contribution as a proof of equivocation. A run's id
    # (cohort.run) now goes into every statement and must match in the hello.
    from types import SimpleNamespace

    from hfl.peer.core import hello_terms, signing_context

    def terms(run):
        return hello_terms(SimpleNamespace(name="c", algorithm="fedavg", rounds=5, run=run),
                           "aggregator", 10, False, {"num_parameters": 100})

    assert terms(0) == TERMS  # no run id: the hello and statements of before
    core = bare()
    core.hello_terms = terms(7)
    out = core.handle("p9", hello(shared={"num_parameters": 100, "run": 8}), 1.0)
    assert out[0].code == "cohort_mismatch" and "run differs" in out[0].reason, out
    a, b = bare(), bare()
    a.cohort = signing_context(SimpleNamespace(name="c", run=7))
    b.cohort = signing_context(SimpleNamespace(name="c", run=8))
    assert a.statement("knowledge", 2, 0, "ab" * 32) != b.statement("knowledge", 2, 0, "ab" * 32)
    assert signing_context(SimpleNamespace(name="c", run=0)) == "c"


def test_a_hello_that_agrees_is_welcomed_with_the_view_and_the_member_joins():
    core = bare()
    out = core.handle("p9", hello(), 1.0)
    assert [type(i) for i in out] == [MemberChanged, Reply, type(WAKE)]
    assert (out[0].change.peer_id, out[0].change.new) == ("p9", "alive")
    welcome = out[1].msg
    assert isinstance(welcome, Welcome) and {r.peer_id for r in welcome.members} >= {"p0", "p1", "p2"}
    assert core.to_greet  # a newcomer may need our hello


def test_a_message_from_another_connection_than_its_sender_is_dropped():
    out = bare().handle("p2", Heartbeat(sender="p1", incarnation=0, round=1), 1.0)
    assert len(out) == 1 and isinstance(out[0], Dropped)


def test_a_goodbye_ends_the_membership_and_closes_the_link():
    core = bare()
    out = core.handle("p1", Leave(sender="p1", incarnation=0, reason="finished"), 1.0)
    assert [type(i) for i in out] == [Forget, MemberChanged, type(WAKE)]
    assert out[0] == Forget("mem://p1", "p1") and out[1].change.new == "left"
    assert not core.membership.is_live("p1")


def test_an_indirect_probe_is_passed_on_to_its_target_with_the_asker_as_relay():
    # PROTOCOL.md, Membership (swim): the target answers the asker itself.
    core = bare()
    out = core.handle("p1", Heartbeat(sender="p1", incarnation=0, round=1, target="p2"), 1.0)
    probes = [i for i in out if isinstance(i, Reply)]
    assert len(probes) == 1 and probes[0].peer_id == "p2"
    assert (probes[0].msg.probe, probes[0].msg.relay) == (1, "p1")


def test_an_aggregator_still_awaiting_our_knowledge_gets_it_again():
    # PROTOCOL.md, Rounds: "each that sent its knowledge to it for that (r, e) sends it again".
    core = bare(round=3)
    sent = Knowledge(sender="p0", incarnation=0, round=3, kind="weights")
    core.sent_knowledge = (frozenset({"p1"}), sent)
    out = core.handle("p1", Heartbeat(sender="p1", incarnation=0, round=3, awaiting=3), 1.0)
    again = [i for i in out if isinstance(i, SendTo)]
    assert again == [SendTo("p1", sent, "knowledge again")]
    assert any(isinstance(i, Say) and i.level == logging.INFO for i in out)
    # Not when it awaits another round's.
    out = core.handle("p1", Heartbeat(sender="p1", incarnation=0, round=3, awaiting=2), 2.0)
    assert not [i for i in out if isinstance(i, SendTo)]


def test_a_member_met_after_a_broadcast_to_every_member_gets_the_knowledge_it_asks_for():
    # PROTOCOL.md, heartbeat `awaiting`: in a decentralized round whose knowledge went to
    # every live member, a live member met since (p2 here) is one it would have gone to.
    # It waited the whole round_timeout_s, and a late joiner's last round learned nothing
    # (hfl.sim.protocol --peers 3 --mode broadcast, seed 502).
    ask = Heartbeat(sender="p2", incarnation=0, round=3, awaiting=3)
    sent = Knowledge(sender="p0", incarnation=0, round=3, kind="weights")
    for to_every_member, answered in ((True, True), (False, False)):
        # (False: an elected aggregator's round, or a cohort.fanout plan that left p2 out)
        core = bare(round=3)
        core.sent_knowledge = (frozenset({"p1"}), sent)
        core.sent_to_every_member = to_every_member
        out = core.handle("p2", ask, 1.0)
        again = [i for i in out if isinstance(i, SendTo)]
        assert again == ([SendTo("p2", sent, "knowledge again")] if answered else [])
        # It is then one the knowledge went to (a last round's linger waits for it too).
        assert core.sent_knowledge[0] == (frozenset({"p1", "p2"}) if answered
                                          else frozenset({"p1"}))
    # Not a peer that is no member (it is no receiver of a broadcast).
    core = bare(round=3)
    core.sent_knowledge, core.sent_to_every_member = (frozenset({"p1"}), sent), True
    stranger = dataclasses.replace(ask, sender="p9")
    assert not [i for i in core.handle("p9", stranger, 1.0) if isinstance(i, SendTo)]


def test_awaits_any_and_the_cached_live_members_agree_with_a_scan_after_every_event():
    # awaits_any (an aggregator's wait, asked on every contribution) keeps the peer it
    # found and live_ids a cached tuple: both against recomputation from the view, over
    # random contributions, deaths, returns, departures, rounds heard and new members.
    import random

    for seed in range(40):
        rng = random.Random(seed)
        r = 3
        core = bare(members=tuple(f"p{i}" for i in range(1, 25)), round=r)
        mem = core.membership
        core.round_began = 0.5
        for step in range(120):
            ids = sorted(mem.members)
            p = rng.choice(ids)
            event = rng.randrange(6)
            if event == 0:
                core.buffer.offer_knowledge(Knowledge(sender=p, incarnation=0, round=r,
                                                      kind="weights"))
            elif event == 1:
                mem.set_status(p, rng.choice(["alive", "suspect", "dead", "left"]))
            elif event == 2:
                mem.heard_from(p, 0, 1.0 + step, round=rng.choice([r - 2, r - 1, r, r + 1]))
            elif event == 3:
                mem.heard_from(f"q{step}", 0, 1.0 + step, address=f"mem://q{step}", round=r)
            elif event == 4:
                core.sources = None if rng.random() < 0.7 else set(rng.sample(ids, 5))
            live = sorted(q for q, m in mem.members.items() if m.status in ("alive", "suspect"))
            assert mem.live_peers() == live and list(mem.live_ids()) == live
            assert core.awaits_any(r) == bool(core.awaited(r)), (seed, step)
            assert set(core.awaited(r)) <= set(live)


def test_knowledge_for_a_round_this_peer_finished_is_dropped_as_late():
    core = bare(round=4)
    out = core.handle("p1", Knowledge(sender="p1", incarnation=0, round=3, kind="weights"), 1.0)
    assert [(i.code, "late" in i.reason) for i in out if isinstance(i, Dropped)] == [
        ("stale_knowledge", True)]
    assert out[-1] == WAKE


def test_an_ack_after_the_commit_gets_the_commit_again():
    # PROTOCOL.md, Commit: an ack that comes after the commit means the commit was lost.
    core = bare(round=2)
    commit = Commit(sender="p0", incarnation=0, round=2, epoch=0, digest="d" * 64)
    core.last_commit = commit
    core.commits.add((2, "d" * 64))
    out = core.handle("p1", Ack(sender="p1", incarnation=0, round=2, epoch=0, digest="d" * 64), 1.0)
    assert [type(i) for i in out] == [Reply, type(WAKE)]
    assert out[0].peer_id == "p1" and out[0].msg.digest == "d" * 64


def test_a_contributor_still_waiting_after_the_commit_gets_the_result_once_more():
    # PROTOCOL.md, Commit: the result of the last commit goes once more to a member that
    # contributed to it and whose heartbeat, a heartbeat interval or more after the
    # commit, says it still waits in that round and epoch with no ack of it: its copy
    # was lost (hfl.sim.protocol, --peers 4 --communicate-every 3 --rounds 10, seed 40).
    from hfl.peer.config import TimingConfig
    from hfl.protocol import AggregateResult

    core = bare(members=("p1", "p2", "p3"), round=2)
    core.timing = TimingConfig()
    hb_s = core.timing.heartbeat_interval_s
    result = AggregateResult(sender="p0", incarnation=0, round=2, epoch=0, kind="weights",
                             contributors=["p0", "p1", "p2"])
    core.acks[(2, 0, "d" * 64)] = {"p0", "p1"}  # p1 acked before the commit
    core.committed_as_aggregator(Commit(sender="p0", incarnation=0, round=2, epoch=0,
                                        digest="d" * 64), result, 10.0)

    def waiting(sender, t, **kw):
        hb = Heartbeat(sender=sender, incarnation=0, round=kw.get("round", 2),
                       epoch=kw.get("epoch", 0), absorbed_round=kw.get("absorbed", 1),
                       sitting_out=kw.get("sitting_out", 0))
        return [i for i in core.handle(sender, hb, t) if isinstance(i, Reply)]

    assert waiting("p2", 10.0 + hb_s / 2) == []  # its copy may be on the way still
    assert waiting("p2", 10.0 + hb_s, sitting_out=2) == []  # restarted into the round
    assert waiting("p3", 10.0 + hb_s) == []  # no contribution: maybe still training
    assert waiting("p1", 10.0 + hb_s) == []  # it acked
    assert waiting("p2", 10.0 + hb_s, epoch=1) == []  # failed over: waits elsewhere
    assert waiting("p2", 10.0 + hb_s, absorbed=2) == []  # it has the result
    sent = waiting("p2", 10.0 + hb_s)
    assert [(r.peer_id, r.msg.TYPE, r.msg.round, r.msg.contributors) for r in sent] == [
        ("p2", "aggregate", 2, ["p0", "p1", "p2"])]
    assert waiting("p2", 10.0 + 4 * hb_s) == []  # once
    # An ack after the commit settles a member too (it is answered with the commit).
    core.committed_as_aggregator(Commit(sender="p0", incarnation=0, round=2, epoch=0,
                                        digest="d" * 64), result, 20.0)
    core.handle("p2", Ack(sender="p2", incarnation=0, round=2, epoch=0, digest="d" * 64), 20.1)
    assert waiting("p2", 20.0 + hb_s) == []
    # A heartbeat overtaken by newer word that the member moved on gets nothing.
    core.committed_as_aggregator(Commit(sender="p0", incarnation=0, round=2, epoch=0,
                                        digest="d" * 64), result, 30.0)
    core.membership.heard_from("p2", 0, 30.0, round=3)
    assert waiting("p2", 30.0 + hb_s) == []
    # The copy is kept until the aggregator is past the next exchange.
    core.forget_before(3)
    assert core.last_result is not None
    core.forget_before(4)
    assert core.last_result is None


def test_a_refusal_of_our_hello_is_reported_as_such():
    core = bare(members=())
    msg = Error(sender="p5", incarnation=0, code="cohort_mismatch", reason="rounds differs",
                ref_type="hello")
    out = core.handle("p5", msg, 1.0)
    assert len(out) == 1 and isinstance(out[0], Refused) and "rounds differs" in out[0].reason


# ---------------------------------------------------------------------------- ticking


def ticking(me: str = "p0", members: tuple[str, ...] = ("p1", "p2"), swim: bool = False) -> PeerCore:
    from hfl.peer.config import TimingConfig

    core = bare(me, members)
    core.timing, core.swim = TimingConfig(), swim
    return core


def test_a_peer_greets_its_bootstrap_until_someone_answers_then_only_new_members():
    from hfl.peer.instructions import Send

    core = ticking(members=())
    core.bootstrap = ((None, "tcp://10.0.0.5:5555"), ("p0", "mem://p0"))  # the second is us
    out = core.tick_greetings(1, now=1.0)
    assert [(i.address, i.msg.TYPE) for i in out if isinstance(i, Send)] == [
        ("tcp://10.0.0.5:5555", "hello")]
    core.handle("p1", Welcome(sender="p1", incarnation=0, address="mem://p1", round=1), 2.0)
    out = core.tick_greetings(2, now=2.0)
    assert not [i for i in out if isinstance(i, Send)]  # p1 answered: no more bootstrap hellos
    # ... but a bootstrap peer named and never heard from, once per dead_after_s: it may
    # have started after us (ten peers started at once, each bootstrapping from the one
    # before, split for good into two cohorts: p4 was greeted by p5 before p3 listened)
    core.bootstrap = (("p3", "mem://p3"), ("p1", "mem://p1"))
    every = round(core.timing.dead_after_s / core.timing.heartbeat_interval_s)
    sends = [[i.msg.TYPE for i in core.tick_greetings(t, now=2.0 + t / 10)
              if isinstance(i, Send) and i.address == "mem://p3"]
             for t in range(every, 2 * every + 1)]
    assert sends[0] == sends[-1] == ["hello"] and not any(sends[1:-1])
    core.handle("p3", Welcome(sender="p3", incarnation=0, address="mem://p3", round=1), 9.0)
    assert not [i for i in core.tick_greetings(3 * every, now=9.5)
                if isinstance(i, Send) and i.peer_id == "p3" and i.msg.introduced == 0]


def test_a_silent_member_is_greeted_where_other_members_place_it_once_then_with_the_dead():
    from hfl.peer.instructions import Send
    from hfl.protocol import Gossip, MemberRecord

    core = ticking(members=("p1", "p2"))

    def told(by, where, now):
        record = MemberRecord(peer_id="p5", address=where, incarnation=0)
        core.handle(by, Gossip(sender=by, incarnation=0, members=[record]), now)

    def hellos(tick):
        return sorted(i.address for i in core.tick_greetings(tick, now=tick * 0.5)
                      if isinstance(i, Send) and i.msg.TYPE == "hello" and i.peer_id == "p5")

    told("p1", "mem://nowhere", 0.1)  # the first to name p5 names a wrong place
    told("p2", "mem://p5", 0.2)  # a later record: before, ignored
    assert core.membership.address_of("p5") == "mem://nowhere"
    assert hellos(1) == ["mem://nowhere", "mem://p5"]  # the lead, as soon as it came
    assert hellos(2) == ["mem://nowhere"]  # (unanswered: the address each tick, as before)
    assert hellos(10) == ["mem://nowhere", "mem://p5"]  # the lead once per dead_after_s
    told("p1", "mem://elsewhere", 5.1)  # p1's first lead: p5 is greeted at its places
    # p5 is dead now (silent for dead_after_s): its address too is greeted only once per
    # dead_after_s (it got a hello every tick for the rest of the run: a fuzzer's find).
    assert hellos(11) == ["mem://elsewhere", "mem://p5"]
    assert core.membership.members["p5"].status == "dead"
    told("p1", "mem://elsewhere-2", 5.2)  # a reporter's changed lead waits for a regreet
    assert hellos(12) == []
    assert hellos(20) == ["mem://elsewhere-2", "mem://nowhere", "mem://p5"]
    core.handle("p5", hello("p5"), 10.5)  # p5 itself, at its own address
    assert core.membership.address_of("p5") == "mem://p5"
    assert "mem://nowhere" not in hellos(30) and core.membership.members["p5"].leads is None


def test_a_member_confirmed_by_a_relayed_probe_is_still_greeted_where_others_place_it():
    # Attack review of the leads (A1): a liar told p0 that p5 is at a wrong place, then
    # asked p5 to probe p0 for it; p5's relayed heartbeat names no address, so p5 was
    # "confirmed" at the liar's place: its leads were never greeted, and its own hello
    # from its true address was dropped as an impostor's (address_conflict) for good.
    from hfl.peer.instructions import Dropped, Send
    from hfl.protocol import Gossip, MemberRecord

    core = ticking(members=("p1", "p2"))
    mem = core.membership
    core.handle("p1", Gossip(sender="p1", incarnation=0, members=[
        MemberRecord(peer_id="p5", address="mem://nowhere", incarnation=0)]), 0.1)
    core.handle("p5", Heartbeat(sender="p5", incarnation=0, round=1), 0.2)  # the relayed probe
    p5 = mem.members["p5"]
    assert (p5.confirmed, p5.placed, p5.address) == (True, False, "mem://nowhere")
    core.handle("p2", Gossip(sender="p2", incarnation=0, members=[
        MemberRecord(peer_id="p5", address="mem://p5", incarnation=0)]), 0.3)
    out = core.tick_greetings(1, now=0.5)
    assert "mem://p5" in [i.address for i in out if isinstance(i, Send) and i.peer_id == "p5"]
    out = core.handle("p5", Welcome(sender="p5", incarnation=0, address="mem://p5", round=1), 0.6)
    assert not [i for i in out if isinstance(i, Dropped)]
    assert (p5.address, p5.placed, p5.leads) == ("mem://p5", True, None)


def joining(join: str, cohort_size: int = 5) -> PeerCore:
    """A fresh SWIM peer of an elected-aggregator cohort, bootstrapping from p1."""
    import random

    from hfl.peer.config import TimingConfig

    core = PeerCore("p0", mode="aggregator", everywhere=False, lookahead=2, swim=True,
                    cohort_size=cohort_size, timing=TimingConfig(membership="swim", join=join),
                    bootstrap=(("p1", "mem://p1"),), hello_terms=TERMS, rng=random.Random(0))
    core.open_view("mem://p0", random.Random(0))
    return core


def view_of_p1() -> Welcome:
    from hfl.protocol import MemberRecord

    def record(p: str, vouched: int) -> MemberRecord:
        return MemberRecord(peer_id=p, address=f"mem://{p}", incarnation=0, vouched=vouched)

    # p1 heard from p2 and p3 itself; p4 it only heard of
    return Welcome(sender="p1", incarnation=0, address="mem://p1", round=1,
                   members=[record("p1", 0), record("p2", 1), record("p3", 1), record("p4", 0)])


def test_a_lazy_join_greets_only_its_bootstrap_and_asks_it_again_while_short():
    # PROTOCOL.md, Membership, lazy join: members vouched for count without a handshake;
    # the joiner greets nobody else, and asks its bootstrap again for its whole view
    # every second interval while its order is short of node.min_peers (5 here).
    from hfl.peer.instructions import Send

    def sends(out):
        return [(i.peer_id or i.address, i.msg.TYPE, getattr(i.msg, "introduced", None))
                for i in out if isinstance(i, Send)]

    greet, lazy = joining("greet"), joining("lazy")
    for core in (greet, lazy):
        assert sends(core.tick_greetings(0, now=0.0)) == [("p1", "hello", 0)]
        core.handle("p1", view_of_p1(), 0.1)
    # greet: every member learned is greeted, and only those greeted count
    assert sorted(sends(greet.tick_greetings(2, now=1.0))) == [
        ("p2", "hello", 1), ("p3", "hello", 1), ("p4", "hello", 1)]
    assert greet.membership.rotation_order() == ["p0", "p1"]
    # lazy: p2 and p3 count (p1 vouched for them); p4 is only a suggestion
    assert lazy.membership.rotation_order() == ["p0", "p1", "p2", "p3"]
    assert lazy.membership.join_counts()[1:] == (2, 3)  # p2, p3 not greeted; p1-p3 arrived
    assert sends(lazy.tick_greetings(2, now=1.0)) == [("p1", "hello", 0)]  # 4 < 5: ask again
    assert sends(lazy.tick_greetings(3, now=1.5)) == []  # every second interval
    lazy.joining = False  # the join ended (RoundProcedures.join): no more asking
    assert sends(lazy.tick_greetings(4, now=2.0)) == []


def test_a_lazy_peer_answers_an_ask_for_its_view_with_what_the_asker_does_not_have_yet():
    # PROTOCOL.md, hello view_from / welcome view_upto: a join that lasts minutes asks
    # the bootstrap every second interval; each ask gets only the members it heard from
    # itself since the last answer (not its whole view again), and never suggestions.
    from hfl.protocol import MemberRecord

    core = joining("lazy")
    mem = core.membership
    for i, p in enumerate(("p2", "p3")):
        core.handle(p, hello(p), 0.1 + i)
    mem.merge([MemberRecord(peer_id="p7", address="mem://p7", incarnation=0)], 1.0)  # suggested

    def answer(view_from: int) -> Welcome:
        out = core.handle("p4", dataclasses.replace(hello("p4"), view_from=view_from), 2.0)
        return next(i.msg for i in out if isinstance(i, Reply))

    first = answer(0)  # p4 itself is now heard from too: p2, p3, p4
    assert [(r.peer_id, r.vouched) for r in first.members] == [
        ("p0", 0), ("p2", 1), ("p3", 1), ("p4", 1)] and first.view_upto == 3
    core.handle("p5", hello("p5"), 3.0)
    again = answer(first.view_upto)
    assert [r.peer_id for r in again.members] == ["p0", "p5"] and again.view_upto == 4
    assert [r.peer_id for r in answer(99).members] == ["p0", "p2", "p3", "p4", "p5"]  # restarted
    # the asker keeps where the answer ended, per member and life
    asker = joining("lazy")  # (also a "p0": its own record in the answer is skipped)
    asker.handle("p1", view_of_p1(), 4.0)
    assert asker.ask_view("p1").msg.view_from == 0  # a whole view: no view_upto

    def from_p1(welcome: Welcome, now: float) -> None:
        asker.handle("p1", dataclasses.replace(welcome, sender="p1", address="mem://p1"), now)

    from_p1(again, 4.2)  # begins at 3, past what we hold: a gap, not taken
    assert asker.ask_view("p1").msg.view_from == 0
    from_p1(first, 4.5)
    from_p1(again, 4.6)
    assert asker.ask_view("p1").msg.view_from == 4
    from_p1(first, 4.7)
    assert asker.ask_view("p1").msg.view_from == 4  # a late answer to an older ask


def test_a_lazy_ask_for_a_view_never_takes_a_hostile_or_stale_cursor():
    core = joining("lazy")
    for p in ("p2", "p3"):
        core.handle(p, hello(p), 0.1)

    def answer(view_from: int) -> Welcome:
        out = core.handle("p4", dataclasses.replace(hello("p4"), view_from=view_from), 2.0)
        return next(i.msg for i in out if isinstance(i, Reply))

    assert [r.peer_id for r in answer(-2).members] == ["p0", "p2", "p3", "p4"]  # all, not a tail
    # An answer from a new life of the member, to an ask made with the old life's
    # cursor, is only the tail of the new view: the next ask starts over.
    asker = joining("lazy")
    asker.handle("p1", view_of_p1(), 1.0)  # (a whole view, no view_upto)
    asker._view_cursor[("p1", 0)] = 3
    assert asker.ask_view("p1").msg.view_from == 3
    tail = Welcome(sender="p1", incarnation=1, address="mem://p1", round=1, view_upto=5,
                   members=[view_of_p1().members[0]])
    asker.handle("p1", tail, 2.0)
    assert asker.ask_view("p1").msg.view_from == 0
    # Hubs (view_sources) come only from a bootstrap peer's whole view: an unsolicited
    # welcome from another member names none.
    other = joining("lazy")
    other.handle("p7", dataclasses.replace(view_of_p1(), sender="p7", address="mem://p7",
                                           view_upto=3), 1.0)
    assert other._hubs == []
    other.handle("p1", dataclasses.replace(view_of_p1(), view_upto=3), 1.1)
    assert other._hubs == ["p2", "p3", "p4"]


def test_a_joined_lazy_peer_asks_a_member_whose_order_differs_once_until_either_changes():
    core = joining("lazy")
    core.handle("p1", view_of_p1(), 0.1)
    core.joining = False

    def asks(view: int, now: float) -> int:
        beat = Heartbeat(sender="p1", incarnation=0, round=1, view=view)
        return sum(1 for i in core.handle("p1", beat, now)
                   if isinstance(i, Send) and i.msg.TYPE == "hello")

    from hfl.peer.instructions import Send

    ours = core.view_digest()
    assert asks(ours, 1.0) == 0  # the same order: nothing to ask
    assert asks(12345, 2.0) == 1
    assert asks(12345, 3.0) == 0  # nothing changed since: orders may differ for good
    assert asks(12345, 2.0 + core.timing.dead_after_s) == 1  # (the ask may have been lost)
    core.handle("p5", hello("p5"), 7.5)  # our order changed
    assert core.view_digest() != ours and asks(12345, 8.0) == 1
    assert asks(777, 8.1) == 0  # at most once an interval


def test_a_lazy_probe_of_a_member_not_greeted_is_our_hello_and_its_welcome_the_answer():
    from hfl.peer.instructions import Broadcast, Send

    core = joining("lazy")
    core.handle("p1", view_of_p1(), 0.1)
    mem = core.membership
    core.contacts = {"p2"}  # this round's aggregator candidate: probed (4 members: each call)
    out = core.probe(now=1.0)
    hellos = [i for i in out if isinstance(i, Send) and i.peer_id == "p2"]
    assert [(h.msg.TYPE, h.msg.introduced) for h in hellos] == [("hello", 1)]
    assert not any(isinstance(i, Broadcast) and "p2" in i.peer_ids for i in out)
    assert not any(getattr(i.msg, "target", None) == "p2" for i in out if hasattr(i, "msg"))
    assert mem.members["p2"].expect_since == 1.0  # it owes an answer, as after a probe
    core.handle("p2", Welcome(sender="p2", incarnation=0, address="mem://p2", round=1), 1.2)
    m = mem.members["p2"]
    assert m.greeted and m.expect_since is None and m.asked_at is None  # answered
    assert [i.peer_ids for i in core.probe(now=1.5) if isinstance(i, Broadcast)
            and i.msg.TYPE == "heartbeat"][0].count("p2") == 1  # a heartbeat probe from now on
    # p3, vouched for, never answers its hellos: dead after dead_after_s, as any member
    core.contacts = {"p3"}
    core.probe(now=2.0)
    assert mem.members["p3"].expect_since == 2.0
    assert [c.new for c in mem.tick(2.0 + core.timing.dead_after_s) if c.peer_id == "p3"] == ["dead"]


def test_heartbeats_go_only_to_members_that_know_us_and_gossip_every_other_tick():
    from hfl.peer.instructions import Broadcast

    core = ticking()
    core.membership.set_greeted("p1")  # p2 never answered our hello
    out = core.tick_sends(2, now=1.0)
    assert [(i.peer_ids, i.msg.TYPE) for i in out if isinstance(i, Broadcast)] == [
        (("p1",), "heartbeat"), (("p1",), "gossip")]
    assert [i.msg.TYPE for i in core.tick_sends(3, now=1.5) if isinstance(i, Broadcast)] == ["heartbeat"]


def test_a_dropped_link_is_a_hint_that_probes_and_never_a_death():
    # PROTOCOL.md, Membership: a disconnect starts a direct probe and indirect ones
    # through others; only unanswered probes make the member dead (docs/runtime.md).
    core = ticking(members=("p1", "p2", "p3"))
    core.membership.hint_dead_s = 1.0  # as the node sets it: 2 heartbeat intervals
    for p in ("p1", "p2", "p3"):
        core.membership.set_greeted(p)
    assert core.link_changed("mem://p9", None, up=False, now=1.0) == []  # not a member's link
    out = core.link_changed("mem://p1", None, up=False, now=1.0)  # found by its address
    sends = [i for i in out if isinstance(i, SendTo)]
    assert sends[0].peer_id == "p1" and sends[0].msg.probe == 1
    assert {s.peer_id for s in sends[1:]} == {"p2", "p3"} and all(s.msg.target == "p1" for s in sends[1:])
    assert out[-1] == WAKE
    assert core.membership.is_live("p1")  # a hint is not a failure
    assert core.link_changed("mem://p1", "p1", up=True, now=1.2) == []  # the link is back
    # Dropped again within hint_dead_s: no second burst of probes (a member that rebinds
    # its socket made every peer probe it 4x as often, a review), and so no hint either,
    # whose deadline no probe would answer (it died unprobed, a review of that) ...
    assert core.link_changed("mem://p1", "p1", up=False, now=1.5) == []
    assert "p1" not in core.membership._hinted
    assert [i.peer_id for i in core.link_changed("mem://p1", "p1", up=False, now=2.1)
            if isinstance(i, SendTo)][0] == "p1"  # ... after it, probed again
    # A link to another address than the member's (one a member's gossip named, greeted
    # as a lead) says nothing of the member: its drop is no hint (a review: a member held
    # such connections and cut them as the peer stalled, which was declared dead).
    assert core.link_changed("tcp://elsewhere:1", "p2", up=False, now=2.2) == []
    assert "p2" not in core.membership._hinted


def test_a_goodbye_after_the_last_round_ends_the_last_round_for_a_straggler():
    # PROTOCOL.md, Rounds: no later round follows the last one for the cohort to be seen
    # in; a member that ran every round and said goodbye shows it is over.
    core = bare(round=3, last_round=3)
    assert not core.cohort_past(3)
    core.handle("p1", Leave(sender="p1", incarnation=0, reason="stopped", round=2), 1.0)
    assert not core.cohort_past(3)  # stopped mid-run: says nothing of round 3
    core.handle("p2", Leave(sender="p2", incarnation=0, reason="finished", round=4), 1.0)
    assert core.cohort_past(3)
    assert not bare(round=2, last_round=3).cohort_past(2)


def test_every_function_protocol_md_names_behind_a_rule_exists():
    # PROTOCOL.md names the function behind each rule; a rename must not leave it pointing
    # at nothing.
    import dataclasses
    import importlib
    import re

    from hfl.peer import (
        inbox,
        membership,
        node,
        outbox,
        procedures,
        rounds,
        runner,
        seeds,
        transport,
    )
    spec = (Path(__file__).resolve().parent.parent / "PROTOCOL.md").read_text()
    owners = {"PeerCore": PeerCore, "Membership": Membership, "Node": node.Node,
              "RoundProcedures": procedures.RoundProcedures, "RoundBuffer": rounds.RoundBuffer,
              "Member": membership.Member, "SeedStore": seeds.SeedStore, "Outbox": outbox.Outbox,
              "RoundRecorder": runner.RoundRecorder, "FloodBudget": inbox.FloodBudget,
              "ZmqTransport": transport.ZmqTransport}
    named = set(re.findall(r"`([A-Z]\w*)\.(\w+)`", spec))
    assert len(named) > 30
    unknown = sorted({cls for cls, _ in named} - set(owners))
    assert not unknown, f"PROTOCOL.md names classes this test does not know: {unknown}"

    def has(cls: type, attr: str) -> bool:
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else ()
        return hasattr(cls, attr) or attr in fields

    missing = sorted(f"{cls}.{attr}" for cls, attr in named if not has(owners[cls], attr))
    # Dotted paths (`hfl.peer.core.SHARED_ABSENT`): a module, or a module's name.
    for path in sorted(set(re.findall(r"`(hfl(?:\.\w+)+)`", spec))):
        try:
            importlib.import_module(path)
        except ImportError:
            module, _, name = path.rpartition(".")
            if not hasattr(importlib.import_module(module), name):
                missing.append(path)
    assert not missing, f"PROTOCOL.md names what does not exist: {missing}"


# ---------------------------------------------------------------- rules moved from the shell


def test_the_join_waits_for_min_peers_a_resumed_peer_for_one_and_stop_if_alone_for_another():
    # RoundProcedures.join waits for PeerCore.join_need peers, ourselves included.
    assert bare(cohort_size=5).join_need() == 5
    assert bare(cohort_size=1).join_need(stop_if_alone=True) == 2  # never trains alone
    assert bare(cohort_size=5, round=4).join_need() == 2  # one of its old cohort is enough
    assert bare(cohort_size=1, round=4).join_need() == 1


def test_a_late_tick_slows_blame_and_a_stall_is_not_held_against_the_others():
    from types import SimpleNamespace

    timing = SimpleNamespace(heartbeat_interval_s=0.5, suspect_after_s=2.0, dead_after_s=5.0)
    core = bare(timing=timing)
    core.membership.mode = "swim"  # Lifeguard's local health counts in swim mode only
    mem, p1 = core.membership, core.membership.members["p1"]
    heard = mem.heard_at(p1)
    assert core.stood_still(0.2) is False and core.membership.patience() == 1
    assert core.stood_still(0.5) is False  # a whole interval late: slower to blame
    assert core.membership.patience() > 1
    assert mem.heard_at(p1) == heard  # but nobody's silence moved
    # Stood still beyond max(2 intervals, suspect_after_s / 2): the others were silent
    # because we were not listening.
    assert core.stood_still(1.1) is True
    assert mem.heard_at(p1) == heard + 1.1


def test_a_member_removed_from_the_allow_list_stops_being_one_and_its_key_is_not_trusted():
    core = bare(allowed_peers=frozenset({"p0", "p1", "p2"}),
                verify_keys={"p0": b"k0", "p1": b"k1", "p2": b"k2"})
    out = core.allow_list_changed(frozenset({"p0", "p1"}), frozenset({"p2"}),
                                  {"p0": b"k0", "p1": b"k1", "p2": b"k2"})
    assert [type(i) for i in out] == [Say, type(WAKE)] and "p2 removed" in out[0].template % out[0].args
    assert core.membership.members["p2"].status == "left"
    assert core.allowed_peers == {"p0", "p1"} and set(core.verify_keys) == {"p0", "p1"}
    assert core.allow_list_changed(frozenset({"p0", "p1"}), frozenset({"p9"})) == []  # not a member


def test_missing_seed_chunks_are_asked_of_each_live_member_that_has_them():
    from hfl.peer.instructions import Send

    class Store:  # which chunks of each member's seed set we still miss
        def missing(self, owner, incarnation):
            return {"p1": [2, 5], "p2": []}.get(owner)

    core = bare(members=("p1", "p2", "p3"), seeds=Store())
    asked = {i.peer_id: i.msg.chunks for i in core.seed_requests() if isinstance(i, Send)}
    assert asked == {"p1": [2, 5], "p3": []}  # p2's set is complete; p3's: all of it


def test_each_seed_chunk_goes_to_an_asker_once_per_two_heartbeats():
    # A member that asked for the whole seed set in every message had the set sent each
    # time (a 30-byte ask bought the set's upload). Each chunk now goes to one asker at
    # most once per SEED_RESEND_INTERVALS heartbeat intervals; an honest peer asks every
    # fourth tick and gets every chunk it still misses.
    import numpy as np

    from hfl.peer.instructions import ServeSeeds
    from hfl.peer.seeds import SeedStore
    from hfl.protocol import SeedRequest

    x, y = np.zeros((40, 4), np.float32), np.zeros(40, np.int64)
    core = ticking()
    core.seeds = SeedStore("p0", (x, y), chunk_bytes=10 * (x[0].nbytes + 8))  # 4 chunks

    def served(asker, chunks, now):
        out = core.handle(asker, SeedRequest(sender=asker, incarnation=0, owner="p0",
                                             chunks=chunks), now)
        sends = [i for i in out if isinstance(i, ServeSeeds)]
        assert all((i.peer_id, i.address) == (asker, f"mem://{asker}") for i in sends)
        assert all(c.owner == "p0" and c.sender == "p0" for i in sends for c in i.chunks)
        return [c.chunk for i in sends for c in i.chunks]

    assert served("p1", [], 1.0) == [0, 1, 2, 3]  # all of it
    assert served("p1", [], 1.1) == [] and served("p1", [3, 3, 3], 1.5) == []  # flooding
    assert served("p2", [1, 1, 9], 1.5) == [1]  # another asker; each chunk once, in range
    assert served("p1", [2], 2.0) == [2]  # (two heartbeat intervals later: again)
    assert served("p1", [0], 1.9) == []
    assert served("p1", [], 2.9) == [0, 1, 3]  # (chunk 2 went at 2.0)
    assert served("p1", [], 9.0) == [0, 1, 2, 3]
    assert served("p2", [0], 9.0) == [0]
    assert not [i for i in core.handle("p2", SeedRequest(sender="p2", incarnation=0, owner="p9",
                                                         chunks=[]), 9.5)
                if isinstance(i, ServeSeeds)]  # (another member's set: never ours to send)


def test_a_seed_chunk_is_kept_only_from_its_owner():
    # We ask each member for its own set (seed_requests). A chunk of another's set was
    # kept: a member could get in first with its own labels under a peer's name (the
    # real chunks were then refused as duplicates), or name a set after a megabyte-long
    # id gossip taught us (FedMD names the set in its knowledge, whose header then
    # broke the bound). Dropped with the reason.
    import numpy as np

    from hfl.peer.instructions import Dropped
    from hfl.peer.seeds import SeedStore, digest
    from hfl.protocol import SeedChunk

    core = bare()
    x, y = np.zeros((1, 4), np.float32), np.zeros(1, np.int64)

    def chunk(owner, sums=None):
        return SeedChunk(sender="p1", incarnation=0, owner=owner, chunk=0, num_chunks=1,
                         start=0, total=1, digest=sums or digest(x, y), tensors={"x": x, "y": y})

    # A peer that keeps no seed sets drops every chunk, saying so.
    drop, = [i for i in core.handle("p1", chunk("p1"), 1.0) if isinstance(i, Dropped)]
    assert (drop.code, drop.reason) == ("seed_rejected", "this peer keeps no seed sets")
    core.seeds = SeedStore("p0", None)
    assert not [i for i in core.handle("p1", chunk("p1"), 1.0) if isinstance(i, Dropped)]
    assert core.seeds.has_all(["p1"])  # kept: the owner's own set
    for owner in ("p2", "x" * 100_000):
        out = core.handle("p1", chunk(owner), 1.0)
        drop, = [i for i in out if isinstance(i, Dropped)]
        assert drop.code == "seed_rejected" and "only a member's own set" in drop.reason
        assert len(drop.reason) < 200
        assert set(core.seeds.sets) == {"p1"}
    # What the store refuses is dropped with its reason (here: a wrong digest).
    core.seeds = SeedStore("p0", None)
    drop, = [i for i in core.handle("p1", chunk("p1", "0" * 64), 1.0) if isinstance(i, Dropped)]
    assert drop.code == "seed_rejected" and "does not match its digest" in drop.reason
    # Samples of no values (x of shape (1, 0)) are dropped, not raised (their digest
    # raised a TypeError inside handle: a review).
    x = np.zeros((1, 0), np.float32)
    drop, = [i for i in core.handle("p1", chunk("p1", "0" * 64), 1.0) if isinstance(i, Dropped)]
    assert drop.code == "seed_rejected" and "has shapes (1, 0) / (1,)" in drop.reason


def test_hello_terms_name_a_cohort_option_the_method_cannot_use():
    from types import SimpleNamespace

    import pytest

    from hfl.peer.core import hello_terms

    def cohort(**kw):
        return SimpleNamespace(**{"name": "c", "algorithm": "fedh2l", "rounds": 5, **kw})

    terms = hello_terms(cohort(fanout=3, communicate_every=2), "broadcast", 10, False, {"d": 1})
    assert terms["shared"] == {"d": 1, "fanout": 3, "communicate_every": 2}
    # cohort.overlap: peers must agree (a cohort mixing both orders would be reported as
    # one); unset, the hello is what it always was
    terms = hello_terms(cohort(overlap=True), "broadcast", 10, False, {"d": 1})
    assert terms["shared"] == {"d": 1, "overlap": 1}
    with pytest.raises(ValueError, match="cohort.overlap: applies to broadcast-mode .* Remove"):
        hello_terms(cohort(overlap=True), "aggregator", 10, False, {})
    assert hello_terms(cohort(), "aggregator", 10, True, {})["shared"] == {"aggregate_everywhere": 1}
    with pytest.raises(ValueError, match="cohort.fanout: applies to broadcast-mode .* Remove cohort.fanout"):
        hello_terms(cohort(fanout=3), "aggregator", 10, False, {})
    with pytest.raises(ValueError, match="cohort.communicate_every: applies to methods that share"):
        hello_terms(cohort(communicate_every=2), "local", 10, False, {})


def test_an_undecodable_message_is_dropped_and_a_member_is_told_only_what_we_do_not_understand():
    from hfl.protocol import ErrorCode, ProtocolError

    core = bare()
    out = core.undecodable("p1", ProtocolError(ErrorCode.UNKNOWN_TYPE, "type 'vote'", "vote"))
    assert [type(i) for i in out] == [Dropped, Reply]
    assert out[1].peer_id == "p1" and out[1].msg.code == ErrorCode.UNKNOWN_TYPE
    assert out[1].msg.ref_type == "vote"  # PROTOCOL.md: the unknown type, where it was read
    # Not a member (nowhere to answer), or a malformed message: dropped, no answer.
    assert [type(i) for i in core.undecodable("p9", ProtocolError(ErrorCode.UNKNOWN_TYPE, "x"))] \
        == [Dropped]
    assert [type(i) for i in core.undecodable("p1", ProtocolError(ErrorCode.BAD_HEADER, "x"))] \
        == [Dropped]


def test_the_commit_of_a_result_absorbed_already_is_no_drop():
    # A member took round 2's result on its aggregator's heartbeat and moved on; the
    # commit came after. It was dropped as stale with a warning the launcher shows on
    # the terminal of a healthy run. Another digest for that round still is a drop.
    core = bare(round=2)
    core.note_absorbed(2, "d" * 64, "p1", 1.0)
    core.buffer.advance(3)
    core.round = 3
    late = Commit(sender="p1", incarnation=0, round=2, epoch=0, digest="d" * 64)
    assert not [i for i in core.handle("p1", late, 1.1) if isinstance(i, Dropped)]
    other = Commit(sender="p1", incarnation=0, round=2, epoch=0, digest="e" * 64)
    assert [i for i in core.handle("p1", other, 1.2) if isinstance(i, Dropped)]


def test_a_peer_whose_hello_was_refused_is_taken_back_by_no_other_message():
    # An attack review: p2 restarted (incarnation 1) with another cohort.rounds, or on
    # p0's data part. Its hello was refused, but its next heartbeat, or its own refusal
    # of our hello, marked it alive again ("restarted"): its knowledge and results were
    # taken and it was elected, 1.4 s later. Now nothing of a refused life is taken
    # until a hello of it agrees; a later life's hello is checked as any.
    core = bare()
    core.membership.tick(30.0)  # p1 and p2: dead by silence
    beat = Heartbeat(sender="p2", incarnation=1, round=1)
    out = core.handle("p2", dataclasses.replace(hello("p2", rounds=7), incarnation=1), 30.1)
    assert [i.code for i in out if isinstance(i, Dropped)] == ["cohort_mismatch"]
    assert [i.code for i in core.handle("p2", beat, 30.2) if isinstance(i, Dropped)] == [
        "cohort_mismatch"]
    refusal = Error(sender="p2", incarnation=1, code="cohort_mismatch", ref_type="hello",
                    reason="rounds differs")
    assert [type(i).__name__ for i in core.handle("p2", refusal, 30.3)] == ["Refused"]
    # its earlier life's late welcome or hello lifts nothing (a review: the misconfigured
    # life was then taken in by its next heartbeat)
    old_welcome = Welcome(sender="p2", incarnation=0, address="mem://p2", round=1)
    core.handle("p2", old_welcome, 30.35)
    core.handle("p2", hello("p2"), 30.36)
    assert [i.code for i in core.handle("p2", beat, 30.4) if isinstance(i, Dropped)] == [
        "cohort_mismatch"]
    assert core.membership.members["p2"].status == "dead"
    assert "p2" not in core.membership.live_view()
    # fixed and restarted: its hello agrees, and it is a member again
    assert not [i for i in core.handle("p2", dataclasses.replace(hello("p2"), incarnation=2), 31.0)
                if isinstance(i, Dropped)]
    assert not [i for i in core.handle("p2", dataclasses.replace(beat, incarnation=2), 31.1)
                if isinstance(i, Dropped)]
    assert "p2" in core.membership.live_view()
    # A hello forged in p1's name (plaintext: anyone can claim any id) shuts p1 out only
    # until p1 takes our hello: its welcome says its terms agree (a review: p1, alive to
    # its own side, never greets us again, and was shut out for the run). A refusal of
    # ours that a member sends (or that is forged) refuses nothing.
    core.handle("p1", dataclasses.replace(hello("p1", rounds=7), incarnation=0), 31.2)
    beat1 = Heartbeat(sender="p1", incarnation=0, round=1)
    assert [i.code for i in core.handle("p1", beat1, 31.3) if isinstance(i, Dropped)] == [
        "cohort_mismatch"]
    welcome = Welcome(sender="p1", incarnation=0, address="mem://p1", round=1)
    assert not [i for i in core.handle("p1", welcome, 31.4) if isinstance(i, Dropped)]
    assert not [i for i in core.handle("p1", beat1, 31.5) if isinstance(i, Dropped)]
    core.handle("p1", dataclasses.replace(refusal, sender="p1", incarnation=0), 31.6)
    assert not [i for i in core.handle("p1", beat1, 31.7) if isinstance(i, Dropped)]
