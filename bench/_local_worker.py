"""One peer's training with no runtime at all: the baseline of bench/overhead.py.

    python bench/_local_worker.py --config PEER.yaml --rounds R --out RESULT.json

Builds the peer's algorithm exactly as hfl-peer does (``build_algorithm(cfg)``:
same data partition, model, seed and torch thread count) and loops
``local_update(r)`` + ``evaluate()`` for R rounds: no transport, no event loop,
no membership, no checkpoints. With --barrier the workers start round 1
together (the parent releases them), so their rounds overlap as a cohort's do. Writes the same timestamps bench/overhead.py
reads from a federated peer's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

T_START = time.time()  # before the heavy imports, like a peer process's start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--barrier", help="touch BARRIER.<id>.ready when built, then wait for BARRIER.go"
    )
    args = p.parse_args()

    from hfl.peer.config import load_config
    from hfl.peer.factory import build_algorithm

    cfg = load_config(args.config)
    t_build = time.time()
    alg, _ = build_algorithm(cfg)
    t_ready = time.time()
    if args.barrier:  # start the rounds together, as a cohort does after its handshake
        Path(f"{args.barrier}.{cfg.node.id}.ready").touch()
        go = Path(f"{args.barrier}.go")
        deadline = time.monotonic() + 300
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.002)
    rounds = []
    for r in range(1, args.rounds + 1):
        wall, t0 = time.time(), time.perf_counter()
        metrics = dict(alg.local_update(r))
        t1 = time.perf_counter()
        metrics.update(alg.evaluate())
        t2 = time.perf_counter()
        rounds.append(
            {
                "round": r,
                "time": wall,
                "round_time_s": t2 - t0,
                "train_s": t1 - t0,
                "eval_s": t2 - t1,
                **{k: v for k, v in metrics.items() if isinstance(v, float)},
            }
        )
    t_end = time.time()
    with open(args.out, "w") as f:
        json.dump(
            {
                "peer": cfg.node.id,
                "process_start": T_START,
                "build_start": t_build,
                "ready": t_ready,
                "rounds_end": t_end,
                "rounds": rounds,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
