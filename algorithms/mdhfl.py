"""``mdhfl``: MDH-FL, knowledge distillation on public data plus symmetric
cross-entropy on noisy private labels, decentralised (no aggregator).

"Exploiting Model and Data Heterogeneity in FL" (MDH-FL). Every peer holds
the same public dataset d_0, from another distribution than the private data
(``data.public_set``). Per round, peer p:

1. local update (eq. 8): ``train.local_epochs`` epochs on its (noisy) private
   data with L_s = alpha CE + beta RCE (eq. 7; alpha = lambda = 0.1, beta = 1,
   ``hfl.algorithms.sce``); ``loss: ce`` is the KD-with-plain-CE baseline;
2. knowledge (eq. 1's D_p = f(d_0, theta_p)): its class probabilities on the
   round's public samples, ``public_batches`` batches of ``public_batch``
   indices that every peer derives alike from the cohort seed and the round
   (no coordination; :func:`public_round_indices`), broadcast to every peer;
3. collaborative update (eqs. 2-3): for each public batch, one optimizer step on
   ``sum_{j != p} w_j KL(D_j || D_p)`` over the teachers j that arrived, with
   w_j = 1/(P-1) (``weighting: uniform``, eq. 3) or the client-confidence
   weights of the authors' code (``weighting: confidence``; each peer then
   also broadcasts its mean private SCE loss, see
   :func:`hfl.algorithms.sce.confidence_weights`).

Robust consensus (``teacher_consensus``, docs/robust.md). With uniform
weights, eq. 3's ``sum_j 1/T KL(D_j || D_p)`` over the T teachers that arrived
has the gradient of ``KL(mean_j D_j || D_p)``: the student distils from the mean
posterior, which one teacher can drag anywhere. ``teacher_consensus: median``
(or ``trimmed_mean``, with ``teacher_trim_fraction``) distils instead from the
coordinate-wise median (trimmed mean) of the teachers' probabilities
(Yin et al., ICML 2018), every row renormalised to sum to 1; a public sample on
which the teachers share no probability mass (every class's median is 0) is
left out of that step. All teachers score the same public samples, which is
what makes a per-sample consensus possible here. ``all`` (default) is eq. 3.

A teacher's posteriors that refer to other samples than this round's, have
the wrong shape, or are not probability rows (negative, non-finite, rows not
summing to 1) are dropped with a logged reason; so is a teacher whose
confidence loss is not a finite positive number.

The authors' code runs the collaborative step before the private one within a
round; here the runtime calls ``local_update`` before ``share``/``absorb``, so
the same alternation starts with a private step (as the paper's fig. 2 does).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from hfl.algorithms.base import Algorithm, AlgorithmContext, Payload
from hfl.algorithms.payload import probabilities_problem
from hfl.algorithms.registry import register
from hfl.algorithms.robust import coordinate_median, trimmed_mean
from hfl.algorithms.sce import classification_loss, confidence_weights, uniform_weights, weighted_kl
from hfl.algorithms.training import batches

log = logging.getLogger("hfl.algorithms")

def public_round_indices(n: int, cohort_seed: int, round: int, count: int) -> np.ndarray:
    """``count`` indices into a public set of ``n`` samples for ``round``: the same on
    every peer that knows the cohort seed. Without replacement while ``count <= n``;
    beyond, successive permutations are concatenated."""
    if n < 1 or count < 1:
        raise ValueError(f"need n >= 1 and count >= 1, got n={n}, count={count}")
    gen = torch.Generator().manual_seed((cohort_seed * 1_000_003 + round) % (2**63))
    perms = [torch.randperm(n, generator=gen) for _ in range(math.ceil(count / n))]
    return torch.cat(perms)[:count].numpy().astype(np.int64)


def posterior_problem(idx: Any, probs: Any, expected_idx: np.ndarray, num_classes: int) -> str | None:
    """Why a teacher's (idx, probs) cannot be learned from, or None."""
    if not isinstance(idx, np.ndarray) or not isinstance(probs, np.ndarray):
        return "idx or probs missing"
    if not np.issubdtype(idx.dtype, np.integer):
        return f"idx of dtype {idx.dtype}, expected integers"
    if idx.shape != expected_idx.shape or not np.array_equal(idx, expected_idx):
        return f"posteriors on other public samples than this round's ({idx.shape[:1]} indices)"
    return probabilities_problem(probs, len(expected_idx), num_classes)


@dataclass(frozen=True)
class MDHFLConfig:
    loss: Literal["sce", "ce"] = field(
        default="sce", metadata={"help": "private loss: sce (eq. 7) or ce (KD with plain CE)"})
    sce_alpha: float = field(default=0.1, metadata={"min": 0, "help": "CE weight in SCE (the paper's lambda)"})
    sce_beta: float = field(default=1.0, metadata={"min": 0, "help": "RCE weight in SCE"})
    public_batch: int = field(default=64, metadata={"min": 2, "help": "public samples per KL step (BatchNorm needs 2)"})
    public_batches: int = field(
        default=2, metadata={"min": 1, "help": "KL steps per round, each on its own public batch"})
    weighting: Literal["uniform", "confidence"] = field(
        default="uniform",
        metadata={"help": "uniform: 1/(P-1) (eq. 3); confidence: the authors' client-confidence weights"})
    confidence_beta: float = field(
        default=0.5, metadata={"min": 0, "help": "strength of the confidence re-weighting (authors' 0.5)"})
    teacher_consensus: Literal["all", "median", "trimmed_mean"] = field(
        default="all", metadata={"help": "all: every teacher's KL (eq. 3); median, trimmed_mean: KL to the "
                                         "coordinate-wise robust consensus of the teachers' posteriors"})
    teacher_trim_fraction: float = field(default=0.2, metadata={
        "min": 0, "lt": 0.5, "help": "beta of teacher_consensus: trimmed_mean (floor(beta T) of T "
                                     "teachers dropped at each end, per probability)"})

    def validate(self) -> None:
        if self.teacher_consensus != "all" and self.weighting != "uniform":
            raise ValueError(f"teacher_consensus: {self.teacher_consensus} needs weighting: uniform (got "
                             f"{self.weighting}): a median counts every teacher once")


def consensus_posteriors(probs: list[np.ndarray], rule: str, trim_fraction: float = 0.2
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The teachers' consensus (N, C) float32, rows summing to 1, and which rows (N,)
    have one: the coordinate-wise ``median`` or ``trimmed_mean`` of the T teachers'
    (N, C) probabilities (sorted peer order), renormalised row by row."""
    stack = np.stack([p.astype(np.float64).reshape(-1) for p in probs])  # (T, N*C)
    if rule == "median":
        flat = coordinate_median(stack)
    elif rule == "trimmed_mean":
        flat = trimmed_mean(stack, trim_fraction)
    else:
        raise ValueError(f"teacher_consensus: got {rule!r}; allowed: median, trimmed_mean")
    rows = flat.reshape(probs[0].shape)  # (N, C)
    mass = rows.sum(axis=1)  # (N,)
    has = mass > 1e-12
    rows = np.where(has[:, None], rows / np.where(has, mass, 1.0)[:, None], 0.0)
    return rows.astype(np.float32), has


@register
class MDHFL(Algorithm):
    name = "mdhfl"
    mode = "broadcast"
    Config = MDHFLConfig

    def __init__(self, ctx: AlgorithmContext, cfg: MDHFLConfig | None = None):
        super().__init__(ctx, cfg)
        if ctx.public is None or len(ctx.public) == 0:
            raise ValueError("mdhfl needs a public dataset: set data.public_set (or data.public_fraction > 0)")
        self._own_loss: float | None = None  # this round's private loss (confidence weighting)
        self._last_loss: dict[str, float] = {}  # every peer's private loss of the previous round

    def loss(self, x: torch.Tensor, y: torch.Tensor, round: int) -> torch.Tensor:
        return classification_loss(self.cfg.loss, self.model(x), y, self.cfg.sce_alpha, self.cfg.sce_beta)

    def round_indices(self, round: int) -> np.ndarray:
        """This round's public indices, (public_batches * public_batch,)."""
        return public_round_indices(len(self.ctx.public), self.ctx.cohort_seed, round,
                                    self.cfg.public_batches * self.cfg.public_batch)

    @torch.no_grad()
    def private_loss(self) -> float:
        """Mean L_s of the current model on the private data (the confidence signal)."""
        self.model.eval()
        total, n = 0.0, 0
        for x, y in batches(self.ctx.train, 512, None, shuffle=False):
            x, y = x.to(self.ctx.device), y.to(self.ctx.device)
            loss = classification_loss(self.cfg.loss, self.model(x), y, self.cfg.sce_alpha, self.cfg.sce_beta)
            total += float(loss) * len(y)
            n += len(y)
        return total / max(n, 1)

    @torch.no_grad()
    def share(self, round: int) -> Payload:
        idx = self.round_indices(round)
        self.model.eval()
        x = torch.from_numpy(self.ctx.public.x[idx]).to(self.ctx.device)
        probs = torch.softmax(self.model(x), dim=1)  # (N, C): D_p on this round's public samples
        meta: dict[str, Any] = {}
        if self.cfg.weighting == "confidence":
            self._own_loss = self.private_loss()
            meta["private_loss"] = self._own_loss
        return Payload(kind="posteriors", tensors={"idx": idx, "probs": probs.cpu().numpy()}, meta=meta)

    def _teachers(self, round: int, received: dict[str, Payload], idx: np.ndarray):
        teachers: dict[str, tuple[np.ndarray, float | None]] = {}
        dropped = 0
        for peer, payload in sorted(received.items()):
            why = posterior_problem(payload.tensors.get("idx"), payload.tensors.get("probs"), idx,
                                    self.ctx.num_classes)
            loss = payload.meta.get("private_loss")
            if why is None and self.cfg.weighting == "confidence" and (
                    isinstance(loss, bool) or not isinstance(loss, (int, float))
                    or not math.isfinite(loss) or loss <= 0):
                why = f"private_loss must be a finite number > 0, got {loss!r}"
            if why is not None:
                log.warning("%s: round %d: posteriors of %s dropped: %s", self.ctx.peer_id, round, peer, why)
                dropped += 1
                continue
            teachers[peer] = (payload.tensors["probs"], None if loss is None else float(loss))
        return teachers, dropped

    def weights(self, teachers: dict[str, tuple[np.ndarray, float | None]]) -> tuple[list[float], bool]:
        """Each teacher's weight (in sorted peer order) and whether confidence weighting applied."""
        uniform = uniform_weights(len(teachers) + 1)
        if self.cfg.weighting != "confidence" or self._own_loss is None:
            return uniform, False
        current = {self.ctx.peer_id: self._own_loss, **{p: t[1] for p, t in teachers.items()}}
        w = confidence_weights(self._last_loss, current, self.cfg.confidence_beta)
        self._last_loss.update(current)
        if w is None:
            return uniform, False
        return [w[p] for p in sorted(teachers)], True

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        idx = self.round_indices(round)
        teachers, dropped = self._teachers(round, received, idx)
        metrics = {"teachers": float(len(teachers)), "dropped": float(dropped)}
        weights, reweighted = self.weights(teachers)
        if not teachers:
            return metrics
        device = self.ctx.device
        keep = None  # (N,) bool: rows with a consensus (teacher_consensus other than all)
        if self.cfg.teacher_consensus == "all":
            probs = [torch.tensor(teachers[p][0], device=device) for p in sorted(teachers)]  # (N, C) each
        else:
            consensus, has = consensus_posteriors([teachers[p][0] for p in sorted(teachers)],
                                                  self.cfg.teacher_consensus, self.cfg.teacher_trim_fraction)
            probs, weights = [torch.from_numpy(consensus).to(device)], [1.0]  # (N, C): one teacher
            keep = torch.from_numpy(has).to(device)
            metrics["no_consensus_rows"] = float((~has).sum())
        b = self.cfg.public_batch
        self.model.train()
        total = 0.0
        for k in range(self.cfg.public_batches):
            rows = slice(k * b, (k + 1) * b)
            x = torch.from_numpy(self.ctx.public.x[idx[rows]]).to(device)
            self.optimizer.zero_grad(set_to_none=True)
            logits = self.model(x)  # (b, C)
            if keep is None:
                loss = weighted_kl(logits, [p[rows] for p in probs], weights)
            elif keep[rows].any():
                loss = weighted_kl(logits[keep[rows]], [probs[0][rows][keep[rows]]], weights)
            else:
                continue  # no consensus on any sample of this batch
            loss.backward()
            self.optimizer.step()
            total += float(loss.detach())
        metrics.update(kl_loss=total / self.cfg.public_batches, confidence_weighted=float(reweighted))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_loss": dict(self._last_loss)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._last_loss = {str(k): float(v) for k, v in state.get("last_loss", {}).items()}
