"""Simulators of the protocol (issue 31).

- :mod:`hfl.sim.protocol`: the protocol level. N :class:`~hfl.peer.core.PeerCore` and
  their round procedures (:mod:`hfl.peer.procedures`) on one discrete-event heap, with
  no asyncio, no torch, no files: each peer's method is a vector per round and its
  aggregate the mean. Thousands of seeds a minute, cohorts of a thousand peers.
- :mod:`hfl.launch.sim` (``hfl-sim``): the system level. The real peers (Node, the
  method, checkpoints and metrics files) on a virtual event loop, with process
  crashes, restarts and pauses.

Both check the cohort's history with the same :class:`hfl.sim.model.Checker`.
"""
