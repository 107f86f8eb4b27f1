"""A peer's per-round record: what ``metrics.jsonl`` gets for each evaluated round.

The executor (:class:`hfl.peer.node.Node`) tells the ledger when a round begins
and ends and how long the method's calls took; the ledger keeps the counters,
folds the rounds between two evaluations into one line (``node.evaluate_every``,
:func:`hfl.peer.rounds.fold_rounds`) and keeps the lines of this life. No
protocol rule is decided here.
"""

from __future__ import annotations

import time
from typing import Any

from hfl.peer.rounds import fold_rounds

#: Message types that keep the membership (counted apart in the metrics: what
#: timing.membership costs).
MEMBERSHIP_TYPES = frozenset({"hello", "welcome", "gossip", "heartbeat", "leave"})


class RoundLedger:
    def __init__(self, peer_id: str, evaluate_every: int = 1, keep_lines: bool = True):
        self.peer_id = peer_id
        self.evaluate_every = evaluate_every
        # One per evaluated round, this life; only the last where the caller reads the
        # lines from metrics.jsonl (hfl-peer): kept all, they grew the process by 1.6 MB
        # a thousand rounds for as long as it ran (a review; at that rate, 170 MB at 100k rounds).
        self.lines: list[dict[str, Any]] = []
        self.keep_lines = keep_lines
        self.max_live_peers = 1  # the most live peers a line of this life saw
        self.rounds_run = 0
        #: the method's wall and CPU seconds in the round in progress
        self.compute = [0.0, 0.0]
        self.last_call = (0.0, 0.0)  # (wall, CPU) seconds of the method's last call
        self._window: list[dict[str, Any]] = []  # rounds run since the last evaluation
        self._window_keys: set[str] = set()  # what training and absorbing reported
        # The round in progress: (clock, wall time, bytes sent, received, membership
        # messages sent) when it began.
        self._start: tuple = (0.0, 0.0, 0, 0, 0)
        self._cpu_mark: float | None = None  # process CPU at the last round's record

    @staticmethod
    def membership_sent(sent: dict[str, int]) -> int:
        return sum(sent.get(t, 0) for t in MEMBERSHIP_TYPES)

    def begin(self, now: float, stats, sent: dict[str, int]) -> None:
        """A round begins at clock time ``now`` (``stats``: the transport's counters,
        ``sent``: messages sent by type)."""
        self._start = (now, time.time(), stats.bytes_sent, stats.bytes_received,
                       self.membership_sent(sent))
        self.compute = [0.0, 0.0]
        if self._cpu_mark is None:
            self._cpu_mark = time.process_time()

    def cpu_timed(self, fn):
        """``fn``, counting the CPU of the thread that runs it as the method's (and its
        own wall and CPU seconds as :attr:`last_call`, wherever it ran)."""
        def timed(*args):
            w, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*args)
            finally:
                cpu = time.thread_time() - c
                self.compute[1] += cpu
                self.last_call = (time.perf_counter() - w, cpu)

        timed.__wrapped__ = fn  # a run_blocking may look at what it runs (hfl-sim)
        return timed

    def end(self, done, now: float, stats, sent: dict[str, int],
            state: dict[str, Any]) -> dict[str, Any] | None:
        """The round ``done`` (an instructions.RoundDone) ended at ``now``: its line for
        metrics.jsonl (the rounds since the last evaluation folded in), or None when
        it was not evaluated (it waits in the window). ``state``: the peer's fields of
        the moment (live and met peers, drops, incarnation, disagreements)."""
        metrics = dict(done.metrics)
        self.rounds_run += 1
        self._window_keys.update(metrics)
        if done.evaluation is not None:
            metrics.update(done.evaluation)
        t_start, wall_start, sent0, recv0, membership0 = self._start
        membership = self.membership_sent(sent)
        record = {
            "peer": self.peer_id, "round": done.round, "time": wall_start,
            "round_time_s": now - t_start, "compute_s": self.compute[0],
            # CPU: the method's calls (training, sharing, absorbing, evaluating) and the
            # whole process's since the last record (the runtime's part is the difference:
            # messages, event loop, checkpoints; with several peers in one process,
            # hfl-launch --in-process, cpu_s is all of theirs)
            "compute_cpu_s": self.compute[1], "cpu_s": self._cpu_since_record(),
            **metrics, **done.info,
            "live_peers": state["live_peers"], "met_peers": state["met_peers"],
            "bytes_sent": stats.bytes_sent - sent0, "bytes_received": stats.bytes_received - recv0,
            "total_bytes_sent": stats.bytes_sent, "total_bytes_received": stats.bytes_received,
            # membership messages sent (hello, welcome, gossip, heartbeat, leave): this
            # round's and in all; what timing.membership costs
            "membership_sent": membership - membership0, "total_membership_sent": membership,
            "dropped": state["dropped"], "incarnation": state["incarnation"],
            # (round, peer) pairs seen so far whose aggregate differed from ours
            "aggregate_disagreements": state["aggregate_disagreements"],
        }
        if done.evaluation is None:  # no line: folded into the next evaluated round's
            self._window.append(record)
            return None
        if self.evaluate_every > 1:
            record = fold_rounds([*self._window, record], self._window_keys)
            self._window, self._window_keys = [], set()
        if not self.keep_lines:
            self.lines.clear()
        self.lines.append(record)
        self.max_live_peers = max(self.max_live_peers, int(record.get("live_peers", 1)))
        return record

    def _cpu_since_record(self) -> float:
        """The process's CPU seconds since the last round's record (the first: since
        this peer's rounds began), so that between-round work (a checkpoint) counts."""
        now = time.process_time()
        since = now - (self._cpu_mark if self._cpu_mark is not None else now)
        self._cpu_mark = now
        return since
