"""Injected clocks, so deadline logic can be tested without sleeping."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("hfl.peer")


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 0.0):
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += seconds


class Pauses:
    """The times a peer stood still (SIGSTOP, a stalled loop): their ``total`` moves its
    deadlines on (a pause is no one's missed deadline), and the peer says so, of the
    first and then at most once every :attr:`EVERY_S` with how often: a thousand peers
    on one saturated loop each stood still a few times a round, and a warning each time
    was 25,000 identical lines in a 10-round run."""

    EVERY_S = 60.0

    def __init__(self, peer_id: str):
        self.id = peer_id
        self.total = 0.0
        self._since: tuple = (0, None, 0.0)  # since the last warning: times, when, longest

    def add(self, seconds: float, now: float) -> None:
        self.total += seconds
        count, last, longest = self._since
        count, longest = count + 1, max(longest, seconds)
        self._since = (count, last, longest)
        if last is None or now - last >= self.EVERY_S:
            times = (f" ({count} times since the last such line, the longest {longest:.1f}s)"
                     if count > 1 else "")
            log.warning("%s: this peer stood still for %.1fs%s; not holding that against the "
                        "others", self.id, seconds, times)
            self._since = (0, now, 0.0)

    def close(self) -> None:
        """At the peer's exit: the times since the last warning, which no line told yet."""
        count, last, longest = self._since
        if count and last is not None:
            log.warning("%s: this peer stood still %d more time(s) since the last such line, "
                        "the longest %.1fs", self.id, count, longest)
            self._since = (0, last, 0.0)
