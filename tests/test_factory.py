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


def test_a_file_with_too_few_rows_and_a_flag_that_is_not_a_flag_are_named(tmp_path, caplog):
    # A review: a file of 0 or 1 rows raised a traceback from the global test split; a
    # string "no" for flatten flattened (it is true in Python).
    for n in (0, 1):
        np.savez(tmp_path / f"n{n}.npz", x=np.ones((n, 3), np.float32), y=np.zeros(n, np.int64))
        with pytest.raises(ConfigError, match=rf"^data: dataset 'npz' \(.*n{n}\.npz\) holds {n} "
                                              r"sample\(s\)"):
            load_peer_data(data_cfg(dataset="npz", path=str(tmp_path / f"n{n}.npz")))
    np.savez(tmp_path / "ok.npz", x=np.ones((20, 3), np.float32), y=np.arange(20) % 2)
    with pytest.raises(ConfigError, match=r"^data\.options\.num_classes: got '10'; allowed: an int"):
        load_peer_data(data_cfg(dataset="npz", path=str(tmp_path / "ok.npz"),
                                options={"num_classes": "10"}))
    with pytest.raises(ConfigError, match=r"option 'flatten': got 'no'; allowed: true, false"):
        load_peer_data(data_cfg(dataset="digits", options={"flatten": "no"}))
    assert load_peer_data(data_cfg(dataset="digits", options={"flatten": False})).train.input_shape \
        == (1, 8, 8)
    from PIL import Image

    for c in ("a", "b"):
        (tmp_path / "img" / c).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (4, 4), (40 * i, 0, 0)).save(tmp_path / "img" / c / f"{i}.png")
    with pytest.raises(ConfigError, match=r"^data\.options\.grayscale: option 'grayscale': got "
                                          r"'yes'; allowed: true, false"):
        load_peer_data(data_cfg(dataset="image_folder", path=str(tmp_path / "img"),
                                options={"grayscale": "yes"}))
    # Labels numbered from 1 count a class 0 that never occurs: said, not refused.
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    np.savez(tmp_path / "one_based.npz", x=x, y=np.arange(40) % 3 + 1)
    with caplog.at_level("WARNING", logger="hfl.peer"):
        data = load_peer_data(data_cfg(dataset="npz", path=str(tmp_path / "one_based.npz")))
    assert data.num_classes == 4
    assert "the lowest label is 1, so class 0 never occurs but counts among the 4 classes" \
        in caplog.text


def test_bad_fraction_sums_and_domain_datasets_fail_at_load_time():
    with pytest.raises(ConfigError, match="leave private data"):
        data_cfg(public_fraction=0.5, val_fraction=0.3, test_fraction=0.2)
    with pytest.raises(ConfigError, match="multi-domain"):
        data_cfg(dataset="digits", partition="domain")


# --- tabular data: per-peer columns and standardisation (CHFL) -------------------------


def test_feature_split_gives_each_peer_its_columns_and_the_global_test_the_same_cut():
    from hfl.data import feature_split, load_builtin

    wine = load_builtin("wine")
    peers = [load_peer_data(data_cfg(dataset="wine", num_partitions=3, partition_index=i,
                                     feature_split="slices", feature_fraction=0.4, seed=5))
             for i in range(3)]
    for i, p in enumerate(peers):
        want = feature_split(wine.feature_names, 3, i, 0.4, "slices", 5)
        assert list(p.train.feature_names) == want and p.train.input_shape == (len(want),)
        for part in (p.test, p.global_test):
            assert part.feature_names == p.train.feature_names
    assert set().union(*(p.train.feature_names for p in peers)) == set(wine.feature_names)
    # Rows are still this peer's own: disjoint row counts add up to the pool.
    assert sum(len(p.train) + len(p.test) for p in peers) == len(wine) - len(peers[0].global_test)


def test_explicit_features_keep_one_hot_groups_and_standardise_numeric_only(tmp_path):
    rng = np.random.default_rng(0)
    lines = ["id,age,color,label"] + [
        f"{i},{rng.normal(50, 10):.3f},{rng.choice(['red', 'blue', 'green'])},{i % 2}"
        for i in range(60)
    ]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    d = load_peer_data(data_cfg(dataset="csv", path=str(tmp_path / "t.csv"), target="label",
                                features=["color", "age"], num_partitions=2))
    assert d.train.feature_names == ("age", "color=blue", "color=green", "color=red")
    np.testing.assert_allclose(d.train.x[:, 0].mean(), 0, atol=1e-5)  # age standardised
    np.testing.assert_allclose(d.train.x[:, 0].std(), 1, atol=1e-5)
    assert set(np.unique(d.train.x[:, 1:])) == {0.0, 1.0}  # indicators left as they are
    np.testing.assert_array_equal(d.train.x[:, 1:].sum(axis=1), 1)
    with pytest.raises(ConfigError, match=r"data\.features: .*unknown column\(s\) 'weight'.*"
                                          r"available columns: id, age, color"):
        load_peer_data(data_cfg(dataset="csv", path=str(tmp_path / "t.csv"), target="label",
                                features=["age", "weight"]))


def test_standardisation_statistics_come_from_the_private_rows_only(tmp_path):
    """z-scores use this peer's training rows: other rows can change without moving them."""
    rng = np.random.default_rng(1)
    n = 120
    a = np.arange(n) + 0.5  # unique: identifies a row after splitting
    b = rng.normal(3.0, 2.0, size=n)
    labels = np.arange(n) % 3

    def write(b_values):
        rows = [f"{a[i]},{float(b_values[i])!r},{labels[i]}" for i in range(n)]
        (tmp_path / "s.csv").write_text("a,b,y\n" + "\n".join(rows) + "\n")

    def load(standardize="auto"):
        return load_peer_data(data_cfg(dataset="csv", path=str(tmp_path / "s.csv"), target="y",
                                       num_partitions=2, partition_index=1, val_fraction=0.1,
                                       test_fraction=0.2, standardize=standardize))

    write(b)
    raw, z = load("off"), load()
    mean = raw.train.x.astype(np.float64).mean(axis=0)  # oracle: numpy on the raw private rows
    std = raw.train.x.astype(np.float64).std(axis=0)
    for part in ("train", "test", "val", "global_test"):
        want = (getattr(raw, part).x - mean) / std
        np.testing.assert_allclose(getattr(z, part).x, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z.train.x.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(z.train.x.std(axis=0), 1, atol=1e-5)
    assert np.abs(z.test.x.mean(axis=0)).max() > 1e-3  # the test split is not centred itself

    private_rows = np.isin(a, raw.train.x[:, 0])
    assert private_rows.sum() == len(raw.train)
    write(np.where(private_rows, b, b * 100 + 1000))  # every other row changes: test, global, peer 0
    again = load()
    np.testing.assert_array_equal(again.train.x, z.train.x)
    assert not np.allclose(again.test.x, z.test.x)


def test_tabular_builtins_standardise_by_default_and_images_do_not():
    wine = load_peer_data(data_cfg(dataset="wine", num_partitions=2))
    np.testing.assert_allclose(wine.train.x.mean(axis=0), 0, atol=1e-4)
    raw = load_peer_data(data_cfg(dataset="wine", num_partitions=2, standardize="off"))
    assert raw.train.x.max() > 100  # proline in its raw units
    digits = load_peer_data(data_cfg(dataset="digits", num_partitions=2))
    assert digits.train.x.min() == 0.0 and digits.train.x.max() == 1.0
    flat = load_peer_data(data_cfg(dataset="digits", options={"flatten": True}, num_partitions=2))
    assert flat.train.x.min() < 0  # 2-D pixels: every feature counts as numeric


def test_column_and_standardisation_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"data\.features: needs tabular data.*allowed datasets: "
                                          r"breast_cancer, wine, csv"):
        data_cfg(dataset="digits", features=["pixel"])
    with pytest.raises(ConfigError, match=r"data\.feature_split: needs tabular data"):
        data_cfg(dataset="rotated_digits", feature_split="slices")
    with pytest.raises(ConfigError, match=r"data\.feature_split: got 'random' together with"):
        data_cfg(dataset="wine", features=["ash"], feature_split="random")
    with pytest.raises(ConfigError, match=r"data\.feature_fraction: got 1\.5"):
        data_cfg(dataset="wine", feature_split="slices", feature_fraction=1.5)
    with pytest.raises(ConfigError, match=r"data\.feature_split: got 'slice'; allowed: 'none', "
                                          r"'random', 'slices'"):
        data_cfg(dataset="wine", feature_split="slice")
    with pytest.raises(ConfigError, match=r"data\.features\[1\]: column 'ash' is listed twice"):
        data_cfg(dataset="wine", features=["ash", "ash"])
    with pytest.raises(ConfigError, match=r"data\.standardize: got 'on' but dataset 'digits' has "
                                          r"input shape \(1, 8, 8\)"):
        load_peer_data(data_cfg(dataset="digits", standardize="on"))
    with pytest.raises(ConfigError, match=r"data\.standardize: got 'yes'; allowed: 'auto', 'on', 'off'"):
        data_cfg(standardize="yes")


def test_npz_without_column_names_cannot_be_cut_by_column(tmp_path):
    np.savez(tmp_path / "t.npz", x=np.zeros((20, 3)), y=np.arange(20) % 2)
    with pytest.raises(ConfigError, match=r"data\.feature_split: needs tabular data with named "
                                          r"columns, got dataset 'npz'"):
        data_cfg(dataset="npz", path=str(tmp_path / "t.npz"), feature_split="random")


# --- image views aligned row by row ---------------------------------------------------

VIEWS = [
    {"dataset": "digits"},
    {"dataset": "rotated_digits", "options": {"per_class": None, "angle": 30, "size": 16}},
    {"dataset": "digits_rgb", "options": {"seed": 3}},
]
SPLITS = ("train", "public", "val", "test", "global_test")


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_views_of_digits_give_every_peer_disjoint_rows_of_the_same_base_images(partition):
    """Peer i sees its own rows of scikit-learn's digits through view i's input space."""
    from hfl.data import load_builtin

    common = dict(partition=partition, num_partitions=3, seed=11, public_fraction=0.1,
                  val_fraction=0.1, test_fraction=0.2)
    base = load_builtin("digits")
    flat = base.x.reshape(len(base), -1)
    where = {bytes(r): i for i, r in enumerate(flat)}
    full_views = [load_builtin(v["dataset"], **v.get("options", {})) for v in VIEWS]
    row_sets = []
    for i, view in enumerate(VIEWS):
        grey = load_peer_data(data_cfg(dataset="digits", partition_index=i, **common))
        mine = load_peer_data(data_cfg(**view, partition_index=i, **common))
        assert mine.train.input_shape == full_views[i].input_shape
        rows = set()
        for part in SPLITS:
            g, m = getattr(grey, part), getattr(mine, part)
            idx = np.array([where[bytes(r)] for r in g.x.reshape(len(g), -1)])  # digits index
            np.testing.assert_array_equal(m.y, g.y)  # same labels, same order
            np.testing.assert_array_equal(m.x, full_views[i].x[idx])  # same base images
            if part != "global_test":
                rows |= set(idx.tolist())
        row_sets.append(rows)
    assert len(where) == len(base), "digits images are distinct, so the index is well defined"
    assert not (row_sets[0] & row_sets[1]) and not (row_sets[1] & row_sets[2])
    assert not (row_sets[0] & row_sets[2])
    assert sum(map(len, row_sets)) == len(base) - len(grey.global_test)
