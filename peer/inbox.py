"""What arrives at a peer, before the protocol sees it: read in turn, metered per sender.

Two pieces, each what ``peer/outbox.py`` is to sending:

- :class:`Inbox`, the receive loop: one message per sender in turn, read ahead to a
  bound, the other tasks let run between turns; it says when it is reading behind
  (messages left unread), which the round procedures ask before they ask members
  again for what may be among them;
- :class:`FloodBudget`, per sender: past its limit of messages dropped or refused
  within a second, the sender's other messages of that second are dropped unread.

Neither decides anything about the protocol: the node hands each message to the
core, and tells the budget which ones were dropped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any


class Inbox:
    """The receive loop of one peer (PeerCore decides what each message means)."""

    #: Messages read ahead of handling, at most (all senders together): beyond them the
    #: transport's own buffers (ZeroMQ's high-water mark) hold the rest back.
    READ_AHEAD = 64

    def __init__(self, transport: Callable[[], Any], handle: Callable[[str, list], None],
                 failed: Callable[[str], None]):
        self._transport = transport  # (a getter: a test or tool may swap the transport)
        self._handle = handle
        self._failed = failed  # a handler raised on a message from this identity
        #: messages are held, or were left in the transport, unread
        self.reading_behind = False

    async def run(self) -> None:
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
            transport = self._transport()
            if not queues:
                identity, frames = await transport.recv()
                queues[identity] = deque([frames])
                held = 1
            while held < self.READ_AHEAD and (got := transport.recv_nowait()) is not None:
                queues.setdefault(got[0], deque()).append(got[1])
                held += 1
            # Read ahead to the limit: more may wait in the transport, unread (the
            # aggregator does not ask for contributions that may be among them).
            self.reading_behind = held >= self.READ_AHEAD
            for identity in list(queues):
                frames = queues[identity].popleft()
                held -= 1
                if not queues[identity]:
                    del queues[identity]
                try:
                    self._handle(identity, frames)
                except Exception:  # a bug in a handler must not kill the peer
                    self._failed(identity)
            self.reading_behind = self.reading_behind or held > 0
            await asyncio.sleep(0)


class FloodBudget:
    """Messages of one sender (the connection's identity) dropped or refused within a
    second, at most :attr:`LIMIT`: beyond them its messages are dropped unread until
    that second is over (``flooding``, said once a second). Each message dropped costs
    a decode and its checks (a digest, a signature): a member's flood of knowledge
    with bad signatures, 100,200 in 15 s at one peer, slowed every peer's rounds from
    about 0.6 s to 11.6 s (an attack review, 2026-11-29). An honest member has a
    handful of messages dropped in a minute (late, repeated), never dozens in a second."""

    LIMIT = 64
    #: senders whose windows are kept before the windows past are pruned (the ids of a
    #: plaintext flood), once a second at most
    KEEP = 1024

    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self._spent: dict[str, list] = {}  # sender -> [its window's start, drops in it]
        self._pruned_at = float("-inf")  # when _spent was last rid of windows past

    def muted(self, identity: str, now: float) -> bool:
        """Whether ``identity``'s messages are dropped unread at ``now``."""
        spent = self._spent.get(identity)
        return spent is not None and spent[1] > self.limit and now - spent[0] < 1.0

    def charge(self, identity: str, now: float) -> bool:
        """One more message of ``identity`` dropped. True when this one passes the
        limit within its second: from now on, and until that second is over, the
        sender is muted (the caller says so, once)."""
        spent = self._spent.get(identity)
        if spent is None or now - spent[0] >= 1.0:
            if len(self._spent) >= self.KEEP and now - self._pruned_at >= 1.0:
                # (once a second, not at each new window: a review measured 2.9 s of
                # CPU for 8,000 ids)
                self._pruned_at = now
                self._spent = {k: v for k, v in self._spent.items() if now - v[0] < 1.0}
            spent = self._spent[identity] = [now, 0]
        spent[1] += 1
        return spent[1] == self.limit + 1

    def __len__(self) -> int:
        """Senders whose window is kept."""
        return len(self._spent)
