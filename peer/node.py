"""The peer: an asyncio shell around membership, rounds and an algorithm.

One event loop per peer. Three owned tasks run while the node lives:

- ``receive``: decode, validate and dispatch every inbound message; a bad one
  is dropped with a logged reason and counted, never raised;
- ``tick``: heartbeats, gossip, hellos to newly learned members and failure
  detection, every ``heartbeat_interval_s``;
- ``rounds``: the round engine (below). Training, sharing, aggregation and
  evaluation run in a worker thread, so heartbeats never stall behind a step.

A round r: local update -> share -> by the algorithm's mode, either wait for
every live peer's knowledge until ``round_timeout_s`` (broadcast), or send the
knowledge to the aggregator elected for (r, epoch) and wait for its result; if
the aggregator dies or stays silent past its deadline, fail over to the next
live peer in the rotation (epoch + 1) -> absorb -> evaluate -> metrics ->
checkpoint. Every peer stops after ``cohort.rounds`` and says goodbye.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hfl.algorithms.base import Algorithm, Payload, aggregates_everywhere
from hfl.peer import instructions as do
from hfl.peer.clock import MonotonicClock
from hfl.peer.config import SWIM_FROM, CohortConfig, FaultConfig, TimingConfig
from hfl.peer.core import PeerCore, clip, payload_digest
from hfl.peer.membership import Membership
from hfl.peer.rounds import fold_rounds
from hfl.peer.security import split_bootstrap
from hfl.peer.seeds import SeedStore
from hfl.peer.status import nobody_joined
from hfl.peer.transport import Transport
from hfl.protocol import (
    PROTOCOL_VERSION,
    Ack,
    AggregateResult,
    Commit,
    Error,
    ErrorCode,
    Heartbeat,
    Knowledge,
    Leave,
    Limits,
    Message,
    ProtocolError,
    SeedRequest,
    decode,
    encode,
)

log = logging.getLogger("hfl.peer")

#: Message types that keep the membership (counted apart in the metrics: what
#: timing.membership costs).
MEMBERSHIP_TYPES = frozenset({"hello", "welcome", "gossip", "heartbeat", "leave"})


@dataclass
class NodeResult:
    rounds_completed: int
    last_round: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    #: round -> peers whose heartbeat said they absorbed another aggregate for it
    disagreements: dict[int, list[str]] = field(default_factory=dict)
    #: why the node stopped before its first round (``stop_if_alone``: nobody joined)
    stopped_alone: str | None = None
    #: messages handed to the transport over this life, by type (``heartbeat``, ``knowledge``...)
    sent: dict[str, int] = field(default_factory=dict)


class Node:
    def __init__(
        self,
        peer_id: str,
        transport: Transport,
        algorithm: Algorithm,
        cohort: CohortConfig,
        num_classes: int,
        timing: TimingConfig,
        bootstrap: tuple[str, ...] = (),
        min_peers: int = 1,
        incarnation: int = 0,
        start_round: int = 1,
        known_members: list[tuple[str, str]] | None = None,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        on_checkpoint: Callable[[int, Node], None] | None = None,
        clock=None,
        limits: Limits | None = None,
        seed: int = 0,
        fault: FaultConfig | None = None,
        crash: Callable[[int], None] | None = None,
        advertise: str | None = None,
        seeds: SeedStore | None = None,
        shared: dict[str, int] | None = None,  # more values peers must agree on (data split)
        allowed_peers: frozenset[str] | None = None,
        signing: tuple[Callable[[bytes], bytes], dict[str, bytes]] | None = None,
        byzantine: int | None = None,
        quorum: int | None = None,
        evaluate_every: int = 1,
        stop_if_alone: bool = False,
        run_blocking: Callable[..., Any] | None = None,
        hold_round: Callable[[int, Node], Any] | None = None,
        observer: Callable[..., None] | None = None,
        on_enter_round: Callable[[int], None] | None = None,
        sit_out_through: int = 0,
    ):
        self.id = peer_id
        self.transport = transport
        self.alg = algorithm
        self.cohort = cohort
        self.num_classes = num_classes
        self.timing = timing
        # "p0@tcp://host:port" names who must answer there (CURVE needs its key).
        self.bootstrap = tuple(split_bootstrap(b) for b in bootstrap)
        # The cohort's allow-list (CURVE): nobody else is a member, whatever gossip says.
        self.allowed_peers = allowed_peers
        self.min_peers = min_peers
        # Wait for one other peer at least (whatever min_peers says) and, if none joined
        # within timing.join_timeout_s, stop before round 1 instead of training alone.
        self.stop_if_alone = stop_if_alone
        self.stopped_alone: str | None = None
        self.incarnation = incarnation
        self.known_members = known_members or []
        self.on_round = on_round
        self.on_checkpoint = on_checkpoint
        self.clock = clock or MonotonicClock()
        self.limits = limits or Limits()
        self.rng = random.Random(f"{seed}:{peer_id}:{incarnation}")
        self.dropped: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()  # messages handed to the transport, by type
        # Failure detection (peer/membership.py): full heartbeats, or SWIM from SWIM_FROM
        # peers on (auto).
        choice = getattr(timing, "membership", "auto")
        self.swim = choice == "swim" or (choice == "auto" and min_peers >= SWIM_FROM)
        self._wakeup = asyncio.Event()
        self._tasks: dict[asyncio.Task, None] = {}  # a dict: cancelled in a fixed order
        # No elected aggregator: every peer aggregates the round's knowledge itself.
        self.everywhere = aggregates_everywhere(getattr(cohort, "aggregate_at", "auto"), algorithm,
                                               min_peers)
        # The protocol's state and rules (no I/O): membership, round buffer, round,
        # epoch, election, quorum, whom to wait for. This class does the I/O around it.
        every = getattr(cohort, "communicate_every", 1)
        if every != 1 and algorithm.mode == "local":
            raise ValueError(f"cohort.communicate_every: applies to methods that share; "
                             f"{cohort.algorithm} trains alone. Remove cohort.communicate_every")
        self.core = PeerCore(peer_id, mode=algorithm.mode, everywhere=self.everywhere,
                             lookahead=timing.lookahead_rounds, start_round=start_round,
                             quorum=quorum, allowed_peers=allowed_peers, cohort_size=min_peers,
                             cohort=cohort.name, signer=signing[0] if signing else None,
                             verify_keys=dict(signing[1]) if signing else None,
                             byzantine=byzantine, communicate_every=every,
                             last_round=getattr(cohort, "rounds", 0))
        fanout = getattr(cohort, "fanout", None)
        if fanout is not None and algorithm.mode != "broadcast":
            raise ValueError(f"cohort.fanout: applies to broadcast-mode methods (fedh2l, mdhfl, "
                             f"...); {cohort.algorithm} runs in {algorithm.mode} mode. Remove "
                             "cohort.fanout")
        self._handshake_info = {**algorithm.handshake_info(), **(shared or {}),
                                **({"aggregate_everywhere": 1} if self.everywhere else {}),
                                **({"fanout": fanout} if fanout is not None else {}),
                                **({"communicate_every": every} if every != 1 else {})}
        self.core.incarnation, self.core.swim = incarnation, self.swim
        self.core.timing, self.core.rng, self.core.bootstrap = timing, self.rng, self.bootstrap
        self.core.keeps_seeds = seeds is not None
        self.core.capabilities = [algorithm.mode, f"protocol:{PROTOCOL_VERSION}"]
        self.core.hello_terms = {"cohort": cohort.name, "algorithm": cohort.algorithm,
                                 "num_classes": num_classes, "rounds": cohort.rounds,
                                 "shared": self._handshake_info}
        self._metrics: list[dict[str, Any]] = []  # one line per evaluated round
        # Evaluate, record and checkpoint every N rounds (and after the last): the
        # rounds between are folded into the next line (fold_rounds).
        self.evaluate_every = evaluate_every
        self._window: list[dict[str, Any]] = []
        self._window_keys: set[str] = set()  # what training and absorbing reported
        self._rounds_run = 0
        self._stopping = False
        self._paused_s = 0.0  # total time this peer stood still (SIGSTOP, a stalled loop)
        self._cpu_mark: float | None = None  # process CPU at the last round's record
        self._reading_behind = False  # the receive loop holds (or left) messages unread
        self._essential: set[asyncio.Task] = set()  # the receive and tick loops
        self._runner: asyncio.Task | None = None  # the task in run(), cancelled if one dies
        self._fatal: tuple[str, BaseException] | None = None  # (loop, what killed it)
        self.advertise = advertise
        self.seeds = seeds
        self.fault = fault or FaultConfig()
        self._crash = crash or _hard_exit
        # Runs training, aggregation and checkpoints off the event loop (a worker
        # thread); the simulator runs them inline, so that its history is exact.
        self._run_blocking = run_blocking or asyncio.to_thread
        # Awaited before each checkpoint (a resumed peer holds its first round until
        # it has met its cohort: runner.RoundRecorder.hold); may raise to stop the peer.
        self._hold_round = hold_round
        # Told of each decision that invariants are checked on: observer(event, node,
        # **fields) with event "started", "absorbed", "published" or "checkpointed".
        self._observe = observer or (lambda *args, **fields: None)
        # Persists "this peer entered round r" before it sends anything of round r with
        # an elected aggregator (runner: the run directory); a restart then sits out the
        # rounds its earlier life entered (PeerCore.sit_out_through).
        self._on_enter_round = on_enter_round
        self.core.sit_out_through = sit_out_through
        self.core.epoch_news_after_s = 1.5 * timing.heartbeat_interval_s

    # The protocol state lives in the core; these name it as the shell always has.
    membership = property(lambda self: self.core.membership,
                          lambda self, m: setattr(self.core, "membership", m))
    round = property(lambda self: self.core.round, lambda self, r: setattr(self.core, "round", r))
    epoch = property(lambda self: self.core.epoch, lambda self, e: setattr(self.core, "epoch", e))
    buffer = property(lambda self: self.core.buffer)
    disagreements = property(lambda self: self.core.disagreements)

    # ================================================================ lifecycle

    async def run(self) -> NodeResult:
        await self.transport.start()
        self.membership = Membership(
            self.id, advertised_address(self.transport.address, self.advertise), self.incarnation,
            self.timing.suspect_after_s, self.timing.dead_after_s,
            mode="swim" if self.swim else "full", rng=random.Random(f"{self.rng.random()}"),
        )
        # Crash hints (issue 36): a link that drops makes its peer dead after two
        # heartbeats of silence, probes included, rather than dead_after_s.
        t = self.timing
        self.membership.hint_dead_s = min(2 * t.heartbeat_interval_s,
                                          (t.suspect_after_s + t.dead_after_s) / 2)
        self.transport.on_link = self._on_link
        now = self.clock.now()
        for peer_id, address in self.known_members:  # from a checkpoint
            self.membership.heard_from(peer_id, -1, now, address=address)
        log.info("%s listening on %s, reachable at %s (incarnation %d)", self.id,
                 self.transport.address, self.membership.self_address, self.incarnation)
        background = [
            self._spawn(self._receive_loop(), "receive"),
            self._spawn(self._tick_loop(), "tick"),
        ]
        self._essential = set(background)
        self._runner = asyncio.current_task()
        try:
            await self._run_rounds()
            # The last round's aggregator stays until its members hold the result, or for
            # aggregate_grace_s: a commit lost on the way can only come from it now.
            last = self.cohort.rounds
            if self.core.lacking_last_result(last) and not await self._wait_until(
                    lambda: not self.core.lacking_last_result(last),
                    self.clock.now() + self.timing.aggregate_grace_s):
                log.warning("%s: round %d: %s still showed no sign of the last result after "
                            "timing.aggregate_grace_s=%gs; leaving", self.id, last,
                            ", ".join(self.core.lacking_last_result(last)),
                            self.timing.aggregate_grace_s)
            await self._leave("finished")
        except asyncio.CancelledError:
            # Stopped from outside (SIGTERM, Ctrl-C), or a loop of its own died: tell the
            # others, briefly.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._leave("stopped"), self.timing.send_timeout_s)
            if self._fatal is not None:
                name, exc = self._fatal
                raise NodeFailed(f"{self.id}: its {name} loop failed ({type(exc).__name__}: "
                                 f"{exc}); a peer that cannot receive or send heartbeats "
                                 "stops instead of running on deaf") from exc
            raise
        finally:
            self._stopping = True
            for task in background + list(self._tasks):
                task.cancel()
            await asyncio.gather(*background, *self._tasks, return_exceptions=True)
            await self.transport.close()
        return NodeResult(
            rounds_completed=self._rounds_run,
            last_round=self.round - 1,
            metrics=self._metrics,
            dropped=dict(self.dropped),
            disagreements={r: sorted(peers) for r, peers in sorted(self.disagreements.items())},
            stopped_alone=self.stopped_alone,
            sent=dict(sorted(self.sent.items())),
        )

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=f"{self.id}:{name}")
        self._tasks[task] = None
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task %s failed", self.id, task.get_name(), exc_info=task.exception())
            if task in self._essential and not self._stopping and self._fatal is None:
                # The receive or tick loop: without it the peer is alive to the others but
                # deaf (its whole cohort stopped learning). Stop the peer, loudly.
                self._fatal = (task.get_name().split(":", 1)[-1], task.exception())
                if self._runner is not None:
                    self._runner.cancel()

    # ================================================================ sending

    def _envelope(self) -> dict[str, Any]:
        return self.core.envelope()

    def _encode(self, msg: Message):
        """The message's frames, or None (logged) when it breaks the protocol's limits:
        an algorithm producing an unsendable payload must not crash its peer."""
        try:
            return encode(msg, self.limits)
        except ProtocolError as err:
            self.dropped["unsendable"] += 1
            log.error("%s: cannot send %s: %s", self.id, msg.TYPE, err)
            return None

    async def _send(self, address: str, msg: Message, timeout_s: float | None = None,
                    peer_id: str | None = None) -> bool:
        frames = self._encode(msg)
        if frames is None:
            return False
        ok = await self.transport.send(
            address, frames, self.timing.send_timeout_s if timeout_s is None else timeout_s,
            peer_id=peer_id,
        )
        self.sent[msg.TYPE] += ok
        if not ok:
            log.debug("%s: %s to %s not sent (unreachable or timed out)", self.id, msg.TYPE, address)
        return ok

    async def _send_to(self, peer_id: str, msg: Message, timeout_s: float | None = None) -> bool:
        address = self.membership.address_of(peer_id)
        return False if address is None else await self._send(address, msg, timeout_s, peer_id)

    async def _broadcast(self, peer_ids: list[str], msg: Message, timeout_s: float | None = None) -> int:
        """Send one message to several peers concurrently. Returns how many took it.

        A peer we already suspect gets no wait at all (queued if its link takes it,
        else dropped): a silent peer must never hold up a round's broadcast."""
        frames = self._encode(msg)  # encode once
        if frames is None:
            return 0
        timeout = self.timing.send_timeout_s if timeout_s is None else timeout_s
        sends = []
        for p in peer_ids:
            m = self.membership.members.get(p)
            address = m.address if m is not None else None
            if address is not None:
                wait = timeout if m.status == "alive" else 0.0
                sends.append(self.transport.send(address, frames, wait, peer_id=p))
        results = await asyncio.gather(*sends)
        self.sent[msg.TYPE] += sum(results)
        return sum(results)

    def _reply_soon(self, address: str, msg: Message, peer_id: str) -> None:
        """Reply from the receive loop without blocking it (only ``peer_id`` can read it
        on an authenticated transport, whatever ``address`` it gave)."""
        self._spawn(self._send(address, msg, peer_id=peer_id), "reply")

    # ================================================================ receiving

    #: Messages read ahead of handling, at most (all senders together): beyond them the
    #: transport's own buffers (ZeroMQ's high-water mark) hold the rest back.
    READ_AHEAD = 64

    async def _receive_loop(self) -> None:
        """Handle what arrives, one message per sender in turn, and let the other tasks
        run between turns. A member's flood then costs the others one turn each, not
        its whole backlog, and never stops this peer's heartbeats: a message already
        waiting made every ``await recv()`` return at once, so the loop never gave way
        and a flooded peer went silent until the others declared it dead (issue 35).
        Nothing is dropped here: what is not read ahead waits in the transport, which
        takes from each connection in turn."""
        queues: dict[str, deque] = {}
        held = 0
        while True:
            if not queues:
                identity, frames = await self.transport.recv()
                queues[identity] = deque([frames])
                held = 1
            while held < self.READ_AHEAD and (got := self.transport.recv_nowait()) is not None:
                queues.setdefault(got[0], deque()).append(got[1])
                held += 1
            # Read ahead to the limit: more may wait in the transport, unread (the
            # aggregator does not ask for contributions that may be among them).
            self._reading_behind = held >= self.READ_AHEAD
            for identity in list(queues):
                frames = queues[identity].popleft()
                held -= 1
                if not queues[identity]:
                    del queues[identity]
                try:
                    self._handle(identity, frames)
                except Exception:  # a bug in a handler must not kill the peer
                    log.exception("%s: handler failed on a message from %s", self.id, identity)
                    self.dropped["handler_error"] += 1
            self._reading_behind = self._reading_behind or held > 0
            await asyncio.sleep(0)

    def _drop(self, code: str, reason: str) -> None:
        self.dropped[code] += 1
        reason = clip(reason, 400)
        log.warning("%s: dropped message: %s", self.id, reason)
        self._observe("dropped", self, code=str(code), reason=reason)

    def _handle(self, identity: str, frames: list) -> None:
        try:
            msg = decode(frames, self.limits)
        except ProtocolError as err:
            self._drop(err.code, f"from {clip(identity)}: {err}")
            address = self.membership.address_of(identity)
            if address and err.code in (ErrorCode.UNKNOWN_TYPE, ErrorCode.VERSION_MISMATCH):
                # Politely: a newer peer learns what we do not understand.
                self._reply_soon(address, Error(**self._envelope(), code=err.code,
                                                reason=clip(err.reason, 200)), identity)
            return
        log.debug("%s: <- %s from %s", self.id, msg.TYPE, msg.sender)
        self._execute(self.core.handle(identity, msg, self.clock.now()))

    async def _carry_out(self, instructions: list[do.Instruction]) -> None:
        """:meth:`_execute`, with the batched sends (Send, Broadcast, RequestSeeds) sent
        together and awaited."""
        batch = []
        for ins in instructions:
            if isinstance(ins, do.Send):
                batch.append(self._send_to(ins.address, ins.msg, ins.timeout_s) if ins.to_member
                             else self._send(ins.address, ins.msg, ins.timeout_s, ins.peer_id))
            elif isinstance(ins, do.Broadcast):
                batch.append(self._broadcast(list(ins.peer_ids), ins.msg, ins.timeout_s))
            elif isinstance(ins, do.RequestSeeds):
                batch += self._request_seeds()
            else:
                self._execute([ins])
        await asyncio.gather(*batch)

    def _execute(self, instructions: list[do.Instruction]) -> None:
        """Carry out the core's instructions (hfl.peer.instructions), in order."""
        for ins in instructions:
            if isinstance(ins, do.Reply):
                self._reply_soon(ins.address, ins.msg, ins.peer_id)
            elif isinstance(ins, do.Dropped):
                self._drop(ins.code, ins.reason)
            elif isinstance(ins, do.Wake):
                self._wakeup.set()
            elif isinstance(ins, do.MemberChanged):
                self._log_change(ins.change, ins.level, ins.note)
            elif isinstance(ins, do.Say):
                log.log(ins.level, ins.template, *ins.args)
            elif isinstance(ins, do.SendTo):
                self._spawn(self._send_to(ins.peer_id, ins.msg, ins.timeout_s), ins.why)
            elif isinstance(ins, do.Forget):
                self._spawn(self.transport.forget(ins.address, ins.peer_id), "forget")
            elif isinstance(ins, do.Refused):
                self.dropped["refused"] += 1
                log.error("%s: %s", self.id, clip(ins.reason, 400))
            elif isinstance(ins, do.NamedEquivocator):
                log.error("%s: %s signed two different contributions for round %s (proof from %s: "
                          "digests %s and %s): it sent different knowledge to different peers; its "
                          "contributions are left out for the rest of the run", self.id, ins.peer,
                          ins.round, ins.via if ins.via != ins.peer else "its own messages",
                          clip(ins.first, 16), clip(ins.second, 16))
                self._observe("equivocator", self, peer_named=ins.peer, round=ins.round)
            elif isinstance(ins, do.ServeSeeds):
                self._serve_seeds(ins.msg)
            elif isinstance(ins, do.StoreSeedChunk):
                reason = ("this peer keeps no seed sets" if self.seeds is None
                          else self.seeds.offer(ins.msg))
                if reason:
                    self._drop("seed_rejected", reason)
            else:
                raise TypeError(f"unknown instruction {ins!r}")

    def allow_list_changed(self, allowed: frozenset[str], removed: frozenset[str]) -> None:
        """The transport reloaded the CURVE allow-list: only ``allowed`` may be members
        from now on, and each peer ``removed`` from it stops being one at once."""
        self.allowed_peers = self.core.allowed_peers = allowed
        security = getattr(self.transport, "security", None)
        if self.core.certifying and security is not None:  # the signing keys came with it
            self.core.verify_keys = {p: k for p, k in security.sign_keys.items() if p in allowed}
        for peer in sorted(removed):
            m = self.membership.members.get(peer)
            if m is not None and self.membership.left(peer, m.incarnation):
                log.warning("%s: %s removed from the allow-list: no longer a member", self.id, peer)
                self._wakeup.set()

    def _log_change(self, change, level: int | None = None, note: str = "") -> None:
        """Log a membership change and tell the observer (a ``member`` event). A join is
        one line per member and peer: a million lines for a thousand peers (with swim),
        so those go to debug there, and are no event; every other change is news."""
        quiet = self.swim and change.old == "unknown"
        if level is None:
            level = logging.DEBUG if quiet else logging.INFO
        log.log(level, "%s: %s %s -> %s (%s)%s", self.id, change.peer_id, change.old, change.new,
                change.reason, note)
        if not quiet:
            self._observe("member", self, member=change.peer_id, old=change.old, new=change.new,
                          reason=change.reason)

    def _heartbeat(self, **probe: Any) -> Heartbeat:
        return self.core.heartbeat(**probe)

    def _serve_seeds(self, msg: SeedRequest) -> None:
        if self.seeds is None:
            return
        chunks = self.seeds.chunks_for(msg.owner, msg.chunks, self.id, self.incarnation)
        address = self.membership.address_of(msg.sender)
        if chunks and address:
            self._spawn(self._send_all(address, msg.sender, chunks), "seeds")

    async def _send_all(self, address: str, peer_id: str, msgs: list[Message]) -> None:
        for m in msgs:  # one after the other: a big seed set must not flood the socket
            if not await self._send(address, m, peer_id=peer_id):
                return

    def _request_seeds(self) -> list:
        """Ask each live peer for the chunks of its seed set we still miss."""
        sends = []
        for p in self.membership.live_peers():
            missing = self.seeds.missing(p)
            if missing == []:
                continue
            address = self.membership.address_of(p)
            request = SeedRequest(**self._envelope(), owner=p, chunks=missing or [])
            sends.append(self._send(address, request, 0.05, p))
        return sends

    # ================================================================ ticking

    async def _tick_loop(self) -> None:
        tick = 0
        interval = self.timing.heartbeat_interval_s
        last = self.clock.now()
        while not self._stopping:
            now = self.clock.now()
            stood_still = now - last - interval
            if stood_still >= interval:  # this peer is slow (its loop, its machine)
                self.membership.ran_late()
            if stood_still > max(2 * interval, self.timing.suspect_after_s / 2):
                # We were not running (SIGSTOP, a stalled loop): the others' silence over
                # that time is ours, not theirs. Read the inbox before judging anyone.
                log.warning("%s: this peer stood still for %.1fs; not holding that against "
                            "the others", self.id, stood_still)
                self.membership.paused(stood_still)
                self._paused_s += stood_still
                await asyncio.sleep(0)  # let the receive loop drain what arrived meanwhile
            last = now
            try:
                # Bounded: a stuck send must never stop failure detection. asyncio.timeout,
                # not wait_for: on Python 3.11 wait_for swallows a cancellation that lands
                # as the tick finishes, and this loop (so the peer's shutdown) never ended.
                async with asyncio.timeout(interval * 2):
                    await self._tick(tick)
            except TimeoutError:
                log.warning("%s: tick %d took longer than %.2fs", self.id, tick, interval * 2)
            except Exception:
                log.exception("%s: tick %d failed", self.id, tick)
            tick += 1
            await asyncio.sleep(interval)

    async def _tick(self, tick: int) -> None:
        self.transport.housekeeping()
        if (allow_list := self.transport.take_allow_list_change()) is not None:
            self.allow_list_changed(*allow_list)
        # Hellos first, then heartbeats, probes and gossip (PeerCore.tick_greetings).
        await self._carry_out(self.core.tick_greetings(tick, self.clock.now()))
        await self._carry_out(self.core.tick_sends(tick, self.clock.now()))

    def _on_link(self, address: str, peer_id: str | None, up: bool) -> None:
        """The transport saw our link to ``address`` drop or come back: a hint
        (PeerCore.link_changed)."""
        self._execute(self.core.link_changed(address, peer_id, up, self.clock.now()))

    # ================================================================ waiting

    async def _wait_until(self, done: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``done()`` or the clock passes ``deadline`` (moved on by any time
        this peer stood still meanwhile: a pause is no one's missed deadline). Never hangs."""
        paused0 = self._paused_s
        while not done():
            remaining = deadline + (self._paused_s - paused0) - self.clock.now()
            if remaining <= 0:
                return False
            self._wakeup.clear()
            try:  # asyncio.timeout: unlike wait_for (3.11), it never swallows a cancellation
                async with asyncio.timeout(min(remaining, self.timing.heartbeat_interval_s)):
                    await self._wakeup.wait()
            except TimeoutError:
                pass
        return True

    def peers_needed(self) -> int:
        """Peers (ourselves included) the join waits for: ``min_peers``; a resumed peer
        just one of its old cohort; with ``stop_if_alone``, at least one other."""
        if self.round > 1:
            return min(self.min_peers, 2)
        return max(self.min_peers, 2) if self.stop_if_alone else self.min_peers

    async def _join(self) -> None:
        """Wait until ``min_peers`` members (ourselves included) completed a handshake.

        A peer resuming mid-run needs just one of its old cohort, and stops
        waiting as soon as everyone it remembers is known to be dead. With
        ``stop_if_alone``, a first start needs one other peer at least, and
        sets ``stopped_alone`` (no round runs) when none joined in time.
        """
        mem = self.membership
        resumed = self.round > 1
        need = self.peers_needed()
        alone_stops = self.stop_if_alone and not resumed

        def others() -> tuple[list[str], int]:
            greeted = [m.peer_id for m in mem.members.values() if m.status == "alive" and m.greeted]
            # A peer that already said goodbye was in the cohort (fast solo peers
            # can finish before a slow one has greeted them): nothing to wait for.
            departed = sum(1 for m in mem.members.values() if m.status == "left")
            departed += len(mem.reported_left - set(mem.members))
            return greeted, departed

        def joined() -> bool:
            greeted, departed = others()
            if 1 + len(greeted) + departed >= need:
                # Methods that learn on peers' public samples start once they hold them.
                return self.seeds is None or self.seeds.has_all(greeted)
            # Remembering nobody (the whole cohort was stopped and said goodbye, as
            # after Ctrl-C on hfl-launch) is not "everyone is dead": wait for the
            # bootstrap peers, or a resumed cohort would split into solo peers.
            return resumed and bool(self.known_members) and not mem.live_peers()

        def arrived() -> int:  # greeted (whatever its status now) or departed: only grows
            return (sum(1 for m in mem.members.values() if m.greeted or m.status == "left")
                    + len(mem.reported_left - set(mem.members)))

        if need > 1:
            # join_timeout_s without anyone new: a cohort still coming together (two
            # hundred peers started one after another on a busy machine take minutes)
            # is waited for as long as peers keep arriving.
            done, count, since = False, arrived(), self.clock.now()
            while await self._wait_until(lambda c=count: joined() or arrived() > c,
                                         since + self.timing.join_timeout_s):
                if joined():
                    done = True
                    break
                count, since = arrived(), self.clock.now()
            if not done:
                causes = sorted({c for c in (self.transport.dial_failure(a) for a in
                                             [a for _, a in self.bootstrap]
                                             + [m.address for m in mem.members.values()]) if c})
                greeted, departed = others()
                if alone_stops and not greeted and not departed:
                    self.stopped_alone = nobody_joined(
                        self.cohort.algorithm, [a for _, a in self.bootstrap],
                        self.timing.join_timeout_s, causes, refused=self.dropped["refused"] > 0)
                    return
                log.warning("%s: only %d of %d peers joined (none new for %.0fs); starting "
                            "anyway%s", self.id, len(mem.live_view()), need,
                            self.timing.join_timeout_s, "".join(f"; {c}" for c in causes))
        log.info("%s: cohort %s", self.id, ", ".join(mem.live_view()))

    # ================================================================ rounds

    async def _run_rounds(self) -> None:
        await self._join()
        if self.stopped_alone:
            return
        self._observe("started", self, round=self.round)
        while self.round <= self.cohort.rounds:
            target = self.core.catch_up(self.cohort.rounds)
            if target != self.round:
                log.info("%s: catching up from round %d to the cohort's round %d",
                         self.id, self.round, target)
                self.round = target
                self.buffer.advance(self.round)
            await self._one_round(self.round)
            self.core.contacts = set()
            self.round += 1
            self.buffer.advance(self.round)
            self.core.forget_before(self.round)

    async def _one_round(self, r: int) -> None:
        t_start, wall_start = self.clock.now(), time.time()
        if self._cpu_mark is None:
            self._cpu_mark = time.process_time()
        self.core.round_began = t_start
        self.epoch = 0  # heartbeats say epoch 0 until this round fails over
        sent0, recv0 = self.transport.stats.bytes_sent, self.transport.stats.bytes_received
        membership0 = sum(self.sent[t] for t in MEMBERSHIP_TYPES)
        compute, compute_cpu = 0.0, [0.0]

        async def work(fn, *args):
            nonlocal compute

            def cpu_timed(*args):  # in the worker thread: that thread's CPU is the method's
                c = time.thread_time()
                try:
                    return fn(*args)
                finally:
                    compute_cpu[0] += time.thread_time() - c

            cpu_timed.__wrapped__ = fn  # a run_blocking may look at what it runs (hfl-sim)
            t = time.perf_counter()
            out = await self._run_blocking(cpu_timed, *args)
            compute += time.perf_counter() - t
            return out

        self._maybe_crash(r, "train")
        if self.seeds is not None:
            for owner, (x, y) in sorted(self.seeds.take_completed().items()):
                self.alg.add_peer_seeds(owner, x, y)
        metrics: dict[str, Any] = dict(await work(self.alg.local_update, r))
        info: dict[str, Any] = {}
        exchanges = self.core.communicates(r)  # cohort.communicate_every: else a local step
        payload = await work(self.alg.share, r) if exchanges else None
        if not exchanges:
            received = {}
        elif self.alg.mode == "broadcast":
            received = await self._exchange(r, payload, info)
        elif self.alg.mode == "aggregator" and self.everywhere:
            received = await self._aggregate_everywhere(r, payload, info, work)
        elif self.alg.mode == "aggregator":
            received = await self._aggregate_round(r, payload, info, work)
        else:
            received = {}
        if self.alg.mode != "local" and exchanges:
            info.setdefault("learned_from", 0)  # no other peer's knowledge this round
        if received:
            metrics.update(await work(self.alg.absorb, r, received))
            if self.alg.mode == "aggregator":
                (source, result), = received.items()
                self.core.absorbed = (r, payload_digest(result), source)
                self._observe("absorbed", self, round=r, source=source, epoch=info.get("epoch"),
                              digest=self.core.absorbed[1], contributors=info.get("contributors"),
                              quorum=self.core.quorum())
        self._rounds_run += 1
        self._observe("round", self, round=r, learned_from=info.get("learned_from"),
                      behind=bool(info.get("behind")))
        evaluated = r % self.evaluate_every == 0 or r >= self.cohort.rounds
        if evaluated:
            self._window_keys.update(metrics)
            metrics.update(await work(self.alg.evaluate))
        stats = self.transport.stats
        membership_sent = sum(self.sent[t] for t in MEMBERSHIP_TYPES)
        record = {
            "peer": self.id, "round": r, "time": wall_start,
            "round_time_s": self.clock.now() - t_start, "compute_s": compute,
            # CPU: the method's calls (training, sharing, absorbing, evaluating) and the
            # whole process's since the last record (the runtime's part is the difference:
            # messages, event loop, checkpoints; with several peers in one process,
            # hfl-launch --in-process, cpu_s is all of theirs)
            "compute_cpu_s": compute_cpu[0], "cpu_s": self._cpu_since_record(),
            **metrics, **info,
            "live_peers": len(self.membership.live_view()),
            "bytes_sent": stats.bytes_sent - sent0, "bytes_received": stats.bytes_received - recv0,
            "total_bytes_sent": stats.bytes_sent, "total_bytes_received": stats.bytes_received,
            # membership messages sent (hello, welcome, gossip, heartbeat, leave): this
            # round's and in all; what timing.membership costs
            "membership_sent": membership_sent - membership0, "total_membership_sent": membership_sent,
            "dropped": sum(self.dropped.values()), "incarnation": self.incarnation,
            # (round, peer) pairs seen so far whose aggregate differed from ours
            "aggregate_disagreements": sum(len(p) for p in self.disagreements.values()),
        }
        if not evaluated:  # no line, no checkpoint: folded into the next evaluated round's
            self._window_keys.update(metrics)
            self._window.append(record)
            return
        if self.evaluate_every > 1:
            record = fold_rounds([*self._window, record], self._window_keys)
            self._window, self._window_keys = [], set()
        self._metrics.append(record)
        if self._hold_round is not None:
            await self._hold_round(r, self)
        if self.on_checkpoint is not None:
            await self._run_blocking(self.on_checkpoint, r, self)
            self._observe("checkpointed", self, round=r)
        if self.on_round is not None:
            self.on_round(record)

    def _cpu_since_record(self) -> float:
        """The process's CPU seconds since the last round's record (the first: since
        this peer's rounds began), so that between-round work (a checkpoint) counts."""
        now = time.process_time()
        since = now - (self._cpu_mark if self._cpu_mark is not None else now)
        self._cpu_mark = now
        return since

    def _knowledge(self, r: int, payload: Payload | None, epoch: int = 0) -> Knowledge:
        payload = payload or Payload(kind="none")
        core = self.core
        accepted_epoch, accepted_digest = core.marker(r)
        heard_round, heard = core.heard_report() if self.everywhere else (0, {})
        msg = Knowledge(**self._envelope(), round=r, kind=payload.kind, epoch=epoch,
                        accepted_epoch=accepted_epoch, accepted_digest=accepted_digest,
                        meta=payload.meta, tensors=payload.tensors, heard_round=heard_round,
                        heard=heard, equivocations=dict(core.equivocators))
        if core.signer is None:
            return msg
        return dataclasses.replace(msg, sig=core.sign("knowledge", r, epoch, payload_digest(msg)))

    @staticmethod
    def _payload(msg: Knowledge | AggregateResult) -> Payload:
        return Payload(kind=msg.kind, tensors=dict(msg.tensors), meta=dict(msg.meta))

    async def _exchange(self, r: int, payload: Payload | None, info: dict,
                        send: bool = True) -> dict[str, Payload]:
        """Decentralized round: everyone's knowledge to everyone (with ``cohort.fanout``
        k: to the k peers a seeded rotation names, PeerCore.exchange_plan), until the
        deadline."""
        mem, core = self.membership, self.core
        targets = mem.live_peers()
        fanout = getattr(self.cohort, "fanout", None)
        if fanout is not None and fanout < len(mem.members):
            scheduled, core.sources = core.exchange_plan(
                r, fanout, f"{self.cohort.name}:{self.cohort.seed}")
            targets = [p for p in scheduled if mem.is_live(p)]
        if send:
            await self._broadcast(targets, self._knowledge(r, payload))
        self._maybe_crash(r, "wait")
        deadline = self.clock.now() + self.timing.round_timeout_s
        try:
            complete = await self._wait_until(lambda: not core.awaited(r), deadline)
        finally:
            core.sources = None
        got = self.buffer.received(r)
        knowledge = {p: self._payload(m) for p, m in sorted(got.items()) if m.kind != "none"}
        info.update(received_from=len(got), timed_out=not complete,
                    learned_from=len(set(knowledge) - {self.id}))
        return knowledge

    async def _aggregate_round(self, r: int, payload: Payload | None, info: dict, work) -> dict[str, Payload]:
        """Server-style round on the aggregator elected for (r, epoch), with fail-over."""
        mem, core = self.membership, self.core
        self.epoch = 0
        if r <= core.sit_out_through:
            return await self._sit_out(r, info)
        if self._on_enter_round is not None:
            await self._run_blocking(self._on_enter_round, r)
        began_at = None
        for _attempt in range(len(mem.rotation_order()) + 1):
            elected = core.elect(r)
            if elected is None:
                break
            if elected[1] != began_at:  # reached a new epoch now
                began_at, core.epoch_began = elected[1], self.clock.now()
            aggregator, self.epoch = elected
            info.update(aggregator=aggregator, epoch=self.epoch)
            self.core.contacts = self._candidates(r, self.epoch)
            if aggregator == self.id:
                return await self._serve(r, payload, info, work)
            knowledge = self._knowledge(r, payload, self.epoch)
            self.core.sent_knowledge = (aggregator, knowledge)  # an "awaiting" asks for it again
            await self._send_to(aggregator, knowledge)
            # An aggregator still behind round r (restarted, paused, catching up) may lose
            # what it got meanwhile (or never get it: it was not listening yet): once its
            # heartbeats show it in round r, the knowledge goes once more (an exact repeat
            # of a copy the receiver holds is ignored there, not counted as a drop).
            # With swim the aggregator's round is known from its last answer, which may
            # predate this round: only fresh word that it is behind counts (else a
            # thousand members would all send twice).
            resend = core.behind(aggregator, r) and (
                not self.swim or mem.members[aggregator].round_heard >= core.round_began)
            self._maybe_crash(r, "wait", "serve")
            deadline = (self.clock.now() + self.timing.round_timeout_s
                        + self.timing.aggregate_grace_s)
            extended = False
            # A restart of the aggregator (a new incarnation, faster than dead_after_s)
            # lost what its earlier life got: the knowledge goes to the new life again,
            # once its heartbeats show it in round r (else a whole round_timeout_s).
            sent_life = core.incarnation_of(aggregator)
            while True:
                await self._wait_until(
                    lambda a=aggregator, again=resend, life=sent_life: (
                        core.stop_waiting_for(a, r, again) or core.incarnation_of(a) != life),
                    deadline)
                if core.incarnation_of(aggregator) != sent_life:
                    sent_life, resend = core.incarnation_of(aggregator), True
                    log.info("%s: round %d: aggregator %s restarted; our knowledge goes to its "
                             "new life once it is in the round", self.id, r, aggregator)
                    continue
                if (resend and not core.behind(aggregator, r)
                        and core.usable_result(r) is None and mem.is_live(aggregator)):
                    resend = False
                    log.info("%s: round %d: %s reached the round; sending it our knowledge "
                             "again", self.id, r, aggregator)
                    await self._send_to(aggregator, knowledge)
                    continue
                if (not extended and core.usable_result(r) is None
                        and core.serving(aggregator, r)):
                    # Its heartbeats say it is alive and serving this very epoch: it may be
                    # waiting for our knowledge (lost), or be late. Once: send it again and
                    # wait another round_timeout_s + aggregate_grace_s before failing over
                    # (found by hfl-sim --buggify seed 3022: failing over from a live, late
                    # aggregator cost the whole cohort its round).
                    extended = True
                    log.info("%s: round %d: aggregator %s (epoch %d) is late but serving; "
                             "sending our knowledge again and waiting once more", self.id, r,
                             aggregator, self.epoch)
                    await self._send_to(aggregator, knowledge)
                    deadline = (self.clock.now() + self.timing.round_timeout_s
                                + self.timing.aggregate_grace_s)
                    continue
                break
            if core.usable_result(r) is None and core.moved_on(r, aggregator):
                # A heartbeat can overtake the result it follows (a delayed or retried
                # send): give the result a short grace before leaving the round.
                grace = max(2 * self.timing.heartbeat_interval_s, 0.25)
                await self._wait_until(lambda: core.usable_result(r) is not None,
                                       self.clock.now() + grace)
            result = core.usable_result(r)
            if result is not None:
                order = mem.rotation_order()
                self._observe("took", self, round=r, epoch=result.epoch, own_epoch=self.epoch,
                              passed=[(c, "self" if c == self.id else mem.members[c].status
                                       if c in mem.members else "unknown")
                                      for c in (self.core.candidate(order, r, e)
                                                for e in range(self.epoch, result.epoch))])
                self.epoch = result.epoch
                if result.kind == "none":
                    log.warning("%s: round %d: aggregator %s (epoch %d) abstained: a result of an "
                                "earlier epoch may be committed and it holds no copy; leaving the "
                                "round without a result", self.id, r, result.sender, result.epoch)
                    info.update(aggregator=None, abstained=True)
                    self._discard_unused_results(r, result.epoch)
                    return {}
                committed = await self._await_commit(r, result)
                if committed is not None:
                    info.update(aggregator=result.sender, epoch=result.epoch,
                                contributors=len(result.contributors),
                                learned_from=len(set(result.contributors) - {self.id}))
                    self._discard_unused_results(r, result.epoch)
                    return {result.sender: self._payload(result)}
                if not core.moved_on(r, result.sender):
                    why = ("is dead" if not mem.is_live(result.sender)
                           else "did not commit in time")
                    log.warning("%s: round %d: aggregator %s (epoch %d) %s; failing over with its "
                                "result accepted", self.id, r, result.sender, result.epoch, why)
                    self.epoch += 1
                    continue
            if core.moved_on(r, aggregator):
                # Its result went out while we lagged (paused, restarted, partitioned) and
                # will not come again: follow the cohort instead of failing over alone.
                log.warning("%s: round %d: the cohort is already in round %d; leaving round %d "
                            "without its result", self.id, r, mem.max_live_round(), r)
                info.update(aggregator=None, behind=True)
                self._discard_unused_results(r, None)
                return {}
            log.warning("%s: round %d: aggregator %s (epoch %d) %s; failing over",
                        self.id, r, aggregator, self.epoch, core.failover_reason(aggregator, r))
            self.epoch += 1
        log.error("%s: round %d: no aggregator could be reached; keeping the local model",
                  self.id, r)
        info.update(aggregator=None)
        self._discard_unused_results(r, None)
        return {}

    async def _aggregate_everywhere(self, r: int, payload: Payload | None, info: dict,
                                    work) -> dict[str, Payload]:
        """A round with no aggregator: everyone's knowledge to everyone (as in broadcast
        mode), then this peer computes the method's aggregate itself. No other peer's
        word can set its model, only its contribution; what it takes needs the quorum,
        as an aggregator's result does."""
        if self.core.signer is not None:
            # A signed contribution is a statement: an earlier life of this peer that
            # signed round r's must not be followed by another version (it would prove
            # this peer an equivocator). Rounds entered are recorded before signing.
            if r <= self.core.sit_out_through:
                log.warning("%s: round %d: an earlier life of this peer may have signed its "
                            "knowledge for this round: sitting it out (no contribution)", self.id, r)
                payload, info["sat_out"] = None, True
            elif self._on_enter_round is not None:
                await self._run_blocking(self._on_enter_round, r)
        contributions = await self._exchange(r, payload, info, send=not info.get("sat_out"))
        self.core.note_heard(r)  # told to the others with our next contribution
        contributions = {p: c for p, c in contributions.items() if p not in self.core.equivocators}
        if payload is not None and payload.kind != "none":
            contributions[self.id] = payload
        result = await work(self.alg.aggregate, r, dict(sorted(contributions.items())))
        info.update(aggregator=self.id, epoch=0, learned_from=0)
        if result is None:
            return {}
        excluded = set(result.meta.get("excluded", ()))
        used = sorted(p for p in contributions if p not in excluded)
        info.update(contributors=len(used))
        quorum = self.core.quorum()
        if len(used) < quorum:
            return self._short_of_quorum(r, len(used), quorum, info, "keeping the local model")
        info.update(learned_from=len(set(used) - {self.id}))
        return {self.id: result}

    def _candidates(self, r: int, epoch: int) -> set[str]:
        """The other peers the rotation names for round r's epochs 0 .. ``epoch``: whom
        this peer's round depends on (and who waits on it)."""
        order = self.membership.rotation_order()
        return {self.core.candidate(order, r, e) for e in range(min(epoch + 1, len(order)))} - {self.id}

    async def _sit_out(self, r: int, info: dict) -> dict[str, Payload]:
        """An earlier life of this peer entered round r and may have acked a result it no
        longer knows: no contribution, no ack (as an acceptor that crashed for good).
        It waits with the cohort, and absorbs the round's result only if its aggregator
        commits it (a committed value is the round's one); it never drags the cohort on."""
        log.warning("%s: round %d: an earlier life of this peer was in this round and may have "
                    "acked a result it no longer knows: sitting the round out", self.id, r)
        core = self.core
        self.core.contacts = self._candidates(r, 0)
        deadline = self.clock.now() + self.timing.round_timeout_s + self.timing.aggregate_grace_s
        await self._wait_until(lambda: core.committed_result(r) is not None or core.cohort_past(r),
                               deadline)
        info.update(aggregator=None, sat_out=True)
        result = core.committed_result(r)
        if result is None:
            return {}
        info.update(aggregator=result.sender, epoch=result.epoch,
                    contributors=len(result.contributors),
                    learned_from=len(set(result.contributors) - {self.id}))
        return {result.sender: self._payload(result)}

    async def _await_commit(self, r: int, result: AggregateResult) -> AggregateResult | None:
        """Accept ``result`` (ack it to its aggregator) and wait until the aggregator
        commits it (a commit, or its heartbeat saying it absorbed it), dies, or the
        cohort moves past round r. Returns the committed result, or None."""
        core, aggregator = self.core, result.sender
        digest = core.accept(result)
        await self._send_to(aggregator, Ack(**self._envelope(), round=r, epoch=result.epoch,
                                            digest=digest, sig=core.sign_ack(r, result.epoch, digest)))
        # The aggregator decides within max(aggregate_grace_s, 4 heartbeats) of publishing
        # (see _serve); then its commit, or its next heartbeat, travels.
        hb = self.timing.heartbeat_interval_s
        deadline = self.clock.now() + max(self.timing.aggregate_grace_s, 4 * hb) + 4 * hb
        await self._wait_until(lambda: core.committed(r) is not None
                               or not self.membership.is_live(aggregator)
                               or core.moved_on(r, aggregator), deadline)
        if core.committed(r) is None and core.moved_on(r, aggregator):
            # A heartbeat may overtake the commit it follows: a short grace.
            grace = max(2 * self.timing.heartbeat_interval_s, 0.25)
            await self._wait_until(lambda: core.committed(r) is not None, self.clock.now() + grace)
        return core.committed(r)

    NO_RESULT = "no result published, keeping the local model"

    def _short_of_quorum(self, r: int, count: int, quorum: int, info: dict,
                         outcome: str) -> dict[str, Payload]:
        """Say (and record) that round r's contributions fell short of the quorum."""
        log.warning("%s: round %d: %d contribution(s), below the quorum of %d: %s",
                    self.id, r, count, quorum, outcome)
        info.update(below_quorum=True)
        return {}

    def _discard_unused_results(self, r: int, used_epoch: int | None) -> None:
        """Results of round ``r`` for epochs this peer never reached are dropped, loudly:
        it never saw the failures that would have made them current."""
        for res in self.core.unused_results(r, used_epoch):
            self._drop("unjustified_epoch", f"result for round {r} epoch {res.epoch} from "
                       f"{res.sender} not used: the candidates before it were alive in this "
                       "peer's view")

    async def _serve(self, r: int, payload: Payload | None, info: dict, work) -> dict[str, Payload]:
        """This peer is the aggregator of (r, self.epoch): wait for the contributions,
        publish (its own aggregate, or a result accepted at an earlier epoch again, or
        an abstention: PeerCore.proposal), then commit once a quorum acked it."""
        mem, core = self.membership, self.core
        deadline = self.clock.now() + self.timing.round_timeout_s
        # A contribution lost on the way (a lossy link, a reconnect) cost the whole
        # round_timeout_s: after 4, 8, 8, ... heartbeats the members still awaited are
        # asked for it (a heartbeat with ``awaiting``; one that has sent it here sends
        # it again, one still training ignores it).
        hb = self.timing.heartbeat_interval_s
        ask_after, paused0 = 4 * hb, self._paused_s
        while True:
            end = deadline + (self._paused_s - paused0)  # a pause moves the deadline on
            complete = await self._wait_until(lambda: not core.awaited(r),
                                              min(end, self.clock.now() + ask_after))
            if complete or self.clock.now() >= deadline + (self._paused_s - paused0):
                break
            ask_after = 8 * hb
            if self._reading_behind:
                # Messages wait unread here (an overloaded peer, a thousand contributions
                # at once): what we would ask for may be among them, and every answer is
                # a second copy on top (hfl-launch --in-process with 1,000 peers: the
                # asks and their answers kept the aggregator from ever catching up).
                continue
            await self._broadcast(core.awaited(r), self._heartbeat(awaiting=r), 0.05)
        promised = core.promises(r)
        decision, earlier, refused = core.proposal(r, promised)
        for liar, why in refused.items():
            self._drop("lying_claim", f"round {r}: left out {liar}'s contribution: {why}")
            del promised[liar]
        quorum = core.quorum()
        self._maybe_crash(r, "serve")
        info.update(timed_out=not complete)
        if 1 + len(promised) < quorum:
            # A minority (one side of a partition, a lone restarted peer) never publishes.
            info.update(aggregator=None, contributors=1 + len(promised))
            self._discard_unused_results(r, self.epoch)
            return self._short_of_quorum(r, 1 + len(promised), quorum, info, self.NO_RESULT)
        if decision == "abstain":
            log.warning("%s: round %d: a contributor accepted a result of an earlier epoch that "
                        "this peer holds no copy of; abstaining at epoch %d", self.id, r, self.epoch)
            await self._broadcast(mem.live_peers(), AggregateResult(
                **self._envelope(), round=r, epoch=self.epoch, kind="none"))
            info.update(aggregator=None, abstained=True)
            self._discard_unused_results(r, self.epoch)
            return {}
        if decision == "repeat":
            log.info("%s: round %d: publishing %s's result of epoch %d again at epoch %d (a "
                     "contributor accepted it)", self.id, r, earlier.sender, earlier.epoch, self.epoch)
            result = self._payload(earlier)
            used = list(earlier.contributors)
        else:
            contributions = {p: self._payload(m) for p, m in promised.items() if m.kind != "none"}
            if payload is not None:
                contributions[self.id] = payload
            result = await work(self.alg.aggregate, r, contributions)
            if result is None:
                self._discard_unused_results(r, self.epoch)
                return {}
            excluded = set(result.meta.get("excluded", ()))
            used = sorted(p for p in contributions if p not in excluded)  # only what went in
        self._discard_unused_results(r, self.epoch)
        info.update(contributors=len(used))
        if len(used) < quorum:
            info.update(aggregator=None)
            return self._short_of_quorum(r, len(used), quorum, info, self.NO_RESULT)
        msg = AggregateResult(**self._envelope(), round=r, epoch=self.epoch, kind=result.kind,
                              contributors=used, meta=result.meta, tensors=result.tensors)
        digest = core.accept(msg)
        core.expect_acks(r, self.epoch, digest)
        self._observe("published", self, round=r, epoch=self.epoch, contributors=len(used),
                      quorum=quorum, digest=digest)
        await self._broadcast(mem.live_peers(), msg)
        # Acks come one round trip after the result arrives: wait aggregate_grace_s (the
        # time a result is given to travel), at least four heartbeats, and send the
        # result again to the live members that have not acked (a lost result or a lost
        # ack must not cost the whole cohort its round) after 1, 2, 4, 4, ... heartbeats:
        # acks that are only slow (a loaded machine, a big cohort) must not be answered
        # with a copy of the result per member each heartbeat, queued for each of them.
        hb = self.timing.heartbeat_interval_s
        deadline = self.clock.now() + max(self.timing.aggregate_grace_s, 4 * hb)
        wait = hb
        while True:
            acked = await self._wait_until(
                lambda: (core.acked(r, self.epoch, digest) >= quorum
                         or core.acks_out_of_reach(r, self.epoch, digest, quorum)),
                min(deadline, self.clock.now() + wait))
            if acked or self.clock.now() >= deadline:
                break
            await self._broadcast(core.not_acked(r, self.epoch, digest), msg)
            wait = min(2 * wait, 4 * hb)  # (a copy lost late still gets another)
        if core.acked(r, self.epoch, digest) < quorum:
            log.warning("%s: round %d: %d of the %d acks a commit needs %s; not committing, "
                        "keeping the local model", self.id, r, core.acked(r, self.epoch, digest),
                        quorum, "arrived in time" if not acked else "before the cohort moved on")
            info.update(aggregator=None, uncommitted=True)
            return {}
        core.commits.add((r, digest))
        self._observe("committed", self, round=r, epoch=self.epoch, digest=digest)
        commit = core.last_commit = Commit(**self._envelope(), round=r, epoch=self.epoch,
                                           digest=digest, certificate=core.certificate(r, self.epoch, digest))
        await self._broadcast(mem.live_peers(), commit)
        info.update(learned_from=len(set(used) - {self.id}))
        return {self.id: result}

    def _maybe_crash(self, r: int, *phases: str) -> None:
        f = self.fault
        if f.crash_at_round == r and f.crash_phase in phases and self.incarnation == 0:
            log.critical("%s: injected crash in round %d (%s)", self.id, r, f.crash_phase)
            self._observe("crash", self, round=r, phase=f.crash_phase)
            self._crash(f.exit_code)

    #: swim: members a goodbye goes to directly, at most.
    LEAVE_FANOUT = 16

    async def _leave(self, reason: str) -> None:
        if self.membership is None or self.transport is None:
            return
        targets = [p for p in self.membership.gossip_targets() if self.membership.is_live(p)]
        if self.swim and len(targets) > self.LEAVE_FANOUT:
            # A goodbye to a sample: the news spreads from there (each receiver passes it
            # on; the others then probe us, find us gone and mark us dead).
            targets = sorted(set(self.rng.sample(targets, self.LEAVE_FANOUT))
                             | (self.core.contacts & set(targets)))
        if targets:  # best effort and brief: a peer that already closed must not delay our exit
            await self._broadcast(targets, Leave(**self._envelope(), reason=reason,
                                                 round=self.round), timeout_s=0.2)


class NodeFailed(RuntimeError):
    """The node's own receive or tick loop died: the peer stops (see Node._task_done)."""


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


def _hard_exit(code: int) -> None:
    """Die like a SIGKILLed process: no goodbye, no cleanup, no checkpoint."""
    import os

    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)
