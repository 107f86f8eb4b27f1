"""What a peer tells its user while it runs, beyond the metrics lines.

* ``events.jsonl`` in the run directory: every warning and error the peer logs
  (``kind: log``: a refused handshake, an unreachable bootstrap address, a cohort
  that did not fully join), ``joining`` records while it waits for its cohort,
  and the protocol's typed notes (:data:`TYPED_EVENTS`: membership changes,
  drops with their code, elections taken, results published, committed and
  absorbed; docs/runtime.md, Typed events, lists their fields). ``hfl-launch`` follows this file
  and prints the problems on its console within a poll, instead of leaving them
  deep in ``peer.log``; benchmarks read the typed notes instead of log lines.
* :func:`watch_join`: warnings within seconds when nobody answers at the
  bootstrap address, or when only k of n peers have joined.
* :func:`cohort_shortfall`: a sharing method that ended with fewer peers than it
  was told to expect (``node.min_peers``, at least 2) is an error unless the
  user allowed it (``node.allow_solo`` / ``--allow-solo``).
* :func:`nobody_joined`: why a sharing peer with bootstrap addresses stopped
  before its first round (nobody joined within ``timing.join_timeout_s``)
  instead of training every round alone only to fail at the end.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hfl.peer.security import split_bootstrap

log = logging.getLogger("hfl.peer")

EVENTS_NAME = "events.jsonl"
BOOTSTRAP_WARN_S = 5.0  # nobody answered at any bootstrap address after this long
JOIN_WARN_S = 10.0  # "only k of n joined" after this long (and again at the join timeout)


class CohortTooSmall(Exception):
    """A sharing method ended below its expected cohort (hfl-peer exit status 3)."""


class CohortGone(CohortTooSmall):
    """A resumed peer found its cohort finished or gone: it stops instead of training
    alone (exit status 3, no summary of its own)."""


class StartError(Exception):
    """The peer cannot start here (e.g. its port is taken); one line for the user."""


class Unsendable(Exception):
    """This peer's own knowledge cannot go on the wire (larger than
    ``node.max_message_mib``, say): the peer stops at once (hfl-peer exit status 1),
    since every round would fail the same way; one paragraph for the user."""


def check_listen(listen: str) -> None:
    """Raise :class:`StartError` when ``tcp://host:port`` (port not 0) is taken.

    ZeroMQ would only say so seconds later, after the data and model are built,
    as a raw traceback. The probe sets SO_REUSEADDR as ZeroMQ does, so a port
    left in TIME_WAIT by a previous run of this peer is not reported."""
    if not listen.startswith("tcp://"):
        return
    host, _, port = listen[len("tcp://"):].rpartition(":")
    if not (port.isascii() and port.isdigit()) or int(port) == 0:
        return
    host = "" if host in ("*", "0.0.0.0") else host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartError(address_in_use(listen)) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise StartError(f"cannot listen on {listen}: this machine has no address {host} "
                                 "(node.listen)") from None
            # anything else (a name to resolve...): let ZeroMQ decide


def address_in_use(listen: str) -> str:
    return (f"cannot listen on {listen}: the port is in use (another peer, an earlier run "
            "still stopping, or another program); choose another port in node.listen, or "
            "port 0 for any free one")


def data_split_fingerprint(data) -> dict[str, int]:
    """``{"data_split": crc32}`` of how peers that split one dataset between them
    choose their rows (partition, num_partitions, alpha, seed, global test
    fraction), for the handshake: a peer that partitions differently would train
    on rows another peer also holds, or test on someone's training rows. The
    dataset itself is left out on purpose: row-aligned views of one dataset
    (CHFL's and FedHP's cohorts: digits, rotated digits, recoloured digits) are
    split alike. Empty when the peer does not partition (its own data)."""
    import zlib

    fields = data_split_fields(data)
    if not fields:
        return {}
    return {"data_split": zlib.crc32(json.dumps(fields, sort_keys=True).encode())}


def data_split_fields(data) -> dict[str, object]:
    """What :func:`data_split_fingerprint` covers, by field (empty where the peer does
    not partition): a launcher names the one that differs."""
    if data.partition == "none" or data.num_partitions == 1:
        return {}
    return {"partition": data.partition, "num_partitions": data.num_partitions,
            "seed": data.seed, "alpha": data.alpha if data.partition == "dirichlet" else None,
            "global_test_fraction": data.global_test_fraction}


def class_names_term(names: tuple[str, ...] | None) -> dict[str, int]:
    """``{"class_names": crc32}`` of the classes' names in label order, for the
    handshake, where the data names its classes (text labels, image folders): two
    peers that number their classes differently (each sorting the labels its own file
    holds) would average a class of one into another class of the other. Empty for
    numeric labels."""
    import zlib

    if names is None:
        return {}
    return {"class_names": zlib.crc32(json.dumps(list(names)).encode())}


def max_rss_mb() -> float | None:
    """This process's peak resident memory in MiB (all its peers', in an in-process
    cohort), or None where the OS does not say (Windows). On Linux the kernel's
    high-water mark (VmHWM): ``ru_maxrss`` there keeps the peak of the process that
    started it (a launcher's, across fork and exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, KiB elsewhere
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)


def cpu_by_thread() -> dict[str, float]:
    """This process's CPU seconds so far by thread name, from /proc (Linux; {} where
    there is none): the event loop (``MainThread``), the method's worker (``hfl-work``),
    libzmq's I/O thread (``ZMQbg/IO/0``: the sockets, and CURVE's encryption), its
    reaper, the CURVE authenticator, and ``native`` (unnamed library threads: torch's,
    OpenMP's). Threads of one name are summed; threads that
    ended are not in it (an ended worker's CPU is in ``cpu_time_s`` only)."""
    import os
    import threading

    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    try:
        tasks = os.listdir("/proc/self/task")
        with open("/proc/self/comm") as f:
            process = f.read().strip()
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        name = names.get(int(tid), comm)
        if name.startswith("hfl-work"):
            name = "hfl-work"  # the worker pool: one name
        elif int(tid) not in names and comm == process:
            name = "native"  # unnamed threads of a library (torch's, OpenMP's)
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


#: The node's notes (``Node._observe``) that go to events.jsonl, as ``kind``: a member's
#: status changed (member, old, new, reason), a message dropped (code, reason), an
#: injected crash (round, phase), the rounds began (round), a result taken from an
#: aggregator's epoch (took), published or committed as aggregator, absorbed, a member
#: proven to equivocate (equivocator), a tick that overran its limit (slow_tick: the loop
#: is overloaded), the join given up short of the cohort (join_short), what this life has
#: sent by type at each round's end (sent).
TYPED_EVENTS = frozenset({"started", "member", "dropped", "crash", "took", "published",
                          "committed", "absorbed", "equivocator", "slow_tick", "join_short",
                          "sent"})


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the process's name (state first), or None."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()
    except (OSError, ValueError):
        return None


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat), or None
    where that cannot be read (no such process, not Linux). With the pid it names one
    process: a pid alone may be another's after the first ended (a container restarts
    its pids from 1)."""
    return _start_time(_stat_fields(pid))


def _start_time(fields: list[str] | None) -> int | None:
    """The start time among :func:`_stat_fields` (field 22 of the whole line), or None."""
    try:
        return int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None


def process_alive(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` runs and, where ``started`` is given and readable, is the process
    that started then."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        pass
    fields = _stat_fields(pid)
    if fields and fields[0] in ("Z", "X"):  # a zombie (killed, not reaped yet) is gone too
        return False
    now = _start_time(fields) if started is not None else None
    return started is None or now is None or now == started


class Repeats:
    """One log line per distinct text per ``window_s``: repeats meanwhile are counted
    and said with the next line. A refused hello was logged every half second, about
    480 lines in two minutes on each side, where the docs promise once a minute."""

    def __init__(self, window_s: float = 60.0, clock=time.monotonic, most: int = 10_000):
        self.window_s, self.clock, self.most = window_s, clock, most
        self._seen: dict[str, list] = {}  # text -> [logged at, repeats since]

    def note(self, text: str) -> tuple[bool, int]:
        """(log it now, how many repeats since it was last logged)."""
        now = self.clock()
        entry = self._seen.get(text)
        if entry is not None and now - entry[0] < self.window_s:
            entry[1] += 1
            return False, 0
        if entry is None and len(self._seen) >= self.most:  # (bounded: old texts go, and
            self._seen = {t: e for t, e in self._seen.items()  # all of them in a flood of
                          if now - e[0] < self.window_s}  # texts all different)
            if len(self._seen) >= self.most:
                self._seen.clear()
        more = entry[1] if entry is not None else 0
        self._seen[text] = [now, 0]
        return True, more

    @staticmethod
    def suffix(more: int) -> str:
        return f" ({more} more like it since the last such line)" if more else ""


class EventLog:
    """The typed notes of one peer, one JSON line each, appended to events.jsonl.

    Each note opens, appends and closes (as the warnings do): an injected crash exits
    the process at once, and its note is on disk before; a thousand peers in one
    process hold no thousand open files. A full or read-only disk stops the notes,
    never the peer."""

    def __init__(self, path: Path, clock: Any = None):
        self.path = path
        self.broken = False
        # The node's clock where one is injected (the simulator's virtual time): each
        # note then also carries ``vt``, on the timeline of the simulator's own log.
        self.clock = clock

    def note(self, kind: str, peer: str, incarnation: int, fields: dict[str, Any]) -> None:
        if self.broken:
            return
        if self.clock is not None:
            fields = {**fields, "vt": self.clock.now()}
        try:
            append_event(self.path, kind=kind, peer=peer, incarnation=incarnation, **fields)
        except OSError as exc:
            self.broken = True
            log.warning("%s: cannot write %s (%s): no more typed events this run", peer,
                        self.path, exc)


def append_event(path: Path, **record: Any) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"t": time.time(), **record}, default=str) + "\n")


class StatusEvents(logging.Handler):
    """Warnings and errors of the ``hfl`` loggers, one JSON line each."""

    def __init__(self, path: Path):
        super().__init__(level=logging.WARNING)
        self.path = path
        self.broken = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.broken:
            return
        try:
            level = "error" if record.levelno >= logging.ERROR else "warning"
            append_event(self.path, kind="log", level=level, template=str(record.msg),
                         msg=record.getMessage())
        except OSError:
            # A full or read-only disk must not stop the peer, nor print a traceback per
            # warning: the write that matters (metrics, checkpoint) names the error.
            self.broken = True
        except Exception:
            self.handleError(record)


def attach(run_dir: Path) -> StatusEvents:
    handler = StatusEvents(run_dir / EVENTS_NAME)
    logging.getLogger("hfl").addHandler(handler)
    return handler


def detach(handler: StatusEvents) -> None:
    logging.getLogger("hfl").removeHandler(handler)


def _greeted(node) -> list[str]:
    mem = node.membership
    if mem is None:
        return []
    return sorted(m.peer_id for m in mem.members.values() if m.status == "alive" and m.greeted)


def _listed(ids: list[str], most: int = 8) -> str:
    """``ids`` for a log line: the first ``most`` and how many more (a cohort of a
    thousand forming put 500 ids on each peer's line)."""
    more = f" and {len(ids) - most} more" if len(ids) > most else ""
    return ", ".join(ids[:most]) + more


async def watch_join(node, bootstrap: tuple[str, ...], need: int, join_timeout_s: float,
                     events: Path | None, poll_s: float = 0.25, alone_stops: bool = False) -> None:
    """Until the first round ends: report join progress and warn early when the
    cohort does not come together (``alone_stops``: the peer stops at the join
    timeout if nobody joined). Cancelled by the caller."""
    clock = node.clock
    started = clock.now()
    last: tuple[int, int] | None = None
    warned_bootstrap = warned_join = False
    start_round = node.round
    while True:
        await asyncio.sleep(poll_s)
        # The join's own count (kept as members change): sorting the view every poll
        # cost a thousand peers in one process a thousand scans of it every 0.25 s.
        joined = 1 + (len(node.membership.join_counts()[0]) if node.membership else 0)
        if events is not None and (joined, need) != last:
            append_event(events, kind="joining", joined=joined, need=need)
            last = (joined, need)
        if node.round > start_round:
            return  # past the first round: the metrics speak from here on
        waited = clock.now() - started
        refused = node.dropped.get("refused", 0) > 0  # an answer, logged with its reason
        # A refused handshake was logged with its cause the moment it happened.
        refused = refused or any(node.transport.dial_failure(split_bootstrap(b)[1])
                                 for b in bootstrap)
        if (bootstrap and joined == 1 and not refused and not warned_bootstrap
                and waited >= BOOTSTRAP_WARN_S):
            warned_bootstrap = True
            log.warning("%s: no answer from %s after %.0fs: is a peer listening there (address, "
                        "port, firewall)? still trying until timing.join_timeout_s=%.0fs",
                        node.id, ", ".join(bootstrap), waited, join_timeout_s)
        if 1 < need and joined < need and not warned_join and waited >= JOIN_WARN_S:
            warned_join = True
            then = ("stopping if nobody joined (--allow-solo trains alone)"
                    if alone_stops and joined == 1 else "training with whoever is there")
            log.warning("%s: only %d of %d peers joined after %.0fs (%s); waiting while "
                        "more arrive, until none new for timing.join_timeout_s=%.0fs, then %s",
                        node.id, joined, need, waited, _listed([node.id, *_greeted(node)]),
                        join_timeout_s, then)


def cohort_shortfall(mode: str, min_peers: int, metrics: list[dict[str, Any]]) -> str | None:
    """Why this run did not share as configured, or None: a sharing method (not
    ``local``) whose largest cohort seen in any round stayed below ``min_peers``
    (at least 2: sharing with nobody is training alone), or that learned from no
    other peer (``learned_from`` 0) in more than half of its rounds. The cohort a round
    saw counts every member met in that life (``met_peers``), not only those live when
    it was recorded: in a short run with restarts (a rolling restart during 4 rounds)
    no round had all members up at once, and each peer failed "the cohort was
    incomplete" although it had met every member (hfl-sim, mdhfl, 6 peers)."""
    if mode == "local" or not metrics:
        return None
    expected = max(2, min_peers)
    # The cohort a round shared with: the peers live when it was recorded, or more: a
    # peer it learned from may have finished and left before (a cohort's last round).
    seen = max(max(int(r.get("live_peers", 1)), int(r.get("learned_from", 0)) + 1,
                   int(r.get("met_peers", 1))) for r in metrics)
    if seen >= expected:
        # A line may cover several rounds (node.evaluate_every): count rounds, not lines.
        isolated = isolated_rounds(metrics)
        # Rounds that exchanged: cohort.communicate_every's local steps learn from nobody.
        rounds = sum(int(r.get("exchanges", r.get("span", 1))) for r in metrics if "learned_from" in r)
        if isolated < 2 or 2 * isolated <= rounds:
            return None
        return (f"learned from no other peer in {isolated} of its {rounds} round(s) "
                "(its peers died or left, or their knowledge missed every deadline): most "
                "of this result is training alone; see the warnings above, or allow it with "
                "node.allow_solo: true (--allow-solo)")
    return (f"shared with at most {seen - 1} other peer(s) in "
            f"{sum(int(r.get('span', 1)) for r in metrics)} round(s), "
            f"expected a cohort of {expected} (node.min_peers={min_peers}): "
            f"{'this peer trained alone' if seen == 1 else 'the cohort was incomplete'}; "
            "look for refused handshakes or unreachable addresses above, or allow it with "
            "node.allow_solo: true (--allow-solo)")


def isolated_rounds(metrics: Iterable[dict[str, Any]]) -> int:
    """How many of these metrics lines' rounds exchanged and learned from no other peer
    (``learned_from`` 0; a line folding several rounds says ``isolated_rounds``)."""
    return sum(int(r.get("isolated_rounds", r.get("learned_from") == 0)) for r in metrics
               if isinstance(r.get("learned_from"), int))


def nobody_joined(algorithm: str, bootstrap: list[str], join_timeout_s: float,
                  causes: list[str], refused: bool = False) -> str:
    """Why a sharing peer stopped before its first round: no other peer joined."""
    if refused:
        fix = "a peer refused our hello (the reason is logged above): make the configs agree"
    elif any("refused our connection" in c for c in causes):
        # (a key missing from the other side's allow-list: the peer listens, and waiting
        # longer cannot help; the advice below sent users to their firewall, a review)
        fix = ("a peer listens there and refused our connection: fix what it names (the "
               "allow-list lines from hfl-keys new, security.mode) on the side that refused")
    else:
        fix = ("check that a peer listens there (address, port, firewall) or give it longer "
               "(timing.join_timeout_s)")
    return (f"no other peer joined within timing.join_timeout_s={join_timeout_s:g}s "
            f"(bootstrap {', '.join(bootstrap)}{''.join(f'; {c}' for c in causes)}); {algorithm} "
            f"shares with peers, so this peer stops instead of training every round alone: "
            f"{fix}; to train alone anyway, pass --allow-solo (node.allow_solo: true)")
