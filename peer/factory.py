"""Build a peer's data, model and algorithm from its (validated) config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hfl.peer.checkpoint import RunStore
from hfl.peer.config import ConfigError, DataConfig, PeerConfig, PublicSetConfig
from hfl.peer.configtools import build


@dataclass
class PeerData:
    train: Any  # ArrayDataset: the private split
    test: Any
    global_test: Any | None  # held out before partitioning: the same for every peer
    num_classes: int
    public: Any | None = None  # published to the cohort as public seeds
    val: Any | None = None
    domain_tests: dict[str, Any] = field(default_factory=dict)  # every domain's test split
    own_domain: str | None = None
    label_noise_rate: float | None = None  # realised share of flipped private labels
    #: how ``num_classes`` came about: "counted" (max label + 1 of the whole dataset,
    #: before any split: ``labels_present`` distinct labels in it), or "given" (an
    #: option, named classes, a built-in dataset)
    classes_from: str = "given"
    labels_present: int = 0


def _split(ds, cfg: DataConfig, seed: int) -> dict[str, Any]:
    """private / public / val / test parts of one peer's (or domain's) data."""
    from hfl.data import split_fractions

    fractions = {"public": cfg.public_fraction, "val": cfg.val_fraction, "test": cfg.test_fraction}
    fractions = {k: v for k, v in fractions.items() if v > 0}
    fractions["private"] = 1.0 - sum(fractions.values())
    try:
        parts = split_fractions(len(ds), fractions, seed, stratify=ds.y)
    except ValueError as exc:  # (too few samples for the fractions)
        raise ConfigError("data", f"{cfg.path or cfg.dataset}: {len(ds)} samples for this "
                          f"peer: {exc}") from None
    return {k: ds.subset(idx) for k, idx in parts.items()}


def _keep_peer_columns(full, datasets: list, cfg: DataConfig) -> list:
    """``datasets`` (None entries kept) cut to the source columns this peer keeps:
    ``data.features``, or its share of ``full``'s columns under ``data.feature_split``."""
    from hfl.data import feature_split, select_columns

    if not cfg.features and cfg.feature_split == "none":
        return datasets
    where = "data.features" if cfg.features else "data.feature_split"
    if full.schema is None:
        raise ConfigError(
            where,
            f"dataset {full.name!r} has no named columns (input shape {full.input_shape}); "
            "choosing columns needs tabular data with a schema (breast_cancer, wine, csv)",
        )
    try:
        columns = list(cfg.features) or feature_split(
            full.schema.source_columns, cfg.num_partitions, cfg.partition_index,
            cfg.feature_fraction, cfg.feature_split, cfg.seed,
        )
        return [None if ds is None else select_columns(ds, columns) for ds in datasets]
    except ValueError as exc:
        raise ConfigError(where, str(exc)) from exc


def _fit_standardizer(ds, cfg: DataConfig):
    """The transform fitted on ``ds`` (the private split), or None when off."""
    from hfl.data import fit_standardizer

    if cfg.standardize == "off":
        return None
    if ds.x.ndim != 2:
        if cfg.standardize == "on":
            raise ConfigError(
                "data.standardize",
                f"got 'on' but dataset {ds.name!r} has input shape {ds.input_shape}, not "
                "tabular (F,) features; allowed here: 'auto', 'off'",
            )
        return None
    return fit_standardizer(ds)


def load_peer_data(cfg: DataConfig) -> PeerData:
    """This peer's private / public / val / test splits (and shared test sets).

    Every peer of a cohort runs the same seeded splits with its own
    ``partition_index``, so the parts are disjoint without any coordination.
    With ``partition: domain`` peer i takes domain i, and every peer can also
    rebuild each domain's test split (same seed) for FedH2L's FWT metric.

    Order: load -> hold out the global test set -> this peer's rows (iid or
    dirichlet) -> this peer's columns (``features`` or ``feature_split``; the
    global test set is cut the same way) -> private/public/val/test split ->
    standardise every split (and the global test set) with statistics of the
    private split only.
    """
    import numpy as np

    from hfl.data import dirichlet_partition, iid_partition, train_test_split_indices

    try:
        if cfg.partition == "domain":
            import hfl.data
            from hfl.data.builtin import wrong_flag

            if (flag := wrong_flag(getattr(hfl.data, cfg.dataset), cfg.options)) is not None:
                raise ValueError(flag[1])
            domains = getattr(hfl.data, cfg.dataset)(**cfg.options)
        else:
            full = _load_dataset(cfg.dataset, cfg.path, cfg.target, cfg.options)
    except ConfigError:  # (an option named by its own path: not "cannot load" around it)
        raise
    except (OSError, ValueError, KeyError, TypeError, EOFError, MemoryError) as exc:
        raise ConfigError("data", f"cannot load dataset {cfg.dataset!r}: {exc}") from exc
    public_set = None
    if cfg.public_set is not None:
        public_set, keep = _load_public_set(
            cfg.public_set, domains[0] if cfg.partition == "domain" else full)
        if keep is not None:
            full = full.subset(keep)

    if cfg.partition == "domain":
        if len(domains) != cfg.num_partitions:
            raise ConfigError(
                "data.num_partitions",
                f"got {cfg.num_partitions} but {cfg.dataset} has {len(domains)} domains; one per peer",
            )
        splits = [_split(d, cfg, cfg.seed * 7919 + k) for k, d in enumerate(domains)]
        mine = splits[cfg.partition_index]
        domain_tests = {d.name: sp["test"] for d, sp in zip(domains, splits, strict=True)}
        scaler = _fit_standardizer(mine["private"], cfg)
        if scaler is not None:
            mine = {k: scaler(v) for k, v in mine.items()}
            domain_tests = {k: scaler(v) for k, v in domain_tests.items()}
        if public_set is not None:
            public_set = public_set if scaler is None else scaler(public_set)
        train, noise_rate = _noisy(mine["private"], cfg)
        return PeerData(
            train=train, test=mine["test"], global_test=None,
            num_classes=max(d.num_classes for d in domains),
            public=public_set if public_set is not None else mine.get("public"),
            val=mine.get("val"), domain_tests=domain_tests,
            own_domain=domains[cfg.partition_index].name, label_noise_rate=noise_rate,
        )

    global_test = None
    pool = full
    if len(full) < 2:  # (a file with no row, or one: nothing to split, let alone learn)
        raise ConfigError("data", f"dataset {cfg.dataset!r}"
                          + (f" ({cfg.path})" if cfg.path else "")
                          + f" holds {len(full)} sample(s): a cohort's data needs many")
    if cfg.global_test_fraction > 0:
        pool_idx, global_idx = train_test_split_indices(
            len(full), cfg.global_test_fraction, cfg.seed, stratify=full.y
        )
        pool, global_test = full.subset(pool_idx), full.subset(global_idx)
    if cfg.partition == "none" or cfg.num_partitions == 1:
        mine = pool
    else:
        try:
            if cfg.partition == "iid":
                parts = iid_partition(pool.y, cfg.num_partitions, cfg.seed)
            else:
                parts = dirichlet_partition(pool.y, cfg.num_partitions, cfg.alpha, cfg.seed)
        except ValueError as exc:  # e.g. too few samples for that many peers
            # (the library's "lower min_size" names an argument no config sets: a review)
            why = str(exc).replace("lower min_size, raise alpha or use fewer parts",
                                   "raise data.alpha or use fewer peers (each needs 10 rows)")
            raise ConfigError("data.num_partitions", why) from None
        mine = pool.subset(parts[cfg.partition_index])
    mine, global_test = _keep_peer_columns(full, [mine, global_test], cfg)
    split = _split(mine, cfg, cfg.seed * 7919 + cfg.partition_index)
    scaler = _fit_standardizer(split["private"], cfg)
    if scaler is not None:
        split = {k: scaler(v) for k, v in split.items()}
        global_test = None if global_test is None else scaler(global_test)
        public_set = None if public_set is None else scaler(public_set)
    _warn_unscaled(split["private"], scaler is not None, cfg.dataset)
    if _counted(full, cfg) and len(full.y) and (low := int(full.y.min())) > 0:
        # (labels numbered from 1 are common: they count a class 0 that never occurs,
        # an output that is only ever trained down; a review)
        import logging

        absent = "class 0 never occurs but counts" if low == 1 else \
            f"classes 0-{low - 1} never occur but count"
        logging.getLogger("hfl.peer").warning(
            "%s: the lowest label is %d, so %s among the %d classes (labels are numbered "
            "from 0; num_classes counted as the highest label + 1). Labels numbered from 1: "
            "subtract 1. Meant (other peers hold them): set data.options.num_classes",
            cfg.path, low, absent, full.num_classes)
    train, noise_rate = _noisy(split["private"], cfg)
    return PeerData(
        train=train, test=split["test"], global_test=global_test,
        num_classes=full.num_classes,
        public=public_set if public_set is not None else split.get("public"),
        val=split.get("val"), label_noise_rate=noise_rate,
        classes_from="counted" if _counted(full, cfg) else "given",
        labels_present=len(np.unique(full.y)),
    )


def _counted(full, cfg: DataConfig) -> bool:
    """Whether ``full.num_classes`` was counted from its labels (max + 1): a file of the
    user's with numeric labels and no ``num_classes`` option."""
    return (cfg.dataset in ("npz", "csv") and full.classes is None
            and cfg.options.get("num_classes") is None)


def _warn_unscaled(train, standardized: bool, dataset: str) -> None:
    import logging

    from hfl.peer.check import input_scale_warning

    warning = input_scale_warning(train.x, standardized, dataset)
    if warning:
        logging.getLogger("hfl.peer").warning("%s", warning)


def _load_dataset(dataset: str, path: str | None, target: str | None, options: dict[str, Any]):
    from hfl.data import load_builtin, load_csv, load_image_folder, load_npz

    loader = {"npz": load_npz, "csv": load_csv, "image_folder": load_image_folder}.get(dataset)
    if loader is None:
        return load_builtin(dataset, **options)
    _check_options(loader, options, dataset)
    return loader(path, target, **options) if dataset == "csv" else loader(path, **options)


def _check_options(loader, options: dict[str, Any], dataset: str) -> None:
    """``data.options`` against the loader's keyword options: a typo is named with the
    allowed options (not "load_csv() got an unexpected keyword argument")."""
    import inspect

    allowed = [n for n, prm in inspect.signature(loader).parameters.items()
               if prm.kind is prm.KEYWORD_ONLY or (prm.default is not prm.empty and n != "target")]
    for key in options:
        if key not in allowed:
            from hfl.peer.configtools import _did_you_mean

            raise ConfigError(f"data.options.{key}", f"not an option of dataset {dataset}; "
                              f"allowed: {', '.join(allowed)}{_did_you_mean(key, allowed)}")
    from hfl.data.builtin import wrong_flag

    if (flag := wrong_flag(loader, options)) is not None:
        raise ConfigError(f"data.options.{flag[0]}", flag[1])
    n = options.get("num_classes")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
        # (named "data" before, from inside the loader: a review)
        raise ConfigError("data.options.num_classes", f"got {n!r}; allowed: an int >= 2 (the "
                          "cohort's number of classes)")


def _load_public_set(cfg: PublicSetConfig, private):
    """(the public set, the rows of ``private`` to keep or None): the same on every peer.

    The public set must have the private data's sample shape. With ``disjoint`` it is
    a row-aligned view of the private dataset, and the rows drawn for it leave
    the private dataset before anything else is split off.
    """
    import numpy as np

    try:
        pub = _load_dataset(cfg.dataset, cfg.path, cfg.target, cfg.options)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError("data.public_set", f"cannot load dataset {cfg.dataset!r}: {exc}") from exc
    if pub.input_shape != private.input_shape:
        raise ConfigError(
            "data.public_set",
            f"dataset {pub.name!r} has sample shape {pub.input_shape} but the private data "
            f"{private.name!r} has {private.input_shape}; they must match (e.g. options: {{size: ...}})",
        )
    if cfg.disjoint and len(pub) != len(private):
        raise ConfigError(
            "data.public_set.disjoint",
            f"needs a row-aligned view of the private data ({len(private)} rows), got {len(pub)} "
            f"rows of {pub.name!r}; allowed: false here",
        )
    size = len(pub) if cfg.size is None else cfg.size
    if size > len(pub) - (1 if cfg.disjoint else 0):
        raise ConfigError("data.public_set.size", f"got {size}; allowed: 1..{len(pub) - int(cfg.disjoint)}")
    order = np.random.default_rng(cfg.seed).permutation(len(pub))
    chosen = np.sort(order[:size])
    public = pub.subset(chosen, name=f"public:{pub.name}")
    keep = np.sort(order[size:]) if cfg.disjoint else None
    return public, keep


def _noisy(train, cfg: DataConfig):
    """(the private training split with ``data.label_noise`` applied, the realised rate or None)."""
    from hfl.data.noise import add_label_noise

    noise = cfg.label_noise
    if noise is None:
        return train, None
    import numpy as np

    seed = noise.seed if noise.seed is not None else cfg.seed
    rng = np.random.default_rng([seed, cfg.partition_index, 104_729])  # one stream per peer
    return add_label_noise(train, noise.type, noise.rate, rng)


def resolve_device(spec: str):
    import torch

    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("node.device", f"got {spec!r} but CUDA is not available here; use cpu or auto")
        index = int(spec.split(":", 1)[1]) if ":" in spec else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                "node.device",
                f"got {spec!r}; this process sees {torch.cuda.device_count()} GPU(s) (check CUDA_VISIBLE_DEVICES)",
            )
        return torch.device(f"cuda:{index}")
    if spec == "mps" and not (getattr(torch.backends, "mps", None) is not None
                              and torch.backends.mps.is_available()):
        raise ConfigError("node.device", "got 'mps' but Apple's MPS is not available here; "
                          "use cpu or auto")
    return torch.device(spec)


def model_options(cfg: PeerConfig) -> dict[str, Any]:
    """The model's options; an architecture drawn at random (one with a ``seed``
    option, e.g. ``random_mlp``) gets a seed of its own per peer unless the config
    gives one: crc32 of "<cohort.seed>:<node.id>", so reruns draw the same models."""
    import zlib

    from hfl.models import arch_options

    options = dict(cfg.model.options)
    try:
        allowed = arch_options(cfg.model.arch)
    except ValueError as exc:
        raise ConfigError("model.arch", str(exc)) from exc
    takes_seed = "seed" in allowed
    if "head" in options and "head" not in allowed:
        # (build_model's head is what a method puts on the model, named by its checkpoint:
        # a fedavg config with model.options.head trained a prototype head, a review)
        raise ConfigError("model.options.head", f"not an option of model {cfg.model.arch!r}: "
                          "a method that puts its own head on the model (fedhp) sets it")
    if takes_seed and options.get("seed") is None:
        options["seed"] = zlib.crc32(f"{cfg.cohort.seed}:{cfg.node.id}".encode())
    return options


def _check_class_count(data: PeerData, source: str) -> None:
    """Classes counted from labels (max + 1) that make no sense to train: one class (a
    constant to learn), or far more than the labels present (an id column as the target:
    a model with an output per id). ``cohort.num_classes`` set says it is meant."""
    present = data.labels_present
    if data.num_classes == 1:
        raise ConfigError("cohort.num_classes", f"{source}: one class only: nothing to learn. If "
                          "the other peers hold the other classes, set cohort.num_classes to "
                          "the cohort's number of classes")
    if data.classes_from == "counted" and data.num_classes > max(100, 4 * present):
        raise ConfigError("cohort.num_classes", (
            f"{source}: labels run up to {data.num_classes - 1}, so {data.num_classes} classes "
            f"(one output each), but only {present} distinct labels appear: an id column as the "
            "target? If these are the classes, set data.options.num_classes (or "
            "cohort.num_classes) to say so"))


def model_spec(cfg: PeerConfig, input_shape: tuple[int, ...], num_classes: int) -> dict[str, Any]:
    """What rebuilds this peer's model: ``hfl.models.build_model(arch, input_shape,
    num_classes, embedding_dim, **options)`` (checkpoints carry it for hfl-export),
    ``options`` with the ``head`` a method puts in place of the linear one (FedHP's
    prototype head: every fedhp run was refused by hfl-export and hfl-eval, a review)."""
    from hfl.algorithms.registry import get_algorithm

    options = model_options(cfg)
    try:
        alg_cls = get_algorithm(cfg.cohort.algorithm)
    except (ValueError, ImportError):  # (named where the algorithm is built)
        alg_cls = None
    if (head_spec := getattr(alg_cls, "head_spec", None)) is not None:
        options["head"] = head_spec(build(alg_cls.Config, cfg.algorithm, "algorithm"))
    return {"arch": cfg.model.arch, "input_shape": [int(d) for d in input_shape],
            "num_classes": int(num_classes), "embedding_dim": cfg.model.embedding_dim,
            "options": options}


def build_algorithm(cfg: PeerConfig, data: PeerData | None = None):
    """Data, model and algorithm instance for this peer."""
    import torch

    from hfl.algorithms.base import AlgorithmContext, aggregates_everywhere
    from hfl.algorithms.registry import get_algorithm
    from hfl.models import build_model
    from hfl.peer.core import signing_context

    if cfg.node.threads:
        torch.set_num_threads(cfg.node.threads)
    device = resolve_device(cfg.node.device)
    data = data or load_peer_data(cfg.data)
    num_classes = cfg.cohort.num_classes or data.num_classes
    if num_classes < data.num_classes:
        raise ConfigError(
            "cohort.num_classes",
            f"got {num_classes} but the dataset has {data.num_classes} classes",
        )
    if not cfg.cohort.num_classes:
        _check_class_count(data, cfg.data.path or cfg.data.dataset)
    try:
        alg_cls = get_algorithm(cfg.cohort.algorithm)
    except (ValueError, ImportError) as exc:  # e.g. a plugin that does not import
        raise ConfigError("cohort.algorithm", str(exc)) from None
    if cfg.cohort.fanout is not None and alg_cls.mode != "broadcast":
        raise ConfigError("cohort.fanout", f"applies to broadcast-mode methods (fedh2l, mdhfl); "
                          f"{cfg.cohort.algorithm} runs in {alg_cls.mode} mode: remove it")
    if cfg.cohort.communicate_every != 1 and alg_cls.mode == "local":
        raise ConfigError("cohort.communicate_every", f"applies to methods that share; "
                          f"{cfg.cohort.algorithm} trains alone: remove it")
    if cfg.cohort.overlap and not alg_cls.overlaps_local_step:
        raise ConfigError("cohort.overlap", f"applies to methods whose absorb is a step of its "
                          f"own (fedh2l); {cfg.cohort.algorithm} ({alg_cls.mode} mode) would "
                          "lose the overlapped local step: remove it")
    if cfg.cohort.overlap and cfg.node.evaluate_every == 1:
        raise ConfigError("cohort.overlap", "needs node.evaluate_every > 1: a round that evaluates "
                          "runs the paper's order, and with evaluate_every 1 every round does "
                          "(set node.evaluate_every, e.g. 50 as examples/rotated_mnist.yaml does)")
    if cfg.timing.join == "lazy":
        from hfl.peer.config import SWIM_FROM, uses_swim

        if not uses_swim(cfg.timing.membership, cfg.node.min_peers):
            raise ConfigError("timing.join", f"lazy needs SWIM membership (timing.membership: "
                              f"swim, or auto with node.min_peers >= {SWIM_FROM}): with full "
                              "heartbeats every member greets every other anyway; allowed: greet")
    alg_cfg = build(alg_cls.Config, cfg.algorithm, "algorithm")
    torch.manual_seed(cfg.cohort.seed)  # the same initial weights for the same architecture
    try:
        model = build_model(
            cfg.model.arch, data.train.input_shape, num_classes, cfg.model.embedding_dim,
            **model_options(cfg),
        )
    except ValueError as exc:  # named by the option its message names, where one is
        raise ConfigError(_option_path(str(exc), cfg.model.options), str(exc)) from exc
    except (RuntimeError, MemoryError) as exc:  # (an allocation the machine cannot make)
        raise ConfigError("model", f"cannot build {cfg.model.arch} for input "
                          f"{tuple(data.train.input_shape)} and {num_classes} classes: "
                          f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    if "public" in cfg.selection.on and (data.public is None or not len(data.public)):
        raise ConfigError(
            "selection.on", f"got {cfg.selection.on!r} but this peer has no public split: set "
            "data.public_fraction > 0 (or data.public_set), or use 'val'",
        )
    torch.manual_seed(cfg.node.seed)  # this peer's own randomness from here on
    ctx = AlgorithmContext(
        peer_id=cfg.node.id, model=model, train=data.train, test=data.test,
        num_classes=num_classes, device=device, seed=cfg.node.seed, rounds=cfg.cohort.rounds,
        train_cfg=cfg.train, selection=cfg.selection,
        extra_tests={"global": data.global_test} if data.global_test is not None else {},
        public=data.public, val=data.val, domain_tests=data.domain_tests, own_domain=data.own_domain,
        cohort_seed=cfg.cohort.seed, label_noise_rate=data.label_noise_rate,
        run=signing_context(cfg.cohort) if cfg.cohort.run else "",
        store=RunStore(cfg.run_dir),
    )
    try:
        algorithm = alg_cls(ctx, alg_cfg)
    except ValueError as exc:  # what the options ask of this peer's model, data or key files
        raise ConfigError("algorithm", str(exc)) from exc
    try:
        everywhere = aggregates_everywhere(cfg.cohort.aggregate_at, algorithm, cfg.node.min_peers)
    except ValueError as exc:
        raise ConfigError("cohort.aggregate_at", str(exc)) from None
    if cfg.timing.join == "lazy" and (alg_cls.mode != "aggregator" or everywhere):
        raise ConfigError("timing.join", f"lazy needs a method with an elected aggregator; "
                          f"{cfg.cohort.algorithm} ({alg_cls.mode} mode"
                          f"{', every peer aggregating' if everywhere else ''}) sends to every "
                          "member each round, which greets them all anyway; allowed: greet")
    return algorithm, num_classes


def _option_path(message: str, options: dict) -> str:
    """``model.options.<name>`` for a model's "<arch> option <name> must ..." about an
    option the config sets, else ``model`` (an input shape, the classes)."""
    import re

    found = re.search(r"\boption (\w+) must\b", message)
    return f"model.options.{found[1]}" if found and found[1] in options else "model"
