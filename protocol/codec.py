"""Wire codec of the hfl protocol: messages <-> ZeroMQ multipart frames.

A message travels as one msgpack header frame followed by one raw frame per
tensor (spec: PROTOCOL.md at the repo root)::

    frame 0   msgpack map {"v", "type", "sender", "incarnation", "body", "tensors"}
    frame 1+  the bytes of each tensor, C order, little-endian, in header order

:func:`encode` and :func:`decode` are pure functions. Both are zero-copy for
tensor data: encoding hands out memoryviews of the arrays (do not mutate an
array until its frames are sent), decoding returns ``np.frombuffer`` views of
the received frames (read-only when the frame is immutable, as ``bytes`` and
ZeroMQ frames are; copy before writing in place).

Nothing here ever unpickles. Every limit is a field of :class:`Limits`, and
every failure of :func:`decode` is a :class:`ProtocolError` carrying an
:class:`ErrorCode`, so a peer can drop a bad message with a logged reason
(or answer it with an ``Error`` reply) and never crash.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from .messages import (
    MEMBER_STATUSES,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    ErrorCode,
    MemberRecord,
    Message,
    ProtocolError,
)

__all__ = [
    "DEFAULT_ALLOWED_DTYPES",
    "DEFAULT_LIMITS",
    "MAX_SENDER_CHARS",
    "Frame",
    "Limits",
    "decode",
    "encode",
    "message_nbytes",
]

#: One frame: bytes, bytearray, memoryview, any buffer-protocol object, or an
#: object with a ``.buffer`` attribute such as ``zmq.Frame``.
Frame = Any

#: Upper bound on the envelope ``sender`` (it doubles as the ZeroMQ identity).
MAX_SENDER_CHARS = 128
_MAX_IDENTITY_BYTES = 255  # libzmq's limit on a routing id

DEFAULT_ALLOWED_DTYPES: frozenset[str] = frozenset(
    {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}
)
_NUMERIC_KINDS = "biufc"
_ENVELOPE_FIELDS = ("sender", "incarnation", "tensors")


_DTYPE_NAMES: dict[np.dtype, str] = {}  # numpy computes dtype.name in Python, each time
_LE_DTYPES: dict[str, np.dtype] = {}  # allowed dtype name -> its little-endian dtype


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, remembered (it cost a round's messages more than their hashing)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = dtype.name
        if len(_DTYPE_NAMES) < 256:  # the numeric dtypes number a few dozen
            _DTYPE_NAMES[dtype] = name
    return name


def _fail(code: str, reason: str) -> typing.NoReturn:
    raise ProtocolError(code, reason)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Limits:
    """Bounds a decoder enforces on every incoming message (sizes in bytes)."""

    max_frames: int = 64
    max_message_bytes: int = 256 * 2**20
    max_header_bytes: int = 1 * 2**20
    max_tensor_elements: int = 64 * 2**20
    max_tensor_ndim: int = 8
    allowed_dtypes: frozenset[str] = DEFAULT_ALLOWED_DTYPES
    max_meta_depth: int = 4
    max_members: int = 4096

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "allowed_dtypes" and (not _is_int(value) or value < 0):
                raise ValueError(f"Limits.{f.name} must be a non-negative int, got {value!r}")
        object.__setattr__(self, "allowed_dtypes", frozenset(self.allowed_dtypes))
        for name in self.allowed_dtypes:
            try:
                dtype = np.dtype(name)
            except Exception:
                dtype = None
            if dtype is None or dtype.name != name or dtype.kind not in _NUMERIC_KINDS:
                raise ValueError(
                    f"Limits.allowed_dtypes: {name!r} is not a canonical numeric numpy dtype name"
                )


DEFAULT_LIMITS = Limits()
#: ``node.max_message_mib`` by default: the default limits' message size
DEFAULT_MAX_MESSAGE_MIB = DEFAULT_LIMITS.max_message_bytes // 2**20


def limits_for(max_message_mib: int) -> Limits:
    """The limits of a cohort whose messages are at most ``max_message_mib`` MiB
    (``node.max_message_mib``): tensors of at most 2^18 elements a MiB, the default's
    ratio (64 Mi elements in 256 MiB). The other bounds stay the defaults."""
    return dataclasses.replace(DEFAULT_LIMITS, max_message_bytes=max_message_mib * 2**20,
                               max_tensor_elements=max_message_mib * 2**18)


# --------------------------------------------------------------------------- body schema
# Each body field is checked against its dataclass annotation by a validator built
# once at import time. A validator takes (value, limits, path) and returns the value
# to hand to the dataclass, or raises ProtocolError.

_Validator = Callable[[Any, Limits, str], Any]


def _check_str(value: Any, limits: Limits, path: str) -> str:
    if not isinstance(value, str):
        _fail(ErrorCode.BAD_HEADER, f"{path}: expected str, got {type(value).__name__}")
    return value


def _check_int(value: Any, limits: Limits, path: str) -> int:
    if not _is_int(value):
        _fail(ErrorCode.BAD_HEADER, f"{path}: expected int, got {type(value).__name__}")
    return value


def _check_float(value: Any, limits: Limits, path: str) -> float:
    if not (_is_int(value) or isinstance(value, float)):
        _fail(ErrorCode.BAD_HEADER, f"{path}: expected float, got {type(value).__name__}")
    return float(value)


def _check_bool(value: Any, limits: Limits, path: str) -> bool:
    if not isinstance(value, bool):
        _fail(ErrorCode.BAD_HEADER, f"{path}: expected bool, got {type(value).__name__}")
    return value


def _check_meta(value: Any, limits: Limits, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(ErrorCode.BAD_HEADER, f"{path}: expected map, got {type(value).__name__}")
    return _check_plain(value, limits, path, depth=1)


def _check_plain(value: Any, limits: Limits, path: str, depth: int) -> Any:
    """Plain data: None, bool, int, float, str, bytes, and lists / str-keyed maps of it."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (list, dict)):
        if depth > limits.max_meta_depth:
            _fail(ErrorCode.BAD_HEADER, f"{path}: nested deeper than {limits.max_meta_depth}")
        if isinstance(value, list):
            return [_check_plain(v, limits, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(ErrorCode.BAD_HEADER, f"{path}: map key {key!r} is not a str")
            out[key] = _check_plain(item, limits, f"{path}.{key}", depth + 1)
        return out
    _fail(ErrorCode.BAD_HEADER, f"{path}: {type(value).__name__} is not allowed")


def _check_member(value: Any, limits: Limits, path: str) -> MemberRecord:
    # A well-formed record in one test (a welcome carries a thousand of them, and the
    # field walk below, with a path string per field, was most of its decode and of
    # its encode, which checks what the receiver will); anything else goes the long
    # way, which accepts the same records and names what is wrong with the others.
    if type(value) is dict:
        get = value.get
        peer_id, address, incarnation = get("peer_id"), get("address"), get("incarnation")
        status, vouched = get("status", "alive"), get("vouched", 0)
        if (type(peer_id) is str and type(address) is str and type(incarnation) is int
                and incarnation >= 0 and type(status) is str and status in MEMBER_STATUSES
                and type(vouched) is int and (vouched == 0 or vouched == 1)):
            # (MemberRecord(...) sets each field through the frozen dataclass's
            # object.__setattr__: 2.5 us a record; this is the same object in 0.4)
            record = object.__new__(MemberRecord)
            record.__dict__.update(peer_id=peer_id, address=address, incarnation=incarnation,
                                   status=status, vouched=vouched)
            return record
    if not isinstance(value, dict):
        _fail(ErrorCode.BAD_HEADER, f"{path}: expected map, got {type(value).__name__}")
    kwargs = _check_fields(MemberRecord, value, limits, path)
    if kwargs["incarnation"] < 0:
        _fail(ErrorCode.BAD_HEADER, f"{path}.incarnation: negative")
    if kwargs.get("status", "alive") not in MEMBER_STATUSES:
        _fail(ErrorCode.BAD_HEADER, f"{path}.status: {kwargs['status']!r} not in {MEMBER_STATUSES}")
    if kwargs.get("vouched", 0) not in (0, 1):
        _fail(ErrorCode.BAD_HEADER, f"{path}.vouched: {kwargs['vouched']!r} not 0 or 1")
    return MemberRecord(**kwargs)


def _list_of(item: _Validator, max_len_field: str | None = None) -> _Validator:
    def check(value: Any, limits: Limits, path: str) -> list[Any]:
        if not isinstance(value, list):
            _fail(ErrorCode.BAD_HEADER, f"{path}: expected array, got {type(value).__name__}")
        if max_len_field is not None and len(value) > getattr(limits, max_len_field):
            _fail(ErrorCode.TOO_LARGE, f"{path}: {len(value)} entries > {max_len_field}")
        # A result names its N contributors, a welcome its N members: no path string per
        # element unless one is bad (and ids, the common case, in one pass: 28 % of a
        # 1,000-contributor result's decode).
        if item is _check_str and all(type(v) is str for v in value):
            return value
        try:
            return [item(v, limits, path) for v in value]
        except ProtocolError:
            for i, v in enumerate(value):
                item(v, limits, f"{path}[{i}]")  # raises again, naming the element
            raise

    return check


def _dict_of(item: _Validator) -> _Validator:
    def check(value: Any, limits: Limits, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            _fail(ErrorCode.BAD_HEADER, f"{path}: expected map, got {type(value).__name__}")
        out = {}
        for key, v in value.items():
            if not isinstance(key, str):
                _fail(ErrorCode.BAD_HEADER, f"{path}: map key {key!r} is not a str")
            out[key] = item(v, limits, f"{path}.{key}")
        return out

    return check


_SCALARS: dict[Any, _Validator] = {
    str: _check_str,
    int: _check_int,
    float: _check_float,
    bool: _check_bool,
    MemberRecord: _check_member,
}


def _validator_for(hint: Any) -> _Validator:
    if hint in _SCALARS:
        return _SCALARS[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and len(args) == 1:
        return _list_of(_validator_for(args[0]), "max_members" if args[0] is MemberRecord else None)
    if origin is dict and len(args) == 2 and args[0] is str:
        return _check_meta if args[1] is Any else _dict_of(_validator_for(args[1]))
    raise TypeError(f"codec has no wire rule for annotation {hint!r}")


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    required: bool
    check: _Validator


def _schema(cls: type, skip: tuple[str, ...] = ()) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        _FieldSpec(
            f.name,
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            _validator_for(hints[f.name]),
        )
        for f in dataclasses.fields(cls)
        if f.name not in skip
    )


_SCHEMAS: dict[type, tuple[_FieldSpec, ...]] = {
    cls: _schema(cls, _ENVELOPE_FIELDS) for cls in MESSAGE_TYPES.values()
}
_SCHEMAS[MemberRecord] = _schema(MemberRecord)
# _check_member's one test knows these fields: a field added to MemberRecord must be
# added there too (the long way would check it, the one test would let it through).
assert [f.name for f in _SCHEMAS[MemberRecord]] == [
    "peer_id", "address", "incarnation", "status", "vouched"], "update _check_member"
#: Optional fields added since protocol version 5 (rev. 3) that stay off the wire when
#: 0 (absent reads as 0): a peer that does not use them sends what it sent before.
_ABSENT_AT_ZERO: dict[type, tuple[str, ...]] = {
    MESSAGE_TYPES["hello"]: ("view_from", "part"),
    MESSAGE_TYPES["welcome"]: ("view_upto",),
    MESSAGE_TYPES["heartbeat"]: ("view", "wants_copy"),
    # rev. 15, where commits are certified (justified proposals)
    MESSAGE_TYPES["knowledge"]: ("promise_sig", "proofs"),
    MESSAGE_TYPES["aggregate"]: ("sig", "promises", "proofs"),
    # rev. 18 (a copy of an accepted result for a later epoch's aggregator)
    MESSAGE_TYPES["relayed"]: ("sig",),
}
_HAS_TENSORS = {
    cls: any(f.name == "tensors" for f in dataclasses.fields(cls)) for cls in MESSAGE_TYPES.values()
}


def _check_fields(cls: type, data: dict[Any, Any], limits: Limits, path: str) -> dict[str, Any]:
    """Known fields of ``cls`` from ``data``; unknown keys are ignored."""
    kwargs = {}
    for spec in _SCHEMAS[cls]:
        if spec.name in data:
            kwargs[spec.name] = spec.check(data[spec.name], limits, f"{path}.{spec.name}")
        elif spec.required:
            _fail(ErrorCode.BAD_HEADER, f"{path}: missing required field {spec.name!r}")
    return kwargs


# --------------------------------------------------------------------------- frames


def _as_view(frame: Frame, index: int) -> memoryview:
    """A flat unsigned-byte view of one frame, without copying."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        frame = getattr(frame, "buffer", frame)
    try:
        view = memoryview(frame)
        if not view.c_contiguous:
            raise ValueError("not C-contiguous")
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
    except (TypeError, ValueError) as exc:
        _fail(ErrorCode.BAD_FRAMES, f"frame {index} is not a contiguous byte buffer: {exc}")
    return view


def _as_views(frames: Sequence[Frame]) -> list[memoryview]:
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        _fail(ErrorCode.BAD_FRAMES, "expected a sequence of frames, got a single buffer")
    try:
        frames = list(frames)
    except TypeError:
        _fail(ErrorCode.BAD_FRAMES, f"expected a sequence of frames, got {type(frames).__name__}")
    return [_as_view(frame, i) for i, frame in enumerate(frames)]


def message_nbytes(frames: Sequence[Frame]) -> int:
    """Total size in bytes of a message's frames (header plus tensor payloads)."""
    return sum(view.nbytes for view in _as_views(frames))


def _check_sender(sender: Any, incarnation: Any) -> None:
    if not isinstance(sender, str) or not sender:
        _fail(ErrorCode.BAD_HEADER, "sender must be a non-empty str")
    if len(sender) > MAX_SENDER_CHARS:
        _fail(ErrorCode.BAD_HEADER, f"sender longer than {MAX_SENDER_CHARS} characters")
    try:
        identity = sender.encode("utf-8")
    except UnicodeEncodeError:
        _fail(ErrorCode.BAD_HEADER, "sender is not valid unicode")
    if len(identity) > _MAX_IDENTITY_BYTES or identity.startswith(b"\x00"):
        _fail(ErrorCode.BAD_HEADER, "sender is not usable as a ZeroMQ identity")
    if not _is_int(incarnation) or incarnation < 0:
        _fail(ErrorCode.BAD_HEADER, "incarnation must be a non-negative int")


def _tensor_dtype(name: Any, shape: Any, limits: Limits, path: str) -> np.dtype:
    """Check one tensor's dtype and shape; return its little-endian dtype."""
    if not isinstance(name, str) or name not in limits.allowed_dtypes:
        _fail(ErrorCode.BAD_TENSOR, f"{path}: dtype {name!r} is not allowed")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        _fail(ErrorCode.BAD_TENSOR, f"{path}: shape must be a list of non-negative ints")
    if len(shape) > limits.max_tensor_ndim:
        _fail(ErrorCode.BAD_TENSOR, f"{path}: {len(shape)} dims > {limits.max_tensor_ndim}")
    # Each dimension too, not only their product: [2**63, 0] has 0 elements and passes
    # the product, and numpy refuses the shape (a ValueError, not a drop: a fuzzer's find).
    if math.prod(shape) > limits.max_tensor_elements or any(
            d > limits.max_tensor_elements for d in shape):
        _fail(ErrorCode.TOO_LARGE, f"{path}: more than {limits.max_tensor_elements} elements")
    dtype = _LE_DTYPES.get(name)
    if dtype is None:  # name is one of limits.allowed_dtypes: a few canonical names
        dtype = _LE_DTYPES[name] = np.dtype(name).newbyteorder("<")
    return dtype


def _check_totals(views: list[memoryview], limits: Limits) -> None:
    if not views:
        _fail(ErrorCode.BAD_FRAMES, "no frames")
    if len(views) > limits.max_frames:
        _fail(ErrorCode.TOO_LARGE, f"{len(views)} frames > max_frames={limits.max_frames}")
    total = sum(view.nbytes for view in views)
    if total > limits.max_message_bytes:
        _fail(ErrorCode.TOO_LARGE, f"{total} bytes > max_message_bytes={limits.max_message_bytes}")
    if views[0].nbytes > limits.max_header_bytes:
        _fail(ErrorCode.TOO_LARGE, f"header > max_header_bytes={limits.max_header_bytes}")


def _parse_header(raw: memoryview, limits: Limits) -> tuple[type[Message], dict[str, Any], list]:
    """Unpack and validate the header frame: (message class, constructor kwargs, tensor specs)."""
    bound = limits.max_header_bytes
    try:
        header = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            max_str_len=bound,
            max_bin_len=bound,
            max_array_len=bound,
            max_map_len=bound,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types (ValueError, FormatError, ...)
        _fail(ErrorCode.BAD_HEADER, f"header is not valid msgpack: {type(exc).__name__}: {exc}")
    if not isinstance(header, dict):
        _fail(ErrorCode.BAD_HEADER, "header is not a msgpack map")

    version = header.get("v")
    if not _is_int(version):
        _fail(ErrorCode.BAD_HEADER, "header field 'v' missing or not an int")
    if version != PROTOCOL_VERSION:
        _fail(
            ErrorCode.VERSION_MISMATCH, f"protocol version {version}, expected {PROTOCOL_VERSION}"
        )
    type_name = header.get("type")
    if not isinstance(type_name, str):
        _fail(ErrorCode.BAD_HEADER, "header field 'type' missing or not a str")
    cls = MESSAGE_TYPES.get(type_name)
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {type_name[:64]!r}",
                            ref_type=type_name[:64])
    sender, incarnation = header.get("sender"), header.get("incarnation")
    _check_sender(sender, incarnation)
    body = header.get("body")
    if not isinstance(body, dict):
        _fail(ErrorCode.BAD_HEADER, "header field 'body' missing or not a map")
    specs = header.get("tensors")
    if not isinstance(specs, list):
        _fail(ErrorCode.BAD_HEADER, "header field 'tensors' missing or not an array")

    kwargs = _check_fields(cls, body, limits, type_name)
    kwargs["sender"], kwargs["incarnation"] = sender, incarnation
    return cls, kwargs, specs


# --------------------------------------------------------------------------- public API


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, MemberRecord):  # not dataclasses.asdict: it deep-copies (a view of
        # a thousand members goes out in every welcome and gossip)
        record = {"peer_id": obj.peer_id, "address": obj.address,
                  "incarnation": obj.incarnation, "status": obj.status}
        if obj.vouched:  # (absent means 0: a record without it is as before)
            record["vouched"] = obj.vouched
        return record
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
        return obj.item()
    raise TypeError(f"{type(obj).__name__} cannot go on the wire")


def _wire_array(value: Any, path: str) -> np.ndarray:
    """``value`` as a C-contiguous little-endian array (a copy only when needed)."""
    try:
        arr = np.asarray(value)
    except Exception as exc:  # e.g. a torch tensor that requires grad
        _fail(ErrorCode.BAD_TENSOR, f"{path}: not convertible to an array: {exc}")
    if arr.dtype != arr.dtype.newbyteorder("<"):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr).reshape(arr.shape)  # ascontiguousarray makes 0-d 1-d
    return arr


def encode(msg: Message, limits: Limits = DEFAULT_LIMITS) -> list[bytes | memoryview]:
    """Encode ``msg`` as multipart frames: a msgpack header, then one raw frame per tensor.

    Tensor frames are memoryviews of the arrays (copied only to make them
    C-contiguous or little-endian). Raises :class:`ProtocolError` for anything
    :func:`decode` with the same ``limits`` would reject; numpy scalars in
    ``meta`` are sent as Python numbers and tuples as arrays.
    """
    cls = MESSAGE_TYPES.get(getattr(msg, "TYPE", None))  # type: ignore[arg-type]
    if cls is None or not isinstance(msg, cls):
        _fail(ErrorCode.UNKNOWN_TYPE, f"{type(msg).__name__} is not a protocol message")
    body = {spec.name: getattr(msg, spec.name) for spec in _SCHEMAS[cls]}
    for name in _ABSENT_AT_ZERO.get(cls, ()):
        if not body[name]:  # (a message without it is byte for byte as before the field)
            del body[name]
    specs: list[dict[str, Any]] = []
    payload: list[memoryview] = []
    tensors = getattr(msg, "tensors", None) if _HAS_TENSORS[cls] else {}
    if not isinstance(tensors, dict):
        _fail(ErrorCode.BAD_TENSOR, "tensors must be a dict of name -> array")
    for name, value in tensors.items():
        if not isinstance(name, str):
            _fail(ErrorCode.BAD_TENSOR, f"tensor name {name!r} is not a str")
        arr = _wire_array(value, f"tensors.{name}")
        dtype, shape = dtype_name(arr.dtype), list(arr.shape)
        _tensor_dtype(dtype, shape, limits, f"tensors.{name}")
        specs.append({"name": name, "dtype": dtype, "shape": shape})
        payload.append(memoryview(arr.reshape(-1).view(np.uint8)))
    header = {
        "v": PROTOCOL_VERSION,
        "type": cls.TYPE,
        "sender": msg.sender,
        "incarnation": msg.incarnation,
        "body": body,
        "tensors": specs,
    }
    try:
        raw = msgpack.packb(header, use_bin_type=True, default=_pack_default)
    except Exception as exc:  # TypeError, ValueError, OverflowError, UnicodeEncodeError
        _fail(ErrorCode.BAD_HEADER, f"cannot encode {cls.TYPE}: {type(exc).__name__}: {exc}")
    frames: list[bytes | memoryview] = [raw, *payload]
    _check_totals([memoryview(raw), *payload], limits)
    _parse_header(memoryview(raw), limits)  # the same checks the receiver will make
    return frames


def decode(frames: Sequence[Frame], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode and validate multipart frames into a message.

    ``frames`` may hold bytes, bytearray, memoryview, any buffer-protocol object,
    or objects with a ``.buffer`` attribute (``zmq.Frame``). Tensors are
    zero-copy views of their frames: read-only for immutable frames, and valid
    as long as the frame's memory is. Unknown body fields are ignored. Every
    failure raises :class:`ProtocolError` with an :class:`ErrorCode`.
    """
    views = _as_views(frames)
    _check_totals(views, limits)
    cls, kwargs, specs = _parse_header(views[0], limits)
    if len(specs) != len(views) - 1:
        _fail(ErrorCode.BAD_FRAMES, f"header lists {len(specs)} tensors, got {len(views) - 1}")
    if specs and not _HAS_TENSORS[cls]:
        _fail(ErrorCode.BAD_TENSOR, f"{cls.TYPE} messages carry no tensors")

    tensors: dict[str, np.ndarray] = {}
    for i, (spec, view) in enumerate(zip(specs, views[1:], strict=True)):
        if not isinstance(spec, dict):
            _fail(ErrorCode.BAD_TENSOR, f"tensors[{i}] is not a map")
        name = spec.get("name")
        if not isinstance(name, str):
            _fail(ErrorCode.BAD_TENSOR, f"tensors[{i}].name missing or not a str")
        if name in tensors:
            _fail(ErrorCode.BAD_TENSOR, f"duplicate tensor name {name!r}")
        shape = spec.get("shape")
        dtype = _tensor_dtype(spec.get("dtype"), shape, limits, f"tensors.{name}")
        if math.prod(shape) * dtype.itemsize != view.nbytes:
            _fail(ErrorCode.BAD_TENSOR, f"tensors.{name}: {view.nbytes} bytes do not fit {shape}")
        tensors[name] = np.frombuffer(view, dtype=dtype).reshape(shape)
    if _HAS_TENSORS[cls]:
        kwargs["tensors"] = tensors
    return cls(**kwargs)
