"""The same seed gives the same per-peer numbers whatever the machine's load.

Each method runs twice through the real ``hfl-launch`` (one process per peer over
ZeroMQ): once as the machine is, once beside one CPU-burning process per core.
Load changes every timing (who answers first, when a round's knowledge arrives,
which heartbeats are late); it must change no loss, no accuracy and no absorbed
aggregate. One method of each shape: an elected aggregator (fedavg), a broadcast
with no aggregator (mdhfl) and every peer aggregating what it received (chfl).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

METHODS = {
    "fedavg": {"cohort": {"algorithm": "fedavg", "aggregate_at": "aggregator"}},
    "mdhfl": {"cohort": {"algorithm": "mdhfl"}, "data": {"public_fraction": 0.1}},
    "chfl": {"cohort": {"algorithm": "chfl", "aggregate_at": "every_peer"}},
}
# What the seed decides; timings and byte counts are not among them.
LEARNED = ("train_loss", "test_acc", "test_loss", "global_acc", "global_loss", "absorbed_crc")


def _burn(ready) -> None:
    ready.set()
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2**31


class Burners:
    """One busy process per core, started and running before the launch begins."""

    def __init__(self, n: int):
        ctx = mp.get_context("fork")
        self.events = [ctx.Event() for _ in range(n)]
        self.procs = [ctx.Process(target=_burn, args=(e,), daemon=True) for e in self.events]

    def __enter__(self):
        for p in self.procs:
            p.start()
        for e in self.events:
            assert e.wait(30), "a CPU burner did not start"
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.join(10)


def start(tmp_path: Path, method: str, label: str) -> subprocess.Popen:
    sections = {
        "data": {"dataset": "digits", "partition": "dirichlet", "alpha": 0.5},
        "model": {"arch": "mlp", "embedding_dim": 32, "options": {"hidden": [32]}},
        "train": {"batch_size": 32, "lr": 0.05, "max_batches": 6},
        "timing": {"heartbeat_interval_s": 0.3, "suspect_after_s": 5, "dead_after_s": 10,
                   "round_timeout_s": 60, "join_timeout_s": 120},
        "cohort": {"rounds": 3},
    }
    for section, values in METHODS[method].items():
        sections[section] = {**sections.get(section, {}), **values}
    exp = {"name": f"repro-{method}", "peers": 3, "run_dir": str(tmp_path / label / method),
           "defaults": sections}
    path = tmp_path / f"{method}-{label}.yaml"
    path.write_text(yaml.safe_dump(exp))
    return subprocess.Popen([sys.executable, "-m", "hfl.launch.cli", str(path), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def results(tmp_path: Path, method: str, label: str, proc: subprocess.Popen) -> dict[str, list[dict]]:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"{method} ({label}): {out[-3000:]}"
    per_peer = {}
    for peer in ("p0", "p1", "p2"):
        lines = (tmp_path / label / method / peer / "metrics.jsonl").read_text().splitlines()
        per_peer[peer] = [{k: rec[k] for k in ("round", *LEARNED) if k in rec}
                          for rec in map(json.loads, lines)]
    return per_peer


def test_same_seed_same_per_peer_results_beside_cpu_burners(tmp_path):
    """Each method alone first; then all three at once, beside one burner per core (9
    peers and the burners on this machine's cores)."""
    quiet = {m: results(tmp_path, m, "quiet", start(tmp_path, m, "quiet")) for m in METHODS}
    with Burners(os.cpu_count() or 2):
        procs = {m: start(tmp_path, m, "loaded") for m in METHODS}
        loaded = {m: results(tmp_path, m, "loaded", p) for m, p in procs.items()}
    for m in METHODS:
        assert all(len(rows) == 3 for rows in quiet[m].values()), m
        assert all("test_acc" in r and "train_loss" in r for rows in quiet[m].values() for r in rows)
        assert loaded[m] == quiet[m], f"{m}: the loaded run learned something else"
