"""Checking a peer config before anything runs: ``hfl-peer --check`` and
``hfl-launch --dry-run`` (every peer), and the cheaper checks every launch does.

* :func:`check_options` (no data, no model): the CURVE keys and allow-list, the algorithm's own options
  (``algorithm.*`` against the chosen algorithm's ``Config``: another algorithm's
  option is an error), the model architecture's name, and that data files exist.
* :func:`check_peer`: all of that, then opens the data, builds the model and the
  algorithm exactly as the peer will, and warns about unscaled inputs.

Every problem is a :class:`~hfl.peer.configtools.ConfigError` naming the field path.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from hfl.peer.config import FILE_DATASETS, PeerConfig
from hfl.peer.configtools import ConfigError, build

log = logging.getLogger("hfl.peer")

# Inputs whose largest magnitude exceeds this are almost surely raw (0-16, 0-255)
# pixel values or unscaled features: the models' default learning rates expect ~[0, 1].
SCALE_LIMIT = 1.5


def check_options(cfg: PeerConfig, keys: bool = True) -> None:
    """Algorithm options, architecture name and data files, and (``keys``) the CURVE
    identity; imports the algorithm class (and so torch) but loads no data. A launcher
    that makes the cohort's keys itself once the checks passed says ``keys=False``."""
    from hfl.algorithms.registry import get_algorithm

    if keys:
        cfg.identity()  # CURVE keys, allow-list and bootstrap ids (ConfigError naming the field)
    try:
        alg_cls = get_algorithm(cfg.cohort.algorithm)
    except (ValueError, ImportError) as exc:
        raise ConfigError("cohort.algorithm", str(exc)) from None
    build(alg_cls.Config, cfg.algorithm, "algorithm")
    from hfl.models import model_names

    if cfg.model.arch not in model_names():
        from hfl.peer.configtools import _did_you_mean

        raise ConfigError(
            "model.arch",
            f"got {cfg.model.arch!r}; allowed: {', '.join(sorted(model_names()))}"
            f"{_did_you_mean(cfg.model.arch, model_names())}",
        )
    from hfl.models import arch_options

    allowed = arch_options(cfg.model.arch)
    unknown = sorted(set(cfg.model.options) - set(allowed))
    if unknown:  # else every peer would start, and each stop on it
        raise ConfigError(
            "model.options",
            f"model {cfg.model.arch!r} got unknown option(s) {', '.join(unknown)}; allowed "
            f"options: {', '.join(allowed) if allowed else '(none)'}",
        )
    check_data_files(cfg)


def robust_fits_the_cohort(cfg: PeerConfig, peers: int) -> None:
    """A robust rule that cannot combine the whole cohort's contributions (Krum with
    n <= 2f + 2, a median with 2f >= n; ``peers``: the launch's cohort) is a ConfigError
    naming ``algorithm.robust``: it trained, and every peer stopped at the end blaming
    lost knowledge (a docs review: multi_krum with byzantine 2 on 4 peers)."""
    from hfl.algorithms.registry import get_algorithm

    alg_cfg = build(get_algorithm(cfg.cohort.algorithm).Config, cfg.algorithm, "algorithm")
    rule = getattr(alg_cfg, "robust", None)
    if rule in (None, "mean") or peers < 2:
        return
    from hfl.algorithms.robust import check_rule

    try:
        check_rule(rule, peers, getattr(alg_cfg, "byzantine", 1),
                   getattr(alg_cfg, "trim_fraction", 0.2), getattr(alg_cfg, "krum_select", None))
    except ValueError as exc:
        raise ConfigError("algorithm.robust", f"{exc} (a cohort of {peers} peers): lower "
                          "algorithm.byzantine or pick another rule") from None


def check_data_files(cfg: PeerConfig) -> None:
    """The data files and folders the config names exist (no torch, no data read: a
    launcher runs it before anything slow)."""
    for where, dataset, path in _data_files(cfg):
        p = Path(path)
        if dataset == "image_folder" and not p.is_dir():
            raise ConfigError(where, f"{path}: no such folder (dataset image_folder wants a folder "
                                     "with one sub-folder per class)")
        if dataset in ("npz", "csv") and not p.is_file():
            raise ConfigError(where, f"{path}: no such file (dataset {dataset})")


def _data_files(cfg: PeerConfig) -> list[tuple[str, str, str]]:
    out = []
    if cfg.data.dataset in FILE_DATASETS and cfg.data.path:
        out.append(("data.path", cfg.data.dataset, cfg.data.path))
    public = getattr(cfg.data, "public_set", None)
    if public is not None and public.dataset in FILE_DATASETS and public.path:
        out.append(("data.public_set.path", public.dataset, public.path))
    return out


def check_peer(cfg: PeerConfig, terms: dict | None = None, keys: bool = True) -> str:
    """Build this peer as ``hfl-peer`` would, without the network; a one-line description.
    ``terms``, if given, receives its :func:`handshake_terms` as built."""
    check_options(cfg, keys)
    from hfl.models import count_parameters
    from hfl.peer.factory import build_algorithm, load_peer_data

    data = load_peer_data(cfg.data)
    alg, num_classes = build_algorithm(cfg, data)
    if terms is not None:
        terms.update(handshake_terms(cfg, num_classes, alg.handshake_info()))
        classes = alg.ctx.train.classes  # (a peer with numeric labels names none: refused too)
        terms["data.options.classes (the classes' names: text labels, image folders)"] = (
            list(classes) if classes is not None else "(numeric labels)")
    return (f"{cfg.node.id}: {cfg.data.dataset} {len(data.train)} training / {len(data.test)} test "
            f"samples of shape {tuple(data.train.input_shape)}, {num_classes} classes; "
            f"{getattr(alg.model, 'arch', cfg.model.arch)} with {count_parameters(alg.model):,} "
            f"parameters; {cfg.cohort.algorithm}")


def handshake_terms(cfg: PeerConfig, num_classes: int | None = None,
                    handshake: dict | None = None) -> dict[str, object]:
    """What a peer's hello must agree on with every other's (peer.node._incompatibility),
    by config field, plus the security mode; known without data unless ``num_classes``
    and ``handshake`` (the algorithm's dimensions) come from a built peer."""
    from hfl.peer.status import data_split_fields

    # The fields of the hello's data_split fingerprint, each by name (a review: the
    # fingerprints alone, "p0 392943829, p1 4170084006", did not say alpha differed).
    split = {f"data.{k}": v for k, v in data_split_fields(cfg.data).items()}
    terms: dict[str, object] = {
        "cohort.name": cfg.cohort.name, "cohort.algorithm": cfg.cohort.algorithm,
        "cohort.rounds": cfg.cohort.rounds, "security.mode": "curve" if cfg.secured else "none",
        **split,
        "cohort.num_classes": num_classes if num_classes is not None else cfg.cohort.num_classes,
        "cohort.communicate_every": cfg.cohort.communicate_every,
        "cohort.overlap": cfg.cohort.overlap,
        "node.max_message_mib": cfg.node.max_message_mib,
    }
    for key, value in sorted((handshake or {}).items()):
        terms[f"model/algorithm dimension {key}"] = value
    return terms


def disagreement(terms: dict[str, dict[str, object]]) -> ConfigError | None:
    """The first field on which peers (id -> :func:`handshake_terms`) disagree, as the
    error a launcher raises before anything runs: such peers would refuse each
    other's hello only after ``timing.join_timeout_s``. Unset values agree with all."""
    fields = dict.fromkeys(f for t in terms.values() for f in t)
    for field in fields:
        values = {pid: t.get(field) for pid, t in terms.items() if t.get(field) is not None}
        if len(set(map(repr, values.values()))) > 1:
            shown = ", ".join(f"{pid} {_clipped(v)}" for pid, v in list(values.items())[:6])
            return ConfigError(field.split(" (")[0], (
                f"peers disagree ({shown}): a peer refuses the hello of one that differs, so "
                "the cohort would never form; make it equal for every peer (check the peer "
                "overrides)" + (", e.g. data.options.classes: [every class name, in label "
                                "order]" if field.startswith("data.options.classes") else "")))
    return None


def _clipped(value: object, limit: int = 10) -> str:
    """repr of a value, a long list shown by its first items and its length."""
    if isinstance(value, list) and len(value) > limit:
        return f"[{', '.join(map(repr, value[:limit]))}, ... ({len(value)} in all)]"
    return repr(value)


def input_scale_warning(x, standardized: bool, dataset: str) -> str | None:
    """A warning when inputs look unscaled (e.g. raw 0-16 or 0-255 pixels), or None.

    Standardised tabular features are z-scores and pass; anything else whose
    largest magnitude exceeds SCALE_LIMIT is reported with the fix."""
    if standardized or x is None or len(x) == 0:
        return None
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.number):
        return None
    top = float(np.abs(arr).max())
    if top <= SCALE_LIMIT:
        return None
    lo = float(arr.min())
    fix = ("set data.options.scale to the largest raw value (e.g. scale: 255 divides x by 255)"
           if dataset == "npz" else
           "scale the inputs to about [0, 1] (or data.standardize: on for tabular features)")
    return (f"data: inputs of {dataset!r} range {lo:g}..{top:g}, not about [0, 1]: models train "
            f"poorly (often to chance) on raw values; {fix} (see docs/data.md)")
