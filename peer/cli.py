"""``hfl-peer``: run one peer of a cohort.

    hfl-peer --config node0.yaml [--set cohort.rounds=50 --set node.device=cuda:0]

Exit status: 0 when the cohort's last round is done, 2 for a bad config, 3 when
a sharing method ended with fewer than max(2, node.min_peers) peers, nobody answered
at its bootstrap addresses within timing.join_timeout_s, or a resumed peer found
its cohort finished or gone (unless --allow-solo / node.allow_solo),
1 for anything else (a port in use, a full or read-only disk, a corrupt
checkpoint: one ``hfl-peer: <file>: ...`` line). SIGTERM and Ctrl-C stop the peer cleanly
within about two seconds (it tells the others it is leaving, finishes a checkpoint being
written, and does not wait for a training step in flight), with status 143 for SIGTERM
and 130 for Ctrl-C (SIGINT); the checkpoint of the last finished round lets it resume later.
At the end it draws its metrics into ``<run_dir>/plots/`` as ``hfl-launch`` does (not
when stopped by a signal: ``hfl-report <run_dir>`` draws them later).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import os
import signal
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hfl-peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="peer YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config value (repeatable), e.g. --set timing.round_timeout_s=30")
    p.add_argument("--check", action="store_true",
                   help="validate the config, open the data, build the model and the algorithm, "
                        "then exit")
    p.add_argument("--allow-solo", action="store_true",
                   help="exit 0 even if this peer ends up sharing with fewer peers than expected "
                        "(same as --set node.allow_solo=true)")
    p.add_argument("--profile", metavar="FILE", default=os.environ.get("HFL_PROFILE") or None,
                   help="write a cProfile of the event loop's thread (the runtime's own CPU: "
                        "messages, encoding, signing, scheduling; the method's calls run in "
                        "worker threads and are not in it) to FILE when the peer ends; "
                        "{id} expands to the peer's id (env HFL_PROFILE, e.g. for hfl-launch's "
                        "peers: HFL_PROFILE=prof/{id}.pstats); python -m hfl.launch.profile "
                        "FILE... splits it by kind of cost")
    p.add_argument("--no-plot", action="store_true",
                   help="write no plots at the end (hfl-launch plots the whole run itself)")
    return p.parse_args(argv)


def _write_profile(profiler, path: str, peer_id: str) -> None:
    """--profile: the event loop thread's profile, as pstats reads it."""
    out = path.replace("{id}", peer_id)
    if not profiler.getstats():
        print(f"hfl-peer: {peer_id}: no profile written to {out}: no round ran", file=sys.stderr)
        return
    try:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        profiler.dump_stats(out)
    except OSError as err:
        print(f"hfl-peer: --profile {out}: {err.strerror or err}", file=sys.stderr)
        return
    print(f"hfl-peer: {peer_id}: profile of the event loop's thread in {out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    # SIGHUP rereads the allow-list once a CURVE transport listens (peer/transport.py);
    # before that (imports, data, the model), without an allow-list and while stopping,
    # it is ignored: its default action ended the peer with no goodbye (a review: a
    # SIGHUP to every peer after an allow-list edit killed one that was starting).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        return _main_checked(parse_args(argv))
    except KeyboardInterrupt:  # (Ctrl-C while the imports ran: a 50-line traceback)
        return 130


def _main_checked(args: argparse.Namespace) -> int:
    from hfl.peer.config import ConfigError, load_config

    overrides = list(args.overrides) + (["node.allow_solo=true"] if args.allow_solo else [])
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as err:
        print(f"hfl-peer: invalid config: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=cfg.node.log_level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if cfg.secured and not cfg.cohort.run:
        # (hfl-launch sets one per run: only peers started by hand get here)
        logging.getLogger("hfl.peer").warning(
            "%s: cohort.run is not set: what this peer signs in this run stays valid in any "
            "other run of cohort %r with the same keys, where a member may replay it, and "
            "no committed result is relayed to a member that missed it (set cohort.run to "
            "a new number above 0 for each run, the same on every peer)",
            cfg.node.id, cfg.cohort.name)
    if args.check:
        from hfl.peer.check import check_peer

        try:
            print(f"{args.config}: ok ({check_peer(cfg)})")
        except ConfigError as err:
            print(f"hfl-peer: invalid config: {err}", file=sys.stderr)
            return 2
        except Exception as err:  # a check that missed a case: one line, not a traceback
            print(f"hfl-peer: invalid config: cannot build this peer from it: "
                  f"{type(err).__name__}: {err}", file=sys.stderr)
            return 2
        return 0
    _raise_file_limit()
    try:
        import uvloop  # optional: a faster event loop where available

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    from hfl.peer.checkpoint import RunFileError, os_error_text
    from hfl.peer.runner import thawed_after
    from hfl.peer.status import CohortGone, CohortTooSmall, StartError, Unsendable, address_in_use

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # CPU, not time spent waiting
    try:
        with thawed_after():  # the peer freezes its heap once built (freeze_heap)
            result = runner(_main(cfg, profiler))
    except ConfigError as err:
        print(f"hfl-peer: invalid config: {err}", file=sys.stderr)
        return 2
    except StartError as err:
        print(f"hfl-peer: {cfg.node.id}: {err}", file=sys.stderr)
        return 1
    except Unsendable as err:  # (its text names the peer)
        print(f"hfl-peer: {err}", file=sys.stderr)
        return 1
    except CohortGone as err:
        print(f"hfl-peer: {cfg.node.id}: {err}", file=sys.stderr)
        return 3
    except CohortTooSmall as err:
        print(f"hfl-peer: {cfg.node.id}: {err}", file=sys.stderr)
        _plot(cfg, args.no_plot)
        _print_summary(cfg, None)
        return 3
    except RunFileError as err:  # a full or read-only disk, a corrupt checkpoint: one line
        print(f"hfl-peer: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        import zmq

        if isinstance(err, zmq.ZMQError) and err.errno == zmq.EADDRINUSE:
            print(f"hfl-peer: {cfg.node.id}: {address_in_use(cfg.node.listen)}", file=sys.stderr)
            return 1
        if isinstance(err, OSError) and err.filename is not None:  # a file we did not wrap
            print(f"hfl-peer: {err.filename}: {os_error_text(err)}", file=sys.stderr)
            return 1
        raise
    finally:
        if profiler is not None:
            profiler.disable()
            _write_profile(profiler, args.profile, cfg.node.id)
    if isinstance(result, _Stopped):
        # No plots here: a stopped peer exits within about a second (drawing took 2-3 s
        # more on a loaded machine, past what a scheduler's SIGTERM allows).
        if not args.no_plot:
            print(f"hfl-peer: {cfg.node.id} stopped by {signal.Signals(result.signum).name}; "
                  f"its rounds so far are in {cfg.run_dir}/metrics.jsonl (hfl-report "
                  f"{cfg.run_dir} draws them)", file=sys.stderr, flush=True)
        return 128 + result.signum  # 143 for SIGTERM, 130 for Ctrl-C
    if result.rounds_completed == 0 and result.last_round >= cfg.cohort.rounds:
        print(f"hfl-peer: {cfg.node.id}: nothing to run: {cfg.run_dir} already finished round "
              f"{result.last_round}/{cfg.cohort.rounds} (--set node.resume=false starts over); "
              "its results as before:", flush=True)
    _plot(cfg, args.no_plot)
    try:  # (a terminal closed meanwhile: the run's files are written, its status 0)
        _print_summary(cfg, result)
    except OSError:
        pass
    return 0


def _plot(cfg, skip: bool) -> None:
    """This peer's plots in ``<run_dir>/plots/``, drawn by hfl-launch's code (the CLI is
    the outermost layer, as the launcher is); a plot never costs the exit status."""
    if skip:
        return
    from pathlib import Path

    try:
        from hfl.launch.plots import plot_run

        plot_run(Path(cfg.run_dir), [(cfg.node.id, Path(cfg.run_dir))])
    except Exception as exc:
        print(f"hfl-peer: no plots ({type(exc).__name__}: {exc})", file=sys.stderr)


def _print_summary(cfg, result) -> None:
    """The last round's numbers and where the files are (stdout: the peer's answer)."""
    import json
    from pathlib import Path

    run_dir = Path(cfg.run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return
    if not summary.get("last_round"):  # stopped before round 1 (nobody joined)
        print(f"hfl-peer: {cfg.node.id} stopped before round 1 of {summary.get('rounds')}; "
              f"summary in {run_dir / 'summary.json'}", flush=True)
        return
    final = summary.get("final", {})
    shown = ", ".join(f"{k.replace('_', ' ')} {final[k]:.4f}"
                      for k in ("test_acc", "global_acc", "train_loss") if k in final)
    print(f"hfl-peer: {cfg.node.id} done: round {summary.get('last_round')}/{summary.get('rounds')}"
          f"{', ' + shown if shown else ''}; cohort of up to {summary.get('max_live_peers')} peers; "
          f"metrics in {run_dir / 'metrics.jsonl'}, summary in {run_dir / 'summary.json'}"
          f"{', plots in ' + str(run_dir / 'plots') if (run_dir / 'plots').is_dir() else ''}", flush=True)


def _raise_file_limit() -> None:
    """The soft limit on open files up to the hard one (at most 65,536), as servers do: a
    link to a member holds three ZeroMQ sockets and a connection, so a cohort of a few
    hundred needs more than the usual soft limit of 1,024 (ZmqTransport.max_links)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, OSError, ValueError):
        pass  # (Windows, or a limit we may not raise: the transport adapts to it)


class _Stopped:
    """What ``_main`` returns when a signal stopped the peer."""

    def __init__(self, signum: int):
        self.signum = signum


class _NoWaitExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor (training, aggregation, checkpoints run there). At the
    loop's close it does not wait for a training step in flight: a stopped peer must not
    take a step's length (minutes on a big model) to exit. A checkpoint being written is
    waited for by the runner before it returns (RoundRecorder.stop)."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=True)


async def _main(cfg, profiler=None):
    from hfl.peer.runner import run_peer

    def observer(event: str, node, **fields) -> None:
        if event == "started" and profiler is not None:  # the rounds, not the start-up
            profiler.enable()

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    loop.set_default_executor(_NoWaitExecutor(thread_name_prefix="hfl-work"))
    stopped_by: list[int] = []

    def stop(signum: int) -> None:
        if stopped_by:  # a second signal while stopping changes nothing (SLURM's scancel
            return  # sends SIGTERM to the peer and to its task wrapper, which passes it on)
        stopped_by.append(signum)
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    watch = asyncio.ensure_future(watch_launcher(cfg.node.id, lambda: stop(signal.SIGTERM)))
    try:
        return await run_peer(cfg, observer=observer if profiler is not None else None,
                              freeze_heap=True)
    except asyncio.CancelledError:
        signum = stopped_by[0] if stopped_by else signal.SIGTERM
        logging.getLogger("hfl.peer").info("%s: stopped by %s", cfg.node.id,
                                           signal.Signals(signum).name)
        return _Stopped(signum)
    finally:
        watch.cancel()


async def watch_launcher(peer_id: str, stop, every_s: float = 1.0) -> None:
    """A peer started by hfl-launch (``HFL_LAUNCHER_PID``, ``HFL_LAUNCHER_STARTED``) stops,
    as on SIGTERM, once that launcher is gone: killed with SIGKILL, it left its peers
    training for nobody and holding their ports, and the next ``--fresh`` in that run
    directory had an orphan writing the old run's rounds into the new one (a review).
    ``hfl-launch --resume`` continues the run from the checkpoints."""
    from hfl.peer.status import process_alive

    pid = os.environ.get("HFL_LAUNCHER_PID", "")
    if not pid.isdigit():
        return
    started = os.environ.get("HFL_LAUNCHER_STARTED", "")
    started = int(started) if started.isdigit() else None
    while process_alive(int(pid), started):
        await asyncio.sleep(every_s)
    logging.getLogger("hfl.peer").warning(
        "%s: its hfl-launch (pid %s) is gone: this peer stops (hfl-launch --resume continues "
        "the run)", peer_id, pid)
    stop()


def entry() -> None:
    """The ``hfl-peer`` command: :func:`main`, then exit at once with its status.

    Everything the peer leaves behind (metrics, checkpoint, summary) is written and
    fsynced before :func:`main` returns; what is skipped is the interpreter's own
    teardown, a last garbage collection of some 400,000 objects (torch, the data, the
    model) that took 5-12 s on a loaded machine after the "done" line or a SIGTERM.
    Standard streams and log handlers are flushed first."""
    exit_now(main())


def exit_now(code: int) -> None:
    """Flush the log handlers and standard streams, then end the process with ``code``
    without the interpreter's teardown (see :func:`entry`)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
