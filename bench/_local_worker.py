"""One peer's training with no runtime at all: the baseline of bench/overhead.py.

    python bench/_local_worker.py --config PEER.yaml --rounds R --out RESULT.json
    python bench/_local_worker.py --experiment EXP.yaml [--set K=V ...] --rounds R --out RESULT.json

With --experiment: the floor of bench/startup.py, a whole FedAvg cohort in this one
process with no runtime (each peer's algorithm built as hfl-peer builds it, from the
experiment expanded as hfl-launch expands it; every round each peer trains, the
first aggregates everyone's weights and every peer absorbs that average; every peer
evaluates as often as a peer would, ``node.evaluate_every``). Its timestamps: process
start, round 1's start, end; and seconds per round (bench/scale.py's compute floor).

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


def cohort(experiment: str, sets: list[str], rounds: int, out: str) -> None:
    """The floor: every peer of ``experiment`` trained with FedAvg in this process."""
    import tempfile

    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.factory import build_algorithm

    with tempfile.TemporaryDirectory() as tmp:
        exp = load_experiment(experiment, [*sets, f"run_dir={tmp}", "defaults.security.mode=none"])
        plans = expand(exp, gpus=[], ports=list(range(21000, 21000 + exp.peers)))
    algs = [build_algorithm(p.config)[0] for p in plans]
    every = plans[0].config.node.evaluate_every
    t_round1 = time.time()
    accs: list = []
    for r in range(1, rounds + 1):
        shared = {}
        for plan, alg in zip(plans, algs, strict=True):
            alg.local_update(r)
            shared[plan.id] = alg.share(r)
        result = algs[0].aggregate(r, shared)
        for alg in algs:
            alg.absorb(r, {plans[0].id: result})
        if r % every == 0 or r == rounds:  # as a peer evaluates (node.evaluate_every)
            accs = [alg.evaluate().get("global_acc") for alg in algs]
    end = time.time()
    with open(out, "w") as f:
        json.dump({"process_start": T_START, "round1_start": t_round1, "end": end,
                   "s_per_round": (end - t_round1) / rounds, "peers": len(algs),
                   "rounds": rounds, "global_acc": accs}, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--experiment", help="the floor: a whole FedAvg cohort in this process")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--config")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--barrier", help="touch BARRIER.<id>.ready when built, then wait for BARRIER.go"
    )
    args = p.parse_args()
    if args.experiment:
        cohort(args.experiment, args.sets, args.rounds, args.out)
        return
    if not args.config:
        p.error("--config or --experiment")

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
