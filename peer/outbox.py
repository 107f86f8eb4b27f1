"""A peer's sending: encode once, hand frames to the transport, count what went.

The node (hfl.peer.node) carries the core's send instructions out through one
:class:`Outbox`. Every send follows the same path:

- encode the message once, however many peers get it; a message that breaks the
  protocol's limits is counted (``unsendable``) and logged. This peer's knowledge
  whose payload (its own work: its model on its own data) cannot go out raises
  :class:`~hfl.peer.status.Unsendable`, which stops the peer: the next round's would
  be as large, and a peer that cannot share only trains alone, round after round.
  Not an aggregate: it is made of members' contributions, and a member must not be
  able to stop its aggregator (that round fails over instead);
- hand the frames to the transport at once where it can take them without waiting
  (``Transport.send_now``: most sends, no task each);
- otherwise wait for the link, at most the send timeout;
- count what went, by type: messages (``sent``: summary.json's ``sent_by_type``, the
  round record's membership messages) and their bytes (``sent_bytes``).

Nothing here decides what to send or to whom: the core and its round procedures do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from hfl.peer import instructions as do
from hfl.peer.status import Unsendable
from hfl.peer.transport import frames_nbytes
from hfl.protocol import ErrorCode, Limits, Message, ProtocolError, encode

log = logging.getLogger("hfl.peer")

#: The messages that carry this peer's own work: one whose payload cannot go on the
#: wire by itself stops the peer (:meth:`Outbox.encode`).
OWN_WORK = frozenset({"knowledge"})


class Outbox:
    def __init__(self, peer_id: str, transport, limits: Limits, send_timeout_s: float,
                 members: Callable[[], Any], spawn: Callable[[Awaitable, str], Any],
                 dropped: Counter):
        self.id = peer_id
        self.transport = transport
        self.limits = limits
        self.send_timeout_s = send_timeout_s
        self._members = members  # -> the current Membership (the core may replace it)
        self._spawn = spawn  # a task the node owns (cancelled when it stops)
        self.dropped = dropped
        self.sent: Counter[str] = Counter()  # messages handed to the transport, by type
        self.sent_bytes: Counter[str] = Counter()  # and their bytes (frames), by type

    def encode(self, msg: Message):
        """The message's frames, or None (counted and logged) when it breaks the limits;
        for this peer's own work (:data:`OWN_WORK`), :class:`Unsendable` instead."""
        try:
            return encode(msg, self.limits)
        except ProtocolError as err:
            self.dropped["unsendable"] += 1
            if msg.TYPE in OWN_WORK and not self._fits_without_what_members_sent(msg):
                raise Unsendable(self._why_unsendable(msg, err)) from err
            log.error("%s: cannot send %s: %s", self.id, msg.TYPE, err)
            return None

    def _fits_without_what_members_sent(self, msg: Message) -> bool:
        """Whether ``msg`` would go out without the parts members' messages put in it
        (the contributions it heard, the equivocation proofs it passes on). Only the
        method's own payload stops the peer: a member must not be able to stop it by
        what it sends. (The method's meta stays: FedMD names there the member whose set
        it teaches on, an id, which the sender check bounds.)"""
        try:
            encode(dataclasses.replace(msg, heard={}, equivocations={}), self.limits)
        except ProtocolError:
            return False
        return True

    def _why_unsendable(self, msg: Message, err: ProtocolError) -> str:
        what = f"its {msg.TYPE} for round {getattr(msg, 'round', '?')}"
        if err.code != ErrorCode.TOO_LARGE or not any(
                bound in str(err) for bound in ("max_message_bytes", "elements")):
            return (f"{self.id}: {what} cannot go on the wire ({err}): the method made a "
                    "payload the protocol does not carry; stopping, since every round "
                    "would fail the same way")
        mib = self.limits.max_message_bytes / 2**20
        return (f"{self.id}: {what} cannot go on the wire ({err}): every message must fit "
                f"node.max_message_mib ({mib:g} MiB, tensors of at most "
                f"{self.limits.max_tensor_elements:,} elements); raise it on every peer of "
                "the cohort (each must set the same), or share a smaller model. Stopping "
                "now rather than training alone every round")

    def _counted(self, msg: Message, address: str, ok: bool, frames) -> bool:
        self.sent[msg.TYPE] += ok  # (a type whose every send failed is listed, with 0)
        self.sent_bytes[msg.TYPE] += frames_nbytes(frames) if ok else 0
        if not ok:
            log.debug("%s: %s to %s not sent (unreachable or timed out)", self.id, msg.TYPE, address)
        return ok

    def now(self, address: str | None, msg: Message, frames, peer_id: str | None) -> bool | None:
        """Send without waiting where the transport can (most sends): whether it went,
        or None (it must wait: the caller awaits :meth:`send`)."""
        if address is None:
            return None
        ok = self.transport.send_now(address, frames, peer_id=peer_id)
        return None if ok is None else self._counted(msg, address, ok, frames)

    async def send(self, address: str, msg: Message, timeout_s: float | None = None,
                   peer_id: str | None = None, frames=None) -> bool:
        """Send ``msg`` (already encoded: ``frames``) to ``address``; whether it went."""
        frames = self.encode(msg) if frames is None else frames
        if frames is None:
            return False
        ok = await self.transport.send(
            address, frames, self.send_timeout_s if timeout_s is None else timeout_s,
            peer_id=peer_id)
        return self._counted(msg, address, ok, frames)

    async def send_to(self, peer_id: str, msg: Message, timeout_s: float | None = None,
                      frames=None) -> bool:
        """Send to a member at the address its view holds (False if it holds none)."""
        address = self._members().address_of(peer_id)
        return False if address is None else await self.send(address, msg, timeout_s, peer_id,
                                                              frames)

    def start_broadcast(self, peer_ids: Iterable[str], msg: Message,
                        timeout_s: float | None = None,
                        held: set[str] | None = None) -> Awaitable[int]:
        """A broadcast's sends that go out without waiting, now, in order; returns the
        awaitable that waits for the others and says how many took it.

        A member already suspected gets no wait at all (queued if its link takes it,
        else dropped): a silent peer must never hold up a round's broadcast. ``held``:
        addresses an earlier send of the same batch waits for (a send to them waits
        behind it, in order); those that wait here are added."""
        frames = self.encode(msg)  # encode once
        timeout = self.send_timeout_s if timeout_s is None else timeout_s
        members = self._members().members
        held = set() if held is None else held
        waits, took = [], 0
        for p in peer_ids if frames is not None else ():
            m = members.get(p)
            if m is None:
                continue
            sent = None if m.address in held else self.now(m.address, msg, frames, p)
            if sent is None:
                waits.append((m.address, timeout if m.status == "alive" else 0.0, p))
                held.add(m.address)
            else:
                took += sent

        async def the_rest() -> int:  # (a cancelled batch leaves no send un-awaited)
            oks = await asyncio.gather(*(self.transport.send(address, frames, wait, peer_id=p)
                                         for address, wait, p in waits))
            return took + sum(self._counted(msg, address, ok, frames)
                              for (address, _, _), ok in zip(waits, oks, strict=True))

        return the_rest()

    async def broadcast(self, peer_ids: Iterable[str], msg: Message,
                        timeout_s: float | None = None) -> int:
        """Send one message to several members concurrently; how many took it."""
        return await self.start_broadcast(peer_ids, msg, timeout_s)

    def reply(self, address: str, msg: Message, peer_id: str) -> None:
        """Reply from the receive loop without blocking it (only ``peer_id`` can read it
        on an authenticated transport, whatever ``address`` it gave): at once where the
        transport can, else from a task of its own."""
        frames = self.encode(msg)
        if frames is not None and self.now(address, msg, frames, peer_id) is None:
            self._spawn(self.send(address, msg, peer_id=peer_id, frames=frames), "reply")

    async def send_all(self, address: str, peer_id: str, msgs: list[Message]) -> None:
        """One after the other (a big seed set must not flood the socket); stops at the
        first that does not go."""
        for m in msgs:
            if not await self.send(address, m, peer_id=peer_id):
                return

    def batch(self, instructions: Iterable[do.Instruction],
              other: Callable[[do.Instruction], None]) -> list[Awaitable]:
        """Instructions in order, sends and broadcasts among them together: those the
        transport takes at once as they come, ``other(ins)`` for every other kind; returns
        the awaitables of the sends that wait, in order (a send to an address an earlier
        one waits for waits too, never overtakes it: the transport keeps the waiting ones
        in order). A message sent to several places (a tick's hello to every member it
        greets) is encoded once."""
        waits = []
        encoded: dict[int, Any] = {}  # id(message) -> its frames, or () when unsendable
        held: set[str] = set()  # addresses a send of this batch waits for: the later wait too
        for ins in instructions:
            if isinstance(ins, do.Broadcast):
                waits.append(self.start_broadcast(ins.peer_ids, ins.msg, ins.timeout_s, held))
                continue
            if not isinstance(ins, do.Send):
                other(ins)
                continue
            frames = encoded.get(id(ins.msg))
            if frames is None:
                frames = encoded[id(ins.msg)] = self.encode(ins.msg) or ()
            if not frames:
                continue
            address, peer = ((self._members().address_of(ins.address), ins.address)
                             if ins.to_member else (ins.address, ins.peer_id))
            if address not in held and self.now(address, ins.msg, frames, peer) is not None:
                continue  # sent (or refused) without waiting
            held.add(address)  # (None: not a member; send_to fails at once)
            waits.append(self.send_to(ins.address, ins.msg, ins.timeout_s, frames)
                         if ins.to_member
                         else self.send(ins.address, ins.msg, ins.timeout_s, ins.peer_id, frames))
        return waits
