"""Public seed exchange bookkeeping (peer/seeds.py): chunking, digests,
duplicates, drops and re-requests, restarts of the owner."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hfl.peer.seeds import SeedStore, digest
from hfl.protocol import SeedChunk


def own_set(n=100, shape=(1, 8, 8), seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, *shape), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)


def test_own_set_is_chunked_by_bytes_and_chunks_cover_it_exactly():
    x, y = own_set(100)
    store = SeedStore("a", (x, y), chunk_bytes=20 * (x[0].nbytes + 8))  # 20 samples a chunk
    chunks = store.chunks_for("a", [], "a", 0)
    assert [c.chunk for c in chunks] == [0, 1, 2, 3, 4]
    assert all(c.num_chunks == 5 and c.total == 100 for c in chunks)
    assert [c.start for c in chunks] == [0, 20, 40, 60, 80]
    np.testing.assert_array_equal(np.concatenate([c.tensors["x"] for c in chunks]), x)
    assert all(c.digest == digest(c.tensors["x"], c.tensors["y"]) for c in chunks)
    assert [c.chunk for c in store.chunks_for("a", [3, 9, -1], "a", 0)] == [3]  # out of range ignored
    # Each chunk once, however often it is asked for (100,000 zeros were answered with
    # 100,000 copies of chunk 0: a fuzzer's find).
    assert [c.chunk for c in store.chunks_for("a", [3, 0] * 50_000, "a", 0)] == [3, 0]


def test_receiver_assembles_despite_a_dropped_and_a_duplicated_chunk():
    x, y = own_set(100)
    owner = SeedStore("a", (x, y), chunk_bytes=30 * (x[0].nbytes + 8))
    me = SeedStore("b", None)
    assert me.missing("a") is None  # unknown yet: ask for everything
    chunks = owner.chunks_for("a", [], "a", 0)
    delivered = [chunks[0], chunks[2], chunks[2], chunks[3]]  # chunk 1 lost, chunk 2 twice
    reasons = [me.offer(c) for c in delivered]
    assert reasons[:2] == [None, None] and "duplicate" in reasons[2] and reasons[3] is None
    assert me.missing("a") == [1] and not me.has_all(["a"])
    assert me.take_completed() == {}
    # The periodic re-request asks for exactly what is missing.
    for c in owner.chunks_for("a", me.missing("a"), "a", 0):
        assert me.offer(c) is None
    assert me.missing("a") == [] and me.has_all(["a"])
    done = me.take_completed()
    np.testing.assert_array_equal(done["a"][0], x)
    np.testing.assert_array_equal(done["a"][1], y)
    assert me.take_completed() == {}  # handed out once
    # The store can serve a's set on (the node takes a set only from its owner, though:
    # PeerCore.handle drops a chunk whose sender is not its owner).
    late = SeedStore("c", None)
    for c in me.chunks_for("a", [], "b", 0):
        assert late.offer(c) is None
    assert late.has_all(["a"])


def test_corrupt_inconsistent_or_misshapen_chunks_are_dropped_with_a_reason():
    x, y = own_set(40)
    owner = SeedStore("a", (x, y), chunk_bytes=10 * (x[0].nbytes + 8))
    c0, c1 = owner.chunks_for("a", [0, 1], "a", 0)
    me = SeedStore("b", None)
    tampered = dataclasses.replace(c0, tensors={"x": c0.tensors["x"] + 1, "y": c0.tensors["y"]})
    assert "digest" in me.offer(tampered)
    assert "out of range" in me.offer(dataclasses.replace(c0, chunk=7))
    assert "lacks x or y" in me.offer(dataclasses.replace(c0, tensors={"x": c0.tensors["x"]}))
    assert me.offer(c0) is None
    wrong_shape = {"x": np.zeros((10, 3, 8, 8), np.float32), "y": c1.tensors["y"]}
    bad = dataclasses.replace(c1, tensors=wrong_shape, digest=digest(*wrong_shape.values()))
    assert "sample shape" in me.offer(bad)
    assert "own seed set" in owner.offer(c0)


def test_a_member_s_set_is_kept_only_in_the_shape_labels_and_size_a_peer_can_use():
    # A member's set whose samples the receiver's model cannot take, or whose labels
    # are past num_classes, raised in a later round and stopped the peer; one claiming
    # 2^62 chunks made every request list them. Each is dropped with its reason, and
    # that life of its owner is asked for it no more, nor waited for by the join (it
    # would only come back, every few heartbeats, and be dropped again).
    x, y = own_set(40)

    def chunk(x, y, incarnation=0, **kw):
        x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
        fields = {"chunk": 0, "num_chunks": 1, "start": 0, "total": len(y), **kw}
        return SeedChunk(sender="a", incarnation=incarnation, owner="a", digest=digest(x, y),
                         tensors={"x": x, "y": y}, **fields)

    cases = [(chunk(np.repeat(x, 3, axis=1), y), "has sample shape (3, 8, 8)"),
             (chunk(np.zeros((4, 1, 16, 16), np.float32), y[:4]), "has sample shape (1, 16, 16)"),
             (chunk(x.reshape(40, 64), y), "has sample shape (64,)"),
             (chunk(x.astype(np.float64), y), "not float32 / int64"),
             (chunk(x, y.astype(np.int32)), "not float32 / int64"),
             (chunk(x, y + 10), "labels outside 0..9"), (chunk(x, y - 20), "labels outside 0..9"),
             (chunk(x, y, total=2**62), "at most 1000 samples"),
             (chunk(x, y, num_chunks=2**62), "a chunk holds one at least")]
    for bad, reason in cases:
        me = SeedStore("b", own_set(10), num_classes=10, max_samples=1_000)
        assert me.missing("a", 0) is None and me.missing("a", -1) is None  # ask for all
        got = me.offer(bad)
        assert reason in got and "not asked for again" in got, (reason, got)
        assert "a" not in me.sets and me.missing("a", 0) == [] and me.has_all(["a"])
        assert "was refused" in me.offer(chunk(x, y))  # that life's other chunks too
        # A later life is asked again and waited for, until its set is here.
        assert me.missing("a", 1) is None and not me.has_all(["a"], lambda owner: 1)
        assert me.offer(chunk(x, y, incarnation=1)) is None
        assert me.has_all(["a"], lambda owner: 1)
        assert me.take_completed()["a"][1].shape == (40,)
    # Without a set of its own (or classes), a peer takes any sample shape and label.
    assert SeedStore("c", None).offer(chunk(x.reshape(40, 64), y + 10)) is None


def test_an_own_set_the_members_would_refuse_is_refused_at_start_up():
    x, y = own_set(40)
    with pytest.raises(ValueError, match="40 samples; members take at most 30"):
        SeedStore("a", (x, y), max_samples=30)
    with pytest.raises(ValueError, match=r"labels outside 0..4 \(cohort.num_classes 5\)"):
        SeedStore("a", (x, y), num_classes=5)


def test_an_owner_that_restarts_with_another_set_replaces_a_partial_one():
    x, y = own_set(40)
    old = SeedStore("a", (x, y), chunk_bytes=10 * (x[0].nbytes + 8)).chunks_for("a", [0], "a", 0)
    x2, y2 = own_set(60, seed=1)
    new = SeedStore("a", (x2, y2), chunk_bytes=10 * (x2[0].nbytes + 8)).chunks_for("a", [], "a", 1)
    me = SeedStore("b", None)
    assert me.offer(old[0]) is None
    for c in new:
        assert me.offer(c) is None
    assert me.has_all(["a"]) and len(me.take_completed()["a"][1]) == 60


def test_an_empty_own_set_is_an_error():
    with pytest.raises(ValueError, match="non-empty"):
        SeedStore("a", (np.zeros((0, 2), np.float32), np.zeros(0, np.int64)))
