"""A peer's data as its config describes it (peer/factory.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hfl.peer.config import config_from_dict
from hfl.peer.configtools import ConfigError
from hfl.peer.factory import load_peer_data


def data_cfg(**data):
    return config_from_dict({"node": {"id": "a"}, "data": data}).data


def test_domain_partition_gives_peer_i_domain_i_and_every_domains_test_split():
    cfg = dict(dataset="rotated_digits", partition="domain", num_partitions=4,
               options={"angles": [0, 20, 40, 60], "per_class": 20, "size": 8},
               public_fraction=0.1, val_fraction=0.1, test_fraction=0.15)
    a = load_peer_data(data_cfg(**cfg, partition_index=1))
    b = load_peer_data(data_cfg(**cfg, partition_index=2))
    assert a.own_domain == "rotated_digits@20" and b.own_domain == "rotated_digits@40"
    assert (len(a.train), len(a.public), len(a.val), len(a.test)) == (130, 20, 20, 30)  # 65/10/10/15 %
    assert set(a.domain_tests) == {f"rotated_digits@{d}" for d in (0, 20, 40, 60)}
    # Every peer rebuilds the same test split of every domain (same seeds), its own included.
    for name in a.domain_tests:
        np.testing.assert_array_equal(a.domain_tests[name].x, b.domain_tests[name].x)
    np.testing.assert_array_equal(a.domain_tests[a.own_domain].x, a.test.x)
    assert np.bincount(a.public.y, minlength=10).tolist() == [2] * 10  # stratified


def test_partitions_of_a_single_dataset_are_disjoint_across_peers():
    parts = [load_peer_data(data_cfg(dataset="digits", partition="dirichlet", num_partitions=3,
                                     partition_index=i, public_fraction=0.1)) for i in range(3)]
    rows = [{bytes(r) for r in np.concatenate([p.train.x, p.public.x, p.test.x])} for p in parts]
    assert not (rows[0] & rows[1]) and not (rows[1] & rows[2]) and not (rows[0] & rows[2])
    np.testing.assert_array_equal(parts[0].global_test.x, parts[2].global_test.x)


def test_missing_files_name_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match="missing.npz"):
        load_peer_data(data_cfg(dataset="npz", path=str(tmp_path / "missing.npz")))
    with pytest.raises(ConfigError, match=r"MNIST/raw/train-images-idx3-ubyte"):
        load_peer_data(data_cfg(dataset="mnist", options={"root": str(tmp_path)}))
    with pytest.raises(ConfigError, match="one per peer"):
        load_peer_data(data_cfg(dataset="rotated_digits", partition="domain", num_partitions=3,
                                options={"angles": [0, 90], "per_class": 10, "size": 8}))


def test_bad_fraction_sums_and_domain_datasets_fail_at_load_time():
    with pytest.raises(ConfigError, match="leave private data"):
        data_cfg(public_fraction=0.5, val_fraction=0.3, test_fraction=0.2)
    with pytest.raises(ConfigError, match="multi-domain"):
        data_cfg(dataset="digits", partition="domain")
