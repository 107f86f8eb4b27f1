"""The protocol-level simulator: N protocol cores on one discrete-event heap.

Each simulated peer is a :class:`~hfl.peer.core.PeerCore` (membership, election,
quorum, commit rules: the same code ``hfl-peer`` runs) driven by its round
procedures (:class:`~hfl.peer.procedures.RoundProcedures`, the same generators
``Node`` carries out). What this module replaces is everything the shell does:

- **time**: one heap of events; nobody sleeps. Each peer reads its own clock,
  ``offset + t * (1 + skew)`` (clock skew between peers: a seed draws both);
- **the network**: every message goes through :class:`Network` (latency, loss,
  duplicates, reordering, long delays: :class:`hfl.sim.model.NetworkFaults`,
  the system simulator's model), plus partitions and **one-way** link loss;
- **the method**: a peer's knowledge in round r is a small vector drawn from
  (seed, peer, round); its aggregate is the mean of the contributions, and
  training and aggregating cost a drawn compute time. No torch, no files;
- **faults**: members **lost for good** (the cohort shrinks below its start),
  **late joiners**, partitions, one-way loss, slow peers, and faults that may
  last **until the last round**.

Process crashes with restarts from a checkpoint, pauses and files stay with the
system-level simulator (``hfl-sim``, :mod:`hfl.launch.sim`). The history is
checked with the same :class:`hfl.sim.model.Checker` (agreement, quorum,
justified epochs, liveness after the last fault), plus *learning* and *exit*
(below).

    python -m hfl.sim.protocol --seeds 0-999                  # 5 peers, 10 rounds
    python -m hfl.sim.protocol --seeds 0-499 --buggify
    python -m hfl.sim.protocol --peers 1000 --rounds 3 --seeds 0   # a big cohort
    python -m hfl.sim.protocol --mode broadcast --fanout 2 --seeds 0-199
    python -m hfl.sim.protocol --communicate-every 3 --seeds 0-199  # 30 rounds
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import heapq
import itertools
import logging
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hfl.algorithms.payload import Payload
from hfl.peer import instructions as do
from hfl.peer.config import SWIM_FROM, TimingConfig, uses_swim
from hfl.peer.core import PeerCore
from hfl.peer.procedures import ALONE, SHORT, RoundProcedures
from hfl.protocol import Message
from hfl.sim.model import (
    Checker,
    NetworkFaults,
    Violation,
    draw_network,
    install_twin_core,
    parse_seeds,
    parse_twins,
    sim_keys,
    twin_sends,
)

MODES = ("aggregator", "everywhere", "broadcast")


# =================================================================== scenario


@dataclass(frozen=True)
class ProtocolFault:
    """One scheduled fault at simulated time ``t``, lasting ``duration`` seconds
    (``lost``: for good; ``late``: the peer starts at ``t``)."""

    t: float
    kind: str  # lost, late, partition, oneway, slow
    peers: tuple[str, ...]
    duration: float = 0.0
    to: tuple[str, ...] = ()  # oneway: the receivers ``peers``' messages no longer reach
    factor: float = 1.0  # slow: how many times slower its compute is
    #: lost: at the first crash point of this phase from ``t`` on (None: at ``t``):
    #: train, wait, serve, commit (an aggregator that decided to commit, before the
    #: commit went out): fault.crash_phase's phases
    phase: str | None = None

    def __str__(self) -> str:
        who = ",".join(self.peers)
        at = f" at its next '{self.phase}' point" if self.phase else ""
        return {"lost": f"t={self.t:.1f}s {who}: lost for good{at}",
                "late": f"t={self.t:.1f}s {who}: starts late",
                "partition": f"t={self.t:.1f}s {who}: cut off from the rest for {self.duration:.1f}s",
                "oneway": f"t={self.t:.1f}s {who} -> {','.join(self.to)}: every message lost for "
                          f"{self.duration:.1f}s (the other way works)",
                "slow": f"t={self.t:.1f}s {who}: {self.factor:.0f}x slower for {self.duration:.1f}s",
                }[self.kind]


@dataclass
class ProtocolScenario:
    seed: int
    network: NetworkFaults
    faults: list[ProtocolFault]
    timing: TimingConfig
    skew: dict[str, tuple[float, float]]  # peer -> (offset, rate skew) of its clock
    calm_at: float  # faults and network noise have ended by then (inf: until the end)

    def describe(self) -> list[str]:
        n = self.network
        worst = max((abs(s) for _, s in self.skew.values()), default=0.0)
        calm = "never" if self.calm_at == float("inf") else f"t={self.calm_at:.1f}s"
        return ([f"network: drop {n.drop:.3f}, duplicate {n.duplicate:.3f}, reorder "
                 f"{n.reorder:.3f}, long delay {n.delay:.3f} (clean from {calm}); clock rates "
                 f"differ by up to {100 * worst:.2f}%"] + [str(f) for f in self.faults])


def plan(seed: int, peers: list[str], rounds: int, buggify: bool = False,
         train_s: float = 0.3, quorum: int | None = None) -> ProtocolScenario:
    """Draw a seed's faults. At most ``len(peers) - quorum`` members are lost for good
    (fewer could not make a result any more, whatever the protocol did); one seed in
    eight keeps faults and network noise until the end (no liveness bound is checked
    there, only safety)."""
    rng = random.Random(f"protocol-scenario:{seed}")
    n = len(peers)
    quorum = quorum or n // 2 + 1
    timing = dict(heartbeat_interval_s=0.5, suspect_after_s=2.0, dead_after_s=5.0,
                  round_timeout_s=10.0, aggregate_grace_s=2.0, join_timeout_s=30.0)
    timing, net = draw_network(rng, timing, buggify, train_s)
    scale = 2.5 if buggify else 1.0
    # A fault-free round takes about two compute steps and a heartbeat; faults begin in
    # the first 45% of the run, none lasts over a fifth of it, and those touching one
    # peer add up to at most a quarter (a peer cut off for most of the run cannot learn
    # in most rounds whatever the protocol does).
    length = rounds * (2 * train_s + timing["heartbeat_interval_s"])
    dead = timing["dead_after_s"]
    skew = {p: (rng.uniform(0, 1000), rng.uniform(-0.02, 0.02) * scale) for p in peers}
    faults: list[ProtocolFault] = []
    budget = {p: 0.25 * length for p in peers}
    lost_left = max(0, n - quorum)
    late_left = 1 if n >= 3 else 0
    for _attempt in range(200):
        if len(faults) >= (rng.randint(1, 3) if not buggify else rng.randint(2, 6)):
            break
        kind = rng.choice(["partition", "oneway", "oneway", "slow", "lost", "late"])
        t = round(rng.uniform(1.0, max(1.0, 0.45 * length)), 2)
        d = round(min(rng.uniform(0.5, 3) * dead, 0.2 * length), 2)
        if kind == "lost" and lost_left:
            lost_left -= 1
            faults.append(ProtocolFault(t, "lost", (rng.choice(peers),),
                                        phase=rng.choice([None, None, "wait", "serve", "commit"])))
        elif kind == "late" and late_left:
            late_left -= 1
            faults.append(ProtocolFault(round(rng.uniform(0.5, 0.3 * length), 2), "late",
                                        (rng.choice(peers[1:]),)))
        elif kind == "partition":
            side = tuple(sorted(rng.sample(peers, rng.randint(1, max(1, n // 2)))))
            if all(budget[p] >= d for p in peers):
                faults.append(ProtocolFault(t, "partition", side, d))
                for p in peers:
                    budget[p] -= d
        elif kind == "oneway":
            src = rng.choice(peers)
            to = tuple(sorted(rng.sample([p for p in peers if p != src],
                                         rng.randint(1, max(1, (n - 1) // 2)))))
            if budget[src] >= d:
                faults.append(ProtocolFault(t, "oneway", (src,), d, to=to))
                budget[src] -= d
        elif kind == "slow":
            p = rng.choice(peers)
            if budget[p] >= d:
                faults.append(ProtocolFault(t, "slow", (p,), d, factor=rng.choice([3.0, 10.0])))
                budget[p] -= d
    # Members lost for good, and late joiners, are not the same peer twice.
    seen: set[str] = set()
    faults = [f for f in faults if f.kind not in ("lost", "late") or not (
        f.peers[0] in seen or seen.add(f.peers[0]))]
    faults.sort(key=lambda f: (f.t, f.kind, f.peers))
    until_end = rng.random() < 0.125
    calm_at = float("inf") if until_end else max(
        (f.t + f.duration for f in faults if f.kind not in ("lost", "late")), default=1.0)
    return ProtocolScenario(seed, net, faults, TimingConfig(**timing), skew, calm_at)


# =================================================================== network


class Network:
    """Delivers messages between simulated peers on the heap, with the fault model."""

    def __init__(self, sim: ProtocolSim, seed: int, faults: NetworkFaults, calm_at: float):
        self.sim = sim
        self.rng = random.Random(f"protocol-net:{seed}")
        self.faults, self.calm_at = faults, calm_at
        self.cut: Counter[frozenset[str]] = Counter()  # links partitions cut
        self.oneway: Counter[tuple[str, str]] = Counter()  # (from, to) losing every message
        self.counts: Counter[str] = Counter()
        self.history = hashlib.sha256()
        self.delivered = 0
        #: ids of the messages twins forged (the version one peer gets): one counts for
        #: *named* once delivered (a forged copy lost on the way proves nothing: seed 725
        #: of --peers 5 --mode everywhere --byzantine p4:equivocate, a twin lost for good
        #: just after it equivocated, was to be named all the same)
        self.forged: dict[int, Message] = {}

    def send(self, src: str, dst: str | None, msg: Message) -> None:
        if dst is None or dst == src:
            return
        self.counts[f"sent:{msg.TYPE}"] += 1
        if frozenset((src, dst)) in self.cut or (src, dst) in self.oneway:
            self.counts["cut"] += 1
            return
        f, rng, now = self.faults, self.rng, self.sim.t
        noisy = now < self.calm_at
        if noisy and rng.random() < f.drop:
            self.counts["dropped"] += 1
            return
        copies = 2 if noisy and rng.random() < f.duplicate else 1
        for _ in range(copies):
            latency = rng.uniform(*f.latency_s)
            if noisy and rng.random() < f.reorder:
                latency += rng.uniform(0, f.reorder_s)
            if noisy and rng.random() < f.delay:
                latency += rng.uniform(0, f.delay_s)
            self.sim.at(now + latency, self.deliver, src, dst, msg)

    def deliver(self, src: str, dst: str, msg: Message) -> None:
        peer = self.sim.peers.get(dst)
        if peer is None or not peer.running:
            self.counts["undelivered"] += 1
            return
        self.delivered += 1
        self.history.update(f"{self.sim.t:.9f} {src} {dst} {msg.TYPE}\n".encode())
        if id(msg) in self.forged:  # (a twin's other version, delivered: *named*)
            self.sim.checker.forged(src, msg.round)
        peer.receive(src, msg)


# =================================================================== one peer


class SimPeer:
    """One peer: its core, its procedures and a generator for its whole life (join,
    rounds, the last round's linger, goodbye) whose instructions this class carries
    out on the simulator's heap, as :class:`hfl.peer.node.Node` does on a socket."""

    def __init__(self, sim: ProtocolSim, peer_id: str, mode: str, min_peers: int,
                 bootstrap: tuple[str, ...], keys: tuple | None = None,
                 twin: str | None = None) -> None:
        self.sim, self.id = sim, peer_id
        sc, timing = sim.scenario, sim.scenario.timing
        self.offset, self.skew = sc.skew[peer_id]
        self.incarnation = 0
        swim = sim.swim
        everywhere = mode == "everywhere"
        core = self.core = PeerCore(
            peer_id, mode="broadcast" if mode == "broadcast" else "aggregator",
            everywhere=everywhere, lookahead=timing.lookahead_rounds, cohort_size=min_peers,
            # (signed statements name the run, as hfl-launch's cohort.run makes them)
            cohort="sim#1", last_round=sim.rounds, communicate_every=sim.communicate_every,
            signer=keys[0] if keys else None,
            verify_keys=dict(keys[1]) if keys else None, swim=swim, timing=timing,
            rng=random.Random(f"{sc.seed}:{peer_id}"),
            bootstrap=tuple((b, address(b)) for b in bootstrap),
            hello_terms={"cohort": "sim", "algorithm": "mean", "num_classes": 2,
                         "rounds": sim.rounds, "shared": {
                             "everywhere": int(everywhere),
                             **({"fanout": sim.fanout} if sim.fanout is not None else {}),
                             **({"communicate_every": sim.communicate_every}
                                if sim.communicate_every != 1 else {})}})
        self.twin = twin  # a Byzantine twin's kind (hfl.sim.model.TWIN_KINDS), or None
        if twin is not None:
            install_twin_core(twin, core)
        core.open_view(address(peer_id), random.Random(f"{sc.seed}:{peer_id}:membership"))
        self.procedures = RoundProcedures(core, now=self.now, fanout=sim.fanout,
                                          plan_key=f"sim:{sc.seed}")
        self.min_peers = min_peers
        self.rng = random.Random(f"{sc.seed}:{peer_id}:compute")
        self.running = False
        self.outcome = "not started"
        self.slow, self.slow_until = 1.0, 0.0  # a slowdown's factor, and its end
        self.lost_at: str | None = None  # a phase: lost at its next crash point there
        self.started_at = self.ended_at = 0.0
        self.gen: Generator | None = None
        self.waiting: tuple[Callable[[], bool], int] | None = None
        self.tokens = itertools.count()
        self.tick_n = 0
        self.said: Counter[int] = Counter()  # log lines by level
        self.dropped: Counter[str] = Counter()

    # ---------------------------------------------------------------- clock

    def now(self) -> float:
        return self.offset + self.sim.t * (1 + self.skew)

    def at_local(self, local: float) -> float:
        """The simulated time at which this peer's clock reads ``local`` (rounded up until
        it does: a deadline's wake-up read a hair before the deadline, and a procedure
        that asks again when woken early asked at the same simulated time without end,
        120,000 heartbeats and 12 GB for one seed of a review's mutation)."""
        t = (local - self.offset) / (1 + self.skew)
        while self.offset + t * (1 + self.skew) < local:
            t = math.nextafter(t, math.inf)
        return t

    # ---------------------------------------------------------------- life

    def start(self) -> None:
        if self.sim.t > 0:
            self.sim.perturbed()  # a late joiner: the cohort's elections change
        self.sim.unstarted -= 1
        self.sim.running += 1
        self.running, self.outcome, self.started_at = True, "running", self.sim.t
        self.gen = self.life()
        self.sim.at(self.sim.t, self.tick)
        self.step(None)

    def lose(self) -> None:
        """Gone for good, mid-whatever: nothing more is sent or received."""
        self.sim.running -= self.running
        self.running, self.outcome, self.gen, self.waiting = False, "lost", None, None
        self.sim.perturbed()

    def life(self) -> Generator:
        core, procs, last = self.core, self.procedures, self.sim.rounds
        joined = yield from procs.join(stop_if_alone=True)
        if joined == ALONE:
            self.outcome = "alone"  # as hfl-peer with node.stop_if_alone
            return
        if joined == SHORT:  # as hfl-peer: "only k of n peers joined ...; starting anyway"
            self.said[logging.WARNING] += 1
        self.note("started", round=core.round)
        yield from procs.rounds(last)
        yield from procs.finish(last)
        self.outcome = "ok"

    def knowledge(self, r: int) -> Payload:
        """This peer's knowledge in round r: a vector fixed by (seed, peer, round)."""
        rng = np.random.default_rng([self.sim.scenario.seed, int(self.id[1:]), r])
        return Payload(kind="weights", tensors={"w": rng.standard_normal(4).astype(np.float32)})

    @staticmethod
    def aggregate(contributions: dict[str, Payload]) -> Payload | None:
        """The mean of the contributions, in the order of their senders."""
        if not contributions:
            return None
        w = np.mean([contributions[p].tensors["w"] for p in sorted(contributions)], axis=0)
        return Payload(kind="weights", tensors={"w": w.astype(np.float32)})

    def note(self, kind: str, **fields: Any) -> None:
        self.sim.checker.observe(kind, self, **fields)

    # ---------------------------------------------------------------- carrying out

    def step(self, value: Any) -> None:
        """Run the life generator until it waits (for a condition, a compute, time)."""
        while self.running and self.gen is not None:
            try:
                ins = self.gen.send(value)
            except StopIteration:
                self.sim.running -= 1
                self.gen, self.running, self.ended_at = None, False, self.sim.t
                return
            if isinstance(ins, do.Wait):
                if ins.done():
                    value = True
                    continue
                token = next(self.tokens)
                self.waiting = (ins.done, token)
                self.sim.at(max(self.sim.t, self.at_local(ins.deadline)), self.timeout, token)
                return
            if isinstance(ins, do.Compute) and ins.call != "local_update":
                # no time: the knowledge is drawn, absorbing and evaluating learn nothing
                value = self.knowledge(*ins.args) if ins.call == "share" else {}
                continue
            if isinstance(ins, do.Compute | do.Aggregate):  # training, aggregating: time
                cost = self.took(self.rng.uniform(0.5, 1.5) * (
                    self.sim.train_s if isinstance(ins, do.Compute) else 0.05 * self.sim.train_s))
                out = self.aggregate(ins.contributions) if isinstance(ins, do.Aggregate) else {}
                token = next(self.tokens)
                self.waiting = (None, token)
                self.sim.at(self.sim.t + cost, self.resume, token, out)
                return
            self.execute([ins])
            value = None

    def took(self, work: float) -> float:
        """The simulated seconds ``work`` seconds of compute take from now: at the slow
        rate only while a slowdown lasts (as in hfl-sim; fixed at the step's start, a
        step begun 10x slow ran seconds past the slowdown's end, and the other peer of
        a 2-peer cohort finished the run without it: every-peer buggify seeds 642,
        726, 772)."""
        slowed = max(0.0, self.slow_until - self.sim.t) if self.slow > 1 else 0.0
        if work * self.slow <= slowed:
            return work * self.slow
        return slowed + work - slowed / self.slow

    def resume(self, token: int, value: Any) -> None:
        if self.waiting is not None and self.waiting[1] == token:
            self.waiting = None
            self.step(value)

    def timeout(self, token: int) -> None:
        if self.waiting is not None and self.waiting[1] == token:
            done = self.waiting[0]
            self.waiting = None
            self.step(done())

    def recheck(self) -> None:
        """Something a wait may be waiting for changed (a Wake), or a tick passed."""
        if self.waiting is not None and self.waiting[0] is not None and self.waiting[0]():
            self.waiting = None
            self.step(True)

    def receive(self, src: str, msg: Message) -> None:
        self.execute(self.core.handle(src, msg, self.now()))

    def tick(self) -> None:
        if not self.running:
            return
        core, n = self.core, self.tick_n
        self.tick_n += 1
        self.execute(core.tick_greetings(n, self.now()))
        self.execute(core.tick_sends(n, self.now()))
        self.recheck()
        interval = self.sim.scenario.timing.heartbeat_interval_s / (1 + self.skew)
        self.sim.at(self.sim.t + interval, self.tick)

    def execute(self, instructions: list) -> None:
        net, mem = self.sim.net, self.core.membership
        wake = False
        for ins in instructions:
            if isinstance(ins, do.Send):
                dst = (ins.address if ins.to_member else ins.peer_id or peer_of(ins.address))
                net.send(self.id, dst, ins.msg)
            elif isinstance(ins, do.Broadcast):
                sends = [(ins.peer_ids, ins.msg)]
                if self.twin is not None:  # the same transform hfl-sim's twins apply
                    # (a live one: equivocating to a member lost for good, the twin could
                    # never be proven one, and the checker asked it be named all the same)
                    victim = min((p for p in mem.members if p != self.id and mem.is_live(p)),
                                 default=None)
                    sends = twin_sends(self.twin, self.core, victim, list(ins.peer_ids), ins.msg)
                    if len(sends) > 1:  # (the first: the forged version, to its victim)
                        net.forged[id(sends[0][1])] = sends[0][1]
                for peer_ids, msg in sends:
                    for p in peer_ids:
                        net.send(self.id, p, msg)
            elif isinstance(ins, do.Reply | do.SendTo):
                net.send(self.id, ins.peer_id, ins.msg)
            elif isinstance(ins, do.Wake):
                wake = True
            elif isinstance(ins, do.Dropped):
                self.dropped[ins.code] += 1
            elif isinstance(ins, do.Refused):
                self.dropped["refused"] += 1
            elif isinstance(ins, do.Say):
                self.said[ins.level] += 1
            elif isinstance(ins, do.MemberChanged):
                self.said[logging.INFO] += 1
            elif isinstance(ins, do.NamedEquivocator):
                self.note("equivocator", peer_named=ins.peer, round=ins.round)
            elif isinstance(ins, do.Note):
                self.note(ins.kind, **ins.fields)
            elif isinstance(ins, do.CrashPoint):
                if self.lost_at in ins.phases:
                    self.lose()
                    return
            elif isinstance(ins, do.EnterRound | do.Forget | do.ServeSeeds
                            | do.RoundBegins | do.RoundDone):
                pass  # no durable record, no links, no seed sets here
            else:
                raise TypeError(f"unknown instruction {ins!r}")
        if wake:
            self.recheck()


def address(peer_id: str) -> str:
    return f"sim://{peer_id}"


def peer_of(address_: str | None) -> str | None:
    return address_.split("://", 1)[-1] if address_ else None


# =================================================================== one run


@dataclass
class ProtocolResult:
    seed: int
    scenario: ProtocolScenario
    violations: list[Violation]
    outcomes: dict[str, str]
    digest: str  # the delivery history: bit-identical for a seed on every run
    end_t: float
    delivered: int
    rounds_without_result: list[int]
    wall_s: float
    counts: dict[str, int] = field(default_factory=dict)


def default_rounds(communicate_every: int) -> int:
    """A run's rounds when none are given: 10 exchanges (*learning* is judged on the
    exchanging rounds)."""
    return 10 * communicate_every


class ProtocolSim:
    """One seed: the peers, the heap, the network, the faults, the checker."""

    def __init__(self, seed: int, peers: int = 5, rounds: int | None = None, mode: str = "aggregator",
                 buggify: bool = False, swim: bool | None = None, train_s: float = 0.3,
                 scenario: ProtocolScenario | None = None, byzantine: list[str] = (),
                 join: str = "greet", signed: bool = False, bootstraps: int = 2,
                 absent: tuple[str, ...] = (), communicate_every: int = 1,
                 fanout: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r}; allowed: {', '.join(MODES)}")
        if peers < 2:
            raise ValueError(f"peers: {peers}; a cohort needs 2 at least")
        if communicate_every < 1:
            raise ValueError(f"communicate_every: {communicate_every}; 1 (every round) or more")
        if fanout is not None and (mode != "broadcast" or not 1 <= fanout < peers):
            raise ValueError(f"fanout: {fanout}; with --mode broadcast only, from 1 to "
                             f"{peers - 1} (the peers a round's knowledge goes to)")
        # cohort.communicate_every and cohort.fanout, as hfl-peer runs them
        self.communicate_every, self.fanout = communicate_every, fanout
        names = [f"p{i}" for i in range(peers)]
        twins = parse_twins(list(byzantine), names)  # ValueError naming the part
        rounds = default_rounds(communicate_every) if rounds is None else rounds
        self.rounds, self.train_s, self.mode = rounds, train_s, mode
        self.swim = uses_swim("auto", peers) if swim is None else swim
        # Signed (twins): f = 1 where commits are certified, and a larger quorum
        # (PeerCore.quorum): the planner loses at most n - quorum members for good, and
        # one fewer per twin (an equivocator, once proven, is left out by everyone: with
        # 4 peers, a twin and a member lost for good left 2 honest contributors of a
        # quorum of 3, and 20 of 200 seeds "broke" liveness no protocol could keep).
        signed = signed or bool(twins)  # (signing keys for every peer: f = 1, as hfl-peer)
        f = 1 if signed and mode == "aggregator" else 0
        # (PeerCore.quorum of the whole cohort; broadcast: no quorum)
        self.quorum = None if mode == "broadcast" else (peers + f) // 2 + 1
        self.scenario = scenario or plan(seed, names, rounds, buggify, train_s,
                                         quorum=(peers + f) // 2 + 1 + len(twins))
        if join != self.scenario.timing.join:  # timing.join: lazy (PROTOCOL.md, Lazy join)
            self.scenario = dataclasses.replace(
                self.scenario, timing=dataclasses.replace(self.scenario.timing, join=join))
        self.t = 0.0
        # when the last fault ended: the scenario's, or later, when a member was lost at a
        # crash point or joined late (perturbed)
        self.calm_at = self.scenario.calm_at
        self._heap: list = []
        self._seq = itertools.count()
        self.net = Network(self, seed, self.scenario.network, self.scenario.calm_at)
        timing = self.scenario.timing
        bound = 2 * (timing.round_timeout_s + timing.aggregate_grace_s) + 2 * timing.dead_after_s
        self.checker = Checker(mode="broadcast" if mode == "broadcast" else "aggregator",
                               everywhere=mode == "everywhere", bound_s=bound, twins=twins,
                               heard_again_s=timing.heartbeat_interval_s, clock=lambda: self.t,
                               rounds=rounds)
        late = {f.peers[0]: f.t for f in self.scenario.faults if f.kind == "late"}
        min_peers = peers - len(late) - len(absent)  # (absent: never started, as a peer down)
        bootstrap = tuple(n for n in names if n not in late)[:bootstraps]
        keys = sim_keys(seed, names) if signed else {}  # signed: the defenses need keys
        self.peers = {n: SimPeer(self, n, mode, min_peers, bootstrap, keys.get(n), twins.get(n))
                      for n in names}
        # peers not started yet, running now
        self.unstarted, self.running = len(names) - len(absent), 0
        for n in names:
            if n in absent:
                self.peers[n].outcome = "lost"  # (lost from the start: the checks skip it)
            else:
                self.at(late.get(n, 0.0), self.peers[n].start)
        for f in self.scenario.faults:
            self.at(f.t, self.fault_begins, f)

    def perturbed(self) -> None:
        """A member was lost or joined now: liveness is owed only from here on."""
        self.calm_at = max(self.calm_at, self.t)

    def at(self, t: float, fn: Callable, *args: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn, args))

    def fault_begins(self, f: ProtocolFault) -> None:
        net = self.net
        if f.kind == "lost" and f.phase is None:
            self.peers[f.peers[0]].lose()
        elif f.kind == "lost":
            self.peers[f.peers[0]].lost_at = f.phase  # at its next crash point of that phase
        elif f.kind == "partition":
            rest = [p for p in self.peers if p not in f.peers]
            links = {frozenset((a, b)) for a in f.peers for b in rest}
            net.cut.update(links)
            self.at(self.t + f.duration, self._heal_cut, links)
        elif f.kind == "oneway":
            links = {(f.peers[0], b) for b in f.to}
            net.oneway.update(links)
            self.at(self.t + f.duration, self._heal_oneway, links)
        elif f.kind == "slow":
            peer = self.peers[f.peers[0]]  # (overlapping slowdowns: the later end, the last factor)
            peer.slow, peer.slow_until = f.factor, max(peer.slow_until, self.t + f.duration)
            self.at(self.t + f.duration, self._slow_ends, peer)

    def _slow_ends(self, peer: SimPeer) -> None:
        if peer.slow_until <= self.t:  # (not while a later slowdown lasts)
            peer.slow = 1.0

    def _heal_cut(self, links) -> None:
        self.net.cut.subtract(links)
        self.net.cut = +self.net.cut

    def _heal_oneway(self, links) -> None:
        self.net.oneway.subtract(links)
        self.net.oneway = +self.net.oneway

    def run(self, limit_s: float | None = None) -> ProtocolResult:
        wall = time.perf_counter()
        timing = self.scenario.timing
        limit = limit_s or (self.rounds * 3 * (timing.round_timeout_s + timing.aggregate_grace_s)
                            + timing.join_timeout_s + 60)
        heap = self._heap
        thresholds = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLDS)
        try:
            while heap:
                t, _, fn, args = heapq.heappop(heap)
                if t > limit:
                    break
                self.t = t
                fn(*args)
                if not self.unstarted and not self.running:
                    break
        finally:
            gc.set_threshold(*thresholds)
        outcomes = {n: ("stuck" if p.outcome == "running" else p.outcome)
                    for n, p in self.peers.items()}
        return ProtocolResult(
            seed=self.scenario.seed, scenario=self.scenario,
            violations=self.check(outcomes), outcomes=outcomes,
            digest=self.net.history.hexdigest()[:16], end_t=self.t, delivered=self.net.delivered,
            rounds_without_result=self.checker.rounds_without_result(self.rounds),
            wall_s=time.perf_counter() - wall, counts=dict(self.net.counts))

    def check(self, outcomes: dict[str, str]) -> list[Violation]:
        """The Checker's protocol invariants, then *exit* (every peer not lost ends its
        run: none stuck, none alone but a late joiner whose cohort finished within
        ``join_timeout_s`` of its start) and *learning* (each peer that ended, and
        started with the others, learned from others in most of its exchanging rounds;
        not checked where faults last to the end)."""
        c = self.checker
        calm = self.calm_at
        c.check_protocol({p: o for p, o in outcomes.items() if o != "lost"},
                         calm if calm != float("inf") else c.events[-1]["t"] + 1 if c.events else 0,
                         left_at={n: p.ended_at for n, p in self.peers.items()},
                         quorum=self.quorum)
        ended = [p.ended_at for p in self.peers.values() if p.outcome == "ok"]
        for p, o in sorted(outcomes.items()):
            if o == "alone" and self.peers[p].started_at > 0 and all(
                    t < self.peers[p].started_at + self.scenario.timing.join_timeout_s
                    for t in ended):
                continue  # a late joiner the cohort finished without (its join was cut off)
            if o not in ("ok", "lost"):
                c.fail("exit", f"{p}: {o} at simulated t={self.t:.1f}s")
        if calm == float("inf"):
            return c.violations
        rounds: dict[str, list[dict]] = {}
        for e in c.events:  # (local steps too: where each exchanging round began)
            if e["event"] == "round":
                rounds.setdefault(e["peer"], []).append(e)
        # (from when every peer it touches runs: a late joiner's slowdown before its
        # start disturbed nothing, and excused six rounds that learned, seed 67 signed)
        windows = [(max(f.t, *(self.peers[q].started_at for q in (*f.peers, *f.to))),
                    f.t + f.duration) for f in self.scenario.faults
                   if f.kind in ("partition", "oneway", "slow")]
        # (a round's length without faults, twice: the planner's estimate, plan())
        span = 2 * (2 * self.train_s + self.scenario.timing.heartbeat_interval_s)
        for p, o in sorted(outcomes.items()):
            # (A late joiner's rounds are what was left of the run: liveness holds it.)
            if o == "ok" and p not in c.twins and self.peers[p].started_at == 0:
                c.check_learning(p, undisturbed(rounds.get(p, []), windows, span))
        return c.violations


def undisturbed(rounds: list[dict], windows: list[tuple[float, float]],
                span: float) -> list[dict]:
    """The rounds of a peer (its "round" events, in order) that *learning* counts: those
    no cut, one-way loss or slowdown (``windows``: their begin and end times) overlapped
    while a round of ``span`` seconds would run (from its start, up to its end). A
    round's own faults can keep it from learning whatever the protocol does, and the
    planner's fault budget (a quarter of the run's length, estimated at two compute
    steps and a heartbeat a round) can be half of a run whose rounds are faster: with 2
    peers in broadcast mode and --buggify, a peer cut off for 1.4 s of a 4 s run ran 5
    of its 10 rounds alone (seed 150). (By the actual span, a round that learned nothing
    was excused far more often than one that learned, having waited out its timeout:
    a protocol that drops every other round's knowledge failed *learning* in 11 of 300
    seeds of 2 peers in broadcast mode, against 138 this way and 266 over all rounds.)
    Only exchanging rounds are returned; a round begins where the one before it ended,
    local step or not (``cohort.communicate_every``: before, an exchange was judged by
    the faults at the local steps before it)."""
    out, begun = [], 0.0
    for e in rounds:
        end = min(e["t"], begun + span)
        if e["learned_from"] is not None and not any(lo < end and begun < hi
                                                     for lo, hi in windows):
            out.append(e)
        begun = e["t"]
    return out


#: The cyclic collector's thresholds while a run goes (restored after). A 1,000-peer
#: cohort holds millions of objects (a million members' records in the cores' views),
#: and with the defaults (700, 10, 10) the collector walked them 4,587 times in one
#: 25 s run, 5.1 s in all; with these, 31 times, 0.6 s. A run makes few cycles (the
#: same peak memory, 709 MB, with the collector off).
GC_THRESHOLDS = (100_000, 50, 50)


def run_seed(seed: int, **kw: Any) -> ProtocolResult:
    return ProtocolSim(seed, **kw).run()


# =================================================================== command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hfl.sim.protocol", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0-99", help="e.g. 0-999 or 3,17,42 (default 0-99)")
    ap.add_argument("--peers", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=None,
                    help="default 10 exchanges: 10 x --communicate-every")
    ap.add_argument("--mode", choices=MODES, default="aggregator",
                    help="an elected aggregator (default), every peer aggregating, or broadcast")
    ap.add_argument("--buggify", action="store_true", help="short timeouts, denser faults")
    ap.add_argument("--swim", choices=["auto", "on", "off"], default="auto",
                    help=f"SWIM failure detection (auto: from {SWIM_FROM} peers)")
    ap.add_argument("--byzantine", action="append", default=[], metavar="PEER:KIND",
                    help="a Byzantine twin under PEER's identity: equivocate (other knowledge "
                         "to one peer; with --mode everywhere) or commit (another result and a "
                         "forged commit to one peer) or override (ignores the promises when "
                         "elected at a later epoch) or selfreport (reports a made-up result "
                         "it signed itself in each contribution) or hide (shows its result to "
                         "one peer only, never commits it)")
    ap.add_argument("--join", choices=["greet", "lazy"], default="greet",
                    help="timing.join: greet (every member greets every other) or lazy "
                         "(members vouched for by others; with SWIM and --mode aggregator)")
    ap.add_argument("--signed", action="store_true",
                    help="signing keys for every peer: certified commits, f = 1 (as hfl-peer "
                         "with keys in the allow-list)")
    ap.add_argument("--bootstraps", type=int, default=2,
                    help="how many peers every peer bootstraps from (default 2; hfl-launch: 1)")
    ap.add_argument("--communicate-every", type=int, default=1, metavar="K",
                    help="cohort.communicate_every: exchange every K-th round, local steps "
                         "between (default 1)")
    ap.add_argument("--fanout", type=int, default=None, metavar="K",
                    help="cohort.fanout (--mode broadcast): each round's knowledge to the K "
                         "peers a seeded rotation names")
    ap.add_argument("-v", "--verbose", action="store_true", help="each seed's faults")
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as err:
        ap.error(f"--seeds: {err}")
    swim = None if args.swim == "auto" else args.swim == "on"
    failed, t0 = [], time.perf_counter()
    for seed in seeds:
        try:
            res = run_seed(seed, peers=args.peers, rounds=args.rounds, mode=args.mode,
                           buggify=args.buggify, swim=swim, byzantine=args.byzantine,
                           join=args.join, signed=args.signed, bootstraps=args.bootstraps,
                           communicate_every=args.communicate_every, fanout=args.fanout)
        except ValueError as err:
            ap.error(str(err))
        if args.verbose or res.violations:
            print(f"seed {seed}: {len(res.violations)} violation(s), simulated {res.end_t:.1f}s, "
                  f"{res.delivered} messages, {res.wall_s:.2f}s, history {res.digest}")
            for line in res.scenario.describe():
                print(f"    {line}")
            for v in res.violations:
                print(f"    VIOLATION {v}")
        if res.violations:
            failed.append(seed)
    wall = time.perf_counter() - t0
    n = len(seeds)
    print(f"{n} seed(s), {args.peers} peers, {args.rounds or default_rounds(args.communicate_every)} rounds, {args.mode}"
          f"{f', fan-out {args.fanout}' if args.fanout else ''}"
          f"{f', exchanging every {args.communicate_every}' if args.communicate_every > 1 else ''}"
          f"{' (buggify)' if args.buggify else ''}: {len(failed)} violating "
          f"({', '.join(map(str, failed[:20]))}{' ...' if len(failed) > 20 else ''}); "
          f"{wall:.1f}s, {60 * n / wall:.0f} seeds/min")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
