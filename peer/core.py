"""The protocol's decisions for one peer, with no I/O: the rules that keep a cohort safe.

:class:`PeerCore` holds one peer's protocol state (its membership view, its
round buffer, the round and aggregator epoch it is in, the result it absorbed
last) and answers every question the round engine asks: may this message be
taken, which result may be used, whom to wait for, when to stop waiting, when
to fail over, how many contributions a result needs. It never sends, sleeps or
reads a clock: times come in as arguments (``now``; ``round_began`` is set by
the shell), so each rule can be tested on a hand-built view, and the
deterministic simulator (:mod:`hfl.launch.sim`) checks the whole cohort's
history against the invariants these rules are meant to keep.

:class:`~hfl.peer.node.Node` is the shell: it owns sockets, tasks and the
worker thread, and calls these methods. PROTOCOL.md names the method that
implements each of its rules.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import logging
import math
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from hfl.peer.instructions import (
    WAKE,
    Broadcast,
    Dropped,
    Forget,
    Instruction,
    MemberChanged,
    NamedEquivocator,
    Refused,
    Reply,
    Say,
    Send,
    SendTo,
    ServeSeeds,
)
from hfl.peer.membership import (
    ALIVE,
    DEAD,
    LEFT,
    SUSPECT,
    Membership,
    elect,
    rotation_candidate,
)
from hfl.peer.rounds import RoundBuffer
from hfl.protocol import (
    DEFAULT_MAX_MESSAGE_MIB,
    Ack,
    AggregateResult,
    Commit,
    Error,
    ErrorCode,
    Gossip,
    Heartbeat,
    Hello,
    Knowledge,
    Leave,
    Message,
    ProtocolError,
    Relayed,
    SeedChunk,
    SeedRequest,
    Welcome,
)
from hfl.protocol.codec import dtype_name

#: swim: membership news items a heartbeat carries, at most
NEWS_PER_MESSAGE = 6
#: swim: member records in one anti-entropy gossip, at most (a sample of the view).
GOSSIP_SAMPLE = 16
#: swim: hellos sent in one tick, at most (a late joiner greets a big cohort in steps).
GREETINGS_PER_TICK = 256
#: swim: probes an aggregator candidate gets from the waiting members per interval, about:
#: each member probes it every ceil(N / this) intervals, at a phase of its own.
CONTACT_PROBES_PER_TICK = 16


@dataclass(frozen=True)
class Drop:
    """A message not taken: the counter it goes to and the reason that is logged."""

    code: str
    reason: str


def refusal(msg: Error) -> Drop:
    """An ``error`` refusing one of our messages, as the shell says it (a Refused line)."""
    return Drop("refused", f"{msg.sender} refused our {msg.ref_type or 'message'}: "
                           f"{msg.code}: {msg.reason}")


#: A hello's ``shared`` terms that stay off the wire at their default (a hello is then
#: as before the option existed), and what their absence means: the values a refusal
#: names, and what a peer that sends the default explicitly agrees with.
SHARED_ABSENT = {"aggregate_everywhere": 0, "communicate_every": 1, "overlap": 0, "run": 0,
                 "max_message_mib": DEFAULT_MAX_MESSAGE_MIB}


def hello_terms(cohort: Any, mode: str, num_classes: int, everywhere: bool,
                shared: dict[str, int], part: int = 0) -> dict[str, Any]:
    """What a hello must agree on (PROTOCOL.md, ``hello``) for a peer of ``cohort`` (its
    CohortConfig) running a method in ``mode``; ``shared``: the method's dimensions and
    the data split's; ``part``: 1 + the part of that split this peer trains on (0: none),
    which must differ. Raises ValueError (naming the option) for a cohort option that
    does not apply to the mode."""
    every, fanout = getattr(cohort, "communicate_every", 1), getattr(cohort, "fanout", None)
    overlap = getattr(cohort, "overlap", False)
    if every != 1 and mode == "local":
        raise ValueError(f"cohort.communicate_every: applies to methods that share; "
                         f"{cohort.algorithm} trains alone. Remove cohort.communicate_every")
    if fanout is not None and mode != "broadcast":
        raise ValueError(f"cohort.fanout: applies to broadcast-mode methods (fedh2l, mdhfl, "
                         f"...); {cohort.algorithm} runs in {mode} mode. Remove cohort.fanout")
    if overlap and mode != "broadcast":
        raise ValueError(f"cohort.overlap: applies to broadcast-mode methods (fedh2l); "
                         f"{cohort.algorithm} runs in {mode} mode. Remove cohort.overlap")
    return {"cohort": cohort.name, "algorithm": cohort.algorithm, "num_classes": num_classes,
            "rounds": cohort.rounds, **({"part": part} if part else {}),
            "shared": {**shared, **({"aggregate_everywhere": 1} if everywhere else {}),
                       **({"fanout": fanout} if fanout is not None else {}),
                       **({"communicate_every": every} if every != 1 else {}),
                       **({"overlap": 1} if overlap else {}),
                       **({"run": run} if (run := getattr(cohort, "run", 0)) else {})}}


def signing_context(cohort: Any) -> str:
    """What signed statements name as their cohort (:meth:`PeerCore.statement`): its name,
    and its run's id where it has one (``cohort.run``). Without the run, statements of
    one cohort name were valid in every run of it with the same keys: a member replayed
    an honest member's contribution signed in an earlier run as a proof of equivocation
    (the member was left out for the rest of the run), or an earlier run's commit (an
    attack review)."""
    run = getattr(cohort, "run", 0)
    return f"{cohort.name}#{run}" if run else cohort.name


#: What a mismatch of a hello's field usually means, where its name does not say.
MISMATCH_HINTS = {
    "num_parameters": " (one model for the whole cohort, of another size here: a model of "
                      "the same arch differs in size when the input shape, model.options or "
                      "the number of classes differ; hfl-launch --dry-run names each peer's)",
}


class PeerCore:
    """One peer's protocol state and rules (see the module docstring)."""

    def __init__(self, self_id: str, *, mode: str, everywhere: bool, lookahead: int,
                 start_round: int = 1, quorum: int | None = None,
                 allowed_peers: frozenset[str] | None = None, cohort_size: int = 1,
                 cohort: str = "", signer=None, verify_keys: dict[str, bytes] | None = None,
                 byzantine: int | None = None, communicate_every: int = 1, last_round: int = 0,
                 incarnation: int = 0, swim: bool = False, timing: Any = None,
                 rng: random.Random | None = None, bootstrap: tuple = (), seeds: Any = None,
                 capabilities: list[str] | None = None, hello_terms: dict[str, Any] | None = None,
                 sit_out_through: int = 0):
        self.id = self_id
        # cohort.communicate_every: the rounds that exchange (communicates); the others
        # are local steps, which peers run at their own pace (0 last_round: no last round)
        self.communicate_every = communicate_every
        self.last_round = last_round
        self.finished_by: set[str] = set()  # members whose goodbye came after the last round
        self.revoked: set[str] = set()  # members the allow-list removed, until put back
        # Signed acks and certified commits (the allow-list's signing keys; see "Commit").
        self.cohort = cohort  # signed statements name their cohort: never valid in another
        self.signer = signer  # bytes -> 64-byte Ed25519 signature (None: acks go unsigned)
        #: peer -> raw Ed25519 verification key; None: commits carry no certificate and
        #: one member's word (the aggregator's) commits a result
        self.verify_keys = verify_keys
        self._verifiers: dict[bytes, Any] = {}  # verification key -> its parsed key object
        self.byzantine_config = byzantine  # node.byzantine (None: 1 where certifying)
        self.mode = mode  # the algorithm's: "broadcast", "aggregator" or "local"
        self.everywhere = everywhere  # aggregator mode with every peer aggregating itself
        self.quorum_config = quorum  # node.quorum (None: a majority)
        self.cohort_size = cohort_size  # node.min_peers: the cohort a majority is at least of
        self.allowed_peers = allowed_peers  # the CURVE allow-list (None: anyone)
        self.membership: Membership | None = None  # set once the transport is bound
        # The lookahead counts exchanging rounds: a peer still in its local rounds keeps
        # what the next exchanges bring (with communicate_every 1, rounds).
        self.buffer = RoundBuffer(lookahead=lookahead * communicate_every, round=start_round)
        self.round = start_round
        self.epoch = 0  # the aggregator epoch of this round this peer is at
        self.round_began = 0.0  # clock time the current round started
        self.joining = True  # until the join ends (RoundProcedures.join)
        self._asked_view_at = -math.inf  # lazy join: when we last asked a member for its view
        #: peer -> (incarnation, why) of a hello we refused: nothing else from that life
        #: or an earlier one is taken until it agrees (refused_life)
        self.refused_lives: dict[str, tuple[int, str]] = {}
        #: lazy join: (member, incarnation) -> how much of its view we have (its view_upto)
        self._view_cursor: dict[tuple[str, int], int] = {}
        #: member -> (its digest, ours, when) of our last ask made on a digest that differed
        self._asked_about: dict[str, tuple[int, int, float]] = {}
        self._seed_served: dict[tuple[str, int], float] = {}  # (asker, chunk) -> when sent
        #: lazy join: the first members a bootstrap peer heard from (view_sources)
        self._hubs: list[str] = []
        self.epoch_began = 0.0  # clock time this peer reached its current epoch of the round
        # How long after reaching an epoch another peer's word of its own epoch is news:
        # one heartbeat interval and a half (set by the node; a heartbeat sent as that
        # peer failed over too may still say its old epoch).
        self.epoch_news_after_s = 0.0
        self.absorbed: tuple[int, str, str] = (0, "", "")  # (round, digest, from whom)
        #: round -> peers whose heartbeat said they absorbed another aggregate for it
        self.disagreements: dict[int, set[str]] = {}
        # The commit protocol (an elected aggregator's rounds; see "Commit" below).
        # round -> the result accepted last, and its digest
        self.accepted: dict[int, tuple[AggregateResult, str]] = {}
        self.acks: dict[tuple[int, int, str], set[str]] = {}  # our (round, epoch, digest) -> ackers
        self.ack_sigs: dict[tuple[int, int, str], dict[str, str]] = {}  # ... -> acker -> signature
        #: the last commit this peer sent as aggregator: sent again to an ack of it that
        #: comes after (its commit was lost), also once this peer is in a later round
        self.last_commit: Commit | None = None
        #: the result of :attr:`last_commit`, when it was committed, and the members that
        #: need it no more: they acked it (before the commit or after), or it went to them
        #: once more (:meth:`result_for_straggler`)
        self.last_result: tuple[AggregateResult, float] | None = None
        self.result_settled: set[str] = set()
        self.commits: set[tuple[int, str]] = set()  # (round, digest) its aggregator committed
        # The relay (where commits are certified; :meth:`relay_for`, :meth:`take_relayed`).
        #: (round, digest) -> (epoch, the signed acks that checked) of each commit taken
        self.certificates: dict[tuple[int, str], tuple[int, dict[str, str]]] = {}
        #: the result this peer absorbed last as a member, with its commit's epoch and
        #: certificate and when: relayed to a contributor still waiting for it
        self.relayable: tuple[AggregateResult, int, dict[str, str], float] | None = None
        self.relayed_to: set[str] = set()  # members it was relayed to (once each)
        self.relayed_by: dict[int, str] = {}  # round -> the member that relayed its result to us
        self.relays_taken: set[tuple[str, int]] = set()  # (relayer, round): one handled each
        # Copies (rev. 18; :meth:`copy_for`, :meth:`take_copy`): as aggregator of a later
        # epoch, (round, epoch, digest, its reporters) of the one reported result it holds
        # no copy of, asked for; the copies that came, by round; as a member, (asker,
        # round) sent one already
        self.copy_wanted: tuple[int, int, str, tuple[str, ...]] | None = None
        self.copies: dict[int, AggregateResult] = {}
        self.copies_sent: set[tuple[str, int]] = set()
        #: (round, epoch, aggregator) whose result was refused as unjustified (rev. 15): a
        #: proven fault, which a waiting member fails over from (stop_waiting_for)
        self.refused_results: set[tuple[int, int, str]] = set()
        #: the last refusal found too few promises for this peer's quorum of now, a
        #: measure of its own view (unjustified_result): no proof of a fault
        self.short_of_promises = False
        #: (result, payload digest) of the last two results digested (digest_of)
        self._digests: list[tuple[Any, str]] = []
        # Rounds up to this one were entered by an earlier life of this peer, which may
        # have acked a result there; restarted, it forgot what: it sits them out (no
        # contribution, no ack), as an acceptor that crashed for good would.
        self.sit_out_through = sit_out_through
        # cohort.fanout: the peers whose knowledge this round is scheduled to reach us
        # (None: every live peer's; see exchange_plan).
        self.sources: set[str] | None = None
        self._awaited_hint: dict[int, str] = {}  # round -> a peer found awaited (awaits_any)
        #: Members that owed us their knowledge when a wait of ours ended without it.
        #: Later waits give them only ``straggler_s`` once every
        #: other awaited member's knowledge is in, until knowledge of theirs comes again
        #: (RoundProcedures.await_knowledge). A member that kept answering heartbeats and
        #: never contributed cost every round its whole round_timeout_s.
        self.late: set[str] = set()
        #: Aggregators we waited for a second time (alive and serving, no result) that
        #: never delivered: no second wait for them again until a result of theirs comes.
        self.late_aggregators: set[str] = set()
        #: peer -> (incarnation, round) it said (heartbeat ``sitting_out``) it sits out
        self.sitting_out: dict[str, tuple[int, int]] = {}
        # Equivocation (every peer aggregating, signing keys): (round, sender) -> the
        # (epoch, digest, sig) of the first signed contribution it sent us;
        # round -> those this peer aggregated (told to the others with its next
        # contribution); peer -> the proof that it signed two versions of one round.
        self.signed_knowledge: dict[tuple[int, str], tuple[int, str, str]] = {}
        self.heard: dict[int, dict[str, tuple[int, str, str]]] = {}
        self.equivocators: dict[str, str] = {}
        self.named: set[str] = set()  # equivocators this peer has said it leaves out
        #: member -> the highest round its heartbeats said it absorbed a result of
        self.absorbed_by: dict[str, int] = {}
        self.incarnation = incarnation
        self.swim = swim  # timing.membership: swim-style detection (news in heartbeats)
        #: what a hello must agree on: cohort, algorithm, num_classes, rounds, shared
        self.hello_terms: dict[str, Any] = hello_terms or {}
        # swim: members may wait for our hello (the shell scans the view on its tick)
        self.to_greet = True
        #: (the peers it went to, knowledge): this peer's latest knowledge, sent again to
        #: one of them that says it is still awaiting it (heartbeat ``awaiting``)
        self.sent_knowledge: tuple[frozenset[str], Knowledge] | None = None
        #: whether that knowledge went to every live member (a decentralized round with no
        #: ``cohort.fanout`` plan): then a member that joined after it went out, and asks
        #: for it, is one it would have gone to (:meth:`asks_again`)
        self.sent_to_every_member = False
        #: in a decentralized round, the knowledge sent before :attr:`sent_knowledge` (the
        #: exchange just past) and its receivers: one whose copy was lost asks for it
        #: after this peer shared its next (:meth:`asks_again`, :meth:`finished_without`)
        self.sent_before: tuple[frozenset[str], Knowledge] | None = None
        self.sent_before_to_every = False  # (as sent_to_every_member, for sent_before)
        self._asks_answered: dict[tuple[str, int, int], float] = {}  # (asker, round, epoch) -> when
        # Ticking (:meth:`tick_greetings`, :meth:`tick_sends`, :meth:`link_changed`).
        # ``timing`` is the peer's TimingConfig; ``rng`` the peer's seeded draws.
        self.timing: Any = None
        if timing is not None:
            self.set_timing(timing)
        self.rng = rng or random.Random(0)
        self.bootstrap: tuple[tuple[str | None, str], ...] = bootstrap  # (peer id or None, address)
        #: the peer's public seed sets (a hfl.peer.seeds.SeedStore; None: it exchanges
        #: none): which chunks of each member's set it still misses
        self.seeds = seeds
        self.capabilities: list[str] = capabilities or [mode]
        # Peers this round depends on (its aggregator candidates): with swim, probed every
        # ceil(N / CONTACT_PROBES_PER_TICK) intervals (each interval in cohorts of up to 16).
        self.contacts: set[str] = set()
        self.probe_calls = 0  # swim: probe calls so far, and this peer's phase in them
        self.phase = zlib.crc32(self_id.encode())

    # ================================================================ handling a message
    #
    # Every decision about a received message, as instructions for the shell
    # (hfl.peer.instructions): what goes back, what is dropped and why, whose status
    # changed, when a waiting round should look again. The shell decodes and executes.

    def set_timing(self, timing: Any) -> None:
        """The peer's ``timing`` section, and what the rules derive from it."""
        self.timing = timing
        self.epoch_news_after_s = 1.5 * timing.heartbeat_interval_s

    def open_view(self, address: str, rng: random.Random) -> Membership:
        """This peer's membership view, reachable at ``address`` (after :meth:`set_timing`,
        ``swim`` and ``incarnation``). Crash hints (issue 36): a link that drops makes
        its peer dead after two heartbeats of silence, probes included, rather than
        ``dead_after_s``."""
        t = self.timing
        self.membership = Membership(self.id, address, self.incarnation, t.suspect_after_s,
                                     t.dead_after_s, mode="swim" if self.swim else "full", rng=rng)
        self.membership.hint_dead_s = min(2 * t.heartbeat_interval_s,
                                          (t.suspect_after_s + t.dead_after_s) / 2)
        self.membership.lazy = self.lazy_join
        return self.membership

    @property
    def lazy_join(self) -> bool:
        """``timing.join: lazy`` (PROTOCOL.md, *Lazy join*): with swim and an elected
        aggregator, members vouched for by ``f + 1`` others count for the join and the
        rotation order, and a member is greeted when first probed (``Membership.lazy``).
        (Where every member sends to every other each round, greeting them all costs
        nothing more, and the node refuses the option.)"""
        return (self.swim and getattr(self.timing, "join", "greet") == "lazy"
                and self.elected)

    @property
    def elected(self) -> bool:
        """An aggregator elected per round serves the cohort (not broadcast, not every
        peer aggregating for itself)."""
        return self.mode == "aggregator" and not self.everywhere

    def envelope(self) -> dict[str, Any]:
        return {"sender": self.id, "incarnation": self.incarnation}

    def heartbeat(self, **probe: Any) -> Heartbeat:
        """This peer's heartbeat now (with swim, carrying membership news)."""
        return Heartbeat(
            **self.envelope(), round=self.round, epoch=self.epoch,
            absorbed_round=self.absorbed[0], absorbed_digest=self.absorbed[1],
            sitting_out=self.round if self.round <= self.sit_out_through else 0,
            members=self.membership.news(NEWS_PER_MESSAGE) if self.swim else [],
            view=self.view_digest() if self.membership.lazy else 0, **probe)

    def view_digest(self) -> int:
        """A digest of our rotation order (lazy join): Membership.order_digest."""
        return self.membership.order_digest()

    def knowledge(self, r: int, payload: Any, epoch: int = 0) -> Knowledge:
        """This peer's knowledge for round r (``payload``: the method's Payload, None: a
        message with nothing in it), carrying its accepted marker, what it heard (every
        peer aggregating), the equivocators it knows, and its signature when signing."""
        kind, meta, tensors = ("none", {}, {}) if payload is None else (
            payload.kind, payload.meta, payload.tensors)
        accepted_epoch, accepted_digest = self.marker(r)
        heard_round, heard = self.heard_report() if self.everywhere else (0, {})
        msg = Knowledge(**self.envelope(), round=r, kind=kind, epoch=epoch,
                        accepted_epoch=accepted_epoch, accepted_digest=accepted_digest,
                        meta=meta, tensors=tensors, heard_round=heard_round,
                        heard=heard, equivocations=dict(self.equivocators))
        if self.signer is None:
            return msg
        promise = {}
        if self.certifying and self.elected:
            promise = dict(promise_sig=self.promise_sig(r, epoch, accepted_epoch, accepted_digest),
                           proofs=self.accepted_proofs(r) if accepted_epoch >= 0 else {})
        return dataclasses.replace(msg, sig=self.sign("knowledge", r, epoch, payload_digest(msg)),
                                   **promise)

    #: swim: members a goodbye goes to directly, at most.
    LEAVE_FANOUT = 16

    def goodbye(self, reason: str) -> Broadcast | None:
        """The ``leave`` this peer sends as it stops (None: nobody to tell): to every
        live member, or with swim in a big cohort to a sample of them and the members
        this round depends on (each receiver passes the news on; the others then probe
        us, find us gone and mark us dead)."""
        mem = self.membership
        targets = list(mem.live_ids())
        if self.swim and len(targets) > self.LEAVE_FANOUT:
            targets = sorted(set(self.rng.sample(targets, self.LEAVE_FANOUT))
                             | (self.contacts & set(targets)))
        if not targets:
            return None
        return Broadcast(tuple(targets), Leave(**self.envelope(), reason=reason, round=self.round),
                         timeout_s=0.2)

    def hello(self, introduced: bool = False, view_from: int = 0) -> Hello:
        """This peer's handshake (``introduced``: to a member gossip suggested;
        ``view_from``: lazy join, an ask for the rest of the receiver's view)."""
        terms = self.hello_terms
        return Hello(
            **self.envelope(), address=self.membership.self_address, cohort=terms["cohort"],
            algorithm=terms["algorithm"], num_classes=terms["num_classes"],
            rounds=terms["rounds"], round=self.round, shared=terms["shared"],
            capabilities=list(self.capabilities), introduced=int(introduced),
            view_from=view_from, part=terms.get("part", 0),
        )

    def ask_view(self, peer_id: str) -> Send:
        """Lazy join: ask ``peer_id`` for the members it heard from itself that its last
        answer to us did not hold (its whole view the first time)."""
        m = self.membership.members.get(peer_id)
        if m is None:  # a bootstrap peer that has not answered us yet
            return Send(dict(self.bootstrap)[peer_id], self.hello(), 0.05, peer_id)
        start = self._view_cursor.get((peer_id, m.incarnation), 0)
        return Send(m.address, self.hello(view_from=start), 0.05, peer_id)

    # ================================================================ ticking
    #
    # Every heartbeat_interval_s the shell asks in two steps: the membership's timeouts
    # and the hellos (:meth:`tick_greetings`), then, once those are out, the heartbeats,
    # probes and gossip (:meth:`tick_sends`): a heartbeat racing ahead of our hello on a
    # socket that is still connecting reaches a peer that does not know us yet.

    def undecodable(self, identity: str, err: ProtocolError) -> list[Instruction]:
        """A message from ``identity`` failed to decode or validate (``err``): dropped
        with its reason; a member whose message had a type or protocol version we do
        not understand (a newer peer) is told so, politely."""
        out: list[Instruction] = [Dropped(err.code, f"from {clip(identity)}: {err}")]
        address = self.membership.address_of(identity)
        if address and err.code in (ErrorCode.UNKNOWN_TYPE, ErrorCode.VERSION_MISMATCH):
            out.append(Reply(address, Error(**self.envelope(), code=err.code,
                                             reason=clip(err.reason, 200),
                                             ref_type=err.ref_type), identity))
        return out

    def join_need(self, stop_if_alone: bool = False) -> int:
        """Peers (ourselves included) the join waits for: ``node.min_peers``; a resumed
        peer just one of its old cohort; with ``stop_if_alone``, at least one other."""
        if self.round > 1:
            return min(self.cohort_size, 2)
        return max(self.cohort_size, 2) if stop_if_alone else self.cohort_size

    def stood_still(self, late_s: float) -> bool:
        """This peer's tick came ``late_s`` seconds after it was due. A whole interval
        late: its loop or machine is overloaded, so it is slower to blame (Lifeguard's
        local health, :meth:`Membership.ran_late`). Beyond two intervals and half of
        ``suspect_after_s``: it was not running (SIGSTOP, a stalled loop), and the
        others' silence over that time is its own (:meth:`Membership.paused`); True
        then, and the shell reads its inbox before the tick judges anyone."""
        interval = self.timing.heartbeat_interval_s
        if late_s >= interval:
            self.membership.ran_late()
        if late_s > max(2 * interval, self.timing.suspect_after_s / 2):
            self.membership.paused(late_s)
            return True
        return False

    def allow_list_changed(self, allowed: frozenset[str], removed: frozenset[str],
                           sign_keys: dict[str, bytes] | None = None) -> list[Instruction]:
        """The CURVE allow-list was reloaded: only ``allowed`` may be members from now on,
        and each peer ``removed`` from it stops being one at once. ``sign_keys``: the
        allow-list's signing keys, which certified commits are checked against."""
        self.allowed_peers = allowed
        if self.certifying and sign_keys is not None:
            self.verify_keys = {p: k for p, k in sign_keys.items() if p in allowed}
        out: list[Instruction] = []
        for peer in sorted(removed):
            m = self.membership.members.get(peer)
            if m is not None and self.membership.left(peer, m.incarnation):
                self.revoked.add(peer)
                out += [Say(logging.WARNING, "%s: %s removed from the allow-list: no longer a member",
                            (self.id, peer)), WAKE]
        for peer in sorted(self.revoked & allowed):
            # Put back on the list: its life did not end, so its next message at the same
            # incarnation must bring it back (it stayed gone until it restarted, while
            # the docs promise a key added joins without a restart: a review).
            self.revoked.discard(peer)
            if self.membership.readmit(peer):
                out += [Say(logging.INFO, "%s: %s back on the allow-list: greeting it",
                            (self.id, peer)), WAKE]
        return out

    def tick_greetings(self, tick: int, now: float) -> list[Instruction]:
        mem, timing = self.membership, self.timing
        out: list[Instruction] = []
        for change in mem.tick(now):
            out += [MemberChanged(change, logging.WARNING), WAKE]
        # Bootstrap until someone live answers; then greet whoever gossip taught us. A
        # resumed peer remembers its cohort at the addresses of its last run, which on
        # a cluster (a resubmitted SLURM job) are all new: the bootstrap finds them.
        # A dead member is greeted again once per dead_after_s: restarted at the same
        # address with no checkpoint (killed before its first), it remembers nobody, and
        # drops our heartbeats as "unknown peer" until our hello introduces us.
        regreet = tick % max(1, round(timing.dead_after_s / timing.heartbeat_interval_s)) == 0
        if not mem.any_greeted_alive():
            hello = self.hello()
            out += [Send(a, hello, 0.05, peer) for peer, a in self.bootstrap
                    if a != mem.self_address and peer != self.id]
        elif regreet:
            # A bootstrap peer never heard from, once per dead_after_s: it may have started
            # after us. (Only until someone answered, before: ten peers started at once,
            # each bootstrapping from the one before it, split for good into p0-p3 and
            # p4-p9, whose p4 was first greeted by p5 before p3 listened; an attack review.)
            # (Named ones only: a bootstrap address alone may be answered from another
            # address, a member's advertised one, and would be greeted for good.)
            hello = self.hello()
            out += [Send(a, hello, 0.05, peer) for peer, a in self.bootstrap
                    if peer and peer != self.id and peer not in mem.members
                    and peer not in self.refused_lives and a != mem.self_address]
        # A member silent to us that gossip places somewhere else (a lead): greeted there
        # when a reporter first names the place, then once per dead_after_s with the dead
        # (a member must not make every peer send a hello a tick to a place it names).
        # With swim, at most GREETINGS_PER_TICK members' leads a tick, the rest next tick.
        fresh = mem.take_fresh_leads(GREETINGS_PER_TICK if self.swim else None)
        places = [(a, m.peer_id) for m in fresh for a in mem.lead_places(m)]
        # Members greeted in our view (introduced: they need not send a member list back).
        # With swim the scan (O(N)) runs while someone is left to greet, and once per
        # dead_after_s: a thousand peers in one process must not each scan every tick.
        # Lazy join: a member in our rotation order (vouched for) is greeted by our first
        # probe to it. Once joined, one we know of from a suggestion alone is greeted now,
        # so that our order catches up with the cohort's (and our elections with theirs);
        # while joining, the asks to the bootstrap bring the cohort in.
        lazy = mem.lazy
        if lazy and self.joining and not regreet:
            self.to_greet = False  # (a lazy joiner greets no one here: nothing to scan for)
        elif not self.swim or regreet or self.to_greet:
            order = mem.order_ids() if lazy else ()
            for m in mem.members.values():
                # (a dead member only at a regreet: one never heard from, at an address
                # gossip gave, got a hello every tick for the rest of the run)
                if ((not m.greeted and m.status not in ("left", "dead")
                     and not (lazy and (self.joining or m.peer_id in order)))
                        or (regreet and m.status == "dead")):
                    places.append((m.address, m.peer_id))
                if regreet and m.leads:
                    places += [(a, m.peer_id) for a in mem.lead_places(m)]
            self.to_greet = len(places) > GREETINGS_PER_TICK
        if self.swim:  # a late joiner greets a big cohort over a few ticks, not at once
            again = {(m.address, m.peer_id): None for m in mem.owing_hellos(now)}
            places = [*again, *(p for p in places if p not in again)][:GREETINGS_PER_TICK]
            if not self.joining:  # (a never-greeted member owes an answer from now; not
                for _, peer in places:  # while this peer's own join runs: a cohort of 200
                    mem.greeting(peer, now)  # forming over a lossy network joined late)
        if places:
            hello = self.hello(introduced=True)
            out += [Send(a, hello, 0.05, peer) for a, peer in places]
        if lazy and self.joining and tick % 2 == 0 and mem.any_greeted_alive() and (
                len(mem.rotation_order()) < self.cohort_size):
            # Lazy join, short of node.min_peers: ask reports_needed members for the rest
            # of their views (a hello that is not introduced). Their records of the
            # members they heard from themselves are their reports: reports_needed of
            # them put a member in our order, without a handshake of ours.
            out += [self.ask_view(p) for p in self.view_sources(tick // 2)]
        return out

    def view_sources(self, turn: int) -> list[str]:
        """Lazy join: whom to ask for their views this time. ``reports_needed`` members
        that answered us: the bootstrap peers, in turn (every joiner greets them, so they
        hear from everyone that comes); while those are fewer, the first members a
        bootstrap peer heard from (:attr:`_hubs`: the same for every joiner, whose asks
        introduce it to them, so they hear from everyone too); then any member we
        greeted. And the bootstrap peers that have not answered yet (an ask is a hello:
        they may be starting), which count for nothing until they do."""
        mem, need = self.membership, self.membership.reports_needed
        greeted = mem.join_counts()[0]  # (alive and greeted: a few, while joining)
        boots = sorted(p for p in greeted if self._is_bootstrap(p, mem.members[p].address))
        silent = sorted(p for p, _ in self.bootstrap if p and p != self.id
                        and p not in greeted and (p not in mem.members or mem.is_live(p)))
        if len(boots) >= need:
            start = turn % len(boots)
            return (boots[start:] + boots[:start])[:need] + silent
        more = [p for p in self._hubs if p not in boots and p != self.id and mem.is_live(p)]
        more += sorted(p for p in greeted if p not in boots and p not in more)
        return boots + more[:need - len(boots)] + silent

    def _asked_lately(self, peer_id: str, view: int, now: float) -> bool:
        """Whether we asked ``peer_id`` for its view on these same two digests within
        ``dead_after_s`` (a lost ask or answer is made good then)."""
        last = self._asked_about.get(peer_id)
        return (last is not None and last[:2] == (view, self.view_digest())
                and now - last[2] < self.timing.dead_after_s)

    def _is_bootstrap(self, peer_id: str, address: str | None) -> bool:
        return any(peer_id == p or address == a for p, a in self.bootstrap)

    def tick_sends(self, tick: int, now: float) -> list[Instruction]:
        mem = self.membership
        out: list[Instruction] = []
        if self.seeds is not None and tick % 4 == 1:
            out += self.seed_requests()
        # Only peers that know us: those that answered our hello (greeted). One that has
        # not may not have it yet (a hello to a socket still in its CURVE handshake is
        # dropped, while a later heartbeat gets through) and would drop ours as unknown.
        # A peer that only said hello to us does not know us either until our welcome
        # reaches it, and that travels on another connection than our heartbeats.
        if self.swim:
            # Lifeguard: while answers come slowly (a loaded machine), probe and gossip
            # less often too, by the same factor the timeouts are stretched: the detector
            # must not add load to the load that slows it down.
            every = math.ceil(mem.patience())
            if tick % every == 0:
                out += self.probe(now)
            target = (mem.random_members(1, self.rng, lambda m: m.greeted and m.status != "left")
                      if tick % (2 * every) == 0 else [])  # drawn only when this tick gossips
            if target:  # anti-entropy: a bounded sample of the view
                sample = mem.records(sample=GOSSIP_SAMPLE, rng=self.rng)
                out.append(Send(target[0], Gossip(**self.envelope(), members=sample), 0.05,
                                to_member=True))
            return out
        targets = [p for p in mem.gossip_targets() if mem.members[p].greeted]
        if targets:
            out.append(Broadcast(tuple(targets), self.heartbeat(), 0.05))
            if tick % 2 == 0:
                fanout = self.rng.sample(targets, min(self.timing.gossip_fanout, len(targets)))
                out.append(Broadcast(tuple(fanout), Gossip(**self.envelope(), members=mem.records()),
                                     0.05))
        return out

    def seed_requests(self) -> list[Instruction]:
        """Ask each live peer for the chunks of its seed set we still miss."""
        out: list[Instruction] = []
        mem = self.membership
        for p in mem.live_peers():
            missing = self.seeds.missing(p, mem.members[p].incarnation)
            if missing != []:  # None: nothing of it yet, ask for all
                out.append(Send(mem.address_of(p), SeedRequest(
                    **self.envelope(), owner=p, chunks=missing or []), 0.05, p))
        return out

    #: A chunk of our seed set goes to one asker at most once per this many heartbeat
    #: intervals (an honest peer asks for what it misses every fourth tick).
    SEED_RESEND_INTERVALS = 2

    def seed_chunks_due(self, msg: SeedRequest, now: float) -> list[int]:
        """The chunks of our own seed set to send ``msg``'s asker: those it asks for (all
        where it names none), each once, that we did not send it within
        :data:`SEED_RESEND_INTERVALS` heartbeat intervals. A member that asked for the
        whole set in every message had it sent each time (its 30-byte ask bought the
        set's upload); chunks still on their way are not sent twice either."""
        s = self.seeds.sets.get(self.id) if self.seeds is not None and msg.owner == self.id else None
        if s is None or not s.complete:
            return []
        gap = self.SEED_RESEND_INTERVALS * self.timing.heartbeat_interval_s
        due = []
        for c in dict.fromkeys(msg.chunks or range(s.num_chunks)):
            if type(c) is int and 0 <= c < s.num_chunks:
                key = (msg.sender, c)
                if now - self._seed_served.get(key, -math.inf) >= gap:
                    self._seed_served[key] = now
                    due.append(c)
        return due

    #: swim: members owing an answer that are probed indirectly in one tick, at most.
    INDIRECT_PER_TICK = 8

    def probe(self, now: float) -> list[Instruction]:
        """This interval's probes (timing.membership swim): the next member of the
        randomized round-robin, every ceil(N / 16) calls the members this round depends
        on (:attr:`contacts`: its aggregator candidates; each call in cohorts of up to 16,
        so there their deaths and rounds are seen at the full-mode latency), and the
        members that still owe an answer, each of these again only
        after 1, 2, 4, ... intervals (``Membership.probe_due``). A probe that is such
        a repeat also goes through ``gossip_fanout`` others, which ask the member to
        answer us directly (SWIM's indirect probe: our own link may be the problem)."""
        mem = self.membership
        interval = self.timing.heartbeat_interval_s
        direct = {p for p in mem._owing if mem.probeable(p)}
        # The contacts: each waiting member probes them every ceil(N / 16) of these
        # calls, at its own phase, so an aggregator answers about 16 probes an interval
        # however big the cohort (every member each interval was N probes at it: two
        # hundred peers on two cores flooded each aggregator in turn until it was
        # declared dead).
        period = max(1, math.ceil(len(mem.members) / CONTACT_PROBES_PER_TICK))
        self.probe_calls += 1
        if (self.probe_calls + self.phase) % period == 0:
            direct |= {p for p in self.contacts if mem.probeable(p)}
        nxt = mem.next_probe()
        if nxt is not None:
            direct.add(nxt)
        probes = sorted(p for p in direct if mem.probe_due(p, now, interval))
        out: list[Instruction] = []
        # Lazy join: a member that has not answered our hello yet is probed with it (its
        # welcome is the answer), and not through others (it may not know us).
        greet = [p for p in probes if not mem.members[p].greeted]
        if greet:
            hello = self.hello(introduced=True)
            out += [Send(mem.address_of(p), hello, 0.05, p) for p in greet]
            probes = [p for p in probes if mem.members[p].greeted]
        if probes:
            out.append(Broadcast(tuple(probes), self.heartbeat(probe=1), 0.05))
        for p in (*probes, *greet):
            mem.expect(p, now)
        again = [p for p in probes if mem.members[p].probes > 1][:self.INDIRECT_PER_TICK]
        for p in again:
            helpers = mem.random_members(
                self.timing.gossip_fanout, self.rng,
                lambda m, p=p: m.peer_id != p and m.status == "alive" and m.greeted
                and m.expect_since is None)
            for h in helpers:
                out.append(Send(h, self.heartbeat(target=p), 0.05, to_member=True))
        return out

    def link_changed(self, address: str, peer_id: str | None, up: bool, now: float) -> list[Instruction]:
        """The transport saw our link to ``address`` drop or come back (issue 36). A drop
        is a hint: the peer is probed at once, directly and through ``gossip_fanout``
        others (our link may be the problem), and is dead only if nothing answers
        within ``Membership.hint_dead_s``. A SIGKILLed peer was dead only after
        ``dead_after_s`` of silence (5 s by default). A hint never declares anyone dead
        by itself: a member cannot make another look dead."""
        mem = self.membership
        if peer_id is None:  # no security: the link names an address, the view a peer
            # (a live one first: a dead member's old address reused by a live one had the
            # live one's drop hint the dead one, a review)
            at = [m for m in mem.members.values() if m.address == address]
            peer_id = min(at, key=lambda m: m.status not in ("alive", "suspect")).peer_id \
                if at else None
        if peer_id is None or peer_id == self.id or mem.address_of(peer_id) != address:
            # (a link to another address than the member's: one a member's gossip named,
            # greeted as a lead. Its drop is no news of the member: a member listened
            # there, held our connections and cut them at will, a review)
            return []
        if up:
            mem.link_back(peer_id)
            return []
        if not mem.hint(peer_id, now):
            return []
        out: list[Instruction] = [
            Say(logging.INFO, "%s: link to %s dropped: probing it", (self.id, peer_id)),
            SendTo(peer_id, self.heartbeat(probe=1), "hint-probe", 0.05)]
        helpers = mem.random_members(
            self.timing.gossip_fanout, self.rng,
            lambda m: m.peer_id != peer_id and m.status == "alive" and m.greeted)
        out += [SendTo(h, self.heartbeat(target=peer_id), "hint-probe", 0.05) for h in helpers]
        return [*out, WAKE]

    def handle(self, identity: str, msg: Message, now: float) -> list[Instruction]:
        """A decoded message from connection ``identity`` at clock time ``now``: what to do."""
        out: list[Instruction] = []
        drop = self.admit(identity, msg)
        if drop is not None and drop.code == "refused":
            # Most likely the refusal of our hello (cohort_mismatch): its reason is all a
            # misconfigured peer gets to see, so say it rather than "unknown peer".
            return [Refused(drop.reason)]
        if drop is not None:
            return [Dropped(drop.code, drop.reason)]
        mem = self.membership
        if isinstance(msg, Hello):
            return self._on_hello(msg, now)
        address = msg.address if isinstance(msg, Welcome) else None
        # The round a peer is in: from heartbeats, welcomes and its knowledge (a peer only
        # shares for the round it is in).
        round_ = msg.round if isinstance(msg, (Heartbeat, Welcome, Knowledge)) else None
        epoch_ = msg.epoch if isinstance(msg, Heartbeat) else None
        if isinstance(msg, Heartbeat):
            self.note_heartbeat(msg)
            if (missing := self.commit_missing(msg)) and (to := mem.address_of(msg.sender)):
                # Its heartbeat says it committed what we accepted; its commit (the proof)
                # never came: ack again, and it answers with the commit.
                out.append(Reply(to, Ack(**self.envelope(), round=missing[0], epoch=missing[1],
                                         digest=missing[2], sig=self.sign_ack(*missing)),
                                 msg.sender))
            if (res := self.result_for_straggler(msg, now)) and (to := mem.address_of(msg.sender)):
                # Still waiting for our committed result: its copy was lost. Once more; its
                # ack is answered with the commit (commit_of).
                out.append(Reply(to, dataclasses.replace(res, **self.envelope()), msg.sender))
            if (relay := self.relay_for(msg, now)) and (to := mem.address_of(msg.sender)):
                # It contributed, and still waits for the result we absorbed: its
                # aggregator's copy never came, or was another. Once, with the proof.
                out += [Say(logging.INFO, "%s: round %d: %s still waits for its committed "
                            "result; relaying it with its certificate",
                            (self.id, relay.round, msg.sender)), Reply(to, relay, msg.sender)]
            if why := self.compare_absorbed(msg):
                out.append(Say(logging.WARNING, "%s: round %d: %s absorbed another aggregate than "
                               "this peer (%s vs ours %s): %s",
                               (self.id, msg.absorbed_round, msg.sender,
                                clip(msg.absorbed_digest, 16), self.absorbed[1], why)))
        if isinstance(msg, Leave):
            change = mem.left(msg.sender, msg.incarnation)
            if change and 0 < self.last_round < msg.round:
                self.finished_by.add(msg.sender)  # it ran every round: see cohort_past
            address = mem.address_of(msg.sender)
            if change and address:  # its socket is not needed any more (a new life reconnects)
                out.append(Forget(address, msg.sender))
        else:
            change = mem.heard_from(msg.sender, msg.incarnation, now, address=address, round=round_,
                                    epoch=epoch_,
                                    answer=(isinstance(msg, Heartbeat) and not msg.probe
                                            and not msg.target)
                                    # (lazy: our probe of a member not greeted was a hello)
                                    or (isinstance(msg, Welcome) and mem.lazy))
        if change:
            out.append(MemberChanged(change))
            self.to_greet = True  # joined or restarted: it may need our hello
        if isinstance(msg, Heartbeat):
            out += self._on_heartbeat(msg, now)
        elif isinstance(msg, (Welcome, Gossip)):
            if isinstance(msg, Welcome) and msg.sender in mem.members:
                mem.welcomed(msg.sender)
                key = (msg.sender, msg.incarnation)
                held = self._view_cursor.get(key, 0)
                start = msg.view_upto - (len(msg.members) - 1)  # where the answer began
                if msg.view_upto and 0 <= start <= held:
                    # Lazy join: the next ask to this life of it starts where this answer
                    # ended (an answer that begins past what we hold, such as a late one
                    # from a new life to an ask of the old, leaves a gap: not taken).
                    self._view_cursor[key] = max(held, msg.view_upto)
                    if start == 0 and self._is_bootstrap(msg.sender, msg.address) and not any(
                            mem.is_live(h) for h in self._hubs):
                        # A bootstrap peer's whole view: its first members are the hubs
                        self._hubs = [r.peer_id for r in msg.members[1:5] if r.peer_id != self.id]
            suggested = [r for r in msg.members
                         if self.allowed_peers is None or r.peer_id in self.allowed_peers]
            mem.reports_needed = self.distrusted + 1
            full = mem.view_full
            new = mem.merge(suggested, now, reporter=msg.sender)
            if mem.view_full and not full:
                out.append(Say(logging.WARNING, "%s: the view holds %d members, as many as a "
                               "welcome carries: members gossip suggests beyond them are not "
                               "taken (via %s)", (self.id, len(mem.members), msg.sender)))
            if new:
                # One line a message (a welcome can teach a thousand members at once)
                out.append(Say(logging.DEBUG, "%s: learned of %d member(s) via %s: %s%s",
                               (self.id, len(new), msg.sender, ", ".join(new[:8]),
                                " ..." if len(new) > 8 else "")))
                self.to_greet = True
        elif isinstance(msg, Knowledge):
            if (drop := self.admit_knowledge(msg)) is not None:
                return [*out, Dropped(drop.code, drop.reason), *self._name_equivocators(msg.sender)]
            self.late.discard(msg.sender)  # its own knowledge, however late: back in time
            _, lie = self.check_heard(msg)
            if lie:
                out.append(Dropped("lying_claim", lie))
            out += self._name_equivocators(msg.sender)
            reason = self.buffer.offer_knowledge(msg)
            if reason:
                out.append(Dropped("stale_knowledge" if "late" in reason else "rejected_knowledge",
                                   reason))
        elif isinstance(msg, AggregateResult):
            drop = self.admit_result(msg)
            if drop is not None and drop.code == "unjustified_result" and not self.short_of_promises:
                # (from the elected sender, checked before: a proven fault, failed over
                # from as from a dead one; waited out, the round went without a result
                # for every honest peer, hfl.sim.protocol, an override twin, 7 peers. Not
                # where only this peer's quorum found too few promises: a view larger
                # than the aggregator's, not a fault, a review)
                self.refused_results.add((msg.round, msg.epoch, msg.sender))
                return [*out, Dropped(drop.code, drop.reason), WAKE]
            if drop is not None:
                return [*out, Dropped(drop.code, drop.reason)]
            self.late_aggregators.discard(msg.sender)
            reason = self.buffer.offer_result(msg)
            if reason and (digest := self.ack_again(msg)):
                # Sent again by its aggregator: our ack was lost (or is slow). Once more.
                out.append(Reply(mem.address_of(msg.sender), Ack(
                    **self.envelope(), round=msg.round, epoch=msg.epoch, digest=digest,
                    sig=self.sign_ack(msg.round, msg.epoch, digest)), msg.sender))
            elif reason:
                out.append(Dropped("stale_result", reason))
            elif msg.round == self.round and (why := self.epoch_unjustified(msg.round, msg.epoch)):
                out.append(Say(logging.INFO, "%s: result for round %d epoch %d from %s held: %s",
                               (self.id, msg.round, msg.epoch, msg.sender, why)))
        elif isinstance(msg, (Ack, Commit)):
            if isinstance(msg, Ack) and (done := self.commit_of(msg)) is not None:
                # Acked again after we committed (maybe once in a later round): its commit
                # was lost. Once more.
                return [*out, Reply(mem.address_of(msg.sender), dataclasses.replace(
                    done, **self.envelope()), msg.sender), WAKE]
            if (isinstance(msg, Commit) and (msg.round, msg.digest) == self.absorbed[:2]
                    and msg.round < self.buffer.round):
                # The result we absorbed and moved on from (its aggregator's heartbeat, or
                # a relay, overtook the commit): nothing to do, and nothing wrong (it was
                # a "dropped message" warning on the terminal of a healthy run).
                return out
            drop = self.note_ack(msg) if isinstance(msg, Ack) else self.admit_commit(msg)
            if drop is not None:
                return [*out, Dropped(drop.code, drop.reason)]
        elif isinstance(msg, Relayed) and msg.sig and not msg.certificate:
            if (drop := self.take_copy(msg)) is not None:
                return [*out, Dropped(drop.code, drop.reason)]
            out += [Say(logging.INFO, "%s: round %d: got a copy of %s's result of epoch %d "
                        "from %s", (self.id, msg.round, clip(msg.aggregator, 40), msg.epoch,
                                    msg.sender)), WAKE]
        elif isinstance(msg, Relayed):
            if (drop := self.take_relayed(msg)) is not None:
                return [*out, Dropped(drop.code, drop.reason)]
            out.append(Say(logging.INFO, "%s: round %d: took its committed result (epoch %d, "
                           "aggregator %s) relayed by %s, with a certificate of %d signed acks",
                           (self.id, msg.round, msg.epoch, clip(msg.aggregator, 40), msg.sender,
                            len(self.certificates[(msg.round, self.accepted[msg.round][1])][1]))))
        elif isinstance(msg, SeedRequest):
            address = mem.address_of(msg.sender)
            if address is not None and (due := self.seed_chunks_due(msg, now)):
                out.append(ServeSeeds(msg.sender, address, self.seeds.chunks_for(
                    self.id, due, self.id, self.incarnation)))
        elif isinstance(msg, SeedChunk):
            if msg.owner != msg.sender:  # (we ask each member for its own set only: seed_requests)
                return [*out, Dropped("seed_rejected", f"seed chunk from {msg.sender} of "
                                      f"{clip(msg.owner, 40)!r}'s set: only a member's own set "
                                      "is taken from it")]
            reason = ("this peer keeps no seed sets" if self.seeds is None
                      else self.seeds.offer(msg))  # (the store checks what it keeps)
            if reason:
                return [*out, Dropped("seed_rejected", reason)]
        elif isinstance(msg, Error) and msg.ref_type == "hello" and (
                msg.code == ErrorCode.COHORT_MISMATCH):
            # A member refused our hello (restarted with another config, say): said as a
            # stranger's refusal is, and counted (a resumed peer's stop names it)
            out.append(Refused(refusal(msg).reason))
        elif isinstance(msg, Error):
            out.append(Say(logging.WARNING, "%s: %s reports %s: %s",
                           (self.id, msg.sender, clip(msg.code), clip(msg.reason, 300))))
        out.append(WAKE)
        return out

    def _on_hello(self, msg: Hello, now: float) -> list[Instruction]:
        if msg.sender == self.id:
            if msg.address == self.membership.self_address:
                return []  # our own hello (a bootstrap list that names us)
            # Another process runs with this peer's node.id: before, both sides took the
            # other's hello and welcome for their own, and each stopped saying nobody
            # answered at the bootstrap address (a review).
            return [Dropped("address_conflict", f"hello from another peer with this peer's "
                            f"id {self.id}, at {clip(msg.address, 80)}: every peer of a cohort "
                            "needs a node.id of its own"),
                    Reply(msg.address, Error(**self.envelope(), code=ErrorCode.COHORT_MISMATCH,
                                             reason=f"{self.id} is this peer's id too: every "
                                                    "peer needs a node.id of its own",
                                             ref_type="hello"), msg.sender)]
        problem = self.incompatibility(msg)
        if problem:
            field_name, theirs, ours = problem
            # The reply names the field; our value only goes to an authenticated member
            # (on a plaintext link anyone could fish for what a hello must say).
            # (named: the refused peer relays it, where "ours" read as its own value)
            reason = f"{field_name} differs" + (f": {self.id} has {clip(repr(ours))}"
                                                if self.allowed_peers is not None else "")
            self.refuse_life(msg.sender, msg.incarnation, f"{field_name} differs")
            return [Dropped(ErrorCode.COHORT_MISMATCH, f"hello from {msg.sender}: {field_name} "
                            f"differs: theirs {clip(repr(theirs))}, ours {ours!r}"
                            f"{MISMATCH_HINTS.get(field_name, '')}"),
                    Reply(msg.address, Error(**self.envelope(), code=ErrorCode.COHORT_MISMATCH,
                                             reason=reason, ref_type="hello"), msg.sender)]
        # (checked after the data split agrees: a part of another split is no overlap)
        if msg.part and msg.part == self.hello_terms.get("part"):
            # (a second party that kept the example's data.partition_index trained on the
            # first one's rows, both counted as the cohort's data: a review)
            why = (f"it trains on part {msg.part - 1} of the cohort's data split "
                   f"(data.partition_index), as {self.id} does: two peers would train on "
                   "the same rows; give each peer its own data.partition_index")
            self.refuse_life(msg.sender, msg.incarnation,
                             f"data.partition_index {msg.part - 1} is {self.id}'s too")
            return [Dropped(ErrorCode.COHORT_MISMATCH, f"hello from {msg.sender}: {why}"),
                    Reply(msg.address, Error(
                        **self.envelope(), code=ErrorCode.COHORT_MISMATCH, ref_type="hello",
                        reason=f"data.partition_index {msg.part - 1} is {self.id}'s too: two "
                               "peers would train on the same rows; give each peer its own"),
                          msg.sender)]
        mem = self.membership
        drop = self.admit_hello(msg)
        if drop is not None:
            return [Dropped(drop.code, drop.reason)]
        if msg.sender in self.refused_lives:
            if msg.incarnation < self.refused_lives[msg.sender][0]:
                # An earlier life's late hello: it lifted a later life's refusal, and
                # that life was taken in by its next heartbeat (a review)
                return [Dropped("stale_incarnation", f"hello from {msg.sender} incarnation "
                                f"{msg.incarnation}, a life before one whose hello was refused")]
            del self.refused_lives[msg.sender]  # (its terms agree now: a new config)
        out: list[Instruction] = []
        change = mem.heard_from(msg.sender, msg.incarnation, now, address=msg.address,
                                round=msg.round)
        if change:
            out.append(MemberChanged(change))
            self.to_greet = True  # joined or restarted: it may need our hello
        if msg.introduced and msg.sender in mem.members:
            # It holds us in its view already (it greets a member gossip suggested): it
            # takes our messages, and needs no member list, nor our hello.
            mem.welcomed(msg.sender)
        if msg.introduced:
            members, upto = [], 0
        elif mem.lazy:  # the members we heard from ourselves it does not have from us yet
            members, upto = mem.vouched_since(msg.view_from)
        else:
            members, upto = mem.records(), 0
        out += [Reply(msg.address, Welcome(
            **self.envelope(), address=mem.self_address, round=self.round, members=members,
            view_upto=upto), msg.sender), WAKE]
        return out

    def incompatibility(self, msg: Hello) -> tuple[str, Any, Any] | None:
        """(field, theirs, ours) of the first thing a hello disagrees on (:attr:`hello_terms`),
        or None."""
        terms = self.hello_terms
        shared = terms.get("shared", {})
        checks = [
            ("cohort", msg.cohort, terms.get("cohort")),
            ("algorithm", msg.algorithm, terms.get("algorithm")),
            ("num_classes", msg.num_classes, terms.get("num_classes")),
            ("rounds", msg.rounds, terms.get("rounds")),
            # what the method and cohort options add (model dimensions, fanout,
            # communicate_every, ...), each named
            *((key, msg.shared.get(key, SHARED_ABSENT.get(key)),
               shared.get(key, SHARED_ABSENT.get(key)))
              for key in sorted({*msg.shared, *shared}, key=str)),
        ]
        for name, theirs, ours in checks:
            if theirs != ours:
                return name, theirs, ours
        return None

    def _on_heartbeat(self, msg: Heartbeat, now: float) -> list[Instruction]:
        """Failure news it carries, and the probes it asks for (timing.membership swim;
        a full-mode peer answers probes too, so a mixed cohort still works)."""
        mem = self.membership
        out: list[Instruction] = []
        if msg.members:
            if len(msg.members) > NEWS_PER_MESSAGE:
                # (a heartbeat carries at most 6: one of 4,095 made its receiver suspect,
                # and probe at once, every member it had not heard from lately; a SWIM
                # review: 1,998 probes from one message. The rest are not read.)
                out.append(Dropped("too_much_news", f"heartbeat from {msg.sender}: "
                                   f"{len(msg.members)} failure news records, at most "
                                   f"{NEWS_PER_MESSAGE}: the first {NEWS_PER_MESSAGE} taken"))
            news = [r for r in msg.members[:NEWS_PER_MESSAGE]
                    if self.allowed_peers is None or r.peer_id in self.allowed_peers]
            for change in mem.hear_news(news, msg.sender, now):
                out.append(MemberChanged(change, logging.INFO, "; probing it"))
        if (msg.view and mem.lazy and not self.joining and msg.view != self.view_digest()
                and now - self._asked_view_at >= self.timing.heartbeat_interval_s
                and msg.sender in mem.members
                and not self._asked_lately(msg.sender, msg.view, now)):
            # Lazy join, once joined (while joining, the asks to the bootstrap do it):
            # its order differs from ours (one of us has not heard of a member, or not
            # from enough members): ask it for its view (at most once an interval, and
            # while neither order changed, once per dead_after_s: they may differ for
            # good; our hello also tells it of us). It asks us in turn if ours has what
            # its lacks.
            self._asked_view_at = now
            self._asked_about[msg.sender] = (msg.view, self.view_digest(), now)
            out.append(self.ask_view(msg.sender))
        if msg.probe:  # answer: to the member that asked for an indirect probe, or the sender
            to = msg.relay or msg.sender
            address = mem.address_of(to)
            if address is not None and to != self.id:
                out.append(Reply(address, self.heartbeat(), to))
        if msg.wants_copy and (copy := self.copy_for(msg)) is not None:
            out += [Say(logging.INFO, "%s: round %d: %s, aggregator of epoch %d, has no copy "
                        "of the result we accepted (epoch %d); sending it",
                        (self.id, msg.round, msg.sender, msg.epoch, copy.epoch)),
                    SendTo(msg.sender, copy, "a copy of the accepted result")]
        if msg.awaiting and self.sent_knowledge is not None:
            sent_to, knowledge = self.sent_knowledge
            if self.asks_again(msg, sent_to, knowledge) and self._answer_ask(msg.sender, knowledge,
                                                                              now):
                self.sent_knowledge = (sent_to | {msg.sender}, knowledge)  # (lingers for it too)
                out += [Say(logging.INFO, "%s: round %d: %s has not got our knowledge; "
                            "sending it again", (self.id, msg.awaiting, msg.sender)),
                        SendTo(msg.sender, knowledge, "knowledge again")]
            elif (self.sent_before is not None and self.asks_before(msg)
                  and self._answer_ask(msg.sender, self.sent_before[1], now)):
                out += [Say(logging.INFO, "%s: round %d: %s has not got our knowledge, and we "
                            "shared the next already; sending it again",
                            (self.id, msg.awaiting, msg.sender)),
                        SendTo(msg.sender, self.sent_before[1], "knowledge again")]
        if msg.target and msg.target not in (self.id, msg.sender):
            # An indirect probe: ask the target to answer the sender itself, over its own
            # link (our word that it lives would be a third party's).
            address = mem.address_of(msg.target)
            if address is not None:
                out.append(Reply(address, self.heartbeat(probe=1, relay=msg.sender), msg.target))
        return out

    def _name_equivocators(self, via: str) -> list[Instruction]:
        """Say, once per member, that it is proven to have signed two versions of one
        round's contribution (the proof came with ``via``'s message)."""
        out: list[Instruction] = []
        for peer, proof in sorted(self.equivocators.items()):
            if peer in self.named:
                continue
            self.named.add(peer)
            r, _, first, _, _, second, _ = proof.split(":")
            out.append(NamedEquivocator(peer, int(r), via, first, second))
        return out

    # ================================================================ admission

    #: refused lives kept at most (a plaintext sender names itself: bounded)
    MAX_REFUSED = 4096

    def refuse_life(self, peer: str, incarnation: int, why: str) -> None:
        """Take nothing more from ``peer``'s life ``incarnation`` (or an earlier one):
        its hello disagreed with ours. Before, a refused peer known
        to this one (gossiped by a member, or a member before its restart with another
        config) was taken back by its next message of any kind, its refusal of our hello
        included: its knowledge and results taken, elected in the rotation (an attack
        review: a peer restarted on another's data part, or with other rounds, was in
        the cohort's results again 1.4 s later)."""
        if peer not in self.refused_lives and len(self.refused_lives) >= self.MAX_REFUSED:
            self.refused_lives.pop(next(iter(self.refused_lives)))
        held = self.refused_lives.get(peer, (incarnation, why))[0]
        self.refused_lives[peer] = (max(held, incarnation), why)  # (a late hello: not lower)

    def refused_life(self, msg: Message) -> Drop | None:
        """The drop of a message from a life :meth:`refuse_life` refused, or None. A
        later life is taken as any new one: its hello is checked again. A ``welcome``
        lifts the refusal: the peer took our hello, so its terms agree with ours (the
        check is the same both ways). Else one hello forged in its name (plaintext:
        anyone can claim any id) shut out a member that never greets us again, for the
        rest of the run (a review: it looks alive to its own side)."""
        refused = self.refused_lives.get(msg.sender)
        if refused is None or msg.incarnation > refused[0]:
            return None
        if isinstance(msg, Welcome) and msg.incarnation == refused[0]:
            # (that life's own: an earlier life's late welcome lifted a later one's, a review)
            del self.refused_lives[msg.sender]
            return None
        if isinstance(msg, Error):  # (its refusal of ours, again: said as the first was)
            return refusal(msg)
        return Drop(ErrorCode.COHORT_MISMATCH, f"{msg.TYPE} from {msg.sender}: its hello was "
                    f"refused ({refused[1]}): nothing from it is taken until a hello of it "
                    "agrees")

    def admit(self, identity: str, msg: Message) -> Drop | None:
        """Why a decoded message from connection ``identity`` is dropped (None: take it).
        Hellos have their own rule (:meth:`admit_hello`)."""
        if msg.sender != identity:
            return Drop(ErrorCode.IDENTITY_MISMATCH,
                        f"header says {msg.sender!r} but the connection is {identity!r}")
        if self.allowed_peers is not None and msg.sender not in self.allowed_peers:
            return Drop(ErrorCode.NOT_MEMBER, f"{msg.TYPE} from {msg.sender!r}: not on the allow-list")
        if isinstance(msg, Hello):
            return None
        if (refused := self.refused_life(msg)) is not None:
            return refused
        mem = self.membership
        if msg.sender not in mem.members:
            if isinstance(msg, Welcome):
                pass  # the answer to our hello: the peer speaks for itself
            elif isinstance(msg, Error):
                # Most likely the refusal of our hello: the shell logs its reason loudly.
                return refusal(msg)
            else:
                return Drop(ErrorCode.NOT_MEMBER, f"{msg.TYPE} from unknown peer {msg.sender!r}")
        elif not mem.is_current(msg.sender, msg.incarnation):
            return Drop("stale_incarnation", f"{msg.TYPE} from {msg.sender} incarnation "
                                             f"{msg.incarnation} (a dead process)")
        address = msg.address if isinstance(msg, Welcome) else None
        conflict = mem.address_conflict(msg.sender, msg.incarnation, address)
        if conflict:
            return Drop("address_conflict", f"{msg.TYPE}: {conflict}")
        return None

    def admit_hello(self, msg: Hello) -> Drop | None:
        """Why a (compatible) hello is dropped: an old incarnation, or a second "same
        process" at another address (an impostor or a stale copy)."""
        mem = self.membership
        if msg.sender in mem.members and not mem.is_current(msg.sender, msg.incarnation):
            return Drop("stale_incarnation", f"hello from an old incarnation of {msg.sender}")
        conflict = mem.address_conflict(msg.sender, msg.incarnation, msg.address)
        return Drop("address_conflict", f"hello: {conflict}") if conflict else None

    def admit_result(self, msg: AggregateResult) -> Drop | None:
        """Why an aggregate may not even be held: no aggregator in this cohort, a
        sender the rotation does not elect for (round, epoch), or too few
        contributors for the quorum."""
        if self.everywhere:
            return Drop("wrong_aggregator", f"result for round {msg.round} from {msg.sender}: "
                        "this cohort has no aggregator (every peer aggregates for itself)")
        expected = self.aggregators_for(msg.round, msg.epoch)
        if msg.sender not in expected:
            return Drop("wrong_aggregator", f"result for round {msg.round} epoch {msg.epoch} from "
                        f"{msg.sender}; the rotation elects "
                        f"{' or '.join(sorted(expected)) or 'no one at that epoch'}")
        if msg.kind == "none":  # an abstention: sets nothing, needs no quorum
            return (None if not msg.tensors and not msg.contributors else
                    Drop("rejected_result", f"abstention for round {msg.round} from {msg.sender} "
                                            "carries tensors or contributors"))
        if len(msg.contributors) < self.quorum():
            return Drop("below_quorum", f"result for round {msg.round} from {msg.sender} has "
                        f"{len(msg.contributors)} contributor(s); the quorum is {self.quorum()}")
        if self.certifying and (why := self.unjustified_result(msg)) is not None:
            return Drop("unjustified_result", f"result for round {msg.round} epoch {msg.epoch} "
                        f"from {msg.sender}: {why}")
        return None

    def compare_absorbed(self, msg: Heartbeat) -> str | None:
        """Why ``msg.sender`` is now known to have absorbed another aggregate than ours
        for the same round (reported once per round and peer), or None."""
        r, digest, source = self.absorbed
        if r == 0 or msg.absorbed_round != r or not msg.absorbed_digest or msg.absorbed_digest == digest:
            return None
        seen = self.disagreements.setdefault(r, set())
        if msg.sender in seen:
            return None
        seen.add(msg.sender)
        return ("the peers aggregated different contributions: a member sent different knowledge "
                "to different peers, or a contribution was lost or late" if self.everywhere
                else f"we took {source}'s result: an aggregator gave peers different results, or "
                     "the peers took results of different fail-over epochs")

    # ================================================================ election

    @property
    def certifying(self) -> bool:
        """Commits must carry a quorum of signed acks (the allow-list has signing keys)."""
        return self.verify_keys is not None

    @property
    def byzantine(self) -> int:
        """f, the malicious members the commit protocol is sized for: ``node.byzantine``,
        by default 1 where commits are certified (a member's signature is its own, so
        one member cannot count twice); always 0 where they are not (crash faults only:
        without signatures the aggregator's word is all a commit is)."""
        if not self.certifying or self.everywhere:
            # Every peer aggregating: no commits to certify, so a larger quorum would buy
            # no safety, only rounds lost to one silent member (3 of 3).
            return 0
        return 1 if self.byzantine_config is None else self.byzantine_config

    @property
    def distrusted(self) -> int:
        """f as far as a member's word goes on where the cohort is (its round) and on whom
        it knows (a member it reports): ``node.byzantine`` where set, else 1 where the
        allow-list has signing keys (one key, one voice) and 0 where it has none (crash
        faults only). Unlike :attr:`byzantine`, the same where every peer aggregates:
        no quorum grows with it, only how many members must say a thing before it is
        taken (f + 1: an honest one among them). Before, with every peer aggregating
        (the default up to 16 peers), one member's report of ids that never ran put
        them in the rotation order, and the quorum out of reach."""
        if self.byzantine_config is not None:
            return self.byzantine_config
        return int(self.certifying)

    def cohort_round(self) -> int:
        """The round the live cohort has reached, as far as f + 1 members' own words
        (heartbeats, hellos) vouch for it (:meth:`Membership.live_round`)."""
        return self.membership.live_round(self.distrusted + 1)

    def quorum(self) -> int:
        """Contributors a round's result needs: ``node.quorum`` if configured, else
        floor((n + f) / 2) + 1 of the n members this peer knows by its own evidence
        (dead ones included, left ones and gossip-only suggestions not): a majority
        where f = 0, so two sides of a partition can never both publish and gossiped
        ghosts cannot block every round; and with f = :attr:`byzantine` = 1, two
        quorums share f + 1 members, one of them honest, which acks one result per
        (round, epoch): f malicious members cannot complete two certificates for one
        round (the same size as a majority for even n: 3 of 4, 5 of 8).

        n is at least ``node.min_peers`` (the cohort hfl-launch started): a peer
        restarted before its first checkpoint remembers nobody, and two such peers
        that find each other must not make a majority of two."""
        if self.quorum_config is not None:
            return self.quorum_config
        n = max(self.membership.order_size(), self.cohort_size)
        return (n + self.byzantine) // 2 + 1

    def elect(self, r: int) -> tuple[str, int] | None:
        """(aggregator, epoch) for round r from this peer's epoch on: the first live
        candidate of the rotation (:func:`hfl.peer.membership.elect`)."""
        mem = self.membership
        return elect(mem.rotation_order(), lambda p: mem.is_live(p) and not self.sits_out(p, r),
                     self.turn(r), self.epoch)

    def reelected(self, r: int, aggregator: str, version: int) -> bool:
        """The rotation order changed since ``aggregator`` was elected for (r, epoch)
        (``version``: :meth:`Membership.order_version` then) and now names another
        candidate there: a member first heard from during the round entered it. Two
        peers that elected with and without it named each other and waited for each
        other twice round_timeout_s + aggregate_grace_s, each seeing the other "serving"
        (hfl.sim.protocol, 4 peers, buggify, seed 118: 13 s for round 6)."""
        mem = self.membership  # (O(1): asked on every message while the peer waits)
        return (mem.order_version() != version
                and mem.candidate_at(self.turn(r) + self.epoch) != aggregator)

    def sits_out(self, peer_id: str, r: int) -> bool:
        """``peer_id``'s current life said it sits round ``r`` out (restarted into a round
        an earlier life entered: :attr:`sit_out_through`): it will not serve there, so
        the rotation skips it for r, as a dead candidate (its own word, over its own
        connection: a failure the receiver has seen). Without this, every peer waited
        a whole round timeout for an aggregator restarted faster than ``dead_after_s``."""
        said = self.sitting_out.get(peer_id)
        if said is None or said[1] != r:
            return False
        m = self.membership.members.get(peer_id)
        return m is not None and m.incarnation == said[0]

    def aggregators_for(self, r: int, epoch: int) -> set[str]:
        """Who may send the result (or the commit) of (r, epoch): the candidate of this
        peer's rotation order (departed members included; members known by gossip alone
        are not in it). It was also the candidate of every member this peer knew,
        gossip-only suggestions included: one allow-listed id that never ran, gossiped
        by a member, shifted that second order so that it elected the member for rounds
        the rotation gives to another, and the member's own result was taken, acked
        and committed, or repeated by the honest aggregator (an attack review)."""
        order = self.membership.rotation_order()
        # (none for an epoch below 0 or past the order: a negative one elected as
        # epoch + k * n does, and each such copy of one result was held with its tensors
        # until the round ended, unbounded: a fuzzer's find)
        return {self.candidate(order, r, epoch)} if 0 <= epoch < len(order) else set()

    def elected_sender(self, res: AggregateResult) -> bool:
        """``res`` comes from the rotation's candidate for its (round, epoch) as the order
        stands now (it was at admission; the order may have grown since)."""
        return res.sender in self.aggregators_for(res.round, res.epoch)

    def epoch_unjustified(self, r: int, epoch: int) -> str | None:
        """Why this peer cannot (yet) accept a result of (r, epoch), or None if it can.

        The election rule: epoch e of round r is current only once the candidates
        of every earlier epoch have failed, and a peer believes only failures it
        has seen itself: epochs below its own (it failed over past them, on a
        death or a missed deadline) or candidates it holds dead now. A suspicion
        is not a failure: a member that floods the real aggregator until it looks
        slow cannot make its own held result count. The check runs each time a
        held result is considered, so a result never outlives its evidence: once
        the candidate is heard again, the held result is unusable again.
        """
        mem = self.membership
        order = mem.rotation_order()
        for e in range(self.epoch, epoch):
            candidate = self.candidate(order, r, e)
            if candidate == self.id:
                return f"epoch {e} elects this peer, which is alive"
            m = mem.members.get(candidate)
            if m is not None and m.status in (ALIVE, SUSPECT) and not self.sits_out(candidate, r):
                return (f"{candidate}, the candidate of epoch {e}, is {m.status} (not dead) in this "
                        "peer's view")
        return None

    def usable_result(self, r: int) -> AggregateResult | None:
        """The result this peer may take for round ``r``: its own epoch's, or a later
        epoch's that :meth:`epoch_unjustified` allows; or one known committed already
        (relayed with its certificate: :meth:`take_relayed`), whatever its epoch."""
        if (held := self.committed(r)) is not None:
            return held
        for res in self.buffer.results_for(r, self.epoch):
            if self.elected_sender(res) and (
                    res.epoch == self.epoch or self.epoch_unjustified(r, res.epoch) is None):
                return res
        return None

    def unused_results(self, r: int) -> list[AggregateResult]:
        """Results of round ``r`` held for epochs this peer never reached (to drop at the
        round's end: it never saw the failures that would have made them current). Not
        its own epoch's: a result it accepted, and left the round with when the cohort
        moved past it, was reported as one of them, naming alive candidates before it."""
        return self.buffer.results_for(r, self.epoch + 1)

    # ================================================================ commit
    #
    # An aggregator's result is *accepted* by the peers that receive it (they ack it
    # and promise nothing older), and *absorbed* only once its aggregator has a quorum
    # of acks and says so (commit). An aggregator of a later epoch needs a quorum of
    # contributions sent to its epoch (each a promise never to accept an older
    # epoch's result, carrying the sender's last accepted result); if any of them
    # accepted a result, it publishes that result again, or abstains if it holds no
    # copy of it. Two quorums share a peer, so a result once committed is the only
    # one any later epoch can commit: no two peers absorb different results for a
    # round (Paxos's rule, with the round's aggregators as proposers). It needs
    # quorum > half the cohort: the default majority.

    def accept(self, res: AggregateResult) -> str:
        """This peer accepted ``res`` (it acks it next): the highest epoch wins.
        Returns the result's digest."""
        # each contributor was in res.round: no longer "behind" (awaited)
        self.membership.reached(res.contributors, res.round)
        held = self.accepted.get(res.round)
        if held is None or res.epoch >= held[0].epoch:
            self.accepted[res.round] = (res, self.digest_of(res))
        return self.accepted[res.round][1]

    def marker(self, r: int) -> tuple[int, str]:
        """(epoch, digest) of the result accepted for round r; (-1, "") if none."""
        held = self.accepted.get(r)
        return (held[0].epoch, held[1]) if held is not None else (-1, "")

    def admit_knowledge(self, msg: Knowledge) -> Drop | None:
        """Why a contribution is refused for what it claims (None: take it). A peer
        moves to a result's epoch when it accepts it and never goes back, so its
        contributions name an accepted epoch no higher than their own: one that claims
        a later one is a lie (a member that is not elected would otherwise have the
        aggregator publish a result it forged for an epoch that elects it)."""
        if msg.accepted_epoch > msg.epoch:
            return Drop("lying_claim",
                        f"{msg.sender}'s knowledge for round {msg.round} epoch {msg.epoch} claims it "
                        f"accepted a result of the later epoch {msg.accepted_epoch}: a lie (a peer "
                        "only contributes to the epoch of a result it accepted or a later one); "
                        f"dropped, naming {msg.sender}")
        if not report_well_formed(msg.accepted_epoch, msg.accepted_digest):
            return Drop("rejected_knowledge",
                        f"{msg.sender}'s knowledge for round {msg.round} reports accepted epoch "
                        f"{msg.accepted_epoch} with digest {clip(msg.accepted_digest, 70)!r}: not "
                        "-1 with none, nor an epoch with a payload digest (64 hex digits)")
        if msg.sender in self.equivocators:
            return Drop("equivocator", f"knowledge for round {msg.round} from {msg.sender}, which "
                                       "signed two versions of one round's contribution")
        if not self.certifying:
            return None
        buffer = self.buffer
        if msg.round < buffer.round:
            return None  # late: the buffer drops it
        digest = payload_digest(msg)
        if not self.signed_by(msg.sender, "knowledge", msg.round, msg.epoch, digest, msg.sig):
            return Drop("bad_signature", f"knowledge for round {msg.round} from {msg.sender}: its "
                                         "signature does not check against its allow-listed key")
        mine = (msg.epoch, digest, msg.sig)
        top = buffer.round + buffer.lookahead
        if msg.round > top:
            # Beyond the window the buffer keeps the highest round seen only (a lagging
            # peer catches up to it): so does the record of what was signed. Far
            # knowledge was taken unchecked, and used so once the peer got there (a
            # fuzzer's find: no proof of equivocation could name that round).
            if (kept := buffer.far_round()) is not None and msg.round < kept:
                return None  # the buffer refuses it too
            self.signed_knowledge = {k: v for k, v in self.signed_knowledge.items()
                                     if k[0] <= top or k[0] == msg.round}
        held = self.signed_knowledge.setdefault((msg.round, msg.sender), mine)
        if held[1] != digest:  # two versions sent to this very peer
            self._convicted(msg.sender, msg.round, held, mine)
            return Drop("equivocator", f"{msg.sender} sent this peer two different signed "
                                       f"contributions for round {msg.round}")
        return None

    # ================================================================ equivocation
    #
    # With every peer aggregating, a member that sends different contributions to
    # different peers makes them diverge. Each contribution is signed; each peer
    # tells the others, with its next contribution, the signed digests of the ones it
    # aggregated; two signatures of one member over different contributions of one
    # round (and life) are a proof anyone can check. The member is then left out by
    # every peer that sees the proof, for the rest of the run, and the proof travels
    # on with each peer's contributions.

    def _convicted(self, peer: str, r: int, a: tuple, b: tuple) -> None:
        """``a`` and ``b``: (epoch, digest, sig) of two signed contributions of round r."""
        self.equivocators.setdefault(peer, ":".join(map(str, (r, *a, *b))))
        for held in self.buffer.knowledge.values():
            held.pop(peer, None)  # what it sent for rounds still open is left out too

    def note_heard(self, r: int) -> None:
        """Round ``r``'s contributions this peer aggregated, as their senders signed them."""
        self.heard[r] = {p: self.signed_knowledge[(r, p)] for p in self.buffer.received(r)
                         if (r, p) in self.signed_knowledge}

    def heard_report(self) -> tuple[int, dict[str, str]]:
        """(round, peer -> "epoch:digest:sig") of this peer's last aggregated round."""
        if not self.heard:
            return 0, {}
        r = max(self.heard)
        return r, {p: ":".join(map(str, e)) for p, e in sorted(self.heard[r].items())}

    def check_heard(self, msg: Knowledge) -> tuple[list[str], str | None]:
        """Compare what ``msg.sender`` says it received (``heard``) with what this peer
        received, and take the proofs it carries (``equivocations``). Returns the
        members newly proven to have equivocated, and why ``msg.sender``'s own report
        is a lie (a version of another member's contribution that member never
        signed), or None."""
        if not self.certifying:
            return [], None
        before = set(self.equivocators)
        lie = None
        for peer, text in sorted(msg.heard.items()):
            parts = text.split(":")
            if peer in (self.id, msg.sender) or peer in self.equivocators or len(parts) != 3:
                continue
            epoch, digest, sig = _small_int(parts[0]), parts[1], parts[2]
            mine = self.signed_knowledge.get((msg.heard_round, peer))
            if epoch is None or mine is None or mine[1] == digest:
                continue
            if not self.signed_by(peer, "knowledge", msg.heard_round, epoch, digest, sig):
                lie = (f"{msg.sender} reports a contribution of {peer} for round {msg.heard_round} "
                       f"that {peer} never signed")
                continue
            self._convicted(peer, msg.heard_round, mine, (epoch, digest, sig))
        for peer, proof in sorted(msg.equivocations.items()):
            if peer != self.id and peer not in self.equivocators and self._proves(peer, proof):
                parts = proof.split(":")
                self._convicted(peer, int(parts[0]), tuple(parts[1:4]), tuple(parts[4:7]))
                self.equivocators[peer] = proof
        return sorted(set(self.equivocators) - before), lie

    def _proves(self, peer: str, proof: str) -> bool:
        """``proof`` ("round:epoch:digest:sig:epoch:digest:sig") holds two signatures of
        ``peer`` over different contributions of one round. A restarted peer never signs
        a round its earlier life signed (it sits it out: ``sit_out_through``), so two
        lives are no excuse (and no way to show two peers two versions)."""
        parts = proof.split(":")
        if len(parts) != 7:
            return False
        r, e1, e2 = _small_int(parts[0]), _small_int(parts[1]), _small_int(parts[4])
        if r is None or e1 is None or e2 is None:
            return False
        d1, s1, d2, s2 = parts[2], parts[3], parts[5], parts[6]
        return (d1 != d2 and self.signed_by(peer, "knowledge", r, e1, d1, s1)
                and self.signed_by(peer, "knowledge", r, e2, d2, s2))

    def promises(self, r: int) -> dict[str, Knowledge]:
        """Round-r contributions sent to this peer's epoch or a later one: each a
        promise from its sender never to accept an older epoch's result."""
        return {p: k for p, k in self.buffer.received(r).items() if k.epoch >= self.epoch}

    def proposal(self, r: int, promised: dict[str, Knowledge]
                 ) -> tuple[str, AggregateResult | None, dict[str, str]]:
        """What this peer, aggregator of (r, self.epoch), may publish: ``("own", None)``
        its own aggregate; ``("repeat", res)`` the result accepted at the highest epoch
        among the promises and itself, which it holds a copy of (the copy came from
        that epoch's aggregator: admission checked it); ``("abstain", None)`` when a
        result was accepted that it holds no copy of, or when two different results
        were accepted at that highest epoch (views of the rotation that differ can
        elect two aggregators for one epoch: no rule could tell which may be committed).

        The third item names the promisers whose report is a lie this peer can see
        for itself, with why: they are left out (their report, their promise and
        their contribution). Two reports are not taken:

        - one of an epoch above this peer's: a peer that promised a later epoch never
          accepts this epoch's result, so nothing it accepted there can be lost by
          publishing here (a result committed at a later epoch had a quorum of acks
          from peers past this epoch, which cannot also make a quorum here). Taken,
          it let a member that is not elected have its own forged result of an epoch
          that elects it published by the real aggregator;
        - one of a result of an epoch whose only candidate is this peer, which this
          peer never published: a lie. Taken, it made the aggregator abstain in every
          round the liar contributed to.

        Where commits are certified, a promise counts only signed, and a report only
        with its proof (:meth:`unproven_promise`), and one of an epoch above this
        peer's is left out with its promise (every member refuses a proposal carrying
        it, rev. 17, :meth:`_unjustified`; no honest promise this epoch can use has
        one): what this peer publishes must then pass every member's check
        (:meth:`unjustified_result`)."""
        refused: dict[str, str] = {}
        own = self.marker(r)
        reports = [(*own, self.id)] if not self.certifying or self.counts(
            self.id, *own, self.accepted_proofs(r)) else []
        for p, k in promised.items():
            e = k.accepted_epoch
            if self.certifying:  # signed promises and proven reports, up to this epoch
                # (at epoch 0 a promise goes into no result: one without a report needs no
                # signature, so a member of rev. 14 still contributes, a review)
                if (e >= 0 or self.epoch > 0) and (why := self.unproven_promise(k)) is not None:
                    refused[p] = why
                elif e > self.epoch:
                    # (members refuse a proposal that carries such a report: rev. 17,
                    # _unjustified; it is left out, not published and then refused by
                    # this peer's own check, a review)
                    refused[p] = (f"{p} reports a result accepted at epoch {e}, after this "
                                  f"epoch {self.epoch}")
                elif self.counts(p, e, k.accepted_digest, k.proofs):
                    reports.append((e, k.accepted_digest, p))
                continue
            if e < 0 or e > self.epoch:
                continue
            if self.aggregators_for(r, e) == {self.id} and (r, e, k.accepted_digest) not in self.acks:
                refused[p] = (f"{p} claims it accepted a result of round {r} epoch {e} "
                              f"({k.accepted_digest[:16]}), which only this peer could have "
                              "published and never published: a lie")
                continue
            reports.append((e, k.accepted_digest, p))
        top = max((epoch for epoch, _, _ in reports), default=-1)
        if top < 0:
            return "own", None, refused
        digests = {d for epoch, d, _ in reports if epoch == top}
        if len(digests) > 1:
            return "abstain", None, refused
        (digest,) = digests
        held = self.accepted.get(r)
        if held is not None and held[1] == digest:
            return "repeat", held[0], refused
        copy = self.copies.get(r)
        for res in [*self.buffer.results_for(r), *([copy] if copy is not None else [])]:
            # (any epoch: the same value is the same value)
            if self.elected_sender(res) and self.digest_of(res) == digest:
                return "repeat", res, refused
        # No copy of the one value to publish again: its reporters hold one (rev. 18;
        # RoundProcedures.serve asks them). An aggregator that showed its result to one
        # member only and never committed it cost each of its rounds so (an attack
        # review; hfl.sim.protocol's hide twin), and so did one that crashed as it sent.
        if self.certifying:
            self.copy_wanted = (r, top, digest, tuple(sorted(
                p for e, d, p in reports if (e, d) == (top, digest) and p != self.id)))
        return "abstain", None, refused

    # ================================================================ justified proposals
    #
    # (rev. 15, where commits are certified) The rule above holds against crashes. A
    # malicious aggregator of a later epoch could ignore the promises it got and
    # publish another value; the honest members acked it, and it was committed after
    # another had been (a review, 2026-11-28; hfl.sim.protocol's ``override`` twin).
    # So every result is signed by its aggregator, and one of an epoch above 0 carries
    # the quorum of signed promises it was chosen on, each report in them with its
    # proof; a member acks it only if it is the value the rule picks from them.
    # Honest members check each proposal before they ack it, so a proof is either a
    # commit's certificate (f + 1 signed acks hold an honest one) or the proposal
    # itself, checked the same way down to epoch 0 (PROTOCOL.md, *Justified proposals*).

    #: proofs one message may carry (the (epoch, digest) reports of one round)
    PROOFS_MAX = 16

    def promise_sig(self, r: int, epoch: int, accepted_epoch: int, accepted_digest: str) -> str:
        """This peer's signature of its promise for (r, epoch), reporting the result it
        accepted last ("" where it has no signing key)."""
        return self.sign("promise", r, epoch, accepted_digest or NO_DIGEST, accepted_epoch)

    def promise_text(self, r: int) -> str:
        """This peer's own promise for (r, its epoch), as a result carries it."""
        ae, ad = self.marker(r)
        return promise_text(self.epoch, ae, ad, self.promise_sig(r, self.epoch, ae, ad))

    def accepted_proofs(self, r: int) -> dict[str, dict[str, Any]]:
        """The proof of the result this peer accepted for round r, for its promises:
        the commit's certificate where it holds one of that epoch, else the result as
        its aggregator signed it with the promises it was chosen on (and their proofs)."""
        held = self.accepted.get(r)
        if held is None or self.signer is None:
            return {}
        res, digest = held
        key = f"{res.epoch}:{digest}"
        cert = self.certificates.get((r, digest))
        if cert is not None and cert[0] == res.epoch:
            return {key: {"acks": dict(cert[1])}}
        if not res.sig:
            return {}
        table = {**res.proofs, key: {"by": res.sender, "sig": res.sig, "promises": dict(res.promises)}}
        # Only what its key refers to (at most PROOFS_MAX), as it was checked on arrival:
        # checked again against this peer's quorum of now, a view grown since dropped
        # entries, and the aggregator refused an honest member's promise (a review).
        used, todo = {}, [key]
        while todo:
            k = todo.pop()
            form = proof_form(table.get(k))
            if k in used or form is None:
                continue
            used[k] = table[k]
            if form[0] == "result":
                todo += [f"{p[1]}:{p[2]}" for p in map(parse_promise, form[3].values()) if p]
        return used

    def unproven_promise(self, k: Knowledge) -> str | None:
        """Why ``k``'s promise does not count at this aggregator (None: it does): not
        signed by its sender, or its report without a proof (:meth:`_unproven`). (Not
        whether the rotation elects the signer of the reported result: views differ,
        and such a check named honest members liars, 5 promises in 1,000 seeds of
        hfl.sim.protocol --peers 4 --signed --buggify.)"""
        r, ae, ad = k.round, k.accepted_epoch, k.accepted_digest
        if not self.signed_by(k.sender, "promise", r, k.epoch, ad or NO_DIGEST,
                              k.promise_sig, ae):
            return f"{k.sender}'s promise for round {r} epoch {k.epoch} is not signed by it"
        if ae < 0:
            return None
        if len(k.proofs) > self.PROOFS_MAX:
            return f"{k.sender}'s report carries {len(k.proofs)} proofs (at most {self.PROOFS_MAX})"
        if (why := self._unproven(r, ae, ad, k.proofs, {}, set())) is not None:
            return f"{k.sender} reports a result of round {r} epoch {ae}: {why}"
        return None

    def unjustified_result(self, msg: AggregateResult) -> str | None:
        """Why a member may not accept ``msg`` (None: it may), where commits are
        certified: not signed by its aggregator, or, at an epoch above 0, not the value
        its quorum of signed promises picks (:meth:`_unjustified`)."""
        self.short_of_promises = False
        if msg.epoch == 0 and not msg.sig:
            # (nothing was accepted before epoch 0, and only a later proof of it needs the
            # signature: a rev. 14 aggregator's result is taken, a review; a member that
            # accepted it proves it by its commit's certificate, if it got it)
            return None
        digest = self.digest_of(msg)
        if not self.signed_by(msg.sender, "result", msg.round, msg.epoch, digest, msg.sig):
            return "its aggregator's signature of it does not check"
        if msg.epoch == 0:
            return None  # nothing was accepted before epoch 0
        if len(msg.proofs) > self.PROOFS_MAX:
            return f"it carries {len(msg.proofs)} proofs (at most {self.PROOFS_MAX})"
        return self._unjustified(msg.round, msg.epoch, digest, msg.promises, msg.proofs, {},
                                 {f"{msg.epoch}:{digest}"})

    def signed_result(self, msg: AggregateResult, promised: dict[str, Knowledge]) -> AggregateResult:
        """``msg``, this aggregator's result, as it goes out where this peer signs: with
        its signature and, above epoch 0, its :meth:`justification`."""
        if self.signer is None or not self.certifying:
            return msg
        digest = self.digest_of(msg)
        signed = dataclasses.replace(msg, sig=self.sign("result", msg.round, msg.epoch, digest),
                                     **self.justification(msg.round, promised))
        self._remember_digest(signed, digest)  # (the same payload)
        return signed

    def digest_of(self, res: AggregateResult) -> str:
        """:func:`payload_digest` of a result, kept for the last two results: one is
        digested on arrival (its signature) and again to accept it, 49 ms each time for
        a 45 MiB model on this project's machine."""
        for held, digest in self._digests:
            if held is res:
                return digest
        digest = payload_digest(res)
        self._remember_digest(res, digest)
        return digest

    def _remember_digest(self, res: AggregateResult, digest: str) -> None:
        self._digests = [(res, digest), *self._digests[:1]]

    def _unjustified(self, r: int, epoch: int, digest: str, promises: Any,
                     proofs: dict[str, Any], memo: dict[str, str | None],
                     stack: set[str]) -> str | None:
        """The rule of :meth:`proposal`, checked: ``promises`` (peer -> "epoch:
        accepted_epoch:accepted_digest:sig") hold this peer's quorum of distinct
        members' signed promises for ``epoch`` or later, each report proven (from
        ``proofs``), and ``digest`` is the one value reported at the highest epoch
        (any value where none is reported). Every promise must check: a proposal that
        left an honest report out for a bad one would be taken without it."""
        if not isinstance(promises, dict) or len(promises) < self.quorum():
            n = len(promises) if isinstance(promises, dict) else 0
            self.short_of_promises = isinstance(promises, dict)  # (what this peer's view asks)
            return f"{n} promise(s) of the {self.quorum()} a result of epoch {epoch} needs"
        reports = []
        for peer, text in sorted(promises.items()):
            if (parsed := parse_promise(text)) is None:
                return f"{clip(peer, 40)}'s promise is malformed"
            pe, ae, ad, sig = parsed
            if pe < epoch:
                return f"{clip(peer, 40)} promised epoch {pe}, below {epoch}"
            if not self.signed_by(peer, "promise", r, pe, ad or NO_DIGEST, sig, ae):
                return f"{clip(peer, 40)}'s promise does not check against its signing key"
            if ae > epoch:
                # (no honest promise that a proposal of this epoch can use reports a later
                # one: one that accepted at a later epoch refuses this epoch's result;
                # taken, a report moved one epoch up escaped the check that a proof does
                # not refer to itself, and two colluders' acks certified a second value
                # for a round: an attack review, 2026-11-29)
                return (f"{clip(peer, 40)} reports a result accepted at epoch {ae}, after "
                        f"this proposal's epoch {epoch}")
            if ae >= 0:
                if (why := self._unproven(r, ae, ad, proofs, memo, stack)) is not None:
                    return f"{clip(peer, 40)}'s report: {why}"
                if self.counts(peer, ae, ad, proofs):
                    reports.append((ae, ad))
        if not reports:
            return None
        top = max(e for e, _ in reports)
        values = sorted({d for e, d in reports if e == top})
        if values != [digest]:
            return (f"its promises report {', '.join(v[:16] for v in values)} accepted at epoch "
                    f"{top}, and it is {digest[:16]}")
        return None

    @staticmethod
    def counts(peer: str, ae: int, ad: str, proofs: Any) -> bool:
        """Whether ``peer``'s report "accepted (ae, ad)", proven (:meth:`_unproven`),
        is one the rule of :meth:`proposal` takes where commits are certified (the
        aggregator and every member alike): not one proven only by ``peer``'s own
        signature as that result's aggregator (no certificate). One member alone can
        make that up, and an honest aggregator never reports its own result so: it
        leaves the round once it has published, committed or not
        (RoundProcedures.serve), so it promises no later epoch of it (and a result
        that is never committed is never absorbed). Taken, one member's made-up
        "epoch-0 result" in each of its contributions made the epoch-0 aggregator,
        holding no copy, abstain in every round it did not aggregate itself (a review,
        2026-11-29; hfl.sim.protocol's ``selfreport`` twin, 4 peers, seeds 0-99:
        770 of 1,000 rounds without a result, 8 now, 6 without the twin). The
        promise still counts towards the quorum.

        (A report of the proposal's own epoch is counted too. Leaving it out, as a
        competing aggregator's result that cannot be certified beside this one, would
        lose an earlier commit's value where the one honest member both quorums share
        accepted it again at this epoch from the aggregator of another view.)"""
        if ae < 0:
            return False
        form = proof_form(proofs.get(f"{ae}:{ad}")) if isinstance(proofs, dict) else None
        return not (form is not None and form[0] == "result" and form[1] == peer)

    def _unproven(self, r: int, ae: int, ad: str, proofs: dict[str, Any],
                  memo: dict[str, str | None], stack: set[str]) -> str | None:
        """Why the report "accepted (r, ae, ad)" is not proven by ``proofs`` (None: it
        is): its entry holds f + 1 signed acks of it, or its aggregator's signature and,
        above epoch 0, promises that justify it (:meth:`_unjustified`, with a proof
        that refers back to itself refused). ``memo``: entries checked already."""
        key = f"{ae}:{ad}"
        if key in memo:
            return memo[key]
        if key in stack:
            return f"the proof of epoch {ae} ({ad[:16]}) refers to itself"
        form = proof_form(proofs.get(key))
        why = None
        if form is None:
            why = f"no proof of epoch {ae} ({ad[:16]}), or one of another form"
        elif form[0] == "acks":
            if not self.enough_acks(r, ae, ad, form[1]):
                why = f"fewer than {self.byzantine + 1} signed acks of epoch {ae} ({ad[:16]})"
        else:
            _, by, sig, promises = form
            if not self.signed_by(by, "result", r, ae, ad, sig):
                why = f"the result of epoch {ae} ({ad[:16]}) is not signed by the aggregator it names"
            elif ae > 0:
                stack.add(key)
                why = self._unjustified(r, ae, ad, promises, proofs, memo, stack)
                stack.discard(key)
        memo[key] = why
        return why

    def enough_acks(self, r: int, epoch: int, digest: str, acks: dict[str, str]) -> bool:
        """``acks`` holds f + 1 signed acks of (r, epoch, digest): one is honest. Checked
        until there are (an entry that does not check costs one verification, at most
        one per allow-listed member)."""
        good = 0
        for p, sig in sorted(acks.items()):
            good += self.ack_signed_by(p, r, epoch, digest, sig)
            if good > self.byzantine:
                return True
        return False

    def justification(self, r: int, promised: dict[str, Knowledge]) -> dict[str, Any]:
        """What this aggregator's result of (r, its epoch) carries where commits are
        certified: its signature fields' ``promises`` (its own and the promisers') and
        the proofs their reports use, each checked (:meth:`unproven_promise` refused
        the others: a promiser's bad entry must not stand in for a good one)."""
        if self.epoch == 0:
            return {}  # (nothing to justify at epoch 0)
        promises = {self.id: self.promise_text(r)}
        reports = [(*self.marker(r), self.accepted_proofs(r))]  # (its own, then each promiser's)
        for p, k in sorted(promised.items()):
            promises[p] = promise_text(k.epoch, k.accepted_epoch, k.accepted_digest, k.promise_sig)
            reports.append((k.accepted_epoch, k.accepted_digest, k.proofs))
        proofs: dict[str, Any] = {}
        for ae, ad, table in reports:
            if ae < 0:
                continue
            memo: dict[str, str | None] = {}
            self._unproven(r, ae, ad, table, memo, set())
            for key, why in memo.items():
                if why is None and key in table:
                    proofs.setdefault(key, table[key])
        return {"promises": promises, "proofs": proofs}

    def asks_again(self, msg: Heartbeat, sent_to: frozenset[str], knowledge: Knowledge) -> bool:
        """``msg`` (a heartbeat with ``awaiting``) is from a peer this peer sent
        ``knowledge`` to (its aggregator; in a decentralized round, any of the round's
        receivers, and where it went to every live member, a live member that joined
        after it went out), for that round and epoch, saying it has not arrived: send it
        (again). Anyone else's ask, or one for another round or epoch, changes nothing.
        A member met after the broadcast waited the whole round_timeout_s for knowledge
        never sent to it, and a late joiner's last round learned nothing
        (hfl.sim.protocol, 3 peers, broadcast, seed 502). In a decentralized round, and
        after the last round, the knowledge of the round just past is sent too, while
        this peer still holds it (until it shares the next): see finished_without."""
        finished = (knowledge.round == self.last_round == self.round - 1  # (staying: above)
                    or not self.elected and knowledge.round == self.previous_exchange(self.round))
        joined_since = self.sent_to_every_member and self.membership.is_live(msg.sender)
        return ((msg.sender in sent_to or joined_since) and msg.awaiting == knowledge.round
                and (knowledge.round == self.round or finished) and msg.epoch == knowledge.epoch)

    def asks_before(self, msg: Heartbeat) -> bool:
        """``msg`` (a heartbeat with ``awaiting``) is from one of the receivers of the
        knowledge this peer sent before its latest (:attr:`sent_before`), in a
        decentralized round, asking for that round, the exchange just before our latest
        knowledge's: it was lost on the way, and this peer, quick, shared its next
        knowledge before the asker noticed. Before, it was never asked (the asker leaves
        out a member that shared its next knowledge, which held only that), and with a
        quorum of every honest member the round was lost (hfl.sim.protocol, 4 peers,
        every peer aggregating, a twin equivocating, seeds 126, 253, 471, 657)."""
        if (self.elected or self.sent_knowledge is None or self.sent_before is None
                # (after the last round the latest's asks are answered every two
                # heartbeats: the one before would double a lingering peer's uploads to
                # a member that alternates its asks, and nobody needs it then, a review)
                or 0 < self.last_round < self.round):
            return False
        sent_to, knowledge = self.sent_before
        joined_since = self.sent_before_to_every and self.membership.is_live(msg.sender)
        return ((msg.sender in sent_to or joined_since) and msg.awaiting == knowledge.round
                and msg.epoch == knowledge.epoch
                and knowledge.round == self.previous_exchange(self.sent_knowledge[1].round))

    #: An ask for our knowledge (heartbeat ``awaiting``) is answered at most once per
    #: this many heartbeat intervals per asker: an honest one asks after 4, 8, 8, ...
    #: heartbeats of waiting, and a member that asked with every heartbeat (or twenty
    #: times in one) had each honest peer send it the whole knowledge each time: a
    #: heartbeat of a few bytes bought a model's worth of upload (a review's lead:
    #: 164 extra sends in 5 s from 4 peers).
    ASK_EVERY_INTERVALS = 2

    def _answer_ask(self, asker: str, knowledge: Knowledge, now: float) -> bool:
        """Whether this ask for ``knowledge`` from ``asker`` is answered (and note that it
        is): not when an ask of the same knowledge was answered within
        :attr:`ASK_EVERY_INTERVALS` heartbeat intervals, nor ever again for a round this
        peer has left, but after the last round."""
        key = (asker, knowledge.round, knowledge.epoch)
        last = self._asks_answered.get(key)
        if last is not None and knowledge.round < self.round != self.last_round + 1:
            # A round just past (a decentralized round's asks_again): one answer per asker,
            # who asks once; else a member asking every 10 ms got a model's upload from
            # each honest peer every two heartbeats while they trained (a review: 5 in 5 s)
            return False
        interval = self.timing.heartbeat_interval_s if self.timing is not None else 0.0
        if last is not None and now - last < self.ASK_EVERY_INTERVALS * interval:
            return False
        if len(self._asks_answered) > 4 * len(self.membership.members) + 64:
            self._asks_answered.clear()  # (old rounds' entries: forgotten, in bulk)
        self._asks_answered[key] = now
        return True

    def statement(self, what: str, r: int, epoch: int, digest: str, *extra: int) -> bytes:
        """What a signed statement signs: ``b"hfl-" + what + b"\\0"`` and msgpack [cohort,
        round, epoch, digest, *extra] (``what``: ``ack``, a result accepted;
        ``knowledge``, a contribution sent, with the sender's incarnation as ``extra``:
        a restarted peer that trains a round again is another life, not a liar)."""
        return (b"hfl-" + what.encode() + b"\x00"
                + msgpack.packb([self.cohort, r, epoch, digest, *extra]))

    def ack_statement(self, r: int, epoch: int, digest: str) -> bytes:
        return self.statement("ack", r, epoch, digest)

    def sign(self, what: str, r: int, epoch: int, digest: str, *extra: int) -> str:
        """This peer's signature of a statement, hex ("" where it has no signing key)."""
        return self.signer(self.statement(what, r, epoch, digest, *extra)).hex() if self.signer else ""

    def sign_ack(self, r: int, epoch: int, digest: str) -> str:
        """This peer's signature of its ack of (r, epoch, digest), hex ("" unsigned)."""
        return self.sign("ack", r, epoch, digest)

    def signed_by(self, peer: str, what: str, r: int, epoch: int, digest: str, sig: str,
                  *extra: int) -> bool:
        """``sig`` is ``peer``'s signature of the statement (:meth:`statement`)."""
        invalid_signature, public_key = _ed25519()
        key = (self.verify_keys or {}).get(peer)
        # (a digest is payload_digest's 64 hex digits: a member's signature over a longer
        # string, shown as an equivocation proof, went into every honest peer's knowledge)
        if key is None or len(sig) != 128 or len(digest) != 64:
            return False
        try:
            verifier = self._verifiers.get(key)
            if verifier is None:  # by the key itself: an allow-list reload may change it
                verifier = self._verifiers[key] = public_key.from_public_bytes(key)
            verifier.verify(bytes.fromhex(sig), self.statement(what, r, epoch, digest, *extra))
        except (invalid_signature, ValueError, OverflowError):
            return False
        return True

    def ack_signed_by(self, peer: str, r: int, epoch: int, digest: str, sig: str) -> bool:
        """``sig`` is ``peer``'s signature of its ack of (r, epoch, digest)."""
        return self.signed_by(peer, "ack", r, epoch, digest, sig)

    def expect_acks(self, r: int, epoch: int, digest: str) -> None:
        self.acks.setdefault((r, epoch, digest), {self.id})
        if self.signer is not None:
            self.ack_sigs.setdefault((r, epoch, digest), {self.id: self.sign_ack(r, epoch, digest)})

    def note_ack(self, msg: Ack) -> Drop | None:
        """Count an ack of a result this peer published (anything else is dropped); where
        commits are certified, only one its sender signed."""
        key = (msg.round, msg.epoch, msg.digest)
        ackers = self.acks.get(key)
        if ackers is None:
            return Drop("stale_ack", f"ack from {msg.sender} for round {msg.round} epoch "
                                     f"{msg.epoch}: not a result this peer published")
        if self.certifying:
            if not self.ack_signed_by(msg.sender, *key, msg.sig):
                return Drop("bad_signature", f"ack from {msg.sender} for round {msg.round} epoch "
                                             f"{msg.epoch}: its signature does not check against "
                                             "its allow-listed signing key")
            self.ack_sigs.setdefault(key, {})[msg.sender] = msg.sig
        ackers.add(msg.sender)
        return None

    def certificate(self, r: int, epoch: int, digest: str) -> dict[str, str]:
        """The signed acks of (r, epoch, digest) this peer holds: its commit's proof."""
        return dict(self.ack_sigs.get((r, epoch, digest), {}))

    def acked(self, r: int, epoch: int, digest: str) -> int:
        return len(self.acks.get((r, epoch, digest), ()))

    def not_acked(self, r: int, epoch: int, digest: str) -> list[str]:
        """Live members that have not acked our result yet (it goes to them again)."""
        got = self.acks.get((r, epoch, digest), set())
        return [p for p in self.membership.live_peers() if p not in got]

    def ack_again(self, msg: AggregateResult) -> str | None:
        """The digest to ack once more when ``msg`` is another copy of the result this
        peer accepted (its aggregator sends it again: our ack may have been lost)."""
        held = self.accepted.get(msg.round)
        if (held is not None and held[0].sender == msg.sender and held[0].epoch == msg.epoch
                and msg.round not in self.relayed_by):
            # (not for a relayed result: this peer acked what the aggregator showed it, and
            # must not sign a second digest for that (round, epoch), a review)
            return held[1]
        return None

    def admit_commit(self, msg: Commit) -> Drop | None:
        """Record a commit from the aggregator of (round, epoch); drop anyone else's.
        Where commits are certified, only one whose certificate holds a quorum of
        acks of that very (round, epoch, digest), each signed by its member: an
        aggregator that shows peers different results cannot commit any of them
        (before, each peer absorbed what it was shown: one at 0.100, one at 0.93)."""
        if msg.sender not in self.aggregators_for(msg.round, msg.epoch):
            return Drop("wrong_aggregator", f"commit for round {msg.round} epoch {msg.epoch} "
                                            f"from {msg.sender}, not its aggregator")
        # Only a commit of a result this peer may hold (the buffer's window: results
        # outside it are refused), of a digest as payload_digest writes it: commits for
        # far rounds with long digests were kept for the whole run (a fuzzer's find).
        buffer = self.buffer
        if (not buffer.round <= msg.round <= buffer.round + buffer.lookahead
                or len(msg.digest) != 64):
            return Drop("stale_result", f"commit for round {msg.round} from {msg.sender}: "
                        f"outside rounds {buffer.round}..{buffer.round + buffer.lookahead} "
                        "or not a payload digest")
        if self.certifying:
            signed = self.verified_signers(msg.round, msg.epoch, msg.digest, msg.certificate)
            if len(signed) < self.quorum():
                bad = len(msg.certificate) - len(signed)
                return Drop("uncertified_commit",
                            f"commit for round {msg.round} epoch {msg.epoch} from {msg.sender}: "
                            f"{len(signed)} signed acks of the {self.quorum()} a commit needs"
                            + (f" ({bad} signature(s) that do not check)" if bad else ""))
            self.certificates[(msg.round, msg.digest)] = (
                msg.epoch, {p: msg.certificate[p] for p in signed})
        self.commits.add((msg.round, msg.digest))
        return None

    def verified_signers(self, r: int, epoch: int, digest: str,
                         certificate: dict[str, str]) -> list[str]:
        """The members whose signed acks of (r, epoch, digest) in ``certificate`` check,
        sorted: all of them, kept with the commit and relayed (one cut at this peer's
        quorum fell short of a receiver whose quorum is larger, a review). An entry of
        an id with no signing key costs nothing, each other one an Ed25519 check: at
        most one per allow-listed member (a padded certificate made a peer check 300 in
        37 ms, a review), for a commit from the elected aggregator, or a relay, which is
        handled once per relayer and round."""
        return [p for p, sig in sorted(certificate.items())
                if self.ack_signed_by(p, r, epoch, digest, sig)]

    def take_relayed(self, msg: Relayed) -> Drop | None:
        """Take a committed result another member relays (:meth:`relay_for`), or say why
        not. Only where commits are certified and signed statements name the run
        (``cohort.run``: else an earlier run's certificate of the round would check),
        for the round this peer is in, once per relayer and round, naming an
        allow-listed aggregator and contributors (unsigned: they only label the result),
        and only with a certificate that holds this peer's quorum of the moment in
        signed acks of (round, epoch, the payload's own digest). Two quorums share an honest member,
        which acks one result per (round, epoch), so no other result of that epoch can
        have one; a later epoch's aggregator must publish it again (*Commit*, rule 5)
        and its members ack that, so a peer that accepted another result of a *later*
        epoch refuses the relay: it holds evidence that the later aggregator did not
        (an aggregator that ignores the promises it got can certify another value at
        its epoch; a relay must not let it choose which members get which, a review).
        It replaces the result this peer accepted for the round: an aggregator that
        showed this peer another result than the quorum's (an equivocating twin,
        hfl.sim.protocol ``--peers 4 --byzantine p2:commit --buggify``, seeds 27 and
        311) left it without the round's result in each of its rounds before. Returns
        None once taken."""
        r, e, who = msg.round, msg.epoch, f"relayed result for round {msg.round} from {msg.sender}"
        if not self.certifying or not self.names_run:
            return Drop("uncertified_commit", f"{who}: this cohort has no signing keys, or no "
                        "cohort.run to tell its runs apart, so nothing shows it was committed")
        if self.everywhere:
            return Drop("wrong_aggregator", f"{who}: this cohort has no aggregator (every peer "
                        "aggregates for itself)")
        if (r != self.round or self.committed(r) is not None or self.absorbed[0] >= r
                or (msg.sender, r) in self.relays_taken):
            return Drop("stale_result", f"{who}: not this peer's round ({self.round}), or it "
                        "holds the round's committed result already, or this relayer's copy")
        self.relays_taken.add((msg.sender, r))
        # (the certificate proves the value; the aggregator, unsigned, only names the
        # absorbed result's source. Not the rotation's candidate in this peer's view: a
        # view that differs from the aggregator's, a late joiner's, refused its result
        # and then the relay, its one way to the round's result, a review)
        if msg.aggregator not in self.verify_keys or msg.aggregator == self.id:
            return Drop("wrong_aggregator", f"{who} names {clip(msg.aggregator, 40)} its "
                        "aggregator: not a member with a signing key, or this peer")
        if msg.kind == "none":
            return Drop("rejected_result", f"{who}: an abstention, which is never committed")
        named = set(msg.contributors)
        if (len(named) != len(msg.contributors) or len(named) < self.quorum()
                or not named <= self.verify_keys.keys()):
            # (contributors are not signed: cut short, they would have the receiver refuse
            # the round's result as outgrown, and the honest relayers' copies as held; made
            # up, they would count in its metrics)
            return Drop("below_quorum", f"{who} names {len(msg.contributors)} contributor(s): "
                        f"they must be distinct members with signing keys, at least the "
                        f"quorum of {self.quorum()}")
        held = self.accepted.get(r)
        digest = payload_digest(msg)
        if held is not None and held[0].epoch > e and held[1] != digest:
            return Drop("stale_result", f"{who}: certified at epoch {e}, and this peer accepted "
                        f"another result at epoch {held[0].epoch}, which only an aggregator "
                        "that ignored a promise could publish")
        signed = self.verified_signers(r, e, digest, msg.certificate)
        if len(signed) < self.quorum():
            return Drop("uncertified_commit", f"{who} epoch {e}: {len(signed)} signed acks of "
                        f"its digest of the {self.quorum()} a commit needs")
        if held is None or held[1] != digest:  # (the same value held: only its commit)
            self.accepted[r] = (self.result_of(msg), digest)
        self.commits.add((r, digest))
        self.certificates[(r, digest)] = (e, {p: msg.certificate[p] for p in signed})
        self.relayed_by[r] = msg.sender
        return None

    def note_heartbeat(self, msg: Heartbeat) -> None:
        """The aggregator of the result we accepted says it absorbed it: a commit (a
        lost commit message is made up for by its next heartbeat), except where commits
        are certified (a heartbeat proves nothing: :meth:`commit_missing`). A sender
        that sits a round out says so (:meth:`sits_out`)."""
        if msg.sitting_out > 0:
            self.sitting_out[msg.sender] = (msg.incarnation, msg.sitting_out)
        if msg.absorbed_round > self.absorbed_by.get(msg.sender, 0):
            self.absorbed_by[msg.sender] = msg.absorbed_round
        held = self.accepted.get(msg.absorbed_round)
        if (not self.certifying and held is not None and held[0].sender == msg.sender
                and held[1] == msg.absorbed_digest):
            self.commits.add((msg.absorbed_round, msg.absorbed_digest))

    def commit_missing(self, msg: Heartbeat) -> tuple[int, int, str] | None:
        """Where commits are certified: the aggregator of the result we accepted says it
        absorbed it, and its commit never reached us. The (round, epoch, digest) to ack
        again (an aggregator answers an ack of a result it committed with the commit)."""
        r = msg.absorbed_round
        held = self.accepted.get(r)
        if (not self.certifying or held is None or held[0].sender != msg.sender
                or held[1] != msg.absorbed_digest or (r, held[1]) in self.commits):
            return None
        return r, held[0].epoch, held[1]

    def lacking_last_result(self, last: int) -> list[str]:
        """This peer committed round ``last`` (the cohort's last) as its aggregator: the live
        members whose heartbeats do not yet show that result absorbed. Until they do (or
        leave, or die) the aggregator stays, so that one whose commit was lost can still
        get it (its next ack is answered with the commit, :meth:`commit_of`): after the
        last round nobody else has it."""
        c = self.last_commit
        if c is None or c.round != last:
            return []
        return [p for p in self.membership.live_peers() if self.absorbed_by.get(p, 0) < last]

    def still_in_last_round(self, last: int) -> list[str]:
        """In a decentralized round (broadcast mode, every peer aggregating), after this
        peer finished round ``last`` (the cohort's last): the live members it sent its
        knowledge of that round to that are still in it, or behind it (where it went to
        every live member, also those met since: they may ask for it, :meth:`asks_again`).
        Until they finish (their goodbye) or die, the peer stays, for ``aggregate_grace_s``
        at most, and answers their asks for that knowledge (heartbeat ``awaiting``): a
        peer that closed its links at once took with it what was still queued for a slow
        member, which then aggregated the last round without it, silently; and a late
        joiner cut off until the others finished learned nothing after the heal
        (hfl.sim.protocol, 3 peers, broadcast, buggify seed 134)."""
        if self.elected or self.sent_knowledge is None:
            return []
        sent_to, knowledge = self.sent_knowledge
        if knowledge.round != last:
            return []
        mem = self.membership
        # (to every live member: also those met since, who may ask, asks_again)
        receivers = mem.live_ids() if self.sent_to_every_member else sorted(sent_to)
        return [p for p in receivers if mem.is_live(p) and mem.members[p].round <= last]

    def note_absorbed(self, r: int, digest: str, source: str, now: float) -> None:
        """This peer absorbed round ``r``'s result ``digest`` (from ``source``) at ``now``.
        A member that holds the commit's certificate keeps the result to relay
        (:meth:`relay_for`)."""
        self.absorbed = (r, digest, source)
        held, cert = self.committed(r), self.certificates.get((r, digest))
        if (held is not None and cert is not None and self.accepted[r][1] == digest
                and source != self.id):
            self.relayable, self.relayed_to = (held, cert[0], cert[1], now), set()

    def relayers(self, r: int, certificate: dict[str, str], aggregator: str,
                 receiver: str) -> list[str]:
        """Who relays round ``r``'s committed result to ``receiver``: f + 1 of the
        members whose signed acks certify it, not its aggregator nor the receiver, taken
        from the sorted signers at a place that turns with the round (so no member
        carries every relay). f + 1: one of them is honest."""
        signers = sorted(p for p in certificate if p not in (aggregator, receiver))
        if not signers:
            return []
        start = r % len(signers)
        turned = signers[start:] + signers[:start]
        return turned[:self.distrusted + 1]

    def relay_for(self, msg: Heartbeat, now: float) -> Relayed | None:
        """The committed result this peer absorbed last as a member, with its certificate,
        to send ``msg.sender`` (once): it contributed to it, and its heartbeat, two
        heartbeat intervals or more after our absorb, says it is still in that round with
        nothing of it absorbed, and this peer is one of the round's :meth:`relayers` for
        it. The aggregator sends its result again itself (:meth:`result_for_straggler`),
        a heartbeat after the commit; a member relays for the case it cannot or will
        not: dead since, or a twin that showed this one member another result (it took
        no result in each of its rounds: hfl.sim.protocol ``--peers 4 --byzantine
        p2:commit --buggify``, seeds 27 and 311). Only where commits are certified."""
        if not self.can_relay():
            return None
        res, epoch, certificate, at = self.relayable
        hb = self.timing.heartbeat_interval_s if self.timing is not None else 0.0
        m = self.membership.members.get(msg.sender)
        if (msg.round != res.round or msg.absorbed_round >= res.round
                or msg.sender in self.relayed_to or msg.sender not in res.contributors
                or msg.sender == res.sender or now < at + 2 * hb
                or (m is not None and m.round > res.round) or msg.sitting_out >= res.round
                or self.id not in self.relayers(res.round, certificate, res.sender, msg.sender)):
            return None
        self.relayed_to.add(msg.sender)
        return self.relayed(res, epoch, certificate=certificate)

    def relayed(self, res: AggregateResult, epoch: int, **proof: Any) -> Relayed:
        """``res`` passed on by this peer (``relayed``): with its commit's certificate
        at ``epoch`` (:meth:`relay_for`), or as a copy with its own ``sig``
        (:meth:`copy_for`)."""
        return Relayed(**self.envelope(), round=res.round, epoch=epoch, aggregator=res.sender,
                       kind=res.kind, contributors=list(res.contributors), meta=res.meta,
                       tensors=res.tensors, **proof)

    @staticmethod
    def result_of(msg: Relayed, **proof: Any) -> AggregateResult:
        """The result a ``relayed`` carries, as its aggregator published it (the
        inverse of :meth:`relayed`; ``sig`` for a copy)."""
        return AggregateResult(sender=msg.aggregator, incarnation=0, round=msg.round,
                               epoch=msg.epoch, kind=msg.kind, contributors=list(msg.contributors),
                               meta=msg.meta, tensors=msg.tensors, **proof)

    def copy_for(self, msg: Heartbeat) -> Relayed | None:
        """A copy of the result this peer accepted for ``msg.round``, for the aggregator
        of a later epoch that asks for it (heartbeat ``wants_copy``, rev. 18): where
        commits are certified, that result's epoch and digest, signed by its aggregator,
        to a member asking as the candidate of a later epoch, once per asker and round
        (a result can be large: an ask costs at most one)."""
        if not self.certifying or (msg.sender, msg.round) in self.copies_sent:
            return None
        held = self.accepted.get(msg.round)
        e, _, digest = msg.wants_copy.partition(":")
        # (only to the candidate of an epoch this peer has reached itself, where its
        # promise went: any member could pull a copy from every member each round, a
        # review)
        if (held is None or not held[0].sig or f"{held[0].epoch}" != e or held[1] != digest
                or not held[0].epoch < msg.epoch <= self.epoch or msg.round != self.round
                or msg.sender not in self.aggregators_for(msg.round, msg.epoch)):
            return None
        self.copies_sent.add((msg.sender, msg.round))
        return self.relayed(held[0], held[0].epoch, sig=held[0].sig)

    def take_copy(self, msg: Relayed) -> Drop | None:
        """Keep the copy of a result this peer asked for as the aggregator of a later
        epoch (:meth:`copy_for`), or say why not: only the one it asked for (round,
        epoch and the payload's own digest), signed by the aggregator it names. It then
        publishes that value again (:meth:`proposal`), which every member checks against
        the promises as any proposal (:meth:`unjustified_result`)."""
        who = f"copy of a result for round {msg.round} epoch {msg.epoch} from {msg.sender}"
        want = self.copy_wanted
        if not self.certifying or want is None or want[:2] != (msg.round, msg.epoch):
            return Drop("stale_result", f"{who}: not asked for (or taken already)")
        digest = payload_digest(msg)
        # (from a member asked, naming that epoch's candidate: a reporter that sent the
        # value signed by itself, naming itself, ended the wait and the honest copy was
        # dropped, a review)
        if (digest != want[2] or msg.sender not in want[3]
                or msg.aggregator not in self.aggregators_for(msg.round, msg.epoch)
                or not self.signed_by(msg.aggregator, "result", msg.round, msg.epoch, digest,
                                      msg.sig)):
            return Drop("unjustified_result", f"{who}: not the result asked for ({digest[:16]}), "
                        "not from a member asked, or not signed by that epoch's aggregator")
        self.copies[msg.round] = self.result_of(msg, sig=msg.sig)
        self.copy_wanted = None
        return None

    @property
    def names_run(self) -> bool:
        """Signed statements name this run (``cohort.run``: :func:`signing_context`), so
        no other run's certificate checks here: what a relay needs."""
        return "#" in self.cohort

    def relay_expected(self, r: int) -> bool:
        """A member may relay round ``r``'s committed result to this peer: commits are
        certified, the run has an id, and a member's heartbeat says it absorbed r."""
        return (self.certifying and self.names_run
                and any(done >= r for done in self.absorbed_by.values()))

    def can_relay(self) -> bool:
        """This peer holds a result it may relay: with a run id (:meth:`take_relayed`
        refuses a relay without one), and a certificate that holds its quorum of the
        moment (the view grew since: a receiver's quorum is usually as large; a review
        counted 10 of 11 such relays refused, and one taken)."""
        return (self.relayable is not None and self.names_run
                and len(self.relayable[2]) >= self.quorum())

    def _last_relayable(self, last: int) -> tuple[AggregateResult, dict[str, str]] | None:
        """(result, certificate) this peer may relay, if it is the last round's."""
        if not self.can_relay() or self.relayable[0].round != last:
            return None
        return self.relayable[0], self.relayable[2]

    def relaying_last_result(self, last: int) -> list[str]:
        """After the last round, ``last``: the live contributors of its committed result
        this peer absorbed as a member, and may relay (:meth:`relay_for`), whose
        heartbeats do not yet show it absorbed. Until they do, it stays (for
        ``aggregate_grace_s`` at most, four heartbeats at least): after the last round
        nobody else stays with it but its aggregator, which may be the one that showed
        them another result."""
        if (held := self._last_relayable(last)) is None:
            return []
        (res, certificate), mem = held, self.membership
        return [p for p in res.contributors
                if p not in (self.id, res.sender) and p not in self.relayed_to
                and mem.is_live(p) and self.absorbed_by.get(p, 0) < last
                and self.id in self.relayers(last, certificate, res.sender, p)]

    def own_relayers(self, last: int) -> list[str]:
        """The live members that would relay the last round's result to this peer, which
        absorbed it: its heartbeat, sent them at once, ends their stay for it
        (:meth:`relaying_last_result`; each would wait for the next one, up to a
        heartbeat interval, at the end of every run)."""
        if (held := self._last_relayable(last)) is None:
            return []
        res, certificate = held
        return [p for p in self.relayers(last, certificate, res.sender, self.id)
                if self.membership.is_live(p)]

    def committed_as_aggregator(self, commit: Commit, result: AggregateResult,
                                now: float) -> None:
        """This peer, the aggregator of (round, epoch), committed ``result`` at ``now``."""
        self.last_commit = commit
        self.last_result = (result, now)
        self.result_settled = set(self.acks.get((commit.round, commit.epoch, commit.digest), ()))

    def result_for_straggler(self, msg: Heartbeat, now: float) -> AggregateResult | None:
        """The result this peer committed last as aggregator, to send ``msg.sender`` once
        more: it contributed to it, and its heartbeat, a heartbeat interval or more after
        the commit, says it still waits in that round at that epoch, with no ack of it
        received and nothing of the round absorbed. Its copy was lost. (A member that
        has not contributed may still be training: it finds the result held when it is
        done, and was sent a copy in nearly every round of a pinned hfl-sim run before
        this condition.) The aggregator sends its result again to the members that have
        not acked (after 1, 2, 4, ... heartbeats) only until it commits, which a
        quorum's quick acks make the first heartbeat, and such a member left the round
        without a result once the cohort moved on (hfl.sim.protocol, ``--peers 4
        --communicate-every 3 --rounds 10``, seed 40: result and commit lost to p2,
        which waited out two local steps of the cohort's and learned in 1 of its 2
        exchanges no fault touched). Once a member; or None."""
        if self.last_result is None:
            return None
        res, at = self.last_result
        hb = self.timing.heartbeat_interval_s if self.timing is not None else 0.0
        m = self.membership.members.get(msg.sender)
        if (msg.round != res.round or msg.epoch != res.epoch or msg.absorbed_round >= res.round
                or msg.sender in self.result_settled or msg.sender not in res.contributors
                or now < at + hb
                # (a heartbeat overtaken by newer word that it moved on: a review found 31
                # of 245 copies sent so, dropped as stale; one sitting the round out
                # absorbs only with a commit, which it never acks for)
                or (m is not None and m.round > res.round) or msg.sitting_out >= res.round):
            return None
        self.result_settled.add(msg.sender)
        return res

    def commit_of(self, msg: Ack) -> Commit | None:
        """The commit to send again when ``msg`` acks the result this peer committed last
        (the acker lacks the commit)."""
        c = self.last_commit
        if c is not None and (msg.round, msg.epoch, msg.digest) == (c.round, c.epoch, c.digest):
            self.result_settled.add(msg.sender)  # (it holds the result: result_for_straggler)
            return c
        return None

    def committed(self, r: int) -> AggregateResult | None:
        """The accepted result of round r, once its value is known committed."""
        held = self.accepted.get(r)
        return held[0] if held is not None and (r, held[1]) in self.commits else None

    def committed_result(self, r: int) -> AggregateResult | None:
        """A held result of round r whose aggregator said it committed (what a peer
        sitting the round out may still absorb: a committed value is the round's one),
        or one relayed with its certificate (:meth:`take_relayed`)."""
        if (relayed := self.committed(r)) is not None:
            return relayed
        for res in self.buffer.results_for(r):
            if res.kind != "none" and (r, self.digest_of(res)) in self.commits:
                return res
        return None

    def forget_before(self, r: int) -> None:
        """Entering round r: the commit state of earlier rounds is not needed; the result
        committed last as aggregator is kept for stragglers until the exchange after it
        (a model's copy: kept to the next commit, a rotation on, it outlived its use)."""
        if self.last_result is not None and r > self.next_exchange(self.last_result[0].round + 1):
            self.last_result = None
        if self.relayable is not None and r > self.next_exchange(self.relayable[0].round + 1):
            self.relayable = None
        self.certificates = {k: v for k, v in self.certificates.items() if k[0] >= r}
        self.relayed_by = {k: v for k, v in self.relayed_by.items() if k >= r}
        self.relays_taken = {k for k in self.relays_taken if k[1] >= r}
        self.copies = {k: v for k, v in self.copies.items() if k >= r}
        self.copies_sent = {k for k in self.copies_sent if k[1] >= r}
        if self.copy_wanted is not None and self.copy_wanted[0] < r:
            self.copy_wanted = None
        self.refused_results = {k for k in self.refused_results if k[0] >= r}
        self.accepted = {k: v for k, v in self.accepted.items() if k >= r}
        self.acks = {k: v for k, v in self.acks.items() if k[0] >= r}
        self.ack_sigs = {k: v for k, v in self.ack_sigs.items() if k[0] >= r}
        # What the others report hearing is about the round before theirs: keep one back.
        self.signed_knowledge = {k: v for k, v in self.signed_knowledge.items() if k[0] >= r - 1}
        self.heard = {k: v for k, v in self.heard.items() if k >= r - 1}
        self.commits = {k for k in self.commits if k[0] >= r}

    # ================================================================ waiting

    def awaited(self, r: int) -> list[str]:
        """Live peers whose round-``r`` knowledge is still worth waiting for.

        Only peers in round r - 1 (finishing it) or r (heartbeats say which): a peer
        further behind (paused, restarted, on the other side of a healed partition)
        cannot contribute soon and catches up on its own; one already past r has
        sent its knowledge for r, or never will. With ``cohort.communicate_every`` k,
        "r - 1" is the previous exchanging round: a peer in the local rounds between
        is on its way to r.
        """
        waits = self._awaits(r)
        return [p for p in self.membership.live_ids() if waits(p)]

    def awaits_any(self, r: int, late_too: bool = True) -> bool:
        """``bool(awaited(r))``, usually in O(1): the peer found awaited last time is
        asked first, and a scan starts after it. An aggregator asks on every
        contribution it receives, and a whole scan each time cost it O(N^2) a round
        (13 % of a profile of the protocol simulator's 1,000-peer run); as contributions
        arrive in any order, the peer found stays awaited for most of them."""
        waits, live = self._awaits(r, late_too), self.membership.live_ids()
        last = self._awaited_hint.get(r)
        if last is not None and self.membership.is_live(last) and waits(last):
            return True
        start = bisect.bisect_right(live, last) if last is not None else 0
        for p in itertools.chain(live[start:], live[:start]):
            if waits(p):
                self._awaited_hint = {r: p}
                return True
        return False

    def _awaits(self, r: int, late_too: bool = True) -> Callable[[str], bool]:
        """Whether a live peer's round-``r`` knowledge is awaited (:meth:`awaited`);
        without ``late_too``, not for the members of :attr:`late`."""
        previous = self.previous_exchange(r)
        members = self.membership.members
        got = self.buffer.received(r)
        aggregator = self.elected
        late = () if late_too else self.late

        def waits(p: str) -> bool:
            m = members[p]
            if (p in got or m.round > r or (self.sources is not None and p not in self.sources)
                    or p in late):
                return False
            # Behind only on fresh evidence: its own word on its round (a heartbeat, not
            # gossip) that arrived after this round began (a busy peer's last word may
            # simply be old), and no result of r - 1 that it contributed to.
            if m.round < previous and m.round_heard >= self.round_began:
                return False
            if self.sits_out(p, r):  # restarted into r: it neither contributes nor acks
                return False
            if p in self.equivocators:  # its knowledge is dropped: waiting would cost the round
                return False
            # (one that sent to another aggregator than us)
            return not (aggregator and m.round == r and self.served_elsewhere(r, p))
        return waits

    def finished_without(self, r: int) -> list[str]:
        """The live members whose heartbeat says they are past round ``r`` (finished the
        run, after the last round), whose round-``r`` knowledge never reached this peer:
        lost on the way. A finished member lingers and answers an ask for it
        (still_in_last_round); in a decentralized round, a member answers for the round
        just past (asks_again), also once it shared its next knowledge (asks_before):
        there, only members in the rounds up to the next exchange are asked (one that
        skipped r, restarted or caught up past it, never held it and does not answer:
        the asker waits half a heartbeat for nothing; two heartbeats cost the next round,
        hfl-sim, MDH-FL, fan-out 2, seed 1). Members whose next knowledge had come were
        left out, as holding only that, before :attr:`sent_before`."""
        got, members = self.buffer.received(r), self.membership.members
        last, nxt = r == self.last_round, self.next_exchange(r + 1)
        return [p for p in self.membership.live_ids()
                if (members[p].round > r if last else r < members[p].round <= nxt)
                and p not in got and p not in self.equivocators
                and (self.sources is None or p in self.sources) and not self.sits_out(p, r)]

    def exchange_plan(self, r: int, fanout: int, key: str) -> tuple[list[str], set[str]]:
        """``cohort.fanout``: (the peers this peer sends its round-r knowledge to, the
        peers whose round-r knowledge it waits for).

        The rotation order is shuffled with a seed every peer derives from ``key``
        (the cohort's name and seed) and r; each peer sends to the ``fanout`` peers
        after it in that ring and hears from the ``fanout`` before it, so anyone can
        check who was scheduled to teach whom. Over rounds a peer's teachers are a
        uniformly random ``fanout``-subset of the others (docs/runtime.md, Sampled
        exchange). Dead and departed peers are not skipped (a receiver does not wait
        for a sender that is not live), so views need not agree on liveness."""
        mem = self.membership  # members that left stay: the ring must not move as peers finish
        ring = mem.rotation_order()
        random.Random(f"{key}:{r}").shuffle(ring)
        n, i = len(ring), ring.index(self.id)
        k = min(fanout, n - 1)
        return ([ring[(i + j) % n] for j in range(1, k + 1)],
                {ring[(i - j) % n] for j in range(1, k + 1)})

    def served_elsewhere(self, r: int, peer_id: str) -> bool:
        """``peer_id``, in round r at the epoch its heartbeats name, sent its knowledge to
        another aggregator than us (we serve at ``self.epoch``): it failed over past us,
        or it stays with an earlier candidate that is alive in our view too (on news
        only: :meth:`said_since_epoch`). (Two peers restarted together
        rejoin at epoch 0 while the survivors failed over past them: without this, both
        aggregators waited a whole round_timeout_s for each other's peers.) A peer at an
        earlier epoch whose candidate we hold dead is still failing over to us."""
        epoch = self.membership.members[peer_id].epoch
        if epoch > self.epoch:
            return True
        return (epoch < self.epoch and self.said_since_epoch(peer_id)
                and self.candidate_alive(r, epoch))

    def said_since_epoch(self, peer_id: str) -> bool:
        """``peer_id``'s epoch is news: a heartbeat said it ``epoch_news_after_s`` after
        this peer reached its own epoch. One sent before, or as it failed over too, is
        no evidence that it waits at an earlier epoch: it may have failed over as we did (hfl-sim: an aggregator SIGSTOPped 4.5 s came back
        as the others failed over, and its alive again plus their stale epoch-0 heartbeats
        sent each of them on to the next epoch, until each served alone below the quorum)."""
        m = self.membership.members.get(peer_id)
        return m is not None and m.epoch_heard >= self.epoch_began + self.epoch_news_after_s

    def candidate_alive(self, r: int, epoch: int) -> bool:
        """The rotation's candidate for (r, epoch) is another peer, alive in our view."""
        order = self.membership.rotation_order()
        candidate = self.candidate(order, r, epoch)
        m = self.membership.members.get(candidate)
        return (candidate != self.id and m is not None and m.status == ALIVE
                and not self.sits_out(candidate, r))

    def aggregator_waits_elsewhere(self, aggregator: str, r: int) -> bool:
        """The peer we wait for as (r, self.epoch)'s aggregator says it is at an earlier
        epoch of r whose candidate is alive: it is waiting to be served there, and will
        not serve us (the waiting side of :meth:`served_elsewhere`)."""
        m = self.membership.members.get(aggregator)
        return (m is not None and m.round == r and m.epoch < self.epoch
                and self.said_since_epoch(aggregator) and self.candidate_alive(r, m.epoch))

    def serving(self, aggregator: str, r: int) -> bool:
        """``aggregator`` is alive and its heartbeats say it is in round r at this peer's
        epoch: serving us (late, or waiting for a contribution that was lost)."""
        m = self.membership.members.get(aggregator)
        return (m is not None and m.status == ALIVE and m.round == r
                and m.epoch == self.epoch and not self.sits_out(aggregator, r))

    def incarnation_of(self, peer_id: str) -> int:
        """The life of ``peer_id`` this peer last heard from (-1: unknown)."""
        m = self.membership.members.get(peer_id)
        return m.incarnation if m is not None else -1

    def behind(self, peer_id: str, r: int) -> bool:
        """Heartbeats show ``peer_id`` in a round before r."""
        m = self.membership.members.get(peer_id)
        return m is not None and m.round < r

    def cohort_past(self, r: int) -> bool:
        """Round r is over for the cohort: f + 1 live members' heartbeats say they are in
        a later round (:meth:`cohort_round`), or (the last round, which no later round
        follows) f + 1 members said goodbye after running every round (all the others,
        where fewer are in the rotation). A straggler in the last round whose result was
        lost must not fail over through every member of a cohort that has gone home, one
        detection at a time (hfl.sim.protocol, 200 peers: 20 epochs, three minutes). One
        member's word ended rounds: a member whose heartbeats said "one round ahead" of
        each receiver cost a signed, buggified cohort 148 rounds without a result in 100
        seeds against 26 (a review); an aggregator's own word on itself still counts
        (:meth:`moved_on`)."""
        if self.cohort_round() > r:
            return True
        if not (r >= self.last_round > 0 and self.finished_by):
            return False
        return len(self.finished_by) >= min(self.distrusted + 1, self.membership.order_size() - 1)

    def stop_waiting_for(self, aggregator: str, r: int, resend: bool) -> bool:
        """Whether a peer waiting for ``aggregator``'s round-r result stops waiting:
        a usable result arrived, the aggregator is dead, the cohort is past r, the
        aggregator waits at an earlier epoch or sent a result refused as unjustified
        (rev. 15), or (``resend``) an aggregator that was behind has reached r and should
        get our knowledge again."""
        return (self.usable_result(r) is not None or not self.membership.is_live(aggregator)
                or self.sits_out(aggregator, r) or self.moved_on(r, aggregator)
                or self.aggregator_waits_elsewhere(aggregator, r)
                or (r, self.epoch, aggregator) in self.refused_results
                or (resend and not self.behind(aggregator, r)))

    def past_round(self, aggregator: str) -> int:
        """The round the cohort is in by the words :meth:`moved_on` takes: f + 1 members'
        (:meth:`cohort_round`), or the aggregator's own (for the log: the highest round
        one member claims is no evidence)."""
        m = self.membership.members.get(aggregator)
        return max(self.cohort_round(), m.round if m is not None else 0)

    def moved_on(self, r: int, aggregator: str) -> bool:
        """Round r is over for a peer that waits on ``aggregator``: a live peer is in a
        later round (:meth:`cohort_past`) and the aggregator is not alive and serving r
        at this peer's epoch. One peer that gave up on r (failed over to itself and
        fell short of the quorum, or restarted) must not pull the cohort past a round
        whose aggregator is still collecting contributions or acks; an aggregator that
        is itself past r (its own word: a heartbeat, or a goodbye after the last round),
        dead or elsewhere no longer holds anyone back."""
        m = self.membership.members.get(aggregator)
        own = m is not None and (m.round > r or (r >= self.last_round > 0
                                                 and aggregator in self.finished_by))
        return (own or self.cohort_past(r)) and not self.serving(aggregator, r)

    def round_still_open(self, r: int, aggregator: str) -> bool:
        """Where commits are certified: ``aggregator`` went past round r (:meth:`moved_on`
        by its own word) while no member absorbed a result of r, and a quorum of members
        (this peer included) is still in r, so failing over can still give the round a
        result. An aggregator that showed its result to one member only and moved on
        without a commit cost every round it was elected for: each member took its word
        as "the result went out" and left (an attack review; hfl.sim.protocol's ``hide``
        twin, 4 peers: 3 of 10 rounds without a result). A member's claim that it
        absorbed r (its heartbeat) still ends the wait, as before: the relay brings the
        result where one was committed."""
        if not self.certifying or self.epoch > 0:
            # (from the round's first aggregator only: from any epoch, members that each
            # failed over on their own scattered over seven epochs of a forming cohort
            # of 32, none with a quorum, and rounds 1 to 7 went without a result; a
            # review. The hide twin is elected at epoch 0; one at a later epoch still
            # costs its round)
            return False
        mem = self.membership
        others = [p for p in mem.live_peers() if p not in (self.id, aggregator)]
        # (not the aggregator's own word that it absorbed r: counted, an aggregator that
        # hid its result and said so had every member leave again, 201 of 1,000 rounds
        # without a result against 72, a review; members that acked a result whose
        # commit was lost to them fail over and may lose a round the relay would have
        # brought, about as many lost as gained in honest soaks)
        if any(self.absorbed_by.get(p, 0) >= r for p in others):
            return False
        return 1 + sum(1 for p in others if mem.members[p].round == r) >= self.quorum()

    def acks_out_of_reach(self, r: int, epoch: int, digest: str, quorum: int) -> bool:
        """The aggregator of (r, epoch) can no longer gather ``quorum`` acks of
        ``digest``: the cohort is past r and too few of the live members that have not
        acked are still in round r (one that moved on never acks). Until then it keeps
        collecting, whoever is ahead."""
        if not self.cohort_past(r):
            return False
        mem = self.membership
        could = sum(1 for p in self.not_acked(r, epoch, digest) if mem.members[p].round <= r)
        return self.acked(r, epoch, digest) + could < quorum

    def failover_reason(self, aggregator: str, r: int) -> str:
        """Why this peer leaves ``aggregator``'s epoch (for the log line)."""
        if not self.membership.is_live(aggregator):
            return "is dead"
        if self.sits_out(aggregator, r):
            return "sits the round out (restarted into it)"
        if (r, self.epoch, aggregator) in self.refused_results:
            return "sent a result its promises do not justify (unjustified_result)"
        if self.aggregator_waits_elsewhere(aggregator, r):
            return "waits at an earlier epoch"
        m = self.membership.members.get(aggregator)
        if m is not None and m.round > r and self.round_still_open(r, aggregator):
            # (it said "missed its deadline" well before the deadline: a review)
            return "went past the round with no result taken here, while a quorum is in it"
        return "missed its deadline"

    def catch_up(self, last: int) -> int:
        """The round to run next (:func:`catch_up_round` with the cohort's round)."""
        return catch_up_round(self.mode, self.round, self.cohort_round(), last,
                              self.next_exchange(self.round))

    # ================================================================ exchange schedule

    def communicates(self, r: int) -> bool:
        """Whether round r exchanges knowledge (``cohort.communicate_every`` k: every
        k-th round and the last one; every round by default). The other rounds are a
        local step only: no knowledge, no aggregator, no result."""
        return r % self.communicate_every == 0 or r == self.last_round

    def next_exchange(self, r: int) -> int:
        """The first exchanging round at or after r."""
        k = self.communicate_every
        nxt = -(-r // k) * k
        return min(nxt, self.last_round) if self.last_round >= r else nxt

    def turn(self, r: int) -> int:
        """Round r's place in the aggregator rotation: its exchange's ordinal (r itself
        when every round exchanges), so that exchanges every k rounds do not always
        elect the same peer when k is a multiple of the cohort's size."""
        return -(-r // self.communicate_every)

    def candidate(self, order: list[str], r: int, epoch: int) -> str:
        """The rotation's candidate for (r, epoch) (:func:`hfl.peer.membership.elect`)."""
        return rotation_candidate(order, self.turn(r), epoch)

    def previous_exchange(self, r: int) -> int:
        """The last exchanging round before r (r - 1 by default; 0: none)."""
        return (r - 1) // self.communicate_every * self.communicate_every


def _small_int(text: str) -> int | None:
    """A round or epoch read from a peer's text field: a non-negative int that fits a
    msgpack integer, else None. ASCII digits only: "²".isdigit() is True and int("²")
    raises (a member's report of it stopped every peer that read it)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        return None
    return int(text)


def _canonical(value: Any) -> Any:
    """Plain data as the wire carries it, with every map's keys in sorted order: the
    same value encodes to the same bytes whatever order its maps were built in, and a
    map never encodes as an array (msgpack marks each). numpy scalars become Python
    values and tuples lists, as the codec sends them."""
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


_ED25519: tuple[type, type] | None = None


def _ed25519() -> tuple[type, type]:
    """(InvalidSignature, Ed25519PublicKey), imported once, on first use (an unsigned
    cohort never loads the library; a signed one checks several signatures a round)."""
    global _ED25519
    if _ED25519 is None:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        _ED25519 = (InvalidSignature, Ed25519PublicKey)
    return _ED25519


#: the digest a promise signs where it reports no accepted result
NO_DIGEST = "0" * 64
_HEX = frozenset("0123456789abcdef")


def report_well_formed(accepted_epoch: int, accepted_digest: str) -> bool:
    """A promise's report as an honest peer writes it: none (-1, "") or an epoch and a
    payload digest (64 lowercase hex digits)."""
    if accepted_epoch == -1:
        return accepted_digest == ""
    return (accepted_epoch >= 0 and len(accepted_digest) == 64
            and set(accepted_digest) <= _HEX)


def promise_text(epoch: int, accepted_epoch: int, accepted_digest: str, sig: str) -> str:
    """A promise as a result carries it: "epoch:accepted_epoch:accepted_digest:sig"."""
    return f"{epoch}:{accepted_epoch}:{accepted_digest}:{sig}"


def parse_promise(text: Any) -> tuple[int, int, str, str] | None:
    """:func:`promise_text` read back, (epoch, accepted_epoch, accepted_digest, sig), or
    None where it is not one an honest peer writes (a well-formed report, an accepted
    epoch no higher than the promised one)."""
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) != 4:
        return None
    pe, ae = _small_int(parts[0]), -1 if parts[1] == "-1" else _small_int(parts[1])
    if pe is None or ae is None or not report_well_formed(ae, parts[2]) or ae > pe:
        return None
    return pe, ae, parts[2], parts[3]


def proof_form(proof: Any) -> tuple | None:
    """A report's proof as the wire may carry it (any plain data): ``("acks", {peer:
    sig})``, ``("result", by, sig, promises)``, or None for anything else (a proof
    with both forms' fields, or a field of another type, is no proof: a ``by`` that
    was a list raised at the aggregator, a review)."""
    if not isinstance(proof, dict):
        return None
    if proof.keys() == {"acks"}:
        acks = proof["acks"]
        if isinstance(acks, dict) and all(isinstance(v, str) for v in acks.values()):
            return ("acks", acks)
        return None
    by, sig, promises = proof.get("by"), proof.get("sig"), proof.get("promises", {})
    if (proof.keys() <= {"by", "sig", "promises"} and isinstance(by, str)
            and isinstance(sig, str) and isinstance(promises, dict)):
        return ("result", by, sig, promises)
    return None


def payload_digest(payload: Any) -> str:
    """The SHA-256 (64 hex digits) of a payload (or a message): its kind and meta, then
    each array by name: a msgpack header [name, dtype, shape], then its bytes in C
    order (PROTOCOL.md, heartbeat ``absorbed_digest``). Everything a receiver would use
    is covered, and every part is self-delimiting: what is signed or acked by this
    digest is one payload (a 64-bit prefix let an aggregator find two results with
    one digest in about 2^32 tries)."""
    h = hashlib.sha256(b"hfl-payload\x00")
    h.update(msgpack.packb([payload.kind, _canonical(dict(payload.meta))], use_bin_type=True))
    for name in sorted(payload.tensors):
        arr = np.asarray(payload.tensors[name])
        if arr.dtype.byteorder == ">":  # as the codec sends it: little-endian
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        h.update(msgpack.packb([name, dtype_name(arr.dtype), list(arr.shape)]))
        h.update(np.ascontiguousarray(arr))  # no copy for the usual contiguous array
    return h.hexdigest()


def catch_up_round(mode: str, own: int, cohort: int, last: int, exchange: int | None = None) -> int:
    """The round to run next: a coordinated peer that finds the live cohort
    ahead (after a restart, say) jumps to the cohort's round instead of
    replaying rounds nobody else is in; local-mode rounds are the peer's own.
    ``exchange`` is the peer's next exchanging round (``cohort.communicate_every``;
    ``own`` by default): a cohort that is ahead but not past it is waiting there, and
    the peer runs its local rounds up to it instead of skipping them."""
    if mode == "local" or cohort <= (own if exchange is None else exchange):
        return own
    return min(cohort, last)


def clip(text: Any, limit: int = 120) -> str:
    """``text`` made safe to log: control characters escaped, at most ``limit`` chars.

    Everything a peer logs or echoes that another peer chose (ids, reasons,
    cohort names) goes through here, so a hostile 1 MB string costs one short line.
    """
    s = str(text)
    if not s.isprintable():
        s = s.encode("unicode_escape", errors="backslashreplace").decode("ascii")
    return s if len(s) <= limit else f"{s[:limit]}...({len(s) - limit} more chars)"


__all__ = ["ALIVE", "DEAD", "LEFT", "SUSPECT", "Drop", "PeerCore", "catch_up_round",
           "payload_digest"]
