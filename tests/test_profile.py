"""Where a peer's CPU goes: the CPU fields of a metrics line (tested with the cohort,
tests/test_cohort.py), ``hfl-peer --profile`` and its split by kind of cost
(:mod:`hfl.launch.profile`)."""

from __future__ import annotations

import cProfile
import itertools
import json
import pstats
import threading
import time

import pytest
import yaml

from hfl.launch.profile import OTHER, cost_of, split
from tests.conftest import free_tcp_port


def test_hfl_peer_profiles_the_rounds_of_its_event_loop_thread(tmp_path, capsys):
    from hfl.peer.cli import main

    cfg = tmp_path / "p0.yaml"
    cfg.write_text(yaml.safe_dump({
        "node": {"id": "p0", "listen": f"tcp://127.0.0.1:{free_tcp_port()}",
                 "run_dir": str(tmp_path / "run"), "min_peers": 1, "allow_solo": True},
        "cohort": {"algorithm": "fedavg", "rounds": 3}, "data": {"dataset": "digits"},
        "model": {"arch": "mlp"}, "security": {"mode": "none"}, "train": {"max_batches": 1}}))
    assert main(["--config", str(cfg), "--no-plot", "--profile",
                 str(tmp_path / "prof" / "{id}.pstats")]) == 0
    out = tmp_path / "prof" / "p0.pstats"
    assert f"profile of the event loop's thread in {out}" in capsys.readouterr().err
    functions = {f[2] for f in pstats.Stats(str(out)).stats}
    # The rounds only: not the start-up (building data and model, importing torch) ...
    assert "one_round" in functions and "build_algorithm" not in functions
    # ... and not the method's calls, which run in a worker thread.
    assert "local_update" not in functions
    costs = split([out])
    assert sum(costs.values()) > 0 and costs.get("round engine (node, procedures)", 0) > 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    threads = summary["rounds_cpu_by_thread_s"]
    assert {"MainThread", "hfl-work"} <= set(threads) and min(threads.values()) >= 0, threads
    # what went out, by type, in messages and bytes; the process's peak memory
    assert summary["sent_bytes_by_type"].keys() == summary["sent_by_type"].keys()
    assert summary["max_rss_mb"] > 0


def test_max_rss_mb_is_the_peak_resident_memory():
    import os
    import sys

    from hfl.peer.status import max_rss_mb

    if not sys.platform.startswith("linux"):
        pytest.skip("the oracle reads /proc/self/statm")

    def rss_mb() -> float:  # resident now, from another file than the function reads
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    before = max_rss_mb()
    size = int(max(0.0, before - rss_mb()) + 64)  # past the peak so far by 64 MiB at least
    ballast = bytearray(size * 2**20)
    ballast[:: 4096] = b"x" * len(ballast[:: 4096])  # touched: resident
    now = rss_mb()
    peak = max_rss_mb()
    assert now >= before + 60  # (the oracle's side: the ballast is resident)
    assert now - 1 <= peak <= now + 16, (before, now, peak)
    del ballast


def test_cpu_by_thread_names_each_threads_own_cpu():
    from hfl.peer.status import cpu_by_thread

    own: list[float] = []

    def burn() -> None:  # its CPU as the thread itself measures it: the oracle
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.3:
            pass
        own.append(time.thread_time() - t0)
        done.wait()

    done = threading.Event()
    worker = threading.Thread(target=burn, name="burner")
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not own and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = cpu_by_thread()
    finally:
        done.set()
        worker.join()
    # /proc counts in clock ticks (10 ms): within two ticks of the thread's own clock
    assert seen["burner"] == pytest.approx(own[0], abs=0.021), seen
    assert "MainThread" in seen


def test_a_profile_is_split_by_the_code_its_time_was_spent_in():
    # Functions "of" hfl's files (compiled under their paths), and a built-in called
    # from two kinds of code. With a clock that ticks once per profiler event, every
    # kind's share is deterministic; every tick is counted once.
    source = (
        "def payload_digest(xs):\n    return sorted(xs)\n"          # signing, by name
        "def merge(xs):\n    return sorted(xs) + sorted(xs)\n"      # protocol state
        "def step(xs):\n    for _ in range(3):\n        merge(xs)\n    payload_digest(xs)\n")
    code = {}
    exec(compile(source, "/site/hfl/peer/core.py", "exec"), code)
    ticks = itertools.count()
    prof = cProfile.Profile(lambda: next(ticks))
    prof.runcall(code["step"], [3, 1, 2])
    stats = pstats.Stats(prof)
    costs = split_stats(stats)
    assert sum(costs.values()) == pytest.approx(sum(v[2] for v in stats.stats.values()))
    assert set(costs) <= {"signing and digests", "protocol state (core, membership, rounds)",
                          OTHER}
    # sorted() called 6 times from merge, once from payload_digest: the protocol's
    # share of sorted() is six times the signing share.
    sorted_s = next(v[2] for k, v in stats.stats.items() if k[2] == "<built-in method builtins.sorted>")
    own = {k[2]: v[2] for k, v in stats.stats.items() if k[0].endswith("core.py")}
    assert costs["signing and digests"] == pytest.approx(own["payload_digest"] + sorted_s / 7)
    assert cost_of("/x/zmq/sugar/socket.py", "send") == "transport (ZeroMQ, CURVE)"
    assert cost_of("/x/peer/membership.py", "sign") == "signing and digests"
    assert cost_of("/x/numpy/core.py", "f") == OTHER


def split_stats(stats: pstats.Stats) -> dict[str, float]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.pstats"
        stats.dump_stats(str(path))
        return split([path])


@pytest.mark.e2e
def test_the_compute_floor_trains_the_same_cohort_in_one_process(tmp_path):
    # What start-up and scale are measured against (bench/startup.py --methods floor,
    # bench/scale.py's floor column): the experiment's peers built as hfl-peer builds
    # them, FedAvg without a runtime; every peer ends on the same average.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "floor.json"
    proc = subprocess.run(
        [sys.executable, str(root / "bench" / "_local_worker.py"), "--experiment",
         str(root / "examples" / "quickstart.yaml"), "--set", "peers=3", "--rounds", "2",
         "--out", str(out)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    floor = json.loads(out.read_text())
    assert floor["peers"] == 3 and floor["rounds"] == 2 and floor["s_per_round"] > 0
    assert floor["process_start"] < floor["round1_start"] < floor["end"]
    assert len(set(floor["global_acc"])) == 1 and 0.1 < floor["global_acc"][0] <= 1.0
