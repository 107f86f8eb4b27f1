"""Accuracy and loss over rounds, as PNG files (matplotlib, headless Agg backend).

:func:`plot_run` draws one run: a line per peer and the cohort mean (thick), for
each metric the peers report (accuracy on the shared global test set, on each
peer's own test split, and the training loss), into ``<run_dir>/plots/``. When
the peers' architectures differ, the legend names each one's (``p0 (resnet18)``).
More than :data:`MANY_PEERS` peers are drawn as their mean, the band of the middle
half of the peers (25th-75th percentile) and a lighter 10th-90th percentile band
(and each architecture's mean), not a line each. A peer restarted (a new
incarnation) is marked where it came back (x), a peer that stopped before the
cohort's last round where it stopped (v). One peer alone has no "cohort mean".
:func:`plot_compare` draws several runs' cohort means in one figure (``hfl-report``);
:func:`plot_seeds` each seed's cohort mean and their mean ± std (``--seeds``).
Optional TensorBoard scalars: :func:`write_tensorboard` when ``tensorboard`` (or
torch's ``SummaryWriter``) is importable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hfl.launch.results import read_metrics, read_summary

# (metrics key, axis label, file stem), in the order drawn
METRICS = [
    ("global_acc", "accuracy on the shared test set", "global_acc"),
    ("test_acc", "accuracy on the peer's own test split", "test_acc"),
    ("train_loss", "training loss", "train_loss"),
]
MANY_PEERS = 8  # more peers than this: their mean and min-max band, not a line each


def per_round(records: list[dict[str, Any]], key: str) -> dict[int, float]:
    """round -> value (a restarted peer's repeated round: its last value)."""
    return {int(r["round"]): float(r[key]) for r in records
            if isinstance(r.get(key), (int, float)) and "round" in r}


def cohort_mean(series: list[dict[int, float]]) -> dict[int, float]:
    """The peers' mean per round, over the peers that reported that round."""
    rounds = sorted(set().union(*series)) if series else []
    out = {}
    for r in rounds:
        vals = [s[r] for s in series if r in s]
        out[r] = sum(vals) / len(vals)
    return out


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display needed; set before pyplot is imported
    import matplotlib.pyplot as plt

    return plt


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of ``values``, linearly interpolated."""
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo = int(k)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (k - lo)


def life_events(records: list[dict[str, Any]], last_round: int) -> list[tuple[int, str]]:
    """(round, "restarted" | "stopped") of one peer's metrics records: the first round
    of each new incarnation, and its last round when that is before ``last_round``."""
    events, incarnation = [], None
    for r in records:
        inc = r.get("incarnation")
        if incarnation is not None and isinstance(inc, int) and inc > incarnation:
            events.append((int(r["round"]), "restarted"))
        incarnation = inc if isinstance(inc, int) else incarnation
    rounds = [int(r["round"]) for r in records if "round" in r]
    if rounds and max(rounds) < last_round:
        events.append((max(rounds), "stopped"))
    return events


def draw_cohort(ax, series: dict[str, dict[int, float]], archs: dict[str, str],
                events: dict[str, list[tuple[int, str]]] | None = None) -> None:
    """Each peer's ``series`` (round -> value) and the cohort mean on ``ax``. ``archs``
    (peer -> architecture, given when they differ) names each peer's in the legend.
    Over MANY_PEERS peers: the mean, the 25-75 and 10-90 percentile bands of the peers
    in each round, and with ``archs`` each architecture's mean (up to MANY_PEERS of
    them). ``events`` (peer -> life_events) are marked on the peer's values."""
    mean = cohort_mean(list(series.values()))
    if len(series) <= MANY_PEERS:
        for pid, s in series.items():
            label = f"{pid} ({archs[pid]})" if pid in archs else pid
            ax.plot(list(s), list(s.values()), lw=1, alpha=0.6, label=label)
    else:
        rounds = list(mean)
        values = [[s[r] for s in series.values() if r in s] for r in rounds]
        for lo_q, hi_q, alpha in ((10, 90, 0.15), (25, 75, 0.35)):
            ax.fill_between(rounds, [percentile(v, lo_q) for v in values],
                            [percentile(v, hi_q) for v in values], color="grey", alpha=alpha,
                            lw=0, label=f"{lo_q}th-{hi_q}th percentile of {len(series)} peers")
        kinds = sorted({archs[pid] for pid in series if pid in archs})
        for arch in kinds if len(kinds) <= MANY_PEERS else []:  # not a line per random_mlp
            group = [s for pid, s in series.items() if archs.get(pid) == arch]
            m = cohort_mean(group)
            ax.plot(list(m), list(m.values()), lw=1.5, label=f"{arch} mean ({len(group)} peers)")
    if len(series) > 1:  # one peer alone: its line is all there is
        ax.plot(list(mean), list(mean.values()), lw=2.5, color="black", label="cohort mean")
    marks = {"restarted": ("x", "restarted"), "stopped": ("v", "stopped early")}
    labelled = set()
    for pid, evs in (events or {}).items():
        for round_, kind in evs:
            if round_ not in series.get(pid, {}):
                continue
            marker, text = marks[kind]
            ax.plot([round_], [series[pid][round_]], marker=marker, color="red", ms=7, ls="none",
                    label=f"peer {text}" if kind not in labelled else None)
            labelled.add(kind)


def plot_run(run_dir: Path, peers: list[tuple[str, Path]]) -> list[Path]:
    """One PNG per metric some peer reports; returns the files written."""
    records = {pid: read_metrics(d) for pid, d in peers}
    last = max((int(r["round"]) for recs in records.values() for r in recs if "round" in r),
               default=0)
    events = {pid: life_events(recs, last) for pid, recs in records.items()}
    archs = {pid: str(a) for pid, d in peers if (a := read_summary(d).get("arch"))}
    archs = archs if len(set(archs.values())) > 1 else {}  # named only where they differ
    out_dir = Path(run_dir) / "plots"
    written = []
    for key, label, stem in METRICS:
        series = {pid: per_round(recs, key) for pid, recs in records.items()}
        series = {pid: s for pid, s in series.items() if s}
        if not series:
            continue
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7, 4.2))
        draw_cohort(ax, series, archs, events)
        written.append(_save(plt, fig, ax, label, f"{Path(run_dir).name}: {label}",
                             out_dir / f"{stem}.png"))
    write_tensorboard(run_dir, records)
    return written


def _cohort_means(runs: dict[Any, dict[str, list[dict[str, Any]]]], key: str) -> dict[Any, dict[int, float]]:
    """Each run's (run label -> {peer id -> metrics records}) cohort mean of ``key``."""
    means = {}
    for name, peers in runs.items():
        series = [s for s in (per_round(recs, key) for recs in peers.values()) if s]
        if series:
            means[name] = cohort_mean(series)
    return means


def _metric_figures(runs: dict[Any, dict[str, list[dict[str, Any]]]]):
    """Per metric some run reports: (label, file stem, each run's cohort mean, pyplot,
    a fresh figure and its axes)."""
    for key, label, stem in METRICS:
        means = _cohort_means(runs, key)
        if means:
            plt = _pyplot()
            fig, ax = plt.subplots(figsize=(7, 4.2))
            yield label, stem, means, plt, fig, ax


def _save(plt, fig, ax, ylabel: str, title: str, path: Path) -> Path:
    """Axes labelled and titled, the figure written to ``path`` and closed."""
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_compare(runs: dict[str, dict[str, list[dict[str, Any]]]], out: Path) -> list[Path]:
    """``runs``: run label -> {peer id -> metrics records}. One PNG per metric: each
    run's cohort mean over rounds. ``out`` is the file stem (``<out>_<metric>.png``)."""
    written = []
    for label, stem, means, plt, fig, ax in _metric_figures(runs):
        for name, mean in means.items():
            ax.plot(list(mean), list(mean.values()), lw=2, label=name)
        title = (f"{' vs '.join(means)}: {label}" if len(means) <= 4 else
                 f"{len(means)} runs: {label}")
        written.append(_save(plt, fig, ax, f"{label} (cohort mean)", title,
                             Path(f"{out}_{stem}.png")))
    return written


def plot_seeds(base: Path, runs: dict[int, dict[str, list[dict[str, Any]]]]) -> list[Path]:
    """``--seeds``: per metric, each seed's cohort mean (thin) and the mean over seeds
    with a ± one standard deviation band (thick), into ``<base>/plots/seeds_<metric>.png``."""
    import statistics

    written = []
    for label, stem, means, plt, fig, ax in _metric_figures(runs):
        for seed, mean in means.items():
            ax.plot(list(mean), list(mean.values()), lw=1, alpha=0.6, label=f"seed {seed}")
        rounds = sorted(set().union(*means.values()))
        per = [[m[r] for m in means.values() if r in m] for r in rounds]
        mu = [statistics.mean(v) for v in per]
        sd = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in per]
        ax.fill_between(rounds, [m - d for m, d in zip(mu, sd, strict=True)],
                        [m + d for m, d in zip(mu, sd, strict=True)], color="grey", alpha=0.3,
                        lw=0, label="± 1 std over seeds")
        ax.plot(rounds, mu, lw=2.5, color="black", label=f"mean over {len(means)} seeds")
        written.append(_save(plt, fig, ax, f"{label} (cohort mean)",
                             f"{Path(base).name}, seeds {', '.join(map(str, means))}: {label}",
                             Path(base) / "plots" / f"seeds_{stem}.png"))
    return written


def write_tensorboard(run_dir: Path, records: dict[str, list[dict[str, Any]]]) -> bool:
    """TensorBoard scalars under ``<run_dir>/tensorboard/<peer>`` if a writer is installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard is optional
        return False
    for pid, recs in records.items():
        if not recs:
            continue
        writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard" / pid))
        for key, _, _ in METRICS:
            for r, v in sorted(per_round(recs, key).items()):
                writer.add_scalar(key, v, r)
        writer.close()
    return True
