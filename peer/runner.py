"""Wire a :class:`~hfl.peer.node.Node` from a config: the body of ``hfl-peer``.

Also used in-process by tests, with an in-memory or fault-injecting transport.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from hfl.peer.checkpoint import load_checkpoint, next_incarnation, save_checkpoint
from hfl.peer.config import PeerConfig
from hfl.peer.node import Node, NodeResult
from hfl.peer.seeds import SeedStore
from hfl.peer.transport import FaultPlan, FaultyTransport, MemoryHub, make_transport

log = logging.getLogger("hfl.peer")

METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "summary.json"

_SHOWN = ("train_loss", "test_acc", "global_acc")


class MetricsWriter:
    """One JSON line per round, flushed at once so a launcher can follow it."""

    def __init__(self, path: Path, rounds: int):
        self.path = path
        self.rounds = rounds

    def __call__(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=float) + "\n")
        shown = " ".join(f"{k}={record[k]:.4f}" for k in _SHOWN if k in record)
        log.info("%s round %d/%d %s round_time=%.2fs sent=%dB", record["peer"], record["round"],
                 self.rounds, shown, record["round_time_s"], record["bytes_sent"])


def _save(run_dir: Path, r: int, node: Node) -> None:
    import torch

    save_checkpoint(run_dir, {
        "round": r,
        "incarnation": node.incarnation,
        "algorithm": node.alg.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "members": [[m.peer_id, m.address] for m in node.membership.members.values()
                    if m.status != "left"],
    })


async def run_peer(
    cfg: PeerConfig,
    hub: MemoryHub | None = None,
    fault_plan: FaultPlan | None = None,
    clock=None,
) -> NodeResult:
    """Build this peer from ``cfg`` and run it to the cohort's last round."""
    import torch

    from hfl.peer.factory import build_algorithm

    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    algorithm, num_classes = build_algorithm(cfg)
    incarnation = next_incarnation(run_dir)
    start_round, members = 1, []
    state = load_checkpoint(run_dir) if cfg.node.resume else None
    if state is not None:
        algorithm.load_state_dict(state["algorithm"])
        torch.set_rng_state(state["torch_rng"])
        start_round = int(state["round"]) + 1
        members = [(str(p), str(a)) for p, a in state["members"]]
        log.info("%s: resumed from checkpoint after round %d (incarnation %d)",
                 cfg.node.id, start_round - 1, incarnation)
    elif cfg.node.resume is False and (run_dir / METRICS_NAME).exists():
        (run_dir / METRICS_NAME).unlink()

    seeds = None
    if algorithm.uses_public_seeds:
        public = algorithm.ctx.public
        own = (public.x, public.y) if public is not None and len(public) else None
        seeds = SeedStore(cfg.node.id, own, chunk_bytes=cfg.node.seed_chunk_bytes)
    transport = make_transport(cfg.node.id, cfg.node.listen, hub=hub)
    if fault_plan is not None:
        transport = FaultyTransport(transport, fault_plan)
    node = Node(
        peer_id=cfg.node.id, transport=transport, algorithm=algorithm, cohort=cfg.cohort,
        num_classes=num_classes, timing=cfg.timing, bootstrap=cfg.node.bootstrap,
        min_peers=cfg.node.min_peers, incarnation=incarnation, start_round=start_round,
        known_members=members, on_round=MetricsWriter(run_dir / METRICS_NAME, cfg.cohort.rounds),
        on_checkpoint=(lambda r, n: _save(run_dir, r, n)) if cfg.node.checkpoint else None,
        clock=clock, seed=cfg.node.seed, fault=cfg.fault, advertise=cfg.node.advertise,
        seeds=seeds,
    )
    result = await node.run()
    last = result.metrics[-1] if result.metrics else {}
    summary = {
        "peer": cfg.node.id, "arch": getattr(algorithm.model, "arch", cfg.model.arch),
        "incarnation": incarnation, "rounds": cfg.cohort.rounds,
        "last_round": result.last_round, "rounds_completed_this_run": result.rounds_completed,
        "wall_time_s": time.time() - started, "dropped": result.dropped,
        "final": {k: v for k, v in last.items() if isinstance(v, (int, float))},
    }
    (run_dir / SUMMARY_NAME).write_text(json.dumps(summary, indent=2, default=float))
    return result
