"""The simulator's network: seeded latency, loss, duplication, reordering and partitions.

Every peer gets a :class:`SimTransport` on one :class:`SimNetwork`. A send
copies the frames (as a network would) and schedules their delivery on the
loop's virtual clock after a latency drawn from the network's one seeded
random stream; on the way a message may be dropped, duplicated, held back
(delivered after later ones: reordered) or eaten by a partition. A crashed
peer's transport is *killed*: it sends nothing more and everything addressed to
it is lost until a new life binds the address again.

Each delivery is folded into a running SHA-256 (time, sender, receiver, bytes):
two runs with the same seed and code must end with the same digest.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import random
from collections import Counter

from hfl.peer.transport import Frames, Transport, TransportOptions, frames_nbytes
from hfl.sim.model import NetworkFaults


class SimNetwork:
    def __init__(self, seed: int, faults: NetworkFaults | None = None) -> None:
        self.rng = random.Random(f"net:{seed}")
        self.faults = faults or NetworkFaults()
        self.endpoints: dict[str, SimTransport] = {}
        # Peer pairs that cannot talk, with how many partitions under way cut each.
        self.cut: Counter[frozenset[str]] = Counter()
        self.counts: Counter[str] = Counter()
        self.history = hashlib.sha256()
        self.delivered = 0

    # ------------------------------------------------------------------ partitions

    def partition(self, *sides: list[str]) -> set[frozenset[str]]:
        """Cut every link between the sides; returns the links cut (to :meth:`heal`)."""
        links = {frozenset((a, b)) for i, a_side in enumerate(sides) for b_side in sides[i + 1:]
                 for a in a_side for b in b_side}
        self.cut.update(links)
        return links

    def heal(self, links: set[frozenset[str]] | None = None) -> None:
        """Join the links of one partition again (all of them: None); a link another
        partition also cuts stays cut until that one heals too."""
        if links is None:
            self.cut.clear()
            return
        self.cut.subtract(links)
        self.cut = +self.cut  # drop links no partition cuts any more

    # ------------------------------------------------------------------ delivery

    def send(self, src: SimTransport, address: str, frames: Frames) -> None:
        f, rng = self.faults, self.rng
        dst_peer = address.split("://", 1)[-1]
        if frozenset((src.peer_id, dst_peer)) in self.cut:
            self.counts["partitioned"] += 1
            return
        if rng.random() < f.drop:
            self.counts["dropped"] += 1
            return
        copies = [bytes(x) for x in frames]
        copies_n = 2 if rng.random() < f.duplicate else 1
        if copies_n == 2:
            self.counts["duplicated"] += 1
        loop = asyncio.get_running_loop()
        for _ in range(copies_n):
            latency = rng.uniform(*f.latency_s)
            if rng.random() < f.reorder:
                self.counts["reordered"] += 1
                latency += rng.uniform(0, f.reorder_s)
            if rng.random() < f.delay:
                self.counts["delayed"] += 1
                latency += rng.uniform(0, f.delay_s)
            # The network's own context: a frozen receiver still gets its mail.
            loop.call_at(loop.time() + latency, self._deliver, src.peer_id, address, copies,
                         context=_NETWORK_CONTEXT)

    def _deliver(self, sender: str, address: str, frames: list[bytes]) -> None:
        dest = self.endpoints.get(address)
        if dest is None or dest.killed or dest._inbox is None:
            self.counts["lost"] += 1
            return
        if frozenset((sender, dest.peer_id)) in self.cut:  # cut while in flight
            self.counts["partitioned"] += 1
            return
        try:
            dest._inbox.put_nowait((sender, [memoryview(b) for b in frames]))
        except asyncio.QueueFull:
            self.counts["overflow"] += 1
            return
        nbytes = sum(len(b) for b in frames)
        dest.stats.messages_received += 1
        dest.stats.bytes_received += nbytes
        self.delivered += 1
        h = self.history
        h.update(f"{asyncio.get_running_loop().time():.9f}|{sender}|{address}|".encode())
        for b in frames:
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)

    def digest(self) -> str:
        return self.history.hexdigest()[:16]


_NETWORK_CONTEXT = contextvars.Context()


class SimTransport(Transport):
    """One peer's endpoint on a :class:`SimNetwork` (same interface as ZeroMQ's)."""

    def __init__(self, peer_id: str, address: str, network: SimNetwork,
                 options: TransportOptions | None = None):
        super().__init__(peer_id, address)
        self.network = network
        self.options = options or TransportOptions()
        self._inbox: asyncio.Queue | None = None
        self.killed = False

    async def start(self) -> None:
        self._inbox = asyncio.Queue(maxsize=self.options.inbox_size)
        self.network.endpoints[self.address] = self  # a restart takes its address over

    async def send(self, address: str, frames: Frames, timeout_s: float,
                   peer_id: str | None = None) -> bool:
        if self.killed or self._inbox is None:
            return False
        self.stats.messages_sent += 1
        self.stats.bytes_sent += frames_nbytes(frames)
        self.network.send(self, address, frames)
        return True  # as with ZeroMQ: queued, whatever becomes of it

    async def recv(self) -> tuple[str, list[memoryview]]:
        if self._inbox is None:
            raise RuntimeError("transport not started")
        return await self._inbox.get()

    def kill(self) -> None:
        """SIGKILL: nothing more goes out, nothing more comes in."""
        self.killed = True

    async def close(self) -> None:
        if self.network.endpoints.get(self.address) is self:
            del self.network.endpoints[self.address]
        self._inbox = None
