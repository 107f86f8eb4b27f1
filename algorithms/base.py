"""The algorithm interface: a few hooks the runtime calls each round.

Algorithms are plain synchronous PyTorch/numpy code: no sockets, no event loop,
no clock. The runtime (``hfl.peer``) owns the round loop and calls, per round:

1. ``local_update(round)`` – train on private data;
2. ``share(round)`` – what leaves the peer this round (a :class:`Payload`, or None);
3. by ``mode``:
   - ``"local"``: nothing is exchanged;
   - ``"broadcast"``: the payload goes to every live peer, and
     ``absorb(round, {peer: payload})`` receives what the peers sent;
   - ``"aggregator"``: the payload goes to the round's elected aggregator,
     whose ``aggregate(round, {peer: payload})`` returns one result, which every
     peer receives through ``absorb(round, {aggregator: result})``;
4. ``evaluate()`` – metrics for the round.

Knowledge is a dict of named numpy arrays plus small metadata, so the same hooks
carry weights, posteriors, heads, prototypes or feature batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from hfl.algorithms.payload import Payload  # noqa: F401 (re-exported: where methods find it)
from hfl.algorithms.settings import SelectionConfig, TrainConfig
from hfl.algorithms.training import evaluate, load_optimizer, make_optimizer, train_epochs

Mode = Literal["local", "broadcast", "aggregator"]


@dataclass
class AlgorithmContext:
    """Everything an algorithm instance works with; built by the peer runtime."""

    peer_id: str
    model: nn.Module  # an hfl.models.HflModel: .features (-> E), .head (E -> C)
    train: Any  # hfl.data.ArrayDataset
    test: Any  # hfl.data.ArrayDataset (the peer's own test split)
    num_classes: int
    device: torch.device
    seed: int
    rounds: int = 1  # the cohort's number of rounds (schedules such as CHFL's temperature)
    train_cfg: TrainConfig = field(default_factory=TrainConfig)
    extra_tests: dict[str, Any] = field(default_factory=dict)  # e.g. {"global": ds}
    public: Any = None  # this peer's public seed split, published to the cohort
    val: Any = None  # validation split: model selection
    selection: SelectionConfig = field(default_factory=SelectionConfig)  # what selection judges on
    # Multi-domain evaluation (FedH2L's protocol): every domain's test split by
    # domain name, and which one is this peer's own.
    domain_tests: dict[str, Any] = field(default_factory=dict)
    own_domain: str | None = None
    cohort_seed: int = 0  # shared by the cohort: what every peer derives alike (public batches)
    # The run signatures bind to (the cohort's ``name#run`` where cohort.run is set, else
    # ""): what a method's own signed statements name (FedHP's attestations)
    run: str = ""
    label_noise_rate: float | None = None  # realised share of noisy private labels (data.label_noise)
    # Durable small files in the peer's run directory (hfl.algorithms.dp.Store: write() is
    # fsynced on return, read() gives None when absent); None in an in-process simulation.
    store: Any = None


@dataclass(frozen=True)
class NoConfig:
    """For algorithms without options of their own."""


class Algorithm:
    """Base class. Subclasses set ``name`` and ``mode`` and override hooks."""

    name: ClassVar[str] = ""
    mode: ClassVar[Mode] = "local"
    Config: ClassVar[type] = NoConfig
    #: True if the method needs every peer's public seed set (the runtime then
    #: publishes ``ctx.public`` and hands peers' sets to ``add_peer_seeds``).
    uses_public_seeds: ClassVar[bool] = False
    #: True if ``cohort.overlap`` may run the next round's ``local_update`` before this
    #: round's ``absorb`` (broadcast mode): the method's absorb is a step of its own on
    #: the model, not a replacement of it (an aggregate absorbed after the next local
    #: step would undo that step).
    overlaps_local_step: ClassVar[bool] = False

    def __init__(self, ctx: AlgorithmContext, cfg: Any = None):
        self.ctx = ctx
        self.cfg = cfg if cfg is not None else self.Config()
        self.model = ctx.model.to(ctx.device)
        self.optimizer = make_optimizer(self.model.parameters(), ctx.train_cfg)
        self.generator = torch.Generator().manual_seed(ctx.seed)  # batch order
        self.peer_seeds: dict[str, Any] = {}  # owner -> ArrayDataset
        self._with_public: tuple[tuple[str, ...], Any] | None = None  # cache of private_and_public()
        self.best_val = -1.0
        self.selected: dict[str, float] = {}  # test metrics of the best-validation model
        self.selected_model: dict[str, torch.Tensor] | None = None  # its weights, on the CPU
        self._selection_set = None  # cache of selection_set() for pooled splits

    # ------------------------------------------------------------------ hooks

    def loss(self, x: torch.Tensor, y: torch.Tensor, round: int) -> torch.Tensor:
        """Per-batch training loss; plain cross-entropy unless overridden."""
        return nn.functional.cross_entropy(self.model(x), y)

    def local_data(self):
        """What ``local_update`` trains on: the private split, unless a method adds to it."""
        return self.ctx.train

    def private_and_public(self):
        """The private split plus our public split plus every peer's public seed set
        received so far; rebuilt only when a new seed set arrives."""
        owners = tuple(sorted(self.peer_seeds))
        if self._with_public is None or self._with_public[0] != owners:
            ctx = self.ctx
            parts = [ctx.train, *([ctx.public] if ctx.public is not None else []),
                     *(self.peer_seeds[o] for o in owners)]
            self._with_public = (owners, pooled(parts, ctx.num_classes, "private+public"))
        return self._with_public[1]

    def local_update(self, round: int) -> dict[str, float]:
        train_loss = train_epochs(
            self.model, self.local_data(), self.optimizer, self.ctx.train_cfg,
            self.ctx.device, self.generator, lambda x, y: self.loss(x, y, round),
            self.before_step_hook(round),
        )
        return {"train_loss": train_loss}

    def before_step_hook(self, round: int) -> Callable[[], None] | None:
        """Called after each batch's backward, before the optimizer steps (None: nothing)."""
        return None

    def share(self, round: int) -> Payload | None:
        return None

    def aggregate(self, round: int, contributions: dict[str, Payload]) -> Payload | None:
        return None

    def absorb(self, round: int, received: dict[str, Payload]) -> dict[str, float]:
        return {}

    def add_peer_seeds(self, owner: str, x: np.ndarray, y: np.ndarray) -> None:
        """A peer's complete public seed set arrived (called between rounds)."""
        from hfl.data import ArrayDataset

        self.peer_seeds[owner] = ArrayDataset(x, y, self.ctx.num_classes, name=f"seeds@{owner}")

    def evaluate(self) -> dict[str, float]:
        """Test metrics; with domains, FedH2L's ACC / BWT / FWT; with a validation
        split, also the test metrics of the model that did best on validation."""
        ctx = self.ctx
        metrics = {}
        metrics["test_acc"], metrics["test_loss"] = evaluate(self.model, ctx.test, ctx.device)
        if ctx.label_noise_rate is not None:
            metrics["label_noise_rate"] = ctx.label_noise_rate
        for name, ds in ctx.extra_tests.items():
            metrics[f"{name}_acc"], metrics[f"{name}_loss"] = evaluate(self.model, ds, ctx.device)
        if ctx.domain_tests:
            correct = {d: evaluate(self.model, ds, ctx.device)[0] * len(ds)
                       for d, ds in ctx.domain_tests.items()}
            sizes = {d: len(ds) for d, ds in ctx.domain_tests.items()}
            others = [d for d in correct if d != ctx.own_domain]
            metrics["acc"] = sum(correct.values()) / sum(sizes.values())  # all domains
            if ctx.own_domain in correct:
                metrics["bwt"] = correct[ctx.own_domain] / sizes[ctx.own_domain]  # own domain
            if others:
                metrics["fwt"] = sum(correct[d] for d in others) / sum(sizes[d] for d in others)
        selection_set = self.selection_set()
        if selection_set is not None:
            # val_acc: accuracy on the selection set (selection.on; the validation split by default)
            metrics["val_acc"] = evaluate(self.model, selection_set, ctx.device)[0]
            better = metrics["val_acc"] > self.best_val
            if better or (ctx.selection.keep == "last" and metrics["val_acc"] == self.best_val):
                self.best_val = metrics["val_acc"]
                self.selected = {k: v for k, v in metrics.items()
                                 if k in ("acc", "bwt", "fwt", "test_acc", "global_acc")}
                self.selected_model = {k: v.detach().to("cpu", copy=True)
                                       for k, v in self.model.state_dict().items()}
                metrics["newly_selected"] = 1.0  # this round's model is the selected one (hfl-export)
            metrics.update({f"sel_{k}": v for k, v in self.selected.items()})
        return metrics

    def selection_set(self):
        """The data model selection judges on (``selection.on``), or None if there is
        none: the validation split, or it pooled with the peer's public and private
        splits. Only the peer's own data: other domains' validation data is not its."""
        ctx = self.ctx
        if ctx.selection.on == "val":
            return ctx.val if ctx.val is not None and len(ctx.val) else None
        if self._selection_set is None:
            splits = {"val": ctx.val, "public": ctx.public, "private": ctx.train}
            parts = [splits[n] for n in ctx.selection.on.split("+")
                     if splits[n] is not None and len(splits[n])]
            self._selection_set = pooled(parts, ctx.num_classes, ctx.selection.on) if parts else None
        return self._selection_set

    #: ``aggregate`` changes nothing but its result, so it may run again on part of the
    #: contributions (after one raised, to find the member whose payload makes it raise:
    #: RoundProcedures.on_members_payloads); a method whose aggregate keeps state says False.
    aggregate_is_pure = True

    def handshake_info(self) -> dict[str, int]:
        """Dimensions peers must agree on (sent in the hello; nothing else)."""
        return {}

    # An aggregator-mode method can also run with no aggregator at all: every peer
    # sends its knowledge to every other and computes ``aggregate`` itself
    # (``cohort.aggregate_at: every_peer``), so no elected peer can set the model.

    def aggregates_everywhere_by_default(self) -> bool:
        """True where what is shared is small (heads, prototypes, logits): then every
        peer aggregating for itself costs little and is the default."""
        return False

    def why_not_everywhere(self) -> str | None:
        """Why this configuration needs one elected aggregator (None: it does not)."""
        return None

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values only: checkpoints load with weights_only=True."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "best_val": self.best_val,
            "selected": dict(self.selected),
            "selected_model": self.selected_model,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        load_optimizer(self.optimizer, state["optimizer"])
        self.generator.set_state(state["generator"])
        self.best_val = float(state.get("best_val", -1.0))
        self.selected = dict(state.get("selected", {}))
        self.selected_model = state.get("selected_model")


# ---------------------------------------------------------------------- helpers


#: cohort.aggregate_at auto: every peer aggregates for itself in cohorts up to this size
#: (node.min_peers), whatever it shares: no elected aggregator can set the model (one
#: malicious member among them is outvoted, not obeyed). Above it, full weights go
#: through one elected aggregator (O(n) bytes a round instead of O(n^2)), which the
#: cohort then trusts for its rounds (docs/security.md, "Defaults").
EVERY_PEER_UP_TO = 16


def aggregates_everywhere(aggregate_at: str, algorithm: Algorithm, cohort_size: int = 1) -> bool:
    """Whether an aggregator-mode ``algorithm`` runs with every peer aggregating for
    itself (``cohort.aggregate_at``); ValueError when asked for and impossible.
    ``cohort_size``: node.min_peers, the cohort the peer expects (for ``auto``)."""
    if algorithm.mode != "aggregator":
        return False
    why = algorithm.why_not_everywhere()
    if aggregate_at == "every_peer":
        if why is not None:
            raise ValueError(f"aggregate_at: every_peer is impossible here: {why}")
        return True
    if aggregate_at == "aggregator":
        return False
    return why is None and (algorithm.aggregates_everywhere_by_default()
                            or cohort_size <= EVERY_PEER_UP_TO)


def pooled(parts, num_classes: int, name: str):
    """One ArrayDataset holding the samples of ``parts`` (ArrayDatasets), in order."""
    from hfl.data import ArrayDataset

    return ArrayDataset(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]),
                        num_classes, name=name)


def module_to_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """A module's state as CPU numpy arrays (copies), keyed by state-dict name."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def arrays_to_module(module: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load arrays into a module, checking names and shapes first."""
    own = module.state_dict()
    missing = sorted(set(own) - set(arrays))
    unexpected = sorted(set(arrays) - set(own))
    if missing or unexpected:
        raise ValueError(f"state mismatch: missing {missing}, unexpected {unexpected}")
    for k, v in own.items():
        if tuple(arrays[k].shape) != tuple(v.shape):
            raise ValueError(f"{k}: shape {tuple(arrays[k].shape)} != {tuple(v.shape)}")
    module.load_state_dict(
        {k: torch.as_tensor(np.array(arrays[k]), dtype=own[k].dtype) for k in own}
    )
