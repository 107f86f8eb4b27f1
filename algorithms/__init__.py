"""hfl.algorithms: learning methods as small classes with hooks, registered by name.

Plain synchronous PyTorch/numpy code: no sockets, no event loop, no clocks.
``hfl.algorithms.base`` holds the hook interface, ``hfl.algorithms.registry``
the name registry (torch-free), ``hfl.algorithms.simulate`` an in-process cohort
with no network at all. This package file imports nothing heavy on purpose.
"""
