"""MDH-FL (``mdhfl``), its baselines (``feddf``, ``solo`` with SCE) and its models:
SCE and the weighted KL against hand-computed values, the client-confidence
weights, public batches every peer derives alike, hostile posteriors, FedDF's
group averaging against numpy, a short cohort that learns, checkpoints, and
the example through the real ``hfl-launch``."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hfl.algorithms.base import AlgorithmContext, Payload, module_to_arrays
from hfl.algorithms.feddf import FedDF, FedDFConfig, group_average, signature
from hfl.algorithms.mdhfl import MDHFL, MDHFLConfig, public_round_indices
from hfl.algorithms.registry import get_algorithm
from hfl.algorithms.sce import (
    classification_loss,
    confidence_weights,
    reverse_cross_entropy,
    sce_loss,
    weighted_kl,
)
from hfl.algorithms.settings import TrainConfig
from hfl.algorithms.simulate import simulate
from hfl.data import ArrayDataset
from hfl.models import build_model
from hfl.peer.configtools import ConfigError, build

ROOT = Path(__file__).resolve().parents[1]
C = 3
LOG_1E4 = -math.log(1e-4)  # 9.2103...

# ---------------------------------------------------------------- SCE and KL


def test_sce_matches_hand_computed_values():
    # logits (2, 1, 0): p = (0.665241, 0.244728, 0.090031) (e^2, e^1, e^0 over their sum)
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    label = torch.tensor([0])
    ce = -math.log(0.6652409558)  # 0.4076060
    rce = LOG_1E4 * (0.2447284711 + 0.0900305732)  # 3.0832447: RCE = -log(1e-4) (1 - p_y)
    assert float(reverse_cross_entropy(logits, label)) == pytest.approx(rce, rel=1e-6)
    assert float(sce_loss(logits, label)) == pytest.approx(0.1 * ce + 1.0 * rce, rel=1e-6)
    assert float(sce_loss(logits, label, alpha=1.0, beta=0.5)) == pytest.approx(ce + 0.5 * rce, rel=1e-6)
    assert float(classification_loss("ce", logits, label)) == pytest.approx(ce, rel=1e-6)


def test_rce_clamps_tiny_probabilities_to_1e_7_and_averages_the_batch():
    # p = (1, e^-30, e^-30) up to 1e-13: both wrong classes clamp to 1e-7; the label
    # row clamps to 1e-4 off the true class, log 1 = 0 on it.
    logits = torch.tensor([[0.0, -30.0, -30.0], [0.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2])
    row0 = LOG_1E4 * (1e-7 + 1e-7)
    row1 = LOG_1E4 * (2 / 3)
    assert float(reverse_cross_entropy(logits, labels)) == pytest.approx((row0 + row1) / 2, rel=1e-5)


def test_sce_gradient_is_bounded_on_a_confidently_wrong_label():
    # CE's gradient on the true logit tends to -1; RCE's to -A p_y (1 - p_y) -> 0 when p_y -> 0.
    logits = torch.tensor([[8.0, 0.0, 0.0]], requires_grad=True)
    reverse_cross_entropy(logits, torch.tensor([2])).backward()
    assert abs(float(logits.grad[0, 2])) < 1e-2


def test_weighted_kl_matches_numpy():
    rng = np.random.default_rng(0)
    student = rng.normal(size=(4, C))
    teachers = [rng.dirichlet(np.ones(C), size=4) for _ in range(2)]
    teachers[1][0] = [0.0, 0.5, 0.5]  # 0 log 0 = 0
    weights = [0.25, 0.6]
    log_p = student - np.log(np.exp(student).sum(axis=1, keepdims=True))
    expected = 0.0
    for q, w in zip(teachers, weights, strict=True):
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(q > 0, q * (np.log(q) - log_p), 0.0)
        expected += w * terms.sum(axis=1).mean()
    got = weighted_kl(torch.tensor(student), [torch.tensor(q) for q in teachers], weights)
    assert float(got) == pytest.approx(expected, rel=1e-9)


def test_confidence_weights_follow_the_authors_formula():
    prev = {"a": 1.0, "b": 2.0, "c": 1.5}
    cur = {"a": 0.5, "b": 1.0, "c": 1.2}
    # quality = (prev - cur) / cur = (1.0, 1.0, 0.25), sum 2.25; amount = 1/2 + 0.5 q / 2.25
    amount = np.array([0.5 + 0.5 * 1.0 / 2.25, 0.5 + 0.5 * 1.0 / 2.25, 0.5 + 0.5 * 0.25 / 2.25])
    soft = np.exp(amount) / np.exp(amount).sum()
    got = confidence_weights(prev, cur, beta=0.5)
    assert [got[k] for k in "abc"] == pytest.approx(list(soft), rel=1e-12)
    assert confidence_weights({"a": 1.0}, cur) is None  # a peer without last round's loss
    assert confidence_weights({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0}) is None  # qualities sum to 0
    # A loss of exactly 0.0 (float32 cross-entropy of a confident model) has no relative
    # drop: uniform weights, not a ZeroDivisionError in the peer's absorb (a review).
    assert confidence_weights({"a": 0.5, "b": 1.0}, {"a": 0.0, "b": 0.9}) is None


# ---------------------------------------------------------------- mdhfl on tensors


def dataset(seed: int, n: int, features: int = 6) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    x = rng.normal(size=(n, features)).astype(np.float32) + 1.5 * np.eye(features, dtype=np.float32)[y]
    return ArrayDataset(x, y, C)


def context(peer: str, seed: int = 0, cohort_seed: int = 7, hidden=(16,), public=None) -> AlgorithmContext:
    torch.manual_seed(seed)
    return AlgorithmContext(
        peer_id=peer, model=build_model("mlp", (6,), C, 8, hidden=list(hidden)),
        train=dataset(10 + seed, 60), test=dataset(99, 40), num_classes=C,
        device=torch.device("cpu"), seed=seed, train_cfg=TrainConfig(lr=0.05, batch_size=16),
        public=public if public is not None else dataset(5, 200), cohort_seed=cohort_seed)


def test_every_peer_derives_the_same_public_batches_without_coordination():
    a = MDHFL(context("p0", seed=1), MDHFLConfig(public_batch=16, public_batches=3))
    b = MDHFL(context("p1", seed=2), MDHFLConfig(public_batch=16, public_batches=3))
    for r in (1, 2, 9):
        np.testing.assert_array_equal(a.round_indices(r), b.round_indices(r))
        np.testing.assert_array_equal(a.share(r).tensors["idx"], b.share(r).tensors["idx"])
    assert len(set(a.round_indices(1))) == 48  # no repeats while the set is large enough
    assert not np.array_equal(a.round_indices(1), a.round_indices(2))
    assert not np.array_equal(public_round_indices(200, 7, 1, 48), public_round_indices(200, 8, 1, 48))
    wrapped = public_round_indices(5, 0, 1, 12)  # more than the set holds: whole permutations
    assert sorted(wrapped[:5]) == [0, 1, 2, 3, 4] and sorted(wrapped[5:10]) == [0, 1, 2, 3, 4]


def test_share_broadcasts_probability_rows_on_the_round_batch():
    alg = MDHFL(context("p0"), MDHFLConfig(public_batch=8, public_batches=2))
    payload = alg.share(1)
    assert payload.tensors["probs"].shape == (16, C)
    np.testing.assert_allclose(payload.tensors["probs"].sum(axis=1), 1.0, atol=1e-6)
    assert payload.meta == {}  # uniform weighting sends nothing else


def test_absorb_takes_one_step_per_public_batch_on_the_weighted_kl():
    ctx = context("p0", seed=3)
    ctx.train_cfg = TrainConfig(optimizer="sgd", lr=0.1, momentum=0.0)
    alg = MDHFL(ctx, MDHFLConfig(public_batch=10, public_batches=1))
    idx = alg.round_indices(1)
    rng = np.random.default_rng(1)
    received = {p: Payload("posteriors", {"idx": idx.copy(), "probs": rng.dirichlet(np.ones(C), 10)})
                for p in ("p1", "p2")}
    # the oracle: one SGD step on (KL(q1||p) + KL(q2||p)) / 2 (eq. 3, P = 3)
    ref = build_model("mlp", (6,), C, 8, hidden=[16])
    ref.load_state_dict(alg.model.state_dict())
    x = torch.from_numpy(ctx.public.x[idx])
    log_p = torch.log_softmax(ref(x), dim=1)
    loss = sum(0.5 * (torch.tensor(received[p].tensors["probs"]) *
                      (torch.log(torch.tensor(received[p].tensors["probs"])) - log_p)).sum(1).mean()
               for p in ("p1", "p2"))
    loss.backward()
    expected = {k: v.detach() - 0.1 * v.grad for k, v in ref.named_parameters()}
    metrics = alg.absorb(1, received)
    assert metrics["teachers"] == 2 and metrics["kl_loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    for k, v in alg.model.named_parameters():
        torch.testing.assert_close(v.detach(), expected[k], rtol=1e-5, atol=1e-6)


def hostile_payloads(idx: np.ndarray) -> dict[str, tuple[Payload, str]]:
    good = np.full((len(idx), C), 1.0 / C, dtype=np.float32)
    nan = good.copy()
    nan[0, 0] = np.nan
    neg = good.copy()
    neg[0] = [-0.5, 1.0, 0.5]
    return {
        "other_samples": (Payload("p", {"idx": idx[::-1].copy(), "probs": good}), "other public samples"),
        "short": (Payload("p", {"idx": idx, "probs": good[:-1]}), "shape"),
        "classes": (Payload("p", {"idx": idx, "probs": np.full((len(idx), C + 1), 0.25)}), "shape"),
        "nan": (Payload("p", {"idx": idx, "probs": nan}), "non-finite"),
        "negative": (Payload("p", {"idx": idx, "probs": neg}), "outside [0, 1]"),
        "unnormalised": (Payload("p", {"idx": idx, "probs": good * 2.5}), "do not sum to 1"),
        "above_one": (Payload("p", {"idx": idx, "probs": good * 3.5}), "outside [0, 1]"),
        "rows": (Payload("p", {"idx": idx, "probs": good * 0.5}), "do not sum to 1"),
        "ints": (Payload("p", {"idx": idx, "probs": np.ones((len(idx), C), dtype=np.int64)}), "dtype"),
        "missing": (Payload("p", {"idx": idx}), "missing"),
        "float_idx": (Payload("p", {"idx": idx.astype(np.float64), "probs": good}), "expected integers"),
    }


def test_hostile_or_ill_shaped_posteriors_are_dropped_with_a_reason(caplog):
    alg = MDHFL(context("p0"), MDHFLConfig(public_batch=8, public_batches=1))
    idx = alg.round_indices(1)
    before = {k: v.clone() for k, v in alg.model.state_dict().items()}
    hostile = hostile_payloads(idx)
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        metrics = alg.absorb(1, {p: payload for p, (payload, _) in hostile.items()})
    assert metrics == {"teachers": 0.0, "dropped": float(len(hostile))}
    for peer, (_, reason) in hostile.items():
        assert any(peer in r.message and reason in r.message for r in caplog.records), peer
    for k, v in alg.model.state_dict().items():
        torch.testing.assert_close(v, before[k])  # nothing learned from garbage


def test_a_good_teacher_still_counts_beside_hostile_ones():
    alg = MDHFL(context("p0"), MDHFLConfig(public_batch=8, public_batches=1))
    idx = alg.round_indices(1)
    good = Payload("p", {"idx": idx.copy(), "probs": np.full((8, C), 1.0 / C, dtype=np.float32)})
    metrics = alg.absorb(1, {"ok": good, "bad": hostile_payloads(idx)["nan"][0]})
    assert metrics["teachers"] == 1 and metrics["dropped"] == 1 and math.isfinite(metrics["kl_loss"])


def test_confidence_weighting_shares_the_private_loss_and_reweights_from_round_two(caplog):
    cfg = MDHFLConfig(public_batch=8, public_batches=1, weighting="confidence")
    peers = [MDHFL(context(f"p{i}", seed=i), cfg) for i in range(3)]
    history = simulate(peers, rounds=3)
    assert [r["confidence_weighted"] for r in history["p0"]] == [0.0, 1.0, 1.0]
    payload = peers[0].share(4)
    assert payload.meta["private_loss"] == pytest.approx(peers[0].private_loss())
    idx = peers[0].round_indices(4)
    bad = Payload("p", {"idx": idx, "probs": np.full((8, C), 1.0 / C, dtype=np.float32)},
                  {"private_loss": float("nan")})
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        assert peers[0].absorb(4, {"p9": bad})["dropped"] == 1
    assert "private_loss must be a finite number > 0" in caplog.text


def digits_peer(i: int, algorithm: str, partition: str = "iid", options=None):
    """Peer i of 3 on real digits through the factory: noisy private labels, rotated public set."""
    from hfl.peer.config import config_from_dict
    from hfl.peer.factory import build_algorithm

    return build_algorithm(config_from_dict({
        "node": {"id": f"p{i}", "seed": i}, "security": {"mode": "none"},
        "cohort": {"algorithm": algorithm, "rounds": 6, "seed": 0},
        "data": {"dataset": "digits", "partition": partition, "num_partitions": 3, "partition_index": i,
                 "label_noise": {"type": "pair", "rate": 0.2},
                 "public_set": {"dataset": "rotated_digits", "size": 300, "disjoint": True,
                                "options": {"angle": 30, "size": 8, "per_class": None}}},
        "model": {"arch": "mlp", "options": {"hidden": [[64], [128], [32]][i]}},
        "train": {"optimizer": "adam", "lr": 0.003, "batch_size": 32},
        "algorithm": options or {},
    }))[0]


def test_a_short_cohort_on_noisy_digits_learns_from_matching_public_batches():
    peers = [digits_peer(i, "mdhfl", options={"public_batch": 32, "public_batches": 2}) for i in range(3)]
    history = simulate(peers, rounds=6)
    first = np.mean([history[p][0]["global_acc"] for p in history])
    last = np.mean([history[p][-1]["global_acc"] for p in history])
    assert last > max(0.7, first + 0.2)  # clean held-out digits, 20% of the labels flipped
    # every peer learned from both others every round: their public indices matched ours
    assert all(r["teachers"] == 2 and r["dropped"] == 0 for recs in history.values() for r in recs)
    assert all(0.1 < r["label_noise_rate"] < 0.3 for recs in history.values() for r in recs)


def test_simulated_fedmd_peers_each_digest_the_consensus_on_the_rounds_public_batch():
    # FedMD's round batch comes from one owner's public set (rotating); a peer holds the
    # others' sets once they arrived (the runtime's join waits for them). The in-process
    # simulation handed none over, so 3 of 4 peers of bench/compare_mdhfl.py's FedMD
    # digested nothing and trained exactly as SOLO, silently.
    peers = [digits_peer(i, "fedmd", options={"public_batch": 16}) for i in range(3)]
    history = simulate(peers, rounds=3)
    assert [[r["digested"] for r in history[p]] for p in sorted(history)] == [[1.0] * 3] * 3


def test_fedmd_says_when_it_cannot_digest_a_consensus(caplog):
    peer = digits_peer(0, "fedmd", options={"public_batch": 16})
    consensus = Payload("scores", {"idx": np.arange(16), "logits": np.zeros((16, 10), np.float32)},
                        meta={"owner": "p7"})
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        assert peer.absorb(1, {"p1": consensus}) == {"digested": 0.0}
    assert "no seed set of that peer here" in caplog.text


def test_checkpoint_round_trip_keeps_model_optimizer_and_confidence_history(tmp_path):
    cfg = MDHFLConfig(public_batch=8, public_batches=1, weighting="confidence")
    peers = [MDHFL(context(f"p{i}", seed=i), cfg) for i in range(2)]
    simulate(peers, rounds=2)
    torch.save(peers[0].state_dict(), tmp_path / "ck.pt")
    fresh = MDHFL(context("p0", seed=0), cfg)
    with torch.no_grad():
        for v in fresh.model.parameters():
            v.add_(1.0)  # anything the checkpoint does not restore would show
    fresh.load_state_dict(torch.load(tmp_path / "ck.pt", weights_only=True))
    assert fresh._last_loss == peers[0]._last_loss and len(fresh._last_loss) == 2
    for a, b in zip(fresh.model.state_dict().values(), peers[0].model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    # both continue identically
    for alg in (fresh, peers[0]):
        torch.manual_seed(0)
        alg.local_update(3)
    for a, b in zip(fresh.model.parameters(), peers[0].model.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_options_are_validated_and_another_methods_options_are_an_error():
    with pytest.raises(ConfigError, match="allowed: 'uniform', 'confidence'"):
        build(get_algorithm("mdhfl").Config, {"weighting": "softmax"}, "algorithm")
    with pytest.raises(ConfigError, match="digest_steps: unknown key"):
        build(get_algorithm("mdhfl").Config, {"digest_steps": 3}, "algorithm")
    with pytest.raises(ConfigError, match="algorithm.loss: got 'mae'"):
        build(get_algorithm("solo").Config, {"loss": "mae"}, "algorithm")
    with pytest.raises(ValueError, match="data.public_set"):
        MDHFL(context("p0", public=ArrayDataset(np.zeros((0, 6)), np.zeros(0), C)))


def test_solo_with_sce_trains_on_the_sce_loss():
    solo = get_algorithm("solo")(context("p0"), build(get_algorithm("solo").Config, {"loss": "sce"}))
    x, y = torch.from_numpy(solo.ctx.train.x[:8]), torch.from_numpy(solo.ctx.train.y[:8])
    with torch.no_grad():
        assert float(solo.loss(x, y, 1)) == pytest.approx(float(sce_loss(solo.model(x), y)))
    plain = get_algorithm("solo")(context("p0"))
    with torch.no_grad():
        assert float(plain.loss(x, y, 1)) == pytest.approx(
            float(torch.nn.functional.cross_entropy(plain.model(x), y)))


# ---------------------------------------------------------------- feddf


def feddf_peers(cfg: FedDFConfig) -> list[FedDF]:
    hidden = {"p0": (16,), "p1": (8,), "p2": (16,), "p3": (8,)}
    return [FedDF(context(p, seed=i, hidden=h), cfg) for i, (p, h) in enumerate(hidden.items())]


def test_feddf_averages_within_architecture_groups_like_numpy():
    peers = feddf_peers(FedDFConfig(public_batch=8, public_batches=1, distill_steps=0))
    for p in peers:
        p.local_update(1)
    payloads = {p.ctx.peer_id: p.share(1) for p in peers}
    result = peers[0].aggregate(1, payloads)
    groups = {tuple(g[2]): g[1] for g in result.meta["groups"]}
    assert set(groups) == {("p0", "p2"), ("p1", "p3")}
    for members, prefix in groups.items():
        counts = np.array([len(peers[int(m[1])].ctx.train) for m in members], dtype=np.float64)
        for name, got in ((k[len(prefix):], v) for k, v in result.tensors.items() if k.startswith(prefix)):
            stack = np.stack([payloads[m].tensors["w/" + name] for m in members]).astype(np.float64)
            expected = np.tensordot(counts / counts.sum(), stack, axes=1)
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    teacher = np.mean([payloads[p].tensors["logits"].astype(np.float64) for p in sorted(payloads)], axis=0)
    np.testing.assert_allclose(result.tensors["teacher"], teacher, rtol=1e-6, atol=1e-7)
    # with no distillation steps a member ends exactly on its group's mean
    assert peers[1].absorb(1, {"p0": result})["absorbed"] == 1
    for name, v in module_to_arrays(peers[1].model).items():
        np.testing.assert_array_equal(v, result.tensors[groups[("p1", "p3")] + name])


def test_group_average_groups_by_the_arrays_not_by_a_claim():
    a = {"w": np.ones((2, 2), np.float32)}
    b = {"w": np.zeros((2, 3), np.float32)}
    c = {"w": np.full((2, 2), 3.0, np.float32)}
    means, members = group_average({"a": a, "b": b, "c": c}, {"a": 1, "b": 1, "c": 3})
    assert members[signature(a)] == ["a", "c"] and members[signature(b)] == ["b"]
    np.testing.assert_allclose(means[signature(a)]["w"], np.full((2, 2), 2.5))


def test_feddf_distils_the_group_mean_towards_the_ensemble():
    from hfl.algorithms.base import arrays_to_module
    from hfl.algorithms.feddf import distill_loss

    peers = feddf_peers(FedDFConfig(public_batch=8, public_batches=2, distill_steps=10, distill_lr=0.01))
    history = simulate(peers, rounds=2)
    assert all(r["absorbed"] == 1 for recs in history.values() for r in recs)
    result = peers[0].aggregate(3, {p.ctx.peer_id: p.share(3) for p in peers})
    prefix = next(g[1] for g in result.meta["groups"] if "p0" in g[2])
    x = torch.from_numpy(peers[0].ctx.public.x[result.tensors["idx"]])
    teacher = torch.from_numpy(result.tensors["teacher"])

    def gap() -> float:
        peers[0].model.eval()
        with torch.no_grad():
            return float(distill_loss(peers[0].model(x), teacher, 1.0))

    arrays_to_module(peers[0].model, {k[len(prefix):]: v for k, v in result.tensors.items()
                                      if k.startswith(prefix)})
    before = gap()
    assert peers[0].absorb(3, {"p0": result})["absorbed"] == 1
    assert gap() < 0.7 * before


def test_feddf_leaves_hostile_contributions_out_with_a_reason(caplog):
    peers = feddf_peers(FedDFConfig(public_batch=8, public_batches=1, distill_steps=1))
    payloads = {p.ctx.peer_id: p.share(1) for p in peers}
    payloads["p1"].tensors["w/features.fc1.weight"][0, 0] = np.inf
    payloads["p2"].tensors["logits"][:] = np.nan
    payloads["p3"].meta["num_samples"] = -4
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        result = peers[0].aggregate(1, payloads)
    assert result.meta["excluded"] == ["p1", "p2", "p3"]
    for peer, reason in (("p1", "non-finite values"), ("p2", "non-finite logits"), ("p3", "num_samples")):
        assert any(peer in r.message and reason in r.message for r in caplog.records)
    # no group of p1's architecture this round: it keeps its own model, with a logged reason
    assert peers[1].absorb(1, {"p0": result}) == {"absorbed": 0.0}
    assert "no group of this peer's architecture" in caplog.text
    assert peers[0].aggregate(1, {"p1": payloads["p1"]}) is None


# ---------------------------------------------------------------- models


@pytest.mark.parametrize("arch", ["shufflenet_small", "mobilenetv2_small"])
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32), (2, 16, 12)])
def test_small_heterogeneous_models_run_on_1_to_3_channels(arch, shape):
    torch.manual_seed(0)
    model = build_model(arch, shape, 10, 24)
    out = model(torch.randn(4, *shape))
    assert out.shape == (4, 10) and model.embed(torch.randn(2, *shape)).shape == (2, 24)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("arch", ["shufflenet_small", "mobilenetv2_small"])
def test_small_models_refuse_bad_input_and_options(arch):
    with pytest.raises(ValueError, match="at least 4x4"):
        build_model(arch, (1, 2, 2), 10)
    with pytest.raises(ValueError, match="width must be a number > 0"):
        build_model(arch, (1, 8, 8), 10, width=0)


# ---------------------------------------------------------------- the example, end to end


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_example_runs_through_hfl_launch(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "hfl.launch.cli", str(ROOT / "examples" / "mdhfl_digits.yaml"), "--quiet",
         "--set", "defaults.cohort.rounds=3", "--set", f"run_dir={run}",
         "--set", "defaults.algorithm.weighting=confidence"],
        capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((run / "results.json").read_text())
    peers = {row["peer"]: row for row in results["peers"]}
    assert {"p0", "p1", "p2", "p3"} <= set(peers)
    for pid in ("p0", "p1", "p2", "p3"):
        rounds = [json.loads(line) for line in (run / pid / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rounds] == [1, 2, 3]
        assert all(r["teachers"] == 3 and r["dropped"] == 0 for r in rounds), (
            pid, [(r["round"], r["teachers"], r["dropped"]) for r in rounds],
            (run / pid / "peer.log").read_text()[-3000:])
        assert 0.05 < rounds[-1]["label_noise_rate"] < 0.4
        assert rounds[-1]["confidence_weighted"] == 1.0


def test_feddf_packs_deep_models_into_few_arrays_and_still_groups_them():
    def image_peer(peer: str, arch: str, seed: int) -> FedDF:
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        imgs = ArrayDataset(rng.random((40, 1, 8, 8), dtype=np.float32), rng.integers(0, C, 40), C)
        ctx = AlgorithmContext(peer_id=peer, model=build_model(arch, (1, 8, 8), C, 8), train=imgs,
                               test=imgs, num_classes=C, device=torch.device("cpu"), seed=seed,
                               train_cfg=TrainConfig(batch_size=16, max_batches=1), public=imgs)
        return FedDF(ctx, FedDFConfig(public_batch=8, public_batches=1, distill_steps=1))

    peers = [image_peer("p0", "shufflenet_small", 0), image_peer("p1", "mobilenetv2_small", 1),
             image_peer("p2", "shufflenet_small", 2)]
    assert len(module_to_arrays(peers[0].model)) > 64  # one frame each would not fit a message
    payload = peers[0].share(1)
    assert len(payload.tensors) <= 32 and "pack" in payload.meta
    history = simulate(peers, rounds=1)
    assert all(recs[0]["absorbed"] == 1 for recs in history.values())
    result = peers[1].aggregate(1, {p.ctx.peer_id: p.share(1) for p in peers})
    assert len(result.tensors) <= 32 and sorted(len(g[2]) for g in result.meta["groups"]) == [1, 2]
