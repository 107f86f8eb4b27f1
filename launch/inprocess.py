"""Many peers on one box: ``hfl-launch EXP --in-process``.

N real peers in one process and one event loop: each is what ``hfl-peer`` runs
(:func:`hfl.peer.runner.run_peer`: the same Node, membership, election, rounds,
checkpoints and metrics files), but they talk over the in-memory transport
(``mem://<id>``, frames copied as a network would) and share one torch, one
copy of the imported code and one thread pool for training. What a peer costs
is then its data, its model and its optimizer, not an interpreter: 50-200 peers
fit on a laptop. The results table, plots and ``hfl-report`` are the same.

Not here: process faults (a crash would end every peer: use the process mode),
transport security (nothing leaves the process). GPUs are spread over peers as
in the process mode, each peer naming its GPU as ``cuda:N`` of this process
(:func:`device_here`; all peers were on ``cuda:0``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import IO, Any

from hfl.launch.experiment import ExperimentConfig, PeerPlan
from hfl.launch.supervisor import LaunchOutcome, eta_text
from hfl.peer.configtools import ConfigError, build, to_dict

log = logging.getLogger("hfl.launch")


def in_memory(plans: list[PeerPlan]) -> list[PeerPlan]:
    """The plans with mem:// addresses (bootstraps as expanded) and no transport security."""
    from hfl.peer.config import PeerConfig

    ids = [p.id for p in plans]
    out = []
    for i, p in enumerate(plans):
        data = to_dict(p.config)
        boot = [f"mem://{ids[0]}"] if i > 0 else ([f"mem://{ids[1]}"] if len(ids) > 1 else [])
        data["node"].update(listen=f"mem://{p.id}", bootstrap=boot, advertise=None)
        if "security" in data:
            data["security"] = {"mode": "none"}
        gpu = p.env.get("CUDA_VISIBLE_DEVICES")
        if gpu:  # the GPU the launcher gave it, as a device of this one process
            data["node"]["device"] = device_here(gpu)
        cfg = build(PeerConfig, data)
        out.append(PeerPlan(p.id, p.index, cfg, p.config_path, p.env))
    return out


def device_here(gpu: str) -> str:
    """``cuda:N`` naming, in this process, the GPU ``gpu`` that the launcher gave a peer
    (for a process of its own it would be that process's CUDA_VISIBLE_DEVICES): its
    place in this process's CUDA_VISIBLE_DEVICES, or its index where that is not set."""
    from hfl.launch.experiment import visible_gpus

    visible = visible_gpus()
    if visible is not None and gpu in visible:
        return f"cuda:{visible.index(gpu)}"
    if visible is None and gpu.isdigit():
        return f"cuda:{int(gpu)}"
    raise ConfigError("devices", f"GPU {gpu!r} is not one this process sees by index "
                                 "(an in-process cohort names GPUs as cuda:N): set "
                                 "CUDA_VISIBLE_DEVICES to the GPUs to use, or devices: auto")


class Progress:
    """The progress line of peers in this process, from their metrics files followed as
    they grow (:class:`~hfl.launch.results.JsonlTail`: each line read once)."""

    def __init__(self, plans: list[PeerPlan], t0: float, rounds: int):
        from hfl.launch.results import JsonlTail, RoundProgress

        self.tails = [JsonlTail(Path(p.config.run_dir) / "metrics.jsonl") for p in plans]
        self.peers = [RoundProgress() for _ in plans]
        self.t0, self.rounds = t0, rounds

    def line(self) -> str:
        for tail, peer in zip(self.tails, self.peers, strict=True):
            peer.add(tail.read())
        done = min(p.last_round for p in self.peers)
        accs = [p.last.get("global_acc", p.last.get("test_acc")) for p in self.peers]
        accs = [a for a in accs if isinstance(a, (int, float))]
        mean = f" | mean acc {sum(accs) / len(accs):.3f} over {len(accs)}" if accs else ""
        spans = sum(p.rounds_timed for p in self.peers)
        eta = eta_text(sum(p.round_s for p in self.peers) / spans if spans else None,
                       self.rounds - done)
        return (f"[{time.monotonic() - self.t0:6.1f}s] round {done}/{self.rounds}{eta} | "
                f"{len(self.peers)} peers in one process{mean}")


def run_in_process(exp: ExperimentConfig, plans: list[PeerPlan], out: IO, progress: bool = True,
                   ) -> LaunchOutcome:
    """Run every peer of ``plans`` in this process until all end; never raises for a peer."""
    from hfl.peer.runner import run_peer, thawed_after
    from hfl.peer.status import CohortTooSmall
    from hfl.peer.transport import MemoryHub

    if exp.faults:
        raise ConfigError("faults", "process faults need a process per peer; drop --in-process "
                                    "or the faults")
    plans = in_memory(plans)
    run_dir = exp.resolved_run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(run_dir / "peers.log")  # every peer's lines, id first
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger("hfl")
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    t0 = time.monotonic()
    failures: list[str] = []
    events: list[dict[str, Any]] = []
    rounds = plans[0].config.cohort.rounds
    shown = Progress(plans, t0, rounds)

    async def main() -> list[Any]:
        hub = MemoryHub()
        # Every peer on this one loop: short method calls run on it (Node._compute_call).
        tasks = [asyncio.create_task(run_peer(p.config, hub=hub, freeze_heap=True,
                                              inline_short_calls=True), name=p.id)
                 for p in plans]

        async def show() -> None:
            line = ""
            # Reading every peer's metrics file costs the loop the peers share: once a
            # second up to 100 peers, less often above (every 10 s for 1,000).
            every = max(1.0, len(plans) / 100)
            while True:
                await asyncio.sleep(every)
                new = shown.line()
                if progress and new.split("]", 1)[1] != line:
                    out.write(new + "\n")
                    out.flush()
                    line = new.split("]", 1)[1]

        shower = asyncio.create_task(show(), name="progress")
        try:
            return await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            shower.cancel()
            await asyncio.gather(shower, return_exceptions=True)

    try:
        with thawed_after():  # each peer freezes its heap once built (freeze_heap)
            results = asyncio.run(main())
    except KeyboardInterrupt:
        failures.append("interrupted")
        results = []
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()
    why: dict[str, list[str]] = {}  # one line per distinct reason, not one per peer
    for p, r in zip(plans, results, strict=False):
        if isinstance(r, CohortTooSmall):
            why.setdefault("finished without its cohort", []).append(p.id)
        elif isinstance(r, BaseException):
            why.setdefault(f"failed: {type(r).__name__}: {r}", []).append(p.id)
        events.append({"t": round(time.monotonic() - t0, 3), "event": "exit", "peer": p.id,
                       "ok": not isinstance(r, BaseException)})
    for reason, ids in why.items():
        who = ids[0] if len(ids) == 1 else f"{ids[0]}..{ids[-1]} ({len(ids)} peers)"
        failures.append(f"{who} {reason}")
    if progress:
        out.write(shown.line() + "\n")
    return LaunchOutcome(ok=not failures, wall_time_s=time.monotonic() - t0, failures=failures,
                         events=events, peers={})
