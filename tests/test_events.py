"""The typed event stream: every peer's protocol decisions in its events.jsonl.

Benchmarks and tools read these notes instead of log lines (docs/runtime.md, Typed
events); the tests run real peers on the simulator (deterministic) and read the
files the peers wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from hfl.launch import sim
from hfl.peer.status import TYPED_EVENTS

QUICKSTART = Path(__file__).resolve().parent.parent / "examples" / "quickstart.yaml"


def notes(root: Path) -> dict[str, list[dict]]:
    """peer -> its events.jsonl records, in order (one run's directories under ``root``)."""
    out = {}
    for f in sorted(root.rglob("events.jsonl")):
        out[f.parent.name] = [json.loads(line) for line in f.read_text().splitlines()]
    return out


def run(tmp_path: Path, **opts) -> dict[str, list[dict]]:
    scenario = sim.Scenario(seed=0, network=sim.NetworkFaults(), timing={}, faults=opts.pop("faults", []),
                            calm_at=0.0)
    res = sim.run_seed(0, sim.SimOptions(experiment=str(QUICKSTART), keep=tmp_path, **opts), scenario)
    assert not res.violations, res.violations
    return notes(tmp_path)


def test_every_peer_notes_the_results_it_absorbed_and_the_aggregator_what_it_committed(tmp_path):
    got = run(tmp_path, peers=4, rounds=12, overrides=["defaults.cohort.aggregate_at=aggregator"],
              faults=[sim.Fault(t=4.2, kind="crash", peers=("p3",), duration=8.0)])
    assert set(got) == {"p0", "p1", "p2", "p3"}
    for peer, recs in got.items():
        assert {r["kind"] for r in recs} <= TYPED_EVENTS | {"log", "joining"}, peer
        assert all(r["peer"] == peer and isinstance(r["t"], float) for r in recs if r["kind"] != "log")
    committed = {(r["round"], r["digest"]) for recs in got.values() for r in recs
                 if r["kind"] == "committed"}
    assert sorted(r for r, _ in committed) == list(range(1, 13))  # one commit a round
    for peer in ("p0", "p1", "p2"):
        absorbed = {(r["round"], r["digest"]) for r in got[peer] if r["kind"] == "absorbed"}
        assert absorbed == committed, peer  # exactly what was committed, every round
        # p3 was SIGKILLed at t=4.2 (and restarted 8 s later): each survivor saw it die,
        # then come back.
        deaths = [r for r in got[peer] if r["kind"] == "member" and r["member"] == "p3"
                  and r["new"] == "dead"]
        assert deaths and deaths[0]["old"] in ("alive", "suspect") and deaths[0]["reason"], peer
        # how long it had been silent, as a number (the reason says it in words)
        assert f"{deaths[0]['silent_s']:.1f}s" in deaths[0]["reason"], deaths[0]
        assert any(r["kind"] == "member" and r["member"] == "p3" and r["old"] == "dead"
                   and r["new"] == "alive" and r["t"] > deaths[0]["t"] for r in got[peer]), peer
        # On the simulator's timeline too (vt: what bench/scale.py times detection by):
        # after the kill at virtual t=4.2, before the restart 8 s later.
        assert 4.2 < deaths[0]["vt"] < 12.2, deaths[0]
    # Each life's started note says its process (what a benchmark signals).
    import os

    started = [r for recs in got.values() for r in recs if r["kind"] == "started"]
    assert len(started) == 5 and {r["pid"] for r in started} == {os.getpid()}


def test_an_equivocating_member_is_noted_with_the_drops_of_its_contributions(tmp_path):
    # Every peer aggregating, p1 a twin that sends p0 zeros and the others its real
    # contribution, both signed: the proof reaches the honest peers, who note it and
    # each drop of its later contributions with the code.
    got = run(tmp_path, peers=4, rounds=4, overrides=["defaults.cohort.aggregate_at=every_peer"],
              byzantine=["p1:equivocate"])
    honest = ("p0", "p2", "p3")
    for peer in honest:
        named = [r for r in got[peer] if r["kind"] == "equivocator"]
        assert [r["peer_named"] for r in named] == ["p1"], peer
    drops = [r for p in honest for r in got[p] if r["kind"] == "dropped"]
    assert drops and {r["code"] for r in drops} >= {"equivocator"}
    assert all(r["reason"] for r in drops)


def test_a_join_warning_names_the_first_peers_and_counts_the_rest():
    # A cohort of a thousand forming put 500 ids on each peer's "only k of n joined" line.
    from hfl.peer.status import _listed

    ids = [f"p{i:03d}" for i in range(500)]
    assert _listed(ids) == "p000, p001, p002, p003, p004, p005, p006, p007 and 492 more"
    assert _listed(ids[:8]) == ", ".join(ids[:8])


def test_each_round_notes_what_the_peer_sent_by_type_as_its_transport_counted_it(tmp_path):
    # The sent notes are what benchmarks count messages from (bench/scale.py): at each
    # round's end, this life's messages and bytes by type so far. Their bytes must be
    # the transport's own count of the same moment (metrics' total_bytes_sent).
    got = run(tmp_path, peers=3, rounds=4)
    for peer, recs in got.items():
        sent = [r for r in recs if r["kind"] == "sent"]
        assert [r["round"] for r in sent] == [1, 2, 3, 4], peer
        metrics = {m["round"]: m for m in map(json.loads,
                   (tmp_path / f"hfl-sim-seed0/{peer}/metrics.jsonl").read_text().splitlines())}
        for r in sent:
            assert sum(b for _, b in r["types"].values()) == metrics[r["round"]]["total_bytes_sent"]
            membership = sum(n for t, (n, _) in r["types"].items()
                             if t in ("hello", "welcome", "gossip", "heartbeat", "leave"))
            assert membership == metrics[r["round"]]["total_membership_sent"] > 0
        # cumulative: never shrinks
        for a, b in zip(sent, sent[1:], strict=False):
            assert all(b["types"].get(t, [0, 0])[0] >= n for t, (n, _) in a["types"].items())
    # each round, the two members other than its aggregator sent it their knowledge
    last = [next(r for r in reversed(recs) if r["kind"] == "sent") for recs in got.values()]
    assert sum(r["types"]["knowledge"][0] for r in last) == 4 * 2


def test_the_same_drop_or_refusal_is_logged_once_a_minute_with_its_repeats_counted():
    # A refused hello was logged at every greeting, twice a second on each side (a
    # docs review: 15 + 14 lines in 8 s), where docs/networking.md promises once a
    # minute. One line per distinct text per window; the repeats come with the next.
    from hfl.peer.status import Repeats

    t = [0.0]
    r = Repeats(window_s=60.0, clock=lambda: t[0], most=3)
    assert r.note("p1 refused our hello: run differs") == (True, 0)
    for t[0] in (0.5, 1.0, 30.0):
        assert r.note("p1 refused our hello: run differs") == (False, 0)
    assert r.note("another reason") == (True, 0)  # another text has its own line
    t[0] = 61.0
    assert r.note("p1 refused our hello: run differs") == (True, 3)
    assert Repeats.suffix(3) == " (3 more like it since the last such line)"
    assert Repeats.suffix(0) == ""
    for i in range(10):  # bounded: texts past `most` push out the ones whose window ended
        r.note(f"flood {i}")
    assert len(r._seen) <= 3
