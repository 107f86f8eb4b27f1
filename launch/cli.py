"""``hfl-launch``: run a whole cohort on this machine.

    hfl-launch examples/quickstart.yaml [--set defaults.cohort.rounds=5] [--dry-run] [--seeds 0 1 2]

Spawns one ``hfl-peer`` process per peer, spreads them over the GPUs it finds,
shows live progress, injects the experiment's faults and ends with a results
table (also written to the run directory as results.md / results.json).

A run directory is never reused silently: a finished run, or one of another
experiment (a changed ``--set``), is refused unless ``--fresh`` (start over) or
``--resume`` (continue from the checkpoints) is given; an interrupted run of the
same experiment resumes on the same ports. See hfl.launch.rundir.

Exit status: 0 if every peer finished with its cohort, 1 if one failed, finished
without its cohort (see --allow-solo) or the run timed out, 2 for a bad
experiment file or a refused run directory, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hfl-launch", description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", help="experiment YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a value of the experiment file (repeatable), "
                        "e.g. --set defaults.cohort.algorithm=solo --set peers=8")
    p.add_argument("--run-dir", help="write the run here instead of the experiment's run_dir")
    fresh = p.add_mutually_exclusive_group()
    fresh.add_argument("--fresh", action="store_true",
                       help="delete the run directory first and start over")
    fresh.add_argument("--resume", action="store_true",
                       help="continue the run in the run directory from its checkpoints, even if it "
                            "finished or the experiment changed (e.g. more rounds)")
    p.add_argument("--dry-run", action="store_true",
                   help="check every peer (open its data, build its model and algorithm), write the "
                        "peer configs, print the plan, exit")
    p.add_argument("--allow-solo", action="store_true",
                   help="do not fail peers that end up sharing with fewer peers than min_peers")
    p.add_argument("--start", choices=("forkserver", "process"), default=None,
                   help="forkserver (default on Linux): fork peers from one template process that "
                        "imported torch once; process: a fresh interpreter per peer")
    p.add_argument("--in-process", action="store_true",
                   help="run every peer in this process over the in-memory transport (the same "
                        "peer code; for 50-200 peers on one machine; no process faults)")
    p.add_argument("--on", choices=("local", "slurm"), default="local",
                   help="local: peers on this machine; slurm: one batch job on the SLURM cluster "
                        "(the experiment's slurm section; the run dir must be on a shared filesystem)")
    p.add_argument("--detach", action="store_true",
                   help="--on slurm: submit the job and return; the same command later follows "
                        "the job and writes the results (the login session need not stay)")
    p.add_argument("--quiet", action="store_true", help="no live progress, only the results table")
    p.add_argument("--seeds", type=int, nargs="+", default=None, metavar="SEED",
                   help="run the experiment once per seed (data split, initialisation and the peers' "
                        "own randomness: defaults.data/cohort/node.seed), each in <run dir>/seed<S>, "
                        "and end with a table of every seed and their mean ± std")
    args = p.parse_args(argv)
    if args.detach and args.on != "slurm":
        p.error("--detach: only with --on slurm (a local launch runs its peers itself)")
    if args.seeds is not None and len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds: each seed once, got {' '.join(map(str, args.seeds))}")
    return args


def _out(text: str = "", err: bool = False) -> None:
    """print that survives a closed pipe (`hfl-launch ... | tee log` and Ctrl-C)."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(text, file=stream, flush=True)
    except (BrokenPipeError, OSError, ValueError):
        # Keep the interpreter's final flush from failing on the dead pipe too.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        except (OSError, ValueError):
            pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import signal

    # SIGTERM and a hangup stop a local launch as Ctrl-C does, in every phase (a review:
    # during start-up, or with --in-process, they killed the launcher at once and
    # silently; a --fresh launch left the old run hidden in a dot-folder). Not on SLURM,
    # where a launcher that dies leaves its job running (the same command follows it;
    # Ctrl-C cancels it), nor where the signal was ignored when we started (nohup).
    previous = {}
    args.held_locks = []  # (rundir.LaunchLock: released last, after a Ctrl-C is recorded)
    if args.on != "slurm" and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, _interrupt)
    try:
        if args.seeds is None:
            return launch_once(args, list(args.overrides))
        return launch_seeds(args)
    except KeyboardInterrupt:  # Ctrl-C before the peers ran (the supervisor handles it after)
        return interrupted_at_start(args)
    finally:
        while args.held_locks:
            args.held_locks.pop().release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def interrupted_at_start(args: argparse.Namespace) -> int:
    """Ctrl-C during start-up (checking the experiment, the template importing torch,
    the peers being started): one line, no traceback, the template and any peer
    already started stopped, and the run's record not left at ``running``."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):  # a second one must not cut this short
        signal.signal(sig, signal.SIG_IGN)
    if "hfl.launch.zygote" in sys.modules:
        sys.modules["hfl.launch.zygote"].stop_template()
    run_dir = getattr(args, "started_run_dir", None)
    if run_dir is not None:
        from hfl.launch.rundir import read_record, set_state

        state = (read_record(run_dir) or {}).get("state")
        if state in ("finished", "failed"):  # after the run: its record and results stand
            _out(f"\nhfl-launch: interrupted after the run ended ({state}): its results are in "
                 f"{run_dir}/results.json (hfl-report {run_dir} draws the plots)", err=True)
            return 130
        set_state(run_dir, "interrupted", failures=["interrupted"])
    _out("\nhfl-launch: interrupted" + (
        f"; the same command continues the run in {run_dir}" if run_dir is not None else
        " during start-up: nothing was started"), err=True)
    return 130


def launch_seeds(args: argparse.Namespace) -> int:
    """``--seeds``: one launch per seed under ``<run dir>/seed<S>``, then the seeds' table."""
    import json

    from hfl.launch.experiment import load_experiment
    from hfl.launch.report import peer_dirs
    from hfl.launch.results import (
        cohort_row,
        no_nan,
        render_seeds_table,
        seed_dir,
        seeds_counted,
        seeds_summary,
    )
    from hfl.peer.configtools import ConfigError, literal_override

    base_sets = list(args.overrides) + ([literal_override("run_dir", args.run_dir)] if args.run_dir is not None else [])
    try:
        exp = load_experiment(args.experiment, base_sets)
    except ConfigError as err:
        _out(f"hfl-launch: invalid experiment: {err}", err=True)
        return 2
    base = exp.resolved_run_dir
    from hfl.launch.rundir import RunDirError, refuse_foreign

    try:  # (the seeds' table and plot go in the base folder: never a folder of the user's)
        refuse_foreign(base, exp.peer_ids())
        if not args.dry_run:  # (the whole folder, for every seed: a --fresh of it deleted
            hold_lock(args, base)  # a live seeds run; main releases it)
    except RunDirError as err:
        _out(f"hfl-launch: {err}", err=True)
        return 2
    worst, per_seed = 0, {}
    for i, seed in enumerate(args.seeds):
        _out(f"hfl-launch: seed {seed} ({i + 1} of {len(args.seeds)})")
        sets = [*args.overrides, f"defaults.data.seed={seed}", f"defaults.cohort.seed={seed}",
                f"defaults.node.seed={seed}", literal_override("run_dir", seed_dir(base, seed))]
        args.nothing_left = False
        rc = launch_once(args, sets)
        if rc == 2 and args.nothing_left and args.resume:
            # (--seeds ... --resume: a seed that ran every round is done: its row as it is,
            # failed if its launch had failed)
            from hfl.launch.rundir import read_record

            rc = 1 if (read_record(seed_dir(base, seed)) or {}).get("state") == "failed" else 0
            _out(f"hfl-launch: seed {seed} ran every round already: its results as they are")
        elif rc in (2, 130):  # a refused experiment or run directory, or Ctrl-C: stop here
            return rc
        worst = max(worst, rc)
        if not args.dry_run and peer_dirs(seed_dir(base, seed)):
            per_seed[seed] = cohort_row(seed_dir(base, seed), peer_dirs(seed_dir(base, seed)))
            if rc != 0:
                per_seed[seed]["failed"] = (f"its launch failed (exit {rc}; "
                                            f"{seed_dir(base, seed)}/results.md says why)")
    if args.dry_run or not per_seed:
        return worst
    table = render_seeds_table(per_seed)
    summary = seeds_summary(per_seed)
    (base / "results.md").write_text(table + "\n")
    (base / "results.json").write_text(json.dumps(no_nan({  # (strict JSON: NaN as null)
        "experiment": exp.name, "seeds": args.seeds, "ok": worst == 0,
        "per_seed": {str(k): row for k, row in per_seed.items()},
        "mean": summary["mean"], "std": summary["std"], "mean_over": seeds_counted(per_seed),
    }), indent=2, default=str, allow_nan=False))
    try:
        from hfl.launch.plots import plot_seeds
        from hfl.launch.results import read_metrics

        plot_seeds(base, {s: {pid: read_metrics(d) for pid, d in peer_dirs(seed_dir(base, s))}
                          for s in seeds_counted(per_seed)})  # (the table's mean's seeds)
    except Exception as exc:  # a plot must never cost the results
        _out(f"hfl-launch: no seeds plot ({type(exc).__name__}: {exc})", err=True)
    _out(f"\n{exp.name} over {len(per_seed)} seed(s): the peers' mean per seed, then mean ± std "
         "over seeds")
    _out(table)
    missing = [s for s in args.seeds if s not in per_seed]
    if missing:
        _out(f"no results for seed(s) {', '.join(map(str, missing))}", err=True)
    _out(f"\nresults in {base}/results.md")
    return worst


def launch_once(args: argparse.Namespace, overrides: list[str]) -> int:
    """One launch (:func:`_launch_once`), its run directory locked from before it is
    read until the run ended (:func:`hold_lock`); after a Ctrl-C, until :func:`main`
    recorded the interruption."""
    held, interrupted = len(args.held_locks), False
    try:
        return _launch_once(args, overrides)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if not interrupted:
            while len(args.held_locks) > held:
                args.held_locks.pop().release()


def hold_lock(args: argparse.Namespace, run_dir: Path) -> None:
    """Lock ``run_dir`` for this launcher (rundir.LaunchLock, released by
    :func:`launch_once` or :func:`main`); RunDirError if another launcher holds it; a
    warning where no lock can be taken."""
    from hfl.launch.rundir import LaunchLock

    lock = LaunchLock.take(run_dir)
    if isinstance(lock, str):
        _out(f"hfl-launch: warning: cannot lock {run_dir} ({lock}): a second launch of it "
             "started meanwhile would not be refused", err=True)
        return
    args.held_locks.append(lock)


def refuse_over_a_live_job(args: argparse.Namespace, run_dir: Path) -> None:
    """RunDirError when ``run_dir``'s record names a SLURM job still queued or running
    and this launch would not follow it: ``--fresh`` deleted the folder the job writes
    into (and submitted a second job beside it), and a launch on this machine would
    run the cohort twice (a review)."""
    from hfl.launch.rundir import RunDirError, read_record

    job = (read_record(run_dir) or {}).get("slurm_job")
    if not job or not (args.fresh or args.on != "slurm"):
        return
    from hfl.launch.slurm import ENDED, job_state

    state = job_state(str(job))
    if state not in ENDED and state != "UNKNOWN":
        raise RunDirError(
            f"{run_dir}: its SLURM job {job} is still {state.lower()}: "
            + (f"--fresh would delete the folder it writes into; scancel {job} first, or follow "
               "it with the same command without --fresh" if args.fresh else
               f"follow it with --on slurm, or scancel {job} first"))


def _launch_once(args: argparse.Namespace, overrides: list[str]) -> int:
    args.started_at = time.time()  # each launch reports how long until its round 1
    from hfl.launch.experiment import (
        expand,
        load_experiment,
        new_run_id,
        run_id_of,
        write_plans,
        write_run_id,
    )
    from hfl.launch.rundir import (
        Decision,
        RunDirError,
        decide,
        discard,
        nothing_to_resume,
        ports_in_use,
        refuse_foreign,
        restore,
        rounds_already_run,
        set_state,
        write_record,
    )
    from hfl.peer.configtools import ConfigError, literal_override, to_dict

    if args.run_dir is not None and args.seeds is None:
        overrides.append(literal_override("run_dir", args.run_dir))
    if args.allow_solo:
        overrides.append("defaults.node.allow_solo=true")
    decision = run_dir = None
    written = False
    try:
        exp = load_experiment(args.experiment, overrides)
        run_dir = exp.resolved_run_dir
        exp_dict = to_dict(exp)
        if args.on == "slurm":  # (before anything is written there)
            from hfl.launch.slurm import check_run_dir

            check_run_dir(run_dir)
        if args.dry_run:  # changes nothing: says what a launch would do
            # (it writes peer configs and keys: never into a folder of the user's, which
            # decide's refusal, taken as "a launch would be refused" below, would allow)
            refuse_foreign(run_dir, exp.peer_ids())
            try:
                decision = decide(run_dir, exp_dict, fresh=False, resume=args.resume,
                                  peer_ids=exp.peer_ids())
                if args.fresh:
                    decision = Decision("new", f"--fresh: would delete {run_dir} and start anew")
            except RunDirError as err:
                decision = Decision("new", f"a launch would be refused: {err}" if not args.fresh
                                    else f"--fresh: would delete {run_dir} and start anew",
                                    refused=not args.fresh)
            try:  # (--fresh too: a job still running refuses it)
                refuse_over_a_live_job(args, run_dir)
            except RunDirError as err:
                decision = Decision("new", f"a launch would be refused: {err}", refused=True)
        else:
            hold_lock(args, run_dir)
            refuse_over_a_live_job(args, run_dir)
            decision = decide(run_dir, exp_dict, fresh=args.fresh, resume=args.resume,
                              peer_ids=exp.peer_ids())
        slurm = args.on == "slurm"
        if slurm and (args.in_process or exp.faults):
            raise ConfigError("faults" if exp.faults else "", "--on slurm runs the peers as SLURM "
                              "tasks: drop " + ("the process faults" if exp.faults else "--in-process"))
        if decision.ports and not args.dry_run and not slurm:  # SLURM picks hosts and ports anew
            busy = ports_in_use(exp.host, decision.ports)
            if busy:
                raise RunDirError(
                    f"cannot resume {run_dir}: its ports {', '.join(map(str, busy))} are in use "
                    "(is that run still stopping, or another program on them?); retry shortly, or "
                    "--fresh to start over on new ports"
                )
        # Nothing is written until every check passed (below): a dry run, or a launch
        # refused, rewrote an existing run's recorded configs and allow-list (a review).
        run = run_id_of(run_dir, create=False)
        new_id = run == 0 and not args.dry_run
        if new_id:
            run = new_run_id()
        # On SLURM, the job's --gpus-per-task gives each task its own CUDA_VISIBLE_DEVICES.
        plans = expand(exp, ports=decision.ports, resume=decision.action == "resume",
                       run=run, write=False,
                       gpus=(["0"] if exp.slurm.gpus_per_task else []) if slurm else None,
                       pin_devices=not slurm,
                       # on SLURM a peer has its task's cores, not a share of this login node's
                       # (the default was this machine's cores / peers: 16 on a 64-core login
                       # node, then asked of every task; a review)
                       threads=(exp.slurm.cpus_per_task or exp.threads_per_peer or 1)
                       if slurm else None)
        unsaved = left = earlier_job = follow = None
        if slurm and decision.action == "resume":
            # A job a detached (or disconnected) launch submitted and nobody collected is
            # followed (slurm.following); once collected, a resume submits a new job, and
            # is checked as a local one is: a resume of a finished run followed its ended
            # job again and showed the old table, even with more rounds asked for.
            from hfl.launch.rundir import read_record
            from hfl.launch.slurm import following

            record = read_record(run_dir) or {}
            if record.get("state") not in ("finished", "failed"):
                earlier_job = record.get("slurm_job")
                follow = following(earlier_job, plans)
        if decision.action == "resume" and not follow:
            unsaved = nothing_to_resume(run_dir, [
                (p.id, p.config.node.checkpoint, Path(p.config.node.run_dir)) for p in plans])
            left = rounds_already_run(run_dir, plans[0].config.cohort.rounds,
                                      [(p.id, Path(p.config.node.run_dir)) for p in plans])
        if why := unsaved or left:
            args.nothing_left = unsaved is None  # (every round ran: a seed of --seeds is done)
            if not args.dry_run:
                raise RunDirError(why)
            decision = Decision("new", f"a launch would be refused: {why}", refused=True)
        if args.in_process and exp.faults:
            raise ConfigError("faults", "process faults need a process per peer; drop "
                                        "--in-process or the faults")
        _check_data_files(plans)  # a missing file in a second, before torch is imported
        start = args.start or ("forkserver" if sys.platform.startswith("linux") else "process")
        if start == "forkserver" and not args.dry_run and not args.in_process and not slurm:
            import signal
            from multiprocessing import resource_tracker

            from hfl.launch.zygote import preload_for, start_template

            # The template starts with SIGINT blocked, and keeps it so: a Ctrl-C while it
            # imports torch would print a traceback from inside torch (the launcher
            # stops it). Here a Ctrl-C meanwhile is only delayed to the unblocking.
            # (multiprocessing's resource tracker, started with the template, unblocks
            # SIGINT after spawning itself: started first, it leaves the mask alone.)
            resource_tracker.ensure_running()
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                start_template(sorted({m for p in plans
                                       for m in preload_for(p.config.cohort.algorithm)}))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        described = check_plans(plans, deep=args.dry_run, devices_here=not slurm)
        # A dry run writes the configs (and keys) of a new run only: never into a run
        # directory that holds anything (a finished run's record, a live run's allow-list).
        written = not args.dry_run or not (run_dir.exists() and any(run_dir.iterdir()))
        if written:
            write_plans(exp, plans)
            if ours := next((p for p in plans if p.cohort_key), None):
                ours.config.identity()  # the cohort's keys as made (or kept): readable
        if new_id:
            write_run_id(run_dir, run)
    except RunDirError as err:
        if decision is not None:
            restore(run_dir, decision)
        if not (getattr(args, "nothing_left", False) and args.seeds is not None):
            _out(f"hfl-launch: {err}", err=True)  # (a seed of a --seeds --resume: said above)
        return 2
    except ConfigError as err:
        if "hfl.launch.zygote" in sys.modules:
            sys.modules["hfl.launch.zygote"].stop_template()
        if decision is not None:
            restore(run_dir, decision)  # a refused --fresh launch loses nothing
        _out(f"hfl-launch: invalid experiment: {err}", err=True)
        return 2
    except BaseException:  # Ctrl-C meanwhile: a --fresh launch that never started loses nothing
        if decision is not None:  # (it hid the old run in a dot-folder, for good)
            restore(run_dir, decision)
        raise
    discard(decision)
    gpus = sorted({p.env.get("CUDA_VISIBLE_DEVICES", "") for p in plans} - {""})
    _out(f"hfl-launch: {exp.name}: {len(plans)} peers, {plans[0].config.cohort.algorithm}, "
         f"{plans[0].config.cohort.rounds} rounds, run dir {run_dir}, "
         f"{'GPUs ' + ','.join(gpus) if gpus else 'CPU'}, {plans[0].config.node.threads} thread(s)/peer")
    # (a dry run said "new run in X" as if it had started one: a review)
    _out(f"hfl-launch: {'dry run, a launch would do this: ' if args.dry_run else ''}"
         f"{decision.reason}")
    if args.dry_run and slurm:
        from hfl.launch.slurm import batch_script

        _out(f"hfl-launch: the batch script --on slurm would submit:\n{batch_script(exp, plans, run_dir)}")
        return 2 if decision.refused else 0
    if args.dry_run:
        if not written:  # (a folder that holds a run)
            _out(f"hfl-launch: a dry run writes nothing into {run_dir}, which holds files "
                 "already (a run, or an earlier dry run's configs): the configs below are the "
                 "ones a launch would write")
        else:
            _out(f"hfl-launch: the dry run wrote the peers' configs and keys into {run_dir} "
                 "(no run record: a launch there starts the run)")
        for p in plans:
            env = " ".join(f"{k}={v}" for k, v in p.env.items())
            _out(f"  {described[p.id]}\n      {env} hfl-peer --config {p.config_path}")
        return 2 if decision.refused else 0  # (as the launch would: 0 said it would run)

    from hfl.launch.results import best_mean, mean_row, peer_row, round_one_after, write_results
    from hfl.launch.supervisor import Supervisor

    if not slurm and (busy := busy_machine_warning(len(plans), _load_average(), os.cpu_count())):
        _out(f"hfl-launch: {busy}", err=True)
    ports = [int(p.config.node.listen.rsplit(":", 1)[1]) for p in plans]
    write_record(run_dir, exp_dict, ports, "running", **({"slurm_job": earlier_job} if earlier_job else {}))
    args.started_run_dir = run_dir  # from here on, a Ctrl-C marks it interrupted
    if slurm:
        from hfl.launch import slurm as on_slurm

        try:
            outcome = on_slurm.run(exp, plans, run_dir, _out, progress=not args.quiet,
                                   on_submit=lambda job: set_state(run_dir, "running", slurm_job=job),
                                   job=earlier_job if follow else None, detach=args.detach)
        except on_slurm.SlurmError as err:
            set_state(run_dir, "failed")
            _out(f"hfl-launch: {err}", err=True)
            return 1
        if outcome is None:  # --detach: submitted; the same command follows it later
            _out(f"hfl-launch: detached; run the same command again to follow the job and get "
                 f"the results table (until then: squeue --me; {run_dir}/<peer>/peer.log)")
            return 0
    elif args.in_process:
        from hfl.launch.inprocess import run_in_process

        try:
            outcome = run_in_process(exp, plans, sys.stdout, progress=not args.quiet)
        except ConfigError as err:
            set_state(run_dir, "failed")
            _out(f"hfl-launch: invalid experiment: {err}", err=True)
            return 2
    else:
        outcome = Supervisor(exp, plans, progress=not args.quiet, start_method=start).run()
        if "interrupted" in outcome.failures and "hfl.launch.zygote" in sys.modules:
            # The template ignores Ctrl-C: if it is still importing torch it would hold
            # the terminal (and a pipe such as `| tee log`) until it finished, for nobody.
            sys.modules["hfl.launch.zygote"].stop_template()
    state = ("interrupted" if "interrupted" in outcome.failures
             else "failed" if outcome.failures else "finished")
    try:  # (a run directory deleted or made read-only meanwhile: one line, and the table)
        set_state(run_dir, state, failures=outcome.failures)
    except OSError as exc:
        _out(f"hfl-launch: cannot record the run's state in {run_dir}/launch.json: "
             f"{exc.strerror or exc}", err=True)
    rows = [peer_row(p.id, p.config.model.arch, Path(p.config.run_dir)) for p in plans]
    rows.append(mean_row(rows))
    best = best_mean([Path(p.config.run_dir) for p in plans])
    round_one = round_one_after([Path(p.config.run_dir) for p in plans], args.started_at)
    try:
        table = write_results(run_dir, rows, {
            "experiment": exp.name, "wall_time_s": outcome.wall_time_s, "ok": outcome.ok,
            "command_s": time.time() - args.started_at, "round_1_after_s": round_one,
            "best_mean_test_acc": best, "failures": outcome.failures, "events": outcome.events,
        })
    except OSError as exc:
        from hfl.launch.results import render_table

        _out(f"hfl-launch: cannot write the results into {run_dir}: {exc.strerror or exc}; "
             "the table as read:", err=True)
        table = render_table(rows)
    try:
        from hfl.launch.plots import plot_run

        plot_run(run_dir, [(p.id, Path(p.config.run_dir)) for p in plans])
    except Exception as exc:  # a plot must never cost the results
        _out(f"hfl-launch: no plots ({type(exc).__name__}: {exc})", err=True)
    if any(r.get("rounds", 0) for r in rows[:-1]):
        _out()
        _out(table)
        _out("\nbest mean test acc over rounds (the peers' mean in one round, best round): "
             + ("- (no round with every peer's test acc)" if math.isnan(best) else f"{best:.4f}"))
    else:
        _out("\nno peer finished a round: no results table (see the errors above and each peer.log)")
    started = (f" (the command's {time.time() - args.started_at:.1f}s; every peer in round 1 "
               f"after {round_one:.1f}s)" if round_one is not None else "")
    _out(f"\nwall time {outcome.wall_time_s:.1f}s{started}; results in {run_dir}/results.md")
    if outcome.failures:
        _out("FAILED: " + "; ".join(outcome.failures), err=True)
        return 130 if "interrupted" in outcome.failures else 1
    return 0


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return None


def busy_machine_warning(peers: int, load: float | None, cores: int | None) -> str | None:
    """What to expect of start-up when the machine is already busy (runnable processes
    beyond its cores), or None: until every peer has imported PyTorch, loaded its data
    and joined, nothing else is printed, and on a loaded machine that is minutes."""
    if load is None or not cores or load < cores:
        return None
    return (f"this machine is busy (load {load:.1f} on {cores} cores): starting {peers} peers "
            "(PyTorch, data, models) can take minutes before round 1, during which the "
            "progress line shows each peer 'joining k/n'")


def _check_data_files(plans) -> None:
    from hfl.peer.check import check_data_files
    from hfl.peer.configtools import ConfigError

    for p in plans:
        try:
            check_data_files(p.config)
        except ConfigError as err:
            raise err.with_source(f"peer {p.id}") from None


def _refuse_a_sharing_cohort_of_one(plans) -> None:
    """One peer of a method that shares trains alone and then fails ("finished without
    its cohort", exit 3) after its whole run: say so before it starts."""
    if len(plans) != 1 or plans[0].config.node.allow_solo:
        return
    from hfl.algorithms.registry import get_algorithm
    from hfl.peer.configtools import ConfigError

    cfg = plans[0].config
    if get_algorithm(cfg.cohort.algorithm).mode != "local":
        raise ConfigError("peers", f"got 1 peer running {cfg.cohort.algorithm}, a method that "
                          "shares with peers: it would train alone, then end with exit status 3 "
                          "(finished without its cohort); use peers >= 2, or --allow-solo "
                          "(node.allow_solo: true) to train alone")


def check_plans(plans, deep: bool, devices_here: bool = True) -> dict[str, str]:
    """Every peer's algorithm options, architecture and data files (``deep``: also open
    its data and build its model, as the peer will; on the CPU unless ``devices_here``,
    for peers that run elsewhere, e.g. SLURM's GPU nodes). Raises ConfigError naming
    the peer. ``deep``: returns each peer's description (samples, shapes, classes,
    model), as ``hfl-peer --check`` prints it."""
    import dataclasses

    from hfl.peer.check import (
        check_options,
        check_peer,
        disagreement,
        handshake_terms,
        robust_fits_the_cohort,
    )
    from hfl.peer.configtools import ConfigError

    seen: set[str] = set()
    terms: dict[str, dict] = {}
    described: dict[str, str] = {}
    for p in plans:
        cfg = p.config
        if not devices_here:
            cfg = dataclasses.replace(cfg, node=dataclasses.replace(cfg.node, device="cpu"))
        try:
            if deep:
                described[p.id] = check_peer(cfg, terms.setdefault(p.id, {}),
                                             keys=not p.cohort_key)
            else:
                terms[p.id] = handshake_terms(cfg)
                key = repr((cfg.cohort, cfg.algorithm, cfg.model.arch, cfg.model.options,
                            cfg.data.dataset, cfg.data.path))
                if not p.cohort_key:  # (the cohort's keys: made by write_plans)
                    cfg.identity()
                if key not in seen:
                    seen.add(key)
                    check_options(cfg, keys=False)
        except Exception as err:
            if isinstance(err, ConfigError):
                raise err.with_source(f"peer {p.id}") from None
            # a check that missed a case: named, one line, not a traceback
            raise ConfigError("", f"peer {p.id}: cannot build this peer from its config: "
                                  f"{type(err).__name__}: {str(err)[:300]}") from err
    _refuse_a_sharing_cohort_of_one(plans)
    checked: set[str] = set()
    for p in plans:  # (once per distinct algorithm section: peer overrides may set one)
        if (key := repr((p.config.cohort.algorithm, p.config.algorithm))) not in checked:
            checked.add(key)
            try:
                robust_fits_the_cohort(p.config, len(plans))
            except ConfigError as err:
                raise err.with_source(f"peer {p.id}") from None
    _resolve_num_classes(plans, terms)
    problem = disagreement(terms)  # what every peer's hello would refuse, at once
    if problem is not None:
        raise problem
    return described


def _resolve_num_classes(plans, terms: dict[str, dict]) -> None:
    """Where some peers set cohort.num_classes and others take it from their data, read
    the data of the others (once per data config) so a mismatch is found now."""
    field = "cohort.num_classes"
    if all(t.get(field) is None for t in terms.values()) or all(t.get(field) for t in terms.values()):
        return
    from hfl.peer.factory import load_peer_data

    known: dict[str, int] = {}
    for p in plans:
        if terms[p.id].get(field) is None:
            key = repr(p.config.data)
            if key not in known:
                known[key] = load_peer_data(p.config.data).num_classes
            terms[p.id][field] = known[key]


if __name__ == "__main__":
    sys.exit(main())
