"""FedH2L vs its baselines on rotated-digit domains, mean ± std over seeds.

    python bench/compare_fedh2l.py [--quick] [--seeds 0 1 2] [--rounds 30] [--ablation]

Runs examples/rotated_digits.yaml through hfl-launch for fedh2l, solo (the
paper's IND), agg and fedmd on the same data, models and seeds, and prints one
table of ACC / BWT / FWT (test accuracy of each peer's model chosen on its
validation split, averaged over the 4 peers, then mean ± std over seeds), plus
bytes sent per peer per round. Also runs fedavg on the same homogeneous LeNets
once, for the bytes comparison. ``--ablation`` adds the paper's Table 5
variants: no KL term, no projection, PCGrad instead of the QP projection.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, ROOT, launch, out_path, parser, write_json  # noqa: E402

EXPERIMENT = ROOT / "examples" / "rotated_digits.yaml"
# The example's `algorithm:` section holds FedH2L's options; other methods get
# their own defaults (a peer rejects options its algorithm does not have).
NO_OPTIONS = "defaults.algorithm={}"
METHODS = {
    "FedH2L": ["defaults.cohort.algorithm=fedh2l"],
    "IND (solo)": ["defaults.cohort.algorithm=solo", NO_OPTIONS],
    "AGG": ["defaults.cohort.algorithm=agg", NO_OPTIONS],
    "FedMD": ["defaults.cohort.algorithm=fedmd", NO_OPTIONS],
}
ABLATIONS = {
    "FedH2L no KL": ["defaults.cohort.algorithm=fedh2l", "defaults.algorithm.kl=false"],
    "FedH2L no projection": ["defaults.cohort.algorithm=fedh2l", "defaults.algorithm.projection=none"],
    "FedH2L PCGrad": ["defaults.cohort.algorithm=fedh2l", "defaults.algorithm.projection=pcgrad"],
}


def run_once(label: str, overrides: list[str], seed: int, rounds: int,
             reuse: bool = False) -> dict[str, float] | None:
    slug = label.lower().replace(" ", "_").replace("(", "").replace(")", "")
    run_dir = OUT_DIR / "fedh2l" / f"{slug}_s{seed}"
    if reuse and (run_dir / "results.json").exists():
        done = json.loads((run_dir / "results.json").read_text())
        if done.get("ok") and all(r["rounds"] >= rounds for r in done["peers"] if r["peer"] != "mean"):
            return _summary(done, done["wall_time_s"])
    sets = [*overrides, f"defaults.cohort.rounds={rounds}", f"defaults.data.seed={seed}",
            f"defaults.cohort.seed={seed}", f"defaults.node.seed={seed}",
            f"name=cmp_{slug}_s{seed}"]
    rc, wall, _ = launch(EXPERIMENT, run_dir, sets, timeout_s=900, log_name=f"fedh2l_{slug}_s{seed}")
    if rc != 0:
        return None
    return _summary(json.loads((run_dir / "results.json").read_text()), wall)


def _summary(results: dict, wall: float) -> dict[str, float]:
    rows = results["peers"]
    mean = next(r for r in rows if r["peer"] == "mean")
    peers = [r for r in rows if r["peer"] != "mean"]
    return {
        "ACC": mean["sel_acc"], "BWT": mean["sel_bwt"], "FWT": mean["sel_fwt"],
        "bytes_per_peer_round": sum(r["sent_mb"] * 1e6 / max(r["rounds"], 1) for r in peers) / len(peers),
        "wall_s": wall,
    }


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    m = statistics.mean(values)
    s = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * m:5.1f} ± {100 * s:4.1f}"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse finished runs under runs/bench/fedh2l instead of running them again")
    args = ap.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    rounds = args.rounds or (10 if args.quick else 30)
    methods = {**METHODS, **(ABLATIONS if args.ablation else {})}
    results: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for seed in seeds:
        for label, overrides in methods.items():
            r = run_once(label, overrides, seed, rounds, args.reuse)
            if r is not None:
                results[label].append(r)
    fedavg = run_once("FedAvg (bytes only)", ["defaults.cohort.algorithm=fedavg", NO_OPTIONS],
                      seeds[0], rounds, args.reuse)

    print(f"\nRotated digits, 4 domains (0/20/40/60 deg), LeNet, {rounds} rounds, seeds {seeds}; "
          "accuracy (%) of the validation-selected model, mean ± std over seeds")
    print(f"{'method':<22} {'ACC':>13} {'BWT':>13} {'FWT':>13} {'KB sent/peer/round':>20}")
    for label, runs in results.items():
        kb = statistics.mean(r["bytes_per_peer_round"] for r in runs) / 1e3 if runs else float("nan")
        print(f"{label:<22} {fmt([r['ACC'] for r in runs]):>13} {fmt([r['BWT'] for r in runs]):>13} "
              f"{fmt([r['FWT'] for r in runs]):>13} {kb:>20.1f}")
    if fedavg and results["FedH2L"]:
        h2l = statistics.mean(r["bytes_per_peer_round"] for r in results["FedH2L"])
        print(f"\nbytes sent per peer per round: FedAvg {fedavg['bytes_per_peer_round'] / 1e3:.1f} KB, "
              f"FedH2L {h2l / 1e3:.1f} KB (incl. the one-off seed exchange and heartbeats): "
              f"FedAvg/FedH2L = {fedavg['bytes_per_peer_round'] / h2l:.1f}x")
    write_json(out_path("compare_fedh2l", args.out),
               {"seeds": seeds, "rounds": rounds, "results": results, "fedavg": fedavg})


if __name__ == "__main__":
    main()
