"""Runtime overhead: a federated cohort vs. the same peers training alone with no networking.

    python bench/overhead.py [--quick] [--local-epochs 5] [--rounds 20]

(a) federated: examples/quickstart.yaml through hfl-launch with fedavg,
    ``train.local_epochs`` raised so that a round is a realistic fraction of a
    second, and a fixed number of rounds;
(b) local: the same expanded per-peer configs (same data partition, model,
    seed, torch threads, OMP_NUM_THREADS / MKL_NUM_THREADS) run as 4 concurrent
    processes of bench/_local_worker.py, which builds each peer's algorithm with
    ``hfl.peer.factory.build_algorithm`` and loops ``local_update(r)`` +
    ``evaluate()`` with no transport at all. Same CPU contention, same rounds.

Compared, per peer and for the cohort as a whole:
- rounds span: first round's start to last round's end. For (a) from each
  peer's metrics.jsonl (``time`` = wall-clock start of a round, plus the last
  round's ``round_time_s``); for (b) measured the same way inside the worker;
- process wall: the peer process's whole life (start-up and exit included); the
  federated peers start as the local workers do, one interpreter each
  (``hfl-launch --start process``, not the default fork from a template).

The ratio fed/local of the rounds span is the runtime's overhead (the project
aims for < 1.15x). The breakdown splits (a)'s span into compute (``compute_s``:
local_update, share, aggregate, absorb, evaluate in the worker thread), waiting
+ communication (``round_time_s - compute_s``) and between rounds (metrics line
and checkpoint). --quick runs 8 rounds.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _common as c
import yaml

FED_TIMEOUT_S = 300
LOCAL_TIMEOUT_S = 300


def span_record(recs: list[dict], process_s: float) -> dict:
    """Timing of one peer's rounds (records sorted by round)."""
    end = recs[-1]["time"] + recs[-1]["round_time_s"]
    in_rounds = sum(r["round_time_s"] for r in recs)
    compute = sum(r.get("compute_s", r["round_time_s"]) for r in recs)
    span = end - recs[0]["time"]
    return {
        "rounds": len(recs),
        "first_start": recs[0]["time"],
        "second_start": recs[1]["time"] if len(recs) > 1 else math.nan,
        "last_end": end,
        "span_s": span,
        "round_time_s": in_rounds,
        "compute_s": compute,
        "wait_comm_s": in_rounds - compute,
        "between_rounds_s": span - in_rounds,
        "round1_s": recs[0]["round_time_s"],
        "process_s": process_s,
    }


def run_federated(rounds: int, epochs: int, run_dir: Path) -> dict:
    overrides = [
        "defaults.cohort.algorithm=fedavg",
        f"defaults.cohort.rounds={rounds}",
        f"defaults.train.local_epochs={epochs}",
        f"name=bench-overhead-e{epochs}",
    ]
    # --start process: each peer a fresh interpreter, as each local worker is. With the
    # launcher's default (forked from a template that imported torch once) the "process
    # wall" rows compared a fork against a whole interpreter start (a review: 0.087x);
    # bench/startup.py measures what forking saves.
    rc, wall, _ = c.launch(
        c.QUICKSTART, run_dir, overrides, FED_TIMEOUT_S, f"overhead-fed-e{epochs}",
        flags=["--start", "process"],
    )
    res_path = run_dir / "results.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    starts = {e["peer"]: e["t"] for e in res.get("events", []) if e["event"] == "start"}
    exits = {e["peer"]: e["t"] for e in res.get("events", []) if e["event"] in ("exit", "crashed")}
    peers = {}
    for mpath in sorted(run_dir.glob("p*/metrics.jsonl")):
        recs = sorted(c.read_jsonl(mpath), key=lambda r: r["round"])
        pid = mpath.parent.name
        if recs:
            peers[pid] = span_record(recs, exits.get(pid, math.nan) - starts.get(pid, math.nan))
    return {"exit_status": rc, "wall_s": wall, "run_dir": str(run_dir), "peers": peers}


def run_local(configs: list[Path], rounds: int, out_dir: Path) -> dict:
    """The baseline: one bench/_local_worker.py process per peer config, all at once."""
    out_dir.mkdir(parents=True, exist_ok=True)
    barrier = out_dir / "barrier"
    for stale in out_dir.glob("barrier.*"):
        stale.unlink()
    procs = {}
    t0 = time.perf_counter()
    for cfg_path in configs:
        cfg = yaml.safe_load(cfg_path.read_text())
        pid, threads = cfg["node"]["id"], str(cfg["node"]["threads"] or 1)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONUNBUFFERED": "1",
        }
        out = out_dir / f"{pid}.json"
        out.unlink(missing_ok=True)
        log = open(out_dir / f"{pid}.log", "wb")  # noqa: SIM115 - closed below
        cmd = [
            sys.executable,
            str(Path(__file__).with_name("_local_worker.py")),
            "--config",
            str(cfg_path),
            "--rounds",
            str(rounds),
            "--out",
            str(out),
            "--barrier",
            str(barrier),
        ]
        procs[pid] = (
            # One session per worker, as the launcher starts each peer: with the kernel's
            # autogroup scheduling (sched_autogroup_enabled=1) a session is a CPU-share group.
            subprocess.Popen(
                cmd,
                cwd=c.ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            ),
            time.perf_counter(),
            out,
            log,
        )
    print(
        f"$ {len(procs)} x python bench/_local_worker.py --config <peer>.yaml --rounds {rounds} "
        f"--barrier ... (OMP_NUM_THREADS={threads}, as the launcher sets it)",
        flush=True,
    )
    deadline = time.perf_counter() + LOCAL_TIMEOUT_S
    while (
        len(list(out_dir.glob("barrier.*.ready"))) < len(procs)
        and time.perf_counter() < deadline
        and all(proc.poll() is None for proc, *_ in procs.values())
    ):
        time.sleep(0.005)
    (out_dir / "barrier.go").touch()
    peers, status = {}, 0
    for pid, (proc, started, out, log) in procs.items():
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        process_s = time.perf_counter() - started
        log.close()
        status = status or rc
        if rc != 0 or not out.exists():
            print(f"  local worker {pid} failed with status {rc}; see {out_dir / (pid + '.log')}")
            continue
        peers[pid] = span_record(json.loads(out.read_text())["rounds"], process_s)
    return {"exit_status": status, "wall_s": time.perf_counter() - t0, "peers": peers}


def cohort_span(peers: dict, start_key: str = "first_start") -> float:
    if not peers:
        return math.nan
    return max(p["last_end"] for p in peers.values()) - min(p[start_key] for p in peers.values())


def mean_of(peers: dict, key: str) -> float:
    return c.mean([v[key] for v in peers.values()])


X = "{:.3f}x"


def run_setting(rounds: int, epochs: int, local_first: bool = False, label: str = "") -> dict:
    """One fed run and one local run (in either order) for ``epochs``."""
    base = c.OUT_DIR / "overhead" / f"e{epochs}"
    configs_dir = base / "fed" / "peers"  # the configs of the latest fed run
    local_first = local_first and any(configs_dir.glob("*.yaml"))
    print(
        f"\n== local_epochs={epochs}, {rounds} rounds{label}, {'local' if local_first else 'fed'} first"
    )

    def federated() -> dict:
        busy = c.Contention()
        fed = run_federated(rounds, epochs, base / "fed")
        fed["contention"] = busy.stop()
        return fed

    def local() -> dict:
        busy = c.Contention()
        loc = run_local(sorted(configs_dir.glob("*.yaml")), rounds, base / "local")
        loc["contention"] = busy.stop()
        return loc

    if local_first:
        loc = local()
        fed = federated()
    else:
        fed = federated()
        if not any(configs_dir.glob("*.yaml")):
            print(
                "no expanded peer configs: the federated run failed before starting",
                file=sys.stderr,
            )
            return {"epochs": epochs, "ok": False, "federated": fed}
        loc = local()
    pf, pl = fed["peers"], loc["peers"]

    rows = []
    for pid in sorted(set(pf) | set(pl)):
        f, lo = pf.get(pid, {}), pl.get(pid, {})
        g = lambda d, k: d.get(k, math.nan)  # noqa: E731
        rows.append(
            [
                pid,
                g(lo, "span_s"),
                g(f, "span_s"),
                c.fmt(c.ratio(g(f, "span_s"), g(lo, "span_s")), X),
                g(f, "compute_s"),
                g(f, "wait_comm_s"),
                g(f, "between_rounds_s"),
                g(f, "round1_s"),
                g(lo, "process_s"),
                g(f, "process_s"),
                c.fmt(c.ratio(g(f, "process_s"), g(lo, "process_s")), X),
            ]
        )
    summary = {
        "span_mean": (mean_of(pl, "span_s"), mean_of(pf, "span_s")),
        "cohort_span": (cohort_span(pl), cohort_span(pf)),
        "cohort_span_after_r1": (cohort_span(pl, "second_start"), cohort_span(pf, "second_start")),
        "process_mean": (mean_of(pl, "process_s"), mean_of(pf, "process_s")),
        "whole_run": (loc["wall_s"], fed["wall_s"]),
    }
    rows.append(
        [
            "mean",
            *summary["span_mean"],
            c.fmt(c.ratio(*summary["span_mean"][::-1]), X),
            mean_of(pf, "compute_s"),
            mean_of(pf, "wait_comm_s"),
            mean_of(pf, "between_rounds_s"),
            mean_of(pf, "round1_s"),
            *summary["process_mean"],
            c.fmt(c.ratio(*summary["process_mean"][::-1]), X),
        ]
    )
    print("\nper peer, seconds (fed compute + wait+comm + between = fed span)")
    print(
        c.table(
            [
                "peer",
                "local span",
                "fed span",
                "fed/local",
                "fed compute",
                "fed wait+comm",
                "fed between",
                "fed round 1",
                "local process",
                "fed process",
                "fed/local",
            ],
            rows,
            [
                "{}",
                "{:.3f}",
                "{:.3f}",
                "{}",
                "{:.3f}",
                "{:.3f}",
                "{:.3f}",
                "{:.3f}",
                "{:.2f}",
                "{:.2f}",
                "{}",
            ],
        )
    )
    skew = (
        max(p["first_start"] for p in pf.values()) - min(p["first_start"] for p in pf.values())
        if pf
        else math.nan
    )
    return {
        "epochs": epochs,
        "rounds": rounds,
        "local_first": local_first,
        "ok": fed["exit_status"] == 0 and loc["exit_status"] == 0,
        "summary": summary,
        "round1_start_skew_s": skew,
        "fed_round_s": mean_of(pf, "round_time_s") / rounds,
        "fed_compute_round_s": mean_of(pf, "compute_s") / rounds,
        "local_round_s": mean_of(pl, "round_time_s") / rounds,
        "federated": fed,
        "local": loc,
    }


LABELS = {
    "span_mean": "rounds span, mean over peers",
    "cohort_span": "rounds span, cohort (first start -> last end)",
    "cohort_span_after_r1": "rounds 2..R span, cohort",
    "process_mean": "peer process wall, mean",
    "whole_run": "whole run wall (hfl-launch / 4 workers)",
}


def combine(pairs: list[dict]) -> dict:
    """One setting's pairs: medians of each side and the median of the per-pair ratios."""
    good = [r for r in pairs if "summary" in r]
    out = {"epochs": pairs[0]["epochs"], "pairs": len(good), "ok": all(r["ok"] for r in pairs)}
    if not good:
        return out
    med = lambda xs: statistics.median(xs) if xs else math.nan  # noqa: E731
    out["summary"] = {
        k: (med([r["summary"][k][0] for r in good]), med([r["summary"][k][1] for r in good]))
        for k in good[0]["summary"]
    }
    out["ratios"] = {
        k: med([c.ratio(r["summary"][k][1], r["summary"][k][0]) for r in good])
        for k in good[0]["summary"]
    }
    for k in ("fed_round_s", "fed_compute_round_s", "local_round_s", "round1_start_skew_s"):
        out[k] = med([r[k] for r in good])
    out["ratios"]["round"] = med([c.ratio(r["fed_round_s"], r["local_round_s"]) for r in good])
    out["ratios"]["compute"] = med(
        [c.ratio(r["fed_compute_round_s"], r["local_round_s"]) for r in good]
    )
    out["others_share"] = {
        k: c.mean([c.others_share(r[k]["contention"]) for r in good])
        for k in ("local", "federated")
    }
    out["contention"] = [(r[k]["contention"], k) for r in good for k in ("federated", "local")]
    return out


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__)
    p.add_argument("--rounds", type=int, default=None, help="default 20 (--quick: 8)")
    p.add_argument(
        "--local-epochs",
        type=int,
        nargs="+",
        default=None,
        help="train.local_epochs settings, each run fed + local (default: 5 20; --quick: 5)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="fed+local pairs per setting, alternating which goes first; the summary shows medians "
        "(default 1; use 3+ on a busy machine)",
    )
    args = p.parse_args(argv)
    rounds = args.rounds or (8 if args.quick else 20)
    epochs_list = args.local_epochs or ([5] if args.quick else [5, 20])
    print(
        f"overhead: 4 peers of examples/quickstart.yaml, fedavg (hfl-launch) vs local (no transport), "
        f"{rounds} rounds, local_epochs {epochs_list}, {args.repeat} pair(s) each"
    )
    pairs = {
        e: [
            run_setting(
                rounds,
                e,
                local_first=i % 2 == 1,
                label=f", pair {i + 1}/{args.repeat}" if args.repeat > 1 else "",
            )
            for i in range(args.repeat)
        ]
        for e in epochs_list
    }
    results = [combine(pairs[e]) for e in epochs_list]

    n = f" (median of {args.repeat})" if args.repeat > 1 else ""
    header, specs, srows = ["measure"], ["{}"], []
    for res in results:
        e = res["epochs"]
        header += [f"e{e} local s", f"e{e} fed s", f"e{e} fed/local"]
        specs += ["{:.3f}", "{:.3f}", "{}"]
    for key, label in LABELS.items():
        row = [label]
        for res in results:
            lo, f = res.get("summary", {}).get(key, (math.nan, math.nan))
            row += [lo, f, c.fmt(res.get("ratios", {}).get(key, math.nan), X)]
        srows.append(row)
    for label, fed_key, rkey in (
        ("mean round time", "fed_round_s", "round"),
        ("mean round, fed compute part", "fed_compute_round_s", "compute"),
    ):
        row = [label]
        for res in results:
            lo, f = res.get("local_round_s", math.nan), res.get(fed_key, math.nan)
            row += [lo, f, c.fmt(res.get("ratios", {}).get(rkey, math.nan), X)]
        srows.append(row)
    row = ["other processes' share of the CPU"]
    for res in results:
        shares = res.get("others_share", {})
        row += [c.fmt(shares.get("local"), "{:.0%}"), c.fmt(shares.get("federated"), "{:.0%}"), ""]
    srows.append(row)
    print(f"\n== summary{n} (eN = local_epochs N; aim: rounds span fed/local < 1.15x)")
    print(c.table(header, srows, specs))
    for res in results:
        if "summary" not in res:
            continue
        for contention, kind in res["contention"]:
            note = c.contention_note(f"local_epochs={res['epochs']} {kind[:3]}", contention)
            if "<--" in note:
                print(note)
        r = res["ratios"]
        print(
            f"local_epochs={res['epochs']}: per-peer rounds span fed/local {r['span_mean']:.3f}x "
            f"({'meets' if r['span_mean'] < 1.15 else 'misses'} < 1.15x); steady state (rounds 2..R, cohort) "
            f"{r['cohort_span_after_r1']:.3f}x; round-1 start skew across fed peers "
            f"{res['round1_start_skew_s']:.3f}s"
        )
    c.write_json(
        c.out_path("overhead", args.out),
        {
            "benchmark": "overhead",
            "quick": args.quick,
            "rounds": rounds,
            "repeat": args.repeat,
            "settings": [
                {
                    "epochs": res["epochs"],
                    "ok": res["ok"],
                    "median_ratios": res.get("ratios", {}),
                    "others_share": res.get("others_share", {}),
                    "pairs": [
                        {
                            **{k: v for k, v in pr.items() if k != "summary"},
                            "summary": {
                                k: {"local_s": lo, "fed_s": f, "ratio": c.ratio(f, lo)}
                                for k, (lo, f) in pr.get("summary", {}).items()
                            },
                        }
                        for pr in pairs[res["epochs"]]
                    ],
                }
                for res in results
            ],
        },
    )
    return 0 if all(res["ok"] for res in results) else 1


if __name__ == "__main__":
    sys.exit(main())
