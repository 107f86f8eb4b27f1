"""``fedhp``: FedHP (Kuang & Mi, "FedHP: Heterogeneous Federated Learning with
Privacy-preserving"): class prototypes in a projection space, a contrastive
loss to the global prototypes, Gaussian differential privacy and a
threshold-homomorphic secure sum.

Model (Sec. 3.1, eq. 6): the zoo model's body is the encoder ``r(x)``
(optionally loaded from a local torchvision-style state dict and frozen, the
paper's pre-trained backbone); its head is replaced by :class:`ProtoHead`, a
projection ``z = normalize(h(r(x)))`` to a ``proto_dim``-dimensional space and
a decision head (``head_layers`` fully connected layers) on ``z``.

Prototypes (eq. 7-9): local prototype = mean ``z`` per class; the global
prototype of class j is the count-weighted mean over peers (``weighted: true``,
eq. 8 without its stray ``1/|N_j|`` factor, which would shrink every prototype
by the class's sample count) or the plain mean over the peers that hold j
(``weighted: false``, as in the authors' code). Each peer releases per class
``(r_j, w_j)`` (:func:`hfl.algorithms.prototypes.release_rows`); the aggregate
is ``sum_i r_ij / sum_i w_ij``.

Local loss (eq. 10-12): ``CE + lam * L_R`` with ``L_R`` the InfoNCE of ``z``
against the global prototypes with cosine similarity / temperature (paper:
cosine, t = 1; ``distance: l2 | l1`` as options).

Privacy (Sec. 2.2 eq. 3, 3.2 Lemma 1, hfl.algorithms.dp): every ``z`` is
clipped to ``clip_norm``, each release gets Gaussian noise with multiplier
``noise_multiplier`` from the OS CSPRNG (sensitivity reasoning in
hfl.algorithms.dp), split over ``noise_split`` peers when a secure sum hides
the individual releases. The sensitivity bound needs the encoder and
projection to be trained with DP-SGD (``dp_sgd``, hfl.algorithms.dpsgd);
then an accountant (dp-accounting) reports the epsilon of the DP-SGD steps
composed with the releases, and a peer whose next release would exceed
``epsilon_max`` stops sharing (it still helps decrypt). Without DP-SGD the
metrics say ``dp_epsilon: null`` and why (the paper's gap: its encoder trains
on the private data without DP). Each release is counted on disk before it
leaves (hfl.algorithms.dp.PrivacyLedger).

Secure sum (``secure_sum``): ``off`` — releases travel in the clear (FedProto's
wire format); ``paillier`` — threshold Paillier (hfl.algorithms.threshold_he):
in round r each peer sends its encrypted release of round r and its decryption
share of round r-1's sum; each ciphertext carries its owner's attestation (an
Ed25519 signature that every key holder checks alike) and a zero-knowledge
proof that its owner knows the plaintext, bound to the key, the round and the
owner; the round-r aggregator leaves out (and names) every contribution whose
signature fails or that has no proof, multiplies the rest, combines >= t
shares of round r-1's product into the plaintext sum, and returns the new
product with its factors, their signatures and proofs and the global
prototypes of round r-1. Every peer checks each factor's signature and proof
itself, leaves out (and names) those that fail — the same ones for every peer
— and releases a share only for the product of the rest, recomputed, if they
are factors of distinct key holders, at least ``min_contributors``, once per
round: so no factor can be another's ciphertext inverted, an old ciphertext,
or another member's or round's (threshold_he's proofs). ``plaintext`` —
the same fixed-point arithmetic, timing and release policy without
encryption, for experiments: identical numbers, no confidentiality.
Deviation: with a secure sum the global prototypes lag one more round
(docs/fedhp.md).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hfl.algorithms import prototypes as P
from hfl.algorithms.base import Payload
from hfl.algorithms.dp import Accountant, PrivacyLedger, add_noise
from hfl.algorithms.fedproto import FedProto
from hfl.algorithms.registry import register
from hfl.algorithms.robust import WeightedRobustOptions
from hfl.models.heads import ProtoHead, build_head  # noqa: F401  (ProtoHead: its old home)

log = logging.getLogger("hfl.algorithms")

PLAIN_VALUE_BITS = 40  # fixed-point codes of the plaintext secure sum (as Packer's default)
NO_GUARANTEE = ("epsilon is not a guarantee here: the encoder and projection head train on the "
                "private data without DP-SGD, so one sample moves every release by more than the "
                "sensitivity the noise is scaled to; metrics report dp_epsilon: null (set "
                "algorithm.dp_sgd: true for an epsilon that covers training)")


@dataclass(frozen=True)
class FedHPConfig(WeightedRobustOptions):
    proto_dim: int = field(default=64, metadata={"min": 1, "help": "dimension d of the prototype space"})
    head_layers: int = field(default=1, metadata={"min": 1, "max": 4,
                                                  "help": "fully connected layers of the decision head"})
    normalize_decision: bool = field(
        default=False, metadata={"help": "the decision head reads the L2-normalised projection "
                                         "(default: the projection before normalisation)"})
    lam: float = field(default=1.0, metadata={"min": 0, "help": "weight of the contrastive loss (eq. 11)"})
    temperature: float = field(default=1.0, metadata={"gt": 0, "help": "t of eq. 10"})
    distance: Literal["cosine", "l2", "l1"] = "cosine"
    weighted: bool = field(default=True, metadata={"help": "count-weighted global prototypes (false: "
                                                           "plain mean over peers, the authors' code)"})
    inference: Literal["head", "nearest"] = field(
        default="head", metadata={"help": "test accuracy from the decision head or the nearest global prototype"})
    backbone_weights: str | None = field(
        default=None, metadata={"help": "state dict (.pt/.pth) loaded into the encoder: matching names and shapes"})
    freeze_backbone: bool = field(default=False, metadata={"help": "train only the heads"})
    clip_norm: float = field(default=1.0, metadata={"gt": 0, "help": "L2 bound of each projection"})
    noise_multiplier: float = field(default=0.0, metadata={"min": 0, "help": "Gaussian noise / sensitivity; 0: no DP"})
    delta: float = field(default=1e-5, metadata={"gt": 0, "lt": 1})
    epsilon_max: float | None = field(default=None, metadata={"gt": 0, "help": "stop sharing beyond this epsilon"})
    accountant: Literal["rdp", "pld"] = field(default="rdp", metadata={"help": "dp-accounting accountant"})
    secure_sum: Literal["off", "plaintext", "paillier"] = "off"
    key_dir: str | None = field(default=None, metadata={"help": "directory with <peer id>.json key shares (paillier)"})
    min_contributors: int = field(default=2, metadata={"min": 1, "help": "m_min: decrypt only sums of at least this many"})
    noise_split: int = field(default=1, metadata={"min": 1, "help": "each peer adds 1/noise_split of the noise variance"})
    frac_bits: int = field(default=16, metadata={"min": 4, "max": 30, "help": "fixed-point fraction bits"})
    dp_sgd: bool = field(default=False, metadata={
        "help": "train on private data with DP-SGD (Opacus): needed for epsilon to be a guarantee"})
    dp_sgd_noise_multiplier: float = field(default=1.0, metadata={
        "gt": 0, "help": "DP-SGD noise std / dp_sgd_clip_norm"})
    dp_sgd_clip_norm: float = field(default=1.0, metadata={"gt": 0, "help": "per-sample gradient L2 bound"})

    def validate(self) -> None:
        super().validate()
        # (the bounds a config file's loader checks, again for a config built in code: a
        # review's noise_split 0 with min_contributors 1 passed the paillier rule below)
        if self.noise_split < 1 or self.min_contributors < 1:
            raise ValueError(f"noise_split ({self.noise_split}) and min_contributors "
                             f"({self.min_contributors}) must be at least 1")
        if self.secure_sum != "off" and (self.robust != "mean" or self.max_weight_share is not None):
            raise ValueError(f"robust: {self.robust} / max_weight_share need secure_sum: off (got "
                             f"{self.secure_sum}): under a secure sum the aggregator sees only the "
                             "sum, not the contributions a robust rule compares")
        if self.noise_split > 1 and self.secure_sum != "paillier":
            raise ValueError(f"noise_split > 1 needs secure_sum: paillier (got {self.secure_sum}): "
                             "a release that travels in the clear must carry the full noise")
        if self.dp_sgd and self.noise_multiplier == 0:
            raise ValueError("dp_sgd needs noise_multiplier > 0: without noise the prototype "
                             "releases themselves are not private")
        if self.secure_sum == "paillier" and self.noise_split > self.min_contributors - 1:
            # The peer that decrypts a sum (the next round's aggregator) knows its own
            # release in it: what it learns of the others is a sum of min_contributors - 1
            # releases, which must carry the full noise (an attack review: noise_split =
            # min_contributors = 3 left it 2/3 of the variance, epsilon 39.8 reported 30.1).
            raise ValueError(f"noise_split ({self.noise_split}) must be <= min_contributors - 1 "
                             f"({self.min_contributors - 1}) under paillier: the peer that "
                             "decrypts a sum subtracts its own release, and the others' must "
                             "still carry the full noise (min_contributors 1 would decrypt a "
                             "single peer's release)")
        if self.epsilon_max is not None and self.noise_multiplier == 0:
            raise ValueError("epsilon_max needs noise_multiplier > 0 (without noise epsilon is infinite)")
        if self.secure_sum == "paillier" and not self.key_dir:
            raise ValueError("secure_sum: paillier needs key_dir (python -m hfl.peer.he_keys)")


def load_backbone(features: nn.Module, path: str | Path) -> tuple[list[str], list[str]]:
    """Load the entries of a state dict file whose names and shapes match ``features``
    (a ``features.`` or ``module.`` prefix is ignored); (loaded, skipped) names."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    own = features.state_dict()
    picked, skipped = {}, []
    for name, value in state.items():
        key = name.removeprefix("module.").removeprefix("features.")
        if key in own and tuple(own[key].shape) == tuple(value.shape):
            picked[key] = value
        else:
            skipped.append(name)
    if not picked:
        raise ValueError(f"{path}: no entry matches the encoder's names and shapes "
                         f"(encoder has e.g. {list(own)[:3]})")
    features.load_state_dict(picked, strict=False)
    return sorted(picked), skipped


class _Plain:
    """The secure sum's interface without encryption: codes are int64, the
    "product" is the sum, and a "decryption share" is the sum itself (t = 1)."""

    threshold = 1

    def __init__(self, frac_bits: int, parties_hint: int = 1024):
        from hfl.algorithms.threshold_he import Packer

        self.packer = Packer(plaintext_bits=1 << 20, max_summands=parties_hint, frac_bits=frac_bits,
                             value_bits=PLAIN_VALUE_BITS)

    def shape(self, count: int) -> tuple[tuple[int, ...], np.dtype]:
        return (count,), np.dtype(np.int64)

    def encrypt(self, codes: np.ndarray, round: int, sender: str) -> tuple[np.ndarray, None]:
        return codes.astype(np.int64), None

    def decode(self, arr: np.ndarray) -> list:
        if not isinstance(arr, np.ndarray) or arr.dtype != np.int64 or arr.ndim != 1:
            raise ValueError(f"expected int64 codes, got {getattr(arr, 'dtype', type(arr))}")
        if (arr < 0).any():
            raise ValueError("negative codes")
        return arr

    def product(self, parts: list[np.ndarray]) -> np.ndarray:
        return np.sum(np.stack(parts), axis=0, dtype=np.int64)

    def share(self, guard, key, ct: np.ndarray, **policy) -> tuple[np.ndarray, None]:
        guard.check(**policy)
        guard.released[policy["ct_round"]] = policy["ct_digest"]
        return np.array(ct), None

    def combine(self, shares: dict[int, np.ndarray], count: int) -> np.ndarray:
        first = shares[min(shares)]
        if first.shape != (count,):
            raise ValueError(f"{first.shape} codes, expected ({count},)")
        return first


class _Paillier:
    def __init__(self, key, frac_bits: int):
        from hfl.algorithms.threshold_he import Packer

        self.key = key
        self.pub = key.public
        self.threshold = self.pub.threshold
        self.packer = Packer(plaintext_bits=self.pub.bits - 1, max_summands=len(self.pub.parties),
                             frac_bits=frac_bits)

    def shape(self, count: int) -> tuple[tuple[int, ...], np.dtype]:
        return (self.packer.num_plaintexts(count), self.pub.ct_bytes), np.dtype(np.uint8)

    def encrypt(self, codes: np.ndarray, round: int, sender: str) -> tuple[np.ndarray, np.ndarray]:
        """(ciphertexts (k, W) uint8, the proof that ``sender`` knows their plaintexts in ``round``)."""
        from hfl.algorithms.threshold_he import proof_context, prove_plaintexts, to_bytes

        plain = self.packer.pack(codes)
        cts, rs = zip(*(self.pub.encrypt_with_randomness(m) for m in plain), strict=True)
        proof = prove_plaintexts(self.pub, proof_context(self.pub, round, sender), plain, rs, cts)
        return to_bytes(cts, self.pub.ct_bytes), proof

    def factor_problem(self, round: int, owner: str, ct: np.ndarray, proof: Any,
                       signature: Any) -> str | None:
        """Why ``ct`` is not a factor ``owner`` made in ``round``: its signature, or its
        proof of plaintext knowledge, fails. Every key holder gets the same answer."""
        from hfl.algorithms.threshold_he import digest, proof_context, verify_plaintexts

        why = self.key.verify_attestation(round, owner, digest(ct), signature)
        if why is not None:
            return why
        try:
            cts = self.decode(ct)
        except ValueError as exc:
            return str(exc)
        return verify_plaintexts(self.pub, proof_context(self.pub, round, owner), cts, proof)

    def decode(self, arr: np.ndarray) -> list[int]:
        from hfl.algorithms.threshold_he import from_bytes

        return from_bytes(arr, self.pub)

    def product(self, parts: list[np.ndarray]) -> np.ndarray:
        from hfl.algorithms.threshold_he import to_bytes

        cts = [self.decode(p) for p in parts]
        return to_bytes([self.pub.add(col) for col in zip(*cts, strict=True)], self.pub.ct_bytes)

    def share(self, guard, key, ct: np.ndarray, **policy) -> tuple[np.ndarray, np.ndarray]:
        """(this peer's decryption shares of ``ct``, their proof of correct decryption)."""
        from hfl.algorithms.threshold_he import to_bytes

        shares, proof = guard.release(key, self.decode(ct), **policy)
        return to_bytes(shares, self.pub.ct_bytes), proof

    def share_problem(self, peer: str, party: int, ct: np.ndarray, share: np.ndarray,
                      proof: Any, round: int, digest: str) -> str | None:
        """Why ``share`` is not ``peer``'s (key share ``party``) correct decryption share of
        the round-``round`` product ``ct`` (its proof fails), or None."""
        from hfl.algorithms.threshold_he import decryption_context, verify_decryption

        try:
            cts, ys = self.decode(ct), self.decode(share)
            context = decryption_context(self.pub, round, peer, digest)
        except (ValueError, TypeError) as exc:
            return str(exc)
        return verify_decryption(self.pub, context, party, cts, ys, proof)

    def combine(self, shares: dict[int, np.ndarray], count: int) -> np.ndarray:
        per = {i: self.decode(s) for i, s in shares.items()}
        plaintexts = [self.pub.combine({i: per[i][j] for i in per})
                      for j in range(len(next(iter(per.values()))))]
        return self.packer.unpack(plaintexts, count)


@register
class FedHP(FedProto):
    name = "fedhp"
    Config = FedHPConfig

    @staticmethod
    def head_spec(cfg: FedHPConfig) -> dict:
        """The head this method puts on the model (a checkpoint's model description
        names it, so hfl-export and hfl-eval rebuild the model; they refused every
        fedhp run, a review)."""
        return {"kind": "proto", "proto_dim": cfg.proto_dim, "layers": cfg.head_layers,
                "normalize_decision": cfg.normalize_decision}

    def __init__(self, ctx, cfg=None):
        cfg = cfg if cfg is not None else self.Config()
        # The privacy rules hold for a method built in code too (a plugin, a test, a
        # simulation), not only from a config file (an attack review: built directly,
        # min_contributors 1 had each peer help decrypt a single peer's release).
        cfg.validate()
        model = ctx.model
        if cfg.backbone_weights:
            loaded, skipped = load_backbone(model.features, cfg.backbone_weights)
            log.info("%s: encoder: %d tensors loaded from %s, %d skipped (name or shape)",
                     ctx.peer_id, len(loaded), cfg.backbone_weights, len(skipped))
        if cfg.freeze_backbone:
            model.features.requires_grad_(False)
        model.head = build_head(model.embedding_dim, ctx.num_classes, self.head_spec(cfg))
        super().__init__(ctx, cfg)
        if cfg.freeze_backbone:  # SGD over the heads only (weight decay must not shrink the encoder)
            from hfl.algorithms.training import make_optimizer

            self.optimizer = make_optimizer([p for p in self.model.parameters() if p.requires_grad],
                                            ctx.train_cfg)
        self.dpsgd = None
        if cfg.dp_sgd:
            from hfl.algorithms.dpsgd import DPSGD

            self.dpsgd = DPSGD(self.model, self.optimizer, batch_size=ctx.train_cfg.batch_size,
                               dataset_size=len(ctx.train), noise_multiplier=cfg.dp_sgd_noise_multiplier,
                               clip_norm=cfg.dp_sgd_clip_norm)
        self.accountant = Accountant(cfg.noise_multiplier, cfg.delta, cfg.accountant,
                                     cfg.dp_sgd_noise_multiplier if self.dpsgd else 0.0,
                                     self.dpsgd.sample_rate if self.dpsgd else 0.0)
        self.ledger = PrivacyLedger(ctx.store)  # releases so far, on disk before each one leaves
        self.sgd_steps = 0  # DP-SGD steps taken so far
        self.stopped = False  # the privacy budget is spent
        if cfg.noise_multiplier > 0 and not cfg.dp_sgd:
            log.warning("%s: %s", ctx.peer_id, NO_GUARANTEE)
        self.refused_releases = 0  # releases beyond the fixed-point range: refused, not clamped
        self.pending: dict[str, Any] | None = None  # the last product ciphertext, to help decrypt
        self.my_ct: tuple[int, np.ndarray] | None = None  # our last ciphertext, to find it in the product
        self.scheme = None
        self.guard = None
        self.key = None
        if cfg.secure_sum != "off":
            from hfl.algorithms.threshold_he import ReleaseGuard, load_key_share

            self.guard = ReleaseGuard(cfg.min_contributors)
            if cfg.secure_sum == "paillier":
                path = Path(cfg.key_dir).expanduser() / f"{ctx.peer_id}.json"
                self.key = dataclasses.replace(load_key_share(path), run=getattr(ctx, "run", ""))
                if self.key.public.parties[self.key.index - 1] != ctx.peer_id:
                    raise ValueError(f"{path}: the share is party {self.key.index}'s, "
                                     f"not {ctx.peer_id}'s")
                from hfl.algorithms.threshold_he import MIN_SECURE_BITS

                if self.key.public.bits < MIN_SECURE_BITS:
                    log.warning("%s: %s is a %d-bit key: such a modulus can be factored, which "
                                "opens every ciphertext (tests and demos only)", ctx.peer_id,
                                path, self.key.public.bits)
                self.scheme = _Paillier(self.key, cfg.frac_bits)
            else:
                self.scheme = _Plain(cfg.frac_bits)

    # ------------------------------------------------------------- model and loss

    @property
    def proto_dim(self) -> int:
        return int(self.cfg.proto_dim)

    def forward_parts(self, x):
        if self.cfg.freeze_backbone:
            self.model.features.eval()  # a frozen encoder keeps its BatchNorm statistics
            with torch.no_grad():
                feats = self.model.features(x)
        else:
            feats = self.model.features(x)
        return self.model.head.parts(feats)

    def regulariser(self, emb, y):
        return P.contrastive_loss(emb, y, self.protos, self.present, self.cfg.temperature,
                                  self.cfg.distance)

    def local_update(self, round: int) -> dict[str, float]:
        if self.dpsgd is None:
            return super().local_update(round)
        tc = self.ctx.train_cfg
        steps = tc.local_epochs * self.dpsgd.steps_per_epoch
        if tc.max_batches is not None:
            steps = min(steps, tc.max_batches)
        self._reg_sum, self._reg_batches = 0.0, 0
        metrics = {"train_loss": self.dpsgd.train(self.ctx.train, steps, self.ctx.device,
                                                  lambda x, y: self.loss(x, y, round))}
        self.sgd_steps += steps
        if self._reg_batches:
            metrics["proto_loss"] = self._reg_sum / self._reg_batches
        return metrics

    # ------------------------------------------------------------- release (DP)

    @property
    def weight_bounds(self) -> tuple[float, float]:
        """FedProto's, widened by six standard deviations of the noise on the weights
        (:func:`dp.noise_stds`; secure_sum off, so a release carries the whole noise):
        an honest noisy weight lies outside with probability 2e-9. Any negative weight
        was taken before: one member's -1e6 removed every class's prototype, or weights
        that cancelled the honest counts made its own rows the prototypes (accuracy
        0.82 -> 0.09; an attack review)."""
        lo, hi = super().weight_bounds
        if self.cfg.noise_multiplier == 0:
            return lo, hi
        from hfl.algorithms.dp import noise_stds

        s_w = noise_stds(self.cfg.noise_multiplier, self.cfg.clip_norm)[1]
        return lo - 6 * s_w, hi + 6 * s_w

    def release(self, round: int):
        cfg = self.cfg
        if self.stopped:
            return None
        if cfg.noise_multiplier > 0 and cfg.epsilon_max is not None:
            eps_next = self.accountant.epsilon(self.ledger.releases + 1, self.sgd_steps)
            if eps_next > cfg.epsilon_max:
                self.stopped = True
                log.warning("%s: round %d: privacy budget spent: sharing would bring epsilon to "
                            "%.3f > epsilon_max %.3f (delta %g); this peer stops sharing prototypes",
                            self.ctx.peer_id, round, eps_next, cfg.epsilon_max, cfg.delta)
                return None
        rows, weights = P.release_rows(*self.class_sums(cfg.clip_norm), cfg.weighted)
        rows, weights = add_noise(rows, weights, cfg.noise_multiplier, cfg.clip_norm, cfg.noise_split)
        if cfg.noise_multiplier > 0:
            self.ledger.record(self.sgd_steps)  # on disk before the release can leave
        return rows, weights

    def dp_metrics(self) -> dict[str, Any]:
        """The privacy spent. ``dp_epsilon`` covers everything that left the peer (the
        DP-SGD steps before the last release composed with the releases), or is None
        with ``dp_epsilon_reason`` when training is not private. ``dp_epsilon_releases``
        is the releases' epsilon alone, valid only for a map that never saw the data."""
        if self.cfg.noise_multiplier == 0:
            return {}
        led = self.ledger
        metrics: dict[str, Any] = {
            "dp_epsilon_releases": self.accountant.epsilon(led.releases),
            "dp_epsilon_round": self.accountant.epsilon(1),
            "dp_releases": float(led.releases), "dp_stopped": float(self.stopped)}
        if self.dpsgd is None:
            metrics.update(dp_epsilon=None, dp_epsilon_reason=NO_GUARANTEE)
        else:
            metrics.update(dp_epsilon=self.accountant.epsilon(led.releases, led.sgd_steps),
                           dp_sgd_steps=float(self.sgd_steps))
        return metrics

    def evaluate(self) -> dict[str, float]:
        metrics = {**super().evaluate(), **self.dp_metrics()}
        if self.scheme is not None:  # releases not sent: values beyond the fixed-point range
            metrics["refused_releases"] = float(self.refused_releases)
        return metrics

    def why_not_everywhere(self) -> str | None:
        if self.cfg.secure_sum != "off":
            return (f"secure_sum: {self.cfg.secure_sum} needs one aggregator to multiply the "
                    "ciphertexts and collect decryption shares")
        return None

    # ------------------------------------------------------------- secure sum

    def share(self, round: int) -> Payload | None:
        if self.scheme is None:
            return super().share(round)
        tensors: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {"round": round}
        rel = self.release(round)
        codes = None
        if rel is not None:
            self.note_own_scale(*rel)  # (the decrypted prototypes are bounded by it too)
            values = torch.cat([rel[0].reshape(-1), rel[1]]).double().cpu().numpy()
            try:
                codes = self.scheme.packer.quantize(values)
            except ValueError as exc:  # a clamped sum would be wrong without anyone knowing
                self.refused_releases += 1
                log.error("%s: round %d: release not sent: %s", self.ctx.peer_id, round, exc)
        if codes is not None:
            tensors["ct"], proof = self.scheme.encrypt(codes, round, self.ctx.peer_id)
            self.my_ct = (round, tensors["ct"])
            if self.key is not None:  # signed for every key holder, with its proof of knowledge
                from hfl.algorithms.threshold_he import digest

                tensors["ct_proof"] = proof
                meta["attest"] = self.key.attest(round, digest(tensors["ct"]))
        dshare = self.decryption_share(round)
        if dshare is not None:
            tensors["dshare"], proof = dshare
            if proof is not None:
                tensors["dshare_proof"] = proof
            p = self.pending
            meta.update(dshare_round=p["round"], dshare_digest=p["digest"], dshare_summands=p["summands"],
                        party=self.key.index if self.key is not None else 1)
        return Payload(kind="secure_sum", tensors=tensors, meta=meta) if tensors else None

    def decryption_share(self, round: int) -> tuple[np.ndarray, np.ndarray | None] | None:
        """(this peer's share of the pending product, its proof), or None."""
        from hfl.algorithms.threshold_he import ShareRefused

        p = self.pending
        if p is None:
            return None
        try:
            return self.scheme.share(self.guard, self.key, p["ct"], ct_round=p["round"],
                                     expected_round=round - 1, contributors=p["contributors"],
                                     ct_digest=p["digest"])
        except ShareRefused as exc:
            log.warning("%s: round %d: no decryption share for the round-%d sum: %s",
                        self.ctx.peer_id, round, p["round"], exc)
            return None

    @property
    def num_values(self) -> int:
        return self.ctx.num_classes * (self.proto_dim + 1)

    def aggregate(self, round: int, contributions: dict[str, Payload]) -> Payload | None:
        if self.scheme is None:
            return super().aggregate(round, contributions)
        from hfl.algorithms.threshold_he import digest, proof_size

        tensors: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {"round": round, "excluded": []}
        # 1. this round's releases: multiply (sum) them
        parts, proofs, contributors, attestations = [], [], [], {}
        shape, dtype = self.scheme.shape(self.num_values)
        for peer, c in sorted(contributions.items()):
            if "ct" not in c.tensors:
                continue
            ct = c.tensors["ct"]
            why = None
            if c.meta.get("round") != round:
                why = f"ciphertext of round {c.meta.get('round')!r}"
            elif ct.shape != shape or ct.dtype != dtype:
                why = f"ciphertext {ct.dtype}{list(ct.shape)}, expected {dtype}{list(shape)}"
            elif self.key is not None and peer not in self.key.public.parties:
                why = "it holds no key share"
            else:
                try:
                    self.scheme.decode(ct)
                except ValueError as exc:
                    why = str(exc)
            if why is None and self.key is not None and peer != self.ctx.peer_id:
                # the signature only (microseconds): every peer checks it and the proofs
                # itself and leaves out the same failing factors (usable_factors)
                why = self.key.verify_attestation(round, peer, digest(ct), c.meta.get("attest"))
                proof, size = c.tensors.get("ct_proof"), proof_size(self.key.public, shape[0])
                if why is None and (not isinstance(proof, np.ndarray) or proof.dtype != np.uint8
                                    or proof.shape != (size,)):
                    why = f"no proof of plaintext knowledge of uint8 [{size}]"
            if why is not None:
                log.warning("%s: round %d: contribution of %s left out: %s", self.ctx.peer_id, round, peer, why)
                meta["excluded"].append(peer)
                continue
            parts.append(ct)
            proofs.append(c.tensors.get("ct_proof"))
            contributors.append(peer)
            attestations[peer] = c.meta.get("attest")
        if len(contributors) >= self.cfg.min_contributors:
            tensors["ct"] = self.scheme.product(parts)
            tensors["ct_parts"] = np.stack(parts)  # every peer recomputes the product from these
            meta.update(ct_round=round, contributors=contributors, ct_digest=digest(tensors["ct"]))
            if self.key is not None:
                tensors["ct_proofs"] = np.stack(proofs)  # and checks each factor's proof
                meta["attestations"] = attestations
        elif contributors:
            log.warning("%s: round %d: only %d encrypted release(s) (< min_contributors %d): no sum "
                        "this round", self.ctx.peer_id, round, len(contributors), self.cfg.min_contributors)
        # 2. last round's product: combine the decryption shares
        protos = self.combine_shares(round, contributions, meta)
        if protos is not None:
            tensors["protos"], tensors["present"] = protos
            meta["protos_round"] = round - 1
        return Payload(kind="secure_sum", tensors=tensors, meta=meta) if tensors else None

    def combine_shares(self, round: int, contributions: dict[str, Payload], meta: dict):
        groups: dict[tuple[str, int], dict[int, tuple[str, np.ndarray]]] = {}
        proofs: dict[int, Any] = {}  # party -> its shares' proof of correct decryption
        for peer, c in sorted(contributions.items()):
            if "dshare" not in c.tensors:
                continue
            m = c.meta
            party, summands = m.get("party"), m.get("dshare_summands")
            why = None
            if m.get("dshare_round") != round - 1:
                why = f"decryption share of round {m.get('dshare_round')!r}, expected {round - 1}"
            elif not isinstance(party, int) or isinstance(party, bool) or not isinstance(summands, int):
                why = "party and dshare_summands must be ints"
            elif self.key is not None and (peer not in self.key.public.parties
                                           or self.key.public.index_of(peer) != party):
                why = f"party {party!r} is not this peer's key share"
            elif (c.tensors["dshare"].shape, c.tensors["dshare"].dtype) != self.scheme.shape(
                    self.num_values):
                # (one extra row raised an IndexError in combine: an attack review)
                why = (f"dshare of shape {c.tensors['dshare'].shape} {c.tensors['dshare'].dtype}, "
                       f"expected {self.scheme.shape(self.num_values)[0]}")
            if why is not None:
                log.warning("%s: round %d: decryption share of %s left out: %s",
                            self.ctx.peer_id, round, peer, why)
                meta["excluded"].append(peer)
                continue
            # With keys, by digest alone: the summands are the held product's (a share
            # filed under other summands went unchecked and unnamed: a crypto review).
            groups.setdefault((str(m.get("dshare_digest")),
                               0 if self.key is not None else summands), {})[party] = (
                peer, c.tensors["dshare"])
            proofs[party] = c.tensors.get("dshare_proof")
        if not groups:
            return None
        if len(groups) > 1:  # honest peers are never shown two products of one round
            log.warning("%s: round %d: decryption shares for %d different round-%d products (the "
                        "round-%d aggregator showed peers different sums): only the shares of the "
                        "product this peer holds are combined (of the largest group without "
                        "keys); %s", self.ctx.peer_id, round, len(groups), round - 1, round - 1,
                        {f"{d[:12]}/{n}": sorted(g) for (d, n), g in groups.items()})
        held = self.pending["digest"] if self.pending is not None else None
        (ct_digest, summands), shares = max(  # (the product this peer holds, if shares are of it)
            groups.items(), key=lambda kv: (kv[0][0] == held, len(kv[1])))
        t = self.scheme.threshold
        if self.key is not None:  # each share's proof of correct decryption, until t verify
            p = self.pending
            if p is None or p["round"] != round - 1 or p["digest"] != ct_digest:
                log.warning("%s: round %d: cannot check the decryption shares of the round-%d sum "
                            "(%s): this peer holds no product of that digest; not decrypted",
                            self.ctx.peer_id, round, round - 1, ct_digest[:12])
                return None
            summands = p["summands"]  # (what this peer counted, not what a share claims)
            verified = {}
            for party, (peer, share) in sorted(shares.items()):
                why = self.scheme.share_problem(peer, party, p["ct"], share,
                                                proofs.get(party), round - 1, ct_digest)
                if why is not None:  # (a shifted share set every peer's prototypes: a review)
                    log.warning("%s: round %d: decryption share of %s left out: %s",
                                self.ctx.peer_id, round, peer, why)
                    meta["excluded"].append(peer)
                    continue
                verified[party] = (peer, share)
                if len(verified) == t:
                    break
            shares = verified
        if len(shares) < t:
            log.warning("%s: round %d: %d decryption share(s) of the round-%d sum, %d needed",
                        self.ctx.peer_id, round, len(shares), round - 1, t)
            return None
        chosen = sorted(shares)[:t]
        try:
            codes = self.scheme.combine({i: shares[i][1] for i in chosen}, self.num_values)
            values = self.scheme.packer.dequantize(codes, summands)
        except ValueError as exc:
            log.warning("%s: round %d: shares of %s do not decrypt: %s", self.ctx.peer_id, round,
                        [shares[i][0] for i in chosen], exc)
            return None
        k, d = self.ctx.num_classes, self.proto_dim
        if not np.isfinite(values).all() or np.abs(values).max() > summands * self.scheme.packer.bound:
            # Verified shares of a product of signed, proven factors: some factor's
            # plaintext is absurd (a proof of knowledge is no range proof).
            log.warning("%s: round %d: the round-%d sum decrypts out of range: some contributor "
                        "released values beyond the fixed-point range (a valid but absurd "
                        "release); no prototypes this round", self.ctx.peer_id, round, round - 1)
            return None
        r_sum = torch.from_numpy(values[: k * d].reshape(k, d))
        w_sum = torch.from_numpy(values[k * d:])
        protos, present = P.global_prototypes(r_sum, w_sum)
        return protos.float().numpy(), present.numpy()

    def check_result(self, round, result):
        why = super().check_result(round, result)
        if why is not None or self.scheme is None:
            return why
        if "ct" in result.tensors:
            why = self.check_product(round, result)
            if why is not None:  # keep the prototypes, refuse to help decrypt
                log.warning("%s: round %d: will not help decrypt the round's sum: %s",
                            self.ctx.peer_id, round, why)
                self.pending = None
        return None

    def check_product(self, round: int, result: Payload) -> str | None:
        from hfl.algorithms.threshold_he import ShareRefused, digest

        ct, m = result.tensors["ct"], result.meta
        contributors = m.get("contributors")
        if not isinstance(contributors, list) or not all(isinstance(c, str) for c in contributors):
            return "contributors must be a list of peer ids"
        try:
            self.guard.check(m.get("ct_round"), round, contributors, digest(ct))
            self.scheme.decode(ct)
        except (ShareRefused, ValueError) as exc:
            return str(exc)
        if m.get("ct_digest") != digest(ct):
            return "ct_digest does not match the ciphertext"
        parts = result.tensors.get("ct_parts")
        if parts is None or parts.ndim != ct.ndim + 1 or parts.shape[0] != len(contributors) \
                or parts.shape[1:] != ct.shape or parts.dtype != ct.dtype:
            return "the factors (ct_parts) are missing or do not fit"
        keep, why = self.usable_factors(round, contributors, parts, result.tensors.get("ct_proofs"),
                                        m.get("attestations"))
        if why is not None:
            return why
        used = [contributors[i] for i in keep]
        if len(keep) < len(contributors):  # every honest peer leaves out the same factors
            try:
                self.guard.check(round, round, used, "")
            except ShareRefused as exc:
                return f"{len(contributors) - len(keep)} factor(s) left out: {exc}"
            ct = self.scheme.product([parts[i] for i in keep])
        elif not np.array_equal(self.scheme.product(list(parts)), ct):
            return "the ciphertext is not the product of the listed factors"
        self.pending = {"round": round, "ct": np.array(ct), "digest": digest(ct),
                        "summands": len(used), "contributors": used}
        return None

    def usable_factors(self, round: int, contributors: list[str], parts: np.ndarray, proofs: Any,
                       attestations: Any) -> tuple[list[int], str | None]:
        """(the factors to multiply, or why the product is refused outright). A factor is
        used if it is ours as we sent it, or signed by its owner, a key holder, with a
        proof that the owner knows its plaintext, made for this round (the aggregator's
        own factor included). Any other is left out and its owner named: the signature
        and the proof check the same for every peer, so every honest peer leaves out the
        same factors and helps decrypt the same product of the rest."""
        me = self.ctx.peer_id
        if self.key is not None and (not isinstance(proofs, np.ndarray) or proofs.ndim != 2
                                     or proofs.shape[0] != len(contributors)):
            return [], "the factors' proofs (ct_proofs) are missing or do not fit"
        keep = []
        for i, (owner, part) in enumerate(zip(contributors, parts, strict=True)):
            if owner == me:
                mine = self.my_ct
                if mine is None or mine[0] != round or not np.array_equal(part, mine[1]):
                    return [], "a factor listed as ours is not the ciphertext we sent this round"
            elif self.key is not None:
                sig = attestations.get(owner) if isinstance(attestations, dict) else None
                why = self.scheme.factor_problem(round, owner, part, proofs[i], sig)
                if why is not None:
                    log.warning("%s: round %d: factor of %r left out of the product: %s",
                                me, round, owner, why)
                    continue
            keep.append(i)
        return keep, None

    # ------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(dp_releases=self.ledger.releases, dp_sgd_steps_released=self.ledger.sgd_steps,
                     dp_sgd_steps=self.sgd_steps, dp_stopped=self.stopped)
        if self.guard is not None:
            state["released_rounds"] = sorted(self.guard.released)
        if self.pending is not None:
            p = self.pending
            state["pending"] = {"round": p["round"], "ct": torch.from_numpy(p["ct"].copy()),
                                "digest": p["digest"], "summands": p["summands"],
                                "contributors": list(p["contributors"])}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.ledger.merge({"releases": state["dp_releases"],
                           "sgd_steps": state.get("dp_sgd_steps_released", 0)})
        self.sgd_steps = max(int(state.get("dp_sgd_steps", 0)), self.ledger.sgd_steps)
        self.stopped = bool(state["dp_stopped"])
        if self.guard is not None:
            self.guard.released = {int(r): "" for r in state.get("released_rounds", [])}
        if "pending" in state:
            p = dict(state["pending"])
            p["ct"] = p["ct"].numpy()
            self.pending = p
