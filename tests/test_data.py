"""Tests for hfl.data: datasets, partitioners, loaders and file readers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hfl.data import (
    ArrayDataset,
    builtin_names,
    dirichlet_partition,
    iid_partition,
    load_builtin,
    load_csv,
    load_npz,
    make_loader,
    train_test_split_indices,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def digits() -> ArrayDataset:
    return load_builtin("digits")


def _assert_partition(parts: list[np.ndarray], n: int) -> None:
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0), "each part is sorted and has no repeats"
    joined = np.concatenate(parts)
    assert len(joined) == n, "parts are disjoint"
    assert np.array_equal(np.sort(joined), np.arange(n)), "parts cover every index"


def _mean_label_entropy(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> float:
    entropies = []
    for p in parts:
        freq = np.bincount(labels[p], minlength=num_classes) / len(p)
        freq = freq[freq > 0]
        entropies.append(float(-(freq * np.log(freq)).sum()))
    return float(np.mean(entropies))


# --- ArrayDataset ---------------------------------------------------------------------


def test_array_dataset_coerces_dtypes_and_subsets() -> None:
    ds = ArrayDataset(x=np.arange(12).reshape(6, 2), y=[0, 1, 2, 0, 1, 2.0], num_classes=3)
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    assert len(ds) == 6 and ds.input_shape == (2,)
    sub = ds.subset(np.array([5, 0, 5]))
    assert np.array_equal(sub.y, [2, 0, 2]) and np.array_equal(sub.x[1], [0.0, 1.0])
    assert sub.num_classes == 3 and sub.name == ds.name
    assert np.array_equal(ds.class_counts(), [2, 2, 2])
    assert len(ds.subset([])) == 0


@pytest.mark.parametrize(
    ("x", "y", "num_classes", "match"),
    [
        (np.zeros((3, 2)), np.zeros(4, dtype=int), 2, "3 rows but y has 4 labels"),
        (np.zeros((3, 2)), np.array([0, 1, 2]), 2, r"labels must lie in \[0, 2\)"),
        (np.zeros((3, 2)), np.array([0, -1, 1]), 2, r"labels must lie in \[0, 2\)"),
        (np.zeros((3, 2)), np.array([0.0, 0.5, 1.0]), 2, "whole numbers"),
        (np.zeros((3, 2)), np.array(["a", "b", "c"]), 2, "labels must be integers"),
        (np.zeros((3, 2)), np.zeros((3, 1), dtype=int), 2, r"y must have shape \(N,\)"),
        (np.zeros(3), np.zeros(3, dtype=int), 2, "at least 2 dimensions"),
        (np.zeros((3, 2)), np.zeros(3, dtype=int), 0, "num_classes must be >= 1"),
    ],
)
def test_array_dataset_rejects_bad_input(x, y, num_classes, match) -> None:
    with pytest.raises(ValueError, match=match):
        ArrayDataset(x=x, y=y, num_classes=num_classes, name="bad")


def test_subset_rejects_out_of_range_indices() -> None:
    ds = ArrayDataset(x=np.zeros((4, 1)), y=np.zeros(4, dtype=int), num_classes=1)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        ds.subset([0, 4])
    with pytest.raises(ValueError, match="integer"):
        ds.subset(np.array([0.0, 1.0]))


# --- built-in datasets ----------------------------------------------------------------


def test_digits_shapes_and_ranges(digits: ArrayDataset) -> None:
    assert digits.x.shape == (1797, 1, 8, 8) and digits.input_shape == (1, 8, 8)
    assert digits.x.dtype == np.float32 and digits.y.dtype == np.int64
    assert digits.x.min() == 0.0 and digits.x.max() == 1.0
    assert digits.num_classes == 10 and set(np.unique(digits.y)) == set(range(10))
    assert digits.name == "digits"
    flat = load_builtin("digits", flatten=True)
    assert flat.x.shape == (1797, 64) and np.array_equal(flat.x, digits.x.reshape(1797, 64))


@pytest.mark.parametrize(
    ("name", "shape", "num_classes"), [("breast_cancer", (569, 30), 2), ("wine", (178, 13), 3)]
)
def test_tabular_builtins(name: str, shape: tuple[int, int], num_classes: int) -> None:
    ds = load_builtin(name)
    assert ds.x.shape == shape and ds.x.dtype == np.float32
    assert ds.num_classes == num_classes and set(np.unique(ds.y)) == set(range(num_classes))
    assert ds.x.max() > 1.0, "tabular features are raw, not rescaled"


def test_unknown_builtin_lists_allowed_names() -> None:
    assert {"digits", "breast_cancer", "wine"} <= set(builtin_names())
    with pytest.raises(ValueError, match="allowed names: breast_cancer, cifar10, digits, "):
        load_builtin("mnist_offline")
    with pytest.raises(ValueError, match="unknown option.*flaten.*allowed options: flatten"):
        load_builtin("digits", flaten=True)
    with pytest.raises(ValueError, match=r"allowed options: \(none\)"):
        load_builtin("wine", flatten=True)


# --- partitioners ---------------------------------------------------------------------


@pytest.mark.parametrize("num_parts", [1, 3, 10])
def test_iid_partition_disjoint_complete_balanced(digits: ArrayDataset, num_parts: int) -> None:
    parts = iid_partition(digits.y, num_parts, seed=0)
    assert len(parts) == num_parts
    _assert_partition(parts, len(digits))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("alpha", [0.1, 0.5, 100.0])
def test_dirichlet_partition_disjoint_complete(digits: ArrayDataset, alpha: float) -> None:
    parts = dirichlet_partition(digits.y, 10, alpha=alpha, seed=1)
    assert len(parts) == 10
    _assert_partition(parts, len(digits))


def test_dirichlet_small_alpha_skews_labels(digits: ArrayDataset) -> None:
    iid = iid_partition(digits.y, 10, seed=0)
    skew = dirichlet_partition(digits.y, 10, alpha=0.1, seed=0)
    loose = dirichlet_partition(digits.y, 10, alpha=100.0, seed=0)
    h_iid = _mean_label_entropy(digits.y, iid, 10)
    h_skew = _mean_label_entropy(digits.y, skew, 10)
    h_loose = _mean_label_entropy(digits.y, loose, 10)
    assert h_iid > 0.95 * np.log(10), "iid parts see nearly uniform labels"
    assert h_skew < 0.6 * h_iid, (h_skew, h_iid)
    assert h_loose > 0.95 * h_iid, "large alpha approaches iid"
    # Most parts are dominated by few classes under alpha=0.1.
    top2 = [np.sort(np.bincount(digits.y[p], minlength=10))[-2:].sum() / len(p) for p in skew]
    assert np.median(top2) > 0.6


def test_partitions_reproducible_by_seed(digits: ArrayDataset) -> None:
    for split in (
        lambda s: iid_partition(digits.y, 5, seed=s),
        lambda s: dirichlet_partition(digits.y, 5, alpha=0.5, seed=s),
    ):
        a, b, c = split(7), split(7), split(8)
        assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
        assert not all(np.array_equal(p, q) for p, q in zip(a, c, strict=True))


def test_partitions_accept_generator_and_leave_global_rng_alone(digits: ArrayDataset) -> None:
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a = dirichlet_partition(digits.y, 4, alpha=0.3, seed=np.random.default_rng(5))
    b = dirichlet_partition(digits.y, 4, alpha=0.3, seed=5)
    iid_partition(digits.y, 4, seed=np.random.default_rng(5))
    train_test_split_indices(len(digits), 0.2, seed=5, stratify=digits.y)
    assert np.array_equal(np.random.get_state()[1], before)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="seed must be an int or a numpy Generator"):
        iid_partition(digits.y, 4, seed=None)  # type: ignore[arg-type]


def test_dirichlet_min_size_honoured(digits: ArrayDataset) -> None:
    # With alpha=0.1 over 20 parts a single draw often leaves a part nearly empty ...
    unconstrained = [dirichlet_partition(digits.y, 20, 0.1, seed=s, min_size=0) for s in range(5)]
    assert min(len(p) for parts in unconstrained for p in parts) < 10
    # ... the default min_size=10 redraws until every part has 10, a larger one likewise.
    for seed in range(5):
        assert min(len(p) for p in dirichlet_partition(digits.y, 20, 0.1, seed=seed)) >= 10
        parts = dirichlet_partition(digits.y, 20, 0.1, seed=seed, min_size=25)
        assert min(len(p) for p in parts) >= 25


def test_dirichlet_gives_up_with_clear_error() -> None:
    labels = np.repeat(np.arange(10), 10)  # 100 samples, 10 per class
    with pytest.raises(ValueError, match=r"no draw in 5 .*min_size=9.*lower min_size"):
        dirichlet_partition(labels, 10, alpha=0.01, seed=0, min_size=9, max_draws=5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": 0.0}, r"alpha must be a finite number > 0, got 0\.0"),
        ({"alpha": -1.0}, "alpha must be a finite number > 0"),
        ({"alpha": float("nan")}, "alpha must be a finite number > 0"),
        ({"num_parts": 0}, r"num_parts must be an int >= 1, got 0"),
        ({"num_parts": 101}, r"num_parts must be in \[1, 100\]"),
        ({"min_size": -1}, "min_size must be an int >= 0"),
        ({"num_parts": 10, "min_size": 11}, r"min_size must be in \[0, 10\]"),
    ],
)
def test_dirichlet_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"labels": np.repeat(np.arange(4), 25), "num_parts": 4, "alpha": 0.5, "seed": 0}
    with pytest.raises(ValueError, match=match):
        dirichlet_partition(**{**args, **kwargs})


def test_iid_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_parts must be an int >= 1"):
        iid_partition(np.zeros(5), 0, seed=0)
    with pytest.raises(ValueError, match=r"num_parts must be in \[1, 5\]"):
        iid_partition(np.zeros(5), 6, seed=0)


def test_train_test_split(digits: ArrayDataset) -> None:
    n = len(digits)
    train, test = train_test_split_indices(n, 0.25, seed=3)
    _assert_partition([train, test], n)
    assert len(test) == round(0.25 * n)
    again = train_test_split_indices(n, 0.25, seed=3)
    other = train_test_split_indices(n, 0.25, seed=4)
    assert np.array_equal(test, again[1]) and not np.array_equal(test, other[1])
    # Both parts stay non-empty for extreme fractions.
    assert [len(p) for p in train_test_split_indices(10, 0.01, seed=0)] == [9, 1]
    assert [len(p) for p in train_test_split_indices(10, 0.99, seed=0)] == [1, 9]


def test_stratified_train_test_split_keeps_class_proportions() -> None:
    labels = np.repeat([0, 1, 2], [100, 50, 10])
    rng = np.random.default_rng(0)
    labels = labels[rng.permutation(len(labels))]
    train, test = train_test_split_indices(len(labels), 0.2, seed=0, stratify=labels)
    _assert_partition([train, test], len(labels))
    assert len(test) == 32
    assert np.array_equal(np.bincount(labels[test]), [20, 10, 2])


@pytest.mark.parametrize(
    ("n", "fraction", "match"),
    [
        (10, 0.0, r"test_fraction must be in the open interval \(0, 1\)"),
        (10, 1.0, r"test_fraction must be in the open interval \(0, 1\)"),
        (10, 1.5, "test_fraction"),
        (1, 0.5, "n must be an int >= 2"),
    ],
)
def test_train_test_split_bad_arguments(n: int, fraction: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        train_test_split_indices(n, fraction, seed=0)


def test_stratify_length_must_match() -> None:
    with pytest.raises(ValueError, match="stratify must have n=10 labels"):
        train_test_split_indices(10, 0.5, seed=0, stratify=np.zeros(9))


# --- loader ---------------------------------------------------------------------------


def test_make_loader_batches_and_seeded_shuffle(digits: ArrayDataset) -> None:
    import torch

    ds = digits.subset(np.arange(100))
    loader = make_loader(ds, batch_size=32, shuffle=True, seed=0)
    batches = list(loader)
    assert [len(b[1]) for b in batches] == [32, 32, 32, 4]
    x, y = batches[0]
    assert x.shape == (32, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64

    def order(seed: int) -> list[int]:
        # Labels alone are too coarse; identify samples by their pixel sums.
        return [
            round(float(v), 4) for b in make_loader(ds, 10, True, seed) for v in b[0].sum((1, 2, 3))
        ]

    assert order(1) == order(1) and order(1) != order(2)
    plain = torch.cat([b[1] for b in make_loader(ds, 30, shuffle=False, seed=0)])
    assert np.array_equal(plain.numpy(), ds.y)
    assert len(list(make_loader(ds, 30, shuffle=False, seed=0, drop_last=True))) == 3
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        make_loader(ds, 0, shuffle=True, seed=0)


# --- files ----------------------------------------------------------------------------


def test_load_npz_roundtrip(tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(20, 3, 4, 4))
    y = np.arange(20) % 4
    path = tmp_path / "peer0.npz"
    np.savez(path, x=x, y=y)
    ds = load_npz(path)
    assert ds.x.shape == (20, 3, 4, 4) and ds.x.dtype == np.float32
    assert np.allclose(ds.x, x) and np.array_equal(ds.y, y)
    assert ds.num_classes == 4 and ds.name == "peer0"

    np.savez(tmp_path / "custom.npz", images=x, labels=y.astype(np.float64))
    ds = load_npz(tmp_path / "custom.npz", x_key="images", y_key="labels", num_classes=10)
    assert ds.num_classes == 10 and ds.y.dtype == np.int64


def test_load_npz_errors(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, features=np.zeros((3, 2)), y=np.zeros(3, dtype=int))
    with pytest.raises(
        ValueError,
        match=r"data\.npz: no array named 'x' \(x_key\); arrays in the file: features, y",
    ):
        load_npz(path)
    with pytest.raises(ValueError, match=r"no array named 'target' \(y_key\)"):
        load_npz(path, x_key="features", y_key="target")
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        load_npz(tmp_path / "missing.npz")
    obj = tmp_path / "obj.npz"
    np.savez(obj, x=np.array([{"a": 1}] * 3, dtype=object), y=np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="obj.npz"):
        load_npz(obj)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        np.savez(path, x=np.zeros((3, 2)), y=np.array([0, 1, 5]))
        load_npz(path, num_classes=2)


def test_load_csv_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "clinic.csv"
    path.write_text("age,label,bp\n41,1,120.5\n35,0,110\n\n60,2,140\n")
    ds = load_csv(path, target="label")
    assert ds.x.shape == (3, 2) and ds.x.dtype == np.float32
    assert np.allclose(ds.x, [[41, 120.5], [35, 110], [60, 140]])
    assert np.array_equal(ds.y, [1, 0, 2]) and ds.num_classes == 3 and ds.name == "clinic"
    semi = tmp_path / "semi.csv"
    semi.write_text("a;y\n1.5;1.0\n2;0\n")
    ds = load_csv(semi, target="y", delimiter=";", num_classes=2, name="s")
    assert np.array_equal(ds.y, [1, 0]) and ds.name == "s"


def test_load_csv_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b,y\n1,2,0\n")
    with pytest.raises(
        ValueError, match=r"t\.csv: no column named 'label' \(target\); columns: a, b, y"
    ):
        load_csv(path, target="label")
    path.write_text("a,b,y\n1,2,0\n1,oops,1\n")
    with pytest.raises(ValueError, match=r"t\.csv, line 3, column 'b': 'oops' is not a number"):
        load_csv(path, target="y")
    path.write_text("a,b,y\n1,2,0\n1,2\n")
    with pytest.raises(ValueError, match="line 3: expected 3 cells, got 2"):
        load_csv(path, target="y")
    path.write_text("a,y\n1,0.5\n")
    with pytest.raises(ValueError, match="column 'y': labels must be whole numbers"):
        load_csv(path, target="y")
    path.write_text("a,y\n")
    with pytest.raises(ValueError, match="no data rows"):
        load_csv(path, target="y")
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_csv(tmp_path / "nope.csv", target="y")



def test_bad_npz_files_get_one_error_naming_the_file_and_the_problem(tmp_path: Path) -> None:
    # Each of these gave a traceback (EOFError, BadZipFile, AttributeError, MemoryError)
    # or numpy's advice to load the file "unsafely" (with pickle).
    good = tmp_path / "good.npz"
    np.savez(good, x=np.zeros((8, 2)), y=np.arange(8) % 2)
    cases = {
        "empty.npz": (b"", "not an NPZ archive"),
        "text.npz": (b"a,b,label\n1,2,0\n", "not an NPZ archive"),
        "cut.npz": (good.read_bytes()[:300], "not a readable NPZ archive, damaged or truncated"),
    }
    for name, (content, problem) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=rf"{name}: {problem}"):
            load_npz(tmp_path / name)
    import zipfile

    with zipfile.ZipFile(tmp_path / "raw.npz", "w") as z:  # members that are not .npy arrays
        z.writestr("x.npy", b"\x80\x04junk")
        z.writestr("y.npy", b"\x80\x04junk")
    with pytest.raises(ValueError, match=r"raw\.npz: cannot read array 'x': not an \.npy array"):
        load_npz(tmp_path / "raw.npz")
    obj = tmp_path / "obj.npz"
    np.savez(obj, x=np.array([{"a": 1}] * 3, dtype=object), y=np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="holds pickled .* never loads") as err:
        load_npz(obj)
    assert "allow_pickle" not in str(err.value)
    # An array whose header asks for more than the machine has is refused before any read.
    header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 1)))
    header["shape"] = (10**6, 10**7)
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as z:
        z.writestr("x.npy", buf.getvalue())
        z.writestr("y.npy", b"")
    with pytest.raises(ValueError, match=r"huge\.npz: array 'x' of shape \(1000000, 10000000\)"
                       r" \(float64\) needs 74505\.8 GiB"):
        load_npz(tmp_path / "huge.npz")
    # a header numpy cannot parse (it raised tokenize's error), and an unknown version
    text = buf.getvalue().replace(b"(1000000, 10000000)", b"(4, 3             ")
    for name, member in [("paren.npz", text), ("v9.npz", b"\x93NUMPY\x09\x00" + text[8:])]:
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            z.writestr("x.npy", member)
            z.writestr("y.npy", b"")
        with pytest.raises(ValueError, match=rf"{name}: array 'x' (has a damaged header|is in "
                                             r"\.npy format 9\.0)"):
            load_npz(tmp_path / name)


def test_features_that_are_nan_or_infinite_are_refused_naming_where(tmp_path: Path) -> None:
    # One NaN cell made the whole standardised column NaN: the peer trained to NaN, the
    # cohort left its contributions out, and the run failed without naming the file.
    x = np.ones((6, 3), dtype=np.float32)
    x[4, 2] = np.nan
    np.savez(tmp_path / "n.npz", x=x, y=np.arange(6) % 2)
    with pytest.raises(ValueError, match=r"n\.npz: array 'x': 1 value\(s\) are NaN, infinite or "
                       r"beyond float32's range of ±3\.4e38 \(the first at index \(4, 2\)"):
        load_npz(tmp_path / "n.npz")
    np.savez(tmp_path / "f16.npz", x=np.array([[np.inf], [1.0]], dtype=np.float16), y=[0, 1])
    with pytest.raises(ValueError, match="NaN, infinite"):
        load_npz(tmp_path / "f16.npz")
    with pytest.raises(ValueError, match="scale: got inf; expected a finite number > 0"):
        load_npz(tmp_path / "n.npz", scale=float("inf"))
    path = tmp_path / "t.csv"
    for cell in ("nan", "inf", "-Infinity", "1e999"):
        path.write_text(f"a,b,y\n1,2,0\n1,{cell},1\n")
        with pytest.raises(ValueError, match=rf"t\.csv, line 3, column 'b': '{cell}' is not a "
                           r"finite number"):
            load_csv(path, target="y")
    path.write_text("a,b,y\n1,2,0\n1,1_000,1\n")  # (float() reads it; a table means otherwise)
    with pytest.raises(ValueError, match="'1_000' is not a number"):
        load_csv(path, target="y")


def test_features_beyond_float32s_range_are_refused_before_they_turn_infinite(
        tmp_path: Path) -> None:
    # Features are stored and trained in float32: a float64 pixel of 1e39, or a CSV cell
    # of 1e299 (finite as float64), passed the check and became inf; the run trained to
    # NaN and exited 0 (a review).
    x = np.ones((6, 3))
    x[2, 1] = 1e39
    np.savez(tmp_path / "big.npz", x=x, y=np.arange(6) % 2)
    with pytest.raises(ValueError, match=r"big\.npz: array 'x': 1 value\(s\) are NaN, infinite or "
                       r"beyond float32's range.*index \(2, 1\)"):
        load_npz(tmp_path / "big.npz")
    ds = load_npz(tmp_path / "big.npz", scale=1e10)  # divided first, it fits
    assert np.isfinite(ds.x).all() and ds.x.max() == pytest.approx(1e29, rel=1e-6)
    np.savez(tmp_path / "f32.npz", x=np.full((4, 2), 3e38, np.float32), y=[0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"divided by data\.options\.scale 0\.5"):
        load_npz(tmp_path / "f32.npz", scale=0.5)  # (overflows as it is divided)
    path = tmp_path / "t.csv"
    path.write_text("a,b,y\n1,2,0\n1,1e299,1\n3,4,0\n")
    with pytest.raises(ValueError, match=r"t\.csv: 1 value\(s\) are NaN, infinite or beyond "
                       r"float32's range.*index \(1, 1\)"):
        load_csv(path, target="y")


def test_a_label_too_large_for_a_class_number_is_named_as_it_is(tmp_path: Path) -> None:
    # 1e20 wrapped to -9223372036854775808 in the cast and was refused as negative.
    path = tmp_path / "t.csv"
    path.write_text("a,y\n1,0\n2,1e20\n3,1\n")
    with pytest.raises(ValueError, match=r"label 1e\+20 is not a class number"):
        load_csv(path, target="y")


def test_a_label_column_mixing_numbers_and_text_is_an_error_not_text_classes(
        tmp_path: Path) -> None:
    # One typo turned numeric labels 0..11 into 13 text classes sorted as strings
    # ('10' -> 2, '2' -> 4, ...), silently; '1' and '1.0' became two classes.
    path = tmp_path / "t.csv"
    path.write_text("a,y\n" + "".join(f"{i},{i % 12}\n" for i in range(24)) + "5,n/a\n")
    with pytest.raises(ValueError, match=r"t\.csv, line 26, column 'y': label 'n/a' mixes with "
                       r"labels like '0' \(line 2\): 24 labels are numbers and 1 are text"):
        load_csv(path, target="y")


def test_text_labels_are_named_and_numbered_alike_on_every_peer_with_classes(
        tmp_path: Path) -> None:
    # Each file's own labels sorted: {ant, cat} gave cat = 1 on one peer and {ant, bee,
    # cat} gave cat = 2 on another; their average mixed the classes (test accuracy 0.53
    # against 1.00, no warning). The dataset names its classes (the hello compares them:
    # test_peers_that_name_their_classes_differently_refuse_each_other); ``classes``
    # numbers them from one list.
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("f,label\n1,ant\n2,cat\n")
    b.write_text("f,label\n1,ant\n2,bee\n3,cat\n")
    assert load_csv(a, "label").classes == ("ant", "cat")
    assert load_csv(b, "label").classes == ("ant", "bee", "cat")
    declared = ["ant", "bee", "cat"]
    da, db = load_csv(a, "label", classes=declared), load_csv(b, "label", classes=declared)
    assert np.array_equal(da.y, [0, 2]) and np.array_equal(db.y, [0, 1, 2])
    assert da.classes == db.classes == ("ant", "bee", "cat") and da.num_classes == 3
    assert da.subset([1]).classes == da.classes
    with pytest.raises(ValueError, match=r"a\.csv, line 3, column 'label': label 'cat' is not one "
                       r"of data.options.classes \('ant', 'bee'\)"):
        load_csv(a, "label", classes=["ant", "bee"])
    with pytest.raises(ValueError, match="num_classes 3 with text labels: name every class in "
                       "data.options.classes"):
        load_csv(a, "label", num_classes=3)
    load_csv(tmp_path / "a.csv", "label")  # (numeric labels name no classes)
    a.write_text("f,label\n1,0\n2,1\n")
    assert load_csv(a, "label").classes is None


def test_an_image_size_the_machine_cannot_hold_is_refused_before_any_image_is_resized(
        tmp_path: Path) -> None:
    # size 100000 made the peer allocate 22 GB and the kernel kill it, with no message
    # (a review).
    from PIL import Image

    from hfl.data import load_image_folder

    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        Image.new("RGB", (4, 4)).save(tmp_path / c / "0.png")
    with pytest.raises(ValueError, match=r"2 image\(s\) resized to 100000x100000 "
                       r"\(data\.options\.size\) need .* GiB, more than half"):
        load_image_folder(tmp_path, size=100_000)
    assert load_image_folder(tmp_path, size=6).x.shape == (2, 3, 6, 6)


def test_an_image_folder_names_its_classes_and_takes_a_declared_list(tmp_path: Path) -> None:
    from PIL import Image

    from hfl.data import load_image_folder

    for cls in ("cat", "owl"):
        (tmp_path / cls).mkdir()
        Image.new("RGB", (4, 4)).save(tmp_path / cls / "0.png")
    ds = load_image_folder(tmp_path)
    assert ds.classes == ("cat", "owl") and np.array_equal(ds.y, [0, 1])
    ds = load_image_folder(tmp_path, classes=["cat", "dog", "owl"])  # no dog folder here
    assert ds.classes == ("cat", "dog", "owl") and np.array_equal(ds.y, [0, 2])
    with pytest.raises(ValueError, match=r"class folder\(s\) 'owl' not in data.options.classes"):
        load_image_folder(tmp_path, classes=["cat", "dog"])


def test_csv_files_that_are_not_utf8_text_are_named_as_what_they_are(tmp_path: Path) -> None:
    import gzip

    text = "a,label\n1,0\n2,1\n"
    path = tmp_path / "t.csv"
    for content, problem in [
        (gzip.compress(text.encode()), "gzip-compressed"),
        (text.encode("utf-16"), "UTF-16 text"),
        (b"PK\x03\x04rest", "a zip archive"),
        ("a,label\n1,caf\u00e9\n".encode("latin-1"), "not UTF-8 text"),
    ]:
        path.write_bytes(content)
        with pytest.raises(ValueError, match=rf"t\.csv: .*{problem}"):
            load_csv(path, target="label")
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())  # Excel's "CSV UTF-8": a BOM first
    assert load_csv(path, target="a").x.shape == (2, 1)
    path.write_text(text.replace(",", ";"))
    with pytest.raises(ValueError, match="set data.options.delimiter: ';'"):
        load_csv(path, target="label")
    path.write_text('a,label\n"' + "x" * 140_000 + "\n1,0\n")
    with pytest.raises(ValueError, match=r"t\.csv, line \d+: field larger than field limit .* "
                       "unclosed quote"):
        load_csv(path, target="label")
    # a stray quote swallowed every line after it into one cell: 10 of 1,000 rows kept and
    # a label "dog\n10,dog\n11,cat..."
    path.write_text("a,label\n" + "".join(f'{i},{"dog" if i % 2 else "cat"}\n' if i != 9
                                          else '9,"dog\n' for i in range(1000)))
    with pytest.raises(ValueError, match=r"t\.csv, line \d+: unexpected end of data .*unclosed"):
        load_csv(path, target="label")


# --- layering -------------------------------------------------------------------------

ALLOWED_TOP_LEVEL = {"numpy", "torch", "torchvision", "sklearn"}
# data/ also reads SVHN's .mat (scipy) and image folders (PIL), lazily like torch and sklearn.
EXTRA_ALLOWED = {"data": {"scipy", "PIL"}, "models": set()}


def _imports(package_dir: Path) -> tuple[set[str], int]:
    """Top-level modules imported anywhere in the package, and the deepest relative level."""
    found: set[str] = set()
    max_level = 0
    for src in package_dir.glob("**/*.py"):
        for node in ast.walk(ast.parse(src.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                max_level = max(max_level, node.level)
                if node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found, max_level


@pytest.mark.parametrize("package", ["data", "models"])
def test_package_imports_only_numeric_stack(package: str) -> None:
    found, max_level = _imports(REPO / package)
    third_party = found - set(sys.stdlib_module_names) - {"__future__"}
    allowed = ALLOWED_TOP_LEVEL | EXTRA_ALLOWED[package]
    assert third_party <= allowed, f"{package}/ imports {sorted(third_party)}"
    assert "asyncio" not in found and "hfl" not in found
    assert max_level <= 1, f"{package}/ reaches into a sibling hfl package"


def test_importing_hfl_data_is_cheap() -> None:
    code = (
        "import sys, hfl.data; print(sorted(m for m in "
        "('torch', 'torchvision', 'sklearn', 'scipy', 'PIL') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_dirichlet_split_drawn_again_in_one_process_is_the_same_and_unshared(digits: ArrayDataset) -> None:
    # Every peer of an in-process cohort asks for the same split: it is drawn once.
    import hfl.data.partition as part

    part._DIRICHLET_SPLITS.clear()
    first = dirichlet_partition(digits.y, 64, 0.5, seed=3)
    assert len(part._DIRICHLET_SPLITS) == 1
    first[0][:] = -1  # a caller's changes stay its own
    again = dirichlet_partition(digits.y, 64, 0.5, seed=3)
    part._DIRICHLET_SPLITS.clear()
    fresh = dirichlet_partition(digits.y, 64, 0.5, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(again, fresh, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(
        dirichlet_partition(digits.y, 64, 0.5, seed=4), fresh, strict=True))


@pytest.mark.parametrize("name", ["digits", "breast_cancer", "wine", "mnist5k"])
def test_builtin_sets_are_read_once_per_process_and_each_load_is_its_own_copy(name, monkeypatch):
    # Hundreds of in-process peers load the same set: the file is read once, and a peer
    # that changes its arrays (a normalisation in place) changes nobody else's.
    import sklearn.datasets

    from hfl.data.builtin import _mnist5k_raw, _sklearn_set

    reads = []  # scikit-learn's loader, or the mnist5k file's (np.loadtxt)
    module, fn = (np, "loadtxt") if name == "mnist5k" else (sklearn.datasets, f"load_{name}")
    real = getattr(module, fn)
    monkeypatch.setattr(module, fn, lambda *a, **k: reads.append(1) or real(*a, **k))
    _sklearn_set.cache_clear()
    _mnist5k_raw.cache_clear()
    a, b = load_builtin(name), load_builtin(name)
    assert len(reads) == 1
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    a.x[0] += 1.0
    a.y[0] += 1
    c = load_builtin(name)
    assert np.array_equal(b.x, c.x) and np.array_equal(b.y, c.y)
    assert not np.array_equal(a.x[0], c.x[0]) and a.y[0] != c.y[0]
