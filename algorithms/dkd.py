"""Decoupled knowledge distillation, as CHFL uses it (groundwork for issue 4).

Zhao et al., "Decoupled Knowledge Distillation" (CVPR 2022) split the KD loss
into a target-class term (TCKD: KL between the binary distributions
[p_target, 1 - p_target] of teacher and student) and a non-target term (NCKD:
KL between the distributions over the non-target classes, re-normalised).
CHFL (Liu, Yang, Cai, Ding, Lu), eq. 6, weighs both equally under one alpha,
DKD = alpha [KL(b_teacher || b_student) + KL(p_teacher || p_student)], at the
temperature of its eq. 7, T = beta (1 + cos(pi t / T_max)) + 1.

As in Zhao et al.'s reference code, both distributions are taken at
temperature T and the loss is scaled by T^2 (so gradients keep their size as T
changes); ``t_squared=False`` drops the scaling. log(1 - p_target) is computed
as a difference of log-sum-exps, so a confident student gives no log(0).
"""

from __future__ import annotations

import math

import torch


def dkd_loss(
    student_logits: torch.Tensor,  # (B, C)
    teacher_logits: torch.Tensor,  # (B, C), a fixed teacher: detached by the caller or here
    target: torch.Tensor,  # (B,) int64
    temperature: float,
    tckd_weight: float = 1.0,
    nckd_weight: float = 1.0,
    t_squared: bool = True,
) -> torch.Tensor:
    """tckd_weight * TCKD + nckd_weight * NCKD, batch mean. CHFL's eq. 6 is both
    weights 1 (times its alpha); Zhao et al.'s DKD is (alpha, beta)."""
    if student_logits.shape != teacher_logits.shape or student_logits.ndim != 2:
        raise ValueError(f"logits must both be (B, C); got {tuple(student_logits.shape)} "
                         f"and {tuple(teacher_logits.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    t = temperature
    zs, zt = student_logits / t, teacher_logits.detach() / t  # (B, C)
    gt = torch.nn.functional.one_hot(target, zs.shape[1]).bool()  # (B, C)

    def binary_and_rest(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_all = torch.logsumexp(z, dim=1)  # (B,)
        rest = z.masked_fill(gt, float("-inf"))  # non-target logits
        log_rest_total = torch.logsumexp(rest, dim=1)  # (B,)
        log_target = z[gt] - log_all  # log p_target
        log_non_target = log_rest_total - log_all  # log (1 - p_target)
        log_b = torch.stack([log_target, log_non_target], dim=1)  # (B, 2)
        log_p_rest = rest - log_rest_total[:, None]  # (B, C), -inf at the target
        return log_b, log_p_rest

    log_bs, log_ps = binary_and_rest(zs)
    log_bt, log_pt = binary_and_rest(zt)
    tckd = (log_bt.exp() * (log_bt - log_bs)).sum(1).mean()
    non_target = ~gt
    nckd = (log_pt.exp() * (log_pt - log_ps)).masked_fill(~non_target, 0.0).sum(1).mean()
    scale = t * t if t_squared else 1.0
    return scale * (tckd_weight * tckd + nckd_weight * nckd)


def chfl_temperature(epoch: int, max_epoch: int, beta: float) -> float:
    """CHFL eq. 7: T = beta (1 + cos(pi epoch / max_epoch)) + 1, from 2 beta + 1 down to 1."""
    if max_epoch <= 0:
        raise ValueError(f"max_epoch must be > 0, got {max_epoch}")
    return beta * (1.0 + math.cos(math.pi * epoch / max_epoch)) + 1.0
