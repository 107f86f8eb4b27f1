"""A malicious member against the commit protocol, on a bare protocol core (issue 35):
each rule that keeps a member's lie from steering an honest aggregator, checked on
hand-built views. tests/test_trust.py runs the same attacks against a live cohort."""

from __future__ import annotations

import numpy as np

from hfl.peer.core import PeerCore, payload_digest
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
    drop = c.admit_knowledge(claim("p3", epoch=0, accepted_epoch=1, digest="d"))
    assert drop is not None and drop.code == "lying_claim" and "p3" in drop.reason
    assert c.admit_knowledge(claim("p1", epoch=1, accepted_epoch=1, digest="d")) is None
    assert c.admit_knowledge(claim("p1", epoch=1, accepted_epoch=0, digest="d")) is None


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
