"""FedH2L's mimicry loss against hand-computed values (eqs. 3-6)."""

from __future__ import annotations

import math

import pytest
import torch

from hfl.algorithms.fedh2l import mimicry_loss


def test_mimicry_loss_matches_hand_computation():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    p_i = [[math.exp(2) / (math.exp(2) + 1), 1 / (math.exp(2) + 1)],
           [1 / (1 + math.e), math.e / (1 + math.e)]]
    p_j = [[0.7, 0.3], [0.4, 0.6]]
    labels = torch.tensor([0, 1])
    kl = sum(sum(pj * math.log(pj / pi) for pj, pi in zip(rj, ri, strict=True))
             for rj, ri in zip(p_j, p_i, strict=True)) / 2
    ce = -(math.log(p_i[0][0]) + math.log(p_i[1][1])) / 2
    acc = 0.75
    got = mimicry_loss(logits, torch.tensor(p_j), labels, acc)
    assert float(got) == pytest.approx(acc * kl + ce, rel=1e-6)
    assert float(mimicry_loss(logits, torch.tensor(p_j), None, acc)) == pytest.approx(acc * kl, rel=1e-6)
    assert float(mimicry_loss(logits, torch.tensor(p_j), labels, acc, kl=False)) == pytest.approx(ce, rel=1e-6)


def test_a_student_that_equals_its_teacher_has_no_kl():
    logits = torch.tensor([[0.3, -1.2, 2.0]])
    probs = torch.softmax(logits, dim=1)
    assert float(mimicry_loss(logits, probs, None, 1.0)) == pytest.approx(0.0, abs=1e-6)
