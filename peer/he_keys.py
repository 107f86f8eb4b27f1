"""Dealer for FedHP's threshold Paillier keys: one key share file per peer.

    python -m hfl.peer.he_keys --parties p0 p1 p2 p3 p4 --threshold 3 --out keys/
    python -m hfl.peer.he_keys --peers 5 --threshold 3 --out keys/      # ids p0..p4

Safe primes, so a 2048-bit key takes a few seconds.

writes ``keys/<id>.json`` (mode 0600: the public modulus, the threshold, the
party list with every party's Ed25519 verification key, that party's share of
the decryption exponent and its signing key, which signs its ciphertexts) and
``keys/public.json``; the directory is made (or set) mode 0700. Give each peer
only its own file (``algorithm.key_dir``); the dealer then forgets the keys.
Trust assumption: the dealer sees every share and every signing key and must be
honest and must not keep them (docs/fedhp.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hfl.peer.he_keys", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--parties", nargs="+", help="peer ids, in any order")
    who.add_argument("--peers", type=int, help="ids p0..p{N-1}, as hfl-launch names them")
    ap.add_argument("--threshold", type=int, required=True, help="shares needed to decrypt (t)")
    ap.add_argument("--bits", type=int, default=2048, help="modulus size (default 2048)")
    ap.add_argument("--allow-weak-key", action="store_true",
                    help="allow --bits below 2048 (tests and demos only: such a modulus can "
                         "be factored, which opens every ciphertext)")
    ap.add_argument("--out", type=Path, required=True, help="directory for the key files")
    args = ap.parse_args(argv)
    parties = args.parties or [f"p{i}" if args.peers <= 10 else f"p{i:0{len(str(args.peers - 1))}d}"
                               for i in range(args.peers)]
    from hfl.algorithms.threshold_he import MIN_SECURE_BITS, keygen

    if args.bits < MIN_SECURE_BITS and not args.allow_weak_key:
        print(f"error: --bits {args.bits}: a modulus under {MIN_SECURE_BITS} bits can be "
              "factored, which opens every ciphertext; add --allow-weak-key for tests and demos",
              file=sys.stderr)
        return 2
    try:
        public, shares = keygen(parties, args.threshold, args.bits)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(args.out, 0o700)
    for share in shares:
        path = args.out / f"{public.parties[share.index - 1]}.json"
        share.save(path)
        os.chmod(path, 0o600)
    (args.out / "public.json").write_text(json.dumps(public.to_json(), indent=1) + "\n")
    print(f"{len(shares)} key shares ({args.bits}-bit modulus, {args.threshold} of {len(shares)} "
          f"to decrypt) in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
