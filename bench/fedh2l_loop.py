"""FedH2L's protocol as one plain loop in one process, beside the same run through hfl.

    python bench/fedh2l_loop.py [--rounds 10000] [--seeds 0 1 2] [--set KEY=VALUE ...] [--loop-only]
                                [--threads 1] [--two-loops | --loops-at-once K] [--profile]
                                [--repeat N]

The experiment (``examples/rotated_mnist.yaml`` by default, ``--experiment``) is
expanded into its peers' configs exactly as ``hfl-launch`` does, and each peer's
algorithm is built exactly as ``hfl-peer`` builds it (``build_algorithm``: same
data, splits, LeNet, optimizer and seeds). The loop then runs the same protocol
with no runtime at all: every peer exchanges its public seed set once, then per
round every peer takes its local step, every peer teaches (posteriors on a
public batch), every peer absorbs the others' teaching (the mimicry step with
the projection), and every ``node.evaluate_every`` rounds (and after the last)
every peer evaluates and keeps its best-validation model (with ``--set
defaults.cohort.overlap=true``, in the order hfl then runs: each round's absorb after
the next round's local steps, except before a round that evaluates). One process, torch
using every core. No sockets, no event loop, no checkpoints, no metrics file.

Beside it (unless ``--loop-only``), ``hfl-launch`` runs the same experiment:
4 processes, 1 torch thread each, real ZeroMQ with CURVE, checkpoints and a
metrics line at every evaluation. Printed side by side for each seed: the wall
time of the rounds (first round's start to last round's end; the launch's from
its peers' metrics lines), the wall time of the whole command (the loop's
including its build, the launch's including process start and the handshake),
the ratio loop / hfl (> 1: the federated run is faster), and both runs'
selected ACC / BWT / FWT (they differ only by scheduling: the loop's peers see
each other's round-r teaching in round r, as hfl's do).

``--repeat N`` runs N pairs per seed, the loop first in odd pairs and hfl first in
even ones (a machine that drifts over the minutes weighs on both sides alike), and
ends with the median and range of the pairs' ratios: the loop alone moved by 35 %
between two runs minutes apart on a quiet machine (docs/runtime.md), so one pair's
ratio says little.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, ROOT, launch, out_path, parser, read_jsonl, write_json  # noqa: E402

EXPERIMENT = ROOT / "examples" / "rotated_mnist.yaml"
SELECTED = ("sel_acc", "sel_bwt", "sel_fwt")


def run_loop(experiment: Path, overrides: list[str], threads: int) -> dict:
    """The protocol in one process: returns wall times and the peers' selected metrics."""
    t_start = time.perf_counter()
    import torch

    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.factory import build_algorithm

    with tempfile.TemporaryDirectory() as tmp:
        exp = load_experiment(str(experiment), [*overrides, "defaults.security.mode=none",
                                                f"run_dir={tmp}"])
        plans = expand(exp, gpus=[], ports=list(range(20000, 20000 + exp.peers)))
    cfgs = [p.config for p in plans]
    algs = {}
    for cfg in cfgs:
        algs[cfg.node.id], _ = build_algorithm(cfg)
    torch.set_num_threads(threads)
    for owner, alg in algs.items():  # the public seed exchange at join
        for other in algs.values():
            if other is not alg:
                other.add_peer_seeds(owner, alg.ctx.public.x, alg.ctx.public.y)
    rounds = cfgs[0].cohort.rounds
    every = cfgs[0].node.evaluate_every
    overlap = cfgs[0].cohort.overlap  # the order hfl's RoundProcedures.one_round runs then
    t_rounds, cpu_rounds = time.perf_counter(), time.process_time()
    last: dict[str, dict] = {}
    ahead = False  # round r's local steps were taken in round r - 1
    for r in range(1, rounds + 1):
        evaluates = r % every == 0 or r == rounds
        if not ahead:
            for alg in algs.values():
                alg.local_update(r)
        shared = {pid: alg.share(r) for pid, alg in algs.items()}
        ahead = overlap and not evaluates
        if ahead:
            for alg in algs.values():
                alg.local_update(r + 1)
        for pid, alg in algs.items():
            alg.absorb(r, {o: p for o, p in shared.items() if o != pid})
        if evaluates:
            last = {pid: alg.evaluate() for pid, alg in algs.items()}
    t_end = time.perf_counter()
    return {
        "rounds": rounds,
        "rounds_s": t_end - t_rounds,
        "total_s": t_end - t_start,
        # every thread's CPU over the rounds, per peer-round: all of it is the method's
        "cpu_per_peer_round_s": (time.process_time() - cpu_rounds) / (rounds * len(algs)),
        **{k: statistics.fmean(m[k] for m in last.values()) for k in SELECTED},
    }


def run_hfl(experiment: Path, overrides: list[str], run_dir: Path, label: str,
            profile: bool = False) -> dict | None:
    profiles = run_dir.parent / f"{run_dir.name}-profile"  # not in the run dir: --fresh
    shutil.rmtree(profiles, ignore_errors=True)  # an earlier run's peers are not this one's
    env = {"HFL_PROFILE": str(profiles / "{id}.pstats")} if profile else None
    rc, wall, _ = launch(experiment, run_dir, overrides, timeout_s=7200, log_name=label, env=env)
    if rc != 0:
        return None
    results = json.loads((run_dir / "results.json").read_text())
    peers = [r["peer"] for r in results["peers"] if r["peer"] != "mean"]
    lines = {p: read_jsonl(run_dir / p / "metrics.jsonl") for p in peers}
    start = min(ls[0]["time"] for ls in lines.values())
    end = max(ls[-1]["time"] + ls[-1]["round_time_s"] for ls in lines.values())
    peer_rounds = sum(x.get("span", 1) for ls in lines.values() for x in ls)
    cpu = {key: sum(x.get(key, 0.0) for ls in lines.values() for x in ls) / peer_rounds
           for key in ("cpu_s", "compute_cpu_s")}
    extra = {}
    threads: dict[str, float] = {}  # each thread's CPU over the rounds, all peers
    for p in peers:
        summary = json.loads((run_dir / p / "summary.json").read_text())
        for name, cpu_s in summary.get("rounds_cpu_by_thread_s", {}).items():
            threads[name] = threads.get(name, 0.0) + cpu_s
    if threads:
        extra["thread_per_peer_round_s"] = {
            name: s / peer_rounds for name, s in sorted(threads.items(), key=lambda kv: -kv[1])}
    if profile:
        from hfl.launch.profile import split

        extra["loop_thread_per_peer_round_s"] = {
            kind: s / peer_rounds
            for kind, s in split(sorted(str(p) for p in profiles.glob("*.pstats"))).items()}
    return {
        # each peer process's CPU per peer-round (rounds and what happens between them),
        # and its part in the method's calls; the rest is the runtime's
        "cpu_per_peer_round_s": cpu["cpu_s"],
        "compute_cpu_per_peer_round_s": cpu["compute_cpu_s"],
        **extra,
        "rounds": results["peers"][0]["rounds"],
        "rounds_s": end - start,
        "total_s": wall,
        **{k: statistics.fmean(ls[-1][k] for ls in lines.values()) for k in SELECTED},
        "sent_per_round_per_peer_b": statistics.fmean(
            sum(x["bytes_sent"] for x in ls) / sum(x.get("span", 1) for x in ls)
            for ls in lines.values()),
    }


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--experiment", type=Path, default=EXPERIMENT)
    ap.add_argument("--rounds", type=int, default=None, help="default: the experiment's")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads of the loop (default: every core)")
    ap.add_argument("--loop-only", action="store_true")
    ap.add_argument("--loops-at-once", type=int, default=0, metavar="K",
                    help="also run K loops at once, each in a process of its own (1 torch "
                         "thread each): with K = 4, the four processes hfl runs, sharing the "
                         "cores as they do, with no runtime at all")
    ap.add_argument("--two-loops", action="store_true",
                    help="also run two loops at once, each in a process of its own (1 torch "
                         "thread each): what the method's CPU costs when two processes share "
                         "the machine, with no runtime at all (a floor for the 4 processes)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="N loop/hfl pairs per seed, alternating which runs first; prints the "
                         "median and range of their ratios")
    ap.add_argument("--profile", action="store_true",
                    help="profile each peer's event loop thread (hfl-peer --profile) and split "
                         "the runtime's CPU per peer-round by kind of cost")
    args = ap.parse_args()
    if args.quick:
        args.rounds = args.rounds or 300
    rows = []
    for seed in args.seeds:
        sets = [*args.sets, f"defaults.data.seed={seed}", f"defaults.cohort.seed={seed}",
                f"defaults.node.seed={seed}"]
        if args.rounds:
            sets.append(f"defaults.cohort.rounds={args.rounds}")
        for rep in range(args.repeat):
            tag = f"seed {seed}" + (f", pair {rep + 1} of {args.repeat}" if args.repeat > 1 else "")
            sides = ["loop", "hfl"] if rep % 2 == 0 or args.loop_only else ["hfl", "loop"]
            got: dict = {"loop": None, "hfl": None}
            for side in sides:
                if side == "loop":
                    print(f"{tag}: single-process loop", flush=True)
                    got["loop"] = run_loop(args.experiment, sets, args.threads)
                elif not args.loop_only:
                    print(f"{tag}: hfl-launch", flush=True)
                    got["hfl"] = run_hfl(args.experiment, sets, OUT_DIR / "fedh2l_loop" / f"s{seed}",
                                         f"fedh2l_loop_s{seed}", profile=args.profile)
                    if got["hfl"] is None:
                        sys.exit(f"hfl-launch failed for seed {seed}: see {OUT_DIR / 'logs'}")
            k = args.loops_at_once or (2 if args.two_loops else 0)
            rows.append({"seed": seed, "pair": rep + 1, **got,
                         "loops_at_once": loops_at_once(args.experiment, seed, sets, k)
                         if k else None})
            _print_row(rows[-1])
    if args.repeat > 1 and not args.loop_only:
        _print_spread(rows)
    write_json(out_path("fedh2l_loop", args.out),
               {"experiment": str(args.experiment), "sets": args.sets, "threads": args.threads,
                "rows": rows})


def _print_spread(rows: list[dict]) -> None:
    """The median and range over the pairs of hfl / loop CPU and loop / hfl wall time."""
    ratios = {
        "hfl / loop CPU per peer-round": [r["hfl"]["cpu_per_peer_round_s"]
                                          / r["loop"]["cpu_per_peer_round_s"] for r in rows],
        "loop / hfl wall time of the rounds": [r["loop"]["rounds_s"] / r["hfl"]["rounds_s"]
                                               for r in rows],
        "the method's CPU in hfl / the loop's": [r["hfl"]["compute_cpu_per_peer_round_s"]
                                                 / r["loop"]["cpu_per_peer_round_s"] for r in rows],
    }
    if all(r.get("loops_at_once") for r in rows):
        k = len(rows[0]["loops_at_once"])
        at_once = [statistics.fmean(x["cpu_per_peer_round_s"] for x in r["loops_at_once"])
                   for r in rows]
        ratios[f"{k} loops at once / the loop alone, CPU"] = [
            a / r["loop"]["cpu_per_peer_round_s"] for a, r in zip(at_once, rows, strict=True)]
        ratios[f"hfl / {k} loops at once, CPU"] = [
            r["hfl"]["cpu_per_peer_round_s"] / a for a, r in zip(at_once, rows, strict=True)]
    print(f"\nover {len(rows)} pairs (median, range):")
    for name, xs in ratios.items():
        print(f"  {name}: {statistics.median(xs):.2f}x ({min(xs):.2f}x to {max(xs):.2f}x)")
    runtime = [1e3 * (r["hfl"]["cpu_per_peer_round_s"] - r["hfl"]["compute_cpu_per_peer_round_s"])
               for r in rows]
    print(f"  the runtime's CPU per peer-round: {statistics.median(runtime):.2f} ms "
          f"({min(runtime):.2f} to {max(runtime):.2f})")


def loops_at_once(experiment: Path, seed: int, sets: list[str], k: int) -> list[dict]:
    """``k`` loops at once, each a process of this script (``--loop-only --threads 1``)
    on the same experiment and seed (each ran the default's, seed 0: a review)."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"loop{i}.json" for i in range(k)]
        procs = [subprocess.Popen([sys.executable, __file__, "--loop-only", "--threads", "1",
                                   "--experiment", str(experiment), "--seeds", str(seed),
                                   "--out", str(out), *[a for s in sets for a in ("--set", s)]],
                                  stdout=subprocess.DEVNULL) for out in outs]
        if any(p.wait() != 0 for p in procs):
            sys.exit("a loop of --loops-at-once failed")
        return [json.loads(out.read_text())["rows"][0]["loop"] for out in outs]


def _print_row(row: dict) -> None:
    loop, fed = row["loop"], row["hfl"]
    print(f"  loop ({loop['rounds']} rounds): rounds {loop['rounds_s']:.1f} s, "
          f"command {loop['total_s']:.1f} s, ACC/BWT/FWT "
          + "/".join(f"{loop[k]:.4f}" for k in SELECTED))
    if row.get("loops_at_once"):
        cpu = [1e3 * x["cpu_per_peer_round_s"] for x in row["loops_at_once"]]
        print(f"  {len(cpu)} loops at once (1 thread each): CPU per peer-round "
              + ", ".join(f"{c:.2f}" for c in cpu) + f" ms, "
              f"{statistics.fmean(cpu) / 1e3 / row['loop']['cpu_per_peer_round_s']:.2f}x the loop alone")
    if fed is not None:
        print(f"  hfl  ({fed['rounds']} rounds): rounds {fed['rounds_s']:.1f} s, "
              f"command {fed['total_s']:.1f} s, ACC/BWT/FWT "
              + "/".join(f"{fed[k]:.4f}" for k in SELECTED)
              + f", {fed['sent_per_round_per_peer_b'] / 1e3:.1f} kB sent per round per peer")
        print(f"  loop / hfl: rounds {loop['rounds_s'] / fed['rounds_s']:.2f}x, "
              f"command {loop['total_s'] / fed['total_s']:.2f}x", flush=True)
        cpu, compute = fed["cpu_per_peer_round_s"], fed["compute_cpu_per_peer_round_s"]
        print(f"  CPU per peer-round: loop {1e3 * loop['cpu_per_peer_round_s']:.2f} ms, hfl "
              f"{1e3 * cpu:.2f} ms = method {1e3 * compute:.2f} + runtime "
              f"{1e3 * (cpu - compute):.2f} (hfl / loop {cpu / loop['cpu_per_peer_round_s']:.2f}x)")
        if "thread_per_peer_round_s" in fed:
            print("  hfl's CPU per peer-round by thread: " + ", ".join(
                f"{name} {1e3 * s:.2f} ms" for name, s in fed["thread_per_peer_round_s"].items()))
        if "loop_thread_per_peer_round_s" in fed:
            from hfl.launch.profile import describe

            by_kind = fed["loop_thread_per_peer_round_s"]
            print(f"  the runtime's event loop thread, per peer-round (profile; "
                  f"{1e3 * sum(by_kind.values()):.2f} ms):")
            for line in describe(by_kind, unit="ms"):
                print("    " + line)


if __name__ == "__main__":
    main()
