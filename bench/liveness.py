"""Liveness under external faults: what a kill, a pause, a double restart or a
healed partition costs the cohort's round, against a normal round of the same run.

    python bench/liveness.py [--quick] [--cases 0abcdefgh] [--dead-after 1.5]
                             [--hfl-src DIR [--hfl-src DIR ...]]

``hfl-launch --dry-run`` writes the per-peer configs of a small FedAvg cohort
(4 peers, digits, a small MLP); each case then starts those peers itself as
``hfl-peer`` processes (fresh ports and run directories per case), waits until
the cohort finished round ``--fault-after`` and hurts it from OUTSIDE (never the
self-crash hook):

  0  no fault (the noise floor: the slowest round of a healthy run)
  a  SIGKILL a peer that is not the next round's aggregator
  b  SIGKILL the next round's aggregator (rotation: sorted ids[round % n])
  c  SIGSTOP a non-aggregator for 2 x dead_after_s, then SIGCONT
  d  SIGKILL two non-aggregators together and restart both at once (they resume
     from their checkpoints)
  e  a 2|2 partition: every peer in its own network namespace, the two halves on
     two bridges joined by one veth link, which is taken down for
     2 x dead_after_s and brought up again (needs root and ``ip netns``; left
     out, with the reason, where either is missing)
  f  SIGTERM the next round's aggregator (a graceful leave: goodbye, last row and
     checkpoint) and restart it as soon as it has exited (leave, then rejoin)
  g  a rolling restart with SIGTERM of every peer (``--peers 5`` for the issue's
     numbers), in rotation order from the next round's aggregator: each stopped,
     restarted as soon as it exited, the next stopped once the last has a metrics
     row in its new life (a higher incarnation)
  h  the same rolling restart with SIGKILL

f, g and h run ``--departure-rounds`` rounds (a restart takes a process start,
seconds, during which the others go on) and end, SIGKILLing the peers, once the
cohort has been whole again for ``--fault-after + 2`` rounds after the last
restart. For a SIGTERM each stop prints the seconds from the signal to the
process's exit and its exit status (143 expected; bounded by ``--stop-timeout``,
then SIGKILL). For the cases that run to their end (0-e) each peer's seconds
from its "done" line (seen in its log; polled every 20 ms) and from its
summary.json's mtime to its process's exit are printed too.

``--hfl-src DIR`` (repeatable) runs each case once per checkout, side by side in
one run (alternating, so both see the same load): the dry run and every peer
import ``hfl`` from DIR (scale.py's ``sitecustomize.py`` on PYTHONPATH), e.g. a
``git worktree add /tmp/hfl-before <commit>`` of older code; ``.`` (the default)
is this checkout.

From the metrics.jsonl rows of the peers the fault did not touch (all peers for
e, g and h) a round ends at ``max(time + round_time_s)`` over them (less the rows
that end after some peer ended the next round: a restarted peer left behind, which
re-ran a round the cohort had passed); a round's duration is
the time between the ends of consecutive rounds. The fault's window runs from
the fault to the first round whose aggregate took in every peer still in the
run (the cohort "whole again"; to the end if that never came); the affected
round is the slowest round of the window; "normal" is the median duration of
the rounds 2..fault_after and of as many rounds after the window (round 1
includes the join; the rounds near the fault saw the same load from other
processes on a shared machine). Printed per case: the affected
round, its extra seconds over normal and the ratio, the extra summed over the
window, whether the affected round stayed within the issue's
budget ``dead_after_s + 2 x heartbeat_interval_s`` over normal, how many rounds
after the fault some measured peer ended without an aggregate (below the
quorum, or left behind) and in how many none of them had one, how long after
the fault the first aggregate with every peer still in the run came (the cohort
"whole again"), rounds in which peers used results of different aggregators or
epochs (a split: must be 0),
and each peer's exit codes (-9: killed here). For e the verdict uses the time
from the heal until the cohort is whole again, less a normal round: rounds go
on without aggregates on both sides of a cut (neither half is a quorum).

Every subprocess has a timeout; every process this script started is killed at
the end of its case, and the namespaces are removed, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common as c
import yaml
from scale import commit_of, hfl_location

from hfl.launch.experiment import aggregator_of, free_ports

CASE_NAMES = {
    "0": "no fault",
    "a": "killed non-aggregator",
    "b": "killed aggregator",
    "c": "paused 2x dead_after_s",
    "d": "two peers restarted together",
    "e": "2|2 partition healed",
    "f": "SIGTERM aggregator, rejoin",
    "g": "rolling restart, SIGTERM",
    "h": "rolling restart, SIGKILL",
}
DEPARTURES = "fgh"  # cases that stop peers on purpose and end once whole again
NETNS_PREFIX = "hfl9"
SUBNET = "10.199.9"


# ------------------------------------------------------------------ processes


class Peer:
    """One ``hfl-peer`` process this script started (in its own session)."""

    def __init__(self, pid: str, config: Path, run_dir: Path, netns: str | None = None,
                 env: dict[str, str] | None = None, extra: tuple[str, ...] = ()):
        self.id, self.config, self.run_dir, self.netns = pid, config, run_dir, netns
        self.env, self.extra = env or {}, extra
        self.proc: subprocess.Popen | None = None
        self.exit_codes: list[int] = []
        self.stopped = False
        self.stops: list[dict[str, Any]] = []  # each SIGTERM: seconds to exit, status
        self.done_seen: float | None = None  # when its "done" line was first seen
        self.exit_seen: float | None = None  # when its last process was seen gone

    def start(self) -> None:
        cmd = [sys.executable, "-m", "hfl.peer.cli", "--config", str(self.config), *self.extra]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "CUDA_VISIBLE_DEVICES": ""}
        with (self.run_dir / "peer.log").open("a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL, then reap (bounded)."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self.proc.returncode is not None:
                self.exit_codes.append(self.proc.returncode)
            self.proc = None

    def stop(self, sig: int, timeout_s: float) -> None:
        """``sig``, then wait (bounded) for the exit; SIGKILL past ``timeout_s``."""
        t0 = time.monotonic()
        self.signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout_s)
            self.stops.append({"signal": signal.Signals(sig).name,
                               "exit_s": time.monotonic() - t0, "rc": rc})
            self.exit_codes.append(rc)
            self.proc = None
        except subprocess.TimeoutExpired:
            self.stops.append({"signal": signal.Signals(sig).name, "exit_s": None,
                               "rc": f"none in {timeout_s:.0f}s"})
            self.kill()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def watch_exit(self) -> None:
        """Note when the "done" line shows up in the log and when the process is gone."""
        if self.done_seen is None:
            with contextlib.suppress(OSError), (self.run_dir / "peer.log").open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                if b"hfl-peer: " + self.id.encode() + b" done: " in f.read():
                    self.done_seen = time.time()
        if self.exit_seen is None and self.proc is not None and self.proc.poll() is not None:
            self.exit_seen = time.time()

    def exit_lag(self) -> dict[str, float | None]:
        """Seconds from the "done" line and from summary.json's mtime to the exit."""
        try:
            summary = (self.run_dir / "summary.json").stat().st_mtime
        except OSError:
            summary = None
        ok = self.exit_seen is not None
        return {"done_to_exit_s": self.exit_seen - self.done_seen
                if ok and self.done_seen is not None else None,
                "summary_to_exit_s": self.exit_seen - summary if ok and summary else None}

    def incarnation(self) -> int:
        return max((int(r.get("incarnation") or 0) for r in self.rows()), default=-1)

    def rows(self) -> list[dict[str, Any]]:
        try:
            text = (self.run_dir / "metrics.jsonl").read_text()
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def last_round(self) -> int:
        return max((int(r["round"]) for r in self.rows()), default=0)


def wait_for(cond, timeout_s: float, what: str, poll_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


# ------------------------------------------------------------------ network namespaces


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=check)


def netns_unavailable() -> str | None:
    """Why case e cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth links and bridges)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    try:
        sh("ip", "netns", "add", f"{NETNS_PREFIX}probe")
        sh("ip", "netns", "del", f"{NETNS_PREFIX}probe")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        return f"ip netns does not work here ({getattr(exc, 'stderr', '') or exc})".strip()
    return None


class Partitionable:
    """Peers 0..n-1 each in a namespace; the first half on one bridge, the rest on
    another; one veth link joins the bridges. ``cut()`` / ``heal()`` take it down/up."""

    def __init__(self, n: int):
        self.n = n
        self.link = f"{NETNS_PREFIX}lr0"

    def ns(self, i: int) -> str:
        return f"{NETNS_PREFIX}p{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{10 + i}"

    def __enter__(self) -> Partitionable:
        self.teardown()
        try:
            for side in "LR":
                sh("ip", "link", "add", f"{NETNS_PREFIX}br{side}", "type", "bridge")
                sh("ip", "link", "set", f"{NETNS_PREFIX}br{side}", "up")
            sh("ip", "link", "add", self.link, "type", "veth", "peer", "name", f"{NETNS_PREFIX}lr1")
            for end, side in ((self.link, "L"), (f"{NETNS_PREFIX}lr1", "R")):
                sh("ip", "link", "set", end, "master", f"{NETNS_PREFIX}br{side}")
                sh("ip", "link", "set", end, "up")
            for i in range(self.n):
                ns, veth = self.ns(i), f"{NETNS_PREFIX}v{i}"
                sh("ip", "netns", "add", ns)
                sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                sh("ip", "link", "set", veth, "master",
                   f"{NETNS_PREFIX}br{'L' if i < self.n // 2 else 'R'}")
                sh("ip", "link", "set", veth, "up")
                sh("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def teardown(self) -> None:
        for i in range(max(self.n, 8)):
            sh("ip", "netns", "del", self.ns(i), check=False)
        for dev in (self.link, f"{NETNS_PREFIX}brL", f"{NETNS_PREFIX}brR"):
            sh("ip", "link", "del", dev, check=False)

    def cut(self) -> None:
        sh("ip", "link", "set", self.link, "down")

    def heal(self) -> None:
        sh("ip", "link", "set", self.link, "up")

    def reachable(self, i: int, j: int, port: int) -> bool:
        """A TCP connect from peer i's namespace to peer j's listening port."""
        code = (f"import socket; socket.create_connection(('{self.address(j)}', {port}), "
                "timeout=0.5).close()")
        proc = subprocess.run(["ip", "netns", "exec", self.ns(i), sys.executable, "-c", code],
                              capture_output=True, timeout=20)
        return proc.returncode == 0


# ------------------------------------------------------------------ one case


def case_configs(base: dict[str, dict], case_dir: Path, net: Partitionable | None,
                 log_level: str = "info", rounds: int | None = None) -> dict[str, Path]:
    """The dry-run configs with this case's run directories and addresses."""
    ids = sorted(base)
    if net is None:
        addr = {p: f"tcp://127.0.0.1:{port}"  # (distinct: bound together, then released)
                for p, port in zip(ids, free_ports(len(ids), "127.0.0.1"), strict=True)}
    else:
        addr = {p: f"tcp://{net.address(i)}:{47100 + i}" for i, p in enumerate(ids)}
    paths = {}
    for p in ids:
        cfg = json.loads(json.dumps(base[p]))
        cfg["node"]["listen"] = addr[p]
        cfg["node"]["log_level"] = log_level
        cfg["node"]["run_dir"] = str(case_dir / p)
        if rounds is not None:
            cfg["cohort"]["rounds"] = rounds
        cfg["node"]["bootstrap"] = [] if p == ids[0] else [f"{ids[0]}@{addr[ids[0]]}"]
        path = case_dir / "peers" / f"{p}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        paths[p] = path
    return paths


def non_aggregators(ids: list[str], k: int, count: int) -> list[str]:
    busy = {aggregator_of(ids, r) for r in (k + 1, k + 2)}
    return [p for p in ids if p not in busy][-count:]


def rolling_order(ids: list[str], k: int) -> list[str]:
    """Every peer, in rotation order from the aggregator of round k + 1."""
    first = ids.index(aggregator_of(ids, k + 1))
    return ids[first:] + ids[:first]


def run_case(case: str, base: dict[str, dict], args, out: Path,
             src: dict[str, Any]) -> dict[str, Any]:
    case_dir = out / f"case-{case}-{src['label']}-{args.run_index}"
    shutil.rmtree(case_dir, ignore_errors=True)
    ids = sorted(base)
    k = args.fault_after
    departure = case in DEPARTURES
    net_ctx = Partitionable(len(ids)) if case == "e" else contextlib.nullcontext()
    info: dict[str, Any] = {"case": case, "what": CASE_NAMES[case], "code": src["label"]}
    with net_ctx as net:
        paths = case_configs(base, case_dir, net, args.log_level,
                             args.departure_rounds if departure else None)
        peers = {p: Peer(p, paths[p], case_dir / p, net.ns(i) if net else None, src["env"],
                         ("--no-plot",) if args.no_plot else ())
                 for i, p in enumerate(ids)}
        touched: list[str] = []
        t_last = 0.0  # the last restart (f, g, h): the cohort is whole again after it
        try:
            for peer in peers.values():
                peer.start()
            wait_for(lambda: any(p.last_round() >= k for p in peers.values()),
                     args.start_timeout, f"round {k} of case {case}")
            t_fault = time.time()
            info["fault_time"] = t_fault
            if case in "ab":
                victim = aggregator_of(ids, k + 1) if case == "b" else non_aggregators(ids, k, 1)[0]
                touched = [victim]
                peers[victim].kill()
            elif case == "c":
                victim = non_aggregators(ids, k, 1)[0]
                touched = [victim]
                peers[victim].signal(signal.SIGSTOP)
                time.sleep(2 * args.dead_after)
                peers[victim].signal(signal.SIGCONT)
            elif case == "d":
                touched = non_aggregators(ids, k, 2)
                for p in touched:
                    peers[p].kill()
                for p in touched:
                    peers[p].start()
            elif case == "e":
                port = 47100 + len(ids) - 1
                net.cut()
                info["cut_blocks"] = not net.reachable(0, len(ids) - 1, port)
                time.sleep(max(0.0, 2 * args.dead_after - (time.time() - t_fault)))
                net.heal()
                info["partition_s"] = time.time() - t_fault
                info["heal_reaches"] = net.reachable(0, len(ids) - 1, port)
            elif departure:
                touched = [aggregator_of(ids, k + 1)] if case == "f" else rolling_order(ids, k)
                sig = signal.SIGKILL if case == "h" else signal.SIGTERM
                for i, victim in enumerate(touched):
                    info.setdefault("restart_rounds", []).append(
                        max(p.last_round() for p in peers.values()))
                    life = peers[victim].incarnation()
                    peers[victim].stop(sig, args.stop_timeout)
                    peers[victim].start()
                    t_last = info["last_restart"] = time.time()
                    if i + 1 < len(touched):  # the next one once this one is back
                        wait_for(lambda v=peers[victim], life=life: v.incarnation() > life,
                                 args.start_timeout, f"{victim}'s first row in its new life",
                                 poll_s=0.1)
            info["touched"] = touched
            if departure:  # whole again, then enough rounds for a normal round after it
                wait_for(lambda: whole_after(peers, t_last, k + 2), args.case_timeout,
                         f"case {case}'s cohort whole again for {k + 2} rounds", poll_s=0.2)
            else:
                def finished() -> bool:
                    for peer in peers.values():
                        peer.watch_exit()
                    return not any(p.running() for p in peers.values())

                wait_for(finished, args.case_timeout, f"the peers of case {case} to finish")
        except TimeoutError as exc:
            info["error"] = str(exc)
        finally:
            for peer in peers.values():  # everything this case started ends here
                if peer.running():
                    peer.kill()
                elif peer.proc is not None:
                    peer.exit_codes.append(peer.proc.returncode)
                    peer.proc = None
        info["exit_codes"] = {p: peers[p].exit_codes for p in ids}
        info["stops"] = {p: peers[p].stops for p in ids if peers[p].stops}
        if not departure:
            info["exit_lag"] = {p: peers[p].exit_lag() for p in ids}
        rows = {p: peers[p].rows() for p in ids}
    gone = touched if case in "ab" else []
    info.update(analyse(rows, ids, touched if case not in "egh" else [], gone, k,
                        info.get("fault_time", 0.0), t_last))
    if case == "e" and info.get("recovered_after_s") is not None and "partition_s" in info:
        # Rounds go on (without aggregates) on both sides of a cut; what healing costs is
        # the time from the heal until the cohort's aggregate is whole again, beyond a round.
        info["after_heal_s"] = info["recovered_after_s"] - info["partition_s"]
        info["after_heal_extra_s"] = info["after_heal_s"] - info.get("normal_s", 0.0)
    return info


def whole_after(peers: dict[str, Peer], t: float, n: int) -> bool:
    """Whether n rounds that ended after time t had every peer's contribution."""
    ends = {}
    for peer in peers.values():
        for r in peer.rows():
            if int(r.get("contributors") or 0) >= len(peers):
                ends[int(r["round"])] = float(r["time"]) + float(r["round_time_s"])
    return sum(1 for end in ends.values() if end > t) >= n


def analyse(rows: dict[str, list[dict]], ids: list[str], touched: list[str], gone: list[str],
            k: int, t_fault: float, t_last: float = 0.0) -> dict[str, Any]:
    measured = [p for p in ids if p not in touched]
    row_ends = [(int(r["round"]), float(r["time"]) + float(r["round_time_s"]))
                for p in measured for r in rows[p]]
    first_end: dict[int, float] = {}
    for r, end in row_ends:
        first_end[r] = min(first_end.get(r, end), end)
    ends: dict[int, float] = {}
    for r, end in row_ends:
        # A row that ends after some peer ended round r + 1 is a peer left behind (a
        # restarted peer that re-ran a round the cohort had passed): not the round's end.
        if end <= first_end.get(r + 1, end):
            ends[r] = max(ends.get(r, 0.0), end)
    rounds = sorted(ends)
    dur = {r: ends[r] - ends[r - 1] for r in rounds if r - 1 in ends}
    # Recovery: the first round after the fault (after the last restart for f, g, h)
    # whose aggregate took in every peer still in the run (killed-and-not-restarted
    # ones excluded).
    expected = len(ids) - len(gone)
    recovered = next((r for r in rounds if r > k and ends[r] > t_last and max(
        (int(x.get("contributors") or 0) for p in measured for x in rows[p]
         if int(x["round"]) == r), default=0) >= expected), None)
    # The fault's window: from the fault to the first whole round (all rounds after the
    # fault if it never came). Normal: the median of the k - 1 rounds before the fault
    # and of as many after the window (the same load as the fault saw, on a shared box).
    last = recovered if recovered is not None else max(rounds, default=k)
    window = [r for r in range(k + 1, last + 1) if r in dur]
    normal = [dur[r] for r in [*range(2, k + 1), *range(last + 1, last + k)] if r in dur]
    out: dict[str, Any] = {"durations": dur, "rounds_done": len(rounds),
                           "last_round": max(rounds, default=0)}
    if not window or not normal:
        out.update(affected_round=None, extra_s=None)
        return out
    base = statistics.median(normal)
    worst = max(window, key=lambda r: dur[r])
    # Agreement: no round where peers used results of different aggregators/epochs (a
    # peer that aggregated for itself, every peer aggregating, names itself: not a split).
    split = [r for r in rounds if len({(x.get("aggregator"), x.get("epoch")) for p in ids
                                       for x in rows[p] if int(x["round"]) == r
                                       and x.get("aggregator") not in (None, p)}) > 1]
    no_aggregate = [r for r in rounds if r > k and any(
        x.get("aggregator") is None for p in measured for x in rows[p] if int(x["round"]) == r)]
    out.update(
        recovered_round=recovered,
        recovered_after_s=(ends[recovered] - t_fault) if recovered else None,
        split_rounds=split, no_aggregate_rounds=len(no_aggregate),
        # rounds in which no measured peer used any aggregate (nobody absorbed anything)
        nobody_aggregated_rounds=[r for r in no_aggregate if all(
            x.get("aggregator") is None for p in measured for x in rows[p]
            if int(x["round"]) == r)],
        normal_s=base, affected_round=worst, affected_s=dur[worst], extra_s=dur[worst] - base,
        ratio=dur[worst] / base if base > 0 else float("inf"),
        window_extra_s=sum(dur[r] - base for r in window),
        # what the survivors recorded for the affected round
        affected_rows={p: {key: r.get(key) for key in ("aggregator", "epoch", "contributors",
                                                       "live_peers", "timed_out", "below_quorum",
                                                       "incarnation")}
                       for p in ids for r in rows[p] if int(r["round"]) == worst},
        touched_back={p: [(int(r["round"]), r.get("incarnation")) for r in rows[p]
                          if int(r["round"]) > k] for p in touched},
    )
    return out


# ------------------------------------------------------------------ main


def dry_run_configs(args, out: Path, env: dict[str, str]) -> dict[str, dict]:
    exp = {
        "name": "bench-liveness",
        "peers": args.peers,
        "defaults": {
            "security": {"mode": "none"},
            "cohort": {"algorithm": "fedavg", "rounds": args.rounds},
            "data": {"dataset": "digits", "partition": "iid"},
            "model": {"arch": "mlp", "embedding_dim": 64, "options": {"hidden": [args.hidden]}},
            "train": {"local_epochs": args.local_epochs, "batch_size": 32},
            "timing": {"heartbeat_interval_s": args.heartbeat,
                       "suspect_after_s": args.suspect_after, "dead_after_s": args.dead_after,
                       "round_timeout_s": args.round_timeout, "aggregate_grace_s": 2.0,
                       "join_timeout_s": 60.0, "send_timeout_s": 1.0},
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "experiment.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    dry = out / "dry"
    shutil.rmtree(dry, ignore_errors=True)
    cmd = [sys.executable, "-m", "hfl.launch.cli", str(path), "--dry-run", "--run-dir", str(dry)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    if proc.returncode != 0:
        sys.exit(f"liveness: {' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return {p.stem: yaml.safe_load(p.read_text()) for p in sorted((dry / "peers").glob("*.yaml"))}


def boot_env(src: Path, boot: Path) -> dict[str, str]:
    """Environment under which a Python process imports hfl from checkout ``src``: a
    ``sitecustomize.py`` in ``boot`` (first on PYTHONPATH, bench/ next) calls
    ``_scale_worker.use_hfl_from`` (as scale.py --hfl-src does, importing it by name)."""
    boot.mkdir(parents=True, exist_ok=True)
    (boot / "sitecustomize.py").write_text(
        f"import _scale_worker\n_scale_worker.use_hfl_from({str(src)!r})\n")
    path = [str(boot), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(filter(None, path))}


def sources(dirs: list[Path], out: Path) -> list[dict[str, Any]]:
    """Each checkout to measure: a label (its commit), the peers' environment, its path."""
    found = []
    for d in dirs:
        d = d.resolve()
        if not (d / "peer" / "__init__.py").is_file():
            sys.exit(f"liveness: --hfl-src {d}: not an hfl checkout (no peer/__init__.py)")
        env = {} if d == c.ROOT else boot_env(d, out / "_boot" / str(len(found)))
        where = Path(hfl_location(env)).resolve()
        if where != d:
            sys.exit(f"liveness: --hfl-src {d}: child processes import hfl from {where}")
        commit = (commit_of(d) or "unknown")[:7]
        dirty = " (+ uncommitted)" if subprocess.run(
            ["git", "-C", str(d), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=20).stdout.strip() else ""
        found.append({"label": commit, "env": env, "path": str(d), "dirty": dirty})
    return found


def main() -> int:
    p = c.parser(__doc__)
    p.add_argument("--cases", default="0abcde", help="which cases (default 0abcde; f, g, h: "
                   "departures)")
    p.add_argument("--hfl-src", type=Path, action="append", default=None, metavar="DIR",
                   help="measure the hfl of this checkout (repeatable: each case runs once per "
                        "DIR, alternating; default: this checkout)")
    p.add_argument("--departure-rounds", type=int, default=3000,
                   help="rounds of f, g, h (they end once whole again after the last restart)")
    p.add_argument("--no-plot", action="store_true",
                   help="start the peers with --no-plot (as hfl-launch does; a bare hfl-peer "
                        "draws its plots before it exits, after a SIGTERM too)")
    p.add_argument("--stop-timeout", type=float, default=60.0,
                   help="seconds a SIGTERM'd peer gets to exit before a SIGKILL")
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=40,
                   help="enough that restarted peers (a process start takes seconds) find the "
                        "cohort still running")
    p.add_argument("--fault-after", type=int, default=4, help="fault once round N is done")
    p.add_argument("--heartbeat", type=float, default=0.2)
    p.add_argument("--suspect-after", type=float, default=0.6)
    p.add_argument("--dead-after", type=float, default=1.5)
    p.add_argument("--round-timeout", type=float, default=20.0)
    p.add_argument("--hidden", type=int, default=256, help="the MLP's hidden width")
    p.add_argument("--local-epochs", type=int, default=16, help="local epochs per round (sets "
                   "the normal round's length)")
    p.add_argument("--log-level", default="info", help="the peers' node.log_level")
    p.add_argument("--repeat", type=int, default=1, help="runs per case (mean +- std)")
    p.add_argument("--start-timeout", type=float, default=120.0)
    p.add_argument("--case-timeout", type=float, default=120.0)
    args = p.parse_args()
    if args.quick:
        args.rounds, args.cases = min(args.rounds, 12), args.cases.replace("d", "")
    if args.peers != 4 and "e" in args.cases:
        sys.exit("liveness: case e is a 2|2 partition: --peers 4")
    out = c.out_path("liveness", args.out).with_suffix("")
    out.mkdir(parents=True, exist_ok=True)
    srcs = sources(args.hfl_src or [c.ROOT], out)
    print(f"liveness: {args.peers} peers, fedavg, {args.rounds} rounds; heartbeat "
          f"{args.heartbeat}s, suspect {args.suspect_after}s, dead {args.dead_after}s, "
          f"round timeout {args.round_timeout}s; fault after round {args.fault_after}", flush=True)
    skipped = {}
    if "e" in args.cases:
        why = netns_unavailable()
        if why:
            skipped["e"] = why
    for src in srcs:
        print(f"code {src['label']}{src['dirty']}: hfl from {src['path']}", flush=True)
        src["base"] = dry_run_configs(args, out / src["label"], src["env"])
    results = []
    for case in args.cases:
        if case in skipped:
            print(f"case {case} ({CASE_NAMES[case]}): left out: {skipped[case]}", flush=True)
            continue
    for rep in range(args.repeat):
        for case in args.cases:
            if case in skipped:
                continue
            for src in srcs:
                t0 = time.monotonic()
                load0 = os.getloadavg()[0]
                args.run_index = rep + 1
                res = run_case(case, src["base"], args, out, src)
                res["repeat"] = rep
                res["load_avg_1m"] = (load0, os.getloadavg()[0])
                res["wall_s"] = time.monotonic() - t0
                results.append(res)
                print(f"case {case} ({res['what']}) #{rep + 1}, code {src['label']}: "
                      f"{res.get('error') or 'ok'}; affected round {res.get('affected_round')}, "
                      f"extra {c.fmt(res.get('extra_s'), '{:.2f}')}s, exit codes "
                      f"{res['exit_codes']} ({res['wall_s']:.0f}s)", flush=True)
    budget = args.dead_after + 2 * args.heartbeat
    header = ["case", "code", "run", "fault", "affected round", "normal s", "affected s", "extra s",
              "ratio", "window extra s", "cost vs budget", "rounds w/o aggregate",
              "rounds nobody aggregated", "whole again after s", "split rounds", "exit codes",
              "load"]
    table_rows = []
    for res in results:
        extra = res.get("after_heal_extra_s", res.get("extra_s"))
        verdict = "-" if extra is None else ("within" if extra <= budget else "OVER")
        what = res["what"] + (f" ({res['partition_s']:.1f}s cut)" if "partition_s" in res else "")
        table_rows.append([res["case"], res["code"], res["repeat"] + 1, what,
                           res.get("affected_round"), res.get("normal_s"),
                           res.get("affected_s"), res.get("extra_s"), res.get("ratio"),
                           res.get("window_extra_s"), verdict, res.get("no_aggregate_rounds"),
                           len(res.get("nobody_aggregated_rounds", [])),
                           res.get("recovered_after_s"), len(res.get("split_rounds", [])),
                           " ".join(f"{p}:{','.join(map(str, v))}"
                                    for p, v in res["exit_codes"].items()),
                           "{:.0f}-{:.0f}".format(*res["load_avg_1m"])])
    print()
    print(c.table(header, table_rows,
                  ["{}", "{}", "{}", "{}", "{}", "{:.3f}", "{:.2f}", "{:.2f}", "{:.1f}", "{:.2f}",
                   "{}", "{}", "{}", "{:.2f}", "{}", "{}", "{}"]))
    stops = [[res["case"], res["code"], res["repeat"] + 1, p, s["signal"], s["exit_s"], s["rc"]]
             for res in results for p, ss in res.get("stops", {}).items() for s in ss
             if s["signal"] != "SIGKILL"]
    if stops:
        print("\nSIGTERM to exit (each stopped peer; restarted once it had exited)")
        print(c.table(["case", "code", "run", "peer", "signal", "to exit s", "exit status"], stops,
                      ["{}", "{}", "{}", "{}", "{}", "{:.2f}", "{}"]))
    lags = [[res["case"], res["code"], res["repeat"] + 1, p, v["done_to_exit_s"],
             v["summary_to_exit_s"], res["exit_codes"][p][-1] if res["exit_codes"][p] else None]
            for res in results for p, v in res.get("exit_lag", {}).items()]
    if lags:
        print("\nafter the last round: from the \"done\" line (seen in the log, polled every "
              "20 ms) and from summary.json's mtime to the process's exit")
        print(c.table(["case", "code", "run", "peer", "done to exit s", "summary to exit s",
                       "exit status"], lags, ["{}", "{}", "{}", "{}", "{:.2f}", "{:.2f}", "{}"]))
    print(f"\nbudget (issue 9): dead_after_s + 2 heartbeats = {budget:.2f}s over a normal round; "
          "for the partition: from the heal until whole again, less a normal round. "
          f"load: the machine's 1-minute load average at the case's start and end "
          f"({os.cpu_count()} CPUs)")
    if args.repeat > 1:
        print(f"\nover {args.repeat} runs per case: mean +- std")
        summary = []
        for case, src in [(case, src) for case in args.cases for src in srcs]:
            runs = [r for r in results if r["case"] == case and r["code"] == src["label"]]
            if not runs:
                continue

            def ms(key, runs=runs):
                xs = [r[key] for r in runs if r.get(key) is not None]
                if not xs:
                    return "-"
                sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
                return f"{statistics.mean(xs):.2f} +- {sd:.2f}"

            within = sum(1 for r in runs if (r.get("after_heal_extra_s", r.get("extra_s"))
                                             or 0.0) <= budget)
            summary.append([case, src["label"], CASE_NAMES[case], ms("normal_s"), ms("extra_s"),
                            ms("ratio"),
                            ms("window_extra_s"), f"{within}/{len(runs)}",
                            ms("no_aggregate_rounds"), ms("recovered_after_s"),
                            sum(len(r.get("split_rounds", [])) for r in runs)])
        print(c.table(["case", "code", "fault", "normal s", "extra s", "ratio", "window extra s",
                       "within budget", "rounds w/o aggregate", "whole again after s",
                       "split rounds (all runs)"], summary))
    for res in results:
        if res["case"] == "e":
            print(f"partition: the cut blocked TCP between the halves: {res.get('cut_blocks')}; "
                  f"the healed link reaches across: {res.get('heal_reaches')}; whole again "
                  f"{c.fmt(res.get('after_heal_s'), '{:.2f}')}s after the heal (a normal round "
                  f"{c.fmt(res.get('normal_s'), '{:.2f}')}s)")
    for why_case, why in skipped.items():
        print(f"case {why_case} left out: {why}")
    c.write_json(c.out_path("liveness", args.out), {"args": vars(args), "results": results,
                                                    "skipped": skipped, "budget_s": budget})
    return 0


if __name__ == "__main__":
    sys.exit(main())
