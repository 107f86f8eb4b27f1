"""The simulator's history digests of fixed seeds, pinned: a refactor keeps them.

A seed's history digest (``hfl-sim``) covers every message delivered and every
decision the checker saw. Moving protocol code (issue 31: handlers and the tick into
``PeerCore``) must not change a single one; a change of the protocol's behaviour
does, on purpose: then rewrite the pins and say why in the commit.

    python tests/test_sim_digests.py --write     # recompute tests/sim_digests.json

The histories include the models' weights (their digests at each checkpoint), so they
are comparable only where PyTorch computes the same floats: the pins are kept per
machine (its platform and a fingerprint of its floats, :func:`float_fingerprint`), and
on a machine none was taken on the test says so and is skipped.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

from hfl.launch import sim

PINS = Path(__file__).with_name("sim_digests.json")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MDHFL = str(EXAMPLES / "mdhfl_digits.yaml")

#: name -> (seed, options): one run per mode the protocol has
RUNS: dict[str, tuple[int, dict]] = {
    "fedavg-aggregator/0": (0, {}),
    "fedavg-aggregator/3": (3, {}),
    "fedavg-aggregator-buggify/1": (1, {"buggify": True}),
    "fedavg-every_peer/2": (2, {"overrides": ["defaults.cohort.aggregate_at=every_peer"]}),
    "mdhfl-broadcast/0": (0, {"experiment": MDHFL, "peers": 4, "rounds": 4}),
    "mdhfl-fanout2/1": (1, {"experiment": MDHFL, "peers": 6, "rounds": 4,
                            "overrides": ["defaults.cohort.fanout=2"]}),
    "swim/0": (0, {"peers": 17, "rounds": 4, "overrides": ["defaults.timing.membership=swim"]}),
}


def numeric_platform() -> dict[str, str]:
    import numpy
    import torch

    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(),
            "numpy": numpy.__version__, "machine": platform.machine()}


def float_fingerprint() -> str:
    """A digest of the floats of one forward and backward pass of a small conv net and
    MLP (the kernels the pinned runs' models use). Two machines of one numeric_platform
    computed different histories (an AMD EPYC and the AVX512 machine the first pins were
    taken on): the pins are kept per fingerprint too."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (as the simulated peers run: node.threads 1; more threads
    try:  # split the sums otherwise, and a run's peers set it to 1 for the rest)
        return _fingerprint(torch)
    finally:
        torch.set_num_threads(threads)


def _fingerprint(torch) -> str:
    import hashlib

    g = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 6 * 6, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 10))
    with torch.no_grad():
        for prm in net.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * 0.1)
    x, y = torch.rand(32, 1, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)
    out = net(x)
    torch.nn.functional.cross_entropy(out, y).backward()
    h = hashlib.sha256(out.detach().numpy().tobytes())
    for prm in net.parameters():
        h.update(prm.grad.numpy().tobytes())
    return h.hexdigest()[:16]


def this_machines_pins() -> dict[str, str] | None:
    """The pinned histories of a machine that computes as this one does (its platform
    and float fingerprint), or None. (The first pins, taken before fingerprints, were
    dropped: nothing told their machine from another of its platform, where they
    failed: a review found oneDNN limited to AVX2 changes the fingerprint and keeps
    the platform.)"""
    here, floats = numeric_platform(), float_fingerprint()
    for entry in json.loads(PINS.read_text())["pins"]:
        if entry["platform"] == here and entry["floats"] == floats:
            return entry["runs"]
    return None


def history(name: str) -> str:
    seed, opts = RUNS[name]
    return sim.run_seed(seed, sim.SimOptions(**opts)).history


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_pinned_seed_has_the_same_history(name):
    pins = this_machines_pins()
    if pins is None:
        pytest.skip(f"not pinned for {numeric_platform()} with float fingerprint "
                    f"{float_fingerprint()}: the models' floats (part of each history) may "
                    "differ; `python tests/test_sim_digests.py --write` pins this machine too")
    assert history(name) == pins[name], (
        f"{name}: the simulated history changed. A refactor must keep it; a change of the "
        "protocol's behaviour changes it on purpose: then `python tests/test_sim_digests.py "
        "--write` and say why in the commit")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    # This machine's entry is replaced; the other machines' are kept (they cannot be
    # recomputed here: a change of behaviour leaves them stale, and says so there).
    here, floats = numeric_platform(), float_fingerprint()
    kept = [e for e in json.loads(PINS.read_text())["pins"]
            if not (e["platform"] == here and e["floats"] == floats)]
    entry = {"platform": here, "floats": floats, "runs": {n: history(n) for n in sorted(RUNS)}}
    PINS.write_text(json.dumps({"pins": [*kept, entry]}, indent=1) + "\n")
    print(f"wrote {PINS}")
