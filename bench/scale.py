"""Scale: what N peers cost the runtime, in one process and as N processes ("a thousand peers").

    python bench/scale.py [--quick] [--inprocess 16,64,256,1000] [--forked 64,200] [--sim 8,64]
                          [--rounds 10]
                          [--set KEY=VALUE ...] [--label NAME] [--merge FILE.json ...] [--hfl-src DIR]

For each N it runs examples/quickstart.yaml with ``peers: N`` and ``cohort.rounds: R``
(plus the ``--set`` overrides, applied to the file as ``hfl-launch --set`` applies
them), kills one peer (the highest index) abruptly once every peer has finished
round ``--kill-after``, and measures:

* **in-process** (``--inprocess``): all N peers in one worker process
  (bench/_scale_worker.py, as ``hfl-launch --in-process`` runs them, on the
  in-memory transport). The worker kills the victim like SIGKILL (its sends fail
  silently, sends to it fail, its task is cancelled). Peak memory is the worker's ru_maxrss.
* **forked** (``--forked``): ``hfl-launch`` with one process per peer. From the peers'
  metrics.jsonl: whether the whole cohort formed (max ``live_peers`` == N), round
  times, ``bytes_sent``; the victim's process is found by the pid its ``started`` note
  in events.jsonl gives, and SIGKILLed (a checkout given with ``--hfl-src`` from before
  the note had a pid cannot be killed: the row says so); detection from the other peers' typed events
  (``member`` notes in events.jsonl). Peak memory: the sum of the peers' peak RSS (VmHWM, read
  from /proc while they run; pages shared with the template count once per peer, so
  the JSON also has the largest total PSS sampled).
* **sim** (``--sim``, default none): the same cohort on the deterministic simulator
  (``hfl.launch.sim.run_seed``, in a worker subprocess: this script run as
  ``scale.py _sim-worker SPEC.json``), on virtual time, so the numbers show the
  protocol, not a loop saturated by N peers. The quickstart's timing (heartbeat 0.5 s,
  suspect 2 s, dead 4 s, round timeout 30 s, aggregate grace 10 s; a ``--set
  defaults.timing.KEY=V`` of one of these wins), no network faults, at least 15 rounds,
  and one fault: the highest-index peer is SIGKILLed at virtual t=9 s and restarted 20 s
  later (the simulator always restarts a crashed peer; 20 s lets it rejoin before the
  others finish, so the run ends cleanly). Detection ends at the restart; the notes
  carry the virtual time ``vt``; training costs 0.5 virtual s a call whatever it
  really takes. The row's notes carry the simulator's invariant violations; its wall
  seconds are real time.

In every mode the numbers come from what the peers write, nothing of the runtime is
patched (``_scale_worker.from_events``): detection is the kill to each survivor's first
``member`` note that the victim went dead (events.jsonl); messages and bytes by type
are the peers' ``sent`` notes (at each round's end, what that life has sent so far;
membership = every type but knowledge/aggregate/ack/commit/seed_request/seed_chunk/
error). Rates are per peer per second from the first ``sent`` note to the last (round
1's end to the last round's end: the join left out); bytes per peer per round are
every life's last note over N and R (a killed peer's sends after its last round's end
are not counted). s/round is the mean ``round_time_s``, the round that waits for the
victim to be declared dead included.

The quickstart's digits data cannot be split a thousand ways: above ``--max-partitions``
(64) peers, the data is split into that many parts and peer i takes part i mod 64
(peers i and i+64 hold the same rows), so the cohort's work per round stays bounded.

Every run has a timeout (``--timeout``, default 1800 s): a run past it, or one that
fails, is a row saying so. ``--hfl-src DIR`` measures another checkout (e.g. a git
worktree of an older commit) with this same script: the worker and every process
hfl-launch starts import ``hfl`` from DIR (a ``sitecustomize.py`` on PYTHONPATH).

Writes runs/bench/scale.json (runs/bench/scale-<label>.json for another --label) and,
with --plot, a figure of every metric against N (scale.png / scale-<label>.png).
``--merge FILE.json`` adds an earlier run's rows (e.g. ``--label before``) to both.
Runs go to runs/bench/scale/<label>-<mode>-n<N>/ (with the experiment file beside it),
their output to runs/bench/logs/scale-<label>-<mode>-n<N>.log.

--quick: in-process N=16,32, forked N=8, sim N=8, 4 rounds (sim: 15), kill after round 2. (Forked
quickstart rounds of a few peers take tens of ms: the kill from outside may land
after the victim's last round; the row then says so and has no detection time.)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c
import _scale_worker as w
import yaml

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_scale_worker.py"
SCALE_DIR = c.OUT_DIR / "scale"
LOG_DIR = c.OUT_DIR / "logs"
POLL_S = 0.5  # forked: how often the script reads metrics and /proc...
KILL_POLL_S = 0.05  # ...and until the kill, how often it looks for the last round kill_after line
PSS_EVERY_S = 10.0  # /proc/PID/smaps_rollup walks page tables: not every poll

# --sim: one seed, one crash, the quickstart's timing (bench/README.md, "scale.py").
SIM_WORKER_ARG = "_sim-worker"  # `scale.py _sim-worker SPEC.json` runs one sim N
SIM_SEED = 1
SIM_KILL_AT_S = 9.0  # virtual time of the victim's SIGKILL...
SIM_DOWN_S = 20.0  # ...and of its restart after it: before the others finish (15+ rounds)
SIM_MIN_ROUNDS = 15
SIM_TIMING = {
    "heartbeat_interval_s": 0.5,
    "suspect_after_s": 2.0,
    "dead_after_s": 4.0,
    "round_timeout_s": 30.0,
    "aggregate_grace_s": 10.0,
}
#: Plot style per mode: (marker, line style, legend name).
MODE_STYLES = {
    "inprocess": ("o", "-", "in-process"),
    "forked": ("s", "--", "forked"),
    "sim": ("^", ":", "simulator (virtual s)"),
}

#: Table columns: (row key, header, format).
COLUMNS = [
    ("label", "series", "{}"),
    ("mode", "mode", "{}"),
    ("n", "N", "{}"),
    ("status", "status", "{}"),
    ("s_per_round", "s/round", "{:.3f}"),
    ("floor_s_per_round", "floor s/round", "{:.3f}"),
    ("rounds_span_s", "rounds span s", "{:.1f}"),
    ("membership_msgs_per_peer_s", "membership msgs/peer/s", "{:.1f}"),
    ("msgs_per_peer_s", "all msgs/peer/s", "{:.1f}"),
    ("bytes_per_peer_round", "bytes/peer/round", "{:,.0f}"),
    ("membership_bytes_per_peer_round", "membership bytes/peer/round", "{:,.0f}"),
    ("peak_mb", "peak MB", "{:,.0f}"),
    ("detect_median_s", "detect median s", "{:.2f}"),
    ("detect_max_s", "detect max s", "{:.2f}"),
    ("full_cohort", "full cohort", "{}"),
    ("acc", "acc", "{:.3f}"),
    ("others_cpu", "others' CPU", "{}"),
    ("wall_s", "wall s", "{:.0f}"),
]

#: Plot panels: (row key, title, log y axis).
PANELS = [
    ("s_per_round", "s / round", False),
    ("rounds_span_s", "rounds span (s)", False),
    ("membership_msgs_per_peer_s", "membership msgs / peer / s", True),
    ("msgs_per_peer_s", "all msgs / peer / s", True),
    ("bytes_per_peer_round", "bytes / peer / round", True),
    ("membership_bytes_per_peer_round", "membership bytes / peer / round", True),
    ("peak_mb", "peak memory (MB)", True),
    ("detect_median_s", "detection, median (s)", False),
    ("detect_max_s", "detection, max (s)", False),
    ("acc", "final mean accuracy", False),
]


# --------------------------------------------------------------------------- arguments


def sizes(text: str) -> list[int]:
    """``16,64`` -> [16, 64]; ``''``, ``none`` or ``0`` -> [] (skip that mode)."""
    text = text.strip().lower()
    if text in ("", "none", "0", "off"):
        return []
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated peer counts, got {text!r}"
        ) from None
    if any(n < 2 for n in out):
        raise argparse.ArgumentTypeError(
            f"every N must be >= 2 (a victim and an observer), got {text!r}"
        )
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = c.parser(__doc__)
    p.add_argument(
        "--inprocess",
        type=sizes,
        default=None,
        metavar="N,N,...",
        help="cohort sizes for the in-process runs (default 16,64,256,1000; '' or none: skip)",
    )
    p.add_argument(
        "--no-floor", dest="floor", action="store_false",
        help="skip the compute floor beside each in-process row (the same training in one "
             "process with no runtime: bench/_local_worker.py --experiment)",
    )
    p.add_argument(
        "--forked",
        type=sizes,
        default=None,
        metavar="N,N,...",
        help="cohort sizes for hfl-launch, a process per peer (default 64,200; '' or none: skip)",
    )
    p.add_argument(
        "--sim",
        type=sizes,
        default=None,
        metavar="N,N,...",
        help="cohort sizes on the deterministic simulator, virtual time (default none; --quick: 8)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"cohort.rounds (default 10; --quick: 4; --sim runs at least {SIM_MIN_ROUNDS})",
    )
    p.add_argument(
        "--kill-after",
        type=int,
        default=None,
        help="kill the victim once every peer finished this round (default 3; --quick: 2)",
    )
    p.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds per run before it is stopped"
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a value of the experiment file, as hfl-launch --set does "
        "(repeatable), e.g. --set defaults.timing.membership=swim",
    )
    p.add_argument(
        "--max-partitions",
        type=int,
        default=64,
        help="split the data into at most this many parts; peer i takes part i mod this",
    )
    p.add_argument("--label", default="current", help="the series' name in the JSON and the plot")
    p.add_argument(
        "--merge",
        type=Path,
        action="append",
        default=[],
        metavar="FILE.json",
        help="add the rows of an earlier run's JSON (e.g. --label before) to the table and plot",
    )
    p.add_argument(
        "--plot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="save a figure of every metric against N (default on)",
    )
    p.add_argument(
        "--plot-out",
        type=Path,
        default=None,
        help="figure path (default runs/bench/scale.png, scale-<label>.png for another label)",
    )
    p.add_argument(
        "--hfl-src",
        type=Path,
        default=None,
        metavar="DIR",
        help="import hfl from this checkout (e.g. a git worktree of an older commit)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.inprocess = [16, 32] if args.inprocess is None else args.inprocess
        args.forked = [8] if args.forked is None else args.forked
        args.sim = [8] if args.sim is None else args.sim
        args.rounds = 4 if args.rounds is None else args.rounds
        args.kill_after = 2 if args.kill_after is None else args.kill_after
    args.inprocess = [16, 64, 256, 1000] if args.inprocess is None else args.inprocess
    args.forked = [64, 200] if args.forked is None else args.forked
    args.sim = [] if args.sim is None else args.sim
    args.rounds = 10 if args.rounds is None else args.rounds
    args.kill_after = 3 if args.kill_after is None else args.kill_after
    if args.rounds < 2:
        p.error(f"--rounds must be >= 2, got {args.rounds}")
    if not 1 <= args.kill_after < args.rounds:
        p.error(
            f"--kill-after must be in [1, --rounds - 1] = [1, {args.rounds - 1}], got {args.kill_after}"
        )
    if args.timeout <= 0:
        p.error("--timeout must be > 0")
    if args.max_partitions < 1:
        p.error("--max-partitions must be >= 1")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.label):
        p.error(f"--label: letters, digits, '_', '.', '-' only, got {args.label!r}")
    for s in args.sets:
        key = s.partition("=")[0].strip()
        if "=" not in s or not key:
            p.error(f"--set {s!r}: expected KEY=VALUE")
        if key in ("peers", "run_dir"):
            p.error(
                f"--set {key}=...: the script sets {key} itself (--inprocess/--forked/--sim "
                "choose N)"
            )
    for m in args.merge:
        if not m.is_file():
            p.error(f"--merge {m}: no such file")
    if args.hfl_src is not None:
        args.hfl_src = args.hfl_src.resolve()
        if (
            not (args.hfl_src / "peer" / "__init__.py").is_file()
            or not (args.hfl_src / "launch").is_dir()
        ):
            p.error(f"--hfl-src {args.hfl_src}: not an hfl checkout (no peer/__init__.py, launch/)")
    if not args.inprocess and not args.forked and not args.sim and not args.merge:
        p.error("nothing to run: --inprocess, --forked and --sim are all empty")
    return args


# --------------------------------------------------------------------------- hfl from a checkout


def boot_env(hfl_src: Path | None) -> dict[str, str]:
    """Environment under which every Python process imports hfl from ``hfl_src``.

    A ``sitecustomize.py`` on PYTHONPATH runs in every interpreter this script starts
    and every one they start (hfl-launch's forkserver template, ``hfl-peer``), after
    site-packages' .pth files installed the editable finder; it calls
    ``_scale_worker.use_hfl_from``, which swaps that finder for one over ``hfl_src``."""
    if hfl_src is None:
        return {}
    boot = SCALE_DIR / "_boot"
    boot.mkdir(parents=True, exist_ok=True)
    (boot / "sitecustomize.py").write_text(
        "# Written by bench/scale.py --hfl-src: import hfl from $HFL_SCALE_SRC in this process.\n"
        "import os\n"
        "if os.environ.get('HFL_SCALE_SRC'):\n"
        "    import importlib.util as _util\n"
        f"    _spec = _util.spec_from_file_location('_hfl_scale_boot', {str(WORKER)!r})\n"
        "    _boot = _util.module_from_spec(_spec)\n"
        "    import sys as _sys\n"
        "    _sys.modules['_hfl_scale_boot'] = _boot  # its dataclasses look themselves up there\n"
        "    _spec.loader.exec_module(_boot)\n"
        "    _boot.use_hfl_from(os.environ['HFL_SCALE_SRC'])\n"
    )
    path = os.pathsep.join([str(boot), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"PYTHONPATH": path, "HFL_SCALE_SRC": str(hfl_src)}


def hfl_location(env: dict[str, str]) -> str:
    """Where a child process started with ``env`` imports hfl from (checked, not assumed)."""
    probe = "import os, hfl.peer; print(os.path.dirname(os.path.dirname(hfl.peer.__file__)))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, **env},
        cwd=c.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise SystemExit(f"scale.py: cannot import hfl in a child process:\n{out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


def commit_of(path: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


# --------------------------------------------------------------------------- the experiment


def experiment_file(
    mode: str, n: int, args: argparse.Namespace
) -> tuple[Path, Path, list[str], list[str]]:
    """Write the run's experiment file: (file, run dir, peer ids, notes).

    The quickstart with ``peers``, ``run_dir``, ``cohort.rounds`` set, then the user's
    ``--set`` overrides applied as hfl-launch applies them, then the shared partitions."""
    from hfl.launch.experiment import ExperimentConfig
    from hfl.peer.configtools import apply_overrides, build, load_yaml

    run_dir = SCALE_DIR / f"{args.label}-{mode}-n{n}"
    ours = [
        f"peers={n}",
        "name=scale",
        f"run_dir={run_dir}",
        f"defaults.cohort.rounds={args.rounds}",
        # the launcher stops its peers itself shortly before this script would
        f"timeout_s={max(30.0, args.timeout - 45):g}",
    ]
    if mode == "inprocess":
        ours.append("defaults.security.mode=none")  # in_memory() drops it anyway: no key files
    data = apply_overrides(apply_overrides(load_yaml(c.QUICKSTART), ours), args.sets)
    small = build(ExperimentConfig, {**data, "peers": 2, "peer_overrides": {}})
    ids = dataclasses.replace(small, peers=n).peer_ids()  # (past the schema's cap on peers too)
    notes = share_partitions(data, ids, args.max_partitions)
    path = SCALE_DIR / f"{run_dir.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, run_dir, ids, notes


def share_partitions(data: dict[str, Any], ids: list[str], k: int) -> list[str]:
    """Above ``k`` peers, split the data ``k`` ways and give peer i part i mod k (in place)."""
    section = data.setdefault("defaults", {}).setdefault("data", {})
    partition = section.get("partition", "iid")
    if len(ids) <= k or partition not in ("iid", "dirichlet") or "num_partitions" in section:
        return []
    section["num_partitions"] = k
    over = data.setdefault("peer_overrides", {}) or {}
    data["peer_overrides"] = over
    for i, pid in enumerate(ids):
        if i >= k:
            over.setdefault(pid, {}).setdefault("data", {})["partition_index"] = i % k
    return [f"data split {k} ways ({partition}); peer i holds part i mod {k}"]


def check_sets(args: argparse.Namespace) -> None:
    """Fail now, not N runs later, on a --set the experiment or a peer config refuses."""
    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.configtools import ConfigError

    saved = args.label
    with tempfile.TemporaryDirectory() as tmp:
        try:
            args.label = "_check"
            path, _, _, _ = experiment_file("inprocess", 2, args)
            exp = load_experiment(str(path), [f"run_dir={tmp}"])
            expand(exp, gpus=[], ports=[1, 2])
        except ConfigError as err:
            raise SystemExit(f"scale.py: invalid --set: {err}") from None
        finally:
            args.label = saved
            for f in SCALE_DIR.glob("_check-*"):
                f.unlink()


def fresh(run_dir: Path) -> None:
    if run_dir.exists():
        assert SCALE_DIR in run_dir.resolve().parents, run_dir
        shutil.rmtree(run_dir)


def read_metrics(run_dir: Path, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for pid in ids:
        path = run_dir / pid / "metrics.jsonl"
        out[pid] = [r for r in c.read_jsonl(path) if isinstance(r, dict)] if path.exists() else []
    return out


def progress_note(run_dir: Path, ids: list[str], rounds: int) -> str:
    """How far a run that did not finish got, from its metrics files (the victim,
    ``ids[-1]``, left out)."""
    last = [w.max_round(recs) for recs in read_metrics(run_dir, ids[:-1]).values()]
    if not last:
        return "no metrics"
    return (
        f"rounds reached by the peers but the victim: min {min(last)}, max {max(last)} of "
        f"{rounds}; {sum(1 for x in last if x > 0)}/{len(last)} finished a round"
    )


def new_row(args: argparse.Namespace, mode: str, n: int) -> dict[str, Any]:
    return {"label": args.label, "mode": mode, "n": n, "status": "", "ok": False, "notes": []}


def others(contention: dict[str, float]) -> str:
    return c.fmt(c.others_share(contention), "{:.0%}")


def begin_run(
    mode: str, n: int, args: argparse.Namespace
) -> tuple[dict[str, Any], tuple[Path, Path, list[str], Path] | None]:
    """The run's row, and its experiment file written and run dir cleared: (row, (file,
    run dir, peer ids, log)), or (row, None): a --set this hfl refuses, the row says so."""
    row = new_row(args, mode, n)
    try:
        path, run_dir, ids, notes = experiment_file(mode, n, args)
    except ValueError as err:  # ConfigError: e.g. a --set this hfl refuses
        row["status"] = f"failed: {err}"
        return row, None
    row["notes"] += notes
    fresh(run_dir)
    return row, (path, run_dir, ids, LOG_DIR / f"scale-{run_dir.name}.log")


def worker_files(run_dir: Path) -> tuple[Path, Path]:
    """(result, spec) paths of a worker run (in-process or sim); an old result is removed."""
    result_path = SCALE_DIR / f"{run_dir.name}.result.json"
    result_path.unlink(missing_ok=True)
    return result_path, SCALE_DIR / f"{run_dir.name}.spec.json"


def run_worker(
    cmd: list[str],
    result_path: Path,
    run_dir: Path,
    log: Path,
    row: dict[str, Any],
    args: argparse.Namespace,
    env: dict[str, str],
    contention: bool = False,
) -> tuple[dict[str, Any] | None, bool]:
    """Run a worker process under the timeout: (its result or None, whether it failed:
    then the row's status says how). ``contention``: measure others' CPU meanwhile."""
    busy = c.Contention() if contention else None
    rc, wall, out = c.run_cmd(cmd, args.timeout, log, env)
    if busy is not None:
        row["contention"] = busy.stop()
    row.update(wall_s=wall, exit_status=rc, run_dir=str(run_dir), log=str(log))
    res = json.loads(result_path.read_text()) if result_path.exists() else None
    failed = rc != 0 or res is None or bool(res.get("partial"))
    if failed:
        row["status"] = (
            f"did not finish in {args.timeout:.0f} s"
            if rc == 124
            else f"failed: {last_error(out) or f'exit status {rc}'}"
        )
    return res, failed


def result_columns(res: dict[str, Any], n: int) -> dict[str, Any]:
    """The table's columns from a worker's result (in-process or sim)."""
    return {
        "s_per_round": res.get("mean_round_s"),
        "rounds_span_s": res.get("rounds_span_s"),
        "membership_msgs_per_peer_s": res.get("membership_msgs_per_peer_s"),
        "msgs_per_peer_s": res.get("msgs_per_peer_s"),
        "bytes_per_peer_round": res.get("bytes_per_peer_round"),
        "membership_bytes_per_peer_round": res.get("membership_bytes_per_peer_round"),
        "peak_mb": res.get("peak_rss_mb"),
        "detect_median_s": res.get("detect_median_s"),
        "detect_max_s": res.get("detect_max_s"),
        "full_cohort": f"{res.get('full_cohort_peers')}/{n}",
        "acc": res.get("final_acc"),
        "completed": res.get("completed_all_rounds"),
    }


def outcome_notes(res: dict[str, Any], expected: tuple[str, ...]) -> list[str]:
    """A note per outcome of the result's peers other than the ``expected`` ones."""
    bad = {k: v for k, v in (res.get("outcomes") or {}).items() if k not in expected}
    return [f"{', '.join(map(str, v))}: {k}" for k, v in bad.items()]


def note_survivors(row: dict[str, Any], n: int) -> None:
    """An ok row whose survivors did not all do every round says how many did."""
    if row["ok"] and row.get("completed", 0) < n - 1:
        row["status"] = f"{row['completed']}/{n - 1} survivors did every round"


# --------------------------------------------------------------------------- in-process


def run_inprocess(n: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    row, prepared = begin_run("inprocess", n, args)
    if prepared is None:
        return row
    path, run_dir, ids, log = prepared
    result_path, spec_path = worker_files(run_dir)
    spec_path.write_text(
        json.dumps(
            {
                "experiment": str(path),
                "kill_after": args.kill_after,
                "out": str(result_path),
                "hfl_src": str(args.hfl_src) if args.hfl_src else None,
            }
        )
    )
    print(f"\n[in-process N={n}] {_rel(path)} -> {_rel(run_dir)} (log {_rel(log)})", flush=True)
    cmd = [sys.executable, str(WORKER), str(spec_path)]
    res, failed = run_worker(cmd, result_path, run_dir, log, row, args, env, contention=True)
    if failed:
        row["notes"].append(progress_note(run_dir, ids, args.rounds))
        if res is None:
            return row
        row["notes"].append(
            f"numbers as of {res['wall_s']:.0f} s into the run (the worker's last progress line)"
        )
    row["worker"] = res
    row.update(ok=not res.get("partial"), status=row["status"] or "ok", **result_columns(res, n))
    if args.floor:
        row["floor_s_per_round"] = compute_floor(path, args, env, log)
    row["notes"] += res.get("notes", [])
    note_survivors(row, n)
    row["notes"] += detection_notes(res)
    row["notes"] += outcome_notes(res, expected=("ok", "killed (victim)"))
    return row


def compute_floor(path: Path, args: argparse.Namespace, env: dict[str, str],
                  log: Path) -> float | None:
    """Seconds per round of the same cohort's training with no runtime at all, in one
    process (bench/_local_worker.py --experiment: every peer trains, one FedAvg
    average, every peer absorbs and evaluates as often as a peer does), or None."""
    out = SCALE_DIR / f"{path.stem}.floor.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(HERE / "_local_worker.py"), "--experiment", str(path),
           "--rounds", str(args.rounds), "--out", str(out)]
    print(f"  compute floor: {' '.join(cmd[1:])}", flush=True)
    rc, _wall, _out = c.run_cmd(cmd, args.timeout, log.with_suffix(".floor.log"), env)
    if rc != 0 or not out.exists():
        print(f"  compute floor failed (exit {rc}); see {_rel(log.with_suffix('.floor.log'))}")
        return None
    return float(json.loads(out.read_text())["s_per_round"])


def detection_notes(res: dict[str, Any]) -> list[str]:
    notes = []
    if res.get("no_kill"):
        notes.append(f"nobody killed: {res['no_kill']}")
    elif res.get("observers"):
        notes.append(
            f"{res.get('detected')}/{res['observers']} survivors saw {res.get('victim')} dead; "
            f"{res.get('never_detected', 0)} finished first"
        )
    if res.get("false_suspicions") or res.get("false_deaths"):
        notes.append(
            f"false suspicions {res.get('false_suspicions')}, false deaths "
            f"{res.get('false_deaths')} (live peers marked suspect/dead: an overloaded "
            f"loop or detector)"
        )
    if res.get("slow_ticks"):
        notes.append(f"{res['slow_ticks']} ticks cut off at their limit (slow_tick notes)")
    if res.get("gc_full_collections"):
        notes.append(f"{res['gc_full_collections']} full garbage collections paused the loop "
                     f"{res['gc_full_pause_s']:.2f} s in all, {res['gc_full_pause_max_s']:.2f} s "
                     "at most")
    if res.get("victim_tasks_left"):
        notes.append(
            f"tasks of the killed peer still running 1 s later: {res['victim_tasks_left'][:5]}"
        )
    return notes


def last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Exit)\b", line) or line.startswith("hfl-launch:"):
            return line[:300]
    return lines[-1][:300] if lines else ""


# --------------------------------------------------------------------------- forked


def _status_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _pss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class Cohort:
    """What this script follows of a running hfl-launch, from the files each peer
    writes: its metrics lines (its last round), its pid (its ``started`` note in
    events.jsonl: the runtime says it, nothing is walked for it) and, read from /proc
    while it runs, its peak memory."""

    def __init__(self, run_dir: Path, ids: list[str]):
        from hfl.launch.results import JsonlTail

        self.ids = ids
        self.metrics = {p: JsonlTail(run_dir / p / "metrics.jsonl") for p in ids}
        self.events = {p: JsonlTail(run_dir / p / "events.jsonl") for p in ids}
        self.last_round = dict.fromkeys(ids, 0)
        self.pids: dict[str, int] = {}
        self.hwm_kb: dict[str, int] = {}
        self.peak_pss_kb = 0
        self._next_scan = self._next_pss = 0.0

    def poll(self, below: int | None = None) -> None:
        """Read new metrics lines (with ``below``: only of peers whose last round is below
        it, and nothing else: the wait for the kill must stay cheap, for on 2 cores 200
        peers leave this script a 1 % share), pids not yet known (every 2 s), peak RSS
        (VmHWM: a high-water mark, never missed), now and then PSS."""
        for peer, tail in self.metrics.items():
            if below is None or self.last_round[peer] < below:
                for rec in tail.read():
                    with contextlib.suppress(TypeError, ValueError):
                        self.last_round[peer] = max(self.last_round[peer], int(rec.get("round", 0)))
        now = time.monotonic()
        if len(self.pids) < len(self.ids) and now >= self._next_scan:
            self.find_pids()
            self._next_scan = now + (10.0 if below is not None else 2.0)
        if below is not None:  # before the kill: the rounds and pids only
            return
        for peer, pid in self.pids.items():
            kb = _status_kb(pid, "VmHWM")
            if kb:
                self.hwm_kb[peer] = max(self.hwm_kb.get(peer, 0), kb)
        if self.pids and now >= self._next_pss:
            self.peak_pss_kb = max(
                self.peak_pss_kb, sum(_pss_kb(p) or 0 for p in self.pids.values())
            )
            self._next_pss = now + PSS_EVERY_S

    def find_pids(self) -> None:
        """Each peer's pid, from the ``started`` note of its latest life."""
        for peer, tail in self.events.items():
            for rec in tail.read():
                if rec.get("kind") == "started" and isinstance(rec.get("pid"), int):
                    self.pids[peer] = rec["pid"]

    def all_reached(self, r: int) -> bool:
        return all(v >= r for v in self.last_round.values())


def run_forked(n: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    row, prepared = begin_run("forked", n, args)
    if prepared is None:
        return row
    path, run_dir, ids, log = prepared
    victim = ids[-1]
    cmd = [
        sys.executable,
        "-m",
        "hfl.launch.cli",
        str(path),
        "--run-dir",
        str(run_dir),
        "--fresh",
        "--quiet",
    ]
    print(
        f"\n[forked N={n}] $ {' '.join(c._short(x) for x in cmd[1:])} (log {_rel(log)})", flush=True
    )
    log.parent.mkdir(parents=True, exist_ok=True)
    subreaper = c.become_subreaper()
    busy = c.Contention()
    t0 = time.monotonic()
    t_kill: float | None = None  # unix time of the SIGKILL
    kill_tried = False
    no_kill = f"not every peer finished round {args.kill_after} before the run ended"
    timed_out = False
    running_at_kill: list[str] = []
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=c.ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
        cohort = Cohort(run_dir, ids)
        try:
            next_full = 0.0
            while proc.poll() is None:
                now = time.monotonic()
                if now - t0 > args.timeout:
                    timed_out = True
                    break
                if not kill_tried:  # until the kill, only the rounds (cheap)
                    cohort.poll(below=args.kill_after)
                elif now >= next_full:
                    cohort.poll()
                    next_full = now + POLL_S
                if not kill_tried and cohort.all_reached(args.kill_after):
                    kill_tried = True
                    if victim not in cohort.pids:
                        cohort.find_pids()
                    pid = cohort.pids.get(victim)
                    cohort.poll(below=args.rounds)  # the victim's own last round, now
                    if cohort.last_round[victim] >= args.rounds:
                        no_kill = (
                            f"{victim} had done every round before the kill could land "
                            "(rounds too short to kill from outside; try more --rounds)"
                        )
                    elif pid is None or not _alive(pid):
                        no_kill = f"{victim}'s process not found (or already ended)"
                    else:
                        kb = _status_kb(pid, "VmHWM")  # its peak, before it is gone
                        if kb:
                            cohort.hwm_kb[victim] = max(cohort.hwm_kb.get(victim, 0), kb)
                        os.kill(pid, signal.SIGKILL)
                        t_kill = time.time()
                        row["victim_last_round_at_kill"] = cohort.last_round[victim]
                        running_at_kill = [
                            p for p, q in cohort.pids.items() if p != victim and _alive(q)
                        ]
                time.sleep(POLL_S if kill_tried else KILL_POLL_S)
        finally:
            if proc.poll() is None:  # timed out or interrupted: let the launcher stop its peers
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                for pid in cohort.pids.values():
                    if _alive(pid):
                        os.kill(pid, signal.SIGKILL)
            proc.wait()
            cohort.poll()
            left = c.reap_orphans(15.0) if subreaper else []
    row["contention"] = busy.stop()
    if left:
        row["notes"].append(f"killed {len(left)} process(es) left running after hfl-launch ended")
    rc = proc.returncode
    row.update(
        wall_s=time.monotonic() - t0,
        exit_status=rc,
        run_dir=str(run_dir),
        log=str(log),
        victim=victim,
    )
    results_path = run_dir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    failures = [f for f in results.get("failures", []) if not f.startswith(f"{victim} ")]
    if timed_out:
        row["status"] = f"did not finish in {args.timeout:.0f} s"
        row["notes"].append(progress_note(run_dir, ids, args.rounds))
    elif rc not in (0, 1) or failures or not results:
        why = (
            failures[0]
            if failures
            else last_error(log.read_text(errors="replace")) or f"exit status {rc}"
        )
        row["status"] = f"failed: {why}"
        row["notes"].append(progress_note(run_dir, ids, args.rounds))
        # what the peers measured is still worth a row
    else:
        row.update(ok=True, status="ok")
    row.update(forked_measures(run_dir, ids, victim, t_kill, running_at_kill, args))
    row["no_kill"] = None if t_kill else no_kill
    row["peak_mb"] = sum(cohort.hwm_kb.values()) / 1024 if cohort.hwm_kb else None
    row["peak_pss_mb"] = cohort.peak_pss_kb / 1024 if cohort.peak_pss_kb else None
    row["peers_seen_in_proc"] = len(cohort.hwm_kb)
    note_survivors(row, n)
    row["notes"] += detection_notes(row)
    return row


def forked_measures(
    run_dir: Path,
    ids: list[str],
    victim: str,
    t_kill: float | None,
    running_at_kill: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    n = len(ids)
    stats = w.round_stats(read_metrics(run_dir, ids), args.rounds, n)
    out: dict[str, Any] = {
        "rounds_span_s": stats.span,
        "s_per_round": stats.mean_round_s,
        "acc": stats.final_acc,
        "full_cohort": f"{stats.full_cohort}/{n}",
        "full_cohort_peers": stats.full_cohort,
        "completed": stats.completed,
    }
    observers = running_at_kill or [p for p in ids if p != victim]
    out.update(t_kill_unix=t_kill, **w.from_events(
        {p: run_dir / p for p in ids}, victim, t_kill, observers if t_kill else [], args.rounds,
        None))
    return out


# --------------------------------------------------------------------------- sim


def sim_timing(sets: list[str]) -> dict[str, float]:
    """The scenario's timing: :data:`SIM_TIMING`, where a ``--set defaults.timing.KEY=V``
    of one of its keys wins (the scenario's timing replaces the peers' own)."""
    timing = dict(SIM_TIMING)
    for s in sets:
        key, _, value = s.partition("=")
        name = key.strip().removeprefix("defaults.timing.")
        if key.strip().startswith("defaults.timing.") and name in timing:
            try:
                timing[name] = float(yaml.safe_load(value))
            except (TypeError, ValueError):
                pass  # the experiment's own check refuses it
    return timing


def run_sim(n: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    row, prepared = begin_run("sim", n, args)
    row["others_cpu"] = "n/a"  # virtual time: others' CPU moves the wall seconds only
    if prepared is None:
        return row
    path, run_dir, ids, log = prepared
    result_path, spec_path = worker_files(run_dir)
    spec = {
        "experiment": str(path),
        "peers": n,
        "rounds": max(SIM_MIN_ROUNDS, args.rounds),
        "sets": args.sets,
        "keep": str(run_dir),
        "seed": SIM_SEED,
        "kill_at_s": SIM_KILL_AT_S,
        "down_s": SIM_DOWN_S,
        "timing": sim_timing(args.sets),
        "expected_victim": ids[-1],
        "out": str(result_path),
    }
    spec_path.write_text(json.dumps(spec, indent=2))
    print(
        f"\n[sim N={n}] {spec['rounds']} rounds, {ids[-1]} SIGKILLed at virtual "
        f"t={SIM_KILL_AT_S:g}s, restarted {SIM_DOWN_S:g}s later -> {_rel(run_dir)} "
        f"(log {_rel(log)})",
        flush=True,
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), SIM_WORKER_ARG, str(spec_path)]
    res, failed = run_worker(cmd, result_path, run_dir, log, row, args, env)
    if failed:
        return row
    row["sim"] = res
    row.update(
        ok=True,
        status="ok",
        **result_columns(res, n),
        victim=res.get("victim"),
        violations=len(res.get("violations", [])),
    )
    if res.get("victim") != ids[-1]:
        row["notes"].append(f"the simulator's last peer is {res.get('victim')}, not {ids[-1]}")
    viol = res.get("violations", [])
    row["notes"].append(
        f"virtual time: simulated {res['simulated_s']:.1f} s in {res['sim_wall_s']:.1f} s of wall; "
        f"{len(viol)} invariant violation(s)" + (f": {'; '.join(viol[:3])}" if viol else "")
    )
    if viol:
        row.update(ok=False, status=f"{len(viol)} invariant violation(s)")
    elif res.get("completed_all_rounds", 0) < n:
        row["status"] = f"{res['completed_all_rounds']}/{n} peers did every round"
    if res.get("victim_last_round_at_kill") is not None and res["victim_last_round_at_kill"] < 1:
        row["notes"].append(f"{res['victim']} was killed before it finished a round")
    row["notes"].append(
        f"{res.get('detected')}/{res.get('observers')} survivors saw {res.get('victim')} dead "
        f"before its restart at virtual t={res['restart_at_s']:g}s"
        + (f"; not: {', '.join(res['never_detected_ids'])}" if res.get("never_detected") else "")
    )
    row["notes"] += detection_notes({**res, "observers": 0})  # false suspicions, slow ticks
    row["notes"] += outcome_notes(res, expected=("ok",))
    return row


def sim_worker(spec_path: Path) -> int:
    """One --sim run (this script as ``scale.py _sim-worker SPEC.json``): run the seed,
    then write the numbers (from the peers' notes) to spec["out"]."""
    import resource

    from hfl.launch import sim

    t0 = time.monotonic()
    spec = json.loads(spec_path.read_text())
    n, rounds = int(spec["peers"]), int(spec["rounds"])
    keep = Path(spec["keep"])
    keep.mkdir(parents=True, exist_ok=True)
    # run_seed's working copy (a mkdtemp) goes under the run dir: a run stopped by the
    # timeout leaves it there, where the next run of this N deletes it, not in /tmp.
    scratch = keep / "tmp"
    scratch.mkdir()
    tempfile.tempdir = str(scratch)
    opts = sim.SimOptions(
        experiment=spec["experiment"],
        overrides=list(spec["sets"]),
        peers=n,
        rounds=rounds,
        keep=keep,
    )
    try:  # the ids run_seed gives its peers: its own expansion of the experiment
        with tempfile.TemporaryDirectory() as tmp:
            ids = [p.id for p in sim._configs(opts, Path(tmp))[1]]
    except AttributeError:  # (a simulator without _configs)
        ids = []
    victim = ids[-1] if ids else spec["expected_victim"]
    kill_at, down = float(spec["kill_at_s"]), float(spec["down_s"])
    restart_at = kill_at + down
    scenario = sim.Scenario(
        seed=int(spec["seed"]),
        network=sim.NetworkFaults(),
        timing=dict(spec["timing"]),
        faults=[sim.Fault(kill_at, "crash", (victim,), down)],
        calm_at=restart_at + 1.0,
    )
    print(f"{n} peers on the simulator; victim {victim}; {scenario.describe()}", flush=True)
    import torch  # noqa: F401 - (imported by the peers anyway: rss_growth_mb is the run's own)

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = sim.run_seed(int(spec["seed"]), opts, scenario)
    shutil.rmtree(scratch, ignore_errors=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kept = Path(res.run_dir)
    ids = ids or sorted(res.outcomes)

    # Virtual rounds span: the first peer's "started" (its first round begins) to the
    # last "round" event (a round's end), from the simulator's checker events.
    events = json.loads((kept / "events.json").read_text())
    starts = [e["t"] for e in events if e["event"] == "started"]
    ends = [e["t"] for e in events if e["event"] == "round"]
    span = max(ends) - min(starts) if starts and ends else None
    victim_rounds = [
        e["round"]
        for e in events
        if e["event"] == "round" and e["peer"] == victim and e["t"] <= kill_at
    ]
    stats = w.round_stats(read_metrics(kept, ids), rounds, n, timed=False)

    # Detection before the restart, and traffic, on the notes' virtual time (vt).
    observers = [p for p in ids if p != victim]
    notes = w.from_events({p: kept / p for p in ids}, victim, kill_at, observers, rounds,
                          res.simulated_s, until=restart_at, clock="vt")
    outcomes: dict[str, list[str]] = {}
    for pid, what in sorted(res.outcomes.items()):
        outcomes.setdefault(what, []).append(pid)
    out = {
        "n": n,
        "rounds": rounds,
        "seed": res.seed,
        "victim": victim,
        "kill_at_s": kill_at,
        "restart_at_s": restart_at,
        "timing": scenario.timing,
        "simulated_s": res.simulated_s,
        "sim_wall_s": res.wall_s,
        "worker_wall_s": time.monotonic() - t0,
        "violations": [str(v) for v in res.violations],
        "history": res.history,
        "network_counts": res.counts,
        "delivered": res.delivered,
        "rounds_span_s": span,
        "rounds_span_from_s": min(starts) if starts else None,
        "mean_round_s": stats.mean_round_s,
        "peak_rss_mb": rss / 1024,
        "rss_growth_mb": (rss - rss0) / 1024,
        "final_acc": stats.final_acc,
        "completed_all_rounds": stats.completed,
        "full_cohort_peers": stats.full_cohort,
        "victim_last_round_at_kill": max(victim_rounds, default=0),
        **notes,
        "outcomes": w.clip_outcomes(outcomes),
        "kept": str(kept),
    }
    tmp = Path(spec["out"] + ".tmp")
    tmp.write_text(json.dumps(out, indent=2, default=str) + "\n")
    tmp.replace(spec["out"])
    print(
        f"done: simulated {res.simulated_s:.1f} s in {res.wall_s:.1f} s; detection "
        f"{notes['detected']}/{len(observers)}; {len(res.violations)} violation(s)",
        flush=True,
    )
    return 0


# --------------------------------------------------------------------------- output


def _rel(path: Path) -> str:
    return c._rel(Path(path))


def table_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for r in rows:
        r = {
            **r,
            "others_cpu": others(r.get("contention", {}))
            if "contention" in r
            else r.get("others_cpu"),
        }
        status = str(r.get("status", ""))
        cells = []
        for key, _, _ in COLUMNS:
            v = r.get(key)
            if key == "status" and len(status) > 40:
                v = status[:37] + "..."
            cells.append(math.nan if v is None else v)
        out.append(cells)
    return out


def load_merged(paths: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        data = json.loads(path.read_text())
        for r in data.get("rows", []):
            if r.get("merged_from"):
                continue  # only the file's own rows, not what it merged itself
            rows.append({**r, "merged_from": str(path)})
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no plot (matplotlib: {exc})"
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault((r["label"], r["mode"]), []).append(r)
    labels = list(dict.fromkeys(r["label"] for r in rows))
    colors = {lab: f"C{i}" for i, lab in enumerate(labels)}
    cols = 5
    nrows = math.ceil(len(PANELS) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    from matplotlib.ticker import NullFormatter, NullLocator, ScalarFormatter

    ns = sorted({r["n"] for r in rows})
    for ax, (key, title, logy) in zip(axes.flat, PANELS, strict=False):
        ys = []
        for (label, mode), rs in series.items():
            pts = sorted(
                (r["n"], r[key])
                for r in rs
                if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])
            )
            if not pts:
                continue
            ys += [y for _, y in pts]
            marker, style, name = MODE_STYLES.get(mode, ("x", "-.", mode))
            ax.plot(
                [x for x, _ in pts],
                [y for _, y in pts],
                marker=marker,
                linestyle=style,
                color=colors[label],
                label=f"{label}, {name}",
            )
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ns))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        positive = [y for y in ys if y > 0]
        if logy and positive and max(positive) / min(positive) > 20:
            ax.set_yscale("log")  # quadratic growth reads as a slope
        elif ys:
            ax.set_ylim(bottom=min(0.0, min(ys)))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("peers (N)")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.axis("off")
    handles, names = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in names:
                handles.append(h)
                names.append(lab)
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), frameon=False)
    fig.suptitle("hfl at scale: examples/quickstart.yaml, one victim killed (bench/scale.py)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    suffix = "" if args.label == "current" else f"-{args.label}"
    json_path = c.out_path(f"scale{suffix}", args.out)
    plot_path = args.plot_out or c.OUT_DIR / f"scale{suffix}.png"
    env = boot_env(args.hfl_src)
    source = args.hfl_src or c.ROOT
    where = hfl_location(env)
    if args.hfl_src is not None and Path(where).resolve() != args.hfl_src:
        raise SystemExit(
            f"scale.py: --hfl-src {args.hfl_src}: child processes import hfl from {where}"
        )
    if args.hfl_src is None:
        check_sets(args)  # (an older checkout may refuse or accept other keys: its runs say so)
    SCALE_DIR.mkdir(parents=True, exist_ok=True)
    print(
        f"scale: label {args.label!r}, hfl from {where} (commit {commit_of(source) or 'unknown'}); "
        f"in-process N={args.inprocess or '-'}, forked N={args.forked or '-'}, "
        f"sim N={args.sim or '-'}; {args.rounds} rounds, "
        f"kill after round {args.kill_after}; timeout {args.timeout:.0f}s per run; sets {args.sets}"
    )

    rows: list[dict[str, Any]] = []
    for n in args.inprocess:
        rows.append(run_inprocess(n, args, env))
        print(f"  -> {rows[-1]['status']}", flush=True)
    for n in args.forked:
        rows.append(run_forked(n, args, env))
        print(f"  -> {rows[-1]['status']}", flush=True)
    for n in args.sim:
        try:
            rows.append(run_sim(n, args, env))
        except Exception as exc:  # noqa: BLE001 - a failure is a row, not a lost table
            rows.append(
                {**new_row(args, "sim", n), "status": f"failed: {type(exc).__name__}: {exc}"}
            )
        print(f"  -> {rows[-1]['status']}", flush=True)

    merged = load_merged(args.merge)
    shown = merged + rows
    print()
    print(c.table([h for _, h, _ in COLUMNS], table_rows(shown), [f for _, _, f in COLUMNS]))
    print(
        "\ns/round: mean round_time_s; messages and bytes from the peers' sent notes: rates per "
        "peer per second from round 1's end to the last round's end, bytes per peer per round "
        "over the whole run; membership = every message type but knowledge, aggregate, ack, commit, "
        "seed_request, seed_chunk, error; peak MB: in-process the worker's max RSS, forked the "
        "sum of the peers' peak RSS; detect: kill -> a survivor's '<victim> -> dead'; full "
        "cohort: peers whose live_peers reached N; acc: final mean global_acc (else test_acc). "
        "sim rows: virtual seconds (training 0.5 s a call), rates over virtual time, "
        "peak MB the worker's max RSS, detection "
        "before the victim's restart; wall s is real time."
    )
    for r in shown:
        tag = f"{r['label']} {r['mode']} N={r['n']}"
        if len(str(r.get("status", ""))) > 40:
            print(f"  {tag}: {r['status']}")
        for note in r.get("notes", []):
            print(f"  {tag}: {note}")
        share = c.others_share(r.get("contention", {}))
        if not math.isnan(share) and share > 0.1:
            print(f"  {tag}: {c.contention_note('timings', r['contention'])}")
    c.write_json(
        json_path,
        {
            "benchmark": "scale",
            "label": args.label,
            "hfl_src": str(source),
            "hfl_imported_from": where,
            "commit": commit_of(source),
            "inputs": {
                "inprocess": args.inprocess,
                "forked": args.forked,
                "sim": args.sim,
                "sim_settings": {
                    "seed": SIM_SEED,
                    "rounds": max(SIM_MIN_ROUNDS, args.rounds),
                    "kill_at_s": SIM_KILL_AT_S,
                    "down_s": SIM_DOWN_S,
                    "timing": sim_timing(args.sets),
                }
                if args.sim
                else None,
                "rounds": args.rounds,
                "kill_after": args.kill_after,
                "timeout_s": args.timeout,
                "sets": args.sets,
                "max_partitions": args.max_partitions,
                "quick": args.quick,
                "merged": [str(m) for m in args.merge],
            },
            "rows": [
                {
                    **r,
                    "others_cpu": r["others_cpu"]
                    if "others_cpu" in r
                    else others(r.get("contention", {})),
                }
                for r in rows
            ]
            + merged,
        },
    )
    if args.plot:
        problem = plot(shown, plot_path)
        print(problem or f"plot: {_rel(plot_path)}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == SIM_WORKER_ARG:
        sys.exit(sim_worker(Path(sys.argv[2])))
    sys.exit(main())
