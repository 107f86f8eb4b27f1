"""What a peer pays per member of its view, per operation, side by side with how it
was paid before (issue 36: a thousand peers in one process do each of these a
thousand times a round, so O(N) per call is O(N²) per round).

    python bench/per_member.py [--members 256 1000] [--repeat 300]

For each view size N (every member alive and greeted), microseconds per call:

* decoding a result whose ``contributors`` names N peers, and what naming each
  element's path cost before (a formatted ``path[i]`` per element, checked one by one);
* marking a result's N contributors reached: one call for all, against a call each;
* the round record's live count: ``Membership.live_count()`` against
  ``len(live_view())`` (a sorted list of the view);
* the join's progress poll (every 0.25 s per peer until round 1 ends): the join's own
  count against sorting the greeted members (``peer.status._greeted``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hfl.peer.membership import Membership
from hfl.peer.status import _greeted
from hfl.protocol import AggregateResult, decode, encode
from hfl.protocol.codec import DEFAULT_LIMITS, _check_str


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
    node = type("Node", (), {"membership": view})
    r = [10]

    def reach_all():
        r[0] += 1
        view.reached(ids, r[0])

    def reach_each():
        r[0] += 1
        for p in ids:
            view.reached((p,), r[0])

    def decode_named():  # decode, plus the per-element paths it no longer forms
        decode(frames)
        [_check_str(v, DEFAULT_LIMITS, f"body.contributors[{i}]") for i, v in enumerate(ids)]

    return [
        ("decode a result naming N contributors", lambda: decode(frames), decode_named),
        ("mark N contributors reached", reach_all, reach_each),
        ("the record's live count", view.live_count, lambda: len(view.live_view())),
        ("the join's progress poll", lambda: len(view.join_counts()[0]),
         lambda: len(_greeted(node))),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, nargs="+", default=[256, 1000])
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()
    print("| N | operation | now (us) | before (us) | before / now |\n|---|---|---|---|---|")
    for n in args.members:
        for name, now, before in operations(n):
            a, b = per_call_us(now, args.repeat), per_call_us(before, args.repeat)
            print(f"| {n} | {name} | {a:.1f} | {b:.1f} | {b / a:.1f}x |")


if __name__ == "__main__":
    main()
