"""One in-process run of bench/scale.py: N peers in this process, one event loop.

    python bench/_scale_worker.py SPEC.json

Not a benchmark by itself: ``bench/scale.py`` writes SPEC.json (the experiment file,
``kill_after``, where to write the result, optionally ``hfl_src``) and starts this
script with a timeout. What it does mirrors ``hfl-launch EXP --in-process``
(:mod:`hfl.launch.inprocess`): it expands the experiment with
:func:`hfl.launch.experiment.expand`, moves the plans to the in-memory transport with
:func:`hfl.launch.inprocess.in_memory`, logs every peer's lines to ``<run dir>/peers.log``
and runs :func:`hfl.peer.runner.run_peer` for each plan on one ``MemoryHub``. On top:

* **A kill.** Once every peer has finished round ``kill_after`` (its ``round`` note,
  and from ``metrics.jsonl`` every second),
  the peer with the highest index dies as a SIGKILLed process would: its transport
  crashes (``InMemoryTransport.crash``: its sends fail, no goodbye gets out, its address
  leaves the hub and sends to it fail), then its ``run_peer`` task is cancelled.
* **What the peers' notes say** (:func:`from_events`, which bench/scale.py uses for
  its forked and sim modes too): detection of the kill from the survivors' ``member``
  notes in events.jsonl, and the messages sent by type from their ``sent`` notes.
  Nothing of the runtime is patched.

``hfl_src`` (bench/scale.py --hfl-src DIR): :func:`use_hfl_from` makes ``import hfl``
load the packages of checkout DIR instead of the editable install. bench/scale.py also
calls it from a ``sitecustomize.py`` it writes, so that the processes ``hfl-launch``
starts import the same code.

bench/scale.py imports this module's counting and metrics helpers
(:func:`from_events`, :func:`round_stats`, ...) for its forked and sim modes; it
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
import math
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

#: Header types that are not membership traffic (everything else is).
NOT_MEMBERSHIP = frozenset(
    {"knowledge", "aggregate", "ack", "commit", "seed_request", "seed_chunk", "error"}
)
POLL_S = 0.05  # how often the kill task checks who finished round kill_after
RESCAN_S = 1.0  # how often it also reads the metrics files (if the log lines change)
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


# --------------------------------------------------------------------------- the peers' notes


def peer_events(run_dir: Path) -> list[dict[str, Any]]:
    """A peer's typed notes (its events.jsonl; a torn last line is skipped)."""
    from hfl.peer.checkpoint import read_jsonl  # (not at import: use_hfl_from runs first)

    return read_jsonl(run_dir / "events.jsonl")


def from_events(
    run_dirs: dict[str, Path],
    victim: str,
    t_kill: float | None,
    observers: list[str],
    rounds: float,
    run_s: float | None,
    until: float = math.inf,
    clock: str = "t",
) -> dict[str, Any]:
    """What the peers' typed notes (docs/runtime.md, Typed events) say of a run, in every
    mode alike; ``clock``: the notes' time field (``vt``: the simulator's virtual time).

    * **Detection**: each observer's first ``member`` note that the victim went dead
      (from alive or suspect) from ``t_kill`` to ``until`` (the victim's restart); other
      notes of -> suspect / -> dead are false (a live peer's, or the victim's before
      its kill). ``slow_tick`` notes counted.
    * **Traffic**: the ``sent`` notes (at each round's end, what that life has sent so
      far by type: [messages, bytes]). Totals: each life's last note. Rates "in the
      rounds span": each life's traffic from its first note to its last, over the time
      from the first note to the last (round 1's end to the last round's end: the
      join is left out); "whole run": the totals over ``run_s``. *Membership*: every
      type but :data:`NOT_MEMBERSHIP`. What a life sends after its last round's end
      (a goodbye; a killed peer's last moments) is not in any note."""
    dead_at: dict[str, float] = {}
    false_suspect = false_dead = slow = 0
    lives: dict[tuple[str, Any], list[tuple[float, dict]]] = defaultdict(list)
    for peer, d in run_dirs.items():
        for e in peer_events(d):
            t, kind = e.get(clock), e.get("kind")
            if not isinstance(t, (int, float)):
                continue
            if kind == "slow_tick":
                slow += 1
            elif kind == "sent" and isinstance(e.get("types"), dict):
                lives[(peer, e.get("incarnation"))].append((t, e["types"]))
            elif kind == "member" and e.get("new") in ("suspect", "dead"):
                if e.get("member") == victim and t_kill is not None and t >= t_kill:
                    if (e["new"] == "dead" and e.get("old") in ("alive", "suspect")
                            and t < until and peer != victim):
                        dead_at[peer] = min(dead_at.get(peer, math.inf), t - t_kill)
                elif e["new"] == "dead":
                    false_dead += 1
                else:
                    false_suspect += 1
    seen = [dead_at[o] for o in observers if o in dead_at]
    late = [o for o in observers if o not in dead_at]
    out: dict[str, Any] = {
        "observers": len(observers),
        "detected": len(seen),
        "never_detected": len(late),
        "never_detected_ids": late[:20],
        "detect_median_s": statistics.median(seen) if seen else None,
        "detect_max_s": max(seen) if seen else None,
        "detect_s": dict(sorted(dead_at.items())),
        "false_suspicions": false_suspect,
        "false_deaths": false_dead,
        "slow_ticks": slow,
    }
    return {**out, **traffic(lives, len(run_dirs), rounds, run_s)}


def traffic(lives: dict[tuple[str, Any], list[tuple[float, dict]]], n: int, rounds: float,
            run_s: float | None) -> dict[str, Any]:
    """:func:`from_events`' traffic part: ``lives`` (peer, incarnation) -> its ``sent``
    notes, (time, {type: [messages, bytes]})."""
    if not lives:  # (a checkout from before the sent notes, --hfl-src)
        return {"totals": None, "by_type": {}, "membership_msgs_per_sender": None}

    def sums(types: dict, minus: dict | None = None) -> list[float]:
        """[membership msgs, all msgs, membership bytes, all bytes] of a note's types."""
        s = [0.0] * 4
        for kind, (msgs, nbytes) in types.items():
            msgs -= (minus or {}).get(kind, (0, 0))[0]
            nbytes -= (minus or {}).get(kind, (0, 0))[1]
            member = kind not in NOT_MEMBERSHIP
            s[0] += msgs if member else 0
            s[1] += msgs
            s[2] += nbytes if member else 0
            s[3] += nbytes
        return s

    by_type: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    per_sender: dict[str, float] = defaultdict(float)
    total, in_span = [0.0] * 4, [0.0] * 4
    for (peer, _), notes in lives.items():
        notes.sort(key=lambda tn: tn[0])
        last = notes[-1][1]
        for kind, (msgs, nbytes) in last.items():
            by_type[kind][0] += msgs
            by_type[kind][1] += nbytes
        life = sums(last)
        per_sender[peer] += life[0]
        total = [a + b for a, b in zip(total, life, strict=True)]
        in_span = [a + b for a, b in zip(in_span, sums(last, notes[0][1]), strict=True)]
    times = [t for notes in lives.values() for t, _ in notes]
    span = max(times) - min(times)
    member_sent = sorted(per_sender.values())
    return {
        "membership_msgs_per_peer_s": in_span[0] / n / span if span else None,
        "msgs_per_peer_s": in_span[1] / n / span if span else None,
        "membership_msgs_per_peer_s_whole_run": total[0] / n / run_s if run_s else None,
        "msgs_per_peer_s_whole_run": total[1] / n / run_s if run_s else None,
        "bytes_per_peer_round": total[3] / n / rounds,
        "membership_bytes_per_peer_round": total[2] / n / rounds,
        "totals": {"messages": total[1], "bytes": total[3], "membership_messages": total[0],
                   "membership_bytes": total[2]},
        "by_type": {k: {"messages": v[0], "bytes": v[1]} for k, v in sorted(by_type.items())},
        "membership_msgs_per_sender": {"min": member_sent[0],
                                       "median": statistics.median(member_sent),
                                       "max": member_sent[-1]},
    }


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
    state: dict[str, Any],
    checkpoint,
) -> list[Any]:
    """Run every plan's peer to its end; ``checkpoint(metrics)`` is called with each
    progress line (it writes the numbers so far, for a run that will not finish in time)."""
    from hfl.peer.runner import run_peer
    from hfl.peer.transport import MemoryHub

    hub = MemoryHub()
    victim = plans[victim_index]
    last_round: dict[str, int] = {}  # peer -> the last round it finished (its round notes)

    def observe(event: str, node, **fields: Any) -> None:
        if event == "round" and fields["round"] > last_round.get(node.id, 0):
            last_round[node.id] = fields["round"]

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
        task = asyncio.create_task(run_peer(p.config, hub=hub, observer=observe, **freeze),
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
                if not tasks[pid].done() and last_round.get(pid, 0) < kill_after
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
        transport.crash()  # the process is gone: nothing reaches it or leaves it
        state["t_kill"] = time.monotonic()
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
            print(
                f"[{time.monotonic() - t0:7.1f}s] rounds min {min(done)} max {max(done)} of "
                f"{rounds}; {sum(t.done() for t in tasks.values())} peers ended",
                flush=True,
            )
            await asyncio.to_thread(checkpoint, metrics)  # (it reads every events.jsonl)

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

    ended = state.get("ended", {})
    run_s = (max(ended.values()) if results is not None and ended else time.monotonic()) - state[
        "started"
    ]
    # Detection (over the observers still running when the victim died) and traffic.
    notes = from_events({p.id: Path(p.config.run_dir) for p in plans}, victim,
                        state.get("t_kill_unix"), state.get("running_at_kill", []),
                        per_rounds, run_s)
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
        **notes,
        "observers_ended_before_detect": sum(
            1 for o in state.get("running_at_kill", []) if o in ended and o not in notes["detect_s"]),
        "victim_tasks_left": state.get("victim_tasks_left"),
        "outcomes": clip_outcomes(outcomes),
    }


def main(argv: list[str]) -> int:
    t0 = time.monotonic()
    spec = json.loads(Path(argv[1]).read_text())
    if spec.get("hfl_src"):
        use_hfl_from(spec["hfl_src"])
    notes: list[str] = []
    import hfl.peer

    exp, plans = load_plans(spec, notes)
    run_dir = exp.resolved_run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    victim_index = len(plans) - 1
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
        out = summarize(plans, results, victim_index, state, metrics)
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
