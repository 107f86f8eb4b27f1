"""FedH2L vs its baselines on rotated-digit domains, mean ± std over seeds.

    python bench/compare_fedh2l.py [--quick] [--seeds 0 1 2] [--rounds 30] [--ablation] [--forms]

Runs examples/rotated_digits.yaml through hfl-launch for fedh2l, solo (the
paper's IND), agg and fedmd on the same data, models and seeds, and prints one
table of ACC / BWT / FWT, both of each peer's model chosen on its validation
split and of its final model (averaged over the 4 peers, then mean ± std over
seeds), plus bytes sent per peer per round. Also runs fedavg on the same
homogeneous LeNets once, for the bytes comparison. ``--ablation`` adds the
paper's Table 5 variants: no KL term, no projection, PCGrad instead of the QP
projection. ``--forms`` adds FedH2L's other g_loc form (the parameter change
with an AMSGrad of its own for the global step), the paper's Algorithm 1 to the
letter (one local batch per round, 10x the rounds: equal local work) and
selection on the peer's validation plus public split; and a second table, per
FedH2L form: how often the projection fired, the mean cosine of g_pub and g_loc,
and the accuracy of the model kept under each tie rule (earliest or latest
maximum of validation accuracy, read from the same run) beside the final model's.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, ROOT, launch, out_path, parser, read_jsonl, write_json  # noqa: E402

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
# The example takes 10 local batches a round; "1 batch" is Algorithm 1 to the
# letter (one local step, one global step) over 10x the rounds.
ONE_BATCH = "one batch"
FORMS = {
    "FedH2L change+AMSGrad": ["defaults.cohort.algorithm=fedh2l", "defaults.algorithm.g_loc=change",
                              "defaults.algorithm.global_optimizer=amsgrad"],
    f"FedH2L {ONE_BATCH}": ["defaults.cohort.algorithm=fedh2l", "defaults.train.max_batches=1"],
    "FedH2L sel val+public": ["defaults.cohort.algorithm=fedh2l", "defaults.selection.on=val+public"],
}

def run_once(label: str, overrides: list[str], seed: int, rounds: int,
             reuse: bool = False) -> dict[str, float] | None:
    slug = label.lower().replace(" ", "_").replace("(", "").replace(")", "").replace("+", "_")
    run_dir = OUT_DIR / "fedh2l" / f"{slug}_s{seed}"
    if ONE_BATCH in label:
        rounds *= 10
    if reuse and (run_dir / "results.json").exists():
        done = json.loads((run_dir / "results.json").read_text())
        if done.get("ok") and all(r["rounds"] >= rounds for r in done["peers"] if r["peer"] != "mean"):
            return _summary(done, run_dir, done["wall_time_s"])
    sets = [*overrides, f"defaults.cohort.rounds={rounds}", f"defaults.data.seed={seed}",
            f"defaults.cohort.seed={seed}", f"defaults.node.seed={seed}",
            f"name=cmp_{slug}_s{seed}"]
    rc, wall, _ = launch(EXPERIMENT, run_dir, sets, timeout_s=900, log_name=f"fedh2l_{slug}_s{seed}")
    if rc != 0:
        return None
    return _summary(json.loads((run_dir / "results.json").read_text()), run_dir, wall)


def _summary(results: dict, run_dir: Path, wall: float) -> dict[str, float]:
    """Means over the peers: the runtime's selected metrics (sel_*), the final model's,
    and, read back from each peer's metrics.jsonl, the projection statistics and the
    model each tie rule keeps."""
    peers = [r for r in results["peers"] if r["peer"] != "mean"]
    per_peer = [_peer_stats(read_jsonl(run_dir / r["peer"] / "metrics.jsonl")) for r in peers]
    out = {key: statistics.mean(p[key] for p in per_peer) for key in per_peer[0]}
    out["bytes_per_peer_round"] = sum(r["sent_mb"] * 1e6 / max(r["rounds"], 1) for r in peers) / len(peers)
    out["wall_s"] = wall
    return out


def _peer_stats(records: list[dict]) -> dict[str, float]:
    by_round = {r["round"]: r for r in records}  # a restarted peer may repeat a round
    rows = [by_round[k] for k in sorted(by_round)]
    last = rows[-1]
    stats = {"ACC": last["sel_acc"], "BWT": last["sel_bwt"], "FWT": last["sel_fwt"],
             "final ACC": last["acc"], "final BWT": last["bwt"], "final FWT": last["fwt"]}
    best = max(r["val_acc"] for r in rows)
    tied = [r for r in rows if r["val_acc"] == best]
    stats["first max ACC"], stats["first max round"] = tied[0]["acc"], tied[0]["round"]
    stats["last max ACC"], stats["last max round"] = tied[-1]["acc"], tied[-1]["round"]
    stats["tied rounds"] = len(tied)
    steps = [r for r in rows if "projected" in r]
    if steps:
        stats["fired"] = statistics.mean(r["projected"] for r in steps)
        stats["cos"] = statistics.mean(r["cos_pub_loc"] for r in steps)
    return stats


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
    ap.add_argument("--forms", action="store_true")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse finished runs under runs/bench/fedh2l instead of running them again")
    args = ap.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    rounds = args.rounds or (10 if args.quick else 30)
    methods = {**METHODS, **(ABLATIONS if args.ablation else {}), **(FORMS if args.forms else {})}
    results: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for seed in seeds:
        for label, overrides in methods.items():
            r = run_once(label, overrides, seed, rounds, args.reuse)
            if r is not None:
                results[label].append(r)
    fedavg = run_once("FedAvg (bytes only)", ["defaults.cohort.algorithm=fedavg", NO_OPTIONS],
                      seeds[0], rounds, args.reuse)

    print(f"\nRotated digits, 4 domains (0/20/40/60 deg), LeNet, {rounds} rounds, seeds {seeds}; "
          "accuracy (%) of the validation-selected model and of the final model, "
          "mean ± std over seeds")
    keys = ["ACC", "BWT", "FWT", "final ACC", "final BWT", "final FWT"]
    print(f"{'method':<24} " + " ".join(f"{k:>13}" for k in keys) + f" {'KB/peer/round':>14}")
    for label, runs in results.items():
        kb = statistics.mean(r["bytes_per_peer_round"] for r in runs) / 1e3 if runs else float("nan")
        print(f"{label:<24} " + " ".join(f"{fmt([r[k] for r in runs]):>13}" for k in keys)
              + f" {kb:>14.1f}")

    forms = [label for label, runs in results.items() if runs and "fired" in runs[0]]
    print("\nFedH2L's global step, per form (means over peers, then over seeds): how often the "
          "projection fired, cos(g_pub, g_loc), and the ACC of the model kept by each tie rule")
    keys = ["fired", "cos", "first max ACC", "last max ACC", "final ACC"]
    print(f"{'method':<24} " + " ".join(f"{k:>13}" for k in keys)
          + f" {'rounds kept (first/last)':>25} {'tied rounds':>12}")
    for label in forms:
        runs = results[label]
        kept = (f"{statistics.mean(r['first max round'] for r in runs):.1f} / "
                f"{statistics.mean(r['last max round'] for r in runs):.1f}")
        cos = statistics.mean(r["cos"] for r in runs)
        print(f"{label:<24} {fmt([r['fired'] for r in runs]):>13} {cos:>+13.3f} "
              + " ".join(f"{fmt([r[k] for r in runs]):>13}" for k in keys[2:])
              + f" {kept:>25} {statistics.mean(r['tied rounds'] for r in runs):>12.1f}")
    if fedavg and results["FedH2L"]:
        h2l = statistics.mean(r["bytes_per_peer_round"] for r in results["FedH2L"])
        print(f"\nbytes sent per peer per round: FedAvg {fedavg['bytes_per_peer_round'] / 1e3:.1f} KB, "
              f"FedH2L {h2l / 1e3:.1f} KB (incl. the one-off seed exchange and heartbeats): "
              f"FedAvg/FedH2L = {fedavg['bytes_per_peer_round'] / h2l:.1f}x")
    write_json(out_path("compare_fedh2l", args.out),
               {"seeds": seeds, "rounds": rounds, "results": results, "fedavg": fedavg})


if __name__ == "__main__":
    main()
