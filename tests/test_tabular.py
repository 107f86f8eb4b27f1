"""Tabular data for completely heterogeneous FL (CHFL): column schema, CSV with
categorical columns, per-peer column choice and standardisation (hfl.data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hfl.data import (
    ArrayDataset,
    TabularSchema,
    feature_split,
    fit_standardizer,
    load_builtin,
    load_csv,
    select_columns,
)

# --- schema ---------------------------------------------------------------------------


def _table() -> ArrayDataset:
    """age (numeric), color (one-hot: blue, red), bp (numeric)."""
    schema = TabularSchema(
        names=("age", "color=blue", "color=red", "bp"),
        columns=("age", "color", "color", "bp"),
        numeric=(True, False, False, True),
    )
    x = np.array([[41, 0, 1, 120], [35, 1, 0, 110], [60, 0, 1, 140]], dtype=np.float32)
    return ArrayDataset(x=x, y=[1, 0, 1], num_classes=2, name="t", schema=schema)


def test_schema_travels_with_subsets_and_names_features() -> None:
    ds = _table()
    assert ds.feature_names == ("age", "color=blue", "color=red", "bp")
    assert ds.feature_columns == ("age", "color", "color", "bp")
    assert ds.schema.source_columns == ("age", "color", "bp")
    sub = ds.subset([2, 0])
    assert sub.schema == ds.schema and np.array_equal(sub.x[:, 0], [60, 41])
    plain = ArrayDataset(x=np.zeros((2, 3)), y=[0, 1], num_classes=2)
    assert plain.schema is None and plain.feature_names is None and plain.feature_columns is None
    assert TabularSchema.all_numeric(["a", "b"]).numeric == (True, True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"names": ("a", "b"), "columns": ("a",), "numeric": (True, True)},
            "one entry per feature",
        ),
        (
            {"names": ("a", "a"), "columns": ("a", "b"), "numeric": (True, True)},
            "duplicate feature",
        ),
        ({"names": ("c=x", "c"), "columns": ("c", "c"), "numeric": (False, True)}, "mixes numeric"),
        ({"names": ("",), "columns": ("a",), "numeric": (True,)}, "non-empty strings"),
        ({"names": ("a",), "columns": ("a",), "numeric": (1,)}, "booleans"),
    ],
)
def test_schema_rejects_inconsistent_fields(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TabularSchema(**kwargs)


def test_dataset_checks_schema_against_its_features() -> None:
    schema = TabularSchema.all_numeric(["a", "b"])
    with pytest.raises(ValueError, match=r"schema of 2 features needs x of shape \(N, 2\)"):
        ArrayDataset(x=np.zeros((3, 3)), y=[0, 0, 0], num_classes=1, schema=schema)
    with pytest.raises(ValueError, match=r"needs x of shape \(N, 2\), got shape \(3, 1, 2\)"):
        ArrayDataset(x=np.zeros((3, 1, 2)), y=[0, 0, 0], num_classes=1, schema=schema)
    with pytest.raises(ValueError, match="must be a TabularSchema"):
        ArrayDataset(x=np.zeros((3, 2)), y=[0, 0, 0], num_classes=1, schema=("a", "b"))


@pytest.mark.parametrize("name", ["breast_cancer", "wine"])
def test_tabular_builtins_carry_sklearn_feature_names(name: str) -> None:
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, f"load_{name}")()
    ds = load_builtin(name)
    assert ds.feature_names == tuple(bunch.feature_names)
    assert ds.feature_columns == tuple(bunch.feature_names) and all(ds.schema.numeric)
    assert load_builtin("digits").schema is None


# --- select_columns -------------------------------------------------------------------


def test_select_columns_keeps_one_hot_groups_in_dataset_order() -> None:
    ds = _table()
    cut = select_columns(ds, ["bp", "color"])  # asked out of order
    assert cut.feature_names == ("color=blue", "color=red", "bp")
    np.testing.assert_array_equal(cut.x, ds.x[:, [1, 2, 3]])
    np.testing.assert_array_equal(cut.y, ds.y)
    assert cut.schema.numeric == (False, False, True) and cut.name == "t"


def test_select_columns_errors_list_the_available_columns() -> None:
    ds = _table()
    with pytest.raises(
        ValueError, match=r"unknown column\(s\) 'colour'.*available columns: age, color, bp"
    ):
        select_columns(ds, ["age", "colour"])
    with pytest.raises(ValueError, match="available columns: age, color, bp"):
        select_columns(ds, [])
    with pytest.raises(ValueError, match="named more than once: age"):
        select_columns(ds, ["age", "age"])
    with pytest.raises(ValueError, match="no column schema"):
        select_columns(load_builtin("digits"), ["pixel"])


# --- CSV with categorical columns -----------------------------------------------------


def test_load_csv_one_hot_encodes_text_columns(tmp_path: Path) -> None:
    path = tmp_path / "patients.csv"
    path.write_text(
        "age,color,label,city\n"
        "41,red,sick,Oslo\n"
        "35,blue,well,\n"
        "60, red ,sick,Bergen\n"
        "50,green,well,Oslo\n"
    )
    ds = load_csv(path, target="label")
    assert ds.feature_names == (
        "age",
        "color=blue",
        "color=green",
        "color=red",
        "city=",
        "city=Bergen",
        "city=Oslo",
    )
    assert ds.feature_columns == ("age",) + ("color",) * 3 + ("city",) * 3
    assert ds.schema.numeric == (True,) + (False,) * 6
    expected = np.array(
        [
            [41, 0, 0, 1, 0, 0, 1],
            [35, 1, 0, 0, 1, 0, 0],
            [60, 0, 0, 1, 0, 1, 0],
            [50, 0, 1, 0, 0, 0, 1],
        ],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(ds.x, expected)
    assert ds.y.tolist() == [0, 1, 0, 1] and ds.num_classes == 2  # sick=0, well=1 (sorted)


def test_load_csv_explicit_categorical_for_integer_codes(tmp_path: Path) -> None:
    path = tmp_path / "codes.csv"
    path.write_text("grade,zip,y\n2,10,0\n10,2,1\n2,,1\n9,10,2\n")
    ds = load_csv(path, target="y", categorical=["grade", "zip"])
    # Numbers sort numerically (2 < 9 < 10), the empty category first.
    assert ds.feature_names == ("grade=2", "grade=9", "grade=10", "zip=", "zip=2", "zip=10")
    assert ds.x[:, :3].argmax(axis=1).tolist() == [0, 2, 0, 1]
    assert ds.x[:, 3:].argmax(axis=1).tolist() == [2, 1, 0, 2]
    np.testing.assert_array_equal(ds.x.sum(axis=1), [2, 2, 2, 2])
    assert ds.y.tolist() == [0, 1, 1, 2] and ds.num_classes == 3  # integer labels as before
    auto = load_csv(_write(tmp_path, "n.csv", "grade,y\n2,0\n10,1\n"), target="y")
    assert auto.feature_names == ("grade",) and auto.schema.numeric == (True,)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_csv_categorical_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", "a,b,y\n1,2,0\n3,,1\n")
    with pytest.raises(ValueError, match=r"t\.csv, line 3, column 'b': '' is not a number"):
        load_csv(path, target="y")
    # Listed as categorical, the empty cell is a category of its own.
    assert load_csv(path, target="y", categorical=["b"]).feature_names == ("a", "b=", "b=2")
    with pytest.raises(ValueError, match=r"unknown column\(s\) 'c'; columns: a, b"):
        load_csv(path, target="y", categorical=["c"])
    with pytest.raises(ValueError, match="lists the target column 'y'"):
        load_csv(path, target="y", categorical=["y"])
    with pytest.raises(ValueError, match="'auto' or a list of column names"):
        load_csv(path, target="y", categorical="b")
    mixed = _write(tmp_path, "m.csv", "a,b,y\n1,x,0\n2,3,1\n")
    with pytest.raises(ValueError, match=r"line 2, column 'b': 'x' is not a number.*categorical"):
        load_csv(mixed, target="y")
    with pytest.raises(ValueError, match=r"line 2, column 'b': 'x' is not a number \(not named"):
        load_csv(mixed, target="y", categorical=["a"])
    assert load_csv(mixed, target="y", categorical=["b"]).feature_names == ("a", "b=3", "b=x")
    empty_label = _write(tmp_path, "e.csv", "a,y\n1,cat\n2,\n")
    with pytest.raises(ValueError, match=r"e\.csv, line 3, column 'y': empty label"):
        load_csv(empty_label, target="y")
    with pytest.raises(ValueError, match="header has no name"):
        load_csv(_write(tmp_path, "h.csv", "a,,y\n1,2,0\n"), target="y")


# --- feature_split --------------------------------------------------------------------

COLS = [f"c{j}" for j in range(12)]


def _coverage(parts: list[list[str]]) -> np.ndarray:
    """How many peers keep each of COLS."""
    return np.array([sum(c in p for p in parts) for c in COLS])


def test_slices_follow_one_shared_permutation_with_wrapping_windows() -> None:
    n, frac, seed = 3, 0.5, 7
    parts = [feature_split(COLS, n, i, frac, "slices", seed) for i in range(n)]
    perm = np.random.default_rng(seed).permutation(12)
    for i, part in enumerate(parts):
        start = (i * 12) // n
        window = perm[[(start + t) % 12 for t in range(6)]]  # ceil(0.5 * 12) = 6 columns
        assert part == [COLS[j] for j in sorted(window)], "kept in the given column order"
    # Windows of 6 starting 4 apart: neighbours share 2 columns, and the last wraps onto the first.
    assert [len(set(parts[i]) & set(parts[(i + 1) % n])) for i in range(n)] == [2, 2, 2]
    assert _coverage(parts).min() >= 1


def test_slices_are_a_partition_at_fraction_one_over_n() -> None:
    parts = [feature_split(COLS, 4, i, 0.25, "slices", 0) for i in range(4)]
    assert [len(p) for p in parts] == [3, 3, 3, 3]
    assert _coverage(parts).tolist() == [1] * 12, "disjoint and covering"


@pytest.mark.parametrize(("n", "frac"), [(5, 0.2), (3, 0.34), (7, 1 / 7), (2, 0.9), (12, 0.09)])
def test_slices_cover_every_column_when_fraction_times_n_reaches_one(n: int, frac: float) -> None:
    for seed in range(5):
        parts = [feature_split(COLS, n, i, frac, "slices", seed) for i in range(n)]
        assert _coverage(parts).min() >= 1, (n, frac, seed)
        assert {len(p) for p in parts} == {max(1, int(np.ceil(frac * 12 - 1e-9)))}


def test_slices_with_small_fraction_leave_columns_out() -> None:
    parts = [feature_split(COLS, 2, i, 0.25, "slices", 0) for i in range(2)]
    assert _coverage(parts).sum() == 6 and _coverage(parts).max() == 1


def test_random_split_is_per_peer_and_deterministic() -> None:
    parts = [feature_split(COLS, 4, i, 0.5, "random", 3) for i in range(4)]
    assert all(len(p) == 6 and len(set(p)) == 6 for p in parts)
    assert all(p == sorted(p, key=COLS.index) for p in parts)
    assert len({tuple(p) for p in parts}) > 1, "each peer draws its own subset"
    assert parts == [feature_split(COLS, 4, i, 0.5, "random", 3) for i in range(4)]
    assert [feature_split(COLS, 4, i, 0.5, "random", 4) for i in range(4)] != parts
    # A peer's draw depends on (seed, index) only, not on the cohort size.
    assert feature_split(COLS, 9, 2, 0.5, "random", 3) == parts[2]
    assert feature_split(COLS, 4, 0, 1.0, "random", 3) == COLS
    assert feature_split(COLS, 4, 0, 0.01, "slices", 3) != []  # at least one column


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((COLS, 3, 0, 0.0, "slices", 0), r"fraction must be a number in \(0, 1\]"),
        ((COLS, 3, 0, 1.5, "slices", 0), r"fraction must be a number in \(0, 1\]"),
        ((COLS, 3, 0, float("nan"), "slices", 0), r"fraction must be a number in \(0, 1\]"),
        ((COLS, 3, 3, 0.5, "slices", 0), r"index must be an int in \[0, 2\]"),
        ((COLS, 0, 0, 0.5, "slices", 0), "num_parts must be an int >= 1"),
        ((COLS, 3, 0, 0.5, "none", 0), "mode must be one of slices, random"),
        ((["a", "a"], 3, 0, 0.5, "slices", 0), "duplicate column name"),
        (([], 3, 0, 0.5, "slices", 0), "non-empty list"),
        ((COLS, 3, 0, 0.5, "slices", -1), "seed must be an int >= 0"),
    ],
)
def test_feature_split_bad_arguments(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        feature_split(*args)


# --- standardisation ------------------------------------------------------------------


def test_standardizer_against_hand_values_and_numpy() -> None:
    # Hand values: column [1, 2, 3] has mean 2 and population std sqrt(2/3).
    tiny = ArrayDataset(x=[[1.0], [2.0], [3.0]], y=[0, 0, 0], num_classes=1)
    z = fit_standardizer(tiny)(tiny).x[:, 0]
    np.testing.assert_allclose(z, [-np.sqrt(1.5), 0.0, np.sqrt(1.5)], rtol=1e-6)

    rng = np.random.default_rng(0)
    x = np.column_stack(
        [
            rng.normal(5, 3, size=50),  # numeric
            rng.integers(0, 2, size=50),  # one-hot indicator: left alone
            np.full(50, 7.0),  # constant numeric: std 0 -> 1, only centred
            rng.exponential(2, size=50),  # numeric
        ]
    )
    schema = TabularSchema(
        names=("a", "c=1", "k", "b"),
        columns=("a", "c", "k", "b"),
        numeric=(True, False, True, True),
    )
    train = ArrayDataset(x=x, y=np.zeros(50, dtype=int), num_classes=1, schema=schema)
    other = ArrayDataset(x=x[:10] * 2 + 1, y=np.zeros(10, dtype=int), num_classes=1, schema=schema)
    scaler = fit_standardizer(train)
    x32 = train.x.astype(np.float64)
    mean, std = x32.mean(axis=0), x32.std(axis=0)
    np.testing.assert_allclose(scaler.mean, [mean[0], 0.0, 7.0, mean[3]])
    np.testing.assert_allclose(scaler.std, [std[0], 1.0, 1.0, std[3]])
    out = scaler(other)
    want = other.x.astype(np.float64).copy()
    for j in (0, 3):
        want[:, j] = (want[:, j] - mean[j]) / std[j]
    want[:, 2] -= 7.0
    np.testing.assert_allclose(out.x, want, rtol=1e-5, atol=1e-5)
    assert out.schema == schema and np.array_equal(out.y, other.y)
    zt = scaler(train).x
    np.testing.assert_allclose(zt[:, [0, 3]].mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(zt[:, [0, 3]].std(axis=0), 1, atol=1e-5)


def test_standardizer_without_schema_treats_all_features_as_numeric() -> None:
    x = np.array([[0.0, 10.0], [2.0, 30.0]])
    ds = ArrayDataset(x=x, y=[0, 1], num_classes=2)
    np.testing.assert_allclose(fit_standardizer(ds)(ds).x, [[-1, -1], [1, 1]])
    with pytest.raises(ValueError, match="not tabular"):
        fit_standardizer(load_builtin("digits"))
    with pytest.raises(ValueError, match="fitted on 2 features"):
        fit_standardizer(ds)(ArrayDataset(x=np.zeros((2, 3)), y=[0, 1], num_classes=2))
