"""Message throughput and bandwidth over loopback TCP with the real stack.

    python bench/throughput.py [--quick] [--seconds S]

hfl path: two ``ZmqTransport``s bound on ``tcp://127.0.0.1:0`` in one asyncio
process (the event loop hfl-peer uses: uvloop when installed). The sender
encodes a ``Knowledge`` message with ``hfl.protocol.encode`` for every send and
calls ``transport.send``; the receiver awaits ``transport.recv`` and decodes
each message with ``hfl.protocol.decode``. So codec, validation and the
transport's per-send poll are all included.

raw path (the reference): a plain pyzmq asyncio DEALER -> ROUTER pair, one
context each as above, sending a fixed 64-byte header frame plus the same
payload buffer (``copy=False``, as hfl sends), received with
``recv_multipart(copy=False)``, no codec.

Payloads: one float32 tensor of 10 elements (~ a heartbeat-sized message),
64 KiB, 1 MiB, 8 MiB and 32 MiB. Each size sends until N messages or S seconds
(whichever first) after a short warm-up, with at most ~128 MiB (and at most
1000 messages) in flight, so memory stays bounded. Reports msgs/s, payload MB/s
(1 MB = 10^6 bytes) and hfl/raw.

Sender and receiver share one process and one event loop (and the GIL), as
every hfl peer does with its own sends and receives; --processes 2 puts each
receiver in a child process instead (flow control then uses credit messages on
a second socket pair) to show how much sharing one process costs.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import sys
import time

import _common as c
import numpy as np

SIZES = [  # label, payload bytes, max messages
    ("10 floats", 40, 200_000),
    ("64 KiB", 64 * 2**10, 50_000),
    ("1 MiB", 2**20, 10_000),
    ("8 MiB", 8 * 2**20, 1_500),
    ("32 MiB", 32 * 2**20, 400),
]
WINDOW_BYTES = 128 * 2**20
WINDOW_MSGS = 1000  # TransportOptions.send_hwm
WARMUP = 5
HEADER = b"h" * 64
MEASURE_GRACE_S = 60  # warm-up, draining and teardown on top of the time cap


def runner():
    try:
        import uvloop

        return uvloop.run, "uvloop"
    except ImportError:
        return asyncio.run, "asyncio"


def window_for(nbytes: int) -> int:
    return max(2, min(WINDOW_MSGS, WINDOW_BYTES // max(nbytes, 1)))


class Flow:
    """Sender-side bookkeeping: sent / received counts and a bounded window."""

    def __init__(self, window: int):
        self.window = window
        self.received = 0
        self.changed = asyncio.Event()

    def got(self, n: int = 1) -> None:
        self.received += n
        self.changed.set()

    async def wait_below(self, sent: int, limit: int) -> None:
        while sent - self.received >= limit:
            self.changed.clear()
            await self.changed.wait()


async def _drive(send_one, flow: Flow, max_msgs: int, max_s: float) -> tuple[int, float]:
    """Warm up, then send until max_msgs or max_s; returns (measured messages, seconds)."""
    for i in range(WARMUP):
        await send_one(i)
    await flow.wait_below(WARMUP, 1)  # every warm-up message arrived
    base = flow.received
    t0 = time.perf_counter()
    sent = 0
    while sent < max_msgs and time.perf_counter() - t0 < max_s:
        await flow.wait_below(base + sent, flow.window)
        await send_one(sent)
        sent += 1
    await flow.wait_below(base + sent, 1)
    return sent, time.perf_counter() - t0


# --------------------------------------------------------------------------- one process


async def hfl_one_process(nbytes: int, max_msgs: int, max_s: float, security=None) -> dict:
    """``security``: None for plaintext, or {peer id: CurveIdentity} for "a" and "b"."""
    from hfl.peer.transport import ZmqTransport
    from hfl.protocol import Knowledge, decode, encode

    arr = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    sec = security or {}
    a = ZmqTransport("a", "tcp://127.0.0.1:0", security=sec.get("a"))
    b = ZmqTransport("b", "tcp://127.0.0.1:0", security=sec.get("b"))
    await a.start()
    await b.start()
    flow = Flow(window_for(nbytes))
    failures = 0

    async def receive():
        while True:
            _, frames = await b.recv()
            msg = decode(frames)
            if msg.tensors["w"].nbytes != arr.nbytes:
                raise AssertionError("payload size changed in transit")
            flow.got()

    async def send_one(i: int):
        nonlocal failures
        frames = encode(
            Knowledge(sender="a", incarnation=0, round=i, kind="weights", tensors={"w": arr})
        )
        while not await a.send(b.address, frames, timeout_s=5.0, peer_id="b"):
            failures += 1

    rx = asyncio.create_task(receive(), name="bench-receive")
    try:
        n, secs = await _drive(send_one, flow, max_msgs, max_s)
    finally:
        rx.cancel()
        await asyncio.gather(rx, return_exceptions=True)
        await a.close()
        await b.close()
    wire = sum(
        len(memoryview(f))
        for f in encode(
            Knowledge(sender="a", incarnation=0, round=0, kind="weights", tensors={"w": arr})
        )
    )
    return {"messages": n, "seconds": secs, "wire_bytes_per_msg": wire, "send_failures": failures}


def _raw_sockets():
    import zmq
    import zmq.asyncio

    ctx_rx, ctx_tx = zmq.asyncio.Context(), zmq.asyncio.Context()
    router = ctx_rx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:0")
    dealer = ctx_tx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, b"a")
    dealer.connect(router.getsockopt(zmq.LAST_ENDPOINT).decode())
    return (ctx_rx, router), (ctx_tx, dealer)


async def raw_one_process(nbytes: int, max_msgs: int, max_s: float) -> dict:
    payload = memoryview(
        np.random.default_rng(0).random(nbytes // 4, dtype=np.float32).view(np.uint8)
    )
    (ctx_rx, router), (ctx_tx, dealer) = _raw_sockets()
    flow = Flow(window_for(nbytes))

    async def receive():
        while True:
            parts = await router.recv_multipart(copy=False)
            if len(parts[-1]) != nbytes:
                raise AssertionError("payload size changed in transit")
            flow.got()

    async def send_one(i: int):
        await dealer.send_multipart([HEADER, payload], copy=False)

    rx = asyncio.create_task(receive(), name="bench-raw-receive")
    try:
        n, secs = await _drive(send_one, flow, max_msgs, max_s)
    finally:
        rx.cancel()
        await asyncio.gather(rx, return_exceptions=True)
        for sock in (router, dealer):
            sock.close(linger=0)
        ctx_rx.term()
        ctx_tx.term()
    return {
        "messages": n,
        "seconds": secs,
        "wire_bytes_per_msg": len(HEADER) + nbytes,
        "send_failures": 0,
    }


# --------------------------------------------------------------------------- two processes
# The receiver runs in a child process and returns credits (one small message per
# CREDIT_EVERY received) on a second DEALER -> ROUTER pair, so the sender's window
# still bounds what is in flight.

CREDIT_EVERY = 8


def _child(kind: str, nbytes: int, conn) -> None:
    run, _ = runner()
    run(_child_main(kind, nbytes, conn))


async def _child_main(kind: str, nbytes: int, conn) -> None:
    import zmq
    import zmq.asyncio

    from hfl.protocol import decode

    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.MAXMSGSIZE, 256 * 2**20)
    router.bind("tcp://127.0.0.1:0")
    conn.send(router.getsockopt(zmq.LAST_ENDPOINT).decode())
    credit = ctx.socket(zmq.DEALER)
    credit.setsockopt(zmq.LINGER, 0)
    credit.setsockopt(zmq.IDENTITY, b"rx")
    credit.connect(conn.recv())
    pending = 0
    while True:
        parts = await router.recv_multipart(copy=False)
        if len(parts) == 2 and parts[1].bytes == b"stop":
            break
        if kind == "hfl":
            msg = decode([p.buffer for p in parts[1:]])
            ok = msg.tensors["w"].nbytes == nbytes
        else:
            ok = len(parts[-1]) == nbytes
        if not ok:
            raise AssertionError("payload size changed in transit")
        pending += 1
        if pending >= CREDIT_EVERY:
            await credit.send(pending.to_bytes(4, "little"))
            pending = 0
        elif not router.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # idle: hand back what we have at once
            await credit.send(pending.to_bytes(4, "little"))
            pending = 0
    credit.close(linger=0)
    router.close(linger=0)
    ctx.term()


async def two_processes(kind: str, nbytes: int, max_msgs: int, max_s: float) -> dict:
    import zmq
    import zmq.asyncio

    from hfl.peer.transport import ZmqTransport
    from hfl.protocol import Knowledge, encode

    ctx = zmq.asyncio.Context()
    credit_rx = ctx.socket(zmq.ROUTER)
    credit_rx.setsockopt(zmq.LINGER, 0)
    credit_rx.bind("tcp://127.0.0.1:0")
    parent, child_conn = mp.Pipe()
    child = mp.get_context("spawn").Process(
        target=_child, args=(kind, nbytes, child_conn), daemon=True
    )
    child.start()
    address = await asyncio.to_thread(parent.recv)
    parent.send(credit_rx.getsockopt(zmq.LAST_ENDPOINT).decode())
    arr = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    flow = Flow(window_for(nbytes))

    async def credits():
        while True:
            _, n = await credit_rx.recv_multipart()
            flow.got(int.from_bytes(n, "little"))

    if kind == "hfl":
        tx = ZmqTransport("a", "tcp://127.0.0.1:0")
        await tx.start()

        async def send_one(i: int):
            frames = encode(
                Knowledge(sender="a", incarnation=0, round=i, kind="weights", tensors={"w": arr})
            )
            while not await tx.send(address, frames, timeout_s=5.0):
                pass

        async def stop():
            await tx.send(address, [b"stop"], timeout_s=5.0)
            await tx.close()
    else:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IDENTITY, b"a")
        dealer.connect(address)
        payload = memoryview(arr.view(np.uint8))

        async def send_one(i: int):
            await dealer.send_multipart([HEADER, payload], copy=False)

        async def stop():
            await dealer.send(b"stop")
            dealer.close(linger=0)

    task = asyncio.create_task(credits(), name="bench-credits")
    try:
        n, secs = await _drive(send_one, flow, max_msgs, max_s)
        await stop()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(child.join, 10)
        if child.is_alive():
            child.kill()
        credit_rx.close(linger=0)
        ctx.term()
    return {"messages": n, "seconds": secs, "send_failures": 0}


# --------------------------------------------------------------------------- main


def measure(kind: str, nbytes: int, max_msgs: int, max_s: float, processes: int) -> dict:
    run, _ = runner()
    if processes == 2:
        coro = two_processes(kind, nbytes, max_msgs, max_s)
    else:
        coro = (hfl_one_process if kind == "hfl" else raw_one_process)(nbytes, max_msgs, max_s)
    res = run(asyncio.wait_for(coro, timeout=max_s + MEASURE_GRACE_S))  # nothing may hang
    res["msgs_per_s"] = res["messages"] / res["seconds"]
    res["payload_mb_per_s"] = res["msgs_per_s"] * nbytes / 1e6
    return res


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__)
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="time cap per size and path (default 2; --quick 0.5)",
    )
    p.add_argument(
        "--processes",
        type=int,
        choices=(1, 2, 12),
        default=1,
        help="1: sender and receiver in one process (default); 2: receiver in a child process; "
        "12: both, side by side",
    )
    args = p.parse_args(argv)
    max_s = args.seconds or (0.5 if args.quick else 2.0)
    modes = [1, 2] if args.processes == 12 else [args.processes]
    _, loop_name = runner()
    print(
        f"throughput: loopback TCP, {loop_name} event loop, <= {max_s:g}s or N messages per size and path, "
        f"{'sender and receiver in one process' if modes == [1] else 'process layouts ' + str(modes)}"
    )
    results = []
    for procs in modes:
        for i, (label, nbytes, max_msgs) in enumerate(SIZES):
            cap = max_msgs if not args.quick else max(20, max_msgs // 4)
            busy = c.Contention()
            # the two paths alternate which goes first from size to size (hfl always
            # first gave raw a warmer machine and socket buffers: a review)
            paths = ("hfl", "raw") if i % 2 == 0 else ("raw", "hfl")
            got = {path: measure(path, nbytes, cap, max_s, procs) for path in paths}
            hfl, raw = got["hfl"], got["raw"]
            contention = busy.stop()
            results.append(
                {
                    "size": label,
                    "payload_bytes": nbytes,
                    "processes": procs,
                    "hfl": hfl,
                    "raw": raw,
                    "ratio_msgs_per_s": c.ratio(hfl["msgs_per_s"], raw["msgs_per_s"]),
                    "contention": contention,
                }
            )
            print(
                f"  {procs} proc {label:>9}: hfl {hfl['msgs_per_s']:10.0f} msg/s  raw {raw['msgs_per_s']:10.0f} "
                f"msg/s",
                flush=True,
            )
    rows = []
    for r in results:
        h, w = r["hfl"], r["raw"]
        rows.append(
            [
                r["size"],
                *([r["processes"]] if len(modes) > 1 else []),
                h["messages"],
                h["msgs_per_s"],
                h["payload_mb_per_s"],
                w["messages"],
                w["msgs_per_s"],
                w["payload_mb_per_s"],
                c.fmt(r["ratio_msgs_per_s"], "{:.3f}x"),
                h.get("wire_bytes_per_msg", ""),
                c.fmt(c.others_share(r["contention"]), "{:.0%}"),
            ]
        )
    header = [
        "payload",
        *(["procs"] if len(modes) > 1 else []),
        "hfl msgs",
        "hfl msg/s",
        "hfl MB/s",
        "raw msgs",
        "raw msg/s",
        "raw MB/s",
        "hfl/raw",
        "hfl wire B/msg",
        "others' CPU",
    ]
    specs = [
        "{}",
        *(["{}"] if len(modes) > 1 else []),
        "{}",
        "{:,.0f}",
        "{:,.1f}",
        "{}",
        "{:,.0f}",
        "{:,.1f}",
        "{}",
        "{}",
        "{}",
    ]
    print()
    print(c.table(header, rows, specs))
    print(
        "\nMB/s counts tensor payload bytes only (1 MB = 1e6 B); hfl/raw is the ratio of msg/s (= of MB/s). "
        "hfl wire B/msg: header frame + tensor frame. others' CPU: share of the machine used by other "
        "processes while that row was measured."
    )
    c.write_json(
        c.out_path("throughput", args.out),
        {
            "benchmark": "throughput",
            "quick": args.quick,
            "seconds_cap": max_s,
            "event_loop": loop_name,
            "processes": modes,
            "window_bytes": WINDOW_BYTES,
            "window_msgs": WINDOW_MSGS,
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
