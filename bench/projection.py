"""Cost of FedH2L's gradient projection (eq. 8): the closed form vs cvxpy.

    python bench/projection.py [--quick]

For P parameters (10^4 .. 10^7) and one conflicting reference gradient, times
(1) the closed form (hfl.algorithms.projection.project), (2) the dual QP through
cvxpy (project_many: a K x K problem plus the Gram matrix), (3) the primal QP in
P variables through cvxpy (only while it is affordable), and prints each as a
multiple of the closed form. Median of several repeats, float32 on CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from hfl.algorithms.projection import project, project_many


def timed(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def primal(g: torch.Tensor, r: torch.Tensor) -> None:
    import cvxpy as cp

    z = cp.Variable(g.shape[0])
    gn, rn = g.double().numpy(), r.double().numpy()
    cp.Problem(cp.Minimize(0.5 * cp.sum_squares(gn - z)), [rn @ z >= 0]).solve()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sizes = [10**4, 10**5, 10**6] if args.quick else [10**4, 10**5, 10**6, 10**7]
    primal_max = 10**4 if args.quick else 10**5
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'P':>10} {'closed form':>12} {'cvxpy dual':>12} {'x closed':>9} {'cvxpy primal':>13} {'x closed':>9}")
    for p in sizes:
        g = torch.randn(p, generator=gen)
        r = torch.randn(p, generator=gen)
        g = g - 2 * (torch.dot(g, r) / torch.dot(r, r)).clamp(min=0) * r  # a real conflict
        repeats = 20 if p <= 10**6 else 5
        t_closed = timed(lambda g=g, r=r: project(g, r), repeats)
        t_dual = timed(lambda g=g, r=r: project_many(g, r[None, :]), max(3, repeats // 4))
        t_primal = timed(lambda g=g, r=r: primal(g, r), 1) if p <= primal_max else float("nan")
        rows.append({"P": p, "closed_s": t_closed, "dual_s": t_dual, "primal_s": t_primal})
        primal_s = f"{t_primal * 1e3:10.1f} ms" if t_primal == t_primal else f"{'(skipped)':>13}"
        primal_x = f"{t_primal / t_closed:8.0f}x" if t_primal == t_primal else f"{'-':>9}"
        print(f"{p:>10} {t_closed * 1e3:9.3f} ms {t_dual * 1e3:9.2f} ms {t_dual / t_closed:8.1f}x "
              f"{primal_s} {primal_x}")
    out = Path("runs/bench")
    out.mkdir(parents=True, exist_ok=True)
    (out / "projection.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
