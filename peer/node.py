"""The peer: an asyncio shell around membership, rounds and an algorithm.

One event loop per peer. Three owned tasks run while the node lives:

- ``receive``: decode, validate and dispatch every inbound message; a bad one
  is dropped with a logged reason and counted, never raised;
- ``tick``: heartbeats, gossip, hellos to newly learned members and failure
  detection, every ``heartbeat_interval_s``;
- ``rounds``: the round engine (below). Training, sharing, aggregation and
  evaluation run in a worker thread, so heartbeats never stall behind a step
  (in-process cohorts: a call that took under 5 ms last time runs on the shared
  loop, _compute_call).

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
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hfl.algorithms.base import Algorithm, aggregates_everywhere
from hfl.peer import instructions as do
from hfl.peer.clock import MonotonicClock, Pauses
from hfl.peer.config import CohortConfig, FaultConfig, TimingConfig, uses_swim
from hfl.peer.core import PeerCore, clip, hello_terms, signing_context
from hfl.peer.inbox import FloodBudget, Inbox
from hfl.peer.ledger import RoundLedger
from hfl.peer.outbox import Outbox
from hfl.peer.procedures import ALONE, JOINED, RoundProcedures
from hfl.peer.security import split_bootstrap
from hfl.peer.seeds import SeedStore
from hfl.peer.status import Repeats, nobody_joined
from hfl.peer.transport import Transport, advertised_address
from hfl.protocol import (
    PROTOCOL_VERSION,
    ErrorCode,
    Limits,
    Message,
    ProtocolError,
    decode,
)

log = logging.getLogger("hfl.peer")

@dataclass
class NodeResult:
    rounds_completed: int
    last_round: int
    #: this life's metrics lines (keep_metrics False, a peer process: the last only)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    #: round -> peers whose heartbeat said they absorbed another aggregate for it
    disagreements: dict[int, list[str]] = field(default_factory=dict)
    #: why the node stopped before its first round (``stop_if_alone``: nobody joined)
    stopped_alone: str | None = None
    #: messages handed to the transport over this life, by type (``heartbeat``, ``knowledge``...)
    sent: dict[str, int] = field(default_factory=dict)
    #: their bytes (frames as sent, before CURVE), by type
    sent_bytes: dict[str, int] = field(default_factory=dict)


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
        data_part: int = 0,  # 1 + the part of that split this peer trains on (0: none)
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
        inline_short_calls: bool = False,
        keep_metrics: bool = True,  # NodeResult.metrics: every line (False: the last)
    ):
        self.id = peer_id
        self.alg = algorithm
        self.cohort = cohort
        self.num_classes = num_classes
        self.timing = timing
        # "p0@tcp://host:port" names who must answer there (CURVE needs its key).
        self.bootstrap = tuple(split_bootstrap(b) for b in bootstrap)
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
        self._repeats = Repeats()  # the same drop or refusal: one log line a minute
        self._drops_seen = 0  # messages dropped or refused so far (the flood budget's)
        self.floods = FloodBudget()
        # Failure detection (peer/membership.py): full heartbeats, or SWIM from SWIM_FROM
        # peers on (auto).
        self.swim = uses_swim(getattr(timing, "membership", "auto"), min_peers)
        self._wakeup = asyncio.Event()
        self._tasks: dict[asyncio.Task, None] = {}  # a dict: cancelled in a fixed order
        # No elected aggregator: every peer aggregates the round's knowledge itself.
        self.everywhere = aggregates_everywhere(getattr(cohort, "aggregate_at", "auto"), algorithm,
                                               min_peers)
        # The protocol's state and rules (no I/O): membership, round buffer, round,
        # epoch, election, quorum, whom to wait for. This class does the I/O around it.
        every = getattr(cohort, "communicate_every", 1)
        fanout = getattr(cohort, "fanout", None)
        self.core = PeerCore(
            peer_id, mode=algorithm.mode, everywhere=self.everywhere,
            lookahead=timing.lookahead_rounds, start_round=start_round, quorum=quorum,
            allowed_peers=allowed_peers, cohort_size=min_peers, cohort=signing_context(cohort),
            signer=signing[0] if signing else None,
            verify_keys=dict(signing[1]) if signing else None, byzantine=byzantine,
            communicate_every=every, last_round=getattr(cohort, "rounds", 0),
            incarnation=incarnation, swim=self.swim, timing=timing, rng=self.rng,
            bootstrap=self.bootstrap, seeds=seeds, sit_out_through=sit_out_through,
            capabilities=[algorithm.mode, f"protocol:{PROTOCOL_VERSION}"],
            hello_terms=hello_terms(cohort, algorithm.mode, num_classes, self.everywhere,
                                    {**algorithm.handshake_info(), **(shared or {})}, data_part))
        # Each round's record; evaluated, recorded and checkpointed every N rounds (and
        # after the last), the rounds between folded into the next line.
        self.evaluate_every = evaluate_every
        self.ledger = RoundLedger(peer_id, evaluate_every, keep_lines=keep_metrics)
        self._stopping = False
        self.pauses = Pauses(peer_id)  # the times this peer stood still (SIGSTOP, a stalled loop)
        # The receive loop: each sender in turn (_handle may be swapped, by a test).
        self.inbox = Inbox(lambda: self.transport, lambda i, f: self._handle(i, f),
                           self._handler_failed)
        self._essential: set[asyncio.Task] = set()  # the receive and tick loops
        self._runner: asyncio.Task | None = None  # the task in run(), cancelled if one dies
        self._fatal: tuple[str, BaseException] | None = None  # (loop, what killed it)
        self.advertise = advertise
        self.seeds = seeds
        self.fault = fault or FaultConfig()
        self._crash = crash or _hard_exit
        # Runs training, aggregation and checkpoints off the event loop (a worker
        # thread); the simulator runs them inline, so that its history is exact.
        # inline_short_calls: call name -> whether it ran short last time (_compute_call).
        self._run_blocking = run_blocking or asyncio.to_thread
        self._short: dict[str, bool] | None = (
            {} if inline_short_calls and run_blocking is None else None)
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
        # The round procedures decide; this shell carries their instructions out (_drive).
        self.procedures = RoundProcedures(
            self.core, now=self.clock.now, paused=lambda: self.pauses.total,
            reading_behind=lambda: self.inbox.reading_behind, fanout=fanout,
            plan_key=f"{cohort.name}:{cohort.seed}", overlap=getattr(cohort, "overlap", False),
            retry_aggregate=getattr(algorithm, "aggregate_is_pure", True))
        self._started: asyncio.Task | None = None  # a StartCompute's call (cohort.overlap)
        # Every send: encoded once, handed to the transport, counted by type (``sent``).
        self.out = Outbox(peer_id, transport, self.limits, timing.send_timeout_s,
                          lambda: self.core.membership, self._spawn, self.dropped)

    # The protocol state lives in the core; these name it as the shell always has.
    membership = property(lambda self: self.core.membership,
                          lambda self, m: setattr(self.core, "membership", m))
    round = property(lambda self: self.core.round, lambda self, r: setattr(self.core, "round", r))
    epoch = property(lambda self: self.core.epoch, lambda self, e: setattr(self.core, "epoch", e))
    buffer = property(lambda self: self.core.buffer)
    disagreements = property(lambda self: self.core.disagreements)
    sent = property(lambda self: self.out.sent)  # messages handed to the transport, by type
    # One transport, the Outbox's: a test or tool that swaps it swaps it for every send.
    transport = property(lambda self: self.out.transport,
                         lambda self, t: setattr(self.out, "transport", t))

    # ================================================================ lifecycle

    async def run(self) -> NodeResult:
        await self.transport.start()
        self.core.open_view(advertised_address(self.transport.address, self.advertise),
                            random.Random(f"{self.rng.random()}"))
        self.transport.on_link = self._on_link
        self.transport.given_up = lambda peer: self.core.membership.is_dead(peer)
        self.membership.remember(self.known_members, self.clock.now())  # (from a checkpoint)
        log.info("%s listening on %s, reachable at %s (incarnation %d)", self.id,
                 self.transport.address, self.membership.self_address, self.incarnation)
        background = [
            self._spawn(self.inbox.run(), "receive"),
            self._spawn(self._tick_loop(), "tick"),
        ]
        self._essential = set(background)
        self._runner = asyncio.current_task()
        try:
            await self._run_rounds()
            await self._drive(self.procedures.finish(self.cohort.rounds))
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
            if self._started is not None:
                # A step started ahead (cohort.overlap) belongs to a round that never ends:
                # it is let go like any step in flight, not waited for (a stopped peer
                # exits in seconds, not a step's length). Nothing reads the model after:
                # the checkpoint on disk is of an evaluated round, which starts no step.
                self._started.cancel()
                failed, = await asyncio.gather(self._started, return_exceptions=True)
                if isinstance(failed, Exception):  # it had failed already
                    log.error("%s: the local step started ahead failed: %s", self.id, failed,
                              exc_info=failed)
            self.pauses.close()
            await self.transport.close()
        return NodeResult(
            rounds_completed=self.ledger.rounds_run,
            last_round=self.round - 1,
            metrics=self.ledger.lines,
            dropped=dict(self.dropped),
            disagreements={r: sorted(peers) for r, peers in sorted(self.disagreements.items())},
            stopped_alone=self.stopped_alone,
            sent=dict(sorted(self.sent.items())),
            sent_bytes=dict(sorted(self.out.sent_bytes.items())),
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
            self._observe("failed", self, where=f"task {task.get_name()}",
                          error=repr(task.exception()))
            if task in self._essential and not self._stopping and self._fatal is None:
                # The receive or tick loop: without it the peer is alive to the others but
                # deaf (its whole cohort stopped learning). Stop the peer, loudly.
                self._fatal = (task.get_name().split(":", 1)[-1], task.exception())
                if self._runner is not None:
                    self._runner.cancel()

    # ================================================================ sending

    async def _broadcast(self, peer_ids, msg: Message, timeout_s: float | None = None) -> int:
        """A round procedure's broadcast (a method of its own: the simulators' Byzantine
        twins replace it to forge knowledge and results; a goodbye does not pass here)."""
        return await self.out.broadcast(peer_ids, msg, timeout_s)

    # ================================================================ receiving

    def _handler_failed(self, identity: str) -> None:
        log.exception("%s: handler failed on a message from %s", self.id, identity)
        self.dropped["handler_error"] += 1
        # (a bug, caught so that no message can stop the peer: the simulators fail on it)
        self._observe("failed", self, where=f"the handler of a message from {identity}",
                      error=repr(sys.exc_info()[1]))

    def _drop(self, code: str, reason: str) -> None:
        self.dropped[code] += 1
        self._drops_seen += 1
        reason = clip(reason, 400)
        say, more = self._repeats.note(reason)
        if say:
            log.warning("%s: dropped message: %s%s", self.id, reason, Repeats.suffix(more))
        self._observe("dropped", self, code=str(code), reason=reason)

    def _handle(self, identity: str, frames: list) -> None:
        """One message: decoded, then the core's instructions carried out. A sender past
        its flood budget (peer/inbox.py) is dropped unread."""
        now = self.clock.now()
        if self.floods.muted(identity, now):
            self.dropped["flooding"] += 1  # unread: counted, not said again
            return
        before = self._drops_seen
        try:
            msg = decode(frames, self.limits)
        except ProtocolError as err:
            self._execute(self.core.undecodable(identity, err))
        else:
            log.debug("%s: <- %s from %s", self.id, msg.TYPE, msg.sender)
            self._execute(self.core.handle(identity, msg, now))
        if self._drops_seen != before and self.floods.charge(identity, now):
            self._drop("flooding", f"{identity}: more than {self.floods.limit} of its messages "
                                   "dropped within a second: the rest of its messages that "
                                   "second are dropped unread")

    async def _carry_out(self, instructions: list[do.Instruction]) -> None:
        """Carry out the core's instructions (hfl.peer.instructions), in order, the sends
        (Send, Broadcast) among them sent together and awaited (Outbox.batch)."""
        await asyncio.gather(*self.out.batch(instructions, self._do))

    def _execute(self, instructions: list[do.Instruction]) -> None:
        """:meth:`_carry_out` without waiting (a message's handler, the receive loop's):
        the sends that must wait go on in a task of their own. (A lazy peer's ask for a
        member's view, a Send from a heartbeat's handler, raised here: the ask was never
        sent and the instructions after it were lost, every hfl-sim seed with
        ``timing.join: lazy``.)"""
        waits = self.out.batch(instructions, self._do)
        if waits:
            self._spawn(_all(waits), "send")

    def _do(self, ins: do.Instruction) -> None:
        """One instruction other than a send."""
        if isinstance(ins, do.Reply):
            self.out.reply(ins.address, ins.msg, ins.peer_id)
        elif isinstance(ins, do.Dropped):
            self._drop(ins.code, ins.reason)
        elif isinstance(ins, do.Wake):
            self._wakeup.set()
        elif isinstance(ins, do.MemberChanged):
            self._log_change(ins.change, ins.level, ins.note)
        elif isinstance(ins, do.Say):
            log.log(ins.level, ins.template, *ins.args)
        elif isinstance(ins, do.SendTo):
            self._spawn(self.out.send_to(ins.peer_id, ins.msg, ins.timeout_s), ins.why)
        elif isinstance(ins, do.Forget):
            self._spawn(self.transport.forget(ins.address, ins.peer_id), "forget")
        elif isinstance(ins, do.Refused):
            self.dropped["refused"] += 1
            self._drops_seen += 1
            say, more = self._repeats.note(ins.reason)
            if say:
                log.error("%s: %s%s", self.id, clip(ins.reason, 400), Repeats.suffix(more))
        elif isinstance(ins, do.NamedEquivocator):
            log.error("%s: %s signed two different contributions for round %s (proof from %s: "
                      "digests %s and %s): it sent different knowledge to different peers; its "
                      "contributions are left out for the rest of the run", self.id, ins.peer,
                      ins.round, ins.via if ins.via != ins.peer else "its own messages",
                      clip(ins.first, 16), clip(ins.second, 16))
            self._observe("equivocator", self, peer_named=ins.peer, round=ins.round)
        elif isinstance(ins, do.ServeSeeds):
            self._spawn(self.out.send_all(ins.address, ins.peer_id, ins.chunks), "seeds")
        elif isinstance(ins, do.Note):
            self._observe(ins.kind, self, **ins.fields)
        elif isinstance(ins, do.CrashPoint):
            self._maybe_crash(ins.round, *ins.phases)
        else:
            raise TypeError(f"unknown instruction {ins!r}")

    def refusals(self) -> int:
        """Messages this peer dropped for a refused handshake (theirs, or the answer to
        its own hello), in this life: more than 0 says the cohort's configs differ."""
        return self.dropped[ErrorCode.COHORT_MISMATCH] + self.dropped["refused"]

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
            silent = {} if change.silent_s is None else {"silent_s": round(change.silent_s, 3)}
            self._observe("member", self, member=change.peer_id, old=change.old, new=change.new,
                          reason=change.reason, **silent)

    # ================================================================ ticking

    async def _tick_loop(self) -> None:
        tick = 0
        interval = self.timing.heartbeat_interval_s
        last = self.clock.now()
        while not self._stopping:
            now = self.clock.now()
            stood_still = now - last - interval
            if self.core.stood_still(stood_still):  # not running: read the inbox first
                self.pauses.add(stood_still, now)
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
                self._observe("slow_tick", self, tick=tick, limit_s=interval * 2)
            except Exception as err:
                log.exception("%s: tick %d failed", self.id, tick)
                self._observe("failed", self, where=f"tick {tick}", error=repr(err))
            tick += 1
            await asyncio.sleep(interval)

    async def _tick(self, tick: int) -> None:
        self.transport.housekeeping()
        if (allow_list := self.transport.take_allow_list_change()) is not None:
            # The cohort's allow-list (CURVE): nobody else is a member, whatever gossip says.
            security = getattr(self.transport, "security", None)
            self._execute(self.core.allow_list_changed(
                *allow_list, security.sign_keys if security is not None else None))
        # Hellos first, then heartbeats, probes and gossip (PeerCore.tick_greetings).
        await self._carry_out(self.core.tick_greetings(tick, self.clock.now()))
        await self._carry_out(self.core.tick_sends(tick, self.clock.now()))

    def _on_link(self, address: str, peer_id: str | None, up: bool) -> None:
        """The transport saw our link to ``address`` drop or come back: a hint
        (PeerCore.link_changed). Not while stopping: the members leave with us."""
        if self._stopping:
            return
        self._execute(self.core.link_changed(address, peer_id, up, self.clock.now()))

    # ================================================================ waiting

    async def _wait_until(self, done: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``done()`` or the clock passes ``deadline`` (moved on by any time
        this peer stood still meanwhile: a pause is no one's missed deadline). Never hangs."""
        paused0 = self.pauses.total
        while not done():
            remaining = deadline + (self.pauses.total - paused0) - self.clock.now()
            if remaining <= 0:
                return False
            self._wakeup.clear()
            try:  # asyncio.timeout: unlike wait_for (3.11), it never swallows a cancellation
                async with asyncio.timeout(min(remaining, self.timing.heartbeat_interval_s)):
                    await self._wakeup.wait()
            except TimeoutError:
                pass
        return True

    async def _join(self) -> None:
        """Wait until ``min_peers`` members (ourselves included) completed a handshake
        (RoundProcedures.join). A peer resuming mid-run needs just one of its old
        cohort. With ``stop_if_alone``, a first start needs one other peer at least,
        and sets ``stopped_alone`` (no round runs) when none joined in time."""
        mem = self.membership
        need = self.core.join_need(self.stop_if_alone)  # (for the messages below)
        outcome = await self._drive(self.procedures.join(self.stop_if_alone))
        if outcome != JOINED:
            causes = sorted({c for c in (self.transport.dial_failure(a) for a in
                                         [a for _, a in self.bootstrap]
                                         + [m.address for m in mem.members.values()]) if c})
            if outcome == ALONE:
                self.stopped_alone = nobody_joined(
                    self.cohort.algorithm, [a for _, a in self.bootstrap],
                    self.timing.join_timeout_s, causes, refused=self.dropped["refused"] > 0)
                return
            # The join's own count (a handshake each), not the live view: a member only
            # suggested (one that refused our hello) read "only 4 of 4 peers joined".
            greeted, departed = self.procedures.cohort_so_far()
            joined = 1 + len(greeted) + departed
            if self.refusals():
                causes.append("hellos were refused (the reasons are logged above)")
            log.warning("%s: only %d of %d peers joined (none new for %.0fs: %s); starting "
                        "anyway%s", self.id, joined, need, self.timing.join_timeout_s,
                        ", ".join(sorted({self.id, *greeted})),
                        "".join(f"; {c}" for c in causes))
            self._observe("join_short", self, joined=joined, need=need, causes=causes)
        log.info("%s: cohort %s", self.id, ", ".join(mem.live_view()))

    # ================================================================ rounds

    async def _run_rounds(self) -> None:
        await self._join()
        if self.stopped_alone:
            return
        self._observe("started", self, round=self.round)
        await self._drive(self.procedures.rounds(self.cohort.rounds, self.evaluate_every))

    def _begin_round(self) -> None:
        """RoundBegins: the round's accounting starts; members' seed sets that arrived
        meanwhile go to the method."""
        self.ledger.begin(self.clock.now(), self.transport.stats, self.sent)
        if self.seeds is not None:
            for owner, (x, y) in sorted(self.seeds.take_completed().items()):
                self.alg.add_peer_seeds(owner, x, y)

    #: With ``inline_short_calls``: calls shorter than this last time run on the loop.
    INLINE_BELOW_S = 0.005

    async def _compute_call(self, fn, *args) -> Any:
        """One of the method's calls, its time and CPU counted, in a worker thread so that
        heartbeats never wait behind a step; with ``inline_short_calls`` (every peer of
        the process on this loop) on the loop when the same call took under
        :attr:`INLINE_BELOW_S` of wall and CPU last time: a thread hop and the GIL's
        hand-offs cost more than such a call (docs/runtime.md, One peer, one event loop)."""
        t = time.perf_counter()
        timed, name = self.ledger.cpu_timed(fn), getattr(fn, "__name__", "")
        try:
            if self._short is not None and name and self._short.get(name):
                out = timed(*args)
                await asyncio.sleep(0)  # the other peers' turn (rounds with no exchange)
            else:
                out = await self._run_blocking(timed, *args)
        finally:  # a call that raised is measured too
            if self._short is not None and name:
                self._short[name] = max(self.ledger.last_call) < self.INLINE_BELOW_S
            self.ledger.compute[0] += time.perf_counter() - t
        return out

    async def _round_done(self, done: do.RoundDone) -> None:
        """RoundDone: the round's record; with an evaluation, its line in metrics.jsonl
        (the rounds between folded in), the checkpoint and ``on_round``."""
        mem = self.membership
        # What this life has sent so far, by type (a round's traffic is the difference
        # from the note before): the typed event benchmarks count messages from.
        self._observe("sent", self, round=done.round, types={
            t: [n, self.out.sent_bytes[t]] for t, n in sorted(self.sent.items())})
        record = self.ledger.end(done, self.clock.now(), self.transport.stats, self.sent, {
            "live_peers": mem.live_count(),
            # ourselves and every member heard from in this life, whatever its status now
            "met_peers": 1 + mem.confirmed_count(),
            "dropped": sum(self.dropped.values()), "incarnation": self.incarnation,
            "aggregate_disagreements": sum(len(p) for p in self.disagreements.values())})
        if record is None:  # not evaluated: no line, no checkpoint
            return
        if self._hold_round is not None:
            await self._hold_round(done.round, self)
        if self.on_checkpoint is not None:
            await self._run_blocking(self.on_checkpoint, done.round, self)
            self._observe("checkpointed", self, round=done.round)
        if self.on_round is not None:
            self.on_round(record)

    async def _drive(self, procedure) -> Any:
        """Carry out a round procedure (hfl.peer.procedures): each instruction it yields,
        in order, its answer sent back in; an exception (a cancellation, an injected
        crash) is thrown into it where it waits. Returns the procedure's value."""
        step, value = procedure.send, None
        while True:
            try:
                ins = step(value)
            except StopIteration as done:
                return done.value
            try:
                value, step = await self._perform(ins), procedure.send
            except BaseException as err:  # noqa: BLE001 -- raised again inside the procedure
                value, step = err, procedure.throw

    async def _perform(self, ins: do.Instruction) -> Any:
        """One instruction of a round procedure; only waits, sends, the method's calls,
        the entered-round record and the round's record suspend the round."""
        if isinstance(ins, do.Wait):
            return await self._wait_until(ins.done, ins.deadline)
        if isinstance(ins, do.Send):
            return await self.out.send_to(ins.address, ins.msg, ins.timeout_s)
        if isinstance(ins, do.Broadcast):
            return await self._broadcast(ins.peer_ids, ins.msg, ins.timeout_s)
        if isinstance(ins, do.Compute):
            return await self._compute_call(getattr(self.alg, ins.call), *ins.args)
        if isinstance(ins, do.Aggregate):
            return await self._compute_call(self.alg.aggregate, ins.round, ins.contributions)
        if isinstance(ins, do.StartCompute):
            assert self._started is None, "a started call was never joined"
            self._started = asyncio.ensure_future(
                self._compute_call(getattr(self.alg, ins.call), *ins.args))
            return None
        if isinstance(ins, do.JoinCompute):  # shielded: a cancelled round leaves it to run()
            started, self._started = self._started, None
            try:
                return await asyncio.shield(started)
            except asyncio.CancelledError:
                self._started = started
                raise
        if isinstance(ins, do.RoundBegins):
            return self._begin_round()
        if isinstance(ins, do.RoundDone):
            return await self._round_done(ins)
        if isinstance(ins, do.EnterRound):
            if self._on_enter_round is not None:
                await self._run_blocking(self._on_enter_round, ins.round)
            return None
        self._do(ins)
        return None

    def _maybe_crash(self, r: int, *phases: str) -> None:
        f = self.fault
        if f.crash_at_round == r and f.crash_phase in phases and self.incarnation == 0:
            log.critical("%s: injected crash in round %d (%s)", self.id, r, f.crash_phase)
            self._observe("crash", self, round=r, phase=f.crash_phase)
            self._crash(f.exit_code)

    async def _leave(self, reason: str) -> None:
        if self.membership is None or self.transport is None:
            return
        bye = self.core.goodbye(reason)  # best effort and brief: a peer that already
        if bye is not None:  # closed must not delay our exit
            await self.out.broadcast(bye.peer_ids, bye.msg, timeout_s=bye.timeout_s)


class NodeFailed(RuntimeError):
    """The node's own receive or tick loop died: the peer stops (see Node._task_done)."""


async def _all(sends) -> None:
    await asyncio.gather(*sends)


def _hard_exit(code: int) -> None:
    """Die like a SIGKILLed process: no goodbye, no cleanup, no checkpoint."""
    import os

    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)
