"""Tests of the wire protocol: round trips, zero-copy, validation codes, spec drift, fuzzing."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import msgpack
import numpy as np
import pytest

from hfl.protocol import (
    DEFAULT_LIMITS,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
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
    Limits,
    MemberRecord,
    Message,
    ProtocolError,
    Relayed,
    SeedChunk,
    SeedRequest,
    Welcome,
    decode,
    encode,
    message_nbytes,
)

SPEC = Path(__file__).resolve().parents[1] / "PROTOCOL.md"

MEMBERS = [
    MemberRecord(peer_id="p0", address="tcp://127.0.0.1:5000", incarnation=0),
    MemberRecord(peer_id="p1", address="tcp://127.0.0.1:5001", incarnation=3, status="suspect"),
    MemberRecord(peer_id="p2", address="tcp://127.0.0.1:5002", incarnation=1, status="left"),
]


def tensor_zoo() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "bools": rng.random((3, 5)) > 0.5,
        "u8": np.arange(256, dtype=np.uint8),
        "i8": np.arange(-8, 8, dtype=np.int8).reshape(2, 2, 4),
        "i16": np.arange(12, dtype=np.int16).reshape(3, 4),
        "i32": np.arange(-5, 5, dtype=np.int32),
        "i64": np.array([-(2**62), 2**62], dtype=np.int64),
        "f16": rng.standard_normal((4, 4)).astype(np.float16),
        "large": rng.standard_normal((256, 512)).astype(np.float32),
        "transposed": np.arange(24, dtype=np.float64).reshape(4, 6).T,
        "strided": np.arange(40, dtype=np.int32)[::3],
        "big_endian": np.arange(10, dtype=">f8"),
    }


def sample_messages() -> list[Message]:
    env = {"sender": "peer-0", "incarnation": 2}
    return [
        Hello(
            **env,
            address="tcp://127.0.0.1:5000",
            cohort="digits",
            algorithm="fedh2l",
            num_classes=10,
            rounds=20,
            round=4,
            shared={"embedding_dim": 64},
            capabilities=["secure_sum", "dp"],
        ),
        Hello(**env, address="inproc://a", cohort="c", algorithm="solo", num_classes=2, rounds=1),
        Welcome(**env, address="tcp://127.0.0.1:5000", round=7, members=MEMBERS),
        Gossip(**env, members=MEMBERS),
        Gossip(**env),
        Heartbeat(**env, round=11),
        Leave(**env, reason="finished", round=20),
        Leave(**env),
        Knowledge(
            **env,
            round=3,
            kind="posteriors",
            epoch=1,
            meta={
                "acc": 0.75,
                "n": 128,
                "tag": None,
                "raw": b"\x00\x01",
                "deep": {"a": [1, {"b": 2}]},
            },
            tensors=tensor_zoo(),
        ),
        Knowledge(**env, round=0, kind="empty"),
        Knowledge(**env, round=4, kind="weights", epoch=2, accepted_epoch=1,
                  accepted_digest="0123456789abcdef"),
        AggregateResult(
            **env,
            round=3,
            epoch=0,
            kind="head",
            contributors=["peer-0", "peer-1"],
            meta={"weights": [0.5, 0.5]},
            tensors={"head": np.ones((64, 10), dtype=np.float32)},
        ),
        AggregateResult(**env, round=3, epoch=1, kind="none"),  # an abstention
        Ack(**env, round=3, epoch=0, digest="0123456789abcdef"),
        Commit(**env, round=3, epoch=0, digest="0123456789abcdef"),
        Relayed(**env, round=3, epoch=0, aggregator="peer-2", kind="head",
                contributors=["peer-0", "peer-2"], meta={"weights": [0.5, 0.5]},
                tensors={"head": np.ones((4, 10), dtype=np.float32)},
                certificate={"peer-0": "ab" * 64, "peer-2": "cd" * 64}),
        Error(**env, code=ErrorCode.COHORT_MISMATCH, reason="other cohort", ref_type="hello"),
        SeedRequest(**env, owner="peer-1", chunks=[0, 3]),
        SeedChunk(
            **env, owner="peer-1", chunk=1, num_chunks=4, start=32, total=100, digest="ab" * 32,
            tensors={"x": np.zeros((32, 1, 8, 8), np.float32), "y": np.arange(32, dtype=np.int64)},
        ),
    ]


def assert_same(a: Message, b: Message) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "tensors":
            assert list(x) == list(y)
            for name in x:
                want = np.asarray(x[name])
                assert y[name].dtype == want.dtype.newbyteorder("=")
                assert y[name].shape == want.shape
                np.testing.assert_array_equal(y[name], want)
        else:
            assert x == y, f.name


def header_of(frames) -> dict:
    return msgpack.unpackb(bytes(frames[0]), raw=False)


def frames_with(header: dict, *payload: bytes) -> list[bytes]:
    return [msgpack.packb(header, use_bin_type=True), *payload]


def heartbeat_header(**changes) -> dict:
    header = {
        "v": PROTOCOL_VERSION,
        "type": "heartbeat",
        "sender": "p",
        "incarnation": 0,
        "body": {"round": 1},
        "tensors": [],
    }
    header.update(changes)
    return header


def knowledge_header(*tensors: dict, **body) -> dict:
    return {
        "v": PROTOCOL_VERSION,
        "type": "knowledge",
        "sender": "p",
        "incarnation": 0,
        "body": {"round": 1, "kind": "k", **body},
        "tensors": list(tensors),
    }


def rejects(frames, code: str, limits: Limits = DEFAULT_LIMITS) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(frames, limits)
    assert info.value.code == code, info.value
    return info.value


# --------------------------------------------------------------------------- round trips


def test_every_message_type_is_sampled() -> None:
    assert {type(m) for m in sample_messages()} == set(MESSAGE_TYPES.values())


@pytest.mark.parametrize("msg", sample_messages(), ids=lambda m: m.TYPE)
def test_round_trip(msg: Message) -> None:
    frames = encode(msg)
    assert isinstance(frames[0], bytes)
    header = header_of(frames)
    assert header["v"] == PROTOCOL_VERSION and header["type"] == msg.TYPE
    assert len(frames) == 1 + len(getattr(msg, "tensors", {}))
    assert_same(msg, decode(frames))
    assert_same(msg, decode([bytearray(f) for f in frames]))
    assert message_nbytes(frames) == sum(memoryview(f).nbytes for f in frames)


def test_header_layout() -> None:
    msg = Knowledge(
        sender="a",
        incarnation=1,
        round=2,
        kind="k",
        tensors={"w": np.zeros((2, 3), np.float16), "b": np.zeros(3, np.int64)},
    )
    header = header_of(encode(msg))
    assert set(header) == {"v", "type", "sender", "incarnation", "body", "tensors"}
    assert header["body"] == {"round": 2, "kind": "k", "epoch": 0, "accepted_epoch": -1,
                              "accepted_digest": "", "meta": {}, "sig": "", "heard_round": 0,
                              "heard": {}, "equivocations": {}}
    assert header["tensors"] == [
        {"name": "w", "dtype": "float16", "shape": [2, 3]},
        {"name": "b", "dtype": "int64", "shape": [3]},
    ]
    welcome = header_of(
        encode(Welcome(sender="a", incarnation=0, address="x", round=0, members=MEMBERS[:1]))
    )
    assert welcome["body"]["members"] == [
        {"peer_id": "p0", "address": "tcp://127.0.0.1:5000", "incarnation": 0, "status": "alive"}
    ]


def test_big_endian_and_numpy_scalars_are_normalised() -> None:
    msg = Knowledge(
        sender="a",
        incarnation=0,
        round=1,
        kind="k",
        meta={"acc": np.float32(0.5), "n": np.int64(3), "ok": np.bool_(True), "pair": (1, 2)},
        tensors={"x": np.arange(5, dtype=">i4")},
    )
    out = decode(encode(msg))
    assert out.meta == {"acc": 0.5, "n": 3, "ok": True, "pair": [1, 2]}
    assert type(out.meta["n"]) is int and type(out.meta["ok"]) is bool
    assert out.tensors["x"].dtype == np.dtype("<i4")
    np.testing.assert_array_equal(out.tensors["x"], np.arange(5))


def test_accepts_zmq_like_frames() -> None:
    class FakeZmqFrame:  # pyzmq's zmq.Frame exposes its bytes as .buffer
        def __init__(self, data: bytes) -> None:
            self.buffer = memoryview(data)

    msg = sample_messages()[8]
    frames = [FakeZmqFrame(bytes(f)) for f in encode(msg)]
    assert_same(msg, decode(frames))
    assert message_nbytes(frames) == message_nbytes(encode(msg))


def test_accepts_real_zmq_frames() -> None:
    zmq = pytest.importorskip("zmq")
    msg = sample_messages()[10]
    assert_same(msg, decode([zmq.Frame(bytes(f)) for f in encode(msg)]))


# --------------------------------------------------------------------------- zero copy


def test_encode_is_zero_copy_for_contiguous_arrays() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames = encode(Knowledge(sender="a", incarnation=0, round=0, kind="k", tensors={"w": arr}))
    assert isinstance(frames[1], memoryview)
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), arr)


def test_decode_is_zero_copy() -> None:
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    frames = [
        bytearray(f)
        for f in encode(Knowledge(sender="a", incarnation=0, round=0, kind="k", tensors={"w": arr}))
    ]
    out = decode(frames).tensors["w"]
    assert np.shares_memory(out, np.frombuffer(frames[1], np.uint8))
    frames[1][:8] = np.float64(42.0).tobytes()  # a writable frame: the array sees the change
    assert out[0, 0] == 42.0


def test_decoded_arrays_from_bytes_are_read_only() -> None:
    result = next(m for m in sample_messages() if isinstance(m, AggregateResult) and m.tensors)
    frames = [bytes(f) for f in encode(result)]
    head = decode(frames).tensors["head"]
    assert not head.flags.writeable
    assert np.shares_memory(head, np.frombuffer(frames[1], np.uint8))


# --------------------------------------------------------------------------- frame-level rules


def test_no_frames() -> None:
    rejects([], ErrorCode.BAD_FRAMES)


def test_single_buffer_instead_of_frames() -> None:
    rejects(encode(Heartbeat(sender="a", incarnation=0, round=1))[0], ErrorCode.BAD_FRAMES)


def test_frame_without_buffer() -> None:
    rejects([object()], ErrorCode.BAD_FRAMES)
    rejects(["text"], ErrorCode.BAD_FRAMES)


def test_non_contiguous_frame() -> None:
    strided = memoryview(np.arange(10, dtype=np.uint8)[::2])
    rejects([strided], ErrorCode.BAD_FRAMES)


def test_too_many_frames() -> None:
    frames = frames_with(knowledge_header(), *[b""] * 4)
    rejects(frames, ErrorCode.TOO_LARGE, Limits(max_frames=4))


def test_message_too_large() -> None:
    frames = encode(
        Knowledge(sender="a", incarnation=0, round=0, kind="k", tensors={"x": np.zeros(100)})
    )
    rejects(frames, ErrorCode.TOO_LARGE, Limits(max_message_bytes=800))
    assert decode(frames, Limits(max_message_bytes=message_nbytes(frames)))


def test_header_too_large() -> None:
    frames = encode(Leave(sender="a", incarnation=0, reason="x" * 300))
    rejects(frames, ErrorCode.TOO_LARGE, Limits(max_header_bytes=256))


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        b"\x81",
        msgpack.packb({"a": 1}) + b"\x00",
        msgpack.packb({1: 2}),
        b"\x91" * 5000,
    ],
    ids=["empty", "reserved-byte", "truncated", "extra-data", "int-key", "too-deep"],
)
def test_header_not_msgpack(payload: bytes) -> None:
    rejects([payload], ErrorCode.BAD_HEADER)


@pytest.mark.parametrize("header", [[1, 2], "hello", 5, None], ids=repr)
def test_header_not_a_map(header) -> None:
    rejects([msgpack.packb(header)], ErrorCode.BAD_HEADER)


def test_invalid_utf8_string() -> None:
    raw = msgpack.packb(heartbeat_header(sender="zz")).replace(b"\xa2zz", b"\xa2\xff\xfe")
    rejects([raw], ErrorCode.BAD_HEADER)


def test_ext_types_rejected() -> None:
    header = heartbeat_header(body={"round": msgpack.ExtType(5, b"xx")})
    rejects(frames_with(header), ErrorCode.BAD_HEADER)


# --------------------------------------------------------------------------- envelope rules


def test_version_mismatch() -> None:
    rejects(frames_with(heartbeat_header(v=PROTOCOL_VERSION + 1)), ErrorCode.VERSION_MISMATCH)
    # the version is checked before anything else in the envelope
    rejects(frames_with({"v": 99, "whatever": 1}), ErrorCode.VERSION_MISMATCH)


@pytest.mark.parametrize("version", [None, "1", 1.0, True])
def test_version_missing_or_wrong_type(version) -> None:
    header = heartbeat_header(v=version)
    if version is None:
        del header["v"]
    rejects(frames_with(header), ErrorCode.BAD_HEADER)


def test_unknown_type() -> None:
    err = rejects(frames_with(heartbeat_header(type="teleport")), ErrorCode.UNKNOWN_TYPE)
    assert "teleport" in err.reason and err.ref_type == "teleport"  # the error reply's ref_type


@pytest.mark.parametrize("type_", [None, 3, b"heartbeat"])
def test_type_missing_or_wrong_type(type_) -> None:
    header = heartbeat_header(type=type_)
    if type_ is None:
        del header["type"]
    rejects(frames_with(header), ErrorCode.BAD_HEADER)


@pytest.mark.parametrize(
    "changes",
    [
        {"sender": ""},
        {"sender": "x" * 129},
        {"sender": 7},
        {"sender": b"peer"},
        {"sender": "\x00peer"},
        {"sender": None},
        {"incarnation": -1},
        {"incarnation": True},
        {"incarnation": 1.5},
        {"incarnation": "0"},
        {"body": []},
        {"body": None},
        {"tensors": {}},
        {"tensors": None},
    ],
    ids=repr,
)
def test_bad_envelope(changes) -> None:
    rejects(frames_with(heartbeat_header(**changes)), ErrorCode.BAD_HEADER)


def test_sender_limits_accept_boundary() -> None:
    assert decode(frames_with(heartbeat_header(sender="x" * 128))).sender == "x" * 128
    assert decode(frames_with(heartbeat_header(sender="pëer-ü"))).sender == "pëer-ü"


def test_missing_envelope_fields() -> None:
    for key in ("sender", "incarnation", "body", "tensors"):
        header = heartbeat_header()
        del header[key]
        rejects(frames_with(header), ErrorCode.BAD_HEADER)


# --------------------------------------------------------------------------- body rules


def test_unknown_fields_are_ignored() -> None:
    header = heartbeat_header(body={"round": 5, "future_field": {"x": [1, 2]}}, extra_envelope=1)
    msg = decode(frames_with(header))
    assert msg == Heartbeat(sender="p", incarnation=0, round=5)
    member = {**dataclasses.asdict(MEMBERS[0]), "latency_ms": 3}
    header = heartbeat_header(type="gossip", body={"members": [member]})
    assert decode(frames_with(header)).members == [MEMBERS[0]]


def test_body_cannot_override_envelope_or_tensors() -> None:
    header = knowledge_header(sender="mallory", incarnation=9, tensors={"x": 1})
    msg = decode(frames_with(header))
    assert (msg.sender, msg.incarnation, msg.tensors) == ("p", 0, {})


def test_defaults_fill_missing_optional_fields() -> None:
    msg = decode(frames_with(knowledge_header()))
    assert (msg.epoch, msg.meta, msg.tensors) == (0, {}, {})


@pytest.mark.parametrize(
    ("type_", "body"),
    [
        ("heartbeat", {}),
        ("heartbeat", {"round": True}),
        ("heartbeat", {"round": 1.0}),
        ("heartbeat", {"round": "1"}),
        ("heartbeat", {"round": None}),
        ("leave", {"reason": 5}),
        ("error", {"code": "bad_frames"}),
        ("error", {"code": "x", "reason": b"bytes are not str"}),
        ("hello", {"address": "a", "cohort": "c", "algorithm": "x", "num_classes": 2}),
        (
            "hello",
            {
                "address": "a",
                "cohort": "c",
                "algorithm": "x",
                "num_classes": 2,
                "rounds": 1,
                "shared": {"d": 1.5},
            },
        ),
        (
            "hello",
            {
                "address": "a",
                "cohort": "c",
                "algorithm": "x",
                "num_classes": 2,
                "rounds": 1,
                "shared": {"d": True},
            },
        ),
        (
            "hello",
            {
                "address": "a",
                "cohort": "c",
                "algorithm": "x",
                "num_classes": 2,
                "rounds": 1,
                "shared": [1],
            },
        ),
        (
            "hello",
            {
                "address": "a",
                "cohort": "c",
                "algorithm": "x",
                "num_classes": 2,
                "rounds": 1,
                "capabilities": "dp",
            },
        ),
        (
            "hello",
            {
                "address": "a",
                "cohort": "c",
                "algorithm": "x",
                "num_classes": 2,
                "rounds": 1,
                "capabilities": [1],
            },
        ),
        ("aggregate", {"round": 1, "epoch": 0, "kind": "h", "contributors": [None]}),
        ("knowledge", {"round": 1, "kind": "k", "meta": []}),
        ("knowledge", {"round": 1, "kind": "k", "meta": {"x": msgpack.Timestamp(1)}}),
        ("welcome", {"address": "a", "round": 0, "members": {}}),
        ("welcome", {"address": "a", "round": 0, "members": ["p0"]}),
        ("gossip", {"members": [{"peer_id": "p", "address": "a"}]}),
        ("gossip", {"members": [{"peer_id": "p", "address": "a", "incarnation": -1}]}),
        (
            "gossip",
            {"members": [{"peer_id": "p", "address": "a", "incarnation": 0, "status": "zombie"}]},
        ),
        ("gossip", {"members": [{"peer_id": 1, "address": "a", "incarnation": 0}]}),
    ],
    ids=lambda v: v if isinstance(v, str) else repr(v)[:60],
)
def test_bad_body(type_: str, body: dict) -> None:
    rejects(frames_with(heartbeat_header(type=type_, body=body)), ErrorCode.BAD_HEADER)


def test_a_bad_element_of_a_long_list_is_named_by_its_index() -> None:
    # A result names its contributors, a welcome its members: lists of thousands are
    # checked without a path per element, and a bad one is still named exactly.
    ids = [f"p{i}" for i in range(2000)]
    body = {"round": 1, "epoch": 0, "kind": "h", "contributors": ids}
    assert decode(frames_with(heartbeat_header(type="aggregate", body=body))).contributors == ids
    bad = {**body, "contributors": [*ids[:1500], 7, *ids[1500:]]}
    with pytest.raises(ProtocolError, match=r"contributors\[1500\]: expected str, got int"):
        decode(frames_with(heartbeat_header(type="aggregate", body=bad)))
    members = [{"peer_id": f"p{i}", "address": "a", "incarnation": 0} for i in range(300)]
    members[201]["incarnation"] = -1
    with pytest.raises(ProtocolError, match=r"members\[201\]\.incarnation: negative"):
        decode(frames_with(heartbeat_header(type="gossip", body={"members": members})))


def test_member_status_defaults_to_alive() -> None:
    header = heartbeat_header(
        type="gossip", body={"members": [{"peer_id": "p", "address": "a", "incarnation": 0}]}
    )
    assert decode(frames_with(header)).members[0].status == "alive"


def test_a_member_record_goes_on_the_wire_with_every_field() -> None:
    # The encoder packs records by hand (asdict deep-copies): a field added to
    # MemberRecord must be packed too.
    from hfl.protocol.codec import _pack_default

    record = MemberRecord(peer_id="p1", address="tcp://h:1", incarnation=3, status="suspect",
                          vouched=1)
    assert _pack_default(record) == dataclasses.asdict(record)
    frames = encode(Gossip(sender="p0", incarnation=0, members=[record]))
    assert decode(frames).members == [record]
    # vouched 0 (a suggestion) stays off the wire: a record is as before lazy join
    plain = dataclasses.replace(record, vouched=0)
    assert "vouched" not in _pack_default(plain)
    assert decode(encode(Gossip(sender="p0", incarnation=0, members=[plain]))).members == [plain]


def test_the_lazy_join_fields_stay_off_the_wire_at_0_and_round_trip_otherwise() -> None:
    # hello view_from, welcome view_upto, heartbeat view (PROTOCOL.md): a peer in the
    # default join sends exactly the bytes it sent before the fields existed.
    for msg, name in ((Hello(sender="p1", incarnation=0, address="a", cohort="c", algorithm="x",
                             num_classes=2, rounds=3), "view_from"),
                      (Welcome(sender="p1", incarnation=0, address="a", round=1), "view_upto"),
                      (Heartbeat(sender="p1", incarnation=0, round=1), "view")):
        header = msgpack.unpackb(bytes(encode(msg)[0]), raw=False)
        assert name not in header["body"]
        lazy = dataclasses.replace(msg, **{name: 7})
        header = msgpack.unpackb(bytes(encode(lazy)[0]), raw=False)
        assert header["body"][name] == 7 and decode(encode(lazy)) == lazy


def test_the_justification_fields_stay_off_the_wire_when_empty_and_round_trip_nested() -> None:
    # rev. 15: knowledge promise_sig/proofs, aggregate sig/promises/proofs (PROTOCOL.md,
    # *Justified proposals*): an unsigned cohort sends exactly the bytes it sent before,
    # and a fail-over's proofs (maps of maps) come back as they went.
    sig, digest = "ab" * 64, "cd" * 32
    proofs = {f"0:{digest}": {"by": "p2", "sig": sig},
              f"1:{digest}": {"acks": {"p0": sig, "p1": sig}},
              f"2:{digest}": {"by": "p3", "sig": sig, "promises": {"p0": f"2:1:{digest}:{sig}"}}}
    env = dict(sender="p1", incarnation=0, round=4, kind="weights")
    for msg, fields in ((Knowledge(**env, epoch=3), dict(promise_sig=sig, proofs=proofs)),
                        (AggregateResult(**env, epoch=3), dict(sig=sig, proofs=proofs, promises={
                            "p0": f"3:2:{digest}:{sig}", "p1": f"3:-1::{sig}"}))):
        header = msgpack.unpackb(bytes(encode(msg)[0]), raw=False)
        assert not set(fields) & set(header["body"]), header["body"]
        full = dataclasses.replace(msg, **fields)
        assert decode(encode(full)) == full


def test_a_member_record_vouched_is_0_or_1() -> None:
    member = {"peer_id": "p", "address": "a", "incarnation": 0, "vouched": 2}
    err = rejects(frames_with(heartbeat_header(type="gossip", body={"members": [member]})),
                  ErrorCode.BAD_HEADER)
    assert "members[0].vouched" in str(err)


def test_too_many_members() -> None:
    members = [dataclasses.asdict(m) for m in MEMBERS]
    header = heartbeat_header(type="gossip", body={"members": members})
    assert len(decode(frames_with(header), Limits(max_members=3)).members) == 3
    rejects(frames_with(header), ErrorCode.TOO_LARGE, Limits(max_members=2))


def test_meta_depth_and_keys() -> None:
    deep4 = {"a": {"b": [{"c": 1}]}}  # the meta map itself counts as level 1
    assert decode(frames_with(knowledge_header(meta=deep4))).meta == deep4
    rejects(frames_with(knowledge_header(meta={"a": {"b": [{"c": []}]}})), ErrorCode.BAD_HEADER)
    rejects(
        frames_with(knowledge_header(meta=deep4)), ErrorCode.BAD_HEADER, Limits(max_meta_depth=3)
    )
    rejects(frames_with(knowledge_header(meta={"a": {b"k": 1}})), ErrorCode.BAD_HEADER)
    rejects(frames_with(knowledge_header(meta={b"k": 1})), ErrorCode.BAD_HEADER)


# --------------------------------------------------------------------------- tensor rules


def f32(name: str = "x", shape=(2, 3), dtype: str = "float32") -> dict:
    return {"name": name, "dtype": dtype, "shape": list(shape)}


def test_tensor_frame_count_mismatch() -> None:
    rejects(frames_with(knowledge_header(f32())), ErrorCode.BAD_FRAMES)
    rejects(frames_with(knowledge_header(), b"\x00" * 24), ErrorCode.BAD_FRAMES)
    rejects(frames_with(knowledge_header(f32(), f32("y")), b"\x00" * 24), ErrorCode.BAD_FRAMES)


def test_tensors_on_a_type_without_tensors() -> None:
    rejects(frames_with(heartbeat_header(tensors=[f32()]), b"\x00" * 24), ErrorCode.BAD_TENSOR)


@pytest.mark.parametrize(
    "dtype",
    ["object", "O", "<f4", "float", "complex64", "str", "V8", "void", "datetime64", 5, None],
)
def test_dtype_not_allowed(dtype) -> None:
    rejects(frames_with(knowledge_header(f32(dtype=dtype)), b"\x00" * 24), ErrorCode.BAD_TENSOR)


def test_dtype_allowlist_is_configurable() -> None:
    frames = frames_with(knowledge_header(f32(dtype="float64")), b"\x00" * 48)
    assert decode(frames).tensors["x"].dtype == np.float64
    rejects(frames, ErrorCode.BAD_TENSOR, Limits(allowed_dtypes=frozenset({"float32"})))
    with pytest.raises(ValueError):
        Limits(allowed_dtypes=frozenset({"object"}))
    with pytest.raises(ValueError):
        Limits(allowed_dtypes=frozenset({"<f4"}))


@pytest.mark.parametrize(
    "shape",
    [None, "23", [2, -3], [2.0, 3], [True, 6], {"0": 6}, [[2], 3]],
    ids=repr,
)
def test_bad_shape(shape) -> None:
    spec = {"name": "x", "dtype": "float32", "shape": shape}
    rejects(frames_with(knowledge_header(spec), b"\x00" * 24), ErrorCode.BAD_TENSOR)


def test_too_many_dims() -> None:
    spec = f32(shape=[1] * 9)
    rejects(frames_with(knowledge_header(spec), b"\x00" * 4), ErrorCode.BAD_TENSOR)
    assert decode(frames_with(knowledge_header(f32(shape=[1] * 8)), b"\x00" * 4))


def test_too_many_elements() -> None:
    huge = f32(shape=[2**40, 2**40])  # would overflow int64; must not crash
    rejects(frames_with(knowledge_header(huge), b""), ErrorCode.TOO_LARGE)
    # No elements, and a dimension numpy refuses (it raised ValueError, past the drop
    # with a reason: a fuzzer's find): each dimension is bounded too.
    for shape in ([2**63, 0], [2**62, 0], [2**32, 2**32, 0]):
        rejects(frames_with(knowledge_header(f32(shape=shape)), b""), ErrorCode.TOO_LARGE)
    assert decode(frames_with(knowledge_header(f32(shape=[0, 7])), b"")).tensors["x"].shape == (0, 7)
    rejects(
        frames_with(knowledge_header(f32(shape=[5])), b"\x00" * 20),
        ErrorCode.TOO_LARGE,
        Limits(max_tensor_elements=4),
    )


@pytest.mark.parametrize("nbytes", [0, 23, 25, 48])
def test_bytes_do_not_match_shape(nbytes: int) -> None:
    rejects(frames_with(knowledge_header(f32()), b"\x00" * nbytes), ErrorCode.BAD_TENSOR)


def test_duplicate_tensor_names() -> None:
    frames = frames_with(knowledge_header(f32(), f32()), b"\x00" * 24, b"\x00" * 24)
    rejects(frames, ErrorCode.BAD_TENSOR)


@pytest.mark.parametrize(
    "spec",
    [[1], "x", {"dtype": "float32", "shape": [6]}, {"name": 3, "dtype": "float32", "shape": [6]}],
    ids=repr,
)
def test_bad_tensor_descriptor(spec) -> None:
    rejects(frames_with(knowledge_header(spec), b"\x00" * 24), ErrorCode.BAD_TENSOR)


# --------------------------------------------------------------------------- encode refuses what decode rejects


@pytest.mark.parametrize(
    ("msg", "code"),
    [
        (Heartbeat(sender="", incarnation=0, round=0), ErrorCode.BAD_HEADER),
        (Heartbeat(sender="a", incarnation=-1, round=0), ErrorCode.BAD_HEADER),
        (Heartbeat(sender="a", incarnation=0, round="1"), ErrorCode.BAD_HEADER),
        (
            Knowledge(sender="a", incarnation=0, round=0, kind="k", meta={"f": object()}),
            ErrorCode.BAD_HEADER,
        ),
        (
            Knowledge(sender="a", incarnation=0, round=0, kind="k", meta={1: 2}),
            ErrorCode.BAD_HEADER,
        ),
        (
            Knowledge(sender="a", incarnation=0, round=0, kind="k", tensors={"s": np.array(["a"])}),
            ErrorCode.BAD_TENSOR,
        ),
        (
            Knowledge(
                sender="a", incarnation=0, round=0, kind="k", tensors={"o": np.array([None])}
            ),
            ErrorCode.BAD_TENSOR,
        ),
        (
            Knowledge(sender="a", incarnation=0, round=0, kind="k", tensors={1: np.zeros(2)}),
            ErrorCode.BAD_TENSOR,
        ),
        (
            Knowledge(
                sender="a",
                incarnation=0,
                round=0,
                kind="k",
                tensors={"c": np.zeros(2, np.complex64)},
            ),
            ErrorCode.BAD_TENSOR,
        ),
        (Gossip(sender="a", incarnation=0, members=[{"peer_id": "p"}]), ErrorCode.BAD_HEADER),
        (
            Gossip(
                sender="a",
                incarnation=0,
                members=[MemberRecord(peer_id="p", address="a", incarnation=0, status="x")],
            ),
            ErrorCode.BAD_HEADER,
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_encode_refuses_invalid_messages(msg: Message, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        encode(msg)
    assert info.value.code == code


def test_encode_respects_limits() -> None:
    msg = Knowledge(sender="a", incarnation=0, round=0, kind="k", tensors={"x": np.zeros(10)})
    with pytest.raises(ProtocolError) as info:
        encode(msg, Limits(max_tensor_elements=5))
    assert info.value.code == ErrorCode.TOO_LARGE
    with pytest.raises(ProtocolError) as info:
        encode(MEMBERS[0])  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.UNKNOWN_TYPE


# --------------------------------------------------------------------------- the spec document


def test_spec_version_matches_code() -> None:
    text = SPEC.read_text(encoding="utf-8")
    versions = re.findall(r"^\*\*Protocol version:\*\*\s*(\d+)\s*$", text, flags=re.MULTILINE)
    assert versions == [str(PROTOCOL_VERSION)]


def test_spec_documents_every_type_and_field() -> None:
    text = SPEC.read_text(encoding="utf-8")
    for type_name, cls in MESSAGE_TYPES.items():
        match = re.search(
            rf"^### `{type_name}`.*?(?=^### |^## |\Z)", text, flags=re.MULTILINE | re.DOTALL
        )
        assert match, f"PROTOCOL.md has no section for {type_name}"
        for f in dataclasses.fields(cls):
            if f.name not in ("sender", "incarnation"):
                assert f"| `{f.name}` |" in match.group(0), f"{type_name}.{f.name} undocumented"
    members = re.search(
        r"^### Member record.*?(?=^### |^## |\Z)", text, flags=re.MULTILINE | re.DOTALL
    )
    assert members
    for f in dataclasses.fields(MemberRecord):
        assert f"| `{f.name}` |" in members.group(0)
    for key, value in vars(ErrorCode).items():
        if key.isupper():
            assert f"`{value}`" in text, f"error code {value} undocumented"


def test_spec_limits_match_defaults() -> None:
    text = SPEC.read_text(encoding="utf-8")
    documented = dict(re.findall(r"^\| `(max_\w+)` \| (\d+)", text, flags=re.MULTILINE))
    defaults = {
        f.name: getattr(DEFAULT_LIMITS, f.name)
        for f in dataclasses.fields(Limits)
        if f.name.startswith("max_")
    }
    assert {k: int(v) for k, v in documented.items()} == defaults
    assert all(f"`{name}`" in text for name in DEFAULT_LIMITS.allowed_dtypes)


def test_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        Limits(max_frames=-1)
    with pytest.raises(ValueError):
        Limits(max_members=1.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- fuzzing


def test_fuzzed_frames_decode_or_raise_protocol_error() -> None:
    msg = Knowledge(
        sender="peer-3",
        incarnation=1,
        round=5,
        kind="prototypes",
        meta={"counts": [3, 4, 5], "acc": 0.5, "name": "x", "nested": {"a": [1, 2]}},
        tensors={
            "protos": np.arange(12, dtype=np.float32).reshape(3, 4),
            "mask": np.array([True, False]),
            "scalar": np.int16(7),
        },
    )
    valid = [bytes(f) for f in encode(msg)]
    rng = random.Random(0)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(300):
        frames = [bytearray(f) for f in valid]
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            i = rng.randrange(len(frames)) if frames else 0
            if not frames:
                frames.append(bytearray())
            elif op < 0.5 and frames[i]:
                frames[i][rng.randrange(len(frames[i]))] = rng.randrange(256)
            elif op < 0.7:
                frames[i] = frames[i][: rng.randrange(len(frames[i]) + 1)]
            elif op < 0.8:
                frames[i] += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            elif op < 0.9:
                del frames[i]
            else:
                frames.insert(i, bytearray(rng.randbytes(rng.randint(0, 16))))
        try:
            decode(frames)
            outcomes["ok"] += 1
        except ProtocolError:
            outcomes["error"] += 1
    assert outcomes["error"] > 100


def test_the_aggregate_digest_is_what_protocol_md_defines():
    # PROTOCOL.md (heartbeat absorbed_digest), version 5: SHA-256 of "hfl-payload\0",
    # msgpack [kind, meta with every map's keys in sorted order], then per tensor in
    # name order msgpack [name, dtype name, shape] and its bytes; all 64 hex digits.
    import hashlib

    import msgpack

    from hfl.peer.core import payload_digest
    from hfl.protocol import AggregateResult

    tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int64),
               "s": np.array(2.5, dtype=np.float64)}
    meta = {"round": 1, "excluded": ["p3"], "z": {"b": 1, "a": 2.5}}
    msg = AggregateResult(sender="p0", incarnation=0, round=1, epoch=0, kind="weights",
                          meta=meta, tensors=tensors)
    h = hashlib.sha256(b"hfl-payload\x00")
    h.update(msgpack.packb(["weights", {"excluded": ["p3"], "round": 1, "z": {"a": 2.5, "b": 1}}]))
    for name, dtype, shape in (("b", "int64", [3]), ("s", "float64", []), ("w", "float32", [2, 3])):
        h.update(msgpack.packb([name, dtype, shape]) + tensors[name].tobytes())
    assert payload_digest(msg) == h.hexdigest()
    # Every part counts: the kind, a meta value, a map's order does not.
    assert payload_digest(dataclasses.replace(msg, kind="other")) != payload_digest(msg)
    assert payload_digest(dataclasses.replace(msg, meta={**meta, "round": 2})) != payload_digest(msg)
    reordered = {"z": {"a": 2.5, "b": 1}, "excluded": ["p3"], "round": 1}
    assert payload_digest(dataclasses.replace(msg, meta=reordered)) == payload_digest(msg)


def test_a_member_record_checked_in_one_test_is_what_the_field_walk_makes_of_it() -> None:
    # _check_member takes a plain, well-formed record in one test; anything else goes
    # the field walk, which names the problem. Oracle: the walk itself (a dict subclass
    # is never taken by the one test). Both must accept the same records, make the same
    # MemberRecord of each and reject the same others.
    from hfl.protocol.codec import DEFAULT_LIMITS, _check_member

    class Walked(dict):
        pass

    rng = random.Random(5)
    values = ["p", "", 0, 1, -1, 2, True, False, None, 1.0, 2**70, "alive", "dead", "left",
              "suspect", "zombie", b"p", ["p"], {"p": 1}]
    fields = ["peer_id", "address", "incarnation", "status", "vouched"]
    outcomes = set()
    for _ in range(3000):
        record = {f: rng.choice(values) for f in fields if rng.random() < 0.85}
        if rng.random() < 0.5:  # most records of a real view are well-formed
            record.update(peer_id=f"p{rng.randrange(9)}", address="tcp://h:1",
                          incarnation=rng.randrange(3))
        if rng.random() < 0.2:
            record["latency_ms"] = 3  # unknown keys are ignored either way
        results = []
        for value in (record, Walked(record)):
            try:
                got = _check_member(value, DEFAULT_LIMITS, "members[0]")
                results.append(("ok", got, type(got), dataclasses.astuple(got)))
            except ProtocolError as err:
                results.append(("error", err.code, str(err)))
        assert results[0] == results[1], record
        outcomes.add(results[0][0])
    assert outcomes == {"ok", "error"}
