"""End to end, as a user meets it: the real ``hfl-launch`` / ``hfl-peer`` processes.
Each case used to give a wrong or solo result with exit 0 and nothing on the
console; each now fails loudly (or does the right thing). Two peers, few rounds."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import free_tcp_port

from tests.test_e2e import ctrl_c_reaches_it

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TIMING = {"heartbeat_interval_s": 0.2, "suspect_after_s": 0.8, "dead_after_s": 1.6,
          "round_timeout_s": 15, "aggregate_grace_s": 5, "join_timeout_s": 60}


def experiment(tmp_path: Path, rounds: int, peers: int = 2, timing=None, **extra) -> Path:
    exp = {
        "name": "users",
        "peers": peers,
        "run_dir": str(tmp_path / "run"),
        "defaults": {
            "cohort": {"algorithm": "fedavg", "rounds": rounds},
            "data": {"dataset": "digits", "partition": "iid"},
            "model": {"arch": "mlp", "options": {"hidden": [32]}},
            "train": {"max_batches": 2},
            "timing": {**TIMING, **(timing or {})},
        },
        **extra,
    }
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def launch(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfl.launch.cli", str(path), "--quiet", *args],
                          capture_output=True, text=True, timeout=200)


def metrics(run: Path, peer: str) -> list[dict]:
    return [json.loads(x) for x in (run / peer / "metrics.jsonl").read_text().splitlines()]


def wait_for(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # an external process reaching a state
    assert path.exists(), path


def all_gone(run: Path) -> None:
    events = json.loads((run / "results.json").read_text())["events"]
    for pid in [e["pid"] for e in events if e["event"] == "start"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_an_interrupted_launch_resumes_on_its_ports_as_one_cohort_and_a_rerun_is_refused(tmp_path):
    run = tmp_path / "run"
    path = experiment(tmp_path, rounds=10_000)
    proc = subprocess.Popen([sys.executable, "-m", "hfl.launch.cli", str(path), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_reaches_it)
    wait_for(run / "p0" / "metrics.jsonl")
    wait_for(run / "p1" / "metrics.jsonl")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    record = json.loads((run / "launch.json").read_text())
    assert record["state"] == "interrupted" and len(record["ports"]) == 2
    done = max(metrics(run, p)[-1]["round"] for p in ("p0", "p1"))

    # The same command again resumes (same experiment, interrupted) ...
    more = f"defaults.cohort.rounds={done + 4}"
    resumed = launch(path, "--resume", "--set", more)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "--resume: continuing the interrupted run" in resumed.stdout
    # ... on the ports the checkpoints remember, so the peers meet again: the rounds
    # after the restart were shared by both (before: new ports, each peer alone).
    listens = [yaml.safe_load((run / "peers" / f"{p}.yaml").read_text())["node"]["listen"]
               for p in ("p0", "p1")]
    assert listens == [f"tcp://127.0.0.1:{port}" for port in record["ports"]]
    for p in ("p0", "p1"):
        after = [r for r in metrics(run, p) if r["incarnation"] == 1]
        assert after and max(r["live_peers"] for r in after) == 2, after
        assert (run / p / "peer.log.1").exists()  # the first launch's log, kept

    # Finished now: the same command is refused in one line, as is a changed one.
    again = launch(path, "--set", more)
    assert again.returncode == 2 and "holds a finished run" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    changed = launch(path, "--set", more, "--set", "defaults.train.lr=0.5")
    assert changed.returncode == 2 and "defaults.train.lr" in changed.stderr


def test_peers_that_refuse_each_other_are_refused_by_the_launcher_and_say_why_alone(tmp_path):
    run = tmp_path / "run"
    # join_timeout_s: longer than one peer may take to start after the other on a busy
    # machine (3 s failed when one started 2-5 s later, beside other test runs)
    path = experiment(tmp_path, rounds=2, timing={"join_timeout_s": 8},
                      peer_overrides={"p1": {"cohort": {"num_classes": 12}}})
    # The launcher sees that p1's hello would be refused: it says so before starting
    # anyone (issue 18: this cost a full join timeout), naming the field and the peers.
    proc = launch(path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cohort.num_classes: peers disagree (p0 10, p1 12)" in proc.stderr
    assert not (run / "launch.json").exists() and not (run / "p0").exists()
    assert not (run / "peers").exists()  # a refused launch writes nothing (not even configs)
    # Organisations starting their own peers, p1's config with another num_classes: each
    # refusal is named on the console with its reason, and neither ends as if it had
    # been federated. (The configs: a dry run of the agreeing experiment writes them.)
    assert launch(experiment(tmp_path, rounds=2, timing={"join_timeout_s": 8}),
                  "--dry-run").returncode == 0
    p1 = yaml.safe_load((run / "peers" / "p1.yaml").read_text())
    p1["cohort"]["num_classes"] = 12
    (run / "peers" / "p1.yaml").write_text(yaml.safe_dump(p1))
    procs = {pid: subprocess.Popen(
        [sys.executable, "-m", "hfl.peer.cli", "--config", str(run / "peers" / f"{pid}.yaml"),
         "--set", "node.min_peers=2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for pid in ("p0", "p1")}
    out = {pid: p.communicate(timeout=120) for pid, p in procs.items()}
    codes = {pid: p.returncode for pid, p in procs.items()}
    assert codes == {"p0": 3, "p1": 3}, out
    assert "num_classes differs" in out["p1"][1]  # p0's reply to p1's hello, on p1's console
    assert "hello from p1: num_classes differs" in out["p0"][1]
    summary = json.loads((run / "p1" / "summary.json").read_text())
    assert summary["cohort_shortfall"]


@pytest.mark.parametrize("start", ["forkserver", "process"])
def test_ctrl_c_through_a_closed_pipe_still_stops_the_peers_and_writes_results(tmp_path, start):
    run = tmp_path / "run"
    path = experiment(tmp_path, rounds=10_000)
    # `hfl-launch ... 2>&1 | tee log` and Ctrl-C: tee dies with the launcher's pipe.
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "hfl.launch.cli", str(path), "--start", start],
                            stdout=write_fd, stderr=write_fd, preexec_fn=ctrl_c_reaches_it)
    os.close(write_fd)
    wait_for(run / "p0" / "metrics.jsonl")
    os.close(read_fd)  # the pipe's reader is gone: every later write fails with EPIPE
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    all_gone(run)
    results = json.loads((run / "results.json").read_text())
    assert results["failures"] == ["interrupted"]
    assert json.loads((run / "launch.json").read_text())["state"] == "interrupted"


def peer_config(tmp_path: Path, **node) -> Path:
    cfg = {"node": {"id": "a", "run_dir": str(tmp_path / "a"), **node},
           "security": {"mode": "none"},
           "cohort": {"algorithm": "fedavg", "rounds": 1},
           "model": {"arch": "mlp", "options": {"hidden": [8]}},
           "train": {"max_batches": 1},
           "timing": {**TIMING, "join_timeout_s": 6}}
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_hfl_peer_on_a_port_in_use_says_so_in_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "hfl.peer.cli", "--config",
             str(peer_config(tmp_path, listen=f"tcp://127.0.0.1:{port}"))],
            capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"hfl-peer: a: cannot listen on tcp://127.0.0.1:{port}: the port is in use (another peer, an "
        "earlier run still stopping, or another program); choose another port in node.listen, or "
        "port 0 for any free one"]


def test_hfl_peer_with_nobody_at_the_bootstrap_address_warns_early_and_fails(tmp_path):
    # The default min_peers (1): before issue 18 it trained every round alone, then exited 3.
    nowhere = f"tcp://127.0.0.1:{free_tcp_port()}"  # a port nobody listens on
    proc = subprocess.run(
        [sys.executable, "-m", "hfl.peer.cli", "--config",
         str(peer_config(tmp_path, bootstrap=[nowhere]))],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert f"no answer from {nowhere} after 5s" in proc.stderr
    assert f"no other peer joined within timing.join_timeout_s=6s (bootstrap {nowhere}" in proc.stderr
    assert "--allow-solo" in proc.stderr
    assert not (tmp_path / "a" / "metrics.jsonl").exists()  # it stopped before round 1
    # Its summary and where it is, on stdout.
    assert f"summary in {tmp_path / 'a' / 'summary.json'}" in proc.stdout


def test_a_forked_peer_writes_its_log_and_returns_its_exit_status(tmp_path):
    from hfl.launch.zygote import ForkedPeer

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"node": {"id": "a"}, "cohort": {"rounds": 0}}))
    peer = ForkedPeer(bad, {"OMP_NUM_THREADS": "1"}, tmp_path / "peer.log")
    assert peer.wait(timeout=120) == 2 and peer.poll() == 2 and peer.returncode == 2
    assert "hfl-peer: invalid config: cohort.rounds" in (tmp_path / "peer.log").read_text()


def start_pair(tmp_path: Path, rounds: int) -> list[subprocess.Popen]:
    """Two real hfl-peer processes, p0 and p1 (plaintext, loopback), FedAvg on digits."""
    ports = [free_tcp_port(), free_tcp_port()]
    paths = []
    for i in range(2):
        cfg = {"node": {"id": f"p{i}", "listen": f"tcp://127.0.0.1:{ports[i]}",
                        "bootstrap": [f"tcp://127.0.0.1:{ports[0]}"] if i else [],
                        "run_dir": str(tmp_path / f"p{i}"), "min_peers": 2},
               "security": {"mode": "none"},
               "cohort": {"algorithm": "fedavg", "rounds": rounds},
               "data": {"dataset": "digits", "partition": "iid", "num_partitions": 2,
                        "partition_index": i},
               "model": {"arch": "mlp", "options": {"hidden": [16]}},
               "train": {"max_batches": 1},
               "timing": TIMING}
        paths.append(tmp_path / f"p{i}.yaml")
        paths[-1].write_text(yaml.safe_dump(cfg))
    return [subprocess.Popen([sys.executable, "-m", "hfl.peer.cli", "--config", str(p)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for p in paths]


def test_a_pair_whose_partner_is_sigkilled_from_outside_does_not_exit_0_as_if_federated(tmp_path):
    # Two hfl-peer processes; once p0 has recorded round 1, p1 is SIGKILLed and
    # stays dead. p0 runs every round, but after the kill no aggregate reaches the
    # quorum: most of its result is training alone, and it says so with status 3.
    rounds = 40  # the kill lands within the first few rounds, whatever the machine's load
    procs = start_pair(tmp_path, rounds)
    try:
        wait_for(tmp_path / "p0" / "metrics.jsonl")
        procs[1].send_signal(signal.SIGKILL)
        _, err = procs[0].communicate(timeout=180)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[1].returncode == -signal.SIGKILL
    assert procs[0].returncode == 3, err
    assert "learned from no other peer in" in err and "allow_solo" in err
    # Issue 36: the kill dropped p1's connection, and p0 declared it dead on that hint
    # (two heartbeats of silence), not after dead_after_s.
    assert any(f"p1 {was} -> dead (its link dropped" in err for was in ("alive", "suspect")), err
    p0 = metrics(tmp_path, "p0")
    assert [r["round"] for r in p0] == list(range(1, rounds + 1))  # it kept working
    assert p0[0]["learned_from"] == 1 and p0[-1]["learned_from"] == 0
    summary = json.loads((tmp_path / "p0" / "summary.json").read_text())
    assert "learned from no other peer" in summary["cohort_shortfall"]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["sigterm", "ctrl-c"])
def test_a_stopped_peer_says_goodbye_and_exits_with_its_signals_status(tmp_path, sig, code):
    # Issue 30: SIGTERM took 19-30 s and exited 130. From outside, as a scheduler stops a
    # peer: the partner hears a goodbye (not a silence taken for a death), the peer exits
    # 128 + the signal with one line saying where its rounds are, and its checkpoint
    # holds the last round it recorded (what a restart resumes after).
    from hfl.peer.checkpoint import load_checkpoint

    procs = start_pair(tmp_path, 400)
    try:
        wait_for(tmp_path / "p1" / "metrics.jsonl")
        procs[1].send_signal(sig)
        _, err1 = procs[1].communicate(timeout=60)
        after = len(metrics(tmp_path, "p0"))
        deadline = time.monotonic() + 120
        while len(metrics(tmp_path, "p0")) < after + 2 and procs[0].poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.2)  # the partner, another process, goes on alone for two rounds
        procs[0].send_signal(signal.SIGTERM)
        _, err0 = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[1].returncode == code, err1
    assert f"stopped by {signal.Signals(sig).name}" in err1 and "hfl-report" in err1
    assert "Traceback" not in err1
    # its goodbye, not a silence taken for death (from alive, or suspect where a loaded
    # machine had delayed its heartbeats a moment before: the full suite beside reviews)
    assert re.search(r"p1 (alive|suspect) -> left \(left\)", err0), err0[-3000:]
    assert "p1 alive -> dead" not in err0 and procs[0].returncode == 143, err0
    rows = metrics(tmp_path, "p1")
    assert rows and load_checkpoint(tmp_path / "p1")["round"] == rows[-1]["round"]


def test_a_forked_peer_runs_on_when_its_template_dies_and_its_real_status_is_read(tmp_path):
    # A review: the template's death made every forked peer read as exited with 255; the
    # launcher reported three healthy peers as failed and stopped the run. The launcher
    # adopts them now (a subreaper): the peer runs on, and its own status is read.
    from multiprocessing import forkserver

    from hfl.launch.zygote import ForkedPeer
    from hfl.peer.status import process_alive

    cfg = tmp_path / "wait.yaml"  # a peer that waits for a cohort that never comes
    cfg.write_text(yaml.safe_dump({
        "node": {"id": "a", "listen": "tcp://127.0.0.1:0", "run_dir": str(tmp_path / "a"),
                 "min_peers": 2, "bootstrap": [f"tcp://127.0.0.1:{free_tcp_port()}"]},
        "security": {"mode": "none"}, "cohort": {"algorithm": "fedavg", "rounds": 2},
        "timing": {"join_timeout_s": 300}, "data": {"dataset": "digits"},
        "model": {"arch": "mlp"}}))
    peer = ForkedPeer(cfg, {"OMP_NUM_THREADS": "1"}, tmp_path / "peer.log")
    log = lambda: (tmp_path / "peer.log").read_text(errors="replace") if (tmp_path / "peer.log").exists() else ""  # noqa: E731
    deadline = time.monotonic() + 120
    while "listening on" not in log():
        assert peer.poll() is None and time.monotonic() < deadline, log()
        time.sleep(0.1)
    template = forkserver._forkserver._forkserver_pid
    os.kill(template, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_alive(template, None) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # (its sentinel closed: the peer read as exited here before)
    assert peer.poll() is None and process_alive(peer.pid, peer.started)
    peer.send_signal(signal.SIGTERM)
    assert peer.wait(timeout=60) == 143 and peer.returncode == 143  # hfl-peer's own status
