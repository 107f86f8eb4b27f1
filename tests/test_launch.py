"""The launcher's pure parts: expanding an experiment, GPU and thread placement,
fault targeting, the results table. (Real processes: test_e2e.py.)"""

from __future__ import annotations

import json
import math
import os
import time

import pytest
import yaml

from hfl.launch.experiment import ExperimentConfig, aggregator_of, expand, load_experiment
from hfl.launch.results import best_mean, mean_row, peer_row, render_table, write_results
from hfl.peer.config import load_config
from hfl.peer.configtools import ConfigError, build


def make(tmp_path, **over) -> ExperimentConfig:
    data = {
        "name": "t",
        "peers": 4,
        "run_dir": str(tmp_path / "run"),
        "defaults": {"cohort": {"algorithm": "fedavg", "rounds": 3}},
        **over,
    }
    return build(ExperimentConfig, data)


def test_expand_gives_each_peer_an_id_port_bootstrap_partition_and_run_dir(tmp_path):
    plans = expand(make(tmp_path), gpus=[], ports=[7000, 7001, 7002, 7003])
    assert [p.id for p in plans] == ["p0", "p1", "p2", "p3"]
    listens = [p.config.node.listen for p in plans]
    assert listens == [f"tcp://127.0.0.1:{7000 + i}" for i in range(4)]
    assert plans[0].config.node.bootstrap == ("p1@tcp://127.0.0.1:7001",)
    assert all(p.config.node.bootstrap == ("p0@tcp://127.0.0.1:7000",) for p in plans[1:])
    assert [p.config.data.partition_index for p in plans] == [0, 1, 2, 3]
    assert all(p.config.data.num_partitions == 4 and p.config.node.min_peers == 4 for p in plans)
    assert all(p.config.cohort.name == "t" for p in plans)
    # The written file is a valid peer config that loads back to the same thing.
    for p in plans:
        assert load_config(str(p.config_path)) == p.config
        assert p.config.run_dir == str(tmp_path / "run" / p.id)


def test_a_launched_run_has_one_id_for_every_peer_kept_on_resume_and_new_when_fresh(tmp_path):
    # Every signature binds to the run's id (cohort.run): a member cannot replay one
    # from another run of the cohort under the same keys (an attack review).
    from hfl.launch.experiment import run_id_of

    run_dir = tmp_path / "run"
    run = run_id_of(run_dir)
    assert 0 < run <= 2**62 and run_id_of(run_dir) == run  # a resume reads it back
    # A dry run reads it and writes none (it set 0 in a live run's configs: a review)
    assert run_id_of(run_dir, create=False) == run
    assert run_id_of(tmp_path / "elsewhere", create=False) == 0
    assert not (tmp_path / "elsewhere").exists()
    plans = expand(make(tmp_path), gpus=[], ports=[7000, 7001, 7002, 7003], run=run)
    assert {p.config.cohort.run for p in plans} == {run}
    assert all(load_config(str(p.config_path)).cohort.run == run for p in plans)
    (run_dir / "run_id").unlink()  # --fresh deletes the run directory: a new run
    assert run_id_of(run_dir) != run
    # The simulator and the benchmarks expand without one: no run id, as before.
    assert {p.config.cohort.run for p in expand(make(tmp_path), gpus=[], ports=[7000, 7001,
                                                                               7002, 7003])} == {0}


def test_gpus_are_assigned_round_robin_one_visible_device_per_peer(tmp_path):
    plans = expand(make(tmp_path, peers=5), gpus=["0", "1"], ports=list(range(7000, 7005)))
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["0", "1", "0", "1", "0"]
    assert all(p.config.node.device == "cuda:0" for p in plans)
    # The round robin turns over the peers that use a GPU, and cuda:N names the launch's
    # GPU N (a review: p1 on the CPU left GPU 1 idle and put p0 and p2 on GPU 0; cuda:1
    # became the round robin's cuda:0 without a word).
    exp = make(tmp_path, peers=4, peer_overrides={"p1": {"node": {"device": "cpu"}},
                                                  "p3": {"node": {"device": "cuda:0"}}})
    plans = expand(exp, gpus=["0", "1"], ports=list(range(7000, 7004)))
    # (p3 pinned to GPU 0 counts from the start: the others fill GPU 1 first; the round
    # robin put p0, p2 and p3 on GPU 0, a review)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["1", "", "0", "0"]
    pinned = make(tmp_path, peers=4, peer_overrides={"p0": {"node": {"device": "cuda:0"}}})
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in expand(
        pinned, gpus=["0", "1"], ports=list(range(7000, 7004)))] == ["0", "1", "0", "1"]
    # cuda:N in the defaults is every peer's: spread, not all on GPU N (a review)
    every = make(tmp_path, peers=3, defaults={"cohort": {"algorithm": "fedavg", "rounds": 3},
                                              "node": {"device": "cuda:1"}})
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in expand(
        every, gpus=["0", "1"], ports=[7000, 7001, 7002])] == ["0", "1", "0"]
    with pytest.raises(ConfigError, match=r"peer_overrides\.p3\.node\.device: got 'cuda:2'.*"
                                          r"cuda:0 to cuda:1"):
        expand(make(tmp_path, peers=4, peer_overrides={"p3": {"node": {"device": "cuda:2"}}}),
               gpus=["0", "1"], ports=list(range(7000, 7004)))


def test_gpus_named_outside_the_shells_visible_devices_are_refused(tmp_path, monkeypatch):
    # A launcher review: with CUDA_VISIBLE_DEVICES=2,3 (a job's GPUs, a shared box),
    # devices: 0,1 put the peers on GPUs 0 and 1 without a word.
    from hfl.launch.experiment import detect_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert detect_gpus("auto") == ["2", "3"] and detect_gpus("3") == ["3"]
    with pytest.raises(ConfigError, match=r"devices: got '0,3', but this shell may use only "
                                          r"CUDA_VISIBLE_DEVICES='2,3' \(0 left out\)"):
        detect_gpus("0,3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus("auto") == []
    with pytest.raises(ConfigError, match="0 left out"):
        detect_gpus("0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert detect_gpus("0,1") == ["0", "1"]
    # CUDA ignores what follows an invalid entry: "0,-1,1" is GPU 0 only (GPU 1 was used)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,-1,1")
    assert detect_gpus("auto") == ["0"]
    # devices: cpu keeps every peer there: a peer asking for cuda is refused (it took the
    # launcher's GPUs)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    exp = make(tmp_path, devices="cpu", peer_overrides={"p1": {"node": {"device": "cuda:1"}}})
    with pytest.raises(ConfigError, match=r"devices: cpu keeps every peer on the CPU, but peer "
                                          r"p1's node.device is 'cuda:1'"):
        expand(exp, ports=[7000, 7001, 7002, 7003])


def test_an_in_process_cohort_spreads_its_peers_over_the_gpus(tmp_path, monkeypatch):
    # A launcher review: in one process every peer ran on cuda:0 (the launcher's spread
    # lives in each process's CUDA_VISIBLE_DEVICES, which one process cannot have per peer).
    from hfl.launch.inprocess import in_memory

    plans = expand(make(tmp_path, peers=5, peer_overrides={"p1": {"node": {"device": "cpu"}}}),
                   gpus=["2", "3"], ports=list(range(7000, 7005)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")  # this process's cuda:0 is GPU 3
    assert [p.config.node.device for p in in_memory(plans)] == [
        "cuda:1", "cpu", "cuda:0", "cuda:1", "cuda:0"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert [p.config.node.device for p in in_memory(plans)] == [
        "cuda:2", "cpu", "cuda:3", "cuda:2", "cuda:3"]


def test_resume_refuses_a_change_only_for_peers_with_a_checkpoint(tmp_path):
    # A review: --resume refused another model or data for a peer that had no checkpoint
    # (one that failed before its first round, say with the very data being fixed).
    from hfl.peer.checkpoint import CHECKPOINT_NAME

    expand(make(tmp_path, peers=2), gpus=[], ports=[7000, 7001])
    changed = make(tmp_path, peers=2, peer_overrides={"p1": {"data": {"seed": 7}}})
    assert [p.id for p in expand(changed, gpus=[], ports=[7000, 7001], resume=True,
                                 write=False)] == ["p0", "p1"]
    (tmp_path / "run" / "p1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "run" / "p1" / CHECKPOINT_NAME).write_bytes(b"trained")
    with pytest.raises(ConfigError, match=r"peer p1's checkpoint .*data.seed: 0 -> 7"):
        expand(changed, gpus=[], ports=[7000, 7001], resume=True, write=False)


def test_without_gpus_peers_run_on_cpu_and_share_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    plans = expand(make(tmp_path), gpus=[], ports=[7000, 7001, 7002, 7003])
    assert all(p.config.node.device == "cpu" for p in plans)
    assert all(p.env["CUDA_VISIBLE_DEVICES"] == "" for p in plans)
    assert all(p.config.node.threads == 2 and p.env["OMP_NUM_THREADS"] == "2" for p in plans)


def test_peer_overrides_deep_merge_over_the_defaults(tmp_path):
    exp = make(tmp_path, defaults={"cohort": {"rounds": 3}, "model": {"arch": "mlp", "embedding_dim": 32}},
               peer_overrides={"p2": {"model": {"arch": "lenet"}}})
    plans = expand(exp, gpus=[], ports=[7000, 7001, 7002, 7003])
    assert [p.config.model.arch for p in plans] == ["mlp", "mlp", "lenet", "mlp"]
    assert all(p.config.model.embedding_dim == 32 for p in plans)


def test_faults_target_the_rotations_aggregator_and_reach_only_that_peer(tmp_path):
    exp = make(tmp_path, defaults={"cohort": {"algorithm": "fedavg", "rounds": 8}},
               faults=[{"peer": "aggregator", "at_round": 3, "phase": "serve"},
                       {"peer": "p1", "at_round": 5, "restart_at_round": 7}])
    assert aggregator_of(exp.peer_ids(), 3) == "p3"
    plans = {p.id: p for p in expand(exp, gpus=[], ports=[7000, 7001, 7002, 7003])}
    assert plans["p3"].config.fault.crash_at_round == 3
    assert plans["p3"].config.fault.crash_phase == "serve"
    assert plans["p1"].config.fault.crash_at_round == 5
    assert plans["p0"].config.fault.crash_at_round is None


@pytest.mark.parametrize(("over", "path", "needle"), [
    ({"faults": [{"peer": "p9", "at_round": 2}]}, "faults[0].peer", "allowed"),
    ({"faults": [{"peer": "p1", "at_round": 4, "restart_at_round": 3}]}, "faults[0]", "restart_at_round"),
    ({"faults": [{"peer": "p3", "at_round": 2}, {"peer": "aggregator", "at_round": 3}]},
     "faults[1].peer", "one fault per peer"),
    ({"peer_overrides": {"q1": {}}}, "peer_overrides.q1", "no such peer"),
    ({"faults": [{"peer": "p1", "at_round": 4}]},
     "faults[0].at_round", "got 4 but the cohort runs 3 rounds: the crash would never happen"),
    ({"peers": 0}, "peers", ">= 1"),
])
def test_bad_experiments_name_the_field(tmp_path, over, path, needle):
    with pytest.raises(ConfigError) as err:
        make(tmp_path, **over)
    assert err.value.path == path and needle in str(err.value)


def test_a_bad_peer_section_names_the_peer_and_field(tmp_path):
    exp = make(tmp_path, peer_overrides={"p1": {"timing": {"round_timeout_s": -1}}})
    with pytest.raises(ConfigError) as err:
        expand(exp, gpus=[], ports=[7000, 7001, 7002, 7003])
    # named where the experiment sets it: the peer's overrides, not the expanded config
    assert "peer p1" in str(err.value) and err.value.path == "peer_overrides.p1.timing.round_timeout_s"
    exp = make(tmp_path, defaults={"cohort": {"algorithm": "fedavg", "communicate_every": 0}})
    with pytest.raises(ConfigError) as err:
        expand(exp, gpus=[], ports=[7000, 7001, 7002, 7003])
    assert err.value.path == "defaults.cohort.communicate_every"


def test_load_experiment_applies_overrides_and_names_the_file(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "peers": 2}))
    assert load_experiment(str(path), ["peers=6"]).peers == 6
    with pytest.raises(ConfigError) as err:
        load_experiment(str(path), ["peers=zero"])
    assert str(path) in str(err.value)


def test_results_rows_and_mean_from_metrics_files(tmp_path):
    for pid, accs in (("p0", [0.5, 0.9, 0.8]), ("p1", [0.6, 0.7])):
        d = tmp_path / pid
        d.mkdir()
        lines = [{"round": i + 1, "time": 100.0 + 2 * i, "test_acc": a, "global_acc": a, "round_time_s": 1.0,
                  "bytes_sent": 1_000_000, "bytes_received": 500_000, "incarnation": 0}
                 for i, a in enumerate(accs)]
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines)
                                         + "\nnull\n[1]\n{\"round\": \"9\"}\nnot json\n")  # none a round
    rows = [peer_row("p0", "mlp", tmp_path / "p0"), peer_row("p1", "mlp", tmp_path / "p1"),
            peer_row("p2", "mlp", tmp_path / "p2")]  # p2 never wrote anything
    assert rows[0]["rounds"] == 3 and rows[0]["global_acc"] == 0.8 and rows[0]["best_global_acc"] == 0.9
    assert rows[0]["sent_mb"] == pytest.approx(3.0)
    assert rows[0]["wall_s"] == pytest.approx(5.0)  # rounds start at 100, 102, 104 and last 1 s
    assert rows[2]["rounds"] == 0 and math.isnan(rows[2]["global_acc"])
    # The mean is over the peers that reached the last round: p1 stopped after round 2
    # (a crash with no restart) was averaged in with its round-2 numbers beside p0's
    # round-3 ones, without a word (a review of the results); the silent p2 is no zero.
    mean = mean_row(rows)
    assert mean["global_acc"] == pytest.approx(0.8) and mean["over"] == ["p0"]
    table = render_table([*rows, mean])
    assert table.splitlines()[0].startswith("| peer") and "| mean" in table and " - " in table
    assert ("stopped before round 3: p1 (round 2), p2 (round 0); the mean row and the best "
            "mean are over the 1 peer(s) that reached it") in table
    assert best_mean([tmp_path / p for p in ("p0", "p1", "p2")]) == pytest.approx(0.9)
    assert "took part in fewer" not in table
    # A peer that reached the last round with a gap (restarted: no line for the round it
    # died in) is named too: its 2 of 3 rounds read as a failure beside those named above.
    gap = tmp_path / "gap"
    gap.mkdir()
    (gap / "metrics.jsonl").write_text("".join(json.dumps(
        {"round": r, "time": 100.0 + 2 * r, "round_time_s": 1.0, "test_acc": 0.5,
         "incarnation": int(r == 3)}) + "\n" for r in (1, 3)))
    table = render_table([rows[0], peer_row("p3", "mlp", gap)])
    assert "took part in fewer than the 3 rounds: p3 (2); restarted peers have no line" in table
    assert "learned from no other peer" not in table
    # Rounds with no result (learned from no one) are named, the last above all: the
    # table said nothing of a last round without a result (a review)
    (gap / "metrics.jsonl").write_text("".join(json.dumps(
        {"round": r, "time": 100.0 + 2 * r, "round_time_s": 1.0, "test_acc": 0.5,
         "learned_from": int(r < 3)}) + "\n" for r in (1, 2, 3)))
    table = render_table([peer_row("p3", "mlp", gap)])
    assert ("rounds that learned from no other peer (no result taken, no member's knowledge: "
            "the peer's own step only): p3 1 (the last round among them)") in table


def test_a_failed_seed_is_named_and_left_out_of_the_mean_over_seeds():
    # A seed whose launch failed (its peers stopped short) was averaged in like a good
    # one, named only in a note under the mean it had moved.
    from hfl.launch.results import render_seeds_table, seeds_counted, seeds_summary

    per_seed = {0: {"test_acc": 0.9, "rounds": 5.0}, 1: {"test_acc": 0.1, "rounds": 2.0,
                "failed": "its launch failed (exit 1; ...)"}, 2: {"test_acc": 0.8, "rounds": 5.0}}
    assert seeds_counted(per_seed) == [0, 2]
    summary = seeds_summary(per_seed)
    assert summary["mean"]["test_acc"] == pytest.approx(0.85)
    assert summary["std"]["test_acc"] == pytest.approx(math.sqrt(0.005))
    table = render_seeds_table(per_seed)
    assert "| mean ± std (2 of 3 seeds) | 0.8500 ± 0.0707 | 5.0 ± 0.0" in table
    assert [c.strip() for c in table.splitlines()[3].split("|")[1:3]] == ["1", "0.1000"]  # shown
    assert "seed 1: its launch failed (exit 1; ...); left out of the mean" in table
    every = render_seeds_table({s: r for s, r in per_seed.items() if s != 1})
    assert "| mean ± std (2) |" in every  # all counted: the label as before


def test_bytes_are_each_lifes_running_total_not_only_what_its_rounds_counted():
    # A round's bytes_received leaves out what arrived between rounds (the next round's
    # early knowledge): four peers that each received the same showed up to 29 % apart.
    from hfl.launch.results import life_bytes

    recs = [{"round": 1, "incarnation": 0, "bytes_received": 10, "total_bytes_received": 15},
            {"round": 2, "incarnation": 0, "bytes_received": 10, "total_bytes_received": 40},
            {"round": 3, "incarnation": 1, "bytes_received": 7, "total_bytes_received": 9},
            {"round": 4, "incarnation": 2, "bytes_received": 5}]  # (an older line: no total)
    assert life_bytes(recs, "received") == 40 + 9 + 5


def test_a_diverged_peer_is_named_and_results_json_is_strict(tmp_path):
    # lr 1e5: train_loss NaN every round, exit 0, no word, a normal-looking table; and
    # results.json held bare NaN tokens (every run's sel_* fields) that strict JSON
    # readers refuse (a review of the results).
    for pid, loss in (("p0", 0.5), ("p1", float("nan"))):
        d = tmp_path / pid
        d.mkdir()
        lines = [{"round": r, "time": 100.0 + r, "test_acc": 0.5, "round_time_s": 1.0,
                  "train_loss": loss if r > 1 else 0.7} for r in (1, 2, 3)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = [peer_row(p, "mlp", tmp_path / p) for p in ("p0", "p1")]
    rows.append(mean_row(rows))
    table = write_results(tmp_path, rows, {"best_mean_test_acc": float("nan")})
    assert "training diverged (a non-finite train_loss): p1 from round 2" in table
    # ... and the mean row says a diverged peer is in it, as the seeds table does (a
    # review: the mean over seeds and hfl-report said nothing of it)
    assert rows[-1]["diverged"] == ["p1"] and rows[-1]["cohort"] == "1 diverged"
    from hfl.launch.results import cohort_row, render_seeds_table

    seed = cohort_row(tmp_path, [(p, tmp_path / p) for p in ("p0", "p1")])
    seeds = render_seeds_table({0: seed, 1: {**seed, "diverged": [], "short": 1,
                                             "damaged": {"p1": {"lines": 1}}}})
    assert "seed 0: training diverged on p1 (a non-finite train_loss), in its mean" in seeds
    assert "seed 1: 1 of its peers shared with fewer peers than expected" in seeds
    assert "seed 1: damaged metrics.jsonl entries left out (" in seeds and "p1 (1 line)" in seeds
    assert "seed 0: damaged" not in seeds
    strict = json.loads((tmp_path / "results.json").read_text(),
                        parse_constant=lambda c: pytest.fail(f"bare {c} in results.json"))
    assert strict["best_mean_test_acc"] is None and strict["peers"][0]["sel_acc"] is None


def test_expand_gives_every_peer_its_own_curve_key_and_one_allow_list(tmp_path):
    import stat

    from hfl.peer.security import load_identity

    plans = expand(make(tmp_path), gpus=[], ports=[7000, 7001, 7002, 7003])
    keys = tmp_path / "run" / "keys"
    for p in plans:
        sec = p.config.security
        assert sec.mode == "curve" and p.config.secured
        assert stat.S_IMODE((keys / f"{p.id}.key_secret").stat().st_mode) == 0o600
        identity = load_identity(p.id, sec.key_file, sec.allow_list)
        assert sorted(identity.allowed) == ["p0", "p1", "p2", "p3"]
        # The secret never lands in the peer's config file, only the path to it.
        assert identity.secret_key.decode() not in p.config_path.read_text()
    # A second expansion (a resumed run) keeps every peer's identity.
    before = {p.id: load_identity(p.id, p.config.security.key_file,
                                  p.config.security.allow_list).public_key for p in plans}
    again = expand(make(tmp_path), gpus=[], ports=[7000, 7001, 7002, 7003])
    assert {p.id: load_identity(p.id, p.config.security.key_file,
                                p.config.security.allow_list).public_key for p in again} == before


def test_security_none_makes_no_keys(tmp_path):
    plans = expand(make(tmp_path, defaults={"cohort": {"rounds": 3}, "security": {"mode": "none"}}),
                   gpus=[], ports=[7000, 7001, 7002, 7003])
    assert not (tmp_path / "run" / "keys").exists()
    assert all(p.config.security.mode == "none" and not p.config.secured for p in plans)


# ---------------------------------------------------------------- --dry-run and early checks


def _written(tmp_path, peers: int = 2, **data) -> str:
    exp = {"name": "dry", "peers": peers, "run_dir": str(tmp_path / "run"),
           "defaults": {"cohort": {"algorithm": "fedavg", "rounds": 1},
                        "data": {"dataset": "digits", "partition": "iid", **data},
                        "model": {"arch": "mlp", "options": {"hidden": [16]}}}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    return str(path)


def test_dry_run_prints_each_peers_sample_counts_and_shapes(tmp_path, capsys):
    from hfl.launch.cli import main

    assert main([_written(tmp_path, val_fraction=0.1), "--dry-run"]) == 0
    out = capsys.readouterr().out
    for pid in ("p0", "p1"):
        line = next(x for x in out.splitlines() if x.strip().startswith(f"{pid}: digits"))
        assert "training /" in line and "test samples of shape (1, 8, 8), 10 classes" in line, out
        assert "parameters; fedavg" in line
    # It says what a launch would do, not that it did it (it said "new run in ..."), and
    # a second dry run that its own configs came before says so (it said "holds a run").
    assert "hfl-launch: dry run, a launch would do this: new run in " in out
    assert "the dry run wrote the peers' configs and keys into " in out
    assert main([_written(tmp_path, val_fraction=0.1), "--dry-run"]) == 0
    again = capsys.readouterr().out
    assert "which holds files already (a run, or an earlier dry run's configs)" in again


def test_a_missing_data_file_is_refused_before_torch_is_imported(tmp_path):
    """It used to be found after the launcher and the template imported torch: 36 s on
    a busy machine for what a key typo reports in 1 s."""
    import subprocess
    import sys

    path = _written(tmp_path, dataset="csv", path=str(tmp_path / "missing.csv"), target="y")
    code = ("import sys; from hfl.launch.cli import main; rc = main([sys.argv[1]]); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch', rc)")
    proc = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split()[-3:] == ["no", "torch", "2"], proc.stdout + proc.stderr
    assert "peer p0: data.path:" in proc.stderr and "missing.csv: no such file" in proc.stderr


def test_a_busy_machine_is_warned_that_start_up_takes_minutes(tmp_path, capsys, monkeypatch):
    from hfl.launch import cli

    assert cli.busy_machine_warning(4, load=0.5, cores=2) is None
    assert cli.busy_machine_warning(4, load=None, cores=2) is None
    monkeypatch.setattr(cli, "_load_average", lambda: 40.0)
    assert cli.main([_written(tmp_path), "--in-process", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "this machine is busy (load 40.0 on" in err and "can take minutes" in err


def test_in_process_peers_freeze_what_they_built_for_the_run_only(tmp_path, monkeypatch):
    # What every in-process peer builds (model, data) leaves the cycle collector's view
    # while the cohort runs (a full collection over 256 peers' heap paused the shared
    # loop for up to a second), and is handed back when the run ends: nothing stays
    # pinned in the launching process.
    import gc

    from hfl.launch import cli

    frozen_while_running: list[int] = []
    real_freeze = gc.freeze

    def freeze() -> None:
        real_freeze()
        frozen_while_running.append(gc.get_freeze_count())

    monkeypatch.setattr(gc, "freeze", freeze)
    assert cli.main([_written(tmp_path), "--in-process", "--quiet"]) == 0
    assert len(frozen_while_running) == 2  # once per peer, each after its build
    assert min(frozen_while_running) > 10_000  # the imports and the peers' objects
    assert gc.get_freeze_count() == 0


def test_a_share_over_max_message_mib_stops_the_cohort_in_round_1_not_after_every_round(
        tmp_path, capsys):
    # A model whose knowledge does not fit one message never goes out: each peer used to
    # log "cannot send" every round and train alone to the end (then fail as a cohort
    # too small). Its peers now stop in round 1 and say what to change.
    from hfl.launch import cli

    path = _written(tmp_path)
    rc = cli.main([path, "--in-process", "--quiet", "--set", "defaults.cohort.rounds=50",
                   "--set", "defaults.model.options.hidden=[512]",
                   "--set", "defaults.model.embedding_dim=512",
                   "--set", "defaults.node.max_message_mib=1"])
    assert rc != 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "its knowledge for round 1 cannot go on the wire" in text, text
    assert "node.max_message_mib (1 MiB, tensors of at most 262,144 elements)" in text
    assert not list((tmp_path / "run").glob("p*/metrics.jsonl")) or all(
        not f.read_text().strip() for f in (tmp_path / "run").glob("p*/metrics.jsonl"))
    # 1 MiB is enough for the default model: the same cohort runs (with no data split:
    # the hello's shared terms then hold only this one)
    assert cli.main([path, "--in-process", "--quiet", "--set", "defaults.node.max_message_mib=1",
                     "--set", "defaults.data.partition=none",
                     "--set", "run_dir=" + str(tmp_path / "small")]) == 0


def test_a_peer_process_whose_share_does_not_fit_exits_1_with_the_reason(tmp_path, capsys):
    # The same stop through real hfl-peer processes: exit status 1 and its one paragraph
    # on stderr (hfl-peer maps Unsendable to it), and the launcher stops the cohort.
    from hfl.launch import cli

    rc = cli.main([_written(tmp_path), "--quiet", "--set", "defaults.cohort.rounds=50",
                   "--set", "defaults.model.options.hidden=[512]",
                   "--set", "defaults.model.embedding_dim=512",
                   "--set", "defaults.node.max_message_mib=1"])
    assert rc != 0
    err = capsys.readouterr().err
    assert "exited with status 1" in err, err
    assert "its knowledge for round 1 cannot go on the wire" in err
    assert "failed before it finished a round in this launch; stopping the cohort" in err


def test_peers_that_set_different_max_message_mib_refuse_each_other_naming_it(tmp_path, capsys):
    # A peer takes no message over its own limit (ZeroMQ drops the link), so the cohort
    # must agree; the default stays off the wire and reads as 256. Peers started by hand
    # refuse each other's hello ("max_message_mib differs"); hfl-launch refuses the
    # experiment before any starts (it ran the join timeout out before).
    from hfl.launch import cli

    path = _written(tmp_path)
    assert cli.main([path, "--in-process", "--quiet",
                     "--set", "peer_overrides.p1.node.max_message_mib=8",
                     "--set", "defaults.timing.join_timeout_s=3"]) == 2
    err = capsys.readouterr().err
    assert "node.max_message_mib: peers disagree (p0 256, p1 8)" in err, err
    assert not (tmp_path / "run" / "launch.json").exists()


def test_max_message_mib_is_checked_with_the_field_named(tmp_path):
    for bad, expected in ((0, "expected an integer >= 1 and <= 4096"),
                          (5000, "expected an integer >= 1 and <= 4096"), ("big", "expected int")):
        with pytest.raises(ConfigError, match=f"peer p0: defaults.node.max_message_mib: got .*; {expected}"):
            expand(make(tmp_path, defaults={"node": {"max_message_mib": bad}}),
                   gpus=[], ports=[7000, 7001, 7002, 7003])


# ---------------------------------------------------------------- plots


def _metrics(run_dir, pid, rows):
    d = run_dir / pid
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_plots_mark_restarts_and_early_stops_and_one_peer_has_no_cohort_mean(tmp_path):
    from matplotlib.figure import Figure

    from hfl.launch import plots
    from hfl.launch.results import read_metrics

    rows = lambda incs: [{"round": r, "global_acc": 0.1 * r, "incarnation": i}  # noqa: E731
                         for r, i in enumerate(incs, 1)]
    p0 = _metrics(tmp_path, "p0", rows([0, 0, 1, 1]))  # restarted into round 3
    p1 = _metrics(tmp_path, "p1", rows([0, 0]))  # stopped after round 2 of 4
    events = {p: plots.life_events(read_metrics(d), 4) for p, d in (("p0", p0), ("p1", p1))}
    assert events == {"p0": [(3, "restarted")], "p1": [(2, "stopped")]}
    ax = Figure().subplots()
    series = {p: plots.per_round(read_metrics(d), "global_acc") for p, d in (("p0", p0), ("p1", p1))}
    plots.draw_cohort(ax, series, {}, events)
    marked = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert marked["peer restarted"] == ([3], [pytest.approx(0.3)])
    assert marked["peer stopped early"] == ([2], [pytest.approx(0.2)])
    alone = Figure().subplots()
    plots.draw_cohort(alone, {"p0": series["p0"]}, {})
    assert [line.get_label() for line in alone.get_lines()] == ["p0"]  # no "cohort mean" of one


def test_seeds_get_a_plot_of_each_seed_and_their_mean_and_std(tmp_path):
    from hfl.launch import plots

    runs = {s: {"p0": [{"round": r, "global_acc": 0.1 * r + 0.01 * s} for r in (1, 2)]}
            for s in (0, 1, 2)}
    written = plots.plot_seeds(tmp_path, runs)
    assert [p.name for p in written] == ["seeds_global_acc.png"]
    assert written[0].read_bytes()[:4] == b"\x89PNG"


def test_a_peer_stops_once_its_launcher_is_gone(monkeypatch):
    # A review: a launcher killed with SIGKILL left its peers training for nobody,
    # holding their ports; the next --fresh had an orphan writing into the new run.
    import asyncio
    import subprocess
    import sys

    from hfl.peer.cli import watch_launcher
    from hfl.peer.status import process_started

    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        monkeypatch.setenv("HFL_LAUNCHER_PID", str(launcher.pid))
        monkeypatch.setenv("HFL_LAUNCHER_STARTED", str(process_started(launcher.pid)))
        stopped = []

        async def main():
            watch = asyncio.ensure_future(watch_launcher("p0", lambda: stopped.append(1), 0.02))
            await asyncio.sleep(0.1)
            assert not watch.done() and not stopped  # the launcher runs: nothing happens
            launcher.kill()
            launcher.wait()
            await asyncio.wait_for(watch, 30)

        asyncio.run(main())
        assert stopped == [1]
    finally:
        launcher.kill()
        launcher.wait()
    # A launcher killed but not yet reaped by its parent (a zombie) is gone too.
    from hfl.peer.status import process_alive

    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    started = process_started(zombie.pid)
    os.kill(zombie.pid, 9)
    try:
        deadline = time.monotonic() + 30
        while process_alive(zombie.pid, started) and time.monotonic() < deadline:
            time.sleep(0.02)  # until the kernel has made it a zombie (unreaped: no wait())
        assert not process_alive(zombie.pid, started)
    finally:
        zombie.wait()
    # Another process under the launcher's pid (a restarted container) is not it.
    monkeypatch.setenv("HFL_LAUNCHER_PID", str(os.getpid()))
    monkeypatch.setenv("HFL_LAUNCHER_STARTED", str((process_started(os.getpid()) or 0) + 1))
    stopped.clear()
    asyncio.run(asyncio.wait_for(watch_launcher("p0", lambda: stopped.append(1), 0.02), 30))
    assert stopped == [1]


def test_a_run_whose_peers_still_run_without_a_launcher_is_not_reused(tmp_path):
    import subprocess
    import sys

    from hfl.launch.rundir import RunDirError, decide
    from hfl.peer.checkpoint import run_dir_lock

    (tmp_path / "run" / "p0").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from hfl.peer.checkpoint import run_dir_lock\n"
         "with run_dir_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)",
         str(tmp_path / "run" / "p0")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for fresh, resume in ((True, False), (False, True), (False, False)):
            with pytest.raises(RunDirError, match=rf"p0 \(pid {holder.pid}\) of its run still run"):
                decide(tmp_path / "run", {}, fresh=fresh, resume=resume, peer_ids=["p0"])
    finally:
        holder.kill()
        holder.wait()
    with run_dir_lock(tmp_path / "run" / "p0"):  # (released with its process)
        pass


def test_a_second_launch_of_one_folder_is_refused_while_the_first_starts_and_runs(tmp_path, capsys):
    # A run's record is written only once every check passed (torch imported, seconds
    # later): two launches of one folder started within those seconds both found none and
    # both started a new run there. The first holds rundir.LaunchLock from before it
    # reads the folder; here another process holds it, as a launcher in its start-up.
    import subprocess
    import sys

    from hfl.launch.cli import main
    from hfl.launch.rundir import LaunchLock, write_record

    exp = _written(tmp_path)
    run = tmp_path / "run"
    write_record(run, {"name": "old"}, [], "finished")
    before = (run / "launch.json").read_text()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from hfl.launch.rundir import LaunchLock\n"
         "lock = LaunchLock.take(sys.argv[1]); print('held', flush=True); time.sleep(120)",
         str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for flags in (["--fresh"], ["--resume"], []):
            assert main([exp, "--quiet", *flags]) == 2
            err = capsys.readouterr().err
            assert f"in use by another hfl-launch (pid {holder.pid}), starting or running" in err
            assert (run / "launch.json").read_text() == before  # nothing moved or written
    finally:
        holder.kill()
        holder.wait()
    # Released with its process; a launcher deletes its lock file when it is done.
    lock = LaunchLock.take(run)
    assert lock is not None and lock.path == tmp_path / ".run.hfl-launch.lock"
    assert lock.path.read_text() == str(os.getpid())
    lock.release()
    assert not lock.path.exists()
    assert main([exp, "--quiet", "--fresh", "--in-process"]) == 0
    assert not lock.path.exists() and json.loads((run / "launch.json").read_text())["state"] == "finished"


def test_the_launch_lock_is_one_per_real_folder_and_leaves_nothing_behind(tmp_path, monkeypatch):
    # A review of the lock: a symlink to the run folder took a second lock (both launches
    # started a new run); a refused launch left the parent folders it made for its lock;
    # release deleted a lock file that was no longer its own (a third launcher got in).
    from hfl.launch.rundir import LaunchLock, RunDirError

    (tmp_path / "real" / "run").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "run")
    lock = LaunchLock.take(tmp_path / "real" / "run")
    for other in (tmp_path / "link", tmp_path / "real" / ".." / "real" / "run"):
        with pytest.raises(RunDirError, match="in use by another hfl-launch"):
            LaunchLock.take(other)
    lock.release()
    # Parent folders made for the lock go with it (nothing else in them).
    lock = LaunchLock.take(tmp_path / "new" / "a" / "run")
    assert lock.path.parent == tmp_path / "new" / "a"
    lock.release()
    assert not (tmp_path / "new").exists()
    # Not someone else's file at the path.
    lock = LaunchLock.take(tmp_path / "real" / "run")
    os.unlink(lock.path)  # (gone from under it)
    second = LaunchLock.take(tmp_path / "real" / "run")
    lock.release()
    assert second.path.exists()
    with pytest.raises(RunDirError):
        LaunchLock.take(tmp_path / "real" / "run")
    second.release()
    # Where nothing may be written beside the folder: inside it; where neither, why.
    real_lock = LaunchLock._lock

    def no_beside(path, run_dir, made):
        if path.parent != tmp_path / "real" / "run":
            raise PermissionError(13, "Permission denied")
        return real_lock(path, run_dir, made)

    monkeypatch.setattr(LaunchLock, "_lock", staticmethod(no_beside))
    lock = LaunchLock.take(tmp_path / "real" / "run")
    assert lock.path == tmp_path / "real" / "run" / ".hfl-launch.lock"
    with pytest.raises(RunDirError):
        LaunchLock.take(tmp_path / "link")
    lock.release()
    why = LaunchLock.take(tmp_path / "real" / "missing")
    assert isinstance(why, str) and "Permission denied" in why
    monkeypatch.setattr(LaunchLock, "_lock", real_lock)
    # Another user's lock file (ours may not write it): locked read-only, not passed by
    # for a lock inside the folder, which let both users' launches in (a review).
    theirs = LaunchLock.take(tmp_path / "real" / "run")
    real_open = os.open

    def as_another_user(path, flags, *mode):
        if str(path) == str(theirs.path) and flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *mode)

    monkeypatch.setattr(os, "open", as_another_user)
    with pytest.raises(RunDirError, match="in use by another hfl-launch"):
        LaunchLock.take(tmp_path / "real" / "run")
    os.close(theirs.fd)  # (they let go, their file left behind, as after a crash)
    theirs.fd = -1
    ours = LaunchLock.take(tmp_path / "real" / "run")  # (read-only: theirs, now free)
    assert ours.path == theirs.path
    with pytest.raises(RunDirError):
        LaunchLock.take(tmp_path / "real" / "run")
    ours.release()


def test_a_seeds_launch_holds_its_folder_for_every_seed(tmp_path, capsys):
    # A review: a --fresh launch of the folder of a live --seeds run deleted it (only each
    # seed's folder was locked, one at a time), and --fresh --seeds overwrote the results
    # of a folder another launcher held.
    from hfl.launch.cli import main
    from hfl.launch.rundir import LaunchLock

    exp = _written(tmp_path)
    run = tmp_path / "run"
    lock = LaunchLock.take(run)  # (as a --seeds launcher between two seeds)
    try:
        assert main([exp, "--quiet", "--fresh", "--seeds", "0", "1"]) == 2
        assert "in use by another hfl-launch" in capsys.readouterr().err
        assert not run.exists()
    finally:
        lock.release()


def test_a_record_whose_launcher_pid_now_names_another_process_does_not_block_the_run(tmp_path):
    # A review: after a restart, the record's pid belonged to an unrelated process and
    # every launch was refused "in use by a running hfl-launch", advising to stop it.
    import subprocess
    import sys

    from hfl.launch.rundir import RunDirError, decide, write_record
    from hfl.peer.status import process_started

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run = tmp_path / "run"
        write_record(run, {}, [], "running")
        record = json.loads((run / "launch.json").read_text())
        for started, in_use in ((process_started(other.pid), True),
                                ((process_started(other.pid) or 0) + 1, False)):
            (run / "launch.json").write_text(json.dumps(
                {**record, "pid": other.pid, "pid_started": started}))
            if in_use:
                with pytest.raises(RunDirError, match="in use by a running hfl-launch"):
                    decide(run, {}, fresh=False, resume=True)
            else:
                assert decide(run, {}, fresh=False, resume=True).action == "resume"
    finally:
        other.kill()
        other.wait()


def test_hfl_report_leaves_a_failed_seed_out_of_the_mean_as_the_seeds_table_does(tmp_path):
    from hfl.launch.report import render, run_row
    from hfl.launch.rundir import write_record

    for seed, acc, state in ((0, 0.9, "finished"), (1, 0.1, "failed"), (2, 0.8, "finished")):
        d = tmp_path / "run" / f"seed{seed}"
        (d / "p0").mkdir(parents=True)
        (d / "p0" / "metrics.jsonl").write_text(json.dumps(
            {"round": 1, "time": 1.0, "round_time_s": 1.0, "test_acc": acc, "global_acc": acc}) + "\n")
        write_record(d, {"name": "x", "defaults": {"data": {"seed": seed}}}, [], state)
    row = run_row(tmp_path / "run")
    assert row["seeds"] == 3 and row["seeds_counted"] == 2
    assert row["test_acc"][0] == pytest.approx(0.85) and row["state"] == "failed"
    assert "(2 of 3 seeds: failed ones left out)" in render([row])
    # A peer whose training diverged is named under the report too (a review).
    d = tmp_path / "run" / "seed2" / "p0"
    (d / "metrics.jsonl").write_text(json.dumps(
        {"round": 1, "time": 1.0, "round_time_s": 1.0, "test_acc": 0.8, "train_loss": float("nan")}) + "\n")
    assert run_row(tmp_path / "run")["diverged"] == ["p0"]


def test_resume_checks_count_every_peer_and_an_existing_checkpoint(tmp_path):
    # A review of the resume refusals: a solo peer one behind (Ctrl-C) was refused its
    # rounds because another peer had run them all; a run with checkpoints resumed with
    # node.checkpoint now off was refused as having none.
    from hfl.launch.rundir import nothing_to_resume, rounds_already_run

    for pid, last in (("p0", 3), ("p1", 1)):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "metrics.jsonl").write_text(
            "".join(json.dumps({"round": r}) + "\n" for r in range(1, last + 1)))
    peers = [(p, tmp_path / p) for p in ("p0", "p1")]
    assert rounds_already_run(tmp_path, 3, peers) is None  # p1 has rounds 2 and 3 to run
    (tmp_path / "p1" / "metrics.jsonl").write_text(
        "".join(json.dumps({"round": r}) + "\n" for r in (1, 2, 3)))
    assert "its peers ran round 3 already" in rounds_already_run(tmp_path, 3, peers)
    assert rounds_already_run(tmp_path, 4, peers) is None
    off = [(p, False, tmp_path / p) for p in ("p0", "p1")]
    assert "node.checkpoint is off for p0, p1" in nothing_to_resume(tmp_path, off)
    for p in ("p0", "p1"):
        (tmp_path / p / "checkpoint.pt").write_bytes(b"x")
    assert nothing_to_resume(tmp_path, off) is None  # the checkpoint there resumes


def test_two_peers_given_one_part_of_a_data_split_are_refused_before_any_starts(tmp_path):
    # peer_overrides that gave p3 p2's partition_index: the two refuse each other's
    # hellos, but p0 and p1 took both; the run went on with p2's rows trained twice and
    # p3's by no one, after the join timeout (120 s) with every member greeting.
    exp = make(tmp_path, peers=4, peer_overrides={"p3": {"data": {"partition_index": 2}}})
    with pytest.raises(ConfigError, match=r"peer p3: peer_overrides\.p3\.data\.partition_index: "
                                          r"got 2 for p3, as p2 has: .*its own part \(0 to 3\)"):
        expand(exp, ports=list(range(7000, 7004)), write=False)
    # Parts of different splits, and peers that split no data, do not meet
    other = make(tmp_path, peers=2, peer_overrides={
        "p0": {"data": {"partition_index": 0, "seed": 1}},
        "p1": {"data": {"partition_index": 0, "seed": 2}}})
    assert [p.config.data.partition_index for p in expand(other, ports=[7000, 7001],
                                                          write=False)] == [0, 0]
    two = make(tmp_path, peers=2, peer_overrides={
        "p0": {"data": {"partition_index": 0}, "cohort": {"name": "a"}},
        "p1": {"data": {"partition_index": 0}, "cohort": {"name": "b"}}})
    assert len(expand(two, ports=[7000, 7001], write=False)) == 2  # two cohorts: no overlap
