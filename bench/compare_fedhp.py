"""FedHP vs SOLO / FedAvg / FedProx / FedProto on a feature- and label-shifted
digits cohort; model heterogeneity; accuracy vs privacy budget; the cost of
the threshold-Paillier secure sum.

    python bench/compare_fedhp.py [--quick] [--seeds 0 1 2 3 4] [--rounds 20] [--workers 2]
                                  [--parts table hetero epsilon crypto] [--set KEY=VALUE ...]

Cohort: examples/fedhp_digits.yaml (5 peers; peer i sees scikit-learn's digits
rotated by 15 i degrees, 16x16 — feature shift — and a Dirichlet(0.5) share of
the rows — label shift; MLP encoder [128] -> 64, FedHP's projection to 32-d
prototypes), with ``lr 0.05`` instead of the paper's 0.001 (the paper trains
heads on a pre-trained backbone; here everything learns from scratch).

- **table** (paper Table 1-2): per run, the best over rounds of the peers' mean
  test accuracy (each peer on its own test split: its own domain and label
  mix) and of their mean accuracy on a balanced held-out set seen through their
  own domain (``global_acc``: 20% of the rows, held out before partitioning);
  mean ± std over seeds; bytes each peer shares per round. Secure sum off: the plaintext and the
  Paillier sums give the same numbers (tests/test_fedhp.py).
- **hetero** (paper 4.4): FedHP with decision heads of 1 or 2 FC layers
  (projection + decision = 2 or 3 FC layers) alternating over the peers, and
  FedProto with encoders of 1 or 2 hidden layers; FedAvg cannot run these.
- **epsilon** (paper Fig. 8, with an epsilon that holds): FedHP trained with
  DP-SGD (Opacus; Poisson rate batch/N, per-sample clip 1) and Gaussian noise
  on every release, each release in the clear (local DP: no secure sum, so
  nothing rests on other peers' honesty), delta 1e-5; one noise multiplier
  for both, the smallest whose epsilon, composing every DP-SGD step before the
  last release with all releases, is within the target; plot in
  docs/fedhp_epsilon.png. Also the wall time per round with and without
  DP-SGD (its cost).
- **crypto**: 2048-bit threshold Paillier (3 of 5), 10 classes x 128 dims,
  through FedHP's own hooks: seconds per phase, ciphertext bytes, and a round
  with n - t = 2 peers dead; the proofs of plaintext knowledge alone (bytes,
  prover and verifier ms per ciphertext). ``--baseline REV`` also runs the
  same measurement on git revision REV's code (in a subprocess, from ``git
  archive``) and prints the two side by side, e.g. ``--parts crypto
  --baseline 57dfb06`` for the secure sum before issue 32's proofs.

Budget on a 2-core CPU: the default (5 seeds, 110 simulated cohorts) about 5
minutes (2 to 16 s per cohort, depending on the load); ``--quick`` (seed 0, 8
rounds, no epsilon sweep) about 30 seconds. Results and their
reading: docs/fedhp.md.
"""

from __future__ import annotations

import math
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import OUT_DIR, ROOT, Contention, contention_note, out_path, parser, write_json  # noqa: E402

EXAMPLE = ROOT / "examples" / "fedhp_digits.yaml"
BASE = ["defaults.train.lr=0.05"]
PEERS = 5
METHODS = {  # label -> (algorithm, overrides)
    "SOLO": ("solo", ["defaults.algorithm={}"]),
    "FedAvg": ("fedavg", ["defaults.algorithm={}"]),
    "FedProx": ("fedprox", ["defaults.algorithm={}"]),
    "FedProto": ("fedproto", ["defaults.algorithm={}"]),
    "FedHP": ("fedhp", []),
    "FedHP t=0.1": ("fedhp", ["defaults.algorithm.temperature=0.1"]),
}
HETERO = {
    "FedHP 2 FC (all)": ("fedhp", []),
    "FedHP 2/3 FC": ("fedhp", [f"peer_overrides.p{i}.algorithm.head_layers=2" for i in (1, 3)]),
    "FedProto 1 hidden (all)": ("fedproto", ["defaults.algorithm={}"]),
    "FedProto 1/2 hidden": ("fedproto", ["defaults.algorithm={}"] + [
        f"peer_overrides.p{i}.model.options.hidden=[128,128]" for i in (1, 3)]),
}
EPSILONS = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
DELTA = 1e-5
DP_BASE = [f"defaults.algorithm.delta={DELTA}", "defaults.algorithm.dp_sgd=true"]

Job = tuple[str, str, int, int, tuple[str, ...]]  # (label, algorithm, seed, rounds, overrides)


def dp_sgd_schedule(seed: int, rounds: int) -> dict[str, tuple[float, int]]:
    """Each peer's (Poisson sample rate, DP-SGD steps before its last release) in the
    example with this seed: what its accountant composes."""
    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.factory import load_peer_data

    exp = load_experiment(str(EXAMPLE), [*BASE, f"defaults.data.seed={seed}", f"defaults.cohort.seed={seed}"])
    out = {}
    for plan in expand(exp, gpus=[], ports=list(range(42000, 42000 + exp.peers))):
        cfg = plan.config
        n, batch = len(load_peer_data(cfg.data).train), cfg.train.batch_size
        steps = cfg.train.local_epochs * max(1, round(n / batch))
        if cfg.train.max_batches is not None:
            steps = min(steps, cfg.train.max_batches)
        out[cfg.node.id] = (min(1.0, batch / n), steps * rounds)
    return out


def noise_for(epsilon: float, rounds: int, schedule: dict[str, tuple[float, int]],
              delta: float = DELTA) -> float:
    """The smallest noise multiplier m (for DP-SGD and the releases alike) whose epsilon
    after ``rounds`` releases and the DP-SGD steps is <= epsilon for every peer."""
    from hfl.algorithms.dp import Accountant

    def worst(m: float) -> float:
        return max(Accountant(m, delta, "rdp", m, q).epsilon(rounds, steps) for q, steps in schedule.values())

    lo, hi = 0.3, 1000.0
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if worst(mid) > epsilon else (lo, mid)
    return hi


def simulate_one(job: Job) -> dict | None:
    import torch

    from hfl.algorithms.simulate import simulate
    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.factory import build_algorithm

    label, algorithm, seed, rounds, extra = job
    (OUT_DIR / "fedhp").mkdir(parents=True, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix="sim_", dir=OUT_DIR / "fedhp")  # removed when done
    try:
        sets = [*BASE, f"defaults.cohort.algorithm={algorithm}", f"defaults.cohort.rounds={rounds}",
                f"defaults.data.seed={seed}", f"defaults.cohort.seed={seed}", f"defaults.node.seed={seed}",
                *extra, f"run_dir={run_dir}"]
        exp = load_experiment(str(EXAMPLE), sets)
        plans = expand(exp, gpus=[], ports=list(range(42000, 42000 + exp.peers)))
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        algorithms = [build_algorithm(p.config)[0] for p in plans]
        history = simulate(algorithms, rounds)
        means = [statistics.mean(history[p][r]["test_acc"] for p in history) for r in range(rounds)]
        balanced = [statistics.mean(history[p][r].get("global_acc", math.nan) for p in history)
                    for r in range(rounds)]
        last = history[sorted(history)[0]][-1]
        out = {"label": label, "algorithm": algorithm, "seed": seed, "best": max(means), "final": means[-1],
               "best_balanced": max(balanced), "final_balanced": balanced[-1],
               "bytes_per_peer_round": statistics.mean(r["bytes_shared"] for h in history.values() for r in h),
               "wall_s": time.perf_counter() - t0, "overrides": list(extra)}
        if "dp_epsilon" in last:
            worst = max((h[-1]["dp_epsilon"] for h in history.values()), key=lambda e: e or math.inf)
            out.update(epsilon=worst, releases=last["dp_releases"])
        print(f"  {label:<24} seed {seed}: best {out['best']:.4f} final {out['final']:.4f} "
              f"({out['wall_s']:.0f} s)", flush=True)
        return out
    except Exception as exc:  # noqa: BLE001  (one failed run is reported, not the end of the script)
        print(f"  {label} seed {seed} FAILED: {type(exc).__name__}: {exc}", flush=True)
        return None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def pm(values: list[float]) -> str:
    if not values:
        return "-"
    s = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):5.2f} ± {100 * s:4.2f}"


def rows_for(runs: list[dict], labels: list[str], key: str = "best") -> dict[str, list[float]]:
    return {lab: [r[key] for r in runs if r["label"] == lab] for lab in labels}


# --------------------------------------------------------------------------- crypto cost


def crypto_cost(bits: int = 2048, classes: int = 10, dim: int = 128, peers: int = 5, t: int = 3) -> dict:
    """Seconds and bytes of the secure sum through FedHP's hooks (3 rounds), all
    peers alive and with n - t dead."""
    import msgpack
    import numpy as np
    import torch

    from hfl.algorithms import threshold_he as he
    from hfl.algorithms.base import AlgorithmContext
    from hfl.algorithms.registry import get_algorithm
    from hfl.algorithms.settings import TrainConfig
    from hfl.data import load_builtin
    from hfl.models import build_model

    torch.set_num_threads(1)
    # CPU seconds of this one-threaded process: the work's cost whatever else runs on the
    # box (equal to wall time on an idle one); wall time on a shared box swings 2x.
    clock = time.process_time
    ids = [f"p{i}" for i in range(peers)]
    t0 = clock()
    _, shares = he.keygen(ids, t, bits)
    keygen_s = clock() - t0
    digits = load_builtin("digits", flatten=True)
    out: dict = {"bits": bits, "classes": classes, "dim": dim, "peers": peers, "threshold": t,
                 "keygen_s": keygen_s}
    with tempfile.TemporaryDirectory() as keys:
        for s in shares:
            s.save(Path(keys) / f"{ids[s.index - 1]}.json")
        for dead in (0, peers - t):
            cls = get_algorithm("fedhp")
            algs = []
            for i, pid in enumerate(ids[: peers - dead]):
                torch.manual_seed(i)
                ctx = AlgorithmContext(pid, build_model("mlp", (64,), classes, 64, hidden=[128]),
                                       digits.subset(np.arange(i, len(digits), peers)), digits.subset(np.arange(8)),
                                       classes, torch.device("cpu"), seed=i, train_cfg=TrainConfig())
                algs.append(cls(ctx, cls.Config(proto_dim=dim, secure_sum="paillier", key_dir=keys,
                                                 min_contributors=t, noise_multiplier=1.0,
                                                 noise_split=t - 1)))  # (the decryptor's own release)
            phases = {"share_s": [], "aggregate_s": [], "absorb_s": []}
            sizes = {}
            for r in (1, 2, 3):
                payloads = {}
                for a in algs:
                    t0 = clock()
                    payloads[a.ctx.peer_id] = a.share(r)
                    phases["share_s"].append((r, clock() - t0))
                agg = algs[r % len(algs)]
                t0 = clock()
                result = agg.aggregate(r, payloads)
                phases["aggregate_s"].append((r, clock() - t0))
                for a in algs:
                    t0 = clock()
                    a.absorb(r, {agg.ctx.peer_id: result})
                    phases["absorb_s"].append((r, clock() - t0))
                assert all(a.pending is not None for a in algs), "an honest product was refused"
                sizes[r] = {"contribution_bytes": statistics.mean(p.nbytes for p in payloads.values()),
                            "contribution_meta_bytes": statistics.mean(
                                len(msgpack.packb(p.meta)) for p in payloads.values()),
                            "result_bytes": result.nbytes, "result_meta_bytes": len(msgpack.packb(result.meta)),
                            "protos_round": result.meta.get("protos_round")}
            steady = {k: statistics.mean(v for r, v in xs if r >= 2) for k, xs in phases.items()}
            key = "alive" if dead == 0 else f"{dead}_dead"
            out[key] = {
                **steady,
                "round_critical_path_s": steady["share_s"] + steady["aggregate_s"] + steady["absorb_s"],
                "ciphertexts_per_peer": int(payloads[ids[0]].tensors["ct"].shape[0]),
                "ciphertext_bytes_per_peer": int(payloads[ids[0]].tensors["ct"].nbytes),
                **{f"round{r}_{k}": v for r, d in sizes.items() for k, v in d.items()},
                "protos_round_after_3": min(a.protos_round for a in algs),
            }
        # The primitives alone, on one peer's 28 packed plaintexts.
        packer = he.Packer(shares[0].public.bits - 1, peers)
        pub = shares[0].public
        codes = packer.quantize(np.random.default_rng(0).normal(size=classes * (dim + 1)))
        plain = packer.pack(codes[0] if isinstance(codes, tuple) else codes)  # before issue 32: (codes, clamped)
        t0 = clock()
        enc = [pub.encrypt_with_randomness(m) if hasattr(pub, "encrypt_with_randomness") else (pub.encrypt(m), 0)
               for m in plain]
        out["encrypt_s"] = clock() - t0
        cts = [c for c, _ in enc]
        if hasattr(he, "prove_plaintexts"):
            context = he.proof_context(pub, 2, ids[0])
            t0 = clock()
            proof = he.prove_plaintexts(pub, context, plain, [r for _, r in enc], cts)
            out["prove_ms_per_ct"] = (clock() - t0) / len(cts) * 1000
            t0 = clock()
            assert he.verify_plaintexts(pub, context, cts, proof) is None
            out["verify_ms_per_ct"] = (clock() - t0) / len(cts) * 1000
            out["proof_bytes"] = int(proof.nbytes)
            out["proof_bytes_per_ct"] = (proof.nbytes - he.CHALLENGE_BYTES) / len(cts)
        t0 = clock()
        dshares = [{s.index: s.decryption_share(c) for s in shares[:t]} for c in cts]
        out["decryption_share_s"] = (clock() - t0) / t
        if hasattr(he, "verify_decryption"):  # proofs of correct decryption (this stop)
            context = he.decryption_context(pub, 2, ids[0], "digest")
            t0 = clock()
            ys, proof = shares[0].decryption_shares(cts, context)
            out["decryption_share_with_proof_s"] = clock() - t0
            t0 = clock()
            assert he.verify_decryption(pub, context, 1, cts, ys, proof) is None
            out["verify_decryption_s"] = clock() - t0
            out["decryption_proof_bytes"] = int(proof.nbytes)
        t0 = clock()
        assert [pub.combine(d) for d in dshares] == plain
        out["combine_s"] = clock() - t0
    return out


def crypto_cost_at(rev: str) -> dict:
    """:func:`crypto_cost` run on git revision ``rev``'s code, in a subprocess whose
    ``hfl`` package is that revision's tree (this script's own code drives it)."""
    import json
    import os
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        src, pkg = Path(tmp) / "src", Path(tmp) / "pkg" / "hfl"
        src.mkdir()
        pkg.mkdir(parents=True)
        dirs = ["protocol", "algorithms", "peer", "launch", "data", "models"]
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *dirs], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        (pkg / "__init__.py").write_text("")
        for d in dirs:
            (pkg / d).symlink_to(src / d)
        env = {**os.environ, "PYTHONPATH": str(pkg.parent)}
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import compare_fedhp as c; "
                "import hfl; assert hfl.__file__.startswith(sys.argv[2]), hfl.__file__; "
                "print(json.dumps(c.crypto_cost()))")
        done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent), tmp],
                              env=env, check=True, capture_output=True, text=True)
        return json.loads(done.stdout.strip().splitlines()[-1])


def print_crypto_side_by_side(before: dict, after: dict, rev: str) -> None:
    print(f"\n  side by side, all peers alive (before: {rev}; after: this tree; same process tree, same box):")
    print(f"  | {'per round':<38} | {'before':>10} | {'after':>10} | {'after/before':>12} |")
    rows = [("share() per peer, s", "share_s"), ("aggregate(), s", "aggregate_s"),
            ("absorb() per peer, s", "absorb_s"), ("critical path, s", "round_critical_path_s"),
            ("ciphertext bytes per peer", "ciphertext_bytes_per_peer"),
            ("contribution bytes (tensors + meta)", None), ("result bytes (tensors + meta)", None)]
    for label, key in rows:
        def value(c, key=key, label=label):
            a = c["alive"]
            if key is not None:
                return a[key]
            kind = "contribution" if label.startswith("contribution") else "result"
            return a[f"round2_{kind}_bytes"] + a[f"round2_{kind}_meta_bytes"]
        b, a = value(before), value(after)
        fmt = "{:>10.2f}" if isinstance(b, float) and b < 100 else "{:>10,.0f}"
        print(f"  | {label:<38} | {fmt.format(b)} | {fmt.format(a)} | {a / b:>11.2f}x |")


def dpsgd_cost(rounds: int = 6) -> dict:
    """Seconds per local update of one peer of the example with and without DP-SGD
    (steady state: rounds 2..), and the accountant's cost per evaluate."""
    import torch

    from hfl.launch.experiment import expand, load_experiment
    from hfl.peer.factory import build_algorithm

    torch.set_num_threads(1)
    watch = Contention()
    out: dict = {}
    with tempfile.TemporaryDirectory() as run_dir:
        for key, sets in [("plain_s", []), ("dpsgd_s", [*DP_BASE, "defaults.algorithm.noise_multiplier=2",
                                                        "defaults.algorithm.dp_sgd_noise_multiplier=2"])]:
            exp = load_experiment(str(EXAMPLE), [*BASE, *sets, f"run_dir={run_dir}/{key}"])
            alg = build_algorithm(expand(exp, gpus=[], ports=list(range(42000, 42000 + exp.peers)))[0].config)[0]
            times = []
            for r in range(1, rounds + 1):
                t0 = time.perf_counter()
                alg.local_update(r)
                times.append(time.perf_counter() - t0)
            out[key] = statistics.mean(times[1:])
            out["train_samples"] = len(alg.ctx.train)
            if alg.dpsgd is not None:
                t0 = time.perf_counter()
                for r in range(1, 11):
                    alg.accountant.epsilon(r, r * alg.dpsgd.steps_per_epoch + 1)
                out["accountant_s"] = (time.perf_counter() - t0) / 10
    out["contention"] = watch.stop()
    return out


# --------------------------------------------------------------------------- main


def plot_epsilon(curve: list[dict], reference: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = [c["epsilon"] for c in curve]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for key, label, color in [("accs", "own test split", "C0"), ("accs_balanced", "balanced held-out", "C1")]:
        mean = [100 * statistics.mean(c[key]) for c in curve]
        std = [100 * (statistics.stdev(c[key]) if len(c[key]) > 1 else 0) for c in curve]
        ax.errorbar(eps, mean, yerr=std, marker="o", capsize=3, color=color, label=f"FedHP, DP-SGD + noisy releases, {label}")
        if reference.get(key):
            ref = 100 * statistics.mean(reference[key])
            ax.axhline(ref, ls="--", color=color, alpha=0.6, label=f"no DP ({ref:.1f}%)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"total epsilon (delta = {DELTA:g})")
    ax.set_ylabel("best mean test accuracy (%)")
    ax.set_title("FedHP, 5 peers, mean ± std over seeds; epsilon composes DP-SGD and the releases",
                 fontsize=8)
    ax.legend(loc="center right", fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--parts", nargs="+", choices=["table", "hetero", "epsilon", "dpsgd", "crypto"],
                    default=None)
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "fedhp_epsilon.png")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--epsilons", type=float, nargs="+", default=EPSILONS,
                    help=f"targets of the epsilon part (default {' '.join(f'{e:g}' for e in EPSILONS)})")
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="crypto part: also measure git revision REV's secure sum, side by side")
    args = ap.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2, 3, 4])
    rounds = args.rounds or (8 if args.quick else 20)
    parts = args.parts or (["table", "hetero", "crypto"] if args.quick else ["table", "hetero", "epsilon", "crypto"])
    extra = tuple(args.set)
    jobs: list[Job] = []
    if "table" in parts:
        jobs += [(lab, alg, s, rounds, (*o, *extra)) for lab, (alg, o) in METHODS.items() for s in seeds]
    if "hetero" in parts:
        jobs += [(lab, alg, s, rounds, (*o, *extra)) for lab, (alg, o) in HETERO.items() for s in seeds]
    noise: dict[tuple[float, int], float] = {}
    if "epsilon" in parts:
        jobs += [("DP none", "fedhp", s, rounds, extra) for s in seeds]
        jobs += [("DP-SGD clip only", "fedhp", s, rounds,
                  (*DP_BASE, "defaults.algorithm.noise_multiplier=0.001",
                   "defaults.algorithm.dp_sgd_noise_multiplier=0.001", *extra)) for s in seeds]
        for s in seeds:
            schedule = dp_sgd_schedule(s, rounds)
            for eps in args.epsilons:
                m = noise[eps, s] = noise_for(eps, rounds, schedule)
                jobs.append((f"DP eps={eps:g}", "fedhp", s, rounds,
                             (*DP_BASE, f"defaults.algorithm.noise_multiplier={m:.6g}",
                              f"defaults.algorithm.dp_sgd_noise_multiplier={m:.6g}", *extra)))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = [r for r in pool.map(simulate_one, jobs) if r is not None]
    wall = time.perf_counter() - t0
    result: dict = {"seeds": seeds, "rounds": rounds, "overrides": list(extra), "wall_s": wall, "runs": runs}

    if "table" in parts:
        acc = rows_for(runs, list(METHODS))
        fin = rows_for(runs, list(METHODS), "final")
        bal = rows_for(runs, list(METHODS), "best_balanced")
        print(f"\nTable 1: mean test accuracy (%) of the peers over {rounds} rounds, mean ± std over seeds "
              f"{seeds}: own test split (best round, final round), balanced held-out test in the peer's "
              f"own domain (best round); bytes each peer shares per round")
        print(f"| {'method':<13} | {'own test best':>14} | {'own test final':>14} | {'balanced best':>14} "
              f"| {'bytes/peer/round':>16} |")
        print(f"|{'-' * 15}|{'-' * 16}|{'-' * 16}|{'-' * 16}|{'-' * 18}|")
        for lab in METHODS:
            b = [r["bytes_per_peer_round"] for r in runs if r["label"] == lab]
            print(f"| {lab:<13} | {pm(acc[lab]):>14} | {pm(fin[lab]):>14} | {pm(bal[lab]):>14} "
                  f"| {statistics.mean(b) if b else 0:>16.0f} |")
        result["table"] = {lab: {"best": acc[lab], "final": fin[lab], "best_balanced": bal[lab]}
                           for lab in METHODS}
    if "hetero" in parts:
        acc = rows_for(runs, list(HETERO))
        bal = rows_for(runs, list(HETERO), "best_balanced")
        print("\nModel heterogeneity: best mean test accuracy (%), mean ± std over seeds "
              "(own test split, balanced held-out test)")
        for lab in HETERO:
            print(f"| {lab:<24} | {pm(acc[lab]):>14} | {pm(bal[lab]):>14} |")
        result["hetero"] = {lab: {"best": acc[lab], "best_balanced": bal[lab]} for lab in HETERO}
    if "epsilon" in parts:
        ref = [r["best"] for r in runs if r["label"] == "DP none"]
        curve = []
        print(f"\nAccuracy vs epsilon (delta {DELTA:g}; DP-SGD + noisy releases in the clear, "
              f"{rounds} releases; epsilon composes both)")
        ref_bal = [r["best_balanced"] for r in runs if r["label"] == "DP none"]
        ref_round_s = [r["wall_s"] / rounds for r in runs if r["label"] == "DP none"]
        print(f"| {'target eps':>10} | {'noise mult.':>11} | {'reported eps':>12} | {'own test best':>14} "
              f"| {'balanced best':>14} | {'s/round':>7} |")
        print(f"| {'none':>10} | {0:>11} | {'inf':>12} | {pm(ref):>14} | {pm(ref_bal):>14} "
              f"| {statistics.mean(ref_round_s) if ref_round_s else math.nan:>7.2f} |")
        clip = [r for r in runs if r["label"] == "DP-SGD clip only"]
        if clip:
            print(f"| {'clip only':>10} | {0.001:>11} | {'(huge)':>12} | {pm([r['best'] for r in clip]):>14} "
                  f"| {pm([r['best_balanced'] for r in clip]):>14} "
                  f"| {statistics.mean(r['wall_s'] / rounds for r in clip):>7.2f} |")
            result["clip_only"] = {"best": [r["best"] for r in clip],
                                   "best_balanced": [r["best_balanced"] for r in clip]}
        for eps in args.epsilons:
            rs = [r for r in runs if r["label"] == f"DP eps={eps:g}"]
            if not rs:
                continue
            mults = [noise[eps, r["seed"]] for r in rs]
            reported = max(r.get("epsilon") or math.inf for r in rs)
            curve.append({"epsilon": eps, "noise_multiplier": mults, "accs": [r["best"] for r in rs],
                          "accs_balanced": [r["best_balanced"] for r in rs], "reported": reported,
                          "s_per_round": statistics.mean(r["wall_s"] / rounds for r in rs)})
            print(f"| {eps:>10g} | {statistics.mean(mults):>11.3f} | {reported:>12.3f} | "
                  f"{pm([r['best'] for r in rs]):>14} | {pm([r['best_balanced'] for r in rs]):>14} "
                  f"| {curve[-1]['s_per_round']:>7.2f} |")
        result["epsilon"] = {"reference": ref, "reference_balanced": ref_bal, "curve": curve,
                             "reference_s_per_round": ref_round_s}
        if curve:
            args.plot.parent.mkdir(parents=True, exist_ok=True)
            plot_epsilon(curve, {"accs": ref, "accs_balanced": ref_bal}, args.plot)
    if "dpsgd" in parts:
        cost = dpsgd_cost()
        print(f"\nDP-SGD cost, one peer of the example (p0, {cost['train_samples']} private samples, "
              f"1 thread): local update {cost['plain_s']:.3f} s without, {cost['dpsgd_s']:.3f} s with "
              f"DP-SGD ({cost['dpsgd_s'] / cost['plain_s']:.1f}x); accountant per evaluate "
              f"{cost['accountant_s'] * 1000:.0f} ms; " + contention_note("timings", cost["contention"]))
        result["dpsgd"] = cost
    if "crypto" in parts:
        print("\nSecure sum, threshold Paillier 2048-bit, 3 of 5, 10 classes x 128 dims (this process, 1 thread; "
              "CPU seconds, = wall seconds on an idle box):")
        watch = Contention()
        cost = crypto_cost()
        before = crypto_cost_at(args.baseline) if args.baseline else None
        cost["contention"] = watch.stop()
        print(f"  keygen (dealer, once): {cost['keygen_s']:.2f} s; one peer's 28 plaintexts: encrypt "
              f"{cost['encrypt_s']:.2f} s, decryption share {cost['decryption_share_s']:.2f} s, "
              f"combine 3 shares {cost['combine_s']:.2f} s")
        print(f"  proof of plaintext knowledge: {cost['proof_bytes']} B for 28 ciphertexts "
              f"({cost['proof_bytes_per_ct']:.0f} B each + a 16 B challenge); prover "
              f"{cost['prove_ms_per_ct']:.1f} ms, verifier {cost['verify_ms_per_ct']:.1f} ms per ciphertext")
        if "verify_decryption_s" in cost:
            print(f"  proof of correct decryption: {cost['decryption_proof_bytes']} B for 28 "
                  f"shares; share with its proof {cost['decryption_share_with_proof_s']:.2f} s, "
                  f"verifier {cost['verify_decryption_s']:.2f} s per share")
        for key in ("alive", "2_dead"):
            c = cost[key]
            print(f"  {key:>6}: per-peer share() {c['share_s']:.2f} s (encrypt + prove + decryption share), "
                  f"aggregate() {c['aggregate_s']:.2f} s (verify + product + check shares + combine), absorb() "
                  f"{c['absorb_s']:.2f} s (verify product and factors); round critical path "
                  f"{c['round_critical_path_s']:.2f} s")
            print(f"          {c['ciphertexts_per_peer']} ciphertexts = {c['ciphertext_bytes_per_peer']} B per peer; "
                  f"contribution {c['round2_contribution_bytes']:.0f} B + {c['round2_contribution_meta_bytes']:.0f} B "
                  f"meta (signature), result {c['round2_result_bytes']} B + {c['round2_result_meta_bytes']} B meta; "
                  f"prototypes of round {c['protos_round_after_3']} in use after round 3")
        if before is not None:
            print_crypto_side_by_side(before, cost, args.baseline)
        print("  " + contention_note("crypto timings", cost["contention"]))
        result["crypto"] = cost
        if before is not None:
            result["crypto_baseline"] = {"rev": args.baseline, **before}
    print(f"\n({wall:.0f} s of simulations)")
    write_json(out_path("compare_fedhp", args.out), result)


if __name__ == "__main__":
    main()
