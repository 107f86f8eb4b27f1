"""Threshold Paillier (hfl.algorithms.threshold_he): t-of-n decryption of a sum
against the plaintext sum, too few shares, Shoup's Delta factor in the shares,
the signed attestations, the proofs of plaintext knowledge (against a hand-written
verifier and under attack), the release policy, fixed-point packing (no clamping),
the wire form and the dealer's key files."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import stat
from types import SimpleNamespace

import numpy as np
import pytest

from hfl.algorithms import threshold_he as he

PARTIES = ["p0", "p1", "p2", "p3", "p4"]


@pytest.fixture(scope="module")
def keys():
    return he.keygen(PARTIES, threshold=3, bits=512)


def test_any_t_of_n_shares_decrypt_the_sum_and_dead_parties_do_not_block(keys):
    pub, shares = keys
    rng = random.Random(1)
    ms = [rng.randrange(pub.n // 10) for _ in range(4)]
    c = pub.add([pub.encrypt(m) for m in ms])
    assert c != pub.add([pub.encrypt(m) for m in ms])  # randomised encryption
    dshares = {s.index: s.decryption_share(c) for s in shares}
    for alive in itertools.combinations(sorted(dshares), 3):  # n - t = 2 parties dead
        assert pub.combine({i: dshares[i] for i in alive}) == sum(ms) % pub.n
    assert pub.combine(dshares) == sum(ms) % pub.n  # more than t: fine too


def test_fewer_than_t_shares_cannot_decrypt(keys):
    pub, shares = keys
    m = 123456789
    c = pub.encrypt(m)
    two = {s.index: s.decryption_share(c) for s in shares[:2]}
    with pytest.raises(ValueError, match="3 needed"):
        pub.combine(two)
    # Interpolating two shares as if t were 2 does not give the plaintext either.
    pretend = he.PublicKey(pub.n, 2, pub.parties)
    try:
        assert pretend.combine(two) != m
    except ValueError:
        pass  # the usual outcome: the combination is not of the form 1 + n x


def test_a_wrong_share_is_detected_when_combining(keys):
    pub, shares = keys
    c = pub.encrypt(42)
    bad = {s.index: s.decryption_share(c) for s in shares[:3]}
    bad[2] = shares[1].decryption_share(pub.encrypt(43))  # a share of another ciphertext
    with pytest.raises(ValueError, match="do not combine"):
        pub.combine(bad)


def test_release_guard_m_min_once_per_round_and_round_tag(keys):
    pub, shares = keys
    c = pub.encrypt(7)
    guard = he.ReleaseGuard(m_min=3)
    with pytest.raises(he.ShareRefused, match="m_min"):
        guard.release(shares[0], [c], ct_round=4, expected_round=4, contributors=["p0", "p1"],
                      ct_digest="d")
    with pytest.raises(he.ShareRefused, match="round 3, expected 4"):
        guard.release(shares[0], [c], 3, 4, ["p0", "p1", "p2"], "d")
    with pytest.raises(he.ShareRefused, match="repeat"):
        guard.release(shares[0], [c], 4, 4, ["p0", "p1", "p1"], "d")
    out, proof = guard.release(shares[0], [c], 4, 4, ["p0", "p1", "p2"], "d")
    assert out == [shares[0].decryption_share(c)]
    assert he.verify_decryption(pub, he.decryption_context(pub, 4, "p0", "d"), 1, [c], out,
                                proof) is None  # proven for the round, the party and the digest
    with pytest.raises(he.ShareRefused, match="already released"):
        guard.release(shares[0], [pub.encrypt(8)], 4, 4, ["p0", "p1", "p2"], "other")


def test_packing_round_trip_and_packed_sums_do_not_carry():
    packer = he.Packer(plaintext_bits=511, max_summands=5, frac_bits=16)
    assert packer.slot_bits == 43 and packer.slots == 11
    rng = np.random.default_rng(0)
    values = [rng.normal(scale=50, size=37) for _ in range(5)]
    codes = [packer.quantize(v) for v in values]
    for v, c in zip(values, codes, strict=True):
        back = packer.dequantize(packer.unpack(packer.pack(c), 37), 1)
        np.testing.assert_allclose(back, v, atol=2.0 ** -17)
    summed = [sum(col) for col in zip(*(packer.pack(c) for c in codes), strict=True)]
    total = packer.dequantize(packer.unpack(summed, 37), 5)
    np.testing.assert_allclose(total, np.sum(values, axis=0), atol=5 * 2.0 ** -17)
    assert np.array_equal(packer.unpack(summed, 37), np.sum(codes, axis=0))  # exact in codes
    lim = packer.bound - 2.0 ** -16
    edge = packer.quantize(np.array([lim, -lim, 3.0]))
    np.testing.assert_allclose(packer.dequantize(edge, 1), [lim, -lim, 3.0])
    with pytest.raises(ValueError, match=r"2 value\(s\) beyond the fixed-point range.*1e\+09"):
        packer.quantize(np.array([1e9, -1e9, 3.0]))  # refused, never clamped
    # Issue 32: at frac_bits 30 the range is +-512; a count of 600 used to become 512.
    with pytest.raises(ValueError, match="beyond the fixed-point range"):
        he.Packer(2047, 5, frac_bits=30).quantize(np.array([600.0]))


def test_threshold_decryption_of_packed_vectors_equals_the_plaintext_sum(keys):
    pub, shares = keys
    packer = he.Packer(plaintext_bits=pub.bits - 1, max_summands=len(pub.parties))
    rng = np.random.default_rng(3)
    values = [rng.normal(size=50) for _ in range(4)]
    codes = [packer.quantize(v) for v in values]
    cts = [[pub.encrypt(m) for m in packer.pack(c)] for c in codes]
    product = [pub.add(col) for col in zip(*cts, strict=True)]
    alive = shares[1:4]
    plain = [pub.combine({s.index: s.decryption_share(c) for s in alive}) for c in product]
    assert np.array_equal(packer.unpack(plain, 50), np.sum(codes, axis=0))
    np.testing.assert_allclose(packer.dequantize(packer.unpack(plain, 50), 4),
                               np.sum(values, axis=0), atol=4 * 2.0 ** -17)


def test_wire_form_round_trip_and_range_checks(keys):
    pub, _ = keys
    cts = [pub.encrypt(i) for i in range(3)]
    arr = he.to_bytes(cts, pub.ct_bytes)
    assert arr.dtype == np.uint8 and arr.shape == (3, pub.ct_bytes)
    assert he.from_bytes(arr, pub) == cts
    with pytest.raises(ValueError, match="uint8"):
        he.from_bytes(arr[:, 1:], pub)
    with pytest.raises(ValueError, match="out of range"):
        he.from_bytes(np.full((1, pub.ct_bytes), 255, dtype=np.uint8), pub)  # >= n^2
    with pytest.raises(ValueError, match="out of range"):
        he.from_bytes(np.zeros((1, pub.ct_bytes), dtype=np.uint8), pub)
    assert he.digest(arr) != he.digest(he.to_bytes(cts[::-1], pub.ct_bytes))


def test_dealer_command_writes_one_loadable_share_per_peer(tmp_path):
    from hfl.peer.he_keys import main

    weak = ["--bits", "256", "--allow-weak-key"]
    assert main(["--peers", "4", "--threshold", "2", *weak, "--out", str(tmp_path)]) == 0
    public = json.loads((tmp_path / "public.json").read_text())
    assert public["parties"] == ["p0", "p1", "p2", "p3"] and public["threshold"] == 2
    loaded = [he.load_key_share(tmp_path / f"p{i}.json") for i in range(4)]
    assert [k.index for k in loaded] == [1, 2, 3, 4]
    assert "share" not in public and (tmp_path / "p0.json").stat().st_mode & 0o077 == 0
    pub = loaded[0].public
    c = pub.add([pub.encrypt(5), pub.encrypt(6)])
    assert pub.combine({k.index: k.decryption_share(c) for k in loaded[2:]}) == 11
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a key share file"):
        he.load_key_share(tmp_path / "bad.json")
    assert main(["--peers", "3", "--threshold", "4", *weak, "--out", str(tmp_path)]) == 2
    # a modulus that can be factored, or one share to decrypt: refused (an attack review:
    # with threshold 1 the aggregator decrypted one peer's ciphertext alone)
    assert main(["--peers", "3", "--threshold", "2", "--bits", "512", "--out", str(tmp_path)]) == 2
    assert main(["--peers", "3", "--threshold", "1", *weak, "--out", str(tmp_path)]) == 2


def test_default_keys_are_2048_bits():
    pub, shares = he.keygen(["a", "b", "c"], 2)
    assert pub.bits == 2048 and pub.ct_bytes == 512 and len(shares) == 3
    assert he.Packer(pub.bits - 1, 3).slots == 2047 // 42


# ---------------------------------------------------------------------- Delta factor


def _keygen_seeing_primes(monkeypatch, primes=None, seed=None, parties=PARTIES, threshold=3):
    """keygen at 256 bits, returning (public, shares, d, (p, q)); ``primes`` replays
    the dealer's primes and ``seed`` fixes its other randomness (the coefficients)."""
    seen = []
    original = he._prime
    replay = iter(primes) if primes is not None else None

    def spy(bits):
        p = next(replay) if replay is not None else original(bits)
        seen.append(p)
        return p

    monkeypatch.setattr(he, "_prime", spy)
    if seed is not None:
        rng = random.Random(seed)
        monkeypatch.setattr(he, "secrets", SimpleNamespace(randbits=rng.getrandbits,
                                                           randbelow=rng.randrange,
                                                           token_bytes=rng.randbytes))
    pub, shares = he.keygen(parties, threshold, 256)
    monkeypatch.undo()
    p, q = (int(x) for x in seen[-2:])
    assert p * q == pub.n
    lam = math.lcm(p - 1, q - 1)
    return pub, shares, lam * pow(lam, -1, pub.n), (p, q)


def _mu(chosen, i, delta):
    num, den = delta, 1
    for j in chosen:
        if j != i:
            num, den = num * j, den * (j - i)
    assert num % den == 0
    return num // den


def test_share_i_no_longer_reveals_d_mod_i_and_t_shares_interpolate_delta_squared_d(monkeypatch):
    delta = math.factorial(len(PARTIES))
    for k in range(50):  # a d that sharing d itself would leak: d != 0 mod some i <= n
        pub, shares, d, _ = _keygen_seeing_primes(monkeypatch, seed=2000 + k)  # seeded: repeatable
        if any(d % i for i in range(2, len(PARTIES) + 1)):
            break
    else:
        pytest.fail("no d with a nonzero residue mod 2..n in 50 keys")
    for s in shares:  # without Delta, s_i = f(i) = d (mod i) for every i
        assert s.secret % s.index == 0 == delta * d % s.index
    assert any(s.secret % s.index != d % s.index for s in shares)
    for chosen in itertools.combinations(range(1, len(PARTIES) + 1), pub.threshold):
        total = sum(_mu(chosen, i, delta) * shares[i - 1].secret for i in chosen)
        assert total == delta * delta * d  # Delta f(0); without Delta, Delta d


def test_shares_mod_every_prime_up_to_n_do_not_depend_on_d(monkeypatch):
    """Two keys with different d, dealt with the same coefficient randomness: every
    share agrees mod Delta (so mod every prime p <= n), though d does not."""
    delta = math.factorial(len(PARTIES))

    def width(primes):  # the coefficients are this many bits plus Delta's and kappa
        p, q = primes
        return (math.lcm(p - 1, q - 1) * p * q).bit_length()

    # Seeded dealers (primes included), so the search is the same every run.
    _, _, d_first, first = _keygen_seeing_primes(monkeypatch, seed=1000)
    for k in range(1, 200):
        _, _, d_second, second = _keygen_seeing_primes(monkeypatch, seed=1000 + k)
        if width(first) == width(second) and d_first % delta != d_second % delta:
            break
    else:
        pytest.fail("no second key with the same coefficient width in 200 seeded keys")
    _, shares_a, d_a, _ = _keygen_seeing_primes(monkeypatch, first, seed=7)
    _, shares_b, d_b, _ = _keygen_seeing_primes(monkeypatch, second, seed=7)
    assert d_a % delta != d_b % delta
    for sa, sb in zip(shares_a, shares_b, strict=True):
        assert sa.secret != sb.secret
        assert sa.secret % delta == sb.secret % delta  # without Delta they differ by d_a - d_b
        assert sa.secret - sb.secret == delta * (d_a - d_b)


# ---------------------------------------------------------------------- attestation


DIGEST = hashlib.sha256(b"ciphertext").hexdigest()


def test_every_party_signs_once_and_every_other_party_verifies_the_same_signature(keys):
    pub, shares = keys
    assert len(set(pub.verify_keys)) == len(PARTIES) and all(len(k) == 32 for k in pub.verify_keys)
    assert "sign_key" not in repr(shares[0]) and shares[0].sign_key.hex() not in repr(shares[0])
    for sender in shares:
        sig = sender.attest(7, DIGEST)
        assert isinstance(sig, str) and len(sig) == 128
        for receiver in shares:  # the aggregator's verdict is everyone's verdict
            assert receiver.verify_attestation(7, sender.party, DIGEST, sig) is None
            assert "does not verify" in receiver.verify_attestation(8, sender.party, DIGEST, sig)
            assert "does not verify" in receiver.verify_attestation(
                7, sender.party, hashlib.sha256(b"other").hexdigest(), sig)
            third = next(p for p in PARTIES if p != sender.party)
            assert receiver.verify_attestation(7, third, DIGEST, sig) == \
                f"attestation of {third!r} does not verify"



def test_an_attestation_of_one_run_does_not_verify_in_another_with_the_same_key(keys):
    # One dealer's keys for two runs: a member's ciphertext attested in the first run
    # verified in the second, so an aggregator could put it into that run's product.
    # A share bound to its run (cohort.run) attests for that run only.
    import dataclasses

    _, shares = keys
    run_a = [dataclasses.replace(s, run="hfl#1") for s in shares]
    run_b = [dataclasses.replace(s, run="hfl#2") for s in shares]
    sig = run_a[0].attest(7, DIGEST)
    assert run_a[1].verify_attestation(7, run_a[0].party, DIGEST, sig) is None
    assert "does not verify" in run_b[1].verify_attestation(7, run_a[0].party, DIGEST, sig)
    assert "does not verify" in shares[1].verify_attestation(7, run_a[0].party, DIGEST, sig)


def test_the_attested_message_is_unambiguous():
    msgs = {he.attestation_message(1, "a|b", "c"), he.attestation_message(1, "a", "b|c"),
            he.attestation_message(12, "3", "c"), he.attestation_message(1, "23", "c"),
            he.attestation_message(1, "2:3", "c"), he.attestation_message(-1, "a", "b"),
            he.attestation_message(1, "a", "c", "k1"), he.attestation_message(1, "a", "c", "k2")}
    assert len(msgs) == 8
    with pytest.raises(ValueError):
        he.attestation_message(True, "a", "b")


def test_an_aggregator_cannot_forge_or_relabel_an_attestation(keys):
    _, shares = keys
    agg = shares[2]
    relabelled = agg.attest(7, DIGEST)  # the aggregator's own signature, claimed to be p0's
    assert all("does not verify" in s.verify_attestation(7, "p0", DIGEST, relabelled) for s in shares)
    flipped = bytearray(bytes.fromhex(shares[0].attest(7, DIGEST)))
    flipped[5] ^= 1
    assert shares[1].verify_attestation(7, "p0", DIGEST, flipped.hex()) == "attestation of 'p0' does not verify"


def test_a_ghost_party_or_another_cohorts_key_is_refused(keys):
    _, shares = keys
    _, other = he.keygen(PARTIES + ["ghost"], 3, bits=256)
    assert shares[1].verify_attestation(7, "ghost", DIGEST, other[-1].attest(7, DIGEST)) == \
        "'ghost' holds no key share"
    # other[0] is "p0" of another key: its signing key is not this key's p0
    assert "does not verify" in shares[1].verify_attestation(7, "p0", DIGEST, other[0].attest(7, DIGEST))


@pytest.mark.parametrize("sig", [None, [], "p1", 5, {"p1": "ab"}, "zz" * 64, "", "\u00e9" * 128,
                                 "\ud800" * 128, "ab" * 1000, "ab" * 63, ["ab" * 64], b"ab" * 64])
def test_hostile_signatures_give_a_reason_and_never_raise(keys, sig):
    _, shares = keys
    reason = shares[1].verify_attestation(7, "p0", DIGEST, sig)
    assert isinstance(reason, str) and reason


def test_hostile_round_sender_and_digest_give_a_reason_and_never_raise(keys):
    _, shares = keys
    good = shares[0].attest(7, DIGEST)
    assert shares[1].verify_attestation(7, "p0", DIGEST, good) is None
    assert shares[1].verify_attestation(7, "p0", DIGEST, good.upper()) is None  # hex, any case
    for rnd, sender, dg in [("7", "p0", DIGEST), (True, "p0", DIGEST), (None, "p0", DIGEST),
                            (2**70, "p0", DIGEST), (10**5000, "p0", DIGEST), (7.0, "p0", DIGEST),
                            (7, None, DIGEST), (7, ["p0"], DIGEST), (7, {}, DIGEST),
                            (7, "p1", DIGEST), (7, "p0", None), (7, "p0", DIGEST.encode())]:
        reason = shares[1].verify_attestation(rnd, sender, dg, good)
        assert isinstance(reason, str) and reason, (rnd, sender, dg)


# ---------------------------------------------------------------------- proofs of plaintext knowledge


def _encrypt_with_proof(pub, plaintexts, round, sender):
    enc = [pub.encrypt_with_randomness(m) for m in plaintexts]
    cts = [c for c, _ in enc]
    return cts, he.prove_plaintexts(pub, he.proof_context(pub, round, sender), plaintexts,
                                    [r for _, r in enc], cts)


def _verify_by_hand(pub, context, cts, proof):
    """An independent verifier of the documented format with Python's own pow:
    a_j = (1 + n)^z_j w_j^n c_j^-e mod n^2, and e must be the hash of them."""
    n, n2, nb, w_ct = pub.n, pub.n * pub.n, (pub.n.bit_length() + 7) // 8, pub.ct_bytes
    raw = bytes(proof)
    e = int.from_bytes(raw[:16], "big")
    h = hashlib.sha256(str(len(context)).encode() + b"|" + context)
    for j, c in enumerate(cts):
        z = int.from_bytes(raw[16 + 2 * nb * j:16 + 2 * nb * j + nb], "big")
        w = int.from_bytes(raw[16 + 2 * nb * j + nb:16 + 2 * nb * (j + 1)], "big")
        a = pow(1 + n, z, n2) * pow(w, n, n2) * pow(pow(c, -1, n2), e, n2) % n2
        h.update(c.to_bytes(w_ct, "big") + a.to_bytes(w_ct, "big"))
    return int.from_bytes(h.digest()[:16], "big") == e


def test_a_proof_of_plaintext_knowledge_verifies_here_and_by_hand_and_special_soundness_extracts(keys):
    pub, _ = keys
    rng = random.Random(5)
    ms = [rng.randrange(pub.n) for _ in range(3)]
    cts, proof = _encrypt_with_proof(pub, ms, 4, "p1")
    ctx = he.proof_context(pub, 4, "p1")
    assert proof.dtype == np.uint8 and proof.shape == (he.proof_size(pub, 3),) == (16 + 3 * 2 * 64,)
    assert he.verify_plaintexts(pub, ctx, cts, proof) is None
    assert _verify_by_hand(pub, ctx, cts, proof)
    # The relation the verifier checks is the right one: two answers to one commitment
    # under different challenges give the plaintext (special soundness), by hand.
    n, n2 = pub.n, pub.n * pub.n
    m, (c, r) = ms[0], pub.encrypt_with_randomness(ms[0])
    x, s = rng.randrange(n), rng.randrange(1, n)
    a = pow(1 + n, x, n2) * pow(s, n, n2) % n2
    answers = []
    for e in (rng.getrandbits(128), rng.getrandbits(128)):
        z, w = (x + e * m) % n, s * pow(r, e, n) % n
        assert pow(1 + n, z, n2) * pow(w, n, n2) % n2 == a * pow(c, e, n2) % n2
        answers.append((e, z))
    (e1, z1), (e2, z2) = answers
    assert (z1 - z2) * pow(e1 - e2, -1, n) % n == m


def test_a_proof_verifies_for_no_other_sender_round_key_or_ciphertext(keys):
    pub, _ = keys
    cts, proof = _encrypt_with_proof(pub, [11, 12], 4, "p1")
    other_pub, _ = he.keygen(PARTIES, 3, bits=512)
    for ctx in [he.proof_context(pub, 5, "p1"), he.proof_context(pub, 3, "p1"),
                he.proof_context(pub, 4, "p2"), he.proof_context(other_pub, 4, "p1")]:
        assert "does not verify" in he.verify_plaintexts(pub, ctx, cts, proof)
    ctx = he.proof_context(pub, 4, "p1")
    assert "does not verify" in he.verify_plaintexts(pub, ctx, cts[::-1], proof)
    rerandomised = [cts[0] * pow(pub.encrypt(0), 1, pub.n2) % pub.n2, cts[1]]
    assert "does not verify" in he.verify_plaintexts(pub, ctx, rerandomised, proof)


def test_a_proof_over_no_ciphertext_proves_nothing(keys):
    # Its proof would be the context's hash alone, which anyone computes (an attack
    # review; harmless so far: the shape checks refuse an empty factor first).
    pub, _ = keys
    ctx = he.proof_context(pub, 4, "p1")
    anyones = np.frombuffer(he._challenge(pub, ctx, [], []).to_bytes(he.CHALLENGE_BYTES, "big"),
                            np.uint8)
    assert "covers no ciphertext" in he.verify_plaintexts(pub, ctx, [], anyones)


def test_the_cancelling_factor_of_issue_32_cannot_be_proven(keys):
    """The aggregator's factor ct(p2)^-1 * Enc(x): it knows x and its randomness, not
    p2's plaintext. Its best tries: prove Enc(x) and hand that proof off for the
    cancelling factor; reuse p2's proof; or answer at random. None verifies."""
    pub, _ = keys
    ct_p2, proof_p2 = _encrypt_with_proof(pub, [123456], 4, "p2")
    x = 99
    enc_x, r_x = pub.encrypt_with_randomness(x)
    cancelling = pow(ct_p2[0], -1, pub.n2) * enc_x % pub.n2
    ctx = he.proof_context(pub, 4, "p1")
    of_enc_x = he.prove_plaintexts(pub, ctx, [x], [r_x], [enc_x])
    assert he.verify_plaintexts(pub, ctx, [enc_x], of_enc_x) is None
    assert "does not verify" in he.verify_plaintexts(pub, ctx, [cancelling], of_enc_x)
    assert "does not verify" in he.verify_plaintexts(pub, ctx, [cancelling], proof_p2)
    # claiming plaintext x - m' with a guessed m' and the same randomness: wrong relation
    guessed = he.prove_plaintexts(pub, ctx, [(x - 1) % pub.n], [r_x], [cancelling])
    assert "does not verify" in he.verify_plaintexts(pub, ctx, [cancelling], guessed)
    rng = np.random.default_rng(0)
    junk = rng.integers(0, 256, he.proof_size(pub, 1), dtype=np.uint8)
    assert he.verify_plaintexts(pub, ctx, [cancelling], junk) is not None


# ---------------------------------------------------------------------- proofs of correct decryption


def _product(pub, ms):
    return [pub.add([pub.encrypt(m), pub.encrypt(0)]) for m in ms]


def _verify_decryption_by_hand(pub, context, index, cts, ys, proof) -> bool:
    """The Chaum-Pedersen check written out from the docs with Python ints: fold the k
    statements with rho_j from the hash, then a = C^z Y^-e, b = v^z v_i^-e, and the
    challenge must hash back to e."""
    n2, width, raw = pub.n2, pub.ct_bytes, proof.tobytes()
    e, z = int.from_bytes(raw[:16], "big"), int.from_bytes(raw[16:], "big")
    h = hashlib.sha256(b"rho|%d|" % len(context) + context + b"|%d|" % index)
    h.update(pub.share_keys[index - 1].to_bytes(width, "big"))
    for c, y in zip(cts, ys, strict=True):
        h.update(c.to_bytes(width, "big") + y.to_bytes(width, "big"))
    seed, big_c, big_y = h.digest(), 1, 1
    for j, (c, y) in enumerate(zip(cts, ys, strict=True)):
        rho = 2 * int.from_bytes(hashlib.sha256(seed + j.to_bytes(8, "big")).digest()[:16], "big")
        big_c, big_y = big_c * pow(c, rho, n2) % n2, big_y * pow(y, rho, n2) % n2
    a = pow(big_c, z, n2) * pow(pow(big_y, -1, n2), e, n2) % n2
    b = pow(pub.v, z, n2) * pow(pow(pub.share_keys[index - 1], -1, n2), e, n2) % n2
    h = hashlib.sha256(b"%d|" % len(context) + context + b"|%d|" % index)
    for x in (pub.v, pub.share_keys[index - 1], big_c, big_y, a, b):
        h.update(x.to_bytes(width, "big"))
    return int.from_bytes(h.digest()[:16], "big") == e


def test_the_dealer_uses_safe_primes_and_publishes_each_partys_share_verification_key(monkeypatch):
    pub, shares, _, (p, q) = _keygen_seeing_primes(monkeypatch)
    from sympy import isprime

    assert isprime(p) and isprime(q) and isprime((p - 1) // 2) and isprime((q - 1) // 2)
    assert all(pub.share_keys[s.index - 1] == pow(pub.v, s.secret, pub.n2) for s in shares)
    assert pow(pub.v, (p - 1) * (q - 1) // 4 * pub.n, pub.n2) == 1  # a square: in the group
    with pytest.raises(ValueError, match=r"threshold must be in 2\.\.5.*any one key holder"):
        he.keygen(PARTIES, 1, 256)


def test_a_proof_of_correct_decryption_verifies_here_and_by_hand(keys):
    pub, shares = keys
    cts = _product(pub, [5, 6, 7])
    ctx = he.decryption_context(pub, 4, "p1", "digest")
    ys, proof = shares[1].decryption_shares(cts, ctx)
    assert ys == [pow(c, shares[1].secret, pub.n2) for c in cts]  # the share itself
    assert proof.shape == (he.decryption_proof_size(pub),)  # one proof for all k shares
    assert he.verify_decryption(pub, ctx, 2, cts, ys, proof) is None
    assert _verify_decryption_by_hand(pub, ctx, 2, cts, ys, proof)


def test_a_shifted_or_foreign_decryption_share_is_refused(keys):
    """The review's attack: a member multiplies its share by (1 + n)^x, which still
    combines (acc = 1 mod n) but shifts the decrypted sum by x times its Lagrange
    coefficient. Without proofs every peer absorbed the shifted prototypes."""
    pub, shares = keys
    cts = _product(pub, [100, 200])
    ctx = he.decryption_context(pub, 4, "p1", "digest")
    ys, proof = shares[1].decryption_shares(cts, ctx)
    n2 = pub.n2
    shifted = [ys[0] * pow(1 + pub.n, 12345, n2) % n2, ys[1]]
    others = {s.index: s.decryption_share(cts[0]) for s in (shares[0], shares[2])}
    assert pub.combine({**others, 2: shifted[0]}) != 100  # it decrypts, to a lie
    assert "does not verify" in he.verify_decryption(pub, ctx, 2, cts, shifted, proof)
    # nor can the attacker, who knows its secret, prove the shifted share: the prover's
    # steps run on the shifted shares give a proof that does not verify
    base, folded = he._folded(pub, ctx, 2, cts, shifted)
    r = 12345678901234567890
    a, b = pow(int(base), r, n2), pow(pub.v, r, n2)
    e = he._decryption_challenge(pub, ctx, 2, base, folded, a, b)
    z = r + e * shares[1].secret
    forged = np.frombuffer(e.to_bytes(16, "big") + z.to_bytes(he.decryption_proof_size(pub) - 16,
                                                              "big"), dtype=np.uint8)
    assert "does not verify" in he.verify_decryption(pub, ctx, 2, cts, shifted, forged)
    # another party's shares, another round, digest or party index, other ciphertexts
    for c, i in [(he.decryption_context(pub, 5, "p1", "digest"), 2),
                 (he.decryption_context(pub, 4, "p1", "other"), 2),
                 (he.decryption_context(pub, 4, "p2", "digest"), 2), (ctx, 3)]:
        assert "does not verify" in he.verify_decryption(pub, c, i, cts, ys, proof)
    assert "does not verify" in he.verify_decryption(pub, ctx, 2, _product(pub, [1, 2]), ys, proof)
    # A factor of order 2 passes the proof (it squares away) and changes nothing.
    assert pub.combine({**others, 2: (-ys[0]) % n2}) == 100 == pub.combine({**others, 2: ys[0]})


@pytest.mark.parametrize("proof", [None, 5, np.zeros(3, np.uint8), np.zeros(211, np.int64),
                                   "x", np.full(211, 255, np.uint8), np.zeros(211, np.uint8)])
def test_hostile_decryption_proofs_and_indices_give_a_reason_and_never_raise(keys, proof):
    pub, shares = keys
    cts = _product(pub, [1])
    ctx = he.decryption_context(pub, 4, "p1", "d")
    ys, good = shares[1].decryption_shares(cts, ctx)
    size = he.decryption_proof_size(pub)
    if isinstance(proof, np.ndarray) and proof.shape == (211,) and size != 211:
        proof = np.resize(proof, size)
    reason = he.verify_decryption(pub, ctx, 2, cts, ys, proof)
    assert isinstance(reason, str) and reason
    for index in (0, 6, True, "2", None):
        assert isinstance(he.verify_decryption(pub, ctx, index, cts, ys, good), str)
    for bad in ([0], [pub.n2], [pub.n]):  # out of range, or sharing a factor with n
        assert isinstance(he.verify_decryption(pub, ctx, 2, cts, bad, good), str)


@pytest.mark.parametrize("proof", [None, 5, "ab", np.zeros(3, np.uint8), np.zeros((2, 152), np.uint8),
                                   np.zeros(144, np.int64), np.zeros(144, np.uint8),
                                   np.full(144, 255, np.uint8), [0] * 144])
def test_hostile_proofs_give_a_reason_and_never_raise(keys, proof):
    pub, _ = keys
    cts, _ = _encrypt_with_proof(pub, [1], 4, "p1")
    reason = he.verify_plaintexts(pub, he.proof_context(pub, 4, "p1"), cts, proof)
    assert isinstance(reason, str) and reason


def test_a_ciphertext_sharing_a_factor_with_n_is_refused(keys):
    pub, _ = keys
    cts, proof = _encrypt_with_proof(pub, [1], 4, "p1")
    reason = he.verify_plaintexts(pub, he.proof_context(pub, 4, "p1"), [pub.n], proof)
    assert "out of range" in reason


# ---------------------------------------------------------------------- key files


def test_a_saved_key_share_keeps_its_signing_key_and_is_owner_only(keys, tmp_path):
    _, shares = keys
    for s in shares:
        path = tmp_path / f"{s.party}.json"
        s.save(path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        loaded = he.load_key_share(path)
        assert loaded == s and loaded.sign_key == s.sign_key
        assert loaded.public.fingerprint == s.public.fingerprint
    p0 = he.load_key_share(tmp_path / "p0.json")
    p4 = he.load_key_share(tmp_path / "p4.json")
    assert p4.verify_attestation(3, "p0", DIGEST, p0.attest(3, DIGEST)) is None
    assert set(json.loads((tmp_path / "p0.json").read_text())["verify_keys"]) == set(PARTIES)


def test_old_and_incomplete_key_files_are_refused(keys, tmp_path):
    _, shares = keys
    path = tmp_path / "p0.json"
    shares[0].save(path)
    good = json.loads(path.read_text())

    def write(data):
        path.write_text(json.dumps(data))

    for old in ("threshold-paillier-v1", "threshold-paillier-v2"):
        write({k: v for k, v in good.items() if k not in ("sign_key", "verify_keys")}
              | {"scheme": old, "mac_keys": {}})
        with pytest.raises(ValueError, match=r"older dealer.*no signing keys.*python -m hfl\.peer\.he_keys"):
            he.load_key_share(path)
    write({k: v for k, v in good.items() if k not in ("v", "share_keys")}
          | {"scheme": "threshold-paillier-v3"})
    with pytest.raises(ValueError, match=r"older dealer.*no share verification keys.*he_keys"):
        he.load_key_share(path)
    for bad in [{k: v for k, v in good.items() if k != "share_keys"},
                {**good, "share_keys": {**good["share_keys"], "p0": good["share_keys"]["p1"]}},
                {**good, "v": "0x0"}, {**good, "share_keys": ["x"]},
                # degenerate: v = 1 made any share "verify"; a key sharing a factor with n
                # made the verifier raise (a crypto review)
                {**good, "v": "0x1", "share_keys": {p: "0x1" for p in good["share_keys"]}},
                {**good, "share_keys": {**good["share_keys"], "p1": good["n"]}},
                {**good, "threshold": 1}]:  # (one key holder would decrypt one release)
        write(bad)
        with pytest.raises(ValueError, match="p0.json.*(share_keys|not a key share file|threshold)"):
            he.load_key_share(path)
    write({k: v for k, v in good.items() if k != "sign_key"})
    with pytest.raises(ValueError, match="p0.json.*not a key share file.*sign_key"):
        he.load_key_share(path)
    keys_ = good["verify_keys"]
    for bad in [{k: v for k, v in keys_.items() if k != "p3"}, {**keys_, "p3": "00" * 16},
                {**keys_, "p3": "zz" * 32}, {**keys_, "p3": 5}, {**keys_, "ghost": "00" * 32},
                ["p1"], "x"]:
        write({**good, "verify_keys": bad})
        with pytest.raises(ValueError, match="p0.json.*verify_keys"):
            he.load_key_share(path)
    write({**good, "verify_keys": {**keys_, "p0": keys_["p1"]}})  # not the sign_key's
    with pytest.raises(ValueError, match="sign_key does not match"):
        he.load_key_share(path)
    write({**good, "sign_key": "00" * 31})
    with pytest.raises(ValueError, match="p0.json.*sign_key"):
        he.load_key_share(path)
    write([1, 2])
    with pytest.raises(ValueError, match="not a key share file"):
        he.load_key_share(path)
    write(good)
    assert he.load_key_share(path) == shares[0]


def test_dealer_output_directory_is_0700_and_key_files_0600(tmp_path):
    from hfl.peer.he_keys import main

    old_umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh" / "keys"
        assert main(["--peers", "3", "--threshold", "2", "--bits", "256", "--allow-weak-key",
                     "--out", str(fresh)]) == 0
        existing = tmp_path / "existing"
        existing.mkdir(mode=0o755)
        (existing / "p0.json").write_text("{}")
        os.chmod(existing / "p0.json", 0o644)
        assert main(["--parties", "p0", "p1", "--threshold", "2", "--bits", "256", "--allow-weak-key",
                     "--out", str(existing)]) == 0
    finally:
        os.umask(old_umask)
    for out, ids in [(fresh, ["p0", "p1", "p2"]), (existing, ["p0", "p1"])]:
        assert stat.S_IMODE(out.stat().st_mode) == 0o700
        for pid in ids:
            assert stat.S_IMODE((out / f"{pid}.json").stat().st_mode) == 0o600
        public = json.loads((out / "public.json").read_text())
        assert "sign_key" not in public and set(public["verify_keys"]) == set(ids)
    a, b = (he.load_key_share(fresh / f"{pid}.json") for pid in ("p0", "p2"))
    assert b.verify_attestation(1, "p0", DIGEST, a.attest(1, DIGEST)) is None
