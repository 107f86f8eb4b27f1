"""``hfl-launch --on slurm`` against a real SLURM: a one-node cluster (munged, slurmctld
and slurmd from Debian's slurm-wlm and munge packages) started for these tests in a
temporary directory on free ports, and torn down after. CI installs the packages
(.ci/run); elsewhere: ``apt-get install slurm-wlm munge`` (as root)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hfl.peer.checkpoint import load_checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel")
NODES = ("n1", "n2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)  # external daemons and processes reaching a state


def _wait_progress(count, target: int, what: str, stall_s: float = 120.0) -> None:
    """Until ``count()`` reaches ``target``, for as long as it keeps growing: a loaded
    machine slows the run down, only a run that stopped moving fails (a fixed 60 s for
    round 20 failed on a busy machine)."""
    last, since = count(), time.monotonic()
    while last < target:
        if time.monotonic() - since > stall_s:
            raise AssertionError(f"timed out waiting for {what}: stuck at {last} for {stall_s:.0f} s")
        time.sleep(0.2)  # external processes making progress
        now = count()
        if now > last:
            last, since = now, time.monotonic()


def _cancel_every_job(env) -> None:
    """scancel this cluster's jobs and wait until none is left, so that no srun or
    slurmstepd outlives a test (a failed assertion used to leave three running)."""
    def jobs() -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True)
        return out.stdout.split()

    for job in jobs():
        subprocess.run(["scancel", job], env=env, capture_output=True)
    try:
        _wait(lambda: not jobs(), "every job to end", 60)
    except AssertionError:
        pass  # the teardown goes on: slurmd's shutdown ends its job steps too


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running one-node SLURM cluster; yields the environment its clients need."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(f"needs root and SLURM ({', '.join(missing) or 'not root'}): "
                    "apt-get install slurm-wlm munge")
    root = tmp_path_factory.mktemp("slurm")
    for d in ("munge", "state", "spool", *(f"spool/{n}" for n in NODES)):
        (root / d).mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = root / "munge" / "munge.socket"
    subprocess.run(["munged", f"--key-file={key}", f"--socket={sock}", "--force",
                    f"--pid-file={root / 'munge' / 'munged.pid'}",
                    f"--log-file={root / 'munge' / 'munged.log'}",
                    f"--seed-file={root / 'munge' / 'munged.seed'}"], check=True)
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=hfltest", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root",
        "SlurmdUser=root", "AuthType=auth/munge", f"AuthInfo=socket={sock}",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}", f"SlurmdLogFile={root / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none", "SlurmdParameters=config_overrides",
        "SchedulerParameters=sched_min_interval=100000",
        # Two nodes by SLURM's account (two slurmd, one machine), 8 CPUs each on a
        # smaller machine (config_overrides): room for a task per peer.
        *(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=8 "
          "RealMemory=2000 State=UNKNOWN" for n in NODES),
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(["slurmctld", "-f", str(conf), "-i"], check=True, env=env)
    for n in NODES:
        subprocess.run(["slurmd", "-f", str(conf), "-N", n], check=True, env=env)
    try:
        _wait(lambda: subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True,
                                     text=True).stdout.split() == ["idle"] * len(NODES),
              "both nodes to be idle", 60)
        yield env
    finally:
        _cancel_every_job(env)
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        subprocess.run(["pkill", "-f", f"slurmd -f {conf}"], capture_output=True)
        for pid_file in (root / "slurmctld.pid", root / "munge" / "munged.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass


def experiment(tmp_path: Path, rounds: int, **slurm) -> Path:
    exp = {"name": "onslurm", "peers": 4, "run_dir": str(tmp_path / "run"), "slurm": slurm,
           # An elected aggregator: its rounds wait round_timeout_s for peers being
           # resubmitted, which the assertions on lonely rounds below count on.
           "defaults": {"cohort": {"algorithm": "fedavg", "rounds": rounds, "aggregate_at": "aggregator"},
                        "data": {"dataset": "digits", "partition": "iid"},
                        "model": {"arch": "mlp", "options": {"hidden": [16]}},
                        "train": {"max_batches": 1},
                        "timing": {"heartbeat_interval_s": 0.2, "suspect_after_s": 0.8,
                                   "dead_after_s": 1.6, "join_timeout_s": 60,
                                   "round_timeout_s": 5, "aggregate_grace_s": 2}}}
    path = tmp_path / "onslurm.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def launch_cmd(path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "hfl.launch.cli", str(path), "--on", "slurm", "--quiet", *args]


def rows(run: Path, peer: str) -> list[dict]:
    return [json.loads(x) for x in (run / peer / "metrics.jsonl").read_text().splitlines()]


def test_a_cohort_runs_as_one_slurm_job_and_a_resubmission_continues_after_scancel(tmp_path, slurm):
    run, rounds = tmp_path / "run", 300
    path = experiment(tmp_path, rounds, sbatch=["--nodes=2", "--ntasks-per-node=2"])
    first = subprocess.Popen(launch_cmd(path), env=slurm, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _test_cancel_then_resubmit(run, rounds, path, first, slurm)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
        _cancel_every_job(slurm)


def _test_cancel_then_resubmit(run, rounds, path, first, slurm):
    metrics = run / "p0" / "metrics.jsonl"
    _wait_progress(lambda: len(metrics.read_text().splitlines()) if metrics.exists() else 0, 20,
                   "round 20")
    job = json.loads((run / "launch.json").read_text())["slurm_job"]
    subprocess.run(["scancel", job], env=slurm, check=True)  # as a preemption would
    out, err = first.communicate(timeout=120)
    assert first.returncode == 130, out + err
    assert f"job {job} CANCELLED" in err and "continues from the checkpoints" in err
    assert json.loads((run / "launch.json").read_text())["state"] == "interrupted"
    stopped_at = {p: rows(run, p)[-1]["round"] for p in ("p0", "p1", "p2", "p3")}
    assert all(r < rounds for r in stopped_at.values()), stopped_at
    # Each peer stopped on SIGTERM with its last recorded round checkpointed: a row past
    # the checkpoint would be dropped on resume (a CI run lost round 26 of a peer so).
    kept = {p: load_checkpoint(run / p)["round"] for p in stopped_at}
    assert kept == stopped_at, (kept, stopped_at)

    # The same command again: a new job (on new ports), continuing from the checkpoints.
    again = subprocess.run(launch_cmd(path), env=slurm, capture_output=True, text=True,
                           timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    second = json.loads((run / "launch.json").read_text())
    assert second["state"] == "finished" and second["slurm_job"] != job
    for peer in ("p0", "p1", "p2", "p3"):
        lines = rows(run, peer)
        done = [r["round"] for r in lines]
        # No row lost or doubled: every round up to the cancel, then increasing to the
        # end; a peer that resumed behind the others catches up (skips a round or two).
        assert done[:stopped_at[peer]] == list(range(1, stopped_at[peer] + 1))
        assert done == sorted(set(done)) and done[-1] == rounds and len(done) >= rounds - 3
        resumed = [r for r in lines if r["round"] > stopped_at[peer]]
        assert {r["incarnation"] for r in resumed} == {1}
        # The resubmitted peers found each other again at their new addresses (each
        # remembered the others at their old ones): a full cohort from a few rounds on
        # (until peers that finished first leave, in the last rounds).
        assert max(r["live_peers"] for r in resumed[-10:]) == 4
        assert sum(r["live_peers"] < 4 for r in resumed) <= 20, [r["live_peers"] for r in resumed]
        assert sum(r["learned_from"] == 0 for r in resumed) <= 2
        assert f"SLURM job {second['slurm_job']}, task" in (run / peer / "peer.log").read_text()
    # Two peers on each node, by SLURM's account: the first two tasks on n1.
    nodes = {p: (run / p / "peer.log").read_text().split("task ")[1].split(":")[0]
             for p in ("p0", "p1", "p2", "p3")}
    assert sorted(nodes.values()) == ["0 on node n1", "1 on node n1", "2 on node n2", "3 on node n2"]
    # The table counts the rounds each peer ran (a catch-up skips one or two).
    table = {r["peer"]: r for r in json.loads((run / "results.json").read_text())["peers"]}
    assert all(rounds - 3 <= table[p]["rounds"] <= rounds for p in ("p0", "p1", "p2", "p3")), table
    assert (run / "plots" / "global_acc.png").exists()


def test_dry_run_prints_the_batch_script_with_the_resources_asked_for(tmp_path, capsys):
    from hfl.launch.cli import main

    path = experiment(tmp_path, 3, partition="gpu", time="01:30:00", gpus_per_task=1,
                      cpus_per_task=4, sbatch=["--account=lab"])
    assert main([str(path), "--on", "slurm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for line in ("#SBATCH --ntasks=4", "#SBATCH --cpus-per-task=4", "#SBATCH --gpus-per-task=1",
                 "#SBATCH --partition=gpu", "#SBATCH --time=01:30:00", "#SBATCH --account=lab",
                 "#SBATCH --signal=TERM@60", f"-m hfl.launch.slurm task {(tmp_path / 'run').resolve()}"):
        assert line in out, out
    # With GPUs per task, each peer uses the one GPU SLURM gives its task.
    cfg = yaml.safe_load((tmp_path / "run" / "peers" / "p0.yaml").read_text())
    assert cfg["node"]["device"] == "cuda:0"


def test_without_slurm_commands_the_launch_says_what_is_missing(tmp_path, capsys, monkeypatch):
    from hfl.launch.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    assert main([str(experiment(tmp_path, 2)), "--on", "slurm", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "sbatch not found: --on slurm needs the SLURM client commands" in err
    assert json.loads((tmp_path / "run" / "launch.json").read_text())["state"] == "failed"
