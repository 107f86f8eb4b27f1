"""An experiment file describes a cohort; this module expands it into peer configs.

    name: quickstart
    peers: 4
    defaults:            # a peer config shared by every peer (any hfl-peer section)
      cohort: {algorithm: fedavg, rounds: 20}
      data: {dataset: digits, partition: dirichlet, alpha: 0.5}
    peer_overrides:      # per-peer changes, deep-merged over the defaults
      p2: {model: {arch: lenet}}
    faults:
      - {peer: aggregator, at_round: 3}            # kill round 3's elected aggregator
      - {peer: p1, at_round: 5, restart_at_round: 8}

Expansion fills in what a cohort on one box needs: ids ``p0..p{N-1}``, free
loopback ports, bootstrap addresses, run directories, the data partition index,
CPU threads per peer, a GPU per peer (round-robin) and, unless the experiment
says ``security: {mode: none}``, a CURVE key pair per peer and the cohort's
allow-list under ``<run_dir>/keys/`` (reused when the run is resumed).
"""

from __future__ import annotations

import copy
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from hfl.peer.config import ID_MEANS, ID_PATTERN, PeerConfig, byzantine_refusal
from hfl.peer.configtools import (
    ConfigError,
    apply_overrides,
    build,
    config_differences,
    load_yaml,
    to_dict,
)


@dataclass(frozen=True)
class FaultSpec:
    """Kill a peer at an exact point of a round, and optionally restart it.

    The crash is carried out by the peer process itself (its ``fault`` config
    section: an abrupt exit, no goodbye, as if SIGKILLed), because a round can
    take milliseconds and a launcher polling from outside cannot hit it exactly.
    """

    peer: str = field(metadata={"help": "peer id, or 'aggregator' for that round's elected aggregator"})
    at_round: int = field(metadata={"min": 1, "help": "it dies in this round"})
    phase: Literal["train", "wait", "serve"] = field(
        default="train",
        metadata={"help": "train: before local training; wait: after sharing; serve: as aggregator, before sending the result"},
    )
    restart_at_round: int | None = field(
        default=None, metadata={"min": 2, "help": "restart it (from its checkpoint) once the cohort is in this round"}
    )

    def validate(self) -> None:
        if self.restart_at_round is not None and self.restart_at_round <= self.at_round:
            raise ValueError(
                f"restart_at_round: got {self.restart_at_round}; must be > at_round ({self.at_round})"
            )


@dataclass(frozen=True)
class SlurmConfig:
    """``hfl-launch --on slurm``: how the cohort's batch job asks for resources."""

    partition: str | None = field(default=None, metadata={"help": "sbatch --partition"})
    time: str | None = field(default=None, metadata={"help": "sbatch --time, e.g. 02:00:00"})
    cpus_per_task: int | None = field(
        default=None, metadata={"min": 1, "help": "CPU cores per peer (default node.threads, else 1)"})
    gpus_per_task: int = field(default=0, metadata={"min": 0, "help": "GPUs per peer (then node.device cuda:0)"})
    gpu_type: str | None = field(default=None, metadata={
        "pattern": r"[A-Za-z0-9][\w.-]*",
        "means": "a GPU type as the cluster's GRES names it (e.g. a100)",
        "help": "the GPU type to ask for (sbatch --gpus-per-task=TYPE:N), with gpus_per_task"})
    port: int | None = field(
        default=None, metadata={"min": 1024, "max": 65535,
                                "help": "the first peer's TCP port (default 20000 + job id mod 20000); "
                                        "the others bind any free port and are learned by gossip"})
    signal_s: int = field(
        default=60, metadata={"min": 1, "help": "peers get SIGTERM this long before the time limit"})
    sbatch: tuple[str, ...] = field(
        default=(), metadata={"help": "more sbatch options, e.g. [--account=lab, --qos=normal]"})
    python: str | None = field(
        default=None, metadata={"help": "the Python with hfl installed on the nodes (default this one)"})
    setup: tuple[str, ...] = field(
        default=(), metadata={"help": "shell lines the job runs before its tasks, e.g. "
                                      "['module load python/3.11', 'source /shared/venv/bin/activate']"})

    #: sbatch options hfl sets itself (the job's tasks, their cores and GPUs, its log, its
    #: signal) -> the field to use instead, or why not: given in ``sbatch`` they overrode
    #: hfl's (--ntasks=2 for 4 peers started 2, and the cohort waited out join_timeout_s;
    #: --gres=gpu:1 gave GPUs the peers, told none, left idle: a review)
    OWN_OPTIONS = {
        "-n": "", "--ntasks": "", "-c": "cpus_per_task", "--cpus-per-task": "cpus_per_task",
        "--cpus-per-gpu": "cpus_per_task", "-o": "", "--output": "", "-a": "", "--array": "",
        "-e": "hfl-launch reads the job's errors from its --output log",
        "--error": "hfl-launch reads the job's errors from its --output log",
        "--signal": "signal_s", "-p": "partition", "--partition": "partition", "-t": "time",
        "--time": "time", "-G": "gpus_per_task", "--gpus": "gpus_per_task",
        "--gres": "gpus_per_task", "--gpus-per-task": "gpus_per_task",
        "--gpus-per-node": "gpus_per_task", "--gpus-per-socket": "gpus_per_task",
        "--tres-per-task": "gpus_per_task"}
    #: sbatch's --time: minutes, m:s, h:m:s, d-h, d-h:m, d-h:m:s, or no limit
    TIME = r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|(?i:unlimited|infinite)"

    def validate(self) -> None:
        # Each goes into a #SBATCH line as it is: a newline there put a shell line in the
        # script and ended sbatch's reading of its options (the time limit was lost); a
        # space made more options of one ("00:20:00 --account=x"; a review).
        for name in ("partition", "time"):
            value = getattr(self, name)
            if value is not None and not re.fullmatch(r"[^\s\x00-\x1f\x7f]+", value):
                raise ValueError(f"{name}: got {value!r}; one sbatch value: no spaces, no line "
                                 "breaks or control characters")
        if self.time is not None and not re.fullmatch(self.TIME, self.time):
            raise ValueError(f"time: got {self.time!r}; sbatch --time takes minutes, "
                             "minutes:seconds, hours:minutes:seconds, days-hours, "
                             "days-hours:minutes or days-hours:minutes:seconds (e.g. 02:00:00)")
        if self.gpu_type is not None and not self.gpus_per_task:
            raise ValueError(f"gpu_type: got {self.gpu_type!r} with gpus_per_task 0: set "
                             "gpus_per_task too")
        for i, option in enumerate(self.sbatch):
            # (one #SBATCH line: an option and its value, as sbatch reads them, "-A lab"
            # as well as "--account=lab"; no line break)
            if not option.startswith("-") or re.search(r"[\x00-\x1f\x7f]", option):
                raise ValueError(f"sbatch[{i}]: got {option!r}; one sbatch option a line, "
                                 "starting with '-', with no line breaks or control "
                                 "characters (e.g. --account=lab)")
            words = option.split()
            for k, word in enumerate(words):
                # ("--gres gpu:1": the value may be the next word, as sbatch reads it)
                if "=" not in word and k + 1 < len(words) and not words[k + 1].startswith("-"):
                    word = f"{word}={words[k + 1]}"
                if (why := self._own_option(word)) is not None:
                    raise ValueError(f"sbatch[{i}]: got {option!r}; {why}")
        if self.python is not None and not re.fullmatch(r"[^-\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*",
                                                        self.python):
            raise ValueError(f"python: got {self.python!r}; the path (or command name) of the "
                             "Python with hfl installed on the nodes, taken as it is (no ~ or $ "
                             "expansion; not an srun option)")

    def _own_option(self, word: str) -> str | None:
        """Why an sbatch option word is hfl-launch's to set, or None (sbatch also takes
        a long option by a unique prefix: --part=debug is --partition)."""
        if not word.startswith("-"):
            return None
        name, _, value = word.partition("=")
        if re.fullmatch(r"-[A-Za-z].+", name):
            name, value = name[:2], name[2:]  # (-c4, -pgpu)
        owned = [o for o in self.OWN_OPTIONS if o == name or (
            name.startswith("--") and len(name) > 3 and o.startswith(name))]
        if not owned:
            return None
        own = owned[0]
        if own in ("--gres", "--tres-per-task") and not any(
                re.split("[:=]", g)[0].removeprefix("gres/") == "gpu" for g in value.split(",")):
            return None  # (other generic resources: a local disk, a licence, cpus)
        instead = self.OWN_OPTIONS[own]
        if instead == "gpus_per_task":
            return ("hfl-launch asks for GPUs itself, and places each peer on its task's: use "
                    "slurm.gpus_per_task (and slurm.gpu_type for a type, e.g. a100)")
        if not instead:
            return f"hfl-launch sets {own} itself (one task per peer, the job's log in the run folder)"
        if " " in instead:
            return f"{instead}: not {own}"
        return f"hfl-launch sets {own} itself: use slurm.{instead}"


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = field(metadata={"pattern": ID_PATTERN, "means": ID_MEANS})
    peers: int = field(metadata={"min": 1, "max": 4096})  # a view holds at most 4096 (PROTOCOL.md)
    run_dir: str = field(default="runs/{name}", metadata={
        "help": "{name} expands", "pattern": r"(?!\.?/?$)[^\x00]+",
        "means": "a folder path other than '' or '.' (the run writes keys and peer folders there)"})
    host: str = "127.0.0.1"
    devices: str = field(
        default="auto", metadata={"help": "auto (GPUs if found), cpu, or a comma list of GPU indices"}
    )
    threads_per_peer: int | None = field(default=None, metadata={"min": 1, "help": "default: cores / peers"})
    timeout_s: float = field(default=1800.0, metadata={"gt": 0, "help": "stop everything after this"})
    defaults: dict[str, Any] = field(default_factory=dict)
    peer_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: tuple[FaultSpec, ...] = ()
    slurm: SlurmConfig = field(default_factory=SlurmConfig)

    def peer_ids(self) -> list[str]:
        width = len(str(self.peers - 1))
        return [f"p{i:0{width}d}" if self.peers > 10 else f"p{i}" for i in range(self.peers)]

    def validate(self) -> None:
        ids = set(self.peer_ids())
        for key in self.peer_overrides:
            if key not in ids:
                raise ConfigError(f"peer_overrides.{key}", f"no such peer; allowed: {', '.join(sorted(ids))}")
        for where, section in [("defaults", self.defaults),
                               *((f"peer_overrides.{k}", v) for k, v in self.peer_overrides.items())]:
            self._check_section(where, section)
        gpu = r"(?:\d+|(?:GPU|MIG)-[\w./-]+)"  # an index, or a GPU or MIG instance's UUID
        if not re.fullmatch(rf"auto|cpu|{gpu}(?:\s*,\s*{gpu})*", self.devices.strip()):
            raise ConfigError("devices", f"got {self.devices!r}; allowed: auto (the GPUs found), "
                                         "cpu, or a comma list of GPU indices or GPU/MIG UUIDs "
                                         "(e.g. 0,1), as CUDA_VISIBLE_DEVICES takes them")
        node = self.defaults.get("node") or {}
        for key in ("min_peers", "quorum"):
            value = node.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > self.peers:
                raise ConfigError(f"defaults.node.{key}", f"got {value} for a cohort of {self.peers} "
                                  "peers: no round could ever have that many; at most "
                                  f"{self.peers}")
        f = node.get("byzantine")
        if (isinstance(f, int) and not isinstance(f, bool) and node.get("quorum") is None
                and self.peers > 1 and f > self.peers - 1):
            raise ConfigError("defaults.node.byzantine", byzantine_refusal(f, self.peers))
        rounds = (self.defaults.get("cohort") or {}).get("rounds")
        targets: dict[str, int] = {}
        for i, fault in enumerate(self.faults):
            if fault.peer != "aggregator" and fault.peer not in ids:
                raise ConfigError(
                    f"faults[{i}].peer",
                    f"got {fault.peer!r}; allowed: 'aggregator', {', '.join(sorted(ids))}",
                )
            # (a restart after the last round is no restart: the crash still happens)
            if isinstance(rounds, int) and fault.at_round > rounds:
                raise ConfigError(f"faults[{i}].at_round", f"got {fault.at_round} but the cohort "
                                  f"runs {rounds} rounds: the crash would never happen")
            if isinstance(rounds, int) and (fault.restart_at_round or 0) > rounds:
                # (the launcher waited for that round until timeout_s, then said "timeout"
                # of a run whose peers had all finished; a review)
                raise ConfigError(f"faults[{i}].restart_at_round", f"got "
                                  f"{fault.restart_at_round} but the cohort runs {rounds} "
                                  f"rounds: allowed {fault.at_round + 1} to {rounds}")
            target = self.fault_target(fault)
            if target in targets:
                raise ConfigError(
                    f"faults[{i}].peer",
                    f"{target} already crashes in faults[{targets[target]}]; one fault per peer",
                )
            targets[target] = i

    #: Set by hfl-launch for each peer (its place in the cohort): not the experiment's.
    LAUNCHER_FIELDS = {"node": ("id", "listen", "run_dir", "bootstrap")}

    def _check_section(self, where: str, section: Any) -> None:
        """A peer config's sections are mappings, and none sets what the launcher sets
        (it was overwritten without a word)."""
        if not isinstance(section, dict):
            raise ConfigError(where, f"got {section!r}; expected a mapping of peer config "
                                     "sections (node, cohort, data, ...)")
        for name, value in section.items():
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{where}.{name}", f"got {value!r}; expected a mapping "
                                                     f"(the {name} section's fields)")
            for key in self.LAUNCHER_FIELDS.get(name, ()):
                if key in (value or {}):
                    raise ConfigError(f"{where}.{name}.{key}", "set by hfl-launch for each peer "
                                      "(its place in the cohort); remove it (run one peer with "
                                      "its own config: hfl-peer --config)")

    def fault_target(self, fault: FaultSpec) -> str:
        """The peer a fault hits ('aggregator' resolves through the rotation)."""
        if fault.peer != "aggregator":
            return fault.peer
        every = (self.defaults.get("cohort") or {}).get("communicate_every", 1)
        usable = isinstance(every, int) and not isinstance(every, bool) and every >= 1
        return aggregator_of(self.peer_ids(), fault.at_round, every if usable else 1)

    @property
    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir.replace("{name}", self.name))


def load_experiment(path: str, overrides: list[str] | None = None) -> ExperimentConfig:
    data = apply_overrides(load_yaml(path), overrides or [])
    try:
        return build(ExperimentConfig, data)
    except ConfigError as err:
        raise err.with_source(str(path)) from None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def free_ports(n: int, host: str) -> list[int]:
    """n distinct free TCP ports on ``host`` (bound all at once, then released); a host
    this machine cannot listen on is a ConfigError naming ``host``."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    except OSError as exc:  # (an unknown name, an address of another machine, IPv6 here)
        raise ConfigError("host", f"cannot listen on {host!r} here ({exc}); use an IPv4 address "
                                  "of this machine, e.g. 127.0.0.1 or 0.0.0.0") from None
    finally:
        for s in socks:
            s.close()


def visible_gpus() -> list[str] | None:
    """The GPUs this process may use by its ``CUDA_VISIBLE_DEVICES``, or None where it
    does not restrict them."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    out = []
    for d in (d.strip() for d in visible.split(",")):
        if not d or d.startswith("-"):  # CUDA ignores the rest from an entry such as -1
            break  #                       ("0,-1,1" is GPU 0 only: GPU 1 was handed out)
        out.append(d)
    return out


def detect_gpus(spec: str) -> list[str]:
    """GPU indices to spread peers over: from the spec, CUDA_VISIBLE_DEVICES or nvidia-smi.
    A spec naming a GPU that this shell's CUDA_VISIBLE_DEVICES leaves out is refused: its
    peers would run on a GPU the shell was kept off (a job's, another user's)."""
    if spec == "cpu":
        return []
    visible = visible_gpus()
    if spec != "auto":
        named = [d.strip() for d in spec.split(",") if d.strip()]
        outside = [d for d in named if visible is not None and d not in visible]
        if outside:
            raise ConfigError("devices", f"got {spec!r}, but this shell may use only "
                                         f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}"
                                         f" ({', '.join(outside)} left out): name GPUs from it "
                                         "(or devices: auto, which spreads peers over them)")
        return named
    if visible is not None:
        return visible
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


@dataclass
class PeerPlan:
    id: str
    index: int
    config: PeerConfig
    config_path: Path
    env: dict[str, str]
    #: its CURVE keys are the cohort's, made by :func:`write_plans` in ``<run_dir>/keys``
    cohort_key: bool = False


#: What rebuilds a peer's model from its config: a resumed peer's checkpoint holds
#: weights of that shape, so none of these may change on resume.
MODEL_FIELDS = ("model", "cohort.num_classes", "data.dataset", "data.features")


def model_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``field: old -> new`` for each of :data:`MODEL_FIELDS` that differs."""
    def pick(cfg: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for dotted in MODEL_FIELDS:
            section, _, key = dotted.partition(".")
            value = cfg.get(section, {})
            out[dotted] = value.get(key, "<unset>") if key else value
        return out

    return config_differences(pick(old), pick(new))


def run_id_of(run_dir: Path, create: bool = True) -> int:
    """This run's id (``cohort.run``, what every signature binds to): made when the run
    directory is new, read back on a resume (``<run_dir>/run_id``). ``create`` False (a
    dry run): 0 where there is none yet, and nothing written."""
    path = Path(run_dir) / "run_id"
    try:
        run = int(path.read_text())
        if 0 < run <= 2**62:
            return run
    except (OSError, ValueError):
        pass
    if not create:
        return 0
    run = new_run_id()
    write_run_id(run_dir, run)
    return run


def new_run_id() -> int:
    import secrets

    return secrets.randbelow(2**62) + 1


def write_run_id(run_dir: Path, run: int) -> None:
    path = Path(run_dir) / "run_id"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{run}\n")


def expand(exp: ExperimentConfig, gpus: list[str] | None = None, ports: list[int] | None = None,
           resume: bool = False, threads: int | None = None, run: int = 0,
           write: bool = True, pin_devices: bool = True) -> list[PeerPlan]:
    """Per-peer configs, validated, written under ``<run_dir>/peers/`` (with the cohort's
    keys) unless ``write`` is False: then nothing is written, and :func:`write_plans`
    writes them once the launch's checks passed (a dry run, or a launch refused, rewrote
    an existing run's recorded configs and allow-list: a review). ``threads`` per
    peer: default ``threads_per_peer``, else this machine's cores / peers. ``run``: the
    run's id (:func:`run_id_of`), set as every peer's ``cohort.run`` unless the
    experiment sets one (0: none; the simulator and the benchmarks run without).
    ``pin_devices`` False (a SLURM job: each task sees its own GPUs) leaves a peer's
    ``cuda:N`` to the task's devices.

    With ``resume``, a peer whose model would change (:data:`MODEL_FIELDS`) against the
    config it was launched with is refused before any file is written: its checkpoint
    holds the old model's weights."""
    ids = exp.peer_ids()
    run_dir = exp.resolved_run_dir
    gpus = detect_gpus(exp.devices) if gpus is None else gpus
    ports = ports or free_ports(len(ids), exp.host)
    addresses = [f"tcp://{exp.host}:{p}" for p in ports]
    threads = threads or exp.threads_per_peer or max(1, (os.cpu_count() or 1) // len(ids))
    plans = []
    # Peers on each GPU: a peer pinned to one (its own cuda:N) counts from the start, and
    # each other peer that uses a GPU takes the least loaded, the lowest index first (a
    # round robin where nothing is pinned; it ignored the pinned ones: with 0,1 and p0
    # on cuda:0, GPU 0 had three of four peers, a review)
    load = [0] * len(gpus)
    for pid in ids if pin_devices else ():
        own = str(((exp.peer_overrides.get(pid) or {}).get("node") or {}).get("device", ""))
        index = own.partition(":")[2] if own.startswith("cuda") else ""
        if index.isascii() and index.isdigit() and int(index) < len(gpus):
            load[int(index)] += 1
    for i, pid in enumerate(ids):
        data = deep_merge(exp.defaults, exp.peer_overrides.get(pid, {}))
        data = {k: {} if v is None else v for k, v in data.items()}  # (`node:` left empty)
        node = data.setdefault("node", {})
        node.update(
            id=pid, listen=addresses[i], run_dir=str(run_dir / pid),
            bootstrap=[f"{ids[0]}@{addresses[0]}"] if i > 0
            else ([f"{ids[1]}@{addresses[1]}"] if len(ids) > 1 else []),
        )
        security = data.setdefault("security", {})
        cohort_key = security.get("mode", "curve") == "curve" and not security.get("key_file")
        if cohort_key:  # the whole cohort's keys (write_plans makes them; kept on resume)
            from hfl.peer.security import cohort_key_files

            security.update(cohort_key_files(run_dir / "keys", pid))
        node.setdefault("min_peers", len(ids))
        node.setdefault("threads", threads)
        data_sec = data.setdefault("data", {})
        if data_sec.get("partition", "iid") != "none":
            data_sec.setdefault("num_partitions", len(ids))
            data_sec.setdefault("partition_index", i)
        data.setdefault("cohort", {}).setdefault("name", exp.name)
        if run:
            data["cohort"].setdefault("run", run)
        for fault in exp.faults:
            if exp.fault_target(fault) == pid:
                data["fault"] = {"crash_at_round": fault.at_round, "crash_phase": fault.phase}
        env = {"OMP_NUM_THREADS": str(node["threads"]), "MKL_NUM_THREADS": str(node["threads"])}
        device = str(node.get("device", "auto"))
        if gpus and (device == "auto" or device.startswith("cuda")):
            # Spread over the peers that use a GPU (by peer index, a peer kept on the
            # CPU left its turn's GPU idle and doubled the next one's load); a peer
            # whose own override names cuda:N gets the launcher's GPU N (it became
            # cuda:0 of the round robin's GPU without a word; a review). A cuda:N of the
            # defaults is every peer's: spread as before, not all on GPU N.
            own = (exp.peer_overrides.get(pid) or {}).get("node") or {}
            index = str(own.get("device", "")).partition(":")[2] if pin_devices else ""
            if index:
                if not (index.isascii() and index.isdigit()) or int(index) >= len(gpus):
                    raise ConfigError(f"peer_overrides.{pid}.node.device",
                                      f"got {device!r}; this launch uses {len(gpus)} GPU(s) "
                                      f"({', '.join(gpus)}): allowed cuda, auto, cpu, or cuda:0 "
                                      f"to cuda:{len(gpus) - 1}")
                env["CUDA_VISIBLE_DEVICES"] = gpus[int(index)]
            else:
                k = load.index(min(load))
                env["CUDA_VISIBLE_DEVICES"] = gpus[k]
                load[k] += 1
            node["device"] = "cuda:0"  # the one GPU this process sees
        else:
            if exp.devices == "cpu" and device.startswith("cuda"):
                # (devices: cpu kept only "auto" peers there; a cuda one took the
                # launcher's GPUs, on a GPU machine without a word: a review)
                raise ConfigError("devices", f"cpu keeps every peer on the CPU, but peer {pid}'s "
                                             f"node.device is {device!r}: set devices: auto (or "
                                             "GPU indices), or node.device: cpu")
            if device == "auto":
                node["device"] = "cpu"
            if node["device"] == "cpu":
                env["CUDA_VISIBLE_DEVICES"] = ""  # and skip CUDA initialisation
        try:
            cfg = build(PeerConfig, data)
        except ConfigError as err:  # defaults + this peer's overrides, as expanded:
            origin = _origin(err.path, exp.peer_overrides.get(pid, {}), exp.defaults)
            if origin is not None:  # named where the experiment file sets it
                err = err.with_prefix("defaults" if origin == "defaults"
                                      else f"peer_overrides.{pid}")
            raise err.with_source(f"peer {pid}") from None
        plans.append(PeerPlan(pid, i, cfg, run_dir / "peers" / f"{pid}.yaml", env, cohort_key))
    _refuse_shared_parts(exp, plans)
    if resume:
        _refuse_model_changes(plans)
    if write:
        write_plans(exp, plans)
    return plans


def _refuse_shared_parts(exp: ExperimentConfig, plans: list[PeerPlan]) -> None:
    """Two peers of one data split on one part would train on the same rows, and
    another part's rows would be nobody's. The peers refuse each other's hellos
    (PROTOCOL.md, ``part``), but the other members take both: the run went on, a
    warning in two logs, after a join timeout (120 s by default) with every member
    greeting. A launch is refused before any peer starts, naming the field."""
    from hfl.peer.status import data_split_fingerprint

    owner: dict[tuple[str, int, int], str] = {}
    for plan in plans:
        split = data_split_fingerprint(plan.config.data).get("data_split")
        if split is None:
            continue
        part = plan.config.data.partition_index
        # (per cohort: two cohorts of one experiment never greet each other, a review)
        other = owner.setdefault((plan.config.cohort.name, split, part), plan.id)
        if other != plan.id:
            origin = _origin("data.partition_index", exp.peer_overrides.get(plan.id, {}),
                             exp.defaults)
            where = {"overrides": f"peer_overrides.{plan.id}.", "defaults": "defaults."}
            raise ConfigError(
                f"{where.get(origin or '', '')}data.partition_index",
                f"got {part} for {plan.id}, as {other} has: two peers of one data split "
                f"would train on the same rows; give each peer its own part (0 to "
                f"{plan.config.data.num_partitions - 1})").with_source(f"peer {plan.id}")


def write_plans(exp: ExperimentConfig, plans: list[PeerPlan]) -> None:
    """What :func:`expand` planned, on disk: ``<run_dir>/peers/<id>.yaml`` for each
    peer and, where a peer's CURVE keys are the cohort's, ``<run_dir>/keys`` (key pairs
    kept where they exist, the allow-list naming exactly this cohort)."""
    run_dir = exp.resolved_run_dir
    try:
        (run_dir / "peers").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("run_dir", f"cannot create {run_dir / 'peers'} ({exc.strerror or exc})"
                          ) from None
    if any(p.cohort_key for p in plans):
        from hfl.peer.security import SecurityError, cohort_keys

        try:
            cohort_keys(run_dir / "keys", exp.peer_ids())
        except SecurityError as exc:  # (e.g. a key file others may read: a traceback)
            raise ConfigError(f"security.{getattr(exc, 'field', 'key_file')}", str(exc)) from None
    for plan in plans:
        # libyaml's dumper when PyYAML has it: the same text, 3.6x faster (a thousand
        # peers' configs are written before any starts)
        plan.config_path.write_text(yaml.dump(to_dict(plan.config), sort_keys=False,
                                              Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)))


def _origin(path: str, over: dict[str, Any], defaults: dict[str, Any]) -> str | None:
    """Which part of the experiment file sets the peer config field ``path`` (or the
    nearest section above it): "overrides" (the peer's), "defaults", or None (the
    launcher's own, or nothing)."""
    keys = path.split(".") if path else []

    def sets(section: Any, upto: list[str]) -> bool:
        for key in upto:
            if not isinstance(section, dict) or key not in section:
                return False
            section = section[key]
        return True

    for n in range(len(keys), 0, -1):
        if sets(over, keys[:n]):
            return "overrides"
        if sets(defaults, keys[:n]):
            return "defaults"
    return None


def _refuse_model_changes(plans: list[PeerPlan]) -> None:
    from hfl.peer.checkpoint import CHECKPOINT_NAME

    for plan in plans:
        if not (Path(plan.config.run_dir) / CHECKPOINT_NAME).exists():
            continue  # nothing trained to keep (a peer that failed before its first one)
        try:
            old = yaml.safe_load(plan.config_path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue  # no record of the old config: the peer itself checks its checkpoint
        changed = model_changes(old, to_dict(plan.config))
        if changed:
            raise ConfigError(
                changed[0].split(":")[0],
                f"peer {plan.id}'s checkpoint holds the model it was launched with, and resuming "
                f"would change it ({'; '.join(changed)}); a model cannot change on --resume: "
                "use --fresh or another --run-dir")
        # Its method and data too, which the peer refuses itself (runner._check_owner):
        # asked here, before the run's record and configs are rewritten (a review: a
        # refused resume left a finished run recorded as failed, under the new values).
        from hfl.peer.runner import resume_changes

        try:
            recorded = build(PeerConfig, old)
        except ConfigError:
            continue  # (a config an older hfl wrote: the peer checks its checkpoint)
        if changed := resume_changes(recorded, plan.config):
            raise ConfigError(
                changed[0].split(":")[0],
                f"peer {plan.id}'s checkpoint was trained with the method and data it was "
                f"launched with, and resuming would change them ({'; '.join(changed[:4])}); "
                "they cannot change on --resume: use --fresh or another --run-dir")


def aggregator_of(ids: list[str], round: int, communicate_every: int = 1) -> str:
    """The peer the rotation elects for ``round`` when everyone is alive (epoch 0):
    the rotation turns once per exchange (``PeerCore.turn``)."""
    order = sorted(ids)
    return order[-(-round // communicate_every) % len(order)]
