"""Own methods without editing the package (docs/plugins.md): the FedMedian example
as a file, a module and an entry point, through the config checks, both CLIs and a
real cohort; its aggregate checked against numpy's median by hand-made inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from hfl.algorithms.base import Payload, module_to_arrays
from hfl.algorithms.registry import check_name, get_algorithm
from hfl.peer.config import config_from_dict
from hfl.peer.configtools import ConfigError

ROOT = Path(__file__).resolve().parents[1]
FILE_SPEC = f"{ROOT / 'examples' / 'plugins' / 'fedmedian.py'}:FedMedian"


def peer_cfg(tmp_path, algorithm=FILE_SPEC, options=None):
    return config_from_dict({
        "node": {"id": "a", "run_dir": str(tmp_path / "a")}, "security": {"mode": "none"},
        "cohort": {"algorithm": algorithm, "rounds": 1},
        "model": {"arch": "mlp", "options": {"hidden": [4]}},
        "algorithm": options or {},
    })


def build(tmp_path, **kw):
    from hfl.peer.factory import build_algorithm

    return build_algorithm(peer_cfg(tmp_path, **kw))[0]


def test_the_median_of_each_entry_over_the_contributions(tmp_path, caplog):
    alg = build(tmp_path)
    assert type(alg).__name__ == "FedMedian" and alg.name == "fedmedian"
    ref = module_to_arrays(alg.shared())
    name = next(n for n, a in ref.items() if a.ndim == 2)

    def contribution(value):
        return Payload(kind="weights", tensors={n: np.full_like(a, value) for n, a in ref.items()})

    # Odd count: the middle value; a huge outlier does not move it (the mean would be 35.3).
    out = alg.aggregate(1, {"a": contribution(1.0), "b": contribution(5.0), "c": contribution(100.0)})
    assert np.all(out.tensors[name] == 5.0) and out.tensors[name].dtype == ref[name].dtype
    # Even count: the mean of the two middle values, entry by entry.
    rng = np.random.default_rng(0)
    vals = {p: {n: rng.normal(size=a.shape).astype(a.dtype) for n, a in ref.items()} for p in "abcd"}
    out = alg.aggregate(2, {p: Payload(kind="weights", tensors=t) for p, t in vals.items()})
    stacked = np.sort(np.stack([vals[p][name] for p in "abcd"]), axis=0)  # (4, *shape)
    np.testing.assert_allclose(out.tensors[name], (stacked[1] + stacked[2]) / 2, rtol=1e-6)
    # A malformed contribution is left out with a logged reason, not a crash.
    bad = Payload(kind="weights", tensors={name: np.zeros((1, 1), dtype=np.float32)})
    with caplog.at_level("WARNING", logger="hfl.algorithms"):
        out = alg.aggregate(3, {"a": contribution(2.0), "z": bad})
    assert out.meta["excluded"] == ["z"] and np.all(out.tensors[name] == 2.0)
    assert any("contribution of z left out" in r.getMessage() for r in caplog.records)


def test_its_own_options_only(tmp_path):
    assert build(tmp_path, options={"min_contributions": 2}).cfg.min_contributions == 2
    for other in ({"mu": 0.1}, {"weighted": True}):  # FedProx's option; FedAvg's
        with pytest.raises(ConfigError) as err:
            build(tmp_path, options=other)
        assert f"algorithm.{next(iter(other))}" in str(err.value)


def test_bad_specs_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="cohort.algorithm.*did you mean 'fedavg'"):
        peer_cfg(tmp_path, algorithm="fedavgg")
    with pytest.raises(ConfigError, match="cohort.algorithm.*no such file"):
        build(tmp_path, algorithm="nowhere/fedmedian.py:FedMedian")
    with pytest.raises(ConfigError, match="cohort.algorithm.*has no class 'FedMean'"):
        build(tmp_path, algorithm=FILE_SPEC.replace("FedMedian", "FedMean"))
    with pytest.raises(ConfigError, match="cohort.algorithm.*cannot import module"):
        build(tmp_path, algorithm="no_such_pkg.fedmedian:FedMedian")


def test_two_plugin_files_are_two_modules_and_one_that_exits_is_an_error(tmp_path):
    # A plugin review: a/b_c.py and a_b/c.py made one module name, and the second file's
    # class was the first's; a plugin calling sys.exit(7) as it loaded ended the launcher
    # with status 7 and no word.
    for folder, file, attr in (("a", "b_c.py", "One"), ("a_b", "c.py", "Two")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / file).write_text(
            f"from hfl.algorithms.fedavg import FedAvg\nclass {attr}(FedAvg):\n"
            f"    name = '{attr.lower()}'\n")
    assert get_algorithm(f"{tmp_path / 'a' / 'b_c.py'}:One").__name__ == "One"
    assert get_algorithm(f"{tmp_path / 'a_b' / 'c.py'}:Two").__name__ == "Two"
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(7)\n")
    with pytest.raises(ValueError, match=r"exits.py: loading the plugin failed: SystemExit: 7"):
        get_algorithm(f"{tmp_path / 'exits.py'}:Alg")


def test_a_plugin_cannot_take_a_built_in_name(tmp_path):
    (tmp_path / "clash.py").write_text(
        "from hfl.algorithms.fedavg import FedAvg\n"
        "class Clash(FedAvg):\n    name = 'fedavg'\n")
    with pytest.raises(ValueError, match="built-in algorithm's name"):
        get_algorithm(f"{tmp_path / 'clash.py'}:Clash")


def test_an_installed_entry_point_is_an_algorithm_name(tmp_path, monkeypatch, capsys):
    # What `pip install my-fedmedian` leaves in site-packages: the module and its
    # dist-info with an entry point of group hfl.algorithms.
    site = tmp_path / "site"
    (site / "my_fedmedian-0.1.dist-info").mkdir(parents=True)
    (site / "my_fedmedian-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: my-fedmedian\nVersion: 0.1\n")
    (site / "my_fedmedian-0.1.dist-info" / "entry_points.txt").write_text(
        "[hfl.algorithms]\nfedmedian = my_fedmedian:FedMedian\n")
    (site / "my_fedmedian.py").write_text((ROOT / "examples" / "plugins" / "fedmedian.py").read_text())
    with pytest.raises(ValueError):
        check_name("fedmedian")  # not installed yet
    monkeypatch.syspath_prepend(str(site))
    check_name("fedmedian")
    assert get_algorithm("fedmedian").__name__ == "FedMedian"
    assert get_algorithm("my_fedmedian:FedMedian") is get_algorithm("fedmedian")  # module:Class
    from hfl.peer.cli import main

    path = tmp_path / "peer.yaml"
    path.write_text(yaml.safe_dump({
        "node": {"id": "a", "run_dir": str(tmp_path / "a")}, "security": {"mode": "none"},
        "cohort": {"algorithm": "fedmedian"}, "model": {"arch": "mlp", "options": {"hidden": [4]}}}))
    assert main(["--config", str(path), "--check"]) == 0
    assert "fedmedian" in capsys.readouterr().out


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_cohort_runs_the_plugin_through_hfl_launch(tmp_path):
    exp = {
        "name": "median", "peers": 3, "run_dir": str(tmp_path / "run"),
        "defaults": {
            "cohort": {"algorithm": "examples/plugins/fedmedian.py:FedMedian", "rounds": 2},
            "data": {"dataset": "digits", "partition": "iid"},
            "model": {"arch": "mlp", "options": {"hidden": [32]}},
            "train": {"max_batches": 4},
            "timing": {"heartbeat_interval_s": 0.2, "suspect_after_s": 0.8, "dead_after_s": 1.6,
                       "round_timeout_s": 15, "join_timeout_s": 60},
        },
    }
    path = tmp_path / "median.yaml"
    path.write_text(yaml.safe_dump(exp))
    proc = subprocess.run([sys.executable, "-m", "hfl.launch.cli", str(path), "--quiet"],
                          capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["peer"]: r for r in json.loads((tmp_path / "run" / "results.json").read_text())["peers"]}
    assert all(rows[p]["rounds"] == 2 and rows[p]["cohort"] == "3" for p in ("p0", "p1", "p2"))
    # Every peer loaded the same median model: one global accuracy.
    assert len({rows[p]["global_acc"] for p in ("p0", "p1", "p2")}) == 1
