"""RoundBuffer: the staleness rules for knowledge and aggregator results (PROTOCOL.md, "Rounds")."""

from __future__ import annotations

import numpy as np

from hfl.peer.rounds import RoundBuffer
from hfl.protocol import AggregateResult, Knowledge


def knowledge(sender: str, round: int, kind: str = "weights") -> Knowledge:
    return Knowledge(sender=sender, incarnation=0, round=round, kind=kind)


def result(sender: str, round: int, epoch: int) -> AggregateResult:
    return AggregateResult(sender=sender, incarnation=0, round=round, epoch=epoch, kind="weights")


def test_knowledge_for_the_current_round_is_kept():
    buf = RoundBuffer(lookahead=2, round=3)
    assert buf.offer_knowledge(knowledge("b", 3)) is None
    assert buf.offer_knowledge(knowledge("c", 3)) is None
    assert sorted(buf.received(3)) == ["b", "c"]
    assert buf.has_all(3, ["b", "c"])
    assert not buf.has_all(3, ["b", "c", "d"])
    assert buf.has_all(3, [])


def test_late_knowledge_is_dropped():
    buf = RoundBuffer(lookahead=2, round=3)
    reason = buf.offer_knowledge(knowledge("b", 2))
    assert reason is not None and "late" in reason
    assert buf.received(2) == {}


def test_knowledge_within_lookahead_is_kept_and_beyond_it_only_the_highest_round():
    # Issue 9: a restarted or paused peer far behind the cohort is elected aggregator of
    # the round it is about to catch up to; what its peers send it there must survive.
    buf = RoundBuffer(lookahead=2, round=3)
    assert buf.offer_knowledge(knowledge("b", 4)) is None
    assert buf.offer_knowledge(knowledge("b", 5)) is None
    assert buf.offer_knowledge(knowledge("b", 9)) is None  # beyond: the cohort's round
    assert buf.offer_knowledge(knowledge("c", 9)) is None
    reason = buf.offer_knowledge(knowledge("b", 7))  # older than the far round kept
    assert reason is not None and "ahead" in reason
    assert buf.offer_knowledge(knowledge("b", 12)) is None  # newer: replaces round 9
    assert sorted(buf.knowledge) == [4, 5, 12]  # bounded: the window plus one round
    buf.advance(12)
    assert list(buf.received(12)) == ["b"]


def test_conflicting_knowledge_is_dropped_and_the_first_copy_kept():
    buf = RoundBuffer(round=1)
    first = knowledge("b", 1, kind="first")
    assert buf.offer_knowledge(first) is None
    reason = buf.offer_knowledge(knowledge("b", 1, kind="second"))
    assert reason is not None and "conflicting knowledge from b for round 1" in reason
    assert buf.received(1)["b"] is first


def test_a_retransmitted_copy_is_no_drop_and_one_changed_value_is():
    # A peer re-sends its knowledge to an aggregator that was behind: the same
    # message again is harmless; the same sender and round with other values is not.
    w = np.arange(6, dtype=np.float32).reshape(2, 3)

    def msg(tensors, **kw):
        return Knowledge(**{"sender": "b", "incarnation": 0, "round": 1, "kind": "weights",
                            "meta": {"n": 5}, "tensors": tensors, **kw})

    buf = RoundBuffer(round=1)
    first = msg({"w": w})
    assert buf.offer_knowledge(first) is None
    assert buf.offer_knowledge(msg({"w": w.copy()})) is None
    changed = w.copy()
    changed[1, 2] += 1e-3
    for other in (msg({"w": changed}), msg({"w": w.astype(np.float64)}), msg({"w": w, "v": w}),
                  msg({"w": w}, epoch=1), msg({"w": w}, meta={"n": 6})):
        assert "conflicting" in buf.offer_knowledge(other)
    assert buf.received(1)["b"] is first


def test_results_are_kept_per_epoch_and_stale_epochs_are_not_offered():
    buf = RoundBuffer(round=2)
    assert buf.offer_result(result("p2", 2, epoch=0)) is None
    assert buf.result(2, 0).sender == "p2"
    assert [m.sender for m in buf.results_for(2, min_epoch=0)] == ["p2"]
    # The peer failed over to epoch 1: the epoch-0 aggregator's result is stale now.
    assert buf.results_for(2, min_epoch=1) == []
    assert buf.result(2, 1) is None and buf.result(3, 0) is None


def test_a_high_epoch_never_pushes_out_a_lower_one_and_the_first_per_epoch_stands():
    # A member that claims a high epoch must not evict the result of the epoch a
    # peer is actually waiting for (the forged-epoch attack of issue 8).
    buf = RoundBuffer(round=2)
    assert buf.offer_result(result("p3", 2, epoch=3)) is None
    assert buf.offer_result(result("p2", 2, epoch=0)) is None
    reason = buf.offer_result(result("p9", 2, epoch=3))
    assert reason is not None and "duplicate" in reason  # same epoch: the first one stands
    assert buf.result(2, 3).sender == "p3" and buf.result(2, 0).sender == "p2"
    assert [(m.sender, m.epoch) for m in buf.results_for(2)] == [("p2", 0), ("p3", 3)]


def test_late_and_far_ahead_results_are_dropped():
    buf = RoundBuffer(lookahead=1, round=3)
    assert "late" in buf.offer_result(result("p1", 2, epoch=5))
    assert "ahead" in buf.offer_result(result("p1", 5, epoch=0))
    assert buf.offer_result(result("p1", 4, epoch=0)) is None
    assert buf.result(2, 0) is None and buf.result(5, 0) is None


def test_advance_forgets_older_rounds_and_keeps_newer_ones():
    buf = RoundBuffer(lookahead=2, round=1)
    for r in (1, 2, 3):
        assert buf.offer_knowledge(knowledge("b", r)) is None
        assert buf.offer_result(result("p1", r, epoch=0)) is None
    buf.advance(2)
    assert buf.round == 2
    assert buf.received(1) == {} and buf.result(1, 0) is None
    assert list(buf.received(2)) == ["b"] and buf.result(2, 0) is not None
    assert list(buf.received(3)) == ["b"] and buf.result(3, 0) is not None
    # Round 1 is over: its knowledge and results are now refused as late.
    assert "late" in buf.offer_knowledge(knowledge("c", 1))
    assert "late" in buf.offer_result(result("p1", 1, epoch=3))
    buf.advance(4)
    assert buf.knowledge == {} and buf.results == {}


def test_catch_up_only_for_coordinated_modes_and_never_past_the_last_round():
    from hfl.peer.core import catch_up_round

    assert catch_up_round("aggregator", 3, 9, 20) == 9  # restarted: join the cohort's round
    assert catch_up_round("broadcast", 3, 9, 5) == 5
    assert catch_up_round("broadcast", 4, 4, 20) == 4  # in step (or one ahead): nothing to do
    assert catch_up_round("broadcast", 6, 4, 20) == 6  # never backwards
    assert catch_up_round("local", 3, 9, 20) == 3  # solo peers do not skip their own rounds


def test_a_peer_process_keeps_only_its_last_metrics_line_in_memory():
    # A review: every line was kept for the process's life (1.6 MB a thousand rounds,
    # so 170 MB at 100k), though hfl-peer reads its lines from metrics.jsonl. Kept: the
    # last line and the most live peers any line saw (the summary's).
    from types import SimpleNamespace

    from hfl.peer.instructions import RoundDone
    from hfl.peer.ledger import RoundLedger

    stats = SimpleNamespace(bytes_sent=0, bytes_received=0)
    ledgers = {keep: RoundLedger("p0", keep_lines=keep) for keep in (True, False)}
    for r in range(1, 101):
        for ledger in ledgers.values():
            ledger.begin(float(r), stats, {})
            live = 4 if r == 50 else 2
            ledger.end(RoundDone(r, {"train_loss": 1.0 / r}, {"test_acc": r / 100}, {}),
                       r + 0.5, stats, {}, {"live_peers": live, "met_peers": live,
                                            "dropped": 0, "incarnation": 0,
                                            "aggregate_disagreements": 0})
    assert [line["round"] for line in ledgers[True].lines] == list(range(1, 101))
    assert [line["round"] for line in ledgers[False].lines] == [100]
    timed = ("cpu_s", "time", "compute_cpu_s")
    assert ({k: v for k, v in ledgers[False].lines[-1].items() if k not in timed}
            == {k: v for k, v in ledgers[True].lines[-1].items() if k not in timed})
    assert ledgers[False].max_live_peers == ledgers[True].max_live_peers == 4
