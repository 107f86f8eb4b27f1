"""What signed statements cost (issue 35): Ed25519 signing and checking, and the payload
digest a signature covers, per message and per peer-round, beside a round's own time.

    python bench/signing.py [--quick]

Per message: sign one statement; check one signature; the SHA-256 payload digest of
the quickstart's model (an MLP) and of a torchvision ResNet-18 (the contributions
and results of those cohorts). Per peer-round, for n peers:

- every peer aggregating (the default up to 16 peers), with signing keys: its own
  contribution digested and signed once, each of the n - 1 it receives digested and
  checked once;
- an elected aggregator with certified commits: each peer signs one ack and checks
  the commit's certificate (q signatures); the aggregator checks n - 1 acks.

Printed beside the quickstart's measured round (s/round of bench/safe_defaults.py's
default run, read from runs/bench/safe_defaults.json when present).
"""

from __future__ import annotations

import json
import sys
import time

import _common as c


def best_of(fn, repeat: int, number: int) -> float:
    """Seconds per call: the best of ``repeat`` timings of ``number`` calls."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    import torch
    import torchvision
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from hfl.algorithms.base import module_to_arrays
    from hfl.models.registry import build_model
    from hfl.peer.core import PeerCore, payload_digest
    from hfl.protocol import Knowledge

    args = c.parser(__doc__).parse_args(argv)
    repeat, number = (3, 50) if args.quick else (5, 400)
    key = Ed25519PrivateKey.generate()
    core = PeerCore("p0", mode="aggregator", everywhere=True, lookahead=2, cohort="hfl",
                    signer=key.sign, verify_keys={"p0": key.public_key().public_bytes_raw()})
    statement = core.statement("knowledge", 7, 0, "ab" * 32, 0)
    sig = key.sign(statement).hex()
    sign_s = best_of(lambda: core.sign("knowledge", 7, 0, "ab" * 32, 0), repeat, number)
    verify_s = best_of(lambda: core.signed_by("p0", "knowledge", 7, 0, "ab" * 32, sig, 0), repeat, number)
    torch.manual_seed(0)
    models = {
        "quickstart MLP": build_model("mlp", (1, 8, 8), 10, 64, hidden=[128]),  # as examples/quickstart.yaml
        "ResNet-18": torchvision.models.resnet18(num_classes=10),
    }
    digest_s, sizes = {}, {}
    for name, model in models.items():
        k = Knowledge(sender="p0", incarnation=0, round=1, kind="weights",
                      tensors=module_to_arrays(model))
        sizes[name] = sum(a.nbytes for a in k.tensors.values())
        n = max(3, number // (1 if sizes[name] < 1e6 else 100))
        digest_s[name] = best_of(lambda k=k: payload_digest(k), repeat, n)
    round_s = None
    try:
        runs = json.loads((c.OUT_DIR / "safe_defaults.json").read_text())["runs"]
        round_s = {int(k.split("/")[0]): v["mean_round_s"] for k, v in runs.items() if k.endswith("defaults")}
    except (OSError, KeyError, ValueError):
        pass
    rows = [["sign one statement", "", f"{sign_s * 1e6:.0f} us", ""],
            ["check one signature", "", f"{verify_s * 1e6:.0f} us", ""]]
    for name in models:
        rows.append([f"digest of a {name} payload", f"{sizes[name] / 1e6:.2f} MB",
                     f"{digest_s[name] * 1e3:.3f} ms", ""])
    for n in (4, 8, 16):
        q = (n + 1) // 2 + 1
        for name in models:
            every = n * digest_s[name] + sign_s + (n - 1) * verify_s
            rows.append([f"every peer aggregating, {n} peers, {name}", "per peer-round",
                         f"{every * 1e3:.3f} ms",
                         c.fmt(every / round_s[n], "{:.1%}") if round_s and n in round_s and
                         name == "quickstart MLP" else ""])
        certified = sign_s + q * verify_s
        rows.append([f"certified commit, {n} peers (q = {q})", "per peer-round",
                     f"{certified * 1e3:.3f} ms (aggregator +{(n - 1) * verify_s * 1e3:.3f} ms)", ""])
    print(c.table(["what", "size", "time", "of the quickstart's round"], rows))
    c.write_json(c.out_path("signing", args.out), {
        "quick": args.quick, "sign_s": sign_s, "verify_s": verify_s, "digest_s": digest_s,
        "payload_bytes": sizes, "quickstart_round_s": round_s})
    return 0


if __name__ == "__main__":
    sys.exit(main())
