from __future__ import annotations  # string annotations: build() must resolve them

import ast
import dataclasses
import pickle
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
import yaml

from hfl.peer import configtools
from hfl.peer.configtools import (
    ConfigError,
    apply_overrides,
    build,
    describe,
    load,
    load_yaml,
    setting,
    to_dict,
)


@dataclass(frozen=True)
class Timing:
    round_timeout_s: float = field(default=30.0, metadata={"gt": 0, "help": "round deadline"})
    suspect_after_s: float = setting(5.0, gt=0)
    dead_after_s: float = setting(15.0, gt=0)

    def validate(self) -> None:
        if not self.suspect_after_s < self.dead_after_s:
            raise ValueError(
                f"suspect_after_s ({self.suspect_after_s}) must be < dead_after_s ({self.dead_after_s})"
            )


@dataclass(frozen=True)
class PeerSpec:
    id: str = setting(pattern=r"[a-z][a-z0-9_-]*", help="unique peer name")
    address: str = setting()
    lr: float = setting(0.01, gt=0, max=1)
    device: str | None = None
    weight: Optional[float] = setting(None, min=0)  # noqa: UP045 - Optional[] must work too
    batch_sizes: tuple[int, ...] = setting((32,), min=1)


@dataclass(frozen=True)
class Algorithm:
    name: Literal["solo", "fedavg", "fedprox"] = "fedavg"
    mu: float = setting(0.0, min=0, help="proximal weight")
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    peers: tuple[PeerSpec, ...]
    algorithm: Algorithm = field(default_factory=Algorithm)
    timing: Timing = field(default_factory=Timing)
    rounds: int = setting(10, min=1)
    seeds: list[int] = field(default_factory=list)
    backend: str = setting("zmq", choices=("zmq", "inproc"))
    tags: dict[str, str] = field(default_factory=dict)
    verbose: bool = False


CONFIG_YAML = """\
algorithm:
  name: fedprox
  mu: 1e-3            # YAML 1.1 reads this as a string; float fields accept it
  extra: {momentum: 0.9}
timing:
  round_timeout_s: 60  # an int where a float is expected
peers:
  - {id: alice, address: "tcp://127.0.0.1:5555", lr: 1, device: "cuda:0"}
  - id: bob
    address: inproc://bob
    weight: 2
    batch_sizes: [16, 64]
seeds: [1, 2, 3]
tags: {site: lab}
verbose: yes
"""

PEERS = [{"id": "alice", "address": "inproc://a"}, {"id": "bob", "address": "inproc://b"}]


def _error(cls, data) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build(cls, data)
    return info.value


def test_realistic_yaml_builds(tmp_path: Path) -> None:
    file = tmp_path / "cfg.yaml"
    file.write_text(CONFIG_YAML)
    cfg = build(Config, load_yaml(file))

    assert cfg.algorithm == Algorithm(name="fedprox", mu=0.001, extra={"momentum": 0.9})
    assert cfg.timing == Timing(round_timeout_s=60.0)
    assert type(cfg.timing.round_timeout_s) is float
    assert isinstance(cfg.peers, tuple) and len(cfg.peers) == 2
    alice, bob = cfg.peers
    assert (alice.lr, type(alice.lr), alice.device, alice.weight) == (1.0, float, "cuda:0", None)
    assert bob.batch_sizes == (16, 64) and bob.weight == 2.0 and bob.lr == 0.01
    assert cfg.seeds == [1, 2, 3] and cfg.tags == {"site": "lab"} and cfg.verbose is True
    assert (cfg.rounds, cfg.backend) == (10, "zmq")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rounds = 3  # type: ignore[misc]


def test_none_and_empty_sections_mean_defaults() -> None:
    assert build(Timing, None) == Timing()
    cfg = build(Config, {"peers": [], "timing": None, "algorithm": {}})
    assert cfg.timing == Timing() and cfg.algorithm == Algorithm()


def test_constraint_message_names_path_value_and_rule() -> None:
    err = _error(Config, {"peers": [], "timing": {"round_timeout_s": -1}})
    assert err.path == "timing.round_timeout_s"
    assert str(err) == "timing.round_timeout_s: got -1 (int); expected a number > 0"


@pytest.mark.parametrize(
    ("data", "path", "expected"),
    [
        ({"peers": [{**PEERS[0], "lr": 1.5}]}, "peers[0].lr", "expected a number > 0 and <= 1"),
        ({"peers": [{**PEERS[0], "lr": 0}]}, "peers[0].lr", "got 0 (int)"),
        ({"peers": [], "rounds": 0}, "rounds", "expected an integer >= 1"),
        ({"peers": [], "algorithm": {"mu": float("nan")}}, "algorithm.mu", "got nan"),
        (
            {"peers": [PEERS[0], {**PEERS[1], "batch_sizes": [8, 0]}]},
            "peers[1].batch_sizes[1]",
            ">= 1",
        ),
        ({"peers": [{**PEERS[0], "weight": -0.5}]}, "peers[0].weight", ">= 0"),
    ],
)
def test_bounds(data, path, expected) -> None:
    err = _error(Config, data)
    assert err.path == path
    assert expected in str(err)


def test_bounds_are_inclusive_for_min_max() -> None:
    cfg = build(Config, {"peers": [{**PEERS[0], "lr": 1, "weight": 0}], "rounds": 1})
    assert cfg.peers[0].lr == 1.0 and cfg.peers[0].weight == 0.0 and cfg.rounds == 1


def test_missing_required_field_names_path() -> None:
    err = _error(Config, {"peers": [PEERS[0], {"id": "carol"}]})
    assert err.path == "peers[1].address"
    assert "missing required field" in str(err)
    err = _error(Config, {})
    assert err.path == "peers"
    err = _error(Config, {"peers": [{"address": "x"}]})
    assert "unique peer name" in str(err)  # the help text is shown


def test_unknown_key_lists_allowed_and_suggests() -> None:
    err = _error(Config, {"peers": [], "timing": {"round_timout_s": 3}})
    assert err.path == "timing.round_timout_s"
    assert "unknown key" in str(err)
    assert "round_timeout_s, suspect_after_s, dead_after_s" in str(err)
    assert "did you mean 'round_timeout_s'?" in str(err)

    err = _error(Config, {"peers": [], "zzz": 1, "qqq": 2})
    assert err.path == "zzz" and "did you mean" not in str(err) and "'qqq'" in str(err)


def test_literal_error_lists_allowed_values_with_hint() -> None:
    err = _error(Config, {"peers": [], "algorithm": {"name": "fedvg"}})
    assert err.path == "algorithm.name"
    assert str(err) == (
        "algorithm.name: got 'fedvg'; allowed: 'solo', 'fedavg', 'fedprox'; did you mean 'fedavg'?"
    )
    assert "did you mean" not in str(_error(Algorithm, {"name": "scaffold"}))
    assert "did you mean 'fedavg'" in str(_error(Algorithm, {"name": "FedAvg"}))


def test_choices_and_pattern() -> None:
    err = _error(Config, {"peers": [], "backend": "zmg"})
    assert err.path == "backend"
    assert "allowed: 'zmq', 'inproc'" in str(err) and "did you mean 'zmq'" in str(err)

    err = _error(Config, {"peers": [{**PEERS[0], "id": "Bad Id"}]})
    assert err.path == "peers[0].id"
    assert "got 'Bad Id'; expected a string matching" in str(err)


@pytest.mark.parametrize(
    ("data", "path", "expected"),
    [
        ({"peers": [], "rounds": True}, "rounds", "got True (bool); expected int"),
        ({"peers": [], "rounds": 2.0}, "rounds", "got 2.0 (float); expected int"),
        ({"peers": [], "timing": {"dead_after_s": False}}, "timing.dead_after_s", "expected float"),
        (
            {"peers": [], "timing": {"dead_after_s": "soon"}},
            "timing.dead_after_s",
            "expected float",
        ),
        ({"peers": [], "verbose": "true"}, "verbose", "got 'true' (str); expected bool"),
        ({"peers": [{**PEERS[0], "id": 7}]}, "peers[0].id", "quote it in YAML"),
        ({"peers": [{**PEERS[0], "device": 0}]}, "peers[0].device", "expected str"),
        ({"peers": [], "seeds": "1,2"}, "seeds", "expected list[int]"),
        ({"peers": [], "seeds": [1, "x"]}, "seeds[1]", "got 'x' (str); expected int"),
        ({"peers": [], "tags": {"site": 1}}, "tags.site", "expected str"),
        ({"peers": [], "tags": {3: "x"}}, "tags.3", "bad key"),
        ({"peers": [], "timing": 5}, "timing", "expected a mapping of Timing fields"),
        ({"peers": {"id": "a"}}, "peers", "expected tuple[PeerSpec, ...]"),
        ({"peers": [], "rounds": None}, "rounds", "got None; expected int"),
    ],
)
def test_type_errors(data, path, expected) -> None:
    err = _error(Config, data)
    assert err.path == path
    assert expected in str(err)


def test_float_accepts_int_and_scientific_strings() -> None:
    t = build(Timing, {"suspect_after_s": 2, "dead_after_s": "1e1"})
    assert (t.suspect_after_s, t.dead_after_s) == (2.0, 10.0)
    assert type(t.suspect_after_s) is float


@dataclass(frozen=True)
class Knobs:
    size: int | Literal["auto"] = "auto"
    limit: int | str = setting(1, gt=0)
    pair: tuple[int, str] = (0, "")
    anything: Any = None


def test_unions_and_fixed_tuples() -> None:
    assert build(Knobs, {"size": 3}).size == 3
    assert build(Knobs, {"size": "auto"}).size == "auto"
    err = _error(Knobs, {"size": "big"})
    assert err.path == "size" and "expected int | 'auto'" in str(err)
    err = _error(Knobs, {"limit": -2})  # the int member's bound error beats "expected int | str"
    assert "expected an integer > 0" in str(err)
    assert build(Knobs, {"pair": [1, "a"]}).pair == (1, "a")
    assert "expected 2" in str(_error(Knobs, {"pair": [1]}))
    assert build(Knobs, {"anything": {"x": [1]}}).anything == {"x": [1]}


def test_validate_hook_error_carries_dataclass_path() -> None:
    err = _error(Config, {"peers": [], "timing": {"suspect_after_s": 20, "dead_after_s": 10}})
    assert err.path == "timing"
    assert str(err) == "timing: suspect_after_s (20.0) must be < dead_after_s (10.0)"
    assert isinstance(err.__cause__, ValueError)


@dataclass(frozen=True)
class Window:
    lo: int = 0
    hi: int = 1

    def __post_init__(self) -> None:
        if self.lo > 100:
            raise ValueError("lo is too large")

    def validate(self) -> None:
        if self.hi <= self.lo:
            raise ConfigError("hi", f"got {self.hi}; must be > lo ({self.lo})")


@dataclass(frozen=True)
class Outer:
    windows: list[Window] = field(default_factory=list)


def test_validate_config_error_is_relative_and_post_init_is_wrapped() -> None:
    err = _error(Outer, {"windows": [{}, {"lo": 5, "hi": 2}]})
    assert err.path == "windows[1].hi"
    assert str(err) == "windows[1].hi: got 2; must be > lo (5)"
    err = _error(Outer, {"windows": [{"lo": 200, "hi": 300}]})
    assert (err.path, err.detail) == ("windows[0]", "lo is too large")
    err = _error(Window, {"hi": 0})
    assert str(err) == "hi: got 0; must be > lo (0)"


def test_overrides_create_replace_and_parse_types() -> None:
    data = {"peers": [dict(p) for p in PEERS], "timing": None}
    out = apply_overrides(
        data,
        [
            "timing.round_timeout_s=5",
            "algorithm.name=fedprox",
            "algorithm.extra.momentum=0.5",
            "verbose=true",
            "seeds=[1, 2]",
            "peers[0].device=cuda:0",
            "peers.1.lr=0.5",
            "tags={site: lab}",
            "peers[1].address=tcp://h:1=2",  # split on the first '='
        ],
    )
    assert data == {"peers": PEERS, "timing": None}  # input untouched
    assert out["timing"] == {"round_timeout_s": 5}
    assert out["algorithm"] == {"name": "fedprox", "extra": {"momentum": 0.5}}
    assert out["verbose"] is True and out["seeds"] == [1, 2] and out["tags"] == {"site": "lab"}
    assert out["peers"][0]["device"] == "cuda:0"
    assert out["peers"][1]["lr"] == 0.5 and out["peers"][1]["address"] == "tcp://h:1=2"
    cfg = build(Config, out)
    assert cfg.timing.round_timeout_s == 5.0 and cfg.algorithm.name == "fedprox"
    assert apply_overrides(None, ["a.b=1"]) == {"a": {"b": 1}}
    assert apply_overrides({"rounds": 3}, ["rounds=4"]) == {"rounds": 4}


@pytest.mark.parametrize(
    ("override", "path", "expected"),
    [
        ("rounds", "", "malformed override 'rounds'"),
        ("=3", "", "malformed override '=3'"),
        ("a..b=1", "", "malformed override"),
        ("peers[5].lr=0.1", "peers[5]", "peers has 2 items"),
        ("peers.x=1", "peers", "use peers[N]"),
        ("timing[0]=1", "timing", "is a mapping, not a list"),
        # a list not set yet (it said "node.bootstrap is a mapping", a config review)
        ("node.bootstrap[3]=x", "node.bootstrap", "node.bootstrap is not set, so it has no "
                                                  "item 3; give the whole list"),
        ("rounds.x=1", "rounds", "not a mapping or list"),
        ("rounds=[1, 2", "rounds", "cannot parse value"),
    ],
)
def test_override_errors(override, path, expected) -> None:
    data = {"peers": [dict(p) for p in PEERS], "timing": {}, "rounds": 3}
    with pytest.raises(ConfigError) as info:
        apply_overrides(data, [override])
    assert info.value.path == path
    assert expected in str(info.value)


def test_to_dict_round_trips_through_yaml(tmp_path: Path) -> None:
    file = tmp_path / "cfg.yaml"
    file.write_text(CONFIG_YAML)
    cfg = build(Config, load_yaml(file))
    plain = to_dict(cfg)
    assert isinstance(plain["peers"], list) and isinstance(plain["peers"][1]["batch_sizes"], list)
    text = yaml.safe_dump(plain, sort_keys=False)
    assert build(Config, yaml.safe_load(text)) == cfg
    with pytest.raises(TypeError):
        to_dict(Config)


def test_load_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found"):
        load_yaml(tmp_path / "nope.yaml")

    bad = tmp_path / "bad.yaml"
    bad.write_text("timing:\n  round_timeout_s: 3\n  x: [1, 2\nrounds: 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+:\d+: invalid YAML") as info:
        load_yaml(bad)
    assert info.value.source.startswith(str(bad) + ":")

    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"list\.yaml: top level must be a mapping"):
        load_yaml(top)

    dup = tmp_path / "dup.yaml"
    dup.write_text("rounds: 1\ntiming: {}\nrounds: 2\n")
    with pytest.raises(
        ConfigError, match=r"dup\.yaml:3:1: invalid YAML: found duplicate key 'rounds'"
    ):
        load_yaml(dup)

    merged = tmp_path / "merge.yaml"
    merged.write_text("base: &b {lr: 0.1}\npeer: {<<: *b, lr: 0.2}\n")
    assert load_yaml(merged)["peer"] == {"lr": 0.2}  # a merge key is not a duplicate

    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert load_yaml(empty) == {}



def test_numbers_read_as_yaml_1_2_reads_them(tmp_path: Path) -> None:
    # YAML 1.1 (PyYAML) read `rounds: 010` as 8 (octal) and `1:30` as 90 (base 60),
    # silently; the scientific 1e-3 was a string.
    file = tmp_path / "n.yaml"
    file.write_text("a: 010\nb: 0o10\nc: 0x1f\nd: 1:30\ne: 1e-3\nf: .inf\ng: -2\nh: 1_000\n"
                    "i: yes\n")
    assert load_yaml(file) == {"a": 10, "b": 8, "c": 31, "d": "1:30", "e": 0.001,
                               "f": float("inf"), "g": -2, "h": "1_000", "i": True}
    assert apply_overrides({}, ["x=010", "y=1:30"]) == {"x": 10, "y": "1:30"}
    assert yaml.safe_load("a: 010") == {"a": 8}  # (PyYAML's own loader is left as it is)

def test_load_combines_file_overrides_and_names_the_file(tmp_path: Path) -> None:
    file = tmp_path / "cfg.yaml"
    file.write_text(CONFIG_YAML)
    assert load(Config, file, ["rounds=3"]).rounds == 3
    with pytest.raises(ConfigError) as info:
        load(Config, file, ["rounds=0"])
    assert info.value.path == "rounds"
    assert str(info.value).startswith(f"{file}: rounds: got 0 (int)")


def test_config_error_is_a_value_error_and_pickles() -> None:
    err = ConfigError("peers[2].id", "got 3 (int); expected str", source="c.yaml")
    assert isinstance(err, ValueError)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.path, copy.detail, copy.source, str(copy)) == (
        err.path,
        err.detail,
        err.source,
        "c.yaml: peers[2].id: got 3 (int); expected str",
    )


def test_describe_lists_fields_types_defaults_and_help() -> None:
    text = describe(Config)
    assert "peers: tuple[PeerSpec, ...] (required)" in text
    assert "  id: str (required) [matches '[a-z][a-z0-9_-]*']  # unique peer name" in text
    assert "  round_timeout_s: float = 30.0 [> 0]  # round deadline" in text
    assert "  name: 'solo' | 'fedavg' | 'fedprox' = 'fedavg'" in text
    assert "backend: str = 'zmq' [one of 'zmq', 'inproc']" in text


def test_programmer_errors_are_type_errors() -> None:
    @dataclass
    class Odd:
        when: complex = 0j

    with pytest.raises(TypeError, match="unsupported annotation"):
        build(Odd, {"when": 1})
    with pytest.raises(TypeError):
        build(dict, {})  # type: ignore[type-var]


def test_imports_only_stdlib_and_yaml() -> None:
    tree = ast.parse(Path(configtools.__file__).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    assert roots - set(sys.stdlib_module_names) == {"yaml"}


@pytest.mark.parametrize("port", ["²", "x", "70000", ""])
def test_a_listen_port_that_is_no_port_is_named(port) -> None:
    # "²".isdigit() is True and int("²") raised: the message was "node: invalid literal
    # for int() with base 10", naming no field.
    from hfl.peer.config import PeerConfig
    from hfl.peer.configtools import ConfigError, build

    with pytest.raises(ConfigError) as err:
        build(PeerConfig, {"node": {"id": "p0", "listen": f"tcp://127.0.0.1:{port}"},
                           "cohort": {"algorithm": "fedavg"}})
    assert "listen: got" in str(err.value) and "port 0..65535" in str(err.value)


@pytest.mark.parametrize("path", ["runs/exp #2", "2024", "yes", "a: b", "*x", "x\ny", 'a"b\'c',
                                  "tab\there", "runs/exp-\U0001f680", "runs/\udcff",
                                  "runs/a\x85b", "runs/a\x9fb", "runs/\u2028x"])
def test_a_literal_override_comes_back_as_it_was_given(path) -> None:
    # --run-dir is a path, not YAML (a launcher review: " #2" was a comment); an emoji
    # came back as two escaped halves YAML does not join (a review of that fix)
    from hfl.peer.configtools import literal_override

    assert apply_overrides({}, [literal_override("run_dir", path)])["run_dir"] == path
