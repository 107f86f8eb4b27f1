"""A peer's configuration: YAML -> validated frozen dataclasses.

Torch-free on purpose: ``hfl-peer --config bad.yaml`` must fail at once. Each
component gets only its own section. The ``algorithm`` section is validated
against the chosen algorithm's own ``Config`` dataclass when the peer builds it
(see ``hfl.peer.factory``), because that class lives with the algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hfl.algorithms.registry import CATALOG
from hfl.algorithms.registry import check_name as check_algorithm_name
from hfl.algorithms.settings import SelectionConfig, TrainConfig
from hfl.peer.configtools import ConfigError, apply_overrides, build, load_yaml
from hfl.protocol import DEFAULT_MAX_MESSAGE_MIB

ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
SEED_MAX = 2**63 - 1  # (torch takes seeds below 2**64, numpy any int >= 0)
DEVICE_PATTERN = r"cpu|auto|cuda|cuda:\d+|mps"
#: What a string matching each pattern is, for the error that names the field.
ID_MEANS = ("1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit "
            "(e.g. p0, hospital-a)")
DEVICE_MEANS = "one of cpu, auto, cuda, cuda:N (N a GPU index) or mps"

# Built-in names (hfl.data.builtin); the torchvision ones read a local root given
# as options: {root: /data/mnist}; hfl never downloads.
BUILTIN_DATASETS = (
    "digits", "breast_cancer", "wine", "rotated_digits", "rotated_mnist", "digits_rgb", "mnist5k",
    "mnist", "fashion_mnist", "cifar10", "svhn", "usps",
)
DOMAIN_DATASETS = ("rotated_digits", "rotated_mnist")  # one domain per peer with partition: domain
FILE_DATASETS = ("npz", "csv", "image_folder")  # read from data.path
TABULAR_DATASETS = ("breast_cancer", "wine", "csv")  # with named columns (a schema)


@dataclass(frozen=True)
class NodeConfig:
    id: str = field(metadata={"pattern": ID_PATTERN, "means": ID_MEANS,
                                     "help": "this peer's unique id"})
    listen: str = field(
        default="tcp://127.0.0.1:0",
        metadata={"help": "address to bind: tcp://host:port (port 0 = any free port), ipc://path, mem://name"},
    )
    advertise: str | None = field(
        default=None,
        metadata={"help": "address the others should dial (default: the bound address; "
                          "with a wildcard listen host, this machine's address)"},
    )
    bootstrap: tuple[str, ...] = field(
        default=(), metadata={"help": "any live peers, as id@address (e.g. p0@tcp://10.0.0.5:5000; "
                                      "with security: none a bare address also works); the rest is "
                                      "learned by gossip"}
    )
    run_dir: str = field(default="runs/{id}", metadata={
        "help": "metrics, logs and checkpoints; {id} expands", "pattern": r"(?!\.?/?$)[^\x00]+",
        # (as hfl-launch's run_dir: '' wrote checkpoint.pt and the rest into the current
        # folder, a review)
        "means": "a folder path other than '' or '.' (the peer writes its checkpoint there)"})
    device: str = field(default="cpu", metadata={"pattern": DEVICE_PATTERN,
                                                          "means": DEVICE_MEANS})
    threads: int | None = field(default=None, metadata={"min": 1, "max": 4096,
                                                         "help": "torch CPU threads"})
    seed: int = field(default=0, metadata={"min": 0, "max": SEED_MAX,
                                           "help": "this peer's own randomness (batch order, dropout)"})
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    checkpoint: bool = True
    evaluate_every: int = field(
        default=1,
        metadata={"min": 1, "help": "evaluate (and select a model), write a metrics line and "
                                    "checkpoint every N rounds and after the last; a line sums "
                                    "bytes and times over the rounds it covers (span)"},
    )
    resume: bool = field(default=True, metadata={"help": "resume from run_dir's checkpoint if present"})
    min_peers: int = field(default=1, metadata={"min": 1, "help": "cohort size to wait for before round 1"})
    allow_solo: bool = field(
        default=False,
        metadata={"help": "finish with exit 0 even when a sharing method ends with fewer than "
                          "max(2, min_peers) peers (otherwise exit status 3)"},
    )
    quorum: int | None = field(
        default=None,
        metadata={"min": 1, "help": "contributors a round's aggregate needs (default: a majority "
                                    "of the members this peer knows, so a minority side of a "
                                    "partition never publishes; 1 allows any)"},
    )
    byzantine: int | None = field(
        default=None,
        metadata={"min": 0, "help": "f, the malicious members the protocol tolerates where the "
                                    "allow-list has signing keys: an elected aggregator's commits "
                                    "need quorums of floor((n + f) / 2) + 1 (3 of 4, 4 of 5), and "
                                    "f + 1 members must report a round ahead (to catch up to) or "
                                    "a member no one heard from (default 1 with signing keys; 0 "
                                    "without, or for crash faults only: a majority, one report). "
                                    "Commits go on while f members are silent only where n >= "
                                    "3f + 1 (4 for f = 1, 7 for f = 2); more than f colluding "
                                    "members can certify two results for a round"},
    )
    seed_chunk_bytes: int = field(
        default=1 << 20, metadata={"min": 256, "help": "size of the chunks a public seed set travels in"}
    )
    max_message_mib: int = field(
        default=DEFAULT_MAX_MESSAGE_MIB, metadata={"min": 1, "max": 4096,
                               "help": "the largest message this peer sends or takes (MiB; "
                                       "tensors of at most 2^18 elements a MiB; ZeroMQ's "
                                       "MAXMSGSIZE, a bound per frame): every peer of the "
                                       "cohort sets the same"})

    def validate(self) -> None:
        scheme, _, rest = self.listen.partition("://")
        if scheme not in ("tcp", "ipc", "mem") or not rest:
            raise ValueError(
                f"listen: got {self.listen!r}; expected tcp://host:port, ipc://path or mem://name"
            )
        if scheme == "tcp":
            host, _, port = rest.rpartition(":")
            # (ASCII digits: "²".isdigit() is True and int("²") raises, which named
            # no field: "node: invalid literal for int()")
            if not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
                raise ValueError(f"listen: got {self.listen!r}; expected tcp://host:port with a "
                                 "port 0..65535 (0: any free port)")
        if scheme == "ipc" and not Path(rest).parent.is_dir():
            raise ValueError(f"listen: got {self.listen!r}; the folder {Path(rest).parent} "
                             "does not exist")


def byzantine_refusal(f: int, n: int) -> str:
    """Why ``node.byzantine`` f cannot work in a cohort of n members: a commit would
    need floor((n + f) / 2) + 1 of them, more than there are (9 of 4 was taken, and
    nothing was ever committed: a review)."""
    return (f"got {f} for a cohort of {n}: a commit would need {(n + f) // 2 + 1} of its {n} "
            f"members, so nothing could ever be committed; at most {n - 1}, and at most "
            f"{(n - 1) // 3} for the cohort to go on while that many members are silent "
            "(n >= 3f + 1)")


@dataclass(frozen=True)
class CohortConfig:
    """What every peer of a cohort must agree on; checked in the handshake."""

    name: str = field(default="hfl", metadata={"pattern": ID_PATTERN, "means": ID_MEANS})
    algorithm: str = field(
        default="solo",
        metadata={"help": f"one of {', '.join(sorted(CATALOG))}; an installed plugin's name "
                          "(entry point group hfl.algorithms); or my_pkg.module:Class / "
                          "path/file.py:Class (docs/plugins.md)"},
    )
    rounds: int = field(default=10, metadata={"min": 1, "max": 2**62})
    num_classes: int | None = field(
        default=None, metadata={"min": 2, "max": 1 << 20,
                                "help": "label-set size (default: from the dataset)"}
    )
    seed: int = field(default=0, metadata={"min": 0, "max": SEED_MAX,
                                           "help": "shared seed: model initialisation"})
    aggregate_at: Literal["auto", "aggregator", "every_peer"] = field(
        default="auto", metadata={"help": "aggregator-mode methods: aggregator (one peer elected "
                                          "per round aggregates for all), every_peer (everyone sends "
                                          "to everyone and aggregates itself: no peer can set the "
                                          "model), auto (every_peer where the knowledge is small: "
                                          "heads, prototypes, logits; aggregator for full weights)"})
    fanout: int | None = field(
        default=None, metadata={"min": 1, "help": "broadcast-mode methods only: send each "
                                                  "round's knowledge to this "
                                                  "many peers, chosen by a seeded rotation "
                                                  "(docs/runtime.md, Sampled exchange); None: "
                                                  "to every live peer, as the papers do"})
    communicate_every: int = field(
        default=1, metadata={"min": 1, "help": "methods that share: exchange every k-th round "
                                               "(and the last); the rounds between are local "
                                               "steps, run at each peer's own pace (FedAvg or "
                                               "FedProx bandwidth-matched to FedH2L; FedH2L's "
                                               "E). 1: every round"})

    overlap: bool = field(
        default=False, metadata={"help": "methods that allow it (fedh2l), with "
                                         "node.evaluate_every > 1: start the next "
                                         "round's local step as soon as this round's "
                                         "knowledge is out and absorb the others' after it, "
                                         "so a peer trains while it waits (docs/runtime.md, "
                                         "Overlapped local steps). Changes the order of the "
                                         "paper's Algorithm 1: each global step comes one "
                                         "local step late"})
    run: int = field(
        default=0, metadata={"min": 0, "max": 2**62, "help": "this run's id, the same on every "
                                                             "peer (0: none): every signature "
                                                             "binds to it, so a member cannot "
                                                             "replay one from another run of "
                                                             "the cohort (hfl-launch makes one "
                                                             "per run and keeps it on resume)"})

    def validate(self) -> None:
        try:  # torch-free: a plugin class is imported only when the peer is built or checked
            check_algorithm_name(self.algorithm)
        except ValueError as exc:
            raise ConfigError("algorithm", str(exc)) from None


#: timing.membership auto: SWIM-style failure detection from this cohort size on.
SWIM_FROM = 16


def uses_swim(membership: str, cohort_size: int) -> bool:
    """Whether a peer runs SWIM-style failure detection (peer/membership.py): with
    ``timing.membership`` swim, or auto in a cohort of :data:`SWIM_FROM` peers or more
    (``node.min_peers``); full heartbeats otherwise."""
    return membership == "swim" or (membership == "auto" and cohort_size >= SWIM_FROM)


@dataclass(frozen=True)
class TimingConfig:
    heartbeat_interval_s: float = field(default=0.5, metadata={"gt": 0})
    suspect_after_s: float = field(default=2.0, metadata={"gt": 0})
    dead_after_s: float = field(default=5.0, metadata={"gt": 0})
    round_timeout_s: float = field(
        default=60.0, metadata={"gt": 0, "help": "how long to wait for live peers' knowledge"}
    )
    aggregate_grace_s: float = field(
        default=10.0, metadata={"min": 0, "help": "extra wait for the aggregator's result"}
    )
    join_timeout_s: float = field(
        default=120.0, metadata={"gt": 0, "help": "how long to wait for min_peers before round 1, "
                                                  "counted from the last peer that arrived"}
    )
    send_timeout_s: float = field(default=2.0, metadata={"gt": 0})
    gossip_fanout: int = field(
        default=3, metadata={"min": 1, "help": "members each gossip goes to; with swim, also the "
                                               "helpers of an indirect probe"})
    lookahead_rounds: int = field(default=2, metadata={"min": 0})
    membership: Literal["auto", "full", "swim"] = field(
        default="auto", metadata={"help": "failure detection: full (a heartbeat to every member "
                                          "each interval: O(N) messages per peer), swim (probe one "
                                          "member per interval, indirect probes, piggybacked "
                                          "failure news: O(1) per peer), auto (swim from "
                                          f"{SWIM_FROM} peers: node.min_peers)"})
    join: Literal["greet", "lazy"] = field(
        default="greet", metadata={"help": "greet: every member greets every other before "
                                            "round 1 (N^2 handshakes); lazy (swim, a method "
                                            "with an elected aggregator): a member vouched for "
                                            "by node.byzantine + 1 others counts without a "
                                            "handshake, and is greeted when first probed: O(N) "
                                            "(PROTOCOL.md, Lazy join)"})

    def validate(self) -> None:
        if not self.heartbeat_interval_s < self.suspect_after_s < self.dead_after_s:
            raise ValueError(
                "expected heartbeat_interval_s < suspect_after_s < dead_after_s; got "
                f"{self.heartbeat_interval_s} / {self.suspect_after_s} / {self.dead_after_s}"
            )


@dataclass(frozen=True)
class LabelNoiseConfig:
    """Noisy labels on this peer's private training split only (hfl.data.noise)."""

    type: Literal["pair", "symmetric"] = field(
        metadata={"help": "pair: class i -> i+1 mod C; symmetric: uniform over the other classes"}
    )
    rate: float = field(metadata={"min": 0, "lt": 1, "help": "probability that a label is flipped"})
    seed: int | None = field(
        default=None, metadata={"min": 0, "max": SEED_MAX,
                                "help": "default: from data.seed and partition_index (one per peer)"}
    )


def _check_source(dataset: str, path: str | None, target: str | None) -> None:
    """A dataset's file and label column agree with its kind: a file dataset needs its
    path, a built-in one takes none (a path beside it trained on digits, silently), and
    only a CSV has a target column."""
    if dataset in FILE_DATASETS and not path:
        raise ValueError(f"path: required for dataset {dataset!r}")
    if dataset not in FILE_DATASETS and path:
        raise ValueError(f"path: got {path!r}, but dataset {dataset!r} is built in and reads no "
                         f"file; for your own file set dataset to one of {', '.join(FILE_DATASETS)}")
    if dataset != "csv" and target:
        raise ValueError(f"target: applies to dataset 'csv' (the label column); dataset "
                         f"{dataset!r} has its labels already: remove it")


@dataclass(frozen=True)
class PublicSetConfig:
    """A public dataset every peer loads identically (MDH-FL, FedDF, FedMD): it
    becomes the peer's public data, in place of a public_fraction split."""

    dataset: str = field(metadata={"choices": BUILTIN_DATASETS + FILE_DATASETS})
    path: str | None = field(default=None, metadata={"help": "file for dataset npz/csv/image_folder"})
    target: str | None = field(default=None, metadata={"help": "label column for dataset csv"})
    options: dict[str, Any] = field(default_factory=dict, metadata={"help": "dataset options"})
    size: int | None = field(
        default=None, metadata={"min": 1, "help": "samples kept (a seeded draw); None = all"}
    )
    seed: int = field(default=0, metadata={"min": 0, "max": SEED_MAX,
                                           "help": "the draw of size samples (shared)"})
    disjoint: bool = field(
        default=False,
        metadata={"help": "the public set is a row-aligned view of data.dataset (same rows, "
                          "another view): its rows are removed from the data every peer "
                          "partitions, so no image is both public and private or test"},
    )

    def validate(self) -> None:
        _check_source(self.dataset, self.path, self.target)
        if self.dataset == "csv" and not self.target:
            raise ValueError("target: required for dataset 'csv' (the label column)")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = field(default="digits", metadata={"choices": BUILTIN_DATASETS + FILE_DATASETS})
    path: str | None = field(default=None, metadata={"help": "file for dataset npz/csv"})
    target: str | None = field(default=None, metadata={"help": "label column for dataset csv"})
    options: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "dataset options, e.g. rotated_digits: {angle: 20, size: 16, per_class: null}; "
                          "csv: {categorical: auto | [column, ...]}"},
    )
    partition: Literal["none", "iid", "dirichlet", "domain"] = field(
        default="iid", metadata={"help": "domain: peer i takes domain i of a multi-domain dataset"}
    )
    num_partitions: int = field(default=1, metadata={"min": 1})
    partition_index: int = field(default=0, metadata={"min": 0})
    alpha: float = field(default=0.5, metadata={"gt": 0, "help": "Dirichlet concentration"})
    test_fraction: float = field(default=0.2, metadata={"gt": 0, "lt": 1})
    public_fraction: float = field(
        default=0.0, metadata={"min": 0, "lt": 1, "help": "published as public seeds (FedH2L's alpha)"}
    )
    val_fraction: float = field(default=0.0, metadata={"min": 0, "lt": 1, "help": "model selection"})
    global_test_fraction: float = field(
        default=0.2, metadata={"min": 0, "lt": 1, "help": "held out before partitioning; 0 = none"}
    )
    seed: int = field(default=0, metadata={"min": 0, "max": SEED_MAX,
                                           "help": "shared by the cohort so partitions agree"})
    features: tuple[str, ...] = field(
        default=(),
        metadata={"help": "source columns this peer keeps (tabular data; one-hot groups move "
                          "together); empty = all"},
    )
    feature_split: Literal["none", "random", "slices"] = field(
        default="none",
        metadata={"help": "choose this peer's columns from data.seed: slices = overlapping windows "
                          "of one shared permutation, random = own draw per peer"},
    )
    feature_fraction: float = field(
        default=0.5,
        metadata={"gt": 0, "max": 1, "help": "share of the columns each peer keeps with feature_split"},
    )
    label_noise: LabelNoiseConfig | None = field(
        default=None,
        metadata={"help": "{type: pair | symmetric, rate}: noisy private training labels; "
                          "test, validation and public data stay clean"},
    )
    public_set: PublicSetConfig | None = field(
        default=None, metadata={"help": "a public dataset shared by every peer (see PublicSetConfig)"}
    )
    standardize: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata={"help": "z-score numeric features with this peer's training-row statistics; "
                          "auto = on for tabular (N, F) data, off for images"},
    )

    def validate(self) -> None:
        if self.partition_index >= self.num_partitions:
            raise ValueError(
                f"partition_index: got {self.partition_index}; allowed: 0..{self.num_partitions - 1}"
            )
        _check_source(self.dataset, self.path, self.target)
        if self.public_fraction + self.val_fraction + self.test_fraction >= 1:
            raise ValueError(
                "public_fraction + val_fraction + test_fraction must leave private data; got "
                f"{self.public_fraction} + {self.val_fraction} + {self.test_fraction} >= 1"
            )
        if self.partition == "domain" and self.dataset not in DOMAIN_DATASETS:
            raise ValueError(
                f"partition 'domain' needs a multi-domain dataset; allowed: {', '.join(DOMAIN_DATASETS)}"
            )
        if self.dataset == "csv" and not self.target:
            raise ValueError("target: required for dataset 'csv' (the label column)")
        if self.public_set is not None and self.public_fraction > 0:
            raise ConfigError(
                "public_set",
                f"got a public_set together with public_fraction {self.public_fraction}; "
                "use one of them (public_fraction: 0 with a public_set)",
            )
        if self.public_set is not None and self.public_set.disjoint and self.partition == "domain":
            raise ConfigError("public_set.disjoint", "not available with partition 'domain'; allowed: false")
        for i, col in enumerate(self.features):
            if not col.strip():
                raise ConfigError(f"features[{i}]", f"got {col!r}; expected a column name")
            if col in self.features[:i]:
                raise ConfigError(f"features[{i}]", f"column {col!r} is listed twice")
        if self.features and self.feature_split != "none":
            raise ConfigError(
                "feature_split",
                f"got {self.feature_split!r} together with explicit features; use one of them "
                "(feature_split: none with features, or features: [] with a split)",
            )
        if (self.features or self.feature_split != "none") and self.dataset not in TABULAR_DATASETS:
            raise ConfigError(
                "features" if self.features else "feature_split",
                f"needs tabular data with named columns, got dataset {self.dataset!r}; "
                f"allowed datasets: {', '.join(TABULAR_DATASETS)}",
            )


@dataclass(frozen=True)
class ModelConfig:
    arch: str = field(default="mlp", metadata={"help": "mlp, lenet, resnet18, ..."})
    embedding_dim: int = field(default=64, metadata={"min": 1, "max": 1 << 20})
    options: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "architecture options, e.g. {hidden: [128]}"}
    )


@dataclass(frozen=True)
class SecurityConfig:
    """Transport security (``hfl.peer.security``): CURVE with a cohort allow-list, or none.

    ``hfl-keys new <id>`` makes a key pair; the allow-list lists every member's
    public key. ``hfl-launch`` makes both for a local cohort by itself.
    """

    mode: Literal["curve", "none"] = field(
        default="curve",
        metadata={"help": "curve: encrypted, every peer authenticated by its key (default); "
                          "none: plaintext, anyone who reaches the port can claim any id"},
    )
    key_file: str | None = field(
        default=None, metadata={"help": "this peer's secret key file (<id>.key_secret, mode 0600)"}
    )
    allow_list: str | None = field(
        default=None, metadata={"help": "file of '<peer id> <public key> <signing key>' lines (hfl-keys new "
                                "prints one): the cohort"}
    )



@dataclass(frozen=True)
class FaultConfig:
    """Deliberate crash at an exact point, for fault-injection runs.

    In its first life (incarnation 0) the process exits abruptly, with no
    goodbye and no cleanup, as if SIGKILLed: in round ``crash_at_round`` at
    the start of local training (``train``), after sending its knowledge
    (``wait``), or as the round's aggregator after collecting contributions and
    before sending the result (``serve``; a peer not elected crashes at ``wait``).
    A restarted process resumes from its checkpoint and does not crash again.
    """

    crash_at_round: int | None = field(default=None, metadata={"min": 1})
    # commit: an aggregator killed once it decided to commit, before the commit went out
    crash_phase: Literal["train", "wait", "serve", "commit"] = "train"
    exit_code: int = field(default=137, metadata={"min": 1, "max": 255})


@dataclass(frozen=True)
class PeerConfig:
    node: NodeConfig
    cohort: CohortConfig = field(default_factory=CohortConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    algorithm: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "options of the chosen algorithm"}
    )
    fault: FaultConfig = field(default_factory=FaultConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    @property
    def run_dir(self) -> str:
        return self.node.run_dir.replace("{id}", self.node.id)

    @property
    def secured(self) -> bool:
        """CURVE applies: security.mode is curve and the peer talks over ZeroMQ."""
        return self.security.mode == "curve" and not self.node.listen.startswith("mem://")

    def identity(self):
        """This peer's CURVE identity (keys + allow-list), or None when CURVE does not
        apply; a ConfigError naming the field when the keys cannot be used.

        Checked before a peer runs (``hfl-peer``, ``--check``, every launch), not at
        parse time, so that a config can be read without its key files at hand.
        """
        from hfl.peer.security import SecurityError, load_identity, split_bootstrap

        if not self.secured:
            return None
        for name in ("key_file", "allow_list"):
            if not getattr(self.security, name):
                raise ConfigError(
                    f"security.{name}", "required with mode 'curve' over tcp:// or ipc:// (make "
                    f"keys with 'hfl-keys new {self.node.id}'; hfl-launch makes them itself), or "
                    "set security.mode: none for plaintext"
                )
        try:
            identity = load_identity(self.node.id, self.security.key_file, self.security.allow_list)
        except SecurityError as exc:
            raise ConfigError(f"security.{exc.field}", str(exc)) from None
        for i, entry in enumerate(self.node.bootstrap):
            peer, _ = split_bootstrap(entry)
            if peer is None:
                raise ConfigError(
                    f"node.bootstrap[{i}]",
                    f"got {entry!r}; with security.mode curve name the peer: <id>@<address>, "
                    "e.g. p0@tcp://10.0.0.5:5000 (its key comes from security.allow_list)",
                )
            if peer not in identity.allowed:
                raise ConfigError(
                    f"node.bootstrap[{i}]",
                    f"peer {peer!r} is not on security.allow_list; allowed: "
                    f"{', '.join(sorted(identity.allowed))}",
                )
        return identity


def load_config(path: str, overrides: list[str] | None = None) -> PeerConfig:
    """Load, override and validate a peer config file. Raises ConfigError."""
    data = apply_overrides(load_yaml(path), overrides or [])
    return build(PeerConfig, data)


def config_from_dict(data: dict[str, Any], overrides: list[str] | None = None) -> PeerConfig:
    return build(PeerConfig, apply_overrides(data, overrides or []))


__all__ = [
    "CohortConfig",
    "ConfigError",
    "DataConfig",
    "FaultConfig",
    "LabelNoiseConfig",
    "ModelConfig",
    "NodeConfig",
    "PeerConfig",
    "SecurityConfig",
    "SelectionConfig",
    "PublicSetConfig",
    "TimingConfig",
    "TrainConfig",
    "config_from_dict",
    "load_config",
]
