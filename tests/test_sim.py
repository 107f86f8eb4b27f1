"""The deterministic simulator (hfl-sim): its loop, network and invariants, and the seeds
CI runs through it (the real peer code under seeded faults)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time

import pytest

from hfl.launch import sim
from hfl.launch.simloop import SimulationStalled, VirtualLoop, run_as
from hfl.launch.simnet import SimNetwork, SimTransport
from hfl.sim.model import NetworkFaults

# ------------------------------------------------------------------ the virtual loop


def run(coro_fn):
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(coro_fn(loop))
    finally:
        loop.close()


def test_virtual_time_jumps_to_the_next_timer():
    async def main(loop):
        t = time.perf_counter()
        await asyncio.sleep(3600)
        async with asyncio.timeout(5):
            await asyncio.sleep(1)
        return loop.time(), time.perf_counter() - t

    now, wall = run(main)
    assert now == pytest.approx(3601.0)
    assert wall < 0.5


def test_a_frozen_peer_runs_nothing_until_it_thaws_and_then_runs_what_it_missed():
    # SIGSTOP semantics: p's one-second ticks stop at t=1.5 for 2.2 s; its mail arrives
    # meanwhile but is read at the thaw, and its clock has jumped. q runs on.
    log = []

    async def ticker(name, loop):
        for _ in range(4):
            await asyncio.sleep(1.0)
            log.append((name, loop.time()))

    async def main(loop):
        q_inbox = asyncio.Queue()
        p = run_as("p", ticker("p", loop))
        q = run_as("q", ticker("q", loop))

        async def reader():
            got = await q_inbox.get()
            log.append(("p read", got, loop.time()))

        r = run_as("p", reader())
        await asyncio.sleep(1.5)
        loop.freeze("p", 3.7)
        await asyncio.sleep(0.5)
        q_inbox.put_nowait("mail")  # delivered at 2.0 while p is stopped
        await asyncio.gather(p, q, r)

    run(main)
    p_times = [e[1] for e in log if e[0] == "p"]
    assert p_times == [1.0, 3.7, 4.7, 5.7]  # its 2.0 tick came at the thaw
    assert [e[1] for e in log if e[0] == "q"] == [1.0, 2.0, 3.0, 4.0]
    assert ("p read", "mail", 3.7) in log


def test_thaw_ends_a_freeze_at_once():
    async def main(loop):
        seen = []

        async def tick():
            await asyncio.sleep(1.0)
            seen.append(loop.time())

        t = run_as("p", tick())
        await asyncio.sleep(0)  # p is asleep until t=1
        loop.freeze("p", 100.0)
        await asyncio.sleep(2.0)
        loop.thaw("p")
        await t
        return seen

    assert run(main) == [2.0]


def test_a_deadlock_raises_instead_of_hanging():
    async def main(loop):
        await asyncio.Event().wait()  # nothing can ever set it, and no timer is pending

    with pytest.raises(SimulationStalled, match="every task waits"):
        run(main)


def test_threads_are_refused():
    async def main(loop):
        await asyncio.to_thread(print, "never")

    with pytest.raises(RuntimeError, match="would run in a thread"):
        run(main)


# ------------------------------------------------------------------ the network


def test_the_network_is_seeded_and_partitions_heal():
    async def main(loop, seed, cut):
        net = SimNetwork(seed, NetworkFaults() if cut else NetworkFaults(drop=0.2, duplicate=0.2,
                                                                         reorder=0.3))
        a = SimTransport("a", "mem://a", net)
        b = SimTransport("b", "mem://b", net)
        await a.start()
        await b.start()
        links = net.partition(["a"], ["b"]) if cut else None
        for i in range(200):
            await a.send("mem://b", [str(i).encode()], 1.0)
        if links:
            net.heal(links)
            await a.send("mem://b", [b"after"], 1.0)
        await asyncio.sleep(10)
        got = []
        while not b._inbox.empty():
            got.append(bytes((await b.recv())[1][0]))
        return got, dict(net.counts), net.digest()

    first = run(lambda loop: main(loop, 1, False))
    assert first == run(lambda loop: main(loop, 1, False))  # same seed: the same history
    got, counts, _ = first
    assert counts["dropped"] > 10 and counts["duplicated"] > 10 and counts["reordered"] > 10
    assert got != sorted(got, key=int)  # reordered
    assert run(lambda loop: main(loop, 2, False))[2] != first[2]
    got, counts, _ = run(lambda loop: main(loop, 1, True))
    assert got == [b"after"] and counts["partitioned"] == 200


# ------------------------------------------------------------------ the invariants


def checker(mode="aggregator"):
    return sim.Checker(mode=mode, everywhere=False, bound_s=10.0)


def event(c, **e):
    c.events.append(e)
    c._check_step(e)


def test_each_invariant_catches_its_violation(tmp_path):
    c = checker()
    # agreement: two digests for round 3 (a repeat of the same digest would agree)
    event(c, event="absorbed", peer="p0", round=3, source="p1", epoch=0, digest="aa",
          contributors=3, quorum=3, t=1.0)
    event(c, event="absorbed", peer="p1", round=3, source="p2", epoch=1, digest="bb",
          contributors=3, quorum=3, t=1.0)
    event(c, event="absorbed", peer="p2", round=3, source="p2", epoch=1, digest="bb",
          contributors=3, quorum=3, t=1.0)
    # quorum
    event(c, event="published", peer="p2", round=4, epoch=0, digest="cc", contributors=2,
          quorum=3, t=2.0)
    # justified: it skipped epoch 0 while that candidate was only suspect
    event(c, event="took", peer="p3", round=4, epoch=1, own_epoch=0, passed=[("p4", "suspect")],
          t=2.0)
    # resume: restarted at round 3 after checkpointing round 3, and with another model
    event(c, event="checkpointed", peer="p4", incarnation=0, round=3, model="m3", t=3.0)
    event(c, event="started", peer="p4", incarnation=1, round=3, model="m3", t=4.0)
    event(c, event="started", peer="p4", incarnation=2, round=4, model="other", t=5.0)
    rows = {"p4": [{"round": 1}, {"round": 3}, {"round": 3}],  # 1: no checkpoint; 3 twice
            "p0": [{"round": r, "learned_from": 0} for r in (1, 2, 3)]}
    for peer, rs in rows.items():
        (tmp_path / peer).mkdir()
        (tmp_path / peer / "metrics.jsonl").write_text("".join(
            __import__("json").dumps(r) + "\n" for r in rs))
    event(c, event="round", peer="p0", round=3, learned_from=0, t=30.0)
    found = c.check({p: tmp_path / p for p in rows}, {"p0": "ok", "p4": "failed: boom"},
                    calm_at=10.0, end_t=40.0)
    kinds = sorted({v.invariant for v in found})
    assert kinds == ["agreement", "exit", "justified", "learning", "liveness", "metrics", "quorum",
                     "resume"], found
    text = "\n".join(map(str, found))
    assert "round 3: p0 (from p1, epoch 0) took aa; p1 (from p2, epoch 1), p2 (from p2, epoch 1) took bb" in text
    assert "rounds [3] recorded twice" in text and "rounds [1] that no checkpoint holds" in text
    assert "started at round 3; its last checkpoint was round 3" in text
    assert "with another model than its round-3 checkpoint" in text


def test_the_same_digest_published_again_at_a_later_epoch_agrees(tmp_path):
    c = checker()
    event(c, event="absorbed", peer="p0", round=3, source="p1", epoch=0, digest="aa",
          contributors=3, quorum=3, t=1.0)
    event(c, event="absorbed", peer="p1", round=3, source="p2", epoch=1, digest="aa",
          contributors=3, quorum=3, t=1.0)
    assert c.check({}, {}, calm_at=0.0, end_t=1.0) == []


# ------------------------------------------------------------------ real peers, seeded


def test_a_seed_replays_bit_for_bit_in_another_process():
    # Another interpreter with another hash seed: the same message history and aggregates.
    here = sim.run_seed(4, sim.SimOptions())
    assert not here.violations, here.violations
    code = ("from hfl.launch import sim; r = sim.run_seed(4, sim.SimOptions()); "
            "print(r.history, r.delivered, r.peer_rounds)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, timeout=300)
    assert out.stdout.split() == [here.history, str(here.delivered), str(here.peer_rounds)]


# What the simulator found, pinned as it was found (the seed's network stream and this exact
# fault schedule; the generator has changed since): each failed on the code before its fix
# (docs/simulation.md tells each story).
QUICKSTART_TIMING = dict(heartbeat_interval_s=0.5, suspect_after_s=2.0, dead_after_s=4.0,
                         round_timeout_s=30.0, aggregate_grace_s=10.0, join_timeout_s=120.0,
                         send_timeout_s=2.0, gossip_fanout=3, lookahead_rounds=2)
F, Net = sim.Fault, NetworkFaults
REGRESSIONS = {
    "split brain (agreement, seed 7): a partition as p1 published round 1 let p2 commit "
    "a second result": sim.Scenario(
        7, Net(drop=0.0, duplicate=0.05, delay=0.03, delay_s=3.525602422166749),
        [F(3.48, "partition", ("p0", "p1"), 5.25), F(9.29, "partition", ("p4",), 4.09)],
        QUICKSTART_TIMING, 13.38),
    "amnesia (agreement, buggify seed 27): p0 and p1, killed before a checkpoint, formed a "
    "cohort of two": sim.Scenario(
        27, Net(drop=0.025, reorder=0.25, delay_s=4.576522294906211),
        [F(2.68, "slow", ("p0",), 5.25, 30.0), F(2.86, "crash", ("p1",), 4.8),
         F(3.54, "slow", ("p4",), 2.85, 30.0), F(6.77, "pause", ("p0",), 3.83),
         F(8.15, "crash", ("p0",), 4.56), F(11.43, "pause", ("p4",), 4.96)],
        {**QUICKSTART_TIMING, "heartbeat_interval_s": 0.3, "suspect_after_s": 0.9976989268327807,
         "dead_after_s": 2.5953872070526387, "round_timeout_s": 4.268395604171973,
         "aggregate_grace_s": 1.4226785692987847}, 16.39),
    "lost ack (learning, buggify seed 31): one lost ack cost the cohort round 1": sim.Scenario(
        31, Net(drop=0.075, duplicate=0.125, delay_s=3.22456515664924),
        [F(1.98, "crash", ("p2",), 0.73), F(5.07, "partition", ("p1",), 5.25),
         F(7.88, "pause", ("p3",), 0.54), F(10.89, "pause", ("p0",), 0.94),
         F(11.32, "pause", ("p4",), 0.7)],
        {**QUICKSTART_TIMING, "heartbeat_interval_s": 0.3, "suspect_after_s": 0.8737715549304778,
         "dead_after_s": 2.28895138942228, "round_timeout_s": 3.7088710736864754,
         "aggregate_grace_s": 0.13771867662952442}, 12.02),
    "simulator (exit, buggify seed 1588): the run ended while all five peers were down, "
    "before their restarts": sim.Scenario(
        1588, Net(duplicate=0.05, delay_s=1.6272129700423867),
        [F(4.82, "crash", ("p0",), 2.74), F(7.82, "crash", ("p2",), 3.8),
         F(9.96, "crash", ("p3",), 3.81), F(10.13, "crash", ("p1",), 4.34),
         F(11.07, "crash", ("p0",), 3.22), F(11.56, "crash", ("p4",), 2.52)],
        {**QUICKSTART_TIMING, "heartbeat_interval_s": 0.2, "suspect_after_s": 0.7275407682823183,
         "dead_after_s": 1.5982994671629016, "round_timeout_s": 3.645279340767326,
         "aggregate_grace_s": 0.1755069152503385}, 14.47),
    "late aggregator (learning, buggify seed 3022): 20 % loss, p1 late and waiting for a "
    "lost contribution; everyone failed over from it": sim.Scenario(
        3022, Net(drop=0.2, duplicate=0.125, reorder=0.25, delay_s=0.589001831763985),
        [F(8.52, "pause", ("p3",), 1.76), F(8.71, "crash", ("p2",), 2.2),
         F(9.49, "crash", ("p3",), 0.25), F(11.81, "partition", ("p3",), 1.86)],
        {**QUICKSTART_TIMING, "heartbeat_interval_s": 0.1, "suspect_after_s": 0.3213586193584231,
         "dead_after_s": 0.8459624186862517, "round_timeout_s": 2.1761521193734694,
         "aggregate_grace_s": 0.03007070123198463}, 13.67),
    "simulator (exit, seed 94): a peer killed while stopped never ended": sim.Scenario(
        94, Net(drop=0.03, duplicate=0.05, delay_s=5.883137371588397),
        [F(9.0, "pause", ("p4",), 5.25), F(11.44, "pause", ("p4",), 5.25),
         F(11.86, "crash", ("p4",), 5.25)], QUICKSTART_TIMING, 17.11),
    "simulator (exit, seed 186): a peer killed while stopped was never restarted": sim.Scenario(
        186, Net(duplicate=0.05, reorder=0.1, delay=0.03, delay_s=4.272968962076087),
        [F(3.66, "pause", ("p1",), 5.25), F(5.0, "crash", ("p1",), 1.42),
         F(6.39, "crash", ("p3",), 5.25)], QUICKSTART_TIMING, 11.64),
}


@pytest.mark.parametrize("story", sorted(REGRESSIONS))
def test_regressions_hold(story):
    scenario = REGRESSIONS[story]
    res = sim.run_seed(scenario.seed, sim.SimOptions(), scenario)
    assert not res.violations, f"{story}: {res.violations}"


# Departures and returns (issue 30), each found on the code before its fix: a round with
# no result at all, or a stall of a whole round timeout. They must cost a round at most
# dead_after_s + 2 heartbeats over the median round, and every round gets a result.
ROUND_ROBIN = ("p0", "p1", "p2", "p3", "p4")
LEAVES = {
    "goodbye mid-round: p2 SIGTERMed in round 3, back 0.5 s later; the rotation dropped it "
    "at some peers before their election and after it at others": sim.Scenario(
        1, Net(), [F(6.3, "leave", ("p2",), 0.5)], QUICKSTART_TIMING, 6.8),
    "rolling restart with SIGTERM: each goodbye and return moved the rotation": sim.Scenario(
        1, Net(), [F(4.0, "rolling", ROUND_ROBIN, 0.3, signal="term")], QUICKSTART_TIMING, 4.0),
    "rolling restart with SIGKILL": sim.Scenario(
        1, Net(), [F(4.0, "rolling", ROUND_ROBIN, 0.3, signal="kill")], QUICKSTART_TIMING, 4.0),
    "an aggregator back while still alive to everyone: p3 SIGKILLed in its round 3, restarted "
    "0.3 s later, sat the round out while every peer waited for it": sim.Scenario(
        1, Net(), [F(6.7, "crash", ("p3",), 0.3)], QUICKSTART_TIMING, 7.0),
    "an aggregator's new life never got the contributions its earlier life lost: p3 restarted "
    "2 s later, before anyone held it dead": sim.Scenario(
        1, Net(), [F(6.3, "crash", ("p3",), 2.0)], QUICKSTART_TIMING, 8.3),
    "stale epochs: aggregator p3 SIGSTOPped 4.5 s came back as everyone failed over; old "
    "epoch-0 heartbeats sent each peer on until each served alone below the quorum": sim.Scenario(
        1, Net(), [F(6.3, "pause", ("p3",), 4.5)], QUICKSTART_TIMING, 10.8),
    "the rolling restart on a lossy network (3 % loss): a lost contribution cost its round "
    "the whole round timeout": sim.Scenario(
        5, Net(drop=0.03, duplicate=0.05, reorder=0.1, delay_s=4.0),
        [F(3.0, "rolling", ROUND_ROBIN, 1.0, signal="term")], QUICKSTART_TIMING, 3.0),
}


def test_a_lone_peer_ahead_does_not_end_a_round_its_aggregator_still_serves():
    # p4, cut off in round 3, fails over to itself, serves below the quorum and moves on
    # to round 4 alone, while round 3's aggregator p3 (30x slow) is still aggregating.
    # Its heartbeat (round 4) made everyone else leave round 3 without its result, and
    # p3 give up on the acks (found with a partition and a slowdown; round 3 lost).
    sc = sim.Scenario(1, Net(), [F(6.3, "partition", ("p4",), 4.5),
                                 F(6.6, "slow", ("p3",), 8.0, 30.0)], QUICKSTART_TIMING, 14.6)
    res = sim.run_seed(1, sim.SimOptions(), sc)
    assert not res.violations, res.violations
    assert res.rounds_without_result == []


def test_an_aggregator_asks_again_for_a_contribution_that_was_lost():
    # Seed 55 (8 % loss, a SIGTERM and a restart): a contribution lost on its way to
    # round 2's aggregator cost the round its whole round_timeout_s (32.8 s over the
    # median round); the aggregator now asks the members it still awaits (heartbeat
    # "awaiting") after 4 heartbeats, and they send it again.
    res = sim.run_seed(55, sim.SimOptions())
    assert not res.violations, res.violations
    t = QUICKSTART_TIMING
    assert res.worst_over_median_s() <= t["dead_after_s"] + 4 * t["heartbeat_interval_s"]


@pytest.mark.parametrize("story", sorted(LEAVES))
def test_leaves_and_returns_cost_at_most_a_detection(story):
    scenario = LEAVES[story]
    rolling = scenario.faults[0].kind == "rolling"
    res = sim.run_seed(scenario.seed, sim.SimOptions(rounds=14 if rolling else 10), scenario)
    assert not res.violations, f"{story}: {res.violations}"
    assert res.rounds_without_result == [], story
    t = QUICKSTART_TIMING
    assert res.worst_over_median_s() <= t["dead_after_s"] + 2 * t["heartbeat_interval_s"], (
        f"{story}: the worst round took {res.worst_over_median_s():.1f} s over the median")


def test_a_rolling_restart_of_a_broadcast_method_loses_no_round():
    # FedH2L (every peer teaches every other): rounds have no aggregator; a goodbye and a
    # return must not stall the exchange either.
    sc = sim.Scenario(1, Net(), [F(4.0, "rolling", ("p0", "p1", "p2", "p3"), 0.3)],
                      QUICKSTART_TIMING, 4.0)
    res = sim.run_seed(1, sim.SimOptions(experiment=str(sim.DEFAULT_EXPERIMENT.parent /
                                                        "rotated_digits.yaml"),
                                         peers=4, rounds=8), sc)
    assert not res.violations, res.violations
    assert res.worst_over_median_s() <= 5.0


CI_SEEDS = range(0, 100)
CI_BUGGIFY_SEEDS = range(0, 50)
CI_RUNS = [(seed, False) for seed in CI_SEEDS] + [(seed, True) for seed in CI_BUGGIFY_SEEDS]
HISTORIES: dict[tuple[int, bool], str] = {}  # what this process computed, in this order


@pytest.mark.parametrize(("seed", "buggify"), CI_RUNS,
                         ids=[f"{s}{'-buggify' if b else ''}" for s, b in CI_RUNS])
def test_ci_seed_holds_every_invariant(seed, buggify):
    # The real runtime under 100 seeded fault schedules, then 50 with shrunk timeouts and
    # denser faults (about 100 s in all). One seed per test: a seed takes about a second,
    # far inside pytest-timeout's limit even on a loaded machine. (As one 100 s test it ran
    # past the 180 s limit under load, and the timeout's SIGALRM landed inside a simulated
    # peer: issue 30's seed 28.) A failing seed prints its replay command.
    res = sim.run_seed(seed, sim.SimOptions(buggify=buggify))
    HISTORIES[seed, buggify] = res.history
    flag = " --buggify" if buggify else ""
    assert not res.violations, f"hfl-sim --seed {seed}{flag}: " + "; ".join(map(str, res.violations))


@pytest.mark.timeout(900)  # alone it runs the 100 seeds itself; after them, about 10 s
def test_a_seed_history_is_the_same_run_first_after_100_seeds_and_beside_busy_cpus():
    # Nothing outside the seed reaches a run: not what ran before it in the process, not
    # the machine's load. Seed 28 as the first thing a fresh interpreter does, and here
    # after at least 100 other seeds, both while every CPU is busy with other processes.
    seed = 28
    for other in range(100):  # when run alone; in a full run the CI seeds above ran already
        if len(HISTORIES) >= 100:
            break
        if (other, False) not in HISTORIES:
            HISTORIES[other, False] = sim.run_seed(other, sim.SimOptions()).history
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(os.cpu_count() or 2)]
    try:
        code = ("from hfl.launch import sim; "
                f"print(sim.run_seed({seed}, sim.SimOptions()).history)")
        first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True, timeout=170).stdout.split()[-1]
        after = sim.run_seed(seed, sim.SimOptions()).history
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert len(HISTORIES) >= 100
    assert after == first, (after, first)
    if (seed, False) in HISTORIES:  # run earlier in this process, after fewer seeds
        assert HISTORIES[seed, False] == first


def test_no_wall_clock_reaches_a_simulated_run(monkeypatch):
    # The wall clocks jump by hours between calls (and go backwards): the history is
    # the same, since everything the runtime decides on reads the simulator's clock.
    import itertools

    ticks = itertools.count()

    def wild() -> float:
        n = next(ticks)
        return 1e9 + (3600.0 * n if n % 2 else -7.0 * n)

    clean = sim.run_seed(7, sim.SimOptions())
    for name in ("time", "monotonic", "perf_counter"):
        monkeypatch.setattr(time, name, wild)
    wild_run = sim.run_seed(7, sim.SimOptions())
    monkeypatch.undo()
    assert next(ticks) > 100  # the clocks were read, and nothing depended on them
    assert wild_run.history == clean.history and not wild_run.violations


class Interrupt(BaseException):
    """What a signal handler raises inside a run (pytest-timeout's Failed is one)."""


def test_an_interrupt_inside_a_peer_ends_the_run_instead_of_changing_its_history(
        monkeypatch, tmp_path):
    # Issue 30's seed 28: pytest-timeout's SIGALRM raised its Failed (a BaseException) in
    # one peer's receive loop. The runtime logged the dead task and the peer ran on, deaf:
    # every peer "learned from no other peer in 5 of its 6 round(s)". Here the same, at a
    # fixed point: the run must end with the interrupt, never report a history.
    from hfl.peer.core import PeerCore

    heard = {"p3": 0}
    on_heartbeat = PeerCore._on_heartbeat

    def interrupted(self, msg, now):
        if self.id == "p3":
            heard["p3"] += 1
            if heard["p3"] == 200:
                raise Interrupt("Timeout (>180.0s) from pytest-timeout.")
        return on_heartbeat(self, msg, now)

    monkeypatch.setattr(PeerCore, "_on_heartbeat", interrupted)
    monkeypatch.setattr(sim.tempfile, "tempdir", str(tmp_path))
    with pytest.raises(Interrupt):
        sim.run_seed(28, sim.SimOptions())
    assert heard["p3"] == 200
    # ... and leaves no run folder behind (each one was left in /tmp: 5 peers' files)
    assert list(tmp_path.glob("hfl-sim-*")) == []
    from hfl.peer.configtools import ConfigError
    with pytest.raises(ConfigError, match="config file not found"):
        sim.run_seed(0, sim.SimOptions(experiment=str(tmp_path / "missing.yaml")))
    assert list(tmp_path.glob("hfl-sim-*")) == []
    monkeypatch.undo()
    again = sim.run_seed(28, sim.SimOptions())  # and the process is fit for the next run
    assert not again.violations
    assert again.history == HISTORIES.get((28, False), again.history)


def test_peers_restarted_with_a_goodbye_are_waited_for_where_the_quorum_needs_them(tmp_path):
    # A restart review: three signed peers (commits need 3 of 3), one stopped with SIGTERM
    # and restarted; its goodbye made the others stop waiting for a quorum, and they ran
    # round after round without a result until it was back (real processes: 21 of 30
    # rounds lost, every peer exited 3). Reproduced here first: seeds 0 and 8 violated
    # *learning*. A member that said goodbye before the last round is one that may come
    # back (a restart, a rolling update): waited for once per loss, as a silent one.
    faults = ["leave:p1@4+3", "leave:p1@12+3", "leave:p2@20+3"]
    lost = 0
    for seed in (0, 8):
        res = sim.run_seed(seed, sim.SimOptions(peers=3, rounds=10, signed=True, faults=faults,
                                                keep=tmp_path))
        assert not res.violations, [str(v) for v in res.violations]
        lost += len(res.rounds_without_result)
    assert lost <= 6, lost  # (one a restart at most: the round under way when it left)
    # Each peer said at its start what f = 1 costs in a cohort of 3 (3 of 3; a review)
    log = (tmp_path / "hfl-sim-seed0" / "sim.log").read_text()
    assert log.count("node.byzantine 1 (f) in a cohort of 3: a commit needs 3 of the 3 members, "
                     "so 1 silent member(s)") >= 3, log[:2000]
    # ... and only where results are committed: with every peer aggregating (CHFL's
    # shipped 3-peer example) there are no commits to stop (every peer warned, a review)
    res = sim.run_seed(0, sim.SimOptions(peers=3, rounds=3, signed=True, keep=tmp_path / "ep",
                                         overrides=["defaults.cohort.aggregate_at=every_peer"]))
    assert not res.violations, [str(v) for v in res.violations]
    log = (tmp_path / "ep" / "hfl-sim-seed0" / "sim.log").read_text()
    assert "aggregate" in log and "silent member(s)" not in log, log[:2000]


def test_a_peer_restarted_without_its_run_folder_catches_up_without_a_second_result():
    # A peer whose disk was lost restarts with no checkpoint and no record of the rounds
    # its earlier life entered (rule 6's sit-out needs that record): it must neither
    # make a round's result twice nor stop its cohort learning. p2 is killed in the
    # middle of a round it aggregates or contributes to, in a signed cohort of 4.
    for seed, faults in ((0, ["wipe:p2@2.7+0.05"]), (1, ["wipe:p2@5.2+0.05"]),
                         (2, ["wipe:p1@3.1+0.2", "wipe:p1@8.4+0.2"])):  # (twice: both kept)
        res = sim.run_seed(seed, sim.SimOptions(peers=4, rounds=10, signed=True,
                                                faults=faults))
        assert not res.violations, [str(v) for v in res.violations]
        assert res.outcomes == {p: "ok" for p in ("p0", "p1", "p2", "p3")}


def test_a_peer_whose_receive_loop_dies_stops_loudly_instead_of_running_on_deaf(monkeypatch):
    # The same at the runtime's level: a failure that ends the receive loop (its transport
    # broke; a handler's exception is already caught per message) used to be logged while
    # the peer ran on, alive to the others and deaf to them.
    got = {"p3": 0}
    recv = SimTransport.recv

    async def broken(self):
        if self.peer_id == "p3":
            got["p3"] += 1
            if got["p3"] == 100:
                raise RuntimeError("the socket broke")
        return await recv(self)

    monkeypatch.setattr(SimTransport, "recv", broken)
    res = sim.run_seed(28, sim.SimOptions())
    assert res.outcomes["p3"].startswith("failed: NodeFailed: p3: its receive loop failed "
                                         "(RuntimeError: the socket broke)"), res.outcomes
    assert any(v.invariant == "exit" and "p3" in v.detail for v in res.violations)


def test_weakening_the_quorum_is_caught_and_the_replay_line_says_how(capsys, monkeypatch):
    # With node.quorum 1 (below a majority) agreement is not guaranteed: the split-brain
    # schedule makes both sides commit. The CLI names the violation and prints the one
    # command that replays it, overrides included.
    split = next(sc for story, sc in REGRESSIONS.items() if story.startswith("split brain"))
    monkeypatch.setattr(sim, "plan_scenario", lambda *args, **kwargs: split)
    code = sim.main(["--seed", "7", "--set", "defaults.node.quorum=1", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert "VIOLATED agreement: round" in out
    assert "replay: hfl-sim --set defaults.node.quorum=1 --seed 7" in out


def test_bad_cli_input_is_named(capsys):
    with pytest.raises(SystemExit):
        sim.main(["--seeds", "a-b"])
    assert "seeds: got 'a-b'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sim.main(["--peers", "1"])
    assert "--peers: got 1" in capsys.readouterr().err
    assert sim.main(["--seed", "0", "--set", "defaults.cohort.algorithm=nope"]) == 2
    assert "algorithm" in capsys.readouterr().err
    # A mistake only a peer finds (as it builds its data) is still one line, not a
    # violation per peer and seed.
    assert sim.main(["--seeds", "0-1", "--set", "defaults.cohort.algorithm=fedh2l"]) == 2
    assert "public_fraction" in capsys.readouterr().err


# ------------------------------------------------------------- Byzantine twins (issue 35)

EQUIVOCATE = sim.SimOptions(byzantine=["p4:equivocate"],
                            overrides=["defaults.cohort.aggregate_at=every_peer"])
COMMIT = sim.SimOptions(byzantine=["p2:commit"])


@pytest.mark.parametrize("seed", [0, 5])
def test_an_equivocating_twin_is_named_by_every_honest_peer_under_faults(seed):
    res = sim.run_seed(seed, EQUIVOCATE)
    assert not res.violations, [str(v) for v in res.violations]
    assert res.outcomes["p0"] == "ok"


def test_a_twin_that_commits_a_result_to_one_peer_never_splits_the_honest_peers():
    res = sim.run_seed(3, COMMIT)
    assert not res.violations, [str(v) for v in res.violations]


def test_the_twins_invariants_fail_without_the_defenses(monkeypatch):
    # The same twins with the defenses switched off: no proof is ever formed (nobody
    # names p4), and commits are the aggregator's word again (honest peers split).
    from hfl.peer.core import PeerCore

    monkeypatch.setattr(PeerCore, "_convicted", lambda self, peer, r, a, b: None)
    res = sim.run_seed(0, EQUIVOCATE)
    assert {v.invariant for v in res.violations} == {"named"}, [str(v) for v in res.violations]
    monkeypatch.undo()
    monkeypatch.setattr(PeerCore, "certifying", property(lambda self: False))
    res = sim.run_seed(3, COMMIT)
    assert "agreement" in {v.invariant for v in res.violations}, [str(v) for v in res.violations]


def test_a_bad_twin_spec_is_named(capsys):
    assert sim.main(["--seed", "0", "--byzantine", "p9:equivocate"]) == 2
    assert "peer 'p9'" in capsys.readouterr().err
    assert sim.main(["--seed", "0", "--byzantine", "p1:lie"]) == 2
    assert "kind 'lie' is not one of equivocate, commit" in capsys.readouterr().err
    assert sim.main(["--seed", "0", "--byzantine", "p1:commit", "--byzantine", "p2:commit",
                     "--byzantine", "p3:commit"]) == 2
    assert "must be a majority" in capsys.readouterr().err


def test_a_lazy_join_cohort_runs_without_an_error_in_any_handler(tmp_path):
    # timing.join: lazy: a joined peer asks a member whose order differs for its view
    # from the member's heartbeat's handler (a Send). The shell's handler path raised on
    # it ("handler failed", every hfl-sim seed): the ask was never sent and what came
    # after it was lost. Any exception a handler, a tick or a task of the runtime
    # raises is now a violation of *exit*.
    lazy = ["defaults.timing.membership=swim", "defaults.timing.join=lazy",
            "defaults.cohort.aggregate_at=aggregator"]
    res = sim.run_seed(0, sim.SimOptions(peers=5, rounds=10, overrides=lazy, keep=tmp_path))
    assert not res.violations, [str(v) for v in res.violations]
    log = (tmp_path / "hfl-sim-seed0" / "sim.log").read_text()
    assert not re.search(r"(handler|tick \d+|task \S+) failed", log), log[-3000:]


def test_an_exception_in_a_handler_is_a_violation(tmp_path):
    c = checker()

    class Peer:
        id = "p1"

    c.observe("failed", Peer(), where="the handler of a message from p2", error="TypeError()")
    found = c.check({}, {"p1": "ok"}, calm_at=0.0, end_t=1.0)
    assert [v.invariant for v in found] == ["exit"]
    assert "p1: the handler of a message from p2 raised TypeError()" in str(found[0])
