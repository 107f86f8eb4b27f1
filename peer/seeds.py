"""Public seed sets: each peer's public split, published in checksummed chunks.

Methods such as FedH2L learn from peers' teaching signals on the peers' public
samples, and their knowledge messages refer to those samples by index. So
before that, every peer needs every other peer's public set. This module is the
pure bookkeeping (no I/O): chunking our own set, accepting chunks of others'
(digest, consistency and duplicate checks), and saying what is still missing.
The node asks for missing chunks on its heartbeat and answers others' requests
(see PROTOCOL.md, ``seed_request`` / ``seed_chunk``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hfl.protocol.messages import SeedChunk

DEFAULT_CHUNK_BYTES = 1 << 20
#: The most samples a member's seed set may have: its size comes from the member's
#: word (the first chunk's ``total``), and a peer lists what it still misses, chunk
#: by chunk, on every request (``num_chunks`` of 2^62 held the event loop for good).
MAX_SEED_SAMPLES = 1_000_000


def digest(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of x's bytes followed by y's bytes (C order), hex."""
    h = hashlib.sha256()
    h.update(memoryview(np.ascontiguousarray(x)).cast("B"))
    h.update(memoryview(np.ascontiguousarray(y)).cast("B"))
    return h.hexdigest()


@dataclass
class SeedSet:
    """One owner's public seed set, complete or being assembled."""

    owner: str
    num_chunks: int
    total: int
    chunks: dict[int, tuple[int, np.ndarray, np.ndarray]] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.chunks) == self.num_chunks

    def missing(self) -> list[int]:
        return [c for c in range(self.num_chunks) if c not in self.chunks]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        parts = [self.chunks[c] for c in range(self.num_chunks)]
        return np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])


class SeedStore:
    def __init__(self, self_id: str, own: tuple[np.ndarray, np.ndarray] | None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, num_classes: int | None = None,
                 max_samples: int = MAX_SEED_SAMPLES):
        self.self_id = self_id
        self.sets: dict[str, SeedSet] = {}
        self._delivered: set[str] = set()
        # What a member's set must look like to be kept: a method runs its own model on
        # the members' samples and reads their labels (a set of another sample shape,
        # or with labels past num_classes, raised in the round and stopped the peer).
        self.num_classes = num_classes
        self.max_samples = max_samples
        self.sample_shape: tuple[int, ...] | None = None
        #: owners whose set we dropped (owner -> the incarnation it came from): not asked
        #: for again until a later life of theirs speaks, nor waited for by the join
        self.refused: dict[str, int] = {}
        if own is not None:
            x = np.ascontiguousarray(own[0], dtype=np.float32)
            y = np.ascontiguousarray(own[1], dtype=np.int64)
            if len(x) != len(y) or len(x) == 0:
                raise ValueError(f"public seed set needs matching, non-empty x and y; got {len(x)}, {len(y)}")
            # What the members would refuse, refused here, loudly, at start-up.
            if len(x) > max_samples:
                raise ValueError(f"public seed set has {len(x)} samples; members take at most "
                                 f"{max_samples} (set a smaller public set: data.public_fraction, "
                                 "data.public_set.size)")
            if num_classes is not None and (y.min() < 0 or y.max() >= num_classes):
                raise ValueError(f"public seed set has labels outside 0..{num_classes - 1} "
                                 f"(cohort.num_classes {num_classes})")
            self.sample_shape = x.shape[1:]
            per_sample = max(1, x[0].nbytes + y[0].nbytes)
            per_chunk = max(1, chunk_bytes // per_sample)
            starts = list(range(0, len(x), per_chunk))
            mine = SeedSet(self_id, num_chunks=len(starts), total=len(x))
            for c, start in enumerate(starts):
                xs, ys = x[start : start + per_chunk], y[start : start + per_chunk]
                mine.chunks[c] = (start, xs, ys)
                mine.digests[c] = digest(xs, ys)
            self.sets[self_id] = mine
            self._delivered.add(self_id)

    # ------------------------------------------------------------------ serving

    def chunks_for(self, owner: str, wanted: list[int], sender: str, incarnation: int) -> list[SeedChunk]:
        """Messages answering a request, if we hold ``owner``'s set completely."""
        s = self.sets.get(owner)
        if s is None or not s.complete:
            return []
        # Each chunk once: a request of 100,000 zeros (98 KiB) was answered with 100,000
        # copies of chunk 0 (a fuzzer's find).
        indices = [c for c in dict.fromkeys(wanted or range(s.num_chunks))
                   if type(c) is int and 0 <= c < s.num_chunks]
        out = []
        for c in indices:
            start, x, y = s.chunks[c]
            out.append(SeedChunk(
                sender=sender, incarnation=incarnation, owner=owner, chunk=c,
                num_chunks=s.num_chunks, start=start, total=s.total, digest=s.digests[c],
                tensors={"x": x, "y": y},
            ))
        return out

    # ------------------------------------------------------------------ receiving

    def offer(self, msg: SeedChunk) -> str | None:
        """Keep a chunk; returns None if kept, else why it was dropped. A set this peer
        cannot use (its dtype, sample shape, labels or size) is refused for that life of
        its owner (:meth:`refuse`): asked for again, it would only come back."""
        if msg.owner == self.self_id:
            return "a chunk of our own seed set"
        if self._refused(msg.owner, msg.incarnation):
            return f"seed chunk {msg.chunk} of {msg.owner}: its set was refused"
        self.refused.pop(msg.owner, None)  # (a later life of it: its set may be another)
        reason = self._unusable(msg)
        if reason is not None:
            self.refuse(msg.owner, msg.incarnation)
            return reason + "; this set is not asked for again"
        return self._keep(msg)

    def _unusable(self, msg: SeedChunk) -> str | None:
        """Why ``msg``'s set is of no use to this peer, whatever its other chunks say."""
        x, y = msg.tensors.get("x"), msg.tensors.get("y")
        if x is None or y is None or x.ndim < 2 or y.ndim != 1 or len(y) == 0:
            return None  # (a malformed chunk: _keep drops it alone)
        if x.dtype != np.float32 or y.dtype != np.int64:  # (what every peer's chunks hold)
            return f"seed chunk {msg.chunk} of {msg.owner} holds {x.dtype} / {y.dtype}, not float32 / int64"
        if self.sample_shape is not None and x.shape[1:] != self.sample_shape:
            # (every sample shape: the methods pool members' sets with their own data,
            # and LeNet and MLPs take one input size only)
            return (f"seed chunk {msg.chunk} of {msg.owner} has sample shape {x.shape[1:]}; "
                    f"this peer's model takes {self.sample_shape}")
        if self.num_classes is not None and (y.min() < 0 or y.max() >= self.num_classes):
            return f"seed chunk {msg.chunk} of {msg.owner} has labels outside 0..{self.num_classes - 1}"
        if msg.total > self.max_samples or msg.num_chunks > msg.total:
            return (f"seed set of {msg.owner}: {msg.total} samples in {msg.num_chunks} chunks "
                    f"(at most {self.max_samples} samples, a chunk holds one at least)")
        return None

    def _keep(self, msg: SeedChunk) -> str | None:
        x, y = msg.tensors.get("x"), msg.tensors.get("y")
        if x is None or y is None:
            return f"seed chunk {msg.chunk} of {msg.owner} lacks x or y"
        if x.ndim < 2 or y.ndim != 1 or len(x) != len(y) or len(y) == 0 or x.size == 0:
            # (samples of no values: their digest raised inside PeerCore.handle, a review)
            return f"seed chunk {msg.chunk} of {msg.owner} has shapes {x.shape} / {y.shape}"
        if not (0 <= msg.chunk < msg.num_chunks) or msg.start < 0 or msg.start + len(y) > msg.total:
            return f"seed chunk {msg.chunk}/{msg.num_chunks} of {msg.owner} is out of range"
        if digest(x, y) != msg.digest:
            return f"seed chunk {msg.chunk} of {msg.owner} does not match its digest"
        s = self.sets.get(msg.owner)
        if s is None:
            s = self.sets[msg.owner] = SeedSet(msg.owner, msg.num_chunks, msg.total)
        elif (s.num_chunks, s.total) != (msg.num_chunks, msg.total):
            if s.complete:
                return f"seed chunk of {msg.owner} disagrees with the complete set we hold"
            # The owner restarted with a different set: start over.
            s = self.sets[msg.owner] = SeedSet(msg.owner, msg.num_chunks, msg.total)
        if msg.chunk in s.chunks:
            return f"duplicate seed chunk {msg.chunk} of {msg.owner}"
        if s.chunks:
            shape = next(iter(s.chunks.values()))[1].shape[1:]
            if x.shape[1:] != shape:
                return f"seed chunk {msg.chunk} of {msg.owner} has sample shape {x.shape[1:]} != {shape}"
        s.chunks[msg.chunk] = (msg.start, np.array(x, copy=True), np.array(y, copy=True))
        s.digests[msg.chunk] = msg.digest
        return None

    # ------------------------------------------------------------------ queries

    def refuse(self, owner: str, incarnation: int) -> None:
        """``owner``'s set (of that life) was dropped (:meth:`offer` said why): what we
        hold of it goes, and we ask for it no more, nor wait for it."""
        self.sets.pop(owner, None)
        self.refused[owner] = max(incarnation, self.refused.get(owner, -1))

    def _refused(self, owner: str, incarnation: int) -> bool:
        """Whether ``owner``'s set is refused for its life ``incarnation``."""
        return owner in self.refused and self.refused[owner] >= incarnation

    def missing(self, owner: str, incarnation: int = 0) -> list[int] | None:
        """Chunks still needed from ``owner`` (its life ``incarnation``): [] when complete
        or refused for that life, None when unknown (ask for all)."""
        if self._refused(owner, incarnation):
            return []
        s = self.sets.get(owner)
        return None if s is None else s.missing()

    def has_all(self, owners: list[str],
                incarnation: Callable[[str], int] = lambda owner: 0) -> bool:
        """Whether every set of ``owners`` is here, or refused for the life of its owner
        that ``incarnation`` gives (not waited for)."""
        return all(self._refused(o, incarnation(o)) or (o in self.sets and self.sets[o].complete)
                   for o in owners)

    def take_completed(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Sets completed since the last call (each handed out once), as (x, y)."""
        done = {o: s.arrays() for o, s in self.sets.items()
                if s.complete and o not in self._delivered}
        self._delivered.update(done)
        return done
