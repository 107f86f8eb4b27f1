"""``hfl-launch --on slurm`` against stand-in SLURM commands (small shell scripts on
PATH that answer as sbatch, scontrol and scancel do): what sbatch's failures mean,
the nodes' set-up lines, and ``--detach`` (submit, leave, follow later). No daemon
and no process is started, so nothing can be left behind; the real cluster is
tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from hfl.launch.cli import main
from hfl.launch.slurm import sbatch_cause

pytestmark = pytest.mark.timeout(120)


def experiment(tmp_path: Path, **slurm) -> Path:
    exp = {"name": "onslurm", "peers": 2, "run_dir": str(tmp_path / "run"), "slurm": slurm,
           "defaults": {"cohort": {"algorithm": "fedavg", "rounds": 2},
                        "data": {"dataset": "digits", "partition": "iid"},
                        "model": {"arch": "mlp", "options": {"hidden": [16]}}}}
    path = tmp_path / "onslurm.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch (prints job 4242, counts its calls; fails with $FAKE_SBATCH_ERROR if set),
    scontrol (the job's state from a file), scancel (recorded)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "job_state"
    state.write_text("PENDING")
    scripts = {
        "sbatch": f'echo x >> {tmp_path}/sbatch_calls\n'
                  'if [ -n "$FAKE_SBATCH_ERROR" ]; then echo "$FAKE_SBATCH_ERROR" >&2; exit 1; fi\n'
                  'echo 4242',
        "scontrol": f'echo "JobId=4242 JobName=hfl JobState=$(cat {state}) Reason=None"',
        "scancel": f'echo "$@" >> {tmp_path}/scancel_calls',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def sbatch_calls(tmp_path: Path) -> int:
    calls = tmp_path / "sbatch_calls"
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def record(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "launch.json").read_text())


def peers_ended(tmp_path: Path, status: int, rounds=(1, 2)) -> None:
    """What the job's tasks leave behind: each peer's metrics (``rounds``) and exit status."""
    for pid in ("p0", "p1"):
        d = tmp_path / "run" / pid
        d.mkdir(parents=True, exist_ok=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(
            {"peer": pid, "round": r, "time": 1000.0 + r, "round_time_s": 0.5, "test_acc": 0.5,
             "global_acc": 0.5, "bytes_sent": 100, "bytes_received": 100, "incarnation": 0})
            + "\n" for r in rounds))
        (d / "exit_status").write_text(f"{status}\n")


@pytest.mark.parametrize(("error", "needle"), [
    ("sbatch: fatal: Could not establish a configuration source", "no cluster configured"),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", "sinfo -s"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "slurm.cpus_per_task, slurm.gpus_per_task"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition "
     "combination specified", "sacctmgr"),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
     "slurmctld does not answer"),
])
def test_an_sbatch_failure_is_one_line_with_its_cause(fake_slurm, capsys, monkeypatch, error, needle):
    monkeypatch.setenv("FAKE_SBATCH_ERROR", error)
    assert main([str(experiment(fake_slurm)), "--on", "slurm", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    line = next(x for x in err if x.startswith("hfl-launch: submitting the job"))
    assert error.split(": ", 1)[-1][:30] in line and needle in line
    assert record(fake_slurm)["state"] == "failed"


def test_an_unknown_sbatch_failure_still_says_what_sbatch_said():
    assert sbatch_cause("sbatch: error: something new") is None


def test_setup_lines_run_before_the_tasks_and_a_peer_has_its_tasks_cores(tmp_path, capsys):
    path = experiment(tmp_path, cpus_per_task=3,
                      setup=["module load python/3.11", "source /shared/venv/bin/activate"])
    assert main([str(path), "--on", "slurm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.index("module load python/3.11") < out.index("source /shared/venv") < out.index("exec srun")
    assert "set -e" in out
    # Its task's 3 cores, not a share of the login node's.
    assert yaml.safe_load((tmp_path / "run" / "peers" / "p0.yaml").read_text())["node"]["threads"] == 3


@pytest.mark.parametrize(("slurm", "needle"), [
    # each went into the #SBATCH lines as given (a launcher review): a line break put a
    # shell line in the script and sbatch stopped reading options there (the time limit
    # lost); a space made more options; sbatch options hfl sets itself overrode them
    ({"partition": "cpu\ntouch /tmp/x"}, "slurm: partition: got 'cpu\\ntouch /tmp/x'; one "
                                         "sbatch value: no spaces"),
    ({"time": "00:20:00 --account=x"}, "slurm: time: got '00:20:00 --account=x'"),
    ({"time": "2h"}, "slurm: time: got '2h'; sbatch --time takes minutes"),
    ({"sbatch": ["--ntasks=2"]}, "slurm: sbatch[0]: got '--ntasks=2'; hfl-launch sets --ntasks"),
    ({"sbatch": ["--account=lab", "-c4"]}, "sbatch[1]: got '-c4'; hfl-launch sets -c itself: use "
                                           "slurm.cpus_per_task"),
    ({"sbatch": ["--gres=gpu:1"]}, "hfl-launch asks for GPUs itself, and places each peer on "
                                   "its task's: use slurm.gpus_per_task"),
    ({"sbatch": ["--account=lab\n--ntasks=2"]}, "sbatch[0]: got '--account=lab\\n--ntasks=2'; "
                                                 "one sbatch option a line"),
    # (sbatch takes a long option by a unique prefix; -e sends the errors away from the
    # log hfl-launch reads; a review of these checks)
    ({"sbatch": ["--part=debug"]}, "hfl-launch sets --partition itself: use slurm.partition"),
    ({"sbatch": ["--cpus-per-gpu=4"]}, "use slurm.cpus_per_task"),
    ({"sbatch": ["--error=x.err"]}, "hfl-launch reads the job's errors from its --output log"),
    ({"sbatch": ["-A lab -n 2"]}, "sbatch[0]: got '-A lab -n 2'; hfl-launch sets -n itself"),
    ({"sbatch": ["--gres gpu:1"]}, "hfl-launch asks for GPUs itself"),
    ({"sbatch": ["--tres-per-task=gres/gpu:1"]}, "hfl-launch asks for GPUs itself"),
    ({"sbatch": ["--tres-per-task=cpu=4,gres/gpu=1"]}, "hfl-launch asks for GPUs itself"),
    ({"sbatch": ["--gpus-per-socket=1"]}, "hfl-launch asks for GPUs itself"),
    ({"gpu_type": "a100"}, "gpu_type: got 'a100' with gpus_per_task 0"),
    ({"python": "--export=NONE"}, "slurm: python: got '--export=NONE'"),
])
def test_a_slurm_value_that_would_change_the_batch_script_is_refused(tmp_path, capsys, slurm,
                                                                      needle):
    assert main([str(experiment(tmp_path, **slurm)), "--on", "slurm", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


def test_the_batch_script_takes_sbatch_values_and_run_folders_as_they_are(tmp_path, capsys,
                                                                           monkeypatch):
    # What is fine stays fine: options of their own, a --gres that is no GPU, sbatch's
    # time forms. A task's cores are 1 by default, not the login node's cores / peers
    # (16 with 4 peers on a 64-core login node, then asked of every task: a review).
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    path = experiment(tmp_path, time="1-02:00", partition="gpu,cpu",
                      sbatch=["--account=lab", "--gres=nvme:1", "--qos=normal", "-J x",
                              "--gres=tmpgpuscratch:10", "--mem=4G", "--constraint=a100&ib"])
    assert main([str(path), "--on", "slurm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for line in ("--time=1-02:00", "--partition=gpu,cpu", "--gres=nvme:1", "--cpus-per-task=1",
                 "-J x", "--gres=tmpgpuscratch:10", "--constraint=a100&ib"):
        assert f"#SBATCH {line}\n" in out, out
    # a GPU type goes with the GPUs hfl-launch asks for (--gres=gpu:a100:1 is refused)
    typed = experiment(tmp_path, gpus_per_task=1, gpu_type="a100")
    assert main([str(typed), "--on", "slurm", "--dry-run"]) == 0
    assert "#SBATCH --gpus-per-task=a100:1\n" in capsys.readouterr().out
    # a % is sbatch's pattern character (the log went to a folder that is not there)
    odd = tmp_path / "100%x"
    assert main([str(path), "--on", "slurm", "--dry-run", "--run-dir", str(odd)]) == 0
    assert f"#SBATCH --output={tmp_path}/100%%x/slurm-%j.out\n" in capsys.readouterr().out
    # a space cannot be in an #SBATCH line (sbatch: "Invalid directive found")
    assert main([str(path), "--on", "slurm", "--dry-run", "--run-dir", str(tmp_path / "a b")]) == 2
    assert "run_dir: got" in capsys.readouterr().err


@pytest.mark.parametrize("example", ["slurm_cpu", "slurm_gpu"])
def test_the_example_experiments_make_a_batch_script(tmp_path, capsys, example):
    root = Path(__file__).resolve().parent.parent
    assert main([str(root / "examples" / f"{example}.yaml"), "--on", "slurm", "--dry-run",
                 "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --ntasks=" in out and "-m hfl.launch.slurm task" in out
    assert ("#SBATCH --gpus-per-task=1" in out) == (example == "slurm_gpu")


def test_detach_submits_and_returns_and_the_same_command_follows_the_job(fake_slurm, capsys):
    path = str(experiment(fake_slurm))
    assert main([path, "--on", "slurm", "--detach", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "submitted SLURM job 4242" in out and "run the same command again" in out
    assert sbatch_calls(fake_slurm) == 1
    assert record(fake_slurm)["state"] == "running" and record(fake_slurm)["slurm_job"] == "4242"

    # While it runs, the login session may end; later the job has completed.
    peers_ended(fake_slurm, 0)
    (fake_slurm / "job_state").write_text("COMPLETED")
    assert main([path, "--on", "slurm", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "following SLURM job 4242" in out and "| p0" in out
    assert sbatch_calls(fake_slurm) == 1  # followed, not submitted again
    assert record(fake_slurm)["state"] == "finished"
    assert (fake_slurm / "run" / "results.json").exists()


def test_a_detached_job_that_was_cancelled_is_resubmitted_to_continue(fake_slurm, capsys):
    path = str(experiment(fake_slurm))
    assert main([path, "--on", "slurm", "--detach", "--quiet"]) == 0
    peers_ended(fake_slurm, 143, rounds=(1,))  # stopped by scancel's SIGTERM after round 1
    (fake_slurm / "job_state").write_text("CANCELLED")
    assert main([path, "--on", "slurm", "--detach", "--quiet"]) == 0
    assert sbatch_calls(fake_slurm) == 2
    assert "submitted SLURM job 4242" in capsys.readouterr().out


def test_detach_needs_slurm(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(experiment(tmp_path)), "--detach"])
    assert "--detach: only with --on slurm" in capsys.readouterr().err


def test_a_job_still_running_is_not_deleted_by_fresh_nor_run_again_here(fake_slurm, capsys):
    # A review: with a detached job RUNNING, --fresh deleted the folder it writes into
    # and submitted a second job beside it (no scancel), and a launch on this machine
    # would have run the cohort twice. Both are refused while the job is queued or runs.
    path = str(experiment(fake_slurm))
    assert main([path, "--on", "slurm", "--detach", "--quiet"]) == 0
    before = (fake_slurm / "run" / "launch.json").read_text()
    capsys.readouterr()
    for state in ("PENDING", "RUNNING"):
        (fake_slurm / "job_state").write_text(state)
        for flags in (["--on", "slurm", "--fresh"], ["--fresh"], []):
            assert main([path, "--quiet", *flags]) == 2, (state, flags)
            err = capsys.readouterr().err
            assert f"its SLURM job 4242 is still {state.lower()}" in err
            assert ("scancel 4242 first" in err and ("without --fresh" in err) == ("--fresh" in flags))
            assert (fake_slurm / "run" / "launch.json").read_text() == before
        # A dry run says so (it said --fresh would delete the folder and start anew), and
        # exits as the launch would (0 said it would run, a review).
        assert main([path, "--quiet", "--dry-run", "--fresh"]) == 2
        assert "a launch would be refused" in capsys.readouterr().out
    assert sbatch_calls(fake_slurm) == 1
    # Once it ended, --fresh starts over (here: submits anew).
    (fake_slurm / "job_state").write_text("CANCELLED")
    assert main([path, "--on", "slurm", "--fresh", "--detach", "--quiet"]) == 0
    assert sbatch_calls(fake_slurm) == 2


def a_job_that_ran_every_round(fake_slurm) -> str:
    """Submitted detached; its peers ran both rounds and the job completed. The path
    of its experiment."""
    path = str(experiment(fake_slurm))
    assert main([path, "--on", "slurm", "--detach", "--quiet"]) == 0
    peers_ended(fake_slurm, 0)
    (fake_slurm / "job_state").write_text("COMPLETED")
    return path


def test_resume_of_a_finished_job_is_refused_and_submits_nothing(fake_slurm, capsys):
    # Left from stop 54: --on slurm --resume of a run whose every round ran submitted a
    # job whose peers had nothing to do (a local --resume is refused, naming the rounds).
    path = a_job_that_ran_every_round(fake_slurm)
    assert main([path, "--on", "slurm", "--quiet"]) == 0  # followed: results collected
    assert record(fake_slurm)["state"] == "finished"
    capsys.readouterr()
    assert main([path, "--on", "slurm", "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "ran round 2 already" in err and "defaults.cohort.rounds=12" in err
    assert sbatch_calls(fake_slurm) == 1
    assert record(fake_slurm)["state"] == "finished"
    # More rounds continue it: submitted as a new job.
    assert main([path, "--on", "slurm", "--resume", "--detach", "--quiet",
                 "--set", "defaults.cohort.rounds=3"]) == 0
    assert sbatch_calls(fake_slurm) == 2


def test_resume_of_a_job_nobody_collected_follows_it(fake_slurm, capsys):
    # (All its rounds ran, but the launch that submitted it never collected them.)
    path = a_job_that_ran_every_round(fake_slurm)
    assert main([path, "--on", "slurm", "--resume", "--quiet"]) == 0
    assert "following SLURM job 4242" in capsys.readouterr().out
    assert sbatch_calls(fake_slurm) == 1 and record(fake_slurm)["state"] == "finished"
