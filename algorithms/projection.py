"""Gradient projection for conflicting teaching signals (FedH2L, Li et al.).

FedH2L's global step uses the peers' teaching gradient ``g_pub`` only in a
direction that does not undo local learning: it solves the QP of the paper's
eq. (8),

    minimise_z  1/2 ||g_pub - z||^2   subject to  <z, r_k> >= 0  for every k,

where the r_k are reference gradients (FedH2L: the one local gradient g_loc, or
with several local batches their mean gradient or, as an option, the parameter
change). Its Lagrangian dual (the
paper's eqs. 12-15) is

    minimise_{v >= 0}  1/2 v^T (R R^T) v + (R g_pub)^T v,   z* = g_pub + R^T v*,

a K-variable problem however many parameters the model has.

- :func:`project` — one reference: the exact closed form
  v* = max(0, -<g_pub, r> / ||r||^2). O(P), no solver.
- :func:`project_many` — several references: the dual QP solved with cvxpy on
  the K x K Gram matrix, then mapped back.
- :func:`pcgrad` — the PCGrad alternative (Yu et al., NeurIPS 2020) that the
  paper's ablation compares against: each gradient is projected onto the
  normal plane of the other when they conflict, and the two are summed.

FedIN's gradient alleviation (Chan et al., eqs. 10-13) is the same problem
with one reference: minimise ||G_IN - Z||^2 subject to <Z, G_local> >= 0 has
the closed form Z = G_IN - (b / a) G_local when b = <G_local, G_IN> < 0
(a = ||G_local||^2), else Z = G_IN — :func:`project` with g = G_IN and
r = G_local; ``hfl.algorithms.fedin`` calls it, as ``hfl.algorithms.fedh2l``
does. :func:`flat_grads` and :func:`write_grads` move a list of parameters'
gradients to and from the flat (P,) vectors both work on.
"""

from __future__ import annotations

import numpy as np
import torch


def project(g: torch.Tensor, r: torch.Tensor, eps: float = 1e-20) -> tuple[torch.Tensor, bool]:
    """Closest vector to ``g`` (L2) with ``<z, r> >= 0``. Returns (z, projected?).

    ``g`` and ``r`` are flat (P,) tensors. A zero ``r`` constrains nothing. Where
    ``||r||^2 <= eps`` (a gradient that has all but vanished) or overflows, it is
    computed on ``r`` scaled to a largest entry of 1, which constrains the same and
    neither underflows nor overflows:
    before, such an ``r`` counted as zero, and the result could break the constraint
    (a review: ``r = -1e-15 g`` gave ``<z, r> < 0``).
    """
    dot, norm2 = torch.dot(g, r), torch.dot(r, r)
    if norm2 <= eps or torch.isinf(norm2):  # (overflowed: r = -1e20 g in float32, a review)
        scale = r.abs().max()
        if scale == 0:
            return g, False
        if torch.isfinite(scale):  # (an inf or NaN entry: left to propagate, as before)
            r = r / scale
            dot, norm2 = torch.dot(g, r), torch.dot(r, r)
    if dot >= 0:
        return g, False
    return g - (dot / norm2) * r, True  # v* = -dot / ||r||^2 > 0


def project_many(
    g: torch.Tensor, refs: torch.Tensor, solver: str | None = "CLARABEL"
) -> tuple[torch.Tensor, bool]:
    """Closest vector to ``g`` with ``<z, r_k> >= 0`` for every row r_k of ``refs`` (K, P).

    Solves the dual QP with cvxpy (eq. 15 generalised to K constraints). If
    ``g`` already satisfies every constraint it is returned unchanged. The
    default solver is Clarabel (interior point, bundled with cvxpy): its
    tolerances keep the constraints satisfied to ~1e-8, where OSQP's defaults
    leave violations of ~1e-5.

    The QP is solved on unit vectors: ``g`` and each reference divided by its norm
    (the same constraints, the projection scaled by ``||g||``; a zero reference
    constrains nothing). The solver's tolerances are absolute, so on the raw
    gradients, whose Gram matrix shrinks with the square of their norm, a problem
    of norm 1e-4 came back with 6 % of error and one of 1e-6 with 98 % (a review:
    too much of ``g`` removed, though feasible).
    """
    import cvxpy as cp

    if refs.ndim != 2 or refs.shape[1] != g.shape[0]:
        raise ValueError(f"refs must be (K, {g.shape[0]}); got {tuple(refs.shape)}")
    dots = refs @ g  # (K,)
    if bool((dots >= 0).all()):
        return g, False
    R = refs.detach().double().cpu().numpy()
    g_np = g.detach().double().cpu().numpy()
    norms = np.linalg.norm(R, axis=1)
    R = R[norms > 0] / norms[norms > 0, None]
    g_norm = np.linalg.norm(g_np)
    gram = R @ R.T  # (K, K)
    q = R @ (g_np / g_norm)
    # Gram matrices of nearly parallel gradients are only positive semi-definite
    # in floating point: a tiny ridge keeps the solver's convexity check happy.
    gram = 0.5 * (gram + gram.T) + 1e-10 * np.trace(gram) / len(gram) * np.eye(len(gram))
    v = cp.Variable(len(q))
    problem = cp.Problem(cp.Minimize(0.5 * cp.quad_form(v, cp.psd_wrap(gram)) + q @ v), [v >= 0])
    problem.solve(solver=solver)
    if v.value is None:
        raise RuntimeError(f"projection QP failed: {problem.status}")
    step = g_norm * (R.T @ np.maximum(v.value, 0.0))  # z = ||g|| (g/||g|| + R^T v)
    return g + torch.as_tensor(step, dtype=g.dtype, device=g.device), True


def pcgrad(g_pub: torch.Tensor, g_loc: torch.Tensor) -> torch.Tensor:
    """PCGrad for two tasks: mutually project away the conflict, then sum."""
    a, _ = project(g_pub, g_loc)
    b, _ = project(g_loc, g_pub)
    return a + b


def flatten(tensors) -> torch.Tensor:
    """Concatenate tensors into one flat (P,) vector."""
    return torch.cat([t.reshape(-1) for t in tensors])


def flat_grads(params) -> torch.Tensor:
    """The parameters' ``.grad`` as one flat (P,) vector (zeros where a parameter has none)."""
    return flatten(p.grad if p.grad is not None else torch.zeros_like(p) for p in params)


def write_grads(params, g: torch.Tensor) -> None:
    """Set each parameter's ``.grad`` to its slice of the flat (P,) vector ``g``."""
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = g[offset : offset + n].view_as(p).clone()
        offset += n
    if offset != g.numel():
        raise ValueError(f"gradient has {g.numel()} entries, the parameters {offset}")
