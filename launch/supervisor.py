"""Spawn the peers of an experiment, follow their progress, inject process faults.

The launcher is not part of the cohort: peers find each other by themselves.
It only starts processes, reads the metrics lines they append, kills and
restarts peers when the experiment asks for it, and stops everything on
Ctrl-C or timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hfl.launch.experiment import ExperimentConfig, FaultSpec, PeerPlan
from hfl.launch.results import JsonlTail, RoundProgress
from hfl.launch.rundir import rotate_log

POLL_S = 0.1
MAX_SHOWN_EVENTS = 8  # status events per peer on the console; the rest stay in peer.log
MAX_SHOWN_TOTAL = 60  # and for the whole cohort (100 peers must not flood the console)
CRASH_EXIT_CODE = 137  # FaultConfig.exit_code's default
COHORT_TOO_SMALL_EXIT_CODE = 3  # hfl-peer: finished, but below min_peers (node.allow_solo)
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # each stops the launch


@dataclass
class PeerProc:
    plan: PeerPlan
    proc: subprocess.Popen | None = None
    log: IO | None = None
    metrics: JsonlTail = field(init=False)  # its metrics.jsonl and events.jsonl, followed
    events: JsonlTail = field(init=False)
    shown: set = field(default_factory=set)  # status events already on the console
    joined: tuple[int, int] | None = None  # (peers greeted incl. itself, peers needed)
    rounds: RoundProgress = field(default_factory=RoundProgress)  # from its metrics lines
    starts: int = 0
    killed_on_purpose: bool = False
    exit_codes: list[int] = field(default_factory=list)
    launched_at: float = field(default_factory=time.time)  # this launch's start (wall clock)

    def __post_init__(self) -> None:
        self.metrics = JsonlTail(self.metrics_path)
        try:  # status events from now on: those of earlier launches were shown then
            self.events = JsonlTail(self.events_path, self.events_path.stat().st_size)
        except OSError:
            self.events = JsonlTail(self.events_path)

    @property
    def went_on(self) -> bool:
        """Whether it finished a round in this launch (a resumed run's file holds the
        rounds of earlier launches, which read as going: a peer that failed at once on a
        damaged checkpoint left the others waiting out their join timeout)."""
        t = self.rounds.last.get("time")
        return isinstance(t, (int, float)) and t >= self.launched_at

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def metrics_path(self) -> Path:
        return Path(self.plan.config.run_dir) / "metrics.jsonl"

    @property
    def events_path(self) -> Path:
        return Path(self.plan.config.run_dir) / "events.jsonl"


@dataclass
class FaultState:
    spec: FaultSpec
    target: str | None = None
    killed_at: float | None = None
    restarted_at: float | None = None
    done: bool = False


@dataclass
class LaunchOutcome:
    ok: bool
    wall_time_s: float
    failures: list[str]
    events: list[dict[str, Any]]
    peers: dict[str, PeerProc]


class Supervisor:
    def __init__(self, exp: ExperimentConfig, plans: list[PeerPlan], out: IO | None = None,
                 progress: bool = True, start_method: str = "process"):
        self.exp = exp
        self.start_method = start_method  # "process" (one interpreter each) or "forkserver"
        self._preload = []
        if start_method == "forkserver":
            from hfl.launch.zygote import preload_for

            self._preload = sorted({m for p in plans for m in preload_for(p.config.cohort.algorithm)})
        self.peers = {p.id: PeerProc(p) for p in plans}
        self.rounds = plans[0].config.cohort.rounds
        self.faults = [FaultState(f, target=exp.fault_target(f)) for f in exp.faults]
        # (sys.stdout now, not at import: with stdout closed it is None, and the first
        # progress line raised, leaving the peers running: a review)
        self.out = out if out is not None else sys.stdout
        self.progress = progress and self.out is not None
        self.events: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self._t0 = time.monotonic()
        self._last_line = ""
        self._shown_total = 0
        self._broken = False  # our stdout went away (`| tee log` and Ctrl-C): stop writing to it
        from hfl.peer.status import process_started

        self._started = process_started(os.getpid()) or ""  # (with the pid: this launcher)

    # ----------------------------------------------------------------- processes

    def _start(self, pp: PeerProc) -> None:
        run_dir = Path(pp.plan.config.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if pp.log is None:  # a new peer.log per launch; restarts within it append
            rotate_log(run_dir / "peer.log")
            pp.log = open(run_dir / "peer.log", "ab")  # noqa: SIM115 - closed in _close_logs
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        pp.log.write(f"----- hfl-launch: start {pp.starts + 1} of {pp.plan.id} at {stamp} -----\n".encode())
        pp.log.flush()
        # The peer stops when this launcher is gone (peer.cli.watch_launcher): killed
        # with SIGKILL, it left its peers training for nobody, holding the ports, and
        # an orphan wrote into the folder a --fresh run had made anew (a review).
        ours = {"PYTHONUNBUFFERED": "1", "HFL_LAUNCHER_PID": str(os.getpid()),
                "HFL_LAUNCHER_STARTED": str(self._started)}
        if self.start_method == "forkserver":  # forked from a template that imported torch
            from hfl.launch.zygote import ForkedPeer

            with _stops_deferred():  # see there: no peer forked and not recorded
                pp.proc = ForkedPeer(pp.plan.config_path, {**pp.plan.env, **ours},
                                     run_dir / "peer.log", self._preload)
        else:
            env = {**os.environ, **pp.plan.env, **ours}
            pp.proc = subprocess.Popen(
                [sys.executable, "-m", "hfl.peer.cli", "--config", str(pp.plan.config_path),
                 "--no-plot"],  # the launcher plots the whole run
                stdout=pp.log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,  # Ctrl-C reaches the launcher only; it stops the peers
            )
        pp.starts += 1
        pp.killed_on_purpose = False
        self._event("start", pp.plan.id, pid=pp.proc.pid, start=pp.starts)

    def stop_all(self, grace_s: float = 10.0) -> None:
        # A second Ctrl-C (or the SIGTERM of a scheduler) must not cut this short:
        # the peers run in their own sessions and would outlive us.
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._stop_all(grace_s)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop_all(self, grace_s: float) -> None:
        for pp in self.peers.values():
            if pp.running:  # (a forked peer whose template died runs on: ForkedPeer.poll)
                pp.killed_on_purpose = True  # its exit status is ours, not a failure
                pp.proc.send_signal(signal.SIGTERM)
                pp.proc.send_signal(signal.SIGCONT)  # a stopped peer takes SIGTERM only so
        deadline = time.monotonic() + grace_s
        for pp in self.peers.values():
            if pp.proc is None:
                continue
            try:
                pp.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pp.proc.kill()
                pp.proc.wait()

    def _close_logs(self) -> None:
        for pp in self.peers.values():
            if pp.log is not None:
                pp.log.close()
                pp.log = None

    # ----------------------------------------------------------------- following

    def _read_metrics(self, pp: PeerProc) -> None:
        pp.rounds.add(pp.metrics.read())

    def _read_events(self, pp: PeerProc) -> None:
        """Status events the peer wrote (warnings, errors, join progress): problems reach
        the console within a poll, not only peer.log."""
        for ev in pp.events.read():
            if ev.get("kind") == "joining":
                pp.joined = (int(ev.get("joined", 0)), int(ev.get("need", 0)))
                continue
            if ev.get("kind", "log") != "log":
                continue  # a typed note (elections, commits, drops): for tools, not the console
            # Each kind of warning once per peer (membership changes repeat in fault runs);
            # every distinct error.
            key = ev.get("msg") if ev.get("level") == "error" else ev.get("template", ev.get("msg"))
            if key in pp.shown or len(pp.shown) >= MAX_SHOWN_EVENTS or self._shown_total > MAX_SHOWN_TOTAL:
                continue
            pp.shown.add(key)
            self._shown_total += 1
            more = " (further warnings only in peer.log)" if len(pp.shown) == MAX_SHOWN_EVENTS else ""
            if self._shown_total > MAX_SHOWN_TOTAL:
                self._say(f"hfl-launch: more than {MAX_SHOWN_TOTAL} warnings; the rest only in "
                          "each peer's peer.log / events.jsonl")
                continue
            self._say(f"hfl-launch: {pp.plan.id} {ev.get('level', 'warning')}: {ev.get('msg')}{more}")

    def _say(self, line: str) -> None:
        """A line for the user on stderr, even with progress off; never raises."""
        if self.progress and not self._broken and hasattr(self.out, "isatty") and self.out.isatty():
            self._write("\r\033[K")
        try:
            print(line, file=sys.stderr, flush=True)
        except (BrokenPipeError, OSError, ValueError):
            pass

    def _write(self, text: str) -> None:
        if self._broken:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except (BrokenPipeError, OSError, ValueError):
            self._broken = True  # e.g. `| tee log` closed by Ctrl-C: carry on without output

    def _event(self, kind: str, peer: str, **info: Any) -> None:
        ev = {"t": round(time.monotonic() - self._t0, 3), "event": kind, "peer": peer, **info}
        self.events.append(ev)
        self._print(f"[{ev['t']:7.1f}s] {kind} {peer} " + " ".join(f"{k}={v}" for k, v in info.items()),
                    newline=True)

    def _print(self, line: str, newline: bool = False, final: bool = False) -> None:
        """On a terminal, redraw one status line; in a log, print it when it changes.
        ``final`` ends the live line: on a terminal it stays, in a log it is not repeated."""
        if not self.progress or self._broken:
            return
        tty = hasattr(self.out, "isatty") and self.out.isatty()
        content = line.split("]", 1)[-1]  # ignore the clock when deciding what changed
        if tty:
            width = shutil.get_terminal_size((200, 24)).columns
            shown = line if newline or len(line) < width else line[: width - 4] + " ..."
            self._write("\r\033[K" + shown + ("\n" if newline or final else ""))
        elif newline or content != self._last_line:
            self._write(line + "\n")
        if not newline:  # events in between do not make the same status line new again
            self._last_line = content

    def _progress_line(self) -> str:
        """``round 3/20, ETA 1m25s | p0 r3 acc 0.912 | p1 joining 2/4 | ...``: each peer's
        last finished round and its accuracy on the shared (global) test set, or on its
        own test split when there is none."""
        parts = []
        for pid, pp in self.peers.items():
            state = "" if pp.running or pp.rounds.last_round >= self.rounds else " (down)"
            if pp.rounds.last_round == 0 and pp.joined is not None and pp.running:
                parts.append(f"{pid} joining {pp.joined[0]}/{pp.joined[1]}")
                continue
            if "global_acc" in pp.rounds.last:
                label, acc = "global acc", pp.rounds.last["global_acc"]
            else:
                label, acc = "acc", pp.rounds.last.get("test_acc")
            acc_s = f" {label} {acc:.3f}" if isinstance(acc, (int, float)) else ""
            parts.append(f"{pid} r{pp.rounds.last_round}{acc_s}{state}")
        done = min(pp.rounds.last_round for pp in self.peers.values())
        timed = sum(pp.rounds.rounds_timed for pp in self.peers.values())
        mean_s = sum(pp.rounds.round_s for pp in self.peers.values()) / timed if timed else None
        return (f"[{time.monotonic() - self._t0:6.1f}s] round {done}/{self.rounds}"
                f"{eta_text(mean_s, self.rounds - done)} | " + " | ".join(parts))

    # ----------------------------------------------------------------- faults

    def _cohort_round(self) -> int:
        """The round the cohort is in: one past the most advanced peer's last line."""
        return max(pp.rounds.last_round for pp in self.peers.values()) + 1

    def _expected_crash(self, pid: str, code: int) -> FaultState | None:
        for fs in self.faults:
            if fs.target == pid and fs.killed_at is None and code == CRASH_EXIT_CODE:
                return fs
        return None

    def _apply_restarts(self) -> None:
        for fs in self.faults:
            if fs.done or fs.killed_at is None:
                continue
            if self._cohort_round() >= fs.spec.restart_at_round:
                self._start(self.peers[fs.target])
                fs.restarted_at = time.monotonic()
                fs.done = True

    # ----------------------------------------------------------------- main loop

    def run(self) -> LaunchOutcome:
        # SIGTERM (a job scheduler, `timeout`, systemd) must stop the peers as
        # Ctrl-C does: they run in their own sessions and would outlive us.
        previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            return self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> LaunchOutcome:
        deadline = self._t0 + self.exp.timeout_s
        try:
            for pp in self.peers.values():  # a Ctrl-C while they start stops those started
                self._start(pp)
            while True:
                for pp in self.peers.values():
                    self._read_metrics(pp)
                    self._read_events(pp)
                self._reap()
                self._apply_restarts()
                self._print(self._progress_line())
                restart_pending = any(f.killed_at is not None and not f.done for f in self.faults)
                if not any(pp.running for pp in self.peers.values()) and not restart_pending:
                    break
                if time.monotonic() > deadline:
                    self.failures.append(f"timeout after {self.exp.timeout_s:.0f}s")
                    self.stop_all()
                    break
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self.failures.append("interrupted")
            try:
                self._say("hfl-launch: interrupted: stopping the peers")
            finally:
                self.stop_all()
        except BaseException:  # a bug here must not leave the peers running for nobody
            self.stop_all()
            raise
        finally:
            for pp in self.peers.values():
                self._read_metrics(pp)
                self._read_events(pp)
            self._close_logs()
        self._print(self._progress_line(), final=True)
        return LaunchOutcome(
            ok=not self.failures, wall_time_s=time.monotonic() - self._t0,
            failures=self.failures, events=self.events, peers=self.peers,
        )

    def _reap(self) -> None:
        for pid, pp in self.peers.items():
            if pp.proc is None or pp.proc.poll() is None or len(pp.exit_codes) >= pp.starts:
                continue
            code = pp.proc.returncode
            pp.exit_codes.append(code)
            if pp.killed_on_purpose:
                continue
            crash = self._expected_crash(pid, code)
            if crash is not None:
                crash.killed_at = time.monotonic()
                crash.done = crash.spec.restart_at_round is None
                self._event("crashed", pid, round=crash.spec.at_round, phase=crash.spec.phase,
                            restart_at_round=crash.spec.restart_at_round)
                continue
            self._event("exit", pid, code=code)
            if code == COHORT_TOO_SMALL_EXIT_CODE:
                # It finished, but shared with too few peers (see node.allow_solo).
                self.failures.append(f"{pid} finished without its cohort")
                continue
            if code != 0:
                log_path = Path(pp.plan.config.run_dir) / "peer.log"
                # (a signal from outside says so: "exited with status 143" read as a fault
                # of the peer's own, a review)
                by = {143: " (stopped by a SIGTERM not sent by hfl-launch)",
                      130: " (stopped by a SIGINT not sent by hfl-launch)",
                      -9: " (killed by SIGKILL)", 137: " (killed by SIGKILL)"}.get(code, "")
                self.failures.append(f"{pid} exited with status {code}{by}")
                # Failures are reported even with progress off, on stderr.
                self._say(f"hfl-launch: {pid} exited with status {code}{by}; last lines of {log_path}:\n"
                          f"{_tail(log_path, 15)}")
                self._read_metrics(pp)  # (a row written just before it exited counts)
                if not pp.went_on:
                    # It never got going (bad data path, bad architecture, a share
                    # that does not fit a message, a damaged checkpoint on resume: it
                    # read as going, by the rounds of an earlier launch): the others
                    # would only wait out their join timeout, or train alone. Stop them now.
                    self._say(f"hfl-launch: {pid} failed before it finished a round in this "
                              "launch; stopping the cohort")
                    self.stop_all()


def eta_text(mean_round_s: float | None, rounds_left: int) -> str:
    """``, ETA 1m25s``: the rounds left at the mean round time so far ("" before the
    first round ends and after the last)."""
    if mean_round_s is None or rounds_left <= 0:
        return ""
    s = round(mean_round_s * rounds_left)
    h, m = divmod(s // 60, 60)
    return f", ETA {h}h{m:02d}m" if h else f", ETA {m}m{s % 60:02d}s" if m else f", ETA {s}s"


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _stops_deferred():
    """Ctrl-C, SIGTERM and SIGHUP wait until the block is done, then stop the launch as
    they would have: one arriving between the template's fork of a peer and its record
    in ``pp.proc`` left a peer nobody stopped (it held the terminal's pipe through
    multiprocessing's resource tracker). Python handlers, not a signal mask: the
    kernel may hand a signal to another thread of this process."""
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught:
        handler = previous[caught[0]]
        if callable(handler):
            handler(caught[0], None)
        elif handler != signal.SIG_IGN:
            raise KeyboardInterrupt


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"
