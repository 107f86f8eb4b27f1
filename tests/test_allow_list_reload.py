"""An organisation admits or cuts off a partner without restarting its peer.

The allow-list file is reread when it changes (checked every heartbeat tick) or on
SIGHUP: a key added is admitted at its next handshake, a key removed is cut off at
once (links closed, its messages dropped, its membership ended), and a peer that
was refused keeps dialling with backoff, so it joins as soon as it is admitted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hfl.peer.security import create_key_pair, load_identity, load_public_key, write_allow_list
from hfl.peer.transport import TransportOptions, ZmqTransport

pytestmark = pytest.mark.timeout(120)


def keys(tmp_path: Path, *ids: str) -> dict[str, bytes]:
    for pid in ids:
        create_key_pair(tmp_path / pid, pid)
    return {pid: load_public_key(tmp_path / pid / f"{pid}.key") for pid in ids}


def identity(tmp_path: Path, pid: str, allowed: dict[str, bytes]):
    path = tmp_path / pid / "allow_list"
    write_allow_list(path, allowed)
    return load_identity(pid, tmp_path / pid / f"{pid}.key_secret", path)


async def until(condition, timeout_s: float, step=None) -> float:
    """Seconds until ``condition()`` held (``step()`` awaited between checks)."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout_s, "condition not reached in time"
        await (step() if step else asyncio.sleep(0.02))
    return time.monotonic() - t0


def test_a_key_added_is_admitted_and_a_key_removed_is_cut_off_without_a_restart(tmp_path):
    pub = keys(tmp_path, "p0", "p1")
    a = ZmqTransport("p0", "tcp://127.0.0.1:0", security=identity(tmp_path, "p0", {"p0": pub["p0"]}),
                     options=TransportOptions(redial_max_s=0.5))
    b = ZmqTransport("p1", "tcp://127.0.0.1:0", security=identity(tmp_path, "p1", pub))

    async def main():
        await a.start()
        await b.start()
        got: list[str] = []

        async def receive():
            while True:
                sender, frames = await a.recv()
                got.append(sender)

        receiver = asyncio.get_running_loop().create_task(receive())

        async def b_sends():  # what a joining peer does: say hello again every tick
            await b.send(a.address, [b"hello"], 0.05, peer_id="p0")
            a.housekeeping()
            await asyncio.sleep(0.02)

        try:
            await until(lambda: b.dial_failure(a.address) is not None, 10, b_sends)
            assert "not on its allow-list" in b.dial_failure(a.address)
            assert not got
            assert a.take_allow_list_change() is None

            write_allow_list(a.security.allow_list_path, pub)  # the organisation admits p1
            admit_s = await until(lambda: "p1" in got, 10, b_sends)
            allowed, removed = a.take_allow_list_change()
            assert allowed == {"p0", "p1"} and not removed
            assert await a.send(b.address, [b"welcome"], 2.0, peer_id="p1")
            assert (await asyncio.wait_for(b.recv(), 5))[0] == "p0"

            write_allow_list(a.security.allow_list_path, {"p0": pub["p0"]})  # ... and revokes it
            a.housekeeping()
            allowed, removed = a.take_allow_list_change()
            assert allowed == {"p0"} and removed == {"p1"}
            assert not await a.send(b.address, [b"more"], 0.2, peer_id="p1")
            n = len(got)
            # p1's connection stays up on its side; everything on it is dropped here.
            revoked = lambda: a.refusals.total.get("revoked_key", 0) >= 3  # noqa: E731
            await until(revoked, 10, b_sends)
            assert len(got) == n
            print(f"admitted after {admit_s:.2f} s")
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
            await b.close()
            await a.close()

    asyncio.run(main())


def test_a_broken_edit_keeps_the_list_in_force(tmp_path, caplog):
    pub = keys(tmp_path, "p0", "p1")
    a = ZmqTransport("p0", "tcp://127.0.0.1:0", security=identity(tmp_path, "p0", pub))

    async def main():
        await a.start()
        try:
            path = Path(a.security.allow_list_path)
            path.write_text(path.read_text() + "p2 not-a-key\n")
            a.housekeeping()
            assert a.take_allow_list_change() is None and set(a.security.allowed) == {"p0", "p1"}
            write_allow_list(path, {"p1": pub["p1"]})  # this peer itself left out
            a.housekeeping()
            assert a.take_allow_list_change() is None and set(a.security.allowed) == {"p0", "p1"}
            # A byte that is not UTF-8: the tick raised UnicodeDecodeError (a review)
            write_allow_list(path, pub)
            path.write_bytes(path.read_bytes() + b"# caf\xe9\n")
            a.housekeeping()
            assert a.take_allow_list_change() is None and set(a.security.allowed) == {"p0", "p1"}
            # A list any user of the machine could have written (a keys review: read
            # without a word): whatever it says, not taken; made private, it is (the
            # chmod alone: it was not seen as a change, a review)
            more = keys(tmp_path, "p2")
            write_allow_list(path, {**pub, **more})
            path.chmod(0o666)
            a.housekeeping()
            assert a.take_allow_list_change() is None and set(a.security.allowed) == {"p0", "p1"}
            path.chmod(0o644)
            a.housekeeping()
            assert a.take_allow_list_change() is not None
            assert set(a.security.allowed) == {"p0", "p1", "p2"}
        finally:
            await a.close()

    asyncio.run(main())
    assert "not a 40-character Z85 public key" in caplog.text
    assert "no longer lists this peer (p0)" in caplog.text
    assert "is not UTF-8 text" in caplog.text
    assert "is writable by other users (mode 666), who could add a key of their own" in caplog.text


def test_a_member_put_back_on_the_allow_list_is_taken_back_without_a_restart():
    # A review: removed, then put back (an edit undone), p2 stayed gone until its process
    # restarted: its end was a goodbye's, for good at its incarnation.
    from tests.test_core_handle import bare

    core = bare(members=("p1", "p2"))
    core.allowed_peers = frozenset({"p0", "p1", "p2"})
    core.allow_list_changed(frozenset({"p0", "p1"}), frozenset({"p2"}))
    assert core.membership.members["p2"].status == "left"
    assert core.membership.heard_from("p2", 0, 1.0) is None  # removed: nothing of it counts
    core.allow_list_changed(frozenset({"p0", "p1", "p2"}), frozenset())
    change = core.membership.heard_from("p2", 0, 2.0, address="mem://p2")
    assert change is not None and change.new == "alive"  # its next message brings it back
    assert not core.revoked


# ----------------------------------------------------------------------------- two hfl-peer processes


def peer_config(tmp_path: Path, pid: str, port: int, bootstrap: list[str]) -> Path:
    cfg = {
        "node": {"id": pid, "listen": f"tcp://127.0.0.1:{port}", "bootstrap": bootstrap,
                 "run_dir": str(tmp_path / "run" / pid), "min_peers": 2, "allow_solo": True,
                 "checkpoint": False},
        "cohort": {"name": "reload", "algorithm": "fedavg", "rounds": 100000, "num_classes": 10},
        "data": {"dataset": "digits", "partition": "iid", "num_partitions": 2,
                 "partition_index": int(pid[1:])},
        "model": {"arch": "mlp", "options": {"hidden": [16]}},
        "train": {"max_batches": 1},
        "timing": {"heartbeat_interval_s": 0.2, "suspect_after_s": 1.0, "dead_after_s": 2.0,
                   "round_timeout_s": 2.0, "aggregate_grace_s": 0.5, "join_timeout_s": 120},
        "security": {"mode": "curve", "key_file": str(tmp_path / pid / f"{pid}.key_secret"),
                     "allow_list": str(tmp_path / pid / "allow_list")},
    }
    path = tmp_path / f"{pid}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def events(tmp_path: Path, pid: str) -> list[dict]:
    try:
        text = (tmp_path / "run" / pid / "events.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def last_metrics(tmp_path: Path, pid: str) -> dict:
    try:
        lines = (tmp_path / "run" / pid / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return {}
    return json.loads(lines[-1]) if lines and lines[-1].endswith("}") else {}


def wait_for(condition, timeout_s: float, procs) -> float:
    t0 = time.monotonic()
    while not condition():
        for p in procs:
            assert p.poll() is None, f"a peer exited with status {p.returncode}"
        assert time.monotonic() - t0 < timeout_s, "condition not reached in time"
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.mark.e2e
def test_two_running_peers_admit_and_revoke_each_within_seconds(tmp_path):
    """p1 dials p0, whose allow-list lacks it: refused. p0's file gets p1's line: they
    train together within seconds. p0's file loses it again and p0 gets SIGHUP: p0
    ends the membership and learns from nobody from then on; p1 sees p0 go silent."""
    from conftest import free_tcp_port

    pub = keys(tmp_path, "p0", "p1")
    write_allow_list(tmp_path / "p0" / "allow_list", {"p0": pub["p0"]})
    write_allow_list(tmp_path / "p1" / "allow_list", pub)
    port = free_tcp_port()
    configs = [peer_config(tmp_path, "p0", port, []),
               peer_config(tmp_path, "p1", free_tcp_port(), [f"p0@tcp://127.0.0.1:{port}"])]
    procs = [subprocess.Popen([sys.executable, "-m", "hfl.peer.cli", "--config", str(c), "--no-plot"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in configs]
    try:
        refused = lambda: any("refused our connection" in e.get("msg", "") for e in events(tmp_path, "p1"))  # noqa: E731
        wait_for(refused, 90, procs)

        t0 = time.time()
        write_allow_list(tmp_path / "p0" / "allow_list", pub)
        admitted = lambda: last_metrics(tmp_path, "p0").get("learned_from", 0) >= 1  # noqa: E731
        wait_for(admitted, 30, procs)
        admit_s = time.time() - t0

        # Revoke on SIGHUP alone: the same size and modification time, so the file
        # watch cannot be what notices.
        path = tmp_path / "p0" / "allow_list"
        before = path.stat()
        text = path.read_text()
        line = next(x for x in text.splitlines() if x.startswith("p1 "))
        path.write_text(text.replace(line, "#" + line[1:]))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        t1 = time.time()
        procs[0].send_signal(signal.SIGHUP)
        ended = lambda: any("p1 removed from the allow-list" in e.get("msg", "")  # noqa: E731
                            for e in events(tmp_path, "p0"))
        wait_for(ended, 30, procs)
        revoke_s = next(e["t"] for e in events(tmp_path, "p0")
                        if "p1 removed from the allow-list" in e.get("msg", "")) - t1
        cut = last_metrics(tmp_path, "p0").get("round", 0) + 1
        solo = lambda: last_metrics(tmp_path, "p0").get("round", 0) >= cut + 2  # noqa: E731
        wait_for(solo, 30, procs)
        lines = (tmp_path / "run" / "p0" / "metrics.jsonl").read_text().splitlines()
        after = [json.loads(x) for x in lines if json.loads(x)["round"] > cut]
        assert after and all(r["learned_from"] == 0 for r in after)
        p1_lost_p0 = lambda: any("p0 alive -> suspect" in e.get("msg", "") or "p0 alive -> dead"  # noqa: E731
                                 in e.get("msg", "") for e in events(tmp_path, "p1"))
        wait_for(p1_lost_p0, 30, procs)
        # Put back (the edit undone), neither restarted: they learn together again (p1
        # stayed gone until its process restarted, a review).
        t2 = time.time()
        path.write_text(text)
        procs[0].send_signal(signal.SIGHUP)
        back = lambda: last_metrics(tmp_path, "p0").get("learned_from", 0) >= 1  # noqa: E731
        wait_for(back, 30, procs)
        readmit_s = time.time() - t2
        print(f"admitted in {admit_s:.2f} s (file change to learning together); "
              f"revoked in {revoke_s:.2f} s (SIGHUP to membership ended); "
              f"put back in {readmit_s:.2f} s")
        assert admit_s < 15 and revoke_s < 5
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_sighup_is_ignored_once_the_allow_list_transport_closes(tmp_path):
    # A review: closing the transport restored SIGHUP's default action, which ends the
    # process (a peer stopping, or a second one in this process, died with no goodbye).
    from hfl.peer.security import load_identity
    from hfl.peer.transport import ZmqTransport

    pub = keys(tmp_path, "p0")
    write_allow_list(tmp_path / "p0" / "allow_list", pub)
    identity = load_identity("p0", str(tmp_path / "p0" / "p0.key_secret"),
                             str(tmp_path / "p0" / "allow_list"))
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        async def main():
            t = ZmqTransport("p0", "tcp://127.0.0.1:0", security=identity)
            await t.start()
            os.kill(os.getpid(), signal.SIGHUP)  # while it listens: a reload asked
            await asyncio.sleep(0.05)
            assert t._reload_asked
            await t.close()

        asyncio.run(main())
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)  # ignored: this test goes on
    finally:
        signal.signal(signal.SIGHUP, before)
