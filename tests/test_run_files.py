"""Issue 9: what a peer keeps on disk survives real failures.

Checkpoints carry a SHA-256 and are fsynced (file, then directory); a damaged one
is refused with one line naming it. A round's metrics line is written before its
checkpoint, and a resume drops rows past the checkpoint's round. A full disk, a
read-only run directory or a denied permission ends ``hfl-peer`` with one
``hfl-peer: <file>: <errno> (<text>)`` line, exit 1. An emptied or corrupt
incarnation file never restarts a peer as incarnation 0. A peer resumed after
its cohort finished says so and exits 3 instead of training alone.

OS errors are injected at the exact call (``os`` as seen by
:mod:`hfl.peer.checkpoint`, through which every run-directory write goes), so the
tests behave the same as root and as a user, on any file system.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import math
import os
import threading
import types
from pathlib import Path

import pytest
import torch
import yaml
from conftest import free_tcp_port

from hfl.peer import checkpoint as ckpt
from hfl.peer import cli, runner
from hfl.peer.checkpoint import (
    CHECKPOINT_NAME,
    INCARNATION_NAME,
    MAGIC,
    RunFileError,
    load_checkpoint,
    next_incarnation,
    save_checkpoint,
    trim_metrics,
)
from hfl.peer.config import config_from_dict
from hfl.peer.runner import METRICS_NAME, run_peer
from hfl.peer.status import CohortGone
from hfl.peer.transport import MemoryHub

pytestmark = pytest.mark.timeout(180)  # generous: the machine may be shared

TIMING = {
    "heartbeat_interval_s": 0.05,
    "suspect_after_s": 0.3,
    "dead_after_s": 0.6,
    "round_timeout_s": 3.0,
    "aggregate_grace_s": 1.0,
    "join_timeout_s": 10.0,
    "send_timeout_s": 1.0,
}


def cfg_dict(run_dir: Path, peer_id: str = "p0", *, algorithm: str = "solo", rounds: int = 2,
             listen: str | None = None, n: int = 1, index: int = 0, bootstrap=(),
             timing: dict | None = None, **node) -> dict:
    return {
        "security": {"mode": "none"},
        "node": {"id": peer_id, "listen": listen or f"mem://{peer_id}", "run_dir": str(run_dir),
                 "bootstrap": list(bootstrap), "min_peers": n, "seed": index, **node},
        "cohort": {"algorithm": algorithm, "rounds": rounds},
        "timing": {**TIMING, **(timing or {})},
        "data": {"dataset": "digits", "partition": "iid", "num_partitions": n,
                 "partition_index": index},
        "model": {"arch": "mlp"},
        "train": {"max_batches": 2},
    }


def run(cfg, hub=None):
    return asyncio.run(run_peer(cfg, hub=hub or MemoryHub()))


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_NAME).read_text().splitlines()]


class FaultyOs(types.SimpleNamespace):
    """``os`` for hfl.peer.checkpoint, failing the first write-side call on ``target``
    with ``OSError(code)``; every other call goes to the real ``os``. Records calls."""

    def __init__(self, target: Path | None = None, code: int = 0, calls=("open", "makedirs")):
        super().__init__()
        self.target, self.code, self.fail_calls, self.log = target, code, calls, []

    def _fail(self, name: str, path) -> None:
        if self.target is not None and name in self.fail_calls and Path(path) in (
                self.target, self.target.with_name(self.target.name + ".tmp")):
            raise OSError(self.code, os.strerror(self.code), str(path))

    def open(self, path, flags, mode=0o777):
        self.log.append(("open", Path(path).name))
        if flags & (os.O_WRONLY | os.O_RDWR):
            self._fail("open", path)
        return os.open(path, flags, mode)

    def makedirs(self, path, exist_ok=False):
        self._fail("makedirs", path)
        return os.makedirs(path, exist_ok=exist_ok)

    def fsync(self, fd):
        self.log.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        return os.fsync(fd)

    def replace(self, src, dst):
        self.log.append(("replace", Path(dst).name))
        return os.replace(src, dst)

    def __getattr__(self, name):
        return getattr(os, name)


# ------------------------------------------------------------------ checkpoint files


def test_a_checkpoint_is_checksummed_and_fsynced_before_and_after_its_rename(tmp_path, monkeypatch):
    fake_os = FaultyOs()
    monkeypatch.setattr(ckpt, "os", fake_os)
    state = {"round": 4, "incarnation": 1, "algorithm": {"w": torch.arange(6.0)},
             "torch_rng": torch.get_rng_state(), "members": [["p1", "mem://p1"]]}
    path = save_checkpoint(tmp_path, state)
    data = path.read_bytes()
    body = data[len(MAGIC) + 65:]
    # The header is the SHA-256 of exactly the bytes after it (hashlib as the oracle).
    assert data.startswith(MAGIC) and data[len(MAGIC):len(MAGIC) + 64].decode() == \
        hashlib.sha256(body).hexdigest()
    # The temp file reaches the disk before it replaces the checkpoint, the directory after.
    assert [e for e in fake_os.log if e[0] != "open"] == [
        ("fsync", "checkpoint.pt.tmp"), ("replace", "checkpoint.pt"), ("fsync", tmp_path.name)]
    loaded = load_checkpoint(tmp_path)
    assert loaded["round"] == 4 and torch.equal(loaded["algorithm"]["w"], torch.arange(6.0))
    assert not (tmp_path / "checkpoint.pt.tmp").exists()


def _flip_in_weights(data: bytes, weights: torch.Tensor) -> bytes:
    at = data.find(weights.numpy().tobytes())
    assert at > 0
    at += weights.numel() * 2  # a byte in the middle of the tensor's storage
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]


@pytest.mark.parametrize("damage", ["bit flip in a weight", "truncated", "header only",
                                    "not a checkpoint", "empty"])
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, damage):
    weights = torch.linspace(-1, 1, 512)
    path = save_checkpoint(tmp_path, {"round": 3, "incarnation": 0, "algorithm": {"w": weights},
                                      "torch_rng": torch.get_rng_state(), "members": []})
    data = path.read_bytes()
    path.write_bytes({
        "bit flip in a weight": lambda: _flip_in_weights(data, weights),
        "truncated": lambda: data[: len(data) * 2 // 3],
        "header only": lambda: data[: len(MAGIC) + 20],
        "not a checkpoint": lambda: b"this is a text file\n" * 10,
        "empty": lambda: b"",
    }[damage]())
    with pytest.raises(RunFileError) as err:
        load_checkpoint(tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    assert "refusing to resume" in msg and f"mv {path} {path}.bad" in msg
    if damage in ("bit flip in a weight", "truncated"):
        assert "SHA-256" in msg


@pytest.mark.parametrize("edit, why", [
    ({"round": "3"}, "round '3'"), ({"round": -7}, "round -7"), ({"round": 2.7}, "round 2.7"),
    ({"incarnation": 2**70}, "incarnation"), ({"members": None}, "members"),
    ({"members": [["p1"]]}, "members"), ({"algorithm": {}}, "no algorithm state"),
    ({"torch_rng": None}, "a torch_rng"),
])
def test_a_checksummed_checkpoint_with_fields_of_the_wrong_kind_is_refused_in_one_line(
        tmp_path, edit, why):
    # A hand-edited file with a valid checksum raised deep in the resume (a review).
    run_dir = tmp_path / "p0"
    run(config_from_dict(cfg_dict(run_dir, rounds=1)))
    state = load_checkpoint(run_dir)
    save_checkpoint(run_dir, {**state, **edit})
    with pytest.raises(RunFileError, match=f"checkpoint with {why}.*refusing to resume"):
        load_checkpoint(run_dir)


def test_a_checkpoint_of_another_format_says_so(tmp_path):
    run_dir = tmp_path / "p0"
    run(config_from_dict(cfg_dict(run_dir, rounds=1)))
    data = (run_dir / CHECKPOINT_NAME).read_bytes()
    (run_dir / CHECKPOINT_NAME).write_bytes(data.replace(MAGIC, b"HFL-CHECKPOINT 2 sha256=", 1))
    with pytest.raises(RunFileError, match="a checkpoint of format '2', which this hfl"):
        load_checkpoint(run_dir)


def test_a_checkpoint_from_before_checksums_still_loads_with_a_warning(tmp_path, caplog):
    state = {"round": 2, "incarnation": 0, "algorithm": {"w": torch.ones(3)},
             "torch_rng": torch.get_rng_state(), "members": []}
    torch.save(state, tmp_path / CHECKPOINT_NAME)  # the old format: a bare torch zip
    with caplog.at_level(logging.WARNING, logger="hfl.peer"):
        assert load_checkpoint(tmp_path)["round"] == 2
    assert "before checksums" in caplog.text


def test_a_resume_refuses_a_corrupt_checkpoint_before_touching_anything(tmp_path):
    run_dir = tmp_path / "p0"
    run(config_from_dict(cfg_dict(run_dir, rounds=2)))
    before = {name: (run_dir / name).read_bytes() for name in (METRICS_NAME, INCARNATION_NAME)}
    data = bytearray((run_dir / CHECKPOINT_NAME).read_bytes())
    data[-100] ^= 0x01
    (run_dir / CHECKPOINT_NAME).write_bytes(bytes(data))
    with pytest.raises(RunFileError, match="corrupt checkpoint"):
        run(config_from_dict(cfg_dict(run_dir, rounds=4)))
    assert {name: (run_dir / name).read_bytes() for name in before} == before


# ------------------------------------------------------------------ metrics line, then checkpoint


def test_the_metrics_line_is_on_disk_before_the_checkpoint_of_its_round(tmp_path, monkeypatch):
    fake_os = FaultyOs()
    monkeypatch.setattr(ckpt, "os", fake_os)
    run(config_from_dict(cfg_dict(tmp_path / "p0", rounds=3)))
    events = [e for e in fake_os.log if e in (("fsync", METRICS_NAME), ("replace", CHECKPOINT_NAME))]
    assert events == [("fsync", METRICS_NAME), ("replace", CHECKPOINT_NAME)] * 3


def test_a_resume_drops_metrics_rows_past_the_checkpoint_so_no_round_is_listed_twice(tmp_path):
    run_dir = tmp_path / "p0"
    run(config_from_dict(cfg_dict(run_dir, rounds=2)))
    # Killed after round 3's metrics line, before its checkpoint (and mid-way through
    # a torn line): the checkpoint still holds round 2.
    with (run_dir / METRICS_NAME).open("a") as f:
        f.write(json.dumps({**rows(run_dir)[-1], "round": 3, "incarnation": 0}) + "\n")
        f.write('{"peer": "p0", "round": 4, "tra')
    run(config_from_dict(cfg_dict(run_dir, rounds=4)))
    got = [(r["round"], r["incarnation"]) for r in rows(run_dir)]
    assert got == [(1, 0), (2, 0), (3, 1), (4, 1)]


def test_a_peer_stopped_while_writing_a_round_keeps_it_and_resumes_after_it(tmp_path, monkeypatch):
    # SIGTERM (a cancelled task) while round 2's checkpoint is being written, after its
    # metrics line, and a second SIGTERM while the peer waits for that write (scancel
    # signals the peer and its SLURM task wrapper, which passes it on): the write is
    # finished before the peer returns, so the checkpoint holds round 2 and a resume
    # runs round 3 without dropping a row. (The second cancel used to cut the wait:
    # the peer returned with round 2's row and round 1's checkpoint.)
    run_dir, entered, go, waiting = (tmp_path / "p0", threading.Event(), threading.Event(),
                                     threading.Event())
    save, finished = runner._save, runner.RoundRecorder._finished

    def slow_save(run_dir_, r, *args, **kw):
        if r == 2:
            entered.set()
            go.wait(60)
        save(run_dir_, r, *args, **kw)

    def noted_wait(recorder, timeout_s):
        waiting.set()
        finished(recorder, timeout_s)

    monkeypatch.setattr(runner, "_save", slow_save)
    monkeypatch.setattr(runner.RoundRecorder, "_finished", noted_wait)

    async def stop_in_round_2():
        peer = asyncio.ensure_future(run_peer(config_from_dict(cfg_dict(run_dir, rounds=4)),
                                              hub=MemoryHub()))
        await asyncio.to_thread(entered.wait, 60)
        assert [r["round"] for r in rows(run_dir)] == [1, 2]  # the line, not the checkpoint
        peer.cancel()
        await asyncio.to_thread(waiting.wait, 60)
        peer.cancel()
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await peer
        return ckpt.load_checkpoint(run_dir)["round"]  # when the peer returns (then exits)

    assert asyncio.run(stop_in_round_2()) == 2
    run(config_from_dict(cfg_dict(run_dir, rounds=4)))
    assert [(r["round"], r["incarnation"]) for r in rows(run_dir)] == [(1, 0), (2, 0), (3, 1), (4, 1)]


def test_stopping_waits_for_a_round_being_written_and_begins_none_after(tmp_path):
    # The worker thread writes a round's row and checkpoint; the event loop stops the
    # recorder. A write under way is waited for; one that reaches the recorder after
    # the stop is not begun (a check of a flag raced this: a write that began just
    # after it was cut by the exit between the row and the checkpoint).
    recorder = runner.RoundRecorder(tmp_path, config_from_dict(cfg_dict(tmp_path)), "local",
                                    None, checkpoints=True)
    entered, go, wrote = threading.Event(), threading.Event(), []

    def write(r, node):
        wrote.append(("begun", r))
        entered.set()
        go.wait(60)
        wrote.append(("done", r))

    recorder._checkpoint = write

    async def main():
        worker = threading.Thread(target=recorder.checkpoint, args=(1, None))
        worker.start()
        await asyncio.to_thread(entered.wait, 60)
        stopping = asyncio.ensure_future(recorder.stop())
        await asyncio.sleep(0)
        assert not stopping.done() and recorder.stopped
        go.set()
        await stopping
        assert wrote == [("begun", 1), ("done", 1)]
        await asyncio.to_thread(recorder.checkpoint, 2, None)  # dispatched before, run after
        worker.join()

    asyncio.run(main())
    assert wrote == [("begun", 1), ("done", 1)]


def test_a_checkpoint_trained_on_other_data_is_refused_and_a_moved_dataset_is_not(tmp_path):
    # A review: hfl-peer resumed a checkpoint on another partition with label noise, and
    # its rows went on in the same metrics.jsonl as the old data's.
    from hfl.peer.configtools import ConfigError

    run_dir = tmp_path / "p0"
    base = cfg_dict(run_dir, rounds=1)
    run(config_from_dict(base))
    before = {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()}
    other = {**base, "cohort": {**base["cohort"], "rounds": 2},
             "data": {**base["data"], "seed": 7, "test_fraction": 0.3}}
    with pytest.raises(ConfigError, match=r"^data: the checkpoint .* other data "
                                          r"\(data\.seed: 0 -> 7; data\.test_fraction: "
                                          r"0\.2 -> 0\.3\).*cannot change on resume"):
        run(config_from_dict(other))
    assert {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()} == before
    # Where the files are is not what they hold: the same data elsewhere resumes.
    from hfl.peer.runner import checkpoint_data

    moved = config_from_dict({**base, "data": {**base["data"], "options": {"root": "/elsewhere"}}})
    assert checkpoint_data(moved) == checkpoint_data(config_from_dict(base))
    public = {"dataset": "npz", "path": "/scratch/job1/pub.npz", "options": {"root": "/a"}}
    assert checkpoint_data(config_from_dict({**base, "data": {**base["data"], "public_set": public}})) \
        == checkpoint_data(config_from_dict({**base, "data": {**base["data"], "public_set": {
            **public, "path": "/scratch/job2/pub.npz", "options": {"root": "/b"}}}}))
    # Another peer's checkpoint is named as such (its partition differs too), and a data
    # field a later hfl adds (at its default) is no change of the data.
    with pytest.raises(ConfigError, match=r"^node\.id: .*peer 'p0'"):
        run(config_from_dict(cfg_dict(run_dir, "p1", rounds=2, n=2, index=1)))
    from hfl.peer.runner import _check_owner, checkpoint_owner

    older = checkpoint_owner(config_from_dict(base))
    del older["data"]["standardize"]
    _check_owner(config_from_dict(base), run_dir, older)
    run(config_from_dict({**base, "cohort": {**base["cohort"], "rounds": 2}}))
    assert [r["round"] for r in rows(run_dir)] == [1, 2]


def test_a_run_dir_of_the_current_folder_is_refused(tmp_path):
    # node.run_dir: '' wrote checkpoint.pt, metrics.jsonl and the rest into the current
    # folder (a review); hfl-launch already refused it for its run_dir.
    from hfl.peer.configtools import ConfigError

    for rd in ("", ".", "./"):
        with pytest.raises(ConfigError, match=r"node\.run_dir: got .*a folder path other than"):
            config_from_dict(cfg_dict(rd))
    assert config_from_dict(cfg_dict(tmp_path / "x")).run_dir == str(tmp_path / "x")


def test_a_finished_run_started_again_ends_as_it_ended(tmp_path, caplog):
    # A review: a peer that trained alone exits 3; the same command again said "nothing
    # to run" and exited 0, so a retry-on-failure wrapper turned the failure into a
    # success.
    from hfl.peer.status import CohortTooSmall

    run_dir = tmp_path / "p0"
    cfg = config_from_dict(cfg_dict(run_dir, algorithm="fedavg", rounds=2))
    with pytest.raises(CohortTooSmall, match="this peer trained alone") as first:
        run(cfg)
    with pytest.raises(CohortTooSmall) as again:
        run(cfg)
    assert str(again.value) == str(first.value)
    solo = config_from_dict({**cfg_dict(run_dir, algorithm="fedavg", rounds=2, allow_solo=True)})
    assert run(solo).rounds_completed == 0  # told to accept it: nothing to run, status 0
    (run_dir / "summary.json").unlink()  # stopped after its last checkpoint, before this
    with caplog.at_level("WARNING", logger="hfl.peer"):
        assert run(cfg).rounds_completed == 0
    assert "has no summary.json (the peer stopped after its last round's checkpoint" in caplog.text


def test_damaged_bytes_in_metrics_and_another_methods_checkpoint_are_one_line_each(tmp_path):
    # A review: a byte that is not UTF-8 in metrics.jsonl raised UnicodeDecodeError (a
    # traceback of hfl-peer and of hfl-launch --resume); a fedavg checkpoint resumed
    # as fedh2l raised KeyError from the method's state.
    from hfl.peer.checkpoint import read_jsonl
    from hfl.peer.configtools import ConfigError

    run_dir = tmp_path / "p0"
    run(config_from_dict(cfg_dict(run_dir, rounds=2)))
    raw = (run_dir / METRICS_NAME).read_bytes()
    damaged = raw.replace(b'"round": 1', b'"round": \xb1', 1) + b"\xff"
    assert damaged != raw + b"\xff"
    (run_dir / METRICS_NAME).write_bytes(damaged)
    assert [r["round"] for r in read_jsonl(run_dir / METRICS_NAME)] == [2]
    run(config_from_dict(cfg_dict(run_dir, rounds=3)))
    assert [r["round"] for r in rows(run_dir)] == [2, 3]  # the damaged line went, no other
    kept = (run_dir / (METRICS_NAME + ".damaged")).read_text(errors="replace").splitlines()
    assert len(kept) == 2 and '"round": \ufffd' in kept[0]  # set aside, not deleted
    before = {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()}
    with pytest.raises(ConfigError, match=r"^cohort\.algorithm: the checkpoint .* holds the rounds "
                                          r"of 'solo', not of this config's 'fedavg'"):
        run(config_from_dict(cfg_dict(run_dir, algorithm="fedavg", rounds=4)))
    assert {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()} == before


def test_a_kill_before_the_first_checkpoint_does_not_list_round_1_twice(tmp_path):
    run_dir = tmp_path / "p0"
    run(config_from_dict(cfg_dict(run_dir, rounds=1)))
    (run_dir / CHECKPOINT_NAME).unlink()  # killed after round 1's metrics line
    run(config_from_dict(cfg_dict(run_dir, rounds=2)))
    assert [(r["round"], r["incarnation"]) for r in rows(run_dir)] == [(1, 1), (2, 1)]


def test_a_checkpoint_of_another_run_or_peer_is_refused_and_loses_nothing(tmp_path):
    # Resumed silently before (a checkpoint review): a new run (cohort.run) in the last
    # run's folder went on from its round 3, and pulled a fresh cohort forward; another
    # peer's checkpoint made this one a stranger to its own members.
    from hfl.peer.configtools import ConfigError

    run_dir = tmp_path / "p0"
    run(config_from_dict({**cfg_dict(run_dir, rounds=2), "cohort": {"algorithm": "solo", "rounds": 2,
                                                                     "run": 111}}))
    before = {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()}
    with pytest.raises(ConfigError, match=r"cohort\.run.*holds the rounds of run 111.*run 222"):
        run(config_from_dict({**cfg_dict(run_dir, rounds=4), "cohort": {"algorithm": "solo", "rounds": 4,
                                                                         "run": 222}}))
    with pytest.raises(ConfigError, match=r"node\.id.*peer 'p0'.*peer 'p1'"):
        run(config_from_dict({**cfg_dict(run_dir, "p1", rounds=4), "cohort": {
            "algorithm": "solo", "rounds": 4, "run": 111}}))
    assert {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()} == before
    run(config_from_dict({**cfg_dict(run_dir, rounds=3), "cohort": {"algorithm": "solo", "rounds": 3,
                                                                     "run": 111}}))
    assert [r["round"] for r in rows(run_dir)] == [1, 2, 3]  # the same run resumes


def test_starting_over_drops_the_checkpoint_too_and_only_once_the_config_builds(tmp_path):
    # node.resume: false deleted the rows before the config was built (a config that
    # then failed lost them) and kept the checkpoint, which the next plain start resumed
    # under the new rows (a checkpoint review).
    run_dir = tmp_path / "p0"
    run(config_from_dict(cfg_dict(run_dir, rounds=2)))
    kept = (METRICS_NAME, CHECKPOINT_NAME, "entered_round")
    before = {name: (run_dir / name).read_bytes() for name in kept if (run_dir / name).exists()}
    with pytest.raises(Exception, match="fedin"):  # fedin cannot build on an MLP
        run(config_from_dict({**cfg_dict(run_dir, rounds=2, resume=False),
                              "cohort": {"algorithm": "fedin", "rounds": 2}}))
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    run(config_from_dict(cfg_dict(run_dir, rounds=1, resume=False, checkpoint=False)))
    assert not (run_dir / CHECKPOINT_NAME).exists() and [r["round"] for r in rows(run_dir)] == [1]


def test_rows_whose_checkpoint_is_gone_are_set_aside_not_deleted(tmp_path, caplog):
    # The checkpoint moved aside as damaged (as its refusal advises): the start from
    # round 1 deleted rows 1..3 without a word (a checkpoint review).
    run_dir = tmp_path / "p0"
    run(config_from_dict(cfg_dict(run_dir, rounds=3)))
    old = (run_dir / METRICS_NAME).read_text()
    (run_dir / CHECKPOINT_NAME).rename(run_dir / "checkpoint.pt.bad")
    with caplog.at_level(logging.WARNING, logger="hfl"):
        run(config_from_dict(cfg_dict(run_dir, rounds=2)))
    assert [r["round"] for r in rows(run_dir)] == [1, 2]
    assert (run_dir / f"{METRICS_NAME}.before-1").read_text() == old
    assert "holds rounds up to 3 but there is no checkpoint" in caplog.text


def test_a_second_start_of_the_same_peer_is_refused_while_the_first_runs(tmp_path):
    # Two processes of one peer in one run directory (the second on another port) both
    # ran, each round's row written twice, one checkpoint file between them (a
    # checkpoint review). The run directory is locked while a peer runs in it.
    run_dir = tmp_path / "p0"
    run_dir.mkdir()
    cfg = config_from_dict(cfg_dict(run_dir, rounds=1, listen=f"tcp://127.0.0.1:{free_tcp_port()}"))
    with ckpt.run_dir_lock(run_dir):
        with pytest.raises(RunFileError, match="another peer process runs in this run directory"):
            asyncio.run(run_peer(cfg))  # a peer of its own process (no hub): locked
    assert not (run_dir / METRICS_NAME).exists()
    asyncio.run(run_peer(cfg))  # released: it runs
    with ckpt.run_dir_lock(run_dir):  # and released again when it ended
        pass


def test_a_peer_whose_training_diverges_says_so_once(tmp_path, caplog):
    # train.lr 1e5: train_loss NaN every round, and not a word (a review of the results).
    cfg = cfg_dict(tmp_path / "p0", rounds=3)
    cfg["train"].update(lr=1e5)
    with caplog.at_level(logging.WARNING, logger="hfl"):
        run(config_from_dict(cfg))
    assert all(math.isnan(r["train_loss"]) for r in rows(tmp_path / "p0")[1:])
    said = [r for r in caplog.records if "training diverged" in r.getMessage()]
    assert len(said) == 1 and "train_loss is nan" in said[0].getMessage()


# ------------------------------------------------------------------ incarnations


def test_an_emptied_incarnation_file_never_restarts_the_peer_as_incarnation_0(tmp_path, caplog):
    run_dir = tmp_path / "p0"
    run(config_from_dict(cfg_dict(run_dir, rounds=1)))
    run(config_from_dict(cfg_dict(run_dir, rounds=2)))  # incarnation 1, checkpoint says so
    (run_dir / INCARNATION_NAME).write_text("")
    with caplog.at_level(logging.WARNING, logger="hfl.peer"):
        run(config_from_dict(cfg_dict(run_dir, rounds=3)))
    assert "corrupt incarnation file" in caplog.text
    assert [r["incarnation"] for r in rows(run_dir)] == [0, 1, 2]
    assert (run_dir / INCARNATION_NAME).read_text() == "2\n"


def test_incarnation_is_the_highest_record_plus_one(tmp_path):
    (tmp_path / INCARNATION_NAME).write_text("7\n")
    assert next_incarnation(tmp_path, at_least=3) == 8  # the file is ahead
    (tmp_path / INCARNATION_NAME).write_text("garbage")
    assert next_incarnation(tmp_path, at_least=5) == 5  # the checkpoint/metrics are
    (tmp_path / INCARNATION_NAME).unlink()
    assert next_incarnation(tmp_path, at_least=4) == 4
    assert next_incarnation(tmp_path) == 5


def test_a_corrupt_incarnation_file_with_nothing_to_derive_from_is_refused(tmp_path):
    (tmp_path / INCARNATION_NAME).write_bytes(b"\x00\xff")
    with pytest.raises(RunFileError, match="corrupt incarnation file") as err:
        next_incarnation(tmp_path)
    assert str(err.value).startswith(str(tmp_path / INCARNATION_NAME))


# ------------------------------------------------------------------ resource faults through hfl-peer


def write_config(tmp_path: Path, **kw) -> tuple[Path, Path]:
    run_dir = tmp_path / "run" / "p0"
    path = tmp_path / "p0.yaml"
    path.write_text(yaml.safe_dump(cfg_dict(
        run_dir, listen=f"tcp://127.0.0.1:{free_tcp_port()}", **kw)))
    return path, run_dir


@pytest.mark.parametrize("target,code", [
    (METRICS_NAME, errno.ENOSPC),
    (CHECKPOINT_NAME, errno.ENOSPC),
    (INCARNATION_NAME, errno.ENOSPC),
    (METRICS_NAME, errno.EROFS),
    (CHECKPOINT_NAME, errno.EACCES),
    ("", errno.EROFS),  # the run directory itself
    ("", errno.EACCES),
])
def test_a_resource_fault_ends_hfl_peer_with_one_line_naming_the_file(
        tmp_path, monkeypatch, capsys, caplog, target, code):
    config, run_dir = write_config(tmp_path, rounds=2)
    path = run_dir / target if target else run_dir
    monkeypatch.setattr(ckpt, "os", FaultyOs(path, code))
    rc = cli.main(["--config", str(config)])
    err = capsys.readouterr().err
    assert rc == 1
    name = errno.errorcode[code]
    assert err.splitlines() == [err.splitlines()[0]]  # one line
    assert err.startswith(f"hfl-peer: {path}: {name} ({os.strerror(code)}): ")
    assert "Traceback" not in err and not any(r.exc_info for r in caplog.records)
    if target == METRICS_NAME:  # the round's checkpoint never got ahead of its metrics line
        assert not (run_dir / CHECKPOINT_NAME).exists()


def test_hfl_peer_refuses_a_corrupt_checkpoint_with_one_line(tmp_path, capsys):
    config, run_dir = write_config(tmp_path, rounds=2)
    run_dir.mkdir(parents=True)
    (run_dir / CHECKPOINT_NAME).write_bytes(MAGIC + b"0" * 64 + b"\n" + b"not torch")
    assert cli.main(["--config", str(config)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"hfl-peer: {run_dir / CHECKPOINT_NAME}: corrupt checkpoint: SHA-256")
    assert not (run_dir / METRICS_NAME).exists()


def test_a_real_full_file_system_is_named_too(tmp_path, capsys):
    """Without injection: /dev/full answers every write with ENOSPC."""
    if not os.path.exists("/dev/full"):
        pytest.fail("/dev/full is missing on this machine")
    link = tmp_path / "metrics.jsonl"
    link.symlink_to("/dev/full")
    with pytest.raises(RunFileError) as err:
        ckpt.append_line(link, "{}\n")
    assert str(err.value).startswith(f"{link}: ENOSPC (No space left on device): the disk is full")


# ------------------------------------------------------------------ a peer that outlived its cohort

RESTART_TIMING = {"join_timeout_s": 2.0}  # how long a restarted peer looks for its cohort


def fedavg_pair(tmp_path: Path, rounds: int, base: Path | None = None) -> list:
    base = base or tmp_path / "run"
    return [config_from_dict(cfg_dict(base / f"p{i}", f"p{i}", algorithm="fedavg", rounds=rounds,
                                      n=2, index=i, bootstrap=() if i == 0 else ("mem://p0",),
                                      resume=True, checkpoint=True))
            for i in range(2)]


def rewind_checkpoint(run_dir: Path, to_round: int, members: list[str] | None = None) -> None:
    """p1 as if killed after ``to_round``: its checkpoint and metrics end there.

    ``members``: the cohort it remembers, as a checkpoint of that round would. The
    final checkpoint being rewound omits peers that finished and left before it was
    written, and which ones did depends on timing."""
    state = load_checkpoint(run_dir)
    state["round"] = to_round
    if members is not None:
        state["members"] = [[m, f"mem://{m}"] for m in members if m != run_dir.name]
    save_checkpoint(run_dir, state)
    trim_metrics(run_dir / METRICS_NAME, to_round)
    # Killed between rounds: the last round it entered is the one it checkpointed (a
    # peer killed inside round r + 1 would sit that round out when it comes back).
    (run_dir / "entered_round").write_text(str(to_round))


def finished_cohort(tmp_path: Path) -> tuple[list, Path]:
    cfgs = fedavg_pair(tmp_path, rounds=3)
    hub = MemoryHub()

    async def main():
        return await asyncio.gather(*(run_peer(c, hub=hub) for c in cfgs))

    asyncio.run(main())
    p1 = Path(cfgs[1].run_dir)
    # a round-1 checkpoint remembers p0 (the final one omits it if p0 left first)
    rewind_checkpoint(p1, 1, members=[c.node.id for c in cfgs])
    state = load_checkpoint(p1)  # written before the others finished (by its own record)
    state["saved_at"] -= 60
    save_checkpoint(p1, state)
    return cfgs, p1


def test_a_peer_resumed_after_its_cohort_finished_says_so_from_the_run_directory(tmp_path):
    cfgs, p1 = finished_cohort(tmp_path)
    before = (p1 / CHECKPOINT_NAME).read_bytes(), (p1 / METRICS_NAME).read_text()
    with pytest.raises(CohortGone, match=r"the cohort finished round 3 without this peer \(p0"):
        run(cfgs[1])
    assert ((p1 / CHECKPOINT_NAME).read_bytes(), (p1 / METRICS_NAME).read_text()) == before


def test_a_peer_resumed_alone_stops_instead_of_training_alone(tmp_path):
    cfgs, p1 = finished_cohort(tmp_path)
    alone = tmp_path / "elsewhere" / "p1"  # no sibling directories to read: only the network
    alone.parent.mkdir()
    p1.rename(alone)
    cfg = config_from_dict(cfg_dict(alone, "p1", algorithm="fedavg", rounds=3, n=2, index=1,
                                    bootstrap=("mem://p0",), resume=True, checkpoint=True,
                                    timing=RESTART_TIMING))
    before = (alone / CHECKPOINT_NAME).read_bytes(), (alone / METRICS_NAME).read_text()
    with pytest.raises(CohortGone, match="no peer of the cohort answered within "
                                         "timing.join_timeout_s=2s"):
        run(cfg)
    assert ((alone / CHECKPOINT_NAME).read_bytes(), (alone / METRICS_NAME).read_text()) == before


def test_a_pair_restarted_together_after_its_cohort_finished_stops_too(tmp_path):
    # Four peers finish; two of them, rewound as if killed after round 1, restart
    # together elsewhere: they hear each other, but 2 of 4 is no quorum (3).
    base = tmp_path / "run"
    cfgs = [config_from_dict(cfg_dict(base / f"p{i}", f"p{i}", algorithm="fedavg", rounds=3,
                                      n=4, index=i, bootstrap=() if i == 0 else ("mem://p0",),
                                      resume=True, checkpoint=True)) for i in range(4)]
    hub = MemoryHub()

    async def cohort():
        return await asyncio.gather(*(run_peer(c, hub=hub) for c in cfgs))

    asyncio.run(cohort())
    pair = []
    for i in (2, 3):
        moved = tmp_path / "elsewhere" / f"p{i}"
        moved.parent.mkdir(exist_ok=True)
        (base / f"p{i}").rename(moved)
        rewind_checkpoint(moved, 1, members=[c.node.id for c in cfgs])
        pair.append(config_from_dict(cfg_dict(
            moved, f"p{i}", algorithm="fedavg", rounds=200, n=4, index=i,
            bootstrap=() if i == 2 else ("mem://p2",), resume=True, checkpoint=True,
            # long enough for the partner to be built and greet, even on a loaded machine
            timing={"join_timeout_s": 6.0})))
    hub = MemoryHub()

    async def restarted():
        return await asyncio.gather(*(run_peer(c, hub=hub) for c in pair), return_exceptions=True)

    outcomes = asyncio.run(restarted())
    assert all(isinstance(o, CohortGone) for o in outcomes), outcomes
    # The first to decide still had its partner (the other may find itself alone then).
    assert any("only 1 other peer(s) of the cohort answered, fewer than the 3" in str(o)
               for o in outcomes)
    for c in pair:  # the first round was held, then nothing recorded: still after round 1
        assert load_checkpoint(c.run_dir)["round"] == 1
        assert rows(Path(c.run_dir))[-1]["round"] == 1


def test_a_cohort_resumed_peer_by_peer_meets_again_instead_of_splitting(tmp_path, caplog):
    # Both peers stopped after round 1; p0 comes back first, p1 only once p0 has
    # declared it dead. p0 holds its first round until it hears p1, then they share.
    cfgs, _ = finished_cohort(tmp_path)
    rewind_checkpoint(Path(cfgs[0].run_dir), 1, members=[c.node.id for c in cfgs])  # remembers p1
    restarted = [config_from_dict(cfg_dict(
        Path(c.run_dir), c.node.id, algorithm="fedavg", rounds=3, n=2, index=i,
        bootstrap=() if i == 0 else ("mem://p0",), resume=True, checkpoint=True,
        timing={"join_timeout_s": 30.0})) for i, c in enumerate(cfgs)]
    for c in restarted:  # the others' summaries are of the old run: not a finished cohort
        (Path(c.run_dir) / "summary.json").unlink(missing_ok=True)
    hub = MemoryHub()

    async def main():
        first = asyncio.create_task(run_peer(restarted[0], hub=hub))
        deadline = asyncio.get_running_loop().time() + 20
        while "p0: p1 suspect -> dead" not in caplog.text:
            assert asyncio.get_running_loop().time() < deadline, "p0 never declared p1 dead"
            await asyncio.sleep(0.02)
        second = asyncio.create_task(run_peer(restarted[1], hub=hub))
        return await asyncio.gather(first, second)

    with caplog.at_level(logging.INFO, logger="hfl.peer"):
        results = asyncio.run(main())
    assert [r.last_round for r in results] == [3, 3]
    for c in restarted:
        after = [r for r in rows(Path(c.run_dir)) if r["incarnation"] == 1]
        assert [r["round"] for r in after] == [2, 3]
        assert after[-1]["contributors"] == 2  # the last round was shared by both


def test_allow_solo_lets_a_resumed_peer_finish_alone(tmp_path):
    cfgs, p1 = finished_cohort(tmp_path)
    cfg = config_from_dict(cfg_dict(p1, "p1", algorithm="fedavg", rounds=3, n=2, index=1,
                                    bootstrap=("mem://p0",), resume=True, checkpoint=True,
                                    allow_solo=True))
    result = run(cfg)
    assert result.last_round == 3
    assert [r["round"] for r in rows(p1)] == [1, 2, 3]


def test_hfl_peer_exits_3_with_one_line_when_its_cohort_is_gone(tmp_path, capsys):
    cfgs, p1 = finished_cohort(tmp_path)
    config = tmp_path / "p1.yaml"
    d = cfg_dict(p1, "p1", algorithm="fedavg", rounds=3, n=2, index=1,
                 listen=f"tcp://127.0.0.1:{free_tcp_port()}", resume=True, checkpoint=True)
    config.write_text(yaml.safe_dump(d))
    assert cli.main(["--config", str(config)]) == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("hfl-peer: p1: resumed after round 1, but the cohort")


# ------------------------------------------------------------------ evaluation cadence


def test_fold_rounds_sums_costs_averages_training_and_keeps_the_evaluated_round():
    from hfl.peer.rounds import fold_rounds

    rows = [
        {"round": 4, "time": 10.0, "round_time_s": 0.5, "compute_s": 0.25, "bytes_sent": 100,
         "compute_cpu_s": 0.25, "cpu_s": 0.5,
         "bytes_received": 7, "train_loss": 2.0, "live_peers": 3, "learned_from": 0},
        {"round": 5, "time": 11.0, "round_time_s": 0.75, "compute_s": 0.5, "bytes_sent": 50,
         "compute_cpu_s": 0.5, "cpu_s": 1.0,
         "bytes_received": 3, "train_loss": 1.0, "live_peers": 2, "learned_from": 2},
        {"round": 6, "time": 12.0, "round_time_s": 1.0, "compute_s": 0.75, "bytes_sent": 25,
         "compute_cpu_s": 0.75, "cpu_s": 1.5,
         "bytes_received": 1, "train_loss": 0.0, "live_peers": 2, "learned_from": 0,
         "test_acc": 0.9, "total_bytes_sent": 999},
    ]
    line = fold_rounds(rows, {"train_loss"})
    assert line == {"round": 6, "span": 3, "time": 10.0, "round_time_s": 2.25, "compute_s": 1.5,
                    "compute_cpu_s": 1.5, "cpu_s": 3.0,
                    "bytes_sent": 175, "bytes_received": 11, "train_loss": 1.0, "live_peers": 3,
                    "learned_from": 0, "isolated_rounds": 2, "test_acc": 0.9,
                    "total_bytes_sent": 999}
    with pytest.raises(ValueError, match="at least the evaluated round"):
        fold_rounds([], set())


def test_evaluate_every_writes_a_line_and_a_checkpoint_every_n_rounds_and_after_the_last(
        tmp_path, monkeypatch):
    """A 10-round pair evaluating every 4 rounds: lines (and checkpoints) at rounds
    4, 8 and 10 covering 4, 4 and 2 rounds; their bytes add up to what the peer sent
    in rounds; the results table counts rounds, not lines; a resume starts after the
    last evaluated round."""
    from hfl.launch.results import peer_row
    from hfl.peer import runner

    saved, save = [], runner._save
    monkeypatch.setattr(runner, "_save",
                        lambda d, r, *rest: (saved.append((d.name, r)), save(d, r, *rest)))
    cfgs = [config_from_dict(cfg_dict(tmp_path / f"p{i}", f"p{i}", algorithm="fedavg", rounds=10,
                                      n=2, index=i, bootstrap=() if i == 0 else ("mem://p0",),
                                      evaluate_every=4))
            for i in range(2)]
    hub = MemoryHub()

    async def main():
        return await asyncio.gather(*(run_peer(c, hub=hub) for c in cfgs))

    results = asyncio.run(main())
    for cfg, res in zip(cfgs, results, strict=True):
        run_dir = Path(cfg.node.run_dir)
        lines = rows(run_dir)
        assert [(r["round"], r["span"]) for r in lines] == [(4, 4), (8, 4), (10, 2)]
        assert res.rounds_completed == 10 and res.last_round == 10
        assert all("test_acc" in r for r in lines)  # evaluated
        assert all(r["learned_from"] == 1 and r["isolated_rounds"] == 0 for r in lines)
        assert sum(r["bytes_sent"] for r in lines) <= lines[-1]["total_bytes_sent"]
        assert sum(r["bytes_sent"] for r in lines) > 0
        row = peer_row(cfg.node.id, "mlp", run_dir)
        assert row["rounds"] == 10 and row["last_round"] == 10
        assert row["mean_round_s"] == pytest.approx(sum(r["round_time_s"] for r in lines) / 10)
        assert load_checkpoint(run_dir)["round"] == 10
        assert [r for name, r in saved if name == cfg.node.id] == [4, 8, 10]


def test_hfl_peer_writes_its_plots_and_hfl_report_names_its_algorithm(tmp_path, capsys, monkeypatch):
    """Issue 18.9: hfl-peer wrote no plots, and hfl-report on run directories of
    hfl-peer (three organisations each sending theirs) showed `algorithm ?`."""
    import shutil
    import sys

    from hfl.launch.report import main as report

    config, run_dir = write_config(tmp_path, rounds=2)
    assert cli.main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    plots = run_dir / "plots"
    assert sorted(p.name for p in plots.iterdir()) == ["global_acc.png", "test_acc.png", "train_loss.png"]
    assert f"plots in {plots}" in out
    assert json.loads((run_dir / "summary.json").read_text())["algorithm"] == "solo"

    orgs = [tmp_path / "org-a", tmp_path / "org-b", tmp_path / "org-c"]
    for org in orgs:
        shutil.copytree(run_dir, org)
    assert report([*map(str, orgs), "--no-plot"]) == 0
    table = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:]]
    data = json.loads((run_dir / "summary.json").read_text())["data"]
    assert data.startswith("digits, ")  # the data and its split, for like-for-like tables
    assert [tuple(c[i].strip() for i in range(5)) for c in table] == [
        (org.name, "solo", data, "1", "2") for org in orgs]
    assert all("?" not in "".join(c) and " - " not in "|".join(c) for c in table)

    # Without matplotlib: a line saying so, as hfl-launch does; the run still succeeds.
    shutil.rmtree(plots)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["--config", str(config), "--set", "cohort.rounds=3"]) == 0
    assert "hfl-peer: no plots (" in capsys.readouterr().err and not plots.exists()
    monkeypatch.undo()
    # hfl-launch plots the whole run itself: its peers are started with --no-plot.
    assert cli.main(["--config", str(config), "--set", "cohort.rounds=4", "--no-plot"]) == 0
    assert not plots.exists()


def test_hfl_report_takes_damaged_metrics_values_and_records_without_a_traceback(
        tmp_path, capsys):
    # A results review: a test_acc, byte count or incarnation of the wrong type raised
    # TypeError or ValueError in hfl-report (or named no field); a launch.json of JSON that
    # is no object raised AttributeError; the table took "test acc" from the file's last
    # line, a repeated earlier round, not from the last round. What is left out is counted
    # and said under the tables (it was left out without a word: a reader took the
    # numbers for the whole file's); a torn last line (a kill mid-write) is not damage.
    import shutil

    from hfl.launch.report import main as report
    from hfl.launch.results import peer_row, render_table

    config, run_dir = write_config(tmp_path, rounds=3)
    assert cli.main(["--config", str(config), "--no-plot"]) == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = lines[-1]["test_acc"]
    org = Path(shutil.copytree(run_dir, tmp_path / "org"))
    damaged = [{**lines[0], "test_acc": "high", "total_bytes_sent": "lots", "incarnation": "x",
                "live_peers": None, "span": -100}, *lines[1:], {**lines[0], "test_acc": 0.0}]
    (org / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in damaged)
                                       + 'not json\n{"no_round": 1}\n{"round": 4, "te')
    row = peer_row("p0", "mlp", org)
    assert row["test_acc"] == final and row["last_round"] == 3 and row["rounds"] == 3
    assert row["damaged"] == {"lines": 2, "values": 5}
    assert "p0 (2 lines, 5 values); the numbers shown are without them" in render_table([row])
    assert peer_row("p0", "mlp", run_dir)["damaged"] == {}
    assert "damaged" not in render_table([peer_row("p0", "mlp", run_dir)])
    (org / "launch.json").write_text("[1]")
    other = Path(shutil.copytree(run_dir, tmp_path / "other"))
    (other / "launch.json").write_text('{"state": {"x": 1}, "ports": "many"}')
    capsys.readouterr()
    assert report([str(org), str(other), "--no-plot"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"{final:.4f}" in out and "Traceback" not in out
    assert out.count("damaged metrics.jsonl entries left out") == 1 and "(2 lines, 5 values)" in out
    # a metrics "file" that is a folder: one line
    bad = Path(shutil.copytree(run_dir, tmp_path / "bad"))
    (bad / "metrics.jsonl").unlink()
    (bad / "metrics.jsonl").mkdir()
    (bad / "summary.json").unlink()
    assert report([str(bad), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hfl-report: ") and "metrics.jsonl" in err and err.count("\n") == 1, err
