"""An asyncio event loop on virtual time, for the deterministic simulator.

:class:`VirtualLoop` is asyncio's own selector loop with two changes:

- ``time()`` is a virtual clock. When nothing is ready to run, the loop does not
  wait: its selector moves the clock straight to the next timer. A run of
  hours of protocol time takes as long as the code between the timers, and the
  order in which callbacks run depends only on the program, never on the
  machine's speed. (asyncio runs timers due at the same time in the order they
  were scheduled, and ready callbacks in FIFO order, so the schedule is exact.)
- Each simulated peer runs in a context tagged with its name
  (:func:`run_as`). :meth:`VirtualLoop.freeze` stops one peer like SIGSTOP: its
  callbacks, due or scheduled meanwhile, are held until it thaws, while
  messages keep arriving in its inbox and the other peers run on. When it
  thaws its timers fire at once and its clock has jumped, as after SIGCONT.

Nothing here may block or use threads: a call to ``run_in_executor`` (and so
``asyncio.to_thread``) raises, and a loop with nothing scheduled at all (every
task waits for something that can never happen) raises :class:`SimulationStalled`
instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import selectors
from collections.abc import Awaitable
from typing import Any

_PEER: contextvars.ContextVar[str | None] = contextvars.ContextVar("hfl_sim_peer", default=None)


class SimulationStalled(RuntimeError):
    """Every task waits and no timer is pending: the simulated system deadlocked."""


class _VirtualSelector(selectors.BaseSelector):
    """Registers file objects (the loop's self-pipe) but never waits on them: a select
    with a timeout moves the virtual clock by that timeout."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualLoop | None = None

    def register(self, fileobj, events, data=None):
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(),
                                    events, data)
        self._map[key.fd] = key
        return key

    def unregister(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._map.pop(fd)

    def select(self, timeout=None):
        if timeout is None:
            raise SimulationStalled(
                f"at t={self.loop.time():.3f}s every task waits and no timer is pending")
        if timeout > 0:
            self.loop.advance(timeout)
        return []

    def close(self) -> None:
        self._map.clear()

    def get_map(self):
        return self._map


class VirtualLoop(asyncio.SelectorEventLoop):
    """See the module docstring."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = start
        self._frozen: dict[str, float] = {}  # peer -> virtual time it thaws
        self._interrupt: BaseException | None = None  # see _interrupted

    # ------------------------------------------------------------------ time

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    # ------------------------------------------------------------------ freezing

    @staticmethod
    def _peer_of(context: contextvars.Context | None) -> str | None:
        return _PEER.get() if context is None else context.get(_PEER)

    def freeze(self, peer: str, until: float) -> None:
        """Hold every callback of ``peer`` until virtual time ``until`` (see module)."""
        self._frozen[peer] = max(until, self._frozen.get(peer, until))
        until = self._frozen[peer]
        moved = False
        for handle in self._scheduled:  # timers already set: due no earlier than the thaw
            if handle._context.get(_PEER) == peer and handle._when < until:
                handle._when = until
                moved = True
        if moved:
            heapq.heapify(self._scheduled)
        # Callbacks ready to run: when their turn comes they only set themselves for the
        # thaw. (The ready queue itself is left alone: freeze may be called from one of
        # its callbacks, while the loop is counting through it.)
        for handle in self._ready:
            if handle._context.get(_PEER) == peer and not handle._cancelled:
                handle._args = (handle._callback, handle._args, handle._context)
                handle._callback = self._at_thaw

    def _at_thaw(self, callback, args, context) -> None:
        until = self._frozen.get(self._peer_of(context) or "", self._now)
        super().call_at(max(until, self._now), callback, *args, context=context)

    def thaw(self, peer: str) -> None:
        """End ``peer``'s freeze now (SIGCONT, or the SIGKILL that a stopped process
        also dies of): what it held runs at once."""
        until = self._frozen.pop(peer, None)
        if until is None or until <= self._now:
            return
        for handle in self._scheduled:
            if handle._context.get(_PEER) == peer and handle._when == until:
                handle._when = self._now
        heapq.heapify(self._scheduled)

    def frozen_until(self, peer: str) -> float | None:
        until = self._frozen.get(peer)
        if until is not None and until <= self._now:
            del self._frozen[peer]  # thawed: call_soon goes back to its fast path
            until = None
        return until

    def call_soon(self, callback, *args, context=None):
        if self._frozen:
            until = self.frozen_until(self._peer_of(context) or "")
            if until is not None:
                return super().call_at(until, callback, *args, context=context)
        return super().call_soon(callback, *args, context=context)

    def call_at(self, when, callback, *args, context=None):
        if self._frozen:
            until = self.frozen_until(self._peer_of(context) or "")
            if until is not None and when < until:
                when = until
        return super().call_at(when, callback, *args, context=context)

    # ------------------------------------------------------------------ interrupts

    # A BaseException that is not an Exception (what a signal handler raises: pytest-timeout's
    # Failed, KeyboardInterrupt, SystemExit) comes from outside the simulated system, at a
    # point that depends on the wall clock. asyncio stores it on whichever task it hit and
    # carries on, and the runtime logs a dead background task and goes on without it (a
    # peer whose receive loop died is alive but deaf: its whole cohort stops learning). So
    # the run ends at once and run_until_complete raises it: never a different history.

    def create_task(self, coro, *, name=None, context=None):
        task = super().create_task(coro, name=name, context=context)
        task.add_done_callback(self._watch)
        return task

    def _watch(self, task: asyncio.Task) -> None:
        if not task.cancelled():
            self._interrupted(task.exception())

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        self._interrupted(context.get("exception"))  # a plain callback (Handle._run) hit
        super().call_exception_handler(context)

    def _interrupted(self, exc: BaseException | None) -> None:
        if (exc is not None and not isinstance(exc, (Exception, asyncio.CancelledError))
                and self._interrupt is None):
            self._interrupt = exc
            self.stop()

    def run_until_complete(self, future):
        try:
            result = super().run_until_complete(future)
        except BaseException:
            exc, self._interrupt = self._interrupt, None
            if exc is not None:
                raise exc from None  # not "Event loop stopped before Future completed"
            raise
        exc, self._interrupt = self._interrupt, None
        if exc is not None:
            raise exc
        return result

    # ------------------------------------------------------------------ no threads

    def run_in_executor(self, executor, func, *args):
        raise RuntimeError(f"{getattr(func, '__qualname__', func)} would run in a thread: the "
                           "simulator runs everything on its one loop (pass run_blocking)")


def run_as(peer: str, coro: Awaitable[Any], name: str | None = None) -> asyncio.Task:
    """Start ``coro`` as a task of simulated peer ``peer`` (its tasks inherit the tag)."""
    ctx = contextvars.copy_context()
    ctx.run(_PEER.set, peer)
    return asyncio.get_running_loop().create_task(coro, name=name or peer, context=ctx)


def current_peer() -> str | None:
    """The simulated peer whose task is running (None outside one)."""
    return _PEER.get()
