"""Rerun every example and benchmark whose number README.md and docs/ quote; name what moved.

    python bench/docs_numbers.py             # every check (about 1 h 45 min on an idle 2-core
                                             #   box: compare_chfl's digits cohort 32 min,
                                             #   compare_fedin 25, compare_mdhfl 20,
                                             #   compare_fedh2l 15, compare_fedhp 5; about
                                             #   twice that on a loaded one)
    python bench/docs_numbers.py --fast      # quickstart, chfl_tabular, the simulated CHFL
                                             #   cohort (about 30 s; tests/test_docs_numbers.py)
    python bench/docs_numbers.py --only chfl_digits plugins
    python bench/docs_numbers.py --write     # also rewrite the moved numbers in the docs
    python bench/docs_numbers.py --list      # the checks, their commands and quotes

A number in the docs is never typed by hand: each one is a :class:`Quote` below
(the file, where in it, and which measured value it is), and each check reruns
the command that produces it. A quote is compared at its own printed precision
(``0.9048`` against the rerun rounded to 4 decimals). Timings and byte counts
are not checked: they depend on the machine and its load (heartbeats, re-sends),
the accuracies do not. Nor are docs/fedhp.md's accuracy-vs-epsilon tables: their
DP noise comes from the operating system's CSPRNG, so no rerun repeats them.

Exit status: 0 when every quote equals its rerun; 1 when one moved (each named
with file:line, the quoted and the measured value and the command); 2 when a
quote is no longer in its document (the text around it changed: update its
anchor below) or a command failed.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, run_cmd  # noqa: E402

NUMBER = r"([-+−]?\d[\d,]*(?:\.\d+)?)"


@dataclass(frozen=True)
class Quote:
    """One number in one document.

    ``pattern`` is a regex with one group, the number; with ``row`` and ``column``
    it is applied to that cell of the first markdown table after ``anchor`` whose
    header has ``column`` and which has a row whose first cell is ``row``."""

    doc: str
    key: str  # the measured value it quotes
    pattern: str = NUMBER
    anchor: str = ""
    row: str | None = None
    column: str | None = None
    scale: float = 1.0  # the document shows value * scale (100: percent)


@dataclass
class Check:
    name: str
    command: str  # what a reader runs to get the numbers
    measure: Callable[[Path], dict[str, float]]
    quotes: list[Quote]
    fast: bool = False
    minutes: float = 1.0  # on an idle 2-core machine


@dataclass
class Found:
    quote: Quote
    line: int
    start: int  # character offsets of the number in the document
    end: int
    text: str


@dataclass
class Result:
    check: str
    moved: list[str] = field(default_factory=list)
    same: int = 0
    missing: list[str] = field(default_factory=list)
    failed: str | None = None


# ----------------------------------------------------------------------------- finding quotes


def _table_cell(text: str, q: Quote) -> tuple[int, int]:
    """Character span of cell (q.row, q.column) of the first table after q.anchor."""
    start = text.find(q.anchor) if q.anchor else 0
    if start < 0:
        raise LookupError(f"anchor {q.anchor!r} not found")
    lines = text[start:].splitlines(keepends=True)
    pos, header = start, None
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("|"):
            cells = _cells(line, pos)
            names = [text[a:b].strip() for a, b in cells]
            if header is None:
                header = names if q.column in names else None
            elif names and names[0] == q.row and len(names) == len(header):
                return cells[header.index(q.column)]
        else:
            header = None
        pos += len(line)
    raise LookupError(f"no table row {q.row!r} with column {q.column!r} after {q.anchor!r}")


def _cells(line: str, offset: int) -> list[tuple[int, int]]:
    """Spans of the cells of one markdown table row (between the pipes)."""
    bars = [i for i, ch in enumerate(line) if ch == "|"]
    return [(offset + a + 1, offset + b) for a, b in zip(bars, bars[1:], strict=False)]


def find(q: Quote, text: str) -> Found:
    if q.row is not None:
        lo, hi = _table_cell(text, q)
    else:
        lo = text.find(q.anchor) if q.anchor else 0
        if lo < 0:
            raise LookupError(f"anchor {q.anchor!r} not found")
        hi = len(text)
    m = re.compile(q.pattern).search(text, lo, hi)
    if m is None:
        raise LookupError(f"{q.pattern!r} not found" + (f" after {q.anchor!r}" if q.anchor else ""))
    return Found(q, text.count("\n", 0, m.start(1)) + 1, m.start(1), m.end(1), m.group(1))


def parse_number(text: str) -> tuple[float, int]:
    """(value, decimals) of a quoted number: ``−1.24`` (a typographic minus), ``1,818``."""
    clean = text.replace("−", "-").replace(",", "")
    decimals = len(clean.split(".")[1]) if "." in clean else 0
    return float(clean), decimals


def render(value: float, like: str) -> str:
    """``value`` printed as ``like`` is: its decimals, its sign style."""
    _, decimals = parse_number(like)
    s = f"{value:.{decimals}f}"
    signed = like.startswith(("+", "−"))  # a difference: its sign is always shown
    if signed and value >= 0:
        s = "+" + s
    if "−" in like or (signed and s.startswith("-")):
        s = s.replace("-", "−")
    return s


def compare(found: Found, value: float) -> str | None:
    """None when the quote still holds, else its rerun value in the quote's format."""
    q = found.quote
    quoted, _ = parse_number(found.text)
    shown = render(value * q.scale, found.text)
    return None if parse_number(shown)[0] == quoted else shown


# ----------------------------------------------------------------------------- measuring


def _launch_values(example: str, out_dir: Path, sets: list[str] = (), extra: list[str] = ()) -> dict:
    """hfl-launch EXAMPLE --fresh --quiet; the values of its results.json."""
    run_dir = out_dir / Path(example).stem
    cmd = [sys.executable, "-m", "hfl.launch.cli", str(ROOT / example), "--run-dir", str(run_dir),
           "--fresh", "--quiet", *extra]
    for s in sets:
        cmd += ["--set", s]
    print("$ hfl-launch " + " ".join(cmd[3:]).replace(str(ROOT) + "/", ""), flush=True)
    rc, _, out = run_cmd(cmd, 3600)
    if rc != 0:
        raise RuntimeError(f"hfl-launch {example} exited with status {rc}:\n{out[-2000:]}")
    res = json.loads((run_dir / "results.json").read_text())
    values = {"best_mean_test_acc": res["best_mean_test_acc"]}
    for row in res["peers"]:
        for col in ("test_acc", "global_acc", "best_global_acc", "sel_acc", "sel_bwt", "sel_fwt",
                    "acc"):
            if isinstance(row.get(col), (int, float)):
                values[f"{row['peer']}.{col}"] = row[col]
    return values


def measure_quickstart(out_dir: Path) -> dict:
    return _launch_values("examples/quickstart.yaml", out_dir)


def measure_chfl_tabular(out_dir: Path) -> dict:
    return _launch_values("examples/chfl_tabular.yaml", out_dir)


def measure_chfl_digits(out_dir: Path) -> dict:
    return _launch_values("examples/chfl_digits.yaml", out_dir)


def measure_rotated_digits_hetero(out_dir: Path) -> dict:
    return _launch_values("examples/rotated_digits_hetero.yaml", out_dir)


def measure_chfl_simulated(out_dir: Path) -> dict:
    """examples/chfl_tabular.yaml as expanded by hfl-launch, simulated in this process
    (hfl.algorithms.simulate: the hooks in the runtime's order, no network)."""
    import torch

    from hfl.algorithms.simulate import simulate
    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.factory import build_algorithm

    exp = load_experiment(str(ROOT / "examples" / "chfl_tabular.yaml"),
                          [f"run_dir={out_dir / 'chfl_simulated'}"])
    plans = expand(exp, gpus=[], ports=list(range(40000, 40000 + exp.peers)))
    algorithms = [build_algorithm(p.config)[0] for p in plans]
    torch.set_num_threads(1)
    rounds = plans[0].config.cohort.rounds
    history = simulate(algorithms, rounds)
    means = [statistics.mean(history[p][r]["test_acc"] for p in history) for r in range(rounds)]
    return {"best_mean_test_acc": max(means)}


def measure_plugins(out_dir: Path) -> dict:
    """docs/plugins.md: the quickstart in one process, FedAvg and the FedMedian plugin."""
    values = {}
    for label, sets in (("fedavg", []), ("fedmedian", [
            "defaults.cohort.algorithm=examples/plugins/fedmedian.py:FedMedian"])):
        got = _launch_values("examples/quickstart.yaml", out_dir / label,
                             [*sets, f"name=demo-{label}"], extra=["--in-process"])
        values.update({f"{label}.{k}": v for k, v in got.items() if k.startswith("mean.")
                       or k == "best_mean_test_acc"})
    return values


def _bench_json(script: str, args: list[str], out: Path) -> dict:
    """python bench/SCRIPT ARGS --out OUT; the results JSON the script wrote."""
    cmd = [sys.executable, str(ROOT / "bench" / script), *args, "--out", str(out)]
    print("$ " + shlex.join(cmd[1:]).replace(str(ROOT) + "/", ""), flush=True)
    rc, _, text = run_cmd(cmd, 7200)
    if rc != 0:
        raise RuntimeError(f"{script} exited with status {rc}:\n{text[-2000:]}")
    return json.loads(out.read_text())


def _mean_std(cells: dict[str, list[float]], seeds: int) -> dict[str, float]:
    """KEY.mean and KEY.std over the seeds of every cell (each must have all ``seeds`` runs:
    a benchmark leaves a failed run out of its table, which would move the numbers)."""
    short = [key for key, v in cells.items() if len(v) != seeds]
    if short:
        raise RuntimeError(f"runs missing (failed?) in {', '.join(short[:5])}")
    values = {}
    for key, v in cells.items():
        values[f"{key}.mean"] = statistics.mean(v)
        values[f"{key}.std"] = statistics.stdev(v) if len(v) > 1 else 0.0
    return values


def _paired(key: str, a: dict[int, float], b: dict[int, float], above: float) -> dict[str, float]:
    """KEY.mean and KEY.std over the seeds of a - b (the same seed's runs), and KEY.count:
    on how many seeds a - b > ``above``."""
    diff = [a[seed] - b[seed] for seed in a]
    return {f"{key}.mean": statistics.mean(diff), f"{key}.std": statistics.stdev(diff),
            f"{key}.count": sum(d > above for d in diff)}


def _compare_chfl(out_dir: Path, cohorts: list[str]) -> dict:
    """bench/compare_chfl.py's table and paired differences to SOLO, as values."""
    args = ["--cohorts", *cohorts] + (["--workers", "1"] if cohorts != ["digits"] else [])
    runs = _bench_json("compare_chfl.py", args, out_dir / f"compare_chfl_{'_'.join(cohorts)}.json")["runs"]
    values = {}
    for cohort in cohorts:
        for labels in ("IID", "non-IID"):
            acc = {m: {r["seed"]: r["best_mean_test_acc"] for r in runs
                       if (r["cohort"], r["partition"], r["method"]) == (cohort, labels, m)}
                   for m in METHODS}
            for m, by_seed in acc.items():
                key = f"{cohort}/{labels}/{m}"
                values.update(_mean_std({key: list(by_seed.values())}, 5))
                if m != "solo":  # counted: the seeds where it is at least as good as SOLO
                    values.update(_paired(f"{key}-solo", by_seed, acc["solo"], -1e-12))
    return values


def measure_compare_chfl_tabular(out_dir: Path) -> dict:
    return _compare_chfl(out_dir, ["breast_cancer", "wine"])


def measure_compare_chfl_digits(out_dir: Path) -> dict:
    return _compare_chfl(out_dir, ["digits"])


# ----------------------------------------------------------------------------- the quotes

README_TABLE = "spawns 4 peers on CPU"


def _quickstart_quotes() -> list[Quote]:
    quotes = [Quote("README.md", f"{row}.{key}", anchor=README_TABLE, row=row, column=col)
              for row in ("p0", "mean")
              for col, key in (("test acc", "test_acc"), ("global acc", "global_acc"),
                               ("best global", "best_global_acc"))]
    quotes.append(Quote("README.md", "best_mean_test_acc", anchor=README_TABLE,
                        pattern=r"best mean test acc over rounds[^:]*: " + NUMBER))
    return quotes


CHFL_RESULTS = "Best mean test accuracy (%) over rounds, mean ± std over 5 seeds"
CHFL_PAIRED = "The same runs as paired differences to SOLO"
COHORT_ROWS = {"breast_cancer": "breast-cancer", "wine": "wine", "digits": "digits"}
METHODS = ["solo", "avg", "avgkd", "chfl"]  # the tables' method columns, in order


def _cell(row_start: str, column: int) -> str:
    """A regex up to the start of cell ``column`` (0: the first after ``row_start``) of
    the table row that begins with ``row_start`` (``| wine | IID |``)."""
    return rf"{re.escape(row_start)}(?:[^|\n]*\|){{{column}}}[^|\n]*?"


def _cell_quote(doc: str, anchor: str, row_start: str, column: int, key: str, before: str = "",
                after: str = "", scale: float = 100) -> Quote:
    """The number of cell ``column`` of a table row that follows the regex ``before`` and is
    followed by ``after`` (default: the cell's first number), in percent unless ``scale``."""
    return Quote(doc, key, anchor=anchor, scale=scale,
                 pattern=_cell(row_start, column) + before + NUMBER + after)


def _pm_quotes(doc: str, anchor: str, row_start: str, column: int, key: str) -> list[Quote]:
    """The two numbers of a ``95.70 ± 1.87`` (or ``32.2 % ± 1.8``) cell, bold or not, in percent."""
    return [_cell_quote(doc, anchor, row_start, column, f"{key}.mean", r"\*{0,2}", r"(?: %)? ±"),
            _cell_quote(doc, anchor, row_start, column, f"{key}.std", "± ")]


def _pm_table(doc: str, anchor: str, rows: dict[str, str], columns: list[str | None]) -> list[Quote]:
    """Every ``mean ± std`` cell of the first columns of a table: ``rows`` maps the first cell
    of a row to the label it stands for, ``columns`` names the measured value of each column
    (None: not a ``±`` cell); a cell quotes ``LABEL/COLUMN`` over the seeds."""
    return [q for row, label in rows.items() for i, col in enumerate(columns) if col
            for q in _pm_quotes(doc, anchor, f"| {row} |", i, f"{label}/{col}")]


def _chfl_table_quotes(cohorts: list[str]) -> list[Quote]:
    """docs/chfl.md's two results tables: a row is (cohort, labels), a column a method
    (the paired table has no SOLO column); a cell reads ``95.70 ± 1.87`` or
    ``+0.00 ± 0.58 (3/5)``."""
    quotes = []
    for cohort in cohorts:
        for labels in ("IID", "non-IID"):
            row = f"| {COHORT_ROWS[cohort]} | {labels} |"
            for i, m in enumerate(METHODS):
                key = f"{cohort}/{labels}/{m}"
                quotes += _pm_quotes("docs/chfl.md", CHFL_RESULTS, row, i, key)
                if m == "solo":
                    continue
                quotes += _pm_quotes("docs/chfl.md", CHFL_PAIRED, row, i - 1, f"{key}-solo")
                quotes.append(_cell_quote("docs/chfl.md", CHFL_PAIRED, row, i - 1, f"{key}-solo.count",
                                          r"\(", "/5", scale=1))
    return quotes


ATTACKS_TABLE = "| attack | f | mean (no defense)"
ATTACKS_WORST = "A lying aggregator (it contributes honestly"


def _attacks_quotes() -> list[Quote]:
    """docs/robust.md's attack benchmark: the final-round table (a row per attack and f)
    and the lying aggregator's worst-round table (a row per f and where it aggregates)."""
    from attacks import ATTACKS, DEFENSES

    quotes = []
    rows = [("none", 0, "aggregator")] + [(a, f, "aggregator") for a in ATTACKS if a != "none"
                                          for f in (1, 2)]
    rows += [("lying aggregator", f, "every_peer") for f in (1, 2)]
    for attack, f, at in rows:
        label = attack + (" (every_peer)" if at == "every_peer" else "")
        for i, d in enumerate(DEFENSES):
            quotes += _pm_quotes("docs/robust.md", ATTACKS_TABLE, f"| {label} | {f} |", i,
                                 f"final/{attack}/{f}/{at}/{d}")
    for f in (1, 2):
        for at in ("aggregator", "every_peer"):
            for i, d in enumerate(DEFENSES):
                quotes += _pm_quotes("docs/robust.md", ATTACKS_WORST, f"| f={f} {at} |", i,
                                     f"worst/lying aggregator/{f}/{at}/{d}")
    return quotes


def measure_attacks(out_dir: Path) -> dict:
    """bench/attacks.py --seeds 0 1 2: each cell's mean and std over the seeds."""
    cells: dict[str, list[float]] = {}
    for r in _bench_json("attacks.py", ["--seeds", "0", "1", "2"], out_dir / "attacks.json")["runs"]:
        for which in ("final", "worst"):
            cells.setdefault(f"{which}/{r['attack']}/{r['f']}/{r['aggregate_at']}/{r['defense']}",
                             []).append(r[which])
    return _mean_std(cells, 3)


FEDHP_TABLE = "**Table 1** (paper: SOLO"
FEDHP_HETERO = "**Model heterogeneity** (paper 4.4"
FEDHP_ROWS = {"SOLO": "SOLO", "FedAvg": "FedAvg", "FedProx (μ = 0.01)": "FedProx",
              "FedProto": "FedProto", "FedHP (paper defaults: t = 1, cosine, λ = 1)": "FedHP",
              "FedHP, t = 0.1": "FedHP t=0.1"}
FEDHP_HETERO_ROWS = {
    "FedHP, every peer projection + 1 FC decision (2 FC)": "FedHP 2 FC (all)",
    "FedHP, p1 and p3 with a 2-FC decision head (2 / 3 FC)": "FedHP 2/3 FC",
    "FedProto, every encoder 1 hidden layer": "FedProto 1 hidden (all)",
    "FedProto, p1 and p3 with 2 hidden layers": "FedProto 1/2 hidden"}


def measure_compare_fedhp(out_dir: Path) -> dict:
    """bench/compare_fedhp.py's Table 1 and model-heterogeneity table (its epsilon part draws
    its noise from the OS, so no run repeats it; its plot goes to out_dir, not docs/)."""
    res = _bench_json("compare_fedhp.py", ["--plot", str(out_dir / "fedhp_epsilon.png")],
                      out_dir / "compare_fedhp.json")
    return _mean_std({f"{label}/{col}": v for part in ("table", "hetero")
                      for label, cols in res[part].items() for col, v in cols.items()},
                     len(res["seeds"]))


def _fedhp_quotes() -> list[Quote]:
    return (_pm_table("docs/fedhp.md", FEDHP_TABLE, FEDHP_ROWS, ["best", "final", "best_balanced"])
            + _pm_table("docs/fedhp.md", FEDHP_HETERO, FEDHP_HETERO_ROWS, ["best", "best_balanced"]))


FEDH2L_RESULTS = "`python bench/compare_fedh2l.py --ablation --forms` (2-core"
FEDH2L_FORMS = "**The two g_loc forms, measured**"
FEDH2L_KEPT = "**Selected vs final model, and the tie rule**"
FEDH2L_ROWS = {
    "**FedH2L** (paper's g_loc, shared AMSGrad)": "FedH2L", "IND (`solo`)": "IND (solo)",
    "AGG (`agg`)": "AGG", "FedMD (`fedmd`)": "FedMD", "FedH2L, no KL": "FedH2L no KL",
    "FedH2L, no projection": "FedH2L no projection", "FedH2L, PCGrad": "FedH2L PCGrad",
    "FedH2L, earlier form (`g_loc: change`, own AMSGrad)": "FedH2L change+AMSGrad",
    "FedH2L, Algorithm 1 to the letter (1 local batch a round, 300 rounds)": "FedH2L one batch",
    "FedH2L, selected on `val+public`": "FedH2L sel val+public"}
FEDH2L_FORM_ROWS = {
    "paper's: raw gradient, shared AMSGrad, 1 local batch a round": "FedH2L one batch",
    "paper's: mean raw gradient of 10 local batches (default)": "FedH2L",
    "earlier: parameter change of 10 batches, own AMSGrad": "FedH2L change+AMSGrad"}
FEDH2L_KEPT_ROWS = {"FedH2L (default)": "FedH2L", "earlier form": "FedH2L change+AMSGrad",
                    "selected on `val+public`": "FedH2L sel val+public",
                    "1 local batch, 300 rounds": "FedH2L one batch"}


def measure_compare_fedh2l(out_dir: Path) -> dict:
    """bench/compare_fedh2l.py --ablation --forms on the digits: every statistic of every
    row (ACC, BWT, FWT, fired, cos, the kept rounds, ...) over the seeds."""
    res = _bench_json("compare_fedh2l.py", ["--ablation", "--forms"], out_dir / "compare_fedh2l.json")
    return _mean_std({f"{label}/{stat}": [r[stat] for r in runs]
                      for label, runs in res["results"].items() for stat in (runs or [{}])[0]},
                     len(res["seeds"]))


def _fedh2l_quotes() -> list[Quote]:
    """docs/fedh2l.md's results table and the two tables after it (the forms' projection
    statistics; the model each tie rule keeps)."""
    doc = "docs/fedh2l.md"
    quotes = _pm_table(doc, FEDH2L_RESULTS, FEDH2L_ROWS,
                       ["ACC", "BWT", "FWT", "final ACC", "final BWT", "final FWT"])
    quotes += _pm_table(doc, FEDH2L_FORMS, FEDH2L_FORM_ROWS, ["fired", None, "first max ACC", "final ACC"])
    quotes += _pm_table(doc, FEDH2L_KEPT, FEDH2L_KEPT_ROWS, ["first max ACC", "last max ACC", "final ACC"])
    quotes += [_cell_quote(doc, FEDH2L_FORMS, f"| {row} |", 1, f"{label}/cos.mean", scale=1)
               for row, label in FEDH2L_FORM_ROWS.items()]
    quotes += [_cell_quote(doc, FEDH2L_KEPT, f"| {row} |", column, f"{label}/{stat}.mean", before,
                           after, scale=1)
               for row, label in FEDH2L_KEPT_ROWS.items()
               for column, stat, before, after in ((3, "first max round", "", " /"),
                                                   (3, "last max round", "/ ", ""),
                                                   (4, "tied rounds", "", ""))]
    return quotes


FEDH2L_MNIST_TABLE5 = "**Table 5, the ablation, on real Rotated MNIST.**"
FEDH2L_MNIST_ARGS = ["--data", "mnist", "--methods", "FedH2L", "--ablation", "--reuse"]
FEDH2L_MNIST_ROWS = {"FedH2L": "FedH2L", "FedH2L, no KL": "FedH2L no KL",
                     "FedH2L, no projection": "FedH2L no projection",
                     "FedH2L, PCGrad": "FedH2L PCGrad"}


FEDH2L_MNIST_OTHERS = "**Table 2's other rows, every round.**"
FEDH2L_MNIST_OTHERS_ARGS = ["--data", "mnist", "--methods", "FedMD", "FedAvg", "FedProx", "--reuse"]
FEDH2L_MNIST_OTHERS_ROWS = {"FedMD (`fedmd`)": "FedMD", "FedAvg, every round": "FedAvg",
                            "FedProx, every round": "FedProx"}


FEDH2L_MNIST_DRAWS = "**Over draws of the base images.**"
FEDH2L_MNIST_DRAWS_ARGS = ["--data", "mnist", "--draw", "seed", "--seeds", "1", "2", "3", "4",
                           "--methods", "FedH2L", "--reuse"]


FEDH2L_MNIST_ALPHA = "**Table 2 at α = 5 % and 15 %.**"
FEDH2L_MNIST_ALPHA_ARGS = ["--data", "mnist", "--alpha", "5", "15", "--methods", "FedH2L", "AGG",
                           "IND (solo)", "FedMD", "FedAvg bw-matched", "FedProx bw-matched",
                           "FedAvg", "FedProx", "--reuse"]
FEDH2L_MNIST_ALPHA_ROWS = {f"{row}, α = {a} %": f"{label} α={a}%" for a in (5, 15)
                           for row, label in (("FedH2L", "FedH2L"), ("AGG", "AGG"),
                                              ("IND", "IND (solo)"), ("FedMD", "FedMD"),
                                              ("FedAvg bw-matched", "FedAvg bw-matched"),
                                              ("FedProx bw-matched", "FedProx bw-matched"),
                                              ("FedAvg every round", "FedAvg"),
                                              ("FedProx every round", "FedProx"))}


def measure_compare_fedh2l_mnist(out_dir: Path, args: list[str] = FEDH2L_MNIST_ARGS,
                                 name: str = "compare_fedh2l_mnist") -> dict:
    """bench/compare_fedh2l.py --data mnist --methods FedH2L --ablation (Table 5 on real
    Rotated MNIST, 12 launches of 10,000 rounds; --reuse takes the finished runs under
    runs/bench/fedh2l_mnist/, so only what is missing runs), or other ``args``."""
    res = _bench_json("compare_fedh2l.py", args, out_dir / f"{name}.json")
    return _mean_std({f"{label}/{stat}": [r[stat] for r in runs]
                      for label, runs in res["results"].items() for stat in (runs or [{}])[0]},
                     len(res["seeds"]))


FEDIN_METHODS = ["SOLO", "FedAvg", "FedProx", "FedIN", "w/o IN", "w/o Prox", "w/o Opt", "FedIN eq.14"]
FEDIN_RUNS = [  # the runs behind docs/fedin.md's three grey-view tables
    ["--rounds", "12", "--partitions", "non-IID", "--methods", *FEDIN_METHODS],
    ["--rounds", "12", "--partitions", "IID", "--methods", "FedAvg", "FedIN"],
    ["--rounds", "12", "--partitions", "IID", "--methods", "SOLO", "FedProx", "--seeds", "0"]]
FEDIN_MAIN = "**Main table (Tables I-III form), grey 16 px view.**"
FEDIN_IID = "IID (SOLO and FedProx: seed 0 only):"
FEDIN_ABLATION = "**Ablation (Table VII form), non-IID, 3 seeds**"
FEDIN_ROWS = {"SOLO": "SOLO", "FedAvg (layer-wise)": "FedAvg",
              "FedProx (layer-wise, mu 0.1)": "FedProx", "**FedIN**": "FedIN"}


def measure_compare_fedin(out_dir: Path) -> dict:
    """bench/compare_fedin.py's runs behind the grey-view tables: per (labels, method) the
    peers' mean global-test accuracy in the last round and the best one, over the seeds and
    per seed."""
    values = {}
    for i, args in enumerate(FEDIN_RUNS):
        res = _bench_json("compare_fedin.py", args, out_dir / f"compare_fedin_{i}.json")
        cells: dict[str, list[float]] = {}
        for r in res["runs"]:
            key = f"{r['partition']}/{r['method']}"
            values[f"{key}/last.s{r['seed']}"] = r["curve"][-1]
            cells.setdefault(f"{key}/last", []).append(r["curve"][-1])
            cells.setdefault(f"{key}/best", []).append(max(r["curve"]))
        values.update(_mean_std(cells, len(res["seeds"])))
    return values


def _fedin_quotes() -> list[Quote]:
    """docs/fedin.md's accuracies: the non-IID and IID tables (a cell reads ``74.65 ± 3.05``,
    ``74.65`` for one seed, with the best round's in brackets where it differs) and the
    ablation table (a column per method: over the seeds and per seed)."""
    doc = "docs/fedin.md"
    quotes = _pm_table(doc, FEDIN_MAIN, {r: f"non-IID/{m}" for r, m in FEDIN_ROWS.items()},
                       [None, "last"])
    iid = {"SOLO": "SOLO", "FedAvg (layer-wise)": "FedAvg", "FedProx (layer-wise, mu 0.1)": "FedProx"}
    quotes += _pm_table(doc, FEDIN_IID, {"FedAvg (layer-wise)": "IID/FedAvg", "**FedIN**": "IID/FedIN"},
                        [None, "last"])
    quotes += [_cell_quote(doc, FEDIN_IID, f"| {r} |", 1, f"IID/{iid[r]}/{key}", before)
               for r, key, before in (("SOLO", "last.mean", ""),
                                      ("FedProx (layer-wise, mu 0.1)", "last.mean", ""),
                                      ("FedProx (layer-wise, mu 0.1)", "best.mean", r".*\(best "),
                                      ("FedAvg (layer-wise)", "best.mean", r".*\(best "),
                                      ("FedAvg (layer-wise)", "best.std", r".*\(best [\d.]+ ± "))]
    for i, m in enumerate(["FedAvg", "w/o IN", "w/o Prox", "w/o Opt", "FedIN eq.14", "FedIN"]):
        quotes += _pm_quotes(doc, FEDIN_ABLATION, "| accuracy |", i, f"non-IID/{m}/last")
        quotes += [_cell_quote(doc, FEDIN_ABLATION, "| per seed (0, 1, 2) |", i,
                               f"non-IID/{m}/last.s{seed}", rf"(?:[^,|\n]*, ){{{seed}}}")
                   for seed in range(3)]
    return quotes


MDHFL_RUNS = [  # docs/mdhfl.md's "What was run", before its --summarize
    ["--rates", "0.2"],
    ["--rates", "0.1", "0.3", "--seeds", "0", "--methods", "mdhfl", "fedmd", "feddf", "--workers", "1"],
    ["--noise", "pair", "--rates", "0.3", "--seeds", "1", "2", "--methods", "mdhfl", "fedmd", "feddf"]]
MDHFL_TABLE = "Final-round mean accuracy (%), mean ± std over the seeds shown:"
MDHFL_PAIRED = "Paired differences (same seed, data, noise draw and models), MDH-FL minus"
MDHFL_ROWS = {"MDH-FL": "mdhfl", "FedMD": "fedmd", "FedDF": "feddf",
              "KD+CE (MDH-FL without SCE)": "kd_ce", "SOLO+SCE (MDH-FL without KD)": "solo_sce",
              "SOLO+CE": "solo_ce"}
MDHFL_COLUMNS = ["symmetric 0.1", "symmetric 0.2", "symmetric 0.3", "pair 0.1", "pair 0.2", "pair 0.3"]
MDHFL_SEEDS = {"symmetric 0.2": 3, "pair 0.2": 3, "pair 0.3": 3}  # the other columns: seed 0


def measure_compare_mdhfl(out_dir: Path) -> dict:
    """bench/compare_mdhfl.py's runs behind docs/mdhfl.md's tables: the final-round accuracy
    per method and setting over the seeds, and MDH-FL minus each method, seed by seed."""
    final: dict[str, dict[int, float]] = {}
    for i, args in enumerate(MDHFL_RUNS):
        for r in _bench_json("compare_mdhfl.py", args, out_dir / f"compare_mdhfl_{i}.json")["runs"]:
            final.setdefault(f"{r['method']}/{r['noise']} {r['rate']:g}", {})[r["seed"]] = r["final_acc"]
    values = {}
    for key, by_seed in final.items():
        method, setting = key.split("/")
        values.update(_mean_std({key: list(by_seed.values())}, MDHFL_SEEDS.get(setting, 1)))
        if method != "mdhfl" and len(by_seed) > 1:  # counted: the seeds where MDH-FL is ahead
            values.update(_paired(f"mdhfl-{key}", final[f"mdhfl/{setting}"], by_seed, 0))
    return values


def _mdhfl_quotes() -> list[Quote]:
    """docs/mdhfl.md's Table 4 form (``52.75 ± 0.72``, one seed ``61.29``, not run ``-``) and
    the paired differences to MDH-FL (``+0.54 ± 3.29 (2/3)``)."""
    doc = "docs/mdhfl.md"
    quotes = []
    for row, method in MDHFL_ROWS.items():
        main = method in ("mdhfl", "fedmd", "feddf")
        columns = [c if c in MDHFL_SEEDS and (main or c != "pair 0.3") else None for c in MDHFL_COLUMNS]
        quotes += _pm_table(doc, MDHFL_TABLE, {row: method}, columns)
        quotes += [_cell_quote(doc, MDHFL_TABLE, f"| {row} |", i, f"{method}/{col}.mean", r"\*{0,2}")
                   for i, col in enumerate(MDHFL_COLUMNS) if main and col not in MDHFL_SEEDS]
    paired = {"− FedMD": "fedmd", "− FedDF": "feddf", "− KD+CE (SCE's effect)": "kd_ce",
              "− SOLO+SCE (KD's effect)": "solo_sce", "− SOLO+CE": "solo_ce"}
    for row, method in paired.items():
        for i, col in enumerate(["symmetric 0.2", "pair 0.2", "pair 0.3"]):
            if col == "pair 0.3" and method not in ("fedmd", "feddf"):
                continue
            key = f"mdhfl-{method}/{col}"
            quotes += _pm_quotes(doc, MDHFL_PAIRED, f"| {row} |", i, key)
            quotes.append(_cell_quote(doc, MDHFL_PAIRED, f"| {row} |", i, f"{key}.count", r"\(", "/3",
                                      scale=1))
    return quotes


def _fedh2l_mnist_check(name: str, args: list[str], anchor: str, rows: dict[str, str],
                        columns: list[str], minutes: float, also: list[Quote] = ()) -> Check:
    """A check of one docs/fedh2l.md table from ``bench/compare_fedh2l.py ARGS`` on real
    Rotated MNIST (mean ± std over the seeds, per row and column), and of ``also``
    (the same numbers repeated in another table)."""
    return Check(name, "python bench/compare_fedh2l.py " + shlex.join(args),
                 lambda out_dir: measure_compare_fedh2l_mnist(out_dir, args, name),
                 _pm_table("docs/fedh2l.md", anchor, rows, columns) + list(also),
                 minutes=minutes)


CHECKS = [
    Check("quickstart", "hfl-launch examples/quickstart.yaml", measure_quickstart,
          _quickstart_quotes() + [
              Quote("docs/plugins.md", k, anchor="| run | peers |", row="fedavg", column=col)
              for k, col in (("mean.test_acc", "test acc"), ("mean.global_acc", "global acc"),
                             ("best_mean_test_acc", "best mean test acc"))],
          fast=True, minutes=0.2),
    Check("chfl_tabular", "hfl-launch examples/chfl_tabular.yaml", measure_chfl_tabular,
          [Quote("docs/chfl.md", "best_mean_test_acc",
                 pattern=r"chfl_tabular\.yaml`\s+gives best mean test accuracy " + NUMBER)],
          fast=True, minutes=0.3),
    Check("chfl_simulated", "examples/chfl_tabular.yaml in hfl.algorithms.simulate "
          "(bench/compare_chfl.py's in-process path, seed 0)", measure_chfl_simulated,
          [Quote("docs/chfl.md", "best_mean_test_acc",
                 pattern=NUMBER + r", the simulated seed-0 number")],
          fast=True, minutes=0.2),
    Check("chfl_digits", "hfl-launch examples/chfl_digits.yaml", measure_chfl_digits,
          [Quote("docs/chfl.md", "best_mean_test_acc",
                 pattern=r"chfl_digits\.yaml`\s+gives " + NUMBER)], minutes=1.5),
    Check("plugins", "hfl-launch examples/quickstart.yaml --in-process, with fedavg and with "
          "examples/plugins/fedmedian.py:FedMedian (docs/plugins.md)", measure_plugins,
          [Quote("docs/plugins.md", f"{run}.{k}", anchor="| run | peers |", row=run, column=col)
           for run in ("fedavg", "fedmedian")
           for k, col in (("mean.test_acc", "test acc"), ("mean.global_acc", "global acc"),
                          ("best_mean_test_acc", "best mean test acc"))],
          minutes=0.5),
    Check("compare_chfl_tabular", "python bench/compare_chfl.py --cohorts breast_cancer wine "
          "--workers 1", measure_compare_chfl_tabular, _chfl_table_quotes(["breast_cancer", "wine"]),
          minutes=1.5),
    Check("compare_chfl_digits", "python bench/compare_chfl.py --cohorts digits",
          measure_compare_chfl_digits, _chfl_table_quotes(["digits"]), minutes=32),
    Check("attacks", "python bench/attacks.py --seeds 0 1 2", measure_attacks, _attacks_quotes(),
          minutes=1.5),
    Check("rotated_digits_hetero", "hfl-launch examples/rotated_digits_hetero.yaml",
          measure_rotated_digits_hetero,
          [Quote("docs/fedh2l.md", f"{row}.{key}", anchor="### Heterogeneous architectures", row=row,
                 column=col, scale=100)
           for row in ("p0", "p1", "p2", "p3", "mean")
           for col, key in (("ACC", "sel_acc"), ("BWT", "sel_bwt"), ("FWT", "sel_fwt"),
                            ("final ACC", "acc"))], minutes=1.5),
    Check("compare_fedhp", "python bench/compare_fedhp.py", measure_compare_fedhp, _fedhp_quotes(),
          minutes=5),
    Check("compare_fedh2l", "python bench/compare_fedh2l.py --ablation --forms",
          measure_compare_fedh2l, _fedh2l_quotes(), minutes=15),
    _fedh2l_mnist_check("compare_fedh2l_mnist", FEDH2L_MNIST_ARGS, FEDH2L_MNIST_TABLE5,
                        FEDH2L_MNIST_ROWS, ["ACC", "BWT", "FWT", "final ACC"], 330,
                        also=_pm_table("docs/fedh2l.md", FEDH2L_MNIST_ALPHA,
                                       {"FedH2L, α = 10 % (above)": "FedH2L"},
                                       ["ACC", "BWT", "FWT", "final ACC"])),
    _fedh2l_mnist_check("compare_fedh2l_mnist_others", FEDH2L_MNIST_OTHERS_ARGS, FEDH2L_MNIST_OTHERS,
                        FEDH2L_MNIST_OTHERS_ROWS, ["ACC", "BWT", "FWT", "final ACC"], 190),
    _fedh2l_mnist_check("compare_fedh2l_mnist_draws", FEDH2L_MNIST_DRAWS_ARGS, FEDH2L_MNIST_DRAWS,
                        {"FedH2L, 4 draws": "FedH2L"},
                        ["ACC", "BWT", "FWT", "final ACC", "final BWT", "final FWT"], 40),
    _fedh2l_mnist_check("compare_fedh2l_mnist_alpha", FEDH2L_MNIST_ALPHA_ARGS, FEDH2L_MNIST_ALPHA,
                        FEDH2L_MNIST_ALPHA_ROWS, ["ACC", "BWT", "FWT", "final ACC"], 240),
    Check("compare_fedin", "; ".join("python bench/compare_fedin.py " + shlex.join(args)
                                     for args in FEDIN_RUNS),
          measure_compare_fedin, _fedin_quotes(), minutes=25),
    Check("compare_mdhfl", "; ".join("python bench/compare_mdhfl.py " + " ".join(args)
                                     for args in MDHFL_RUNS),
          measure_compare_mdhfl, _mdhfl_quotes(), minutes=20),
]


# ----------------------------------------------------------------------------- running


def run_check(check: Check, out_dir: Path, write: bool) -> Result:
    result = Result(check.name)
    found: list[Found] = []
    for q in check.quotes:
        try:
            found.append(find(q, (ROOT / q.doc).read_text()))
        except LookupError as err:
            result.missing.append(f"{q.doc}: {q.key}: {err}")
    if result.missing:
        return result
    try:
        values = check.measure(out_dir / check.name)
    except Exception as exc:  # noqa: BLE001 - reported, the other checks go on
        result.failed = f"{type(exc).__name__}: {exc}"
        return result
    edits: dict[str, list[tuple[Found, str]]] = {}
    for f in found:
        if f.quote.key not in values:
            result.missing.append(f"{f.quote.doc}:{f.line}: {f.quote.key}: not measured")
            continue
        new = compare(f, values[f.quote.key])
        if new is None:
            result.same += 1
            continue
        result.moved.append(f"{f.quote.doc}:{f.line}: {f.quote.key}: the doc says {f.text}, "
                            f"`{check.command}` gives {new}")
        edits.setdefault(f.quote.doc, []).append((f, new))
    if write:  # found again in the page as it is now (it may have been edited meanwhile)
        for doc, changes in edits.items():
            text = (ROOT / doc).read_text()
            spans = [(find(f.quote, text), new) for f, new in changes]
            for now, new in sorted(spans, key=lambda c: -c[0].start):
                text = text[: now.start] + new + text[now.end:]
            (ROOT / doc).write_text(text)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fast", action="store_true", help="only the fast checks (about 30 s)")
    ap.add_argument("--only", nargs="+", choices=[c.name for c in CHECKS], metavar="CHECK")
    ap.add_argument("--write", action="store_true", help="rewrite moved numbers in the docs")
    ap.add_argument("--list", action="store_true", help="list the checks and their quotes")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "runs" / "bench" / "docs_numbers")
    args = ap.parse_args(argv)
    checks = [c for c in CHECKS if (not args.only or c.name in args.only) and (c.fast or not args.fast)]
    if args.list:
        for c in checks:
            print(f"{c.name} ({'fast, ' if c.fast else ''}~{c.minutes:g} min): {c.command}")
            for q in c.quotes:
                print(f"    {q.doc}: {q.key}")
        return 0
    t0 = time.perf_counter()
    results = []
    for c in checks:
        print(f"== {c.name}: {c.command}", flush=True)
        r = run_check(c, args.out_dir, args.write)
        results.append(r)
        for line in r.moved:
            print(f"  MOVED {line}")
        for line in r.missing:
            print(f"  QUOTE NOT FOUND {line}")
        if r.failed:
            print(f"  FAILED {r.failed}")
        print(f"  {r.same} quote(s) hold, {len(r.moved)} moved", flush=True)
    moved = sum(len(r.moved) for r in results)
    broken = [r.check for r in results if r.missing or r.failed]
    print(f"\n{sum(r.same for r in results)} quoted number(s) hold, {moved} moved"
          + (" (rewritten in the docs)" if moved and args.write else "")
          + (f"; broken checks: {', '.join(broken)}" if broken else "")
          + f" ({time.perf_counter() - t0:.0f} s)")
    return 2 if broken else 1 if moved and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
