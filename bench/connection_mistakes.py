"""How fast each side of a misconfigured connection says why, with real hfl-peer processes.

    python bench/connection_mistakes.py [--timeout 30]

For each mistake people make when two organisations set up a cohort, two real
``hfl-peer`` processes start on this machine: ``b`` (no bootstrap, the first
peer) and ``a`` (bootstrap ``b@...``). Each process's log is watched for the
line that names the cause on its side; the table gives the seconds from the
process's start until that line (``-`` if it never came within ``--timeout``).
Both processes are then stopped. Mistakes:

- ``key not listed``: b's allow-list lacks a's line (a missing or wrong line);
- ``stale key``: a's allow-list holds an old public key for b (b ran ``hfl-keys new`` again);
- ``plaintext dialler``: a runs ``security: none``, b CURVE;
- ``plaintext listener``: a runs CURVE, b ``security: none``.

Before issue 18, a printed "no answer from b@...: is a peer listening there?"
after 5 s and exited 3 after ``timing.join_timeout_s`` (120 s by default),
whatever the cause; b printed nothing in the last two cases and a line with
neither the peer nor the fix in the first two.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hfl.launch.experiment import free_ports
from hfl.peer.security import cohort_keys, load_secret_key, write_allow_list

# The line on each side that names the cause (a's, b's), per mistake.
MISTAKES = {
    "key not listed": ("is not on its allow-list", "is not on the allow-list"),
    "stale key": ("hangs up during the CURVE handshake", "another public key than this peer's"),
    "plaintext dialler": ("runs CURVE", "a client without CURVE"),
    "plaintext listener": ("security: none", "a CURVE client"),
}


def peer_config(root: Path, pid: str, port: int, bootstrap: list[str], security: dict) -> Path:
    cfg = {
        "node": {"id": pid, "listen": f"tcp://127.0.0.1:{port}", "bootstrap": bootstrap,
                 "run_dir": str(root / "runs" / pid), "min_peers": 2},
        "cohort": {"name": "mistakes", "algorithm": "fedavg", "rounds": 2},
        "data": {"dataset": "digits", "partition": "iid", "num_partitions": 2,
                 "partition_index": 0 if pid == "a" else 1},
        "model": {"arch": "mlp"},
        "timing": {"join_timeout_s": 120},
        "security": security,
    }
    path = root / f"{pid}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def securities(root: Path, mistake: str) -> tuple[dict, dict]:
    keys = cohort_keys(root / "keys", ["a", "b"])
    a, b = dict(keys["a"]), dict(keys["b"])
    if mistake == "key not listed":
        only_b = root / "keys" / "b_allow_list"
        write_allow_list(only_b, {"b": load_secret_key(b["key_file"])[0]})
        b["allow_list"] = str(only_b)
    elif mistake == "stale key":
        renewed = cohort_keys(root / "renewed", ["a", "b"])
        b = dict(renewed["b"])
        # b's new allow-list knows a, but a's still holds b's old key.
        both = root / "renewed" / "b_allow_list"
        write_allow_list(both, {"a": load_secret_key(a["key_file"])[0],
                                "b": load_secret_key(b["key_file"])[0]})
        b["allow_list"] = str(both)
    elif mistake == "plaintext dialler":
        a = {"mode": "none"}
    elif mistake == "plaintext listener":
        b = {"mode": "none"}
    return a, b


def first_line(path: Path, needle: str) -> float | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    return 0.0 if needle in text else None


def run(mistake: str, timeout_s: float):
    """(a's seconds, b's seconds, a's seconds after it was listening, a's line, b's line)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sec_a, sec_b = securities(root, mistake)
        port, port_a = free_ports(2, "127.0.0.1")
        cfg_b = peer_config(root, "b", port, [], sec_b)
        cfg_a = peer_config(root, "a", port_a, [f"b@tcp://127.0.0.1:{port}"], sec_a)
        logs = {pid: root / f"{pid}.log" for pid in "ab"}
        procs, started = {}, {}
        for pid, cfg in (("b", cfg_b), ("a", cfg_a)):
            started[pid] = time.monotonic()
            procs[pid] = subprocess.Popen(
                [sys.executable, "-m", "hfl.peer.cli", "--config", str(cfg)],
                stdout=subprocess.DEVNULL, stderr=open(logs[pid], "w"),
                env={**os.environ, "OMP_NUM_THREADS": "1"})
        seen: dict[str, float] = {}
        listening: dict[str, float] = {}
        needles = dict(zip("ab", MISTAKES[mistake], strict=True))
        deadline = time.monotonic() + timeout_s
        while len(seen) < 2 and time.monotonic() < deadline:
            for pid in "ab":
                if pid not in listening and first_line(logs[pid], " listening on ") is not None:
                    listening[pid] = time.monotonic()
                if pid not in seen and first_line(logs[pid], needles[pid]) is not None:
                    seen[pid] = time.monotonic() - started[pid]
            time.sleep(0.05)
        if "a" in seen and "a" in listening:  # a's start-up (imports, data, model) aside
            seen["a_net"] = seen["a"] - (listening["a"] - started["a"])
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(10)
        lines = {pid: next((line for line in logs[pid].read_text().splitlines()
                            if needles[pid] in line), "") for pid in "ab"}
        return seen.get("a"), seen.get("b"), seen.get("a_net"), lines["a"], lines["b"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()
    rows = []
    for mistake in MISTAKES:
        a_s, b_s, a_net, a_line, b_line = run(mistake, args.timeout)
        rows.append((mistake, a_s, b_s, a_net))
        print(f"\n{mistake}:\n  a: {a_line.split('hfl.peer', 1)[-1].strip()}\n"
              f"  b: {b_line.split('hfl.peer', 1)[-1].strip()}")

    def fmt(s: float | None) -> str:
        return "-" if s is None else f"{s:.1f}"

    print("\n| mistake | a (dials) names the cause, s | of which after a was listening | "
          "b (listens) names it, s |")
    print("|---|---|---|---|")
    for mistake, a_s, b_s, a_net in rows:
        print(f"| {mistake} | {fmt(a_s)} | {fmt(a_net)} | {fmt(b_s)} |")
    print("(seconds from each process's start, including importing PyTorch and loading data; "
          "the log is polled every 50 ms)")


if __name__ == "__main__":
    main()
