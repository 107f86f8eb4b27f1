"""Typed configuration: YAML or dicts -> (frozen) dataclasses, validated at load time.

An error names the field path (``timing.round_timeout_s``, ``peers[2].id``), the bad
value and what is allowed. Only the standard library and PyYAML are imported: this
module sits on the CLI's start-up path, which must answer ``--help`` and config errors
at once.

Field constraints live in ``dataclasses.field(metadata=...)`` (or :func:`setting`):
``min``/``max`` (inclusive), ``gt``/``lt`` (exclusive), ``choices``, ``pattern`` (regex
fullmatch on strings) and ``help``. On a list, tuple or dict field they apply to each
item. A dataclass may define ``validate(self)`` for cross-field rules; a ``ValueError``
from it (or from ``__post_init__``) becomes a :class:`ConfigError` at that dataclass's
path, and a ``ConfigError`` raised there has its path taken relative to the dataclass.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import math
import operator
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union

import yaml

__all__ = [
    "ConfigError",
    "apply_overrides",
    "build",
    "describe",
    "load",
    "load_yaml",
    "setting",
    "to_dict",
]

T = TypeVar("T")

_NoneType = type(None)
_MISSING = dataclasses.MISSING
# PyYAML follows YAML 1.1, where a float needs a dot and a signed exponent: `1e-3` and
# `1.0e3` load as strings. Float fields accept such strings.
_SCI_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_BOUNDS = (
    ("gt", operator.gt, ">"),
    ("min", operator.ge, ">="),
    ("lt", operator.lt, "<"),
    ("max", operator.le, "<="),
)


class ConfigError(ValueError):
    """A configuration value is wrong. ``path`` is the dotted field path ('' for the root)."""

    def __init__(self, path: str, detail: str, source: str | None = None) -> None:
        self.path = path
        self.detail = detail
        self.source = source  # file name (and line) where known
        super().__init__(": ".join([p for p in (source, path) if p] + [detail]))

    def __reduce__(self):  # keep path/detail when pickled across processes
        return (type(self), (self.path, self.detail, self.source))

    def with_prefix(self, prefix: str) -> ConfigError:
        return type(self)(_join(prefix, self.path), self.detail, self.source)

    def with_source(self, source: str) -> ConfigError:
        return type(self)(self.path, self.detail, source)


class _Mismatch(ConfigError):
    """The value has the wrong shape for the type (used to pick the best error in unions)."""


def setting(
    default: Any = _MISSING,
    *,
    default_factory: Any = _MISSING,
    help: str | None = None,
    min: float | None = None,
    max: float | None = None,
    gt: float | None = None,
    lt: float | None = None,
    choices: Iterable[Any] | None = None,
    pattern: str | None = None,
) -> Any:
    """``dataclasses.field`` with the constraint metadata spelled as keywords."""
    meta = {
        "help": help,
        "min": min,
        "max": max,
        "gt": gt,
        "lt": lt,
        "choices": tuple(choices) if choices is not None else None,
        "pattern": pattern,
    }
    metadata = {k: v for k, v in meta.items() if v is not None}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


# ----------------------------------------------------------------------------- build


def build(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Construct dataclass ``cls`` from ``data`` (``None`` means all defaults)."""
    if not _is_dataclass_type(cls):
        raise TypeError(f"build() needs a dataclass type, got {cls!r}")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise _Mismatch(path, f"got {_show(data)}; expected a mapping of {cls.__name__} fields")
    hints = _hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = [f.name for f in fields]
    # YAML 1.1 reads a key spelled on/off/yes/no as a boolean: `selection: {on: val}`
    # (as the docs write it) was "selection.True: unknown key"
    data = {_yaml11_word(k, names): v for k, v in data.items()}

    unknown = [k for k in data if k not in names]
    if unknown:
        key = str(unknown[0])
        detail = f"unknown key; allowed keys: {', '.join(names)}{_did_you_mean(key, names)}"
        if len(unknown) > 1:
            detail += f" (also unknown: {', '.join(repr(k) for k in unknown[1:])})"
        raise ConfigError(_join(path, key), detail)

    kwargs: dict[str, Any] = {}
    for f in fields:
        tp = hints[f.name]
        fpath = _join(path, f.name)
        has_default = f.default is not _MISSING or f.default_factory is not _MISSING
        value = data.get(f.name, _MISSING)
        if value is None and has_default and _is_dataclass_type(tp):
            value = _MISSING  # an empty YAML section (`timing:`) means its defaults
        if value is _MISSING:
            if has_default:
                continue
            what = _type_name(tp) + (f": {f.metadata['help']}" if "help" in f.metadata else "")
            raise ConfigError(fpath, f"missing required field ({what})")
        kwargs[f.name] = _convert(tp, value, fpath, f.metadata)

    try:
        obj = cls(**kwargs)
        validate = getattr(obj, "validate", None)
        if callable(validate):
            validate()
    except ConfigError as e:
        raise e.with_prefix(path) from e
    except ValueError as e:
        raise ConfigError(path, str(e)) from e
    return obj


def _convert(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        _check(value, value, meta, path, "a number")
        return value
    if origin is Annotated:
        return _convert(args[0], value, path, meta)
    if origin is Union or origin is types.UnionType:
        return _convert_union(tp, args, value, path, meta)
    if origin is Literal:
        value = _yaml11_word(value, args)  # (`standardize: off` read as False)
        for allowed in args:
            if type(allowed) is type(value) and allowed == value:
                return allowed
        raise _Mismatch(
            path, f"got {value!r}; allowed: {_listing(args)}{_did_you_mean(value, args)}"
        )
    if _is_dataclass_type(tp):
        return build(tp, value, path)
    if tp in (list, tuple) or origin in (list, tuple):
        return _convert_sequence(tp, origin or tp, args, value, path, meta)
    if tp is dict or origin is dict:
        return _convert_dict(tp, args, value, path, meta)
    if tp is bool:
        if isinstance(value, bool):
            _check(value, value, meta, path, "")
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            _check(value, value, meta, path, "an integer")
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            converted = float(value)
        elif isinstance(value, str) and _SCI_FLOAT.fullmatch(value.strip()):
            converted = float(value)
        else:
            converted = None
        if converted is not None:
            if math.isinf(converted):  # (NaN fails every bound: _check says so)
                raise ConfigError(path, f"got {_show(value)}; expected a finite number")
            _check(converted, value, meta, path, "a number")
            return converted
    elif tp is str:
        if isinstance(value, str):
            _check(value, value, meta, path, "")
            return value
        if value is not None and not isinstance(value, (list, dict)):
            raise _Mismatch(
                path, f"got {_show(value)}; expected str (quote it in YAML to keep it text)"
            )
    else:
        raise TypeError(f"{path or '<root>'}: unsupported annotation {tp!r}")
    raise _Mismatch(path, f"got {_show(value)}; expected {_type_name(tp)}")


def _convert_union(tp, members, value, path, meta):
    if value is None:
        if _NoneType in members:
            return None
        raise _Mismatch(path, f"got None; expected {_type_name(tp)}")
    candidates = [m for m in members if m is not _NoneType]
    if len(candidates) == 1:
        return _convert(candidates[0], value, path, meta)
    errors: list[ConfigError] = []
    for member in candidates:
        try:
            return _convert(member, value, path, meta)
        except ConfigError as e:
            errors.append(e)
    # A member that accepted the shape but failed deeper (a bound, a nested field) says more.
    for e in errors:
        if not (isinstance(e, _Mismatch) and e.path == path):
            raise e
    raise _Mismatch(path, f"got {_show(value)}; expected {_type_name(tp)}")


def _convert_sequence(tp, kind, args, value, path, meta):
    if not isinstance(value, (list, tuple)):
        raise _Mismatch(path, f"got {_show(value)}; expected {_type_name(tp)} (a YAML list)")
    if kind is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise _Mismatch(
                path, f"got {len(value)} items; expected {len(args)} ({_type_name(tp)})"
            )
        item_types = args
    else:
        item_types = [args[0] if args else Any] * len(value)
    items = [
        _convert(item_tp, item, f"{path}[{i}]", meta)
        for i, (item_tp, item) in enumerate(zip(item_types, value, strict=True))
    ]
    return tuple(items) if kind is tuple else items


def _convert_dict(tp, args, value, path, meta):
    if not isinstance(value, Mapping):
        raise _Mismatch(path, f"got {_show(value)}; expected {_type_name(tp)} (a mapping)")
    key_tp, value_tp = args if args else (Any, Any)
    out = {}
    for k, v in value.items():
        kpath = _join(path, str(k))
        try:
            key = _convert(key_tp, k, kpath, {})
        except ConfigError as e:
            raise ConfigError(kpath, f"bad key: {e.detail}") from None
        out[key] = _convert(value_tp, v, kpath, meta)
    return out


#: YAML 1.1 (PyYAML's) booleans spelled as words a setting may mean literally.
_YAML11_WORDS = {True: ("on", "yes", "true", "y"), False: ("off", "no", "false", "n")}


def _yaml11_word(value: Any, allowed: Iterable[Any]) -> Any:
    """``value`` read as a YAML 1.1 boolean from a word that ``allowed`` holds (``on``,
    ``off``, ``yes``, ``no``), as that word; anything else as it is."""
    if isinstance(value, bool):
        allowed = list(allowed)
        for word in _YAML11_WORDS[value]:
            if word in allowed:
                return word
    return value


def _check(value: Any, shown: Any, meta: Mapping[str, Any], path: str, noun: str) -> None:
    """Apply the field's constraints to one (already converted) scalar."""
    if not meta:
        return
    choices = meta.get("choices")
    if choices is not None and not any(type(c) is type(value) and c == value for c in choices):
        raise ConfigError(
            path, f"got {shown!r}; allowed: {_listing(choices)}{_did_you_mean(value, choices)}"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bounds = [(meta[k], op, sym) for k, op, sym in _BOUNDS if meta.get(k) is not None]
        # `not op(...)` rather than the inverse comparison, so that NaN fails every bound.
        if any(not op(value, bound) for bound, op, _ in bounds):
            wanted = " and ".join(f"{sym} {bound}" for bound, _, sym in bounds)
            raise ConfigError(path, f"got {_show(shown)}; expected {noun or 'a number'} {wanted}")
    pattern = meta.get("pattern")
    if pattern is not None and isinstance(value, str) and re.fullmatch(pattern, value) is None:
        raise ConfigError(path, f"got {value!r}; expected "
                                f"{meta.get('means') or f'a string matching {pattern!r}'}")


# ------------------------------------------------------------------ files and overrides


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # unhashable key: let PyYAML report it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r}",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


# Numbers as YAML 1.2 reads them, not YAML 1.1 (PyYAML's): `rounds: 010` was 8 (octal)
# and `round_timeout_s: 1:30` was 90 (base 60), silently. Now 010 is 10, 0o10 is 8 and
# 1:30 is text (an error naming the field where a number is wanted). Booleans keep
# YAML 1.1's words (yes, no, on, off): `_yaml11_word` gives the word back where a
# setting takes it.
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
_StrictLoader.add_implicit_resolver(
    _FLOAT, re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def _yaml12_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


_StrictLoader.add_constructor(_INT, _yaml12_int)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping (an empty file gives ``{}``)."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", "config file not found", source=file) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("", f"cannot read config file: {e}", source=file) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: safe
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else file
        raise ConfigError("", f"invalid YAML: {e.problem or e}", source=where) from None
    except yaml.YAMLError as e:
        raise ConfigError("", f"invalid YAML: {e}", source=file) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            "", f"top level must be a mapping of settings, got {_show(data)}", source=file
        )
    return data


_KEY_PART = re.compile(r"([^\[\]]*)((?:\[\d+\])*)")


def apply_overrides(data: Mapping[str, Any] | None, overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a copy of ``data``.

    Missing or null intermediate sections are created as mappings; list items are
    addressed as ``peers[1].lr`` or ``peers.1.lr`` and must exist. A value replaces
    what was there (a mapping value is not merged).
    """
    result: dict[str, Any] = copy.deepcopy(dict(data)) if data else {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("", f"malformed override {item!r}: expected key.path=value")
        tokens = _parse_key(key, item)
        try:
            value = yaml.load(raw, Loader=_StrictLoader)  # (numbers as in files)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or e
            raise ConfigError(
                key, f"override {item!r}: cannot parse value as YAML: {problem}"
            ) from None
        _set_path(result, tokens, value, item)
    return result


def literal_override(key: str, value: object) -> str:
    """``key=value`` with ``value`` taken as a string whatever it holds: overrides are
    read as YAML, and a path given by a flag (``--run-dir "runs/exp #2"``) lost what
    followed a `` #`` as a comment (``--fresh`` then deleted ``runs/exp``, another run:
    a launcher review). A JSON string is a YAML double-quoted scalar: with its characters
    as they are (YAML does not join the two halves of an escaped emoji: "runs/exp-🚀"
    raised), or all escaped (\\uXXXX, which YAML reads as JSON does) where one is a
    character YAML cannot print: a lone surrogate (a file name's undecodable byte), a C1
    control or NEL (read back as a space, or refused: a review)."""
    text = str(value)
    return f"{key}={json.dumps(text, ensure_ascii=not all(map(_yaml_printable, text)))}"


def _yaml_printable(c: str) -> bool:
    """Whether YAML reads ``c`` as it is inside a double-quoted scalar (YAML 1.1's
    printable set; a tab and a line break are escaped by JSON already)."""
    return (c in "\t\n\r" or " " <= c <= "~" or "\xa0" <= c <= "\ud7ff"
            or "\ue000" <= c <= "\ufffd" or "\U00010000" <= c <= "\U0010ffff")


def _parse_key(key: str, item: str) -> list[str | int]:
    tokens: list[str | int] = []
    for part in key.split("."):
        m = _KEY_PART.fullmatch(part.strip())
        if m is None or not (m.group(1) or (m.group(2) and tokens)):
            raise ConfigError("", f"malformed override {item!r}: bad key part {part!r}")
        if m.group(1):
            tokens.append(m.group(1))
        tokens.extend(int(i) for i in re.findall(r"\d+", m.group(2)))
    return tokens


def _set_path(root: dict[str, Any], tokens: list[str | int], value: Any, item: str) -> None:
    cur: Any = root
    walked = ""
    for n, tok in enumerate(tokens):
        last = n == len(tokens) - 1
        if isinstance(cur, dict):
            if isinstance(tok, int):
                raise ConfigError(walked, f"override {item!r}: {walked} is a mapping, not a list")
            if tok not in cur and tok.isdigit() and int(tok) in cur:
                tok = int(tok)  # a YAML mapping with integer keys
            step = _join(walked, str(tok))
        elif isinstance(cur, list):
            if isinstance(tok, str):
                if not tok.isdigit():
                    raise ConfigError(
                        walked, f"override {item!r}: {walked} is a list; use {walked}[N]"
                    )
                tok = int(tok)
            step = f"{walked}[{tok}]"
            if tok >= len(cur):
                raise ConfigError(
                    step, f"override {item!r}: {walked} has {len(cur)} items, no index {tok}"
                )
        else:
            raise ConfigError(
                walked, f"override {item!r}: {walked} is {_show(cur)}, not a mapping or list"
            )
        if last:
            cur[tok] = value
        else:
            nxt = cur.get(tok) if isinstance(cur, dict) else cur[tok]
            if nxt is None and isinstance(tokens[n + 1], int):
                raise ConfigError(step, f"override {item!r}: {step} is not set, so it has "
                                        f"no item {tokens[n + 1]}; give the whole list: "
                                        f"{step}=[...]")
            if nxt is None:
                nxt = cur[tok] = {}
            cur = nxt
        walked = step


def load(cls: type[T], file: str | Path | None = None, overrides: Iterable[str] = ()) -> T:
    """``load_yaml`` + ``apply_overrides`` + ``build``; errors carry the file name."""
    data = load_yaml(file) if file is not None else {}
    data = apply_overrides(data, list(overrides))
    try:
        return build(cls, data)
    except ConfigError as e:
        if file is None or e.source:
            raise
        raise e.with_source(str(file)) from None


# ---------------------------------------------------------------------- output


def to_dict(obj: Any) -> dict[str, Any]:
    """Dataclass -> plain dict (tuples as lists), ready for ``yaml.safe_dump``."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"to_dict() needs a dataclass instance, got {obj!r}")
    return _plain(obj)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def describe(cls: type) -> str:
    """One line per field (type, default, constraints, help); nested sections indented."""
    lines: list[str] = []
    _describe_into(cls, 0, lines, {cls})
    return "\n".join(lines)


def _describe_into(cls: type, depth: int, lines: list[str], seen: set[type]) -> None:
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        text = f"{'  ' * depth}{f.name}: {_type_name(tp)}"
        if f.default is not _MISSING:
            default = f.default
        elif f.default_factory is not _MISSING:
            default = f.default_factory()
        else:
            default = _MISSING
            text += " (required)"
        if default is not _MISSING and not dataclasses.is_dataclass(default):
            text += f" = {default!r}"
        rules = [f"{sym} {f.metadata[k]}" for k, _, sym in _BOUNDS if k in f.metadata]
        if "choices" in f.metadata:
            rules.append(f"one of {_listing(f.metadata['choices'])}")
        if "pattern" in f.metadata:
            rules.append(f"matches {f.metadata['pattern']!r}")
        if rules:
            text += f" [{', '.join(rules)}]"
        if "help" in f.metadata:
            text += f"  # {f.metadata['help']}"
        lines.append(text)
        inner = _inner_dataclass(tp)
        if inner is not None and inner not in seen:
            _describe_into(inner, depth + 1, lines, seen | {inner})


def _inner_dataclass(tp: Any) -> type | None:
    if _is_dataclass_type(tp):
        return tp
    for arg in typing.get_args(tp):
        found = _inner_dataclass(arg) if arg is not Ellipsis else None
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------- helpers


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except NameError as e:
        raise TypeError(f"cannot resolve the annotations of {cls.__qualname__}: {e}") from e


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _join(prefix: str, key: str) -> str:
    if not prefix:
        return key
    if not key:
        return prefix
    return prefix + key if key.startswith("[") else f"{prefix}.{key}"


def _show(value: Any) -> str:
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _listing(values: Iterable[Any]) -> str:
    return ", ".join(repr(v) for v in values)


def _did_you_mean(value: Any, candidates: Iterable[Any]) -> str:
    if not isinstance(value, str):
        return ""
    by_lower = {c.lower(): c for c in candidates if isinstance(c, str)}
    close = difflib.get_close_matches(value.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return "Any"
    if tp is _NoneType:
        return "None"
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is Union or origin is types.UnionType:
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(tp, "__name__", repr(tp))


def config_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "",
                       ignore: tuple[str, ...] = ()) -> list[str]:
    """``dotted.key: old -> new`` for each value that differs (nested dicts walked;
    top-level keys in ``ignore`` skipped); values shortened to one line."""
    out = []
    for key in sorted(set(old) | set(new)):
        if not prefix and key in ignore:
            continue
        a, b = old.get(key, "<unset>"), new.get(key, "<unset>")
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, path + ".")
        elif a != b:
            out.append(f"{path}: {_short(a)} -> {_short(b)}")
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."

