"""FedHP and FedProto on tensors: prototypes and the contrastive loss against numpy,
the DP mechanism and its accountant, epsilon_max, the secure sum (plaintext and
threshold Paillier, with dead peers and hostile contributions), learning in a
short simulated cohort, checkpoints, the encoder options, and the example
through the real hfl-launch."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from hfl.algorithms import dp
from hfl.algorithms import prototypes as P
from hfl.algorithms import threshold_he as he
from hfl.algorithms.base import AlgorithmContext, Payload
from hfl.algorithms.registry import get_algorithm
from hfl.algorithms.settings import TrainConfig
from hfl.algorithms.simulate import simulate
from hfl.data import ArrayDataset
from hfl.models import build_model

ROOT = Path(__file__).resolve().parent.parent
C, F, E = 3, 6, 8


def dataset(seed: int, n: int) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    x = rng.normal(size=(n, F)).astype(np.float32) + 1.5 * y[:, None]  # learnable
    return ArrayDataset(x, y, C)


def make(name: str, peer: str = "p0", n: int = 60, hidden=(16,), **cfg):
    torch.manual_seed(0)
    model = build_model("mlp", (F,), C, E, hidden=list(hidden))
    idx = int(peer[1:])
    ctx = AlgorithmContext(peer_id=peer, model=model, train=dataset(10 + idx, n),
                           test=dataset(99, 90), num_classes=C, device=torch.device("cpu"),
                           seed=idx, rounds=6, train_cfg=TrainConfig(lr=0.05, batch_size=16))
    cls = get_algorithm(name)
    return cls(ctx, cls.Config(**cfg))


def write_keys(path: Path, parties: int, threshold: int = 3) -> str:
    _, shares = he.keygen([f"p{i}" for i in range(parties)], threshold=threshold, bits=512)
    for s in shares:
        s.save(path / f"{s.party}.json")
    return str(path)


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory):
    return write_keys(tmp_path_factory.mktemp("keys"), 4)


# ------------------------------------------------------------------ pure math


def test_contrastive_loss_by_hand_and_against_numpy():
    # Hand: z = e1, prototypes e1, e2, t = 1, cosine: -log(e / (e + 1)).
    z = torch.tensor([[1.0, 0.0]])
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    got = P.contrastive_loss(z, torch.tensor([0]), protos, torch.tensor([True, True]))
    assert float(got) == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-6)

    rng = np.random.default_rng(0)
    z, protos = rng.normal(size=(7, 5)), rng.normal(size=(4, 5))
    y = np.array([0, 1, 2, 3, 0, 2, 1])
    present = np.array([True, False, True, True])  # class 1 has no global prototype
    for distance, temperature in [("cosine", 1.0), ("cosine", 0.2), ("l2", 0.5), ("l1", 2.0)]:
        if distance == "cosine":
            sim = (z / np.linalg.norm(z, axis=1, keepdims=True)) @ \
                  (protos / np.linalg.norm(protos, axis=1, keepdims=True)).T
        else:
            order = 2 if distance == "l2" else 1
            sim = -np.linalg.norm(z[:, None, :] - protos[None], ord=order, axis=2)
        logits = sim[:, present] / temperature
        cls = np.flatnonzero(present)
        losses = [-(logits[i, np.flatnonzero(cls == y[i])[0]] - np.log(np.exp(logits[i]).sum()))
                  for i in range(len(y)) if present[y[i]]]
        got = P.contrastive_loss(torch.tensor(z), torch.tensor(y), torch.tensor(protos),
                                 torch.tensor(present), temperature, distance)
        # summed over the samples with a prototype, divided by the whole batch (issue 32)
        assert float(got) == pytest.approx(np.sum(losses) / len(y), rel=1e-9), distance
    none = P.contrastive_loss(torch.tensor(z), torch.tensor(y), torch.tensor(protos),
                              torch.zeros(4, dtype=torch.bool))
    assert float(none) == 0.0


def test_prototypes_mse_and_nearest_against_numpy():
    rng = np.random.default_rng(1)
    emb, y = rng.normal(size=(20, 3)) * 3, rng.integers(0, 4, 20)
    y[:2] = [0, 1]
    y[y == 3] = 2  # class 3 absent
    sums, counts = P.class_sums(torch.tensor(emb), torch.tensor(y), 4, clip_norm=2.0)
    clipped = emb * np.minimum(1, 2.0 / np.linalg.norm(emb, axis=1))[:, None]
    assert np.linalg.norm(clipped, axis=1).max() <= 2.0 + 1e-12
    for k in range(4):
        np.testing.assert_allclose(sums[k].numpy(), clipped[y == k].sum(0), atol=1e-12)
        assert counts[k] == (y == k).sum()
    rows, held = P.release_rows(sums, counts, weighted=False)
    np.testing.assert_allclose(rows[0].numpy(), clipped[y == 0].mean(0))
    assert held.tolist() == [1, 1, 1, 0] and rows[3].abs().sum() == 0
    protos, present = P.global_prototypes(sums, counts)
    assert present.tolist() == [True, True, True, False]
    mse = P.mse_loss(torch.tensor(emb), torch.tensor(y), protos, present)
    assert float(mse) == pytest.approx(np.mean((emb - protos.numpy()[y]) ** 2))
    pred = P.nearest_prototype(torch.tensor(emb), protos, present)
    d = np.linalg.norm(emb[:, None] - protos.numpy()[None], axis=2)
    d[:, 3] = np.inf
    assert pred.tolist() == d.argmin(1).tolist()


def test_global_prototypes_weighted_and_unweighted_means_over_peers():
    for weighted in (True, False):
        peers = {f"p{i}": make("fedproto", f"p{i}", n=30 + 20 * i, weighted=weighted) for i in range(3)}
        contributions = {p: a.share(1) for p, a in peers.items()}
        result = peers["p1"].aggregate(1, contributions)
        means, counts = [], []
        for a in peers.values():  # independent: numpy over each peer's embeddings
            with torch.no_grad():
                emb = a.model.features(torch.from_numpy(a.ctx.train.x)).double().numpy()
            y = a.ctx.train.y
            means.append(np.stack([emb[y == k].mean(0) for k in range(C)]))
            counts.append(np.bincount(y, minlength=C))
        means, counts = np.stack(means), np.stack(counts).astype(float)
        w = counts if weighted else np.ones_like(counts)
        expected = (means * w[..., None]).sum(0) / w.sum(0)[:, None]
        np.testing.assert_allclose(result.tensors["protos"], expected, rtol=1e-5, atol=1e-6)
        assert result.tensors["present"].all()


def test_dp_clipping_bound_and_noise_scale():
    assert dp.noise_stds(2.0, 0.5, split=1) == pytest.approx((2 * math.sqrt(2) * 0.5, 2 * math.sqrt(2)))
    s_rows, s_w = dp.noise_stds(2.0, 0.5, split=4)
    assert (s_rows, s_w) == pytest.approx((math.sqrt(2) * 0.5, math.sqrt(2)))
    # The noise is fresh from the OS: bounds are ~8 standard errors wide (n = 40,000).
    rows, weights = torch.zeros(200, 200, dtype=torch.float64), torch.zeros(40000, dtype=torch.float64)
    nr, nw = dp.add_noise(rows, weights, 2.0, 0.5, 4)
    assert float(nr.std()) == pytest.approx(s_rows, rel=0.03)
    assert float(nw.std()) == pytest.approx(s_w, rel=0.03)
    assert abs(float(nr.mean())) < 8 * s_rows / 200 and abs(float(nw.mean())) < 8 * s_w / 200
    # Four peers' split noise sums to the full mechanism's std.
    total = sum(dp.add_noise(rows, weights, 2.0, 0.5, 4)[0] for _ in range(4))
    assert float(total.std()) == pytest.approx(2 * math.sqrt(2) * 0.5, rel=0.03)
    # A release's rows come from clipped projections: norms <= clip_norm per sample.
    alg = make("fedhp", clip_norm=0.3, proto_dim=4)
    sums, counts = alg.class_sums(0.3)
    assert (sums.norm(dim=1) <= 0.3 * counts + 1e-9).all()


def _analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of a mu-GDP mechanism (Balle & Wang 2018 / Dong et al. 2019)."""
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    dlt = lambda e: phi(-e / mu + mu / 2) - math.exp(e) * phi(-e / mu - mu / 2)  # noqa: E731
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if dlt(mid) > delta else (lo, mid)
    return hi


def test_accountant_against_the_library_and_the_exact_gaussian():
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    for z, k in [(1.0, 1), (1.0, 10), (2.5, 30)]:
        lib = rdp_privacy_accountant.RdpAccountant()
        lib.compose(dp_event.GaussianDpEvent(z), k)
        assert dp.Accountant(z, 1e-5).epsilon(k) == pytest.approx(lib.get_epsilon(1e-5), rel=1e-9)
        exact = _analytic_gaussian_epsilon(math.sqrt(k) / z, 1e-5)
        pld = dp.Accountant(z, 1e-5, "pld").epsilon(k)
        assert exact * (1 - 1e-6) <= pld <= exact * 1.02  # tight, never below the truth
        assert dp.Accountant(z, 1e-5).epsilon(k) >= exact  # RDP: an upper bound
    assert dp.Accountant(1.0, 1e-5).epsilon(0) == 0.0


def test_epsilon_max_stops_sharing_and_says_so(caplog):
    acc = dp.Accountant(1.0, 1e-5)
    budget = (acc.epsilon(2) + acc.epsilon(3)) / 2  # room for exactly two releases
    alg = make("fedhp", proto_dim=4, noise_multiplier=1.0, epsilon_max=budget)
    assert alg.share(1) is not None and alg.share(2) is not None
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        assert alg.share(3) is None
        assert alg.share(4) is None
    assert "stops sharing" in caplog.text and caplog.text.count("stops sharing") == 1
    m = alg.evaluate()
    assert m["dp_stopped"] == 1.0 and m["dp_releases"] == 2.0
    assert m["dp_epsilon_releases"] == pytest.approx(acc.epsilon(2)) and m["dp_epsilon_releases"] <= budget
    assert m["dp_epsilon_round"] == pytest.approx(acc.epsilon(1))
    assert m["dp_epsilon"] is None and "without DP-SGD" in m["dp_epsilon_reason"]  # no guarantee


def test_config_errors_name_the_field():
    from hfl.peer.configtools import ConfigError, build

    cls = get_algorithm("fedhp").Config
    with pytest.raises(ConfigError, match="algorithm.*noise_split > 1 needs secure_sum: paillier"):
        build(cls, {"noise_split": 2}, "algorithm")
    # plaintext: every release travels in the clear, so it cannot carry a fraction of the noise
    with pytest.raises(ConfigError, match="noise_split > 1 needs secure_sum: paillier .got plaintext"):
        build(cls, {"noise_split": 2, "min_contributors": 2, "secure_sum": "plaintext"}, "algorithm")
    with pytest.raises(ConfigError, match="dp_sgd needs noise_multiplier > 0"):
        build(cls, {"dp_sgd": True}, "algorithm")
    with pytest.raises(ConfigError, match="algorithm.dp_sgd_noise_multiplier"):
        build(cls, {"dp_sgd": True, "noise_multiplier": 1.0, "dp_sgd_noise_multiplier": 0}, "algorithm")
    with pytest.raises(ConfigError, match="algorithm.*verify_product"):  # removed: factors always ship
        build(cls, {"verify_product": False}, "algorithm")
    with pytest.raises(ConfigError, match="robust: median / max_weight_share need secure_sum: off"):
        build(cls, {"robust": "median", "secure_sum": "plaintext"}, "algorithm")
    assert build(cls, {"robust": "median"}, "algorithm").robust == "median"  # in the clear it is FedProto's
    with pytest.raises(ConfigError, match="algorithm.secure_sum.*paillier"):
        build(cls, {"secure_sum": "rsa"}, "algorithm")
    with pytest.raises(ConfigError, match="epsilon_max needs noise_multiplier"):
        build(cls, {"epsilon_max": 3.0}, "algorithm")
    with pytest.raises(ConfigError, match="needs key_dir"):
        build(cls, {"secure_sum": "paillier"}, "algorithm")
    # The decrypting peer knows its own release in the sum (an attack review): the
    # others' must carry the full noise, and a sum of one would be one peer's release.
    paillier = {"secure_sum": "paillier", "key_dir": "k"}
    for split, least in [(3, 3), (2, 2), (1, 1)]:
        with pytest.raises(ConfigError, match=r"noise_split \(\d\) must be <= min_contributors - 1"):
            build(cls, {**paillier, "noise_split": split, "min_contributors": least}, "algorithm")
    assert build(cls, {**paillier, "noise_split": 3, "min_contributors": 4}, "algorithm").noise_split == 3
    assert build(cls, paillier, "algorithm").min_contributors == 2  # the defaults hold


# ------------------------------------------------------------------ secure sum


def run_rounds(algs, rounds: int, dead=()):
    """share -> aggregate on the rotation's aggregator -> absorb, with some peers dead
    (they neither send nor receive)."""
    alive = [a for a in algs if a.ctx.peer_id not in dead]
    results = []
    for r in range(1, rounds + 1):
        for a in alive:
            a.local_update(r)
        payloads = {a.ctx.peer_id: p for a in alive if (p := a.share(r)) is not None}
        agg = alive[r % len(alive)]
        result = agg.aggregate(r, payloads)
        results.append(result)
        for a in alive:
            a.absorb(r, {agg.ctx.peer_id: result})
    return results


def test_paillier_secure_sum_equals_the_plaintext_one_and_the_clear_sum(key_dir):
    common = dict(proto_dim=4, min_contributors=2)  # no noise: it is fresh from the OS each time
    paillier = [make("fedhp", f"p{i}", secure_sum="paillier", key_dir=key_dir, **common) for i in range(4)]
    plain = [make("fedhp", f"p{i}", secure_sum="plaintext", **common) for i in range(4)]
    res_p, res_q = run_rounds(paillier, 3), run_rounds(plain, 3)
    assert "protos" not in res_p[0].tensors and res_p[1].meta["protos_round"] == 1
    for a, b in zip(res_p[1:], res_q[1:], strict=True):
        assert np.array_equal(a.tensors["protos"], b.tensors["protos"])  # identical arithmetic
    for a, b in zip(paillier, plain, strict=True):
        assert torch.equal(a.protos, b.protos)
        assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True))
    # Against the sum in the clear (secure_sum: off, no noise): the same releases of four
    # untrained peers give the same global prototypes up to the fixed-point rounding.
    clear = [make("fedhp", f"p{i}", proto_dim=4) for i in range(4)]
    secure = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir) for i in range(4)]
    in_clear = clear[0].aggregate(1, {a.ctx.peer_id: a.share(1) for a in clear})
    first = secure[1].aggregate(1, {a.ctx.peer_id: a.share(1) for a in secure})
    for a in secure:
        a.absorb(1, {"p1": first})
    decrypted = secure[2].aggregate(2, {a.ctx.peer_id: share_payload(a, 2) for a in secure[:3]})
    assert decrypted.meta["protos_round"] == 1
    np.testing.assert_allclose(decrypted.tensors["protos"], in_clear.tensors["protos"], atol=1e-4)
    assert np.array_equal(decrypted.tensors["present"], in_clear.tensors["present"])


def share_payload(a, round: int, tweak=None) -> Payload:
    """Peer ``a``'s decryption share of its pending product as share() sends it, the
    share passed through ``tweak`` first (an attacker's edit)."""
    d, proof = a.decryption_share(round)
    return Payload("secure_sum", {"dshare": d if tweak is None else tweak(d), "dshare_proof": proof},
                   {"round": round, "dshare_round": round - 1, "party": a.key.index,
                    "dshare_digest": a.pending["digest"], "dshare_summands": a.pending["summands"]})


def test_a_shifted_decryption_share_is_left_out_by_its_proof_and_the_sum_stays_true(
        tmp_path, caplog):
    """An attack review: p1 multiplied its share by (1 + n)^x, which still combines but
    shifts the decrypted sum by a plaintext of its choosing; every peer absorbed the
    poisoned prototypes and nobody was named. And with 7 key holders (t = 4) one junk
    share from p0 stopped every decryption: only the first 20 subsets were tried, and
    each held p0. Now each share's proof of correct decryption is checked: the bad
    one is left out and named, and any t verified shares decrypt the true sum."""
    keys = write_keys(tmp_path, 7, threshold=4)
    clear = [make("fedhp", f"p{i}", proto_dim=4) for i in range(7)]
    secure = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=keys)
              for i in range(7)]
    in_clear = clear[0].aggregate(1, {a.ctx.peer_id: a.share(1) for a in clear})
    first = secure[1].aggregate(1, {a.ctx.peer_id: a.share(1) for a in secure})
    for a in secure:
        a.absorb(1, {"p1": first})
    pub = secure[0].key.public
    n2 = pub.n2

    def shifted(d):
        y = he.from_bytes(d, pub)
        return he.to_bytes([y[0] * pow(1 + pub.n, 10**9, n2) % n2, *y[1:]], pub.ct_bytes)

    def junk(d):
        return he.to_bytes([pub.encrypt(5) for _ in range(len(d))], pub.ct_bytes)

    tweaks = {"p0": junk, "p1": shifted}
    shares = {a.ctx.peer_id: share_payload(a, 2, tweaks.get(a.ctx.peer_id)) for a in secure}
    # (junk filed under other summands: grouped apart, it went unchecked and unnamed)
    shares["p0"].meta["dshare_summands"] += 1
    with caplog.at_level(logging.WARNING, logger="hfl"):
        out = secure[2].aggregate(2, shares)
    assert sorted(out.meta["excluded"]) == ["p0", "p1"] and out.meta["protos_round"] == 1
    for p in ("p0", "p1"):
        assert f"decryption share of {p} left out: the proof of correct decryption" in caplog.text
    np.testing.assert_allclose(out.tensors["protos"], in_clear.tensors["protos"], atol=1e-4)
    # A share with no proof, or another peer's proof, is left out the same way.
    stripped = Payload("secure_sum", {"dshare": shares["p3"].tensors["dshare"]}, shares["p3"].meta)
    mixed = Payload("secure_sum", {**shares["p4"].tensors,
                                   "dshare_proof": shares["p5"].tensors["dshare_proof"]},
                    shares["p4"].meta)
    meta = {"excluded": []}
    assert secure[2].combine_shares(2, {"p3": stripped, "p4": mixed}, meta) is None
    assert meta["excluded"] == ["p3", "p4"]
    # An aggregator that holds no such product (it missed the round's result) cannot
    # check the shares: it decrypts nothing that round, and says so.
    secure[6].pending = None
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hfl"):
        assert secure[6].combine_shares(2, shares, {"excluded": []}) is None
    assert "this peer holds no product of that digest; not decrypted" in caplog.text


def test_a_decryption_share_of_the_wrong_shape_is_left_out_and_the_others_decrypt(key_dir, caplog):
    # A member's dshare with one extra row raised an IndexError in the aggregator's
    # combine (which stopped it; an attack review). It is left out by its shape now.
    secure = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir) for i in range(4)]
    first = secure[1].aggregate(1, {a.ctx.peer_id: a.share(1) for a in secure})
    for a in secure:
        a.absorb(1, {"p1": first})

    def share(a, pad: bool):
        return share_payload(a, 2, (lambda d: np.concatenate([d, d[:1]])) if pad else None)

    with caplog.at_level(logging.WARNING, logger="hfl"):
        out = secure[2].aggregate(2, {a.ctx.peer_id: share(a, a.ctx.peer_id == "p0") for a in secure})
    assert "p0" in out.meta["excluded"] and out.meta["protos_round"] == 1  # t = 3 of the others
    assert "decryption share of p0 left out: dshare of shape" in caplog.text


def test_a_round_completes_with_n_minus_t_peers_dead(key_dir):
    algs = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir) for i in range(4)]
    results = run_rounds(algs, 3, dead={"p2"})  # t = 3 of n = 4: one may die
    assert results[1].meta["protos_round"] == 1 and results[2].meta["protos_round"] == 2
    assert results[2].meta["contributors"] == ["p0", "p1", "p3"]
    assert all(a.protos is not None and a.protos_round == 2 for a in algs if a.ctx.peer_id != "p2")


def test_no_share_for_a_sum_of_too_few_or_twice_in_a_round(key_dir, caplog):
    algs = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir,
                 min_contributors=3) for i in range(4)]
    for a in algs:
        a.local_update(1)
    payloads = {a.ctx.peer_id: a.share(1) for a in algs}
    agg = algs[1]
    # A curious aggregator sums only p0's and p3's releases: nobody helps decrypt it.
    forged = agg.aggregate(1, {p: payloads[p] for p in ("p0", "p3")})
    assert forged is None or "ct" not in forged.tensors  # below m_min: it does not even form one
    full = agg.aggregate(1, payloads)
    tampered = Payload(full.kind, dict(full.tensors), {**full.meta, "contributors": ["p0", "p3"]})
    tampered.tensors["ct_parts"] = full.tensors["ct_parts"][:2]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        algs[0].absorb(1, {"p1": tampered})
    assert algs[0].pending is None
    assert "will not help decrypt the round's sum: 2 contributor(s) < m_min = 3" in caplog.text
    assert algs[0].share(2).tensors.keys() == {"ct", "ct_proof"}  # no decryption share
    # An honest product is helped once; a second ask in the same round is refused.
    algs[3].absorb(1, {"p1": full})
    first = algs[3].decryption_share(2)
    assert first is not None
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        assert algs[3].decryption_share(2) is None
    assert "already released" in caplog.text


def test_a_product_that_is_not_of_the_listed_factors_is_not_decrypted(key_dir, caplog):
    algs = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir) for i in range(4)]
    payloads = {a.ctx.peer_id: a.share(1) for a in algs}
    full = algs[1].aggregate(1, payloads)
    # The aggregator swaps in p0's ciphertext alone, claiming all four contributed.
    lone = Payload(full.kind, {**full.tensors, "ct": payloads["p0"].tensors["ct"]}, dict(full.meta))
    lone.meta["ct_digest"] = he.digest(lone.tensors["ct"])
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        algs[2].absorb(1, {"p1": lone})
    assert algs[2].pending is None and "not the product" in caplog.text


def result_of(agg, round: int, factors) -> Payload:
    """The result an aggregator builds from ``factors``: (owner, ct, proof, signature)."""
    parts = [f[1] for f in factors]
    product = agg.scheme.product(parts)
    return Payload("secure_sum", {"ct": product, "ct_parts": np.stack(parts),
                                  "ct_proofs": np.stack([f[2] for f in factors])}, {
        "round": round, "ct_round": round, "contributors": [f[0] for f in factors],
        "ct_digest": he.digest(product), "attestations": {f[0]: f[3] for f in factors}})


def factor_of(payload: Payload, owner: str):
    return owner, payload.tensors["ct"], payload.tensors["ct_proof"], payload.meta["attest"]


def forged_product(algs, payloads, contributors, fillers):
    """The round-1 result a malicious aggregator (p1) builds: the listed contributors'
    factors, where the ones in ``fillers`` are Enc(0) instead of their release, each with
    a valid proof under the listed owner's name (the aggregator knows the plaintext 0).
    It signs its own filler (it can) and keeps the others' real signatures."""
    agg = algs[1]
    factors = []
    for c in contributors:
        if c in fillers:
            zero, proof = agg.scheme.encrypt(agg.scheme.packer.quantize(np.zeros(agg.num_values)), 1, c)
            sig = agg.key.attest(1, he.digest(zero)) if c == "p1" else payloads.get(c, payloads["p0"]).meta["attest"]
            factors.append((c, zero, proof, sig))
        else:
            factors.append(factor_of(payloads[c], c))
    return result_of(agg, 1, factors)


@pytest.mark.parametrize("contributors,fillers", [
    (["p0", "p1", "ghost"], {"p1", "ghost"}),  # a contributor that holds no key share
    (["p0", "p1", "p2"], {"p1", "p2"}),  # p2's factor is filler under p2's name
    (["p0", "p2", "p3"], {"p2", "p3"}),  # only p0's release is real
])
def test_a_forged_product_that_would_decrypt_one_release_is_refused_by_every_honest_peer(
        key_dir, caplog, contributors, fillers):
    """The attack of issue 17: 4 parties, t = 3, m_min = 3; the aggregator p1 turns p0's
    ciphertext into a 'sum' with Enc(0) filler. No honest peer helps decrypt it, so with
    the aggregator's own share there are 1 < t shares."""
    algs = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir,
                 min_contributors=3) for i in range(4)]
    payloads = {a.ctx.peer_id: a.share(1) for a in algs}
    forged = forged_product(algs, payloads, contributors, fillers)
    honest = [a for a in algs if a.ctx.peer_id != "p1"]
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        for a in honest:
            a.absorb(1, {"p1": forged})
    assert all(a.pending is None for a in honest)
    assert all("dshare" not in a.share(2).tensors for a in honest)
    assert "will not help decrypt" in caplog.text
    assert ("holds no key share" in caplog.text) if "ghost" in contributors else \
        ("does not verify" in caplog.text or "not the ciphertext we sent" in caplog.text)
    # The same peers do help with the honest product of the same round.
    fresh = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir,
                  min_contributors=3) for i in range(4)]
    results = run_rounds(fresh, 2)
    assert results[1].meta["protos_round"] == 1


def test_a_replayed_or_renamed_attested_ciphertext_is_refused(key_dir, caplog):
    algs = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir,
                 min_contributors=3) for i in range(4)]
    old = {a.ctx.peer_id: a.share(1) for a in algs}
    run_rounds(algs, 1)
    new = {a.ctx.peer_id: a.share(2) for a in algs}
    agg = algs[1]
    honest = agg.aggregate(2, new)
    # p2's round-1 ciphertext with its round-1 signature and proof, replayed in round 2
    replay = result_of(agg, 2, [factor_of(new["p0"], "p0"), factor_of(new["p1"], "p1"),
                                factor_of(old["p2"], "p2"), factor_of(new["p3"], "p3")])
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        algs[3].absorb(2, {"p1": replay})
    assert "factor of 'p2' left out of the product: attestation of 'p2' does not verify" in caplog.text
    # only the three genuine round-2 factors are helped: p2's old release is not in the sum
    genuine = agg.scheme.product([new[p].tensors["ct"] for p in ("p0", "p1", "p3")])
    assert algs[3].pending["contributors"] == ["p0", "p1", "p3"] and algs[3].pending["summands"] == 3
    assert np.array_equal(algs[3].pending["ct"], genuine)
    algs[0].absorb(2, {"p1": honest})
    assert algs[0].pending["contributors"] == ["p0", "p1", "p2", "p3"]  # the genuine product of round 2


# Issue 32: 5 key holders, t = 3, m_min = 3; the aggregator is p1 (round 1) or p2 (round 2).


@pytest.fixture(scope="module")
def key_dir5(tmp_path_factory):
    return write_keys(tmp_path_factory.mktemp("keys5"), 5)


def cohort5(key_dir5):
    return [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir5,
                 min_contributors=3) for i in range(5)]


def ct_combine(scheme, arrays, exponents) -> np.ndarray:
    """prod_i arrays_i^exponents_i, ciphertext by ciphertext (what a cheat can compute)."""
    cts = [scheme.decode(a) for a in arrays]
    n2 = scheme.pub.n2
    out = [math.prod(pow(c[j], e, n2) for c, e in zip(cts, exponents, strict=True)) % n2
           for j in range(len(cts[0]))]
    return he.to_bytes(out, scheme.pub.ct_bytes)


def decrypt_directly(key_dir5, ct: np.ndarray, summands: int, count: int) -> np.ndarray:
    """The oracle: any 3 key files decrypt ``ct`` with threshold_he's primitives."""
    keys = [he.load_key_share(Path(key_dir5) / f"p{i}.json") for i in (0, 3, 4)]
    pub = keys[0].public
    packer = he.Packer(pub.bits - 1, len(pub.parties))
    plain = [pub.combine({k.index: k.decryption_share(c) for k in keys}) for c in he.from_bytes(ct, pub)]
    return packer.dequantize(packer.unpack(plain, count), summands)


def refused_by_every_honest_peer(algs, round: int, aggregator: str, forged: Payload, caplog) -> str:
    honest = [a for a in algs if a.ctx.peer_id != aggregator]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        for a in honest:
            a.absorb(round, {aggregator: forged})
    assert all(a.pending is None for a in honest)
    assert all("dshare" not in a.share(round + 1).tensors for a in honest)
    assert caplog.text.count("will not help decrypt") == len(honest)
    return caplog.text


def own_factor_is_refused(algs, round: int, agg, others, ct, proof, caplog) -> Payload:
    """The aggregator ``agg`` lists ``others``' genuine factors and, signed by itself,
    ``ct`` with ``proof`` as its own: every honest peer leaves that factor out (its proof
    does not verify) and refuses the product of the two left (< m_min = 3)."""
    me = agg.ctx.peer_id
    forged = result_of(agg, round, [*others, (me, ct, proof, agg.key.attest(round, he.digest(ct)))])
    text = refused_by_every_honest_peer(algs, round, me, forged, caplog)
    assert text.count(f"factor of '{me}' left out of the product: the proof of plaintext "
                      "knowledge does not verify") == 4
    assert text.count("1 factor(s) left out: 2 contributor(s) < m_min = 3") == 4
    return forged


def test_the_aggregators_cancelling_factor_is_refused_by_every_honest_peer(key_dir5, caplog):
    """Issue 32, 1: p1 lists [p0, p2, p1] with its own factor ct(p2)^-1 * Enc(offsets), so
    that the product decrypts to p0's release alone. It signs its factor (it may) and
    attaches a proof for the part it knows (Enc(offsets)): the proof does not verify."""
    algs = cohort5(key_dir5)
    payloads = {a.ctx.peer_id: a.share(1) for a in algs}
    agg = algs[1]
    two_offsets = 2 * agg.scheme.packer.quantize(np.zeros(agg.num_values))  # 3 summands' offsets
    offsets, proof = agg.scheme.encrypt(two_offsets, 1, "p1")
    cancel = ct_combine(agg.scheme, [payloads["p2"].tensors["ct"], offsets], [-1, 1])
    forged = own_factor_is_refused(algs, 1, agg, [factor_of(payloads["p0"], "p0"),
                                                  factor_of(payloads["p2"], "p2")], cancel, proof, caplog)
    # the attack is real: with 3 shares the product is p0's release (the oracle)
    alone = decrypt_directly(key_dir5, payloads["p0"].tensors["ct"], 1, agg.num_values)
    np.testing.assert_allclose(decrypt_directly(key_dir5, forged.tensors["ct"], 3, agg.num_values), alone)


def test_an_old_ciphertext_folded_into_the_aggregators_factor_is_refused_by_every_honest_peer(
        key_dir5, caplog):
    """Issue 32, 2: the round-2 aggregator p2 cancels p0's and p3's round-2 factors and
    folds in p0's round-1 ciphertext, so that round 3 would publish p0's round-1 release."""
    algs = cohort5(key_dir5)
    run_rounds(algs, 1)
    old = algs[0].my_ct[1]
    new = {a.ctx.peer_id: a.share(2) for a in algs}
    agg = algs[2]
    two_offsets = 2 * agg.scheme.packer.quantize(np.zeros(agg.num_values))
    offsets, proof = agg.scheme.encrypt(two_offsets, 2, "p2")
    folded = ct_combine(agg.scheme, [new["p0"].tensors["ct"], new["p3"].tensors["ct"], old, offsets],
                        [-1, -1, 1, 1])
    forged = own_factor_is_refused(algs, 2, agg, [factor_of(new["p0"], "p0"), factor_of(new["p3"], "p3")],
                                   folded, proof, caplog)
    np.testing.assert_allclose(decrypt_directly(key_dir5, forged.tensors["ct"], 3, agg.num_values),
                               decrypt_directly(key_dir5, old, 1, agg.num_values))


@pytest.mark.parametrize("source", ["another member", "another round"])
def test_a_factor_reused_with_its_proof_is_refused_by_every_honest_peer(key_dir5, caplog, source):
    """Issue 32: the aggregator p2 lists, as its own round-2 factor and signed by itself,
    p3's round-2 ciphertext with p3's proof (another member) or its own round-1
    ciphertext with its round-1 proof (another round); either way one release would
    count twice (or an old one once). The proof is bound to its sender and round."""
    algs = cohort5(key_dir5)
    run_rounds(algs, 1)
    old = {a.ctx.peer_id: a.share(1) for a in algs} if source == "another round" else None
    new = {a.ctx.peer_id: a.share(2) for a in algs}
    agg = algs[2]
    reused = new["p3"] if source == "another member" else old["p2"]
    own_factor_is_refused(algs, 2, agg, [factor_of(new["p0"], "p0"), factor_of(new["p3"], "p3")],
                          reused.tensors["ct"], reused.tensors["ct_proof"], caplog)


def test_a_member_whose_proof_is_for_another_round_is_left_out_by_every_peer_and_the_others_still_sum(
        key_dir5, caplog):
    """Issue 32: a member (p3) sends a fresh round-2 ciphertext, correctly signed, with a
    proof made for round 1. Every honest peer leaves p3's factor out of the product and
    names p3 (the check is the same for everyone, so they all leave out the same factor),
    the four others still form the round's sum (>= m_min), and it decrypts to the sum of
    their releases (oracle: each release decrypted alone with three key files). A missing
    or malformed proof is left out by the aggregator already."""
    algs = cohort5(key_dir5)
    run_rounds(algs, 1)
    payloads = {a.ctx.peer_id: a.share(2) for a in algs}
    p3 = algs[3]
    ct, wrong_round = p3.scheme.encrypt(p3.scheme.packer.quantize(np.zeros(p3.num_values)), 1, "p3")
    payloads["p3"] = Payload("secure_sum", {"ct": ct, "ct_proof": wrong_round},
                             {"round": 2, "attest": p3.key.attest(2, he.digest(ct))})
    p3.my_ct = (2, ct)
    agg = algs[2]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        result = agg.aggregate(2, payloads)
        assert result.meta["contributors"] == ["p0", "p1", "p2", "p3", "p4"]  # its signature is fine
        for a in algs:
            a.absorb(2, {"p2": result})
    assert caplog.text.count("factor of 'p3' left out of the product: the proof of plaintext knowledge "
                             "does not verify") == 4
    honest = [a for a in algs if a is not p3]
    assert all(a.pending["contributors"] == ["p0", "p1", "p2", "p4"] for a in honest)
    assert len({a.pending["digest"] for a in honest}) == 1
    shares = {a.ctx.peer_id: a.share(3) for a in algs}
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        decrypted = algs[4].aggregate(3, shares)
        # p3 holds another product (with its own factor): it cannot check the shares of
        # the honest one against it, so as an aggregator it decrypts nothing, and says so
        assert "protos_round" not in algs[3].aggregate(3, shares).meta
    assert "p3: round 3: 1 decryption share(s) of the round-2 sum, 3 needed" in caplog.text
    assert decrypted.meta["protos_round"] == 2
    clear = sum(decrypt_directly(key_dir5, payloads[p].tensors["ct"], 1, agg.num_values)
                for p in ("p0", "p1", "p2", "p4"))
    expected, _ = P.global_prototypes(torch.from_numpy(clear[: C * 4].reshape(C, 4)),
                                      torch.from_numpy(clear[C * 4:]))
    np.testing.assert_allclose(decrypted.tensors["protos"], expected.float().numpy(), atol=1e-6)
    # no proof, or one cut short: left out by the aggregator, named in the result
    for bad in ({"ct": payloads["p1"].tensors["ct"]},
                {**payloads["p1"].tensors, "ct_proof": payloads["p1"].tensors["ct_proof"][:-1]}):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
            res = agg.aggregate(2, {**payloads, "p1": Payload("secure_sum", bad, payloads["p1"].meta)})
        assert "contribution of p1 left out: no proof of plaintext knowledge of uint8 [" in caplog.text
        assert res.meta["excluded"] == ["p1"]


def test_a_release_beyond_the_fixed_point_range_is_refused_loudly_never_clamped(caplog):
    """Issue 32, 4: at frac_bits 30 the range is +-512: a class count above it used to be
    clamped to 512 without a word. Now the release is not sent, the log says why (ERROR)
    and the metrics count it; the decryption share still goes out."""
    alg = make("fedhp", n=2000, proto_dim=4, secure_sum="plaintext", frac_bits=30, min_contributors=1)
    assert alg.class_sums()[1].max() > 512
    with caplog.at_level(logging.ERROR, logger="hfl.algorithms"):
        payload = alg.share(1)
    assert payload is None
    assert "p0: round 1: release not sent:" in caplog.text and "beyond the fixed-point range +-512" in caplog.text
    assert alg.evaluate()["refused_releases"] == 1.0
    assert make("fedhp", n=2000, proto_dim=4, secure_sum="plaintext", frac_bits=16).share(1) is not None


def test_the_privacy_rules_hold_for_a_method_built_in_code(key_dir):
    # An attack review: FedHPConfig.validate ran only where a config file is built, and
    # FedHP built in code (a plugin, a test, a simulation) took noise_split 3 with
    # min_contributors 3 (the decrypting peer's view of the others kept 2/3 of the noise).
    with pytest.raises(ValueError, match="noise_split"):
        make("fedhp", secure_sum="paillier", key_dir=key_dir, noise_multiplier=1.0,
             noise_split=3, min_contributors=3)
    with pytest.raises(ValueError, match="key_dir"):
        make("fedhp", secure_sum="paillier")
    # (and the bounds a config file's loader checks: noise_split 0 passed the rule above
    # with min_contributors 1, and a single peer's release was decrypted; a review)
    with pytest.raises(ValueError, match="at least 1"):
        make("fedhp", secure_sum="paillier", key_dir=key_dir, noise_split=0, min_contributors=1)


def test_hostile_contributions_are_left_out_with_a_reason(key_dir, caplog):
    algs = [make("fedhp", f"p{i}", proto_dim=4, secure_sum="paillier", key_dir=key_dir) for i in range(4)]
    run_rounds(algs, 1)
    payloads = {a.ctx.peer_id: a.share(2) for a in algs}
    bad_shape = Payload("secure_sum", {"ct": payloads["p0"].tensors["ct"][:1]}, {"round": 2})
    stale = Payload("secure_sum", {"ct": payloads["p2"].tensors["ct"]}, {"round": 1})
    wrong_share = Payload("secure_sum", dict(payloads["p3"].tensors), {**payloads["p3"].meta, "party": 1})
    stranger = Payload("secure_sum", {"ct": payloads["p1"].tensors["ct"]}, {"round": 2})
    contributions = {**payloads, "p0": bad_shape, "p2": stale, "p3": wrong_share, "zz": stranger}
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        result = algs[2].aggregate(2, contributions)
    text = caplog.text
    assert "contribution of p0 left out: ciphertext uint8" in text
    assert "contribution of p2 left out: ciphertext of round 1" in text
    assert "decryption share of p3 left out: party 1" in text
    assert "contribution of zz left out: it holds no key share" in text
    assert sorted(result.meta["excluded"]) == ["p0", "p2", "p3", "zz"]
    # A ciphertext not attested to the aggregator itself would make every peer refuse the
    # product: the aggregator leaves it out (one bad member does not sink the round's sum).
    unattested = Payload("secure_sum", {"ct": payloads["p1"].tensors["ct"]}, {"round": 2})
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        result = algs[2].aggregate(2, {**payloads, "p1": unattested})
    assert "contribution of p1 left out: the attestation must be a 128-character hex signature" in caplog.text
    assert result.meta["contributors"] == ["p0", "p2", "p3"] and result.meta["excluded"] == ["p1"]
    # Plain FedProto too: wrong shapes and non-finite values never reach the mean.
    fp = [make("fedproto", f"p{i}") for i in range(2)]
    good = fp[0].share(1)
    nan = Payload("prototypes", {"rows": np.full((C, E), np.nan, np.float32),
                                 "weights": np.ones(C, np.float32)}, {"round": 1})
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        res = fp[1].aggregate(1, {"p0": good, "p1": nan})
    assert res.meta["contributors"] == ["p0"] and "non-finite" in caplog.text
    np.testing.assert_allclose(res.tensors["protos"], good.tensors["rows"] / good.tensors["weights"][:, None],
                               rtol=1e-5)
    assert fp[0].absorb(2, {"p1": res}) == {"absorbed": 0.0}  # a result of another round


# ------------------------------------------------------------------ learning, checkpoints, options


@pytest.mark.parametrize("name,cfg", [("fedproto", {}), ("fedhp", {"proto_dim": 4}),
                                      ("fedhp", {"proto_dim": 4, "secure_sum": "plaintext",
                                                 "noise_multiplier": 0.3}),
                                      ("fedhp", {"proto_dim": 4, "noise_multiplier": 0.3, "dp_sgd": True,
                                                 "dp_sgd_noise_multiplier": 0.5, "dp_sgd_clip_norm": 5.0}),
                                      ("fedhp", {"proto_dim": 4, "secure_sum": "plaintext", "weighted": False})])
def test_a_short_cohort_learns(name, cfg):
    algs = [make(name, f"p{i}", hidden=(16,) if i % 2 else (16, 16), **cfg) for i in range(3)]
    before = np.mean([a.evaluate()["test_acc"] for a in algs])
    hist = simulate(algs, 10)
    after = np.mean([hist[p][-1]["test_acc"] for p in hist])
    # DP-SGD's noise is fresh from the OS each run: 0.62-0.76 over 12 runs; its floor is
    # ~5 standard deviations below that, the others' the usual (deterministic) bar
    assert after > max(before + 0.3, 0.45 if cfg.get("dp_sgd") else 0.65)
    assert all(a.protos is not None for a in algs)
    assert all(r["proto_loss"] > 0 for r in hist["p0"][2:])


def test_model_heterogeneity_two_and_three_fc_layers():
    algs = [make("fedhp", f"p{i}", proto_dim=4, head_layers=1 + i % 2) for i in range(3)]
    assert len([m for m in algs[1].model.head.modules() if isinstance(m, torch.nn.Linear)]) == 3
    assert len([m for m in algs[0].model.head.modules() if isinstance(m, torch.nn.Linear)]) == 2
    hist = simulate(algs, 3)
    assert all(h[-1]["absorbed"] == 1.0 for h in hist.values())
    assert algs[0].handshake_info() == algs[1].handshake_info() == {"proto_dim": 4}


def test_nearest_prototype_inference_option():
    algs = [make("fedproto", f"p{i}", inference="nearest") for i in range(2)]
    hist = simulate(algs, 4)
    last = hist["p0"][-1]
    assert "head_test_acc" in last and last["test_acc"] == pytest.approx(algs[0].nearest_accuracy(algs[0].ctx.test))
    assert last["test_acc"] > 0.6


def test_checkpoint_round_trip(key_dir, tmp_path):
    cfg = dict(proto_dim=4, secure_sum="paillier", key_dir=key_dir, noise_multiplier=0.5,
               noise_split=2, min_contributors=3)
    algs = [make("fedhp", f"p{i}", **cfg) for i in range(4)]
    run_rounds(algs, 2)
    torch.save(algs[0].state_dict(), tmp_path / "ck.pt")
    back = make("fedhp", "p0", **cfg)
    back.load_state_dict(torch.load(tmp_path / "ck.pt", weights_only=True))
    assert torch.equal(back.protos, algs[0].protos) and back.protos_round == algs[0].protos_round
    assert back.ledger.releases == algs[0].ledger.releases == 2 and back.guard.released.keys() == {1}
    assert np.array_equal(back.pending["ct"], algs[0].pending["ct"])
    a, b = algs[0].share(3), back.share(3)  # the same decryption share, fresh noise
    assert np.array_equal(a.tensors["dshare"], b.tensors["dshare"])
    assert a.meta["dshare_digest"] == b.meta["dshare_digest"]
    assert not np.array_equal(a.tensors["ct"], b.tensors["ct"])
    assert back.decryption_share(3) is None  # the round-2 share was released once, before or after


def test_backbone_from_a_state_dict_file_and_frozen(tmp_path):
    donor = build_model("mlp", (F,), C, E, hidden=[16])
    torch.save({f"features.{k}": v for k, v in donor.features.state_dict().items()}
               | {"fc.weight": torch.zeros(1000, 512)}, tmp_path / "backbone.pth")
    alg = make("fedhp", proto_dim=4, backbone_weights=str(tmp_path / "backbone.pth"), freeze_backbone=True)
    for k, v in donor.features.state_dict().items():
        assert torch.equal(alg.model.features.state_dict()[k], v)
    head_before = [p.detach().clone() for p in alg.model.head.parameters()]
    alg.local_update(1)
    assert all(torch.equal(p, q) for p, q in zip(alg.model.features.parameters(),
                                                 donor.features.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(alg.model.head.parameters(), head_before, strict=True))
    torch.save({"other.weight": torch.zeros(2, 2)}, tmp_path / "nothing.pth")
    with pytest.raises(ValueError, match="no entry matches"):
        make("fedhp", proto_dim=4, backbone_weights=str(tmp_path / "nothing.pth"))


def launch_example(tmp_path, sets: list[str]) -> None:
    """``hfl-launch examples/fedhp_digits.yaml --set ...`` into tmp_path/run; it must succeed."""
    sets = [*sets, f"run_dir={tmp_path / 'run'}"]
    proc = subprocess.run([sys.executable, "-m", "hfl.launch.cli", str(ROOT / "examples" / "fedhp_digits.yaml"),
                           "--quiet", *[a for s in sets for a in ("--set", s)]],
                          capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_example_through_hfl_launch_paillier_secure_sum_survives_n_minus_t_dead_peers(tmp_path):
    """The real launcher and peers over ZeroMQ: 5 peers, keys 3 of 5, two peers
    killed in round 2; every later round still decrypts the previous sum."""
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "hfl.peer.he_keys", "--peers", "5", "--threshold", "3",
                    "--bits", "512", "--allow-weak-key", "--out", str(keys)],
                   check=True, capture_output=True)
    launch_example(tmp_path, [
        "defaults.cohort.rounds=4", "defaults.train.max_batches=3",
        "defaults.algorithm.secure_sum=paillier", f"defaults.algorithm.key_dir={keys}",
        "defaults.algorithm.noise_multiplier=1.0", "defaults.algorithm.noise_split=2",
        "defaults.algorithm.min_contributors=3", "defaults.timing.round_timeout_s=20",
        "defaults.algorithm.dp_sgd=true", "faults=[{peer: p3, at_round: 2}, {peer: p4, at_round: 2}]",
        # Crash faults only: with f = 1 (the default with signing keys) a commit needs 4 of
        # the 5 peers' signed acks, and two dead peers leave 3 (docs/fedhp.md).
        "defaults.node.byzantine=0"])
    for i in range(3):
        rows = [json.loads(line) for line in (tmp_path / "run" / f"p{i}" / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rows] == [1, 2, 3, 4]
        assert [r["protos_round"] for r in rows] == [0, 1, 2, 3]  # each round decrypts the last one's sum
        assert [r["contributors"] for r in rows[2:]] == [3, 3]  # only the three live peers
        assert rows[-1]["dp_releases"] == 4 and rows[-1]["dp_epsilon"] > rows[0]["dp_epsilon"] > 0
        # DP-SGD composed with the releases: more than the releases alone
        assert rows[-1]["dp_epsilon"] > rows[-1]["dp_epsilon_releases"] and rows[-1]["dp_sgd_steps"] == 12
        ledger = json.loads((tmp_path / "run" / f"p{i}" / "privacy_ledger.json").read_text())
        assert ledger == {"releases": 4, "sgd_steps": 12}


# ------------------------------------------------------------------ privacy against an adversary


class DictStore:
    """ctx.store in memory: what a restarted peer finds in its run directory."""

    def __init__(self):
        self.files: dict[str, bytes] = {}

    def write(self, name, data):
        self.files[name] = bytes(data)

    def read(self, name):
        return self.files.get(name)


def test_noise_is_unpredictable_from_the_config_and_differs_between_peers():
    """Issue 17, 1: every peer used to add bit-identical noise derived from node.seed,
    so anyone with the config could subtract it. Two peers built from the same seed and
    data, and a rerun of the same peer, now add different noise."""
    a, b = (make("fedhp", "p0", proto_dim=4, noise_multiplier=1.0) for _ in range(2))
    clean = P.release_rows(*a.class_sums(a.cfg.clip_norm), True)
    ra, rb = a.release(1), b.release(1)
    noise_a, noise_b = ra[0] - clean[0], rb[0] - clean[0]
    assert not torch.allclose(noise_a, noise_b)
    rerun = make("fedhp", "p0", proto_dim=4, noise_multiplier=1.0).release(1)
    assert not torch.allclose(rerun[0] - clean[0], noise_a)
    # ... and the noise regenerated from the config's seed is not the noise that was added
    gen = torch.Generator().manual_seed(a.ctx.seed + 7_777_777)
    guess = torch.randn(clean[0].shape, generator=gen, dtype=torch.float64) * dp.noise_stds(1.0, 1.0)[0]
    assert not torch.allclose(ra[0] - guess.to(ra[0].dtype), clean[0], atol=0.5)
    assert "noise_gen" not in a.state_dict()  # nothing about the noise is checkpointed


def test_a_release_is_on_disk_before_it_leaves_and_a_restart_never_replays_it():
    store = DictStore()
    alg = make("fedhp", proto_dim=4, noise_multiplier=1.0)
    alg.ctx.store = store
    alg.ledger = dp.PrivacyLedger(store)
    before_round = alg.state_dict()  # the last checkpoint, written before round 1
    sent = alg.share(1)  # the payload is handed to the network after this returns
    assert json.loads(store.files["privacy_ledger.json"]) == {"releases": 1, "sgd_steps": 0}
    # The peer dies before its round-1 checkpoint; it restarts from the older one.
    back = make("fedhp", proto_dim=4, noise_multiplier=1.0)
    back.ctx.store = store
    back.ledger = dp.PrivacyLedger(store)
    back.load_state_dict(before_round)
    assert back.ledger.releases == 1  # the ledger is ahead of the checkpoint: it wins
    again = back.share(1)
    assert not np.array_equal(again.tensors["rows"], sent.tensors["rows"])  # fresh noise
    assert back.ledger.releases == 2 and back.evaluate()["dp_releases"] == 2.0
    store.files["privacy_ledger.json"] = b"{broken"
    with pytest.raises(ValueError, match="privacy_ledger.json is unreadable"):
        dp.PrivacyLedger(store)


def test_the_runtime_gives_algorithms_a_durable_store(tmp_path):
    from hfl.peer.checkpoint import RunStore

    store = RunStore(tmp_path / "run" / "p0")  # not made yet: the first write makes it
    assert store.read("x.json") is None
    store.write("x.json", b"{}")
    assert store.read("x.json") == b"{}" and not (tmp_path / "run" / "p0" / "x.json.tmp").exists()


def test_epsilon_is_null_with_a_reason_unless_training_is_dp_sgd(caplog):
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        plain = make("fedhp", proto_dim=4, noise_multiplier=1.0)
    assert caplog.text.count("epsilon is not a guarantee") == 1  # said once, at start
    plain.share(1)
    m = plain.evaluate()
    assert m["dp_epsilon"] is None and "algorithm.dp_sgd: true" in m["dp_epsilon_reason"]
    assert m["dp_epsilon_releases"] == pytest.approx(dp.Accountant(1.0, 1e-5).epsilon(1))
    assert make("fedhp", proto_dim=4).evaluate().keys().isdisjoint({"dp_epsilon", "dp_epsilon_reason"})
    priv = make("fedhp", proto_dim=4, noise_multiplier=2.0, dp_sgd=True, dp_sgd_noise_multiplier=1.1)
    hist = simulate([priv], 3)
    q = priv.dpsgd.sample_rate
    assert q == pytest.approx(16 / 60) and priv.dpsgd.steps_per_epoch == 4
    last = hist["p0"][-1]
    assert last["dp_sgd_steps"] == 12 and last["dp_releases"] == 3
    # all three releases composed with the 12 DP-SGD steps taken before the last one
    assert last["dp_epsilon"] == pytest.approx(dp.Accountant(2.0, 1e-5, "rdp", 1.1, q).epsilon(3, 12))
    assert last["dp_epsilon"] > last["dp_epsilon_releases"] and "dp_epsilon_reason" not in last


def test_dp_sgd_epsilon_matches_opacus_accountant():
    from opacus.accountants import RDPAccountant

    for sigma, q, steps in [(1.1, 16 / 60, 12), (1.0, 0.01, 1000), (0.8, 0.1, 200)]:
        ours = dp.Accountant(1.0, 1e-5, "rdp", sigma, q).epsilon(0, steps)
        theirs = RDPAccountant()
        theirs.history = [(sigma, q, steps)]
        assert ours == pytest.approx(theirs.get_epsilon(1e-5), rel=0.03), (sigma, q, steps)
    # composing with releases only adds privacy loss
    acc = dp.Accountant(2.0, 1e-5, "rdp", 1.0, 0.01)
    assert acc.epsilon(5, 1000) > max(acc.epsilon(0, 1000), acc.epsilon(5))
    assert dp.Accountant(2.0, 1e-5, "pld", 1.0, 0.01).epsilon(5, 1000) <= acc.epsilon(5, 1000) * 1.001


def test_dp_sgd_clips_each_sample_adds_fresh_noise_and_refuses_batchnorm():
    from hfl.algorithms.dpsgd import DPSGD

    # One sample with a huge gradient moves the weights no more than clip_norm allows.
    torch.manual_seed(0)
    model = build_model("mlp", (F,), C, E, hidden=[16])
    x = np.full((1, F), 30.0, np.float32)
    y = model(torch.from_numpy(x)).argmin(1).numpy()  # the least likely class: a large gradient
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    assert float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm()) > 10
    model.zero_grad(set_to_none=True)
    ds = ArrayDataset(x, y, C)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    trainer = DPSGD(model, opt, batch_size=1, dataset_size=1, noise_multiplier=1e-9, clip_norm=0.5)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    trainer.train(ds, 1, torch.device("cpu"), lambda x, y: torch.nn.functional.cross_entropy(model(x), y))
    moved = torch.cat([p.detach().flatten() for p in model.parameters()]) - before
    assert float(moved.norm()) <= 0.5 + 1e-6 and float(moved.norm()) > 0.4
    # Noise from the OS: two runs from the same weights and data end apart.
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        m = build_model("mlp", (F,), C, E, hidden=[16])
        t = DPSGD(m, torch.optim.SGD(m.parameters(), lr=0.1), batch_size=16, dataset_size=60,
                  noise_multiplier=1.0, clip_norm=1.0)
        t.train(dataset(1, 60), 3, torch.device("cpu"), lambda x, y, m=m: torch.nn.functional.cross_entropy(m(x), y))
        runs.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert not torch.allclose(runs[0], runs[1])
    bn = torch.nn.Sequential(torch.nn.Linear(F, 4), torch.nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match=r"dp_sgd: .* 1 \(BatchNorm1d\)"):
        DPSGD(bn, torch.optim.SGD(bn.parameters(), lr=0.1), batch_size=4, dataset_size=8,
              noise_multiplier=1.0, clip_norm=1.0)


def clipped_sum(alg, x, y) -> torch.Tensor:
    """Opacus's sum of the per-sample clipped gradients of FedHP's loss on batch (x, y),
    before noise: what DP-SGD's sensitivity is about."""
    opt = alg.dpsgd.dp_optimizer
    alg.model.train()
    opt.zero_grad(set_to_none=True)
    with warnings.catch_warnings():  # Opacus's hooks on a first layer whose input needs no grad
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        alg.loss(x, y, 2).backward()
    opt.clip_and_accumulate()
    out = torch.cat([p.summed_grad.flatten().clone() for p in opt.params])
    opt.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("clip", [100.0, 0.05])
def test_one_samples_clipped_contribution_does_not_depend_on_the_batch_when_classes_are_missing(clip):
    """Issue 32, 3: with class 1 lacking a global prototype, the contrastive term was the
    mean over the B' samples of the other classes, and Opacus scales per-sample gradients
    by the whole batch B, so each sample's gradient was B/B' times its own and adding one
    sample moved the others'. Oracle: each sample's gradient computed alone (a batch of
    one), clipped, summed; and adding a sample moves the clipped sum by at most C."""
    alg = make("fedhp", proto_dim=4, noise_multiplier=1.0, dp_sgd=True, dp_sgd_clip_norm=clip, lam=2.0)
    torch.manual_seed(3)
    alg.protos = torch.nn.functional.normalize(torch.randn(C, 4), dim=1)
    alg.present = torch.tensor([True, False, True])
    ds = dataset(7, 40)
    x, y = torch.from_numpy(ds.x[:10]), torch.from_numpy(ds.y[:10]).clone()
    y[:7] = 1  # most of the batch has no prototype: B / B' = 10 / 3
    y[7:] = torch.tensor([0, 2, 0])
    extra_x, extra_y = torch.from_numpy(ds.x[10:11]), torch.tensor([2])
    alone = [clipped_sum(alg, x[i:i + 1], y[i:i + 1]) for i in range(len(y))]
    extra = clipped_sum(alg, extra_x, extra_y)
    assert all(float(g.norm()) <= clip * (1 + 1e-5) for g in [*alone, extra])
    if clip == 0.05:
        assert all(float(g.norm()) == pytest.approx(clip, rel=1e-4) for g in alone)  # clipping bites
    batch = clipped_sum(alg, x, y)
    torch.testing.assert_close(batch, torch.stack(alone).sum(0), rtol=1e-4, atol=1e-6)
    neighbour = clipped_sum(alg, torch.cat([x, extra_x]), torch.cat([y, extra_y]))
    torch.testing.assert_close(neighbour - batch, extra, rtol=1e-4, atol=1e-6)
    assert float((neighbour - batch).norm()) <= clip * (1 + 1e-4)


def test_frac_bits_reaches_the_fixed_point_code():
    errors = {}
    for bits in (4, 16, 30):
        alg = make("fedhp", proto_dim=4, secure_sum="plaintext", frac_bits=bits)
        assert alg.scheme.packer.frac_bits == bits
        v = np.linspace(-1, 1, 101)
        codes = alg.scheme.packer.quantize(v)
        errors[bits] = np.abs(alg.scheme.packer.dequantize(codes, 1) - v).max()
        assert errors[bits] <= 2.0 ** -(bits + 1) + 1e-15
    assert errors[4] > errors[16] > errors[30]


def test_a_peer_whose_model_dp_sgd_cannot_train_is_a_config_error_naming_the_layers(tmp_path):
    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.configtools import ConfigError
    from hfl.peer.factory import build_algorithm

    exp = load_experiment(str(ROOT / "examples" / "fedhp_digits.yaml"), [
        "defaults.model.arch=sresnet", "defaults.model.options={}", "defaults.algorithm.dp_sgd=true",
        "defaults.algorithm.noise_multiplier=1", f"run_dir={tmp_path}"])
    plan = expand(exp, gpus=[], ports=list(range(42000, 42000 + exp.peers)))[0]
    with pytest.raises(ConfigError, match=r"^algorithm: dp_sgd: .*features\.extractor\.bn1 \(BatchNorm2d\)"):
        build_algorithm(plan.config)


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_release_sent_before_a_crash_is_counted_after_the_restart(tmp_path):
    """The real launcher and peers: p1 dies in round 2 right after sending its noisy
    release (before its checkpoint) and is restarted from its round-1 checkpoint. The
    release it sent still counts: the ledger was on disk before it left. (Before, the
    restarted peer's accountant forgot it and re-ran with the same noise.)"""
    # Restarted when the cohort reaches round 3, it must rejoin before round 12: 0.3 s
    # rounds left a restart on a loaded machine (load 5.6) too little time with 6.
    launch_example(tmp_path, ["defaults.cohort.rounds=12", "defaults.train.local_epochs=15",
                              "defaults.algorithm.noise_multiplier=1.0",
                              "faults=[{peer: p1, at_round: 2, phase: wait, restart_at_round: 3}]"])
    p1 = tmp_path / "run" / "p1"
    assert "injected crash in round 2 (wait)" in (p1 / "peer.log").read_text()
    rows = [json.loads(line) for line in (p1 / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["round"] == 1 and rows[1]["incarnation"] == 1  # round 2 never finished in life 0
    ledger = json.loads((p1 / "privacy_ledger.json").read_text())
    assert ledger["releases"] == len(rows) + 1  # every finished round's release and the crashed one
    assert rows[-1]["dp_releases"] == ledger["releases"]
