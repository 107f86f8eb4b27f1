"""FedH2L's mimicry loss against hand-computed values (eqs. 3-6)."""

from __future__ import annotations

import math

import pytest
import torch

from hfl.algorithms.fedh2l import mimicry_loss


def test_mimicry_loss_matches_hand_computation():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    p_i = [[math.exp(2) / (math.exp(2) + 1), 1 / (math.exp(2) + 1)],
           [1 / (1 + math.e), math.e / (1 + math.e)]]
    p_j = [[0.7, 0.3], [0.4, 0.6]]
    labels = torch.tensor([0, 1])
    kl = sum(sum(pj * math.log(pj / pi) for pj, pi in zip(rj, ri, strict=True))
             for rj, ri in zip(p_j, p_i, strict=True)) / 2
    ce = -(math.log(p_i[0][0]) + math.log(p_i[1][1])) / 2
    acc = 0.75
    got = mimicry_loss(logits, torch.tensor(p_j), labels, acc)
    assert float(got) == pytest.approx(acc * kl + ce, rel=1e-6)
    assert float(mimicry_loss(logits, torch.tensor(p_j), None, acc)) == pytest.approx(acc * kl, rel=1e-6)
    assert float(mimicry_loss(logits, torch.tensor(p_j), labels, acc, kl=False)) == pytest.approx(ce, rel=1e-6)


def test_a_student_that_equals_its_teacher_has_no_kl():
    logits = torch.tensor([[0.3, -1.2, 2.0]])
    probs = torch.softmax(logits, dim=1)
    assert float(mimicry_loss(logits, probs, None, 1.0)) == pytest.approx(0.0, abs=1e-6)


# --------------------------------------------------------------------------- cohorts

import asyncio  # noqa: E402
import json  # noqa: E402

from hfl.peer.config import config_from_dict  # noqa: E402
from hfl.peer.runner import run_peer  # noqa: E402
from hfl.peer.transport import FaultPlan, MemoryHub  # noqa: E402

TIMING = {"heartbeat_interval_s": 0.05, "suspect_after_s": 1.0, "dead_after_s": 2.0,
          "round_timeout_s": 10, "join_timeout_s": 30}


def peer_config(tmp_path, i, n, algorithm, rounds, seed=0, **node):
    return config_from_dict({
        "node": {"id": f"p{i}", "listen": f"mem://p{i}", "bootstrap": ["mem://p0"] if i else [],
                 "run_dir": str(tmp_path / algorithm / f"p{i}"), "min_peers": n, "resume": False,
                 "seed_chunk_bytes": 2048, **node},
        "cohort": {"algorithm": algorithm, "rounds": rounds, "seed": seed},
        "timing": TIMING,
        "data": {"dataset": "rotated_digits", "partition": "domain", "num_partitions": n,
                 "partition_index": i, "seed": seed,
                 "options": {"angles": [0, 30, 60, 90][:n], "per_class": 40, "size": 8},
                 "public_fraction": 0.15, "val_fraction": 0.1, "test_fraction": 0.2},
        "model": {"arch": "mlp", "embedding_dim": 32, "options": {"hidden": [64]}},
        "train": {"optimizer": "amsgrad", "lr": 0.003, "batch_size": 32, "max_batches": 8},
        "algorithm": {"eta": 0.003} if algorithm == "fedh2l" else {},
    })


def run_cohort(tmp_path, algorithm, rounds, n=4, plan=None):
    async def main():
        hub = MemoryHub()
        cfgs = [peer_config(tmp_path, i, n, algorithm, rounds) for i in range(n)]
        return await asyncio.gather(*(run_peer(c, hub=hub, fault_plan=plan) for c in cfgs))

    return asyncio.run(main())


@pytest.mark.timeout(120)
def test_seed_exchange_survives_dropped_and_duplicated_chunks(tmp_path):
    # 2 KiB chunks: each public set (~60 samples of 8x8) travels in ~8 chunks.
    plan = FaultPlan(seed=3, drop=0.3, duplicate=0.3, only_types=frozenset({"seed_chunk"}))
    results = run_cohort(tmp_path, "fedh2l", rounds=2, plan=plan)
    assert plan.counts.get("dropped", 0) > 0 and plan.counts.get("duplicated", 0) > 0
    for r in results:
        # Every peer held all three teachers' seed sets from round 1 on.
        assert [m["teachers"] for m in r.metrics] == [3.0, 3.0]
        assert r.dropped.get("seed_rejected", 0) > 0  # the duplicates, recognised as such


@pytest.mark.timeout(180)
def test_fedh2l_beats_solo_on_forward_transfer(tmp_path):
    rounds = 8
    fwt = {}
    for algorithm in ("solo", "fedh2l"):
        results = run_cohort(tmp_path, algorithm, rounds)
        fwt[algorithm] = sum(r.metrics[-1]["sel_fwt"] for r in results) / len(results)
        assert all(len(r.metrics) == rounds for r in results)
    assert fwt["fedh2l"] > fwt["solo"] + 0.05, fwt


@pytest.mark.timeout(180)
def test_a_late_joiner_receives_every_seed_set_and_teaches_the_others(tmp_path):
    rounds = 12
    n = 4

    async def main():
        hub = MemoryHub()
        early = [peer_config(tmp_path, i, n, "fedh2l", rounds, min_peers=3) for i in range(3)]
        late = peer_config(tmp_path, 3, n, "fedh2l", rounds, min_peers=2)
        tasks = [asyncio.create_task(run_peer(c, hub=hub)) for c in early]
        metrics = tmp_path / "fedh2l" / "p0" / "metrics.jsonl"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert loop.time() < deadline, "the early cohort never got going"
            await asyncio.sleep(0.05)  # waiting for another task to reach round 2
        late_result = await run_peer(late, hub=hub)
        return [*(await asyncio.gather(*tasks)), late_result]

    results = asyncio.run(main())
    late = results[3].metrics
    assert late[0]["round"] > 2  # it caught up instead of replaying the cohort's rounds
    # (A round whose teachers all missed the deadline has no "teachers" entry.)
    assert max(m.get("teachers", 0.0) for m in late) == 3.0  # it learned from every early peer
    for r in results[:3]:
        teachers = [m.get("teachers", 0.0) for m in r.metrics]
        assert max(teachers[:2]) <= 2.0  # before the newcomer: the two other early peers
        assert teachers[-1] == 3.0  # the newcomer's seeds reached them, and it teaches
    lines = (tmp_path / "fedh2l" / "p3" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["round"] == rounds
