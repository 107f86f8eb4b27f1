"""The simulator's history digests of fixed seeds, pinned: a refactor keeps them.

A seed's history digest (``hfl-sim``) covers every message delivered and every
decision the checker saw. Moving protocol code (issue 31: handlers and the tick into
``PeerCore``) must not change a single one; a change of the protocol's behaviour
does, on purpose: then rewrite the pins and say why in the commit.

    python tests/test_sim_digests.py --write     # recompute tests/sim_digests.json

The histories include the models' weights (their digests at each checkpoint), so they
are comparable only where PyTorch computes the same floats: the pins carry the
platform they were taken on, and elsewhere the test says so and is skipped.
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


def history(name: str) -> str:
    seed, opts = RUNS[name]
    return sim.run_seed(seed, sim.SimOptions(**opts)).history


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_pinned_seed_has_the_same_history(name):
    pins = json.loads(PINS.read_text())
    if pins["platform"] != numeric_platform():
        pytest.skip(f"pinned on {pins['platform']}, this is {numeric_platform()}: the models' "
                    "floats (part of each history) may differ")
    assert history(name) == pins["runs"][name], (
        f"{name}: the simulated history changed. A refactor must keep it; a change of the "
        "protocol's behaviour changes it on purpose: then `python tests/test_sim_digests.py "
        "--write` and say why in the commit")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    PINS.write_text(json.dumps({"platform": numeric_platform(),
                                "runs": {n: history(n) for n in sorted(RUNS)}}, indent=1) + "\n")
    print(f"wrote {PINS}")
