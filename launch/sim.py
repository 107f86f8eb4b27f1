"""``hfl-sim``: deterministic simulation of a real cohort under seeded faults.

The peers are the real thing: each is what ``hfl-peer`` runs
(:func:`hfl.peer.runner.run_peer`: Node, membership, election, round engine,
algorithm, checkpoints and metrics files on disk). What the simulator owns is
everything around them:

- **time**: one :class:`~hfl.launch.simloop.VirtualLoop`; nobody sleeps, the
  clock jumps to the next timer;
- **scheduling**: training, aggregation and checkpoints run inline on that loop
  (``run_blocking``) and then cost ``compute_s`` of virtual time (times a slow
  peer's factor), instead of running in a worker thread;
- **the network**: :class:`~hfl.launch.simnet.SimNetwork` (latency, loss,
  duplicates, reordering, long delays, partitions that heal);
- **processes**: a crash is SIGKILL (no goodbye, nothing written), a restart
  is a new ``run_peer`` on the same run directory (it resumes from its
  checkpoint, with a new incarnation); a pause is SIGSTOP/SIGCONT.

All of it comes from one seed, so a seed's history (every delivered message's
time, ends and bytes, and every aggregate absorbed) is the same bit for bit on
every run, and a failing seed is replayed with the one command it prints.

After each run the history is checked against the invariants of
:class:`Checker` (docs/simulation.md states them and the liveness bound).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import inspect
import json
import logging
import random
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfl.launch.simloop import SimulationStalled, VirtualLoop, current_peer, run_as
from hfl.launch.simnet import NetworkFaults, SimNetwork, SimTransport

log = logging.getLogger("hfl.sim")

DEFAULT_EXPERIMENT = Path(__file__).resolve().parent.parent / "examples" / "quickstart.yaml"


# =================================================================== scenario


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: at virtual time ``t``, for ``duration`` seconds."""

    t: float
    # crash (SIGKILL, then restart), leave (SIGTERM: the peer says goodbye; then
    # restart), pause, partition, slow, rolling (a rolling restart: see below)
    kind: str
    peers: tuple[str, ...]
    duration: float
    factor: float = 1.0  # slow: how many times slower its compute is
    # rolling: "term" or "kill". Each of ``peers`` in turn is stopped with that signal
    # and restarted ``duration`` later; the next is stopped once the last has recorded
    # a round in its new life (as an operator upgrading a cohort would).
    signal: str = "term"

    def __str__(self) -> str:
        what = {"crash": "SIGKILL, restart after", "pause": "SIGSTOP for",
                "leave": "SIGTERM (goodbye), restart after",
                "partition": "cut off from the rest for",
                "rolling": f"rolling restart with SIG{self.signal.upper()}, each restarted after",
                "slow": f"{self.factor:.0f}x slower for"}[self.kind]
        return f"t={self.t:.1f}s {','.join(self.peers)}: {what} {self.duration:.1f}s"


@dataclass
class Scenario:
    """What one seed does: the network's fault rates, the process faults, the timing."""

    seed: int
    network: NetworkFaults
    faults: list[Fault]
    timing: dict[str, float]
    calm_at: float  # the last fault has healed by then; the network is clean from there on

    def describe(self) -> list[str]:
        n = self.network
        return ([f"network: drop {n.drop:.3f}, duplicate {n.duplicate:.3f}, reorder "
                 f"{n.reorder:.3f}, long delay {n.delay:.3f} (clean from t={self.calm_at:.1f}s)"]
                + [str(f) for f in self.faults])


def draw_network(rng: random.Random, timing: dict[str, float], buggify: bool,
                 compute_s: float) -> tuple[dict[str, float], NetworkFaults]:
    """A seed's timing (``buggify``: shrunk timeouts) and network fault rates, drawn
    from ``rng`` in this order (both simulators: hfl.sim.protocol too)."""
    timing = dict(timing)
    if buggify:  # the round timeout stays above one round's compute (4 steps)
        hb = rng.choice([0.1, 0.2, 0.3])
        timing.update(heartbeat_interval_s=hb, suspect_after_s=hb * rng.uniform(2.5, 4),
                      dead_after_s=hb * rng.uniform(5, 9),
                      round_timeout_s=rng.uniform(max(1.5, 4 * compute_s), 6),
                      aggregate_grace_s=rng.uniform(0, 1.5))
    scale = 2.5 if buggify else 1.0
    return timing, NetworkFaults(
        drop=rng.choice([0.0, 0.0, 0.01, 0.03, 0.08]) * scale,
        duplicate=rng.choice([0.0, 0.02, 0.05]) * scale,
        reorder=rng.choice([0.0, 0.05, 0.1]) * scale,
        delay=rng.choice([0.0, 0.0, 0.01, 0.03]) * scale,
        delay_s=rng.uniform(0.5, 2.0) * timing["dead_after_s"],
    )


def plan_scenario(seed: int, peers: list[str], rounds: int, timing: dict[str, float],
                  buggify: bool = False, compute_s: float = 0.5) -> Scenario:
    """Draw a seed's faults. Faults start while rounds are running and all have healed
    by ``calm_at``. ``buggify`` shrinks the timeouts and makes faults denser and longer."""
    rng = random.Random(f"scenario:{seed}")
    timing, net = draw_network(rng, timing, buggify, compute_s)
    # A fault-free run lasts about `length` (four compute steps a round); faults begin
    # in its first 60% and none lasts over a quarter of it, and the faults touching one
    # peer add up to at most 30% of it: a peer cut off for most of the run cannot learn
    # in most rounds whatever the protocol does ("learning" would be void).
    length = rounds * (4 * compute_s + 0.1)
    n_faults = rng.randint(1, 3) if not buggify else rng.randint(2, 6)
    faults = []
    dead = timing["dead_after_s"]

    def duration(lo: float, hi: float) -> float:
        return round(min(rng.uniform(lo, hi) * dead, 0.25 * length), 2)

    budget = {p: 0.3 * length for p in peers}
    for _attempt in range(200):  # (a short run's budget may fit fewer faults)
        if len(faults) == n_faults:
            break
        kind = rng.choice(["crash", "crash", "pause", "partition", "slow", "leave"])
        t = round(rng.uniform(1.0, max(1.0, 0.6 * length)), 2)
        if kind == "partition":
            k = rng.randint(1, max(1, len(peers) // 2))
            side = tuple(sorted(rng.sample(peers, k)))
            faults.append(Fault(t, kind, side, duration(0.5, 3)))
        elif kind == "slow":
            faults.append(Fault(t, kind, (rng.choice(peers),), duration(1, 4),
                                factor=rng.choice([3.0, 10.0, 30.0])))
        else:  # crash, leave: down for that long, then restarted from its checkpoint
            faults.append(Fault(t, kind, (rng.choice(peers),), duration(0.2, 3)))
        f = faults[-1]
        hit = peers if f.kind == "partition" else f.peers  # a partition costs both sides
        if any(budget[p] < f.duration for p in hit):
            faults.pop()  # over that peer's budget: draw another
            continue
        for p in hit:
            budget[p] -= f.duration
    # One seed in eight also restarts the whole cohort, one peer after another (SIGTERM
    # or SIGKILL), as an operator upgrading it would: its end depends on the peers.
    if rng.random() < 0.125:
        faults.append(Fault(round(rng.uniform(1.0, 0.3 * length), 2), "rolling",
                            tuple(rng.sample(peers, len(peers))), round(rng.uniform(0.1, 2.0), 2),
                            signal=rng.choice(["term", "kill"])))
    faults.sort(key=lambda f: (f.t, f.kind, f.peers))
    calm_at = max((f.t + f.duration for f in faults), default=1.0)
    return Scenario(seed, net, faults, timing, calm_at)


FAULT_SYNTAX = "KIND:PEERS@T+SECONDS, e.g. leave:p2@6.3+0.5 or rolling-term:all@4+0.3"
FAULT_KINDS = ("crash", "leave", "pause", "partition", "slow", "rolling-term", "rolling-kill")


def parse_fault(text: str, peers: list[str]) -> Fault:
    """A fault given on the command line (``--fault``): ``KIND:PEERS@T+SECONDS``, where
    PEERS is ``p1,p3`` or ``all``; ``slow`` takes ``xFACTOR`` after the seconds."""
    try:
        kind, rest = text.split(":", 1)
        who, when = rest.split("@", 1)
        t, _, duration = when.partition("+")
        duration, _, factor = duration.partition("x")
        chosen = tuple(peers) if who == "all" else tuple(who.split(","))
        fault = Fault(float(t), kind.split("-")[0], chosen, float(duration),
                      factor=float(factor or 10.0),
                      signal=kind.split("-")[1] if kind.startswith("rolling-") else "term")
    except ValueError:
        raise ValueError(f"{text!r}: expected {FAULT_SYNTAX}") from None
    if kind not in FAULT_KINDS:
        raise ValueError(f"{text!r}: kind {kind!r}; allowed: {', '.join(FAULT_KINDS)}")
    unknown = sorted(set(chosen) - set(peers))
    if unknown:
        raise ValueError(f"{text!r}: no peer {', '.join(unknown)}; the cohort is "
                         f"{', '.join(peers)}")
    if fault.t < 0 or fault.duration < 0:
        raise ValueError(f"{text!r}: times must be 0 or more")
    return fault


# =================================================================== invariants


@dataclass
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


@dataclass
class Checker:
    """The invariants, checked on what the peers did (observer events, metrics files).

    1. *agreement*: no two peers absorb different results for the same round
       (with an elected aggregator; peers that aggregate for themselves may hold
       different contributions, and each may only use a quorum of them);
    2. *quorum*: no result is published or absorbed below the quorum;
    3. *justified*: no result is taken from an epoch the receiver could not
       justify: every candidate of the epochs it skipped was dead in its view;
    4. *liveness*: after the last fault healed, every running peer learns from
       others within ``bound_s`` (or finishes);
    5. *learning*: every peer that exits 0 learned from others in most rounds;
    6. *metrics*: no metrics row is lost or doubled across restarts (every
       checkpointed round has exactly one row, and no other row is left);
    7. *resume*: a restarted peer resumes the round after its last checkpoint,
       with the model of that checkpoint;
    8. *exit*: every peer ends its run normally (no crash of the runtime itself,
       no "cohort gone"), within the simulated time limit;
    9. *named*: with a Byzantine twin that equivocates (``--byzantine``), every honest
       peer that ran to its end names it. Twins are left out of 1, 4 and 5: what they
       absorb or learn is not the honest peers' guarantee.
    """

    mode: str
    everywhere: bool
    bound_s: float
    #: Byzantine twins (peer -> kind): left out of the honest peers' invariants, and
    #: an equivocating one must be named by every honest peer (9. *named*)
    twins: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    models: dict[tuple[str, int], str] = field(default_factory=dict)  # (peer, round) -> digest
    recovery_s: float = 0.0  # the slowest peer's first learning after the last fault healed
    #: the simulated time of an event (None: the running event loop's; the
    #: protocol-level simulator, hfl.sim.protocol, has no event loop)
    clock: Callable[[], float] | None = None

    def observe(self, event: str, node, **fields: Any) -> None:
        if event in ("member", "dropped", "crash"):
            return  # notes no invariant reads: kept out of the history (tests pin its digests)
        now = self.clock() if self.clock is not None else asyncio.get_running_loop().time()
        rec = {"t": now, "event": event, "peer": node.id, "incarnation": node.incarnation, **fields}
        if event in ("checkpointed", "started") and hasattr(node, "alg"):  # (a Node: a model)
            rec["model"] = model_digest(node)
        if event == "checkpointed":
            self.models[(node.id, fields["round"])] = rec["model"]
        self.events.append(rec)
        self._check_step(rec)

    def fail(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(invariant, detail))

    # ---------------------------------------------------------- per step (cheap)

    def _check_step(self, e: dict[str, Any]) -> None:
        if e["event"] in ("published", "absorbed") and e.get("contributors") is not None:
            if e["contributors"] < e["quorum"]:
                self.fail("quorum", f"{e['peer']} {e['event']} round {e['round']} with "
                          f"{e['contributors']} contributor(s); its quorum is {e['quorum']}")
        if e["event"] == "took":
            bad = [(c, s) for c, s in e["passed"] if s != "dead"]
            if e["epoch"] < e["own_epoch"] or bad:
                self.fail("justified", f"{e['peer']} took round {e['round']} epoch {e['epoch']} at "
                          f"its epoch {e['own_epoch']}; skipped candidates not dead: {bad}")

    # ---------------------------------------------------------- after the run

    def check(self, run_dirs: dict[str, Path], outcomes: dict[str, str], calm_at: float,
              end_t: float) -> list[Violation]:
        self._agreement()
        self._resume()
        self._liveness({p: o for p, o in outcomes.items() if p not in self.twins}, calm_at)
        self._named(outcomes)
        for peer, run_dir in sorted(run_dirs.items()):
            rows = _read_rows(run_dir / "metrics.jsonl")
            self._metrics(peer, rows)
            if peer in self.twins:
                continue
            if outcomes.get(peer) == "ok":
                self.check_learning(peer, rows)
            else:
                self.fail("exit", f"{peer}: {outcomes.get(peer)} (simulated t={end_t:.1f}s)")
        return self.violations

    def check_protocol(self, outcomes: dict[str, str], calm_at: float) -> list[Violation]:
        """The invariants of the protocol alone: *agreement*, *liveness* and *named*
        (*quorum* and *justified* are checked as events come); the protocol-level
        simulator has no files, restarts or exit codes."""
        self._agreement()
        self._liveness({p: o for p, o in outcomes.items() if p not in self.twins}, calm_at)
        self._named(outcomes)
        return self.violations

    def round_times(self) -> list[float]:
        """Virtual seconds of each peer's rounds, from the end of its round before in
        the same life (a first round after a start includes the join)."""
        last: dict[tuple[str, int], float] = {}
        out = []
        for e in self.events:
            if e["event"] != "round":
                continue
            key = (e["peer"], e["incarnation"])
            if key in last:
                out.append(e["t"] - last[key])
            last[key] = e["t"]
        return out

    def rounds_without_result(self, rounds: int) -> list[int]:
        """Rounds of 1..rounds that no peer absorbed a result for (aggregator mode with
        an elected aggregator; else nothing is counted)."""
        if self.mode != "aggregator" or self.everywhere:
            return []
        took = {e["round"] for e in self.events if e["event"] in ("absorbed", "committed")}
        # cohort.communicate_every's local steps: rounds whose every record learned from nobody
        # by design (learned_from None; 0 is an exchange that got nothing)
        ran = [e for e in self.events if e["event"] == "round"]
        local = {e["round"] for e in ran} - {e["round"] for e in ran if e["learned_from"] is not None}
        return [r for r in range(1, rounds + 1) if r not in took and r not in local]

    def _agreement(self) -> None:
        if self.mode != "aggregator" or self.everywhere:
            return
        by_round: dict[int, dict[str, list[str]]] = {}
        for e in self.events:
            # What an aggregator committed counts as well as what peers absorbed (it may be
            # killed between its commit and its own absorb); the same value published
            # again at a later epoch agrees.
            if e["peer"] in self.twins:
                continue  # a twin's own view is not the honest peers' guarantee
            if e["event"] == "committed":
                who = f"{e['peer']} (committed, epoch {e['epoch']})"
                by_round.setdefault(e["round"], {}).setdefault(e["digest"], []).append(who)
            if e["event"] == "absorbed":
                who = f"{e['peer']} (from {e['source']}, epoch {e['epoch']})"
                by_round.setdefault(e["round"], {}).setdefault(e["digest"], []).append(who)
        for r, seen in sorted(by_round.items()):
            if len(seen) > 1:
                self.fail("agreement", f"round {r}: " + "; ".join(
                    f"{', '.join(sorted(set(p)))} took {d}" for d, p in sorted(seen.items())))

    def _named(self, outcomes: dict[str, str]) -> None:
        liars = {p for p, kind in self.twins.items() if kind == "equivocate"}
        if not liars or not self.everywhere:
            return
        for peer in sorted(p for p, o in outcomes.items() if o == "ok" and p not in self.twins):
            named = {e["peer_named"] for e in self.events
                     if e["event"] == "equivocator" and e["peer"] == peer}
            if not liars <= named:
                self.fail("named", f"{peer} never named {', '.join(sorted(liars - named))}, which "
                          "sent peers different signed contributions")

    def _resume(self) -> None:
        last_ckpt: dict[str, int] = {}
        for e in self.events:
            if e["event"] == "checkpointed":
                last_ckpt[e["peer"]] = max(last_ckpt.get(e["peer"], 0), e["round"])
            elif e["event"] == "started" and e["incarnation"] > 0:
                c = last_ckpt.get(e["peer"], 0)
                if e["round"] != c + 1:
                    self.fail("resume", f"{e['peer']} incarnation {e['incarnation']} started at "
                              f"round {e['round']}; its last checkpoint was round {c}")
                elif c > 0 and e["model"] != self.models.get((e["peer"], c)):
                    self.fail("resume", f"{e['peer']} incarnation {e['incarnation']} resumed round "
                              f"{e['round']} with another model than its round-{c} checkpoint")

    def _liveness(self, outcomes: dict[str, str], calm_at: float) -> None:
        deadline = calm_at + self.bound_s
        self.recovery_s = 0.0
        rounds = [e for e in self.events if e["event"] == "round"]
        finished_at = {e["peer"]: e["t"] for e in rounds}  # last round's time per peer
        for peer in sorted(outcomes):
            if outcomes[peer] != "ok" or finished_at.get(peer, 0) <= calm_at:
                continue  # failed (reported as exit) or had finished before the calm
            after = [e for e in rounds if e["peer"] == peer and e["t"] > calm_at]
            learned = [e["t"] for e in after if (e["learned_from"] or 0) > 0]
            if not learned and len(after) == 1 and after[0]["t"] <= deadline:
                continue  # finished: its one round after the calm began during the fault
            if learned:
                self.recovery_s = max(self.recovery_s, learned[0] - calm_at)
            if not learned or learned[0] > deadline:
                when = f"only at t={learned[0]:.1f}s" if learned else "never"
                self.fail("liveness", f"{peer} learned from others {when} after the last fault "
                          f"healed at t={calm_at:.1f}s (bound {self.bound_s:.1f}s)")

    def check_learning(self, peer: str, rows: list[dict[str, Any]]) -> None:
        """*learning*: ``peer`` learned from others in most of its exchanging rounds
        (``rows``: its metrics lines, or its "round" events)."""
        if self.mode == "local" or not rows:
            return
        rows = [r for r in rows if "learned_from" in r]  # not cohort.communicate_every's local steps
        learned = sum(1 for r in rows if (r.get("learned_from") or 0) > 0)
        if rows and learned * 2 <= len(rows):
            self.fail("learning", f"{peer} learned from others in {learned} of its {len(rows)} "
                      "recorded rounds")

    def _metrics(self, peer: str, rows: list[dict[str, Any]]) -> None:
        rounds = [int(r["round"]) for r in rows]
        doubled = sorted({r for r in rounds if rounds.count(r) > 1})
        if doubled:
            self.fail("metrics", f"{peer}: rounds {doubled} recorded twice")
        ckpt = {e["round"] for e in self.events if e["event"] == "checkpointed" and e["peer"] == peer}
        lost = sorted(ckpt - set(rounds))
        if lost:
            self.fail("metrics", f"{peer}: rounds {lost} were checkpointed but have no metrics row")
        extra = sorted(set(rounds) - ckpt)
        if extra:
            self.fail("metrics", f"{peer}: rows for rounds {extra} that no checkpoint holds")


def model_digest(node) -> str:
    h = hashlib.sha256()
    for name, t in sorted(node.alg.model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# =================================================================== one run


@dataclass
class SimOptions:
    experiment: str = str(DEFAULT_EXPERIMENT)
    overrides: list[str] = field(default_factory=list)
    peers: int = 5
    rounds: int = 10
    buggify: bool = False
    compute_s: float = 0.5  # virtual seconds a training call costs
    keep: Path | None = None  # keep run directories here (default: only a failing seed's)
    #: process faults given by hand (``--fault``, :func:`parse_fault`): they replace the
    #: seed's drawn ones (the seed still draws the network's rates)
    faults: list[str] = field(default_factory=list)
    #: Byzantine twins (``--byzantine PEER:KIND``, :data:`TWIN_KINDS`): members running
    #: modified code. Any twin gives every peer signing keys (a signed cohort).
    byzantine: list[str] = field(default_factory=list)


#: What a Byzantine twin does (issue 35):
#: - ``equivocate``: from round 2 on, sends one other peer a zero version of its
#:   contribution, signed, and the others its real one (every peer aggregating);
#: - ``commit``: whenever elected, shows one peer a zero-model result, signed acks
#:   it cannot get being replaced by its own and that peer's, and commits it to it.
TWIN_KINDS = ("equivocate", "commit")


def parse_twins(texts: list[str], peers: list[str]) -> dict[str, str]:
    """``PEER:KIND`` specs -> peer -> kind; ValueError naming the part and the choices."""
    twins = {}
    for text in texts:
        peer, _, kind = text.partition(":")
        if peer not in peers:
            raise ValueError(f"{text!r}: peer {peer!r} is not one of {', '.join(peers)}")
        if kind not in TWIN_KINDS:
            raise ValueError(f"{text!r}: kind {kind!r} is not one of {', '.join(TWIN_KINDS)}")
        twins[peer] = kind
    if len(twins) >= len(peers) / 2:
        raise ValueError(f"{len(twins)} twin(s) among {len(peers)} peers: the honest ones must "
                         "be a majority")
    return twins


def sim_keys(seed: int, peers: list[str]):
    """Deterministic Ed25519 keys per peer: peer -> (sign, verification keys)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    keys = {p: Ed25519PrivateKey.from_private_bytes(
        hashlib.sha256(f"hfl-sim:{seed}:{p}".encode()).digest()) for p in peers}
    verify = {p: k.public_key().public_bytes_raw() for p, k in keys.items()}
    return {p: (k.sign, verify) for p, k in keys.items()}


def twin_sends(kind: str, core, victim: str | None, peer_ids: list[str], msg) -> list[tuple]:
    """What a Byzantine twin of ``kind`` sends instead of ``msg`` to ``peer_ids``:
    ``[(peer ids, message), ...]`` in order. From round 2 on, ``equivocate`` sends the
    victim other knowledge (zeros, correctly signed) than the rest; ``commit`` sends it
    another result and a commit it can only forge (its own ack for a certificate).
    Both simulators use it (hfl.sim.protocol too)."""
    import dataclasses as dc

    import numpy as np

    from hfl.peer.core import payload_digest
    from hfl.protocol import AggregateResult, Commit, Knowledge

    target = victim or next((p for p in sorted(peer_ids) if p != core.id), None)
    # (Only knowledge and results are forged: everything else, gossip included, goes as
    # the runtime sends it. The first version read msg.round first, which gossip has
    # not: the twin's gossip failed in every tick it went to the victim.)
    if not ((kind == "equivocate" and isinstance(msg, Knowledge) and msg.tensors)
            or (kind == "commit" and isinstance(msg, AggregateResult) and msg.tensors)):
        return [(peer_ids, msg)]
    if not (target in peer_ids and msg.round >= 2):
        return [(peer_ids, msg)]
    bad = dc.replace(msg, tensors={k: np.zeros_like(v) for k, v in msg.tensors.items()})
    digest = payload_digest(bad)
    if isinstance(bad, Knowledge):
        bad = dc.replace(bad, sig=core.sign("knowledge", bad.round, bad.epoch, digest))
    out = [([target], bad)]
    if isinstance(bad, AggregateResult):  # a commit it can only forge
        cert = {core.id: core.sign_ack(bad.round, bad.epoch, digest)}
        out.append(([target], Commit(**core.envelope(), round=bad.round, epoch=bad.epoch,
                                     digest=digest, certificate=cert)))
    return [*out, ([p for p in peer_ids if p != target], msg)]


def install_twin(node, kind: str) -> None:
    """Make ``node`` a Byzantine twin of ``kind`` (its code is otherwise the runtime's)."""
    broadcast = node._broadcast
    victim = sorted(p for p in node.membership.members if p != node.id)[0] if node.membership else None

    async def twin(peer_ids, msg, timeout_s=None):
        sent = 0
        for ids, m in twin_sends(kind, node.core, victim, list(peer_ids), msg):
            sent = await broadcast(ids, m, timeout_s)
        return sent

    node._broadcast = twin


@dataclass
class SimResult:
    seed: int
    violations: list[Violation]
    history: str  # digest of the whole history: same seed, same code -> same digest
    peer_rounds: int
    simulated_s: float
    wall_s: float
    delivered: int
    scenario: Scenario
    run_dir: Path | None  # kept for a failing seed
    outcomes: dict[str, str]
    counts: dict[str, int]
    recovery_s: float  # slowest first learning after the calm (the liveness bound's margin)
    bound_s: float
    #: Each peer's rounds after its first in one life (virtual seconds from the end of
    #: the round before): what a fault cost, as the worst minus the median.
    round_s: list[float] = field(default_factory=list)
    #: Rounds no peer absorbed an aggregator's result for (aggregator mode only).
    rounds_without_result: list[int] = field(default_factory=list)

    def worst_over_median_s(self) -> float:
        if not self.round_s:
            return 0.0
        ordered = sorted(self.round_s)
        return ordered[-1] - ordered[len(ordered) // 2]


def _configs(opts: SimOptions, root: Path):
    from hfl.launch.experiment import expand, load_experiment
    from hfl.launch.inprocess import in_memory

    sets = [f"peers={opts.peers}", f"run_dir={root}", f"defaults.cohort.rounds={opts.rounds}",
            "defaults.security.mode=none", "defaults.node.threads=1", "defaults.node.device=cpu",
            # The commit protocol is what the simulator explores: an elected aggregator,
            # although cohort.aggregate_at auto has every peer aggregate in small cohorts
            # (override with defaults.cohort.aggregate_at=every_peer).
            "defaults.cohort.aggregate_at=aggregator",
            *opts.overrides]
    exp = load_experiment(opts.experiment, sets)
    plans = expand(exp, gpus=[], ports=list(range(1, opts.peers + 1)))
    return exp, in_memory(plans)


def run_seed(seed: int, opts: SimOptions, scenario: Scenario | None = None) -> SimResult:
    """Run one seed in a fresh virtual loop; never raises for what the peers do.
    ``scenario`` replaces the seed's drawn faults (a regression pinned as found)."""
    import numpy as np
    import torch

    from hfl.algorithms.base import Algorithm
    from hfl.algorithms.registry import get_algorithm
    from hfl.peer.config import PeerConfig
    from hfl.peer.configtools import ConfigError, build, to_dict
    from hfl.peer.runner import run_peer

    wall0 = time.perf_counter()
    # Autograd's switch is thread-global: an earlier run or test interrupted inside a
    # torch.no_grad() block's __enter__ leaves it off (every peer then fails to train).
    torch.set_grad_enabled(True)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    root = Path(tempfile.mkdtemp(prefix=f"hfl-sim-{seed}-"))
    exp, plans = _configs(opts, root)
    ids = [p.id for p in plans]
    base_timing = to_dict(plans[0].config.timing)
    sc = scenario or plan_scenario(seed, ids, opts.rounds, base_timing, opts.buggify,
                                   opts.compute_s)
    if opts.faults and scenario is None:
        try:
            given = sorted((parse_fault(text, ids) for text in opts.faults),
                           key=lambda f: (f.t, f.kind, f.peers))
        except ValueError as err:
            shutil.rmtree(root, ignore_errors=True)
            raise ConfigError("--fault", str(err)) from None
        sc = Scenario(seed, sc.network, given, sc.timing,
                      max((f.t + f.duration for f in given), default=1.0))
    cfgs = {}
    for p in plans:
        data = to_dict(p.config)
        data["timing"] = {**data["timing"], **sc.timing}
        cfgs[p.id] = build(PeerConfig, data)
    timing = cfgs[ids[0]].timing
    alg_cls = get_algorithm(cfgs[ids[0]].cohort.algorithm)
    mode = alg_cls.mode
    # The liveness bound: see docs/simulation.md.
    bound = (2 * (timing.round_timeout_s + timing.aggregate_grace_s) + timing.dead_after_s
             + 4 * timing.heartbeat_interval_s + 8 * opts.compute_s)
    try:
        twins = parse_twins(opts.byzantine, ids)
    except ValueError as err:
        shutil.rmtree(root, ignore_errors=True)
        raise ConfigError("--byzantine", str(err)) from None
    keys = sim_keys(seed, ids) if twins else {}
    checker = Checker(mode=mode, everywhere=False, bound_s=bound, twins=twins)
    net = SimNetwork(seed, sc.network)
    transports: dict[str, SimTransport] = {}
    slow: dict[str, list[float]] = {}  # the factors of a peer's slowdowns under way
    tasks: dict[str, asyncio.Task] = {}
    outcomes: dict[str, str] = {}
    loop = VirtualLoop()

    def make_transport(cfg: PeerConfig) -> SimTransport:
        t = SimTransport(cfg.node.id, cfg.node.listen, net)
        transports[cfg.node.id] = t
        return t

    async def run_blocking(fn, *args):
        # The step's work takes compute_s at full speed; a slow peer's steps progress
        # at 1/factor of it while its slowdown lasts (in tenths, so a slowdown that
        # ends mid-step ends for that step too). Then it runs, inline.
        peer = current_peer()
        # not file writes (the node wraps a method's call to time its CPU: look inside)
        is_training = isinstance(getattr(inspect.unwrap(fn), "__self__", None), Algorithm)
        left = opts.compute_s if is_training else 0.0
        while left > 1e-12:
            piece = min(left, opts.compute_s / 10)
            await asyncio.sleep(piece * max(slow.get(peer) or [1.0]))
            left -= piece
        return fn(*args)

    last_round_at: dict[str, float] = {}  # peer -> virtual time it last recorded a round

    def observer(event: str, node, **fields: Any) -> None:
        if event == "started" and node.everywhere:
            checker.everywhere = True
        if event == "started" and node.id in twins:
            install_twin(node, twins[node.id])
        if event == "round":
            last_round_at[node.id] = loop.time()
        checker.observe(event, node, **fields)

    def start(peer: str) -> None:
        coro = run_peer(cfgs[peer], transport=make_transport, clock=_LoopClock(),
                        run_blocking=run_blocking, observer=observer, signing=keys.get(peer))
        tasks[peer] = run_as(peer, coro, name=peer)
        outcomes.pop(peer, None)

    async def finish(peer: str, task: asyncio.Task) -> None:
        try:
            await task
            outcomes[peer] = "ok"
        except asyncio.CancelledError:
            if tasks.get(peer) is task and peer not in outcomes:
                outcomes[peer] = "killed"
        except ConfigError as exc:  # the experiment, not the protocol: hfl-sim says so
            bad_config.append(exc)
            outcomes[peer] = f"config: {exc}"
        except Exception as exc:  # noqa: BLE001 - the outcome is the finding
            outcomes[peer] = f"failed: {type(exc).__name__}: {exc}"

    def stop(peer: str, how: str) -> bool:
        """SIGKILL (``kill``: no goodbye, nothing written) or SIGTERM (``term``: the
        runtime's own shutdown, goodbye included, as ``hfl-peer``'s signal handler runs
        it). False if the peer was not running."""
        if peer in down or tasks[peer].done():
            return False
        down.add(peer)
        loop.thaw(peer)  # a stopped process gets either signal once it runs again
        if how == "kill":
            transports[peer].kill()
        tasks[peer].cancel()
        return True

    async def restart(peer: str) -> None:
        down.discard(peer)
        if not tasks[peer].done():  # what cancellation runs (a goodbye) must end first
            await asyncio.wait([tasks[peer]])
        start(peer)
        followers.append(asyncio.ensure_future(finish(peer, tasks[peer])))

    async def roll(f: Fault) -> None:
        """A rolling restart: each peer in turn is stopped and restarted ``f.duration``
        later; the next goes once the last has recorded a round in its new life (or
        ended: a peer restarted after the cohort's last round has nothing to run)."""
        for peer in f.peers:
            if not stop(peer, f.signal):
                continue
            await asyncio.sleep(f.duration)
            await restart(peer)
            since = loop.time()
            while not tasks[peer].done() and last_round_at.get(peer, -1.0) <= since:
                await asyncio.sleep(timing.heartbeat_interval_s)

    async def conduct() -> None:
        events: list[tuple[float, int, str, Fault]] = []
        for i, f in enumerate(sc.faults):
            events.append((f.t, i, "begin", f))
            if f.kind != "rolling":  # its end depends on the peers
                events.append((f.t + f.duration, i, "end", f))
        events.sort(key=lambda e: (e[0], e[1], e[2]))
        cuts: dict[int, set] = {}
        rolls: list[asyncio.Task] = []
        for t, i, phase, f in events:
            await asyncio.sleep(max(0.0, t - loop.time()))
            if f.kind == "rolling":
                rolls.append(asyncio.ensure_future(roll(f)))
                continue
            for peer in f.peers:
                if f.kind in ("crash", "leave") and phase == "begin":
                    stop(peer, "kill" if f.kind == "crash" else "term")
                elif f.kind in ("crash", "leave") and peer in down:  # its restart
                    await restart(peer)
                elif f.kind == "pause" and phase == "begin":
                    loop.freeze(peer, t + f.duration)
                elif f.kind == "slow" and phase == "begin":
                    slow.setdefault(peer, []).append(f.factor)
                elif f.kind == "slow":
                    slow[peer].remove(f.factor)
            if f.kind == "partition":
                if phase == "begin":
                    cuts[i] = net.partition(list(f.peers), [p for p in ids if p not in f.peers])
                else:
                    net.heal(cuts.pop(i))
        for r in rolls:
            await r  # a failure of the schedule itself is loud
        calm[0] = max(sc.calm_at, loop.time())
        await asyncio.sleep(max(0.0, calm[0] - loop.time()))
        net.faults = NetworkFaults(latency_s=sc.network.latency_s)  # calm from here on

    followers: list[asyncio.Future] = []
    bad_config: list[ConfigError] = []
    down: set[str] = set()  # stopped, to be restarted
    calm = [sc.calm_at]  # a rolling restart's end is known only once it has played out
    rolling = sum(len(f.peers) * (f.duration + timing.round_timeout_s + timing.aggregate_grace_s)
                  for f in sc.faults if f.kind == "rolling")
    limit = (sc.calm_at + rolling + bound + opts.rounds * (timing.round_timeout_s + timing.aggregate_grace_s)
             + timing.join_timeout_s)

    async def main() -> None:
        for peer in ids:
            start(peer)
            followers.append(asyncio.ensure_future(finish(peer, tasks[peer])))
        conductor = asyncio.ensure_future(conduct())
        try:
            async with asyncio.timeout(limit):
                # Every peer may be down at once with restarts still to come: the run
                # ends when the fault schedule has played out and every peer has ended.
                await asyncio.wait([conductor])
                conductor.result()  # a failure of the fault schedule itself is loud
                while any(not f.done() for f in followers):
                    await asyncio.gather(*followers)
        except TimeoutError:
            for peer, task in tasks.items():
                if not task.done():
                    outcomes[peer] = f"still running at the simulated time limit ({limit:.0f}s)"
                    task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        finally:
            conductor.cancel()
            await asyncio.gather(conductor, return_exceptions=True)

    hfl_log = logging.getLogger("hfl")
    old_level, old_propagate = hfl_log.level, hfl_log.propagate
    handler = logging.FileHandler(root / "sim.log")
    handler.setFormatter(_VirtualFormatter(loop))
    hfl_log.addHandler(handler)
    hfl_log.setLevel(logging.INFO)
    hfl_log.propagate = False
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main())
    except SimulationStalled as exc:
        checker.fail("exit", f"the simulation stalled: {exc}")
    finally:
        end_t = loop.time()
        _close(loop)
        asyncio.set_event_loop(None)
        hfl_log.removeHandler(handler)
        handler.close()
        hfl_log.setLevel(old_level)
        hfl_log.propagate = old_propagate
    if bad_config:
        shutil.rmtree(root, ignore_errors=True)
        raise bad_config[0]
    violations = checker.check({p: Path(cfgs[p].run_dir) for p in ids}, outcomes, calm[0], end_t)
    h = hashlib.sha256(net.digest().encode())
    for e in checker.events:
        h.update(json.dumps(e, sort_keys=True, default=str).encode())
    kept = None
    if violations or opts.keep is not None:
        kept = (opts.keep or Path(tempfile.gettempdir())) / f"hfl-sim-seed{seed}"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(root, kept)
        (kept / "events.json").write_text(json.dumps(checker.events, default=str, indent=0))
    shutil.rmtree(root, ignore_errors=True)
    return SimResult(
        seed=seed, violations=violations, history=h.hexdigest()[:16],
        peer_rounds=sum(1 for e in checker.events if e["event"] == "round"),
        simulated_s=end_t, wall_s=time.perf_counter() - wall0, delivered=net.delivered,
        scenario=sc, run_dir=kept, outcomes=outcomes, counts=dict(net.counts),
        recovery_s=checker.recovery_s, bound_s=bound, round_s=checker.round_times(),
        rounds_without_result=checker.rounds_without_result(opts.rounds))


class _LoopClock:
    """The node's clock: the running loop's (virtual) time."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()


class _VirtualFormatter(logging.Formatter):
    def __init__(self, loop: VirtualLoop):
        super().__init__("%(vt)10.3f %(levelname)-7s %(message)s")
        self.loop = loop

    def format(self, record: logging.LogRecord) -> str:
        record.vt = self.loop.time()
        return super().format(record)


def _close(loop: VirtualLoop) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        try:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        except SimulationStalled:
            pass
    loop.close()


# =================================================================== CLI


def parse_seeds(text: str) -> range | list[int]:
    """``7``, ``0-99`` or ``1,5,9``."""
    try:
        if "-" in text:
            a, b = text.split("-", 1)
            return range(int(a), int(b) + 1)
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds: got {text!r}; allowed: N, A-B or N,M,...") from None


def _replay_command(argv: list[str], seed: int) -> str:
    out, skip = ["hfl-sim"], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--seeds", "--seed", "--minutes", "--keep"):
            skip = True
            continue
        if a.startswith(("--seeds=", "--seed=", "--minutes=", "--keep=")) or a == "--quiet":
            continue
        out.append(a)
    return shlex.join([*out, "--seed", str(seed)])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        prog="hfl-sim", description="Run real peers under seeded faults on virtual time and "
                                    "check the protocol's invariants (docs/simulation.md).")
    ap.add_argument("experiment", nargs="?", default=str(DEFAULT_EXPERIMENT),
                    help="an hfl-launch experiment file (default: examples/quickstart.yaml)")
    ap.add_argument("--seeds", type=parse_seeds, default=range(0, 20), help="N, A-B or N,M,... "
                    "(default 0-19)")
    ap.add_argument("--seed", type=int, help="one seed (what a failing seed's replay line uses)")
    ap.add_argument("--peers", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--buggify", action="store_true",
                    help="shrunk timeouts, denser and longer faults")
    ap.add_argument("--minutes", type=float, help="soak: stop after this many minutes")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="experiment override, as hfl-launch --set")
    ap.add_argument("--keep", type=Path, help="keep every seed's run directories here")
    ap.add_argument("--fault", action="append", default=[], metavar="KIND:PEERS@T+SECONDS",
                    help="a process fault by hand, replacing the seed's drawn ones (repeatable): "
                         f"{FAULT_SYNTAX}; kinds: {', '.join(FAULT_KINDS)}")
    ap.add_argument("--byzantine", action="append", default=[], metavar="PEER:KIND",
                    help="a Byzantine twin: that member runs modified code (repeatable; fewer "
                         f"than half the peers): kinds {', '.join(TWIN_KINDS)}; the cohort is "
                         "then signed (PROTOCOL.md, Certified commits, Equivocation)")
    ap.add_argument("--quiet", action="store_true", help="only violations and the summary")
    args = ap.parse_args(argv)
    if args.peers < 2:
        ap.error(f"--peers: got {args.peers}; a cohort needs 2 or more")
    if args.rounds < 1:
        ap.error(f"--rounds: got {args.rounds}; 1 or more")
    from hfl.peer.configtools import ConfigError

    opts = SimOptions(experiment=args.experiment, overrides=args.set, peers=args.peers,
                      rounds=args.rounds, buggify=args.buggify, keep=args.keep,
                      faults=args.fault, byzantine=args.byzantine)
    seeds = [args.seed] if args.seed is not None else args.seeds
    t0 = time.perf_counter()
    ran = peer_rounds = 0
    failing: list[SimResult] = []
    crashed: list[int] = []  # seeds on which the simulator itself raised
    worst: SimResult | None = None  # the slowest recovery relative to its bound
    stall: SimResult | None = None  # the worst round over its seed's median round
    try:
        for seed in seeds:
            if args.minutes is not None and time.perf_counter() - t0 > args.minutes * 60:
                break
            try:
                res = run_seed(seed, opts)
            except ConfigError:
                raise  # a bad experiment: one line, below
            except Exception:  # noqa: BLE001 - the simulator's own bug: report it, go on
                ran += 1
                crashed.append(seed)
                print(f"seed {seed}: the simulator itself failed:\n{traceback.format_exc()}"
                      f"  replay: {_replay_command(argv, seed)}", flush=True)
                continue
            ran += 1
            peer_rounds += res.peer_rounds
            if worst is None or res.recovery_s / res.bound_s > worst.recovery_s / worst.bound_s:
                worst = res
            if stall is None or res.worst_over_median_s() > stall.worst_over_median_s():
                stall = res
            if res.violations:
                failing.append(res)
                print(f"seed {seed}: {len(res.violations)} violation(s), history {res.history}",
                      flush=True)
                for line in res.scenario.describe():
                    print(f"  fault   {line}")
                for v in res.violations:
                    print(f"  VIOLATED {v}")
                print("  network: " + ", ".join(f"{n} {what}" for what, n in sorted(res.counts.items())))
                print(f"  run dirs kept in {res.run_dir}")
                print(f"  replay: {_replay_command(argv, seed)}", flush=True)
            elif not args.quiet:
                print(f"seed {seed}: ok, {res.peer_rounds} peer-rounds, {res.simulated_s:.1f} s "
                      f"simulated in {res.wall_s:.2f} s, {res.delivered} messages, history "
                      f"{res.history}", flush=True)
    except ConfigError as err:
        print(f"hfl-sim: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    wall = time.perf_counter() - t0
    print(f"{ran} seed(s) in {wall:.1f} s: {peer_rounds / max(wall, 1e-9):.1f} simulated "
          f"peer-rounds per wall second; {len(failing)} violating seed(s)"
          + (f": {', '.join(str(r.seed) for r in failing)}" if failing else "")
          + (f"; the simulator failed on {', '.join(map(str, crashed))}" if crashed else ""))
    if worst is not None:
        print(f"slowest recovery after the last fault: {worst.recovery_s:.1f} s of a "
              f"{worst.bound_s:.1f} s bound (seed {worst.seed})")
    if stall is not None:
        print(f"worst round over its seed's median round: {stall.worst_over_median_s():.1f} s "
              f"(seed {stall.seed}"
              + (f"; rounds with no result: {stall.rounds_without_result}"
                 if stall.rounds_without_result else "") + ")")
    return 1 if failing or crashed else 0


if __name__ == "__main__":
    sys.exit(main())
