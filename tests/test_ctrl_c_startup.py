"""Ctrl-C during start-up: one line, no traceback, nothing left running, and the
run's record not left at ``running``.

Start-up is the likeliest moment for a Ctrl-C (the first seconds print little), and
a terminal sends SIGINT to the whole foreground process group: the launcher, the
template process importing torch, and peers not yet in their own session. The
launcher here runs in a process group of its own and the whole group gets SIGINT,
as from a terminal, at three moments: while the template is being started, right
after the plan line, and while the peers start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def as_a_terminal_job() -> None:
    os.setsid()  # its own process group, which the test signals as a terminal would
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _sigint_blocked(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    blocked = int(next(x for x in status.splitlines() if x.startswith("SigBlk:")).split()[1], 16)
    return bool(blocked & (1 << (signal.SIGINT - 1)))


def wait_gone(pids: list[int], timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("moment", ["template", "plan", "peers"])
def test_ctrl_c_during_start_up_is_one_line_and_leaves_nothing_running(tmp_path, moment):
    exp = {"name": "ctrlc", "peers": 3, "run_dir": str(tmp_path / "run"),
           "defaults": {"cohort": {"algorithm": "fedavg", "rounds": 50},
                        "data": {"dataset": "digits", "partition": "iid"},
                        "model": {"arch": "mlp", "options": {"hidden": [16]}}}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    proc = subprocess.Popen([sys.executable, "-m", "hfl.launch.cli", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=as_a_terminal_job)
    seen, started = [], []
    deadline = time.monotonic() + 90
    if moment == "template":  # its first child: the template being spawned
        while not children(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
    else:
        for line in proc.stdout:
            seen.append(line)
            if moment == "plan" and line.startswith("hfl-launch: ctrlc:"):
                break
            if moment == "peers" and " start p" in line:
                started.append(int(line.split("pid=")[1].split()[0]))
                break
            assert time.monotonic() < deadline
    kids = children(proc.pid)
    if moment != "template":  # the template, importing torch or serving, never takes SIGINT
        template = [k for k in kids if b"forkserver" in _cmdline(k)]
        assert template and all(_sigint_blocked(k) for k in template), (kids, template)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    lines = [x for x in out.splitlines() if x.strip()]
    assert proc.returncode == 130, "".join(seen) + out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    # Besides the live progress ("[  1.2s] ...") and the table, a few lines (81 before).
    said = [x for x in lines if not x.startswith(("[", "|"))]
    assert len(said) <= 10, out
    assert any(x.startswith("hfl-launch: interrupted") or "interrupted: stopping the peers" in x
               for x in lines), out
    record = tmp_path / "run" / "launch.json"
    if record.exists():
        assert json.loads(record.read_text())["state"] == "interrupted"
    assert moment != "peers" or record.exists()
    assert wait_gone(kids + started) == []


def test_a_sigkilled_launcher_leaves_nothing_running_and_the_same_command_resumes(tmp_path):
    # `kill -9` of hfl-launch (an OOM killer, a closed terminal's SIGKILL): its peers
    # watch it and stop (peer/cli.watch_launcher), the template exits with it, nothing
    # holds the run's ports or locks, and the same command with --resume goes on from
    # the peers' checkpoints. Before the watch, the peers trained on for nobody and a
    # later --fresh had an orphan writing the old run's rounds into the new one.
    run = tmp_path / "run"
    exp = {"name": "killed", "peers": 2, "run_dir": str(run),
           "defaults": {"cohort": {"algorithm": "fedavg", "rounds": 5000},
                        "data": {"dataset": "digits", "partition": "iid"},
                        "model": {"arch": "mlp", "options": {"hidden": [16]}}}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    proc = subprocess.Popen([sys.executable, "-m", "hfl.launch.cli", str(path), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=as_a_terminal_job)
    deadline = time.monotonic() + 90

    def rounds(pid: str) -> int:
        try:
            return len((run / pid / "metrics.jsonl").read_text().splitlines())
        except OSError:
            return 0

    while not all(rounds(p) >= 2 for p in ("p0", "p1")):  # both peers past round 1
        assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)
    peers = [int((run / p / ".lock").read_text()) for p in ("p0", "p1")]  # (the pid inside)
    template = [k for k in children(proc.pid) if b"forkserver" in _cmdline(k)]
    assert template and all(alive(p) for p in peers)
    proc.kill()
    proc.wait()
    assert wait_gone(peers + template, timeout_s=60) == []
    done = max(rounds("p0"), rounds("p1"))
    assert done < 5000
    # The same command, resumed for a few more rounds than were run: it starts (nothing
    # holds the folder, its ports or its lock) and goes on from the checkpoints.
    resumed = subprocess.run(
        [sys.executable, "-m", "hfl.launch.cli", str(path), "--quiet", "--resume",
         "--set", f"defaults.cohort.rounds={done + 3}"], capture_output=True, text=True,
        timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads((run / "launch.json").read_text())["state"] == "finished"
    last = [json.loads(x)["round"] for x in (run / "p0" / "metrics.jsonl").read_text().splitlines()]
    assert last[-1] == done + 3 and len(set(last)) == len(last)  # no round written twice
