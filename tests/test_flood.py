"""Equal service under a member's flood (issue 35, item 4): one member that floods a
peer with valid messages must not make that peer look dead to the others, nor delay
the others' messages behind its own. Real ZeroMQ sockets with CURVE; each peer runs
its own event loop in its own thread (as separate processes would: one peer's busy
loop must not stop the others' clocks)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from hfl.peer.security import cohort_keys, load_secret_key
from hfl.protocol import Heartbeat, encode
from tests.test_cohort import WAIT_S, TrainingGate, build_node, peer_cfg

pytestmark = [pytest.mark.timeout(120)]

FLOOD_S = 3.0  # how long the flooder sends as fast as it can


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_members_flood_does_not_make_its_target_look_dead_to_the_others(tmp_path):
    import zmq

    ids = ["p0", "p1", "p2"]
    rounds, held = 4, 3
    keys = cohort_keys(tmp_path / "keys", ids)
    ports = {p: free_port() for p in ids}
    cfgs = [peer_cfg(tmp_path, p, i, len(ids), listen=f"tcp://127.0.0.1:{ports[p]}",
                     bootstrap=() if p == "p0" else (f"p0@tcp://127.0.0.1:{ports['p0']}",),
                     rounds=rounds, security=keys[p], cohort={"aggregate_at": "every_peer"})
            for i, p in enumerate(ids)]
    gate = TrainingGate([held])  # the cohort waits in round 3 while p0 is flooded
    nodes, results, changes, errors = {}, {}, {p: [] for p in ids}, []
    ready = threading.Barrier(len(ids) + 1)

    def run(cfg):
        async def main():
            node = build_node(cfg, None)
            gate.install(node)
            nodes[cfg.node.id] = node
            task = asyncio.create_task(node.run())
            while node.membership is None:
                await asyncio.sleep(0.01)
            tick = node.membership.tick

            def record(now):
                out = tick(now)
                changes[cfg.node.id].extend((c.peer_id, c.new) for c in out)
                return out

            node.membership.tick = record
            await asyncio.get_running_loop().run_in_executor(None, ready.wait)
            return await task

        try:
            results[cfg.node.id] = asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append((cfg.node.id, exc))

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in cfgs]
    for t in threads:
        t.start()
    ready.wait(timeout=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while not all(nd.round >= held for nd in nodes.values()) or len(nodes) < len(ids):
        assert time.monotonic() < deadline, "the cohort never reached round 3"
        time.sleep(0.01)

    # p2's key on a second connection of its own, flooding p0 with valid heartbeats.
    ctx = zmq.Context()
    flooder = ctx.socket(zmq.DEALER)
    public, secret = load_secret_key(keys["p2"]["key_file"], "p2")
    flooder.curve_publickey, flooder.curve_secretkey = public, secret
    flooder.curve_serverkey = nodes["p0"].transport.security.public_key
    flooder.setsockopt(zmq.SNDHWM, 100_000)
    flooder.setsockopt(zmq.LINGER, 0)
    flooder.connect(f"tcp://127.0.0.1:{ports['p0']}")
    beat = [bytes(f) for f in encode(Heartbeat(sender="p2", incarnation=nodes["p2"].incarnation,
                                               round=held))]
    sent, end = 0, time.monotonic() + FLOOD_S
    while time.monotonic() < end:
        try:
            flooder.send_multipart(beat, flags=zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            time.sleep(0.0005)
    flooder.close()
    ctx.term()
    gate.release_all()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert set(results) == set(ids)
    assert sent > 10_000, sent  # a flood: far more than p0 handles in FLOOD_S
    # p0 kept its heartbeats going: nobody suspected it, nobody declared it dead.
    for p in ("p1", "p2"):
        assert not [c for c in changes[p] if c[0] == "p0"], (p, changes[p])
    assert all(len(res.metrics) == rounds for res in results.values())


# ---------------------------------------------------------------- the inbox, bare


def test_a_sender_past_its_flood_budget_is_muted_for_the_rest_of_that_second_only():
    from hfl.peer.inbox import FloodBudget

    b = FloodBudget(limit=3)
    said = [b.charge("m", 10.0 + i * 0.01) for i in range(5)]
    assert said == [False, False, False, True, False]  # said once, as the limit is passed
    assert b.muted("m", 10.5) and not b.muted("other", 10.5)
    assert not b.muted("m", 11.0)  # its second is over
    assert [b.charge("m", 11.0 + i * 0.01) for i in range(4)] == [False, False, False, True]
    # Drops spread thinner than the limit a second never mute anyone.
    b = FloodBudget(limit=3)
    assert not any(b.charge("m", t * 0.4) for t in range(40))
    assert not b.muted("m", 16.0)


def test_a_flood_of_sender_ids_keeps_the_budgets_memory_bounded():
    # A plaintext flood can use a new id per message: windows past are pruned, once a
    # second, so what is kept stays about one second's senders.
    from hfl.peer.inbox import FloodBudget

    b = FloodBudget(limit=2)
    for i in range(5 * FloodBudget.KEEP):
        b.charge(f"id{i}", i * 0.001)  # 1,000 new ids a second
    assert len(b) <= FloodBudget.KEEP + 1000 + 1


def test_the_inbox_takes_senders_in_turn_and_says_when_it_reads_behind():
    # One sender's backlog waits in the transport; the other sender's one message is
    # handled in the first turn, not after the backlog.
    from collections import deque

    from hfl.peer.inbox import Inbox

    class Waiting:  # what a transport holds unread, in arrival order
        def __init__(self, items):
            self.items = deque(items)

        def recv_nowait(self):
            return self.items.popleft() if self.items else None

        async def recv(self):
            while not self.items:
                await asyncio.sleep(0)
            return self.items.popleft()

    backlog = Inbox.READ_AHEAD + 20
    transport = Waiting([("flooder", [b"%d" % i]) for i in range(backlog)] + [("other", [b"x"])])
    handled, behind, failed = [], [], []
    inbox = None

    def handle(identity, frames):
        handled.append(identity)
        behind.append(inbox.reading_behind)
        if frames == [b"7"]:
            raise ValueError("a handler's bug")

    inbox = Inbox(lambda: transport, handle, failed.append)

    async def main():
        task = asyncio.create_task(inbox.run())
        while len(handled) < backlog + 1:
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert failed == ["flooder"]  # counted, and the loop went on
    assert handled.index("other") < Inbox.READ_AHEAD  # read ahead: the second sender's turn
    assert behind[0] is True and behind[-1] is False
