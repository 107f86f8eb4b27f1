"""``fedh2l``: decentralized mutual distillation with a QP gradient projection.

FedH2L (Li, Zhou, Wang, Mi, Hospedales), Algorithm 1. Per round, peer i:

1. local step: cross-entropy (eq. 2) on its private data plus every node's
   labelled public seeds (the paper's default; ``local_includes_public: false``
   uses the private data only), with the local optimizer (lr beta);
2. teaches: draws a batch of its own public seeds and broadcasts the posteriors
   of its model on it and its accuracy on that batch, [p_i^pub(i), Acc_i]. The
   batch travels as sample indices into i's public set, which every peer holds
   (the runtime exchanges the sets, chunked and checksummed, at join);
3. learns: for each teacher j, its own posteriors on j's batch, and
   g_pub = grad of (1/(N-1)) sum_j [Acc_j * KL(p_j || p_i) + CE(p_i, y_j)]
   (eqs. 3-6; ``ce_on_public: false`` is the unlabeled-public variant, KL only;
   the mean runs over the teachers whose knowledge arrived, N-1 when all did);
4. if <g_pub, g_loc> < 0, projects g_pub onto the closest gradient with
   <g, g_loc> >= 0 (eq. 8, closed form of the dual eq. 15) and steps with the
   global optimizer (lr eta).

g_loc and the optimizers (``g_loc``, ``global_optimizer``). The paper's form is
the default: g_loc is the raw local gradient of eq. (2) and one optimizer (the
peer's ``train.optimizer``, AMSGrad in the paper) takes both steps, at lr beta
(``train.lr``) for the local step and eta for the global one. hfl's local step
runs ``train.local_epochs`` (or ``max_batches``) batches, not one, so g_loc is the
mean of the raw gradients of the local batches since the last global step
(exactly eq. 2 with one batch). ``g_loc: change`` is hfl's earlier form: the
parameter change theta_before - theta_after over the local steps; with
``global_optimizer: amsgrad`` (or ``sgd``) the global step has an optimizer of its
own. Under an adaptive optimizer the parameter change is not a positive multiple
of the gradient (AMSGrad rescales every coordinate), so the two forms test eq. (7)
against different vectors: see docs/fedh2l.md for both, measured.
``global_every`` (E) runs the global step only every E rounds, with g_loc taken
over all the local steps since the last one.

Teachers' accuracies (``teacher_acc``, docs/robust.md). Every teacher teaches on
a batch of *its own* public seeds, so no two teachers score the same samples and
no per-sample consensus (median, trimmed mean) across teachers exists. What
weighs a teacher's KL term is Acc_j, which the teacher claims. With
``teacher_acc: verified`` the learner computes Acc_j itself, as the accuracy of
the received posteriors p_j against the labels of j's seeds (which it holds):
a teacher sending wrong posteriors gets the weight of their true accuracy (0 for
posteriors that never put the most mass on the label), however high its claim.
The CE term uses the learner's own copy of the labels and needs no trust.
``claimed`` (default) is the paper's.

Ablations (the paper's Table 5): ``kl: false``, ``projection: none``,
``projection: pcgrad`` (Yu et al. 2020: both gradients are projected off each
other's conflict and summed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hfl.algorithms.base import Algorithm, AlgorithmContext, Payload
from hfl.algorithms.payload import fraction_problem, probabilities_problem
from hfl.algorithms.projection import flat_grads, flatten, pcgrad, project, write_grads
from hfl.algorithms.registry import register
from hfl.algorithms.training import load_optimizer

log = logging.getLogger("hfl.algorithms")


@dataclass(frozen=True)
class FedH2LConfig:
    eta: float = field(default=1e-3, metadata={"gt": 0, "help": "global (mutual) step size"})
    g_loc: Literal["gradient", "change"] = field(
        default="gradient",
        metadata={"help": "the local reference of eq. 7: the raw local gradient (the paper) "
                          "or the parameter change over the local steps"},
    )
    global_optimizer: Literal["shared", "amsgrad", "sgd"] = field(
        default="shared",
        metadata={"help": "the global step's optimizer: the local one (the paper) or one of its own"},
    )
    public_batch: int = field(default=32, metadata={"min": 1, "help": "samples a peer teaches on"})
    kl: bool = True
    ce_on_public: bool = True
    local_includes_public: bool = True
    projection: Literal["qp", "none", "pcgrad"] = "qp"
    global_every: int = field(default=1, metadata={"min": 1, "help": "E: global step every E rounds"})
    teacher_acc: Literal["claimed", "verified"] = field(
        default="claimed", metadata={"help": "Acc_j weighing teacher j's KL: as j claims it (the paper), "
                                             "or verified from its posteriors and the seeds' labels"})

    def validate(self) -> None:
        if self.teacher_acc == "verified" and not (self.kl and self.ce_on_public):
            raise ValueError("teacher_acc: verified needs kl: true and ce_on_public: true (it weighs the "
                             "KL term by the posteriors' accuracy on the labelled public seeds)")


def verified_accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    """Share of rows of ``probs`` (B, C) whose most probable class is the label (B,)."""
    return float((np.asarray(probs).argmax(axis=1) == np.asarray(labels)).mean()) if len(labels) else 0.0


def mimicry_loss(
    student_logits: torch.Tensor,  # (B, C) peer i's logits on teacher j's batch
    teacher_probs: torch.Tensor,  # (B, C) p_j
    labels: torch.Tensor | None,  # (B,) or None for unlabeled public data
    teacher_acc: float,
    kl: bool = True,
) -> torch.Tensor:
    """One teacher's term: Acc_j * KL(p_j || p_i) + CE(p_i, y_j) (FedH2L eqs. 3-6)."""
    log_p = torch.log_softmax(student_logits, dim=1)
    loss = student_logits.new_zeros(())
    if kl:
        # KL(p_j || p_i) = sum p_j (log p_j - log p_i), batch mean.
        loss = loss + teacher_acc * nn.functional.kl_div(log_p, teacher_probs, reduction="batchmean")
    if labels is not None:
        loss = loss + nn.functional.nll_loss(log_p, labels)
    return loss


def teacher_problem(idx: Any, probs: Any, acc: Any, seeds: int, num_classes: int,
                    verified: bool) -> str | None:
    """Why a teacher's posteriors cannot be learned from, or None: ``idx`` integer
    indices into its ``seeds`` public samples, at least one; ``probs`` a row of
    probabilities for each; ``acc`` (unless ``verified``: then measured here) in [0, 1].
    A float index, integer probabilities or an accuracy of "abc" raised in absorb; NaN
    probabilities or accuracy made the model NaN (an attack review)."""
    if not isinstance(idx, np.ndarray) or idx.ndim != 1 or len(idx) == 0:
        return "idx is not a non-empty 1-D array"
    if not np.issubdtype(idx.dtype, np.integer) or np.issubdtype(idx.dtype, np.bool_):
        return f"idx of dtype {idx.dtype}, expected integers"
    if idx.min() < 0 or idx.max() >= seeds:
        return f"idx outside this teacher's {seeds} public samples"
    return probabilities_problem(probs, len(idx), num_classes) or (
        None if verified else fraction_problem(acc, "acc"))


@register
class FedH2L(Algorithm):
    name = "fedh2l"
    mode = "broadcast"
    Config = FedH2LConfig
    uses_public_seeds = True
    overlaps_local_step = True  # cohort.overlap: absorb is the global step (eq. 7)

    def __init__(self, ctx: AlgorithmContext, cfg: FedH2LConfig | None = None):
        super().__init__(ctx, cfg)
        if ctx.public is None or len(ctx.public) == 0:
            raise ValueError("fedh2l needs public seeds: set data.public_fraction > 0")
        params = list(self.model.parameters())
        if self.cfg.global_optimizer == "shared":
            self.global_opt = self.optimizer  # one optimizer state for both steps (Algorithm 1)
        elif self.cfg.global_optimizer == "amsgrad":
            wd = ctx.train_cfg.weight_decay
            self.global_opt = torch.optim.Adam(params, lr=self.cfg.eta, weight_decay=wd, amsgrad=True)
        else:
            self.global_opt = torch.optim.SGD(params, lr=self.cfg.eta)
        # g_loc since the last global step: the parameters before the local steps
        # (g_loc: change), or the sum and count of the local batches' raw gradients.
        self._anchor: torch.Tensor | None = None
        self._grad_sum: torch.Tensor | None = None
        self._grad_count = 0
        # The last g_loc a global step used, until the next local step: a second global
        # step with no local step between (cohort.overlap, a round that evaluates)
        # protects the same direction instead of none.
        self._last_g_loc: torch.Tensor | None = None
        self._teach_gen = torch.Generator().manual_seed(ctx.seed + 1)  # which public samples to teach on

    # ------------------------------------------------------------ local step

    def local_data(self):
        return self.private_and_public() if self.cfg.local_includes_public else self.ctx.train

    def local_update(self, round: int) -> dict[str, float]:
        self._last_g_loc = None  # the next global step protects the steps from here
        if self.cfg.g_loc == "change" and self._anchor is None:  # measured from here
            self._anchor = flatten(p.detach() for p in self._params()).clone()
        return super().local_update(round)

    def before_step_hook(self, round: int):
        if self.cfg.g_loc != "gradient":
            return None
        params = self._params()

        def accumulate() -> None:  # eq. (2): the raw gradient, before the optimizer sees it
            g = flat_grads(params).detach()
            self._grad_sum = g.clone() if self._grad_sum is None else self._grad_sum.add_(g)
            self._grad_count += 1

        return accumulate

    def _params(self) -> list[torch.nn.Parameter]:
        """The parameters both steps train: g_loc, g_pub and the projection live in their space."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def _local_reference(self) -> torch.Tensor | None:
        """g_loc since the last global step, and reset; with no local step since, the
        g_loc the last global step used (None if no local step was ever taken here).

        With ``cohort.overlap`` a round that evaluates absorbs right after the round
        before did, with no local step between: the paper's order (L A L A) never
        does. Its global step protects the same local direction as the one before,
        not nothing (a zero g_loc lets the mimicry gradient through unprojected)."""
        if self._anchor is not None:  # g_loc: change
            g = self._anchor - flatten(p.detach() for p in self._params())
        elif self._grad_sum is not None:  # g_loc: gradient
            g = self._grad_sum / self._grad_count
        else:
            g = self._last_g_loc
        self._anchor, self._grad_sum, self._grad_count = None, None, 0
        self._last_g_loc = g
        return g

    # ------------------------------------------------------------ teaching

    @torch.no_grad()
    def share(self, round: int) -> Payload:
        public = self.ctx.public
        b = min(self.cfg.public_batch, len(public))
        idx = torch.randperm(len(public), generator=self._teach_gen)[:b].sort().values.numpy()
        self.model.eval()
        logits = self.model(torch.from_numpy(public.x[idx]).to(self.ctx.device))  # (B, C)
        probs = torch.softmax(logits, dim=1)
        acc = float((logits.argmax(1).cpu() == torch.from_numpy(public.y[idx])).float().mean())
        return Payload(kind="posteriors", tensors={"idx": idx, "probs": probs.cpu().numpy()},
                       meta={"acc": acc})

    # ------------------------------------------------------------ learning

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        if round % self.cfg.global_every:
            return {}
        teachers = []
        for owner, payload in sorted(received.items()):
            seeds = self.peer_seeds.get(owner)
            idx = payload.tensors.get("idx")
            probs = payload.tensors.get("probs")
            if seeds is None or idx is None or probs is None:
                continue  # no seed set yet for this teacher, or not a teaching signal
            why = teacher_problem(idx, probs, payload.meta.get("acc", 1.0), len(seeds),
                                  self.ctx.num_classes, self.cfg.teacher_acc == "verified")
            if why is not None:  # a member's posteriors: refused by name, never learned from
                log.warning("%s: round %d: teacher %s left out: %s", self.ctx.peer_id, round,
                            owner, why)
                continue
            if self.cfg.teacher_acc == "verified":
                acc = verified_accuracy(probs, seeds.y[idx])
            else:
                acc = float(payload.meta.get("acc", 1.0))
            teachers.append((seeds, idx, probs, acc))
        metrics: dict[str, float] = {"teachers": float(len(teachers))}
        if self.cfg.teacher_acc == "verified" and teachers:
            metrics["verified_teacher_acc"] = sum(t[3] for t in teachers) / len(teachers)
        g_loc = self._local_reference()  # consumed even without teachers: the next step starts afresh
        if not teachers:
            return metrics

        params = self._params()
        self.model.train()
        self.global_opt.zero_grad(set_to_none=True)
        total = self._mimicry_backward(teachers)
        g_pub = flat_grads(params)
        if g_loc is None:  # no local step since the last global one: nothing to protect
            g_loc = torch.zeros_like(g_pub)
        cos = float(torch.nn.functional.cosine_similarity(g_pub, g_loc, dim=0, eps=1e-12))
        if self.cfg.projection == "qp":
            g, projected = project(g_pub, g_loc)
        elif self.cfg.projection == "pcgrad":
            g, projected = pcgrad(g_pub, g_loc), cos < 0
        else:
            g, projected = g_pub, False
        write_grads(params, g)
        self._global_step()
        metrics.update(mimicry_loss=total, cos_pub_loc=cos, projected=float(projected))
        return metrics

    def _mimicry_backward(self, teachers: list) -> float:
        """Backpropagate (1/T) sum_j mimicry_loss_j over the T teachers; return its value.

        Where no layer couples the samples of a batch in training (no batch norm),
        the teachers' batches go through the model as one batch: the same loss and
        gradient as one pass per teacher, with a T-th of the per-call overhead."""
        device = self.ctx.device
        xs = [torch.from_numpy(seeds.x[idx]) for seeds, idx, _, _ in teachers]
        fused = (len(teachers) > 1 and len({x.shape[1:] for x in xs}) == 1
                 and not any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                             for m in self.model.modules()))
        if fused:
            logits = self.model(torch.cat(xs).to(device)).split([len(x) for x in xs])
        total = 0.0
        losses = []
        for j, (seeds, idx, probs, acc) in enumerate(teachers):
            y = torch.from_numpy(seeds.y[idx]).to(device) if self.cfg.ce_on_public else None
            teacher = torch.tensor(probs, device=device)  # decoded frames are read-only: copy
            student = logits[j] if fused else self.model(xs[j].to(device))
            loss = mimicry_loss(student, teacher, y, acc, self.cfg.kl) / len(teachers)
            if fused:
                losses.append(loss)
            else:
                loss.backward()
            total += float(loss.detach())
        if fused:
            torch.stack(losses).sum().backward()
        return total

    def _global_step(self) -> None:
        """theta <- theta - eta * g~ (Algorithm 1's last line) with the global optimizer;
        a shared optimizer steps at lr eta, then returns to the local lr beta."""
        if self.global_opt is not self.optimizer:
            self.global_opt.step()
            return
        local_lrs = [group["lr"] for group in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.eta
        try:
            self.optimizer.step()
        finally:
            for group, lr in zip(self.optimizer.param_groups, local_lrs, strict=True):
                group["lr"] = lr

    # ------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "teach_gen": self._teach_gen.get_state(),
                 "grad_count": self._grad_count}
        if self.global_opt is not self.optimizer:
            state["global_opt"] = self.global_opt.state_dict()
        # g_loc gathered since the last global step (global_every > 1 spans rounds)
        for key, value in (("anchor", self._anchor), ("grad_sum", self._grad_sum)):
            if value is not None:
                state[key] = value.cpu()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.global_opt is not self.optimizer:
            if "global_opt" not in state:
                raise ValueError("checkpoint has no global optimizer state: it was written "
                                 "with algorithm.global_optimizer: shared")
            load_optimizer(self.global_opt, state["global_opt"], "the global optimizer")
        self._teach_gen.set_state(state["teach_gen"])
        device = self.ctx.device
        self._anchor = state["anchor"].to(device) if "anchor" in state else None
        self._grad_sum = state["grad_sum"].to(device) if "grad_sum" in state else None
        self._grad_count = int(state.get("grad_count", 0))
