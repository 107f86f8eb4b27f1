"""Message types of the hfl wire protocol (spec: PROTOCOL.md at the repo root).

Every message is a frozen dataclass. All share the envelope fields ``sender``
(the peer id) and ``incarnation`` (bumped each time that peer process restarts),
so a receiver can bind a message to a peer and tell a restarted peer from a
stale one. Tensors travel as raw frames after a msgpack header (see codec.py);
here they are plain numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

PROTOCOL_VERSION = 5

#: Member status values carried in the membership view.
MEMBER_STATUSES = ("alive", "suspect", "dead", "left")


@dataclass(frozen=True, kw_only=True)
class Message:
    """Envelope fields common to every message."""

    TYPE: ClassVar[str] = ""
    sender: str
    incarnation: int


@dataclass(frozen=True, kw_only=True)
class MemberRecord:
    """One entry of a membership view."""

    peer_id: str
    address: str
    incarnation: int
    status: str = "alive"
    #: 1: the sender knows this member by its own evidence (heard from it itself), so
    #: the record is a report that counts towards the receiver's rotation order
    #: (``timing.join: lazy``; 0 and absent: a suggestion only)
    vouched: int = 0


@dataclass(frozen=True, kw_only=True)
class Hello(Message):
    """Handshake: sent to a bootstrap address and to every newly learned member.

    ``shared`` carries the dimensions the algorithm needs peers to agree on (for
    example ``{"embedding_dim": 64}``), never anything about the architecture.
    """

    TYPE: ClassVar[str] = "hello"
    address: str
    cohort: str
    algorithm: str
    num_classes: int
    rounds: int
    round: int = 0
    shared: dict[str, int] = field(default_factory=dict)
    capabilities: list[str] = field(default_factory=list)
    # 1: the sender already holds the receiver in its view (gossip suggested it), so
    # the receiver's welcome carries no member list and it needs not greet back.
    introduced: int = 0
    # timing.join lazy, a hello that asks for the receiver's view: how much of it the
    # sender already has (the receiver's ``view_upto`` of its last answer; 0: all of it).
    view_from: int = 0
    # 1 + the part of the cohort's data split (``shared["data_split"]``) the sender trains
    # on (data.partition_index); 0: it splits nothing. Two peers of one split that train
    # on one part refuse each other (rev. 20).
    part: int = 0


@dataclass(frozen=True, kw_only=True)
class Welcome(Message):
    """Handshake reply: the sender's membership view and its current round."""

    TYPE: ClassVar[str] = "welcome"
    address: str
    round: int
    members: list[MemberRecord] = field(default_factory=list)
    # timing.join lazy: ``members`` are the members the sender heard from itself after
    # the first ``view_from`` of them (in the order it did), and this is how many it has
    # now: the asker's next ``view_from`` (0: a whole view, as before)
    view_upto: int = 0


@dataclass(frozen=True, kw_only=True)
class Gossip(Message):
    """Periodic push of the sender's membership view."""

    TYPE: ClassVar[str] = "gossip"
    members: list[MemberRecord] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    """Liveness signal; also tells the receiver which round the sender is in, and
    the aggregator epoch it is at in that round.

    With ``timing.membership: swim`` it is also the failure detector's probe: a
    heartbeat with ``probe`` 1 asks for a heartbeat back (to ``relay`` if set: an
    indirect probe on that member's behalf), one with ``target`` asks the receiver
    to probe that member for the sender, and ``members`` piggybacks news of
    failures and departures (PROTOCOL.md, "Membership")."""

    TYPE: ClassVar[str] = "heartbeat"
    round: int
    epoch: int = 0
    # The last aggregate the sender absorbed: its round (0: none yet) and a digest of
    # its arrays, so peers that absorbed different aggregates for one round notice.
    absorbed_round: int = 0
    absorbed_digest: str = ""
    # The round the sender sits out (0: none): restarted into a round an earlier life of
    # it entered, it neither contributes, acks nor serves there (its own word that the
    # rotation may skip it for that round).
    sitting_out: int = 0
    # From an aggregator to a member it still waits for (0: none): "round r's knowledge
    # for my epoch has not reached me"; a member that sent it there sends it again.
    awaiting: int = 0
    probe: int = 0
    relay: str = ""
    target: str = ""
    members: list[MemberRecord] = field(default_factory=list)
    # timing.join lazy: a digest of the sender's rotation order (0: none). A receiver
    # whose order differs asks the sender for its view (PROTOCOL.md, lazy join).
    view: int = 0
    # rev. 18, where commits are certified: from the aggregator of (round, epoch) to the
    # members whose promises reported a result it holds no copy of, "accepted_epoch:
    # digest" ("": none; off the wire): a member that accepted that result sends it
    # (``relayed`` with the result's own ``sig`` and no certificate), once per asker
    wants_copy: str = ""


@dataclass(frozen=True, kw_only=True)
class Leave(Message):
    """The sender is leaving the cohort on purpose (finished, or shutting down)."""

    TYPE: ClassVar[str] = "leave"
    reason: str = ""
    round: int = 0


@dataclass(frozen=True, kw_only=True)
class Knowledge(Message):
    """What an algorithm shares for one round.

    ``epoch`` is used by aggregator-based methods: a contribution for round r is
    addressed to the aggregator elected for (r, epoch). ``accepted_epoch`` and
    ``accepted_digest`` say which result of round r the sender accepted last (-1
    and "": none): an aggregator of a later epoch must publish that result again
    rather than its own (PROTOCOL.md, "Commit").
    """

    TYPE: ClassVar[str] = "knowledge"
    round: int
    kind: str
    epoch: int = 0
    accepted_epoch: int = -1
    accepted_digest: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    #: hex Ed25519 signature of the sender over (cohort, round, epoch, payload digest)
    #: ("" in a cohort without signing keys): a receiver can show it to the others
    sig: str = ""
    #: every peer aggregating: the contributions the sender received for round
    #: ``heard_round`` (its last), peer -> "epoch:digest:sig" as their senders signed them
    heard_round: int = 0
    heard: dict[str, str] = field(default_factory=dict)
    #: proofs of equivocation the sender holds: peer -> "round:epoch:digest:sig:epoch:digest:sig"
    #: (two signed contributions of one round that differ)
    equivocations: dict[str, str] = field(default_factory=dict)
    #: where commits are certified (rev. 15): the sender's signature over (cohort, round,
    #: epoch, accepted_digest, accepted_epoch), its *promise* ("" unsigned; off the wire)
    promise_sig: str = ""
    #: the proof that the result it reports accepted was justified: "epoch:digest" ->
    #: {"acks": {peer: sig}} (a commit's certificate) or {"by": aggregator, "sig": its
    #: signature of the result, "promises": the promises it was chosen on}, with the
    #: entries those promises' reports need (PROTOCOL.md, *Justified proposals*)
    proofs: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class _RoundResult(Message):
    """The fields of a round's result, as its aggregator publishes it (``aggregate``) and
    as a member relays it committed (``relayed``). Not a message type of its own."""

    round: int
    epoch: int
    kind: str
    contributors: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class AggregateResult(_RoundResult):
    """The elected aggregator's result for (round, epoch): accepted, acknowledged, and
    absorbed only once the aggregator commits it. ``kind == "none"`` with no
    contributors and no tensors is an abstention: no result for (round, epoch)."""

    TYPE: ClassVar[str] = "aggregate"
    #: where commits are certified (rev. 15): the aggregator's signature over (cohort,
    #: round, epoch, payload digest) ("" unsigned, and for an abstention; off the wire)
    sig: str = ""
    #: at an epoch above 0, the quorum of promises the result was chosen on, its own
    #: included: peer -> "epoch:accepted_epoch:accepted_digest:promise_sig"
    promises: dict[str, str] = field(default_factory=dict)
    #: the proofs of the reports in ``promises`` (as Knowledge's ``proofs``)
    proofs: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Ack(Message):
    """To the aggregator of (round, epoch): the sender accepted its result ``digest``."""

    TYPE: ClassVar[str] = "ack"
    round: int
    epoch: int
    digest: str
    #: hex Ed25519 signature of the sender over (cohort, round, epoch, digest)
    #: (:func:`ack_statement`); "" in a cohort without signing keys
    sig: str = ""


@dataclass(frozen=True, kw_only=True)
class Commit(Message):
    """From the aggregator of (round, epoch): a quorum accepted result ``digest``;
    whoever holds it absorbs it."""

    TYPE: ClassVar[str] = "commit"
    round: int
    epoch: int
    digest: str
    #: the quorum's signed acks of (round, epoch, digest): peer id -> its ``sig``
    certificate: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Relayed(_RoundResult):
    """A committed result of (round, epoch), passed on by a member that absorbed it to
    a contributor whose heartbeats say it still waits for it, with the commit's
    certificate: taken only where commits are certified and only when ``certificate``
    holds the receiver's quorum of signed acks of the payload's digest, with the
    checks of PROTOCOL.md's ``relayed`` section (``PeerCore.take_relayed``)."""

    TYPE: ClassVar[str] = "relayed"
    #: the aggregator that committed it: nothing signed names it, so the receiver takes
    #: it only where its rotation names the same one for (round, epoch)
    aggregator: str
    #: the commit's certificate: peer id -> its ack ``sig`` of (round, epoch, digest)
    certificate: dict[str, str] = field(default_factory=dict)
    #: rev. 18: a copy of a result this member accepted, not (yet) committed, sent to the
    #: aggregator of a later epoch that asked for it (heartbeat ``wants_copy``): the
    #: result's aggregator's own signature of it, and no certificate ("" otherwise; off
    #: the wire)
    sig: str = ""


@dataclass(frozen=True, kw_only=True)
class Error(Message):
    """A refusal or failure report, sent instead of raising across the wire."""

    TYPE: ClassVar[str] = "error"
    code: str
    reason: str
    ref_type: str = ""


@dataclass(frozen=True, kw_only=True)
class SeedRequest(Message):
    """Ask a peer for chunks of ``owner``'s public seed set (all of them if ``chunks`` is empty)."""

    TYPE: ClassVar[str] = "seed_request"
    owner: str
    chunks: list[int] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SeedChunk(Message):
    """One chunk of ``owner``'s public seed set: samples ``start .. start + len(y) - 1``.

    ``digest`` is the SHA-256 (hex) of the chunk's ``x`` bytes followed by its
    ``y`` bytes; a receiver drops a chunk whose tensors do not hash to it.
    """

    TYPE: ClassVar[str] = "seed_chunk"
    owner: str
    chunk: int
    num_chunks: int
    start: int
    total: int
    digest: str
    tensors: dict[str, np.ndarray] = field(default_factory=dict)


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        Hello, Welcome, Gossip, Heartbeat, Leave, Knowledge, AggregateResult, Ack, Commit,
        Relayed, Error, SeedRequest, SeedChunk,
    )
}


class ErrorCode:
    """Codes used in :class:`Error` replies and in :class:`ProtocolError`."""

    BAD_FRAMES = "bad_frames"  # wrong frame count, empty message
    TOO_LARGE = "too_large"  # over max_message_bytes / max_frames / max tensor size
    BAD_HEADER = "bad_header"  # header is not a msgpack map of the right shape
    UNKNOWN_TYPE = "unknown_type"  # type not in MESSAGE_TYPES
    VERSION_MISMATCH = "version_mismatch"
    BAD_TENSOR = "bad_tensor"  # dtype not allowed, shape/bytes mismatch
    IDENTITY_MISMATCH = "identity_mismatch"  # header sender != transport identity
    COHORT_MISMATCH = "cohort_mismatch"  # handshake for another cohort / algorithm
    NOT_MEMBER = "not_member"  # message from a peer that never said hello


class ProtocolError(Exception):
    """A message could not be accepted. Carries an :class:`ErrorCode` value."""

    def __init__(self, code: str, reason: str, ref_type: str = ""):
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
        self.ref_type = ref_type  # the message's type, where it could be read
