"""The Gaussian mechanism on released prototypes, and its privacy accountant.

FedHP (Kuang & Mi) adds Gaussian noise to the local embedding vectors (eq. 3,
Lemma 1) so that the aggregated global prototypes are (epsilon, delta)-DP. What
a peer releases per round is, per class j, a row ``r_j`` and a weight ``w_j``
(see :func:`hfl.algorithms.prototypes.release_rows`): ``(sum of clipped
embeddings, count)`` for the count-weighted mean, ``(mean of clipped
embeddings, 1 if held)`` for the unweighted one. Every embedding is clipped to
L2 norm ``C`` first.

Sensitivity (neighbouring datasets differ by adding or removing one sample):
only the sample's class j changes. Weighted: ``r_j`` moves by the clipped
sample, at most ``C``, and ``w_j`` by 1. Unweighted: if the class already had
``n >= 1`` samples the mean moves by at most ``2C / (n + 1) <= C`` and ``w_j``
not at all; if it had none, ``r_j`` goes from 0 to a vector of norm ``<= C``
and ``w_j`` from 0 to 1. So with rows scaled by ``1 / C`` the released vector
``(r / C, w)`` has L2 sensitivity at most ``sqrt(2)`` in both cases, and adding
``N(0, (z sqrt(2))^2)`` to every coordinate (``z sqrt(2) C`` on the rows,
``z sqrt(2)`` on the weights) is the Gaussian mechanism with noise multiplier
``z`` (noise std / sensitivity).

Noise split (Lemma 1): under a secure sum the aggregator sees only the sum of
at least ``k`` honest releases, so each peer adds ``1 / k`` of the variance and
the sum carries the full noise; ``k`` is the guaranteed number of honest
contributors (``m_min`` minus the colluders tolerated, docs/fedhp.md).

Where the noise comes from: the operating system's CSPRNG (``os.urandom``),
fresh for every release (:func:`secure_normal`), never a generator seeded from
the config or restored from a checkpoint. Noise anyone can regenerate protects
nothing: a peer's clean release would be its noisy one minus the noise.
(Caveat, as for every floating-point Gaussian sampler: the float64 samples are
not exactly Gaussian in their lowest bits (Mironov 2012; Jin et al. 2022);
releases are quantized to ``frac_bits`` before they leave a peer under a
secure sum, which discards those bits.)

What the sensitivity argument needs: the map from a sample to its projection
must not itself depend on the private data, or removing one sample also moves
every other sample's projection. FedHP trains the encoder and projection head
on the same private data, so the bound holds for the releases *given* the
trained weights only if the training is itself differentially private. With
DP-SGD (:mod:`hfl.algorithms.dpsgd`: Poisson-subsampled Gaussian steps) every
release is a Gaussian mechanism applied after a DP computation, and the
epsilon of everything that left the peer is the adaptive composition of all
DP-SGD steps taken before the last release with all releases
(:func:`composed_epsilon`). Without DP-SGD no epsilon is reported as a
guarantee (FedHP reports ``dp_epsilon: null`` with the reason).

Accounting: each release is one Gaussian mechanism with multiplier ``z`` on
the peer's whole private set (no sub-sampling: prototypes use all of it); each
DP-SGD step one Poisson-subsampled Gaussian with rate ``q`` and multiplier
``sigma``. Epsilon for the configured delta comes from Google's
``dp-accounting``: its Renyi-DP accountant by default, its
privacy-loss-distribution accountant as an option.

Durability (:class:`PrivacyLedger`): a release is counted and the count is on
disk (fsynced) *before* the release is handed to the network, so a crash can
make the accountant over-count, never forget a release.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

SENSITIVITY = math.sqrt(2.0)  # of (r / C, w), add/remove one sample


def secure_uniform(n: int) -> np.ndarray:
    """``n`` float64 uniforms in [0, 1) with 53 random bits each, from ``os.urandom``."""
    raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    return (raw >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def secure_normal(shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """Standard normal float64 samples (CPU) from the OS CSPRNG, by Box-Muller."""
    n = math.prod(shape)
    m = (n + 1) // 2
    u1 = 1.0 - secure_uniform(m)  # (0, 1]: log is finite
    u2 = secure_uniform(m)
    r = np.sqrt(-2.0 * np.log(u1))
    z = np.concatenate([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)])[:n]
    return torch.from_numpy(z).reshape(tuple(shape))


def noise_stds(noise_multiplier: float, clip_norm: float, split: int = 1) -> tuple[float, float]:
    """Per-peer noise std on (rows, weights) so that the sum of ``split`` peers'
    noise is the Gaussian mechanism with multiplier ``noise_multiplier``."""
    if noise_multiplier < 0 or clip_norm <= 0 or split < 1:
        raise ValueError("need noise_multiplier >= 0, clip_norm > 0, split >= 1")
    total = noise_multiplier * SENSITIVITY
    share = total / math.sqrt(split)
    return share * clip_norm, share


def add_noise(rows: torch.Tensor, weights: torch.Tensor, noise_multiplier: float, clip_norm: float,
              split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows + N(0, s_r^2), weights + N(0, s_w^2)) with :func:`noise_stds`; the noise
    is fresh from the OS CSPRNG (:func:`secure_normal`), drawn in float64."""
    if noise_multiplier == 0:
        return rows, weights
    s_rows, s_w = noise_stds(noise_multiplier, clip_norm, split)
    n_rows = secure_normal(rows.shape) * s_rows
    n_w = secure_normal(weights.shape) * s_w
    return (rows + n_rows.to(rows.device, rows.dtype), weights + n_w.to(weights.device, weights.dtype))


@functools.lru_cache(maxsize=4096)
def composed_epsilon(noise_multiplier: float, releases: int, delta: float, method: str = "rdp",
                     sgd_noise_multiplier: float = 0.0, sgd_sample_rate: float = 0.0,
                     sgd_steps: int = 0) -> float:
    """Epsilon for ``delta`` after ``releases`` Gaussian mechanisms with
    ``noise_multiplier`` composed with ``sgd_steps`` DP-SGD steps (Poisson sampling at
    ``sgd_sample_rate``, Gaussian noise ``sgd_noise_multiplier``), from dp-accounting:
    ``rdp`` (Renyi DP) or ``pld`` (privacy-loss distributions; k Gaussians with
    multiplier z are exactly one with multiplier z / sqrt(k))."""
    if releases <= 0 and sgd_steps <= 0:
        return 0.0
    if (releases > 0 and noise_multiplier <= 0) or (sgd_steps > 0 and sgd_noise_multiplier <= 0):
        return math.inf
    from dp_accounting import dp_event

    _quiet_excluded_orders()

    if method == "rdp":
        from dp_accounting.rdp import rdp_privacy_accountant

        acc = rdp_privacy_accountant.RdpAccountant()
        if releases > 0:
            acc.compose(dp_event.GaussianDpEvent(noise_multiplier), releases)
    elif method == "pld":
        from dp_accounting.pld import pld_privacy_accountant

        acc = pld_privacy_accountant.PLDAccountant()
        if releases > 0:
            acc.compose(dp_event.GaussianDpEvent(noise_multiplier / math.sqrt(releases)))
    else:
        raise ValueError(f"accountant must be rdp or pld, got {method!r}")
    if sgd_steps > 0:
        step = dp_event.PoissonSampledDpEvent(sgd_sample_rate, dp_event.GaussianDpEvent(sgd_noise_multiplier))
        acc.compose(step, sgd_steps)
    return float(acc.get_epsilon(delta))


class _ExcludedOrder(logging.Filter):
    """dp-accounting logs (through absl) each fractional Renyi order whose series does
    not converge for a subsampled Gaussian and leaves that order out: the epsilon is
    still a valid upper bound, and a peer would log it every round."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Excluding this order" not in record.getMessage()


def _quiet_excluded_orders() -> None:
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _ExcludedOrder) for f in absl.filters):
        absl.addFilter(_ExcludedOrder())


@dataclass(frozen=True)
class Accountant:
    """Epsilon for ``delta`` after k Gaussian releases with ``noise_multiplier``, composed
    with the DP-SGD steps taken before the last of them (``sgd_*``; none by default)."""

    noise_multiplier: float
    delta: float
    method: str = "rdp"
    sgd_noise_multiplier: float = 0.0
    sgd_sample_rate: float = 0.0

    def epsilon(self, releases: int, sgd_steps: int = 0) -> float:
        return composed_epsilon(float(self.noise_multiplier), int(releases), float(self.delta),
                                self.method, float(self.sgd_noise_multiplier),
                                float(self.sgd_sample_rate), int(sgd_steps))


class Store(Protocol):
    """A durable small-file store the runtime hands an algorithm (``ctx.store``)."""

    def write(self, name: str, data: bytes) -> None: ...  # on disk (fsynced) on return

    def read(self, name: str) -> bytes | None: ...


class PrivacyLedger:
    """The count of releases (and of the DP-SGD steps before the last one), written to
    the peer's store before a release leaves, so that a restart never forgets one.
    Without a store (an in-process simulation) it lives in memory only."""

    NAME = "privacy_ledger.json"

    def __init__(self, store: Store | None):
        self.store = store
        self.releases = 0
        self.sgd_steps = 0  # DP-SGD steps taken before the last release
        data = store.read(self.NAME) if store is not None else None
        if data is not None:
            try:
                saved = json.loads(data)
                self.releases, self.sgd_steps = int(saved["releases"]), int(saved["sgd_steps"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{self.NAME} is unreadable ({exc}): it counts this peer's "
                                 "privacy releases and cannot be guessed; restore it or start "
                                 "the run afresh") from None

    def record(self, sgd_steps: int) -> None:
        """Count one more release after ``sgd_steps`` DP-SGD steps; durable on return."""
        self.releases += 1
        self.sgd_steps = int(sgd_steps)
        if self.store is not None:
            self.store.write(self.NAME, json.dumps(
                {"releases": self.releases, "sgd_steps": self.sgd_steps}).encode())

    def merge(self, state: dict[str, Any]) -> None:
        """After a checkpoint loads: keep the larger count (the ledger may be ahead)."""
        if int(state.get("releases", 0)) > self.releases:
            self.releases = int(state["releases"])
            self.sgd_steps = int(state.get("sgd_steps", 0))
