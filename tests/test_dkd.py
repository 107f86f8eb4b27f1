"""DKD (algorithms/dkd.py) against hand-computed values and against Zhao et
al.'s reference formulation (CVPR 2022), re-implemented here independently."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hfl.algorithms.dkd import chfl_temperature, dkd_loss


def zhao_reference(logits_student, logits_teacher, target, alpha, beta, temperature):
    """The mdistiller reference code's formulation (masks and the -1000 trick)."""
    gt_mask = torch.zeros_like(logits_student).scatter_(1, target.unsqueeze(1), 1).bool()
    other_mask = ~gt_mask
    pred_s = F.softmax(logits_student / temperature, dim=1)
    pred_t = F.softmax(logits_teacher / temperature, dim=1)

    def cat_mask(t):
        return torch.cat([(t * gt_mask).sum(1, keepdim=True), (t * other_mask).sum(1, keepdim=True)], 1)

    pred_s, pred_t = cat_mask(pred_s), cat_mask(pred_t)
    tckd = F.kl_div(torch.log(pred_s), pred_t, reduction="sum") * temperature**2 / target.shape[0]
    pred_t2 = F.softmax(logits_teacher / temperature - 1000.0 * gt_mask, dim=1)
    log_s2 = F.log_softmax(logits_student / temperature - 1000.0 * gt_mask, dim=1)
    nckd = F.kl_div(log_s2, pred_t2, reduction="sum") * temperature**2 / target.shape[0]
    return alpha * tckd + beta * nckd


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("temperature", [1.0, 4.0, 11.0])
def test_matches_zhao_reference(seed, temperature):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(16, 10, generator=g, dtype=torch.float64) * 3
    t = torch.randn(16, 10, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 10, (16,), generator=g)
    for a, b in [(1.0, 1.0), (1.0, 8.0), (0.5, 2.0)]:
        got = dkd_loss(s, t, y, temperature, tckd_weight=a, nckd_weight=b)
        torch.testing.assert_close(got, zhao_reference(s, t, y, a, b, temperature), rtol=1e-9, atol=1e-9)


def test_hand_computed_three_classes():
    s = torch.tensor([[1.0, 0.0, 0.0]])
    t = torch.tensor([[0.0, 1.0, 0.0]])
    y = torch.tensor([0])
    e = math.e
    # Student: p = (e, 1, 1)/(e+2); teacher: p = (1, e, 1)/(e+2).
    bs = [e / (e + 2), 2 / (e + 2)]
    bt = [1 / (e + 2), (e + 1) / (e + 2)]
    tckd = sum(q * math.log(q / p) for q, p in zip(bt, bs, strict=True))
    ps, pt = [0.5, 0.5], [e / (e + 1), 1 / (e + 1)]  # non-target classes 1 and 2
    nckd = sum(q * math.log(q / p) for q, p in zip(pt, ps, strict=True))
    assert float(dkd_loss(s, t, y, 1.0)) == pytest.approx(tckd + nckd, rel=1e-6)
    assert float(dkd_loss(s, t, y, 1.0, nckd_weight=0.0)) == pytest.approx(tckd, rel=1e-6)


def test_identical_student_and_teacher_cost_nothing_and_extremes_stay_finite():
    z = torch.tensor([[50.0, -50.0, 0.0], [0.0, 0.0, 0.0]])
    y = torch.tensor([0, 2])
    assert float(dkd_loss(z, z, y, 3.0)) == pytest.approx(0.0, abs=1e-9)
    confident = torch.tensor([[200.0, 0.0, 0.0]], requires_grad=True)
    loss = dkd_loss(confident, torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([0]), 1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(confident.grad).all()


def test_the_teacher_gets_no_gradient_and_bad_inputs_are_refused():
    s = torch.randn(4, 5, requires_grad=True)
    t = torch.randn(4, 5, requires_grad=True)
    dkd_loss(s, t, torch.tensor([0, 1, 2, 3]), 2.0).backward()
    assert t.grad is None and s.grad is not None
    with pytest.raises(ValueError, match=r"\(B, C\)"):
        dkd_loss(torch.zeros(4, 5), torch.zeros(4, 6), torch.zeros(4, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        dkd_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), 0.0)


def test_chfl_temperature_schedule():
    assert chfl_temperature(0, 100, 5.0) == pytest.approx(11.0)  # 2 beta + 1 at the start
    assert chfl_temperature(50, 100, 5.0) == pytest.approx(6.0)
    assert chfl_temperature(100, 100, 5.0) == pytest.approx(1.0)  # plain softmax at the end
    with pytest.raises(ValueError):
        chfl_temperature(1, 0, 5.0)
