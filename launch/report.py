"""``hfl-report``: compare finished (or running) runs in one table and one plot per metric.

    hfl-report runs/quickstart runs/quickstart-solo [--out runs/compare] [--markdown FILE]

Each argument is a run directory of ``hfl-launch`` (its peers are the sub-folders
with a metrics.jsonl) or of one ``hfl-peer`` (a folder with a metrics.jsonl).
Per run: the algorithm, peers, rounds, the peers' mean final test and global
accuracy, the best round's mean test accuracy, the mean running time, traffic,
and how many peers shared with fewer peers than expected. The plots draw each
run's cohort mean over rounds (``<out>_global_acc.png``, ``<out>_test_acc.png``,
``<out>_train_loss.png``). A run of ``hfl-launch --seeds`` (its ``seed<S>``
folders) is one row of mean ± std over its seeds. Only the peers' files are
read (metrics; the algorithm from their summaries, or the configs hfl-launch
wrote): runs can be compared while they run, and from another machine's copy.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

from hfl.launch.results import (
    _fmt,
    cohort_row,
    damage_note,
    markdown_table,
    mean_std,
    read_metrics,
    read_summary,
    seed_dirs,
)
from hfl.peer.checkpoint import RunFileError

COLUMNS = [
    ("run", "run", "{}"),
    ("algorithm", "algorithm", "{}"),
    ("data", "data", "{}"),
    ("peers", "peers", "{}"),
    ("rounds", "rounds", "{:g}"),
    ("sel_acc", "ACC", "{:.4f}"),  # multi-domain runs (FedH2L's protocol) only
    ("sel_bwt", "BWT", "{:.4f}"),
    ("sel_fwt", "FWT", "{:.4f}"),
    ("test_acc", "test acc", "{:.4f}"),
    ("global_acc", "global acc", "{:.4f}"),
    ("best_mean", "best mean test acc", "{:.4f}"),
    ("wall_s", "wall s", "{:.1f}"),
    ("sent_mb", "sent MB", "{:.2f}"),
    ("short", "short peers", "{}"),
]
DOMAIN_KEYS = ("sel_acc", "sel_bwt", "sel_fwt")
# Averaged over seeds (shown as mean ± std) in a run of hfl-launch --seeds.
SEED_AVERAGED = ("rounds", *DOMAIN_KEYS, "test_acc", "global_acc", "best_mean", "wall_s", "sent_mb")


def peer_dirs(run_dir: Path) -> list[tuple[str, Path]]:
    """The run's peers (their folders): every peer hfl-launch wrote a config for, once
    any has metrics (a peer that died before its first round had none, and the report
    left it out of its peer count without a word: a review), else those with metrics."""
    if (run_dir / "metrics.jsonl").exists():
        return [(run_dir.name, run_dir)]
    have = {d.name for d in run_dir.iterdir() if (d / "metrics.jsonl").exists()}
    launched = {p.stem for p in (run_dir / "peers").glob("*.yaml")} if have else set()
    return [(pid, run_dir / pid) for pid in sorted(have | launched)]


def _from_peers(run_dir: Path, peers: list[tuple[str, Path]], key: str, from_config) -> str:
    """``key`` of the peers' summaries (every peer, ``hfl-peer`` alone too, writes its
    summary at its end), else ``from_config`` of the configs ``hfl-launch`` wrote."""
    import yaml

    found = sorted({str(s[key]) for s in (read_summary(d) for _, d in peers) if s.get(key)})
    if found:
        return "; ".join(found)
    candidates = [d.parent / "peers" / f"{pid}.yaml" for pid, d in peers]
    candidates += [run_dir.parent / "peers" / f"{run_dir.name}.yaml"]  # one peer of a launch
    for path in candidates:
        try:
            return from_config(yaml.safe_load(path.read_text()))
        except (OSError, KeyError, TypeError, ValueError, AttributeError):
            continue
    return "?"


def _algorithm(run_dir: Path, peers: list[tuple[str, Path]]) -> str:
    return _from_peers(run_dir, peers, "algorithm", lambda cfg: cfg["cohort"]["algorithm"])


def _data(run_dir: Path, peers: list[tuple[str, Path]]) -> str:
    from hfl.peer.config import PeerConfig
    from hfl.peer.configtools import build
    from hfl.peer.runner import data_description

    return _from_peers(run_dir, peers, "data",
                       lambda cfg: data_description(build(PeerConfig, cfg).data))


#: What makes the seeds of one ``--seeds`` run differ: not their experiment.
SEED_KEYS = ("defaults.data.seed", "defaults.cohort.seed", "defaults.node.seed")


def mixed_seeds(seeds: list[tuple[int, Path]]) -> str | None:
    """Why the seed folders of one base are not seeds of one experiment (each seed's
    launch.json, its seed keys aside), or None. A ``--seeds 0 --fresh`` with a new
    lr left seed 1 of the old lr beside it, and the report averaged the two."""
    from hfl.launch.rundir import differences, read_record

    def experiment(d: Path) -> dict[str, Any] | None:
        record = read_record(d)
        if record is None:
            return None
        exp = record.get("experiment") or {}
        defaults = {section: {k: v for k, v in values.items() if f"defaults.{section}.{k}" not in SEED_KEYS}
                    if isinstance(values, dict) else values
                    for section, values in (exp.get("defaults") or {}).items()}
        return {**exp, "defaults": defaults}

    known = [(s, e) for s, d in seeds if (e := experiment(d)) is not None]
    for s, e in known[1:]:
        diff = differences(known[0][1], e)
        if diff:
            return (f"seed {s} is of another experiment than seed {known[0][0]} "
                    f"({'; '.join(diff[:3])})")
    return None


def run_row(run_dir: Path, label: str | None = None) -> dict[str, Any]:
    """The peers' means of one run; of a ``hfl-launch --seeds`` run, (mean, std) over
    its seeds for the SEED_AVERAGED columns and ``seeds`` = how many."""
    seeds = seed_dirs(run_dir)
    why = mixed_seeds([(sd, d) for sd, d in seeds if peer_dirs(d)])
    if why is not None:
        raise ValueError(f"{run_dir}: {why}: its seeds cannot be averaged (launch each "
                         "experiment in a run directory of its own)")
    runs = [d for _, d in seeds if peer_dirs(d)] or [run_dir]
    from hfl.launch.rundir import read_record

    # As hfl-launch's seeds table: a seed whose launch failed is left out of the mean
    # (a review: results.md said "1 of 2 seeds" and this report averaged both).
    counted = [d for d in runs if not seeds or (read_record(d) or {}).get("state") != "failed"]
    per_run = [cohort_row(d, peer_dirs(d)) for d in counted]  # (none: "-", as hfl-launch)
    peers = peer_dirs(runs[0])
    row: dict[str, Any] = {"run": label or str(run_dir), "algorithm": _algorithm(runs[0], peers),
                           "data": _data(runs[0], peers),
                           "peers": len(peers), "short": sum(r.get("short", 0) for r in per_run),
                           "diverged": sorted({p for r in per_run for p in r.get("diverged", ())}),
                           "damaged": [n for r in per_run if (n := damage_note(r.get("damaged") or {}))]}
    for key in SEED_AVERAGED:
        values = [r.get(key, math.nan) for r in per_run]
        row[key] = mean_std(values) if seeds else values[0] if values else math.nan
    if seeds:
        row["seeds"] = len(runs)
        row["seeds_counted"] = len(counted)

    # how far it got and whether it ended (a running, failed or interrupted run read as
    # a finished one, and runs of 5 and 8 rounds were compared without a word: a review)
    row["last_round"] = max((max((r["round"] for r in read_metrics(d)), default=0)
                             for run in runs for _, d in peer_dirs(run)), default=0)
    states = {(read_record(run) or {}).get("state") for run in runs} - {None, "finished"}
    row["state"] = ", ".join(sorted(states)) or None
    row["over"] = min((len(r.get("over", ())) for r in per_run), default=0)  # peers in the means
    return row


def _cell(value: Any, spec: str) -> str:
    if isinstance(value, tuple):  # (mean, std) over seeds
        if math.isnan(value[0]):
            return "-"
        return f"{_fmt(value[0], spec)} ± {_fmt(value[1], spec)}"
    return _fmt(value, spec)


def render(rows: list[dict[str, Any]]) -> str:
    def shown(key: str) -> bool:
        return key not in DOMAIN_KEYS or any(
            not math.isnan(r[key][0] if isinstance(r.get(key), tuple) else r.get(key, math.nan))
            for r in rows)

    columns = [c for c in COLUMNS if shown(c[0])]
    header = [t for _, t, _ in columns]
    body = [[_cell(r.get(k), spec) for k, _, spec in columns] for r in rows]
    for r, b in zip(rows, body, strict=True):
        if r.get("seeds"):
            n, counted = r["seeds"], r.get("seeds_counted", r["seeds"])
            b[0] += f" ({n} seeds)" if counted == n else f" ({counted} of {n} seeds: failed ones left out)"
    return markdown_table(header, body)


def unlike_runs(rows: list[dict[str, Any]]) -> str | None:
    """What differs between the compared runs besides the method (data, split, cohort
    size), so that a table of unlike runs says so; None when they compare like for like."""
    differ = [what for what in ("data", "peers", "last_round")
              if len({str(r.get(what)) for r in rows}) > 1]
    if not differ:
        return None
    each = "; ".join(r["run"] + ": " + ", ".join(str(r.get(w)) for w in differ) for r in rows)
    names = [{"last_round": "rounds"}.get(w, w) for w in differ]
    return (f"these runs differ in {' and '.join(names)} ({each}): their accuracies are not "
            "a like-for-like comparison of the methods")


def labels(run_dirs: list[Path]) -> list[str]:
    """Short unique labels: the folder names, or the full paths when two coincide."""
    names = [d.name for d in run_dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in run_dirs]


def compare_stem(names: list[str]) -> str:
    """The default plot stem of a comparison: ``compare-`` and the runs' folder names
    (one stem for every comparison let each report replace the last one's plots
    without a word, a review); long lists are cut, with a checksum of the whole."""
    import zlib

    joined = "+".join(re.sub(r"[^\w.-]", "_", n) for n in names)
    if len(joined) > 80:
        joined = f"{joined[:60]}+{len(names)}runs-{zlib.crc32(joined.encode()):08x}"
    return f"compare-{joined}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hfl-report", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--out", default=None,
                   help="plot file stem (default: <first run's parent>/compare-<the runs' "
                        "names joined by +>)")
    p.add_argument("--markdown", default=None, help="also write the table to this file")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    run_dirs = [Path(r) for r in args.runs]
    missing = [str(d) for d in run_dirs if not d.is_dir()]
    if missing:
        print(f"hfl-report: no such run directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    empty = [str(d) for d in run_dirs
             if not peer_dirs(d) and not any(peer_dirs(sd) for _, sd in seed_dirs(d))]
    if empty:
        print(f"hfl-report: no metrics.jsonl in {', '.join(empty)} (or its sub-folders): "
              "not a run directory, or no round finished yet", file=sys.stderr)
        return 2
    names = labels(run_dirs)
    try:
        rows = [run_row(d, name) for d, name in zip(run_dirs, names, strict=True)]
    except (ValueError, RunFileError) as err:  # (mixed_seeds; a metrics file unreadable)
        print(f"hfl-report: {err}", file=sys.stderr)
        return 2
    table = render(rows)
    print(table)
    if any(r["short"] for r in rows):
        print("short peers: shared with fewer peers than expected (see hfl-launch --allow-solo)")
    for r in rows:
        if r.get("diverged"):
            print(f"note: {r['run']}: training diverged on {', '.join(r['diverged'])} (a "
                  "non-finite train_loss); its numbers are in the means")
        for note in r.get("damaged", ()):
            print(f"note: {r['run']}: {note}")
    unlike = unlike_runs(rows)
    if unlike:
        print(f"note: {unlike}")
    for r in rows:
        if r.get("over", r["peers"]) < r["peers"]:
            print(f"note: {r['run']}: its means are over {r['over']} of its {r['peers']} peers "
                  "(the others stopped before its last round; hfl-launch's table names them)")
        if r.get("state"):
            print(f"note: {r['run']} is not a finished run ({r['state']}, launch.json): its "
                  f"numbers are as far as it got (round {r['last_round']})")
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    if not args.no_plot:
        from hfl.launch.plots import plot_compare

        out = Path(args.out) if args.out else run_dirs[0].resolve().parent / compare_stem(
            [d.resolve().name for d in run_dirs])
        runs = {}
        for rd, name in zip(run_dirs, names, strict=True):
            seeds = [(s, sd) for s, sd in seed_dirs(rd) if peer_dirs(sd)]
            if seeds:  # every seed's peers: the plotted mean is over seeds and peers
                runs[name] = {f"{pid}@seed{s}": read_metrics(d)
                              for s, sd in seeds for pid, d in peer_dirs(sd)}
            else:
                runs[name] = {pid: read_metrics(d) for pid, d in peer_dirs(rd)}
        for path in plot_compare(runs, out):
            print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
