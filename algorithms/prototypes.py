"""Class prototypes and the losses that pull embeddings towards them.

- :func:`class_sums` — per-class sums and counts of (optionally norm-clipped)
  embeddings: the local prototype of class j is ``sum_j / count_j``, FedHP eq. 7
  (FedProto, Tan et al. AAAI 2022, eq. 5).
- :func:`global_prototypes` — the aggregate: ``sum_i r_ij / sum_i w_ij`` over
  peers i, where a peer releases ``(r_ij, w_ij) = (sum_j, count_j)`` for the
  count-weighted mean (FedHP eq. 8-9, FedProto eq. 6) or ``(mean_j, 1)`` for the
  unweighted mean over the peers that hold class j (the authors' code).
- :func:`contrastive_loss` — FedHP eq. 10: InfoNCE over the global prototypes,
  ``-log softmax_j(sim(z, C_j) / t)[y]`` with sim = cosine (the paper's
  choice), ``-||z - C_j||_2`` or ``-||z - C_j||_1``; only the classes that
  have a global prototype take part, a sample whose class has none adds 0, and
  the sum is divided by the whole batch: so one sample's gradient never depends
  on which other samples are in its batch (DP-SGD's per-sample sensitivity).
- :func:`mse_loss` — FedProto's regulariser eq. 4 (``||f(x) - C_y||^2``, mean
  over elements as in its reference code).
- :func:`nearest_prototype` — FedProto's inference rule: the class of the
  closest global prototype (L2).
"""

from __future__ import annotations

import torch
from torch import nn

DISTANCES = ("cosine", "l2", "l1")


def clip_rows(x: torch.Tensor, max_norm: float | None) -> torch.Tensor:
    """Scale each row of ``x`` (N, D) down to L2 norm <= ``max_norm`` (None: unchanged)."""
    if max_norm is None:
        return x
    norms = x.norm(dim=1, keepdim=True)  # (N, 1)
    return x * torch.clamp(max_norm / norms.clamp_min(1e-12), max=1.0)


def class_sums(emb: torch.Tensor, y: torch.Tensor, num_classes: int,
               clip_norm: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums (K, D), counts (K,)) of the rows of ``emb`` (N, D) by label ``y`` (N,)."""
    emb = clip_rows(emb, clip_norm)
    sums = torch.zeros(num_classes, emb.shape[1], dtype=emb.dtype, device=emb.device)
    sums.index_add_(0, y, emb)
    counts = torch.bincount(y, minlength=num_classes).to(emb.dtype)
    return sums, counts


def release_rows(sums: torch.Tensor, counts: torch.Tensor, weighted: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """What a peer adds into the cohort's sum: (r (K, D), w (K,)).

    weighted: (sums, counts); unweighted: (class means, 1 where the class is held)."""
    if weighted:
        return sums, counts
    held = (counts > 0).to(sums.dtype)
    return sums / counts.clamp_min(1)[:, None], held


def global_prototypes(r_sum: torch.Tensor, w_sum: torch.Tensor, min_weight: float = 0.5
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(prototypes (K, D), present (K,) bool) from the summed releases; a class whose
    summed weight is below ``min_weight`` (no peer holds it, or noise) has none."""
    present = w_sum >= min_weight
    protos = torch.where(present[:, None], r_sum / w_sum.clamp_min(min_weight)[:, None],
                         torch.zeros_like(r_sum))
    return protos, present


def similarity(z: torch.Tensor, protos: torch.Tensor, distance: str) -> torch.Tensor:
    """(B, K) similarities of rows of ``z`` (B, D) to ``protos`` (K, D)."""
    if distance == "cosine":
        return nn.functional.normalize(z, dim=1) @ nn.functional.normalize(protos, dim=1).T
    if distance == "l2":
        return -torch.cdist(z, protos, p=2)
    if distance == "l1":
        return -torch.cdist(z, protos, p=1)
    raise ValueError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")


def contrastive_loss(z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, present: torch.Tensor,
                     temperature: float = 1.0, distance: str = "cosine") -> torch.Tensor:
    """FedHP eq. 10 summed over the samples whose class has a global prototype and
    divided by the batch size B (0 if none has). Dividing by the B' samples that have
    one instead (as before) made each sample's gradient B/B' times its own, B' set by
    the rest of the batch: under DP-SGD, whose per-sample gradients are B times the
    mean loss's, adding one sample then moved the others' and the sensitivity
    exceeded the clip norm (1.154 C in issue 32). ``z`` (B, D), ``y`` (B,),
    ``protos`` (K, D), ``present`` (K,) bool."""
    keep = present[y]  # (B,)
    if not bool(keep.any()):
        return z.sum() * 0.0
    classes = torch.nonzero(present).squeeze(1)  # (K',)
    remap = torch.full_like(present, -1, dtype=torch.long)
    remap[classes] = torch.arange(len(classes), device=classes.device)
    logits = similarity(z[keep], protos[classes], distance) / temperature  # (B', K')
    return nn.functional.cross_entropy(logits, remap[y[keep]], reduction="sum") / len(y)


def mse_loss(emb: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, present: torch.Tensor
             ) -> torch.Tensor:
    """FedProto eq. 4: mean squared distance (per element) of each embedding to its
    class's global prototype, over samples whose class has one (0 if none)."""
    keep = present[y]
    if not bool(keep.any()):
        return emb.sum() * 0.0
    return nn.functional.mse_loss(emb[keep], protos[y[keep]])


def nearest_prototype(emb: torch.Tensor, protos: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """(B,) the class of the nearest present prototype (L2) for each row of ``emb``."""
    d = torch.cdist(emb, protos)  # (B, K)
    return d.masked_fill(~present[None, :], float("inf")).argmin(dim=1)
