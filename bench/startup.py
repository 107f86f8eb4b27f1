"""Start-up time and memory per peer: one interpreter per peer vs peers forked from a
template that imported torch once (hfl-launch --start process | forkserver), and
all peers in one process (hfl-launch --in-process).

    python bench/startup.py [--peers 4 16] [--repeats 1] [--rounds 5]
    python bench/startup.py --peers 4 --methods floor forkserver --rounds 10 --repeats 3
    python bench/startup.py --peers 100 --methods forkserver in-process --rounds 3 \
        --set defaults.data.partition=iid          # many peers (dirichlet needs >= 10 rows each)

Runs examples/quickstart.yaml with ``peers`` = N and a few rounds, both start
methods one after the other (never concurrently; the order alternates per
repeat), and measures for each launch:

* ``to round 1 s``: from starting hfl-launch until every peer has begun round 1
  (the last peer's first metrics record; includes the launcher's own checks);
* ``wall s``: the whole hfl-launch process;
* memory, sampled every 0.2 s from /proc while all N peers are up (the sample
  with the largest total PSS): mean USS per peer (pages only that process
  holds), mean PSS per peer (shared pages split between their users), and the
  total PSS of the peers plus the template process. In-process: the launcher's
  own USS and PSS (all peers), divided by N for the per-peer columns. The JSON
  says how many peers were up in the memory sample (peers_in_memory_sample).

Prints a table and ratios against the first method, measured in the same run.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common as c

MiB = 1024 * 1024


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _memory(pid: int) -> tuple[int, int] | None:
    """(USS, PSS) in bytes from /proc/<pid>/smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line[0].isupper()
                      and line.split()[1].isdigit()}
    except OSError:
        return None
    return fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0), fields.get("Pss", 0)


def run_one(n: int, method: str, rounds: int, run_dir: Path, extra: list[str] = ()) -> dict:
    sets = [f"peers={n}", f"defaults.cohort.rounds={rounds}", f"name=startup-{method}-{n}", *extra]
    if method == "floor":  # the same training in one process, no runtime: bench/_local_worker.py
        run_dir.mkdir(parents=True, exist_ok=True)
        floor_out = run_dir / "floor.json"
        floor_out.unlink(missing_ok=True)
        cmd = [sys.executable, str(Path(__file__).parent / "_local_worker.py"), "--experiment",
               str(c.QUICKSTART), "--rounds", str(rounds), "--out", str(floor_out)]
        for o in sets:
            cmd += ["--set", o]
    else:
        how = ["--in-process"] if method == "in-process" else ["--start", method]
        cmd = [sys.executable, "-m", "hfl.launch.cli", str(c.QUICKSTART), "--run-dir", str(run_dir),
               "--fresh", "--quiet", *how]
        for o in sets:
            cmd += ["--set", o]
    print("$ " + " ".join(cmd[1:]), flush=True)
    t0 = time.time()
    log_path = run_dir.parent / f"{run_dir.name}.log"  # a file, not a pipe: it never fills up
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, text=True)
    best: dict = {}
    while proc.poll() is None:
        if method in ("in-process", "floor"):
            m = _memory(proc.pid)
            if m is not None and m[1] > best.get("total_pss", 0):
                best = {"total_pss": m[1], "uss": m[0] / n, "pss": m[1] / n, "seen": n}
            time.sleep(0.2)
            continue
        tree = c.process_tree()
        direct = tree.get(proc.pid, [])
        # The template is the launcher's forkserver child; forked peers are its children
        # (they keep its command line); plain peers run hfl.peer.cli.
        template = [p for p in direct if "forkserver" in _cmdline(p)]
        peers = [p for p in direct if "hfl.peer.cli" in _cmdline(p)]
        peers += [k for t in template for k in tree.get(t, [])]
        if peers:
            mem = [m for m in (_memory(p) for p in peers) if m is not None]
            tmem = [m for m in (_memory(p) for p in template) if m is not None]
            total = sum(m[1] for m in mem) + sum(m[1] for m in tmem)
            # the sample with the most peers up and readable (a process being forked or
            # exiting may not be), then the largest total
            if mem and (len(mem), total) > (best.get("seen", 0), best.get("total_pss", 0)):
                best = {"total_pss": total, "uss": statistics.mean(m[0] for m in mem),
                        "pss": statistics.mean(m[1] for m in mem), "seen": len(mem)}
        time.sleep(0.2)
    wall = time.time() - t0
    log_file.close()
    out = log_path.read_text(errors="replace")
    firsts = []
    if method == "floor":
        if floor_out.exists():
            firsts = [json.loads(floor_out.read_text())["round1_start"]] * n
    for p in sorted(run_dir.glob("p*/metrics.jsonl")):
        recs = c.read_jsonl(p)
        if recs:
            firsts.append(recs[0]["time"])
    ok = proc.returncode == 0 and len(firsts) == n
    if not ok:
        print(f"  hfl-launch exited with {proc.returncode}; last lines:\n" + "\n".join(out.splitlines()[-12:]))
    return {"peers": n, "method": method, "ok": ok, "wall_s": wall,
            "to_round1_s": (max(firsts) - t0) if len(firsts) == n else None,
            "uss_mib": best.get("uss", 0) / MiB or None, "pss_mib": best.get("pss", 0) / MiB or None,
            "total_pss_mib": best.get("total_pss", 0) / MiB or None,
            "peers_in_memory_sample": best.get("seen", 0)}


def fmt(v, spec="{:.1f}"):
    return "-" if v is None else spec.format(v)


def main() -> int:
    ap = c.parser(__doc__)
    ap.add_argument("--peers", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--methods", nargs="+", default=["process", "forkserver"],
                    choices=["process", "forkserver", "in-process", "floor"],
                    help="floor: the same FedAvg training in one process with no runtime "
                         "(bench/_local_worker.py --experiment): what start-up is measured against")
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to hfl-launch --set")
    args = ap.parse_args()
    if args.quick:
        args.peers, args.repeats = [4], 1
    rows = []
    for n in args.peers:
        for rep in range(args.repeats):
            order = args.methods if rep % 2 == 0 else args.methods[::-1]
            for method in order:
                rows.append(run_one(n, method, args.rounds, c.OUT_DIR / "startup" / f"{method}-{n}",
                                    args.extra))
    print("\n| peers | start | to round 1 s | wall s | USS/peer MiB | PSS/peer MiB | total PSS MiB |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for n in args.peers:
        for method in args.methods:
            rs = [r for r in rows if r["peers"] == n and r["method"] == method and r["ok"]]
            if not rs:
                print(f"| {n} | {method} | failed | | | | |")
                continue
            agg = {k: [r[k] for r in rs if r[k] is not None]
                   for k in ("to_round1_s", "wall_s", "uss_mib", "pss_mib", "total_pss_mib")}
            cell = {}
            for k, vals in agg.items():
                mean = statistics.mean(vals) if vals else None
                sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
                cell[k] = (mean, sd)
            summary[(n, method)] = cell
            print(f"| {n} | {method} | " + " | ".join(
                f"{fmt(cell[k][0])} ± {fmt(cell[k][1])}" if cell[k][0] is not None else "-"
                for k in ("to_round1_s", "wall_s", "uss_mib", "pss_mib", "total_pss_mib")) + " |")
    base = args.methods[0]
    for other in args.methods[1:]:
        print(f"\nratios {base} / {other} (same run):")
        for n in args.peers:
            a, b = summary.get((n, base)), summary.get((n, other))
            if a and b:
                parts = [f"{k} {a[k][0] / b[k][0]:.2f}x"
                         for k in ("to_round1_s", "wall_s", "uss_mib", "total_pss_mib") if a[k][0] and b[k][0]]
                print(f"  {n} peers: " + ", ".join(parts))
    c.write_json(c.out_path("startup", args.out), {"rows": rows, "args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
