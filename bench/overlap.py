"""What ``cohort.overlap`` buys: FedH2L rounds with and without it, under link latency.

    python bench/overlap.py [--rounds 60] [--latency-ms 0 50] [--repeats 2] [--quick]

examples/rotated_mnist.yaml's 4 peers (LeNet, real MNIST digits), run as
``hfl-launch --in-process`` runs them (one process, the in-memory transport), with
every knowledge message held back ``--latency-ms`` on the way (a FaultPlan delay:
peers on distant machines) and with ``cohort.overlap`` off and on, alternating, each
setting ``--repeats`` times (evaluation at half-time and at the end). Printed per
run: the median over the peers of their mean round time in the run's second half
(metrics.jsonl ``round_time_s`` over ``span``; the first half includes the join) and
the peers' mean selected accuracy. With the option a peer takes its next local
step while its knowledge travels, so at a latency above a local step's time a round
should shorten by about one local step; with no latency and the cores already busy
(4 peers on 2 cores) there is nothing to hide. Results: runs/bench/overlap.json.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, out_path, parser, write_json  # noqa: E402


def run(rounds: int, latency_s: float, overlap: bool) -> dict:
    from hfl.launch.experiment import expand, load_experiment
    from hfl.launch.inprocess import in_memory
    from hfl.peer.runner import run_peer
    from hfl.peer.transport import FaultPlan, MemoryHub

    with tempfile.TemporaryDirectory() as tmp:
        exp = load_experiment(str(ROOT / "examples" / "rotated_mnist.yaml"), [
            f"defaults.cohort.rounds={rounds}", f"defaults.cohort.overlap={str(overlap).lower()}",
            f"defaults.node.evaluate_every={rounds // 2}", "defaults.node.checkpoint=false",
            f"run_dir={tmp}"])
        plans = in_memory(expand(exp, gpus=[], ports=list(range(20000, 20000 + exp.peers))))
        plan = (FaultPlan(seed=0, delay=1.0, delay_s=(latency_s, latency_s),
                          only_types=frozenset({"knowledge"})) if latency_s else None)

        async def main():
            hub = MemoryHub()
            return await asyncio.gather(*(run_peer(p.config, hub=hub, fault_plan=plan)
                                          for p in plans))

        results = asyncio.run(main())
    # each peer's second metrics line: the rounds of the run's second half (the first
    # half's line includes the join), their time summed
    times = [r.metrics[-1]["round_time_s"] / r.metrics[-1].get("span", 1) for r in results]
    return {"latency_ms": 1e3 * latency_s, "overlap": overlap, "round_s": statistics.median(times),
            "sel_acc": statistics.fmean(r.metrics[-1]["sel_acc"] for r in results)}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 50.0])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.repeats = 8, 1
    rows = []
    for latency in args.latency_ms:
        for _ in range(args.repeats):
            for overlap in (False, True):
                rows.append(run(args.rounds, latency / 1e3, overlap))
                row = rows[-1]
                print(f"latency {row['latency_ms']:.0f} ms, overlap {'on ' if overlap else 'off'}: "
                      f"{1e3 * row['round_s']:.1f} ms a round (median), "
                      f"sel_acc {row['sel_acc']:.4f}", flush=True)
    write_json(out_path("overlap", args.out), {"rounds": args.rounds, "rows": rows})


if __name__ == "__main__":
    main()
