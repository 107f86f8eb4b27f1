"""Robust aggregation (``hfl.algorithms.robust``): every rule against an independent
oracle (hand-computed values, numpy's median, scipy's trimmed mean, brute-force Krum
scores, scipy.optimize for the geometric median), each rule's tolerance of attackers
beside the mean's lack of it, the weight cap against an inflated sample count, the
options wired into every method that has them, their config errors, and a cohort of
six FedAvg peers on the digits with one attacker."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from hfl.algorithms import robust as R
from hfl.algorithms.base import AlgorithmContext, Payload
from hfl.algorithms.fedavg import FedAvg, weighted_mean
from hfl.algorithms.fedh2l import FedH2L, FedH2LConfig, verified_accuracy
from hfl.algorithms.mdhfl import MDHFL, MDHFLConfig, consensus_posteriors
from hfl.algorithms.packing import unpack_if_packed
from hfl.algorithms.registry import get_algorithm
from hfl.algorithms.settings import TrainConfig
from hfl.algorithms.simulate import simulate
from hfl.data import ArrayDataset, iid_partition, load_builtin
from hfl.models import build_model
from hfl.peer.configtools import ConfigError, build

C, E = 3, 8


def as_contributions(points: np.ndarray, dtype=np.float32) -> dict[str, dict[str, np.ndarray]]:
    """Rows of ``points`` as peers p00, p01, ... each holding one array ``w``."""
    return {f"p{i:02d}": {"w": np.asarray(row, dtype=dtype)} for i, row in enumerate(points)}


# ------------------------------------------------------------------ the rules against oracles


def test_weighted_mean_by_hand():
    np.testing.assert_allclose(R.weighted_mean([[0.0, 0.0], [2.0, 4.0]], [1, 3]), [1.5, 3.0])
    np.testing.assert_allclose(R.weighted_mean([[1.0], [3.0]]), [2.0])


@pytest.mark.parametrize("n", [5, 6])
def test_median_against_numpy(n):
    x = np.random.default_rng(n).normal(size=(n, 7))
    np.testing.assert_array_equal(R.coordinate_median(x), np.median(x, axis=0))
    out, _ = R.combine(as_contributions(x, np.float64), rule="median", byzantine=2)
    np.testing.assert_array_equal(out["w"], np.median(x, axis=0))


def test_trimmed_mean_by_hand_and_against_scipy():
    # beta = 0.2 of 5 values: floor(1.0) = 1 dropped at each end -> mean(2, 3, 4) = 3
    assert R.trimmed_mean([[1.0], [2.0], [3.0], [4.0], [100.0]], 0.2) == pytest.approx([3.0])
    assert R.trim_count(10, 0.3) == 3 and R.trim_count(100, 0.29) == 29  # floor, float-safe
    x = np.random.default_rng(1).normal(size=(10, 6))
    for beta in (0.0, 0.1, 0.2, 0.3, 0.45):
        np.testing.assert_allclose(R.trimmed_mean(x, beta), stats.trim_mean(x, beta, axis=0), rtol=1e-12)
    out, _ = R.combine(as_contributions(x, np.float64), rule="trimmed_mean", trim_fraction=0.2, byzantine=2)
    np.testing.assert_allclose(out["w"], stats.trim_mean(x, 0.2, axis=0), rtol=1e-12)


def brute_force_krum_scores(x: np.ndarray, f: int) -> list[float]:
    n = len(x)
    scores = []
    for i in range(n):
        d = sorted(float(sum((a - b) ** 2 for a, b in zip(x[i], x[j], strict=True)))
                   for j in range(n) if j != i)
        scores.append(sum(d[: n - f - 2]))
    return scores


def test_krum_scores_by_hand_and_by_brute_force():
    # 1-D points 0, 1, 3, 10, 11 with f = 1: each score sums the n - f - 2 = 2 smallest
    # squared distances: 0 -> 1 + 9, 1 -> 1 + 4, 3 -> 4 + 9, 10 -> 1 + 49, 11 -> 1 + 64
    x = np.array([[0.0], [1.0], [3.0], [10.0], [11.0]])
    np.testing.assert_array_equal(R.krum_scores(x, 1), [10, 5, 13, 50, 65])
    assert R.krum(x, 1) == pytest.approx([1.0])  # the best score: the point 1
    assert R.krum(x, 1, select=3) == pytest.approx([4 / 3])  # mean of 1, 0, 3
    out, info = R.combine(as_contributions(x), rule="multi_krum", byzantine=1, krum_select=3)
    assert info["selected"] == ["p00", "p01", "p02"] and out["w"] == pytest.approx([4 / 3])
    # multi_krum's default m = n - f: the 4 best, 0, 1, 3, 10
    out, info = R.combine(as_contributions(x), rule="multi_krum", byzantine=1)
    assert info["selected"] == ["p00", "p01", "p02", "p03"] and out["w"] == pytest.approx([3.5])

    y = np.random.default_rng(2).normal(size=(9, 5))
    np.testing.assert_allclose(R.krum_scores(y, 2), brute_force_krum_scores(y, 2), rtol=1e-12)
    best = int(np.argmin(brute_force_krum_scores(y, 2)))
    out, info = R.combine(as_contributions(y, np.float64), rule="krum", byzantine=2)
    assert info["selected"] == [f"p{best:02d}"]
    np.testing.assert_array_equal(out["w"], y[best])


def test_krum_takes_a_model_of_several_arrays_as_one_vector():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(7, 4)), rng.normal(size=(7, 2, 3))
    contributions = {f"p{i}": {"a": a[i], "b": b[i]} for i in range(7)}
    joined = np.concatenate([a, b.reshape(7, -1)], axis=1)
    best = int(np.argmin(brute_force_krum_scores(joined, 1)))
    out, info = R.combine(contributions, rule="krum", byzantine=1)
    assert info["selected"] == [f"p{best}"]
    np.testing.assert_array_equal(out["b"], b[best])


def scipy_geometric_median(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    def objective(z):
        return float(w @ np.linalg.norm(x - z, axis=1))

    def gradient(z):
        d = np.linalg.norm(x - z, axis=1)
        return ((w / d)[:, None] * (z - x)).sum(axis=0)

    res = optimize.minimize(objective, x.mean(axis=0), jac=gradient, method="BFGS",
                            options={"gtol": 1e-12, "maxiter": 10_000})
    return res.x


def test_geometric_median_against_scipy_and_by_hand():
    rng = np.random.default_rng(4)
    x, w = rng.normal(size=(7, 3)), rng.uniform(0.5, 2.0, size=7)
    oracle = scipy_geometric_median(x, w / w.sum())
    tight = R.geometric_median(x, w, max_iter=10_000, tol=1e-15)
    np.testing.assert_allclose(tight, oracle, atol=1e-6)
    np.testing.assert_allclose(R.geometric_median(x, w), oracle, atol=1e-5)  # default cap and tol
    # By hand: the centre of a square; the middle of three points on a line; the
    # vertex of a triangle whose angle there is at least 120 degrees (Fermat point).
    square = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0]])
    np.testing.assert_allclose(R.geometric_median(square), [1.0, 1.0], atol=1e-9)
    np.testing.assert_allclose(R.geometric_median([[0.0], [1.0], [5.0]], max_iter=10_000), [1.0], atol=1e-5)
    obtuse = np.array([[0.0, 0.0], [10.0, 0.0], [-10.0, 0.5]])
    np.testing.assert_allclose(R.geometric_median(obtuse, max_iter=10_000), [0.0, 0.0], atol=1e-4)
    out, info = R.combine(as_contributions(x, np.float64), dict(zip(sorted(as_contributions(x)), w, strict=True)),
                          rule="geometric_median", byzantine=3)
    np.testing.assert_allclose(out["w"], oracle, atol=1e-4)
    assert 1 <= info["iterations"] <= R.GM_MAX_ITER


def test_clip_updates_by_hand():
    # reference (1, 1): the update (3, 4) has norm 5 -> scaled to norm 1, (0.6, 0.8);
    # (0.3, 0.4) has norm 0.5 <= 1 and is kept as it is
    got = R.clip_updates([[4.0, 5.0], [1.3, 1.4]], [1.0, 1.0], 1.0)
    np.testing.assert_allclose(got, [[1.6, 1.8], [1.3, 1.4]])
    contributions = {"a": {"w": np.array([4.0, 5.0])}, "b": {"w": np.array([1.3, 1.4])}}
    out, info = R.combine(contributions, rule="mean", clip_update_norm=1.0,
                          reference={"w": np.array([1.0, 1.0])})
    np.testing.assert_allclose(out["w"], [(1.6 + 1.3) / 2, (1.8 + 1.4) / 2])
    assert info["clipped"] == ["a"]
    with pytest.raises(ValueError, match="needs a reference"):
        R.combine(contributions, clip_update_norm=1.0)


def test_cap_weights_by_hand():
    np.testing.assert_allclose(R.cap_weights([1, 1, 1, 97], 0.4), [0.2, 0.2, 0.2, 0.4])
    # 100 capped at 0.3; then 50 of the remaining 53 would hold 0.66 > 0.3: capped too;
    # the 0.4 left goes to 1 and 2 in proportion
    np.testing.assert_allclose(R.cap_weights([1, 2, 50, 100], 0.3), [0.4 / 3, 0.8 / 3, 0.3, 0.3])
    np.testing.assert_allclose(R.cap_weights([1, 3], None), [0.25, 0.75])
    np.testing.assert_allclose(R.cap_weights([1, 2, 1000], 0.1), [1 / 3] * 3)  # below 1/n: equal
    np.testing.assert_allclose(R.cap_weights([0, 1, 1, 8], 0.5), [0, 0.25, 0.25, 0.5])



def test_weights_far_beyond_this_peers_own_scale_are_left_out_of_the_mean():
    # One member of four sent weights of 3e38: finite float32, so the equal-weight mean
    # (the default) took them, every peer absorbed 7.5e37 and trained to NaN at the next
    # step (an attack review). An array over 1e6 x this peer's own (+1) is no model of
    # this cohort's; the same array at 1e5 x still goes in (a bound, not a robust rule).
    own = {"w": np.full(3, 2.0, np.float32)}
    from hfl.algorithms.fedavg import mismatch

    assert "values up to 3e+38, over 1e+06 x this peer's own (2)" in mismatch(
        {"w": np.full(3, 3e38, np.float32)}, own)
    assert mismatch({"w": np.full(3, 2e5, np.float32)}, own) is None
    assert mismatch({"w": np.array([1, np.nan, 1], np.float32)}, own) == "w: non-finite values"
    # A peer whose own model went NaN must still take a healthy result: an unknown scale
    # (NaN) bounds nothing (it refused every result, and as aggregator every member).
    assert mismatch({"w": np.full(3, 0.5, np.float32)}, {"w": np.full(3, np.nan, np.float32)}) is None


def test_counts_near_the_float_limit_cannot_zero_the_mean():
    # Two members claiming 1e308 samples each: the counts summed to inf and every share
    # was 0, so the mean was an all-zero model every peer absorbed, with or without a
    # cap (an attack review). Shares are scaled by the largest count first.
    huge = [1e308, 1e308, 1.0, 1.0]
    np.testing.assert_allclose(R.cap_weights(huge, None), [0.5, 0.5, 0, 0], atol=1e-300)
    np.testing.assert_allclose(R.cap_weights(huge, 0.3), [0.3, 0.3, 0.2, 0.2])
    np.testing.assert_allclose(R.normalized_weights([1e308] * 3, 3), [1 / 3] * 3)
    contributions = {p: Payload("weights", {"w": np.full(2, v, np.float32)}, {"num_samples": n})
                     for p, v, n in zip("abcd", [1.0, 3.0, 5.0, 7.0], huge, strict=True)}
    np.testing.assert_allclose(weighted_mean(contributions, weighted=True)["w"], [2.0, 2.0])


def test_a_rule_refuses_what_it_cannot_survive_naming_the_rule_n_and_f():
    x = as_contributions(np.random.default_rng(5).normal(size=(4, 3)))
    with pytest.raises(ValueError, match=r"krum: needs n > 2f \+ 2 = 4 contributions for byzantine f=1, got n=4"):
        R.combine(x, rule="krum", byzantine=1)
    with pytest.raises(ValueError, match=r"multi_krum: needs n > 2f \+ 2 = 6 .*f=2, got n=4"):
        R.combine(x, rule="multi_krum", byzantine=2)
    with pytest.raises(ValueError, match=r"median: tolerates f < n/2 .*f=2 needs n > 4, got n=4"):
        R.combine(x, rule="median", byzantine=2)
    with pytest.raises(ValueError, match=r"geometric_median: tolerates f < n/2 .*got n=4"):
        R.combine(x, rule="geometric_median", byzantine=2)
    with pytest.raises(ValueError, match=r"trimmed_mean: trims floor\(trim_fraction n\) = 0 per side of "
                                         r"n=4 .*fewer than byzantine f=1"):
        R.combine(x, rule="trimmed_mean", trim_fraction=0.2, byzantine=1)
    with pytest.raises(ValueError, match=r"multi_krum: krum_select m=9 must lie in 1..n, got n=7"):
        R.combine(as_contributions(np.zeros((7, 2))), rule="multi_krum", byzantine=1, krum_select=9)
    with pytest.raises(ValueError, match=r"trimmed_mean: trim_fraction must be in \[0, 0.5\) so that 2 floor"):
        R.trimmed_mean(np.zeros((4, 1)), 0.5)
    R.combine(x, rule="mean", byzantine=3)  # the mean claims no tolerance and always runs


@pytest.mark.parametrize("rule", R.RULES)
def test_every_rule_is_deterministic_and_keeps_dtypes_and_integer_buffers(rule):
    rng = np.random.default_rng(6)
    peers = {f"p{i}": {"w": rng.normal(size=(3, 2)).astype(np.float32),
                       "num_batches_tracked": np.array(i * 10, dtype=np.int64)} for i in range(7)}
    weights = {p: float(i + 1) for i, p in enumerate(peers)}
    out, _ = R.combine(peers, weights, rule=rule, byzantine=1)
    shuffled = {p: peers[p] for p in reversed(list(peers))}
    again, _ = R.combine(shuffled, {p: weights[p] for p in reversed(list(weights))}, rule=rule, byzantine=1)
    assert out["w"].dtype == np.float32 and out["w"].tobytes() == again["w"].tobytes()
    assert out["num_batches_tracked"].dtype == np.int64 and int(out["num_batches_tracked"]) == 60  # the max


# ------------------------------------------------------------------ tolerance of attackers

N_PEERS, F_BAD, DIM, SIGMA = 10, 2, 20, 0.1
RADIUS = SIGMA * np.sqrt(DIM)  # how far an honest contribution typically lies from the honest mean


def attacked(attack: str) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
    """N_PEERS contributions, the last F_BAD of them malicious; and the honest mean."""
    rng = np.random.default_rng(7)
    mu = rng.normal(size=DIM)
    honest = mu + SIGMA * rng.normal(size=(N_PEERS - F_BAD, DIM))
    bad = {"scale100": 100 * honest[:F_BAD], "signflip": -honest[:F_BAD],
           "noise": honest[:F_BAD] + 10 * rng.normal(size=(F_BAD, DIM))}[attack]
    return as_contributions(np.vstack([honest, bad]), np.float64), honest.mean(axis=0)


@pytest.mark.parametrize("attack", ["scale100", "signflip", "noise"])
@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum", "multi_krum", "geometric_median"])
def test_robust_rules_stay_near_the_honest_mean_where_the_mean_does_not(rule, attack):
    # f = 2 of n = 10 attackers: every rule's condition holds (median, geometric median:
    # f < n/2; trimmed mean: f <= floor(0.2 n) = 2; Krum: n > 2f + 2 = 6). The result
    # stays within RADIUS (sigma sqrt(d)) of the honest mean; the mean lands >= 3 RADIUS away.
    contributions, honest_mean = attacked(attack)
    out, _ = R.combine(contributions, rule=rule, byzantine=F_BAD, trim_fraction=0.2)
    assert np.linalg.norm(out["w"] - honest_mean) < RADIUS
    mean, _ = R.combine(contributions, rule="mean")
    assert np.linalg.norm(mean["w"] - honest_mean) > 3 * RADIUS


def test_an_inflated_sample_count_is_neutralised_by_the_cap():
    contributions, honest_mean = attacked("signflip")
    counts = {p: 100.0 for p in contributions}
    counts["p09"] = 1e6  # one attacker claims 10^6 samples
    mean, _ = R.combine(contributions, counts, rule="mean")
    liar = contributions["p09"]["w"]
    assert np.linalg.norm(mean["w"] - liar) < 0.01 * np.linalg.norm(liar - honest_mean)  # it owns the mean
    # The cap at 1/n: the claim buys exactly what an honest count does (equal weights).
    capped, _ = R.combine(contributions, counts, rule="mean", max_weight_share=1 / N_PEERS)
    equal, _ = R.combine(contributions, None, rule="mean")
    np.testing.assert_allclose(capped["w"], equal["w"], rtol=1e-12)
    # The geometric median breaks down once the attackers hold half the weight, and holds
    # with the cap keeping every share at 0.2 (the two attackers: at most 0.4 < 1/2).
    gm, _ = R.combine(contributions, counts, rule="geometric_median", byzantine=F_BAD)
    assert np.linalg.norm(gm["w"] - honest_mean) > 3 * RADIUS
    gm, _ = R.combine(contributions, counts, rule="geometric_median", byzantine=F_BAD, max_weight_share=0.2)
    assert np.linalg.norm(gm["w"] - honest_mean) < RADIUS


# ------------------------------------------------------------------ the methods' options


def dataset(seed: int, n: int, features: int = 5) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    return ArrayDataset(rng.normal(size=(n, features)).astype(np.float32) + y[:, None], y, C)


def make(name: str, peer: str = "p0", n: int = 40, hidden=(16,), **cfg):
    torch.manual_seed(int(peer[1:]))
    ctx = AlgorithmContext(peer_id=peer, model=build_model("mlp", (5,), C, E, hidden=list(hidden)),
                           train=dataset(int(peer[1:]) + 1, n), test=dataset(99, 30), num_classes=C,
                           device=torch.device("cpu"), seed=int(peer[1:]), rounds=4,
                           train_cfg=TrainConfig(lr=0.05, batch_size=16), public=dataset(5, 64))
    cls = get_algorithm(name)
    return cls(ctx, cls.Config(**cfg))


def shared_stack(contributions: dict[str, Payload], name: str) -> np.ndarray:
    return np.stack([contributions[p].tensors[name] for p in sorted(contributions)]).astype(np.float64)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "avg", "avgkd", "chfl"])
def test_the_weight_averaging_methods_take_the_median_when_asked(name):
    peers = [make(name, f"p{i}", n=20 + 10 * i, robust="median") for i in range(5)]
    contributions = {a.ctx.peer_id: a.share(1) for a in peers}
    result = peers[1].aggregate(1, contributions)
    assert result.meta["robust"] == "median"
    for k in contributions["p0"].tensors:
        np.testing.assert_allclose(result.tensors[k], np.median(shared_stack(contributions, k), axis=0),
                                   rtol=1e-6)


def test_the_default_weighs_every_contribution_the_same_and_null_is_fedavgs_weighted_mean():
    # Issue 35: a member that claims 10^12 samples owned the default FedAvg (0.936 ->
    # 0.100). By default a claimed count buys nothing (none is even sent); null trusts
    # the counts again, FedAvg as published, to the byte.
    cfg = build(get_algorithm("fedavg").Config, {}, "algorithm")
    assert (cfg.robust, cfg.byzantine, cfg.max_weight_share, cfg.clip_update_norm) == ("mean", 1, "equal", None)
    assert R.is_plain(R.rule_options(cfg)) and not R.counts_weigh(cfg)
    for trust, weighted in ((None, False), ("null", True)):
        extra = {} if trust is None else {"max_weight_share": None}
        peers = [make("fedavg", f"p{i}", n=20 + 10 * i, **extra) for i in range(3)]
        contributions = {a.ctx.peer_id: a.share(1) for a in peers}
        assert all(("num_samples" in c.meta) == weighted for c in contributions.values())
        result = peers[0].aggregate(1, contributions)
        expected = weighted_mean(contributions, weighted)
        assert all(result.tensors[k].tobytes() == expected[k].tobytes() for k in expected)
        assert "robust" not in result.meta
    liar = make("fedavg", "p3").share(1)
    liar.meta["num_samples"] = 10 ** 12  # claimed anyway: ignored under the default
    honest = {a.ctx.peer_id: a.share(1) for a in peers[:2]}
    default = make("fedavg", "p9").aggregate(1, {**honest, "p3": liar})
    equal = weighted_mean({**honest, "p3": liar}, False)
    assert all(default.tensors[k].tobytes() == equal[k].tobytes() for k in equal)


def test_krum_that_cannot_run_gives_no_aggregate_and_says_why(caplog):
    peers = [make("fedavg", f"p{i}", robust="krum", byzantine=1) for i in range(4)]
    contributions = {a.ctx.peer_id: a.share(1) for a in peers}
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        assert peers[0].aggregate(1, contributions) is None
    assert "no aggregate this round: krum: needs n > 2f + 2 = 4 contributions for byzantine f=1, got n=4" \
        in caplog.text
    five = {**contributions, "p4": make("fedavg", "p4").share(1)}
    result = peers[0].aggregate(1, five)
    assert len(result.meta["selected"]) == 1


def test_the_weight_cap_and_clipping_in_fedavg_against_numpy():
    peers = [make("fedavg", f"p{i}", n=40, max_weight_share=0.25, clip_update_norm=0.5) for i in range(4)]
    for a in peers:
        a.local_update(1)  # the aggregator's reference: its model as the round began
    reference = peers[2]._round_start
    contributions = {a.ctx.peer_id: a.share(1) for a in peers}
    contributions["p3"] = Payload("weights", {k: v * 100 for k, v in contributions["p3"].tensors.items()},
                                  {"num_samples": 1_000_000})  # scaled x100, claiming 10^6 samples
    result = peers[2].aggregate(1, contributions)
    names = list(reference)
    # oracle: concatenated updates, clipped to norm 0.5, averaged with weights capped at 0.25
    flat_ref = np.concatenate([reference[k].reshape(-1) for k in names]).astype(np.float64)
    updates = np.stack([np.concatenate([contributions[p].tensors[k].reshape(-1) for k in names])
                        for p in sorted(contributions)]).astype(np.float64) - flat_ref
    norms = np.linalg.norm(updates, axis=1)
    clipped = updates * np.minimum(1.0, 0.5 / norms)[:, None]
    expected = flat_ref + np.array([0.25] * 4) @ clipped  # 10^6 vs 40: capped at 1/4 = equal
    got = np.concatenate([result.tensors[k].reshape(-1) for k in names])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert "p3" in result.meta["clipped"]
    assert np.linalg.norm(got - flat_ref) <= 0.5 + 1e-5  # the attacker moved it by at most tau


def test_layerwise_runs_the_rule_per_array_and_leaves_out_what_too_few_hold(caplog):
    rng = np.random.default_rng(8)
    shallow = {"a": (3,), "b": (2, 2)}
    deep = {**shallow, "c": (4,)}
    contributions = {f"p{i}": Payload("weights", {k: rng.normal(size=s).astype(np.float32)
                                                  for k, s in (deep if i < 2 else shallow).items()},
                                      {"num_samples": 10}) for i in range(5)}
    alg = make("fedavg", "p0", robust="median", aggregation="layerwise")
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        result = alg.aggregate(1, contributions)
    for k in ("a", "b"):
        np.testing.assert_allclose(result.tensors[k], np.median(shared_stack(contributions, k), axis=0),
                                   rtol=1e-6)
    assert "c" not in result.tensors and result.meta["not_aggregated"] == ["c"]  # 2 holders, f = 1
    assert "c not aggregated: median: tolerates f < n/2" in caplog.text


def test_a_member_array_named_like_a_layerwise_result_key_is_left_out(caplog):
    # An attack review: a member that sent head.weight with another shape and an array
    # named "head.weight|10x16" (the key the honest holders then got) replaced their
    # mean on every peer, without a word.
    from hfl.algorithms import layerwise

    assert "'|' in an array name" in layerwise.unfit({"head.weight|10x16": np.zeros(3, np.float32)})
    peers = [make("fedavg", f"p{i}", aggregation="layerwise") for i in range(3)]
    contributions = {a.ctx.peer_id: a.share(1) for a in peers}
    own = dict(contributions["p2"].tensors)
    name = next(n for n, v in own.items() if v.dtype == np.float32 and v.ndim == 2)
    forged = {**own, name: np.ones(1, np.float32),
              f"{name}|{'x'.join(map(str, own[name].shape))}": np.full(own[name].shape, 7, np.float32)}
    contributions["p3"] = Payload(contributions["p2"].kind, forged, dict(contributions["p2"].meta))
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        result = peers[0].aggregate(1, contributions)
    assert "p3" not in result.meta.get("contributors", ["p0", "p1", "p2"]) and "'|' in an array name" in caplog.text
    got = layerwise.select(result.tensors, own, False)[0][name]
    np.testing.assert_allclose(got, np.mean([contributions[p].tensors[name] for p in ("p0", "p1", "p2")], axis=0),
                               rtol=1e-5, atol=1e-7)


def test_fedin_takes_the_rule_through_its_layerwise_aggregation():
    # FedIN aggregates through FedAvg.aggregate (weights) and adds its feature batch.
    from hfl.algorithms.fedin import FedIN, FedINConfig

    def fedin(peer: str, **cfg) -> FedIN:
        torch.manual_seed(0)
        ctx = AlgorithmContext(peer_id=peer, model=build_model("sresnet", (1, 8, 8), C, 8, depth=10, width=4),
                               train=ArrayDataset(np.random.default_rng(int(peer[1:])).normal(
                                   size=(8, 1, 8, 8)).astype(np.float32), np.arange(8) % C, C),
                               test=None, num_classes=C, device=torch.device("cpu"), seed=int(peer[1:]))
        return FedIN(ctx, FedINConfig(feature_batch=4, **cfg))

    peers = [fedin(f"p{i}", robust="trimmed_mean", trim_fraction=0.25) for i in range(4)]
    contributions = {a.ctx.peer_id: a.share(1) for a in peers}
    result = peers[0].aggregate(1, contributions)
    assert result.meta["robust"] == "trimmed_mean"
    got, why = unpack_if_packed(result.tensors, result.meta)  # a ResNet's state travels packed
    assert why is None and "@s_in" in got
    sent = {p: unpack_if_packed(c.tensors, c.meta)[0] for p, c in contributions.items()}
    for name, v in sent["p0"].items():
        if v.dtype == np.float32 and not name.startswith("@"):
            stack = np.stack([sent[p][name] for p in sorted(sent)]).astype(np.float64)
            np.testing.assert_allclose(got[name], stats.trim_mean(stack, 0.25, axis=0), rtol=1e-5, atol=1e-6)


def proto_payload(rows: np.ndarray, weights: np.ndarray) -> Payload:
    return Payload("prototypes", {"rows": rows.astype(np.float32), "weights": weights.astype(np.float32)},
                   {"round": 1})


def test_fedproto_leaves_out_class_means_far_beyond_its_own_and_refuses_such_prototypes(caplog):
    # Rows of 3e38 at weight 0 went into the sum (prototypes of 8e36, finite, and the
    # next step NaN); at weight 0.5 for a class only that member holds, inf prototypes
    # every peer refused each round (an attack review).
    peers = [make("fedproto", f"p{i}") for i in range(3)]
    for a in peers:
        a.local_update(1)
    contributions = {a.ctx.peer_id: a.share(1) for a in peers}
    rows = np.zeros((C, E), np.float32)
    rows[0] = 3e38
    contributions["p9"] = proto_payload(rows, np.zeros(C))
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        result = peers[0].aggregate(1, contributions)
    assert result.meta["excluded"] == ["p9"] and "class means: values up to 3e+38" in caplog.text
    assert peers[1].absorb(1, {"p0": result})["absorbed"] == 1.0
    forged = Payload("prototypes", {**result.tensors, "protos": np.full((C, E), 8e36, np.float32)},
                     result.meta)
    assert peers[2].absorb(1, {"p0": forged}) == {"absorbed": 0.0}
    restored = make("fedproto", "p2")
    restored.load_state_dict(peers[2].state_dict())  # the bound survives a restart
    assert restored._own_scale == peers[2]._own_scale is not None
    assert "protos: values up to 8e+36, over 1e+06 x" in caplog.text


def test_fedproto_median_per_class_over_the_holders_local_prototypes(caplog):
    rng = np.random.default_rng(9)
    alg = make("fedproto", "p0", robust="median")
    means = rng.normal(size=(5, C, E))  # each peer's local prototype per class
    counts = np.array([[10, 5, 0], [20, 5, 0], [30, 5, 1], [40, 5, 0], [50, 5, 2]], dtype=np.float64)
    contributions = {f"p{i}": proto_payload(means[i] * counts[i][:, None], counts[i]) for i in range(5)}
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        result = alg.aggregate(1, contributions)
    for j in (0, 1):  # held by all five: the median of their local prototypes
        np.testing.assert_allclose(result.tensors["protos"][j], np.median(means[:, j], axis=0), rtol=1e-5)
    # class 2: held by two peers, too few for f = 1: no prototype this round, and why
    assert result.tensors["present"].tolist() == [True, True, False]
    assert result.meta["no_prototype"] == [2] and "classes [2]" in caplog.text
    # max_weight_share with the mean: per class, capped count weights (the 50 of 150 -> 0.3)
    capped = make("fedproto", "p0", max_weight_share=0.3).aggregate(1, contributions)
    w = R.cap_weights(counts[:, 0], 0.3)
    np.testing.assert_allclose(capped.tensors["protos"][0], w @ means[:, 0], rtol=1e-5)


def test_fedproto_claimed_counts_buy_nothing_where_the_cohort_says_so(caplog):
    # An attack review: weighted: false and max_weight_share: equal were ignored by the
    # plain sum, so a member's weights of 1e6 (rows scaled alike) set every prototype
    # (honest accuracy 0.81 -> 0.16, no warning). Oracle: numpy means over the holders.
    rng = np.random.default_rng(11)
    means = rng.normal(size=(4, C, E))
    counts = np.array([[10, 5, 0], [20, 5, 0], [30, 5, 1], [1e6, 1e6, 1e6]])  # p3 claims 1e6
    claimed = {f"p{i}": proto_payload(means[i] * counts[i][:, None], counts[i]) for i in range(4)}
    equal = make("fedproto", "p0", max_weight_share="equal").aggregate(1, claimed)
    assert equal.meta["contributors"] == ["p0", "p1", "p2", "p3"]
    np.testing.assert_allclose(equal.tensors["protos"][0], means[:, 0].mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(equal.tensors["protos"][2], means[2:, 2].mean(axis=0), rtol=1e-5)
    # weighted: false: an honest release is (class means, 1 where held); a weight above 1
    # is no honest release, and is left out, named
    held = (counts > 0).astype(np.float64)
    plain = {f"p{i}": proto_payload(means[i], held[i]) for i in range(3)}
    plain["p3"] = claimed["p3"]
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        unweighted = make("fedproto", "p0", weighted=False).aggregate(1, plain)
    assert unweighted.meta["excluded"] == ["p3"]
    assert "p3 left out: weights 1e+06 outside [0, 1]" in caplog.text
    np.testing.assert_allclose(unweighted.tensors["protos"][1], means[:3, 1].mean(axis=0), rtol=1e-5)
    # the default weighs counts (documented: docs/robust.md), as before
    weighted = make("fedproto", "p0").aggregate(1, claimed)
    np.testing.assert_allclose(weighted.tensors["protos"][0], counts[:, 0] @ means[:, 0]
                               / counts[:, 0].sum(), rtol=1e-5)


def test_fedhp_noisy_releases_leave_out_weights_no_noise_explains(caplog):
    # An attack review: with DP noise any negative weight was taken: -1e6 removed every
    # class's prototype, weights cancelling the honest counts made the member's rows the
    # prototypes (accuracy 0.82 -> 0.09). An honest noisy weight lies within 6 noise
    # standard deviations of its count.
    from hfl.algorithms.dp import noise_stds

    alg = make("fedhp", "p0", noise_multiplier=0.3)
    s_w = noise_stds(0.3, alg.cfg.clip_norm)[1]
    assert alg.weight_bounds == (pytest.approx(-6 * s_w), math.inf)
    assert make("fedhp", "p0", noise_multiplier=0.3, weighted=False).weight_bounds == (
        pytest.approx(-6 * s_w), pytest.approx(1 + 6 * s_w))
    assert make("fedhp", "p0").weight_bounds == (0.0, math.inf)
    d = alg.proto_dim
    rng = np.random.default_rng(12)
    honest = {f"p{i}": proto_payload(rng.normal(size=(C, d)) * 20, np.full(C, 20.0) + rng.normal(size=C) * s_w)
              for i in range(3)}
    honest["p3"] = proto_payload(np.zeros((C, d)), np.full(C, -1e6))
    with caplog.at_level(logging.WARNING, logger="hfl.algorithms"):
        result = alg.aggregate(1, honest)
    assert result.meta["excluded"] == ["p3"] and result.tensors["present"].all()
    assert "p3 left out: weights -1e+06 outside [" in caplog.text


def test_fedmd_and_feddf_consensus_logits_take_the_rule():
    rng = np.random.default_rng(10)
    logits = rng.normal(size=(5, 16, C)).astype(np.float32)
    logits[4] *= 100  # one liar
    fedmd = make("fedmd", "p0", robust="median", public_batch=16)
    idx = np.arange(16)
    contributions = {f"p{i}": Payload("scores", {"idx": idx, "logits": logits[i]}, {"owner": "p0"})
                     for i in range(5)}
    contributions["p5"] = Payload("scores", {"idx": idx, "logits": np.full((16, C), np.nan, np.float32)},
                                  {"owner": "p0"})  # left out, not a NaN consensus
    result = fedmd.aggregate(1, contributions)
    np.testing.assert_allclose(result.tensors["logits"], np.median(logits, axis=0), rtol=1e-6)
    assert result.meta["scorers"] == 5

    # Under the plain mean (the default) too, a member's scores are checked: a missing
    # idx, a logits array one class wider and no owner raised in the aggregator, NaN
    # made a NaN consensus, 3e38s summed to inf (an attack review). Each is left out.
    plain = make("fedmd", "p0", public_batch=16)
    hostile = {"a_noidx": Payload("scores", {"logits": logits[0]}, {"owner": "p0"}),
               "a_wide": Payload("scores", {"idx": idx, "logits": np.zeros((16, C + 1), np.float32)},
                                 {"owner": "p0"}),
               "a_noowner": Payload("scores", {"idx": idx, "logits": logits[0]}, {}),
               "a_nan": contributions["p5"],
               "a_huge": Payload("scores", {"idx": idx, "logits": np.full((16, C), 3e38, np.float32)},
                                 {"owner": "p0"})}
    honest_only = {p: contributions[p] for p in ("p0", "p1", "p2")}
    result = plain.aggregate(1, {**honest_only, **hostile})
    assert result.meta["scorers"] == 3
    np.testing.assert_allclose(result.tensors["logits"], logits[:3].mean(axis=0), rtol=1e-6)
    assert plain.absorb(1, {"p1": Payload("consensus", {"idx": idx, "logits": logits[0] * np.nan},
                                          {"owner": "p0"})}) == {"digested": 0.0}

    peers = [make("feddf", f"p{i}", robust="multi_krum", byzantine=1, public_batch=8, public_batches=1)
             for i in range(5)]
    payloads = {a.ctx.peer_id: a.share(1) for a in peers}
    honest = np.stack([payloads[p].tensors["logits"] for p in sorted(payloads)]).astype(np.float64)
    liar = payloads["p4"].tensors["logits"]
    payloads["p4"] = Payload(payloads["p4"].kind, {**payloads["p4"].tensors, "logits": liar * 100 + 5},
                             payloads["p4"].meta)
    result = peers[0].aggregate(1, payloads)
    assert result.meta["selected"] == ["p0", "p1", "p2", "p3"]  # m = n - f, the liar left out
    np.testing.assert_allclose(result.tensors["teacher"], honest[:4].mean(axis=0), rtol=1e-5, atol=1e-6)
    # float64 logits of 1e300 are finite, and inf as the float32 teacher: every peer
    # refused the round's result (an attack review). Left out like NaN.
    payloads["p4"] = Payload(payloads["p4"].kind, {**payloads["p4"].tensors,
                                                    "logits": np.full(liar.shape, 1e300)},
                             payloads["p4"].meta)
    result = make("feddf", "p0", public_batch=8, public_batches=1).aggregate(1, payloads)
    assert result.meta["excluded"] == ["p4"] and np.isfinite(result.tensors["teacher"]).all()
    # Its weights of 3e38 went into the group mean, and every peer refused the whole
    # result each round (a review); left out by the scale bound now.
    honest_p4 = peers[4].share(1)
    huge = {k: (v * np.float32(1e30) if k.startswith("w/") and v.dtype.kind == "f" else v)
            for k, v in honest_p4.tensors.items()}
    payloads["p4"] = Payload(honest_p4.kind, huge, honest_p4.meta)
    result = make("feddf", "p0", public_batch=8, public_batches=1).aggregate(1, payloads)
    assert result.meta["excluded"] == ["p4"]
    assert peers[1].absorb(1, {"p0": result})["absorbed"] == 1.0
    # A result whose groups are no list, or whose idx are floats equal in value, is refused
    # (a TypeError, and an IndexError after the group weights were loaded, before).
    before = {k: v.clone() for k, v in peers[2].model.state_dict().items()}
    for meta, tensors in (({**result.meta, "groups": {"g": 1}}, result.tensors),
                          (result.meta, {**result.tensors, "idx": result.tensors["idx"].astype(np.float64)})):
        assert peers[2].absorb(1, {"p0": Payload(result.kind, tensors, meta)}) == {"absorbed": 0.0}
    assert all(torch.equal(v, before[k]) for k, v in peers[2].model.state_dict().items())
    # An aggregator's teacher of 3e38: with a temperature below 1 a NaN loss (a review).
    hot = {**result.tensors, "teacher": np.full_like(result.tensors["teacher"], 3e38)}
    assert peers[2].absorb(1, {"p0": Payload(result.kind, hot, result.meta)}) == {"absorbed": 0.0}


# ------------------------------------------------------------------ teachers: mdhfl and fedh2l


def test_mdhfl_consensus_is_the_renormalised_median_of_the_teachers():
    rng = np.random.default_rng(11)
    probs = [rng.dirichlet(np.ones(C), size=6).astype(np.float32) for _ in range(5)]
    got, has = consensus_posteriors(probs, "median")
    med = np.median(np.stack(probs).astype(np.float64), axis=0)
    np.testing.assert_allclose(got, med / med.sum(axis=1, keepdims=True), rtol=1e-6)
    assert has.all() and np.allclose(got.sum(axis=1), 1.0)
    got, _ = consensus_posteriors(probs, "trimmed_mean", 0.2)
    trimmed = stats.trim_mean(np.stack(probs).astype(np.float64), 0.2, axis=0)
    np.testing.assert_allclose(got, trimmed / trimmed.sum(axis=1, keepdims=True), rtol=1e-6)
    # three teachers, each certain of another class: no class has a median mass
    onehots = [np.eye(C, dtype=np.float32)[[k]] for k in range(C)]
    got, has = consensus_posteriors(onehots, "median")
    assert not has.any() and not got.any()


def mdhfl_after_absorb(liar: bool, **cfg) -> tuple[MDHFL, list[torch.Tensor]]:
    torch.manual_seed(0)
    ctx = AlgorithmContext(peer_id="p0", model=build_model("mlp", (5,), C, E, hidden=[16]),
                           train=dataset(1, 30), test=dataset(2, 10), num_classes=C,
                           device=torch.device("cpu"), seed=0, public=dataset(3, 40), cohort_seed=1)
    alg = MDHFL(ctx, MDHFLConfig(public_batch=8, public_batches=2, **cfg))
    idx = alg.round_indices(1)
    y = ctx.public.y[idx]
    good = (0.8 * np.eye(C)[y] + 0.2 / C).astype(np.float32)  # (16, C): the right class, confidently
    received = {f"p{i}": Payload("posteriors", {"idx": idx, "probs": good}) for i in range(1, 5)}
    if liar:
        received["p5"] = Payload("posteriors", {"idx": idx, "probs": np.eye(C, dtype=np.float32)[(y + 1) % C]})
    alg.absorb(1, received)
    return alg, [p.detach().clone() for p in alg.model.parameters()]


def test_mdhfl_median_consensus_ignores_a_lying_teacher_and_all_is_eq3():
    # With four honest teachers agreeing, the median is their posterior: the liar changes nothing.
    _, with_liar = mdhfl_after_absorb(True, teacher_consensus="median")
    _, without = mdhfl_after_absorb(False, teacher_consensus="median")
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(with_liar, without, strict=True))
    _, all_with_liar = mdhfl_after_absorb(True)
    _, all_without = mdhfl_after_absorb(False)
    assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(all_with_liar, all_without, strict=True))
    # trimmed_mean trimming nothing (beta = 0) is the mean posterior: eq. 3's gradient exactly
    _, trimmed0 = mdhfl_after_absorb(True, teacher_consensus="trimmed_mean", teacher_trim_fraction=0.0)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(trimmed0, all_with_liar, strict=True))


def test_fedh2l_verified_accuracy_gives_a_lying_teacher_the_weight_of_its_posteriors():
    assert verified_accuracy(np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), np.array([0, 1, 1])) == 2 / 3

    def after(teacher_acc: str, claimed: float) -> list[torch.Tensor]:
        torch.manual_seed(0)
        rng = np.random.default_rng(0)
        y = np.arange(12) % 2
        data = ArrayDataset(rng.normal(size=(12, 4)).astype(np.float32) + 2.0 * y[:, None], y, 2)
        ctx = AlgorithmContext(peer_id="p0", model=build_model("mlp", (4,), 2, 8, hidden=[8]), train=data,
                               test=data, num_classes=2, device=torch.device("cpu"), seed=0, public=data)
        alg = FedH2L(ctx, FedH2LConfig(local_includes_public=False, teacher_acc=teacher_acc))
        alg.add_peer_seeds("p1", data.x, data.y)
        idx = np.arange(12)
        wrong = np.eye(2, dtype=np.float32)[1 - data.y]  # every row certain of the wrong class
        alg.absorb(1, {"p1": Payload("posteriors", {"idx": idx, "probs": wrong}, {"acc": claimed})})
        return [p.detach().clone() for p in alg.model.parameters()]

    verified = after("verified", claimed=1.0)  # it claims 100%; its posteriors are 0% right
    assert all(torch.equal(a, b) for a, b in zip(verified, after("claimed", claimed=0.0), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(verified, after("claimed", claimed=1.0), strict=True))


# ------------------------------------------------------------------ config errors


@pytest.mark.parametrize("name, data, message", [
    ("fedavg", {"robust": "medain"}, r"algorithm\.robust: got 'medain'; allowed: 'mean', 'median', "
                                     r"'trimmed_mean', 'krum', 'multi_krum', 'geometric_median'; did you mean 'median'"),
    ("fedprox", {"trim_fraction": 0.5}, r"algorithm\.trim_fraction: got 0\.5 .*>= 0 and < 0\.5"),
    ("avg", {"byzantine": -1}, r"algorithm\.byzantine: got -1 .*>= 0"),
    ("chfl", {"krum_select": 0, "robust": "multi_krum"}, r"algorithm\.krum_select: got 0 .*>= 1"),
    ("fedavg", {"krum_select": 3}, r"algorithm: krum_select applies only to robust: multi_krum \(got robust: mean\)"),
    ("avgkd", {"max_weight_share": 1.5}, r"algorithm\.max_weight_share: got 1\.5 .*> 0 and <= 1"),
    ("fedavg", {"max_weight_share": 0.3, "robust": "median"},
     r"algorithm: max_weight_share applies only to the weighted rules \(robust: mean, geometric_median\)"),
    ("fedavg", {"max_weight_share": 0.3, "weighted": False}, r"algorithm: max_weight_share needs weighted: true"),
    ("fedavg", {"clip_update_norm": 0}, r"algorithm\.clip_update_norm: got 0 .*> 0"),
    ("fedin", {"clip_update_norm": 1.0}, r"algorithm: clip_update_norm needs aggregation: model \(got layerwise\)"),
    ("fedproto", {"clip_update_norm": 1.0}, r"algorithm\.clip_update_norm: unknown key; allowed keys: robust, "),
    ("fedmd", {"max_weight_share": 0.5}, r"algorithm\.max_weight_share: unknown key"),
    ("feddf", {"robust": "mode"}, r"algorithm\.robust: got 'mode'; allowed: "),
    ("mdhfl", {"teacher_consensus": "mode"}, r"algorithm\.teacher_consensus: got 'mode'; allowed: 'all', "
                                             r"'median', 'trimmed_mean'"),
    ("mdhfl", {"teacher_consensus": "median", "weighting": "confidence"},
     r"algorithm: teacher_consensus: median needs weighting: uniform \(got confidence\)"),
    ("mdhfl", {"teacher_trim_fraction": 0.5}, r"algorithm\.teacher_trim_fraction: got 0\.5"),
    ("fedh2l", {"teacher_acc": "trusted"}, r"algorithm\.teacher_acc: got 'trusted'; allowed: 'claimed', 'verified'"),
    ("fedh2l", {"teacher_acc": "verified", "ce_on_public": False},
     r"algorithm: teacher_acc: verified needs kl: true and ce_on_public: true"),
])
def test_config_errors_name_the_field(name, data, message):
    with pytest.raises(ConfigError, match=message):
        build(get_algorithm(name).Config, data, "algorithm")


def test_every_method_with_the_options_accepts_them_and_defaults_to_today():
    for name in ("fedavg", "fedprox", "avg", "avgkd", "chfl", "fedin", "fedproto", "fedmd", "feddf"):
        cls = get_algorithm(name).Config
        assert build(cls, {}, "algorithm").robust == "mean"
        assert build(cls, {"robust": "multi_krum", "byzantine": 2, "krum_select": 3}, "algorithm").krum_select == 3
    assert build(get_algorithm("mdhfl").Config, {}, "algorithm").teacher_consensus == "all"
    assert build(get_algorithm("fedh2l").Config, {}, "algorithm").teacher_acc == "claimed"


# ------------------------------------------------------------------ a cohort with an attacker


class ScaledBy100(FedAvg):
    """Trains honestly and sends its weights times 100."""

    name = "test-robust-scaled100"

    def share(self, round: int) -> Payload:
        p = super().share(round)
        return Payload(p.kind, {k: v * 100 if v.dtype.kind == "f" else v for k, v in p.tensors.items()}, p.meta)


ROUNDS = 6
MARGIN = 0.05  # honest accuracy under attack within 5 points of the clean run's


@pytest.fixture(scope="module")
def digits_cohort():
    digits = load_builtin("digits", flatten=True)
    perm = np.random.default_rng(0).permutation(len(digits))
    test_idx, train_idx = perm[:360], perm[360:]
    test = ArrayDataset(digits.x[test_idx], digits.y[test_idx], 10)
    parts = iid_partition(digits.y[train_idx], 6, seed=0)

    def run(attacker: bool, **cfg) -> float:
        """Mean final test accuracy of the honest peers p0..p4 (p5: the attacker, if any)."""
        algs = []
        for i in range(6):
            torch.manual_seed(0)  # a common initialisation
            rows = train_idx[parts[i]]
            ctx = AlgorithmContext(peer_id=f"p{i}", model=build_model("mlp", (64,), 10, 32, hidden=[64]),
                                   train=ArrayDataset(digits.x[rows], digits.y[rows], 10), test=test,
                                   num_classes=10, device=torch.device("cpu"), seed=i, rounds=ROUNDS,
                                   train_cfg=TrainConfig(lr=0.05, batch_size=32))
            cls = ScaledBy100 if attacker and i == 5 else FedAvg
            algs.append(cls(ctx, FedAvg.Config(**cfg)))
        history = simulate(algs, ROUNDS)
        return float(np.mean([history[f"p{i}"][-1]["test_acc"] for i in range(5)]))

    return run, run(False)


@pytest.mark.parametrize("rule", ["median", "multi_krum"])
def test_a_digits_cohort_with_one_attacker_keeps_its_accuracy_with_a_robust_rule(digits_cohort, rule):
    run, clean = digits_cohort
    assert clean > 0.8  # the clean run (six honest peers, the mean) learns
    assert run(True, robust=rule) >= clean - MARGIN


def test_a_digits_cohort_with_one_attacker_collapses_with_the_mean(digits_cohort):
    run, clean = digits_cohort
    assert run(True) < 0.3 < clean  # near chance (10 classes)
