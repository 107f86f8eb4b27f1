"""A malicious member against the commit protocol, on a bare protocol core (issue 35):
each rule that keeps a member's lie from steering an honest aggregator, checked on
hand-built views. tests/test_trust.py runs the same attacks against a live cohort."""

from __future__ import annotations

import numpy as np

from hfl.peer.core import NO_DIGEST, PeerCore, payload_digest
from hfl.peer.membership import Membership
from hfl.protocol import AggregateResult, Knowledge

IDS = ["p0", "p1", "p2", "p3"]
R = 2  # round 2: p2 is the candidate of epoch 0, p3 of epoch 1, p0 of 2, p1 of 3


def core(me: str = "p2") -> PeerCore:
    c = PeerCore(me, mode="aggregator", everywhere=False, lookahead=2, cohort_size=len(IDS))
    c.membership = Membership(me, f"mem://{me}", 0, 2.0, 4.0)
    for p in IDS:
        c.membership.heard_from(p, 0, 0.0, address=f"mem://{p}", round=R)
    c.buffer.advance(R)
    c.round = R
    return c


def result(sender: str, epoch: int, value: float) -> AggregateResult:
    return AggregateResult(sender=sender, incarnation=0, round=R, epoch=epoch, kind="weights",
                           contributors=IDS, tensors={"w": np.full(3, value, np.float32)})


def claim(sender: str, epoch: int, accepted_epoch: int = -1, digest: str = "") -> Knowledge:
    return Knowledge(sender=sender, incarnation=0, round=R, kind="weights", epoch=epoch,
                     accepted_epoch=accepted_epoch, accepted_digest=digest,
                     tensors={"w": np.ones(3, np.float32)})


def hold(c: PeerCore, *msgs) -> dict[str, Knowledge]:
    for m in msgs:
        if isinstance(m, AggregateResult):
            assert c.admit_result(m) is None
            assert c.buffer.offer_result(m) is None
        else:
            assert c.admit_knowledge(m) is None
            assert c.buffer.offer_knowledge(m) is None
    return c.promises(R)


def test_a_contribution_claiming_a_later_epoch_than_its_own_is_a_lie():
    c = core()
    d = "d" * 64
    drop = c.admit_knowledge(claim("p3", epoch=0, accepted_epoch=1, digest=d))
    assert drop is not None and drop.code == "lying_claim" and "p3" in drop.reason
    assert c.admit_knowledge(claim("p1", epoch=1, accepted_epoch=1, digest=d)) is None
    assert c.admit_knowledge(claim("p1", epoch=1, accepted_epoch=0, digest=d)) is None


def test_a_report_above_the_aggregators_epoch_never_has_it_publish_a_forged_result():
    # p3 forged round 2's epoch-1 result (the rotation elects it there) and promised that
    # epoch, claiming it accepted its own forgery: before, p2 published it as its own.
    c = core("p2")
    forged = result("p3", 1, 0.0)
    promised = hold(c, forged, claim("p3", 1, 1, payload_digest(forged)), claim("p0", 0), claim("p1", 0))
    assert c.proposal(R, promised) == ("own", None, {})


def test_a_report_of_a_result_only_this_peer_could_have_published_is_checked_against_its_own():
    c = core("p2")
    promised = hold(c, claim("p3", 0, 0, "9" * 64), claim("p0", 0), claim("p1", 0))
    decision, res, refused = c.proposal(R, promised)
    assert (decision, res) == ("own", None)  # before: "abstain", every round p3 took part in
    assert list(refused) == ["p3"] and "never published" in refused["p3"]
    # What p2 did publish at epoch 0 is a true report: it is published again.
    mine = result("p2", 0, 1.0)
    digest = c.accept(mine)
    c.expect_acks(R, 0, digest)
    c.epoch = 0
    promised = {**promised, "p3": claim("p3", 0, 0, digest)}
    assert c.proposal(R, promised) == ("repeat", mine, {})


def test_a_report_of_another_candidates_earlier_epoch_is_still_honoured():
    # Paxos's rule stands: p0, aggregator of epoch 2 after p2 and p3 failed, must publish
    # again what a promiser accepted at epoch 1 (it may be committed), and abstain when it
    # holds no copy of it.
    c = core("p0")
    c.epoch = 2
    honest = result("p3", 1, 0.5)
    promised = hold(c, honest, claim("p1", 2, 1, payload_digest(honest)), claim("p2", 2))
    assert c.proposal(R, promised) == ("repeat", honest, {})
    c2 = core("p0")
    c2.epoch = 2
    promised = hold(c2, claim("p1", 2, 1, "f" * 64), claim("p2", 2))
    assert c2.proposal(R, promised) == ("abstain", None, {})


# ------------------------------------------------------------- certified commits

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat  # noqa: E402

from hfl.protocol import Ack, Commit  # noqa: E402

KEYS = {p: Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32) for i, p in enumerate(IDS)}
VERIFY = {p: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for p, k in KEYS.items()}


def signed_core(me: str) -> PeerCore:
    c = core(me)
    c.cohort, c.signer, c.verify_keys = "hfl#1", KEYS[me].sign, dict(VERIFY)  # (run 1)
    return c


def sig(peer: str, c: PeerCore, r: int, e: int, digest: str) -> str:
    """What ``peer``'s own core would sign (the test holds every key)."""
    return KEYS[peer].sign(c.ack_statement(r, e, digest)).hex()


def test_a_commit_counts_only_a_quorum_of_acks_each_signed_by_its_member():
    c = signed_core("p0")
    assert c.quorum() == 3  # floor((4 + 1) / 2) + 1: two quorums share an honest member
    d = "ab" * 32

    def commit(cert):
        return Commit(sender="p2", incarnation=0, round=R, epoch=0, digest=d, certificate=cert)

    two = {p: sig(p, c, R, 0, d) for p in ("p2", "p0")}
    drop = c.admit_commit(commit(two))
    assert drop.code == "uncertified_commit" and "2 signed acks of the 3" in drop.reason
    forged = {**two, "p1": sig("p2", c, R, 0, d)}  # p2 signing in p1's name
    assert c.admit_commit(commit(forged)).code == "uncertified_commit"
    other = {**two, "p1": sig("p1", c, R, 0, "cd" * 32)}  # p1 acked another result
    assert c.admit_commit(commit(other)).code == "uncertified_commit"
    elsewhere = signed_core("p0")
    elsewhere.cohort = "other"
    replayed = {p: sig(p, elsewhere, R, 0, d) for p in ("p2", "p0", "p1")}  # another cohort's
    assert c.admit_commit(commit(replayed)).code == "uncertified_commit"
    assert c.committed_result(R) is None and (R, d) not in c.commits
    three = {**two, "p1": sig("p1", c, R, 0, d)}
    assert c.admit_commit(commit(three)) is None and (R, d) in c.commits


def test_an_unsigned_ack_is_not_counted_and_a_late_ack_gets_the_commit_again():
    c = signed_core("p2")
    mine = result("p2", 0, 1.0)
    d = c.accept(mine)
    c.expect_acks(R, 0, d)
    assert c.certificate(R, 0, d) == {"p2": sig("p2", c, R, 0, d)}
    bad = Ack(sender="p0", incarnation=0, round=R, epoch=0, digest=d, sig="00" * 64)
    assert c.note_ack(bad).code == "bad_signature" and c.acked(R, 0, d) == 1
    for p in ("p0", "p1"):
        assert c.note_ack(Ack(sender=p, incarnation=0, round=R, epoch=0, digest=d,
                              sig=sig(p, c, R, 0, d))) is None
    assert c.acked(R, 0, d) == 3 and set(c.certificate(R, 0, d)) == {"p0", "p1", "p2"}
    again = Ack(sender="p0", incarnation=0, round=R, epoch=0, digest=d, sig=sig("p0", c, R, 0, d))
    assert c.commit_of(again) is None  # not committed yet
    c.commits.add((R, d))
    c.last_commit = Commit(sender="p2", incarnation=0, round=R, epoch=0, digest=d,
                           certificate=c.certificate(R, 0, d))
    c.forget_before(R + 1)  # the aggregator is in the next round already
    assert c.commit_of(again) is c.last_commit  # the lost commit goes out again
    other = Ack(sender="p0", incarnation=0, round=R, epoch=0, digest="ee" * 32, sig="")
    assert c.commit_of(other) is None


def test_a_heartbeat_is_no_proof_of_a_commit_where_commits_are_certified():
    from hfl.protocol import Heartbeat

    c = signed_core("p0")
    res = result("p2", 0, 1.0)
    d = c.accept(res)
    beat = Heartbeat(sender="p2", incarnation=0, round=R + 1, absorbed_round=R, absorbed_digest=d)
    c.note_heartbeat(beat)
    assert c.committed(R) is None
    assert c.commit_missing(beat) == (R, 0, d)  # ack again: the commit comes back
    plain = core("p0")
    plain.accept(res)
    plain.note_heartbeat(beat)
    assert plain.committed(R) is res and plain.quorum() == 3  # (n // 2 + 1 without signatures)


def relayed(sender: str, good: AggregateResult, cert: dict[str, str], **change):
    from hfl.protocol import Relayed

    fields = dict(sender=sender, incarnation=0, round=good.round, epoch=good.epoch,
                  aggregator=good.sender, kind=good.kind, contributors=list(good.contributors),
                  meta=good.meta, tensors=good.tensors, certificate=cert)
    return Relayed(**{**fields, **change})


def test_a_result_relayed_with_the_quorums_signed_acks_replaces_what_a_twin_showed():
    # PROTOCOL.md, Commit (relay): p2, elected, showed p0 a zero model and the others
    # the real result, which they acked and absorbed; p0 took no result in each of p2's
    # rounds (hfl.sim.protocol --peers 4 --byzantine p2:commit --buggify, seeds 27, 311).
    from hfl.peer.instructions import Dropped

    c = signed_core("p0")
    shown = result("p2", 0, 0.0)
    c.accept(shown)
    good = result("p2", 0, 1.0)
    d = payload_digest(good)
    cert = {p: sig(p, c, R, 0, d) for p in ("p1", "p2", "p3")}

    def dropped(msg, core=c):
        core.relays_taken.clear()  # (one relay per relayer and round is handled)
        return [(i.code, i.reason) for i in core.handle(msg.sender, msg, 5.0)
                if isinstance(i, Dropped)]

    two = {p: cert[p] for p in ("p1", "p2")}
    assert dropped(relayed("p1", good, two))[0][0] == "uncertified_commit"
    # the same acks, another payload (the relayer's own): they do not sign its digest
    assert dropped(relayed("p1", good, cert, tensors={"w": np.full(3, 9.0, np.float32)})
                   )[0][0] == "uncertified_commit"
    assert dropped(relayed("p1", good, cert, epoch=1))[0][0] == "uncertified_commit"
    assert dropped(relayed("p1", good, cert, kind="none"))[0][0] == "rejected_result"
    # Not signed, so checked: the aggregator (it becomes the absorbed result's source) is
    # a member with a key and not p0 itself (which would then never relay it), and the
    # contributors are distinct such members, a quorum.
    assert dropped(relayed("p1", good, cert, aggregator="made-up"))[0][0] == "wrong_aggregator"
    assert dropped(relayed("p1", good, cert, aggregator="p0"))[0][0] == "wrong_aggregator"
    assert dropped(relayed("p1", good, cert, contributors=["p1", "p2"]))[0][0] == "below_quorum"
    assert dropped(relayed("p1", good, cert, contributors=["p1", "p1", "p2", "p3"])
                   )[0][0] == "below_quorum"
    assert dropped(relayed("p1", good, cert, contributors=[*IDS, "made-up"])
                   )[0][0] == "below_quorum"
    assert dropped(relayed("p1", good, cert, round=R + 1))[0][0] == "stale_result"
    plain = core("p0")  # no signing keys: nothing proves a relayed result was committed
    assert dropped(relayed("p1", good, cert), plain)[0][0] == "uncertified_commit"
    no_run = signed_core("p0")  # no cohort.run: an earlier run's certificate would check
    no_run.cohort = "hfl"
    assert dropped(relayed("p1", good, {p: sig(p, no_run, R, 0, d) for p in cert}),
                   no_run)[0][0] == "uncertified_commit"
    everywhere = signed_core("p0")  # no aggregator, nothing committed
    everywhere.everywhere = True
    assert dropped(relayed("p1", good, cert), everywhere)[0][0] == "wrong_aggregator"
    assert c.committed(R) is None and c.usable_result(R) is None
    assert dropped(relayed("p1", good, cert)) == []
    taken = c.committed(R)
    assert taken is not None and float(taken.tensors["w"][0]) == 1.0 and taken.sender == "p2"
    assert c.usable_result(R) is taken and c.committed_result(R) is taken
    assert c.marker(R) == (0, d)  # what it reports to a later epoch: the committed value
    assert c.relayed_by == {R: "p1"}
    assert dropped(relayed("p3", good, cert))[0][0] == "stale_result"  # held already
    # The twin sends what it showed again: p0 does not sign a second digest for (R, 0).
    assert c.ack_again(shown) is None
    # One relay per relayer and round is handled (each costs a digest and signature
    # checks): a second from p1 is dropped unread.
    c2 = signed_core("p0")
    c2.handle("p1", relayed("p1", good, two), 5.0)
    out = c2.handle("p1", relayed("p1", good, cert), 5.1)
    assert [i.code for i in out if isinstance(i, Dropped)] == ["stale_result"]


def test_a_relayed_certificate_of_an_earlier_epoch_does_not_override_a_later_accepted_one():
    # A review's attack: p2 (epoch 0) committed v to p3 alone and died; p3, the
    # aggregator of epoch 1, ignored p0's promise (it reported v) and had p0 and p1 ack
    # its own w, committed w to p1, and relayed v's epoch-0 certificate to p0: the two
    # honest members absorbed different results. A peer that accepted another result at
    # a later epoch now refuses the earlier one (its honest relayers give it w).
    from hfl.peer.instructions import Dropped

    c = signed_core("p0")
    v, w = result("p2", 0, 1.0), result("p3", 1, 0.0)
    dv = payload_digest(v)
    c.epoch = 1
    c.accept(w)
    cert = {p: sig(p, c, R, 0, dv) for p in ("p0", "p2", "p3")}
    out = c.handle("p3", relayed("p3", v, cert), 5.0)
    drops = [(i.code, i.reason) for i in out if isinstance(i, Dropped)]
    assert drops and drops[0][0] == "stale_result" and "epoch 1" in drops[0][1], drops
    assert c.committed(R) is None and c.marker(R) == (1, payload_digest(w))
    # The same certificate at its own epoch's result, held at that epoch: taken.
    c2 = signed_core("p0")
    c2.accept(result("p2", 0, 0.5))
    assert not [i for i in c2.handle("p3", relayed("p3", v, cert), 5.0)
                if isinstance(i, Dropped)]


def test_a_member_relays_what_it_absorbed_once_to_a_contributor_still_waiting_for_it():
    from hfl.peer.config import TimingConfig
    from hfl.peer.instructions import Dropped, Reply
    from hfl.protocol import Heartbeat

    good = result("p2", 0, 1.0)
    cores = {p: signed_core(p) for p in ("p1", "p3")}
    for c in cores.values():
        c.timing = TimingConfig()
        d = c.accept(good)
        cert = {p: sig(p, c, R, 0, d) for p in ("p1", "p2", "p3")}
        assert c.admit_commit(Commit(sender="p2", incarnation=0, round=R, epoch=0, digest=d,
                                     certificate=cert)) is None
        c.note_absorbed(R, d, "p2", 10.0)
    hb_s = TimingConfig().heartbeat_interval_s

    def relays(c, sender="p0", t=10.0 + 2 * hb_s, **kw):
        hb = Heartbeat(sender=sender, incarnation=0, round=kw.get("round", R),
                       absorbed_round=kw.get("absorbed", R - 1),
                       sitting_out=kw.get("sitting_out", 0))
        return [i.msg for i in c.handle(sender, hb, t) if isinstance(i, Reply)]

    c1 = cores["p1"]
    assert relays(c1, t=10.0 + hb_s) == []  # its aggregator's copy goes first
    assert relays(c1, absorbed=R) == []  # it has the result
    assert relays(c1, sitting_out=R) == []
    assert relays(c1, sender="p2") == []  # the aggregator itself
    sent = relays(c1)
    assert [(m.TYPE, m.round, m.aggregator, sorted(m.certificate)) for m in sent] == [
        ("relayed", R, "p2", ["p1", "p2", "p3"])]
    assert relays(c1, t=20.0) == []  # once
    # f + 1 = 2 relayers of the signers that are neither aggregator nor receiver: p1, p3
    assert c1.relayers(R, sent[0].certificate, "p2", "p0") == ["p1", "p3"]
    assert [m.TYPE for m in relays(cores["p3"])] == ["relayed"]
    # The receiver, shown another result by p2, takes the relayed one.
    victim = signed_core("p0")
    victim.accept(result("p2", 0, 0.0))
    assert not [i for i in victim.handle("p1", sent[0], 11.0) if isinstance(i, Dropped)]
    assert victim.committed(R).tensors["w"][0] == 1.0
    # A member that contributed nothing may still be training: nothing relayed to it.
    c5 = signed_core("p1")
    c5.timing = TimingConfig()
    few = AggregateResult(sender="p2", incarnation=0, round=R, epoch=0, kind="weights",
                          contributors=["p1", "p2", "p3"], tensors={"w": np.ones(3, np.float32)})
    d = c5.accept(few)
    cert = {p: sig(p, c5, R, 0, d) for p in ("p1", "p2", "p3")}
    assert c5.admit_commit(Commit(sender="p2", incarnation=0, round=R, epoch=0, digest=d,
                                  certificate=cert)) is None
    c5.note_absorbed(R, d, "p2", 10.0)
    assert relays(c5) == []
    # Nor once the member is known past the round; and the copy goes at the next exchange.
    c3 = cores["p3"]
    c3.relayed_to.clear()
    c3.membership.heard_from("p0", 0, 12.0, round=R + 1)
    assert relays(c3) == []
    c3.forget_before(R + 1)
    assert c3.relayable is not None
    c3.forget_before(R + 2)
    assert c3.relayable is None


def test_after_the_last_round_a_member_stays_for_those_it_may_relay_the_result_to():
    # PROTOCOL.md, Certified commits (relay): after the last round nobody but its
    # aggregator stays with the result, and the aggregator may be the twin that showed
    # a member another one (hfl.sim.protocol --peers 4 --byzantine p2:commit --buggify,
    # seed 311: p0 went without round 10). A relayer stays until those it may relay to
    # hold it, and tells its own relayers at once that it holds it.
    from hfl.peer.config import TimingConfig
    from hfl.peer.instructions import Broadcast, Reply, Wait
    from hfl.peer.procedures import RoundProcedures
    from hfl.protocol import Heartbeat
    from tests.test_procedures import Clock, Stepper

    c = signed_core("p1")
    c.timing, c.last_round = TimingConfig(), R
    good = result("p2", 0, 1.0)
    d = c.accept(good)
    cert = {p: sig(p, c, R, 0, d) for p in ("p1", "p2", "p3")}
    assert c.admit_commit(Commit(sender="p2", incarnation=0, round=R, epoch=0, digest=d,
                                 certificate=cert)) is None
    c.note_absorbed(R, d, "p2", 10.0)
    c.round = R + 1
    assert c.relaying_last_result(R) == ["p0", "p3"]  # p1 relays to both (f + 1 = 2 of them)
    assert c.own_relayers(R) == ["p3"]  # and p3 to p1 (the only other signer)
    clock = Clock()
    clock.t = 10.0
    fin = Stepper(RoundProcedures(c, now=clock.now).finish(R))
    stay = fin.until(Wait)
    hb = c.timing.heartbeat_interval_s
    assert stay.deadline == 10.0 + max(c.timing.aggregate_grace_s, 4 * hb) and not stay.done()
    assert [(i.peer_ids, i.msg.TYPE) for i in fin.seen if isinstance(i, Broadcast)] == [
        (("p3",), "heartbeat")]
    c.handle("p3", Heartbeat(sender="p3", incarnation=0, round=R + 1, absorbed_round=R), 10.5)
    assert c.relaying_last_result(R) == ["p0"] and not stay.done()
    out = c.handle("p0", Heartbeat(sender="p0", incarnation=0, round=R, absorbed_round=R - 1),
                   10.0 + 2 * hb)
    assert [i.msg.TYPE for i in out if isinstance(i, Reply)] == ["relayed"]
    assert stay.done()
    fin.answer(True)
    fin.until()
    assert fin.done and [i.msg.TYPE for i in fin.seen if isinstance(i, Broadcast)] == [
        "heartbeat", "leave"]
    # Where nobody answers, it leaves after that stay, and says for whom it stayed.
    c.relayed_to.clear()
    fin = Stepper(RoundProcedures(c, now=clock.now).finish(R))
    fin.until(Wait)
    fin.answer(False)
    fin.until()
    said = [i.template % i.args for i in fin.seen if type(i).__name__ == "Say"]
    assert any("p0 showed no sign of the last result" in line for line in said), said
    # Nor does it stay where it would relay nothing: no run id, or a certificate below
    # its quorum of the moment (a fifth member heard from since; a review).
    c.cohort = "hfl"
    assert c.relaying_last_result(R) == [] and c.own_relayers(R) == []
    c.cohort = "hfl#1"
    c.membership.heard_from("p4", 0, 12.0, address="mem://p4", round=R + 1)
    assert c.quorum() == 4 and c.relaying_last_result(R) == [] and c.own_relayers(R) == []


def test_a_member_whose_aggregator_moved_on_waits_longer_where_a_relay_may_come():
    # p3 (a twin, 5 peers, buggify, seed 967) moved past round 8 without a commit p0
    # could take; p0 waited two heartbeats and left as p1's and p4's relays went out.
    from hfl.peer.config import TimingConfig
    from hfl.peer.procedures import RoundProcedures
    from hfl.protocol import Heartbeat

    c = signed_core("p0")
    c.timing = TimingConfig()
    hb = c.timing.heartbeat_interval_s
    procs = RoundProcedures(c, now=lambda: 0.0)
    assert not c.relay_expected(R) and procs.moved_on_grace(R) == max(2 * hb, 0.25)
    c.handle("p1", Heartbeat(sender="p1", incarnation=0, round=R + 1, absorbed_round=R), 1.0)
    assert c.relay_expected(R) and procs.moved_on_grace(R) == max(4 * hb, 0.25)
    c.cohort = "hfl"  # no run id: nothing is relayed
    assert not c.relay_expected(R)
    plain = core("p0")  # no signing keys: nothing is relayed
    plain.handle("p1", Heartbeat(sender="p1", incarnation=0, round=R + 1, absorbed_round=R), 1.0)
    assert not plain.relay_expected(R)


def test_a_result_accepted_before_a_fail_over_is_taken_once_its_commit_comes():
    # PROTOCOL.md, Commit rule 3: a peer that failed over to epoch 1 still holding the
    # epoch-0 result it accepted takes it when its commit comes after all (it waited
    # for epoch 1's aggregator, which could only publish that value again).
    c = signed_core("p0")
    res = result("p2", 0, 1.0)
    d = c.accept(res)
    c.epoch = 1
    assert c.usable_result(R) is None
    cert = {p: sig(p, c, R, 0, d) for p in ("p0", "p2", "p3")}
    assert c.admit_commit(Commit(sender="p2", incarnation=0, round=R, epoch=0, digest=d,
                                 certificate=cert)) is None
    assert c.usable_result(R) is res


def test_without_signing_keys_a_member_keeps_nothing_to_relay():
    from hfl.peer.config import TimingConfig

    c = core("p1")
    c.timing = TimingConfig()
    good = result("p2", 0, 1.0)
    d = c.accept(good)
    c.commits.add((R, d))  # the aggregator's word: a commit with no certificate
    c.note_absorbed(R, d, "p2", 10.0)
    assert c.absorbed == (R, d, "p2") and c.relayable is None


# ------------------------------------------------------------- equivocation


def everywhere_core(me: str) -> PeerCore:
    c = signed_core(me)
    c.everywhere = True
    return c


def contribution(sender: str, value: float, c: PeerCore, r: int = R, **extra) -> Knowledge:
    k = Knowledge(sender=sender, incarnation=0, round=r, kind="weights",
                  tensors={"w": np.full(3, value, np.float32)}, **extra)
    import dataclasses

    ae, ad = k.accepted_epoch, k.accepted_digest or NO_DIGEST  # its promise (rev. 15)
    return dataclasses.replace(k, sig=KEYS[sender].sign(
        c.statement("knowledge", r, 0, payload_digest(k))).hex(),
        promise_sig=KEYS[sender].sign(c.statement("promise", r, 0, ad, ae)).hex())


def signed(res: AggregateResult, c: PeerCore) -> AggregateResult:
    """``res`` as its aggregator signs it (rev. 15; the test holds every key)."""
    import dataclasses

    return dataclasses.replace(res, sig=KEYS[res.sender].sign(
        c.statement("result", res.round, res.epoch, payload_digest(res))).hex())


def report(c: PeerCore, sender: str, r: int = R + 1) -> Knowledge:
    """``sender``'s next contribution, carrying what it heard in round R."""
    heard_round, heard = c.heard_report()
    assert heard_round == R
    return contribution(sender, 1.0, c, r, heard_round=heard_round, heard=heard,
                        equivocations=dict(c.equivocators))


def test_two_signed_versions_of_one_round_prove_equivocation_and_the_proof_travels():
    a, b, c = everywhere_core("p0"), everywhere_core("p1"), everywhere_core("p2")
    to_a, to_b = contribution("p3", 1.0, a), contribution("p3", 0.0, b)  # p3 equivocates
    for core_, k in ((a, to_a), (b, to_b), (c, to_a)):
        assert core_.admit_knowledge(k) is None and core_.buffer.offer_knowledge(k) is None
        core_.note_heard(R)
    proven, lie = a.check_heard(report(b, "p1"))
    assert proven == ["p3"] and lie is None
    assert a.admit_knowledge(contribution("p3", 1.0, a, R + 1)).code == "equivocator"
    assert "p3" not in a.buffer.received(R)  # what it sent for an open round is left out
    # c was shown the same version as a: it learns of the lie from a's proof.
    proven, _ = c.check_heard(report(a, "p0"))
    assert proven == ["p3"]
    # A peer that got the same version as the reporter finds nothing.
    assert b.check_heard(contribution("p2", 1.0, b, R + 1, heard_round=R,
                                      heard={"p3": ":".join(map(str, b.heard[R]["p3"]))})) == ([], None)


def test_a_report_of_a_version_its_member_never_signed_names_the_reporter():
    a = everywhere_core("p0")
    k = contribution("p3", 1.0, a)
    assert a.admit_knowledge(k) is None and a.buffer.offer_knowledge(k) is None
    a.note_heard(R)
    forged = {"p3": f"0:{'ee' * 32}:{'00' * 64}"}  # p1 says p3 sent it another version
    proven, lie = a.check_heard(contribution("p1", 1.0, a, R + 1, heard_round=R, heard=forged))
    assert proven == [] and "p1 reports a contribution of p3" in lie
    fake_proof = {"p3": f"{R}:0:{'aa' * 32}:{'00' * 64}:0:{'bb' * 32}:{'00' * 64}"}
    huge = {"p3": f"{'9' * 40}:0:{'aa' * 32}:{'00' * 64}:0:{'bb' * 32}:{'00' * 64}"}
    assert a.check_heard(contribution("p1", 1.0, a, R + 1, equivocations=huge)) == ([], None)
    assert a.check_heard(contribution("p1", 1.0, a, R + 1, equivocations=fake_proof)) == ([], None)
    assert a.equivocators == {}


def test_signatures_over_strings_that_are_not_digests_prove_nothing():
    # A member signed two "knowledge" statements over half-megabyte strings of its own
    # choosing and showed them as a proof against itself: every honest peer adopted the
    # proof and passed it on in its own knowledge, whose header then broke the 1 MiB
    # bound (its knowledge went nowhere, every round). A digest is payload_digest's 64
    # hex digits; a signature over anything else is not a statement of a contribution.
    import dataclasses

    a = everywhere_core("p0")
    for long in (65, 4_000):
        d1, d2 = "a" * long, "b" * long
        s1 = KEYS["p3"].sign(a.statement("knowledge", R, 0, d1)).hex()
        s2 = KEYS["p3"].sign(a.statement("knowledge", R, 0, d2)).hex()
        m = Knowledge(sender="p3", incarnation=0, round=R + 1, kind="none",
                      equivocations={"p3": f"{R}:0:{d1}:{s1}:0:{d2}:{s2}"})
        m = dataclasses.replace(m, sig=KEYS["p3"].sign(
            a.statement("knowledge", R + 1, 0, payload_digest(m))).hex())
        assert a.check_heard(m) == ([], None) and a.equivocators == {}
    # the same proof over two 64-digit digests is one
    d1, d2 = "a" * 64, "b" * 64
    s1 = KEYS["p3"].sign(a.statement("knowledge", R, 0, d1)).hex()
    s2 = KEYS["p3"].sign(a.statement("knowledge", R, 0, d2)).hex()
    m = Knowledge(sender="p3", incarnation=0, round=R + 1, kind="none",
                  equivocations={"p3": f"{R}:0:{d1}:{s1}:0:{d2}:{s2}"})
    assert a.check_heard(m)[0] == ["p3"]


def test_two_lives_are_no_excuse_and_an_unsigned_contribution_is_dropped():
    # A member that showed two peers two versions under two incarnations of its own
    # escaped: the proof compared lives. A restarted peer now sits out the rounds its
    # earlier life entered (it never signs one twice), so any two signatures of one
    # round are a proof, whatever the incarnation the messages carried.
    import dataclasses

    a = everywhere_core("p0")
    first = contribution("p3", 1.0, a)
    assert a.admit_knowledge(first) is None
    again = dataclasses.replace(contribution("p3", 2.0, a), incarnation=1)
    assert a.admit_knowledge(again).code == "equivocator" and "p3" in a.equivocators
    unsigned = dataclasses.replace(contribution("p2", 1.0, a), sig="")
    assert a.admit_knowledge(unsigned).code == "bad_signature"
    # Beyond the window too (a fuzzer found far knowledge taken unchecked, and used so
    # once the peer got there): checked, and recorded for the highest far round only,
    # as the buffer keeps it.
    far_unsigned = dataclasses.replace(contribution("p1", 1.0, a, R + 50), sig="")
    assert a.admit_knowledge(far_unsigned).code == "bad_signature"
    far, farther = contribution("p1", 1.0, a, R + 50), contribution("p1", 1.0, a, R + 60)
    assert a.admit_knowledge(far) is None and a.buffer.offer_knowledge(far) is None
    assert (R + 50, "p1") in a.signed_knowledge
    assert a.admit_knowledge(farther) is None and a.buffer.offer_knowledge(farther) is None
    assert {k for k in a.signed_knowledge if k[0] > R + 2} == {(R + 60, "p1")}
    assert a.admit_knowledge(far) is None and a.buffer.offer_knowledge(far) is not None
    assert {k for k in a.signed_knowledge if k[0] > R + 2} == {(R + 60, "p1")}


def test_results_and_commits_a_peer_could_never_use_are_not_held():
    # A fuzzer's finds: a result at a negative epoch elects as epoch + k * n does, and
    # each copy was held with its tensors until the round ended; commits for far rounds
    # with long digests were kept for the whole run.
    c = signed_core("p0")
    for epoch in (-4, -1):
        assert c.admit_result(result("p2", epoch, 1.0)).code == "wrong_aggregator"
    assert c.admit_result(signed(result("p2", 0, 1.0), c)) is None  # (round 2's candidate)
    forged = dataclasses.replace(result("p2", 0, 1.0), sig=KEYS["p3"].sign(b"x").hex())
    assert c.admit_result(forged).code == "unjustified_result"  # (a signature not p2's)
    assert c.buffer.offer_result(result("p2", -4, 1.0)) is not None
    digest = "ab" * 32
    for r, epoch, d in ((R, -4, digest), (R + 10**9, 0, digest), (R - 1, 0, digest),
                        (R, 0, digest * 1000)):
        commit = Commit(sender="p2", incarnation=0, round=r, epoch=epoch, digest=d)
        assert c.admit_commit(commit).code in ("wrong_aggregator", "stale_result"), (r, epoch)
    assert c.commits == set()


def test_every_peer_aggregating_needs_no_byzantine_quorum_and_skips_an_equivocator():
    c = everywhere_core("p0")
    assert c.quorum() == 3  # a majority of 4 (f counts only for certified commits)
    c3 = everywhere_core("p0")
    c3.membership.members.pop("p3")
    c3.cohort_size = 3
    assert c3.quorum() == 2  # not 3 of 3: one silent member must not stop every round
    c.round_began = -1.0
    assert "p3" in c.awaited(R)
    c.equivocators["p3"] = "proof"
    assert "p3" not in c.awaited(R)


def test_the_digest_tells_a_map_from_a_list_of_pairs_and_takes_numpy_scalars():
    base = dict(sender="p0", incarnation=0, round=1, epoch=0, kind="weights")
    as_map = AggregateResult(**base, meta={"x": {"a": 1}})
    as_pairs = AggregateResult(**base, meta={"x": [["a", 1]]})
    assert payload_digest(as_map) != payload_digest(as_pairs)
    scalar = AggregateResult(**base, meta={"acc": np.float32(0.5), "n": np.int64(3)})
    assert payload_digest(scalar) == payload_digest(AggregateResult(**base, meta={"acc": 0.5, "n": 3}))
    big = AggregateResult(**base, tensors={"w": np.arange(3, dtype=">f4")})
    little = AggregateResult(**base, tensors={"w": np.arange(3, dtype="<f4")})
    assert payload_digest(big) == payload_digest(little)


def test_one_member_s_claim_of_a_later_round_moves_no_peer_forward():
    """A peer that finds the cohort ahead catches up to it (a restart), but only as far
    as f + 1 members say, each of its own word: one member whose heartbeats claimed the
    last round made every honest peer skip the whole run, silently (a reviewer's
    attack: 1 round of 10 run, no warning). tests/test_protocol_sim.py runs it live."""
    def view(byzantine, rounds):
        c = PeerCore("p0", mode="aggregator", everywhere=True, lookahead=2, cohort_size=5,
                     byzantine=byzantine, last_round=10)
        c.membership = Membership("p0", "mem://p0", 0, 2.0, 4.0)
        for p, r in rounds.items():
            c.membership.heard_from(p, 0, 0.0, address=f"mem://{p}", round=r)
        c.round = 3
        return c

    liar = {"p1": 3, "p2": 3, "p3": 3, "p4": 10}
    assert view(1, liar).distrusted == 1 and view(1, liar).byzantine == 0  # every peer aggregates
    assert view(1, liar).catch_up(10) == 3
    assert view(1, {**liar, "p3": 7}).catch_up(10) == 7  # two say 7 or more: one is honest
    assert view(1, {"p1": 7}).catch_up(10) == 7  # the only other member: nobody to outvote it
    assert view(0, liar).catch_up(10) == 10  # f = 0 (no signing keys): crash faults only
    c = view(1, {**liar, "p3": 7})
    c.membership.heard_from("p2", 0, 1.0, round=8)  # a round rises: the cache follows
    assert c.catch_up(10) == 8
    c.membership.tick(100.0)  # all silent: dead, and no longer anyone's word
    assert c.cohort_round() == 0 and c.catch_up(10) == 3


def test_an_id_gossip_alone_knows_cannot_make_a_member_the_aggregator_of_a_round():
    # An attack review: p3 gossiped one allow-listed id that never ran (p9). A result
    # was taken from the candidate of the rotation *or* of every member known, gossip
    # included, and with p9 that second order elects p3 for round 8 (the rotation: p0).
    # p3's own zero "result" for (8, 0) was acked and committed by the others, or, with
    # a promise claiming p3 had accepted it, republished by p0 as its own. Now only the
    # rotation's candidate may send a round's result or commit.
    from hfl.protocol import MemberRecord

    r = 8
    cores = {}
    for me in ("p0", "p1"):
        c = signed_core(me)
        c.buffer.advance(r)
        c.round = r
        c.membership.merge([MemberRecord(peer_id="p9", address="tcp://10.9.9.9:1",
                                         incarnation=0)], 0.0, reporter="p3")
        cores[me] = c
    p0, p1 = cores["p0"], cores["p1"]
    assert p0.elect(r) == ("p0", 0) and p0.candidate(sorted([*IDS, "p9"]), r, 0) == "p3"
    forged = AggregateResult(sender="p3", incarnation=0, round=r, epoch=0, kind="weights",
                             contributors=IDS, tensors={"w": np.zeros(3, np.float32)})
    assert p1.admit_result(forged).code == "wrong_aggregator"
    digest = payload_digest(forged)
    acks = {p: sig(p, p1, r, 0, digest) for p in ("p1", "p2", "p3")}
    commit = Commit(sender="p3", incarnation=0, round=r, epoch=0, digest=digest, certificate=acks)
    assert p1.admit_commit(commit).code == "wrong_aggregator"
    # The honest aggregator: p3's promise claims it accepted its forgery at (8, 0), an
    # epoch only p0 could have published: a lie, and p0 publishes its own aggregate.
    for sender in ("p1", "p2"):
        k = contribution(sender, 1.0, p0, r)
        assert p0.admit_knowledge(k) is None and p0.buffer.offer_knowledge(k) is None
    lie = contribution("p3", 1.0, p0, r, accepted_epoch=0, accepted_digest=digest)
    assert p0.admit_knowledge(lie) is None and p0.buffer.offer_knowledge(lie) is None
    decision, res, refused = p0.proposal(r, p0.promises(r))
    assert (decision, res, list(refused)) == ("own", None, ["p3"])



# ------------------------------------------------------------- justified proposals
#
# (rev. 15) A result of an epoch above 0 carries the quorum of signed promises it was
# chosen on, each report with its proof; a member acks it only if it is the value the
# rule picks. Before, a malicious aggregator of epoch 1 could ignore the promises that
# reported epoch 0's committed result and have its own committed (hfl.sim.protocol's
# override twin; tests/test_protocol_sim.py runs it live).

import dataclasses  # noqa: E402


def promise(c: PeerCore, peer: str, epoch: int, ae: int = -1, ad: str = "", signer: str = "") -> str:
    """``peer``'s promise for (R, epoch) reporting (ae, ad), as a result carries it."""
    key = KEYS[signer or peer]
    return f"{epoch}:{ae}:{ad}:" + key.sign(c.statement("promise", R, epoch, ad or NO_DIGEST, ae)).hex()


def at_epoch(res: AggregateResult, c: PeerCore, sender: str, epoch: int, promises: dict,
             proofs: dict) -> AggregateResult:
    return signed(dataclasses.replace(res, sender=sender, epoch=epoch, sig="", promises=promises,
                                      proofs=proofs), c)


def test_a_later_epochs_result_must_be_the_value_its_signed_promises_report():
    c = signed_core("p0")  # a member of round 2: p2 elected at epoch 0, p3 at epoch 1
    v = signed(result("p2", 0, 1.0), c)
    dv = payload_digest(v)
    proof = {f"0:{dv}": {"by": "p2", "sig": v.sig}}
    promises = {"p3": promise(c, "p3", 1), "p1": promise(c, "p1", 1, 0, dv),
                "p0": promise(c, "p0", 1, 0, dv)}
    w = result("p3", 1, 0.0)  # p3's own aggregate, the reports ignored

    def refused(res):
        drop = c.admit_result(res)
        assert drop is not None and drop.code == "unjustified_result", drop
        return drop.reason

    assert "report " + dv[:16] in refused(at_epoch(w, c, "p3", 1, promises, proof))
    assert c.admit_result(at_epoch(v, c, "p3", 1, promises, proof)) is None  # v again: taken
    # Reports that name nothing: any value (nothing was accepted, nothing can be lost).
    empty = {p: promise(c, p, 1) for p in ("p3", "p1", "p0")}
    assert c.admit_result(at_epoch(w, c, "p3", 1, empty, {})) is None
    # What a proposal cannot leave out or make up:
    two = {p: promises[p] for p in ("p3", "p1")}
    assert "2 promise(s) of the 3" in refused(at_epoch(w, c, "p3", 1, two, proof))
    forged = {**empty, "p1": promise(c, "p1", 1, signer="p3")}  # p3 signing in p1's name
    assert "does not check" in refused(at_epoch(w, c, "p3", 1, forged, {}))
    older = {**empty, "p1": promise(c, "p1", 0)}  # a promise for epoch 0 binds nothing at 1
    assert "below 1" in refused(at_epoch(w, c, "p3", 1, older, {}))
    assert "no proof" in refused(at_epoch(v, c, "p3", 1, promises, {}))
    unsigned = {f"0:{dv}": {"by": "p2", "sig": KEYS["p3"].sign(b"x").hex()}}
    assert "not signed by" in refused(at_epoch(v, c, "p3", 1, promises, unsigned))
    # A commit's certificate proves a report too: f + 1 = 2 signed acks hold an honest one.
    acks = {p: sig(p, c, R, 0, dv) for p in ("p1", "p2")}
    assert c.admit_result(at_epoch(v, c, "p3", 1, promises, {f"0:{dv}": {"acks": acks}})) is None
    one = {f"0:{dv}": {"acks": {"p1": acks["p1"]}}}
    assert "fewer than 2 signed acks" in refused(at_epoch(v, c, "p3", 1, promises, one))
    # A result of epoch 0 needs only its aggregator's signature, one that checks; without
    # one (a rev. 14 aggregator) it is taken, and above epoch 0 it is not.
    assert "signature of it" in refused(dataclasses.replace(v, sig=KEYS["p3"].sign(b"x").hex()))
    assert c.admit_result(dataclasses.replace(v, sig="")) is None
    assert "signature of it" in refused(dataclasses.replace(at_epoch(v, c, "p3", 1, promises, proof),
                                                            sig=""))


def test_a_report_of_an_epoch_after_the_proposals_own_justifies_nothing():
    # An attack review (two colluders, default f = 1): p3, elected at epoch 1, published
    # its own value w and had it "reported" by p1's promise for epoch 2 as accepted at
    # epoch 2, proven by the two colluders' acks (f + 1); the self-reference check did not
    # see it (another epoch), and w was certified beside epoch 0's committed value. No
    # honest promise a proposal of epoch 1 can use reports a later epoch.
    c = signed_core("p0")
    w = result("p3", 1, 0.0)
    dw = payload_digest(w)
    acks = {p: sig(p, c, R, 2, dw) for p in ("p1", "p3")}
    promises = {"p3": promise(c, "p3", 1), "p0": promise(c, "p0", 1),
                "p1": promise(c, "p1", 2, 2, dw)}
    drop = c.admit_result(at_epoch(w, c, "p3", 1, promises, {f"2:{dw}": {"acks": acks}}))
    assert drop is not None and drop.code == "unjustified_result"
    assert "p1 reports a result accepted at epoch 2, after this proposal's epoch 1" in drop.reason


def epoch_1_aggregator_and_certified(by: str, epoch: int, ackers: tuple[str, ...]):
    """p3 as round R's aggregator of epoch 1, and a result of ``by`` at ``epoch`` with
    its digest and the signed acks of ``ackers``: (aggregator, result, digest, acks)."""
    agg = signed_core("p3")
    agg.epoch = 1
    res = signed(result(by, epoch, float(epoch) or 1.0), agg)
    digest = payload_digest(res)
    return agg, res, digest, {p: sig(p, agg, R, epoch, digest) for p in ackers}


def test_an_aggregator_leaves_out_a_promise_reporting_a_later_epoch_than_its_own():
    # A review of rev. 17: the aggregator of epoch 1 counted a promise of epoch 5 (the
    # rotation wraps back to it) reporting a certified epoch-2 result, chose to publish
    # that again, and its own check then refused what it would publish. Such a promise
    # is left out now, as members would refuse the proposal carrying it.
    agg, v2, d2, cert = epoch_1_aggregator_and_certified("p0", 2, ("p0", "p1"))
    assert agg.buffer.offer_result(v2) is None  # (a copy of it, held)
    promised = hold(agg, knowledge_at(agg, "p2", 1), knowledge_at(agg, "p0", 1),
                    knowledge_at(agg, "p1", 5, 2, d2, {f"2:{d2}": {"acks": cert}}))
    decision, _, refused = agg.proposal(R, promised)
    assert decision == "own" and set(refused) == {"p1"}
    assert "reports a result accepted at epoch 2, after this epoch 1" in refused["p1"]


def test_a_proof_that_refers_to_itself_or_carries_too_much_is_refused():
    c = signed_core("p0")
    c.round = R
    x = result("p0", 2, 0.5)  # an epoch-2 value whose "proof" reports itself
    dx = payload_digest(x)
    loop = {p: promise(c, p, 2, 2, dx) for p in ("p1", "p2", "p3")}
    xsig = KEYS["p0"].sign(c.statement("result", R, 2, dx)).hex()
    proofs = {f"2:{dx}": {"by": "p0", "sig": xsig, "promises": loop}}
    y = at_epoch(result("p1", 3, 0.1), c, "p1", 3, {p: promise(c, p, 3, 2, dx) for p in IDS}, proofs)
    assert "refers to itself" in c.unjustified_result(y)
    many = {f"0:{i:064x}": {"acks": {}} for i in range(PeerCore.PROOFS_MAX + 1)}
    big = at_epoch(result("p1", 3, 0.1), c, "p1", 3, {p: promise(c, p, 3) for p in IDS}, many)
    assert "proofs (at most" in c.unjustified_result(big)


def knowledge_at(c: PeerCore, sender: str, epoch: int, ae: int = -1, ad: str = "",
                 proofs: dict | None = None) -> Knowledge:
    """``sender``'s signed contribution to (R, epoch), promising and reporting (ae, ad)."""
    k = Knowledge(sender=sender, incarnation=0, round=R, kind="weights", epoch=epoch,
                  accepted_epoch=ae, accepted_digest=ad, tensors={"w": np.ones(3, np.float32)},
                  proofs=proofs or {})
    return dataclasses.replace(
        k, sig=KEYS[sender].sign(c.statement("knowledge", R, epoch, payload_digest(k))).hex(),
        promise_sig=promise(c, sender, epoch, ae, ad).rsplit(":", 1)[1])


def test_the_aggregator_publishes_what_the_proven_reports_pick_and_members_take_it():
    agg, member = signed_core("p3"), signed_core("p0")
    agg.epoch = member.epoch = 1
    v = signed(result("p2", 0, 1.0), agg)
    dv = payload_digest(v)
    assert agg.admit_result(v) is None and agg.buffer.offer_result(v) is None  # a copy of v
    proof = {f"0:{dv}": {"by": "p2", "sig": v.sig}}
    promised = hold(agg, knowledge_at(agg, "p0", 1, 0, dv, proof), knowledge_at(agg, "p1", 1))
    assert agg.proposal(R, promised) == ("repeat", v, {})
    again = agg.signed_result(dataclasses.replace(v, sender="p3", epoch=1, sig=""), promised)
    assert set(again.promises) == {"p3", "p0", "p1"} and set(again.proofs) == {f"0:{dv}"}
    assert member.admit_result(again) is None
    # The same aggregator ignoring the promises (the override twin): members refuse it.
    own = agg.signed_result(dataclasses.replace(result("p3", 1, 0.0), sig=""), promised)
    assert member.admit_result(own).code == "unjustified_result"
    # A promise not signed by its sender is left out by the aggregator.
    bad = dataclasses.replace(knowledge_at(agg, "p1", 1), promise_sig="")
    assert "not signed" in agg.unproven_promise(bad)
    # An "epoch-0 result" signed by another than its reporter is a second value at
    # epoch 0 (views that differ can elect two aggregators there), and the aggregator
    # abstains (Paxos's rule: either may be committed). Checking that the rotation
    # elects its signer named honest members liars where views differed (5 promises in
    # 1,000 seeds); one signed by its reporter counts for nothing (the next test).
    x = signed(result("p1", 0, 0.0), agg)
    liar = {f"0:{payload_digest(x)}": {"by": "p1", "sig": x.sig}}
    promised = {**promised, "p2": knowledge_at(agg, "p2", 1, 0, payload_digest(x), liar)}
    assert agg.proposal(R, promised) == ("abstain", None, {})


def test_a_report_its_reporter_proves_by_its_own_signature_counts_for_nothing():
    # A review (2026-11-29): one member's made-up "epoch-0 result", signed by itself as
    # its aggregator and reported in each of its contributions, made the epoch-0
    # aggregator, holding no copy, abstain in every round it took part in
    # (hfl.sim.protocol's selfreport twin: 770 of 1,000 rounds lost, 4 peers, seeds 0-99).
    # An honest aggregator never reports its own result so (it leaves the round once
    # it has published), so such a report is not counted, by the aggregator and by
    # every member alike; its promise still is.
    agg = signed_core("p2")  # the candidate of epoch 0
    x = signed(result("p1", 0, 0.0), agg)
    dx = payload_digest(x)
    made_up = {f"0:{dx}": {"by": "p1", "sig": x.sig}}
    promised = hold(agg, knowledge_at(agg, "p0", 0), knowledge_at(agg, "p3", 0),
                    knowledge_at(agg, "p1", 0, 0, dx, made_up))
    assert agg.proposal(R, promised) == ("own", None, {})  # before: ("abstain", None, {})
    # At a fail-over's epoch 1 (p3's): the same, and members take the result it makes.
    agg, member = signed_core("p3"), signed_core("p0")
    agg.epoch = member.epoch = 1
    promised = hold(agg, knowledge_at(agg, "p0", 1), knowledge_at(agg, "p1", 1, 0, dx, made_up))
    assert agg.proposal(R, promised) == ("own", None, {})
    own = agg.signed_result(dataclasses.replace(result("p3", 1, 0.5), sig=""), promised)
    assert set(own.promises) == {"p3", "p0", "p1"} and member.admit_result(own) is None
    # A member's check counts the same way: a promise set whose only report is p1's
    # own is no reason to refuse, and one by another's signature still is.
    v = signed(result("p2", 0, 1.0), agg)
    dv = payload_digest(v)
    honest = {"p3": promise(member, "p3", 1), "p0": promise(member, "p0", 1, 0, dv),
              "p1": promise(member, "p1", 1)}
    other = at_epoch(result("p3", 1, 0.5), member, "p3", 1, honest,
                     {f"0:{dv}": {"by": "p2", "sig": v.sig}})
    assert member.admit_result(other).code == "unjustified_result"


def test_a_malformed_report_or_proof_is_refused_and_raises_nothing():
    # A review's finds: a proof carrying both forms' fields, with "by" a list, raised
    # TypeError at the aggregator (the peer stopped); a signed promise reporting epoch
    # -2, or -1 with a digest, was taken by the aggregator and then made every member
    # refuse its honest result as malformed.
    agg, v, dv, acks = epoch_1_aggregator_and_certified("p2", 0, ("p1", "p2"))
    for proof in ({"acks": acks, "by": []}, {"acks": [1]}, {"by": "p2", "sig": v.sig, "x": 1},
                  {"by": "p2", "sig": v.sig, "promises": "p0"}, [], "acks"):
        k = knowledge_at(agg, "p0", 1, 0, dv, {f"0:{dv}": proof})
        assert "no proof" in agg.unproven_promise(k), proof
    assert agg.unproven_promise(knowledge_at(agg, "p0", 1, 0, dv, {f"0:{dv}": {"acks": acks}})) is None
    for ae, ad in ((-2, ""), (-1, dv), (0, ""), (0, "x" * 64), (0, dv.upper())):
        k = dataclasses.replace(knowledge_at(agg, "p0", 1), accepted_epoch=ae, accepted_digest=ad)
        drop = agg.admit_knowledge(k)
        assert drop is not None and drop.code == "rejected_knowledge", (ae, ad, drop)


def test_a_rev14_member_still_contributes_at_epoch_0_and_a_grown_view_keeps_a_proof():
    # A review's finds: every contribution of a rev. 14 member (no promise signature)
    # was refused as a lie, even at epoch 0 where no promise goes into a result; and a
    # member whose view grew after it accepted a fail-over's result dropped that
    # result's proof (checked again against its new quorum), so its next promise was
    # refused and it was named a liar.
    agg = signed_core("p2")
    old = dataclasses.replace(knowledge_at(agg, "p0", 0), promise_sig="")
    promised = hold(agg, old, knowledge_at(agg, "p1", 0))
    assert agg.proposal(R, promised) == ("own", None, {})
    agg.epoch = 1  # at a later epoch its promise goes into the result: it must be signed
    assert "not signed" in agg.proposal(R, promised)[2]["p0"]
    member = signed_core("p0")
    v = signed(result("p2", 0, 1.0), member)
    dv = payload_digest(v)
    promises = {p: promise(member, p, 1, 0, dv) for p in ("p3", "p1", "p0")}
    w = at_epoch(v, member, "p3", 1, promises, {f"0:{dv}": {"by": "p2", "sig": v.sig}})
    assert member.admit_result(w) is None
    member.accept(w)
    proofs = member.accepted_proofs(R)
    assert set(proofs) == {f"1:{dv}", f"0:{dv}"}
    member.membership.heard_from("p4", 0, 0.0, address="mem://p4", round=R)
    assert member.quorum() == 4 and member.accepted_proofs(R) == proofs


def test_numbers_in_reports_are_ascii_digits_and_a_superscript_raises_nothing():
    # "²".isdigit() is True and int("²") raises: a member's heard report or equivocation
    # proof whose round or epoch was "²" stopped every peer that read it (the receive
    # loop raised ValueError); an attack review of rev. 15 found the reader it shares.
    c = everywhere_core("p0")
    d, s = "ab" * 32, "cd" * 64
    k = contribution("p1", 1.0, c, equivocations={"p3": f"²:0:{d}:{s}:0:{d}:{s}"},
                     heard_round=R, heard={"p2": f"²:{d}:{s}"})
    c.signed_knowledge[(R, "p2")] = (0, "ef" * 32, s)
    assert c.admit_knowledge(k) is None
    assert c.check_heard(k) == ([], None)  # neither proves anything
    agg = signed_core("p3")
    agg.epoch = 1
    v = signed(result("p3", 1, 1.0), agg)
    bad = dataclasses.replace(v, promises={p: f"1:²:{d}:{s}" for p in ("p0", "p1", "p3")})
    assert "malformed" in agg.unjustified_result(bad)


# ------------------------------------------------------------- hostile messages, fuzzed

HOSTILE_TEXT = ["", ":", "::::", "-1", "-2", "²", "٣", "0", "1", "99999999999999999999", "1e3",
                " 1", "ab" * 32, "AB" * 32, "0" * 64, "ab" * 64, "x", "p0", "p9", "\x00", "é:1"]


def hostile_value(rng, depth=0):
    """Plain data as the codec lets it through (maps with str keys, lists, scalars)."""
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice(HOSTILE_TEXT)
    if kind == 1:
        return ":".join(rng.choice(HOSTILE_TEXT) for _ in range(rng.randrange(1, 8)))
    if kind == 2:
        return rng.choice([0, -1, 1, 2**40, 1.5, True, None, b"\x01"])
    if kind == 3:
        return rng.choice(IDS + ["p9"])
    if kind == 4:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return hostile_map(rng, depth)


def hostile_map(rng, depth=0):
    keys = ["acks", "by", "sig", "promises", "x", *IDS, f"0:{'ab' * 32}", f"1:{'ab' * 32}"]
    return {rng.choice(keys): hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def hostile_str_map(rng):
    return {rng.choice(IDS + ["p9", "²"]): ":".join(rng.choice(HOSTILE_TEXT) for _ in range(
        rng.choice([1, 3, 4, 7]))) for _ in range(rng.randrange(5))}


def test_fuzzed_reports_promises_and_proofs_never_raise_in_the_core():
    # Messages a member may send (through the real codec, so only what it lets through),
    # with every field a report, a promise or a proof lives in drawn from hostile text:
    # the core drops or ignores them, and never raises (a "by" that was a list and a
    # round "²" each stopped an honest peer, reviews of rev. 15). Seeded: the same
    # 1,500 messages each run.
    import random

    from hfl.protocol import decode, encode

    rng = random.Random(20261128)
    agg, member, everywhere = signed_core("p2"), signed_core("p0"), everywhere_core("p1")
    agg.epoch = member.epoch = 1
    for i in range(1500):
        sender = rng.choice(["p0", "p1", "p3"])
        if rng.random() < 0.5:
            msg = Knowledge(sender=sender, incarnation=0, round=R, kind="weights",
                            epoch=rng.choice([0, 1, 2]), accepted_epoch=rng.choice([-1, 0, 1, 5]),
                            accepted_digest=rng.choice(HOSTILE_TEXT),
                            tensors={"w": np.ones(3, np.float32)},
                            promise_sig=rng.choice(HOSTILE_TEXT), heard_round=R,
                            heard=hostile_str_map(rng), equivocations=hostile_str_map(rng),
                            proofs={rng.choice(HOSTILE_TEXT): hostile_map(rng, 1)
                                    for _ in range(rng.randrange(4))})
            if rng.random() < 0.5:  # a signed promise whose report names a hostile proof
                ae = rng.choice([0, 1])
                msg = dataclasses.replace(
                    msg, accepted_epoch=ae, accepted_digest="ab" * 32,
                    proofs={f"{ae}:{'ab' * 32}": hostile_map(rng, 1)},
                    promise_sig=promise(agg, sender, msg.epoch, ae, "ab" * 32).rsplit(":", 1)[1])
            if rng.random() < 0.5:  # signed as its sender signs it (the checks go deeper)
                msg = dataclasses.replace(msg, sig=KEYS[sender].sign(agg.statement(
                    "knowledge", R, msg.epoch, payload_digest(msg))).hex())
        else:
            msg = AggregateResult(sender=rng.choice(["p3", "p2", "p0"]), incarnation=0, round=R,
                                  epoch=rng.choice([0, 1, 2]), kind="weights", contributors=IDS,
                                  tensors={"w": np.full(3, i, np.float32)},
                                  sig=rng.choice(HOSTILE_TEXT), promises=hostile_str_map(rng),
                                  proofs={rng.choice(HOSTILE_TEXT): hostile_map(rng, 1)
                                          for _ in range(rng.randrange(4))})
            if rng.random() < 0.5:  # signed promises whose reports name hostile proofs
                msg = dataclasses.replace(
                    msg, promises={p: promise(agg, p, msg.epoch, 0, "ab" * 32) for p in IDS},
                    proofs={f"0:{'ab' * 32}": hostile_map(rng, 1)})
            if rng.random() < 0.5:
                msg = signed(msg, agg)
        msg = decode(encode(msg))
        for c in (agg, member, everywhere):
            c.handle(msg.sender, msg, 1.0)
            if isinstance(msg, Knowledge):
                c.proposal(R, c.promises(R))
                c.check_heard(msg)


def test_a_refused_result_is_failed_over_from_only_where_it_proves_a_fault():
    # A result refused as unjustified is a proven fault of its aggregator, and a waiting
    # member fails over at once (tests/test_protocol_sim.py runs it live); but too few
    # promises for this member's quorum of now is a measure of its own view (it knows a
    # member the aggregator does not yet), not a fault (a review).
    from hfl.peer.instructions import Dropped

    member = signed_core("p0")
    member.epoch = 1
    v = signed(result("p2", 0, 1.0), member)
    dv = payload_digest(v)
    proof = {f"0:{dv}": {"by": "p2", "sig": v.sig}}
    three = {p: promise(member, p, 1, 0, dv) for p in ("p3", "p1", "p0")}
    member.membership.heard_from("p4", 0, 0.0, address="mem://p4", round=R)
    assert member.quorum() == 4
    repeat = at_epoch(v, member, "p3", 1, three, proof)  # honest, from a view of 4
    out = member.handle("p3", repeat, 1.0)
    assert any(isinstance(i, Dropped) and i.code == "unjustified_result" for i in out)
    assert member.refused_results == set()
    four = {**three, "p2": promise(member, "p2", 1, 0, dv)}
    wrong = at_epoch(result("p3", 1, 0.0), member, "p3", 1, four, proof)  # not the value
    member.handle("p3", wrong, 1.0)
    assert member.refused_results == {(R, 1, "p3")}  # (stop_waiting_for reads it)
