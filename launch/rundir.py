"""A run directory's own record, so that re-running a command never silently reuses
(or mixes with) an old run.

``hfl-launch`` writes ``<run_dir>/launch.json``: the experiment as launched (after
``--set``), the TCP ports it gave the peers, its state (``running``, ``finished``,
``failed``, ``interrupted``) and the launcher's pid. Before a launch,
:func:`decide` compares that record with the new experiment:

======================================  ==========================================
run directory                           without a flag
======================================  ==========================================
missing, or empty of runs               a new run
interrupted/failed, same experiment     resumed (checkpoints, the same ports)
finished                                refused: ``--resume`` or ``--fresh``
another experiment (a ``--set``, ...)   refused: ``--resume`` or ``--fresh``
peer directories but no launch.json     refused: ``--resume`` or ``--fresh``
launched by a live ``hfl-launch``       refused (even with ``--resume``)
another ``hfl-launch`` starting on it   refused (:class:`LaunchLock`)
======================================  ==========================================

``--fresh`` deletes the directory, but only once the new run is valid and
starts (until then it is moved aside; a refused launch puts it back);
``--resume`` continues from the peers'
checkpoints with the new experiment (e.g. more rounds). A resumed run reuses the
ports of launch.json, because every peer's checkpoint remembers its cohort by
those addresses.

Each launch starts a new ``peer.log`` per peer; the previous ones are kept as
``peer.log.1`` (newest) to ``peer.log.3`` (see :func:`rotate_log`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hfl.peer.configtools import config_differences

RECORD_NAME = "launch.json"
KEPT_LOGS = 3
# Fields that do not change what the run computes: a new value is not "another experiment".
NEUTRAL_KEYS = ("timeout_s", "run_dir", "threads_per_peer", "devices", "slurm")


class RunDirError(Exception):
    """This run directory cannot be used as asked; the message is one line for the user."""


@dataclass
class Decision:
    action: str  # "new", "resume"
    reason: str  # one line, shown to the user
    ports: list[int] | None = None  # to reuse (resume)
    # --fresh: the old run, moved aside until the new one is known to start
    # (:func:`restore` puts it back if it does not, :func:`discard` deletes it).
    aside: Path | None = None
    #: a dry run's answer where the launch would be refused (it exits 2, as the launch)
    refused: bool = False


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's launch record, or None where there is none or it is damaged
    (:func:`damaged_record` tells which): JSON that is not an object of the fields
    hfl-launch writes raised AttributeError and TypeError in hfl-launch and hfl-report
    (a review)."""
    try:
        record = json.loads((run_dir / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("state", ""), str) \
            or not isinstance(record.get("experiment", {}), dict) \
            or not isinstance(record.get("ports", []), list) \
            or not all(isinstance(p, int) and not isinstance(p, bool)
                       for p in record.get("ports", [])):
        return None
    return record


def damaged_record(run_dir: Path) -> str | None:
    """What is wrong with a launch record that is there but cannot be read, or None."""
    path = run_dir / RECORD_NAME
    if not path.exists() or read_record(run_dir) is not None:
        return None
    return (f"its launch record {path} is damaged (not the JSON object hfl-launch writes), "
            f"so its ports and state are unknown (a launch keeps it as {path.name}.damaged)")


def write_record(run_dir: Path, experiment: dict[str, Any], ports: list[int], state: str,
                 **extra: Any) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    from hfl.peer.status import process_started

    if damaged_record(run_dir) is not None:  # (it was overwritten without a word, a review)
        os.replace(run_dir / RECORD_NAME, run_dir / (RECORD_NAME + ".damaged"))

    record = {"experiment": experiment, "ports": ports, "state": state, "pid": os.getpid(),
              "pid_started": process_started(os.getpid()), "updated": time.time(), **extra}
    tmp = run_dir / (RECORD_NAME + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str))
    os.replace(tmp, run_dir / RECORD_NAME)


def set_state(run_dir: Path, state: str, **extra: Any) -> None:
    record = read_record(run_dir)
    if record is not None:
        write_record(run_dir, record["experiment"], record["ports"], state,
                     **{**{k: v for k, v in record.items()
                           if k not in ("experiment", "ports", "state", "pid", "pid_started",
                                        "updated")}, **extra})


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ, with both values (NEUTRAL_KEYS ignored at the top)."""
    return config_differences(old, new, ignore=NEUTRAL_KEYS)


def _pid_alive(pid: int, started: int | None = None) -> bool:
    """Whether the launcher of a record runs: its pid, and where the record has it, the
    same start time (a record's pid taken by another process after a restart blocked
    the run directory for good, and the advice was to stop that process: a review)."""
    from hfl.peer.status import process_alive

    return pid != os.getpid() and process_alive(pid, started)


def peers_still_running(run_dir: Path) -> list[str]:
    """The peer folders of ``run_dir`` whose process still runs (it holds its ``.lock``),
    as "<peer> (pid N)": an orphan of a launcher killed with SIGKILL went on writing
    into the folder a ``--fresh`` run had made anew (a review)."""
    try:
        import fcntl
    except ImportError:
        return []
    running = []
    for lock in sorted(run_dir.glob("*/.lock")) if run_dir.is_dir() else ():
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = lock.read_text(errors="replace").strip()[:12]
            running.append(f"{lock.parent.name} (pid {pid})" if pid.isdigit() else lock.parent.name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return running


def _has_peer_dirs(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(
        (d / "metrics.jsonl").exists() or (d / "checkpoint.pt").exists()
        for d in run_dir.iterdir() if d.is_dir()
    )


#: A run directory's own record (a folder holding one is an hfl run, to resume or delete).
RUN_RECORDS = ("launch.json", "run_id")
#: Everything else hfl-launch writes in a run directory, besides peer folders.
RUN_ENTRIES = ("keys", "peers", "results.md", "results.json", "peers.log", "plots", "events.jsonl")


def foreign_content(run_dir: Path, peer_ids: Iterable[str] = ()) -> list[str]:
    """The entries of an existing ``run_dir`` that hfl-launch did not write: a folder
    of the user's. Empty when the folder holds a run's record (:data:`RUN_RECORDS`),
    nothing but what a launch writes (:data:`RUN_ENTRIES`, folders of ``peer_ids``,
    per-seed folders ``seed<S>``, and a peer folder of an older hfl: metrics or a
    checkpoint), or nothing (hidden files such as .DS_Store do not count), or when it
    does not exist. A folder with a ``keys`` folder and a model's ``checkpoint.pt``
    beside a thesis is not a run (it was taken for one, and --fresh deleted it)."""
    if not run_dir.is_dir() or any((run_dir / r).exists() for r in RUN_RECORDS):
        return []
    ids = set(peer_ids)

    def ours(entry: Path) -> bool:
        if entry.name in RUN_ENTRIES or entry.name.startswith("."):
            return True
        if not entry.is_dir():
            return False
        return (entry.name in ids or re.fullmatch(r"seed-?\d+", entry.name) is not None
                or (entry / "metrics.jsonl").exists() or (entry / "checkpoint.pt").exists())

    return sorted(e.name for e in run_dir.iterdir() if not ours(e))


def refuse_foreign(run_dir: Path, peer_ids: Iterable[str] = ()) -> None:
    """RunDirError naming what ``run_dir`` holds when it is a folder of the user's
    (:func:`foreign_content`): never used, let alone deleted."""
    foreign = foreign_content(run_dir, peer_ids)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise RunDirError(
            f"{run_dir} holds files that are not an hfl run ({shown}); nothing was changed "
            "there. Choose another --run-dir (a new or empty folder)"
        )


def decide(run_dir: Path, experiment: dict[str, Any], *, fresh: bool, resume: bool,
           peer_ids: Iterable[str] = ()) -> Decision:
    """What to do with ``run_dir`` for this experiment; raises RunDirError to refuse.

    ``fresh`` deletes the directory (after the live-launcher check). A folder that holds
    files but no hfl run is never used, let alone deleted: ``--fresh`` deleted whatever
    the path named (a review: a thesis and its data, with exit status 0)."""
    if fresh and resume:
        raise RunDirError("--fresh and --resume exclude each other")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a folder: choose another --run-dir")
    refuse_foreign(run_dir, peer_ids)
    record = read_record(run_dir)
    if record is not None and record.get("state") == "running" and _pid_alive(
            int(record.get("pid", -1)), record.get("pid_started")):
        raise RunDirError(
            f"{run_dir} is in use by a running hfl-launch (pid {record['pid']}); "
            "stop it or choose another --run-dir"
        )
    # (a SLURM job's peers hold their locks while the same command follows the job)
    if not (record or {}).get("slurm_job") and (orphans := peers_still_running(run_dir)):
        raise RunDirError(
            f"{run_dir}: peer(s) {', '.join(orphans[:8])} of its run still run, with no "
            "hfl-launch (it was killed?): they stop within seconds of losing it; if not, "
            "stop them (kill <pid>), then run this again")
    if fresh:
        aside = None
        if run_dir.exists():
            aside = run_dir.with_name(f".{run_dir.name}.replaced-{os.getpid()}")
            shutil.rmtree(aside, ignore_errors=True)
            run_dir.rename(aside)
        return Decision("new", f"--fresh: deleted and started {run_dir} anew", aside=aside)
    if record is None:
        damaged = damaged_record(run_dir)
        if not _has_peer_dirs(run_dir) and damaged is None:
            return Decision("new", f"new run in {run_dir}")
        if resume:
            return Decision("resume", f"--resume: continuing the peers' checkpoints in {run_dir} "
                                      f"({damaged or 'no launch record'}: new ports)")
        raise RunDirError(
            f"{run_dir} holds a run " + (f"whose {damaged.removeprefix('its ')}" if damaged else
                                         "without a launch record (an older hfl or another tool)")
            + "; add --resume to continue it or --fresh to delete it and start over"
        )
    ports = [int(p) for p in record.get("ports", [])] or None
    changed = differences(record.get("experiment", {}), experiment)
    state = record.get("state", "?")
    if resume:
        if ports is not None and len(ports) != int(experiment.get("peers", len(ports))):
            raise RunDirError(
                f"--resume: {run_dir} was launched with {len(ports)} peers, now {experiment.get('peers')}; "
                "a cohort cannot change size on resume: use --fresh or another --run-dir"
            )
        what = f" with changes ({'; '.join(changed)})" if changed else ""
        return Decision("resume", f"--resume: continuing the {state} run in {run_dir}{what}", ports)
    if changed:
        raise RunDirError(
            f"{run_dir} holds a {state} run of another experiment ({'; '.join(changed[:4])}"
            f"{'; ...' if len(changed) > 4 else ''}); add --fresh to start over, --resume to "
            "continue it with the new settings, or choose another --run-dir"
        )
    if state == "finished":
        raise RunDirError(
            f"{run_dir} holds a finished run of this experiment (results in {run_dir}/results.md); "
            "add --fresh to run it again, or --resume to continue it (e.g. with more rounds)"
        )
    return Decision("resume", f"resuming the {state} run in {run_dir} from the peers' checkpoints "
                              "(same ports; --fresh starts over)", ports)


def nothing_to_resume(run_dir: Path, peers: Iterable[tuple[str, bool, Path]]) -> str | None:
    """Why a resume of ``run_dir`` would not go on from where it stopped, or None.
    ``peers``: (id, node.checkpoint, its run folder). A peer that keeps no checkpoint
    starts again at round 1, its rows beside the last run's: ``--resume`` of a finished
    run without checkpoints ran it twice into one metrics.jsonl and showed one table
    of both (restarts 1, twice the bytes)."""
    unsaved = [pid for pid, checkpoint, folder in peers  # (a checkpoint of earlier, kept:
               if not checkpoint and (folder / "metrics.jsonl").exists()  # it resumes)
               and not (folder / "checkpoint.pt").exists()]
    if not unsaved:
        return None
    return (f"cannot resume {run_dir}: node.checkpoint is off for "
            f"{', '.join(unsaved[:4])}{', ...' if len(unsaved) > 4 else ''}, so there is no "
            "checkpoint to go on from (they would run again from round 1 beside the last "
            "run's rows); --fresh starts over, or use another --run-dir")


def rounds_already_run(run_dir: Path, rounds: int, peers: Iterable[tuple[str, Path]]) -> str | None:
    """Why a resume of ``run_dir`` with ``rounds`` in all would run nothing, or None:
    its peers' metrics show rounds up to ``rounds`` done already. A review: ``--resume
    --set defaults.cohort.rounds=10`` on a finished 20-round run showed "round 20/10",
    ran nothing, and recorded 10 rounds, so the plain command was refused after."""
    from hfl.launch.results import read_metrics

    done = {pid: max((int(r["round"]) for r in read_metrics(folder)), default=0)
            for pid, folder in peers}
    # Every peer: one behind (a solo peer, slower, stopped by Ctrl-C) has rounds to run.
    least = min(done.values(), default=0)
    if least < rounds or rounds <= 0:
        return None
    return (f"cannot resume {run_dir} with cohort.rounds {rounds}: its peers ran round {least} "
            f"already; more rounds continue it (e.g. --set defaults.cohort.rounds={least + 10}), "
            "--fresh starts over")


def restore(run_dir: Path, decision: Decision) -> None:
    """A --fresh launch refused before it started: the old run comes back as it was."""
    if decision.aside is not None and decision.aside.exists():
        shutil.rmtree(run_dir, ignore_errors=True)  # what the refused launch wrote
        decision.aside.rename(run_dir)
        decision.aside = None


def discard(decision: Decision) -> None:
    """The new run starts: the old one, replaced by --fresh, is deleted."""
    if decision.aside is not None:
        shutil.rmtree(decision.aside, ignore_errors=True)
        decision.aside = None


class LaunchLock:
    """An exclusive lock on a run directory, held by one ``hfl-launch`` from before it
    reads the directory until it is done with it: two launches of one folder started
    within seconds of each other (a command run twice, two terminals) both found no
    record (it is written once every check passed, torch imported) and both started
    a new run there. The lock is a hidden file beside the folder
    (``.<name>.hfl-launch.lock``, holding the pid), so that ``--fresh`` moving the
    folder aside keeps it, at the folder's real path (a symlink to it names the same
    lock); it is deleted on release, with any parent folder it had to make. Where
    nothing may be written beside the folder, the lock is a hidden file inside it.
    Where neither can be locked (a filesystem without ``flock``), :meth:`take` says
    why and only the record's check holds."""

    BESIDE, INSIDE = ".{}.hfl-launch.lock", ".hfl-launch.lock"  # (file names)

    def __init__(self, path: Path, fd: int, made: list[Path]):
        self.path, self.fd, self.made = path, fd, made

    @classmethod
    def places(cls, run_dir: Path) -> list[Path]:
        """Where the lock of ``run_dir`` is: beside it, else inside it."""
        real = Path(os.path.realpath(run_dir))
        return [real.parent / cls.BESIDE.format(real.name), real / cls.INSIDE]

    @classmethod
    def take(cls, run_dir: Path) -> LaunchLock | str:
        """The lock; or, where none can be taken, why (a line). RunDirError when another
        launcher holds it."""
        beside, inside = cls.places(run_dir)
        why = f"cannot make {beside.parent}"
        for _ in range(3):  # (a parent another launcher made, and removed meanwhile: again)
            made = cls._make(beside.parent)
            if made is None:
                break  # (a parent we cannot make)
            try:
                return cls._lock(beside, run_dir, made)
            except FileNotFoundError:
                cls._remove(made)
            except PermissionError as exc:  # nothing may be written beside: inside, then
                cls._remove(made)
                why = f"{exc.strerror}: {beside}"
                break
            except OSError as exc:  # (no flock on this filesystem)
                cls._remove(made)
                return f"{exc.strerror or exc}: {beside}"
        if not inside.parent.is_dir():
            return why
        try:
            return cls._lock(inside, run_dir, [])
        except OSError as exc:
            return f"{why}; {exc.strerror or exc}: {inside}"

    @staticmethod
    def _make(folder: Path) -> list[Path] | None:
        """Make ``folder`` and its missing parents: those it made; None if it could not."""
        made = []
        for parent in [*reversed(folder.parents), folder]:
            if parent.exists():
                continue
            try:
                parent.mkdir()
            except FileExistsError:
                continue
            except OSError:
                LaunchLock._remove(made)
                return None
            made.append(parent)
        return made

    @classmethod
    def _lock(cls, path: Path, run_dir: Path, made: list[Path]) -> LaunchLock:
        import fcntl

        while True:
            try:
                fd, writable = os.open(path, os.O_RDWR | os.O_CREAT, 0o644), True
            except PermissionError:
                if not path.exists():
                    raise  # (nothing may be written here: the caller looks elsewhere)
                # Another user's lock file: flock needs no write access, and falling back
                # inside the folder let both users' launches in (a review).
                fd, writable = os.open(path, os.O_RDONLY), False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                cls._remove(made)
                raise RunDirError(
                    f"{run_dir} is in use by another hfl-launch"
                    f"{f' (pid {holder})' if holder.isdigit() else ''}, starting or running; "
                    "wait for it, stop it, or choose another --run-dir") from None
            except OSError:
                os.close(fd)
                raise
            if cls._same_file(fd, path):  # (a releaser deletes the file it held: take anew)
                if writable:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, str(os.getpid()).encode(), 0)
                return cls(path, fd, made)
            os.close(fd)

    @staticmethod
    def _same_file(fd: int, path: Path) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(path).st_ino
        except OSError:
            return False

    @staticmethod
    def _remove(made: list[Path]) -> None:
        for parent in reversed(made):  # (deepest first; one that holds anything stays)
            try:
                parent.rmdir()
            except OSError:
                break

    def release(self) -> None:
        """Delete the lock file while holding it (only if it is still ours), then let
        go: one that waits on the old file sees it is no longer at the path and takes a
        new one. Parent folders this lock made go too, where nothing else is in them (a
        refused launch leaves no folder)."""
        if self.fd < 0:
            return
        if self._same_file(self.fd, self.path):
            try:
                os.unlink(self.path)
            except OSError:
                pass
        os.close(self.fd)
        self.fd = -1
        self._remove(self.made)


def ports_in_use(host: str, ports: list[int]) -> list[int]:
    """The ports something listens on. SO_REUSEADDR as ZeroMQ sets it: connections of
    the previous launch left in TIME_WAIT do not count."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def rotate_log(path: Path, keep: int = KEPT_LOGS) -> None:
    """peer.log -> peer.log.1 -> ... -> peer.log.<keep> (the oldest is dropped)."""
    if not path.exists():
        return
    for i in range(keep, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        newer = path if i == 1 else path.with_name(f"{path.name}.{i - 1}")
        if newer.exists():
            os.replace(newer, older)
