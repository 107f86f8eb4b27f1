"""Start peers from a template process that imported torch once (a zygote).

Every ``hfl-peer`` process pays ``import torch`` (about 3.5 s alone on 2 cores,
far more when 16 start at once) before it does anything. Here the launcher
starts one template with Python's ``forkserver``: it imports torch, numpy,
pyzmq, scikit-learn and hfl's peer modules (and the experiment's algorithm) once,
then forks one child per peer. A child shares the template's memory pages
copy-on-write and runs exactly what ``hfl-peer --config <file>`` runs (the same
:func:`hfl.peer.cli.main`), in its own session, with its stdout/stderr in its
``peer.log`` and the plan's environment (threads, ``CUDA_VISIBLE_DEVICES``).

CUDA: the template never touches a GPU (importing torch does not initialise
CUDA), so each forked peer initialises CUDA itself, after its
``CUDA_VISIBLE_DEVICES`` is set. ``hfl-launch --start process`` keeps one fresh
interpreter per peer (the old way, e.g. to rule the template out when
debugging).

:class:`ForkedPeer` gives the supervisor the few ``subprocess.Popen`` methods it
uses (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Imported once in the template. Heavy, and needed by every peer.
PRELOAD = [
    "torch",
    "torch.optim",
    "torch._dynamo",  # imported by the first optimizer: 2-3 s per peer otherwise
    "numpy",
    "zmq",
    "msgpack",
    "yaml",
    "sklearn.datasets",
    "hfl.models",
    "hfl.data",
    "hfl.peer.cli",
    "hfl.peer.runner",
    "hfl.peer.factory",
    "hfl.algorithms.base",
]

_CONTEXT = None


def context(extra_modules: list[str] = ()):
    """The forkserver context, its preload list set (once per launcher process)."""
    global _CONTEXT
    if _CONTEXT is None:
        # The launcher adopts the peers if the template dies (Linux): their exit status
        # is then ours to read (ForkedPeer.poll), not an "exit 255" of a peer that runs on.
        become_subreaper()
        # If anything in the template asks torch.cuda.is_available(), answer from NVML
        # without initialising the CUDA driver (a driver initialised before fork is
        # unusable in the children).
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload([*PRELOAD, *extra_modules])
    return _CONTEXT


def become_subreaper() -> bool:
    """Orphans of our descendants become our children (Linux PR_SET_CHILD_SUBREAPER):
    their exit status is ours to read, their CPU ours to count (bench/_common.py)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def start_template(extra_modules: list[str] = ()) -> None:
    """Start the template now, so that it imports torch while the launcher checks the
    experiment (both need a core; the peers need both done)."""
    from multiprocessing import forkserver

    context(extra_modules)
    forkserver.ensure_running()


def stop_template() -> None:
    """End a template started for a launch that will not happen (a config error found
    by the checks), instead of letting it finish importing torch for nobody."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def preload_for(algorithm: str) -> list[str]:
    """The built-in algorithm's module, to preload with the rest (plugins load in the peer)."""
    from hfl.algorithms.registry import CATALOG

    return [CATALOG[algorithm]] if algorithm in CATALOG else []


def _peer_main(config_path: str, env: dict[str, str], log_path: str) -> None:
    """The forked child: become hfl-peer for one config."""
    os.setsid()  # own session: Ctrl-C reaches the launcher only; it stops the peers
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's stdout
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.update(env)
    # SIGINT is blocked in the template; one pending since the fork was a Ctrl-C for the
    # launcher's process group (this peer was not in its own session yet): dropped.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from hfl.peer.cli import exit_now, main

    exit_now(main(["--config", config_path, "--no-plot"]))  # the launcher plots the whole run


_RUNNING = object()  # ForkedPeer._orphan: the adopted peer still runs


class ForkedPeer:
    """A peer forked from the template, behind the Popen methods the supervisor uses."""

    def __init__(self, config_path: Path, env: dict[str, str], log_path: Path,
                 extra_modules: list[str] = ()):
        ctx = context(extra_modules)
        self._proc = ctx.Process(target=_peer_main, args=(str(config_path), env, str(log_path)),
                                 daemon=False)
        self._proc.start()
        self.pid = self._proc.pid
        from hfl.peer.status import process_started

        self.started = process_started(self.pid)  # (with the pid: this peer, not a reuse)
        self._code: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._code

    def poll(self) -> int | None:
        """Its exit status, or None while it runs. Its template reaps it and reports the
        status; when the template died first, the peer reads as exited with 255 while it
        trains on (a review: the launcher reported three healthy peers as failed and
        stopped the run): it runs on, adopted by this launcher (:func:`context`), whose
        child it is now, or is watched by its pid where no adoption was possible."""
        if self._code is not None:
            return self._code
        if self._proc.is_alive():
            return None
        code = self._proc.exitcode
        if code == 255:  # (its template's end reads so too)
            orphan = self._orphan()
            if orphan is _RUNNING:
                return None
            code = code if orphan is None else orphan
        self._code = code
        return code

    def _orphan(self):
        """The adopted peer's exit status, :data:`_RUNNING`, or None (not an orphan of
        ours: its template reaped it, and 255 is its own status)."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            from hfl.peer.status import process_alive

            alive = self.started is not None and process_alive(self.pid, self.started)
            return _RUNNING if alive else None
        return _RUNNING if pid == 0 else os.waitstatus_to_exitcode(status)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._proc.join(timeout)
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"peer pid {self.pid}", timeout)
            time.sleep(0.05)
        return self._code

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):  # (gone; its pid another user's)
            pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
