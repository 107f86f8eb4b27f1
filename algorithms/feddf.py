"""``feddf``: FedDF, ensemble distillation for model fusion (Lin, Kong, Stich,
Jaggi, "Ensemble Distillation for Robust Model Fusion in Federated
Learning", NeurIPS 2020), heterogeneous variant (its Algorithm 3), a
baseline of MDH-FL's tables.

Per round: every peer trains locally (cross-entropy) and sends the round's
elected aggregator its weights, its sample count and its logits on the round's
public samples (``public_batches`` x ``public_batch`` indices every peer
derives alike from the cohort seed and the round; unlabeled use only). The
aggregator groups the models by architecture (the exact set of array names,
shapes and dtypes, computed from the arrays, never from a claim), averages
each group (sample-count weighted, FedAvg's ``weighted_mean``) and forms the
ensemble teacher: the mean of *all* received models' logits (AvgLogits, over
every architecture). Each group's average is then distilled towards the
teacher: ``distill_steps`` Adam steps (lr ``distill_lr``) on
T^2 KL(softmax(teacher / T) || softmax(student / T)), cycling through the
round's public batches.

Deviation: FedDF distils on the server. Here the aggregator is a peer that
can instantiate only its own architecture, so the result carries every
group's average plus the teacher, and each member distils its own group's
average with exactly the same deterministic procedure (fresh Adam, the same
batches in the same order), arriving at the model the server would have sent.
FedDF's early stopping on a validation set and its data augmentation are left
out: a fixed number of steps.

``robust`` (``hfl.algorithms.robust``, docs/robust.md) replaces AvgLogits by a
robust rule over the received models' logits (median, trimmed_mean, krum,
multi_krum, geometric_median; unweighted): a few lying teachers cannot steer
the ensemble every group is distilled towards. A round the rule cannot run on
(too few contributions for f) has no result, with a logged reason. The group
averages of the weights stay sample-count weighted means.

Contributions with non-finite weights or logits, logits on other samples, an
invalid sample count or a malformed packing layout are left out with a logged
reason. A payload of more than 32 arrays travels packed (one flat array per
dtype, ``hfl.algorithms.packing``): the wire allows 64 frames a message.
"""

from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hfl.algorithms.base import (
    Algorithm,
    AlgorithmContext,
    Payload,
    arrays_to_module,
    module_to_arrays,
)
from hfl.algorithms.fedavg import mismatch, weighted_mean
from hfl.algorithms.mdhfl import public_round_indices
from hfl.algorithms.packing import pack_if_many, unpack_if_packed
from hfl.algorithms.payload import MAX_LOGIT, beyond_scale, top_abs
from hfl.algorithms.registry import register
from hfl.algorithms.robust import RobustOptions, combine, is_plain, rule_options

log = logging.getLogger("hfl.algorithms")

WEIGHT_PREFIX = "w/"


def signature(arrays: dict[str, np.ndarray]) -> int:
    """An architecture fingerprint: crc32 over sorted names, shapes and dtypes."""
    text = ";".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in sorted(arrays.items()))
    return zlib.crc32(text.encode())


def group_average(contributions: dict[str, dict[str, np.ndarray]],
                  num_samples: dict[str, float], weighted: bool = True
                  ) -> tuple[dict[int, dict[str, np.ndarray]], dict[int, list[str]]]:
    """Models grouped by :func:`signature`, each group's (weighted) mean; and the members."""
    members: dict[int, list[str]] = {}
    for peer in sorted(contributions):
        members.setdefault(signature(contributions[peer]), []).append(peer)
    means = {}
    for sig, peers in members.items():
        group = {p: Payload("weights", contributions[p], {"num_samples": num_samples[p]}) for p in peers}
        means[sig] = weighted_mean(group, weighted)
    return means, members


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, t: float) -> torch.Tensor:
    """T^2 KL(softmax(teacher / T) || softmax(student / T)), batch mean; both (B, C)."""
    return (t * t) * nn.functional.kl_div(
        torch.log_softmax(student_logits / t, dim=1), torch.softmax(teacher_logits / t, dim=1),
        reduction="batchmean")


@dataclass(frozen=True)
class FedDFConfig(RobustOptions):
    weighted: bool = field(default=True, metadata={"help": "sample-count weighted mean within a group"})
    public_batch: int = field(default=64, metadata={"min": 2, "help": "public samples per distillation step"})
    public_batches: int = field(default=2, metadata={"min": 1, "help": "public batches per round"})
    distill_steps: int = field(default=10, metadata={"min": 0, "help": "Adam steps distilling each group"})
    distill_lr: float = field(default=1e-3, metadata={"gt": 0})
    temperature: float = field(default=1.0, metadata={"gt": 0})


@register
class FedDF(Algorithm):
    name = "feddf"
    mode = "aggregator"
    Config = FedDFConfig

    def __init__(self, ctx: AlgorithmContext, cfg: FedDFConfig | None = None):
        super().__init__(ctx, cfg)
        if ctx.public is None or len(ctx.public) == 0:
            raise ValueError("feddf needs a public dataset: set data.public_set (or data.public_fraction > 0)")

    def round_indices(self, round: int) -> np.ndarray:
        return public_round_indices(len(self.ctx.public), self.ctx.cohort_seed, round,
                                    self.cfg.public_batches * self.cfg.public_batch)

    @torch.no_grad()
    def share(self, round: int) -> Payload:
        idx = self.round_indices(round)
        self.model.eval()
        logits = self.model(torch.from_numpy(self.ctx.public.x[idx]).to(self.ctx.device))  # (N, C)
        tensors = {WEIGHT_PREFIX + k: v for k, v in module_to_arrays(self.model).items()}
        tensors.update(idx=idx, logits=logits.cpu().numpy())
        tensors, meta = pack_if_many(tensors, {"num_samples": len(self.ctx.train)})  # <= 64 frames
        return Payload(kind="model+logits", tensors=tensors, meta=meta)

    def _problem(self, c: Payload, idx: np.ndarray, own_top: float | None = None) -> str | None:
        got_idx, logits = c.tensors.get("idx"), c.tensors.get("logits")
        if got_idx is None or logits is None:
            return "idx or logits missing"
        if not np.issubdtype(got_idx.dtype, np.integer) or got_idx.shape != idx.shape \
                or not np.array_equal(got_idx, idx):
            return "logits on other public samples than this round's"
        if logits.shape != (len(idx), self.ctx.num_classes) or not np.issubdtype(logits.dtype, np.floating):
            return f"logits {logits.dtype}{list(logits.shape)}, expected float{[len(idx), self.ctx.num_classes]}"
        if not np.isfinite(logits).all():
            return "non-finite logits"
        if float(np.abs(logits).max(initial=0)) > MAX_LOGIT:
            return f"logits beyond +-{MAX_LOGIT:g}: no model's scores"
        weights = {k: v for k, v in c.tensors.items() if k.startswith(WEIGHT_PREFIX)}
        if not weights:
            return "no weights"
        bad = [k for k, v in weights.items() if np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all()]
        if bad:
            return f"{bad[0]}: non-finite values"
        # (weights of 3e38 went into the group mean, and every peer refused the round's
        # whole result, every round: a review)
        own = own_top if own_top is not None else top_abs(module_to_arrays(self.model))
        why = next((w for k, v in weights.items() if (w := beyond_scale(k, top_abs(v), own))), None)
        if why is not None:
            return why
        n = c.meta.get("num_samples", 1)
        if self.cfg.weighted and (isinstance(n, bool) or not isinstance(n, (int, float))
                                  or not math.isfinite(n) or n <= 0):
            return f"num_samples must be a number > 0, got {n!r}"
        return None

    def aggregate(self, round: int, contributions: dict[str, Payload]) -> Payload | None:
        idx = self.round_indices(round)
        good = {}
        own_top = top_abs(module_to_arrays(self.model))  # (once: what weights are bounded by)
        for peer, c in sorted(contributions.items()):
            arrays, why = unpack_if_packed(c.tensors, c.meta)
            c = Payload(kind=c.kind, tensors=arrays, meta=c.meta)
            why = why or self._problem(c, idx, own_top)
            if why is None:
                good[peer] = c
            else:
                log.warning("%s: round %d: contribution of %s left out: %s", self.ctx.peer_id, round, peer, why)
        if not good:
            return None
        weights = {p: {k[len(WEIGHT_PREFIX):]: v for k, v in c.tensors.items() if k.startswith(WEIGHT_PREFIX)}
                   for p, c in good.items()}
        counts = {p: float(c.meta.get("num_samples", 1)) for p, c in good.items()}
        means, members = group_average(weights, counts, self.cfg.weighted)
        options = rule_options(self.cfg)
        extra = {}
        if is_plain(options):
            teacher = np.mean(np.stack([good[p].tensors["logits"].astype(np.float64) for p in sorted(good)]),
                              axis=0).astype(np.float32)  # (N, C): AvgLogits over every architecture
        else:
            try:
                out, info = combine({p: {"logits": c.tensors["logits"].astype(np.float64)}
                                     for p, c in good.items()}, **options)
            except ValueError as exc:
                log.warning("%s: round %d: no result this round: %s", self.ctx.peer_id, round, exc)
                return None
            teacher = out["logits"].astype(np.float32)  # (N, C): the rule over every architecture
            extra = {"robust": options["rule"], **info}
        tensors: dict[str, np.ndarray] = {"idx": idx, "teacher": teacher}
        groups = []
        for k, sig in enumerate(sorted(means)):
            tensors.update({f"g{k}/{name}": v for name, v in means[sig].items()})
            groups.append([int(sig), f"g{k}/", members[sig]])
        tensors, meta = pack_if_many(tensors, {"round": round, "groups": groups,
                                               "excluded": sorted(set(contributions) - set(good)),
                                               **extra})
        return Payload(kind="groups+teacher", tensors=tensors, meta=meta)

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        if not received:
            return {"absorbed": 0.0}
        (sender, result), = received.items()
        tensors, why = unpack_if_packed(result.tensors, result.meta)
        own = module_to_arrays(self.model)
        arrays: dict[str, np.ndarray] = {}
        if why is None:
            arrays, why = self._own_group(round, tensors, result.meta, own)
        if why is not None:
            log.warning("%s: round %d: result from %s refused: %s", self.ctx.peer_id, round, sender, why)
            return {"absorbed": 0.0}
        arrays_to_module(self.model, arrays)
        loss = self.distill(tensors["idx"], tensors["teacher"])
        return {"absorbed": 1.0, "distill_loss": loss}

    def _own_group(self, round: int, tensors: dict[str, np.ndarray], meta: dict[str, Any],
                   own: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str | None]:
        """This peer's group mean from a result, or ({}, why it cannot be used)."""
        if meta.get("round", round) != round:
            return {}, f"it is the result of round {meta.get('round')!r}"
        mine = signature(own)
        groups = meta.get("groups", [])  # (a map raised TypeError in the receiver: a review)
        prefix = next((g[1] for g in (groups if isinstance(groups, list) else [])
                       if isinstance(g, (list, tuple)) and len(g) >= 2 and g[0] == mine
                       and isinstance(g[1], str)), None)
        if prefix is None:
            return {}, "no group of this peer's architecture"
        arrays = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        why = mismatch(arrays, own)
        expected = self.round_indices(round)
        idx, teacher = tensors.get("idx"), tensors.get("teacher")
        if why is None and (idx is None or not np.issubdtype(idx.dtype, np.integer)
                            or idx.shape != expected.shape or not np.array_equal(idx, expected)):
            # (float indices equal in value passed, and raised in distill after the group
            # weights were loaded: a review)
            why = "teacher on other public samples than this round's"
        if why is None and (teacher is None or teacher.shape != (len(expected), self.ctx.num_classes)
                            or teacher.dtype.kind != "f" or not np.isfinite(teacher).all()
                            or top_abs(teacher) > MAX_LOGIT):  # (3e38 at t < 1: a NaN loss)
            why = "teacher logits missing, ill-shaped or non-finite"
        return arrays, why

    def distill(self, idx: np.ndarray, teacher: np.ndarray) -> float:
        """Distil the loaded group average towards the teacher: fresh Adam, fixed batch order."""
        device, b, t = self.ctx.device, self.cfg.public_batch, self.cfg.temperature
        opt = torch.optim.Adam(self.model.parameters(), lr=self.cfg.distill_lr)
        teacher_t = torch.tensor(teacher, device=device)  # (N, C)
        self.model.train()
        loss = torch.zeros(())
        for step in range(self.cfg.distill_steps):
            rows = slice((step % self.cfg.public_batches) * b, (step % self.cfg.public_batches + 1) * b)
            x = torch.from_numpy(self.ctx.public.x[idx[rows]]).to(device)
            opt.zero_grad(set_to_none=True)
            loss = distill_loss(self.model(x), teacher_t[rows], t)
            loss.backward()
            opt.step()
        return float(loss.detach())
