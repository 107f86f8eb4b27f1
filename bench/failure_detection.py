"""Failure detection: time from a peer's death to the survivors declaring it dead.

    python bench/failure_detection.py [--quick]

For each timing setting (heartbeat / suspect_after / dead_after, seconds), runs
examples/quickstart.yaml through hfl-launch with an experiment file (written
to runs/bench/failure_detection/) that adds ``faults: [{peer: p1, at_round: R}]``:
p1 exits abruptly (no goodbye) at the start of round R. The survivors are then
stuck in round R waiting for p1 (the aggregator waits for every live peer), so
their only way on is the failure detector.

From the peers' typed events (``events.jsonl``, docs/runtime.md):
- death: p1's ``crash`` note, written as it exits;
- suspicion and detection: each survivor's ``member`` notes about p1, ``-> suspect``
  and ``-> dead`` (reason ``silent for X s``, or the failed probes).

Prints, per survivor, the detection latency (dead note - crash note), the
configured ``dead_after_s`` and their ratio, the same for suspicion, then
min/mean/max per setting. On one host the kernel resets the crashed peer's
connections: the socket monitor's disconnect is a hint that starts direct and
indirect probes at once, and the peer is declared dead when they fail (a few
heartbeat intervals), well under dead_after_s. Where no disconnect is seen (a
partition), silence decides: a little under or over dead_after_s (silence is
counted from the last message heard *before* the crash, up to one heartbeat
interval earlier, and checked once per heartbeat tick, up to one interval
later). Each setting runs twice by default (--repeat N); --quick once.
"""

from __future__ import annotations

import math
import sys

import _common as c
import yaml

SETTINGS = [  # heartbeat_interval_s, suspect_after_s, dead_after_s
    (0.25, 1.0, 2.0),
    (0.5, 2.0, 4.0),
]
VICTIM = "p1"
CRASH_ROUND = 3  # the aggregator of round 3 is p3 (rotation: sorted ids[round % 4]), not the victim
ROUNDS = 8
RUN_TIMEOUT_S = 240

def write_experiment(tag: str, hb: float, suspect: float, dead: float) -> tuple:
    exp = yaml.safe_load(c.QUICKSTART.read_text())
    exp["name"] = f"bench-failure-{tag}"
    exp["defaults"]["cohort"]["rounds"] = ROUNDS
    exp["defaults"]["timing"].update(
        heartbeat_interval_s=hb,
        suspect_after_s=suspect,
        dead_after_s=dead,
        round_timeout_s=30,
    )
    exp["faults"] = [{"peer": VICTIM, "at_round": CRASH_ROUND}]
    base = c.OUT_DIR / "failure_detection"
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path, base / tag


def measure(tag: str, hb: float, suspect: float, dead: float) -> dict:
    exp_path, run_dir = write_experiment(tag, hb, suspect, dead)
    busy = c.Contention()
    rc, wall, _ = c.launch(exp_path, run_dir, [], RUN_TIMEOUT_S, f"failure-{tag}")
    contention = busy.stop()
    crash_t = next((e["t"] for e in c.events(run_dir / VICTIM, "crash")), None)
    survivors = []
    for peer_dir in sorted(p.parent for p in run_dir.glob("*/events.jsonl")):
        me = peer_dir.name
        if me == VICTIM:
            continue
        row = {"peer": me, "suspect_t": None, "dead_t": None, "silent_s": None}
        for e in c.events(peer_dir, "member"):
            if e["member"] != VICTIM or (crash_t is not None and e["t"] < crash_t):
                continue  # another member, or an earlier hiccup, not this death
            if e["new"] == "suspect" and row["suspect_t"] is None:
                row["suspect_t"] = e["t"]
            if e["new"] == "dead" and row["dead_t"] is None:
                row["dead_t"] = e["t"]
                row["silent_s"] = e.get("silent_s")  # silent, unanswered or unheard since a hint
        lat = lambda t: (t - crash_t) if (t is not None and crash_t is not None) else math.nan  # noqa: E731
        row["suspect_latency_s"], row["dead_latency_s"] = lat(row["suspect_t"]), lat(row["dead_t"])
        survivors.append(row)
    lats = [r["dead_latency_s"] for r in survivors if not math.isnan(r["dead_latency_s"])]
    return {
        "tag": tag,
        "contention": contention,
        "heartbeat_interval_s": hb,
        "suspect_after_s": suspect,
        "dead_after_s": dead,
        "exit_status": rc,
        "wall_s": wall,
        "run_dir": str(run_dir),
        "crash_t": crash_t,
        "survivors": survivors,
        "detected": len(lats),
        "min_s": min(lats, default=math.nan),
        "mean_s": c.mean(lats),
        "max_s": max(lats, default=math.nan),
    }


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__)
    p.add_argument(
        "--repeat", type=int, default=None, help="runs per setting (default 2; --quick: 1)"
    )
    args = p.parse_args(argv)
    repeat = args.repeat or (1 if args.quick else 2)
    print(
        f"failure detection: 4 peers, fedavg, {VICTIM} crashes at the start of round {CRASH_ROUND}; "
        f"settings (heartbeat/suspect/dead s): {SETTINGS}, {repeat} run(s) each"
    )
    runs = [
        measure(f"hb{hb:g}-dead{dead:g}-run{i + 1}", hb, s, dead)
        for i in range(repeat)
        for hb, s, dead in SETTINGS
    ]
    results = []  # per setting, all runs pooled
    for hb, s, dead in SETTINGS:
        mine = [r for r in runs if r["dead_after_s"] == dead and r["heartbeat_interval_s"] == hb]
        lats = [
            sv["dead_latency_s"]
            for r in mine
            for sv in r["survivors"]
            if not math.isnan(sv["dead_latency_s"])
        ]
        results.append(
            {
                "tag": f"hb{hb:g}-dead{dead:g}",
                "heartbeat_interval_s": hb,
                "suspect_after_s": s,
                "dead_after_s": dead,
                "runs": len(mine),
                "detected": len(lats),
                "survivors": sum(len(r["survivors"]) for r in mine),
                "min_s": min(lats, default=math.nan),
                "mean_s": c.mean(lats),
                "max_s": max(lats, default=math.nan),
                "exit_statuses": [r["exit_status"] for r in mine],
            }
        )

    rows = []
    for res in runs:
        for r in res["survivors"]:
            rows.append(
                [
                    res["tag"],
                    r["peer"],
                    r["suspect_latency_s"],
                    res["suspect_after_s"],
                    c.fmt(c.ratio(r["suspect_latency_s"], res["suspect_after_s"]), "{:.3f}x"),
                    r["dead_latency_s"],
                    res["dead_after_s"],
                    c.fmt(c.ratio(r["dead_latency_s"], res["dead_after_s"]), "{:.3f}x"),
                    r["silent_s"],
                    c.fmt(c.others_share(res["contention"]), "{:.0%}"),
                ]
            )
    print()
    print(
        c.table(
            [
                "setting",
                "survivor",
                "suspect after s",
                "suspect_after_s",
                "ratio",
                "dead after s",
                "dead_after_s",
                "ratio",
                "logged silence s",
                "others' CPU",
            ],
            rows,
            ["{}", "{}", "{:.3f}", "{:g}", "{}", "{:.3f}", "{:g}", "{}", "{:.1f}", "{}"],
        )
    )
    srows = [
        [
            res["tag"],
            res["heartbeat_interval_s"],
            res["dead_after_s"],
            f"{res['detected']}/{res['survivors']}",
            res["min_s"],
            res["mean_s"],
            res["max_s"],
            c.fmt(c.ratio(res["mean_s"], res["dead_after_s"]), "{:.3f}x"),
            c.fmt(res["mean_s"] - res["dead_after_s"], "{:+.3f}"),
        ]
        for res in results
    ]
    print()
    print(
        c.table(
            [
                "setting",
                "heartbeat s",
                "dead_after_s",
                "detected",
                "min s",
                "mean s",
                "max s",
                "mean/dead_after",
                "mean - dead_after s",
            ],
            srows,
            ["{}", "{:g}", "{:g}", "{}", "{:.3f}", "{:.3f}", "{:.3f}", "{}", "{}"],
        )
    )
    print(
        "\nlatency = the survivor's '-> dead' note - the victim's 'crash' note (events.jsonl; one "
        "clock: same machine). A crash seen by the socket monitor is probed at once; silence alone "
        "would take [dead_after - heartbeat, dead_after + heartbeat]."
    )
    c.write_json(
        c.out_path("failure_detection", args.out),
        {
            "benchmark": "failure_detection",
            "quick": args.quick,
            "victim": VICTIM,
            "crash_round": CRASH_ROUND,
            "repeat": repeat,
            "settings": results,
            "runs": runs,
        },
    )
    ok = all(
        res["exit_status"] == 0 and res["detected"] == len(res["survivors"]) > 0 for res in runs
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
