"""The one training loop every algorithm uses, plus evaluation."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import nn

from hfl.algorithms.settings import TrainConfig


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(
        params, lr=cfg.lr, weight_decay=cfg.weight_decay, amsgrad=cfg.optimizer == "amsgrad"
    )


class OptimizerChanged(ValueError):
    """A checkpoint's optimizer state is of another kind than the config builds."""


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict, what: str = "optimizer") -> None:
    """A checkpoint's optimizer state (momentum buffers, Adam's moments and step counts)
    under the settings the optimizer was built with now. ``load_state_dict`` alone also
    puts back the saved lr, momentum and weight decay: a run resumed with a new
    ``train.lr`` trained on at the old one while every record named the new one (a
    review of the results). ValueError, naming ``what``, for another kind of optimizer,
    whose state cannot go on (sgd -> adam raised in the next step)."""
    now = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    saved = [{k: v for k, v in g.items() if k != "params"} for g in state.get("param_groups", [])]

    def kind(group: dict) -> tuple:  # (what tells the optimizers apart; a torch version
        # may add a setting, which its load_state_dict takes: the key sets may differ)
        return ("betas" in group, "momentum" in group, bool(group.get("amsgrad")))

    if len(saved) != len(now) or any(kind(a) != kind(b) for a, b in zip(saved, now, strict=False)):
        raise OptimizerChanged(f"{what}: the checkpoint's optimizer is of another kind than "
                               f"train.optimizer builds ({type(optimizer).__name__}); it cannot "
                               "change on resume")
    optimizer.load_state_dict(state)
    for group, settings in zip(optimizer.param_groups, now, strict=True):
        group.update(settings)


def batches(ds, batch_size: int, generator: torch.Generator | None, shuffle: bool = True):
    """Yield (x, y) CPU tensors from an ArrayDataset in a seeded order.

    When shuffling (training), a last batch of a single sample joins the one
    before it: BatchNorm cannot train on one sample, and dropping it would
    lose data.
    """
    n = len(ds)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    x_all = torch.from_numpy(np.ascontiguousarray(ds.x))
    y_all = torch.from_numpy(np.ascontiguousarray(ds.y))
    starts = list(range(0, n, batch_size))
    if shuffle and len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else n
        idx = order[start:end]
        yield x_all[idx], y_all[idx]


def train_epochs(
    model: nn.Module,
    ds,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    device: torch.device,
    generator: torch.Generator,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    before_step: Callable[[], None] | None = None,
) -> float:
    """Run ``cfg.local_epochs`` epochs (or ``cfg.max_batches`` batches). Returns mean loss.

    ``before_step`` runs between ``backward`` and ``optimizer.step``: a method that
    reshapes the gradients (FedIN's gradient alleviation) does it there."""
    model.train()
    total, count, steps = 0.0, 0, 0
    for _ in range(cfg.local_epochs):
        for x, y in batches(ds, cfg.batch_size, generator):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(x, y)
            loss.backward()
            if before_step is not None:
                before_step()
            optimizer.step()
            total += float(loss.detach()) * len(y)
            count += len(y)
            steps += 1
            if cfg.max_batches is not None and steps >= cfg.max_batches:
                return total / max(count, 1)
    return total / max(count, 1)


@torch.no_grad()
def evaluate(model: nn.Module, ds, device: torch.device, batch_size: int = 512) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``model`` on ``ds``."""
    if ds is None or len(ds) == 0:
        return float("nan"), float("nan")
    model.eval()
    correct, loss, n = 0, 0.0, 0
    for x, y in batches(ds, batch_size, None, shuffle=False):
        x, y = x.to(device), y.to(device)
        logits = model(x)  # (B, C)
        loss += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        n += len(y)
    return correct / n, loss / n
