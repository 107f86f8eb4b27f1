"""A thousand peers (issue 20): SWIM-style failure detection and sampled exchange.

The cost figures (messages per peer per second against N, detection time, memory)
are measured in bench/scale.py, never asserted here. These tests check the rules:
the exchange plan's consistency and uniformity, indirect probes, and (on the
deterministic simulator) that a swim cohort keeps every invariant under faults.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
from pathlib import Path

import msgpack
import pytest

from hfl.launch import sim
from hfl.peer.core import PeerCore
from hfl.peer.membership import LEFT, Membership
from hfl.peer.transport import FaultPlan, FaultyTransport, MemoryHub
from tests.test_cohort import (
    RoundWatch,
    TrainingGate,
    assert_completed,
    build_node,
    cohort_cfgs,
    run_conducted,
    until,
)

pytestmark = pytest.mark.timeout(180)


def cores(n: int) -> dict[str, PeerCore]:
    """n peers' cores, each with every other peer in its view (heard from itself)."""
    ids = [f"p{i:02d}" for i in range(n)]
    out = {}
    for me in ids:
        core = PeerCore(me, mode="broadcast", everywhere=False, lookahead=2)
        core.membership = Membership(me, f"mem://{me}", 0, 2.0, 5.0)
        for p in ids:
            core.membership.heard_from(p, 0, 0.0, address=f"mem://{p}")
        out[me] = core
    return out


@pytest.mark.parametrize("n,k", [(10, 3), (7, 6), (5, 9)])
def test_every_peer_waits_for_exactly_the_peers_scheduled_to_send_to_it(n, k):
    peers = cores(n)
    for r in range(1, 30):
        plans = {p: c.exchange_plan(r, k, "hfl:0") for p, c in peers.items()}
        for p, (targets, sources) in plans.items():
            assert len(targets) == len(set(targets)) == len(sources) == min(k, n - 1)
            assert p not in targets and p not in sources
            # the receiver's expectation is the senders' schedule, peer by peer
            assert sources == {q for q, (t, _) in plans.items() if p in t}


def test_the_schedule_changes_each_round_and_is_the_same_on_every_peer():
    a, b = cores(12)["p00"], cores(12)["p00"]
    assert a.exchange_plan(3, 4, "hfl:0") == b.exchange_plan(3, 4, "hfl:0")
    assert a.exchange_plan(3, 4, "hfl:0") != a.exchange_plan(4, 4, "hfl:0")
    assert a.exchange_plan(3, 4, "hfl:0") != a.exchange_plan(3, 4, "other:0")


def test_over_rounds_each_peer_is_a_teacher_equally_often():
    # docs/runtime.md: a peer's teachers are a uniformly random k-subset of the others,
    # which makes the k-teacher average an unbiased estimate of the all-teacher one.
    n, k, rounds = 9, 3, 4000
    core = cores(n)["p00"]
    counts = collections.Counter()
    for r in range(rounds):
        counts.update(core.exchange_plan(r, k, "hfl:0")[1])
    expected = rounds * k / (n - 1)
    chi2 = sum((counts[f"p{i:02d}"] - expected) ** 2 / expected for i in range(1, n))
    assert chi2 < 26.1, counts  # chi-square, 7 degrees of freedom, p = 0.0005


def test_peers_that_leave_do_not_move_the_ring():
    peers = cores(8)
    before = peers["p00"].exchange_plan(5, 3, "hfl:0")
    peers["p00"].membership.left("p03", 0)
    assert peers["p00"].membership.members["p03"].status == LEFT
    assert peers["p00"].exchange_plan(5, 3, "hfl:0") == before


# ---------------------------------------------------------------------------- swim, real nodes


class LoseProbesTo(FaultyTransport):
    """Every probe this peer sends to ``dest`` is lost (a one-way fault of one kind:
    its answers and everything else get through)."""

    def __init__(self, inner, dest: str):
        super().__init__(inner, FaultPlan())
        self.dest, self.lost, self.first_lost_at = dest, 0, None

    async def send(self, address, frames, timeout_s, peer_id=None):
        header = msgpack.unpackb(bytes(frames[0]), raw=False)
        if address == self.dest and header["type"] == "heartbeat" and header["body"].get("probe"):
            self.lost += 1
            if self.first_lost_at is None:
                self.first_lost_at = asyncio.get_running_loop().time()
            return True
        return await self.inner.send(address, frames, timeout_s, peer_id)


def test_a_member_the_prober_cannot_reach_answers_an_indirect_probe_and_stays_alive(tmp_path):
    n, rounds = 5, 4
    cfgs = cohort_cfgs(tmp_path, n, rounds=rounds, timing={"membership": "swim"})
    watch = RoundWatch(c.node.id for c in cfgs)
    gate = TrainingGate([rounds])  # the last round waits until p2 was unreachable long enough
    hub = MemoryHub()
    nodes = [build_node(c, hub, on_round=watch) for c in cfgs]
    for nd in nodes:
        gate.install(nd)
    p0 = nodes[0]
    p0.transport = lossy = LoseProbesTo(p0.transport, "mem://p2")
    assert all(nd.swim for nd in nodes)
    changes = []

    async def conduct():
        while p0.membership is None:
            await asyncio.sleep(0.01)
        tick = p0.membership.tick

        def record(now):
            out = tick(now)
            changes.extend((c.peer_id, c.new) for c in out)
            return out

        p0.membership.tick = record
        await watch.all_finished(rounds - 1)
        # On a fast run the rounds could end before p0 ever probed p2: hold the last one
        # until p0's probes to p2 have been lost for longer than dead_after_s.
        loop = asyncio.get_running_loop()
        dead_after = cfgs[0].timing.dead_after_s
        await until(lambda: lossy.first_lost_at is not None
                    and loop.time() - lossy.first_lost_at > 1.5 * dead_after,
                    "p0's probes to p2 lost for 1.5 x dead_after_s")
        gate.release(rounds)

    results = run_conducted(nodes, gate, conduct)
    assert_completed(results, rounds)
    assert lossy.lost > 0  # p0's probes to p2 were lost all along...
    assert ("p2", "dead") not in changes  # ...and p2's own answers, relayed for, kept it alive
    for res in results.values():
        assert all(rec["learned_from"] > 0 for rec in res.metrics)


# ---------------------------------------------------------------------------- the simulator


SWIM_SEEDS = range(0, 16)
SWIM_BUGGIFY_SEEDS = range(0, 8)


@pytest.mark.parametrize("buggify,seeds", [(False, SWIM_SEEDS[:8]), (False, SWIM_SEEDS[8:]),
                                           (True, SWIM_BUGGIFY_SEEDS)],
                         ids=["0-7", "8-15", "buggify-0-7"])
def test_a_swim_cohort_holds_every_invariant_under_seeded_faults(buggify, seeds):
    # The same eight invariants and liveness bound as tests/test_sim.py, with 8 peers
    # probing instead of heartbeating everyone: crashes, SIGTERMs, restarts, pauses,
    # partitions and a lossy network (about 50 s in all; in three parts, each with its
    # own time limit on a loaded machine).
    bad = []
    for seed in seeds:
        opts = sim.SimOptions(peers=8, buggify=buggify,
                              overrides=["defaults.timing.membership=swim"])
        res = sim.run_seed(seed, opts)
        if res.violations:
            flag = " --buggify" if buggify else ""
            bad.append(f"hfl-sim --peers 8 --set defaults.timing.membership=swim --seed "
                       f"{seed}{flag}: " + "; ".join(map(str, res.violations)))
    assert not bad, "\n".join(bad)


def test_a_killed_peer_is_dead_to_every_other_within_suspect_plus_dead_after_plus_log_n_intervals(
        tmp_path):
    # One SIGKILL, no other fault, 12 peers in swim mode on virtual time: every
    # survivor marks it dead on its own unanswered probes, never sooner than
    # dead_after_s after the kill (no one is credited with another's silence), and
    # within suspect_after_s (the first suspicion) + the news's spread + dead_after_s.
    peers = [f"p{i:02d}" for i in range(12)]
    timing = {"heartbeat_interval_s": 0.5, "suspect_after_s": 2.0, "dead_after_s": 4.0,
              "round_timeout_s": 30.0, "aggregate_grace_s": 10.0}
    victim, t_kill = "p05", 9.0
    scenario = sim.Scenario(seed=1, network=sim.NetworkFaults(), timing=timing,
                            faults=[sim.Fault(t_kill, "crash", (victim,), 20.0)], calm_at=30.0)
    opts = sim.SimOptions(peers=12, rounds=30, overrides=["defaults.timing.membership=swim"],
                          keep=tmp_path)
    res = sim.run_seed(1, opts, scenario)
    assert not res.violations, res.violations
    dead_at = {}
    for log in tmp_path.rglob("sim.log"):
        for line in log.read_text().splitlines():
            m = re.match(r"\s*(\d+\.\d+)\S*\s.*?(p\d+): " + victim + r" (alive|suspect) -> dead", line)
            if m and m.group(2) not in dead_at:
                dead_at[m.group(2)] = float(m.group(1))
    survivors = set(peers) - {victim}
    assert set(dead_at) == survivors, sorted(dead_at)
    delays = sorted(t - t_kill for t in dead_at.values())
    assert delays[0] >= timing["dead_after_s"]
    bound = (timing["suspect_after_s"] + timing["dead_after_s"]
             + 2 * 3.6 * timing["heartbeat_interval_s"] * 4)  # log2(12) = 3.6
    assert delays[-1] <= bound, delays


def test_a_swim_cohort_whose_answers_come_after_dead_after_s_learns_patience(tmp_path):
    # Every message takes 2.2-2.6 s (a round trip over dead_after_s = 4 s: what a loaded
    # machine looked like to 200 peers on 2 cores). Answers that come late raise each
    # peer's patience, which stretches its timeouts: after the first minute nobody is
    # declared dead any more, and every peer runs every round. (Without
    # patience every probe's answer came after its death: deaths to the end.)
    peers = [f"p{i:02d}" for i in range(12)]
    timing = {"heartbeat_interval_s": 0.5, "suspect_after_s": 2.0, "dead_after_s": 4.0,
              "round_timeout_s": 60.0, "aggregate_grace_s": 20.0}
    scenario = sim.Scenario(seed=2, network=sim.NetworkFaults(latency_s=(2.2, 2.6)),
                            timing=timing, faults=[], calm_at=0.0)
    opts = sim.SimOptions(peers=12, rounds=10, overrides=["defaults.timing.membership=swim"],
                          keep=tmp_path)
    res = sim.run_seed(2, opts, scenario)
    assert not res.violations, res.violations
    deaths = []
    for log in tmp_path.rglob("sim.log"):
        for line in log.read_text().splitlines():
            m = re.match(r"\s*(\d+\.\d+)\S*\s.*?(p\d+): (p\d+) (alive|suspect) -> dead", line)
            if m:
                deaths.append((float(m.group(1)), m.group(2), m.group(3)))
    assert not [d for d in deaths if d[0] > 60.0], sorted(deaths)[-5:]
    assert res.peer_rounds == len(peers) * 10, res.peer_rounds


# ---------------------------------------------------------------------------- fanout, configured


def test_fanout_is_refused_for_methods_that_aggregate(tmp_path):
    from hfl.peer.configtools import ConfigError
    from hfl.peer.factory import build_algorithm

    cfg = cohort_cfgs(tmp_path, 2, cohort={"fanout": 1})[0]  # fedavg: aggregator mode
    with pytest.raises(ConfigError) as err:
        build_algorithm(cfg)
    assert err.value.path == "cohort.fanout" and "broadcast" in err.value.detail


def test_a_broadcast_cohort_with_fanout_learns_from_exactly_its_scheduled_teachers(tmp_path):
    # MDH-FL, 6 peers, fanout 2, on the simulator (no faults): every peer's every round
    # learned from its 2 scheduled teachers, and the invariants hold.
    scenario = sim.Scenario(seed=0, network=sim.NetworkFaults(), timing={}, faults=[],
                            calm_at=0.0)
    experiment = Path(__file__).resolve().parent.parent / "examples" / "mdhfl_digits.yaml"
    opts = sim.SimOptions(experiment=str(experiment), peers=6, rounds=3,
                          overrides=["defaults.cohort.fanout=2"], keep=tmp_path)
    res = sim.run_seed(0, opts, scenario)
    assert not res.violations, res.violations
    rows = [json.loads(line) for f in tmp_path.rglob("metrics.jsonl")
            for line in f.read_text().splitlines()]
    assert len(rows) == 6 * 3
    assert {(r["learned_from"], r["received_from"], r["teachers"]) for r in rows} == {(2, 2, 2.0)}
