"""Malicious members against robust aggregation and aggregator-free rounds.

    python bench/attacks.py [--quick] [--seeds 0 1 2] [--rounds 10] [--workers 2]

Cohort: examples/quickstart.yaml with 8 peers, FedAvg, IID rows of scikit-learn's
digits, 20 % held out first as a balanced test set every peer scores
(``global_acc``), 10 rounds. f of the 8 peers (the last ids) are attackers:
the plugins of examples/plugins/attackers.py, loaded by ``path.py:Class`` like any
user method (only public interfaces). Every run is an in-process simulation of
the real algorithm objects (``hfl.algorithms.simulate``), with the runtime's
aggregator rotation (``aggregate_at: aggregator``) or with every peer
aggregating for itself (``aggregate_at: every_peer``).

Printed: the honest peers' mean ``global_acc`` in the final round (and in their
worst round from round 3 on, which shows a lying aggregator's rounds), mean ±
std over seeds, per attack x defense, beside no attack; the cost of each
defense with no attack (seconds per aggregate, relative to the mean); bytes per
peer per round with and without an aggregator.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, ROOT, out_path, parser, write_json  # noqa: E402
from _common import pct_pm as pm  # noqa: E402

EXAMPLE = ROOT / "examples" / "quickstart.yaml"
PLUGINS = ROOT / "examples" / "plugins" / "attackers.py"
PEERS = 8
BASE = [f"peers={PEERS}", "defaults.data.partition=iid", "defaults.data.global_test_fraction=0.2"]
ATTACKS = {  # label -> plugin class (None: no attacker)
    "none": None,
    "sign flip": "SignFlip",
    "scale x10": "Scale10",
    "scale x100": "Scale100",
    "Gaussian noise": "GaussianNoise",
    "label flip": "LabelFlip",
    "inflated num_samples": "InflatedCount",
    "colluders (same vector)": "Colluder",
    "lying aggregator": "LyingAggregator",
}
DEFENSES = {  # label -> algorithm overrides
    "mean (no defense)": {},
    "mean, weight cap 1/8": {"max_weight_share": 0.125},
    "median": {"robust": "median"},
    "trimmed mean 25%": {"robust": "trimmed_mean", "trim_fraction": 0.25},
    "multi-Krum (f=2)": {"robust": "multi_krum", "byzantine": 2},
    "geometric median": {"robust": "geometric_median"},
}

Job = tuple[str, str, int, int, str, int, int]  # attack, defense, f, seed, aggregate_at, rounds, -


def run_one(job: Job) -> dict | None:
    import torch

    from hfl.algorithms.simulate import simulate
    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.factory import build_algorithm

    attack, defense, f, seed, aggregate_at, rounds, _ = job
    torch.set_num_threads(1)
    (OUT_DIR / "attacks").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=OUT_DIR / "attacks") as run_dir:
        sets = [*BASE, f"defaults.cohort.rounds={rounds}", f"defaults.data.seed={seed}",
                f"defaults.cohort.seed={seed}", f"defaults.node.seed={seed}", f"run_dir={run_dir}",
                *(f"defaults.algorithm.{k}={v}" for k, v in DEFENSES[defense].items())]
        try:
            exp = load_experiment(str(EXAMPLE), sets)
            plans = expand(exp, gpus=[], ports=list(range(43000, 43000 + exp.peers)))
            ids = sorted(p.config.node.id for p in plans)
            attackers = set(ids[len(ids) - f:]) if ATTACKS[attack] else set()
            algs = []
            for plan in plans:
                cfg = plan.config
                if cfg.node.id in attackers:
                    cfg = dataclasses.replace(cfg, cohort=dataclasses.replace(
                        cfg.cohort, algorithm=f"{PLUGINS}:{ATTACKS[attack]}"))
                algs.append(build_algorithm(cfg)[0])
            timed = [0.0, 0]

            def timing(alg):  # seconds spent in aggregate(), for the cost table
                aggregate = alg.aggregate

                def wrapped(*args):
                    t0 = time.perf_counter()
                    out = aggregate(*args)
                    timed[0] += time.perf_counter() - t0
                    timed[1] += 1
                    return out
                alg.aggregate = wrapped

            for alg in algs:
                timing(alg)
            t0 = time.perf_counter()
            history = simulate(algs, rounds, aggregate_at=aggregate_at)
            wall = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001  (one failed run is reported, not the end)
            print(f"  {attack} / {defense} / f={f} / seed {seed} FAILED: {type(exc).__name__}: {exc}",
                  flush=True)
            return None
    honest = [p for p in history if p not in attackers]
    per_round = [statistics.mean(history[p][r]["global_acc"] for p in honest) for r in range(rounds)]
    out = {"attack": attack, "defense": defense, "f": f, "seed": seed, "aggregate_at": aggregate_at,
           "final": per_round[-1], "worst": min(per_round[2:]), "per_round": per_round,
           "aggregate_s": timed[0] / max(timed[1], 1), "wall_s": wall,
           "bytes_per_peer_round": statistics.mean(r["bytes_shared"] for h in history.values() for r in h)}
    print(f"  {attack:<24} {defense:<22} f={f} {aggregate_at:<10} seed {seed}: final "
          f"{out['final']:.4f} worst {out['worst']:.4f} ({wall:.1f} s)", flush=True)
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--f", type=int, nargs="+", default=[1, 2], help="attackers among the 8 peers")
    args = ap.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    attacks = list(ATTACKS) if not args.quick else ["none", "scale x100", "lying aggregator"]
    jobs: list[Job] = []
    for defense in DEFENSES:
        for attack in attacks:
            for f in ([0] if attack == "none" else args.f):
                for at in (["aggregator", "every_peer"] if attack == "lying aggregator" else ["aggregator"]):
                    jobs += [(attack, defense, f, s, at, args.rounds, 0) for s in seeds]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = [r for r in pool.map(run_one, jobs) if r is not None]
    wall = time.perf_counter() - t0

    def cell(attack, defense, f, at="aggregator", key="final"):
        return [r[key] for r in runs if (r["attack"], r["defense"], r["f"], r["aggregate_at"])
                == (attack, defense, f, at)]

    print(f"\nHonest peers' mean global_acc (%), final round, mean ± std over seeds {seeds}; "
          f"{PEERS} peers, f attackers, {args.rounds} rounds, FedAvg")
    header = "| attack | f | " + " | ".join(DEFENSES) + " |"
    print(header)
    print("|" + "---|" * (len(DEFENSES) + 2))
    rows = [("none", 0, "aggregator")] + [(a, f, "aggregator") for a in attacks if a != "none" for f in args.f]
    rows += [("lying aggregator", f, "every_peer") for f in args.f if "lying aggregator" in attacks]
    table = []
    for attack, f, at in rows:
        label = attack + (" (every_peer)" if at == "every_peer" else "")
        cells = [pm(cell(attack, d, f, at)) for d in DEFENSES]
        table.append({"attack": label, "f": f, "cells": dict(zip(DEFENSES, cells, strict=True))})
        print(f"| {label} | {f} | " + " | ".join(cells) + " |")
    if "lying aggregator" in attacks:
        print("\nLying aggregator: honest accuracy in their worst round (round >= 3), aggregator vs every_peer")
        for f in args.f:
            for at in ("aggregator", "every_peer"):
                print(f"| f={f} {at:<10} | " + " | ".join(
                    pm(cell("lying aggregator", d, f, at, "worst")) for d in DEFENSES) + " |")
    print("\nCost with no attack: seconds per aggregate() (8 contributions of a 41,802-parameter MLP), "
          "ratio to the mean")
    base = statistics.mean(cell("none", "mean (no defense)", 0, key="aggregate_s") or [float("nan")])
    cost = {}
    for d in DEFENSES:
        t = statistics.mean(cell("none", d, 0, key="aggregate_s") or [float("nan")])
        cost[d] = t
        print(f"| {d:<22} | {t * 1000:7.2f} ms | {t / base:5.1f}x |")
    every = [r["bytes_per_peer_round"] for r in runs if r["aggregate_at"] == "every_peer"]
    agg = [r["bytes_per_peer_round"] for r in runs if r["aggregate_at"] == "aggregator"]
    if every:
        print(f"\nBytes each peer sends per round (payloads): aggregator {statistics.mean(agg):,.0f} + the "
              f"aggregator's result to {PEERS - 1} peers; every_peer {statistics.mean(every) * (PEERS - 1):,.0f} "
              f"({PEERS - 1} copies of its payload, no result)")
    print(f"\n({wall:.0f} s for {len(jobs)} simulated cohorts)")
    write_json(out_path("attacks", args.out), {"seeds": seeds, "rounds": args.rounds, "table": table,
                                                "cost_s": cost, "wall_s": wall, "runs": runs})


if __name__ == "__main__":
    main()
