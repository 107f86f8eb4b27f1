"""Where a peer's own CPU goes: the profile ``hfl-peer --profile`` writes, by cost.

``hfl-peer --profile FILE`` (or ``HFL_PROFILE=FILE``, ``{id}`` expanding to the
peer's id) profiles the event loop's thread with a CPU-time clock: what the
runtime itself costs (messages, signing, the protocol's bookkeeping, the event
loop, run files), not the method's calls (training, sharing, absorbing,
evaluating), which run in worker threads and are counted apart in every metrics
line (``compute_cpu_s``). :func:`split` sums a profile's self time by the kind of
code it was spent in; a built-in (a hash, a socket call, ``json.dumps``) counts
for the code that called it, shared among its callers as their calls were.

    python -m hfl.launch.profile runs/x/profile/p0.pstats [more.pstats ...]
"""

from __future__ import annotations

import pstats
import sys
from collections.abc import Iterable

#: (cost, what its code's file path contains); the first match wins.
COSTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("signing and digests", ("cryptography", "hashlib", "/peer/security.py")),
    ("messages (encode, decode)", ("/protocol/", "msgpack")),
    ("transport (ZeroMQ, CURVE)", ("/peer/transport.py", "/zmq/")),
    ("protocol state (core, membership, rounds)", ("/peer/core.py", "/peer/membership.py",
                                                   "/peer/rounds.py")),
    ("round engine (node, procedures)", ("/peer/node.py", "/peer/procedures.py",
                                         "/peer/instructions.py")),
    ("run files (metrics, checkpoints, logs)", ("/peer/runner.py", "/peer/checkpoint.py",
                                                "/peer/status.py", "/json/", "/logging/")),
    ("event loop (asyncio, threads)", ("/asyncio/", "uvloop", "selectors", "/concurrent/",
                                       "threading.py", "queue.py")),
)
OTHER = "other"
#: Functions of protocol code whose cost is signing or hashing, whatever their file.
SIGNING_FUNCTIONS = frozenset({"sign", "signed_by", "sign_ack", "ack_signed_by", "payload_digest",
                               "statement", "certificate", "verify"})


def cost_of(filename: str, function: str) -> str:
    """The kind of cost a function's own time is (``filename`` as pstats gives it)."""
    if function in SIGNING_FUNCTIONS:
        return "signing and digests"
    path = filename.replace("\\", "/")
    for cost, parts in COSTS:
        if any(part in path for part in parts):
            return cost
    return OTHER


def split(paths: Iterable[str]) -> dict[str, float]:
    """CPU seconds by kind of cost over the profiles at ``paths`` (summed), largest
    first. A built-in's time goes to its callers' kinds, in proportion to the time
    each caller's calls took; one with no caller recorded is ``other``."""
    stats = pstats.Stats(*[str(p) for p in paths])
    out: dict[str, float] = {}
    for (filename, _line, function), (_cc, _nc, self_s, _cum, callers) in stats.stats.items():
        if self_s <= 0:
            continue
        if filename != "~":  # Python code: its own kind
            out[cost_of(filename, function)] = out.get(cost_of(filename, function), 0.0) + self_s
            continue
        spent = {caller: c[2] for caller, c in callers.items() if c[2] > 0}
        total = sum(spent.values())
        if not total:
            out[OTHER] = out.get(OTHER, 0.0) + self_s
            continue
        for (c_file, _l, c_function), caller_s in spent.items():
            kind = cost_of(c_file, c_function) if c_file != "~" else OTHER
            out[kind] = out.get(kind, 0.0) + self_s * caller_s / total
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def describe(costs: dict[str, float], per: float = 1.0, unit: str = "s") -> list[str]:
    """One line per kind: its share and its seconds divided by ``per`` (e.g. the rounds)."""
    total = sum(costs.values()) or 1.0
    scale = 1e3 if unit == "ms" else 1.0
    return [f"{kind:42s} {100 * s / total:5.1f} %  {scale * s / per:9.3f} {unit}"
            for kind, s in costs.items()]


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m hfl.launch.profile FILE.pstats [...]", file=sys.stderr)
        return 2
    try:
        costs = split(paths)
    except (OSError, TypeError, ValueError, EOFError) as err:
        print(f"profile: cannot read {' '.join(paths)}: {err}", file=sys.stderr)
        return 2
    for line in describe(costs):
        print(line)
    print(f"{'total':42s} 100.0 %  {sum(costs.values()):9.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
