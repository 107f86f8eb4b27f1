"""Threshold Paillier: a t-of-n secure sum of fixed-point vectors (FedHP's THE layer).

FedHP (Kuang & Mi, "FedHP: Heterogeneous Federated Learning with
Privacy-preserving", Sec. 2.2 eq. 4 and Lemma 1) sums the peers' noisy class
prototypes under additively homomorphic encryption so that the aggregator
learns only the sum, and decrypts it with a threshold variant of Paillier
(Damgård & Jurik, PKC 2001, their ref. [24]). This module is that layer:

- **Paillier** (Paillier, EUROCRYPT 1999) with ``g = n + 1``:
  ``Enc(m) = (1 + n)^m r^n mod n^2``; the product of ciphertexts encrypts the
  sum of the plaintexts (eq. 4). Big-integer arithmetic is gmpy2's.
- **Threshold decryption** in the style of Shoup (EUROCRYPT 2000) and
  Damgård–Jurik with ``s = 1``: the decryption exponent ``d`` with
  ``d = 0 mod lambda`` and ``d = 1 mod n`` is split by a *dealer* with integer
  Shamir sharing (Rabin 1998; Damgård & Thorbek, PKC 2006: integer coefficients
  ``kappa`` bits wider than the secret, so that fewer than ``t`` shares are
  statistically independent of it and no group order needs to be public).
  As in Shoup's scheme the shared secret is ``f(0) = Delta d`` with
  ``Delta = n_parties!``, not ``d``: over the integers ``s_i = f(i)`` is
  ``f(0) mod i``, so sharing ``d`` itself would hand party ``i`` the residue
  ``d mod i``; with the factor ``Delta`` every prime ``p <= n_parties`` divides
  ``f(0)`` and the shares mod ``p`` do not depend on ``d``.
  Party ``i`` releases ``c_i = c^{s_i} mod n^2``; any ``t`` of them combine with
  the integer Lagrange coefficients ``mu_i = Delta * prod_{j != i} j / (j - i)``
  into ``prod c_i^{mu_i} = c^{Delta f(0)} = c^{Delta^2 d} = 1 + n (Delta^2 m mod n)``,
  so ``m = L(.) * (Delta^2)^{-1} mod n``. Dead parties (up to ``n - t``) do not
  block decryption; fewer than ``t`` shares give nothing.
- **Attestation**: the dealer also gives every party an Ed25519 signing key
  and puts every party's verification key in the public key, so a party signs
  (round, own id, ciphertext digest) once and *every* party checks the same
  signature of a ciphertext forwarded by the aggregator: what verifies for
  the aggregator verifies for everyone (:meth:`KeyShare.attest`,
  :meth:`KeyShare.verify_attestation`).
- **Proof of plaintext knowledge** (:func:`prove_plaintexts`,
  :func:`verify_plaintexts`): every ciphertext ``c = (1 + n)^m r^n`` comes
  with a non-interactive zero-knowledge proof that its sender knows ``m`` and
  ``r``: the Sigma-protocol of Cramer, Damgård & Nielsen ("Multiparty
  computation from threshold homomorphic encryption", EUROCRYPT 2001, Sec. 6,
  "proof of plaintext knowledge"; Damgård & Jurik 2001 for ``s = 1``), made
  non-interactive with Fiat-Shamir (the challenge hashes the statement, the
  commitments and a context naming the key, the round and the sender, so a
  proof made for one sender or round verifies for no other). Without it a
  contributor could list ``ct(p2)^-1 * Enc(x)`` or an old ciphertext as its
  factor and get a single release decrypted.
- **Packing**: many fixed-point values per plaintext, each in its own
  ``slot_bits``-wide slot with head-room for the sum of ``max_summands``
  values (:class:`Packer`).
- **Release policy** (:class:`ReleaseGuard`): a party gives its share only for a
  ciphertext of the expected round that is the product of at least ``m_min``
  distinct contributions, and only once per round.

- **Proof of correct decryption** (:meth:`KeyShare.decryption_shares`,
  :func:`verify_decryption`), as in Shoup (2000) and Damgård–Jurik (2001, Sec. 5):
  the primes are safe (``p = 2p' + 1``), so the squares of ``Z_{n^2}^*`` form a
  cyclic group of order ``n p' q'`` with no small subgroup; the dealer publishes
  a random square ``v`` and every party's verification key ``v_i = v^{s_i}``.
  A party proves ``log_{c^2}(c_i^2) = log_v(v_i)`` for its shares of all ``k``
  ciphertexts of one product at once: the ``k`` statements are folded into one
  with exponents ``2 rho_j``, ``rho_j < 2^128`` hashed from all of them
  (small-exponent batch verification, Bellare, Garay & Rabin, EUROCRYPT 1998;
  sound here because the group has no element of order below 2^128, which holds
  from 512-bit moduli on: p', q' > 2^128), then the Chaum–Pedersen proof of
  equal discrete logarithms over the integers (``z = r + e s_i``, ``r`` 256 bits
  wider than any share), made non-interactive with Fiat–Shamir. Shares are
  combined squared, so a component of order 2 (which the proof cannot see)
  cancels. Without it a member could shift the decrypted sum by a plaintext of
  its choice, ``c_i (1 + n)^x``, and every peer absorbed it (an attack review);
  now such a share is refused and its sender named, and any ``t`` verified
  shares decrypt.

Key generation is by a trusted dealer (:func:`keygen`, ``python -m
hfl.peer.he_keys``), who also sees the signing keys: a documented trust
assumption.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gmpy2
import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

KAPPA_BITS = 128  # statistical hiding of the integer Shamir shares
SCHEME = "threshold-paillier-v4"
SIGN_KEY_BYTES = 32  # an Ed25519 private key, raw
SIGNATURE_BYTES = 64
CHALLENGE_BYTES = 16  # Fiat-Shamir challenge e < 2^128, far below either prime of n
_ATTEST_PREFIX = b"hfl-fedhp-attest-v2|"
_PROOF_PREFIX = b"hfl-fedhp-popk-v1|"
_DECRYPTION_PREFIX = b"hfl-fedhp-decryption-v1|"
#: Keys below this many bits are for tests: a 512-bit modulus is factored in hours.
MIN_SECURE_BITS = 2048


# ---------------------------------------------------------------------- keys


@dataclass(frozen=True)
class PublicKey:
    n: int
    threshold: int  # t: shares needed to decrypt
    parties: tuple[str, ...]  # party i (1-based) is parties[i - 1]
    verify_keys: tuple[bytes, ...] = ()  # party i's raw Ed25519 public key is verify_keys[i - 1]
    v: int = 0  # a random square mod n^2: the base of the share verification keys
    share_keys: tuple[int, ...] = ()  # party i's v^{s_i} mod n^2 is share_keys[i - 1]

    @property
    def n2(self) -> int:
        return self.n * self.n

    @property
    def bits(self) -> int:
        return int(self.n).bit_length()

    @property
    def n_bytes(self) -> int:
        return (self.n.bit_length() + 7) // 8

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the public key (modulus, t, key holders and their verification
        keys): names the cohort and its key holder set in every signed or proven message."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    @property
    def ct_bytes(self) -> int:
        """Fixed width of one serialised ciphertext (an integer mod n^2)."""
        return (self.n2.bit_length() + 7) // 8

    @property
    def delta(self) -> int:
        return math.factorial(len(self.parties))

    def index_of(self, party: str) -> int:
        try:
            return self.parties.index(party) + 1
        except ValueError:
            raise KeyError(f"{party!r} holds no key share; parties: {', '.join(self.parties)}") from None

    def encrypt(self, m: int) -> int:
        """Enc(m) = (1 + n)^m r^n mod n^2 = (1 + m n) r^n mod n^2, fresh r."""
        return self.encrypt_with_randomness(m)[0]

    def encrypt_with_randomness(self, m: int) -> tuple[int, int]:
        """(Enc(m), r): the randomness a proof of plaintext knowledge needs."""
        n, n2 = gmpy2.mpz(self.n), gmpy2.mpz(self.n2)
        if not 0 <= m < n:
            raise ValueError("plaintext out of range [0, n)")
        r = _unit(n)
        return int((1 + gmpy2.mpz(m) * n) % n2 * gmpy2.powmod(r, n, n2) % n2), int(r)

    def add(self, ciphertexts: Sequence[int]) -> int:
        """Enc(sum m_i) as the product of Enc(m_i) (eq. 4)."""
        n2 = gmpy2.mpz(self.n2)
        acc = gmpy2.mpz(1)
        for c in ciphertexts:
            acc = acc * gmpy2.mpz(c) % n2
        return int(acc)

    def combine(self, shares: dict[int, int]) -> int:
        """The plaintext from ``t`` or more decryption shares ``{party index: c^{s_i}}``
        of one ciphertext (the first ``t`` by index are used): the combination of
        their squares is ``c^{2 Delta^2 d}`` (squared: a share's component of order 2,
        which the proof of correct decryption cannot see, cancels)."""
        if len(shares) < self.threshold:
            raise ValueError(f"{len(shares)} decryption share(s); {self.threshold} needed")
        chosen = sorted(shares)[: self.threshold]
        if chosen[0] < 1 or chosen[-1] > len(self.parties):
            raise ValueError(f"party indices must be in 1..{len(self.parties)}, got {chosen}")
        n, n2, delta = gmpy2.mpz(self.n), gmpy2.mpz(self.n2), self.delta
        acc = gmpy2.mpz(1)
        for i in chosen:
            num, den = delta, 1
            for j in chosen:
                if j != i:
                    num *= j
                    den *= j - i
            mu = num // den  # exact: Delta makes every Lagrange coefficient an integer
            acc = acc * gmpy2.powmod(gmpy2.mpz(shares[i]), 2 * mu, n2) % n2
        if (acc - 1) % n != 0:
            raise ValueError("decryption shares do not combine (wrong ciphertext or key)")
        l_value = (acc - 1) // n
        return int(l_value * gmpy2.invert(2 * gmpy2.mpz(delta) ** 2, n) % n)

    @property
    def share_bits(self) -> int:
        """An upper bound on the bits of any party's share ``s_i = f(i)`` (public: it
        sizes the proof's randomness, which must hide ``e s_i``)."""
        width = 2 * self.bits + int(self.delta).bit_length() + KAPPA_BITS  # keygen's, bounded
        return width + self.threshold * len(self.parties).bit_length() + 2

    def to_json(self) -> dict:
        return {"scheme": SCHEME, "n": hex(self.n), "threshold": self.threshold,
                "parties": list(self.parties),
                "verify_keys": {p: k.hex() for p, k in zip(self.parties, self.verify_keys, strict=True)},
                "v": hex(self.v),
                "share_keys": {p: hex(k) for p, k in zip(self.parties, self.share_keys, strict=True)}}


def _unit(n: gmpy2.mpz) -> gmpy2.mpz:
    """A uniformly random element of Z_n^* (OS CSPRNG)."""
    while True:
        r = gmpy2.mpz(secrets.randbelow(int(n) - 1) + 1)
        if gmpy2.gcd(r, n) == 1:
            return r


def _is_round(round: object) -> bool:
    return isinstance(round, int) and not isinstance(round, bool) and -2**63 <= round < 2**63


def _round_and_sender(round: int, sender: str) -> bytes:
    if not _is_round(round):
        raise ValueError(f"round must be a 64-bit int, got {round!r}")
    if not isinstance(sender, str):
        raise TypeError("sender must be a str")
    who = sender.encode("utf-8", "surrogatepass")
    return f"{round}|{len(who)}:".encode() + who


def attestation_message(round: int, sender: str, ct_digest: str, key_fingerprint: str = "") -> bytes:
    """The bytes a sender's signature covers: the key (cohort), round, sender id
    (length-prefixed) and ciphertext digest; no two different tuples give the same
    message."""
    if not isinstance(ct_digest, str) or not isinstance(key_fingerprint, str):
        raise TypeError("ct_digest and key_fingerprint must be str")
    return (_ATTEST_PREFIX + key_fingerprint.encode() + b"|" + _round_and_sender(round, sender)
            + b"|" + ct_digest.encode("utf-8", "surrogatepass"))


def proof_context(public: PublicKey, round: int, sender: str) -> bytes:
    """What a proof of plaintext knowledge is bound to by Fiat-Shamir: the public key
    (the cohort and its key holder set), the round and the sender."""
    return _PROOF_PREFIX + public.fingerprint.encode() + b"|" + _round_and_sender(round, sender)


@dataclass(frozen=True)
class KeyShare:
    """Party ``index``'s share ``s_i = f(i)`` of ``Delta d`` and its raw Ed25519
    signing key (its verification key is in ``public.verify_keys``)."""

    public: PublicKey
    index: int
    secret: int = field(repr=False)
    sign_key: bytes = field(default=b"", repr=False)
    #: the run the attestations are for (the cohort's ``name#run`` where it has a run id;
    #: "" none): with one dealer's keys for two runs, an aggregator put a member's
    #: ciphertext of the earlier run into the later run's product (found from the code)
    run: str = ""

    @property
    def attested_key(self) -> str:
        """What an attestation names as its key: the key's fingerprint, and the run."""
        return f"{self.public.fingerprint}#{self.run}" if self.run else self.public.fingerprint

    @property
    def party(self) -> str:
        return self.public.parties[self.index - 1]

    def decryption_share(self, c: int) -> int:
        return int(gmpy2.powmod(gmpy2.mpz(c), gmpy2.mpz(self.secret), gmpy2.mpz(self.public.n2)))

    def decryption_shares(self, ciphertexts: Sequence[int], context: bytes
                          ) -> tuple[list[int], np.ndarray]:
        """(this party's share ``c_j^{s_i}`` of each ciphertext, the proof that each is
        correct, :func:`decryption_proof_size` bytes, bound to ``context``)."""
        pub = self.public
        n2, s = gmpy2.mpz(pub.n2), gmpy2.mpz(self.secret)
        shares = [int(gmpy2.powmod(gmpy2.mpz(c), s, n2)) for c in ciphertexts]
        base, folded = _folded(pub, context, self.index, ciphertexts, shares)
        r = gmpy2.mpz(secrets.randbits(pub.share_bits + 8 * CHALLENGE_BYTES + KAPPA_BITS))
        a, b = gmpy2.powmod(base, r, n2), gmpy2.powmod(gmpy2.mpz(pub.v), r, n2)
        e = _decryption_challenge(pub, context, self.index, base, folded, a, b)
        z = r + e * s
        return shares, np.frombuffer(e.to_bytes(CHALLENGE_BYTES, "big")
                                     + int(z).to_bytes(_z_bytes(pub), "big"), dtype=np.uint8).copy()

    def attest(self, round: int, ct_digest: str) -> str:
        """The hex Ed25519 signature of (key, round, own id, digest): one for all receivers."""
        msg = attestation_message(round, self.party, ct_digest, self.attested_key)
        return Ed25519PrivateKey.from_private_bytes(self.sign_key).sign(msg).hex()

    def verify_attestation(self, round: int, sender: str, ct_digest: str,
                           signature: object) -> str | None:
        """None if ``signature`` is ``sender``'s signature of (round, digest) under this
        key, else why not. Every key holder gets the same answer. Never raises: every
        argument may come off the wire."""
        pub = self.public
        if not isinstance(sender, str) or sender not in pub.parties:
            return f"{sender!r} holds no key share"
        if len(pub.verify_keys) != len(pub.parties):
            return "this key has no verification keys (an older dealer's)"
        if not _is_round(round) or not isinstance(ct_digest, str):
            return "round must be a 64-bit int and ct_digest a str"
        if not isinstance(signature, str) or len(signature) != 2 * SIGNATURE_BYTES:
            return f"the attestation must be a {2 * SIGNATURE_BYTES}-character hex signature"
        try:
            raw = bytes.fromhex(signature)
        except ValueError:
            return "the attestation is not hex"
        msg = attestation_message(round, sender, ct_digest, self.attested_key)
        try:
            Ed25519PublicKey.from_public_bytes(pub.verify_keys[pub.index_of(sender) - 1]).verify(raw, msg)
        except InvalidSignature:
            return f"attestation of {sender!r} does not verify"
        return None

    def save(self, path: str | Path) -> None:
        """The party's key file, readable by its owner only (mode 0600)."""
        data = {**self.public.to_json(), "index": self.index, "share": hex(self.secret),
                "sign_key": self.sign_key.hex()}
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
            f.write(json.dumps(data, indent=1) + "\n")


def load_key_share(path: str | Path) -> KeyShare:
    """A party's key file as written by :func:`keygen` / ``python -m hfl.peer.he_keys``."""
    try:
        data = json.loads(Path(path).read_text())
        scheme = data.get("scheme")
    except (AttributeError, ValueError) as exc:
        raise ValueError(f"{path}: not a key share file: {exc}") from exc
    if scheme in ("threshold-paillier-v1", "threshold-paillier-v2", "threshold-paillier-v3"):
        raise ValueError(f"{path}: the key file is from an older dealer ({scheme}: "
                         + ("no Delta factor, " if scheme.endswith("v1") else "")
                         + ("no signing keys" if not scheme.endswith("v3") else
                            "no safe primes and no share verification keys, so a wrong "
                            "decryption share could not be caught")
                         + "); rerun `python -m hfl.peer.he_keys` and give every peer its new file")
    try:
        if scheme != SCHEME:
            raise ValueError(f"scheme {scheme!r}, expected {SCHEME!r}")
        parties = tuple(data["parties"])
        index, secret = int(data["index"]), int(data["share"], 16)
        threshold, n, raw_keys, sign_key = (int(data["threshold"]), int(data["n"], 16),
                                            data["verify_keys"], data["sign_key"])
        v = int(data["v"], 16)
        share_keys = tuple(int(data["share_keys"][p], 16) for p in parties)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: not a key share file: {exc!r}") from exc
    if not 1 <= index <= len(parties) or not 2 <= threshold <= len(parties):
        # (threshold 1: any one key holder decrypts a single peer's ciphertext, as the
        # aggregator did in an attack review; keygen deals no such key)
        raise ValueError(f"{path}: index/threshold out of range (threshold 2..{len(parties)})")
    try:
        verify_keys = tuple(bytes.fromhex(raw_keys[p]) for p in parties)
        sign_key = bytes.fromhex(sign_key)
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: verify_keys must map every party id to a hex key and "
                         f"sign_key be hex: {exc!r}") from None
    if set(raw_keys) != set(parties) or any(len(k) != 32 for k in verify_keys) \
            or len(sign_key) != SIGN_KEY_BYTES:
        raise ValueError(f"{path}: verify_keys must hold one 32-byte key per party and nothing "
                         f"else, and sign_key {SIGN_KEY_BYTES} bytes")
    own = Ed25519PrivateKey.from_private_bytes(sign_key).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    if own != verify_keys[index - 1]:
        raise ValueError(f"{path}: sign_key does not match this party's key in verify_keys")
    if len(data["share_keys"]) != len(parties) or not all(
            1 < k < n * n - 1 and math.gcd(k, n) == 1 and gmpy2.jacobi(k % n, n) == 1
            for k in (v, *share_keys)):
        # (a square mod n^2 is a square mod n: Jacobi +1; v = 1 made every share
        # "verify", and a key sharing a factor with n made the verifier raise: a review)
        raise ValueError(f"{path}: v and share_keys must be one square mod n^2 each, one per "
                         "party, prime to n and neither 1 nor -1")
    public = PublicKey(n, threshold, parties, verify_keys, v, share_keys)
    if pow(v, secret, n * n) != share_keys[index - 1]:
        raise ValueError(f"{path}: share does not match this party's key in share_keys")
    return KeyShare(public, index, secret, sign_key)


def _small_primes(limit: int) -> list[int]:
    sieve = np.ones(limit, dtype=bool)
    sieve[:2] = False
    for i in range(2, math.isqrt(limit) + 1):
        if sieve[i]:
            sieve[i * i::i] = False
    return [int(p) for p in np.nonzero(sieve)[0] if p > 3]


_SIEVE = _small_primes(1 << 15)


def _prime(bits: int, block: int = 1 << 14) -> gmpy2.mpz:
    """A random safe prime ``p = 2 q + 1`` (q prime) of exactly ``bits`` bits. The
    candidates q = q0 + 6k (q = 5 mod 6: neither q nor 2q + 1 a multiple of 2 or 3)
    are sieved by the primes below 2^15 for both q and 2q + 1 at once, then tested
    (a 1024-bit one in about 1-3 s, against 5-40 s stepping through next_prime)."""
    while True:
        q0 = gmpy2.mpz(secrets.randbits(bits - 1) | (1 << (bits - 2)) | (1 << (bits - 3)))
        q0 += (5 - q0 % 6) % 6
        ok = np.ones(block, dtype=bool)  # k: q = q0 + 6k survives the sieve
        for small in _SIEVE:
            inv6, r = pow(6, -1, small), int(q0 % small)
            ok[(-r * inv6) % small::small] = False  # small | q
            ok[((small - 1) // 2 - r) * inv6 % small::small] = False  # small | 2q + 1
        for k in np.nonzero(ok)[0]:
            q = q0 + 6 * int(k)
            p = 2 * q + 1
            if p.bit_length() != bits:
                break
            if gmpy2.is_prime(q, 40) and gmpy2.is_prime(p, 40):
                return p


def keygen(parties: Sequence[str], threshold: int, bits: int = 2048) -> tuple[PublicKey, list[KeyShare]]:
    """The trusted dealer: a fresh modulus of ``bits`` bits (two safe primes) and one
    share of ``Delta d`` per party, with an Ed25519 signing key and a share
    verification key ``v^{s_i}`` for every party."""
    parties = tuple(parties)
    if len(set(parties)) != len(parties) or not parties:
        raise ValueError(f"parties must be distinct and non-empty, got {list(parties)}")
    if not 2 <= threshold <= len(parties):
        raise ValueError(f"threshold must be in 2..{len(parties)}, got {threshold} (with 1, "
                         "any one key holder decrypts any single ciphertext)")
    if bits < 64 or bits % 2:
        raise ValueError(f"bits must be an even number >= 64, got {bits}")
    while True:
        p, q = _prime(bits // 2), _prime(bits // 2)
        n = p * q
        lam = gmpy2.lcm(p - 1, q - 1)
        if p != q and n.bit_length() == bits and gmpy2.gcd(lam, n) == 1:
            break
    d = lam * gmpy2.invert(lam, n)  # d = 0 mod lambda, d = 1 mod n
    signers = [Ed25519PrivateKey.generate() for _ in parties]
    verify_keys = tuple(k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for k in signers)
    delta = gmpy2.mpz(math.factorial(len(parties)))
    width = int((n * lam).bit_length()) + int(delta.bit_length()) + KAPPA_BITS
    coeffs = [delta * d] + [gmpy2.mpz(secrets.randbits(width)) for _ in range(threshold - 1)]
    secrets_ = []
    for i in range(1, len(parties) + 1):
        s = gmpy2.mpz(0)
        for a in reversed(coeffs):  # Horner: f(i) over the integers
            s = s * i + a
        secrets_.append(s)
    n2 = n * n
    v = gmpy2.powmod(_unit(n2), 2, n2)  # a random square: generates the squares' group
    public = PublicKey(int(n), threshold, parties, verify_keys, int(v),
                       tuple(int(gmpy2.powmod(v, s, n2)) for s in secrets_))
    shares = [KeyShare(public, i, int(s), signer.private_bytes(Encoding.Raw, PrivateFormat.Raw,
                                                               NoEncryption()))
              for i, (s, signer) in enumerate(zip(secrets_, signers, strict=True), start=1)]
    return public, shares


# ---------------------------------------------------------------------- wire form


def to_bytes(ciphertexts: Sequence[int], width: int) -> np.ndarray:
    """Ciphertexts as a (k, width) uint8 array, big-endian, fixed width."""
    out = np.zeros((len(ciphertexts), width), dtype=np.uint8)
    for row, c in enumerate(ciphertexts):
        out[row] = np.frombuffer(int(c).to_bytes(width, "big"), dtype=np.uint8)
    return out


def from_bytes(arr: np.ndarray, public: PublicKey) -> list[int]:
    """Inverse of :func:`to_bytes`, checking shape, dtype and range (0 < c < n^2)."""
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 2 \
            or arr.shape[1] != public.ct_bytes:
        raise ValueError(f"ciphertexts must be uint8 (k, {public.ct_bytes}), got "
                         f"{getattr(arr, 'dtype', type(arr))}{list(getattr(arr, 'shape', []))}")
    out = []
    for row in arr:
        c = int.from_bytes(row.tobytes(), "big")
        if not 0 < c < public.n2:
            raise ValueError("a ciphertext is out of range (0, n^2)")
        out.append(c)
    return out


def digest(arr: np.ndarray) -> str:
    """SHA-256 of a serialised ciphertext array: names exactly one ciphertext."""
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


# ---------------------------------------------------------------------- proofs of plaintext knowledge
#
# Cramer, Damgård & Nielsen, EUROCRYPT 2001, Sec. 6 (Paillier, g = n + 1): to show
# knowledge of (m, r) with c = (1 + n)^m r^n mod n^2, the prover sends
# a = (1 + n)^x s^n for random x in Z_n, s in Z_n^*; on challenge e < 2^128 it answers
# z = x + e m mod n, w = s r^e mod n, and the verifier checks (1 + n)^z w^n = a c^e
# mod n^2 ((1 + n)^n = 1 mod n^2, so the carry of x + e m needs no term, and w^n mod
# n^2 depends on w mod n only). Special soundness: two answers to e != e' give
# m = (z - z') / (e - e') mod n, as e - e' < 2^128 is prime to n. Honest-verifier
# zero knowledge: (z, w) are uniform whatever m is. Fiat-Shamir: e = H(context, every
# c_j and a_j) for all of one sender's ciphertexts at once (AND-composition: one
# challenge, one answer per ciphertext); the proof is (e, z_1, w_1, ..., z_k, w_k)
# and the verifier recomputes a_j = (1 + n)^{z_j} w_j^n c_j^{-e}. The hash covers
# the statement (strong Fiat-Shamir: Bernhard, Pereira & Warinschi, ASIACRYPT 2012),
# which with the context makes a proof non-malleable (Faust, Kohlweiss, Marson &
# Venturi, INDOCRYPT 2012): it verifies for no other ciphertext, sender, round or key.


def proof_size(public: PublicKey, count: int) -> int:
    """Bytes of the proof for ``count`` ciphertexts: e, then (z_j, w_j) per ciphertext."""
    return CHALLENGE_BYTES + 2 * public.n_bytes * count


def _challenge(public: PublicKey, context: bytes, ciphertexts: Sequence, commitments: Sequence) -> int:
    h = hashlib.sha256(b"%d|" % len(context) + context)
    width = public.ct_bytes
    for c, a in zip(ciphertexts, commitments, strict=True):
        h.update(int(c).to_bytes(width, "big"))
        h.update(int(a).to_bytes(width, "big"))
    return int.from_bytes(h.digest()[:CHALLENGE_BYTES], "big")


def prove_plaintexts(public: PublicKey, context: bytes, plaintexts: Sequence[int],
                     randomness: Sequence[int], ciphertexts: Sequence[int]) -> np.ndarray:
    """The non-interactive proof (uint8, :func:`proof_size` bytes) that whoever made it
    knows the plaintext and randomness of every one of ``ciphertexts``."""
    n, n2 = gmpy2.mpz(public.n), gmpy2.mpz(public.n2)
    secrets_xs = [(gmpy2.mpz(secrets.randbelow(public.n)), _unit(n)) for _ in ciphertexts]
    commitments = [(1 + x * n) * gmpy2.powmod(s, n, n2) % n2 for x, s in secrets_xs]
    e = _challenge(public, context, ciphertexts, commitments)
    out = bytearray(e.to_bytes(CHALLENGE_BYTES, "big"))
    for m, r, (x, s) in zip(plaintexts, randomness, secrets_xs, strict=True):
        z = (x + e * gmpy2.mpz(m)) % n
        w = s * gmpy2.powmod(gmpy2.mpz(r), e, n) % n
        out += int(z).to_bytes(public.n_bytes, "big") + int(w).to_bytes(public.n_bytes, "big")
    return np.frombuffer(bytes(out), dtype=np.uint8).copy()


def verify_plaintexts(public: PublicKey, context: bytes, ciphertexts: Sequence[int],
                      proof: object) -> str | None:
    """None if ``proof`` proves knowledge of every plaintext of ``ciphertexts`` under
    ``context``, else why not. Never raises: the proof comes off the wire."""
    if not ciphertexts:  # (its proof would be the context's hash alone: anyone's)
        return "the proof of plaintext knowledge covers no ciphertext"
    size = proof_size(public, len(ciphertexts))
    if not isinstance(proof, np.ndarray) or proof.dtype != np.uint8 or proof.shape != (size,):
        return (f"the proof of plaintext knowledge must be uint8 [{size}], got "
                f"{getattr(proof, 'dtype', type(proof).__name__)}{list(getattr(proof, 'shape', []))}")
    raw = proof.tobytes()
    n, n2, nb = gmpy2.mpz(public.n), gmpy2.mpz(public.n2), public.n_bytes
    e = int.from_bytes(raw[:CHALLENGE_BYTES], "big")
    commitments = []
    for j, c in enumerate(ciphertexts):
        at = CHALLENGE_BYTES + 2 * nb * j
        z = gmpy2.mpz(int.from_bytes(raw[at:at + nb], "big"))
        w = gmpy2.mpz(int.from_bytes(raw[at + nb:at + 2 * nb], "big"))
        c = gmpy2.mpz(c)
        if z >= n or not 0 < w < n or gmpy2.gcd(w, n) != 1 or gmpy2.gcd(c, n) != 1:
            return f"proof of plaintext knowledge: answer {j} is out of range"
        c_inv_e = gmpy2.powmod(gmpy2.invert(c, n2), e, n2)
        commitments.append((1 + z * n) * gmpy2.powmod(w, n, n2) % n2 * c_inv_e % n2)
    if _challenge(public, context, ciphertexts, commitments) != e:
        return "the proof of plaintext knowledge does not verify (not this sender's, round's or ciphertext's)"
    return None


# ---------------------------------------------------------------------- proofs of correct decryption


def decryption_context(public: PublicKey, round: int, sender: str, ct_digest: str) -> bytes:
    """What a proof of correct decryption is bound to: the key, the round of the
    product, the sender and the product's digest."""
    if not isinstance(ct_digest, str):
        raise TypeError("ct_digest must be a str")
    return (_DECRYPTION_PREFIX + public.fingerprint.encode() + b"|"
            + _round_and_sender(round, sender) + b"|" + ct_digest.encode("utf-8", "surrogatepass"))


def _z_bytes(public: PublicKey) -> int:
    return (public.share_bits + 2 * 8 * CHALLENGE_BYTES + KAPPA_BITS + 8) // 8


def decryption_proof_size(public: PublicKey) -> int:
    """Bytes of a proof of correct decryption (any number of ciphertexts): e, then z."""
    return CHALLENGE_BYTES + _z_bytes(public)


def _folded(public: PublicKey, context: bytes, index: int, ciphertexts: Sequence[int],
            shares: Sequence[int]) -> tuple[gmpy2.mpz, gmpy2.mpz]:
    """(prod c_j^{2 rho_j}, prod y_j^{2 rho_j}) with rho_j < 2^128 hashed from the key,
    the context, the party and every ciphertext and share: the k statements as one."""
    n2, width = gmpy2.mpz(public.n2), public.ct_bytes
    h = hashlib.sha256(b"rho|%d|" % len(context) + context + b"|%d|" % index)
    h.update(int(public.share_keys[index - 1]).to_bytes(width, "big"))
    for c, y in zip(ciphertexts, shares, strict=True):
        h.update(int(c).to_bytes(width, "big"))
        h.update(int(y).to_bytes(width, "big"))
    seed = h.digest()
    base = folded = gmpy2.mpz(1)
    for j, (c, y) in enumerate(zip(ciphertexts, shares, strict=True)):
        rho = 2 * int.from_bytes(hashlib.sha256(seed + j.to_bytes(8, "big")).digest()[:16], "big")
        base = base * gmpy2.powmod(gmpy2.mpz(c), rho, n2) % n2
        folded = folded * gmpy2.powmod(gmpy2.mpz(y), rho, n2) % n2
    return base, folded


def _decryption_challenge(public: PublicKey, context: bytes, index: int, base, folded, a, b) -> int:
    h = hashlib.sha256(b"%d|" % len(context) + context + b"|%d|" % index)
    width = public.ct_bytes
    for x in (public.v, public.share_keys[index - 1], base, folded, a, b):
        h.update(int(x).to_bytes(width, "big"))
    return int.from_bytes(h.digest()[:CHALLENGE_BYTES], "big")


def verify_decryption(public: PublicKey, context: bytes, index: object, ciphertexts: Sequence[int],
                      shares: Sequence[int], proof: object) -> str | None:
    """None if ``proof`` shows that ``shares`` are party ``index``'s decryption shares
    ``c_j^{s_i}`` of ``ciphertexts`` (up to a factor of order 2, which combining
    squares away), under ``context``; else why not. Never raises: all of it may come
    off the wire."""
    size = decryption_proof_size(public)
    if not isinstance(proof, np.ndarray) or proof.dtype != np.uint8 or proof.shape != (size,):
        return (f"the proof of correct decryption must be uint8 [{size}], got "
                f"{getattr(proof, 'dtype', type(proof).__name__)}{list(getattr(proof, 'shape', []))}")
    if not isinstance(index, int) or isinstance(index, bool) or not 1 <= index <= len(public.parties):
        return f"party {index!r} holds no key share"
    if len(public.share_keys) != len(public.parties):
        return "this key has no share verification keys (an older dealer's)"
    if len(shares) != len(ciphertexts) or not ciphertexts:
        return f"{len(shares)} share(s) for {len(ciphertexts)} ciphertext(s)"
    n2 = gmpy2.mpz(public.n2)
    if not all(0 < int(y) < n2 and gmpy2.gcd(gmpy2.mpz(y), n2) == 1 for y in (*shares, *ciphertexts)):
        return "a share or ciphertext is out of range or shares a factor with n"
    raw = proof.tobytes()
    e = int.from_bytes(raw[:CHALLENGE_BYTES], "big")
    z = gmpy2.mpz(int.from_bytes(raw[CHALLENGE_BYTES:], "big"))
    base, folded = _folded(public, context, index, ciphertexts, shares)
    v, vi = gmpy2.mpz(public.v), gmpy2.mpz(public.share_keys[index - 1])
    if gmpy2.gcd(vi, n2) != 1 or gmpy2.gcd(v, n2) != 1:
        return "this key's share verification keys are damaged (not prime to n)"
    a = gmpy2.powmod(base, z, n2) * gmpy2.powmod(gmpy2.invert(folded, n2), e, n2) % n2
    b = gmpy2.powmod(v, z, n2) * gmpy2.powmod(gmpy2.invert(vi, n2), e, n2) % n2
    if _decryption_challenge(public, context, index, base, folded, a, b) != e:
        return "the proof of correct decryption does not verify (a wrong share, or another product's)"
    return None


# ---------------------------------------------------------------------- packing


@dataclass(frozen=True)
class Packer:
    """Fixed-point packing of float vectors into plaintexts < n.

    A value ``v`` (refused beyond +-2^(value_bits-1-frac_bits), never clamped) is encoded as
    ``round(v 2^frac_bits) + 2^(value_bits-1)`` in ``[0, 2^value_bits)``; a slot
    is ``value_bits + ceil(log2(max_summands + 1))`` bits wide, so the sum of up
    to ``max_summands`` encodings never carries into the next slot.
    """

    plaintext_bits: int  # usable bits per plaintext: n.bit_length() - 1
    max_summands: int
    frac_bits: int = 16
    value_bits: int = 40

    @property
    def slot_bits(self) -> int:
        return self.value_bits + max(1, math.ceil(math.log2(self.max_summands + 1)))

    @property
    def slots(self) -> int:
        k = self.plaintext_bits // self.slot_bits
        if k < 1:
            raise ValueError(f"a {self.plaintext_bits}-bit plaintext holds no {self.slot_bits}-bit slot")
        return k

    @property
    def bound(self) -> float:
        """Magnitudes from here up are refused by :meth:`quantize`."""
        return float(2 ** (self.value_bits - 1 - self.frac_bits))

    def quantize(self, values: np.ndarray) -> np.ndarray:
        """Offset fixed-point int64 codes; ValueError naming how many values are
        beyond the range and the largest, rather than a silently clamped sum."""
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if not np.isfinite(v).all():
            raise ValueError("values must be finite")
        lim = self.bound - 2.0 ** -self.frac_bits
        beyond = np.abs(v) > lim
        if beyond.any():
            raise ValueError(f"{int(beyond.sum())} value(s) beyond the fixed-point range +-{lim:g} "
                             f"(largest magnitude {float(np.abs(v).max()):g}; value_bits "
                             f"{self.value_bits}, frac_bits {self.frac_bits}): lower frac_bits")
        codes = np.rint(v * 2.0 ** self.frac_bits).astype(np.int64)
        return codes + (1 << (self.value_bits - 1))

    def dequantize(self, sums: np.ndarray, summands: int) -> np.ndarray:
        """Sums of ``summands`` codes back to the float sum of the values."""
        sums = np.asarray(sums, dtype=np.int64) - summands * (1 << (self.value_bits - 1))
        return sums.astype(np.float64) / 2.0 ** self.frac_bits

    def pack(self, codes: np.ndarray) -> list[int]:
        codes = [int(c) for c in np.asarray(codes, dtype=np.int64)]
        out = []
        for start in range(0, len(codes), self.slots):
            m = 0
            for c in reversed(codes[start:start + self.slots]):
                m = (m << self.slot_bits) | c
            out.append(m)
        return out

    def unpack(self, plaintexts: Sequence[int], count: int) -> np.ndarray:
        mask = (1 << self.slot_bits) - 1
        out = []
        for m in plaintexts:
            m = int(m)
            for _ in range(self.slots):
                out.append(m & mask)
                m >>= self.slot_bits
        if len(out) < count:
            raise ValueError(f"{len(plaintexts)} plaintext(s) hold {len(out)} values, {count} expected")
        return np.array(out[:count], dtype=np.int64)

    def num_plaintexts(self, count: int) -> int:
        return -(-count // self.slots)


# ---------------------------------------------------------------------- release policy


class ShareRefused(Exception):
    """A decryption share was asked for a ciphertext the policy does not allow."""


@dataclass
class ReleaseGuard:
    """When a party may release its decryption share (FedHP's secure-sum rule):
    for the ciphertext of the expected round only, if it is the product of at
    least ``m_min`` distinct contributions, and at most once per round."""

    m_min: int
    released: dict[int, str] = field(default_factory=dict)  # round -> digest released

    def check(self, ct_round: int, expected_round: int, contributors: Sequence[str],
              ct_digest: str) -> None:
        if ct_round != expected_round:
            raise ShareRefused(f"ciphertext is of round {ct_round}, expected {expected_round}")
        distinct = set(contributors)
        if len(distinct) != len(contributors):
            raise ShareRefused(f"contributors repeat: {list(contributors)}")
        if len(distinct) < self.m_min:
            raise ShareRefused(f"{len(distinct)} contributor(s) < m_min = {self.m_min}: "
                               "the sum could expose one peer's values")
        if ct_round in self.released:
            raise ShareRefused(f"a share for round {ct_round} was already released")

    def release(self, key: KeyShare, ciphertexts: Sequence[int], ct_round: int,
                expected_round: int, contributors: Sequence[str], ct_digest: str
                ) -> tuple[list[int], np.ndarray]:
        """This party's decryption shares of ``ciphertexts`` and their proof of
        correctness (bound to the key, ``ct_round``, the party and ``ct_digest``)."""
        self.check(ct_round, expected_round, contributors, ct_digest)
        self.released[ct_round] = ct_digest
        return key.decryption_shares(
            ciphertexts, decryption_context(key.public, ct_round, key.party, ct_digest))
