"""Accuracy and loss over rounds, as PNG files (matplotlib, headless Agg backend).

:func:`plot_run` draws one run: a line per peer and the cohort mean (thick), for
each metric the peers report (accuracy on the shared global test set, on each
peer's own test split, and the training loss), into ``<run_dir>/plots/``. When
the peers' architectures differ, the legend names each one's (``p0 (resnet18)``).
More than :data:`MANY_PEERS` peers are drawn as their mean and a min-max band
(and each architecture's mean), not a line each.
:func:`plot_compare` draws several runs' cohort means in one figure (``hfl-report``).
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


def draw_cohort(ax, series: dict[str, dict[int, float]], archs: dict[str, str]) -> None:
    """Each peer's ``series`` (round -> value) and the cohort mean on ``ax``. ``archs``
    (peer -> architecture, given when they differ) names each peer's in the legend.
    Over MANY_PEERS peers: the mean, the band from the lowest to the highest peer in
    each round, and with ``archs`` each architecture's mean (up to MANY_PEERS of them)."""
    mean = cohort_mean(list(series.values()))
    if len(series) <= MANY_PEERS:
        for pid, s in series.items():
            label = f"{pid} ({archs[pid]})" if pid in archs else pid
            ax.plot(list(s), list(s.values()), lw=1, alpha=0.6, label=label)
    else:
        rounds = list(mean)
        lo = [min(s[r] for s in series.values() if r in s) for r in rounds]
        hi = [max(s[r] for s in series.values() if r in s) for r in rounds]
        ax.fill_between(rounds, lo, hi, color="grey", alpha=0.3, lw=0,
                        label=f"min-max of {len(series)} peers")
        kinds = sorted({archs[pid] for pid in series if pid in archs})
        for arch in kinds if len(kinds) <= MANY_PEERS else []:  # not a line per random_mlp
            group = [s for pid, s in series.items() if archs.get(pid) == arch]
            m = cohort_mean(group)
            ax.plot(list(m), list(m.values()), lw=1.5, label=f"{arch} mean ({len(group)} peers)")
    ax.plot(list(mean), list(mean.values()), lw=2.5, color="black", label="cohort mean")


def plot_run(run_dir: Path, peers: list[tuple[str, Path]]) -> list[Path]:
    """One PNG per metric some peer reports; returns the files written."""
    records = {pid: read_metrics(d) for pid, d in peers}
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
        draw_cohort(ax, series, archs)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.set_title(f"{Path(run_dir).name}: {label}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    write_tensorboard(run_dir, records)
    return written


def plot_compare(runs: dict[str, dict[str, list[dict[str, Any]]]], out: Path) -> list[Path]:
    """``runs``: run label -> {peer id -> metrics records}. One PNG per metric: each
    run's cohort mean over rounds. ``out`` is the file stem (``<out>_<metric>.png``)."""
    written = []
    for key, label, stem in METRICS:
        means = {}
        for name, peers in runs.items():
            series = [s for s in (per_round(recs, key) for recs in peers.values()) if s]
            if series:
                means[name] = cohort_mean(series)
        if not means:
            continue
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, mean in means.items():
            ax.plot(list(mean), list(mean.values()), lw=2, label=name)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("round")
        ax.set_ylabel(f"{label} (cohort mean)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = Path(f"{out}_{stem}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
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
