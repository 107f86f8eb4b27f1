"""Integration: whole cohorts in one process, on the in-memory transport and on ZeroMQ loopback.

Faults are deterministic: they come from a seeded FaultPlan, from a partition installed
at an exact point (every peer held at the start of a round's training until the test
lets it go), or from a peer that crashes from inside its own round hook.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest

from hfl.peer.config import PeerConfig, config_from_dict
from hfl.peer.factory import build_algorithm
from hfl.peer.node import Node, NodeResult
from hfl.peer.runner import run_peer
from hfl.peer.security import cohort_keys, signing_of
from hfl.peer.transport import (
    FaultPlan,
    FaultyTransport,
    InMemoryTransport,
    MemoryHub,
    make_transport,
)
from hfl.protocol import PROTOCOL_VERSION, AggregateResult, Heartbeat, Knowledge, Limits, encode

pytestmark = pytest.mark.timeout(60)

TIMING = {
    "heartbeat_interval_s": 0.05,
    "suspect_after_s": 0.5,
    "dead_after_s": 1.0,
    "round_timeout_s": 3.0,
    "aggregate_grace_s": 1.0,
    "join_timeout_s": 10.0,
    "send_timeout_s": 1.0,
}
WAIT_S = 15.0  # upper bound on any single wait in a test (a hang fails, never blocks)


def peer_cfg(
    tmp_path,
    peer_id: str,
    index: int,
    n: int,
    *,
    listen: str | None = None,
    bootstrap: tuple[str, ...] = (),
    rounds: int = 3,
    min_peers: int | None = None,
    cohort: dict[str, Any] | None = None,
    timing: dict[str, Any] | None = None,
    security: dict[str, Any] | None = None,
) -> PeerConfig:
    return config_from_dict(
        {
            "security": security or {"mode": "none"},
            "node": {
                "id": peer_id,
                "listen": listen or f"mem://{peer_id}",
                "bootstrap": list(bootstrap),
                "run_dir": str(tmp_path / peer_id),
                "min_peers": min_peers or n,
                "resume": False,
                "checkpoint": False,
                "seed": index,
            },
            # The aggregator protocol unless a test says otherwise (auto would have these
            # small cohorts aggregate at every peer).
            "cohort": {"algorithm": "fedavg", "rounds": rounds, "aggregate_at": "aggregator",
                       **(cohort or {})},
            "timing": {**TIMING, **(timing or {})},
            "data": {
                "dataset": "digits",
                "partition": "iid",
                "num_partitions": n,
                "partition_index": index % n,
            },
            "model": {"arch": "mlp"},
            "train": {"max_batches": 5},
        }
    )


def cohort_cfgs(tmp_path, n: int, **kw) -> list[PeerConfig]:
    """p0 .. p{n-1}; everyone but p0 knows only p0's address."""
    return [
        peer_cfg(tmp_path, f"p{i}", i, n, bootstrap=() if i == 0 else ("mem://p0",), **kw)
        for i in range(n)
    ]


def build_node(
    cfg: PeerConfig,
    hub: MemoryHub | None,
    plan: FaultPlan | None = None,
    on_round: Callable[[dict], None] | None = None,
    **kw,
) -> Node:
    """What run_peer does, minus files, so a test can hold on to the Node."""
    algorithm, num_classes = build_algorithm(cfg)
    identity = cfg.identity()
    if identity is not None:
        kw.setdefault("allowed_peers", frozenset(identity.allowed))
        kw.setdefault("signing", signing_of(cfg.node.id, identity))
    transport = make_transport(cfg.node.id, cfg.node.listen, hub=hub, security=identity)
    if plan is not None:
        transport = FaultyTransport(transport, plan)
    return Node(
        peer_id=cfg.node.id,
        transport=transport,
        algorithm=algorithm,
        cohort=cfg.cohort,
        num_classes=num_classes,
        timing=cfg.timing,
        bootstrap=cfg.node.bootstrap,
        min_peers=cfg.node.min_peers,
        on_round=on_round,
        seed=cfg.node.seed,
        **kw,
    )


class RoundWatch:
    """An ``on_round`` hook: keeps every record; an event per round fires once all peers did it."""

    def __init__(self, peers):
        self.peers = set(peers)
        self.records: dict[int, dict[str, dict]] = defaultdict(dict)
        self._done: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.hooks: dict[str, Callable[[dict], None]] = {}

    def __call__(self, record: dict) -> None:
        self.records[record["round"]][record["peer"]] = record
        if set(self.records[record["round"]]) >= self.peers:
            self._done[record["round"]].set()
        hook = self.hooks.get(record["peer"])
        if hook is not None:
            hook(record)

    async def all_finished(self, r: int) -> None:
        await asyncio.wait_for(self._done[r].wait(), WAIT_S)


class TrainingGate:
    """Holds every peer at the start of local training in the given rounds until released.

    The wait happens in the training worker thread, so the peers' event loop (heartbeats,
    receiving) keeps running: this pauses the round engine only, at an exact point.
    """

    def __init__(self, rounds):
        self.gates = {r: threading.Event() for r in rounds}

    def install(self, node: Node) -> None:
        train = node.alg.local_update

        def local_update(round: int):
            gate = self.gates.get(round)
            if gate is not None and not gate.wait(timeout=WAIT_S):
                raise TimeoutError(f"{node.id}: round {round} gate never opened")
            return train(round)

        node.alg.local_update = local_update

    def release(self, r: int) -> None:
        self.gates[r].set()

    def release_all(self) -> None:
        for gate in self.gates.values():
            gate.set()


def gated_cohort(cfgs: list[PeerConfig], held_rounds, signing: dict | None = None):
    """(watch, hub, nodes, gate): nodes of ``cfgs`` on one in-memory hub, each held at
    the start of local training in ``held_rounds`` until the gate opens. ``signing``:
    peer id -> (sign, verification keys), a signed cohort without CURVE."""
    watch = RoundWatch(c.node.id for c in cfgs)
    hub = MemoryHub()
    nodes = [build_node(c, hub, on_round=watch,
                        **({"signing": signing[c.node.id]} if signing else {})) for c in cfgs]
    gate = TrainingGate(held_rounds)
    for nd in nodes:
        gate.install(nd)
    return watch, hub, nodes, gate


def run_conducted(nodes: list[Node], gate: TrainingGate, conduct) -> dict[str, NodeResult]:
    """Run ``nodes`` while ``conduct()`` drives the test's events; the gate always opens."""

    async def main():
        conductor = asyncio.create_task(conduct())
        try:
            return await asyncio.gather(*(nd.run() for nd in nodes))
        finally:
            gate.release_all()
            await conductor

    return dict(zip([nd.id for nd in nodes], asyncio.run(main()), strict=True))


async def until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll a condition (bounded); for states reached through the peers' own timers."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def by_round(results: dict[str, NodeResult]) -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = defaultdict(dict)
    for peer, res in results.items():
        for rec in res.metrics:
            out[rec["round"]][peer] = rec
    return out


def assert_completed(results: dict[str, NodeResult], rounds: int) -> None:
    for peer, res in results.items():
        assert isinstance(res, NodeResult), f"{peer} failed: {res!r}"
        assert [m["round"] for m in res.metrics] == list(range(1, rounds + 1)), peer
        assert res.last_round == rounds


def assert_same_model(records: dict[str, dict]) -> None:
    """Peers that loaded the same averaged model score exactly the same on the global test set."""
    accs = {p: rec["global_acc"] for p, rec in records.items()}
    assert len(set(accs.values())) == 1, accs


# =========================================================================== a, b


def run_cohort_with_run_peer(cfgs, plan: FaultPlan | None = None) -> dict[str, NodeResult]:
    hub = MemoryHub()

    async def main():
        return await asyncio.gather(*(run_peer(c, hub=hub, fault_plan=plan) for c in cfgs))

    return {c.node.id: r for c, r in zip(cfgs, asyncio.run(main()), strict=True)}


def assert_healthy_fedavg_cohort(results: dict[str, NodeResult], n: int, rounds: int) -> None:
    assert_completed(results, rounds)
    rounds_seen = by_round(results)
    order = sorted(results)
    for r in range(1, rounds + 1):
        recs = rounds_seen[r]
        # Everyone elected the same aggregator: the rotation's pick for this round.
        assert {rec["aggregator"] for rec in recs.values()} == {order[r % n]}, r
        assert {rec["epoch"] for rec in recs.values()} == {0}
        assert {rec["contributors"] for rec in recs.values()} == {n}
        assert_same_model(recs)
        if r < rounds:  # in the last round a peer that finished first may have left already
            assert {rec["live_peers"] for rec in recs.values()} == {n}
    turns = [rounds_seen[r][order[0]]["aggregator"] for r in range(1, min(n, rounds) + 1)]
    assert len(set(turns)) == len(turns)  # a different peer aggregates every round


def test_fedavg_cohort_learns_the_cohort_by_gossip_and_rotates_the_aggregator(tmp_path):
    n, rounds = 4, 4
    results = run_cohort_with_run_peer(cohort_cfgs(tmp_path, n, rounds=rounds))
    assert_healthy_fedavg_cohort(results, n, rounds)
    for peer, res in results.items():
        assert res.dropped == {}, peer
        # The CPU a round cost: the method's calls are part of the process's (here all
        # four peers' process) since the last record.
        assert all(0 < m["compute_cpu_s"] <= m["cpu_s"] for m in res.metrics), res.metrics
        assert (tmp_path / peer / "metrics.jsonl").read_text().count("\n") == rounds
        assert (tmp_path / peer / "summary.json").exists()


def test_fedavg_cohort_survives_faults_on_heartbeats_and_gossip(tmp_path):
    n, rounds = 4, 3
    plan = FaultPlan(
        seed=11,
        drop=0.2,
        duplicate=0.2,
        delay=0.2,
        reorder=0.2,
        delay_s=(0.01, 0.05),
        only_types=frozenset({"heartbeat", "gossip"}),
    )
    results = run_cohort_with_run_peer(cohort_cfgs(tmp_path, n, rounds=rounds), plan)
    assert {"dropped", "duplicated", "delayed", "reordered"} <= set(plan.counts)
    assert min(plan.counts.values()) > 0
    assert_healthy_fedavg_cohort(results, n, rounds)


# =========================================================================== c


def test_partition_then_heal(tmp_path):
    """{p0,p1} | {p2,p3} for round 2 exactly; healed before round 3."""
    n, rounds = 4, 4
    side_a, side_b = ["p0", "p1"], ["p2", "p3"]
    cfgs = cohort_cfgs(tmp_path, n, rounds=rounds)
    plan = FaultPlan(seed=3)
    watch = RoundWatch(c.node.id for c in cfgs)
    gate = TrainingGate(rounds=(2, 3))
    hub = MemoryHub()
    nodes = [build_node(c, hub, plan, on_round=watch) for c in cfgs]
    for node in nodes:
        gate.install(node)

    async def conduct():
        try:
            await watch.all_finished(1)
            plan.partition([f"mem://{p}" for p in side_a], [f"mem://{p}" for p in side_b])
            gate.release(2)
            await watch.all_finished(2)
            plan.heal()
            await until(
                lambda: all(len(nd.membership.live_view()) == n for nd in nodes),
                "every peer to see the whole cohort alive again",
            )
            gate.release(3)
        finally:
            gate.release_all()

    results = run_conducted(nodes, gate, conduct)
    assert_completed(results, rounds)
    rounds_seen = by_round(results)
    # Round 1: whole cohort. Round 2: a 2|2 split, and a result needs a majority of the
    # members (3 of 4), so neither side publishes one (before issue 9 each side averaged
    # on its own: a split brain). Side A's aggregator is p0 (it gave up on p2 at epoch 0
    # and p3 at epoch 1), side B's is p2; both keep their local models.
    assert_same_model(rounds_seen[1])
    r2 = rounds_seen[2]
    assert {p for p in r2 if r2[p].get("below_quorum")} == {"p0", "p2"}
    assert {r2[p]["contributors"] for p in ("p0", "p2")} == {2}
    assert all(r2[p]["aggregator"] is None and "absorbed" not in r2[p] for p in r2)
    # After healing: everyone sees everyone again, and the cohort is one again.
    assert {rec["live_peers"] for rec in rounds_seen[3].values()} == {n}
    for r in (3, 4):
        assert {rec["aggregator"] for rec in rounds_seen[r].values()} == {f"p{r % n}"}
        assert {rec["contributors"] for rec in rounds_seen[r].values()} == {n}
        assert_same_model(rounds_seen[r])
    assert plan.counts.get("partitioned", 0) > 0


# =========================================================================== d


def test_hostile_and_malformed_messages_are_dropped_and_counted(tmp_path):
    n, rounds = 4, 3
    cfgs = cohort_cfgs(tmp_path, n, rounds=rounds)
    watch = RoundWatch(c.node.id for c in cfgs)
    hub = MemoryHub()
    nodes = [build_node(c, hub, on_round=watch) for c in cfgs]
    victim = nodes[1]
    mallory = InMemoryTransport("mallory", "mem://mallory", hub)

    def header(type_: str, sender: str = "mallory", tensors=()):
        return msgpack.packb(
            {
                "v": PROTOCOL_VERSION,
                "type": type_,
                "sender": sender,
                "incarnation": 0,
                "body": {},
                "tensors": list(tensors),
            }
        )

    weights = {"w": np.full(4, 1e6, dtype=np.float32)}
    attacks = [
        [b"\x92\xc1garbage"],  # not msgpack
        [],  # no frames at all
        [header("nuke")],  # a type nobody knows
        encode(Heartbeat(sender="p0", incarnation=0, round=2)),  # lies about who sends it
        encode(
            Knowledge(sender="mallory", incarnation=0, round=2, kind="weights", tensors=weights)
        ),  # never said hello
        encode(
            AggregateResult(
                sender="mallory", incarnation=0, round=2, epoch=99, kind="weights", tensors=weights
            )
        ),  # a forged result
        [
            msgpack.packb(
                {
                    "v": PROTOCOL_VERSION,
                    "type": "knowledge",
                    "sender": "mallory",
                    "incarnation": 0,
                    "body": {"round": 2, "kind": "w"},
                    "tensors": [{"name": "w", "dtype": "float32", "shape": [1000]}],
                }
            ),
            b"\x00" * 4,
        ],  # the tensor frame does not fit its shape
        [
            msgpack.packb(
                {
                    "v": PROTOCOL_VERSION,
                    "type": "knowledge",
                    "sender": "mallory",
                    "incarnation": 0,
                    "body": {"round": 2, "kind": "w"},
                    "tensors": [{"name": "w", "dtype": "object", "shape": [1]}],
                }
            ),
            b"\x00" * 8,
        ],  # a dtype outside the allowlist
    ]

    # A member (p3's identity, on a transport of its own) forging round 2's result:
    # the rotation elects someone else for (2, 99), so it is refused.
    impostor = InMemoryTransport("p3", "mem://impostor", hub)
    forged = encode(AggregateResult(sender="p3", incarnation=0, round=2, epoch=99, kind="weights",
                                    tensors=weights))

    async def attack():
        await mallory.start()
        await impostor.start()
        await watch.all_finished(1)  # the cohort is formed and running
        for frames in attacks:
            assert await mallory.send(victim.transport.address, frames, 1.0)
        assert await impostor.send(victim.transport.address, forged, 1.0)

    async def main():
        attacker = asyncio.create_task(attack())
        try:
            return await asyncio.gather(*(nd.run() for nd in nodes))
        finally:
            await asyncio.wait_for(attacker, WAIT_S)
            await mallory.close()
            await impostor.close()

    results = dict(zip([c.node.id for c in cfgs], asyncio.run(main()), strict=True))
    assert_completed(results, rounds)
    dropped = results["p1"].dropped
    for code, count in {
        "bad_header": 1,
        "bad_frames": 1,
        "unknown_type": 1,
        "identity_mismatch": 1,
        "not_member": 2,
        "bad_tensor": 2,
        "wrong_aggregator": 1,
    }.items():
        assert dropped.get(code, 0) >= count, (code, dropped)
    assert "mallory" not in victim.membership.members
    for r, recs in by_round(results).items():
        assert_same_model(recs)  # the forged result was not used by anyone
        assert {rec["contributors"] for rec in recs.values()} == {n}, r


# =========================================================================== e


class Crashed(Exception):
    """Stands for a process that died: no goodbye, no cleanup beyond closing its socket."""


@pytest.mark.parametrize("when", ["after_round_1", "while_serving_round_2"])
def test_aggregator_that_dies_is_replaced_by_the_next_in_rotation(tmp_path, when):
    n, rounds = 4, 3
    cfgs = cohort_cfgs(tmp_path, n, rounds=rounds)
    watch = RoundWatch(c.node.id for c in cfgs if c.node.id != "p2")
    hub = MemoryHub()
    doomed = "p2"  # sorted order p0..p3: p2 is elected for round 2 at epoch 0

    def crash(*_):
        raise Crashed(doomed)

    nodes = []
    for c in cfgs:
        extra = {}
        if c.node.id == doomed and when == "while_serving_round_2":
            from hfl.peer.config import FaultConfig

            # Collects everyone's contributions, then dies before sending the result.
            extra = {"fault": FaultConfig(crash_at_round=2, crash_phase="serve"), "crash": crash}
        nodes.append(build_node(c, hub, on_round=watch, **extra))
    if when == "after_round_1":
        watch.hooks[doomed] = lambda rec: crash() if rec["round"] == 1 else None

    async def main():
        return await asyncio.gather(*(nd.run() for nd in nodes), return_exceptions=True)

    outcome = dict(zip([c.node.id for c in cfgs], asyncio.run(main()), strict=True))
    assert isinstance(outcome.pop(doomed), Crashed)
    assert_completed(outcome, rounds)
    rounds_seen = by_round(outcome)
    assert {rec["aggregator"] for rec in rounds_seen[1].values()} == {"p1"}
    r2 = rounds_seen[2]
    # Everyone gave up on p2 at epoch 0 and took the next in rotation at epoch 1; nobody
    # took a result older than the epoch it had failed over to.
    assert {(rec["aggregator"], rec["epoch"]) for rec in r2.values()} == {("p3", 1)}
    assert {rec["contributors"] for rec in r2.values()} == {n - 1}
    assert_same_model(r2)
    for r in range(2, rounds + 1):
        assert doomed not in {rec["aggregator"] for rec in rounds_seen[r].values()}
        assert_same_model(rounds_seen[r])
    for peer, res in outcome.items():
        assert res.dropped.get("stale_result", 0) == 0, peer


# =========================================================================== f


def test_fedavg_cohort_over_zeromq_loopback(tmp_path):
    # With CURVE (the default): every link encrypted, every sender its key's peer id.
    n, rounds = 3, 3
    keys = cohort_keys(tmp_path / "keys", [f"p{i}" for i in range(n)])

    async def main():
        first = build_node(
            peer_cfg(tmp_path, "p0", 0, n, listen="tcp://127.0.0.1:0", rounds=rounds,
                     security=keys["p0"]), hub=None
        )
        tasks = [asyncio.create_task(first.run(), name="p0")]
        try:
            # p0 binds a free port first; the others bootstrap from wherever it landed.
            await until(lambda: first.membership is not None, "p0 to bind")
            address = first.transport.address
            assert address.startswith("tcp://127.0.0.1:") and not address.endswith(":0")
            for i in range(1, n):
                node = build_node(
                    peer_cfg(
                        tmp_path,
                        f"p{i}",
                        i,
                        n,
                        listen="tcp://127.0.0.1:0",
                        bootstrap=(f"p0@{address}",),
                        rounds=rounds,
                        security=keys[f"p{i}"],
                    ),
                    hub=None,
                )
                tasks.append(asyncio.create_task(node.run(), name=f"p{i}"))
            return await asyncio.wait_for(asyncio.gather(*tasks), 2 * WAIT_S)  # < the test timeout
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    results = dict(zip([f"p{i}" for i in range(n)], asyncio.run(main()), strict=True))
    assert_healthy_fedavg_cohort(results, n, rounds)
    for res in results.values():
        assert res.dropped == {}
        assert res.metrics[-1]["total_bytes_received"] > 0  # it all went over the sockets


# =========================================================================== g


@pytest.mark.parametrize(
    "mismatch", [{"rounds": 5}, {"algorithm": "solo"}, {"communicate_every": 2}],
    ids=["rounds", "algorithm", "communicate_every"]
)
def test_a_peer_of_another_cohort_is_refused(tmp_path, mismatch, caplog):
    n, rounds = 3, 3
    cfgs = cohort_cfgs(tmp_path, n, rounds=rounds)
    odd = peer_cfg(
        tmp_path,
        "odd",
        0,
        n,
        bootstrap=("mem://p0",),
        min_peers=2,
        cohort={"rounds": rounds, **mismatch},
        timing={"join_timeout_s": 1.0},
    )
    hub = MemoryHub()
    # The odd peer starts last: the others' addresses are bound before its first hello.
    nodes = [build_node(c, hub) for c in [*cfgs, odd]]

    async def main():
        return await asyncio.gather(*(nd.run() for nd in nodes))

    with caplog.at_level(logging.WARNING, logger="hfl.peer"):
        results = dict(zip([nd.id for nd in nodes], asyncio.run(main()), strict=True))
    odd_result = results.pop("odd")
    assert_completed(results, rounds)
    assert results["p0"].dropped.get("cohort_mismatch", 0) >= 1
    for node in nodes[:n]:
        assert "odd" not in node.membership.members, node.id
    for peer, res in results.items():
        assert all(rec["live_peers"] <= n for rec in res.metrics), peer
        assert res.metrics[0]["live_peers"] == n
    # The odd peer ran alone and was told why.
    assert all(rec["live_peers"] == 1 for rec in odd_result.metrics)
    assert odd_result.dropped.get("refused", 0) >= 1
    field = next(iter(mismatch))
    assert any(
        "odd: p0 refused our hello: cohort_mismatch" in r.getMessage()
        and f"{field} differs" in r.getMessage()
        for r in caplog.records
    )


def run_staggered(nodes: list[Node], starts: list[float]) -> dict[str, NodeResult]:
    """Start each node ``starts[i]`` seconds after the first (a cohort launched peer by
    peer on a busy machine) and run them all to the end."""

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def start(node: Node, at: float) -> NodeResult:
            await asyncio.sleep(max(0.0, t0 + at - loop.time()))
            return await node.run()

        return await asyncio.gather(*(start(nd, at) for nd, at in zip(nodes, starts, strict=True)))

    return dict(zip([nd.id for nd in nodes], asyncio.run(main()), strict=True))


def test_the_join_waits_while_peers_keep_arriving(tmp_path, caplog):
    # The last peer starts after the first one's join_timeout_s has passed, but within
    # join_timeout_s of the peer before it: the wait counts from the last arrival, so
    # the first round has the whole cohort (it used to start with three of four).
    n, join = 4, 2.0
    cfgs = cohort_cfgs(tmp_path, n, rounds=2, timing={"join_timeout_s": join})
    hub = MemoryHub()
    nodes = [build_node(c, hub) for c in cfgs]
    with caplog.at_level(logging.WARNING, logger="hfl.peer"):
        results = run_staggered(nodes, [0.0, 0.0, 0.6 * join, 1.3 * join])
    assert_completed(results, 2)
    for peer, res in results.items():  # (round 2's count may miss a peer that finished)
        assert res.metrics[0]["live_peers"] == n, peer
    assert not [r.getMessage() for r in caplog.records if "peers joined" in r.getMessage()]


def test_the_join_gives_up_join_timeout_s_after_the_last_arrival(tmp_path, caplog):
    # Two of the three peers min_peers asks for: nobody new comes, so the wait ends
    # join_timeout_s after the second arrived, and the two train together, saying so.
    join = 1.0
    cfgs = cohort_cfgs(tmp_path, 3, rounds=2, timing={"join_timeout_s": join})[:2]
    hub = MemoryHub()
    nodes = [build_node(c, hub) for c in cfgs]
    notes = []
    for nd in nodes:
        nd._observe = lambda event, node, **fields: notes.append((event, node.id, fields))

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        results = await asyncio.gather(*(nd.run() for nd in nodes))
        return results, loop.time() - t0

    with caplog.at_level(logging.WARNING, logger="hfl.peer"):
        results, took = asyncio.run(main())
    assert_completed(dict(zip(["p0", "p1"], results, strict=True)), 2)
    assert all(res.metrics[0]["live_peers"] == 2 for res in results)
    assert join <= took < join + WAIT_S
    said = [r.getMessage() for r in caplog.records if "peers joined" in r.getMessage()]
    assert any("only 2 of 3 peers joined (none new for 1s: p0, p1); starting anyway" in m
               for m in said)
    # ... and the same as a typed note (events.jsonl), which tools read instead of the line
    short = sorted((peer, f["joined"], f["need"]) for e, peer, f in notes if e == "join_short")
    assert short == [("p0", 2, 3), ("p1", 2, 3)]
    # What each peer counts it sent, by type, is what its transport delivered.
    for nd, res in zip(nodes, results, strict=True):
        assert res.sent_bytes.keys() == res.sent.keys() and all(res.sent_bytes.values())
        assert sum(res.sent.values()) == nd.transport.stats.messages_sent
        assert sum(res.sent_bytes.values()) == nd.transport.stats.bytes_sent


def test_a_tick_that_overruns_its_limit_is_cut_off_and_noted(tmp_path):
    # A stuck send must never stop failure detection: the tick is cut off at twice the
    # heartbeat interval, logged, and noted (slow_tick, for tools: an overloaded loop).
    node = build_node(peer_cfg(tmp_path, "p0", 0, 1), MemoryHub())
    notes = []
    node._observe = lambda event, nd, **fields: notes.append((event, fields))
    stuck = asyncio.Event()

    async def stuck_tick(tick: int) -> None:
        if tick == 0:
            await stuck.wait()  # never set: a send that hangs

    node._tick = stuck_tick

    async def main():
        task = asyncio.create_task(node._tick_loop())
        while not any(e == "slow_tick" for e, _ in notes):
            assert not task.done()
            await asyncio.sleep(0.01)  # waiting for the loop's timeout to cut tick 0 off
        node._stopping = True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), WAIT_S))
    interval = node.timing.heartbeat_interval_s
    assert [f for e, f in notes if e == "slow_tick"] == [{"tick": 0, "limit_s": 2 * interval}]


# =========================================================================== shutdown


def test_background_loops_end_when_cancelled_at_any_point(tmp_path):
    # Regression: with asyncio.wait_for (Python 3.11), a cancellation landing just as the
    # awaited tick / wakeup finished was swallowed, so a finished peer's shutdown never ended.
    node = build_node(peer_cfg(tmp_path, "p0", 0, 1), MemoryHub())

    async def instant_tick(tick: int) -> None:
        return None

    node._tick = instant_tick
    loop_deadline = 1.0  # far longer than one heartbeat interval

    async def cancel_after(coro, steps: int, before_cancel=lambda: None):
        task = asyncio.create_task(coro)
        for _ in range(steps):
            await asyncio.sleep(0)
        before_cancel()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=loop_deadline)
        return bool(done)

    async def main():
        node._stopping = False
        for steps in range(12):
            assert await cancel_after(
                node._wait_until(lambda: False, node.clock.now() + 60), steps, node._wakeup.set
            ), f"wait_until kept going ({steps})"
        for steps in range(12):
            node._stopping = False

            def stopping():
                node._stopping = True

            assert await cancel_after(node._tick_loop(), steps, stopping), f"tick loop ({steps})"

    asyncio.run(main())


def test_a_peer_that_leaves_has_its_connection_state_dropped(tmp_path, monkeypatch):
    forgotten: list[tuple[str, str]] = []
    original = InMemoryTransport.forget

    async def spy(self, address, peer_id=None):
        forgotten.append((self.peer_id, address))
        await original(self, address, peer_id)

    monkeypatch.setattr(InMemoryTransport, "forget", spy)
    n, rounds = 3, 2
    results = run_cohort_with_run_peer(cohort_cfgs(tmp_path, n, rounds=rounds))
    assert_completed(results, rounds)
    # Whoever finished after another peer said goodbye forgot that peer's address
    # (and only addresses of peers that left, never its own).
    assert forgotten
    assert all(address == f"mem://{other}" and me != other
               for me, address in forgotten for other in [address.removeprefix("mem://")])


def test_a_restarted_peer_sits_out_the_round_its_earlier_life_entered(tmp_path):
    # Protocol 2: an earlier life of p0 entered round 1 (and may have acked a result
    # there) and was killed before its checkpoint. Restarted, p0 does not know what it
    # acked, so it neither contributes nor acks in round 1, as an acceptor that crashed
    # for good would not: an amnesiac promise could let a later epoch commit a second
    # result. It still absorbs the round's result once its aggregator commits it (a
    # committed value is the round's one), and takes part again from round 2.
    n, rounds = 3, 3
    cfgs = cohort_cfgs(tmp_path, n, rounds=rounds)
    cfgs[0] = dataclasses.replace(
        cfgs[0], node=dataclasses.replace(cfgs[0].node, resume=True, checkpoint=True))
    (tmp_path / "p0").mkdir(parents=True, exist_ok=True)
    (tmp_path / "p0" / "entered_round").write_text("1")
    results = run_cohort_with_run_peer(cfgs)
    assert_completed(results, rounds)
    r = by_round(results)
    assert r[1]["p0"].get("sat_out") is True
    assert {r[1][p]["contributors"] for p in r[1]} == {2}  # p1 and p2: still a quorum
    assert_same_model(r[1])  # p0 took the committed result too
    assert all(r[k]["p0"]["learned_from"] >= 1 for k in (2, 3))
    assert (tmp_path / "p0" / "entered_round").read_text() == "3"


def test_a_message_sent_to_several_places_in_one_batch_is_encoded_once(tmp_path, monkeypatch):
    # A tick's hello goes to every member it greets (hundreds, as a cohort forms): one
    # encoding (with its validation) for all of them, and every place still gets it.
    import hfl.peer.outbox as outbox_module
    from hfl.peer.instructions import Send

    hub = MemoryHub()
    cfgs = cohort_cfgs(tmp_path, 4)
    nodes = [build_node(c, hub) for c in cfgs]
    encodings = []
    monkeypatch.setattr(outbox_module, "encode",
                        lambda msg, limits: encodings.append(msg.TYPE) or encode(msg, limits))

    async def main():
        for n in nodes:
            await n.transport.start()
        p0, others = nodes[0], nodes[1:]
        p0.core.open_view(p0.transport.address, p0.rng)
        hello = p0.core.hello(introduced=True)
        await p0._carry_out([Send(n.transport.address, hello, 1.0, n.id) for n in others])
        got = [await asyncio.wait_for(n.transport.recv(), WAIT_S) for n in others]
        for n in nodes:
            await n.transport.close()
        return got

    got = asyncio.run(main())
    assert encodings == ["hello"]
    assert [sender for sender, _ in got] == ["p0"] * 3


def test_a_batch_never_sends_past_an_earlier_send_to_the_same_address_that_waits():
    # Two messages to one address in one batch (a tick's hello, then a heartbeat): the
    # first had to wait (its link not up), and the link came up before the second was
    # tried (ZeroMQ connects in its own thread). The second must wait its turn too, not
    # go out at once ahead of the first. A transport double: the race is ZeroMQ's timing.
    from collections import Counter

    from hfl.peer.instructions import Broadcast, Send
    from hfl.peer.membership import Membership
    from hfl.peer.outbox import Outbox
    from hfl.protocol import decode

    class LinkUpAfterFirstTry:
        def __init__(self):
            self.tries, self.got = 0, []

        def send_now(self, address, frames, peer_id=None):
            self.tries += 1
            if self.tries == 1:
                return None  # not up yet: the caller waits
            self.got.append(decode(frames).round)
            return True

        async def send(self, address, frames, timeout_s, peer_id=None):
            self.got.append(decode(frames).round)
            return True

    view = Membership("p0", "mem://p0", 0, 2.0, 5.0)
    view.heard_from("p1", 0, 0.0, address="mem://p1")
    link = LinkUpAfterFirstTry()
    out = Outbox("p0", link, Limits(), 1.0, lambda: view, None, Counter())

    def knowledge(r):
        return Knowledge(sender="p0", incarnation=0, round=r, kind="weights", tensors={})

    waits = out.batch([Send("mem://p1", knowledge(1), 1.0, "p1"),
                       Send("mem://p1", knowledge(2), 1.0, "p1"),
                       Broadcast(("p1",), knowledge(3), 1.0)], lambda ins: None)

    async def main():
        await asyncio.gather(*waits)

    asyncio.run(main())
    assert link.got == [1, 2, 3]
    assert out.sent == {"knowledge": 3}


def test_a_broadcast_and_a_reply_go_out_without_a_task_per_destination(tmp_path):
    # A thousand peers in one process send hundreds of thousands of messages as the
    # cohort forms: a send the transport takes at once needs no task (each costs the
    # shared loop more than the send); only one that must wait gets one.
    hub = MemoryHub()
    nodes = [build_node(c, hub) for c in cohort_cfgs(tmp_path, 4)]

    async def main():
        for n in nodes:
            await n.transport.start()
        p0, others = nodes[0], nodes[1:]
        p0.core.open_view(p0.transport.address, p0.rng)
        for n in others:
            p0.membership.heard_from(n.id, 0, 0.0, address=n.transport.address)

        async def must_not_wait(*args, **kwargs):
            raise AssertionError("an in-memory send waited")

        p0.transport.send = must_not_wait
        took = await p0._broadcast([n.id for n in others], p0.core.heartbeat(), 1.0)
        p0.out.reply(others[0].transport.address, p0.core.heartbeat(), others[0].id)
        assert not p0._tasks  # the reply went at once, no task spawned
        got = [await asyncio.wait_for(n.transport.recv(), WAIT_S) for n in others]
        got.append(await asyncio.wait_for(others[0].transport.recv(), WAIT_S))
        for n in nodes:
            await n.transport.close()
        return took, got, dict(p0.sent)

    took, got, sent = asyncio.run(main())
    assert took == 3 and [s for s, _ in got] == ["p0"] * 4
    assert sent == {"heartbeat": 4}


def test_in_one_process_a_method_call_that_was_short_runs_on_the_shared_loop(tmp_path):
    # Thread hops and GIL hand-offs cost more than a call of a few milliseconds (a
    # thousand quickstart peers in one process: 5.4 s a round with every call in a
    # thread, 3.4 s with the short ones on the loop); a long call must still not hold
    # the loop twice, and the first call of each hook is not known to be short.
    import threading
    import time as time_module

    node = build_node(cohort_cfgs(tmp_path, 2)[0], MemoryHub(), inline_short_calls=True)
    # "Short" as 0.25 s here, not the 5 ms of a run: on a loaded machine a call that does
    # nothing took over 5 ms of wall time now and then (preempted), and ran in a thread.
    node.INLINE_BELOW_S = 0.25
    loop_thread = threading.get_ident()
    ran_on, costs = [], iter([0.0, 0.0, 0.0, 0.5, 0.0, 0.0])

    def local_update(round):
        ran_on.append("loop" if threading.get_ident() == loop_thread else "thread")
        time_module.sleep(next(costs))  # (a sleep is wall time, not CPU: either counts)
        if round == 3:
            raise RuntimeError("a hook that failed")
        return {"round": round}

    async def main():
        out = []
        for r in range(6):
            try:
                out.append(await node._compute_call(local_update, r))
            except RuntimeError:
                out.append("failed")
        return out

    assert asyncio.run(main()) == [{"round": r} if r != 3 else "failed" for r in range(6)]
    # first: a thread; then short, on the loop; the long one (0.5 s, and it raised) on
    # the loop once, since it was short last time; after it, a thread, then the loop.
    assert ran_on == ["thread", "loop", "loop", "loop", "thread", "loop"]
    assert node.ledger.compute[0] >= 0.5  # every call's time is still counted

    # A peer process of its own keeps every call in a thread (a hook grown long must
    # not make it look dead), and a given run_blocking (the simulator's) runs them all.
    for kw in ({}, {"inline_short_calls": True,
                    "run_blocking": lambda fn, *a: asyncio.to_thread(fn, *a)}):
        other = build_node(cohort_cfgs(tmp_path, 2)[1], MemoryHub(), **kw)
        ran_on.clear()
        costs = iter([0.0] * 3)

        async def calls(node=other):
            for r in range(3):
                await node._compute_call(local_update, r)

        asyncio.run(calls())
        assert ran_on == ["thread"] * 3, kw


def test_a_peer_that_keeps_standing_still_says_so_once_a_minute(tmp_path, caplog):
    # A thousand peers on one saturated loop each stood still a few times a round: one
    # warning each time was 25,000 identical lines in a 10-round run. Every pause still
    # counts (nobody's silence over it is held against them).
    node = build_node(cohort_cfgs(tmp_path, 2)[0], MemoryHub())
    with caplog.at_level(logging.WARNING, logger="hfl.peer"):
        for now, seconds in [(10.0, 1.5), (12.0, 1.2), (40.0, 3.0), (71.0, 1.1), (72.0, 2.0)]:
            node.pauses.add(seconds, now)
    lines = [r.getMessage() for r in caplog.records if "stood still" in r.getMessage()]
    assert lines == [
        "p0: this peer stood still for 1.5s; not holding that against the others",
        "p0: this peer stood still for 1.1s (3 times since the last such line, the longest "
        "3.0s); not holding that against the others",
    ]
    assert node.pauses.total == pytest.approx(1.5 + 1.2 + 3.0 + 1.1 + 2.0)
    node.pauses.close()  # at exit: the one since the last line is told too
    lines = [r.getMessage() for r in caplog.records if "stood still" in r.getMessage()]
    assert lines[-1] == ("p0: this peer stood still 1 more time(s) since the last such line, "
                         "the longest 2.0s")
    node.pauses.close()  # (once)
    assert len([r for r in caplog.records if "stood still" in r.getMessage()]) == 3


def test_a_started_call_runs_while_the_round_goes_on_and_the_peer_waits_for_it(tmp_path):
    # cohort.overlap: StartCompute hands the call to the worker thread and returns at
    # once (the round goes on to its wait); JoinCompute waits for it and returns its value.
    import threading

    from hfl.peer import instructions as do

    node = build_node(cohort_cfgs(tmp_path, 2)[0], MemoryHub())
    gate, ran = threading.Event(), []

    def local_update(round):
        assert gate.wait(60), "never let through"
        ran.append(round)
        return {"round": round}

    node.alg.local_update = local_update

    async def main():
        assert await node._perform(do.StartCompute("local_update", (2,))) is None
        assert not ran  # still training: nothing waited for it
        gate.set()
        return await node._perform(do.JoinCompute())

    assert asyncio.run(main()) == {"round": 2} and ran == [2]
    assert node._started is None  # joined: the next StartCompute may begin
