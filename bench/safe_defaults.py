"""The cost of the safe defaults (issue 35): FedAvg on examples/quickstart.yaml with
today's defaults vs. a fully trusted cohort, side by side in one run.

    python bench/safe_defaults.py [--quick]

Defaults: ``cohort.aggregate_at: auto`` (every peer aggregates for itself in cohorts
of up to 16 peers) and ``max_weight_share: equal`` (a claimed sample count buys
nothing). Trusted: ``aggregate_at: aggregator`` (one elected aggregator a round,
trusted for it) and ``max_weight_share: null`` (FedAvg's count-weighted mean as
published). Each setting runs with 4 peers (the quickstart's cohort) and 8 peers,
one run after the other, through hfl-launch (real processes, ZeroMQ, CURVE).

Printed per cohort: final mean ``global_acc``, mean seconds per round, MB sent per
peer over the run, and defaults / trusted. --quick runs 5 rounds.
"""

from __future__ import annotations

import sys

import _common as c
from quickstart import run_one

SETTINGS = {
    "trusted": ["defaults.cohort.aggregate_at=aggregator", "defaults.algorithm.max_weight_share=null"],
    "defaults": [],
}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__)
    args = p.parse_args(argv)
    base = ["defaults.timing.join_timeout_s=30"] + (["defaults.cohort.rounds=5"] if args.quick else [])
    runs = {}
    for peers in (4, 8):
        for label, sets in SETTINGS.items():
            runs[peers, label] = run_one(f"safe-{label}-{peers}", "fedavg", args,
                                         [*base, f"peers={peers}", *sets])
    rows = []
    for peers in (4, 8):
        t, d = runs[peers, "trusted"], runs[peers, "defaults"]
        for label, r in (("trusted", t), ("defaults", d)):
            rows.append([peers, label, r["exit_status"], r["rounds"], r["global_acc"], r["mean_round_s"],
                         r["sent_mb"], c.fmt(c.others_share(r["contention"]), "{:.0%}")])
        rows.append([peers, "defaults / trusted", "", "",
                     c.fmt(c.ratio(d["global_acc"], t["global_acc"]), "{:.3f}x"),
                     c.fmt(c.ratio(d["mean_round_s"], t["mean_round_s"]), "{:.2f}x"),
                     c.fmt(c.ratio(d["sent_mb"], t["sent_mb"]), "{:.2f}x"), ""])
    print(c.table(["peers", "setting", "exit", "rounds", "global_acc", "s/round", "MB sent/peer",
                   "others' CPU"], rows,
                  ["{}", "{}", "{}", "{}", "{:.4f}", "{:.3f}", "{:.2f}", "{}"]))
    c.write_json(c.out_path("safe_defaults", args.out), {"quick": args.quick,
                                   "runs": {f"{k[0]}/{k[1]}": v for k, v in runs.items()}})
    return 0 if all(r["exit_status"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
