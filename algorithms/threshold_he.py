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
- **Attestation**: the dealer also gives every pair of parties a shared
  32-byte MAC key, so a party can tag its ciphertext for each other party
  (HMAC-SHA256 over round, sender and digest) and a receiver can tell that a
  ciphertext forwarded by the aggregator is really its sender's
  (:meth:`KeyShare.attest`, :meth:`KeyShare.verify_attestation`).
- **Packing**: many fixed-point values per plaintext, each in its own
  ``slot_bits``-wide slot with head-room for the sum of ``max_summands``
  values (:class:`Packer`).
- **Release policy** (:class:`ReleaseGuard`): a party gives its share only for a
  ciphertext of the expected round that is the product of at least ``m_min``
  distinct contributions, and only once per round.

Deviation from Damgård–Jurik: no zero-knowledge proofs of correct share
computation (so no safe primes are needed): the threat model is honest but
curious (docs/fedhp.md). Key generation is by a trusted dealer (:func:`keygen`,
``python -m hfl.peer.he_keys``), who also sees the MAC keys: a documented trust
assumption.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import math
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gmpy2
import numpy as np

KAPPA_BITS = 128  # statistical hiding of the integer Shamir shares
SCHEME = "threshold-paillier-v2"
MAC_KEY_BYTES = 32
_ATTEST_PREFIX = b"hfl-fedhp-attest-v1|"


# ---------------------------------------------------------------------- keys


@dataclass(frozen=True)
class PublicKey:
    n: int
    threshold: int  # t: shares needed to decrypt
    parties: tuple[str, ...]  # party i (1-based) is parties[i - 1]

    @property
    def n2(self) -> int:
        return self.n * self.n

    @property
    def bits(self) -> int:
        return int(self.n).bit_length()

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
        n, n2 = gmpy2.mpz(self.n), gmpy2.mpz(self.n2)
        if not 0 <= m < n:
            raise ValueError("plaintext out of range [0, n)")
        while True:
            r = gmpy2.mpz(secrets.randbelow(self.n - 1) + 1)
            if gmpy2.gcd(r, n) == 1:
                break
        return int((1 + gmpy2.mpz(m) * n) % n2 * gmpy2.powmod(r, n, n2) % n2)

    def add(self, ciphertexts: Sequence[int]) -> int:
        """Enc(sum m_i) as the product of Enc(m_i) (eq. 4)."""
        n2 = gmpy2.mpz(self.n2)
        acc = gmpy2.mpz(1)
        for c in ciphertexts:
            acc = acc * gmpy2.mpz(c) % n2
        return int(acc)

    def combine(self, shares: dict[int, int]) -> int:
        """The plaintext from ``t`` or more decryption shares ``{party index: c^{s_i}}``
        of one ciphertext (the first ``t`` by index are used): their combination
        is ``c^{Delta^2 d}``."""
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
            acc = acc * gmpy2.powmod(gmpy2.mpz(shares[i]), mu, n2) % n2
        if (acc - 1) % n != 0:
            raise ValueError("decryption shares do not combine (wrong ciphertext or key)")
        l_value = (acc - 1) // n
        return int(l_value * gmpy2.invert(gmpy2.mpz(delta) ** 2, n) % n)

    def to_json(self) -> dict:
        return {"scheme": SCHEME, "n": hex(self.n), "threshold": self.threshold,
                "parties": list(self.parties)}


def _is_round(round: object) -> bool:
    return isinstance(round, int) and not isinstance(round, bool) and -2**63 <= round < 2**63


def attestation_message(round: int, sender: str, ct_digest: str) -> bytes:
    """The bytes a sender's MAC tags cover: round, sender id (length-prefixed) and
    ciphertext digest, so no two different triples give the same message."""
    if not _is_round(round):
        raise ValueError(f"round must be a 64-bit int, got {round!r}")
    if not isinstance(sender, str) or not isinstance(ct_digest, str):
        raise TypeError("sender and ct_digest must be str")
    who = sender.encode("utf-8", "surrogatepass")
    return (_ATTEST_PREFIX + f"{round}|{len(who)}:".encode() + who + b"|"
            + ct_digest.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class KeyShare:
    """Party ``index``'s share ``s_i = f(i)`` of ``Delta d`` and its MAC keys
    (other party id -> the key that pair shares)."""

    public: PublicKey
    index: int
    secret: int = field(repr=False)
    mac_keys: dict[str, bytes] = field(default_factory=dict, repr=False, hash=False)

    @property
    def party(self) -> str:
        return self.public.parties[self.index - 1]

    def decryption_share(self, c: int) -> int:
        return int(gmpy2.powmod(gmpy2.mpz(c), gmpy2.mpz(self.secret), gmpy2.mpz(self.public.n2)))

    def attest(self, round: int, ct_digest: str) -> dict[str, str]:
        """One hex HMAC-SHA256 tag of (round, own id, digest) for every other party."""
        msg = attestation_message(round, self.party, ct_digest)
        tags = {}
        for other in self.public.parties:
            if other == self.party:
                continue
            if other not in self.mac_keys:
                raise ValueError(f"{self.party}'s key share has no MAC key for {other}")
            tags[other] = hmac.new(self.mac_keys[other], msg, hashlib.sha256).hexdigest()
        return tags

    def verify_attestation(self, round: int, sender: str, ct_digest: str,
                           tags: object) -> str | None:
        """None if ``tags`` holds ``sender``'s valid tag for this party, else why not.
        Never raises: every argument may come off the wire."""
        if not isinstance(sender, str) or sender not in self.public.parties:
            return f"{sender!r} holds no key share"
        key = self.mac_keys.get(sender)
        if key is None:
            return f"no MAC key shared with {sender!r}"
        if not _is_round(round) or not isinstance(ct_digest, str):
            return "round must be a 64-bit int and ct_digest a str"
        if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in tags.items()):
            return "tags must be a dict of str"
        tag = tags.get(self.party)
        if tag is None:
            return f"no attestation for {self.party!r}"
        expected = hmac.new(key, attestation_message(round, sender, ct_digest), hashlib.sha256)
        if not hmac.compare_digest(expected.hexdigest().encode(),
                                   tag.encode("utf-8", "surrogatepass")):
            return f"attestation of {sender!r} does not verify"
        return None

    def save(self, path: str | Path) -> None:
        """The party's key file, readable by its owner only (mode 0600)."""
        data = {**self.public.to_json(), "index": self.index, "share": hex(self.secret),
                "mac_keys": {j: k.hex() for j, k in sorted(self.mac_keys.items())}}
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
    if scheme == "threshold-paillier-v1":
        raise ValueError(f"{path}: the key file is from an older dealer ({scheme}: no Delta "
                         "factor, no MAC keys); rerun `python -m hfl.peer.he_keys` and give "
                         "every peer its new file")
    try:
        if scheme != SCHEME:
            raise ValueError(f"scheme {scheme!r}, expected {SCHEME!r}")
        public = PublicKey(int(data["n"], 16), int(data["threshold"]), tuple(data["parties"]))
        index, secret, raw_macs = int(data["index"]), int(data["share"], 16), data["mac_keys"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a key share file: {exc}") from exc
    if not 1 <= index <= len(public.parties) or not 1 <= public.threshold <= len(public.parties):
        raise ValueError(f"{path}: index/threshold out of range")
    others = set(public.parties) - {public.parties[index - 1]}
    try:
        mac_keys = {j: bytes.fromhex(k) for j, k in raw_macs.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: mac_keys must map party ids to hex keys: {exc}") from None
    if set(mac_keys) != others or any(len(k) != MAC_KEY_BYTES for k in mac_keys.values()):
        missing = sorted(others - set(mac_keys))
        raise ValueError(f"{path}: mac_keys must hold one {MAC_KEY_BYTES}-byte key for each "
                         f"other party (missing: {', '.join(missing) or 'none'})")
    return KeyShare(public, index, secret, mac_keys)


def _prime(bits: int) -> gmpy2.mpz:
    while True:
        cand = gmpy2.mpz(secrets.randbits(bits) | (1 << (bits - 1)) | (1 << (bits - 2)) | 1)
        p = gmpy2.next_prime(cand)
        if p.bit_length() == bits:
            return p


def keygen(parties: Sequence[str], threshold: int, bits: int = 2048) -> tuple[PublicKey, list[KeyShare]]:
    """The trusted dealer: a fresh modulus of ``bits`` bits and one share of
    ``Delta d`` per party, with a MAC key for every pair of parties."""
    parties = tuple(parties)
    if len(set(parties)) != len(parties) or not parties:
        raise ValueError(f"parties must be distinct and non-empty, got {list(parties)}")
    if not 1 <= threshold <= len(parties):
        raise ValueError(f"threshold must be in 1..{len(parties)}, got {threshold}")
    if bits < 64 or bits % 2:
        raise ValueError(f"bits must be an even number >= 64, got {bits}")
    while True:
        p, q = _prime(bits // 2), _prime(bits // 2)
        n = p * q
        lam = gmpy2.lcm(p - 1, q - 1)
        if p != q and n.bit_length() == bits and gmpy2.gcd(lam, n) == 1:
            break
    d = lam * gmpy2.invert(lam, n)  # d = 0 mod lambda, d = 1 mod n
    public = PublicKey(int(n), threshold, parties)
    delta = gmpy2.mpz(public.delta)
    width = int((n * lam).bit_length()) + int(delta.bit_length()) + KAPPA_BITS
    coeffs = [delta * d] + [gmpy2.mpz(secrets.randbits(width)) for _ in range(threshold - 1)]
    macs: dict[tuple[str, str], bytes] = {}
    for x, y in itertools.combinations(parties, 2):
        macs[x, y] = macs[y, x] = secrets.token_bytes(MAC_KEY_BYTES)
    shares = []
    for i, own in enumerate(parties, start=1):
        s = gmpy2.mpz(0)
        for a in reversed(coeffs):  # Horner: f(i) over the integers
            s = s * i + a
        shares.append(KeyShare(public, i, int(s), {j: macs[own, j] for j in parties if j != own}))
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


# ---------------------------------------------------------------------- packing


@dataclass(frozen=True)
class Packer:
    """Fixed-point packing of float vectors into plaintexts < n.

    A value ``v`` (clamped to +-2^(value_bits-1-frac_bits)) is encoded as
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
        """Largest magnitude a value can have before it is clamped."""
        return float(2 ** (self.value_bits - 1 - self.frac_bits))

    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, int]:
        """(offset fixed-point int64 codes, how many values were clamped)."""
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if not np.isfinite(v).all():
            raise ValueError("values must be finite")
        lim = self.bound - 2.0 ** -self.frac_bits
        clamped = int((np.abs(v) > lim).sum())
        codes = np.rint(np.clip(v, -lim, lim) * 2.0 ** self.frac_bits).astype(np.int64)
        return codes + (1 << (self.value_bits - 1)), clamped

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
                expected_round: int, contributors: Sequence[str], ct_digest: str) -> list[int]:
        self.check(ct_round, expected_round, contributors, ct_digest)
        self.released[ct_round] = ct_digest
        return [key.decryption_share(c) for c in ciphertexts]
