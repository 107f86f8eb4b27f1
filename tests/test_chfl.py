"""CHFL's head-sharing family (avg, avgkd, chfl) and fedprox, as algorithms on
tensors: what leaves a peer, how the aggregate is formed and absorbed, the
eq. 5 loss, hostile contributions, checkpoints; plus the random MLP zoo entry."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from torch import nn

from hfl.algorithms.base import AlgorithmContext, Payload
from hfl.algorithms.dkd import chfl_temperature, dkd_loss
from hfl.algorithms.registry import get_algorithm
from hfl.algorithms.settings import TrainConfig
from hfl.algorithms.simulate import simulate
from hfl.data import ArrayDataset
from hfl.models import build_model

C, E = 3, 8


def dataset(seed: int, n: int, features: int) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    x = rng.normal(size=(n, features)).astype(np.float32) + y[:, None]  # learnable
    return ArrayDataset(x, y, C)


def make(name: str, peer: str = "p0", features: int = 5, hidden=(16,), n: int = 40,
         rounds: int = 10, **cfg):
    torch.manual_seed(zlib.crc32(peer.encode()) % 1000)  # str hash() is salted per process
    model = build_model("mlp", (features,), C, E, hidden=list(hidden))
    ctx = AlgorithmContext(peer_id=peer, model=model, train=dataset(1 + len(peer) + n, n, features),
                           test=dataset(99, 30, features), num_classes=C,
                           device=torch.device("cpu"), seed=0, rounds=rounds,
                           train_cfg=TrainConfig(lr=0.05, batch_size=16))
    cls = get_algorithm(name)
    return cls(ctx, cls.Config(**cfg))


def head_arrays(alg) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in alg.model.head.state_dict().items()}


# ----------------------------------------------------------------- what leaves a peer


@pytest.mark.parametrize("name", ["avg", "avgkd", "chfl"])
def test_only_the_head_leaves_a_peer_and_the_handshake_reveals_only_e(name):
    alg = make(name, hidden=(16, 12))
    payload = alg.share(1)
    assert {k: v.shape for k, v in payload.tensors.items()} == {"weight": (C, E), "bias": (C,)}
    assert payload.meta == {"num_samples": 40}
    assert alg.handshake_info() == {"embedding_dim": E}
    # Two peers with different bodies and input spaces agree on the handshake.
    assert make(name, features=11, hidden=(64,)).handshake_info() == alg.handshake_info()


def test_aggregate_is_the_sample_weighted_mean_of_the_heads():
    peers = {f"p{i}": make("avg", f"p{i}", features=4 + i, n=20 * (i + 1)) for i in range(3)}
    contributions = {p: a.share(1) for p, a in peers.items()}
    result = peers["p1"].aggregate(1, contributions)
    n = np.array([20.0, 40.0, 60.0])
    for name in ("weight", "bias"):
        stack = np.stack([contributions[p].tensors[name] for p in sorted(peers)]).astype(np.float64)
        expected = np.tensordot(n / n.sum(), stack, axes=1)  # independent: sum_k n_k w_k / sum n
        # The aggregate is float32: allow float32 rounding relative to the inputs'
        # scale (an entry that nearly cancels to 0 has no meaningful relative error).
        np.testing.assert_allclose(result.tensors[name], expected, rtol=1e-6,
                                   atol=1e-6 * np.abs(stack).max())
    plain = get_algorithm("avg")(peers["p0"].ctx, get_algorithm("avg").Config(weighted=False))
    assert plain.share(1).meta == {}  # an unweighted mean needs no sample count: none is sent
    biases = np.stack([c.tensors["bias"] for c in contributions.values()]).astype(np.float64)
    np.testing.assert_allclose(plain.aggregate(1, contributions).tensors["bias"], biases.mean(axis=0),
                               rtol=1e-6, atol=1e-6 * np.abs(biases).max())


def test_avg_loads_the_mean_head_and_chfl_keeps_it_as_a_teacher_only():
    avg, chfl = make("avg"), make("chfl")
    body_before = [p.detach().clone() for p in chfl.model.features.parameters()]
    own_head = head_arrays(chfl)
    mean = Payload("weights", {"weight": np.full((C, E), 0.25, np.float32),
                               "bias": np.array([1.0, 2.0, 3.0], np.float32)}, {"round": 4})
    assert avg.absorb(4, {"p2": mean})["absorbed"] == 1.0
    np.testing.assert_array_equal(head_arrays(avg)["bias"], [1, 2, 3])  # AVG: replaced

    metrics = chfl.absorb(4, {"p2": mean})
    assert metrics["absorbed"] == 1.0 and chfl.teacher_round == 4
    np.testing.assert_array_equal(head_arrays(chfl)["weight"], own_head["weight"])  # CHFL: kept
    np.testing.assert_array_equal(chfl.teacher.bias.detach().numpy(), [1, 2, 3])
    assert all(torch.equal(a, b) for a, b in zip(body_before, chfl.model.features.parameters(), strict=True))
    assert not any(p.requires_grad for p in chfl.teacher.parameters())


def test_avgkd_loads_the_mean_head_and_distils_from_it():
    alg = make("avgkd")
    mean = Payload("weights", {"weight": np.ones((C, E), np.float32), "bias": np.zeros(C, np.float32)})
    alg.absorb(2, {"p1": mean})
    np.testing.assert_array_equal(head_arrays(alg)["weight"], np.ones((C, E)))
    np.testing.assert_array_equal(alg.teacher.weight.detach().numpy(), np.ones((C, E)))


# ----------------------------------------------------------------- the eq. 5 loss


def test_round_one_is_plain_cross_entropy_and_later_rounds_add_alpha_dkd():
    alg = make("chfl", rounds=10, alpha=0.5, beta=5.0)
    x, y = torch.from_numpy(alg.ctx.train.x[:16]), torch.from_numpy(alg.ctx.train.y[:16])
    ce = float(nn.functional.cross_entropy(alg.model(x), y).detach())
    assert float(alg.loss(x, y, 1).detach()) == pytest.approx(ce, rel=1e-6)  # no global head yet

    g = torch.Generator().manual_seed(0)
    teacher = {"weight": torch.randn(C, E, generator=g).numpy(), "bias": torch.randn(C, generator=g).numpy()}
    alg.absorb(3, {"p1": Payload("weights", teacher, {"round": 3})})
    feats = alg.model.features(x)
    t_logits = feats @ torch.from_numpy(teacher["weight"]).T + torch.from_numpy(teacher["bias"])
    temperature = 5.0 * (1 + math.cos(math.pi * 4 / 10)) + 1  # eq. 7 at t = 4, T_max = 10
    assert alg.temperature(4) == pytest.approx(temperature)
    expected = ce + 0.5 * float(dkd_loss(alg.model.head(feats), t_logits, y, temperature).detach())
    assert float(alg.loss(x, y, 4).detach()) == pytest.approx(expected, rel=1e-5)


def test_the_teacher_gets_no_gradient_and_the_body_does():
    alg = make("chfl")
    alg.absorb(1, {"p1": Payload("weights", {"weight": np.ones((C, E), np.float32),
                                             "bias": np.zeros(C, np.float32)})})
    x, y = torch.from_numpy(alg.ctx.train.x[:8]), torch.from_numpy(alg.ctx.train.y[:8])
    alg.loss(x, y, 2).backward()
    assert all(p.grad is None for p in alg.teacher.parameters())
    assert all(p.grad is not None for p in alg.model.features.parameters())


def test_a_stale_global_head_is_not_distilled_from():
    alg = make("chfl", rounds=10)
    alg.absorb(2, {"p1": alg.share(2)})
    x, y = torch.from_numpy(alg.ctx.train.x[:8]), torch.from_numpy(alg.ctx.train.y[:8])
    ce = float(nn.functional.cross_entropy(alg.model(x), y).detach())
    assert alg.distils(3) and not alg.distils(4)  # round 3 learns from round 2's head, not round 4
    assert float(alg.loss(x, y, 4).detach()) == pytest.approx(ce, rel=1e-6)
    assert "teacher_round" not in alg.local_update(4)
    relaxed = make("chfl", rounds=10, teacher_max_age=2)
    relaxed.absorb(2, {"p1": relaxed.share(2)})
    assert relaxed.distils(4) and not relaxed.distils(5)


def test_local_update_reports_the_schedule():
    alg = make("chfl", rounds=5, beta=2.0)
    assert "temperature" not in alg.local_update(1)
    alg.absorb(4, {"p1": alg.share(4)})
    m = alg.local_update(5)
    assert m["temperature"] == pytest.approx(chfl_temperature(5, 5, 2.0)) == pytest.approx(1.0)
    assert m["teacher_round"] == 4 and m["dkd_loss"] >= 0


# ----------------------------------------------------------------- bad input


def test_hostile_or_mismatched_contributions_are_left_out_of_the_mean():
    agg, good = make("avg", "p0"), make("avg", "p1")
    ok = good.share(1)
    bad = {
        "wrong_shape": Payload("weights", {"weight": np.zeros((C, E + 1), np.float32),
                                           "bias": np.zeros(C, np.float32)}, {"num_samples": 5}),
        "nan": Payload("weights", {"weight": np.full((C, E), np.nan, np.float32),
                                   "bias": np.zeros(C, np.float32)}, {"num_samples": 5}),
        "extra": Payload("weights", {**ok.tensors, "body.0.weight": np.zeros(3, np.float32)},
                         {"num_samples": 5}),
        "dtype": Payload("weights", {k: v.astype(np.float64) for k, v in ok.tensors.items()},
                         {"num_samples": 5}),
        "samples": Payload("weights", ok.tensors, {"num_samples": -3}),
        "samples_str": Payload("weights", ok.tensors, {"num_samples": "many"}),
    }
    result = agg.aggregate(2, {"p1": ok, **bad})
    assert sorted(result.meta["excluded"]) == sorted(bad)
    np.testing.assert_array_equal(result.tensors["weight"], ok.tensors["weight"])
    assert agg.aggregate(2, bad) is None  # nothing usable: no result at all


def test_a_result_that_does_not_fit_or_is_stale_is_refused_and_changes_nothing():
    alg = make("chfl")
    before = head_arrays(alg)
    wrong = Payload("weights", {"weight": np.zeros((C + 1, E), np.float32), "bias": np.zeros(C + 1, np.float32)})
    assert alg.absorb(3, {"p1": wrong}) == {"absorbed": 0.0}
    stale = Payload("weights", {"weight": np.zeros((C, E), np.float32), "bias": np.zeros(C, np.float32)},
                    {"round": 2})
    assert alg.absorb(3, {"p1": stale}) == {"absorbed": 0.0}
    assert alg.teacher_round == 0
    np.testing.assert_array_equal(head_arrays(alg)["weight"], before["weight"])


def test_checkpoint_keeps_the_global_head():
    alg = make("chfl")
    alg.absorb(6, {"p1": Payload("weights", {"weight": np.ones((C, E), np.float32),
                                             "bias": np.arange(C, dtype=np.float32)})})
    state = alg.state_dict()
    fresh = make("chfl")
    assert fresh.teacher is None
    fresh.load_state_dict(state)
    assert fresh.teacher_round == 6
    np.testing.assert_array_equal(fresh.teacher.bias.detach().numpy(), np.arange(C))


# ----------------------------------------------------------------- fedprox


@pytest.mark.parametrize("part", ["model", "head"])
def test_fedprox_adds_mu_half_squared_distance_to_the_round_start(part):
    alg = make("fedprox", mu=0.3, part=part)
    anchor = {k: v.detach().clone() for k, v in alg.shared().named_parameters()}  # w^t
    alg.local_update(1)
    x, y = torch.from_numpy(alg.ctx.train.x[:8]), torch.from_numpy(alg.ctx.train.y[:8])
    ce = float(nn.functional.cross_entropy(alg.model(x), y).detach())
    sq = sum(float(((p.detach() - anchor[k]) ** 2).sum()) for k, p in alg.shared().named_parameters())
    assert sq > 0  # the round's training moved the weights away from w^t
    assert float(alg.loss(x, y, 1).detach()) == pytest.approx(ce + 0.3 / 2 * sq, rel=1e-5)
    sent = set(alg.share(1).tensors)
    assert sent == ({"weight", "bias"} if part == "head" else set(alg.model.state_dict()))


def test_fedprox_keeps_the_last_global_model_as_its_anchor_over_local_rounds():
    # cohort.communicate_every: k: rounds between exchanges are local steps, all toward the
    # w^t of the last exchange (it used to be reset every round, so with one batch a round
    # the proximal term was always 0 and FedProx trained exactly as FedAvg).
    alg = make("fedprox", mu=0.3)
    start = [p.detach().clone() for p in alg.shared().parameters()]
    alg.local_update(1)
    alg.local_update(2)  # no exchange in between
    assert all(torch.equal(a, s) for a, s in zip(alg._anchor, start, strict=True))
    result = {k: np.full(v.shape, 0.5, np.float32) for k, v in alg.model.state_dict().items()}
    assert alg.absorb(3, {"p1": Payload("weights", result, {"round": 3})})["absorbed"] == 1.0
    assert all(torch.all(a == 0.5) for a in alg._anchor)  # the absorbed global model
    alg.absorb(4, {})  # a round without a result keeps it
    assert all(torch.all(a == 0.5) for a in alg._anchor)


def test_fedprox_with_mu_zero_is_fedavg():
    prox, avg = make("fedprox", "p0", mu=0.0), make("fedavg", "p0")
    prox.local_update(1)
    avg.local_update(1)
    for a, b in zip(prox.model.parameters(), avg.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert prox.handshake_info() == avg.handshake_info()


# ----------------------------------------------------------------- a simulated cohort


@pytest.mark.parametrize("aggregate_at", ["auto", "aggregator"])
def test_a_simulated_chfl_cohort_of_different_input_spaces_and_bodies(aggregate_at):
    # auto: a head is small, so every peer aggregates for itself (no aggregator to trust);
    # aggregator: the rotation's elected peer aggregates for all. The same heads either way.
    peers = [make("chfl", f"p{i}", features=4 + 3 * i, hidden=[(16,), (32, 16), (8, 8, 8)][i],
                  n=40 + 10 * i, rounds=4) for i in range(3)]
    history = simulate(peers, rounds=4, aggregate_at=aggregate_at)
    for pid, records in history.items():
        assert [r["round"] for r in records] == [1, 2, 3, 4]
        assert [r["aggregator"] for r in records] == (
            [pid] * 4 if aggregate_at == "auto" else ["p1", "p2", "p0", "p1"])
        assert all(r["absorbed"] == 1.0 for r in records)
        assert [r.get("teacher_round") for r in records] == [None, 1, 2, 3]
        assert all(r["bytes_shared"] == (C * E + C) * 4 for r in records)
    crcs = {pid: [r["absorbed_crc"] for r in records] for pid, records in history.items()}
    assert len({tuple(v) for v in crcs.values()}) == 1  # every peer holds the same global head


# ----------------------------------------------------------------- random MLPs


def test_random_mlp_draws_its_shape_from_its_seed():
    from hfl.models.mlp import draw_hidden

    shapes = {tuple(draw_hidden((1, 3), (16, 256), s)) for s in range(40)}
    assert len(shapes) > 20  # different peers, different models
    assert {len(s) for s in shapes} == {1, 2, 3}
    assert all(16 <= w <= 256 for s in shapes for w in s)
    assert draw_hidden((1, 3), (16, 256), 7) == draw_hidden((1, 3), (16, 256), 7)
    model = build_model("random_mlp", (10,), C, E, seed=7)
    hidden = draw_hidden((1, 3), (16, 256), 7)
    linears = [m.out_features for m in model.features if isinstance(m, nn.Linear)]
    assert linears == [*hidden, E] and model.arch == f"random_mlp{hidden}"
    with pytest.raises(ValueError, match="depth"):
        build_model("random_mlp", (10,), C, E, seed=1, depth=(3, 1))
    with pytest.raises(ValueError, match="seed must be an int"):
        build_model("random_mlp", (10,), C, E, seed="x")


def test_each_peer_draws_its_own_random_mlp_reproducibly():
    from hfl.peer.config import config_from_dict
    from hfl.peer.factory import model_options

    def opts(peer, **model):
        return model_options(config_from_dict({"node": {"id": peer},
                                               "model": {"arch": "random_mlp", **model}}))

    assert opts("p0")["seed"] != opts("p1")["seed"]
    assert opts("p0") == opts("p0")
    assert opts("p0", options={"seed": 5})["seed"] == 5
    assert "seed" not in model_options(config_from_dict({"node": {"id": "p0"}}))  # mlp: no seed


# ----------------------------------------------------------------- over the runtime


@pytest.mark.timeout(120)
def test_chfl_cohort_over_the_runtime_with_duplicated_and_delayed_heads(tmp_path):
    """Heads travel through the protocol: duplicated and delayed (so reordered)
    knowledge and results never make a peer apply a head twice or one of
    another round."""
    import asyncio

    from hfl.peer.config import config_from_dict
    from hfl.peer.runner import run_peer
    from hfl.peer.transport import FaultPlan, MemoryHub

    n, rounds = 3, 4

    def cfg(i):
        return config_from_dict({
            "node": {"id": f"p{i}", "listen": f"mem://p{i}", "bootstrap": ["mem://p0"] if i else [],
                     "run_dir": str(tmp_path / f"p{i}"), "min_peers": n, "resume": False},
            # the aggregator path (results travel); every_peer is tested in test_trust.py
            "cohort": {"algorithm": "chfl", "rounds": rounds, "aggregate_at": "aggregator"},
            "timing": {"heartbeat_interval_s": 0.05, "suspect_after_s": 2.0, "dead_after_s": 4.0,
                       "round_timeout_s": 20, "join_timeout_s": 30},
            "data": {"dataset": "breast_cancer", "partition": "iid", "num_partitions": n,
                     "partition_index": i, "feature_split": "random", "feature_fraction": 0.4},
            "model": {"arch": "random_mlp", "embedding_dim": 8},
            "train": {"max_batches": 3},
        })

    plan = FaultPlan(seed=5, duplicate=0.5, delay=0.5, delay_s=(0.0, 0.05),
                     only_types=frozenset({"knowledge", "aggregate"}))

    async def main():
        hub = MemoryHub()
        return await asyncio.gather(*(run_peer(cfg(i), hub=hub, fault_plan=plan) for i in range(n)))

    results = asyncio.run(main())
    assert plan.counts.get("duplicated", 0) > 0 and plan.counts.get("delayed", 0) > 0
    for r in range(1, rounds + 1):
        records = [res.metrics[r - 1] for res in results]
        assert all(m["round"] == r and m["absorbed"] == 1.0 and m["contributors"] == n
                   for m in records)
        assert len({m["absorbed_crc"] for m in records}) == 1  # one global head per round
        assert all(m.get("teacher_round") == (r - 1 if r > 1 else None) for m in records)

    # The simulator is what the runtime does: the same configs, simulated with no
    # network, give the very same heads and accuracies round by round.
    from hfl.peer.factory import build_algorithm

    simulated = simulate([build_algorithm(cfg(i))[0] for i in range(n)], rounds, aggregate_at="aggregator")
    for res in results:
        sim = simulated[res.metrics[0]["peer"]]
        for key in ("absorbed_crc", "test_acc", "train_loss"):
            assert [m[key] for m in res.metrics] == [m[key] for m in sim], key


def test_training_never_makes_a_batch_of_one_sample():
    from hfl.algorithms.training import batches

    ds = dataset(0, 65, 4)  # 65 = 2 * 32 + 1
    sizes = [len(y) for _, y in batches(ds, 32, torch.Generator().manual_seed(0))]
    assert sizes == [32, 33]
    assert [len(y) for _, y in batches(ds, 32, None, shuffle=False)] == [32, 32, 1]  # evaluation
    assert [len(y) for _, y in batches(dataset(0, 1, 4), 32, None)] == [1]
    model = build_model("resnet18", (1, 8, 8), C, E)  # BatchNorm: a batch of one would raise
    alg_ctx = AlgorithmContext(peer_id="p0", model=model, train=ArrayDataset(
        np.random.default_rng(0).random((33, 1, 8, 8), dtype=np.float32), np.arange(33) % C, C),
        test=None, num_classes=C, device=torch.device("cpu"), seed=0,
        train_cfg=TrainConfig(batch_size=32))
    assert math.isfinite(get_algorithm("solo")(alg_ctx).local_update(1)["train_loss"])


def test_chfl_on_a_users_csv_with_categorical_columns_split_by_column(tmp_path):
    """The tabular cohort on a CSV a user names: text columns one-hot encoded,
    columns sliced per peer, rows partitioned, a random MLP each."""
    from hfl.data import load_builtin
    from hfl.peer.config import config_from_dict
    from hfl.peer.factory import build_algorithm

    bc = load_builtin("breast_cancer")
    rng = np.random.default_rng(0)
    names = [n.replace(" ", "_") for n in bc.feature_names[:8]]
    lines = [",".join([*names, "site", "smoker", "diagnosis"])]
    for x, y in zip(bc.x[:, :8], bc.y, strict=True):
        site = rng.choice(["north", "south", "east"])
        smoker = "yes" if rng.random() < 0.3 + 0.4 * y else "no"  # informative
        lines.append(",".join([*(f"{v:.5g}" for v in x), site, smoker, ["malignant", "benign"][y]]))
    path = tmp_path / "patients.csv"
    path.write_text("\n".join(lines) + "\n")

    peers = []
    for i in range(3):
        cfg = config_from_dict({
            "node": {"id": f"p{i}"}, "cohort": {"algorithm": "chfl", "rounds": 3},
            "data": {"dataset": "csv", "path": str(path), "target": "diagnosis", "partition": "iid",
                     "num_partitions": 3, "partition_index": i, "feature_split": "slices",
                     "feature_fraction": 0.5, "global_test_fraction": 0},
            "model": {"arch": "random_mlp", "embedding_dim": 8}, "train": {"max_batches": 4}})
        peers.append(build_algorithm(cfg)[0])
    columns = [set(p.ctx.train.schema.source_columns) for p in peers]
    assert all(len(c) == 5 for c in columns) and columns[0] != columns[1]  # ceil(0.5 * 10) each
    assert len({p.model.arch for p in peers}) == 3
    one_hot_features = 0
    for p in peers:
        train, numeric = p.ctx.train, np.array(p.ctx.train.schema.numeric)
        np.testing.assert_allclose(train.x[:, numeric].mean(0), 0, atol=1e-5)  # own rows' statistics
        assert set(np.unique(train.x[:, ~numeric])) <= {0.0, 1.0}  # one-hot, not standardised
        one_hot_features += int((~numeric).sum())
    assert one_hot_features > 0  # some peer holds site= / smoker= columns
    history = simulate(peers, rounds=3)
    assert all(r["absorbed"] == 1.0 for recs in history.values() for r in recs)
