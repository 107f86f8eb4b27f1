"""Spawn the peers of an experiment, follow their progress, inject process faults.

The launcher is not part of the cohort: peers find each other by themselves.
It only starts processes, reads the metrics lines they append, kills and
restarts peers when the experiment asks for it, and stops everything on
Ctrl-C or timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hfl.launch.experiment import ExperimentConfig, FaultSpec, PeerPlan

POLL_S = 0.1
CRASH_EXIT_CODE = 137  # FaultConfig.exit_code's default


@dataclass
class PeerProc:
    plan: PeerPlan
    proc: subprocess.Popen | None = None
    log: IO | None = None
    metrics_offset: int = 0
    last_round: int = 0  # last round with a metrics line
    last: dict[str, Any] = field(default_factory=dict)
    starts: int = 0
    killed_on_purpose: bool = False
    exit_codes: list[int] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def metrics_path(self) -> Path:
        return Path(self.plan.config.run_dir) / "metrics.jsonl"


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
    def __init__(self, exp: ExperimentConfig, plans: list[PeerPlan], out: IO = sys.stdout,
                 progress: bool = True):
        self.exp = exp
        self.peers = {p.id: PeerProc(p) for p in plans}
        self.rounds = plans[0].config.cohort.rounds
        self.faults = [FaultState(f, target=exp.fault_target(f)) for f in exp.faults]
        self.out = out
        self.progress = progress
        self.events: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self._t0 = time.monotonic()
        self._last_line = ""

    # ----------------------------------------------------------------- processes

    def _start(self, pp: PeerProc) -> None:
        run_dir = Path(pp.plan.config.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if pp.log is None:
            pp.log = open(run_dir / "peer.log", "ab")  # noqa: SIM115 - closed in _close_logs
        env = {**os.environ, **pp.plan.env, "PYTHONUNBUFFERED": "1"}
        pp.proc = subprocess.Popen(
            [sys.executable, "-m", "hfl.peer.cli", "--config", str(pp.plan.config_path)],
            stdout=pp.log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # Ctrl-C reaches the launcher only; it stops the peers
        )
        pp.starts += 1
        pp.killed_on_purpose = False
        self._event("start", pp.plan.id, pid=pp.proc.pid, start=pp.starts)

    def stop_all(self, grace_s: float = 10.0) -> None:
        for pp in self.peers.values():
            if pp.running:
                pp.killed_on_purpose = True  # its exit status is ours, not a failure
                pp.proc.send_signal(signal.SIGTERM)
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
        path = pp.metrics_path
        try:
            with path.open("rb") as f:
                f.seek(pp.metrics_offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n")
        if end < 0:
            return
        pp.metrics_offset += end + 1
        for line in chunk[: end + 1].splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            pp.last_round = max(pp.last_round, int(rec.get("round", 0)))
            pp.last = rec

    def _event(self, kind: str, peer: str, **info: Any) -> None:
        ev = {"t": round(time.monotonic() - self._t0, 3), "event": kind, "peer": peer, **info}
        self.events.append(ev)
        self._print(f"[{ev['t']:7.1f}s] {kind} {peer} " + " ".join(f"{k}={v}" for k, v in info.items()),
                    newline=True)

    def _print(self, line: str, newline: bool = False) -> None:
        """On a terminal, redraw one status line; in a log, print it when it changes."""
        if not self.progress:
            return
        tty = hasattr(self.out, "isatty") and self.out.isatty()
        content = line.split("]", 1)[-1]  # ignore the clock when deciding what changed
        if tty:
            self.out.write("\r\033[K" + line + ("\n" if newline else ""))
        elif newline or content != self._last_line:
            self.out.write(line + "\n")
        self._last_line = content
        self.out.flush()

    def _progress_line(self) -> str:
        parts = []
        for pid, pp in self.peers.items():
            acc = pp.last.get("global_acc", pp.last.get("test_acc"))
            state = "" if pp.running or pp.last_round >= self.rounds else "(down)"
            acc_s = f"{acc:.3f}" if isinstance(acc, (int, float)) else "-"
            parts.append(f"{pid} r{pp.last_round} {acc_s}{state}")
        done = min(pp.last_round for pp in self.peers.values())
        return f"[{time.monotonic() - self._t0:6.1f}s] round {done}/{self.rounds} | " + " | ".join(parts)

    # ----------------------------------------------------------------- faults

    def _cohort_round(self) -> int:
        """The round the cohort is in: one past the most advanced peer's last line."""
        return max(pp.last_round for pp in self.peers.values()) + 1

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
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            return self._run()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _run(self) -> LaunchOutcome:
        for pp in self.peers.values():
            self._start(pp)
        deadline = self._t0 + self.exp.timeout_s
        try:
            while True:
                for pp in self.peers.values():
                    self._read_metrics(pp)
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
            self._print("interrupted: stopping peers", newline=True)
            self.stop_all()
            self.failures.append("interrupted")
        finally:
            for pp in self.peers.values():
                self._read_metrics(pp)
            self._close_logs()
        self._print(self._progress_line(), newline=True)
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
            if code != 0:
                log_path = Path(pp.plan.config.run_dir) / "peer.log"
                self.failures.append(f"{pid} exited with status {code}")
                # Failures are reported even with progress off, on stderr.
                print(f"hfl-launch: {pid} exited with status {code}; last lines of {log_path}:\n"
                      f"{_tail(log_path, 15)}", file=sys.stderr, flush=True)
                if pp.last_round == 0:
                    # It never got going (bad data path, bad architecture...): the
                    # others would only wait out their join timeout. Stop them now.
                    print(f"hfl-launch: {pid} failed at start-up; stopping the cohort",
                          file=sys.stderr, flush=True)
                    self.stop_all()


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"
