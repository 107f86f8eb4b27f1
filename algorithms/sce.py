"""Symmetric cross-entropy and the weighted KL of MDH-FL, as pure tensor functions.

Symmetric cross-entropy (Wang, Ma, Chen, Luo, Yi, Bailey, "Symmetric Cross
Entropy for Robust Learning with Noisy Labels", ICCV 2019), as MDH-FL uses it
(eqs. 5-7 of "Exploiting Model and Data Heterogeneity in FL"):

    CE  = -sum_k q(k|x) log p(k|x)                      (eq. 5)
    RCE = -sum_k p(k|x) log q(k|x)                      (eq. 6)
    SCE = alpha * CE + beta * RCE                       (eq. 7: alpha = lambda = 0.1, beta = 1)

with q the one-hot label and p the model's softmax. log 0 is undefined, so as in
the SCE reference code the one-hot label is clamped to [1e-4, 1] and p to
[1e-7, 1] inside RCE, which makes RCE = -log(1e-4) * sum_{k != y} p_k
= 9.2103... * (1 - p_y) (up to the 1e-7 clamp).

The weighted KL is MDH-FL's collaborative objective (eqs. 1-3): peer p's
logits on the public batch are pulled towards every other peer's class
probabilities, ``sum_j w_j KL(D_j || D_p)`` (batch mean), with w_j = 1/(P-1)
in the paper (eq. 3) or the client-confidence weights of the authors' code.
The direction KL(teacher || student) is that of the authors' code
(``nn.KLDivLoss(log_softmax(own), softmax(other))``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

#: the clamps of the SCE reference code
LABEL_CLAMP = 1e-4
PROB_CLAMP = 1e-7


def reverse_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Batch mean of RCE (eq. 6): -sum_k p_k log clamp(onehot_k, 1e-4, 1)."""
    num_classes = logits.shape[1]
    p = torch.softmax(logits, dim=1).clamp(min=PROB_CLAMP, max=1.0)  # (B, C)
    q = nn.functional.one_hot(labels, num_classes).to(p.dtype).clamp(min=LABEL_CLAMP, max=1.0)
    return (-(p * torch.log(q)).sum(dim=1)).mean()


def sce_loss(logits: torch.Tensor, labels: torch.Tensor, alpha: float = 0.1,
             beta: float = 1.0) -> torch.Tensor:
    """alpha * CE + beta * RCE (eq. 7), batch means; logits (B, C), labels (B,)."""
    ce = nn.functional.cross_entropy(logits, labels)
    return alpha * ce + beta * reverse_cross_entropy(logits, labels)


def weighted_kl(student_logits: torch.Tensor, teacher_probs: Sequence[torch.Tensor],
                weights: Sequence[float]) -> torch.Tensor:
    """sum_j w_j KL(teacher_j || softmax(student)), each KL a batch mean (eqs. 1-3).

    ``student_logits`` (B, C); every ``teacher_probs[j]`` (B, C), rows summing to 1.
    Terms with a zero teacher probability contribute 0 (0 log 0 = 0).
    """
    if len(teacher_probs) != len(weights):
        raise ValueError(f"{len(teacher_probs)} teachers but {len(weights)} weights")
    log_p = torch.log_softmax(student_logits, dim=1)  # (B, C)
    loss = student_logits.new_zeros(())
    for probs, w in zip(teacher_probs, weights, strict=True):
        loss = loss + float(w) * nn.functional.kl_div(log_p, probs, reduction="batchmean")
    return loss


def uniform_weights(num_peers: int) -> list[float]:
    """The paper's eq. 3: 1/(P-1) for each of the P-1 other peers."""
    if num_peers < 2:
        return []
    return [1.0 / (num_peers - 1)] * (num_peers - 1)


def confidence_weights(previous_loss: dict[str, float], current_loss: dict[str, float],
                       beta: float = 0.5) -> dict[str, float] | None:
    """Client-confidence weights of the authors' code (from RHFL's re-weighting).

    For each of the P peers k (ourselves included) with a private loss this
    round L_k and last round L'_k: quality_k = (L'_k - L_k) / L_k (the relative
    drop of its private SCE loss), amount_k = 1/(P-1) + beta * quality_k /
    sum_j quality_j, and w_k = softmax(amount)_k over all P peers. Only the
    weights of the other peers are used, so they sum to less than 1, as in that
    code. Returns None (use eq. 3's uniform weights) when a peer lacks last
    round's loss, when a loss this round is 0 (cross-entropy reaches exactly 0.0 in
    float32 on a confident enough model: the quality divided by it, a review saw the
    peer's absorb raise ZeroDivisionError), or when the qualities sum to zero or are
    not finite.
    """
    peers = sorted(current_loss)
    if len(peers) < 2 or any(p not in previous_loss or not current_loss[p] > 0 for p in peers):
        return None
    quality = torch.tensor([(previous_loss[p] - current_loss[p]) / current_loss[p] for p in peers],
                           dtype=torch.float64)
    total = quality.sum()
    if not torch.isfinite(quality).all() or not torch.isfinite(total) or abs(float(total)) < 1e-12:
        return None
    amount = 1.0 / (len(peers) - 1) + beta * quality / total
    w = torch.softmax(amount, dim=0)
    return {p: float(v) for p, v in zip(peers, w, strict=True)}


def classification_loss(kind: str, logits: torch.Tensor, labels: torch.Tensor,
                        alpha: float = 0.1, beta: float = 1.0) -> torch.Tensor:
    """A local training loss by name: ``ce`` (eq. 5) or ``sce`` (eq. 7)."""
    if kind == "ce":
        return nn.functional.cross_entropy(logits, labels)
    if kind == "sce":
        return sce_loss(logits, labels, alpha, beta)
    raise ValueError(f"loss: got {kind!r}; allowed: ce, sce")
