"""``fedmd``: FedMD (Li & Wang, "FedMD: Heterogenous Federated Learning via
Model Distillation", 2019), the consensus baseline of FedH2L's tables.

Per round: *revisit* (local training on private data, ``local_update``);
*communicate* (class scores of the model on the round's public batch);
*aggregate* on the round's elected aggregator peer (the mean of the scores:
the consensus); *digest* (``digest_steps`` steps pulling the model's scores
towards the consensus with an L1 loss, as in FedMD's code).

The public batch is the same for every peer: round r uses the public seed set
of owner ``owners[r % len(owners)]`` (owners sorted) and indices drawn from a
generator seeded with (public_seed, r). Scores are logits, as in FedMD.

``robust`` (``hfl.algorithms.robust``, docs/robust.md) replaces the mean of the
scores by a robust rule over the scorers' (B, C) logits (median, trimmed_mean,
krum, multi_krum, geometric_median; unweighted); logits of the wrong shape or
non-finite are then left out with a logged reason, and a round the rule cannot
run on (too few scorers for f) has no consensus.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from hfl.algorithms.base import Algorithm, Payload
from hfl.algorithms.payload import MAX_LOGIT
from hfl.algorithms.registry import register
from hfl.algorithms.robust import RobustOptions, combine, is_plain, rule_options

log = logging.getLogger("hfl.algorithms")

@dataclass(frozen=True)
class FedMDConfig(RobustOptions):
    public_batch: int = field(default=64, metadata={"min": 1})
    digest_steps: int = field(default=5, metadata={"min": 1})
    public_seed: int = field(default=0, metadata={"help": "shared: picks each round's public batch"})


@register
class FedMD(Algorithm):
    name = "fedmd"
    mode = "aggregator"
    Config = FedMDConfig
    uses_public_seeds = True

    def aggregates_everywhere_by_default(self) -> bool:
        return True  # logits on one public batch are small

    def _public_of(self, owner: str):
        return self.ctx.public if owner == self.ctx.peer_id else self.peer_seeds.get(owner)

    def _round_batch(self, round: int) -> tuple[str, np.ndarray]:
        owners = sorted({self.ctx.peer_id, *self.peer_seeds})
        owner = owners[round % len(owners)]
        n = len(self._public_of(owner))
        gen = torch.Generator().manual_seed(self.cfg.public_seed * 100_003 + round)
        idx = torch.randperm(n, generator=gen)[: self.cfg.public_batch].sort().values.numpy()
        return owner, idx

    @torch.no_grad()
    def share(self, round: int) -> Payload:
        owner, idx = self._round_batch(round)
        self.model.eval()
        x = torch.from_numpy(self._public_of(owner).x[idx]).to(self.ctx.device)
        return Payload(kind="scores", tensors={"idx": idx, "logits": self.model(x).cpu().numpy()},
                       meta={"owner": owner})

    def aggregate(self, round: int, contributions: dict[str, Payload]) -> Payload | None:
        # Peers that hold different seed sets may pick different batches: average
        # the largest group that scored the same samples.
        options = rule_options(self.cfg)
        plain = is_plain(options)
        groups: dict[tuple, list[tuple[str, Payload]]] = {}
        for peer, c in contributions.items():
            why = self.scores_problem(c)  # (under the plain mean too: a member's scores)
            if why is not None:
                log.warning("%s: round %d: scores of %s left out: %s", self.ctx.peer_id, round, peer, why)
                continue
            key = (c.meta.get("owner"), c.tensors["idx"].tobytes())
            groups.setdefault(key, []).append((peer, c))
        if not groups:
            return None
        best = max(groups.values(), key=len)
        meta = {"owner": best[0][1].meta["owner"], "scorers": len(best)}
        if plain:
            consensus = np.mean(np.stack([c.tensors["logits"] for _, c in best]), axis=0).astype(np.float32)
        else:
            try:
                out, info = combine({p: {"logits": c.tensors["logits"]} for p, c in best}, **options)
            except ValueError as exc:
                log.warning("%s: round %d: no consensus this round: %s", self.ctx.peer_id, round, exc)
                return None
            consensus = out["logits"].astype(np.float32)
            meta.update(robust=options["rule"], **info)
        return Payload(kind="consensus", tensors={"idx": best[0][1].tensors["idx"], "logits": consensus},
                       meta=meta)

    def scores_problem(self, c: Payload) -> str | None:
        """Why a contribution's scores (or a consensus) cannot be averaged or learned
        from, or None. Without these checks under the plain mean, a missing idx, a
        logits array one class wider or no owner raised in the aggregator (every peer,
        by default), and NaN logits made a NaN consensus (an attack review)."""
        idx, logits = c.tensors.get("idx"), c.tensors.get("logits")
        if not isinstance(c.meta.get("owner"), str):
            return "no owner named"
        if not isinstance(idx, np.ndarray) or not isinstance(logits, np.ndarray):
            return "idx or logits missing"
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer) or idx.min(initial=0) < 0:
            return f"idx {idx.dtype}{list(idx.shape)}, expected integers >= 0 [B]"
        if logits.shape != (len(idx), self.ctx.num_classes) or not np.issubdtype(logits.dtype, np.floating):
            return f"logits {logits.dtype}{list(logits.shape)}, expected float[{len(idx)}, {self.ctx.num_classes}]"
        if not np.isfinite(logits).all():
            return "non-finite logits"
        if float(np.abs(logits).max(initial=0)) > MAX_LOGIT:
            return f"logits beyond +-{MAX_LOGIT:g}: no model's scores"
        return None

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        result = next(iter(received.values()))
        why = self.scores_problem(result)
        if why is not None:
            log.warning("%s: round %d: consensus refused: %s", self.ctx.peer_id, round, why)
            return {"digested": 0.0}
        public = self._public_of(str(result.meta.get("owner")))
        idx, target = result.tensors.get("idx"), result.tensors.get("logits")
        if public is None or idx.max(initial=-1) >= len(public):
            # Loudly: a consensus this peer cannot digest is a round it learns nothing from
            # the others (it holds no seed set of that owner, or the batch does not fit it).
            log.warning("%s: round %d: consensus on %s's public batch not digested: %s",
                        self.ctx.peer_id, round, result.meta.get("owner"),
                        "no seed set of that peer here" if public is None
                        else "the batch does not fit it")
            return {"digested": 0.0}
        x = torch.from_numpy(public.x[idx]).to(self.ctx.device)
        target_t = torch.from_numpy(np.array(target)).to(self.ctx.device)  # (B, C)
        self.model.train()
        loss = torch.zeros(())
        for _ in range(self.cfg.digest_steps):
            self.optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.l1_loss(self.model(x), target_t)
            loss.backward()
            self.optimizer.step()
        return {"digested": 1.0, "digest_loss": float(loss.detach())}
