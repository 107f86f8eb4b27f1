"""Tests for hfl.models: the shared body/head decomposition, shapes, learning, errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from hfl.data import load_builtin
from hfl.models import HflModel, arch_options, build_model, count_parameters, model_names

IMAGE_SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
CASES = [(arch, shape) for arch in ("mlp", "lenet", "resnet18") for shape in IMAGE_SHAPES]
CASES.append(("mlp", (30,)))


@pytest.mark.parametrize(("arch", "shape"), CASES)
def test_forward_and_embed_shapes(arch: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = build_model(arch, shape, num_classes=7, embedding_dim=24)
    assert isinstance(model, HflModel) and model.arch == arch and model.input_shape == shape
    assert model.embedding_dim == 24 and model.num_classes == 7
    assert type(model.head) is nn.Linear
    assert (model.head.in_features, model.head.out_features) == (24, 7)
    x = torch.randn(3, *shape)
    model.eval()
    with torch.no_grad():
        logits, emb = model(x), model.embed(x)
    assert logits.shape == (3, 7) and emb.shape == (3, 24)
    assert torch.allclose(logits, model.head(emb))
    assert torch.all(emb >= 0), "embedding ends with ReLU"


def test_same_seed_same_weights_and_no_reseeding_inside() -> None:
    torch.manual_seed(3)
    a = build_model("lenet", (1, 8, 8), 10)
    b = build_model("lenet", (1, 8, 8), 10)  # continues the RNG stream: different init
    torch.manual_seed(3)
    c = build_model("lenet", (1, 8, 8), 10)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sc[k]) for k in sa)
    assert not all(torch.equal(sa[k], sb[k]) for k in sa)


def test_count_parameters_matches_hand_count() -> None:
    model = build_model("mlp", (1, 8, 8), num_classes=10, embedding_dim=16, hidden=[32, 20])
    expected = (64 * 32 + 32) + (32 * 20 + 20) + (20 * 16 + 16) + (16 * 10 + 10)
    assert count_parameters(model) == expected
    model.head.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == expected - (16 * 10 + 10)


def test_mlp_options() -> None:
    deep = build_model("mlp", (13,), 3, embedding_dim=8, hidden=[], dropout=0.0)
    assert [m.in_features for m in deep.features if isinstance(m, nn.Linear)] == [13]
    drop = build_model("mlp", (13,), 3, hidden=[10, 10], dropout=0.5)
    assert sum(isinstance(m, nn.Dropout) for m in drop.features) == 2


def test_lenet_kernel_follows_image_size() -> None:
    small = build_model("lenet", (1, 8, 8), 10)
    large = build_model("lenet", (1, 28, 28), 10)
    assert small.features.conv1.kernel_size == (3, 3)
    assert large.features.conv1.kernel_size == (5, 5)
    assert large.features.fc1.in_features == 16 * 5 * 5  # classic LeNet-5 on 28x28


def test_resnet18_is_adapted_to_small_inputs() -> None:
    model = build_model("resnet18", (3, 32, 32), 10, embedding_dim=32)
    conv1 = model.features.conv1
    assert conv1.in_channels == 3 and conv1.kernel_size == (3, 3) and conv1.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.features.modules())
    assert (model.features.fc.in_features, model.features.fc.out_features) == (512, 32)
    assert build_model("resnet18", (1, 8, 8), 10).features.conv1.in_channels == 1


@pytest.fixture(scope="module")
def digit_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ds = load_builtin("digits")
    idx = np.concatenate([np.flatnonzero(ds.y == k)[:3] for k in range(10)])  # 30 samples
    return torch.from_numpy(ds.x[idx]), torch.from_numpy(ds.y[idx])


@pytest.mark.parametrize(
    ("arch", "steps", "max_ratio"), [("mlp", 20, 0.85), ("lenet", 20, 0.85), ("resnet18", 5, 0.5)]
)
def test_sgd_steps_reduce_loss_on_real_digits(digit_batch, arch, steps, max_ratio) -> None:
    x, y = digit_batch
    torch.manual_seed(0)
    model = build_model(arch, (1, 8, 8), num_classes=10, embedding_dim=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    with torch.no_grad():
        before = float(loss_fn(model(x), y))
    assert before > 0.8 * np.log(10), "an untrained model is near chance"
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        after = float(loss_fn(model(x), y))
    assert after < max_ratio * before, (before, after)


def test_unknown_arch_lists_allowed_names() -> None:
    assert {"mlp", "lenet", "resnet18"} <= set(model_names())
    with pytest.raises(ValueError, match="allowed values: lenet, mlp, resnet18"):
        build_model("vgg11", (1, 8, 8), 10)


@pytest.mark.parametrize(
    ("arch", "shape", "kwargs", "match"),
    [
        ("mlp", (4,), {"hiden": [8]}, "unknown option.*hiden.*allowed options: hidden, dropout"),
        ("resnet18", (3, 32, 32), {"width": 2}, r"allowed options: \(none\)"),
        ("mlp", (4,), {"hidden": [8, 0]}, "hidden must be a list of ints >= 1"),
        ("mlp", (4,), {"hidden": 8}, "hidden must be a list of ints >= 1"),
        ("mlp", (4,), {"dropout": 1.0}, r"dropout must be a number in \[0, 1\)"),
        ("lenet", (1, 8, 8), {"channels": (6,)}, "channels must be two ints >= 1"),
        ("lenet", (64,), {}, r"lenet needs image input_shape \(C, H, W\)"),
        ("lenet", (1, 6, 6), {}, "at least 8x8 px"),
        ("resnet18", (64,), {}, r"resnet18 needs image input_shape \(C, H, W\)"),
        ("mlp", (), {}, "at least one dimension"),
        ("mlp", (0, 3), {}, "input_shape dimension must be an int >= 1"),
        ("mlp", 5, {}, "input_shape must be a tuple of ints"),
        ("mlp", (4,), {"embedding_dim": 0}, "embedding_dim must be an int >= 1"),
        ("mlp", (4,), {"num_classes": 0}, "num_classes must be an int >= 1"),
    ],
)
def test_bad_arguments(arch: str, shape, kwargs: dict, match: str) -> None:
    args = {"num_classes": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_model(arch, shape, **args)


def test_arch_options_report_defaults() -> None:
    assert arch_options("mlp") == {"hidden": (128,), "dropout": 0.0}
    assert arch_options("resnet18") == {}


def test_importing_hfl_models_does_not_import_torchvision() -> None:
    code = "import sys, hfl.models; print('torchvision' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
