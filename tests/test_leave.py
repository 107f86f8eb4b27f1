"""Departures, returns and restarts on a bare protocol core (issue 30): a goodbye, a
member that comes back, an aggregator restarted into its own round, a lone peer that
gave up on a round, and a heartbeat that says an old epoch. Each rule is checked on
hand-built views; tests/test_sim.py replays the fault schedules that found them."""

from __future__ import annotations

from hfl.peer.core import PeerCore
from hfl.peer.membership import Membership
from hfl.protocol import Ack, Heartbeat

IDS = ["p0", "p1", "p2", "p3", "p4"]


def core(me: str = "p0", ids=IDS, now: float = 0.0) -> PeerCore:
    """``me``'s aggregator-mode core with every other id heard from itself at ``now``."""
    c = PeerCore(me, mode="aggregator", everywhere=False, lookahead=2, cohort_size=len(ids))
    c.membership = Membership(me, f"mem://{me}", 0, 2.0, 4.0)
    for p in ids:
        c.membership.heard_from(p, 0, now, address=f"mem://{p}", round=1)
    return c


def beat(sender: str, r: int, epoch: int = 0, incarnation: int = 0, **extra) -> Heartbeat:
    return Heartbeat(sender=sender, incarnation=incarnation, round=r, epoch=epoch, **extra)


def hear(c: PeerCore, msg: Heartbeat, now: float) -> None:
    """What the node does with a heartbeat: the core's note, then the membership's."""
    c.note_heartbeat(msg)
    c.membership.heard_from(msg.sender, msg.incarnation, now, round=msg.round, epoch=msg.epoch)


# ------------------------------------------------------------------ one rotation


def test_a_goodbye_keeps_the_rotation_and_the_quorum_as_a_death_does():
    # p2's goodbye reaches a before its election of round 2 and b after it: both must
    # still elect the same aggregator (the rotation dropped departed members, so a and b
    # elected p3 and p2's successor by different orders and each waited a whole timeout).
    a, b = core("p0"), core("p1")
    before = a.elect(2)
    assert a.membership.left("p2", 0) is not None
    assert a.membership.rotation_order() == b.membership.rotation_order() == IDS
    assert a.quorum() == b.quorum() == 3
    # Both skip p2 as a dead candidate, to the same epoch.
    assert before == ("p2", 0)
    assert a.elect(2) == ("p3", 1)
    b.membership.left("p2", 0)
    assert b.elect(2) == ("p3", 1)
    # A member that left is a failure the election may pass over...
    assert a.epoch_unjustified(2, 1) is None
    # ...and its return (a new incarnation) puts it back where it was.
    a.membership.heard_from("p2", 1, 1.0, address="mem://p2", round=2)
    assert a.membership.rotation_order() == IDS and a.elect(2) == ("p2", 0)


def test_the_checkpoint_keeps_departed_members_so_a_restart_has_the_same_rotation(tmp_path):
    from types import SimpleNamespace

    import torch

    from hfl.peer.checkpoint import load_checkpoint
    from hfl.peer.runner import _save

    c = core("p0")
    c.membership.left("p3", 0)
    node = SimpleNamespace(incarnation=0, membership=c.membership,
                           alg=SimpleNamespace(state_dict=lambda: {"w": torch.zeros(1)}))
    _save(tmp_path, 4, node, None)
    saved = load_checkpoint(tmp_path)
    assert sorted(p for p, _ in saved["members"]) == ["p1", "p2", "p3", "p4"]


# ------------------------------------------------------------------ sitting a round out


def test_an_aggregator_restarted_into_its_round_is_skipped_on_its_own_word():
    c = core("p0")
    assert c.elect(3) == ("p3", 0)
    # p3 restarted (incarnation 1) into round 3, which its earlier life entered: it sits
    # the round out and says so in its heartbeats.
    hear(c, beat("p3", 3, incarnation=1, sitting_out=3), 1.0)
    assert c.sits_out("p3", 3) and not c.sits_out("p3", 4)
    assert c.elect(3) == ("p4", 1)
    assert c.stop_waiting_for("p3", 3, resend=False)
    assert c.failover_reason("p3", 3) == "sits the round out (restarted into it)"
    assert c.epoch_unjustified(3, 1) is None  # its own word is a failure we saw
    assert not c.serving("p3", 3)
    # An aggregator does not wait for its contribution either.
    c.round_began = 0.0
    assert "p3" not in c.awaited(3)
    # Its next life does not inherit the word.
    hear(c, beat("p3", 3, incarnation=2), 2.0)
    assert not c.sits_out("p3", 3) and c.elect(3) == ("p3", 0)


def test_a_forged_sitting_out_for_another_life_changes_nothing():
    c = core("p0")
    hear(c, beat("p3", 3, incarnation=0), 1.0)
    c.sitting_out["p3"] = (7, 3)  # said by a life of p3 we do not know
    assert not c.sits_out("p3", 3) and c.elect(3) == ("p3", 0)


# ------------------------------------------------------------------ one peer ahead


def test_one_peer_ahead_does_not_pull_a_waiter_off_a_serving_aggregator():
    c = core("p0")
    c.round = 3
    hear(c, beat("p3", 3, epoch=0), 1.0)  # the aggregator, alive and serving epoch 0
    hear(c, beat("p4", 4), 1.0)  # p4 failed over to itself below the quorum and moved on
    assert c.cohort_past(3)
    assert not c.moved_on(3, "p3") and not c.stop_waiting_for("p3", 3, resend=False)
    # Once the aggregator itself is past the round (or dead), the round is over.
    hear(c, beat("p3", 4), 2.0)
    assert c.moved_on(3, "p3") and c.stop_waiting_for("p3", 3, resend=False)


def test_an_aggregator_keeps_collecting_acks_while_a_quorum_can_still_ack():
    c = core("p3")
    c.round = 3
    c.expect_acks(3, 0, "d")
    c.note_ack(Ack(sender="p0", incarnation=0, round=3, epoch=0, digest="d"))
    hear(c, beat("p4", 4), 1.0)  # one peer moved on
    for p in ("p0", "p1", "p2"):
        hear(c, beat(p, 3), 1.0)
    assert c.cohort_past(3)
    assert not c.acks_out_of_reach(3, 0, "d", quorum=3)  # p1 and p2 may still ack
    hear(c, beat("p1", 4), 2.0)
    hear(c, beat("p2", 4), 2.0)
    assert c.acks_out_of_reach(3, 0, "d", quorum=3)  # 2 acks at most now


# ------------------------------------------------------------------ stale epochs


def test_a_heartbeat_sent_before_the_aggregator_failed_over_too_is_not_news():
    # Everyone failed over from a paused p3 to p4 at t=10.5; p3 thaws at 10.8, alive again.
    # p4's last heartbeat still says epoch 0, sent as it failed over as well: that must
    # not make the others think p4 waits at epoch 0 (they each failed over again, until
    # each served alone below the quorum and round 3 had no result at all).
    c = core("p0")
    c.round, c.round_began = 3, 5.0
    hear(c, beat("p4", 3, epoch=0), 10.5)
    c.epoch, c.epoch_began, c.epoch_news_after_s = 1, 10.5, 0.75
    hear(c, beat("p3", 3, epoch=0), 10.8)  # p3 alive again
    assert not c.aggregator_waits_elsewhere("p4", 3)
    assert not c.stop_waiting_for("p4", 3, resend=False)
    # A heartbeat a whole interval later that still says epoch 0 is news: p4 waits there.
    hear(c, beat("p4", 3, epoch=0), 11.5)
    assert c.aggregator_waits_elsewhere("p4", 3)


# ------------------------------------------------------------------ a lost contribution


def test_only_the_aggregator_we_sent_to_can_ask_for_our_knowledge_again():
    from hfl.protocol import Knowledge

    c = core("p0")
    c.round = 3
    sent = Knowledge(sender="p0", incarnation=0, round=3, epoch=1, kind="weights")
    assert c.asks_again(beat("p4", 3, epoch=1, awaiting=3), frozenset({"p4"}), sent)
    assert not c.asks_again(beat("p1", 3, epoch=1, awaiting=3), frozenset({"p4"}), sent)  # not ours
    assert not c.asks_again(beat("p4", 3, epoch=0, awaiting=3), frozenset({"p4"}), sent)  # another epoch
    assert not c.asks_again(beat("p4", 4, epoch=1, awaiting=4), frozenset({"p4"}), sent)  # another round
    c.round = 4  # we moved on: round 3's knowledge is not sent again
    assert not c.asks_again(beat("p4", 3, epoch=1, awaiting=3), frozenset({"p4"}), sent)


def test_asks_for_our_knowledge_are_answered_once_per_two_heartbeats_per_asker():
    # A member that put `awaiting` in every heartbeat (a review sent twenty a beat) had
    # each honest peer upload its whole knowledge once per ask: a few bytes bought a
    # model's worth. An honest aggregator asks after 4, 8, 8, ... heartbeats.
    from hfl.peer.config import TimingConfig
    from hfl.peer.instructions import SendTo
    from hfl.protocol import Knowledge

    c = core("p0")
    c.set_timing(TimingConfig(heartbeat_interval_s=0.5))
    c.round = 3
    sent = Knowledge(sender="p0", incarnation=0, round=3, epoch=1, kind="weights")
    c.sent_knowledge = (frozenset({"p3", "p4"}), sent)

    def resent(asker, now):
        out = c.handle(asker, beat(asker, 3, epoch=1, awaiting=3), now)
        return [i.peer_id for i in out if isinstance(i, SendTo) and i.msg is sent]

    assert resent("p4", 10.0) == ["p4"]
    assert [resent("p4", 10.0 + dt) for dt in (0.0, 0.3, 0.99)] == [[], [], []]
    assert resent("p3", 10.2) == ["p3"]  # each asker its own
    assert resent("p4", 11.0) == ["p4"]  # two intervals later: answered again
