"""cohort.communicate_every: a cohort that exchanges every k-th round (and the last).

The rounds between are local steps that peers run at their own pace, so the rules
that keep a cohort together (whom an aggregator waits for, when a peer skips to the
cohort's round, how far ahead a message is kept) count exchanging rounds, not rounds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hfl.launch import sim
from hfl.peer.core import PeerCore
from hfl.peer.membership import Membership
from hfl.protocol import AggregateResult, Knowledge
from tests.test_cohort import cohort_cfgs

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def core(me: str = "p0", every: int = 3, last: int = 10, round: int = 1) -> PeerCore:
    c = PeerCore(me, mode="aggregator", everywhere=False, lookahead=2, start_round=round,
                 communicate_every=every, last_round=last)
    c.membership = Membership(me, f"mem://{me}", 0, 2.0, 5.0)
    return c


def test_the_schedule_is_every_kth_round_and_the_last():
    c = core(every=3, last=10)
    assert [r for r in range(1, 11) if c.communicates(r)] == [3, 6, 9, 10]
    assert [c.next_exchange(r) for r in (1, 3, 4, 7, 10)] == [3, 3, 6, 9, 10]
    assert [c.previous_exchange(r) for r in (1, 3, 4, 6, 10)] == [0, 0, 3, 3, 9]
    every = core(every=1, last=10)  # the default: every round, as before
    assert all(every.communicates(r) for r in range(1, 11))
    assert [every.next_exchange(r) for r in (1, 5)] == [1, 5]
    assert [every.previous_exchange(r) for r in (1, 5)] == [0, 4]


def test_the_rotation_turns_once_per_exchange():
    # Exchanges every 4 rounds in a cohort of 4: by round, order[r % 4] would elect p0
    # for every exchange; by exchange, each peer aggregates in turn.
    c = core(every=4, last=16)
    order = ["p0", "p1", "p2", "p3"]
    assert [c.candidate(order, r, 0) for r in (4, 8, 12, 16)] == ["p1", "p2", "p3", "p0"]
    assert c.candidate(order, 8, 1) == "p3"  # fail-over moves on from the turn's candidate
    assert core(every=1).candidate(order, 6, 0) == "p2"  # the default: order[(r + e) % n]


def test_a_peer_runs_its_local_rounds_while_the_cohort_waits_at_the_next_exchange():
    c = core(every=3, last=10, round=4)
    c.membership.heard_from("p1", 0, now=1.0, address="mem://p1", round=6)
    assert c.catch_up(10) == 4  # p1 waits for us in round 6: our rounds 4 and 5 still count
    c.membership.heard_from("p1", 0, now=2.0, round=7)
    assert c.catch_up(10) == 7  # round 6 went by without us: join the cohort where it is
    # With every round exchanging, a cohort ahead is always one to jump to (as before).
    d = core(every=1, last=10, round=4)
    d.membership.heard_from("p1", 0, now=1.0, address="mem://p1", round=5)
    assert d.catch_up(10) == 5


def test_an_aggregator_waits_for_a_peer_in_the_local_rounds_before_its_exchange():
    agg = core("p3", every=3, last=30, round=9)
    for p, rnd in (("p0", 9), ("p1", 7), ("p2", 5)):
        agg.membership.heard_from(p, 0, now=2.0, address=f"mem://{p}", round=rnd)
    agg.round_began = 1.0  # all three heard after round 9 began: fresh word
    # p1 is on its way from round 6's exchange to round 9's; p2 has not finished round 6's.
    assert agg.awaited(9) == ["p0", "p1"]


def test_knowledge_and_results_for_the_next_exchange_are_kept_during_local_rounds():
    c = core("p1", every=5, last=50, round=11)  # next exchange: 15; lookahead 2 exchanges
    k = Knowledge(sender="p0", incarnation=0, round=15, kind="weights")
    assert c.buffer.offer_knowledge(k) is None
    res = AggregateResult(sender="p0", incarnation=0, round=15, epoch=0, kind="weights",
                          contributors=["p0", "p1"])
    assert c.buffer.offer_result(res) is None
    assert c.buffer.offer_result(AggregateResult(
        sender="p0", incarnation=0, round=22, epoch=0, kind="weights")) is not None  # 3 exchanges on


def test_a_method_that_trains_alone_refuses_the_option():
    from hfl.peer.configtools import ConfigError
    from hfl.peer.factory import build_algorithm

    cfg = cohort_cfgs(Path("/nonexistent"), 2, cohort={"algorithm": "solo", "communicate_every": 2})[0]
    with pytest.raises(ConfigError) as err:
        build_algorithm(cfg)
    assert err.value.path == "cohort.communicate_every" and "trains alone" in err.value.detail


def sim_rows(tmp_path: Path, experiment: str, overrides: list[str], peers: int, rounds: int):
    scenario = sim.Scenario(seed=0, network=sim.NetworkFaults(), timing={}, faults=[], calm_at=0.0)
    opts = sim.SimOptions(experiment=str(EXAMPLES / experiment), peers=peers, rounds=rounds,
                          overrides=overrides, keep=tmp_path)
    res = sim.run_seed(0, opts, scenario)
    assert not res.violations, res.violations
    rows = {}
    for f in tmp_path.rglob("metrics.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            rows[(r["peer"], r["round"])] = r
    assert len(rows) == peers * rounds
    return rows


@pytest.mark.parametrize("aggregate_at", ["aggregator", "every_peer"])
def test_fedavg_exchanges_only_on_its_schedule_and_ends_on_one_model(tmp_path, aggregate_at):
    # 4 peers, 7 rounds, every 3rd: rounds 3 and 6 and the last (7) exchange; 1, 2, 4, 5
    # are local steps that send no knowledge (heartbeats only) and learn from nobody.
    peers, rounds = 4, 7
    rows = sim_rows(tmp_path, "quickstart.yaml", ["defaults.cohort.communicate_every=3",
                                                  f"defaults.cohort.aggregate_at={aggregate_at}"],
                    peers, rounds)
    model_bytes = min(r["bytes_sent"] for r in rows.values() if r["round"] in (3, 6, 7))
    for (peer, r), row in rows.items():
        if r in (3, 6, 7):
            assert row["learned_from"] == peers - 1, (peer, r)
        else:
            assert "learned_from" not in row and row.get("aggregator") is None, (peer, r)
            assert row["bytes_sent"] < model_bytes / 10, (peer, r)
    if aggregate_at == "aggregator":  # one turn of the rotation per exchange
        assert len({rows[("p0", r)]["aggregator"] for r in (3, 6, 7)}) == 3
    # After an exchange every peer holds the same averaged model; between, they diverge.
    for r, same in ((6, True), (7, True), (5, False)):
        accs = {rows[(f"p{i}", r)]["global_acc"] for i in range(peers)}
        assert (len(accs) == 1) == same, (r, accs)


def test_a_broadcast_method_learns_on_exchanging_rounds_only(tmp_path):
    # MDH-FL (knowledge distillation on public data, broadcast mode): 4 peers, 4 rounds,
    # every 2nd: each peer learns from the 3 others in rounds 2 and 4 and sends no
    # knowledge in rounds 1 and 3.
    rows = sim_rows(tmp_path, "mdhfl_digits.yaml", ["defaults.cohort.communicate_every=2"], 4, 4)
    assert {(r, row.get("learned_from")) for (_, r), row in rows.items()} == {
        (1, None), (2, 3), (3, None), (4, 3)}
