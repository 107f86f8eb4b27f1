"""Wire a :class:`~hfl.peer.node.Node` from a config: the body of ``hfl-peer``.

Also used in-process by tests, with an in-memory or fault-injecting transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hfl.peer.checkpoint import (
    CHECKPOINT_NAME,
    append_line,
    file_error,
    load_checkpoint,
    make_run_dir,
    metrics_incarnation,
    next_incarnation,
    read_jsonl,
    run_dir_lock,
    save_checkpoint,
    set_aside_metrics,
    trim_metrics,
    write_atomic,
)
from hfl.peer.clock import MonotonicClock
from hfl.peer.config import PeerConfig, byzantine_refusal
from hfl.peer.configtools import ConfigError, config_differences
from hfl.peer.core import clip
from hfl.peer.node import Node, NodeResult
from hfl.peer.security import signing_of
from hfl.peer.seeds import SeedStore
from hfl.peer.status import (
    EVENTS_NAME,
    TYPED_EVENTS,
    CohortGone,
    CohortTooSmall,
    EventLog,
    attach,
    check_listen,
    class_names_term,
    cohort_shortfall,
    cpu_by_thread,
    data_split_fingerprint,
    detach,
    max_rss_mb,
    watch_join,
)
from hfl.peer.transport import (
    FaultPlan,
    FaultyTransport,
    MemoryHub,
    Transport,
    TransportOptions,
    make_transport,
)
from hfl.protocol import DEFAULT_MAX_MESSAGE_MIB, limits_for

log = logging.getLogger("hfl.peer")

METRICS_NAME = "metrics.jsonl"
#: The last round this peer entered with an elected aggregator (see Node.on_enter_round).
ENTERED_NAME = "entered_round"
SUMMARY_NAME = "summary.json"

_SHOWN = ("train_loss", "test_acc", "global_acc")


class MetricsWriter:
    """One JSON line per round, flushed and fsynced at once (a launcher follows it)."""

    def __init__(self, path: Path, rounds: int):
        self.path = path
        self.rounds = rounds

    def __call__(self, record: dict[str, Any]) -> None:
        append_line(self.path, json.dumps(record, default=float) + "\n")
        shown = " ".join(f"{k}={record[k]:.4f}" for k in _SHOWN if k in record)
        log.info("%s round %d/%d %s round_time=%.2fs sent=%dB", record["peer"], record["round"],
                 self.rounds, shown, record["round_time_s"], record["bytes_sent"])


def data_description(data) -> str:
    """``digits, dirichlet α=0.5 over 4`` (a peer's ``data`` section, for tables): what
    must be equal for two runs' accuracies to compare."""
    split = data.partition
    if data.partition == "dirichlet":
        split += f" α={data.alpha:g}"
    if data.partition != "none":
        split += f" over {data.num_partitions}"
    return f"{data.dataset}, {split}"


def _model_changed(cfg: PeerConfig, run_dir: Path, what: str) -> ConfigError:
    return ConfigError("model", f"the checkpoint in {run_dir} holds another model than this "
                                f"config builds ({what}); a model cannot change on resume: "
                                "node.resume: false (hfl-launch --fresh) starts over, or use "
                                "another node.run_dir")


def _check_same_model(cfg: PeerConfig, run_dir: Path, saved: dict[str, Any] | None,
                      spec: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint of another model (architecture, sizes, classes). A
    description written before it named a method's head (``options.head``) is compared
    without it."""
    if isinstance(saved, dict) and "head" not in (saved.get("options") or {}) \
            and "head" in spec.get("options", {}):
        spec = {**spec, "options": {k: v for k, v in spec["options"].items() if k != "head"}}
    if saved is not None and saved != spec:
        raise _model_changed(cfg, run_dir, "; ".join(config_differences(saved, spec)) or "it differs")


def finished_short(cfg: PeerConfig, run_dir: Path) -> None:
    """A finished run started again ends as it ended: a run that fell short of its cohort
    (trained alone: exit 3) raises :class:`CohortTooSmall` again. Before, the second
    start said "nothing to run" and exited 0, so a retry-on-failure wrapper turned a
    failed run into a success (a review). A summary that is missing (the peer stopped
    between its last checkpoint and its summary) is said."""
    try:
        summary = json.loads((run_dir / SUMMARY_NAME).read_bytes())
    except FileNotFoundError:
        log.warning("%s: %s has no %s (the peer stopped after its last round's checkpoint, "
                    "before writing it): its rounds are in %s", cfg.node.id, run_dir,
                    SUMMARY_NAME, METRICS_NAME)
        return
    except (OSError, ValueError):
        log.warning("%s: %s in %s is damaged: its rounds are in %s", cfg.node.id, SUMMARY_NAME,
                    run_dir, METRICS_NAME)
        return
    shortfall = summary.get("cohort_shortfall") if isinstance(summary, dict) else None
    if shortfall and not cfg.node.allow_solo:
        log.error("%s: %s", cfg.node.id, shortfall)
        raise CohortTooSmall(str(shortfall))


def checkpoint_owner(cfg: PeerConfig) -> dict[str, Any]:
    """Whose rounds a checkpoint holds: this peer of this cohort's run, on this data."""
    return {"peer": cfg.node.id, "cohort": cfg.cohort.name, "run": cfg.cohort.run,
            "data": checkpoint_data(cfg), "algorithm": cfg.cohort.algorithm}


def checkpoint_data(cfg: PeerConfig) -> dict[str, Any]:
    """The peer's ``data`` section as its checkpoint records it: all but where the
    files are (``path``, ``options.root``, the same of ``public_set``: a dataset moved
    to another folder, a SLURM job's new scratch path, is the same data)."""
    import dataclasses

    data = json.loads(json.dumps(dataclasses.asdict(cfg.data), default=str))
    for section in (data, data.get("public_set")):
        if isinstance(section, dict):
            section.pop("path", None)
            if isinstance(section.get("options"), dict):
                section["options"].pop("root", None)
    return data


def data_changes(saved: dict[str, Any], mine: dict[str, Any]) -> list[str]:
    """``data.field: old -> new`` for each field of a checkpoint's data record
    (:func:`checkpoint_data`) that ``mine`` changes; fields ``saved`` lacks (added by a
    later hfl) are no change."""
    return [f"data.{c}" for c in config_differences(saved, _as_recorded(mine, saved))]


def resume_changes(old: PeerConfig, new: PeerConfig) -> list[str]:
    """What a peer's checkpoint of ``old`` cannot be resumed under ``new`` with: its
    method, its data (hfl-launch --resume asks before it rewrites anything)."""
    out = [] if old.cohort.algorithm == new.cohort.algorithm else [
        f"cohort.algorithm: {old.cohort.algorithm!r} -> {new.cohort.algorithm!r}"]
    return out + data_changes(checkpoint_data(old), checkpoint_data(new))


def _as_recorded(mine: Any, saved: Any) -> Any:
    """``mine`` cut to the keys ``saved`` records (nested): a field a later hfl added
    (at its default) is not a change of the data a checkpoint was trained on."""
    if not isinstance(mine, dict) or not isinstance(saved, dict):
        return mine
    return {k: _as_recorded(v, saved[k]) for k, v in mine.items() if k in saved}


def _check_owner(cfg: PeerConfig, run_dir: Path, saved: Any) -> None:
    """Refuse to resume another peer's checkpoint, or another cohort's or run's: it was
    resumed silently (another run's model went on for the new run's last rounds, and
    pulled a fresh cohort's round forward; another peer's made this one a stranger to
    its own members). A checkpoint from before the record is taken as it is."""
    if not isinstance(saved, dict):
        return
    mine = checkpoint_owner(cfg)
    differs = [k for k in ("peer", "cohort", "run") if saved.get(k) != mine[k]]
    if differs:
        field = {"peer": "node.id", "cohort": "cohort.name", "run": "cohort.run"}[differs[0]]
        raise ConfigError(field, f"the checkpoint in {run_dir} holds the rounds of "
                          f"{'; '.join(f'{k} {saved.get(k)!r}' for k in differs)}, not of this "
                          f"config's {'; '.join(f'{k} {mine[k]!r}' for k in differs)}: a new "
                          "run starts with node.resume: false (hfl-launch --fresh) or in "
                          "another node.run_dir")
    if "algorithm" in saved and saved["algorithm"] != mine["algorithm"]:
        # (a fedavg checkpoint resumed as fedh2l raised KeyError from its state, a review)
        raise ConfigError("cohort.algorithm", f"the checkpoint in {run_dir} holds the rounds "
                          f"of {saved['algorithm']!r}, not of this config's "
                          f"{mine['algorithm']!r}: a method cannot change on resume: "
                          "node.resume: false (hfl-launch --fresh) starts over, or use "
                          "another node.run_dir")
    # (after whose rounds they are: another peer's checkpoint differs in its data's
    # partition_index too, and named so it hid a run_dir shared by mistake, a review)
    if "data" in saved and (changed := data_changes(saved["data"], mine["data"])):
        # (a review: resumed on another partition, with label noise, and its rows went
        # on in the same metrics.jsonl as the old data's)
        raise ConfigError("data", f"the checkpoint in {run_dir} was trained on other data "
                          f"({'; '.join(changed[:4])}"
                          f"{'; ...' if len(changed) > 4 else ''}): a peer's data cannot "
                          "change on resume: node.resume: false (hfl-launch --fresh) starts "
                          "over, or use another node.run_dir")


def _save(run_dir: Path, r: int, node: Node, model: dict[str, Any] | None,
          saved_at: float | None = None, owner: dict[str, Any] | None = None) -> None:
    import torch

    save_checkpoint(run_dir, {
        "round": r,
        "owner": owner,  # whose rounds these are (checkpoint_owner): refused for another
        # when (the run's wall clock, or the simulator's): a summary a member wrote after
        # it means the cohort finished without this peer (finished_siblings)
        "saved_at": time.time() if saved_at is None else saved_at,
        "model": model,  # how to rebuild the model (hfl.peer.factory.model_spec), for hfl-export
        "incarnation": node.incarnation,
        "algorithm": node.alg.state_dict(),
        "torch_rng": torch.get_rng_state(),
        # The rotation's members, departed ones included (the order must not change
        # when a member leaves or this peer restarts); never gossip-only suggestions.
        "members": [[m.peer_id, m.address] for m in node.membership.members.values()
                    if m.vouched],
    })


class RoundRecorder:
    """What a finished round leaves on disk: its metrics line, *then* its checkpoint.

    The node calls :meth:`checkpoint` (in a thread) and :meth:`round`; whichever
    comes first writes the metrics line, so a kill right after the checkpoint's
    rename never loses the round's row. (A kill between the two leaves a row for
    a round the checkpoint lacks: :func:`~hfl.peer.checkpoint.trim_metrics`
    drops it on resume, so no round is listed twice.)

    A resumed peer of a sharing method holds its first round (:meth:`hold`, awaited
    on the event loop before the checkpoint; greeting and answering go on) until it has heard
    from as many peers as a result needs. If ``timing.join_timeout_s`` since
    its start passes first (nobody answered, or only a minority such as the
    other half of a pair restarted together), it has outlived its cohort, or
    the cohort is down: it raises :class:`~hfl.peer.status.CohortGone`
    without recording the round, instead of running the remaining rounds
    without a result (unless ``node.allow_solo``)."""

    def __init__(self, run_dir: Path, cfg: PeerConfig, mode: str, resumed_after: int | None,
                 checkpoints: bool, remembered: int = 0, model: dict[str, Any] | None = None,
                 clock=None, wall: Callable[[], float] = time.time):
        self.run_dir = run_dir
        self.model = model
        self.owner = checkpoint_owner(cfg)
        self.write_metrics = MetricsWriter(run_dir / METRICS_NAME, cfg.cohort.rounds)
        self.checkpoints = checkpoints
        self.watch_alone = (resumed_after is not None and mode != "local"
                            and not cfg.node.allow_solo)
        self.resumed_after = resumed_after
        self.timing = cfg.timing
        # Peers a result needs (node.quorum; by default a majority of the cohort the
        # checkpoint remembers, as the node counts it), at least one other.
        self.need = max(2, cfg.node.quorum if cfg.node.quorum is not None
                        else (remembered + 1) // 2 + 1)
        self.written: set[int] = set()
        self.diverged = False  # a round's train_loss was NaN or infinite (said once)
        self.node: Node | None = None  # set once built: the membership tells who answered
        self.clock = clock or MonotonicClock()
        self.wall = wall  # what "saved_at" in a checkpoint reads
        self.started = self.clock.now()
        self.stopped = False  # the peer is stopping: a held round lets go
        # Held while a round's row and checkpoint are written (worker thread), with
        # ``stopped`` checked inside it: a write is whole or not begun when the peer exits.
        self._writing = threading.Lock()

    def _record(self, record: dict[str, Any]) -> None:
        r = int(record["round"])
        if r in self.written:
            return
        if self.watch_alone and self.node is not None:
            self._check_cohort(r)
        loss = record.get("train_loss")
        if isinstance(loss, float) and not math.isfinite(loss) and not self.diverged:
            self.diverged = True  # said once: every later round builds on it
            log.warning("%s: round %d: train_loss is %s: training diverged (a learning rate "
                        "too high for this model, or a poisoned result absorbed); the rounds "
                        "from here on train a broken model", record.get("peer"), r, loss)
        self.write_metrics(record)
        self.written.add(r)

    def _heard(self) -> int:
        """Other members heard from in this life (not only remembered) and not dead: alive,
        suspect, or gone with a goodbye (their own word; a member that finished the last
        round while this resumed peer ran it was in the cohort with it. Not counting them
        held such a peer's last round for join_timeout_s and then stopped it with
        "no peer of the cohort answered", after all five had: hfl-sim, mdhfl with
        fanout 2, seed 10)."""
        return sum(1 for m in self.node.membership.members.values()
                   if m.status in ("alive", "suspect", "left") and m.confirmed)

    def _check_cohort(self, r: int) -> bool:
        """True once a quorum of the cohort was heard from in this life (and stop
        watching); raise :class:`CohortGone` when ``timing.join_timeout_s`` since the
        start passed without one; False while there is time left."""
        heard = self._heard()
        if 1 + heard >= self.need:
            self.watch_alone = False  # met the cohort: from here on, the usual rules
            return True
        if self.clock.now() < self.started + self.timing.join_timeout_s:
            return False
        who = ("no peer of the cohort answered" if heard == 0 else
               f"only {heard} other peer(s) of the cohort answered, fewer than the "
               f"{self.need} a result needs (node.quorum)")
        why, fix = "the cohort has finished or is down", "restart the cohort"
        if self.node.refusals():  # (it said "the cohort has finished or is down")
            why = ("hellos were refused (the reasons are logged above: a cohort.rounds or "
                   "another term that differs from the cohort's)")
            fix = "make the configs agree"
        raise CohortGone(
            f"resumed after round {self.resumed_after} but {who} within "
            f"timing.join_timeout_s={self.timing.join_timeout_s:g}s: {why}, so this peer "
            "stops instead of running the remaining rounds without it; nothing was recorded "
            f"for round {r} ({fix}, or allow it with node.allow_solo: true)")

    async def hold(self, r: int, node: Node) -> None:
        """Awaited by the node before round ``r``'s checkpoint: while watching, hold the
        round until a quorum was heard from (see :meth:`_check_cohort`)."""
        while self.watch_alone and not self.stopped and not self._check_cohort(r):
            await asyncio.sleep(self.timing.heartbeat_interval_s)

    def checkpoint(self, r: int, node: Node) -> None:
        """Called in the node's worker thread, after :meth:`hold`: the round's row, then
        its checkpoint, unless the peer is stopping (see :meth:`stop`)."""
        with self._writing:
            if not self.stopped:
                self._checkpoint(r, node)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """The peer is stopping (done, or a signal): a round's row and checkpoint being
        written in the worker thread are finished first (the round is kept), waiting at
        most ``timeout_s``, whatever else cancels the peer meanwhile; one not yet begun
        is not begun. Before, a second SIGTERM (scancel signals the peer and its SLURM
        task wrapper, which passes it on) cut the wait, the peer exited between the
        row and the checkpoint, and the resume dropped the row (16 of 20 stops with a
        second cancel during a 50 ms write): the likely cause of a peer that skipped a
        round in a CI run of test_slurm. (A write cut anyway, past the timeout or by
        SIGKILL, leaves the checkpoint before it, which is atomic; the resume drops the
        row: trim_metrics.)"""
        self.stopped = True  # a write not yet in the lock sees it and is not begun
        if not self._writing.locked():
            return
        waiting = asyncio.ensure_future(asyncio.to_thread(self._finished, timeout_s))
        cancelled = False
        while not waiting.done():  # a second signal does not cut the write either
            try:
                await asyncio.shield(waiting)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError

    def _finished(self, timeout_s: float) -> None:
        """Wait (in a thread) until no write holds the lock, at most ``timeout_s``."""
        if self._writing.acquire(timeout=timeout_s):
            self._writing.release()

    def _checkpoint(self, r: int, node: Node) -> None:
        record = next((m for m in reversed(node.ledger.lines) if m.get("round") == r), None)
        if record is not None:
            self._record(record)
        if self.checkpoints:
            _save(self.run_dir, r, node, self.model, self.wall(), self.owner)

    def round(self, record: dict[str, Any]) -> None:
        self._record(record)


def finished_siblings(run_dir: Path, cfg: PeerConfig, members: list[tuple[str, str]],
                      since: float) -> list[str]:
    """Members remembered in this peer's checkpoint whose run directories (beside
    this one, as ``hfl-launch`` lays them out) hold a summary of the cohort's last
    round, written after this peer's checkpoint: the cohort finished without it.

    "After" compares the times the files record (``finished_at``, the checkpoint's
    ``saved_at``: the simulator's virtual clock there), not file times: those are
    coarse (a kernel tick) and read the wall clock, so a simulated run would depend
    on the machine's speed. Files from before these fields fall back to mtimes."""
    done = []
    for peer_id, _ in members:
        if peer_id == cfg.node.id or "/" in peer_id or peer_id in (".", ".."):
            continue
        path = run_dir.parent / peer_id / SUMMARY_NAME
        try:
            summary = json.loads(path.read_text())
            finished = (summary.get("finished_at") if isinstance(summary, dict) else None)
            if not isinstance(finished, (int, float)):
                finished = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if finished < since:
            continue
        if (isinstance(summary, dict) and summary.get("peer") == peer_id
                and isinstance(summary.get("last_round"), int)
                and summary["last_round"] >= cfg.cohort.rounds):
            done.append(peer_id)
    return sorted(done)


@contextlib.contextmanager
def thawed_after():
    """Around a launcher's run of peers started with ``freeze_heap`` (:func:`run_peer`):
    when it ends, what they froze is handed back to the collector, unless the process
    had frozen objects before (not the launcher's to thaw)."""
    frozen_before = gc.get_freeze_count()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


async def run_peer(
    cfg: PeerConfig,
    hub: MemoryHub | None = None,
    fault_plan: FaultPlan | None = None,
    clock=None,
    transport: Callable[[PeerConfig], Transport] | None = None,
    run_blocking: Callable[..., Any] | None = None,
    observer: Callable[..., None] | None = None,
    signing: tuple[Callable[[bytes], bytes], dict[str, bytes]] | None = None,
    *,
    freeze_heap: bool = False,
    inline_short_calls: bool = False,
) -> NodeResult:
    """Build this peer from ``cfg`` and run it to the cohort's last round.

    Raises :class:`~hfl.peer.status.CohortTooSmall` (after writing the summary) when
    a sharing method ended below ``max(2, node.min_peers)`` peers, or stopped before
    its first round because nobody answered at its bootstrap addresses
    (:func:`~hfl.peer.status.nobody_joined`), and ``node.allow_solo`` is off.

    ``clock``, ``transport`` (builds the peer's transport from its config) and
    ``run_blocking`` (runs training off the loop; default a worker thread) let the
    deterministic simulator (:mod:`hfl.launch.sim`) own time, network and scheduling;
    ``observer`` is told of the node's decisions (:class:`~hfl.peer.node.Node`);
    ``signing`` (sign, verification keys) stands in for the allow-list's signing keys
    where there is no CURVE identity (the simulator's signed cohorts).

    ``freeze_heap`` (``hfl-peer``, ``hfl-launch --in-process``): once this peer is
    built, every object the process tracks at that moment (this peer's model and data,
    the imports; in a shared process also the other peers' objects of that moment)
    leaves the cycle collector's view (:func:`gc.freeze`). A full collection walks
    every tracked object: with 256 peers in one process (1 GiB of them) 15 full
    collections in 6 rounds paused the shared event loop up to 1.1 s each, 7.0 s in all
    (issue 36). What is allocated after the last peer's freeze is collected as usual.
    No collection first: one costs 0.36 s of start-up with torch and hfl imported
    (340,000 objects) and found 36 unreachable ones; cyclic garbage pending at a
    freeze stays until the launcher unfreezes. Both launchers run their peers inside
    :func:`thawed_after`, so a test that runs them pins nothing for the next.

    ``inline_short_calls`` (``hfl-launch --in-process``: every peer on one event loop):
    a method call that was short last time runs on the loop (:meth:`Node._compute_call`)."""
    run_dir = Path(cfg.run_dir)
    make_run_dir(run_dir)
    started = time.time()
    # One peer process per run directory (a process of its own: in one process, with a
    # hub or the simulator's transport, the launcher gives each peer its folder, and a
    # lock file held open per peer cost a thousand peers a thousand descriptors)
    own_process = hub is None and transport is None
    with run_dir_lock(run_dir) if own_process else contextlib.nullcontext():
        if own_process:
            check_listen(cfg.node.listen)  # a port in use: one clear line, before the slow start-up
            handler = attach(run_dir)  # warnings/errors also to events.jsonl, which hfl-launch follows
            try:
                return await _run_peer(cfg, hub, fault_plan, clock, run_dir, started, None,
                                       run_blocking, observer, freeze_heap=freeze_heap,
                                       inline_short_calls=inline_short_calls)
            finally:
                detach(handler)
        return await _run_peer(cfg, hub, fault_plan, clock, run_dir, started, transport,
                               run_blocking, observer, signing, freeze_heap=freeze_heap,
                               inline_short_calls=inline_short_calls)


async def _run_peer(cfg: PeerConfig, hub, fault_plan, clock, run_dir: Path, started: float,
                    make, run_blocking, observer, signing=None, freeze_heap=False,
                    inline_short_calls=False) -> NodeResult:
    import torch

    from hfl.algorithms.registry import get_algorithm
    from hfl.algorithms.training import OptimizerChanged
    from hfl.peer.factory import build_algorithm, model_spec

    identity = cfg.identity()  # keys before anything slow: a bad key file fails at once
    # The time files record for each other (a checkpoint's saved_at, a summary's
    # finished_at): the wall clock, or the clock the simulator injects (virtual).
    wall = clock.now if clock is not None else time.time

    # Files first (before the slow data and model): a corrupt checkpoint, a full or
    # read-only disk, a finished cohort are one line each, at once.
    metrics_path = run_dir / METRICS_NAME
    state = load_checkpoint(run_dir) if cfg.node.resume else None
    if state is not None:
        _check_owner(cfg, run_dir, state.get("owner"))
    at_least = metrics_incarnation(metrics_path)
    if state is not None:
        at_least = max(at_least, int(state.get("incarnation", -1)) + 1)
    incarnation = next_incarnation(run_dir, at_least)
    start_round, members, resumed_after = 1, [], None
    if state is not None:
        resumed_after = int(state["round"])
        start_round = resumed_after + 1
        members = [(str(p), str(a)) for p, a in state["members"]]
        if start_round <= cfg.cohort.rounds and get_algorithm(cfg.cohort.algorithm).mode != "local":
            since = state.get("saved_at")
            if not isinstance(since, (int, float)):  # a checkpoint from before the field
                since = (run_dir / CHECKPOINT_NAME).stat().st_mtime
            done = finished_siblings(run_dir, cfg, members, since)
            if done and not cfg.node.allow_solo:
                raise CohortGone(
                    f"resumed after round {resumed_after}, but the cohort finished round "
                    f"{cfg.cohort.rounds} without this peer ({', '.join(done)}: summary.json in "
                    f"{run_dir.parent}); nothing left to join (start a new run, or more rounds "
                    "for everyone with hfl-launch --resume)")
        if start_round > cfg.cohort.rounds:
            # A finished run: nothing to train, and its summary must stay as it is.
            log.warning("%s: %s already finished round %d of %d (its checkpoint): nothing to "
                        "run; node.resume: false starts over, more cohort.rounds continues",
                        cfg.node.id, run_dir, resumed_after, cfg.cohort.rounds)
            finished_short(cfg, run_dir)
            return NodeResult(rounds_completed=0, last_round=resumed_after)
        dropped = trim_metrics(metrics_path, resumed_after)
        if dropped:
            log.info("%s: dropped %d metrics line(s) past the checkpoint's round %d (that round "
                     "runs again), or damaged", cfg.node.id, dropped, resumed_after)
    elif cfg.node.resume and cfg.node.checkpoint:
        # No checkpoint: killed (or the disk filled) between round 1's metrics line and
        # its checkpoint. Round 1 runs again: its row must not repeat. Rows of later
        # rounds are an earlier life's whose checkpoint is gone (moved aside as
        # damaged): kept in a file of their own, never deleted. (Without checkpoints a
        # restarted peer catches up to its cohort, and its earlier rows stay.)
        set_aside_metrics(cfg.node.id, metrics_path, incarnation)

    # With an elected aggregator a peer records each round it enters; restarted from its
    # checkpoint, it sits out the rounds an earlier life entered (it may have acked a
    # result there, and no longer knows which). Without checkpoints there is no resume.
    entered_path = run_dir / ENTERED_NAME
    sit_out_through = 0
    if cfg.node.resume and cfg.node.checkpoint:
        try:
            sit_out_through = int(entered_path.read_text().strip())
        except FileNotFoundError:
            sit_out_through = 0  # never entered a round with an aggregator
        except (OSError, ValueError) as exc:  # written atomically: this is damage
            sit_out_through = start_round
            log.warning("%s: %s unreadable (%s): sitting out round %d to be safe",
                        cfg.node.id, entered_path, exc, start_round)

    def enter_round(r: int) -> None:
        write_atomic(entered_path, str(r).encode())

    algorithm, num_classes = build_algorithm(cfg)
    # Starting over (node.resume: false), once the config has built (a config that does
    # not build loses nothing): the last run's rows, its checkpoint (the next plain start
    # resumed it under this run's rows) and the rounds it entered go together.
    gone = ((metrics_path, run_dir / CHECKPOINT_NAME, entered_path) if not cfg.node.resume
            else () if cfg.node.checkpoint else (entered_path,))
    for path in gone:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise file_error(path, exc) from exc
    spec = model_spec(cfg, algorithm.model.input_shape, num_classes)
    if state is not None:
        _check_same_model(cfg, run_dir, state.get("model"), spec)
        try:
            algorithm.load_state_dict(state["algorithm"])
        except RuntimeError as exc:  # a checkpoint older than its model description
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            raise _model_changed(cfg, run_dir, (lines[1:] or lines or ["?"])[0][:200]) from None
        except OptimizerChanged as exc:
            raise ConfigError("train.optimizer", f"{exc}: node.resume: false (hfl-launch "
                              "--fresh) starts over, or use another node.run_dir") from None
        except (KeyError, TypeError, ValueError) as exc:  # another method's, or its options'
            raise ConfigError("algorithm", f"the checkpoint in {run_dir} holds another state "
                              f"than this config's {cfg.cohort.algorithm} builds "
                              f"({type(exc).__name__}: {clip(str(exc), 120)}): node.resume: "
                              "false (hfl-launch --fresh) starts over, or use another "
                              "node.run_dir") from None
        torch.set_rng_state(state["torch_rng"])
        log.info("%s: resumed from checkpoint after round %d (incarnation %d)",
                 cfg.node.id, resumed_after, incarnation)

    limits = limits_for(cfg.node.max_message_mib)  # what it sends, and what it takes
    seeds = None
    if algorithm.uses_public_seeds:
        public = algorithm.ctx.public
        own = (public.x, public.y) if public is not None and len(public) else None
        # (a chunk and its header in one message, whatever node.max_message_mib says)
        try:
            seeds = SeedStore(cfg.node.id, own, chunk_bytes=min(
                cfg.node.seed_chunk_bytes, limits.max_message_bytes // 2),
                num_classes=num_classes)
        except ValueError as exc:  # a set the members would refuse: say so now
            raise ConfigError(f"data: {exc}") from None
    if identity is not None:
        log.info("%s: CURVE on, %d peers on the allow-list", cfg.node.id, len(identity.allowed))
    elif not cfg.node.listen.startswith("mem://"):
        log.warning("%s: security.mode is none: messages travel in plaintext and any process that "
                    "reaches %s can claim to be any peer; use CURVE keys outside a trusted network",
                    cfg.node.id, cfg.node.listen)
    transport = (make(cfg) if make is not None
                 else make_transport(cfg.node.id, cfg.node.listen, hub=hub, security=identity,
                                     options=TransportOptions(
                                         max_message_bytes=limits.max_message_bytes,
                                         # (twice: after silence's own verdict)
                                         link_timeout_ms=round(cfg.timing.dead_after_s * 2000))))
    if fault_plan is not None:
        transport = FaultyTransport(transport, fault_plan)
    shared = data_split_fingerprint(cfg.data)
    if shared:
        log.info("%s: data split %d (partition %s into %d, seed %d): peers that split "
                 "differently are refused", cfg.node.id, shared["data_split"],
                 cfg.data.partition, cfg.data.num_partitions, cfg.data.seed)
    if (names := class_names_term(classes := algorithm.ctx.train.classes)):
        shared = {**shared, **names}
        log.info("%s: %d classes named %s (fingerprint %d): peers that name them "
                 "differently are refused", cfg.node.id, len(classes),
                 ", ".join(classes[:12]) + (", ..." if len(classes) > 12 else ""),
                 names["class_names"])
    if cfg.node.max_message_mib != DEFAULT_MAX_MESSAGE_MIB:
        # Every member must take what the others send (a larger message drops the link):
        # a peer with another size is refused at its hello. Off the wire at the default,
        # so that a hello is as it was.
        shared = {**shared, "max_message_mib": cfg.node.max_message_mib}
    recorder = RoundRecorder(run_dir, cfg, algorithm.mode, resumed_after, cfg.node.checkpoint,
                             remembered=len([p for p, _ in members if p != cfg.node.id]),
                             model=spec, clock=clock, wall=wall)
    # A sharing peer told where its cohort is (bootstrap) waits for one other peer even
    # with min_peers 1, and stops (exit 3) if none joined within timing.join_timeout_s,
    # instead of training every round alone only to fail at the end. The first peer of a
    # cohort (no bootstrap: the others dial it) and a resumed one (RoundRecorder) do not.
    stop_if_alone = (algorithm.mode != "local" and not cfg.node.allow_solo
                     and bool(cfg.node.bootstrap) and resumed_after is None)
    # The process's CPU by thread when the rounds begin (one peer per process only):
    # the summary's split is then the rounds', not the start-up's (importing torch).
    own_process = hub is None and make is None
    threads_at_start: list[dict[str, float]] = []  # [the split] once the rounds began

    notes = EventLog(run_dir / EVENTS_NAME, clock)  # the typed notes (peer/status.py)

    def observe(event: str, node, **fields) -> None:
        if event == "started" and own_process and not threads_at_start:
            threads_at_start.append(cpu_by_thread())
        if event in TYPED_EVENTS:
            # (the pid in the note only: the simulator's observer must see the same
            # fields in every run, or its history would differ)
            notes.note(event, node.id, node.incarnation,
                       {**fields, "pid": os.getpid()} if event == "started" else fields)
        if observer is not None:
            observer(event, node, **fields)

    node_signing = signing or signing_of(cfg.node.id, identity)
    # The cohort: node.min_peers, or the allow-list where it names more (a peer started
    # by hand waits for fewer than its cohort: min_peers 1 warned of "2 of the 1").
    f = 1 if cfg.node.byzantine is None else cfg.node.byzantine
    n = max(cfg.node.min_peers, len(identity.allowed) if identity is not None else 0)
    if (cfg.node.byzantine is not None or node_signing) and cfg.node.quorum is None and (
            1 < n < f + 1):  # (signed or not: f also counts reports, a review)
        raise ConfigError("node.byzantine", byzantine_refusal(f, n))
    node = Node(
        peer_id=cfg.node.id, transport=transport, algorithm=algorithm, cohort=cfg.cohort,
        num_classes=num_classes, timing=cfg.timing, bootstrap=cfg.node.bootstrap,
        min_peers=cfg.node.min_peers, incarnation=incarnation, start_round=start_round,
        known_members=members, on_round=recorder.round, on_checkpoint=recorder.checkpoint,
        clock=clock, seed=cfg.node.seed, fault=cfg.fault, advertise=cfg.node.advertise,
        seeds=seeds, shared=shared,
        data_part=cfg.data.partition_index + 1 if "data_split" in shared else 0,
        allowed_peers=frozenset(identity.allowed) if identity else None,
        signing=node_signing, byzantine=cfg.node.byzantine,
        quorum=cfg.node.quorum, evaluate_every=cfg.node.evaluate_every,
        stop_if_alone=stop_if_alone, run_blocking=run_blocking, hold_round=recorder.hold,
        observer=observe, on_enter_round=enter_round if cfg.node.checkpoint else None,
        sit_out_through=sit_out_through, inline_short_calls=inline_short_calls, limits=limits,
        keep_metrics=not own_process,  # (hfl-peer reads its lines from metrics.jsonl)
    )
    recorder.node = node
    commits = algorithm.mode == "aggregator" and not node.everywhere  # (an elected aggregator)
    if commits and node_signing and cfg.node.quorum is None and n > 1 and n < 3 * f + 1 and (
            (n + f) // 2 > n // 2):
        # (f costs liveness here: a quorum larger than a majority, and fewer than 3f + 1
        # members; a signed cohort of 3 stopped committing while one member restarted.
        # Only where results are committed: every CHFL peer of the shipped 3-peer example
        # warned of commits it never makes, every peer aggregating, a review)
        log.warning("%s: node.byzantine %d (f) in a cohort of %d: a commit needs %d of the %d "
                    "members, so %d silent member(s) (a crash, a restart) stop every commit "
                    "until back; a cohort commits with f members silent from 3f + 1 = %d; "
                    "node.byzantine: 0 trusts the members (crash faults only) and commits with "
                    "a majority, %d", cfg.node.id, f, n, (n + f) // 2 + 1, n, n - (n + f) // 2,
                    3 * f + 1, n // 2 + 1)
    watcher = asyncio.create_task(watch_join(
        node, cfg.node.bootstrap, node.core.join_need(node.stop_if_alone),
        cfg.timing.join_timeout_s, run_dir / EVENTS_NAME if hub is None and make is None else None,
        alone_stops=stop_if_alone), name="watch_join")
    if freeze_heap:
        gc.freeze()
    try:
        result = await node.run()
    finally:
        await recorder.stop()  # stopped (SIGTERM, Ctrl-C): the checkpoint under way is kept
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    # Every round this peer recorded, over all its lives: a peer restarted for the last
    # rounds is judged on its whole run, not on the rounds since its restart.
    history = {int(r["round"]): r for r in read_jsonl(run_dir / METRICS_NAME) if "round" in r}
    shortfall = result.stopped_alone or cohort_shortfall(
        algorithm.mode, cfg.node.min_peers, [history[k] for k in sorted(history)] or result.metrics)
    last = result.metrics[-1] if result.metrics else {}
    summary = {
        "peer": cfg.node.id, "algorithm": cfg.cohort.algorithm, "data": data_description(cfg.data),
        "arch": getattr(algorithm.model, "arch", cfg.model.arch),
        "incarnation": incarnation, "rounds": cfg.cohort.rounds,
        "last_round": result.last_round, "rounds_completed_this_run": result.rounds_completed,
        "wall_time_s": time.time() - started, "cpu_time_s": time.process_time(),
        # each thread's CPU over this run's rounds (Linux, one peer per process): the
        # event loop (MainThread), the method (hfl-work), libzmq (ZMQbg/*), ...
        "rounds_cpu_by_thread_s": {
            name: round(cpu - threads_at_start[0].get(name, 0.0), 3)
            for name, cpu in cpu_by_thread().items()} if threads_at_start else {},
        "finished_at": wall(),  # compared with a checkpoint's saved_at (finished_siblings)
        "dropped": result.dropped,
        "sent_by_type": result.sent,  # messages this life sent, by type
        "sent_bytes_by_type": result.sent_bytes,  # and their bytes
        "max_rss_mb": max_rss_mb(),  # the process's peak resident memory (Linux, macOS)
        "final": {k: v for k, v in last.items() if isinstance(v, (int, float))},
        "max_live_peers": node.ledger.max_live_peers,
        "min_peers": cfg.node.min_peers, "cohort_shortfall": shortfall,
    }
    write_atomic(run_dir / SUMMARY_NAME, json.dumps(summary, indent=2, default=float).encode())
    if shortfall and not cfg.node.allow_solo:
        log.error("%s: %s", cfg.node.id, shortfall)
        raise CohortTooSmall(shortfall)
    return result
