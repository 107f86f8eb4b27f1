"""Transports: how encoded frames move between peers.

A transport sends a list of frames to an address and yields ``(sender_id,
frames)`` pairs on receipt, where ``sender_id`` is the identity the *transport*
vouches for, not what the message header claims: with CURVE (the default for
ZeroMQ, see ``hfl.peer.security``) the peer id whose allow-listed key
authenticated the connection; with ``security: none`` only the ZeroMQ routing
id, which any sender can choose. The peer compares it with the header and drops
a message whose header lies.

The address scheme picks the backend (:func:`make_transport`):

- ``tcp://host:port`` / ``ipc://path`` -> :class:`ZmqTransport`
- ``mem://name`` -> :class:`InMemoryTransport` (one process, used by tests)

:class:`FaultyTransport` wraps either and injects seeded faults (drop, delay,
duplicate, reorder, partition) on the send path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import os
import random
import signal
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Frames = Sequence[bytes | memoryview]


@dataclass
class TransportStats:
    messages_sent: int = 0
    messages_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    send_failures: int = 0  # destination unreachable, queue full or send timeout


def frames_nbytes(frames: Frames) -> int:
    return sum(memoryview(f).nbytes for f in frames)


@dataclass(frozen=True)
class TransportOptions:
    """Deliberate socket settings (see PROTOCOL.md, "Transport")."""

    max_message_bytes: int = 256 * 2**20  # ZMQ_MAXMSGSIZE: larger inbound parts drop the link
    send_hwm: int = 1000  # messages queued per destination before sends fail
    # Messages read ahead from one connection and not yet taken, at most: ZeroMQ then
    # stops reading that connection, and the rest waits in the sender's queue (its
    # send_hwm). A count, not bytes: with 10,000 a member's large messages, sent
    # faster than we handled them, piled up here (4 GB in 7 s from one sender).
    recv_hwm: int = 16
    reconnect_ivl_ms: int = 100  # first reconnect attempt after a dropped link...
    reconnect_ivl_max_ms: int = 2000  # ...then exponential backoff up to this
    # A link to a member the node holds dead (Transport.given_up) that we sent on, whose
    # peer we heard nothing from (on any link) for link_timeout_ms since it connected, is
    # closed, and the next send dials it afresh (hfl-peer: twice dead_after_s, after
    # silence's own verdict; 0: never); a dial gives up after connect_timeout_ms
    # and tries again. Without it a link cut by a partition (no reset reaches anyone)
    # stayed up on TCP's backed-off retransmissions, and traffic came back up to the
    # partition's length after the heal (an attack review, network namespaces: 46.6 s
    # after a 60 s cut). Not libzmq's own link heartbeats (ZMQ_HEARTBEAT_IVL), which did
    # this before: libzmq 4.3.5 aborts the process on them (stream_engine_base.cpp:310,
    # "!_io_error"; libzmq issues 3937, 4364, 4767, open) as a long partition heals:
    # every peer of a cohort, after cuts of 20 s and more (a review, network namespaces).
    link_timeout_ms: int = 10000
    connect_timeout_ms: int = 3000
    linger_ms: int = 0  # never block process exit on unsent messages...
    goodbye_linger_ms: int = 250  # ...but what close() finds queued gets this long to go
    # Bytes of large messages (a frame of 64 KiB or more) queued for one link and not
    # yet written to its connection, at most: max(this, 4 x the largest message sent so
    # far). Beyond it a send to that link is as on a full queue: it waits up to its
    # timeout, then fails (where frames are copied, _zero_copy, no bound). send_hwm counts
    # messages: a member that kept its link open and never read held 1,000 of them in
    # every peer (320-400 MB a minute a peer with 1.3 MB knowledge, an attack review).
    min_queued_bytes: int = 64 * 2**20
    redial_min_s: float = 0.25  # a link refused by its peer is dialled again after this...
    redial_max_s: float = 2.0  # ...doubling (with jitter) up to this, until admitted
    inbox_size: int = 10000  # in-memory transport: bounded receive queue


class Transport(ABC):
    """Point-to-point, message-oriented, unreliable: a send may be lost."""

    def __init__(self, peer_id: str, address: str):
        self.peer_id = peer_id
        self.address = address
        self.stats = TransportStats()

    @abstractmethod
    async def start(self) -> None:
        """Bind the listening address. ``self.address`` is final afterwards."""

    @abstractmethod
    async def send(self, address: str, frames: Frames, timeout_s: float,
                   peer_id: str | None = None) -> bool:
        """Queue ``frames`` for ``address``; False if it could not within ``timeout_s``.

        ``peer_id`` names who is meant to be at ``address``: an authenticated
        transport connects only if that peer proves it holds its key."""

    def send_now(self, address: str, frames: Frames, peer_id: str | None = None) -> bool | None:
        """:meth:`send` without waiting, where the transport can: True (sent) or False
        (failed, counted), or None when it would have to wait (the caller then awaits
        :meth:`send`). Lets the node send to many peers without a task for each. The
        default: None, always wait."""
        return None

    @abstractmethod
    async def recv(self) -> tuple[str, list[memoryview]]:
        """Wait for the next message: (transport-vouched sender id, frames)."""

    def recv_nowait(self) -> tuple[str, list[memoryview]] | None:
        """The next message if one is waiting, else None, without waiting (a transport
        that cannot tell says None: the node then takes one message at a time)."""
        return None

    async def forget(self, address: str, peer_id: str | None = None) -> None:  # noqa: B027
        """Drop any connection state kept for ``address`` (a peer that left); with
        ``peer_id``, only the link that authenticates that peer (another member's link
        to the same address stays)."""

    def dial_failure(self, address: str) -> str | None:
        """Why our last attempt to connect to ``address`` was refused (the cause as
        logged, e.g. our key is not on its allow-list), or None if nothing refused it."""
        return None

    def take_allow_list_change(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """(the peers now allowed, the peers removed) when the allow-list was reloaded
        since the last call (see ZmqTransport), else None."""
        return None

    #: Called as ``on_link(address, peer_id, up)`` when one of our outgoing links drops
    #: (``up`` False: the connection to a peer we sent to ended, as when its process
    #: dies: a hint, never proof) or is made again (True), counting only connections
    #: whose handshake completed (ZeroMQ's, CURVE's where on). ``peer_id`` is the peer the
    #: link authenticates (None without security). Set by the node; None: not reported.
    on_link: Callable[[str, str | None, bool], None] | None = None
    #: Called as ``given_up(peer_id)``: whether the node holds that member dead by its own
    #: evidence, so that a silent link to it may be closed and dialled afresh
    #: (ZmqTransport._close_silent_links). Set by the node; None: no link is closed.
    given_up: Callable[[str], bool] | None = None

    def housekeeping(self) -> None:  # noqa: B027 - optional hook
        """Periodic chores (the node calls it every heartbeat): e.g. report the
        refused connections counted over the last minute."""

    @abstractmethod
    async def close(self) -> None: ...


# --------------------------------------------------------------------------- ZeroMQ


def _stop_monitor(sock, monitor) -> None:
    """Stop ``sock``'s monitor, then close the socket that reads it (that order).

    libzmq's I/O thread hands each monitored event to the monitor's PAIR socket with a
    blocking send: with the reading end closed while ``sock`` still monitored, the next
    event (the DISCONNECTED of a member that had just said goodbye) blocked the I/O
    thread, and with it every link of the process. Every peer of a cohort stopped
    hearing the others for seconds after a member left, until they declared each other
    dead (an attack review, real processes: 6 of 9 runs; tests/test_transport.py).
    A closed ``sock`` is left as it is: _close_dealer stops its monitor before it closes
    it (libzmq stops a closed socket's monitor only when its reaper destroys it)."""
    if sock is not None and not sock.closed:
        sock.disable_monitor()
    monitor.close(linger=0)


class ZmqTransport(Transport):
    """One ROUTER socket bound at our address; one DEALER per destination.

    With ``security`` (a :class:`~hfl.peer.security.CurveIdentity`) every socket
    runs CURVE: the ROUTER is a CURVE server whose ZAP handler admits only
    allow-listed keys and labels each connection with the key's peer id (the
    message's ``User-Id``, which is what :meth:`recv` vouches for); each DEALER
    dials with the destination peer's public key as server key, so only that
    peer can complete the handshake. Routing ids then carry no meaning and
    ``ROUTER_HANDOVER`` is off: no connection can take over another's.

    Without security (``security: none``) each DEALER carries our peer id as
    its routing id and that is the identity headers are checked against;
    ``ROUTER_HANDOVER`` lets a peer that restarts under the same id take over
    its old, half-dead connection. Anyone who can reach the port can claim any id.

    ``IMMEDIATE`` on the DEALER means nothing is queued for a peer that is not
    connected (or not yet authenticated), so a send to a dead peer fails fast
    instead of delivering stale knowledge minutes later.

    The allow-list is reread while the peer runs: when its file changes (checked on
    every :meth:`housekeeping`, i.e. every heartbeat tick) or on SIGHUP. A key added
    is admitted at its next handshake; a key removed (or replaced) is cut off at once:
    our links to that peer are closed, nothing more is sent to it, and every message
    still arriving on a connection it made with that key is dropped (each connection
    carries the key it proved, see ``security.user_id``); the node ends its membership
    (:meth:`take_allow_list_change`). A link the other side refused is dialled again
    with backoff (``redial_min_s`` doubling to ``redial_max_s``, with jitter) for as
    long as we send to it, so a peer admitted later joins without a restart.
    """

    def __init__(self, peer_id: str, address: str, options: TransportOptions | None = None,
                 security=None):
        super().__init__(peer_id, address)
        self.options = options or TransportOptions()
        self.security = security  # hfl.peer.security.CurveIdentity, or None: plaintext
        self._auth = None
        self._ctx = None
        self._router = None
        self._closing = False  # close() began: no new link is made from then on
        self._monitor_task: asyncio.Task | None = None
        self.refusals = None  # hfl.peer.security.RefusalLog: handshakes we refused
        self.dial_refusals = None  # ... and handshakes refused to our own links
        self._dial_failures: dict[str, str] = {}  # address -> why it refused us (last cause)
        self._send_errors: set[tuple[str, str]] = set()  # (address, error) already logged
        # Per outgoing link for its life: the task watching its handshakes on its monitor
        # socket, and that socket (closed here too: a task cancelled before it ever ran
        # never reaches its finally, and an open socket blocks the context's term).
        self._dial_monitors: dict[tuple[str, str | None], tuple[asyncio.Task, object]] = {}
        self._router_monitor = None
        self._router_shadow = None  # the ROUTER's blocking shadow: every receive reads it
        self._recv_waiter: asyncio.Future | None = None  # recv() waiting for the descriptor
        # One DEALER per (address, peer it must authenticate as): a member that claims
        # another's address gets a link of its own, never replaces the real one.
        self._dealers: dict[tuple[str, str | None], object] = {}  # -> asyncio DEALER
        self._senders: dict[tuple[str, str | None], object] = {}  # -> its blocking shadow
        # link -> sends waiting for it in send() (a send_now then waits behind them)
        self._waiting: dict[tuple[str, str | None], int] = {}
        # link -> (tracker, bytes) of its large messages ZeroMQ may still hold, oldest
        # first (TransportOptions.min_queued_bytes); the largest message sent so far
        self._queued: dict[tuple[str, str | None], deque] = {}
        self._largest = 0
        self._held_back = False  # the last _put held its message back (that bound)
        # link -> sends held back over its bound, waiting in send(): smaller messages to
        # that link wait behind them instead of overtaking them (a review)
        self._holding: dict[tuple[str, str | None], int] = {}
        self.max_links = 340  # links kept open at most (set from the file limit at start)
        self._connected: set[tuple[str, str | None]] = set()  # links up (monitor events)
        self._evicted, self._evicted_said = 0, float("-inf")  # links closed at the bound
        # Links the other side refused: refusals in a row, and when to dial again.
        self._refused: dict[tuple[str, str | None], int] = {}
        self._redial_at: dict[tuple[str, str | None], float] = {}
        self._jitter = random.Random(f"redial:{peer_id}")
        self._allow_list_stamp = None  # (mtime_ns, size, inode) of the allow-list file
        self._reload_asked = False  # SIGHUP
        self._allow_change: tuple[frozenset[str], frozenset[str]] | None = None
        self._heard: set[str] = set()  # peers a message came from (CURVE: authenticated)
        # Silent links (TransportOptions.link_timeout_ms): when each peer was last heard
        # from, and per link its peer, when it was dialled and when we last sent on it.
        self._heard_at: dict[str, float] = {}
        self._link_peer: dict[tuple[str, str | None], str] = {}
        self._dialled_at: dict[tuple[str, str | None], float] = {}
        self._sent_at: dict[tuple[str, str | None], float] = {}
        self.silent_links_closed = 0

    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        o = self.options
        self._ctx = zmq.asyncio.Context()
        # libzmq's default (1023 sockets) ended a peer's links at about 340 members (a
        # link is a DEALER and its monitor's pair): the file limit decides instead.
        max_sockets, self.max_links = _socket_limits()
        self._ctx.set(zmq.MAX_SOCKETS, max_sockets)
        router = self._ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, o.linger_ms)
        router.setsockopt(zmq.RCVHWM, o.recv_hwm)
        router.setsockopt(zmq.MAXMSGSIZE, o.max_message_bytes)
        if self.security is not None:
            from hfl.peer.security import ZAP_DOMAIN, RefusalLog, make_authenticator

            # The ZAP handler runs before the first bind: no connection is ever
            # admitted without it (fail-closed).
            self.refusals = RefusalLog(self.peer_id)
            # Asks for the allow-list of the moment at every handshake (it is reloaded).
            self._auth = make_authenticator(zmq.Context.shadow(self._ctx.underlying),
                                            lambda: self.security, self.refusals)
            if self.security.allow_list_path:
                self._allow_list_stamp = _file_stamp(self.security.allow_list_path)
                _on_sighup(self)
            router.curve_server = True
            router.curve_publickey = self.security.public_key
            router.curve_secretkey = self.security.secret_key
            router.zap_domain = ZAP_DOMAIN.encode()
            router.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        else:
            router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        router.setsockopt(zmq.IDENTITY, self.peer_id.encode())
        # Handshakes that fail before ZAP is asked (a client with the other security
        # mode, a wrong server key) are only seen by a monitor: log them too. Watched
        # from before the bind, so that no client's first handshake goes unseen.
        from hfl.peer.security import RefusalLog

        if self.refusals is None:
            self.refusals = RefusalLog(self.peer_id)
        self.dial_refusals = RefusalLog(self.peer_id, outgoing=True)
        monitor = self._router_monitor = router.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        self._monitor_task = asyncio.get_running_loop().create_task(
            self._watch_handshakes(monitor), name=f"{self.peer_id}:handshake-monitor")
        try:
            router.bind(self.address)
        except zmq.ZMQError:
            router.close(linger=0)
            await self.close()
            raise
        # A port of 0 asks the OS for a free one; report the real endpoint.
        self.address = router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._router = router

    async def _watch_handshakes(self, monitor) -> None:
        """Failed handshakes on our ROUTER (the other security mode, a wrong server key)
        go to the refusal log; the address is our endpoint (libzmq names no remote)."""
        from zmq.utils.monitor import parse_monitor_message

        from hfl.peer.security import handshake_refusal

        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                kind, detail = handshake_refusal(event["value"], curve=self.security is not None)
                self.refusals.refused(kind, f"a client of {self.address}", detail + self._suspects())
        finally:  # (nothing reads it from now on: the ROUTER stops monitoring first)
            _stop_monitor(self._router, monitor)

    async def _watch_dial(self, key: tuple[str, str | None], sock, monitor, target: str) -> None:
        """Watch one outgoing link's handshakes until one succeeds, so that the connecting
        side learns at once why it is refused (a ZAP refusal of our key, the other
        security mode, a wrong server key) instead of hearing nothing until its join
        timeout. libzmq gives up on a link after a refused handshake: the link is
        closed so that the next send dials afresh (the other side may have fixed its
        allow-list meanwhile)."""
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        from hfl.peer.security import dial_refusal

        address = key[0]
        our_key = self.security.public_key.decode() if self.security is not None else None
        broken = 0  # handshakes broken off in a row: one can be a peer dying mid-handshake
        # Whether this connection completed its handshake: only such a link's drop, and
        # its handshake again, are hints for failure detection (on_link). A TCP-level
        # connect or drop is not the member's: a member gossiped another's address that
        # it listened on, held the connections and cut them as that peer stalled for
        # 1.6 s, which was declared dead; behind a forwarder that accepts and then closes
        # (docker-proxy, ssh -L), each reconnect withdrew the crash hint, and a SIGKILL
        # was seen after dead_after_s, with 10 probes a second meanwhile (a review).
        shook = False
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CONNECTED):
                    # The link dropped (its process died, or the connection broke) or was
                    # made again: a drop of a link that had shaken hands is a hint for
                    # failure detection, never proof of a death.
                    up = event["event"] == zmq.EVENT_CONNECTED
                    if self._dealers.get(key) is sock:  # (not a link closed since)
                        (self._connected.add if up else self._connected.discard)(key)
                        if up:  # (silence counts from here: a link redialled during a
                            # cut was closed again at the heal, before its peer spoke)
                            self._dialled_at[key] = time.monotonic()
                        if not up and shook and self.on_link is not None:
                            self.on_link(address, key[1], False)
                    shook = False
                    continue
                if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    # Watched on: a later reconnection (the other side restarted, or
                    # revoked our key) can be refused too, and libzmq then gives up.
                    self._dial_failures.pop(address, None)
                    self._refused.pop(key, None)
                    broken = 0
                    shook = True
                    if self._dealers.get(key) is sock and self.on_link is not None:
                        self.on_link(address, key[1], True)
                    continue
                kind, detail, final = dial_refusal(event["event"], event["value"],
                                                   curve=self.security is not None,
                                                   our_id=self.peer_id, our_public_key=our_key)
                broken = 0 if final else broken + 1
                if 0 < broken < 3 or (broken and address in self._dial_failures):
                    continue  # keep the cause a refusal named, not its echo on a retry
                self._dial_failures[address] = f"{target} refused our connection: {detail}"
                self.dial_refusals.refused(kind, target, detail)
                if final and self._dealers.get(key) is sock:
                    # Dial afresh at the next send, after a backoff with jitter.
                    n = self._refused[key] = self._refused.get(key, 0) + 1
                    o = self.options
                    wait_s = min(o.redial_max_s, o.redial_min_s * 2 ** (n - 1))
                    self._redial_at[key] = time.monotonic() + wait_s * self._jitter.uniform(0.5, 1.0)
                    self._close_dealer(key, watch=False)
                    return
        finally:
            if self._dial_monitors.get(key, (None,))[0] is asyncio.current_task():
                del self._dial_monitors[key]
            _stop_monitor(sock, monitor)

    def dial_failure(self, address: str) -> str | None:
        return self._dial_failures.get(address)

    def _suspects(self) -> str:
        """Who a refused client most likely is: libzmq names no remote address for a
        handshake that fails before ZAP (the other security mode, a wrong server key),
        but the allow-listed peers never heard from are the candidates."""
        if self.security is None:
            return ""
        silent = sorted(set(self.security.allowed) - self._heard - {self.peer_id})
        if not silent:
            return ""
        shown = ", ".join(silent[:8]) + (f" and {len(silent) - 8} more" if len(silent) > 8 else "")
        return (f"; allow-listed peers never heard from here: {shown} (most likely "
                f"{'it' if len(silent) == 1 else 'one of them'})")

    def housekeeping(self) -> None:
        self._close_silent_links()
        for refusals in (self.refusals, self.dial_refusals):
            if refusals is not None:
                refusals.flush()
        if self.security is not None and self.security.allow_list_path and self._router is not None:
            stamp = _file_stamp(self.security.allow_list_path)
            if stamp != self._allow_list_stamp or self._reload_asked:
                self._allow_list_stamp, self._reload_asked = stamp, False
                self.reload_allow_list()

    def reload_allow_list(self) -> bool:
        """Reread the allow-list file now; True when it changed who is allowed. A file
        that cannot be used (half written, malformed, no longer listing this peer) is
        reported and the list in force stays."""
        from hfl.peer.security import SecurityError, reread_allow_list

        try:
            allowed, signs = reread_allow_list(self.security)
        except SecurityError as exc:
            log.warning("%s: allow-list not reloaded, the one in force stays: %s", self.peer_id, exc)
            return False
        old = self.security.allowed
        added = sorted(p for p, k in allowed.items() if old.get(p) != k)
        cut = {p for p, k in old.items() if allowed.get(p) != k}  # removed, or given a new key
        if not added and not cut:
            return False
        self.security = dataclasses.replace(self.security, allowed=allowed, sign_keys=signs)
        for key in [k for k in self._dealers if k[1] in cut]:
            self._close_dealer(key)
        removed = frozenset(p for p in cut if p not in allowed)
        earlier = self._allow_change[1] if self._allow_change else frozenset()
        self._allow_change = (frozenset(allowed), (earlier | removed) - set(allowed))
        log.warning("%s: allow-list %s reloaded: %s", self.peer_id, self.security.allow_list_path,
                    "; ".join(part for part in (
                        "admitted " + ", ".join(p for p in added if p not in old) if any(
                            p not in old for p in added) else "",
                        "new key for " + ", ".join(p for p in added if p in old) if any(
                            p in old for p in added) else "",
                        "removed " + ", ".join(sorted(removed)) + " (links closed, its "
                        "messages dropped)" if removed else "") if part))
        return True

    def take_allow_list_change(self) -> tuple[frozenset[str], frozenset[str]] | None:
        change, self._allow_change = self._allow_change, None
        return change

    def _key(self, address: str, peer_id: str | None) -> tuple[str, str | None]:
        return (address, peer_id if self.security is not None else None)

    def _dealer(self, address: str, peer_id: str | None):
        import zmq

        key = self._key(address, peer_id)
        sock = self._dealers.pop(key, None)
        if sock is not None:
            self._dealers[key] = sock  # (the most recently used last: _evict_link)
            if peer_id and self.security is None:
                # (plaintext: one link per address, whoever listens there now; labelled
                # with a dead member's id, a live peer's link was closed as silent)
                self._link_peer[key] = peer_id
        if sock is None and self._redial_at.get(key, 0.0) > time.monotonic():
            raise zmq.Again()  # refused a moment ago: dial again after the backoff
        if sock is None:
            o = self.options
            server_key = None
            if self.security is not None:
                server_key = self.security.allowed.get(peer_id) if peer_id else None
                if server_key is None:
                    raise zmq.ZMQError(
                        zmq.EINVAL, f"no allow-listed public key for {peer_id or 'an unnamed peer'}"
                    )
            sock = self._ctx.socket(zmq.DEALER)
            try:
                if server_key is not None:
                    sock.curve_publickey = self.security.public_key
                    sock.curve_secretkey = self.security.secret_key
                    sock.curve_serverkey = server_key
                else:
                    sock.setsockopt(zmq.IDENTITY, self.peer_id.encode())
                sock.setsockopt(zmq.LINGER, o.linger_ms)
                sock.setsockopt(zmq.SNDHWM, o.send_hwm)
                sock.setsockopt(zmq.IMMEDIATE, 1)
                sock.setsockopt(zmq.RECONNECT_IVL, o.reconnect_ivl_ms)
                sock.setsockopt(zmq.RECONNECT_IVL_MAX, o.reconnect_ivl_max_ms)
                sock.setsockopt(zmq.CONNECT_TIMEOUT, o.connect_timeout_ms)
                # The monitor is attached before connecting: libzmq reports a refused
                # handshake once and then gives the link up, so an event fired between
                # connect() and the monitor's start (the I/O thread runs on while this
                # thread is descheduled) would leave the link silent for good.
                monitor = sock.get_monitor_socket(
                    zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED)
            except zmq.ZMQError:  # (out of sockets, say): no half-made link kept
                sock.close(linger=0)
                raise
            try:
                sock.connect(address)
            except zmq.ZMQError:  # a malformed address (possibly gossiped): no socket kept
                _stop_monitor(sock, monitor)
                sock.close(linger=0)
                raise
            if len(self._dealers) >= self.max_links:  # (once this one is made)
                self._evict_link()
            self._dealers[key] = sock
            self._senders[key] = zmq.Socket.shadow(sock.underlying)
            self._dialled_at[key] = time.monotonic()
            if peer_id:
                self._link_peer[key] = peer_id
            target = f"{peer_id}@{address}" if peer_id else address
            watcher = asyncio.get_running_loop().create_task(
                self._watch_dial(key, sock, monitor, target), name=f"{self.peer_id}:dial:{target}")
            self._dial_monitors[key] = (watcher, monitor)
        return sock, self._senders[key]

    def send_now(self, address: str, frames: Frames, peer_id: str | None = None) -> bool | None:
        """Hand ``frames`` to the link's queue if it takes them at once (most sends): True,
        or False for a failure (counted; logged once per address and cause); None when
        the queue is full or the link not up yet (:meth:`send` then polls). No task, no
        future: a broadcast's sends are made in place."""
        if self._closing:
            # A send after close() began (a probe of a member whose link just dropped, as
            # peers finish together) must not open a link: close() has closed the others
            # and its context would wait for this one forever.
            return False
        if self._router is None:
            raise RuntimeError("transport not started")
        import zmq

        try:
            _, sender = self._dealer(address, peer_id)
        except zmq.Again:  # refused a moment ago: no link until the backoff ends
            self.stats.send_failures += 1
            return False
        except zmq.ZMQError as exc:
            return self._failed(address, exc)
        if self._waiting.get(self._key(address, peer_id)):
            # Behind a send that waits for this link: in order, and no send on the shadow
            # while pyzmq polls the socket (it would take the descriptor's edge that
            # wakes that poll, which then slept its whole timeout).
            return None
        return self._put(sender, address, frames, when_full=None,
                         key=self._key(address, peer_id))

    def _put(self, sender, address: str, frames: Frames, when_full: bool | None,
             key: tuple[str, str | None]) -> bool | None:
        """Hand ``frames`` to a link's queue without waiting: True (sent), False (failed),
        both counted, or ``when_full`` if the queue does not take them now (False: a
        failure, counted). A large message beyond the link's byte bound is as if the
        queue were full (:meth:`_over_bound`; :meth:`send` then waits for it to drain)."""
        import zmq

        nbytes = frames_nbytes(frames)
        large = nbytes >= LARGE_MESSAGE_BYTES and _zero_copy()
        self._held_back = (self._over_bound(key, address, nbytes) if large
                           else self._holding.get(key, 0) > 0)
        if self._held_back:
            self.stats.send_failures += when_full is False
            return when_full
        try:
            tracker = _send_parts(sender, frames, track=large)
        except zmq.Again:
            self.stats.send_failures += when_full is False
            return when_full
        except zmq.ZMQError as exc:
            return self._failed(address, exc)
        if tracker is not None:
            self._queued.setdefault(key, deque()).append((tracker, nbytes))
            self._largest = max(self._largest, nbytes)
        self._sent_at[key] = time.monotonic()
        self.stats.messages_sent += 1
        self.stats.bytes_sent += nbytes
        return True

    def _over_bound(self, key: tuple[str, str | None], address: str, nbytes: int) -> bool:
        """Whether a large message of ``nbytes`` would take the link's queue past its
        bound in bytes (TransportOptions.min_queued_bytes): what it queued before and
        ZeroMQ has not written to the connection yet (its trackers not done), plus this.
        Said once each time the link's queue goes over, not again until it has drained."""
        queued = self._queued.get(key)
        if not queued:
            return False
        while queued and queued[0][0].done:
            queued.popleft()
        held = sum(n for tracker, n in queued if not tracker.done)
        bound = max(self.options.min_queued_bytes, 4 * max(self._largest, nbytes))
        if held + nbytes <= bound:
            if not queued:  # drained: a later stall is said again
                del self._queued[key]
                self._send_errors.discard((address, "queue"))
            return False
        if (address, "queue") not in self._send_errors and len(self._send_errors) < 1024:
            self._send_errors.add((address, "queue"))
            log.warning("%s: %d MiB of messages queued for %s are not written yet (it does "
                        "not read, or reads slowly): sends of large messages to it wait, "
                        "and fail after their timeout, until they are (said again only "
                        "after its queue drained)", self.peer_id,
                        held >> 20, address)
        return True

    def _failed(self, address: str, exc: Exception) -> bool:
        # Once per address and cause (e.g. a gossiped peer with no allow-list key, tried
        # again every tick), then only counted in the stats.
        if (address, str(exc)) not in self._send_errors and len(self._send_errors) < 1024:
            self._send_errors.add((address, str(exc)))
            log.warning("send to %s failed: %s (not repeated for this address)", address, exc)
        self.stats.send_failures += 1
        return False

    async def send(self, address: str, frames: Frames, timeout_s: float,
                   peer_id: str | None = None) -> bool:
        """:meth:`send_now`, then, if the link's queue is full or not connected yet, a wait
        of up to ``timeout_s`` for it to take the message. (The asyncio socket's own
        send_multipart would report EAGAIN only through its future, or, when other sends
        are polling the same socket, queue this send with no timeout at all.)"""
        import zmq

        sent = self.send_now(address, frames, peer_id)
        if sent is not None:
            return sent
        key = self._key(address, peer_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._waiting[key] = self._waiting.get(key, 0) + 1
        holding = False  # this send is held back over the link's bound (_holding)
        try:
            while True:
                sock, sender = self._dealer(address, peer_id)  # (send_now made it)
                left_ms = max(0, int((deadline - loop.time()) * 1000))
                ready = await sock.poll(left_ms, zmq.POLLOUT)
                if sock.closed or self._senders.get(key) is not sender:
                    # closed (forget, a reload, close) between the poll's end and this
                    # resume: its shadow must not be sent on (libzmq may have freed it)
                    self.stats.send_failures += 1
                    return False
                if not ready & zmq.POLLOUT:
                    self.stats.send_failures += 1
                    return False
                sent = self._put(sender, address, frames,
                                 when_full=None if loop.time() < deadline else False, key=key)
                if sent is not None:
                    break
                if self._held_back:
                    # Writable, but over its bound in bytes (_over_bound), or behind a send
                    # that is: ZeroMQ says nothing when it writes, so look again a moment
                    # later (and not on a link closed meanwhile: a review).
                    if not holding and frames_nbytes(frames) >= LARGE_MESSAGE_BYTES:
                        holding = True
                        self._holding[key] = self._holding.get(key, 0) + 1
                    await asyncio.sleep(min(0.02, max(0.0, deadline - loop.time())))
                    if self._closing or self._senders.get(key) is not sender:
                        self.stats.send_failures += 1
                        return False
                # (another waiter's message took the room: wait again, for the time left)
        except asyncio.CancelledError:
            # forget() closed this socket under us (its peer said goodbye): a failed
            # send, not a cancellation of the caller.
            if sock.closed and not asyncio.current_task().cancelling():
                self.stats.send_failures += 1
                return False
            raise
        except zmq.ZMQError as exc:
            return self._failed(address, exc)
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]
            if holding:
                self._holding[key] -= 1
                if not self._holding[key]:
                    del self._holding[key]
        if self._waiting.get(key):
            # Other sends wait for this link: our send on the shadow may have taken the
            # edge that would wake their poll. Reading EVENTS on the asyncio socket makes
            # pyzmq look again.
            sock.get(zmq.EVENTS)
        return sent

    async def recv(self) -> tuple[str, list[memoryview]]:
        """The next message. Read from the ROUTER's blocking shadow (:meth:`recv_nowait`),
        waiting for its file descriptor in between: pyzmq's asyncio ``recv_multipart``
        made a future, registered and unregistered the reader and built flag enums for
        every message (a FedH2L peer's profiled event loop: 10 % less CPU without it,
        docs/runtime.md)."""
        while True:
            got = self.recv_nowait()
            if got is not None:
                return got
            if self._router is None:
                raise RuntimeError(f"{self.peer_id}: transport closed")
            if not await self._readable():
                # EVENTS said a message waits, and none could be read: never spin on it
                await asyncio.sleep(0)

    async def _readable(self) -> bool:
        """Until a message may wait on the ROUTER; whether it had to wait. ZeroMQ's
        descriptor is edge-triggered: it says that the socket's state may have changed
        (libzmq's own commands signal it too), and reading ``EVENTS`` re-arms it. So
        EVENTS is read after the reader is in place (a message that came since our last
        read is not missed) and after each wake-up (a wake-up that brought no message
        waits again). One reader at a time (the node's receive loop)."""
        if self._recv_waiter is not None:
            raise RuntimeError(f"{self.peer_id}: recv() is already waiting (one reader at a time)")
        loop, sock, z = asyncio.get_running_loop(), self._router_shadow, _zmq_ints()
        fd, waited = sock.get(z["FD"]), False
        while True:
            self._recv_waiter = waiter = loop.create_future()
            loop.add_reader(fd, _wake, waiter)
            try:
                if sock.get(z["EVENTS"]) & z["POLLIN"]:
                    return waited
                await waiter
                waited = True
            finally:
                self._recv_waiter = None
                if self._router is not None:  # close() removed it already
                    loop.remove_reader(fd)
            if self._router is None:  # closed between the wake-up and now
                raise RuntimeError(f"{self.peer_id}: transport closed")

    def recv_nowait(self) -> tuple[str, list[memoryview]] | None:
        import zmq

        if self._router is None:
            return None
        if self._router_shadow is None:
            self._router_shadow = zmq.Socket.shadow(self._router.underlying)
        # Plain ints, and EVENTS asked before each read: pyzmq's flag enums and the
        # zmq.Again raised at the end of every drain cost more than the read itself.
        z = _zmq_ints()
        sock, events, pollin, noblock = self._router_shadow, z["EVENTS"], z["POLLIN"], z["NOBLOCK"]
        dropped = 0
        while sock.get(events) & pollin:
            try:
                parts = [sock.recv(noblock, copy=False)]
                while parts[-1].more:  # a message's parts arrive together
                    parts.append(sock.recv(noblock, copy=False))
            except zmq.Again:
                return None
            got = self._deliver(parts)
            if got is not None:
                return got
            dropped += 1
            if dropped >= self.DROPS_PER_READ:  # a flood of them: the others' turn (recv)
                return None
        return None

    #: Messages dropped by one :meth:`recv_nowait` at most (a revoked key's flood) before
    #: it gives way: recv() then lets the event loop run before it reads again.
    DROPS_PER_READ = 256

    def _deliver(self, parts) -> tuple[str, list[memoryview]] | None:
        """(sender id, frames) of a received message, or None for one not to deliver."""
        if len(parts) < 2:  # an identity frame alone: nothing to deliver
            return None
        if self.security is not None:
            from hfl.peer.security import split_user_id

            # The peer id and key that authenticated this connection (ZAP User-Id).
            identity, key = split_user_id(parts[1].get("User-Id") or "")
            if not identity:  # cannot happen past the ZAP handler; never trust it
                return None
            if self.security.allowed.get(identity) != key:
                self.refusals.refused(
                    "revoked_key", identity, "a message on a connection made with a key "
                    "removed from the allow-list since: dropped")
                return None
            self._heard.add(identity)
        else:
            identity = parts[0].bytes.decode("utf-8", errors="replace")
        if identity in self._heard_at or len(self._heard_at) < MAX_HEARD:
            self._heard_at[identity] = time.monotonic()
        frames = [p.buffer for p in parts[1:]]
        self.stats.messages_received += 1
        self.stats.bytes_received += frames_nbytes(frames)
        return identity, frames

    def _evict_link(self) -> None:
        """At :attr:`max_links`: close a link no send waits for, the least recently used
        of those not connected (nothing is queued on them: IMMEDIATE), else the least
        recently used (what its queue still held is lost); its next send dials again.
        Replies go to the address a hello claims: without a bound, a few hundred hellos
        naming distinct addresses took every socket, and no member could be dialled."""
        idle = [k for k in self._dealers if not self._waiting.get(k)]
        key = next((k for k in idle if k not in self._connected), idle[0] if idle else None)
        if key is None:
            return  # every link has a send waiting: libzmq's own limit then says no
        self._evicted += 1
        now = time.monotonic()
        if now - self._evicted_said >= 60.0:
            self._evicted_said = now
            log.warning("%s: %d link(s) open, the most this peer keeps (max_links): closed "
                        "the least recently used idle one (%d so far)", self.peer_id,
                        len(self._dealers), self._evicted)
        self._close_dealer(key)

    def _close_dealers(self, address: str | None = None, peer_id: str | None = None,
                       linger_ms: int = 0) -> None:
        """Close the links to ``address`` (every link when None), only ``peer_id``'s if given."""
        for key in [k for k in self._dealers if (address is None or k[0] == address)
                    and (peer_id is None or k[1] == peer_id)]:
            self._close_dealer(key, linger_ms=linger_ms)

    def _close_dealer(self, key: tuple[str, str | None], watch: bool = True,
                      linger_ms: int = 0) -> None:
        watching = self._dial_monitors.pop(key, None)
        sock = self._dealers.pop(key)
        if watch and watching is not None:
            watcher, monitor = watching
            watcher.cancel()
            _stop_monitor(sock, monitor)
        elif watching is not None and not sock.closed:
            # (from the watcher itself, which closes the monitor's reader after: the
            # monitor stops before the socket closes, libzmq's teardown events included)
            sock.disable_monitor()
        self._senders.pop(key, None)
        self._connected.discard(key)
        self._queued.pop(key, None)
        for kept in (self._link_peer, self._dialled_at, self._sent_at):
            kept.pop(key, None)
        sock.close(linger=linger_ms)

    def _close_silent_links(self) -> None:
        """Close each link up to a member the node holds dead (:attr:`given_up`) that we
        sent on since it was last heard from (or the link dialled), when that was
        link_timeout_ms ago: its connection is held by TCP's backed-off retransmissions
        (a partition), and a new dial reaches the peer as soon as the network does. Only
        a dead member's: with swim a live member may say nothing to us for longer than
        that (a knowledge upload to an aggregator that answers nobody directly), and its
        link was closed with what it still queued (a review: 4,739 closes in a calm
        100-peer run). Not a link a send waits on (that send times out first)."""
        timeout = self.options.link_timeout_ms / 1000
        given_up = self.given_up
        if timeout <= 0 or given_up is None:
            return
        now = time.monotonic()
        for key in [k for k in self._connected if not self._waiting.get(k)]:
            peer = self._link_peer.get(key)
            if peer is None or not given_up(peer):
                continue
            since = max(self._heard_at.get(peer, -math.inf), self._dialled_at.get(key, -math.inf))
            if self._sent_at.get(key, -math.inf) > since and now - since > timeout:
                log.info("%s: link to %s@%s silent for %.1fs while we sent: closed, dialled "
                         "afresh at the next send", self.peer_id, peer, key[0], now - since)
                self.silent_links_closed += 1
                self._close_dealer(key)

    async def forget(self, address: str, peer_id: str | None = None) -> None:
        self._close_dealers(address, peer_id if self.security is not None else None)

    async def close(self) -> None:
        self._closing = True
        _on_sighup(self, stop=True)
        watchers = [watcher for watcher, _ in self._dial_monitors.values()]
        # What is queued on a link up (a goodbye, sent just before) gets this long to go
        # out: closed at once, it was lost when libzmq had not written it yet, and the
        # member took the peer's exit for a crash that may come back (a fresh-clone CI
        # run, Ctrl-C: its next round waited 15 s for it). Links down queue nothing.
        self._close_dealers(linger_ms=self.options.goodbye_linger_ms)
        await asyncio.gather(*watchers, return_exceptions=True)
        if self._monitor_task is not None:
            self._monitor_task.cancel()
            await asyncio.gather(self._monitor_task, return_exceptions=True)
            self._monitor_task = None
        if self._router_monitor is not None:
            _stop_monitor(self._router, self._router_monitor)
            self._router_monitor = None
        for refusals in (self.refusals, self.dial_refusals):
            if refusals is not None:
                refusals.flush(float("inf"))  # what was counted but not yet reported
        if self._router is not None:
            waiter = self._recv_waiter
            if waiter is not None:  # a recv() waiting on the descriptor about to close
                asyncio.get_running_loop().remove_reader(self._router_shadow.get(_zmq_ints()["FD"]))
                if not waiter.done():
                    waiter.set_exception(RuntimeError(f"{self.peer_id}: transport closed"))
            self._router.close(linger=0)
            self._router = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            # destroy, not term: term() blocks until every socket of the context is closed,
            # so one left open (however it came about) would hang the process at exit.
            self._ctx.destroy(linger=0)
            self._ctx = None


def _socket_limits() -> tuple[int, int]:
    """(ZeroMQ sockets the context may open, links kept open at most), from the process's
    soft limit on open files: a link holds three descriptors on our side (a DEALER and
    its monitor's pair) plus its connection, and a member dialling us one more on the
    ROUTER, so about five per member. libzmq's default of 1,023 sockets is the floor of
    the first (a library default, not a promise that the files are there)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 16
    except (ImportError, OSError, ValueError):
        soft = 1024
    sockets = max(1023, min(soft // 2, 1 << 15))
    return sockets, max(16, min((soft - 128) // 5, (sockets - 64) // 3))


@functools.cache
def _zmq_ints() -> dict[str, int]:
    """ZeroMQ's constants as plain ints (pyzmq's are enums: an & or | builds a member)."""
    import zmq

    return {name: int(getattr(zmq, name)) for name in ("FD", "EVENTS", "POLLIN", "NOBLOCK",
                                                          "SNDMORE")}


#: pyzmq's zmq.COPY_THRESHOLD: frames this large go without a copy (where that is
#: safe: :func:`_zero_copy`), so their release can be tracked.
LARGE_MESSAGE_BYTES = 65536
#: Peers whose last message's time is kept (silent links); a plaintext sender names
#: itself, so the table is bounded: past it, a new name's link counts as never heard from.
MAX_HEARD = 8192


def _send_parts(sock, frames: Frames, track: bool = False):
    """A multipart message on a blocking socket without waiting (zmq.Again if the queue
    does not take it). Once the first part is taken the rest always are: ZeroMQ
    delivers a message's parts together or not at all. Frames of 64 KiB and more go
    without a copy where that is safe in this process (:func:`_zero_copy`). With
    ``track``: the pyzmq MessageTracker of the last such frame (done once ZeroMQ has
    written it, and so the frames before it, or dropped it), else None."""
    z = _zmq_ints()
    noblock, more = z["NOBLOCK"], z["NOBLOCK"] | z["SNDMORE"]
    last, copy = len(frames) - 1, not _zero_copy()
    tracked = -1
    if track and not copy:
        tracked = max((i for i, f in enumerate(frames)
                       if memoryview(f).nbytes >= LARGE_MESSAGE_BYTES), default=-1)
    tracker = None
    for i, frame in enumerate(frames):
        out = sock.send(frame, more if i < last else noblock, copy=copy, track=i == tracked)
        if i == tracked:
            tracker = out
    return tracker


_ZERO_COPY: dict[int, bool] = {}  # process id -> zero-copy sends are safe in it


def _zero_copy() -> bool:
    """Whether frames may be sent without a copy in this process.

    pyzmq releases a zero-copy frame (64 KiB and more) through its garbage-collector
    thread, one inproc message each, on sockets bounded at 1,000 messages a side. The
    queue of a link whose member stopped reading holds thousands of frames, freed at
    once when the member disconnects, in the thread that next touches the socket:
    ours, holding the GIL. That thread blocked on the collector's full socket while the
    collector waited for the GIL, and the peer hung for good; SIGTERM did not stop it
    (an attack review, 2026-11-29: a member that never read, then left, hung all three
    peers of a CURVE cohort; tests/test_transport.py hangs a plain DEALER with 300
    queued messages of 8 frames of 100 kB, not with 200). So the collector gets a
    context of its own whose sockets are unbounded, set up in each process before its
    collector first starts (a forked peer sets its own: a context does not survive a
    fork); where the collector was started before that (by other code), frames are
    copied instead, at a memcpy per send (docs/runtime.md)."""
    pid = os.getpid()
    ok = _ZERO_COPY.get(pid)
    if ok is None:
        ok = _ZERO_COPY[pid] = _unbounded_release()
    return ok


def _unbounded_release() -> bool:
    try:
        import zmq
        from zmq.utils.garbage import gc

        if gc.thread is not None:  # started already, here or in a parent, bounded
            return False
        ctx = zmq.Context()
        ctx.setsockopt(zmq.SNDHWM, 0)  # defaults of the sockets the collector makes
        ctx.setsockopt(zmq.RCVHWM, 0)
        gc.context = ctx
        return True
    except Exception as exc:  # noqa: BLE001 -- another pyzmq: copying is always safe
        log.debug("zero-copy sends off: %s", exc)
        return False


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


#: allow-list path -> (its inode, the folders that guard it), cached
_GUARDS: dict[str, tuple[int, list]] = {}


def _file_stamp(path: str) -> tuple[int, ...] | None:
    """What tells the allow-list file changed: its contents' time, size and inode, and
    the modes, owners and inodes of it and of the folders that guard it (a chmod that
    made a refused list safe was not seen: the list stayed refused until an edit or
    SIGHUP, a review; security.allow_list_folders). The folders are found once per path
    (resolving a path each tick cost 114 us against 7, a review): a folder moved or
    replaced changes an inode, and the stamp with it; the file's own inode changed, they
    are found again."""
    from hfl.peer.security import allow_list_folders

    try:
        st = os.stat(path)
        if _GUARDS.get(path, (None,))[0] != st.st_ino:  # (a link retargeted: found again)
            _GUARDS[path] = (st.st_ino, allow_list_folders(path))
        guards = [os.stat(f) for f in _GUARDS[path][1]]
    except OSError:
        _GUARDS.pop(path, None)
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid,
            *(x for g in guards for x in (g.st_mode, g.st_uid, g.st_ino)))


_HUP_LISTENERS: weakref.WeakSet = weakref.WeakSet()


def _on_sighup(transport: ZmqTransport, stop: bool = False) -> None:
    """SIGHUP asks every CURVE transport of this process to reread its allow-list at its
    next housekeeping (from the main thread's event loop only: signals reach no other)."""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    if stop:
        if transport in _HUP_LISTENERS:
            _HUP_LISTENERS.discard(transport)
            if not _HUP_LISTENERS:
                # Ignored, not the default action (which ends the process): a SIGHUP sent
                # to every peer after an allow-list edit killed those that were starting
                # or stopping, with no goodbye (a review). hfl-peer ignores it from its
                # start (peer/cli.py) until a transport with an allow-list listens.
                loop.remove_signal_handler(signal.SIGHUP)
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
        return

    def asked() -> None:
        for t in list(_HUP_LISTENERS):
            t._reload_asked = True

    _HUP_LISTENERS.add(transport)
    loop.add_signal_handler(signal.SIGHUP, asked)


# --------------------------------------------------------------------------- in-memory


class MemoryHub:
    """The "network" of in-memory transports: address -> transport."""

    def __init__(self) -> None:
        self.endpoints: dict[str, InMemoryTransport] = {}


DEFAULT_HUB = MemoryHub()


class InMemoryTransport(Transport):
    """Delivers copies of the frames to another transport's bounded inbox.

    Frames are copied on send, as a network would, so a receiver can never
    observe a later change to the sender's buffers. One copy per message, however
    many members it goes to: a broadcast hands the same frames to each in turn,
    and its receivers share the copy's (immutable) bytes, each through views of
    its own. As with ZeroMQ's zero-copy sends, frames handed to a transport are
    not changed afterwards: a caller with new content encodes a new message.
    """

    def __init__(
        self,
        peer_id: str,
        address: str,
        hub: MemoryHub | None = None,
        options: TransportOptions | None = None,
    ):
        super().__init__(peer_id, address)
        self.hub = hub or DEFAULT_HUB
        self.options = options or TransportOptions()
        self._inbox: asyncio.Queue[tuple[str, list[memoryview]]] | None = None
        # The frames sent last and their copy: a broadcast to a thousand members in one
        # process copied its result a thousand times (8 % of that process's CPU).
        self._copied: tuple[Any, list[bytes]] = (None, [])

    async def start(self) -> None:
        if self.address in self.hub.endpoints:
            # A restarted peer takes its address over, as ROUTER_HANDOVER does.
            log.info("in-memory address %s taken over by %s", self.address, self.peer_id)
        self._inbox = asyncio.Queue(maxsize=self.options.inbox_size)
        self.hub.endpoints[self.address] = self

    async def send(self, address: str, frames: Frames, timeout_s: float,
                   peer_id: str | None = None) -> bool:
        return self.send_now(address, frames, peer_id)

    def send_now(self, address: str, frames: Frames, peer_id: str | None = None) -> bool:
        # Never waits: a full inbox is a failed send. In one process the hub itself
        # vouches for the sender: it delivers our transport's peer id, which nothing
        # in a message can change.
        if self._inbox is None:  # closed, or crashed: nothing leaves it
            self.stats.send_failures += 1
            return False
        dest = self.hub.endpoints.get(address)
        nbytes = frames_nbytes(frames)
        if dest is not None and nbytes > dest.options.max_message_bytes:
            log.warning("%s: a %d-byte message to %s is over its max_message_bytes (%d): dropped",
                        self.peer_id, nbytes, address, dest.options.max_message_bytes)
            self.stats.send_failures += 1
            return False
        if dest is None or dest._inbox is None:
            self.stats.send_failures += 1
            return False
        if frames is not self._copied[0]:
            self._copied = (frames, [bytes(f) for f in frames])
        copies = [memoryview(b) for b in self._copied[1]]
        try:
            dest._inbox.put_nowait((self.peer_id, copies))
        except asyncio.QueueFull:
            self.stats.send_failures += 1
            return False
        self.stats.messages_sent += 1
        self.stats.bytes_sent += nbytes
        dest.stats.messages_received += 1
        dest.stats.bytes_received += nbytes
        return True

    async def recv(self) -> tuple[str, list[memoryview]]:
        if self._inbox is None:
            raise RuntimeError("transport not started")
        return await self._inbox.get()

    def recv_nowait(self) -> tuple[str, list[memoryview]] | None:
        try:
            return self._inbox.get_nowait() if self._inbox is not None else None
        except asyncio.QueueEmpty:
            return None

    async def close(self) -> None:
        self.crash()

    def crash(self) -> None:
        """Go as a SIGKILLed process's sockets go: nothing reaches this transport or
        leaves it from now on (sends to its address fail; its own sends, a goodbye
        included, return False), with no close of its own. An in-process cohort's
        benchmark kills a peer with this, then cancels its task."""
        if self.hub.endpoints.get(self.address) is self:
            del self.hub.endpoints[self.address]
        self._inbox = None
        self._copied = (None, [])  # (it pins the last message's buffers)


# --------------------------------------------------------------------------- faults


@dataclass
class FaultPlan:
    """Seeded faults shared by every :class:`FaultyTransport` of a test cohort.

    Probabilities apply per message on the send path. ``blocked`` holds
    directed (from_address, to_address) links that currently drop everything;
    :meth:`partition` and :meth:`heal` edit it, so a test can cut the cohort in
    two at an exact point and join it again.
    """

    seed: int = 0
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0  # hold a message back and deliver it after the next one
    delay: float = 0.0
    delay_s: tuple[float, float] = (0.01, 0.05)
    only_types: frozenset[str] | None = None  # restrict faults to these header types
    blocked: set[tuple[str, str]] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)

    def partition(self, side_a: Sequence[str], side_b: Sequence[str]) -> None:
        for a in side_a:
            for b in side_b:
                self.blocked.add((a, b))
                self.blocked.add((b, a))

    def heal(self) -> None:
        self.blocked.clear()

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


class FaultyTransport(Transport):
    """Wraps a transport and misbehaves on purpose, reproducibly.

    The random stream is seeded from the plan's seed and this transport's
    address, so a cohort with the same plan makes the same per-link decisions.
    """

    @property
    def on_link(self):
        return self.inner.on_link

    @on_link.setter
    def on_link(self, hook) -> None:
        self.inner.on_link = hook

    @property
    def given_up(self):
        return self.inner.given_up

    @given_up.setter
    def given_up(self, hook) -> None:
        self.inner.given_up = hook

    def __init__(self, inner: Transport, plan: FaultPlan):
        super().__init__(inner.peer_id, inner.address)
        self.inner = inner
        self.plan = plan
        self.stats = inner.stats
        self._rng = random.Random(f"{plan.seed}:{inner.address}")
        self._held: dict[str, list[Frames]] = {}
        self._delayed: set[asyncio.Task] = set()

    async def start(self) -> None:
        await self.inner.start()
        self.address = self.inner.address
        self._rng = random.Random(f"{self.plan.seed}:{self.address}")

    def _applies(self, frames: Frames) -> bool:
        if self.plan.only_types is None:
            return True
        try:
            import msgpack

            header = msgpack.unpackb(bytes(frames[0]), raw=False)
            return header.get("type") in self.plan.only_types
        except Exception:
            return True

    async def send(self, address: str, frames: Frames, timeout_s: float,
                   peer_id: str | None = None) -> bool:
        plan = self.plan
        if (self.address, address) in plan.blocked:
            plan.count("partitioned")
            return True  # the sender cannot tell: the network ate it
        if not self._applies(frames):
            return await self.inner.send(address, frames, timeout_s, peer_id)
        rng = self._rng
        if rng.random() < plan.drop:
            plan.count("dropped")
            return True
        if rng.random() < plan.delay:
            plan.count("delayed")
            delay = rng.uniform(*plan.delay_s)
            copies = [bytes(f) for f in frames]
            task = asyncio.create_task(
                self._send_later(address, copies, delay, timeout_s, peer_id), name=f"delayed-send->{address}"
            )
            self._delayed.add(task)
            task.add_done_callback(self._delayed.discard)
            return True
        if rng.random() < plan.reorder and not self._held.get(address):
            plan.count("reordered")
            self._held.setdefault(address, []).append([bytes(f) for f in frames])
            return True
        ok = await self.inner.send(address, frames, timeout_s, peer_id)
        for held in self._held.pop(address, []):
            await self.inner.send(address, held, timeout_s, peer_id)
        if rng.random() < plan.duplicate:
            plan.count("duplicated")
            await self.inner.send(address, frames, timeout_s, peer_id)
        return ok

    async def _send_later(self, address: str, frames: Frames, delay: float, timeout_s: float,
                          peer_id: str | None):
        await asyncio.sleep(delay)
        await self.inner.send(address, frames, timeout_s, peer_id)

    async def recv(self) -> tuple[str, list[memoryview]]:
        return await self.inner.recv()

    def recv_nowait(self) -> tuple[str, list[memoryview]] | None:
        return self.inner.recv_nowait()

    async def forget(self, address: str, peer_id: str | None = None) -> None:
        await self.inner.forget(address, peer_id)

    def housekeeping(self) -> None:
        self.inner.housekeeping()

    def dial_failure(self, address: str) -> str | None:
        return self.inner.dial_failure(address)

    def take_allow_list_change(self) -> tuple[frozenset[str], frozenset[str]] | None:
        return self.inner.take_allow_list_change()

    async def close(self) -> None:
        for task in list(self._delayed):
            task.cancel()
        await asyncio.gather(*self._delayed, return_exceptions=True)
        await self.inner.close()


def advertised_address(bound: str, advertise: str | None) -> str:
    """The address other peers should dial to reach us."""
    if advertise:
        return advertise
    scheme, _, rest = bound.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme == "tcp" and host in ("0.0.0.0", "*", "[::]", "::"):
        import socket

        ip = socket.gethostbyname(socket.gethostname())
        log.warning("listening on %s: advertising %s to peers (set node.advertise to override)",
                    bound, f"tcp://{ip}:{port}")
        return f"tcp://{ip}:{port}"
    return bound


def make_transport(
    peer_id: str,
    address: str,
    options: TransportOptions | None = None,
    hub: MemoryHub | None = None,
    security=None,
) -> Transport:
    """Pick the backend from the address scheme (``security`` applies to ZeroMQ)."""
    scheme = address.split("://", 1)[0] if "://" in address else ""
    if scheme in ("tcp", "ipc"):
        return ZmqTransport(peer_id, address, options, security=security)
    if scheme == "mem":
        return InMemoryTransport(peer_id, address, hub=hub, options=options)
    raise ValueError(
        f"address {address!r}: unknown scheme {scheme!r}; allowed: tcp://host:port, ipc://path, mem://name"
    )
