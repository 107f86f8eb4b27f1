"""What both simulator levels share: the fault model and the invariants.

The scenario a seed draws (:func:`draw_network`, :func:`plan_scenario`: process
faults, the network's loss, duplication, reordering and delays as
:class:`NetworkFaults`), the Byzantine twins (:func:`twin_sends`) and the
invariant :class:`Checker`. The system-level simulator (``hfl-sim``,
:mod:`hfl.launch.sim`: whole peers, files and restarts on one virtual asyncio
loop) and the protocol-level one (:mod:`hfl.sim.protocol`: N cores on a
discrete-event heap) both take them from here, so a seed means the same faults
at both levels. Nothing here imports asyncio, zmq or torch (a test checks it for
the protocol simulator).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class NetworkFaults:
    """Per-message probabilities and latencies (seconds of virtual time)."""

    latency_s: tuple[float, float] = (0.001, 0.02)
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0  # held back by up to reorder_s, so later messages overtake it
    reorder_s: float = 0.5
    delay: float = 0.0  # a long delay (a congested link), up to delay_s
    delay_s: float = 3.0


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
                "wipe": "SIGKILL, its run folder lost, restart after",
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
FAULT_KINDS = ("crash", "leave", "wipe", "pause", "partition", "slow", "rolling-term",
               "rolling-kill")


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
       justify: every candidate of the epochs it skipped was dead in its view
       (one its aggregator committed is the round's one value at any epoch);
    4. *liveness*: after the last fault healed, every running peer learns from
       others within ``bound_s`` (or finishes; or, given when each peer left, every
       other peer had left before it could hear this one again, ``heard_again_s``
       after the heal, or too many for the quorum a result needs: the protocol-level
       simulator);
    5. *learning*: every peer that exits 0 learned from others in most rounds;
    6. *metrics*: no metrics row is lost or doubled across restarts (every
       checkpointed round has exactly one row, and no other row is left);
    7. *resume*: a restarted peer resumes the round after its last checkpoint,
       with the model of that checkpoint;
    8. *exit*: every peer ends its run normally (no crash of the runtime itself,
       no "cohort gone"), within the simulated time limit;
    9. *named*: with a Byzantine twin that equivocates (``--byzantine``), every honest
       peer that ran to its end names it, once the twin's other knowledge of a round
       with two rounds after it reached its victim (the proof travels in the next
       round's reports and spreads in the one after; :meth:`forged`). Twins are left
       out of 1, 4 and 5: what they absorb or learn is not the honest peers' guarantee.
    """

    mode: str
    everywhere: bool
    bound_s: float
    #: how soon the others hear a peer back from a fault (a heartbeat interval): one
    #: that left before the last fault healed plus this never met it again
    heard_again_s: float = 0.0
    #: Byzantine twins (peer -> kind): left out of the honest peers' invariants, and
    #: an equivocating one must be named by every honest peer (9. *named*)
    twins: dict[str, str] = field(default_factory=dict)
    #: the run's last round (*named*: an equivocation in one of the last two rounds
    #: cannot be proven to everyone; 0: any equivocation must be)
    rounds: int = 0
    #: twin -> the first round whose forged knowledge reached its victim (:meth:`forged`)
    equivocated: dict[str, int] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: (round, digest) of every result an aggregator committed so far
    committed: set[tuple[int, str]] = field(default_factory=set)
    violations: list[Violation] = field(default_factory=list)
    models: dict[tuple[str, int], str] = field(default_factory=dict)  # (peer, round) -> digest
    recovery_s: float = 0.0  # the slowest peer's first learning after the last fault healed
    #: the simulated time of an event (None: the running event loop's; the
    #: protocol-level simulator, hfl.sim.protocol, has no event loop)
    clock: Callable[[], float] | None = None

    def observe(self, event: str, node, **fields: Any) -> None:
        if event == "failed":  # a handler, a tick or a task of the runtime raised: a bug
            # (caught by the peer, so that no message stops it: before, a lazy join's
            # every hfl-sim seed had one, unseen)
            self.fail("exit", f"{node.id}: {fields['where']} raised {fields['error']}")
            return
        if event in ("member", "dropped", "crash", "slow_tick", "join_short", "sent"):
            return  # notes no invariant reads: kept out of the history (tests pin its digests)
        if self.clock is not None:
            now = self.clock()
        else:  # hfl-sim: the virtual event loop's time (asyncio is loaded there already)
            import asyncio

            now = asyncio.get_running_loop().time()
        rec = {"t": now, "event": event, "peer": node.id, "incarnation": node.incarnation, **fields}
        if event in ("checkpointed", "started") and hasattr(node, "alg"):  # (a Node: a model)
            rec["model"] = model_digest(node)
        if event == "checkpointed":
            self.models[(node.id, fields["round"])] = rec["model"]
        self.events.append(rec)
        self._check_step(rec)

    def forged(self, twin: str, round: int) -> None:
        """``twin``'s other knowledge of ``round`` reached the peer it forged it for
        (hfl-sim: was sent to it); kept out of the history, only *named* reads it."""
        self.equivocated.setdefault(twin, round)

    def fail(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(invariant, detail))

    # ---------------------------------------------------------- per step (cheap)

    def _check_step(self, e: dict[str, Any]) -> None:
        if e["event"] in ("published", "absorbed") and e.get("contributors") is not None:
            if e["contributors"] < e["quorum"]:
                self.fail("quorum", f"{e['peer']} {e['event']} round {e['round']} with "
                          f"{e['contributors']} contributor(s); its quorum is {e['quorum']}")
        if e["event"] == "committed":
            self.committed.add((e["round"], e["digest"]))
        if e["event"] == "took" and (e["round"], e.get("committed")) not in self.committed:
            # (a result its aggregator committed is the round's one value, taken at
            # whatever epoch: one relayed, or one accepted before a fail-over and
            # committed after it; *agreement* checks its value)
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
            # (a peer whose run folder was lost, hfl-sim's wipe fault: its earlier
            # life's rows first, kept aside)
            lost = sorted(run_dir.parent.glob(f"{run_dir.name}.lost*"),
                          key=lambda d: int(d.name.rsplit(".lost", 1)[1] or 0))
            rows = [*(r for d in lost for r in _read_rows(d / "metrics.jsonl")),
                    *_read_rows(run_dir / "metrics.jsonl")]
            self._metrics(peer, rows)
            if peer in self.twins:
                continue
            if outcomes.get(peer) == "ok":
                self.check_learning(peer, rows)
            else:
                self.fail("exit", f"{peer}: {outcomes.get(peer)} (simulated t={end_t:.1f}s)")
        return self.violations

    def check_protocol(self, outcomes: dict[str, str], calm_at: float,
                       left_at: dict[str, float] | None = None,
                       quorum: int | None = None) -> list[Violation]:
        """The invariants of the protocol alone: *agreement*, *liveness* and *named*
        (*quorum* and *justified* are checked as events come); the protocol-level
        simulator has no files, restarts or exit codes. ``quorum``: the contributors a
        result needs (None: broadcast, one other peer is enough to learn from)."""
        self._agreement()
        self._liveness({p: o for p, o in outcomes.items() if p not in self.twins}, calm_at,
                       left_at, quorum)
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
        # (Before, a twin lost for good before round 2, equivocating only in the last
        # round, or whose forged copy was lost, was to be named all the same: twin seeds
        # 496, 617, 725, 897.)
        liars = {p for p, kind in self.twins.items() if kind == "equivocate"
                 and p in self.equivocated
                 and (not self.rounds or self.equivocated[p] + 2 <= self.rounds)}
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

    def _liveness(self, outcomes: dict[str, str], calm_at: float,
                  left_at: dict[str, float] | None = None, quorum: int | None = None) -> None:
        deadline = calm_at + self.bound_s
        self.recovery_s = 0.0
        rounds = [e for e in self.events if e["event"] == "round"]
        finished_at = {e["peer"]: e["t"] for e in rounds}  # last round's time per peer
        for peer in sorted(outcomes):
            if outcomes[peer] != "ok" or finished_at.get(peer, 0) <= calm_at:
                continue  # failed (reported as exit) or had finished before the calm
            # (exchanging rounds: cohort.communicate_every's local steps learn from no one)
            after = [e for e in rounds if e["peer"] == peer and e["t"] > calm_at
                     and ("learned_from" not in e or e["learned_from"] is not None)]
            learned = [e["t"] for e in after if (e["learned_from"] or 0) > 0]
            if not learned and len(after) == 1 and after[0]["t"] <= deadline:
                continue  # finished: its one exchange after the calm began during the fault
            if not learned and left_at is not None and 1 + sum(
                    1 for q in outcomes if q != peer and outcomes[q] == "ok"
                    and left_at.get(q, 0.0) > calm_at + self.heard_again_s) < max(2, quorum or 0):
                # Nobody to learn from, or too few for a result: the others left before it
                # could meet them again (4 peers, exchanging every 3 rounds, seed 825: a
                # 2|2 cut healed as one side finished; the other two, a quorum of 3
                # out of reach, were to learn all the same).
                continue
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


#: What a Byzantine twin does (issue 35):
#: - ``equivocate``: from round 2 on, sends one other peer a zero version of its
#:   contribution, signed, and the others its real one (every peer aggregating);
#: - ``commit``: whenever elected, shows one peer a zero-model result, signed acks
#:   it cannot get being replaced by its own and that peer's, and commits it to it;
#: - ``override``: whenever elected at a later epoch (a fail-over), ignores the
#:   promises it got (each reporting the result its sender accepted at an earlier
#:   epoch) and publishes its own aggregate, correctly signed: the honest members ack
#:   it and it commits it with a real certificate (a review's cross-epoch attack);
#: - ``selfreport``: every contribution it makes reports, as the result it accepted
#:   (whatever it did accept), an "epoch-0 result" of the round that it signed itself,
#:   naming itself its aggregator, with that signature as the report's proof (a
#:   review, 2026-11-29: the aggregator, holding no copy of it, abstained);
#: - ``hide``: whenever elected, from round 2 on, shows its result to one peer only
#:   and never commits it (that peer's report of it, proven by the twin's signature,
#:   is a value the next epoch's aggregator had no copy of: an attack review).
TWIN_KINDS = ("equivocate", "commit", "override", "selfreport", "hide")


def install_twin_core(kind: str, core) -> None:
    """What a twin of ``kind`` changes in its own core (both simulators call it):
    ``override`` makes :meth:`PeerCore.proposal` always answer "publish your own",
    whatever the promises report, and publishes it unchecked; the other kinds change only what is sent
    (:func:`twin_sends`)."""
    if kind == "override":
        core.proposal = lambda r, promised: ("own", None, {})
        # (and publishes it: the honest aggregator's check of its own result, which
        # would abstain instead, is not in a twin's code)
        core.unjustified_result = lambda msg: None
    if kind == "selfreport":
        core.knowledge = _self_reporting(core, core.knowledge)


def _self_reporting(core, knowledge):
    """``knowledge`` of a ``selfreport`` twin: its report is a made-up epoch-0 result
    of the round, "proven" by its own signature as that result's aggregator."""
    import dataclasses as dc

    from hfl.peer.core import payload_digest

    def forged(r: int, payload, epoch: int = 0):
        msg = knowledge(r, payload, epoch)
        if core.signer is None:
            return msg
        made_up = hashlib.sha256(f"made up by {core.id} for round {r}".encode()).hexdigest()
        msg = dc.replace(msg, accepted_epoch=0, accepted_digest=made_up,
                         promise_sig=core.promise_sig(r, epoch, 0, made_up),
                         proofs={f"0:{made_up}": {"by": core.id,
                                                  "sig": core.sign("result", r, 0, made_up)}})
        return dc.replace(msg, sig=core.sign("knowledge", r, epoch, payload_digest(msg)))

    return forged


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
    if kind == "hide" and isinstance(msg, (AggregateResult, Commit)) and msg.round >= 2:
        if isinstance(msg, Commit) or not msg.tensors:
            return []  # (never committed; nor an abstention sent)
        return [([target], msg)] if target in peer_ids else []
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
    elif bad.sig:  # (signed as its aggregator signs a result: rev. 15)
        bad = dc.replace(bad, sig=core.sign("result", bad.round, bad.epoch, digest))
    out = [([target], bad)]
    if isinstance(bad, AggregateResult):  # a commit it can only forge
        cert = {core.id: core.sign_ack(bad.round, bad.epoch, digest)}
        out.append(([target], Commit(**core.envelope(), round=bad.round, epoch=bad.epoch,
                                     digest=digest, certificate=cert)))
    return [*out, ([p for p in peer_ids if p != target], msg)]


def parse_seeds(text: str) -> range | list[int]:
    """``7``, ``0-99`` or ``1,5,9``."""
    try:
        if "-" in text:
            a, b = text.split("-", 1)
            return range(int(a), int(b) + 1)
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds: got {text!r}; allowed: N, A-B or N,M,...") from None
