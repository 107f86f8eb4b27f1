"""Robust aggregation: rules that bound what a few malicious contributions can do.

A rule combines n same-shaped contributions x_1..x_n (each a vector, or a dict of
named arrays taken together as one vector) into one. Contributions are visited
sorted by peer id and accumulated in float64, so a rule gives the same bytes
whatever order they arrived in. Up to f of the n may be *Byzantine* (arbitrary:
sign-flipped, scaled by 100, noise, a huge claimed sample count).

- ``mean``: ``sum_i w_i x_i / sum_i w_i`` with the claimed sample counts as
  weights, FedAvg's rule (McMahan et al., AISTATS 2017). One contribution can
  move it anywhere (breakdown point 0).
- ``median``: the coordinate-wise median (Yin, Chen, Ramchandran, Bartlett,
  "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates",
  ICML 2018, Sec. 3, Definition 1); tolerates f < n/2.
- ``trimmed_mean``: the coordinate-wise beta-trimmed mean (ibid., Definition 2):
  per coordinate, drop the ``floor(beta n)`` largest and smallest values and
  average the rest; tolerates f <= floor(beta n), needs 2 floor(beta n) < n.
- ``krum`` / ``multi_krum`` (Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine
  Learning with Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017,
  Sec. 4 and the multi-Krum of its Sec. 5): the score of x_i is the sum of the
  squared distances to its n - f - 2 nearest other contributions; Krum returns
  the best-scored one, multi-Krum the plain mean of the m best (m = n - f by
  default). Needs n > 2f + 2 (their Proposition 1).
- ``geometric_median``: ``argmin_z sum_i w_i ||z - x_i||``, by the smoothed
  Weiszfeld iteration of RFA (Pillutla, Kakade, Harchaoui, "Robust Aggregation
  for Federated Learning", 2019): ``z <- sum_i b_i x_i / sum_i b_i`` with
  ``b_i = w_i / max(nu, ||z - x_i||)``, from the weighted mean, until the
  objective falls by less than ``tol`` (relative) or ``max_iter`` iterations.
  Breakdown point 1/2: tolerates contributions holding less than half the weight.

Pre-processing, with any rule:

- ``clip_update_norm`` tau: norm bounding of each contribution's *update*
  against a reference r (the model the round started from): ``u_i = x_i - r``,
  scaled to ``||u_i|| <= tau``, then ``r + u_i`` (Sun, Kairouz, Suresh, McMahan,
  "Can You Really Backdoor Federated Learning?", 2019). The norm is over all the
  floating arrays of a contribution together.
- ``max_weight_share`` s: the weights of the weighted rules (``mean``,
  ``geometric_median``) are capped so that no contribution holds more than a
  share s of the total (water-filling: the excess of a capped contribution goes
  to the others in proportion to their weights). A share below 1/n cannot be
  met; it is then 1/n, i.e. equal weights. The order statistics (``median``,
  ``trimmed_mean``, ``krum``, ``multi_krum``) count every contribution once and
  ignore weights.

Integer arrays (BatchNorm's ``num_batches_tracked``) keep FedAvg's rule, the
element-wise max, whatever the rule.

A rule that cannot run for the contributions that arrived, or cannot tolerate the
f it is told, raises ValueError naming the rule, n and f: the caller then
produces no aggregate (and says why), never a silent fall-back to the mean.
Pure numpy: no torch, no sockets, no clock. Docs: docs/robust.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from hfl.algorithms import layerwise

RULES = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "geometric_median")
WEIGHTED_RULES = ("mean", "geometric_median")  # the rules that use (claimed) weights
Rule = Literal["mean", "median", "trimmed_mean", "krum", "multi_krum", "geometric_median"]

GM_SMOOTHING = 1e-6  # nu of the smoothed Weiszfeld iteration
GM_MAX_ITER = 100  # iteration cap
GM_TOL = 1e-12  # stop when the objective falls by less than this fraction

RULE_HELP = ("how contributions are combined: mean (weighted, FedAvg), median, trimmed_mean, "
             "krum, multi_krum, geometric_median (docs/robust.md)")


# ---------------------------------------------------------------------- configs


@dataclass(frozen=True)
class RobustOptions:
    """The robust-aggregation options of a method's config (a base of its Config;
    a Config with a ``validate`` of its own calls ``super().validate()``)."""

    robust: Rule = field(default="mean", metadata={"help": RULE_HELP})
    trim_fraction: float = field(default=0.2, metadata={
        "min": 0, "lt": 0.5,
        "help": "beta of trimmed_mean: drop floor(beta n) largest and smallest values per coordinate"})
    byzantine: int = field(default=1, metadata={
        "min": 0, "help": "f, the contributions assumed malicious: every rule but mean refuses "
                          "(no aggregate) a round it cannot survive f in"})
    krum_select: int | None = field(default=None, metadata={
        "min": 1, "help": "m of multi_krum: the m best-scored contributions are averaged (None: n - f)"})

    def validate(self) -> None:
        if self.krum_select is not None and self.robust != "multi_krum":
            raise ValueError(f"krum_select applies only to robust: multi_krum (got robust: {self.robust})")


WEIGHT_SHARE_HELP = (
    "how much a contribution's claimed sample count may weigh (mean, geometric_median): equal "
    "(every contribution weighs the same: a claimed count buys nothing); a share s in (0, 1] "
    "(counts weigh, none above s of the total); null (counts weigh uncapped: FedAvg as published, "
    "for a cohort that trusts its members' counts)")


def counts_weigh(cfg: Any) -> bool:
    """Whether claimed sample counts weigh in ``cfg``'s mean: ``weighted`` and not
    ``max_weight_share: equal`` (FedAvg's and FedProx's default: a member that claims
    10^12 samples must not own the model of a cohort that did not say it trusts it)."""
    return bool(getattr(cfg, "weighted", True)) and getattr(cfg, "max_weight_share", None) != "equal"


@dataclass(frozen=True)
class WeightedRobustOptions(RobustOptions):
    """:class:`RobustOptions` plus the cap on a contribution's share of the weight."""

    max_weight_share: float | Literal["equal"] | None = field(default=None, metadata={
        "gt": 0, "max": 1, "help": WEIGHT_SHARE_HELP})

    def validate(self) -> None:
        super().validate()
        if self.max_weight_share is None or self.max_weight_share == "equal":
            return
        if self.robust not in WEIGHTED_RULES:
            raise ValueError(f"max_weight_share applies only to the weighted rules (robust: "
                             f"{', '.join(WEIGHTED_RULES)}); robust: {self.robust} counts every "
                             "contribution once")
        if not getattr(self, "weighted", True):
            raise ValueError("max_weight_share needs weighted: true (with weighted: false every "
                             "contribution already weighs the same)")


@dataclass(frozen=True)
class UpdateRobustOptions(WeightedRobustOptions):
    """:class:`WeightedRobustOptions` plus norm clipping of each contribution's update."""

    clip_update_norm: float | None = field(default=None, metadata={
        "gt": 0, "help": "L2 bound on each contribution's update from the model the round started "
                         "from, before the rule (None: off)"})

    def validate(self) -> None:
        super().validate()
        aggregation = getattr(self, "aggregation", "model")
        if self.clip_update_norm is not None and aggregation != "model":
            raise ValueError(f"clip_update_norm needs aggregation: model (got {aggregation}): a "
                             "layer-wise aggregator has no reference for the layers it does not hold")


def rule_options(cfg: Any) -> dict[str, Any]:
    """The keywords of :func:`combine` a method's config sets (the defaults, today's
    weighted mean, for a config without them, e.g. a plugin's)."""
    return {
        "rule": getattr(cfg, "robust", "mean"),
        "byzantine": getattr(cfg, "byzantine", 1),
        "trim_fraction": getattr(cfg, "trim_fraction", 0.2),
        "krum_select": getattr(cfg, "krum_select", None),
        "max_weight_share": (None if (share := getattr(cfg, "max_weight_share", None)) == "equal"
                             else share),  # equal: no counts reach the rule (counts_weigh)
        "clip_update_norm": getattr(cfg, "clip_update_norm", None),
    }


def is_plain(options: Mapping[str, Any]) -> bool:
    """True for the weighted mean with no clipping and no cap: the method's own code path."""
    return (options.get("rule", "mean") == "mean" and options.get("max_weight_share") is None
            and options.get("clip_update_norm") is None)


# ---------------------------------------------------------------------- checks


def trim_count(n: int, trim_fraction: float) -> int:
    """floor(beta n): how many values trimmed_mean drops at each end of a coordinate."""
    return int(math.floor(trim_fraction * n + 1e-9))


def check_rule(rule: str, n: int, byzantine: int = 1, trim_fraction: float = 0.2,
               krum_select: int | None = None) -> None:
    """Raise ValueError (naming the rule, n and f) unless ``rule`` can combine ``n``
    contributions of which ``byzantine`` may be malicious."""
    f = byzantine
    if rule not in RULES:
        raise ValueError(f"robust: got {rule!r}; allowed: {', '.join(RULES)}")
    if isinstance(f, bool) or not isinstance(f, (int, np.integer)) or f < 0:
        raise ValueError(f"{rule}: byzantine must be an integer >= 0, got {f!r}")
    if n < 1:
        raise ValueError(f"{rule}: nothing to aggregate (n=0)")
    if rule in ("median", "geometric_median") and 2 * f >= n:
        raise ValueError(f"{rule}: tolerates f < n/2 malicious contributions; byzantine f={f} "
                         f"needs n > {2 * f}, got n={n}")
    if rule == "trimmed_mean":
        if not 0 <= trim_fraction < 0.5:  # then 2 floor(beta n) < n for every n
            raise ValueError(f"trimmed_mean: trim_fraction must be in [0, 0.5) so that 2 floor(beta n) "
                             f"< n, got {trim_fraction}")
        k = trim_count(n, trim_fraction)
        if f > k:
            raise ValueError(f"trimmed_mean: trims floor(trim_fraction n) = {k} per side of n={n} "
                             f"contributions (trim_fraction={trim_fraction}), fewer than byzantine "
                             f"f={f}")
    if rule in ("krum", "multi_krum"):
        if n <= 2 * f + 2:
            raise ValueError(f"{rule}: needs n > 2f + 2 = {2 * f + 2} contributions for byzantine "
                             f"f={f}, got n={n}")
        if rule == "multi_krum" and krum_select is not None and not 1 <= krum_select <= n:
            raise ValueError(f"multi_krum: krum_select m={krum_select} must lie in 1..n, got n={n} "
                             f"(byzantine f={f})")


# ---------------------------------------------------------------------- rules on (n, d) points


def _matrix(points: Any) -> np.ndarray:
    x = np.asarray(points, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"expected n >= 1 points as an (n, d) array, got shape {np.shape(points)}")
    return x


def normalized_weights(weights: Any, n: int) -> np.ndarray:
    """Weights (n,) as float64 summing to 1 (None: equal); ValueError unless finite,
    non-negative and not all zero."""
    if weights is None:
        return np.full(n, 1.0 / n)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != (n,):
        raise ValueError(f"{w.size} weights for {n} contributions")
    if not np.isfinite(w).all() or (w < 0).any() or not (w > 0).any():
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {w.tolist()}")
    return layerwise.shares(w)


def cap_weights(weights: Any, max_share: float | None) -> np.ndarray:
    """Normalised weights (n,) in which none exceeds ``max_share`` (None: no cap), by
    water-filling: a capped weight's excess goes to the uncapped ones in proportion
    to their weights. A cap below 1/m (m: the positive weights) is raised to 1/m."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    p = normalized_weights(w, len(w))
    w = w / w.max()  # (sums of counts near the float limit stay finite)
    if max_share is None:
        return p
    if not 0 < max_share <= 1:
        raise ValueError(f"max_weight_share must be in (0, 1], got {max_share}")
    positive = w > 0
    m = int(positive.sum())
    if max_share * m <= 1:  # every positive weight at the cap: equal weights
        return np.where(positive, 1.0 / m, 0.0)
    capped = np.zeros(len(w), dtype=bool)
    while True:
        over = ~capped & (p > max_share)
        if not over.any():
            return p
        capped |= over
        free = ~capped
        p = np.where(capped, max_share, (1.0 - max_share * capped.sum()) * w / w[free].sum())


def weighted_mean(points: Any, weights: Any = None) -> np.ndarray:
    """sum_i w_i x_i / sum_i w_i, rows in order, float64 (d,)."""
    x = _matrix(points)
    w = normalized_weights(weights, len(x))
    acc = np.zeros(x.shape[1], dtype=np.float64)
    for wi, xi in zip(w, x, strict=True):
        acc += wi * xi
    return acc


def coordinate_median(points: Any) -> np.ndarray:
    """The coordinate-wise median (Yin et al. 2018, Definition 1), float64 (d,)."""
    return np.median(_matrix(points), axis=0)


def trimmed_mean(points: Any, trim_fraction: float) -> np.ndarray:
    """The coordinate-wise trimmed mean (Yin et al. 2018, Definition 2), float64 (d,)."""
    x = _matrix(points)
    n = len(x)
    check_rule("trimmed_mean", n, 0, trim_fraction)
    k = trim_count(n, trim_fraction)
    return np.sort(x, axis=0)[k:n - k].mean(axis=0)


def krum_scores(points: Any, byzantine: int) -> np.ndarray:
    """Blanchard et al.'s score of each row: the sum of the squared distances to its
    n - f - 2 nearest other rows, float64 (n,)."""
    x = _matrix(points)
    return _scores(_pairwise_sq([x]), byzantine, "krum")


def krum_selection(scores: Any, select: int = 1) -> np.ndarray:
    """Indices of the ``select`` best (lowest) scores, best first; ties go to the lower
    index (the peer id that sorts first)."""
    return np.argsort(np.asarray(scores), kind="stable")[:select]


def krum(points: Any, byzantine: int, select: int = 1) -> np.ndarray:
    """Krum (select 1) or multi-Krum: the plain mean of the ``select`` best-scored rows."""
    x = _matrix(points)
    check_rule("multi_krum" if select != 1 else "krum", len(x), byzantine, krum_select=select)
    chosen = np.sort(krum_selection(krum_scores(x, byzantine), select))
    return x[chosen].mean(axis=0)


def geometric_median(points: Any, weights: Any = None, *, smoothing: float = GM_SMOOTHING,
                     max_iter: int = GM_MAX_ITER, tol: float = GM_TOL) -> np.ndarray:
    """argmin_z sum_i w_i ||z - x_i|| by smoothed Weiszfeld (RFA), float64 (d,)."""
    x = _matrix(points)
    z, _ = _weiszfeld(_Stack([x]), normalized_weights(weights, len(x)), smoothing, max_iter, tol)
    return z[0]


def clip_updates(points: Any, reference: Any, max_norm: float) -> np.ndarray:
    """Rows r + u_i with u_i = x_i - r scaled to L2 norm <= ``max_norm``, float64 (n, d)."""
    x = _matrix(points)
    r = np.asarray(reference, dtype=np.float64).reshape(1, -1)
    stack = _Stack([x], [r[0]], max_norm)
    return stack.block(0)


# ---------------------------------------------------------------------- the machinery


class _Stack:
    """n contributions as blocks (n, d_k) (one per array, native dtype), optionally
    with each row's update from ``reference`` clipped to ``max_norm`` (over all
    blocks together); :meth:`block` gives a block in float64 with clipping applied."""

    def __init__(self, blocks: Sequence[np.ndarray], reference: Sequence[np.ndarray] | None = None,
                 max_norm: float | None = None):
        self.blocks = list(blocks)
        self.n = len(self.blocks[0])
        self.reference = None
        self.scale = np.ones(self.n)
        if max_norm is not None:
            if reference is None:
                raise ValueError("clip_update_norm needs a reference (the model the round began with)")
            self.reference = [np.asarray(r, dtype=np.float64).reshape(-1) for r in reference]
            sq = np.zeros(self.n)
            for b, r in zip(self.blocks, self.reference, strict=True):
                if b.shape[1] != r.size:
                    raise ValueError(f"reference of {r.size} values for contributions of {b.shape[1]}")
                sq += ((b.astype(np.float64) - r) ** 2).sum(axis=1)
            norms = np.sqrt(sq)
            self.scale = np.where(norms > max_norm, max_norm / np.maximum(norms, 1e-300), 1.0)

    @property
    def clipped(self) -> np.ndarray:
        return self.scale < 1.0

    def block(self, k: int) -> np.ndarray:
        b = self.blocks[k].astype(np.float64)
        if self.reference is not None and self.clipped.any():
            r = self.reference[k]
            b = r + self.scale[:, None] * (b - r)
        return b


def _pairwise_sq(blocks: Sequence[np.ndarray] | _Stack) -> np.ndarray:
    """(n, n) squared Euclidean distances over all blocks together, float64."""
    stack = blocks if isinstance(blocks, _Stack) else _Stack(blocks)
    d = np.zeros((stack.n, stack.n))
    for k in range(len(stack.blocks)):
        b = stack.block(k)
        for i in range(stack.n):
            d[i, i + 1:] += ((b[i + 1:] - b[i]) ** 2).sum(axis=1)
    return d + d.T


def _scores(dist: np.ndarray, f: int, rule: str) -> np.ndarray:
    n = len(dist)
    check_rule(rule, n, f)
    nearest = n - f - 2
    return np.array([np.sort(np.delete(dist[i], i))[:nearest].sum() for i in range(n)])


def _wsum(w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_i w_i b_i, row by row in float64 (no BLAS: the same bytes on every machine)."""
    acc = np.zeros(b.shape[1])
    for wi, row in zip(w, b, strict=True):
        acc += wi * row
    return acc


def _weiszfeld(stack: _Stack, alpha: np.ndarray, smoothing: float, max_iter: int, tol: float
               ) -> tuple[list[np.ndarray], int]:
    """Smoothed Weiszfeld over all blocks together: (z per block, iterations run)."""
    def distances(z: list[np.ndarray]) -> np.ndarray:
        sq = np.zeros(stack.n)
        for k, zk in enumerate(z):
            sq += ((stack.block(k) - zk) ** 2).sum(axis=1)
        return np.sqrt(sq)

    z = [_wsum(alpha, stack.block(k)) for k in range(len(stack.blocks))]  # the weighted mean
    dist = distances(z)
    objective = float(np.dot(alpha, dist))
    iterations = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007  (the count is returned)
        beta = alpha / np.maximum(smoothing, dist)
        beta = beta / beta.sum()
        z = [_wsum(beta, stack.block(k)) for k in range(len(stack.blocks))]
        dist = distances(z)
        previous, objective = objective, float(np.dot(alpha, dist))
        if abs(previous - objective) <= tol * objective:
            break
    return z, iterations


def combine(
    contributions: Mapping[str, Mapping[str, np.ndarray]],
    weights: Mapping[str, float] | None = None,
    *,
    rule: str = "mean",
    byzantine: int = 1,
    trim_fraction: float = 0.2,
    krum_select: int | None = None,
    max_weight_share: float | None = None,
    clip_update_norm: float | None = None,
    reference: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Combine peer -> {name: array} contributions (the same names, shapes and dtypes)
    by ``rule``; returns (arrays in the contributions' dtypes, info). ``weights``: peer
    -> weight (sample count; None: equal), used by mean and geometric_median only.
    ``reference``: name -> array, the point updates are measured from
    (``clip_update_norm``). Floating arrays go through the rule as one vector,
    integer arrays take the element-wise max. ``info`` says what the rule did:
    ``selected`` (krum, multi_krum: the peers averaged), ``clipped`` (the peers
    whose update was scaled down), ``iterations`` (geometric_median).
    ValueError when the rule cannot run (see :func:`check_rule`)."""
    peers = sorted(contributions)
    n = len(peers)
    if n == 0 or rule not in RULES:
        check_rule(rule, n, byzantine, trim_fraction, krum_select)
    first = contributions[peers[0]]
    names = list(first)
    for p in peers[1:]:
        got = contributions[p]
        if set(got) != set(names) or any(got[k].shape != first[k].shape or got[k].dtype != first[k].dtype
                                         for k in names):
            raise ValueError(f"{rule}: contributions of {peers[0]} and {p} differ in names, shapes "
                             "or dtypes")
    floats = [k for k in names if np.issubdtype(first[k].dtype, np.floating)]
    out: dict[str, np.ndarray] = {}
    info: dict[str, Any] = {}
    for k in names:
        if k not in floats:  # e.g. BatchNorm's num_batches_tracked: the max, as FedAvg
            out[k] = np.asarray(np.max(np.stack([contributions[p][k] for p in peers]), axis=0))
    if not floats:  # nothing for the rule to do
        return {k: out[k] for k in names}, info
    check_rule(rule, n, byzantine, trim_fraction, krum_select)
    if rule in WEIGHTED_RULES:
        w = cap_weights([1.0 if weights is None else float(weights[p]) for p in peers], max_weight_share)
    else:
        w = np.full(n, 1.0 / n)
    ref = None
    if clip_update_norm is not None:
        if reference is None:
            raise ValueError("clip_update_norm needs a reference (the model the round began with)")
        missing = [k for k in floats if k not in reference or reference[k].shape != first[k].shape]
        if missing:
            raise ValueError(f"clip_update_norm: the reference lacks {missing[:3]} of the contributions' arrays")
        ref = [reference[k] for k in floats]
    stack = _Stack([np.stack([contributions[p][k] for p in peers]).reshape(n, -1) for k in floats],
                   ref, clip_update_norm)
    if clip_update_norm is not None:
        info["clipped"] = [p for p, c in zip(peers, stack.clipped, strict=True) if c]

    if rule == "mean":
        flat = [_wsum(w, stack.block(i)) for i in range(len(floats))]
    elif rule == "median":
        flat = [np.median(stack.block(i), axis=0) for i in range(len(floats))]
    elif rule == "trimmed_mean":
        k_trim = trim_count(n, trim_fraction)
        flat = [np.sort(stack.block(i), axis=0)[k_trim:n - k_trim].mean(axis=0)
                for i in range(len(floats))]
    elif rule in ("krum", "multi_krum"):
        m = 1 if rule == "krum" else (krum_select if krum_select is not None else n - byzantine)
        chosen = np.sort(krum_selection(_scores(_pairwise_sq(stack), byzantine, rule), m))
        info["selected"] = [peers[i] for i in chosen]
        flat = [stack.block(i)[chosen].mean(axis=0) for i in range(len(floats))]
    else:  # geometric_median
        flat, info["iterations"] = _weiszfeld(stack, w, GM_SMOOTHING, GM_MAX_ITER, GM_TOL)
    for k, v in zip(floats, flat, strict=True):
        out[k] = v.reshape(first[k].shape).astype(first[k].dtype)
    return {k: out[k] for k in names}, info


def combine_layerwise(
    arrays: Mapping[str, Mapping[str, np.ndarray]],
    weights: Mapping[str, float] | None = None,
    same_arch: bool = False,
    **options: Any,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """:func:`combine` per group of :func:`hfl.algorithms.layerwise.groups`: each named
    array over the peers that hold it (``same_arch``: each architecture's whole model).
    Returns (the result, keyed as layerwise_mean keys it; {key: why} for the groups the
    rule could not run on, which are left out: every holder keeps its own)."""
    if options.get("clip_update_norm") is not None:
        raise ValueError("clip_update_norm needs aggregation: model")
    options = {k: v for k, v in options.items() if k != "clip_update_norm"}
    out: dict[str, np.ndarray] = {}
    skipped: dict[str, str] = {}
    for label, members, keys in layerwise.groups(arrays, same_arch):
        group = {p: {key: arrays[p][name] for key, name in keys.items()} for p in members}
        w = None if weights is None else {p: weights[p] for p in members}
        try:
            combined, _ = combine(group, w, **options)
        except ValueError as exc:
            skipped[label] = str(exc)
            continue
        out.update(combined)
    return out, skipped
