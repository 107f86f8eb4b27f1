"""One in-process run of bench/scale.py: N peers in this process, one event loop.

    python bench/_scale_worker.py SPEC.json

Not a benchmark by itself: ``bench/scale.py`` writes SPEC.json (the experiment file,
``kill_after``, where to write the result, optionally ``hfl_src``) and starts this
script with a timeout. What it does mirrors ``hfl-launch EXP --in-process``
(:mod:`hfl.launch.inprocess`): it expands the experiment with
:func:`hfl.launch.experiment.expand`, moves the plans to the in-memory transport with
:func:`hfl.launch.inprocess.in_memory`, logs every peer's lines to ``<run dir>/peers.log``
and runs :func:`hfl.peer.runner.run_peer` for each plan on one ``MemoryHub``. On top:

* **Counting.** ``InMemoryTransport.send_now`` is wrapped (the class attribute, before
  any peer starts; ``send`` goes through it too): every send that delivered (the
  original returned True) is counted
  by its header's ``type`` (``msgpack.unpackb(frames[0])["type"]``), per sender, with
  its bytes, in one-second buckets of wall time. *Membership* messages are every type
  but :data:`NOT_MEMBERSHIP`, so a new type (a probe, say) counts as membership.
* **A kill.** Once every peer has finished round ``kill_after`` (its ``round`` note,
  and from ``metrics.jsonl`` every second),
  the peer with the highest index dies as a SIGKILLed process would: its transport
  crashes (``InMemoryTransport.crash``: its sends fail, no goodbye gets out, its address
  leaves the hub and sends to it fail), then its ``run_peer`` task is cancelled. ``t_kill`` is ``time.monotonic()`` at that moment.
* **Detection.** Each peer runs with :class:`MembershipWatch` as its observer, which
  takes the nodes' typed notes (docs/runtime.md, Typed events) and notes
  ``time.monotonic()`` of each observer's first ``member`` note that the victim is
  dead; detection time is that minus ``t_kill``. Other notes of ``-> suspect`` /
  ``-> dead`` (about live peers, or about the victim before the kill) are counted as
  false suspicions / deaths.

``hfl_src`` (bench/scale.py --hfl-src DIR): :func:`use_hfl_from` makes ``import hfl``
load the packages of checkout DIR instead of the editable install. bench/scale.py also
calls it from a ``sitecustomize.py`` it writes, so that the processes ``hfl-launch``
starts import the same code.

bench/scale.py imports this module's counting and metrics helpers
(:class:`MessageCounter`, :func:`round_stats`, ...) for its forked and sim modes; it
imports nothing of ``hfl`` at import time, so that :func:`use_hfl_from` can run first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import importlib.abc
import importlib.util
import inspect
import json
import logging
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Header types that are not membership traffic (everything else is).
NOT_MEMBERSHIP = frozenset(
    {"knowledge", "aggregate", "ack", "commit", "seed_request", "seed_chunk", "error"}
)
POLL_S = 0.05  # how often the kill task checks who finished round kill_after
RESCAN_S = 1.0  # how often it also reads the metrics files (if the log lines change)
BUCKET_S = 0.1  # message counts are kept per BUCKET_S of wall time
PROGRESS_S = 15.0  # a progress line on stdout (bench/scale.py keeps it in its log)


# --------------------------------------------------------------------------- hfl from a checkout


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """``hfl`` -> an empty package; ``hfl.<layer>`` -> ``<root>/<layer>/`` (the repository
    root is the package: pyproject.toml maps hfl.peer to peer/, and so on)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, name, path, target=None):
        if name == "hfl":
            return importlib.util.spec_from_loader("hfl", None, is_package=True)
        if name.startswith("hfl.") and name.count(".") == 1:
            layer = Path(self.root) / name.split(".")[1]
            if not (layer / "__init__.py").exists():
                return None
            return importlib.util.spec_from_file_location(
                name, layer / "__init__.py", submodule_search_locations=[str(layer)]
            )
        return None  # hfl.peer.node etc.: found through hfl.peer's own path


def use_hfl_from(root: str) -> None:
    """Import ``hfl`` from checkout ``root`` from now on (call before anything imports it).

    Drops the editable install's finder from ``sys.meta_path`` and puts one first that
    maps ``hfl.<layer>`` to ``root/<layer>`` (as /tmp/oldboot.py did)."""
    if any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
        return
    if any(m == "hfl" or m.startswith("hfl.") for m in sys.modules):
        raise RuntimeError("use_hfl_from: hfl is already imported")
    sys.meta_path[:] = [
        f for f in sys.meta_path if not ("editable" in repr(f).lower() and "hfl" in repr(f).lower())
    ]
    sys.meta_path.insert(0, _CheckoutFinder(str(Path(root).resolve())))


# --------------------------------------------------------------------------- counting


class MessageCounter:
    """Messages by header type: totals, per sender, per ``bucket_s`` of ``clock()``
    (wall time here; bench/scale.py --sim counts at the simulator's virtual time)."""

    def __init__(self, clock: Callable[[], float] = time.time, bucket_s: float = BUCKET_S) -> None:
        import msgpack

        self._unpack = msgpack.unpackb
        self._clock = clock
        self.bucket_s = bucket_s
        self.by_type: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # type -> [msgs, bytes]
        self.by_sender: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        # int(clock() / bucket_s) -> [membership msgs, all msgs, membership bytes, all bytes]
        self.buckets: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self._last_frame: Any = None  # a broadcast sends one encoded frame list N times
        self._last_type = ""

    def add(self, sender: str, frames) -> None:
        head = frames[0]
        if head is self._last_frame:
            kind = self._last_type
        else:
            try:
                kind = str(self._unpack(bytes(head), raw=False).get("type", "?"))
            except Exception:
                kind = "?"
            self._last_frame, self._last_type = head, kind
        nbytes = sum(memoryview(f).nbytes for f in frames)
        t = self.by_type[kind]
        t[0] += 1
        t[1] += nbytes
        self.by_sender[sender][kind] += 1
        member = kind not in NOT_MEMBERSHIP
        s = self.buckets[int(self._clock() / self.bucket_s)]
        s[0] += member
        s[1] += 1
        s[2] += nbytes if member else 0
        s[3] += nbytes

    def install(self, transport_cls) -> None:
        """Count what ``transport_cls`` (InMemoryTransport) delivers: every message leaves
        through its ``send_now``, which its ``send`` calls too."""
        if "send_now" not in vars(transport_cls):  # --hfl-src: a checkout from before it
            original_send = transport_cls.send

            async def counted_send(transport, address, frames, *args, **kwargs):
                ok = await original_send(transport, address, frames, *args, **kwargs)
                if ok is True:
                    self.add(transport.peer_id, frames)
                return ok

            transport_cls.send = counted_send
            return
        original = transport_cls.send_now

        def counted(transport, address, frames, *args, **kwargs):
            ok = original(transport, address, frames, *args, **kwargs)
            if ok is True:
                self.add(transport.peer_id, frames)
            return ok

        transport_cls.send_now = counted

    def totals(self) -> dict[str, int]:
        member = [v for k, v in self.by_type.items() if k not in NOT_MEMBERSHIP]
        return {
            "messages": sum(v[0] for v in self.by_type.values()),
            "bytes": sum(v[1] for v in self.by_type.values()),
            "membership_messages": sum(v[0] for v in member),
            "membership_bytes": sum(v[1] for v in member),
        }

    def within(self, start: float, end: float) -> list[float]:
        """[membership msgs, all msgs, membership bytes, all bytes] sent from ``start`` to
        ``end`` (clock time; a bucket cut by either end counts in proportion)."""
        sums = [0.0] * 4
        for b, counts in self.buckets.items():
            lo, hi = b * self.bucket_s, (b + 1) * self.bucket_s
            share = max(0.0, min(hi, end) - max(lo, start)) / self.bucket_s
            if share:
                for i in range(4):
                    sums[i] += counts[i] * share
        return sums

    def rates(
        self, n: int, in_span: list[float] | None, span: float | None, run_s: float, per_rounds
    ) -> dict[str, float | None]:
        """Per peer: messages per second over the rounds span (``in_span``: :meth:`within`
        it, ``span`` s long), then over the whole run (``run_s``); bytes per round."""
        tot = self.totals()
        return {
            "membership_msgs_per_peer_s": in_span[0] / n / span if in_span else None,
            "msgs_per_peer_s": in_span[1] / n / span if in_span else None,
            "membership_msgs_per_peer_s_whole_run": tot["membership_messages"] / n / run_s
            if run_s
            else None,
            "msgs_per_peer_s_whole_run": tot["messages"] / n / run_s if run_s else None,
            "bytes_per_peer_round": tot["bytes"] / n / per_rounds,
            "membership_bytes_per_peer_round": tot["membership_bytes"] / n / per_rounds,
        }

    def breakdown(self) -> dict[str, Any]:
        """The result's ``totals``, ``by_type`` and ``membership_msgs_per_sender``."""
        member_sent = sorted(
            sum(v for k, v in kinds.items() if k not in NOT_MEMBERSHIP)
            for kinds in self.by_sender.values()
        )
        return {
            "totals": self.totals(),
            "by_type": {
                k: {"messages": v[0], "bytes": v[1]} for k, v in sorted(self.by_type.items())
            },
            "membership_msgs_per_sender": {
                "min": member_sent[0] if member_sent else None,
                "median": statistics.median(member_sent) if member_sent else None,
                "max": member_sent[-1] if member_sent else None,
            },
        }


class FullCollections:
    """The cycle collector's full (generation 2) collections while the cohort runs: each
    stops the one event loop every peer shares for as long as it walks the heap."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._t = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._t)

    def summary(self) -> dict[str, Any]:
        return {"gc_full_collections": len(self.pauses), "gc_full_pause_s": sum(self.pauses),
                "gc_full_pause_max_s": max(self.pauses, default=0.0)}


def clip_outcomes(outcomes: dict[str, list[str]]) -> dict[str, list[str]]:
    """outcome -> peers, each list cut to its first five peers and a count."""
    return {k: (v if len(v) <= 5 else [*v[:5], f"... {len(v)} peers"]) for k, v in outcomes.items()}


# --------------------------------------------------------------------------- detection


class MembershipWatch:
    """The nodes' typed notes (``observe``, passed to run_peer as its observer): each
    membership change to suspect or dead, each round, each tick that overran its limit
    (``slow_tick``: the loop is overloaded; None for a checkout from before that note)."""

    def __init__(self, victim: str, slow_noted: bool = True) -> None:
        self.victim = victim
        self.t_kill: float | None = None
        self.dead_at: dict[str, float] = {}  # observer -> first "victim -> dead" after the kill
        self.false_suspect = 0  # a live peer (or the victim before its kill) -> suspect
        self.false_dead = 0
        self.slow_ticks: int | None = 0 if slow_noted else None
        self.last_round: dict[str, int] = {}  # peer -> last round it finished

    def observe(self, event: str, node, **fields: Any) -> None:
        if event == "slow_tick" and self.slow_ticks is not None:
            self.slow_ticks += 1
            return
        if event == "round":
            if fields["round"] > self.last_round.get(node.id, 0):
                self.last_round[node.id] = fields["round"]
            return
        if event != "member" or fields["new"] not in ("suspect", "dead"):
            return
        if fields["member"] == self.victim and self.t_kill is not None:
            if fields["new"] == "dead" and fields["old"] in ("alive", "suspect"):
                self.dead_at.setdefault(node.id, time.monotonic())
        elif fields["new"] == "dead":
            self.false_dead += 1
        else:
            self.false_suspect += 1


# --------------------------------------------------------------------------- the run


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """A peer's metrics lines so far (a torn last line is skipped)."""
    from hfl.peer.checkpoint import read_jsonl  # (not at import: use_hfl_from runs first)

    return read_jsonl(run_dir / "metrics.jsonl")


def max_round(recs: list[dict[str, Any]]) -> int:
    """The last round a peer's metrics lines reached (0: none)."""
    return max((int(r.get("round", 0)) for r in recs), default=0)


def last_round(run_dir: Path) -> int:
    return max_round(read_metrics(run_dir))


@dataclasses.dataclass
class RoundStats:
    """A cohort's metrics lines summed up (:func:`round_stats`)."""

    records: list[dict[str, Any]]  # the lines with a round_time_s (and a time, if asked)
    covered: int  # rounds those lines cover (a line's "span", else 1)
    mean_round_s: float | None
    final_acc: float | None  # mean of each peer's last global_acc (else test_acc)
    max_live: dict[str, int]  # peer -> the most live_peers it saw
    full_cohort: int  # peers whose live_peers reached N
    completed: int  # peers that reached the last round

    @property
    def start(self) -> float:
        """The first round's start (metrics ``time``; 0.0 without lines)."""
        return min((r["time"] for r in self.records), default=0.0)

    @property
    def span(self) -> float | None:
        """First round start to last round end (``time`` + ``round_time_s``)."""
        if not self.records:
            return None
        return max(r["time"] + r["round_time_s"] for r in self.records) - self.start


def round_stats(
    metrics: dict[str, list[dict[str, Any]]], rounds: int, n: int, timed: bool = True
) -> RoundStats:
    """What the peers' metrics lines (peer -> lines) say of a cohort of ``n`` and
    ``rounds`` rounds; ``timed``: only lines with a ``time`` count (for :attr:`span`)."""
    records = [
        r
        for recs in metrics.values()
        for r in recs
        if (not timed or isinstance(r.get("time"), (int, float)))
        and isinstance(r.get("round_time_s"), (int, float))
    ]
    covered = sum(int(r.get("span", 1)) for r in records)
    finals = []
    for recs in metrics.values():
        acc = recs[-1].get("global_acc", recs[-1].get("test_acc")) if recs else None
        if isinstance(acc, (int, float)):
            finals.append(acc)
    max_live = {
        pid: max((int(r.get("live_peers", 0)) for r in recs), default=0)
        for pid, recs in metrics.items()
    }
    return RoundStats(
        records=records,
        covered=covered,
        mean_round_s=sum(r["round_time_s"] for r in records) / covered if covered else None,
        final_acc=statistics.fmean(finals) if finals else None,
        max_live=max_live,
        full_cohort=sum(1 for v in max_live.values() if v >= n),
        completed=sum(1 for recs in metrics.values() if max_round(recs) >= rounds),
    )


def load_plans(spec: dict[str, Any], notes: list[str]):
    """The experiment's plans on the in-memory transport (as hfl-launch --in-process)."""
    from hfl.launch.experiment import ExperimentConfig, expand, load_experiment
    from hfl.launch.inprocess import in_memory
    from hfl.peer.configtools import ConfigError, build, load_yaml

    path = spec["experiment"]
    try:
        exp = load_experiment(path)
    except ConfigError as err:
        if getattr(err, "path", None) != "peers":
            raise
        # The experiment schema caps `peers` for hfl-launch; one process is not bound
        # by it. Build with a small cohort, then widen it (and check it again).
        data = load_yaml(path)
        n = int(data["peers"])
        small = {**data, "peers": 2, "peer_overrides": {}}
        exp = dataclasses.replace(
            build(ExperimentConfig, small), peers=n, peer_overrides=data.get("peer_overrides") or {}
        )
        exp.validate()
        notes.append(f"experiment refused peers={n} ({err.detail}); run in-process past that cap")
    # Ports only shape the tcp:// addresses that in_memory replaces: none is bound.
    plans = expand(exp, gpus=[], ports=list(range(20000, 20000 + exp.peers)))
    return exp, in_memory(plans)


async def run_cohort(
    plans,
    victim_index: int,
    kill_after: int,
    counter: MessageCounter,
    watch: MembershipWatch,
    state: dict[str, Any],
    checkpoint,
) -> list[Any]:
    """Run every plan's peer to its end; ``checkpoint(metrics)`` is called with each
    progress line (it writes the numbers so far, for a run that will not finish in time)."""
    from hfl.peer.runner import run_peer
    from hfl.peer.transport import MemoryHub

    hub = MemoryHub()
    victim = plans[victim_index]
    run_dirs = {p.id: Path(p.config.run_dir) for p in plans}
    rounds = plans[0].config.cohort.rounds
    ended: dict[str, float] = {}
    tasks: dict[str, asyncio.Task] = {}
    # As hfl-launch --in-process runs them: each peer freezes what it built, and runs
    # its short method calls on the shared loop (a checkout older than those options,
    # --hfl-src, runs without). This worker runs one cohort and exits: nothing to unfreeze.
    params = inspect.signature(run_peer).parameters
    freeze = {k: True for k in ("freeze_heap", "inline_short_calls") if k in params}
    for p in plans:
        task = asyncio.create_task(run_peer(p.config, hub=hub, observer=watch.observe, **freeze),
                                   name=p.id)
        task.add_done_callback(lambda t, pid=p.id: ended.setdefault(pid, time.monotonic()))
        tasks[p.id] = task
    state.update(started=time.monotonic(), kill_after=kill_after, ended=ended)

    async def kill_when_ready() -> None:
        # Who finished round kill_after: at once from the metrics lines' log records,
        # and from the metrics files every RESCAN_S (should that log line change).
        pending, rescan = set(run_dirs), time.monotonic() + RESCAN_S
        while pending:
            await asyncio.sleep(POLL_S)
            if tasks[victim.id].done():
                state["no_kill"] = (
                    f"{victim.id} ended before every peer finished round {kill_after}"
                )
                return
            pending = {
                pid
                for pid in pending
                if not tasks[pid].done() and watch.last_round.get(pid, 0) < kill_after
            }
            if pending and time.monotonic() > rescan:
                reached = await asyncio.to_thread(
                    lambda ids=tuple(pending): {
                        p for p in ids if last_round(run_dirs[p]) >= kill_after
                    }
                )
                pending -= reached
                rescan = time.monotonic() + RESCAN_S
        transport = hub.endpoints.get(victim.config.node.listen)
        if transport is None:
            state["no_kill"] = f"{victim.id}'s transport was not on the hub"
            return
        if hasattr(transport, "crash"):
            transport.crash()  # the process is gone: nothing reaches it or leaves it
        else:  # (--hfl-src: a checkout from before InMemoryTransport.crash)
            del hub.endpoints[victim.config.node.listen]

            async def lost(*args, **kwargs) -> bool:
                return False

            transport.send, transport.send_now = lost, lambda *args, **kwargs: False
            transport._inbox = None
        watch.t_kill = state["t_kill"] = time.monotonic()
        state["t_kill_unix"] = time.time()
        state["running_at_kill"] = sorted(
            pid for pid, t in tasks.items() if pid != victim.id and not t.done()
        )
        tasks[victim.id].cancel()
        await asyncio.sleep(1.0)
        state["victim_tasks_left"] = sorted(
            t.get_name()
            for t in asyncio.all_tasks()
            if t.get_name().startswith(f"{victim.id}:") and not t.done()
        )

    async def progress() -> None:
        t0 = time.monotonic()
        while True:
            await asyncio.sleep(PROGRESS_S)
            # files are read off the loop: N peers' metrics must not stall their heartbeats
            metrics = await asyncio.to_thread(
                lambda: {p: read_metrics(d) for p, d in run_dirs.items()}
            )
            done = [max_round(recs) for recs in metrics.values()]
            tot = counter.totals()
            print(
                f"[{time.monotonic() - t0:7.1f}s] rounds min {min(done)} max {max(done)} of "
                f"{rounds}; {sum(t.done() for t in tasks.values())} peers ended; "
                f"{tot['messages']} msgs ({tot['membership_messages']} membership); "
                f"{watch.slow_ticks} slow ticks",
                flush=True,
            )
            checkpoint(metrics)

    helpers = [
        asyncio.create_task(kill_when_ready(), name="scale:kill"),
        asyncio.create_task(progress(), name="scale:progress"),
    ]
    try:
        return await asyncio.gather(*tasks.values(), return_exceptions=True)
    finally:
        for h in helpers:
            h.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)


def summarize(
    plans,
    results: list[Any] | None,
    victim_index: int,
    counter: MessageCounter,
    watch: MembershipWatch,
    state: dict[str, Any],
    metrics: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The run's numbers (``results`` None: the run is still going, numbers so far)."""
    n = len(plans)
    victim = plans[victim_index].id
    rounds = plans[0].config.cohort.rounds
    if metrics is None:
        metrics = {p.id: read_metrics(Path(p.config.run_dir)) for p in plans}
    stats = round_stats(metrics, rounds, n)
    span = stats.span
    # bytes per round: over the configured rounds, or (still running) the rounds done so far
    per_rounds = rounds if results is not None else max(1.0, stats.covered / n)

    # Detection, over the observers still running when the victim died.
    observers = state.get("running_at_kill", [])
    ended = state.get("ended", {})
    detected = {o: watch.dead_at[o] - state["t_kill"] for o in observers if o in watch.dead_at}
    late = [o for o in observers if o not in detected]

    run_s = (max(ended.values()) if results is not None and ended else time.monotonic()) - state[
        "started"
    ]
    first = stats.start
    in_span = counter.within(first, first + span) if span else None
    outcomes: dict[str, list[str]] = defaultdict(list)
    for p, r in zip(plans, results or [], strict=False):
        if p.id == victim and isinstance(r, asyncio.CancelledError):
            outcomes["killed (victim)"].append(p.id)
        elif isinstance(r, BaseException):
            outcomes[f"{type(r).__name__}: {str(r)[:300]}"].append(p.id)
        else:
            outcomes["ok"].append(p.id)
    return {
        "n": n,
        "rounds": rounds,
        "victim": victim,
        "run_s": run_s,
        "rounds_span_s": span,
        "mean_round_s": stats.mean_round_s,
        # rates over the rounds span (whole seconds inside it), then over the whole run
        **counter.rates(n, in_span, span, run_s, per_rounds),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final_acc": stats.final_acc,
        "completed_all_rounds": stats.completed,
        "full_cohort_peers": stats.full_cohort,
        "max_live_peers_min": min(stats.max_live.values(), default=0),
        "t_kill_unix": state.get("t_kill_unix"),
        "no_kill": None
        if "t_kill" in state
        else (
            state.get("no_kill")
            or f"the cohort ended before every peer's round {state['kill_after']} was seen"
        ),
        "observers": len(observers),
        "detected": len(detected),
        "never_detected": len(late),
        "never_detected_ids": late[:20],
        "detect_median_s": statistics.median(detected.values()) if detected else None,
        "detect_max_s": max(detected.values()) if detected else None,
        "detect_s": dict(sorted(detected.items())),
        "observers_ended_before_detect": sum(1 for o in late if o in ended),
        "false_suspicions": watch.false_suspect,
        "false_deaths": watch.false_dead,
        "slow_ticks": watch.slow_ticks,
        "victim_tasks_left": state.get("victim_tasks_left"),
        **counter.breakdown(),
        "outcomes": clip_outcomes(outcomes),
    }


def main(argv: list[str]) -> int:
    t0 = time.monotonic()
    spec = json.loads(Path(argv[1]).read_text())
    if spec.get("hfl_src"):
        use_hfl_from(spec["hfl_src"])
    notes: list[str] = []
    import hfl.peer
    from hfl.peer.transport import InMemoryTransport

    exp, plans = load_plans(spec, notes)
    run_dir = exp.resolved_run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    victim_index = len(plans) - 1
    counter = MessageCounter()
    counter.install(InMemoryTransport)
    import hfl.peer.status

    watch = MembershipWatch(plans[victim_index].id,
                            "slow_tick" in getattr(hfl.peer.status, "TYPED_EVENTS", ()))
    root = logging.getLogger("hfl")
    to_file = logging.FileHandler(run_dir / "peers.log")  # as hfl-launch --in-process
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(to_file)
    root.setLevel(logging.INFO)
    setup_s = time.monotonic() - t0
    print(
        f"{len(plans)} peers in one process, hfl from {Path(hfl.peer.__file__).parent.parent}; "
        f"set up in {setup_s:.1f}s; victim {plans[victim_index].id} after round "
        f"{spec['kill_after']}",
        flush=True,
    )
    state: dict[str, Any] = {}
    collections = FullCollections()
    gc.callbacks.append(collections)

    def write(results: list[Any] | None, metrics=None) -> dict[str, Any]:
        out = summarize(plans, results, victim_index, counter, watch, state, metrics)
        out.update(
            **collections.summary(),
            setup_s=setup_s,
            wall_s=time.monotonic() - t0,
            notes=notes,
            partial=results is None,
            hfl_from=str(Path(hfl.peer.__file__).parent.parent),
        )
        tmp = Path(spec["out"] + ".tmp")
        tmp.write_text(json.dumps(out, indent=2, default=str) + "\n")
        tmp.replace(spec["out"])  # whole or not at all, should the timeout strike now
        return out

    try:
        results = asyncio.run(
            run_cohort(
                plans,
                victim_index,
                int(spec["kill_after"]),
                counter,
                watch,
                state,
                lambda metrics: write(None, metrics),
            )
        )
    finally:
        root.removeHandler(to_file)
        to_file.close()
    out = write(results)
    print(
        f"done in {out['wall_s']:.1f}s: {out['completed_all_rounds']}/{len(plans)} peers did "
        f"every round; detection {out['detected']}/{out['observers']}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
