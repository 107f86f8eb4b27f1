"""Helpers shared by the benchmark scripts: paths, subprocesses, tables, JSON output.

Not a benchmark itself. Scripts import it as ``_common`` (``python bench/NAME.py``
puts ``bench/`` first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from hfl.launch.results import read_jsonl  # noqa: F401  (re-exported for the scripts)

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "runs" / "bench"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"

def parser(doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=(doc or "").strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="a smaller run (well under a minute)")
    p.add_argument(
        "--out", type=Path, default=None, help="results JSON (default: runs/bench/<script>.json)"
    )
    return p


def out_path(name: str, override: Path | None = None) -> Path:
    path = override or OUT_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def machine() -> dict[str, Any]:
    import importlib.metadata as md

    versions = {}
    for pkg in ("pyzmq", "msgpack", "numpy", "torch", "uvloop"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "packages": versions,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    payload = {
        "created": datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        **data,
    }
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    print(f"\nresults: {_rel(path)}")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return str(obj)


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- contention


def _machine_cpu_s() -> tuple[float, float] | None:
    """(busy, steal) CPU-seconds of the whole machine since boot, from /proc/stat (Linux)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    v = [int(x) for x in fields] + [0] * 10
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return (user + nice + system + irq + softirq) / hz, steal / hz


def _own_cpu_s() -> float:
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


class Contention:
    """CPU used by *other* processes while a measurement runs.

    Machine-wide busy time (/proc/stat) minus this process's and its waited-for
    descendants' CPU time (getrusage). Call ``stop()`` after every child of the
    measured phase has been waited for. On a shared box this is the number that
    says whether a timing can be trusted.
    """

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.m0 = _machine_cpu_s()
        self.o0 = _own_cpu_s()
        self.result: dict[str, float] = {}

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self.t0
        m1 = _machine_cpu_s()
        if self.m0 is None or m1 is None:
            self.result = {"wall_s": wall}
            return self.result
        own = _own_cpu_s() - self.o0
        others = max(0.0, (m1[0] - self.m0[0]) - own)
        cpus = os.cpu_count() or 1
        self.result = {
            "wall_s": wall,
            "own_cpu_s": own,
            "others_cpu_s": others,
            "steal_s": m1[1] - self.m0[1],
            "others_share": others / (wall * cpus) if wall > 0 else math.nan,
        }
        return self.result


def contention_note(label: str, result: dict[str, float], threshold: float = 0.1) -> str:
    """One line about other processes' CPU use during a phase (flags it above ``threshold``)."""
    share = result.get("others_share")
    if share is None:
        return f"{label}: contention unknown (no /proc/stat)"
    flag = (
        "  <-- other processes competed for the CPU: treat these timings with care"
        if share > threshold
        else ""
    )
    return (
        f"{label}: other processes used {result['others_cpu_s']:.1f} CPU-s "
        f"({share:.0%} of {os.cpu_count()} cores over {result['wall_s']:.1f}s){flag}"
    )


def others_share(result: dict[str, float]) -> float:
    return result.get("others_share", math.nan)


# --------------------------------------------------------------------------- subprocesses


def run_cmd(
    cmd: Sequence[str],
    timeout_s: float,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, float, str]:
    """Run ``cmd`` from the repo root with a hard timeout: (exit status, wall seconds, output).

    The output (stdout and stderr together) also goes to ``log_path`` if given.
    A command that runs past ``timeout_s`` is killed and reported with status 124.
    """
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            list(cmd),
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            timeout=timeout_s,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        rc, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        rc = 124
        out = (
            exc.stdout.decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else (exc.stdout or "")
        )
        out += f"\n[bench] killed after {timeout_s:.0f}s\n"
    wall = time.perf_counter() - t0
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(out)
    return rc, wall, out


_SUBREAPER: bool | None = None  # (launch: made one at its first call)


def launch(
    experiment: Path | str,
    run_dir: Path,
    overrides: Sequence[str],
    timeout_s: float,
    log_name: str,
    env: dict[str, str] | None = None,
    flags: Sequence[str] = (),
) -> tuple[int, float, str]:
    """``hfl-launch EXPERIMENT --run-dir RUN_DIR --fresh --quiet [FLAGS] --set ...`` as a
    subprocess (``env``: added to its environment, which its peers inherit).

    Its peers are accounted to this process: hfl-launch forks them from a template it
    never waits for, so without :func:`become_subreaper` their CPU never reached our
    RUSAGE_CHILDREN and :class:`Contention` counted the benchmark's own peers as other
    processes (a review: 81 % "others" on overhead.py's federated side, the launch's
    own CPU 2.6 s of 8.6). The orphans are waited for after the launch
    (:func:`reap_orphans`); what still runs 15 s after is killed and said."""
    global _SUBREAPER
    if _SUBREAPER is None:
        _SUBREAPER = become_subreaper()
    cmd = [
        sys.executable,
        "-m",
        "hfl.launch.cli",
        str(experiment),
        "--run-dir",
        str(run_dir),
        "--fresh",
        "--quiet",
        *flags,
    ]
    for o in overrides:
        cmd += ["--set", o]
    print("$ " + " ".join(_short(c) for c in cmd), flush=True)
    rc, wall, out = run_cmd(cmd, timeout_s, log_path=OUT_DIR / "logs" / f"{log_name}.log", env=env)
    left = reap_orphans() if _SUBREAPER else []
    if left:
        print(f"  killed {len(left)} process(es) left running after hfl-launch ended")
    if rc != 0:
        print(
            f"  hfl-launch exited with status {rc}; last lines:\n"
            + "\n".join(out.splitlines()[-15:])
        )
    return rc, wall, out


def _short(arg: str) -> str:
    arg = arg.replace(str(ROOT) + os.sep, "")
    return arg if re.fullmatch(r"[\w./=:,+-]+", arg) else repr(arg)


def events(peer_dir: Path, kind: str | None = None) -> list[dict]:
    """A peer's typed notes from its events.jsonl (docs/runtime.md, Typed events), oldest
    first; only those of ``kind`` if given."""
    return [e for e in read_jsonl(peer_dir / "events.jsonl") if kind is None or e.get("kind") == kind]


def join_timeouts(run_dir: Path) -> list[str]:
    """Peers that gave up waiting for the whole cohort at start-up and started with whoever
    had joined (their ``join_short`` notes in events.jsonl; see bench/README.md)."""
    return [f"{e['peer']}: {e['joined']} of {e['need']} joined"
            for f in sorted(run_dir.glob("*/events.jsonl")) for e in events(f.parent, "join_short")]


# --------------------------------------------------------------------------- numbers and tables


def mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.fmean(xs) if xs else math.nan


def pct_pm(values: Sequence[float], digits: int = 1) -> str:
    """Fractions as "mean ± std" in percent (std 0 for one value; "-" for none)."""
    if not values:
        return "-"
    s = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):5.{digits}f} ± {100 * s:3.{digits}f}"


def ratio(a: float, b: float) -> float:
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


def fmt(value: Any, spec: str = "{:.3f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, str):
        return value
    try:
        return spec.format(value)
    except (TypeError, ValueError):
        return str(value)


def table(
    header: Sequence[str], rows: Sequence[Sequence[Any]], specs: Sequence[str] | None = None
) -> str:
    """A Markdown table; ``specs`` gives one format per column (strings pass through)."""
    specs = list(specs or ["{}"] * len(header))
    body = [[fmt(v, s) for v, s in zip(row, specs, strict=True)] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)
    ]

    def line(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in body)])


# --------------------------------------------------------------------------- child processes


def process_tree() -> dict[int, list[int]]:
    """parent pid -> its children's pids, for every process (from /proc; Linux)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(root: int) -> list[int]:
    """Every process below ``root`` in the process tree."""
    tree = process_tree()
    out, todo = [], [root]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def become_subreaper() -> bool:
    """Orphans of our descendants become our children (hfl.launch.zygote's, the one the
    launcher uses). hfl-launch never waits for its forkserver template, which reaps the
    peers: without this their CPU time never reaches our RUSAGE_CHILDREN, and an
    "others' CPU" column would count the benchmark's own peers as other processes."""
    from hfl.launch.zygote import become_subreaper as adopt_orphans

    return adopt_orphans()


def reap_orphans(wait_s: float = 15.0) -> list[int]:
    """Wait for (and so account) the children left to us (a launch's template and
    peers, reparented here by :func:`become_subreaper`); SIGKILL what is still alive
    after ``wait_s``. Returns the pids killed."""
    import signal

    deadline = time.monotonic() + wait_s
    killed: list[int] = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return killed
        if pid:
            continue
        if time.monotonic() > deadline:
            for child in descendants(os.getpid()):
                if child not in killed:
                    try:
                        os.kill(child, signal.SIGKILL)
                        killed.append(child)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + 5.0
        time.sleep(0.1)
