"""What the protocol core tells its shell to do: typed instructions, no I/O.

:meth:`hfl.peer.core.PeerCore.handle` takes a received message and returns a list of
these; :class:`hfl.peer.node.Node` carries them out in order (sends, logs, wake-ups),
so every decision about a message is made in the core, where a test can read it off
the list without sockets, tasks or a clock.

The round procedures (:mod:`hfl.peer.procedures`) are generators that yield these one
at a time; the last group below (:class:`Wait`, :class:`Aggregate`, :class:`Compute`,
:class:`StartCompute`, :class:`JoinCompute`, :class:`RoundBegins`, :class:`RoundDone`,
:class:`EnterRound`, :class:`CrashPoint`, :class:`Note`) exists only there, and the
value the shell sends back into the generator is the instruction's answer
(:class:`Wait`: whether the condition came true; :class:`Aggregate`, :class:`Compute`,
:class:`JoinCompute`: the method's value).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hfl.protocol import Message, SeedChunk


@dataclass(frozen=True)
class Reply:
    """Send ``msg`` to ``address`` soon, off the receive loop (only ``peer_id`` can read it
    on an authenticated transport). ``address`` None: the peer has no address (nothing
    goes out)."""

    address: str | None
    msg: Message
    peer_id: str


@dataclass(frozen=True)
class SendTo:
    """Send ``msg`` to member ``peer_id`` at its current address, in a task of its own
    (``why`` names it), waiting at most ``timeout_s`` for the link."""

    peer_id: str
    msg: Message
    why: str
    timeout_s: float | None = None


@dataclass(frozen=True)
class Send:
    """Send ``msg`` to ``address`` (``peer_id``: who must read it there; None: whoever
    answers, a bootstrap address) as part of the current batch: the shell sends a
    batch's messages together and waits until all are out."""

    address: str | None
    msg: Message
    timeout_s: float | None = None
    peer_id: str | None = None
    to_member: bool = False  # address is a member id: send to its current address


@dataclass(frozen=True)
class Broadcast:
    """Send ``msg`` to each of ``peer_ids`` (members), as part of the current batch."""

    peer_ids: tuple[str, ...]
    msg: Message
    timeout_s: float | None = None


@dataclass(frozen=True)
class Forget:
    """Close the link to ``address`` (``peer_id`` left: a new life reconnects)."""

    address: str
    peer_id: str


@dataclass(frozen=True)
class Dropped:
    """A message not taken: counted under ``code`` and logged with ``reason``."""

    code: str
    reason: str


@dataclass(frozen=True)
class Refused:
    """A peer refused our hello (most likely: its ``reason`` names the field that
    differs); counted under ``refused`` and logged as an error."""

    reason: str


@dataclass(frozen=True)
class MemberChanged:
    """A member's status changed in this peer's view (logged, and a ``member`` note).
    ``level`` None: the usual level for a change (a SWIM join is debug)."""

    change: Any  # hfl.peer.membership.Change
    level: int | None = None
    note: str = ""


@dataclass(frozen=True)
class Say:
    """A log line: ``template % args`` at ``level`` (the template is what the console
    deduplicates on)."""

    level: int
    template: str
    args: tuple = ()


@dataclass(frozen=True)
class NamedEquivocator:
    """``peer`` is proven to have signed two contributions for ``round`` (digests
    ``first`` and ``second``; the proof came with ``via``'s message): said once."""

    peer: str
    round: int
    via: str
    first: str
    second: str


@dataclass(frozen=True)
class ServeSeeds:
    """Send ``peer_id`` (at ``address``) the chunks of our seed set it asked for and is
    due (PeerCore.seed_chunks_due), in the background."""

    peer_id: str
    address: str
    chunks: list[SeedChunk]


@dataclass(frozen=True)
class Wake:
    """Something a waiting round may be waiting for changed: re-check its conditions."""


WAKE = Wake()


# ---------------------------------------------------------------- round procedures


@dataclass(frozen=True)
class Wait:
    """Wait until ``done()`` is true or the clock passes ``deadline`` (moved on by any
    time the peer stood still meanwhile); answered with whether ``done()`` came true.
    ``done`` reads only the core's state, which messages change while it waits."""

    done: Callable[[], bool]
    deadline: float


@dataclass(frozen=True)
class Aggregate:
    """Run the method's ``aggregate(round, contributions)`` off the event loop; answered
    with its result (a Payload, or None: the method published nothing)."""

    round: int
    contributions: dict


@dataclass(frozen=True)
class Compute:
    """Run one of the method's calls off the event loop (hfl.algorithms.base.Algorithm):
    ``call`` is ``local_update``, ``share``, ``absorb`` or ``evaluate``, with ``args``;
    answered with its value."""

    call: str
    args: tuple = ()


@dataclass(frozen=True)
class StartCompute:
    """:class:`Compute`, started and not waited for (``cohort.overlap``: the next round's
    local step while this round's exchange is out); answered with None at once. At
    most one runs; :class:`JoinCompute` waits for it. Nothing else touches the model
    meanwhile: the procedure joins it before any other call."""

    call: str
    args: tuple = ()


@dataclass(frozen=True)
class JoinCompute:
    """Wait for the call :class:`StartCompute` started; answered with its value."""


@dataclass(frozen=True)
class RoundBegins:
    """Round ``round`` starts (before its training): the shell starts the round's
    accounting (time, bytes, the method's CPU) and hands the method what arrived
    meanwhile (members' public seed sets)."""

    round: int


@dataclass(frozen=True)
class RoundDone:
    """Round ``round`` ended: the shell writes its record from the method's ``metrics``,
    ``evaluation`` (None: not evaluated this round, ``node.evaluate_every``) and the
    exchange's ``info`` (learned_from, epoch, ...), and checkpoints after an evaluation."""

    round: int
    metrics: dict
    evaluation: dict | None
    info: dict


@dataclass(frozen=True)
class EnterRound:
    """Record, durably, that this life entered ``round`` before it contributes or acks
    there (a restarted life sits out the rounds an earlier one may have acked)."""

    round: int


@dataclass(frozen=True)
class CrashPoint:
    """A place where fault injection (``fault.crash_at_round``/``crash_phase``) may kill
    the peer: round ``round``, in any of ``phases``."""

    round: int
    phases: tuple[str, ...]


@dataclass(frozen=True)
class Note:
    """A typed note for events.jsonl (hfl.peer.status.TYPED_EVENTS): ``kind`` and its
    fields."""

    kind: str
    fields: dict


Instruction = (Reply | SendTo | Send | Broadcast | Forget | Dropped
               | Refused | MemberChanged | Say | NamedEquivocator | ServeSeeds
               | Wake | Wait | Aggregate | Compute | RoundBegins | RoundDone | EnterRound
               | CrashPoint | Note)
