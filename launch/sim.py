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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfl.launch.simloop import SimulationStalled, VirtualLoop, current_peer, run_as
from hfl.launch.simnet import SimNetwork, SimTransport
from hfl.sim.model import (  # noqa: F401 -- also this module's API (tests, bench/scale.py)
    FAULT_KINDS,
    FAULT_SYNTAX,
    TWIN_KINDS,
    Checker,
    Fault,
    NetworkFaults,
    Scenario,
    Violation,
    draw_network,
    install_twin_core,
    model_digest,
    parse_fault,
    parse_seeds,
    parse_twins,
    plan_scenario,
    sim_keys,
    twin_sends,
)

log = logging.getLogger("hfl.sim")

DEFAULT_EXPERIMENT = Path(__file__).resolve().parent.parent / "examples" / "quickstart.yaml"


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
    #: signing keys for every peer without a twin (``--signed``): certified commits, and
    #: their quorum (3 of 3 or 4, PROTOCOL.md), as hfl-launch's cohorts run
    signed: bool = False


def install_twin(node, kind: str, checker: Checker | None = None) -> None:
    """Make ``node`` a Byzantine twin of ``kind`` (its code is otherwise the runtime's);
    each message it forges is told to ``checker`` (*named* asks only a twin that
    equivocated be named)."""
    install_twin_core(kind, node.core)
    broadcast = node._broadcast
    victim = sorted(p for p in node.membership.members if p != node.id)[0] if node.membership else None

    async def twin(peer_ids, msg, timeout_s=None):
        sent = 0
        sends = twin_sends(kind, node.core, victim, list(peer_ids), msg)
        if len(sends) > 1 and checker is not None:
            checker.forged(node.id, msg.round)
        for ids, m in sends:
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
    from hfl.peer.configtools import literal_override

    sets = [f"peers={opts.peers}", literal_override("run_dir", root),
            f"defaults.cohort.rounds={opts.rounds}",
            "defaults.security.mode=none", "defaults.node.threads=1", "defaults.node.device=cpu",
            # The commit protocol is what the simulator explores: an elected aggregator,
            # although cohort.aggregate_at auto has every peer aggregate in small cohorts
            # (override with defaults.cohort.aggregate_at=every_peer).
            "defaults.cohort.aggregate_at=aggregator",
            # A signed cohort (twins) runs as hfl-launch starts one: with a run id, which
            # what a peer signs binds to (and without which no result is relayed).
            *(["defaults.cohort.run=1"] if opts.byzantine or opts.signed else []),
            *opts.overrides]
    exp = load_experiment(opts.experiment, sets)
    plans = expand(exp, gpus=[], ports=list(range(1, opts.peers + 1)))
    return exp, in_memory(plans)


def run_seed(seed: int, opts: SimOptions, scenario: Scenario | None = None) -> SimResult:
    """Run one seed in a fresh virtual loop; never raises for what the peers do.
    ``scenario`` replaces the seed's drawn faults (a regression pinned as found). Its
    peers' run folders live in a temporary folder, removed however the run ends (an
    interrupt or a bad experiment left one behind in /tmp per run); ``opts.keep`` or
    a violation keeps a copy."""
    root = Path(tempfile.mkdtemp(prefix=f"hfl-sim-{seed}-"))
    try:
        return _run_seed_in(root, seed, opts, scenario)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run_seed_in(root: Path, seed: int, opts: SimOptions, scenario: Scenario | None
                 ) -> SimResult:
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
        raise ConfigError("--byzantine", str(err)) from None
    keys = sim_keys(seed, ids) if twins or opts.signed else {}
    checker = Checker(mode=mode, everywhere=False, bound_s=bound, twins=twins, rounds=opts.rounds)
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
            install_twin(node, twins[node.id], checker)
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

    def wipe(peer: str) -> None:
        """The peer's run folder lost with its disk: it restarts with none. Its files go
        aside (``<run_dir>.lost1``, ``.lost2``, ... for each wipe: a second one deleted
        the first life's rows, a review): the checker still reads what they did."""
        run_dir = Path(cfgs[peer].run_dir)
        if run_dir.exists():
            n = 1 + sum(1 for _ in run_dir.parent.glob(f"{run_dir.name}.lost*"))
            run_dir.rename(run_dir.with_name(f"{run_dir.name}.lost{n}"))

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
                if f.kind in ("crash", "leave", "wipe") and phase == "begin":
                    stop(peer, "term" if f.kind == "leave" else "kill")
                elif f.kind in ("crash", "leave", "wipe") and peer in down:  # its restart
                    if f.kind == "wipe":
                        wipe(peer)
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
    ap.add_argument("--signed", action="store_true",
                    help="every peer with signing keys, as hfl-launch starts a cohort (certified "
                         "commits: PROTOCOL.md); a twin implies it")
    ap.add_argument("--quiet", action="store_true", help="only violations and the summary")
    args = ap.parse_args(argv)
    if args.peers < 2:
        ap.error(f"--peers: got {args.peers}; a cohort needs 2 or more")
    if args.rounds < 1:
        ap.error(f"--rounds: got {args.rounds}; 1 or more")
    from hfl.peer.configtools import ConfigError

    opts = SimOptions(experiment=args.experiment, overrides=args.set, peers=args.peers,
                      rounds=args.rounds, buggify=args.buggify, keep=args.keep,
                      faults=args.fault, byzantine=args.byzantine, signed=args.signed)
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
