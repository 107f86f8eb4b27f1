"""``hfl-launch --on slurm``: the same experiment as one batch job on a SLURM cluster.

The launcher expands the experiment as for a local launch (peer configs, keys
and allow-list under ``<run_dir>``, which must be on a filesystem every node
sees), writes ``<run_dir>/slurm.sh`` and submits it with ``sbatch``. The job
has one task per peer (``--ntasks``, ``--cpus-per-task``, ``--gpus-per-task``
from the experiment's ``slurm`` section); ``srun`` starts every task as
``python -m hfl.launch.slurm task <run_dir>``, which:

* picks its peer by ``SLURM_PROCID`` (the order of ``hfl-launch``'s peer ids);
* binds on its node's address: the first peer on a port known before the job
  starts (``slurm.port``, else 20000 + job id mod 20000), every other peer on
  any free port, found by the others through gossip;
* bootstraps to the first peer, on the first node of the allocation
  (``scontrol show hostnames``; addresses are the nodes' NodeAddr);
* runs ``hfl-peer`` and records its exit status in ``<run_dir>/<peer>/exit_status``.

SLURM's own signals reach the peers: ``scancel``, preemption and the time limit
(``--signal=TERM@<slurm.signal_s>``) send SIGTERM, and a peer stops cleanly on
SIGTERM; each round is already checkpointed. The launcher waits for the job,
showing its state and the peers' rounds, and then writes the results table and
plots as for a local launch. A job that was cancelled, preempted or timed out
leaves the run ``interrupted``: ``hfl-launch <experiment> --on slurm`` (or with
``--resume``) submits a new job that continues from the checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hfl.launch.experiment import ExperimentConfig, PeerPlan
from hfl.launch.supervisor import LaunchOutcome
from hfl.peer.configtools import ConfigError

JOB_FILE = "slurm.json"  # what the tasks need: peer ids, the first peer's port
SCRIPT_FILE = "slurm.sh"
EXIT_FILE = "exit_status"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE")
RESUMABLE = ("CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL")
POLL_S = 1.0
UNKNOWN_POLLS = 30  # the job's state unknown this many polls in a row: stop waiting


class SlurmError(Exception):
    """SLURM could not take or run the job; the message is one line for the user."""


def cpus_per_task(exp: ExperimentConfig, plans: list[PeerPlan]) -> int:
    return exp.slurm.cpus_per_task or max(p.config.node.threads or 1 for p in plans)


def check_run_dir(run_dir: Path) -> str:
    """The run folder as the batch script names it; refused where an #SBATCH line cannot
    hold it (sbatch failed with "Invalid directive found", naming no field: a review)."""
    where = str(run_dir.resolve())
    if re.search(r"[\s\x00-\x1f\x7f]", where):
        raise ConfigError("run_dir", f"got {where!r}; on SLURM the run folder goes into the "
                                     "job's #SBATCH --output line, which takes no spaces or "
                                     "control characters: use a path without them")
    return where


def batch_script(exp: ExperimentConfig, plans: list[PeerPlan], run_dir: Path) -> str:
    """The sbatch script of this cohort (also what ``--dry-run`` prints)."""
    s = exp.slurm
    python = s.python or sys.executable
    # (a % is sbatch's pattern character: "100%x" sent the log to a folder that is not
    # there; %% is a literal one)
    log_file = check_run_dir(run_dir).replace("%", "%%") + "/slurm-%j.out"
    options = [f"--job-name=hfl-{exp.name}", f"--ntasks={len(plans)}",
               f"--cpus-per-task={cpus_per_task(exp, plans)}",
               f"--output={log_file}", f"--signal=TERM@{s.signal_s}"]
    if s.gpus_per_task:
        options.append(f"--gpus-per-task={s.gpu_type + ':' if s.gpu_type else ''}"
                       f"{s.gpus_per_task}")
    if s.partition:
        options.append(f"--partition={s.partition}")
    if s.time:
        options.append(f"--time={s.time}")
    options += list(s.sbatch)
    lines = ["#!/bin/bash", f"# hfl-launch --on slurm: {exp.name}, {len(plans)} peers"]
    lines += [f"#SBATCH {o}" for o in options]
    if s.setup:  # the nodes' environment: modules, conda, a virtual environment
        lines += ["set -e  # a failed setup line ends the job at once, with its error in the log",
                  *s.setup, "set +e"]
    lines += [
        "# One task per peer; srun passes SLURM's signals (scancel, preemption, time limit) on.",
        f"exec srun --kill-on-bad-exit=0 {shlex.quote(python)} -m hfl.launch.slurm task "
        f"{shlex.quote(str(run_dir.resolve()))}",
        "",
    ]
    return "\n".join(lines)


def _run(cmd: list[str], what: str) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found: --on slurm needs the SLURM client commands "
                         "(sbatch, squeue, scontrol, scancel) on this machine's PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{what}: {cmd[0]} did not answer within 60 s (is slurmctld up?)") from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit status {proc.returncode}"
        cause = sbatch_cause("\n".join(detail)) if cmd[0] == "sbatch" else None
        raise SlurmError(f"{what}: {' '.join(cmd[:2])} failed: {last}"
                         + (f": {cause}" if cause else ""))
    return proc.stdout


# What sbatch's own error lines mean, and what to do (its text, lower-cased -> the cause).
SBATCH_CAUSES = [
    ("could not establish a configuration source",
     "this machine has the SLURM commands but no cluster configured (no slurm.conf, no "
     "configless slurmctld): run hfl-launch on the cluster's login node, or set SLURM_CONF"),
    ("unable to contact slurm controller",
     "slurmctld does not answer (down, or unreachable from here): try again later, or ask the "
     "cluster's admins"),
    ("invalid partition name",
     "slurm.partition names no partition of this cluster: sinfo -s lists them"),
    ("invalid account",
     "the account (slurm.sbatch --account=...) is not yours on this cluster: sacctmgr show "
     "assoc user=$USER lists yours"),
    ("invalid qos",
     "the QOS (slurm.sbatch --qos=...) is not allowed for your account: sacctmgr show assoc "
     "user=$USER format=qos"),
    ("requested node configuration is not available",
     "no node has what one task asks for (slurm.cpus_per_task, slurm.gpus_per_task, memory): "
     "ask for less, or another slurm.partition (sinfo -o '%P %c %G %m')"),
    ("invalid generic resource",
     "the GPUs asked for (slurm.gpus_per_task) do not exist in that partition: "
     "sinfo -o '%P %G' shows each partition's GPUs"),
    ("time limit",
     "slurm.time is above the partition's limit: sinfo -o '%P %l' shows the limits"),
    ("qosmaxsubmitjobperuserlimit",
     "you have as many jobs queued as your QOS allows: wait for some to end (squeue -u $USER)"),
    ("job violates accounting/qos policy",
     "the job exceeds a limit of your account or QOS (jobs, CPUs, GPUs, time): ask for less, "
     "or see sacctmgr show assoc user=$USER"),
    ("node count specification invalid",
     "more tasks (peers) than the partition can place: fewer peers, or another partition"),
]


def sbatch_cause(text: str) -> str | None:
    """The cause and the fix of an sbatch failure, from its error text; None if unknown."""
    low = text.lower()
    return next((cause for needle, cause in SBATCH_CAUSES if needle in low), None)


def job_state(job: str) -> str:
    """The job's state (PENDING, RUNNING, COMPLETED, CANCELLED, ...), from scontrol, which
    keeps ended jobs for MinJobAge (300 s by default); UNKNOWN once it forgot them."""
    try:
        out = _run(["scontrol", "show", "job", "-o", job], f"job {job}")
    except SlurmError:
        return "UNKNOWN"
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return "UNKNOWN"


def submit(exp: ExperimentConfig, plans: list[PeerPlan], run_dir: Path) -> str:
    """Write the job files, clear old exit statuses, sbatch; the job id."""
    (run_dir / JOB_FILE).write_text(json.dumps({
        "peers": [p.id for p in plans], "port": exp.slurm.port,
        "configs": [str(p.config_path.resolve()) for p in plans],
        "run_dirs": [str(Path(p.config.run_dir).resolve()) for p in plans],
    }, indent=2))
    script = run_dir / SCRIPT_FILE
    script.write_text(batch_script(exp, plans, run_dir))
    for p in plans:
        Path(p.config.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(p.config.run_dir) / EXIT_FILE).unlink(missing_ok=True)
    out = _run(["sbatch", "--parsable", str(script)], "submitting the job")
    return out.strip().split(";")[0]


def _last_round(metrics: Path) -> int:
    """The round of a metrics file's last line, reading only its tail."""
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            return int(json.loads(f.read().splitlines()[-1])["round"])
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def _rounds(plans: list[PeerPlan]) -> str:
    done = [_last_round(Path(p.config.run_dir) / "metrics.jsonl") for p in plans]
    return f"rounds {min(done)}-{max(done)}/{plans[0].config.cohort.rounds}"


def following(job: str | None, plans: list[PeerPlan]) -> str | None:
    """What became of the job a detached (or disconnected) launch submitted: "running"
    (still queued or running: follow it), "ended" (every peer recorded its exit status:
    collect the results) or None (gone without them: submit anew, resuming)."""
    if not job:
        return None
    state = job_state(job)
    if state not in ENDED and state != "UNKNOWN":
        return "running"
    codes = []
    for p in plans:
        try:
            codes.append(int((Path(p.config.run_dir) / EXIT_FILE).read_text()))
        except (OSError, ValueError):
            return None
    return "ended" if state == "COMPLETED" or not any(c in (130, 143, -15) for c in codes) else None


def run(exp: ExperimentConfig, plans: list[PeerPlan], run_dir: Path, out, progress: bool,
        on_submit=None, job: str | None = None, detach: bool = False) -> LaunchOutcome | None:
    """Submit the cohort's job (or follow ``job``, submitted earlier), wait for it, and
    say how each peer ended. ``detach``: submit and return None at once."""
    started = time.monotonic()
    if job is None:
        job = submit(exp, plans, run_dir)
        out(f"hfl-launch: submitted SLURM job {job} ({run_dir / SCRIPT_FILE}); scancel {job} stops it")
        if on_submit is not None:
            on_submit(job)
        if detach:
            return None
        state = "PENDING"
    else:
        out(f"hfl-launch: following SLURM job {job}, submitted earlier (scancel {job} stops it)")
        state = job_state(job)
        if state == "UNKNOWN" and following(job, plans) == "ended":
            state = "COMPLETED"  # scontrol forgot it (MinJobAge); every peer recorded its end
    shown, interrupted, unknown = "", False, 0
    try:
        # UNKNOWN: scontrol failed or forgot the job; give a restarting slurmctld time.
        while state not in ENDED and unknown < UNKNOWN_POLLS:
            time.sleep(POLL_S)
            state = job_state(job)
            unknown = unknown + 1 if state == "UNKNOWN" else 0
            if not progress:
                continue
            line = f"job {job} {state}" + (f", {_rounds(plans)}" if state == "RUNNING" else "")
            if line != shown:
                out(f"[{time.monotonic() - started:7.1f}s] {line}")
                shown = line
    except KeyboardInterrupt:
        interrupted = True
        subprocess.run(["scancel", job], capture_output=True)
        out(f"hfl-launch: interrupted: scancel {job} sent", err=True)
    failures = []
    stopped = interrupted or state in RESUMABLE  # SIGTERM from scancel, preemption, time limit
    for p in plans:
        path = Path(p.config.run_dir) / EXIT_FILE
        try:
            rc = int(path.read_text())
        except (OSError, ValueError):
            failures.append(f"{p.id} did not finish (job {job} {state})")
            continue
        if stopped and rc in (130, 143, -signal.SIGTERM):
            continue  # stopped by the job's end, after its last checkpoint: it resumes
        if rc == 3:
            failures.append(f"{p.id} finished without its cohort")
        elif rc != 0:
            failures.append(f"{p.id} exited with status {rc} (its log: {Path(p.config.run_dir) / 'peer.log'})")
    if interrupted:
        failures.insert(0, "interrupted")
    elif state in RESUMABLE:
        failures.insert(0, "interrupted")
        out(f"hfl-launch: job {job} {state}: the same command with --on slurm (or --resume) "
            "submits a new job that continues from the checkpoints", err=True)
    elif state != "COMPLETED" and not failures:
        failures.append(f"job {job} {state}")
    events = [{"event": "slurm_job", "job": job, "state": state}]
    return LaunchOutcome(ok=not failures, wall_time_s=time.monotonic() - started,
                         failures=failures, events=events, peers={})


# ------------------------------------------------------------------ in the job


def first_node(nodelist: str) -> str:
    """The first node of ``SLURM_JOB_NODELIST`` (a compressed list such as ``n[01-04]``)."""
    out = _run(["scontrol", "show", "hostnames", nodelist], "the job's nodes")
    return out.split()[0]


def node_address(node: str) -> str:
    """The IP address SLURM reaches ``node`` at (its NodeAddr), else its name resolved."""
    try:
        out = _run(["scontrol", "show", "node", "-o", node], f"node {node}")
        addr = next((f.split("=", 1)[1] for f in out.split() if f.startswith("NodeAddr=")), node)
    except SlurmError:
        addr = node
    return socket.gethostbyname(addr)


def task(run_dir: Path) -> int:
    """One task of the job: this task's peer, bound on this node, bootstrapping to the first."""
    job = json.loads((run_dir / JOB_FILE).read_text())
    rank = int(os.environ["SLURM_PROCID"])
    peers, configs, run_dirs = job["peers"], job["configs"], job["run_dirs"]
    if rank >= len(peers):
        print(f"hfl slurm task: SLURM_PROCID {rank} but the cohort has {len(peers)} peers",
              file=sys.stderr)
        return 2
    job_id = int(os.environ.get("SLURM_JOB_ID", "0"))
    port = job["port"] or 20000 + job_id % 20000
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    here = node_address(node)
    first = node_address(first_node(os.environ["SLURM_JOB_NODELIST"]))
    listen = f"tcp://{here}:{port if rank == 0 else 0}"
    bootstrap = [] if rank == 0 else [f"{peers[0]}@tcp://{first}:{port}"]
    peer_dir = Path(run_dirs[rank])
    peer_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "hfl.peer.cli", "--config", configs[rank], "--no-plot",
           "--set", f"node.listen={listen}", "--set", f"node.bootstrap={json.dumps(bootstrap)}"]
    with open(peer_dir / "peer.log", "a") as log:
        log.write(f"# SLURM job {job_id}, task {rank} on node {node}: {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        for sig in (signal.SIGTERM, signal.SIGINT):  # scancel, preemption, the time limit
            signal.signal(sig, lambda s, _f: proc.send_signal(s))
        rc = proc.wait()
    (peer_dir / EXIT_FILE).write_text(f"{rc}\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "task":
        print("usage: python -m hfl.launch.slurm task RUN_DIR (run by srun in the job that "
              "hfl-launch --on slurm submits)", file=sys.stderr)
        return 2
    return task(Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main())
