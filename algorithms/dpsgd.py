"""DP-SGD (Abadi et al., CCS 2016) for local training on private data, with Opacus.

Each step samples a batch by Poisson sampling (every private sample joins
independently with probability ``q = batch_size / N``), computes per-sample
gradients (Opacus's ``GradSampleModule`` hooks), clips each to L2 norm
``clip_norm`` and adds Gaussian noise of std ``noise_multiplier * clip_norm``
to their sum (Opacus's ``DPOptimizer``), then lets the peer's own optimizer
step. That is the Poisson-subsampled Gaussian mechanism that
:func:`hfl.algorithms.dp.composed_epsilon` accounts for.

Two things differ from Opacus's defaults, both so that nothing in the config
predicts the randomness: the noise and the Poisson sampling come from the OS
CSPRNG (:func:`hfl.algorithms.dp.secure_normal`, ``secure_uniform``), not
from torch's global generator (which hfl seeds from ``node.seed``), and a step
whose Poisson batch is empty still takes its noise-only step (skipping it would
make its output depend on whether one sample was there).

Models with BatchNorm mix samples within a batch and cannot be trained with
per-sample clipping; they are refused with the layers named.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from hfl.algorithms.dp import secure_normal, secure_uniform


def unsupported_layers(model: nn.Module) -> list[str]:
    """The layers of ``model`` that DP-SGD cannot train (by name and type), or [];
    Opacus's validator decides which."""
    from opacus.validators import ModuleValidator

    if not ModuleValidator.validate(model, strict=False):
        return []
    return [f"{name} ({type(m).__name__})" for name, m in model.named_modules()
            if name and not list(m.children()) and ModuleValidator.validate(m, strict=False)]


class DPSGD:
    """Poisson-sampled, per-sample-clipped, noised steps on ``model`` with ``optimizer``
    (which keeps its own state and checkpoints as before)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, batch_size: int,
                 dataset_size: int, noise_multiplier: float, clip_norm: float):
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer
        from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

        bad = unsupported_layers(model)
        if bad:
            shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
            raise ValueError(f"dp_sgd: the model has layers DP-SGD cannot train: {shown} "
                             "(BatchNorm mixes the samples of a batch, so clipping each sample's "
                             "gradient bounds nothing); choose a model without them (e.g. mlp)")
        if dataset_size < 1:
            raise ValueError("algorithm.dp_sgd: no private samples to train on")

        class _SecureNoise(DPOptimizer):
            def add_noise(self) -> None:
                std = self.noise_multiplier * self.max_grad_norm
                for p in self.params:
                    _check_processed_flag(p.summed_grad)
                    noise = secure_normal(p.summed_grad.shape).to(p.summed_grad) * std
                    p.grad = (p.summed_grad + noise).view_as(p)
                    _mark_as_processed(p.summed_grad)

        self.model = model
        self.module = GradSampleModule(model, loss_reduction="mean")  # hooks on model's layers
        self.batch_size = int(batch_size)
        self.sample_rate = min(1.0, batch_size / dataset_size)
        self.steps_per_epoch = max(1, round(1 / self.sample_rate))
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self.optimizer = optimizer
        self.dp_optimizer = _SecureNoise(optimizer, noise_multiplier=noise_multiplier,
                                         max_grad_norm=clip_norm, expected_batch_size=self.batch_size,
                                         loss_reduction="mean")

    def train(self, ds, steps: int, device: torch.device,
              loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
        """``steps`` DP-SGD steps on ``ds``; the mean loss over the samples seen."""
        x_all = torch.from_numpy(np.ascontiguousarray(ds.x))
        y_all = torch.from_numpy(np.ascontiguousarray(ds.y))
        self.model.train()
        total, count = 0.0, 0
        for _ in range(steps):
            idx = torch.from_numpy(np.flatnonzero(secure_uniform(len(ds)) < self.sample_rate))
            self.dp_optimizer.zero_grad(set_to_none=True)
            if len(idx) == 0:
                self._noise_only_step()
                continue
            x, y = x_all[idx].to(device), y_all[idx].to(device)
            loss = loss_fn(x, y)
            with warnings.catch_warnings():  # Opacus's hooks on a first layer whose input needs no grad
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss.backward()
            self.dp_optimizer.step()
            total += float(loss.detach()) * len(y)
            count += len(y)
        self.dp_optimizer.zero_grad(set_to_none=True)  # drop per-sample gradients between rounds
        return total / max(count, 1)

    def _noise_only_step(self) -> None:
        std = self.noise_multiplier * self.clip_norm / self.batch_size
        for p in self.dp_optimizer.params:
            p.grad = (secure_normal(p.shape) * std).to(p)
        self.optimizer.step()
