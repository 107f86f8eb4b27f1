"""hfl-launch --on slurm beside a local launch: time to the first round and to the end.

    SLURM_CONF=/path/slurm.conf python bench/slurm_launch.py [--peers 4 16] [--rounds 20]

Needs a SLURM cluster whose nodes see this run directory (``--out``, default
runs/bench/slurm). For each cohort size, examples/quickstart.yaml (FedAvg, MLP,
Dirichlet digits) runs once with ``--on slurm`` and once locally (forked peers),
same experiment. Printed per run: seconds from the command's start to the first
metrics line of any peer (the first round done), and to the command's end
(results table written). The SLURM figures include sbatch, the scheduler's
start of the job and one interpreter per task importing PyTorch; the local
launch forks its peers from one template process.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def first_round_s(run: Path, started: float, proc: subprocess.Popen) -> float | None:
    """Poll until some peer wrote its first metrics line; seconds since ``started``."""
    while proc.poll() is None:
        if any((p / "metrics.jsonl").exists() and (p / "metrics.jsonl").stat().st_size
               for p in run.iterdir() if p.is_dir()):
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def one(on: str, peers: int, rounds: int, out: Path) -> tuple[float | None, float, int]:
    run = out / f"{on}-{peers}"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    cmd = [sys.executable, "-m", "hfl.launch.cli", str(ROOT / "examples" / "quickstart.yaml"),
           "--quiet", "--on", on, "--run-dir", str(run), "--set", f"peers={peers}",
           "--set", f"defaults.cohort.rounds={rounds}", "--set", "slurm.cpus_per_task=1"]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = first_round_s(run, started, proc)
    _, err = proc.communicate()
    if proc.returncode:
        print(f"{on}, {peers} peers: exit {proc.returncode}: {err.strip()[-300:]}", file=sys.stderr)
    return first, time.monotonic() - started, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "slurm")
    args = ap.parse_args()
    print("| peers | launch | first round, s | end, s | exit |")
    print("|---|---|---|---|---|")
    for peers in args.peers:
        for on in ("slurm", "local"):
            first, end, rc = one(on, peers, args.rounds, args.out.resolve())
            shown = "-" if first is None else f"{first:.1f}"
            print(f"| {peers} | {on} | {shown} | {end:.1f} | {rc} |", flush=True)


if __name__ == "__main__":
    main()
