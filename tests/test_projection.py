"""FedH2L's projection (eq. 8) against independent oracles: cvxpy's primal QP on
random problems, the dual solution, and hand-computed cases."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import torch

from hfl.algorithms.projection import pcgrad, project, project_many


def primal(g: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """The QP exactly as the paper writes it, solved by cvxpy in P variables."""
    z = cp.Variable(g.shape[0])
    cp.Problem(cp.Minimize(0.5 * cp.sum_squares(g - z)), [refs @ z >= 0]).solve()
    return z.value


def test_hand_computed_cases():
    g, r = torch.tensor([1.0, -2.0]), torch.tensor([0.0, 1.0])
    z, projected = project(g, r)
    assert projected and torch.allclose(z, torch.tensor([1.0, 0.0]))  # drop the conflicting part
    z, projected = project(torch.tensor([1.0, 2.0]), r)
    assert not projected and torch.equal(z, torch.tensor([1.0, 2.0]))  # no conflict: unchanged
    z, projected = project(g, torch.zeros(2))
    assert not projected and torch.equal(z, g)  # a zero reference constrains nothing
    # v* = -<g,r>/||r||^2 = -(-3)/2 = 1.5 ; z = g + 1.5 r
    z, _ = project(torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 1.0]))
    assert torch.allclose(z, torch.tensor([0.5, -0.5]))


@pytest.mark.parametrize("seed", range(20))
def test_closed_form_matches_cvxpy_primal(seed):
    rng = np.random.default_rng(seed)
    p = int(rng.integers(2, 60))
    g, r = rng.normal(size=p), rng.normal(size=p)
    if g @ r > 0:
        g = -g  # make it a conflict half of the time at least
    z, _ = project(torch.tensor(g), torch.tensor(r))
    expected = primal(g, r[None, :])
    np.testing.assert_allclose(z.numpy(), expected, atol=1e-5)
    assert z.numpy() @ r >= -1e-9


@pytest.mark.parametrize("seed", range(10))
def test_dual_qp_with_several_references_matches_the_primal(seed):
    rng = np.random.default_rng(100 + seed)
    p, k = int(rng.integers(5, 40)), int(rng.integers(2, 5))
    refs, g = rng.normal(size=(k, p)), rng.normal(size=p)
    z, _ = project_many(torch.tensor(g), torch.tensor(refs))
    expected = primal(g, refs)
    np.testing.assert_allclose(z.numpy(), expected, atol=1e-4)
    assert (refs @ z.numpy() >= -1e-6).all()


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1e3])
def test_the_projection_is_as_exact_for_vanishing_gradients_as_for_unit_ones(scale):
    # The projection scales with its inputs: z(s g, s R) = s z(g, R), the right side from
    # cvxpy's primal at unit scale. On the raw gradients the solver's absolute tolerances
    # left 6 % of error at 1e-4 and 98 % at 1e-6 (a review).
    rng = np.random.default_rng(int(-np.log10(scale)) + 50)
    for _ in range(3):
        refs, g = rng.normal(size=(3, 30)), rng.normal(size=30)
        refs[1] *= 1e-3  # references of different norms constrain alike
        expected = primal(g, refs)
        z, projected = project_many(torch.tensor(g * scale), torch.tensor(refs * scale))
        if not projected:
            np.testing.assert_allclose(expected, g, atol=1e-6)  # (the primal agrees: no conflict)
            continue
        np.testing.assert_allclose(z.numpy() / scale, expected, atol=2e-5 * np.linalg.norm(g))
    z, _ = project_many(torch.tensor(g), torch.tensor(np.vstack([refs, np.zeros(30)])))
    np.testing.assert_allclose(z.numpy(), primal(g, refs), atol=1e-4)  # a zero row: nothing


def test_a_reference_that_has_all_but_vanished_still_constrains():
    # r = -1e-15 g: the closest z with <z, r> >= 0 is 0. Before, ||r||^2 under 1e-20
    # counted as a zero reference and g came back unprojected, breaking the constraint.
    g = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    for r in (-1e-15 * g, -1e-23 * g.float(), -1e20 * g.float()):  # (1e20: ||r||^2 overflows)
        z, projected = project(g.to(r.dtype), r)
        assert projected and torch.allclose(z, torch.zeros_like(z), atol=1e-6), z
        assert float(torch.dot(z, r)) >= 0 or float(z.abs().max()) < 1e-6


def test_dual_with_one_reference_equals_the_closed_form():
    rng = np.random.default_rng(7)
    g, r = torch.tensor(rng.normal(size=1000)), torch.tensor(rng.normal(size=1000))
    g = g - 2 * (torch.dot(g, r) / torch.dot(r, r)).clamp(min=0) * r  # ensure a conflict
    a, pa = project(g, r)
    b, pb = project_many(g, r[None, :])
    assert pa and pb
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_project_many_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"refs must be \(K, 3\)"):
        project_many(torch.zeros(3), torch.zeros(2, 4))


def test_pcgrad_removes_the_conflict_from_both_and_sums():
    g_pub, g_loc = torch.tensor([1.0, -1.0]), torch.tensor([0.0, 1.0])
    # g_pub loses its component along g_loc; g_loc loses its component along g_pub.
    expected = torch.tensor([1.0, 0.0]) + (g_loc - (-1.0 / 2.0) * g_pub)
    torch.testing.assert_close(pcgrad(g_pub, g_loc), expected)
