"""What a peer pays per member of its view, per operation, side by side with how it
was paid before (issue 36: a thousand peers in one process do each of these a
thousand times a round, so O(N) per call is O(N²) per round).

    python bench/per_member.py [--members 256 1000] [--repeat 300]

For each view size N (every member alive and greeted), microseconds per call. "Before"
runs the bodies of the code before 8d92cf3 (reproduced below from ``git show
8d92cf3~1:peer/membership.py``, ``protocol/codec.py`` and ``peer/status.py``) on the same
objects; today's functions called in the old pattern are not the old code (a review:
today's ``reached`` does more per call, and ``live_view`` is cached now, so they
overstated one gain 2.5x and understated another 5x):

* checking the ``contributors`` of a result that names N peers (the part of a decode
  that changed): now one pass over the ids, before a formatted ``path[i]`` and a check
  per element; and the whole decode now, for scale;
* marking a result's N contributors reached: one call for all, against the old call
  per member;
* the round record's live count: ``Membership.live_count()`` against the old
  ``len(live_view())`` (it sorted the view);
* the join's progress poll (every 0.25 s per peer until round 1 ends): the join's own
  count against sorting the greeted members (the old ``peer.status._greeted``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hfl.peer.membership import ALIVE, SUSPECT, Membership
from hfl.protocol import AggregateResult, decode, encode
from hfl.protocol.codec import DEFAULT_LIMITS, _check_str

# ---- the code before 8d92cf3, as it was (the "before" column runs these)


def old_reached(view: Membership, peer_id: str, round: int) -> None:
    """Membership.reached, one member a call."""
    m = view.members.get(peer_id)
    if m is not None and round > m.round:
        m.round, m.epoch = round, 0
        if view._max_round is not None and m.status in (ALIVE, SUSPECT):
            view._max_round = max(view._max_round, round)


def old_live_view(view: Membership) -> list[str]:
    """Membership.live_view (over live_peers), sorted each call."""
    return sorted([view.self_id, *sorted(p for p, m in view.members.items()
                                         if m.status in (ALIVE, SUSPECT))])


def old_greeted(view: Membership) -> list[str]:
    """peer.status._greeted, what the join's poll counted."""
    return sorted(m.peer_id for m in view.members.values() if m.status == "alive" and m.greeted)


def old_check_ids(ids: list, path: str = "body.contributors") -> list:
    """codec._list_of(_check_str)'s element loop: a path string and a check per element."""
    return [_check_str(v, DEFAULT_LIMITS, f"{path}[{i}]") for i, v in enumerate(ids)]


def now_check_ids(ids: list) -> bool:
    """What codec._list_of does for a list of ids now (protocol/codec.py)."""
    return all(type(v) is str for v in ids)


def per_call_us(fn, repeat: int) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat * 1e6


def operations(n: int) -> list[tuple[str, object, object]]:
    """(operation, how it is done now, how it was done before) on a view of ``n``."""
    ids = [f"p{i:04d}" for i in range(n)]
    frames = encode(AggregateResult(sender=ids[0], incarnation=0, round=3, epoch=0,
                                    kind="fedavg", contributors=ids,
                                    tensors={"w": np.zeros(16, np.float32)}))
    view = Membership("me", "mem://me", 0, 2.0, 5.0)
    for p in ids:
        view.heard_from(p, 0, 1.0, address=f"mem://{p}")
        view.welcomed(p)
    r = [10]

    def reach_all():
        r[0] += 1
        view.reached(ids, r[0])

    def reach_each():
        r[0] += 1
        for p in ids:
            old_reached(view, p, r[0])

    return [
        ("check a result's N contributor ids", lambda: now_check_ids(ids),
         lambda: old_check_ids(ids)),
        ("(the whole decode of that result, now)", lambda: decode(frames), None),
        ("mark N contributors reached", reach_all, reach_each),
        ("the record's live count", view.live_count, lambda: len(old_live_view(view))),
        ("the join's progress poll", lambda: len(view.join_counts()[0]),
         lambda: len(old_greeted(view))),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, nargs="+", default=[256, 1000])
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()
    print("| N | operation | now (us) | before (us) | before / now |\n|---|---|---|---|---|")
    for n in args.members:
        for name, now, before in operations(n):
            a = per_call_us(now, args.repeat)
            if before is None:
                print(f"| {n} | {name} | {a:.1f} | | |")
                continue
            b = per_call_us(before, args.repeat)
            print(f"| {n} | {name} | {a:.1f} | {b:.1f} | {b / a:.1f}x |")


if __name__ == "__main__":
    main()
