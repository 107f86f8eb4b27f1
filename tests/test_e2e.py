"""End to end: the real ``hfl-launch`` spawning real ``hfl-peer`` processes over
ZeroMQ on loopback (random free ports). Faults are injected at exact points by
the peers themselves (see FaultConfig), so these runs are deterministic in what
they assert: which rounds complete, who aggregates, who resumes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

FAST_TIMING = {
    "heartbeat_interval_s": 0.2,
    "suspect_after_s": 0.8,
    "dead_after_s": 1.6,
    "round_timeout_s": 15,
    "aggregate_grace_s": 5,
    "join_timeout_s": 60,
}


def experiment(tmp_path: Path, rounds: int, faults=(), train=None, timing=None, defaults=None,
               **extra) -> Path:
    exp = {
        "name": "e2e",
        "peers": 4,
        "run_dir": str(tmp_path / "run"),
        "defaults": {  # a section in ``defaults`` updates the base section's keys
            section: {**base, **(defaults or {}).get(section, {})}
            for section, base in {
                # The elected aggregator's protocol (rotation, fail-over); auto would have
                # these 4 peers aggregate for themselves.
                "cohort": {"algorithm": "fedavg", "rounds": rounds, "aggregate_at": "aggregator"},
                "data": {"dataset": "digits", "partition": "dirichlet", "alpha": 0.5},
                "model": {"arch": "mlp", "options": {"hidden": [64]}},
                "train": train or {"max_batches": 4},
                "timing": {**FAST_TIMING, **(timing or {})},
            }.items()
        },
        "faults": list(faults),
        **extra,
    }
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def ctrl_c_reaches_it() -> None:
    """In a launcher started to be sent SIGINT: take SIGINT as a terminal's Ctrl-C, even
    when these tests run with it ignored (a job started with & by a non-interactive
    shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def launch(path: Path, *args: str, timeout: float = 200) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hfl.launch.cli", str(path), "--quiet", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def metrics(tmp_path: Path, peer: str) -> list[dict]:
    lines = (tmp_path / "run" / peer / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_clean_run_every_peer_finishes_and_the_table_is_written(tmp_path):
    proc = launch(experiment(tmp_path, rounds=4))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    peers = {row["peer"]: row for row in results["peers"]}
    assert set(peers) == {"p0", "p1", "p2", "p3", "mean"}
    for pid in ("p0", "p1", "p2", "p3"):
        assert peers[pid]["rounds"] == 4
        rounds = metrics(tmp_path, pid)
        assert [r["round"] for r in rounds] == [1, 2, 3, 4]
        assert all(r["bytes_sent"] > 0 for r in rounds)
    # FedAvg: every peer ends on the same averaged model.
    assert len({peers[p]["global_acc"] for p in ("p0", "p1", "p2", "p3")}) == 1
    assert "| mean" in proc.stdout and (tmp_path / "run" / "results.md").exists()
    # Aggregation rotated over the cohort.
    assert {r["aggregator"] for r in metrics(tmp_path, "p0")} == {"p1", "p2", "p3", "p0"}


def test_aggregator_killed_mid_round_round_completes_under_the_next_one(tmp_path):
    # Round 3's aggregator is p3 (rotation: sorted ids[3 % 4]); it dies holding
    # everyone's weights, after collecting them and before sending the result.
    proc = launch(experiment(tmp_path, rounds=5,
                             faults=[{"peer": "aggregator", "at_round": 3, "phase": "serve"}]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "injected crash in round 3 (serve)" in (tmp_path / "run" / "p3" / "peer.log").read_text()
    for pid in ("p0", "p1", "p2"):
        rounds = {r["round"]: r for r in metrics(tmp_path, pid)}
        assert sorted(rounds) == [1, 2, 3, 4, 5]
        r3 = rounds[3]
        assert r3["aggregator"] == "p0" and r3["epoch"] == 1  # the next live peer in the rotation
        # Within its deadlines: the wait for the dead aggregator ended on failure
        # detection, long before the round timeout.
        assert r3["round_time_s"] < FAST_TIMING["round_timeout_s"]
        assert rounds[4]["aggregator"] != "p3" and rounds[5]["aggregator"] != "p3"
    finals = {metrics(tmp_path, p)[-1]["global_acc"] for p in ("p0", "p1", "p2")}
    assert len(finals) == 1


def test_a_crashed_peer_is_dead_on_its_dropped_link_long_before_dead_after_s(tmp_path):
    # Issue 36: a peer killed without a goodbye was dead to the others only after
    # dead_after_s of silence (here 8 s), and each round waited that long for it. Its
    # connections drop at once (the kernel closes them): the others probe it at that
    # hint and declare it dead when nothing answers within two heartbeats.
    dead_after = 8.0
    proc = launch(experiment(tmp_path, rounds=5, faults=[{"peer": "p3", "at_round": 3}],
                             timing={"suspect_after_s": 4.0, "dead_after_s": dead_after,
                                     "round_timeout_s": 30}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "injected crash in round 3 (train)" in (tmp_path / "run" / "p3" / "peer.log").read_text()
    for pid in ("p0", "p1", "p2"):
        log_text = (tmp_path / "run" / pid / "peer.log").read_text()
        assert any(f"p3 {was} -> dead (its link dropped" in log_text
                   for was in ("alive", "suspect")), log_text[-3000:]
        rounds = {r["round"]: r for r in metrics(tmp_path, pid)}
        assert sorted(rounds) == [1, 2, 3, 4, 5]
        assert rounds[3]["round_time_s"] < dead_after / 2, rounds[3]  # not dead_after_s


def test_a_lazy_join_cohort_runs_every_round_and_survives_its_aggregator_crashing(tmp_path):
    # timing.join: lazy over real sockets: members vouched for by the bootstrap count
    # without a handshake, a member is greeted by its first probe, and the round 3
    # aggregator's crash is still seen (the others' probes of it go unanswered).
    proc = launch(experiment(tmp_path, rounds=5, peers=6,
                             faults=[{"peer": "aggregator", "at_round": 3, "phase": "serve"}],
                             timing={"membership": "swim", "join": "lazy"}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    crashed = [p for p in ("p0", "p1", "p2", "p3", "p4", "p5")
               if "injected crash" in (tmp_path / "run" / p / "peer.log").read_text()]
    assert len(crashed) == 1
    survivors = [p for p in ("p0", "p1", "p2", "p3", "p4", "p5") if p not in crashed]
    for pid in survivors:
        rounds = {r["round"]: r for r in metrics(tmp_path, pid)}
        assert sorted(rounds) == [1, 2, 3, 4, 5]
        assert rounds[3]["epoch"] == 1 and rounds[3]["aggregator"] != crashed[0]
        assert rounds[1]["met_peers"] >= 1  # (heard from directly: the bootstrap at least)
    finals = {metrics(tmp_path, p)[-1]["global_acc"] for p in survivors}
    assert len(finals) == 1


def test_chfl_aggregator_killed_mid_round_no_peer_applies_a_stale_head(tmp_path):
    # Completely heterogeneous: each peer holds its own slice of breast-cancer's
    # columns and rows and draws its own MLP; only E x C heads travel. Round 3's
    # aggregator (p3) dies holding every head, before sending the mean.
    proc = launch(experiment(
        tmp_path, rounds=5, faults=[{"peer": "aggregator", "at_round": 3, "phase": "serve"}],
        defaults={"cohort": {"algorithm": "chfl", "aggregate_at": "aggregator"},  # the fail-over path
                  "data": {"dataset": "breast_cancer", "partition": "iid",
                           "feature_split": "slices", "feature_fraction": 0.5},
                  "model": {"arch": "random_mlp", "embedding_dim": 16, "options": {}}}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "injected crash in round 3 (serve)" in (tmp_path / "run" / "p3" / "peer.log").read_text()
    survivors = {pid: {r["round"]: r for r in metrics(tmp_path, pid)} for pid in ("p0", "p1", "p2")}
    archs = {json.loads((tmp_path / "run" / p / "summary.json").read_text())["arch"] for p in survivors}
    assert len(archs) == 3  # three different bodies
    for rounds in survivors.values():
        assert sorted(rounds) == [1, 2, 3, 4, 5]
        assert rounds[3]["aggregator"] == "p0" and rounds[3]["epoch"] == 1
        assert all(r["absorbed"] == 1.0 for r in rounds.values())
        # The head a peer distils from in round r is the mean of round r - 1, never older.
        assert [rounds[r].get("teacher_round") for r in range(1, 6)] == [None, 1, 2, 3, 4]
    for r in range(1, 6):  # and it is the same head on every survivor, round 3's included
        assert len({survivors[p][r]["absorbed_crc"] for p in survivors}) == 1


def test_a_pair_that_loses_one_peer_for_good_fails_the_launch_instead_of_reporting_solo_work(tmp_path):
    # p1 dies in round 2 and stays dead: p0's rounds 2-6 have no aggregate (one peer
    # is below the quorum), so 5 of its 6 rounds are training alone. That is not a
    # federated result: hfl-peer exits 3, the launch fails and says why.
    path = experiment(tmp_path, rounds=6, peers=2, faults=[{"peer": "p1", "at_round": 2}])
    proc = launch(path)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    p0 = {r["round"]: r for r in metrics(tmp_path, "p0")}
    assert sorted(p0) == [1, 2, 3, 4, 5, 6]  # it did run every round
    assert p0[1]["learned_from"] == 1 and [p0[r]["learned_from"] for r in range(2, 7)] == [0] * 5
    summary = json.loads((tmp_path / "run" / "p0" / "summary.json").read_text())
    assert "learned from no other peer in 5 of its 6 round(s)" in summary["cohort_shortfall"]
    assert "learned from no other peer" in proc.stdout + proc.stderr
    # Asked for explicitly, the same run is fine.
    proc = launch(path, "--fresh", "--allow-solo")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_killed_peer_restarts_from_its_checkpoint_rejoins_and_finishes(tmp_path):
    # The survivors see p1's links drop and declare it dead within a second (issue 36),
    # then go on without it: enough short rounds that the cohort is still running when
    # the restarted process is back (a process start takes seconds on a loaded machine;
    # the launcher restarts p1 once the cohort is in round 4).
    rounds = 150
    timing = {"round_timeout_s": 20}
    proc = launch(experiment(tmp_path, rounds=rounds, timing=timing, train={"max_batches": 1},
                             faults=[{"peer": "p1", "at_round": 3, "restart_at_round": 4}]),
                  timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (tmp_path / "run" / "p1" / "peer.log").read_text()
    assert "injected crash in round 3 (train)" in log
    assert "resumed from checkpoint after round 2 (incarnation 1)" in log
    p1 = metrics(tmp_path, "p1")
    first_life = [r["round"] for r in p1 if r["incarnation"] == 0]
    second_life = [r["round"] for r in p1 if r["incarnation"] == 1]
    assert first_life == [1, 2]
    # It caught up with the cohort (round 3 went on without it) instead of replaying:
    # rounds only forward (a jump when it found the cohort ahead), to the last one.
    assert second_life[0] >= 4 and second_life == sorted(set(second_life))
    assert second_life[-1] == rounds and len(second_life) >= (rounds - second_life[0]) // 2
    for pid in ("p0", "p2", "p3"):
        rounds_done = {r["round"]: r for r in metrics(tmp_path, pid)}
        assert sorted(rounds_done) == list(range(1, rounds + 1))
        assert rounds_done[3]["contributors"] == 3  # round 3 completed without p1
        assert rounds_done[rounds]["contributors"] == 4  # and p1 contributes again at the end
    # Back in the cohort: it ends on the same averaged model as everyone else.
    assert len({metrics(tmp_path, p)[-1]["global_acc"] for p in ("p0", "p1", "p2", "p3")}) == 1


def test_a_peer_that_fails_at_start_up_fails_the_launch_fast(tmp_path):
    # A missing file is refused before any peer starts (hfl.peer.check); a file that
    # exists but is not an NPZ archive only fails when p2 opens it.
    (tmp_path / "broken.npz").write_bytes(b"not an npz archive")
    path = experiment(tmp_path, rounds=3, peer_overrides={
        "p2": {"data": {"dataset": "npz", "path": str(tmp_path / "broken.npz")}}})
    started = time.monotonic()
    proc = launch(path)
    assert proc.returncode == 1
    assert "p2 exited with status" in proc.stderr
    assert "broken.npz" in proc.stderr  # the tail of p2's log names the file
    assert time.monotonic() - started < FAST_TIMING["join_timeout_s"]
    # No table of dashes and nan when no round finished: one line says so.
    assert "no peer finished a round" in proc.stdout and "| mean" not in proc.stdout


def test_invalid_experiment_names_the_field_and_allowed_values(tmp_path):
    path = experiment(tmp_path, rounds=3)
    proc = launch(path, "--set", "defaults.cohort.algorithm=fedvg")
    assert proc.returncode == 2
    assert "cohort.algorithm" in proc.stderr and "fedavg" in proc.stderr
    proc = launch(path, "--set", "faults=[{peer: p9, at_round: 2}]")
    assert proc.returncode == 2 and "faults[0].peer" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stopping_the_launcher_stops_every_peer(tmp_path, sig):
    path = experiment(tmp_path, rounds=10_000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hfl.launch.cli", str(path), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it,
    )
    metrics_file = tmp_path / "run" / "p0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not metrics_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # waiting for an external process to reach round 1
    assert metrics_file.exists()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    events = json.loads((tmp_path / "run" / "results.json").read_text())["events"]
    pids = [e["pid"] for e in events if e["event"] == "start"]
    for pid in pids:  # every child is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def overlap_experiment(tmp_path: Path, rounds: int, faults=()) -> Path:
    """examples/rotated_digits.yaml (FedH2L, 4 peers) made small, with cohort.overlap:
    most of a round's time is a step started ahead; evaluated every 3rd round."""
    exp = yaml.safe_load((Path(__file__).resolve().parent.parent / "examples"
                          / "rotated_digits.yaml").read_text())
    exp.update(name="e2e-overlap", run_dir=str(tmp_path / "run"), faults=list(faults))
    d = exp["defaults"]
    d["cohort"].update(rounds=rounds, overlap=True)
    d["node"] = {"evaluate_every": 3}
    d["data"]["options"].update(per_class=30, size=8)
    d["model"] = {"arch": "mlp", "embedding_dim": 32, "options": {"hidden": [64]}}
    d["train"]["max_batches"] = 4
    d["timing"] = dict(FAST_TIMING)
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def test_a_peer_killed_with_a_step_started_ahead_resumes_from_its_evaluated_checkpoint(tmp_path):
    # cohort.overlap and a crash as a SIGKILL's (os._exit, no goodbye, nothing flushed)
    # in round 5's wait, just after round 6's local step was started ahead in a worker
    # thread. The restarted process resumes from round 3's checkpoint (evaluated, so
    # with no step of round 4 in it), catches up with the cohort and finishes with it.
    rounds = 400
    proc = launch(overlap_experiment(tmp_path, rounds, faults=[
        {"peer": "p1", "at_round": 5, "phase": "wait", "restart_at_round": 7}]), timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (tmp_path / "run" / "p1" / "peer.log").read_text()
    assert "injected crash in round 5 (wait)" in log
    assert "resumed from checkpoint after round 3 (incarnation 1)" in log
    p1 = metrics(tmp_path, "p1")
    assert [r["round"] for r in p1 if r["incarnation"] == 0] == [3]
    again = [r["round"] for r in p1 if r["incarnation"] == 1]
    assert again and again[0] > 3 and again == sorted(set(again)) and again[-1] == rounds
    for pid in ("p0", "p2", "p3"):
        assert metrics(tmp_path, pid)[-1]["round"] == rounds


def test_a_peer_sigkilled_from_outside_with_overlap_restarts_from_an_evaluated_checkpoint(
        tmp_path):
    # The same from outside, as an operator sees it: four hfl-peer processes started by
    # hand from the configs `hfl-launch --dry-run` writes; p1 gets a real SIGKILL once
    # it has evaluated twice (wherever it is: most of a round is a step started ahead),
    # and is started again with the same command. It resumes from a round it evaluated
    # (a step started ahead is in no checkpoint), catches up and finishes with the rest;
    # every process exits 0. (The restart takes about 300 of these rounds here: the
    # python and torch start-up of a new process; 1,200 leave it room on a slower box.)
    rounds = 1200
    dry = launch(overlap_experiment(tmp_path, rounds), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    configs = {c.stem: c for c in sorted((tmp_path / "run" / "peers").glob("p*.yaml"))}

    def hfl_peer(pid: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "hfl.peer.cli", "--config",
                                 str(configs[pid])], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    procs = {pid: hfl_peer(pid) for pid in configs}
    try:
        lines = tmp_path / "run" / "p1" / "metrics.jsonl"
        deadline = time.monotonic() + 150
        while not (lines.exists() and lines.read_text().count("\n") >= 2):
            assert procs["p1"].poll() is None and time.monotonic() < deadline, "p1 never got going"
            time.sleep(0.05)  # waiting for an external process to evaluate twice
        procs["p1"].send_signal(signal.SIGKILL)
        assert procs["p1"].wait(timeout=30) == -signal.SIGKILL
        procs["p1"] = hfl_peer("p1")
        logs = {}
        for pid, proc in procs.items():
            _, logs[pid] = proc.communicate(timeout=200)
            assert proc.returncode == 0, (pid, logs[pid][-3000:])
    finally:
        for proc in procs.values():
            proc.kill()
            proc.communicate()
    log = logs["p1"]  # (the restarted process's: hfl-peer logs to stderr)
    saved = re.search(r"resumed from checkpoint after round (\d+) \(incarnation 1\)", log)
    # (an evaluated round, 6 or so; 3 when the kill came between round 6's metrics
    # line and its checkpoint: the restart trims the lines past its checkpoint)
    assert saved and int(saved[1]) % 3 == 0, log[-2000:]
    first_life = [r["round"] for r in metrics(tmp_path, "p1") if r["incarnation"] == 0]
    assert first_life == list(range(3, int(saved[1]) + 1, 3))
    p1 = metrics(tmp_path, "p1")
    again = [r["round"] for r in p1 if r["incarnation"] == 1]
    assert again and again[0] > int(saved[1]) and again == sorted(set(again))
    for pid in configs:
        assert metrics(tmp_path, pid)[-1]["round"] == rounds


def test_sigterm_stops_a_fedh2l_cohort_with_overlap_leaving_evaluated_checkpoints(tmp_path):
    # cohort.overlap in real hfl-peer processes (docs/runtime.md, Overlapped local steps):
    # SIGTERM to the launcher while the peers run, most of the time in a step started
    # ahead. Every peer stops without waiting for such a step, and what each leaves on
    # disk is the checkpoint of a round it evaluated (every 3rd), with its metrics line:
    # a step started ahead is in no file.
    path = overlap_experiment(tmp_path, rounds=10_000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hfl.launch.cli", str(path), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    files = [tmp_path / "run" / p / "metrics.jsonl" for p in ("p0", "p1", "p2", "p3")]
    deadline = time.monotonic() + 150
    while not all(f.exists() and f.read_text().count("\n") >= 2 for f in files):
        assert proc.poll() is None and time.monotonic() < deadline, "the cohort never got going"
        time.sleep(0.2)  # waiting for external processes to evaluate twice
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    from hfl.peer.checkpoint import load_checkpoint

    for f in files:
        rounds = [json.loads(line)["round"] for line in f.read_text().splitlines()]
        saved = load_checkpoint(f.parent)["round"]
        assert saved % 3 == 0 and saved == rounds[-1], (f.parent.name, saved, rounds)
        assert all(r % 3 == 0 for r in rounds), rounds
        assert "stopped by SIGTERM" in (f.parent / "peer.log").read_text()
