"""Quickstart, federated vs. solo: examples/quickstart.yaml run with fedavg and with solo.

    python bench/quickstart.py [--quick]

Runs hfl-launch twice, one run after the other (never concurrently: both use
every core), with the same experiment file; the solo run only changes
``defaults.cohort.algorithm`` and ``name``. Reads each run's results.json and
prints the final mean accuracies on the shared global test set (``global_acc``)
and on each peer's private test split (``test_acc``), the wall times, and
fedavg - solo / fedavg ÷ solo side by side.

--quick runs 2 peers for 5 rounds instead of the file's 4 peers and 20 rounds.
"""

from __future__ import annotations

import json
import math
import sys

import _common as c
import yaml

RUN_TIMEOUT_S = 300
ACC_KEYS = ("global_acc", "test_acc", "best_global_acc")


def num(value) -> float:
    """A number of results.json (where NaN is written as null) as a float."""
    return float(value) if isinstance(value, (int, float)) else math.nan


def run_one(label: str, algorithm: str, args, extra: list[str]) -> dict:
    run_dir = c.OUT_DIR / "quickstart" / label
    overrides = [f"defaults.cohort.algorithm={algorithm}", f"name=bench-quickstart-{label}", *extra]
    busy = c.Contention()
    rc, wall, _ = c.launch(c.QUICKSTART, run_dir, overrides, RUN_TIMEOUT_S, f"quickstart-{label}")
    contention = busy.stop()
    res_path = run_dir / "results.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    mean_row = next((r for r in res.get("peers", []) if r.get("peer") == "mean"), {})
    records = [rec for p in sorted(run_dir.glob("p*/metrics.jsonl")) for rec in c.read_jsonl(p)]
    # The rounds' own span (first round start -> last round end, any peer): excludes start-up.
    configs = sorted((run_dir / "peers").glob("*.yaml"))
    configured = yaml.safe_load(configs[0].read_text())["cohort"]["rounds"] if configs else 0
    span = (
        max(r["time"] + r["round_time_s"] for r in records) - min(r["time"] for r in records)
        if records
        else math.nan
    )
    return {
        "label": label,
        "algorithm": algorithm,
        "contention": contention,
        "run_dir": str(run_dir),
        "exit_status": rc,
        "wall_s": wall,
        "launcher_wall_s": num(res.get("wall_time_s")),
        "rounds_span_s": span,
        "global_acc": num(mean_row.get("global_acc")),
        "test_acc": num(mean_row.get("test_acc")),
        "best_global_acc": num(mean_row.get("best_global_acc")),
        "mean_round_s": num(mean_row.get("mean_round_s")),
        "sent_mb": num(mean_row.get("sent_mb")),
        "rounds": mean_row.get("rounds"),
        "rounds_configured": configured,
        "join_timeouts": c.join_timeouts(run_dir),
        "peers": [r for r in res.get("peers", []) if r.get("peer") != "mean"],
    }


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__)
    p.add_argument(
        "--join-timeout-s",
        type=float,
        default=30.0,
        help="timing.join_timeout_s for both runs (the file's default is 120 s); bounds "
        "the solo start-up race described in bench/README.md",
    )
    args = p.parse_args(argv)
    extra = [f"defaults.timing.join_timeout_s={args.join_timeout_s:g}"]
    if args.quick:
        extra += ["peers=2", "defaults.cohort.rounds=5"]
    print(
        f"quickstart: fedavg vs solo ({'quick: 2 peers, 5 rounds' if args.quick else 'as in the file'}); "
        f"overrides {extra}"
    )
    fed = run_one("fedavg", "fedavg", args, extra)
    solo = run_one("solo", "solo", args, extra)

    rows = [
        [
            r["label"],
            r["exit_status"],
            r["rounds"],
            r["global_acc"],
            r["test_acc"],
            r["best_global_acc"],
            r["mean_round_s"],
            r["sent_mb"],
            r["rounds_span_s"],
            r["wall_s"],
            c.fmt(c.others_share(r["contention"]), "{:.0%}"),
        ]
        for r in (fed, solo)
    ]
    rows.append(
        [
            "fedavg - solo",
            "",
            "",
            *(c.fmt(fed[k] - solo[k], "{:+.4f}") for k in ACC_KEYS),
            math.nan,
            math.nan,
            c.fmt(fed["rounds_span_s"] - solo["rounds_span_s"], "{:+.2f}"),
            c.fmt(fed["wall_s"] - solo["wall_s"], "{:+.1f}"),
            "",
        ]
    )
    x = lambda k: c.fmt(c.ratio(fed[k], solo[k]), "{:.3f}x")  # noqa: E731
    rows.append(
        [
            "fedavg / solo",
            "",
            "",
            *(x(k) for k in ACC_KEYS),
            x("mean_round_s"),
            math.nan,
            x("rounds_span_s"),
            x("wall_s"),
            "",
        ]
    )
    print()
    print(
        c.table(
            [
                "run",
                "exit",
                "rounds",
                "global acc",
                "test acc",
                "best global",
                "s/round",
                "sent MB/peer",
                "rounds span s",
                "wall s",
                "others' CPU",
            ],
            rows,
            [
                "{}",
                "{}",
                "{}",
                "{:.4f}",
                "{:.4f}",
                "{:.4f}",
                "{:.3f}",
                "{:.2f}",
                "{:.2f}",
                "{:.1f}",
                "{}",
            ],
        )
    )
    print(
        "\nglobal acc: mean over peers of the final accuracy on the shared held-out set; test acc: on "
        "each peer's own (label-skewed) test split. wall s: the whole hfl-launch process, start-up "
        "included; rounds span s: first round start to last round end; others' CPU: share of the "
        "machine's CPU used by processes outside this benchmark during the run."
    )
    for r in (fed, solo):
        short = [
            f"{q['peer']} ({q['rounds']})"
            for q in r["peers"]
            if q.get("rounds", 0) < r["rounds_configured"]
        ]
        if short:
            print(
                f"NOTE ({r['label']}): trained fewer than {r['rounds_configured']} rounds: {', '.join(short)} "
                f"(skipped rounds by catching up to the cohort; bench/README.md)"
            )
        if r["join_timeouts"]:
            print(
                f"NOTE ({r['label']}): {len(r['join_timeouts'])} peer(s) waited out join_timeout_s "
                f"({r['join_timeouts'][0]}); its wall time includes that wait (bench/README.md)."
            )
    c.write_json(
        c.out_path("quickstart", args.out),
        {
            "benchmark": "quickstart",
            "quick": args.quick,
            "overrides": extra,
            "fedavg": fed,
            "solo": solo,
            "diff": {
                "global_acc": fed["global_acc"] - solo["global_acc"],
                "test_acc": fed["test_acc"] - solo["test_acc"],
            },
            "ratio": {
                "wall_s": c.ratio(fed["wall_s"], solo["wall_s"]),
                "rounds_span_s": c.ratio(fed["rounds_span_s"], solo["rounds_span_s"]),
                "global_acc": c.ratio(fed["global_acc"], solo["global_acc"]),
            },
        },
    )
    return 0 if fed["exit_status"] == 0 and solo["exit_status"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
