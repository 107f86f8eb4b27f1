"""bench/gpu.py, the GPU check, runs its CPU side here (no GPU needed) and writes its numbers.

The CUDA side needs a GPU and is run there by hand (docs/runtime.md); here: the
same script with ``--device cpu --quick`` (the quickstart and the ResNet-18
FedAvg cohort, 4 peers each) gives a positive s/round and bytes/round for both
configurations, and ``--device cuda`` where torch sees no GPU exits 2 with one
line. Nothing asserts on how fast anything is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu.py"

pytestmark = pytest.mark.timeout(300)


@pytest.mark.e2e
def test_cpu_quick_run_writes_time_and_bytes_per_round_for_both_configs(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out),
         "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=280, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["quick"] is True
    assert set(data["runs"]) == {"quickstart", "resnet18"}
    for config, by_device in data["runs"].items():
        assert set(by_device) == {"cpu"}, config
        run = by_device["cpu"]
        assert run["status"] == "ok", (config, run["status"])
        for key in ("s_per_round", "s_per_round_after_1", "bytes_per_peer_round",
                    "bytes_per_round_cohort"):
            assert run[key] > 0, (config, key, run[key])
        assert run["rounds_done"] == {"quickstart": 5, "resnet18": 3}[config]
        assert {q["device"] for q in run["peers"].values()} == {"cpu"}
        assert len(run["peers"]) == 4
        assert run["device_label"].startswith("CPU "), run["device_label"]
    # a whole ResNet-18 goes to the aggregator and back: tens of MB per round, the MLP far less
    assert (data["runs"]["resnet18"]["cpu"]["bytes_per_peer_round"]
            > 100 * data["runs"]["quickstart"]["cpu"]["bytes_per_peer_round"])
    assert "resnet18 cpu: CPU " in proc.stdout and "| resnet18" in proc.stdout


def test_cuda_without_a_gpu_exits_2_with_one_line(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # torch sees no GPU, whatever the machine
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda", "--out", str(tmp_path / "gpu.json")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device here" in lines[0], proc.stderr
    assert "--device cpu" in lines[0]
    assert not (tmp_path / "gpu.json").exists()
