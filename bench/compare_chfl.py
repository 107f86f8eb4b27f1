"""CHFL vs SOLO / AVG / AVGKD on completely heterogeneous cohorts, IID and non-IID.

    python bench/compare_chfl.py [--quick] [--seeds 0 1 2 3 4] [--cohorts breast_cancer wine digits]
                                 [--rounds N] [--workers 2] [--launch] [--set KEY=VALUE ...]

The paper's protocol (Liu et al., "Completely heterogeneous federated
learning", Table 1): per run, the best over rounds of the peers' mean test
accuracy (each peer tests on its own held-out rows, in its own feature space);
mean ± std over seeds; the same rounds and hyper-parameters for every method
on a cohort. Cohorts come from the examples, unchanged but for the overrides
below: ``breast_cancer`` and ``wine`` from examples/chfl_tabular.yaml (column
slices + random MLPs; wine with 3 peers), ``digits`` from
examples/chfl_digits.yaml (three input spaces on ResNet-18 / VGG-11 /
MobileNetV3-small). non-IID = Dirichlet label skew, alpha 0.5. The seed sets
the row partition, the column slices, the random MLPs and every peer's
initialisation and batch order.

By default every run is an in-process simulation (``hfl.algorithms.simulate``:
the algorithms' own hooks in the runtime's order and aggregator rotation, no
network), spread over ``--workers`` processes. ``--launch`` runs each through
``hfl-launch`` instead (real peer processes over ZeroMQ; slower).

Budget on a 2-core CPU: the default (3 cohorts x 2 label splits x 4 methods x
5 seeds = 120 runs) takes about 32 minutes, nearly all of it the digits
cohort's ResNet-18 / VGG-11 / MobileNetV3-small; ``--cohorts breast_cancer
wine`` about 1.5 minutes; ``--quick`` (tabular, seed 0) about 10 seconds.
Results and the reading of them: docs/chfl.md.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, ROOT, launch, out_path, parser, write_json  # noqa: E402

METHODS = ["solo", "avg", "avgkd", "chfl"]
LABELS = {"solo": "SOLO", "avg": "AVG", "avgkd": "AVGKD", "chfl": "CHFL"}
PARTITIONS = {
    "IID": ["defaults.data.partition=iid"],
    "non-IID": ["defaults.data.partition=dirichlet", "defaults.data.alpha=0.5"],
}
COHORTS = {
    "breast_cancer": (ROOT / "examples" / "chfl_tabular.yaml", []),
    "wine": (ROOT / "examples" / "chfl_tabular.yaml",
             ["defaults.data.dataset=wine", "peers=3"]),
    "digits": (ROOT / "examples" / "chfl_digits.yaml", []),
}


def overrides(cohort: str, partition: str, method: str, seed: int, rounds: int | None,
              extra: tuple[str, ...] = ()) -> list[str]:
    sets = [*COHORTS[cohort][1], *extra, *PARTITIONS[partition], f"defaults.cohort.algorithm={method}",
            f"defaults.data.seed={seed}", f"defaults.cohort.seed={seed}",
            f"defaults.node.seed={seed}"]
    if method not in ("avgkd", "chfl"):
        sets.append("defaults.algorithm={}")  # the example's alpha/beta are KD options
    if rounds:
        sets.append(f"defaults.cohort.rounds={rounds}")
    return sets


def run_dir_of(cohort: str, partition: str, method: str, seed: int) -> Path:
    return OUT_DIR / "chfl" / f"{cohort}_{partition}_{method}_s{seed}"


Job = tuple[str, str, str, int, int | None, tuple[str, ...]]


def simulate_one(job: Job) -> dict:
    """One cohort run in this process: configs exactly as hfl-launch expands them."""
    import torch

    from hfl.algorithms.simulate import simulate
    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.factory import build_algorithm

    cohort, partition, method, seed, rounds, extra = job
    run_dir = run_dir_of(cohort, partition, method, seed)
    exp = load_experiment(str(COHORTS[cohort][0]),
                          [*overrides(cohort, partition, method, seed, rounds, extra), f"run_dir={run_dir}"])
    plans = expand(exp, gpus=[], ports=list(range(40000, 40000 + exp.peers)))
    t0 = time.perf_counter()
    algorithms = [build_algorithm(p.config)[0] for p in plans]
    torch.set_num_threads(1)
    history = simulate(algorithms, plans[0].config.cohort.rounds)
    means = [statistics.mean(history[p][r]["test_acc"] for p in history)
             for r in range(plans[0].config.cohort.rounds)]
    print(f"  {cohort} {partition} {method} seed {seed}: best mean test acc {max(means):.4f} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return {
        "cohort": cohort, "partition": partition, "method": method, "seed": seed,
        "best_mean_test_acc": max(means), "final_mean_test_acc": means[-1],
        "bytes_shared_per_peer_round": statistics.mean(
            r["bytes_shared"] for recs in history.values() for r in recs),
        "archs": [a.model.arch for a in algorithms],
        "wall_s": time.perf_counter() - t0,
    }


def simulate_or_report(job: Job) -> dict | None:
    """One failed run is reported and left out of the table, not the end of the script."""
    try:
        return simulate_one(job)
    except Exception as exc:  # noqa: BLE001
        print(f"  {job[:4]} FAILED: {type(exc).__name__}: {exc}", flush=True)
        return None


def launch_one(job: Job) -> dict | None:
    cohort, partition, method, seed, rounds, extra = job
    run_dir = run_dir_of(cohort, partition, method, seed)
    rc, wall, _ = launch(COHORTS[cohort][0], run_dir,
                         [*overrides(cohort, partition, method, seed, rounds, extra), f"name=chfl_{cohort}"],
                         timeout_s=1800, log_name=f"chfl_{run_dir.name}")
    if rc != 0:
        return None
    results = json.loads((run_dir / "results.json").read_text())
    return {"cohort": cohort, "partition": partition, "method": method, "seed": seed,
            "best_mean_test_acc": results["best_mean_test_acc"], "wall_s": wall}


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    s = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):5.2f} ± {100 * s:5.2f}"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--cohorts", nargs="+", choices=sorted(COHORTS), default=None)
    ap.add_argument("--rounds", type=int, default=None, help="default: each example's rounds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--launch", action="store_true", help="real peer processes via hfl-launch")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an experiment override applied to every run (repeatable)")
    args = ap.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2, 3, 4])
    cohorts = args.cohorts or (["breast_cancer", "wine"] if args.quick else list(COHORTS))
    jobs = [(c, p, m, s, args.rounds, tuple(args.set)) for c in cohorts for p in PARTITIONS for s in seeds for m in METHODS]
    t0 = time.perf_counter()
    if args.launch:
        runs = [r for r in map(launch_one, jobs) if r is not None]
    else:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            runs = [r for r in pool.map(simulate_or_report, jobs) if r is not None]
    wall = time.perf_counter() - t0

    print(f"\nBest mean test accuracy (%) over rounds, mean ± std over seeds {seeds} "
          f"({'hfl-launch' if args.launch else 'in-process simulation'}, {wall:.0f} s)")
    header = f"{'cohort':<14} {'labels':<8}" + "".join(f"{LABELS[m]:>17}" for m in METHODS)
    print(header + "  every method >= SOLO?")
    table = []
    for c in cohorts:
        for p in PARTITIONS:
            accs = {m: [r["best_mean_test_acc"] for r in runs
                        if (r["cohort"], r["partition"], r["method"]) == (c, p, m)] for m in METHODS}
            solo = statistics.mean(accs["solo"]) if accs["solo"] else float("nan")
            below = [LABELS[m] for m in METHODS[1:] if accs[m] and statistics.mean(accs[m]) < solo]
            print(f"{c:<14} {p:<8}" + "".join(f"{fmt(accs[m]):>17}" for m in METHODS)
                  + f"  {'yes' if not below else 'no: ' + ', '.join(below) + ' below'}")
            table.append({"cohort": c, "partition": p, **{m: accs[m] for m in METHODS}, "below_solo": below})
    shared = {m: statistics.mean(r["bytes_shared_per_peer_round"] for r in runs if r["method"] == m)
              for m in METHODS if any("bytes_shared_per_peer_round" in r and r["method"] == m for r in runs)}
    if shared:
        print("\nbytes shared per peer per round (payload only): "
              + ", ".join(f"{LABELS[m]} {v:.0f}" for m, v in shared.items()))
    write_json(out_path("compare_chfl", args.out),
               {"seeds": seeds, "cohorts": cohorts, "launch": args.launch, "overrides": args.set,
                "wall_s": wall,
                "table": table, "runs": runs})


if __name__ == "__main__":
    main()
