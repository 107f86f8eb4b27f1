"""The results table: one row per peer plus the mean, from the peers' own files."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfl.peer.checkpoint import read_jsonl  # (re-exported: tools read JSON lines with it)

# Shown only when some peer reports them (multi-domain runs: FedH2L's protocol,
# test metrics of the model chosen on validation, then the final model's ACC).
DOMAIN_COLUMNS = [
    ("sel_acc", "ACC", "{:.4f}"),
    ("sel_bwt", "BWT", "{:.4f}"),
    ("sel_fwt", "FWT", "{:.4f}"),
    ("acc", "final ACC", "{:.4f}"),
]

COLUMNS = [
    ("peer", "peer", "{}"),
    ("arch", "arch", "{}"),
    ("rounds", "rounds", "{}"),
    ("test_acc", "test acc", "{:.4f}"),
    ("global_acc", "global acc", "{:.4f}"),
    ("best_global_acc", "best global", "{:.4f}"),
    ("wall_s", "wall s", "{:.1f}"),
    ("mean_round_s", "s/round", "{:.3f}"),
    ("sent_mb", "sent MB", "{:.2f}"),
    ("recv_mb", "recv MB", "{:.2f}"),
    ("restarts", "restarts", "{:g}"),
    ("cohort", "cohort", "{}"),
]
# A peer whose sharing method ended below its expected cohort (see hfl.peer.status).
SHORT_MARK = "!"
SHORT_NOTE = (f"{SHORT_MARK} = this peer shared with fewer peers than expected "
              "(max(2, node.min_peers)), or learned from no other peer in most of its rounds: "
              "its numbers are not a federated result")


#: Fields of a metrics line the tables compute with, and what a value must be: a line
#: with another value there has it left out (a string test_acc or byte count, an
#: incarnation "x", raised TypeError or ValueError in hfl-report; a review)
NUMBERS = ("test_acc", "global_acc", "val_acc", "time", "round_time_s", "bytes_sent",
           "bytes_received", "total_bytes_sent", "total_bytes_received")
COUNTS = ("span", "incarnation", "live_peers")


def read_metrics(run_dir: Path, damaged: Counter | None = None) -> list[dict[str, Any]]:
    """A peer's round records: the metrics lines that are objects with a round (a line of
    ``null`` raised in the table, after the run, and cost its results: a review), each
    without the values of :data:`NUMBERS` that are no finite number and of
    :data:`COUNTS` that are no count (``train_loss`` is kept as it is: a NaN there is
    a diverged peer, named). ``damaged`` counts what was left out: ``lines`` (no JSON
    object, or no round) and ``values`` (:func:`damage_note` says it to the user)."""
    out = []
    damaged = Counter() if damaged is None else damaged
    for r in read_jsonl(run_dir / "metrics.jsonl", damaged):
        if not (isinstance(r.get("round"), int) and not isinstance(r["round"], bool)
                and r["round"] >= 0):
            damaged["lines"] += 1
            continue
        kept = {k: v for k, v in r.items()
                if not (k in NUMBERS and not _finite(v))
                and not (k in COUNTS and not (isinstance(v, int) and not isinstance(v, bool)
                                              and v >= (1 if k == "span" else 0)))}
        damaged["values"] += len(r) - len(kept)
        out.append(kept)
    return out


def damage_note(damaged: dict[str, Counter]) -> str | None:
    """The line that names each peer whose metrics.jsonl had damaged lines or values
    (:func:`read_metrics` left them out: the numbers shown are without them), or None."""
    named = [f"{peer} ({', '.join(f'{n} {what[:-1] if n == 1 else what}' for what, n in sorted(c.items()) if n)})"
             for peer, c in damaged.items() if sum(c.values())]
    if not named:
        return None
    return ("damaged metrics.jsonl entries left out (a line that is no round's JSON object, "
            "a value that is no finite number or count): " + ", ".join(named)
            + "; the numbers shown are without them")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _timed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with their times (a line of an older format without them raised)."""
    return [r for r in records if isinstance(r.get("time"), (int, float))
            and isinstance(r.get("round_time_s"), (int, float))]


class JsonlTail:
    """A JSON-lines file a peer appends to, followed while it grows: each :meth:`read`
    returns only the records appended since the last one, so following N peers for R
    rounds reads each line once, not N x R lines at every look (the in-process
    launcher re-read every peer's whole file every few seconds: at 500 peers, 135 ms
    of the shared event loop after 8 rounds, growing with every round). A torn last
    line waits for its end; a line that is not JSON is skipped; a missing file is
    empty so far. ``offset``: where to start (the size of what earlier runs wrote)."""

    def __init__(self, path: Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:
                    self.offset = 0  # replaced by a shorter file (rows set aside): from its start
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out = []
        for line in chunk[: end + 1].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


@dataclass
class RoundProgress:
    """What the launchers' progress line needs of one peer, kept from its metrics
    lines as they come (:meth:`add`): its last round and last line, and the time its
    timed rounds took (a line covers ``span`` rounds with ``node.evaluate_every``)."""

    last_round: int = 0
    last: dict[str, Any] = field(default_factory=dict)
    round_s: float = 0.0
    rounds_timed: int = 0

    def add(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            round_ = rec.get("round", 0)
            self.last_round = max(self.last_round, round_ if isinstance(round_, int) else 0)
            self.last = rec
            if isinstance(rec.get("round_time_s"), (int, float)):
                self.round_s += rec["round_time_s"]
                self.rounds_timed += int(rec.get("span", 1))


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A peer's ``summary.json`` (written at its end: its algorithm, the model it built,
    why it ended short), or {} while it runs."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def peer_row(peer_id: str, arch: str, run_dir: Path) -> dict[str, Any]:
    from hfl.peer.status import isolated_rounds

    damaged: Counter = Counter()
    records = read_metrics(run_dir, damaged)
    summary = read_summary(run_dir)
    arch = summary.get("arch", arch)  # the model the peer built (a random_mlp: its widths)
    by_round = {r["round"]: r for r in records}  # a restarted peer may repeat a round
    # (the line of the last round, not the file's last line: a repeated earlier round
    # after it changed "test acc" without a word, a review)
    last = by_round[max(by_round)] if by_round else {}
    global_accs = [r["global_acc"] for r in records if isinstance(r.get("global_acc"), (int, float))
                   and not math.isnan(r["global_acc"])]  # (max() after a NaN returned NaN)
    seen = max((int(r.get("live_peers", 1)) for r in records), default=None)
    short = bool(summary.get("cohort_shortfall"))
    timed = _timed(records)
    diverged = next((r["round"] for r in records if isinstance(r.get("train_loss"), float)
                     and not math.isfinite(r["train_loss"])), None)
    return {
        "peer": peer_id,
        "arch": arch,
        # a line covers `span` rounds when the peer evaluates every few (node.evaluate_every)
        "rounds": sum(int(r.get("span", 1)) for r in by_round.values()),
        "last_round": max(by_round, default=0),
        "test_acc": last.get("test_acc", math.nan),
        "global_acc": last.get("global_acc", math.nan),
        "best_global_acc": max(global_accs, default=math.nan),
        "wall_s": running_time_s(timed),
        "mean_round_s": (sum(r["round_time_s"] for r in timed)
                         / sum(int(r.get("span", 1)) for r in timed)) if timed else math.nan,
        "sent_mb": life_bytes(records, "sent") / 1e6,
        "recv_mb": life_bytes(records, "received") / 1e6,
        "restarts": max((r.get("incarnation", 0) for r in records), default=0),
        "max_live_peers": seen,
        "short": short,
        "diverged_at": diverged,  # the first round whose train_loss was NaN or infinite
        "damaged": {k: n for k, n in damaged.items() if n},  # left out (read_metrics)
        # rounds that exchanged and learned from no other peer (no result, nobody's
        # knowledge), and whether the last was one (its final model is its own)
        "isolated": isolated_rounds(by_round.values()),
        "last_isolated": last.get("learned_from") == 0,
        "cohort": "-" if seen is None else f"{seen}{' ' + SHORT_MARK if short else ''}",
        **{key: last.get(key, math.nan) for key, _, _ in DOMAIN_COLUMNS},
    }


def life_bytes(records: list[dict[str, Any]], way: str) -> float:
    """Bytes ``way`` ("sent", "received") over the peer's lives: each life's last running
    total (``total_bytes_*``: the join and the time between rounds included), else the
    sum of its rounds' own counts. The rounds' counts alone left out what arrived
    between rounds: four peers that each received the same showed up to 29 % apart (a
    review of the results)."""
    lives: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        lives.setdefault(int(r.get("incarnation", 0)), []).append(r)
    total = 0.0
    for recs in lives.values():
        running = [r[f"total_bytes_{way}"] for r in recs
                   if isinstance(r.get(f"total_bytes_{way}"), (int, float))]
        total += max(running) if running else sum(r.get(f"bytes_{way}", 0) for r in recs)
    return total


def running_time_s(records: list[dict[str, Any]]) -> float:
    """Seconds the peer was up and in rounds: per process life (incarnation), from its
    first round's start to its last round's end; the downtime between lives is left out."""
    if not records:
        return math.nan
    spans: dict[int, tuple[float, float]] = {}
    for r in records:
        inc = int(r.get("incarnation", 0))
        start, end = r["time"], r["time"] + r["round_time_s"]
        lo, hi = spans.get(inc, (start, end))
        spans[inc] = (min(lo, start), max(hi, end))
    return sum(hi - lo for lo, hi in spans.values())


def best_mean(run_dirs: list[Path], key: str = "test_acc") -> float:
    """The best, over rounds, of the peers' mean ``key`` in that round (CHFL's "best
    average validation accuracy of all clients"), over the peers that reached the
    furthest round (:func:`finished`: a peer that stopped early limited it to the rounds
    before it stopped, without a word); rounds some of them lack are skipped."""
    per_peer = [{r["round"]: r[key] for r in read_metrics(d) if key in r} for d in run_dirs]
    last = max((max(p, default=0) for p in per_peer), default=0)
    per_peer = [p for p in per_peer if max(p, default=0) >= last]
    common = set.intersection(*(set(p) for p in per_peer)) if per_peer else set()
    values = [sum(p[r] for p in per_peer) / len(per_peer) for r in common]
    return max((v for v in values if not math.isnan(v)), default=math.nan)


def finished(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The peer rows that reached the furthest round any peer reached: what the mean row
    and the best mean are over. A peer stopped early (a crash with no restart) was
    averaged in with its last round's numbers beside the others' final ones."""
    peers = [r for r in rows if r.get("peer") != "mean"]
    last = max((int(r.get("last_round") or 0) for r in peers), default=0)
    return [r for r in peers if int(r.get("last_round") or 0) >= last]


def stopped_note(rows: list[dict[str, Any]]) -> str | None:
    """A line naming the peers the mean row leaves out (stopped before the last round)."""
    peers = [r for r in rows if r.get("peer") != "mean"]
    kept = {r["peer"] for r in finished(peers)}
    early = [r for r in peers if r["peer"] not in kept]
    if not early:
        return None
    last = max(int(r.get("last_round") or 0) for r in peers)
    named = ", ".join(f"{r['peer']} (round {r.get('last_round') or 0})" for r in early)
    return (f"stopped before round {last}: {named}; the mean row and the best mean are over "
            f"the {len(kept)} peer(s) that reached it")


def isolated_note(rows: list[dict[str, Any]]) -> str | None:
    """A line naming the peers, not marked short, with rounds that learned from no other
    peer (a round without a result: the table said nothing of a last round that had
    none, and the final models were each peer's own last local step; a review)."""
    named = [f"{r['peer']} {r['isolated']}{' (the last round among them)' if r.get('last_isolated') else ''}"
             for r in rows if r.get("peer") != "mean" and r.get("isolated") and not r.get("short")]
    if not named:
        return None
    return ("rounds that learned from no other peer (no result taken, no member's knowledge: "
            "the peer's own step only): " + ", ".join(named))


def gaps_note(rows: list[dict[str, Any]]) -> str | None:
    """A line naming the peers that reached the last round but took part in fewer rounds
    (a restarted peer sits out the round its earlier life died in: 59 rounds of 60 read
    as a failure, with only the peers that stopped early named, a review)."""
    peers = [r for r in rows if r.get("peer") != "mean"]
    last = max((int(r.get("last_round") or 0) for r in peers), default=0)
    gaps = [r for r in peers if int(r.get("last_round") or 0) == last
            and isinstance(r.get("rounds"), int) and r["rounds"] < last]
    if not gaps:
        return None
    named = ", ".join(f"{r['peer']} ({r['rounds']})" for r in gaps)
    restarted = any(isinstance(r.get("restarts"), (int, float)) and r["restarts"] > 0 for r in gaps)
    return (f"took part in fewer than the {last} rounds: {named}"
            + ("; restarted peers have no line for a round they died in, sat out (PROTOCOL.md, "
               "Commit, rule 6) or that the cohort finished while they were down"
               if restarted else ""))


def columns_for(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    has_domains = any(isinstance(r.get("sel_acc"), float) and not math.isnan(r["sel_acc"]) for r in rows)
    return COLUMNS[:3] + DOMAIN_COLUMNS + COLUMNS[3:] if has_domains else COLUMNS


def mean_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of the peers that reached the last round (:func:`finished`)."""
    basis = finished(rows)
    out: dict[str, Any] = {"peer": "mean", "arch": "", "over": [r["peer"] for r in basis]}
    for key, _, _ in COLUMNS[2:-1] + DOMAIN_COLUMNS:
        vals = [r[key] for r in basis if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]
        out[key] = sum(vals) / len(vals) if vals else math.nan
    out["rounds"] = round(out["rounds"], 1) if not math.isnan(out["rounds"]) else "-"
    if not math.isnan(out["restarts"]):
        out["restarts"] = round(out["restarts"], 2)  # the mean, like every column of this row
    short = sum(1 for r in basis if r.get("short"))
    # (a diverged peer's numbers are in the mean: said on the row, not only under the
    # table; the seeds table and hfl-report said nothing of it, a review)
    out["diverged"] = [r["peer"] for r in basis if r.get("diverged_at") is not None]
    out["cohort"] = ", ".join(filter(None, [
        f"{short} short {SHORT_MARK}" if short else "",  # (the mark's legend: short)
        f"{len(out['diverged'])} diverged" if out["diverged"] else ""]))
    return out


def _fmt(value: Any, spec: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    """Cells as a Markdown table with aligned columns (reads well in a terminal too)."""
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(b) for b in body)])


def render_table(rows: list[dict[str, Any]]) -> str:
    """The results table of one run, with the note on short rows."""
    columns = columns_for(rows)
    table = markdown_table([title for _, title, _ in columns],
                           [[_fmt(r.get(k), spec) for k, _, spec in columns] for r in rows])
    notes = [SHORT_NOTE] if any(r.get("short") for r in rows) else []
    notes += [n for n in [stopped_note(rows), gaps_note(rows), isolated_note(rows),
                          damage_note({r["peer"]: r["damaged"] for r in rows if "damaged" in r})]
              if n]
    diverged = [r for r in rows if r.get("diverged_at") is not None]
    if diverged:
        notes.append("training diverged (a non-finite train_loss): " + ", ".join(
            f"{r['peer']} from round {r['diverged_at']}" for r in diverged)
            + "; their accuracies are a broken model's")
    return "\n".join([table, *notes])


def round_one_after(peer_dirs: list[Path], since: float) -> float | None:
    """Seconds from ``since`` (the command's start, wall clock) until every peer had
    begun its first round of this launch (its first metrics line written after
    ``since``; its ``time`` is when that round began), or None when a peer has none."""
    starts = []
    for d in peer_dirs:
        first = next((r["time"] for r in read_jsonl(d / "metrics.jsonl")
                      if isinstance(r.get("time"), (int, float)) and r["time"] >= since), None)
        if first is None:
            return None
        starts.append(first)
    return max(starts) - since if starts else None


def no_nan(value: Any) -> Any:
    """``value`` with NaN and infinite floats as None: results.json is strict JSON (bare
    NaN tokens, as every run's sel_* fields had, are refused by strict readers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [no_nan(v) for v in value]
    return value


def write_results(run_dir: Path, rows: list[dict[str, Any]], extra: dict[str, Any]) -> str:
    table = render_table(rows)
    (run_dir / "results.md").write_text(table + "\n")
    (run_dir / "results.json").write_text(json.dumps(no_nan({"peers": rows, **extra}), indent=2,
                                                     default=str, allow_nan=False))
    return table


# ------------------------------------------------------------------ several seeds

SEED_DIR_PREFIX = "seed"
# What a multi-seed table shows per seed and as mean ± std: the peers' means.
SEED_COLUMNS = [("sel_acc", "ACC"), ("sel_bwt", "BWT"), ("sel_fwt", "FWT"), ("acc", "final ACC"),
                ("test_acc", "test acc"), ("global_acc", "global acc"), ("best_mean", "best mean test acc"),
                ("rounds", "rounds"), ("wall_s", "wall s"), ("sent_mb", "sent MB")]


def seed_dir(run_dir: Path, seed: int) -> Path:
    return run_dir / f"{SEED_DIR_PREFIX}{seed}"


def seed_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """The per-seed run directories of a ``hfl-launch --seeds`` run, by seed."""
    out = []
    for d in run_dir.iterdir() if run_dir.is_dir() else ():
        tail = d.name[len(SEED_DIR_PREFIX):]
        if d.is_dir() and d.name.startswith(SEED_DIR_PREFIX) and tail.lstrip("-").isdigit():
            out.append((int(tail), d))
    return sorted(out)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the non-NaN values."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return m, sd


def seeds_counted(per_seed: dict[int, dict[str, Any]]) -> list[int]:
    """The seeds a mean over seeds is taken over: those whose launch did not fail (a
    failed seed's row, its peers stopped short, was averaged in like a good one)."""
    return sorted(s for s, row in per_seed.items() if not row.get("failed"))


def seeds_summary(per_seed: dict[int, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{"mean": {...}, "std": {...}}`` of every SEED_COLUMNS value over the seeds
    whose launch did not fail (:func:`seeds_counted`)."""
    out: dict[str, dict[str, float]] = {"mean": {}, "std": {}}
    counted = seeds_counted(per_seed)
    for key, _ in SEED_COLUMNS:
        m, sd = mean_std([per_seed[s].get(key, math.nan) for s in counted])
        out["mean"][key], out["std"][key] = m, sd
    return out


def render_seeds_table(per_seed: dict[int, dict[str, Any]]) -> str:
    """One row per seed (the peers' means) and a ``mean ± std`` row; only the columns
    some seed reports."""
    summary, counted = seeds_summary(per_seed), seeds_counted(per_seed)
    cols = [(k, t) for k, t in SEED_COLUMNS
            if any(isinstance(v := row.get(k), (int, float)) and not math.isnan(v)
                   for row in per_seed.values())]
    spec = {"rounds": "{:.1f}", "wall_s": "{:.1f}", "sent_mb": "{:.2f}"}
    header = ["seed", *(t for _, t in cols)]
    body = [[str(seed), *(_fmt(row.get(k, math.nan), spec.get(k, "{:.4f}")) for k, _ in cols)]
            for seed, row in sorted(per_seed.items())]
    over = (f"{len(counted)}" if len(counted) == len(per_seed)
            else f"{len(counted)} of {len(per_seed)} seeds")
    body.append([f"mean ± std ({over})", *(
        f"{_fmt(summary['mean'][k], spec.get(k, '{:.4f}'))} ± {_fmt(summary['std'][k], spec.get(k, '{:.4f}'))}"
        for k, _ in cols)])
    # What a seed's row hides (a review of the results: a failed seed and its short peers
    # were averaged in like a good one, and 4.75 rounds printed as 5)
    notes = [f"seed {seed}: {row['failed']}; left out of the mean" for seed, row
             in sorted(per_seed.items()) if row.get("failed")]
    notes += [f"seed {seed}: the mean of {len(row['over'])} of its {row['peers']} peers (the "
              "others stopped before its last round)" for seed, row in sorted(per_seed.items())
              if isinstance(row.get("over"), list) and len(row["over"]) < row.get("peers", 0)]
    # (each seed's own table marked them; this one, what most read, did not: a review)
    notes += [f"seed {seed}: {row['short']} of its peers shared with fewer peers than expected "
              "(short: see its own table)" for seed, row in sorted(per_seed.items())
              if row.get("short")]
    notes += [f"seed {seed}: training diverged on {', '.join(row['diverged'])} (a non-finite "
              "train_loss), in its mean" for seed, row in sorted(per_seed.items())
              if row.get("diverged")]
    notes += [f"seed {seed}: {note}" for seed, row in sorted(per_seed.items())
              if (note := damage_note(row.get("damaged") or {}))]
    return "\n".join([markdown_table(header, body), *notes])


def cohort_row(run_dir: Path, peers: list[tuple[str, Path]]) -> dict[str, Any]:
    """The peers' mean row of one run, with the best round's mean test accuracy."""
    rows = [peer_row(pid, "", d) for pid, d in peers]
    out = mean_row(rows) if rows else {}
    out["best_mean"] = best_mean([d for _, d in peers]) if peers else math.nan
    out["short"] = sum(1 for r in rows if r.get("short"))
    out["peers"] = len(rows)
    out["damaged"] = {r["peer"]: r["damaged"] for r in rows if r.get("damaged")}
    return out
