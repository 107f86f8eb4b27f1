"""``hfl-export``: a real run's models, loaded with plain ``torch.load(weights_only=True)``
and rebuilt with the public ``hfl.models.build_model``, give the test accuracy the run
recorded for them; the docs' loading snippet runs; bad requests are one line each."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from hfl.launch.export import main
from hfl.peer.checkpoint import load_checkpoint, read_jsonl, save_checkpoint
from tests.test_users import small_fedavg_experiment

DOCS = Path(__file__).resolve().parents[1] / "docs" / "runs.md"
ROUNDS = 4


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Path:
    """A finished 2-peer FedAvg run of hfl-launch (in one process) with a validation
    split, so that each peer selects a model; lr 0.5 makes validation accuracy swing."""
    from hfl.launch.cli import main as launch

    tmp = tmp_path_factory.mktemp("launched")
    _, path = small_fedavg_experiment(tmp, "export", peers=2, max_batches=2)
    assert launch([str(path), "--in-process", "--quiet", "--set", f"defaults.cohort.rounds={ROUNDS}",
                   "--set", "defaults.data.val_fraction=0.2", "--set", "defaults.train.lr=0.5"]) == 0
    return tmp / "run"


@pytest.fixture(scope="module")
def solo(tmp_path_factory) -> Path:
    """One hfl-peer run directory (solo, 1 round, no validation split: nothing selected)."""
    from hfl.peer.config import config_from_dict
    from hfl.peer.runner import run_peer
    from hfl.peer.transport import MemoryHub

    run_dir = tmp_path_factory.mktemp("solo") / "a"
    cfg = config_from_dict({
        "security": {"mode": "none"},
        "node": {"id": "a", "listen": "mem://a", "run_dir": str(run_dir)},
        "cohort": {"algorithm": "solo", "rounds": 1},
        "model": {"arch": "mlp", "options": {"hidden": [8]}}, "train": {"max_batches": 1},
    })
    asyncio.run(run_peer(cfg, hub=MemoryHub()))
    return run_dir


def copy_run(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / run.name))


def peer_test_split(run: Path, peer: str):
    """The peer's own test split, as its config builds it."""
    from hfl.peer.config import load_config
    from hfl.peer.factory import load_peer_data

    return load_peer_data(load_config(str(run / "peers" / f"{peer}.yaml")).data).test


def rebuilt(path: Path) -> tuple[torch.nn.Module, dict]:
    """The exported model, through plain torch.load and the public builder only."""
    from hfl.models import build_model

    ckpt = torch.load(path, weights_only=True)
    m = ckpt["model"]
    model = build_model(m["arch"], m["input_shape"], m["num_classes"], m["embedding_dim"],
                        **m["options"])
    model.load_state_dict(ckpt["state_dict"], strict=True)
    return model.eval(), ckpt


@torch.no_grad()
def accuracy(model: torch.nn.Module, ds) -> float:
    pred = model(torch.as_tensor(ds.x)).argmax(dim=1)  # (N,)
    return float((pred == torch.as_tensor(ds.y)).double().mean())


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("hfl-export: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---------------------------------------------------------------- exports


def test_final_and_selected_models_reproduce_the_accuracy_the_run_recorded(launched, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(launched), "--all", "--out", str(out)]) == 0
    assert main([str(launched), "--which", "selected", "--peer", "p0", "--out", str(out)]) == 0
    assert "p0: selected model of round" in capsys.readouterr().out
    assert sorted(f.name for f in out.iterdir()) == [
        "p0.json", "p0.pt", "p0.selected.json", "p0.selected.pt", "p1.json", "p1.pt"]

    for peer in ("p0", "p1"):
        rows = {r["round"]: r for r in read_jsonl(launched / peer / "metrics.jsonl")}
        test = peer_test_split(launched, peer)
        model, ckpt = rebuilt(out / f"{peer}.pt")
        assert ckpt["peer"] == peer and ckpt["which"] == "final" and ckpt["round"] == ROUNDS
        assert accuracy(model, test) == rows[ROUNDS]["test_acc"] == ckpt["metrics"]["test_acc"]
        # The same weights as hfl's own checkpoint reader restores (an independent path).
        internal = load_checkpoint(launched / peer)["algorithm"]["model"]
        assert all(torch.equal(internal[k], v) for k, v in ckpt["state_dict"].items())
        # The JSON is the same metadata without the tensors.
        meta = json.loads((out / f"{peer}.json").read_text())
        assert meta == {k: v for k, v in ckpt.items() if k != "state_dict"}
        assert meta["model"] == {"arch": "mlp", "input_shape": [1, 8, 8], "num_classes": 10,
                                 "embedding_dim": 64, "options": {"hidden": [16]}}

    rows = {r["round"]: r for r in read_jsonl(launched / "p0" / "metrics.jsonl")}
    chosen = max(r for r, row in rows.items() if row.get("newly_selected"))
    model, ckpt = rebuilt(out / "p0.selected.pt")
    assert ckpt["which"] == "selected" and ckpt["round"] == chosen
    assert ckpt["metrics"]["val_acc"] == max(row["val_acc"] for row in rows.values())
    if chosen < ROUNDS:  # (lr 0.5: validation accuracy peaks before the last round)
        final = torch.load(out / "p0.pt", weights_only=True)["state_dict"]
        assert any(not torch.equal(final[k], v) for k, v in ckpt["state_dict"].items())
    acc = accuracy(model, peer_test_split(launched, "p0"))
    assert acc == rows[chosen]["test_acc"] == rows[ROUNDS]["sel_test_acc"] == ckpt["metrics"]["test_acc"]


def test_the_loading_snippet_in_the_docs_runs(launched, tmp_path, monkeypatch):
    section = DOCS.read_text().split("## Getting a trained model out", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert main([str(launched), "--peer", "p0", "--out", str(tmp_path / "export")]) == 0
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(snippet.replace("runs/quickstart/export/p0.pt", "export/p0.pt"), namespace)
    model = namespace["model"]
    assert not model.training and model(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert accuracy(model, peer_test_split(launched, "p0")) == namespace["ckpt"]["metrics"]["test_acc"]


def test_one_hfl_peer_run_directory_exports_under_its_peer_id(solo, capsys):
    assert main([str(solo), "--out", str(solo.parent / "out")]) == 0
    model, ckpt = rebuilt(solo.parent / "out" / "a.pt")
    assert ckpt["peer"] == "a" and ckpt["round"] == 1 and ckpt["model"]["options"] == {"hidden": [8]}


def test_a_checkpoint_without_a_model_description_is_described_from_the_peer_config(launched, tmp_path):
    run = copy_run(launched, tmp_path)
    state = load_checkpoint(run / "p1")
    expected = state.pop("model")
    save_checkpoint(run / "p1", state)  # as an hfl before checkpoints carried it
    assert main([str(run), "--peer", "p1"]) == 0
    _, ckpt = rebuilt(run / "export" / "p1.pt")
    assert ckpt["model"] == expected


@pytest.mark.skipif(__import__("importlib").util.find_spec("safetensors") is None,
                    reason="safetensors is not installed")
def test_safetensors_holds_the_same_weights_and_the_metadata(launched, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    assert main([str(launched), "--peer", "p0", "--format", "safetensors", "--out", str(tmp_path)]) == 0
    weights = load_file(tmp_path / "p0.safetensors")
    internal = load_checkpoint(launched / "p0")["algorithm"]["model"]
    assert weights.keys() == internal.keys()
    assert all(torch.equal(internal[k], v) for k, v in weights.items())
    with safe_open(tmp_path / "p0.safetensors", "pt") as f:
        assert json.loads(f.metadata()["hfl"]) == json.loads((tmp_path / "p0.json").read_text())


def test_the_algorithm_keeps_the_selected_weights_in_its_checkpoint_state():
    import numpy as np

    from hfl.algorithms.base import Algorithm, AlgorithmContext
    from hfl.data import ArrayDataset

    def ds(labels):
        return ArrayDataset(np.zeros((len(labels), 1), np.float32), np.array(labels), 2)

    def constant(cls: int) -> dict:  # a linear model that always predicts ``cls``
        return {"weight": torch.zeros(2, 1), "bias": torch.eye(2)[cls]}

    model = torch.nn.Linear(1, 2)
    model.load_state_dict(constant(0))
    ctx = AlgorithmContext(peer_id="p0", model=model, train=ds([1, 1]), test=ds([0, 0, 0, 1]),
                           num_classes=2, device=torch.device("cpu"), seed=0, val=ds([0, 1]))
    alg = Algorithm(ctx)
    assert alg.evaluate()["newly_selected"] == 1.0  # val 1/2: the first model is selected
    alg.model.load_state_dict(constant(1))
    assert "newly_selected" not in alg.evaluate()  # tied on val: the earliest is kept
    state = alg.state_dict()
    assert all(torch.equal(state["selected_model"][k], v) for k, v in constant(0).items())
    restored = Algorithm(ctx)
    restored.load_state_dict(state)
    assert all(torch.equal(restored.selected_model[k], v) for k, v in constant(0).items())


# ---------------------------------------------------------------- bad requests


def test_a_folder_that_is_no_run_directory_is_refused(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no such run directory" in one_line_error(capsys)
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "is not a run directory" in one_line_error(capsys)
    (tmp_path / "seeds" / "seed0" / "p0").mkdir(parents=True)  # hfl-launch --seeds
    (tmp_path / "seeds" / "seed0" / "p0" / "metrics.jsonl").touch()
    assert main([str(tmp_path / "seeds")]) == 2
    assert "--seeds" in one_line_error(capsys)


def test_an_unknown_peer_is_refused_listing_the_peers(launched, capsys):
    assert main([str(launched), "--peer", "p7"]) == 2
    err = one_line_error(capsys)
    assert "no peer p7" in err and "p0, p1" in err


def test_a_peer_without_a_checkpoint_yet_is_refused(launched, tmp_path, capsys):
    run = copy_run(launched, tmp_path)
    (run / "p1" / "checkpoint.pt").unlink()
    assert main([str(run), "--out", str(tmp_path / "out")]) == 2
    assert "p1: no checkpoint yet" in one_line_error(capsys)
    assert not (tmp_path / "out").exists()  # nothing written, not even p0's


def test_a_selected_model_is_refused_where_none_was_selected(solo, capsys):
    assert main([str(solo), "--which", "selected", "--out", str(solo.parent / "sel")]) == 2
    err = one_line_error(capsys)
    assert "no selected model" in err and "val_fraction" in err and "--which final" in err


def test_existing_files_are_kept_unless_forced(launched, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(launched), "--peer", "p0", "--out", str(out)]) == 0
    (out / "p0.pt").write_bytes(b"mine")
    assert main([str(launched), "--peer", "p0", "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert "p0.pt exists already" in err and "--force" in err
    assert (out / "p0.pt").read_bytes() == b"mine"
    assert main([str(launched), "--peer", "p0", "--out", str(out), "--force"]) == 0
    assert rebuilt(out / "p0.pt")[1]["peer"] == "p0"


def test_safetensors_without_the_package_names_the_install(launched, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed
    assert main([str(launched), "--format", "safetensors", "--out", str(tmp_path)]) == 2
    assert "pip install safetensors" in one_line_error(capsys)


def test_a_corrupt_checkpoint_is_one_line_naming_the_file(launched, tmp_path, capsys):
    run = copy_run(launched, tmp_path)
    data = bytearray((run / "p0" / "checkpoint.pt").read_bytes())
    data[-10] ^= 0xFF
    (run / "p0" / "checkpoint.pt").write_bytes(bytes(data))
    assert main([str(run), "--peer", "p0"]) == 1
    err = one_line_error(capsys)
    assert str(run / "p0" / "checkpoint.pt") in err and "corrupt" in err


# ---------------------------------------------------------------- hfl-eval


def test_hfl_eval_gives_the_recorded_accuracy_on_the_peers_own_splits(launched, tmp_path, capsys):
    from hfl.launch.evaluate import main as hfl_eval

    npz = tmp_path / "p0.npz"
    assert hfl_eval([str(launched), "--peer", "p0", "--save-splits", str(npz)]) == 0
    out = capsys.readouterr().out
    assert f"p0: final model of round {ROUNDS}" in out
    assert "test         acc" in out and "DIFFERENT" not in out
    assert out.count("the same as the run recorded") == 3  # test, global test, validation
    # The arrays, through plain numpy and the exported model only (an independent path).
    import numpy as np

    arrays = np.load(npz)
    assert {"train_x", "train_y", "test_x", "test_y", "val_x", "val_y", "global_test_x"} <= set(arrays)
    assert main([str(launched), "--peer", "p0", "--out", str(tmp_path / "export")]) == 0
    model, ckpt = rebuilt(tmp_path / "export" / "p0.pt")
    pred = model(torch.as_tensor(arrays["test_x"])).argmax(dim=1)
    assert float((pred == torch.as_tensor(arrays["test_y"])).double().mean()) == ckpt["metrics"]["test_acc"]

    assert hfl_eval([str(launched), "--peer", "p0", "--which", "selected"]) == 0
    out = capsys.readouterr().out
    assert out.count("the same as the run recorded") == 3  # test, global test, validation
    # The file is kept unless --force, and a name without .npz is said as numpy writes it
    # (it printed "splits" and wrote splits.npz, and overwrote an existing file: a review)
    before = npz.read_bytes()
    assert hfl_eval([str(launched), "--peer", "p0", "--save-splits", str(npz)]) == 2
    assert f"{npz} exists: --force overwrites it" in capsys.readouterr().err
    assert npz.read_bytes() == before
    assert hfl_eval([str(launched), "--peer", "p0", "--save-splits", str(tmp_path / "s")]) == 0
    assert f"splits as arrays: {tmp_path / 's.npz'}" in capsys.readouterr().out
    assert (tmp_path / "s.npz").exists()
    assert hfl_eval([str(launched), "--peer", "p0", "--save-splits", str(npz), "--force"]) == 0


def test_hfl_eval_reproduces_a_csvs_one_hot_columns_and_z_scores(tmp_path, capsys):
    """A CSV with a categorical column, standardised with its private split's
    statistics: the rebuilt splits are preprocessed exactly as in the run."""
    import numpy as np
    import yaml

    from hfl.launch.cli import main as launch
    from hfl.launch.evaluate import main as hfl_eval
    from hfl.launch.evaluate import peer_splits

    rng = np.random.default_rng(0)
    n = 300
    a, b = rng.normal(50, 10, n), rng.normal(-3, 0.1, n)
    colour = rng.choice(["red", "green", "blue"], n)
    label = ((a - 50) / 10 + (b + 3) / 0.1 + (colour == "red") > 0).astype(int)
    lines = ["a,b,colour,label"] + [f"{x:.4f},{y:.4f},{c},{t}" for x, y, c, t in zip(a, b, colour, label, strict=True)]
    (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")
    exp = {"name": "csv", "peers": 2, "run_dir": str(tmp_path / "run"),
           "defaults": {"cohort": {"algorithm": "fedavg", "rounds": 2},
                        "data": {"dataset": "csv", "path": str(tmp_path / "rows.csv"), "target": "label",
                                 "partition": "iid", "options": {"categorical": ["colour"]}},
                        "model": {"arch": "mlp", "options": {"hidden": [8]}},
                        "timing": {"heartbeat_interval_s": 0.1, "join_timeout_s": 30}}}
    (tmp_path / "csv.yaml").write_text(yaml.safe_dump(exp))
    assert launch([str(tmp_path / "csv.yaml"), "--in-process", "--quiet"]) == 0
    capsys.readouterr()
    assert hfl_eval([str(tmp_path / "run"), "--peer", "p1"]) == 0
    assert "DIFFERENT" not in capsys.readouterr().out
    x, _ = peer_splits(tmp_path / "run", "p1")["train"]
    assert x.shape[1] == 5  # a, b and one column per colour
    numeric = x[:, :2]  # z-scored with the private split's own mean and std
    assert np.allclose(numeric.mean(0), 0, atol=1e-5) and np.allclose(numeric.std(0), 1, atol=1e-2)


def test_hfl_eval_says_which_split_moved_when_the_data_changed(launched, tmp_path, capsys):
    from hfl.launch.evaluate import main as hfl_eval

    run = copy_run(launched, tmp_path)
    config = run / "peers" / "p0.yaml"
    config.write_text(config.read_text().replace("seed: 0", "seed: 5"))
    assert hfl_eval([str(run), "--peer", "p0"]) == 1
    captured = capsys.readouterr()
    assert "DIFFERENT" in captured.out and "not the recorded accuracy" in captured.err


def test_hfl_eval_with_no_recorded_accuracy_to_compare_is_not_a_pass(launched, tmp_path, capsys):
    # The metrics line of the checkpoint's round gone: every split "the run recorded
    # none", and exit 0, which says every split gave the recorded accuracy (a review).
    run = copy_run(launched, tmp_path)
    metrics = run / "p0" / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()
                               if f'"round": {ROUNDS},' not in line))
    from hfl.launch.evaluate import main as hfl_eval

    assert hfl_eval([str(run), "--peer", "p0"]) == 1
    captured = capsys.readouterr()
    assert captured.out.count("the run recorded none") == 3
    assert "nothing was checked" in captured.err


def test_hfl_eval_of_one_hfl_peer_run_asks_for_its_config(solo, tmp_path, capsys):
    import yaml

    from hfl.launch.evaluate import main as hfl_eval

    assert hfl_eval([str(solo), "--peer", "a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hfl-eval: ") and "--config" in err and "Traceback" not in err
    config = tmp_path / "a.yaml"
    config.write_text(yaml.safe_dump({
        "security": {"mode": "none"}, "node": {"id": "a", "listen": "mem://a", "run_dir": str(solo)},
        "cohort": {"algorithm": "solo", "rounds": 1},
        "model": {"arch": "mlp", "options": {"hidden": [8]}}, "train": {"max_batches": 1}}))
    assert hfl_eval([str(solo), "--peer", "a", "--config", str(config)]) == 0
    assert "the same as the run recorded" in capsys.readouterr().out


def test_a_fedhp_peers_prototype_head_is_rebuilt_from_its_model_description(tmp_path, capsys):
    # A review: hfl-export and hfl-eval refused every fedhp run ("does not rebuild the
    # checkpoint's weights": FedHP puts a prototype head in place of the linear one).
    # The description names the head, and the public builder rebuilds it.
    from hfl.peer.config import config_from_dict
    from hfl.peer.factory import build_algorithm, model_spec

    run_dir = tmp_path / "p0"
    cfg = config_from_dict({
        "security": {"mode": "none"},
        "node": {"id": "p0", "listen": "mem://p0", "run_dir": str(run_dir)},
        "cohort": {"algorithm": "fedhp", "rounds": 1},
        "algorithm": {"proto_dim": 12, "head_layers": 2},
        "model": {"arch": "mlp", "options": {"hidden": [16]}}, "train": {"max_batches": 1}})
    alg, num_classes = build_algorithm(cfg)
    data = alg.ctx
    spec = model_spec(cfg, data.train.input_shape, num_classes)
    assert spec["options"]["head"] == {"kind": "proto", "proto_dim": 12, "layers": 2,
                                       "normalize_decision": False}
    run_dir.mkdir()
    save_checkpoint(run_dir, {"round": 1, "model": spec, "algorithm": alg.state_dict(),
                              "incarnation": 0, "torch_rng": torch.get_rng_state(),
                              "members": [], "owner": None, "saved_at": 0.0})
    assert main([str(run_dir), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr()
    model, _ = rebuilt(tmp_path / "out" / "p0.pt")
    x = torch.as_tensor(data.test.x[:8])
    alg.model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), alg.model(x))  # the same predictions as the peer's
    # The head is the method's to set: a fedavg config's model.options.head is refused (a
    # review: a plain hfl-peer trained a prototype head for fedavg).
    from hfl.peer.configtools import ConfigError
    from hfl.peer.factory import model_options

    with pytest.raises(ConfigError, match=r"^model\.options\.head: not an option"):
        model_options(config_from_dict({"node": {"id": "p0"}, "cohort": {"algorithm": "fedavg"},
                                        "model": {"arch": "mlp", "options": {"head": {
                                            "kind": "proto", "proto_dim": 4}}}}))


def test_a_checkpoint_of_another_peer_or_run_is_refused_not_exported_as_this_one(
        launched, solo, tmp_path, capsys):
    # A review: another run's (or method's, or peer's) checkpoint copied into p0's folder
    # was exported, with p0's accuracies, and hfl-eval blamed the data, or raised.
    from hfl.launch.evaluate import main as hfl_eval

    run = copy_run(launched, tmp_path)
    shutil.copy(run / "p1" / "checkpoint.pt", run / "p0" / "checkpoint.pt")
    assert main([str(run), "--peer", "p0", "--out", str(tmp_path / "x")]) == 2
    assert "holds the rounds of peer 'p1', not of p0" in one_line_error(capsys)
    assert not (tmp_path / "x").exists()
    shutil.copy(solo / "checkpoint.pt", run / "p0" / "checkpoint.pt")  # peer "a"
    for peer_dir in (run / "p1", run / "p0"):
        state = load_checkpoint(peer_dir)
        state["owner"] = {**state["owner"], "peer": peer_dir.name}
        save_checkpoint(peer_dir, state)
    assert main([str(run), "--peer", "p0"]) == 2
    err = one_line_error(capsys)
    assert "is not of this run" in err
    assert re.search(r"cohort '[^']+', this run's 'export'.*algorithm 'solo', this run's "
                     r"'fedavg'", err), err
    assert hfl_eval([str(run), "--peer", "p0"]) != 0
    assert "is not of this run" in capsys.readouterr().err
    assert main([str(run), "--peer", "p1"]) == 0  # its own: exported


def test_a_peer_id_that_is_not_one_is_refused_before_any_file_is_written(solo, tmp_path, capsys):
    # A review: a single peer's folder whose metrics name its peer "../../x" exported to
    # <out>/../../x.pt, outside the folder asked for.
    peer = Path(shutil.copytree(solo, tmp_path / "a"))
    metrics = peer / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"peer": "a"', '"peer": "../../pwned"'))
    assert main([str(peer), "--out", str(tmp_path / "out")]) == 2
    assert "names its peer '../../pwned', not a peer id" in one_line_error(capsys)
    assert not list(tmp_path.rglob("pwned*"))


def test_damaged_metrics_values_are_skipped_not_a_traceback(launched, tmp_path, capsys):
    # A review: a line whose round is "x", null or NaN raised from int(); an inf accuracy
    # was written into the export's JSON as Infinity (not JSON). What was left out is said
    # and kept in the JSON file beside the metrics.
    run = copy_run(launched, tmp_path)
    metrics = run / "p0" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    last = json.loads(lines[-1])
    bad = [json.dumps({**last, "round": v}) for v in ("x", None)] + ['{"round": NaN}']
    metrics.write_text("\n".join(lines[:-1] + bad + [json.dumps({**last, "test_acc": 1e999})])
                       + "\n")
    assert main([str(run), "--peer", "p0", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr()
    meta = json.loads((tmp_path / "out" / "p0.json").read_text())  # strict JSON: no Infinity
    assert "test_acc" not in meta["metrics"] and meta["round"] == ROUNDS
    assert meta["damaged_metrics"] == {"lines": 3, "values": 1}
    assert "hfl-export: warning: damaged metrics.jsonl entries left out" in capsys.readouterr().err


def test_hfl_eval_on_data_the_model_cannot_read_names_the_split_and_shapes(
        launched, tmp_path, capsys):
    # A review: another dataset's config gave a traceback from the model's matrix product
    # ("mat1 and mat2 shapes cannot be multiplied"); labels beyond the model's classes an
    # accuracy that could never be 1.
    import yaml

    from hfl.launch.evaluate import main as hfl_eval

    cfg = yaml.safe_load((launched / "peers" / "p0.yaml").read_text())
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**cfg, "data": {**cfg["data"], "dataset": "breast_cancer"}}))
    assert hfl_eval([str(launched), "--peer", "p0", "--config", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"the test split of {other} has samples of shape (30,); the model takes (1, 8, 8)" in err
    assert err.startswith("hfl-eval: ") and "Traceback" not in err
