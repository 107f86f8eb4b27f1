"""A malicious member against the protocol (issue 35), through the real runtime: each
attack of tests/test_trust.py played on a live in-process cohort (4 peers, FedAvg on
digits, the in-memory transport, real nodes), under three settings side by side:

- default: ``cohort.aggregate_at: auto`` (every peer aggregates, up to 16 peers),
  ``max_weight_share: equal``, signing keys (signed contributions and acks);
- aggregator, signed: ``aggregate_at: aggregator`` with signing keys (certified commits);
- aggregator, unsigned: ``aggregate_at: aggregator`` without signing keys and with
  ``max_weight_share: null`` (a cohort that trusts its members: commits are the
  aggregator's word, claimed counts weigh).

    python bench/protocol_attacks.py [--quick] [--rounds 5]

Printed per attack and setting: the honest peers' mean final ``global_acc`` and the
rounds lost (from the attack's round on: a round in which an honest peer took no
result or ended below 0.3, i.e. took a poisoned model). Not here: the flood (it needs
one event loop per peer; tests/test_flood.py runs it over ZeroMQ).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import _common as c

sys.path.insert(0, str(c.ROOT))

ATTACK_ROUND = 2


def keys_for(ids):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    keys = {p: Ed25519PrivateKey.generate() for p in ids}
    return keys, {p: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for p, k in keys.items()}


def zeros_of(node):
    import numpy as np

    return {k: np.zeros_like(v.detach().cpu().numpy()) for k, v in node.alg.model.state_dict().items()}


# Each attack: (prepare(nodes), conduct(hub, nodes, watch) coroutine or None). p3 is the
# attacker, except where the round's elected aggregator (p2 in round 2) is.

def forged_result_and_claim(accepted_epoch, claim_epoch, names_forgery):
    async def conduct(hub, nodes, watch, gate):
        from hfl.peer.core import payload_digest
        from hfl.peer.transport import InMemoryTransport
        from hfl.protocol import AggregateResult, Knowledge, encode
        from tests.test_cohort import until

        member = InMemoryTransport("p3", "mem://p3-second-socket", hub)
        await member.start()
        await watch.all_finished(ATTACK_ROUND - 1)
        forged = AggregateResult(sender="p3", incarnation=0, round=ATTACK_ROUND, epoch=1, kind="weights",
                                 contributors=[nd.id for nd in nodes], meta={"round": ATTACK_ROUND},
                                 tensors=zeros_of(nodes[0]))
        state = {k: v.detach().cpu().numpy().copy() for k, v in nodes[3].alg.model.state_dict().items()}
        claim = Knowledge(sender="p3", incarnation=0, round=ATTACK_ROUND, kind="weights", epoch=claim_epoch,
                          accepted_epoch=accepted_epoch,
                          accepted_digest=payload_digest(forged) if names_forgery else "0" * 64,
                          tensors=state)
        if nodes[3].core.signer is not None:
            claim = dataclasses.replace(claim, sig=nodes[3].core.sign(
                "knowledge", ATTACK_ROUND, claim_epoch, payload_digest(claim)))
        p2 = nodes[2]
        for msg in (forged, claim):
            await member.send(p2.transport.address, encode(msg), 1.0)
        await until(lambda: "p3" in p2.buffer.received(ATTACK_ROUND) or p2.dropped.get("lying_claim"),
                    "p2 holding (or refusing) p3's claim")
        gate.release(ATTACK_ROUND)
        await member.close()

    return None, conduct


def equivocating_aggregator():
    async def conduct(hub, nodes, watch, gate):
        from hfl.peer.core import payload_digest
        from hfl.peer.transport import InMemoryTransport
        from hfl.protocol import AggregateResult, Commit, encode

        member = InMemoryTransport("p2", "mem://p2-second-socket", hub)
        await member.start()
        await watch.all_finished(ATTACK_ROUND - 1)
        p0 = nodes[0]
        forged = AggregateResult(sender="p2", incarnation=0, round=ATTACK_ROUND, epoch=0, kind="weights",
                                 contributors=[nd.id for nd in nodes], meta={"round": ATTACK_ROUND},
                                 tensors=zeros_of(p0))
        digest = payload_digest(forged)
        await member.send(p0.transport.address, encode(forged), 1.0)
        gate.release(ATTACK_ROUND)
        for _ in range(500):  # until p0 accepted it (or the cohort has no aggregator)
            if p0.core.marker(ATTACK_ROUND) == (0, digest) or p0.everywhere:
                break
            await asyncio.sleep(0.01)
        cert = {}
        if nodes[2].core.signer is not None:
            cert = {"p2": nodes[2].core.sign_ack(ATTACK_ROUND, 0, digest),
                    "p0": p0.core.sign_ack(ATTACK_ROUND, 0, digest)}  # all p2 can hold
        await member.send(p0.transport.address, encode(Commit(
            sender="p2", incarnation=0, round=ATTACK_ROUND, epoch=0, digest=digest, certificate=cert)), 1.0)
        await member.close()

    return None, conduct


def lying_aggregator():
    def prepare(nodes):
        aggregate = nodes[2].alg.aggregate

        def lie(round, contributions):
            result = aggregate(round, contributions)
            if result is not None and nodes[2].everywhere is False:
                result.tensors.update({k: v * 0 for k, v in result.tensors.items()})
            return result

        nodes[2].alg.aggregate = lie

    return prepare, None


def equivocating_contributions():
    def prepare(nodes):
        from hfl.peer.core import payload_digest
        from hfl.protocol import Knowledge

        liar = nodes[3]
        broadcast = liar._broadcast

        async def equivocate(peer_ids, msg, timeout_s=None):
            if isinstance(msg, Knowledge) and msg.round >= ATTACK_ROUND and "p0" in peer_ids:
                bad = dataclasses.replace(msg, tensors={k: v * 0 for k, v in msg.tensors.items()},
                                          meta={**msg.meta, "num_samples": 10 ** 12})
                if liar.core.signer is not None:
                    bad = dataclasses.replace(bad, sig=liar.core.sign(
                        "knowledge", msg.round, msg.epoch, payload_digest(bad)))
                await broadcast(["p0"], bad, timeout_s)
                peer_ids = [p for p in peer_ids if p != "p0"]
            return await broadcast(peer_ids, msg, timeout_s)

        liar._broadcast = equivocate

    return prepare, None


def inflated_count():
    def prepare(nodes):
        share = nodes[3].alg.share

        def inflated(round):
            payload = share(round)
            if round >= ATTACK_ROUND:
                payload.tensors.update({k: v * 0 for k, v in payload.tensors.items()})
                payload.meta["num_samples"] = 10 ** 12
            return payload

        nodes[3].alg.share = inflated

    return prepare, None


ATTACKS = {
    "none": (None, None),
    "forged result + 'accepted' claim (item 1)": forged_result_and_claim(1, 1, True),
    "'accepted' a result never published (item 2)": forged_result_and_claim(0, 0, False),
    "aggregator commits a result shown to one peer (item 3)": equivocating_aggregator(),
    "contributions differ per peer, zeros + 10^12 (item 5)": equivocating_contributions(),
    "lying elected aggregator (item 6)": lying_aggregator(),
    "claimed num_samples 10^12 (item 6)": inflated_count(),
}
SETTINGS = {
    "default": ({}, True, None),
    "aggregator, signed": ({"aggregate_at": "aggregator"}, True, None),
    "aggregator, unsigned": ({"aggregate_at": "aggregator"}, False, {"max_weight_share": None}),
}
HONEST = ("p0", "p1")  # p2 is the attacker as round 2's aggregator, p3 otherwise


def run_one(attack: str, setting: str, rounds: int) -> dict:
    from tests.test_cohort import by_round, cohort_cfgs, gated_cohort

    prepare, conduct = ATTACKS[attack]
    cohort, signed, alg = SETTINGS[setting]
    ids = [f"p{i}" for i in range(4)]
    keys, verify = keys_for(ids)
    with tempfile.TemporaryDirectory(dir=c.OUT_DIR) as tmp:
        # (a run id, as hfl-launch makes one per run: signatures bind to it, and a
        # committed result is relayed only with one)
        cfgs = cohort_cfgs(Path(tmp), 4, rounds=rounds,
                           cohort={"aggregate_at": "auto", "run": 1, **cohort})

        watch, hub, nodes, gate = gated_cohort(
            cfgs, [ATTACK_ROUND], {p: (keys[p].sign, verify) for p in ids} if signed else None)
        if alg:
            for nd in nodes:
                nd.alg.cfg = dataclasses.replace(nd.alg.cfg, **alg)
        if prepare:
            prepare(nodes)

        async def main():
            async def drive():
                if conduct:
                    await conduct(hub, nodes, watch, gate)
                else:
                    gate.release(ATTACK_ROUND)

            driver = asyncio.create_task(drive())
            try:
                return await asyncio.gather(*(nd.run() for nd in nodes))
            finally:
                gate.release_all()
                await driver

        results = dict(zip(ids, asyncio.run(main()), strict=True))
    recs = by_round(results)
    lost = [r for r in range(ATTACK_ROUND, rounds + 1)
            if any(recs[r][p]["learned_from"] == 0 or recs[r][p]["global_acc"] < 0.3 for p in HONEST)]
    final = statistics.mean(recs[rounds][p]["global_acc"] for p in HONEST)
    return {"attack": attack, "setting": setting, "final": final, "lost": lost}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the attacks make the peers say a lot
    attacks = list(ATTACKS) if not args.quick else list(ATTACKS)[:3]
    runs = [run_one(a, s, args.rounds) for a in attacks for s in SETTINGS]
    cell = {(r["attack"], r["setting"]): r for r in runs}
    rows = [[a, *(f"{cell[a, s]['final']:.3f} / {len(cell[a, s]['lost'])}" for s in SETTINGS)]
            for a in attacks]
    print(f"honest peers' final global_acc / rounds lost (of rounds {ATTACK_ROUND}..{args.rounds}), "
          "4 peers, FedAvg on digits")
    print(c.table(["attack", *SETTINGS], rows))
    c.write_json(c.out_path("protocol_attacks", args.out), {"rounds": args.rounds, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
